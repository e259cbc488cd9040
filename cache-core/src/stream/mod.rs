//! The access-stream tree: per-job streams at every level of the namespace.
//!
//! The tree mirrors the namespace a key names:
//!
//! ```text
//! dataset root ("train")            level 2: items are its directories
//!   └ directory ("train/part-3")    level 1: items are its files
//!       └ file ("train/part-3/shard-00042.tar")   level 0: items are its blocks
//! kv/<namespace>                    level 0: items are its KV blocks (prefix hashes)
//! ```
//!
//! A *stream* is one job's accesses under one node, so the node is keyed by `(job,
//! level, hash of the node's path)`: two jobs reading the same directory interleaved
//! never blur each other's order or popularity. Each stream holds a
//! [`StreamStats`] (a bounded window plus decayed counters, classified by
//! [`crate::classify`]), so state per node is O(1). Nodes are created on first access
//! and exist only as streams: there is no explicit parent pointer, the parent of a file
//! node is found by hashing its directory prefix, which keeps a node at ~100 bytes.
//!
//! Granularities feed each other: when a job's block stream in a file is classified, the
//! result is recorded on the job's directory stream (`child_hint`), and the next file
//! the job opens in that directory starts from that pattern. So the 2nd shard of a job
//! reading shards sequentially is prefetched from its first block, not after 16 blocks.
//!
//! Bounded memory: when the number of streams exceeds `max_streams`, the least recently
//! used half is dropped (an O(n) sweep every n/2 new streams: O(1) amortised). What a
//! dropped file stream learnt survives summarised in its directory's `child_hint`.
//! Bytes per tracked file are measured in `docs/PATTERNS.md`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use crate::access::AccessContext;
use crate::classify::{ClassifierConfig, Scratch, StreamStats, TestOutcome};
use crate::key::CacheKey;
use crate::pattern::Pattern;

/// The Fx hasher and the splitmix64 finaliser live in `strata-types` (the prefetch
/// predictors share them without linking the core); re-exported at their old paths.
pub use strata_types::hash::{hash_bytes, mix64, FxBuild, FxHasher};

/// A uniformly distributed, process-stable 64-bit hash of a cache key without its
/// version (no allocation; recomputed per call). The policy samples its stable subsets
/// with it, so its value is pinned: it is not [`CacheKey::content_hash`], and replacing
/// one by the other changes the policy's decisions (the table in [`crate::key`]).
#[inline]
pub fn key_hash(key: &CacheKey) -> u64 {
    match key {
        CacheKey::File(k) => mix64(hash_bytes(k.location.as_bytes()) ^ mix64(k.block)),
        CacheKey::Kv(k) => mix64(hash_bytes(k.namespace.as_bytes()) ^ hash_bytes(&k.hash)),
    }
}

/// The trailing decimal number of a name (`shard-00042.tar` -> 42), the index that
/// makes "files read in name order" a forward-adjacent step; names without digits get
/// their hash (never adjacent by chance in practice).
pub fn name_index(name: &str) -> u64 {
    let b = name.as_bytes();
    if hex_digest_like(name) {
        return hash_bytes(b);
    }
    let mut end = b.len();
    // skip an extension-like suffix of non-digits
    while end > 0 && !b[end - 1].is_ascii_digit() {
        end -= 1;
    }
    let mut start = end;
    while start > 0 && b[start - 1].is_ascii_digit() && end - start < 18 {
        start -= 1;
    }
    if start == end {
        return hash_bytes(b);
    }
    b[start..end]
        .iter()
        .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'))
}

/// Whether `name`'s stem (up to its first `.`) is a hex string with both digits and
/// letters (`3f`, `a7c9e1...`): a content hash or its fan-out prefix (git objects, a
/// model hub's or build cache's blob store), whose digits are no order. Read as a
/// decimal number, `3f`, `a3` and `03` all name item 3, so a lookup wandering over
/// 256 such directories stepped "forward" by 1-2 about every fifth visit and was taken
/// for a sequential scan (held-out `casstore`).
fn hex_digest_like(name: &str) -> bool {
    let stem = name.split('.').next().unwrap_or(name).as_bytes();
    stem.len() >= 2
        && stem.iter().all(u8::is_ascii_hexdigit)
        && stem.iter().any(u8::is_ascii_digit)
        && stem.iter().any(u8::is_ascii_alphabetic)
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct StreamId {
    job: u64,
    node: u64,
}

/// What the items of a stream are (for reports; the node id already separates them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Granularity {
    Blocks,
    Files,
    Dirs,
    KvBlocks,
}

/// One stream as `strata stats` shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StreamReport {
    pub job: u64,
    /// `blocks` (of a file), `files` (of a directory), `dirs` (of a dataset root) or
    /// `kv-blocks` (of a namespace).
    pub granularity: String,
    /// The file, directory, dataset root or namespace.
    pub name: String,
    pub pattern: Pattern,
    /// The test that decided the pattern, with its statistic, in words.
    pub decided_by: String,
    pub visits: u32,
    /// p-values of the sequential (binomial) and uniform-popularity (chi-square) tests
    /// on the evidence as it stands now.
    pub p_sequential: f64,
    pub p_uniform: f64,
    pub zipf_s: f64,
    /// Accesses (all jobs) since this stream was last touched.
    pub age: u64,
}

/// A p-value for people: `< 1e-12` below that (the tests' tails underflow to 0).
fn p_text(p: f64) -> String {
    if p < 1e-12 {
        "< 1e-12".to_string()
    } else {
        format!("= {p:.2e}")
    }
}

/// Words for the test behind a stream's pattern. The tests run on the evidence as it
/// stands now; where they disagree with the pattern (which changes only after
/// `hysteresis` tests agree), the words say so rather than quote p-values that
/// contradict the pattern shown beside them.
fn decided_by(stats: &StreamStats, now: &TestOutcome, cfg: &ClassifierConfig) -> String {
    let held = stats.pattern() != Pattern::Unknown
        && stats.visits() > cfg.min_samples
        && now.pattern != stats.pattern();
    if held {
        return format!(
            "held until {} tests agree: the test now says {} (binomial p {}, chi-square p {})",
            cfg.hysteresis,
            format!("{:?}", now.pattern).to_lowercase(),
            p_text(now.p_sequential),
            p_text(now.p_uniform)
        );
    }
    match stats.pattern() {
        Pattern::Unknown => format!(
            "no test yet ({} of {} steps needed)",
            stats.visits().saturating_sub(1),
            cfg.min_samples
        ),
        _ if stats.visits() <= cfg.min_samples => {
            "inherited from its sibling streams (too few steps of its own)".to_string()
        }
        Pattern::Sequential => format!(
            "binomial adjacency test rejected uniform order (p {} < {})",
            p_text(now.p_sequential),
            cfg.alpha
        ),
        Pattern::Skewed => format!(
            "chi-square rejected uniform popularity (p {} < {}), Zipf s = {:.2}",
            p_text(now.p_uniform),
            cfg.alpha,
            stats.zipf_s()
        ),
        Pattern::Random => format!(
            "neither test rejected (binomial p {}, chi-square p {})",
            p_text(now.p_sequential),
            p_text(now.p_uniform)
        ),
    }
}

const LEVEL_FILE: u64 = 0x0100_0000_0000_0000;
const LEVEL_DIR: u64 = 0x0200_0000_0000_0000;
const LEVEL_ROOT: u64 = 0x0300_0000_0000_0000;

struct Visit {
    before: Pattern,
    after: Pattern,
    repeat: bool,
    hint: Pattern,
    small_reads: bool,
    run_ahead: u64,
    run_bytes: u64,
    sweeping: bool,
    local: bool,
    reused: bool,
    reread: bool,
}

/// The share of a stream's reads that are small, as a moving average in 1/65536ths
/// with weight 1/16 for the newest read: it follows a change of habit within a few
/// dozen reads, and a stream is "small reads" once more than half are.
#[derive(Clone, Copy, Debug, Default)]
struct SmallShare(u16);

impl SmallShare {
    fn record(&mut self, read_len: u64) {
        let s = u32::from(self.0);
        let target = if read_len <= crate::granularity::SMALL_READ_BYTES {
            65535
        } else {
            0
        };
        self.0 = ((s * 15 + target) / 16) as u16;
    }

    fn mostly_small(self) -> bool {
        self.0 > 32768
    }
}

/// Steps of [`RunLength`]'s estimate, in 1/256ths of log2 of a run's bytes: up 3/8
/// when a finished run is longer, down 1/8 when shorter, so it settles where one run
/// in four is longer: the 75th percentile. A run longer than the unit fetched for it
/// costs a second GET (20 ms) where a larger unit costs microseconds of link and some
/// cache space, so most runs should fit; the median (a geometric mean of runs, tried
/// first) left one member in two of the held-out zip archive to a second fetch. Steps
/// of an eighth of a doubling follow a change of record sizes within a few dozen runs.
const RUN_STEP_UP: u32 = 96;
const RUN_STEP_DOWN: u32 = 32;

/// How far a stream reads on after each jump: a zip member, a record of a packed
/// file or an index entry's row is read in several pieces, each starting where the
/// previous one ended (a *run*), at a random place of a large file. The typical run is
/// a streaming 75th percentile of finished runs' bytes ([`RUN_STEP_UP`]), in log2 so
/// the log-normal sizes of such records do not swing it; a run still going past it is
/// expected to go on as far again (the doubling of readahead, for the tail).

#[derive(Clone, Copy, Debug, Default)]
struct RunLength {
    /// The last read: where it started and ended.
    start: u64,
    end: u64,
    /// Bytes of the run the last read belongs to, up to its end (0: none yet).
    run: u64,
    /// Typical run (the 75th percentile), as log2 of its bytes in 1/256ths, plus one (0:
    /// no run ended yet).
    typical_log: u32,
    /// The same in bytes.
    typical: u64,
}

impl RunLength {
    /// Records a read of `len` bytes at `offset` (each block of a read spanning several
    /// is recorded with the same read) and returns the bytes the stream is expected to
    /// read from `offset` on: at least `len`.
    fn record(&mut self, offset: u64, len: u64) -> u64 {
        let end = offset.saturating_add(len);
        let before = if self.run > 0 && offset == self.start && end == self.end {
            // The same read, seen again for its next block.
            self.run.saturating_sub(end - offset)
        } else if self.run > 0 && offset == self.end {
            let before = self.run;
            self.run = self.run.saturating_add(len);
            before
        } else {
            if self.run > 0 {
                self.finish(self.run);
            }
            self.run = len;
            0
        };
        self.start = offset;
        self.end = end;
        len.max(self.typical.saturating_sub(before)).max(before)
    }

    fn finish(&mut self, run: u64) {
        let log = ((run.max(1) as f64).log2() * 256.0) as u32 + 1;
        self.typical_log = if self.typical_log == 0 {
            log
        } else if log > self.typical_log {
            (self.typical_log + RUN_STEP_UP).min(log)
        } else {
            self.typical_log
                .saturating_sub(RUN_STEP_DOWN)
                .max(log)
                .max(1)
        };
        self.typical = (f64::from(self.typical_log - 1) / 256.0).exp2() as u64;
    }
}

/// Reads of a stream remembered by [`Sweep`]: 8, enough for the interleaved pieces of
/// several readers of one stream (4 tensor-parallel ranks, each reading a slice of every
/// row, are one stream when they run as one process group).
const SWEEP_READS: usize = 8;
/// How far past the end of a remembered read a small read may start and still be a
/// step of a sweep, in 4 KiB pages: 16, i.e. 64 KiB ([`crate::granularity::SMALL_READ_BYTES`]):
/// a row of a checkpoint's weight matrix read a slice at a time is a few KiB; a page
/// lookup lands anywhere in a file far larger than that.
const SWEEP_GAP_PAGES: u32 = 16;

/// Whether a stream of small reads sweeps forward through the file with gaps: three in
/// four of its reads that neither continue the previous read (a run, [`RunLength`]) nor
/// repeat it start a little past the end of one of its last [`SWEEP_READS`] reads. Such a
/// stream reads every part of the blocks it passes (strided slices, interleaved
/// readers), so it is fetched in whole blocks, not one small unit per piece (held-out
/// `tpslice`: 6,341 GETs of 4-8 KiB where 90 blocks held it all). Random page lookups
/// (a B-tree's pages anywhere in a large file) are not sweeps; a zip member read in
/// pieces is a run, which [`RunLength`] sizes.
#[derive(Clone, Copy, Debug, Default)]
struct Sweep {
    /// End pages (4 KiB) of the last reads, plus one (0: empty), a ring.
    ends: [u32; SWEEP_READS],
    /// Blocks of the same reads, plus one, modulo 2^16 (0: empty; two blocks 64 Ki
    /// apart taken for one another only make a jump look local once).
    blocks: [u16; SWEEP_READS],
    next: u8,
    /// Share of the jumps that were sweep steps, a moving average in 1/65536ths with
    /// weight 1/16 for the newest (as [`SmallShare`]).
    share: u16,
    /// Share of those jumps that landed in the block of one of the last reads, the same
    /// moving average (see [`Sweep::local`]).
    near: u16,
}

impl Sweep {
    /// Records a small read `offset..end` that is not the previous read again
    /// (`continues`: it starts where the previous read ended).
    fn record(&mut self, offset: u64, end: u64, continues: bool, block: u64) {
        let page = |b: u64| u32::try_from(b >> 12).unwrap_or(u32::MAX);
        let block = (block % 0xffff) as u16 + 1;
        if !continues {
            let near: u32 = if self.blocks.contains(&block) {
                65535
            } else {
                0
            };
            self.near = ((u32::from(self.near) * 15 + near) / 16) as u16;
            let at = page(offset);
            let step = self.ends.iter().any(|&e| {
                e != 0 && at.saturating_add(1) >= e && at.saturating_add(1) - e <= SWEEP_GAP_PAGES
            });
            let target: u32 = if step { 65535 } else { 0 };
            self.share = ((u32::from(self.share) * 15 + target) / 16) as u16;
        }
        self.ends[usize::from(self.next)] = page(end.saturating_sub(1)).saturating_add(1);
        self.blocks[usize::from(self.next)] = block;
        self.next = (self.next + 1) % SWEEP_READS as u8;
    }

    /// Three in four, not one in two: SQLite range scans through an index (held-out
    /// `sqlrange`) step from leaf page to leaf page about half the time between their
    /// table lookups, and fetched whole at one in two their blocks took the cache's
    /// space from the pages (JCT +6-31%); the ranks' slices step nearly always.
    fn sweeping(&self) -> bool {
        self.share > 49152
    }

    /// Three in four of the stream's jumps land in a block one of its last reads read:
    /// small reads clustered within blocks (a graph index's beam search expanding the
    /// nodes of one region, page by page), which a whole block serves where one unit
    /// per page costs a GET each. Page lookups spread over a file land in a recent block
    /// about as often as the last reads' blocks are a share of the file's.
    fn local(&self) -> bool {
        self.near > 49152
    }
}

struct Node {
    /// The stream this slot holds (to rebuild the index when pruning).
    id: StreamId,
    /// The path (or KV namespace) of the access that created the stream, shared with
    /// the key that carried it (no copy): names the stream in `strata stats`.
    label: Arc<str>,
    granularity: Granularity,
    stats: StreamStats,
    /// Last pattern a child stream of this job under this node was classified as.
    child_hint: Pattern,
    last_tick: u64,
    /// Reads of this stream that were small (file and KV streams; others record none).
    small: SmallShare,
    /// How far the stream reads after each jump (file streams with read offsets).
    runs: RunLength,
    /// Whether its small reads sweep forward with gaps (file streams with read offsets).
    sweep: Sweep,
}

/// Cross-job summary of one file / namespace node: who read it last and when another
/// job last did, so concurrent readers are seen.
#[derive(Clone, Copy)]
struct Share {
    job: u64,
    tick: u64,
    shared_tick: u64,
}

/// Tunables of the tree.
#[derive(Clone, Debug)]
pub struct TreeConfig {
    pub classifier: ClassifierConfig,
    /// Streams kept before the least recently used half is dropped: 65,536, i.e. a few
    /// MiB of state, enough for thousands of concurrent jobs x their open files.
    pub max_streams: usize,
    /// Accesses (all jobs) within which a second job reading the same file makes it
    /// *shared*: 65,536 until the policy knows how many blocks the cache holds, then
    /// that number (see [`StreamTree::set_share_window`]): readers trailing each other by
    /// less than a cache's worth of accesses are served by recency, and workers that
    /// take turns on a file once per epoch are not "sharing" it.
    pub share_window: u64,
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig {
            classifier: ClassifierConfig::default(),
            max_streams: 1 << 16,
            share_window: 1 << 16,
        }
    }
}

/// The patterns of the streams one access belongs to, from fine to coarse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Blocks within the file (or KV blocks within the namespace), for this job.
    pub blocks: Pattern,
    /// Files within the directory, for this job.
    pub files: Pattern,
    /// Directories within the dataset root, for this job.
    pub dirs: Pattern,
    /// The access repeats the job's previous block of this file (same visit).
    pub repeat: bool,
    /// Another job read the same file (or KV namespace) within the sharing window:
    /// the data is being consumed by several readers at once.
    pub shared: bool,
    /// Most of this job's recent reads of the file were small (at most
    /// [`crate::granularity::SMALL_READ_BYTES`]): a database's page lookups, not the
    /// pieces at the ends of larger reads (an HDF5 slice split at a chunk boundary).
    pub small_reads: bool,
    /// Bytes this job is expected to read of the file from this read's offset on,
    /// reading on where each read ended ([`RunLength`]): at least the read's own length;
    /// 0 where unknown (no read offset, or not a file). A miss in units fetches a unit
    /// holding them, not one piece at a time.
    pub run_ahead: u64,
    /// Bytes of this job's current contiguous run of the file up to this read's end
    /// ([`RunLength`]); 0 where unknown (no read offset, or not a file).
    pub run_bytes: u64,
    /// This job's small reads of the file sweep forward through it with gaps
    /// ([`Sweep`]): it reads every part of the blocks it passes, so a miss fetches the
    /// block, not a unit.
    pub sweeping: bool,
    /// This job's small reads of the file come back to the blocks of its last few reads
    /// (`Sweep::local`): a miss fetches the block, not a unit.
    pub block_local: bool,
    /// This job reads the file's blocks in order within each visit, but some blocks
    /// visit after visit ([`crate::classify::StreamStats::reused`]): retention ranks
    /// them by frequency ([`Self::retention`]).
    pub blocks_reused: bool,
    /// This job's files of the directory are read in no order and without skew, but
    /// again and again ([`crate::classify::StreamStats::reread`]).
    pub files_reread: bool,
}

impl Observation {
    /// The pattern that decides retention: skewed anywhere means popular items exist;
    /// otherwise the finest classified level.
    pub fn retention(&self) -> Pattern {
        // Data several jobs read at about the same time is popular by definition: the
        // trailing readers need what the leading one just read.
        if self.shared {
            return Pattern::Skewed;
        }
        // Sequential within each visit, skewed across them: hot columns of a columnar
        // file, read by query after query (held-out `feather`: as scan data, the hot
        // columns left the recency queue and the hash sample between queries; LFU kept
        // them). docs/BENCHMARKS.md "Blocks read in order and reused".
        if self.blocks == Pattern::Sequential && self.blocks_reused {
            return Pattern::Skewed;
        }
        let levels = [self.blocks, self.files, self.dirs];
        if levels.contains(&Pattern::Skewed) {
            return Pattern::Skewed;
        }
        levels
            .into_iter()
            .find(|p| *p != Pattern::Unknown)
            .unwrap_or(Pattern::Unknown)
    }
}

/// Node paths of a key.
struct Path<'a> {
    file: &'a str,
    dir: Option<&'a str>,
    root: Option<&'a str>,
    file_name: &'a str,
    dir_name: &'a str,
}

fn split(location: &str) -> Path<'_> {
    match location.rfind('/') {
        None => Path {
            file: location,
            dir: Some(""),
            root: None,
            file_name: location,
            dir_name: "",
        },
        Some(i) => {
            let dir = &location[..i];
            let first = location.find('/').unwrap_or(i);
            let root = &location[..first];
            let dir_name = dir.rsplit('/').next().unwrap_or(dir);
            Path {
                file: location,
                dir: Some(dir),
                root: if first < i { Some(root) } else { None },
                file_name: &location[i + 1..],
                dir_name,
            }
        }
    }
}

/// Upper bound of the node slab's and index's initial capacity: 32,768 streams (the
/// default `max_streams / 2`; ~3.5 MiB of slab, only touched as streams are created).
const NODES_PRESIZE_MAX: usize = 1 << 15;

/// The access-stream tree.
pub struct StreamTree {
    cfg: TreeConfig,
    /// Stream -> slot in `nodes`. The nodes live in a dense slab rather than in the
    /// map itself: the map's probes then walk 24-byte entries instead of 112-byte
    /// ones, and new nodes are written to consecutive memory instead of scattered
    /// over the whole table (each first write to a table page was a page fault: with
    /// the nodes in the map, ~10% of a policy replay).
    index: HashMap<StreamId, u32, FxBuild>,
    nodes: Vec<Node>,
    shares: HashMap<u64, Share, FxBuild>,
    scratch: Scratch,
    ticks: Vec<u64>,
    tick: u64,
    dropped: u64,
}

impl Default for StreamTree {
    fn default() -> Self {
        Self::new(TreeConfig::default())
    }
}

impl StreamTree {
    pub fn new(cfg: TreeConfig) -> Self {
        // Pre-sized to half of `max_streams` (the size a prune leaves): growing through
        // every power of two below it (rehashing each entry, copying the slab, faulting
        // in each intermediate table) was a visible share of a policy replay. Capped so
        // a huge `max_streams` does not reserve memory the tree may never use.
        let presize = (cfg.max_streams / 2).min(NODES_PRESIZE_MAX);
        StreamTree {
            cfg,
            index: HashMap::with_capacity_and_hasher(presize, FxBuild::default()),
            nodes: Vec::with_capacity(presize),
            shares: HashMap::default(),
            scratch: Scratch::default(),
            ticks: Vec::new(),
            tick: 0,
            dropped: 0,
        }
    }

    /// Streams currently tracked.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Sets the sharing window (in accesses). The policy sets it to the number of
    /// blocks the cache holds: a second job re-reading within that many accesses is
    /// served by keeping recent data, one further away is not.
    pub fn set_share_window(&mut self, accesses: u64) {
        self.cfg.share_window = accesses.max(1);
    }

    /// Streams dropped so far by the memory bound.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Approximate heap bytes of the tree (entries, their windows, table slack).
    pub fn approx_bytes(&self) -> usize {
        let entry = std::mem::size_of::<(StreamId, u32)>() + 1;
        let share = std::mem::size_of::<(u64, Share)>() + 1;
        let windows: usize = self
            .nodes
            .iter()
            .map(|n| n.stats.window_capacity() * 4)
            .sum();
        self.index.capacity() * entry
            + self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.shares.capacity() * share
            + windows
    }

    fn is_shared(&self, node: u64) -> bool {
        self.shares.get(&node).is_some_and(|s| {
            s.shared_tick > 0 && self.tick - s.shared_tick <= self.cfg.share_window
        })
    }

    fn share(&mut self, job: u64, node: u64) -> bool {
        let tick = self.tick;
        let w = self.cfg.share_window;
        let s = self.shares.entry(node).or_insert(Share {
            job,
            tick,
            shared_tick: 0,
        });
        if s.job != job {
            if tick.saturating_sub(s.tick) <= w {
                s.shared_tick = tick;
            }
            s.job = job;
        }
        s.tick = tick;
        s.shared_tick > 0 && tick - s.shared_tick <= w
    }

    /// Records a demand access and returns the patterns of its streams.
    pub fn observe(&mut self, key: &CacheKey, ctx: &AccessContext) -> Observation {
        self.tick += 1;
        let job = ctx.job.0;
        let mut obs = Observation::default();
        match key {
            CacheKey::File(k) => {
                let p = split(&k.location);
                let file_h = hash_bytes(p.file.as_bytes());
                let block_fp = mix64(k.block) as u32;
                obs.shared = self.share(job, file_h);
                if let Some(dir) = p.dir {
                    let dir_h = hash_bytes(dir.as_bytes());
                    if let Some(root) = p.root {
                        let root_h = hash_bytes(root.as_bytes());
                        let v = self.visit(
                            (job, LEVEL_ROOT ^ root_h),
                            (Granularity::Dirs, &k.location),
                            Pattern::Unknown,
                            name_index(p.dir_name),
                            dir_h as u32,
                            (0, None),
                        );
                        obs.dirs = v.after;
                    }
                    let v = self.visit(
                        (job, LEVEL_DIR ^ dir_h),
                        (Granularity::Files, &k.location),
                        Pattern::Unknown,
                        name_index(p.file_name),
                        file_h as u32,
                        (0, None),
                    );
                    obs.files = v.after;
                    obs.files_reread = v.reread;
                    let same_file = v.repeat;
                    let v = self.visit(
                        (job, LEVEL_FILE ^ file_h),
                        (Granularity::Blocks, &k.location),
                        v.hint,
                        k.block,
                        block_fp,
                        (ctx.read_len, ctx.read_offset),
                    );
                    // Same visit only if the job's previous read in this directory was
                    // this file and its previous read of this file was this block.
                    obs.repeat = v.repeat && same_file;
                    obs.blocks = v.after;
                    obs.small_reads = v.small_reads;
                    obs.run_ahead = v.run_ahead;
                    obs.run_bytes = v.run_bytes;
                    obs.sweeping = v.sweeping;
                    obs.block_local = v.local;
                    obs.blocks_reused = v.reused;
                    if v.after != v.before && v.after != Pattern::Unknown {
                        if let Some(d) = self.node_mut(StreamId {
                            job,
                            node: LEVEL_DIR ^ dir_h,
                        }) {
                            d.child_hint = v.after;
                        }
                    }
                } else {
                    let v = self.visit(
                        (job, LEVEL_FILE ^ file_h),
                        (Granularity::Blocks, &k.location),
                        Pattern::Unknown,
                        k.block,
                        block_fp,
                        (ctx.read_len, ctx.read_offset),
                    );
                    obs.repeat = v.repeat;
                    obs.blocks = v.after;
                    obs.small_reads = v.small_reads;
                    obs.run_ahead = v.run_ahead;
                    obs.run_bytes = v.run_bytes;
                    obs.sweeping = v.sweeping;
                    obs.block_local = v.local;
                    obs.blocks_reused = v.reused;
                }
            }
            CacheKey::Kv(k) => {
                let ns_h = hash_bytes(k.namespace.as_bytes()) ^ 0x6b76;
                let h = hash_bytes(&k.hash);
                obs.shared = self.share(job, ns_h);
                // Prefix hashes carry no order: index = hash, so never adjacent.
                let v = self.visit(
                    (job, LEVEL_FILE ^ ns_h),
                    (Granularity::KvBlocks, &k.namespace),
                    Pattern::Unknown,
                    h,
                    h as u32,
                    (ctx.read_len, None),
                );
                obs.repeat = v.repeat;
                obs.blocks = v.after;
                obs.small_reads = v.small_reads;
            }
        }
        if self.nodes.len() > self.cfg.max_streams {
            self.prune();
        }
        if self.shares.len() > self.cfg.max_streams {
            let cut = self.tick.saturating_sub(self.cfg.share_window);
            self.shares.retain(|_, s| s.tick >= cut);
            if self.shares.len() > self.cfg.max_streams / 2 {
                self.shares.clear();
            }
        }
        obs
    }

    fn visit(
        &mut self,
        (job, node): (u64, u64),
        (granularity, label): (Granularity, &Arc<str>),
        prior: Pattern,
        idx: u64,
        fp: u32,
        (read_len, read_offset): (u64, Option<u64>),
    ) -> Visit {
        let tick = self.tick;
        let id = StreamId { job, node };
        let slot = match self.index.entry(id) {
            Entry::Occupied(e) => *e.get() as usize,
            Entry::Vacant(e) => {
                let slot = self.nodes.len();
                e.insert(slot as u32);
                self.nodes.push(Node {
                    id,
                    label: label.clone(),
                    granularity,
                    stats: StreamStats::new(prior),
                    child_hint: Pattern::Unknown,
                    last_tick: tick,
                    small: SmallShare::default(),
                    runs: RunLength::default(),
                    sweep: Sweep::default(),
                });
                slot
            }
        };
        let n = &mut self.nodes[slot];
        n.last_tick = tick;
        if read_len > 0 {
            n.small.record(read_len);
        }
        let run_ahead = match read_offset {
            Some(offset) if read_len > 0 => {
                let end = offset.saturating_add(read_len);
                let r = &n.runs;
                let again = r.run > 0 && offset == r.start && end == r.end;
                let continues = r.run > 0 && offset == r.end;
                if !again && read_len <= crate::granularity::SMALL_READ_BYTES {
                    n.sweep.record(offset, end, continues, idx);
                }
                n.runs.record(offset, read_len)
            }
            _ => 0,
        };
        let before = n.stats.pattern();
        let repeat = n
            .stats
            .observe(idx, fp, &self.cfg.classifier, &mut self.scratch);
        Visit {
            before,
            after: n.stats.pattern(),
            repeat,
            hint: n.child_hint,
            small_reads: n.small.mostly_small(),
            run_ahead,
            run_bytes: if run_ahead > 0 { n.runs.run } else { 0 },
            sweeping: n.sweep.sweeping(),
            local: n.sweep.local(),
            reused: n.stats.reused(),
            reread: n.stats.reread(),
        }
    }

    /// The current patterns of `key`'s streams for `job`, without recording anything.
    pub fn lookup(&self, key: &CacheKey, ctx: &AccessContext) -> Observation {
        let job = ctx.job.0;
        let get = |node: u64| {
            self.index
                .get(&StreamId { job, node })
                .map(|&slot| &self.nodes[slot as usize])
                .map(|n| {
                    (
                        n.stats.pattern(),
                        n.child_hint,
                        n.small.mostly_small(),
                        n.stats.reused(),
                        n.stats.reread(),
                    )
                })
        };
        let mut obs = Observation::default();
        match key {
            CacheKey::File(k) => {
                let p = split(&k.location);
                let file_h = hash_bytes(p.file.as_bytes());
                obs.shared = self.is_shared(file_h);
                let mut hint = Pattern::Unknown;
                if let Some(dir) = p.dir {
                    if let Some(root) = p.root {
                        obs.dirs = get(LEVEL_ROOT ^ hash_bytes(root.as_bytes()))
                            .map_or(Pattern::Unknown, |x| x.0);
                    }
                    if let Some((p, h, _, _, reread)) = get(LEVEL_DIR ^ hash_bytes(dir.as_bytes()))
                    {
                        obs.files = p;
                        obs.files_reread = reread;
                        hint = h;
                    }
                }
                let file = get(LEVEL_FILE ^ file_h);
                obs.blocks = file.map_or(hint, |x| x.0);
                obs.small_reads = file.is_some_and(|x| x.2);
                obs.blocks_reused = file.is_some_and(|x| x.3);
            }
            CacheKey::Kv(k) => {
                let ns_h = hash_bytes(k.namespace.as_bytes()) ^ 0x6b76;
                let ns = get(LEVEL_FILE ^ ns_h);
                obs.blocks = ns.map_or(Pattern::Unknown, |x| x.0);
                obs.small_reads = ns.is_some_and(|x| x.2);
                obs.shared = self.is_shared(ns_h);
            }
        }
        obs
    }

    /// The finest classified pattern of `key`'s streams for `job`: `lookup(key,
    /// ctx).blocks` if classified, else `.files` (what the prefetch controller is told,
    /// [`crate::tracker::AccessTracker::pattern_of`]), except that blocks read in order
    /// within each visit and reused across visits (`blocks_reused`) are `Skewed`, as
    /// [`Observation::retention`] ranks them: popular data whose visits may stop
    /// anywhere, not a scan to read far ahead of (see the sequential predictor's
    /// `skewed_run_multiple`). Computed without the parts of
    /// [`Self::lookup`] it does not need: the file's stream is looked up first and the
    /// directory's (its pattern, and its hint for a file not tracked yet) only when the
    /// file's is not classified; the root's stream and the sharing state never. The
    /// replay asks this once per demand read of every `strata` policy, where the full
    /// lookup (three path hashes, three probes and the split at every `/`) was 9-18% of
    /// its instructions.
    pub fn finest_pattern(&self, key: &CacheKey, ctx: &AccessContext) -> Pattern {
        let job = ctx.job.0;
        let get = |node: u64| {
            self.index
                .get(&StreamId { job, node })
                .map(|&slot| &self.nodes[slot as usize])
        };
        match key {
            CacheKey::File(k) => {
                let loc: &str = &k.location;
                let file = get(LEVEL_FILE ^ hash_bytes(loc.as_bytes()));
                if let Some(f) = file {
                    let p = f.stats.pattern();
                    if p == Pattern::Sequential && f.stats.reused() {
                        return Pattern::Skewed;
                    }
                    if p != Pattern::Unknown {
                        return p;
                    }
                }
                // `split`'s directory: everything before the last `/`, else "".
                let dir = match loc.as_bytes().iter().rposition(|&b| b == b'/') {
                    Some(i) => &loc[..i],
                    None => "",
                };
                let Some(d) = get(LEVEL_DIR ^ hash_bytes(dir.as_bytes())) else {
                    return Pattern::Unknown;
                };
                // `lookup`'s blocks: the file's pattern (Unknown here) if it is tracked,
                // else the directory's hint; then its files.
                let blocks = if file.is_some() {
                    Pattern::Unknown
                } else {
                    d.child_hint
                };
                if blocks != Pattern::Unknown {
                    blocks
                } else {
                    d.stats.pattern()
                }
            }
            CacheKey::Kv(k) => {
                let ns_h = hash_bytes(k.namespace.as_bytes()) ^ 0x6b76;
                get(LEVEL_FILE ^ ns_h).map_or(Pattern::Unknown, |n| n.stats.pattern())
            }
        }
    }

    /// The `max` most recently active streams, newest first, each with its pattern and
    /// the evidence of the tests as they stand now (for `strata stats`). O(streams).
    pub fn report(&self, max: usize) -> Vec<StreamReport> {
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.sort_unstable_by_key(|&i| std::cmp::Reverse(self.nodes[i].last_tick));
        order.truncate(max);
        let mut scratch = Scratch::default();
        order
            .into_iter()
            .map(|i| {
                let n = &self.nodes[i];
                let (granularity, name) = match n.granularity {
                    Granularity::Dirs => {
                        ("dirs", n.label.split('/').next().unwrap_or("").to_string())
                    }
                    Granularity::Files => (
                        "files",
                        n.label.rsplit_once('/').map_or("", |(d, _)| d).to_string(),
                    ),
                    Granularity::Blocks => ("blocks", n.label.to_string()),
                    Granularity::KvBlocks => ("kv-blocks", n.label.to_string()),
                };
                let test = n.stats.test_now(&self.cfg.classifier, &mut scratch);
                StreamReport {
                    job: n.id.job,
                    granularity: granularity.to_string(),
                    name,
                    pattern: n.stats.pattern(),
                    decided_by: decided_by(&n.stats, &test, &self.cfg.classifier),
                    visits: n.stats.visits(),
                    p_sequential: test.p_sequential,
                    p_uniform: test.p_uniform,
                    zipf_s: n.stats.zipf_s(),
                    age: self.tick - n.last_tick,
                }
            })
            .collect()
    }

    /// Drops the least recently used half of the streams.
    fn prune(&mut self) {
        self.ticks.clear();
        self.ticks.extend(self.nodes.iter().map(|n| n.last_tick));
        let mid = self.ticks.len() / 2;
        let (_, median, _) = self.ticks.select_nth_unstable(mid);
        let cut = *median;
        let before = self.nodes.len();
        self.nodes.retain(|n| n.last_tick >= cut);
        self.index.clear();
        for (slot, n) in self.nodes.iter().enumerate() {
            self.index.insert(n.id, slot as u32);
        }
        self.dropped += (before - self.nodes.len()) as u64;
    }

    fn node_mut(&mut self, id: StreamId) -> Option<&mut Node> {
        let slot = *self.index.get(&id)? as usize;
        self.nodes.get_mut(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::JobId;

    fn ctx(job: u64) -> AccessContext {
        AccessContext::demand(JobId(job), 0)
    }

    /// `finest_pattern` is `lookup`'s blocks-else-files for every key and job, tracked
    /// or not (blocks in order and reused: skewed): sequential and shuffled streams over
    /// nested, flat and root-level files, KV namespaces, and probes of untracked files
    /// in tracked directories.
    #[test]
    fn finest_pattern_is_lookups_blocks_else_files() {
        let mut t = StreamTree::default();
        let locs = [
            "ds/train/a/f-000.bin",
            "ds/train/a/f-001.bin",
            "ds/train/b/f-002.bin",
            "flat/part-0.parquet",
            "root.bin",
            "other/x.db",
        ];
        let probe = |t: &StreamTree, key: &CacheKey, job: u64| {
            let o = t.lookup(key, &ctx(job));
            let want = if o.blocks == Pattern::Sequential && o.blocks_reused {
                Pattern::Skewed
            } else if o.blocks != Pattern::Unknown {
                o.blocks
            } else {
                o.files
            };
            assert_eq!(t.finest_pattern(key, &ctx(job)), want, "{key:?} job {job}");
        };
        let mut classified = 0;
        for i in 0..4000u64 {
            let r = mix64(i);
            let job = 1 + r % 3;
            let key = if r.is_multiple_of(11) {
                CacheKey::kv(
                    if r.is_multiple_of(2) { "m" } else { "n" },
                    (r >> 8).to_le_bytes().to_vec(),
                )
            } else {
                let loc = locs[((i / 40) as usize + job as usize) % locs.len()];
                // Job 1 reads in order, job 2 shuffled, job 3 a few hot blocks.
                let block = match job {
                    1 => i % 64,
                    2 => (r >> 16) % 64,
                    _ => (r >> 16) % 4,
                };
                CacheKey::file(loc, "v", block)
            };
            t.observe(&key, &ctx(job).with_read_len(4096));
            for job in 1..=4 {
                probe(&t, &key, job);
                for loc in locs {
                    probe(&t, &CacheKey::file(loc, "v", 7), job);
                }
                probe(&t, &CacheKey::file("ds/train/a/f-999.bin", "v", 0), job);
                probe(&t, &CacheKey::file("nowhere/f.bin", "v", 0), job);
                probe(&t, &CacheKey::kv("m", vec![1, 2, 3]), job);
            }
            classified += usize::from(t.finest_pattern(&key, &ctx(job)) != Pattern::Unknown);
        }
        assert!(
            classified > 1000,
            "the probes saw classified streams: {classified}"
        );
    }

    #[test]
    fn name_index_takes_trailing_number() {
        assert_eq!(name_index("shard-00042.tar"), 42);
        assert_eq!(name_index("img_7.jpg"), 7);
        assert_eq!(name_index("part-3"), 3);
        assert_eq!(name_index("00042"), 42);
        assert_ne!(name_index("alpha"), name_index("beta"));
        // Hex digests and their fan-out prefixes are names, not numbers.
        assert_ne!(name_index("3f"), 3);
        assert_ne!(name_index("a3"), 3);
        assert_ne!(name_index("3f"), name_index("a3"));
        assert_ne!(name_index("9e107d9d372bb6826bd81d3542a419d6.blob"), 6);
    }

    /// Lookups of blobs in a content-addressed store fanned out over 256 hex
    /// directories, in an order that has nothing to do with the names: the directory
    /// level is not a scan (read as numbers, `3f`, `a3` and `03` were all directory 3,
    /// and the random walk stepped "forward" often enough to be called sequential).
    #[test]
    fn lookups_over_hex_fan_out_directories_are_not_a_scan() {
        let mut t = StreamTree::default();
        let mut rng = 0x5eed_u64;
        let mut sequential = 0;
        for i in 0..2000 {
            rng = mix64(rng + i);
            let dir = rng % 256;
            let path = format!("store/objects/{dir:02x}/{:016x}", mix64(rng));
            let o = t.observe(&CacheKey::file(path, "v", 0), &ctx(1));
            sequential += usize::from(o.dirs == Pattern::Sequential);
        }
        assert_eq!(sequential, 0, "the directory stream was called sequential");
    }

    #[test]
    fn a_stream_of_page_reads_is_small_reads_and_one_of_slices_is_not() {
        let mut t = StreamTree::default();
        let page = ctx(1).with_read_len(4096);
        let mut o = Observation::default();
        for i in 0..24u64 {
            o = t.observe(&CacheKey::file("db/kv.db", "v", (i * 7) % 40), &page);
        }
        assert!(o.small_reads, "24 page lookups");
        assert!(
            t.lookup(&CacheKey::file("db/kv.db", "v", 0), &page)
                .small_reads
        );
        // 256 KiB slices with a small piece at a chunk boundary every fifth read.
        for i in 0..60u64 {
            let len = if i % 5 == 0 { 16 << 10 } else { 256 << 10 };
            o = t.observe(
                &CacheKey::file("h5/data.h5", "v", (i * 13) % 64),
                &ctx(1).with_read_len(len),
            );
        }
        assert!(!o.small_reads, "mostly slices");
        // The page stream turns into large reads: within a few dozen it is not small.
        for i in 0..24u64 {
            o = t.observe(
                &CacheKey::file("db/kv.db", "v", (i * 7) % 40),
                &ctx(1).with_read_len(1 << 20),
            );
        }
        assert!(!o.small_reads, "changed habit");
        // Reads of unknown length (0) leave the share as it is.
        for i in 0..24u64 {
            o = t.observe(&CacheKey::file("db/kv.db", "v", i % 40), &ctx(1));
        }
        assert!(!o.small_reads);
    }

    #[test]
    fn sequential_blocks_are_detected_per_job_despite_interleaving() {
        let mut t = StreamTree::default();
        let mut last = (Observation::default(), Observation::default());
        // Job 1 reads file a sequentially, job 2 reads file a backwards by 7s: interleaved.
        for i in 0..64u64 {
            last.0 = t.observe(&CacheKey::file("d/x/a.bin", "v", i), &ctx(1));
            last.1 = t.observe(&CacheKey::file("d/x/a.bin", "v", (i * 7919) % 997), &ctx(2));
        }
        assert_eq!(last.0.blocks, Pattern::Sequential);
        assert_ne!(last.1.blocks, Pattern::Sequential);
    }

    #[test]
    fn next_file_inherits_sibling_pattern() {
        let mut t = StreamTree::default();
        for i in 0..32 {
            t.observe(&CacheKey::file("ds/shards/s-1.tar", "v", i), &ctx(1));
        }
        let o = t.observe(&CacheKey::file("ds/shards/s-7.tar", "v", 0), &ctx(1));
        assert_eq!(o.blocks, Pattern::Sequential);
        // Another job has learnt nothing.
        let o = t.lookup(&CacheKey::file("ds/shards/s-7.tar", "v", 0), &ctx(2));
        assert_eq!(o.blocks, Pattern::Unknown);
    }

    #[test]
    fn repeat_of_same_block_is_one_visit() {
        let mut t = StreamTree::default();
        assert!(!t.observe(&CacheKey::file("f", "v", 3), &ctx(1)).repeat);
        assert!(t.observe(&CacheKey::file("f", "v", 3), &ctx(1)).repeat);
        assert!(!t.observe(&CacheKey::file("f", "v", 4), &ctx(1)).repeat);
    }

    /// Records of 16 KiB at random places of a large file, each read in 4 KiB pieces
    /// (a zip member): the first piece of a record expects the whole record, a later
    /// piece the rest of it; page lookups expect nothing beyond the page.
    #[test]
    fn a_stream_of_records_read_in_pieces_expects_the_rest_of_each_record() {
        let mut t = StreamTree::default();
        let mib = 1u64 << 20;
        let mut x = 7u64;
        let mut next_record = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 20) % 4000) * 16_400
        };
        let read = |t: &mut StreamTree, path: &str, offset: u64, len: u64| {
            t.observe(
                &CacheKey::file(path, "v", offset / mib),
                &ctx(1).with_read(offset, len),
            )
        };
        let (mut first, mut third) = (0, 0);
        for _ in 0..64 {
            let start = next_record();
            first = read(&mut t, "z/a.zip", start, 4096).run_ahead;
            read(&mut t, "z/a.zip", start + 4096, 4096);
            third = read(&mut t, "z/a.zip", start + 8192, 4096).run_ahead;
            read(&mut t, "z/a.zip", start + 12288, 4096);
        }
        assert!(
            (16 << 10..20 << 10).contains(&first),
            "whole record: {first}"
        );
        assert_eq!(third, 8 << 10, "the rest of the record");
        // A read spanning two blocks is seen once per block: the same answer for both.
        let at = 3 * mib - 2048;
        let a = read(&mut t, "z/a.zip", at, 4096).run_ahead;
        assert_eq!(read(&mut t, "z/a.zip", at, 4096).run_ahead, a);
        // Page lookups: nothing beyond the page.
        let mut o = Observation::default();
        for _ in 0..64 {
            o = read(&mut t, "db/kv.db", next_record() / 4096 * 4096, 4096);
        }
        assert_eq!(o.run_ahead, 4096);
        // No offset known: no run.
        let o = t.observe(
            &CacheKey::file("db/kv.db", "v", 3),
            &ctx(1).with_read_len(4096),
        );
        assert_eq!(o.run_ahead, 0);
    }

    /// A demand read of `len` bytes at `offset` of `path` (1 MiB blocks) by job 1.
    fn read_at(t: &mut StreamTree, path: &str, offset: u64, len: u64) -> Observation {
        t.observe(
            &CacheKey::file(path, "v", offset >> 20),
            &ctx(1).with_read(offset, len),
        )
    }

    /// A deterministic draw below `n` (an LCG seeded with `seed`).
    fn lcg(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut x = seed;
        move |n| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 17) % n
        }
    }

    /// Tensor-parallel ranks in one process group each read a slice of every row of a
    /// weight matrix (1 KiB of each 4 KiB row, ranks at different rows): a sweep. Page
    /// lookups anywhere in a large file and records read in contiguous pieces are not.
    #[test]
    fn interleaved_strided_slices_sweep_and_lookups_and_records_do_not() {
        let mut t = StreamTree::default();
        let mib = 1u64 << 20;
        let read = read_at;
        let mut o = Observation::default();
        for row in 0..200u64 {
            for rank in 0..4u64 {
                // Rank r is 37 rows ahead of rank r - 1.
                let at = (row + rank * 37) * 4096 + rank * 1024;
                o = read(&mut t, "ckpt/model.safetensors", at, 1024);
            }
        }
        assert!(o.small_reads && o.sweeping, "strided slices sweep");
        let mut rnd = lcg(11);
        for _ in 0..200 {
            o = read(&mut t, "db/kv.db", rnd(40 * mib / 4096) * 4096, 4096);
        }
        assert!(o.small_reads && !o.sweeping, "page lookups");
        for _ in 0..64 {
            let start = rnd(4000) * 16_400;
            for piece in 0..4 {
                o = read(&mut t, "z/a.zip", start + piece * 4096, 4096);
            }
        }
        assert!(o.small_reads && !o.sweeping, "records in contiguous pieces");
    }

    /// Page reads that stay in a region for a while (a graph index's beam search: the
    /// nodes of one cluster, 4 KiB pages within 128 KiB) are block-local; page lookups
    /// spread over a file of 40 blocks are not.
    #[test]
    fn page_reads_clustered_in_regions_are_block_local_and_lookups_are_not() {
        let mut t = StreamTree::default();
        let mib = 1u64 << 20;
        let read = |t: &mut StreamTree, path: &str, offset: u64| read_at(t, path, offset, 4096);
        let mut rnd = lcg(3);
        let mut o = Observation::default();
        for _ in 0..40 {
            let region = rnd(400) * (128 << 10);
            o = read(&mut t, "ann/graph.bin", rnd(50 * mib / 4096) * 4096);
            for _ in 0..30 {
                o = read(&mut t, "ann/graph.bin", region + rnd(32) * 4096);
            }
        }
        assert!(o.small_reads && o.block_local, "a search's pages");
        for _ in 0..300 {
            o = read(&mut t, "db/kv.db", rnd(40 * mib / 4096) * 4096);
        }
        assert!(o.small_reads && !o.block_local, "page lookups");
    }

    /// A file read in order within each visit whose blocks come back visit after visit
    /// is ranked by frequency; in order and not reused, it is scan data.
    #[test]
    fn reused_sequential_blocks_are_retained_as_skewed() {
        let seq = Observation {
            blocks: Pattern::Sequential,
            ..Observation::default()
        };
        assert_eq!(seq.retention(), Pattern::Sequential);
        let reused = Observation {
            blocks_reused: true,
            ..seq
        };
        assert_eq!(reused.retention(), Pattern::Skewed);
        let random = Observation {
            blocks: Pattern::Random,
            blocks_reused: true,
            ..Observation::default()
        };
        assert_eq!(random.retention(), Pattern::Random, "reused means in order");
    }

    /// What the prefetchers are told of a file whose hot columns are read in order by
    /// query after query: `Skewed` (its retention), so readahead does not treat each
    /// query's visit as a scan to run far ahead of; a file read whole pass after pass
    /// stays `Sequential`.
    #[test]
    fn reused_in_order_blocks_are_skewed_to_the_prefetchers() {
        let mut t = StreamTree::default();
        for b in crate::classify::eval::hot_column_queries(120) {
            t.observe(&CacheKey::file("t/cols.bin", "v", b), &ctx(1));
        }
        for _ in 0..8 {
            for b in 0..64 {
                t.observe(&CacheKey::file("t/scan.bin", "v", b), &ctx(1));
            }
        }
        let cols = CacheKey::file("t/cols.bin", "v", 0);
        let scan = CacheKey::file("t/scan.bin", "v", 0);
        let o = t.lookup(&cols, &ctx(1));
        assert_eq!((o.blocks, o.blocks_reused), (Pattern::Sequential, true));
        assert_eq!(t.finest_pattern(&cols, &ctx(1)), Pattern::Skewed);
        assert_eq!(t.finest_pattern(&scan, &ctx(1)), Pattern::Sequential);
    }

    /// The words beside a pattern never quote a test that contradicts it: while the
    /// latest test disagrees (the pattern waits for `hysteresis` agreeing tests), they
    /// say so.
    #[test]
    fn decided_by_says_when_the_test_now_disagrees_with_the_pattern() {
        let cfg = ClassifierConfig::default();
        let mut sc = Scratch::default();
        let mut s = StreamStats::new(Pattern::Unknown);
        let mut x = 3u64;
        for _ in 0..64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let idx = (x >> 33) % 100_000;
            s.observe(idx, idx as u32, &cfg, &mut sc);
        }
        assert_eq!(s.pattern(), Pattern::Random);
        let agree = TestOutcome {
            pattern: Pattern::Random,
            p_sequential: 0.9,
            p_uniform: 0.8,
            zipf_s: 0.0,
        };
        assert!(decided_by(&s, &agree, &cfg).starts_with("neither test rejected"));
        let skewed_now = TestOutcome {
            pattern: Pattern::Skewed,
            p_uniform: 0.003,
            ..agree
        };
        let words = decided_by(&s, &skewed_now, &cfg);
        assert!(
            words.starts_with("held until 2 tests agree: the test now says skewed"),
            "{words}"
        );
    }

    /// The per-stream figures quoted in docs/PATTERNS.md.
    #[test]
    fn state_sizes_match_the_docs() {
        // A stream is a slab node (which carries its id) plus an index entry.
        let node = std::mem::size_of::<Node>() + std::mem::size_of::<(StreamId, u32)>();
        let share = std::mem::size_of::<(u64, Share)>();
        eprintln!("stream entry {node} B, share entry {share} B");
        // 272 with the run estimate (40 B), the sweep and block-locality detector (60 B)
        // and the test of reuse across passes (24 B; its sampled window, 1 KiB more, only
        // for streams whose passes are long): 17 MiB at the default 65,536 streams.
        assert!(node <= 272, "{node}");
        assert!(share <= 32, "{share}");
    }

    /// Pruning compacts the node slab and rebuilds the index: the streams kept must
    /// still be found with what they learnt, the dropped ones must be gone.
    #[test]
    fn streams_kept_by_a_prune_keep_their_state() {
        let mut t = StreamTree::new(TreeConfig {
            max_streams: 64,
            ..Default::default()
        });
        let hot = CacheKey::file("hot/f.bin", "v", 0);
        for i in 0..2_000u64 {
            // One sequential stream kept recent, among many one-off streams.
            t.observe(&CacheKey::file("hot/f.bin", "v", i), &ctx(1));
            t.observe(&CacheKey::file(format!("cold/g{i}"), "v", 0), &ctx(2));
        }
        assert!(t.dropped() > 0);
        assert!(t.len() <= 65);
        assert_eq!(t.lookup(&hot, &ctx(1)).blocks, Pattern::Sequential);
        let first_cold = CacheKey::file("cold/g0", "v", 0);
        assert!(!t.index.contains_key(&StreamId {
            job: 2,
            node: LEVEL_FILE ^ hash_bytes(b"cold/g0"),
        }));
        assert_eq!(t.lookup(&first_cold, &ctx(2)).blocks, Pattern::Unknown);
        for (slot, n) in t.nodes.iter().enumerate() {
            assert_eq!(t.index.get(&n.id), Some(&(slot as u32)));
        }
        assert_eq!(t.index.len(), t.nodes.len());
    }

    #[test]
    fn memory_is_bounded() {
        let mut t = StreamTree::new(TreeConfig {
            max_streams: 1000,
            ..Default::default()
        });
        for i in 0..20_000u64 {
            t.observe(
                &CacheKey::file(format!("d{}/f{i}", i % 50), "v", 0),
                &ctx(i % 3),
            );
            assert!(t.len() <= 1001);
        }
        assert!(t.dropped() > 0);
    }
}
