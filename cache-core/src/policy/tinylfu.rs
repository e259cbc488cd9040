//! W-TinyLFU through `moka` (Caffeine's design; Dynamo KVBM's policy family).
//!
//! `moka` decides admission and eviction itself and offers no "name your victim" hook,
//! so the adapter runs a `moka::sync::Cache<CacheKey, size>` **as the whole cache**:
//! weigher = the item's bytes, `max_capacity` = the tier's budget. On a miss, `admit`
//! records the miss in moka's frequency sketch (`get`), inserts the key and runs moka's
//! pending maintenance; moka then either rejects the candidate (TinyLFU admission: its
//! estimated frequency is lower than the victims') — `admit` returns false — or evicts
//! residents to fit it, which an eviction listener queues, and `victim` hands those to
//! [`crate::space::TierSpace`] in order. Hits are `get`s (recency + frequency). So the
//! tier evicts exactly what moka evicted and both account the same bytes.
//!
//! Hashing uses std's `DefaultHasher` with its fixed keys instead of a random state so
//! that replays are reproducible.

use std::collections::hash_map::DefaultHasher;
use std::collections::VecDeque;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use moka::notification::RemovalCause;
use parking_lot::Mutex;

use super::EvictionPolicy;
use crate::access::AccessContext;
use crate::key::CacheKey;

type Hasher = BuildHasherDefault<DefaultHasher>;

pub struct TinyLfuPolicy {
    cache: moka::sync::Cache<CacheKey, u64, Hasher>,
    evicted: Arc<Mutex<VecDeque<CacheKey>>>,
}

impl TinyLfuPolicy {
    /// `capacity` is the tier's byte budget.
    pub fn new(capacity: u64) -> Self {
        let evicted: Arc<Mutex<VecDeque<CacheKey>>> = Arc::default();
        let q = evicted.clone();
        let cache = moka::sync::Cache::builder()
            .max_capacity(capacity)
            .weigher(|_k: &CacheKey, v: &u64| u32::try_from(*v).unwrap_or(u32::MAX))
            .eviction_listener(move |k: Arc<CacheKey>, _v: u64, cause: RemovalCause| {
                if cause == RemovalCause::Size {
                    q.lock().push_back((*k).clone());
                }
            })
            .build_with_hasher(Hasher::default());
        TinyLfuPolicy { cache, evicted }
    }
}

impl EvictionPolicy for TinyLfuPolicy {
    fn name(&self) -> &'static str {
        "tinylfu"
    }
    fn admit(&mut self, key: &CacheKey, size: u64, _ctx: &AccessContext) -> bool {
        // The miss counts towards the key's frequency estimate.
        let _ = self.cache.get(key);
        self.cache.insert(key.clone(), size);
        self.cache.run_pending_tasks();
        if self.cache.contains_key(key) {
            true
        } else {
            self.evicted.lock().retain(|k| k != key);
            false
        }
    }
    fn on_insert(&mut self, _key: &CacheKey, _size: u64, _ctx: &AccessContext) {}
    fn on_hit(&mut self, key: &CacheKey, _ctx: &AccessContext) {
        let _ = self.cache.get(key);
    }
    fn on_remove(&mut self, key: &CacheKey) {
        let mut q = self.evicted.lock();
        if q.front() == Some(key) {
            q.pop_front();
        } else {
            q.retain(|k| k != key);
            drop(q);
            self.cache.invalidate(key);
        }
    }
    fn victim(&mut self) -> Option<CacheKey> {
        if let Some(k) = self.evicted.lock().front().cloned() {
            return Some(k);
        }
        // moka's accounting and the tier's disagree only if an item was refused by the
        // tier after moka admitted it; fall back to any moka resident.
        self.cache.run_pending_tasks();
        self.cache.iter().next().map(|(k, _)| (*k).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::{Placement, TierSpace};

    #[test]
    fn frequent_items_beat_one_hit_wonders() {
        let cap = 100;
        let mut s = TierSpace::new(cap, Box::new(TinyLfuPolicy::new(cap)));
        let ctx = AccessContext::default();
        let hot = |i| CacheKey::file("hot", "v", i);
        // Hot set of 50 unit items, read many times.
        for _ in 0..20 {
            for i in 0..50 {
                if !s.touch(&hot(i), &ctx) {
                    let _ = s.place(&hot(i), 1, &ctx).expect("fits");
                }
            }
        }
        // A scan of 1000 one-time items.
        let mut refused = 0;
        for i in 0..1000 {
            let k = CacheKey::file("scan", "v", i);
            if s.place(&k, 1, &ctx).expect("fits") == Placement::Refused {
                refused += 1;
            }
            assert!(s.used() <= cap);
        }
        assert!(
            refused > 500,
            "TinyLFU rejects most one-time items: {refused}"
        );
        let kept = (0..50).filter(|&i| s.contains(&hot(i))).count();
        assert!(kept >= 45, "hot set survives the scan: {kept}/50");
    }

    #[test]
    fn tier_and_moka_agree_on_residents() {
        let cap = 64;
        let mut s = TierSpace::new(cap, Box::new(TinyLfuPolicy::new(cap)));
        let ctx = AccessContext::default();
        for i in 0..500u64 {
            let k = CacheKey::file("f", "v", (i * 7919) % 97);
            if !s.touch(&k, &ctx) {
                let _ = s.place(&k, 1 + i % 5, &ctx).expect("fits");
            }
            assert!(s.used() <= cap);
        }
        assert!(s.len() > 10);
    }
}
