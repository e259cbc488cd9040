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
//! that replays are reproducible. moka's frequency sketch is indexed by that hash, so
//! its decisions depend on what a key hashes to: keys go in wrapped in [`MokaKey`],
//! which hashes the key's fields as `CacheKey`'s derived `Hash` once did, so the
//! policy's choices do not move when `CacheKey`'s own (fast, precomputed) hash changes.

use std::collections::hash_map::DefaultHasher;
use std::collections::VecDeque;
use std::hash::{BuildHasherDefault, Hash};
use std::sync::Arc;

use moka::notification::RemovalCause;
use parking_lot::Mutex;

use super::EvictionPolicy;
use crate::access::AccessContext;
use crate::key::CacheKey;

type Hasher = BuildHasherDefault<DefaultHasher>;

/// A [`CacheKey`] hashed field by field: the variant index (as `isize`), then each
/// field's own `Hash` (exactly `#[derive(Hash)]`'s sequence, pinned by a test).
#[derive(Clone, PartialEq, Eq)]
struct MokaKey(CacheKey);

impl Hash for MokaKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match &self.0 {
            CacheKey::File(k) => {
                state.write_isize(0);
                k.location.hash(state);
                k.version.hash(state);
                k.block.hash(state);
            }
            CacheKey::Kv(k) => {
                state.write_isize(1);
                k.namespace.hash(state);
                k.hash.hash(state);
            }
        }
    }
}

pub struct TinyLfuPolicy {
    cache: moka::sync::Cache<MokaKey, u64, Hasher>,
    evicted: Arc<Mutex<VecDeque<CacheKey>>>,
}

impl TinyLfuPolicy {
    /// `capacity` is the tier's byte budget.
    pub fn new(capacity: u64) -> Self {
        let evicted: Arc<Mutex<VecDeque<CacheKey>>> = Arc::default();
        let q = evicted.clone();
        let cache = moka::sync::Cache::builder()
            .max_capacity(capacity)
            .weigher(|_k: &MokaKey, v: &u64| u32::try_from(*v).unwrap_or(u32::MAX))
            .eviction_listener(move |k: Arc<MokaKey>, _v: u64, cause: RemovalCause| {
                if cause == RemovalCause::Size {
                    q.lock().push_back(k.0.clone());
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
        let mk = MokaKey(key.clone());
        let _ = self.cache.get(&mk);
        self.cache.insert(mk.clone(), size);
        self.cache.run_pending_tasks();
        if self.cache.contains_key(&mk) {
            true
        } else {
            self.evicted.lock().retain(|k| k != key);
            false
        }
    }
    fn on_insert(&mut self, _key: &CacheKey, _size: u64, _ctx: &AccessContext) {}
    fn on_hit(&mut self, key: &CacheKey, _ctx: &AccessContext) {
        let _ = self.cache.get(&MokaKey(key.clone()));
    }
    fn on_remove(&mut self, key: &CacheKey) {
        let mut q = self.evicted.lock();
        if q.front() == Some(key) {
            q.pop_front();
        } else {
            q.retain(|k| k != key);
            drop(q);
            self.cache.invalidate(&MokaKey(key.clone()));
        }
    }
    fn victim(&mut self) -> Option<CacheKey> {
        if let Some(k) = self.evicted.lock().front().cloned() {
            return Some(k);
        }
        // moka's accounting and the tier's disagree only if an item was refused by the
        // tier after moka admitted it; fall back to any moka resident.
        self.cache.run_pending_tasks();
        self.cache.iter().next().map(|(k, _)| k.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::{Placement, TierSpace};

    /// The shape `CacheKey` had when its `Hash` was derived: `MokaKey` must hash the
    /// same words, or moka's sketch (and every `tinylfu` replay result) would move.
    #[derive(Hash)]
    struct DerivedFile {
        location: Arc<str>,
        version: Arc<str>,
        block: u64,
    }
    #[derive(Hash)]
    struct DerivedKv {
        namespace: Arc<str>,
        hash: Arc<[u8]>,
    }
    #[derive(Hash)]
    enum DerivedKey {
        File(DerivedFile),
        Kv(DerivedKv),
    }

    #[test]
    fn moka_key_hashes_like_the_derived_impl() {
        use std::hash::BuildHasher;
        let h = Hasher::default();
        for (loc, ver, block) in [
            ("a/b.bin", "v1", 7u64),
            ("", "", 0),
            ("x", "etag", u64::MAX),
        ] {
            let ours = h.hash_one(MokaKey(CacheKey::file(loc, ver, block)));
            let derived = h.hash_one(DerivedKey::File(DerivedFile {
                location: Arc::from(loc),
                version: Arc::from(ver),
                block,
            }));
            assert_eq!(ours, derived, "{loc} {ver} {block}");
        }
        for (ns, hash) in [("llama/t1", vec![1u8, 2, 3]), ("", vec![])] {
            let ours = h.hash_one(MokaKey(CacheKey::kv(ns, hash.clone())));
            let derived = h.hash_one(DerivedKey::Kv(DerivedKv {
                namespace: Arc::from(ns),
                hash: Arc::from(hash),
            }));
            assert_eq!(ours, derived, "{ns}");
        }
    }

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
            if matches!(
                s.place(&k, 1, &ctx).expect("fits"),
                Placement::Refused { .. }
            ) {
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
