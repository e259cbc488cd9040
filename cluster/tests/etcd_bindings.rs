//! The group's KV namespace bindings on a real etcd (`strata_cluster::bindings`): the
//! first identity to bind a namespace holds it for every member, a rewrite moves a
//! record to the writer's lease, a withdrawal removes only the identity it names, and a
//! dead etcd is answered at once after the first failure. Each test starts its own etcd
//! and bounds its own time.

use std::time::Duration;

use strata_cluster::testing::Etcd;
use strata_cluster::{ClusterError, GroupConfig, SharedBindings};

fn group(etcd: &Etcd) -> GroupConfig {
    let mut g = GroupConfig::new(vec![etcd.endpoint()], "test");
    g.call_timeout = Duration::from_secs(1);
    g
}

async fn bounded(test: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), test)
        .await
        .expect("test took more than 60 s");
}

/// The record's value and lease, read directly.
async fn record(etcd: &Etcd, key: &str) -> Option<(String, i64)> {
    let mut c = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .expect("connect");
    let r = c.get(key, None).await.expect("get");
    r.kvs()
        .first()
        .map(|kv| (String::from_utf8_lossy(kv.value()).into_owned(), kv.lease()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_identity_binds_a_namespace_for_every_member() {
    let etcd = Etcd::start();
    bounded(async {
        let (a, b) = (
            SharedBindings::new(group(&etcd)).expect("a"),
            SharedBindings::new(group(&etcd)).expect("b"),
        );
        let (one, two) = ([1u8; 32], [2u8; 32]);
        assert_eq!(a.bind("t:llama", &one).await.expect("bind"), one);
        // A member that never saw the namespace learns the first identity, not its own.
        assert_eq!(b.bind("t:llama", &two).await.expect("bind"), one);
        assert_eq!(b.bind("t:other", &two).await.expect("bind"), two);
        let key = format!("{}t:llama", a.records_prefix());
        let (value, lease_a) = record(&etcd, &key).await.expect("record");
        assert_eq!(value, "01".repeat(32));
        assert_ne!(lease_a, 0, "records live under a lease");
        // A rewrite by another holder of the same identity moves it to its lease; one of
        // another identity changes nothing.
        assert_eq!(b.publish("t:llama", &one).await.expect("publish"), one);
        let (_, lease_b) = record(&etcd, &key).await.expect("record");
        assert_ne!(lease_b, lease_a, "moved to the rewriter's lease");
        assert_eq!(b.publish("t:llama", &two).await.expect("publish"), one);
        // A withdrawal of another identity leaves it; of its own removes it.
        b.withdraw("t:llama", &two).await.expect("withdraw");
        assert!(record(&etcd, &key).await.is_some());
        a.withdraw("t:llama", &one).await.expect("withdraw");
        assert!(record(&etcd, &key).await.is_none());
        assert_eq!(b.bind("t:llama", &two).await.expect("bind"), two);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_etcd_fails_once_then_answers_at_once_until_the_rest_is_over() {
    let mut etcd = Etcd::start();
    bounded(async {
        let a = SharedBindings::new(group(&etcd)).expect("a");
        assert_eq!(a.bind("ns", &[7; 32]).await.expect("bind"), [7; 32]);
        etcd.kill();
        assert!(a.bind("ns2", &[7; 32]).await.is_err(), "etcd is down");
        let t = std::time::Instant::now();
        let e = a.bind("ns3", &[7; 32]).await.expect_err("resting");
        assert!(matches!(e, ClusterError::Resting(_)), "{e}");
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        etcd.restart();
        // After the rest the group answers again, with what it held before.
        tokio::time::sleep(strata_cluster::bindings::REST_AFTER_FAILURE).await;
        let mut got = None;
        for _ in 0..20 {
            match a.bind("ns", &[9; 32]).await {
                Ok(id) => {
                    got = Some(id);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        assert_eq!(got, Some([7; 32]));
    })
    .await;
}
