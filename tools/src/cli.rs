//! Command-line tree. Each subcommand's arguments live next to its logic.

use clap::{Parser, Subcommand};

use crate::{bench, commands};

/// Strata: a unified caching filesystem for AI clusters.
///
/// Training jobs read object storage through a FUSE mount; inference engines put and
/// fetch KV-cache blocks over gRPC; both go through one tiered cache core.
#[derive(Debug, Parser)]
#[command(name = "strata", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the whole system on an embedded default: sample dataset in a local directory
    /// store, caches in a temp dir, a demo workload, then print stats.
    Demo(commands::demo::DemoArgs),
    /// Benchmarks: tiers, replay, fs, kv, gds.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Replay traces: generate synthetic workloads, import external traces, record a command's reads.
    #[command(subcommand)]
    Trace(commands::trace::TraceCommand),
    /// Run the daemon: KV service, mounts and admin API on one cache core.
    Serve(commands::serve::ServeArgs),
    /// Show a running daemon's figures (per tier, per namespace); --watch for a live view.
    Stats(commands::stats::StatsArgs),
    /// Mount a bucket/prefix or local directory through the cache (FUSE); read-only unless
    /// `--allow-writes`.
    Mount(commands::mount::MountArgs),
    /// Prefetch files or directories of a Strata mount into the cache.
    Warmup(commands::warmup::WarmupArgs),
    /// The cache group on etcd (`[cluster]`): `status` lists members and key shares.
    #[command(subcommand)]
    Cluster(commands::cluster::ClusterCommand),
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(args) => commands::demo::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Trace(cmd) => commands::trace::run(cmd),
        Command::Serve(args) => commands::serve::run(args),
        Command::Stats(args) => commands::stats::run(args),
        Command::Mount(args) => commands::mount::run(args),
        Command::Warmup(args) => commands::warmup::run(args),
        Command::Cluster(cmd) => commands::cluster::run(cmd),
    }
}

/// An error that ends `strata` with `code` rather than 1: `trace record` passes on the
/// exit status of the command it recorded, so a caller can tell that command's failure
/// (`exit 3` -> 3, killed by signal N -> 128 + N) from strata's own.
#[derive(Debug)]
pub struct ExitWith {
    pub code: u8,
    pub msg: String,
}

impl std::fmt::Display for ExitWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for ExitWith {}

/// The process exit status for the outcome of [`run`].
pub fn exit_status(r: &anyhow::Result<()>) -> u8 {
    match r {
        Ok(()) => 0,
        Err(e) => e.downcast_ref::<ExitWith>().map_or(1, |x| x.code),
    }
}
