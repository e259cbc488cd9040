//! Classification of one access stream as sequential, random (uniform) or skewed, by
//! explicit hypothesis tests (`statrs`), with a minimum sample size and hysteresis.
//!
//! # What is classified
//!
//! A stream is the sequence of *items* one job touches under one node of the access-stream
//! tree (blocks of a file, files of a directory, directories of a dataset, KV blocks of a
//! namespace; see [`crate::stream`]). Each item carries an *index* (block number, or the
//! trailing number of a file/directory name such as `shard-00042.tar` -> 42) and a 32-bit
//! *fingerprint* (its identity). Consecutive accesses to the same item are one *visit*;
//! only visits are counted, so a 1 MiB block read as four 256 KiB reads is one step.
//!
//! # The tests
//!
//! 1. **Sequential.** Statistic: `K`, the number of *forward-adjacent* steps (the next
//!    index is `last + 1 ..= last + gap`) among the last `M` steps. Null hypothesis H0:
//!    the stream draws items uniformly at random from the `n` items it spans, so each
//!    step is forward-adjacent independently with probability `p0 = gap / n` (clamped to
//!    `[p0_min, p0_max]`; `n` is the span of indices seen). Under H0, `K ~ Binomial(M,
//!    p0)`; the one-sided p-value `P(K >= k)` is `Binomial::sf(k - 1)`. Reject at `alpha`
//!    -> sequential. Why binomial: the per-step adjacency indicator is exactly Bernoulli
//!    under H0, the test is exact for small `M` (no normal approximation needed at the
//!    16-sample minimum), and interleaved readers that break some adjacencies still
//!    reject H0 as long as their adjacency share is well above `p0`.
//! 2. **Skewed.** Statistic: Pearson's chi-square over the visit counts of the distinct
//!    items in the last `window` visits (`statrs::stats_tests::chisquare::chisquare`,
//!    `k - 1` degrees of freedom). H0: all items seen are equally popular (uniform
//!    popularity). Reject at `alpha` -> skewed, and the Zipf exponent is estimated by
//!    least squares on log(count) against log(rank). Why chi-square over *observed*
//!    items: the population size is unknown; conditioning on the items seen drops the
//!    zero-count cells, which makes the test conservative (uniform streams over a large
//!    set give counts of 1 and a statistic near 0), and it needs no per-item state
//!    beyond the window.
//! 3. **Random** otherwise (enough samples, neither null rejected).
//! 4. **Reused across passes** (a flag of sequential streams, with the popularity test of
//!    2.: [`StreamStats::reused`]). A stream that sweeps its file in order pass after
//!    pass, each pass reading only part of it (a batch of sorted embedding ids, a query's
//!    row groups), can have hot items: the blocks holding popular rows are in nearly every
//!    pass. Test 2 cannot see it: 256 visits cover only 2-3 such passes, and a sweep
//!    visits an item at most once per pass, so its counts are *less* dispersed than test
//!    2's null. H0: each pass reads each of the `n` items the stream spans independently
//!    with one probability `p`. With `P` passes in the window (window length over the mean
//!    pass length; a pass ends where the index steps back), an item's count is
//!    `Binomial(P, p)` plus the partial pass: mean `m = W / n`, variance `v = m (1 - p) +
//!    f (1 - f) p^2` (`f` the fractional pass). Statistic `D = sum (c_i - m)^2 / v` over
//!    all `n` items (the zeros too: the span is known), `~ chi-square(n - 1)` under H0.
//!    One window is weak, so `D - (n - 1)` is summed over windows with weight 7/8 per
//!    window and compared with the sum's null standard deviation: above 3.09 (one-sided
//!    0.001) the stream is reused. Skipped for `P < 2` (one pass says nothing about
//!    reuse) and `p >= 0.8` (a pass that reads most of the file is a loop, the hash
//!    sample's case; at 0.85 the estimated pass length made uniform sweeps look reused
//!    in a quarter of the generated streams). Passes longer than half the window are
//!    tested on a sample of the items instead (`PassSample`: the items whose index
//!    hashes to 0 modulo a stride, in a window of their own that holds ~3 passes).
//!
//! 5. **Re-read** (a flag of random streams: [`StreamStats::reread`]): the window of
//!    visits holds at most half as many distinct items as visits (and at least 64
//!    visits). A shuffled epoch or uniform draws over more items than the window see
//!    each item about once; a random stream over a small set (a class directory a balanced
//!    sampler draws from as often as from one 100 times larger) re-reads within it.
//!    Uniform popularity *within* the stream says nothing of its items' popularity
//!    against other streams': the flag lets the policy rank them by frequency.
//!
//! Tests run every `test_every` visits once `min_samples` steps are in; a different
//! outcome replaces the current pattern only after `hysteresis` consecutive tests agree
//! (the first outcome of an unclassified stream is taken at once). Counts decay (halve)
//! every `2 * window` steps, so the tests look at recent behaviour in O(1) state.
//!
//! The false-classification rates and detection delays of these tests, measured on
//! generated streams of known type, are in `docs/PATTERNS.md` (and asserted in the tests
//! below with fixed seeds).

use statrs::distribution::{Binomial, DiscreteCDF};
use statrs::stats_tests::chisquare::chisquare;

use crate::pattern::Pattern;
use crate::stream::mix64;

pub mod eval;

/// Tunables of the classifier. Every default carries its reason.
#[derive(Clone, Debug)]
pub struct ClassifierConfig {
    /// Significance level of both tests: 0.01, the default; a false "sequential"
    /// costs prefetch bandwidth and a false "skewed" costs retention, so errors should be
    /// rare, while 0.01 still detects a clean sequential stream within ~16 visits.
    pub alpha: f64,
    /// Steps needed before any test: 16. Below that neither test has power at alpha=0.01
    /// for a stream that is only partly adjacent, and chi-square expectations are tiny.
    pub min_samples: u32,
    /// Visits kept for the popularity test: 256 fingerprints (1 KiB, grown lazily, so a
    /// file read in 3 blocks holds 3). With 128, Zipf(1) over 2,000 items was missed in
    /// 7% of streams; 256 brings that under 5% (docs/PATTERNS.md).
    pub window: usize,
    /// Visits between tests: 8, so test cost (a sort of the window and one incomplete
    /// beta evaluation) is amortised to a few ns per access.
    pub test_every: u32,
    /// Consecutive agreeing tests needed to change an established pattern: 2, which
    /// halves nothing in detection delay for fresh streams but stops single-test flaps.
    pub hysteresis: u8,
    /// A step is forward-adjacent when the index advances by 1..=gap: 2, tolerating one
    /// skipped block (a read served by another job, or a readahead hole).
    pub forward_gap: u64,
    /// Clamp of the null adjacency probability: at least 1/1024 (very long spans), at most
    /// 0.5 (tiny spans, where order is meaningless).
    pub p0_min: f64,
    pub p0_max: f64,
    /// Run the test of reuse across passes (4. in the module doc) on sequential streams:
    /// true. Without it a sweep that reads part of its file per pass, the same hot part
    /// in nearly every pass, was scan data (held-out `embed`: the item table's blocks
    /// holding popular rows, found by 2.4 passes per window; LFU kept them, JCT 1.13x
    /// LFU's at 40%).
    pub pass_reuse: bool,
    /// Weight of the previous windows' evidence in the test of reuse across passes:
    /// 0.875 per window, so about the last 8 windows (2,048 visits, as the pass length
    /// estimate) count. One window of 2-3 passes is too weak (embed's item table: D /
    /// dof 1.1-1.4 per window, about 1 standard deviation of the null), and in a model
    /// of the test on that table a weight of 0.5 (about 2 windows) left it below the
    /// bar in more than half its windows.
    pub pass_decay: f64,
    /// Bar of the test of reuse across passes, as a z-score of the summed evidence
    /// against its null mean and standard deviation: 3.09, one-sided alpha = 0.001.
    /// Stricter than `alpha` because the statistic's null is approximate (the pass
    /// length is estimated).
    pub pass_z: f64,
}

impl Default for ClassifierConfig {
    fn default() -> Self {
        ClassifierConfig {
            alpha: 0.01,
            min_samples: 16,
            window: 256,
            test_every: 8,
            hysteresis: 2,
            forward_gap: 2,
            p0_min: 1.0 / 1024.0,
            p0_max: 0.5,
            pass_reuse: true,
            pass_decay: 0.875,
            pass_z: 3.09,
        }
    }
}

/// Outcome of one round of tests, with the evidence behind it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TestOutcome {
    pub pattern: Pattern,
    /// p-value of the sequential (binomial) test.
    pub p_sequential: f64,
    /// p-value of the uniform-popularity (chi-square) test.
    pub p_uniform: f64,
    /// Estimated Zipf exponent when skewed (0 otherwise).
    pub zipf_s: f64,
}

/// Steps the pass length estimate averages over: 2,048, about 8 windows (the memory of
/// the test of reuse across passes).
const PASS_STEPS: u32 = 2048;

/// Reusable buffers for the tests, shared by all streams (no allocation per test).
#[derive(Default, Debug)]
pub struct Scratch {
    fps: Vec<u32>,
    counts: Vec<usize>,
}

/// Visits a stream's window must hold before [`StreamStats::reread`] can say it re-reads
/// its items: 64, a quarter of the default window, so that a few chance repeats among
/// the first visits of a shuffle say nothing.
const REREAD_MIN_VISITS: usize = 64;

/// The bounded per-stream evidence: decayed step counts, index span, and a ring of the
/// last `window` item fingerprints.
#[derive(Clone, Debug, Default)]
pub struct StreamStats {
    last_idx: u64,
    last_fp: u32,
    visits: u32,
    steps: u32,
    forward: u32,
    since_test: u32,
    min_idx: u64,
    max_idx: u64,
    ring: Vec<u32>,
    ring_pos: u32,
    pattern: Pattern,
    candidate: Pattern,
    streak: u8,
    zipf_s: f32,
    /// The last test found the stream sequential and its window's popularity skewed:
    /// each visit reads in order, but some items come back visit after visit.
    reused: bool,
    /// The last test found the stream random and its window re-reading its items: at
    /// most half as many distinct items as visits (see [`StreamStats::reread`]).
    reread: bool,
    /// Share of steps that go back (restart a pass): a moving average over about the
    /// last `PASS_STEPS` steps (weight `1 / min(steps, PASS_STEPS)` for the newest), so
    /// the mean pass length is `1 / pass_restarts`. Halving integer counts instead
    /// rounded the restarts down and made the passes look fewer and fuller: sweeps of
    /// 80% of a file were called reused in 200 of 200 streams.
    pass_restarts: f32,
    /// Test of reuse across passes: its evidence from the main window.
    pass_evidence: PassEvidence,
    /// The test's last outcome.
    pass_reused: bool,
    /// For passes longer than half the window: the test's own window of sampled items
    /// (allocated only for such streams).
    pass_sample: Option<Box<PassSample>>,
}

/// The window of the test of reuse across passes for a stream whose passes are longer
/// than half the main window: only the items whose index hashes to 0 modulo `stride`
/// are recorded, so `window` sampled visits span `stride` times as many and hold at
/// least 3 passes. Each sampled item's counts are as in the whole stream (spatial
/// sampling: the pass structure is the same), the span's sampled items are counted
/// exactly. Its evidence is its own (a new stride starts afresh). Kept from the
/// stream's 2,048th visit on (`PASS_STEPS`, when the pass length estimate has its full
/// memory) while it is sequential.
#[derive(Clone, Debug, Default)]
struct PassSample {
    stride: u32,
    ring: Vec<u32>,
    pos: u32,
    evidence: PassEvidence,
}

/// Evidence of the test of reuse across passes: the windows' statistics minus their null
/// means, summed with weight `pass_decay` per window, and the null variance of that sum.
#[derive(Clone, Copy, Debug, Default)]
struct PassEvidence {
    excess: f32,
    null_var: f32,
}

impl PassEvidence {
    /// Adds the evidence of the window of items `ring` (one entry per visit), over `n`
    /// items and `passes` passes; returns the test's verdict (reused) when the window
    /// counts (see [`pass_evidence`]).
    fn add(
        &mut self,
        ring: &[u32],
        (n, passes): (f64, f64),
        cfg: &ClassifierConfig,
        scratch: &mut Scratch,
    ) -> Option<bool> {
        scratch.fps.clear();
        scratch.fps.extend_from_slice(ring);
        let (excess, dof) = pass_evidence(n, passes, scratch)?;
        let k = cfg.pass_decay;
        self.excess = (f64::from(self.excess) * k + excess) as f32;
        self.null_var = (f64::from(self.null_var) * k * k + 2.0 * dof) as f32;
        Some(f64::from(self.excess) > cfg.pass_z * f64::from(self.null_var).sqrt())
    }
}

/// Largest sampling stride of [`PassSample`]: 64, so passes up to ~5,000 visits (a pass
/// over a 5 GB file of 1 MiB blocks) are tested.
const PASS_MAX_STRIDE: u32 = 64;
/// Largest span whose sampled items are counted (per sampled window, one hash per
/// index): 65,536 items.
const PASS_MAX_SPAN: u64 = 1 << 16;

impl StreamStats {
    /// A fresh stream, optionally starting from a pattern inherited from its siblings.
    pub fn new(prior: Pattern) -> Self {
        StreamStats {
            pattern: prior,
            ..Default::default()
        }
    }

    pub fn pattern(&self) -> Pattern {
        self.pattern
    }

    /// Whether the last test found the stream sequential within its visits with a skewed
    /// popularity across them (a columnar file's hot columns read again by query after
    /// query): its items are worth ranking by frequency.
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Whether the last test found the stream random (no order, no skew) over a set it
    /// reads again and again: its window of visits holds at most half as many distinct
    /// items as visits (and at least `REREAD_MIN_VISITS` visits). A shuffled epoch over
    /// more items than the window never is (its window holds each item about once); a
    /// loop in random order over a small set (a class a balanced sampler draws from as
    /// often as from a class 100 times larger) is, and its items are hot.
    pub fn reread(&self) -> bool {
        self.reread
    }

    /// Estimated Zipf exponent of the last skewed test (0 if never skewed).
    pub fn zipf_s(&self) -> f64 {
        f64::from(self.zipf_s)
    }

    /// Visits recorded (saturating).
    pub fn visits(&self) -> u32 {
        self.visits
    }

    /// Fingerprints the window has room for (its heap size is 4 bytes each).
    pub fn window_capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Records an access to item (`idx`, `fp`). Returns `true` when it repeats the
    /// previous item (same visit: not counted). Runs the tests when due.
    pub fn observe(
        &mut self,
        idx: u64,
        fp: u32,
        cfg: &ClassifierConfig,
        scratch: &mut Scratch,
    ) -> bool {
        if self.visits > 0 && idx == self.last_idx && fp == self.last_fp {
            return true;
        }
        if self.visits == 0 {
            self.min_idx = idx;
            self.max_idx = idx;
        } else {
            self.steps += 1;
            let d = idx.wrapping_sub(self.last_idx);
            if d >= 1 && d <= cfg.forward_gap {
                self.forward += 1;
            }
            self.min_idx = self.min_idx.min(idx);
            self.max_idx = self.max_idx.max(idx);
            let back = if idx < self.last_idx { 1.0 } else { 0.0 };
            let weight = 1.0 / self.visits.min(PASS_STEPS) as f32;
            self.pass_restarts += (back - self.pass_restarts) * weight;
        }
        self.visits = self.visits.saturating_add(1);
        self.last_idx = idx;
        self.last_fp = fp;
        let full = record_in_ring(&mut self.ring, &mut self.ring_pos, cfg.window, fp);
        if full && cfg.pass_reuse && self.pass_sample.is_none() {
            self.pass_test(cfg, scratch);
        }
        if cfg.pass_reuse {
            self.pass_sample_visit(idx, cfg, scratch);
        }
        // Decay: keep the binomial evidence about the last ~window steps.
        if self.steps >= 2 * cfg.window as u32 {
            self.steps /= 2;
            self.forward /= 2;
        }
        self.since_test += 1;
        if self.steps >= cfg.min_samples && self.since_test >= cfg.test_every {
            self.since_test = 0;
            let out = run_tests(self, cfg, scratch);
            self.reused = out.pattern == Pattern::Sequential
                && (out.p_uniform < cfg.alpha || self.pass_reused);
            // `run_tests` left the window's distinct items' counts in `scratch`.
            self.reread = out.pattern == Pattern::Random
                && self.ring.len() >= REREAD_MIN_VISITS
                && scratch.counts.len() * 2 <= self.ring.len();
            self.apply(out.pattern, cfg);
            if out.pattern == Pattern::Skewed {
                self.zipf_s = out.zipf_s as f32;
            }
        }
        false
    }

    /// Test of reuse across passes (module doc, 4.), run each time the window has
    /// filled with new visits: adds this window's evidence and updates `pass_reused`.
    fn pass_test(&mut self, cfg: &ClassifierConfig, scratch: &mut Scratch) {
        let n = self.max_idx.saturating_sub(self.min_idx).saturating_add(1) as f64;
        let passes = self.ring.len() as f64 * f64::from(self.pass_restarts);
        if let Some(reused) = self
            .pass_evidence
            .add(&self.ring, (n, passes), cfg, scratch)
        {
            self.pass_reused = reused;
        }
    }

    /// The sampled window of the test of reuse across passes ([`PassSample`]): kept
    /// while the stream's passes are longer than half the main window, its stride
    /// chosen so that a sampled window holds about 3 passes.
    fn pass_sample_visit(&mut self, idx: u64, cfg: &ClassifierConfig, scratch: &mut Scratch) {
        let window = cfg.window.max(1) as f64;
        let span = self.max_idx.saturating_sub(self.min_idx).saturating_add(1);
        // Cheap checks first: this runs on every visit of every stream.
        let wanted = if self.pattern != Pattern::Sequential
            || self.visits < PASS_STEPS
            || span > PASS_MAX_SPAN
            || f64::from(self.pass_restarts) * window >= 2.0
            || self.pass_restarts <= 0.0
        {
            0
        } else {
            // Passes per window under 2: sample so that one holds about 3.
            ((3.0 / (f64::from(self.pass_restarts) * window)).ceil() as u32)
                .next_power_of_two()
                .min(PASS_MAX_STRIDE)
        };
        if wanted == 0 {
            if self.pass_sample.take().is_some() {
                self.pass_reused = false;
            }
            return;
        }
        let sample = self.pass_sample.get_or_insert_with(Default::default);
        if sample.stride != wanted {
            **sample = PassSample {
                stride: wanted,
                ring: Vec::with_capacity(cfg.window),
                ..Default::default()
            };
            self.pass_reused = false;
        }
        let stride = u64::from(sample.stride);
        if !mix64(idx).is_multiple_of(stride) {
            return;
        }
        if !record_in_ring(&mut sample.ring, &mut sample.pos, cfg.window, idx as u32) {
            return;
        }
        let n = (self.min_idx..=self.max_idx)
            .filter(|&i| mix64(i).is_multiple_of(stride))
            .count() as f64;
        let passes = sample.ring.len() as f64 * stride as f64 * f64::from(self.pass_restarts);
        if let Some(reused) = sample.evidence.add(&sample.ring, (n, passes), cfg, scratch) {
            self.pass_reused = reused;
        }
    }

    fn apply(&mut self, outcome: Pattern, cfg: &ClassifierConfig) {
        if outcome == self.pattern {
            self.streak = 0;
            return;
        }
        if self.pattern == Pattern::Unknown {
            self.pattern = outcome;
            self.streak = 0;
            return;
        }
        if outcome == self.candidate {
            self.streak = self.streak.saturating_add(1);
        } else {
            self.candidate = outcome;
            self.streak = 1;
        }
        if self.streak >= cfg.hysteresis {
            self.pattern = outcome;
            self.streak = 0;
        }
    }

    /// Runs the tests on the current evidence without changing the stream.
    pub fn test_now(&self, cfg: &ClassifierConfig, scratch: &mut Scratch) -> TestOutcome {
        run_tests(self, cfg, scratch)
    }
}

/// The sequential test alone: p-value of `forward` adjacent steps among `steps` under
/// the uniform-random null with adjacency probability `p0`.
pub fn sequential_p_value(steps: u32, forward: u32, p0: f64) -> f64 {
    if forward == 0 || steps == 0 {
        return 1.0;
    }
    match Binomial::new(p0, u64::from(steps)) {
        Ok(b) => b.sf(u64::from(forward) - 1),
        Err(_) => 1.0,
    }
}

/// The popularity test alone over visit counts (any order): chi-square p-value against
/// uniform popularity; 1 when fewer than two distinct items.
pub fn uniform_p_value(counts: &[usize]) -> f64 {
    if counts.len() < 2 {
        return 1.0;
    }
    match chisquare(counts, None, None) {
        Ok((_, p)) if p.is_finite() => p,
        _ => 1.0,
    }
}

/// Zipf exponent by least squares of ln(count) on ln(rank) over `counts` sorted in
/// descending order (ranks with count >= 1); 0 with fewer than 3 ranks.
pub fn zipf_exponent(sorted_desc: &[usize]) -> f64 {
    let n = sorted_desc.len();
    if n < 3 {
        return 0.0;
    }
    let (mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0);
    for (r, &c) in sorted_desc.iter().enumerate() {
        let x = ((r + 1) as f64).ln();
        let y = (c.max(1) as f64).ln();
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    let nf = n as f64;
    let denom = nf * sxx - sx * sx;
    if denom <= 0.0 {
        return 0.0;
    }
    (-(nf * sxy - sx * sy) / denom).max(0.0)
}

fn run_tests(s: &StreamStats, cfg: &ClassifierConfig, scratch: &mut Scratch) -> TestOutcome {
    let span = s.max_idx.saturating_sub(s.min_idx).saturating_add(1) as f64;
    let p0 = (cfg.forward_gap as f64 / span).clamp(cfg.p0_min, cfg.p0_max);
    let p_seq = sequential_p_value(s.steps, s.forward, p0);
    let p_uni = popularity_p_value(s, scratch);
    if p_seq < cfg.alpha {
        return TestOutcome {
            pattern: Pattern::Sequential,
            p_sequential: p_seq,
            p_uniform: p_uni,
            zipf_s: 0.0,
        };
    }
    if p_uni < cfg.alpha {
        scratch.counts.sort_unstable_by(|a, b| b.cmp(a));
        let s_hat = zipf_exponent(&scratch.counts);
        return TestOutcome {
            pattern: Pattern::Skewed,
            p_sequential: p_seq,
            p_uniform: p_uni,
            zipf_s: s_hat,
        };
    }
    TestOutcome {
        pattern: Pattern::Random,
        p_sequential: p_seq,
        p_uniform: p_uni,
        zipf_s: 0.0,
    }
}

/// Records `item` in a ring of at most `window` entries (grown lazily, then overwriting
/// the oldest at `pos`); returns whether the ring has just filled with new entries (it
/// reached `window`, or wrapped round).
fn record_in_ring(ring: &mut Vec<u32>, pos: &mut u32, window: usize, item: u32) -> bool {
    if ring.len() < window {
        ring.push(item);
        return ring.len() == window;
    }
    if ring.is_empty() {
        return false;
    }
    let at = *pos as usize % ring.len();
    ring[at] = item;
    *pos = ((at + 1) % ring.len()) as u32;
    *pos == 0
}

/// The evidence of one window for the test of reuse across passes (module doc, 5.):
/// `scratch.fps` holds the window's items (one entry per visit), `n` the items the
/// stream spans (of the window's population), `passes` the passes the window covers.
/// Returns the window's statistic minus its null mean, and its degrees of freedom;
/// None where the test does not apply (under 2 passes, or a pass reading 80% or more:
/// a loop).
fn pass_evidence(n: f64, passes: f64, scratch: &mut Scratch) -> Option<(f64, f64)> {
    let w = scratch.fps.len() as f64;
    if n < 8.0 || w == 0.0 {
        return None;
    }
    // Share of the items one pass reads.
    let m = w / n;
    let p = m / passes;
    // One pass says nothing about reuse; a pass that reads 80% of the file or more
    // is a loop, whose items are all alike (the hash sample's case).
    if passes < 2.0 || p >= 0.8 {
        return None;
    }
    let frac = passes - passes.floor();
    // Null variance of an item's count: binomial over the passes, plus the partial
    // pass, which covers some items and not others.
    let v = m * (1.0 - p) + frac * (1.0 - frac) * p * p;
    count_items(scratch);
    let seen = scratch.counts.len() as f64;
    let squares: f64 = scratch
        .counts
        .iter()
        .map(|&c| (c as f64 - m).powi(2))
        .sum::<f64>()
        + (n - seen).max(0.0) * m * m;
    let dof = n - 1.0;
    Some((squares / v - dof, dof))
}

/// The visit count of each distinct item of `scratch.fps` into `scratch.counts`
/// (`fps` left sorted).
fn count_items(scratch: &mut Scratch) {
    scratch.fps.sort_unstable();
    scratch.counts.clear();
    let mut i = 0;
    while i < scratch.fps.len() {
        let mut j = i + 1;
        while j < scratch.fps.len() && scratch.fps[j] == scratch.fps[i] {
            j += 1;
        }
        scratch.counts.push(j - i);
        i = j;
    }
}

/// The popularity test over the stream's window: the visit count of each distinct item
/// into `scratch.counts`, and their chi-square p-value against uniform popularity.
fn popularity_p_value(s: &StreamStats, scratch: &mut Scratch) -> f64 {
    scratch.fps.clear();
    scratch.fps.extend_from_slice(&s.ring);
    count_items(scratch);
    uniform_p_value(&scratch.counts)
}

#[cfg(test)]
mod tests;
