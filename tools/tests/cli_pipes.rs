//! The `strata` binary's behaviour as a pipeline stage and as a command runner.

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn strata() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_strata"))
}

/// Black-box finding (round 14): `strata bench replay ... > /dev/full` (and `stats`,
/// `bench tiers`) panicked "failed printing to stdout: No space left on device", exit
/// 101. A failed write of the output is the command's error.
#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = two_read_trace(dir.path());
    for json in [false, true] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let mut cmd = Command::new(strata());
        cmd.args(["bench", "replay", "--policies", "lru", "--trace"])
            .arg(&trace);
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .expect("run strata");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "json {json}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.contains("writing to stdout"), "{stderr}");
    }
}

/// `strata bench replay ... | head -1`: the reader is gone before strata prints. It must
/// end as `cat` does (killed by SIGPIPE), not panic "failed printing to stdout" (101).
#[test]
fn a_closed_stdout_is_not_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = two_read_trace(dir.path());
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

/// `trace record` runs the command with a file to read under `root`, in `dir`.
fn record(dir: &std::path::Path, out: &std::path::Path, script: &str) -> std::process::Output {
    std::fs::create_dir_all(dir.join("data")).expect("mkdir");
    std::fs::write(dir.join("data/f.bin"), vec![7u8; 10_000]).expect("write data");
    Command::new(strata())
        .current_dir(dir)
        .args(["trace", "record", "--root", "data", "--out"])
        .arg(out)
        .args(["--", "sh", "-c", script])
        .output()
        .expect("run strata")
}

/// The recorded command's exit status is strata's (exit 3 -> 3, SIGKILL -> 137), after
/// the trace of what it read is written.
#[test]
fn record_passes_on_the_commands_exit_status() {
    // (strace is installed by scripts/install-deps.sh, as for the recorder's tests.)
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("t.csv");
    let o = record(dir.path(), &out, "cat data/f.bin >/dev/null; exit 3");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{stderr}");
    assert!(out.exists(), "the trace is written: {stderr}");
    let o = record(dir.path(), &out, "cat data/f.bin >/dev/null; kill -KILL $$");
    assert_eq!(
        o.status.code(),
        Some(128 + 9),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Nothing read under the root: still an error saying so, but with the command's
    // status (it was 1, hiding a crash from the caller).
    for (script, code) in [("exit 7", 7), ("kill -TERM $$", 128 + libc::SIGTERM)] {
        let out = dir.path().join("none.csv");
        let o = record(dir.path(), &out, script);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{script}: {stderr}");
        assert!(stderr.contains("no reads"), "{script}: {stderr}");
        assert!(!out.exists(), "{script}");
    }
}

/// A command that leaves a process running in the background (`sleep 60 &`) ends the
/// recording a grace period after it exits, with its own status (the recorder waited for
/// the background process, and Ctrl-C could not end it); a file it read and removed is
/// in the trace (it was dropped).
#[test]
fn record_ends_with_the_command_and_keeps_files_it_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("t.csv");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
    std::fs::write(dir.path().join("data/tmp.bin"), vec![1u8; 5_000]).expect("write");
    let started = std::time::Instant::now();
    let o = record(
        dir.path(),
        &out,
        "sleep 60 >/dev/null 2>&1 & echo $! > bg.pid; cat data/f.bin data/tmp.bin >/dev/null; rm data/tmp.bin; exit 4",
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "waited {:?} for the background sleep: {stderr}",
        started.elapsed()
    );
    assert_eq!(o.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("background"), "{stderr}");
    let trace = std::fs::read_to_string(&out).expect("trace");
    assert!(trace.contains(",f.bin,0,10000,"), "{trace}");
    assert!(trace.contains(",tmp.bin,0,5000,5000"), "{trace}");
    // The background sleep is left running, untraced: end it.
    let bg = std::fs::read_to_string(dir.path().join("bg.pid")).expect("bg.pid");
    let bg: i32 = bg.trim().parse().expect("pid");
    // SAFETY: kill(2) of the sleep this test started.
    unsafe { libc::kill(bg, libc::SIGKILL) };
}

/// An --out in a missing directory, or naming a directory (found out only after the
/// command had run), is refused before the command runs.
#[test]
fn record_checks_out_before_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("outdir")).expect("mkdir");
    for out in [dir.path().join("missing/t.csv"), dir.path().join("outdir")] {
        let o = record(dir.path(), &out, "touch ran; cat data/f.bin >/dev/null");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("--out"), "{stderr}");
        assert!(
            !dir.path().join("ran").exists(),
            "{}: the command ran: {stderr}",
            out.display()
        );
    }
}

/// SIGTERM or SIGHUP to the recorder alone (`timeout`, a scheduler, a closed session)
/// stops the command as Ctrl-C does: passed on to it, the trace of what it read kept,
/// strace's temporary log removed. It killed the recorder only, leaving strace and the
/// command running, orphaned, and the log behind.
#[test]
fn a_terminated_recording_stops_its_command_and_keeps_its_trace() {
    use std::time::{Duration, Instant};
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("tmp")).expect("mkdir");
        std::fs::write(dir.path().join("data/f.bin"), vec![7u8; 10_000]).expect("write data");
        let out = dir.path().join("t.csv");
        let tag = format!("strata-record-test-{}-{sig}", std::process::id());
        let mut child = Command::new(strata())
            .current_dir(dir.path())
            .env("TMPDIR", dir.path().join("tmp"))
            .args(["trace", "record", "--root", "data", "--out"])
            .arg(&out)
            .args(["--", "sh", "-c"])
            .arg(format!(
                "cat data/f.bin >/dev/null; touch started; sleep 30; : {tag}"
            ))
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn strata");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !dir.path().join("started").exists() {
            assert!(Instant::now() < deadline, "the command never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, sig) };
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                break s;
            }
            assert!(Instant::now() < deadline, "no exit after signal {sig}");
            std::thread::sleep(Duration::from_millis(20));
        };
        let orphans = processes_naming(&tag);
        for &pid in &orphans {
            // SAFETY: kill(2) on a process this test started (its command line has the tag).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut stderr);
        }
        assert!(
            orphans.is_empty(),
            "signal {sig}: left running: {orphans:?}"
        );
        assert_eq!(status.code(), Some(128 + sig), "signal {sig}: {stderr}");
        let trace = std::fs::read_to_string(&out).expect("the trace is written");
        assert!(trace.contains("f.bin"), "{trace}");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("tmp"))
            .expect("tmp")
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .expect("tmp entries");
        assert!(left.is_empty(), "signal {sig}: strace's log left: {left:?}");
    }
}

/// Processes whose command line contains `tag`.
fn processes_naming(tag: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(tag)
                .then_some(pid)
        })
        .collect()
}

/// Ctrl-C in a terminal interrupts the whole foreground group: the command ends, and the
/// recorder keeps the trace of what it read (it was killed with the command, keeping
/// nothing, and a temporary strace log was left behind).
#[test]
fn an_interrupted_recording_keeps_its_trace() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
    std::fs::write(dir.path().join("data/f.bin"), vec![7u8; 10_000]).expect("write data");
    let out = dir.path().join("t.csv");
    // Its own process group, as a shell's foreground job: `kill -INT 0` is the Ctrl-C.
    let o = Command::new(strata())
        .current_dir(dir.path())
        .args(["trace", "record", "--root", "data", "--out"])
        .arg(&out)
        .args([
            "--",
            "sh",
            "-c",
            "cat data/f.bin >/dev/null; kill -INT 0; sleep 30",
        ])
        .process_group(0)
        .output()
        .expect("run strata");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(128 + libc::SIGINT), "{stderr}");
    let trace = std::fs::read_to_string(&out).expect("the trace is written");
    assert!(trace.contains("f.bin"), "{trace}");
}

/// A daemon whose stdout and stderr cannot be written (its log a file on a full disk:
/// here /dev/full, ENOSPC on every write) keeps serving and stops cleanly on SIGTERM.
/// println!/eprintln! and the log's own error report panic on such a write (black-box
/// finding: a background mount died once its cache disk, holding mount.log, filled).
#[test]
fn a_daemon_survives_output_it_cannot_write() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let full = || std::fs::OpenOptions::new().write(true).open("/dev/full");
    let mut child = Command::new(strata())
        .env("RUST_LOG", "debug")
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "64MiB",
            "--disk",
            "0",
        ])
        .arg("--admin")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .stdout(full().expect("/dev/full"))
        .stderr(full().expect("/dev/full"))
        .spawn()
        .expect("spawn strata serve");
    let metrics = || -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        Some(body)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut answered = 0;
    while answered < 5 {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the daemon exited ({status:?}) writing to a full disk");
        }
        assert!(Instant::now() < deadline, "the daemon never answered");
        match metrics() {
            Some(b) if b.starts_with("HTTP/1.1 200") => answered += 1,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    stops_cleanly_on_sigterm(&mut child);
}

/// Black-box finding (round 14): under a file-size limit (`ulimit -f`, passed on to job
/// scripts by batch schedulers) below the KV arena's 256 MiB, `strata serve` died of
/// SIGXFSZ sizing the arena, with nothing logged (and a mount died the same way writing
/// a file past the limit). The daemon ignores SIGXFSZ: it starts and serves.
#[test]
fn a_file_size_limit_does_not_kill_the_daemon() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(strata());
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--memory",
        "64MiB",
        "--disk",
        "0",
    ])
    .arg("--cache-dir")
    .arg(dir.path().join("cache"))
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    // SAFETY: setrlimit is async-signal-safe; the child only execs after it.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn strata serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let ready = loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(l) if l == "ready" => break true,
            Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break false,
        }
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the daemon died under a 1 MiB file-size limit: {status:?}");
        }
        assert!(Instant::now() < deadline, "never ready");
    };
    assert!(ready, "the daemon said ready");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "still serving"
    );
    stops_cleanly_on_sigterm(&mut child);
}

/// Sends `child` SIGTERM and asserts it exits cleanly within 30 s.
fn stops_cleanly_on_sigterm(child: &mut std::process::Child) {
    use std::time::{Duration, Instant};
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "clean stop: {status:?}");
}

/// A trace of two reads in `dir` (`t.csv`), for commands that replay one.
fn two_read_trace(dir: &std::path::Path) -> PathBuf {
    let trace = dir.join("t.csv");
    std::fs::write(
        &trace,
        "ts_ns,job,path,offset,len,size\n0,j,a.bin,0,100,100\n10,j,b.bin,0,100,100\n",
    )
    .expect("write trace");
    trace
}

/// Black-box finding (round 16b): `strata stats --watch` exited at the first reset
/// connection of a full admin listener. A redraw is asked twice more at once, then
/// reported on stderr and tried again at the next interval.
#[test]
fn stats_watch_survives_a_failed_fetch() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let body = serde_json::to_string(&strata_tools::admin::DaemonStats::default()).expect("json");
    let server = std::thread::spawn(move || {
        // Answers, resets three connections (a redraw and its two quick retries),
        // answers again.
        for n in 0..5 {
            let (mut c, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            if (1..=3).contains(&n) {
                continue; // closed unanswered, as a connection made room for another
            }
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let mut child = Command::new(strata())
        .args(["stats", "--json", "--watch", "0.2", "--endpoint", &addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    server.join().expect("server");
    // Time to print the last view and report the fetches that now find no server.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let still_running = child.try_wait().expect("wait").is_none();
    let _ = child.kill();
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(still_running, "exited: {stderr}");
    assert_eq!(stdout.lines().count(), 2, "two views: {stdout}");
    assert!(stderr.contains("trying again"), "{stderr}");
}
