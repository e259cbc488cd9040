//! Adaptive Replacement Cache (Megiddo & Modha, FAST'03), in bytes.
//!
//! Four LRU lists: `t1` (seen once recently), `t2` (seen at least twice), and their
//! ghosts `b1`, `b2` (keys recently evicted from each, no data). A miss that hits a
//! ghost list moves the target size `p` of `t1` towards the list that would have kept
//! it. Because our items have different sizes, every quantity the paper counts in pages
//! is counted in bytes here: `p` in `0..=capacity`, the adaptation step is the item's
//! size times the ghost-size ratio, and ghosts are trimmed so `t1 + b1 <= c` and
//! `t1 + t2 + b1 + b2 <= 2c` bytes.
//!
//! Mapping onto [`EvictionPolicy`]: `admit` sees the missed key first, so it does the
//! ghost-hit adaptation and remembers whether the key was in `b2` (the paper's REPLACE
//! needs that); `victim` is REPLACE; `on_remove` moves the resident into its ghost list.

use std::collections::{BTreeMap, HashMap};

use super::{EvictionPolicy, KeyBuild};
use crate::access::AccessContext;
use crate::key::CacheKey;

#[derive(Default)]
struct LruList {
    map: HashMap<CacheKey, (u64, u64), KeyBuild>,
    order: BTreeMap<u64, CacheKey>,
    bytes: u64,
}

impl LruList {
    fn insert(&mut self, key: &CacheKey, tick: u64, size: u64) {
        if let Some((t, s)) = self.map.insert(key.clone(), (tick, size)) {
            self.order.remove(&t);
            self.bytes -= s;
        }
        self.order.insert(tick, key.clone());
        self.bytes += size;
    }
    fn remove(&mut self, key: &CacheKey) -> Option<u64> {
        let (t, s) = self.map.remove(key)?;
        self.order.remove(&t);
        self.bytes -= s;
        Some(s)
    }
    fn contains(&self, key: &CacheKey) -> bool {
        self.map.contains_key(key)
    }
    fn lru(&self) -> Option<&CacheKey> {
        self.order.first_key_value().map(|(_, k)| k)
    }
    fn pop_lru(&mut self) {
        if let Some(k) = self.lru().cloned() {
            self.remove(&k);
        }
    }
}

pub struct ArcPolicy {
    capacity: u64,
    p: u64,
    tick: u64,
    t1: LruList,
    t2: LruList,
    b1: LruList,
    b2: LruList,
    /// The key being admitted was in `b2` (REPLACE's tie rule).
    pending_in_b2: bool,
}

impl ArcPolicy {
    /// `capacity` is the tier's byte budget (ARC sizes its ghost lists by it).
    pub fn new(capacity: u64) -> Self {
        ArcPolicy {
            capacity,
            p: 0,
            tick: 0,
            t1: LruList::default(),
            t2: LruList::default(),
            b1: LruList::default(),
            b2: LruList::default(),
            pending_in_b2: false,
        }
    }

    /// Current target size of the recency list `t1`, in bytes.
    pub fn target_t1(&self) -> u64 {
        self.p
    }

    fn trim_ghosts(&mut self) {
        while self.t1.bytes + self.b1.bytes > self.capacity && !self.b1.map.is_empty() {
            self.b1.pop_lru();
        }
        while self.t1.bytes + self.t2.bytes + self.b1.bytes + self.b2.bytes > 2 * self.capacity
            && !self.b2.map.is_empty()
        {
            self.b2.pop_lru();
        }
    }
}

impl EvictionPolicy for ArcPolicy {
    fn name(&self) -> &'static str {
        "arc"
    }
    fn admit(&mut self, key: &CacheKey, size: u64, _ctx: &AccessContext) -> bool {
        self.pending_in_b2 = false;
        if self.b1.contains(key) {
            let ratio = (self.b2.bytes / self.b1.bytes.max(1)).max(1);
            self.p = (self.p + size.saturating_mul(ratio)).min(self.capacity);
        } else if self.b2.contains(key) {
            let ratio = (self.b1.bytes / self.b2.bytes.max(1)).max(1);
            self.p = self.p.saturating_sub(size.saturating_mul(ratio));
            self.pending_in_b2 = true;
        }
        true
    }
    fn on_insert(&mut self, key: &CacheKey, size: u64, _ctx: &AccessContext) {
        self.tick += 1;
        let ghost = self.b1.remove(key).is_some() | self.b2.remove(key).is_some();
        if ghost {
            self.t2.insert(key, self.tick, size);
        } else {
            self.t1.insert(key, self.tick, size);
        }
        self.pending_in_b2 = false;
        self.trim_ghosts();
    }
    fn on_hit(&mut self, key: &CacheKey, _ctx: &AccessContext) {
        self.tick += 1;
        if let Some(size) = self.t1.remove(key) {
            self.t2.insert(key, self.tick, size);
        } else if let Some(&(_, size)) = self.t2.map.get(key) {
            self.t2.insert(key, self.tick, size);
        }
    }
    fn on_remove(&mut self, key: &CacheKey) {
        self.tick += 1;
        if let Some(size) = self.t1.remove(key) {
            self.b1.insert(key, self.tick, size);
        } else if let Some(size) = self.t2.remove(key) {
            self.b2.insert(key, self.tick, size);
        }
        self.trim_ghosts();
    }
    fn victim(&mut self) -> Option<CacheKey> {
        let from_t1 = !self.t1.map.is_empty()
            && (self.t1.bytes > self.p
                || (self.pending_in_b2 && self.t1.bytes >= self.p)
                || self.t2.map.is_empty());
        if from_t1 {
            self.t1.lru().cloned()
        } else {
            self.t2.lru().cloned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u64) -> CacheKey {
        CacheKey::file("f", "v", i)
    }

    /// Drives the policy as TierSpace does, with unit-size items.
    fn access(p: &mut ArcPolicy, resident: &mut Vec<CacheKey>, cap: usize, key: CacheKey) -> bool {
        let ctx = AccessContext::default();
        if resident.contains(&key) {
            p.on_hit(&key, &ctx);
            return true;
        }
        assert!(p.admit(&key, 1, &ctx));
        while resident.len() >= cap {
            let v = p.victim().expect("victim while full");
            resident.retain(|r| r != &v);
            p.on_remove(&v);
        }
        p.on_insert(&key, 1, &ctx);
        resident.push(key);
        false
    }

    #[test]
    fn frequent_set_survives_a_scan() {
        let cap = 10;
        let mut p = ArcPolicy::new(cap as u64);
        let mut res = Vec::new();
        // A hot set of 5 seen twice -> t2.
        for _ in 0..2 {
            for i in 0..5 {
                access(&mut p, &mut res, cap, k(i));
            }
        }
        // A long one-time scan goes through t1 only.
        for i in 100..200 {
            access(&mut p, &mut res, cap, k(i));
        }
        let hits = (0..5)
            .filter(|&i| access(&mut p, &mut res, cap, k(i)))
            .count();
        assert_eq!(hits, 5, "scan-resistant: hot set kept in t2");
    }

    #[test]
    fn ghost_hits_adapt_target() {
        let cap = 4;
        let mut p = ArcPolicy::new(cap as u64);
        let mut res = Vec::new();
        for i in [0, 1, 0, 1, 10, 11, 12, 13] {
            access(&mut p, &mut res, cap, k(i));
        }
        assert_eq!(p.target_t1(), 0);
        // 10 and 11 were evicted from t1 into b1: a miss on one grows p.
        assert!(p.b1.contains(&k(10)));
        access(&mut p, &mut res, cap, k(10));
        assert!(p.target_t1() > 0, "b1 ghost hit grows t1's target");
        assert!(p.t2.contains(&k(10)), "a ghost hit goes to t2");
    }

    #[test]
    fn ghosts_stay_bounded() {
        let cap = 8;
        let mut p = ArcPolicy::new(cap as u64);
        let mut res = Vec::new();
        for i in 0..1000 {
            access(&mut p, &mut res, cap, k(i % 37));
            assert!(p.t1.bytes + p.b1.bytes <= cap as u64);
            assert!(p.t1.bytes + p.t2.bytes + p.b1.bytes + p.b2.bytes <= 2 * cap as u64);
            assert_eq!(p.t1.bytes + p.t2.bytes, res.len() as u64);
        }
    }
}
