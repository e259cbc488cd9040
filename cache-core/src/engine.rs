//! The composing engine: tiers stacked fastest first, read-through with fill,
//! promotion on hit, demotion on eviction, and single-flight for concurrent misses.
//!
//! Design:
//! - Each level pairs a [`Tier`] (the bytes) with a [`TierSpace`] (accounting + the
//!   eviction policy). Decisions are taken under the space's mutex, which is never held
//!   across an `.await`; the tier I/O happens after the lock is released.
//! - A fill goes to the top level and, when `write_through` is set, to the persistent
//!   levels too, so a restart finds the data (mountpoint-s3 #1619: "cache wiped at every
//!   mount"). A victim evicted from a level is demoted to the next level that does not
//!   already hold it.
//! - A hit on a lower level is promoted to the top level.
//! - Concurrent misses on one key share one fetch: the first caller spawns it as a task
//!   (so it finishes even if that caller is cancelled, e.g. an interrupted FUSE read) and
//!   every caller awaits the same shared result.
//! - The space may briefly count a key whose bytes the tier no longer has (a corrupt
//!   block the disk tier dropped, or a put in flight): that errs on the safe side of the
//!   budget, a get then falls through to the next level, and the entry is reclaimed when
//!   the policy evicts it or the block is filled again.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;

use crate::access::AccessContext;
use crate::block::Block;
use crate::error::{CacheError, Result};
use crate::key::CacheKey;
use crate::pattern::Pattern;
use crate::policy::{EvictionPolicy, LruPolicy};
use crate::space::{Placement, TierSpace};
use crate::stats::TierStatsSnapshot;
use crate::tier::{Tier, TierGet, TierKind};

type SharedFetch = Shared<BoxFuture<'static, std::result::Result<Bytes, Arc<CacheError>>>>;

/// One level of the hierarchy.
struct Level {
    tier: Arc<dyn Tier>,
    space: Mutex<TierSpace>,
    /// Counted here, not in the tier: the engine decides evictions.
    evictions: AtomicU64,
    /// Lookups the level's accounting answered as absent without asking the tier (the
    /// tier's own counter sees only the lookups that reach it).
    misses: AtomicU64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Persist {
    Inline,
    Background,
}

/// Builds a [`CacheEngine`].
pub struct EngineBuilder {
    levels: Vec<(Arc<dyn Tier>, Box<dyn EvictionPolicy>)>,
    write_through: bool,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        // Write-through to persistent tiers by default: a restart is then warm.
        EngineBuilder {
            levels: Vec::new(),
            write_through: true,
        }
    }
}

impl EngineBuilder {
    /// Adds a level below the ones added so far, evicting with LRU.
    pub fn tier(self, tier: Arc<dyn Tier>) -> Self {
        self.tier_with_policy(tier, Box::new(LruPolicy::new()))
    }

    /// Adds a level below the ones added so far, with its own eviction policy.
    pub fn tier_with_policy(
        mut self,
        tier: Arc<dyn Tier>,
        policy: Box<dyn EvictionPolicy>,
    ) -> Self {
        self.levels.push((tier, policy));
        self
    }

    /// Whether fills also go to persistent (disk) levels at once, not only on demotion.
    pub fn write_through(mut self, on: bool) -> Self {
        self.write_through = on;
        self
    }

    /// Builds the engine; the accounting of each level starts from what the tier already
    /// holds (a disk tier reopened after a restart).
    pub fn build(self) -> Result<CacheEngine> {
        if self.levels.is_empty() {
            return Err(CacheError::InvalidArgument(
                "an engine needs at least one tier".into(),
            ));
        }
        let ctx = AccessContext::default();
        let mut levels = Vec::with_capacity(self.levels.len());
        for (tier, policy) in self.levels {
            let mut space = TierSpace::new(tier.capacity_bytes(), policy);
            for (key, size) in tier.resident() {
                // Residents beyond the budget (budget shrunk since last run) are left to
                // the tier; the engine just does not count them as cached.
                let _ = space.place(&key, size, &ctx);
            }
            levels.push(Level {
                tier,
                space: Mutex::new(space),
                evictions: AtomicU64::new(0),
                misses: AtomicU64::new(0),
            });
        }
        Ok(CacheEngine {
            inner: Arc::new(Inner {
                levels,
                write_through: self.write_through,
                inflight: Mutex::new(HashMap::new()),
                counters: EngineCounters::default(),
            }),
        })
    }
}

#[derive(Default)]
struct EngineCounters {
    fills: AtomicU64,
    fill_bytes: AtomicU64,
    singleflight_joins: AtomicU64,
    promotions: AtomicU64,
    demotions: AtomicU64,
    prefetch_fills: AtomicU64,
    prefetch_bytes: AtomicU64,
}

struct Inner {
    levels: Vec<Level>,
    write_through: bool,
    inflight: Mutex<HashMap<CacheKey, SharedFetch>>,
    counters: EngineCounters,
}

/// The tiered cache. Cheap to clone (shared state).
#[derive(Clone)]
pub struct CacheEngine {
    inner: Arc<Inner>,
}

/// Engine-wide counters and every tier's.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct EngineStatsSnapshot {
    pub tiers: Vec<TierStatsSnapshot>,
    /// Blocks fetched from the backing source (store misses filled into the cache).
    pub fills: u64,
    pub fill_bytes: u64,
    /// Callers that joined a fetch already in flight instead of issuing their own.
    pub singleflight_joins: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub prefetch_fills: u64,
    pub prefetch_bytes: u64,
}

impl CacheEngine {
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Kinds of the levels, fastest first.
    pub fn tier_kinds(&self) -> Vec<TierKind> {
        self.inner.levels.iter().map(|l| l.tier.kind()).collect()
    }

    /// Looks `key` up in every level, fastest first; promotes a lower-level hit.
    pub async fn get(&self, key: &CacheKey, ctx: &AccessContext) -> Result<Option<Bytes>> {
        for (i, level) in self.inner.levels.iter().enumerate() {
            if !level.space.lock().touch(key, ctx) {
                level.misses.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match level.tier.get(key).await {
                Ok(TierGet::Hit(block)) => {
                    if i > 0 {
                        self.promote(i, key, block.clone(), ctx).await;
                    }
                    return Ok(Some(block.into_data()));
                }
                Ok(TierGet::Miss) | Ok(TierGet::Throttled) => continue,
                // A failing tier is skipped, not fatal: the data is still in the store.
                Err(e) => {
                    tracing::warn!(tier = %level.tier.name(), %key, error = %e, "tier get failed");
                    continue;
                }
            }
        }
        Ok(None)
    }

    /// Which level holds `key` now, if any (fastest first).
    pub fn locate(&self, key: &CacheKey) -> Option<TierKind> {
        self.inner
            .levels
            .iter()
            .find(|l| l.space.lock().contains(key))
            .map(|l| l.tier.kind())
    }

    /// Whether any level holds `key`.
    pub fn contains(&self, key: &CacheKey) -> bool {
        self.locate(key).is_some()
    }

    /// The pattern the top level's policy has classified `key`'s stream as.
    pub fn pattern_of(&self, key: &CacheKey, ctx: &AccessContext) -> Pattern {
        self.inner
            .levels
            .first()
            .map(|l| l.space.lock().pattern_of(key, ctx))
            .unwrap_or_default()
    }

    /// Stores `data` under `key` (values are immutable: a repeated put is idempotent).
    pub async fn put(&self, key: &CacheKey, data: Bytes, ctx: &AccessContext) -> Result<()> {
        self.fill(key, Block::new(data), ctx, Persist::Inline).await
    }

    /// Removes `key` from every level; returns whether any held it.
    pub async fn remove(&self, key: &CacheKey) -> Result<bool> {
        let mut found = false;
        for level in &self.inner.levels {
            level.space.lock().remove(key);
            found |= level.tier.remove(key).await?;
        }
        Ok(found)
    }

    /// Read-through: returns the cached bytes of `key`, or runs `fetch` once for all
    /// concurrent callers, fills the cache with the result and returns it.
    pub async fn get_or_fetch<F, Fut>(
        &self,
        key: &CacheKey,
        ctx: &AccessContext,
        fetch: F,
    ) -> Result<Bytes>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Bytes>> + Send + 'static,
    {
        if let Some(bytes) = self.get(key, ctx).await? {
            return Ok(bytes);
        }
        let shared = {
            let mut inflight = self.inner.inflight.lock();
            if let Some(f) = inflight.get(key) {
                self.inner
                    .counters
                    .singleflight_joins
                    .fetch_add(1, Ordering::Relaxed);
                f.clone()
            } else {
                let engine = self.clone();
                let task_key = key.clone();
                let task_ctx = *ctx;
                let task = tokio::spawn(async move {
                    let result = fetch().await;
                    if let Ok(bytes) = &result {
                        // Fill before leaving the in-flight map, so a caller arriving
                        // after removal finds the block cached.
                        if let Err(e) = engine
                            .fill(
                                &task_key,
                                Block::new(bytes.clone()),
                                &task_ctx,
                                Persist::Background,
                            )
                            .await
                        {
                            tracing::warn!(key = %task_key, error = %e, "fill failed; serving uncached");
                        }
                    }
                    engine.inner.inflight.lock().remove(&task_key);
                    result.map_err(Arc::new)
                });
                let fut: BoxFuture<'static, std::result::Result<Bytes, Arc<CacheError>>> =
                    async move {
                        match task.await {
                            Ok(r) => r,
                            Err(join) => Err(Arc::new(CacheError::SharedFetch(format!(
                                "fetch task failed: {join}"
                            )))),
                        }
                    }
                    .boxed();
                let shared = fut.shared();
                inflight.insert(key.clone(), shared.clone());
                shared
            }
        };
        shared.await.map_err(|e| e.duplicate())
    }

    /// Fills `key` into the top level (and persistent levels when writing through).
    ///
    /// `persist` says how the write-through to persistent levels happens: `Inline` for
    /// explicit puts (acknowledged once on disk, so they survive a restart), `Background`
    /// for read-through fills (the reader must not wait for an fsync; a crash before the
    /// write only loses a cached copy).
    async fn fill(
        &self,
        key: &CacheKey,
        block: Block,
        ctx: &AccessContext,
        persist: Persist,
    ) -> Result<()> {
        let c = &self.inner.counters;
        c.fills.fetch_add(1, Ordering::Relaxed);
        c.fill_bytes.fetch_add(block.len(), Ordering::Relaxed);
        if ctx.prefetch {
            c.prefetch_fills.fetch_add(1, Ordering::Relaxed);
            c.prefetch_bytes.fetch_add(block.len(), Ordering::Relaxed);
        }
        let mut stored = false;
        let mut last_err = None;
        let mut deferred = Vec::new();
        for i in 0..self.inner.levels.len() {
            let persistent = self.inner.levels[i].tier.kind() == TierKind::Disk;
            if stored {
                if !(self.inner.write_through && persistent) {
                    continue;
                }
                if persist == Persist::Background {
                    deferred.push(i);
                    continue;
                }
            }
            match self.insert_at(i, key, block.clone(), ctx).await {
                Ok(true) => stored = true,
                Ok(false) => {}
                Err(e) => last_err = Some(e),
            }
        }
        if !deferred.is_empty() {
            let engine = self.clone();
            let (key, ctx) = (key.clone(), *ctx);
            tokio::spawn(async move {
                for i in deferred {
                    if let Err(e) = engine.insert_at(i, &key, block.clone(), &ctx).await {
                        tracing::debug!(%key, error = %e, "background write-through failed");
                    }
                }
            });
        }
        match (stored, last_err) {
            (true, _) => Ok(()),
            (false, Some(e)) => Err(e),
            (false, None) => Err(CacheError::Full(format!("no tier admitted {key}"))),
        }
    }

    /// Copies a block found at level `from` into the top level.
    async fn promote(&self, from: usize, key: &CacheKey, block: Block, ctx: &AccessContext) {
        if from == 0 {
            return;
        }
        if let Ok(true) = self.insert_at(0, key, block, ctx).await {
            self.inner
                .counters
                .promotions
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Places `key` at level `start`, demoting the victims it pushes out down the
    /// hierarchy. Returns whether level `start` now holds the block.
    async fn insert_at(
        &self,
        start: usize,
        key: &CacheKey,
        block: Block,
        ctx: &AccessContext,
    ) -> Result<bool> {
        let (stored, mut demotions) = self.place_one(start, key, block, ctx).await?;
        while let Some((i, victim, bytes)) = demotions.pop() {
            match self.place_one(i, &victim, bytes, ctx).await {
                Ok((_, more)) => demotions.extend(more),
                // A failed demotion only loses a cached copy; the store still has it.
                Err(e) => tracing::warn!(key = %victim, error = %e, "demotion failed"),
            }
        }
        Ok(stored)
    }

    /// Places one block at level `i`: evicts what the policy names, writes the block,
    /// and returns whether it was stored plus the victims to demote further down.
    async fn place_one(
        &self,
        i: usize,
        key: &CacheKey,
        block: Block,
        ctx: &AccessContext,
    ) -> Result<(bool, Vec<(usize, CacheKey, Block)>)> {
        let level = &self.inner.levels[i];
        let placement = level.space.lock().place(key, block.len(), ctx);
        let evicted = match placement {
            Ok(Placement::Admitted { evicted }) => evicted,
            // Re-put: the tier may have dropped the bytes (corruption); write again.
            Ok(Placement::AlreadyResident) => Vec::new(),
            Ok(Placement::Refused) | Err(CacheError::TooLarge { .. }) => {
                return Ok((false, Vec::new()))
            }
            Err(e) => return Err(e),
        };
        let mut demotions = Vec::new();
        // Move victims out first so the tier's own budget check passes.
        for (victim, _) in evicted {
            level.evictions.fetch_add(1, Ordering::Relaxed);
            // Read the victim only if a lower level will take it: at the bottom the read
            // would only delay the removal that frees its bytes in the tier.
            let next = self.next_level_lacking(i, &victim);
            let bytes = match next {
                Some(_) => match level.tier.get(&victim).await {
                    Ok(TierGet::Hit(b)) => Some(b),
                    _ => None,
                },
                None => None,
            };
            if let Err(e) = level.tier.remove(&victim).await {
                tracing::warn!(tier = %level.tier.name(), key = %victim, error = %e, "evict failed");
            }
            if let (Some(b), Some(next)) = (bytes, next) {
                self.inner
                    .counters
                    .demotions
                    .fetch_add(1, Ordering::Relaxed);
                demotions.push((next, victim, b));
            }
        }
        match self.put_with_retry(level, key, block).await {
            Ok(()) => {
                // A concurrent placement may have evicted this key while its put was on
                // the way (its remove found nothing yet). Left there, the bytes would be
                // an orphan the budget no longer counts, and orphans fill the tier until
                // every put fails with `Full`.
                if !level.space.lock().contains(key) {
                    if let Err(e) = level.tier.remove(key).await {
                        tracing::warn!(tier = %level.tier.name(), %key, error = %e, "orphan removal failed");
                    }
                    // Stored, then evicted by newer data: a normal eviction, not a
                    // failed put.
                    return Ok((true, demotions));
                }
                Ok((true, demotions))
            }
            // Evicted by a concurrent placement before its bytes could land: the same
            // outcome as stored-then-evicted, not a failure.
            Err(CacheError::Full(_)) if !level.space.lock().contains(key) => Ok((true, demotions)),
            Err(e) => {
                level.space.lock().remove(key);
                tracing::warn!(tier = %level.tier.name(), %key, error = %e, "tier put failed");
                // Victims already left this level; still demote them.
                if demotions.is_empty() {
                    Err(e)
                } else {
                    Ok((false, demotions))
                }
            }
        }
    }

    /// `tier.put`, retried a few times on `Full` while the budget still holds `key`:
    /// the tier can be transiently over the budget's view by blocks whose puts were in
    /// flight when a concurrent placement evicted them; their owners remove them as soon
    /// as those puts complete (see `place_one`), so room appears within milliseconds.
    async fn put_with_retry(&self, level: &Level, key: &CacheKey, block: Block) -> Result<()> {
        // Up to 255 ms in all: a removal on a loaded machine waits for the disk tier's
        // key lock and a RocksDB delete on the blocking pool (measured: 15 ms was not
        // always enough on 2 busy cores); still short against the GET this put follows.
        const BACKOFF_MS: [u64; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
        for wait in BACKOFF_MS {
            match level.tier.put(key, block.clone()).await {
                Err(CacheError::Full(_)) if level.space.lock().contains(key) => {
                    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                }
                other => return other,
            }
        }
        level.tier.put(key, block).await
    }

    /// The eviction policy of each level, top first.
    pub fn policy_names(&self) -> Vec<&'static str> {
        self.inner
            .levels
            .iter()
            .map(|l| l.space.lock().policy_name())
            .collect()
    }

    fn next_level_lacking(&self, from: usize, key: &CacheKey) -> Option<usize> {
        (from + 1..self.inner.levels.len())
            .find(|&j| !self.inner.levels[j].space.lock().contains(key))
    }

    pub fn stats(&self) -> EngineStatsSnapshot {
        let c = &self.inner.counters;
        EngineStatsSnapshot {
            tiers: self
                .inner
                .levels
                .iter()
                .map(|l| {
                    let mut t = l.tier.stats();
                    t.evictions += l.evictions.load(Ordering::Relaxed);
                    t.misses += l.misses.load(Ordering::Relaxed);
                    t
                })
                .collect(),
            fills: c.fills.load(Ordering::Relaxed),
            fill_bytes: c.fill_bytes.load(Ordering::Relaxed),
            singleflight_joins: c.singleflight_joins.load(Ordering::Relaxed),
            promotions: c.promotions.load(Ordering::Relaxed),
            demotions: c.demotions.load(Ordering::Relaxed),
            prefetch_fills: c.prefetch_fills.load(Ordering::Relaxed),
            prefetch_bytes: c.prefetch_bytes.load(Ordering::Relaxed),
        }
    }
}
