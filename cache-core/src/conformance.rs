//! The conformance suite every [`Tier`] implementation runs: `pub async fn` checks, so
//! each tier's test module calls them against its own instance (object_store's style).

use std::sync::Arc;

use bytes::Bytes;

use crate::block::Block;
use crate::error::{CacheError, Result};
use crate::key::CacheKey;
use crate::stats::TierStatsSnapshot;
use crate::tier::{Tier, TierGet, TierKind};

fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>(),
    )
}

async fn get_bytes(tier: &dyn Tier, key: &CacheKey) -> Option<Bytes> {
    match tier.get(key).await.expect("tier get failed") {
        TierGet::Hit(b) => Some(b.into_data()),
        TierGet::Miss | TierGet::Throttled => None,
    }
}

/// put then get returns the same bytes; remove makes it a miss; remove twice is false.
pub async fn put_get_remove(tier: &dyn Tier) {
    let key = CacheKey::file("conformance/put_get_remove", "v1", 0);
    let data = pattern(4096, 1);
    tier.put(&key, Block::new(data.clone())).await.expect("put");
    assert!(tier.contains(&key).await);
    assert_eq!(get_bytes(tier, &key).await, Some(data));
    assert!(tier.remove(&key).await.expect("remove"));
    assert!(!tier.contains(&key).await);
    assert_eq!(get_bytes(tier, &key).await, None);
    assert!(!tier.remove(&key).await.expect("remove twice"));
}

/// Empty, one-byte, odd-sized and multi-MiB values round-trip byte for byte.
pub async fn sizes_round_trip(tier: &dyn Tier) {
    for (i, len) in [0usize, 1, 4095, 4097, 1 << 20, (3 << 20) + 17]
        .into_iter()
        .enumerate()
    {
        if len as u64 > tier.capacity_bytes() {
            continue;
        }
        let key = CacheKey::kv("conformance", vec![i as u8; 8]);
        let data = pattern(len, i as u8);
        tier.put(&key, Block::new(data.clone())).await.expect("put");
        assert_eq!(get_bytes(tier, &key).await, Some(data), "size {len}");
        tier.remove(&key).await.expect("remove");
    }
}

/// A tier keeps no budget of its own (the engine's accounting is the one authority):
/// `used_bytes` is exactly the footprint of what is stored ([`Tier::footprint`]: for a
/// tier that stores nothing beside a value, its bytes), and a put fails only for device reasons,
/// never because it exceeds `capacity_bytes`.
pub async fn used_bytes_count_what_is_stored(tier: &dyn Tier) {
    let chunk = (tier.capacity_bytes() / 8).clamp(1, 1 << 20) as usize;
    let mut keys = Vec::new();
    let mut stored = 0u64;
    for i in 0..6u64 {
        let key = CacheKey::file("conformance/accounting", "v", i);
        tier.put(&key, Block::new(pattern(chunk, i as u8)))
            .await
            .expect("a put within the device's means is stored");
        let footprint = tier.footprint(&key, chunk as u64);
        assert!(
            footprint >= chunk as u64,
            "a block takes at least its bytes"
        );
        stored += footprint;
        assert_eq!(tier.used_bytes(), stored);
        keys.push(key);
    }
    // The same value again changes nothing.
    tier.put(&keys[0], Block::new(pattern(chunk, 0)))
        .await
        .expect("re-put");
    assert_eq!(tier.used_bytes(), stored);
    for key in keys {
        tier.remove(&key).await.expect("remove");
    }
    assert_eq!(tier.used_bytes(), 0);
}

/// Many tasks putting and getting distinct keys at once all see their own bytes.
pub async fn concurrent_access(tier: Arc<dyn Tier>) {
    let mut tasks = Vec::new();
    for t in 0..16u8 {
        let tier = tier.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..8u64 {
                let key = CacheKey::file(format!("conformance/concurrent/{t}"), "v", i);
                let data = pattern(1000 + i as usize, t);
                tier.put(&key, Block::new(data.clone())).await.expect("put");
                assert_eq!(get_bytes(tier.as_ref(), &key).await, Some(data));
                tier.remove(&key).await.expect("remove");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task panicked");
    }
}

/// Runs every check; a tier's tests call this with a fresh instance of >= 16 MiB.
pub async fn run_all(tier: Arc<dyn Tier>) {
    put_get_remove(tier.as_ref()).await;
    sizes_round_trip(tier.as_ref()).await;
    used_bytes_count_what_is_stored(tier.as_ref()).await;
    concurrent_access(tier.clone()).await;
}

/// A test tier over another: every call goes to `inner`, with the faults a test asks
/// for. [`TestTier::yielding`] yields to the scheduler in `get`, `put` (twice) and
/// `remove`, so concurrent operations interleave at each await as over a real disk;
/// [`TestTier::refusing_puts`] refuses every write with `Full`, as a full device would;
/// [`TestTier::slow_gets`] takes a fixed time to answer every `get`, as a slow disk would,
/// so a test can act while a lookup is under way; [`TestTier::slow_puts`] likewise for
/// every `put`, so a test can act while a write is under way.
pub struct TestTier<T> {
    inner: T,
    name: Option<String>,
    yields: bool,
    refuse_puts: bool,
    get_delay: std::time::Duration,
    put_delay: std::time::Duration,
}

impl<T: Tier> TestTier<T> {
    /// Yields before every `get`, `put` and `remove`.
    pub fn yielding(inner: T) -> Self {
        Self {
            inner,
            name: None,
            yields: true,
            refuse_puts: false,
            get_delay: std::time::Duration::ZERO,
            put_delay: std::time::Duration::ZERO,
        }
    }

    /// Refuses every `put` with [`CacheError::Full`]; named `name`.
    pub fn refusing_puts(inner: T, name: &str) -> Self {
        Self {
            inner,
            name: Some(name.to_string()),
            yields: false,
            refuse_puts: true,
            get_delay: std::time::Duration::ZERO,
            put_delay: std::time::Duration::ZERO,
        }
    }

    /// Answers every `get` after `delay`.
    pub fn slow_gets(inner: T, delay: std::time::Duration) -> Self {
        Self {
            inner,
            name: None,
            yields: false,
            refuse_puts: false,
            get_delay: delay,
            put_delay: std::time::Duration::ZERO,
        }
    }

    /// Takes `delay` before every `put` lands.
    pub fn slow_puts(inner: T, delay: std::time::Duration) -> Self {
        Self {
            inner,
            name: None,
            yields: false,
            refuse_puts: false,
            get_delay: std::time::Duration::ZERO,
            put_delay: delay,
        }
    }

    async fn yield_now(&self) {
        if self.yields {
            tokio::task::yield_now().await;
        }
    }

    /// What every put goes through first: the injected refusal, then two yields (a
    /// write's reservation and its landing are separate steps).
    async fn before_put(&self) -> Result<()> {
        if self.refuse_puts {
            return Err(CacheError::Full("device full (injected)".into()));
        }
        self.yield_now().await;
        if !self.put_delay.is_zero() {
            tokio::time::sleep(self.put_delay).await;
        }
        self.yield_now().await;
        Ok(())
    }
}

#[async_trait::async_trait]
impl<T: Tier> Tier for TestTier<T> {
    fn kind(&self) -> TierKind {
        self.inner.kind()
    }
    fn name(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.inner.name())
    }
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }
    fn used_bytes(&self) -> u64 {
        self.inner.used_bytes()
    }
    async fn get(&self, key: &CacheKey) -> Result<TierGet> {
        self.yield_now().await;
        if !self.get_delay.is_zero() {
            tokio::time::sleep(self.get_delay).await;
        }
        self.inner.get(key).await
    }
    async fn put(&self, key: &CacheKey, block: Block) -> Result<()> {
        self.before_put().await?;
        self.inner.put(key, block).await
    }
    async fn put_refetchable(&self, key: &CacheKey, block: Block) -> Result<()> {
        self.before_put().await?;
        self.inner.put_refetchable(key, block).await
    }
    async fn remove(&self, key: &CacheKey) -> Result<bool> {
        self.yield_now().await;
        self.inner.remove(key).await
    }
    async fn contains(&self, key: &CacheKey) -> bool {
        self.inner.contains(key).await
    }
    fn resident(&self) -> Vec<(CacheKey, u64)> {
        self.inner.resident()
    }
    fn footprint(&self, key: &CacheKey, len: u64) -> u64 {
        self.inner.footprint(key, len)
    }
    fn stats(&self) -> TierStatsSnapshot {
        self.inner.stats()
    }
}
