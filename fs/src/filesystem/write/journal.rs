//! `fsync` of a file being written: durable on the cache disk, uploaded at the close.
//!
//! The object is written whole, so an `fsync` that uploads sends the whole file each
//! time: a log fsync'd per line, or sqlite committing, uploaded the square of the file
//! (black-box finding: 1,000 fsync'd 100-byte lines sent 50 MB for a 100 KB log; 200
//! sqlite autocommits, 98 MB for a 930 KB database). Instead, an `fsync` of a file with
//! changes not uploaded makes its staging file durable (`fdatasync`) and records where
//! it goes beside it (`<n>.part.json`, written atomically and synced): the close uploads
//! it once, as without the fsync. A crash before the close leaves both files, and the
//! next start of the mount uploads the staged file to its recorded name
//! ([`FsCore::recover_journaled`]): what an fsync acknowledged is not lost. (JuiceFS's
//! write-back cache makes the same trade: durable on the local disk at fsync, in the
//! store at the close or once the daemon is back.)
//!
//! A file the fsync cannot leave on local disk is uploaded as before: one being sent
//! while written (its stream may free what it sent), or one whose first bytes were
//! freed already. A journaled file is not streamed (the record names the staged file
//! whole). A rename while open rewrites the record; an unlink, a release and a
//! completed upload of everything written remove it.
//!
//! The record names the store and prefix it was written for: a mount of another
//! source at the same mountpoint (and cache dir) keeps it, uploading nothing into its
//! own store (crash finding: an fsync'd checkpoint of one bucket was uploaded into
//! the bucket mounted there next, and never into its own). A start killed after a
//! recovery upload landed and before its record went finds the name taken: an object
//! holding exactly the staged bytes completes the record (crash finding: such records
//! were kept, and reported as failed, at every later start, and uploaded again once
//! the names were deleted through the mount). A name the mount changes before the
//! record's upload (a delete, a new file there) supersedes it.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use strata_cache_core::CacheError;

use super::{Staged, Writes};
use crate::error::{Error, Result};

/// A recovery upload the store did not answer is tried again after 5 s, then at
/// doubling pauses up to a minute, for as long as the daemon runs (crash finding: a
/// start into a store outage left the fsync'd file out of the store until the next
/// restart, however soon the store came back).
const RECOVERY_RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(5);
const RECOVERY_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// The record beside a journaled staging file (JSON: `{"path", "only_if_absent"}`).
#[derive(Debug)]
pub(crate) struct JournalRecord {
    /// The object it is uploaded to.
    pub path: String,
    /// Uploaded only if no object has the name (a create on a mount without
    /// `allow_overwrite`).
    pub only_if_absent: bool,
    /// The mount's store and prefix (`<store label>|<prefix>`) it was written for; None
    /// in a record that names none (kept, never uploaded: its store is unknown).
    pub source: Option<String>,
}

/// A staged file an earlier run journaled and did not upload.
#[derive(Debug)]
pub(crate) struct Journaled {
    pub file: PathBuf,
    pub record_file: PathBuf,
    pub record: JournalRecord,
}

/// The record file of staging file `file`.
pub(super) fn record_path(file: &Path) -> PathBuf {
    let mut p = file.as_os_str().to_owned();
    p.push(".json");
    PathBuf::from(p)
}

/// Writes `record` beside `file` (atomically: see `write_atomically`).
fn write_record(file: &Path, record: &JournalRecord) -> std::io::Result<()> {
    let body = serde_json::to_vec(&serde_json::json!({
        "path": record.path,
        "only_if_absent": record.only_if_absent,
        "source": record.source,
    }))
    .map_err(std::io::Error::other)?;
    strata_cache_core::state_file::write_atomically(&record_path(file), &body)
}

impl Staged {
    /// Makes what was written durable here and records where it goes (see the module
    /// doc). Blocking.
    pub(super) fn journal(&self, only_if_absent: bool) -> std::io::Result<()> {
        self.file.sync_data()?;
        let path = self.path();
        if self.journaled.lock().as_deref() == Some(&*path) {
            return Ok(());
        }
        // Not under the lock (file I/O); two fsyncs racing write the same record.
        write_record(
            &self.file_path,
            &JournalRecord {
                path: path.to_string(),
                only_if_absent,
                source: Some(self.source.to_string()),
            },
        )?;
        *self.journaled.lock() = Some(path);
        Ok(())
    }

    /// The record goes (uploaded, released or unlinked). Blocking.
    pub(super) fn unjournal(&self) {
        if self.journaled.lock().take().is_some() {
            let _ = std::fs::remove_file(record_path(&self.file_path));
        }
    }

    /// The file moved to another name while journaled: its record follows. Blocking.
    pub(super) fn rejournal(&self, only_if_absent: bool) {
        if self.journaled.lock().is_none() {
            return;
        }
        if let Err(e) = self.journal(only_if_absent) {
            tracing::error!(path = %self.path(), error = %e, "cannot move the fsync record of a renamed file; a crash before its close loses what was fsync'd");
        }
    }

    pub(super) fn is_journaled(&self) -> bool {
        self.journaled.lock().is_some()
    }
}

impl Writes {
    /// At start: the staged files an earlier run journaled (kept for
    /// [`FsCore::recover_journaled`]); a record without its file, or unreadable, goes.
    pub(super) fn journaled_left(dir: &Path) -> std::io::Result<Vec<Journaled>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".part.json")) else {
                continue;
            };
            let file = dir.join(format!("{stem}.part"));
            let record_file = entry.path();
            let record = strata_cache_core::state_file::read_regular(&record_file)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| {
                    Some(JournalRecord {
                        path: v.get("path")?.as_str()?.to_string(),
                        only_if_absent: v.get("only_if_absent")?.as_bool()?,
                        source: v.get("source").and_then(|s| s.as_str()).map(String::from),
                    })
                });
            match record {
                Some(record) if file.is_file() => out.push(Journaled {
                    file,
                    record_file,
                    record,
                }),
                _ => {
                    tracing::warn!(record = %record_file.display(), "an fsync record without its file, or unreadable: removed");
                    let _ = std::fs::remove_file(&record_file);
                }
            }
        }
        Ok(out)
    }
}

impl super::FsCore {
    /// FSYNC of write handle `fh`: durable on the cache disk, uploaded at the close
    /// (see the module doc); a file that cannot wait there is uploaded now.
    pub async fn fsync(self: &Arc<Self>, fh: u64) -> Result<()> {
        let Some(staged) = self.writes.as_ref().and_then(|w| w.handle(fh)) else {
            return Ok(());
        };
        let waits_here = !staged.unlinked.load(Ordering::Acquire)
            && staged.lost.lock().is_none()
            && staged.stream.lock().is_none()
            && staged.freed() == 0
            && staged.uploaded.load(Ordering::Acquire) < staged.written.load(Ordering::Acquire);
        if !waits_here {
            return self.upload(&staged).await;
        }
        let only_if_absent = super::creates_only(&self.writes()?.opts, &staged);
        let s = staged.clone();
        tokio::task::spawn_blocking(move || s.journal(only_if_absent))
            .await
            .map_err(|e| Error::Local {
                what: format!("fsync of {}", staged.path()),
                source: std::io::Error::other(e),
            })?
            .map_err(|source| Error::Local {
                what: format!("fsync of {}", staged.path()),
                source,
            })
    }

    /// Uploads the staged files an earlier run fsync'd and did not upload (a crash
    /// before their close), each to its recorded name, in the background; each is
    /// removed once uploaded, kept (for the next start) if the upload fails.
    pub fn recover_journaled(self: &Arc<Self>, rt: &tokio::runtime::Handle) {
        let Some(writes) = self.writes.as_ref() else {
            return;
        };
        let left = std::mem::take(&mut *writes.journaled_left.lock());
        if left.is_empty() {
            return;
        }
        let source = writes.source.clone();
        let legacy = writes.legacy_source.clone();
        let core = self.clone();
        let mut pending: Vec<Journaled> = left
            .into_iter()
            .filter(|j| {
                let written_for = j.record.source.as_deref();
                let ours = written_for == Some(&*source)
                    || (legacy.is_some() && written_for == legacy.as_deref());
                if !ours {
                    tracing::warn!(path = %j.record.path, file = %j.file.display(),
                        written_for = ?j.record.source, mounted = %source,
                        "a file fsync'd before a crash belongs to another store or prefix: kept for a mount of that one, not uploaded here");
                }
                ours
            })
            .collect();
        rt.spawn(async move {
            let mut pause = RECOVERY_RETRY_FIRST;
            loop {
                let mut again = Vec::new();
                for j in pending {
                    // Changed through this mount since it started (deleted, written
                    // anew): what the fsync kept is superseded.
                    if core.changed_since(&j.record.path, 0) {
                        tracing::warn!(path = %j.record.path, "a file fsync'd before a crash was changed through the mount since; its fsync'd copy dropped");
                        let _ = std::fs::remove_file(&j.file);
                        let _ = std::fs::remove_file(&j.record_file);
                        continue;
                    }
                    match core.upload_journaled(&j).await {
                        Ok(()) => {
                            tracing::info!(path = %j.record.path, "a file fsync'd before a crash uploaded");
                            let _ = std::fs::remove_file(&j.file);
                            let _ = std::fs::remove_file(&j.record_file);
                        }
                        Err(Error::Cache(e)) if super::super::store_unreachable(&e) => {
                            tracing::warn!(path = %j.record.path, error = %e, retry_in = ?pause,
                                "a file fsync'd before a crash could not be uploaded yet: the store does not answer");
                            again.push(j);
                        }
                        Err(e) => tracing::error!(path = %j.record.path, file = %j.file.display(), error = %e,
                            "a file fsync'd before a crash could not be uploaded; kept for the next start"),
                    }
                }
                if again.is_empty() {
                    break;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RECOVERY_RETRY_MAX);
                pending = again;
            }
        });
    }

    async fn upload_journaled(&self, j: &Journaled) -> Result<()> {
        let opts = self.writes()?.opts.clone();
        let file = Arc::new(std::fs::File::open(&j.file).map_err(|source| Error::Local {
            what: format!("opening {}", j.file.display()),
            source,
        })?);
        let size = file
            .metadata()
            .map_err(|source| Error::Local {
                what: format!("reading {}", j.file.display()),
                source,
            })?
            .len();
        let shape = strata_cache_core::store::UploadShape {
            part_size: opts.part_size,
            in_flight: opts.parts_in_flight,
            slots: Some(self.writes()?.upload_slots.clone()),
            only_if_absent: j.record.only_if_absent,
        };
        let uploaded = self
            .reader
            .store()
            .upload(&j.record.path, size, &shape, |offset, len| {
                let file = file.clone();
                async move { super::stream::read_part(file, offset, len).await }
            })
            .await;
        match uploaded {
            Ok(_) => {}
            // An earlier start's upload of it landed (killed before the record went).
            Err(CacheError::Exists(_)) if self.store_holds(&j.record.path, &file, size).await? => {}
            Err(e) => return Err(e.into()),
        }
        let path: Arc<str> = Arc::from(j.record.path.as_str());
        if let Some(dir) = self.parent_of(&path).map(Arc::<str>::from) {
            self.refresh(&dir, &path).await;
        }
        self.show_folders_of(&path).await;
        Ok(())
    }

    /// Whether the store's object `path` holds exactly `size` bytes of `file` (read back
    /// part by part; only a recovery whose create-only upload found the name taken asks).
    async fn store_holds(&self, path: &str, file: &Arc<std::fs::File>, size: u64) -> Result<bool> {
        let store = self.reader.store();
        let obj = match store.head(path).await {
            Ok(obj) => obj,
            Err(CacheError::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if obj.size != size {
            return Ok(false);
        }
        let step = self.writes()?.opts.part_size.max(1 << 20) as u64;
        let mut at = 0;
        while at < size {
            let len = step.min(size - at);
            let theirs = store.get_range(&obj, at..at + len).await?;
            let ours = super::stream::read_part(file.clone(), at, len as usize)
                .await
                .map_err(|source| Error::Local {
                    what: format!("reading back the fsync'd copy of {path}"),
                    source,
                })?;
            if theirs != ours {
                return Ok(false);
            }
            at += len;
        }
        Ok(true)
    }
}
