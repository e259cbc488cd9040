//! The upload of a file sent while it is written in order (see the parent module's
//! doc): a task reads the staging file behind the writer and queues it part by part.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use strata_cache_core::store::UploadShape;

use super::Staged;
use crate::error::{Error, Result};

/// A multipart upload sent while its file is written in order: a task reads the
/// staging file behind the writer and queues it part by part; a flush asks it to send
/// the rest and complete. A write below what it has read breaks it (the bytes it sent
/// are stale): it aborts, and the flush uploads the file at close as any other.
pub(super) struct Stream {
    pub(super) ctl: Arc<StreamCtl>,
    pub(super) task: tokio::task::JoinHandle<Result<u32>>,
}

#[derive(Default)]
pub(super) struct StreamCtl {
    /// Bytes the task has read (or is reading); a write below breaks the stream.
    pub(super) read_upto: AtomicU64,
    /// Bytes the task has read and holds in memory until their part is stored: the
    /// staging file below may be freed (`Staged::free_sent`).
    pub(super) taken_upto: AtomicU64,
    pub(super) broken: AtomicBool,
    /// A flush wants the upload completed at the file's size.
    pub(super) finish: AtomicBool,
    /// More was written, or one of the flags changed.
    pub(super) wake: tokio::sync::Notify,
    /// The task took another part (`taken_upto` grew) or ended: a writer held back
    /// past the budget may go on (`FsCore::write_wait`).
    pub(super) took: tokio::sync::Notify,
}

/// Reads `len` bytes at `offset` of `file` (off the runtime's threads).
pub(super) async fn read_part(file: Arc<File>, offset: u64, len: usize) -> std::io::Result<Bytes> {
    let buf = tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, offset).map(|()| buf)
    })
    .await
    .map_err(std::io::Error::other)??;
    Ok(Bytes::from(buf))
}

/// The sender of a [`Stream`]: reads `staged` behind its writer and queues it, until a
/// flush asks it to finish (then it sends the rest and completes the upload) or a write
/// below what it read breaks it (then it aborts). Returns the crc32c of what it sent.
pub(super) async fn stream_upload(
    store: strata_cache_core::BackingStore,
    staged: Arc<Staged>,
    ctl: Arc<StreamCtl>,
    shape: UploadShape,
) -> Result<u32> {
    // However the task ends, a writer waiting on it goes on.
    struct EndsWaits(Arc<StreamCtl>);
    impl Drop for EndsWaits {
        fn drop(&mut self) {
            self.0.took.notify_waiters();
        }
    }
    let _ends = EndsWaits(ctl.clone());
    let part_size = shape.part_size.max(1);
    let broken = || Error::Unsupported(format!("{}: rewritten while streamed", staged.path()));
    let mut up = store.start_upload(&staged.path(), &shape).await?;
    let file = Arc::new(staged.file.try_clone().map_err(|source| Error::Local {
        what: format!("reopening {}", staged.path()),
        source,
    })?);
    let (mut sent, mut crc) = (0u64, 0u32);
    loop {
        if ctl.broken.load(Ordering::Acquire) {
            up.abort().await;
            return Err(broken());
        }
        let finishing = ctl.finish.load(Ordering::Acquire);
        if finishing {
            // From here any write breaks the stream: what it completes is the file.
            ctl.read_upto.store(u64::MAX, Ordering::Release);
        }
        let size = staged.size.load(Ordering::Acquire);
        if size > part_size as u64 * strata_cache_core::store::MAX_UPLOAD_PARTS {
            // Too large for this part size: the upload at close picks a larger one.
            up.abort().await;
            return Err(Error::Unsupported(format!(
                "{}: too large to stream in parts of {part_size} bytes",
                staged.path()
            )));
        }
        // Whole parts only until the flush: a part is sent as soon as it is read, so no
        // read bytes wait in the upload for more data while holding upload memory.
        if sent < size && (finishing || size - sent >= part_size as u64) {
            // Room on the wire before the part is read: while the store is slow the
            // bytes wait in the staging file (within the disk budget, the writer held
            // back by it), not in memory.
            up.ready_for_part().await?;
            let len = (size - sent).min(part_size as u64) as usize;
            ctl.read_upto.fetch_max(sent + len as u64, Ordering::AcqRel);
            let buf = read_part(file.clone(), sent, len)
                .await
                .map_err(|source| Error::Local {
                    what: format!("reading {} to stream it", staged.path()),
                    source,
                });
            let buf = match buf {
                Ok(b) => b,
                Err(e) => {
                    up.abort().await;
                    return Err(e);
                }
            };
            crc = crc32c::crc32c_append(crc, &buf);
            ctl.taken_upto
                .fetch_max(sent + len as u64, Ordering::AcqRel);
            ctl.took.notify_waiters();
            up.put(buf).await?;
            sent += len as u64;
            continue;
        }
        if finishing {
            if ctl.broken.load(Ordering::Acquire) {
                up.abort().await;
                return Err(broken());
            }
            if shape.only_if_absent {
                if let Err(e) = store.check_absent(&staged.path()).await {
                    up.abort().await;
                    return Err(e.into());
                }
            }
            up.finish().await?;
            return Ok(crc);
        }
        ctl.wake.notified().await;
    }
}
