//! `strata bench ...`: benchmarks that print JSON (`--json`) or a table.

use clap::Subcommand;

pub mod chaos;
pub mod cluster;
pub mod fs;
pub mod fs_small;
pub mod gds;
pub mod group;
pub mod kv;
pub mod kv_group;
pub mod replay;
pub mod tiers;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The real daemon under mixed load, killed with SIGKILL and restarted over and over, over an S3 store with injected faults.
    Chaos(chaos::ChaosArgs),
    /// A cache group of daemons on loopback (real etcd) against independent nodes and one big node: store bytes, hit ratios, peer throughput, failover.
    Cluster(cluster::ClusterArgs),
    /// GPU tier staging on the emulated device: disk -> bounce -> device vs its ceilings.
    Gds(gds::GdsArgs),
    /// FUSE mount: seq 1 MiB and random 4 KiB reads, cold and warm, next to a null FUSE fs, the local dir and direct store reads.
    Fs(fs::FsArgs),
    /// Small files through the FUSE mount over a slow store: per-file latency with semantic prefetch on vs off.
    FsSmall(fs_small::FsSmallArgs),
    /// KV service over loopback: put/get throughput and latency next to raw loopback TCP.
    Kv(kv::KvArgs),
    /// KV across a cache group: a Get routed through another node next to a local hit.
    KvGroup(kv_group::KvGroupArgs),
    /// Replay a trace through several cache policies in simulated time.
    Replay(replay::ReplayArgs),
    /// Get throughput and p50/p99 per tier (memory, disk, store) next to its ceiling.
    Tiers(tiers::TiersArgs),
}

/// Parses a count or size that must be at least 1 (clap's `value_parser`): a zero
/// panicked deep in a bench (an empty client list indexed, a remainder by zero) or
/// measured nothing.
pub(crate) fn at_least_one<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr + From<u8> + PartialEq,
    T::Err: std::fmt::Display,
{
    let n: T = s.parse().map_err(|e: T::Err| e.to_string())?;
    if n == T::from(0) {
        return Err("must be at least 1".into());
    }
    Ok(n)
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Chaos(a) => chaos::run(a),
        BenchCommand::Cluster(a) => cluster::run(a),
        BenchCommand::Gds(a) => gds::run(a),
        BenchCommand::Fs(a) => fs::run(a),
        BenchCommand::FsSmall(a) => fs_small::run(a),
        BenchCommand::Kv(a) => kv::run(a),
        BenchCommand::KvGroup(a) => kv_group::run(a),
        BenchCommand::Replay(a) => replay::run(a),
        BenchCommand::Tiers(a) => tiers::run(a),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::BenchCommand;
    use crate::cli::{Cli, Command};

    fn parse(args: &str) -> Result<BenchCommand, clap::Error> {
        let argv = ["strata", "bench"].into_iter().chain(args.split(' '));
        Cli::try_parse_from(argv).map(|c| match c.command {
            Command::Bench(b) => b,
            other => panic!("not a bench: {other:?}"),
        })
    }

    /// Zero counts panicked inside the benches (`kv --clients 0`: index out of bounds;
    /// `fs --files 0`, `kv-group --blocks 0`: remainder by zero); clap refuses them now,
    /// naming the flag. A misspelt tier measured nothing and exited 0.
    #[test]
    fn zero_counts_and_unknown_tiers_are_refused() {
        for (args, flag) in [
            ("kv --clients 0", "--clients"),
            ("kv --clients 1,0", "--clients"),
            ("kv --sizes-kib 0", "--sizes-kib"),
            ("kv --chunk-kib 0", "--chunk-kib"),
            ("fs --files 0", "--files"),
            ("fs --threads 0", "--threads"),
            ("kv-group --blocks 0", "--blocks"),
            ("kv-group --block-kib 0", "--block-kib"),
            ("tiers --tiers memroy", "memroy"),
            ("tiers --tiers memory,memroy", "memroy"),
        ] {
            let e = parse(args).expect_err(args);
            use clap::error::ErrorKind;
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::ValueValidation | ErrorKind::InvalidValue
                ),
                "{args}: {e}"
            );
            assert!(e.to_string().contains(flag), "{args}: {e}");
        }
        for ok in [
            "kv --clients 1,4",
            "fs --files 1",
            "kv-group --secs 1",
            "tiers --json",
            "tiers --tiers disk,store",
        ] {
            parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    /// `fs --file-size 0` ran a minute of benches over empty files and printed their
    /// "IOPS"; it is refused before the working directory is touched.
    #[test]
    fn fs_refuses_empty_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let work = dir.path().join("work");
        let args = format!("fs --file-size 0 --dir {}", work.display());
        let Ok(BenchCommand::Fs(a)) = parse(&args) else {
            panic!("{args} parses");
        };
        let e = super::fs::bench(&a).expect_err("refused");
        assert!(e.to_string().contains("--file-size"), "{e}");
        assert!(!work.exists(), "the bench started");
    }
}
