//! The host-emulated device: ordinary memory standing in for device memory, so every
//! path of the GPU tier runs (and is tested) on machines without a GPU.
//!
//! It keeps the real device's contract: allocations count against a byte limit and fail
//! cleanly beyond it; copies are asynchronous (run by a stream's worker thread, ordered
//! per stream); a lost device fails every later call. Faults can be injected for tests:
//! failing allocations, losing the device after a number of copied bytes (mid-transfer),
//! and flipping a byte of device memory (to exercise checksums).

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::device::{
    AlignedBuf, CopyEngine, Device, DeviceBuffer, DeviceCopy, DeviceInfo, DeviceKind, DeviceMemory,
    DeviceStream, PinnedBuffer,
};
use crate::error::{GdsError, Result};

/// Host memory acting as a device.
pub struct EmulatedDevice {
    shared: Arc<Shared>,
}

struct Shared {
    name: String,
    limit: u64,
    allocated: AtomicU64,
    next_id: AtomicU64,
    lost: AtomicBool,
    /// The next this-many allocations fail with `OutOfMemory`.
    fail_allocs: AtomicU32,
    /// Bytes that may still be copied before the device is lost (`u64::MAX`: never).
    copy_budget: AtomicU64,
}

struct EmuMem {
    id: u64,
    device: Arc<Shared>,
    data: RwLock<Box<[u8]>>,
}

impl Drop for EmuMem {
    fn drop(&mut self) {
        let len = self.data.get_mut().len() as u64;
        self.device.allocated.fetch_sub(len, Ordering::AcqRel);
    }
}

impl DeviceMemory for EmuMem {
    fn len(&self) -> usize {
        self.data.read().len()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl EmulatedDevice {
    /// A device with `memory_limit` bytes of "device memory".
    pub fn new(memory_limit: u64) -> Self {
        EmulatedDevice {
            shared: Arc::new(Shared {
                name: "emulated".to_string(),
                limit: memory_limit,
                allocated: AtomicU64::new(0),
                next_id: AtomicU64::new(1),
                lost: AtomicBool::new(false),
                fail_allocs: AtomicU32::new(0),
                copy_budget: AtomicU64::new(u64::MAX),
            }),
        }
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
                let mut data = mem.data.write();
                match data.get_mut(offset) {
                    Some(b) => {
                        *b ^= 0xff;
                        true
                    }
                    None => false,
                }
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
        Ok(self.shared.own(buf)?.data.read().to_vec())
    }
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
        let mut data = mem.data.write();
        let out = data
            .get_mut(dst_off..dst_off + src.len())
            .ok_or_else(|| GdsError::InvalidRange("htod past the buffer end".into()))?;
        out[..n].copy_from_slice(&src[..n]);
        if n < src.len() {
            return Err(self.lost_mid_transfer(n, src.len()));
        }
        Ok(())
    }

    fn dtoh(&self, src: &DeviceBuffer, src_off: usize, dst: &mut [u8]) -> Result<()> {
        self.check_lost()?;
        let mem = self.own(src)?;
        let n = self.charge(dst.len());
        let data = mem.data.read();
        let inp = data
            .get(src_off..src_off + dst.len())
            .ok_or_else(|| GdsError::InvalidRange("dtoh past the buffer end".into()))?;
        dst[..n].copy_from_slice(&inp[..n]);
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
            let mut data = s.data.write();
            if src_off.max(dst_off) + len > data.len() {
                return Err(bad());
            }
            data.copy_within(src_off..src_off + n, dst_off);
        } else {
            // Lock in id order so two opposite copies on two streams cannot deadlock.
            let (src_guard, mut dst_guard);
            if s.id < d.id {
                src_guard = s.data.read();
                dst_guard = d.data.write();
            } else {
                dst_guard = d.data.write();
                src_guard = s.data.read();
            }
            let inp = src_guard.get(src_off..src_off + len).ok_or_else(bad)?;
            let out = dst_guard.get_mut(dst_off..dst_off + len).ok_or_else(bad)?;
            out[..n].copy_from_slice(&inp[..n]);
        }
        if n < len {
            return Err(self.lost_mid_transfer(n, len));
        }
        Ok(())
    }
}

impl Device for EmulatedDevice {
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
        let mem = EmuMem {
            id: s.next_id.fetch_add(1, Ordering::Relaxed),
            device: s.clone(),
            data: RwLock::new(vec![0u8; len].into_boxed_slice()),
        };
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
    fn out_of_range_copies_are_rejected_before_touching_memory() {
        let dev = EmulatedDevice::new(1 << 20);
        let stream = dev.new_stream().expect("stream");
        let buf = dev.alloc(8).expect("alloc");
        let done = stream.htod(staged(&dev, &[9; 16]), 0..16, &buf, 0).wait();
        assert!(matches!(done.result, Err(GdsError::InvalidRange(_))));
        assert_eq!(dev.read_raw(&buf).expect("read"), vec![0; 8]);
    }
}
