//! Strata's shared vocabulary: the few types and functions that both the cache core and
//! the pure-logic crates (the prefetch predictors) speak. No I/O and no dependency but
//! serde, so `strata-prefetch` links this instead of all of `strata-cache-core`.
//!
//! `strata-cache-core` re-exports everything here at the paths it always had
//! (`strata_cache_core::{JobId, Pattern, DEFAULT_BLOCK_SIZE}`,
//! `strata_cache_core::stream::{FxBuild, FxHasher, mix64, hash_bytes}`), so a crate that
//! already depends on the core can keep using those paths; the types are the same.

pub mod hash;
pub mod latency;

pub use hash::{hash_bytes, mix64, FxBuild, FxHasher, SplitMix64};
pub use latency::LatencyWindow;

/// Default file block size: 1 MiB, large enough that a 1 MiB FUSE read is one block
/// fetch and small enough that a random 4 KiB read does not drag in much more.
pub const DEFAULT_BLOCK_SIZE: u64 = 1 << 20;

/// Identifies the job making an access: a reading process group at the FUSE mount, a
/// namespace at the KV service, a trace's job column in replay. Streams of different
/// jobs are never merged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

/// The pattern of one access stream, as the cache core's classifier decides it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Not enough evidence yet.
    #[default]
    Unknown,
    Sequential,
    Random,
    Skewed,
}
