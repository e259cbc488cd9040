//! Replays every committed fuzz corpus (`tests/fuzz/corpus/<target>/`) through the same
//! function its cargo-fuzz target calls (`strata_tests::fuzz`), on stable Rust: an input
//! that once crashed a target, or any input the fuzzer kept, must keep passing. A
//! missing or empty corpus directory fails the test (it is never skipped).

use std::path::PathBuf;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join("corpus")
        .join(target)
}

#[test]
fn every_fuzz_corpus_replays_without_a_panic() {
    for &(target, run) in strata_tests::fuzz::TARGETS {
        let dir = corpus_dir(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
            panic!("corpus of fuzz target `{target}` at {}: {e}", dir.display())
        });
        let mut n = 0;
        for entry in entries {
            let path = entry.expect("corpus entry").path();
            if !path.is_file() {
                continue;
            }
            let data = std::fs::read(&path).expect("read corpus file");
            let r = std::panic::catch_unwind(|| run(&data));
            assert!(
                r.is_ok(),
                "fuzz target `{target}` panicked on {}",
                path.display()
            );
            n += 1;
        }
        assert!(
            n > 0,
            "corpus of fuzz target `{target}` at {} is empty",
            dir.display()
        );
        eprintln!("{target}: {n} inputs replayed");
    }
}

#[test]
fn every_fuzz_target_has_a_harness() {
    // The targets `cargo fuzz` builds are the ones replayed here.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/fuzz_targets");
    for &(target, _) in strata_tests::fuzz::TARGETS {
        let f = dir.join(format!("{target}.rs"));
        let src = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(
            src.contains(&format!("strata_tests::fuzz::{target}(")),
            "{} calls its body",
            f.display()
        );
    }
}
