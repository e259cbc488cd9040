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
