//! What a store request retries and how its errors are told apart: one attempt's
//! deadline, doubling back-off, a stall of the daemon not counted against the store,
//! and the classification of `object_store`'s errors (transient, refused, conflict)
//! into [`CacheError`]s.

use crate::error::{CacheError, Result};

use super::{probe, RetryPolicy};

/// Runs `op` under `retry`: transient errors (5xx, broken connections) and timeouts
/// of an attempt are retried with doubling backoff; the final error is mapped.
pub(crate) async fn retry_op<T, F, Fut>(
    retry: &RetryPolicy,
    label: &str,
    failed: Option<&std::sync::atomic::AtomicU64>,
    mut op: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    // Each attempt the store failed (an error or no answer in time, retried or not),
    // counted in `failed`: what the operator sees of a store throttling while the
    // retries still win (black-box finding: 103 injected 5xx answers, 0 counted).
    let count_failed = || {
        if let Some(f) = failed {
            f.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let mut backoff = retry.base_backoff;
    let attempts = retry.attempts.max(1);
    let mut deadline = tokio::time::Instant::now() + retry.total_timeout;
    // Attempts a stall of the daemon overran, not counted (a few at most).
    let mut stalls = 0u32;
    let mut attempt = 0u32;
    while attempt < attempts {
        attempt += 1;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        // The last attempt is the last one the deadline leaves time for.
        let last = attempt == attempts || left <= retry.attempt_timeout + backoff;
        let started = tokio::time::Instant::now();
        let attempt_deadline = started + retry.attempt_timeout.min(left);
        let r = tokio::time::timeout_at(attempt_deadline, op()).await;
        if !matches!(r, Ok(Ok(_))) && stalls < MAX_STALLS {
            // Over its deadline by more than a stall: the daemon was stopped while it
            // ran (see `crate::stall`); the store gets the attempt again, and the
            // whole deadline gets the attempt's time back (a connection the store
            // closed meanwhile fails the next attempt at once: it must not be the last).
            let now = tokio::time::Instant::now();
            if crate::stall::stalled(attempt_deadline, now) {
                stalls += 1;
                attempt -= 1;
                deadline += now - started;
                tracing::debug!(store = %label, stalled_s = (now - started).as_secs_f64(), "the daemon stalled during a store request; asking again");
                continue;
            }
        }
        match &r {
            Ok(Err(e)) if !is_answer(e) => count_failed(),
            Err(_elapsed) => count_failed(),
            _ => {}
        }
        match r {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => {
                if !transient(&e) || last {
                    return Err(map_store_error(e, attempt));
                }
                tracing::debug!(store = %label, attempt, error = %e, "transient store error; retrying");
            }
            Err(_elapsed) => {
                if last {
                    return Err(CacheError::StoreTimeout { attempts: attempt });
                }
                tracing::debug!(store = %label, attempt, "store request timed out; retrying");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2).min(retry.max_backoff);
    }
    Err(CacheError::StoreTimeout { attempts })
}

/// Whether `e` is the store's answer to what was asked (missing, changed, there
/// already, not modified), not its failure to answer.
fn is_answer(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::NotFound { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::AlreadyExists { .. }
            | object_store::Error::NotModified { .. }
    )
}

/// Store attempts a stall of the daemon may void per request (see `retry_op`): 3.
pub(super) const MAX_STALLS: u32 = 3;

/// Whether `e` is worth asking again: a 5xx, a broken connection, a short body (all
/// `Generic` in object_store), but not a refusal in a listing's text (a 403,
/// NoSuchBucket).
pub(super) fn transient(e: &object_store::Error) -> bool {
    (matches!(
        e,
        object_store::Error::Generic { .. } | object_store::Error::JoinError { .. }
    ) && !probe::is_refusal(e)
        && !permission_denied(e))
        || conditional_conflict(e)
}

/// S3's `409 ConditionalRequestConflict`: a conditional write raced another request on
/// the key, and S3 says to retry it (object_store reports it as "already exists";
/// black-box finding: one such answer failed a create-only close with EEXIST and
/// nothing was stored).
pub(super) fn conditional_conflict(e: &object_store::Error) -> bool {
    with_causes(e).contains("ConditionalRequestConflict")
}

/// object_store's refusal of a `200 OK` answer to a ranged GET.
pub(super) fn not_partial(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { .. })
        && e.to_string()
            .contains("non-partial response when range requested")
}

/// Whether the store refused access: typed, or a local file's EACCES inside a
/// `Generic` (black-box finding: a file the daemon may not read was asked 8 times,
/// ~3.5 s per read, then failed EIO rather than EACCES).
pub(super) fn permission_denied(e: &object_store::Error) -> bool {
    if matches!(
        e,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
    ) {
        return true;
    }
    // A 401/403 the client did not type (a listing's, a DeleteObjects key's): refused,
    // as a GET's is (black-box finding: a LIST answered 403 made `ls` say EIO).
    if matches!(e, object_store::Error::Generic { .. }) {
        let text = with_causes(e);
        // A DeleteObjects answer refusing one key says so in its code only.
        if probe::http_status(&text).is_some_and(|s| s == 401 || s == 403)
            || text.contains("AccessDenied")
        {
            return true;
        }
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
        {
            return true;
        }
        source = s.source();
    }
    e.to_string().contains("(os error 13)")
}

pub(super) fn map_store_error(e: object_store::Error, attempts: u32) -> CacheError {
    match e {
        object_store::Error::NotFound { path, .. } => CacheError::NotFound(path),
        object_store::Error::Precondition { path, .. } => CacheError::Changed(path),
        other if conditional_conflict(&other) => CacheError::Store {
            attempts,
            message: with_causes(&other),
        },
        object_store::Error::AlreadyExists { path, .. } => CacheError::Exists(path),
        // An archived object (GLACIER, DEEP_ARCHIVE) is a 403 too, but no policy change
        // reads it (black-box finding: the log sent the user to fix IAM).
        other if with_causes(&other).contains("InvalidObjectState") => {
            let path = match &other {
                object_store::Error::PermissionDenied { path, .. } => path.clone(),
                _ => String::new(),
            };
            CacheError::PermissionDenied(format!(
                "{path}: the object is in an archive storage class (S3 InvalidObjectState: \
                 GLACIER or DEEP_ARCHIVE) and must be restored before it can be read"
            ))
        }
        other if permission_denied(&other) => {
            CacheError::PermissionDenied(capped(other.to_string()))
        }
        other => CacheError::Store {
            attempts,
            message: capped(with_causes(&other)),
        },
    }
}

/// Most bytes of a store's error text kept in the error a caller (and the log) gets:
/// 1 KiB, several times S3's own XML error. A gateway's 403 page is 60-200 KB of HTML,
/// and each failed read logged it whole (black-box finding: one reader of one refused
/// object grew the log by ~50 MB a minute).
pub(super) const STORE_MESSAGE_MAX: usize = 1024;

/// `text` cut to [`STORE_MESSAGE_MAX`] bytes (at a character boundary), saying how much
/// was cut.
pub(super) fn capped(text: String) -> String {
    if text.len() <= STORE_MESSAGE_MAX {
        return text;
    }
    let mut cut = STORE_MESSAGE_MAX;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{} ... ({} bytes more)", &text[..cut], text.len() - cut)
}

/// `e`'s message and those of its causes that it does not already say: an error
/// sending a request says why only in its sources (black-box finding: out of
/// descriptors, S3 reads failed "error sending request" and "Too many open files"
/// was nowhere).
pub(super) fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let m = s.to_string();
        if !m.is_empty() && !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A store's error body of any size reaches the caller cut to a bound, and still
    /// says what it is (round 25c: 60 KB HTML pages logged whole, per failed read).
    #[test]
    fn a_stores_long_error_text_is_cut_to_a_bound() {
        let page = format!("403 Forbidden: <html>{}</html>", "é".repeat(30_000));
        let e = map_store_error(
            object_store::Error::Generic {
                store: "S3",
                source: page.into(),
            },
            1,
        );
        let CacheError::Store { message, .. } = e else {
            panic!("a store error: {e:?}");
        };
        assert!(message.len() <= STORE_MESSAGE_MAX + 40, "{}", message.len());
        assert!(message.contains("403 Forbidden"));
        assert!(message.ends_with("bytes more)"));
        let short = capped("NoSuchKey".to_string());
        assert_eq!(short, "NoSuchKey");
    }

    /// Black-box finding (round 16): reads across a 40 s SIGSTOP of the mount failed
    /// EIO "object store timed out" the instant it resumed, no request sent after: the
    /// stall used up the attempt and the whole deadline. An attempt a stall overran is
    /// asked again, the deadline moved by the stall (here the runtime's only thread is
    /// blocked inside the first attempt, as by SIGSTOP).
    #[tokio::test(flavor = "current_thread")]
    async fn a_daemon_stall_does_not_use_up_the_store_deadline() {
        let asked = std::sync::atomic::AtomicU32::new(0);
        let policy = RetryPolicy {
            attempts: 2,
            base_backoff: Duration::from_millis(1),
            attempt_timeout: Duration::from_millis(100),
            total_timeout: Duration::from_millis(300),
            ..RetryPolicy::default()
        };
        let r: Result<u32> = retry_op(&policy, "s3", None, || {
            let n = asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                if n == 0 {
                    std::thread::sleep(crate::stall::STALL + Duration::from_millis(400));
                    return Err(object_store::Error::Generic {
                        store: "S3",
                        source: "connection closed while the daemon was stopped".into(),
                    });
                }
                // The store answers a fresh request in 10 ms.
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(n)
            }
        })
        .await;
        assert_eq!(r.ok(), Some(1), "asked again after the stall");
    }

    /// Black-box finding: a local file the daemon may not read was asked 8 times (~3.5 s
    /// per read) and failed EIO. A refusal is asked once and named as one.
    #[tokio::test]
    async fn a_permission_refusal_is_asked_once_and_named() {
        let asked = std::sync::atomic::AtomicU32::new(0);
        let refused = || object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(std::io::Error::from(std::io::ErrorKind::PermissionDenied)),
        };
        let policy = RetryPolicy {
            base_backoff: Duration::from_millis(1),
            ..RetryPolicy::default()
        };
        let r: Result<()> = retry_op(&policy, "local", None, || {
            asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async { Err(refused()) }
        })
        .await;
        assert!(matches!(r, Err(CacheError::PermissionDenied(_))), "{r:?}");
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 1);
        let typed = object_store::Error::PermissionDenied {
            path: "a".into(),
            source: "403 Forbidden".into(),
        };
        assert!(matches!(
            map_store_error(typed, 1),
            CacheError::PermissionDenied(_)
        ));
        // A 5xx is still retried.
        assert!(transient(&object_store::Error::Generic {
            store: "S3",
            source: "500 Internal Server Error".into(),
        }));
    }

    /// Black-box findings (round 18): a LIST answered 403 was EIO where a GET's 403 is
    /// EACCES; an archived object's 403 read as a missing privilege; S3's retryable 409
    /// `ConditionalRequestConflict` on a create-only PUT was "already exists".
    #[test]
    fn refusals_archives_and_conditional_conflicts_are_told_apart() {
        let generic = |text: &str| object_store::Error::Generic {
            store: "S3",
            source: text.to_string().into(),
        };
        let list_403 = generic("Error performing list request: Client error with status code: 403 Forbidden: <Code>AccessDenied</Code>");
        assert!(!transient(&list_403));
        assert!(matches!(
            map_store_error(list_403, 1),
            CacheError::PermissionDenied(_)
        ));
        let archived = object_store::Error::PermissionDenied {
            path: "cold/a".into(),
            source: "<Code>InvalidObjectState</Code>".into(),
        };
        match map_store_error(archived, 1) {
            CacheError::PermissionDenied(m) => assert!(m.contains("restored"), "{m}"),
            other => panic!("{other:?}"),
        }
        let conflict = object_store::Error::AlreadyExists {
            path: "ck".into(),
            source: "409 Conflict: <Code>ConditionalRequestConflict</Code>".into(),
        };
        assert!(transient(&conflict), "asked again");
        assert!(matches!(
            map_store_error(conflict, 8),
            CacheError::Store { .. }
        ));
        let exists = object_store::Error::AlreadyExists {
            path: "ck".into(),
            source: "412 Precondition Failed".into(),
        };
        assert!(!transient(&exists));
        assert!(matches!(map_store_error(exists, 1), CacheError::Exists(_)));
    }

    /// Black-box finding (round 14): a store error says its causes (here an I/O error
    /// under a generic one), so "Too many open files" is not lost behind "error
    /// sending request".
    #[test]
    fn a_store_error_names_its_causes() {
        #[derive(Debug)]
        struct Sending(std::io::Error);
        impl std::fmt::Display for Sending {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error sending request")
            }
        }
        impl std::error::Error for Sending {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = object_store::Error::Generic {
            store: "S3",
            source: Box::new(Sending(std::io::Error::from_raw_os_error(libc::EMFILE))),
        };
        let CacheError::Store { message, .. } = map_store_error(e, 8) else {
            panic!("a store error");
        };
        assert!(message.contains("error sending request"), "{message}");
        assert!(message.contains("Too many open files"), "{message}");
    }
}
