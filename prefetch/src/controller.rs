//! The access controller: the one place that decides what to prefetch, in what order,
//! and what became of it. The mount (`strata-fs`) and the replay simulator
//! (`strata-replay`) both drive it, so a replay result is a statement about the daemon.
//!
//! Pure logic like the predictors: no I/O, no clock (time arrives in the events), and
//! generic over the driver's block handle `H` (the mount's `CacheKey`, the replay's
//! dense block id), so this crate needs nothing of the cache core.
//!
//! A driver:
//! 1. hands over directory listings as it sees them ([`AccessController::on_listing`];
//!    the mount at readdir/listing fetch, the replay when a job first touches a
//!    directory);
//! 2. on every demand read reports the blocks it touches
//!    ([`AccessController::demand`]: a prefetched block read by demand is `Used`), then
//!    calls [`AccessController::on_access`] with the stream's pattern (classified by the
//!    caller) and gets back prefetch orders, highest priority first;
//! 3. splits each order into blocks and, for each block it would fetch, asks
//!    [`AccessController::issue`]; it reports [`landed`](AccessController::landed) or
//!    [`failed`](AccessController::failed) when the fetch ends, and
//!    [`evicted`](AccessController::evicted) when it knows a block left the cache (the
//!    replay does; the mount instead passes a cache check to `on_access`, which sweeps a
//!    few landed blocks per new file to find the ones evicted unread).
//!
//! # Rules
//!
//! - **Feeding.** The sequential predictor sees every access (it follows offsets and
//!   rates). The semantic predictor sees the first access of a file by a job since that
//!   job last read another file: it predicts *files*, so one event per file visit is all
//!   it needs, and the rule depends only on the access sequence (not on opens, which the
//!   replay does not have).
//! - **Files left midway are resumed, not refetched.** Once a job's habit is to come
//!   back to a file where its last visit stopped (a k-way merge taking turns among its
//!   runs), a cross-file prediction of such a file asks for one visit's bytes from where
//!   it stopped, and of a file not yet visited, one visit's bytes from its start, instead
//!   of the whole file (`controller/resume.rs` has the rule and its reasons).
//! - **Priority.** Readahead of the file being read comes first (`1 + confidence`; its
//!   blocks are next in line for a reader already waiting), speculative cross-file
//!   prefetch after it (`confidence`, at most 1). Orders are returned sorted, so when the
//!   backlog fills, the lowest are the ones refused.
//! - **Refused readahead is deferred, not lost.** A readahead block refused by the
//!   backlog ([`AccessController::refused`]) is ordered again, first, at the stream's
//!   next access (the sequential predictor has moved its window past it; without this
//!   the reader meets a hole of demand misses).
//! - **Backlog.** [`ControllerConfig::max_backlog_bytes`] bounds the bytes the store
//!   link owes: prefetch issued and neither landed nor claimed by demand (the ledger's
//!   count), plus twice the demand bytes in flight the driver reports
//!   ([`AccessController::set_demand_in_flight`]: the replay knows them to the byte, the
//!   mount counts the uncached blocks of reads in progress). A block that would exceed it is
//!   refused ([`Admission::BacklogFull`]), except when nothing is in flight (a block
//!   larger than the bound still goes, alone). Demand is never refused.
//! - **No spare-bandwidth hint.** The predictors' `set_spare_bandwidth` is not called
//!   (before, only the replay set it, from its link backlog): measured on the generated
//!   workloads with this backlog rule (before refused readahead was deferred), the hint
//!   made the semantic predictor a net loss on `mixed` at 20% capacity (byte hit ratio
//!   0.585 with it, 0.616 without; sequential only: 0.615), and the backlog bound
//!   already limits what speculation can take from demand.
//! - **Outcomes.** Each issued block gets at most one outcome: `Used` (first demand
//!   read, in flight or landed) or `Wasted` (evicted unread, or found gone by a sweep),
//!   routed to the predictor that asked for it. A failed fetch gets none.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;

use strata_types::FxBuild;
use strata_types::JobId;

use crate::semantic::SemanticPredictor;
use crate::sequential::SequentialPredictor;
use crate::{AccessEvent, Feedback, Predictor, PrefetchRequest};
use resume::Resume;

/// Which predictor asked for a prefetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Readahead within the file being read (the sequential predictor).
    Readahead,
    /// Another file predicted from names, listings or epochs (the semantic predictor).
    CrossFile,
    /// Asked for by a client: the KV service's `Prefetch` (staging blocks into the
    /// fastest tier before the engine needs them). No predictor: the backlog and the
    /// ledger of outcomes apply alike.
    Requested,
}

/// A range to fetch ahead of demand, as decided by the controller.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefetchOrder {
    /// The job whose access caused it (its outcomes are reported for this job).
    pub job: JobId,
    pub path: Arc<str>,
    pub offset: u64,
    pub len: u64,
    pub origin: Origin,
    /// Higher goes first: `1 + confidence` for readahead, `confidence` for cross-file.
    pub priority: f32,
}

/// The answer to [`AccessController::issue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Fetch it; report [`AccessController::landed`] or [`AccessController::failed`].
    Issue,
    /// A prefetch of this block is outstanding already: do not fetch again.
    Outstanding,
    /// The prefetch backlog is full: drop it (and the rest of this order).
    BacklogFull,
}

/// What became of one prefetched block (already reported to its predictor).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub job: JobId,
    pub path: Arc<str>,
    pub bytes: u64,
    pub origin: Origin,
    /// The first block of its order (counting these counts orders, e.g. files).
    pub lead: bool,
    /// `Used` (true) or `Wasted` (false).
    pub used: bool,
}

/// Tuning of [`AccessController`].
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerConfig {
    /// Bytes the store link may owe (demand in flight plus prefetch issued and not
    /// landed) for a prefetch to be issued: 20 MB, 100 ms of a 200 MB/s store link (the
    /// replay's default store model), a readahead queue of the size FUSE caches keep in
    /// flight, and a bound on how much speculation shares the link with demand.
    pub max_backlog_bytes: u64,
    /// Weight of a demand byte in flight against that bound: 2. Demand first: the store
    /// link shares its bandwidth equally between transfers, so every prefetch byte in
    /// flight slows the reads already waiting; counting their bytes twice makes
    /// speculation yield as demand fills the link. Measured (replay, 20% capacity,
    /// mean JCT / p99 read latency of `strata`) against weight 1: `mixed` 64.8 s / 155
    /// ms -> 61.1 s / 131 ms, `shards` 31.9 s / 117 ms -> 35.5 s / 115 ms (shards alone
    /// gains from more readahead; mixed pays for it in its other jobs).
    pub demand_weight: u64,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            max_backlog_bytes: 20_000_000,
            demand_weight: 2,
        }
    }
}

#[derive(Clone, Debug)]
struct Tracked {
    job: JobId,
    path: Arc<str>,
    bytes: u64,
    origin: Origin,
    lead: bool,
    landed: bool,
}

/// Outstanding prefetched blocks: issued, and neither used, wasted nor failed yet.
#[derive(Debug)]
pub struct PrefetchLedger<H> {
    map: HashMap<H, Tracked, FxBuild>,
    /// Handles in sweep order (issue order, rotated by sweeps). May hold handles no
    /// longer in `map` (settled): they are skipped and dropped when reached.
    order: VecDeque<H>,
    /// Bytes of entries not landed yet.
    in_flight: u64,
}

impl<H> Default for PrefetchLedger<H> {
    fn default() -> Self {
        PrefetchLedger {
            map: HashMap::default(),
            order: VecDeque::new(),
            in_flight: 0,
        }
    }
}

impl<H: Clone + Eq + Hash> PrefetchLedger<H> {
    /// Outstanding blocks tracked at most: 64Ki (the semantic predictor remembers as
    /// many issued requests; a few MiB). Beyond it the oldest is forgotten unreported.
    pub const MAX_TRACKED: usize = 1 << 16;
    /// Entries checked per sweep: 16 (16 cache lookups, ~1 µs, per new file read).
    pub const SWEEP_PER_CALL: usize = 16;

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes issued and not landed yet.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    fn insert(&mut self, h: H, t: Tracked) -> bool {
        if self.map.contains_key(&h) {
            return false;
        }
        while self.map.len() >= Self::MAX_TRACKED {
            match self.order.pop_front() {
                Some(old) => {
                    self.remove(&old);
                }
                None => break,
            }
        }
        if !t.landed {
            self.in_flight += t.bytes;
        }
        self.map.insert(h.clone(), t);
        self.order.push_back(h);
        self.compact();
        true
    }

    fn remove(&mut self, h: &H) -> Option<Tracked> {
        let t = self.map.remove(h)?;
        if !t.landed {
            self.in_flight -= t.bytes;
        }
        Some(t)
    }

    fn landed(&mut self, h: &H) {
        if let Some(t) = self.map.get_mut(h) {
            if !t.landed {
                t.landed = true;
                self.in_flight -= t.bytes;
            }
        }
    }

    /// Up to [`Self::SWEEP_PER_CALL`] outstanding entries checked; removes and returns
    /// the landed ones no longer cached (`cached(h)` false).
    fn sweep(&mut self, mut cached: impl FnMut(&H) -> bool) -> Vec<Tracked> {
        let mut gone = Vec::new();
        for _ in 0..Self::SWEEP_PER_CALL.min(self.order.len()) {
            let Some(h) = self.order.pop_front() else {
                break;
            };
            let Some(t) = self.map.get(&h) else {
                continue; // settled: drop its slot
            };
            if t.landed && !cached(&h) {
                gone.extend(self.remove(&h));
            } else {
                self.order.push_back(h);
            }
        }
        gone
    }

    /// Drops stale slots when the order outgrows the map by 2x (amortised O(1)).
    fn compact(&mut self) {
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order.retain(|h| map.contains_key(h));
        }
    }
}

/// Readahead holes remembered (per job and file) before the record is cleared: 64Ki.
const MAX_JOBS: usize = 1 << 16;

/// The access controller. See the module docs.
pub struct AccessController<H> {
    cfg: ControllerConfig,
    sequential: Option<Box<dyn Predictor>>,
    cross_file: Option<Box<dyn Predictor>>,
    ledger: PrefetchLedger<H>,
    /// Demand bytes the driver has in flight, as last reported.
    demand_in_flight: u64,
    /// Readahead refused by a full backlog, per (job, file): ordered again, first, at
    /// the stream's next access (the sequential predictor has moved past it).
    deferred: HashMap<(JobId, Arc<str>), std::ops::Range<u64>, FxBuild>,
    reqs: Vec<PrefetchRequest>,
    /// Per job: the file it reads now, and where it left files midway, for cross-file
    /// predictions (`resume.rs`).
    resume: Resume,
}

impl<H> std::fmt::Debug for AccessController<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessController")
            .field("cfg", &self.cfg)
            .field("sequential", &self.sequential.as_ref().map(|p| p.name()))
            .field("cross_file", &self.cross_file.as_ref().map(|p| p.name()))
            .field("outstanding", &self.ledger.map.len())
            .finish()
    }
}

impl<H: Clone + Eq + Hash> AccessController<H> {
    /// A controller with these predictors: `sequential` for readahead within the file
    /// read, `cross_file` for other files (either may be absent).
    pub fn new(
        cfg: ControllerConfig,
        sequential: Option<Box<dyn Predictor>>,
        cross_file: Option<Box<dyn Predictor>>,
    ) -> Self {
        AccessController {
            cfg,
            sequential,
            cross_file,
            ledger: PrefetchLedger::default(),
            resume: Resume::default(),
            demand_in_flight: 0,
            deferred: HashMap::default(),
            reqs: Vec::new(),
        }
    }

    /// The daemon's default: sequential readahead and semantic prediction, default tuning.
    pub fn standard() -> Self {
        Self::with_predictors(true, true)
    }

    /// The default predictors, each optional, with the default [`ControllerConfig`].
    pub fn with_predictors(sequential: bool, semantic: bool) -> Self {
        Self::new(
            ControllerConfig::default(),
            sequential.then(|| Box::new(SequentialPredictor::default()) as Box<dyn Predictor>),
            semantic.then(|| Box::new(SemanticPredictor::default()) as Box<dyn Predictor>),
        )
    }

    /// The daemon's default predictors with the semantic predictor's listing index
    /// holding at most `max_names` listed names (the daemon sizes it to its memory
    /// limit: ~260 B per name).
    pub fn standard_with_names(max_names: usize) -> Self {
        let semantic = crate::semantic::SemanticConfig {
            max_listed_entries: max_names,
            ..Default::default()
        };
        Self::new(
            ControllerConfig::default(),
            Some(Box::new(SequentialPredictor::default())),
            Some(Box::new(SemanticPredictor::new(semantic))),
        )
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.cfg
    }

    /// Replaces the tuning (the replay derives the backlog bound from its store model).
    pub fn set_config(&mut self, cfg: ControllerConfig) {
        self.cfg = cfg;
    }

    /// Whether readahead within a file is the controller's (else the driver's own).
    pub fn has_sequential(&self) -> bool {
        self.sequential.is_some()
    }

    pub fn has_cross_file(&self) -> bool {
        self.cross_file.is_some()
    }

    /// Outstanding prefetched blocks.
    pub fn outstanding(&self) -> usize {
        self.ledger.len()
    }

    /// Bytes in flight against the backlog bound: prefetch issued and neither landed
    /// nor claimed by demand, plus the demand the driver reported in flight, weighted
    /// ([`ControllerConfig::demand_weight`]).
    pub fn backlog_bytes(&self) -> u64 {
        self.ledger.in_flight() + self.cfg.demand_weight * self.demand_in_flight
    }

    /// The driver's demand bytes in flight (reads issued, not completed), reported
    /// before each access: they share the store link with prefetch, so they count
    /// against the backlog bound too.
    pub fn set_demand_in_flight(&mut self, bytes: u64) {
        self.demand_in_flight = bytes;
    }

    /// The store's measured time per request for a small object, ns (0: unknown): the
    /// cross-file predictor keeps as many files requested ahead as the reader consumes
    /// while one request is served (see
    /// [`crate::semantic::predictor::latency_window`]).
    pub fn set_request_latency(&mut self, ns: u64) {
        if let Some(p) = &mut self.cross_file {
            p.set_request_latency(ns);
        }
    }

    /// The bytes the store link can keep in flight (see [`Predictor::set_link_window`]),
    /// for readahead; the mount passes its link estimate, the replay leaves it unset.
    pub fn set_link_window(&mut self, bytes: u64) {
        if let Some(p) = &mut self.sequential {
            p.set_link_window(bytes);
        }
    }

    /// The bytes of unread prefetch the cache keeps (see
    /// [`Predictor::set_cache_window`]): readahead never reaches further ahead.
    pub fn set_cache_window(&mut self, bytes: u64) {
        if let Some(p) = &mut self.sequential {
            p.set_cache_window(bytes);
        }
    }

    /// The names (and sizes) in directory `dir` (relative to the dataset root, `""` for
    /// the root), as a listing returned them.
    pub fn on_listing(&mut self, dir: &str, entries: &[(&str, u64)]) {
        if let Some(p) = &mut self.cross_file {
            p.on_listing(dir, entries);
        }
    }

    /// A demand read of block `h`: `Used` if it was an outstanding prefetch (reported to
    /// its predictor and returned).
    pub fn demand(&mut self, h: &H) -> Option<Outcome> {
        let t = self.ledger.remove(h)?;
        Some(self.settle(t, true))
    }

    /// Block `h` left the cache: `Wasted` if it was an outstanding prefetch.
    pub fn evicted(&mut self, h: &H) -> Option<Outcome> {
        let t = self.ledger.remove(h)?;
        Some(self.settle(t, false))
    }

    fn settle(&mut self, t: Tracked, used: bool) -> Outcome {
        let feedback = if used && !t.landed && t.origin == Origin::Readahead {
            // The reader caught up with its readahead: it deepens (issue 14).
            Feedback::Late { bytes: t.bytes }
        } else if used {
            Feedback::Used { bytes: t.bytes }
        } else {
            Feedback::Wasted { bytes: t.bytes }
        };
        let p = match t.origin {
            Origin::Readahead => self.sequential.as_mut(),
            Origin::CrossFile => self.cross_file.as_mut(),
            Origin::Requested => None,
        };
        if let Some(p) = p {
            p.on_feedback(t.job, &t.path, feedback);
        }
        Outcome {
            job: t.job,
            path: t.path,
            bytes: t.bytes,
            origin: t.origin,
            lead: t.lead,
            used,
        }
    }

    /// Observes a demand access (after its blocks were reported to [`Self::demand`]) and
    /// appends the prefetch orders it calls for to `out`, highest priority first.
    ///
    /// `cached(h)`: whether a landed block is still cached; checked for a few
    /// outstanding blocks when the access starts a new file for its job (a driver that
    /// reports every eviction to [`Self::evicted`] passes `|_| true`). Returns the
    /// blocks that sweep found evicted unread (`Wasted`, already reported).
    pub fn on_access(
        &mut self,
        ev: &AccessEvent,
        cached: impl FnMut(&H) -> bool,
        out: &mut Vec<PrefetchOrder>,
    ) -> Vec<Outcome> {
        // The file a job reads, and where it left others midway (`resume.rs`).
        let new_file = self.resume.on_access(ev);
        // Outcomes first: the predictors adapt before they predict again.
        let wasted: Vec<Outcome> = if new_file && !self.ledger.is_empty() {
            self.ledger
                .sweep(cached)
                .into_iter()
                .map(|t| self.settle(t, false))
                .collect()
        } else {
            Vec::new()
        };
        let start = out.len();
        if !self.deferred.is_empty() {
            if let Some(r) = self.deferred.remove(&(ev.job, ev.path.clone())) {
                // Only while the reader is still short of the hole: one that jumped into
                // or past it reads with gaps, and demand fetches what it wants.
                let from = r.start.max(ev.offset.saturating_add(ev.len));
                if ev.offset < r.start && from < r.end {
                    out.push(PrefetchOrder {
                        job: ev.job,
                        path: ev.path.clone(),
                        offset: from,
                        len: r.end - from,
                        origin: Origin::Readahead,
                        // Nearer to the reader than any fresh readahead.
                        priority: 2.5,
                    });
                }
            }
        }
        let mut reqs = std::mem::take(&mut self.reqs);
        if let Some(p) = &mut self.sequential {
            reqs.clear();
            p.on_access(ev, &mut reqs);
            push_orders(ev.job, Origin::Readahead, &mut reqs, out);
        }
        if new_file {
            if let Some(p) = &mut self.cross_file {
                reqs.clear();
                p.on_access(ev, &mut reqs);
                self.resume.narrow(ev.job, &mut reqs);
                push_orders(ev.job, Origin::CrossFile, &mut reqs, out);
            }
        }
        self.reqs = reqs;
        // Stable: a predictor's own order (nearest first) is kept among equals.
        out[start..].sort_by(|a, b| b.priority.total_cmp(&a.priority));
        wasted
    }

    /// Block `h` (`bytes` of `order`; `lead`: the order's first block fetched) is about
    /// to be fetched ahead of demand: may it?
    pub fn issue(&mut self, h: H, order: &PrefetchOrder, bytes: u64, lead: bool) -> Admission {
        if self.ledger.map.contains_key(&h) {
            return Admission::Outstanding;
        }
        let in_flight = self.backlog_bytes();
        if in_flight > 0 && in_flight + bytes > self.cfg.max_backlog_bytes {
            return Admission::BacklogFull;
        }
        self.ledger.insert(
            h,
            Tracked {
                job: order.job,
                path: order.path.clone(),
                bytes,
                origin: order.origin,
                lead,
                landed: false,
            },
        );
        Admission::Issue
    }

    /// `order` stopped at byte `at` because the backlog was full
    /// ([`Admission::BacklogFull`]). Readahead is ordered again from there at the
    /// stream's next access (its predictor has moved on and would leave a hole that
    /// demand then misses); cross-file speculation is just dropped.
    pub fn refused(&mut self, order: &PrefetchOrder, at: u64) {
        if order.origin != Origin::Readahead {
            return;
        }
        let end = order.offset.saturating_add(order.len);
        if at >= end {
            return;
        }
        if self.deferred.len() >= MAX_JOBS {
            self.deferred.clear();
        }
        let r = self
            .deferred
            .entry((order.job, order.path.clone()))
            .or_insert(at..end);
        r.start = r.start.min(at);
        r.end = r.end.max(end);
    }

    /// The prefetch of `h` has landed in the cache.
    pub fn landed(&mut self, h: &H) {
        self.ledger.landed(h);
    }

    /// The prefetch of `h` was not made (the store failed, the object vanished): no
    /// outcome. False if it was no longer outstanding (demand claimed it meanwhile).
    pub fn failed(&mut self, h: &H) -> bool {
        self.ledger.remove(h).is_some()
    }
}

fn push_orders(
    job: JobId,
    origin: Origin,
    reqs: &mut Vec<PrefetchRequest>,
    out: &mut Vec<PrefetchOrder>,
) {
    out.extend(reqs.drain(..).map(|r| PrefetchOrder {
        job,
        priority: match origin {
            Origin::Readahead => 1.0 + r.confidence.clamp(0.0, 1.0),
            // Cross-file speculation, and (never from a predictor) a client's request.
            Origin::CrossFile | Origin::Requested => r.confidence.clamp(0.0, 1.0),
        },
        path: r.path,
        offset: r.offset,
        len: r.len,
        origin,
    }));
}

mod resume;
#[cfg(test)]
mod tests;
