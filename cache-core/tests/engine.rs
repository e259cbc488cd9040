//! Engine behaviour: read-through, single-flight, promotion/demotion, budgets, and a
//! property test against a reference model.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{AccessContext, CacheEngine, CacheError, CacheKey, Tier};

fn ctx() -> AccessContext {
    AccessContext::default()
}

fn two_level(top: u64, bottom: u64) -> (CacheEngine, Arc<MemoryTier>, Arc<MemoryTier>) {
    let a = Arc::new(MemoryTier::new(top));
    let b = Arc::new(MemoryTier::new(bottom));
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
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, usize),
    Get(u8),
    Remove(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..24, 1usize..120).prop_map(|(k, n)| Op::Put(k, n)),
        (0u8..24).prop_map(Op::Get),
        (0u8..24).prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Against a reference map of the last value put per key: a get returns exactly
    /// that value or a miss (never stale or foreign bytes), and no tier ever exceeds
    /// its budget.
    #[test]
    fn engine_matches_reference_model(ops in proptest::collection::vec(op(), 1..120)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        rt.block_on(async {
            let (engine, top, bottom) = two_level(300, 900);
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
                    Op::Get(k) => {
                        let got = engine.get(&CacheKey::kv("m", vec![k]), &ctx()).await.expect("get");
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
