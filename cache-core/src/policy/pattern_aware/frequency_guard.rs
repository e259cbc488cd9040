//! The frequency guard: how far the pattern-aware policy may fall behind ranking by
//! frequency.
//!
//! The policy keeps scan data (streams classified sequential or random) by recency and
//! a hash sample, and ranks only skewed streams by frequency. Popularity can hide from
//! the per-stream tests: held-out `lora` loads adapters whole, each read a sequential
//! run, with Zipf popularity across files the files stream sees only after hundreds of
//! loads; held-out `mixture` draws 32 KiB records uniformly within each shard, and the
//! skew is across directories (a data mixture's weights). There W-TinyLFU hit 0.49 /
//! 0.55 of requests at 10% against the policy's 0.33 / 0.45. So, as the recency guard
//! watches LRU, this guard watches a shadow W-TinyLFU
//! ([`super::shadow_tinylfu::ShadowTinyLfu`], sampled as the shadow LRU is) on every
//! demand read, with the same sign test on the reads where exactly one of the two hit
//! ([`super::guard_period`]). When the shadow is significantly ahead, every stream's
//! data is ranked by frequency (its retention taken as skewed: the window and the
//! frequency main, whose admission contest is TinyLFU's) for a period of cache
//! turnovers; then the policy's own rules are tried again, each period twice as long as
//! the last while the trial keeps losing at once. A workload the pattern rules suit
//! (scans, epochs over more than the cache, where a frequency shadow gains nothing) never
//! pays: the test does not reject.

use super::binomial::SignTest;
use super::guard_period::{GuardPeriod, ALPHA};
use super::shadow_tinylfu::ShadowTinyLfu;

/// See the module docs.
pub(super) struct FrequencyGuard {
    shadow: ShadowTinyLfu,
    /// Discordant reads against the shadow, and the frequency period: every stream
    /// ranked by frequency while it lasts.
    pub(super) period: GuardPeriod,
    cap: u64,
}

impl FrequencyGuard {
    pub(super) fn new(cap: u64) -> Self {
        let mut g = FrequencyGuard {
            shadow: ShadowTinyLfu::new(0),
            period: GuardPeriod::new(0),
            cap: 0,
        };
        g.set_capacity(cap);
        g
    }

    /// The cache's capacity changed (or became known): the shadow follows it.
    pub(super) fn set_capacity(&mut self, cap: u64) {
        if cap == self.cap {
            return;
        }
        self.cap = cap;
        self.period.set_capacity(cap);
        self.shadow.set_capacity(cap);
    }

    /// Whether every stream is ranked by frequency now.
    pub(super) fn frequency_period(&self) -> bool {
        self.period.active()
    }

    /// A demand read of the item of hash `h` (`size` bytes) that the policy's cache hit
    /// (`policy_hit`) or missed.
    pub(super) fn on_demand(&mut self, h: u64, size: u64, policy_hit: bool, test: &mut SignTest) {
        if !policy_hit {
            self.period.on_miss(size);
        }
        if !self.shadow.sampled(h) {
            return;
        }
        let shadow_hit = self.shadow.touch(h, size);
        if self.period.active() || shadow_hit == policy_hit {
            return;
        }
        self.period.vote(shadow_hit, ALPHA, test);
    }
}

#[cfg(test)]
mod tests {
    use super::super::guard_period::MIN_VOTES;
    use super::*;

    fn h(i: u64) -> u64 {
        crate::stream::mix64(i + 1)
    }

    /// A hot set of 4 blocks read between blocks read once, in an 8-block cache: the
    /// shadow keeps the hot set through the one-time reads. A policy that misses the hot
    /// blocks (as a recency queue the one-time reads wash out does) is behind; one that
    /// hits them never is.
    #[test]
    fn a_policy_that_loses_a_hot_set_to_one_time_reads_starts_a_frequency_period() {
        let mb = 1 << 20;
        let mut test = SignTest::default();
        let mut behind = FrequencyGuard::new(8 * mb);
        let mut ahead = FrequencyGuard::new(8 * mb);
        let mut first = None;
        for i in 0..400u64 {
            let key = if i % 2 == 0 {
                h(i / 2 % 4)
            } else {
                h(1000 + i)
            };
            let hot = i % 2 == 0 && i >= 8;
            behind.on_demand(key, mb, false, &mut test);
            ahead.on_demand(key, mb, hot, &mut test);
            if behind.frequency_period() && first.is_none() {
                first = Some(i);
            }
        }
        let first = first.expect("the guard engaged");
        assert!(first < 8 + 4 * MIN_VOTES, "engaged at read {first}");
        assert!(!ahead.frequency_period());
        assert_eq!(ahead.period.engaged, 0);
    }

    /// A loop over twice the cache: the shadow's main keeps the keys it admitted first
    /// (none of the rest is counted more often), so it hits a fixed subset as a hash
    /// sample does; a policy that keeps as much of the loop as the cache holds is never
    /// behind.
    #[test]
    fn a_loop_over_more_than_the_cache_never_engages() {
        let mb = 1 << 20;
        let mut test = SignTest::default();
        let mut g = FrequencyGuard::new(8 * mb);
        for i in 0..2000u64 {
            let k = i % 16;
            g.on_demand(h(k), mb, k < 8, &mut test);
        }
        assert_eq!(g.period.engaged, 0);
    }
}
