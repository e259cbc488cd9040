//! Per-epoch permutation over a listed member set: training jobs read every file of
//! their dataset once per epoch, in a fresh random order. The next *name* is
//! unpredictable, but every *unread* member will be read before the epoch ends, so
//! prefetching unread members is right whatever the order.
//!
//! Test. Under the alternative "uniform random reads with replacement over the N
//! members", `n` reads are all distinct with probability `prod_{i<n} (1 - i/N)`. The
//! permutation hypothesis is accepted when that probability falls below `alpha`
//! (`perm_alpha`, default 1%): for N = 2,000 that takes ~136 distinct reads, for
//! N = 20,000 ~430 (2% of an epoch). A repeat before `epoch_complete` of the set was read
//! is impossible under the hypothesis: it rejects it, and every rejection multiplies the
//! evidence the next acceptance needs (`alpha^(1+strikes)`), so a random reader cannot
//! re-trigger prefetch over and over by luck.
//!
//! Pool. Once accepted, the tracker keeps a pool of prefetched-unread members. Until one
//! whole epoch has been seen, the pool stays under `unconfirmed_pool_frac` (4%) of the
//! reads of the epoch, divided by `1 + strikes`: a job that samples only part of the set
//! per epoch looks exactly like a shuffle until its first repeat, and this bound keeps
//! what it wastes under 5% of what it reads. After a complete epoch, the pool may grow by
//! `pool_growth` per demand read since the epoch began, up to `pool_max_files` /
//! `pool_max_bytes` (the pool must fit in the cache, or prefetches evict each other).
//!
//! Cache horizon. `Wasted` feedback (a pooled member evicted unread) tells how many reads
//! the cache keeps a prefetch: `h`. In a uniform random order an unread member is read
//! within `h` reads with probability `h / unread`, so with a cache smaller than the set
//! the pool only fills near the end of an epoch, when that probability reaches
//! `pool_min_precision` (80%), and never holds more than `h` members: no thrash.

use super::listing::MemberSet;
use super::SemanticConfig;

#[derive(Debug)]
pub struct SetTracker {
    read: Vec<bool>,
    issued: Vec<bool>,
    epoch_reads: u64,
    /// Distinct reads since the test (re)started.
    run: u64,
    log_p: f64,
    pub accepted: bool,
    strikes: u32,
    reads_since_accept: u64,
    /// Issued this epoch and not read yet.
    pub outstanding: u64,
    cursor: usize,
    /// Reads over the tracker's life (not reset by epochs): the clock of `issued_at`.
    total_reads: u64,
    /// `total_reads` when each member was last issued.
    issued_at: Vec<u64>,
    /// Reads a prefetched member stays cached, learnt from feedback: `None` until a
    /// prefetch was dropped unread (the cache then seems to keep everything).
    pub horizon: Option<f64>,
    last_member: Option<u32>,
    pub epochs: u64,
    /// `(alpha, alpha.ln())` for the last `perm_alpha` seen: the test's threshold is
    /// computed on every read until acceptance, the logarithm once.
    ln_alpha: (f64, f64),
}

impl Default for SetTracker {
    fn default() -> Self {
        SetTracker {
            read: Vec::new(),
            issued: Vec::new(),
            epoch_reads: 0,
            run: 0,
            log_p: 0.0,
            accepted: false,
            strikes: 0,
            reads_since_accept: 0,
            outstanding: 0,
            cursor: 0,
            total_reads: 0,
            issued_at: Vec::new(),
            horizon: None,
            last_member: None,
            epochs: 0,
            ln_alpha: (f64::NAN, f64::NAN),
        }
    }
}

impl SetTracker {
    pub fn new() -> Self {
        SetTracker::default()
    }

    fn grow(&mut self, n: usize) {
        if self.read.len() < n {
            self.read.resize(n, false);
            self.issued.resize(n, false);
            self.issued_at.resize(n, 0);
        }
    }

    fn restart_epoch(&mut self) {
        self.read.iter_mut().for_each(|b| *b = false);
        self.issued.iter_mut().for_each(|b| *b = false);
        self.epoch_reads = 0;
        self.outstanding = 0;
        self.cursor = 0;
        // The pool ramps up again each epoch: until the cache's horizon is known, a flood
        // at the start of an epoch is what a small cache would throw away.
        self.reads_since_accept = 0;
    }

    /// P(all distinct) so far under random-with-replacement, as `1 - p`: the confidence
    /// in the permutation hypothesis.
    pub fn confidence(&self) -> f32 {
        (1.0 - self.log_p.exp()) as f32
    }

    /// Folds in a demand read of member `id`.
    /// `alpha.ln()`, remembered for the last `alpha` (compared by bits: the same value,
    /// the same logarithm).
    fn ln_alpha(&mut self, alpha: f64) -> f64 {
        if self.ln_alpha.0.to_bits() != alpha.to_bits() {
            self.ln_alpha = (alpha, alpha.ln());
        }
        self.ln_alpha.1
    }

    pub fn observe(&mut self, id: u32, set: &MemberSet, cfg: &SemanticConfig) {
        if self.last_member == Some(id) {
            return;
        }
        self.last_member = Some(id);
        let n = set.len();
        self.grow(n);
        let i = id as usize;
        if self.read[i] {
            if self.epoch_reads as f64 >= cfg.epoch_complete * n as f64 {
                self.epochs += 1;
                self.restart_epoch();
            } else {
                // Not a permutation after all (or no longer): back to the first-epoch bound.
                self.epochs = 0;
                if self.accepted {
                    self.accepted = false;
                    self.strikes = self.strikes.saturating_add(1);
                } else {
                    self.strikes = self.strikes.saturating_add(u32::from(self.run > 0));
                }
                self.restart_epoch();
                self.run = 0;
                self.log_p = 0.0;
            }
        }
        self.read[i] = true;
        self.epoch_reads += 1;
        self.total_reads += 1;
        if self.issued[i] {
            self.outstanding = self.outstanding.saturating_sub(1);
        }
        if self.accepted {
            self.reads_since_accept += 1;
        } else {
            let frac = self.run as f64 / n as f64;
            self.log_p += if frac < 1.0 {
                (1.0 - frac).ln()
            } else {
                f64::NEG_INFINITY
            };
            self.run += 1;
            let threshold = self.ln_alpha(cfg.perm_alpha) * f64::from(1 + self.strikes.min(64));
            if self.log_p < threshold {
                self.accepted = true;
                self.reads_since_accept = 0;
            }
        }
    }

    /// Appends up to `burst` unread, unissued members to `out` (ids), within the pool
    /// budget. `avg_size` is the expected bytes per member.
    pub fn pick(
        &mut self,
        set: &MemberSet,
        burst: u32,
        avg_size: u64,
        cfg: &SemanticConfig,
        out: &mut Vec<u32>,
    ) {
        if !self.accepted {
            return;
        }
        self.grow(set.len());
        let by_bytes = cfg.pool_max_bytes.checked_div(avg_size).unwrap_or(u64::MAX);
        let ramp =
            u64::from(cfg.pool_initial) + u64::from(cfg.pool_growth) * self.reads_since_accept;
        let limit = if self.epochs >= 1 {
            (cfg.pool_max_files as u64).min(by_bytes).min(ramp)
        } else {
            (self.epoch_reads as f64 * cfg.unconfirmed_pool_frac
                / f64::from(1 + self.strikes.min(64))) as u64
        };
        // A cache that keeps prefetches `h` reads: an unread member is read within `h`
        // reads with probability ~h/unread (uniform order), and no more than `h` can be
        // outstanding. Prefetch only while that is at least `pool_min_precision`.
        let limit = match self.horizon {
            None => limit,
            Some(h) => {
                let unread = set.len().saturating_sub(self.epoch_reads as usize).max(1) as f64;
                if h / unread < cfg.pool_min_precision {
                    0
                } else {
                    limit.min(h as u64)
                }
            }
        };
        let mut want = limit.saturating_sub(self.outstanding).min(u64::from(burst));
        while want > 0 && self.cursor < set.len() {
            if let Some(id) = set.at_rank(self.cursor) {
                let i = id as usize;
                if !self.read[i] && !self.issued[i] {
                    self.issued[i] = true;
                    self.issued_at[i] = self.total_reads;
                    self.outstanding += 1;
                    out.push(id);
                    want -= 1;
                }
            }
            self.cursor += 1;
        }
    }

    /// Member `id` was dropped unread: the cache keeps prefetches about as many reads as
    /// it waited (averaged, weight 1/4 per report).
    pub fn on_wasted(&mut self, id: Option<u32>) {
        self.outstanding = self.outstanding.saturating_sub(1);
        let age = id
            .and_then(|i| self.issued_at.get(i as usize))
            .map_or(0, |at| self.total_reads.saturating_sub(*at)) as f64;
        self.horizon = Some(match self.horizon {
            None => age,
            Some(h) => 0.75 * h + 0.25 * age,
        });
    }

    /// Member `id` was read while cached: the cache kept it at least this long.
    pub fn on_used(&mut self, id: Option<u32>) {
        if let (Some(h), Some(at)) = (
            self.horizon,
            id.and_then(|i| self.issued_at.get(i as usize)),
        ) {
            let age = self.total_reads.saturating_sub(*at) as f64;
            if age > h {
                self.horizon = Some(age);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::semantic::listing::ListingIndex;

    /// Observes `members` in order until `t` accepts the set; returns the count up to
    /// and including the member it accepted at (0 if it never did).
    fn observe_until_accepted(
        t: &mut SetTracker,
        set: &MemberSet,
        cfg: &SemanticConfig,
        members: std::ops::Range<u32>,
    ) -> u32 {
        for i in members {
            t.observe(i, set, cfg);
            if t.accepted {
                return i + 1;
            }
        }
        0
    }

    fn set_of(n: usize) -> ListingIndex {
        let mut idx = ListingIndex::new(usize::MAX);
        let names: Vec<(String, u64)> = (0..n).map(|i| (format!("f-{i:05}"), 10)).collect();
        idx.observe("d", &names);
        idx.prepare("d/f-{n}");
        idx
    }

    /// Reads until acceptance, in a fixed non-repeating order.
    fn reads_to_accept(n: usize) -> u64 {
        let idx = set_of(n);
        let set = idx.set("d/f-{n}").expect("listed");
        let cfg = SemanticConfig::default();
        let mut t = SetTracker::new();
        for (k, id) in (0..n as u32).map(|i| (i * 7919) % n as u32).enumerate() {
            t.observe(id, set, &cfg);
            if t.accepted {
                return k as u64 + 1;
            }
        }
        u64::MAX
    }

    #[test]
    fn acceptance_needs_about_sqrt_2n_ln_alpha_reads() {
        // prod (1 - i/N) < 1%: ~ sqrt(2 N ln 100) reads.
        for n in [500usize, 2000, 20_000] {
            let expect = (2.0 * n as f64 * 100f64.ln()).sqrt();
            let got = reads_to_accept(n) as f64;
            assert!(
                (got - expect).abs() < 0.15 * expect,
                "n {n}: {got} vs {expect}"
            );
        }
    }

    #[test]
    fn premature_repeat_rejects_and_raises_the_bar() {
        let idx = set_of(1000);
        let set = idx.set("d/f-{n}").expect("listed");
        let cfg = SemanticConfig::default();
        let mut t = SetTracker::new();
        let first = observe_until_accepted(&mut t, set, &cfg, 0..1000);
        assert!(t.accepted);
        t.observe(0, set, &cfg); // repeat after ~10% of the set
        assert!(!t.accepted);
        let second = observe_until_accepted(&mut t, set, &cfg, 1..1000);
        assert!(second as f64 > first as f64 * 1.3, "{first} then {second}");
        // Before a complete epoch, the pool stays under 4% of the epoch's reads.
        let mut ids = Vec::new();
        t.pick(set, 1000, 10, &cfg, &mut ids);
        assert!(
            ids.len() as f64 <= 0.04 * f64::from(second),
            "{}",
            ids.len()
        );
    }
}
