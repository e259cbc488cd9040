use super::eval::{hot_column_queries, hot_eighth, measure, reused_streams, sparse_sweeps, Kind};
use super::*;

fn cfg() -> ClassifierConfig {
    ClassifierConfig::default()
}

#[test]
fn clean_sequential_is_detected_at_min_samples() {
    let r = measure(Kind::Sequential { noise: 0.0 }, 256, 50, 1, &cfg());
    assert_eq!(r.final_error, 0.0);
    // The first test runs once min_samples steps are in and test_every visits passed.
    assert!(r.max_delay <= 24, "{r:?}");
}

#[test]
fn noisy_sequential_is_still_detected() {
    // 30% of steps jump elsewhere (another reader's interference).
    let r = measure(Kind::Sequential { noise: 0.3 }, 256, 100, 2, &cfg());
    assert!(r.final_error <= 0.02, "{r:?}");
    assert!(r.mean_delay <= 40.0, "{r:?}");
}

#[test]
fn uniform_streams_are_rarely_misclassified() {
    // Per test, the two nulls are true: the error rate is bounded by about 2 * alpha.
    for n in [8, 64, 1000, 1 << 20] {
        let r = measure(Kind::Uniform { n }, 512, 100, 3, &cfg());
        assert!(r.per_test_error <= 0.03, "n={n}: {r:?}");
        assert!(r.final_error <= 0.05, "n={n}: {r:?}");
    }
}

#[test]
fn shuffled_epochs_are_random() {
    let r = measure(Kind::Shuffle { n: 5000 }, 1000, 100, 4, &cfg());
    assert!(r.final_error <= 0.02, "{r:?}");
}

#[test]
fn zipf_streams_are_skewed() {
    let r = measure(Kind::Zipf { n: 2000, s: 1.0 }, 1024, 100, 5, &cfg());
    assert!(r.final_error <= 0.05, "{r:?}");
    assert!(r.mean_delay <= 200.0, "{r:?}");
}

#[test]
fn hysteresis_needs_two_agreeing_tests() {
    let c = cfg();
    let mut sc = Scratch::default();
    let mut s = StreamStats::new(Pattern::Sequential);
    // One outcome of Random does not flip an established pattern.
    s.apply(Pattern::Random, &c);
    assert_eq!(s.pattern(), Pattern::Sequential);
    s.apply(Pattern::Random, &c);
    assert_eq!(s.pattern(), Pattern::Random);
    // From Unknown the first outcome is taken.
    let mut u = StreamStats::new(Pattern::Unknown);
    u.apply(Pattern::Skewed, &c);
    assert_eq!(u.pattern(), Pattern::Skewed);
    let _ = s.test_now(&c, &mut sc);
}

#[test]
fn p_values_come_from_the_right_tails() {
    // 10 adjacent of 10 steps at p0 = 0.5 -> 0.5^10.
    assert!((sequential_p_value(10, 10, 0.5) - 0.5f64.powi(10)).abs() < 1e-9);
    assert_eq!(sequential_p_value(10, 0, 0.5), 1.0);
    assert!(uniform_p_value(&[10, 10, 10, 10]) > 0.99);
    assert!(uniform_p_value(&[40, 2, 2, 2]) < 1e-6);
}

#[test]
fn zipf_exponent_is_recovered() {
    let counts: Vec<usize> = (1..=50)
        .map(|r| (10_000.0 / (r as f64).powf(1.2)) as usize)
        .collect();
    let s = zipf_exponent(&counts);
    assert!((s - 1.2).abs() < 0.05, "{s}");
}

/// Column reads of a columnar file: each query reads 3 of 16 columns (4 blocks each) in
/// order, two hot columns in most queries. Sequential, and reused: the hot blocks come
/// back query after query. A file read whole pass after pass is sequential and not
/// reused: every block as often as the others.
#[test]
fn hot_columns_read_in_order_are_sequential_and_reused() {
    let c = cfg();
    let mut sc = Scratch::default();
    let mut cols = StreamStats::new(Pattern::Unknown);
    for idx in hot_column_queries(120) {
        cols.observe(idx, idx as u32, &c, &mut sc);
    }
    assert_eq!(cols.pattern(), Pattern::Sequential);
    assert!(cols.reused(), "hot columns come back");

    let mut passes = StreamStats::new(Pattern::Unknown);
    for _ in 0..8 {
        for idx in 0..64u64 {
            passes.observe(idx, idx as u32, &c, &mut sc);
        }
    }
    assert_eq!(passes.pattern(), Pattern::Sequential);
    assert!(!passes.reused(), "every block alike");
}

/// [`sparse_sweeps`], which must leave the stream classified sequential.
fn sequential_sweeps(
    c: &ClassifierConfig,
    n: u64,
    passes: usize,
    seed: u64,
    inclusion: impl Fn(u64) -> f64,
) -> StreamStats {
    let s = sparse_sweeps(c, n, passes, seed, inclusion);
    assert_eq!(s.pattern(), Pattern::Sequential, "{n} blocks, seed {seed}");
    s
}

/// Every eighth block in nearly every pass, the others in half: the popular rows' blocks.
/// The window holds 2-3 passes, too few for the popularity test (2.); the test across
/// passes finds them.
#[test]
fn sparse_sweeps_with_hot_blocks_are_reused() {
    let hot = hot_eighth(0.95, 0.5);
    let s = sequential_sweeps(&cfg(), 150, 200, 7, hot);
    assert!(s.reused(), "hot blocks come back pass after pass");
    let without = ClassifierConfig {
        pass_reuse: false,
        ..cfg()
    };
    let s = sparse_sweeps(&without, 150, 200, 7, hot);
    assert!(
        !s.reused(),
        "the window's popularity test alone misses them"
    );
}

/// Every block in 60% of the passes: no block is hotter than another. At most 1 in 50
/// streams is called reused (the bar is one-sided 0.001 per window, about 8 windows of
/// memory, over 20 windows per stream).
#[test]
fn sparse_sweeps_with_uniform_inclusion_are_not_reused() {
    let reused = reused_streams(&cfg(), 150, 200, 50, |_| 0.6);
    assert!(reused <= 1, "{reused} of 50");
}

/// A loop (every block in every pass, or nearly) and a single long scan are not reused:
/// the first is the hash sample's case, the second has no second pass.
#[test]
fn loops_and_single_scans_are_not_reused() {
    for (inclusion, seed) in [(1.0, 1), (0.97, 2)] {
        let s = sequential_sweeps(&cfg(), 150, 100, seed, |_| inclusion);
        assert!(!s.reused(), "inclusion {inclusion}");
    }
    let s = sequential_sweeps(&cfg(), 20_000, 1, 3, |_| 0.5);
    assert!(!s.reused());
}

/// Passes longer than half the window (a 1,000-block table, a fifth of it per pass: 200
/// visits) are tested on a sample of the blocks whose window holds about 3 passes
/// (`PassSample`): a hot eighth is found, uniform sweeps are not called reused.
#[test]
fn long_passes_are_tested_on_a_sample_of_the_blocks() {
    let s = sequential_sweeps(&cfg(), 1000, 60, 11, hot_eighth(0.5, 0.2));
    assert!(s.reused(), "hot blocks of long passes");
    assert!(s.pass_sample.is_some(), "tested on a sample");
    let uniform = reused_streams(&cfg(), 1000, 60, 50, |_| 0.2);
    assert!(uniform <= 1, "{uniform} of 50");
    // Short passes keep the main window and allocate no sample.
    let short = sparse_sweeps(&cfg(), 150, 60, 12, |_| 0.5);
    assert!(short.pass_sample.is_none());
}

/// Feeds `visits` uniform draws from `n` items (a shuffle of all `n` per pass when
/// `shuffle`) and returns the stream.
fn random_stream(n: u64, visits: usize, shuffle: bool, seed: u64) -> StreamStats {
    let c = cfg();
    let mut sc = Scratch::default();
    let mut s = StreamStats::new(Pattern::Unknown);
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        crate::stream::mix64(state)
    };
    let mut order: Vec<u64> = (0..n).collect();
    let mut i = 0;
    for _ in 0..visits {
        let idx = if shuffle {
            if i == 0 {
                for k in (1..order.len()).rev() {
                    order.swap(k, (next() % (k as u64 + 1)) as usize);
                }
            }
            let x = order[i];
            i = (i + 1) % order.len();
            x
        } else {
            next() % n
        };
        s.observe(idx, crate::stream::mix64(idx ^ 0x5a5a) as u32, &c, &mut sc);
    }
    s
}

/// A random stream over a small set (a class of 10-80 files a balanced sampler draws
/// from) re-reads its items within its window; random draws or shuffled epochs over
/// more items than the window do not, and neither does a stream too young to tell.
#[test]
fn random_streams_over_small_sets_reread() {
    for (n, seed) in [(10, 1), (40, 2), (80, 3)] {
        let s = random_stream(n, 2_000, false, seed);
        assert_eq!(s.pattern(), Pattern::Random, "n={n}");
        assert!(s.reread(), "n={n}");
    }
    for (n, shuffle, seed) in [(1_000, false, 4), (5_000, true, 5), (600, true, 6)] {
        let s = random_stream(n, 3_000, shuffle, seed);
        assert_eq!(s.pattern(), Pattern::Random, "n={n}");
        assert!(!s.reread(), "n={n} shuffle={shuffle}");
    }
    assert!(
        !random_stream(10, 40, false, 7).reread(),
        "40 visits say nothing"
    );
}
