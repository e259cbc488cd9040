//! Subcommands other than benchmarks.

pub mod cluster;
pub mod demo;
pub mod mount;
pub mod serve;
pub mod stats;
pub mod trace;
pub mod warmup;
