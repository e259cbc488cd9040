//! [`SemanticPredictor`]: the [`Predictor`] that ties tokenizer, clustering, regularity
//! rules and the permutation pool together, and adapts its depth.
//!
//! Adaptation, three levels:
//! - per lane: depth doubles on hits, halves on misses, 0 after `miss_limit` misses in a
//!   row (see [`super::regularity`]);
//! - global: an exponentially weighted hit rate of [`Feedback`] (weight 1/64 per report,
//!   i.e. the last ~64 outcomes). Below 50% useful, every depth is scaled by twice the
//!   rate (a safety net when lanes misjudge themselves; above 50% prefetch pays for
//!   itself and lanes decide alone);
//! - store bandwidth: [`Predictor::set_spare_bandwidth`](crate::Predictor::set_spare_bandwidth) (0 = saturated,
//!   1 = idle) scales depths by `0.25 + 0.75 * spare`; a confirmed lane still keeps one
//!   file ahead on a busy store, since a correct prefetch only moves a read earlier.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use strata_types::{FxBuild, JobId};

use super::cluster::{ClusterKey, ClusterTable};
use super::listing::ListingIndex;
use super::permutation::SetTracker;
use super::regularity::{Candidate, Lane};
use super::tokenize::TokenizedPath;
use super::SemanticConfig;
use crate::{AccessEvent, Feedback, Predictor, PrefetchRequest};

/// Outstanding requests remembered to route feedback: 64Ki paths (a few MiB).
const MAX_ISSUED: usize = 1 << 16;
/// Weight of one feedback report in the global hit rate.
const FEEDBACK_WEIGHT: f64 = 1.0 / 64.0;
/// Per-step confidence decay: the 10th file ahead is less sure than the next.
const STEP_DECAY: f32 = 0.97;

/// Which rule issued a request, to route its feedback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Lane,
    /// The job's own per-epoch pool.
    Pool,
    /// The pool over all jobs' reads of the template's set.
    SharedPool,
}

#[derive(Clone, Debug)]
struct Issued {
    key: ClusterKey,
    origin: Origin,
}

/// Counters for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SemanticStats {
    pub accesses: u64,
    /// Requests from lane rules (stride, rollover, `-of-N`, lexical).
    pub lane_requests: u64,
    /// Requests from per-epoch permutation pools.
    pub pool_requests: u64,
    pub streams: usize,
}

/// Semantic path predictor. See the [module docs](super).
#[derive(Debug)]
pub struct SemanticPredictor {
    cfg: SemanticConfig,
    streams: ClusterTable,
    listing: ListingIndex,
    /// Per-epoch permutation over all jobs' reads of a template's member set: data-loader
    /// workers (one job id each) split every epoch's permutation between them, so each
    /// worker alone reads a subset but together they read the whole set once per epoch.
    shared: HashMap<Arc<str>, SetTracker, FxBuild>,
    issued: HashMap<Arc<str>, Issued, FxBuild>,
    issued_order: VecDeque<Arc<str>>,
    seq: u64,
    /// The last access's tokenized path: tokenizing is a pure function of the path's
    /// text, and consecutive accesses are mostly chunks of one file (the same `Arc`),
    /// so the template is reused instead of rebuilt (a `String` and an `Arc` per access).
    last_tok: Option<TokenizedPath>,
    /// EWMA of "feedback was Used".
    useful: f64,
    spare: f64,
    /// The store's measured time per request for a small file, ns (0: unknown), from
    /// the driver ([`Predictor::set_request_latency`]).
    request_ns: u64,
    stats: SemanticStats,
    /// A lane's candidates of the current access: a buffer kept between accesses.
    candidates: Vec<Candidate>,
}

impl Default for SemanticPredictor {
    fn default() -> Self {
        SemanticPredictor::new(SemanticConfig::default())
    }
}

impl SemanticPredictor {
    pub fn new(cfg: SemanticConfig) -> Self {
        SemanticPredictor {
            listing: ListingIndex::new(cfg.max_listed_entries),
            cfg,
            streams: ClusterTable::default(),
            shared: HashMap::default(),
            issued: HashMap::default(),
            issued_order: VecDeque::new(),
            seq: 0,
            last_tok: None,
            // Start trusting: lanes only predict after confirming a rule anyway.
            useful: 1.0,
            spare: 1.0,
            request_ns: 0,
            stats: SemanticStats::default(),
            candidates: Vec::new(),
        }
    }

    pub fn config(&self) -> &SemanticConfig {
        &self.cfg
    }

    pub fn stats(&self) -> SemanticStats {
        SemanticStats {
            streams: self.streams.len(),
            ..self.stats
        }
    }

    /// Hands over the names in directory `dir` (relative to the dataset root, `""` for
    /// the root), as the mount lists them for `readdir`. Enables lexical-order and
    /// per-epoch-permutation prediction over these files.
    pub fn observe_listing<S: AsRef<str>>(&mut self, dir: &str, names: &[S]) {
        let entries: Vec<(&str, u64)> = names.iter().map(|n| (n.as_ref(), 0)).collect();
        self.listing.observe(dir, &entries);
    }

    /// Like [`Self::observe_listing`], with sizes: predictions then request exactly the
    /// file (small files) or its first chunk (large ones).
    pub fn observe_listing_sized<S: AsRef<str>>(&mut self, dir: &str, entries: &[(S, u64)]) {
        self.listing.observe(dir, entries);
    }

    fn depth_scale(&self) -> f64 {
        let feedback = if self.useful >= 0.5 {
            1.0
        } else {
            (self.useful * 2.0).max(0.05)
        };
        feedback * (0.25 + 0.75 * self.spare)
    }

    fn remember(&mut self, path: Arc<str>, key: &ClusterKey, origin: Origin) {
        let rec = Issued {
            key: key.clone(),
            origin,
        };
        if self.issued.insert(path.clone(), rec).is_none() {
            self.issued_order.push_back(path);
        }
        while self.issued_order.len() > MAX_ISSUED {
            if let Some(p) = self.issued_order.pop_front() {
                self.issued.remove(&p);
            }
        }
    }
}

/// Files a lane must keep requested ahead so that each arrives before its reader gets
/// to it: a request takes `request_ns` and the reader takes `interval_ns` per file, so
/// `request_ns / interval_ns` files are consumed while one is fetched (Little's law),
/// kept at [`SemanticConfig::latency_headroom`] times that. The headroom matters
/// beyond jitter: while the window is too small the reader waits on every file and
/// the measured interval is the fetch time over the window, so without headroom the
/// window would only ever grow by one file per measurement; with 2x it doubles until
/// the reader stops waiting. None while either figure is unknown (the lane's
/// confidence depth alone decides then).
pub fn latency_window(
    request_ns: u64,
    interval_ns: Option<f64>,
    cfg: &SemanticConfig,
) -> Option<u32> {
    let interval = interval_ns?;
    if request_ns == 0 || interval <= 0.0 {
        return None;
    }
    let need = (request_ns as f64 / interval * cfg.latency_headroom).ceil();
    Some(need.clamp(1.0, f64::from(cfg.max_depth)) as u32)
}

impl Predictor for SemanticPredictor {
    fn name(&self) -> &'static str {
        "semantic"
    }

    fn on_access(&mut self, event: &AccessEvent, out: &mut Vec<PrefetchRequest>) {
        self.seq += 1;
        self.stats.accesses += 1;
        let seq = self.seq;
        let scale = self.depth_scale();
        let memo = match self.last_tok.take() {
            Some(mut m) if Arc::ptr_eq(&m.path, &event.path) || *m.path == *event.path => {
                // Same text, so the same template, fields and spans; the path is the
                // event's own `Arc`, as a fresh tokenization would hold.
                m.path = event.path.clone();
                m
            }
            Some(mut m) => {
                self.listing.tokenize_into(&event.path, &mut m);
                m
            }
            None => self.listing.tokenize(&event.path),
        };
        let tok = self.last_tok.insert(memo);
        let key: ClusterKey = (event.job, tok.template.clone());
        self.listing.prepare(&tok.template);
        let cfg = &self.cfg;
        let listing = &self.listing;
        let stream = self.streams.touch(&key, seq, cfg.max_streams);
        if !stream.note_file(&event.path) {
            // Another chunk of a file just read: nothing new about the name stream.
            return;
        }
        // Borrowed, not cloned: a lane copies it into its own buffers (`Lane::observe`),
        // and only a new lane takes a copy of its own.
        let t: &TokenizedPath = tok;
        if event.file_size > 0 {
            stream.size_sum = stream.size_sum.saturating_add(event.file_size);
            stream.size_n += 1;
        }
        let set = listing.set(&t.template);
        let member = set.and_then(|s| s.id(&t.path));
        let shared = if let (Some(s), Some(m)) = (set, member) {
            stream
                .set
                .get_or_insert_with(SetTracker::default)
                .observe(m, s, cfg);
            let shared = self.shared.entry(t.template.clone()).or_default();
            shared.observe(m, s, cfg);
            Some(shared)
        } else {
            None
        };
        let current = t.path.clone();
        let li = match stream.assign(t, cfg) {
            Some(i) => {
                stream.lanes[i].observe(t, seq, member, event.file_size, set, cfg);
                i
            }
            None => stream.open_lane(Lane::new(t.clone(), seq, member, event.file_size, cfg), cfg),
        };

        let mut issued: Vec<(Arc<str>, Origin)> = Vec::new();
        let avg = stream.avg_size();
        let lane = &mut stream.lanes[li];
        lane.note_file_time(event.now_ns);
        if lane.rule(cfg).is_some() && lane.depth > 0 {
            let mut k = ((f64::from(lane.depth) * scale).ceil() as u32).max(1);
            if let Some(need) = latency_window(self.request_ns, lane.file_interval_ns(), cfg) {
                k = k.min(need);
            }
            let acc = lane.accuracy();
            let lane_max = lane.max_file_size;
            let mut found = std::mem::take(&mut self.candidates);
            lane.candidates_into(k, listing, cfg, &current, &mut found);
            for c in found.drain(..) {
                let confidence = acc * STEP_DECAY.powi(c.step as i32 - 1);
                if confidence < cfg.min_confidence {
                    break;
                }
                let len = match c.size {
                    Some(s) if s <= cfg.small_file_max => s,
                    Some(_) => cfg.first_chunk,
                    None if lane_max > 0 && lane_max <= cfg.small_file_max => lane_max,
                    None => cfg.first_chunk,
                };
                // A path the window names twice is asked for once.
                if !lane.add_pending(c.path.clone(), cfg) {
                    continue;
                }
                out.push(PrefetchRequest {
                    path: c.path.clone(),
                    offset: 0,
                    len,
                    confidence,
                });
                issued.push((c.path, Origin::Lane));
            }
            self.candidates = found;
        } else if let Some(s) = set {
            // The pool with the most evidence: the shared one once it has seen a whole
            // epoch, else the job's own, else the shared one.
            let own_accepted = stream.set.as_ref().is_some_and(|t| t.accepted);
            let (tracker, origin) = match (shared, stream.set.as_mut()) {
                (Some(g), _) if g.accepted && g.epochs >= 1 => (Some(g), Origin::SharedPool),
                (_, Some(own)) if own_accepted => (Some(own), Origin::Pool),
                (Some(g), _) => (Some(g), Origin::SharedPool),
                (None, own) => (own, Origin::Pool),
            };
            let burst = ((f64::from(cfg.max_burst) * scale).ceil() as u32).max(1);
            let mut ids = Vec::new();
            let Some(tracker) = tracker else { return };
            tracker.pick(s, burst, avg, cfg, &mut ids);
            let confidence = tracker.confidence();
            for id in ids {
                let size = s.size(id);
                let len = match size {
                    0 if avg > 0 && avg <= cfg.small_file_max => avg,
                    0 => cfg.first_chunk,
                    s if s <= cfg.small_file_max => s,
                    _ => cfg.first_chunk,
                };
                let path = s.path(id).clone();
                out.push(PrefetchRequest {
                    path: path.clone(),
                    offset: 0,
                    len,
                    confidence,
                });
                issued.push((path, origin));
            }
        }
        for (path, origin) in issued {
            if origin == Origin::Lane {
                self.stats.lane_requests += 1;
            } else {
                self.stats.pool_requests += 1;
            }
            self.remember(path, &key, origin);
        }
    }

    fn on_listing(&mut self, dir: &str, entries: &[(&str, u64)]) {
        self.observe_listing_sized(dir, entries);
    }

    fn set_request_latency(&mut self, ns: u64) {
        self.request_ns = ns;
    }

    /// Fraction of the store's bandwidth currently unused, 0..=1 (clamped; NaN = idle).
    fn set_spare_bandwidth(&mut self, spare: f64) {
        self.spare = if spare.is_nan() {
            1.0
        } else {
            spare.clamp(0.0, 1.0)
        };
    }

    fn on_feedback(&mut self, _job: JobId, path: &str, feedback: Feedback) {
        let used = matches!(feedback, Feedback::Used { .. } | Feedback::Late { .. });
        self.useful += FEEDBACK_WEIGHT * (f64::from(u8::from(used)) - self.useful);
        let Some(rec) = self.issued.remove(path) else {
            return;
        };
        let id = self.listing.set(&rec.key.1).and_then(|s| s.id(path));
        let tracker = match rec.origin {
            Origin::SharedPool => self.shared.get_mut(&rec.key.1),
            Origin::Pool => self.streams.get_mut(&rec.key).and_then(|s| s.set.as_mut()),
            Origin::Lane => {
                if !used {
                    let lanes = self.streams.get_mut(&rec.key).map(|s| &mut s.lanes);
                    if let Some(lane) =
                        lanes.and_then(|l| l.iter_mut().find(|l| l.is_pending(path)))
                    {
                        lane.drop_pending(path);
                        lane.penalize();
                    }
                }
                None
            }
        };
        if let Some(tracker) = tracker {
            if used {
                tracker.on_used(id);
            } else {
                tracker.on_wasted(id);
            }
        }
    }
}
