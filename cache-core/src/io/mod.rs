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

/// Bytes from `ptr` to the next [`ALIGN`] boundary (0 when it is on one).
fn offset_to_aligned(ptr: *const u8) -> usize {
    (ALIGN - ptr as usize % ALIGN) % ALIGN
}

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
        let start = offset_to_aligned(storage.as_ptr());
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

    /// The whole aligned capacity (what a write of this buffer sends).
    pub fn full(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.capacity]
    }

    /// A buffer of `len` bytes to be filled by appending ([`AlignedFill`]): nothing is
    /// zeroed but the padding after `len`, so a buffer filled from a stream costs one
    /// copy of each byte and no `memset`.
    pub fn filler(len: usize) -> AlignedFill {
        let capacity = align_up(len.max(1));
        let mut storage = Vec::with_capacity(capacity + ALIGN);
        let start = offset_to_aligned(storage.as_ptr());
        storage.resize(start, 0);
        AlignedFill {
            storage,
            start,
            capacity,
            len,
        }
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

/// An [`AlignedBuf`] being filled by appending (see [`AlignedBuf::filler`]). Safe code
/// only: the storage is reserved once, the bytes before the aligned start are zeros,
/// and appends never exceed the reservation, so the storage never moves and the
/// aligned start found at creation stays the aligned start.
pub struct AlignedFill {
    storage: Vec<u8>,
    start: usize,
    capacity: usize,
    len: usize,
}

impl AlignedFill {
    /// Bytes appended so far.
    pub fn filled(&self) -> usize {
        self.storage.len() - self.start
    }

    /// Bytes still to append to reach the buffer's length.
    pub fn remaining(&self) -> usize {
        self.len - self.filled()
    }

    /// Appends up to [`Self::remaining`] bytes of `bytes`; returns how many it took.
    pub fn extend(&mut self, bytes: &[u8]) -> usize {
        let take = bytes.len().min(self.remaining());
        self.storage.extend_from_slice(&bytes[..take]);
        take
    }

    /// The memory still to be filled, up to the aligned capacity (for `madvise`-style
    /// preparation only: its contents are not part of the buffer).
    pub fn spare_mut(&mut self) -> &mut [std::mem::MaybeUninit<u8>] {
        let rest = self.start + self.capacity - self.storage.len();
        &mut self.storage.spare_capacity_mut()[..rest]
    }

    /// The buffer, its length what was appended (bytes short of the length asked for
    /// are zeros) and the padding up to the aligned capacity zeroed.
    pub fn finish(mut self) -> AlignedBuf {
        let len = self.filled();
        // Within the reservation (capacity + ALIGN > start + capacity): no move.
        self.storage.resize(self.start + self.capacity, 0);
        let buf = AlignedBuf::from_storage(self.storage, self.capacity, len, None);
        debug_assert_eq!(buf.start, self.start, "the storage moved while filling");
        buf
    }
}

impl fmt::Debug for AlignedFill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedFill")
            .field("filled", &self.filled())
            .field("len", &self.len)
            .finish()
    }
}

/// One part of a vectored write ([`IoEngine::write_parts_at`]): every part starts at a
/// 4096-aligned address and is a multiple of 4096 long, so that the whole write is
/// valid for `O_DIRECT`. The engine owns the parts until the kernel is done with them.
#[derive(Debug)]
pub enum WritePart {
    /// A buffer's whole aligned capacity.
    Buf(AlignedBuf),
    /// Bytes someone else filled (a block's value), written in place instead of copied
    /// into a buffer first; made by [`WritePart::direct`], which checks the alignment.
    Bytes(Bytes),
}

impl WritePart {
    /// `bytes` as a part if their start is 4096-aligned and their length a non-zero
    /// multiple of 4096; None otherwise (the caller copies them into a buffer).
    pub fn direct(bytes: Bytes) -> Option<WritePart> {
        (!bytes.is_empty() && is_aligned(bytes.as_ptr() as usize) && is_aligned(bytes.len()))
            .then_some(WritePart::Bytes(bytes))
    }

    /// The bytes written for this part.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            WritePart::Buf(b) => b.full(),
            WritePart::Bytes(b) => b,
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Bytes a write of `parts` sends.
pub fn parts_len(parts: &[WritePart]) -> usize {
    parts.iter().map(WritePart::len).sum()
}

/// The `iovec`s of `parts` from byte `skip` of their concatenation on (what is left
/// after a short write). The pointers are valid as long as `parts` is neither dropped
/// nor moved out of; the kernel only reads through them (a write).
pub(crate) fn iovecs(parts: &[WritePart], skip: usize) -> Vec<libc::iovec> {
    let mut out = Vec::with_capacity(parts.len());
    let mut skip = skip;
    for p in parts {
        let s = p.as_slice();
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        let s = &s[skip..];
        skip = 0;
        out.push(libc::iovec {
            iov_base: s.as_ptr() as *mut libc::c_void,
            iov_len: s.len(),
        });
    }
    out
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

    /// Writes `parts` one after another at `offset`, as one vectored transfer
    /// (`pwritev`, an io_uring `WRITEV`), so that a block's value is written from its
    /// own memory instead of being copied behind its header first. This default
    /// gathers the parts into one buffer and calls [`Self::write_at`] (engines that
    /// wrap another, as tests' fault injectors do, get the same bytes on disk).
    async fn write_parts_at(
        &self,
        file: Arc<File>,
        offset: u64,
        parts: Vec<WritePart>,
    ) -> io::Result<()> {
        let mut buf = AlignedBuf::zeroed(parts_len(&parts));
        let mut at = 0;
        let out = buf.full_mut();
        for p in &parts {
            let s = p.as_slice();
            out[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        }
        self.write_at(file, offset, buf).await
    }

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

/// Opens an existing cache file for reading (`flags` added, O_DIRECT say), only if it
/// is a regular file: anything else put in its place (a FIFO, whose open or read would
/// block for good; a directory; a link, not followed) is an `InvalidData` error, the
/// same as a damaged file (black-box finding: a FIFO in the cache dir hung every reader
/// of the block with no error). The descriptor is returned blocking again, as io_uring
/// and the kernel's passthrough expect.
pub fn open_regular(path: &std::path::Path, flags: i32) -> io::Result<File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    use std::os::unix::io::AsRawFd;
    let not_regular = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is {what}, not a cache file", path.display()),
        )
    };
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) => {
            // O_DIRECT refuses a FIFO or a directory (EINVAL), O_NOFOLLOW a link
            // (ELOOP): say what is there.
            return Err(match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_symlink() => not_regular("a symbolic link"),
                Ok(m) if m.file_type().is_fifo() => not_regular("a FIFO"),
                Ok(m) if !m.file_type().is_file() => not_regular("not a regular file"),
                _ => e,
            });
        }
    };
    let t = file.metadata()?.file_type();
    if !t.is_file() {
        return Err(not_regular(match t.is_fifo() {
            true => "a FIFO",
            false => "not a regular file",
        }));
    }
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function owns; no memory is passed.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
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
    use std::os::unix::fs::OpenOptionsExt;

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

    #[test]
    fn a_filled_buffer_is_aligned_and_holds_what_was_appended() {
        for len in [1usize, 4095, 4096, 70_000, (1 << 20) + 3] {
            let mut fill = AlignedBuf::filler(len);
            assert_eq!(fill.spare_mut().len(), align_up(len));
            let want: Vec<u8> = (0..len).map(|i| (i % 241) as u8 + 1).collect();
            let mut at = 0;
            for chunk in want.chunks(16_000) {
                at += fill.extend(chunk);
            }
            assert_eq!(at, len);
            assert_eq!(fill.remaining(), 0);
            assert_eq!(fill.extend(&[1, 2, 3]), 0, "never past its length");
            let buf = fill.finish();
            assert_eq!(&buf[..], &want[..]);
            assert_eq!(buf.capacity(), align_up(len));
            assert!(buf.full()[len..].iter().all(|&b| b == 0), "padding zeroed");
            let bytes = buf.into_bytes();
            assert!(is_aligned(bytes.as_ptr() as usize));
            assert_eq!(&bytes[..], &want[..]);
        }
        // Finished short: the missing bytes read as zeros.
        let mut fill = AlignedBuf::filler(10_000);
        fill.extend(&[7u8; 100]);
        let buf = fill.finish();
        assert_eq!(buf.len(), 100);
        assert!(buf.full()[100..].iter().all(|&b| b == 0));
    }

    #[test]
    fn only_aligned_whole_units_are_written_in_place() {
        let mut fill = AlignedBuf::filler(3 * ALIGN);
        fill.extend(&[5u8; 3 * ALIGN]);
        let b = fill.finish().into_bytes();
        assert!(WritePart::direct(b.slice(..2 * ALIGN)).is_some());
        assert!(WritePart::direct(b.slice(ALIGN..3 * ALIGN)).is_some());
        assert!(WritePart::direct(b.slice(..ALIGN + 1)).is_none(), "length");
        assert!(
            WritePart::direct(b.slice(1..ALIGN + 1)).is_none(),
            "address"
        );
        assert!(WritePart::direct(b.slice(..0)).is_none(), "empty");
        // iovecs after a short write resume inside the right part.
        let parts = vec![
            WritePart::Buf(AlignedBuf::zeroed(ALIGN)),
            WritePart::direct(b.slice(..2 * ALIGN)).expect("aligned"),
        ];
        assert_eq!(parts_len(&parts), 3 * ALIGN);
        let iov = iovecs(&parts, 0);
        assert_eq!(
            iov.iter().map(|v| v.iov_len).collect::<Vec<_>>(),
            [ALIGN, 2 * ALIGN]
        );
        let iov = iovecs(&parts, ALIGN + 512);
        assert_eq!(iov.len(), 1);
        assert_eq!(iov[0].iov_len, 2 * ALIGN - 512);
        assert_eq!(iov[0].iov_base as usize, b.as_ptr() as usize + 512);
        assert!(iovecs(&parts, 3 * ALIGN).is_empty());
    }

    /// An engine that only has `write_at`: `write_parts_at` is the trait's default.
    #[derive(Debug)]
    struct PlainWrites(Arc<dyn IoEngine>);

    #[async_trait]
    impl IoEngine for PlainWrites {
        fn name(&self) -> &'static str {
            "plain"
        }
        async fn read_at(
            &self,
            file: Arc<File>,
            offset: u64,
            buf: AlignedBuf,
        ) -> io::Result<AlignedBuf> {
            self.0.read_at(file, offset, buf).await
        }
        async fn write_at(&self, file: Arc<File>, offset: u64, buf: AlignedBuf) -> io::Result<()> {
            self.0.write_at(file, offset, buf).await
        }
        async fn sync_data(&self, file: Arc<File>) -> io::Result<()> {
            self.0.sync_data(file).await
        }
    }

    /// A vectored write puts its parts one after another at the offset, on both engines
    /// and through the default, for a file opened with `O_DIRECT` where the file
    /// system takes it.
    async fn parts_round_trip(engine: Arc<dyn IoEngine>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let direct = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path);
        let file = Arc::new(match direct {
            Ok(f) => f,
            Err(_) => std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&path)
                .expect("open"),
        });
        let mut head = AlignedBuf::zeroed(ALIGN);
        head.full_mut().fill(0x11);
        let body: Vec<u8> = (0..(1 << 20)).map(|i| (i % 239) as u8).collect();
        let mut fill = AlignedBuf::filler(body.len());
        fill.extend(&body);
        let body_bytes = fill.finish().into_bytes();
        let mut tail = AlignedBuf::zeroed(ALIGN);
        tail.full_mut()[..10].fill(0x22);
        let parts = vec![
            WritePart::Buf(head),
            WritePart::direct(body_bytes.clone()).expect("aligned"),
            WritePart::Buf(tail),
        ];
        engine
            .write_parts_at(file.clone(), ALIGN as u64, parts)
            .await
            .expect("write parts");
        let got = std::fs::read(&path).expect("read");
        assert_eq!(got.len(), 2 * ALIGN + body.len() + ALIGN);
        assert!(got[..ALIGN].iter().all(|&b| b == 0), "before the offset");
        assert!(got[ALIGN..2 * ALIGN].iter().all(|&b| b == 0x11));
        assert_eq!(&got[2 * ALIGN..2 * ALIGN + body.len()], &body[..]);
        let t = &got[2 * ALIGN + body.len()..];
        assert!(t[..10].iter().all(|&b| b == 0x22) && t[10..].iter().all(|&b| b == 0));
        assert_eq!(
            &body_bytes[..],
            &body[..],
            "the written memory is untouched"
        );
    }

    #[tokio::test]
    async fn write_parts_round_trip_on_every_engine() {
        parts_round_trip(open_engine(IoEngineKind::Psync).expect("psync")).await;
        parts_round_trip(open_engine(IoEngineKind::IoUring).expect("io_uring")).await;
        parts_round_trip(Arc::new(PlainWrites(
            open_engine(IoEngineKind::Psync).expect("psync"),
        )))
        .await;
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
