//! Least-recently-used eviction (mountpoint-s3's and LMCache's policy; our baseline).

use std::collections::{BTreeMap, HashMap};

use super::EvictionPolicy;
use crate::access::AccessContext;
use crate::key::CacheKey;

/// LRU over a logical clock: `order` maps tick -> key, oldest first.
#[derive(Default)]
pub struct LruPolicy {
    tick: u64,
    stamp: HashMap<CacheKey, u64>,
    order: BTreeMap<u64, CacheKey>,
}

impl LruPolicy {
    pub fn new() -> Self {
        Self::default()
    }

    fn bump(&mut self, key: &CacheKey) {
        self.tick += 1;
        if let Some(old) = self.stamp.insert(key.clone(), self.tick) {
            self.order.remove(&old);
        }
        self.order.insert(self.tick, key.clone());
    }
}

impl EvictionPolicy for LruPolicy {
    fn name(&self) -> &'static str {
        "lru"
    }
    fn on_insert(&mut self, key: &CacheKey, _size: u64, _ctx: &AccessContext) {
        self.bump(key);
    }
    fn on_hit(&mut self, key: &CacheKey, _ctx: &AccessContext) {
        if self.stamp.contains_key(key) {
            self.bump(key);
        }
    }
    fn on_remove(&mut self, key: &CacheKey) {
        if let Some(t) = self.stamp.remove(key) {
            self.order.remove(&t);
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
    fn evicts_least_recently_used() {
        let mut p = LruPolicy::new();
        let ctx = AccessContext::default();
        let k = |i| CacheKey::file("f", "v", i);
        for i in 0..3 {
            p.on_insert(&k(i), 1, &ctx);
        }
        p.on_hit(&k(0), &ctx);
        assert_eq!(p.victim(), Some(k(1)));
        p.on_remove(&k(1));
        assert_eq!(p.victim(), Some(k(2)));
    }
}
