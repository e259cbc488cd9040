//! Precision / coverage / waste of the semantic predictor per synthetic workload, in an
//! ideal-cache replay (see `strata_prefetch::semantic::eval`): a prefetch is used if its
//! job reads the file within the next `window` file reads.
//!
//! `cargo run --release -p strata-prefetch --example semantic_eval`

use strata_prefetch::semantic::workloads as w;
use strata_prefetch::semantic::SemanticConfig;

fn main() {
    let seed = 42;
    let workloads = [
        (
            "ImageNet-style, name order, listed: 50 dirs x 400",
            w::name_ordered(seed, 50, 400),
        ),
        ("img_N.jpg, numeric order, unlisted", w::numbered(20_000)),
        (
            "train-NNNNNN.tar shards (4 x 16 MiB reads each)",
            w::shards(2_000),
        ),
        (
            "date=YYYY-MM-DD/part-NNNN, 90 d x 24, unlisted",
            w::dated(90, 24),
        ),
        (
            "date=.../part-NNNN, 3-12 parts/day, listed",
            w::dated_listed(seed, 90),
        ),
        (
            "model-0000i-of-00008, 10 loads, unlisted",
            w::checkpoints(10, 8),
        ),
        (
            "four tenants interleaved (4 job ids)",
            w::four_tenants(seed, false),
        ),
        (
            "four tenants interleaved, one job id",
            w::four_tenants(seed, true),
        ),
        (
            "four workers, one job, one template",
            w::four_workers_one_template(seed, 2_000),
        ),
        (
            "per-epoch shuffle, 2k listed files, 3 epochs",
            w::shuffled_epochs(seed, 2_000, 3),
        ),
        (
            "per-epoch shuffle, 20k listed files, 3 epochs",
            w::shuffled_epochs(seed, 20_000, 3),
        ),
        (
            "8 loader workers splitting shuffles of 2k files",
            w::loader_workers(seed, 2_000, 8, 3),
        ),
        (
            "8 loader workers splitting shuffles of 20k files",
            w::loader_workers(seed, 20_000, 8, 3),
        ),
        (
            "random 50% of 20k listed per epoch, 3 epochs",
            w::sampled_epochs(seed, 20_000, 0.5, 3),
        ),
        (
            "random with replacement, 20k listed",
            w::random_listed(seed, 20_000, 20_000),
        ),
        (
            "random with replacement, 500 listed",
            w::random_listed(seed, 500, 20_000),
        ),
        (
            "random numbers in 0..100, unlisted",
            w::random_numbers(seed, 100, 20_000),
        ),
        (
            "random numbers in 0..1e8, unlisted",
            w::random_numbers(seed, 100_000_000, 20_000),
        ),
        ("random hashed names", w::random_hashes(seed, 20_000)),
    ];
    println!(
        "| workload | file reads | window | issued | precision | coverage | wasted bytes / bytes read |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, wl) in &workloads {
        let r = wl.eval_semantic(SemanticConfig::default());
        println!(
            "| {label} | {} | {} | {} | {:.1}% | {:.1}% | {:.2}% |",
            r.file_reads,
            wl.window,
            r.issued,
            100.0 * r.precision(),
            100.0 * r.coverage(),
            100.0 * r.waste_ratio()
        );
    }
}
