//! The recorded corpus (`tools/replay/traces/`) stays readable, small and documented.

use std::path::Path;

use strata_replay::trace;

#[test]
fn every_recorded_trace_parses_and_is_listed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces");
    let readme = std::fs::read_to_string(dir.join("README.md")).expect("traces/README.md");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("traces dir") {
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
            bytes < 1 << 20,
            "{name}: {bytes} bytes gzip'd, keep it under 1 MiB"
        );
        let t = trace::read_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            (1..=100_000).contains(&t.records.len()),
            "{name}: {} rows",
            t.records.len()
        );
        assert!(
            readme.contains(&format!("`{name}`")),
            "{name} is not in README.md"
        );
    }
    assert!(n >= 5, "only {n} traces in {}", dir.display());
}
