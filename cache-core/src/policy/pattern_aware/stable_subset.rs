//! The stable subset: the bottom-k hash sample that keeps scan data across epochs, its
//! proof of re-reading, its marginal-benefit probe (the band) and the aging of proofs (module
//! docs of `pattern_aware`, "How an item is placed" and "Space allocation by marginal benefit").

use super::*;

impl PatternAwarePolicy {
    /// "Seen before" filter: returns whether `h` was set, and sets it.
    pub(super) fn seen_check_set(&mut self, h: u64) -> bool {
        let bits = self.seen.len() * 64;
        let i = (h as usize) & (bits - 1);
        let (w, b) = (i / 64, i % 64);
        let was = self.seen[w] & (1 << b) != 0;
        if !was {
            self.seen[w] |= 1 << b;
            self.seen_set += 1;
            if self.seen_set > bits / 4 {
                self.seen.iter_mut().for_each(|x| *x = 0);
                self.scan_victim.iter_mut().for_each(|x| *x = 0);
                self.seen_set = 0;
                self.scan_seen_bytes = 0;
            }
        }
        was
    }

    /// Word and bit of `h` in the `seen` / `scan_victim` filters.
    pub(super) fn filter_bit(&self, h: u64) -> (usize, u64) {
        let i = (h as usize) & (self.seen.len() * 64 - 1);
        (i / 64, 1 << (i % 64))
    }

    /// Records where `h` was last evicted from: the scan path or elsewhere.
    pub(super) fn mark_scan_victim(&mut self, h: u64, scan: bool) {
        let (w, b) = self.filter_bit(h);
        if scan {
            self.scan_victim[w] |= b;
        } else {
            self.scan_victim[w] &= !b;
        }
    }

    /// Whether a miss on `h` may count in the stable band: its last eviction was from
    /// the scan path (or the check is off).
    pub(super) fn band_eligible(&self, h: u64) -> bool {
        if !self.cfg.band_needs_scan_victim {
            return true;
        }
        let (w, b) = self.filter_bit(h);
        self.scan_victim[w] & b != 0
    }

    /// Largest hash among the unproven members of the stable subset: a newcomer with
    /// a smaller hash replaces it.
    pub(super) fn stable_threshold(&self) -> Option<u64> {
        self.stable
            .last_key_value()
            .filter(|((tier, _, _), _)| *tier == UNPROVEN)
            .map(|((_, h, _), _)| *h)
    }

    /// Whether a scan item of hash `h` leaving the recency queue `consumed` joins the
    /// stable subset: while the subset is under its share of the retained space
    /// (subset + frequency side), or when its hash is below the subset's threshold.
    pub(super) fn stable_wants(&self, h: u64, size: u64) -> bool {
        let freq_side = self.bytes[3] + self.bytes[4];
        // With no frequency side the subset has the retained space to itself (`victim`
        // takes the subset's largest hash first then).
        if freq_side == 0 {
            return true;
        }
        let retained = self.bytes[2] + freq_side + size;
        if (self.bytes[2] + size) as f64 <= self.stable_share * retained as f64 {
            return true;
        }
        matches!(self.stable_threshold(), Some(t) if h < t)
    }

    /// Whether a scan item of hash `h` leaving the recency queue joins the stable subset
    /// as a proven member, whatever its hash (`stable_admits_frequent`): its sketch
    /// count is at least `2 f + 2` (and `stable_frequent_min`), `f` the count of the
    /// member it would displace (the subset's largest key). The sample assumes scan data
    /// is read about once per pass, so any fixed subset is as good as another; scan data
    /// that is in fact hot lost its space to a random sample of cold data (held-out
    /// `mixh3`: the jsonlog tenant's newest segments, re-read by every query, among the
    /// embed and cligrep tenants' blocks). The margin keeps loops as they were: in a
    /// pass over more than the cache every item is read equally often, and at a sketch
    /// aging (all counts halved) the newest read reaches at most `f / 2 + 1` against a
    /// displaced member's `f / 2`; the sketch's own overestimate is 0-1 per period
    /// (`sketch_follows_items`).
    pub(super) fn stable_takes_frequent(&self, h: u64) -> bool {
        if !self.cfg.stable_admits_frequent {
            return false;
        }
        let Some((_, &v)) = self.stable.last_key_value() else {
            return false;
        };
        let fv = self.sketch.estimate(self.slots[v as usize].e.hash);
        self.sketch.estimate(h) >= (2 * fv + 2).max(self.cfg.stable_frequent_min)
    }

    /// Marks the stable member of slot `id` proven (re-read), which ranks it below
    /// every unproven member in the eviction order until `age_proven`.
    pub(super) fn prove_stable(&mut self, id: u32) {
        let mut e = self.slots[id as usize].e;
        if e.pool != Pool::Stable || e.order == PROVEN {
            return;
        }
        self.unlink(&e);
        e.order = PROVEN;
        self.link(id, &mut e, Pool::Stable);
        self.slots[id as usize].e = e;
    }

    /// The hashes a stable subset larger by the probe size (`ghost_cap`) would hold:
    /// `(threshold, width)`, the band just above the threshold. With unproven members
    /// the hash density is the subset's own (its bytes over its threshold). With none
    /// (the subset empty, or holding only re-read members) a larger subset would take
    /// the smallest hashes of the scan population, so the band starts at 0 and its
    /// width is the probe's share of the scan bytes seen. Without that case a subset
    /// emptied while another tenant was hot never saw evidence again and stayed empty
    /// after that tenant ended (`mix`: a shuffled loader's second epoch, 2 hits).
    pub(super) fn stable_band(&self) -> Option<(u64, f64)> {
        let probe = self.ghost_cap() as f64;
        match self.stable_threshold() {
            Some(t) if self.bytes[2] > 0 => Some((t, t as f64 * probe / self.bytes[2] as f64)),
            _ if self.scan_seen_bytes > 0 => {
                let share = (probe / self.scan_seen_bytes as f64).min(1.0);
                Some((0, share * u64::MAX as f64))
            }
            _ => None,
        }
    }

    /// Proof of re-reading fades: once a capacity's worth of scan bytes has missed
    /// since the last aging, every proven member of the stable subset is unproven
    /// again (and proven anew by its next re-read). Without it, members proven by a
    /// job that has ended (a shard reader's second epoch) outranked every unproven one
    /// forever and the subset of a still running loader shrank to what they left
    /// (`mix` at 40%: 573 hits of 3,000 in the loader's second epoch, LRU 2,397).
    /// O(n log n) once per capacity of misses, so O(log n) amortised per miss.
    pub(super) fn age_proven(&mut self, size: u64) {
        if !self.cfg.age_proven || self.cap == 0 {
            return;
        }
        self.scan_miss_bytes += size;
        if self.scan_miss_bytes < self.cap.max(1) {
            return;
        }
        self.scan_miss_bytes = 0;
        let proven: Vec<((u64, u64, u64), u32)> = self
            .stable
            .range(..(UNPROVEN, 0, 0))
            .map(|(k, v)| (*k, *v))
            .collect();
        for ((_, h, sq), id) in proven {
            self.stable.remove(&(PROVEN, h, sq));
            self.stable.insert((UNPROVEN, h, sq), id);
            self.slots[id as usize].e.order = UNPROVEN;
        }
    }

    /// ARC's adaptation of the stable subset's share: a hit in the stable band (a miss
    /// a subset larger by the probe would have hit) grows the share by the item's share
    /// of the probe, a hit within the main's ghost probe shrinks it by as much, at most
    /// `rebalance_step` per hit. Both probes reach the same bytes, so the step is the
    /// same on either side (ARC's ratio is 1). The periodic rebalance alone moved 0.05
    /// per 1024 misses: on a trace of a few thousand misses (`mix`) the share could not
    /// follow the SQLite tenant (its JCT at 40% 12.0 s, 5.6 s with this). Unbounded, one
    /// ghost hit on a cache of a few blocks swung the whole share (`npy` at 20%).
    pub(super) fn stable_evidence(&mut self, size: u64, to_stable: bool) {
        if !self.cfg.adapt_stable_per_hit || self.cap == 0 {
            return;
        }
        let step = (size as f64 / self.ghost_cap().max(1) as f64).min(self.cfg.rebalance_step);
        self.scan_reuse_seen |= to_stable;
        self.stable_share = if to_stable {
            (self.stable_share + step).min(1.0)
        } else {
            (self.stable_share - step).max(0.0)
        };
    }
}
