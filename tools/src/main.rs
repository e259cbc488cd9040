//! The `strata` binary: parses arguments and calls into the `strata_tools` library.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = strata_tools::cli::Cli::parse();
    strata_tools::cli::run(cli)
}
