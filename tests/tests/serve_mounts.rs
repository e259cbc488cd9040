//! The daemon's mounts through the real kernel, over a local directory of 200 files
//! read in name order:
//! - a strata.toml with a `[[mounts]]` entry, loaded and run as `strata serve --config`
//!   runs it (`StrataConfig::load`, then `strata_tools::daemon::run`): the admin API's
//!   stats (what `strata stats --json` prints) show the mount's predictors prefetched.
//!   Before the mount options were shared with `strata mount`, a daemon mount had no
//!   predictors and this read showed `prefetch_fills: 0`;
//! - `strata mount`'s command line, parsed by the CLI and run by the same daemon:
//!   prefetches alike, and exits cleanly when the mount is removed from outside;
//! - with `policy = "lru"` the engine's access tracker still classifies the loader's
//!   streams, and `strata stats` (text and `--json`) names each stream's pattern and
//!   the test that decided it.

mod fuse_common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fuse_common::{bounded, is_mounted, pattern};
use strata_tools::config::StrataConfig;
use tokio_util::sync::CancellationToken;

const FILES: usize = 200;
const FILE_BYTES: usize = 256 << 10;

/// The daemon of one test: stopped, and its mount gone, on drop (also when the test
/// fails half-way).
struct Daemon {
    rt: tokio::runtime::Runtime,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    mnt: PathBuf,
    admin: String,
}

impl Daemon {
    fn start(cfg: StrataConfig, mnt: &Path, admin: String) -> Daemon {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let stop = CancellationToken::new();
        let task = rt.spawn(strata_tools::daemon::run(cfg, stop.clone()));
        let mut d = Daemon {
            rt,
            stop,
            task: Some(task),
            mnt: mnt.to_path_buf(),
            admin,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(is_mounted(mnt) && d.stats().is_ok()) {
            if let Some(t) = d.task.take_if(|t| t.is_finished()) {
                panic!("daemon exited at start: {:?}", d.rt.block_on(t));
            }
            assert!(Instant::now() < deadline, "daemon not up within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    /// `GET /stats` as JSON, exactly what `strata stats --json` prints.
    fn stats(&self) -> anyhow::Result<serde_json::Value> {
        let s = self
            .rt
            .block_on(strata_tools::admin::fetch_stats(&self.admin))?;
        Ok(serde_json::to_value(&s)?)
    }

    /// Stops the daemon; returns how it ended.
    fn stop(&mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match self
            .rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), task).await })
        {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => Err(anyhow::anyhow!("daemon task failed: {join}")),
            Err(_) => Err(anyhow::anyhow!("daemon did not stop within 30 s")),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.stop();
        if is_mounted(&self.mnt) {
            // Last resort so a failed test leaves no mount behind.
            let c = std::ffi::CString::new(self.mnt.as_os_str().as_encoded_bytes())
                .expect("path without NUL");
            // SAFETY: a valid NUL-terminated path; MNT_DETACH only detaches it.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

fn name(i: usize) -> String {
    format!("sample-{i:05}.bin")
}

/// Where one test's files live.
struct Scene {
    dir: tempfile::TempDir,
    /// The store root: `FILES` files of `FILE_BYTES` in `data/`.
    src: PathBuf,
    mnt: PathBuf,
    /// A free loopback address for the admin API.
    admin: String,
}

fn scene() -> Scene {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    let data = src.join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    for i in 0..FILES {
        std::fs::write(data.join(name(i)), pattern(FILE_BYTES, i as u64)).expect("write");
    }
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).expect("mkdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    Scene {
        src,
        mnt,
        admin: format!("127.0.0.1:{port}"),
        dir,
    }
}

/// A data loader: lists the directory, reads every file whole in name order, checks
/// the bytes.
fn read_in_name_order(mnt: &Path) {
    let mut names: Vec<String> = std::fs::read_dir(mnt.join("data"))
        .expect("list the mount")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), FILES);
    for (i, n) in names.iter().enumerate() {
        assert_eq!(n, &name(i));
        let got = std::fs::read(mnt.join("data").join(n)).expect("read through the mount");
        assert!(
            got == pattern(FILE_BYTES, i as u64),
            "{n}: bytes differ from the source"
        );
    }
}

/// `engine.prefetch_fills` and `engine.prefetch_bytes` of a `strata stats --json`.
fn assert_prefetched(stats: &serde_json::Value) {
    let engine = &stats["engine"];
    let fills = engine["prefetch_fills"]
        .as_u64()
        .expect("engine.prefetch_fills");
    assert!(
        fills > 0,
        "the daemon's mount prefetched nothing for a name-order read: {engine:#}"
    );
    assert!(
        engine["prefetch_bytes"].as_u64() > Some(0),
        "prefetch_bytes with the fills: {engine:#}"
    );
}

/// A user's strata.toml over the scene: store, caches, one mount with only its
/// mountpoint, no KV socket, the admin API; `extra_cache` goes into `[cache]`.
fn write_config(sc: &Scene, extra_cache: &str) -> PathBuf {
    let config = sc.dir.path().join("strata.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"file://{src}\"\n\n\
             [cache]\ndir = \"{cache}\"\nmemory = \"256MiB\"\ndisk = \"256MiB\"\n{extra_cache}\n\n\
             [kv]\nlisten = \"\"\n\n\
             [admin]\nlisten = \"{admin}\"\n\n\
             [[mounts]]\nmountpoint = \"{mnt}\"\n",
            src = sc.src.display(),
            cache = sc.dir.path().join("cache").display(),
            mnt = sc.mnt.display(),
            admin = sc.admin,
        ),
    )
    .expect("write config");
    config
}

#[test]
fn lru_policy_still_classifies_streams_and_stats_show_the_deciding_test() {
    bounded(240, || {
        let sc = scene();
        let config = write_config(&sc, "policy = \"lru\"");
        let cfg = StrataConfig::load(&config).expect("config loads");
        let daemon = Daemon::start(cfg, &sc.mnt, sc.admin.clone());
        read_in_name_order(&sc.mnt);
        let json = daemon.stats().expect("stats");
        let tiers = json["engine"]["tiers"].as_array().expect("tiers");
        assert!(!tiers.is_empty());
        let recent = json["engine"]["tracker"]["recent"]
            .as_array()
            .expect("engine.tracker.recent");
        let files = recent
            .iter()
            .find(|r| r["granularity"] == "files" && r["name"] == "data")
            .unwrap_or_else(|| panic!("no stream of the files in data/: {recent:#?}"));
        assert_eq!(files["pattern"], "sequential", "{files:#}");
        let decided = files["decided_by"].as_str().expect("decided_by");
        assert!(decided.contains("binomial"), "{decided}");
        assert!(files["job"].as_u64().is_some());
        // The human view shows the same.
        let stats = daemon
            .rt
            .block_on(strata_tools::admin::fetch_stats(&sc.admin))
            .expect("stats");
        let text = strata_tools::commands::stats::render(&sc.admin, &stats, None);
        let line = text
            .lines()
            .find(|l| l.contains("files") && l.contains("sequential"))
            .unwrap_or_else(|| panic!("no sequential files stream in:\n{text}"));
        assert!(line.contains("binomial"), "{line}");
    });
}

#[test]
fn a_writable_mounts_entry_uploads_files_and_the_stats_count_them() {
    bounded(240, || {
        let sc = scene();
        let config = write_config(&sc, "");
        let text = std::fs::read_to_string(&config).expect("config");
        std::fs::write(&config, format!("{text}allow_writes = true\n")).expect("config");
        let cfg = StrataConfig::load(&config).expect("config loads");
        let daemon = Daemon::start(cfg, &sc.mnt, sc.admin.clone());
        let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(sc.mnt.join("saved.bin"), &body).expect("write through the mount");
        // The store (a local directory here) has the object as soon as close returned.
        assert_eq!(
            std::fs::read(sc.src.join("saved.bin")).expect("in the store"),
            body
        );
        read_in_name_order(&sc.mnt);
        let json = daemon.stats().expect("stats");
        let st = &json["mounts"][0]["stats"];
        assert_eq!(st["writable"], true, "{st:#}");
        assert_eq!(st["uploads"], 1, "{st:#}");
        assert_eq!(st["upload_bytes"], 300_000, "{st:#}");
        assert_eq!(st["upload_failures"], 0, "{st:#}");
        assert!(st["reads"].as_u64().unwrap_or(0) > 0, "{st:#}");
        let stats = daemon
            .rt
            .block_on(strata_tools::admin::fetch_stats(&sc.admin))
            .expect("stats");
        let text = strata_tools::commands::stats::render(&sc.admin, &stats, None);
        assert!(text.contains("written: 1 files uploaded"), "{text}");
        let metrics = strata_tools::admin::render_metrics(&stats);
        let line = metrics
            .lines()
            .find(|l| l.starts_with("strata_mount_uploads_total{"))
            .unwrap_or_else(|| panic!("no per-mount upload counter in:\n{metrics}"));
        assert!(line.ends_with(" 1"), "{line}");
    });
}

#[test]
fn a_mounts_entry_prefetches_files_read_in_name_order() {
    bounded(240, || {
        let sc = scene();
        let (dir, src, mnt, admin) = (&sc.dir, &sc.src, &sc.mnt, sc.admin.clone());
        // A user's file: store, caches, a mount with nothing but its mountpoint (every
        // mount option at its default), the KV service on its Unix socket.
        let config = dir.path().join("strata.toml");
        std::fs::write(
            &config,
            format!(
                "[store]\nurl = \"file://{src}\"\n\n\
                 [cache]\ndir = \"{cache}\"\nmemory = \"256MiB\"\ndisk = \"256MiB\"\n\n\
                 [kv]\nlisten = \"\"\n\n\
                 [admin]\nlisten = \"{admin}\"\n\n\
                 [[mounts]]\nmountpoint = \"{mnt}\"\n",
                src = src.display(),
                cache = dir.path().join("cache").display(),
                mnt = mnt.display(),
            ),
        )
        .expect("write config");
        let cfg = StrataConfig::load(&config).expect("config loads");
        let mut daemon = Daemon::start(cfg, mnt, admin);
        let before = daemon.stats().expect("stats");
        assert_eq!(before["engine"]["prefetch_fills"], 0, "nothing read yet");
        assert_eq!(before["mounts"].as_array().map(Vec::len), Some(1));

        read_in_name_order(mnt);
        assert_prefetched(&daemon.stats().expect("stats"));

        daemon.stop().expect("daemon stops cleanly");
        assert!(!is_mounted(mnt), "unmounted at stop");
    });
}

#[test]
fn strata_mount_flags_run_the_same_mount_and_end_with_it() {
    use clap::Parser;
    use strata_tools::cli::{Cli, Command};
    bounded(240, || {
        let sc = scene();
        let (dir, src, mnt, admin) = (&sc.dir, &sc.src, &sc.mnt, sc.admin.clone());
        let url = format!("file://{}", src.display());
        let cache = dir.path().join("cache");
        let argv = [
            "strata",
            "mount",
            &url,
            mnt.to_str().expect("utf-8 path"),
            "--cache-dir",
            cache.to_str().expect("utf-8 path"),
            "--admin",
            &admin,
            "--foreground",
        ];
        let Command::Mount(args) = Cli::parse_from(argv).command else {
            panic!("parsed as another command");
        };
        let cfg = args.to_config();
        assert!(!cfg.kv.enabled, "strata mount runs no KV service");
        let mut daemon = Daemon::start(cfg, mnt, admin);
        read_in_name_order(mnt);
        assert_prefetched(&daemon.stats().expect("stats"));

        // Removed from outside: the daemon (no KV service) ends cleanly with its mount.
        let out = std::process::Command::new("timeout")
            .args(["30", "fusermount3", "-u"])
            .arg(mnt)
            .output()
            .expect("run fusermount3");
        assert!(out.status.success(), "fusermount3 -u: {out:?}");
        let task = daemon.task.take().expect("daemon task");
        let ended = daemon
            .rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(20), task).await });
        match ended {
            Ok(Ok(Ok(()))) => {}
            other => panic!("daemon did not end cleanly after the unmount: {other:?}"),
        }
        assert!(!is_mounted(mnt));
    });
}

/// Free bytes of the file system under `dir` (statvfs, as `df` counts them).
fn free_bytes(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path; `st` is written by statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_bavail as u64 * st.f_frsize as u64
}

/// A cache dir whose file system is smaller than the disk budget, filled by reads with
/// copies and blocks that can be made again: a file written through the mount takes
/// their room instead of failing with ENOSPC (black-box finding: 86 of 100 writes
/// failed on a cache filesystem full of the daemon's own copies).
#[test]
fn a_write_on_a_cache_filesystem_full_of_copies_takes_their_room() {
    bounded(240, || {
        let sc = scene();
        let cache = sc.dir.path().join("cache");
        std::fs::create_dir_all(&cache).expect("mkdir");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"])
            .arg(&cache)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs (the test needs root, as CI runs it)");
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&self.0)
                    .status();
            }
        }
        let _tmpfs = Unmount(cache.clone());
        let config = write_config(&sc, "");
        let text = std::fs::read_to_string(&config)
            .expect("config")
            .replace("memory = \"256MiB\"", "memory = \"16MiB\"")
            .replace("disk = \"256MiB\"", "disk = \"1GiB\"");
        std::fs::write(&config, format!("{text}allow_writes = true\n")).expect("config");
        let cfg = StrataConfig::load(&config).expect("config loads");
        let daemon = Daemon::start(cfg, &sc.mnt, sc.admin.clone());
        // 50 MiB read through a 32 MiB cache filesystem: it ends full.
        read_in_name_order(&sc.mnt);
        let body = pattern(4 << 20, 77);
        assert!(
            free_bytes(&cache) < body.len() as u64,
            "the reads left the cache filesystem with room: {} bytes free",
            free_bytes(&cache)
        );
        std::fs::write(sc.mnt.join("saved.bin"), &body).expect("write through the mount");
        assert!(
            std::fs::read(sc.src.join("saved.bin")).expect("in the store") == body,
            "the store holds what was written"
        );
        // What was evicted reads again, from the store.
        read_in_name_order(&sc.mnt);
        drop(daemon);
    });
}
