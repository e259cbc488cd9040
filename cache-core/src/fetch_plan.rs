//! How a confirmed sequential stream is fetched from the store: how many bytes to keep
//! in flight (from the measured link) and how large each ranged GET is (consecutive
//! blocks coalesced into one request, then split into cache blocks). Pure logic: no
//! I/O, no clock (durations and instants arrive as arguments); the engine and the
//! reader do the I/O ([`crate::ObjectReader::fetch_run`]).
//!
//! - **Larger requests.** A store charges per request (signing, a connection turn, the
//!   server's per-request work), so one 8 MiB GET costs far less than eight of 1 MiB
//!   (issue 14: Strata sent 1,024 GETs of 1 MiB for a 1 GiB `dd` where mountpoint-s3
//!   sent 128 of 8 MiB). [`coalesce`] groups consecutive blocks into runs of at most
//!   `max_blocks`; each run is one GET.
//! - **Ramp.** A stream's requests start at one block and double with each prefetch of
//!   the stream ([`RequestRamp`]), so the first bytes reach a reader that may yet turn
//!   out random soon, and a long stream reaches full-size requests after a few reads.
//! - **Window from the bandwidth-delay product.** [`LinkEstimator`] follows the
//!   aggregate delivery rate of the store (idle spells left out) and the time one
//!   request takes; by Little's
//!   law the bytes in flight needed to keep the rate are rate x request time, kept at
//!   twice that so the estimate can grow when more parallelism pays (as a probe does),
//!   clamped to `[min, max]`.

use std::ops::Range;

/// Tunables of the fetch window. Every default carries its reason.
#[derive(Clone, Debug, PartialEq)]
pub struct FetchWindowConfig {
    /// Largest ranged GET: 8 MiB, mountpoint-s3's part size; S3's own guidance for
    /// ranged reads (8-16 MiB per request) and large enough that per-request costs
    /// vanish, small enough that a few are in flight per stream.
    pub max_request: u64,
    /// Smallest in-flight target: 16 MiB (two full requests), what the link gets
    /// before anything was measured, and a floor for a link measured while idle.
    pub min_in_flight: u64,
    /// Largest in-flight target: 256 MiB, a quarter of the default 1 GiB memory tier
    /// (prefetched bytes land there), and 1 s of a 2 Gbit/s link.
    pub max_in_flight: u64,
    /// Multiple of the bandwidth-delay product kept in flight: 2, so the measured rate
    /// can rise when more requests in flight raise it (with exactly one BDP the rate
    /// measured can never exceed what the window allows).
    pub headroom: f64,
    /// Weight of a new sample in the estimator's averages: 1/4, a few requests' memory.
    pub ewma_weight: f64,
    /// Shortest interval over which a delivery rate is measured: 50 ms; shorter spans
    /// see one request's burst, not the link.
    pub rate_interval_ns: u64,
}

impl Default for FetchWindowConfig {
    fn default() -> Self {
        FetchWindowConfig {
            max_request: 8 << 20,
            min_in_flight: 16 << 20,
            max_in_flight: 256 << 20,
            headroom: 2.0,
            ewma_weight: 0.25,
            rate_interval_ns: 50_000_000,
        }
    }
}

/// Groups the ascending block numbers `blocks` into runs of consecutive blocks of at
/// most `max_blocks` each (at least 1), in order. Duplicates are ignored.
pub fn coalesce(blocks: &[u64], max_blocks: u64) -> Vec<Range<u64>> {
    let max_blocks = max_blocks.max(1);
    let mut runs: Vec<Range<u64>> = Vec::new();
    for &b in blocks {
        match runs.last_mut() {
            Some(r) if b < r.end => {} // a duplicate (or out of order): already covered
            Some(r) if b == r.end && r.end - r.start < max_blocks => r.end += 1,
            _ => runs.push(b..b + 1),
        }
    }
    runs
}

/// The ranged GETs for the ascending blocks `blocks` that one stream may fetch now:
/// runs of consecutive blocks, each at most as long as the stream's ramp allows at
/// that point (the ramp advances with each run, so a long first prefetch still starts
/// with a small request). When `stopped_by_backlog` (the in-flight bound refused the
/// blocks after these), a last run shorter than its allowance is not sent but
/// returned as released: it would be a small GET, and the next prefetch of the
/// stream, once the backlog drains, sends it as part of a full one. That holds for a
/// lone run too: a full window drains a block at a time as requests land, and sending
/// what fits then is TCP's silly window, one small GET per read (issue 14: on a cold
/// 1 GiB `dd` 48 of 195 GETs were single blocks, 137 GETs in all once held back; the
/// peer sends 129). A stream held back loses nothing it needs: the backlog is full of
/// bytes in flight, and a block its reader reaches first is a demand read.
pub fn plan_runs(
    blocks: &[u64],
    ramp: &mut RequestRamp,
    stopped_by_backlog: bool,
) -> (Vec<Range<u64>>, Vec<u64>) {
    let mut runs: Vec<(Range<u64>, u64)> = Vec::new();
    for &b in blocks {
        match runs.last_mut() {
            Some((r, _)) if b < r.end => {}
            Some((r, cap)) if b == r.end && r.end - r.start < *cap => r.end += 1,
            _ => runs.push((b..b + 1, ramp.next_blocks())),
        }
    }
    let mut released = Vec::new();
    if stopped_by_backlog {
        if let Some((r, cap)) = runs.last() {
            if r.end - r.start < *cap {
                released.extend(r.clone());
                runs.pop();
            }
        }
    }
    (runs.into_iter().map(|(r, _)| r).collect(), released)
}

/// The last block to fetch for readahead asked up to block `last` from block `first`
/// (inclusive) of an object of `total` blocks, when requests are `request_blocks`
/// long: the range is stretched to one whole request. Readahead is asked for as the
/// reader advances, a read's worth at a time; fetching only what was asked would send
/// one small GET per read, while stretching it makes every GET of a stream a full
/// request (the next asks then find their blocks in flight already).
pub fn stretch_readahead(first: u64, last: u64, request_blocks: u64, total: u64) -> u64 {
    if total == 0 {
        return last;
    }
    let stretched = first.saturating_add(request_blocks.max(1) - 1);
    last.max(stretched.min(total - 1))
}

/// Request size of one stream, ramping from one block to `max_blocks`: each call
/// ([`RequestRamp::next_blocks`]) doubles it; [`RequestRamp::reset`] (the stream broke)
/// starts over.
#[derive(Clone, Debug)]
pub struct RequestRamp {
    current: u64,
    max_blocks: u64,
}

impl RequestRamp {
    /// A ramp for requests of at most `max_request` bytes in blocks of `block_size`.
    pub fn new(max_request: u64, block_size: u64) -> Self {
        RequestRamp {
            current: 1,
            max_blocks: (max_request / block_size.max(1)).max(1),
        }
    }

    /// Blocks per request for this prefetch; the next one gets twice as many.
    pub fn next_blocks(&mut self) -> u64 {
        let now = self.current;
        self.current = (self.current * 2).min(self.max_blocks);
        now
    }

    /// Blocks the next request may have, without advancing.
    pub fn peek_blocks(&self) -> u64 {
        self.current
    }

    /// Full-size requests from now on (a whole small file, known to be wanted).
    pub fn skip_to_max(&mut self) {
        self.current = self.max_blocks;
    }

    /// The stream broke (a random read): small requests again.
    pub fn reset(&mut self) {
        self.current = 1;
    }

    pub fn max_blocks(&self) -> u64 {
        self.max_blocks
    }
}

/// The store link as measured from completed requests: aggregate delivery rate and the
/// time one request takes (first byte and whole). See the module doc.
#[derive(Clone, Debug)]
pub struct LinkEstimator {
    cfg: FetchWindowConfig,
    /// EWMA of a request's time to first byte, seconds (0: none measured).
    ttfb_s: f64,
    /// EWMA of a request's whole duration, seconds.
    request_s: f64,
    /// EWMA of the aggregate delivery rate, bytes per second (0: none measured yet).
    rate: f64,
    /// Start of the current rate interval and bytes completed since.
    interval_start_ns: Option<u64>,
    interval_bytes: u64,
    /// When the last request completed.
    last_done_ns: Option<u64>,
    samples: u64,
}

impl LinkEstimator {
    pub fn new(cfg: FetchWindowConfig) -> Self {
        LinkEstimator {
            cfg,
            ttfb_s: 0.0,
            request_s: 0.0,
            rate: 0.0,
            interval_start_ns: None,
            interval_bytes: 0,
            last_done_ns: None,
            samples: 0,
        }
    }

    pub fn config(&self) -> &FetchWindowConfig {
        &self.cfg
    }

    fn blend(&self, old: f64, new: f64) -> f64 {
        if old == 0.0 {
            new
        } else {
            old + self.cfg.ewma_weight * (new - old)
        }
    }

    /// A request of `bytes` completed at `now_ns` (any monotonic clock), after
    /// `ttfb_ns` to its first byte and `total_ns` in all.
    pub fn observe(&mut self, now_ns: u64, bytes: u64, ttfb_ns: u64, total_ns: u64) {
        self.samples += 1;
        self.ttfb_s = self.blend(self.ttfb_s, ttfb_ns as f64 / 1e9);
        self.request_s = self.blend(self.request_s, total_ns.max(ttfb_ns) as f64 / 1e9);
        // The delivery rate counts what all requests together delivered over an
        // interval. A request that began after a quiet spell (no completion for a
        // rate interval) opens a new interval at its own start, so idle time is not
        // read as a slow link.
        let began = now_ns.saturating_sub(total_ns);
        let quiet = self
            .last_done_ns
            .is_some_and(|last| began > last + self.cfg.rate_interval_ns);
        if quiet {
            self.interval_start_ns = None;
            self.interval_bytes = 0;
        }
        self.last_done_ns = Some(now_ns);
        let start = *self.interval_start_ns.get_or_insert(began);
        self.interval_bytes += bytes;
        let span = now_ns.saturating_sub(start);
        if span >= self.cfg.rate_interval_ns {
            let rate = self.interval_bytes as f64 * 1e9 / span as f64;
            self.rate = self.blend(self.rate, rate);
            self.interval_start_ns = Some(now_ns);
            self.interval_bytes = 0;
        }
    }

    /// Requests measured so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Measured aggregate rate, bytes per second (0 before the first interval).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Measured time to first byte, seconds (0 before the first request).
    pub fn ttfb_s(&self) -> f64 {
        self.ttfb_s
    }

    /// The bandwidth-delay product: rate x request time (0 before measurements).
    pub fn bdp_bytes(&self) -> u64 {
        (self.rate * self.request_s) as u64
    }

    /// Bytes to keep in flight: `headroom` x the BDP, clamped to the configured range.
    pub fn in_flight_target(&self) -> u64 {
        let want = (self.bdp_bytes() as f64 * self.cfg.headroom) as u64;
        want.clamp(self.cfg.min_in_flight, self.cfg.max_in_flight)
    }
}

impl Default for LinkEstimator {
    fn default() -> Self {
        LinkEstimator::new(FetchWindowConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const MS: u64 = 1_000_000;

    #[test]
    fn coalesce_groups_consecutive_blocks_up_to_the_cap() {
        assert_eq!(coalesce(&[], 8), Vec::<Range<u64>>::new());
        assert_eq!(coalesce(&[3], 8), vec![3..4]);
        assert_eq!(coalesce(&[0, 1, 2, 3, 4], 2), vec![0..2, 2..4, 4..5]);
        // A gap (a block cached already or in flight) splits a run.
        assert_eq!(coalesce(&[0, 1, 3, 4, 5, 9], 8), vec![0..2, 3..6, 9..10]);
        // Duplicates do not make a block fetched twice.
        assert_eq!(coalesce(&[1, 1, 2, 2, 3], 8), vec![1..4]);
        // A cap of 0 is treated as 1: one block per request.
        assert_eq!(coalesce(&[5, 6], 0), vec![5..6, 6..7]);
    }

    #[test]
    fn coalesce_covers_each_block_once() {
        let blocks: Vec<u64> = (0..100).filter(|b| b % 7 != 3).collect();
        for cap in 1..12 {
            let runs = coalesce(&blocks, cap);
            let covered: Vec<u64> = runs.iter().flat_map(|r| r.clone()).collect();
            assert_eq!(covered, blocks, "cap {cap}");
            assert!(runs.iter().all(|r| r.end - r.start <= cap));
        }
    }

    #[test]
    fn planned_runs_ramp_up_within_one_prefetch() {
        let mut ramp = RequestRamp::new(8 * MIB, MIB);
        let blocks: Vec<u64> = (0..40).collect();
        let (runs, released) = plan_runs(&blocks, &mut ramp, false);
        assert_eq!(
            runs,
            vec![0..1, 1..3, 3..7, 7..15, 15..23, 23..31, 31..39, 39..40]
        );
        assert!(released.is_empty());
        // The ramp stays at full size for the stream's next prefetch.
        let (runs, _) = plan_runs(&[50, 51, 52], &mut ramp, false);
        assert_eq!(runs, vec![50..53]);
    }

    #[test]
    fn a_short_last_run_cut_by_the_backlog_waits_for_a_full_one() {
        let mut ramp = RequestRamp::new(8 * MIB, MIB);
        for _ in 0..4 {
            ramp.next_blocks();
        }
        // Full-size requests now; the backlog let 11 blocks through.
        let blocks: Vec<u64> = (100..111).collect();
        let (runs, released) = plan_runs(&blocks, &mut ramp, true);
        assert_eq!(runs, vec![100..108]);
        assert_eq!(released, vec![108, 109, 110]);
        // Not cut by the backlog (the order ended there): sent as it is.
        let (runs, released) = plan_runs(&blocks, &mut ramp, false);
        assert_eq!(runs, vec![100..108, 108..111]);
        assert!(released.is_empty());
        // A lone short run cut by the backlog waits too: the window drained by a
        // block behind requests still on the wire; no 1-block GET.
        let (runs, released) = plan_runs(&[40], &mut ramp, true);
        assert!(runs.is_empty());
        assert_eq!(released, vec![40]);
        // A full run goes even then.
        let blocks: Vec<u64> = (40..48).collect();
        let (runs, released) = plan_runs(&blocks, &mut ramp, true);
        assert_eq!(runs, vec![40..48]);
        assert!(released.is_empty());
        // Not cut by the backlog (the object ends there): sent as it is.
        let (runs, released) = plan_runs(&[98, 99], &mut ramp, false);
        assert_eq!(runs, vec![98..100]);
        assert!(released.is_empty());
    }

    #[test]
    fn readahead_is_stretched_to_a_whole_request_within_the_object() {
        // Asked for blocks 10..=10 with 8-block requests: fetch 10..=17.
        assert_eq!(stretch_readahead(10, 10, 8, 100), 17);
        // Asked for more than a request: unchanged.
        assert_eq!(stretch_readahead(10, 30, 8, 100), 30);
        // Never past the last block.
        assert_eq!(stretch_readahead(95, 96, 8, 100), 99);
        // One-block requests: unchanged.
        assert_eq!(stretch_readahead(4, 4, 1, 100), 4);
        assert_eq!(stretch_readahead(4, 4, 0, 100), 4);
        // An empty object: nothing to stretch.
        assert_eq!(stretch_readahead(0, 0, 8, 0), 0);
    }

    #[test]
    fn requests_ramp_from_one_block_to_the_max_and_reset() {
        let mut ramp = RequestRamp::new(8 * MIB, MIB);
        let sizes: Vec<u64> = (0..6).map(|_| ramp.next_blocks()).collect();
        assert_eq!(sizes, vec![1, 2, 4, 8, 8, 8]);
        ramp.reset();
        assert_eq!(ramp.next_blocks(), 1);
        // Blocks larger than a request: one block per request.
        let mut big = RequestRamp::new(8 * MIB, 16 * MIB);
        assert_eq!(big.max_blocks(), 1);
        assert_eq!(big.next_blocks(), 1);
        assert_eq!(big.next_blocks(), 1);
    }

    #[test]
    fn unmeasured_link_gets_the_minimum_window() {
        let est = LinkEstimator::default();
        assert_eq!(est.bdp_bytes(), 0);
        assert_eq!(est.in_flight_target(), 16 * MIB);
    }

    /// Drives the estimator with requests of `size` bytes completing back to back at
    /// `rate` bytes/s aggregate, each taking `request_ms`.
    fn drive(est: &mut LinkEstimator, rate: f64, size: u64, ttfb_ms: u64, request_ms: u64) {
        let gap_ns = (size as f64 / rate * 1e9) as u64;
        let mut now = 1_000 * MS;
        for _ in 0..200 {
            now += gap_ns;
            est.observe(now, size, ttfb_ms * MS, request_ms * MS);
        }
    }

    #[test]
    fn window_is_twice_rate_times_request_time() {
        let mut est = LinkEstimator::default();
        // 8 MiB requests at 1 GB/s aggregate, each taking 40 ms: BDP 40 MB, keep 80 MB.
        drive(&mut est, 1e9, 8 * MIB, 5, 40);
        let rate = est.rate();
        assert!((rate - 1e9).abs() / 1e9 < 0.05, "rate {rate}");
        assert!((est.ttfb_s() - 0.005).abs() < 1e-6);
        let bdp = est.bdp_bytes() as f64;
        assert!((bdp - 40e6).abs() / 40e6 < 0.05, "bdp {bdp}");
        let target = est.in_flight_target() as f64;
        assert!((target - 80e6).abs() / 80e6 < 0.05, "target {target}");
    }

    #[test]
    fn window_is_clamped_both_ways() {
        let mut slow = LinkEstimator::default();
        // 10 MB/s with 10 ms requests: BDP 100 kB, below the floor.
        drive(&mut slow, 10e6, MIB, 2, 10);
        assert_eq!(slow.in_flight_target(), 16 * MIB);
        let mut fast = LinkEstimator::default();
        // 10 GB/s with 1 s requests: far above the cap.
        drive(&mut fast, 10e9, 8 * MIB, 100, 1000);
        assert_eq!(fast.in_flight_target(), 256 * MIB);
    }

    #[test]
    fn idle_time_is_not_read_as_a_slow_link() {
        let mut est = LinkEstimator::default();
        drive(&mut est, 1e9, 8 * MIB, 5, 40);
        let before = est.rate();
        // A burst at 1 GB/s ten seconds after the last one: the quiet spell does not
        // count (counted, the first interval would measure ~1 MB/s).
        let gap = 8 * MIB; // ns between completions at 1 GB/s (8 MiB / 1e9 B/s)
        for i in 0..9 {
            est.observe(100_000 * MS + i * gap, 8 * MIB, 5 * MS, 40 * MS);
        }
        assert!(est.rate() > 0.85 * before, "{} vs {before}", est.rate());
    }
}
