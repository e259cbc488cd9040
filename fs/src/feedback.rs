//! What became of the mount's cross-file prefetches, reported back to the predictor
//! that asked for them ([`strata_prefetch::Feedback`]), so its depth and per-epoch pool
//! adapt to the accuracy measured *through the mount*, as they do in the replay.
//!
//! The cache core's engine has no per-key "first demand hit" or "evicted" callback, so
//! the fate of a prefetched file is observed from the file system's side:
//! - **Used**: the first demand read of an open of that path (the core sees every
//!   open's first read; a read while the prefetch is still in flight counts too: the
//!   prediction was right and part of the latency was hidden);
//! - **Wasted**: the prefetch completed, and later its first block is in no tier any
//!   more (`CacheEngine::contains`) while nobody read it: evicted unread. Found by a
//!   sweep that checks a few tracked entries per predictor access, rotating through
//!   them, so each outstanding prefetch is checked about once every
//!   `len / SWEEP_PER_CALL` accesses without a timer or a scan of the whole ledger.
//!
//! A prefetch that is neither read nor evicted stays outstanding (nothing is known yet);
//! beyond [`PrefetchLedger::MAX_TRACKED`] the oldest is forgotten unreported.
//!
//! Pure bookkeeping: the cache check is passed in as a closure, no I/O, no clock.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use strata_cache_core::{CacheKey, JobId};

#[derive(Clone, Debug)]
struct Tracked {
    job: JobId,
    bytes: u64,
    /// The first block's key once the prefetch completed; None while in flight.
    filled: Option<CacheKey>,
}

/// One reported outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub job: JobId,
    pub path: Arc<str>,
    pub bytes: u64,
}

/// Outstanding cross-file prefetches. See the module doc.
#[derive(Debug, Default)]
pub struct PrefetchLedger {
    map: HashMap<Arc<str>, Tracked>,
    /// Paths in sweep order (issue order, rotated by sweeps). May hold paths no longer
    /// in `map` (used or forgotten): they are skipped and dropped when reached.
    order: VecDeque<Arc<str>>,
}

impl PrefetchLedger {
    /// Outstanding prefetches tracked at most: 64Ki (the semantic predictor remembers
    /// as many issued requests; a few MiB).
    pub const MAX_TRACKED: usize = 1 << 16;
    /// Entries checked per sweep: 16 (16 cache lookups, ~1 µs, per predicted access).
    pub const SWEEP_PER_CALL: usize = 16;

    pub fn new() -> Self {
        Self::default()
    }

    /// Outstanding prefetches.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// A prefetch of `bytes` of `path` for `job` is about to be issued: true if it is
    /// new; false if one is already outstanding (that one keeps its entry: one outcome
    /// per file, and the caller need not fetch again).
    pub fn issued(&mut self, path: Arc<str>, job: JobId, bytes: u64) -> bool {
        if self.map.contains_key(&path) {
            return false;
        }
        while self.map.len() >= Self::MAX_TRACKED {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        self.map.insert(
            path.clone(),
            Tracked {
                job,
                bytes,
                filled: None,
            },
        );
        self.order.push_back(path);
        self.compact();
        true
    }

    /// The prefetch of `path` completed; `first_block` is the key the sweep checks.
    pub fn filled(&mut self, path: &str, first_block: CacheKey) {
        if let Some(t) = self.map.get_mut(path) {
            t.filled = Some(first_block);
        }
    }

    /// The prefetch of `path` was not made (the path vanished, the store failed, or
    /// the file was cached already, which the replay does not count as a prefetch
    /// either): no outcome. False if it was no longer outstanding (a demand read
    /// reported it used meanwhile).
    pub fn forget(&mut self, path: &str) -> bool {
        self.map.remove(path).is_some()
    }

    /// A demand read of `path`: the outcome `Used`, if a prefetch of it was outstanding.
    pub fn demand(&mut self, path: &str) -> Option<Outcome> {
        let (path, t) = self.map.remove_entry(path)?;
        Some(Outcome {
            job: t.job,
            path,
            bytes: t.bytes,
        })
    }

    /// Checks up to [`Self::SWEEP_PER_CALL`] outstanding entries; returns those whose
    /// completed prefetch is no longer cached (`cached(key)` false): `Wasted`.
    pub fn sweep(&mut self, cached: impl Fn(&CacheKey) -> bool) -> Vec<Outcome> {
        let mut wasted = Vec::new();
        for _ in 0..Self::SWEEP_PER_CALL.min(self.order.len()) {
            let Some(path) = self.order.pop_front() else {
                break;
            };
            let Some(t) = self.map.get(&path) else {
                continue; // used or forgotten: drop its slot
            };
            match &t.filled {
                Some(key) if !cached(key) => {
                    if let Some((path, t)) = self.map.remove_entry(&path) {
                        wasted.push(Outcome {
                            job: t.job,
                            path,
                            bytes: t.bytes,
                        });
                    }
                }
                _ => self.order.push_back(path),
            }
        }
        wasted
    }

    /// Drops stale slots when the order outgrows the map by 2x (amortised O(1)).
    fn compact(&mut self) {
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order.retain(|p| map.contains_key(p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: &str) -> CacheKey {
        CacheKey::file(Arc::from(p), Arc::from("v1"), 0)
    }

    fn p(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn a_demand_read_reports_used_once() {
        let mut l = PrefetchLedger::new();
        assert!(l.issued(p("a"), JobId(3), 100));
        assert!(
            !l.issued(p("a"), JobId(4), 999),
            "outstanding: kept as first issued"
        );
        assert_eq!(l.len(), 1);
        let o = l.demand("a").expect("outstanding");
        assert_eq!((o.job, &*o.path, o.bytes), (JobId(3), "a", 100));
        assert_eq!(l.demand("a"), None, "one outcome per prefetch");
        assert_eq!(l.demand("never"), None);
    }

    #[test]
    fn a_read_while_in_flight_counts_as_used() {
        let mut l = PrefetchLedger::new();
        l.issued(p("a"), JobId(1), 10);
        assert!(l.sweep(|_| false).is_empty(), "in flight: not wasted");
        assert!(l.demand("a").is_some());
    }

    #[test]
    fn evicted_unread_is_wasted_and_cached_is_not() {
        let mut l = PrefetchLedger::new();
        for name in ["a", "b", "c"] {
            l.issued(p(name), JobId(1), 10);
            l.filled(name, key(name));
        }
        let evicted = key("b");
        let w = l.sweep(|k| *k != evicted);
        assert_eq!(w.len(), 1);
        assert_eq!(&*w[0].path, "b");
        assert_eq!(l.len(), 2);
        // Nothing else evicted: later sweeps report nothing, and "a" can still be used.
        assert!(l.sweep(|_| true).is_empty());
        assert!(l.demand("a").is_some());
        assert!(l.demand("b").is_none(), "already reported wasted");
    }

    /// The sweep rotates: an entry deep in the ledger is reached within
    /// len / SWEEP_PER_CALL calls even when the front stays cached.
    #[test]
    fn the_sweep_reaches_every_entry() {
        let mut l = PrefetchLedger::new();
        let n = 10 * PrefetchLedger::SWEEP_PER_CALL;
        for i in 0..n {
            let name = format!("f{i}");
            l.issued(p(&name), JobId(1), 1);
            l.filled(&name, key(&name));
        }
        let gone = key(&format!("f{}", n - 1));
        let mut calls = 0;
        let mut found = Vec::new();
        while found.is_empty() {
            found = l.sweep(|k| *k != gone);
            calls += 1;
            assert!(calls <= 10, "not reached after {calls} sweeps");
        }
        assert_eq!(calls, 10);
        assert_eq!(&*found[0].path, format!("f{}", n - 1));
    }

    #[test]
    fn forgotten_and_used_slots_are_skipped_and_the_ledger_is_bounded() {
        let mut l = PrefetchLedger::new();
        l.issued(p("x"), JobId(1), 1);
        assert!(l.forget("x"));
        assert!(!l.forget("x"));
        assert!(l.sweep(|_| false).is_empty());
        assert!(l.is_empty());
        for i in 0..PrefetchLedger::MAX_TRACKED + 10 {
            let name = format!("g{i}");
            l.issued(p(&name), JobId(1), 1);
            if i % 2 == 0 {
                l.demand(&name);
            }
        }
        assert!(l.len() <= PrefetchLedger::MAX_TRACKED);
        assert!(
            l.order.len() <= 2 * l.map.len() + 64 + 1,
            "{}",
            l.order.len()
        );
    }
}
