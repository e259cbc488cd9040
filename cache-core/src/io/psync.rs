//! The psync engine: `pread`/`pwrite`/`fdatasync` on tokio's blocking thread pool.
//!
//! Every request costs a hop to a pool thread and back (a few microseconds), and
//! concurrency is bounded by the pool (512 threads by default), but it needs nothing
//! from the kernel beyond POSIX, so it is the fallback everywhere io_uring is not.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use async_trait::async_trait;

use super::{iovecs, parts_len, AlignedBuf, IoEngine, WritePart};

#[derive(Debug, Default)]
pub struct PsyncEngine;

impl PsyncEngine {
    pub fn new() -> Self {
        PsyncEngine
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("blocking I/O task failed: {e}")))?
}

#[async_trait]
impl IoEngine for PsyncEngine {
    fn name(&self) -> &'static str {
        "psync"
    }

    async fn read_at(
        &self,
        file: Arc<File>,
        offset: u64,
        mut buf: AlignedBuf,
    ) -> io::Result<AlignedBuf> {
        let len = buf.len();
        blocking(move || {
            let mut filled = 0usize;
            while filled < len {
                let window = buf.window_mut(filled);
                let want = (len - filled).min(window.len());
                // O_DIRECT needs an aligned length: ask for whole aligned units and
                // keep only what was asked for.
                let ask = super::align_up(want).min(window.len());
                match file.read_at(&mut window[..ask], offset + filled as u64) {
                    Ok(0) => break,
                    Ok(n) => {
                        filled += n.min(len - filled);
                        if !super::is_aligned(n) {
                            break; // short, unaligned: end of file
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            buf.set_len(filled);
            Ok(buf)
        })
        .await
    }

    async fn write_at(&self, file: Arc<File>, offset: u64, mut buf: AlignedBuf) -> io::Result<()> {
        blocking(move || file.write_all_at(buf.full_mut(), offset)).await
    }

    async fn write_parts_at(
        &self,
        file: Arc<File>,
        offset: u64,
        parts: Vec<WritePart>,
    ) -> io::Result<()> {
        blocking(move || pwritev_all(&file, offset, &parts)).await
    }

    async fn sync_data(&self, file: Arc<File>) -> io::Result<()> {
        blocking(move || file.sync_data()).await
    }
}

/// `pwritev` until every byte of `parts` is written (resuming after a short write).
fn pwritev_all(file: &File, offset: u64, parts: &[WritePart]) -> io::Result<()> {
    let total = parts_len(parts);
    let mut done = 0usize;
    while done < total {
        let iov = iovecs(parts, done);
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::other("write offset out of range"))?;
        // SAFETY: each iovec points into a part of `parts`, borrowed (so alive and
        // unmoved) for the whole call; pwritev only reads through them.
        let n = unsafe { libc::pwritev(file.as_raw_fd(), iov.as_ptr(), iov.len() as i32, at) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += n as usize;
    }
    Ok(())
}
