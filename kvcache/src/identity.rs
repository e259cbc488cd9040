//! Namespaces bound to a model identity (docs/KV_KEYS.md, v2).
//!
//! A client that sends its model identity digest (metadata [`IDENTITY_METADATA`])
//! binds the namespace it puts into to that identity; from then on a call with another
//! identity on that namespace is refused (`FAILED_PRECONDITION`), so a client configured
//! with another revision, RoPE scaling or LoRA adapter can neither read nor add to the
//! blocks of the first. v2 keys already differ per identity; the binding also catches
//! clients that derive v1 keys or reuse keys by mistake. Calls without an identity
//! (v1 clients) are not checked.
//!
//! Only a put binds: a read names no content, and letting it bind would let a
//! misconfigured reader lock the real writer out. Bindings live in the tenant's key
//! space (the scoped namespace), so a tenant can only constrain itself. They are
//! persisted (`kv-identities.json` in the cache dir, written atomically) so a restart
//! over a warm disk tier keeps them; an unreadable file is moved aside with an error in
//! the log (the v2 keys still separate models) rather than stopping the service.
//! Writes are at most one per [`PERSIST_INTERVAL`] (the next call or the service's
//! drop writes what is pending), so a client inventing namespaces cannot turn each new
//! binding into a rewrite and an fsync of the whole file.
//!
//! [`IDENTITY_METADATA`]: crate::keys::IDENTITY_METADATA

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{KvError, Result};

/// Most namespaces bound at once. 16,384: far beyond models times tenants on one node,
/// and it bounds what a client inventing namespaces can make the server remember (the
/// file stays under ~2 MiB).
pub const MAX_BINDINGS: usize = 1 << 14;

/// Least time between two writes of the bindings file: one second, so a burst of new
/// namespaces costs one rewrite per second, while a crash loses at most the bindings of
/// the last second (their v2 keys still keep the models apart).
pub const PERSIST_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// A 32-byte model identity digest.
pub type IdentityDigest = [u8; 32];

/// The bindings of one service.
#[derive(Debug, Default)]
pub struct IdentityBindings {
    map: Mutex<HashMap<Arc<str>, IdentityDigest>>,
    /// Where they persist; None: memory only.
    file: Option<PathBuf>,
    /// When the file was last written (None: never), and whether bindings wait for the
    /// next write.
    persist: Mutex<Persist>,
    writes: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Persist {
    last: Option<std::time::Instant>,
    dirty: bool,
}

impl Drop for IdentityBindings {
    fn drop(&mut self) {
        self.flush(true);
    }
}

impl IdentityBindings {
    /// Bindings persisted in `file` (loaded now if it exists), or memory only.
    pub fn open(file: Option<PathBuf>) -> Self {
        let map = match &file {
            Some(f) => load(f),
            None => HashMap::new(),
        };
        IdentityBindings {
            map: Mutex::new(map),
            file,
            persist: Mutex::new(Persist::default()),
            writes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Times the file was written (tests).
    pub fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes pending bindings if the interval has passed (or `now_anyway`).
    fn flush(&self, now_anyway: bool) {
        let Some(file) = &self.file else {
            return;
        };
        {
            let mut p = self.persist.lock();
            if !p.dirty {
                return;
            }
            let due = p.last.is_none_or(|t| t.elapsed() >= PERSIST_INTERVAL);
            if !(due || now_anyway) {
                return;
            }
            p.dirty = false;
            p.last = Some(std::time::Instant::now());
        }
        let text = encode(&self.map.lock());
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = write_atomically(file, text.as_bytes()) {
            tracing::error!(file = %file.display(), error = %e, "could not persist KV namespace identities");
        }
    }

    /// The identity `ns` is bound to, if any.
    pub fn bound(&self, ns: &str) -> Option<IdentityDigest> {
        self.map.lock().get(ns).copied()
    }

    /// Checks a call on `ns` carrying `identity`; with `bind` (a put) an unbound
    /// namespace is bound to it.
    pub fn check(
        &self,
        ns: &Arc<str>,
        identity: Option<&IdentityDigest>,
        bind: bool,
    ) -> Result<()> {
        let Some(id) = identity else {
            return Ok(());
        };
        {
            let mut map = self.map.lock();
            match map.get(ns) {
                Some(b) if b == id => {}
                Some(b) => {
                    return Err(KvError::IdentityMismatch {
                        namespace: ns.to_string(),
                        bound: hex::encode(&b[..6]),
                        got: hex::encode(&id[..6]),
                    })
                }
                None if !bind => {}
                None => {
                    if map.len() >= MAX_BINDINGS {
                        return Err(KvError::Busy(format!(
                            "{MAX_BINDINGS} namespaces are bound to model identities already"
                        )));
                    }
                    map.insert(ns.clone(), *id);
                    self.persist.lock().dirty = true;
                }
            }
        }
        // Outside the map's lock; a failed write keeps the bindings for this run and
        // says so (they would only be lost on a restart).
        self.flush(false);
        Ok(())
    }
}

fn encode(map: &HashMap<Arc<str>, IdentityDigest>) -> String {
    let obj: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::String(hex::encode(v))))
        .collect();
    serde_json::json!({ "version": 1, "bindings": obj }).to_string()
}

fn load(file: &Path) -> HashMap<Arc<str>, IdentityDigest> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HashMap::new(),
        Err(e) => {
            tracing::error!(file = %file.display(), error = %e, "cannot read KV namespace identities; starting without them");
            return HashMap::new();
        }
    };
    match parse(&text) {
        Some(m) => m,
        None => {
            let aside = file.with_extension("json.corrupt");
            tracing::error!(file = %file.display(), aside = %aside.display(), "KV namespace identities file is corrupt; moved aside, starting without them");
            let _ = std::fs::rename(file, aside);
            HashMap::new()
        }
    }
}

fn parse(text: &str) -> Option<HashMap<Arc<str>, IdentityDigest>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    if v["version"] != 1 {
        return None;
    }
    let mut out = HashMap::new();
    for (k, d) in v["bindings"].as_object()? {
        let digest = crate::keys::parse_identity_hex(d.as_str()?)?;
        out.insert(Arc::from(k.as_str()), digest);
        if out.len() > MAX_BINDINGS {
            return None;
        }
    }
    Some(out)
}

/// Writes `file` via a private temp file, fsync and rename, so a crash leaves the old
/// or the new version, never a torn one.
fn write_atomically(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = file.with_extension("json.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)?;
    if let Some(dir) = file.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IdentityDigest = [1; 32];
    const B: IdentityDigest = [2; 32];

    #[test]
    fn a_put_binds_and_another_identity_is_refused() {
        let b = IdentityBindings::open(None);
        let ns: Arc<str> = Arc::from("m/t");
        b.check(&ns, Some(&A), false).expect("reads do not bind");
        assert_eq!(b.bound("m/t"), None);
        b.check(&ns, Some(&B), true).expect("first put binds");
        b.check(&ns, Some(&B), false).expect("same identity");
        let e = b.check(&ns, Some(&A), false).expect_err("other identity");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        assert!(e.to_string().contains("m/t"), "{e}");
        b.check(&ns, Some(&A), true).expect_err("nor can it put");
        b.check(&ns, None, true)
            .expect("v1 clients are not checked");
    }

    #[test]
    fn a_burst_of_new_namespaces_is_one_write_and_the_rest_lands_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("kv-identities.json");
        let b = IdentityBindings::open(Some(f.clone()));
        for i in 0..500 {
            b.check(&Arc::from(format!("ns-{i}")), Some(&A), true)
                .expect("bind");
        }
        assert!(b.writes() <= 2, "{} writes for 500 bindings", b.writes());
        drop(b);
        let again = IdentityBindings::open(Some(f));
        assert_eq!(
            again.bound("ns-499"),
            Some(A),
            "pending bindings written on drop"
        );
        assert_eq!(again.map.lock().len(), 500);
    }

    #[test]
    fn bindings_survive_a_reopen_and_a_corrupt_file_is_moved_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("kv-identities.json");
        let ns: Arc<str> = Arc::from("m/t");
        let first = IdentityBindings::open(Some(f.clone()));
        first.check(&ns, Some(&A), true).expect("bind");
        assert_eq!(first.writes(), 1, "the first binding is written at once");
        drop(first);
        let again = IdentityBindings::open(Some(f.clone()));
        assert_eq!(again.bound("m/t"), Some(A));
        assert!(again.check(&ns, Some(&B), false).is_err());
        std::fs::write(&f, b"{not json").expect("corrupt it");
        let fresh = IdentityBindings::open(Some(f.clone()));
        assert_eq!(fresh.bound("m/t"), None);
        assert!(
            f.with_extension("json.corrupt").exists(),
            "kept for inspection"
        );
    }
}
