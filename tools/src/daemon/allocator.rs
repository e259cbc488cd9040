//! glibc's allocator fitted to the daemon's memory limit.
//!
//! Every block read, fetched, written or served is a buffer of 64 KiB..64 MiB. glibc
//! serves allocations over its mmap threshold (128 KiB at start) with a fresh `mmap`, so
//! each 1 MiB buffer costs ~256 page faults and zeroed pages: a quarter of the CPU of a
//! loopback KV Get in a profile. Raising the mmap and trim thresholds keeps those buffers
//! in the heap for reuse, but what the heap keeps free counts against the limit: with
//! glibc's maxima (32 MiB, 256 MiB) a daemon in a 256 MiB cgroup was OOM-killed by 40 MiB
//! puts that its capped budgets admitted (black-box finding). So both scale with the
//! limit ([`thresholds`]).
//!
//! The trim threshold holds per arena, and glibc makes up to eight arenas per core (each
//! thread that meets a locked arena gets another): four sequential readers of a mount with
//! a 32 MiB memory tier peaked at 223 MB resident, 149 MB with two arenas, and one such
//! daemon in a 128 MiB cgroup was OOM-killed (black-box finding, round 17's own probe). So
//! the arenas are also capped ([`arenas`]), so that all of them together keep at most an
//! eighth of the limit free. Small allocations are served by each thread's cache first,
//! so fewer arenas cost little contention.
//!
//! [`tune`] is called once at start by every daemon (mount and serve) and by the KV
//! benches; [`thresholds`] and [`arenas`] are pure. No-op on other C libraries.

/// glibc's mmap and trim thresholds for a process under a memory limit of `limit` bytes:
/// a 64th and a 16th of it, at most glibc's maximum mmap threshold (32 MiB) and 256 MiB
/// (reached from 2 and 4 GiB of limit), at least glibc's defaults (128 KiB). The free heap
/// kept so stays a small share of the limit.
pub fn thresholds(limit: Option<u64>) -> (u64, u64) {
    const MMAP_MAX: u64 = 32 << 20;
    const TRIM_MAX: u64 = 256 << 20;
    const FLOOR: u64 = 128 << 10;
    let limit = limit.unwrap_or(u64::MAX);
    (
        (limit / 64).clamp(FLOOR, MMAP_MAX),
        (limit / 16).clamp(FLOOR, TRIM_MAX),
    )
}

/// How many arenas glibc may make under a memory limit of `limit` bytes on `cpus` cores:
/// as many as keep an eighth of the limit at most free (each may keep the trim threshold
/// of [`thresholds`]), at least two (threads of the runtime and of FUSE then rarely wait
/// on one lock), at most glibc's own default (eight per core).
pub fn arenas(limit: Option<u64>, cpus: u64) -> u64 {
    let (_, trim) = thresholds(limit);
    let glibc_default = 8 * cpus.max(1);
    let room = limit.map_or(u64::MAX, |l| l / 8);
    (room / trim).clamp(2, glibc_default.max(2))
}

/// Sets glibc's thresholds and arena count for a limit of `limit` bytes (the cgroup's or
/// the host's RAM; None: unknown). Call before the serving threads start.
pub fn tune(limit: Option<u64>) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let (mmap, trim) = thresholds(limit);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        let arenas = arenas(limit, cpus);
        // SAFETY: mallopt only sets allocator parameters; it is called before the
        // serving threads allocate (and glibc serialises it with its own lock anyway).
        // The thresholds are at most 256 MiB and the arenas at most 8 per core, so each
        // fits a c_int.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap as libc::c_int);
            libc::mallopt(libc::M_TRIM_THRESHOLD, trim as libc::c_int);
            libc::mallopt(
                libc::M_ARENA_MAX,
                arenas.min(i32::MAX as u64) as libc::c_int,
            );
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = limit;
}

/// Hands the free pages of every arena back to the system (`malloc_trim(0)`). The trim
/// threshold only ever releases the top of a heap: after a walk of a few hundred thousand
/// names, the small allocations of its listings and inodes are freed in between ones
/// still held, and the daemon kept ~300 MB resident that it no longer used, until the
/// next walk was OOM-killed (black-box finding, round 19b). The daemon calls it every
/// [`TRIM_EVERY`]; it walks the arenas' free lists, milliseconds for a heap of that size.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How often the daemon trims its heap ([`trim`]): 10 s.
pub const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::{arenas, thresholds};

    #[test]
    fn thresholds_scale_with_the_limit_between_glibc_defaults_and_maxima() {
        assert_eq!(thresholds(None), (32 << 20, 256 << 20));
        assert_eq!(thresholds(Some(64 << 30)), (32 << 20, 256 << 20));
        // A 256 MiB cgroup: buffers over 4 MiB go back to the system when freed, and
        // at most 16 MiB of free heap is kept per arena.
        assert_eq!(thresholds(Some(256 << 20)), (4 << 20, 16 << 20));
        assert_eq!(thresholds(Some(1 << 20)), (128 << 10, 128 << 10));
    }

    #[test]
    fn arenas_together_keep_at_most_an_eighth_of_the_limit_free() {
        // Under 4 GiB the trim threshold is a 16th: two arenas keep an eighth.
        assert_eq!(arenas(Some(128 << 20), 2), 2);
        assert_eq!(arenas(Some(2 << 30), 16), 2);
        // 24 GiB of RAM: 256 MiB each, 12 of them make 3 GiB.
        assert_eq!(arenas(Some(24 << 30), 16), 12);
        // glibc's own count where the limit leaves more room, or none is known.
        assert_eq!(arenas(Some(24 << 30), 1), 8);
        assert_eq!(arenas(None, 4), 32);
        // Never fewer than two, even under a tiny limit.
        assert_eq!(arenas(Some(1 << 20), 2), 2);
        for limit in [64u64 << 20, 300 << 20, 1 << 30, 5 << 30, 100 << 30] {
            let (_, trim) = thresholds(Some(limit));
            let n = arenas(Some(limit), 64);
            assert!(n == 2 || n * trim <= limit / 8, "{limit}: {n} x {trim}");
        }
    }
}
