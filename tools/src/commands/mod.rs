//! Subcommands other than benchmarks.

pub mod demo;
pub mod trace;
