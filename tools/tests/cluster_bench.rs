//! A short `strata bench cluster` (issue 16) on the real binary: the group reads the
//! working set from the store about once where independent nodes read it once each,
//! and a node killed mid-run costs no failed and no wrong read. Loose bounds: the
//! figures against the targets are in docs/BENCHMARKS.md; this guards the
//! behaviour (a group without its peer path would read ~3 x, like independent nodes).
//!
//! Placement is by the blocks' keys, whose versions (the local store's mtime and inode)
//! differ on every run, so which owner draws how many blocks is random. An owner that
//! draws more than its capacity evicts its own blocks and each stream may read them
//! again: that overflow is allowed for (it was this test's flake at 1 MiB blocks, where
//! 20 blocks over 3 owners often give one 9 to 11 MiB of 8). 256 KiB blocks make the
//! draw smoother (80 blocks).

use std::sync::mpsc;
use std::time::Duration;

use strata_tools::bench::cluster::{bench, ClusterArgs};
use strata_tools::bench::fs::ColdStoreArgs;

#[test]
fn the_group_reads_the_store_about_once_and_a_kill_fails_no_read() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = bench(&ClusterArgs {
            json: true,
            nodes: 3,
            capacity: "8MiB".into(),
            working_set: 2.5,
            file_size: "2MiB".into(),
            epochs: 2,
            block_size: "256KiB".into(),
            store: ColdStoreArgs {
                latency_ms: 5,
                bandwidth: "500MB".into(),
            },
            lease_ttl_secs: 2,
            seed: 7,
            binary: Some(env!("CARGO_BIN_EXE_strata").into()),
        })
        .map_err(|e| format!("{e:#}"));
        let _ = tx.send(r);
    });
    let r = match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => panic!("the bench failed: {e}"),
        Err(_) => panic!("the bench took longer than 300 s"),
    };
    let unique = r.unique_bytes as f64;
    assert_eq!((r.failed_reads, r.wrong_reads), (0, 0), "{r:?}");
    let overflow = r.owned_bytes_max.saturating_sub(r.capacity_bytes) * r.nodes as u64;
    assert!(
        r.store_bytes_group as f64 <= 1.2 * unique + overflow as f64,
        "{r:?}"
    );
    assert!(r.store_bytes_independent as f64 >= 2.5 * unique, "{r:?}");
    assert!(r.hit_ratio_group > r.hit_ratio_independent + 0.2, "{r:?}");
    assert!(
        r.failover_ms < 4_000.0,
        "reads resume within 2 x TTL: {r:?}"
    );
}
