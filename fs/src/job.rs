//! Which *job* a FUSE request belongs to.
//!
//! The kernel stamps every FUSE request with the calling **thread's** id (`Request::pid`
//! is the TID, in the daemon's pid namespace; 0 when the caller is not visible there).
//! Taken as the job id as is, one data-loader process with four reader threads becomes
//! four jobs, each seeing an irregular quarter of the job's order: the semantic
//! predictor (which clusters streams by job and template) then finds no stride and no
//! listing adjacency, and the engine's stream tree splits one stream in four. This
//! module maps the TID to a job id once per TID and caches it.
//!
//! **Scope** ([`JobScope`], default [`JobScope::ProcessGroup`]):
//! - `Thread`: the TID itself (the old behaviour; kept for comparison benchmarks).
//! - `Process`: the thread group (`Tgid:` of `/proc/<tid>/status`): all threads of one
//!   process are one job.
//! - `ProcessGroup` (default): the process group (`pgrp`, field 5 of `/proc/<tid>/stat`).
//!   Why the group and not the process: a PyTorch `DataLoader` reads through
//!   `num_workers` *worker processes*, each reading whole batches of one shuffled
//!   order; `torchrun` starts one process per rank. Per process, each worker sees a
//!   strided subsequence of the order; as one job, the predictor sees the order itself
//!   (its lanes keep the workers apart where they diverge). Workers are forked (fork,
//!   spawn and forkserver all fork from the main process or a fork of it), and a fork
//!   inherits the process group, so the group is exactly "the main process and its
//!   workers". Why not the parent pid: the main process's parent is the shell, so
//!   parent-grouping needs a walk up the tree with a rule for where to stop (the
//!   executable changing? the session?), and the parent of a worker whose main
//!   process died is init. Why not the session: one terminal is one session, so every
//!   command typed in it would be one job. The process group is also the shell's own
//!   notion of a job: an interactive shell gives each command line (a pipeline) its own
//!   group, so two commands run from one terminal stay two jobs. The cost: a
//!   non-interactive script running several unrelated readers in the background gives
//!   them its one group, i.e. one job; the semantic predictor still separates them by
//!   path template and lane (the offline "four tenants interleaved, one job id" trace
//!   keeps 91.6% precision), so a merge costs a little precision where a split (the
//!   thread case) cost all of the coverage. A group id of 0 (kernel threads, and init
//!   in some containers) means "no group": the process is used instead.
//!
//! **Fallbacks.** If `/proc/<tid>` cannot be read (the caller exited, or `/proc` is not
//! mounted or belongs to another pid namespace) the TID is the job. TID 0 (a caller
//! outside the daemon's pid namespace) resolves to `None` and the core uses the file
//! handle instead.
//!
//! **Cache.** The hot path must not read `/proc` on every 128 KiB read: results are
//! kept per TID in a map bounded by [`JobResolver::MAX_ENTRIES`] for
//! [`JobResolver::TTL`]. A resolution costs one small procfs read (a few µs) per TID
//! per TTL. The file is read with no lock held; the map's mutex guards only a lookup or
//! an insert.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// What a job is. See the module doc.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JobScope {
    /// The calling thread.
    Thread,
    /// The calling process (thread group).
    Process,
    /// The calling process's process group: a data loader's workers, `torchrun`'s
    /// ranks, a shell pipeline.
    #[default]
    ProcessGroup,
}

/// The `Tgid:` line of a `/proc/<tid>/status` text.
pub fn parse_tgid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `(ppid, pgrp)` of a `/proc/<tid>/stat` line. The command name (field 2) is in
/// parentheses and may itself hold spaces and parentheses, so fields are counted from
/// the *last* `)`: then state, ppid, pgrp.
pub fn parse_stat_pgrp(stat: &str) -> Option<(u32, u32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    let _state = f.next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    Some((ppid, pgrp))
}

/// Maps a request's TID to its job id, with a small bounded cache. See the module doc.
pub struct JobResolver {
    scope: JobScope,
    /// Root of the proc file system (`/proc`; tests point it at a fixture).
    proc_root: PathBuf,
    /// tid -> (job, resolved at).
    cache: Mutex<HashMap<u32, (u64, Instant)>>,
}

impl std::fmt::Debug for JobResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobResolver")
            .field("scope", &self.scope)
            .field("cached", &self.cache.lock().len())
            .finish()
    }
}

impl JobResolver {
    /// How long a resolution is trusted: 1 s. TIDs are reused once the kernel's pid
    /// counter wraps (`pid_max` is 32768 on small machines, and a busy build host
    /// wraps it in tens of seconds), so a mapping must not outlive its thread by much;
    /// a reader thread doing hundreds of reads a second then pays one procfs read per
    /// second.
    pub const TTL: Duration = Duration::from_secs(1);
    /// Most TIDs cached: 4096, well above the reader threads of one machine's jobs
    /// (~100 KiB). When full, expired entries go first, then everything (a refill costs
    /// one procfs read per live reader).
    pub const MAX_ENTRIES: usize = 4096;

    pub fn new(scope: JobScope) -> Self {
        Self::with_proc_root(scope, PathBuf::from("/proc"))
    }

    /// A resolver reading `<root>/<tid>/status` and `<root>/<tid>/stat` instead of
    /// `/proc`'s.
    pub fn with_proc_root(scope: JobScope, root: PathBuf) -> Self {
        JobResolver {
            scope,
            proc_root: root,
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn scope(&self) -> JobScope {
        self.scope
    }

    /// Number of cached TIDs (tests, stats).
    pub fn cached(&self) -> usize {
        self.cache.lock().len()
    }

    /// The job of a request from thread `tid`; None for TID 0 (caller not visible).
    pub fn job_of(&self, tid: u32) -> Option<u64> {
        self.job_of_at(tid, Instant::now())
    }

    /// [`Self::job_of`] at time `now` (tests drive the TTL with it).
    pub fn job_of_at(&self, tid: u32, now: Instant) -> Option<u64> {
        if tid == 0 {
            return None;
        }
        if self.scope == JobScope::Thread {
            return Some(tid as u64);
        }
        if let Some(&(job, at)) = self.cache.lock().get(&tid) {
            if now.saturating_duration_since(at) < Self::TTL {
                return Some(job);
            }
        }
        // Read with no lock held; two threads racing on one new TID both read, harmless.
        let job = self.resolve(tid).unwrap_or(tid) as u64;
        let mut cache = self.cache.lock();
        if cache.len() >= Self::MAX_ENTRIES && !cache.contains_key(&tid) {
            cache.retain(|_, (_, at)| now.saturating_duration_since(*at) < Self::TTL);
            if cache.len() >= Self::MAX_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(tid, (job, now));
        Some(job)
    }

    /// Reads procfs: the thread group, and for `ProcessGroup` the group (falling back
    /// to the thread group when the group is 0 or unreadable).
    fn resolve(&self, tid: u32) -> Option<u32> {
        let dir = self.proc_root.join(tid.to_string());
        let tgid = || {
            std::fs::read_to_string(dir.join("status"))
                .ok()
                .and_then(|s| parse_tgid(&s))
        };
        match self.scope {
            JobScope::Thread => Some(tid),
            JobScope::Process => tgid(),
            JobScope::ProcessGroup => std::fs::read_to_string(dir.join("stat"))
                .ok()
                .and_then(|s| parse_stat_pgrp(&s))
                .map(|(_, pgrp)| pgrp)
                .filter(|&g| g != 0)
                .or_else(tgid),
        }
    }
}

/// The calling thread's id (tests; the daemon gets TIDs from the kernel).
pub fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_stat_lines() {
        let status = "Name:\tpython\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nNgid:\t0\nPid:\t4250\nPPid:\t4000\n";
        assert_eq!(parse_tgid(status), Some(4242));
        assert_eq!(parse_tgid("Name:\tx\n"), None);
        assert_eq!(parse_tgid("Tgid:\tnope\n"), None);
        // A command name with spaces and parentheses.
        let stat = "4250 (pt worker (1)) S 4000 3999 3999 0 -1 4194304 104 0";
        assert_eq!(parse_stat_pgrp(stat), Some((4000, 3999)));
        assert_eq!(parse_stat_pgrp("4250 (x) S"), None);
        assert_eq!(parse_stat_pgrp("garbage"), None);
    }

    /// Threads of this test process: per process they are all this process; per
    /// process group, this process's group; per thread, themselves.
    #[test]
    fn threads_of_one_process_are_one_job() {
        let proc_ = JobResolver::new(JobScope::Process);
        let group = JobResolver::new(JobScope::ProcessGroup);
        let thread = JobResolver::new(JobScope::Thread);
        // SAFETY: getpgrp has no preconditions and cannot fail.
        let pgrp = unsafe { libc::getpgrp() } as u64;
        let me = std::process::id() as u64;
        let tids: Vec<u32> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let tid = current_tid();
                        assert_eq!(proc_.job_of(tid), Some(me));
                        assert_eq!(group.job_of(tid), Some(pgrp));
                        assert_eq!(thread.job_of(tid), Some(tid as u64));
                        tid
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        let mut distinct = tids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "four threads, four tids: {tids:?}");
        assert_eq!(proc_.cached(), 4);
        assert_eq!(thread.cached(), 0, "thread scope needs no cache");
        assert_eq!(proc_.job_of(0), None);
    }

    /// A child process (as a data loader's worker is) shares our process group but not
    /// our process.
    #[test]
    fn a_child_process_is_in_its_parents_group() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let proc_job = JobResolver::new(JobScope::Process).job_of(pid);
        let group_job = JobResolver::new(JobScope::ProcessGroup).job_of(pid);
        child.kill().expect("kill own child");
        child.wait().expect("reap");
        // SAFETY: getpgrp has no preconditions and cannot fail.
        let pgrp = unsafe { libc::getpgrp() } as u64;
        assert_eq!(proc_job, Some(pid as u64));
        assert_eq!(group_job, Some(pgrp));
        assert_ne!(pid as u64, std::process::id() as u64);
    }

    fn fake_proc(entries: &[(u32, u32, u32)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        for &(tid, tgid, pgrp) in entries {
            let dir = d.path().join(tid.to_string());
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("status"), format!("Name:\tx\nTgid:\t{tgid}\n"))
                .expect("status");
            std::fs::write(dir.join("stat"), format!("{tid} (x) S 1 {pgrp} 1 0 -1")).expect("stat");
        }
        d
    }

    /// Unreadable procfs falls back to the TID; a group of 0 falls back to the process.
    #[test]
    fn falls_back_to_the_process_then_the_tid() {
        let d = fake_proc(&[(10, 9, 0), (11, 9, 7)]);
        let r = JobResolver::with_proc_root(JobScope::ProcessGroup, d.path().into());
        assert_eq!(r.job_of(10), Some(9), "group 0: the process");
        assert_eq!(r.job_of(11), Some(7));
        assert_eq!(r.job_of(12), Some(12), "no procfs entry: the tid");
        let none = JobResolver::with_proc_root(JobScope::Process, d.path().join("absent"));
        assert_eq!(none.job_of(11), Some(11));
    }

    /// A result is reused within the TTL (procfs not re-read) and re-read after it.
    #[test]
    fn cached_for_the_ttl_then_re_resolved() {
        let d = fake_proc(&[(20, 5, 5)]);
        let r = JobResolver::with_proc_root(JobScope::Process, d.path().into());
        let t0 = Instant::now();
        assert_eq!(r.job_of_at(20, t0), Some(5));
        // The tid is reused by another process.
        std::fs::write(d.path().join("20/status"), "Tgid:\t6\n").expect("rewrite");
        assert_eq!(
            r.job_of_at(20, t0 + JobResolver::TTL / 2),
            Some(5),
            "within the TTL: cached"
        );
        assert_eq!(
            r.job_of_at(20, t0 + JobResolver::TTL),
            Some(6),
            "after the TTL: re-read"
        );
    }

    /// The cache never holds more than MAX_ENTRIES TIDs: expired ones go first, then all.
    #[test]
    fn the_cache_is_bounded() {
        let r = JobResolver::with_proc_root(JobScope::Process, PathBuf::from("/nonexistent"));
        let t0 = Instant::now();
        let n = JobResolver::MAX_ENTRIES as u32;
        for tid in 1..=n {
            assert_eq!(r.job_of_at(tid, t0), Some(tid as u64));
        }
        assert_eq!(r.cached(), JobResolver::MAX_ENTRIES);
        // Full, nothing expired: cleared, then the new one inserted.
        r.job_of_at(n + 1, t0);
        assert_eq!(r.cached(), 1);
        for tid in 1..n {
            r.job_of_at(tid, t0);
        }
        // Full again; half of them now expired: only the expired ones go.
        let later = t0 + JobResolver::TTL;
        for tid in 1..=n / 2 {
            r.job_of_at(tid, later);
        }
        assert_eq!(r.cached(), JobResolver::MAX_ENTRIES);
        r.job_of_at(n + 5, later);
        assert_eq!(
            r.cached(),
            JobResolver::MAX_ENTRIES / 2 + 1,
            "fresh half kept"
        );
        assert_eq!(r.job_of_at(1, later), Some(1));
    }
}
