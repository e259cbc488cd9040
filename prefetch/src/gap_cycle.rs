//! Reads that repeat a cycle of gaps: strided and column-projected readers.
//!
//! A reader of a few columns of a row-batched file (Arrow IPC / Feather with a column
//! projection: per record batch its metadata, then each projected column's buffer) or of
//! a tensor slice (a tensor-parallel rank reading its piece of every row) neither reads
//! contiguously nor at random: the gaps between its reads repeat with a short period
//! (`[1049440, 6815744, 524288]` again and again in held-out `feather`, one gap per
//! projected buffer). Sequential readahead never fires on it (no contiguous run) and
//! every read is a demand miss; a CPU's delta-correlating prefetcher (DCPT) answers the
//! same shape by replaying the gaps that followed the last time the recent gaps
//! occurred. [`GapCycle`] keeps the last [`HISTORY`] reads of one stream and finds the
//! shortest period `P <= MAX_PERIOD` whose last cycle of gaps equals the one before it
//! (at least 2 matching gaps for `P = 1`, so a stride needs four reads); the next reads
//! are then predicted by continuing the cycle, each as long as the read one period back,
//! and [`GapCycle::proven`] says how many gaps in a row the cycle has held for (the
//! sequential predictor reads no further ahead than twice that).
//!
//! Evidence, not hope: random reads almost never repeat a cycle of exact byte gaps, and a
//! cycle whose steps all continue the read before (forwards or backwards) is a run, left
//! to the sequential predictor's run rules; a cycle of net gap zero (re-reading
//! the same offsets) predicts nothing new. Pure logic; the sequential predictor owns one
//! per stream and decides how far ahead to ask.

/// Longest cycle of gaps recognised: 8 (a projection of up to 7 columns plus the
/// batch's metadata read, or 8 threads of one job reading one file in turns).
pub const MAX_PERIOD: usize = 8;

/// Reads remembered per stream: 17, the 16 gaps of two cycles of the longest period.
pub const HISTORY: usize = 2 * MAX_PERIOD + 1;

/// The last reads of one stream, for cycle detection. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct GapCycle {
    offsets: [u64; HISTORY],
    lens: [u64; HISTORY],
    /// Reads pushed so far (the ring's write position is `pushed % HISTORY`).
    pushed: u64,
}

impl GapCycle {
    /// Records a read of `len` bytes at `offset`.
    pub fn push(&mut self, offset: u64, len: u64) {
        let i = (self.pushed % HISTORY as u64) as usize;
        self.offsets[i] = offset;
        self.lens[i] = len;
        self.pushed += 1;
    }

    /// The `k`-th most recent read (0: the last), if remembered.
    fn read(&self, k: usize) -> Option<(u64, u64)> {
        if k >= HISTORY || k as u64 >= self.pushed {
            return None;
        }
        let i = ((self.pushed - 1 - k as u64) % HISTORY as u64) as usize;
        Some((self.offsets[i], self.lens[i]))
    }

    /// The gap into the `k`-th most recent read from the one before it.
    fn gap(&self, k: usize) -> Option<i128> {
        let (o, _) = self.read(k)?;
        let (p, _) = self.read(k + 1)?;
        Some(i128::from(o) - i128::from(p))
    }

    /// Whether the `k`-th most recent read just continues the read before it, forwards
    /// or backwards (a step of a run).
    fn contiguous(&self, k: usize) -> bool {
        match (self.read(k), self.read(k + 1)) {
            (Some((o, l)), Some((p, pl))) => {
                p.checked_add(pl) == Some(o) || o.checked_add(l) == Some(p)
            }
            _ => false,
        }
    }

    /// The shortest period of gaps the recent reads repeat (see the module docs).
    pub fn period(&self) -> Option<usize> {
        self.proven().map(|(p, _)| p)
    }

    /// The period (as [`Self::period`]) and how many of the latest gaps repeat the gap
    /// one period before them in a row: how far the cycle has proven itself (at least
    /// `max(P, 2)`, at most `HISTORY - 1 - P`). A reader whose skips only happen to
    /// repeat for a moment (tar skipping members whose sizes round to the same number of
    /// records) has proven little; a tensor slice read row by row, the whole history.
    pub fn proven(&self) -> Option<(usize, usize)> {
        // The gaps, newest first, read out of the ring once: this runs at every read of
        // a stream off a run that breaks its cycle (every read of a random one).
        let mut gaps = [0i128; HISTORY - 1];
        let mut n = 0;
        while let Some(g) = gaps.get_mut(n).and(self.gap(n)) {
            gaps[n] = g;
            n += 1;
        }
        let gaps = &gaps[..n];
        (1..=MAX_PERIOD).find_map(|p| {
            let matched = (0..n.saturating_sub(p))
                .take_while(|&j| gaps[j] == gaps[j + p])
                .count();
            if matched < p.max(2) {
                return None;
            }
            let net: i128 = gaps[..p].iter().sum();
            let all_contiguous = (0..p).all(|j| self.contiguous(j));
            (net != 0 && !all_contiguous).then_some((p, matched))
        })
    }

    /// The offset of the next read a cycle of period `p` (from [`Self::proven`])
    /// predicts: the gap into it repeats the gap into the read one period before it.
    pub fn next_after(&self, p: usize) -> Option<u64> {
        let (at, _) = self.read(0)?;
        let next = i128::from(at) + self.gap(p.checked_sub(1)?)?;
        u64::try_from(next).ok()
    }

    /// Appends the next `n` reads a cycle of period `p` (from [`Self::proven`])
    /// predicts, as `(offset, len)`, nearest first, after skipping the first `skip`
    /// (already asked for); stops at offset 0 or `file_size` (when known, non-zero).
    pub fn predict(
        &self,
        p: usize,
        skip: usize,
        n: usize,
        file_size: u64,
        out: &mut Vec<(u64, u64)>,
    ) {
        if p == 0 {
            return;
        }
        let Some((mut at, _)) = self.read(0) else {
            return;
        };
        for step in 0..skip + n {
            // The read `step + 1` ahead repeats the read one period before it: the gap
            // into it and its length.
            let back = p - 1 - (step % p);
            let (Some(gap), Some((_, len))) = (self.gap(back), self.read(back)) else {
                return;
            };
            let next = i128::from(at) + gap;
            if next < 0 || next > i128::from(u64::MAX) {
                return;
            }
            at = next as u64;
            if file_size > 0 && at >= file_size {
                return;
            }
            if step >= skip {
                let len = if file_size > 0 {
                    len.min(file_size - at)
                } else {
                    len.min(u64::MAX - at)
                };
                out.push((at, len));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(reads: &[(u64, u64)]) -> GapCycle {
        let mut c = GapCycle::default();
        for &(o, l) in reads {
            c.push(o, l);
        }
        c
    }

    /// Held-out `feather`'s shape: per 8 MiB batch a metadata read, a 1 MiB and a 512
    /// KiB column buffer. After two batches the third is predicted exactly.
    #[test]
    fn a_projected_column_cycle_is_continued() {
        let batch = 8_390_320 - 848;
        let mut reads = Vec::new();
        for b in 0..3u64 {
            let base = 848 + b * batch;
            reads.push((base, 864));
            reads.push((base + 1_049_440, 1 << 20));
            reads.push((base + 1_049_440 + 6_815_744, 512 << 10));
        }
        // Two batches and the third's first read seen.
        let c = fed(&reads[..7]);
        assert_eq!(c.period(), Some(3));
        let mut out = Vec::new();
        c.predict(3, 0, 5, 1 << 30, &mut out);
        assert_eq!(&out[..2], &reads[7..9]);
        let base = 848 + 3 * batch;
        assert_eq!(
            &out[2..],
            &[
                (base, 864),
                (base + 1_049_440, 1 << 20),
                (base + 1_049_440 + 6_815_744, 512 << 10)
            ]
        );
        // Skipping what was asked for already.
        let mut later = Vec::new();
        c.predict(3, 2, 3, 1 << 30, &mut later);
        assert_eq!(c.next_after(3), Some(out[0].0));
        assert_eq!(later, out[2..]);
    }

    /// A constant stride (one rank's piece of every row) needs four reads; three are
    /// not evidence.
    #[test]
    fn a_stride_needs_two_matching_gaps() {
        let three = fed(&[(100, 64), (1100, 64), (2100, 64)]);
        assert_eq!(three.period(), None);
        let four = fed(&[(100, 64), (1100, 64), (2100, 64), (3100, 64)]);
        assert_eq!(four.period(), Some(1));
        assert_eq!(four.proven(), Some((1, 2)));
        let long = fed(&(0..40).map(|i| (i * 1000, 64)).collect::<Vec<_>>());
        assert_eq!(
            long.proven(),
            Some((1, HISTORY - 2)),
            "bounded by the history"
        );
        let mut out = Vec::new();
        four.predict(1, 0, 3, 5000, &mut out);
        assert_eq!(out, vec![(4100, 64)], "stops at the file's end");
        let down = fed(&[(9000, 10), (8000, 10), (7000, 10), (6000, 10)]);
        let mut out = Vec::new();
        down.predict(1, 0, 10, 0, &mut out);
        assert_eq!(out.len(), 6, "downwards to offset 0: {out:?}");
    }

    /// Eight threads of one job each reading its eighth of a file in turns (round 19's
    /// `parload` when the scheduler keeps their order): the longest period, found once
    /// two turns of all eight are in (17 reads: the history's length).
    #[test]
    fn eight_readers_in_turn_are_a_period_of_eight() {
        let part = 6u64 << 20;
        let reads: Vec<(u64, u64)> = (0..17u64)
            .map(|k| ((k % 8) * part + (k / 8) * (1 << 20), 1 << 20))
            .collect();
        // (Within a turn the starts are a stride of their own: period 1 until the turn
        // wraps.)
        assert_eq!(fed(&reads[..16]).period(), Some(1));
        let c = fed(&reads);
        assert_eq!(c.period(), Some(8));
        assert_eq!(c.next_after(8), Some(part + 2 * (1 << 20)));
    }

    /// Contiguous runs, re-reads of the same offsets and random reads have no cycle.
    #[test]
    fn runs_rereads_and_random_reads_have_no_cycle() {
        let run = fed(&(0..10).map(|i| (i * 4096, 4096)).collect::<Vec<_>>());
        assert_eq!(run.period(), None, "sequential: the sequential predictor's");
        let back = fed(&(0..10).map(|i| ((20 - i) * 4096, 4096)).collect::<Vec<_>>());
        assert_eq!(back.period(), None, "a backward run: the backward rule's");
        let same = fed(&[(50, 8), (900, 8), (50, 8), (900, 8), (50, 8), (900, 8)]);
        assert_eq!(same.period(), None, "net gap zero");
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let random: Vec<(u64, u64)> = (0..200)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x % (1 << 30)) & !4095, 4096)
            })
            .collect();
        for w in random.windows(HISTORY) {
            assert_eq!(fed(w).period(), None);
        }
    }
}
