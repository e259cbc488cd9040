//! Per-tier counters, lock-free so that hot paths only do relaxed atomic adds.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct TierStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub evictions: AtomicU64,
    pub errors: AtomicU64,
}

impl TierStats {
    pub fn hit(&self, bytes: u64) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }
    pub fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }
    pub fn wrote(&self, bytes: u64) {
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }
    pub fn evicted(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(
        &self,
        name: String,
        used_bytes: u64,
        capacity_bytes: u64,
    ) -> TierStatsSnapshot {
        TierStatsSnapshot {
            name,
            used_bytes,
            capacity_bytes,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            policy_recency_periods: 0,
            policy_frequency_periods: 0,
        }
    }
}

/// A point-in-time copy of one tier's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TierStatsSnapshot {
    pub name: String,
    pub used_bytes: u64,
    pub capacity_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub evictions: u64,
    pub errors: u64,
    /// Times the tier's policy evicted in plain recency order for a while because a
    /// shadow LRU out-hit it (`EvictionPolicy::recency_periods`; filled by the engine,
    /// which owns the policies; absent in older stats JSON).
    #[serde(default)]
    pub policy_recency_periods: u64,
    /// Times the tier's policy ranked every stream by frequency for a while because a
    /// shadow W-TinyLFU out-hit it (`EvictionPolicy::frequency_periods`; filled by the
    /// engine; absent in older stats JSON).
    #[serde(default)]
    pub policy_frequency_periods: u64,
}

impl TierStatsSnapshot {
    pub fn hit_ratio(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}
