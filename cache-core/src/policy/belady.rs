//! Belady's MIN ("opt"): evict the resident whose next use is farthest in the future.
//! The demand-caching limit for equal-size items; the replay's yardstick.
//!
//! It needs the future, which only a trace replay has: the caller sets the next-use
//! position of the access it is about to make through the [`NextUse`] handle before each
//! `touch`/`place` (`u64::MAX` for never again), and the policy records it on `on_hit` /
//! `on_insert`. Victim: the largest next use (ties: the earliest recorded).
//!
//! It also bypasses: when the tier is full and the missed key's next use is later than
//! every resident's, it refuses the key (`admit` false), keeping the residents. Without
//! that, a forced-admission MIN loses to policies that may refuse (TinyLFU) on traces
//! like `a b a` with room for one. So the policy tracks resident bytes against the
//! capacity it is given.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{EvictionPolicy, KeyBuild};
use crate::access::AccessContext;
use crate::key::CacheKey;

/// Where the replay tells [`BeladyPolicy`] the next use of the current access.
#[derive(Clone, Debug, Default)]
pub struct NextUse(Arc<AtomicU64>);

impl NextUse {
    /// Position in the access sequence of the next access to the key about to be
    /// touched or placed (`u64::MAX` if it is never accessed again).
    pub fn set(&self, position: u64) {
        self.0.store(position, Ordering::Relaxed);
    }
    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

pub struct BeladyPolicy {
    hint: NextUse,
    capacity: u64,
    used: u64,
    sizes: HashMap<CacheKey, u64, KeyBuild>,
    seq: u64,
    state: HashMap<CacheKey, (u64, u64), KeyBuild>,
    /// (next use, -seq) -> key; the last entry is the victim.
    order: BTreeMap<(u64, u64), CacheKey>,
}

impl BeladyPolicy {
    /// The policy for a tier of `capacity` bytes and the handle to feed it the future.
    pub fn new(capacity: u64) -> (Self, NextUse) {
        let hint = NextUse::default();
        hint.set(u64::MAX);
        (
            BeladyPolicy {
                hint: hint.clone(),
                capacity,
                used: 0,
                sizes: HashMap::default(),
                seq: 0,
                state: HashMap::default(),
                order: BTreeMap::new(),
            },
            hint,
        )
    }

    fn record(&mut self, key: &CacheKey) {
        self.seq += 1;
        let st = (self.hint.get(), u64::MAX - self.seq);
        if let Some(old) = self.state.insert(key.clone(), st) {
            self.order.remove(&old);
        }
        self.order.insert(st, key.clone());
    }
}

impl EvictionPolicy for BeladyPolicy {
    fn name(&self) -> &'static str {
        "opt"
    }
    fn admit(&mut self, _key: &CacheKey, size: u64, _ctx: &AccessContext) -> bool {
        if self.used + size <= self.capacity {
            return true;
        }
        let farthest = self.order.last_key_value().map_or(0, |((n, _), _)| *n);
        self.hint.get() < farthest
    }
    fn on_insert(&mut self, key: &CacheKey, size: u64, _ctx: &AccessContext) {
        if let Some(old) = self.sizes.insert(key.clone(), size) {
            self.used -= old;
        }
        self.used += size;
        self.record(key);
    }
    fn on_hit(&mut self, key: &CacheKey, _ctx: &AccessContext) {
        if self.state.contains_key(key) {
            self.record(key);
        }
    }
    fn on_remove(&mut self, key: &CacheKey) {
        if let Some(s) = self.sizes.remove(key) {
            self.used -= s;
        }
        if let Some(st) = self.state.remove(key) {
            self.order.remove(&st);
        }
    }
    fn victim(&mut self) -> Option<CacheKey> {
        self.order.last_key_value().map(|(_, k)| k.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_farthest_next_use() {
        let (mut p, hint) = BeladyPolicy::new(100);
        let ctx = AccessContext::default();
        let k = |i| CacheKey::file("f", "v", i);
        for (i, next) in [(0, 10), (1, 5), (2, 7)] {
            hint.set(next);
            p.on_insert(&k(i), 1, &ctx);
        }
        assert_eq!(p.victim(), Some(k(0)));
        hint.set(3);
        p.on_hit(&k(0), &ctx);
        assert_eq!(p.victim(), Some(k(2)));
        hint.set(u64::MAX);
        p.on_hit(&k(1), &ctx);
        assert_eq!(p.victim(), Some(k(1)), "never used again goes first");
        p.on_remove(&k(1));
        assert_eq!(p.victim(), Some(k(2)));
    }

    #[test]
    fn bypasses_when_full_and_the_newcomer_is_needed_last() {
        let (mut p, hint) = BeladyPolicy::new(2);
        let ctx = AccessContext::default();
        let k = |i| CacheKey::file("f", "v", i);
        hint.set(5);
        assert!(p.admit(&k(0), 1, &ctx), "room left: always admit");
        p.on_insert(&k(0), 1, &ctx);
        hint.set(6);
        p.on_insert(&k(1), 1, &ctx);
        hint.set(9);
        assert!(
            !p.admit(&k(2), 1, &ctx),
            "full and needed after every resident"
        );
        hint.set(4);
        assert!(p.admit(&k(2), 1, &ctx), "needed sooner than a resident");
    }
}
