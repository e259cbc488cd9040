//! Subcommands other than benchmarks.

pub mod demo;
