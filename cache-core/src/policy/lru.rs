//! Least-recently-used eviction (mountpoint-s3's and LMCache's policy; our baseline).
//!
//! Design: an intrusive doubly linked list threaded through a slab (`Vec` of nodes
//! addressed by `u32` slot), oldest at `head`, newest at `tail`, plus an index from the
//! key's precomputed [`CacheKey::content_hash`] to its slot. A hit is one probe of a
//! table of 16-byte entries, one key comparison on the node (which the relink touches
//! anyway) and four index writes; a victim is the head's key. This replaces a
//! `BTreeMap<tick, key>` whose every bump cost an O(log n) remove + insert, a key
//! clone and a probe of a table of whole keys (64-byte entries): at replay sizes the
//! policy's state no longer fits in cache, so bytes touched per access are the cost.
//! Same order (recency; ties impossible), so the same victims.
//!
//! Two different keys with one content hash (never seen in practice, but possible):
//! the second goes to `overflow`, a map of whole keys; a lookup that does not find its
//! key through the hash index checks it, so correctness never rests on the hash.
//! Freed slots are reused (free list), so the slab never outgrows the peak residency.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use super::{EvictionPolicy, KeyBuild};
use crate::access::AccessContext;
use crate::key::CacheKey;

/// "No slot": the end of the list.
const NIL: u32 = u32::MAX;

struct Node {
    /// `None` on the free list.
    key: Option<CacheKey>,
    prev: u32,
    next: u32,
}

/// LRU as a slab-backed linked list: `head` is the least recently used.
pub struct LruPolicy {
    /// Content hash (masked by `hash_mask`) -> slot of the first resident key with it.
    slot: HashMap<u64, u32, KeyBuild>,
    /// Keys whose (masked) hash another resident key already holds in `slot`.
    overflow: HashMap<CacheKey, u32, KeyBuild>,
    /// All ones; tests narrow it to force hash collisions.
    hash_mask: u64,
    nodes: Vec<Node>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
}

impl Default for LruPolicy {
    fn default() -> Self {
        LruPolicy {
            slot: HashMap::default(),
            overflow: HashMap::default(),
            hash_mask: u64::MAX,
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }
}

impl LruPolicy {
    pub fn new() -> Self {
        Self::default()
    }

    /// Resident keys.
    pub fn len(&self) -> usize {
        self.slot.len() + self.overflow.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slot of `key`, if resident.
    #[inline]
    fn find(&self, key: &CacheKey) -> Option<u32> {
        if let Some(&i) = self.slot.get(&(key.content_hash() & self.hash_mask)) {
            if self.nodes[i as usize].key.as_ref() == Some(key) {
                return Some(i);
            }
        }
        if self.overflow.is_empty() {
            None
        } else {
            self.overflow.get(key).copied()
        }
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let n = &self.nodes[i as usize];
            (n.prev, n.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    /// Appends slot `i` as the most recently used.
    fn push_back(&mut self, i: u32) {
        let tail = self.tail;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = tail;
            n.next = NIL;
        }
        if tail == NIL {
            self.head = i;
        } else {
            self.nodes[tail as usize].next = i;
        }
        self.tail = i;
    }

    /// Makes `i` the most recently used.
    fn bump_slot(&mut self, i: u32) {
        if self.tail != i {
            self.unlink(i);
            self.push_back(i);
        }
    }
}

impl EvictionPolicy for LruPolicy {
    fn name(&self) -> &'static str {
        "lru"
    }
    fn on_insert(&mut self, key: &CacheKey, _size: u64, _ctx: &AccessContext) {
        if let Some(i) = self.find(key) {
            self.bump_slot(i);
            return;
        }
        let node = Node {
            key: Some(key.clone()),
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        match self.slot.entry(key.content_hash() & self.hash_mask) {
            Entry::Vacant(e) => {
                e.insert(i);
            }
            Entry::Occupied(_) => {
                self.overflow.insert(key.clone(), i);
            }
        }
        self.push_back(i);
    }
    fn on_hit(&mut self, key: &CacheKey, _ctx: &AccessContext) {
        if let Some(i) = self.find(key) {
            self.bump_slot(i);
        }
    }
    fn on_remove(&mut self, key: &CacheKey) {
        let h = key.content_hash() & self.hash_mask;
        let i = match self.slot.get(&h) {
            Some(&i) if self.nodes[i as usize].key.as_ref() == Some(key) => {
                self.slot.remove(&h);
                i
            }
            _ => match self.overflow.remove(key) {
                Some(i) => i,
                None => return,
            },
        };
        self.unlink(i);
        self.nodes[i as usize].key = None;
        self.free.push(i);
    }
    fn victim(&mut self) -> Option<CacheKey> {
        if self.head == NIL {
            return None;
        }
        self.nodes[self.head as usize].key.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

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

    /// The previous implementation (tick -> key in a `BTreeMap`), kept as the oracle.
    #[derive(Default)]
    struct TickLru {
        tick: u64,
        stamp: HashMap<CacheKey, u64>,
        order: BTreeMap<u64, CacheKey>,
    }

    impl TickLru {
        fn bump(&mut self, key: &CacheKey) {
            self.tick += 1;
            if let Some(old) = self.stamp.insert(key.clone(), self.tick) {
                self.order.remove(&old);
            }
            self.order.insert(self.tick, key.clone());
        }
        fn hit(&mut self, key: &CacheKey) {
            if self.stamp.contains_key(key) {
                self.bump(key);
            }
        }
        fn remove(&mut self, key: &CacheKey) {
            if let Some(t) = self.stamp.remove(key) {
                self.order.remove(&t);
            }
        }
        fn victim(&self) -> Option<CacheKey> {
            self.order.first_key_value().map(|(_, k)| k.clone())
        }
    }

    proptest! {
        /// Any sequence of inserts (new or re-inserted), hits (resident or not) and
        /// removes gives the same victim after every step as the tick/BTreeMap LRU.
        #[test]
        fn same_victims_as_tick_order(
            ops in proptest::collection::vec((0u8..4, 0u64..24), 1..400),
            collide in any::<bool>(),
        ) {
            let ctx = AccessContext::default();
            let mut p = LruPolicy::new();
            if collide {
                // Four hash values for 24 keys: most keys go through `overflow`.
                p.hash_mask = 3;
            }
            let mut oracle = TickLru::default();
            for (op, id) in ops {
                let k = CacheKey::file("f", "v", id);
                match op {
                    0 | 1 => {
                        p.on_insert(&k, 1, &ctx);
                        oracle.bump(&k);
                    }
                    2 => {
                        p.on_hit(&k, &ctx);
                        oracle.hit(&k);
                    }
                    _ => {
                        // Remove the victim half the time (what TierSpace does).
                        let v = if id % 2 == 0 { oracle.victim().unwrap_or(k) } else { k };
                        p.on_remove(&v);
                        oracle.remove(&v);
                    }
                }
                prop_assert_eq!(p.victim(), oracle.victim());
                prop_assert_eq!(p.len(), oracle.stamp.len());
            }
            // Draining gives the whole order, oldest first.
            while let Some(v) = oracle.victim() {
                prop_assert_eq!(p.victim(), Some(v.clone()));
                p.on_remove(&v);
                oracle.remove(&v);
            }
            prop_assert_eq!(p.victim(), None);
            prop_assert!(p.nodes.len() <= 24, "slots are reused");
        }
    }
}
