//! Prefetch predictors: pure logic fed with access events, emitting prefetch requests.
//! The cache core (or the replay simulator) does the I/O; predictors never touch a store.
//! [`controller::AccessController`] owns the predictors, decides prefetches and their
//! priority, and tracks their outcomes: the mount and the replay both drive it.

pub mod controller;
pub mod gap_cycle;
pub mod semantic;
pub mod sequential;

pub use controller::{
    AccessController, Admission, ControllerConfig, Origin, Outcome, PrefetchOrder,
};

use std::sync::Arc;

use strata_types::{JobId, Pattern};

/// One demand read as a predictor sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessEvent {
    pub job: JobId,
    /// Path relative to the dataset root (`kv/<ns>/<hash>` for KV blocks).
    pub path: Arc<str>,
    pub offset: u64,
    pub len: u64,
    /// Size of the whole file/object, when known (0 if not).
    pub file_size: u64,
    pub now_ns: u64,
    /// The stream's pattern as classified by the cache core, when known.
    pub pattern: Pattern,
}

impl AccessEvent {
    /// A read of `len` bytes at `offset` of `path` (`file_size` bytes long) by `job`, at
    /// time 0 and of no known pattern (set `now_ns` and `pattern` where they matter).
    pub fn read(job: u64, path: &str, offset: u64, len: u64, file_size: u64) -> Self {
        Self {
            job: JobId(job),
            path: Arc::from(path),
            offset,
            len,
            file_size,
            now_ns: 0,
            pattern: Pattern::Unknown,
        }
    }
}

/// A byte range worth fetching ahead of demand.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefetchRequest {
    pub path: Arc<str>,
    pub offset: u64,
    pub len: u64,
    /// Estimated probability that the range is read soon (0..=1).
    pub confidence: f32,
}

/// What became of earlier prefetches, fed back so a predictor can adapt its depth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feedback {
    /// A prefetched range was read by demand.
    Used { bytes: u64 },
    /// A prefetched range was evicted (or expired) unread.
    Wasted { bytes: u64 },
    /// A prefetched range was read by demand before it landed: the reader waited on it,
    /// so the readahead ahead of it was too shallow for the link (given to sequential
    /// readahead only; a predictor that does not tell it apart treats it as `Used`).
    Late { bytes: u64 },
}

pub trait Predictor: Send {
    fn name(&self) -> &'static str;
    /// Observes a demand access and appends the ranges to fetch ahead to `out`.
    fn on_access(&mut self, event: &AccessEvent, out: &mut Vec<PrefetchRequest>);
    /// Outcome of an earlier request from this predictor for `path`.
    fn on_feedback(&mut self, _job: JobId, _path: &str, _feedback: Feedback) {}
    /// Hint: fraction of the store's bandwidth currently unused (0 = saturated, 1 = idle).
    /// Predictors may scale their depth with it; the default ignores it. The
    /// [`AccessController`] does not set it (measured a net loss; see its docs).
    fn set_spare_bandwidth(&mut self, _spare: f64) {}
    /// The store's measured time per request for a small object, ns (0: unknown):
    /// predictors of other files size how far ahead they fetch from it and from how
    /// fast the reader goes; the default ignores it.
    fn set_request_latency(&mut self, _ns: u64) {}
    /// The bytes the driver's store link can keep in flight (its measured window,
    /// bandwidth-delay product with headroom; 0: unknown): readahead may deepen to it
    /// when the reader waits on its prefetches ([`Feedback::Late`]); the default
    /// ignores it.
    fn set_link_window(&mut self, _bytes: u64) {}
    /// The bytes of unread prefetch the cache keeps (0: unknown): readahead deeper than
    /// that is evicted before the reader gets to it; the default ignores it.
    fn set_cache_window(&mut self, _bytes: u64) {}
    /// The names and sizes in directory `dir` (relative to the dataset root), as a
    /// listing returned them; the default ignores them.
    fn on_listing(&mut self, _dir: &str, _entries: &[(&str, u64)]) {}
}
