//! The replay simulator: drives the real cache-core code (the engine's synchronous
//! core, [`strata_cache_core::hierarchy::Hierarchy`]: the access tracker and one
//! [`strata_cache_core::space::TierSpace`] per tier, holding the policy under test) and
//! the daemon's [`strata_prefetch::AccessController`] (the one `FsCore` drives) with a
//! trace, in **simulated time**. So a replay result is a statement about the daemon:
//! the same classification, the same eviction decisions, the same prefetch orders.
//!
//! # Rules (the same for every policy)
//!
//! - **Jobs.** Each trace job replays its rows in order. A job starts at the `ts_ns` of
//!   its first row; it issues its next read `gap` after its previous read *completes*,
//!   where `gap` is the difference of the two rows' `ts_ns` in the trace (the think
//!   time: compute between reads). Jobs run concurrently and are processed in simulated
//!   time order (ties by job index), so the run is deterministic.
//! - **Blocks.** A read is split into cache blocks of `block_bytes` (default 1 MiB, the
//!   cache core's block size); a file smaller than a block is one block of its size and
//!   a KV entry (`kv/...`) is always one block of its whole size.
//! - **Hits.** A block counts as a hit only if it is resident *and its bytes have
//!   arrived* when the read is issued. A block still in flight (a prefetch, or another
//!   job's miss) is a miss for the hit ratios, but the read waits only for the rest of
//!   that transfer. `hit_ratio` = hit block accesses / block accesses;
//!   `byte_hit_ratio` = bytes of reads served from arrived blocks / bytes read.
//! - **Store model.** Every block fetch (demand miss or prefetch) is one GET costing
//!   `get_latency` (default 20 ms, a typical S3 first-byte latency) and then its bytes
//!   over one link of `bandwidth` (default 200 MB/s) **shared equally by all transfers
//!   in progress** (processor sharing, as concurrent TCP connections to one store share
//!   a bottleneck): with `n` transfers active each gets `bandwidth / n`. Latencies
//!   overlap (GETs are concurrent). A read completes when its last block has arrived.
//!   Simulated with virtual time (each active transfer has received `v` bytes;
//!   `dv/dt = bandwidth / n`), so each event costs O(log transfers).
//! - **Classification.** Every demand block access is observed by the tracker once,
//!   before the policy sees it (`Hierarchy::observe`), as in the engine.
//! - **Admission.** A miss calls `Hierarchy::place` at the top tier (the policy may
//!   refuse it: then the bytes are fetched but not cached). Space is reserved at issue,
//!   as a real cache allocates the buffer it fetches into.
//! - **Tiers** (`ReplayConfig::lower`, `--lower disk=60%`): as in the engine, the top
//!   tier's victims whose bytes arrived are demoted to the next tier lacking them,
//!   fills are written through to persistent (disk) tiers, and a block found only in a
//!   lower tier is a hit read over that tier's device (its own latency and shared
//!   bandwidth, [`LevelModel`]) and promoted to the top. `level_hits` counts hits per
//!   tier. Without lower tiers the cache is one tier, as before.
//! - **Prefetch** is decided by the access controller exactly as in the mount: the
//!   replay only plays the mount's part. When a job first reads a file of a directory
//!   the controller has not seen, it gets that directory's listing (what the mount
//!   answers the loader's `readdir` with; KV paths have none). On each demand read the
//!   replay reports the prefetched blocks it touches (`demand`: `Used`), then passes the
//!   [`AccessEvent`] (its `pattern` from the tracker, as `CacheEngine::pattern_of`) to
//!   `on_access` and issues the orders it returns, in their priority order: each block
//!   that is cached in no tier and that the controller admits (`issue`: not outstanding, and
//!   the prefetch backlog, `prefetch_max_backlog` worth of transfer = 20 MB by default,
//!   the controller's default too, not full) is placed with `ctx.prefetch = true` and
//!   fetched over the same link; its arrival is reported (`landed`), its eviction while
//!   unread too (`evicted`: `Wasted`). Demand fetches are never dropped. Orders for
//!   paths the trace never mentions are ignored (the object does not exist).
//!   `prefetch_precision` = prefetched bytes later read / prefetched bytes.
//! - **Belady (`opt`).** Gets the position of the next access to the same block in the
//!   trace's time order (precomputed once). With several concurrent jobs the simulated
//!   order can differ slightly from the trace's, so `opt` is then a (very) good policy,
//!   not a proven bound; for one job it is exact MIN.
//!
//! # Cost
//!
//! The trace is compiled once ([`Prepared`]): paths interned, every read's blocks as
//! dense ids with their `CacheKey`s built once, so a replay step does no allocation
//! except what the policy and `TierSpace` do themselves.

mod policies;
pub mod report;

pub use policies::{
    diag_policy_set, make_policy, pattern_aware_config, shared_pattern_aware, strata_policy_set,
    DiagTarget, Listings, PolicySet, SharedPatternAware, POLICY_NAMES,
};

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use strata_cache_core::granularity::{Granularity, UnitsHeld};
use strata_cache_core::hierarchy::Hierarchy;
use strata_cache_core::link_share::LinkShare;
use strata_cache_core::policy::{self, NextUse};
use strata_cache_core::scheduler::{Class, CourseWatch, StoreScheduler};
use strata_cache_core::space::{Placement, TierSpace};
use strata_cache_core::stream::FxBuild;
use strata_cache_core::{AccessContext, AccessKind, CacheKey, JobId, Pattern, DEFAULT_BLOCK_SIZE};
use strata_prefetch::{
    AccessController, AccessEvent, Admission, ControllerConfig, Origin, PrefetchOrder,
};

use crate::trace::{blocks_of, is_kv, Trace};

/// The object store as the replay models it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StoreModel {
    /// Time to first byte of one GET.
    pub get_latency_ns: u64,
    /// Bytes per second of the link all fetches share.
    pub bandwidth_bytes_per_s: f64,
    /// The access controller's prefetch backlog bound, as transfer time at full
    /// bandwidth: prefetch bytes issued and not landed at most (more are dropped).
    pub prefetch_max_backlog_ns: u64,
}

impl StoreModel {
    /// Refuses a trace whose replay could run the simulated clock (u64 ns) past 2^63:
    /// the latest `ts_ns` plus every block access fetched from the store, one after
    /// another. A single KV read of 2^63 bytes took longer than the clock holds, and the
    /// replay spun forever on a wrapped event time.
    pub fn check_clock(&self, trace: &Trace, block_bytes: u64) -> Result<(), String> {
        let bb = block_bytes.max(1) as f64;
        let per_ns = self.bandwidth_bytes_per_s / 1e9;
        let latency = self.get_latency_ns as f64;
        let mut worst = trace.records.iter().map(|r| r.ts_ns).max().unwrap_or(0) as f64;
        for r in &trace.records {
            let bytes = if is_kv(trace.path_name(r)) {
                r.size as f64
            } else {
                // Whole blocks: an upper bound of what the read fetches.
                ((r.offset + r.len - 1) / block_bytes.max(1) - r.offset / block_bytes.max(1) + 1)
                    as f64
                    * bb
            };
            worst += latency + bytes / per_ns;
        }
        const LIMIT_NS: f64 = 9.2e18; // just under 2^63 ns (~292 years)
        if !worst.is_finite() || worst >= LIMIT_NS {
            return Err(format!(
                "fetching the trace's reads at {} MB/s could take {:.3e} s of simulated time, \
                 beyond the replay clock's ~292 years (a read or size in the trace is absurd, \
                 or --bandwidth-mbps too low)",
                self.bandwidth_bytes_per_s / 1e6,
                worst / 1e9
            ));
        }
        Ok(())
    }
}

impl Default for StoreModel {
    fn default() -> Self {
        StoreModel {
            // 20 ms: S3 GET first-byte latency from EC2, the issue's stated model.
            get_latency_ns: 20_000_000,
            // 200 MB/s: one client's sustained S3 throughput, the issue's stated model.
            bandwidth_bytes_per_s: 200e6,
            // 100 ms of transfers (20 MB at 200 MB/s): the access controller's default
            // bound (`ControllerConfig::max_backlog_bytes`), so the replay measures the
            // daemon's setting.
            prefetch_max_backlog_ns: 100_000_000,
        }
    }
}

/// Replay parameters other than the policy.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// Bytes of the top level (the fastest tier, where fills land).
    pub capacity_bytes: u64,
    pub block_bytes: u64,
    pub store: StoreModel,
    /// Tiers below the top one, fastest first (none: the cache is one tier). They work
    /// as in the daemon's engine: the top level's victims are demoted to the next level
    /// lacking them, a lower-level hit is read over that device and promoted to the
    /// top, and fills are written through to persistent levels.
    pub lower: Vec<LevelModel>,
}

impl ReplayConfig {
    pub fn new(capacity_bytes: u64) -> Self {
        ReplayConfig {
            capacity_bytes,
            block_bytes: DEFAULT_BLOCK_SIZE,
            store: StoreModel::default(),
            lower: Vec::new(),
        }
    }
}

/// A tier below the top one, as the replay models it.
#[derive(Clone, Debug, PartialEq)]
pub struct LevelModel {
    /// `memory` or `disk` (persistent: fills are written through to it).
    pub kind: String,
    pub capacity_bytes: u64,
    /// Time to the first byte of a read from this tier.
    pub latency_ns: u64,
    /// Read bandwidth, shared by the concurrent reads of this tier.
    pub bandwidth_bytes_per_s: f64,
}

impl LevelModel {
    /// A tier of `kind` with its default device model: `memory` 1 µs and 10 GB/s (a
    /// copy out of host memory), `disk` 80 µs and 2 GB/s (a 4 KiB-aligned read from one
    /// NVMe SSD, as `strata bench tiers` measures the disk tier's O_DIRECT path).
    pub fn new(kind: &str, capacity_bytes: u64) -> anyhow::Result<Self> {
        let (latency_ns, bandwidth_bytes_per_s) = match kind {
            "memory" => (1_000, 10e9),
            "disk" => (80_000, 2e9),
            other => anyhow::bail!("unknown tier kind `{other}` (memory or disk)"),
        };
        Ok(LevelModel {
            kind: kind.to_string(),
            capacity_bytes,
            latency_ns,
            bandwidth_bytes_per_s,
        })
    }

    fn persistent(&self) -> bool {
        self.kind == "disk"
    }
}

/// What one policy achieved on one trace.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PolicyResult {
    pub policy: String,
    pub hit_ratio: f64,
    pub byte_hit_ratio: f64,
    pub prefetch_bytes: u64,
    pub prefetch_precision: f64,
    /// Mean simulated job completion time (s).
    pub jct_s: f64,
    /// Mean and 99th percentile of read latency (issue to completion), ms.
    pub mean_read_latency_ms: f64,
    pub p99_read_latency_ms: f64,
    pub job_jct_s: BTreeMap<String, f64>,
    /// Per job: the time its reads spent waiting (issue to completion, summed), s. A
    /// job's JCT is this plus its think time, so a tenant's JCT that moves without its
    /// misses moving shows up here (what it waits on, not how often it misses).
    pub job_read_wait_s: BTreeMap<String, f64>,
    /// Block accesses replayed.
    pub accesses: u64,
    /// Sum of job completion times (s).
    pub total_jct_s: f64,
    /// Block accesses served by each tier, top first (only with lower tiers).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub level_hits: Vec<u64>,
}

/// A trace compiled for replay; shared by the runs of every policy.
pub struct Prepared {
    trace: Trace,
    block_bytes: u64,
    path_index: HashMap<Arc<str>, u32, FxBuild>,
    keys: Vec<CacheKey>,
    sizes: Vec<u64>,
    /// Block id by key, through the key's content hash (a one-word map, so an eviction's
    /// lookup stays in the CPU cache on large traces); keys whose hash collides with an
    /// earlier key's live in `key_ids_spill`.
    key_ids: HashMap<u64, u32, FxBuild>,
    key_ids_spill: HashMap<CacheKey, u32, FxBuild>,
    /// Per path: whether it names a KV entry (`kv/...`), computed once.
    path_kv: Vec<bool>,
    block_ids: HashMap<(u32, u64), u32, FxBuild>,
    /// Per record: its range in `acc`.
    rec_acc: Vec<(u32, u32)>,
    /// Flat block accesses in trace order.
    acc: Vec<u32>,
    /// Per flat access: position of the next access to the same block (u64::MAX: none).
    next_use: Vec<u64>,
    /// Per job: its record indices in time order.
    job_recs: Vec<Vec<u32>>,
    unique_bytes: u64,
    listings: Listings,
    /// Per path: its directory's index in `listings` (`NONE` for KV entries).
    path_dir: Vec<u32>,
}

/// The version tag of every replayed object (traces have one version per path).
const VERSION: &str = "v0";

fn kv_key(path: &str) -> CacheKey {
    let rest = &path[3..];
    let (ns, hash) = rest.rsplit_once('/').unwrap_or(("", rest));
    let bytes = hex_decode(hash).unwrap_or_else(|| hash.as_bytes().to_vec());
    CacheKey::kv(ns, bytes)
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.is_empty() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Prepared {
    pub fn new(mut trace: Trace, block_bytes: u64) -> Self {
        trace.sort_by_time();
        let version: Arc<str> = Arc::from(VERSION);
        let mut p = Prepared {
            path_index: trace
                .paths
                .iter()
                .enumerate()
                .map(|(i, p)| (p.clone(), i as u32))
                .collect(),
            block_bytes,
            keys: Vec::new(),
            sizes: Vec::new(),
            key_ids: HashMap::default(),
            key_ids_spill: HashMap::default(),
            path_kv: trace.paths.iter().map(|p| is_kv(p)).collect(),
            block_ids: HashMap::default(),
            rec_acc: Vec::with_capacity(trace.records.len()),
            acc: Vec::with_capacity(trace.records.len()),
            next_use: Vec::new(),
            job_recs: vec![Vec::new(); trace.jobs.len()],
            unique_bytes: 0,
            listings: Vec::new(),
            path_dir: Vec::new(),
            trace: Trace::default(),
        };
        for (ri, r) in trace.records.iter().enumerate() {
            let path = &trace.paths[r.path as usize];
            let start = p.acc.len() as u32;
            for (idx, bytes) in blocks_of(path, r.offset, r.len, r.size, block_bytes) {
                let id = *p.block_ids.entry((r.path, idx)).or_insert_with(|| {
                    let key = if is_kv(path) {
                        kv_key(path)
                    } else {
                        CacheKey::file(path.clone(), version.clone(), idx)
                    };
                    let id = p.keys.len() as u32;
                    if let Some(&other) = p.key_ids.get(&key.content_hash()) {
                        if p.keys[other as usize] != key {
                            p.key_ids_spill.insert(key.clone(), id);
                        }
                    } else {
                        p.key_ids.insert(key.content_hash(), id);
                    }
                    p.keys.push(key);
                    p.sizes.push(bytes);
                    p.unique_bytes += bytes;
                    id
                });
                p.acc.push(id);
            }
            p.rec_acc.push((start, p.acc.len() as u32));
            p.job_recs[r.job as usize].push(ri as u32);
        }
        let mut last = vec![u64::MAX; p.keys.len()];
        p.next_use = vec![u64::MAX; p.acc.len()];
        for (pos, &b) in p.acc.iter().enumerate().rev() {
            p.next_use[pos] = last[b as usize];
            last[b as usize] = pos as u64;
        }
        let mut dirs: BTreeMap<&str, Vec<(String, u64)>> = BTreeMap::new();
        for (path, &size) in trace.paths.iter().zip(&trace.sizes) {
            if !is_kv(path) {
                let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
                dirs.entry(dir).or_default().push((name.to_string(), size));
            }
        }
        let dir_index: HashMap<&str, u32> = dirs
            .keys()
            .enumerate()
            .map(|(i, d)| (*d, i as u32))
            .collect();
        p.path_dir = trace
            .paths
            .iter()
            .map(|path| {
                if is_kv(path) {
                    return NONE;
                }
                let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
                dir_index[dir]
            })
            .collect();
        p.listings = dirs
            .into_iter()
            .map(|(d, mut v)| {
                v.sort();
                (d.to_string(), v)
            })
            .collect();
        p.trace = trace;
        p
    }

    /// The dataset's directory listings (every non-KV path of the trace, by directory).
    pub fn listings(&self) -> &Listings {
        &self.listings
    }

    pub fn trace(&self) -> &Trace {
        &self.trace
    }
    /// Bytes of the distinct blocks the trace reads.
    pub fn unique_bytes(&self) -> u64 {
        self.unique_bytes
    }
    pub fn block_accesses(&self) -> usize {
        self.acc.len()
    }
}

const NONE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct BlockState {
    resident: bool,
    /// Its bytes have arrived (a resident block that has not is in flight).
    arrived: bool,
    /// Prefetched and not read yet (outstanding in the controller's ledger).
    prefetched: bool,
    /// The transfer bringing it in, while in flight.
    transfer: u32,
    /// Which link `transfer` is on: 0 the store, `l` the device of lower level `l`.
    via: u8,
    /// Lower levels holding it: bit `l - 1` for level `l` (`resident` is the top).
    lower: u8,
    /// A prefetch of it waits in the store scheduler's queue (issued to the
    /// controller, not placed, no transfer yet).
    queued: bool,
}

const EMPTY: BlockState = BlockState {
    resident: false,
    arrived: false,
    prefetched: false,
    transfer: NONE,
    via: 0,
    lower: 0,
    queued: false,
};

/// `f64` with a total order, for the heap of finish times.
#[derive(Clone, Copy, PartialEq)]
struct Vf(f64);
impl Eq for Vf {}
impl PartialOrd for Vf {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Vf {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

struct Transfer {
    /// The block it fills (`NONE`: fetched but not admitted).
    block: u32,
    bytes: u64,
    /// A demand fetch (else a prefetch).
    demand: bool,
    /// Its class in the store scheduler (store link only).
    class: Class,
    /// Jobs whose current read waits for it.
    waiters: Vec<u32>,
}

/// Class index of demand transfers in [`Link`]'s per-class state (prefetch is 1).
const DEMAND: usize = 0;

/// The store link in virtual time: demand and prefetch transfers are two classes
/// whose shares of the bandwidth [`LinkShare`] decides (demand first, prefetch capped
/// while demand waits, work-conserving); within a class every transfer gets an equal
/// share (processor sharing).
struct Link {
    latency_ns: u64,
    bytes_per_ns: f64,
    share: LinkShare,
    /// Per class: bytes each of its active transfers has received since the class was
    /// last idle (virtual time).
    v: [f64; 2],
    /// Real time `v` is current at.
    at: u64,
    /// Per class: active transfers by their finish mark in that class's `v`.
    active: [BinaryHeap<Reverse<(Vf, u32)>>; 2],
    /// Transfers in their latency phase: (start of bytes, id), in start order.
    waiting: VecDeque<(u64, u32)>,
    transfers: Vec<Transfer>,
    free: Vec<u32>,
    /// Demand transfers in their latency phase: their bytes...
    demand_waiting: u64,
    /// ...and the sum of the active ones' finish marks, so the demand bytes still owed
    /// are `demand_finish - active[DEMAND].len() * v[DEMAND] + waiting`.
    demand_finish: f64,
}

impl Link {
    fn new(model: &StoreModel) -> Self {
        let bytes_per_ns = model.bandwidth_bytes_per_s / 1e9;
        Link {
            latency_ns: model.get_latency_ns,
            bytes_per_ns,
            // The daemon's default split (demand first, prefetch at most 20% while
            // demand waits): issue 13 item 4.
            share: LinkShare::default(),
            v: [0.0; 2],
            at: 0,
            active: [BinaryHeap::new(), BinaryHeap::new()],
            waiting: VecDeque::new(),
            transfers: Vec::new(),
            free: Vec::new(),
            demand_waiting: 0,
            demand_finish: 0.0,
        }
    }

    /// Starts a GET of `bytes` for `block` at `now` (on `demand`, else a prefetch);
    /// returns its id.
    fn fetch(&mut self, now: u64, bytes: u64, block: u32, class: Class) -> u32 {
        let demand = class == Class::Demand;
        if demand {
            self.demand_waiting += bytes;
        }
        let t = Transfer {
            block,
            bytes,
            demand,
            class,
            waiters: Vec::new(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.transfers[id as usize] = t;
                id
            }
            None => {
                self.transfers.push(t);
                (self.transfers.len() - 1) as u32
            }
        };
        self.waiting
            .push_back((now.saturating_add(self.latency_ns), id));
        id
    }

    /// Demand bytes the link still owes (in flight or waiting for their first byte).
    fn demand_owed(&self) -> u64 {
        let n = self.active[DEMAND].len() as f64;
        let active = self.demand_finish - n * self.v[DEMAND];
        (active.max(0.0) + self.demand_waiting as f64) as u64
    }

    /// Bytes per ns each active transfer of each class receives now.
    fn rates(&self) -> [f64; 2] {
        let n = [self.active[0].len(), self.active[1].len()];
        let (d, p) = self.share.shares(n[0], n[1]);
        let per = |s: f64, k: usize| {
            if k == 0 {
                0.0
            } else {
                s * self.bytes_per_ns / k as f64
            }
        };
        [per(d, n[0]), per(p, n[1])]
    }

    fn advance(&mut self, to: u64) {
        if to > self.at {
            let dt = (to - self.at) as f64;
            let r = self.rates();
            for (v, r) in self.v.iter_mut().zip(r) {
                *v += dt * r;
            }
        }
        self.at = self.at.max(to);
    }

    /// Time of the next start or completion (`u64::MAX`: none).
    fn next_event(&self) -> u64 {
        let start = self.waiting.front().map_or(u64::MAX, |w| w.0);
        let r = self.rates();
        let mut next = start;
        for ((active, v), r) in self.active.iter().zip(self.v).zip(r) {
            if let Some(Reverse((f, _))) = active.peek() {
                if r > 0.0 {
                    let dt = (f.0 - v).max(0.0) / r;
                    next = next.min(self.at.saturating_add(dt.ceil() as u64));
                }
            }
        }
        next
    }

    /// Processes the link's events at `now` (= `next_event()`); appends finished ids.
    fn step(&mut self, now: u64, finished: &mut Vec<u32>) {
        self.advance(now);
        // Completions first (the rates changed at `now`), then starts.
        for c in 0..2 {
            while let Some(&Reverse((f, id))) = self.active[c].peek() {
                // Half a byte of slack absorbs the rounding of `next_event`.
                if f.0 > self.v[c] + 0.5 {
                    break;
                }
                self.active[c].pop();
                if c == DEMAND {
                    self.demand_finish -= f.0;
                }
                finished.push(id);
            }
            if self.active[c].is_empty() {
                // Re-anchor to keep `v` small and exact.
                self.v[c] = 0.0;
                if c == DEMAND {
                    self.demand_finish = 0.0;
                }
            }
        }
        while let Some(&(start, id)) = self.waiting.front() {
            if start > now {
                break;
            }
            self.waiting.pop_front();
            let t = &self.transfers[id as usize];
            let c = usize::from(!t.demand);
            let f = self.v[c] + t.bytes as f64;
            if t.demand {
                self.demand_waiting -= t.bytes;
                self.demand_finish += f;
            }
            self.active[c].push(Reverse((Vf(f), id)));
        }
    }
}

/// One replay run's mutable state.
struct Run<'a> {
    p: &'a Prepared,
    /// The engine's synchronous core: the access tracker and the levels under test.
    cache: Hierarchy,
    /// Per lower level (index `l - 1`): its device link and whether fills are written
    /// through to it.
    devices: Vec<Link>,
    persistent: Vec<bool>,
    level_hits: Vec<u64>,
    controller: Option<AccessController<u32>>,
    /// Per directory (index in `Prepared::listings`): its listing was handed over.
    listed: Vec<bool>,
    next_use: Option<NextUse>,
    /// Next-use position per flat access, for `next_use`.
    hints: &'a [u64],
    /// Flat access positions in the order replayed (recorded for `opt` only).
    order: Vec<u32>,
    state: Vec<BlockState>,
    extra_keys: Vec<CacheKey>,
    extra_sizes: Vec<u64>,
    extra_ids: HashMap<(u32, u64), u32, FxBuild>,
    extra_key_ids: HashMap<CacheKey, u32, FxBuild>,
    link: Link,
    /// The daemon's store scheduler: demand first, prefetch within its share of the
    /// link's requests, queued prefetch cancelled when its stream changes course.
    sched: StoreScheduler<u32, (u32, u32)>,
    /// Per queued prefetch (block id): its job and class.
    queued_info: HashMap<u32, (JobId, Class), FxBuild>,
    /// Per stream (job, path): its pattern and position, to see it change course.
    course: CourseWatch<(u32, u32)>,
    starts: Vec<u32>,
    /// Fetch and cache units of demand misses (whole blocks for the baselines).
    granularity: Granularity,
    /// Bytes all levels hold together: what `granularity` weighs a file against.
    cache_bytes: u64,
    /// Ids of sub-block units: (path, unit, index) -> id (in the extra ids).
    unit_ids: HashMap<(u32, u64, u64), u32, FxBuild>,
    /// Per (file, block): the power-of-two unit sizes any id of `unit_ids` was made for
    /// in it, bit `log2(unit)`. A miss asks for every unit size of its block; a size
    /// never made there is answered without probing `unit_ids` (replay speed).
    unit_sizes_made: HashMap<(u32, u64), u64, FxBuild>,
    /// Per unit id: its file and block; per (file, block): units of it cached.
    unit_block: HashMap<u32, (u32, u64), FxBuild>,
    block_units: HashMap<(u32, u64), u32, FxBuild>,
    orders: Vec<PrefetchOrder>,
    /// Per job: blocks its current read still waits for.
    pending: Vec<u32>,
    /// Per job: next record (index into its `job_recs`).
    cursor: Vec<usize>,
    end: Vec<u64>,
    /// Per job: when its current read was issued.
    issued_at: Vec<u64>,
    /// Latency of every completed read, ns.
    latencies: Vec<u64>,
    /// Per job: the sum of its reads' latencies, ns.
    job_wait_ns: Vec<u64>,
    /// Jobs' next issue times.
    issues: BinaryHeap<Reverse<(u64, u32)>>,
    finished: Vec<u32>,
    accesses: u64,
    hits: u64,
    bytes_read: u64,
    bytes_hit: u64,
    prefetch_bytes: u64,
    prefetch_used: u64,
}

impl Run<'_> {
    fn key(&self, id: u32) -> &CacheKey {
        let n = self.p.keys.len();
        if (id as usize) < n {
            &self.p.keys[id as usize]
        } else {
            &self.extra_keys[id as usize - n]
        }
    }
    fn id_of_key(&self, key: &CacheKey) -> Option<u32> {
        self.p
            .key_ids
            .get(&key.content_hash())
            .filter(|&&id| self.p.keys[id as usize] == *key)
            .or_else(|| self.p.key_ids_spill.get(key))
            .or_else(|| self.extra_key_ids.get(key))
            .copied()
    }

    // The replay's only calls into the engine's synchronous core (`Hierarchy`, one
    // level): observe (in `read`), touch, place and the tracker's pattern.

    /// A demand hit on resident block `id`.
    fn touch(&mut self, id: u32, ctx: &AccessContext) {
        let n = self.p.keys.len();
        let key = match self.p.keys.get(id as usize) {
            Some(k) => k,
            None => &self.extra_keys[id as usize - n],
        };
        self.cache.touch(0, key, ctx);
    }

    /// Fills block `id` (`bytes`) into the top level for `ctx`, as the engine's fill:
    /// true if the policy took it; victims are demoted or leave; the fill is written
    /// through to persistent lower levels.
    fn place(&mut self, id: u32, bytes: u64, ctx: &AccessContext) -> bool {
        let admitted = self.place_at(0, id, bytes, ctx);
        for l in 1..=self.devices.len() {
            if self.persistent[l - 1] && self.state[id as usize].lower & (1 << (l - 1)) == 0 {
                self.place_at(l, id, bytes, ctx);
            }
        }
        admitted
    }

    /// Places block `id` at `level`; true if admitted there (a lower level also counts
    /// a block it already holds).
    fn place_at(&mut self, level: usize, id: u32, bytes: u64, ctx: &AccessContext) -> bool {
        let key = self.key(id).clone();
        let (admitted, evicted) = match self.cache.place(level, &key, bytes, ctx) {
            Ok(Placement::Admitted { evicted }) => (true, evicted),
            // Refused after evicting (only writes in flight were left): victims leave.
            Ok(Placement::Refused { evicted }) => (false, evicted),
            Ok(Placement::AlreadyResident) => (level > 0, Vec::new()),
            Err(_) => (false, Vec::new()),
        };
        if admitted && level > 0 {
            self.state[id as usize].lower |= 1 << (level - 1);
        }
        self.evicted(level, evicted, ctx);
        admitted
    }

    /// The stream pattern of an access to block `id`, as the cache core classifies it.
    fn pattern(&self, id: u32, ctx: &AccessContext) -> Pattern {
        self.cache.tracker().pattern_of(self.key(id), ctx)
    }

    /// Victims of `level`: demoted to the next level lacking them (a top-level victim
    /// only once its bytes arrived), else gone; a prefetched block gone from every
    /// level unread is reported wasted.
    fn evicted(&mut self, level: usize, evicted: Vec<(CacheKey, u64)>, ctx: &AccessContext) {
        for (k, bytes) in evicted {
            let Some(id) = self.id_of_key(&k) else {
                continue;
            };
            let st = &mut self.state[id as usize];
            let landed = if level == 0 {
                // A block still on its way from the store goes down too: in the daemon
                // it lands in the cache when its GET ends, evicting something else
                // then (black-box finding: with a lower memory tier, a readahead window
                // deeper than the top tier lost every prefetched block). Reads of it
                // wait for the GET meanwhile (the single-flight check in `read`).
                let landed = st.arrived || (st.transfer != NONE && st.via == 0);
                st.resident = false;
                st.arrived = false;
                if let Some(b) = self.unit_block.get(&id) {
                    if let Some(n) = self.block_units.get_mut(b) {
                        *n = n.saturating_sub(1);
                    }
                }
                landed
            } else {
                st.lower &= !(1 << (level - 1));
                true
            };
            if landed {
                if let Some(next) = self.cache.next_level_lacking(level, &k) {
                    let moved = ctx.moved(AccessKind::Demotion);
                    self.place_at(next, id, bytes, &moved);
                }
            }
            let st = &mut self.state[id as usize];
            if st.prefetched && !st.resident && st.lower == 0 {
                st.prefetched = false;
                if let Some(c) = &mut self.controller {
                    c.evicted(&id);
                }
            }
        }
    }

    /// The current read of job `j` completed at `now`: schedule its next one.
    fn complete(&mut self, j: u32, now: u64) {
        let ju = j as usize;
        let recs = &self.p.trace.records;
        let ri = self.p.job_recs[ju][self.cursor[ju]] as usize;
        self.cursor[ju] += 1;
        let latency = now - self.issued_at[ju];
        self.latencies.push(latency);
        self.job_wait_ns[ju] += latency;
        match self.p.job_recs[ju].get(self.cursor[ju]) {
            Some(&next) => {
                let gap = recs[next as usize].ts_ns.saturating_sub(recs[ri].ts_ns);
                self.issues.push(Reverse((now + gap, j)));
            }
            None => self.end[ju] = now,
        }
    }

    /// The store link (`via` 0) or the device of lower level `via`.
    fn link_mut(&mut self, via: u8) -> &mut Link {
        match via {
            0 => &mut self.link,
            l => &mut self.devices[l as usize - 1],
        }
    }

    /// Transfers of link `via` finished at `now`: blocks arrive, waiting reads may
    /// complete.
    fn arrived(&mut self, now: u64, via: u8) {
        let mut finished = std::mem::take(&mut self.finished);
        for &tid in &finished {
            let t = &mut self.link_mut(via).transfers[tid as usize];
            let waiters = std::mem::take(&mut t.waiters);
            let b = t.block;
            if b != NONE
                && self.state[b as usize].transfer == tid
                && self.state[b as usize].via == via
            {
                let st = &mut self.state[b as usize];
                st.transfer = NONE;
                st.arrived = st.resident;
                if st.prefetched {
                    if let Some(c) = &mut self.controller {
                        c.landed(&b);
                    }
                }
            }
            for &j in &waiters {
                self.pending[j as usize] -= 1;
                if self.pending[j as usize] == 0 {
                    self.complete(j, now);
                }
            }
            // Give the (empty) buffer back so the next transfer reuses it.
            let mut w = waiters;
            w.clear();
            let link = self.link_mut(via);
            link.transfers[tid as usize].waiters = w;
            link.free.push(tid);
            if via == 0 {
                let class = self.link.transfers[tid as usize].class;
                let mut starts = std::mem::take(&mut self.starts);
                self.sched.finished(class, &mut starts);
                self.start_queued(now, starts);
            }
        }
        finished.clear();
        self.finished = finished;
    }

    /// Starts the queued prefetches the scheduler released (`starts`, in order); one
    /// no longer needed (cached meanwhile) ends at once and may release more.
    fn start_queued(&mut self, now: u64, mut starts: Vec<u32>) {
        let mut i = 0;
        while i < starts.len() {
            let id = starts[i];
            i += 1;
            let Some((job, class)) = self.queued_info.remove(&id) else {
                continue;
            };
            self.state[id as usize].queued = false;
            if !self.start_prefetch(id, job, class, now) {
                if let Some(c) = &mut self.controller {
                    c.failed(&id);
                }
                self.sched.finished(class, &mut starts);
            }
        }
        starts.clear();
        self.starts = starts;
    }

    /// Places prefetched block `id` for `job` and starts its transfer; false if it is
    /// cached already or the policy refused it (no prefetch made).
    fn start_prefetch(&mut self, id: u32, job: JobId, class: Class, now: u64) -> bool {
        let st = self.state[id as usize];
        if st.resident || st.lower != 0 {
            return false;
        }
        let bytes = self.block_size(id);
        let admitted = self.place(id, bytes, &AccessContext::prefetch(job, now));
        // Refused at the top but written through to a persistent lower level: a
        // prefetch all the same, fetched into that level (black-box finding: the block
        // sat in the disk tier with no GET and no prefetch counted, so a top tier
        // smaller than a block showed hits from 0 bytes prefetched).
        if !admitted && self.state[id as usize].lower == 0 {
            return false;
        }
        let tid = self.link.fetch(now, bytes, id, class);
        self.prefetch_bytes += bytes;
        self.state[id as usize] = BlockState {
            resident: admitted,
            arrived: false,
            prefetched: true,
            transfer: tid,
            via: 0,
            ..self.state[id as usize]
        };
        true
    }

    /// The id and size of unit `idx` of `unit` bytes of file `path` (`size` bytes),
    /// made on first use.
    fn unit_id(&mut self, path: u32, unit: u64, idx: u64, size: u64) -> (u32, u64) {
        if let Some(&id) = self.unit_ids.get(&(path, unit, idx)) {
            return (id, self.block_size(id));
        }
        let bytes = unit.min(size.saturating_sub(idx * unit)).max(1);
        let key = CacheKey::file_block(
            self.p.trace.paths[path as usize].clone(),
            VERSION,
            unit,
            idx,
        );
        let id = (self.p.keys.len() + self.extra_keys.len()) as u32;
        self.unit_ids.insert((path, unit, idx), id);
        let block = idx * unit / self.p.block_bytes;
        *self.unit_sizes_made.entry((path, block)).or_default() |= size_bit(unit);
        self.unit_block.insert(id, (path, block));
        self.extra_key_ids.insert(key.clone(), id);
        self.extra_keys.push(key);
        self.extra_sizes.push(bytes);
        self.state.push(EMPTY);
        (id, bytes)
    }

    fn block_size(&self, id: u32) -> u64 {
        let n = self.p.sizes.len();
        if (id as usize) < n {
            self.p.sizes[id as usize]
        } else {
            self.extra_sizes[id as usize - n]
        }
    }

    /// A demand read of a prefetched block: the prefetch was used, and the controller
    /// hears of the demand.
    fn prefetch_demanded(&mut self, id: u32, bytes: u64) {
        self.state[id as usize].prefetched = false;
        self.prefetch_used += bytes;
        if let Some(c) = &mut self.controller {
            c.demand(&id);
        }
    }

    /// Replays read `ri` of job `j`, issued at `now`.
    fn read(&mut self, ri: usize, j: u32, now: u64) {
        let job = JobId(u64::from(j));
        let r = self.p.trace.records[ri];
        let (a0, a1) = self.p.rec_acc[ri];
        let bb = self.p.block_bytes;
        let kv = self.p.path_kv[r.path as usize];
        let ctx = AccessContext::demand(job, now).with_read(r.offset, r.len);
        self.issued_at[j as usize] = now;
        let mut wait = 0u32;
        for pos in a0..a1 {
            let id = self.p.acc[pos as usize];
            if let Some(h) = &self.next_use {
                h.set(self.hints[pos as usize]);
                self.order.push(pos);
            }
            let bytes = self.p.sizes[id as usize];
            // Bytes of this read inside this block.
            let overlap = if kv {
                r.len
            } else {
                let bstart = (r.offset / bb + u64::from(pos - a0)) * bb;
                (r.offset + r.len).min(bstart + bb) - r.offset.max(bstart)
            };
            self.accesses += 1;
            self.bytes_read += overlap;
            // The tracker observes every demand block access once, as the engine does.
            let mut ctx = ctx;
            self.cache.observe(&self.p.keys[id as usize], &mut ctx);
            let mut st = self.state[id as usize];
            let (mut id, mut bytes) = (id, bytes);
            if !kv && !st.resident && st.lower == 0 && !st.queued {
                // Not cached as a whole block: a small read of a random stream in a
                // large file is served by its unit when that is cached, and on a miss
                // fetched and cached in the unit (the cache core's granularity) unless
                // the block is dense with cached units.
                let bi = r.offset / bb + u64::from(pos - a0);
                let bstart = bi * bb;
                let at = r.offset.max(bstart) - bstart;
                // The decision the daemon's reader takes too (`Granularity::demand_unit`).
                let granularity = self.granularity;
                let mut candidate = None;
                // Unit sizes with ids in this block, looked up on the first probe (none
                // for whole-block policies, which never probe).
                let mut made: Option<u64> = None;
                let unit = granularity.demand_unit(
                    &ctx.obs,
                    at,
                    overlap,
                    bb,
                    r.size,
                    self.cache_bytes,
                    |unit, fetch| {
                        let idx = (bstart + at) / unit;
                        if !fetch {
                            // Only whether it is cached: no id made for a unit never used.
                            let sizes = *made.get_or_insert_with(|| {
                                self.unit_sizes_made
                                    .get(&(r.path, bi))
                                    .copied()
                                    .unwrap_or(0)
                            });
                            if unit.is_power_of_two() && sizes & size_bit(unit) == 0 {
                                return UnitsHeld::default();
                            }
                            let Some(&uid) = self.unit_ids.get(&(r.path, unit, idx)) else {
                                return UnitsHeld::default();
                            };
                            let ust = self.state[uid as usize];
                            let held = ust.resident || ust.lower != 0;
                            if held {
                                candidate = Some((uid, self.block_size(uid), ust));
                            }
                            return UnitsHeld {
                                unit: held,
                                in_block: 0,
                            };
                        }
                        let (uid, ubytes) = self.unit_id(r.path, unit, idx, r.size);
                        if let Some(sizes) = made.as_mut() {
                            *sizes |= size_bit(unit);
                        }
                        let ust = self.state[uid as usize];
                        candidate = Some((uid, ubytes, ust));
                        UnitsHeld {
                            unit: ust.resident || ust.lower != 0,
                            in_block: self.block_units.get(&(r.path, bi)).copied().unwrap_or(0),
                        }
                    },
                );
                if let (Some(_), Some(c)) = (unit, candidate) {
                    (id, bytes, st) = c;
                }
            }
            if st.resident {
                self.touch(id, &ctx);
                if st.arrived {
                    self.hits += 1;
                    self.bytes_hit += overlap;
                    if let Some(h) = self.level_hits.first_mut() {
                        *h += 1;
                    }
                } else {
                    self.link_mut(st.via).transfers[st.transfer as usize]
                        .waiters
                        .push(j);
                    wait += 1;
                }
                if st.prefetched {
                    self.prefetch_demanded(id, bytes);
                }
                continue;
            }
            if st.transfer != NONE
                && st.via == 0
                && self.link.transfers[st.transfer as usize].block == id
            {
                // Single-flight, as the daemon's reader: a GET of this block is on the
                // wire (its copy was evicted or demoted while in flight, or the policy did
                // not admit it), so this read waits for it rather than fetching it again
                // (black-box finding: 300 readers of 3 hot blocks under pressure sent
                // 300 GETs and each waited 1.6 s instead of 36 ms).
                self.link.transfers[st.transfer as usize].waiters.push(j);
                wait += 1;
                if st.prefetched {
                    self.prefetch_demanded(id, bytes);
                }
                continue;
            }
            if st.lower != 0 {
                // A lower level holds it: read over that device, promoted to the top.
                let l = st.lower.trailing_zeros() as usize + 1;
                let key = self.key(id).clone();
                self.cache.touch(l, &key, &ctx);
                self.hits += 1;
                self.bytes_hit += overlap;
                self.level_hits[l] += 1;
                let tid = self.devices[l - 1].fetch(now, bytes, id, Class::Demand);
                self.devices[l - 1].transfers[tid as usize].waiters.push(j);
                wait += 1;
                if st.prefetched {
                    self.prefetch_demanded(id, bytes);
                }
                if self.place_at(0, id, bytes, &ctx.moved(AccessKind::Promotion)) {
                    let st = &mut self.state[id as usize];
                    st.resident = true;
                    st.arrived = false;
                    st.transfer = tid;
                    st.via = l as u8;
                }
                continue;
            }
            if st.queued {
                // Demand overtakes the queued prefetch of this block: it goes now, as
                // demand (no prefetch was made: the controller gives it no outcome).
                self.sched.promote(&id);
                self.queued_info.remove(&id);
                self.state[id as usize].queued = false;
                if let Some(c) = &mut self.controller {
                    c.failed(&id);
                }
            } else {
                self.sched.demand_started();
            }
            let admitted = self.place(id, bytes, &ctx);
            let tid = self.link.fetch(now, bytes, id, Class::Demand);
            self.link.transfers[tid as usize].waiters.push(j);
            wait += 1;
            // In flight whether cached or not (reads of it join the GET, above); it
            // arrives resident only if admitted.
            self.state[id as usize].transfer = tid;
            self.state[id as usize].via = 0;
            if admitted {
                self.state[id as usize] = BlockState {
                    resident: true,
                    arrived: false,
                    prefetched: false,
                    transfer: tid,
                    via: 0,
                    ..self.state[id as usize]
                };
                if let Some(b) = self.unit_block.get(&id) {
                    *self.block_units.entry(*b).or_insert(0) += 1;
                }
            }
        }
        // KV blocks are served by the KV service, whose staging controller has no
        // predictors (`strata_kvcache::staging`): the mount's readahead and cross-file
        // prediction never see them. Feeding them here made every KV block a "new file"
        // for the semantic predictor, which predicted nothing (0 bytes prefetched on
        // the Mooncake traces) and took a fifth of the replay's time.
        if self.controller.is_some() && !kv {
            self.predict(r.path, r.offset, r.len, r.size, a0, job, now);
        }
        self.pending[j as usize] = wait;
        if wait == 0 {
            self.complete(j, now);
        }
    }

    /// The mount's part for one demand read: the directory's listing on the first read
    /// in it, the access event, then the controller's orders issued in its order.
    #[allow(clippy::too_many_arguments)]
    fn predict(
        &mut self,
        path: u32,
        offset: u64,
        len: u64,
        size: u64,
        a0: u32,
        job: JobId,
        now: u64,
    ) {
        let Some(mut c) = self.controller.take() else {
            return;
        };
        let dir = self.p.path_dir[path as usize];
        if dir != NONE && !self.listed[dir as usize] {
            self.listed[dir as usize] = true;
            let (name, entries) = &self.p.listings[dir as usize];
            let entries: Vec<(&str, u64)> = entries.iter().map(|(n, s)| (n.as_str(), *s)).collect();
            c.on_listing(name, &entries);
        }
        let first = self.p.acc[a0 as usize];
        let event = AccessEvent {
            job,
            path: self.p.trace.paths[path as usize].clone(),
            offset,
            len,
            file_size: size,
            now_ns: now,
            pattern: self.pattern(first, &AccessContext::demand(job, now)),
        };
        let stream = (job.0 as u32, path);
        if self.course.changed(stream, event.pattern, offset) {
            // What readahead queued for the old course is not what comes next.
            let mut cancelled = std::mem::take(&mut self.starts);
            self.sched.cancel_stream(&stream, &mut cancelled);
            for id in cancelled.drain(..) {
                self.queued_info.remove(&id);
                self.state[id as usize].queued = false;
                c.failed(&id);
            }
            self.starts = cancelled;
        }
        let mut orders = std::mem::take(&mut self.orders);
        orders.clear();
        c.set_demand_in_flight(self.link.demand_owed());
        // Evictions are reported as they happen: nothing for a sweep to find.
        c.on_access(&event, |_| true, &mut orders);
        for order in &orders {
            self.prefetch(&mut c, order, now);
        }
        self.orders = orders;
        self.controller = Some(c);
    }

    fn prefetch(&mut self, c: &mut AccessController<u32>, order: &PrefetchOrder, now: u64) {
        let Some(&pid) = self.p.path_index.get(&order.path) else {
            return;
        };
        let size = self.p.trace.sizes[pid as usize];
        if order.offset >= size || order.len == 0 {
            return;
        }
        let len = order.len.min(size - order.offset);
        let path = self.p.trace.paths[pid as usize].clone();
        let mut lead = true;
        for (idx, bytes) in blocks_of(&path, order.offset, len, size, self.p.block_bytes) {
            let id = match self
                .p
                .block_ids
                .get(&(pid, idx))
                .or_else(|| self.extra_ids.get(&(pid, idx)))
            {
                Some(&id) => id,
                None => {
                    let key = if is_kv(&path) {
                        kv_key(&path)
                    } else {
                        CacheKey::file(path.clone(), VERSION, idx)
                    };
                    let id = (self.p.keys.len() + self.extra_keys.len()) as u32;
                    self.extra_ids.insert((pid, idx), id);
                    self.extra_key_ids.insert(key.clone(), id);
                    self.extra_keys.push(key);
                    self.extra_sizes.push(bytes);
                    self.state.push(EMPTY);
                    id
                }
            };
            // Cached at any level: nothing to fetch (the mount checks the engine alike).
            let st = self.state[id as usize];
            if st.resident || st.lower != 0 {
                continue;
            }
            match c.issue(id, order, bytes, lead) {
                Admission::Issue => {}
                Admission::Outstanding => continue,
                Admission::BacklogFull => {
                    let at = if is_kv(&path) {
                        0
                    } else {
                        idx * self.p.block_bytes
                    };
                    c.refused(order, at.max(order.offset));
                    return;
                }
            }
            lead = false;
            let class = if order.origin == Origin::CrossFile {
                Class::Speculative
            } else {
                Class::Prefetch
            };
            if !self.sched.submit(id, class, (order.job.0 as u32, pid)) {
                // Held back while demand waits: placed when it starts.
                self.state[id as usize].queued = true;
                self.queued_info.insert(id, (order.job, class));
            } else if !self.start_prefetch(id, order.job, class, now) {
                // The policy refused it: no prefetch made.
                c.failed(&id);
                let mut starts = std::mem::take(&mut self.starts);
                self.sched.finished(class, &mut starts);
                self.start_queued(now, starts);
            }
        }
    }
}

/// `unit_sizes_made`'s bit for a unit of `unit` bytes: `log2(unit)` for a power of two,
/// none otherwise (such a size is always probed).
fn size_bit(unit: u64) -> u64 {
    if unit.is_power_of_two() {
        1 << unit.trailing_zeros()
    } else {
        0
    }
}

/// Runs of Belady for `opt` (see [`replay`]).
const OPT_PASSES: usize = 3;

/// Replays `p` through `set` under `cfg`.
///
/// For `opt` the future must be in the order the replay will issue accesses, which
/// depends on timing, which depends on the policy. So `opt` runs Belady up to
/// [`OPT_PASSES`] times: first with the trace's time order, then each time with the order
/// the previous run actually replayed, and reports the run with the best hit ratio. For
/// one job (or jobs that never overlap) the first run is already exact.
pub fn replay(p: &Prepared, set: PolicySet, cfg: &ReplayConfig) -> PolicyResult {
    let is_opt = set.next_use.is_some();
    let (mut best, mut order) = replay_once(p, set, &p.next_use, cfg);
    if !is_opt {
        return best;
    }
    for _ in 1..OPT_PASSES {
        let hints = next_use_in(p, &order);
        let (policy, h) = strata_cache_core::policy::BeladyPolicy::new(cfg.capacity_bytes);
        let set = PolicySet {
            name: best.policy.clone(),
            policy: Box::new(policy),
            controller: None,
            next_use: Some(h),
        };
        let (r, o) = replay_once(p, set, &hints, cfg);
        if o == order {
            break;
        }
        order = o;
        if r.hit_ratio > best.hit_ratio {
            best = r;
        }
    }
    best
}

/// Next-use index (as ranks in `order`) for each flat access position.
fn next_use_in(p: &Prepared, order: &[u32]) -> Vec<u64> {
    let mut last = vec![u64::MAX; p.keys.len()];
    let mut hints = vec![u64::MAX; p.acc.len()];
    for (k, &pos) in order.iter().enumerate().rev() {
        let b = p.acc[pos as usize] as usize;
        hints[pos as usize] = last[b];
        last[b] = k as u64;
    }
    hints
}

fn replay_once(
    p: &Prepared,
    set: PolicySet,
    hints: &[u64],
    cfg: &ReplayConfig,
) -> (PolicyResult, Vec<u32>) {
    let PolicySet {
        name,
        policy,
        mut controller,
        next_use,
    } = set;
    // Every level's budget together.
    let cache_bytes = cfg
        .lower
        .iter()
        .map(|l| l.capacity_bytes)
        .fold(cfg.capacity_bytes, u64::saturating_add);
    if let Some(c) = &mut controller {
        // The store model's backlog bound (by default the controller's own default).
        let bound =
            cfg.store.prefetch_max_backlog_ns as f64 * cfg.store.bandwidth_bytes_per_s / 1e9;
        c.set_config(ControllerConfig {
            max_backlog_bytes: bound as u64,
            ..ControllerConfig::default()
        });
        // Readahead no deeper than the cache keeps of unread prefetch: the pattern-aware
        // policy's `ahead` share of every level (the daemon sets the same).
        c.set_cache_window(
            policy::PatternAwareConfig::default().unread_prefetch_bytes(cache_bytes),
        );
    }
    // Lower tiers evict as the top one does (`opt`, which needs the future, and the
    // strata variants run their live policy there).
    let lower_policy = match name.as_str() {
        n if n.starts_with("strata") => "strata",
        n if policy::LIVE_POLICY_NAMES.contains(&n) => n,
        _ => "lru",
    };
    let mut levels = vec![TierSpace::new(cfg.capacity_bytes, policy)];
    for l in &cfg.lower {
        let policy =
            policy::by_name(lower_policy, l.capacity_bytes).expect("a live policy name builds");
        levels.push(TierSpace::new(l.capacity_bytes, policy));
    }
    // Sub-block units for small random reads in the `strata` variants (the daemon's
    // default, `[cache] read_units = "auto"`); `strata-blocks` is the daemon with
    // `read_units = "block"`, and the baselines keep whole blocks.
    let granularity = if name.starts_with("strata") && name != "strata-blocks" {
        Granularity::default()
    } else {
        Granularity::BLOCKS
    };
    let order = if next_use.is_some() {
        Vec::with_capacity(p.acc.len())
    } else {
        Vec::new()
    };
    let mut run = Run {
        p,
        cache: Hierarchy::new(levels),
        devices: cfg
            .lower
            .iter()
            .map(|l| {
                Link::new(&StoreModel {
                    get_latency_ns: l.latency_ns,
                    bandwidth_bytes_per_s: l.bandwidth_bytes_per_s,
                    ..StoreModel::default()
                })
            })
            .collect(),
        persistent: cfg.lower.iter().map(LevelModel::persistent).collect(),
        level_hits: if cfg.lower.is_empty() {
            Vec::new()
        } else {
            vec![0; cfg.lower.len() + 1]
        },
        controller,
        listed: vec![false; p.listings.len()],
        next_use,
        hints,
        order,
        state: vec![EMPTY; p.keys.len()],
        extra_keys: Vec::new(),
        extra_sizes: Vec::new(),
        extra_ids: HashMap::default(),
        extra_key_ids: HashMap::default(),
        link: Link::new(&cfg.store),
        // The daemon's scheduler (demand first, prefetch within its share beyond
        // its floor, queued prefetch cancelled when its stream changes course).
        sched: StoreScheduler::new(LinkShare::default()),
        queued_info: HashMap::default(),
        course: CourseWatch::default(),
        starts: Vec::new(),
        granularity,
        cache_bytes,
        unit_ids: HashMap::default(),
        unit_sizes_made: HashMap::default(),
        unit_block: HashMap::default(),
        block_units: HashMap::default(),
        pending: vec![0; p.job_recs.len()],
        cursor: vec![0; p.job_recs.len()],
        end: vec![0; p.job_recs.len()],
        issued_at: vec![0; p.job_recs.len()],
        latencies: Vec::with_capacity(p.trace.records.len()),
        job_wait_ns: vec![0; p.job_recs.len()],
        issues: BinaryHeap::with_capacity(p.job_recs.len()),
        finished: Vec::new(),
        orders: Vec::new(),
        accesses: 0,
        hits: 0,
        bytes_read: 0,
        bytes_hit: 0,
        prefetch_bytes: 0,
        prefetch_used: 0,
    };
    let recs = &p.trace.records;
    let mut start = vec![0u64; p.job_recs.len()];
    for (j, rs) in p.job_recs.iter().enumerate() {
        if let Some(&r0) = rs.first() {
            start[j] = recs[r0 as usize].ts_ns;
            run.issues.push(Reverse((start[j], j as u32)));
        }
    }
    loop {
        let next_issue = run.issues.peek().map_or(u64::MAX, |Reverse((t, _))| *t);
        // The earliest event of the store link and the devices (the store first at
        // equal times).
        let (next_link, via) = (0..=run.devices.len())
            .map(|v| {
                let t = if v == 0 {
                    run.link.next_event()
                } else {
                    run.devices[v - 1].next_event()
                };
                (t, v as u8)
            })
            .min()
            .unwrap_or((u64::MAX, 0));
        if next_issue == u64::MAX && next_link == u64::MAX {
            break;
        }
        // Link events first at equal times: a block arriving at the instant a read is
        // issued is a hit.
        if next_link <= next_issue {
            let mut finished = std::mem::take(&mut run.finished);
            run.link_mut(via).step(next_link, &mut finished);
            run.finished = finished;
            run.arrived(next_link, via);
        } else if let Some(Reverse((now, j))) = run.issues.pop() {
            let ri = p.job_recs[j as usize][run.cursor[j as usize]] as usize;
            run.read(ri, j, now);
        }
    }
    let end = std::mem::take(&mut run.end);
    let mut job_jct_s = BTreeMap::new();
    let mut job_read_wait_s = BTreeMap::new();
    let mut total = 0.0;
    let mut n = 0usize;
    for (j, rs) in p.job_recs.iter().enumerate() {
        if rs.is_empty() {
            continue;
        }
        let s = (end[j] - start[j]) as f64 / 1e9;
        total += s;
        n += 1;
        let job = p.trace.jobs[j].to_string();
        job_read_wait_s.insert(job.clone(), run.job_wait_ns[j] as f64 / 1e9);
        job_jct_s.insert(job, s);
    }
    let (mean_read_latency_ms, p99_read_latency_ms) = latency_summary(&mut run.latencies);
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let result = PolicyResult {
        policy: name,
        hit_ratio: ratio(run.hits, run.accesses),
        byte_hit_ratio: ratio(run.bytes_hit, run.bytes_read),
        prefetch_bytes: run.prefetch_bytes,
        prefetch_precision: ratio(run.prefetch_used, run.prefetch_bytes),
        jct_s: if n == 0 { 0.0 } else { total / n as f64 },
        mean_read_latency_ms,
        p99_read_latency_ms,
        job_jct_s,
        job_read_wait_s,
        accesses: run.accesses,
        total_jct_s: total,
        level_hits: std::mem::take(&mut run.level_hits),
    };
    (result, run.order)
}

/// Mean and 99th percentile (nearest rank) of `ns`, in ms; `(0, 0)` when empty.
fn latency_summary(ns: &mut [u64]) -> (f64, f64) {
    if ns.is_empty() {
        return (0.0, 0.0);
    }
    let mean = ns.iter().map(|&x| x as f64).sum::<f64>() / ns.len() as f64;
    let rank = ((ns.len() as f64 * 0.99).ceil() as usize).clamp(1, ns.len()) - 1;
    let (_, p99, _) = ns.select_nth_unstable(rank);
    (mean / 1e6, *p99 as f64 / 1e6)
}

/// The largest `--capacity N%`: beyond 100% every block fits already, so a larger
/// figure is a typo (and `inf%` was taken as a capacity of 2^64 bytes).
pub const MAX_CAPACITY_PERCENT: f64 = 1000.0;

/// Parses a capacity: bytes (`1073741824`, `512MiB`, `2GB`) or `N%` of `unique_bytes`.
pub fn parse_capacity(s: &str, unique_bytes: u64) -> anyhow::Result<u64> {
    let s = s.trim();
    let expected = "expected bytes (`1073741824`, `512MiB`, `2GB`) or a percentage of the \
                    trace's unique bytes (`20%`)";
    if let Some(pct) = s.strip_suffix('%') {
        let f: f64 = pct
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("capacity `{s}`: `{pct}` is not a number; {expected}"))?;
        anyhow::ensure!(
            f.is_finite() && f > 0.0 && f <= MAX_CAPACITY_PERCENT,
            "capacity `{s}` must be a percentage above 0 and at most {MAX_CAPACITY_PERCENT}"
        );
        return Ok(((unique_bytes as f64) * f / 100.0).round().max(1.0) as u64);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    anyhow::ensure!(!num.is_empty(), "capacity `{s}`: {expected}");
    let n: u64 = num
        .parse()
        .map_err(|e| anyhow::anyhow!("capacity `{s}`: {e}"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u => {
            anyhow::bail!("capacity `{s}`: unknown unit `{u}` (B, KiB, MiB, GiB, KB, MB, GB or %)")
        }
    };
    anyhow::ensure!(n > 0, "capacity `{s}` must be > 0");
    n.checked_mul(mult)
        .ok_or_else(|| anyhow::anyhow!("capacity `{s}` overflows"))
}

#[cfg(test)]
mod tests;
