//! The pattern-aware policy (`strata`): per-stream pattern detection feeding per-pattern
//! retention, with space allocated across pools by marginal benefit.
//!
//! # How an item is placed
//!
//! Every demand access arrives with the engine's classification of the job's streams at
//! each granularity (`ctx.obs`, from the [`crate::tracker::AccessTracker`]; the policy
//! never classifies on its own, so it sees exactly what every other policy and the
//! prefetch controller see).
//! The *retention pattern* (skewed anywhere, else the finest classified level; see
//! [`Observation::retention`]) decides where the item lives:
//!
//! | pool | holds | evicted |
//! |---|---|---|
//! | `consumed` | scan data (sequential/random stream) just read, a recency queue | beyond its learnt share, first: oldest first, unless the stable subset takes it ("evict behind") |
//! | `ahead` | prefetched, not yet read | when over `ahead_share` of capacity (stale), else last |
//! | `stable` | scan data inside the stable subset, and hot scan data (proven) | unproven largest hash first, when over its share |
//! | `window` | skewed or not yet classified data, new | recency (LRU), W-TinyLFU contest when over its share (never the latest demanded block) |
//! | `freq` | the frequency main: items that won the contest | least reuse per byte first (`(f - 1) / size`, f the sketch's count, size that of the read that brought it in; ties largest first, then oldest) |
//!
//! * **Sequential and random streams** (data read about once per epoch, in sequence or
//!   shuffled) are not worth keeping by recency: LRU on a per-epoch shuffle of a set
//!   larger than the cache hits ~0. Instead the `stable` pool keeps the *bottom-k by
//!   hash*: an item enters only if its key hash is below the largest hash resident
//!   (or the pool has room), and the victim is the largest hash. The subset is a fixed
//!   hash sample, the same every epoch, so a shuffled epoch hits ~share/size of its
//!   reads. Scan data enters the recency queue `consumed` first; when it leaves it (the
//!   queue over its share), the stable subset takes it or it is the victim, so one scan
//!   cannot push out a hot set. Members re-read while resident are *proven* and go
//!   after every unproven one; so does scan data the sketch counts clearly hotter than
//!   the member it would displace (`stable_admits_frequent`), whatever its hash. A
//!   member re-read when its stream has since been found reused or skewed leaves for the
//!   frequency main (`stable_follows_retention`).
//!   A whole small file of a random files stream that re-reads its items
//!   (`reread_by_frequency`; a class directory of a balanced sampler) is ranked by
//!   frequency instead: each class is uniform, but a small class's files are read
//!   far more often than a large one's, which a hash sample across both ignores.
//! * **Skewed streams** (and streams not yet classified) enter the recency `window`;
//!   when the window is over its share its oldest item moves to the frequency main
//!   (`freq`) if the main has room, else competes with the main's least frequent item
//!   by reuse per byte (W-TinyLFU: the loser leaves; at a tie the larger). The main ranks by
//!   `(f - 1) / size` (`main_ranks_by_density`; among equal sizes that is `f`'s order),
//!   `f` from an aged count-min sketch (history survives eviction; aging halves it every 10 x
//!   resident items, and the main's keys with it, so formerly hot items fade). Its
//!   rows widen with the resident items (`sketch_follows_items`) so that a period adds
//!   about one increment per counter: at a fixed width, thousands of 2 MiB KV blocks
//!   made a block read once estimate 2-3 and win the contest against reused ones.
//!   LFU-DA (`L + f`) was measured instead of plain `f` and lost 4 points on
//!   inference-skew at 10% (0.567 vs 0.606), so it is not used.
//! * **Prefetched** items (`ctx.is_prefetch()`) wait in `ahead`; their first demand read moves
//!   them to the pool their stream's pattern picks.
//!
//! # Evict-behind only when it is behind: the consumed queue's share
//!
//! Evict-behind assumes a scan stream does not come back soon. Traces recorded from
//! real programs (issue 13) break that in two ways the generator's did not: a block is
//! read by many small reads (a tar shard 10 KiB at a time, ~100 reads per 1 MiB block)
//! while other tenants miss, and a shuffled chunk order re-reads a block a few blocks
//! later (`np.fromfile` chunks of a few arrays). With `consumed` always evicted first,
//! the `mix` trace's shard reader re-fetched its block after nearly every miss of the
//! other two tenants (12x its LRU JCT). So `consumed` is ordered by last access (a
//! read of the same visit moves the block to the young end: it is not behind yet), and
//! it keeps a share `consumed_target` learnt as ARC learns `p`: its victims go to a
//! ghost list; a demand miss there (a hit a larger queue would have had) grows the
//! share by the block's size, a miss on the window's or main's ghost or in the stable
//! band shrinks it, each step scaled by the ratio of the other side's ghost bytes to
//! this side's. The consumed ghost has the same reach as the other probes
//! (`window_ghost_share`); with ARC's whole-cache reach it caught a shuffled epoch's
//! chance re-reads and took the stable subset's space. A one-pass scan never re-reads
//! within the probe, so its share stays 0 and the behaviour is pure evict-behind.
//!
//! A file re-read whole right after it was read (`torch.load` of the newest checkpoint
//! again, an evaluation loop) re-reads at a distance of the file's size, beyond the
//! probe: the consumed ghost never saw it, and each visit missed the blocks the first
//! one let go. So a second ghost of `consumed`'s victims (the *reload ghost*, key hashes
//! with the demand-byte clock `touched` at their last read, up to a capacity of bytes)
//! answers whether an LRU of this capacity would still have held a re-read block (less
//! than a capacity read since). A run of `reload_run` such misses of one job in a
//! block-sequential stream is a re-visit, and its bytes grow the share as consumed ghost
//! hits do: the rest of the re-read stays for the next visit. A chance re-read of a
//! random stream, or one further back than the cache, changes nothing; a loop over more
//! than the cache never comes back within it (docs/BENCHMARKS.md "A file re-read whole").
//!
//! # Space allocation by marginal benefit
//!
//! `stable` and `freq` share what `consumed`/`ahead` leave, split by `stable_share`.
//! Each pool's *marginal* hit rate is estimated over the same probe size (`ghost_share`
//! of capacity): for `freq`, demand misses on keys in a ghost FIFO of its recent victims;
//! for `stable`, demand misses on previously seen scan keys whose hash lies in the band
//! just above the subset's threshold and that last left the cache from the scan path
//! (`consumed` or `stable`): the items a larger subset would hold. A frequency-side or
//! unread prefetched victim re-read as scan data is not one (the subset never saw it;
//! counted, a shard reader's re-reads took `mix`'s SQLite tenant's space). Every
//! `rebalance_every` demand misses the share moves one `rebalance_step` toward the pool
//! that would have earned more hits. A one-time scan earns the stable band nothing, so it
//! cannot grow; a hot set's ghost hits hold its space.
//!
//! # Recency vs frequency: the adaptive window
//!
//! Which side wins depends on the data: KV prefix blocks of conversations are re-read
//! a turn later (recency: LRU/ARC win on the Mooncake traces and on kv-prefix), model
//! and embedding reads have static Zipf popularity (LFU wins on inference-skew). So the
//! window's share of the frequency side is learnt, ARC-style, from two ghost lists of
//! equal reach (`window_ghost_share` of capacity each, key hashes only): the window's
//! recent victims (contest losers) and the main's. A demand miss on a window ghost is
//! a hit a larger window would have had; on a main ghost, a larger main. Under H0 (the
//! same extra space is worth as much on either side) each such miss falls on either
//! list with probability 1/2; once `window_min_votes` are in, a two-sided binomial test
//! (`statrs`) at `window_alpha` either rejects, and the share moves one
//! `rebalance_step` toward the side that hit more (counts restart; twice the last move
//! when the last test went the same way, `window_step_doubles`), or the evidence
//! keeps accumulating (halved every 16 x the minimum so that it stays current). So the
//! share moves as fast as the evidence arrives and stays put while the two are even.
//! A ghost entry names the segment that would have kept the block: a block admitted on
//! a main ghost hit that the window then evicts goes back to the main's list
//! (`main_victims_stay_main`), and the share never goes below `window_min_share` (at 0
//! the window -> main contest, TinyLFU's admission test, stops).
//! The same ghost entries record the frequency side's total eviction position, so the
//! stable-vs-freq probe above still counts only misses within its own probe size.
//!
//! Known limit (measured, docs/PATTERNS.md): the probes are *marginal* (10% of
//! capacity). Where the hit-ratio curve is not concave in the window size, e.g. reuse
//! further back than the probe reaches with a main full of stale-frequency items, the
//! evidence can point away from the global optimum (Mooncake conversation at 20%: 0.96x
//! of LRU). Larger probes (50%, 100% of capacity) were measured and were worse: the
//! ghost that evicts more bytes then collects more hits and the share runs away to 0 or 1.
//!
//! # Tenants that end (issue 13, `mix`)
//!
//! Frequency and proof of re-reading outlive the job that earned them. So the policy
//! watches *periods* of `idle_period_share` x capacity of demand-miss bytes: a
//! frequency side that earned hits in one period and none in the next, while every job
//! that hit it read nothing at all, is released (the stable share goes to 1, and the
//! ghost evidence moves it back when a skewed stream hits again); an unread prefetched
//! block of a job that read nothing for two periods is the first victim; proven stable
//! members are aged once per capacity of scan misses. A job still reading keeps what it
//! has (its hot set may rest through a scan). `stable_share` moves per probe hit, at
//! most `rebalance_step`, so a space split can follow a tenant in a few thousand misses.
//! Jobs are tracked only up to 16 (`JobSet::CAP`) per period: with more (a KV trace's job
//! per request) no job counts as gone and nothing is released.
//!
//! # A bound on losing to LRU: the recency guard
//!
//! The rules above were each found on a trace; a program unlike all of them can defeat
//! one, and the policy would not know. So it watches LRU (`recency_guard`): a shadow
//! LRU of the same capacity (key hashes only, sampled above 256 MiB) sees every demand
//! read and every prefetch fill (`guard_sees_prefetch`); when it significantly out-hits the policy (McNemar's sign test on the reads
//! where exactly one of them hit), the policy evicts in plain recency order, over all
//! pools, for a period of cache turnovers, then tries its own order again, each period
//! twice as long as the last while the trial keeps losing at once. Its ghosts learn
//! nothing from those evictions. A policy that is ahead never pays; one that falls
//! behind pays a trial of a few dozen discordant reads per period
//! (`recency_guard.rs` has the constants and their reasons).
//!
//! The guard also tests each job's reads on their own (`spare_starved_jobs`): one
//! tenant can lose badly to LRU while the cache as a whole is ahead (its blocks outranked
//! per byte by another tenant's small units). While a job is significantly behind, a
//! victim it read last is replaced by the least recently read item of another job, for
//! a period as long as a recency period's first; a job still behind while spared (its
//! loss is not what the policy evicts, e.g. its granularity) is not spared again.
//!
//! # A bound on losing to frequency: the frequency guard
//!
//! The same watch against a shadow W-TinyLFU (`frequency_guard`): popularity across
//! files or directories that each stream's own tests cannot see (adapters loaded whole
//! with Zipf popularity; a data mixture's weights across shard directories) leaves hot
//! data in the scan pools, where a recency queue and a hash sample lose it. When the
//! shadow significantly out-hits the policy, every stream's data is ranked by frequency
//! (retention taken as skewed) for a period, then the policy's rules are tried again
//! (`guard_period.rs`: the vote and the period both guards share).
//!
//! All decisions are pure logic, O(log n) per access (B-tree orders) plus O(1) stream
//! updates; no allocation per access beyond the map entries of new residents.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::EvictionPolicy;
use crate::access::AccessContext;
use crate::key::CacheKey;
use crate::pattern::Pattern;
use crate::stream::{hash_bytes, key_hash, mix64, FxBuild, Observation};
use binomial::SignTest;
pub use config::PatternAwareConfig;
use frequency_guard::FrequencyGuard;
use recency_guard::RecencyGuard;
use seq_queue::SeqQueue;
use sketch::Sketch;
pub use stats::PatternAwareStats;

/// A recent victim of the frequency side.
#[derive(Clone, Copy, Debug)]
struct Ghost {
    seq: u64,
    /// 0 = evicted from the window, 1 = from the main, 2 = from `consumed`.
    seg: usize,
    /// `evicted_freq` before this eviction.
    pos: u64,
}

/// A small set of job ids (the tenants seen in one idleness period), or "too many to
/// tell" once more than `JobSet::CAP` distinct jobs were added (then no job counts as
/// gone: with a request per job, as KV traces have, jobs say nothing about tenants).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct JobSet {
    jobs: Vec<u64>,
    overflow: bool,
}

impl JobSet {
    /// Distinct jobs tracked: 16, more tenants than one cache tier serves in the traces
    /// measured (3) while the linear scan stays a few compares.
    pub(crate) const CAP: usize = 16;

    pub(crate) fn insert(&mut self, job: u64) {
        if self.overflow || self.jobs.contains(&job) {
            return;
        }
        if self.jobs.len() == Self::CAP {
            self.overflow = true;
            self.jobs.clear();
        } else {
            self.jobs.push(job);
        }
    }

    /// Whether every job of `self` is known to be absent from `other`: false when
    /// `self` is empty or either set overflowed.
    pub(crate) fn all_absent_from(&self, other: &JobSet) -> bool {
        !self.overflow
            && !other.overflow
            && !self.jobs.is_empty()
            && self.jobs.iter().all(|j| !other.jobs.contains(j))
    }

    /// Whether the period saw any access (sets cleared at its end say nothing before).
    pub(crate) fn seen_any(&self) -> bool {
        self.overflow || !self.jobs.is_empty()
    }

    fn clear(&mut self) {
        self.jobs.clear();
        self.overflow = false;
    }
}

/// Oldest prefetched blocks examined for a gone job's (`stale_ahead`): 8, a few
/// compares per victim.
const STALE_AHEAD_LOOK: usize = 8;

/// Largest read `main_ranks_by_read` spreads an item's reuse over: 16 MiB. Beyond a
/// few blocks a read's latency is a small part of its time, and one huge read should
/// not make all its blocks the main's first victims.
const RANK_READ_MAX: u64 = 16 << 20;

/// Stable-subset tiers: members re-read while resident are evicted after the others.
const PROVEN: u64 = 0;
const UNPROVEN: u64 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Consumed,
    Ahead,
    Stable,
    Freq,
    /// Recency window in front of `Freq` (W-TinyLFU): new skewed/unknown items.
    Window,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    size: u64,
    pool: Pool,
    hash: u64,
    /// Order key within the pool: sequence number (consumed/ahead), priority (freq).
    order: u64,
    seq: u64,
    /// The job whose access (demand or prefetch) placed it.
    job: u64,
    /// A whole small file read in order (`whole_files_by_frequency`): in the window ->
    /// main contest it must be read more than once more than the main's least
    /// frequent item, so a pass over a directory does not replace the files the
    /// pass reads next (which are one read behind) with those it just read.
    in_order: bool,
    /// `touched` at its last demand read in a new visit (at its insert for a prefetch):
    /// the re-read's LRU reuse distance is `touched` then minus this.
    touch: u64,
    /// In `consumed`, `ahead` or `window`: its slot's position hint there
    /// (`SeqQueue::insert`).
    pos: u64,
    /// Admitted on a demand miss in the main's ghost list (`main_victims_stay_main`).
    from_main: bool,
    /// The job of its latest demand read (its insert's job until then).
    reader: u64,
    /// Bytes of the demand read that brought it in (0 for a prefetch): the blocks of one
    /// read are worth keeping only together (`main_ranks_by_read`).
    read_bytes: u64,
}

/// A resident item's key and entry (`PatternAwarePolicy::slots`); `key` is `None` in a
/// free slot.
struct Slot {
    key: Option<CacheKey>,
    e: Entry,
    /// Its sequence number and position hint in `recent` (`recency_guard`).
    recent: (u64, u64),
}

/// The pattern-aware eviction policy. See the module docs.
pub struct PatternAwarePolicy {
    cfg: PatternAwareConfig,
    /// Resident items: key -> its slot in `slots`.
    entries: HashMap<CacheKey, u32, FxBuild>,
    /// Each resident item's key and entry, by slot. The pools name items by slot, so
    /// a move between pools, a re-rank by `count` and a victim's bookkeeping index a
    /// slot instead of hashing and comparing a key, and the pools' queue slots and
    /// B-tree nodes hold 4 bytes per item instead of a whole key (memory the replay's
    /// held-out `mixh` and `sqlrange` spent their time waiting on). Slots only name
    /// items: no order or decision depends on which slot an item has.
    slots: Vec<Slot>,
    /// Slots of removed items, reused first.
    free: Vec<u32>,
    consumed: SeqQueue<u32>,
    /// With the job of each block (its entry's `job`), so `stale_ahead` reads it
    /// without looking the slot up.
    ahead: SeqQueue<(u32, u64)>,
    /// Blocks in `ahead` per job (jobs with none are absent), so `stale_ahead` knows
    /// without walking `ahead` when every job with a prefetched block is still reading.
    ahead_jobs: HashMap<u64, u64, FxBuild>,
    /// Keyed by (tier, hash, seq): tier 0 = re-read while resident (proven), 1 = not yet.
    stable: BTreeMap<(u64, u64, u64), u32>,
    /// Keyed by (sketch frequency, tie rank, seq); see `freq_tie_rank`.
    freq: BTreeMap<(u64, u64, u64), u32>,
    bytes: [u64; 5],
    window: SeqQueue<u32>,
    seq: u64,
    cap: u64,
    sketch: Sketch,
    seen: Vec<u64>,
    seen_set: usize,
    /// Per bit of `seen`: the item's last eviction was from the scan path (`consumed`
    /// or `stable`), so a larger stable subset could have kept it
    /// (`band_needs_scan_victim`). Cleared with `seen`.
    scan_victim: Vec<u64>,
    /// Recent victims of the frequency side, by key hash (no data).
    ghost: HashMap<u64, Ghost, FxBuild>,
    /// Per segment (0 = window, 1 = main, 2 = consumed): FIFO of (hash, size, seq) and
    /// its bytes.
    ghost_fifo: [VecDeque<(u64, u64, u64)>; 3],
    ghost_bytes: [u64; 3],
    /// Bytes of recently read scan data `consumed` keeps before it is evicted first
    /// (ARC's `p` for the scan side; 0 = pure evict-behind).
    consumed_target: f64,
    /// Demand misses that hit the consumed ghost list.
    consumed_ghost_hits: u64,
    /// Victims taken from each pool (by `pool_ix`).
    victims: [u64; 5],
    /// Bytes evicted from the frequency side so far (ghost depth = now - then).
    evicted_freq: u64,
    window_share: f64,
    ghost_hits: [u64; 2],
    stable_share: f64,
    /// Scan data has shown reuse (`main_kept_until_scan_reuse`): a scan item hit
    /// again in a new visit (resident in `consumed` or `stable`), a miss on the
    /// consumed ghost or in the stable band, or an idle frequency side released.
    scan_reuse_seen: bool,
    gain_freq: f64,
    gain_stable: f64,
    /// Ghost hits of the window / the main since the window share last moved.
    window_votes: [u64; 2],
    /// The window share's last move (signed; 0 before the first): the next in the same
    /// direction doubles it (`window_step_doubles`).
    window_last_step: f64,
    misses: u64,
    /// Bytes of distinct scan items (sequential/random retention) seen since the
    /// "seen" filter was last cleared: the population the stable subset samples.
    scan_seen_bytes: u64,
    /// Scan bytes missed since proven stable members were last aged (`age_proven`).
    scan_miss_bytes: u64,
    /// Demand miss bytes and frequency-side hits (resident or ghost) of the current
    /// idleness period (`idle_check`).
    period_miss_bytes: u64,
    freq_side_hits: u64,
    prev_freq_side_hits: u64,
    /// Jobs that hit the frequency side in this / the previous period, and jobs that
    /// read anything in this period: a side whose readers all left is released.
    hit_jobs: JobSet,
    prev_hit_jobs: JobSet,
    period_jobs: JobSet,
    idle_releases: u64,
    stale_ahead_victims: u64,
    /// Jobs that read anything in the previous period.
    prev_period_jobs: JobSet,
    rebalances: u64,
    /// Decision taken in `admit` for the item about to be inserted.
    pending: Option<(u64, Pool)>,
    last_victim: Option<u64>,
    /// Hash of the block the latest demand access read (set by its hit or insert,
    /// cleared by the next demand miss's `admit`).
    last_demanded: Option<u64>,
    /// The item about to be inserted is a demand miss of a sequential stream.
    pending_sequential_miss: bool,
    /// The item about to be inserted is a whole small file read in order.
    pending_in_order: bool,
    /// The item about to be inserted missed in the main's ghost list.
    pending_from_main: bool,
    /// Bytes of demand reads so far (misses, and hits in a new visit): the clock of the
    /// reload ghost's reuse distances (`reload_ghost`).
    touched: u64,
    /// Victims of `consumed` with `touched` at their last read (and the FIFO's seq), up
    /// to a capacity of bytes: a re-read further back than that would miss under LRU too.
    reload: HashMap<u64, (u64, u64), FxBuild>,
    reload_fifo: VecDeque<(u64, u64, u64)>,
    reload_bytes: u64,
    reload_seq: u64,
    reload_run: u64,
    reload_run_bytes: u64,
    reload_run_job: Option<u64>,
    /// Demand re-reads the reload ghost counted (`reload_ghost`).
    reload_hits: u64,
    /// The window test's and the recency guard's sign test.
    sign_test: SignTest,
    /// The shadow LRU that decides when to evict by recency (`recency_guard`).
    guard: Option<RecencyGuard>,
    /// The shadow W-TinyLFU that decides when to rank every stream by frequency
    /// (`frequency_guard`).
    freq_guard: Option<FrequencyGuard>,
    /// Every resident by its latest demand read or insert, built only while a recency
    /// period runs (`recent_built`): outside one, a read stores its slot's sequence
    /// number and nothing more. Kept up always, the queue doubled the guard's cost
    /// (+4.4-5.5% instructions per replay against +2.3-2.9%); built lazily it costs
    /// one sort of the residents per period (tens of milliseconds for a million, once
    /// per at least 2 cache turnovers).
    recent: SeqQueue<u32>,
    recent_built: bool,
    /// Victims replaced to spare a starved job (`spare_starved_jobs`).
    spared_victims: u64,
    /// The block each recently active file stream (`(job, file)` hashed) is in the
    /// middle of reading, if any (`scan_keeps_blocks_mid_read`); the most recent
    /// `MID_READ_STREAMS` streams.
    mid_read: VecDeque<MidRead>,
    /// Demand reads noted so far (`note_read`'s clock).
    reads: u64,
}

/// The block a file stream is in the middle of reading (`mid_read`).
#[derive(Clone, Copy, Debug)]
struct MidRead {
    /// The `(job, file)` stream, hashed.
    stream: u64,
    /// The block of the stream's latest read, if that read stopped inside it and the
    /// stream's contiguous run ([`Observation::run_bytes`]) has read at least a block's
    /// worth (a stream that goes on reading, not a chunk read before a jump elsewhere).
    block: Option<u64>,
    /// `reads` at the stream's latest read.
    tick: u64,
}

/// Demand reads after which a stream that has not read again is no longer in the middle
/// of its block: 64, several turns of readers that take turns (4 record shards read a
/// record each in turn touch each one every ~8 reads), while a query that stopped
/// mid-block and went elsewhere (a log scan ending in its time window) frees its block
/// soon after.
const MID_READ_TICKS: u64 = 64;

/// File streams whose current block is remembered (`mid_read`): 32, more streams than
/// one job's readers keep open at once (tf.data's cycle length, a loader's workers); a
/// linear scan of 32 pairs per demand read.
const MID_READ_STREAMS: usize = 32;

impl Default for PatternAwarePolicy {
    fn default() -> Self {
        Self::new(PatternAwareConfig::default())
    }
}

/// Whether `key` of an item of `size` bytes is a whole file: block 0, shorter than the
/// block size (the file ends in its first block).
fn is_whole_file(key: &CacheKey, size: u64) -> bool {
    match key {
        CacheKey::File(k) => k.block == 0 && size < k.block_size,
        CacheKey::Kv(_) => false,
    }
}

fn pool_ix(p: Pool) -> usize {
    match p {
        Pool::Consumed => 0,
        Pool::Ahead => 1,
        Pool::Stable => 2,
        Pool::Freq => 3,
        Pool::Window => 4,
    }
}

impl PatternAwarePolicy {
    pub fn new(cfg: PatternAwareConfig) -> Self {
        let sketch = Sketch::new(cfg.sketch_width);
        let seen = vec![0u64; cfg.seen_bits.max(64).next_power_of_two() / 64];
        let scan_victim = seen.clone();
        PatternAwarePolicy {
            entries: HashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            consumed: SeqQueue::default(),
            ahead: SeqQueue::default(),
            ahead_jobs: HashMap::default(),
            stable: BTreeMap::new(),
            freq: BTreeMap::new(),
            bytes: [0; 5],
            window: SeqQueue::default(),
            seq: 0,
            cap: cfg.capacity_hint.unwrap_or(0),
            sketch,
            seen,
            seen_set: 0,
            scan_victim,
            ghost: HashMap::default(),
            ghost_fifo: [VecDeque::new(), VecDeque::new(), VecDeque::new()],
            ghost_bytes: [0; 3],
            consumed_target: 0.0,
            consumed_ghost_hits: 0,
            victims: [0; 5],
            evicted_freq: 0,
            window_share: cfg.window_share.clamp(0.0, 1.0),
            ghost_hits: [0; 2],
            stable_share: cfg.stable_share,
            scan_reuse_seen: false,
            gain_freq: 0.0,
            gain_stable: 0.0,
            window_votes: [0; 2],
            window_last_step: 0.0,
            misses: 0,
            scan_seen_bytes: 0,
            scan_miss_bytes: 0,
            period_miss_bytes: 0,
            freq_side_hits: 0,
            prev_freq_side_hits: 0,
            hit_jobs: JobSet::default(),
            prev_hit_jobs: JobSet::default(),
            period_jobs: JobSet::default(),
            idle_releases: 0,
            stale_ahead_victims: 0,
            prev_period_jobs: JobSet::default(),
            rebalances: 0,
            pending: None,
            pending_from_main: false,
            last_victim: None,
            last_demanded: None,
            pending_sequential_miss: false,
            pending_in_order: false,
            touched: 0,
            reload: HashMap::default(),
            reload_fifo: VecDeque::new(),
            reload_bytes: 0,
            reload_seq: 0,
            reload_run: 0,
            reload_run_bytes: 0,
            reload_run_job: None,
            reload_hits: 0,
            sign_test: SignTest::default(),
            guard: cfg.recency_guard.then(|| {
                let mut g = RecencyGuard::new(cfg.capacity_hint.unwrap_or(0));
                g.set_per_job(cfg.spare_starved_jobs, cfg.spare_ends_when_costly);
                g
            }),
            freq_guard: cfg
                .frequency_guard
                .then(|| FrequencyGuard::new(cfg.capacity_hint.unwrap_or(0))),
            recent: SeqQueue::default(),
            recent_built: false,
            spared_victims: 0,
            mid_read: VecDeque::new(),
            reads: 0,
            cfg,
        }
    }

    pub fn stats(&self) -> PatternAwareStats {
        PatternAwareStats {
            stable_share: self.stable_share,
            consumed_bytes: self.bytes[0],
            ahead_bytes: self.bytes[1],
            stable_bytes: self.bytes[2],
            freq_bytes: self.bytes[3] + self.bytes[4],
            rebalances: self.rebalances,
            window_share: self.window_share,
            window_bytes: self.bytes[4],
            window_ghost_hits: self.ghost_hits[0],
            main_ghost_hits: self.ghost_hits[1],
            consumed_target: self.consumed_target as u64,
            consumed_ghost_hits: self.consumed_ghost_hits,
            idle_releases: self.idle_releases,
            stale_ahead_victims: self.stale_ahead_victims,
            victims: self.victims,
            reload_ghost_hits: self.reload_hits,
            recency_periods: EvictionPolicy::recency_periods(self),
            frequency_periods: EvictionPolicy::frequency_periods(self),
            spared_periods: self.guard.as_ref().map_or(0, |g| g.spared),
            costly_spares_ended: self.guard.as_ref().map_or(0, |g| g.costly_ends),
            spared_victims: self.spared_victims,
        }
    }

    /// The pool holding `key` (`consumed`, `ahead`, `stable`, `freq`, `window`), for
    /// diagnostics (the replay's per-tenant breakdown); None if not resident.
    pub fn pool_of(&self, key: &CacheKey) -> Option<&'static str> {
        self.entries
            .get(key)
            .map(|&id| match self.slots[id as usize].e.pool {
                Pool::Consumed => "consumed",
                Pool::Ahead => "ahead",
                Pool::Stable => "stable",
                Pool::Freq => "freq",
                Pool::Window => "window",
            })
    }

    fn resident_bytes(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// The retention pattern of an access to `key` (an item of `size` bytes):
    /// [`Observation::retention`], except for a whole small file read in order
    /// ([`Self::whole_file_in_order`]): not scan data, ranked by frequency.
    fn retention(&self, obs: &Observation, key: &CacheKey, size: u64) -> Pattern {
        if self.whole_file_in_order(obs, key, size) {
            return Pattern::Unknown;
        }
        let r = obs.retention();
        if r == Pattern::Random && self.whole_file_reread(obs, key, size) {
            return Pattern::Unknown;
        }
        // A KV stream's order is its keys' hashes: "random" there says nothing of a
        // scan read once per epoch, only that independent requests share a namespace.
        // Its blocks are ranked by reuse (window and frequency main), never kept as a
        // hash sample nor evicted behind (black-box finding: one tenant's flood of
        // puts nobody read filled the stable subset up to half the cache and evicted
        // another tenant's blocks read every 120 ms, which LRU kept).
        if matches!(key, CacheKey::Kv(_)) && matches!(r, Pattern::Sequential | Pattern::Random) {
            return Pattern::Skewed;
        }
        // Ranked by frequency while the frequency guard finds that ranking ahead (as
        // skewed: a proven stable member re-read follows it to the main).
        if matches!(r, Pattern::Sequential | Pattern::Random)
            && self
                .freq_guard
                .as_ref()
                .is_some_and(FrequencyGuard::frequency_period)
        {
            return Pattern::Skewed;
        }
        r
    }

    /// Whether `key` is a whole small file whose files stream is random over a set it
    /// reads again and again (`reread_by_frequency`): the decision is the files
    /// level's (`obs.blocks` unclassified, as for every one-block file).
    fn whole_file_reread(&self, obs: &Observation, key: &CacheKey, size: u64) -> bool {
        self.cfg.reread_by_frequency
            && obs.files_reread
            && obs.files == Pattern::Random
            && obs.blocks == Pattern::Unknown
            && is_whole_file(key, size)
    }

    /// Whether `key` is a whole small file (block 0 and `size` under the block size:
    /// the file ends in its one block) whose only classified order is its files
    /// stream's `Sequential` (`whole_files_by_frequency`).
    fn whole_file_in_order(&self, obs: &Observation, key: &CacheKey, size: u64) -> bool {
        self.cfg.whole_files_by_frequency
            && obs.retention() == Pattern::Sequential
            && obs.blocks == Pattern::Unknown
            && is_whole_file(key, size)
    }

    /// Scan data (sequential or random streams) enters the recency queue `consumed`
    /// and is judged for the stable subset when it leaves it (see `victim`): a block is
    /// never evicted while its stream is still reading it.
    fn pool_for(&self, retention: Pattern) -> Pool {
        match retention {
            Pattern::Sequential | Pattern::Random => Pool::Consumed,
            Pattern::Skewed | Pattern::Unknown => self.freq_pool(),
        }
    }

    fn freq_pool(&self) -> Pool {
        if self.cfg.adapt_window || self.window_share > 0.0 {
            Pool::Window
        } else {
            Pool::Freq
        }
    }

    /// Residents looked at for a spared job's replacement victim: the 64 least
    /// recently read, so the search stays O(1) per eviction.
    const SPARE_SEARCH: usize = 64;

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Takes `e` out of its pool.
    fn unlink(&mut self, e: &Entry) {
        match e.pool {
            Pool::Consumed => {
                self.consumed.remove_at(&e.order, e.pos);
            }
            Pool::Ahead => {
                if let Some((_, job)) = self.ahead.remove_at(&e.order, e.pos) {
                    if let Some(n) = self.ahead_jobs.get_mut(&job) {
                        *n -= 1;
                        if *n == 0 {
                            self.ahead_jobs.remove(&job);
                        }
                    }
                }
            }
            Pool::Stable => {
                self.stable.remove(&(e.order, e.hash, e.seq));
            }
            Pool::Freq => {
                self.freq.remove(&self.freq_key(e));
            }
            Pool::Window => {
                self.window.remove_at(&e.order, e.pos);
            }
        }
        self.bytes[pool_ix(e.pool)] -= e.size;
    }

    /// Puts the item of slot `id` (entry `e`) into `pool`.
    fn link(&mut self, id: u32, e: &mut Entry, pool: Pool) {
        e.pool = pool;
        e.seq = self.next_seq();
        match pool {
            Pool::Consumed => {
                e.order = e.seq;
                e.pos = self.consumed.insert(e.order, id);
            }
            Pool::Ahead => {
                e.order = e.seq;
                e.pos = self.ahead.insert(e.order, (id, e.job));
                *self.ahead_jobs.entry(e.job).or_insert(0) += 1;
            }
            Pool::Stable => {
                self.stable.insert((e.order, e.hash, e.seq), id);
            }
            Pool::Freq => {
                e.order = self.sketch.estimate(e.hash).max(1);
                self.freq.insert(self.freq_key(e), id);
            }
            Pool::Window => {
                e.order = e.seq;
                e.pos = self.window.insert(e.order, id);
            }
        }
        self.bytes[pool_ix(pool)] += e.size;
    }

    /// Moves the item of slot `id` to `pool` (to its young end, or by its rank).
    fn move_to(&mut self, id: u32, pool: Pool) {
        let mut e = self.slots[id as usize].e;
        self.unlink(&e);
        if pool == Pool::Stable {
            e.order = UNPROVEN;
        }
        self.link(id, &mut e, pool);
        self.slots[id as usize].e = e;
    }

    /// A slot for `key` (a free one first), holding `e` until the caller links it.
    fn alloc_slot(&mut self, key: CacheKey, e: Entry) -> u32 {
        let slot = Slot {
            key: Some(key),
            e,
            recent: (0, 0),
        };
        match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = slot;
                id
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// The key of slot `id`, for a victim (`None` only for a free slot, which no pool
    /// names).
    fn slot_key(&self, id: u32) -> Option<CacheKey> {
        self.slots[id as usize].key.clone()
    }

    /// Bookkeeping of a demand miss: marginal-benefit probes and periodic rebalance.
    fn on_demand_miss(
        &mut self,
        h: u64,
        size: u64,
        job: u64,
        obs: &Observation,
        retention: Pattern,
        seen: bool,
    ) {
        self.period_jobs.insert(job);
        self.pending_from_main = false;
        self.idle_check(size);
        let reload = self.reload_ghost_hit(h, obs);
        let reload = if matches!(retention, Pattern::Sequential | Pattern::Random) {
            // Within the consumed ghost's probe the re-read counts there already.
            let counted = reload && self.ghost.get(&h).is_some_and(|g| g.seg == 2);
            self.reload_observed(job, if counted { 0 } else { size }, reload)
        } else {
            false
        };
        if let Some(g) = self.ghost.remove(&h) {
            if g.seg == 2 {
                self.scan_reuse_seen = true;
                self.consumed_hit_evidence(size, true);
            } else {
                self.freq_side_hits += 1;
                self.hit_jobs.insert(job);
                // Would a frequency side larger by the probe size have kept it?
                if self.evicted_freq - g.pos <= self.ghost_cap() {
                    self.gain_freq += size as f64;
                    self.stable_evidence(size, false);
                }
                self.ghost_hits[g.seg] += 1;
                self.window_evidence(g.seg);
                self.pending_from_main = g.seg == 1;
                self.consumed_hit_evidence(size, false);
            }
        } else if reload {
            // A re-visit the reload ghost counted: not a miss a larger stable subset
            // would have hit.
        } else if seen && matches!(retention, Pattern::Sequential | Pattern::Random) {
            if let Some((t, band)) = self.stable_band() {
                if h > t && ((h - t) as f64) <= band && self.band_eligible(h) {
                    self.gain_stable += size as f64;
                    self.stable_evidence(size, true);
                    self.consumed_hit_evidence(size, false);
                }
            }
        } else if matches!(retention, Pattern::Sequential | Pattern::Random) {
            self.scan_seen_bytes += size;
        }
        if matches!(retention, Pattern::Sequential | Pattern::Random) {
            self.age_proven(size);
        }
        self.misses += 1;
        if self.misses.is_multiple_of(self.cfg.rebalance_every.max(1)) {
            self.rebalance();
        }
    }

    /// ARC's adaptation of the scan side's recency share. A demand miss on a key
    /// `consumed` evicted recently (`to_consumed`) is a hit that keeping more recently
    /// read scan data would have had: the target grows by the item's size; a miss on a
    /// retained pool's ghost (the window's, the main's, the stable band) is one that
    /// more retained space would have had: it shrinks. As in ARC each step is scaled by
    /// the ratio of the other side's ghost bytes to this side's (at least 1), so the
    /// side with the shorter ghost list is not outvoted by the longer list's reach.
    fn consumed_hit_evidence(&mut self, size: u64, to_consumed: bool) {
        if !self.cfg.adapt_consumed {
            return;
        }
        let scan_ghost = self.ghost_bytes[2].max(1) as f64;
        let retained_ghost =
            (self.ghost_bytes[0] + self.ghost_bytes[1] + self.ghost_cap()).max(1) as f64;
        let max = self.cap as f64;
        if to_consumed {
            self.consumed_ghost_hits += 1;
            let step = size as f64 * (retained_ghost / scan_ghost).max(1.0);
            self.consumed_target = (self.consumed_target + step).min(max);
        } else {
            let step = size as f64 * (scan_ghost / retained_ghost).max(1.0);
            self.consumed_target = (self.consumed_target - step).max(0.0);
        }
    }

    /// A frequency side that earned no hit (resident or ghost) while a capacity's worth
    /// of bytes missed holds data nobody reads any more: the tenant that made it
    /// frequent has ended. Its space goes to the stable subset (share 1, which the
    /// ghost evidence moves back as soon as a skewed stream hits again), so the scan
    /// data still being read replaces it instead of being rejected by a subset squeezed
    /// by a dead tenant. Without it the frequency counts of a finished tenant outlived
    /// it (`mix` at 40%: 40 MB of an ended SQLite job's blocks kept through the
    /// loader's whole first epoch, whose second epoch then hit 19% against LRU's 80%).
    /// A hot set read at all during the turnover (a scan interleaved with hot reads)
    /// keeps its side: only complete idleness counts, where LRU would have lost it too.
    fn idle_check(&mut self, size: u64) {
        // Periods are measured in capacities: none until the capacity is known.
        if !self.cfg.release_idle || self.cap == 0 {
            return;
        }
        self.period_miss_bytes += size;
        if (self.period_miss_bytes as f64) < (self.cap.max(1) as f64 * self.cfg.idle_period_share) {
            return;
        }
        let freq_side = self.bytes[3] + self.bytes[4];
        // Idle now after earning hits in the period before: a tenant stopped. A side
        // that never earned anything yet (a single job's first pass) is not released:
        // nothing says its data is dead rather than not yet re-read.
        if self.freq_side_hits == 0
            && self.prev_freq_side_hits > 0
            && freq_side > 0
            && self.prev_hit_jobs.all_absent_from(&self.period_jobs)
        {
            self.stable_share = 1.0;
            self.scan_reuse_seen = true;
            self.idle_releases += 1;
        }
        self.prev_freq_side_hits = self.freq_side_hits;
        // Prefetched blocks still unread a whole period after the period they came in
        // are stale (their stream stopped or changed course): victims before
        // anything read.
        std::mem::swap(&mut self.prev_hit_jobs, &mut self.hit_jobs);
        self.hit_jobs.clear();
        std::mem::swap(&mut self.prev_period_jobs, &mut self.period_jobs);
        self.period_jobs.clear();
        self.period_miss_bytes = 0;
        self.freq_side_hits = 0;
    }

    /// A prefetched, still unread block of a job that read nothing for two whole
    /// idleness periods: its job is gone (or stalled) and the block is dead weight
    /// until `ahead` grows over its share, which it may never do. It is the first
    /// victim. `mix`: a shard reader's readahead (4-6 MB) outlived the job by minutes
    /// of simulated time while the SQLite tenant it squeezed missed 75% more than
    /// without prefetching. Only the oldest few are looked at (O(1)): a dead job's
    /// prefetches are older than a live job's.
    fn stale_ahead(&self) -> Option<u32> {
        if !self.cfg.release_idle {
            return None;
        }
        // A job is gone when it is absent from both periods; sets that overflowed, or a
        // previous period that saw nothing, say nothing (as `JobSet::all_absent_from`
        // of a one-job set), so no block qualifies and none is looked up. Tested per
        // job rather than through a one-job `JobSet` per block (an allocation each).
        if !self.prev_period_jobs.seen_any()
            || self.period_jobs.overflow
            || self.prev_period_jobs.overflow
        {
            return None;
        }
        // No block's job is gone when no job with a block in `ahead` is: the walk
        // below would find none (a few jobs prefetch; one, `zarr`, is the usual case).
        let reading = |job: &u64| {
            self.period_jobs.jobs.contains(job) || self.prev_period_jobs.jobs.contains(job)
        };
        if self.ahead_jobs.len() <= JobSet::CAP && self.ahead_jobs.keys().all(reading) {
            return None;
        }
        self.ahead
            .values()
            .take(STALE_AHEAD_LOOK)
            .find(|(_, job)| {
                !self.period_jobs.jobs.contains(job) && !self.prev_period_jobs.jobs.contains(job)
            })
            .map(|&(id, _)| id)
    }

    /// Remembers whether the demand read `ctx` of block `key` (hash `h`) stopped in the
    /// middle of it: that block is then its stream's current block
    /// (`scan_keeps_blocks_mid_read`).
    fn note_read(&mut self, key: &CacheKey, h: u64, ctx: &AccessContext) {
        if !self.cfg.scan_keeps_blocks_mid_read {
            return;
        }
        let (CacheKey::File(k), Some(offset)) = (key, ctx.read_offset) else {
            return;
        };
        self.reads += 1;
        let stream = mix64(ctx.job.0 ^ hash_bytes(k.location.as_bytes()));
        if let Some(i) = self.mid_read.iter().position(|m| m.stream == stream) {
            self.mid_read.remove(i);
        } else if self.mid_read.len() == MID_READ_STREAMS {
            self.mid_read.pop_front();
        }
        let end = offset.saturating_add(ctx.read_len);
        let block_end = (k.block + 1).saturating_mul(k.block_size);
        let streaming = ctx.obs.run_bytes >= k.block_size;
        self.mid_read.push_back(MidRead {
            stream,
            block: (end < block_end && streaming).then_some(h),
            tick: self.reads,
        });
    }

    /// Whether some stream is in the middle of reading the block of hash `h`.
    fn mid_read(&self, h: u64) -> bool {
        self.mid_read
            .iter()
            .any(|m| m.block == Some(h) && self.reads - m.tick <= MID_READ_TICKS)
    }

    /// The oldest item of `consumed` that no stream is in the middle of reading, among
    /// the first `MID_READ_STREAMS + 1` (recency order puts the blocks being read at
    /// the young end, so one is found there unless the queue holds only those).
    fn consumed_behind(&self) -> Option<u32> {
        self.consumed
            .values()
            .take(MID_READ_STREAMS + 1)
            .copied()
            .find(|&c| !self.mid_read(self.slots[c as usize].e.hash))
    }

    fn rebalance(&mut self) {
        let items = self.entries.len();
        self.sketch.set_items(
            items,
            self.cfg.sketch_follows_items,
            self.cfg.sketch_max_width,
        );
        let (f, s) = (self.gain_freq, self.gain_stable);
        let step = self.cfg.rebalance_step;
        if self.cfg.adapt_stable_per_hit {
            // Moved per hit instead (`stable_evidence`).
        } else if f > s * 1.1 {
            self.stable_share = (self.stable_share - step).max(0.0);
        } else if s > f * 1.1 {
            self.stable_share = (self.stable_share + step).min(1.0);
        }
        self.gain_freq /= 2.0;
        self.gain_stable /= 2.0;

        self.rebalances += 1;
    }

    /// The scan side's own victim when the item about to be inserted is a sequential
    /// scan's demand miss and scan data has shown no reuse yet
    /// (`main_kept_until_scan_reuse`): the stable subset's largest hash, else the
    /// oldest scan data read, else the oldest prefetched block. `None` when the rule
    /// does not apply or the scan side holds nothing.
    fn scan_side_pays(&self) -> Option<u32> {
        if !self.cfg.main_kept_until_scan_reuse || self.scan_reuse_seen {
            return None;
        }
        if !self.pending_sequential_miss || !matches!(self.pending, Some((_, Pool::Consumed))) {
            return None;
        }
        self.stable
            .last_key_value()
            .map(|(_, &k)| k)
            .or_else(|| self.consumed.first_key_value().map(|(_, &k)| k))
            .or_else(|| self.ahead.first_key_value().map(|(_, &(k, _))| k))
    }
}

impl EvictionPolicy for PatternAwarePolicy {
    fn name(&self) -> &'static str {
        "strata"
    }

    fn recency_periods(&self) -> u64 {
        self.guard.as_ref().map_or(0, |g| g.period.engaged)
    }

    fn frequency_periods(&self) -> u64 {
        self.freq_guard.as_ref().map_or(0, |g| g.period.engaged)
    }

    fn admit(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) -> bool {
        let h = key_hash(key);
        if ctx.is_prefetch() {
            self.pending = Some((h, Pool::Ahead));
            self.pending_in_order = false;
            return true;
        }
        let obs = ctx.obs;
        self.last_demanded = None;
        self.note_read(key, h, ctx);
        if let Some(g) = self.guard.as_mut() {
            g.on_demand(h, size, false, ctx.job.0, &mut self.sign_test);
        }
        if let Some(g) = self.freq_guard.as_mut() {
            g.on_demand(h, size, false, &mut self.sign_test);
        }
        let seen = self.seen_check_set(h);
        if !obs.repeat {
            self.count(h);
        }
        let retention = self.retention(&obs, key, size);
        self.on_demand_miss(h, size, ctx.job.0, &obs, retention, seen);
        self.touched += size;
        let pool = self.pool_for(retention);
        self.pending = Some((h, pool));
        self.pending_sequential_miss = retention == Pattern::Sequential;
        self.pending_in_order = self.whole_file_in_order(&obs, key, size);
        true
    }

    fn on_insert(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) {
        let h = key_hash(key);
        let pool = match self.pending.take() {
            Some((ph, pool)) if ph == h => pool,
            _ if ctx.is_prefetch() => Pool::Ahead,
            _ => self.pool_for(self.retention(&ctx.obs, key, size)),
        };
        if ctx.is_demand() {
            self.last_demanded = Some(h);
        }
        let mut e = Entry {
            size,
            pool,
            hash: h,
            order: UNPROVEN,
            seq: 0,
            job: ctx.job.0,
            in_order: std::mem::take(&mut self.pending_in_order) && ctx.is_demand(),
            touch: self.touched,
            pos: 0,
            from_main: std::mem::take(&mut self.pending_from_main) && ctx.is_demand(),
            reader: ctx.job.0,
            read_bytes: if ctx.is_demand() { ctx.read_len } else { 0 },
        };
        let id = match self.entries.get(key) {
            // Already resident (not from the replay or the daemon, which insert only
            // what is not): out of its pool, and in again as new.
            Some(&id) => {
                let old = self.slots[id as usize].e;
                self.unlink(&old);
                id
            }
            None => {
                let id = self.alloc_slot(key.clone(), e);
                self.entries.insert(key.clone(), id);
                id
            }
        };
        self.link(id, &mut e, pool);
        self.slots[id as usize].e = e;
        self.touch_recent(id);
        if ctx.is_prefetch() && self.cfg.guard_sees_prefetch {
            if let Some(g) = self.guard.as_mut() {
                g.on_prefetch_insert(h, size);
            }
        }
    }

    fn on_unfilled_miss(&mut self, key: &CacheKey, ctx: &AccessContext) {
        let h = key_hash(key);
        if let Some(g) = self.guard.as_mut() {
            g.on_unfilled_miss(h, ctx.job.0, &mut self.sign_test);
        }
    }

    fn on_hit(&mut self, key: &CacheKey, ctx: &AccessContext) {
        if !ctx.is_demand() {
            return;
        }
        let obs = ctx.obs;
        let Some(&id) = self.entries.get(key) else {
            return;
        };
        self.note_read(key, self.slots[id as usize].e.hash, ctx);
        let slot = &mut self.slots[id as usize].e;
        if !obs.repeat {
            self.touched += slot.size;
            slot.touch = self.touched;
        }
        slot.reader = ctx.job.0;
        let e = *slot;
        if let Some(g) = self.guard.as_mut() {
            g.on_demand(e.hash, e.size, true, ctx.job.0, &mut self.sign_test);
            self.touch_recent(id);
        }
        if let Some(g) = self.freq_guard.as_mut() {
            g.on_demand(e.hash, e.size, true, &mut self.sign_test);
        }
        if e.pool == Pool::Ahead && !self.reload.is_empty() {
            // The block's next demand read after the entry: it is used up.
            self.reload.remove(&e.hash);
        }
        self.seen_check_set(e.hash);
        self.last_demanded = Some(e.hash);
        if self.cfg.release_idle {
            self.period_jobs.insert(ctx.job.0);
        }
        if !obs.repeat {
            self.count(e.hash);
        }
        match e.pool {
            Pool::Ahead => {
                // Read now: it joins its pattern's pool as a fresh demand fill would.
                let pool = self.pool_for(self.retention(&obs, key, e.size));
                let in_order = self.whole_file_in_order(&obs, key, e.size);
                self.slots[id as usize].e.in_order = in_order;
                self.move_to(id, pool);
            }
            // Read again in a new visit: to the frequency main if it is as frequent as
            // the main's least frequent item (W-TinyLFU's admission test),
            // else it stays recency data. Promoting every re-read (ARC's T1 -> T2) let
            // scan data read exactly twice (a shuffled loader's second epoch) crowd out
            // skewed tenants' hot blocks once the queue kept a share (`mix`, `mixed`).
            Pool::Consumed if !obs.repeat => {
                self.scan_reuse_seen = true;
                let pool = if self.main_admits(e.hash) {
                    Pool::Freq
                } else {
                    Pool::Consumed
                };
                self.move_to(id, pool);
            }
            // Still being read (the same visit): it is not behind its stream yet, so to
            // the young end of the queue (evict-behind means behind).
            Pool::Consumed => self.move_to(id, Pool::Consumed),
            // Re-read (proven) while its stream is now ranked by frequency: it leaves
            // the subset for the main (`stable_follows_retention`).
            Pool::Stable
                if !obs.repeat
                    && self.cfg.stable_follows_retention
                    && self.retention(&obs, key, e.size) == Pattern::Skewed =>
            {
                self.scan_reuse_seen = true;
                self.move_to(id, Pool::Freq);
            }
            Pool::Stable if !obs.repeat && e.order == UNPROVEN => {
                self.scan_reuse_seen = true;
                self.prove_stable(id);
            }
            Pool::Freq if !obs.repeat => {
                self.freq_side_hits += 1;
                self.hit_jobs.insert(ctx.job.0);
                self.move_to(id, Pool::Freq)
            }
            // A read of the same visit too: a block still being read (a tar shard read
            // 10 KiB at a time before its stream is classified) is not old yet; left
            // at its insertion position, other tenants' misses pushed it out between
            // two of its reads (`mix`: the shard tenant re-fetched blocks a few reads
            // later). The frequency sketch still counts visits only.
            Pool::Window => {
                self.freq_side_hits += 1;
                self.hit_jobs.insert(ctx.job.0);
                self.move_to(id, Pool::Window)
            }
            _ => {}
        }
    }

    fn on_remove(&mut self, key: &CacheKey) {
        let Some(id) = self.entries.remove(key) else {
            return;
        };
        let e = self.slots[id as usize].e;
        self.unlink(&e);
        let (seq, pos) = std::mem::take(&mut self.slots[id as usize].recent);
        if self.recent_built {
            self.recent.remove_at(&seq, pos);
        }
        self.slots[id as usize].key = None;
        self.free.push(id);
        let evicted = self.last_victim.take() == Some(e.hash);
        // A reload ghost entry is used up by the block's next demand read (a miss, or
        // the first read of a prefetched copy); a prefetched copy evicted unread leaves
        // it, since the block's last read is still the one it records (`torch` at 40%
        // with prefetch: the re-read's readahead was evicted unread and each block then
        // missed; without the entry none of those misses counted).
        if self.cfg.reload_ghost && evicted && e.pool == Pool::Consumed {
            self.push_reload(e.hash, e.size, e.touch);
        }
        if evicted {
            self.victims[pool_ix(e.pool)] += 1;
            self.mark_scan_victim(e.hash, matches!(e.pool, Pool::Consumed | Pool::Stable));
            match e.pool {
                Pool::Window => {
                    let seg = usize::from(e.from_main && self.cfg.main_victims_stay_main);
                    self.push_ghost(e.hash, e.size, seg)
                }
                Pool::Freq => self.push_ghost(e.hash, e.size, 1),
                Pool::Consumed if self.cfg.adapt_consumed => self.push_ghost(e.hash, e.size, 2),
                _ => {}
            }
        }
    }

    fn victim(&mut self) -> Option<CacheKey> {
        let k = self.victim_slot()?;
        let k = self.spare_starved(k);
        self.slot_key(k)
    }
}

impl PatternAwarePolicy {
    /// The policy's own victim (`victim` may replace it to spare a starved job).
    fn victim_slot(&mut self) -> Option<u32> {
        // What is resident is a lower bound on the capacity; adding the item about to
        // come in is not (the cache asks for a victim because the two exceed it).
        let cap = self.cap.max(self.resident_bytes());
        if cap != self.cap {
            self.cap = cap;
            self.sketch.set_items(
                self.entries.len(),
                self.cfg.sketch_follows_items,
                self.cfg.sketch_max_width,
            );
        }
        if let Some(g) = self.freq_guard.as_mut() {
            g.set_capacity(self.cap);
        }
        if let Some(g) = self.guard.as_mut() {
            g.set_capacity(self.cap);
            let in_period = g.recency_period();
            let keep = g.sparing();
            if let Some(k) = self.least_recent(in_period, keep) {
                // Not the policy's choice: its ghosts and counters learn nothing from it.
                self.last_victim = None;
                return Some(k);
            }
        }
        // The recency queue of scan data keeps its learnt share; beyond it, its oldest
        // item joins the stable subset if the subset wants it, else it is the victim
        // (evict-behind).
        if let Some(k) = self.stale_ahead() {
            self.stale_ahead_victims += 1;
            self.last_victim = Some(self.slots[k as usize].e.hash);
            return Some(k);
        }
        let mut scan_victim = None;
        while self.bytes[0] as f64 > self.consumed_target {
            let Some(c) = self.consumed_behind() else {
                break;
            };
            let Entry { hash, size, .. } = self.slots[c as usize].e;
            let frequent = self.stable_takes_frequent(hash);
            if frequent || self.stable_wants(hash, size) {
                self.move_to(c, Pool::Stable);
                if frequent {
                    self.scan_reuse_seen = true;
                    self.prove_stable(c);
                }
            } else {
                scan_victim = Some(c);
                break;
            }
        }
        let pick = if let Some(k) = scan_victim {
            Some(k)
        } else if (self.bytes[1] as f64) > self.cfg.ahead_share * self.cap as f64
            && !self.ahead.is_empty()
        {
            self.ahead.first_key_value().map(|(_, &(k, _))| k)
        } else {
            let freq_side = self.bytes[3] + self.bytes[4];
            let retained = self.bytes[2] + freq_side;
            let stable_over = self.bytes[2] as f64 > self.stable_share * retained as f64;
            if !self.stable.is_empty() && (stable_over || freq_side == 0) {
                self.stable.last_key_value().map(|(_, &k)| k)
            } else if freq_side > 0 {
                // The window -> main contest runs as usual; only a main item that
                // lost to a sequential newcomer before any scan reuse is kept.
                let k = self.freq_victim();
                let main_item = k.is_some_and(|k| self.slots[k as usize].e.pool == Pool::Freq);
                if !main_item {
                    return k;
                }
                match self.scan_side_pays() {
                    Some(own) => Some(own),
                    None => return k,
                }
            } else if let Some((_, &(k, _))) = self.ahead.first_key_value() {
                Some(k)
            } else {
                self.consumed.first_key_value().map(|(_, &k)| k)
            }
        };
        let k = pick?;
        self.last_victim = Some(self.slots[k as usize].e.hash);
        Some(k)
    }
}

mod binomial;
mod config;
mod frequency_guard;
mod frequency_side;
mod guard_period;
mod recency_guard;
mod recency_order;
mod reload;
mod seq_queue;
mod shadow_lru;
mod shadow_tinylfu;
mod sketch;
mod stable_subset;
mod stats;
#[cfg(test)]
mod tests;
