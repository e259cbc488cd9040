//! The load model `EstimateLoad` answers from is timed on the Gets it serves: a tier
//! whose reads are slow must be rated slow.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_cache_core::conformance::TestTier;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::CacheEngine;
use strata_kvcache::client::KvClient;
use strata_kvcache::server::{KvService, ServerConfig};

mod local_daemon;
use local_daemon::serve_locally;

/// Black-box finding (round 18): the Get's timing began after its block was read, so a
/// disk tier was rated 464-644 Gb/s (its disk reads 1.4-2.8 Gb/s) and `EstimateLoad`
/// answered 32 ms for 200 blocks that took a second to get. A tier answering every
/// read after 20 ms (1 MiB blocks: ~0.4 Gb/s) must be rated near that.
#[tokio::test]
async fn a_slow_tier_is_rated_slow() {
    let engine = CacheEngine::builder()
        .tier(Arc::new(TestTier::slow_gets(
            MemoryTier::new(64 << 20),
            Duration::from_millis(20),
        )))
        .build()
        .expect("engine");
    let d = serve_locally(KvService::new(
        engine,
        ServerConfig {
            shm_bytes: 16 << 20,
            ..Default::default()
        },
    ));
    let mut c = KvClient::connect(&d.addr).await.expect("connect");
    c.put("ns", b"k", Bytes::from(vec![7u8; 1 << 20]))
        .await
        .expect("put");
    for i in 0..40 {
        if i == 20 {
            // Leased in place from the arena from here: timed the same way.
            c.attach_shm(&d.side).await.expect("attach");
        }
        assert_eq!(
            c.get("ns", b"k").await.expect("get").map(|b| b.len()),
            Some(1 << 20)
        );
    }
    let model = d.service.stats().load_model;
    let memory = model
        .iter()
        .find(|t| t.tier == "memory")
        .expect("the memory tier's figures");
    assert!(
        memory.bandwidth_gbps < 4.0,
        "rated {} Gb/s for ~0.4 Gb/s reads",
        memory.bandwidth_gbps
    );
}
