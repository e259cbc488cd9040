//! What `strata bench replay --json` prints (and the `replay_json` example, which
//! builds without the `strata` binary): one row per policy with its wall-clock cost.

use std::time::Instant;

use super::{make_policy, replay, PolicyResult, Prepared, ReplayConfig};

#[derive(Debug, serde::Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub result: PolicyResult,
    /// Wall-clock seconds the replay took (this machine, one core).
    pub replay_wall_s: f64,
    pub replay_accesses_per_s: f64,
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub trace: String,
    pub capacity_bytes: u64,
    pub unique_bytes: u64,
    pub results: Vec<Row>,
}

/// Replays `p` under each of `policies`, timing each.
pub fn run_all(p: &Prepared, policies: &[String], cfg: &ReplayConfig) -> anyhow::Result<Vec<Row>> {
    policies
        .iter()
        .map(|name| {
            let set = make_policy(name, cfg.capacity_bytes)?;
            let t0 = Instant::now();
            let result = replay(p, set, cfg);
            let wall = t0.elapsed().as_secs_f64();
            Ok(Row {
                replay_accesses_per_s: result.accesses as f64 / wall.max(1e-9),
                replay_wall_s: wall,
                result,
            })
        })
        .collect()
}
