//! KV service end to end: small and hostile inputs cost little (issue 12, finding 5).
//! Blocks below the minimum size are refused with a clear INVALID_ARGUMENT that names
//! the limit; junk namespaces cannot grow the per-namespace stats without bound.

mod kv_common;

use kv_common::{block, memory_engine, TestServer};
use strata_kvcache::server::ServerConfig;
use strata_kvcache::stats::{MAX_TRACKED_NAMESPACES, OTHER_NS};
use strata_kvcache::KvClient;
use tonic::Code;

const NS: &str = "m/t";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_below_the_minimum_are_refused_with_the_limit_in_the_message() {
    let server = TestServer::start(memory_engine(64 << 20), ServerConfig::default()).await;
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    for size in [1usize, 100, 1023] {
        let e = c
            .put(NS, format!("tiny-{size}").as_bytes(), block(size, 1))
            .await
            .expect_err("a block below 1 KiB is refused");
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        assert!(
            e.to_string().contains(&format!("block of {size} bytes"))
                && e.to_string().contains("minimum of 1024 bytes"),
            "the message names the size and the limit: {e}"
        );
        assert!(!c
            .exists(NS, format!("tiny-{size}").as_bytes())
            .await
            .expect("exists"));
    }
    // The minimum itself is accepted.
    c.put(NS, b"min", block(1024, 2)).await.expect("1 KiB put");
    assert_eq!(
        server.service.engine().stats().fills,
        1,
        "only the 1 KiB block stored"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_namespaces_fold_into_one_bucket() {
    let server = TestServer::start(memory_engine(64 << 20), ServerConfig::default()).await;
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    // Reads of 2,000 invented namespaces make no entries.
    for i in 0..2000 {
        let ns = format!("junk-read-{i}");
        assert!(c.get(&ns, b"k").await.expect("get").is_none());
    }
    let s = server.service.stats();
    assert!(s.namespaces.len() <= 1, "{:?}", s.namespaces.len());
    // Puts into more namespaces than the cap: the rest fold into (other).
    let n = MAX_TRACKED_NAMESPACES + 50;
    for i in 0..n {
        c.put(&format!("junk-put-{i}"), b"k", block(1024, i as u64))
            .await
            .expect("put");
    }
    let s = server.service.stats();
    assert_eq!(s.namespaces.len(), MAX_TRACKED_NAMESPACES + 1);
    let other = s.namespace(OTHER_NS).expect("other bucket");
    assert_eq!(other.puts, 50);
    assert_eq!(other.misses, 2000);
    server.stop().await;
}
