//! What `strata bench replay --json` prints (and the `replay_json` example, which
//! builds without the `strata` binary): one row per policy with its cost, as thread CPU
//! time and as wall-clock time.

use std::time::{Duration, Instant};

use super::{make_policy, replay, PolicyResult, Prepared, ReplayConfig};

#[derive(Debug, serde::Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub result: PolicyResult,
    /// Wall-clock seconds one replay took (this machine, one core; mean of
    /// `replay_runs`).
    pub replay_wall_s: f64,
    pub replay_accesses_per_s: f64,
    /// CPU seconds the replaying thread used for one replay (`CLOCK_THREAD_CPUTIME_ID`). The replay
    /// runs on one thread, so this is its whole cost; unlike the wall figure it does not
    /// count the time other processes held the core, which on a loaded shared machine
    /// spread the wall-time speed ratio 2-60x between runs of one binary.
    pub replay_cpu_s: f64,
    /// `replay_cpu_s` per block access, in nanoseconds: the speed figure to compare
    /// policies by (issue 13: strata within 3x of lru).
    pub replay_cpu_ns_per_access: f64,
    /// Replays timed (see [`MIN_TIMED_CPU`], after the warm-up of [`WARM_UP_BELOW`]);
    /// the figures above are their mean.
    pub replay_runs: u32,
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub trace: String,
    pub capacity_bytes: u64,
    pub unique_bytes: u64,
    pub results: Vec<Row>,
}

/// CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_time() -> std::io::Result<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Both fields are non-negative for a CPU-time clock.
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// A replay that takes less CPU time than this is run again (a fresh policy each time)
/// until its runs add up to it, and the mean is reported: a trace of a few hundred
/// accesses replays in well under a millisecond, where a first-touch page fault or a
/// cold cache line decides the figure (single runs of the 102-access `safetensors`
/// trace gave strata/lru CPU ratios of 2.35-5.66x).
pub const MIN_TIMED_CPU: Duration = Duration::from_millis(20);
/// Bound on those runs, so a trace of a handful of accesses stays quick.
pub const MAX_TIMED_RUNS: u32 = 1000;
/// A replay whose first run takes less CPU time than this is timed only from its
/// second run on, for every policy alike. The first run pays the process's cold
/// costs (page faults of fresh allocations, allocator growth, cold caches): 15-40% of a
/// 25 ms strata replay of `loader`. Without a warm-up a policy fast enough to be
/// repeated ([`MIN_TIMED_CPU`]) had most of its runs warm while a slower one was timed
/// on its cold run alone, which biased the ratio against the slower policy. A replay
/// this long or longer amortises the cold costs in one run and is not repeated.
pub const WARM_UP_BELOW: Duration = Duration::from_millis(200);

/// Runs `run` (one replay: its result, CPU and wall time) as [`run_all`] times a
/// policy: the first run untimed when it took under [`WARM_UP_BELOW`], then runs until
/// their CPU time adds up to [`MIN_TIMED_CPU`] (at most [`MAX_TIMED_RUNS`]). Returns
/// the first run's result, the timed runs' CPU and wall time, and their number.
fn time_runs<R>(
    mut run: impl FnMut() -> anyhow::Result<(R, Duration, Duration)>,
) -> anyhow::Result<(R, Duration, Duration, u32)> {
    let (result, mut cpu, mut wall) = run()?;
    let mut runs = 1u32;
    if cpu < WARM_UP_BELOW {
        // That run was the warm-up: time the following ones.
        (cpu, wall, runs) = (Duration::ZERO, Duration::ZERO, 0);
    }
    while runs == 0 || (cpu < MIN_TIMED_CPU && runs < MAX_TIMED_RUNS) {
        let (_, c, w) = run()?;
        cpu += c;
        wall += w;
        runs += 1;
    }
    Ok((result, cpu, wall, runs))
}

/// Replays `p` under each of `policies`, timing each (CPU and wall, per run; see
/// [`MIN_TIMED_CPU`] and [`WARM_UP_BELOW`]). The result is the first run's (the replay
/// is deterministic).
pub fn run_all(p: &Prepared, policies: &[String], cfg: &ReplayConfig) -> anyhow::Result<Vec<Row>> {
    policies
        .iter()
        .map(|name| {
            let timed_run = || -> anyhow::Result<(PolicyResult, Duration, Duration)> {
                let set = make_policy(name, cfg.capacity_bytes)?;
                // Wall clock read outside the CPU clock, so the CPU interval lies
                // within the wall interval (the replay is on this thread: cpu <= wall).
                let wall0 = Instant::now();
                let cpu0 = thread_cpu_time()?;
                let result = replay(p, set, cfg);
                let cpu = thread_cpu_time()?.saturating_sub(cpu0);
                Ok((result, cpu, wall0.elapsed()))
            };
            let (result, cpu, wall, runs) = time_runs(timed_run)?;
            let cpu = cpu.as_secs_f64() / f64::from(runs);
            let wall = wall.as_secs_f64() / f64::from(runs);
            Ok(Row {
                replay_accesses_per_s: result.accesses as f64 / wall.max(1e-9),
                replay_wall_s: wall,
                replay_cpu_s: cpu,
                replay_cpu_ns_per_access: 1e9 * cpu / result.accesses.max(1) as f64,
                replay_runs: runs,
                result,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::gen::{generate, Workload};

    #[test]
    fn a_sleeping_thread_accrues_wall_time_but_not_cpu_time() {
        let cpu0 = thread_cpu_time().expect("clock");
        let wall0 = Instant::now();
        std::thread::sleep(Duration::from_millis(50));
        let cpu = thread_cpu_time().expect("clock").saturating_sub(cpu0);
        let wall = wall0.elapsed();
        assert!(wall >= Duration::from_millis(50));
        // A wall clock (or a process clock with busy threads) would report >= 50 ms.
        assert!(cpu < Duration::from_millis(25), "cpu {cpu:?} while asleep");
    }

    #[test]
    fn a_busy_thread_accrues_cpu_time() {
        let cpu0 = thread_cpu_time().expect("clock");
        let mut x = 0u64;
        let until = Instant::now() + Duration::from_millis(20);
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        assert!(thread_cpu_time().expect("clock") > cpu0);
    }

    #[test]
    fn replay_cpu_time_is_positive_and_within_its_wall_time() {
        let t = generate(Workload::Mixed, 1, 0.02);
        let p = Prepared::new(t, strata_cache_core::DEFAULT_BLOCK_SIZE);
        let cfg = ReplayConfig::new(p.unique_bytes() / 5);
        let policies = ["lru".to_string(), "strata".to_string()];
        let rows = run_all(&p, &policies, &cfg).expect("replay");
        for r in &rows {
            assert!(r.result.accesses > 0);
            assert!(
                r.replay_cpu_s > 0.0,
                "{}: cpu {}",
                r.result.policy,
                r.replay_cpu_s
            );
            assert!(r.replay_runs >= 1);
            // One thread replays, and its CPU interval is inside the wall interval.
            assert!(
                r.replay_cpu_s <= r.replay_wall_s,
                "{}: cpu {} > wall {}",
                r.result.policy,
                r.replay_cpu_s,
                r.replay_wall_s
            );
            let per_access = 1e9 * r.replay_cpu_s / r.result.accesses as f64;
            assert!((r.replay_cpu_ns_per_access - per_access).abs() < 1e-6 * per_access);
        }
    }

    #[test]
    fn a_short_first_run_is_a_warm_up_for_every_policy_and_a_long_one_is_timed() {
        let ms = Duration::from_millis;
        // A cold first run (15 ms, dearer than the warm 10 ms ones) is not counted:
        // two warm runs reach MIN_TIMED_CPU.
        let mut costs = vec![ms(15), ms(10), ms(10), ms(10)].into_iter();
        let mut n = 0;
        let (first, cpu, _, runs) = time_runs(|| {
            n += 1;
            let c = costs.next().expect("no more runs expected");
            Ok((n, c, c))
        })
        .expect("runs");
        assert_eq!(first, 1, "the result is the first run's");
        assert_eq!((cpu, runs), (ms(20), 2));
        // A first run of WARM_UP_BELOW or more is the one timed run.
        let (_, cpu, _, runs) = time_runs(|| Ok(((), WARM_UP_BELOW, WARM_UP_BELOW))).expect("runs");
        assert_eq!((cpu, runs), (WARM_UP_BELOW, 1));
    }

    #[test]
    fn a_short_replay_is_repeated_until_its_cpu_time_adds_up() {
        // A few block accesses replay in microseconds: timed once, the figure would be
        // noise; repeated, the runs add up to MIN_TIMED_CPU (or the run bound).
        let mut t = generate(Workload::Mixed, 1, 0.02);
        t.records.truncate(8);
        let p = Prepared::new(t, strata_cache_core::DEFAULT_BLOCK_SIZE);
        let cfg = ReplayConfig::new(p.unique_bytes() / 5 + 1);
        let rows = run_all(&p, &["lru".to_string()], &cfg).expect("replay");
        let r = &rows[0];
        assert!(r.replay_runs > 1, "runs {}", r.replay_runs);
        assert!(
            r.replay_runs == MAX_TIMED_RUNS
                || r.replay_cpu_s * f64::from(r.replay_runs) >= MIN_TIMED_CPU.as_secs_f64(),
            "{} runs of {} s",
            r.replay_runs,
            r.replay_cpu_s
        );
        // The result is one replay's, not the runs' sum.
        let once = replay(
            &p,
            make_policy("lru", cfg.capacity_bytes).expect("lru"),
            &cfg,
        );
        assert_eq!(r.result.accesses, once.accesses);
        assert_eq!(r.result.hit_ratio, once.hit_ratio);
        assert_eq!(r.result.total_jct_s, once.total_jct_s);
    }
}
