//! The cache group's file data plane (issue 16) with a real etcd and real `strata
//! serve` daemons on loopback ([`strata_tools::bench::group`]): the peer listener's
//! group token, blocks fetched from the store once for the whole group, crashes,
//! rejoins and an etcd outage. Every test bounds its own time.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::bounded;
use strata_cluster::peer::pb::HelloRequest;
use strata_cluster::peer::PeerChannels;
use strata_tools::bench::group::{count_wrong, wait_until, write_dataset, Group, GroupSpec};

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_strata"))
}

/// The peer listener answers a peer with the group token and refuses, with
/// UNAUTHENTICATED, a caller without it or with another one.
#[test]
fn the_peer_listener_refuses_calls_without_the_group_token() {
    bounded(90, || {
        let g = Group::start(GroupSpec {
            binary: binary(),
            nodes: 2,
            mounts: false,
            ..GroupSpec::default()
        })
        .expect("group starts");
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let token = g.spec.token.clone();
        let peer = g.nodes[1].peer.clone();
        rt.block_on(async move {
            let hello = |token: Option<String>| {
                let peer = peer.clone();
                async move {
                    let ch = PeerChannels::new(token.as_deref(), Duration::from_secs(2))
                        .expect("channels");
                    let mut c = ch.file_client(&peer).expect("client");
                    c.hello(HelloRequest {}).await.map(|r| r.into_inner())
                }
            };
            let ok = hello(token).await.expect("the group token is accepted");
            assert_eq!((ok.group.as_str(), ok.node_id.as_str()), ("test", "node-b"));
            for bad in [None, Some("another-group".to_string())] {
                let e = hello(bad.clone()).await.expect_err("refused");
                assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}: {e}");
            }
        });
    });
}

const SEED: u64 = 16;
const MIB: usize = 1 << 20;

/// A store directory with `n` files of `size` bytes (content from [`SEED`]).
fn dataset(n: usize, size: usize) -> (tempfile::TempDir, Vec<String>) {
    let d = tempfile::tempdir().expect("tempdir");
    let names = write_dataset(d.path(), SEED, n, size).expect("dataset");
    (d, names)
}

fn spec(store: &std::path::Path) -> GroupSpec {
    GroupSpec {
        binary: binary(),
        nodes: 3,
        store_url: Some(format!("file://{}", store.display())),
        // Every block is fetched from the store exactly once, whatever the machine's
        // load: no hedge within 10 s (a failed or dead owner still falls back at once).
        hedge_min_ms: 10_000,
        ..GroupSpec::default()
    }
}

/// Reads a whole file through a mount and drops it from the page cache afterwards, so
/// the next read reaches the daemon again. Returns the bytes or the error.
fn read_uncached(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut &f, &mut out)?;
    // SAFETY: advising the kernel about our own open descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(out)
}

/// Reads file `i` through `node`'s mount and checks every byte.
fn read_checked(g: &Group, node: usize, names: &[String], i: usize, size: usize) {
    let path = g.nodes[node].mounted(&names[i]).expect("mount");
    let got = read_uncached(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert_eq!(got.len(), size, "{}", path.display());
    assert_eq!(
        count_wrong(SEED, i, 0, &got),
        0,
        "wrong bytes in {}",
        path.display()
    );
}

fn total_store_bytes(g: &Group) -> u64 {
    g.nodes
        .iter()
        .filter(|n| n.is_running())
        .map(|n| n.store_reads().expect("stats").1)
        .sum()
}

fn peer_counter(g: &Group, node: usize, field: &str) -> u64 {
    let s = g.nodes[node].stats().expect("stats");
    s["peer"]["peers"]
        .as_object()
        .map(|m| m.values().map(|c| c[field].as_u64().unwrap_or(0)).sum())
        .unwrap_or(0)
}

/// A file read through node A's mount is fetched from the store once for the group
/// (each block by its owner), then served by the owners to B and C: reading it through
/// their mounts costs no store byte. The per-peer metrics show the traffic.
#[test]
fn a_file_read_through_one_mount_is_fetched_from_the_store_once_then_served_by_owners() {
    bounded(180, || {
        let size = 24 * MIB;
        let (store, names) = dataset(1, size);
        let g = Group::start(spec(store.path())).expect("group starts");
        read_checked(&g, 0, &names, 0, size);
        let after_a = total_store_bytes(&g);
        // On a failure, say whether a peer ask failed or fell back to the store (a
        // legitimate second fetch) or a block was fetched twice without one.
        let (errors, fallbacks): (u64, u64) = (0..3)
            .map(|n| {
                (
                    peer_counter(&g, n, "errors"),
                    peer_counter(&g, n, "fallbacks"),
                )
            })
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert_eq!(
            after_a, size as u64,
            "each block once from the store (peer errors {errors}, fallbacks {fallbacks})"
        );
        for n in 0..3 {
            let own = g.nodes[n].store_reads().expect("stats").1;
            assert!(
                own > 0 && own < size as u64,
                "{}: every node owns a share ({own})",
                g.nodes[n].id
            );
        }
        assert!(
            peer_counter(&g, 0, "bytes_in") > 0,
            "A read blocks from its peers"
        );
        read_checked(&g, 1, &names, 0, size);
        read_checked(&g, 2, &names, 0, size);
        assert_eq!(
            total_store_bytes(&g),
            size as u64,
            "B and C read through the owners"
        );
        for n in 0..3 {
            assert!(
                peer_counter(&g, n, "bytes_out") > 0,
                "{} served its blocks",
                g.nodes[n].id
            );
        }
        let metrics = g.nodes[1].metrics().expect("metrics");
        assert!(
            metrics.contains("strata_peer_bytes_in_total{peer=\"node-a\"}"),
            "per-peer metrics on the admin endpoint:\n{metrics}"
        );
    });
}

/// `kill -9` of a node while two others read through their mounts: no read fails and
/// no byte is wrong (the dead owner's blocks come from the store meanwhile), and the
/// group drops it after the lease; restarted, it serves again.
#[test]
fn kill_9_of_a_node_during_reads_loses_no_read() {
    bounded(240, || {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let (files, size) = (36, 2 * MIB);
        let (store, names) = dataset(files, size);
        let mut g = Group::start(spec(store.path())).expect("group starts");
        let ttl = Duration::from_secs(g.spec.lease_ttl_secs);
        let progress = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|n| {
                let mnt = g.nodes[n].mountpoint.clone().expect("mount");
                let (names, progress) = (names.clone(), progress.clone());
                std::thread::spawn(move || {
                    let mut failures = Vec::new();
                    for (i, name) in names.iter().enumerate() {
                        match read_uncached(&mnt.join(name)) {
                            Ok(got) if got.len() == size && count_wrong(SEED, i, 0, &got) == 0 => {}
                            Ok(_) => failures.push(format!("{name}: wrong bytes")),
                            Err(e) => failures.push(format!("{name}: {e}")),
                        }
                        progress.fetch_add(1, Ordering::SeqCst);
                        // Spread the reads over the kill and the lease's expiry.
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    failures
                })
            })
            .collect();
        // Kill C once the readers are a third of the way through.
        wait_until(Duration::from_secs(60), "readers progress", || {
            progress.load(Ordering::SeqCst) >= 2 * files / 3
        })
        .expect("reads progress");
        g.nodes[2].kill9();
        for r in readers {
            let failures = r.join().expect("reader thread");
            assert!(failures.is_empty(), "reads lost to the kill: {failures:?}");
        }
        let fell_back = peer_counter(&g, 0, "fallbacks") + peer_counter(&g, 1, "fallbacks");
        assert!(
            fell_back > 0,
            "reads of the dead owner's blocks went to the store"
        );
        g.wait_members(2, 2 * ttl + Duration::from_secs(3))
            .expect("the group drops the dead node within 2 x TTL");
        g.nodes[2].restart().expect("restart");
        g.wait_members(3, Duration::from_secs(20)).expect("rejoins");
        for i in 0..files {
            read_checked(&g, 2, &names, i, size);
        }
    });
}

/// A node killed and restarted on its cache dir serves the blocks of its warm disk
/// tier again: after the restart, a read through another node costs no store byte.
#[test]
fn a_node_rejoining_with_its_warm_disk_tier_serves_its_blocks_again() {
    bounded(180, || {
        let size = 16 * MIB;
        let (store, names) = dataset(1, size);
        let mut g = Group::start(spec(store.path())).expect("group starts");
        read_checked(&g, 0, &names, 0, size);
        assert_eq!(total_store_bytes(&g), size as u64);
        let c_owned = g.nodes[2].store_reads().expect("stats").1;
        // The disk tier's background writes land before the crash.
        wait_until(
            Duration::from_secs(20),
            "C's blocks on its disk tier",
            || {
                g.nodes[2]
                    .stats()
                    .ok()
                    .and_then(|s| {
                        s["engine"]["tiers"].as_array().and_then(|t| {
                            t.iter()
                                .find(|t| t["name"].as_str().is_some_and(|n| n.starts_with("disk")))
                                .cloned()
                        })
                    })
                    .and_then(|t| t["used_bytes"].as_u64())
                    .is_some_and(|u| u >= c_owned)
            },
        )
        .expect("written back");
        g.nodes[2].kill9();
        g.nodes[2].restart().expect("restart on the warm cache dir");
        g.wait_members(3, Duration::from_secs(20)).expect("rejoins");
        let before = total_store_bytes(&g);
        read_checked(&g, 1, &names, 0, size);
        assert_eq!(
            total_store_bytes(&g),
            before,
            "C served its blocks from its disk tier"
        );
        assert_eq!(
            g.nodes[2].store_reads().expect("stats").1,
            0,
            "C read nothing from the store"
        );
        assert!(peer_counter(&g, 2, "bytes_out") > 0, "C served B");
    });
}

/// etcd stopped: the nodes keep the last membership and go on serving each other
/// (no store read for blocks the owners hold); when etcd returns they register again.
#[test]
fn with_etcd_down_nodes_keep_serving_with_the_last_membership() {
    bounded(180, || {
        let size = 16 * MIB;
        let (store, names) = dataset(1, size);
        let mut g = Group::start(spec(store.path())).expect("group starts");
        read_checked(&g, 0, &names, 0, size);
        g.etcd.kill();
        let served_before = peer_counter(&g, 1, "bytes_in");
        read_checked(&g, 1, &names, 0, size);
        read_checked(&g, 2, &names, 0, size);
        assert_eq!(
            total_store_bytes(&g),
            size as u64,
            "still one store read per block"
        );
        assert!(
            peer_counter(&g, 1, "bytes_in") > served_before,
            "B read from its peers"
        );
        g.etcd.restart();
        g.wait_members(3, Duration::from_secs(30))
            .expect("the nodes register again");
        read_checked(&g, 2, &names, 0, size);
    });
}
