//! The cache core of one daemon: the backing store and the tier hierarchy (GPU, memory,
//! disk; fastest first) on one engine, built from `[store]` and `[cache]`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use strata_cache_core::policy;
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{BackingStore, CacheEngine, StoreOptions, Tier};
use strata_fs::PassthroughStore;
use strata_gds::{DeviceChoice, GpuTier, TransferConfig, Transfers};

use crate::config::{parse_size, CacheConfig, GpuDevice, GpuTierConfig, StoreConfig};

/// Opens the backing store named by `url` with the connection options of `cfg`.
pub fn open_store(url: &str, cfg: &StoreConfig) -> anyhow::Result<BackingStore> {
    let opts = StoreOptions {
        endpoint: cfg.endpoint.clone(),
        region: cfg.region.clone(),
        access_key_id: cfg.access_key_id.clone(),
        // Inline, from its file, or (None) from the environment by the store client.
        secret_access_key: cfg.secret_access_key()?,
        allow_http: cfg.allow_http,
        follow_symlinks: cfg.follow_symlinks,
        ..Default::default()
    };
    let store = BackingStore::from_url(url, &opts)?;
    if cfg.inject_latency_ms == 0 && cfg.inject_bandwidth.is_none() {
        return Ok(store);
    }
    // A benchmark's slow store (see `StoreConfig::inject_latency_ms`); same label, so
    // peers reading the same store still agree.
    let fault = strata_cache_core::store::faulty::FaultConfig {
        latency: std::time::Duration::from_millis(cfg.inject_latency_ms),
        bandwidth_bytes_per_sec: cfg
            .inject_bandwidth
            .as_deref()
            .map(parse_size)
            .transpose()
            .context("[store] inject_bandwidth")?,
        ..Default::default()
    };
    let slow: Arc<dyn object_store::ObjectStore> = Arc::new(
        strata_cache_core::store::faulty::FaultyStore::new(store.inner().clone(), fault),
    );
    Ok(BackingStore::new(slow, url, opts.retry))
}

/// The cache core of one daemon: the engine and handles on its tiers.
pub struct Core {
    pub engine: CacheEngine,
    pub gpu: Option<Arc<GpuTier>>,
    pub memory: Arc<MemoryTier>,
    pub disk: Option<Arc<DiskTier>>,
    pub block_size: u64,
    /// Fetch and cache units of the mounts' readers (`[cache] read_units`).
    pub granularity: strata_cache_core::granularity::Granularity,
    pub cache_dir: PathBuf,
    /// The daemon's local files: its mounts' passthrough copies and the files written
    /// through them while staged, within the disk budget's passthrough share (the disk
    /// tier has the rest: the disk budget counts everything Strata writes; see
    /// [`passthrough_share`]). One for all mounts. None without a disk budget.
    pub local_files: Option<Arc<PassthroughStore>>,
    /// Mounts sharing the daemon's metadata budget
    /// ([`super::memory_limit::metadata_budget`]): 1 until the daemon says.
    pub mounts: usize,
    /// This daemon's hold on the cache dir ([`lock_cache_dir`]).
    _lock: std::fs::File,
    /// Keeps a temp cache dir alive for the daemon's lifetime.
    _temp: Option<tempfile::TempDir>,
}

/// Builds the tiers and the engine from `cfg`: GPU (when configured) over memory over
/// disk (unless "0"), each level evicting with `cfg.policy`; a share of the disk budget
/// goes to the mounts' local files ([`passthrough_share`]).
pub fn open_core(cfg: &CacheConfig) -> anyhow::Result<Core> {
    open_core_for(cfg, true)
}

/// [`open_core`] for a daemon whose mounts may keep local files (`local_files`: one
/// makes passthrough copies or takes writes) or not. If not, the disk tier takes the
/// whole disk budget: no file can be copied or staged (black-box findings: a KV-only
/// daemon, and one whose only mount was read-only with passthrough off, kept a quarter
/// of `--disk` for mount files that could not exist), and copies an earlier run left
/// are deleted, as nothing would count them.
pub fn open_core_for(cfg: &CacheConfig, local_files: bool) -> anyhow::Result<Core> {
    // Checked first, so a refused GPU configuration leaves no cache dir behind.
    let gpu_cfg = cfg.gpu_tier()?;
    let granularity = cfg.granularity()?;
    let (cache_dir, temp) = match &cfg.dir {
        Some(d) => {
            // 0700 and ours (a dir owned by another user is refused): it holds every
            // tenant's KV data, copies of the store's files and the KV socket.
            strata_cache_core::tiers::disk::private_dir(d)
                .with_context(|| format!("cache dir {}", d.display()))?;
            (d.clone(), None)
        }
        None => {
            // Said at start: a daemon restarted without a dir is cold, and its KV socket
            // is at a new path (black-box finding: a put block was gone after a clean
            // restart, with nothing saying the cache was throwaway).
            tracing::warn!(
                "no cache dir given ([cache] dir, --cache-dir): caching in a temp dir \
                 removed at exit, so nothing cached survives a restart (a crash leaves it; \
                 files fsync'd on a writable mount and not uploaded stay in it until a start \
                 with --cache-dir set to it uploads them)"
            );
            reclaim_orphaned_temp_dirs();
            let t = tempfile::Builder::new()
                .prefix(TEMP_PREFIX)
                .tempdir()
                .context("creating temp cache dir")?;
            // As private as a given one (black-box finding: created 0755, its upload
            // journals, naming the store and the files being written, were readable by
            // every local user).
            strata_cache_core::tiers::disk::private_dir(t.path())
                .with_context(|| format!("cache dir {}", t.path().display()))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    // Before anything in it is opened, cleaned or written.
    let lock = lock_cache_dir(&cache_dir)?;
    let level = |tier: Arc<dyn Tier>, bytes: u64| -> anyhow::Result<_> {
        Ok((tier, policy::by_name(&cfg.policy, bytes)?))
    };
    let mut levels = Vec::new();
    let gpu = match gpu_cfg {
        Some(g) => {
            let tier = Arc::new(open_gpu_tier(g)?);
            levels.push(level(tier.clone(), g.bytes)?);
            Some(tier)
        }
        None => None,
    };
    let mut memory_bytes =
        parse_size(&cfg.memory).context("[cache] memory (--memory, --memory-cache)")?;
    if let Some(limit) = super::memory_limit::memory_limit() {
        let (fitted, _) = super::memory_limit::fit(memory_bytes, 0, limit.bytes);
        memory_bytes = super::memory_limit::capped("[cache] memory", memory_bytes, fitted, &limit);
    }
    let memory = Arc::new(MemoryTier::new(memory_bytes));
    levels.push(level(memory.clone(), memory_bytes)?);
    let mut disk_bytes = parse_size(&cfg.disk).context("[cache] disk (--disk, --disk-cache)")?;
    if let Some(limit) = super::memory_limit::memory_limit() {
        // A cache dir in memory (tmpfs, ramfs: a Kubernetes emptyDir of medium Memory)
        // is charged to the daemon's memory limit beside the memory tier (black-box
        // finding: a 256 MiB cgroup OOM-killed with ~160 MB of tmpfs pages under a
        // 10 GiB disk budget).
        if super::memory_limit::memory_backed(&cache_dir) {
            let fitted = super::memory_limit::fit_memory_backed_disk(disk_bytes, limit.bytes);
            disk_bytes = super::memory_limit::capped(
                "[cache] disk (its dir is in memory: tmpfs or ramfs)",
                disk_bytes,
                fitted,
                &limit,
            );
        }
    }
    // Before the disk tier sizes its open-file cache from the limit: many clients
    // and open block files must not run the daemon out of descriptors.
    match strata_cache_core::tiers::disk::raise_fd_limit() {
        Ok(limit) => tracing::info!(limit, "descriptor soft limit raised to the hard limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the descriptor limit"),
    }
    let passthrough_budget = if local_files {
        passthrough_share(disk_bytes)
    } else {
        let copies = cache_dir.join("passthrough");
        if copies.exists() {
            match std::fs::remove_dir_all(&copies) {
                Ok(()) => tracing::info!(dir = %copies.display(),
                    "no mount copies or writes files: deleted the passthrough copies an earlier run left"),
                Err(e) => tracing::warn!(dir = %copies.display(), error = %e,
                    "no mount copies or writes files: could not delete the passthrough copies an earlier run left"),
            }
        }
        0
    };
    let tier_bytes = disk_bytes - passthrough_budget;
    let local_files = if passthrough_budget > 0 {
        let dir = cache_dir.join("passthrough");
        let store = PassthroughStore::open(&dir, passthrough_budget)
            .with_context(|| format!("opening the passthrough copies in {}", dir.display()))?;
        Some(Arc::new(store))
    } else {
        None
    };
    // On a filesystem full of copies, the disk tier's index could not open (it deletes
    // only its own blocks to make room): the oldest copies go first.
    if let (Some(store), true) = (&local_files, tier_bytes > 0) {
        use strata_cache_core::tiers::disk::{free_bytes, OPEN_ROOM};
        let deleted = store.evict_until(|| free_bytes(&cache_dir).map_or(true, |f| f >= OPEN_ROOM));
        if deleted > 0 {
            tracing::warn!(dir = %cache_dir.display(), deleted,
                "the cache dir's filesystem was full; deleted the oldest passthrough copies so the disk tier can open");
        }
    }
    let disk = if tier_bytes > 0 {
        let d = Arc::new(
            open_disk_tier(&cache_dir.join("blocks"), tier_bytes)
                .with_context(|| format!("opening disk tier in {}", cache_dir.display()))?,
        );
        levels.push(level(d.clone(), tier_bytes)?);
        Some(d)
    } else {
        None
    };
    let engine = levels
        .into_iter()
        .fold(CacheEngine::builder(), |b, (tier, policy)| {
            b.tier_with_policy(tier, policy)
        })
        .build()?;
    Ok(Core {
        engine,
        gpu,
        memory,
        disk,
        block_size: checked_block_size(&cfg.block_size)?,
        granularity,
        cache_dir,
        local_files,
        mounts: 1,
        _lock: lock,
        _temp: temp,
    })
}

/// Name prefix of the temp cache dir a daemon without `--cache-dir` makes.
const TEMP_PREFIX: &str = "strata-cache-";

/// Removes the temp cache dirs of this user's daemons that ended without removing
/// theirs (kill -9, the OOM killer, a panic): each held a whole cache, and a
/// crash-looping unit filled /tmp with them (black-box finding). A dir is taken as
/// orphaned when a daemon locked it once (its pid is in `daemon.lock`) and none holds
/// the lock now.
fn reclaim_orphaned_temp_dirs() {
    reclaim_orphaned_in(&std::env::temp_dir());
}

/// [`reclaim_orphaned_temp_dirs`] in `tmp`.
fn reclaim_orphaned_in(tmp: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            continue;
        }
        let dir = entry.path();
        let ours = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == me);
        // A pid is written into `daemon.lock` only while its daemon holds the lock: a
        // pid there and the lock free is a daemon gone (a daemon starting has an empty
        // file until it locks it).
        let locked_once = std::fs::metadata(dir.join(DAEMON_LOCK)).is_ok_and(|m| m.len() > 0);
        if ours && locked_once && cache_dir_free(&dir) {
            // Files fsync'd on a writable mount and not uploaded before the crash: their
            // only copy (black-box finding: the next start, of any mount, removed them
            // with the dir, and the acknowledged checkpoint was never uploaded).
            let records = fsync_records_in(&dir.join("staging"));
            if records > 0 {
                tracing::warn!(
                    dir = %dir.display(),
                    records,
                    "kept the temp cache dir of a daemon that did not end cleanly: it holds files \
                     fsync'd on a writable mount and not uploaded; start that mount again with \
                     --cache-dir set to it to upload them, or delete it"
                );
                continue;
            }
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "removed the temp cache dir of a daemon that did not end cleanly")
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove the temp cache dir of a daemon that did not end cleanly")
                }
            }
        }
    }
}

/// How many fsync records lie in the mounts' staging folders under `staging` (a cache
/// dir's), as `strata_fs` counts them in one.
fn fsync_records_in(staging: &std::path::Path) -> usize {
    let Ok(mounts) = std::fs::read_dir(staging) else {
        return 0;
    };
    mounts
        .flatten()
        .map(|m| strata_fs::filesystem::fsync_records(&m.path()))
        .sum()
}

/// The file whose lock says a daemon runs on a cache dir (it holds that daemon's pid).
const DAEMON_LOCK: &str = "daemon.lock";

/// Takes the cache dir for this daemon: an exclusive lock on `daemon.lock`, held for the
/// daemon's life (the kernel drops it when the process ends, `kill -9` included). A
/// second daemon on the same cache dir is refused, whatever its tiers: one without a
/// disk tier takes no index lock, and it removed the first one's staged writes and
/// upload records as leftovers and rewrote its model bindings (black-box findings). A
/// lock held by a daemon that is stopping is waited for as the index lock is.
fn lock_cache_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    let path = dir.join(DAEMON_LOCK);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let deadline = std::time::Instant::now() + INDEX_LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut written = String::new();
                let _ = file.read_to_string(&mut written);
                let holder = lock_holder(&file, written.trim());
                anyhow::bail!(
                    "cache dir {} is in use by another strata daemon ({holder}): each daemon \
                     needs its own --cache-dir (one daemon serves several mounts of its \
                     store, [[mounts]] in `strata serve --config`, and the KV service; a \
                     mount of another store needs a daemon and cache dir of its own)",
                    dir.display(),
                );
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
        }
    }
    // Our pid, for the message a second daemon gets; the lock is what counts, so a
    // full filesystem (no block for the pid) does not stop the start.
    let pid = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| write!(file, "{}", std::process::id()));
    if let Err(e) = pid {
        tracing::warn!(path = %path.display(), "could not write the daemon's pid: {e}");
    }
    Ok(file)
}

/// Who holds the lock on `file`, for the refusal: the pid the kernel lists for it in
/// `/proc/locks` (as this process's PID namespace sees it), else the pid the holder wrote
/// (black-box finding, round 23: a daemon started in its own PID namespace wrote "2",
/// which the refused daemon's namespace knows as kthreadd).
fn lock_holder(file: &std::fs::File, written: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let listed = file.metadata().ok().and_then(|m| {
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        flock_holder(&locks, libc::major(m.dev()), libc::minor(m.dev()), m.ino())
    });
    match listed {
        Some(0) => format!("a process in another PID namespace, which wrote pid {written}"),
        Some(pid) => format!("pid {pid}"),
        None => format!("pid {written}"),
    }
}

/// The pid `/proc/locks` text `locks` gives the holder of a `flock` on the file of
/// device `major:minor`, inode `ino` (0: outside this PID namespace).
fn flock_holder(locks: &str, major: u32, minor: u32, ino: u64) -> Option<u32> {
    let file = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 17128 fe:00:10010646 0 EOF"; a waiter's line
        // starts "1: ->".
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&file.as_str()))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}

/// Whether no daemon holds cache dir `dir` now (its `daemon.lock` is absent or free);
/// asked before a start touches the dir's files, which the holder may be using.
pub fn cache_dir_free(dir: &std::path::Path) -> bool {
    match std::fs::File::open(dir.join(DAEMON_LOCK)) {
        Ok(f) => !matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => true,
    }
}

/// How long a start waits for the disk tier's index lock held by a daemon that is
/// ending: 5 s. `fusermount3 -u` returns before the old daemon has closed its index
/// (about 1.4 s later), so `fusermount3 -u M && strata mount ... M` over the same
/// cache dir failed on the lock (black-box finding); a daemon still running holds it
/// past the wait and the start fails with the lock's error, as before.
const INDEX_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn open_disk_tier(dir: &std::path::Path, bytes: u64) -> strata_cache_core::Result<DiskTier> {
    let deadline = std::time::Instant::now() + INDEX_LOCK_WAIT;
    let limit = super::memory_limit::memory_limit().map(|l| l.bytes);
    let defaults = DiskOptions::default();
    let options = DiskOptions {
        max_blocks: limit.map(super::memory_limit::disk_blocks),
        buf_pool_bytes: limit.map_or(
            defaults.buf_pool_bytes,
            super::memory_limit::disk_buffer_pool,
        ),
        ..defaults
    };
    loop {
        match DiskTier::open(dir, bytes, options.clone()) {
            Err(e) if is_lock_held(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

/// RocksDB's error for a LOCK file another process (or this one) holds.
fn is_lock_held(e: &strata_cache_core::CacheError) -> bool {
    let text = e.to_string();
    text.contains("LOCK")
        && (text.contains("Resource temporarily unavailable")
            || text.contains("lock hold by current process"))
}

/// Smallest block: 64 KiB (JuiceFS's floor too). Below it every read costs a request
/// and a cached block per few KiB: a 3 MB file read with 3-byte blocks hung for
/// minutes, ran out of descriptors and took 1 GB (black-box finding). Small random
/// reads get sub-block units anyway (`[cache] read_units`).
const MIN_BLOCK_SIZE: u64 = 64 << 10;
/// Largest block: 64 MiB. One block is fetched and held whole per miss: above it a
/// single small read would pull that much from the store and the memory tier would
/// hold very few blocks.
const MAX_BLOCK_SIZE: u64 = 64 << 20;

/// `[cache] block_size`, within [`MIN_BLOCK_SIZE`]..=[`MAX_BLOCK_SIZE`].
fn checked_block_size(text: &str) -> anyhow::Result<u64> {
    let bs = parse_size(text)?;
    if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) {
        anyhow::bail!(
            "[cache] block_size {text:?}: must be between 64KiB and 64MiB (default {})",
            strata_cache_core::DEFAULT_BLOCK_SIZE
        );
    }
    Ok(bs)
}

/// The part of a disk budget of `disk_bytes` that passthrough copies may use: a
/// quarter, at most 4 GiB (the copies' old default budget). A quarter: copies hold
/// whole small objects read often, the disk tier holds everything else, and a copy's
/// blocks leave the disk tier (one copy per byte), so the share is not a second copy.
/// 0 with no disk budget: "0" means Strata writes nothing to disk.
pub fn passthrough_share(disk_bytes: u64) -> u64 {
    (disk_bytes / 4).min(4 << 30)
}

/// The GPU tier of `g` on its device; a CUDA device that cannot be opened (not built
/// in, no driver, no such ordinal) is an error naming the alternatives, never a silent
/// fallback to the emulated device.
fn open_gpu_tier(g: GpuTierConfig) -> anyhow::Result<GpuTier> {
    let choice = match g.device {
        GpuDevice::Emulated => DeviceChoice::Emulated {
            memory_limit: g.bytes,
        },
        GpuDevice::Cuda(ordinal) => DeviceChoice::Cuda {
            ordinal,
            memory_limit: g.bytes,
        },
    };
    let device = strata_gds::open_device(&choice).with_context(|| match g.device {
        GpuDevice::Cuda(n) => format!(
            "opening CUDA device {n} for the GPU tier ([cache] gpu_device = \"{n}\"); on a \
             machine without a usable GPU set gpu_device = \"emulated\" or remove gpu"
        ),
        GpuDevice::Emulated => "opening the emulated GPU device".into(),
    })?;
    let transfers = Transfers::new(device, TransferConfig::default())
        .context("starting the GPU tier's transfer engine")?;
    let tier = GpuTier::new(transfers, g.bytes);
    tracing::info!(device = %tier.describe(), bytes = g.bytes, "GPU tier");
    Ok(tier)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Black-box finding: every killed daemon without `--cache-dir` left its whole
    /// temp cache dir, and no later start reclaimed one. Orphans go; a dir a daemon
    /// holds, one not yet locked, others' names, and (a later finding: the files it
    /// held were lost) an orphan holding fsync'd files not uploaded stay.
    #[test]
    fn temp_cache_dirs_of_dead_daemons_are_reclaimed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let mk = |name: &str, lock: bool| {
            let d = tmp.path().join(name);
            std::fs::create_dir(&d).expect("mkdir");
            std::fs::write(d.join("block"), b"data").expect("data");
            if lock {
                std::fs::write(d.join(DAEMON_LOCK), b"12345").expect("lock file");
            }
            d
        };
        let dead = mk("strata-cache-dead", true);
        // Dead too, but holding a file fsync'd and not uploaded: its only copy.
        let journaled = mk("strata-cache-journaled", true);
        let files = journaled.join("staging/mnt-x/files");
        std::fs::create_dir_all(&files).expect("staging");
        std::fs::write(files.join("7.part"), b"checkpoint").expect("staged");
        std::fs::write(files.join("7.part.json"), b"{}").expect("record");
        let live = mk("strata-cache-live", true);
        let starting = mk("strata-cache-starting", false);
        std::fs::File::create(starting.join(DAEMON_LOCK)).expect("an empty lock file");
        let other = mk("not-strata", true);
        let held = std::fs::File::open(live.join(DAEMON_LOCK)).expect("open");
        held.lock().expect("a live daemon's lock");
        reclaim_orphaned_in(tmp.path());
        assert!(!dead.exists(), "an orphan goes");
        assert!(live.exists() && starting.exists() && other.exists());
        assert!(
            files.join("7.part").exists(),
            "an orphan holding an fsync'd file stays"
        );
    }

    fn cfg(dir: &std::path::Path) -> CacheConfig {
        CacheConfig {
            dir: Some(dir.to_path_buf()),
            memory: "1MiB".into(),
            disk: "4MiB".into(),
            ..CacheConfig::default()
        }
    }

    /// Crash finding: a mount whose passthrough copies had filled its cache dir's
    /// filesystem was refused at every restart (the disk tier deletes only its own
    /// blocks to make room for its index). The oldest copies now go first. Needs root
    /// for the tmpfs, as CI runs it.
    #[test]
    fn a_cache_dir_full_of_passthrough_copies_still_opens() {
        use std::process::Command;
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs (the test needs root, as CI runs it)");
        struct Unmount<'a>(&'a std::path::Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = Command::new("umount").arg("-l").arg(self.0).status();
            }
        }
        let _unmount = Unmount(dir.path());
        let cache_dir = dir.path().join("cache");
        let copies = cache_dir.join("passthrough");
        let mut written = 0;
        {
            let store = PassthroughStore::open(&copies, 1 << 30).expect("copies");
            for i in 0.. {
                let name = PassthroughStore::name("", &format!("f{i}"), "v", 1 << 20);
                if !store.begin(&name, 1 << 20) || store.write(&name, &[1u8; 1 << 20]).is_err() {
                    store.abort(&name);
                    break;
                }
                written += 1;
            }
        }
        let free = strata_cache_core::tiers::disk::free_bytes(dir.path()).expect("statvfs");
        assert!(
            free < strata_cache_core::tiers::disk::OPEN_ROOM,
            "full: {free}"
        );
        let core = open_core(&CacheConfig {
            disk: "1GiB".into(),
            ..cfg(&cache_dir)
        })
        .expect("opens on a filesystem full of its own copies");
        let left = core.local_files.as_ref().expect("copies").len();
        assert!(
            left > 0 && left < written,
            "{left} of {written} copies kept"
        );
        assert!(core.disk.is_some());
    }

    /// Round 23: the holder is named as the kernel lists it, not as it wrote itself (a
    /// daemon in its own PID namespace wrote "2").
    #[test]
    fn the_lock_s_holder_is_named_by_the_kernel() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lock");
        let held = std::fs::File::create(&path).expect("create");
        held.lock().expect("lock");
        std::fs::write(&path, "2").expect("a pid from another namespace");
        let other = std::fs::File::open(&path).expect("open");
        assert_eq!(
            lock_holder(&other, "2"),
            format!("pid {}", std::process::id())
        );
        let locks = "1: FLOCK  ADVISORY  WRITE 17128 fe:00:10010646 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 99 fe:00:10010646 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 55 fe:00:77 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 0 103:02:5 0 EOF\n";
        assert_eq!(flock_holder(locks, 254, 0, 10010646), Some(17128));
        assert_eq!(flock_holder(locks, 254, 0, 77), None, "not a flock");
        assert_eq!(
            flock_holder(locks, 0x103, 2, 5),
            Some(0),
            "another namespace"
        );
        assert_eq!(flock_holder(locks, 254, 0, 1), None);
    }

    /// A second daemon on a cache dir is refused, also one without a disk tier (which
    /// takes no index lock), naming the first's pid; once the first is gone it starts.
    #[test]
    fn a_second_daemon_on_a_cache_dir_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = open_core(&cfg(dir.path())).expect("first");
        let memory_only = CacheConfig {
            disk: "0".into(),
            ..cfg(dir.path())
        };
        let started = std::time::Instant::now();
        let e = open_core(&memory_only).err().expect("refused");
        let msg = format!("{e:#}");
        assert!(msg.contains("in use by another strata daemon"), "{msg}");
        assert!(msg.contains(&std::process::id().to_string()), "{msg}");
        assert!(
            started.elapsed() >= INDEX_LOCK_WAIT,
            "waited for a stopping daemon"
        );
        drop(first);
        open_core(&memory_only).expect("the cache dir is free again");
    }

    /// Black-box finding: a KV-only daemon kept a quarter of `--disk` for mount files
    /// that could not exist. Without mounts the disk tier takes the whole budget, and
    /// copies an earlier run with mounts left are deleted (nothing would count them).
    #[test]
    fn without_mounts_the_disk_tier_takes_the_whole_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let core = open_core(&cfg(dir.path())).expect("with mounts");
            assert_eq!(core.disk.as_ref().expect("disk").capacity_bytes(), 3 << 20);
            assert!(core.local_files.is_some());
            std::fs::write(dir.path().join("passthrough/left-copy"), [1u8; 4096]).expect("copy");
        }
        assert!(dir.path().join("passthrough").exists());
        let core = open_core_for(&cfg(dir.path()), false).expect("without mounts");
        assert_eq!(core.disk.as_ref().expect("disk").capacity_bytes(), 4 << 20);
        assert!(core.local_files.is_none());
        assert!(
            !dir.path().join("passthrough").exists(),
            "left copies deleted"
        );
    }

    /// Black-box finding (security): without a cache dir the temp one was made 0755,
    /// and other local users could read its upload journals.
    #[test]
    fn a_temp_cache_dir_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let core = open_core(&CacheConfig {
            dir: None,
            ..cfg(std::path::Path::new("/unused"))
        })
        .expect("core");
        let mode = std::fs::metadata(&core.cache_dir)
            .expect("dir")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{:o}", mode);
    }

    /// Black-box finding: a 3-byte block size was taken and a 3 MB read hung.
    #[test]
    fn a_block_size_outside_64kib_to_64mib_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        for bad in ["3", "64", "32KiB", "128MiB"] {
            let c = CacheConfig {
                block_size: bad.into(),
                ..cfg(dir.path())
            };
            let e = open_core(&c).err().expect(bad).to_string();
            assert!(e.contains("between 64KiB and 64MiB"), "{bad}: {e}");
        }
        for good in ["64KiB", "4MiB", "64MiB"] {
            let c = CacheConfig {
                block_size: good.into(),
                ..cfg(dir.path())
            };
            let core = open_core(&c).expect(good);
            drop(core);
        }
    }

    /// Black-box finding: `fusermount3 -u M && strata mount ... M` on the same cache dir
    /// failed on the index lock the ending daemon still held for ~1.4 s. A start waits
    /// for it; a holder that stays past the wait still fails the start.
    #[test]
    fn a_start_waits_for_the_index_lock_of_a_daemon_that_is_ending() {
        let dir = tempfile::tempdir().expect("tempdir");
        let blocks = dir.path().join("blocks");
        let held = open_disk_tier(&blocks, 4 << 20).expect("first");
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            drop(held);
        });
        let second = open_disk_tier(&blocks, 4 << 20);
        releaser.join().expect("join");
        let second = second.expect("opened once the first let go");
        let started = std::time::Instant::now();
        let third = open_disk_tier(&blocks, 4 << 20);
        assert!(third.is_err(), "a live holder still fails the start");
        assert!(started.elapsed() >= INDEX_LOCK_WAIT);
        drop(second);
    }

    fn with_gpu(dir: &std::path::Path, gpu: &str, device: &str) -> CacheConfig {
        CacheConfig {
            gpu: Some(gpu.into()),
            gpu_device: Some(device.into()),
            ..cfg(dir)
        }
    }

    #[test]
    fn tiers_evict_with_the_configured_policy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = cfg(dir.path());
        let core = open_core(&cfg).expect("default policy opens");
        assert_eq!(core.engine.policy_names(), ["strata", "strata"]);
        drop(core);
        cfg.policy = "lru".into();
        let core = open_core(&cfg).expect("lru opens");
        assert_eq!(core.engine.policy_names(), ["lru", "lru"]);
        drop(core);
        cfg.policy = "belady".into();
        let err = open_core(&cfg).err().expect("unknown policy is refused");
        assert!(format!("{err:#}").contains("known: strata, lru"), "{err:#}");
    }

    #[test]
    fn read_units_choose_the_readers_granularity() {
        use strata_cache_core::granularity::Granularity;
        // A directory per open: a disk tier's directory is held while its core lives.
        let dir = |n: &str| tempfile::tempdir().expect(n);
        let (a, b, c) = (dir("a"), dir("b"), dir("c"));
        let core = open_core(&cfg(a.path())).expect("default read_units opens");
        assert_eq!(core.granularity, Granularity::default(), "auto by default");
        let block = CacheConfig {
            read_units: "block".into(),
            ..cfg(b.path())
        };
        assert_eq!(
            open_core(&block).expect("block").granularity,
            Granularity::BLOCKS
        );
        let pages = CacheConfig {
            read_units: "pages".into(),
            ..cfg(c.path())
        };
        let err = open_core(&pages)
            .err()
            .expect("an unknown value is refused");
        assert!(format!("{err:#}").contains("read_units"), "{err:#}");
    }

    #[test]
    fn a_gpu_tier_sits_above_memory_and_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core =
            open_core(&with_gpu(dir.path(), "2MiB", "emulated")).expect("emulated GPU tier opens");
        let tiers: Vec<String> = core
            .engine
            .stats()
            .tiers
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(tiers.len(), 3, "{tiers:?}");
        assert_eq!(tiers[0], "gpu:emulated");
        assert_eq!(core.gpu.as_ref().map(|g| g.capacity_bytes()), Some(2 << 20));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_cuda_device_without_cuda_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = with_gpu(dir.path(), "1GiB", "0");
        let err = format!("{:#}", open_core(&cfg).err().expect("refused"));
        assert!(
            err.contains("CUDA device 0") && err.contains("cuda"),
            "{err}"
        );
        assert!(err.contains("emulated"), "names the alternative: {err}");
    }
}
