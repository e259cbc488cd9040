//! I/O engines for the disk tier: one trait, two implementations.
//!
//! The trait takes and returns **owned** buffers (the foyer / tokio-uring style): a
//! completion-based engine such as io_uring hands the buffer's address to the kernel,
//! which may write into it after the submitting future was dropped, so the engine,
//! not the caller, must own the memory until the kernel is done with it. Borrowed
//! `&mut [u8]` cannot give that guarantee; owned [`AlignedBuf`]s can.
//!
//! - [`uring::UringEngine`]: one dedicated thread owns an `io_uring` ring; requests
//!   arrive through a channel, completions go back through oneshot channels. Chosen by
//!   default because it keeps many reads in flight with no thread per request.
//! - [`psync::PsyncEngine`]: `pread`/`pwrite`/`fdatasync` on tokio's blocking pool.
//!   The fallback where io_uring is unavailable (old kernel: `ENOSYS`; seccomp or
//!   `kernel.io_uring_disabled`: `EPERM`).
//!
//! [`open_engine`] with [`IoEngineKind::Auto`] tries io_uring (ring set-up plus one
//! no-op round trip, so a ring that can be created but not used is also caught) and
//! falls back to psync; [`IoEngine::name`] reports which one runs. Tests force either.
//!
//! Buffers are 4096-aligned and sized in multiples of 4096 so that the same buffer
//! works with `O_DIRECT` files (which need the address, length and offset aligned to
//! the logical block size; 4096 covers every common device) and with buffered files.

pub mod psync;
pub mod uring;

use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

/// Alignment of buffers, offsets and lengths for `O_DIRECT`: 4096 is the logical block
/// size of 4Kn NVMe drives and a multiple of the 512-byte size of the others.
pub const ALIGN: usize = 4096;

/// Rounds `n` up to a multiple of [`ALIGN`].
pub const fn align_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Whether `n` is a multiple of [`ALIGN`] (a power of two).
pub const fn is_aligned(n: usize) -> bool {
    n & (ALIGN - 1) == 0
}

/// A heap buffer whose start is 4096-aligned and whose capacity is a multiple of 4096.
///
/// Built on a plain `Vec<u8>` over-allocated by one alignment unit, so no unsafe code
/// is needed: the aligned window is found by address arithmetic. `len` is the number
/// of meaningful bytes (after a read: the bytes the kernel filled). A buffer taken from
/// a [`BufPool`] goes back to it when dropped (also when dropped as the owner of a
/// `Bytes` made by [`AlignedBuf::into_bytes`]).
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    capacity: usize,
    len: usize,
    pool: Option<Arc<BufPool>>,
}

impl AlignedBuf {
    /// A zero-filled buffer of `len` meaningful bytes, capacity rounded up to 4096.
    pub fn zeroed(len: usize) -> Self {
        let capacity = align_up(len.max(1));
        Self::from_storage(vec![0u8; capacity + ALIGN], capacity, len, None)
    }

    fn from_storage(
        storage: Vec<u8>,
        capacity: usize,
        len: usize,
        pool: Option<Arc<BufPool>>,
    ) -> Self {
        let addr = storage.as_ptr() as usize;
        let start = (ALIGN - addr % ALIGN) % ALIGN;
        AlignedBuf {
            storage,
            start,
            capacity,
            len,
            pool,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Capacity: `len` rounded up to 4096 (what an `O_DIRECT` transfer moves).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets the meaningful length (at most the capacity).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity);
    }

    /// The whole aligned capacity, for filling before a write.
    pub fn full_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.capacity]
    }

    /// The aligned capacity from `pos` on (what a read or write transfers).
    pub(crate) fn window_mut(&mut self, pos: usize) -> &mut [u8] {
        let pos = pos.min(self.capacity);
        &mut self.storage[self.start + pos..self.start + self.capacity]
    }

    /// Bytes `range` of the aligned capacity, read through a raw pointer so that no
    /// reference to the rest of the buffer is made: the io_uring thread checksums the
    /// parts of a read that have arrived while the kernel still writes into others.
    /// None when `range` is not inside the capacity.
    pub(crate) fn capacity_range(&self, range: Range<usize>) -> Option<&[u8]> {
        if range.start > range.end || range.end > self.capacity {
            return None;
        }
        // SAFETY: `start + capacity <= storage.len()` (see `from_storage`), so the range
        // is inside the allocation; `as_ptr` makes no reference to the contents, and
        // the slice covers only `range`, which the caller guarantees nothing writes
        // while the slice lives (the kernel's transfer into it has completed).
        Some(unsafe {
            std::slice::from_raw_parts(
                self.storage.as_ptr().add(self.start + range.start),
                range.end - range.start,
            )
        })
    }

    /// Freezes into `Bytes` without copying; `slice` it to the payload.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give(std::mem::take(&mut self.storage));
        }
    }
}

/// Recycles I/O buffers so that neither a hit nor a write zero-fills a fresh buffer or
/// makes the kernel fault in fresh pages for it (for a 1 MiB read that is ~40% of the
/// time of the read itself on a fast device; on a cold read through the mount the
/// faults of the disk tier's fresh write buffers were ~15% of the daemon's CPU).
/// Buffers are kept by exact storage size, up to `max_bytes` in all. A recycled buffer
/// holds stale bytes: [`BufPool::take`] is for reads (readers only ever see the bytes
/// the kernel just filled), [`BufPool::take_for_write`] zeroes what its caller does not
/// overwrite, so no stale byte reaches a disk.
#[derive(Debug)]
pub struct BufPool {
    max_bytes: usize,
    free: parking_lot::Mutex<PoolFree>,
}

#[derive(Debug, Default)]
struct PoolFree {
    bytes: usize,
    by_size: std::collections::HashMap<usize, Vec<Vec<u8>>>,
}

impl BufPool {
    pub fn new(max_bytes: usize) -> Arc<Self> {
        Arc::new(BufPool {
            max_bytes,
            free: parking_lot::Mutex::new(PoolFree::default()),
        })
    }

    /// A buffer of `len` meaningful bytes; its content is unspecified until filled.
    pub fn take(self: &Arc<Self>, len: usize) -> AlignedBuf {
        let capacity = align_up(len.max(1));
        let size = capacity + ALIGN;
        let reused = {
            let mut free = self.free.lock();
            let v = free.by_size.get_mut(&size).and_then(Vec::pop);
            if v.is_some() {
                free.bytes -= size;
            }
            v
        };
        let storage = reused.unwrap_or_else(|| vec![0u8; size]);
        AlignedBuf::from_storage(storage, capacity, len, Some(self.clone()))
    }

    /// A buffer for a write of `len` bytes: the caller overwrites bytes `0..len`, and
    /// the padding from `len` to the aligned capacity (which an `O_DIRECT` write sends
    /// too) is zeroed here, so a recycled buffer's stale bytes never reach a disk.
    pub fn take_for_write(self: &Arc<Self>, len: usize) -> AlignedBuf {
        let mut buf = self.take(len);
        buf.full_mut()[len..].fill(0);
        buf
    }

    /// Bytes held for reuse now.
    pub fn held_bytes(&self) -> usize {
        self.free.lock().bytes
    }

    fn give(&self, storage: Vec<u8>) {
        let size = storage.len();
        let mut free = self.free.lock();
        if free.bytes + size <= self.max_bytes {
            free.bytes += size;
            free.by_size.entry(size).or_default().push(storage);
        }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_ref()
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("pooled", &self.pool.is_some())
            .finish()
    }
}

/// Positional file I/O on owned buffers.
#[async_trait]
pub trait IoEngine: Send + Sync + fmt::Debug + 'static {
    /// `io_uring` or `psync`.
    fn name(&self) -> &'static str;

    /// Reads up to `buf.len()` bytes at `offset` (a multiple of [`ALIGN`] for
    /// `O_DIRECT` files) into `buf` and hands it back with `len()` set to the number of
    /// bytes read: fewer than asked only at end of file (the read stops at the first
    /// short transfer that leaves the position unaligned, which for `O_DIRECT` can
    /// only be end of file).
    async fn read_at(
        &self,
        file: Arc<File>,
        offset: u64,
        buf: AlignedBuf,
    ) -> io::Result<AlignedBuf>;

    /// [`Self::read_at`], also returning the crc32c of `buf[crc]` once read (None when
    /// the read came back shorter than `crc.end`). An engine may checksum the parts of
    /// the buffer that have arrived while the rest is still in flight (io_uring does:
    /// see [`uring`]), so a verified read costs about the longer of the transfer and
    /// the checksum instead of their sum; this default reads, then checksums.
    async fn read_at_crc(
        &self,
        file: Arc<File>,
        offset: u64,
        buf: AlignedBuf,
        crc: Range<usize>,
    ) -> io::Result<(AlignedBuf, Option<u32>)> {
        let buf = self.read_at(file, offset, buf).await?;
        let sum = buf.get(crc).map(crate::checksum::crc32c);
        Ok((buf, sum))
    }

    /// Writes the buffer's whole capacity (its `len` rounded up to 4096) at `offset`.
    async fn write_at(&self, file: Arc<File>, offset: u64, buf: AlignedBuf) -> io::Result<()>;

    /// `fdatasync`: the written data and the metadata needed to read it are durable.
    async fn sync_data(&self, file: Arc<File>) -> io::Result<()>;
}

/// Which engine to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoEngineKind {
    /// io_uring if the kernel lets this process use it, else psync.
    #[default]
    Auto,
    IoUring,
    Psync,
}

impl std::str::FromStr for IoEngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IoEngineKind::Auto),
            "io_uring" | "uring" => Ok(IoEngineKind::IoUring),
            "psync" => Ok(IoEngineKind::Psync),
            other => Err(format!(
                "unknown I/O engine {other:?} (auto, io_uring, psync)"
            )),
        }
    }
}

/// Opens an engine. `IoUring` fails if the ring cannot be set up; `Auto` falls back to
/// psync in that case (logged at `warn`).
pub fn open_engine(kind: IoEngineKind) -> io::Result<Arc<dyn IoEngine>> {
    match kind {
        IoEngineKind::Psync => Ok(Arc::new(psync::PsyncEngine::new())),
        IoEngineKind::IoUring => Ok(Arc::new(uring::UringEngine::new()?)),
        IoEngineKind::Auto => match uring::UringEngine::new() {
            Ok(e) => Ok(Arc::new(e)),
            Err(err) => {
                tracing::warn!(%err, "io_uring unavailable, using the psync engine");
                Ok(Arc::new(psync::PsyncEngine::new()))
            }
        },
    }
}

/// A new, empty read-write file in a new temporary directory, which lasts as long as
/// the returned guard: the engines' tests' scratch file.
#[cfg(test)]
pub(crate) fn temp_file() -> (tempfile::TempDir, Arc<File>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(dir.path().join("f"))
        .expect("open");
    (dir, Arc::new(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_is_aligned_and_rounded() {
        for len in [0usize, 1, 4095, 4096, 4097, 1 << 20] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(is_aligned(b.capacity()));
            assert!(b.capacity() >= len);
            assert!(is_aligned(b.full_mut().as_ptr() as usize));
            assert_eq!(b.full_mut().len(), b.capacity());
        }
    }

    #[test]
    fn pool_recycles_by_size_and_respects_its_bound() {
        let pool = BufPool::new(3 * (ALIGN + 2 * ALIGN));
        let a = pool.take(5000);
        assert_eq!((a.len(), a.capacity()), (5000, 2 * ALIGN));
        let addr = a.storage.as_ptr();
        drop(a);
        assert_eq!(pool.held_bytes(), 3 * ALIGN);
        let b = pool.take(8192);
        assert_eq!(b.storage.as_ptr(), addr, "same size class is reused");
        assert_eq!(pool.held_bytes(), 0);
        // Dropped through Bytes, it also comes back.
        let bytes = b.into_bytes();
        drop(bytes.slice(10..20));
        drop(bytes);
        assert_eq!(pool.held_bytes(), 3 * ALIGN);
        // Never more than max_bytes held.
        let bufs: Vec<AlignedBuf> = (0..5).map(|_| pool.take(ALIGN * 2)).collect();
        drop(bufs);
        assert_eq!(pool.held_bytes(), 9 * ALIGN);
    }

    #[test]
    fn a_write_buffer_from_the_pool_carries_no_stale_padding() {
        let pool = BufPool::new(1 << 20);
        let mut stale = pool.take(2 * ALIGN);
        stale.full_mut().fill(0xAB);
        drop(stale);
        let mut w = pool.take_for_write(ALIGN + 10);
        assert_eq!(w.capacity(), 2 * ALIGN, "the stale buffer's size class");
        assert_eq!(pool.held_bytes(), 0, "it was reused");
        let full = w.full_mut();
        assert!(full[ALIGN + 10..].iter().all(|&b| b == 0), "padding zeroed");
        // The caller's part is left as it is: the caller overwrites it.
        assert!(full[..ALIGN + 10].iter().all(|&b| b == 0xAB));
    }

    async fn engine_round_trip(engine: Arc<dyn IoEngine>) {
        let (_dir, file) = temp_file();
        let mut buf = AlignedBuf::zeroed(3 * ALIGN);
        for (i, b) in buf.full_mut().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let expect = buf.to_vec();
        engine
            .write_at(file.clone(), ALIGN as u64, buf)
            .await
            .expect("write");
        engine.sync_data(file.clone()).await.expect("sync");
        assert_eq!(file.metadata().expect("stat").len(), 4 * ALIGN as u64);
        let got = engine
            .read_at(file.clone(), ALIGN as u64, AlignedBuf::zeroed(3 * ALIGN))
            .await
            .expect("read");
        assert_eq!(&got[..], &expect[..]);
        // Reading past the end returns only what is there.
        let tail = engine
            .read_at(
                file.clone(),
                3 * ALIGN as u64,
                AlignedBuf::zeroed(4 * ALIGN),
            )
            .await
            .expect("read tail");
        assert_eq!(&tail[..], &expect[2 * ALIGN..]);
        let none = engine
            .read_at(file, 8 * ALIGN as u64, AlignedBuf::zeroed(ALIGN))
            .await
            .expect("read past end");
        assert!(none.is_empty());
    }

    #[tokio::test]
    async fn psync_round_trip() {
        engine_round_trip(open_engine(IoEngineKind::Psync).expect("psync")).await;
    }

    #[tokio::test]
    async fn uring_round_trip() {
        let engine = open_engine(IoEngineKind::IoUring).expect("io_uring works on this machine");
        assert_eq!(engine.name(), "io_uring");
        engine_round_trip(engine).await;
    }

    /// `read_at_crc` returns the same bytes as `read_at` and the crc32c of exactly the
    /// asked range, for ranges inside one part, across parts, starting in a later part,
    /// empty, and running past the end of the file (None), for values of one part, of
    /// many, and of more parts than a read may take (larger parts then).
    async fn read_crc_matches(engine: Arc<dyn IoEngine>) {
        let (_dir, file) = temp_file();
        let file_len = 5 * (1 << 20) + 3 * ALIGN;
        let mut buf = AlignedBuf::zeroed(file_len);
        for (i, b) in buf.full_mut().iter_mut().enumerate() {
            *b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
        }
        let expect = buf.to_vec();
        engine.write_at(file.clone(), 0, buf).await.expect("write");
        let cases: Vec<(usize, usize, std::ops::Range<usize>)> = vec![
            // (offset, buffer length, crc range)
            (0, ALIGN + 1000, ALIGN..ALIGN + 1000),
            (0, (1 << 20) + ALIGN, ALIGN..(1 << 20) + ALIGN),
            (0, (1 << 20) + ALIGN, 0..(1 << 20) + ALIGN),
            (ALIGN, 1 << 20, (300 << 10)..(700 << 10)),
            (0, 1 << 20, 5..5),
            (0, file_len, ALIGN..file_len),
            (2 * ALIGN, 4 << 20, 0..4 << 20),
        ];
        for (off, len, range) in cases {
            let (got, crc) = engine
                .read_at_crc(
                    file.clone(),
                    off as u64,
                    AlignedBuf::zeroed(len),
                    range.clone(),
                )
                .await
                .expect("read");
            assert_eq!(&got[..], &expect[off..off + len], "bytes at {off}+{len}");
            let want = crc32c::crc32c(&expect[off + range.start..off + range.end]);
            assert_eq!(crc, Some(want), "crc of {range:?} at {off}+{len}");
        }
        // Past the end: the bytes that are there, no checksum of the range.
        let off = file_len - ALIGN;
        let (got, crc) = engine
            .read_at_crc(
                file.clone(),
                off as u64,
                AlignedBuf::zeroed(4 * ALIGN),
                0..4 * ALIGN,
            )
            .await
            .expect("read tail");
        assert_eq!(&got[..], &expect[off..]);
        assert_eq!(crc, None);
        // A range inside what is there still gets its checksum.
        let (_, crc) = engine
            .read_at_crc(file, off as u64, AlignedBuf::zeroed(4 * ALIGN), 0..100)
            .await
            .expect("read tail");
        assert_eq!(crc, Some(crc32c::crc32c(&expect[off..off + 100])));
    }

    #[tokio::test]
    async fn psync_read_crc_matches() {
        read_crc_matches(open_engine(IoEngineKind::Psync).expect("psync")).await;
    }

    #[tokio::test]
    async fn uring_read_crc_matches() {
        read_crc_matches(open_engine(IoEngineKind::IoUring).expect("io_uring")).await;
    }

    #[tokio::test]
    async fn uring_many_checksummed_reads_in_flight() {
        // More parts in flight than the ring has entries: the in-flight bound counts
        // entries, so nothing overflows and every read completes.
        let engine = open_engine(IoEngineKind::IoUring).expect("io_uring");
        let (_dir, file) = temp_file();
        let len = 1 << 20;
        let mut buf = AlignedBuf::zeroed(len);
        buf.full_mut()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 253) as u8);
        let want = crc32c::crc32c(&buf[..]);
        engine.write_at(file.clone(), 0, buf).await.expect("write");
        let mut tasks = Vec::new();
        for _ in 0..100 {
            let (engine, file) = (engine.clone(), file.clone());
            tasks.push(tokio::spawn(async move {
                engine
                    .read_at_crc(file, 0, AlignedBuf::zeroed(len), 0..len)
                    .await
                    .expect("read")
                    .1
            }));
        }
        for t in tasks {
            assert_eq!(t.await.expect("task"), Some(want));
        }
    }

    #[tokio::test]
    async fn uring_many_in_flight() {
        let engine = open_engine(IoEngineKind::IoUring).expect("io_uring");
        let (_dir, file) = temp_file();
        // More requests than the ring has entries, all at once.
        let mut tasks = Vec::new();
        for i in 0..600u64 {
            let (engine, file) = (engine.clone(), file.clone());
            tasks.push(tokio::spawn(async move {
                let mut buf = AlignedBuf::zeroed(ALIGN);
                buf.full_mut().fill((i % 256) as u8);
                engine
                    .write_at(file.clone(), i * ALIGN as u64, buf)
                    .await
                    .expect("write");
                let got = engine
                    .read_at(file, i * ALIGN as u64, AlignedBuf::zeroed(ALIGN))
                    .await
                    .expect("read");
                assert!(got.iter().all(|&b| b == (i % 256) as u8));
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
    }
}
