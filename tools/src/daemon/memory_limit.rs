//! The memory this daemon may use, and the memory tier and KV arena fitted to it.
//!
//! A daemon in a container runs under a memory cgroup whose limit is often far below
//! the host's RAM (a Kubernetes pod's `limits.memory`). The memory tier (default 1 GiB)
//! and the KV shared-memory arena (default 256 MiB) are filled by use, so a daemon sized
//! past its limit starts fine and is OOM-killed at the first large load, taking every
//! mount (ENOTCONN) and KV client with it (black-box finding: `strata serve` with the
//! default memory tier in a 256 MiB cgroup was killed after 243 puts; `--memory 2GiB`
//! in 600 MiB after 144). So at start the daemon reads its limit: the smallest
//! `memory.max` (cgroup v2) or `memory.limit_in_bytes` (v1) of its cgroup and the
//! cgroup's ancestors, and the host's RAM. The memory tier is capped at half of it less
//! 64 MiB (at least a quarter) and the arena at an eighth, with a warning naming both
//! figures: the rest is for what
//! no budget counts (reads in flight, upload parts, per-block bookkeeping, the
//! allocator's slack; about 100-200 MiB for a few sequential readers).
//!
//! Reading the limit is the only I/O here; [`fit`] is pure.

use std::path::{Path, PathBuf};

/// The memory the daemon may use and what sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    pub bytes: u64,
    /// "the host's RAM" or the cgroup file that sets the limit.
    pub source: String,
}

/// The share of the limit the memory tier may take.
const TIER_SHARE: u64 = 2;
/// The share of the limit the KV arena may take.
const ARENA_SHARE: u64 = 8;

/// The daemon's memory limit now (None: neither RAM nor a cgroup limit could be read).
pub fn memory_limit() -> Option<MemoryLimit> {
    let ram = host_ram().map(|bytes| MemoryLimit {
        bytes,
        source: "the host's RAM".into(),
    });
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|own| cgroup_limit(&own, Path::new("/sys/fs/cgroup")));
    match (ram, cgroup) {
        (Some(r), Some(c)) if c.bytes < r.bytes => Some(c),
        (Some(r), _) => Some(r),
        (None, c) => c,
    }
}

fn host_ram() -> Option<u64> {
    // SAFETY: sysconf reads a system constant.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && page > 0).then(|| pages as u64 * page as u64)
}

/// The smallest memory limit of the cgroups `own` (the text of `/proc/self/cgroup`)
/// names and their ancestors, under the cgroup file systems at `root`: v2 (`0::/path`,
/// at `root` or `root/unified` in the hybrid layout) and v1 (the `memory` controller,
/// at `root/memory`). Values of 2^60 and more are v1's "no limit".
pub fn cgroup_limit(own: &str, root: &Path) -> Option<MemoryLimit> {
    let mut best: Option<MemoryLimit> = None;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        let candidates: Vec<(PathBuf, &str)> = if id == "0" && controllers.is_empty() {
            vec![
                (root.join(rel), "memory.max"),
                (root.join("unified").join(rel), "memory.max"),
            ]
        } else if controllers.split(',').any(|c| c == "memory") {
            vec![(root.join("memory").join(rel), "memory.limit_in_bytes")]
        } else {
            continue;
        };
        for (dir, file) in candidates {
            let mut at = Some(dir.as_path());
            while let Some(d) = at {
                if !d.starts_with(root) {
                    break;
                }
                let f = d.join(file);
                if let Some(bytes) = std::fs::read_to_string(&f)
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok())
                    .filter(|&b| b > 0 && b < 1 << 60)
                {
                    if best.as_ref().is_none_or(|b| bytes < b.bytes) {
                        best = Some(MemoryLimit {
                            bytes,
                            source: f.display().to_string(),
                        });
                    }
                }
                at = d.parent();
            }
        }
    }
    best
}

/// What the daemon needs beside its budgets at the least (its code, runtime, a put
/// being assembled next to its chunks, the allocator's slack): 64 MiB. Under a small
/// limit half of it for the tier left too little of that (black-box finding: 256 MiB
/// cgroup, tier capped at 128 MiB, killed by the fifth 31 MiB put).
const BASE_BYTES: u64 = 64 << 20;

/// The memory tier and arena sizes that fit under `limit`: each as configured, or its
/// share of the limit when that is less. The tier's share is half the limit less
/// [`BASE_BYTES`], and at least a quarter of it.
pub fn fit(tier: u64, arena: u64, limit: u64) -> (u64, u64) {
    let tier_share = (limit / TIER_SHARE)
        .saturating_sub(BASE_BYTES)
        .max(limit / 4);
    (tier.min(tier_share), arena.min(limit / ARENA_SHARE))
}

/// The disk budget that fits under `limit` for a cache dir held in memory (tmpfs,
/// ramfs), whose pages count against the limit: a quarter of it at most, beside the
/// memory tier's half less 64 MiB.
pub fn fit_memory_backed_disk(disk: u64, limit: u64) -> u64 {
    disk.min(limit / 4)
}

/// The share of the limit the disk tier's per-block bookkeeping may take: an eighth.
const DISK_BOOKKEEPING_SHARE: u64 = 8;
/// The fewest blocks a disk tier is allowed, however small the limit: 4096 (8 MiB of
/// bookkeeping; 4 GiB of 1 MiB blocks).
const MIN_DISK_BLOCKS: u64 = 4096;

/// Most blocks the disk tier may keep under `limit`: each costs
/// [`ENTRY_BOOKKEEPING`](strata_cache_core::ENTRY_BOOKKEEPING) of memory whatever its
/// size, and together they may take an eighth of the limit (black-box finding: a disk
/// budget of tiny files is millions of blocks, each held in memory). 1 MiB blocks are
/// not held back by it: a 16 GiB host allows 1 Mi blocks, a terabyte of them.
pub fn disk_blocks(limit: u64) -> u64 {
    (limit / DISK_BOOKKEEPING_SHARE / strata_cache_core::ENTRY_BOOKKEEPING).max(MIN_DISK_BLOCKS)
}

/// The disk tier's I/O buffers kept for reuse under `limit` (`DiskOptions::
/// buf_pool_bytes`): a thirty-second of it, at most the tier's 64 MiB default and at
/// least 2 MiB (two 1 MiB blocks in flight reuse their buffers). The pool's 64 MiB
/// held whatever the limit: a daemon in a 128 MiB cgroup kept 57 MB of freed buffers
/// there under ordinary reads and writes and was OOM-killed (black-box finding, round
/// 24, measured with heaptrack).
pub fn disk_buffer_pool(limit: u64) -> usize {
    (limit / 32).clamp(2 << 20, 64 << 20) as usize
}

/// What a mount's metadata may hold under the daemon's memory limit (see
/// [`metadata_budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataBudget {
    /// Cached attributes and listings, in bytes (`strata_fs::CoreOptions::metadata_bytes`).
    pub cache_bytes: u64,
    /// Listed names the semantic predictor remembers.
    pub predictor_names: usize,
    /// Inodes the kernel does not reference (`strata_fs::CoreOptions::max_inodes`).
    pub unreferenced_inodes: usize,
}

/// The metadata caches' share of the limit: an eighth, split among the mounts.
const METADATA_SHARE: u64 = 8;
/// The predictor's and the unreferenced inodes' share each: a thirty-second.
const NAMES_SHARE: u64 = 32;
/// Estimated bytes per name in the predictor's listing index (~260 B measured with
/// heaptrack over 400,000 names) and per inode (~160 B).
const PREDICTOR_NAME_BYTES: u64 = 256;
const INODE_BYTES: u64 = 160;

/// The metadata each of `mounts` mounts may hold under `limit`. Every name a mount
/// lists costs memory in its attribute and listing caches, the predictor's index and
/// the inode table (~1.4 KB in all), whatever the tiers hold (black-box finding:
/// `find` over 400,000 names took 575 MB, and killed the daemon in a 400 MiB cgroup).
/// Capped at the defaults a large host had before (1 Mi inodes, 4 M names).
pub fn metadata_budget(limit: u64, mounts: usize) -> MetadataBudget {
    let mounts = mounts.max(1) as u64;
    let names = limit / NAMES_SHARE / mounts;
    MetadataBudget {
        cache_bytes: (limit / METADATA_SHARE / mounts).max(8 << 20),
        predictor_names: (names / PREDICTOR_NAME_BYTES).clamp(16_384, 4_000_000) as usize,
        unreferenced_inodes: (names / INODE_BYTES).clamp(16_384, 1 << 20) as usize,
    }
}

/// Whether `dir` lies on a file system held in memory (tmpfs, ramfs), whose pages are
/// charged to the memory limit of whoever writes them.
pub fn memory_backed(dir: &Path) -> bool {
    // (The libc crate names tmpfs's, not ramfs's.)
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` has room for the result.
    if unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: statfs returned 0, so it filled `st`.
    let kind = unsafe { st.assume_init() }.f_type;
    kind == libc::TMPFS_MAGIC || kind == RAMFS_MAGIC
}

/// `configured` bytes of `what` ("[cache] memory", "[kv] shm"), capped under the
/// daemon's memory limit with a warning when it does not fit.
pub fn capped(what: &str, configured: u64, fitted: u64, limit: &MemoryLimit) -> u64 {
    if fitted < configured {
        tracing::warn!(
            configured,
            capped_to = fitted,
            limit = limit.bytes,
            source = %limit.source,
            "{what} is larger than this daemon's memory limit leaves room for: capped (the \
             memory tier takes at most half the limit less 64 MiB, the KV arena an eighth; the rest is \
             for reads in flight and bookkeeping). Set it lower, or raise the limit"
        );
    }
    fitted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_blocks_take_an_eighth_of_the_limit_and_keep_a_floor() {
        // 16 GiB: 2 GiB of bookkeeping at 2 KiB a block.
        assert_eq!(disk_blocks(16 << 30), 1 << 20);
        assert_eq!(disk_blocks(128 << 20), 8192);
        assert_eq!(disk_blocks(1 << 20), MIN_DISK_BLOCKS);
    }

    #[test]
    fn the_disk_buffer_pool_follows_the_limit() {
        assert_eq!(disk_buffer_pool(128 << 20), 4 << 20);
        assert_eq!(
            disk_buffer_pool(16 << 30),
            64 << 20,
            "the tier's default at most"
        );
        assert_eq!(disk_buffer_pool(32 << 20), 2 << 20, "two blocks at least");
    }

    #[test]
    fn metadata_takes_its_shares_of_the_limit_split_among_mounts() {
        // 400 MiB: 50 MiB of cached attributes and listings, ~51,000 predictor names
        // and ~82,000 unreferenced inodes (12.5 MiB each).
        let small = metadata_budget(400 << 20, 1);
        assert_eq!(small.cache_bytes, 50 << 20);
        assert_eq!(small.predictor_names, (400 << 20) / 32 / 256);
        assert_eq!(small.unreferenced_inodes, (400 << 20) / 32 / 160);
        // Two mounts share it.
        let two = metadata_budget(400 << 20, 2);
        assert_eq!(two.cache_bytes, 25 << 20);
        assert_eq!(two.predictor_names, small.predictor_names / 2);
        // A large host keeps the old caps; a tiny limit keeps floors.
        let large = metadata_budget(256 << 30, 1);
        assert_eq!(
            (large.predictor_names, large.unreferenced_inodes),
            (4_000_000, 1 << 20)
        );
        let tiny = metadata_budget(16 << 20, 4);
        assert_eq!(tiny.cache_bytes, 8 << 20);
        assert_eq!(
            (tiny.predictor_names, tiny.unreferenced_inodes),
            (16_384, 16_384)
        );
        // Zero mounts (a KV-only daemon) counts as one.
        assert_eq!(metadata_budget(400 << 20, 0), small);
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn a_cache_dir_in_memory_takes_a_quarter_of_the_limit_at_most() {
        assert_eq!(fit_memory_backed_disk(10 << 30, 256 << 20), 64 << 20);
        assert_eq!(fit_memory_backed_disk(32 << 20, 256 << 20), 32 << 20);
        // /proc is neither tmpfs nor ramfs; a path that does not exist is not either.
        assert!(!memory_backed(Path::new("/proc")));
        assert!(!memory_backed(Path::new("/no/such/dir")));
    }

    #[test]
    fn the_smallest_limit_of_the_cgroup_and_its_ancestors_counts() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // v1: the own group unlimited, its parent limited (a pod's group).
        write(r, "memory/memory.limit_in_bytes", "9223372036854771712\n");
        write(r, "memory/pod/memory.limit_in_bytes", "536870912\n");
        write(
            r,
            "memory/pod/app/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        let own = "9:pids:/\n4:memory:/pod/app\n0::/\n";
        let l = cgroup_limit(own, r).expect("limited");
        assert_eq!(l.bytes, 512 << 20);
        assert!(
            l.source.ends_with("memory/pod/memory.limit_in_bytes"),
            "{l:?}"
        );
        // v2: "max" is no limit; a number below the v1 one wins.
        write(r, "kube/memory.max", "max\n");
        write(r, "kube/c1/memory.max", "268435456\n");
        let own = "0::/kube/c1\n4:memory:/pod/app\n";
        assert_eq!(cgroup_limit(own, r).expect("limited").bytes, 256 << 20);
        // Nothing limited: none.
        assert_eq!(cgroup_limit("0::/\n4:memory:/\n", r), None);
        assert_eq!(cgroup_limit("garbage", r), None);
    }

    #[test]
    fn a_tier_and_arena_past_their_shares_are_capped() {
        assert_eq!(fit(1 << 30, 256 << 20, 256 << 20), (64 << 20, 32 << 20));
        assert_eq!(fit(1 << 30, 256 << 20, 1 << 30), (448 << 20, 128 << 20));
        assert_eq!(fit(64 << 20, 16 << 20, 16 << 30), (64 << 20, 16 << 20));
        let limit = MemoryLimit {
            bytes: 256 << 20,
            source: "test".into(),
        };
        assert_eq!(
            capped("[cache] memory", 1 << 30, 128 << 20, &limit),
            128 << 20
        );
    }

    #[test]
    fn this_process_has_a_limit_no_larger_than_its_ram() {
        let l = memory_limit().expect("RAM is known");
        assert!(l.bytes <= host_ram().unwrap());
    }
}
