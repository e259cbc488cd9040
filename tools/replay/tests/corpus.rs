//! The recorded corpus (`tools/replay/traces/`) stays readable, small and documented.

use std::path::Path;

use strata_replay::trace;

/// Every `.csv.gz` in `dir` parses, has between 1 and `max_rows` rows, is under
/// `max_bytes` gzip'd and is named in the directory's README; returns how many there are.
fn check_traces(dir: &Path, max_bytes: u64, max_rows: usize) -> usize {
    let readme = std::fs::read_to_string(dir.join("README.md")).expect("README.md");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).expect("traces dir") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 name");
        if !name.ends_with(".csv.gz") {
            continue;
        }
        n += 1;
        let bytes = std::fs::metadata(&path).expect("stat").len();
        assert!(
            bytes < max_bytes,
            "{name}: {bytes} bytes gzip'd, keep it under {max_bytes}"
        );
        let t = trace::read_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            (1..=max_rows).contains(&t.records.len()),
            "{name}: {} rows",
            t.records.len()
        );
        assert!(
            readme.contains(&format!("`{name}`")),
            "{name} is not in README.md"
        );
    }
    n
}

#[test]
fn every_recorded_trace_parses_and_is_listed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces");
    let n = check_traces(&dir, 1 << 20, 100_000);
    assert!(n >= 5, "only {n} traces in {}", dir.display());
}

/// The held-out set (programs the policy was not tuned on) is larger per trace: its
/// multi-tenant mixes run three programs for a minute.
#[test]
fn every_held_out_trace_parses_and_is_listed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/heldout");
    let n = check_traces(&dir, 4 << 20, 400_000);
    assert!(n >= 98, "only {n} traces in {}", dir.display());
}
