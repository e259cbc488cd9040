//! Engine behaviour: read-through, single-flight, promotion/demotion, budgets, and a
//! property test against a reference model.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use strata_cache_core::conformance::TestTier;
use strata_cache_core::policy::by_name;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{AccessContext, CacheEngine, CacheError, CacheKey, Tier};

fn ctx() -> AccessContext {
    AccessContext::default()
}

fn two_level(top: u64, bottom: u64) -> (CacheEngine, Arc<MemoryTier>, Arc<MemoryTier>) {
    let a = Arc::new(MemoryTier::bytes_only(top));
    let b = Arc::new(MemoryTier::bytes_only(bottom));
    let engine = CacheEngine::builder()
        .tier(a.clone())
        .tier(b.clone())
        .build()
        .expect("build");
    (engine, a, b)
}

#[tokio::test]
async fn concurrent_misses_share_one_fetch() {
    let (engine, _, _) = two_level(1 << 20, 1 << 20);
    let fetches = Arc::new(AtomicUsize::new(0));
    let key = CacheKey::file("obj", "v1", 0);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let engine = engine.clone();
        let key = key.clone();
        let fetches = fetches.clone();
        tasks.push(tokio::spawn(async move {
            engine
                .get_or_fetch(&key, &ctx(), move || async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(Bytes::from_static(b"payload"))
                })
                .await
        }));
    }
    for t in tasks {
        assert_eq!(
            t.await.expect("join").expect("get"),
            Bytes::from_static(b"payload")
        );
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert!(engine.stats().singleflight_joins >= 1);
}

/// A block that lands while a reader's lookup is missing it (the reader found it on a
/// slow level that had lost it; meanwhile a put stored it on top) is looked up again,
/// not fetched: the cluster test once saw a block fetched twice from the store when
/// another caller's fetch filled it in that window.
#[tokio::test]
async fn a_block_that_lands_during_a_missing_lookup_is_not_fetched() {
    let bottom = Arc::new(TestTier::slow_gets(
        MemoryTier::bytes_only(1000),
        Duration::from_millis(200),
    ));
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::bytes_only(100)))
        .tier(bottom.clone())
        .build()
        .expect("build");
    let k = |i| CacheKey::file("f", "v", i);
    for i in 0..2 {
        engine
            .put(&k(i), Bytes::from(vec![i as u8; 100]), &ctx())
            .await
            .expect("put");
    }
    assert!(bottom.contains(&k(0)).await, "k0 was demoted");
    // The bottom level loses k0 behind the engine's back: the engine still counts it
    // there, so a lookup waits on the slow get and then misses.
    bottom.remove(&k(0)).await.expect("remove");
    let fetches = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (engine, key, fetches) = (engine.clone(), k(0), fetches.clone());
        tokio::spawn(async move {
            engine
                .get_or_fetch(&key, &ctx(), move || async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    Ok(Bytes::from(vec![9u8; 100]))
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    engine
        .put(&k(0), Bytes::from(vec![0u8; 100]), &ctx())
        .await
        .expect("put during the lookup");
    let got = reader.await.expect("join").expect("read");
    assert_eq!(
        got,
        Bytes::from(vec![0u8; 100]),
        "the stored block is served"
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 0, "no second fetch");
}

#[tokio::test]
async fn a_failed_fetch_reaches_every_waiter_and_is_not_cached() {
    let (engine, _, _) = two_level(1 << 20, 1 << 20);
    let key = CacheKey::file("obj", "v1", 0);
    let r = engine
        .get_or_fetch(&key, &ctx(), || async {
            Err(CacheError::StoreTimeout { attempts: 3 })
        })
        .await;
    assert!(matches!(r, Err(CacheError::StoreTimeout { attempts: 3 })));
    assert!(!engine.contains(&key));
    // The next call fetches again and succeeds.
    let r = engine
        .get_or_fetch(&key, &ctx(), || async { Ok(Bytes::from_static(b"ok")) })
        .await;
    assert_eq!(r.expect("second fetch"), Bytes::from_static(b"ok"));
}

#[tokio::test]
async fn eviction_demotes_and_a_lower_hit_promotes() {
    // Top holds one 100-byte block, bottom holds ten.
    let (engine, top, bottom) = two_level(100, 1000);
    let k = |i| CacheKey::file("f", "v", i);
    engine
        .put(&k(0), Bytes::from(vec![0u8; 100]), &ctx())
        .await
        .expect("put 0");
    engine
        .put(&k(1), Bytes::from(vec![1u8; 100]), &ctx())
        .await
        .expect("put 1");
    assert!(top.contains(&k(1)).await);
    assert!(!top.contains(&k(0)).await, "k0 was evicted from the top");
    assert!(bottom.contains(&k(0)).await, "k0 was demoted, not lost");
    // Reading k0 promotes it back to the top (evicting k1 down).
    assert_eq!(
        engine.get(&k(0), &ctx()).await.expect("get"),
        Some(Bytes::from(vec![0u8; 100]))
    );
    assert!(top.contains(&k(0)).await);
    assert!(bottom.contains(&k(1)).await);
    let s = engine.stats();
    assert!(s.promotions >= 1 && s.demotions >= 2);
    assert!(s.tiers[0].evictions >= 2);
}

/// Black-box finding (round 14): KV Prefetch staging (reads that are no client's)
/// counted as tier hits and misses: a Prefetch and no Get showed memory at a 0% hit
/// ratio. A tier's hits and misses count demand reads only.
#[tokio::test]
async fn reads_that_are_no_clients_do_not_count_as_hits_or_misses() {
    let (engine, _top, _bottom) = two_level(100, 1000);
    let k = |i| CacheKey::file("f", "v", i);
    for i in 0..2 {
        engine
            .put(&k(i), Bytes::from(vec![i as u8; 100]), &ctx())
            .await
            .expect("put");
    }
    let before = engine.stats();
    // k0 is below: staging it misses the top and hits the bottom.
    let staged = engine
        .get(&k(0), &AccessContext::prefetch(Default::default(), 0))
        .await
        .expect("stage");
    assert!(staged.is_some());
    let after = engine.stats();
    for (b, a) in before.tiers.iter().zip(&after.tiers) {
        assert_eq!((a.hits, a.misses), (b.hits, b.misses), "{}", a.name);
    }
    // A client's read of it is a top hit.
    engine.get(&k(0), &ctx()).await.expect("get");
    assert_eq!(engine.stats().tiers[0].hits, before.tiers[0].hits + 1);
}

#[tokio::test]
async fn a_value_larger_than_the_top_tier_lands_below() {
    let (engine, top, bottom) = two_level(100, 1000);
    let key = CacheKey::kv("ns", vec![1u8; 32]);
    engine
        .put(&key, Bytes::from(vec![7u8; 500]), &ctx())
        .await
        .expect("put");
    assert!(!top.contains(&key).await);
    assert!(bottom.contains(&key).await);
    assert_eq!(
        engine
            .get(&key, &ctx())
            .await
            .expect("get")
            .map(|b| b.len()),
        Some(500)
    );
    // Larger than every tier: a clear error.
    let huge = CacheKey::kv("ns", vec![2u8; 32]);
    assert!(engine
        .put(&huge, Bytes::from(vec![0u8; 2000]), &ctx())
        .await
        .is_err());
    // Counted as the one fill it was not (black-box finding: refused KV puts showed as
    // fills of their bytes).
    let stats = engine.stats();
    assert_eq!(
        (stats.fills, stats.fill_bytes),
        (1, 500),
        "only what was filled"
    );
}

/// A Remove is what a Put that arrived before it must not undo; an eviction the cache
/// makes for its own reasons (a tenant's quota) is not (black-box finding, round 23:
/// Puts racing the quota's eviction of their key failed as if a client had removed it).
/// Both take the block out of every level.
#[tokio::test]
async fn an_eviction_is_no_remove_to_a_put_that_arrived_before_it() {
    let (engine, top, bottom) = two_level(1000, 1000);
    let key = CacheKey::kv("ns", vec![3u8; 32]);
    let other = CacheKey::kv("ns", vec![4u8; 32]);
    for k in [&key, &other] {
        engine
            .put(k, Bytes::from(vec![1u8; 100]), &ctx())
            .await
            .expect("put");
    }
    let arrived = engine.removal_seq();
    assert!(engine.evict(&key).await.expect("evict"), "it was held");
    assert!(!top.contains(&key).await && !bottom.contains(&key).await);
    assert!(!engine.known_removed_since(&key, arrived), "an eviction");
    assert!(engine.remove(&other).await.expect("remove"));
    assert!(engine.known_removed_since(&other, arrived), "a Remove");
    assert!(
        !engine.known_removed_since(&key, arrived),
        "still only evicted"
    );
    assert!(!engine.evict(&key).await.expect("evict"), "nothing left");
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, usize),
    Get(u8),
    Remove(u8),
    /// A read that is no client's (KV staging): a prefetch get.
    Stage(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..24, 1usize..120).prop_map(|(k, n)| Op::Put(k, n)),
        (0u8..24).prop_map(Op::Get),
        (0u8..24).prop_map(Op::Remove),
        (0u8..24).prop_map(Op::Stage),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Against a reference map of the last value put per key: a get returns exactly
    /// that value or a miss (never stale or foreign bytes), and no tier ever exceeds
    /// its budget.
    /// Every policy a live tier can run that admits everything (tinylfu may refuse a
    /// put, which the model does not describe).
    #[test]
    fn engine_matches_reference_model(
        ops in proptest::collection::vec(op(), 1..120),
        policy in prop_oneof![Just("strata"), Just("lru"), Just("lfu"), Just("arc"), Just("2random")],
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        rt.block_on(async {
            let top = Arc::new(MemoryTier::bytes_only(300));
            let bottom = Arc::new(MemoryTier::bytes_only(900));
            let engine = CacheEngine::builder()
                .tier_with_policy(top.clone(), by_name(policy, 300).expect("policy"))
                .tier_with_policy(bottom.clone(), by_name(policy, 900).expect("policy"))
                .build()
                .expect("build");
            let mut model: HashMap<u8, Bytes> = HashMap::new();
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Put(k, n) => {
                        // Keys are immutable once put: a new value means a new version.
                        let key = CacheKey::kv("m", vec![k]);
                        if model.contains_key(&k) { continue; }
                        let v = Bytes::from(vec![(step % 251) as u8; n]);
                        engine.put(&key, v.clone(), &ctx()).await.expect("put");
                        model.insert(k, v);
                    }
                    Op::Get(k) | Op::Stage(k) => {
                        let c = if matches!(op, Op::Stage(_)) {
                            AccessContext::prefetch(Default::default(), step as u64)
                        } else {
                            ctx()
                        };
                        let got = engine.get(&CacheKey::kv("m", vec![k]), &c).await.expect("get");
                        if let Some(g) = got {
                            prop_assert_eq!(Some(&g), model.get(&k));
                        }
                    }
                    Op::Remove(k) => {
                        engine.remove(&CacheKey::kv("m", vec![k])).await.expect("remove");
                        model.remove(&k);
                    }
                }
                prop_assert!(top.used_bytes() <= 300);
                prop_assert!(bottom.used_bytes() <= 900);
            }
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn misses_are_counted_per_level() {
    let (engine, _, _) = two_level(1000, 1000);
    let key = CacheKey::file("f", "v", 0);
    assert_eq!(engine.get(&key, &ctx()).await.expect("get"), None);
    let s = engine.stats();
    assert_eq!((s.tiers[0].misses, s.tiers[1].misses), (1, 1));
    engine
        .put(&key, Bytes::from_static(b"x"), &ctx())
        .await
        .expect("put");
    assert!(engine.get(&key, &ctx()).await.expect("get").is_some());
    let s = engine.stats();
    assert_eq!((s.tiers[0].hits, s.tiers[0].misses), (1, 1));
}

/// An engine over one memory tier of `capacity` bytes that yields in every call (so
/// concurrent operations interleave at each await as over a real disk), and that tier.
fn yielding_engine(capacity: u64) -> (Arc<TestTier<MemoryTier>>, CacheEngine) {
    let tier = Arc::new(TestTier::yielding(MemoryTier::bytes_only(capacity)));
    let engine = CacheEngine::builder()
        .tier(tier.clone())
        .build()
        .expect("build");
    (tier, engine)
}

/// One budget: concurrent puts and evictions over a tier that yields in every call
/// never leave bytes in the tier that the engine does not count, keep the device within
/// its budget once writes settle (and within one block per concurrent write while
/// victims are being removed), and while the writes in flight fit the budget, no put
/// fails.
#[tokio::test(flavor = "current_thread")]
async fn concurrent_puts_stay_within_one_budget() {
    const BLOCK: usize = 1000;
    let (tier, engine) = yielding_engine(40 * BLOCK as u64);
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for round in 0..20u64 {
        let mut tasks = Vec::new();
        for i in 0..32u64 {
            let engine = engine.clone();
            let (tier, peak) = (tier.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                let key = CacheKey::file(format!("obj{round}-{i}"), "v1", 0);
                let r = engine
                    .put(&key, Bytes::from(vec![i as u8; BLOCK]), &ctx())
                    .await;
                peak.fetch_max(tier.used_bytes(), Ordering::SeqCst);
                r
            }));
        }
        for t in tasks {
            t.await.expect("join").expect("a put with room to make");
        }
        for (key, _) in &tier.resident() {
            assert!(
                engine.contains(key),
                "round {round}: {key} is in the tier but not in the engine's accounting"
            );
        }
        assert!(tier.used_bytes() <= tier.capacity_bytes());
    }
    assert!(peak.load(Ordering::SeqCst) <= tier.capacity_bytes() + 32 * BLOCK as u64);
}

/// More writes in flight than the tier can hold: the excess is refused with a clear
/// `Full` (the budget is held by writes not yet landed), never over-committed.
#[tokio::test(flavor = "current_thread")]
async fn writes_beyond_the_budget_in_flight_are_refused_not_overcommitted() {
    const BLOCK: usize = 1000;
    let (tier, engine) = yielding_engine(8 * BLOCK as u64);
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let key = CacheKey::file(format!("obj{i}"), "v1", 0);
            engine
                .put(&key, Bytes::from(vec![i as u8; BLOCK]), &ctx())
                .await
        }));
    }
    let (mut ok, mut full) = (0, 0);
    for t in tasks {
        match t.await.expect("join") {
            Ok(()) => ok += 1,
            Err(CacheError::Full(_)) => full += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(ok >= 8, "{ok} stored");
    assert_eq!(ok + full, 32);
    assert!(tier.used_bytes() <= tier.capacity_bytes());
    for (key, _) in &tier.resident() {
        assert!(engine.contains(key));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// The reference model again, with operations issued in concurrent batches over
    /// tiers that yield inside every call: a get returns the value put or a miss, the
    /// device never holds more than its budget, and after each batch every byte in a
    /// tier is counted by the engine.
    #[test]
    fn concurrent_engine_matches_reference_model(
        batches in proptest::collection::vec(proptest::collection::vec(op(), 1..8), 1..24),
        policy in prop_oneof![Just("strata"), Just("lru"), Just("arc")],
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        rt.block_on(async {
            let top = Arc::new(TestTier::yielding(MemoryTier::bytes_only(300)));
            let bottom = Arc::new(TestTier::yielding(MemoryTier::bytes_only(900)));
            let engine = CacheEngine::builder()
                .tier_with_policy(top.clone(), by_name(policy, 300).expect("policy"))
                .tier_with_policy(bottom.clone(), by_name(policy, 900).expect("policy"))
                .build()
                .expect("build");
            // Values are immutable: key k always holds the bytes value(k).
            let value = |k: u8, n: usize| Bytes::from(vec![k.wrapping_mul(7); n.max(1)]);
            let mut sizes: HashMap<u8, usize> = HashMap::new();
            for batch in batches {
                let mut tasks = Vec::new();
                for op in batch {
                    let engine = engine.clone();
                    let (k, n) = match op {
                        Op::Put(k, n) => (k, *sizes.entry(k).or_insert(n)),
                        Op::Get(k) | Op::Remove(k) | Op::Stage(k) => (k, sizes.get(&k).copied().unwrap_or(1)),
                    };
                    tasks.push(tokio::spawn(async move {
                        let key = CacheKey::kv("m", vec![k]);
                        match op {
                            Op::Put(..) => {
                                let _ = engine.put(&key, value(k, n), &ctx()).await;
                                None
                            }
                            Op::Get(_) => engine.get(&key, &ctx()).await.expect("get").map(|g| (k, n, g)),
                            Op::Stage(_) => engine
                                .get(&key, &AccessContext::prefetch(Default::default(), 0))
                                .await
                                .expect("stage")
                                .map(|g| (k, n, g)),
                            Op::Remove(_) => {
                                engine.remove(&key).await.expect("remove");
                                None
                            }
                        }
                    }));
                }
                for t in tasks {
                    if let Some((k, n, got)) = t.await.expect("join") {
                        prop_assert_eq!(got, value(k, n));
                    }
                }
                prop_assert!(top.used_bytes() <= 300, "top {}", top.used_bytes());
                prop_assert!(bottom.used_bytes() <= 900, "bottom {}", bottom.used_bytes());
                for tier in [&top, &bottom] {
                    for (key, _) in tier.resident() {
                        prop_assert!(engine.contains(&key), "{} not counted", key);
                    }
                }
            }
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn a_read_in_place_is_a_hit_for_the_policy_without_moving_bytes() {
    // Top holds three 100-byte blocks (LRU). k0 is put first, then read only in place
    // (a device handle): it must outlive k1, put after it but never read.
    let (engine, top, _bottom) = two_level(300, 1000);
    let k = |i| CacheKey::file("f", "v", i);
    for i in 0..3 {
        engine
            .put(&k(i), Bytes::from(vec![i as u8; 100]), &ctx())
            .await
            .expect("put");
    }
    let demand = AccessContext::demand(strata_cache_core::JobId(1), 1);
    let out_before = top.stats().bytes_out;
    assert_eq!(
        engine.record_read_in_place(&k(0), &demand),
        Some(strata_cache_core::TierKind::Memory)
    );
    assert_eq!(top.stats().bytes_out, out_before, "no bytes were read");
    engine
        .put(&k(3), Bytes::from(vec![3u8; 100]), &ctx())
        .await
        .expect("put 3");
    assert!(top.contains(&k(0)).await, "k0, read in place, stays");
    assert!(!top.contains(&k(1)).await, "k1, never read, is the victim");
    // Counted as the level's hit (round 20: a GPU tier's reads by handle were not).
    assert_eq!(
        engine.stats().tiers[0].hits,
        1,
        "the read in place is a hit"
    );
    // Not held anywhere: nothing to record.
    assert_eq!(engine.record_read_in_place(&k(9), &demand), None);
}

/// A memory tier that presents itself as a disk and counts which kind of write reached
/// it: `put` (the tier's full durability) or `put_refetchable` (syncs may be skipped).
struct DurabilityProbe {
    inner: MemoryTier,
    durable: AtomicUsize,
    refetchable: AtomicUsize,
}

impl DurabilityProbe {
    fn new(capacity: u64) -> Arc<Self> {
        Arc::new(DurabilityProbe {
            inner: MemoryTier::bytes_only(capacity),
            durable: AtomicUsize::new(0),
            refetchable: AtomicUsize::new(0),
        })
    }
    /// (durable, refetchable) writes so far.
    fn writes(&self) -> (usize, usize) {
        (
            self.durable.load(Ordering::SeqCst),
            self.refetchable.load(Ordering::SeqCst),
        )
    }
}

#[async_trait::async_trait]
impl Tier for DurabilityProbe {
    fn kind(&self) -> strata_cache_core::TierKind {
        strata_cache_core::TierKind::Disk
    }
    fn name(&self) -> String {
        "disk:probe".into()
    }
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }
    fn used_bytes(&self) -> u64 {
        self.inner.used_bytes()
    }
    async fn get(&self, key: &CacheKey) -> strata_cache_core::Result<strata_cache_core::TierGet> {
        self.inner.get(key).await
    }
    async fn put(
        &self,
        key: &CacheKey,
        block: strata_cache_core::Block,
    ) -> strata_cache_core::Result<()> {
        self.durable.fetch_add(1, Ordering::SeqCst);
        self.inner.put(key, block).await
    }
    async fn put_refetchable(
        &self,
        key: &CacheKey,
        block: strata_cache_core::Block,
    ) -> strata_cache_core::Result<()> {
        self.refetchable.fetch_add(1, Ordering::SeqCst);
        self.inner.put(key, block).await
    }
    async fn remove(&self, key: &CacheKey) -> strata_cache_core::Result<bool> {
        self.inner.remove(key).await
    }
    async fn contains(&self, key: &CacheKey) -> bool {
        self.inner.contains(key).await
    }
    fn resident(&self) -> Vec<(CacheKey, u64)> {
        self.inner.resident()
    }
    fn footprint(&self, key: &CacheKey, len: u64) -> u64 {
        self.inner.footprint(key, len)
    }
    fn stats(&self) -> strata_cache_core::stats::TierStatsSnapshot {
        self.inner.stats()
    }
}

/// Waits (up to 5 s) until `disk` saw `n` writes in all: fills write through in the
/// background.
async fn writes_reach(disk: &DurabilityProbe, n: usize) -> (usize, usize) {
    for _ in 0..500 {
        let (d, r) = disk.writes();
        if d + r >= n {
            return (d, r);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    disk.writes()
}

/// A read-through fill of a file block is a copy the object store still holds: it
/// reaches the disk without the syncs, while an explicit put and every copy of a KV
/// block (nothing else holds those) keep the disk's full durability.
#[tokio::test]
async fn only_copies_of_file_blocks_skip_the_disks_syncs() {
    let disk = DurabilityProbe::new(1 << 20);
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::bytes_only(1 << 20)))
        .tier(disk.clone())
        .build()
        .expect("build");
    let file = CacheKey::file("f", "v", 0);
    engine
        .get_or_fetch(&file, &ctx(), || async {
            Ok(Bytes::from_static(b"from the store"))
        })
        .await
        .expect("fill");
    assert_eq!(
        writes_reach(&disk, 1).await,
        (0, 1),
        "the fill is refetchable"
    );
    engine
        .put(
            &CacheKey::file("f", "v", 1),
            Bytes::from_static(b"put"),
            &ctx(),
        )
        .await
        .expect("file put");
    engine
        .put(
            &CacheKey::kv("ns", vec![7u8; 32]),
            Bytes::from_static(b"kv"),
            &ctx(),
        )
        .await
        .expect("kv put");
    assert_eq!(disk.writes(), (2, 1), "explicit puts are durable");
}

/// Without write-through, a victim of the memory tier reaches the disk as a demotion:
/// a file block's as a refetchable copy, a KV block's with full durability.
#[tokio::test]
async fn demotions_are_durable_only_for_kv_blocks() {
    let disk = DurabilityProbe::new(1000);
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::bytes_only(100)))
        .tier(disk.clone())
        .write_through(false)
        .build()
        .expect("build");
    let file = |i| CacheKey::file("f", "v", i);
    for i in 0..2 {
        engine
            .get_or_fetch(&file(i), &ctx(), move || async move {
                Ok(Bytes::from(vec![i as u8; 100]))
            })
            .await
            .expect("fill");
    }
    // Written behind the reader: waited for here.
    assert_eq!(
        writes_reach(&disk, 1).await,
        (0, 1),
        "file block 0 demoted as a copy"
    );
    let kv = |i: u8| CacheKey::kv("ns", vec![i; 32]);
    for i in 0..2u8 {
        engine
            .put(&kv(i), Bytes::from(vec![i; 100]), &ctx())
            .await
            .expect("kv put");
    }
    let (durable, refetchable) = disk.writes();
    assert_eq!(refetchable, 2, "file block 1 demoted as a copy too");
    assert_eq!(durable, 1, "KV block 0 demoted durably");
    assert!(disk.contains(&kv(0)).await);
}

/// A KV block read from memory keeps its disk copy fresh: file fills that pass through
/// the disk evict the file blocks nobody read, not the hot KV block, so it is still on
/// disk for a restart. A file block read from memory is left to age on disk.
#[tokio::test]
async fn reads_from_memory_keep_a_kv_blocks_disk_copy_fresh() {
    let disk = DurabilityProbe::new(1000);
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::bytes_only(1 << 20)))
        .tier(disk.clone())
        .build()
        .expect("build");
    let kv = CacheKey::kv("ns", vec![1u8; 32]);
    engine
        .put(&kv, Bytes::from(vec![1u8; 100]), &ctx())
        .await
        .expect("kv put");
    let hot_file = CacheKey::file("hot", "v", 0);
    engine
        .get_or_fetch(&hot_file, &ctx(), || async {
            Ok(Bytes::from(vec![2u8; 100]))
        })
        .await
        .expect("fill");
    writes_reach(&disk, 2).await;
    // Twenty more file blocks pass through a disk that holds ten, the two hot blocks
    // read from memory between each.
    for i in 0..20u64 {
        for key in [&kv, &hot_file] {
            let got = engine.get(key, &ctx()).await.expect("get");
            assert!(got.is_some(), "memory holds {key}");
        }
        engine
            .get_or_fetch(
                &CacheKey::file("scan", "v", i),
                &ctx(),
                move || async move { Ok(Bytes::from(vec![3u8; 100])) },
            )
            .await
            .expect("fill");
        writes_reach(&disk, 3 + i as usize).await;
    }
    assert!(
        disk.contains(&kv).await,
        "the hot KV block kept its disk copy"
    );
    assert!(
        !disk.contains(&hot_file).await,
        "a file block's disk copy ages however often memory serves it"
    );
}

/// After a restart the disk's accounting is rebuilt from what it holds: refetchable
/// file copies are taken as older than KV blocks, so new fills evict them first and the
/// KV blocks (nothing else holds them) stay, whatever order they were written in.
#[tokio::test]
async fn after_a_restart_file_copies_go_before_kv_blocks() {
    use strata_cache_core::block::Block;
    use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
    let kv = CacheKey::kv("ns", vec![1u8; 32]);
    let file = |name: &str, i: u64| CacheKey::file(name, "v", i);
    let scratch = tempfile::tempdir().expect("scratch");
    let footprint = {
        let t = DiskTier::open(scratch.path(), 1 << 20, DiskOptions::default()).expect("open");
        t.footprint(&kv, 100).max(t.footprint(&file("old", 0), 100))
    };
    let dir = tempfile::tempdir().expect("dir");
    let capacity = 10 * footprint;
    {
        let disk = DiskTier::open(dir.path(), capacity, DiskOptions::default()).expect("open");
        disk.put(&kv, Block::new(Bytes::from(vec![1u8; 100])))
            .await
            .expect("kv put");
        for i in 0..9 {
            disk.put_refetchable(&file("old", i), Block::new(Bytes::from(vec![2u8; 100])))
                .await
                .expect("file put");
        }
    }
    let disk =
        Arc::new(DiskTier::open(dir.path(), capacity, DiskOptions::default()).expect("reopen"));
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::bytes_only(1 << 20)))
        .tier(disk.clone())
        .build()
        .expect("build");
    for i in 0..5 {
        engine
            .get_or_fetch(&file("new", i), &ctx(), || async {
                Ok(Bytes::from(vec![3u8; 100]))
            })
            .await
            .expect("fill");
    }
    // Fills reach the disk behind the reader.
    for _ in 0..500 {
        if disk.contains(&file("new", 4)).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        disk.contains(&file("new", 4)).await,
        "the fills reached the disk"
    );
    assert!(
        disk.contains(&kv).await,
        "the KV block outlived the old file copies"
    );
    assert!(
        !disk.contains(&file("old", 0)).await,
        "the oldest file copy went first"
    );
}

/// A memory tier with two hooks: the next `get` of `gate` (once armed) is held after
/// its read until released (a promotion's bytes read, then placed after an await), and
/// every `put` lands its bytes, then takes `put_delay` to finish (a disk tier writes the
/// block file, then its index).
struct HookedTier {
    inner: MemoryTier,
    gate: Option<CacheKey>,
    armed: std::sync::atomic::AtomicBool,
    reading: tokio::sync::Notify,
    release: tokio::sync::Notify,
    put_delay: Duration,
    /// Reports itself a disk tier (persistent: write-through reaches it).
    disk: bool,
}

impl HookedTier {
    fn new(capacity: u64, gate: Option<CacheKey>, put_delay: Duration) -> Arc<Self> {
        Arc::new(HookedTier {
            inner: MemoryTier::bytes_only(capacity),
            gate,
            armed: std::sync::atomic::AtomicBool::new(false),
            reading: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
            put_delay,
            disk: false,
        })
    }

    /// A disk-kind tier whose writes take `put_delay`.
    fn disk(capacity: u64, put_delay: Duration) -> Arc<Self> {
        let mut t = Arc::into_inner(Self::new(capacity, None, put_delay)).expect("sole owner");
        t.disk = true;
        Arc::new(t)
    }
}

#[async_trait::async_trait]
impl Tier for HookedTier {
    fn kind(&self) -> strata_cache_core::TierKind {
        match self.disk {
            true => strata_cache_core::TierKind::Disk,
            false => self.inner.kind(),
        }
    }
    fn name(&self) -> String {
        "hooked".into()
    }
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }
    fn used_bytes(&self) -> u64 {
        self.inner.used_bytes()
    }
    async fn get(&self, key: &CacheKey) -> strata_cache_core::Result<strata_cache_core::TierGet> {
        let got = self.inner.get(key).await;
        if self.gate.as_ref() == Some(key) && self.armed.swap(false, Ordering::SeqCst) {
            self.reading.notify_one();
            self.release.notified().await;
        }
        got
    }
    async fn put(
        &self,
        key: &CacheKey,
        block: strata_cache_core::Block,
    ) -> strata_cache_core::Result<()> {
        self.inner.put(key, block).await?;
        if !self.put_delay.is_zero() {
            tokio::time::sleep(self.put_delay).await;
        }
        Ok(())
    }
    async fn remove(&self, key: &CacheKey) -> strata_cache_core::Result<bool> {
        self.inner.remove(key).await
    }
    async fn contains(&self, key: &CacheKey) -> bool {
        self.inner.contains(key).await
    }
    fn resident(&self) -> Vec<(CacheKey, u64)> {
        self.inner.resident()
    }
    fn footprint(&self, key: &CacheKey, len: u64) -> u64 {
        self.inner.footprint(key, len)
    }
    fn stats(&self) -> strata_cache_core::stats::TierStatsSnapshot {
        self.inner.stats()
    }
}

/// A Remove between a lower-level hit's read and its promotion: the promotion must not
/// put the removed value back (it did: the next Put of the key was "already present"
/// and Gets served the removed bytes; black-box finding, KV Prefetch and Get racing a
/// Remove).
#[tokio::test]
async fn a_remove_during_a_promotion_is_not_undone() {
    let key = CacheKey::kv("ns", vec![7; 32]);
    let top = Arc::new(MemoryTier::bytes_only(2_500));
    let bottom = HookedTier::new(1 << 20, Some(key.clone()), Duration::ZERO);
    let engine = CacheEngine::builder()
        .tier(top.clone())
        .tier(bottom.clone())
        .build()
        .expect("build");
    let old = Bytes::from(vec![1u8; 1000]);
    engine.put(&key, old.clone(), &ctx()).await.expect("put");
    // Pushed down to the bottom level by newer blocks.
    for i in 0..3u8 {
        let k = CacheKey::kv("ns", vec![i; 32]);
        engine
            .put(&k, Bytes::from(vec![i; 1000]), &ctx())
            .await
            .expect("put other");
    }
    assert!(!top.contains(&key).await && bottom.inner.contains(&key).await);

    bottom.armed.store(true, Ordering::SeqCst);
    let reader = {
        let (engine, key) = (engine.clone(), key.clone());
        tokio::spawn(async move { engine.get(&key, &ctx()).await })
    };
    bottom.reading.notified().await;
    assert!(engine.remove(&key).await.expect("remove"), "it was held");
    bottom.release.notify_one();
    let got = reader.await.expect("join").expect("get");
    assert_eq!(
        got,
        Some(old),
        "a get that started before the remove may see it"
    );
    assert!(
        !top.contains(&key).await,
        "the promotion did not put it back"
    );
    assert_eq!(
        engine.get(&key, &ctx()).await.expect("get"),
        None,
        "removed"
    );
    let new = Bytes::from(vec![2u8; 1000]);
    engine
        .put(&key, new.clone(), &ctx())
        .await
        .expect("put new");
    assert_eq!(engine.get(&key, &ctx()).await.expect("get"), Some(new));
}

/// A put whose caller goes away mid-way (a client past its deadline) is finished, so
/// the level counts what its tier holds (the tier kept the bytes and the level did not
/// count them: block files no budget counted, a disk tier at 8.7x its capacity;
/// black-box finding).
#[tokio::test]
async fn a_put_whose_caller_goes_away_is_finished() {
    let tier = HookedTier::new(1 << 20, None, Duration::from_millis(150));
    let engine = CacheEngine::builder()
        .tier(tier.clone())
        .build()
        .expect("build");
    let key = CacheKey::kv("ns", vec![9; 32]);
    let c = ctx();
    let put = engine.put(&key, Bytes::from(vec![5u8; 1000]), &c);
    assert!(
        tokio::time::timeout(Duration::from_millis(30), put)
            .await
            .is_err(),
        "the caller gave up while the tier was still writing"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(tier.inner.contains(&key).await, "the tier holds it");
    assert!(engine.contains(&key), "and the level counts it");
    assert_eq!(
        engine.get(&key, &ctx()).await.expect("get"),
        Some(Bytes::from(vec![5u8; 1000]))
    );
}

/// Black-box finding (round 15): a put was seen in memory while its disk write ran,
/// evicted from memory by other puts, and seen again once the disk write committed:
/// present, absent, present for one put with nothing removed. A put written through is
/// now seen once it is durable, and from then on.
#[tokio::test]
async fn a_put_is_seen_once_it_is_durable_and_from_then_on() {
    let top = Arc::new(MemoryTier::bytes_only(1_000));
    let disk = HookedTier::disk(1 << 20, Duration::from_millis(200));
    let engine = CacheEngine::builder()
        .tier(top.clone())
        .tier(disk.clone())
        .build()
        .expect("build");
    let a = CacheKey::kv("ns", vec![1; 32]);
    let b = CacheKey::kv("ns", vec![2; 32]);
    let value = Bytes::from(vec![7u8; 1000]);
    let put_a = {
        let (engine, a, value) = (engine.clone(), a.clone(), value.clone());
        tokio::spawn(async move { engine.put(&a, value, &ctx()).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let seen_early = tokio::time::timeout(Duration::from_millis(20), engine.get(&a, &ctx())).await;
    // Another put that would push a memory copy of `a` out while `a`'s disk write runs.
    let put_b = {
        let (engine, b) = (engine.clone(), b.clone());
        tokio::spawn(async move { engine.put(&b, Bytes::from(vec![8u8; 1000]), &ctx()).await })
    };
    put_a.await.expect("join").expect("put a");
    let mut seen_after = Vec::new();
    for _ in 0..10 {
        seen_after.push(engine.get(&a, &ctx()).await.expect("get").is_some());
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    put_b.await.expect("join").expect("put b");
    seen_after.push(engine.get(&a, &ctx()).await.expect("get").is_some());
    assert!(
        !matches!(seen_early, Ok(Ok(Some(_)))),
        "not seen before its disk write is done"
    );
    assert!(
        seen_after.iter().all(|s| *s),
        "seen from the acknowledgement on: {seen_after:?}"
    );
    assert_eq!(engine.get(&a, &ctx()).await.expect("get"), Some(value));
}

/// A cache disk slower than the store: file blocks fetched through a small memory
/// level reach their reader without waiting for their disk copies (the 1 s writes run
/// behind it), the copies pending stay within the write-behind bound and the rest are
/// shed and counted, and no block is fetched twice. Before, each read waited for a
/// disk write (cold reads ran at the disk's write speed) and nothing bounded the
/// copies waiting for the disk.
#[tokio::test]
async fn copies_for_a_slow_disk_are_written_behind_the_reader_within_a_bound() {
    const BLOCK: u64 = 1_000;
    let disk = HookedTier::disk(1 << 20, Duration::from_secs(2));
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::bytes_only(2 * BLOCK)))
        .tier(disk.clone())
        .write_behind_bytes(3 * BLOCK)
        .build()
        .expect("build");
    let fetches = Arc::new(AtomicUsize::new(0));
    let started = std::time::Instant::now();
    for i in 0..20u64 {
        let fetches = fetches.clone();
        let got = engine
            .get_or_fetch(&CacheKey::file("f", "v", i), &ctx(), move || async move {
                fetches.fetch_add(1, Ordering::SeqCst);
                Ok(Bytes::from(vec![i as u8; BLOCK as usize]))
            })
            .await
            .expect("read");
        assert_eq!(got.len() as u64, BLOCK);
        let pending = engine.stats().write_behind_bytes;
        assert!(pending <= 3 * BLOCK, "{pending} bytes pending");
    }
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "reads waited for the disk: {:?}",
        started.elapsed()
    );
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        20,
        "each block fetched once"
    );
    let shed = engine.stats().writes_shed;
    assert!(shed > 0, "a disk this slow cannot take every copy");
    for _ in 0..300 {
        if engine.stats().write_behind_bytes == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        engine.stats().write_behind_bytes,
        0,
        "every write behind finished"
    );
    let on_disk = disk.used_bytes();
    assert!(on_disk >= BLOCK, "the copies within the bound landed");
    // Every block is in one level or was shed (twice: the fill's copy and the memory
    // victim's demotion may both have been).
    let resident = (0..20u64)
        .filter(|&i| engine.contains(&CacheKey::file("f", "v", i)))
        .count() as u64;
    assert!(
        resident >= 20u64.saturating_sub(shed),
        "{resident} resident, {shed} shed"
    );
}
