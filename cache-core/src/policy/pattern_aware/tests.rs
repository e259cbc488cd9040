use super::*;
use crate::access::JobId;
use crate::space::TierSpace;
use crate::tracker::AccessTracker;
use proptest::prelude::*;

const MB: u64 = 1 << 20;

fn demand(job: u64, t: u64) -> AccessContext {
    AccessContext::demand(JobId(job), t)
}

thread_local! {
    /// The engine's tracker, one per test (each test runs on its own thread).
    static TRACKER: std::cell::RefCell<AccessTracker> = std::cell::RefCell::new(AccessTracker::default());
}

/// `ctx` as the engine hands it to a policy: observed by the tracker (demand only).
fn observed(key: &CacheKey, ctx: &AccessContext) -> AccessContext {
    let obs = TRACKER.with(|t| t.borrow_mut().observe(key, ctx));
    AccessContext { obs, ..*ctx }
}

fn pattern_of(key: &CacheKey, ctx: &AccessContext) -> Pattern {
    TRACKER.with(|t| t.borrow().pattern_of(key, ctx))
}

/// Block `b` of the one large file the scan tests read.
fn scan_block(b: u64) -> CacheKey {
    CacheKey::file("scan/big.bin", "v", b)
}

/// A read through a tier as the engine and the replay do it: observe, touch, else place.
fn read(s: &mut TierSpace, key: &CacheKey, size: u64, ctx: &AccessContext) -> bool {
    let ctx = &observed(key, ctx);
    if s.touch(key, ctx) {
        return true;
    }
    let _ = s.place(key, size, ctx);
    false
}

fn strata(cap: u64) -> TierSpace {
    TierSpace::new(cap, Box::new(PatternAwarePolicy::default()))
}

proptest! {
    /// Whatever the sequence of demand reads, prefetches and removals: the victim is
    /// always resident, the budget holds, and the policy's byte counts match the tier's.
    #[test]
    fn victim_is_resident_and_accounting_matches(
        ops in proptest::collection::vec((0u8..4, 0u64..3, 0u64..40, 1u64..4), 1..400)
    ) {
        let mut p = PatternAwarePolicy::default();
        let mut resident: HashMap<CacheKey, u64> = HashMap::new();
        let budget = 20;
        let mut t = 0;
        for (op, job, id, size) in ops {
            t += 1;
            let key = if id % 5 == 0 {
                CacheKey::kv("ns", vec![id as u8])
            } else {
                CacheKey::file(format!("d{}/f{}", id % 3, id % 7), "v", id)
            };
            let ctx = if op == 1 {
                AccessContext::prefetch(JobId(job), t)
            } else {
                demand(job, t)
            };
            if op == 3 {
                if resident.remove(&key).is_some() {
                    p.on_remove(&key);
                }
                continue;
            }
            let ctx = observed(&key, &ctx);
            if resident.contains_key(&key) {
                p.on_hit(&key, &ctx);
                continue;
            }
            if !p.admit(&key, size, &ctx) {
                continue;
            }
            while resident.values().sum::<u64>() + size > budget {
                let v = p.victim();
                prop_assert!(v.is_some(), "no victim while over budget");
                let v = v.expect("checked");
                prop_assert!(resident.contains_key(&v), "victim {v} not resident");
                resident.remove(&v);
                p.on_remove(&v);
            }
            resident.insert(key.clone(), size);
            p.on_insert(&key, size, &ctx);
            let st = p.stats();
            prop_assert_eq!(
                st.stable_bytes + st.freq_bytes + st.consumed_bytes + st.ahead_bytes,
                resident.values().sum::<u64>()
            );
        }
    }
}

/// A hot set (read over and over by one job) survives a one-time scan by another job
/// that is many times larger than the cache.
#[test]
fn hot_set_survives_a_large_scan() {
    let mut s = strata(100 * MB);
    let hot: Vec<CacheKey> = (0..40)
        .map(|i| CacheKey::file(format!("models/m{i}.bin"), "v", 0))
        .collect();
    let mut t = 0;
    // Skewed warm-up: the hot set, read repeatedly.
    for round in 0..30 {
        for (i, k) in hot.iter().enumerate() {
            if (i + round) % 3 != 0 {
                t += 1;
                read(&mut s, k, MB, &demand(1, t));
            }
        }
    }
    // One sequential scan of 1,000 blocks (10x the cache), interleaved with hot reads.
    let mut hot_hits = 0;
    let mut hot_reads = 0;
    for b in 0..1000u64 {
        t += 1;
        read(&mut s, &scan_block(b), MB, &demand(2, t));
        if b % 10 == 0 {
            let k = &hot[(b as usize / 10) % hot.len()];
            t += 1;
            hot_reads += 1;
            if read(&mut s, k, MB, &demand(1, t)) {
                hot_hits += 1;
            }
        }
    }
    let resident_hot = hot.iter().filter(|k| s.contains(k)).count();
    assert!(
        resident_hot >= 36,
        "hot set evicted by the scan: {resident_hot}/40 left"
    );
    assert!(
        hot_hits * 10 >= hot_reads * 9,
        "hot hits {hot_hits}/{hot_reads}"
    );
}

/// The same scan through LRU wipes the hot set (the reason for the test above).
#[test]
fn lru_loses_the_hot_set_to_the_same_scan() {
    let mut s = TierSpace::new(100 * MB, Box::new(crate::policy::LruPolicy::new()));
    let hot: Vec<CacheKey> = (0..40)
        .map(|i| CacheKey::file(format!("models/m{i}.bin"), "v", 0))
        .collect();
    let mut t = 0;
    for _ in 0..30 {
        for k in &hot {
            t += 1;
            read(&mut s, k, MB, &demand(1, t));
        }
    }
    for b in 0..1000u64 {
        t += 1;
        read(&mut s, &scan_block(b), MB, &demand(2, t));
    }
    assert!(hot.iter().filter(|k| s.contains(k)).count() < 5);
}

/// Per-epoch shuffles of a set 5x the cache: the policy keeps a stable subset, so
/// epochs after the first hit about cache/set of their reads (LRU: about 0).
#[test]
fn shuffled_epochs_keep_a_stable_subset() {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let n = 2000u64;
    let cap = n / 5;
    let files: Vec<CacheKey> = (0..n)
        .map(|i| CacheKey::file(format!("train/c{}/img_{i}.jpg", i % 20), "v", 0))
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let run = |s: &mut TierSpace, rng: &mut rand::rngs::StdRng| {
        let mut order: Vec<usize> = (0..n as usize).collect();
        let mut t = 0;
        let mut hits = vec![0u64; 4];
        for h in hits.iter_mut() {
            order.shuffle(rng);
            for &i in &order {
                t += 1;
                if read(s, &files[i], 1, &demand(1, t)) {
                    *h += 1;
                }
            }
        }
        hits
    };
    let mut s = TierSpace::new(cap, Box::new(PatternAwarePolicy::default()));
    let hits = run(&mut s, &mut rng);
    let mut l = TierSpace::new(cap, Box::new(crate::policy::LruPolicy::new()));
    let lru = run(&mut l, &mut rng);
    let share = cap as f64 / n as f64;
    for e in 2..4 {
        let ratio = hits[e] as f64 / n as f64;
        assert!(
            ratio > 0.8 * share,
            "epoch {e}: hit ratio {ratio} vs share {share}"
        );
        assert!(
            hits[e] > 3 * lru[e],
            "epoch {e}: strata {} lru {}",
            hits[e],
            lru[e]
        );
    }
}

/// Prefetched blocks are protected until read, then a sequential stream's consumed
/// blocks go first ("evict behind").
#[test]
fn prefetched_blocks_wait_and_consumed_ones_go_first() {
    let mut p = PatternAwarePolicy::default();
    let ctx = demand(1, 1);
    // Classify job 1's stream on file f as sequential.
    for b in 0..40u64 {
        let k = CacheKey::file("ds/f.bin", "v", b);
        let ctx = observed(&k, &ctx);
        p.admit(&k, 1, &ctx);
        p.on_insert(&k, 1, &ctx);
    }
    assert_eq!(
        pattern_of(&CacheKey::file("ds/f.bin", "v", 40), &ctx),
        Pattern::Sequential
    );
    let ahead = CacheKey::file("ds/f.bin", "v", 41);
    let pf = AccessContext::prefetch(JobId(1), 2);
    p.admit(&ahead, 1, &pf);
    p.on_insert(&ahead, 1, &pf);
    // Everything else is evicted before the unread prefetched block.
    let mut order = Vec::new();
    while let Some(v) = p.victim() {
        p.on_remove(&v);
        order.push(v);
    }
    assert_eq!(order.last(), Some(&ahead));
}

/// Random reads over a set smaller than the cache are all kept (no needless misses).
#[test]
fn small_random_set_fits_entirely() {
    let mut s = strata(100);
    let mut misses_late = 0;
    let mut x = 12345u64;
    for t in 0..5000u64 {
        x = crate::stream::mix64(x);
        let k = CacheKey::file("d/f.bin", "v", x % 50);
        if !read(&mut s, &k, 1, &demand(1, t)) && t > 1000 {
            misses_late += 1;
        }
    }
    assert_eq!(misses_late, 0);
}

/// A tier holding a `PatternAwarePolicy` directly, so its stats stay readable.
struct Sim {
    p: PatternAwarePolicy,
    res: HashMap<CacheKey, u64>,
    used: u64,
    cap: u64,
}

impl Sim {
    fn new(cap: u64) -> Self {
        Sim {
            p: PatternAwarePolicy::default(),
            res: HashMap::new(),
            used: 0,
            cap,
        }
    }
    fn read(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) -> bool {
        let ctx = &observed(key, ctx);
        self.access(key, size, ctx)
    }

    /// A demand access the policy has been told about: a hit, or an admission that
    /// evicts until the block fits. Returns whether it hit.
    fn access(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) -> bool {
        if self.res.contains_key(key) {
            self.p.on_hit(key, ctx);
            return true;
        }
        if self.p.admit(key, size, ctx) {
            while self.used + size > self.cap {
                let v = self.p.victim().expect("a victim while over budget");
                self.used -= self.res.remove(&v).expect("victim is resident");
                self.p.on_remove(&v);
            }
            self.res.insert(key.clone(), size);
            self.used += size;
            self.p.on_insert(key, size, ctx);
        }
        false
    }
}

fn kv(id: u64) -> CacheKey {
    CacheKey::kv("ns", id.to_le_bytes().to_vec())
}

/// The window controller: ghost hits all on the window's side move the share up once
/// the binomial test rejects "even"; all on the main's side move it down; an even split
/// never moves it, however long it goes on.
#[test]
fn window_share_follows_significant_ghost_evidence() {
    let mut p = PatternAwarePolicy::default();
    let start = p.window_share;
    // 16 window votes, none for the main: P = 2 * 0.5^16, far below 0.01.
    for _ in 0..16 {
        p.window_evidence(0);
    }
    let up = p.window_share;
    assert!(
        (up - (start + p.cfg.rebalance_step)).abs() < 1e-9,
        "{start} -> {up}"
    );
    for _ in 0..16 {
        p.window_evidence(1);
    }
    assert!(p.window_share < up, "{} !< {up}", p.window_share);
    // However long the main's side wins, the window keeps its minimum share (at 0 the
    // window -> main contest would stop).
    for _ in 0..64 {
        for _ in 0..16 {
            p.window_evidence(1);
        }
    }
    assert_eq!(p.window_share, p.cfg.window_min_share);
    let before = p.window_share;
    for i in 0..10_000 {
        p.window_evidence(i % 2);
    }
    assert_eq!(p.window_share, before);
    // 12 to 4 is not significant at 0.01 (p = 0.077): no move yet.
    let mut q = PatternAwarePolicy::default();
    for i in 0..16 {
        q.window_evidence(usize::from(i % 4 == 0));
    }
    assert_eq!(q.window_share, start);
}

/// Tests that keep rejecting the same way move the window share 1, 2, 4 steps; a test
/// the other way moves one step back (`window_step_doubles`), and without the rule every
/// move is one step.
#[test]
fn consecutive_window_moves_the_same_way_double() {
    let moves = |doubles: bool, sides: &[usize]| {
        let mut p = PatternAwarePolicy::new(PatternAwareConfig {
            window_step_doubles: doubles,
            ..PatternAwareConfig::default()
        });
        let step = p.cfg.rebalance_step;
        let mut at = vec![p.window_share];
        for &side in sides {
            for _ in 0..16 {
                p.window_evidence(side);
            }
            at.push(p.window_share);
        }
        at.windows(2)
            .map(|w| ((w[1] - w[0]) / step).round() as i64)
            .collect::<Vec<_>>()
    };
    assert_eq!(moves(true, &[0, 0, 0, 1, 0]), [1, 2, 4, -1, 1]);
    assert_eq!(moves(false, &[0, 0, 0, 1, 0]), [1, 1, 1, -1, 1]);
}

/// Zipf-popular reads (static popularity): frequency wins, the window stays small and
/// the hit ratio is at least LRU's.
#[test]
fn window_stays_small_on_zipf() {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Zipf};
    let cap = 100 * MB;
    let mut s = Sim::new(cap);
    let mut l = TierSpace::new(cap, Box::new(crate::policy::LruPolicy::new()));
    let zipf = Zipf::new(1000.0, 0.9).expect("valid");
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (mut hits, mut lru_hits) = (0u64, 0u64);
    for t in 0..40_000u64 {
        let id = zipf.sample(&mut rng) as u64;
        hits += u64::from(s.read(&kv(id), MB, &demand(t % 4, t)));
        lru_hits += u64::from(read(&mut l, &kv(id), MB, &demand(t % 4, t)));
    }
    let w = s.p.stats().window_share;
    assert!(w <= 0.2, "window share {w}");
    assert!(hits > lru_hits, "strata {hits} lru {lru_hits}");
}

/// Two tenants (issue 13's `mix`): job 1 reads a file sequentially, each 1 MiB block in
/// 20 small reads (a tar shard read 10 KiB at a time), while job 2 reads one-block files
/// in a shuffled order, a read of each between job 1's reads. Job 2's misses must not
/// evict the block job 1 is in the middle of: evict-behind means behind the stream.
/// (Before the consumed pool learnt its share, job 1 re-fetched its block after
/// nearly every read of job 2: ~5% hits instead of ~95%.)
#[test]
fn a_block_being_read_survives_another_tenants_misses() {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let cap = 40 * MB;
    let mut s = Sim::new(cap);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut files: Vec<u64> = (0..2000).collect();
    files.shuffle(&mut rng);
    let mut next_file = files.iter().cycle();
    let (mut reads, mut hits, mut t) = (0u64, 0u64, 0u64);
    for b in 0..200u64 {
        for _ in 0..20 {
            t += 1;
            let k = CacheKey::file("shards/train-0.tar", "v", b);
            reads += 1;
            hits += u64::from(s.read(&k, MB, &demand(1, t)));
            let f = next_file.next().copied().unwrap_or(0);
            t += 1;
            let other = CacheKey::file(format!("loader/c{}/img_{f}.jpg", f % 30), "v", 0);
            s.read(&other, MB, &demand(2, t));
        }
    }
    let ratio = hits as f64 / reads as f64;
    assert!(ratio >= 0.9, "job 1 hit ratio {ratio:.3} (LRU: 0.95)");
    assert!(s.p.stats().consumed_target > 0, "{:?}", s.p.stats());
}

/// A sequential scan read once (many small reads per block) gives the consumed pool's
/// ghost no hits: its share stays 0, so evict-behind still protects a hot set.
#[test]
fn a_one_pass_scan_keeps_pure_evict_behind() {
    let cap = 100 * MB;
    let mut s = Sim::new(cap);
    let hot: Vec<CacheKey> = (0..40)
        .map(|i| CacheKey::file(format!("models/m{i}.bin"), "v", 0))
        .collect();
    let mut t = 0;
    for round in 0..30 {
        for (i, k) in hot.iter().enumerate() {
            if (i + round) % 3 != 0 {
                t += 1;
                s.read(k, MB, &demand(1, t));
            }
        }
    }
    let (mut hot_hits, mut hot_reads) = (0, 0);
    for b in 0..1000u64 {
        for _ in 0..5 {
            t += 1;
            s.read(&scan_block(b), MB, &demand(2, t));
        }
        if b % 10 == 0 {
            t += 1;
            hot_reads += 1;
            hot_hits += u64::from(s.read(&hot[(b as usize / 10) % hot.len()], MB, &demand(1, t)));
        }
    }
    assert_eq!(s.p.stats().consumed_target, 0, "{:?}", s.p.stats());
    assert!(
        hot_hits * 10 >= hot_reads * 9,
        "hot hits {hot_hits}/{hot_reads}"
    );
}

/// Arrays read in a shuffled chunk order (issue 13's `npy`: four chunks per block,
/// eight blocks per array, two passes): the reuse is short, so recency wins. The
/// consumed pool's ghost hits make it keep recently read blocks: at least 90% of LRU's
/// hits (pure evict-behind had ~80%).
#[test]
fn shuffled_chunks_of_small_arrays_are_served_like_lru() {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let cap = 5 * MB;
    let mut s = Sim::new(cap);
    let mut l = TierSpace::new(cap, Box::new(crate::policy::LruPolicy::new()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut keys = Vec::new();
    for _pass in 0..2 {
        for a in 0..6 {
            let mut chunks: Vec<u64> = (0..32).collect();
            chunks.shuffle(&mut rng);
            for c in chunks {
                // A 256 KiB chunk as 4 reads of 64 KiB: block c / 4 of the array.
                let k = CacheKey::file(format!("npy/a{a}.npy"), "v", c / 4);
                keys.extend(std::iter::repeat_n(k, 4));
            }
        }
    }
    let (mut hits, mut lru_hits) = (0u64, 0u64);
    for (t, k) in keys.iter().enumerate() {
        hits += u64::from(s.read(k, MB, &demand(1, t as u64)));
    }
    // LRU ignores the tracker's observations, so observing the keys again is harmless.
    for (t, k) in keys.iter().enumerate() {
        lru_hits += u64::from(read(&mut l, k, MB, &demand(1, t as u64)));
    }
    assert!(
        hits * 10 >= lru_hits * 9,
        "strata {hits} lru {lru_hits}: {:?}",
        s.p.stats()
    );
}

impl Sim {
    /// A policy told its capacity, as the engine and the replay build it.
    fn with(cap: u64, cfg: PatternAwareConfig) -> Self {
        Sim {
            p: PatternAwarePolicy::new(PatternAwareConfig {
                capacity_hint: Some(cap),
                ..cfg
            }),
            ..Sim::new(cap)
        }
    }
    /// A policy of the default configuration with one knob set by `set`.
    fn with_knob(cap: u64, set: impl FnOnce(&mut PatternAwareConfig)) -> Self {
        let mut cfg = PatternAwareConfig::default();
        set(&mut cfg);
        Sim::with(cap, cfg)
    }
    /// A prefetch fill (the engine does not observe prefetches).
    fn prefetch(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) {
        if self.res.contains_key(key) || !self.p.admit(key, size, ctx) {
            return;
        }
        while self.used + size > self.cap {
            let v = self.p.victim().expect("a victim while over budget");
            self.used -= self.res.remove(&v).expect("victim is resident");
            self.p.on_remove(&v);
        }
        self.res.insert(key.clone(), size);
        self.used += size;
        self.p.on_insert(key, size, ctx);
    }
}

fn release_cfg(release_idle: bool) -> PatternAwareConfig {
    PatternAwareConfig {
        release_idle,
        // The release alone: these miniatures fit LRU (a round robin that fits once
        // the dead items go), so the guard would hand the runs without the release to
        // recency order and the comparison would test the guard instead.
        recency_guard: false,
        ..PatternAwareConfig::default()
    }
}

/// `mix` in miniature: job 1 reads a skewed hot set (the frequency side) while job 2
/// starts a shuffled two-epoch pass over more files than the cache holds; job 1 then
/// ends. Its frequency side earns nothing any more and its reader is gone, so its
/// space goes to job 2's stable subset in time for the second epoch. Without the
/// release the dead hot set keeps its space and the second epoch hits far less.
/// Returns job 2's second-epoch hits and the policy's stats.
fn tenant_ends_during_a_shuffled_pass(release_idle: bool) -> (u64, PatternAwareStats) {
    let cap = 40 * MB;
    let mut s = Sim::with(cap, release_cfg(release_idle));
    let hot: Vec<CacheKey> = (0..30)
        .map(|i| CacheKey::file(format!("db/m{i}.bin"), "v", 0))
        .collect();
    let n = 60u64;
    let file = |i: u64| CacheKey::file(format!("imgs/c{}/f{i}.jpg", i % 6), "v", 0);
    // A fixed permutation per epoch (multiplier coprime to n).
    let order = |epoch: u64, k: u64| (k * if epoch == 0 { 7 } else { 13 } + epoch * 5) % n;
    let mut t = 0;
    // Job 1 alone: skewed reads of the hot set (Zipf-like: low ids far more often).
    for round in 0..40u64 {
        for i in 0..30u64 {
            if i < 10 || (round + i) % 4 == 0 {
                t += 1;
                s.read(&hot[i as usize], MB, &demand(1, t));
            }
        }
    }
    // Job 2's first epoch; job 1 reads along for the first few files, then ends.
    for k in 0..n {
        t += 1;
        s.read(&file(order(0, k)), MB, &demand(2, t));
        if k < 8 {
            for k in &hot[..10] {
                t += 1;
                s.read(k, MB, &demand(1, t));
            }
        }
    }
    let mut hits = 0;
    for k in 0..n {
        t += 1;
        hits += u64::from(s.read(&file(order(1, k)), MB, &demand(2, t)));
    }
    (hits, s.p.stats())
}

#[test]
fn a_finished_tenants_space_goes_to_the_running_one() {
    let (with, st) = tenant_ends_during_a_shuffled_pass(true);
    let (without, st0) = tenant_ends_during_a_shuffled_pass(false);
    assert!(st.idle_releases >= 1, "{st:?}");
    assert_eq!(st0.idle_releases, 0, "{st0:?}");
    // 40 of 60 files fit: a subset with the whole cache hits ~2/3 of the epoch.
    assert!(
        with >= 25,
        "second epoch hits {with} with the release ({st:?})"
    );
    assert!(
        with >= without + 8,
        "with {with} vs without {without} ({st0:?})"
    );
}

/// A single job whose hot set rests while it scans keeps its frequency side: its
/// reader has not gone, so nothing is released (the `npy` case: labels read again in
/// the second pass).
#[test]
fn a_running_jobs_resting_hot_set_is_not_released() {
    let mut s = Sim::with(20 * MB, PatternAwareConfig::default());
    let hot: Vec<CacheKey> = (0..8)
        .map(|i| CacheKey::file(format!("labels/l{i}.npy"), "v", 0))
        .collect();
    let mut t = 0;
    for _ in 0..30 {
        for k in &hot {
            t += 1;
            s.read(k, MB, &demand(1, t));
        }
    }
    for b in 0..200u64 {
        t += 1;
        s.read(&scan_block(b), MB, &demand(1, t));
    }
    assert_eq!(s.p.stats().idle_releases, 0, "{:?}", s.p.stats());
    let kept = hot.iter().filter(|k| s.res.contains_key(*k)).count();
    assert!(kept >= 7, "hot set left: {kept}/8");
}

/// A gone job's unread prefetches are evicted before a running job's hot data even
/// though `ahead` is within its share; with the release off they stay.
#[test]
fn a_gone_jobs_unread_prefetch_goes_first() {
    let run = |release_idle: bool| {
        let cap = 40 * MB;
        let mut s = Sim::with(cap, release_cfg(release_idle));
        let mut t = 0;
        let pf: Vec<CacheKey> = (0..6)
            .map(|b| CacheKey::file("shards/s0.tar", "v", b))
            .collect();
        t += 1;
        s.read(
            &CacheKey::file("shards/s0.tar", "v", 100),
            MB,
            &demand(1, t),
        );
        for k in &pf {
            t += 1;
            s.prefetch(k, MB, &AccessContext::prefetch(JobId(1), t));
        }
        // Job 2 alone: a hot set larger than what is left, read round robin.
        let hot: Vec<CacheKey> = (0..40)
            .map(|i| CacheKey::file(format!("db/p{i}.bin"), "v", 0))
            .collect();
        let mut hits = 0;
        for round in 0..20 {
            for k in &hot {
                t += 1;
                hits += u64::from(s.read(k, MB, &demand(2, t)) && round >= 10);
            }
        }
        let left = pf.iter().filter(|k| s.res.contains_key(*k)).count();
        (left, hits, s.p.stats())
    };
    let (left, hits, st) = run(true);
    let (left0, hits0, _) = run(false);
    assert_eq!(left, 0, "{st:?}");
    assert!(st.stale_ahead_victims >= 6, "{st:?}");
    assert_eq!(left0, 6);
    assert!(
        hits > hits0,
        "hot hits {hits} vs {hits0} without the release"
    );
}

proptest! {
    /// JobSet against a model: `all_absent_from` is true exactly when neither set
    /// overflowed, the first is not empty and the two share no job.
    #[test]
    fn job_set_matches_a_model(
        a in proptest::collection::vec(0u64..40, 0..30),
        b in proptest::collection::vec(0u64..40, 0..30),
    ) {
        let (mut sa, mut sb) = (JobSet::default(), JobSet::default());
        a.iter().for_each(|&j| sa.insert(j));
        b.iter().for_each(|&j| sb.insert(j));
        let da: std::collections::BTreeSet<u64> = a.iter().copied().collect();
        let db: std::collections::BTreeSet<u64> = b.iter().copied().collect();
        let over = da.len() > JobSet::CAP || db.len() > JobSet::CAP;
        let want = !over && !da.is_empty() && da.is_disjoint(&db);
        prop_assert_eq!(sa.all_absent_from(&sb), want);
        prop_assert_eq!(sa.seen_any(), !a.is_empty());
    }
}

impl Sim {
    /// A demand read whose block-level pattern is given (no tracker): the case where
    /// what the policy is told is the point of the test.
    fn read_as(&mut self, key: &CacheKey, size: u64, job: u64, t: u64, blocks: Pattern) -> bool {
        let ctx = AccessContext {
            obs: Observation {
                blocks,
                ..Observation::default()
            },
            ..demand(job, t)
        };
        self.access(key, size, &ctx)
    }
}

/// `mix` at 40% in miniature: a reader's blocks first land on the frequency side (not
/// classified yet), are evicted from it, and are read again once the stream counts as
/// random. Those re-misses are no hits a larger stable subset would have had (it was
/// never offered them), so they must not move the split toward the subset; counted as
/// band evidence (1 MiB blocks: 0.05 of share each) they took the space of a skewed
/// tenant's hot set. Returns the stable share before and after the re-reads.
fn frequency_victims_read_again_as_scan_data(band_needs_scan_victim: bool) -> (f64, f64) {
    let cap = 20 * MB;
    let mut s = Sim::with(
        cap,
        PatternAwareConfig {
            band_needs_scan_victim,
            // Where `mix`'s split stood when the shard reader's re-reads came: the
            // skewed tenant's ghost hits had taken it to 0, the subset empty.
            stable_share: 0.0,
            ..PatternAwareConfig::default()
        },
    );
    let hot = |i: u64| CacheKey::file("db/kv.db", "v", i);
    let blk = |i: u64| CacheKey::file("shards/s0.tar", "v", i);
    let scan = |i: u64| CacheKey::file(format!("imgs/f{i}.jpg"), "v", 0);
    let mut t = 0;
    // Job 1's hot set, skewed: the frequency side.
    for _ in 0..20 {
        for i in 0..8 {
            t += 1;
            s.read_as(&hot(i), MB, 1, t, Pattern::Skewed);
        }
    }
    // Job 3's shuffled files (random, first touch): the scan population a larger
    // subset would sample.
    for i in 0..4 {
        t += 1;
        s.read_as(&scan(i), MB, 3, t, Pattern::Random);
    }
    // Job 2's blocks, not classified yet: they fill the frequency side and leave it
    // while job 1 keeps reading.
    for i in 0..40 {
        t += 1;
        s.read_as(&blk(i), MB, 2, t, Pattern::Unknown);
        t += 1;
        s.read_as(&hot(i % 8), MB, 1, t, Pattern::Skewed);
    }
    let before = s.p.stats().stable_share;
    // Job 2 reads its blocks again, now classified random; job 1 still reads.
    for i in 0..40 {
        t += 1;
        s.read_as(&blk(i), MB, 2, t, Pattern::Random);
        t += 1;
        s.read_as(&hot(i % 8), MB, 1, t, Pattern::Skewed);
    }
    (before, s.p.stats().stable_share)
}

#[test]
fn frequency_victims_read_again_as_scan_data_do_not_grow_the_subset() {
    let (before, after) = frequency_victims_read_again_as_scan_data(true);
    assert!(
        after <= before + 1e-9,
        "stable share {before:.3} -> {after:.3}"
    );
    // The mechanism: counted as band evidence, the same re-reads move the split.
    let (before0, after0) = frequency_victims_read_again_as_scan_data(false);
    assert!(
        after0 >= before0 + 0.1,
        "without the check: {before0:.3} -> {after0:.3}"
    );
}

/// The frequency sketch widens with the resident items (issue 13, Mooncake): aged every
/// `10 x items` increments, a fixed 32,768-wide row put ~2.7 foreign increments on every
/// counter per period at 8,784 items, and a key read once estimated 2 or more. Grown,
/// most keys read once estimate exactly 1; the growth keeps every count already made.
#[test]
fn sketch_width_follows_the_items_so_one_hit_keys_read_as_one() {
    let items = 9_000;
    let exact_share = |grow: bool| {
        let mut sk = Sketch::new(1 << 15);
        // Counted before the growth: the count survives it.
        for _ in 0..5 {
            sk.add(mix64(u64::MAX));
        }
        sk.set_items(items, grow, 1 << 22);
        assert!(sk.estimate(mix64(u64::MAX)) >= 5);
        // One sample period minus one, so no aging in between.
        let n = 10 * items as u64 - 10;
        for i in 0..n {
            sk.add(mix64(i));
        }
        let exact = (0..n).filter(|i| sk.estimate(mix64(*i)) == 1).count();
        (exact as f64 / n as f64, sk.width())
    };
    let (grown, width) = exact_share(true);
    let (fixed, fixed_width) = exact_share(false);
    assert!(width >= 10 * items, "width {width}");
    assert_eq!(fixed_width, 1 << 15);
    assert!(grown > 0.75, "grown: {grown} of one-hit keys read 1");
    assert!(fixed < 0.4, "fixed: {fixed} of one-hit keys read 1");
}

/// KV prefix blocks (Mooncake-like): reused prefix blocks with mild Zipf popularity
/// (60,000 of them, s = 0.6), each followed by two blocks no one reads again, in a
/// cache of 12,000 blocks (aged every 120,000 increments: 3.7 per counter of a fixed
/// 32,768-wide row). With the sketch following the items the one-hit blocks lose the
/// admission contest to reused ones; with the fixed width their inflated estimates win
/// it often enough to cost hits (measured: 12,830 against 11,950 hits, +7.4%).
#[test]
fn one_hit_kv_blocks_do_not_displace_reused_ones_in_a_large_cache() {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Zipf};
    let run = |follow: bool| {
        let mut s = Sim::new(12_000);
        s.p = PatternAwarePolicy::new(PatternAwareConfig {
            sketch_follows_items: follow,
            ..PatternAwareConfig::default()
        });
        let zipf = Zipf::new(60_000.0, 0.6).expect("valid");
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut unique = 1u64 << 40;
        let mut hits = 0u64;
        for t in 0..150_000u64 {
            let key = if t % 3 == 0 {
                kv(zipf.sample(&mut rng) as u64)
            } else {
                unique += 1;
                kv(unique)
            };
            hits += u64::from(s.read(&key, 1, &demand(t / 16, t)));
        }
        hits
    };
    let (grown, fixed) = (run(true), run(false));
    assert!(
        grown as f64 > 1.04 * fixed as f64,
        "grown {grown} fixed {fixed}"
    );
}

/// The frequency main's victim among equally frequent items, small ones inserted first.
fn main_victim_of_equals(
    freq_ties_largest_first: bool,
    main_ranks_by_density: bool,
) -> (CacheKey, CacheKey) {
    let mut p = PatternAwarePolicy::new(PatternAwareConfig {
        capacity_hint: Some(4 * MB),
        adapt_window: false,
        window_share: 0.0,
        freq_ties_largest_first,
        main_ranks_by_density,
        ..PatternAwareConfig::default()
    });
    let footer = |f: u64| CacheKey::file(format!("pq/day={f}.parquet"), "v", 12);
    let column = CacheKey::file("pq/day=0.parquet", "v", 2);
    let items = [
        (footer(0), 64 << 10),
        (footer(1), 64 << 10),
        (footer(2), 64 << 10),
        (column.clone(), MB),
    ];
    let mut t = 0;
    for (k, size) in &items {
        t += 1;
        assert!(p.admit(k, *size, &demand(1, t)));
        p.on_insert(k, *size, &demand(1, t));
        p.on_hit(k, &demand(1, t + 1));
    }
    assert_eq!(p.pool_of(&column), Some("freq"));
    let v = p.victim().expect("a full main has a victim");
    // The column chunk read twice more: by frequency alone it outranks every footer.
    p.on_hit(&column, &demand(1, 100));
    p.on_hit(&column, &demand(1, 101));
    let v2 = p.victim().expect("a full main has a victim");
    (v, v2)
}

/// Parquet footers (64 KiB, a file's last partial block) are re-read every pass; at a
/// frequency tie with a 1 MiB column chunk the chunk goes, freeing 16x the space per
/// lost hit. Oldest first (the order before issue 13's fix) took a footer.
#[test]
fn main_ties_evict_the_largest_item_first() {
    let column = CacheKey::file("pq/day=0.parquet", "v", 2);
    let (v, v2) = main_victim_of_equals(true, false);
    assert_eq!(v, column);
    assert_ne!(
        v2, column,
        "by frequency, a more frequent item is never the victim"
    );
    let (old, _) = main_victim_of_equals(false, false);
    assert_ne!(old, column);
    // Per byte, the column's three re-reads of 1 MiB are worth less than one of a
    // 64 KiB footer: it stays the victim.
    assert_eq!(main_victim_of_equals(true, true), (column.clone(), column));
}

/// `main_ranks_by_density`: the main's victims go by reuse per byte, `(f - 1) / size`.
/// A 4 KiB unit read once has no reuse to show and goes first; then a 1 MiB block read
/// three times goes before 4 KiB units read twice (a SQLite page's unit holds 1/256 of
/// the space). By frequency alone a small unit read twice would go second.
#[test]
fn the_main_ranks_items_by_reuse_per_byte() {
    let victims = |main_ranks_by_density: bool| {
        let mut p = PatternAwarePolicy::new(PatternAwareConfig {
            capacity_hint: Some(4 * MB),
            adapt_window: false,
            window_share: 0.0,
            main_ranks_by_density,
            ..PatternAwareConfig::default()
        });
        let unit = |i: u64| CacheKey::file("db/main.sqlite", "v", 100 + i);
        let block = CacheKey::file("db/main.sqlite", "v", 0);
        let mut t = 0;
        let mut read = |p: &mut PatternAwarePolicy, k: &CacheKey, size: u64, times: u64| {
            t += 1;
            assert!(p.admit(k, size, &demand(1, t)));
            p.on_insert(k, size, &demand(1, t));
            for _ in 1..times {
                t += 1;
                p.on_hit(k, &demand(1, t));
            }
        };
        read(&mut p, &block, MB, 3);
        for i in 0..4 {
            read(&mut p, &unit(i), 4 << 10, 2);
        }
        read(&mut p, &unit(9), 4 << 10, 1);
        let first = p.victim().expect("a full main has a victim");
        p.on_remove(&first);
        let second = p.victim().expect("a full main has a victim");
        (first, second, block, unit(9))
    };
    let (first, second, block, once) = victims(true);
    assert_eq!(first, once, "an item read once ranks last");
    assert_eq!(second, block);
    let (first, second, block, once) = victims(false);
    assert_eq!(first, once);
    assert_ne!(second, block, "by frequency the block read most stays");
}

/// The window -> main contest between a small candidate and a large main item of equal
/// frequency: the victim.
fn contest_victim_of_equals(
    freq_ties_largest_first: bool,
    main_ranks_by_density: bool,
) -> CacheKey {
    let mut p = PatternAwarePolicy::new(PatternAwareConfig {
        capacity_hint: Some(2 * MB),
        adapt_window: false,
        window_share: 0.01,
        freq_ties_largest_first,
        main_ranks_by_density,
        // The candidate here is also the latest demanded block, which that rule keeps
        // out of the contest until the next demand: this test is about the tie alone.
        window_keeps_last_demanded: false,
        ..PatternAwareConfig::default()
    });
    let column = CacheKey::file("pq/day=0.parquet", "v", 2);
    let footer = |f: u64| CacheKey::file(format!("pq/day={f}.parquet"), "v", 12);
    let mut t = 0;
    for (k, size) in [(column, MB), (footer(0), 64 << 10), (footer(1), 64 << 10)] {
        t += 1;
        assert!(p.admit(&k, size, &demand(1, t)));
        p.on_insert(&k, size, &demand(1, t));
        p.on_hit(&k, &demand(1, t + 1));
    }
    // The column and the first footer graduate to the main; the second footer is the
    // candidate against the main's least frequent item.
    p.victim().expect("a full frequency side has a victim")
}

/// A small window item that ties with the main's largest least-frequent item takes its
/// place (the same rule as the main's order); before issue 13's fix the candidate lost
/// every tie whatever the sizes.
#[test]
fn the_window_contest_keeps_the_smaller_of_equals() {
    let column = CacheKey::file("pq/day=0.parquet", "v", 2);
    assert_eq!(contest_victim_of_equals(true, false), column);
    assert_eq!(
        contest_victim_of_equals(false, false),
        CacheKey::file("pq/day=1.parquet", "v", 12)
    );
    // Per byte the footer's re-read outranks the column's whatever the tie rule.
    assert_eq!(contest_victim_of_equals(true, true), column);
    assert_eq!(contest_victim_of_equals(false, true), column);
}

/// The recorded safetensors load in miniature: file 0 read once with no history (the
/// frequency side, as one large read the tracker cannot classify), then files 1-3 read
/// sequentially (40 blocks each, enough for the tracker to classify them), then file
/// 0 again. Returns file 0's hits on the re-read.
fn safetensors_reread_hits(main_kept_until_scan_reuse: bool) -> u64 {
    const SCAN_BLOCKS: u64 = 40;
    let cap = 12 * MB;
    let mut s = Sim::with(
        cap,
        PatternAwareConfig {
            main_kept_until_scan_reuse,
            ..PatternAwareConfig::default()
        },
    );
    // Per run its own file names: the thread's tracker outlives the first run.
    let file = |f: u64, b: u64| {
        CacheKey::file(format!("st/{main_kept_until_scan_reuse}/model-{f}"), "v", b)
    };
    let mut t = 0;
    for b in 0..12 {
        t += 1;
        s.access(&file(0, b), MB, &demand(1, t));
    }
    for f in 1..4 {
        for b in 0..SCAN_BLOCKS {
            t += 1;
            s.read(&file(f, b), MB, &demand(1, t));
        }
    }
    (0..12)
        .map(|b| {
            t += 1;
            u64::from(s.access(&file(0, b), MB, &demand(1, t)))
        })
        .sum()
}

/// Sequential scans evict the main's incumbents only once scan data has shown reuse:
/// with no evidence yet, files 1-3 make room among themselves and file 0 is still
/// there when the program re-reads it. Without the rule the stable subset took half
/// the cache from file 0 by its prior share alone.
#[test]
fn sequential_scans_keep_the_main_until_scan_reuse() {
    let kept = safetensors_reread_hits(true);
    let prior = safetensors_reread_hits(false);
    // 11 of 12: the window's contest still takes one block of file 0 for file 1's
    // first, still unclassified, blocks.
    assert!(kept >= 11, "kept {kept}");
    assert!(prior <= 6, "prior {prior}");
}

/// The recorded `torch.load` trace in miniature (issue 13, held-out `torch`): three
/// checkpoints of 40 blocks (10 MiB) read sequentially whole, then the newest read twice
/// more, in a 16 MiB cache that holds one checkpoint but not two. `files` checkpoints
/// are read before `visits` re-reads of checkpoint `reread` (a loop over more than the
/// cache when it is the first). Returns the hits of each re-read and the policy's reload
/// ghost hits.
fn reload_hits(
    reload_ghost: bool,
    files: u64,
    reread: u64,
    visits: usize,
    tag: &str,
) -> (Vec<u64>, u64) {
    const BLOCKS: u64 = 40;
    const B: u64 = MB / 4;
    let mut s = Sim::with(
        16 * MB,
        PatternAwareConfig {
            reload_ghost,
            ..PatternAwareConfig::default()
        },
    );
    // The same names (so the same stable sample) with and without the rule: a fresh
    // tracker for each run.
    TRACKER.with(|t| *t.borrow_mut() = AccessTracker::default());
    let file = |f: u64, b: u64| CacheKey::file(format!("ckpt/{tag}/step-{f}.pt"), "v", b);
    let mut t = 0;
    for f in 0..files {
        for b in 0..BLOCKS {
            t += 1;
            s.read(&file(f, b), B, &demand(1, t));
        }
    }
    let hits = (0..visits)
        .map(|_| {
            (0..BLOCKS)
                .map(|b| {
                    t += 1;
                    u64::from(s.read(&file(reread, b), B, &demand(1, t)))
                })
                .sum()
        })
        .collect();
    (hits, s.p.stats().reload_ghost_hits)
}

/// A file re-read whole right after it was read is recognised by its second visit
/// (block after block missing what the scan queue let go within a capacity) and kept
/// for the third: LRU keeps it by recency, evict-behind kept only the stable subset's
/// hash sample of it, visit after visit (measured: 20 then 34 of 40 with the rule, 21
/// and 21 without).
#[test]
fn a_file_reread_whole_is_kept_for_the_next_visit() {
    let (on, on_reloads) = reload_hits(true, 3, 2, 2, "reload");
    let (off, off_reloads) = reload_hits(false, 3, 2, 2, "reload");
    assert_eq!(off_reloads, 0);
    assert!(on_reloads > 0);
    // Without the rule each visit finds the same sample.
    assert!(off[1] <= off[0] + 1, "off {off:?}");
    // The second visit finds what evict-behind left either way (the blocks the
    // growing scan queue displaces from the sample before the reader reaches them
    // cost a little).
    assert!(on[0] + 2 >= off[0], "on {on:?} off {off:?}");
    // The third finds most of the file.
    assert!(on[1] >= off[1] + 10, "on {on:?} off {off:?}");
    assert!(on[1] >= 32, "on {on:?}");
}

/// A re-read further back than the cache is not a reload: five checkpoints, then the
/// third again, after 20 MiB of other reads in a 16 MiB cache. LRU would miss it too,
/// and nothing changes (the stable subset keeps its sample). With an unbounded reach
/// (no distance test, no bound on the ghost) this fails (2 reload ghost hits).
#[test]
fn a_reread_beyond_the_cache_is_not_a_reload() {
    let (on, on_reloads) = reload_hits(true, 5, 2, 1, "loop");
    let (off, _) = reload_hits(false, 5, 2, 1, "loop");
    assert_eq!(on_reloads, 0);
    assert_eq!(on, off);
}

/// Reload ghost hits count only in a run of `reload_run` of one job (a chance re-read
/// comes alone); then the run's bytes all count at once. Another job's hits start a run
/// of their own; another job's plain misses do not break it.
#[test]
fn reload_evidence_needs_a_run_of_one_job() {
    let mut p = PatternAwarePolicy::new(PatternAwareConfig {
        capacity_hint: Some(64 * MB),
        ..PatternAwareConfig::default()
    });
    let k = p.cfg.reload_run;
    assert!(k > 1);
    for _ in 0..k - 1 {
        assert!(!p.reload_observed(1, MB, true));
    }
    assert!(!p.reload_observed(1, MB, false));
    assert_eq!(p.consumed_target, 0.0);
    assert_eq!(p.stats().reload_ghost_hits, 0);
    for i in 0..k - 1 {
        assert!(!p.reload_observed(1, MB, true));
        // Job 2's plain misses leave job 1's run alone.
        assert!(!p.reload_observed(2, MB, false), "{i}");
    }
    assert!(p.reload_observed(1, MB, true));
    assert_eq!(p.stats().reload_ghost_hits, 1);
    let after_run = p.consumed_target;
    assert!(after_run >= (k * MB) as f64, "{after_run}");
    // Each further hit of the run counts at once.
    assert!(p.reload_observed(1, MB, true));
    assert_eq!(p.stats().reload_ghost_hits, 2);
    // Job 2's hit starts its own run.
    assert!(!p.reload_observed(2, MB, true));
}

/// The recorded `etl` scan in miniature (issue 13): a 4 MiB cache whose main holds three
/// blocks of a file read once (frequency 1, never read again), a tiny window, and a
/// reader that has just demanded block 0 of the next file (and will read the rest of it
/// 8 KiB at a time, with `piece` a first further piece). Returns the victim a readahead
/// fill of block 1 gets.
fn readahead_victim_while_a_block_is_read(
    window_keeps_last_demanded: bool,
    piece: bool,
) -> CacheKey {
    let mut p = PatternAwarePolicy::new(PatternAwareConfig {
        capacity_hint: Some(4 * MB),
        adapt_window: false,
        window_share: 0.01,
        window_keeps_last_demanded,
        ..PatternAwareConfig::default()
    });
    let mut t = 0;
    for b in 0..3 {
        t += 1;
        let k = CacheKey::file("etl/orders-00.csv", "v", b);
        assert!(p.admit(&k, MB, &demand(1, t)));
        p.on_insert(&k, MB, &demand(1, t));
    }
    let current = CacheKey::file("etl/orders-01.csv", "v", 0);
    assert!(p.admit(&current, MB, &demand(1, 4)));
    p.on_insert(&current, MB, &demand(1, 4));
    if piece {
        let piece = AccessContext {
            obs: Observation {
                repeat: true,
                ..Observation::default()
            },
            ..demand(1, 5)
        };
        p.on_hit(&current, &piece);
    }
    let next = CacheKey::file("etl/orders-01.csv", "v", 1);
    let pf = AccessContext::prefetch(JobId(1), 6);
    assert!(p.admit(&next, MB, &pf));
    p.victim().expect("a full cache has a victim")
}

/// A readahead fill takes a dead main item, not the block the reader is in the middle
/// of: without the rule the block being read is the window's contest candidate, loses
/// the frequency-1 tie and is fetched again (`etl` at 10%: 3.51 s vs LRU's 3.29 s).
#[test]
fn a_readahead_does_not_evict_the_block_being_read() {
    let current = CacheKey::file("etl/orders-01.csv", "v", 0);
    for piece in [false, true] {
        assert_ne!(readahead_victim_while_a_block_is_read(true, piece), current);
        assert_eq!(
            readahead_victim_while_a_block_is_read(false, piece),
            current
        );
    }
}

proptest! {
    /// `SeqQueue` answers as the `BTreeMap` it replaces, for the policy's pattern (each
    /// insert a fresh, larger sequence number; removals anywhere) and for any other:
    /// inserts below the largest, repeated sequence numbers, removals of absent ones.
    /// A removal by `remove_at` answers the same whatever its hint: the one `insert`
    /// returned (also after pops, compactions and inserts below the largest moved the
    /// slot), or any number (`remove` is `remove_at` with no hint); `pop_first` takes
    /// what `BTreeMap::pop_first` does.
    #[test]
    fn seq_queue_answers_as_a_btree_map(
        ops in proptest::collection::vec((0u8..7, 0u64..64), 0..400),
    ) {
        let mut q: SeqQueue<u64> = SeqQueue::default();
        let mut m: BTreeMap<u64, u64> = BTreeMap::new();
        let mut hints: BTreeMap<u64, u64> = BTreeMap::new();
        let mut next = 0u64;
        for (i, (op, x)) in ops.into_iter().enumerate() {
            let v = i as u64;
            match op {
                // The policy's insert: a new largest sequence number.
                0 | 1 => {
                    next += 1 + x % 3;
                    hints.insert(next, q.insert(next, v));
                    m.insert(next, v);
                }
                // Any sequence number, maybe present, maybe below the largest.
                2 => {
                    hints.insert(x, q.insert(x, v));
                    m.insert(x, v);
                }
                // Take the oldest out.
                6 => prop_assert_eq!(q.pop_first(), m.pop_first()),
                // Remove the oldest, a present one or an absent one: without a hint,
                // with the insert's, with any.
                _ => {
                    let seq = match x % 3 {
                        0 => m.keys().next().copied().unwrap_or(x),
                        1 => m.keys().nth((x as usize) % m.len().max(1)).copied().unwrap_or(x),
                        _ => x,
                    };
                    let got = match op {
                        3 => q.remove(&seq),
                        4 => q.remove_at(&seq, hints.get(&seq).copied().unwrap_or(x)),
                        _ => q.remove_at(&seq, x.wrapping_mul(7)),
                    };
                    prop_assert_eq!(got, m.remove(&seq));
                }
            }
            prop_assert_eq!(q.first_key_value(), m.first_key_value());
            prop_assert_eq!(q.is_empty(), m.is_empty());
            prop_assert!(q.values().eq(m.values()));
            prop_assert!(q.slots.len() <= 2 * m.len() + 33);
        }
    }
}

/// A cache of 100 files of `size` bytes, with or without `whole_files_by_frequency`.
fn hundred_file_sim(size: u64, whole_files_by_frequency: bool) -> Sim {
    Sim::with_knob(100 * size, |c| {
        c.whole_files_by_frequency = whole_files_by_frequency;
        // The rule alone: without it the frequency guard finds the skew a shadow
        // W-TinyLFU exploits and ranks by frequency too.
        c.frequency_guard = false;
    })
}

/// Windows of a chunked array (zarr: one small file per chunk, a directory per row of
/// chunks) at Zipf-chosen origins: the files of each row of a window are read in name
/// order, so the tracker calls the files stream `Sequential`, while the skew of the
/// origins makes some chunk files far more popular than others. Returns the hits of
/// 4,000 window reads (2 x 3 chunks each) on a cache of 100 of the 1,024 chunk files.
fn zipf_window_hits(whole_files_by_frequency: bool) -> u64 {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    use rand_distr::{Distribution, Zipf};
    let size = 64 << 10;
    let mut s = hundred_file_sim(size, whole_files_by_frequency);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    // Origins on a 30 x 30 grid, ranked by a fixed shuffle so popular ones scatter.
    let zipf = Zipf::new(900.0, 0.9).expect("valid");
    let mut rank: Vec<u64> = (0..900).collect();
    rank.shuffle(&mut rng);
    let (mut hits, mut t) = (0, 0);
    for _ in 0..4000 {
        let o = rank[zipf.sample(&mut rng) as usize - 1];
        let (r0, c0) = (o / 30, o % 30);
        for r in r0..r0 + 2 {
            for c in c0..c0 + 3 {
                t += 1;
                let key =
                    CacheKey::file(format!("zw/{whole_files_by_frequency}/c/{r}/{c}"), "v", 0);
                hits += u64::from(s.read(&key, size, &demand(1, t)));
            }
        }
    }
    // The rule must be what changed the outcome: the stream is a sequential one.
    let probe = CacheKey::file(format!("zw/{whole_files_by_frequency}/c/5/5"), "v", 0);
    assert_eq!(
        observed(&probe, &demand(1, t + 1)).obs.files,
        Pattern::Sequential
    );
    hits
}

#[test]
fn skewed_whole_small_files_read_in_order_are_ranked_by_frequency() {
    let (on, off) = (zipf_window_hits(true), zipf_window_hits(false));
    assert!(
        on * 10 >= off * 12,
        "hits with the rule {on}, without {off}"
    );
}

/// A directory of small files read whole in name order, pass after pass, larger than
/// the cache: with the rule the frequency main keeps a fixed set of incumbents (ties
/// keep them), as the stable subset's hash sample did. Returns the hits of the passes
/// after the first.
fn cyclic_small_files_hits(whole_files_by_frequency: bool) -> u64 {
    let size = 64 << 10;
    let mut s = hundred_file_sim(size, whole_files_by_frequency);
    let (mut hits, mut t) = (0, 0);
    for pass in 0..5 {
        for f in 0..400 {
            t += 1;
            let key = CacheKey::file(format!("cy/{whole_files_by_frequency}/img-{f}"), "v", 0);
            let hit = s.read(&key, size, &demand(1, t));
            if pass > 0 {
                hits += u64::from(hit);
            }
        }
    }
    hits
}

#[test]
fn small_files_read_in_order_pass_after_pass_keep_a_subset() {
    let (on, off) = (
        cyclic_small_files_hits(true),
        cyclic_small_files_hits(false),
    );
    // 4 passes of 400 reads on a cache of 100 files: a fixed subset hits ~1/4.
    assert!(on * 10 >= off * 9, "hits with the rule {on}, without {off}");
    assert!(on >= 4 * 400 / 8, "hits with the rule {on}");
}

/// A class-balanced sampler over an imbalanced image folder: each draw picks one of 4
/// classes (directories of 400, 100, 25 and 10 files) uniformly, then a file of it, so
/// every class's files stream is random, and the small classes' files are read far more
/// often. Returns the hits of 6,000 draws after the first 2,000, on a cache of 100 of
/// the 535 files, with `reread_by_frequency` on or off.
fn balanced_sampler_hits(reread_by_frequency: bool) -> u64 {
    use rand::{Rng, SeedableRng};
    let size = 64 << 10;
    let mut s = Sim::with_knob(100 * size, |c| {
        c.reread_by_frequency = reread_by_frequency;
        // The rule alone, as in `hundred_file_sim`.
        c.frequency_guard = false;
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let classes = [400u64, 100, 25, 10];
    let (mut hits, mut t) = (0, 0);
    for draw in 0..8_000 {
        let c = rng.random_range(0..classes.len());
        let f = rng.random_range(0..classes[c]);
        t += 1;
        let key = CacheKey::file(
            format!("bal/{reread_by_frequency}/class{c}/{f:05}.jpg"),
            "v",
            0,
        );
        let hit = s.read(&key, size, &demand(1, t));
        if draw >= 2_000 {
            hits += u64::from(hit);
        }
    }
    // The rule must be what changed the outcome: the small class is a random stream.
    let probe = CacheKey::file(
        format!("bal/{reread_by_frequency}/class3/00001.jpg"),
        "v",
        0,
    );
    let o = observed(&probe, &demand(1, t + 1)).obs;
    assert_eq!((o.files, o.files_reread), (Pattern::Random, true));
    hits
}

#[test]
fn small_files_a_random_stream_rereads_are_ranked_by_frequency() {
    let (on, off) = (balanced_sampler_hits(true), balanced_sampler_hits(false));
    // The two small classes (35 files) are half the draws and fit: held, they alone
    // hit about 3,000 of 6,000, and the rest of the cache holds part of the third
    // (measured: 3,588 with the rule, 3,133 without).
    assert!(
        on * 10 >= off * 11,
        "hits with the rule {on}, without {off}"
    );
    assert!(on >= 3_400, "hits with the rule {on}");
}

/// Zipf(0.7)-popular adapters of 1.5 MiB, each read whole in one read (a 1 MiB block and
/// a 0.5 MiB one), through a cache of 4 of the 60: ranked per byte of the block alone,
/// the main prefers the tail blocks (twice the reuse per byte) and keeps halves of
/// many adapters, each of whose reads still waits for the other half. Returns the
/// reads served whole (both blocks hit) of 6,000 after the first 1,000.
fn whole_read_hits(main_ranks_by_read: bool) -> u64 {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Zipf};
    let (head, tail) = (MB, MB / 2);
    let mut s = Sim::with_knob(6 * MB, |c| c.main_ranks_by_read = main_ranks_by_read);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let zipf = Zipf::new(60.0, 0.7).expect("valid");
    let (mut whole, mut t) = (0, 0);
    for read in 0..7_000 {
        let a = zipf.sample(&mut rng) as u64;
        let mut hits = 0;
        for (b, size) in [(0, head), (1, tail)] {
            t += 1;
            let key = CacheKey::file(format!("lora/{main_ranks_by_read}/a{a:03}.st"), "v", b);
            let ctx = demand(1, t).with_read_len(head + tail);
            hits += u64::from(s.read(&key, size, &ctx));
        }
        if read >= 1_000 && hits == 2 {
            whole += 1;
        }
    }
    whole
}

#[test]
fn blocks_of_one_read_rank_together() {
    let (on, off) = (whole_read_hits(true), whole_read_hits(false));
    // Measured: 1,504 with the rule, 1,168 without.
    assert!(
        on * 10 >= off * 12,
        "whole-read hits with the rule {on}, without {off}"
    );
}

/// A 40 MiB cache with the stable subset's frequency rule on or off.
fn frequency_rule_sim(stable_admits_frequent: bool) -> Sim {
    Sim::with_knob(40 * MB, |c| {
        c.stable_admits_frequent = stable_admits_frequent;
        // The rule alone: a sweep's 35 blocks fit the 40-block cache, so LRU keeps the
        // hot blocks too and the guard would hand the run without the rule to it; the
        // frequency guard likewise, to a shadow W-TinyLFU.
        c.recency_guard = false;
        c.frequency_guard = false;
    })
}

/// Upward sweeps over a 200 MiB file through a 40 MiB cache, each sweep reading the 10
/// hot blocks (every 20th) and an eighth of the others (a different eighth each sweep),
/// told `Sequential` (as embedding gathers sorted per batch are): hot scan data, read
/// again within a capacity of scan misses. Returns the hot blocks' hits in sweeps 8-23.
fn hot_blocks_in_sweeps_hits(stable_admits_frequent: bool) -> u64 {
    let mut s = frequency_rule_sim(stable_admits_frequent);
    let blk = |b: u64| CacheKey::file("emb/table.npy", "v", b);
    let (mut t, mut hot_hits) = (0, 0);
    for sweep in 0..24u64 {
        for b in 0..200u64 {
            let hot = b % 20 == 7;
            if !hot && (b + sweep) % 8 != 0 {
                continue;
            }
            t += 1;
            let hit = s.read_as(&blk(b), MB, 1, t, Pattern::Sequential);
            if hot && hit && sweep >= 8 {
                hot_hits += 1;
            }
        }
    }
    hot_hits
}

#[test]
fn hot_scan_blocks_outside_the_hash_sample_are_kept_by_frequency() {
    let (with, without) = (
        hot_blocks_in_sweeps_hits(true),
        hot_blocks_in_sweeps_hits(false),
    );
    // 10 hot blocks x 16 sweeps, all of which fit the cache; a hot block whose proof
    // aged out (`age_proven`, once per capacity of scan misses, a sweep misses ~25
    // blocks) just before it was read again can still go, so how many depends on the
    // phase of the aging against the sweeps (measured: 85, and 42 by the hash sample
    // alone; 110 when the policy took its capacity for one block more than the tier's).
    assert!(with >= 80, "hot hits with the rule: {with} of 160");
    assert!(
        without < with * 3 / 4,
        "hot hits by hash sample alone: {without}, with the rule {with}"
    );
}

/// Passes in order over 200 blocks through a 40-block cache, `Sequential`: every block
/// is read equally often, so the frequency rule must leave the hash sample as it was.
fn loop_hits(stable_admits_frequent: bool) -> u64 {
    let mut s = frequency_rule_sim(stable_admits_frequent);
    let blk = |b: u64| CacheKey::file("shards/all.tar", "v", b);
    let (mut t, mut hits) = (0, 0);
    for _ in 0..30 {
        for b in 0..200u64 {
            t += 1;
            hits += u64::from(s.read_as(&blk(b), MB, 1, t, Pattern::Sequential));
        }
    }
    hits
}

#[test]
fn a_loop_keeps_its_hash_sample_under_the_frequency_rule() {
    let (with, without) = (loop_hits(true), loop_hits(false));
    // About a fifth of each pass after the first hits with the sample (measured: the
    // same 1,131 hits both ways).
    assert!(without > 29 * 200 / 5 * 8 / 10, "sample hits {without}");
    assert!(
        with * 100 >= without * 98,
        "loop hits with the rule {with}, without {without}"
    );
}

/// A stream read as scan data has members in the stable subset; then it is found reused
/// (its retention now `Skewed`, as embedding gathers sorted per batch are once the test
/// across passes has seen enough of them). A member read again leaves the subset for the
/// frequency main, which now ranks its stream; with the rule off it stays in the subset.
#[test]
fn a_reread_member_of_a_stream_now_skewed_moves_to_the_main() {
    for follows in [true, false] {
        let mut s = Sim::with_knob(40 * MB, |c| c.stable_follows_retention = follows);
        let blk = |b: u64| CacheKey::file("emb/table.npy", "v", b);
        let mut t = 0;
        for b in 0..100u64 {
            t += 1;
            s.read_as(&blk(b), MB, 1, t, Pattern::Sequential);
        }
        let member = (0..100u64)
            .map(blk)
            .find(|k| s.p.pool_of(k) == Some("stable"))
            .expect("a pass over 100 MiB leaves members in the subset");
        t += 1;
        assert!(s.read_as(&member, MB, 1, t, Pattern::Skewed));
        let want = if follows { "freq" } else { "stable" };
        assert_eq!(s.p.pool_of(&member), Some(want), "follows {follows}");
    }
}

/// Block misses of 4 readers taking turns over 16 shards of 8 blocks, two passes, in a
/// 12 MiB tier under `cfg` (see `readers_taking_turns_keep_the_blocks_they_are_reading`),
/// and the recency periods the tier reports.
fn readers_taking_turns(cfg: PatternAwareConfig) -> (u64, u64) {
    TRACKER.with(|t| *t.borrow_mut() = AccessTracker::default());
    let mut s = TierSpace::new(12 * MB, Box::new(PatternAwarePolicy::new(cfg)));
    let (shards, size) = (16u64, 8 * MB);
    let mut x = 7u64;
    let mut next = |lo: u64, hi: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        lo + (x >> 33) % (hi - lo)
    };
    let (mut misses, mut t) = (0, 0);
    for _pass in 0..2 {
        let mut order: Vec<u64> = (0..shards).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, next(0, i as u64 + 1) as usize);
        }
        let mut pending = order.into_iter();
        let mut active: Vec<(u64, u64)> = pending.by_ref().take(4).map(|f| (f, 0)).collect();
        while !active.is_empty() {
            let mut i = 0;
            while i < active.len() {
                let (shard, at) = active[i];
                let len = (4 + next(20_000, 80_000)).min(size - at);
                let path = format!("rec/train-{shard:05}.rec");
                for b in at / MB..=(at + len - 1) / MB {
                    t += 1;
                    let ctx = demand(1, t).with_read(at, len);
                    misses += u64::from(!read(
                        &mut s,
                        &CacheKey::file(path.as_str(), "v", b),
                        MB,
                        &ctx,
                    ));
                }
                if at + len >= size {
                    match pending.next() {
                        Some(f) => active[i] = (f, 0),
                        None => {
                            active.remove(i);
                            continue;
                        }
                    }
                } else {
                    active[i].1 = at + len;
                }
                i += 1;
            }
        }
    }
    (misses, s.policy_recency_periods())
}

/// Readers taking turns (tf.data's interleave: a record of 20-80 KB from each of 4
/// shards in turn, shards in a shuffled order) each keep the block they are in the
/// middle of (`scan_keeps_blocks_mid_read`): a block is fetched about once per pass,
/// where evict-behind with the scan queue's share at 0 evicted each reader's current
/// block for the next reader's and fetched it again record after record.
#[test]
fn readers_taking_turns_keep_the_blocks_they_are_reading() {
    let misses = |keep: bool| {
        readers_taking_turns(PatternAwareConfig {
            scan_keeps_blocks_mid_read: keep,
            recency_guard: false,
            ..PatternAwareConfig::default()
        })
        .0
    };
    let (kept, evicted) = (misses(true), misses(false));
    // 16 shards of 8 blocks read twice are 256 block fetches at best (LRU's count);
    // measured 849 with the rule (the frequency side's window still loses some
    // current blocks; 585 before window victims admitted from the main's ghost went
    // back to it, `main_victims_stay_main`, which moves which ghost entries a 12-block
    // cache's one-block lists keep) and 2,097 without. The recency guard, on by
    // default, bounds the rest (next test).
    assert!(kept < 4 * 256, "kept {kept}");
    assert!(
        evicted > 2 * kept,
        "without the rule {evicted} (with {kept})"
    );
}

/// The same readers under the recency guard: the shadow LRU out-hits the policy, the
/// guard evicts by recency, and the misses come near LRU's 256 (measured: 352 with the
/// guard, 585 without).
#[test]
fn the_recency_guard_bounds_what_readers_taking_turns_lose_to_lru() {
    let run = |guard: bool| {
        readers_taking_turns(PatternAwareConfig {
            recency_guard: guard,
            ..PatternAwareConfig::default()
        })
    };
    let ((guarded, periods), (unguarded, none)) = (run(true), run(false));
    // The tier reports the guard's periods (the daemon's stats and metrics show them).
    assert!(periods >= 1, "{periods} recency periods");
    assert_eq!(none, 0);
    assert!(guarded < 400, "guarded {guarded} (LRU: 256)");
    assert!(
        guarded * 4 < unguarded * 3,
        "guarded {guarded}, unguarded {unguarded}"
    );
}

proptest! {
    /// In a recency period the policy is LRU: over any sequence of demand reads of
    /// items of any size, it hits and misses exactly where an LRU tier does.
    #[test]
    fn a_recency_period_evicts_as_lru_does(
        reads in proptest::collection::vec(0u64..24, 1..400),
    ) {
        TRACKER.with(|t| *t.borrow_mut() = AccessTracker::default());
        let mut p = PatternAwarePolicy::new(PatternAwareConfig {
            capacity_hint: Some(10 * MB),
            recency_guard: true,
            ..PatternAwareConfig::default()
        });
        p.guard.as_mut().expect("guard on").force_period();
        let mut guarded = TierSpace::new(10 * MB, Box::new(p));
        let mut lru = TierSpace::new(10 * MB, Box::new(crate::policy::LruPolicy::new()));
        for (t, &item) in reads.iter().enumerate() {
            // An item's size is fixed by its id, as a block's is.
            let size = (item % 3 + 1) * MB;
            let key = CacheKey::file(format!("d/f{}", item % 6).as_str(), "v", item);
            let ctx = demand(1 + item % 2, t as u64 + 1).with_read(0, 4096);
            let a = read(&mut guarded, &key, size, &ctx);
            let b = read(&mut lru, &key, size, &ctx);
            prop_assert_eq!(a, b, "read {} of item {}", t, item);
        }
    }
}

/// The policy's capacity is the tier's: asking for a victim to make room for a block
/// does not make the cache one block larger in the policy's eyes (it did: the probes,
/// the pools' shares and the recency guard's shadow LRU were sized for capacity plus
/// the incoming block, a 7-block LRU guarding a 6-block cache).
#[test]
fn the_policys_capacity_stays_the_tiers() {
    let cap = 6 * MB;
    let mut s = Sim::with(cap, PatternAwareConfig::default());
    for t in 0..40u64 {
        s.read(&kv(t % 9), MB, &demand(0, t));
    }
    assert!(s.used <= cap);
    assert_eq!(s.p.cap, cap);
}

/// Binary searches over a sorted file of 64 blocks on a 6-block cache: every search
/// reads the same top probes (the root block, then one of 2, one of 4, ...), and its
/// last probes alternate between two neighbouring blocks where the target sits on a
/// block boundary. The hot top blocks belong in the frequency main; each miss on the
/// alternating pair is a window ghost hit. A block the main let go comes back through
/// the window, so before `main_victims_stay_main` its later misses voted for a larger
/// window too, the share ran to 1 (the cache an LRU, which thrashes on the top probes)
/// and could not come back (held-out `bisectlog` at 40%: 354 s against LFU's 218).
fn binary_search_hits(cfg: PatternAwareConfig) -> (u64, u64, f64) {
    use rand::{Rng, SeedableRng};
    let cap = 6 * MB;
    let mut s = Sim::with(cap, cfg);
    let mut l = TierSpace::new(cap, Box::new(crate::policy::LruPolicy::new()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mut hits, mut lru_hits, mut t) = (0u64, 0u64, 0u64);
    for _ in 0..3_000 {
        let target: u64 = rng.random_range(0..255);
        let (mut lo, mut hi) = (0u64, 256u64);
        let mut probes = Vec::new();
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            probes.push(mid);
            if target < mid {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        probes.extend([target, target + 1, target, target + 1]);
        for b in probes {
            t += 1;
            hits += u64::from(s.read(&kv(b), MB, &demand(0, t)));
            lru_hits += u64::from(read(&mut l, &kv(b), MB, &demand(0, t)));
        }
    }
    (hits, lru_hits, s.p.stats().window_share)
}

#[test]
fn blocks_the_main_let_go_do_not_vote_for_a_larger_window() {
    // Without `main_victims_stay_main` (measured): share 0.86, 15,782 hits against
    // LRU's 12,062; with it 0.31 and 17,228.
    let (hits, lru_hits, share) = binary_search_hits(PatternAwareConfig::default());
    assert!(share <= 0.5, "window share {share}");
    assert!(
        hits as f64 >= 1.35 * lru_hits as f64,
        "strata {hits} lru {lru_hits}"
    );
}

/// While the guard spares a job (its own reads lost significantly to the shadow LRU),
/// the policy's victim, if that job read it last, is replaced by the least recently read
/// item of another job; a victim of a job not spared is the policy's own.
#[test]
fn a_spared_jobs_items_give_way_to_the_least_recent_of_another_job() {
    let cap = 4 * MB;
    let cfg = PatternAwareConfig {
        recency_guard: true,
        spare_starved_jobs: true,
        ..PatternAwareConfig::default()
    };
    let run = |spare: Option<u64>| {
        let mut s = Sim::with(cap, cfg.clone());
        if let Some(job) = spare {
            s.p.guard.as_mut().expect("guard on").force_spare(job);
        }
        // Job 1 reads blocks 0-1, job 2 blocks 10-11, job 1 the first two again.
        for (t, (job, b)) in [(1, 0), (1, 1), (2, 10), (2, 11), (1, 0), (1, 1)]
            .into_iter()
            .enumerate()
        {
            s.read(&kv(b), MB, &demand(job, t as u64));
        }
        // A fifth block comes in: one of the four goes.
        s.read(&kv(20), MB, &demand(3, 9));
        let gone: Vec<u64> = [0u64, 1, 10, 11]
            .into_iter()
            .filter(|&b| !s.res.contains_key(&kv(b)))
            .collect();
        (gone, s.p.stats().spared_victims)
    };
    let (own, _) = run(None);
    assert_eq!(own.len(), 1);
    // Spare the job whose block the policy chose: the other job's least recent goes.
    let owner = if own[0] < 10 { 1 } else { 2 };
    let (spared, replaced) = run(Some(owner));
    assert_eq!(replaced, 1);
    let other_first = if owner == 1 { 10 } else { 0 };
    assert_eq!(
        spared,
        vec![other_first],
        "the other job's least recent block"
    );
    // Sparing a job the policy did not choose changes nothing.
    let (untouched, replaced) = run(Some(3 - owner));
    assert_eq!(untouched, own);
    assert_eq!(replaced, 0);
}

/// Whole-file loads of 200 four-block files with Zipf popularity (LoRA adapters loaded
/// per request) through a 40-block cache, every block told `Sequential` and nothing
/// skewed (the per-stream tests miss popularity across files until hundreds of loads
/// are in): scan data for the policy's own rules. Returns the hits of loads 1,000-4,000.
fn popular_whole_files_hits(frequency_guard: bool) -> u64 {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Zipf};
    let mut s = Sim::with_knob(40 * MB, |c| c.frequency_guard = frequency_guard);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let zipf = Zipf::new(200.0, 1.0).expect("valid");
    let (mut hits, mut t) = (0, 0);
    for load in 0..4_000 {
        let f = zipf.sample(&mut rng) as u64;
        for b in 0..4 {
            t += 1;
            let key = CacheKey::file(format!("lora/adapter-{f:03}.safetensors"), "v", b);
            let hit = s.read_as(&key, MB, 1, t, Pattern::Sequential);
            if load >= 1_000 {
                hits += u64::from(hit);
            }
        }
    }
    hits
}

#[test]
fn popularity_the_streams_hide_is_found_by_the_frequency_guard() {
    let (on, off) = (
        popular_whole_files_hits(true),
        popular_whole_files_hits(false),
    );
    // Measured: 5,796 of 12,000 block reads with the guard, 3,479 without.
    assert!(
        on * 10 >= off * 14,
        "hits with the frequency guard {on}, without {off}"
    );
}

/// Black-box finding (round 13): under the default policy, one tenant's flood of KV
/// puts nobody read evicted another tenant's 8 blocks read every ~100 of those puts
/// (a cache of 256 blocks), which LRU kept. The flood's namespace is a "random"
/// stream, so its blocks went to the stable subset, which took half the cache from
/// the frequency main holding the hot blocks. KV blocks are ranked by reuse.
#[test]
fn a_flood_of_kv_puts_nobody_reads_does_not_evict_a_namespaces_hot_blocks() {
    let cap = 64 * MB;
    let size = 256 << 10;
    let mut s = TierSpace::new(cap, crate::policy::by_name("strata", cap).expect("strata"));
    let hot: Vec<CacheKey> = (0..8u64)
        .map(|i| CacheKey::kv("a:chat", i.to_be_bytes().to_vec()))
        .collect();
    let mut t = 0u64;
    let mut at = || {
        t += 1;
        t * 1_000_000
    };
    for k in &hot {
        read(&mut s, k, size, &demand(1, at()));
    }
    let mut n = 0u64;
    for round in 0..30 {
        for _ in 0..100 {
            n += 1;
            let flood = CacheKey::kv("b:bulk", n.to_be_bytes().to_vec());
            read(&mut s, &flood, size, &demand(2, at()));
        }
        let hits = hot
            .iter()
            .filter(|k| read(&mut s, k, size, &demand(1, at())))
            .count();
        assert_eq!(hits, 8, "round {round}: the hot blocks stay");
    }
    assert!(s.used() <= cap);
}

/// Black-box finding (round 13b): blocks a KV client put and read back at once (a
/// prefill/decode hand-off) beside a shared prefix every request reads: the default
/// policy evicted 70-75% of them before their first read (W-TinyLFU's new entries lose
/// to blocks read once), LRU none; its recency guard saw only the puts, as a KV Get
/// miss fills nothing. Told of those misses (`on_unfilled_miss`), the guard finds the
/// shadow LRU ahead and evicts in recency order.
#[test]
fn kv_blocks_read_back_after_their_put_turn_the_recency_guard_on() {
    let cap = MB;
    let size = 4096;
    let mut s = TierSpace::new(cap, crate::policy::by_name("strata", cap).expect("strata"));
    let mut t = 0u64;
    let mut at = || {
        t += 1;
        t * 1_000_000
    };
    let prefix: Vec<CacheKey> = (0..100u64)
        .map(|i| CacheKey::kv("m", i.to_be_bytes().to_vec()))
        .collect();
    let (mut hits, mut reads, mut n) = (0, 0, 1_000u64);
    for _request in 0..400 {
        for k in &prefix {
            read(&mut s, k, size, &demand(1, at()));
        }
        let fresh: Vec<CacheKey> = (0..16)
            .map(|_| {
                n += 1;
                CacheKey::kv("m", n.to_be_bytes().to_vec())
            })
            .collect();
        for k in &fresh {
            read(&mut s, k, size, &demand(1, at()));
        }
        for k in &fresh {
            let ctx = observed(k, &demand(1, at()));
            reads += 1;
            if s.touch(k, &ctx) {
                hits += 1;
            } else {
                s.note_unfilled_miss(k, &ctx);
            }
        }
    }
    assert!(s.policy_recency_periods() > 0, "the guard switched");
    assert!(
        hits as f64 >= 0.9 * reads as f64,
        "{hits} of {reads} read back (without the misses told: 1,544)"
    );
}
