//! `strata bench replay --json` without the daemon's dependencies: one trace, one
//! capacity, several policies, the same JSON report (`{trace, capacity_bytes,
//! unique_bytes, results: [{policy, hit_ratio, ..., replay_wall_s, replay_cpu_s,
//! replay_cpu_ns_per_access, replay_accesses_per_s}]}`) and the same replay (`strata_replay::replay`), with the
//! default store model (20 ms + 200 MB/s, 1 MiB blocks). Used by `scripts/replay-all.sh`
//! to evaluate a policy change on every trace quickly (building `strata` pulls in the
//! daemon's TLS stack; this needs only cache-core, prefetch and the replay crate).
//!
//! `cargo run --release -p strata-replay --example replay_json -- TRACE CAPACITY POLICIES`
//! e.g. `... -- tools/replay/traces/mix.csv.gz 10% strata,lru,arc`.

use strata_replay::replay::report::{run_all, Report};
use strata_replay::replay::{parse_capacity, Prepared, ReplayConfig};

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
    let policies: Vec<String> = args[3].split(',').map(String::from).collect();
    let results = run_all(&p, &policies, &cfg)?;
    let report = Report {
        trace: path.display().to_string(),
        capacity_bytes: capacity,
        unique_bytes: unique,
        results,
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
