//! Where a job resumes a file it left midway.
//!
//! The semantic predictor names *files*: a small file it predicts is fetched whole, a
//! large one from its start. That is right for a job that reads files one after another
//! (a loader's epoch, a listing walked in order), and wrong for one that takes turns
//! among open files, reading a piece of each: GNU `sort -m` refills a 176 KiB buffer per
//! sorted run as the merge drains it, in the runs' order, so the names look like a
//! lexical walk, and each predicted run was fetched whole, its second block a whole pass
//! before the merge reached it (held-out `sortmerge`: 591 speculative block fetches for
//! 96 blocks of data, most evicted unread).
//!
//! So the controller remembers, per job, where each file visit that stopped short of the
//! file's end stopped and how much it read, and counts whether the job's next visits of
//! such files continue there or start elsewhere. Once continuing is the job's habit
//! (`MIN_RESUMES` more continues than restarts, and twice as many), a cross-file
//! prediction of a file the job left midway asks for what the next visit would read:
//! as many bytes as the last visit read, from where it stopped (and of a file it has
//! not visited, as many from the start). A job that re-reads files
//! from the start (an image indexer reading each file's header, then whole files in
//! shuffled epochs) keeps whole-file prefetch, as does any file read to its end.

use std::collections::HashMap;
use std::sync::Arc;

use strata_types::{FxBuild, JobId};

use crate::{AccessEvent, PrefetchRequest};

/// Continues a job needs beyond its restarts before predictions resume files: 4, so a
/// few chance returns to where a visit stopped do not change a job's prefetch.
const MIN_RESUMES: u32 = 4;

/// Files remembered across all jobs before the record is cleared: 1 << 16, a few MiB.
const MAX_LEFT: usize = 1 << 16;

/// Jobs whose current visit is remembered: 64Ki; beyond it the memory is cleared (each
/// job then counts its current file as new once more).
const MAX_JOBS: usize = 1 << 16;

/// The visit in progress: the file, where the visit began and ended, the file's size.
#[derive(Clone, Debug)]
struct Visit {
    path: Arc<str>,
    start: u64,
    end: u64,
    size: u64,
}

/// A job's habit on coming back to a file it left midway.
#[derive(Clone, Copy, Debug, Default)]
struct Habit {
    continued: u32,
    restarted: u32,
    /// Bytes its last visit that stopped midway read.
    piece: u64,
}

impl Habit {
    fn resumes(&self) -> bool {
        self.continued >= self.restarted.saturating_add(MIN_RESUMES)
            && self.continued >= self.restarted.saturating_mul(2)
    }
}

/// Visits per job and where the ones left midway stopped. See the module docs.
#[derive(Debug, Default)]
pub(super) struct Resume {
    /// Per job: the file it is reading (its last access's) and where this visit of it
    /// began and ended.
    current: HashMap<JobId, Visit, FxBuild>,
    /// (job, file) -> (where its last visit stopped, bytes it read), for visits that
    /// stopped short of the file's end.
    left: HashMap<(JobId, Arc<str>), (u64, u64), FxBuild>,
    habits: HashMap<JobId, Habit, FxBuild>,
}

impl Resume {
    /// Every demand access. Returns whether it is to another file than the job's
    /// previous access (a new visit: the semantic predictor's feeding rule).
    pub(super) fn on_access(&mut self, ev: &AccessEvent) -> bool {
        let end = ev.offset.saturating_add(ev.len);
        if let Some(v) = self.current.get_mut(&ev.job) {
            if Arc::ptr_eq(&v.path, &ev.path) || *v.path == *ev.path {
                v.end = end;
                v.size = v.size.max(ev.file_size);
                return false;
            }
        }
        if self.current.len() >= MAX_JOBS {
            self.current.clear();
        }
        if self.left.len() >= MAX_LEFT {
            self.left.clear();
            self.habits.clear();
        }
        let visit = Visit {
            path: ev.path.clone(),
            start: ev.offset,
            end,
            size: ev.file_size,
        };
        if let Some(old) = self.current.insert(ev.job, visit) {
            if old.size > 0 && old.end < old.size && old.end > old.start {
                let piece = old.end - old.start;
                self.left.insert((ev.job, old.path), (old.end, piece));
                self.habits.entry(ev.job).or_default().piece = piece;
            } else if !self.left.is_empty() {
                self.left.remove(&(ev.job, old.path));
            }
        }
        if self.left.is_empty() {
            return true; // files read whole (KV blocks, a loader's samples): nothing to resume
        }
        if let Some(&(stopped, _)) = self.left.get(&(ev.job, ev.path.clone())) {
            let h = self.habits.entry(ev.job).or_default();
            if ev.offset == stopped {
                h.continued = h.continued.saturating_add(1);
            } else {
                h.restarted = h.restarted.saturating_add(1);
            }
        }
        true
    }

    /// Narrows `job`'s cross-file predictions of files it left midway to what its next
    /// visit would read, once resuming is its habit; drops those left with nothing.
    pub(super) fn narrow(&self, job: JobId, reqs: &mut Vec<PrefetchRequest>) {
        let Some(habit) = self.habits.get(&job).filter(|h| h.resumes()) else {
            return;
        };
        reqs.retain_mut(|r| {
            let Some(&(stopped, read)) = self.left.get(&(job, r.path.clone())) else {
                // Not visited yet (or read to its end): the first piece of it.
                r.len = r.len.min(habit.piece.max(1));
                return true;
            };
            let end = r.offset.saturating_add(r.len);
            if stopped >= end {
                return false;
            }
            r.offset = stopped.max(r.offset);
            r.len = read.min(end - r.offset);
            r.len > 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(job: u64, path: &str, offset: u64, len: u64) -> AccessEvent {
        AccessEvent::read(job, path, offset, len, 2 << 20)
    }

    fn whole(path: &str) -> PrefetchRequest {
        PrefetchRequest {
            path: Arc::from(path),
            offset: 0,
            len: 2 << 20,
            confidence: 0.8,
        }
    }

    /// A merge's turns: each of `files` runs read `piece` bytes per visit, `turns` times.
    fn merge_turns(r: &mut Resume, files: u32, piece: u64, turns: u64) {
        for t in 0..turns {
            for f in 0..files {
                r.on_access(&read(1, &format!("run-{f:03}"), t * piece, piece));
            }
        }
    }

    #[test]
    fn a_merge_that_resumes_its_runs_is_predicted_where_each_run_stopped() {
        let mut r = Resume::default();
        let piece = 176 << 10;
        merge_turns(&mut r, 8, piece, 3);
        let mut reqs = vec![whole("run-003"), whole("other")];
        r.narrow(JobId(1), &mut reqs);
        assert_eq!(reqs.len(), 2);
        assert_eq!((reqs[0].offset, reqs[0].len), (3 * piece, piece));
        assert_eq!(
            (reqs[1].offset, reqs[1].len),
            (0, piece),
            "a file not visited: a piece"
        );
        // Another job's habit is its own.
        let mut theirs = vec![whole("run-003")];
        r.narrow(JobId(2), &mut theirs);
        assert_eq!(theirs[0].len, 2 << 20);
    }

    #[test]
    fn a_job_that_restarts_files_keeps_whole_file_prefetch() {
        let mut r = Resume::default();
        // Each file's header first, then whole files from the start.
        for f in 0..16 {
            r.on_access(&read(1, &format!("img-{f}"), 0, 4096));
        }
        for f in 0..16 {
            let path = format!("img-{f}");
            assert!(r.on_access(&read(1, &path, 0, 1 << 20)), "a new visit");
            assert!(
                !r.on_access(&read(1, &path, 1 << 20, 1 << 20)),
                "the same visit"
            );
        }
        let mut reqs = vec![whole("img-3")];
        r.narrow(JobId(1), &mut reqs);
        assert_eq!((reqs[0].offset, reqs[0].len), (0, 2 << 20));
    }

    #[test]
    fn a_few_chance_continues_change_nothing() {
        let mut r = Resume::default();
        merge_turns(&mut r, 4, 4096, 1);
        // Comes back to each file where it stopped: 3 continues, below the habit.
        merge_turns_from(&mut r, 3, 4096);
        let mut reqs = vec![whole("run-001")];
        r.narrow(JobId(1), &mut reqs);
        assert_eq!(reqs[0].len, 2 << 20);
    }

    fn merge_turns_from(r: &mut Resume, files: u32, piece: u64) {
        for f in 0..files {
            r.on_access(&read(1, &format!("run-{f:03}"), piece, piece));
        }
    }
}
