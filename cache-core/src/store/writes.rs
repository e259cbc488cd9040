//! Writes: whole-object puts, create-only puts, streaming (multipart) uploads,
//! renames and copies (create-only where the store offers it), deletes, and the
//! uploads a crash left behind.

use super::*;

impl BackingStore {
    /// Aborts the uploads an earlier run left unfinished (see [`UploadJournal`]): a
    /// multipart upload's parts are deleted, a local directory store's temporary file
    /// removed. A record goes once its upload is gone; one the store could not abort
    /// now (down, refusing) stays for the next start. Returns how many were cleaned.
    pub async fn abort_left(&self, left: Vec<LeftUpload>) -> usize {
        let mut cleaned = 0;
        for l in left {
            let r = &l.record;
            if r.starting {
                // No id to abort it by: named, so an operator can (S3's
                // list-multipart-uploads; a lifecycle rule AbortIncompleteMultipartUpload
                // removes such parts by itself).
                tracing::warn!(store = %self.label, key = %r.location,
                    "the daemon died while creating an upload of this key: the store may hold its parts under an id no record names");
                l.forget();
                continue;
            }
            let gone = match (&r.upload_id, &self.part_store, &self.local_root) {
                (Some(id), Some((parts, _)), _) => {
                    let location = object_store::path::Path::from(r.location.as_str());
                    let id = id.clone();
                    let aborted = retry_op(
                        &self.retry,
                        &self.label,
                        Some(&self.counts.failed_attempts),
                        || parts.abort_multipart(&location, &id),
                    )
                    .await;
                    match aborted {
                        Ok(()) | Err(CacheError::NotFound(_)) => true,
                        Err(e) => {
                            tracing::warn!(store = %self.label, key = %r.location, error = %e,
                                "cannot abort an upload an earlier run left: tried again at the next start");
                            false
                        }
                    }
                }
                (None, _, Some(root)) => {
                    let root = root.clone();
                    let key = r.location.clone();
                    tokio::task::spawn_blocking(move || remove_local_temp(&root, &key))
                        .await
                        .unwrap_or(false)
                }
                // A store of another kind than the record's: nothing this handle can do.
                _ => true,
            };
            if gone {
                tracing::info!(store = %self.label, key = %r.location,
                    "aborted an upload an earlier run left unfinished");
                cleaned += 1;
                l.forget();
            }
        }
        cleaned
    }

    /// Writes an object in one PUT (retried).
    pub async fn put(&self, path: &str, data: Bytes) -> Result<()> {
        self.local_write_inside(path).await?;
        let p = object_key(path);
        let recorded = self.record_local(&p);
        let r = self
            .retrying(|| {
                let p = p.clone();
                let payload = PutPayload::from(data.clone());
                async move { self.store.put(&p, payload).await.map(|_| ()) }
            })
            .await;
        if let Some(rec) = recorded {
            rec.done();
        }
        r?;
        self.sync_local(path).await
    }

    /// The (root, file) of object `path` in a local directory store.
    fn local_file_of(&self, path: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
        let root = self.local_root.as_ref()?;
        Some((root.to_path_buf(), root.join(path)))
    }

    /// Makes object `path` of a local directory store durable: its file and the folders
    /// that name it, up to the store's root, synced. An object store's PUT is durable
    /// when it answers; `object_store`'s local files were not, and the cache drops its
    /// copy of a written file once it is uploaded (black-box finding: files closed or
    /// fsync'd through the mount were lost, or back at their old version, after a power
    /// cut of the store's disk). No-op for other stores.
    pub async fn sync_local(&self, path: &str) -> Result<()> {
        match self.local_file_of(path) {
            Some((root, file)) => sync_local_file(root, file).await,
            None => Ok(()),
        }
    }

    /// A local directory store writes a PUT into a temporary `NAME#N` file first: the
    /// write is recorded where this handle has a journal (see [`UploadJournal`]).
    fn record_local(&self, key: &object_store::path::Path) -> Option<journal::Recorded> {
        match (&self.journal, &self.local_root) {
            (Some(j), Some(_)) => Some(j.record(key.as_ref(), None)),
            _ => None,
        }
    }

    /// Writes object `path` of `size` bytes, its bytes read in order by `next_part(offset,
    /// len)`: one PUT (retried) when it fits in `part_size`, else a multipart upload
    /// with up to `in_flight` parts on the wire while the next is read. A multipart
    /// upload that fails is aborted, so a failed upload leaves no object (and a
    /// completed one replaces the old object at once). Each wait on the store is bounded
    /// by the retry policy's whole budget (attempts x attempt timeout): a store that
    /// hangs fails the upload, it does not hang the writer.
    pub async fn upload<F, Fut>(
        &self,
        path: &str,
        size: u64,
        shape: &UploadShape,
        mut next_part: F,
    ) -> Result<()>
    where
        F: FnMut(u64, usize) -> Fut,
        Fut: std::future::Future<Output = std::io::Result<Bytes>>,
    {
        // No more parts than S3 takes: a file over 10,000 parts of `part_size` is sent
        // in larger parts (mountpoint-s3 instead refuses files over 78 GiB).
        let part_size = shape
            .part_size
            .max(1)
            .max(size.div_ceil(MAX_UPLOAD_PARTS) as usize);
        if size <= part_size as u64 {
            let data = next_part(0, size as usize).await?;
            return match shape.only_if_absent {
                true => self.put_new(path, data).await,
                false => self.put(path, data).await,
            };
        }
        let shape = UploadShape {
            part_size,
            ..shape.clone()
        };
        let mut up = self.start_upload(path, &shape).await?;
        let mut offset = 0u64;
        while offset < size {
            let len = (size - offset).min(part_size as u64) as usize;
            // Room on the wire before the part is read: many files closed at once
            // against a slow store wait with their bytes still in their files.
            up.ready_for_part().await?;
            let data = match next_part(offset, len).await {
                Ok(d) => d,
                Err(e) => {
                    up.abort().await;
                    return Err(e.into());
                }
            };
            up.put(data).await?;
            offset += len as u64;
        }
        if shape.only_if_absent {
            if let Err(e) = self.check_absent(path).await {
                up.abort().await;
                return Err(e);
            }
        }
        up.finish().await
    }

    /// Creates object `path` holding `data` only if no object has the name (one PUT
    /// with If-None-Match, retried): [`CacheError::Exists`] if one has. A retry that
    /// finds an object of exactly this size takes it for its own earlier attempt, whose
    /// answer was lost.
    pub async fn put_new(&self, path: &str, data: Bytes) -> Result<()> {
        self.local_write_inside(path).await?;
        let p = object_key(path);
        let recorded = self.record_local(&p);
        let r = self.put_new_recorded(path, &p, data).await;
        if let Some(rec) = recorded {
            rec.done();
        }
        r?;
        if let Err(e) = self.sync_local(path).await {
            // The new object is in place but not durable, and the caller is told the
            // write failed: it is removed, so a failed create leaves no object and the
            // caller's retry is not refused as an overwrite (black-box finding: an EIO
            // of the store's fsync failed the close, the object stayed, and the retry
            // got EPERM). It was new, so nothing older is lost with it.
            if let Some((_, file)) = self.local_file_of(path) {
                remove_unsynced(&file).await;
            }
            return Err(e);
        }
        Ok(())
    }

    async fn put_new_recorded(
        &self,
        path: &str,
        p: &object_store::path::Path,
        data: Bytes,
    ) -> Result<()> {
        let mut attempt = 0u32;
        let r = self
            .retrying(|| {
                attempt += 1;
                let p = p.clone();
                let payload = PutPayload::from(data.clone());
                let opts = object_store::PutOptions::from(object_store::PutMode::Create);
                async move { self.store.put_opts(&p, payload, opts).await.map(|_| ()) }
            })
            .await;
        match r {
            Err(CacheError::Exists(_)) if attempt > 1 => match self.head(path).await {
                Ok(obj) if obj.size == data.len() as u64 => Ok(()),
                _ => Err(CacheError::Exists(path.to_string())),
            },
            r => r,
        }
    }

    /// Ok if no object is named `path`; [`CacheError::Exists`] if one is.
    pub async fn check_absent(&self, path: &str) -> Result<()> {
        match self.head(path).await {
            Ok(_) => Err(CacheError::Exists(path.to_string())),
            Err(CacheError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Starts a multipart upload of `path` whose size is not known yet (a file sent
    /// while it is written): see [`StreamingUpload`].
    pub async fn start_upload(&self, path: &str, shape: &UploadShape) -> Result<StreamingUpload> {
        let started = self.start_upload_uncounted(path, shape).await;
        self.counts.note(&started);
        started.map(|up| up.counting_failures(self.counts.clone()))
    }

    async fn start_upload_uncounted(
        &self,
        path: &str,
        shape: &UploadShape,
    ) -> Result<StreamingUpload> {
        let (part_size, in_flight) = (shape.part_size, shape.in_flight);
        if let Some((parts, prefix)) = &self.part_store {
            let location = if prefix.is_empty() {
                object_key(path)
            } else {
                object_key(&format!("{prefix}/{path}"))
            };
            return StreamingUpload::by_parts(
                parts.clone(),
                location,
                path,
                shape,
                self.retry.clone(),
                &self.label,
                self.journal.clone(),
                Some((self.store.clone(), object_key(path))),
                self.counts.clone(),
            )
            .await;
        }
        self.local_write_inside(path).await?;
        let budget = self.retry.attempt_timeout * self.retry.attempts.max(1);
        let p = object_key(path);
        let recorded = self.record_local(&p);
        let upload = tokio::time::timeout(budget, self.store.put_multipart(&p))
            .await
            .map_err(|_| upload::bounded_wait(path, "starting the upload", budget))?
            .map_err(|e| map_store_error(e, 1))?;
        Ok(StreamingUpload::whole(
            object_store::WriteMultipart::new_with_chunk_size(upload, part_size.max(1)),
            path,
            in_flight,
            budget,
            recorded,
            self.local_file_of(path),
            shape.only_if_absent,
        ))
    }

    /// Moves object `from` to `to` (retried; the store's own rename where it has one,
    /// else a server-side copy, then a delete of `from`).
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_with(from, to, false).await
    }

    /// [`Self::rename`]; `to_was_absent`: no object had the name `to` before, so a copy
    /// whose source may not be deleted is undone (see [`Self::undo_refused_move`]).
    async fn rename_with(&self, from: &str, to: &str, to_was_absent: bool) -> Result<()> {
        self.local_write_inside(from).await?;
        self.local_not_through_link(from).await?;
        self.local_write_inside(to).await?;
        let (f, t) = (object_key(from), object_key(to));
        if self.local_root.is_some() {
            // A local directory's own rename(2): atomic.
            self.retrying(|| {
                let (f, t) = (f.clone(), t.clone());
                async move { self.store.rename(&f, &t).await }
            })
            .await?;
        } else {
            // A copy, then a delete, each retried on its own (object_store's rename is
            // both in one call: black-box finding, a lost answer to the delete had the
            // retry copy again from the source just deleted, and a rename that had
            // completed failed ENOENT).
            self.retrying(|| {
                let (f, t) = (f.clone(), t.clone());
                async move { self.store.copy(&f, &t).await }
            })
            .await?;
            if let Err(e) = self.delete_moved(from).await {
                return Err(match to_was_absent {
                    true => self.undo_refused_move(to, e).await,
                    false => e,
                });
            }
        }
        self.renamed(from, to).await
    }

    /// A move's copy landed at `to`, a new name, and the store refused to delete its
    /// source (a policy denying `s3:DeleteObject` there): the copy is deleted again, so
    /// the failed rename leaves the store as it was (black-box finding: `mv` failed EIO
    /// and the copy stayed under the new name). Other failures leave the copy: whether
    /// the delete landed is not known. Returns `e`.
    async fn undo_refused_move(&self, to: &str, e: CacheError) -> CacheError {
        if matches!(e, CacheError::PermissionDenied(_)) {
            match self.delete(to).await {
                Ok(()) => {
                    tracing::warn!(to, error = %e, "the store refused to delete a moved object's source: its copy deleted again, the rename undone")
                }
                Err(undo) => {
                    tracing::error!(to, error = %e, undo_error = %undo, "the store refused to delete a moved object's source, and its copy could not be deleted: both names hold it")
                }
            }
        }
        e
    }

    /// Deletes the source of a move whose copy landed; already gone (a retried delete
    /// whose first answer was lost) is done.
    async fn delete_moved(&self, from: &str) -> Result<()> {
        match self.delete(from).await {
            Ok(()) | Err(CacheError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// [`Self::rename`] of an object of `size` bytes only if no object is named `to`:
    /// [`CacheError::Exists`] if one is, when the rename starts or when it lands. The
    /// store's create-only copy does it (a hard link in a local directory, a multipart
    /// copy completed with If-None-Match on S3, the native condition on GCS and Azure),
    /// then a delete of `from`. A mount that may not replace objects, and a rename
    /// with `RENAME_NOREPLACE`, must not replace an object another writer made since
    /// the mount last looked (black-box finding: `mv` on a create-only mount replaced
    /// one created by another writer within the metadata TTL). A store that cannot
    /// copy on that condition, or an object past S3's 5 GiB copy part, gets the HEAD
    /// just before and a plain rename (a window of one request, not of the TTL).
    pub async fn rename_new(&self, from: &str, to: &str, size: u64) -> Result<()> {
        self.local_write_inside(from).await?;
        self.local_not_through_link(from).await?;
        self.local_write_inside(to).await?;
        // A local directory renames create-only in one step (a hard link, then the
        // unlink); elsewhere the create-only copy and the delete are retried each on
        // its own (see `rename`).
        let local = self.local_root.is_some();
        match self.create_only(from, to, size, local).await? {
            CreateOnly::Done if local => {}
            CreateOnly::Done | CreateOnly::Ours => {
                if let Err(e) = self.delete_moved(from).await {
                    return Err(self.undo_refused_move(to, e).await);
                }
            }
            CreateOnly::Unsupported => {
                self.check_absent(to).await?;
                return self.rename_with(from, to, true).await;
            }
        }
        self.renamed(from, to).await
    }

    /// The store's create-only rename (`rename`) or copy of `from` (`size` bytes) to
    /// `to`, retried; see [`Self::rename_new`].
    async fn create_only(
        &self,
        from: &str,
        to: &str,
        size: u64,
        rename: bool,
    ) -> Result<CreateOnly> {
        if size > COPY_PART_MAX {
            return Ok(CreateOnly::Unsupported);
        }
        // S3's create-only copy is a multipart copy, whose new object has none of the
        // source's headers or metadata (black-box finding: `mv` turned a gzip-encoded
        // JSON object with user metadata and tags into a bare binary/octet-stream one).
        // An object that carries some is renamed by a plain copy, which keeps them,
        // after the HEAD of `to` (a window of one request, as past 5 GiB).
        if self.create_only_copy_drops_metadata && self.carries_metadata(from).await? {
            return Ok(CreateOnly::Unsupported);
        }
        let (f, t) = (object_key(from), object_key(to));
        let mut attempt = 0u32;
        let r = self
            .retrying(|| {
                attempt += 1;
                let (f, t) = (f.clone(), t.clone());
                async move {
                    conditional(match rename {
                        true => self.store.rename_if_not_exists(&f, &t).await,
                        false => self.store.copy_if_not_exists(&f, &t).await,
                    })
                }
            })
            .await;
        match r {
            Ok(true) => Ok(CreateOnly::Done),
            Ok(false) => Ok(CreateOnly::Unsupported),
            // An earlier attempt's answer was lost: its copy is there.
            Err(CacheError::Exists(_)) if attempt > 1 && self.holds(to, size).await => {
                Ok(CreateOnly::Ours)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether object `path` carries headers or user metadata a store sets only when
    /// asked (anything but S3's default content type), read with a HEAD.
    async fn carries_metadata(&self, path: &str) -> Result<bool> {
        let p = object_key(path);
        let attributes = self
            .retrying(|| {
                let p = p.clone();
                self.count_head();
                async move {
                    let head = object_store::GetOptions {
                        head: true,
                        ..Default::default()
                    };
                    self.store.get_opts(&p, head).await.map(|r| r.attributes)
                }
            })
            .await?;
        Ok(attributes.iter().any(|(attribute, value)| {
            !(*attribute == object_store::Attribute::ContentType
                && matches!(
                    value.as_ref(),
                    "binary/octet-stream" | "application/octet-stream"
                ))
        }))
    }

    /// Whether object `path` is there at `size` bytes.
    async fn holds(&self, path: &str, size: u64) -> bool {
        self.head(path).await.is_ok_and(|o| o.size == size)
    }

    /// After `from` moved to `to`: a local store's emptied folders go, and both names'
    /// folders are synced.
    async fn renamed(&self, from: &str, to: &str) -> Result<()> {
        self.remove_emptied_dirs(from).await;
        self.sync_local(to).await?;
        // The old name's folder too, so the old name does not come back.
        match (
            self.local_root.as_ref(),
            std::path::Path::new(from).parent(),
        ) {
            (Some(root), Some(dir)) => sync_local_dirs(root.to_path_buf(), root.join(dir)).await,
            _ => Ok(()),
        }
    }

    /// After `path` left a local directory store by a rename: the folders it leaves
    /// empty go, as a delete's do (black-box finding: `mv d0/e/f x; mv d0 d3; mkdir d0`
    /// showed the old, emptied `d0/e` in the new `d0`). Stops at the first folder that
    /// still holds something.
    async fn remove_emptied_dirs(&self, path: &str) {
        let Some(root) = &self.local_root else {
            return;
        };
        let mut at = std::path::Path::new(path).parent();
        while let Some(dir) = at.filter(|d| !d.as_os_str().is_empty()) {
            if tokio::fs::remove_dir(root.join(dir)).await.is_err() {
                return;
            }
            at = dir.parent();
        }
    }

    /// [`Self::copy`] of an object of `size` bytes only if no object is named `to`
    /// ([`CacheError::Exists`] if one is; see [`Self::rename_new`] for how, and for the
    /// stores that cannot).
    pub async fn copy_new(&self, from: &str, to: &str, size: u64) -> Result<()> {
        self.local_write_inside(from).await?;
        self.local_write_inside(to).await?;
        match self.create_only(from, to, size, false).await? {
            CreateOnly::Done | CreateOnly::Ours => self.sync_local(to).await,
            CreateOnly::Unsupported => {
                self.check_absent(to).await?;
                self.copy(from, to).await
            }
        }
    }

    /// Copies object `from` to `to`, replacing `to` (retried; a server-side copy).
    pub async fn copy(&self, from: &str, to: &str) -> Result<()> {
        // The source too: a copy out of a linked folder would bring an outside file in.
        self.local_write_inside(from).await?;
        self.local_write_inside(to).await?;
        let (f, t) = (object_key(from), object_key(to));
        self.retrying(|| {
            let (f, t) = (f.clone(), t.clone());
            async move { self.store.copy(&f, &t).await }
        })
        .await?;
        self.sync_local(to).await
    }

    /// Deletes `obj`'s name unless the store holds another version under it now
    /// (another client overwrote it since `obj` was listed): Ok(false) then, nothing
    /// deleted; Ok(true) once deleted or already gone. One HEAD before the delete, so
    /// the window in which another client's write is lost is that round trip, not the
    /// caller's whole operation (black-box finding: a folder rename's deletes, made
    /// after all its copies, removed overwrites another client made meanwhile).
    /// Versions are compared by ETag where both name one, else by size and modification
    /// time (a local file's to the nanosecond, not its ctime, which a rename's hard-link
    /// copy changes; a listing without ETags says milliseconds, a HEAD seconds).
    pub async fn delete_if_unchanged(&self, obj: &ObjectInfo) -> Result<bool> {
        let local = self.local_root.is_some();
        let same = |now: &ObjectInfo| match now.has_etag && obj.has_etag {
            true => bare_etag(etag_of(&now.version)) == bare_etag(etag_of(&obj.version)),
            false if local => {
                now.size == obj.size && now.last_modified_unix_ns == obj.last_modified_unix_ns
            }
            false => {
                let secs = |o: &ObjectInfo| o.last_modified_unix_ns.div_euclid(1_000_000_000);
                now.size == obj.size && secs(now) == secs(obj)
            }
        };
        match self.head(&obj.path).await {
            Ok(now) if !same(&now) => return Ok(false),
            Ok(_) => {}
            Err(CacheError::NotFound(_)) => return Ok(true),
            Err(e) => return Err(e),
        }
        self.delete(&obj.path).await.map(|()| true)
    }

    pub async fn delete(&self, path: &str) -> Result<()> {
        self.local_write_inside(path).await?;
        self.local_not_through_link(path).await?;
        let p = object_key(path);
        let deleting = self.retrying(|| {
            let p = p.clone();
            async move { self.store.delete(&p).await }
        });
        // object_store panics on some answers to a delete (a DeleteObjects result naming
        // the key in another spelling): an error of this delete, not a lost request
        // (black-box finding: the FUSE reply was never sent, "Reply not sent").
        match std::panic::AssertUnwindSafe(deleting).catch_unwind().await {
            Ok(r) => r,
            Err(_) => Err(CacheError::Store {
                attempts: 1,
                message: format!(
                    "{}: the store's answer to the delete of {path} could not be read",
                    self.label
                ),
            }),
        }
    }
}

/// S3's largest part made by a copy (UploadPartCopy), which a create-only copy on S3
/// is made of: 5 GiB.
pub(super) const COPY_PART_MAX: u64 = 5 << 30;

/// How a create-only copy or rename went (see `BackingStore::create_only`).
pub(super) enum CreateOnly {
    Done,
    /// The store cannot make one (or not of this size).
    Unsupported,
    /// An earlier attempt made it; its answer was lost (the rename's source may remain).
    Ours,
}

/// A create-only copy or rename's result: Ok(false) where the store cannot make one.
pub(super) fn conditional(r: object_store::Result<()>) -> object_store::Result<bool> {
    match r {
        Ok(()) => Ok(true),
        Err(
            object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. },
        ) => Ok(false),
        Err(e) => Err(e),
    }
}
