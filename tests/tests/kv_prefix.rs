//! KV service end to end: prefix matching over key chains derived with the v1 key
//! derivation, batch exists, load estimates, and prefetch from disk into memory.

mod kv_common;

use std::sync::Arc;

use kv_common::{block, TestServer};
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::CacheEngine;
use strata_kvcache::client::BlockTier;
use strata_kvcache::keys::chain_hashes_v1;
use strata_kvcache::server::ServerConfig;
use strata_kvcache::KvClient;

const NS: &str = "qwen2-7b/tenant-x";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn match_prefix_stops_at_the_first_miss() {
    let server =
        TestServer::start(kv_common::memory_engine(64 << 20), ServerConfig::default()).await;
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    let tokens: Vec<u32> = (0..16 * 10).map(|i| i * 31 % 50_000).collect();
    let chain = chain_hashes_v1(&tokens, 16, b"", false);
    assert_eq!(chain.len(), 10);
    assert_eq!(
        c.match_prefix(NS, &chain)
            .await
            .expect("match on empty cache"),
        0
    );
    for (i, h) in chain.iter().enumerate() {
        if i < 6 || i == 7 {
            c.put(NS, h, block(32 << 10, i as u64)).await.expect("put");
        }
    }
    assert_eq!(
        c.match_prefix(NS, &chain).await.expect("match"),
        6,
        "block 6 is missing"
    );
    assert_eq!(
        c.batched_contains(NS, &chain)
            .await
            .expect("batched_contains"),
        6
    );
    assert_eq!(
        c.match_prefix(NS, &chain[..3])
            .await
            .expect("shorter chain"),
        3
    );
    let empty: &[Vec<u8>] = &[];
    assert_eq!(c.match_prefix(NS, empty).await.expect("empty chain"), 0);
    let exists = c.batch_exists(NS, &chain).await.expect("batch exists");
    let want: Vec<bool> = (0..10).map(|i| i < 6 || i == 7).collect();
    assert_eq!(exists, want);

    // A different extras (LoRA) chain shares nothing.
    let lora = chain_hashes_v1(&tokens, 16, b"lora:3", false);
    assert_eq!(c.match_prefix(NS, &lora).await.expect("lora match"), 0);

    let est = c.estimate_load(NS, &chain, 0).await.expect("estimate");
    assert_eq!(est.matched, 6);
    assert_eq!(est.blocks.len(), 10);
    assert_eq!(est.blocks[6], (BlockTier::None, 0.0));
    assert_eq!(est.blocks[7].0, BlockTier::Memory);
    assert!(est.blocks[0].1 > 0.0);
    let sum: f64 = est.blocks[..6].iter().map(|b| b.1).sum();
    assert!((est.total_us - sum).abs() < 1e-6);
    // Bigger blocks take longer to load.
    let big = c
        .estimate_load(NS, &chain, 64 << 20)
        .await
        .expect("estimate big");
    assert!(
        big.total_us > est.total_us * 10.0,
        "{} vs {}",
        big.total_us,
        est.total_us
    );
    // A block size no block can have is refused, not estimated.
    let e = c
        .estimate_load(NS, &chain, u64::MAX)
        .await
        .expect_err("over the largest block");
    assert!(e.to_string().contains("largest block"), "{e}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_stages_disk_blocks_into_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Memory holds 2 of the 6 blocks; the rest are demoted to (or written through to) disk.
    let memory = Arc::new(MemoryTier::new(2 << 20));
    let disk =
        Arc::new(DiskTier::open(dir.path(), 64 << 20, DiskOptions::default()).expect("disk tier"));
    let engine = CacheEngine::builder()
        .tier(memory)
        .tier(disk)
        .build()
        .expect("engine");
    let server = TestServer::start(engine, ServerConfig::default()).await;
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    let chain = chain_hashes_v1(&(0..6 * 256).collect::<Vec<u32>>(), 256, b"", false);
    for (i, h) in chain.iter().enumerate() {
        c.put(NS, h, block(1 << 20, i as u64)).await.expect("put");
    }
    assert_eq!(
        c.locate(NS, &chain[0]).await.expect("locate"),
        BlockTier::Disk
    );
    assert_eq!(
        c.locate(NS, &chain[5]).await.expect("locate"),
        BlockTier::Memory
    );
    let est = c.estimate_load(NS, &chain, 0).await.expect("estimate");
    assert_eq!(est.matched, 6);
    assert!(
        est.blocks[0].1 > est.blocks[5].1,
        "a disk block costs more than a memory one"
    );

    // Prefetch answers at once; the Get right after waits for the staging in flight.
    let out = c.prefetch(NS, &chain[..1]).await.expect("prefetch");
    assert_eq!((out.staged, out.already_fast, out.missing), (1, 0, 0));
    assert!(c.get(NS, &chain[0]).await.expect("get").expect("hit") == block(1 << 20, 0));
    assert_eq!(
        c.locate(NS, &chain[0])
            .await
            .expect("locate after prefetch"),
        BlockTier::Memory
    );
    let out = c
        .prefetch(NS, &[chain[0].to_vec(), b"absent".to_vec()])
        .await
        .expect("prefetch again");
    assert_eq!((out.staged, out.already_fast, out.missing), (0, 1, 1));
    let stats = server.service.stats();
    assert_eq!(stats.prefetch_issued, 1);
    assert_eq!(stats.prefetch_used, 1);
    server.stop().await;
}
