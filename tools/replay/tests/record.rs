//! `strata trace record` for real: strace runs a tiny command and the rows must be the
//! reads it made. Without strace the tests say so and pass, except under CI (`CI=true`),
//! where scripts/install-deps.sh installs it and a missing strace is a failure.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use strata_replay::trace::record::{record, Recorded};

fn have_strace() -> bool {
    if Command::new("strace").arg("-V").output().is_ok() {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(
        !ci,
        "strace is missing under CI: scripts/install-deps.sh installs it"
    );
    eprintln!("SKIPPED: strace is not installed (apt-get install strace)");
    false
}

fn run(root: &Path, cmd: &[&str]) -> Recorded {
    let cmd: Vec<OsString> = cmd.iter().map(OsString::from).collect();
    record(root, &cmd, None).expect("record")
}

fn rows(rec: &Recorded) -> Vec<(String, String, u64, u64, u64)> {
    let t = &rec.trace;
    t.records
        .iter()
        .map(|r| {
            (
                t.job_name(r).to_string(),
                t.path_name(r).to_string(),
                r.offset,
                r.len,
                r.size,
            )
        })
        .collect()
}

/// The rows of `dd bs=1000 ARGS` reading a file `name` of `len` bytes in a fresh root.
fn dd_rows(name: &str, len: usize, args: &[&str]) -> Vec<(String, String, u64, u64, u64)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join(name);
    std::fs::write(&data, vec![7u8; len]).expect("write");
    let input = format!("if={}", data.display());
    let mut cmd = vec![
        "dd",
        input.as_str(),
        "of=/dev/null",
        "bs=1000",
        "status=none",
    ];
    cmd.extend_from_slice(args);
    let rec = run(dir.path(), &cmd);
    assert!(rec.succeeded(), "{}", rec.status);
    rows(&rec)
}

#[test]
fn dd_with_skip_reads_what_it_says() {
    if !have_strace() {
        return;
    }
    let got = dd_rows("data.bin", 10_000, &["skip=3", "count=2"]);
    let want: Vec<_> = [3000, 4000]
        .iter()
        .map(|&o| (got[0].0.clone(), "data.bin".to_string(), o, 1000, 10_000))
        .collect();
    assert_eq!(got, want);
    assert!(
        got[0].0.starts_with("dd-"),
        "job named after the program: {got:?}"
    );
}

#[test]
fn python_seeks_dups_and_forks() {
    if !have_strace() || Command::new("python3").arg("-V").output().is_err() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("d")).expect("mkdir");
    let data = dir.path().join("d/f.bin");
    std::fs::write(&data, vec![1u8; 50_000]).expect("write");
    let script = format!(
        r#"
import os
fd = os.open({p:?}, os.O_RDONLY)
os.lseek(fd, 1000, 0)
os.read(fd, 10)
fd2 = os.dup(fd)
os.read(fd2, 20)
os.pread(fd, 30, 40000)
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    os.read(fd, 40)
    os._exit(0)
os.waitpid(pid, 0)
os.read(fd, 50)
os.lseek(fd, 49990, 0)
os.read(fd, 100)
os.read(fd, 100)
os._exit(3)
"#,
        p = data.display().to_string()
    );
    let rec = run(dir.path(), &["python3", "-c", &script]);
    assert_eq!(
        rec.exit_code,
        Some(3),
        "the command's exit code is reported"
    );
    let got: Vec<_> = rows(&rec)
        .into_iter()
        .map(|(job, path, off, len, size)| {
            assert_eq!((path.as_str(), size), ("d/f.bin", 50_000));
            (job, off, len)
        })
        .collect();
    let parent = got[0].0.clone();
    let child = got[3].0.clone();
    assert_ne!(
        parent, child,
        "the child moved to its own process group: {got:?}"
    );
    assert_eq!(
        got,
        vec![
            (parent.clone(), 1000, 10),
            (parent.clone(), 1010, 20),
            (parent.clone(), 40000, 30),
            (child, 1030, 40),
            (parent.clone(), 1070, 50),
            (parent, 49990, 10),
        ]
    );
}

/// A file whose name the CSV cannot carry (an object key with a comma) is recorded under
/// an escaped name, not left out.
#[test]
fn a_file_named_with_a_comma_is_kept_escaped() {
    if !have_strace() {
        return;
    }
    let got: Vec<_> = dd_rows("part,0001.bin", 3000, &[])
        .into_iter()
        .map(|r| (r.1, r.2, r.3))
        .collect();
    let want: Vec<_> = [0, 1000, 2000]
        .iter()
        .map(|&o| ("part%2C0001.bin".to_string(), o, 1000))
        .collect();
    assert_eq!(got, want);
}

/// A file opened by a forked child and passed over a socketpair (`SCM_RIGHTS`, as
/// multiprocessing's `send_handle` does) is read by the parent at the offset the child
/// left: the reads are recorded as that file's (they were dropped, `-s 0` printing the
/// descriptors as `[...]`).
#[test]
fn a_file_passed_over_a_socketpair_is_recorded() {
    if !have_strace() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("passed.bin"), vec![3u8; 10_000]).expect("write");
    let script = format!(
        "import os, socket\n\
         a, b = socket.socketpair()\n\
         if os.fork() == 0:\n\
         \x20   fd = os.open({:?}, os.O_RDONLY)\n\
         \x20   os.read(fd, 100)\n\
         \x20   socket.send_fds(a, [b'x'], [fd])\n\
         \x20   os._exit(0)\n\
         _, fds, _, _ = socket.recv_fds(b, 1, 1)\n\
         os.read(fds[0], 1000)\n\
         os.wait()\n",
        dir.path().join("passed.bin")
    );
    let rec = run(dir.path(), &["python3", "-c", &script]);
    assert!(rec.succeeded(), "{}", rec.status);
    let got: Vec<_> = rows(&rec).into_iter().map(|r| (r.1, r.2, r.3)).collect();
    assert_eq!(
        got,
        vec![
            ("passed.bin".to_string(), 0, 100),
            ("passed.bin".to_string(), 100, 1000)
        ]
    );
}
