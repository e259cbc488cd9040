//! Property tests of the semantic predictor.

use proptest::prelude::*;
use strata_prefetch::semantic::workloads::{random_listed, random_numbers};
use strata_prefetch::semantic::{tokenize, SemanticConfig, SemanticPredictor};
use strata_prefetch::{AccessEvent, Predictor};

fn ev(job: u64, path: &str) -> AccessEvent {
    AccessEvent::read(job, path, 0, 4096, 4096)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Rendering a path with its own field values gives the path back, and the template
    /// with the field texts reassembles it.
    #[test]
    fn tokenize_round_trips(path in "[a-z0-9_./=-]{0,40}") {
        let t = tokenize(&path);
        let values: Vec<i64> = t.fields.iter().map(|f| f.value).collect();
        prop_assert_eq!(t.render(&values, &[]), path.clone());
        prop_assert_eq!(t.fields.len(), t.spans.len());
    }

    /// Any trace: requests are never for the file just read, ranges start at 0 with a
    /// length, confidence is in (0, 1], and two runs give the same requests.
    #[test]
    fn requests_are_sane_and_deterministic(
        trace in prop::collection::vec((0u64..3, 0u64..40, 0usize..3), 1..300)
    ) {
        let names = ["d/f-{}.bin", "d/{}/x.json", "e/date=2025-01-{}/p.parquet"];
        let run = || {
            let mut p = SemanticPredictor::default();
            let mut all = Vec::new();
            for (job, n, kind) in &trace {
                let path = names[*kind].replace("{}", &format!("{:02}", n % 28 + 1));
                let mut out = Vec::new();
                p.on_access(&ev(*job, &path), &mut out);
                for r in &out {
                    assert_ne!(&*r.path, path.as_str());
                    assert!(r.offset == 0 && r.len > 0);
                    assert!(r.confidence > 0.0 && r.confidence <= 1.0);
                }
                all.push(out);
            }
            all
        };
        prop_assert_eq!(run(), run());
    }

    /// Random reads (any seed, any set size): prefetched-but-unused bytes stay < 5% of
    /// bytes read.
    #[test]
    fn random_reads_waste_little(seed in any::<u64>(), n in 50usize..5000) {
        let r = random_listed(seed, n, 4000).eval_semantic(SemanticConfig::default());
        prop_assert!(r.waste_ratio() < 0.05, "{:?}", r);
        let r = random_numbers(seed, n as u64, 4000).eval_semantic(SemanticConfig::default());
        prop_assert!(r.waste_ratio() < 0.05, "{:?}", r);
    }
}
