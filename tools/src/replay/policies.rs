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
//! | `strata` | [`strata_policy_set`]`(true)` | sequential + semantic |
//! | `strata-nosemantic` | [`strata_policy_set`]`(false)` | sequential |
//! | `strata-noprefetch` | [`PatternAwarePolicy`](strata_cache_core::policy::PatternAwarePolicy) alone | none (isolates retention) |
//!
//! The baselines get no prefetching: the systems they stand for either have none on
//! these paths or a readahead we do not model; `strata*` is measured with its
//! predictors because they are part of it.

use strata_cache_core::policy::{self, BeladyPolicy, EvictionPolicy, NextUse};
use strata_prefetch::semantic::SemanticPredictor;
use strata_prefetch::sequential::SequentialPredictor;
use strata_prefetch::Predictor;

/// Every name [`make_policy`] accepts.
pub const POLICY_NAMES: [&str; 9] = [
    "strata",
    "strata-nosemantic",
    "strata-noprefetch",
    "lru",
    "lfu",
    "arc",
    "2random",
    "tinylfu",
    "opt",
];

/// A policy under test with its predictors.
pub struct PolicySet {
    pub name: String,
    pub policy: Box<dyn EvictionPolicy>,
    pub predictors: Vec<Box<dyn Predictor>>,
    /// Set for `opt`: the simulator feeds it the future.
    pub next_use: Option<NextUse>,
}

/// Directory listings of a dataset, `(dir, [(name, size)])`, as a mount sees them on
/// `readdir` (`dir` relative to the dataset root, `""` for the root).
pub type Listings = Vec<(String, Vec<(String, u64)>)>;

/// The pattern-aware core and its predictors: the ONE place `strata*` is assembled.
///
/// `strata` = [`PatternAwarePolicy`](strata_cache_core::policy::PatternAwarePolicy) + [`SequentialPredictor`] + [`SemanticPredictor`];
/// `strata-nosemantic` leaves the semantic predictor out. The semantic predictor is
/// handed the dataset's directory listings (what the mount would have answered to the
/// job's `readdir`), which it uses for lexical-order and per-epoch-permutation rules,
/// and the policy is told the tier's byte budget (as the engine would).
pub fn strata_policy_set(
    semantic: bool,
    capacity: u64,
    listings: &Listings,
) -> (Box<dyn EvictionPolicy>, Vec<Box<dyn Predictor>>) {
    let mut predictors: Vec<Box<dyn Predictor>> = vec![Box::new(SequentialPredictor::default())];
    if semantic {
        let mut sp = SemanticPredictor::default();
        for (dir, entries) in listings {
            sp.observe_listing_sized(dir, entries);
        }
        predictors.push(Box::new(sp));
    }
    let policy = policy::by_name("strata", capacity).expect("strata is a live policy name");
    (policy, predictors)
}

/// Builds the policy called `name` for a tier of `capacity` bytes (`listings` feed
/// `strata`'s semantic predictor).
pub fn make_policy(name: &str, capacity: u64, listings: &Listings) -> anyhow::Result<PolicySet> {
    let mut next_use = None;
    let (policy, predictors): (Box<dyn EvictionPolicy>, Vec<Box<dyn Predictor>>) = match name {
        "lru" | "lfu" | "arc" | "2random" | "tinylfu" => {
            (policy::by_name(name, capacity)?, Vec::new())
        }
        "opt" => {
            let (p, h) = BeladyPolicy::new(capacity);
            next_use = Some(h);
            (Box::new(p), Vec::new())
        }
        "strata" => strata_policy_set(true, capacity, listings),
        "strata-nosemantic" => strata_policy_set(false, capacity, listings),
        "strata-noprefetch" => {
            let (policy, _) = strata_policy_set(false, capacity, listings);
            (policy, Vec::new())
        }
        other => anyhow::bail!(
            "unknown policy `{other}` (known: {})",
            POLICY_NAMES.join(", ")
        ),
    };
    Ok(PolicySet {
        name: name.to_string(),
        policy,
        predictors,
        next_use,
    })
}
