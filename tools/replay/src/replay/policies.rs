//! Policies by name for the replay (and `strata bench replay --policies`).
//!
//! | name | policy | prefetch |
//! |---|---|---|
//! | `lru` | [`LruPolicy`](strata_cache_core::policy::LruPolicy) (mountpoint-s3, LMCache) | none |
//! | `lfu` | [`LfuPolicy`](strata_cache_core::policy::LfuPolicy), in-cache counts, LRU tie-break | none |
//! | `arc` | [`ArcPolicy`](strata_cache_core::policy::ArcPolicy), ARC counted in bytes | none |
//! | `2random` | [`TwoRandomPolicy`](strata_cache_core::policy::TwoRandomPolicy) (JuiceFS default), fixed seed | none |
//! | `tinylfu` | [`TinyLfuPolicy`](strata_cache_core::policy::TinyLfuPolicy), moka's W-TinyLFU as the whole cache (Dynamo KVBM) | none |
//! | `opt` | [`BeladyPolicy`](strata_cache_core::policy::BeladyPolicy) fed the trace's next-use index | none |
//! | `strata` | [`strata_policy_set`]`(name, true)` | the daemon's access controller: sequential + semantic |
//! | `strata-nosemantic` | [`strata_policy_set`]`(name, false)` | the access controller, sequential only |
//! | `strata-noprefetch` | [`PatternAwarePolicy`](strata_cache_core::policy::PatternAwarePolicy) alone | none (isolates retention) |
//!
//! The baselines get no prefetching: the systems they stand for either have none on
//! these paths or a readahead we do not model; `strata*` is measured with its
//! predictors because they are part of it.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use strata_cache_core::policy::{
    self, BeladyPolicy, EvictionPolicy, NextUse, PatternAwareConfig, PatternAwarePolicy,
};
use strata_prefetch::AccessController;

/// Every name [`make_policy`] accepts.
pub const POLICY_NAMES: [&str; 10] = [
    "strata",
    "strata-nosemantic",
    "strata-noprefetch",
    "strata-blocks",
    "lru",
    "lfu",
    "arc",
    "2random",
    "tinylfu",
    "opt",
];

/// A policy under test with its access controller (None: no prefetching). The replay
/// sets the controller's backlog bound from its store model
/// ([`super::StoreModel::prefetch_max_backlog_ns`]).
pub struct PolicySet {
    pub name: String,
    pub policy: Box<dyn EvictionPolicy>,
    /// Block handles are the replay's dense block ids.
    pub controller: Option<AccessController<u32>>,
    /// Set for `opt`: the simulator feeds it the future.
    pub next_use: Option<NextUse>,
}

/// Directory listings of a dataset, `(dir, [(name, size)])`, as a mount sees them on
/// `readdir` (`dir` relative to the dataset root, `""` for the root).
pub type Listings = Vec<(String, Vec<(String, u64)>)>;

/// The pattern-aware core and its access controller: the ONE place `strata*` is
/// assembled.
///
/// `strata` = [`PatternAwarePolicy`](strata_cache_core::policy::PatternAwarePolicy) +
/// the daemon's [`AccessController::standard`] (sequential and semantic predictors);
/// `strata-nosemantic` leaves the semantic predictor out. `strata` reads small random
/// reads in sub-block fetch and cache units
/// ([`Granularity`](strata_cache_core::granularity::Granularity)) as the daemon does
/// with `[cache] read_units = "auto"` (its default), whose reader takes the same
/// `Granularity::demand_unit` decision; `strata-blocks` is the daemon with `read_units =
/// "block"`. The controller learns the
/// dataset's directory listings as the mount does, when a job first reads in a directory
/// (see [`super::replay`]); the policy is told the tier's byte budget (as the engine
/// would).
/// `name` may carry [`pattern_aware_config`]'s knob overrides (`strata:ghost_share=0.11`).
pub fn strata_policy_set(
    name: &str,
    semantic: bool,
    capacity: u64,
) -> anyhow::Result<(Box<dyn EvictionPolicy>, AccessController<u32>)> {
    let controller = AccessController::with_predictors(true, semantic);
    let policy = PatternAwarePolicy::new(pattern_aware_config(name, capacity)?);
    Ok((Box::new(policy), controller))
}

/// Builds the policy called `name` for a tier of `capacity` bytes.
pub fn make_policy(name: &str, capacity: u64) -> anyhow::Result<PolicySet> {
    let mut next_use = None;
    let (policy, controller) = match name {
        "lru" | "lfu" | "arc" | "2random" | "tinylfu" => (policy::by_name(name, capacity)?, None),
        "opt" => {
            let (p, h) = BeladyPolicy::new(capacity);
            next_use = Some(h);
            (Box::new(p) as Box<dyn EvictionPolicy>, None)
        }
        // `strata:KNOB=V...`: `strata` with knob overrides, for a whole-corpus noise
        // check or A/B run with `replay_json` (P=strata:ghost_share=0.11);
        // `strata-noprefetch:KNOB=V...` the same without the prefetch controller.
        "strata" | "strata-nosemantic" | "strata-blocks" => {
            let (policy, c) = strata_policy_set(name, name != "strata-nosemantic", capacity)?;
            (policy, Some(c))
        }
        other if other.starts_with("strata-noprefetch:") => {
            (strata_policy_set(other, false, capacity)?.0, None)
        }
        other if other.starts_with("strata:") => {
            let (policy, c) = strata_policy_set(other, true, capacity)?;
            (policy, Some(c))
        }
        "strata-noprefetch" => (strata_policy_set(name, false, capacity)?.0, None),
        other => anyhow::bail!(
            "unknown policy `{other}` (known: {})",
            POLICY_NAMES.join(", ")
        ),
    };
    Ok(PolicySet {
        name: name.to_string(),
        policy,
        controller,
        next_use,
    })
}

/// The pattern-aware policy's configuration for a tier of `capacity` bytes, with knob
/// overrides appended to the policy's name (`strata:window_share=0.5:sketch_follows_items=0`;
/// a bare knob means 1): the diagnostic examples' perturbation runs, which move a neutral
/// knob to see whether a measured gain survives it. Booleans take 0 or 1.
pub fn pattern_aware_config(name: &str, capacity: u64) -> anyhow::Result<PatternAwareConfig> {
    let mut c = PatternAwareConfig {
        capacity_hint: Some(capacity),
        ..PatternAwareConfig::default()
    };
    for kv in name.split(':').skip(1) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, "1"));
        let f: f64 = v
            .parse()
            .with_context(|| format!("override `{kv}`: `{v}` is not a number"))?;
        let on = f != 0.0;
        match k {
            "window_share" => c.window_share = f,
            "adapt_window" => c.adapt_window = on,
            "window_ghost_share" => c.window_ghost_share = f,
            "ghost_share" => c.ghost_share = f,
            "window_min_votes" => c.window_min_votes = f as u64,
            "window_alpha" => c.window_alpha = f,
            "rebalance_step" => c.rebalance_step = f,
            "sketch_width" => c.sketch_width = f as usize,
            "sketch_follows_items" => c.sketch_follows_items = on,
            "freq_ties_largest_first" => c.freq_ties_largest_first = on,
            "main_ranks_by_density" => c.main_ranks_by_density = on,
            "main_kept_until_scan_reuse" => c.main_kept_until_scan_reuse = on,
            "reload_ghost" => c.reload_ghost = on,
            "reload_run" => c.reload_run = f as u64,
            "window_keeps_last_demanded" => c.window_keeps_last_demanded = on,
            "main_ranks_by_read" => c.main_ranks_by_read = on,
            "whole_files_by_frequency" => c.whole_files_by_frequency = on,
            "reread_by_frequency" => c.reread_by_frequency = on,
            "stable_admits_frequent" => c.stable_admits_frequent = on,
            "stable_frequent_min" => c.stable_frequent_min = f as u64,
            "stable_follows_retention" => c.stable_follows_retention = on,
            "scan_keeps_blocks_mid_read" => c.scan_keeps_blocks_mid_read = on,
            "recency_guard" => c.recency_guard = on,
            "frequency_guard" => c.frequency_guard = on,
            "spare_starved_jobs" => c.spare_starved_jobs = on,
            "spare_ends_when_costly" => c.spare_ends_when_costly = on,
            "main_victims_stay_main" => c.main_victims_stay_main = on,
            "window_min_share" => c.window_min_share = f,
            "window_step_doubles" => c.window_step_doubles = on,
            "guard_sees_prefetch" => c.guard_sees_prefetch = on,
            "ahead_share" => c.ahead_share = f,
            other => anyhow::bail!("unknown pattern-aware override `{other}`"),
        }
    }
    Ok(c)
}

/// The pattern-aware policy of a `strata*` name (with the overrides of
/// [`pattern_aware_config`]), shared so that a diagnostic can read its state while the
/// replay drives it; None for the baselines' names.
pub fn shared_pattern_aware(
    name: &str,
    capacity: u64,
) -> anyhow::Result<Option<SharedPatternAware>> {
    if !name.starts_with("strata") {
        return Ok(None);
    }
    let cfg = pattern_aware_config(name, capacity)?;
    Ok(Some(Arc::new(Mutex::new(PatternAwarePolicy::new(cfg)))))
}

/// The pattern-aware policy shared between a diagnostic example and the replay.
pub type SharedPatternAware = Arc<Mutex<PatternAwarePolicy>>;

/// The policy a diagnostic example's wrapper drives: the shared pattern-aware policy for
/// a `strata*` name (whose state the example also reads), else the baseline's.
pub struct DiagTarget {
    inner: Box<dyn EvictionPolicy>,
    strata: Option<SharedPatternAware>,
}

impl DiagTarget {
    /// Runs `f` on the policy being replayed.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut dyn EvictionPolicy) -> R) -> R {
        match &self.strata {
            Some(s) => f(&mut *s.lock().unwrap_or_else(|e| e.into_inner())),
            None => f(self.inner.as_mut()),
        }
    }

    /// The pattern-aware policy, for a `strata*` name.
    pub fn strata(&self) -> Option<&SharedPatternAware> {
        self.strata.as_ref()
    }
}

/// For the diagnostic examples: the policy set of `name` (a [`make_policy`] name, with
/// [`pattern_aware_config`]'s overrides after a `:`) whose policy is what `wrap` builds
/// around the [`DiagTarget`]; the shared pattern-aware policy is returned too, so the
/// example can read its state after the replay. Prefetch as `make_policy` gives the name.
pub fn diag_policy_set(
    name: &str,
    capacity: u64,
    wrap: impl FnOnce(DiagTarget) -> Box<dyn EvictionPolicy>,
) -> anyhow::Result<(PolicySet, Option<SharedPatternAware>)> {
    let base = make_policy(name.split(':').next().unwrap_or(name), capacity)?;
    let strata = shared_pattern_aware(name, capacity)?;
    let target = DiagTarget {
        inner: base.policy,
        strata: strata.clone(),
    };
    let set = PolicySet {
        name: name.to_string(),
        policy: wrap(target),
        controller: base.controller,
        next_use: base.next_use,
    };
    Ok((set, strata))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_aware_overrides_come_from_the_name() {
        let c = pattern_aware_config("strata:window_share=0.5:sketch_follows_items=0", 1 << 30)
            .expect("valid overrides");
        assert_eq!(c.window_share, 0.5);
        assert!(!c.sketch_follows_items);
        assert_eq!(c.capacity_hint, Some(1 << 30));
        let plain = pattern_aware_config("strata", 1 << 30).expect("no overrides");
        assert_eq!(
            plain.window_share,
            PatternAwareConfig::default().window_share
        );
        assert!(pattern_aware_config("strata:no_such_knob=1", 1).is_err());
        assert!(pattern_aware_config("strata:window_share=half", 1).is_err());
        assert!(shared_pattern_aware("lru", 1)
            .expect("a baseline")
            .is_none());
    }

    /// `replay_json` takes the same overrides, with the standard controller, so a
    /// noise check can run over the whole corpus.
    #[test]
    fn make_policy_takes_knob_overrides() {
        let set = make_policy("strata:ghost_share=0.11", 1 << 30).expect("a known knob");
        assert!(set.controller.is_some());
        assert!(make_policy("strata:no_such_knob=1", 1).is_err());
    }
}
