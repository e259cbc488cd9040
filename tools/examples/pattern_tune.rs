//! Side-by-side replay of the pattern-aware policy against the baselines on generated
//! workloads (the tuning loop behind docs/PATTERNS.md):
//!
//! `cargo run --release -p strata-tools --example pattern_tune -- [scale] [seed] [workloads] [caps]`
//!
//! e.g. `... -- 1 1 mixed,shards 10,20,40`. Prints byte hit ratio, mean JCT and
//! replay speed (block accesses per second) per policy.

use std::time::Instant;

use strata_cache_core::policy::PatternAwareConfig;
use strata_cache_core::policy::PatternAwarePolicy;
use strata_prefetch::sequential::{SequentialConfig, SequentialPredictor};
use strata_tools::replay::{make_policy, replay, PolicySet, Prepared, ReplayConfig};
use strata_tools::trace::gen::{generate, Workload};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let scale: f64 = args.get(1).map_or(Ok(1.0), |s| s.parse())?;
    let seed: u64 = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let wls = args.get(3).cloned().unwrap_or_else(|| "mixed".into());
    let caps = args.get(4).cloned().unwrap_or_else(|| "10,20,40".into());
    let baselines = ["lru", "lfu", "arc", "2random", "tinylfu"];
    for w in wls.split(',') {
        let wl =
            <Workload as clap::ValueEnum>::from_str(w, true).map_err(|e| anyhow::anyhow!(e))?;
        let p = Prepared::new(generate(wl, seed, scale), 1 << 20);
        for c in caps.split(',') {
            let pct: f64 = c.parse()?;
            let cap = (p.unique_bytes() as f64 * pct / 100.0) as u64;
            let cfg = ReplayConfig::new(cap);
            let mut best_bhr: f64 = 0.0;
            let mut lru_jct = 0.0;
            let mut lru_speed = 0.0;
            for b in baselines {
                let t = Instant::now();
                let r = replay(&p, make_policy(b, cap, p.listings())?, &cfg);
                let speed = r.accesses as f64 / t.elapsed().as_secs_f64();
                println!(
                    "{w:>18} {pct:>4}% {b:>8} bhr {:.4} hr {:.4} jct {:8.2}s {:>6.2}M acc/s",
                    r.byte_hit_ratio,
                    r.hit_ratio,
                    r.jct_s,
                    speed / 1e6
                );
                best_bhr = best_bhr.max(r.byte_hit_ratio);
                if b == "lru" {
                    if std::env::var("JOBS").is_ok() {
                        println!("   lru jobs {:?}", r.job_jct_s);
                    }
                    lru_jct = r.total_jct_s;
                    lru_speed = speed;
                }
            }
            let set = if std::env::var("FULL").is_ok() {
                make_policy("strata", cap, p.listings())?
            } else {
                PolicySet {
                    name: "strata".into(),
                    policy: Box::new(PatternAwarePolicy::new(pol_cfg())),
                    predictors: if std::env::var("NOPF").is_ok() {
                        Vec::new()
                    } else {
                        vec![Box::new(SequentialPredictor::new(seq_cfg()))]
                    },
                    next_use: None,
                }
            };
            let t = Instant::now();
            let r = replay(&p, set, &cfg);
            let speed = r.accesses as f64 / t.elapsed().as_secs_f64();
            if std::env::var("JOBS").is_ok() {
                println!("   strata jobs {:?}", r.job_jct_s);
            }
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

fn pol_cfg() -> PatternAwareConfig {
    let mut c = PatternAwareConfig::default();
    if let Some(v) = env_f("AHEAD") {
        c.ahead_share = v;
    }
    if let Some(v) = env_f("WINDOW") {
        c.window_share = v;
    }
    if let Some(v) = env_f("STABLE") {
        c.stable_share = v;
    }
    c
}
