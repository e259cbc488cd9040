//! The recency guard: how far the pattern-aware policy may fall behind plain LRU.
//!
//! Every rule of the policy was found on traces; a program none of them resembles can
//! defeat one (held-out `tfinterleave`: four record shards read a record from each in
//! turn; the window -> main contest lost the blocks the readers were in the middle of,
//! 2.5x LRU's JCT at 10%). LRU is the baseline users compare against and the one whose
//! behaviour needs no model, so the policy watches it: a *shadow LRU* of the same
//! capacity (key hashes and sizes, no data) sees every demand access (and takes in every
//! prefetch fill, as the cache's recency order does), and each access
//! where exactly one of the two hit is a vote (McNemar's test: under H0 "the policy is
//! as good as LRU here" a discordant access falls on either side with probability
//! 1/2). Once `MIN_VOTES` are in and the sign test rejects at `ALPHA` with LRU ahead,
//! the policy evicts in plain recency order (the least recently read or inserted
//! resident, whatever its pool) for a *recency period*. Votes are halved past
//! `HORIZON_VOTES`, so the test follows the workload over thousands of reads, not a
//! passing phase.
//!
//! The guard cannot see how the policy would do while it evicts by recency, so a
//! period ends by trying the policy again: 2 cache turnovers of demand-miss bytes at
//! first, doubled (to 64) each time the trial loses at its first test (within
//! `2 * MIN_VOTES` votes), back to 2 once the policy holds for longer, and never fewer
//! than `MIN_PERIOD_MISSES` demand misses (in a cache of a few blocks two turnovers are a
//! dozen misses). A workload the policy suits never pays; one it does not pays a trial
//! of a few dozen discordant accesses per period, each period twice as long as the last.
//!
//! Per job (`spare_starved_jobs`, up to `JOB_SLOTS` jobs): the same test on each job's
//! discordant reads alone, at `ALPHA / JOB_SLOTS`. A job behind is *spared* for
//! `FIRST_TURNS` turnovers (the policy then evicts another job's least recent item in
//! place of one it read last); if its reads are still significantly behind while spared,
//! sparing is futile for it and it is not spared again. Its payer is whichever job's
//! items are least recent, which can be the job LRU serves best, so every job's
//! discordant reads from the moment sparing begins are tested too
//! (`spare_ends_when_costly`): once they are significantly behind, sparing ends and
//! the spared jobs are not spared again.
//!
//! The shadow is a [`ShadowLru`] (sampled above 256 MiB), and only sampled accesses vote,
//! so its memory and time stay bounded while its votes still come from the whole key
//! space.

use super::binomial::SignTest;
use super::guard_period::{GuardPeriod, ALPHA, FIRST_TURNS, HORIZON_VOTES, MIN_VOTES};
use super::shadow_lru::ShadowLru;

// The vote's and the period's settings (`MIN_VOTES`, `ALPHA`, the period's turnovers)
// are shared with the frequency guard: `guard_period`.

/// Jobs whose reads are tested on their own (`spare_starved_jobs`): as many as the
/// policy tracks per period (`JobSet::CAP`, 16); a trace of more jobs at once (a KV
/// trace's request per job) spreads its votes too thin for any one job's test to reject.
const JOB_SLOTS: usize = super::JobSet::CAP;

/// One job's discordant reads against the shadow LRU, and how long its items are spared.
#[derive(Clone, Copy, Debug)]
struct JobVotes {
    job: u64,
    /// As the period's votes ([`GuardPeriod::votes`]), for this job's reads only.
    votes: [u64; 2],
    /// Its votes while spared: whether sparing helped it.
    spared_votes: [u64; 2],
    /// Demand-miss bytes left while this job's items are spared (0: not spared).
    spare_left: u64,
    /// Still behind while spared: its loss is not the items the policy evicts, and it
    /// is not spared again.
    futile: bool,
    /// The shadow's sequence number at its latest read (the least recent job gives up
    /// its slot).
    last: u64,
}

impl JobVotes {
    fn new(job: u64, last: u64) -> Self {
        JobVotes {
            job,
            votes: [0; 2],
            spared_votes: [0; 2],
            spare_left: 0,
            futile: false,
            last,
        }
    }
}

/// See the module docs.
pub(super) struct RecencyGuard {
    /// The shadow LRU of the same capacity.
    lru: ShadowLru,
    /// Discordant accesses against the shadow LRU, and the recency period: evict in
    /// plain recency order while it lasts.
    pub(super) period: GuardPeriod,
    cap: u64,
    /// Per-job tests (`spare_starved_jobs`), at most [`JOB_SLOTS`].
    jobs: Vec<JobVotes>,
    per_job: bool,
    /// Spared periods begun so far.
    pub(super) spared: u64,
    /// Sparing ended because the other jobs paid for it (`spare_ends_when_costly`).
    pub(super) costly_ends: u64,
    /// Every job's discordant reads since sparing began (`spare_ends_when_costly`).
    sparing_votes: [u64; 2],
    /// Whether sparing ends once `sparing_votes` are significantly behind.
    sparing_cost_test: bool,
}

impl RecencyGuard {
    pub(super) fn new(cap: u64) -> Self {
        let mut g = RecencyGuard {
            lru: ShadowLru::new(cap),
            period: GuardPeriod::new(0),
            cap: 0,
            jobs: Vec::new(),
            per_job: false,
            spared: 0,
            costly_ends: 0,
            sparing_votes: [0; 2],
            sparing_cost_test: false,
        };
        g.set_capacity(cap);
        g
    }

    /// The cache's capacity changed (or became known): the shadow follows it.
    pub(super) fn set_capacity(&mut self, cap: u64) {
        if cap == self.cap {
            return;
        }
        self.cap = cap;
        self.period.set_capacity(cap);
        self.lru.set_capacity(cap);
    }

    /// Starts a recency period that does not end (for tests of the period's order).
    #[cfg(test)]
    pub(super) fn force_period(&mut self) {
        self.period.force();
    }

    /// Test each job's reads on their own too (`spare_starved_jobs`), and end sparing
    /// when the cache as a whole pays for it (`spare_ends_when_costly`).
    pub(super) fn set_per_job(&mut self, on: bool, cost_test: bool) {
        self.per_job = on;
        self.sparing_cost_test = cost_test;
    }

    /// Whether `job`'s items are spared now (its own reads lost significantly to the
    /// shadow LRU).
    pub(super) fn spares(&self, job: u64) -> bool {
        self.jobs.iter().any(|j| j.job == job && j.spare_left > 0)
    }

    /// Whether any job's items are spared now.
    pub(super) fn sparing(&self) -> bool {
        self.jobs.iter().any(|j| j.spare_left > 0)
    }

    /// Spares `job`'s items until the period ends (for tests of the victim's choice).
    #[cfg(test)]
    pub(super) fn force_spare(&mut self, job: u64) {
        let mut j = JobVotes::new(job, self.lru.seq());
        j.spare_left = u64::MAX;
        self.jobs.push(j);
    }

    /// Whether the policy should evict in plain recency order now.
    pub(super) fn recency_period(&self) -> bool {
        self.period.active()
    }

    /// A demand read of the item of hash `h` (`size` bytes) that the policy's cache
    /// hit (`policy_hit`) or missed.
    /// A demand read the policy missed and nothing fills (a KV Get of a block it
    /// evicted): the shadow's hit, if it still holds the block, is a vote for recency
    /// order like any miss it would have hit (black-box finding: blocks a client put
    /// were evicted before their first read, LRU hit every one, and the guard, which
    /// saw only puts, never switched).
    pub(super) fn on_unfilled_miss(&mut self, h: u64, job: u64, test: &mut SignTest) {
        if !self.lru.sampled(h) || !self.lru.touch_held(h) {
            return;
        }
        if self.sparing() {
            self.sparing_vote(true, test);
        }
        if self.recency_period() {
            return;
        }
        if self.per_job {
            self.job_vote(job, true, test);
        }
        self.period.vote(true, ALPHA, test);
    }

    pub(super) fn on_demand(
        &mut self,
        h: u64,
        size: u64,
        policy_hit: bool,
        job: u64,
        test: &mut SignTest,
    ) {
        if !policy_hit {
            self.on_miss_bytes(size, test);
        }
        if !self.lru.sampled(h) {
            return;
        }
        let lru_hit = self.lru.touch(h, size);
        if lru_hit != policy_hit && self.sparing() {
            self.sparing_vote(lru_hit, test);
        }
        if self.recency_period() || lru_hit == policy_hit {
            return;
        }
        if self.per_job {
            self.job_vote(job, lru_hit, test);
        }
        self.period.vote(lru_hit, ALPHA, test);
    }

    /// A discordant read while some job is spared, whichever job read it, counted in a
    /// recency period too (sparing changes which items that period's order evicts).
    /// Once they are significantly behind the shadow's, sparing costs the other jobs
    /// more than it gains the spared ones: it ends, and they are not spared again.
    fn sparing_vote(&mut self, lru_hit: bool, test: &mut SignTest) {
        if !self.sparing_cost_test {
            return;
        }
        self.sparing_votes[usize::from(lru_hit)] += 1;
        let [ahead, behind] = self.sparing_votes;
        let n = ahead + behind;
        if n >= MIN_VOTES && behind > ahead && test.rejects(n, behind, ALPHA) {
            for j in self.jobs.iter_mut().filter(|j| j.spare_left > 0) {
                j.spare_left = 0;
                j.futile = true;
                j.votes = [0; 2];
            }
            self.sparing_votes = [0; 2];
            self.costly_ends += 1;
        }
    }

    /// A prefetched item of hash `h` entered the cache: the shadow takes it as its
    /// youngest, as the cache's recency order does in a period (no vote: nothing was
    /// read). The shadow is then the LRU a recency period can deliver, prefetch fills
    /// and all, not one that prefetch never fills.
    pub(super) fn on_prefetch_insert(&mut self, h: u64, size: u64) {
        if self.lru.sampled(h) {
            self.lru.touch(h, size);
        }
    }

    /// A discordant read of `job` (`lru_hit`: the shadow hit, the policy missed): its
    /// own sign test, at `ALPHA / JOB_SLOTS` (one test per job). A job found behind is
    /// spared for a recency period's first length; one still significantly behind while
    /// spared is not spared again (its loss is not what the policy evicts: a tenant read
    /// in small units, whose LRU hits are other pages of blocks LRU keeps whole).
    fn job_vote(&mut self, job: u64, lru_hit: bool, test: &mut SignTest) {
        let seq = self.lru.seq();
        let i = match self.jobs.iter().position(|j| j.job == job) {
            Some(i) => i,
            None if self.jobs.len() < JOB_SLOTS => {
                self.jobs.push(JobVotes::new(job, seq));
                self.jobs.len() - 1
            }
            None => {
                // The least recently reading job that is not spared gives up its slot.
                let Some(i) = self
                    .jobs
                    .iter()
                    .enumerate()
                    .filter(|(_, j)| j.spare_left == 0)
                    .min_by_key(|(_, j)| j.last)
                    .map(|(i, _)| i)
                else {
                    return;
                };
                self.jobs[i] = JobVotes::new(job, seq);
                i
            }
        };
        let cap = self.cap;
        let j = &mut self.jobs[i];
        j.last = seq;
        if j.spare_left > 0 {
            j.spared_votes[usize::from(lru_hit)] += 1;
            return;
        }
        j.votes[usize::from(lru_hit)] += 1;
        let [ahead, behind] = j.votes;
        let n = ahead + behind;
        if n < MIN_VOTES {
            return;
        }
        if !j.futile && behind > ahead && test.rejects(n, behind, ALPHA / JOB_SLOTS as f64) {
            // The first job spared now: what sparing costs is counted from here.
            if !self.sparing() {
                self.sparing_votes = [0; 2];
            }
            let j = &mut self.jobs[i];
            j.spare_left = FIRST_TURNS.saturating_mul(cap).max(1);
            j.votes = [0; 2];
            j.spared_votes = [0; 2];
            self.spared += 1;
        } else if n >= HORIZON_VOTES {
            j.votes = [ahead / 2, behind / 2];
        }
    }

    fn on_miss_bytes(&mut self, size: u64, test: &mut SignTest) {
        for j in self.jobs.iter_mut().filter(|j| j.spare_left > 0) {
            j.spare_left = j.spare_left.saturating_sub(size.max(1));
            if j.spare_left == 0 {
                let [ahead, behind] = j.spared_votes;
                let n = ahead + behind;
                j.futile = n >= MIN_VOTES
                    && behind > ahead
                    && test.rejects(n, behind, ALPHA / JOB_SLOTS as f64);

                j.votes = [0; 2];
            }
        }
        self.period.on_miss(size);
    }
}

#[cfg(test)]
mod tests {
    use super::super::guard_period::MIN_PERIOD_MISSES;
    use super::*;

    fn h(i: u64) -> u64 {
        crate::stream::mix64(i + 1)
    }

    #[test]
    fn a_policy_behind_lru_starts_a_recency_period_and_one_ahead_never_does() {
        let mut test = SignTest::default();
        let mut behind = RecencyGuard::new(8 << 20);
        let mut ahead = RecencyGuard::new(8 << 20);
        // A loop over 4 blocks in an 8-block cache: LRU hits every re-read. The
        // policy that misses them all is behind from the first re-read.
        let mut first = None;
        for i in 0..200u64 {
            let key = h(i % 4);
            behind.on_demand(key, 1 << 20, false, 0, &mut test);
            ahead.on_demand(key, 1 << 20, true, 0, &mut test);
            if behind.recency_period() && first.is_none() {
                first = Some(i);
            }
        }
        // 32 votes (all for LRU) after the 4 cold reads, then the test rejects.
        assert_eq!(first, Some(4 + MIN_VOTES - 1));
        assert!(behind.period.engaged >= 1);
        assert!(!ahead.recency_period());
        assert_eq!(ahead.period.engaged, 0);
    }

    #[test]
    fn a_period_ends_after_its_turnovers_and_a_quick_loss_doubles_the_next() {
        let mut test = SignTest::default();
        let cap = 8u64 << 20;
        let mut g = RecencyGuard::new(cap);
        let mut i = 0u64;
        let mut lose_until_engaged = |g: &mut RecencyGuard| {
            let before = g.period.engaged;
            while g.period.engaged == before {
                g.on_demand(h(i % 4), 1 << 20, false, 0, &mut test);
                i += 1;
            }
        };
        lose_until_engaged(&mut g);
        assert_eq!(g.period.left, FIRST_TURNS * cap);
        // Misses during the period use it up (hits do not): its turnovers' bytes (16
        // misses of 1 MiB here) and at least `MIN_PERIOD_MISSES` misses.
        for _ in 0..(MIN_PERIOD_MISSES - 1) {
            g.on_miss_bytes(1 << 20, &mut SignTest::default());
        }
        assert_eq!(g.period.left, 0, "the turnovers are used up");
        assert!(g.recency_period(), "but not the fewest misses");
        g.on_miss_bytes(1 << 20, &mut SignTest::default());
        assert!(!g.recency_period(), "the policy is tried again");
        lose_until_engaged(&mut g);
        assert_eq!(
            g.period.left,
            2 * FIRST_TURNS * cap,
            "lost again at once: a longer period"
        );
        // Small misses: the turnovers' bytes outlast the fewest misses.
        for _ in 0..MIN_PERIOD_MISSES {
            g.on_miss_bytes(4096, &mut SignTest::default());
        }
        assert!(g.recency_period(), "{} bytes left", g.period.left);
    }

    /// Two jobs whose discordant reads cancel out: the policy misses job 1's re-reads
    /// that LRU hits, and hits job 2's first reads (prefetched) that LRU misses. The
    /// cache as a whole is even with LRU, so no recency period; job 1 alone is behind,
    /// so its items are spared, and job 2's are not. Still behind while spared, it is
    /// not spared again.
    #[test]
    fn a_job_behind_lru_on_its_own_is_spared_until_sparing_proves_futile() {
        let mut test = SignTest::default();
        let mb = 1 << 20;
        let mut g = RecencyGuard::new(64 * mb);
        g.set_per_job(true, true);
        let mut first = None;
        for i in 0..200u64 {
            g.on_demand(h(i % 4), mb, false, 1, &mut test);
            g.on_demand(h(1000 + i), mb, true, 2, &mut test);
            if g.spares(1) {
                first = Some(i);
                break;
            }
        }
        // 32 of job 1's votes (all for LRU) after its 4 cold reads: p = 2^-31, below
        // 0.001 / 16.
        assert_eq!(first, Some(4 + MIN_VOTES - 1));
        assert!(!g.spares(2));
        assert_eq!(g.period.engaged, 0, "even in total: no recency period");
        assert_eq!(g.spared, 1);
        // Still behind while spared (its misses use the period up: 2 turnovers).
        let mut i = 0;
        while g.spares(1) {
            g.on_demand(h(i % 4), mb, false, 1, &mut test);
            g.on_demand(h(5000 + i), mb, true, 2, &mut test);
            i += 1;
        }
        assert_eq!(
            i,
            FIRST_TURNS * 64,
            "the period is 2 turnovers of miss bytes"
        );
        for i in 0..400u64 {
            g.on_demand(h(i % 4), mb, false, 1, &mut test);
            g.on_demand(h(9000 + i), mb, true, 2, &mut test);
        }
        assert_eq!(g.spared, 1, "sparing did not help: not again");
        assert!(!g.sparing());
        // Without the per-job test nothing is spared.
        let mut off = RecencyGuard::new(64 * mb);
        for i in 0..200u64 {
            off.on_demand(h(i % 4), mb, false, 1, &mut test);
            off.on_demand(h(1000 + i), mb, true, 2, &mut test);
        }
        assert!(!off.sparing());
    }

    /// Job 1 is spared as in the test above; then, while it is spared, job 2 (ahead of
    /// LRU so far) loses its re-reads that LRU hits, as when the items sparing keeps push
    /// job 2's loop out of the cache. Every job's votes since sparing began are then
    /// behind: sparing ends at once, and job 1 is not spared again. With the cost test
    /// off it runs its whole length.
    #[test]
    fn sparing_ends_when_the_other_jobs_pay_for_it() {
        let mb = 1 << 20;
        let run = |cost_test: bool| {
            let mut test = SignTest::default();
            let mut g = RecencyGuard::new(64 * mb);
            g.set_per_job(true, cost_test);
            let mut i = 0u64;
            while !g.spares(1) {
                g.on_demand(h(i % 4), mb, false, 1, &mut test);
                g.on_demand(h(1000 + i), mb, true, 2, &mut test);
                i += 1;
            }
            // Job 1's reads now hit (sparing helps it, but its hits are LRU's too: no
            // vote); job 2's loop over 4 blocks misses where LRU hits.
            let mut reads = 0u64;
            while g.spares(1) && reads < 1000 {
                g.on_demand(h(i % 4), mb, true, 1, &mut test);
                g.on_demand(h(2000 + reads % 4), mb, false, 2, &mut test);
                i += 1;
                reads += 1;
            }
            (reads, g)
        };
        let (reads, mut g) = run(true);
        // 4 cold reads of job 2's loop, then 31 votes behind: with job 2's hit in the
        // round that began sparing, 31 of 32 (p ~ 2e-8 < 0.001).
        assert_eq!(reads, 4 + MIN_VOTES - 1);
        assert_eq!(g.costly_ends, 1);
        assert!(!g.sparing());
        let mut test = SignTest::default();
        for i in 0..400u64 {
            g.on_demand(h(3000 + i % 4), mb, false, 1, &mut test);
            g.on_demand(h(9000 + i), mb, true, 2, &mut test);
        }
        assert_eq!(
            g.spared, 1,
            "a job whose sparing cost more is not spared again"
        );
        let (reads, g) = run(false);
        assert_eq!(reads, FIRST_TURNS * 64, "without the test: its 2 turnovers");
        assert_eq!(g.costly_ends, 0);
    }

    #[test]
    fn a_prefetch_fill_takes_the_shadows_young_end_without_a_vote() {
        let mut test = SignTest::default();
        let mb = 1 << 20;
        let mut g = RecencyGuard::new(4 * mb);
        for i in 0..4 {
            g.on_demand(h(i), mb, false, 0, &mut test);
        }
        g.on_prefetch_insert(h(9), mb);
        assert_eq!(g.period.votes.0, [0, 0], "a fill is not a read");
        // The fill pushed out the least recent read, as it does in the cache: a policy
        // that hits block 0 (it kept it) is ahead of this LRU, not level with it.
        g.on_demand(h(0), mb, true, 0, &mut test);
        assert_eq!(g.period.votes.0, [1, 0]);
        g.on_demand(h(9), mb, true, 0, &mut test);
        assert_eq!(
            g.period.votes.0,
            [1, 0],
            "the filled block is the shadow's too"
        );
    }
}
