//! A short `strata bench chaos` (issue 12): the real `strata` binary as a child daemon
//! (FUSE mount over moto's S3 behind the bench's fault proxy, KV service on loopback),
//! killed with SIGKILL at seeded-random moments under mount readers and KV clients, and
//! restarted on the same cache dir. No acknowledged block may be lost and no byte read
//! (through the mount or the KV service) may be wrong.
//!
//! The binary is built by cargo for this workspace: `cargo test --workspace` builds it
//! anyway; run alone (`cargo test -p strata-tests --test chaos`), the test builds it
//! first with the same cargo, so it never runs a stale daemon.

mod fuse_common;

use std::path::PathBuf;
use std::process::Command;

use fuse_common::bounded;
use strata_tools::bench::chaos::{run_chaos, ChaosArgs};

/// `target/<profile>/strata`, built now (a no-op when it is up to date).
fn strata_binary() -> PathBuf {
    let test_exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/chaos-<hash> -> target/<profile>
    let profile_dir = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps")
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "-p", "strata-tools", "--bin", "strata"]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo build for the strata binary");
    assert!(status.success(), "building the strata binary failed");
    let bin = profile_dir.join("strata");
    assert!(bin.exists(), "{} missing after cargo build", bin.display());
    bin
}

#[test]
fn kill_9_under_load_and_store_faults_loses_no_block_and_returns_no_wrong_byte() {
    let bin = strata_binary();
    // 5 cycles of at most 2 s each plus restarts and checks: well under the bound.
    let report = bounded(150, move || {
        let args = ChaosArgs {
            cycles: 5,
            seed: 12,
            kill_after_ms: "800..2000".into(),
            // Shorter windows than the bench's defaults, so 5 short cycles see some.
            store_up_ms: "1000..3000".into(),
            store_down_ms: "500..1500".into(),
            files: 8,
            max_file_size: "2MiB".into(),
            verify_sample: 100,
            strata_bin: Some(bin),
            ..ChaosArgs::default()
        };
        run_chaos(&args).expect("the chaos run completes")
    });
    eprintln!("{report:#?}");
    assert!(
        report.acked_blocks > 0,
        "the KV clients got puts acknowledged"
    );
    assert!(report.reads > 0, "the mount readers read");
    assert!(
        report.store_faults_injected > 0,
        "the proxy injected store faults"
    );
    assert!(
        report.blocks_verified >= report.acked_blocks,
        "the last restart checks every acknowledged block: {report:#?}"
    );
    assert_eq!(
        report.lost_blocks, 0,
        "acknowledged blocks lost: {report:#?}"
    );
    assert_eq!(report.wrong_bytes, 0, "wrong bytes: {report:#?}");
    assert_eq!(report.short_reads, 0, "short reads: {report:#?}");
    assert_eq!(
        report.verify_errors, 0,
        "verification requests failed: {report:#?}"
    );
}
