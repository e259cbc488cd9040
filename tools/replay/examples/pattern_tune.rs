//! Side-by-side replay of the pattern-aware policy against the baselines on generated
//! workloads or trace files (the tuning loop behind docs/PATTERNS.md):
//!
//! `cargo run --release -p strata-replay --example pattern_tune -- [scale] [seed] [workloads] [caps]`
//!
//! e.g. `... -- 1 1 mixed,shards 10,20,40`. A workload that names a file (contains `/`)
//! is read as a trace (`.csv` or `.csv.gz`, e.g. an imported Mooncake trace). Prints
//! byte hit ratio, mean JCT and replay speed (block accesses per second) per policy,
//! then the `strata` policy's end state (pool bytes, window share, ghost hits).
//!
//! Environment knobs (unset = the defaults):
//! - `FULL=1`: `strata` exactly as `strata bench replay` builds it (with the semantic
//!   predictor); otherwise `PatternAwarePolicy` + `SequentialPredictor` (`NOPF=1`: none;
//!   `SEM=1`: the sequential and semantic predictors as `strata` has them),
//!   with the config overrides below;
//! - `AHEAD`, `WINDOW`, `ADAPT` (0/1), `WGHOST`, `STABLE`, `GHOST`: `PatternAwareConfig`
//!   fields `ahead_share`, `window_share`, `adapt_window`, `window_ghost_share`,
//!   `stable_share`, `ghost_share`;
//! - `PF_MAX`, `PF_MIN` (MiB), `PF_LEAD` (s): `SequentialConfig`;
//! - `BW_MBPS`: store bandwidth (MB/s); `BASE=lru,arc`: the baselines to run;
//! - `JOBS=1`: mean JCT per job group (job name up to its last `-`) for every policy.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use strata_cache_core::policy::{EvictionPolicy, PatternAwareConfig, PatternAwarePolicy};
use strata_cache_core::{AccessContext, CacheKey};
use strata_prefetch::sequential::{SequentialConfig, SequentialPredictor};
use strata_prefetch::{AccessController, ControllerConfig};
use strata_replay::replay::{
    make_policy, replay, strata_policy_set, PolicyResult, PolicySet, Prepared, ReplayConfig,
};
use strata_replay::trace::gen::{generate, Workload};

/// Delegates to a shared `PatternAwarePolicy` so its stats can be read after the replay.
struct Shared(Arc<Mutex<PatternAwarePolicy>>);

impl Shared {
    fn with<R>(&self, f: impl FnOnce(&mut PatternAwarePolicy) -> R) -> R {
        let mut g = self.0.lock().expect("not poisoned");
        f(&mut g)
    }
}

impl EvictionPolicy for Shared {
    fn name(&self) -> &'static str {
        "strata"
    }
    fn admit(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) -> bool {
        self.with(|p| p.admit(key, size, ctx))
    }
    fn on_insert(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) {
        self.with(|p| p.on_insert(key, size, ctx))
    }
    fn on_hit(&mut self, key: &CacheKey, ctx: &AccessContext) {
        self.with(|p| p.on_hit(key, ctx))
    }
    fn on_remove(&mut self, key: &CacheKey) {
        self.with(|p| p.on_remove(key))
    }
    fn victim(&mut self) -> Option<CacheKey> {
        self.with(|p| p.victim())
    }
}

fn job_groups(r: &PolicyResult) -> BTreeMap<String, f64> {
    let mut g: BTreeMap<String, (f64, u32)> = BTreeMap::new();
    for (j, s) in &r.job_jct_s {
        // `JOBS=each`: one column per job (recorded traces name jobs `<program>-<pgid>`,
        // so grouping by program would merge the tenants of a mix).
        let name = if std::env::var("JOBS").as_deref() == Ok("each") {
            j.clone()
        } else {
            j.rsplit_once('-').map_or(j.as_str(), |x| x.0).to_string()
        };
        let e = g.entry(name).or_default();
        e.0 += s;
        e.1 += 1;
    }
    g.into_iter()
        .map(|(k, (s, n))| (k, s / f64::from(n)))
        .collect()
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let scale: f64 = args.get(1).map_or(Ok(1.0), |s| s.parse())?;
    let seed: u64 = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let wls = args.get(3).cloned().unwrap_or_else(|| "mixed".into());
    let caps = args.get(4).cloned().unwrap_or_else(|| "10,20,40".into());
    let base_env = std::env::var("BASE").unwrap_or_else(|_| "lru,lfu,arc,2random,tinylfu".into());
    let baselines: Vec<&str> = base_env.split(',').filter(|s| !s.is_empty()).collect();
    let jobs = std::env::var("JOBS").is_ok();
    for w in wls.split(',') {
        let (name, trace) = if w.contains('/') {
            let t = strata_replay::trace::read_file(std::path::Path::new(w))?;
            let n = std::path::Path::new(w)
                .file_name()
                .and_then(|s| s.to_str())
                .unwrap_or(w)
                .split('.')
                .next()
                .unwrap_or(w)
                .to_string();
            (n, t)
        } else {
            let wl =
                <Workload as clap::ValueEnum>::from_str(w, true).map_err(|e| anyhow::anyhow!(e))?;
            (w.to_string(), generate(wl, seed, scale))
        };
        let w = name.as_str();
        let p = Prepared::new(trace, 1 << 20);
        for c in caps.split(',') {
            let pct: f64 = c.parse()?;
            let cap = (p.unique_bytes() as f64 * pct / 100.0) as u64;
            let mut cfg = ReplayConfig::new(cap);
            if let Some(bw) = env_f("BW_MBPS") {
                cfg.store.bandwidth_bytes_per_s = bw * 1e6;
            }
            let mut best_bhr: f64 = 0.0;
            let mut lru_jct = 0.0;
            let mut lru_speed = 0.0;
            let mut groups = Vec::new();
            for b in &baselines {
                let t = Instant::now();
                let r = replay(&p, make_policy(b, cap)?, &cfg);
                let speed = r.accesses as f64 / t.elapsed().as_secs_f64();
                println!(
                    "{w:>18} {pct:>4}% {b:>8} bhr {:.4} hr {:.4} jct {:8.2}s {:>6.2}M acc/s",
                    r.byte_hit_ratio,
                    r.hit_ratio,
                    r.jct_s,
                    speed / 1e6
                );
                best_bhr = best_bhr.max(r.byte_hit_ratio);
                if *b == "lru" {
                    lru_jct = r.total_jct_s;
                    lru_speed = speed;
                }
                if jobs {
                    groups.push((b.to_string(), job_groups(&r)));
                }
            }
            let shared = Arc::new(Mutex::new(PatternAwarePolicy::new(pol_cfg(cap))));
            let set = if std::env::var("FULL").is_ok() {
                make_policy("strata", cap)?
            } else {
                PolicySet {
                    name: "strata".into(),
                    policy: Box::new(Shared(shared.clone())),
                    controller: if std::env::var("NOPF").is_ok() {
                        None
                    } else if std::env::var("SEM").is_ok() {
                        Some(strata_policy_set("strata", true, cap)?.1)
                    } else {
                        Some(AccessController::new(
                            ControllerConfig::default(),
                            Some(Box::new(SequentialPredictor::new(seq_cfg()))),
                            None,
                        ))
                    },
                    next_use: None,
                }
            };
            let t = Instant::now();
            let r = replay(&p, set, &cfg);
            let speed = r.accesses as f64 / t.elapsed().as_secs_f64();
            println!(
                "{w:>18} {pct:>4}% {:>8} bhr {:.4} hr {:.4} jct {:8.2}s {:>6.2}M acc/s  pf {} MiB prec {:.2} | bhr/best {:.2} jct/lru {:.2} speed lru/strata {:.2}",
                "STRATA",
                r.byte_hit_ratio,
                r.hit_ratio,
                r.jct_s,
                speed / 1e6,
                r.prefetch_bytes >> 20,
                r.prefetch_precision,
                r.byte_hit_ratio / best_bhr.max(1e-9),
                r.total_jct_s / lru_jct.max(1e-9),
                lru_speed / speed
            );
            if std::env::var("FULL").is_err() {
                let st = shared.lock().expect("not poisoned").stats();
                println!("   strata state {st:?}");
            }
            if jobs {
                groups.push(("STRATA".into(), job_groups(&r)));
                let names: Vec<&String> = groups[0].1.keys().collect();
                print!("   {:>12}", "jct by group");
                for n in &names {
                    print!(" {n:>12}");
                }
                println!();
                for (pol, g) in &groups {
                    print!("   {pol:>12}");
                    for n in &names {
                        print!(" {:>12.1}", g.get(*n).copied().unwrap_or(f64::NAN));
                    }
                    println!();
                }
            }
        }
    }
    Ok(())
}

fn env_f(name: &str) -> Option<f64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn seq_cfg() -> SequentialConfig {
    let mut c = SequentialConfig::default();
    if let Some(v) = env_f("PF_MAX") {
        c.max_depth = (v * 1048576.0) as u64;
    }
    if let Some(v) = env_f("PF_MIN") {
        c.min_depth = (v * 1048576.0) as u64;
    }
    if let Some(v) = env_f("PF_LEAD") {
        c.lead_time_s = v;
    }
    c
}

fn pol_cfg(cap: u64) -> PatternAwareConfig {
    let mut c = PatternAwareConfig {
        capacity_hint: Some(cap),
        ..PatternAwareConfig::default()
    };
    if let Some(v) = env_f("AHEAD") {
        c.ahead_share = v;
    }
    if let Some(v) = env_f("WINDOW") {
        c.window_share = v;
    }
    if let Some(v) = env_f("ADAPT") {
        c.adapt_window = v != 0.0;
    }
    if let Some(v) = env_f("WGHOST") {
        c.window_ghost_share = v;
    }
    if let Some(v) = env_f("STABLE") {
        c.stable_share = v;
    }
    if let Some(v) = env_f("GHOST") {
        c.ghost_share = v;
    }
    c
}
