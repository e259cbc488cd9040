//! The GPU tier's device handles end to end, on the emulated device: a same-host
//! client attached to the side socket asks Get for a GPU-resident block and receives a
//! handle and a lease; it reads the block in place in the device memory it received
//! over the socket (byte-exact), the lease keeps the memory when the key is evicted,
//! and releasing it (or ending the session) gives the memory back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::CacheEngine;
use strata_gds::{Device, EmulatedDevice, GpuTier, TransferConfig, Transfers};
use strata_kvcache::client::{BlockTier, KvClient};
use strata_kvcache::server::{KvService, ServerConfig};

const NS: &str = "llama/device-test";

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(131) ^ seed ^ (i >> 9) as u8)
        .collect()
}

mod local_daemon;
use local_daemon::{serve_locally, LocalDaemon};

struct Daemon {
    dev: Arc<EmulatedDevice>,
    local: LocalDaemon,
}

impl std::ops::Deref for Daemon {
    type Target = LocalDaemon;
    fn deref(&self) -> &LocalDaemon {
        &self.local
    }
}

/// A KV service over an emulated GPU tier (8 MiB) above a memory tier, on a Unix socket
/// with its side socket.
async fn daemon(gpu_bytes: u64) -> Daemon {
    let dev = Arc::new(EmulatedDevice::new(gpu_bytes * 2));
    let transfers = Transfers::new(dev.clone(), TransferConfig::default()).expect("transfers");
    let gpu = Arc::new(GpuTier::new(transfers, gpu_bytes));
    let engine = CacheEngine::builder()
        .tier(gpu.clone())
        .tier(Arc::new(MemoryTier::new(64 << 20)))
        .build()
        .expect("engine");
    let service = KvService::new(
        engine,
        ServerConfig {
            shm_bytes: 16 << 20,
            ..Default::default()
        },
    );
    service.attach_gpu_tier(gpu);
    Daemon {
        dev,
        local: serve_locally(service),
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_gpu_resident_block_is_read_by_handle_and_its_lease_defers_eviction() {
    let d = daemon(8 << 20).await;
    let mut c = KvClient::connect(&d.addr).await.expect("connect");
    c.attach_shm(&d.side).await.expect("attach");
    let data = pattern(300_000, 7);
    c.put(NS, b"block-1", Bytes::from(data.clone()))
        .await
        .expect("put");
    assert!(matches!(
        c.locate(NS, b"block-1").await.expect("locate"),
        BlockTier::Gpu
    ));

    // Attached but not asking for handles: the arena, as before.
    let b = c
        .get_block(NS, b"block-1")
        .await
        .expect("get")
        .expect("hit");
    assert!(b.is_shared() && b.device_handle().is_none());
    assert_eq!(&b[..], &data[..]);
    drop(b);

    c.want_device_handles(true);
    let b = c
        .get_block(NS, b"block-1")
        .await
        .expect("get")
        .expect("hit");
    let h = b.device_handle().expect("served by handle").clone();
    assert_eq!(h.kind, strata_gds::DeviceKind::Emulated);
    assert_eq!((h.len, h.crc), (data.len() as u64, crc32c::crc32c(&data)));
    assert_eq!(
        &b[..],
        &data[..],
        "byte-exact, in place in the device memory"
    );
    let arena = d.service.shm_arena().expect("arena");
    assert_eq!(arena.stats().device_leases, 1);
    assert_eq!(arena.stats().device_leased_bytes, data.len() as u64);

    // Evicted while leased: gone from the cache, its device memory kept for the reader.
    let held = d.dev.allocated_bytes();
    assert_eq!(c.remove(NS, &[b"block-1"]).await.expect("remove"), 1);
    assert!(c.get(NS, b"block-1").await.expect("get").is_none());
    assert_eq!(d.dev.allocated_bytes(), held);
    // New blocks do not land on the leased range.
    for i in 0..6u8 {
        c.put(NS, &[b'n', i], Bytes::from(pattern(300_000, 100 + i)))
            .await
            .expect("put");
    }
    assert_eq!(
        &b[..],
        &data[..],
        "still byte-exact after eviction and new puts"
    );

    // Released (the Block drops): the device memory of the evicted block goes.
    let before = d.dev.allocated_bytes();
    drop(b);
    wait_until("the lease's release", || {
        d.dev.allocated_bytes() == before - data.len() as u64
    })
    .await;
    assert_eq!(arena.stats().device_leased_bytes, 0);
}

#[tokio::test]
async fn device_leases_are_capped_per_session() {
    // A 4 MiB tier: a session may hold 1 MiB of device leases at once.
    let d = daemon(4 << 20).await;
    let mut c = KvClient::connect(&d.addr).await.expect("connect");
    let blocks: Vec<Vec<u8>> = (0..4u8).map(|i| pattern(400_000, i)).collect();
    for (i, v) in blocks.iter().enumerate() {
        c.put(NS, &[b'k', i as u8], Bytes::from(v.clone()))
            .await
            .expect("put");
    }
    c.attach_shm(&d.side).await.expect("attach");
    c.want_device_handles(true);
    let mut held = Vec::new();
    for (i, v) in blocks.iter().enumerate() {
        let b = c
            .get_block(NS, &[b'k', i as u8])
            .await
            .expect("get")
            .expect("hit");
        assert_eq!(&b[..], &v[..]);
        held.push(b);
    }
    // Two fit in the session's quarter (800 KB of 1 MiB); the rest fell back to the arena.
    let by_handle = held.iter().filter(|b| b.device_handle().is_some()).count();
    assert_eq!(by_handle, 2);
    assert!(held
        .iter()
        .all(|b| b.device_handle().is_some() || b.is_shared()));
    let arena = d.service.shm_arena().expect("arena");
    assert_eq!(arena.stats().device_leased_bytes, 800_000);
    drop(held);
    wait_until("the releases", || arena.stats().device_leased_bytes == 0).await;
    // Released, the quarter is free again.
    let b = c.get_block(NS, b"k\x03").await.expect("get").expect("hit");
    assert!(b.device_handle().is_some());
    assert_eq!(&b[..], &blocks[3][..]);
}

/// Every way a same-host client reads a block records the access where the eviction
/// policy sees it: a block read only by device handle (no bytes through the engine),
/// or only as an arena lease, is hot.
#[tokio::test]
async fn a_block_read_only_by_handle_is_hot_for_eviction() {
    block_read_only_one_way_is_hot_for_eviction(true).await;
}

#[tokio::test]
async fn a_block_read_only_by_arena_lease_is_hot_for_eviction() {
    block_read_only_one_way_is_hot_for_eviction(false).await;
}

async fn block_read_only_one_way_is_hot_for_eviction(by_handle: bool) {
    // A 4 MiB GPU tier (LRU) holds four 900 KB blocks; a fifth evicts one to memory.
    let d = daemon(4 << 20).await;
    let mut c = KvClient::connect(&d.addr).await.expect("connect");
    let blocks: Vec<Vec<u8>> = (0..5u8).map(|i| pattern(900_000, 40 + i)).collect();
    for (i, v) in blocks.iter().take(4).enumerate() {
        c.put(NS, &[b'h', i as u8], Bytes::from(v.clone()))
            .await
            .expect("put");
    }
    for i in 0..4u8 {
        assert!(matches!(
            c.locate(NS, &[b'h', i]).await.expect("locate"),
            BlockTier::Gpu
        ));
    }
    // h0, the oldest put, is then read only by device handle or only in the arena (the
    // lease released each time); h1..h3 are never read.
    c.attach_shm(&d.side).await.expect("attach");
    c.want_device_handles(by_handle);
    let arena = d.service.shm_arena().expect("arena");
    let hits_before = d.service.stats().hits;
    for _ in 0..3 {
        let b = c.get_block(NS, b"h\x00").await.expect("get").expect("hit");
        assert_eq!(b.device_handle().is_some(), by_handle);
        assert!(b.is_shared() || by_handle, "served in the arena");
        assert_eq!(&b[..], &blocks[0][..]);
        drop(b);
        wait_until("the lease's release", || {
            arena.stats().device_leased_bytes == 0
        })
        .await;
    }
    // Counted as the namespace's hits, like any other read.
    assert_eq!(d.service.stats().hits, hits_before + 3);
    c.put(NS, b"h\x04", Bytes::from(blocks[4].clone()))
        .await
        .expect("put");
    // The block read by handle stays on the GPU; the least recently used unread one,
    // h1, is the one evicted (without the handle reads recorded, h0 would be).
    assert!(matches!(
        c.locate(NS, b"h\x00").await.expect("locate"),
        BlockTier::Gpu
    ));
    assert!(!matches!(
        c.locate(NS, b"h\x01").await.expect("locate"),
        BlockTier::Gpu
    ));
    for i in 2..5u8 {
        assert!(matches!(
            c.locate(NS, &[b'h', i]).await.expect("locate"),
            BlockTier::Gpu
        ));
    }
}
