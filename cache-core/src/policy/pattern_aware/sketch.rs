//! [`Sketch`]: the aged count-min sketch the frequency side and the frequency guard's
//! shadow count accesses with.

use crate::stream::mix64;

/// Aged count-min sketch (4 rows of saturating u8 counters).
pub(super) struct Sketch {
    rows: Vec<u8>,
    mask: usize,
    adds: u64,
    age_every: u64,
}

impl Sketch {
    pub(super) fn new(width: usize) -> Self {
        let w = width.max(64).next_power_of_two();
        Sketch {
            rows: vec![0; 4 * w],
            mask: w - 1,
            adds: 0,
            age_every: 10 * w as u64,
        }
    }
    #[inline]
    pub(super) fn idx(&self, h: u64, row: usize) -> usize {
        let w = self.mask + 1;
        let hr = mix64(h ^ (row as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        row * w + (hr as usize & self.mask)
    }
    /// Ages every `10 x items` increments (TinyLFU's sample size), at least 4096. With
    /// `grow`, widens the rows (up to `max_width`) so that one sample period adds at
    /// most one increment per counter on average (`width >= age_every`).
    pub(super) fn set_items(&mut self, items: usize, grow: bool, max_width: usize) {
        self.age_every = (10 * items as u64).max(4096);
        if grow {
            let want = (self.age_every as usize)
                .next_power_of_two()
                .min(max_width.max(64).next_power_of_two());
            if want > self.mask + 1 {
                self.grow(want);
            }
        }
    }

    /// Widens every row to `width` (a power of two, larger than now). A key's counter in
    /// a row is at `hash & mask`, so its new counter starts from its old one (`i & old
    /// mask`): every estimate stays at least the key's true count (the count-min
    /// guarantee), and the inherited collisions fade with the next agings.
    pub(super) fn grow(&mut self, width: usize) {
        let old_w = self.mask + 1;
        let mut rows = vec![0u8; 4 * width];
        for r in 0..4 {
            let old = &self.rows[r * old_w..(r + 1) * old_w];
            for (i, c) in rows[r * width..(r + 1) * width].iter_mut().enumerate() {
                *c = old[i & self.mask];
            }
        }
        self.rows = rows;
        self.mask = width - 1;
    }

    #[cfg(test)]
    pub(super) fn width(&self) -> usize {
        self.mask + 1
    }
    /// Counts `h`; returns whether the counters were just aged (halved).
    pub(super) fn add(&mut self, h: u64) -> bool {
        for r in 0..4 {
            let i = self.idx(h, r);
            let c = &mut self.rows[i];
            *c = c.saturating_add(1);
        }
        self.adds += 1;
        if self.adds >= self.age_every {
            self.adds = 0;
            for c in &mut self.rows {
                *c /= 2;
            }
            return true;
        }
        false
    }
    pub(super) fn estimate(&self, h: u64) -> u64 {
        (0..4)
            .map(|r| self.rows[self.idx(h, r)])
            .min()
            .map_or(0, u64::from)
    }
}
