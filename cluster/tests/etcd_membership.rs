//! Membership on a real etcd (issue 16): registration, the watch, leaving after the
//! lease TTL, and riding out an etcd outage. Each test starts its own etcd and bounds
//! its own time.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use strata_cluster::testing::Etcd;
use strata_cluster::{read_group, GroupConfig, Member, Membership, NodeId, NodeInfo};
use tokio::sync::watch;
use tokio::time::Instant;

/// 2 s: etcd's smallest lease TTL with its default timing (1.5 election timeouts,
/// rounded up), so the leave and outage tests run in seconds.
const TTL: Duration = Duration::from_secs(2);

fn group(etcd: &Etcd) -> GroupConfig {
    let mut g = GroupConfig::new(vec![etcd.endpoint()], "test");
    g.lease_ttl = TTL;
    g.call_timeout = Duration::from_secs(1);
    g.backoff_min = Duration::from_millis(50);
    g.backoff_max = Duration::from_millis(500);
    g
}

fn node(id: &str) -> NodeInfo {
    NodeInfo {
        id: NodeId::new(id),
        advertise: format!("{id}.example:7073"),
        capacity: BTreeMap::from([("memory".into(), 1 << 30), ("disk".into(), 10 << 30)]),
        zone: "zone-a".into(),
        admin: String::new(),
    }
}

fn ids(names: &[&str]) -> Vec<NodeId> {
    names.iter().map(|n| NodeId::new(*n)).collect()
}

/// Waits (at most `within`) until the member's membership satisfies `pred`.
async fn until(
    rx: &mut watch::Receiver<Membership>,
    within: Duration,
    what: &str,
    pred: impl FnMut(&Membership) -> bool,
) -> Membership {
    let outcome = tokio::time::timeout(within, rx.wait_for(pred))
        .await
        .map(|r| r.map(|m| m.clone()));
    match outcome {
        Ok(Ok(m)) => m,
        Ok(Err(_)) => panic!("{what}: the member task ended"),
        Err(_) => panic!(
            "{what}: not within {within:?}; last seen {:?}",
            *rx.borrow()
        ),
    }
}

/// The whole test in 60 s at most.
async fn bounded(test: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), test)
        .await
        .expect("test took more than 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_see_each_other_and_a_leave_at_once() {
    let etcd = Etcd::start();
    bounded(async {
        let g = group(&etcd);
        let members: Vec<Member> = ["a", "b", "c"]
            .iter()
            .map(|id| Member::start(g.clone(), node(id)).expect("start"))
            .collect();
        for m in &members {
            let seen = until(
                &mut m.membership(),
                Duration::from_secs(10),
                "three members",
                |m| m.nodes.len() == 3,
            )
            .await;
            assert_eq!(seen.ids(), ids(&["a", "b", "c"]));
            assert!(seen.connected);
            // The record round-trips: the peers get the address and capacities.
            assert_eq!(seen.nodes[&NodeId::new("b")], node("b"));
        }
        // etcd holds exactly the three records.
        let direct = read_group(&g).await.expect("read group");
        assert_eq!(direct.ids(), ids(&["a", "b", "c"]));

        // A clean leave revokes the lease: the others see it well before the TTL.
        let mut members = members;
        let c = members.pop().expect("c");
        let left = Instant::now();
        c.leave().await;
        for m in &members {
            until(&mut m.membership(), TTL, "c's leave", |m| {
                m.nodes.len() == 2
            })
            .await;
        }
        assert!(left.elapsed() < TTL, "leave took {:?}", left.elapsed());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_renewing_leaves_after_the_ttl() {
    let etcd = Etcd::start();
    bounded(async {
        let g = group(&etcd);
        let a = Member::start(g.clone(), node("a")).expect("start a");
        let b = Member::start(g.clone(), node("b")).expect("start b");
        let c = Member::start(g.clone(), node("c")).expect("start c");
        for m in [&a, &b, &c] {
            until(
                &mut m.membership(),
                Duration::from_secs(10),
                "three members",
                |m| m.nodes.len() == 3,
            )
            .await;
        }
        // Dropping c aborts its task as a crash would: no revoke, just no renewals.
        let crashed = Instant::now();
        drop(c);
        for m in [&a, &b] {
            let seen = until(&mut m.membership(), 4 * TTL, "c expiring", |m| {
                m.nodes.len() == 2
            })
            .await;
            assert_eq!(seen.ids(), ids(&["a", "b"]));
        }
        // Not before the lease could run out: its last renewal was at most a third of
        // the TTL before the crash.
        let gone_after = crashed.elapsed();
        assert!(
            gone_after >= TTL * 2 / 3 - Duration::from_millis(100),
            "c left after {gone_after:?}, before its lease could expire"
        );
        // The live ones stayed (their renewals work).
        tokio::time::sleep(TTL + Duration::from_millis(500)).await;
        assert_eq!(read_group(&g).await.expect("read").ids(), ids(&["a", "b"]));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_keeps_the_membership_and_members_reregister() {
    let mut etcd = Etcd::start();
    let g = group(&etcd);
    let members: Vec<Member> = ["a", "b", "c"]
        .iter()
        .map(|id| Member::start(g.clone(), node(id)).expect("start"))
        .collect();
    bounded(async {
        for m in &members {
            until(
                &mut m.membership(),
                Duration::from_secs(10),
                "three members",
                |m| m.nodes.len() == 3,
            )
            .await;
        }
    })
    .await;

    etcd.kill();
    bounded(async {
        for m in &members {
            until(&mut m.membership(), 3 * TTL, "noticing the outage", |m| {
                !m.connected
            })
            .await;
        }
        // Longer than a TTL without etcd: nobody is dropped from anyone's view.
        tokio::time::sleep(2 * TTL).await;
        for m in &members {
            let seen = m.membership().borrow().clone();
            assert!(!seen.connected);
            assert_eq!(seen.ids(), ids(&["a", "b", "c"]));
        }
    })
    .await;

    etcd.restart();
    bounded(async {
        for m in &members {
            until(&mut m.membership(), 5 * TTL, "reconnecting", |m| {
                m.connected && m.nodes.len() == 3
            })
            .await;
        }
        // etcd restores the old leases with a fresh TTL; after two TTLs they are gone,
        // so the records still there are the ones re-registered under renewed leases.
        tokio::time::sleep(2 * TTL + Duration::from_millis(500)).await;
        assert_eq!(
            read_group(&g).await.expect("read").ids(),
            ids(&["a", "b", "c"])
        );
        for m in &members {
            let seen = m.membership().borrow().clone();
            assert!(seen.connected);
            assert_eq!(seen.ids(), ids(&["a", "b", "c"]));
        }
        // The watches were re-established: a newcomer is seen by everyone.
        let d = Member::start(g.clone(), node("d")).expect("start d");
        for m in members.iter().chain([&d]) {
            until(
                &mut m.membership(),
                Duration::from_secs(10),
                "d joining",
                |m| m.nodes.len() == 4,
            )
            .await;
        }
    })
    .await;
}

/// A member whose lease ran out while etcd stayed up (a pause longer than the TTL, a
/// partition from etcd alone) is told so by its next renewal and registers again: the
/// others see it leave and come back, and it stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_lease_expired_registers_again() {
    let etcd = Etcd::start();
    bounded(async {
        let g = group(&etcd);
        let a = Member::start(g.clone(), node("a")).expect("start a");
        let b = Member::start(g.clone(), node("b")).expect("start b");
        let mut seen_by_a = a.membership();
        until(
            &mut seen_by_a,
            Duration::from_secs(10),
            "two members",
            |m| m.nodes.len() == 2,
        )
        .await;
        until(
            &mut b.membership(),
            Duration::from_secs(10),
            "two members",
            |m| m.nodes.len() == 2,
        )
        .await;

        // Expire b's lease behind its back, as etcd would after a long silence.
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
            .await
            .expect("connect");
        let key = format!("{}b", g.nodes_prefix());
        let resp = client.get(key, None).await.expect("get b");
        let lease = resp.kvs().first().expect("b's record").lease();
        let revoked_at = client
            .lease_revoke(lease)
            .await
            .expect("revoke")
            .header()
            .expect("header")
            .revision();

        // The next renewal (a third of the TTL) finds the lease gone; b registers again
        // under a new lease, and a's view follows (a revision after the revoke, b in it).
        // (Waiting to see b missing first would race b's quick return.)
        let back = until(&mut seen_by_a, 3 * TTL, "b back", |m| {
            m.revision > revoked_at && m.nodes.len() == 2
        })
        .await;
        assert_eq!(back.nodes[&NodeId::new("b")], node("b"));
        let resp = client
            .get(format!("{}b", g.nodes_prefix()), None)
            .await
            .expect("get b");
        let new_lease = resp.kvs().first().expect("b's record again").lease();
        assert_ne!(new_lease, lease);
        // And stays: its new lease is being renewed.
        tokio::time::sleep(TTL + Duration::from_millis(500)).await;
        assert_eq!(read_group(&g).await.expect("read").ids(), ids(&["a", "b"]));
    })
    .await;
}

/// A daemon that starts while etcd is down, with no membership saved, knows no group
/// (empty membership, not connected) and joins once etcd comes up; a one-shot read of a down etcd fails
/// within the call timeout instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_started_before_etcd_joins_when_it_comes_up() {
    let mut etcd = Etcd::start();
    etcd.kill();
    let g = group(&etcd);
    let a = Member::start(g.clone(), node("a")).expect("start a");
    bounded(async {
        let started = Instant::now();
        assert!(read_group(&g).await.is_err(), "etcd is down");
        assert!(started.elapsed() < g.call_timeout + Duration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let seen = a.membership().borrow().clone();
        assert!(!seen.connected && seen.nodes.is_empty(), "{seen:?}");
    })
    .await;
    etcd.restart();
    bounded(async {
        let seen = until(&mut a.membership(), 5 * TTL, "a joining", |m| {
            m.connected && m.nodes.len() == 1
        })
        .await;
        assert_eq!(seen.ids(), ids(&["a"]));
        assert_eq!(read_group(&g).await.expect("read").ids(), ids(&["a"]));
    })
    .await;
}

/// Black-box finding: a live member whose record went (deleted by hand, or by a second
/// daemon started with the same node id that then left) never registered again, and
/// the group routed around it for good while it said "connected". It writes its record
/// again as soon as the watch shows it gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_record_goes_writes_it_again() {
    let etcd = Etcd::start();
    bounded(async {
        let g = group(&etcd);
        let a = Member::start(g.clone(), node("a")).expect("start a");
        let b = Member::start(g.clone(), node("b")).expect("start b");
        let mut seen_by_b = b.membership();
        until(&mut seen_by_b, Duration::from_secs(10), "both", |m| {
            m.ids() == ids(&["a", "b"])
        })
        .await;

        // A second daemon under a's id (a copied config) does not take a's record:
        // for longer than a lease, the group still reaches a (black-box finding: the
        // newcomer overwrote it and took a's keys over).
        let mut twin = node("a");
        twin.advertise = "twin.example:7073".into();
        let impostor = Member::start(g.clone(), twin).expect("start the twin");
        let advertised =
            |m: &Membership| m.nodes.get(&NodeId::new("a")).map(|n| n.advertise.clone());
        let deadline = Instant::now() + TTL * 2;
        while Instant::now() < deadline {
            assert_eq!(
                advertised(&seen_by_b.borrow()).as_deref(),
                Some("a.example:7073"),
                "the twin took a's id"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // ...and the twin knows why it is kept out (its KV calls are refused on it).
        let twin = until(
            &mut impostor.membership(),
            TTL * 2,
            "the twin refused",
            |m| m.refused.is_some(),
        )
        .await;
        let why = twin.refused.unwrap_or_default();
        assert!(why.contains("registered by another live daemon"), "{why}");
        impostor.leave().await;

        // Deleted by hand: back within the watch's delay.
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
            .await
            .expect("etcd client");
        let key = format!("{}a", g.nodes_prefix());
        client.delete(key.clone(), None).await.expect("delete");
        // Polled in etcd itself: b's view may still hold a from before the delete (the
        // delete and the rewrite can reach its watch together), so it says nothing of
        // the record being back (CI under load read etcd before a wrote it again).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = client.get(key.clone(), None).await.expect("get");
            if got.kvs().len() == 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the record is not in etcd again after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        until(
            &mut seen_by_b,
            Duration::from_secs(10),
            "a after the delete",
            |m| m.ids() == ids(&["a", "b"]),
        )
        .await;
        drop(a);
        drop(b);
    })
    .await;
}

/// A TTL etcd would refuse (and that would keep a dead node in the group for days) is
/// refused by the configuration check.
#[test]
fn a_lease_ttl_over_an_hour_is_refused() {
    let mut g = GroupConfig::new(vec!["http://127.0.0.1:2379".into()], "test");
    g.lease_ttl = Duration::from_secs(9_999_999_999);
    let e = g.check().expect_err("refused");
    assert!(e.to_string().contains("lease TTL"), "{e}");
    g.lease_ttl = Duration::from_secs(3600);
    g.check().expect("an hour is allowed");
}

/// Black-box finding: a daemon restarted while etcd was down came up with an empty
/// membership and served as a group of one. A member started with a snapshot file
/// saves each membership etcd gives it there, and a start that cannot reach etcd
/// begins from it (not connected), until etcd answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_while_etcd_is_down_keeps_the_last_membership() {
    let mut etcd = Etcd::start();
    let g = group(&etcd);
    let snapshot = etcd.dir().join("a-membership.json");
    let b = Member::start(g.clone(), node("b")).expect("start b");
    bounded(async {
        let a = Member::start_with_snapshot(g.clone(), node("a"), Some(snapshot.clone()))
            .expect("start a");
        until(
            &mut a.membership(),
            Duration::from_secs(10),
            "a and b",
            |m| m.connected && m.ids() == ids(&["a", "b"]),
        )
        .await;
        // Written on the change; poll the file rather than sleep a guess.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !std::fs::read_to_string(&snapshot).is_ok_and(|s| s.contains("b.example")) {
            assert!(Instant::now() < deadline, "the membership was not saved");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(a);
    })
    .await;
    etcd.kill();
    bounded(async {
        let a = Member::start_with_snapshot(g.clone(), node("a"), Some(snapshot.clone()))
            .expect("restart a");
        let seen = a.membership().borrow().clone();
        assert_eq!(seen.ids(), ids(&["a", "b"]), "the saved membership at once");
        assert!(!seen.connected);
        assert_eq!(seen.nodes[&NodeId::new("b")], node("b"));
        // Still kept while etcd stays away.
        tokio::time::sleep(g.call_timeout + Duration::from_millis(500)).await;
        let seen = a.membership().borrow().clone();
        assert_eq!(seen.ids(), ids(&["a", "b"]), "{seen:?}");
        // Without a file (or with another group's) the group is unknown: empty.
        let c =
            Member::start_with_snapshot(g.clone(), node("c"), Some(etcd.dir().join("absent.json")))
                .expect("start c");
        assert!(c.membership().borrow().nodes.is_empty());
        drop(c);
        drop(a);
    })
    .await;
    drop(b);
}

/// Black-box finding: a daemon restarted at once under a new node id, at the same
/// address, was a second member until its old record's lease ran out, and R=2 put both
/// copies of some blocks on that one machine. Registering retires a record of another
/// id at this node's own address (and only such a record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_under_a_new_id_retires_its_old_record() {
    let etcd = Etcd::start();
    bounded(async {
        let mut g = group(&etcd);
        // Long enough that the old record would still be there without the fix.
        g.lease_ttl = Duration::from_secs(30);
        let at = |id: &str, addr: &str| NodeInfo {
            advertise: addr.into(),
            ..node(id)
        };
        let other = Member::start(g.clone(), node("other")).expect("start other");
        let old = Member::start(g.clone(), at("n1", "host1:7073")).expect("start n1");
        until(
            &mut old.membership(),
            Duration::from_secs(10),
            "n1 and other",
            |m| m.connected && m.nodes.len() == 2,
        )
        .await;
        // A crash: the record stays until its lease ends.
        drop(old);
        let renamed = Member::start(g.clone(), at("n1-renamed", "host1:7073")).expect("start");
        let seen = until(
            &mut renamed.membership(),
            Duration::from_secs(10),
            "the old record gone",
            |m| m.connected && m.ids() == ids(&["n1-renamed", "other"]),
        )
        .await;
        assert_eq!(
            seen.nodes[&NodeId::new("n1-renamed")].advertise,
            "host1:7073"
        );
        assert_eq!(
            read_group(&g).await.expect("read").ids(),
            ids(&["n1-renamed", "other"])
        );
        until(
            &mut other.membership(),
            Duration::from_secs(5),
            "other sees it",
            |m| m.ids() == ids(&["n1-renamed", "other"]),
        )
        .await;
    })
    .await;
}
