//! Per-tenant diagnostics of a policy on a multi-job trace (issue 13: which tenant's
//! blocks a policy evicts, and how soon they are missed again).
//!
//! `cargo run --release -p strata-replay --example tenant_diag -- TRACE CAP% POLICIES`
//!
//! For each policy (`strata-noprefetch`, `strata` or a baseline) and each job: demand
//! misses, the retention pattern the tracker gave its missed accesses, evictions of its
//! blocks (for `strata*`, by the pool they were evicted from) and "re-misses": demand
//! misses on a block the cache evicted earlier, bucketed by the bytes evicted in
//! between as a share of capacity (a re-miss within 1x capacity is one a policy with
//! better retention for this tenant could have hit).
//!
//! On stderr, for `strata*`: `TRACEJOB=N` prints each demand miss of job N with the
//! policy's split at that moment (stable share, pool bytes, ghost hits, releases);
//! `LASTPOOL=1` prints each demand miss's key hash, the pool its key was last evicted
//! from and how long ago (evicted bytes / capacity). `DISPLACED=1` adds to the report
//! every eviction counted by (owner job, pool, job whose admission evicted it, whether
//! that admission was a prefetch).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use strata_cache_core::policy::EvictionPolicy;
use strata_cache_core::{AccessContext, CacheKey};
use strata_replay::replay::{diag_policy_set, replay, DiagTarget, Prepared, ReplayConfig};

#[derive(Default)]
struct JobDiag {
    misses: u64,
    by_pattern: BTreeMap<String, u64>,
    evicted_from: BTreeMap<String, u64>,
    /// Re-misses by evicted-bytes distance: <0.25, <0.5, <1, <2, >=2 x capacity.
    remiss: [u64; 5],
    hits: u64,
    hit_in: BTreeMap<String, u64>,
    /// Pool of each of this job's evictions over time: (eviction index / 1000, pool) counts.
    timeline: BTreeMap<(u64, String), u64>,
}

#[derive(Default)]
struct Diag {
    jobs: BTreeMap<u64, JobDiag>,
    owner: HashMap<CacheKey, u64>,
    evicted_at: HashMap<CacheKey, u64>,
    evicted_bytes: u64,
    sizes: HashMap<CacheKey, u64>,
    last_pool: HashMap<CacheKey, String>,
    admitting: Option<(u64, bool)>,
    displaced: BTreeMap<(u64, String, u64, bool), u64>,
}

struct Wrap {
    target: DiagTarget,
    diag: Arc<Mutex<Diag>>,
    cap: u64,
}

impl EvictionPolicy for Wrap {
    fn name(&self) -> &'static str {
        "diag"
    }
    fn admit(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) -> bool {
        if ctx.is_demand() {
            let mut d = self.diag.lock().expect("not poisoned");
            let d = &mut *d;
            let dist = d.evicted_at.get(key).map(|at| d.evicted_bytes - at);
            let j = d.jobs.entry(ctx.job.0).or_default();
            j.misses += 1;
            let o = ctx.obs;
            *j.by_pattern
                .entry(format!(
                    "ret={:?} b={:?} f={:?} d={:?}{}",
                    o.retention(),
                    o.blocks,
                    o.files,
                    o.dirs,
                    if o.shared { " shared" } else { "" }
                ))
                .or_default() += 1;
            if let Some(dist) = dist {
                let x = dist as f64 / self.cap as f64;
                let b = [0.25, 0.5, 1.0, 2.0]
                    .iter()
                    .position(|t| x < *t)
                    .unwrap_or(4);
                j.remiss[b] += 1;
            }
        }
        if ctx.is_demand() && std::env::var("LASTPOOL").is_ok() {
            let d = self.diag.lock().expect("not poisoned");
            eprintln!(
                "LAST h={} job={} last_pool={:?} dist={:?}",
                strata_cache_core::stream::key_hash(key),
                ctx.job.0,
                d.last_pool.get(key),
                d.evicted_at
                    .get(key)
                    .map(|at| (d.evicted_bytes - at) as f64 / self.cap as f64)
            );
        }
        self.diag.lock().expect("not poisoned").admitting = Some((ctx.job.0, ctx.is_prefetch()));
        let r = self.target.with(|p| p.admit(key, size, ctx));
        if ctx.is_demand()
            && std::env::var("TRACEJOB")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                == Some(ctx.job.0)
        {
            if let Some(s) = self.target.strata() {
                let st = s.lock().expect("not poisoned").stats();
                let d = self.diag.lock().expect("not poisoned");
                eprintln!("MISS t={} key={:?} size={} evicted_before={} share={:.3} stable={} freq={} cons={} ahead={} wg={} mg={} idle={}",
                    ctx.now_ns, key, size, d.evicted_at.contains_key(key), st.stable_share, st.stable_bytes>>10, st.freq_bytes>>10, st.consumed_bytes>>10, st.ahead_bytes>>10, st.window_ghost_hits, st.main_ghost_hits, st.idle_releases);
            }
        }
        r
    }
    fn on_insert(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) {
        {
            let mut d = self.diag.lock().expect("not poisoned");
            d.owner.entry(key.clone()).or_insert(ctx.job.0);
            d.sizes.insert(key.clone(), size);
        }
        self.target.with(|p| p.on_insert(key, size, ctx))
    }
    fn on_hit(&mut self, key: &CacheKey, ctx: &AccessContext) {
        if ctx.is_demand() {
            let pool = self
                .target
                .strata()
                .and_then(|s| s.lock().expect("not poisoned").pool_of(key))
                .unwrap_or("-");
            let mut d = self.diag.lock().expect("not poisoned");
            let j = d.jobs.entry(ctx.job.0).or_default();
            j.hits += 1;
            *j.hit_in.entry(pool.to_string()).or_default() += 1;
        }
        self.target.with(|p| p.on_hit(key, ctx))
    }
    fn on_remove(&mut self, key: &CacheKey) {
        if std::env::var("COMP").is_ok() {
            let d = self.diag.lock().expect("not poisoned");
            if d.evicted_at.len().is_multiple_of(1000) {
                if let Some(s) = self.target.strata() {
                    let s = s.lock().expect("not poisoned");
                    let mut comp: BTreeMap<(u64, &str), u64> = BTreeMap::new();
                    for (k, o) in &d.owner {
                        if let Some(pool) = s.pool_of(k) {
                            *comp.entry((*o, pool)).or_default() +=
                                d.sizes.get(k).copied().unwrap_or(0) >> 20;
                        }
                    }
                    println!(
                        "   @{} MiB by (job, pool): {comp:?} share {:.2}",
                        d.evicted_at.len(),
                        s.stats().stable_share
                    );
                }
            }
        }
        let pool = self
            .target
            .strata()
            .and_then(|s| s.lock().expect("not poisoned").pool_of(key))
            .unwrap_or("-");
        {
            let mut d = self.diag.lock().expect("not poisoned");
            let d = &mut *d;
            let size = d.sizes.get(key).copied().unwrap_or(0);
            d.evicted_bytes += size;
            d.evicted_at.insert(key.clone(), d.evicted_bytes);
            d.last_pool.insert(key.clone(), pool.to_string());
            if let Some((aj, pf)) = d.admitting {
                let o = d.owner.get(key).copied().unwrap_or(u64::MAX);
                *d.displaced
                    .entry((o, pool.to_string(), aj, pf))
                    .or_default() += 1;
            }
            let owner = d.owner.get(key).copied().unwrap_or(u64::MAX);
            let n = d.evicted_at.len() as u64;
            *d.jobs
                .entry(owner)
                .or_default()
                .timeline
                .entry((n / 2000, pool.to_string()))
                .or_default() += 1;
            *d.jobs
                .entry(owner)
                .or_default()
                .evicted_from
                .entry(pool.to_string())
                .or_default() += 1;
        }
        self.target.with(|p| p.on_remove(key))
    }
    fn victim(&mut self) -> Option<CacheKey> {
        self.target.with(|p| p.victim())
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 4, "usage: tenant_diag TRACE CAP% POLICIES");
    let t = strata_replay::trace::read_file(std::path::Path::new(&args[1]))?;
    let p = Prepared::new(t, strata_cache_core::DEFAULT_BLOCK_SIZE);
    let cap = strata_replay::replay::parse_capacity(&args[2], p.unique_bytes())?;
    let cfg = ReplayConfig::new(cap);
    for name in args[3].split(',') {
        let diag = Arc::new(Mutex::new(Diag::default()));
        let (set, strata) = diag_policy_set(name, cap, |target| {
            Box::new(Wrap {
                target,
                diag: diag.clone(),
                cap,
            }) as Box<dyn EvictionPolicy>
        })?;
        let r = replay(&p, set, &cfg);
        println!(
            "== {name} cap {} MiB: total JCT {:.1} s, hr {:.3}",
            cap >> 20,
            r.total_jct_s,
            r.hit_ratio
        );
        for (j, s) in &r.job_jct_s {
            println!("   job {j}: JCT {s:.1}");
        }
        if let Some(s) = &strata {
            println!("   state {:?}", s.lock().expect("not poisoned").stats());
        }
        let d = diag.lock().expect("not poisoned");
        if let Some(s) = &strata {
            let s = s.lock().expect("not poisoned");
            let mut comp: BTreeMap<(u64, &str), (u64, u64)> = BTreeMap::new();
            for (k, o) in &d.owner {
                if let Some(pool) = s.pool_of(k) {
                    let e = comp.entry((*o, pool)).or_default();
                    e.0 += 1;
                    e.1 += d.sizes.get(k).copied().unwrap_or(0) >> 10;
                }
            }
            println!("   resident at end (job, pool) -> (items, KiB): {comp:?}");
        }
        if std::env::var("DISPLACED").is_ok() {
            println!(
                "   evicted (owner, pool, admitting job, prefetch) -> n: {:?}",
                d.displaced
            );
        }
        for (j, jd) in &d.jobs {
            println!(
                "  job#{j}: demand misses {} hits {} re-misses(<.25,<.5,<1,<2,>=2 cap) {:?}",
                jd.misses, jd.hits, jd.remiss
            );
            println!("     evicted from {:?}", jd.evicted_from);
            println!("     hit in {:?}", jd.hit_in);
            if std::env::var("TIMELINE").is_ok() {
                println!("     evictions by time {:?}", jd.timeline);
            }
            let mut v: Vec<_> = jd.by_pattern.iter().collect();
            v.sort_by(|a, b| b.1.cmp(a.1));
            for (k, n) in v.iter().take(6) {
                println!("     {n:>7} {k}");
            }
        }
    }
    Ok(())
}
