//! The check a mount makes of its store before it appears (black-box finding:
//! `strata mount s3://no-such-bucket /mnt` mounted, then every `ls` failed with EIO
//! and nothing said why).
//!
//! One listing of the mount's folder, one attempt, within a short deadline. The store's
//! answer decides:
//! - a refusal (no such bucket, credentials refused, access denied: an HTTP 4xx other
//!   than 408/429) will not change by retrying, so the mount fails with the store's
//!   words ([`Probe::Refused`]);
//! - no answer (a timeout, a 5xx, a refused connection) may be an outage the cache is
//!   there to ride out, so the mount goes ahead on what is cached and says so
//!   ([`Probe::Unanswered`]); `strata bench chaos` restarts the daemon while its store
//!   is down, and a mount must come back then.

use std::time::Duration;

use object_store::ObjectStore;

use super::{object_key, BackingStore};

/// What the store said to the mount's first listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// It listed the folder (empty or not).
    Answered,
    /// It refused the request, for a reason retrying will not fix.
    Refused(String),
    /// It did not answer usefully (timeout, server error, connection refused).
    Unanswered(String),
}

impl BackingStore {
    /// Lists `dir` ("" for the store's root) once, within `deadline`, and says whether
    /// the store can serve a mount of it (see the module doc).
    pub async fn probe(&self, dir: &str, deadline: Duration) -> Probe {
        let prefix = (!dir.is_empty()).then(|| object_key(dir));
        // One page of one key where the store pages its listings: a folder of many
        // pages answers in one request (black-box finding: a folder of 20,000 keys
        // took past the deadline to list whole, and the mount took its store as silent).
        let asked = async {
            match (&self.paged, self.folders_read_here()) {
                (Some(paged), _) => paged.first_entry(prefix.as_ref()).await,
                // A local folder is read as its listings read it: a looping link in it is
                // left out, not the store's failure to answer (black-box finding, round
                // 23b: object_store's walk failed the probe with ELOOP).
                (None, Some(root)) => self
                    .local_list_level(root, prefix.as_ref())
                    .await
                    .map(|_| ()),
                (None, None) => self
                    .store
                    .list_with_delimiter(prefix.as_ref())
                    .await
                    .map(|_| ()),
            }
        };
        match tokio::time::timeout(deadline, asked).await {
            Ok(Ok(())) => Probe::Answered,
            // The store answered with a key the client library cannot name (`./x`,
            // `../x`: legal in S3, writable by anyone with PutObject): the mount's
            // listings step around such keys, so one must not fail every mount of the
            // bucket (black-box finding).
            Ok(Err(object_store::Error::InvalidPath { .. })) => Probe::Answered,
            Ok(Err(e)) if wrong_region(&e) => Probe::Refused(format!(
                "{e} (S3 answers 301 PermanentRedirect to a request sent to another region \
                 than the bucket's: set the bucket's region, --region or [store] region)"
            )),
            Ok(Err(e)) if is_refusal(&e) => Probe::Refused(e.to_string()),
            Ok(Err(e)) => Probe::Unanswered(e.to_string()),
            Err(_) => {
                // Silent, as a request whose whole deadline passed unanswered: requests
                // fail at once for the pause, so a mount started on what the cache holds
                // answers from it rather than wait on the store first.
                let pause = self.retry.silent_pause;
                if !pause.is_zero() {
                    *self.silent_until.lock() = Some(tokio::time::Instant::now() + pause);
                }
                Probe::Unanswered(format!("no answer within {deadline:?}"))
            }
        }
    }
}

/// Whether `e` is the store refusing a request for good: retrying the same request
/// gets the same answer. object_store types a GET's 404/403/401, but a listing's
/// error reaches us as `Generic`, with the HTTP status only in its text
/// ("... status code: 403 Forbidden: ...").
pub(crate) fn is_refusal(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    match e {
        E::NotFound { .. }
        | E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::InvalidPath { .. }
        | E::NotSupported { .. }
        | E::NotImplemented { .. } => true,
        E::Generic { .. } => {
            let text = e.to_string();
            (http_status(&text).is_some_and(refused_status) && !transient_code(&text))
                || wrong_region(e)
        }
        _ => false,
    }
}

/// S3's answer to a request sent to another region than the bucket's: a redirect with
/// no Location (`301 PermanentRedirect`, `307`), which object_store reports as such. A
/// refusal: it answers the same however often it is asked (black-box finding: a mount
/// with the wrong region came up "on what the cache holds" and every access then spent
/// 8 attempts, ~3.6 s, before EIO).
pub(crate) fn wrong_region(e: &object_store::Error) -> bool {
    e.to_string().contains("redirect without LOCATION")
}

/// S3 error codes sent with a 4xx that the AWS SDKs retry: the request may succeed
/// sent again (black-box finding: one `400 RequestTimeout` to a small file's PUT failed
/// its close with EIO, where the same answer to a multipart part was ridden out).
fn transient_code(text: &str) -> bool {
    ["RequestTimeout", "PriorRequestNotComplete"]
        .iter()
        .any(|c| text.contains(c))
}

/// A client error the server will repeat: 4xx but Request Timeout and Too Many Requests.
fn refused_status(status: u16) -> bool {
    (400..500).contains(&status) && status != 408 && status != 429
}

/// The HTTP status object_store wrote into an error's text, if any.
pub(crate) fn http_status(text: &str) -> Option<u16> {
    const MARK: &str = "status code: ";
    let at = text.find(MARK)? + MARK.len();
    let digits = text.get(at..at + 3)?;
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(text: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: text.to_string().into(),
        }
    }

    /// Black-box finding (round 18): the wrong region mounted on the cache.
    #[test]
    fn a_redirect_without_location_is_the_wrong_region_and_a_refusal() {
        let e = generic(
            "Error performing list request: Error performing GET http://h/bkt?list-type=2 in \
             2ms - Received redirect without LOCATION, this normally indicates an incorrectly \
             configured region",
        );
        assert!(wrong_region(&e));
        assert!(is_refusal(&e), "not asked 8 times");
        assert!(!wrong_region(&generic(
            "Server returned non-2xx status code: 503"
        )));
    }

    #[test]
    fn client_errors_are_refusals_and_server_errors_are_not() {
        let no_bucket = generic(
            "Error performing list request: Server returned non-2xx status code: \
             404 Not Found: <Code>NoSuchBucket</Code>",
        );
        assert!(is_refusal(&no_bucket));
        assert!(is_refusal(&generic(
            "Server returned non-2xx status code: 403 Forbidden: AccessDenied"
        )));
        for transient in [
            "Server returned non-2xx status code: 503 Service Unavailable: SlowDown",
            "Server returned non-2xx status code: 429 Too Many Requests",
            "Server returned non-2xx status code: 408 Request Timeout",
            "error sending request: connection refused",
            "status code: 4",
            "Server returned non-2xx status code: 400 Bad Request: <Error><Code>RequestTimeout</Code>",
        ] {
            assert!(!is_refusal(&generic(transient)), "{transient}");
        }
        assert!(is_refusal(&object_store::Error::NotFound {
            path: "x".into(),
            source: "gone".into(),
        }));
    }

    #[tokio::test]
    async fn a_missing_folder_answers_and_a_silent_store_does_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = BackingStore::from_url(
            &format!("file://{}", dir.path().display()),
            &Default::default(),
        )
        .expect("store");
        // An empty or missing folder is a mount that writes will fill.
        assert_eq!(
            store.probe("not/yet", Duration::from_secs(5)).await,
            Probe::Answered
        );
        use super::super::faulty::{FaultConfig, FaultyStore};
        let faulty = |config| {
            store.around(
                std::sync::Arc::new(FaultyStore::new(store.inner().clone(), config)),
                Default::default(),
            )
        };
        let silent = faulty(FaultConfig {
            hang_every: 1,
            ..Default::default()
        });
        assert!(matches!(
            silent.probe("", Duration::from_millis(50)).await,
            Probe::Unanswered(_)
        ));
        let down = faulty(FaultConfig {
            down: true,
            ..Default::default()
        });
        assert!(matches!(
            down.probe("", Duration::from_secs(5)).await,
            Probe::Unanswered(_)
        ));
    }
}
