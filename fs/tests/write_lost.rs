//! A write that fails to land on a full staging disk (a 1 MiB tmpfs: the test mounts
//! one, so it runs as root, as the FUSE tests do): the file is not uploaded torn.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{CacheEngine, ObjectReader};
use strata_fs::filesystem::ROOT_INO;
use strata_fs::{CoreOptions, FsCore, WriteOptions};

mod write_common;
use write_common::{part_store, stored, PartStore};

/// The tests here run one at a time: each mounts a tmpfs and fills it, and a run
/// beside another once failed a write it expected to land.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A tmpfs of `size` on `dir`, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs (the test needs root, as CI runs it)");
        Tmpfs(dir.to_path_buf())
    }

    fn resize(&self, size: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "remount");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A writable core staging under `dir` (files uploaded whole at the close) over an
/// in-memory store (no store faults here: the disk is what fails), and that store.
fn writable_core(dir: &std::path::Path) -> (Arc<FsCore>, Arc<dyn object_store::ObjectStore>) {
    let PartStore { mem, store, faulty } = part_store();
    drop(faulty);
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(16 << 20)))
        .build()
        .expect("engine");
    let reader = ObjectReader::new(engine, store, 64 << 10).expect("reader");
    let mut w = WriteOptions::new(dir.join("staging"));
    w.stream_from = u64::MAX;
    let core = Arc::new(FsCore::new(
        reader,
        "",
        CoreOptions {
            writes: Some(w),
            ..Default::default()
        },
    ));
    (core, mem)
}

#[tokio::test]
async fn a_file_missing_a_failed_write_is_not_uploaded_until_it_is_rewritten() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = Tmpfs::mount(dir.path(), "1m");
    let (core, mem) = writable_core(dir.path());
    let chunk = vec![7u8; 256 << 10];
    let run = async {
        let (_, fh) = core.create(ROOT_INO, "ckpt.bin", 0).await.expect("create");
        let mut failed_at = None;
        for i in 0..8u64 {
            if let Err(e) = core.write(fh, i * chunk.len() as u64, &chunk) {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                failed_at = Some(i);
                break;
            }
        }
        let failed_at = failed_at.expect("the 1 MiB disk fills");
        // A program that ignores the failed write and closes: the close fails with its
        // errno and nothing is stored, nor at the release.
        let e = core.close(fh, 0).await.expect_err("the close reports it");
        assert_eq!(e.errno(), libc::ENOSPC, "{e}");
        assert_eq!(stored(&mem, "ckpt.bin").await, None);
        core.release_write(fh).await;
        assert_eq!(stored(&mem, "ckpt.bin").await, None, "nor at the release");

        // Written again once there is room, the file is uploaded whole.
        let (_, fh) = core.create(ROOT_INO, "retry.bin", 0).await.expect("create");
        let at = failed_at * chunk.len() as u64;
        for i in 0..failed_at {
            core.write(fh, i * chunk.len() as u64, &chunk)
                .expect("write");
        }
        core.write(fh, at, &chunk).expect_err("the disk is full");
        disk.resize("4m");
        core.write(fh, at, &chunk).expect("room again");
        core.close(fh, 0).await.expect("the whole file is uploaded");
        core.release_write(fh).await;
        let got = stored(&mem, "retry.bin").await.expect("stored");
        assert_eq!(got.len() as u64, at + chunk.len() as u64);
        assert!(got.iter().all(|&b| b == 7));
    };
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("bounded");
}

/// The first write of a file fails (the disk was full already): its close still
/// reports the failure (it returned 0 as if nothing had been written, and the file
/// vanished: black-box finding).
#[tokio::test]
async fn a_file_whose_first_write_failed_fails_its_close() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let _disk = Tmpfs::mount(dir.path(), "1m");
    let (core, mem) = writable_core(dir.path());
    let chunk = vec![7u8; 256 << 10];
    let run = async {
        // Another file takes the whole disk (kept open).
        let (_, filler) = core
            .create(ROOT_INO, "filler.bin", 0)
            .await
            .expect("create");
        let mut i = 0u64;
        while core.write(filler, i * chunk.len() as u64, &chunk).is_ok() {
            i += 1;
            assert!(i < 16, "a 1 MiB disk fills");
        }
        let (_, fh) = core.create(ROOT_INO, "first.bin", 0).await.expect("create");
        let e = core.write(fh, 0, &chunk).expect_err("the disk is full");
        assert_eq!(e.errno(), libc::ENOSPC, "{e}");
        let e = core.close(fh, 0).await.expect_err("the close reports it");
        assert_eq!(e.errno(), libc::ENOSPC, "{e}");
        core.release_write(fh).await;
        assert_eq!(stored(&mem, "first.bin").await, None);
        core.release_write(filler).await;
    };
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("bounded");
}
