//! Uploads in progress, written down so that a crash leaves nothing behind in the store
//! ([`UploadJournal`]).
//!
//! An upload that dies with the daemon (kill -9, a power cut) leaves what only its
//! process knew about: a multipart upload's parts sit in the bucket, invisible to
//! listings and billed until the bucket's lifecycle rule (if it has one) collects them,
//! and a local directory store keeps `object_store`'s temporary `NAME#N` file beside
//! the data, for good (black-box findings). So each upload is recorded in a small file
//! before its first byte goes out, and the record is removed once the upload completed
//! or was aborted. When the mount starts again, the records its predecessor left are
//! the uploads it never finished: each is aborted ([`super::BackingStore::abort_left`]),
//! and its record removed once the store confirmed it.
//!
//! - **One journal per mount point** (`<cache>/uploads/<mount>`), opened and read
//!   before the mount serves: its records are that mount's earlier run's alone, never
//!   an upload of this run (two mounts of one bucket each keep their own).
//! - **Records name their store**: a mount point remounted over another store leaves
//!   the other store's records in place (warned) for a later mount of that store.
//! - **Best effort, never in the way**: a record that cannot be written is logged and
//!   the upload goes on (the cost is the leak this prevents, not a failed write).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What is left of one upload that was not finished.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadRecord {
    /// The store, as the mount names it (its URL).
    pub store: String,
    /// The object's key in the store.
    pub location: String,
    /// The multipart upload's id; None for a local directory store's temporary file.
    pub upload_id: Option<String>,
    /// Written before the store was asked to create the upload, replaced by the
    /// record with its id once it answered: one left behind means the daemon died
    /// during that request, and the store may hold an upload no record names.
    #[serde(default)]
    pub starting: bool,
}

/// The journal of one mount's uploads in progress (see the module doc).
#[derive(Debug)]
pub struct UploadJournal {
    dir: PathBuf,
    store: String,
    next: AtomicU64,
}

/// An upload's record, removed by [`Recorded::done`] (dropping it keeps it: an
/// upload dropped unfinished is left to the next start to abort).
#[derive(Debug)]
pub struct Recorded {
    file: Option<PathBuf>,
}

impl Recorded {
    /// The upload completed or was aborted: its record goes.
    pub fn done(mut self) {
        if let Some(f) = self.file.take() {
            if let Err(e) = std::fs::remove_file(&f) {
                tracing::warn!(file = %f.display(), error = %e, "cannot remove an upload's record");
            }
        }
    }
}

/// A record found at start, and its file (removed once the upload is aborted).
#[derive(Debug)]
pub struct LeftUpload {
    pub record: UploadRecord,
    file: PathBuf,
}

impl LeftUpload {
    pub(super) fn forget(self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

impl UploadJournal {
    /// Opens (makes) the journal in `dir` for uploads to `store`, and returns the
    /// records an earlier run left for that store. Records of another store stay; a
    /// record that cannot be read is removed with a warning (its upload, if any, is
    /// then left to the store's lifecycle rule, as without a journal).
    pub fn open(dir: &Path, store: &str) -> std::io::Result<(Arc<UploadJournal>, Vec<LeftUpload>)> {
        std::fs::create_dir_all(dir)?;
        let mut left = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let file = entry?.path();
            if file.extension().is_none_or(|e| e != "json") {
                // A record being written when the daemon died (see `record`).
                let _ = std::fs::remove_file(&file);
                continue;
            }
            let record = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice::<UploadRecord>(&b).ok());
            match record {
                Some(r) if r.store == store => left.push(LeftUpload { record: r, file }),
                Some(r) => tracing::warn!(file = %file.display(), store = %r.store,
                    "an unfinished upload to another store than this mount's: left for a mount of it"),
                None => {
                    tracing::warn!(file = %file.display(), "an unreadable upload record: removed");
                    let _ = std::fs::remove_file(&file);
                }
            }
        }
        let journal = UploadJournal {
            dir: dir.to_path_buf(),
            store: store.to_string(),
            next: AtomicU64::new(0),
        };
        Ok((Arc::new(journal), left))
    }

    /// Records an upload of `location` about to start (`upload_id` once the store gave
    /// one). Written to a temporary name and renamed, so a record is whole or absent.
    pub fn record(&self, location: &str, upload_id: Option<&str>) -> Recorded {
        self.write(UploadRecord {
            store: self.store.clone(),
            location: location.to_string(),
            upload_id: upload_id.map(str::to_string),
            starting: false,
        })
    }

    /// Records that an upload of `location` is about to be created (see
    /// [`UploadRecord::starting`]); `done` once its own record is written.
    pub fn record_starting(&self, location: &str) -> Recorded {
        self.write(UploadRecord {
            store: self.store.clone(),
            location: location.to_string(),
            upload_id: None,
            starting: true,
        })
    }

    fn write(&self, record: UploadRecord) -> Recorded {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}-{n}", std::process::id());
        let (tmp, file) = (self.dir.join(&name), self.dir.join(format!("{name}.json")));
        let write = |b: &[u8]| std::fs::write(&tmp, b).and_then(|()| std::fs::rename(&tmp, &file));
        let written = serde_json::to_vec(&record)
            .map_err(std::io::Error::other)
            .and_then(|b| {
                write(&b).or_else(|e| {
                    // Its folder removed under the daemon (a tmp cleaner): made again
                    // (crash finding: every upload went unrecorded until a restart).
                    if e.kind() != std::io::ErrorKind::NotFound {
                        return Err(e);
                    }
                    std::fs::create_dir_all(&self.dir)?;
                    write(&b)
                })
            });
        match written {
            Ok(()) => Recorded { file: Some(file) },
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e,
                    "cannot record an upload: a crash now would leave it in the store");
                let _ = std::fs::remove_file(&tmp);
                Recorded { file: None }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_outlive_a_crash_and_only_this_stores_come_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (j, left) = UploadJournal::open(dir.path(), "s3://a").expect("open");
        assert!(left.is_empty());
        let finished = j.record("x/done", Some("id-1"));
        let _crashed = j.record("x/big", Some("id-2"));
        finished.done();
        // Created: its starting record goes. Cut off while being created: it stays.
        j.record_starting("x/done").done();
        let _creating = j.record_starting("x/new");
        let (other, _) = UploadJournal::open(dir.path(), "s3://b").expect("open");
        let _theirs = other.record("y", None);
        std::fs::write(dir.path().join("garbage.json"), b"{not json").expect("write");
        std::fs::write(dir.path().join("123-9"), b"half").expect("write");

        let (_, left) = UploadJournal::open(dir.path(), "s3://a").expect("reopen");
        let mut records: Vec<_> = left.iter().map(|l| l.record.clone()).collect();
        records.sort_by(|a, b| a.location.cmp(&b.location));
        assert_eq!(
            records,
            vec![
                UploadRecord {
                    store: "s3://a".into(),
                    location: "x/big".into(),
                    upload_id: Some("id-2".into()),
                    starting: false,
                },
                UploadRecord {
                    store: "s3://a".into(),
                    location: "x/new".into(),
                    upload_id: None,
                    starting: true,
                }
            ]
        );
        for l in left {
            l.forget();
        }
        let (_, left) = UploadJournal::open(dir.path(), "s3://a").expect("again");
        assert!(left.is_empty(), "forgotten records stay gone");
        let (_, theirs) = UploadJournal::open(dir.path(), "s3://b").expect("b");
        assert_eq!(theirs.len(), 1, "another store's record is kept");
        assert!(!dir.path().join("garbage.json").exists());
        assert!(!dir.path().join("123-9").exists());
    }
}
