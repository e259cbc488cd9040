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
//! | `strata` | [`strata_policy_set`]`(true)` | the daemon's access controller: sequential + semantic |
//! | `strata-nosemantic` | [`strata_policy_set`]`(false)` | the access controller, sequential only |
//! | `strata-noprefetch` | [`PatternAwarePolicy`](strata_cache_core::policy::PatternAwarePolicy) alone | none (isolates retention) |
//!
//! The baselines get no prefetching: the systems they stand for either have none on
//! these paths or a readahead we do not model; `strata*` is measured with its
//! predictors because they are part of it.

use strata_cache_core::policy::{self, BeladyPolicy, EvictionPolicy, NextUse};
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
pub fn strata_policy_set(
    semantic: bool,
    capacity: u64,
) -> (Box<dyn EvictionPolicy>, AccessController<u32>) {
    let controller = AccessController::with_predictors(true, semantic);
    let policy = policy::by_name("strata", capacity).expect("strata is a live policy name");
    (policy, controller)
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
        "strata" | "strata-nosemantic" | "strata-blocks" => {
            let (policy, c) = strata_policy_set(name != "strata-nosemantic", capacity);
            (policy, Some(c))
        }
        "strata-noprefetch" => (strata_policy_set(false, capacity).0, None),
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
