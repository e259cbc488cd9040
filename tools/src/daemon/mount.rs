//! The one place a mount is built: `[[mounts]]` of `strata serve` and `strata mount`
//! both come here with a [`MountConfig`], so they prefetch, pass through and cache
//! metadata alike.

use std::path::{Path, PathBuf};

use anyhow::Context;
use strata_cache_core::{BackingStore, ObjectReader};
use strata_fs::{MountHandle, MountOptions, PassthroughOptions};

use super::cache::Core;
use crate::config::{parse_size, MountConfig, PrefetchMode};

impl PrefetchMode {
    /// Applies the mode to a core's options (the benchmarks set up their mounts with
    /// it too).
    pub fn apply(self, core: &mut strata_fs::CoreOptions) {
        core.predictors = match self {
            PrefetchMode::Window => None,
            PrefetchMode::Predictors => {
                Some(std::sync::Arc::new(strata_fs::Predictors::standard()))
            }
        };
    }
}

/// The filesystem options `m` asks for on `core` (`fsname`: the store URL, shown in
/// the mount table).
pub fn mount_options(m: &MountConfig, core: &Core, fsname: &str) -> anyhow::Result<MountOptions> {
    let mut opts = MountOptions {
        allow_other: m.allow_other,
        auto_unmount: m.auto_unmount,
        fsname: fsname.to_string(),
        read_ahead_kb: Some(m.read_ahead_kb),
        // The daemon never reads its own mounts; its store, led there by a symlink,
        // must not either (a process embedding the daemon, the tests, may).
        refuse_own_process: super::is_daemon_process(),
        ..Default::default()
    };
    opts.core.metadata_ttl = m.metadata_ttl.duration();
    if let Some(uid) = m.uid {
        opts.core.uid = uid;
    }
    if let Some(gid) = m.gid {
        opts.core.gid = gid;
    }
    opts.core.file_mode = m.file_mode;
    opts.core.dir_mode = m.dir_mode;
    if m.allow_other && m.file_mode.is_none() && fsname.starts_with("file://") {
        // Black-box finding: files the store keeps private (0600) were readable by
        // every local user through such a mount.
        tracing::warn!(store = fsname, "--allow-other without --file-mode: every local user can read every file of the store through the mount, whatever its mode there; restrict with --gid and --file-mode 0440");
    }
    if m.metadata_ttl.duration() >= strata_fs::filesystem::INDEFINITE_FROM {
        // A start with the store down finds what the cache holds (listing_log.rs).
        opts.core.listing_log = Some(
            core.cache_dir
                .join(METADATA)
                .join(format!("{}.jsonl", mount_dir_name(&m.mountpoint))),
        );
    }
    m.prefetch.apply(&mut opts.core);
    if let Some(limit) = super::memory_limit::memory_limit() {
        let budget = super::memory_limit::metadata_budget(limit.bytes, core.mounts);
        opts.core.metadata_bytes = budget.cache_bytes;
        opts.core.max_inodes = budget.unreferenced_inodes;
        if m.prefetch == PrefetchMode::Predictors {
            opts.core.predictors = Some(std::sync::Arc::new(
                strata_fs::Predictors::standard_with_names(budget.predictor_names),
            ));
        }
    }
    let pt_max = parse_size(&m.passthrough_max).context("passthrough_max")?;
    // Copies live within the disk budget (its passthrough share): none without one.
    if let Some(copies) = core.local_files.clone().filter(|_| pt_max > 0) {
        opts.core.passthrough = Some(PassthroughOptions {
            copies,
            max_object: pt_max,
            namespace: fsname.to_string(),
        });
    }
    if m.allow_overwrite || m.allow_delete {
        anyhow::ensure!(
            m.allow_writes,
            "allow_overwrite and allow_delete need allow_writes"
        );
    }
    if m.allow_writes {
        // A written file is staged on local disk until it is uploaded: with "0" for
        // the disk budget Strata writes nothing to disk.
        let Some(local_files) = core.local_files.clone() else {
            anyhow::bail!(
                "allow_writes stages written files in the cache dir until they are \
                 uploaded, in a quarter of the disk budget: it needs a disk budget \
                 ([cache] disk / --disk-cache) of at least 4 bytes"
            );
        };
        // One staging directory per mount point (emptied when the mount starts), in
        // the cache dir so a written file can become its passthrough copy by a rename.
        let mut w = strata_fs::WriteOptions::new(staging_dir(&core.cache_dir, &m.mountpoint));
        w.allow_overwrite = m.allow_overwrite;
        w.allow_delete = m.allow_delete;
        w.local_files = Some(local_files);
        // Parts on the wire within a quarter of the fastest level, as reads in flight
        // are (`ObjectReader`'s fetch window), at least one part: the default 512 MiB
        // let each file written in order keep 8 parts (64 MiB) in memory while a store
        // stalled, and 8 writers got the daemon OOM-killed in a 512 MiB cgroup with a
        // 192 MiB tier (black-box finding).
        w.upload_memory = (core.engine.fastest_capacity_bytes() / 4)
            .clamp(w.part_size as u64, w.upload_memory.max(w.part_size as u64));
        opts.core.writes = Some(w);
    }
    Ok(opts)
}

/// Where the mount at `mountpoint` stages written files: `<cache>/staging/NAME`, NAME
/// the mountpoint made readable (`/mnt/train` -> `_mnt_train`) plus a checksum of the
/// exact path, since the readable part alone is not unique (`/mnt/a_b` and `/mnt/a/b`
/// shared one directory, and one mount's new file failed with EEXIST on the other's).
pub fn staging_dir(cache_dir: &std::path::Path, mountpoint: &std::path::Path) -> PathBuf {
    cache_dir.join(STAGING).join(mount_dir_name(mountpoint))
}

/// Where the mount at `mountpoint` records its uploads in progress, so the next start
/// aborts those a crash cut off (`strata_cache_core::store::UploadJournal`): beside
/// the staging directories, not in one, as those of mounts not mounted now are removed
/// while their records must wait for a mount of their store.
pub fn uploads_dir(cache_dir: &std::path::Path, mountpoint: &std::path::Path) -> PathBuf {
    cache_dir.join(UPLOADS).join(mount_dir_name(mountpoint))
}

/// A mount point as one directory name (see [`staging_dir`]).
fn mount_dir_name(mountpoint: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    // One name however the mountpoint is spelt: absolute, without trailing slashes or
    // `.` (crash finding: `/mnt/x/` found no fsync records of `/mnt/x`).
    let mountpoint: PathBuf = std::path::absolute(mountpoint)
        .unwrap_or_else(|_| mountpoint.to_path_buf())
        .components()
        .collect();
    let mountpoint = mountpoint.as_path();
    let readable: Vec<char> = mountpoint
        .to_string_lossy()
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() || c == '-' {
            true => c,
            false => '_',
        })
        .collect();
    // Its end only, past READABLE_MAX: a file name has at most 255 bytes (black-box
    // finding: a mountpoint of 215 bytes made a staging folder name no file system
    // takes, and the mount went read-only). The checksum keeps it unique.
    let readable: String = readable[readable.len().saturating_sub(READABLE_MAX)..]
        .iter()
        .collect();
    let sum = crc32c::crc32c(mountpoint.as_os_str().as_bytes());
    format!("{readable}-{sum:08x}")
}

/// The most characters (ASCII) of a mountpoint a staging folder's name keeps: with the
/// checksum, well within a file name's 255 bytes.
const READABLE_MAX: usize = 200;

/// The cache dir's folder of staging directories.
const STAGING: &str = "staging";
/// The cache dir's folder of the mounts' upload journals.
const UPLOADS: &str = "uploads";
/// The cache dir's folder of the listing logs of mounts with an indefinite metadata
/// TTL (`strata_fs` `listing_log.rs`).
const METADATA: &str = "metadata";

/// Removes the staging directories of mounts this daemon does not have (an earlier
/// run's mountpoints, or names of an older version): their files were never uploaded,
/// as a mount's own are dropped when it starts, and nothing else would ever remove
/// them or count them in the disk budget (crash finding: 42 MiB of `.part` files of
/// four earlier mountpoints outside the budget). The cache dir is this daemon's alone
/// (its index is locked), so no live mount stages there. A directory holding files an
/// fsync made durable (their `.part.json` records) is kept: those writes were
/// acknowledged, and a mount of their store at that mountpoint uploads them.
pub fn remove_other_staging(cache_dir: &std::path::Path, mounts: &[MountConfig]) {
    for e in other_mounts_entries(cache_dir, STAGING, mounts, staging_dir) {
        let path = e.path();
        if strata_fs::mount::mounted_at_or_under(&path) {
            // remove_dir_all would empty whatever is mounted there (black-box finding:
            // a bind mount, even another writable strata mount, lost its files).
            tracing::warn!(dir = %path.display(),
                "kept another mount's staging folder: something is mounted inside it");
            continue;
        }
        let fsynced = strata_fs::filesystem::fsync_records(&path);
        if fsynced > 0 {
            tracing::warn!(dir = %path.display(), fsynced,
                "kept the staged writes of a mount this daemon does not have: files fsync'd before a crash, uploaded when that mountpoint is mounted over their store again");
            continue;
        }
        // Only files are staged writes: an empty folder a clean stop left is no loss to
        // warn about (black-box finding, round 23b: "never uploaded" for a folder of a
        // mount whose every file had been uploaded).
        let staged = files_under(&path);
        let removed = match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        match removed {
            Ok(()) if staged > 0 => tracing::warn!(dir = %path.display(), files = staged,
                "removed the staged writes of a mount this daemon does not have (never uploaded)"),
            Ok(()) => {
                tracing::debug!(dir = %path.display(), "removed an empty staging folder of another mount")
            }
            Err(e) => tracing::warn!(dir = %path.display(), error = %e,
                "cannot remove another mount's staged writes"),
        }
    }
}

/// Regular files in `path` and below (`path` itself if it is one).
fn files_under(path: &std::path::Path) -> usize {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|d| d.flatten().map(|e| files_under(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) if m.is_file() => 1,
        _ => 0,
    }
}

/// Mounts `m.prefix` of `store` (named `url`) at `m.mountpoint` on `core`'s engine,
/// reading blocks other nodes own through `peers` in a cache group. Must run inside
/// the daemon's tokio runtime.
pub fn mount(
    m: &MountConfig,
    core: &Core,
    store: &BackingStore,
    url: &str,
    endpoint: Option<&str>,
    peers: Option<std::sync::Arc<dyn strata_cache_core::PeerSource>>,
) -> anyhow::Result<MountHandle> {
    refuse_self_reference(m, Some(&core.cache_dir), url)?;
    let opts = mount_options(m, core, url)?;
    // Read-only mounts too: a crash of a writable run at this mount point is cleaned
    // by whichever mount comes next (a refusal of the store is only logged).
    let store =
        with_upload_journal(m, core, store, &journal_store_id(url, endpoint)).with_own_counts();
    let mut reader = ObjectReader::new(core.engine.clone(), store, core.block_size)?
        .with_granularity(core.granularity);
    if let Some(p) = peers {
        reader = reader.with_peers(p);
    }
    // A dead daemon's mount there is replaced (strata_fs::spawn); it cannot be made.
    // A stuck one's is refused: anything else would hang on it.
    if !strata_fs::mount::dead_mount_or_refuse_stuck(&m.mountpoint)? {
        std::fs::create_dir_all(&m.mountpoint)
            .with_context(|| format!("creating {}", m.mountpoint.display()))?;
    }
    strata_fs::spawn(reader, &m.prefix, &m.mountpoint, opts)
        .with_context(|| format!("mounting {url} at {}", m.mountpoint.display()))
}

/// `mountpoint` as the kernel resolves it (symbolic links and `..` followed): the path
/// itself, or for one not made yet its nearest existing folder's resolved path with the
/// rest joined, or else the absolute spelling. Ask only after
/// [`strata_fs::mount::dead_mount_or_refuse_stuck`]: resolving stats the path.
pub fn resolved_mountpoint(mountpoint: &Path) -> PathBuf {
    let absolute = std::path::absolute(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let mut rest = Vec::new();
    let mut at = absolute.as_path();
    loop {
        if let Ok(real) = std::fs::canonicalize(at) {
            return rest.iter().rev().fold(real, |p, part| p.join(part));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            _ => return absolute,
        }
    }
}

/// Refuses a mount that would read or write itself: a local directory store at, under
/// or above the mountpoint (`strata mount file:///X X` listed its own mount, each
/// `ls` blocking 40 s in the kernel before EIO: black-box finding), a cache dir under
/// the mountpoint or inside a local store, or a mountpoint inside the cache dir (the
/// first write staged its file into its own mount and hung, unkillable: black-box
/// finding).
fn refuse_self_reference(
    m: &MountConfig,
    cache_dir: Option<&Path>,
    url: &str,
) -> anyhow::Result<()> {
    let mp = resolved(&m.mountpoint);
    let cache = cache_dir.map(|d| (d, resolved(d)));
    if let Some((dir, cache)) = &cache {
        if cache.starts_with(&mp) {
            anyhow::bail!(
                "the cache dir {} is inside the mountpoint {}: the daemon would cache into \
                 its own mount",
                dir.display(),
                m.mountpoint.display()
            );
        }
        if mp.starts_with(cache) {
            anyhow::bail!(
                "the mountpoint {} is inside the cache dir {}: the daemon would stage writes \
                 into its own mount (mount it outside the cache dir)",
                m.mountpoint.display(),
                dir.display()
            );
        }
    }
    let Some(root) = url.strip_prefix("file://") else {
        return Ok(());
    };
    let Ok(root) = std::fs::canonicalize(root) else {
        return Ok(()); // the store's own open reports it
    };
    if root.starts_with(&mp) || mp.starts_with(&root) {
        anyhow::bail!(
            "the store {url} and the mountpoint {} overlap: the mount would read itself \
             (mount the directory somewhere outside it)",
            m.mountpoint.display()
        );
    }
    if let Some((dir, cache)) = &cache {
        if cache.starts_with(&root) {
            anyhow::bail!(
                "the cache dir {} is inside the store {url}: the mount would show (and let \
                 jobs delete) the daemon's own cache files",
                dir.display()
            );
        }
    }
    Ok(())
}

/// [`refuse_self_reference`] for every mount of `cfg`, with its configured cache dir
/// (a temp one is checked when made): run before the cache dir is created, so a
/// refused start leaves nothing in the store or the mountpoint.
pub fn refuse_self_references(cfg: &crate::config::StrataConfig) -> anyhow::Result<()> {
    let Some(url) = cfg.store.url.as_deref() else {
        return Ok(());
    };
    for m in &cfg.mounts {
        refuse_self_reference(m, cfg.cache.dir.as_deref(), url)?;
    }
    Ok(())
}

/// Refuses a cache dir inside another Strata mount: its blocks, index and staged
/// writes would be objects in that mount's store, written through a second daemon
/// (black-box finding: the start failed late on RocksDB's rename, after leaving its
/// lock file, log and index files as objects in the other bucket; with deletes
/// allowed there the whole cache lived in someone else's bucket). Checked before the
/// cache dir is made.
pub fn refuse_cache_dir_on_a_strata_mount(cache_dir: Option<&Path>) -> anyhow::Result<()> {
    let Some(dir) = cache_dir else {
        return Ok(());
    };
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Ok(());
    };
    let at = resolved(dir);
    if let Some(mp) = strata_mount_holding(&table, &at) {
        anyhow::bail!(
            "the cache dir {} is inside the Strata mount {}: the cache would be written \
             into that mount's store; put it on a local disk",
            dir.display(),
            mp.display()
        );
    }
    Ok(())
}

/// The mountpoint of the mount holding `path` in a `/proc/self/mountinfo` table (the
/// longest mountpoint that is a prefix of it), if that mount is Strata's: a plain
/// `fuse` mount named by its store's URL (Strata's `fsname`) or `strata`. (Other FUSE
/// file systems name their type, `fuse.sshfs`, `fuse.fuse-overlayfs`: a rootless
/// container's root is one, and a cache dir there is fine.)
fn strata_mount_holding(mountinfo: &str, path: &Path) -> Option<PathBuf> {
    let mut best: Option<(PathBuf, bool)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(mp), Some(fstype), Some(source)) =
            (fields.get(4), fields.get(sep + 1), fields.get(sep + 2))
        else {
            continue;
        };
        let mp = strata_fs::mount::unescape_mountinfo(mp);
        let longer = best
            .as_ref()
            .is_none_or(|(b, _)| mp.as_os_str().len() >= b.as_os_str().len());
        if path.starts_with(&mp) && longer {
            let strata =
                *fstype == "fuse" && (source.contains("://") || source.starts_with("strata"));
            best = Some((mp, strata));
        }
    }
    best.filter(|(_, strata)| *strata).map(|(mp, _)| mp)
}

/// `path` with links resolved as far as it exists, the rest joined as written: a
/// mountpoint or cache dir may not be made yet, and `..` in that rest is dropped
/// lexically.
fn resolved(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut rest = Vec::new();
    let mut at = abs.as_path();
    loop {
        if let Ok(real) = std::fs::canonicalize(at) {
            let mut out = real;
            for c in rest.iter().rev() {
                match c {
                    std::path::Component::ParentDir => {
                        out.pop();
                    }
                    std::path::Component::Normal(n) => out.push(n),
                    _ => {}
                }
            }
            return out;
        }
        match (at.parent(), at.components().next_back()) {
            (Some(parent), Some(last)) => {
                rest.push(last);
                at = parent;
            }
            _ => return abs,
        }
    }
}

/// The entries of the cache dir's `folder` (one per mountpoint, named by `dir_of`) that
/// belong to none of `mounts`: an earlier run's mountpoints.
fn other_mounts_entries(
    cache_dir: &Path,
    folder: &str,
    mounts: &[MountConfig],
    dir_of: fn(&Path, &Path) -> PathBuf,
) -> Vec<std::fs::DirEntry> {
    let keep: std::collections::HashSet<PathBuf> = mounts
        .iter()
        .map(|m| dir_of(cache_dir, &m.mountpoint))
        .collect();
    let Ok(entries) = std::fs::read_dir(cache_dir.join(folder)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| !keep.contains(&e.path()))
        .collect()
}

/// Whether mount `m` keeps files of its own under the cache dir (passthrough copies,
/// or files written through it until uploaded): the disk budget's share for them is
/// kept only then. A `passthrough_max` that does not parse counts as on (the mount's
/// own start reports it).
pub fn keeps_local_files(m: &MountConfig) -> bool {
    m.allow_writes || crate::config::parse_size(&m.passthrough_max).map_or(true, |n| n > 0)
}

/// Whether the cache dir holds upload records of mounts other than `mounts`.
pub fn other_mounts_left_uploads(cache_dir: &Path, mounts: &[MountConfig]) -> bool {
    !other_mounts_entries(cache_dir, UPLOADS, mounts, uploads_dir).is_empty()
}

/// Aborts `left` in `store` in the background, logging `what`, then runs `then`.
fn abort_in_background(
    store: BackingStore,
    left: Vec<strata_cache_core::store::LeftUpload>,
    what: &'static str,
    then: impl FnOnce() + Send + 'static,
) {
    tokio::spawn(async move {
        let n = left.len();
        let cleaned = store.abort_left(left).await;
        tracing::info!(cleaned, of = n, "{what}");
        then();
    });
}

/// Aborts, in the background, the uploads that mounts this daemon no longer has (an
/// earlier run's mountpoints) left unfinished in `store`: their staged files are removed
/// at start (`remove_other_staging`), so nothing would ever finish them, and without
/// this their parts stayed in the bucket for good (black-box finding: a mount taken out
/// of strata.toml after a crash leaked its multipart upload; kept in, it was aborted).
/// Records of other stores stay for a mount of theirs.
pub fn abort_other_mounts_uploads(
    cache_dir: &Path,
    mounts: &[MountConfig],
    store: &BackingStore,
    url: &str,
    endpoint: Option<&str>,
) {
    let id = journal_store_id(url, endpoint);
    for e in other_mounts_entries(cache_dir, UPLOADS, mounts, uploads_dir) {
        let dir = e.path();
        if !dir.is_dir() {
            continue;
        }
        let left = match strata_cache_core::store::UploadJournal::open(&dir, &id) {
            Ok((_, left)) => left,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot read another mount's upload records");
                continue;
            }
        };
        if left.is_empty() {
            // Nothing of this store; an empty folder of an old mount goes.
            let _ = std::fs::remove_dir(&dir);
            continue;
        }
        abort_in_background(
            store.clone(),
            left,
            "uploads a mount this daemon no longer has left unfinished",
            move || {
                let _ = std::fs::remove_dir(&dir);
            },
        );
    }
}

/// The store as the upload journal names it: the URL and, for an S3-compatible server,
/// its endpoint. The bucket alone is not enough: a restart against another server
/// holding a bucket of that name "cleaned" the first server's upload record without
/// reaching its parts, which stayed there for good (black-box finding).
fn journal_store_id(url: &str, endpoint: Option<&str>) -> String {
    match endpoint {
        Some(e) => format!("{url} at {e}"),
        None => url.to_string(),
    }
}

/// `store` with the mount's uploads recorded while in progress, after aborting (in
/// the background) those its last run left unfinished: read before the mount serves,
/// so no upload of this run is among them. A journal that cannot be opened costs only
/// the cleanup (logged).
fn with_upload_journal(
    m: &MountConfig,
    core: &Core,
    store: &BackingStore,
    url: &str,
) -> BackingStore {
    let dir = uploads_dir(&core.cache_dir, &m.mountpoint);
    match strata_cache_core::store::UploadJournal::open(&dir, url) {
        Ok((journal, left)) => {
            let store = store.clone().with_upload_journal(journal);
            if !left.is_empty() {
                let what = "uploads an earlier run left unfinished";
                abort_in_background(store.clone(), left, what, || {});
            }
            store
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e,
                "cannot open the upload journal: an upload a crash cuts off stays in the store");
            store.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CacheConfig;
    use crate::daemon::cache::open_core;

    /// Black-box finding (round 18): a read-only mount with passthrough off kept a
    /// quarter of the disk budget for copies it could never make.
    #[test]
    fn only_mounts_that_copy_or_write_keep_local_files() {
        let m = |writes: bool, max: &str| MountConfig {
            allow_writes: writes,
            passthrough_max: max.into(),
            ..Default::default()
        };
        assert!(keeps_local_files(&MountConfig::default()));
        assert!(!keeps_local_files(&m(false, "0")));
        assert!(keeps_local_files(&m(true, "0")), "its files until uploaded");
        assert!(keeps_local_files(&m(false, "1MiB")));
    }
    use std::sync::Arc;

    fn core(dir: &std::path::Path, disk: &str) -> Core {
        open_core(&CacheConfig {
            dir: Some(dir.join("cache")),
            memory: "8MiB".into(),
            disk: disk.into(),
            ..Default::default()
        })
        .expect("core")
    }

    /// Every mount of a daemon shares one store of local files (copies and staged
    /// writes): two stores indexing one directory would each count the whole share and
    /// delete each other's copies. Copy names are set apart by the store URL.
    #[test]
    fn mounts_share_one_budget_of_local_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core = core(dir.path(), "64MiB");
        let m = |at: &str| MountConfig {
            mountpoint: dir.path().join(at),
            allow_writes: true,
            ..Default::default()
        };
        let a = mount_options(&m("a"), &core, "s3://one").expect("a");
        let b = mount_options(&m("b"), &core, "s3://two").expect("b");
        let (pa, pb) = (
            a.core.passthrough.expect("copies a"),
            b.core.passthrough.expect("copies b"),
        );
        assert!(Arc::ptr_eq(&pa.copies, &pb.copies));
        assert_eq!(pa.copies.budget(), 16 << 20, "the disk budget's share");
        assert_ne!(
            pa.name_for("k", "v", 10),
            pb.name_for("k", "v", 10),
            "two stores' equal keys are two copies"
        );
        let writes = a.core.writes.expect("writes");
        // Uploads in flight within a quarter of the 8 MiB memory tier, one part at least.
        assert_eq!(writes.upload_memory, writes.part_size as u64);
        let staged = writes.local_files.expect("charged");
        assert!(Arc::ptr_eq(&staged, &pa.copies));
    }

    /// Parts on the wire across a mount's uploads stay within a quarter of the memory
    /// tier, as reads in flight do (black-box finding: each file written in order kept
    /// 8 parts, 64 MiB, in memory while the store stalled; 8 writers got the daemon
    /// OOM-killed in a 512 MiB cgroup with a 192 MiB tier).
    #[test]
    fn uploads_in_flight_take_a_quarter_of_the_memory_tier() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core = open_core(&CacheConfig {
            dir: Some(dir.path().join("cache")),
            memory: "192MiB".into(),
            disk: "40MiB".into(),
            ..Default::default()
        })
        .expect("core");
        let m = MountConfig {
            mountpoint: dir.path().join("m"),
            allow_writes: true,
            ..Default::default()
        };
        let opts = mount_options(&m, &core, "s3://one").expect("options");
        assert_eq!(opts.core.writes.expect("writes").upload_memory, 48 << 20);
    }

    /// An upload recorded against one S3 server is left for a mount of that server: a
    /// mount of a bucket of the same name on another endpoint does not take it.
    #[test]
    fn upload_records_name_the_endpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (e1, e2) = (
            journal_store_id("s3://bkt/d", Some("http://127.0.0.1:1")),
            journal_store_id("s3://bkt/d", Some("http://127.0.0.1:2")),
        );
        let (j, _) = strata_cache_core::store::UploadJournal::open(dir.path(), &e1).expect("open");
        let rec = j.record("d/ckpt.bin", Some("upload-1"));
        std::mem::forget(rec); // the daemon died with it in progress
        let (_, left) = strata_cache_core::store::UploadJournal::open(dir.path(), &e2).expect("e2");
        assert!(
            left.is_empty(),
            "another server's upload is not this mount's"
        );
        let (_, left) = strata_cache_core::store::UploadJournal::open(dir.path(), &e1).expect("e1");
        assert_eq!(left.len(), 1, "the same server's mount takes it");
    }

    /// A local directory store at, under or above the mountpoint, or a cache dir under
    /// it, is refused with the reason; side by side they are fine.
    #[test]
    fn a_mount_that_would_read_itself_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core = core(dir.path(), "0");
        for d in ["data/mnt", "other"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        let at = |p: &str| MountConfig {
            mountpoint: dir.path().join(p),
            ..Default::default()
        };
        let url = |p: &str| format!("file://{}", dir.path().join(p).display());
        for (store, mp) in [("data", "data"), ("data", "data/mnt"), ("data/mnt", "data")] {
            let e = refuse_self_reference(&at(mp), Some(&core.cache_dir), &url(store))
                .expect_err("overlap");
            assert!(e.to_string().contains("overlap"), "{e}");
        }
        refuse_self_reference(&at("other"), Some(&core.cache_dir), &url("data")).expect("apart");
        refuse_self_reference(&at("other"), Some(&core.cache_dir), "s3://bucket")
            .expect("not local");
        // The cache dir (dir/cache) under the mountpoint (dir).
        let e = refuse_self_reference(&at(""), Some(&core.cache_dir), "s3://bucket")
            .expect_err("cache inside");
        assert!(e.to_string().contains("cache dir"), "{e}");
        // A mountpoint inside the cache dir, made or not yet made.
        for mp in ["cache/staging", "cache/new/m"] {
            let e =
                refuse_self_reference(&at(mp), Some(&core.cache_dir), "s3://bucket").expect_err(mp);
            assert!(e.to_string().contains("inside the cache dir"), "{e}");
        }
        // The cache dir (dir/cache) inside a local store, the mountpoint outside it.
        let e = refuse_self_reference(&at("other"), Some(&core.cache_dir), &url("cache"))
            .expect_err("cache in store");
        assert!(e.to_string().contains("inside the store"), "{e}");
    }

    /// Black-box finding: a mount taken out of strata.toml after a crash left its
    /// multipart upload in the bucket for good (kept in, it was aborted at the start).
    #[tokio::test]
    async fn uploads_of_mounts_no_longer_configured_are_aborted_at_start() {
        use object_store::multipart::MultipartStore;
        use strata_cache_core::store::{UploadJournal, UploadShape};
        let cache = tempfile::tempdir().expect("tempdir");
        let mem = Arc::new(object_store::memory::InMemory::new());
        let url = "s3://b";
        let id = journal_store_id(url, Some("http://127.0.0.1:9"));
        let gone = MountConfig {
            mountpoint: "/mnt/removed".into(),
            ..Default::default()
        };
        let (journal, _) = UploadJournal::open(&uploads_dir(cache.path(), &gone.mountpoint), &id)
            .expect("journal");
        let store = BackingStore::new(mem.clone(), url, Default::default())
            .with_part_store(mem.clone(), "");
        let run1 = store.clone().with_upload_journal(journal);
        let shape = UploadShape {
            part_size: 8,
            in_flight: 2,
            slots: None,
            only_if_absent: false,
        };
        let mut up = run1.start_upload("ckpt.bin", &shape).await.expect("start");
        up.put(bytes::Bytes::from(vec![7u8; 20]))
            .await
            .expect("put");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        std::mem::forget(up); // the crash
        let (_, left) =
            UploadJournal::open(&uploads_dir(cache.path(), &gone.mountpoint), &id).expect("reopen");
        let upload_id = left[0].record.upload_id.clone().expect("id");
        let location = object_store::path::Path::from("ckpt.bin");

        let kept = MountConfig {
            mountpoint: "/mnt/kept".into(),
            ..Default::default()
        };
        abort_other_mounts_uploads(
            cache.path(),
            &[kept],
            &store,
            url,
            Some("http://127.0.0.1:9"),
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while uploads_dir(cache.path(), &gone.mountpoint).exists() {
            assert!(std::time::Instant::now() < deadline, "not cleaned");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(
            mem.put_part(
                &location,
                &upload_id,
                9,
                bytes::Bytes::from_static(b"x").into()
            )
            .await
            .is_err(),
            "the upload was aborted"
        );
    }

    #[test]
    fn resolved_paths_follow_links_as_far_as_they_exist() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        std::os::unix::fs::symlink(&real, dir.path().join("link")).expect("symlink");
        let real = std::fs::canonicalize(&real).expect("canonical");
        assert_eq!(resolved(&dir.path().join("link/a/b")), real.join("a/b"));
        assert_eq!(resolved(&dir.path().join("link/a/../b")), real.join("b"));
    }

    /// With "0" for the disk budget Strata writes nothing to disk, so a writable mount
    /// (it stages files on disk) is refused with the reason.
    #[test]
    fn writes_need_a_disk_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core = core(dir.path(), "0");
        let m = MountConfig {
            mountpoint: dir.path().join("m"),
            allow_writes: true,
            ..Default::default()
        };
        let err = mount_options(&m, &core, "s3://one").expect_err("refused");
        assert!(err.to_string().contains("disk budget"), "{err}");
        // Black-box finding: a budget of 1 to 3 bytes was refused as if it were "0".
        let tiny = tempfile::tempdir().expect("tempdir");
        let err = mount_options(&m, &self::core(tiny.path(), "3"), "s3://one").expect_err("3");
        assert!(err.to_string().contains("at least 4 bytes"), "{err}");
        let ro = MountConfig {
            allow_writes: false,
            ..m
        };
        assert!(
            mount_options(&ro, &core, "s3://one").is_ok(),
            "read-only is fine"
        );
    }

    /// Black-box finding: a mountpoint of 215 bytes gave a staging folder name over
    /// 255 bytes, and `--allow-writes` went read-only. Names stay short and apart.
    #[test]
    fn a_long_mountpoint_stages_under_a_short_name_of_its_own() {
        let long = format!("/{}", "d/".repeat(150));
        let (a, b) = (
            mount_dir_name(std::path::Path::new(&format!("{long}a"))),
            mount_dir_name(std::path::Path::new(&format!("{long}b"))),
        );
        assert!(a.len() <= 255, "{}", a.len());
        assert_ne!(a, b);
        assert!(mount_dir_name(std::path::Path::new("/mnt/train")).starts_with("_mnt_train-"));
    }

    /// Black-box finding: the start's clean-up emptied a bind mount (even a writable
    /// strata mount) mounted inside another mount's staging folder.
    #[test]
    fn what_is_mounted_is_found_under_a_folder_and_not_beside_it() {
        assert!(
            strata_fs::mount::mounted_at_or_under(std::path::Path::new("/")),
            "the root file system"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(!strata_fs::mount::mounted_at_or_under(
            &dir.path().join("nothing-mounted")
        ));
    }

    /// Mountpoints that read alike stage apart (`/X/a_b/m` and `/X/a/b_m` shared one
    /// directory), and a daemon's start removes only the staging of other mounts.
    #[test]
    fn each_mountpoint_stages_apart_and_other_staging_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path();
        let (a, b) = (
            staging_dir(cache, std::path::Path::new("/X/a_b/m")),
            staging_dir(cache, std::path::Path::new("/X/a/b_m")),
        );
        assert_ne!(a, b);
        assert_eq!(a, staging_dir(cache, std::path::Path::new("/X/a_b/m")));
        assert_eq!(a, staging_dir(cache, std::path::Path::new("/X/a_b/m/")));
        assert_eq!(a, staging_dir(cache, std::path::Path::new("/X/a_b/./m")));
        for d in [&a, &b] {
            std::fs::create_dir_all(d).expect("mkdir");
            std::fs::write(d.join("1.part"), b"never uploaded").expect("write");
        }
        let old_name = cache.join("staging").join("_X_a_b_m");
        std::fs::create_dir_all(&old_name).expect("mkdir");
        // A crash left a file fsync'd at a third mountpoint: acknowledged, kept.
        let fsynced = staging_dir(cache, std::path::Path::new("/X/c"));
        std::fs::create_dir_all(&fsynced).expect("mkdir");
        std::fs::write(fsynced.join("1.part"), b"fsync'd").expect("write");
        std::fs::write(fsynced.join("1.part.json"), b"{}").expect("write");
        let keep = MountConfig {
            mountpoint: "/X/a_b/m".into(),
            ..Default::default()
        };
        remove_other_staging(cache, &[keep]);
        assert!(
            a.join("1.part").exists(),
            "this daemon's mount keeps its own"
        );
        assert!(
            !b.exists() && !old_name.exists(),
            "other mounts' staging removed"
        );
        assert!(
            fsynced.join("1.part").exists(),
            "files fsync'd before a crash kept"
        );
        // What is warned about as never uploaded: files only (round 23b: an empty
        // folder a clean stop left was).
        let empty = cache.join("staging").join("empty");
        std::fs::create_dir_all(empty.join("files")).expect("mkdir");
        assert_eq!(files_under(&empty), 0);
        assert_eq!(files_under(&fsynced), 2);
    }

    /// Black-box finding (round 13): a cache dir inside another Strata mount left its
    /// lock, log and index files as objects in that mount's bucket. The mount holding a
    /// path is the longest mountpoint over it; only Strata's are refused.
    #[test]
    fn a_cache_dir_inside_a_strata_mount_is_found_by_the_longest_mountpoint() {
        let table = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                     90 22 0:50 / /mnt/data rw,nosuid,nodev - fuse s3://bkt/p rw,user_id=0\n\
                     91 90 8:2 / /mnt/data/local rw - ext4 /dev/sdb1 rw\n\
                     92 22 0:51 / /mnt/with\\040space rw - fuse file:///srv/d rw\n\
                     93 22 0:52 / /home/u/.local rw - fuse.fuse-overlayfs fuse-overlayfs rw\n";
        let holding = |p: &str| strata_mount_holding(table, Path::new(p));
        assert_eq!(holding("/mnt/data/cache"), Some(PathBuf::from("/mnt/data")));
        assert_eq!(holding("/mnt/data"), Some(PathBuf::from("/mnt/data")));
        assert_eq!(
            holding("/mnt/data/local/cache"),
            None,
            "a disk mounted inside it"
        );
        assert_eq!(holding("/var/cache/strata"), None);
        assert_eq!(holding("/mnt/database"), None, "a prefix of the name only");
        assert_eq!(
            holding("/mnt/with space/c"),
            Some(PathBuf::from("/mnt/with space"))
        );
        assert_eq!(
            holding("/home/u/.local/c"),
            None,
            "another FUSE file system"
        );
        assert!(refuse_cache_dir_on_a_strata_mount(Some(Path::new("/tmp/x"))).is_ok());
    }
}
