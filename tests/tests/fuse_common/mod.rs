//! Harness of the FUSE end-to-end tests: a source tree (local directory, or uploaded to
//! moto), a real kernel mount of it through `strata_fs::mount::spawn`, shell tools run
//! under `timeout`, and a guard that unmounts on drop (also when a test fails).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{BackingStore, CacheEngine, ObjectReader, RetryPolicy, StoreOptions};
use strata_fs::{CoreOptions, MountHandle, MountOptions};
use strata_tests::s3::MotoServer;

/// Small blocks so that modest files span many of them.
pub const BLOCK: u64 = 256 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Local,
    S3,
}

/// Deterministic, seed-dependent file contents (the tests compare what they wrote).
pub fn pattern(n: usize, seed: u64) -> Vec<u8> {
    strata_cache_core::testdata::xorshift_bytes(n, seed)
}

/// The source tree: files of every size class, nested directories, a wide directory.
pub fn source_files() -> Vec<(String, Vec<u8>)> {
    let mut v = vec![
        ("small.txt".to_string(), b"hello, strata\n".to_vec()),
        ("empty".to_string(), Vec::new()),
        (
            "big.bin".to_string(),
            pattern((5 * BLOCK + 4321) as usize, 1),
        ),
        ("exact.bin".to_string(), pattern((2 * BLOCK) as usize, 2)),
        ("dir/a.txt".to_string(), pattern(1000, 3)),
        (
            "dir/sub/b.bin".to_string(),
            pattern((BLOCK + 1) as usize, 4),
        ),
        ("dir/sub/deeper/c".to_string(), pattern(17, 5)),
        // Names object_store would percent-encode if built with `Path::from`: they must
        // be read under the key they are listed as.
        ("odd/ünïcødé name.txt".to_string(), pattern(300, 6)),
        ("odd/50%off #1 {a}.bin".to_string(), pattern(5000, 7)),
    ];
    for i in 0..150 {
        v.push((format!("wide/f{i:04}"), pattern(100 + i, 100 + i as u64)));
    }
    v
}

pub struct Fixture {
    // Field order = drop order: unmount first, then the runtime, then the servers/dirs.
    pub mount: Option<MountHandle>,
    pub rt: tokio::runtime::Runtime,
    pub faulty: Arc<FaultyStore>,
    pub store: BackingStore,
    pub src: tempfile::TempDir,
    pub mnt: tempfile::TempDir,
    pub moto: Option<MotoServer>,
}

impl Fixture {
    pub fn new(backend: Backend) -> Fixture {
        Self::with(backend, Duration::from_secs(60), retry_fast())
    }

    pub fn with(backend: Backend, ttl: Duration, retry: RetryPolicy) -> Fixture {
        Self::with_core(
            backend,
            CoreOptions {
                metadata_ttl: ttl,
                ..Default::default()
            },
            retry,
        )
    }

    pub fn with_core(backend: Backend, core: CoreOptions, retry: RetryPolicy) -> Fixture {
        // RUST_LOG=strata_fs=debug shows the mount's log in a failing test's output.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let src = tempfile::tempdir().expect("src dir");
        for (p, d) in source_files() {
            let path = src.path().join(&p);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, &d).expect("write source");
        }
        let (base, moto) = match backend {
            Backend::Local => {
                let url = format!("file://{}", src.path().display());
                (
                    BackingStore::from_url(&url, &StoreOptions::default()).expect("local store"),
                    None,
                )
            }
            Backend::S3 => {
                let server = MotoServer::start();
                server.create_bucket("data");
                let s = BackingStore::from_url("s3://data/ds", &server.store_options())
                    .expect("s3 store");
                rt.block_on(async {
                    for (p, d) in source_files() {
                        s.put(&p, Bytes::from(d)).await.expect("upload");
                    }
                });
                (s, Some(server))
            }
        };
        let faulty = Arc::new(FaultyStore::new(
            base.inner().clone(),
            FaultConfig::default(),
        ));
        let store = base.around(faulty.clone() as Arc<dyn ObjectStore>, retry);
        let engine = CacheEngine::builder()
            .tier(Arc::new(MemoryTier::new(256 << 20)))
            .build()
            .expect("engine");
        let reader = ObjectReader::new(engine, store.clone(), BLOCK).expect("reader");
        let mnt = tempfile::tempdir().expect("mountpoint");
        let opts = MountOptions {
            core,
            runtime: Some(rt.handle().clone()),
            fsname: format!("strata-test-{backend:?}"),
            ..Default::default()
        };
        let mount = strata_fs::spawn(reader, "", mnt.path(), opts).expect("mount");
        assert!(is_mounted(mnt.path()), "mounted");
        Fixture {
            mount: Some(mount),
            rt,
            faulty,
            store,
            src,
            mnt,
            moto,
        }
    }

    pub fn m(&self, rel: &str) -> PathBuf {
        self.mnt.path().join(rel)
    }

    pub fn s(&self, rel: &str) -> PathBuf {
        self.src.path().join(rel)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(m) = self.mount.take() {
            let _ = m.unmount();
        }
    }
}

pub fn retry_fast() -> RetryPolicy {
    RetryPolicy {
        attempts: 2,
        base_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_secs(1),
        attempt_timeout: Duration::from_secs(2),
        silent_pause: Duration::ZERO,
        ..RetryPolicy::default()
    }
}

pub fn is_mounted(path: &Path) -> bool {
    let p = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap_or("")))
}

/// Runs a shell command in `dir` under `timeout 60`; returns stdout (panics on failure).
pub fn sh(dir: &Path, cmd: &str) -> String {
    let out = Command::new("timeout")
        .args(["60", "bash", "-c", cmd])
        .current_dir(dir)
        .output()
        .expect("spawn shell");
    assert!(
        out.status.success(),
        "`{cmd}` in {} failed: {}\n{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `f` on a thread and fails the test if it takes longer than `secs`.
pub fn bounded<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(_) => panic!("test exceeded its {secs} s bound"),
    }
}
