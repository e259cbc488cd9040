//! BatchLease end to end: a same-host client attached to the arena leases a batch of
//! blocks in one call and reads each in place, byte-exact; misses stay misses, blocks
//! past the session's share come as bytes, and every lease goes back when its block
//! drops. A call without a live session is refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::CacheEngine;
use strata_kvcache::client::KvClient;
use strata_kvcache::pb;
use strata_kvcache::server::{KvService, ServerConfig};

const NS: &str = "llama/batch-lease";

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(167) ^ seed ^ (i >> 11) as u8)
        .collect()
}

mod local_daemon;
use local_daemon::{serve_locally, LocalDaemon};

/// A KV service over a memory tier with a 16 MiB arena (4 MiB per session), on a Unix
/// socket with its side socket.
fn daemon() -> LocalDaemon {
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(64 << 20)))
        .build()
        .expect("engine");
    serve_locally(KvService::new(
        engine,
        ServerConfig {
            shm_bytes: 16 << 20,
            ..Default::default()
        },
    ))
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_batch_is_leased_in_one_call_and_read_in_place() {
    let d = daemon();
    let mut c = KvClient::connect(&d.addr).await.expect("connect");
    let blocks: Vec<Vec<u8>> = (0..6u8).map(|i| pattern(300_000 + i as usize, i)).collect();
    for (i, v) in blocks.iter().enumerate() {
        c.put(NS, &[b'k', i as u8], Bytes::from(v.clone()))
            .await
            .expect("put");
    }
    c.attach_shm(&d.side).await.expect("attach");
    let arena = d.service.shm_arena().expect("arena");
    let keys: [&[u8]; 4] = [b"k\x01", b"absent", b"k\x04", b"k\x01"];
    let got = c.get_blocks(NS, &keys).await.expect("get_blocks");
    assert_eq!(
        got.iter().map(Option::is_some).collect::<Vec<_>>(),
        [true, false, true, true],
        "a miss stays a miss, in its place"
    );
    for (k, b) in keys.iter().zip(&got) {
        if let Some(b) = b {
            assert!(b.is_shared(), "read in place in the arena");
            assert_eq!(&b[..], &blocks[k[1] as usize][..]);
        }
    }
    let st = arena.stats();
    assert_eq!(st.leases, 3);
    assert_eq!(
        st.copies, 2,
        "the repeated block is copied into the arena once"
    );
    assert!(st.leased_bytes > 0);
    drop(got);
    wait_until("the leases' release", || arena.stats().leased_bytes == 0).await;
}

#[tokio::test]
async fn blocks_past_the_sessions_share_come_as_bytes() {
    let d = daemon();
    let mut c = KvClient::connect(&d.addr).await.expect("connect");
    // 1.5 MiB each: two fit in the session's 4 MiB share, the others do not.
    let blocks: Vec<Vec<u8>> = (0..4u8).map(|i| pattern(3 << 19, 40 + i)).collect();
    let keys: Vec<Vec<u8>> = (0..4u8).map(|i| vec![b'b', i]).collect();
    for (k, v) in keys.iter().zip(&blocks) {
        c.put(NS, k, Bytes::from(v.clone())).await.expect("put");
    }
    c.attach_shm(&d.side).await.expect("attach");
    let got = c.get_blocks(NS, &keys).await.expect("get_blocks");
    let shared = got.iter().flatten().filter(|b| b.is_shared()).count();
    assert_eq!(shared, 2);
    for (b, v) in got.iter().zip(&blocks) {
        assert_eq!(
            &b.as_ref().expect("hit")[..],
            &v[..],
            "every block byte-exact"
        );
    }
}

#[tokio::test]
async fn batch_lease_without_a_live_session_is_refused() {
    let d = daemon();
    let mut c = KvClient::connect(&d.addr).await.expect("connect");
    c.put(NS, b"x", Bytes::from(pattern(4000, 1)))
        .await
        .expect("put");
    let req = || pb::BatchGetRequest {
        namespace: NS.into(),
        hashes: vec![Bytes::from_static(b"x")],
    };
    let e = c.raw().batch_lease(req()).await.expect_err("no session");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    // A session id no side connection opened (or one that has ended).
    let mut r = tonic::Request::new(req());
    r.metadata_mut().insert(
        strata_kvcache::shm::SHM_SESSION_METADATA,
        "0123456789abcdef0123456789abcdef".parse().expect("ascii"),
    );
    let e = c.raw().batch_lease(r).await.expect_err("unknown session");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    // Not attached, get_blocks is a BatchGet: the same bytes, inline.
    let got = c.get_blocks(NS, &[b"x"]).await.expect("get_blocks");
    let b = got[0].as_ref().expect("hit");
    assert!(!b.is_shared());
    assert_eq!(&b[..], &pattern(4000, 1)[..]);
}

/// Values are immutable only while the cache holds them: a key evicted and put again
/// with other bytes is read as the new bytes through the arena, never as the copy the
/// arena kept of the old ones after their leases ended.
#[tokio::test]
async fn a_key_evicted_and_put_again_is_read_fresh_through_the_arena() {
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(2 << 20)))
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
    let arena = d.service.shm_arena().expect("arena");
    let old = pattern(500_000, 1);
    c.put(NS, b"k", Bytes::from(old.clone()))
        .await
        .expect("put");
    c.attach_shm(&d.side).await.expect("attach");
    let got = c.get_blocks(NS, &[b"k"]).await.expect("get_blocks");
    let block = got[0].as_ref().expect("hit");
    assert!(block.is_shared());
    assert_eq!(&block[..], &old[..]);
    drop(got);
    wait_until("the lease's release", || arena.stats().leased_bytes == 0).await;
    for i in 0..8u8 {
        c.put(NS, &[b'f', i], Bytes::from(pattern(500_000, 10 + i)))
            .await
            .expect("put");
    }
    assert!(
        c.get(NS, b"k").await.expect("get").is_none(),
        "evicted by the others"
    );
    let new = pattern(500_000, 2);
    c.put(NS, b"k", Bytes::from(new.clone()))
        .await
        .expect("put");
    for _ in 0..2 {
        let got = c.get_blocks(NS, &[b"k"]).await.expect("get_blocks");
        let block = got[0].as_ref().expect("hit");
        assert!(block.is_shared());
        assert_eq!(
            &block[..],
            &new[..],
            "the new bytes, not the arena's old copy"
        );
    }
}

/// A daemon that no longer holds the client's session (it restarted) answers BatchLease
/// FAILED_PRECONDITION; the client attaches again at the same side socket and reads in
/// place, instead of failing every Get from then on (black-box finding, Python client).
#[tokio::test]
async fn a_client_attaches_again_when_its_session_has_ended() {
    let d = daemon();
    let mut c = KvClient::connect(&d.addr).await.expect("connect");
    let v = pattern(200_000, 7);
    c.put(NS, b"s", Bytes::from(v.clone())).await.expect("put");
    c.attach_shm(&d.side).await.expect("attach");
    let arena = d.service.shm_arena().expect("arena");
    let got = c.get_blocks(NS, &[b"s"]).await.expect("get_blocks");
    let old_session = match got[0].as_ref().expect("hit") {
        strata_kvcache::client::Block::Shared { shm, .. } => shm.session(),
        _ => panic!("leased in place"),
    };
    drop(got);
    arena.close_session(old_session);
    assert!(!arena.has_session(old_session));
    let got = c.get_blocks(NS, &[b"s"]).await.expect("attached again");
    let block = got[0].as_ref().expect("hit");
    assert!(block.is_shared(), "in place in the arena again");
    assert_eq!(&block[..], &v[..]);
    assert_eq!(arena.stats().sessions, 1);
}

/// Black-box finding: the leases of a leasing call whose caller gave up (a timeout
/// dropped the call's future) were never released: the client never learnt their ids,
/// and the session's share of the arena stayed leased until it closed. The client now
/// gives the call up by its number, and the daemon releases what answered it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_calls_dropped_by_their_callers_are_given_back() {
    let d = daemon();
    let mut c = KvClient::connect(&d.addr).await.expect("connect");
    let blocks: Vec<Vec<u8>> = (0..8u8).map(|i| pattern(200_000, i)).collect();
    for (i, v) in blocks.iter().enumerate() {
        c.put(NS, &[b'd', i as u8], Bytes::from(v.clone()))
            .await
            .expect("put");
    }
    c.attach_shm(&d.side).await.expect("attach");
    let arena = d.service.shm_arena().expect("arena");
    let keys: Vec<[u8; 2]> = (0..8u8).map(|i| [b'd', i]).collect();
    let mut cut = 0;
    for i in 0..60u64 {
        // Cut at varying points: before the request leaves, while it is served, after.
        let bound = Duration::from_micros(50 + 40 * i);
        if i % 2 == 0 {
            if tokio::time::timeout(bound, c.get_blocks(NS, &keys))
                .await
                .is_err()
            {
                cut += 1;
            }
        } else if tokio::time::timeout(bound, c.get_block(NS, &keys[0]))
            .await
            .is_err()
        {
            cut += 1;
        }
    }
    assert!(cut > 0, "some calls were cut off");
    wait_until("every lease given back", || arena.stats().leased_bytes == 0).await;
    // And the session still leases.
    let got = c.get_blocks(NS, &keys).await.expect("get_blocks");
    assert!(got
        .iter()
        .all(|b| b.as_ref().is_some_and(|b| b.is_shared())));
}
