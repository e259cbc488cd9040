//! A bounded pool of pinned staging buffers.
//!
//! Pinned (page-locked) allocations are slow on CUDA (milliseconds) and limited by the
//! OS, so staging buffers are allocated once and reused. A transfer takes its whole set
//! of `depth` buffers at once: taking them one by one could deadlock two transfers that
//! each hold one buffer and wait for a second.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::device::{Device, PinnedBuffer};
use crate::error::Result;

pub struct PinnedPool {
    device: Arc<dyn Device>,
    chunk: usize,
    max_buffers: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
}

struct PoolState {
    free: Vec<PinnedBuffer>,
    /// Buffers that exist (free or taken) plus those being allocated.
    total: usize,
}

impl PinnedPool {
    /// A pool of at most `max_buffers` buffers of `chunk` bytes, allocated on demand.
    pub fn new(device: Arc<dyn Device>, chunk: usize, max_buffers: usize) -> Self {
        PinnedPool {
            device,
            chunk,
            max_buffers: max_buffers.max(1),
            state: Mutex::new(PoolState {
                free: Vec::new(),
                total: 0,
            }),
            freed: Condvar::new(),
        }
    }

    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Takes `n` buffers (at most the pool size), waiting for others to give theirs back.
    /// Every buffer taken must come back through [`Self::give`] (as a buffer, or counted
    /// as `lost`): one dropped silently keeps its slot and shrinks the pool for good.
    pub fn take(&self, n: usize) -> Result<Vec<PinnedBuffer>> {
        let n = n.clamp(1, self.max_buffers);
        let mut state = self.state.lock();
        loop {
            let missing = n.saturating_sub(state.free.len());
            if missing == 0 {
                let at = state.free.len() - n;
                return Ok(state.free.split_off(at));
            }
            if state.total + missing <= self.max_buffers {
                state.total += missing;
                let mut got: Vec<PinnedBuffer> =
                    (0..n - missing).filter_map(|_| state.free.pop()).collect();
                drop(state);
                // Allocate outside the lock: a pinned allocation can take milliseconds.
                for i in 0..missing {
                    match self.device.alloc_pinned(self.chunk) {
                        Ok(b) => got.push(b),
                        Err(e) => {
                            let mut state = self.state.lock();
                            state.total -= missing - i;
                            state.free.append(&mut got);
                            drop(state);
                            self.freed.notify_all();
                            return Err(e);
                        }
                    }
                }
                return Ok(got);
            }
            self.freed.wait(&mut state);
        }
    }

    /// Returns buffers; `lost` counts buffers taken but never coming back (a copy whose
    /// worker died), so replacements can be allocated.
    pub fn give(&self, bufs: Vec<PinnedBuffer>, lost: usize) {
        let mut state = self.state.lock();
        state.free.extend(bufs);
        state.total -= lost.min(state.total);
        drop(state);
        self.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulated::EmulatedDevice;

    #[test]
    fn sets_are_bounded_reused_and_replaced_when_lost() {
        let pool = Arc::new(PinnedPool::new(Arc::new(EmulatedDevice::new(0)), 4096, 3));
        let a = pool.take(2).expect("two");
        assert_eq!(a.len(), 2);
        let addr = a[0].as_slice().as_ptr();
        // Only one more exists; a second set of two must wait for the first.
        let p2 = pool.clone();
        let waiter = std::thread::spawn(move || {
            let got = p2.take(2).expect("after give");
            let n = got.len();
            p2.give(got, 0);
            n
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiter.is_finished(), "pool must not exceed 3 buffers");
        pool.give(a, 0);
        assert_eq!(waiter.join().expect("join"), 2);
        // Buffers come back for reuse (no new allocation): the same memory shows up.
        let all = pool.take(3).expect("three");
        assert!(all.iter().any(|b| b.as_slice().as_ptr() == addr));
        // Two lost (never returned): replacements are allocated on the next take.
        pool.give(all.into_iter().take(1).collect(), 2);
        assert_eq!(pool.take(3).expect("replaced").len(), 3);
        // Asking for more than the pool holds is clamped, not a deadlock.
        let pool = PinnedPool::new(Arc::new(EmulatedDevice::new(0)), 4096, 2);
        assert_eq!(pool.take(5).expect("clamped").len(), 2);
    }
}
