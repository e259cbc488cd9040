//! Least-frequently-used eviction, ties broken by recency (the older goes first).
//!
//! In-cache LFU: a key's count starts at 1 when it becomes resident and is forgotten
//! when it leaves, so the policy's memory is bounded by the residents. `order` keeps
//! `(count, last tick) -> key`, so the victim is its first entry (O(log n) per access).

use std::collections::{BTreeMap, HashMap};

use super::{EvictionPolicy, KeyBuild};
use crate::access::AccessContext;
use crate::key::CacheKey;

#[derive(Default)]
pub struct LfuPolicy {
    tick: u64,
    state: HashMap<CacheKey, (u64, u64), KeyBuild>,
    order: BTreeMap<(u64, u64), CacheKey>,
}

impl LfuPolicy {
    pub fn new() -> Self {
        Self::default()
    }
}

impl EvictionPolicy for LfuPolicy {
    fn name(&self) -> &'static str {
        "lfu"
    }
    fn on_insert(&mut self, key: &CacheKey, _size: u64, _ctx: &AccessContext) {
        self.tick += 1;
        if let Some(old) = self.state.insert(key.clone(), (1, self.tick)) {
            self.order.remove(&old);
        }
        self.order.insert((1, self.tick), key.clone());
    }
    fn on_hit(&mut self, key: &CacheKey, _ctx: &AccessContext) {
        self.tick += 1;
        if let Some(st) = self.state.get_mut(key) {
            let old = *st;
            *st = (old.0 + 1, self.tick);
            let k = self.order.remove(&old).unwrap_or_else(|| key.clone());
            self.order.insert(*st, k);
        }
    }
    fn on_remove(&mut self, key: &CacheKey) {
        if let Some(st) = self.state.remove(key) {
            self.order.remove(&st);
        }
    }
    fn victim(&mut self) -> Option<CacheKey> {
        self.order.first_key_value().map(|(_, k)| k.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_frequent_then_oldest() {
        let mut p = LfuPolicy::new();
        let ctx = AccessContext::default();
        let k = |i| CacheKey::file("f", "v", i);
        for i in 0..3 {
            p.on_insert(&k(i), 1, &ctx);
        }
        p.on_hit(&k(0), &ctx);
        p.on_hit(&k(0), &ctx);
        p.on_hit(&k(2), &ctx);
        // counts: 0 -> 3, 1 -> 1, 2 -> 2
        assert_eq!(p.victim(), Some(k(1)));
        p.on_remove(&k(1));
        assert_eq!(p.victim(), Some(k(2)));
        p.on_insert(&k(3), 1, &ctx);
        assert_eq!(p.victim(), Some(k(3)), "a newcomer has count 1");
        p.on_hit(&k(3), &ctx);
        // 2 and 3 both have count 2; 2 was touched longer ago.
        assert_eq!(p.victim(), Some(k(2)));
        p.on_remove(&k(2));
        p.on_remove(&k(3));
        p.on_remove(&k(0));
        assert_eq!(p.victim(), None);
    }
}
