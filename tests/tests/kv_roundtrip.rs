//! KV service end to end: put/get round trips of 1 KiB..64 MiB over loopback TCP and a
//! Unix socket, idempotent re-puts, batch gets, remove, the bearer token.

mod kv_common;

use kv_common::{block, get_hit, hash, memory_engine, TestServer};
use strata_kvcache::client::{BlockTier, ClientOptions};
use strata_kvcache::server::ServerConfig;
use strata_kvcache::KvClient;

const NS: &str = "llama3-8b/tenant-a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_from_1kib_to_64mib() {
    let server = TestServer::start(memory_engine(512 << 20), ServerConfig::default()).await;
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    let sizes = [1 << 10, 64 << 10, (1 << 20) + 7, 16 << 20, 64 << 20];
    for (i, &size) in sizes.iter().enumerate() {
        let data = block(size, i as u64);
        assert!(
            !c.put(NS, &hash(i as u64), data.clone()).await.expect("put"),
            "first put stores"
        );
        let got = get_hit(&mut c, NS, &hash(i as u64), "block cached").await;
        assert_eq!(got.len(), size);
        assert!(got == data, "block of {size} bytes comes back intact");
        // Values are immutable: a repeated put is idempotent.
        assert!(
            c.put(NS, &hash(i as u64), data).await.expect("re-put"),
            "re-put reports already present"
        );
        assert!(c.exists(NS, &hash(i as u64)).await.expect("exists"));
        assert_eq!(
            c.locate(NS, &hash(i as u64)).await.expect("locate"),
            BlockTier::Memory
        );
    }
    let ping = c.ping().await.expect("ping");
    assert_eq!(ping.api, "v1");
    assert_eq!(ping.max_block_bytes, 64 << 20);

    // Batch get: hits in order, a miss in the middle.
    let keys = vec![hash(0), hash(999), hash(2), hash(1)];
    let got = c.batch_get(NS, &keys).await.expect("batch get");
    assert_eq!(got.len(), 4);
    assert!(got[0].as_ref().expect("hit 0") == &block(sizes[0], 0));
    assert!(got[1].is_none());
    assert!(got[2].as_ref().expect("hit 2") == &block(sizes[2], 2));
    assert!(got[3].as_ref().expect("hit 1") == &block(sizes[1], 1));

    // Namespaces keep tenants apart.
    assert!(c
        .get("llama3-8b/tenant-b", &hash(0))
        .await
        .expect("get other ns")
        .is_none());

    assert_eq!(
        c.remove(NS, &[hash(0), hash(999)]).await.expect("remove"),
        1
    );
    assert!(c.get(NS, &hash(0)).await.expect("get removed").is_none());
    assert!(!c.exists(NS, &hash(0)).await.expect("exists removed"));

    let stats = server.service.stats();
    assert_eq!(stats.puts, 10);
    assert_eq!(stats.puts_already_present, 5);
    assert!(stats.hits >= 8 && stats.misses >= 2, "{stats:?}");
    let ns = stats
        .namespaces
        .iter()
        .find(|n| n.namespace == NS)
        .expect("namespace counted");
    assert_eq!(ns.puts, 5);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_serves_the_same_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kv.sock");
    let server =
        TestServer::start_unix(memory_engine(64 << 20), ServerConfig::default(), &path).await;
    let mut c = KvClient::connect(&server.addr)
        .await
        .expect("connect over unix socket");
    let data = block(3 << 20, 42);
    c.put(NS, b"k", data.clone()).await.expect("put");
    assert!(get_hit(&mut c, NS, b"k", "hit").await == data);
    server.stop().await;
}

/// A client connected to `addr` presenting `token`.
async fn connect_with_token(addr: &str, token: &str) -> KvClient {
    let opts = ClientOptions {
        token: Some(token.into()),
        ..Default::default()
    };
    KvClient::connect_with(addr, opts).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_token_is_required() {
    let cfg = ServerConfig {
        token: Some("s3cret".into()),
        ..Default::default()
    };
    let server = TestServer::start(memory_engine(16 << 20), cfg).await;
    let mut anon = KvClient::connect(&server.addr).await.expect("connect");
    let err = anon
        .exists(NS, b"k")
        .await
        .expect_err("no token is refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let mut wrong = connect_with_token(&server.addr, "guess").await;
    assert_eq!(
        wrong.ping().await.expect_err("wrong token").code(),
        tonic::Code::Unauthenticated
    );
    let mut c = connect_with_token(&server.addr, "s3cret").await;
    c.put(NS, b"k", block(4096, 1))
        .await
        .expect("put with token");
    assert!(c.exists(NS, b"k").await.expect("exists with token"));
    server.stop().await;
}

/// Black-box finding (round 14): a memory-only daemon reported (and exported) load
/// model figures for GPU and disk tiers it does not have: the model's priors, shown as
/// measured. Only the cache's own tiers are reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_model_covers_only_the_caches_tiers() {
    let server = TestServer::start(memory_engine(64 << 20), ServerConfig::default()).await;
    let tiers: Vec<String> = server
        .service
        .stats()
        .load_model
        .into_iter()
        .map(|t| t.tier)
        .collect();
    assert_eq!(tiers, vec!["memory".to_string()]);
    server.stop().await;
}
