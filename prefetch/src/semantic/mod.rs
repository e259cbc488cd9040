//! Semantic path prefetching: predicts the next files of interleaved multi-tenant jobs
//! from their *names*, for workloads where per-file readahead cannot help (many small
//! files, each read once and whole).
//!
//! Pipeline, per demand access (all pure logic: no I/O, no clock; time would come in
//! `AccessEvent::now_ns` and nothing here needs it; deterministic for a given input):
//!
//! 1. [`tokenize`]: the path becomes a template (`shards/train-{n}.tar`) and typed fields
//!    (numbers with their zero padding, dates, opaque hashes).
//! 2. [`cluster`]: the access joins the stream `(job, template)` and, inside it, the lane
//!    it continues (tenants sharing a job id and template stay apart).
//! 3. [`regularity`]: the lane confirms a stride (with rollover of an outer field and
//!    `-of-N` bounds), or lexical order in a directory listing
//!    ([`SemanticPredictor::observe_listing`]); [`permutation`] tests per-epoch shuffles
//!    over a listed set.
//! 4. The predictor emits up to K requests (whole small files, the first chunk of large
//!    ones) with a confidence. K adapts per lane to measured hits, globally to
//!    [`Feedback`](crate::Feedback), and to the store's spare bandwidth
//!    ([`Predictor::set_spare_bandwidth`](crate::Predictor::set_spare_bandwidth)). A lane that misses goes quiet and must
//!    re-confirm its rule: on a random workload nothing is confirmed, so nothing is
//!    fetched.
//!
//! [`eval`] replays events against an ideal cache to measure precision and coverage;
//! [`workloads`] generates the synthetic traces the tests and `examples/semantic_eval.rs`
//! use.

pub mod cluster;
pub mod eval;
pub mod listing;
pub mod permutation;
pub mod predictor;
pub mod regularity;
pub mod tokenize;
pub mod workloads;

pub use eval::{evaluate, EvalConfig, EvalReport};
pub use predictor::{SemanticPredictor, SemanticStats};
pub use tokenize::{tokenize, Field, FieldKind, TokenizedPath};

/// Tuning of [`SemanticPredictor`]. Every default carries its reason.
#[derive(Clone, Debug, PartialEq)]
pub struct SemanticConfig {
    /// Most paths a lane keeps requested ahead: 32 small files hide a 20 ms store
    /// latency for a reader consuming one file per 1.25 ms (with the 2x headroom), and
    /// bound the waste when a confirmed rule suddenly breaks to one window. Within it,
    /// the window is the smaller of the lane's confidence depth (doubling from
    /// `initial_depth` on hits) and what the measured request latency and the lane's
    /// own pace call for ([`predictor::latency_window`]).
    pub max_depth: u32,
    /// Multiple of the files consumed during one request that a lane keeps requested:
    /// 2 (see [`predictor::latency_window`] for why more than 1).
    pub latency_headroom: f64,
    /// Depth right after a rule is confirmed: 2, so a false confirmation costs two files.
    pub initial_depth: u32,
    /// Consecutive confirmations a stride or lexical step needs: 2 (one difference is
    /// what any two names have; two equal ones in a row are rare by chance: ~1/range).
    pub min_run: u32,
    /// Misses in a row after which a lane goes quiet and must re-confirm: 3, tolerating
    /// a skipped file or two without collapsing a good stream.
    pub miss_limit: u32,
    /// Lanes per `(job, template)` stream: 8 covers the usual 4-8 data-loader workers
    /// sharing one handle.
    pub max_lanes: usize,
    /// Largest field distance (L1) at which an access joins an existing lane: 1024 steps
    /// (a reader skipping ahead in one range stays in its lane; another tenant's range is
    /// usually farther).
    pub lane_gap: u64,
    /// Streams remembered (LRU): 4096 `(job, template)` pairs, a few hundred KiB.
    pub max_streams: usize,
    /// Files up to this size are prefetched whole: 8 MiB (one request; larger files are
    /// shards or checkpoints where the first chunk is what latency needs).
    pub small_file_max: u64,
    /// Bytes prefetched from the start of a large (or unknown-size) file: one cache-core
    /// block (1 MiB), the sequential readahead then takes over inside the file.
    pub first_chunk: u64,
    /// Significance of the per-epoch permutation test: 1% (a random reader is mistaken
    /// for a shuffled one in 1 of 100 trials, and each mistake costs a small pool).
    pub perm_alpha: f64,
    /// Fraction of a set read before a repeat means "new epoch" rather than "not a
    /// permutation": 95% (a job may skip a few files, e.g. a last partial batch).
    pub epoch_complete: f64,
    /// Unread prefetched members kept per set, at most: 4096 files...
    pub pool_max_files: usize,
    /// ...and 512 MiB: the pool must fit in the cache's fast tier, or it evicts itself.
    pub pool_max_bytes: u64,
    /// Pool bound before a whole epoch was seen, as a fraction of the epoch's reads: 4%,
    /// under the 5% waste budget even if the job samples only part of the set.
    pub unconfirmed_pool_frac: f64,
    /// Least probability that a pooled member is read before the cache drops it (from the
    /// learnt cache horizon): 0.8, the precision target for interleaved streams.
    pub pool_min_precision: f64,
    /// Pool size right after acceptance (once an epoch was seen): 4.
    pub pool_initial: u32,
    /// Pool growth per demand read after acceptance: 2 (the pool outgrows the reader, so
    /// coverage builds up within one epoch, but a false acceptance stays small until the
    /// next repeat rejects it).
    pub pool_growth: u32,
    /// Most pool requests per access: 16 (spreads a new epoch's pool refill over
    /// accesses instead of one burst of thousands).
    pub max_burst: u32,
    /// Listing entries remembered in total: 4M (ImageNet-1k is 1.28M), ~0.5 GiB worst case.
    pub max_listed_entries: usize,
    /// Requests with a lower confidence are not issued: 0.05.
    pub min_confidence: f32,
}

impl Default for SemanticConfig {
    fn default() -> Self {
        SemanticConfig {
            max_depth: 32,
            latency_headroom: 2.0,
            initial_depth: 2,
            min_run: 2,
            miss_limit: 3,
            max_lanes: 8,
            lane_gap: 1024,
            max_streams: 4096,
            small_file_max: 8 << 20,
            first_chunk: strata_types::DEFAULT_BLOCK_SIZE,
            perm_alpha: 0.01,
            epoch_complete: 0.95,
            pool_max_files: 4096,
            pool_max_bytes: 512 << 20,
            unconfirmed_pool_frac: 0.04,
            pool_min_precision: 0.8,
            pool_initial: 4,
            pool_growth: 2,
            max_burst: 16,
            max_listed_entries: 4_000_000,
            min_confidence: 0.05,
        }
    }
}
