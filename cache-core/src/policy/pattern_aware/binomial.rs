//! The sign test the policy's adaptive decisions share: under H0 an event falls on
//! either of two sides with probability 1/2; `two_sided_p(n, k)` is the p-value of `k`
//! of `n` events on the busier side.

use std::collections::HashMap;

use statrs::distribution::{Binomial, DiscreteCDF};

use crate::stream::FxBuild;

/// p-values remembered at most (then the memo starts over): 64Ki, ~2 MiB; the default
/// tests (at least 16 votes, halved past 16x that, so n <= 512 and k >= n/2) need
/// under 70Ki.
const MEMO_MAX: usize = 1 << 16;

/// `2 * P[X >= k]` for `X ~ Binomial(n, 1/2)` (1 where statrs refuses `n`), memoized by
/// `(n, k)`: a test runs on every vote once the votes are in, over the few hundred
/// `(n, k)` the votes reach, and a regularized incomplete beta function each time was
/// 1% of a replay's instructions (held-out `mixh`). The same function of the same
/// arguments, so the same value.
#[derive(Default)]
pub(super) struct SignTest {
    memo: HashMap<(u64, u64), f64, FxBuild>,
}

/// Below this many standard deviations from `n / 2` no test at the levels the policy
/// uses (0.01 and stricter) can reject: the normal approximation puts the two-sided
/// p-value at 0.046 there, and the exact binomial tail of a fair coin is heavier still
/// (the continuity correction), so the exact test is only run past it.
const NO_REJECTION_Z: f64 = 2.0;

impl SignTest {
    /// Whether `k` of `n` votes on the busier side reject H0 at `alpha` (<= 0.01).
    /// Most votes arrive far from rejection, and the exact p-value, a regularized
    /// incomplete beta function, is evaluated only near it: on a short trace every
    /// vote was a new `(n, k)` and the memo did not help (held-out `pyimport`).
    pub(super) fn rejects(&mut self, n: u64, k: u64, alpha: f64) -> bool {
        let z = (2.0 * k as f64 - n as f64) / (n as f64).sqrt();
        if alpha <= 0.01 && z < NO_REJECTION_Z {
            return false;
        }
        self.two_sided_p(n, k) < alpha
    }

    pub(super) fn two_sided_p(&mut self, n: u64, k: u64) -> f64 {
        if let Some(&p) = self.memo.get(&(n, k)) {
            return p;
        }
        let p = Binomial::new(0.5, n).map_or(1.0, |b| 2.0 * b.sf(k.saturating_sub(1)));
        if self.memo.len() >= MEMO_MAX {
            self.memo.clear();
        }
        self.memo.insert((n, k), p);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_votes_are_not_significant_and_lopsided_ones_are() {
        let mut t = SignTest::default();
        assert!(t.two_sided_p(32, 16) > 0.5);
        assert!(t.two_sided_p(32, 28) < 0.01);
        // Memoized: the same answer again.
        assert_eq!(t.two_sided_p(32, 28), t.two_sided_p(32, 28));
    }

    /// The shortcut never changes an answer: for every `(n, k)` the votes reach, at
    /// the levels the policy uses, `rejects` agrees with the exact p-value.
    #[test]
    fn the_normal_shortcut_agrees_with_the_exact_test() {
        let mut t = SignTest::default();
        for alpha in [0.01, 0.001, 0.0001] {
            // Every n the window test reaches, then a sample up to the guard's horizon.
            for n in (1..=600u64).chain((650..=2100).step_by(50)) {
                for k in n.div_ceil(2)..=n {
                    let exact = t.two_sided_p(n, k) < alpha;
                    assert_eq!(t.rejects(n, k, alpha), exact, "n {n} k {k} alpha {alpha}");
                }
            }
        }
    }
}
