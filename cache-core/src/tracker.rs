//! The engine-owned access tracker: the access-stream tree ([`crate::stream`]) and its
//! hypothesis tests ([`crate::classify`]), fed exactly once per demand access, whatever
//! the eviction policy.
//!
//! Before it existed the tree lived inside the pattern-aware policy: with `policy = "lru"`
//! nothing was classified, every tier level built a tree of its own, and a demotion was
//! observed by the lower level as if the job had read the victim. Now the
//! [`crate::hierarchy::Hierarchy`] observes each demand access here when it arrives,
//! writes the result into [`AccessContext::obs`], and every policy and predictor reads
//! that; prefetch fills, promotions and demotions carry no observation.
//!
//! Pure logic, no I/O, no clock (time arrives in the context).

use crate::access::AccessContext;
use crate::key::CacheKey;
use crate::pattern::Pattern;
use crate::stream::{Observation, StreamReport, StreamTree, TreeConfig};

/// Streams, their patterns and the evidence behind them. See the module docs.
pub struct AccessTracker {
    tree: StreamTree,
    observed: u64,
}

impl Default for AccessTracker {
    fn default() -> Self {
        Self::new(TreeConfig::default())
    }
}

impl AccessTracker {
    pub fn new(cfg: TreeConfig) -> Self {
        AccessTracker {
            tree: StreamTree::new(cfg),
            observed: 0,
        }
    }

    /// Records `key`'s access if it is a demand access and returns its streams'
    /// patterns; any other kind is only looked up (never learnt from).
    pub fn observe(&mut self, key: &CacheKey, ctx: &AccessContext) -> Observation {
        if !ctx.is_demand() {
            return Observation::default();
        }
        self.observed += 1;
        self.tree.observe(key, ctx)
    }

    /// The current patterns of `key`'s streams for `ctx.job`, without recording.
    pub fn lookup(&self, key: &CacheKey, ctx: &AccessContext) -> Observation {
        self.tree.lookup(key, ctx)
    }

    /// The finest classified pattern of `key`'s stream (blocks, else files; blocks read
    /// in order and reused across visits are `Skewed`): what the prefetch controller is
    /// told.
    pub fn pattern_of(&self, key: &CacheKey, ctx: &AccessContext) -> Pattern {
        self.tree.finest_pattern(key, ctx)
    }

    /// The sharing window in accesses: the number of blocks the cache holds (see
    /// [`StreamTree::set_share_window`]).
    pub fn set_share_window(&mut self, accesses: u64) {
        self.tree.set_share_window(accesses);
    }

    /// Demand accesses observed so far.
    pub fn observed(&self) -> u64 {
        self.observed
    }

    /// Streams tracked now.
    pub fn streams(&self) -> usize {
        self.tree.len()
    }

    /// The `max` most recently active streams with their patterns and tests.
    pub fn report(&self, max: usize) -> Vec<StreamReport> {
        self.tree.report(max)
    }

    /// The tree (for inspection and benchmarks).
    pub fn tree(&self) -> &StreamTree {
        &self.tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{AccessKind, JobId};

    #[test]
    fn only_demand_accesses_teach_the_tree() {
        let mut t = AccessTracker::default();
        let job = JobId(1);
        for i in 0..64u64 {
            let key = CacheKey::file("ds/a.bin", "v", i);
            let ctx = AccessContext::prefetch(job, i);
            t.observe(&key, &ctx);
            t.observe(
                &key,
                &AccessContext::demand(job, i).moved(AccessKind::Demotion),
            );
        }
        assert_eq!(t.observed(), 0);
        assert_eq!(t.streams(), 0);
        for i in 0..64u64 {
            t.observe(
                &CacheKey::file("ds/a.bin", "v", i),
                &AccessContext::demand(job, i),
            );
        }
        let key = CacheKey::file("ds/a.bin", "v", 64);
        assert_eq!(
            t.pattern_of(&key, &AccessContext::demand(job, 0)),
            Pattern::Sequential
        );
        let report = t.report(10);
        let blocks = report
            .iter()
            .find(|r| r.granularity == "blocks")
            .expect("a blocks stream");
        assert_eq!(blocks.name, "ds/a.bin");
        assert_eq!(blocks.pattern, Pattern::Sequential);
        assert!(
            blocks.decided_by.contains("binomial"),
            "{}",
            blocks.decided_by
        );
    }
}
