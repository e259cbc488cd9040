//! Eviction policies: pure decision logic, no I/O.
//!
//! A policy sees every insert, hit and removal of one tier's residents and names the
//! next victim when the engine needs room. [`crate::space::TierSpace`] owns the byte
//! accounting, so a policy never has to be trusted with the budget. The admission hook
//! lets a policy refuse an item (e.g. a scan that would push out a hot set).

mod arc;
mod belady;
mod lfu;
mod lru;
pub mod pattern_aware;
mod tinylfu;
mod two_random;

pub use arc::ArcPolicy;
pub use belady::{BeladyPolicy, NextUse};
pub use lfu::LfuPolicy;
pub use lru::LruPolicy;
pub use pattern_aware::{PatternAwareConfig, PatternAwarePolicy};
pub use tinylfu::TinyLfuPolicy;
pub use two_random::TwoRandomPolicy;

use crate::access::AccessContext;
use crate::key::CacheKey;

/// Hasher of the policies' and [`crate::space::TierSpace`]'s `CacheKey` maps: Fx
/// ([`crate::stream::FxBuild`]), several times cheaper than std's SipHash on the
/// ~30-60 bytes of a file key, which was most of a replay's per-access cost.
/// Deterministic, so it must not be used where iteration order decides anything (none
/// of these maps is iterated for a decision). Not DoS-resistant: KV keys are chosen by
/// clients, who are the cluster's own inference engines (trusted), not the internet.
pub type KeyBuild = crate::stream::FxBuild;

pub trait EvictionPolicy: Send + 'static {
    fn name(&self) -> &'static str;
    /// Whether to cache `key` at all. Called before any victim is chosen for it.
    fn admit(&mut self, _key: &CacheKey, _size: u64, _ctx: &AccessContext) -> bool {
        true
    }
    /// `key` became resident.
    fn on_insert(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext);
    /// A resident `key` was read.
    fn on_hit(&mut self, key: &CacheKey, ctx: &AccessContext);
    /// `key` left the tier (evicted by us or removed by a caller).
    fn on_remove(&mut self, key: &CacheKey);
    /// A demand read of `key`, which is not resident, that fills nothing (a KV Get
    /// miss: only a client's Put brings the block back). A policy that learns from
    /// misses (the pattern-aware recency guard) sees it here; a filled miss comes as
    /// [`Self::admit`].
    fn on_unfilled_miss(&mut self, _key: &CacheKey, _ctx: &AccessContext) {}
    /// The resident to evict next, if any; it stays resident until `on_remove`.
    fn victim(&mut self) -> Option<CacheKey>;
    /// Times the policy handed eviction to plain recency order because a shadow LRU
    /// out-hit it (the pattern-aware policy's recency guard); 0 for the others.
    fn recency_periods(&self) -> u64 {
        0
    }
    /// Times the policy ranked every stream by frequency for a while because a shadow
    /// W-TinyLFU out-hit it (the pattern-aware policy's frequency guard); 0 for the
    /// others.
    fn frequency_periods(&self) -> u64 {
        0
    }
}

/// Builds a policy by name; the engine and the replay bench both go through here.
pub type PolicyFactory = Box<dyn Fn() -> Box<dyn EvictionPolicy> + Send + Sync>;

/// Names [`by_name`] accepts: the policies a live tier can run (`opt` needs the future).
pub const LIVE_POLICY_NAMES: [&str; 6] = ["strata", "lru", "lfu", "arc", "2random", "tinylfu"];

/// The policy called `name` for a tier of `capacity` bytes: the one constructor the
/// daemon's tiers and the replay share, so the replay measures what a mount runs.
/// `strata` is [`PatternAwarePolicy`] told the tier's budget.
pub fn by_name(name: &str, capacity: u64) -> crate::Result<Box<dyn EvictionPolicy>> {
    Ok(match name {
        "strata" => Box::new(PatternAwarePolicy::new(PatternAwareConfig {
            capacity_hint: Some(capacity),
            ..PatternAwareConfig::default()
        })),
        "lru" => Box::new(LruPolicy::new()),
        "lfu" => Box::new(LfuPolicy::new()),
        "arc" => Box::new(ArcPolicy::new(capacity)),
        "2random" => Box::new(TwoRandomPolicy::default()),
        "tinylfu" => Box::new(TinyLfuPolicy::new(capacity)),
        other => {
            return Err(crate::CacheError::InvalidArgument(format!(
                "unknown eviction policy `{other}` (known: {})",
                LIVE_POLICY_NAMES.join(", ")
            )))
        }
    })
}
