//! The tier trait: one level of the hierarchy (GPU memory, CPU memory, local disk).
//!
//! Tiers are dumb stores under a byte budget: they never choose what to evict. The
//! engine decides placement and eviction through [`crate::space::TierSpace`] and calls
//! `put` only after making room, so a tier refuses (`CacheError::Full`) rather than
//! exceeding its budget. Every implementation runs [`crate::conformance`].

use async_trait::async_trait;

use crate::block::Block;
use crate::error::Result;
use crate::key::CacheKey;
use crate::stats::TierStatsSnapshot;

/// Which level of the hierarchy a tier is; ordered fastest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TierKind {
    Gpu,
    Memory,
    Disk,
    Store,
}

impl TierKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            TierKind::Gpu => "gpu",
            TierKind::Memory => "memory",
            TierKind::Disk => "disk",
            TierKind::Store => "store",
        }
    }
}

/// Outcome of a tier lookup.
#[derive(Debug)]
pub enum TierGet {
    Hit(Block),
    Miss,
    /// The tier is too busy right now; the caller should read from elsewhere.
    Throttled,
}

#[async_trait]
pub trait Tier: Send + Sync + 'static {
    fn kind(&self) -> TierKind;
    /// Human name for stats (e.g. `memory`, `disk:/var/cache/strata`).
    fn name(&self) -> String;
    /// Byte budget; `used_bytes` never exceeds it.
    fn capacity_bytes(&self) -> u64;
    fn used_bytes(&self) -> u64;
    async fn get(&self, key: &CacheKey) -> Result<TierGet>;
    /// Stores a block. Fails with `Full` if it does not fit the budget; a put of a key
    /// already present replaces it (values are immutable, so it is the same bytes).
    async fn put(&self, key: &CacheKey, block: Block) -> Result<()>;
    /// Removes a key; returns whether it was present.
    async fn remove(&self, key: &CacheKey) -> Result<bool>;
    async fn contains(&self, key: &CacheKey) -> bool;
    /// Keys and sizes held now (a persistent tier reports what survived a restart).
    fn resident(&self) -> Vec<(CacheKey, u64)>;
    fn stats(&self) -> TierStatsSnapshot;
}
