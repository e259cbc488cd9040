//! The frequency side: the recency window, the frequency main and the W-TinyLFU contest
//! between them, their ranking, ghost lists and the window's learnt share (module docs of
//! `pattern_aware`, "Recency vs frequency: the adaptive window").

use super::*;

impl PatternAwarePolicy {
    /// The W-TinyLFU admission test of the frequency main: an empty main takes
    /// anything; otherwise the candidate's sketch frequency must reach that of the
    /// main's least frequent item.
    pub(super) fn main_admits(&self, h: u64) -> bool {
        match self.freq.first_key_value() {
            None => true,
            Some((_, &k)) => {
                let hm = self.slots[k as usize].e.hash;
                // At least as frequent (not strictly, as in the eviction contest):
                // nothing is displaced by this move itself, and a hot set read in a
                // cycle has all its members at the same count.
                self.sketch.estimate(h) >= self.sketch.estimate(hm)
            }
        }
    }

    /// The main's order of an item (`e.order` holds its sketch frequency): rank, tie
    /// rank, sequence.
    pub(super) fn freq_key(&self, e: &Entry) -> (u64, u64, u64) {
        (
            self.freq_rank(e.order, self.rank_bytes(e)),
            self.freq_tie_rank(e.size),
            e.seq,
        )
    }

    /// The bytes an item's reuse is spread over in the main's rank: its own size, or
    /// with `main_ranks_by_read` the read that brought it in (capped at
    /// `RANK_READ_MAX`): a hit on one block of a 1.5 MB adapter read whole still waits
    /// for the other, so the two rank as one.
    pub(super) fn rank_bytes(&self, e: &Entry) -> u64 {
        if self.cfg.main_ranks_by_read {
            e.read_bytes.min(RANK_READ_MAX).max(e.size)
        } else {
            e.size
        }
    }

    /// First key of the main's order for an item of sketch frequency `f` and `size`
    /// bytes: `(f - 1) / size` in units of 2^-32 per byte (`main_ranks_by_density`;
    /// `f` <= 255, so it fits), else `f`.
    pub(super) fn freq_rank(&self, f: u64, size: u64) -> u64 {
        if !self.cfg.main_ranks_by_density {
            f
        } else {
            (f.saturating_sub(1) << 32) / size.max(1)
        }
    }

    /// Second key of the main's order, after the rank: among items of equal rank the
    /// largest goes first (`freq_ties_largest_first`), else 0 (oldest first). Evicting
    /// the largest of equally ranked items frees the most space per expected lost hit
    /// (items read once all rank 0 under `main_ranks_by_density`).
    pub(super) fn freq_tie_rank(&self, size: u64) -> u64 {
        if self.cfg.freq_ties_largest_first {
            u64::MAX - size
        } else {
            0
        }
    }

    pub(super) fn ghost_cap(&self) -> u64 {
        (self.cap as f64 * self.cfg.ghost_share) as u64
    }

    /// Bytes each segment's ghost list remembers: at least the stable-vs-freq probe.
    pub(super) fn segment_ghost_cap(&self) -> u64 {
        let share = self.cfg.window_ghost_share.max(self.cfg.ghost_share);
        (self.cap as f64 * share) as u64
    }

    /// A demand miss on a key the window evicted recently would have hit with a larger
    /// window; one the main evicted, with a larger main. Both ghost lists reach back the
    /// same number of evicted bytes, so under H0 ("the same extra space is worth as
    /// much in either segment") a ghost hit falls in either list with probability 1/2.
    /// Once `window_min_votes` hits are in, a two-sided binomial test at
    /// `window_alpha` decides: reject and the share moves one `rebalance_step` toward
    /// the segment that hit more, and the count restarts under the new share. The share
    /// therefore moves as fast as the evidence arrives (kv-prefix has few misses,
    /// Mooncake many) and stays put while the two are even.
    pub(super) fn window_evidence(&mut self, seg: usize) {
        if !self.cfg.adapt_window {
            return;
        }
        self.window_votes[seg] += 1;
        let [w, m] = self.window_votes;
        let n = w + m;
        if n < self.cfg.window_min_votes.max(1) {
            return;
        }
        if self.sign_test.rejects(n, w.max(m), self.cfg.window_alpha) {
            let base = if w > m {
                self.cfg.rebalance_step
            } else {
                -self.cfg.rebalance_step
            };
            let step = if self.cfg.window_step_doubles && self.window_last_step * base > 0.0 {
                self.window_last_step * 2.0
            } else {
                base
            };
            self.window_last_step = step;
            self.window_share =
                (self.window_share + step).clamp(self.cfg.window_min_share.min(1.0), 1.0);
            self.window_votes = [0; 2];
        } else if n >= 16 * self.cfg.window_min_votes.max(1) {
            // Old evidence fades so a changed workload is seen.
            self.window_votes = [w / 2, m / 2];
        }
    }

    /// Counts an access in the sketch; when that ages the sketch, halves the
    /// frequency keys of `freq` too, so items touched after the aging are not ranked
    /// below stale ones (O(n) every 10n accesses).
    pub(super) fn count(&mut self, h: u64) {
        if !self.sketch.add(h) {
            return;
        }
        let old = std::mem::take(&mut self.freq);
        for id in old.into_values() {
            let e = &mut self.slots[id as usize].e;
            e.order = (e.order / 2).max(1);
            let key = self.freq_key(&self.slots[id as usize].e);
            self.freq.insert(key, id);
        }
    }

    /// W-TinyLFU between the recency window and the frequency main. While the window
    /// is over its share, its oldest item graduates to the main if the main is under
    /// its own share; otherwise that candidate competes with the main's least frequent
    /// item by sketch frequency and the loser is the victim (a winning candidate moves
    /// to the main). With the window within its share, the main's least frequent goes.
    pub(super) fn freq_victim(&mut self) -> Option<u32> {
        let side = (self.bytes[3] + self.bytes[4]) as f64;
        let window_target = self.window_share * side;
        let main_target = side - window_target;
        let mut contest = None;
        while self.bytes[4] as f64 > window_target {
            let Some((_, &c)) = self.window.first_key_value() else {
                break;
            };
            // The block of the latest demand access (its reader is most likely in the
            // middle of it) is not the contest's candidate: at a tie it would lose to
            // any dead frequency-1 item of the main, and a window smaller than one block
            // makes it the candidate of every prefetch fill (`etl` at 10%: readahead
            // evicted the block being read 8 KiB at a time, which was fetched again).
            if self.cfg.window_keeps_last_demanded
                && self.last_demanded.is_some()
                && Some(self.slots[c as usize].e.hash) == self.last_demanded
            {
                break;
            }
            let Entry { size, in_order, .. } = self.slots[c as usize].e;
            // A whole file read in order joins the main without a contest only while
            // the main fills (has room for it and one more, and has never had to give
            // up an item; see `Entry::in_order`): moved in whenever the window was one
            // item over its share, a pass's files made the main evict its least
            // frequent, the file the pass reads next (0 hits); and with prefetch the
            // window fills with read-ahead files and the share's room is no guide.
            let room = if !in_order {
                main_target
            } else if self.victims[pool_ix(Pool::Freq)] == 0 {
                main_target - size as f64
            } else {
                0.0
            };
            if self.freq.is_empty() || ((self.bytes[3] + size) as f64) <= room {
                self.move_to(c, Pool::Freq);
            } else {
                contest = Some(c);
                break;
            }
        }
        let main = self.freq.first_key_value().map(|(_, &k)| k);
        let pick = match (contest, main) {
            (Some(c), Some(m)) => {
                let (ec, em) = (self.slots[c as usize].e, self.slots[m as usize].e);
                let (fc, fm) = (self.sketch.estimate(ec.hash), self.sketch.estimate(em.hash));
                // At a tie the smaller item stays, as in the main's own order.
                let smaller_tie = self.cfg.freq_ties_largest_first && fc == fm && ec.size < em.size;
                // A whole file read in order must lead by more than the one read a
                // pass puts between what it just read and what it reads next.
                let lead = u64::from(ec.in_order);
                // Ranked as the main ranks (per byte, `main_ranks_by_density`); at an
                // equal rank, by frequency and the tie rule.
                let (rc, rm) = (
                    self.freq_rank(fc, self.rank_bytes(&ec)),
                    self.freq_rank(fm + lead, self.rank_bytes(&em)),
                );
                if rc > rm || (rc == rm && (fc > fm + lead || (smaller_tie && lead == 0))) {
                    self.move_to(c, Pool::Freq);
                    m
                } else {
                    c
                }
            }
            (None, Some(m)) => m,
            (Some(c), None) => c,
            (None, None) => match self.window.first_key_value() {
                Some((_, &c)) => c,
                None => return None,
            },
        };
        self.last_victim = Some(self.slots[pick as usize].e.hash);
        Some(pick)
    }

    pub(super) fn push_ghost(&mut self, h: u64, size: u64, seg: usize) {
        let seq = self.next_seq();
        self.ghost.insert(
            h,
            Ghost {
                seq,
                seg,
                pos: self.evicted_freq,
            },
        );
        if seg < 2 {
            self.evicted_freq += size;
        }
        self.ghost_fifo[seg].push_back((h, size, seq));
        self.ghost_bytes[seg] += size;
        // Every list reaches the same marginal probe (`segment_ghost_cap`), the consumed
        // queue's too: with a whole cache of reach (ARC's B1) it caught a shuffled
        // epoch's chance re-reads and grew past the stable subset's share (the
        // `shuffled_epochs_keep_a_stable_subset` test lost a third of its hits). At
        // least the newest victim is kept, so on a small cache (probe < one block) a
        // block re-read right after its eviction still counts.
        let cap = self.segment_ghost_cap();
        while self.ghost_bytes[seg] > cap && self.ghost_fifo[seg].len() > 1 {
            let Some((gh, gs, gseq)) = self.ghost_fifo[seg].pop_front() else {
                break;
            };
            self.ghost_bytes[seg] -= gs;
            if self.ghost.get(&gh).is_some_and(|g| g.seq == gseq) {
                self.ghost.remove(&gh);
            }
        }
    }
}
