//! The staged-copy benchmark without the CLI: `cargo run --release -p strata-gds
//! --example staged_bench -- [SIZE_MIB] [DIR] [DEPTH]` (prints the JSON report).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let size_mib: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let dir = args
        .get(2)
        .map(Into::into)
        .unwrap_or_else(std::env::temp_dir);
    let depth: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let r = strata_gds::bench::staged_copy_bench(&strata_gds::bench::StagedBenchConfig {
        dir,
        size_bytes: size_mib << 20,
        chunk_bytes: 4 << 20,
        depth,
        runs: 3,
    })?;
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}
