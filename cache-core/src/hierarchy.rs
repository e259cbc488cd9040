//! The synchronous core of the tiered cache: the access tracker plus one [`TierSpace`]
//! per level, fastest first. Pure logic, no I/O, no clock.
//!
//! The async engine ([`crate::engine::CacheEngine`]) holds one `Hierarchy` behind a
//! mutex (never across an `.await`) and performs the I/O its answers call for; the
//! replay simulator drives the same type in simulated time. So what the replay measures
//! (which level holds what, what is evicted, how streams are classified) is what the
//! daemon decides.
//!
//! Per access: [`Hierarchy::observe`] once (demand only; it fills `ctx.obs` for every
//! policy), then [`Hierarchy::touch`] level by level, then on a miss
//! [`Hierarchy::reserve`] / [`Hierarchy::commit`] (async writers) or
//! [`Hierarchy::place`] (synchronous callers).

use crate::access::AccessContext;
use crate::error::CacheError;
use crate::key::CacheKey;
use crate::space::{Placement, TierSpace};
use crate::stream::TreeConfig;
use crate::tracker::AccessTracker;

/// Demand admissions between updates of the tracker's sharing window: 1,024, the
/// cadence at which the pattern-aware policy used to set it from its own tier.
const SHARE_WINDOW_EVERY: u64 = 1024;

/// The tracker and the levels' spaces. See the module docs.
pub struct Hierarchy {
    tracker: AccessTracker,
    levels: Vec<TierSpace>,
    demand_admissions: u64,
    /// Per level, the most room a placement ever needed (bytes resident + in flight +
    /// its own), for the sharing window.
    peak_need: Vec<u64>,
    /// Recent removals, so a copy of a block read before its removal is not placed
    /// after it (see [`Removals`]).
    removals: Removals,
}

/// Removals numbered in order, the latest [`Removals::KEPT`] remembered by key hash.
///
/// A copy between levels (a promotion of a lower-level hit, a demotion of an evicted
/// block) reads its bytes, then places them after an await. A `remove` in that gap
/// used to be undone: the copy put the removed value back, and a new Put of the key
/// answered "already present" with the old bytes served on (black-box finding). A copy
/// takes [`Removals::seq`] when it reads its source and is placed only if its key was
/// not removed since: checked when it reserves and when it commits. A key hash shared
/// with another removed key, or more removals since than are remembered, only skips a
/// copy (the block stays where it was, or is fetched again).
#[derive(Default)]
struct Removals {
    seq: u64,
    /// (key hash, removal number, asked for: a Remove, not an eviction).
    recent: std::collections::VecDeque<(u64, u64, bool)>,
}

impl Removals {
    /// Removals remembered: far more than copies in flight at once.
    const KEPT: usize = 4096;

    fn note(&mut self, key: &CacheKey, asked: bool) {
        self.seq += 1;
        if self.recent.len() == Self::KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back((key.content_hash(), self.seq, asked));
    }

    /// Whether `key` was removed (`asked_only`: by a Remove, evictions aside) after
    /// removal number `seq`, or may have been (more removals since than remembered).
    fn since(&self, key: &CacheKey, seq: u64, asked_only: bool) -> bool {
        if self.seq == seq {
            return false;
        }
        if self.seq - seq > self.recent.len() as u64 {
            return true;
        }
        let h = key.content_hash();
        self.recent
            .iter()
            .rev()
            .take_while(|(_, s, _)| *s > seq)
            .any(|(k, _, asked)| *k == h && (*asked || !asked_only))
    }
}

impl Hierarchy {
    /// Levels fastest first, with a default tracker.
    pub fn new(levels: Vec<TierSpace>) -> Self {
        Self::with_tracker(levels, TreeConfig::default())
    }

    pub fn with_tracker(levels: Vec<TierSpace>, tree: TreeConfig) -> Self {
        Hierarchy {
            tracker: AccessTracker::new(tree),
            peak_need: vec![0; levels.len()],
            levels,
            demand_admissions: 0,
            removals: Removals::default(),
        }
    }

    /// The number of the latest removal: a copy takes it when it reads its source.
    pub fn removal_seq(&self) -> u64 {
        self.removals.seq
    }

    /// Whether `key` was removed after removal number `seq` (or may have been).
    pub fn removed_since(&self, key: &CacheKey, seq: u64) -> bool {
        self.removals.since(key, seq, false)
    }

    /// Whether `key` is known to have been removed by a Remove (not an eviction: see
    /// [`Self::note_removal`]) after removal number `seq`: false when more removals came
    /// since than are remembered (unlike [`Self::removed_since`]).
    pub fn known_removed_since(&self, key: &CacheKey, seq: u64) -> bool {
        self.removals.seq - seq <= self.removals.recent.len() as u64
            && self.removals.since(key, seq, true)
    }

    /// `key` is being removed from every level: copies of it read before now are not
    /// placed. `asked`: a client's Remove, which a Put that arrived before it does not
    /// undo ([`Self::known_removed_since`]); false for an eviction the cache made (a
    /// tenant's quota), after which a Put of the key is a fresh store.
    pub fn note_removal(&mut self, key: &CacheKey, asked: bool) {
        self.removals.note(key, asked);
    }

    pub fn len(&self) -> usize {
        self.levels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    pub fn tracker(&self) -> &AccessTracker {
        &self.tracker
    }

    pub fn level(&self, i: usize) -> &TierSpace {
        &self.levels[i]
    }

    /// Observes a demand access once, writing its streams' patterns into `ctx.obs`
    /// (other kinds get an empty observation). Call before any touch or placement.
    pub fn observe(&mut self, key: &CacheKey, ctx: &mut AccessContext) {
        ctx.obs = self.tracker.observe(key, ctx);
    }

    /// Records a read of `key` at level `i`; returns whether that level holds it.
    ///
    /// A read of a KV block also refreshes its copies in the slower levels. A KV block
    /// is written through to disk at its put and nothing else holds it: read only from
    /// memory, its disk copy aged as if unread, and file fills evicted the hottest KV
    /// blocks from disk first, so a restart found none of them (black-box finding: after
    /// 30 minutes of mixed load the disk held only file blocks). A file block's copy is
    /// left to age: the store holds it, and the disk's room is better spent on blocks
    /// memory does not hold.
    pub fn touch(&mut self, i: usize, key: &CacheKey, ctx: &AccessContext) -> bool {
        let held = self.levels[i].touch(key, ctx);
        if held && !key.refetchable() {
            for level in &mut self.levels[i + 1..] {
                level.touch(key, ctx);
            }
        }
        held
    }

    /// [`TierSpace::note_unfilled_miss`] at every level.
    pub fn note_unfilled_miss(&mut self, key: &CacheKey, ctx: &AccessContext) {
        for level in &mut self.levels {
            level.note_unfilled_miss(key, ctx);
        }
    }

    /// Whether level `i` counts `key` as resident.
    pub fn contains(&self, i: usize, key: &CacheKey) -> bool {
        self.levels[i].contains(key)
    }

    /// The fastest level holding `key`.
    pub fn locate(&self, key: &CacheKey) -> Option<usize> {
        (0..self.levels.len()).find(|&i| self.levels[i].contains(key))
    }

    /// The first level below `from` that does not hold `key` (where a victim goes).
    pub fn next_level_lacking(&self, from: usize, key: &CacheKey) -> Option<usize> {
        (from + 1..self.levels.len()).find(|&j| !self.levels[j].contains(key))
    }

    /// [`TierSpace::place`] at level `i` (residents at once): a [`Self::reserve`]
    /// committed at once when admitted.
    pub fn place(
        &mut self,
        i: usize,
        key: &CacheKey,
        size: u64,
        ctx: &AccessContext,
    ) -> Result<Placement, CacheError> {
        let placement = self.reserve(i, key, size, ctx)?;
        if let Placement::Admitted { .. } = &placement {
            self.commit(i, key, size, ctx);
        }
        Ok(placement)
    }

    /// [`TierSpace::reserve`] at level `i`: bytes charged, key resident at `commit`.
    pub fn reserve(
        &mut self,
        i: usize,
        key: &CacheKey,
        size: u64,
        ctx: &AccessContext,
    ) -> Result<Placement, CacheError> {
        self.before_placement(i, key, size, ctx);
        self.levels[i].reserve(key, size, ctx)
    }

    /// [`TierSpace::commit`] at level `i`.
    pub fn commit(&mut self, i: usize, key: &CacheKey, size: u64, ctx: &AccessContext) -> bool {
        self.levels[i].commit(key, size, ctx)
    }

    /// [`TierSpace::release`] at level `i`.
    pub fn release(&mut self, i: usize, size: u64) {
        self.levels[i].release(size);
    }

    /// [`TierSpace::set_budget`] at level `i`.
    pub fn set_budget(&mut self, i: usize, to: u64) {
        self.levels[i].set_budget(to);
    }

    /// Forgets `key` at level `i` (removed, or its bytes were found gone).
    pub fn forget(&mut self, i: usize, key: &CacheKey) -> Option<u64> {
        self.levels[i].remove(key)
    }

    /// [`TierSpace::shed`] at level `i`.
    pub fn shed(&mut self, i: usize, bytes: u64) -> Vec<(CacheKey, u64)> {
        self.levels[i].shed(bytes)
    }

    /// Resident blocks of every level.
    pub fn resident_blocks(&self) -> usize {
        self.levels.iter().map(TierSpace::len).sum()
    }

    /// Policy name of each level, fastest first.
    pub fn policy_names(&self) -> Vec<&'static str> {
        self.levels.iter().map(TierSpace::policy_name).collect()
    }

    /// Each level's policy's recency and frequency periods, fastest first.
    pub fn policy_guard_periods(&self) -> Vec<(u64, u64)> {
        self.levels
            .iter()
            .map(|l| (l.policy_recency_periods(), l.policy_frequency_periods()))
            .collect()
    }

    /// The tracker's sharing window is the number of blocks the whole cache holds
    /// (readers trailing each other by less than a cache's worth of accesses are served
    /// by recency). It is set, before the placement, whenever a level needs more room
    /// than it ever has (first when it fills up), and every `SHARE_WINDOW_EVERY`
    /// demand admissions.
    fn before_placement(&mut self, i: usize, key: &CacheKey, size: u64, ctx: &AccessContext) {
        let level = &self.levels[i];
        if level.contains(key) || size > level.budget() {
            return;
        }
        let need = level.used() + level.reserved() + size;
        let mut update = false;
        if need > level.budget() && need > self.peak_need[i] {
            self.peak_need[i] = need;
            update = true;
        }
        if ctx.is_demand() {
            self.demand_admissions += 1;
            update |= self.demand_admissions.is_multiple_of(SHARE_WINDOW_EVERY);
        }
        if update {
            let blocks = self.resident_blocks() as u64;
            self.tracker.set_share_window(blocks);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::JobId;
    use crate::pattern::Pattern;
    use crate::policy::LruPolicy;

    /// `removed_since` errs towards "removed" once the log no longer reaches back (a
    /// copy is then skipped); `known_removed_since` towards "not removed" (a Put is
    /// then stored): each only where losing the other way is harmless.
    #[test]
    fn removals_answer_exactly_within_the_log_and_each_way_beyond_it() {
        let mut h = Hierarchy::new(vec![TierSpace::new(4, Box::new(LruPolicy::new()))]);
        let (a, b) = (CacheKey::kv("ns", vec![1]), CacheKey::kv("ns", vec![2]));
        let start = h.removal_seq();
        h.note_removal(&a, true);
        assert!(h.removed_since(&a, start) && h.known_removed_since(&a, start));
        assert!(!h.removed_since(&b, start) && !h.known_removed_since(&b, start));
        // An eviction cancels copies, and is no Remove to a Put.
        let c = CacheKey::kv("ns", vec![3]);
        h.note_removal(&c, false);
        assert!(h.removed_since(&c, start) && !h.known_removed_since(&c, start));
        let after = h.removal_seq();
        assert!(!h.removed_since(&a, after) && !h.known_removed_since(&a, after));
        for i in 0..Removals::KEPT as u64 + 1 {
            h.note_removal(&CacheKey::kv("other", i.to_be_bytes().to_vec()), true);
        }
        assert!(h.removed_since(&b, start), "beyond the log: maybe");
        assert!(
            !h.known_removed_since(&b, start),
            "beyond the log: not known"
        );
    }

    /// With plain LRU on every level the tracker still classifies: the classification
    /// belongs to the cache, not to the pattern-aware policy.
    #[test]
    fn lru_levels_still_classify_streams() {
        let mut h = Hierarchy::new(vec![
            TierSpace::new(4, Box::new(LruPolicy::new())),
            TierSpace::new(8, Box::new(LruPolicy::new())),
        ]);
        let mut last = AccessContext::default();
        for b in 0..64u64 {
            let key = CacheKey::file("ds/train/a.bin", "v", b);
            let mut ctx = AccessContext::demand(JobId(3), b);
            h.observe(&key, &mut ctx);
            if !h.touch(0, &key, &ctx) {
                let _ = h.place(0, &key, 1, &ctx);
            }
            last = ctx;
        }
        assert_eq!(last.obs.blocks, Pattern::Sequential);
        let report = h.tracker().report(4);
        assert!(report
            .iter()
            .any(|r| r.pattern == Pattern::Sequential && r.job == 3));
        // A demotion into level 1 teaches the tracker nothing.
        let before = h.tracker().observed();
        let mut moved = last.moved(crate::access::AccessKind::Demotion);
        h.observe(&CacheKey::file("ds/train/a.bin", "v", 0), &mut moved);
        let _ = h.place(1, &CacheKey::file("ds/train/a.bin", "v", 0), 1, &moved);
        assert_eq!(h.tracker().observed(), before);
    }
}
