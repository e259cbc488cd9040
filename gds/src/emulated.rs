//! The host-emulated device: ordinary memory standing in for device memory, so every
//! path of the GPU tier runs (and is tested) on machines without a GPU.
//!
//! It keeps the real device's contract: allocations count against a byte limit and fail
//! cleanly beyond it; copies are asynchronous (run by a stream's worker thread, ordered
//! per stream); a lost device fails every later call. Faults can be injected for tests:
//! failing allocations, losing the device after a number of copied bytes (mid-transfer),
//! and flipping a byte of device memory (to exercise checksums).
//!
//! Its memory is one memfd mapped into the process (as a GPU's memory is one address
//! space), and an allocation is a range of it. That makes the emulated device's IPC
//! path a real one (see [`crate::ipc`]): a client that received the memfd (over a Unix
//! socket, `SCM_RIGHTS`) maps it and reads an exported allocation in place at the
//! handle's offset, exactly as a CUDA client maps an exported allocation with
//! `cuIpcOpenMemHandle`. Allocations are 256-byte aligned (cudaMalloc's guarantee, so
//! layouts computed on the emulated device hold on a real one); a freed range's whole
//! pages are punched out of the memfd, so the device's resident memory follows what is
//! allocated, not its high-water mark.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use nix::fcntl::{fallocate, FallocateFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use parking_lot::{Mutex, RwLock};

use crate::device::{
    AlignedBuf, CopyEngine, Device, DeviceBuffer, DeviceCopy, DeviceInfo, DeviceKind, DeviceMemory,
    DeviceStream, PinnedBuffer,
};
use crate::error::{GdsError, Result};
use crate::sealed_memfd::SealedMemfd;

/// Host memory acting as a device.
pub struct EmulatedDevice {
    shared: Arc<Shared>,
    /// Other devices' memory this one received (by their id), to open their handles.
    peers: Mutex<HashMap<[u8; 16], Arc<PeerMemory>>>,
}

/// Alignment of allocations: cudaMalloc's (256 bytes).
pub const ALLOC_ALIGN: usize = 256;

const PAGE: usize = 4096;

/// Address space reserved beyond twice the limit: 64 MiB, so a device with a tiny
/// limit still has room for many small (256-byte-aligned) allocations. Sparse: a
/// memfd's pages exist only once written.
const SLACK: usize = 64 << 20;

/// Most address space one emulated device reserves: 1 TiB (virtual and sparse; a larger
/// limit is then bounded by fragmentation of this space rather than the byte count).
const MAX_SPACE: usize = 1 << 40;

/// The device's memory: one sealed memfd mapped read-write, and its free ranges.
struct Memory {
    map: SealedMemfd,
    /// Free ranges: offset -> length, coalesced.
    free: Mutex<BTreeMap<usize, usize>>,
    /// Set at shutdown ([`Device::retire`]): freed ranges are left as they are.
    retired: AtomicBool,
}

fn sys(e: nix::Error, what: &str) -> GdsError {
    GdsError::Io(std::io::Error::new(
        std::io::Error::from(e).kind(),
        format!("emulated device memory: {what}: {e}"),
    ))
}

impl Memory {
    fn new(limit: u64) -> Result<Self> {
        let want = usize::try_from(limit)
            .unwrap_or(MAX_SPACE)
            .min(MAX_SPACE / 2)
            .div_ceil(PAGE)
            * PAGE;
        // Twice the limit: first-fit fragmentation does not refuse what the byte limit
        // allows until the device is badly fragmented.
        let size = (want * 2 + SLACK).min(MAX_SPACE);
        let len = NonZeroUsize::new(size).ok_or_else(|| GdsError::InvalidRange("empty".into()))?;
        // No swap reserved: most of the twice-the-limit space is never touched.
        let map = SealedMemfd::create(c"strata-emulated-device", len, true, false)
            .map_err(|e| sys(e.source, e.step))?;
        Ok(Memory {
            map,
            free: Mutex::new(BTreeMap::from([(0, size)])),
            retired: AtomicBool::new(false),
        })
    }

    /// First fit; None when no free range is large enough.
    fn allocate(&self, span: usize) -> Option<usize> {
        let mut free = self.free.lock();
        let (o, l) = free
            .iter()
            .find(|(_, &l)| l >= span)
            .map(|(&o, &l)| (o, l))?;
        free.remove(&o);
        if l > span {
            free.insert(o + span, l - span);
        }
        Some(o)
    }

    fn release(&self, mut offset: usize, mut len: usize) {
        if self.retired.load(Ordering::Acquire) {
            // Shutting down: nothing is allocated again, and a client's view of this
            // block (its lease ended by the shutdown) must keep its bytes, not read
            // zeros (black-box finding: device views read all zeros after SIGTERM).
            return;
        }
        // Free ranges read zero (so an allocation needs no clearing): the whole pages go
        // back to the system (they read zero again), the bytes of partial pages at the
        // ends are zeroed here.
        let start = (offset.div_ceil(PAGE) * PAGE).min(offset + len);
        let end = ((offset + len) / PAGE * PAGE).max(start);
        // SAFETY: both ranges lie inside this released allocation, which nothing uses
        // any more (its last handle is being dropped).
        unsafe {
            std::ptr::write_bytes(self.map.base().as_ptr().add(offset), 0, start - offset);
            std::ptr::write_bytes(self.map.base().as_ptr().add(end), 0, offset + len - end);
        }
        if end > start {
            let punched = fallocate(
                self.map.fd(),
                FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
                start as i64,
                (end - start) as i64,
            );
            if punched.is_err() {
                // SAFETY: as above; the pages stay resident but read zero.
                unsafe {
                    std::ptr::write_bytes(self.map.base().as_ptr().add(start), 0, end - start)
                }
            }
        }
        let mut free = self.free.lock();
        if let Some((&prev, &plen)) = free.range(..offset).next_back() {
            if prev + plen == offset {
                free.remove(&prev);
                offset = prev;
                len += plen;
            }
        }
        if let Some(next_len) = free.remove(&(offset + len)) {
            len += next_len;
        }
        free.insert(offset, len);
    }
}

/// Another device's memory, mapped read-only (the client side of IPC).
pub(crate) struct PeerMemory {
    base: NonNull<u8>,
    size: usize,
}

// SAFETY: a read-only shared mapping owned by this value for its whole life.
unsafe impl Send for PeerMemory {}
unsafe impl Sync for PeerMemory {}

impl Drop for PeerMemory {
    fn drop(&mut self) {
        // SAFETY: mapped in `attach_peer` with this base and size.
        unsafe {
            let _ = munmap(self.base.cast(), self.size);
        }
    }
}

impl PeerMemory {
    /// The bytes at `offset..offset + len`, if inside the mapping.
    pub(crate) fn bytes(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let off = usize::try_from(offset).ok()?;
        let len = usize::try_from(len).ok()?;
        if off.checked_add(len)? > self.size {
            return None;
        }
        // SAFETY: inside the mapping, which lives as long as `self`.
        Some(unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(off), len) })
    }
}

struct Shared {
    name: String,
    /// Names this device's memory in IPC handles (random, so a handle of another
    /// device or an earlier run is never mistaken for one of this device's).
    id: [u8; 16],
    memory: Memory,
    limit: u64,
    allocated: AtomicU64,
    next_id: AtomicU64,
    lost: AtomicBool,
    /// The next this-many allocations fail with `OutOfMemory`.
    fail_allocs: AtomicU32,
    /// Bytes that may still be copied before the device is lost (`u64::MAX`: never).
    copy_budget: AtomicU64,
}

/// One allocation: `len` bytes at `offset` of the device's memfd.
struct EmuMem {
    id: u64,
    device: Arc<Shared>,
    offset: usize,
    len: usize,
    /// Bytes of address space taken (`len` rounded up to [`ALLOC_ALIGN`]).
    span: usize,
    /// Orders this process's accesses to the range (copies on several streams).
    lock: RwLock<()>,
}

impl EmuMem {
    /// Runs `f` over the allocation's bytes under its read lock.
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let _guard = self.lock.read();
        // SAFETY: offset..offset+len lies inside the device mapping and belongs to
        // this allocation alone until it is dropped; the lock orders writers.
        f(unsafe {
            std::slice::from_raw_parts(
                self.device.memory.map.base().as_ptr().add(self.offset),
                self.len,
            )
        })
    }

    /// Runs `f` over the allocation's bytes under its write lock.
    fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let _guard = self.lock.write();
        // SAFETY: as in `with_bytes`, and the write lock makes the access exclusive
        // within this process (other processes only read, under a lease).
        f(unsafe {
            std::slice::from_raw_parts_mut(
                self.device.memory.map.base().as_ptr().add(self.offset),
                self.len,
            )
        })
    }
}

impl Drop for EmuMem {
    fn drop(&mut self) {
        if self.span > 0 {
            self.device.memory.release(self.offset, self.span);
        }
        self.device
            .allocated
            .fetch_sub(self.len as u64, Ordering::AcqRel);
    }
}

impl DeviceMemory for EmuMem {
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl EmulatedDevice {
    /// A device with `memory_limit` bytes of "device memory".
    ///
    /// Panics only if the process cannot create or map a memfd (out of descriptors or
    /// address space), which no test or daemon recovers from; [`Self::try_new`] reports
    /// it instead.
    pub fn new(memory_limit: u64) -> Self {
        match Self::try_new(memory_limit) {
            Ok(d) => d,
            Err(e) => panic!("emulated device: {e}"),
        }
    }

    /// A device with `memory_limit` bytes of "device memory", or why its memory could
    /// not be created.
    pub fn try_new(memory_limit: u64) -> Result<Self> {
        let mut id = [0u8; 16];
        random(&mut id)?;
        Ok(EmulatedDevice {
            peers: Mutex::new(HashMap::new()),
            shared: Arc::new(Shared {
                name: "emulated".to_string(),
                id,
                memory: Memory::new(memory_limit)?,
                limit: memory_limit,
                allocated: AtomicU64::new(0),
                next_id: AtomicU64::new(1),
                lost: AtomicBool::new(false),
                fail_allocs: AtomicU32::new(0),
                copy_budget: AtomicU64::new(u64::MAX),
            }),
        })
    }

    /// The id naming this device's memory in its IPC handles.
    pub fn memory_id(&self) -> [u8; 16] {
        self.shared.id
    }

    /// The memfd holding this device's memory and its size: what a client must receive
    /// (over a Unix socket) before it can open this device's handles.
    pub fn memory_fd(&self) -> (BorrowedFd<'_>, u64) {
        (
            self.shared.memory.map.fd().as_fd(),
            self.shared.memory.map.len() as u64,
        )
    }

    /// Client side: maps another emulated device's memory, received as `fd` (its
    /// [`Self::memory_fd`]) with its size and id, read-only, so handles naming `id` open
    /// on this device. The descriptor is closed once mapped.
    pub fn attach_peer(&self, fd: OwnedFd, size: u64, id: [u8; 16]) -> Result<()> {
        let size = usize::try_from(size).map_err(|_| GdsError::Ipc("peer size".into()))?;
        let len = NonZeroUsize::new(size).ok_or_else(|| GdsError::Ipc("empty peer".into()))?;
        // SAFETY: a read-only shared mapping of a sealed memfd (it cannot shrink under us).
        let base = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| sys(e, "mapping a peer device"))?;
        let peer = PeerMemory {
            base: base.cast(),
            size,
        };
        self.peers.lock().insert(id, Arc::new(peer));
        Ok(())
    }

    /// The peer memory a handle names, if attached.
    pub(crate) fn peer(&self, id: &[u8]) -> Option<Arc<PeerMemory>> {
        let id: [u8; 16] = id.try_into().ok()?;
        self.peers.lock().get(&id).cloned()
    }

    /// Fault injection: the next `n` allocations fail with `OutOfMemory`.
    pub fn fail_next_allocs(&self, n: u32) {
        self.shared.fail_allocs.store(n, Ordering::SeqCst);
    }

    /// Fault injection: the device is lost once `bytes` more bytes have been copied; the
    /// copy crossing that point moves only part of its bytes and fails.
    pub fn lose_after_bytes(&self, bytes: u64) {
        self.shared.copy_budget.store(bytes, Ordering::SeqCst);
    }

    /// Fault injection: the device is lost now.
    pub fn lose_now(&self) {
        self.shared.lost.store(true, Ordering::SeqCst);
    }

    /// Fault injection: flips one byte of device memory (a bit error the checksum must
    /// catch). Returns false if `buf` is not this device's or `offset` is out of range.
    pub fn corrupt_byte(&self, buf: &DeviceBuffer, offset: usize) -> bool {
        match mem_of(buf) {
            Ok(mem) if Arc::ptr_eq(&mem.device, &self.shared) => {
                mem.with_bytes_mut(|data| match data.get_mut(offset) {
                    Some(b) => {
                        *b ^= 0xff;
                        true
                    }
                    None => false,
                })
            }
            _ => false,
        }
    }

    /// Writes device memory synchronously (IPC import helper).
    pub(crate) fn write_raw(&self, src: &[u8], dst: &DeviceBuffer, dst_off: usize) -> Result<()> {
        dst.check_range(dst_off, src.len())?;
        self.shared.htod(src, dst, dst_off)
    }

    /// Reads device memory directly (test and IPC-export helper; not a timed path).
    pub fn read_raw(&self, buf: &DeviceBuffer) -> Result<Vec<u8>> {
        self.shared.check_lost()?;
        Ok(self.shared.own(buf)?.with_bytes(<[u8]>::to_vec))
    }

    /// Where an allocation of this device lies in its memfd (IPC export helper).
    pub(crate) fn offset_of(&self, buf: &DeviceBuffer) -> Result<u64> {
        Ok(self.shared.own(buf)?.offset as u64)
    }
}

/// Fills `buf` from the kernel's random source.
fn random(buf: &mut [u8]) -> Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(GdsError::Io)
}

fn mem_of(buf: &DeviceBuffer) -> Result<&EmuMem> {
    buf.memory()
        .as_any()
        .downcast_ref::<EmuMem>()
        .ok_or_else(|| GdsError::InvalidRange("buffer belongs to another device".into()))
}

impl Shared {
    /// The emulated allocation behind `buf`, if it is this device's.
    fn own<'a>(&self, buf: &'a DeviceBuffer) -> Result<&'a EmuMem> {
        let mem = mem_of(buf)?;
        if std::ptr::eq(Arc::as_ptr(&mem.device), self) {
            Ok(mem)
        } else {
            Err(GdsError::InvalidRange(
                "buffer belongs to another device".into(),
            ))
        }
    }

    fn check_lost(&self) -> Result<()> {
        if self.lost.load(Ordering::SeqCst) {
            Err(GdsError::DeviceLost(format!(
                "{} device was lost",
                self.name
            )))
        } else {
            Ok(())
        }
    }

    /// Charges `len` bytes against the injected copy budget; returns how many bytes the
    /// copy may move (fewer than `len` means the device is lost part-way).
    fn charge(&self, len: usize) -> usize {
        let len64 = len as u64;
        let before = self
            .copy_budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                Some(if b == u64::MAX {
                    b
                } else {
                    b.saturating_sub(len64)
                })
            })
            .unwrap_or(u64::MAX);
        if before >= len64 {
            len
        } else {
            self.lost.store(true, Ordering::SeqCst);
            before as usize
        }
    }

    fn lost_mid_transfer(&self, moved: usize, len: usize) -> GdsError {
        GdsError::DeviceLost(format!(
            "{} device lost mid-transfer after {moved} of {len} bytes",
            self.name
        ))
    }
}

impl CopyEngine for Shared {
    fn htod(&self, src: &[u8], dst: &DeviceBuffer, dst_off: usize) -> Result<()> {
        self.check_lost()?;
        let mem = self.own(dst)?;
        let n = self.charge(src.len());
        mem.with_bytes_mut(|data| {
            let out = data
                .get_mut(dst_off..dst_off + src.len())
                .ok_or_else(|| GdsError::InvalidRange("htod past the buffer end".into()))?;
            out[..n].copy_from_slice(&src[..n]);
            Ok::<_, GdsError>(())
        })?;
        if n < src.len() {
            return Err(self.lost_mid_transfer(n, src.len()));
        }
        Ok(())
    }

    fn dtoh(&self, src: &DeviceBuffer, src_off: usize, dst: &mut [u8]) -> Result<()> {
        self.check_lost()?;
        let mem = self.own(src)?;
        let n = self.charge(dst.len());
        mem.with_bytes(|data| {
            let inp = data
                .get(src_off..src_off + dst.len())
                .ok_or_else(|| GdsError::InvalidRange("dtoh past the buffer end".into()))?;
            dst[..n].copy_from_slice(&inp[..n]);
            Ok::<_, GdsError>(())
        })?;
        if n < dst.len() {
            return Err(self.lost_mid_transfer(n, dst.len()));
        }
        Ok(())
    }

    fn dtod(&self, copy: DeviceCopy<'_>) -> Result<()> {
        let DeviceCopy {
            src,
            src_off,
            dst,
            dst_off,
            len,
        } = copy;
        self.check_lost()?;
        let (s, d) = (self.own(src)?, self.own(dst)?);
        let n = self.charge(len);
        let bad = || GdsError::InvalidRange("dtod past a buffer end".into());
        if s.id == d.id {
            s.with_bytes_mut(|data| {
                if src_off.max(dst_off) + len > data.len() {
                    return Err(bad());
                }
                data.copy_within(src_off..src_off + n, dst_off);
                Ok(())
            })?;
        } else {
            if src_off + len > s.len || dst_off + len > d.len {
                return Err(bad());
            }
            // Lock in id order so two opposite copies on two streams cannot deadlock.
            let (_src_guard, _dst_guard);
            if s.id < d.id {
                _src_guard = s.lock.read();
                _dst_guard = d.lock.write();
            } else {
                _dst_guard = d.lock.write();
                _src_guard = s.lock.read();
            }
            let base = self.memory.map.base().as_ptr();
            // SAFETY: both ranges were checked inside their allocations, which are
            // disjoint ranges of the mapping; the locks above order the accesses.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    base.add(s.offset + src_off),
                    base.add(d.offset + dst_off),
                    n,
                );
            }
        }
        if n < len {
            return Err(self.lost_mid_transfer(n, len));
        }
        Ok(())
    }
}

impl Device for EmulatedDevice {
    fn retire(&self) {
        self.shared.memory.retired.store(true, Ordering::Release);
    }

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            kind: DeviceKind::Emulated,
            name: self.shared.name.clone(),
            ordinal: 0,
            memory_limit: self.shared.limit,
        }
    }

    fn allocated_bytes(&self) -> u64 {
        self.shared.allocated.load(Ordering::Acquire)
    }

    fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        self.shared.check_lost()?;
        let s = &self.shared;
        let oom = |available: u64| GdsError::OutOfMemory {
            requested: len as u64,
            available,
            limit: s.limit,
        };
        if s.fail_allocs
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(oom(s.limit.saturating_sub(self.allocated_bytes())));
        }
        let want = len as u64;
        s.allocated
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(want).filter(|&total| total <= s.limit)
            })
            .map_err(|used| oom(s.limit.saturating_sub(used)))?;
        let span = len.div_ceil(ALLOC_ALIGN) * ALLOC_ALIGN;
        let offset = if span == 0 {
            0
        } else {
            match s.memory.allocate(span) {
                Some(o) => o,
                None => {
                    // Address space too fragmented: as out of memory as a real device.
                    let used = s.allocated.fetch_sub(want, Ordering::AcqRel) - want;
                    return Err(oom(s.limit.saturating_sub(used)));
                }
            }
        };
        let mem = EmuMem {
            id: s.next_id.fetch_add(1, Ordering::Relaxed),
            device: s.clone(),
            offset,
            len,
            span,
            lock: RwLock::new(()),
        };
        // New memory reads zero: free ranges are kept zeroed (`Memory::release`).
        Ok(DeviceBuffer::new(Arc::new(mem)))
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer> {
        Ok(PinnedBuffer::new(Box::new(AlignedBuf::zeroed(len)?)))
    }

    fn new_stream(&self) -> Result<DeviceStream> {
        self.shared.check_lost()?;
        DeviceStream::spawn(self.shared.clone(), "strata-emu-stream")
    }

    fn is_lost(&self) -> bool {
        self.shared.lost.load(Ordering::SeqCst)
    }

    fn ipc(&self) -> Option<&dyn crate::ipc::IpcBackend> {
        Some(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(dev: &EmulatedDevice, bytes: &[u8]) -> PinnedBuffer {
        let mut p = dev.alloc_pinned(bytes.len()).expect("pinned");
        p.as_mut_slice().copy_from_slice(bytes);
        p
    }

    #[test]
    fn every_direction_round_trips() {
        let dev = EmulatedDevice::new(1 << 20);
        let stream = dev.new_stream().expect("stream");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let a = dev.alloc(data.len()).expect("alloc a");
        let b = dev.alloc(data.len()).expect("alloc b");
        let done = stream
            .htod(staged(&dev, &data), 0..data.len(), &a, 0)
            .wait();
        done.result.expect("htod");
        stream
            .dtod(DeviceCopy {
                src: &a,
                src_off: 0,
                dst: &b,
                dst_off: 0,
                len: data.len(),
            })
            .wait()
            .result
            .expect("dtod");
        let out = dev.alloc_pinned(data.len()).expect("pinned");
        let done = stream.dtoh(&b, 0, out, 0..data.len()).wait();
        done.result.expect("dtoh");
        assert_eq!(done.value.expect("buffer back").as_slice(), &data[..]);
    }

    #[test]
    fn allocation_limit_is_a_clean_error_and_freed_on_drop() {
        let dev = EmulatedDevice::new(1000);
        let a = dev.alloc(600).expect("first fits");
        assert!(matches!(
            dev.alloc(600),
            Err(GdsError::OutOfMemory {
                requested: 600,
                available: 400,
                limit: 1000
            })
        ));
        drop(a);
        assert_eq!(dev.allocated_bytes(), 0);
        dev.alloc(600).expect("fits after free");
        dev.fail_next_allocs(1);
        assert!(matches!(dev.alloc(1), Err(GdsError::OutOfMemory { .. })));
        dev.alloc(1).expect("injected failure is one-shot");
    }

    #[test]
    fn copies_on_one_stream_complete_in_order() {
        let dev = EmulatedDevice::new(1 << 20);
        let stream = dev.new_stream().expect("stream");
        let buf = dev.alloc(4).expect("alloc");
        // Two writes to the same bytes: the later submission must win.
        let p1 = stream.htod(staged(&dev, &[1, 1, 1, 1]), 0..4, &buf, 0);
        let p2 = stream.htod(staged(&dev, &[2, 2, 2, 2]), 0..4, &buf, 0);
        p2.wait().result.expect("second");
        p1.wait().result.expect("first");
        assert_eq!(dev.read_raw(&buf).expect("read"), vec![2, 2, 2, 2]);
    }

    #[test]
    fn device_lost_mid_transfer_fails_that_copy_and_all_later_calls() {
        let dev = EmulatedDevice::new(1 << 20);
        let stream = dev.new_stream().expect("stream");
        let buf = dev.alloc(1000).expect("alloc");
        dev.lose_after_bytes(300);
        let done = stream
            .htod(staged(&dev, &[7; 1000]), 0..1000, &buf, 0)
            .wait();
        let err = done.result.expect_err("must fail mid-transfer");
        assert!(err.is_device_lost(), "{err}");
        assert!(err.to_string().contains("300 of 1000"), "{err}");
        assert!(done.value.is_some(), "staging buffer comes back");
        assert!(dev.is_lost());
        assert!(matches!(dev.alloc(1), Err(GdsError::DeviceLost(_))));
        let copy = DeviceCopy {
            src: &buf,
            src_off: 0,
            dst: &buf,
            dst_off: 500,
            len: 10,
        };
        let done = stream.dtod(copy).wait();
        assert!(matches!(done.result, Err(GdsError::DeviceLost(_))));
    }

    #[test]
    fn reused_memory_reads_zero_and_freed_ranges_coalesce() {
        let dev = EmulatedDevice::new(1 << 20);
        let stream = dev.new_stream().expect("stream");
        // Sizes that leave partial pages at both ends of the ranges.
        for len in [5000usize, 300, 12_345] {
            let a = dev.alloc(len).expect("alloc");
            let done = stream
                .htod(staged(&dev, &vec![0xEE; len]), 0..len, &a, 0)
                .wait();
            done.result.expect("htod");
            drop(a);
            let b = dev.alloc(len).expect("realloc");
            assert_eq!(dev.read_raw(&b).expect("read"), vec![0; len], "len {len}");
        }
        assert_eq!(dev.allocated_bytes(), 0);
        assert_eq!(
            dev.shared.memory.free.lock().len(),
            1,
            "one free range again"
        );
    }

    #[test]
    fn out_of_range_copies_are_rejected_before_touching_memory() {
        let dev = EmulatedDevice::new(1 << 20);
        let stream = dev.new_stream().expect("stream");
        let buf = dev.alloc(8).expect("alloc");
        let done = stream.htod(staged(&dev, &[9; 16]), 0..16, &buf, 0).wait();
        assert!(matches!(done.result, Err(GdsError::InvalidRange(_))));
        assert_eq!(dev.read_raw(&buf).expect("read"), vec![0; 8]);
    }
}
