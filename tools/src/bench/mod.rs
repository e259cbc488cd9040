//! `strata bench ...`: benchmarks that print JSON (`--json`) or a table.

use clap::Subcommand;

pub mod replay;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Replay a trace through several cache policies in simulated time.
    Replay(replay::ReplayArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Replay(a) => replay::run(a),
    }
}
