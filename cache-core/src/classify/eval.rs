//! Tests of the tests: generated streams of known type, the false-classification rate at
//! the configured alpha and the detection delay. Used by the unit tests (with bounds)
//! and by `cargo run -p strata-cache-core --example classify_rates` (the figures in
//! `docs/PATTERNS.md`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{ClassifierConfig, Scratch, StreamStats};
use crate::pattern::Pattern;

/// A stream generator of known type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// Blocks 0, 1, 2, ... with probability `noise` of a jump to a random block instead.
    Sequential { noise: f64 },
    /// Uniform over `n` items (a per-epoch shuffle looks like this to the tests).
    Uniform { n: u64 },
    /// One random permutation of `n` items (one epoch of a shuffled dataset).
    Shuffle { n: u64 },
    /// Zipf(`s`) over `n` items (ranks scattered over indices).
    Zipf { n: u64, s: f64 },
}

impl Kind {
    pub fn expected(&self) -> Pattern {
        match self {
            Kind::Sequential { .. } => Pattern::Sequential,
            Kind::Uniform { .. } | Kind::Shuffle { .. } => Pattern::Random,
            Kind::Zipf { .. } => Pattern::Skewed,
        }
    }
}

/// Draws `len` item indices of `kind`.
pub fn generate(kind: Kind, len: usize, seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    match kind {
        Kind::Sequential { noise } => {
            let mut pos = 0u64;
            (0..len)
                .map(|_| {
                    pos = if rng.random_bool(noise) {
                        rng.random_range(0..1 << 20)
                    } else {
                        pos + 1
                    };
                    pos
                })
                .collect()
        }
        Kind::Uniform { n } => (0..len).map(|_| rng.random_range(0..n)).collect(),
        Kind::Shuffle { n } => {
            // Fisher-Yates over a prefix: the first `len` items of a permutation.
            let mut v: Vec<u64> = (0..n).collect();
            let take = len.min(n as usize);
            for i in 0..take {
                let j = rng.random_range(i..n as usize);
                v.swap(i, j);
            }
            v.truncate(take);
            v
        }
        Kind::Zipf { n, s } => {
            let weights: Vec<f64> = (1..=n).map(|r| (r as f64).powf(-s)).collect();
            let total: f64 = weights.iter().sum();
            let mut cdf = Vec::with_capacity(weights.len());
            let mut acc = 0.0;
            for w in weights {
                acc += w / total;
                cdf.push(acc);
            }
            // Scatter ranks over indices so popularity is unrelated to order.
            let scatter = |r: u64| r.wrapping_mul(0x9e37_79b9_7f4a_7c15) % (n * 1024);
            (0..len)
                .map(|_| {
                    let u: f64 = rng.random();
                    let r = cdf.partition_point(|&c| c < u) as u64;
                    scatter(r)
                })
                .collect()
        }
    }
}

/// The block indices of a columnar file's queries (16 columns of 4 blocks): `queries`
/// queries, three of four reading columns 0 and 1 (the hot ones) and one cold column, the
/// fourth the cold column alone, each query's columns in file order. Sequential within a
/// query, reused across them.
pub fn hot_column_queries(queries: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut x = 5u64;
    for q in 0..queries {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let cold = 2 + (x >> 33) % 14;
        let mut picked = if q % 4 == 3 {
            vec![cold]
        } else {
            vec![0, 1, cold]
        };
        picked.sort_unstable();
        for col in picked {
            out.extend((0..4).map(|b| col * 4 + b));
        }
    }
    out
}

/// A stream of sorted sparse sweeps (embedding lookups: each batch reads the blocks of its
/// ids in order, each block at most once): `passes` passes over `n` blocks, block `i`
/// read in a pass with probability `inclusion(i)`. Returns the stream after them all.
pub fn sparse_sweeps(
    cfg: &ClassifierConfig,
    n: u64,
    passes: usize,
    seed: u64,
    inclusion: impl Fn(u64) -> f64,
) -> StreamStats {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut scratch = Scratch::default();
    let mut s = StreamStats::new(Pattern::Unknown);
    for _ in 0..passes {
        for idx in 0..n {
            if rng.random_bool(inclusion(idx).clamp(0.0, 1.0)) {
                s.observe(idx, crate::stream::mix64(idx) as u32, cfg, &mut scratch);
            }
        }
    }
    s
}

/// Inclusion of [`sparse_sweeps`] with a hot eighth: every eighth block read in a share
/// `hot` of the passes, the others in a share `rest`.
pub fn hot_eighth(hot: f64, rest: f64) -> impl Fn(u64) -> f64 + Copy {
    move |i| if i.is_multiple_of(8) { hot } else { rest }
}

/// How many of `streams` generated sparse-sweep streams (seeds `0..streams`) end
/// classified sequential and reused ([`StreamStats::reused`]).
pub fn reused_streams(
    cfg: &ClassifierConfig,
    n: u64,
    passes: usize,
    streams: u64,
    inclusion: impl Fn(u64) -> f64 + Copy,
) -> usize {
    (0..streams)
        .filter(|&seed| {
            let s = sparse_sweeps(cfg, n, passes, seed, inclusion);
            s.pattern() == Pattern::Sequential && s.reused()
        })
        .count()
}

/// Result of running many generated streams of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    pub streams: usize,
    /// Share of individual tests whose outcome was not the stream's true type.
    pub per_test_error: f64,
    /// Share of streams whose pattern after all visits is not the true type.
    pub final_error: f64,
    /// Mean visits until the stream first showed its true type (streams that never did
    /// count as `len`).
    pub mean_delay: f64,
    /// Worst delay seen.
    pub max_delay: usize,
}

/// Classifies `streams` generated streams of `len` visits of `kind`.
pub fn measure(kind: Kind, len: usize, streams: usize, seed: u64, cfg: &ClassifierConfig) -> Rates {
    let want = kind.expected();
    let mut scratch = Scratch::default();
    let (mut tests, mut wrong_tests, mut wrong_final) = (0usize, 0usize, 0usize);
    let (mut delay_sum, mut max_delay) = (0usize, 0usize);
    for k in 0..streams {
        let items = generate(
            kind,
            len,
            seed.wrapping_mul(1_000_003).wrapping_add(k as u64),
        );
        let mut s = StreamStats::new(Pattern::Unknown);
        let mut delay = None;
        let mut visits = 0usize;
        for idx in items {
            let fp = crate::stream::mix64(idx) as u32;
            if s.observe(idx, fp, cfg, &mut scratch) {
                continue;
            }
            visits += 1;
            if visits > cfg.min_samples as usize && s.since_test == 0 {
                tests += 1;
                let out = s.test_now(cfg, &mut scratch);
                if out.pattern != want {
                    wrong_tests += 1;
                }
            }
            if delay.is_none() && s.pattern() == want {
                delay = Some(visits);
            }
        }
        if s.pattern() != want {
            wrong_final += 1;
        }
        let d = delay.unwrap_or(len);
        delay_sum += d;
        max_delay = max_delay.max(d);
    }
    Rates {
        streams,
        per_test_error: if tests == 0 {
            0.0
        } else {
            wrong_tests as f64 / tests as f64
        },
        final_error: wrong_final as f64 / streams.max(1) as f64,
        mean_delay: delay_sum as f64 / streams.max(1) as f64,
        max_delay,
    }
}
