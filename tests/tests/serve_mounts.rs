//! `strata serve`'s mounts through the real kernel: a strata.toml with a `[[mounts]]`
//! entry over a local directory of 200 files, loaded and run as `strata serve --config`
//! runs it (`StrataConfig::load`, then `strata_tools::daemon::run`), read in name order;
//! the admin API's stats (what `strata stats --json` prints) then show the mount's
//! predictors prefetched. Before the mount options were shared with `strata mount`, a
//! daemon mount had no predictors and this read showed `prefetch_fills: 0`.

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
    fn start(config: &Path, mnt: &Path, admin: String) -> Daemon {
        let cfg = StrataConfig::load(config).expect("config loads");
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

#[test]
fn a_mounts_entry_prefetches_files_read_in_name_order() {
    bounded(240, || {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("src");
        let data = src.join("data");
        std::fs::create_dir_all(&data).expect("mkdir");
        let name = |i: usize| format!("sample-{i:05}.bin");
        for i in 0..FILES {
            std::fs::write(data.join(name(i)), pattern(FILE_BYTES, i as u64)).expect("write");
        }
        let mnt = dir.path().join("mnt");
        let admin = format!("127.0.0.1:{}", free_port());
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
        let mut daemon = Daemon::start(&config, &mnt, admin);
        let before = daemon.stats().expect("stats");
        assert_eq!(before["engine"]["prefetch_fills"], 0, "nothing read yet");
        assert_eq!(before["mounts"].as_array().map(Vec::len), Some(1));

        // A data loader: list the directory, read every file whole in name order.
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

        let after = daemon.stats().expect("stats");
        let engine = &after["engine"];
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

        daemon.stop().expect("daemon stops cleanly");
        assert!(!is_mounted(&mnt), "unmounted at stop");
    });
}
