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
//!
//! The bound follows the disk: it starts at 16 MiB, grows by a quarter with each write
//! that took under 250 ms from its admission to its end, up to its ceiling (a quarter of
//! the fastest level, at most 256 MiB), and halves with each that took over a second,
//! down to 4 MiB. Bytes handed to the kernel's direct I/O cannot be taken back: a bound
//! of a quarter of the tier on a 4 MB/s disk held the cache dir ~30 s after a stop (a
//! restart refused meanwhile), and its bytes pushed a daemon in a 128 MiB cgroup past
//! its limit (round 17b). Such a disk keeps about a second of writes queued.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The least the bound falls to: 4 MiB, a few blocks in flight on any disk.
const FLOOR: u64 = 4 << 20;
/// Where the bound starts: 16 MiB (a reader's fetch window at the least), grown from
/// there on a disk that keeps up.
const START: u64 = 16 << 20;
/// A write admitted and done within this is quick: the bound grows by a quarter.
const QUICK: Duration = Duration::from_millis(250);
/// A write that took longer than this waited on a disk behind: the bound halves.
const SLOW: Duration = Duration::from_secs(1);

/// The bound on bytes written behind readers, and what is taken of it now.
#[derive(Debug)]
pub(crate) struct WriteBehind {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    pending: AtomicU64,
    /// The bound now, within `FLOOR.min(ceiling)..=ceiling`.
    cap: AtomicU64,
    ceiling: u64,
}

/// Bytes of one write behind; given back when dropped (the write done, failed or
/// cancelled), the time it took since its admission moving the bound.
#[derive(Debug)]
pub(crate) struct Pending {
    shared: Arc<Shared>,
    bytes: u64,
    taken: Instant,
}

impl WriteBehind {
    /// The default ceiling for an engine whose fastest level holds `fastest` bytes: a
    /// quarter of it (the bytes wait in memory beside it, as the fetch window's do),
    /// at least 16 MiB and at most 256 MiB (a quarter of the default 1 GiB memory tier).
    pub(crate) fn default_cap(fastest: u64) -> u64 {
        (fastest / 4).clamp(16 << 20, 256 << 20)
    }

    /// A bound of at most `ceiling` bytes, starting at 16 MiB (or the ceiling if lower).
    pub(crate) fn new(ceiling: u64) -> Self {
        WriteBehind {
            shared: Arc::new(Shared {
                pending: AtomicU64::new(0),
                cap: AtomicU64::new(START.min(ceiling)),
                ceiling,
            }),
        }
    }

    /// Takes `bytes` of the bound, or None when they do not fit. One write always fits
    /// when none is pending, so a block larger than the bound is still written.
    pub(crate) fn try_take(&self, bytes: u64) -> Option<Pending> {
        let cap = self.shared.cap.load(Ordering::Relaxed);
        let mut now = self.shared.pending.load(Ordering::Relaxed);
        loop {
            if now > 0 && now.saturating_add(bytes) > cap {
                return None;
            }
            match self.shared.pending.compare_exchange_weak(
                now,
                now + bytes,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Pending {
                        shared: self.shared.clone(),
                        bytes,
                        taken: Instant::now(),
                    })
                }
                Err(seen) => now = seen,
            }
        }
    }

    /// Bytes written behind now.
    pub(crate) fn pending(&self) -> u64 {
        self.shared.pending.load(Ordering::Relaxed)
    }

    /// The bound now.
    #[cfg(test)]
    fn cap(&self) -> u64 {
        self.shared.cap.load(Ordering::Relaxed)
    }
}

impl Shared {
    /// A write behind took `took` from its admission to its end: the bound moves.
    fn note(&self, took: Duration) {
        let floor = FLOOR.min(self.ceiling);
        let _ = self
            .cap
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |cap| {
                if took > SLOW {
                    Some((cap / 2).max(floor))
                } else if took < QUICK {
                    Some((cap + cap / 4).min(self.ceiling))
                } else {
                    None
                }
            });
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.shared.pending.fetch_sub(self.bytes, Ordering::AcqRel);
        self.shared.note(self.taken.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_default_ceiling_is_a_quarter_of_the_fastest_level_within_bounds() {
        assert_eq!(WriteBehind::default_cap(32 << 20), 16 << 20);
        assert_eq!(WriteBehind::default_cap(256 << 20), 64 << 20);
        assert_eq!(WriteBehind::default_cap(1 << 30), 256 << 20);
        assert_eq!(WriteBehind::default_cap(64 << 30), 256 << 20);
        assert_eq!(WriteBehind::default_cap(0), 16 << 20);
    }

    #[test]
    fn writes_past_the_bound_are_refused_until_one_is_given_back() {
        let wb = WriteBehind::new(3);
        let a = wb.try_take(2).expect("fits");
        assert!(wb.try_take(2).is_none());
        let b = wb.try_take(1).expect("fits exactly");
        assert_eq!(wb.pending(), 3);
        drop(a);
        assert_eq!(wb.pending(), 1);
        assert!(wb.try_take(2).is_some());
        drop(b);
        // One write larger than the bound goes when nothing else is pending.
        assert!(wb.try_take(10).is_some());
        assert_eq!(wb.pending(), 0);
    }

    #[test]
    fn the_bound_grows_on_a_quick_disk_and_halves_on_a_slow_one() {
        let wb = WriteBehind::new(256 << 20);
        assert_eq!(wb.cap(), 16 << 20, "starts at 16 MiB");
        for _ in 0..20 {
            wb.shared.note(Duration::from_millis(5));
        }
        assert_eq!(wb.cap(), 256 << 20, "a quick disk reaches the ceiling");
        wb.shared.note(Duration::from_millis(500));
        assert_eq!(wb.cap(), 256 << 20, "neither quick nor slow: unchanged");
        for _ in 0..20 {
            wb.shared.note(Duration::from_secs(3));
        }
        assert_eq!(wb.cap(), 4 << 20, "a slow disk: down to the floor");
        // A ceiling under the floor holds.
        let small = WriteBehind::new(1 << 20);
        small.shared.note(Duration::from_secs(3));
        assert_eq!(small.cap(), 1 << 20);
    }

    proptest! {
        #[test]
        fn pending_never_passes_the_bound_but_for_a_lone_write(
            cap in 1u64..64,
            ops in proptest::collection::vec((any::<bool>(), 1u64..32), 1..100),
        ) {
            let wb = WriteBehind::new(cap);
            let mut held = Vec::new();
            for (take, n) in ops {
                if take {
                    let before = wb.pending();
                    let bound = wb.cap();
                    match wb.try_take(n) {
                        Some(p) => {
                            prop_assert!(before == 0 || before + n <= bound);
                            held.push(p);
                        }
                        None => prop_assert!(before > 0 && before + n > bound),
                    }
                } else if !held.is_empty() {
                    held.remove(n as usize % held.len());
                }
                let sum: u64 = held.iter().map(|p| p.bytes).sum();
                prop_assert_eq!(wb.pending(), sum);
                prop_assert!(wb.cap() <= cap);
            }
        }
    }
}
