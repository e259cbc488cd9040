//! Subcommands other than benchmarks.

pub mod demo;
pub mod serve;
pub mod stats;
pub mod trace;
