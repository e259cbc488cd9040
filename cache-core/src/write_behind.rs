//! The bytes of file-block copies being written to a persistent level behind the
//! reader, and their bound.
//!
//! A file block fetched from the store (or demoted from memory) is only a copy: the
//! store still holds it. Its disk write used to run in the reader's path whenever the
//! memory level did not keep the block (refused it, or pushed a victim down): with the
//! cache on a disk slower than the store, cold reads ran at the disk's write speed
//! (four readers of 200 MB with a 32 MiB memory tier and the cache disk throttled to
//! 10 MB/s: 84 s, against 2.3 s with the disk free). And where the memory level did keep
//! it, the write ran in a task nothing bounded: the same readers with a 1 GiB tier held
//! 1.45 GB resident while the disk caught up (round 17's own probe).
//!
//! So such writes run behind the reader, within a byte bound: a write that finds the
//! bound taken is shed (the copy is not made; the next read of the block refetches it),
//! counted in `writes_shed`. A disk as fast as the store never meets the bound; a
//! slower one keeps what it can write and the reader goes at the store's speed. Explicit
//! puts and KV blocks (no store holds them) never go behind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The bound on bytes written behind readers, and what is taken of it now.
#[derive(Debug)]
pub(crate) struct WriteBehind {
    pending: Arc<AtomicU64>,
    cap: u64,
}

/// Bytes of one write behind; given back when dropped (the write done, failed or
/// cancelled).
#[derive(Debug)]
pub(crate) struct Pending {
    pending: Arc<AtomicU64>,
    bytes: u64,
}

impl WriteBehind {
    /// The default bound for an engine whose fastest level holds `fastest` bytes: a
    /// quarter of it (the bytes wait in memory beside it, as the fetch window's do),
    /// at least 16 MiB (a burst of a reader's fetch window, 16 MiB at the least, is not shed at once) and at most
    /// 256 MiB (a quarter of the default 1 GiB memory tier).
    pub(crate) fn default_cap(fastest: u64) -> u64 {
        (fastest / 4).clamp(16 << 20, 256 << 20)
    }

    pub(crate) fn new(cap: u64) -> Self {
        WriteBehind {
            pending: Arc::new(AtomicU64::new(0)),
            cap,
        }
    }

    /// Takes `bytes` of the bound, or None when they do not fit. One write always fits
    /// when none is pending, so a block larger than the bound is still written.
    pub(crate) fn try_take(&self, bytes: u64) -> Option<Pending> {
        let mut now = self.pending.load(Ordering::Relaxed);
        loop {
            if now > 0 && now.saturating_add(bytes) > self.cap {
                return None;
            }
            match self.pending.compare_exchange_weak(
                now,
                now + bytes,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Pending {
                        pending: self.pending.clone(),
                        bytes,
                    })
                }
                Err(seen) => now = seen,
            }
        }
    }

    /// Bytes written behind now.
    pub(crate) fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.pending.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::WriteBehind;
    use proptest::prelude::*;

    #[test]
    fn the_default_cap_is_a_quarter_of_the_fastest_level_within_bounds() {
        assert_eq!(WriteBehind::default_cap(32 << 20), 16 << 20);
        assert_eq!(WriteBehind::default_cap(256 << 20), 64 << 20);
        assert_eq!(WriteBehind::default_cap(1 << 30), 256 << 20);
        assert_eq!(WriteBehind::default_cap(64 << 30), 256 << 20);
        assert_eq!(WriteBehind::default_cap(0), 16 << 20);
    }

    #[test]
    fn writes_past_the_cap_are_refused_until_one_is_given_back() {
        let wb = WriteBehind::new(3);
        let a = wb.try_take(2).expect("fits");
        assert!(wb.try_take(2).is_none());
        let b = wb.try_take(1).expect("fits exactly");
        assert_eq!(wb.pending(), 3);
        drop(a);
        assert_eq!(wb.pending(), 1);
        assert!(wb.try_take(2).is_some());
        drop(b);
        // One write larger than the cap goes when nothing else is pending.
        assert!(wb.try_take(10).is_some());
        assert_eq!(wb.pending(), 0);
    }

    proptest! {
        #[test]
        fn pending_never_passes_the_cap_but_for_a_lone_write(
            cap in 1u64..64,
            ops in proptest::collection::vec((any::<bool>(), 1u64..32), 1..100),
        ) {
            let wb = WriteBehind::new(cap);
            let mut held = Vec::new();
            for (take, n) in ops {
                if take {
                    let before = wb.pending();
                    match wb.try_take(n) {
                        Some(p) => {
                            prop_assert!(before == 0 || before + n <= cap);
                            held.push(p);
                        }
                        None => prop_assert!(before > 0 && before + n > cap),
                    }
                } else if !held.is_empty() {
                    held.remove(n as usize % held.len());
                }
                let sum: u64 = held.iter().map(|p| p.bytes).sum();
                prop_assert_eq!(wb.pending(), sum);
            }
        }
    }
}
