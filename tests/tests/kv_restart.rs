//! KV service end to end: blocks put through the service survive a restart of the
//! server and the engine when the cache has a disk tier.

mod kv_common;

use std::sync::Arc;

use kv_common::{block, get_hit, hash, TestServer};
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::CacheEngine;
use strata_kvcache::client::BlockTier;
use strata_kvcache::server::ServerConfig;
use strata_kvcache::KvClient;

const NS: &str = "model/tenant";

fn engine(dir: &std::path::Path) -> CacheEngine {
    let disk =
        Arc::new(DiskTier::open(dir, 256 << 20, DiskOptions::default()).expect("disk tier opens"));
    CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(64 << 20)))
        .tier(disk)
        .build()
        .expect("engine")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_survive_a_restart_with_a_disk_tier() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sizes = [1 << 10, 300 << 10, 4 << 20];
    {
        let server = TestServer::start(engine(dir.path()), ServerConfig::default()).await;
        let mut c = KvClient::connect(&server.addr).await.expect("connect");
        for (i, &s) in sizes.iter().enumerate() {
            c.put(NS, &hash(i as u64), block(s, i as u64))
                .await
                .expect("put");
        }
        drop(c);
        server.stop().await;
        // The server owned the last engine clone: dropping it closes the disk tier.
    }
    let server = TestServer::start(engine(dir.path()), ServerConfig::default()).await;
    let mut c = KvClient::connect(&server.addr)
        .await
        .expect("connect after restart");
    let chain: Vec<Vec<u8>> = (0..sizes.len() as u64).map(hash).collect();
    assert_eq!(
        c.match_prefix(NS, &chain).await.expect("match"),
        sizes.len()
    );
    for (i, &s) in sizes.iter().enumerate() {
        assert_eq!(
            c.locate(NS, &hash(i as u64)).await.expect("locate"),
            BlockTier::Disk,
            "memory started empty"
        );
        let got = get_hit(&mut c, NS, &hash(i as u64), "block survived").await;
        assert!(got == block(s, i as u64), "block {i} intact after restart");
    }
    server.stop().await;
}
