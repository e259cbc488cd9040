//! Precision / coverage / waste of the semantic predictor per synthetic workload, in an
//! ideal-cache replay (see `strata_prefetch::semantic::eval`).
//!
//! `cargo run --release -p strata-prefetch --example semantic_eval`

use strata_prefetch::semantic::workloads as w;
use strata_prefetch::semantic::SemanticConfig;

fn main() {
    let seed = 42;
    let workloads = [
        w::name_ordered(seed, 50, 400),
        w::numbered(20_000),
        w::shards(2_000),
        w::dated(90, 24),
        w::dated_listed(seed, 90),
        w::checkpoints(10, 8),
        w::four_tenants(seed, false),
        w::four_tenants(seed, true),
        w::four_workers_one_template(seed, 2_000),
        w::shuffled_epochs(seed, 2_000, 3),
        w::shuffled_epochs(seed, 20_000, 3),
        w::sampled_epochs(seed, 20_000, 0.5, 3),
        w::random_listed(seed, 20_000, 20_000),
        w::random_listed(seed, 500, 20_000),
        w::random_numbers(seed, 100, 20_000),
        w::random_numbers(seed, 100_000_000, 20_000),
        w::random_hashes(seed, 20_000),
    ];
    println!(
        "| workload | reads | window | issued | precision | coverage | wasted bytes / bytes read |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for wl in &workloads {
        let r = wl.eval_semantic(SemanticConfig::default());
        println!(
            "| {} | {} | {} | {} | {:.1}% | {:.1}% | {:.2}% |",
            wl.name,
            r.accesses,
            wl.window,
            r.issued,
            100.0 * r.precision(),
            100.0 * r.coverage(),
            100.0 * r.waste_ratio()
        );
    }
}
