//! The device abstraction: device memory under a byte limit, pinned host buffers, and
//! streams of asynchronous copies.
//!
//! Design:
//! - [`DeviceBuffer`] is a shared handle (`Arc`) to one device allocation; the memory is
//!   freed when the last handle drops, so an in-flight copy keeps its buffers alive and
//!   a caller can never free memory a copy is still using.
//! - [`PinnedBuffer`] is an owned, page-aligned host buffer (page-locked on CUDA, so DMA
//!   engines can read it; 4 KiB-aligned everywhere, so `O_DIRECT` can fill it). A copy
//!   *takes* it and hands it back on completion (tokio-uring's owned-buffer style), so no
//!   lock is held while bytes move and the borrow checker rules out reuse mid-copy.
//! - [`DeviceStream`] is an ordered queue of copies run by one worker thread: copies on one
//!   stream complete in submission order (as on a CUDA stream), copies on different
//!   streams overlap. Each backend supplies the synchronous copy primitives
//!   ([`CopyEngine`]); the worker makes them asynchronous. Waiting is a blocking call
//!   ([`Pending::wait`]); async callers run pipelines under `spawn_blocking`.

use std::any::Any;
use std::ops::Range;
use std::sync::mpsc;
use std::sync::Arc;

use crate::error::{GdsError, Result};

/// Which backend a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// Host memory standing in for device memory (CI, machines without a GPU).
    Emulated,
    /// An NVIDIA GPU through the CUDA driver API.
    Cuda,
}

/// What a device is, for stats and logs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    pub kind: DeviceKind,
    pub name: String,
    pub ordinal: usize,
    /// Bytes this process may allocate on the device (configured limit, or what the
    /// device reported free at open time, whichever is lower).
    pub memory_limit: u64,
}

/// One device: allocations, pinned host memory, streams.
pub trait Device: Send + Sync + 'static {
    fn info(&self) -> DeviceInfo;
    /// Bytes currently allocated through this handle.
    fn allocated_bytes(&self) -> u64;
    /// Allocates `len` bytes of device memory; fails cleanly with `OutOfMemory` beyond
    /// the limit and with `DeviceLost` once the device is gone.
    fn alloc(&self, len: usize) -> Result<DeviceBuffer>;
    /// Allocates a page-aligned (page-locked where the backend can) host buffer.
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer>;
    /// A new ordered copy queue.
    fn new_stream(&self) -> Result<DeviceStream>;
    /// True once the device is gone; all buffers on it are invalid.
    fn is_lost(&self) -> bool;
    /// Client access: exporting device buffers to other processes, if supported.
    fn ipc(&self) -> Option<&dyn crate::ipc::IpcBackend> {
        None
    }
    /// NVMe -> device DMA (cuFile) if the platform allows it, else why not.
    fn direct_storage(
        &self,
    ) -> std::result::Result<Arc<dyn crate::transfer::DirectStorage>, String> {
        Err("not supported by this backend".into())
    }
    /// The device's owner is shutting down: memory freed from now on need not be
    /// cleared for reuse (the emulated device then leaves it as it is, so another
    /// process's view of a block, whose lease the shutdown ended, keeps its bytes
    /// instead of reading zeros). Nothing for a device whose memory no other process
    /// maps.
    fn retire(&self) {}
    fn as_any(&self) -> &dyn Any;
}

/// Backend side of one device allocation.
pub trait DeviceMemory: Send + Sync + 'static {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn as_any(&self) -> &dyn Any;
}

/// A shared handle to a device allocation (cloning shares, it does not copy).
#[derive(Clone)]
pub struct DeviceBuffer {
    mem: Arc<dyn DeviceMemory>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} bytes)", self.len())
    }
}

impl DeviceBuffer {
    pub fn new(mem: Arc<dyn DeviceMemory>) -> Self {
        DeviceBuffer { mem }
    }
    pub fn len(&self) -> usize {
        self.mem.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The backend's allocation, for backends downcasting their own memory.
    pub fn memory(&self) -> &dyn DeviceMemory {
        self.mem.as_ref()
    }
    /// True when both handles name the same allocation.
    pub fn same_allocation(&self, other: &DeviceBuffer) -> bool {
        Arc::ptr_eq(&self.mem, &other.mem)
    }
    /// Checks that `off..off+len` lies inside the buffer.
    pub fn check_range(&self, off: usize, len: usize) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(GdsError::InvalidRange(format!(
                "{off}+{len} outside a device buffer of {} bytes",
                self.len()
            ))),
        }
    }
}

/// Backend side of one pinned host buffer.
pub trait PinnedMemory: Send + 'static {
    fn as_slice(&self) -> &[u8];
    fn as_mut_slice(&mut self) -> &mut [u8];
}

/// An owned, page-aligned host buffer used for staging (see the module docs).
pub struct PinnedBuffer {
    mem: Box<dyn PinnedMemory>,
}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedBuffer({} bytes)", self.len())
    }
}

impl PinnedBuffer {
    pub fn new(mem: Box<dyn PinnedMemory>) -> Self {
        PinnedBuffer { mem }
    }
    pub fn len(&self) -> usize {
        self.mem.as_slice().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn as_slice(&self) -> &[u8] {
        self.mem.as_slice()
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.mem.as_mut_slice()
    }
}

/// Page-aligned heap memory: the emulated device's pinned buffers and a fallback for
/// O_DIRECT reads anywhere.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

/// Alignment of staging buffers: 4 KiB, the largest logical block size O_DIRECT needs
/// on common NVMe and the x86/ARM page size.
pub const STAGING_ALIGN: usize = 4096;

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to [`STAGING_ALIGN`].
    pub fn zeroed(len: usize) -> Result<Self> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), STAGING_ALIGN)
            .map_err(|e| GdsError::InvalidRange(format!("aligned buffer of {len}: {e}")))?;
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw).ok_or(GdsError::OutOfMemory {
            requested: len as u64,
            available: 0,
            limit: 0,
        })?;
        Ok(AlignedBuf { ptr, len })
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Ok(layout) = std::alloc::Layout::from_size_align(self.len.max(1), STAGING_ALIGN) {
            // SAFETY: allocated in `zeroed` with this same layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl PinnedMemory for AlignedBuf {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes, initialised (zeroed) and owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// A device -> device copy: `len` bytes of `src` from `src_off` to `dst` at `dst_off`
/// (`src` and `dst` may be one buffer).
#[derive(Clone, Copy, Debug)]
pub struct DeviceCopy<'a> {
    pub src: &'a DeviceBuffer,
    pub src_off: usize,
    pub dst: &'a DeviceBuffer,
    pub dst_off: usize,
    pub len: usize,
}

/// Synchronous copy primitives a backend supplies; a [`DeviceStream`] runs them in order on
/// its worker thread.
pub trait CopyEngine: Send + Sync + 'static {
    fn htod(&self, src: &[u8], dst: &DeviceBuffer, dst_off: usize) -> Result<()>;
    fn dtoh(&self, src: &DeviceBuffer, src_off: usize, dst: &mut [u8]) -> Result<()>;
    fn dtod(&self, copy: DeviceCopy<'_>) -> Result<()>;
}

type Job = Box<dyn FnOnce(&dyn CopyEngine) + Send>;

/// An ordered queue of asynchronous copies (see the module docs).
pub struct DeviceStream {
    tx: mpsc::Sender<Job>,
}

impl std::fmt::Debug for DeviceStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceStream")
    }
}

/// The outcome of one asynchronous copy: whether it succeeded, and the staging buffer
/// it borrowed (absent only if the stream's worker died).
#[derive(Debug)]
pub struct Done<T> {
    pub result: Result<()>,
    pub value: Option<T>,
}

/// A copy in flight.
#[must_use = "a copy's outcome must be waited for"]
pub struct Pending<T> {
    rx: mpsc::Receiver<(Result<()>, T)>,
}

impl<T> Pending<T> {
    /// Blocks until the copy completes.
    pub fn wait(self) -> Done<T> {
        match self.rx.recv() {
            Ok((result, value)) => Done {
                result,
                value: Some(value),
            },
            Err(_) => Done {
                result: Err(GdsError::DeviceLost("copy stream worker stopped".into())),
                value: None,
            },
        }
    }
}

impl DeviceStream {
    /// Starts a worker thread running `engine`'s copies in submission order. The thread
    /// exits when the stream is dropped and its queue drained.
    pub fn spawn(engine: Arc<dyn CopyEngine>, name: &str) -> Result<DeviceStream> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job(engine.as_ref());
                }
            })?;
        Ok(DeviceStream { tx })
    }

    fn submit<T: Send + 'static>(
        &self,
        value: T,
        op: impl FnOnce(&dyn CopyEngine, &mut T) -> Result<()> + Send + 'static,
    ) -> Pending<T> {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |engine| {
            let mut value = value;
            let result = op(engine, &mut value);
            let _ = done_tx.send((result, value));
        });
        // If the worker is gone the job (and its sender) drops, and `wait` reports it.
        let _ = self.tx.send(job);
        Pending { rx: done_rx }
    }

    /// Host -> device: copies `src[range]` to `dst[dst_off..]`; hands `src` back.
    pub fn htod(
        &self,
        src: PinnedBuffer,
        range: Range<usize>,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Pending<PinnedBuffer> {
        let dst = dst.clone();
        self.submit(src, move |engine, src| {
            let bytes = src.as_slice().get(range.clone()).ok_or_else(|| {
                GdsError::InvalidRange(format!("{range:?} outside a pinned buffer"))
            })?;
            dst.check_range(dst_off, bytes.len())?;
            engine.htod(bytes, &dst, dst_off)
        })
    }

    /// Device -> host: copies `src[src_off..src_off+range.len()]` into `dst[range]`.
    pub fn dtoh(
        &self,
        src: &DeviceBuffer,
        src_off: usize,
        dst: PinnedBuffer,
        range: Range<usize>,
    ) -> Pending<PinnedBuffer> {
        let src = src.clone();
        self.submit(dst, move |engine, dst| {
            let out = dst.as_mut_slice().get_mut(range.clone()).ok_or_else(|| {
                GdsError::InvalidRange(format!("{range:?} outside a pinned buffer"))
            })?;
            src.check_range(src_off, out.len())?;
            engine.dtoh(&src, src_off, out)
        })
    }

    /// Device -> device.
    pub fn dtod(&self, copy: DeviceCopy<'_>) -> Pending<()> {
        let DeviceCopy {
            src_off,
            dst_off,
            len,
            ..
        } = copy;
        let (src, dst) = (copy.src.clone(), copy.dst.clone());
        self.submit((), move |engine, _| {
            src.check_range(src_off, len)?;
            dst.check_range(dst_off, len)?;
            engine.dtod(DeviceCopy {
                src: &src,
                src_off,
                dst: &dst,
                dst_off,
                len,
            })
        })
    }
}
