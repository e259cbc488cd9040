//! The CUDA backend (cargo feature `cuda`): cudarc's driver API with dynamic loading,
//! so the crate builds without a CUDA toolkit and a machine without libcuda gets a
//! clean `Unavailable` error instead of cudarc's panic (every entry point checks
//! `is_culib_present()` before the first driver call).
//!
//! - Memory: `cuMemAlloc` per buffer (not the stream-ordered pool, so allocations can
//!   be exported with `cuIpcGetMemHandle`), counted against the configured limit capped
//!   at what the device reported free when opened.
//! - Pinned buffers: `cuMemHostAlloc` (page-locked, page-aligned: DMA-able and valid
//!   `O_DIRECT` targets).
//! - Streams: one non-blocking CUDA stream per [`DeviceStream`]; the stream's worker thread
//!   issues the async copy and waits for it, which keeps per-stream order and frees the
//!   caller to read the next chunk meanwhile.
//! - Sticky errors (illegal address, ECC, launch failure...) mark the device lost.
//! - cuFile: probed at open (`libcufile` present, `cuFileDriverOpen` succeeds); files are
//!   registered per read with `O_DIRECT`, and a file cuFile refuses falls back to the
//!   compat path in [`crate::transfer`].

use std::any::Any;
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::cufile::result as cf;
use cudarc::cufile::sys as cfsys;
use cudarc::driver::result as cu;
use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

use crate::device::{
    AlignedBuf, CopyEngine, Device, DeviceBuffer, DeviceCopy, DeviceInfo, DeviceKind, DeviceMemory,
    DeviceStream, PinnedBuffer, PinnedMemory,
};
use crate::error::{GdsError, Result};
use crate::ipc::{IpcBackend, IpcExport, IpcHandle};
use crate::transfer::{DirectFileHandle, DirectStorage};

/// True when libcuda can be loaded (no driver call is made).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen candidate library names.
    unsafe { sys::is_culib_present() }
}

/// True when libcufile can be loaded.
pub fn cufile_present() -> bool {
    // SAFETY: as above.
    unsafe { cfsys::is_culib_present() }
}

struct Shared {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    ordinal: usize,
    name: String,
    limit: u64,
    allocated: AtomicU64,
    lost: AtomicBool,
}

// SAFETY: CUcontext is a handle the driver allows any thread to bind; all mutable state
// here is atomic.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: retained in `open`; released once.
        let _ = unsafe { cu::primary_ctx::release(self.dev) };
    }
}

impl Shared {
    fn bind(&self) -> Result<()> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(GdsError::DeviceLost(format!(
                "GPU {} was lost",
                self.ordinal
            )));
        }
        // SAFETY: ctx is the retained primary context, alive as long as self.
        unsafe { cu::ctx::set_current(self.ctx) }.map_err(|e| self.classify(e, "bind context"))
    }

    /// Maps a driver error; sticky errors mean the context (and all memory) is gone.
    fn classify(&self, e: DriverError, what: &str) -> GdsError {
        use sys::CUresult::*;
        match e.0 {
            CUDA_ERROR_OUT_OF_MEMORY => GdsError::OutOfMemory {
                requested: 0,
                available: 0,
                limit: self.limit,
            },
            CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
            | CUDA_ERROR_DEVICE_UNAVAILABLE => {
                self.lost.store(true, Ordering::SeqCst);
                GdsError::DeviceLost(format!("{what}: {e}"))
            }
            _ => GdsError::Cuda(format!("{what}: {e}")),
        }
    }
}

struct CudaMem {
    ptr: sys::CUdeviceptr,
    len: usize,
    shared: Arc<Shared>,
}

impl Drop for CudaMem {
    fn drop(&mut self) {
        if self.len > 0 && self.shared.bind().is_ok() {
            // SAFETY: allocated by cuMemAlloc in `alloc`, freed once.
            let _ = unsafe { cu::free_sync(self.ptr) };
        }
        self.shared
            .allocated
            .fetch_sub(self.len as u64, Ordering::AcqRel);
    }
}

impl DeviceMemory for CudaMem {
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn ptr_of(buf: &DeviceBuffer, off: usize) -> Result<sys::CUdeviceptr> {
    let mem = buf
        .memory()
        .as_any()
        .downcast_ref::<CudaMem>()
        .ok_or_else(|| GdsError::InvalidRange("buffer is not CUDA memory".into()))?;
    Ok(mem.ptr + off as u64)
}

struct CudaPinned {
    ptr: *mut u8,
    len: usize,
    shared: Arc<Shared>,
}

// SAFETY: owns its page-locked allocation exclusively.
unsafe impl Send for CudaPinned {}

impl Drop for CudaPinned {
    fn drop(&mut self) {
        if self.shared.bind().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            let _ = unsafe { cu::free_host(self.ptr.cast()) };
        }
    }
}

impl PinnedMemory for CudaPinned {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (zeroed at allocation) and owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; &mut self makes access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

struct CudaCopy {
    shared: Arc<Shared>,
    stream: sys::CUstream,
}

// SAFETY: the stream is only used from its worker thread after creation; the handle
// itself may move between threads.
unsafe impl Send for CudaCopy {}
unsafe impl Sync for CudaCopy {}

impl Drop for CudaCopy {
    fn drop(&mut self) {
        if self.shared.bind().is_ok() {
            // SAFETY: created in `new_stream`, destroyed once.
            let _ = unsafe { cu::stream::destroy(self.stream) };
        }
    }
}

impl CudaCopy {
    fn finish(&self, r: std::result::Result<(), DriverError>, what: &str) -> Result<()> {
        r.map_err(|e| self.shared.classify(e, what))?;
        // SAFETY: the stream is alive; waiting makes the copy's buffers free to reuse.
        unsafe { cu::stream::synchronize(self.stream) }.map_err(|e| self.shared.classify(e, what))
    }
}

impl CopyEngine for CudaCopy {
    fn htod(&self, src: &[u8], dst: &DeviceBuffer, dst_off: usize) -> Result<()> {
        self.shared.bind()?;
        let d = ptr_of(dst, dst_off)?;
        // SAFETY: range checked by DeviceStream; src outlives the synchronize in `finish`.
        let r = unsafe { cu::memcpy_htod_async(d, src, self.stream) };
        self.finish(r, "memcpy htod")
    }

    fn dtoh(&self, src: &DeviceBuffer, src_off: usize, dst: &mut [u8]) -> Result<()> {
        self.shared.bind()?;
        let s = ptr_of(src, src_off)?;
        // SAFETY: as above.
        let r = unsafe { cu::memcpy_dtoh_async(dst, s, self.stream) };
        self.finish(r, "memcpy dtoh")
    }

    fn dtod(&self, copy: DeviceCopy<'_>) -> Result<()> {
        self.shared.bind()?;
        let s = ptr_of(copy.src, copy.src_off)?;
        let d = ptr_of(copy.dst, copy.dst_off)?;
        // SAFETY: ranges checked by DeviceStream; both allocations held by the job.
        let r = unsafe { cu::memcpy_dtod_async(d, s, copy.len, self.stream) };
        self.finish(r, "memcpy dtod")
    }
}

/// One CUDA GPU.
pub struct CudaDevice {
    shared: Arc<Shared>,
    cufile: std::result::Result<Arc<dyn DirectStorage>, String>,
}

impl CudaDevice {
    /// Opens GPU `ordinal` with at most `memory_limit` bytes of allocations. Fails with
    /// `Unavailable` (never panics) when libcuda, the driver or the GPU is missing.
    pub fn open(ordinal: usize, memory_limit: u64) -> Result<Self> {
        if !driver_present() {
            return Err(GdsError::Unavailable("libcuda.so not found".into()));
        }
        let unavailable =
            |what: &str, e: DriverError| GdsError::Unavailable(format!("{what}: {e}"));
        cu::init().map_err(|e| unavailable("cuInit", e))?;
        let count = cu::device::get_count().map_err(|e| unavailable("cuDeviceGetCount", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(GdsError::Unavailable(format!(
                "GPU {ordinal} requested, {count} present"
            )));
        }
        let dev = cu::device::get(ordinal as i32).map_err(|e| unavailable("cuDeviceGet", e))?;
        // SAFETY: dev is a valid device; the context is released in Shared::drop.
        let ctx = unsafe { cu::primary_ctx::retain(dev) }
            .map_err(|e| unavailable("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: ctx was just retained.
        unsafe { cu::ctx::set_current(ctx) }.map_err(|e| unavailable("cuCtxSetCurrent", e))?;
        let name = cu::device::get_name(dev).unwrap_or_else(|_| format!("cuda:{ordinal}"));
        let (free, _total) = cu::mem_get_info().map_err(|e| unavailable("cuMemGetInfo", e))?;
        let shared = Arc::new(Shared {
            dev,
            ctx,
            ordinal,
            name,
            limit: memory_limit.min(free as u64),
            allocated: AtomicU64::new(0),
            lost: AtomicBool::new(false),
        });
        let cufile = probe_cufile(&shared);
        if let Err(why) = &cufile {
            tracing::info!(why = %why, "cuFile unavailable; compat transfers");
        }
        Ok(CudaDevice { shared, cufile })
    }
}

fn probe_cufile(shared: &Arc<Shared>) -> std::result::Result<Arc<dyn DirectStorage>, String> {
    if !cufile_present() {
        return Err("libcufile.so not found".into());
    }
    cf::driver_open().map_err(|e| format!("cuFileDriverOpen failed: {e}"))?;
    let props =
        cf::driver_get_properties().map_err(|e| format!("cuFileDriverGetProperties: {e}"))?;
    Ok(Arc::new(Cufile {
        shared: shared.clone(),
        nvfs: (props.nvfs.major_version, props.nvfs.minor_version),
    }))
}

struct Cufile {
    shared: Arc<Shared>,
    nvfs: (u32, u32),
}

struct CufileFile {
    _file: File,
    handle: cfsys::CUfileHandle_t,
    shared: Arc<Shared>,
}

// SAFETY: cuFile handles are thread-safe per the cuFile API reference.
unsafe impl Send for CufileFile {}
unsafe impl Sync for CufileFile {}

impl Drop for CufileFile {
    fn drop(&mut self) {
        // SAFETY: registered in `open`, deregistered once, before the fd closes.
        let _ = unsafe { cf::handle_deregister(self.handle) };
    }
}

impl DirectStorage for Cufile {
    fn name(&self) -> String {
        format!("cuFile (nvidia-fs {}.{})", self.nvfs.0, self.nvfs.1)
    }

    fn open(&self, path: &Path) -> Result<Box<dyn DirectFileHandle>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        let descr = cfsys::CUfileDescr_t {
            type_: cfsys::CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: cfsys::CUfileDescr_t__bindgen_ty_1 {
                fd: file.as_raw_fd(),
            },
            fs_ops: std::ptr::null(),
        };
        let handle = cf::handle_register(&descr)
            .map_err(|e| GdsError::Unavailable(format!("cuFileHandleRegister: {e}")))?;
        Ok(Box::new(CufileFile {
            _file: file,
            handle,
            shared: self.shared.clone(),
        }))
    }
}

impl DirectFileHandle for CufileFile {
    fn read_into(
        &self,
        file_off: u64,
        len: usize,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<usize> {
        dst.check_range(dst_off, len)?;
        self.shared.bind()?;
        let base = ptr_of(dst, 0)?;
        let mut done = 0usize;
        while done < len {
            // SAFETY: the destination range was checked; the allocation is held by `dst`.
            let n = unsafe {
                cf::read(
                    self.handle,
                    base as *mut std::ffi::c_void,
                    len - done,
                    (file_off + done as u64) as i64,
                    (dst_off + done) as i64,
                )
            }
            .map_err(|e| GdsError::Cuda(format!("cuFileRead: {e}")))?;
            if n <= 0 {
                break;
            }
            done += n as usize;
        }
        Ok(done)
    }
}

impl Device for CudaDevice {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            kind: DeviceKind::Cuda,
            name: self.shared.name.clone(),
            ordinal: self.shared.ordinal,
            memory_limit: self.shared.limit,
        }
    }

    fn allocated_bytes(&self) -> u64 {
        self.shared.allocated.load(Ordering::Acquire)
    }

    fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        let s = &self.shared;
        s.bind()?;
        let want = len as u64;
        s.allocated
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(want).filter(|&t| t <= s.limit)
            })
            .map_err(|used| GdsError::OutOfMemory {
                requested: want,
                available: s.limit.saturating_sub(used),
                limit: s.limit,
            })?;
        let ptr = if len == 0 {
            0
        } else {
            // SAFETY: context bound; the memory is freed in CudaMem::drop.
            match unsafe { cu::malloc_sync(len) } {
                Ok(p) => p,
                Err(e) => {
                    s.allocated.fetch_sub(want, Ordering::AcqRel);
                    return Err(match s.classify(e, "cuMemAlloc") {
                        GdsError::OutOfMemory { limit, .. } => GdsError::OutOfMemory {
                            requested: want,
                            available: 0,
                            limit,
                        },
                        other => other,
                    });
                }
            }
        };
        Ok(DeviceBuffer::new(Arc::new(CudaMem {
            ptr,
            len,
            shared: s.clone(),
        })))
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer> {
        if len == 0 {
            return Ok(PinnedBuffer::new(Box::new(AlignedBuf::zeroed(0)?)));
        }
        self.shared.bind()?;
        // SAFETY: context bound; freed in CudaPinned::drop.
        let ptr = unsafe { cu::malloc_host(len, 0) }
            .map_err(|e| self.shared.classify(e, "cuMemHostAlloc"))?
            .cast::<u8>();
        // SAFETY: ptr is valid for len bytes; zeroing makes the slice initialised.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedBuffer::new(Box::new(CudaPinned {
            ptr,
            len,
            shared: self.shared.clone(),
        })))
    }

    fn new_stream(&self) -> Result<DeviceStream> {
        self.shared.bind()?;
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(|e| self.shared.classify(e, "cuStreamCreate"))?;
        let engine = Arc::new(CudaCopy {
            shared: self.shared.clone(),
            stream,
        });
        DeviceStream::spawn(engine, "strata-cuda-stream")
    }

    fn is_lost(&self) -> bool {
        self.shared.lost.load(Ordering::SeqCst)
    }

    fn ipc(&self) -> Option<&dyn IpcBackend> {
        Some(self)
    }

    fn direct_storage(&self) -> std::result::Result<Arc<dyn DirectStorage>, String> {
        self.cufile.clone()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl IpcBackend for CudaDevice {
    fn export(&self, buf: &DeviceBuffer, crc: u32) -> Result<IpcExport> {
        self.shared.bind()?;
        let ptr = ptr_of(buf, 0)?;
        let mut handle = std::mem::MaybeUninit::<sys::CUipcMemHandle>::uninit();
        // SAFETY: ptr is the base of a live cuMemAlloc allocation.
        unsafe { sys::cuIpcGetMemHandle(handle.as_mut_ptr(), ptr) }
            .result()
            .map_err(|e| GdsError::Ipc(format!("cuIpcGetMemHandle: {e}")))?;
        // SAFETY: initialised by the successful call above.
        let handle = unsafe { handle.assume_init() };
        let token = handle.reserved.iter().map(|&c| c as u8).collect();
        Ok(IpcExport::new(
            IpcHandle {
                kind: DeviceKind::Cuda,
                len: buf.len() as u64,
                crc,
                // Each tier block is its own allocation: it starts at the handle's base.
                offset: 0,
                token,
            },
            // Keeps the allocation alive (and its handle valid) while exported.
            Box::new(buf.clone()),
        ))
    }

    fn import_into(&self, handle: &IpcHandle, dst: &DeviceBuffer, dst_off: usize) -> Result<()> {
        if handle.kind != DeviceKind::Cuda || handle.token.len() != 64 {
            return Err(GdsError::Ipc("not a CUDA IPC handle".into()));
        }
        let len = usize::try_from(handle.len).map_err(|_| GdsError::Ipc("length".into()))?;
        dst.check_range(dst_off, len)?;
        if len == 0 {
            return Ok(());
        }
        self.shared.bind()?;
        let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
        for (r, &b) in raw.reserved.iter_mut().zip(&handle.token) {
            *r = b as std::ffi::c_char;
        }
        let mut src: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: raw is a handle produced by cuIpcGetMemHandle in another process.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut src, raw, flags) }
            .result()
            .map_err(|e| GdsError::Ipc(format!("cuIpcOpenMemHandle: {e}")))?;
        let d = ptr_of(dst, dst_off)?;
        // SAFETY: src is mapped for offset + len bytes (the exporter's allocation);
        // d's range was checked.
        let copied = unsafe { cu::memcpy_dtod_sync(d, src + handle.offset, len) }
            .map_err(|e| self.shared.classify(e, "IPC dtod copy"));
        // SAFETY: opened above, closed once.
        let _ = unsafe { sys::cuIpcCloseMemHandle(src) };
        copied
    }
}
