//! An LRU of key hashes and sizes, no data: what plain LRU would hold at a capacity.
//!
//! The recency guard compares the policy with one of the policy's own items
//! ([`super::recency_guard`]). Caches up to `FULL_SHADOW_BYTES` are shadowed whole. Above,
//! the shadow samples key hashes at `FULL_SHADOW_BYTES / capacity` (at least 1/64) and
//! holds that share of the capacity (SHARDS: an LRU of a spatially sampled key set at
//! the scaled capacity sees the same hit ratio), so its memory and time stay bounded.

use std::collections::HashMap;

use super::SeqQueue;
use crate::stream::FxBuild;

/// Caches shadowed whole: 256 MiB, 256 default blocks; beyond, the shadow holds about
/// that many bytes of sampled keys, enough blocks for LRU's hit ratio to show.
const FULL_SHADOW_BYTES: u64 = 256 << 20;

/// Lowest sampling rate: 1/64, so a large cache still votes every few dozen accesses.
const MIN_RATE: f64 = 1.0 / 64.0;

/// The spatial sample a shadow of a `cap`-byte cache keeps (module docs): the keys
/// whose hash's top 32 bits are below [`Self::below`], at [`Self::cap`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sample {
    below: u64,
    /// The sampled shadow's capacity: the cache's, scaled by the sampling rate.
    pub(super) cap: u64,
}

impl Sample {
    pub(super) fn for_capacity(cap: u64) -> Self {
        let rate = if cap == 0 {
            0.0 // capacity not known yet: nothing is sampled
        } else if cap <= FULL_SHADOW_BYTES {
            1.0
        } else {
            (FULL_SHADOW_BYTES as f64 / cap as f64).max(MIN_RATE)
        };
        Sample {
            below: (rate * (1u64 << 32) as f64) as u64,
            cap: (cap as f64 * rate) as u64,
        }
    }

    /// Whether the key of hash `h` is in the sample.
    pub(super) fn contains(&self, h: u64) -> bool {
        (h >> 32) < self.below
    }
}

#[derive(Clone, Copy, Debug)]
struct Shadowed {
    seq: u64,
    pos: u64,
    size: u64,
}

/// See the module docs.
pub(super) struct ShadowLru {
    sample: Sample,
    map: HashMap<u64, Shadowed, FxBuild>,
    order: SeqQueue<u64>,
    bytes: u64,
    seq: u64,
}

impl ShadowLru {
    pub(super) fn new(cap: u64) -> Self {
        let mut s = ShadowLru {
            sample: Sample::for_capacity(0),
            map: HashMap::default(),
            order: SeqQueue::default(),
            bytes: 0,
            seq: 0,
        };
        s.set_capacity(cap);
        s
    }

    /// The cache's capacity changed (or became known): the shadow follows it.
    pub(super) fn set_capacity(&mut self, cap: u64) {
        self.sample = Sample::for_capacity(cap);
        self.trim();
    }

    /// Whether the key of hash `h` is in the sample (only sampled keys are touched).
    pub(super) fn sampled(&self, h: u64) -> bool {
        self.sample.contains(h)
    }

    /// Accesses so far (the youngest's sequence number).
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }

    /// A read of `h` that brings nothing in: if the shadow holds it, it is its
    /// youngest again (true); otherwise nothing changes (false).
    pub(super) fn touch_held(&mut self, h: u64) -> bool {
        let Some(size) = self.map.get(&h).map(|s| s.size) else {
            return false;
        };
        self.touch(h, size)
    }

    /// The shadow LRU's access: whether it held `h`; `h` is then its youngest.
    pub(super) fn touch(&mut self, h: u64, size: u64) -> bool {
        self.seq += 1;
        let seq = self.seq;
        let hit = match self.map.get_mut(&h) {
            Some(s) => {
                self.order.remove_at(&s.seq, s.pos);
                self.bytes = self.bytes - s.size + size;
                s.seq = seq;
                s.size = size;
                s.pos = self.order.insert(seq, h);
                true
            }
            None => {
                let pos = self.order.insert(seq, h);
                self.map.insert(h, Shadowed { seq, pos, size });
                self.bytes += size;
                false
            }
        };
        self.trim();
        hit
    }

    /// Drops the shadow's oldest until it fits its capacity (the newest always stays,
    /// as a cache smaller than one item still holds the item just read).
    fn trim(&mut self) {
        while self.bytes > self.sample.cap && self.map.len() > 1 {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some(s) = self.map.remove(&old) {
                self.bytes -= s.size;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u64) -> u64 {
        crate::stream::mix64(i + 1)
    }

    #[test]
    fn the_shadow_is_an_lru_of_the_capacity() {
        let mut s = ShadowLru::new(4 << 20);
        let mb = 1 << 20;
        for i in 0..4 {
            assert!(!s.touch(h(i), mb));
        }
        assert!(s.touch(h(0), mb), "resident");
        assert!(!s.touch(h(4), mb), "new: evicts 1, the least recent");
        assert!(!s.touch(h(1), mb));
        assert!(s.touch(h(0), mb));
    }

    #[test]
    fn a_large_cache_is_sampled() {
        let mut s = ShadowLru::new(64 << 30);
        assert_eq!(s.sample.below, (MIN_RATE * (1u64 << 32) as f64) as u64);
        let mut sampled = 0;
        for i in 0..10_000u64 {
            s.touch(h(i), 1 << 20);
            if s.sampled(h(i)) {
                sampled += 1;
            }
        }
        assert!((100..220).contains(&sampled), "{sampled} of 10000 at 1/64");
    }
}
