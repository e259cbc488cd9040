//! Commands that serve a FUSE mount from their own process (`strata demo`, `strata
//! bench fs`) stopped by a signal, through the real kernel (root, /dev/fuse).
//!
//! Black-box finding: SIGTERM left such a process a zombie with a thread in D state
//! (closing, at exit, a file on the mount its own dead threads served), its mount
//! hanging every access, SIGKILL included; and `strata demo` ignored Ctrl-C. Each
//! test bounds its wait and, should the process wedge, aborts the FUSE connections
//! it left so that nothing hangs after it.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn strata() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_strata"))
}

/// FUSE mounts under `dir` in this namespace's mount table: (connection, mountpoint).
fn fuse_mounts_under(dir: &Path) -> Vec<(String, String)> {
    let want = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" - fuse"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let at = f.get(4)?.to_string();
            let conn = f.get(2)?.split_once(':')?.1.to_string();
            at.starts_with(&want).then_some((conn, at))
        })
        .collect()
}

/// Aborts and detaches whatever FUSE mounts are left under `dir`.
fn release(dir: &Path) {
    for (conn, at) in fuse_mounts_under(dir) {
        let _ = std::fs::write(format!("/sys/fs/fuse/connections/{conn}/abort"), "1");
        let _ = Command::new("umount").args(["-l", &at]).status();
    }
}

/// Sends `sig` to `child`, waits (at most `secs`) for it to exit; on a wedge, releases
/// the mounts under `dir` so the child can end, and returns None.
fn signal_and_wait(
    child: &mut Child,
    sig: libc::c_int,
    dir: &Path,
    secs: u64,
) -> Option<std::process::ExitStatus> {
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(child.id() as i32, sig) };
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().expect("wait") {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    release(dir);
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// SIGTERM while `bench fs` reads its own null mount with files held open (as
/// `timeout` sends it): the bench exits 143 within seconds and leaves no mount.
#[test]
fn bench_fs_stopped_by_sigterm_exits_and_leaves_no_mount() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let work = dir.path().join("b");
    let mut child = Command::new(strata())
        .args(["bench", "fs", "--files", "2", "--file-size", "8MiB"])
        .args(["--rand-secs", "20", "--dir"])
        .arg(&work)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start the bench");
    let deadline = Instant::now() + Duration::from_secs(60);
    while fuse_mounts_under(&work).is_empty() {
        if Instant::now() > deadline || child.try_wait().expect("wait").is_some() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the bench's mount did not appear");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Into the random reads (O_DIRECT files open on the mount).
    std::thread::sleep(Duration::from_secs(1));
    let status = signal_and_wait(&mut child, libc::SIGTERM, &work, 15);
    let left = fuse_mounts_under(&work);
    release(&work);
    let status = status.expect("the bench did not exit within 15 s of SIGTERM (wedged)");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    assert!(left.is_empty(), "mounts left: {left:?}");
}

/// `strata demo` stopped mid-workload by SIGINT (inherited ignored, as in a script's
/// background job) and by SIGTERM: it stops the workload, unmounts, removes its temp
/// dir and exits 128 + the signal, well before its workload's end.
#[test]
fn demo_stopped_by_sigint_or_sigterm_cleans_up_and_exits() {
    use std::os::unix::process::CommandExt;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let dir = tempfile::tempdir().expect("tempdir");
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).expect("mkdir");
        let mut cmd = Command::new(strata());
        cmd.args(["demo", "--files", "3000", "--data-dir"])
            .arg(dir.path().join("data"))
            .env("TMPDIR", &tmp)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("start the demo");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut said = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !said.iter().any(|l: &String| l.starts_with("daemon up")) {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(l) => said.push(l),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    release(dir.path());
                    panic!("the demo's daemon did not come up: {said:?}");
                }
            }
        }
        let status = signal_and_wait(&mut child, sig, dir.path(), 20);
        let left = fuse_mounts_under(dir.path());
        release(dir.path());
        said.extend(rx.try_iter());
        let status = status
            .unwrap_or_else(|| panic!("signal {sig}: no exit within 20 s (wedged): {said:?}"));
        assert_eq!(status.code(), Some(128 + sig), "{status:?} {said:?}");
        assert!(left.is_empty(), "signal {sig}: mounts left: {left:?}");
        assert!(
            !said.iter().any(|l| l.starts_with("kv:")),
            "signal {sig}: the workload ran to its end: {said:?}"
        );
        let temp_left: Vec<_> = std::fs::read_dir(&tmp)
            .expect("list tmp")
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(temp_left.is_empty(), "signal {sig}: left {temp_left:?}");
    }
}
