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
        match key {
            CacheKey::File(_) => WriteKind::Refetchable,
            CacheKey::Kv(_) => WriteKind::Durable,
        }
    }
}

/// Builds a [`CacheEngine`].
pub struct EngineBuilder {
    levels: Vec<(Arc<dyn Tier>, Box<dyn EvictionPolicy>)>,
    write_through: bool,
    tree: TreeConfig,
    degraded_backoff: Duration,
    /// Bound on bytes written behind readers (None: [`WriteBehind::default_cap`]).
    write_behind: Option<u64>,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        // Write-through to persistent tiers by default: a restart is then warm.
        EngineBuilder {
            levels: Vec::new(),
            write_through: true,
            tree: TreeConfig::default(),
            degraded_backoff: DEFAULT_DEGRADED_BACKOFF,
            write_behind: None,
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

    /// The longest writes skip a persistent level after a device error on it (the
    /// first skip lasts [`FIRST_DEGRADED_BACKOFF`] or this, the shorter).
    pub fn degraded_backoff(mut self, backoff: Duration) -> Self {
        self.degraded_backoff = backoff;
        self
    }

    /// Bound on the bytes of file-block copies written to persistent levels behind
    /// their readers: its ceiling ([`crate::write_behind`]; the bound follows the disk
    /// below it). Default: a quarter of the fastest level, within 16..256 MiB.
    pub fn write_behind_bytes(mut self, bytes: u64) -> Self {
        self.write_behind = Some(bytes);
        self
    }

    /// Tunables of the access tracker's stream tree.
    pub fn tracker(mut self, tree: TreeConfig) -> Self {
        self.tree = tree;
        self
    }

    /// Builds the engine; the accounting of each level starts from what the tier already
    /// holds (a disk tier reopened after a restart). Residents the budget cannot hold
    /// (the budget shrank since the last run) are removed from the tier, so the budget
    /// stays the one account of its bytes.
    pub fn build(self) -> Result<CacheEngine> {
        if self.levels.is_empty() {
            return Err(CacheError::InvalidArgument(
                "an engine needs at least one tier".into(),
            ));
        }
        let ctx = AccessContext::default().moved(AccessKind::Promotion);
        let mut levels = Vec::with_capacity(self.levels.len());
        let mut spaces = Vec::with_capacity(self.levels.len());
        let mut excess = Vec::new();
        for (tier, policy) in self.levels {
            let max_entries = tier
                .max_entries()
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
            let mut space =
                TierSpace::new(tier.capacity_bytes(), policy).with_max_entries(max_entries);
            for (key, size) in tier.resident() {
                let size = tier.footprint(&key, size);
                // Older residents the budget evicts for newer ones leave the tier too
                // (they were left on the device, uncounted, before).
                match space.place(&key, size, &ctx) {
                    Ok(Placement::Admitted { evicted }) => {
                        excess.extend(evicted.into_iter().map(|(k, _)| (tier.clone(), k)));
                    }
                    Ok(Placement::Refused { evicted }) => {
                        excess.extend(evicted.into_iter().map(|(k, _)| (tier.clone(), k)));
                        excess.push((tier.clone(), key));
                    }
                    _ => excess.push((tier.clone(), key)),
                }
            }
            spaces.push(space);
            levels.push(Level {
                tier,
                evictions: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                quiet_hits: AtomicU64::new(0),
                in_place_hits: AtomicU64::new(0),
                degraded_until: AtomicU64::new(0),
                degraded: AtomicBool::new(false),
                degraded_backoff_ns: AtomicU64::new(0),
                degraded_cause: Mutex::new(String::new()),
                budget_lowered: AtomicBool::new(false),
                budget_checked_at: AtomicU64::new(0),
            });
        }
        let fastest = levels.first().map_or(0, |l| l.tier.capacity_bytes());
        let has_volatile_level = levels.iter().any(|l| l.tier.kind() != TierKind::Disk);
        if !excess.is_empty() {
            tracing::info!(
                blocks = excess.len(),
                "removing cached blocks beyond the configured budget"
            );
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move {
                        for (tier, key) in excess {
                            if let Err(e) = tier.remove(&key).await {
                                tracing::warn!(tier = %tier.name(), %key, error = %e, "removing an excess block failed");
                            }
                        }
                    });
                }
                Err(_) => tracing::warn!(
                    "no async runtime: blocks beyond the budget stay on the device until the next start"
                ),
            }
        }
        Ok(CacheEngine {
            inner: Arc::new(Inner {
                levels,
                state: Mutex::new(Hierarchy::with_tracker(spaces, self.tree)),
                write_through: self.write_through,
                inflight: Mutex::new(HashMap::new()),
                counters: EngineCounters::default(),
                epoch: Instant::now(),
                degraded_backoff: self.degraded_backoff,
                kept_elsewhere: parking_lot::RwLock::new(Vec::new()),
                write_behind: WriteBehind::new(
                    self.write_behind
                        .unwrap_or_else(|| WriteBehind::default_cap(fastest)),
                ),
                has_volatile_level,
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
    /// Blocks fetched from the backing source (store misses filled into the cache).
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

    /// The error of a durable write refused because level `i` is degraded: the tier,
    /// the device's error and when writes to it resume (not "cache full": the room is
    /// not the matter, and a client told so would not retry).
    fn degraded_refusal(&self, i: usize, key: &CacheKey) -> CacheError {
        let level = &self.inner.levels[i];
        let until = level.degraded_until.load(Ordering::Relaxed);
        let left = Duration::from_nanos(until.saturating_sub(self.now_ns()));
        let cause = level.degraded_cause.lock().clone();
        CacheError::Degraded(format!(
            "{} is degraded after a device error ({cause}): {key} not stored durably; \
             writes to it resume in {:.1} s",
            level.tier.name(),
            left.as_secs_f64()
        ))
    }

    /// Whether writes skip level `i` now.
    fn is_degraded(&self, i: usize) -> bool {
        let until = self.inner.levels[i].degraded_until.load(Ordering::Relaxed);
        until != 0 && self.now_ns() < until
    }

    /// After a write error at level `i`: a device error on a persistent level starts
    /// (or extends) a degraded spell. One log line per spell. A shortage of the
    /// process's own resources (descriptors, threads, memory) is not the device's
    /// fault and fails only that write (black-box finding: a burst of clients past
    /// the descriptor limit, or a thread limit that bit for a moment, held every put
    /// out of the disk tier for 30 s after the shortage was over).
    fn note_write_error(&self, i: usize, e: &CacheError) {
        let level = &self.inner.levels[i];
        let device = matches!(
            e,
            CacheError::Full(_) | CacheError::Io(_) | CacheError::Index(_)
        ) && !e.is_resource_shortage();
        if level.tier.kind() != TierKind::Disk || !device {
            return;
        }
        if let CacheError::Full(_) = e {
            // The file system filled before the budget did (a budget larger than the
            // disk, or other files on it): the level's budget comes down to what it
            // holds, so after the back-off new blocks evict old ones rather than fail
            // again while nothing is evicted (black-box finding: every KV Put refused
            // for good on a full disk). It goes back up with the device's room
            // (`note_write_ok`).
            let mut state = self.inner.state.lock();
            let held = state.level(i).used();
            if self.lower_budget(&mut state, i, held) {
                tracing::warn!(tier = %level.tier.name(), budget = held,
                    "disk full before the disk budget: the budget is what the tier holds until the device has room");
            }
        }
        // The first error of a spell backs off FIRST_DEGRADED_BACKOFF; each failed try
        // after a back-off doubles it, up to the longest.
        let longest = u64::try_from(self.inner.degraded_backoff.as_nanos()).unwrap_or(u64::MAX);
        let first = u64::try_from(FIRST_DEGRADED_BACKOFF.as_nanos())
            .unwrap_or(u64::MAX)
            .min(longest);
        let prev = level.degraded_backoff_ns.load(Ordering::Relaxed);
        let backoff = if prev == 0 {
            first
        } else if self.is_degraded(i) {
            // Another write that was in flight when the spell began: the same fault.
            prev
        } else {
            prev.saturating_mul(2).min(longest)
        };
        level
            .degraded_backoff_ns
            .store(backoff.max(1), Ordering::Relaxed);
        *level.degraded_cause.lock() = e.to_string();
        let until = self.now_ns().saturating_add(backoff).max(1);
        level.degraded_until.store(until, Ordering::Relaxed);
        if !level.degraded.swap(true, Ordering::Relaxed) {
            self.inner
                .counters
                .degradations
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                tier = %level.tier.name(),
                error = %e,
                backoff = ?Duration::from_nanos(backoff),
                "disk level degraded: writes skip it for the back-off, doubled while tries fail (reads go on)"
            );
        }
    }

    /// Lowers level `i`'s budget to `held` (the device filled before the budget did;
    /// [`Self::note_write_ok`] raises it again with the device's room); true if it was
    /// above.
    fn lower_budget(&self, state: &mut Hierarchy, i: usize, held: u64) -> bool {
        if held >= state.level(i).budget() {
            return false;
        }
        state.set_budget(i, held);
        self.inner.levels[i]
            .budget_lowered
            .store(true, Ordering::Relaxed);
        true
    }

    /// Gives level `i` back the budget a full device took, as far as the device has room
    /// now (a statvfs, outside the lock).
    fn raise_lowered_budget(&self, i: usize) {
        let level = &self.inner.levels[i];
        if !level.budget_lowered.load(Ordering::Relaxed) {
            return;
        }
        if let Some(free) = level.tier.free_bytes() {
            let configured = level.tier.capacity_bytes();
            let mut state = self.inner.state.lock();
            let room = state.level(i).used().saturating_add(free);
            let to = room.min(configured).max(state.level(i).budget());
            state.set_budget(i, to);
            if to >= configured {
                level.budget_lowered.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Before a write to level `i` whose budget a full device brought down: the budget
    /// goes back up with the device's room, at most once a second. After a successful
    /// write alone was not enough: a level brought down to what it held, nothing,
    /// admitted no write, so none succeeded and it cached nothing again for good
    /// (black-box finding: after a write through the mount filled the staging disk,
    /// the disk tier stored nothing though the disk was empty again).
    fn recheck_lowered_budget(&self, i: usize) {
        let level = &self.inner.levels[i];
        if !level.budget_lowered.load(Ordering::Relaxed) {
            return;
        }
        // 0: never checked.
        let now = self.now_ns().max(1);
        let last = level.budget_checked_at.load(Ordering::Relaxed);
        if (last != 0 && now.saturating_sub(last) < 1_000_000_000)
            || level
                .budget_checked_at
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.raise_lowered_budget(i);
    }

    /// After a successful write at level `i`: ends a degraded spell, and gives back
    /// budget a full device took, as far as the device has room now.
    fn note_write_ok(&self, i: usize) {
        let level = &self.inner.levels[i];
        self.raise_lowered_budget(i);
        if level.degraded.swap(false, Ordering::Relaxed) {
            level.degraded_until.store(0, Ordering::Relaxed);
            level.degraded_backoff_ns.store(0, Ordering::Relaxed);
            tracing::info!(tier = %level.tier.name(), "disk level recovered: writes resume");
        }
    }

    /// Frees about `bytes` of the disk levels kept on device `dev` (`st_dev`), the
    /// policy's victims first, for a write that cannot be made again (a file being
    /// written through a mount) that found that device full: blocks can be fetched
    /// again. The level's budget comes down to what it holds, as after its own ENOSPC,
    /// so the room is not taken back at once; it goes up again with the device's room
    /// ([`Self::note_write_ok`]). Returns the bytes freed.
    pub async fn shed_persistent(&self, dev: u64, bytes: u64) -> u64 {
        let mut freed = 0;
        for (i, level) in self.inner.levels.iter().enumerate() {
            if freed >= bytes
                || level.tier.kind() != TierKind::Disk
                || level.tier.device() != Some(dev)
            {
                continue;
            }
            let victims = {
                let mut state = self.inner.state.lock();
                let victims = state.shed(i, bytes - freed);
                let held = state.level(i).used() + state.level(i).reserved();
                self.lower_budget(&mut state, i, held);
                victims
            };
            for (victim, size) in victims {
                level.evictions.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = level.tier.remove(&victim).await {
                    tracing::warn!(tier = %level.tier.name(), key = %victim, error = %e, "evict failed");
                }
                freed += size;
            }
        }
        freed
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

    /// Fills `key` into the top level (and persistent levels when writing through).
    ///
    /// `persist` says how the write-through to persistent levels happens: `Inline` for
    /// explicit puts (acknowledged once on disk, so they survive a restart), `Background`
    /// for read-through fills (the reader must not wait for an fsync; a crash before the
    /// write only loses a cached copy).
    /// The order `fill` visits the levels in. An inline put written through reaches
    /// the persistent levels first: the block becomes visible when it is durable,
    /// once. Placed in memory first, it was seen there, evicted by other puts while its
    /// disk write ran, and seen again once that committed: present, absent, present for
    /// one put (black-box finding: a lookup that saw a block was followed by a load
    /// that missed it). Otherwise fastest first.
    fn fill_order(&self, persist: Persist) -> impl Iterator<Item = usize> + '_ {
        let n = self.inner.levels.len();
        let disk_first = persist == Persist::Inline && self.inner.write_through;
        let is_disk = move |i: &usize| self.inner.levels[*i].tier.kind() == TierKind::Disk;
        // No allocation: this runs for every fill.
        (0..n)
            .filter(move |i| !disk_first || is_disk(i))
            .chain((0..n).filter(move |i| disk_first && !is_disk(i)))
    }

    async fn fill(
        &self,
        key: &CacheKey,
        block: Block,
        ctx: &AccessContext,
        persist: Persist,
    ) -> Result<Fill> {
        let c = &self.inner.counters;
        c.fills.fetch_add(1, Ordering::Relaxed);
        c.fill_bytes.fetch_add(block.len(), Ordering::Relaxed);
        if ctx.is_prefetch() {
            c.prefetch_fills.fetch_add(1, Ordering::Relaxed);
            c.prefetch_bytes.fetch_add(block.len(), Ordering::Relaxed);
        }
        let mut stored = false;
        let mut last_err = None;
        // Why a persistent level that an inline put should reach does not hold the block.
        let mut not_durable: Option<CacheError> = None;
        let mut deferred = Vec::new();
        // A volatile level took the block (the fastest that admits it is filled).
        let mut stored_volatile = false;
        for i in self.fill_order(persist) {
            let persistent = self.inner.levels[i].tier.kind() == TierKind::Disk;
            if self.skip_persistent(i, key) {
                continue;
            }
            // Inline puts must reach every persistent level write-through reaches.
            let must_persist = persistent && persist == Persist::Inline && self.inner.write_through;
            if persistent && stored && !self.inner.write_through {
                continue;
            }
            // A read-through fill's copy goes behind the reader: one a volatile level
            // took already, and one of a file block (the store still holds it; see
            // `write_behind`) where a volatile level is there to take the reads (an
            // engine of disk levels alone writes in turn, as its caller expects).
            if persistent
                && persist == Persist::Background
                && (stored || (matches!(key, CacheKey::File(_)) && self.inner.has_volatile_level))
            {
                deferred.push(i);
                continue;
            }
            if !persistent && stored_volatile {
                continue;
            }
            if persistent && self.is_degraded(i) {
                self.inner
                    .counters
                    .degraded_skips
                    .fetch_add(1, Ordering::Relaxed);
                if must_persist {
                    not_durable.get_or_insert_with(|| self.degraded_refusal(i, key));
                }
                continue;
            }
            let kind = match persist {
                Persist::Inline => WriteKind::Durable,
                Persist::Background => WriteKind::of_copy(key),
            };
            match self.insert_at(i, key, block.clone(), ctx, kind, None).await {
                Ok(true) => {
                    stored = true;
                    stored_volatile |= !persistent;
                    if persistent {
                        self.note_write_ok(i);
                    }
                }
                Ok(false) => {
                    if must_persist {
                        not_durable.get_or_insert_with(|| {
                            CacheError::Full(format!(
                                "{} did not admit {key}",
                                self.inner.levels[i].tier.name()
                            ))
                        });
                    }
                }
                Err(e) => {
                    self.note_write_error(i, &e);
                    if must_persist {
                        not_durable = Some(e.duplicate());
                    }
                    last_err = Some(e);
                }
            }
        }
        // A file block's copy is written within the bound, and shed past it; a KV
        // block's copy is the only one outside memory, so it is always written.
        let mut pending = None;
        let mut shed = false;
        if !deferred.is_empty() && matches!(key, CacheKey::File(_)) {
            pending = self.take_behind(block.len());
            shed = pending.is_none();
            if shed {
                deferred.clear();
            }
        }
        let mut behind = None;
        if !deferred.is_empty() {
            let engine = self.clone();
            let (key, ctx) = (key.clone(), *ctx);
            behind = Some(tokio::spawn(async move {
                let _pending = pending;
                for i in deferred {
                    if engine.skip_persistent(i, &key) {
                        continue;
                    }
                    if engine.is_degraded(i) {
                        engine
                            .inner
                            .counters
                            .degraded_skips
                            .fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let kind = WriteKind::of_copy(&key);
                    match engine
                        .insert_at(i, &key, block.clone(), &ctx, kind, None)
                        .await
                    {
                        Ok(true) => {
                            engine.note_write_ok(i);
                            // Kept elsewhere meanwhile (its drop may have run before
                            // this write committed): one copy on disk, not two.
                            if engine.skip_persistent(i, &key) {
                                if let Err(e) = engine.drop_persistent(&key).await {
                                    tracing::debug!(%key, error = %e, "dropping a block kept elsewhere failed");
                                }
                            }
                        }
                        Ok(false) => {}
                        Err(e) => {
                            engine.note_write_error(i, &e);
                            tracing::debug!(%key, error = %e, "background write-through failed");
                        }
                    }
                }
            }));
        }
        match (stored, last_err) {
            (true, _) => Ok(Fill {
                not_durable,
                behind,
            }),
            // Its copy is on its way to a persistent level, or was shed: a copy a
            // slow disk cannot take is no error.
            (false, None) if behind.is_some() || shed => Ok(Fill {
                not_durable,
                behind,
            }),
            (false, Some(e)) => Err(e),
            (false, None) => {
                Err(not_durable
                    .unwrap_or_else(|| CacheError::Full(format!("no tier admitted {key}"))))
            }
        }
    }

    /// Copies a block found at level `from` into the top level; `read_at`: the
    /// removal number when it was read (a removal since cancels the copy).
    async fn promote(
        &self,
        from: usize,
        key: &CacheKey,
        block: Block,
        ctx: &AccessContext,
        read_at: u64,
    ) {
        if from == 0 {
            return;
        }
        let ctx = ctx.moved(AccessKind::Promotion);
        if let Ok(true) = self
            .insert_at(0, key, block, &ctx, WriteKind::of_copy(key), Some(read_at))
            .await
        {
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
        kind: WriteKind,
        read_at: Option<u64>,
    ) -> Result<bool> {
        let (stored, demotions) = self
            .place_one(start, key, block, ctx, kind, read_at)
            .await?;
        let moved = ctx.moved(AccessKind::Demotion);
        self.demote(demotions, &moved, true).await;
        Ok(stored)
    }

    /// Places the victims `demotions` pushed out of a level in the levels below, and
    /// the victims those push out in turn. With `behind`, a file block bound for a
    /// persistent level is written behind the caller within the bound (shed past it;
    /// see `write_behind`); the rest, and everything when not `behind`, in turn here.
    async fn demote(
        &self,
        mut demotions: Vec<(usize, CacheKey, Block, u64)>,
        moved: &AccessContext,
        behind: bool,
    ) {
        while let Some((i, victim, bytes, taken_at)) = demotions.pop() {
            if self.skip_persistent(i, &victim) {
                continue;
            }
            let persistent = self.inner.levels[i].tier.kind() == TierKind::Disk;
            if persistent && self.is_degraded(i) {
                // Only a cached copy is lost; the store (or the client) still has it.
                self.inner
                    .counters
                    .degraded_skips
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let kind = WriteKind::of_copy(&victim);
            if behind && persistent && kind == WriteKind::Refetchable {
                if let Some(pending) = self.take_behind(bytes.len()) {
                    let (engine, moved) = (self.clone(), *moved);
                    tokio::spawn(async move {
                        let _pending = pending;
                        let first = vec![(i, victim, bytes, taken_at)];
                        engine.demote_in_turn(first, moved).await;
                    });
                }
                continue;
            }
            match self
                .place_one(i, &victim, bytes, moved, kind, Some(taken_at))
                .await
            {
                Ok((_, more)) => demotions.extend(more),
                // A failed demotion only loses a cached copy; the store still has it.
                Err(e) => {
                    self.note_write_error(i, &e);
                    tracing::debug!(key = %victim, error = %e, "demotion failed");
                }
            }
        }
    }

    /// [`Self::demote`] in turn, boxed: it runs in the task a demotion written behind
    /// is spawned in (a future cannot hold its own type).
    fn demote_in_turn(
        &self,
        demotions: Vec<(usize, CacheKey, Block, u64)>,
        moved: AccessContext,
    ) -> BoxFuture<'static, ()> {
        let engine = self.clone();
        async move { engine.demote(demotions, &moved, false).await }.boxed()
    }

    /// Places one block at level `i`: reserves its bytes (evicting what the policy
    /// names), removes the victims, writes the block, and makes it a resident once its
    /// bytes have landed. Returns whether it was stored plus the victims to demote.
    /// `read_at`: for a copy, the removal number when its bytes were read; a removal
    /// of the key since cancels it (checked at the reservation and at the commit).
    /// Each victim to demote carries the removal number when it was taken.
    async fn place_one(
        &self,
        i: usize,
        key: &CacheKey,
        block: Block,
        ctx: &AccessContext,
        kind: WriteKind,
        read_at: Option<u64>,
    ) -> Result<(bool, Vec<(usize, CacheKey, Block, u64)>)> {
        let level = &self.inner.levels[i];
        self.recheck_lowered_budget(i);
        // What the level's budget charges: the tier's bytes for the block, not only its own.
        let size = level.tier.footprint(key, block.len());
        let removed = |state: &Hierarchy| read_at.is_some_and(|s| state.removed_since(key, s));
        let (placement, taken_at) = {
            let mut state = self.inner.state.lock();
            if removed(&state) {
                return Ok((false, Vec::new()));
            }
            (state.reserve(i, key, size, ctx), state.removal_seq())
        };
        let (admitted, evicted) = match placement {
            Ok(Placement::Admitted { evicted }) => (true, evicted),
            // Refused after evicting (only writes in flight left): the victims still go.
            Ok(Placement::Refused { evicted }) => (false, evicted),
            // Values are immutable: already stored. (Bytes the tier lost are forgotten
            // at the first lookup that misses them.)
            Ok(Placement::AlreadyResident) => return Ok((true, Vec::new())),
            Err(CacheError::TooLarge { .. }) => return Ok((false, Vec::new())),
            Err(e) => return Err(e),
        };
        // Charged until released: a caller cancelled mid-way (a client that hung up)
        // must not leave bytes charged forever.
        let mut write = Charge::new(&self.inner.state, i, if admitted { size } else { 0 });
        let mut demotions = Vec::new();
        for (victim, _) in evicted {
            level.evictions.fetch_add(1, Ordering::Relaxed);
            // Read the victim only if a lower level will take it: at the bottom the read
            // would only delay the removal that frees its bytes in the tier.
            let next = self.inner.state.lock().next_level_lacking(i, &victim);
            let bytes = match next {
                Some(_) => match level.tier.get(&victim).await {
                    Ok(TierGet::Hit(b)) => {
                        // The engine's own read, not a client's hit.
                        level.quiet_hits.fetch_add(1, Ordering::Relaxed);
                        Some(b)
                    }
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
                demotions.push((next, victim, b, taken_at));
            }
        }
        if !admitted {
            return Ok((false, demotions));
        }
        let put = match kind {
            WriteKind::Durable => level.tier.put(key, block).await,
            WriteKind::Refetchable => level.tier.put_refetchable(key, block).await,
        };
        match put {
            Ok(()) => {
                let committed = {
                    let mut state = self.inner.state.lock();
                    let go = !removed(&state);
                    if go {
                        write.bytes = 0; // the commit takes the reservation over
                        state.commit(i, key, size, ctx);
                    }
                    go
                };
                if committed {
                    return Ok((true, demotions));
                }
                // Removed while its bytes were written: they go again (the reservation
                // is released with `write`).
                drop(write);
                if let Err(e) = level.tier.remove(key).await {
                    tracing::warn!(tier = %level.tier.name(), %key, error = %e, "removing a cancelled copy failed");
                }
                Ok((false, demotions))
            }
            Err(e) => {
                drop(write);
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
