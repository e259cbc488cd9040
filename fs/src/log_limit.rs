//! A bound on the warnings a stream of failing requests writes: a reader looping on
//! a stale handle or a failing store must not fill the disk with the log (black-box
//! finding: one reader retrying ESTALE wrote two lines per read, ~10 MB/s into
//! `mount.log`). At most [`PER_SECOND`] such lines a second, process-wide; the first
//! line of a later second says how many were left out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Warnings of failed requests logged per second: enough to see every distinct
/// failure of an ordinary burst, too few to matter on disk (~2 KB/s).
pub const PER_SECOND: u64 = 20;

/// One budget's counters (the process has one; tests make their own).
struct Budget {
    second: AtomicU64,
    used: AtomicU64,
    dropped: AtomicU64,
}

static BUDGET: Budget = Budget::new();

fn now_secs() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs()
}

/// Whether a warning may be logged now: `Some(n)` with the lines left out since the
/// last one logged (0 mostly), or None to leave this one out.
pub fn admit() -> Option<u64> {
    BUDGET.admit_at(now_secs())
}

impl Budget {
    const fn new() -> Self {
        Budget {
            second: AtomicU64::new(u64::MAX),
            used: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    fn admit_at(&self, now: u64) -> Option<u64> {
        let second = self.second.load(Ordering::Relaxed);
        if second != now
            && self
                .second
                .compare_exchange(second, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.used.store(1, Ordering::Relaxed);
            return Some(self.dropped.swap(0, Ordering::AcqRel));
        }
        if self.used.fetch_add(1, Ordering::Relaxed) < PER_SECOND {
            Some(0)
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_cut_to_the_budget_and_its_size_told_next_second() {
        let b = Budget::new();
        let admitted = (0..1000).filter(|_| b.admit_at(7).is_some()).count() as u64;
        assert_eq!(admitted, PER_SECOND);
        assert_eq!(b.admit_at(8), Some(1000 - PER_SECOND));
        assert_eq!(b.admit_at(8), Some(0));
    }
}
