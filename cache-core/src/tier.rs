//! The tier trait: one level of the hierarchy (GPU memory, CPU memory, local disk).
//!
//! Tiers are dumb stores: they never choose what to evict and keep no budget of their
//! own. The engine's [`crate::space::TierSpace`] is the one authority on a level's bytes
//! (sized from [`Tier::capacity_bytes`]) and calls `put` only after making room; a tier
//! stores what it is told and fails only for device reasons (`CacheError::Full` when the
//! device itself is out of space, I/O errors, a lost GPU). Every implementation runs
//! [`crate::conformance`].

use async_trait::async_trait;

use crate::block::Block;
use crate::error::Result;
use crate::key::CacheKey;
use crate::stats::TierStatsSnapshot;

/// Memory a resident block costs the daemon beside its own bytes, whatever its size:
/// its entry in the tier's map, in its level's accounting and in the level's policy
/// (maps, queues, shadows, sketch counters), measured at ~1.8 KB per block with
/// heaptrack over 64,000 10-byte files (docs/BENCHMARKS.md, "Bookkeeping charged"),
/// rounded up. A memory tier charges it in its budget ([`Tier::footprint`]), so a
/// budget of tiny blocks holds what the memory actually holds (black-box finding: a
/// 32 MiB tier of 10-byte files kept 3 million entries, ~300 MB of bookkeeping); a
/// disk tier bounds its blocks by it ([`Tier::max_entries`]).
pub const ENTRY_BOOKKEEPING: u64 = 2 << 10;

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
    /// The configured size: the budget the engine's accounting enforces for this tier.
    fn capacity_bytes(&self) -> u64;
    fn used_bytes(&self) -> u64;
    async fn get(&self, key: &CacheKey) -> Result<TierGet>;
    /// Stores a block (no budget check: the engine made room). Fails only for device
    /// reasons (`Full` = the device has no space); a put of a key already present
    /// replaces it (values are immutable, so it is the same bytes).
    async fn put(&self, key: &CacheKey, block: Block) -> Result<()>;
    /// [`Self::put`] of a block the object store still holds (a read-through fill, a
    /// demotion of one): losing it costs a refetch, not data, so a persistent tier may
    /// skip the work that makes a write survive power loss (a disk tier's syncs). It must
    /// still never serve bad bytes after a crash. A later [`Self::put`] of the same bytes
    /// may find the copy present and leave it as it is: only file blocks are written this
    /// way, and the object store is their durable copy. Default: [`Self::put`].
    async fn put_refetchable(&self, key: &CacheKey, block: Block) -> Result<()> {
        self.put(key, block).await
    }
    /// Removes a key; returns whether it was present.
    async fn remove(&self, key: &CacheKey) -> Result<bool>;
    async fn contains(&self, key: &CacheKey) -> bool;
    /// Free bytes on the device under it, where that is a file system (None: not
    /// known, or not bounded by a device).
    fn free_bytes(&self) -> Option<u64> {
        None
    }
    /// The file system it keeps its bytes on (`st_dev`), where that is one: whoever
    /// shares that device may ask it for room ([`crate::engine::CacheEngine::shed_persistent`]).
    fn device(&self) -> Option<u64> {
        None
    }
    /// Keys and sizes held now (a persistent tier reports what survived a restart),
    /// oldest write first where the tier knows the order: the engine and the tenant
    /// quotas seed their recency from it at start (black-box finding: in hash order, a
    /// restart made a tenant's quota evict its newest KV blocks as readily as its oldest).
    fn resident(&self) -> Vec<(CacheKey, u64)>;
    /// The bytes a block of `len` bytes under `key` takes here, as this tier's budget
    /// counts it: its own bytes, unless the tier stores more per block (a disk tier's
    /// header and page padding, which for a 1 KiB KV block is most of its file).
    fn footprint(&self, key: &CacheKey, len: u64) -> u64 {
        let _ = key;
        len
    }
    /// Most blocks this tier keeps, whatever their bytes (None: bounded by bytes
    /// alone): a persistent tier whose every block costs memory bookkeeping
    /// ([`ENTRY_BOOKKEEPING`]) is bounded by the memory that bookkeeping may take.
    fn max_entries(&self) -> Option<u64> {
        None
    }
    fn stats(&self) -> TierStatsSnapshot;
}
