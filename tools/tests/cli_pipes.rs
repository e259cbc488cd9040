//! The `strata` binary's behaviour as a pipeline stage and as a command runner.

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn strata() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_strata"))
}

/// `strata bench replay ... | head -1`: the reader is gone before strata prints. It must
/// end as `cat` does (killed by SIGPIPE), not panic "failed printing to stdout" (101).
#[test]
fn a_closed_stdout_is_not_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("t.csv");
    std::fs::write(
        &trace,
        "ts_ns,job,path,offset,len,size\n0,j,a.bin,0,100,100\n10,j,b.bin,0,100,100\n",
    )
    .expect("write trace");
    // A pipe whose read end is closed before the child starts writing.
    let mut child = Command::new(strata())
        .args(["bench", "replay", "--policies", "lru", "--trace"])
        .arg(&trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn strata");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(101), "panicked: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        out.status
    );
}
