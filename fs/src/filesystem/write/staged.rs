//! A file being written ([`Staged`]): its staging file, the bytes charged to the
//! disk budget (and those freed once sent), and its upload state.

use super::*;

/// One upload's outcome, shared by every flush that waited on it.
pub(super) type SharedUpload = Shared<BoxFuture<'static, std::result::Result<(), Arc<Error>>>>;

/// A file being written: its staging file and upload state.
pub(crate) struct Staged {
    /// Where it is uploaded; a rename while it is written moves it ([`FsCore::rename`]).
    pub(super) path: Mutex<Arc<str>>,
    pub(super) file: File,
    pub(super) file_path: PathBuf,
    pub(super) size: AtomicU64,
    /// Changes so far; a create counts as one (an empty file is uploaded too).
    pub(super) written: AtomicU64,
    /// `written` as of the last completed upload.
    pub(super) uploaded: AtomicU64,
    /// The last completed upload: (generation, crc32c of its bytes, the object).
    pub(super) last: Mutex<Option<(u64, u32, Arc<ObjectInfo>)>>,
    /// The version the next upload replaces: the object an open to change it in place
    /// read, then each upload's own (None: a new file, or one replaced whole).
    pub(super) base: Mutex<Option<Arc<ObjectInfo>>>,
    /// For a new file or one replaced whole: what the store holds under its name, its
    /// fsync record's precondition for the replay after a crash
    /// ([`journal::JournalRecord::replaces`]).
    pub(super) replaces: Mutex<journal::Precondition>,
    /// The upload in progress, with the generation it uploads.
    pub(super) upload: Mutex<Option<(u64, SharedUpload)>>,
    /// The last upload failed (its flush returned the error): release does not retry
    /// it behind the caller's back.
    pub(super) failed: AtomicBool,
    /// The last upload failed because the store did not answer (5xx, throttling, a
    /// timeout): an fsync'd file is then kept and uploaded later (`keep_unanswered`).
    pub(super) unanswered: AtomicBool,
    /// Bytes a write failed to land (ENOSPC, EIO on the staging disk) and its errno: the
    /// file misses them, so it is not uploaded (close and fsync fail with that errno,
    /// release skips it) until a later write covers them. A torn object must not pass
    /// for the file a program closed, even one that ignored the failed write.
    pub(super) lost: Mutex<Option<(Range<u64>, i32)>>,
    /// Every write so far appended at the end (the file may be streamed).
    pub(super) appending: AtomicBool,
    /// The upload sent while the file is written, once started.
    pub(super) stream: Mutex<Option<Stream>>,
    /// This file's bytes on local disk charged to `budget`, and the start of it freed.
    pub(super) charge: Mutex<Charge>,
    pub(super) budget: Option<Arc<PassthroughStore>>,
    /// Charging this file evicted copies: it is not adopted as a copy itself (the room
    /// it borrowed goes back to what reads earn; see [`PassthroughStore::adopt`]).
    pub(super) evicted: AtomicBool,
    /// A close came after the last write: the file is probably closed, its release
    /// on the way ([`FsCore::settled`]).
    pub(super) closed: AtomicBool,
    /// Unlinked while open: its handles still read and write it, nothing is uploaded.
    pub(super) unlinked: AtomicBool,
    /// The inode its writers opened (0: not yet told): an fstat of a handle of it
    /// answers from here once the path names another file or none.
    pub(super) ino: AtomicU64,
    /// The process that opened it (None: unknown): the close of a copy of its
    /// descriptor in another process does not upload it ([`FsCore::close`]).
    pub(super) opener: Option<u32>,
    /// The name and synced bytes its fsync record beside it holds (`journal.rs`);
    /// None: no record.
    pub(super) journaled: Mutex<Option<(Arc<str>, journal::Synced)>>,
    /// Created with `O_EXCL` or renamed with `RENAME_NOREPLACE`: its first upload only
    /// creates ([`creates_only`]).
    pub(super) exclusive: AtomicBool,
    /// The record file, open to be rewritten in place; its lock orders this file's
    /// fsyncs (`journal.rs`).
    pub(super) record_file: Mutex<Option<journal::RecordFile>>,
    /// The lowest byte written or truncated since the last fsync record (u64::MAX:
    /// none): at or past the record's length, the next record's crc32c extends the last
    /// one over the appended bytes rather than reading the whole file again.
    pub(super) low_write: AtomicU64,
    /// The store and prefix the mount shows, written in its fsync record.
    pub(super) source: Arc<str>,
    /// The mount's canonical mountpoint, written in its fsync record.
    pub(super) mountpoint: Option<Arc<str>>,
    /// Being filled with the object it changes (an open to append or patch): until
    /// then the object is what the path shows, not this partial file.
    pub(super) filling: AtomicBool,
}

#[derive(Default)]
pub(super) struct Charge {
    /// Bytes charged: the file's size as the last write or truncate left it, less
    /// `freed`.
    pub(super) charged: u64,
    /// Bytes at the start of the file already sent and punched out of the staging file.
    pub(super) freed: u64,
}

/// Sets the size of a file being written (truncate or grow), as a write would change it.
pub(super) fn resize_staged(staged: &Staged, size: u64) -> Result<()> {
    let freed = staged.freed();
    if freed > 0 {
        // As a refused write: not the file the program asked for (see `write`).
        staged.lose(size.min(freed)..size.max(freed), libc::ENOTSUP);
        return Err(freed_error(&staged.path(), size.min(freed), freed));
    }
    staged.changed_from(size);
    staged.file.set_len(size).map_err(|source| Error::Local {
        what: format!("truncating {}", staged.path()),
        source,
    })?;
    staged.size.store(size, Ordering::Release);
    staged.charge_exactly(size);
    staged.appending.store(false, Ordering::Release);
    staged.written.fetch_add(1, Ordering::AcqRel);
    staged.closed.store(false, Ordering::Release);
    staged.break_stream();
    Ok(())
}

/// A write (or truncate, or upload) at `offset` of a file whose first `freed` bytes were
/// sent and freed from local disk (`Staged::free_sent`).
pub(super) fn freed_error(path: &str, offset: u64, freed: u64) -> Error {
    Error::Unsupported(format!(
        "{path}: its first {freed} bytes were uploaded and freed from local disk while \
         the disk budget was full, so it cannot be uploaded whole again: written at \
         {offset} below them, or after a close or fsync completed its upload (a file \
         rewritten out of order, or closed and written on, must fit in the budget)"
    ))
}

/// Frees `len` bytes at `offset` of `file` (its size unchanged; reads there see zeros).
pub(super) fn punch_hole(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (off, len) = (
        libc::off_t::try_from(offset).map_err(std::io::Error::other)?,
        libc::off_t::try_from(len).map_err(std::io::Error::other)?,
    );
    // SAFETY: a plain syscall on a descriptor `file` owns for the call's duration.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Bytes `offset..offset+size` of a staged file as written so far. Blocking.
pub(super) fn read_back(staged: &Staged, offset: u64, size: u32) -> Result<Bytes> {
    let freed = staged.freed();
    if offset < freed {
        // Said as a read's (black-box finding: the write's wording sent an operator
        // looking for a writer that had written below the freed bytes).
        return Err(Error::Unsupported(format!(
            "{}: its first {freed} bytes were sent to the store and freed from local disk \
             while the disk budget was full, and it is still being written: a read at \
             {offset} below them is refused until its upload completes",
            staged.path()
        )));
    }
    let end = staged.size.load(Ordering::Acquire);
    let len = (size as u64).min(end.saturating_sub(offset)) as usize;
    let mut buf = vec![0u8; len];
    staged
        .file
        .read_exact_at(&mut buf, offset)
        .map(|()| Bytes::from(buf))
        .map_err(|source| Error::Local {
            what: format!("reading back {}", staged.path()),
            source,
        })
}

impl Drop for Staged {
    fn drop(&mut self) {
        self.uncharge();
    }
}

impl Staged {
    /// What a replay of this file's fsync record may upload over: what the name held
    /// when it was made (None where [`Self::base`] decides: a file changed in place, or
    /// uploaded since; or where it is unknown).
    pub(super) fn replaces_now(&self) -> Option<journal::Replaces> {
        if self.base.lock().is_some() {
            return None;
        }
        match &*self.replaces.lock() {
            journal::Precondition::Is(r) => Some(r.clone()),
            journal::Precondition::Ask | journal::Precondition::Unknown => None,
        }
    }

    /// Waits for the upload under way, if any (its result is its caller's); says
    /// whether there was one.
    pub(crate) async fn upload_done(&self) -> bool {
        let under_way = self.upload.lock().as_ref().map(|(_, f)| f.clone());
        match under_way {
            Some(upload) => {
                let _ = upload.await;
                true
            }
            None => false,
        }
    }

    /// Records bytes `range` a write failed to land (see `lost`).
    pub(super) fn lose(&self, range: Range<u64>, errno: i32) {
        let mut lost = self.lost.lock();
        let range = match lost.take() {
            Some((r, _)) => r.start.min(range.start)..r.end.max(range.end),
            None => range,
        };
        *lost = Some((range, errno));
    }

    /// A write of `range` landed: what it covers is no longer lost.
    pub(super) fn recover(&self, range: Range<u64>) {
        let mut lost = self.lost.lock();
        if lost
            .as_ref()
            .is_some_and(|(r, _)| range.start <= r.start && r.end <= range.end)
        {
            *lost = None;
        }
    }

    pub(crate) fn path(&self) -> Arc<str> {
        self.path.lock().clone()
    }

    /// Bytes at the start of the file freed from local disk once sent (see
    /// [`Self::free_sent`]); 0 unless the budget was short.
    pub(super) fn freed(&self) -> u64 {
        self.charge.lock().freed
    }

    /// Charges the file's growth to `end` bytes to the local files' budget: the least
    /// recently opened copies make room; when even all of them could not, and the file
    /// is being streamed, it first frees what the stream has sent. Blocking (removing
    /// copies, punching a hole).
    /// Bytes from `offset` on are about to change (a write or truncate): the next fsync
    /// record checksums from there (see `low_write`).
    pub(super) fn changed_from(&self, offset: u64) {
        self.low_write.fetch_min(offset, Ordering::AcqRel);
    }

    pub(super) fn charge_upto(&self, end: u64) {
        let Some(budget) = &self.budget else {
            return;
        };
        let growth = {
            let c = self.charge.lock();
            end.saturating_sub(c.freed).saturating_sub(c.charged)
        };
        if growth == 0 {
            return;
        }
        if budget.room_for_staging() < growth {
            self.free_sent(budget);
        }
        let add = {
            let mut c = self.charge.lock();
            let add = end.saturating_sub(c.freed).saturating_sub(c.charged);
            c.charged += add;
            add
        };
        if add > 0 && budget.charge_staged(add) {
            self.evicted.store(true, Ordering::Release);
        }
    }

    /// Frees (punches out) the start of the file that its stream has read into parts
    /// it holds until they are stored: a checkpoint written in order then takes little
    /// more local disk than its parts in flight, however large it is. Only when the
    /// alternative is going over the budget, since it costs the fallback: the file
    /// cannot be uploaded whole again, so a write below the freed bytes is refused, a
    /// stream that fails fails the close, and once a close (a `dup`'s too) or an
    /// `fsync` completed the upload, the file takes no more writes, as in mountpoint-s3
    /// (see the module docs).
    pub(super) fn free_sent(&self, budget: &PassthroughStore) {
        let Some(ctl) = self.stream.lock().as_ref().map(|s| s.ctl.clone()) else {
            return;
        };
        if ctl.broken.load(Ordering::Acquire) {
            return;
        }
        // Whole 4 KiB pages: a hole punched in part of a page frees nothing.
        let upto = ctl.taken_upto.load(Ordering::Acquire) & !4095;
        let from = self.freed();
        if upto <= from {
            return;
        }
        if let Err(e) = punch_hole(&self.file, from, upto - from) {
            tracing::debug!(path = %self.path(), error = %e, "sent bytes not freed");
            return;
        }
        let released = {
            let mut c = self.charge.lock();
            if upto <= c.freed {
                0
            } else {
                let r = (upto - c.freed).min(c.charged);
                c.freed = upto;
                c.charged -= r;
                r
            }
        };
        budget.release_staged(released);
    }

    /// The file was truncated to `size` bytes (never below what was freed: refused).
    pub(super) fn charge_exactly(&self, size: u64) {
        let Some(budget) = &self.budget else {
            return;
        };
        let (grow, shrink) = {
            let mut c = self.charge.lock();
            let target = size.saturating_sub(c.freed);
            let before = std::mem::replace(&mut c.charged, target);
            (target.saturating_sub(before), before.saturating_sub(target))
        };
        if grow > 0 && budget.charge_staged(grow) {
            self.evicted.store(true, Ordering::Release);
        }
        budget.release_staged(shrink);
    }

    /// The staging file leaves the staging directory (removed, or adopted as a copy).
    pub(super) fn uncharge(&self) {
        if let Some(budget) = &self.budget {
            let bytes = std::mem::take(&mut self.charge.lock().charged);
            budget.release_staged(bytes);
        }
    }

    /// A stream in progress sends stale bytes (or to a stale key): it aborts, and the
    /// file is uploaded whole at its close.
    pub(super) fn break_stream(&self) {
        if let Some(s) = self.stream.lock().as_ref() {
            s.ctl.broken.store(true, Ordering::Release);
            s.ctl.wake.notify_one();
        }
    }

    pub(super) fn changed(&self) -> bool {
        self.uploaded.load(Ordering::Acquire) < self.written.load(Ordering::Acquire)
    }

    /// The attributes of the file as written so far.
    pub(super) fn meta(&self) -> Meta {
        let mtime = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        Meta::File(Arc::new(ObjectInfo {
            path: self.path().clone(),
            size: self.size.load(Ordering::Acquire),
            version: Arc::from(""),
            has_etag: false,
            last_modified_unix_ns: mtime,
            block_size: strata_cache_core::DEFAULT_BLOCK_SIZE,
        }))
    }
}
