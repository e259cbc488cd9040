//! Uploads of files written through the mount: at flush and close (once per change,
//! shared by concurrent flushes), their outcome recorded, and what release does with
//! a file nobody flushed.

use super::*;

impl FsCore {
    /// Uploads the file of write handle `fh` if it changed since its last upload
    /// (FSYNC, and a close by its opener). Other handles: nothing to do.
    pub async fn flush(self: &Arc<Self>, fh: u64) -> Result<()> {
        let Some(staged) = self.writes.as_ref().and_then(|w| w.handle(fh)) else {
            return Ok(());
        };
        self.upload(&staged).await
    }

    /// A close of a descriptor of write handle `fh` by thread `pid` (FLUSH): uploads
    /// as [`Self::flush`], except for a close in another process than the one that
    /// opened the file (both known): a copy of the descriptor that a `fork` made (a
    /// child exiting, or an `exec` closing it), while the opener may still be writing;
    /// uploading would send a half-written file (and a streamed one could take no more
    /// writes). That close is left to the opener's, or else to the release when the
    /// last copy of the descriptor closes (mountpoint-s3 skips it too).
    ///
    /// A file created or truncated and closed before its first write is uploaded
    /// empty here, as a local disk holds it from the open: a `touch`ed marker
    /// (`_SUCCESS`) is an object when its close returns (crash finding: left to the
    /// release, which the kernel sends after close() has returned, 10 of 10 markers
    /// were lost to a kill -9 right after). A shell's `> file`, which closes its first
    /// copy of the descriptor before the command writes, so sends the empty object,
    /// then the file. A file opened to change in place and closed unchanged uploads
    /// nothing.
    pub async fn close(self: &Arc<Self>, fh: u64, pid: u32) -> Result<()> {
        let Some(staged) = self.writes.as_ref().and_then(|w| w.handle(fh)) else {
            return Ok(());
        };
        staged.closed.store(true, Ordering::Release);
        let closer = process_of(pid);
        if let (Some(opener), Some(closer)) = (staged.opener, closer) {
            if opener != closer {
                tracing::debug!(path = %staged.path(), opener, closer, "close in another process than the opener: upload left to the opener's close");
                return Ok(());
            }
        }
        let ino = staged.ino.load(Ordering::Acquire);
        if let (Some(closer), Some(&conn), true) = (closer, self.fuse_conn.get(), ino != 0) {
            if writes_on(closer, conn, ino) {
                tracing::debug!(path = %staged.path(), closer, "closed while the process still writes it through another descriptor: upload left to that one's close");
                staged.closed.store(false, Ordering::Release);
                return Ok(());
            }
        }
        self.upload(&staged).await
    }

    /// Single-flight upload of `staged` until what was written before this call is
    /// uploaded (a writer that keeps writing does not keep a flush waiting).
    pub(super) async fn upload(self: &Arc<Self>, staged: &Arc<Staged>) -> Result<()> {
        if staged.unlinked.load(Ordering::Acquire) {
            // Removed while open: written on, never made an object.
            return Ok(());
        }
        if let Some((range, errno)) = staged.lost.lock().clone() {
            staged.failed.store(true, Ordering::Release);
            return Err(Error::Local {
                what: format!(
                    "{}: not uploaded, a write of bytes {}..{} failed",
                    staged.path(),
                    range.start,
                    range.end
                ),
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        let target = staged.written.load(Ordering::Acquire);
        // Uploads that failed while the file changed under them (see below).
        let mut changed_under = 0;
        while staged.uploaded.load(Ordering::Acquire) < target {
            let gen = staged.written.load(Ordering::Acquire);
            let (id, fut) = {
                let mut slot = staged.upload.lock();
                match &*slot {
                    Some((id, f)) => (*id, f.clone()),
                    None => {
                        let core = self.clone();
                        let s = staged.clone();
                        let f = async move { core.upload_once(&s, gen).await.map_err(Arc::new) }
                            .boxed()
                            .shared();
                        *slot = Some((gen, f.clone()));
                        (gen, f)
                    }
                }
            };
            let result = fut.await;
            {
                let mut slot = staged.upload.lock();
                if slot.as_ref().is_some_and(|(i, _)| *i == id) {
                    *slot = None;
                }
            }
            if let Err(e) = result {
                // The file changed while the upload read it (a truncate by path from
                // another process shrank it under the parts being read): what failed
                // is a file no longer there, so it goes again as it is now, a few
                // times at most (black-box finding: such a truncate during a close
                // failed the close EIO, "failed to fill whole buffer", the data lost).
                if staged.written.load(Ordering::Acquire) != id && changed_under < 3 {
                    changed_under += 1;
                    tracing::debug!(path = %staged.path(), error = %e, "the file changed during its upload; uploading it again");
                    continue;
                }
                staged.failed.store(true, Ordering::Release);
                let unanswered =
                    matches!(&*e, Error::Cache(c) if super::super::store_unreachable(c));
                staged.unanswered.store(unanswered, Ordering::Release);
                self.counters
                    .upload_failures
                    .fetch_add(1, Ordering::Relaxed);
                // What the store holds under the name is unknown now (an answer lost
                // after the object landed): asked again at the next lookup, not kept
                // as it was before the write (crash finding: a create whose answer was
                // lost left the name ENOENT through the mount, the object in the store).
                let path = staged.path();
                self.changing(&path);
                self.attrs.invalidate(&path).await;
                if let Some(dir) = self.parent_of(&path).map(Arc::<str>::from) {
                    self.relist(&dir, &path, None).await;
                }
                return Err(Error::Upload(e));
            }
            staged.failed.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// One upload of `staged` as of generation `gen`, then its metadata.
    pub(super) async fn upload_once(&self, staged: &Arc<Staged>, gen: u64) -> Result<()> {
        let opts = self.writes()?.opts.clone();
        self.base_still_in_store(staged).await?;
        // A stream in progress finishes the upload if nothing broke it; any failure of
        // it falls back to an upload of the whole file.
        let stream = staged.stream.lock().take();
        if let Some(Stream { ctl, task }) = stream {
            ctl.finish.store(true, Ordering::Release);
            ctl.wake.notify_one();
            match task.await {
                Ok(Ok(crc)) => {
                    self.counters
                        .uploads_streamed
                        .fetch_add(1, Ordering::Relaxed);
                    return self.uploaded(staged, gen, crc).await;
                }
                // The start of the file is gone from local disk: no second try.
                Ok(Err(e)) if staged.freed() > 0 => return Err(e),
                Ok(Err(e)) => {
                    tracing::debug!(path = %staged.path(), error = %e, "streamed upload not used; uploading the file");
                }
                Err(e) => {
                    tracing::warn!(path = %staged.path(), error = %e, "streamed upload task failed; uploading the file");
                }
            }
        }
        let freed = staged.freed();
        if freed > 0 {
            return Err(freed_error(&staged.path(), 0, freed));
        }
        let size = staged.size.load(Ordering::Acquire);
        let store = self.reader.store();
        let file = staged.file.try_clone().map_err(|source| Error::Local {
            what: format!("reopening {}", staged.path()),
            source,
        })?;
        let file = Arc::new(file);
        // Parts are read in order, so the crc32c of the whole is appended part by part.
        let crc = Arc::new(Mutex::new(0u32));
        let writes = self.writes()?;
        let shape = UploadShape {
            part_size: opts.part_size,
            in_flight: opts.parts_in_flight,
            slots: Some(writes.upload_slots.clone()),
            only_if_absent: creates_only(&writes.opts, staged),
        };
        store
            .upload(&staged.path(), size, &shape, |offset, len| {
                let (file, crc) = (file.clone(), crc.clone());
                async move {
                    let part = read_part(file, offset, len).await?;
                    let mut c = crc.lock();
                    *c = crc32c::crc32c_append(*c, &part);
                    Ok(part)
                }
            })
            .await?;
        let crc = *crc.lock();
        self.uploaded(staged, gen, crc).await
    }

    /// Before an upload replaces an object this file changes in place: the store still
    /// holds the version it was opened on (or last uploaded), else `Changed` (ESTALE)
    /// and nothing is uploaded. Black-box finding: an append closed over a version
    /// another writer had put after the open, and that acknowledged object was lost.
    /// An object removed meanwhile is changed too (black-box finding, round 21: a
    /// logger's close brought back the object a cleanup job had deleted, as its old
    /// bytes plus the change; a truncate and the crash replay already refused so).
    /// (One HEAD; a version replaced between it and the upload is not caught.)
    pub(super) async fn base_still_in_store(&self, staged: &Arc<Staged>) -> Result<()> {
        let Some(base) = staged.base.lock().clone() else {
            return Ok(());
        };
        let path = staged.path();
        match self.reader.store().head(&path).await {
            Ok(now) if now.version != base.version => {
                tracing::warn!(path = %path, "not uploaded: another writer replaced the object since this file opened it");
                Err(Error::Cache(CacheError::Changed(format!(
                    "{path}: replaced in the store by another writer since it was opened"
                ))))
            }
            Err(CacheError::NotFound(_)) => {
                tracing::warn!(path = %path, "not uploaded: another client removed the object since this file opened it");
                Err(Error::Cache(CacheError::Changed(format!(
                    "{path}: removed from the store by another client since it was opened"
                ))))
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// After `staged` was uploaded as of generation `gen` (bytes of crc32c `crc`): its
    /// metadata from the store, its parent's listing dropped.
    pub(super) async fn uploaded(&self, staged: &Arc<Staged>, gen: u64, crc: u32) -> Result<()> {
        let size = staged.size.load(Ordering::Acquire);
        let parent = self.parent_of(&staged.path()).map(Arc::<str>::from);
        let fresh = match &parent {
            Some(parent) => self.refresh(parent, &staged.path()).await,
            None => None,
        };
        // The first object in a folder made by `mkdir` makes it real: logged in its
        // parent for a start with the store silent (black-box finding: such a folder
        // was missing after that restart, its files ENOENT).
        let in_made_folder = parent.as_deref().is_some_and(|p| {
            self.writes
                .as_ref()
                .is_some_and(|w| w.local_dirs.lock().contains(p))
        });
        if in_made_folder && self.listing_log.is_some() {
            self.show_folders_of(&staged.path()).await;
        }
        // The version the next upload of this file replaces is the one just made; not
        // knowing it, the next upload checks nothing (rather than take its own upload
        // for another writer's).
        *staged.base.lock() = fresh.clone();
        // Its own upload is what a later replay replaces (`base` says which, when
        // known): what the name held at the create no longer is.
        *staged.replaces.lock() = journal::Precondition::Unknown;
        if let Some(info) = fresh {
            self.supersede(&info);
            *staged.last.lock() = Some((gen, crc, info));
        }
        staged.uploaded.fetch_max(gen, Ordering::AcqRel);
        if staged.written.load(Ordering::Acquire) == gen {
            // In the store: a crash now loses nothing the fsync record would restore.
            staged.unjournal();
        }
        self.counters.uploaded(size);
        tracing::debug!(path = %staged.path(), size, "uploaded");
        Ok(())
    }

    /// Releases write handle `fh`: uploads what a flush did not (a failed upload is not
    /// retried: its close already reported it), then drops the staging file or adopts
    /// it as the passthrough copy of the uploaded version.
    /// The kernel's connection is gone, and write handles are still open: releases the
    /// kernel never sent (when a lazily unmounted mount's last file closes, the release
    /// it queues is lost with the connection). A file whose every byte an upload took
    /// (the close's) is released here: its staging copy goes. One with bytes no upload
    /// took stays, as a crash would leave it (the next start removes it, unless an
    /// fsync recorded it). Black-box finding (round 23): a file written across a `umount
    /// -l` was uploaded whole at its close, its staging copy left, and the next start
    /// removed it warning "never uploaded". Blocking (removes files); the number released.
    pub fn release_uploaded_after_session(&self) -> usize {
        let Some(writes) = self.writes.as_ref() else {
            return 0;
        };
        let open: Vec<Arc<Staged>> = {
            let mut handles = writes.handles.lock();
            let uploaded: Vec<u64> = handles
                .iter()
                .filter(|(_, s)| !s.changed() && !s.failed.load(Ordering::Acquire))
                .map(|(fh, _)| *fh)
                .collect();
            uploaded
                .iter()
                .filter_map(|fh| handles.remove(fh))
                .collect()
        };
        let mut released = 0;
        for (i, staged) in open.iter().enumerate() {
            // Once per file (it may have had several handles), and only if no handle of
            // it is left.
            if open[..i].iter().any(|s| Arc::ptr_eq(s, staged))
                || writes
                    .handles
                    .lock()
                    .values()
                    .any(|s| Arc::ptr_eq(s, staged))
            {
                continue;
            }
            staged.unjournal();
            released_from(writes, staged);
            staged.uncharge();
            match std::fs::remove_file(&staged.file_path) {
                Ok(()) => released += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(file = %staged.file_path.display(), error = %e, "staging file not removed")
                }
            }
        }
        if released > 0 {
            tracing::info!(released, "files uploaded at their close, whose release the ended session never sent: staging copies removed");
        }
        released
    }

    pub async fn release_write(self: &Arc<Self>, fh: u64) {
        let Some(writes) = self.writes.as_ref() else {
            return;
        };
        let Some(staged) = writes.handles.lock().remove(&fh) else {
            return;
        };
        if staged.changed() && !staged.failed.load(Ordering::Acquire) {
            if let Err(e) = self.upload(&staged).await {
                tracing::error!(path = %staged.path(), error = %e, "upload at release failed; the object was not written");
            }
        }
        // fsync'd, and the store did not answer: kept as a crash would keep it.
        let kept = staged.failed.load(Ordering::Acquire)
            && staged.unanswered.load(Ordering::Acquire)
            && staged.is_journaled()
            && !staged.unlinked.load(Ordering::Acquire)
            && staged.lost.lock().is_none()
            && staged.freed() == 0
            && self.keep_unanswered(&staged).await;
        if !kept {
            // Uploaded, or its failure reported at the close: nothing left for a restart.
            staged.unjournal();
        }
        released_from(writes, &staged);
        writes.released.notify_waiters();
        if staged.failed.load(Ordering::Acquire) && !kept {
            // Its name is asked of the store again, as after the failure itself: the file
            // may have been renamed since (an object under the old name moving with it)
            // while its own entry shadowed the name (reference-model finding: an object
            // moved so was ENOENT through the mount once the failed file was released).
            let path = staged.path();
            self.changing(&path);
            self.attrs.invalidate(&path).await;
            if let Some(dir) = self.parent_of(&path).map(Arc::<str>::from) {
                self.relist(&dir, &path, None).await;
            }
        }
        // Before the adoption, which takes only free room: this file's own bytes are
        // the room it would take.
        staged.uncharge();
        if kept {
            return;
        }
        let last = staged.last.lock().clone();
        let adopted = match (&self.passthrough, last) {
            (Some(pt), Some((gen, crc, info)))
                if gen == staged.written.load(Ordering::Acquire)
                    && !staged.unlinked.load(Ordering::Acquire)
                    && !staged.evicted.load(Ordering::Acquire)
                    && staged.freed() == 0 =>
            {
                match pt.name_for(&info.path, &info.version, info.size) {
                    Some(name) if info.size == staged.size.load(Ordering::Acquire) => {
                        let (pt, from) = (pt.copies.clone(), staged.file_path.clone());
                        let size = info.size;
                        let adopted =
                            tokio::task::spawn_blocking(move || pt.adopt(&name, &from, size, crc))
                                .await
                                .unwrap_or(false);
                        if adopted {
                            self.keep_in_copy(&info);
                        }
                        adopted
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        if !adopted {
            if let Err(e) = std::fs::remove_file(&staged.file_path) {
                tracing::warn!(file = %staged.file_path.display(), error = %e, "staging file not removed");
            }
        }
    }
}

/// A released file leaves the writes' tables: a stream no upload took (its file's last
/// upload failed) is aborted, and its path entry goes. Only its own entry: the path may
/// name another file by now (this one was unlinked, or renamed away, and a new one
/// created there).
fn released_from(writes: &Writes, staged: &Arc<Staged>) {
    if let Some(Stream { ctl, task }) = staged.stream.lock().take() {
        ctl.broken.store(true, Ordering::Release);
        ctl.wake.notify_one();
        drop(task);
    }
    let mut by_path = writes.by_path.lock();
    let path = staged.path();
    if by_path.get(&path).is_some_and(|s| Arc::ptr_eq(s, staged)) {
        by_path.remove(&path);
    }
}
