//! `strata bench replay --json` without the daemon's dependencies: one trace, one
//! capacity, several policies, the same JSON report (`{trace, capacity_bytes,
//! unique_bytes, results: [{policy, hit_ratio, ..., replay_wall_s,
//! replay_accesses_per_s}]}`) and the same replay (`strata_replay::replay`), with the
//! default store model (20 ms + 200 MB/s, 1 MiB blocks). Used by `scripts/replay-all.sh`
//! to evaluate a policy change on every trace quickly (building `strata` pulls in the
//! daemon's TLS stack; this needs only cache-core, prefetch and the replay crate).
//!
//! `cargo run --release -p strata-replay --example replay_json -- TRACE CAPACITY POLICIES`
//! e.g. `... -- tools/replay/traces/mix.csv.gz 10% strata,lru,arc`.

use std::time::Instant;

use strata_replay::replay::{self, make_policy, parse_capacity, Prepared, ReplayConfig};

#[derive(serde::Serialize)]
struct Row {
    #[serde(flatten)]
    result: replay::PolicyResult,
    replay_wall_s: f64,
    replay_accesses_per_s: f64,
}

#[derive(serde::Serialize)]
struct Report {
    trace: String,
    capacity_bytes: u64,
    unique_bytes: u64,
    results: Vec<Row>,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 4,
        "usage: replay_json TRACE CAPACITY POLICIES"
    );
    let path = std::path::Path::new(&args[1]);
    let t = strata_replay::trace::read_file(path)?;
    let block = strata_cache_core::DEFAULT_BLOCK_SIZE;
    t.check_replayable(block)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let p = Prepared::new(t, block);
    let unique = p.unique_bytes();
    let capacity = parse_capacity(&args[2], unique)?;
    let cfg = ReplayConfig::new(capacity);
    let mut results = Vec::new();
    for name in args[3].split(',') {
        let set = make_policy(name, capacity)?;
        let t0 = Instant::now();
        let result = replay::replay(&p, set, &cfg);
        let wall = t0.elapsed().as_secs_f64();
        results.push(Row {
            replay_accesses_per_s: result.accesses as f64 / wall.max(1e-9),
            replay_wall_s: wall,
            result,
        });
    }
    let report = Report {
        trace: path.display().to_string(),
        capacity_bytes: capacity,
        unique_bytes: unique,
        results,
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
