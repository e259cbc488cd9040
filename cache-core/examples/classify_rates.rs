//! Tests of the classifier's tests: false-classification rates and detection delays on
//! generated streams of known type (the table in docs/PATTERNS.md).
//!
//! `cargo run --release -p strata-cache-core --example classify_rates`

use strata_cache_core::classify::eval::{hot_eighth, measure, reused_streams, Kind};
use strata_cache_core::classify::ClassifierConfig;

fn main() {
    let cfg = ClassifierConfig::default();
    let cases = [
        (Kind::Sequential { noise: 0.0 }, 512),
        (Kind::Sequential { noise: 0.3 }, 512),
        (Kind::Sequential { noise: 0.6 }, 512),
        (Kind::Uniform { n: 8 }, 512),
        (Kind::Uniform { n: 64 }, 512),
        (Kind::Uniform { n: 1000 }, 512),
        (Kind::Uniform { n: 1 << 20 }, 512),
        (Kind::Shuffle { n: 5000 }, 512),
        (Kind::Zipf { n: 2000, s: 0.7 }, 1024),
        (Kind::Zipf { n: 2000, s: 0.9 }, 1024),
        (Kind::Zipf { n: 2000, s: 1.2 }, 1024),
        (Kind::Zipf { n: 100, s: 1.0 }, 1024),
    ];
    println!(
        "alpha={} min_samples={} window={} test_every={} hysteresis={}",
        cfg.alpha, cfg.min_samples, cfg.window, cfg.test_every, cfg.hysteresis
    );
    println!(
        "| stream | visits | streams | wrong per test | wrong at end | mean delay | max delay |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (kind, len) in cases {
        let r = measure(kind, len, 500, 42, &cfg);
        println!(
            "| {kind:?} | {len} | {} | {:.4} | {:.3} | {:.1} | {} |",
            r.streams, r.per_test_error, r.final_error, r.mean_delay, r.max_delay
        );
    }
    // Test 5 (reuse across passes): sorted sparse sweeps, `p` the share of the blocks
    // each pass reads. Uniform: every block alike (a false "reused" is an error); hot:
    // every eighth block at `p + 0.3` (found is right).
    println!();
    println!("| sparse sweeps | blocks | passes | streams | uniform: called reused | every 8th block at p + 0.3: found |");
    println!("|---|---|---|---|---|---|");
    for (n, passes) in [(150u64, 200usize), (1000, 60), (4000, 40)] {
        for p in [0.2, 0.4, 0.6, 0.7, 0.8] {
            let uniform = reused_streams(&cfg, n, passes, 200, |_| p);
            let hot = reused_streams(&cfg, n, passes, 200, hot_eighth(p + 0.3, p));
            println!("| p = {p} | {n} | {passes} | 200 | {uniform} | {hot} |");
        }
    }
}
