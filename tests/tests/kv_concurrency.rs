//! KV service end to end: many clients at once, each on its own connection, putting
//! distinct and shared keys and reading each other's blocks.

mod kv_common;

use kv_common::{block, memory_engine, TestServer};
use strata_kvcache::server::ServerConfig;
use strata_kvcache::KvClient;

const NS: &str = "m/t";
const CLIENTS: u64 = 16;
const PER_CLIENT: u64 = 12;

fn key(client: u64, i: u64) -> Vec<u8> {
    format!("c{client}-b{i}").into_bytes()
}

fn size(client: u64, i: u64) -> usize {
    // 1 KiB .. ~700 KiB, varied so that chunked and single-message blocks interleave.
    1024 + ((client * 7919 + i * 104_729) % (700 << 10)) as usize
}

/// Runs `client` for each of the `CLIENTS` clients at once, each on its own
/// connection to `addr`, and waits for them all (`what` names a task that failed).
async fn every_client<F, Fut>(addr: &str, what: &str, client: F)
where
    F: Fn(u64, KvClient) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut tasks = Vec::new();
    for cl in 0..CLIENTS {
        let c = KvClient::connect(addr).await.expect("connect");
        tasks.push(tokio::spawn(client(cl, c)));
    }
    for t in tasks {
        t.await.expect(what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_put_and_read_each_others_blocks() {
    let server = TestServer::start(memory_engine(1 << 30), ServerConfig::default()).await;
    let shared = block(2 << 20, 777);
    every_client(&server.addr, "writer task", |cl, mut c| {
        let shared = shared.clone();
        async move {
            for i in 0..PER_CLIENT {
                c.put(NS, &key(cl, i), block(size(cl, i), cl * 1000 + i))
                    .await
                    .expect("put");
            }
            // Every client puts the same shared key: idempotent, no error.
            c.put(NS, b"shared", shared.clone())
                .await
                .expect("shared put");
        }
    })
    .await;
    every_client(&server.addr, "reader task", |cl, mut c| {
        let shared = shared.clone();
        async move {
            let other = (cl + 1) % CLIENTS;
            for i in 0..PER_CLIENT {
                let got = c.get(NS, &key(other, i)).await.expect("get").expect("hit");
                assert!(
                    got == block(size(other, i), other * 1000 + i),
                    "client {cl} reads {other}/{i} intact"
                );
            }
            let keys: Vec<Vec<u8>> = (0..PER_CLIENT).map(|i| key(cl, i)).collect();
            assert_eq!(
                c.match_prefix(NS, &keys).await.expect("match"),
                PER_CLIENT as usize
            );
            assert!(
                c.get(NS, b"shared")
                    .await
                    .expect("get shared")
                    .expect("hit")
                    == shared
            );
        }
    })
    .await;
    let stats = server.service.stats();
    assert_eq!(stats.puts, CLIENTS * (PER_CLIENT + 1));
    // Puts of the shared key racing each other: one stores it, the others find it.
    let stored = stats.puts - stats.puts_already_present;
    assert_eq!(stored, CLIENTS * PER_CLIENT + 1, "{stats:?}");
    assert_eq!(stats.hits, CLIENTS * (PER_CLIENT + 1));
    assert_eq!(stats.misses, 0);
    server.stop().await;
}

/// Clients racing to put one key with different bytes (a hostile or buggy client: keys
/// are meant to name their content): exactly one Put stores it, every other answers
/// `already_present`, and every Get returns the stored one's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_puts_of_one_key_store_one_value() {
    let server = TestServer::start(memory_engine(1 << 30), ServerConfig::default()).await;
    const KEYS: u64 = 24;
    let mut tasks = Vec::new();
    for cl in 0..CLIENTS {
        let mut c = KvClient::connect(&server.addr).await.expect("connect");
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for k in 0..KEYS {
                let value = block(64 << 10, cl * 1000 + k);
                let present = c.put(NS, &key(99, k), value).await.expect("put");
                if !present {
                    mine.push(k);
                }
            }
            (cl, mine)
        }));
    }
    let mut winner = vec![None; KEYS as usize];
    for t in tasks {
        let (cl, mine) = t.await.expect("client");
        for k in mine {
            assert!(winner[k as usize].is_none(), "key {k} stored twice");
            winner[k as usize] = Some(cl);
        }
    }
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    for (k, w) in winner.iter().enumerate() {
        let cl = w.unwrap_or_else(|| panic!("key {k} stored by nobody"));
        let got = c
            .get(NS, &key(99, k as u64))
            .await
            .expect("get")
            .expect("hit");
        assert!(
            got == block(64 << 10, cl * 1000 + k as u64),
            "key {k}: the stored value"
        );
    }
    server.stop().await;
}

/// Crash finding: a Put whose client gave up (its deadline passed while the block was
/// being stored) kept storing and landed after the client's acknowledged Remove, or
/// over a newer Put the service had answered "stored". A store now finishes before a
/// Remove or another Put of its key looks at it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_its_client_gave_up_on_never_lands_over_later_calls() {
    use std::sync::Arc;
    use std::time::Duration;
    use strata_cache_core::conformance::TestTier;
    use strata_cache_core::tiers::MemoryTier;
    use strata_cache_core::CacheEngine;
    let slow = TestTier::slow_puts(MemoryTier::new(64 << 20), Duration::from_millis(300));
    let engine = CacheEngine::builder()
        .tier(Arc::new(slow))
        .build()
        .expect("engine");
    let server = TestServer::start(engine, ServerConfig::default()).await;
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    let size = 64 << 10;
    // Cut off mid-store, then removed: stays removed.
    let cut = tokio::time::timeout(
        Duration::from_millis(100),
        c.put(NS, b"gave-up-1", block(size, 1)),
    )
    .await;
    assert!(cut.is_err(), "the put was cut off while storing");
    c.remove(NS, &[b"gave-up-1".to_vec()])
        .await
        .expect("remove");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        c.get(NS, b"gave-up-1").await.expect("get").is_none(),
        "an acknowledged remove is not undone by the put given up on"
    );
    // Cut off mid-store, then a newer put of other bytes: the answer tells which won.
    let cut = tokio::time::timeout(
        Duration::from_millis(100),
        c.put(NS, b"gave-up-2", block(size, 2)),
    )
    .await;
    assert!(cut.is_err(), "the put was cut off while storing");
    let already = c
        .put(NS, b"gave-up-2", block(size, 3))
        .await
        .expect("newer put");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let want = if already {
        block(size, 2)
    } else {
        block(size, 3)
    };
    let got = c.get(NS, b"gave-up-2").await.expect("get");
    assert!(
        got.as_ref() == Some(&want),
        "the value is the one the newer put's answer names (already present: {already})"
    );
    server.stop().await;
}

/// Crash finding, the other half: a client that gave up on a Put while its bytes were
/// still on the way, and then removed the key, saw the Put land after the Remove: the
/// service received the rest and stored it. A Put that a Remove of its key overlapped
/// now takes effect before the Remove: it stores nothing, and says so with ABORTED
/// (black-box finding: it was acknowledged, so 52-86 of 300 racing Puts ended
/// acknowledged, their Remove answering 0 removed, and the block gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remove_during_a_put_stream_is_not_undone_by_its_end() {
    use strata_kvcache::pb;
    let server = TestServer::start(memory_engine(64 << 20), ServerConfig::default()).await;
    let size = 256 << 10;
    let value = block(size, 9);
    let msg = |data: bytes::Bytes, first: bool| pb::PutRequest {
        namespace: if first { NS.to_string() } else { String::new() },
        hash: if first {
            bytes::Bytes::from_static(b"overlapped")
        } else {
            bytes::Bytes::new()
        },
        size: if first { size as u64 } else { 0 },
        data,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut raw = pb::kv_cache_client::KvCacheClient::connect(format!("http://{}", server.addr))
        .await
        .expect("connect");
    let put = tokio::spawn(async move {
        raw.put(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map(|r| r.into_inner())
    });
    tx.send(msg(value.slice(..size / 2), true))
        .await
        .expect("first half");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    c.remove(NS, &[b"overlapped".to_vec()])
        .await
        .expect("remove");
    tx.send(msg(value.slice(size / 2..), false))
        .await
        .expect("second half");
    drop(tx);
    let status = put
        .await
        .expect("join")
        .expect_err("the put is refused, not acknowledged");
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert!(status.message().contains("Remove"), "{status:?}");
    assert!(
        c.get(NS, b"overlapped").await.expect("get").is_none(),
        "the acknowledged remove stays"
    );
    // A Put after the Remove stores as usual.
    assert!(!c.put(NS, b"overlapped", value.clone()).await.expect("put"));
    let got = c.get(NS, b"overlapped").await.expect("get");
    assert!(got.as_ref() == Some(&value), "stored");
    server.stop().await;
}
