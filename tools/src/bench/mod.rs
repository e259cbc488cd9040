//! `strata bench ...`: benchmarks that print JSON (`--json`) or a table.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {}
}
