//! Starting the disk tier on a full filesystem (a tmpfs or a loop-mounted ext4 image the
//! test mounts: it runs as root, as CI runs it). Crash finding: every start aborted inside RocksDB (SIGABRT)
//! when the cache dir's filesystem was full, a crash loop under a restart policy.

use std::process::Command;

use bytes::Bytes;
use strata_cache_core::block::Block;
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
use strata_cache_core::{CacheError, CacheKey, Tier, TierGet};

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
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// An ext4 filesystem of `mib` MiB in an image file, loop-mounted on `dir` (with its
/// default 5% of blocks reserved for root), unmounted when dropped.
fn ext4(image: &std::path::Path, dir: &std::path::Path, mib: u64) -> Tmpfs {
    std::fs::File::create(image)
        .and_then(|f| f.set_len(mib << 20))
        .expect("image");
    let ok = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "5"])
        .arg(image)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfs.ext4 (e2fsprogs)");
    std::fs::create_dir_all(dir).expect("mountpoint");
    let ok = Command::new("mount")
        .args(["-o", "loop"])
        .arg(image)
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "loop-mounting an ext4 image (the test needs root, as CI runs it)"
    );
    Tmpfs(dir.to_path_buf())
}

/// Fills what is left of the filesystem of `dir` with one file.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("filler");
    let chunk = vec![0u8; 64 << 10];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

#[tokio::test]
async fn a_full_filesystem_costs_old_blocks_or_a_clear_error_never_an_abort() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _fs = Tmpfs::mount(dir.path(), "24m");
    let cache = dir.path().join("cache");
    let keys: Vec<CacheKey> = (0..150u8).map(|i| CacheKey::kv("ns", vec![i])).collect();
    let block = |i: usize| Bytes::from(vec![i as u8; 100_003]);
    {
        let tier = DiskTier::open(&cache, 1 << 30, DiskOptions::default()).expect("open");
        for (i, k) in keys.iter().enumerate() {
            // Some fail once the filesystem is full; that is the tier's business.
            let _ = tier.put(k, Block::new(block(i))).await;
        }
    }
    fill(&dir.path().join("filler"));

    // Restart on the full filesystem: the oldest blocks make room, the rest are kept.
    let tier = DiskTier::open(&cache, 1 << 30, DiskOptions::default())
        .expect("starts on a full filesystem");
    let report = tier.recovery().clone();
    assert!(report.deleted_for_room > 0, "{report:?}");
    assert!(report.kept > 0, "{report:?}");
    let mut served = 0;
    for (i, k) in keys.iter().enumerate() {
        if let TierGet::Hit(b) = tier.get(k).await.expect("get") {
            assert_eq!(b.into_data(), block(i), "block {i}");
            served += 1;
        }
    }
    assert_eq!(served as u64, report.kept);
    drop(tier);

    // Full of what is not the tier's: a clear error, not an abort.
    std::fs::remove_dir_all(&cache).expect("drop the cache");
    fill(&dir.path().join("filler2"));
    match DiskTier::open(&cache, 1 << 30, DiskOptions::default()) {
        Err(CacheError::Full(why)) => assert!(why.contains("KiB free"), "{why}"),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("opened with no room"),
    }
}

/// Crash finding: a daemon running as root filled an ext4 cache filesystem past its
/// reserved blocks; deleting 7.7 MB of its blocks at the next start raised the free
/// space by only 5.8 MB (the reserve refilled first), short of what the index needs,
/// and the start was refused. Room is now measured as it is made.
#[tokio::test]
async fn a_filesystem_full_past_its_reserved_blocks_still_makes_room() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("fs");
    let _fs = ext4(&dir.path().join("image"), &mnt, 48);
    let cache = mnt.join("cache");
    let block = |i: usize| Bytes::from(vec![i as u8; 64 << 10]);
    let keys: Vec<CacheKey> = (0..1000u32)
        .map(|i| CacheKey::kv("ns", i.to_be_bytes().to_vec()))
        .collect();
    {
        let tier = DiskTier::open(&cache, 1 << 30, DiskOptions::default()).expect("open");
        for (i, k) in keys.iter().enumerate() {
            let _ = tier.put(k, Block::new(block(i))).await;
        }
    }
    fill(&mnt.join("filler"));
    let tier = DiskTier::open(&cache, 1 << 30, DiskOptions::default())
        .expect("starts on a filesystem full past its reserve");
    let report = tier.recovery().clone();
    assert!(report.deleted_for_room > 0, "{report:?}");
    assert!(report.kept > 0, "{report:?}");
    for (i, k) in keys.iter().enumerate() {
        if let TierGet::Hit(b) = tier.get(k).await.expect("get") {
            assert_eq!(b.into_data(), block(i), "block {i}");
        }
    }
}

/// A disk budget larger than the filesystem (or other files filling it): once the
/// device is full (and the back-off passed), new blocks evict old ones instead of every
/// write failing for as long as nothing is evicted (black-box finding: every KV Put
/// refused for good); the budget comes back when the device has room.
#[tokio::test]
async fn a_device_full_before_the_budget_evicts_for_new_blocks() {
    use std::sync::Arc;
    use strata_cache_core::tiers::MemoryTier;
    use strata_cache_core::{AccessContext, CacheEngine};
    let dir = tempfile::tempdir().expect("tempdir");
    let _fs = Tmpfs::mount(dir.path(), "16m");
    let disk = Arc::new(
        DiskTier::open(dir.path().join("cache"), 1 << 30, DiskOptions::default()).expect("open"),
    );
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(1 << 20)))
        .tier(disk.clone())
        .write_through(true)
        // Each put after the first failure is past the back-off (the daemon's is 30 s).
        .degraded_backoff(std::time::Duration::ZERO)
        .build()
        .expect("engine");
    let ctx = AccessContext::default();
    let mut failed = 0;
    let mut late_ok = 0;
    for i in 0..60u32 {
        let key = CacheKey::kv("ns", i.to_be_bytes().to_vec());
        match engine
            .put(&key, Bytes::from(vec![i as u8; 1 << 20]), &ctx)
            .await
        {
            Ok(()) => late_ok += usize::from(failed > 0),
            Err(e) => {
                assert!(matches!(e, CacheError::Full(_)), "{e}");
                failed += 1;
            }
        }
    }
    assert!(failed > 0, "the 16 MiB filesystem filled");
    assert!(
        late_ok >= 20,
        "puts after the device filled are stored: {late_ok}"
    );
    assert!(disk.used_bytes() < 16 << 20, "within the device");
    // The figure operators see is the lowered budget, not the configured 1 GiB
    // (round 20: `strata stats` showed 3% used of a full device).
    let capacity = engine.stats().tiers[1].capacity_bytes;
    assert!(
        capacity <= 16 << 20,
        "capacity shown {capacity}, the device holds 16 MiB"
    );
}
