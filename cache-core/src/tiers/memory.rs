//! CPU-memory tier: a map of `Bytes` under a byte budget.
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
use crate::tier::{Tier, TierGet, TierKind};

pub struct MemoryTier {
    capacity: u64,
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
            inner: Mutex::new(Inner::default()),
            stats: TierStats::default(),
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
        let mut inner = self.inner.lock();
        let old = inner.map.get(key).map(Block::len).unwrap_or(0);
        inner.used = inner.used - old + size;
        inner.map.insert(key.clone(), block);
        drop(inner);
        self.stats.wrote(size);
        Ok(())
    }
    async fn remove(&self, key: &CacheKey) -> Result<bool> {
        let mut inner = self.inner.lock();
        match inner.map.remove(key) {
            Some(b) => {
                inner.used -= b.len();
                Ok(true)
            }
            None => Ok(false),
        }
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
}
