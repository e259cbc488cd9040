//! Import of Mooncake's KV request traces (FAST'25 release, `../shared/traces/kv/`).
//!
//! Input: JSON lines `{"timestamp": ms, "input_length", "output_length", "hash_ids"}`
//! (optionally gzip'd), where `hash_ids` name the request's 512-token prefix blocks.
//!
//! Output: one replay row per prefix block the request loads, `path =
//! kv/<namespace>/<16 hex digits>`, `offset 0`, `len = size = block bytes`.
//!
//! The release's `hash_ids` are *remapped* hashes: new blocks get consecutive numbers,
//! so a new conversation's blocks are `n, n+1, n+2, ...`. Real KV keys are content
//! hashes with no such order, and a path predictor would otherwise "predict" unseen
//! blocks from the numbering alone. So each id goes through a fixed bijective 64-bit
//! mixer ([`scramble`], the splitmix64 finaliser) before it becomes a path: equal ids
//! stay equal, distinct ids stay distinct, and the numbering order is gone.
//! **Each request is one job** (`req-000042`): a request is the unit whose latency an
//! inference engine pays, and the traces carry no session or engine id to group by.
//! All rows of a request carry its arrival time, so the replay issues its block loads
//! back to back (gap 0) from its arrival, and the request's completion time is the time
//! to load its prefix (CALVO's "loading is the bottleneck").

use std::io::{BufReader, Read};
use std::path::Path;

use strata_cache_core::stream::mix64;

use super::{Trace, TraceBuilder, TraceError};

/// The splitmix64 finaliser ([`mix64`]): a bijection on u64 (each step is invertible).
pub fn scramble(id: u64) -> u64 {
    mix64(id)
}

#[derive(serde::Deserialize)]
struct Request {
    timestamp: u64,
    #[allow(dead_code)]
    input_length: Option<u64>,
    #[allow(dead_code)]
    output_length: Option<u64>,
    hash_ids: Vec<u64>,
}

/// Converts Mooncake JSON lines to a trace.
pub fn import(input: impl Read, block_bytes: u64, namespace: &str) -> Result<Trace, TraceError> {
    if block_bytes == 0 {
        return Err(TraceError::Invalid("--block-bytes must be > 0".into()));
    }
    let mut b = TraceBuilder::new();
    let mut input = BufReader::new(input);
    let (mut raw, mut line) = (Vec::new(), String::new());
    for i in 0.. {
        if !super::read_text_line(&mut input, &mut raw, &mut line, i + 1)? {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let req: Request = serde_json::from_str(&line).map_err(|e| TraceError::Line {
            line: i + 1,
            msg: format!("not a Mooncake request: {e}"),
        })?;
        let job = b.job(&format!("req-{i:06}"));
        let ts = req.timestamp.saturating_mul(1_000_000);
        for h in req.hash_ids {
            let p = b
                .path(&format!("kv/{namespace}/{:016x}", scramble(h)), block_bytes)
                .map_err(|msg| TraceError::Line { line: i + 1, msg })?;
            b.push(ts, job, p, 0, block_bytes)
                .map_err(|msg| TraceError::Line { line: i + 1, msg })?;
        }
    }
    let mut t = b.finish();
    t.sort_by_time();
    Ok(t)
}

/// Imports a file (gzip'd when its name ends in `.gz`).
pub fn import_file(path: &Path, block_bytes: u64, namespace: &str) -> Result<Trace, TraceError> {
    import(super::open_input(path)?, block_bytes, namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line that is not UTF-8 is named (it was a bare "stream did not contain valid
    /// UTF-8").
    #[test]
    fn non_utf8_names_its_line() {
        let text = b"{\"timestamp\": 1, \"hash_ids\": [1]}\n\xff\n";
        let e = import(&text[..], 1024, "ns")
            .expect_err("not utf-8")
            .to_string();
        assert!(e.starts_with("line 2:") && e.contains("UTF-8"), "{e}");
    }

    #[test]
    fn converts_requests_to_jobs_of_block_reads() {
        let text = r#"{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 3, "input_length": 700, "output_length": 9, "hash_ids": [0, 2, 255]}
"#;
        let t = import(text.as_bytes(), 4096, "mc").expect("valid");
        assert_eq!(t.jobs.len(), 2);
        assert_eq!(t.records.len(), 5);
        assert_eq!(*t.paths[2], *format!("kv/mc/{:016x}", scramble(2)));
        assert_eq!(*t.paths[3], *format!("kv/mc/{:016x}", scramble(255)));
        assert_eq!(t.paths.len(), 4, "ids 0, 1, 2, 255");
        assert_eq!(t.records[2].ts_ns, 3_000_000);
        assert_eq!(
            t.records[2].path, t.records[0].path,
            "shared prefix block, same path"
        );
        assert!(t
            .records
            .iter()
            .all(|r| r.len == 4096 && r.size == 4096 && r.offset == 0));
    }

    #[test]
    fn scramble_is_injective_and_unordered() {
        let v: Vec<u64> = (0..10_000).map(scramble).collect();
        let set: std::collections::HashSet<_> = v.iter().collect();
        assert_eq!(set.len(), v.len());
        let ascending = v.windows(2).filter(|w| w[1] > w[0]).count();
        assert!(
            (4_000..6_000).contains(&ascending),
            "no order left: {ascending}"
        );
    }

    #[test]
    fn bad_line_is_reported() {
        let text = "{\"timestamp\": 0, \"hash_ids\": [1]}\n{\"timestamp\": \"x\"}\n";
        let e = import(text.as_bytes(), 10, "mc").expect_err("bad");
        assert!(e.to_string().starts_with("line 2:"), "{e}");
    }

    #[test]
    fn real_traces_import_when_present() {
        // The shared traces are part of the workspace's environment; the counts below
        // are from their README.
        // tools/replay -> the checkout -> its parent, where shared/ lies (CI too).
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/traces/kv/synthetic_trace.jsonl.gz");
        if !p.exists() {
            // Only outside CI (a checkout without shared/ beside it) may this be absent.
            assert!(
                std::env::var_os("CI").is_none(),
                "{} missing in CI",
                p.display()
            );
            return;
        }
        let t = import_file(&p, 1 << 20, "mooncake").expect("import");
        assert_eq!(t.jobs.len(), 3_993);
        assert_eq!(t.records.len(), 121_877);
        assert_eq!(t.paths.len(), 43_924);
    }
}
