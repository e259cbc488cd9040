//! `strata mount` as a user runs it: detached (no `--foreground`), through the real
//! kernel. What the user sees when it works, and when it cannot: the detached daemon's
//! own error, not "exited with status 1".

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn strata() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_strata"))
}

fn mount(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new("timeout")
        .arg("90")
        .arg(strata())
        .arg("mount")
        .args(args)
        .output()
        .expect("run strata mount")
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn unmount(mnt: &Path) {
    let _ = Command::new("timeout")
        .args(["30", "fusermount3", "-u"])
        .arg(mnt)
        .status();
}

/// The mount comes up detached, at a mountpoint whose name holds a space (the mount
/// table escapes it: the command once waited 60 s for it, then killed its daemon), and
/// the detached daemon outlives the command that started it. A second mount at the same
/// point is refused by name, and the daemon ends when its mount is removed.
#[test]
fn a_detached_mount_appears_is_refused_twice_and_ends_with_its_unmount() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir src");
    std::fs::write(src.join("hello.txt"), b"hello through the mount").expect("write");
    let mnt = dir.path().join("my data");
    std::fs::create_dir_all(&mnt).expect("mkdir mnt");
    let url = format!("file://{}", src.display());

    let out = mount(&[url.as_ref(), mnt.as_os_str()]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("mounted"), "{said}");
    let read = std::fs::read(mnt.join("hello.txt"));
    let again = mount(&[url.as_ref(), mnt.as_os_str()]);
    unmount(&mnt);
    assert_eq!(read.expect("read").as_slice(), b"hello through the mount");
    let said_again = text(&again);
    assert!(!again.status.success(), "{said_again}");
    assert!(
        said_again.contains("already a FUSE mount point"),
        "{said_again}"
    );
    // The daemon (pid in "mounted ... (pid N)") leaves once its mount is gone.
    let pid: i32 = said
        .rsplit("(pid ")
        .next()
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {said}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    // SAFETY: signal 0 only checks that the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 {
        assert!(Instant::now() < deadline, "daemon {pid} outlived its mount");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A daemon that fails before its mount appears: the command prints the daemon's
/// error (here, the store folder that does not exist), with or without a cache dir.
#[test]
fn a_daemon_that_cannot_mount_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).expect("mkdir mnt");
    let missing = dir.path().join("no-such-folder");
    let url = format!("file://{}", missing.display());
    let cache = dir.path().join("cache");
    for extra in [vec![], vec!["--cache-dir".as_ref(), cache.as_os_str()]] {
        let mut args = vec![url.as_ref(), mnt.as_os_str()];
        args.extend(extra.iter().copied());
        let started = Instant::now();
        let out = mount(&args);
        let said = text(&out);
        assert!(!out.status.success(), "{said}");
        assert!(said.contains("no-such-folder"), "{said}");
        assert!(said.contains("is not a directory"), "{said}");
        assert!(started.elapsed() < Duration::from_secs(30), "{said}");
    }
}

/// A store folder (with `files`), a mountpoint and a cache dir under one temp dir.
struct Layout {
    _dir: tempfile::TempDir,
    src: PathBuf,
    mnt: PathBuf,
    cache: PathBuf,
    /// The store's URL (`file://SRC`).
    url: String,
}

impl Layout {
    fn new(files: &[(&str, &[u8])]) -> Layout {
        let dir = tempfile::tempdir().expect("tempdir");
        let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
        std::fs::create_dir_all(&src).expect("mkdir src");
        std::fs::create_dir_all(&mnt).expect("mkdir mnt");
        for (name, data) in files {
            std::fs::write(src.join(name), data).expect("write");
        }
        Layout {
            url: format!("file://{}", src.display()),
            cache: dir.path().join("cache"),
            _dir: dir,
            src,
            mnt,
        }
    }
}

/// Fuse mounts at `mnt` in this namespace's mount table (escapes decoded).
fn mounts_at(mnt: &Path) -> usize {
    let want = mnt.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(want.as_str()) && l.contains(" - fuse"))
        .count()
}

/// `strata mount URL MNT --foreground --cache-dir CACHE EXTRA...` as its own process
/// group (a kill reaches the daemon only), once its mount appears.
fn foreground_mount(url: &str, mnt: &Path, cache: &Path, extra: &[&str]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let daemon = Command::new(strata())
        .args(["mount", url])
        .arg(mnt)
        .args(extra)
        .args(["--foreground", "--cache-dir"])
        .arg(cache)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start the mount");
    let deadline = Instant::now() + Duration::from_secs(60);
    while mounts_at(mnt) == 0 {
        assert!(Instant::now() < deadline, "mount did not appear");
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon
}

/// Crash finding: with auto_unmount, a daemon killed by -9 left a plain local
/// directory under the jobs using it; a checkpoint saved there "succeeded" on local
/// disk, never reached the store, and the next mount hid it. Now the dead mount fails
/// calls with ENOTCONN (nothing lands beside the store), and the next `strata mount`
/// there detaches it and mounts in its place (not on top of it).
#[test]
fn a_killed_mount_fails_calls_until_the_next_mount_replaces_it() {
    let l = Layout::new(&[("a.txt", b"first")]);
    let (src, mnt) = (l.src.clone(), l.mnt.clone());
    let url = l.url.clone();
    let cache = l.cache.clone();
    let mut daemon = foreground_mount(&url, &mnt, &cache, &["--allow-writes"]);
    assert_eq!(std::fs::read(mnt.join("a.txt")).expect("read"), b"first");
    daemon.kill().expect("kill -9");
    daemon.wait().expect("reap");

    let saved = std::fs::write(mnt.join("ckpt.bin"), b"checkpoint");
    let e = saved.expect_err("a save into a dead mount fails");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    assert!(!src.join("ckpt.bin").exists());

    let out = mount(&[url.as_ref(), mnt.as_os_str()]);
    let said = text(&out);
    let read = std::fs::read(mnt.join("a.txt"));
    let stacked = mounts_at(&mnt);
    unmount(&mnt);
    assert!(out.status.success(), "{said}");
    assert_eq!(read.expect("read after the restart"), b"first");
    assert_eq!(stacked, 1, "the dead mount was replaced, not stacked on");
    assert_eq!(mounts_at(&mnt), 0);
}

/// Black-box finding: `strata mount` at the mountpoint of a stopped daemon hung for
/// good (its first `statfs` of the mountpoint never answered, SIGTERM pending). Now it
/// says what is there, within seconds, and leaves the stopped daemon's mount alone.
#[test]
fn a_mount_over_a_stopped_daemons_mount_says_so_instead_of_hanging() {
    let l = Layout::new(&[("a.txt", b"first")]);
    let mut daemon = foreground_mount(&l.url, &l.mnt, &l.cache, &[]);
    let pid = daemon.id() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let other_cache = l.cache.with_extension("other");
    let started = Instant::now();
    let out = Command::new("timeout")
        .arg("60")
        .arg(strata())
        .args(["mount", &l.url])
        .arg(&l.mnt)
        .arg("--cache-dir")
        .arg(&other_cache)
        .output()
        .expect("run strata mount");
    let took = started.elapsed();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let said = text(&out);
    let read = std::fs::read(l.mnt.join("a.txt"));
    unmount(&l.mnt);
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(!out.status.success(), "{said}");
    assert_ne!(out.status.code(), Some(124), "timed out: {said}");
    assert!(took < Duration::from_secs(30), "{took:?}: {said}");
    assert!(said.contains("has not answered"), "{said}");
    assert_eq!(read.expect("the stopped daemon serves again"), b"first");
}

/// Crash finding: kill -9 while a large file was written through the mount left the
/// upload behind in the store, for good (a multipart upload's parts in a bucket; in a
/// local directory store, object_store's temporary `NAME#N` file beside the data). The
/// mount records its uploads in progress; the next mount at that point aborts those
/// its predecessor left.
#[test]
fn an_upload_a_kill_cut_off_is_cleaned_by_the_next_mount() {
    use std::io::Write;
    let l = Layout::new(&[]);
    let (src, mnt) = (l.src.clone(), l.mnt.clone());
    let url = l.url.clone();
    let cache = l.cache.clone();
    let mut daemon = foreground_mount(&url, &mnt, &cache, &["--allow-writes"]);
    // Written in order past the streaming threshold (16 MiB): its upload starts while
    // the file is still open.
    let temp = src.join("big.bin#1");
    let mut f = std::fs::File::create(mnt.join("big.bin")).expect("create");
    let chunk = vec![3u8; 1 << 20];
    for _ in 0..24 {
        f.write_all(&chunk).expect("write");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !temp.exists() {
        assert!(Instant::now() < deadline, "the upload did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.kill().expect("kill -9");
    daemon.wait().expect("reap");
    drop(f);
    assert!(temp.exists(), "what the crash leaves");

    let out = mount(&[
        url.as_ref(),
        mnt.as_os_str(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
    ]);
    let said = text(&out);
    let deadline = Instant::now() + Duration::from_secs(30);
    while temp.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = temp.exists();
    unmount(&mnt);
    assert!(out.status.success(), "{said}");
    assert!(!left, "the next mount removed the interrupted upload");
    assert!(!src.join("big.bin").exists(), "no object appeared");
}

/// Black-box finding: SIGHUP (a closed terminal, `kill -HUP`) ended the daemon at once
/// (exit 129) and left its mount failing with ENOTCONN; it now stops as SIGTERM does:
/// the mount goes, the exit is clean.
#[test]
fn sighup_stops_the_daemon_and_unmounts() {
    let l = Layout::new(&[("a.txt", b"x")]);
    let mnt = l.mnt.clone();
    let mut daemon = foreground_mount(&l.url, &mnt, &l.cache, &[]);
    // SIGUSR1/2 mean nothing to the daemon (black-box finding: their default action
    // ended it, the mount left failing ENOTCONN).
    for sig in [libc::SIGUSR1, libc::SIGUSR2] {
        // SAFETY: signalling the child this test started.
        assert_eq!(unsafe { libc::kill(daemon.id() as i32, sig) }, 0);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        daemon.try_wait().expect("wait").is_none(),
        "USR1/USR2 ignored"
    );
    assert_eq!(
        std::fs::read(mnt.join("a.txt")).expect("still served"),
        b"x"
    );
    let status = stop_with(&mut daemon, libc::SIGHUP, &mnt);
    let left = mounts_at(&mnt);
    if left > 0 {
        unmount(&mnt);
    }
    assert!(status.success(), "{status:?}");
    assert_eq!(left, 0, "the mount went with the daemon");
}

/// Sends `signal` to `daemon` and waits (30 s at most) for it to exit.
fn stop_with(
    daemon: &mut std::process::Child,
    signal: libc::c_int,
    mnt: &Path,
) -> std::process::ExitStatus {
    // SAFETY: signalling the child this test started.
    assert_eq!(unsafe { libc::kill(daemon.id() as i32, signal) }, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = daemon.try_wait().expect("wait") {
            return s;
        }
        if Instant::now() > deadline {
            let _ = daemon.kill();
            unmount(mnt);
            panic!("the daemon did not stop on signal {signal}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Crash finding: SIGTERM while a job held a file open in a writable mount detached the
/// busy mount; the job's next save by path then "succeeded" in the bare local
/// directory, never reached the store, and the next mount hid it. Now the daemon
/// stops cleanly and leaves the busy mount failing with ENOTCONN, as a crash does, and
/// the next `strata mount` there replaces it.
#[test]
fn a_stop_while_files_are_open_leaves_no_local_directory_to_write_into() {
    let l = Layout::new(&[("a.txt", b"first")]);
    let (src, mnt) = (l.src.clone(), l.mnt.clone());
    let url = l.url.clone();
    let cache = l.cache.clone();
    let mut daemon = foreground_mount(&url, &mnt, &cache, &["--allow-writes"]);
    let held = std::fs::File::open(mnt.join("a.txt")).expect("open");
    let status = stop_with(&mut daemon, libc::SIGTERM, &mnt);

    let saved = std::fs::write(mnt.join("ckpt.bin"), b"checkpoint");
    drop(held);
    let still_mounted = mounts_at(&mnt);
    let out = mount(&[url.as_ref(), mnt.as_os_str()]);
    let said = text(&out);
    let read = std::fs::read(mnt.join("a.txt"));
    let listed = std::fs::read_dir(&mnt).map(|d| d.count());
    let stacked = mounts_at(&mnt);
    unmount(&mnt);
    assert!(status.success(), "{status:?}");
    let e = saved.expect_err("a save into the stopped mount fails");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    assert_eq!(still_mounted, 1, "the busy mount stays until replaced");
    assert!(!src.join("ckpt.bin").exists());
    assert!(out.status.success(), "{said}");
    assert_eq!(read.expect("read after the restart"), b"first");
    assert_eq!(listed.expect("list"), 1, "nothing but the store's file");
    assert_eq!(stacked, 1, "the dead mount was replaced, not stacked on");
    assert!(
        std::fs::read_dir(&mnt)
            .expect("list the bare dir")
            .next()
            .is_none(),
        "nothing was written into the local directory"
    );
}

/// Black-box finding: every Python open() on the mount (isatty asks the file for
/// TCGETS) added a 3-line "[Not Implemented] ioctl" warning to `<cache>/mount.log`, so a
/// data loader's opens grew the log without bound. Such requests are answered as a
/// local file system without them answers, and nothing is logged per call.
#[test]
fn opens_that_ask_for_a_terminal_leave_the_log_alone() {
    use std::os::fd::AsRawFd;
    let l = Layout::new(&[("a.txt", b"x")]);
    let (src, mnt) = (l.src.clone(), l.mnt.clone());
    let cache = l.cache.clone();
    let out = mount(&[
        format!("file://{}", src.display()).as_ref(),
        mnt.as_os_str(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
        "--allow-writes".as_ref(),
    ]);
    let said = text(&out);
    let log = cache.join("mount.log");
    let size = || std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let f = std::fs::File::open(mnt.join("a.txt"));
    let before = size();
    let mut answers = Vec::new();
    if let Ok(f) = &f {
        for _ in 0..200 {
            // SAFETY: a valid descriptor; isatty only asks.
            let tty = unsafe { libc::isatty(f.as_raw_fd()) };
            answers.push((tty, std::io::Error::last_os_error().raw_os_error()));
        }
    }
    let dir_synced = std::fs::File::open(&mnt).and_then(|d| d.sync_all());
    let linked = std::fs::hard_link(mnt.join("a.txt"), mnt.join("b.txt"));
    std::thread::sleep(Duration::from_millis(300));
    let grown = size() - before;
    drop(f);
    unmount(&mnt);
    assert!(out.status.success(), "{said}");
    assert_eq!(answers.len(), 200);
    assert!(
        answers.iter().all(|a| *a == (0, Some(libc::ENOTTY))),
        "{:?}",
        &answers[..3]
    );
    dir_synced.expect("fsync of a directory");
    assert_eq!(
        linked.expect_err("no links").raw_os_error(),
        Some(libc::EPERM)
    );
    assert!(grown < 512, "the log grew {grown} bytes");
}

/// Black-box finding: a cache dir inside the store or inside the mountpoint was
/// refused, but only after it was created and initialised (blocks/, daemon.lock,
/// mount.log...), so the store then showed a `cache/` folder to every mount of it.
/// The refusal now comes first: nothing is made.
#[test]
fn a_cache_dir_refused_inside_the_store_or_the_mountpoint_is_not_created() {
    let l = Layout::new(&[("x", b"hi")]);
    for cache in [l.src.join("cache"), l.mnt.join("cache")] {
        for extra in [None, Some("--foreground")] {
            let mut args = vec![
                l.url.as_ref(),
                l.mnt.as_os_str(),
                "--cache-dir".as_ref(),
                cache.as_os_str(),
            ];
            args.extend(extra.map(std::ffi::OsStr::new));
            let out = mount(&args);
            let said = text(&out);
            let made = cache.exists();
            if mounts_at(&l.mnt) > 0 {
                unmount(&l.mnt);
            }
            assert!(!out.status.success(), "{said}");
            assert!(said.contains("is inside the"), "{said}");
            assert!(!made, "{} was created: {said}", cache.display());
        }
    }
}

/// The pids of processes whose command line names `path`.
fn processes_naming(path: &Path) -> Vec<i32> {
    let want = path.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&want))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Black-box finding: Ctrl-C on `strata mount` while its start waited on a store that
/// does not answer was ignored (the daemon runs in its own session, out of the
/// terminal's reach; a script's background job even ignores SIGINT), and 10 s later
/// the command said "mounted" and exited 0. Now the signal cancels the start: the
/// daemon is stopped, nothing is mounted, the command exits 130.
#[test]
fn ctrl_c_while_the_daemon_starts_cancels_the_mount() {
    use std::os::unix::process::CommandExt;
    let l = Layout::new(&[]);
    // Takes connections and never answers: the start waits 10 s for the first listing.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let mut cmd = Command::new(strata());
    cmd.args(["mount", "s3://bkt/x"])
        .arg(&l.mnt)
        .args(["--endpoint", &format!("http://127.0.0.1:{port}")])
        .args(["--allow-http", "--cache-dir"])
        .arg(&l.cache)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec. SIGINT ignored, as a
    // script's background job inherits it.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("start strata mount");
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    let out = child.wait_with_output().expect("output");
    let said = text(&out);
    let mounted = mounts_at(&l.mnt);
    let daemons = processes_naming(&l.mnt);
    if mounted > 0 {
        unmount(&l.mnt);
    }
    for pid in &daemons {
        // SAFETY: the daemon this test's command started.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    drop(silent);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(128 + libc::SIGINT),
        "{said}"
    );
    assert!(took < Duration::from_secs(6), "took {took:?}: {said}");
    assert_eq!(mounted, 0, "nothing is mounted: {said}");
    assert!(daemons.is_empty(), "the daemon is gone: {daemons:?}");
    assert!(!said.contains("mounted s3://"), "{said}");
}

/// Black-box finding: a second `strata mount` on a cache dir in use, refused as it
/// should be, first truncated the running daemon's `mount.log` (its start-up record
/// gone, its next line written after a run of NULs at its old offset).
#[test]
fn a_refused_second_mount_leaves_the_running_daemons_log_alone() {
    let l = Layout::new(&[("f", b"x")]);
    let mnt2 = l.mnt.with_file_name("mnt2");
    std::fs::create_dir_all(&mnt2).expect("mkdir");
    let first = mount_detached(&l.url, &l.mnt, &l.cache, &[]);
    assert!(first.status.success(), "{}", text(&first));
    let log = l.cache.join("mount.log");
    let before = std::fs::read(&log).expect("the daemon's log");
    let second = mount_detached(&l.url, &mnt2, &l.cache, &[]);
    let after = std::fs::read(&log).expect("the daemon's log");
    unmount(&l.mnt);
    let said = text(&second);
    assert!(!second.status.success(), "{said}");
    assert!(said.contains("in use by another strata daemon"), "{said}");
    assert!(!before.is_empty());
    assert!(
        after.starts_with(&before),
        "the running daemon's log was rewritten:\n{}",
        String::from_utf8_lossy(&after)
    );
    assert!(!after.contains(&0), "NUL bytes in the log");
}

/// `strata mount URL MNT --cache-dir CACHE EXTRA...`, detached.
fn mount_detached(url: &str, mnt: &Path, cache: &Path, extra: &[&str]) -> std::process::Output {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        url.as_ref(),
        mnt.as_os_str(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
    ];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    mount(&args)
}

/// Black-box finding (security): a cache dir whose `mount.log` is a link (another
/// user's dir) had root's start truncate and write its error into the link's target,
/// before the dir was refused. The log is never opened through a link.
#[test]
fn a_mount_log_that_is_a_link_is_never_written_through() {
    let l = Layout::new(&[]);
    std::fs::create_dir_all(&l.cache).expect("mkdir");
    let victim = l.src.with_file_name("victim.conf");
    std::fs::write(&victim, b"ORIGINAL").expect("victim");
    std::os::unix::fs::symlink(&victim, l.cache.join("mount.log")).expect("link");
    let out = mount_detached(&l.url, &l.mnt, &l.cache, &[]);
    unmount(&l.mnt);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("mount.log"), "{}", text(&out));
    assert_eq!(std::fs::read(&victim).expect("victim"), b"ORIGINAL");
}

/// Black-box finding: a background mount with `--admin 127.0.0.1:0` listened on a port
/// it reported nowhere. Its log names the address.
#[test]
fn a_background_mounts_admin_address_is_in_its_log() {
    let l = Layout::new(&[]);
    let out = mount_detached(&l.url, &l.mnt, &l.cache, &["--admin", "127.0.0.1:0"]);
    let (cache, mnt) = (&l.cache, &l.mnt);
    let log = std::fs::read_to_string(cache.join("mount.log")).unwrap_or_default();
    unmount(mnt);
    assert!(out.status.success(), "{}", text(&out));
    let port = log
        .lines()
        .find(|l| l.contains("admin API listening"))
        .and_then(|l| l.rsplit("127.0.0.1:").next())
        .and_then(|p| p.trim().parse::<u16>().ok());
    assert!(port.is_some_and(|p| p > 0), "{log}");
    assert!(
        !log.contains('\x1b'),
        "no colour escapes in a log file: {log:?}"
    );
}

/// `foreground_mount` with the child's signal state set up by `setup` (run in the
/// child before exec) and its stdout/stderr on `log`.
fn foreground_mount_with(
    l: &Layout,
    log: std::process::Stdio,
    env: &[(&str, &str)],
    setup: fn() -> std::io::Result<()>,
) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(strata());
    cmd.args(["mount", &l.url])
        .arg(&l.mnt)
        .args(["--foreground", "--cache-dir"])
        .arg(&l.cache)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .process_group(0);
    // SAFETY: `setup` only calls async-signal-safe functions (signal, sigprocmask).
    unsafe { cmd.pre_exec(setup) };
    let daemon = cmd.spawn().expect("start the mount");
    let deadline = Instant::now() + Duration::from_secs(60);
    while mounts_at(&l.mnt) == 0 {
        assert!(Instant::now() < deadline, "mount did not appear");
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon
}

/// Black-box finding: with its stderr on a pipe nobody read, the daemon's log filled
/// the pipe and the FUSE thread writing a line blocked, then every request behind it.
/// Lines are written from a thread of their own and dropped when the queue is full.
#[test]
fn a_log_pipe_nobody_reads_never_holds_up_the_mount() {
    let l = Layout::new(&[("a.txt", b"served")]);
    let (reader, writer) = std::io::pipe().expect("pipe");
    {
        use std::os::fd::AsRawFd;
        // The smallest pipe (a page): a few debug lines fill it.
        // SAFETY: F_SETPIPE_SZ on a pipe this test owns.
        unsafe { libc::fcntl(writer.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
    }
    let mut daemon = foreground_mount_with(&l, writer.into(), &[("RUST_LOG", "debug")], || Ok(()));
    let mnt = l.mnt.clone();
    let reads = std::thread::spawn(move || {
        for i in 0..400 {
            // Fresh lookups and opens: each one logs at debug.
            let _ = std::fs::metadata(mnt.join(format!("missing{i}")));
            assert_eq!(std::fs::read(mnt.join("a.txt")).expect("read"), b"served");
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reads.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = reads.is_finished();
    if !done {
        // Let the daemon go: the reads then fail and the test reports the hang.
        drop(reader);
    }
    let status = stop_with(&mut daemon, libc::SIGTERM, &l.mnt);
    assert!(done, "reads hung behind the full log pipe");
    reads.join().expect("reads");
    assert!(status.success(), "{status:?}");
}

/// Black-box finding: `nohup strata mount --foreground` died of SIGHUP: the daemon put
/// its handler over the inherited SIG_IGN. A signal ignored at start stays ignored;
/// SIGTERM still stops it.
#[test]
fn a_hangup_ignored_at_start_stays_ignored() {
    let l = Layout::new(&[("a.txt", b"x")]);
    let mut daemon = foreground_mount_with(&l, std::process::Stdio::null(), &[], || {
        // SAFETY: signal() is async-signal-safe.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        Ok(())
    });
    // SAFETY: signalling the child this test started.
    assert_eq!(unsafe { libc::kill(daemon.id() as i32, libc::SIGHUP) }, 0);
    std::thread::sleep(Duration::from_millis(500));
    let alive = daemon.try_wait().expect("wait").is_none();
    let read = std::fs::read(l.mnt.join("a.txt"));
    let status = stop_with(&mut daemon, libc::SIGTERM, &l.mnt);
    assert!(alive, "SIGHUP ignored");
    assert_eq!(read.expect("still served"), b"x");
    assert!(status.success(), "{status:?}");
    assert_eq!(mounts_at(&l.mnt), 0);
}

/// Black-box finding: started with the stop signals blocked (a mask inherited across
/// exec), the daemon never saw SIGTERM; only SIGKILL ended it, leaving a dead mount.
#[test]
fn stop_signals_blocked_at_start_still_stop_the_daemon() {
    let l = Layout::new(&[("a.txt", b"x")]);
    let mut daemon = foreground_mount_with(&l, std::process::Stdio::null(), &[], || {
        // SAFETY: sigset operations on a local set, then sigprocmask (async-signal-safe).
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        Ok(())
    });
    let status = stop_with(&mut daemon, libc::SIGTERM, &l.mnt);
    assert!(status.success(), "{status:?}");
    assert_eq!(mounts_at(&l.mnt), 0);
}

/// Black-box finding: a mountpoint that does not exist was "not a directory".
#[test]
fn a_missing_mountpoint_is_named_missing() {
    let l = Layout::new(&[]);
    let missing = l.mnt.join("nope");
    let out = mount_detached(&l.url, &missing, &l.cache, &[]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("does not exist"), "{said}");
}

/// Black-box finding: a restart emptied `mount.log`, and with it the log of the run
/// that died. The last run's log is kept as `mount.log.1`.
#[test]
fn a_restart_keeps_the_last_runs_log() {
    let l = Layout::new(&[("f", b"x")]);
    let first = mount_detached(&l.url, &l.mnt, &l.cache, &[]);
    assert!(first.status.success(), "{}", text(&first));
    unmount(&l.mnt);
    let log = l.cache.join("mount.log");
    // The first daemon's log, once it has ended (it exits when unmounted).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !processes_naming(&l.cache).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = std::fs::read_to_string(&log).expect("first log");
    let second = mount_detached(&l.url, &l.mnt, &l.cache, &[]);
    unmount(&l.mnt);
    assert!(second.status.success(), "{}", text(&second));
    let kept = std::fs::read_to_string(l.cache.join("mount.log.1")).expect("kept");
    assert!(!before.is_empty());
    assert!(kept.starts_with(&before), "{kept}");
}

/// Black-box finding: `strata mount` killed (SIGKILL) while its daemon started: the
/// daemon mounted 7 s later anyway. Until it is ready it stops with the command.
#[test]
fn a_mount_command_killed_during_the_start_leaves_no_mount() {
    // A store that accepts connections and never answers: the start waits on it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", silent.local_addr().expect("addr"));
    let l = Layout::new(&[]);
    let mut cmd = Command::new(strata());
    cmd.args(["mount", "s3://bucket"])
        .arg(&l.mnt)
        .args(["--endpoint", &endpoint, "--allow-http", "--cache-dir"])
        .arg(&l.cache)
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut starter = cmd.spawn().expect("start");
    std::thread::sleep(Duration::from_secs(2));
    starter.kill().expect("kill -9");
    starter.wait().expect("reap");
    // The daemon's start gives up on the store after 10 s and would mount then.
    std::thread::sleep(Duration::from_secs(13));
    let mounted = mounts_at(&l.mnt);
    let left = processes_naming(&l.cache);
    if mounted > 0 {
        unmount(&l.mnt);
    }
    assert_eq!(mounted, 0, "nothing mounted after the command was killed");
    assert!(left.is_empty(), "daemon still running: {left:?}");
}

/// Black-box finding: `--allow-writes` whose staging folder could not be made (its
/// name too long for the file system) mounted read-only, said "mounted" and exited 0;
/// every write then failed EROFS. The start fails instead.
#[test]
fn a_writable_mount_whose_staging_cannot_be_used_is_refused() {
    let l = Layout::new(&[("f", b"x")]);
    std::fs::create_dir_all(&l.cache).expect("mkdir");
    // A file where the staging folders go.
    std::fs::write(l.cache.join("staging"), b"not a folder").expect("write");
    let out = mount_detached(&l.url, &l.mnt, &l.cache, &["--allow-writes"]);
    let mounted = mounts_at(&l.mnt);
    if mounted > 0 {
        unmount(&l.mnt);
    }
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("staging folder"), "{said}");
    assert_eq!(mounted, 0, "not mounted read-only in its place");
}

/// Black-box finding (round 15b): `nohup strata mount ...` (detached): the starting
/// command caught SIGHUP, so its daemon started with it at default and stopped on it.
/// A signal ignored when the command started stays ignored in its daemon.
#[test]
fn a_detached_daemon_keeps_the_hangup_its_starter_ignored() {
    use std::os::unix::process::CommandExt;
    let l = Layout::new(&[("a.txt", b"x")]);
    let mut cmd = Command::new(strata());
    cmd.args(["mount", &l.url])
        .arg(&l.mnt)
        .arg("--cache-dir")
        .arg(&l.cache);
    // SAFETY: signal() is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        })
    };
    let out = cmd.output().expect("run strata mount");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let pid: i32 = said
        .rsplit("(pid ")
        .next()
        .and_then(|p| p.split(')').next())
        .and_then(|p| p.parse().ok())
        .expect("the daemon's pid");
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(500));
    let read = std::fs::read(l.mnt.join("a.txt"));
    unmount(&l.mnt);
    assert_eq!(read.expect("still served after SIGHUP"), b"x");
}

/// Black-box finding (round 15b): with stdout and stderr a terminal nobody read, SIGTERM
/// unmounted and the daemon never exited: the log writer was blocked on the terminal,
/// and its guard, giving up, printed so to stdout, the same terminal. The daemon exits,
/// dropping the lines it could not write.
#[test]
fn a_terminal_nobody_reads_never_keeps_the_daemon_from_exiting() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let l = Layout::new(&[("a.txt", b"served")]);
    let (mut main, mut sub) = (0, 0);
    // SAFETY: openpty writes two descriptors this test then owns.
    let rc = unsafe {
        libc::openpty(
            &mut main,
            &mut sub,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both descriptors were just opened for this test.
    let (main, sub) = unsafe { (OwnedFd::from_raw_fd(main), OwnedFd::from_raw_fd(sub)) };
    let tty = std::fs::File::from(sub);
    let mut daemon = Command::new(strata())
        .args(["mount", &l.url])
        .arg(&l.mnt)
        .args(["--foreground", "--cache-dir"])
        .arg(&l.cache)
        .env("RUST_LOG", "trace")
        .stdout(tty.try_clone().expect("dup"))
        .stderr(tty)
        .spawn()
        .expect("start the mount");
    let deadline = Instant::now() + Duration::from_secs(60);
    while mounts_at(&l.mnt) == 0 {
        assert!(Instant::now() < deadline, "mount did not appear");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Trace lines until the terminal's buffer is full (nobody reads `main`).
    let busy = Instant::now();
    while busy.elapsed() < Duration::from_secs(2) {
        assert_eq!(std::fs::read(l.mnt.join("a.txt")).expect("read"), b"served");
    }
    let status = stop_with(&mut daemon, libc::SIGTERM, &l.mnt);
    drop(main);
    assert!(status.success(), "{status:?}");
}

/// The FUSE connection's minor number of the mount at `mnt` (mountinfo's `0:NN`).
fn conn_of(mnt: &Path) -> Option<String> {
    let want = mnt.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(want.as_str()) && l.contains(" - fuse"))
        .and_then(|l| l.split(' ').nth(2))
        .and_then(|dev| dev.split(':').nth(1))
        .map(str::to_string)
}

/// Black-box finding: when the FUSE session ended with the mount still there (a read
/// of /dev/fuse failed with ENOMEM or EIO; here the connection is aborted, which ends it
/// alike), the daemon took it for an unmount from outside, exited 0 and left a dead
/// mount (ENOTCONN). Now it detaches the mount and exits with an error.
#[test]
fn a_failed_fuse_session_is_an_error_and_leaves_no_dead_mount() {
    let l = Layout::new(&[("a.txt", b"first")]);
    let mut daemon = foreground_mount(&l.url, &l.mnt, &l.cache, &[]);
    assert_eq!(std::fs::read(l.mnt.join("a.txt")).expect("read"), b"first");
    let conn = conn_of(&l.mnt).expect("the mount's connection");
    let abort = format!("/sys/fs/fuse/connections/{conn}/abort");
    if std::fs::write(&abort, "1").is_err() {
        // Minimal containers do not mount fusectl: mount it (the tests run as root,
        // as the FUSE tests need).
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "fusectl", "/sys/fs/fuse/connections"])
            .status();
        std::fs::write(&abort, "1").expect("abort the connection through fusectl");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = daemon.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "the daemon did not end");
        std::thread::sleep(Duration::from_millis(50));
    };
    let left = mounts_at(&l.mnt);
    if left > 0 {
        unmount(&l.mnt);
    }
    assert!(!status.success(), "exited {status:?}");
    assert_eq!(left, 0, "the dead mount was detached");
}

/// The pid in "mounted ... (pid N)".
fn pid_in(said: &str) -> i32 {
    said.rsplit("(pid ")
        .next()
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {said}"))
}

/// Black-box finding (round 21): a detached mount without `--cache-dir` that crashed
/// while a file was fsync'd leaves that file in its temp cache dir; the next start's
/// warning naming that dir went to the daemon's stderr, which a detached daemon hands
/// to no one (no mount.log without a cache dir). The command now prints its daemon's
/// start warnings.
#[test]
fn a_detached_mount_without_a_cache_dir_says_what_a_crash_left_in_its_temp_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, mnt, tmp) = (
        dir.path().join("src"),
        dir.path().join("mnt"),
        dir.path().join("tmp"),
    );
    for d in [&src, &mnt, &tmp] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let url = format!("file://{}", src.display());
    let detached = || {
        Command::new("timeout")
            .arg("90")
            .arg(strata())
            .args(["mount", &url])
            .arg(&mnt)
            .arg("--allow-writes")
            .env("TMPDIR", &tmp)
            .output()
            .expect("run strata mount")
    };
    let first = detached();
    let said = text(&first);
    assert!(first.status.success(), "{said}");
    let pid = pid_in(&said);
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(mnt.join("ckpt.bin")).expect("create");
        f.write_all(&[7u8; 123_456]).expect("write");
        f.sync_all().expect("fsync");
        // SAFETY: kill(2) of the daemon this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        // SAFETY: signal 0 only checks that the process exists.
        while unsafe { libc::kill(pid, 0) } == 0 {
            assert!(Instant::now() < deadline, "daemon {pid} outlived SIGKILL");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let second = detached();
    let said = text(&second);
    unmount(&mnt);
    assert!(second.status.success(), "{said}");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("kept the temp cache dir"),
        "the start's warning reaches the user: {said}"
    );
}

/// Round 21b: with `--cache-dir` the detached daemon's log is `mount.log`, and the
/// start's warnings stayed there ("the store did not answer", files fsync'd before a
/// crash still uploading). The command prints this start's warnings from it.
#[test]
fn a_detached_mount_with_a_cache_dir_prints_its_start_warnings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mnt, cache) = (dir.path().join("mnt"), dir.path().join("cache"));
    std::fs::create_dir_all(&mnt).expect("mkdir");
    // A closed port: the store does not answer, the mount goes ahead on the cache.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let out = Command::new("timeout")
        .arg("90")
        .arg(strata())
        .args(["mount", "s3://bucket/p"])
        .arg(&mnt)
        .arg("--cache-dir")
        .arg(&cache)
        .args([
            "--endpoint",
            &format!("http://127.0.0.1:{port}"),
            "--allow-http",
        ])
        .args(["--region", "us-east-1"])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .output()
        .expect("run strata mount");
    let said = text(&out);
    unmount(&mnt);
    assert!(out.status.success(), "{said}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("did not answer"),
        "the start's warning: {said}"
    );
    assert_eq!(
        err.matches("did not answer the mount's first listing")
            .count(),
        1,
        "this start's lines only: {said}"
    );
}
