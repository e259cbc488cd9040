//! CPU-memory tier: a map of `Bytes` under a byte budget.
//!
//! Each block is charged its bytes plus [`ENTRY_BOOKKEEPING`] ([`Tier::footprint`]), so
//! the budget is the memory its blocks cost, tiny ones included.
//!
//! Values are shared `Bytes`, so a hit is a reference-count bump, not a copy. The
//! checksum is kept but not re-verified on reads: RAM that silently flips bits is out of
//! scope, and re-hashing every hit would cost a memcpy's worth of time.

use std::collections::HashMap;

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::block::Block;
use crate::error::Result;
use crate::key::CacheKey;
use crate::stats::{TierStats, TierStatsSnapshot};
use crate::tier::{Tier, TierGet, TierKind, ENTRY_BOOKKEEPING};

pub struct MemoryTier {
    capacity: u64,
    /// What each block is charged beside its bytes: [`ENTRY_BOOKKEEPING`], or 0 for a
    /// tier that models bytes alone ([`Self::bytes_only`]).
    entry_charge: u64,
    inner: Mutex<Inner>,
    stats: TierStats,
}

#[derive(Default)]
struct Inner {
    used: u64,
    map: HashMap<CacheKey, Block>,
}

impl MemoryTier {
    pub fn new(capacity_bytes: u64) -> Self {
        MemoryTier {
            capacity: capacity_bytes,
            entry_charge: ENTRY_BOOKKEEPING,
            inner: Mutex::new(Inner::default()),
            stats: TierStats::default(),
        }
    }

    /// A tier whose budget counts the values' bytes alone, not the bookkeeping each
    /// costs: for tests of the engine's byte accounting with budgets of a few bytes.
    pub fn bytes_only(capacity_bytes: u64) -> Self {
        MemoryTier {
            entry_charge: 0,
            ..Self::new(capacity_bytes)
        }
    }
}

#[async_trait]
impl Tier for MemoryTier {
    fn kind(&self) -> TierKind {
        TierKind::Memory
    }
    fn name(&self) -> String {
        "memory".to_string()
    }
    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }
    fn used_bytes(&self) -> u64 {
        self.inner.lock().used
    }
    async fn get(&self, key: &CacheKey) -> Result<TierGet> {
        let hit = self.inner.lock().map.get(key).cloned();
        Ok(match hit {
            Some(b) => {
                self.stats.hit(b.len());
                TierGet::Hit(b)
            }
            None => {
                self.stats.miss();
                TierGet::Miss
            }
        })
    }
    async fn put(&self, key: &CacheKey, block: Block) -> Result<()> {
        let size = block.len();
        let charged = self.footprint(key, size);
        let mut inner = self.inner.lock();
        let old = inner.map.get(key).map(|b| self.footprint(key, b.len()));
        inner.used = inner.used - old.unwrap_or(0) + charged;
        inner.map.insert(key.clone(), block);
        drop(inner);
        self.stats.wrote(size);
        Ok(())
    }
    async fn remove(&self, key: &CacheKey) -> Result<bool> {
        let mut inner = self.inner.lock();
        match inner.map.remove(key) {
            Some(b) => {
                inner.used -= self.footprint(key, b.len());
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn footprint(&self, key: &CacheKey, len: u64) -> u64 {
        let _ = key;
        len + self.entry_charge
    }
    async fn contains(&self, key: &CacheKey) -> bool {
        self.inner.lock().map.contains_key(key)
    }
    fn resident(&self) -> Vec<(CacheKey, u64)> {
        self.inner
            .lock()
            .map
            .iter()
            .map(|(k, b)| (k.clone(), b.len()))
            .collect()
    }
    fn stats(&self) -> TierStatsSnapshot {
        self.stats
            .snapshot(self.name(), self.used_bytes(), self.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn memory_tier_conforms() {
        crate::conformance::run_all(Arc::new(MemoryTier::new(16 << 20))).await;
    }

    /// A budget of tiny blocks holds what their bookkeeping allows, not millions: the
    /// engine evicts at the budget counted with each block's charge.
    #[tokio::test]
    async fn tiny_blocks_are_charged_their_bookkeeping() {
        use crate::access::AccessContext;
        use crate::engine::CacheEngine;
        let tier = Arc::new(MemoryTier::new(10 * (ENTRY_BOOKKEEPING + 10)));
        let engine = CacheEngine::builder()
            .tier(tier.clone())
            .build()
            .expect("build");
        for i in 0..100 {
            engine
                .put(
                    &CacheKey::file("tiny", "v", i),
                    bytes::Bytes::from_static(b"0123456789"),
                    &AccessContext::default(),
                )
                .await
                .expect("put");
        }
        assert_eq!(
            tier.inner.lock().map.len(),
            10,
            "ten 10-byte blocks fill the budget"
        );
        assert_eq!(tier.used_bytes(), 10 * (ENTRY_BOOKKEEPING + 10));
    }
}
