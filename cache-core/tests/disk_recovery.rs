//! Crash recovery of the disk tier with a real `kill -9`.
//!
//! The parent test re-runs this same test binary as a child (`writer_child`, selected
//! by name and switched on by an environment variable). The child opens a `DiskTier`
//! and, from four concurrent tasks, puts deterministic blocks and removes some of
//! them, printing `PUT i` after each acknowledged put, `DELBEGIN i` before and `DEL i`
//! after each acknowledged remove. The parent reads those lines, sends SIGKILL after
//! a fixed number of acknowledgements (so puts are in flight), reads what was printed
//! before the kill, and reopens the directory:
//!
//! - every acknowledged put that was not (being) removed is there and verifies;
//! - every acknowledged remove stays removed;
//! - nothing phantom: each resident key is one the child put, with its exact bytes,
//!   and at most one unacknowledged put per child task (the one in flight);
//! - accounting matches: `used_bytes` = sum of resident sizes <= capacity, and the
//!   number of block files on disk equals the number of residents (no orphans).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use bytes::Bytes;
use strata_cache_core::io::IoEngineKind;
use strata_cache_core::testdata::xorshift_bytes;
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
use strata_cache_core::{Block, CacheKey, Tier, TierGet};

const CHILD_DIR_ENV: &str = "STRATA_RECOVERY_CHILD_DIR";
const CHILD_ENGINE_ENV: &str = "STRATA_RECOVERY_CHILD_ENGINE";
/// Far more than the child writes before it is killed; each block is < 130 KiB.
const CAPACITY: u64 = 512 << 20;
const WRITERS: u64 = 4;
/// Keys the child would write if never killed (3000 x ~66 KiB: fits the capacity).
const MAX_KEYS: u64 = 3000;
/// Acknowledged puts after which the parent kills the child.
const KILL_AFTER: usize = 200;

fn key(i: u64) -> CacheKey {
    CacheKey::file("recovery/object", "etag-1", i)
}

/// Block `i`: 1 KiB .. 129 KiB of bytes from a generator seeded by `i`.
fn value(i: u64) -> Bytes {
    let len = 1024 + (i * 7919 % (128 << 10)) as usize;
    xorshift_bytes(len, i).into()
}

fn engine_from_env() -> IoEngineKind {
    std::env::var(CHILD_ENGINE_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(IoEngineKind::Auto)
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes()).expect("stdout");
    out.write_all(b"\n").expect("stdout");
    out.flush().expect("stdout");
}

/// The child half; does nothing unless started by `run_and_kill`.
#[test]
#[ignore = "child process of the kill -9 recovery tests, started by them"]
fn writer_child() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let opts = DiskOptions {
            engine: engine_from_env(),
            ..DiskOptions::default()
        };
        let tier = Arc::new(DiskTier::open(&dir, CAPACITY, opts).expect("child open"));
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let tier = tier.clone();
            tasks.push(tokio::spawn(async move {
                let mut i = w;
                while i < MAX_KEYS {
                    tier.put(&key(i), Block::new(value(i)))
                        .await
                        .expect("child put");
                    say(format!("PUT {i}"));
                    // Every 5th key of this writer: remove one it put two rounds ago.
                    if i % (5 * WRITERS) == w && i >= 2 * WRITERS {
                        let j = i - 2 * WRITERS;
                        say(format!("DELBEGIN {j}"));
                        assert!(tier.remove(&key(j)).await.expect("child remove"));
                        say(format!("DEL {j}"));
                    }
                    i += WRITERS;
                }
            }));
        }
        for t in tasks {
            t.await.expect("writer task");
        }
    });
}

#[derive(Default)]
struct Seen {
    put: BTreeSet<u64>,
    del_begun: BTreeSet<u64>,
    del: BTreeSet<u64>,
}

fn run_and_kill(dir: &Path, engine: &str) -> Seen {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "writer_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_ENGINE_ENV, engine)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let mut seen = Seen::default();
    let mut killed = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child stdout");
        let mut parts = line.split(' ');
        let (tag, n) = (
            parts.next(),
            parts.next().and_then(|n| n.parse::<u64>().ok()),
        );
        match (tag, n) {
            (Some("PUT"), Some(n)) => {
                seen.put.insert(n);
            }
            (Some("DELBEGIN"), Some(n)) => {
                seen.del_begun.insert(n);
            }
            (Some("DEL"), Some(n)) => {
                seen.del.insert(n);
            }
            _ => continue, // the test harness's own lines
        }
        if !killed && seen.put.len() >= KILL_AFTER {
            // std's Child::kill sends SIGKILL on Unix: a real `kill -9`.
            child.kill().expect("kill -9 the child");
            killed = true;
            // Keep reading: lines the child wrote before dying are acknowledgements.
        }
    }
    let status = child.wait().expect("wait child");
    assert!(killed, "child ended before {KILL_AFTER} acks: {status:?}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(9),
        "child died of SIGKILL, mid-stream"
    );
    seen
}

fn count_block_files(dir: &Path) -> usize {
    let mut n = 0;
    for sub in std::fs::read_dir(dir.join("data")).expect("data dir") {
        let sub = sub.expect("entry").path();
        if sub.is_dir() {
            n += std::fs::read_dir(&sub)
                .expect("sub dir")
                .filter_map(|f| f.ok())
                .filter(|f| f.file_name().to_string_lossy().ends_with(".blk"))
                .count();
        }
    }
    n
}

async fn check_recovery(dir: &Path, seen: &Seen) {
    let tier = DiskTier::open(dir, CAPACITY, DiskOptions::default()).expect("reopen");
    let report = tier.recovery().clone();
    // A killed process loses nothing the kernel accepted: every index entry must
    // point at a complete file. (Only a power loss could lose more.)
    assert_eq!(report.bad_index_entries, 0, "{report:?}");
    assert_eq!(report.bad_files, 0, "{report:?}");
    assert!(!report.wiped);

    // Every acknowledged put that no remove touched is there, byte for byte.
    for &i in seen.put.difference(&seen.del_begun) {
        match tier.get(&key(i)).await.expect("get") {
            TierGet::Hit(b) => assert_eq!(b.into_data(), value(i), "block {i} differs"),
            other => panic!("acknowledged block {i} lost: {other:?}"),
        }
    }
    // Every acknowledged remove stayed removed.
    for &i in &seen.del {
        assert!(!tier.contains(&key(i)).await, "removed block {i} came back");
    }
    // Nothing phantom.
    let resident = tier.resident();
    let mut unacked = 0;
    let mut total = 0u64;
    for (k, size) in &resident {
        let i = (0..MAX_KEYS)
            .find(|&i| &key(i) == k)
            .unwrap_or_else(|| panic!("phantom key {k}"));
        assert_eq!(*size, value(i).len() as u64, "size of {k}");
        total += tier.footprint(k, *size);
        if !seen.put.contains(&i) {
            unacked += 1;
        }
        match tier.get(k).await.expect("get") {
            TierGet::Hit(b) => assert_eq!(b.into_data(), value(i), "block {i} differs"),
            other => panic!("resident {k} unreadable: {other:?}"),
        }
    }
    assert!(
        unacked <= WRITERS as usize,
        "{unacked} unacknowledged residents; at most one put per writer was in flight"
    );
    assert_eq!(tier.used_bytes(), total, "accounting matches the residents");
    assert!(total <= CAPACITY);
    assert_eq!(
        count_block_files(dir),
        resident.len(),
        "no orphan files left"
    );
    assert_eq!(tier.stats().errors, 0, "nothing corrupt was found");
    assert!(seen.put.len() >= KILL_AFTER);

    // The recovered tier keeps working.
    let k = CacheKey::kv("after-recovery", vec![1, 2, 3]);
    tier.put(&k, Block::new(value(1))).await.expect("put");
    assert!(matches!(tier.get(&k).await.expect("get"), TierGet::Hit(_)));
}

#[test]
fn acknowledged_blocks_survive_kill_9_io_uring() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = run_and_kill(dir.path(), "io_uring");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(check_recovery(dir.path(), &seen));
}

#[test]
fn acknowledged_blocks_survive_kill_9_psync() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = run_and_kill(dir.path(), "psync");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(check_recovery(dir.path(), &seen));
}
