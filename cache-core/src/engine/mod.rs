//! The composing engine: tiers stacked fastest first, read-through with fill,
//! promotion on hit, demotion on eviction, and single-flight for concurrent misses.
//!
//! Design:
//! - Decisions are taken by one [`Hierarchy`] (the access tracker and each level's
//!   [`crate::space::TierSpace`]: byte accounting and the eviction policy) under one
//!   mutex, never held across an `.await`; the tier I/O happens after it is released.
//!   The replay simulator drives the same `Hierarchy`.
//! - Every demand access is observed by the tracker once, when it arrives; the
//!   observation travels in `ctx.obs` to every policy. Prefetch fills, promotions and
//!   demotions are marked ([`AccessKind`]) and never observed as demand.
//! - One budget: a level's `TierSpace` is the only authority on its bytes. A write
//!   reserves its bytes first (evicting as needed) and becomes a resident, and so a
//!   possible victim, only when its bytes have landed; so no eviction can race a write
//!   in flight and leave bytes the budget does not count, and tiers never refuse for
//!   capacity (they report device errors, `ENOSPC` included). A victim is uncharged
//!   when chosen and removed from its device before the write that evicted it lands, so
//!   a device exceeds its budget only by victims whose removal is under way (at most
//!   one block per concurrent write).
//! - A fill goes to the top level and, when `write_through` is set, to the persistent
//!   levels too, so a restart finds the data (mountpoint-s3 #1619: "cache wiped at every
//!   mount"). A victim evicted from a level is demoted to the next level that does not
//!   already hold it.
//! - A hit on a lower level is promoted to the top level.
//! - Durability of puts: [`CacheEngine::put`] is acknowledged only once the block is
//!   stored on every persistent (disk) level that write-through reaches, so an
//!   acknowledged put survives a restart; if that write fails, the put fails with the
//!   disk's error and the block is removed from the levels that took it (a retry writes
//!   it again instead of finding it "already present" in memory only).
//!   [`CacheEngine::put_stored`] instead keeps the block wherever it landed and says
//!   which durability it got ([`Stored`]), for callers that can tell their clients.
//!   Copies of file blocks (fills, promotions, demotions) are written without the disk
//!   tier's syncs ([`Tier::put_refetchable`]): the object store holds them, a power
//!   loss costs only the copy (dropped at open or at the read that finds it torn), and
//!   a cold read no longer pays a device flush per block or per 4 KiB unit. Copies of KV
//!   blocks keep the tier's full durability: nothing else holds them.
//! - A full or failing disk degrades: a write error (`ENOSPC`, an I/O or index error)
//!   marks the level degraded for a back-off, with one log line per spell and a counter
//!   ([`EngineStatsSnapshot::degradations`]); meanwhile writes skip the level (fills and
//!   demotions lose only a cached copy; `put` fails at once with
//!   [`CacheError::Degraded`], naming the error and when writes resume; `put_stored`
//!   answers [`Stored::Volatile`]) instead of paying the error on every write. Reads
//!   still use the level. The first write after the back-off tries again. The back-off
//!   starts at 1 s and doubles while those tries fail, up to 30 s by default: one
//!   transient EIO costs a second of refused puts, not 30 (black-box finding), and a
//!   dead or full device still costs one failed write per 30 s.
//! - A level whose accounting holds a key its tier no longer has (a corrupt block the
//!   disk tier dropped) forgets the key at the first miss, so it can be filled again.
//! - Concurrent misses on one key share one fetch: the first caller spawns it as a task
//!   (so it finishes even if that caller is cancelled, e.g. an interrupted FUSE read) and
//!   every caller awaits the same shared result.

mod builder;
mod degraded;
mod placement;

pub use builder::EngineBuilder;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;

use crate::access::{AccessContext, AccessKind};
use crate::block::Block;
use crate::error::{CacheError, Result};
use crate::hierarchy::Hierarchy;
use crate::key::CacheKey;
use crate::pattern::Pattern;
use crate::policy::{EvictionPolicy, LruPolicy};
use crate::space::{Placement, TierSpace};
use crate::stats::TierStatsSnapshot;
use crate::stream::{StreamReport, TreeConfig};
use crate::tier::{Tier, TierGet, TierKind};
use crate::write_behind::WriteBehind;

type SharedFetch = Shared<BoxFuture<'static, std::result::Result<Bytes, Arc<CacheError>>>>;

/// Hands the blocks of one run fetch ([`CacheEngine::fetch_runs`]) to their waiters as
/// each arrives, before the run's last byte (issue 14: a reader waiting on the first
/// block of an 8 MiB GET waited for all eight). Block `i` of the run is delivered once;
/// later deliveries of it (a retried request) are ignored. A block never delivered
/// reaches its waiters with the run's result, after its fill.
pub struct RunSink {
    senders: Mutex<Vec<Option<tokio::sync::oneshot::Sender<Bytes>>>>,
}

impl RunSink {
    /// Block `i` of the run is complete: its waiters get it now.
    pub fn deliver(&self, i: usize, block: &Bytes) {
        let tx = self.senders.lock().get_mut(i).and_then(Option::take);
        if let Some(tx) = tx {
            // No receiver left (nobody waits any more): nothing to hand over.
            let _ = tx.send(block.clone());
        }
    }
}

/// The shared result of one run fetch ([`CacheEngine::fetch_runs`]): the run's blocks.
pub type RunFetch =
    Shared<BoxFuture<'static, std::result::Result<Arc<Vec<Bytes>>, Arc<CacheError>>>>;

/// Bytes reserved at one level, released when dropped (unless taken over by a commit).
struct Charge<'a> {
    state: &'a Mutex<Hierarchy>,
    level: usize,
    bytes: u64,
}

impl<'a> Charge<'a> {
    fn new(state: &'a Mutex<Hierarchy>, level: usize, bytes: u64) -> Self {
        Charge {
            state,
            level,
            bytes,
        }
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.state.lock().release(self.level, self.bytes);
        }
    }
}

/// One level's device and the counters the engine keeps for it.
struct Level {
    tier: Arc<dyn Tier>,
    /// Counted here, not in the tier: the engine decides evictions.
    evictions: AtomicU64,
    /// Lookups the level's accounting answered as absent without asking the tier (the
    /// tier's own counter sees only the lookups that reach it).
    misses: AtomicU64,
    /// Hits of reads that were not a client's (KV staging, prefetch), which the tier
    /// counted as hits: taken out of its hits, so a tier's hit ratio is what clients
    /// got (black-box finding: a Prefetch and no Get showed a 0% memory hit ratio).
    quiet_hits: AtomicU64,
    /// Reads of blocks in place (by device handle, [`CacheEngine::record_read_in_place`]),
    /// which reach no tier's own counters: hits of the level all the same (black-box
    /// finding: a GPU tier's reads by handle were KV hits but not GPU-tier hits).
    in_place_hits: AtomicU64,
    /// Writes skip the level until this instant (nanoseconds since the engine's epoch;
    /// 0: healthy). Set by a device error on a persistent level.
    degraded_until: AtomicU64,
    /// Whether the level is in a degraded spell (for one log line per spell).
    degraded: AtomicBool,
    /// The spell's current back-off (nanoseconds; 0 outside a spell): doubles with each
    /// failed try, up to the engine's `degraded_backoff`.
    degraded_backoff_ns: AtomicU64,
    /// The device error that began or extended the spell, for the refusals' message.
    degraded_cause: Mutex<String>,
    /// Whether a full device brought the level's budget below its tier's capacity
    /// (`note_write_error`), for a successful write to give it back.
    budget_lowered: AtomicBool,
    /// When a write last checked the device's room for a lowered budget (engine epoch
    /// nanoseconds; `recheck_lowered_budget`).
    budget_checked_at: AtomicU64,
}

/// What an acknowledged [`CacheEngine::put_stored`] achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// On every persistent level write-through reaches (or there is none and the block
    /// is held in memory): survives a restart when a disk tier exists.
    Durable,
    /// Held by a volatile level only: the persistent level was degraded, refused it or
    /// failed to write it. Lost at a restart.
    Volatile,
}

/// Longest back-off of a degraded persistent level (see the module docs): long enough
/// that a full device costs one failed write per 30 s, short enough to notice freed
/// space soon.
pub const DEFAULT_DEGRADED_BACKOFF: Duration = Duration::from_secs(30);

/// First back-off of a degraded spell: one transient error (a bad sector, a hiccup of
/// network storage) refuses durable puts for a second, not for the whole longest
/// back-off; a device that keeps failing reaches the longest in five doublings.
pub const FIRST_DEGRADED_BACKOFF: Duration = Duration::from_secs(1);

/// What a fill achieved beyond landing somewhere.
struct Fill {
    /// Why an inline put is not durable (a persistent level it had to reach does not
    /// hold the block), if it is not.
    not_durable: Option<CacheError>,
    /// The copy being written behind the caller ([`crate::write_behind`]), if any: a
    /// fetch keeps its block in the in-flight map until it lands, so a reader arriving
    /// meanwhile joins the fetch rather than sending another.
    behind: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Persist {
    Inline,
    Background,
}

/// How hard a tier write works to survive a crash ([`Tier::put`] or
/// [`Tier::put_refetchable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteKind {
    /// The tier's full durability: explicit puts (acknowledged once durable), and any
    /// copy of a KV block (no store holds it).
    Durable,
    /// A copy of a file block the object store still holds (fills, promotions and
    /// demotions): a lost copy costs a refetch, so the disk tier skips its syncs. A cold
    /// read of 4 KiB units would otherwise pay a device flush per unit.
    Refetchable,
}

impl WriteKind {
    /// The write of a cached copy of `key` (not an explicit put).
    fn of_copy(key: &CacheKey) -> Self {
        if key.refetchable() {
            WriteKind::Refetchable
        } else {
            WriteKind::Durable
        }
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
    /// Blocks a level counted whose bytes its tier no longer had (forgotten).
    lost_blocks: AtomicU64,
    /// Times a persistent level went from healthy to degraded.
    degradations: AtomicU64,
    /// Writes that skipped a degraded level.
    degraded_skips: AtomicU64,
    /// Copies of file blocks not written behind a reader: the bound was taken.
    writes_shed: AtomicU64,
}

struct Inner {
    levels: Vec<Level>,
    /// The access tracker and every level's accounting; never held across an await.
    state: Mutex<Hierarchy>,
    write_through: bool,
    inflight: Mutex<HashMap<CacheKey, SharedFetch>>,
    counters: EngineCounters,
    /// Time origin of `Level::degraded_until`.
    epoch: Instant,
    degraded_backoff: Duration,
    /// Keys with a durable copy outside the engine (see
    /// [`CacheEngine::add_kept_elsewhere`]); persistent levels do not store them.
    kept_elsewhere: parking_lot::RwLock<Vec<KeptElsewhere>>,
    /// Copies of file blocks written to persistent levels behind their readers.
    write_behind: WriteBehind,
    /// A level above the disk holds blocks in memory (fills may write behind it).
    has_volatile_level: bool,
}

/// Says whether a key has a durable copy outside the engine.
pub type KeptElsewhere = Arc<dyn Fn(&CacheKey) -> bool + Send + Sync>;

/// The tiered cache. Cheap to clone (shared state).
#[derive(Clone)]
pub struct CacheEngine {
    inner: Arc<Inner>,
}

/// Engine-wide counters and every tier's.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct EngineStatsSnapshot {
    pub tiers: Vec<TierStatsSnapshot>,
    /// Blocks filled into the cache (store misses and puts), counted once a level took
    /// them (or their copy is on its way to one): a refused put is no fill.
    pub fills: u64,
    pub fill_bytes: u64,
    /// Callers that joined a fetch already in flight instead of issuing their own.
    pub singleflight_joins: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub prefetch_fills: u64,
    pub prefetch_bytes: u64,
    /// Blocks a level's accounting held but its tier had lost (e.g. dropped as corrupt);
    /// forgotten so they can be filled again.
    #[serde(default)]
    pub lost_blocks: u64,
    /// The access tracker: demand accesses observed and streams tracked.
    #[serde(default)]
    pub tracker: TrackerStats,
    /// Times a persistent level was degraded by a device error (full, failing).
    #[serde(default)]
    pub degradations: u64,
    /// Writes (fills, puts, demotions) that skipped a degraded level.
    #[serde(default)]
    pub degraded_skips: u64,
    /// Names of the levels degraded now.
    #[serde(default)]
    pub degraded: Vec<String>,
    /// Copies of file blocks a persistent level did not get because the bytes being
    /// written behind readers were at their bound (a cache disk slower than the store).
    #[serde(default)]
    pub writes_shed: u64,
    /// Bytes being written behind readers now.
    #[serde(default)]
    pub write_behind_bytes: u64,
}

/// The access tracker as `strata stats` shows it.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct TrackerStats {
    pub observed: u64,
    pub streams: usize,
    /// The most recently active streams, each with its pattern and deciding test.
    pub recent: Vec<StreamReport>,
}

/// Streams listed in [`EngineStatsSnapshot::tracker`]: 32, what fits a terminal.
const STATS_STREAMS: usize = 32;

impl CacheEngine {
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Bytes all levels may hold together (the budgets, not what they hold now).
    pub fn capacity_bytes(&self) -> u64 {
        self.inner
            .levels
            .iter()
            .map(|l| l.tier.capacity_bytes())
            .fold(0, u64::saturating_add)
    }

    /// The budget of the fastest level (0 without levels).
    pub fn fastest_capacity_bytes(&self) -> u64 {
        self.inner
            .levels
            .first()
            .map_or(0, |l| l.tier.capacity_bytes())
    }

    /// Kinds of the levels, fastest first.
    pub fn tier_kinds(&self) -> Vec<TierKind> {
        self.inner.levels.iter().map(|l| l.tier.kind()).collect()
    }

    /// `ctx` as policies must see it: a demand access observed by the tracker (once).
    /// Public for a reader that decides what to read from the observation (the stream's
    /// pattern, for the fetch unit) before reading through the `*_observed` calls.
    pub fn observed(&self, key: &CacheKey, ctx: &AccessContext) -> AccessContext {
        let mut ctx = *ctx;
        self.inner.state.lock().observe(key, &mut ctx);
        ctx
    }

    /// Looks `key` up in every level, fastest first; promotes a lower-level hit. A
    /// demand miss fills nothing (the caller has no source: a KV Get), and the levels'
    /// policies are told so.
    pub async fn get(&self, key: &CacheKey, ctx: &AccessContext) -> Result<Option<Bytes>> {
        let ctx = self.observed(key, ctx);
        let got = self.lookup(key, &ctx).await?;
        if got.is_none() && ctx.is_demand() {
            self.inner.state.lock().note_unfilled_miss(key, &ctx);
        }
        Ok(got)
    }

    /// [`Self::get`] for an access already observed.
    async fn lookup(&self, key: &CacheKey, ctx: &AccessContext) -> Result<Option<Bytes>> {
        for (i, level) in self.inner.levels.iter().enumerate() {
            let (held, read_at) = {
                let mut state = self.inner.state.lock();
                (state.touch(i, key, ctx), state.removal_seq())
            };
            if !held {
                if ctx.is_demand() {
                    level.misses.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            match level.tier.get(key).await {
                Ok(TierGet::Hit(block)) => {
                    if !ctx.is_demand() {
                        level.quiet_hits.fetch_add(1, Ordering::Relaxed);
                    }
                    if i > 0 {
                        self.promote(i, key, block.clone(), ctx, read_at).await;
                    }
                    return Ok(Some(block.into_data()));
                }
                Ok(TierGet::Miss) => {
                    // Counted but gone (dropped as corrupt, or removed behind our
                    // back): forget it so a later fill or put stores it again.
                    if self.inner.state.lock().forget(i, key).is_some() {
                        self.inner
                            .counters
                            .lost_blocks
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                Ok(TierGet::Throttled) => continue,
                // A failing tier is skipped, not fatal: the data is still in the store.
                Err(e) => {
                    tracing::warn!(tier = %level.tier.name(), %key, error = %e, "tier get failed");
                    continue;
                }
            }
        }
        Ok(None)
    }

    /// Records a read of `key` that its reader makes in place, in the memory of the
    /// level holding it (a GPU block read by device handle), where no bytes pass through
    /// [`Self::get`]: the tracker observes it and that level's policy sees the hit, as
    /// a get's would, so a block hot only through such reads is not evicted as cold.
    /// Returns the holding level's kind; None when no level holds `key` (then only the
    /// observation is recorded, as for a get that misses).
    pub fn record_read_in_place(&self, key: &CacheKey, ctx: &AccessContext) -> Option<TierKind> {
        let i = {
            let mut state = self.inner.state.lock();
            let mut ctx = *ctx;
            state.observe(key, &mut ctx);
            let i = state.locate(key)?;
            state.touch(i, key, &ctx);
            i
        };
        // The faster levels answered "absent" as a get's lookup would have found them.
        for level in &self.inner.levels[..i] {
            level.misses.fetch_add(1, Ordering::Relaxed);
        }
        let level = &self.inner.levels[i];
        level.in_place_hits.fetch_add(1, Ordering::Relaxed);
        Some(level.tier.kind())
    }

    /// Which level holds `key` now, if any (fastest first).
    pub fn locate(&self, key: &CacheKey) -> Option<TierKind> {
        let i = self.inner.state.lock().locate(key)?;
        Some(self.inner.levels[i].tier.kind())
    }

    /// Every KV block the levels hold now, with its size (a block in two levels once),
    /// fastest level first, each in its tier's order (a disk tier: oldest write first).
    /// A scan of every level's index: for start-up accounting, not request paths.
    pub fn resident_kv(&self) -> Vec<(CacheKey, u64)> {
        let mut seen = std::collections::HashSet::new();
        let mut held = Vec::new();
        for level in &self.inner.levels {
            for (key, size) in level.tier.resident() {
                if matches!(key, CacheKey::Kv(_)) && seen.insert(key.clone()) {
                    held.push((key, size));
                }
            }
        }
        held
    }

    /// Whether any level holds `key`.
    pub fn contains(&self, key: &CacheKey) -> bool {
        self.inner.state.lock().locate(key).is_some()
    }

    /// Whether any level holds `key` or a fetch of it is in flight (a read of it now
    /// would not send a request of its own).
    pub fn held_or_fetching(&self, key: &CacheKey) -> bool {
        self.inner.inflight.lock().contains_key(key) || self.contains(key)
    }

    /// How many of `keys` are held or in flight ([`Self::held_or_fetching`]), under one
    /// lock of each map.
    /// Counting stops at `max`: a caller comparing with a threshold (the granularity's
    /// dense rule asks about up to 511 unit keys of a block) holds the engine's lock no
    /// longer than the answer needs.
    pub fn count_held_or_fetching(&self, keys: &[CacheKey], max: u32) -> u32 {
        let inflight = self.inner.inflight.lock();
        let state = self.inner.state.lock();
        keys.iter()
            .filter(|k| inflight.contains_key(*k) || state.locate(k).is_some())
            .take(max as usize)
            .count() as u32
    }

    /// The pattern the access tracker has classified `key`'s stream as (for `ctx.job`):
    /// what the prefetch controller is told, whatever the eviction policy.
    pub fn pattern_of(&self, key: &CacheKey, ctx: &AccessContext) -> Pattern {
        self.inner.state.lock().tracker().pattern_of(key, ctx)
    }

    /// Stores `data` under `key` (values are immutable: a repeated put is idempotent).
    ///
    /// Acknowledged only once durable: with write-through to a disk level (the default),
    /// `Ok` means the block is on disk (synced, as the disk tier's durability says). If
    /// the disk level is degraded or its write fails, the put fails (at once while
    /// degraded: no per-put stall) and the block is left nowhere, so a retry stores it
    /// again. See [`Self::put_stored`] to keep the block in memory instead.
    pub async fn put(&self, key: &CacheKey, data: Bytes, ctx: &AccessContext) -> Result<()> {
        if self.inner.write_through {
            if let Some(i) = self.degraded_persistent_level() {
                self.inner
                    .counters
                    .degraded_skips
                    .fetch_add(1, Ordering::Relaxed);
                return Err(self.degraded_refusal(i, key));
            }
        }
        let ctx = self.observed(key, ctx);
        let fill = self.fill_to_the_end(key, Block::new(data), ctx).await?;
        match fill.not_durable {
            None => Ok(()),
            Some(e) => {
                // Unacknowledged: leave no copy that would make a retry "already present".
                if let Err(r) = self.remove(key).await {
                    tracing::warn!(%key, error = %r, "removing an unacknowledged put failed");
                }
                Err(e)
            }
        }
    }

    /// Stores `data` under `key` wherever the levels take it and says whether that is
    /// durable ([`Stored`]): a degraded or failing disk level leaves the block in memory
    /// ([`Stored::Volatile`]) instead of failing the put.
    pub async fn put_stored(
        &self,
        key: &CacheKey,
        data: Bytes,
        ctx: &AccessContext,
    ) -> Result<Stored> {
        let ctx = self.observed(key, ctx);
        let fill = self.fill_to_the_end(key, Block::new(data), ctx).await?;
        Ok(match fill.not_durable {
            None => Stored::Durable,
            Some(_) => Stored::Volatile,
        })
    }

    /// A put's placement, run to its end even if the caller is dropped (a client that
    /// hung up or passed its deadline): abandoned between a tier's write and the
    /// level's commit, it left block files that no budget counted and levels over their
    /// capacity (black-box finding: 839 MiB of block files against a 96 MiB disk tier
    /// after 30 cancelled puts). A put that was started is finished, as a write(2) is.
    async fn fill_to_the_end(
        &self,
        key: &CacheKey,
        block: Block,
        ctx: AccessContext,
    ) -> Result<Fill> {
        let (engine, key) = (self.clone(), key.clone());
        let placing =
            tokio::spawn(async move { engine.fill(&key, block, &ctx, Persist::Inline).await });
        match placing.await {
            Ok(r) => r,
            Err(e) => Err(CacheError::Io(std::io::Error::other(format!(
                "placing a put failed: {e}"
            )))),
        }
    }

    /// The first persistent level in a degraded spell, if any.
    fn degraded_persistent_level(&self) -> Option<usize> {
        (0..self.inner.levels.len())
            .find(|&i| self.inner.levels[i].tier.kind() == TierKind::Disk && self.is_degraded(i))
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Declares which keys have a durable copy outside the engine (a mount's
    /// passthrough files hold whole small objects): persistent levels neither take such
    /// keys on fill nor on demotion, so a byte is kept on disk once. Volatile levels
    /// still cache them. The caller drops copies already on disk with
    /// [`Self::drop_persistent`]. Each mount adds its own.
    pub fn add_kept_elsewhere(&self, f: KeptElsewhere) {
        self.inner.kept_elsewhere.write().push(f);
    }

    /// Whether level `i` must not store `key` (it is persistent and `key` is kept
    /// elsewhere).
    fn skip_persistent(&self, i: usize, key: &CacheKey) -> bool {
        self.inner.levels[i].tier.kind() == TierKind::Disk
            && self.inner.kept_elsewhere.read().iter().any(|f| f(key))
    }

    /// Removes `key` from the persistent levels only (its durable copy now lives
    /// elsewhere: see [`Self::add_kept_elsewhere`]); returns whether any held it.
    pub async fn drop_persistent(&self, key: &CacheKey) -> Result<bool> {
        let mut found = false;
        for (i, level) in self.inner.levels.iter().enumerate() {
            if level.tier.kind() != TierKind::Disk {
                continue;
            }
            if self.inner.state.lock().forget(i, key).is_some() {
                found |= level.tier.remove(key).await?;
            }
        }
        Ok(found)
    }

    /// The number of the latest removal, for [`Self::known_removed_since`].
    pub fn removal_seq(&self) -> u64 {
        self.inner.state.lock().removal_seq()
    }

    /// Whether `key` was removed by [`Self::remove`] (evictions aside) after removal
    /// number `seq` ([`Self::removal_seq`]), as far as the engine remembers (4,096
    /// removals back; beyond: false). A Put that a Remove of its key overlapped can take
    /// effect before it, and so store nothing.
    pub fn known_removed_since(&self, key: &CacheKey, seq: u64) -> bool {
        self.inner.state.lock().known_removed_since(key, seq)
    }

    /// Removes `key` from every level, as asked (a client's Remove: a Put that arrived
    /// before it and stores after it stores nothing, see [`Self::known_removed_since`]);
    /// returns whether any held it.
    pub async fn remove(&self, key: &CacheKey) -> Result<bool> {
        self.remove_noted(key, true).await
    }

    /// Evicts `key` from every level for a reason of the cache's own (a tenant's quota):
    /// as [`Self::remove`], but a Put of the key in flight meanwhile still stores it
    /// (black-box finding: Puts racing a quota's eviction of their key failed "a Remove
    /// of this key overlapped the Put" where no client sent one).
    pub async fn evict(&self, key: &CacheKey) -> Result<bool> {
        self.remove_noted(key, false).await
    }

    async fn remove_noted(&self, key: &CacheKey, asked: bool) -> Result<bool> {
        // Copies of it read before now (a promotion, a demotion) are not placed after.
        self.inner.state.lock().note_removal(key, asked);
        let mut found = false;
        for (i, level) in self.inner.levels.iter().enumerate() {
            self.inner.state.lock().forget(i, key);
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
        self.get_or_fetch_keep(key, ctx, move || fetch().map(|r| r.map(|b| (b, true))))
            .await
    }

    /// [`Self::get_or_fetch`] where the fetch also says whether to keep the bytes: a
    /// block read from another node of the cache group is filled into the tiers only
    /// when the group's admission rule says so; concurrent callers share it either way.
    pub async fn get_or_fetch_keep<F, Fut>(
        &self,
        key: &CacheKey,
        ctx: &AccessContext,
        fetch: F,
    ) -> Result<Bytes>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(Bytes, bool)>> + Send + 'static,
    {
        let ctx = self.observed(key, ctx);
        self.get_or_fetch_keep_observed(key, &ctx, fetch).await
    }

    /// [`Self::get_or_fetch`] for an access already observed ([`Self::observed`]).
    pub async fn get_or_fetch_observed<F, Fut>(
        &self,
        key: &CacheKey,
        ctx: &AccessContext,
        fetch: F,
    ) -> Result<Bytes>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Bytes>> + Send + 'static,
    {
        self.get_or_fetch_keep_observed(key, ctx, move || fetch().map(|r| r.map(|b| (b, true))))
            .await
    }

    /// [`Self::get_or_fetch_keep`] for an access already observed ([`Self::observed`]).
    pub async fn get_or_fetch_keep_observed<F, Fut>(
        &self,
        key: &CacheKey,
        ctx: &AccessContext,
        fetch: F,
    ) -> Result<Bytes>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(Bytes, bool)>> + Send + 'static,
    {
        let ctx = *ctx;
        // A block can land between the lookup's miss and the in-flight check (another
        // caller's fetch filled it and left the map, or a put stored it): then it is
        // looked up again rather than fetched a second time. Once only: a level whose
        // state says "held" but whose get keeps missing must not spin a reader.
        let mut looked_again = false;
        let shared = loop {
            if let Some(bytes) = self.lookup(key, &ctx).await? {
                return Ok(bytes);
            }
            let mut inflight = self.inner.inflight.lock();
            if !inflight.contains_key(key) && !looked_again && self.contains(key) {
                looked_again = true;
                continue;
            }
            if let Some(f) = inflight.get(key) {
                self.inner
                    .counters
                    .singleflight_joins
                    .fetch_add(1, Ordering::Relaxed);
                break f.clone();
            } else {
                let engine = self.clone();
                let task_key = key.clone();
                let task_ctx = ctx;
                let task = tokio::spawn(async move {
                    let result = fetch().await;
                    let mut behind = Vec::new();
                    if let Ok((bytes, true)) = &result {
                        // Fill before leaving the in-flight map, so a caller arriving
                        // after removal finds the block cached.
                        match engine
                            .fill(
                                &task_key,
                                Block::new(bytes.clone()),
                                &task_ctx,
                                Persist::Background,
                            )
                            .await
                        {
                            Ok(fill) => behind.extend(fill.behind),
                            Err(e) => {
                                tracing::warn!(key = %task_key, error = %e, "fill failed; serving uncached")
                            }
                        }
                    }
                    engine.leave_inflight(vec![task_key], behind);
                    result.map(|(bytes, _)| bytes).map_err(Arc::new)
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
                break shared;
            }
        };
        shared.await.map_err(|e| e.duplicate())
    }

    /// Fetches several blocks with one request each run: claims every key of `keys`
    /// that is neither cached nor in flight, groups the claimed keys into runs of
    /// consecutive indices, and for each run spawns one task running `fetch(run, sink)`,
    /// which must return the run's blocks in order, and may hand each block to its
    /// waiters as soon as it is complete ([`RunSink::deliver`]). Each claimed key is in flight (in the
    /// single-flight map) until its run's fill, so a concurrent `get_or_fetch` of any of
    /// them joins the run instead of fetching the block again. Keys not claimed were
    /// cached or someone else's fetch. Returns the runs claimed, each with the shared
    /// result of its fetch.
    pub fn fetch_runs<F, Fut>(
        &self,
        keys: &[CacheKey],
        ctx: &AccessContext,
        fetch: F,
    ) -> Vec<(std::ops::Range<usize>, RunFetch)>
    where
        F: Fn(std::ops::Range<usize>, RunSink) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Bytes>>> + Send + 'static,
    {
        let fetch = Arc::new(fetch);
        let mut runs = Vec::new();
        let mut inflight = self.inner.inflight.lock();
        let mut i = 0;
        while i < keys.len() {
            let free = |k: &CacheKey| !inflight.contains_key(k) && !self.contains(k);
            if !free(&keys[i]) {
                i += 1;
                continue;
            }
            let start = i;
            while i < keys.len() && free(&keys[i]) {
                i += 1;
            }
            let run = start..i;
            let run_keys: Vec<CacheKey> = keys[run.clone()].to_vec();
            let engine = self.clone();
            let fetch = fetch.clone();
            let task_ctx = *ctx;
            let task_run = run.clone();
            let (senders, mut early): (Vec<_>, Vec<_>) = (0..run.len())
                .map(|_| {
                    let (tx, rx) = tokio::sync::oneshot::channel::<Bytes>();
                    (Some(tx), Some(rx))
                })
                .unzip();
            let sink = RunSink {
                senders: Mutex::new(senders),
            };
            // Spawned while the map is locked: the task's removals wait for the
            // insertions below, so none is left behind.
            let task = tokio::spawn(async move {
                let result = fetch(task_run, sink).await.and_then(|blocks| {
                    if blocks.len() == run_keys.len() {
                        Ok(blocks)
                    } else {
                        Err(CacheError::Corrupt(format!(
                            "a run fetch returned {} blocks for {} keys",
                            blocks.len(),
                            run_keys.len()
                        )))
                    }
                });
                let mut behind = Vec::new();
                if let Ok(blocks) = &result {
                    for (key, bytes) in run_keys.iter().zip(blocks) {
                        match engine
                            .fill(
                                key,
                                Block::new(bytes.clone()),
                                &task_ctx,
                                Persist::Background,
                            )
                            .await
                        {
                            Ok(fill) => behind.extend(fill.behind),
                            Err(e) => {
                                tracing::warn!(%key, error = %e, "fill failed; serving uncached")
                            }
                        }
                    }
                }
                engine.leave_inflight(run_keys, behind);
                result.map(Arc::new).map_err(Arc::new)
            });
            let whole: RunFetch = async move {
                match task.await {
                    Ok(r) => r,
                    Err(join) => Err(Arc::new(CacheError::SharedFetch(format!(
                        "run fetch task failed: {join}"
                    )))),
                }
            }
            .boxed()
            .shared();
            for (n, key) in keys[run.clone()].iter().enumerate() {
                let whole = whole.clone();
                let rx = early[n].take();
                let one: SharedFetch = async move {
                    if let Some(rx) = rx {
                        if let Ok(block) = rx.await {
                            return Ok(block);
                        }
                    }
                    whole.await.map(|blocks| blocks[n].clone())
                }
                .boxed()
                .shared();
                inflight.insert(key.clone(), one);
            }
            runs.push((run, whole));
        }
        runs
    }

    /// `bytes` of the write-behind bound, or None (the copy is shed, and counted).
    fn take_behind(&self, bytes: u64) -> Option<crate::write_behind::Pending> {
        let taken = self.inner.write_behind.try_take(bytes);
        if taken.is_none() {
            self.inner
                .counters
                .writes_shed
                .fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Takes fetched `keys` out of the in-flight map: now, or once the copies `behind`
    /// are written (a volatile level may not hold them meanwhile, and a reader that
    /// arrives then must join the finished fetch rather than send another).
    fn leave_inflight(&self, keys: Vec<CacheKey>, behind: Vec<tokio::task::JoinHandle<()>>) {
        let forget = move |engine: &CacheEngine| {
            let mut inflight = engine.inner.inflight.lock();
            for key in &keys {
                inflight.remove(key);
            }
        };
        if behind.is_empty() {
            forget(self);
            return;
        }
        let engine = self.clone();
        tokio::spawn(async move {
            for write in behind {
                let _ = write.await;
            }
            forget(&engine);
        });
    }

    /// The eviction policy of each level, top first.
    pub fn policy_names(&self) -> Vec<&'static str> {
        self.inner.state.lock().policy_names()
    }

    /// The access tracker's most recently active streams (at most `max`).
    pub fn streams(&self, max: usize) -> Vec<StreamReport> {
        self.inner.state.lock().tracker().report(max)
    }

    pub fn stats(&self) -> EngineStatsSnapshot {
        let c = &self.inner.counters;
        let (tracker, guard_periods, budgets) = {
            let state = self.inner.state.lock();
            let budgets: Vec<u64> = (0..self.inner.levels.len())
                .map(|i| state.level(i).budget())
                .collect();
            let t = state.tracker();
            let tracker = TrackerStats {
                observed: t.observed(),
                streams: t.streams(),
                recent: t.report(STATS_STREAMS),
            };
            (tracker, state.policy_guard_periods(), budgets)
        };
        EngineStatsSnapshot {
            tiers: self
                .inner
                .levels
                .iter()
                .zip(guard_periods.into_iter().chain(std::iter::repeat((0, 0))))
                .zip(budgets)
                .map(|((l, (recency, frequency)), budget)| {
                    let mut t = l.tier.stats();
                    // A full device brought the budget down to what the level holds
                    // (black-box finding: the figure stayed the configured 1 GiB, 3%
                    // used, on a full file system).
                    if l.budget_lowered.load(Ordering::Relaxed) {
                        t.capacity_bytes = t.capacity_bytes.min(budget);
                    }
                    t.policy_recency_periods = recency;
                    t.policy_frequency_periods = frequency;
                    t.evictions += l.evictions.load(Ordering::Relaxed);
                    t.misses += l.misses.load(Ordering::Relaxed);
                    t.hits = t.hits.saturating_sub(l.quiet_hits.load(Ordering::Relaxed))
                        + l.in_place_hits.load(Ordering::Relaxed);
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
            lost_blocks: c.lost_blocks.load(Ordering::Relaxed),
            tracker,
            degradations: c.degradations.load(Ordering::Relaxed),
            degraded_skips: c.degraded_skips.load(Ordering::Relaxed),
            writes_shed: c.writes_shed.load(Ordering::Relaxed),
            write_behind_bytes: self.inner.write_behind.pending(),
            degraded: (0..self.inner.levels.len())
                .filter(|&i| self.is_degraded(i))
                .map(|i| self.inner.levels[i].tier.name())
                .collect(),
        }
    }
}
