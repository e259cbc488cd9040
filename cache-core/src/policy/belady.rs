//! Belady's MIN ("opt"): evict the resident whose next use is farthest in the future.
//! The demand-caching limit for equal-size items; the replay's yardstick.
//!
//! It needs the future, which only a trace replay has: the caller sets the next-use
//! position of the access it is about to make through the [`NextUse`] handle before each
//! `touch`/`place` (`u64::MAX` for never again), and the policy records it on `on_hit` /
//! `on_insert`. Victim: the largest next use (ties: the earliest recorded).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::EvictionPolicy;
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
    seq: u64,
    state: HashMap<CacheKey, (u64, u64)>,
    /// (next use, -seq) -> key; the last entry is the victim.
    order: BTreeMap<(u64, u64), CacheKey>,
}

impl BeladyPolicy {
    /// The policy and the handle to feed it the future with.
    pub fn new() -> (Self, NextUse) {
        let hint = NextUse::default();
        hint.set(u64::MAX);
        (
            BeladyPolicy {
                hint: hint.clone(),
                seq: 0,
                state: HashMap::new(),
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
    fn on_insert(&mut self, key: &CacheKey, _size: u64, _ctx: &AccessContext) {
        self.record(key);
    }
    fn on_hit(&mut self, key: &CacheKey, _ctx: &AccessContext) {
        if self.state.contains_key(key) {
            self.record(key);
        }
    }
    fn on_remove(&mut self, key: &CacheKey) {
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
        let (mut p, hint) = BeladyPolicy::new();
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
}
