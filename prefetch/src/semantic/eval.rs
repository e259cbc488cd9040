//! Offline evaluator: replays demand events through a [`Predictor`] against an ideal
//! cache and counts what its prefetches were worth.
//!
//! Model. A *file read* is an access at offset 0 to a path other than the job's
//! previous file read (later chunks are the in-file readahead's business, not ours). A
//! prefetch request issued while handling a read of job `j` stays in the cache for the
//! next `window` file reads *of that job*; it is **used** if `j` reads the path in that
//! time (the read is then **covered**: it would not wait for the store), and
//! **wasted** otherwise, as are requests still pending when the trace ends. `window`
//! stands for the cache capacity left to prefetched data, in files. Prefetching always
//! arrives in time (ideal cache), so `coverage` is an upper bound on the fraction of
//! read latency hidden; `strata bench replay` adds timing.
//!
//! A request for a path already pending for that job is a no-op in a cache (counted in
//! `duplicates`, neither issued nor wasted). Feedback (`Used` on a covered read, `Wasted`
//! on expiry) is sent back to the predictor as a cache would.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use strata_types::JobId;

use crate::{AccessEvent, Feedback, Predictor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvalConfig {
    /// File reads (of the same job, or of all jobs when `shared`) a prefetched file stays
    /// cached.
    pub window: usize,
    /// One cache for all jobs: a prefetch is used by whichever job reads it first (data
    /// loader workers with one job id each), and the window counts everyone's reads.
    pub shared: bool,
}

impl Default for EvalConfig {
    fn default() -> Self {
        // 64 files: twice the default prediction depth, so a correct prediction at full
        // depth is still cached when it is read.
        EvalConfig {
            window: 64,
            shared: false,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalReport {
    /// Events replayed (chunks included).
    pub accesses: u64,
    /// File reads (offset-0 events whose path differs from the job's previous file read).
    pub file_reads: u64,
    pub demand_bytes: u64,
    /// Demand reads that found their path prefetched.
    pub covered: u64,
    pub issued: u64,
    pub used: u64,
    pub wasted: u64,
    pub used_bytes: u64,
    pub wasted_bytes: u64,
    pub duplicates: u64,
}

impl EvalReport {
    /// Used predictions / predictions issued (1 when none were issued: nothing was wrong).
    pub fn precision(&self) -> f64 {
        if self.issued == 0 {
            1.0
        } else {
            self.used as f64 / self.issued as f64
        }
    }

    /// File reads predicted beforehand / file reads.
    pub fn coverage(&self) -> f64 {
        if self.file_reads == 0 {
            0.0
        } else {
            self.covered as f64 / self.file_reads as f64
        }
    }

    /// Prefetched-but-unused bytes / demand bytes read.
    pub fn waste_ratio(&self) -> f64 {
        if self.demand_bytes == 0 {
            0.0
        } else {
            self.wasted_bytes as f64 / self.demand_bytes as f64
        }
    }
}

struct Pending {
    len: u64,
    expires: u64,
}

/// Replays `events` in order through `predictor` (see the module docs for the model).
pub fn evaluate(
    events: &[AccessEvent],
    predictor: &mut dyn Predictor,
    cfg: EvalConfig,
) -> EvalReport {
    let mut r = EvalReport::default();
    let mut job_seq: HashMap<JobId, u64> = HashMap::new();
    let mut job_last: HashMap<JobId, Arc<str>> = HashMap::new();
    let mut pending: PendingMap = HashMap::new();
    let mut expiry: ExpiryMap = HashMap::new();
    let mut out = Vec::new();
    for ev in events {
        r.accesses += 1;
        r.demand_bytes += ev.len;
        // The cache the read goes through: the job's own view, or everyone's.
        let who = if cfg.shared { JobId(u64::MAX) } else { ev.job };
        let new_file = ev.offset == 0 && job_last.get(&ev.job) != Some(&ev.path);
        if !new_file {
            out.clear();
            predictor.on_access(ev, &mut out);
            let now = job_seq.get(&who).copied().unwrap_or(0);
            record(&mut r, &mut pending, &mut expiry, who, now, cfg, &out);
            continue;
        }
        job_last.insert(ev.job, ev.path.clone());
        r.file_reads += 1;
        let seq = job_seq.entry(who).or_insert(0);
        *seq += 1;
        let now = *seq;
        // Expire this job's prefetches older than the window.
        let q = expiry.entry(who).or_default();
        while q.front().is_some_and(|(e, _)| *e < now) {
            let Some((e, path)) = q.pop_front() else {
                break;
            };
            let key = (who, path);
            if pending.get(&key).is_some_and(|p| p.expires == e) {
                if let Some(p) = pending.remove(&key) {
                    r.wasted += 1;
                    r.wasted_bytes += p.len;
                    predictor.on_feedback(ev.job, &key.1, Feedback::Wasted { bytes: p.len });
                }
            }
        }
        if let Some(p) = pending.remove(&(who, ev.path.clone())) {
            r.covered += 1;
            r.used += 1;
            let bytes = if ev.file_size > 0 {
                p.len.min(ev.file_size)
            } else {
                p.len
            };
            r.used_bytes += bytes;
            predictor.on_feedback(ev.job, &ev.path, Feedback::Used { bytes });
        }
        out.clear();
        predictor.on_access(ev, &mut out);
        record(&mut r, &mut pending, &mut expiry, who, now, cfg, &out);
    }
    // Whatever is still pending at the end was fetched for nothing.
    for p in pending.values() {
        r.wasted += 1;
        r.wasted_bytes += p.len;
    }
    r
}

type PendingMap = HashMap<(JobId, Arc<str>), Pending>;
type ExpiryMap = HashMap<JobId, VecDeque<(u64, Arc<str>)>>;

fn record(
    r: &mut EvalReport,
    pending: &mut PendingMap,
    expiry: &mut ExpiryMap,
    job: JobId,
    now: u64,
    cfg: EvalConfig,
    out: &[crate::PrefetchRequest],
) {
    for req in out {
        let key = (job, req.path.clone());
        if pending.contains_key(&key) {
            r.duplicates += 1;
            continue;
        }
        r.issued += 1;
        let expires = now + cfg.window as u64;
        pending.insert(
            key,
            Pending {
                len: req.len,
                expires,
            },
        );
        expiry
            .entry(job)
            .or_default()
            .push_back((expires, req.path.clone()));
    }
}
