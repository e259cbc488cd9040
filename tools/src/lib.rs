//! Library behind the `strata` binary: each subcommand's logic, so tests can call it
//! without spawning the binary.

pub mod admin;
pub mod bench;
pub mod cli;
pub mod commands;
pub mod config;
pub mod replay;
pub mod trace;
