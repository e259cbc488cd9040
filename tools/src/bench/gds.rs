//! `strata bench gds`: the GPU tier's staged disk -> pinned bounce buffer -> device copy
//! on the emulated device, next to raw O_DIRECT disk reads and memcpy measured in the
//! same run on the same file (see `strata_gds::bench`).

use std::path::PathBuf;

use clap::Args;
use strata_gds::bench::{staged_copy_bench, StagedBenchConfig};

#[derive(Debug, Args)]
pub struct GdsArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Size of the test file in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Directory for the test file; must be on a real disk for O_DIRECT (tmpfs is not).
    /// Default: the system temp dir.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Staging chunk in MiB (also the raw-read request size, for a like-for-like ceiling).
    #[arg(long, default_value_t = 4)]
    pub chunk_mib: usize,
    /// Staging buffers per transfer (2 = double buffering).
    #[arg(long, default_value_t = 3)]
    pub depth: usize,
    /// Measured runs of each of the three (interleaved); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

pub fn run(args: GdsArgs) -> anyhow::Result<()> {
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let r = staged_copy_bench(&StagedBenchConfig {
        dir: dir.clone(),
        size_bytes: args.size_mib << 20,
        chunk_bytes: args.chunk_mib << 20,
        depth: args.depth,
        runs: args.runs,
    })?;
    if args.json {
        outln!("{}", serde_json::to_string(&r)?);
    } else {
        outln!(
            "gds bench: {} MiB file in {}, {} x {} MiB staging, O_DIRECT {}, path {}",
            args.size_mib,
            dir.display(),
            r.depth,
            args.chunk_mib,
            r.direct_io,
            r.path
        );
        outln!("  disk (raw O_DIRECT)       {:>7.2} GB/s", r.disk_gbps);
        outln!("  memcpy (host -> device)   {:>7.2} GB/s", r.memcpy_gbps);
        outln!(
            "  staged disk -> device     {:>7.2} GB/s = {:.0}% of the {} ceiling",
            r.staged_gbps,
            100.0 * r.ratio_to_ceiling,
            r.ceiling
        );
    }
    Ok(())
}
