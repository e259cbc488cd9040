//! KV service end to end: every kind of bad input gets a clear gRPC status and harms
//! nothing (the server keeps serving, nothing partial is stored).

mod kv_common;

use bytes::Bytes;
use kv_common::{block, memory_engine, TestServer};
use strata_kvcache::pb;
use strata_kvcache::server::ServerConfig;
use strata_kvcache::KvClient;
use tonic::Code;

const NS: &str = "m/t";

fn put_msgs(ns: &str, hash: &[u8], size: u64, chunks: &[Bytes]) -> Vec<pb::PutRequest> {
    chunks
        .iter()
        .enumerate()
        .map(|(i, d)| pb::PutRequest {
            namespace: if i == 0 { ns.into() } else { String::new() },
            hash: if i == 0 {
                Bytes::copy_from_slice(hash)
            } else {
                Bytes::new()
            },
            size: if i == 0 { size } else { 0 },
            data: d.clone(),
        })
        .collect()
}

async fn raw_put(
    c: &mut KvClient,
    msgs: Vec<pb::PutRequest>,
) -> Result<pb::PutResponse, tonic::Status> {
    c.raw()
        .put(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner())
}

/// Sends a raw put stream the server must refuse as invalid (`what` names it); the status.
async fn invalid_put(c: &mut KvClient, msgs: Vec<pb::PutRequest>, what: &str) -> tonic::Status {
    let e = raw_put(c, msgs).await.expect_err(what);
    assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
    e
}

fn assert_says(e: &tonic::Status, text: &str) {
    assert!(e.message().contains(text), "{}", e.message());
}

/// A test server on a memory cache of `cache_bytes`, and a client of it.
async fn start(cache_bytes: u64, cfg: ServerConfig) -> (TestServer, KvClient) {
    let server = TestServer::start(memory_engine(cache_bytes), cfg).await;
    let c = KvClient::connect(&server.addr).await.expect("connect");
    (server, c)
}

/// Checks that the server still stores and serves after what the test sent, then
/// stops it.
async fn stop_alive(server: TestServer, mut c: KvClient) {
    c.put(NS, b"alive", block(2048, 5))
        .await
        .expect("server still stores");
    assert!(c.get(NS, b"alive").await.expect("get").expect("hit") == block(2048, 5));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_namespace_is_not_found_when_namespaces_are_registered() {
    let cfg = ServerConfig {
        namespaces: vec![NS.into()],
        ..Default::default()
    };
    let (server, mut c) = start(16 << 20, cfg).await;
    let e = c
        .put("other/tenant", b"k", block(1024, 1))
        .await
        .expect_err("put to unknown ns");
    assert_eq!(e.code(), Code::NotFound);
    assert!(
        e.to_string().contains("unknown namespace \"other/tenant\""),
        "{e}"
    );
    let e = c
        .get("other/tenant", b"k")
        .await
        .expect_err("get from unknown ns is not a miss");
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(
        c.exists("other/tenant", b"k")
            .await
            .expect_err("exists")
            .code(),
        Code::NotFound
    );
    let chain = [b"a".to_vec()];
    assert_eq!(
        c.match_prefix("other/tenant", &chain)
            .await
            .expect_err("match")
            .code(),
        Code::NotFound
    );
    stop_alive(server, c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_mode_creates_namespaces_on_first_put() {
    let (server, mut c) = start(16 << 20, ServerConfig::default()).await;
    assert!(!c
        .exists("fresh/ns", b"k")
        .await
        .expect("read of an unseen namespace is a miss"));
    assert!(c.get("fresh/ns", b"k").await.expect("get").is_none());
    c.put("fresh/ns", b"k", block(1024, 2))
        .await
        .expect("first put creates the namespace");
    assert!(c.exists("fresh/ns", b"k").await.expect("exists"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_blocks_are_refused_before_transfer() {
    let cfg = ServerConfig {
        max_block: 1 << 20,
        ..Default::default()
    };
    let (server, mut c) = start(64 << 20, cfg).await;
    let e = c
        .put(NS, b"big", block((1 << 20) + 1, 1))
        .await
        .expect_err("over the limit");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.to_string()
            .contains("exceeds the server's limit of 1048576"),
        "{e}"
    );
    assert!(!c.exists(NS, b"big").await.expect("exists"));
    c.put(NS, b"max", block(1 << 20, 1))
        .await
        .expect("exactly the limit is fine");
    // One gRPC message over the message limit (a client that does not chunk).
    let msgs = put_msgs(NS, b"fat", 1 << 20, &[block(5 << 20, 3)]);
    let e = raw_put(&mut c, msgs).await.expect_err("a 5 MiB message");
    assert_ne!(e.code(), Code::Ok);
    assert!(!c.exists(NS, b"fat").await.expect("exists"));
    stop_alive(server, c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_and_overlong_streams_store_nothing() {
    let (server, mut c) = start(64 << 20, ServerConfig::default()).await;
    let data = block(3 << 20, 9);
    // 2 MiB in two 1 MiB messages.
    let two_mib = [data.slice(..1 << 20), data.slice(1 << 20..2 << 20)];
    // Declares 3 MiB, sends 2 MiB, then ends the stream.
    let msgs = put_msgs(NS, b"trunc", 3 << 20, &two_mib);
    let e = invalid_put(&mut c, msgs, "truncated").await;
    assert_says(&e, "ended after 2097152 of 3145728");
    assert!(
        !c.exists(NS, b"trunc").await.expect("exists"),
        "nothing partial stored"
    );
    // Declares 1 MiB, sends 2 MiB.
    let msgs = put_msgs(NS, b"long", 1 << 20, &two_mib);
    let e = invalid_put(&mut c, msgs, "overlong").await;
    assert_says(&e, "more than the declared");
    // Header alone, no bytes.
    let msgs = put_msgs(NS, b"hdr", 4096, &[Bytes::new()]);
    invalid_put(&mut c, msgs, "no data").await;
    // No message at all.
    let e = invalid_put(&mut c, Vec::new(), "empty stream").await;
    assert_says(&e, "empty put stream");
    assert!(
        !c.exists(NS, b"long").await.expect("exists")
            && !c.exists(NS, b"hdr").await.expect("exists")
    );
    // A later message labelled for another key (or namespace): refused, not appended
    // to this key's value (black-box finding: key "c" stored A+B, B sent for "d").
    for (ns, hash) in [(NS, &b"other"[..]), ("m/elsewhere", &b"renamed"[..])] {
        let mut msgs = put_msgs(NS, b"renamed", 2 << 20, &two_mib);
        msgs[1].namespace = ns.into();
        msgs[1].hash = Bytes::copy_from_slice(hash);
        let e = invalid_put(&mut c, msgs, "renamed midway").await;
        assert_says(&e, "names another key");
    }
    // Repeating the stream's own key is fine.
    let mut msgs = put_msgs(NS, b"repeated", 2 << 20, &two_mib);
    msgs[1].namespace = NS.into();
    msgs[1].hash = Bytes::from_static(b"repeated");
    raw_put(&mut c, msgs).await.expect("the same key repeated");
    assert!(!c.exists(NS, b"renamed").await.expect("exists"));
    stop_alive(server, c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_invalid_argument() {
    let (server, mut c) = start(16 << 20, ServerConfig::default()).await;
    let long = [7u8; 65];
    let cases: Vec<(&str, Result<(), strata_kvcache::KvError>)> = vec![
        (
            "empty hash put",
            c.put(NS, b"", block(1024, 1)).await.map(|_| ()),
        ),
        (
            "65-byte hash put",
            c.put(NS, &long, block(1024, 1)).await.map(|_| ()),
        ),
        (
            "empty namespace put",
            c.put("", b"k", block(1024, 1)).await.map(|_| ()),
        ),
        (
            "control char namespace",
            c.put("a\nb", b"k", block(1024, 1)).await.map(|_| ()),
        ),
        ("empty hash get", c.get(NS, b"").await.map(|_| ())),
        ("65-byte hash exists", c.exists(NS, &long).await.map(|_| ())),
        (
            "empty hash in chain",
            c.match_prefix(NS, &[b"a".to_vec(), Vec::new()])
                .await
                .map(|_| ()),
        ),
        (
            "long namespace",
            c.batch_exists(&"n".repeat(129), &[b"a".to_vec()])
                .await
                .map(|_| ()),
        ),
    ];
    for (what, r) in cases {
        let e = r.expect_err(what);
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e}");
    }
    let msgs = put_msgs(NS, b"zero", 0, &[Bytes::new()]);
    invalid_put(&mut c, msgs, "zero size").await;
    assert!(server.service.stats().rejected >= 9);
    stop_alive(server, c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cache_evicts_or_refuses_and_never_crashes() {
    // 4 MiB of memory, the only tier.
    let (server, mut c) = start(4 << 20, ServerConfig::default()).await;
    let e = c
        .put(NS, b"huge", block(8 << 20, 1))
        .await
        .expect_err("larger than every tier");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    // Twenty 1 MiB blocks into 4 MiB: older ones are evicted, every put succeeds.
    for i in 0..20u64 {
        c.put(NS, &i.to_be_bytes(), block(1 << 20, i))
            .await
            .expect("put evicts to make room");
    }
    let chain: Vec<Vec<u8>> = (0..20u64).map(|i| i.to_be_bytes().to_vec()).collect();
    let present = c.batch_exists(NS, &chain).await.expect("batch exists");
    let n = present.iter().filter(|p| **p).count();
    assert!((1..=4).contains(&n), "at most 4 MiB cached, got {n} blocks");
    assert!(present[19], "the newest block is cached");
    let tiers = server.service.engine().stats().tiers;
    assert!(tiers[0].used_bytes <= tiers[0].capacity_bytes);
    assert!(tiers[0].evictions >= 16);
    stop_alive(server, c).await;
}
