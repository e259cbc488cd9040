//! Per-epoch shuffle with a cache smaller than the set (window < set size).
//! `cargo run --release -p strata-prefetch --example semantic_window`
use strata_prefetch::semantic::workloads as w;
use strata_prefetch::semantic::SemanticConfig;

fn main() {
    println!("| workload | window (files) | issued | precision | coverage | waste |");
    println!("|---|---:|---:|---:|---:|---:|");
    for window in [200usize, 500, 1000, 2000] {
        for (label, mut wl) in [
            ("shuffle 2k x 4 epochs", w::shuffled_epochs(7, 2_000, 4)),
            (
                "8 loaders, 2k x 4 epochs",
                w::loader_workers(7, 2_000, 8, 4),
            ),
        ] {
            wl.window = window;
            let r = wl.eval_semantic(SemanticConfig::default());
            println!(
                "| {label} | {window} | {} | {:.1}% | {:.1}% | {:.2}% |",
                r.issued,
                100.0 * r.precision(),
                100.0 * r.coverage(),
                100.0 * r.waste_ratio()
            );
        }
    }
}
