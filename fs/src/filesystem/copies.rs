//! Passthrough copies: a small object read whole is written once as a plain file the
//! kernel can read in FUSE passthrough mode (module docs of `filesystem.rs`).

use super::*;

/// Copy name per object (path, version) with a passthrough copy.
pub(super) type KeptCopies = HashMap<(Arc<str>, Arc<str>), String>;

/// Objects (path, version) expected to get a passthrough copy, whose blocks therefore
/// skip the disk tier meanwhile: those open (handles counted until released), and those
/// whole-object prefetches brought in ahead of their reader (until their first open,
/// when the handle takes over, or until pushed out by newer ones: a prefetch never
/// read is then in memory only, where a wrong prediction costs no disk write at all).
#[derive(Default)]
pub(super) struct ExpectedCopies {
    pub(super) handles: HashMap<(Arc<str>, Arc<str>), u32>,
    pub(super) prefetched: std::collections::HashSet<(Arc<str>, Arc<str>)>,
    /// `prefetched` in marking order, for the bound.
    pub(super) prefetch_order: std::collections::VecDeque<(Arc<str>, Arc<str>)>,
}

/// Prefetched objects remembered as expecting a copy: 65,536 (two `Arc`s each, a few
/// MiB), far more than any prefetch window keeps ahead of its readers.
pub(super) const MAX_PREFETCHED_EXPECTED: usize = 1 << 16;

impl ExpectedCopies {
    pub(super) fn contains(&self, id: &(Arc<str>, Arc<str>)) -> bool {
        self.handles.contains_key(id) || self.prefetched.contains(id)
    }

    pub(super) fn open(&mut self, id: (Arc<str>, Arc<str>)) {
        self.prefetched.remove(&id);
        *self.handles.entry(id).or_insert(0) += 1;
    }

    pub(super) fn release(&mut self, id: &(Arc<str>, Arc<str>)) {
        if let Some(n) = self.handles.get_mut(id) {
            *n -= 1;
            if *n == 0 {
                self.handles.remove(id);
            }
        }
    }

    pub(super) fn prefetch(&mut self, id: (Arc<str>, Arc<str>)) {
        if self.handles.contains_key(&id) || !self.prefetched.insert(id.clone()) {
            return;
        }
        self.prefetch_order.push_back(id);
        while self.prefetch_order.len() > MAX_PREFETCHED_EXPECTED {
            if let Some(old) = self.prefetch_order.pop_front() {
                self.prefetched.remove(&old);
            }
        }
        // Entries already opened (or unmarked) linger in the order until popped;
        // compact when they dominate so the queue stays bounded by the live set.
        if self.prefetch_order.len() > 2 * self.prefetched.len() + 1024 {
            let live = &self.prefetched;
            self.prefetch_order.retain(|k| live.contains(k));
        }
    }

    pub(super) fn unmark_prefetch(&mut self, id: &(Arc<str>, Arc<str>)) {
        self.prefetched.remove(id);
    }
}

/// Bytes `offset..offset+size` (clamped to `file_size`) of a passthrough copy, read off
/// the runtime's threads.
pub(super) async fn read_copy(
    copy: Arc<std::fs::File>,
    offset: u64,
    size: u32,
    file_size: u64,
) -> Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let len = (size as u64).min(file_size.saturating_sub(offset)) as usize;
    if len == 0 {
        return Ok(Bytes::new());
    }
    let read = tokio::task::spawn_blocking(move || -> std::io::Result<Bytes> {
        let mut buf = vec![0u8; len];
        copy.read_exact_at(&mut buf, offset)?;
        Ok(Bytes::from(buf))
    })
    .await
    .map_err(std::io::Error::other)
    .and_then(|r| r);
    read.map_err(|e| Error::Cache(CacheError::Io(e)))
}

impl FsCore {
    /// The verified passthrough copy of exactly `obj`'s version, if one is kept (the
    /// first open of a copy in this daemon's life reads it to check it, off the
    /// runtime's threads).
    pub(super) async fn passthrough_file(&self, obj: &ObjectInfo) -> Option<std::fs::File> {
        let pt = self.passthrough.as_ref()?;
        let name = pt.name_for(&obj.path, &obj.version, obj.size)?;
        let store = pt.copies.clone();
        if !store.contains(&name) {
            // No copy: answered from the index, without a hop to a blocking thread (the
            // open of every cold file asks).
            return None;
        }
        let size = obj.size;
        tokio::task::spawn_blocking(move || store.get(&name, size))
            .await
            .ok()
            .flatten()
    }

    /// A prefetch of the whole of `obj`, small enough for a passthrough copy: its blocks
    /// land in memory only, since the read that is expected next makes the copy, which
    /// is then the one disk copy (without this, each prefetched small file was written
    /// to the disk tier and deleted from it again once copied; issue 14).
    pub(super) fn mark_prefetched_copy(&self, obj: &ObjectInfo, order: &PrefetchOrder) {
        let whole = order.offset == 0 && order.len >= obj.size;
        let copyable = self
            .passthrough
            .as_ref()
            .is_some_and(|p| p.name_for(&obj.path, &obj.version, obj.size).is_some());
        if whole && copyable {
            self.expected
                .lock()
                .prefetch((obj.path.clone(), obj.version.clone()));
        }
    }

    /// `obj` has a durable passthrough copy: its blocks leave the disk levels and are
    /// not written there again while the copy is kept (one copy per byte on disk).
    pub(super) fn keep_in_copy(&self, obj: &Arc<ObjectInfo>) {
        let Some(pt) = &self.passthrough else {
            return;
        };
        let Some(name) = pt.name_for(&obj.path, &obj.version, obj.size) else {
            return;
        };
        self.kept
            .lock()
            .insert((obj.path.clone(), obj.version.clone()), name);
        // Also at each passthrough open, not only when the copy is made: a background
        // write-through that raced the first drop is removed then.
        let reader = self.reader.clone();
        let obj = obj.clone();
        tokio::spawn(async move {
            for b in 0..reader.block_count(&obj) {
                let key = reader.key(&obj, b);
                if let Err(e) = reader.engine().drop_persistent(&key).await {
                    tracing::debug!(%key, error = %e, "dropping a block kept in a passthrough copy failed");
                }
            }
        });
    }

    /// Writes the reserved copy `name` of `obj` from the cache: one part (a block) at
    /// a time, so a copy holds at most one block in memory (black-box finding: copies
    /// read whole, up to 64 MiB each, got a daemon in a 128 MiB cgroup OOM-killed).
    async fn write_copy(
        &self,
        store: &Arc<crate::passthrough::PassthroughStore>,
        name: &str,
        obj: &Arc<ObjectInfo>,
    ) -> Result<std::io::Result<()>, tokio::task::JoinError> {
        let ctx = AccessContext::prefetch(JobId(0), self.now_ns());
        let part = self.reader.block_size().max(1);
        let read = |off: u64| {
            let len = part.min(obj.size - off);
            self.reader.read(obj, off, len, &ctx)
        };
        let failed = |e: strata_cache_core::CacheError| std::io::Error::other(e.to_string());
        if obj.size <= part {
            let data = match read(0).await {
                Ok(d) => d,
                Err(e) => {
                    store.abort(name);
                    return Ok(Err(failed(e)));
                }
            };
            let (store, name) = (store.clone(), name.to_string());
            return tokio::task::spawn_blocking(move || store.write(&name, &data)).await;
        }
        let (opener, at) = (store.clone(), name.to_string());
        let mut copy = match tokio::task::spawn_blocking(move || opener.start_copy(&at)).await? {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let mut off = 0;
        while off < obj.size {
            let appended = match read(off).await {
                Ok(data) => {
                    off += data.len() as u64;
                    let empty = data.is_empty();
                    let appended = tokio::task::spawn_blocking(move || {
                        let r = copy.append(&data);
                        (copy, r)
                    })
                    .await?;
                    copy = appended.0;
                    match appended.1 {
                        Ok(()) if empty => Err(std::io::Error::other("short read")),
                        r => r,
                    }
                }
                Err(e) => Err(failed(e)),
            };
            if let Err(e) = appended {
                let (store, name) = (store.clone(), name.to_string());
                tokio::task::spawn_blocking(move || store.abort_copy(&name, copy)).await?;
                return Ok(Err(e));
            }
        }
        let (store, name) = (store.clone(), name.to_string());
        tokio::task::spawn_blocking(move || store.finish_copy(&name, copy)).await
    }

    /// After a whole small object was read (or is found whole in the cache at an open),
    /// writes its plain copy once (from the cache, in the background; never blocks the
    /// read).
    pub(super) fn maybe_copy_for_passthrough(self: &Arc<Self>, obj: &Arc<ObjectInfo>) {
        let Some(pt) = &self.passthrough else {
            return;
        };
        let Some(name) = pt.name_for(&obj.path, &obj.version, obj.size) else {
            return;
        };
        let store = pt.copies.clone();
        if !store.begin(&name, obj.size) {
            return;
        }
        tracing::debug!(path = %obj.path, copy = %name, "whole object read; passthrough copy");
        let core = self.clone();
        let obj = obj.clone();
        tokio::spawn(async move {
            let written = core.write_copy(&store, &name, &obj).await;
            match written {
                Ok(Ok(())) => {
                    core.counters
                        .passthrough_copies
                        .fetch_add(1, Ordering::Relaxed);
                    core.keep_in_copy(&obj);
                }
                Ok(Err(e)) => {
                    tracing::debug!(path = %obj.path, error = %e, "passthrough copy failed")
                }
                Err(e) => {
                    tracing::debug!(path = %obj.path, error = %e, "passthrough copy task failed")
                }
            }
        });
    }
}
