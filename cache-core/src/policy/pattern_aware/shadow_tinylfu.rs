//! A W-TinyLFU of key hashes and sizes, no data: what frequency-ranked admission would
//! hold at a capacity (the frequency guard's shadow, [`super::frequency_guard`]).
//!
//! Caffeine's design reduced to what decides hits: a recency *window* of
//! [`WINDOW_SHARE`] of the capacity takes every new key; the window's oldest then
//! competes for the *main* (an LRU of the rest) with the main's oldest, and enters only
//! if an aged count-min sketch of every access counts it more often (TinyLFU's
//! admission: a key read once cannot push out one read twice). Caffeine splits its main
//! into probation and protected segments and adapts the window; the shadow needs
//! neither to say whether ranking by frequency out-hits the policy. Sampled as
//! [`super::shadow_lru::ShadowLru`] is (SHARDS), so memory and time stay bounded.

use std::collections::HashMap;

use super::shadow_lru::Sample;
use super::{SeqQueue, Sketch};
use crate::stream::FxBuild;

/// The window's share of the capacity: 1%, Caffeine's starting (and most often best)
/// window. Where recency wins, the recency guard's shadow LRU says so.
const WINDOW_SHARE: f64 = 0.01;

/// The sketch's widest rows: 2^20 counters (4 MiB), ten times the keys of a sampled
/// shadow of 1 MiB blocks.
const SKETCH_MAX_WIDTH: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct Shadowed {
    seq: u64,
    pos: u64,
    size: u64,
    main: bool,
}

/// See the module docs.
pub(super) struct ShadowTinyLfu {
    sample: Sample,
    map: HashMap<u64, Shadowed, FxBuild>,
    window: SeqQueue<u64>,
    main: SeqQueue<u64>,
    window_bytes: u64,
    main_bytes: u64,
    sketch: Sketch,
    seq: u64,
}

impl ShadowTinyLfu {
    pub(super) fn new(cap: u64) -> Self {
        let mut s = ShadowTinyLfu {
            sample: Sample::for_capacity(0),
            map: HashMap::default(),
            window: SeqQueue::default(),
            main: SeqQueue::default(),
            window_bytes: 0,
            main_bytes: 0,
            sketch: Sketch::new(64),
            seq: 0,
        };
        s.set_capacity(cap);
        s
    }

    /// The cache's capacity changed (or became known): the shadow follows it.
    pub(super) fn set_capacity(&mut self, cap: u64) {
        self.sample = Sample::for_capacity(cap);
        self.trim_main();
    }

    /// Whether the key of hash `h` is in the sample (only sampled keys are touched).
    pub(super) fn sampled(&self, h: u64) -> bool {
        self.sample.contains(h)
    }

    fn window_cap(&self) -> u64 {
        (self.sample.cap as f64 * WINDOW_SHARE) as u64
    }

    /// The shadow's access: whether it held `h`; `h` is then the youngest of its segment
    /// (a new key the window's).
    pub(super) fn touch(&mut self, h: u64, size: u64) -> bool {
        self.seq += 1;
        let seq = self.seq;
        self.sketch.add(h);
        if let Some(s) = self.map.get_mut(&h) {
            let (queue, bytes) = if s.main {
                (&mut self.main, &mut self.main_bytes)
            } else {
                (&mut self.window, &mut self.window_bytes)
            };
            queue.remove_at(&s.seq, s.pos);
            *bytes = *bytes - s.size + size;
            s.seq = seq;
            s.size = size;
            s.pos = queue.insert(seq, h);
            return true;
        }
        let pos = self.window.insert(seq, h);
        self.map.insert(
            h,
            Shadowed {
                seq,
                pos,
                size,
                main: false,
            },
        );
        self.window_bytes += size;
        self.sketch
            .set_items(self.map.len(), true, SKETCH_MAX_WIDTH);
        self.trim_window();
        false
    }

    /// Moves the window's oldest to the main's contest until the window fits its share
    /// (the newest always stays, as a cache smaller than one item holds the item just
    /// read).
    fn trim_window(&mut self) {
        while self.window_bytes > self.window_cap() && self.map.len() > 1 {
            if self
                .window
                .first_key_value()
                .is_none_or(|(&seq, _)| seq == self.seq)
            {
                break;
            }
            let Some((_, c)) = self.window.pop_first() else {
                break;
            };
            let Some(s) = self.map.get(&c).copied() else {
                continue;
            };
            self.window_bytes -= s.size;
            self.contest(c, s);
        }
    }

    /// The window's victim `c` enters the main if it fits, else if the sketch counts it
    /// more often than each main victim it would displace; otherwise it leaves.
    fn contest(&mut self, c: u64, s: Shadowed) {
        let main_cap = self.sample.cap.saturating_sub(self.window_cap());
        let fc = self.sketch.estimate(c);
        while self.main_bytes + s.size > main_cap {
            let Some((_, &v)) = self.main.first_key_value() else {
                break;
            };
            if fc <= self.sketch.estimate(v) {
                self.map.remove(&c);
                return;
            }
            self.evict_main_oldest();
        }
        let pos = self.main.insert(s.seq, c);
        self.main_bytes += s.size;
        self.map.insert(
            c,
            Shadowed {
                pos,
                main: true,
                ..s
            },
        );
    }

    /// Drops the main's oldest until window and main fit the capacity (after it shrank).
    fn trim_main(&mut self) {
        while self.window_bytes + self.main_bytes > self.sample.cap {
            if !self.evict_main_oldest() {
                break;
            }
        }
    }

    /// Drops the main's oldest key; false when the main is empty.
    fn evict_main_oldest(&mut self) -> bool {
        let Some((_, v)) = self.main.pop_first() else {
            return false;
        };
        if let Some(s) = self.map.remove(&v) {
            self.main_bytes -= s.size;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u64) -> u64 {
        crate::stream::mix64(i + 1)
    }

    #[test]
    fn a_key_read_once_does_not_push_out_one_read_often() {
        let mb = 1 << 20;
        let mut s = ShadowTinyLfu::new(8 * mb);
        // A hot set of 4 blocks read 5 times each: resident.
        for _ in 0..5 {
            for i in 0..4 {
                s.touch(h(i), mb);
            }
        }
        // A scan of 100 blocks read once each passes through the window and loses
        // every contest against the hot set.
        for i in 100..200 {
            assert!(!s.touch(h(i), mb));
        }
        for i in 0..4 {
            assert!(s.touch(h(i), mb), "hot block {i} kept through the scan");
        }
    }

    #[test]
    fn a_key_read_more_often_than_the_mains_oldest_takes_its_place() {
        let mb = 1 << 20;
        let mut s = ShadowTinyLfu::new(4 * mb);
        for i in 0..4 {
            s.touch(h(i), mb);
        }
        // Block 9 read three times: by its third read it has won a place.
        s.touch(h(9), mb);
        s.touch(h(9), mb);
        s.touch(h(10), mb); // pushes 9 out of the one-block window into the contest
        assert!(s.touch(h(9), mb), "admitted to the main");
    }
}
