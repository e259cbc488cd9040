//! The replay simulator and its traces, a library of their own so that what they
//! measure is the daemon's code and nothing else: [`replay`] drives the cache core's
//! `TierSpace` and eviction policies and the prefetch crate's `AccessController` (the
//! one the mount drives) in simulated time over a store link model; [`trace`] reads,
//! writes, generates and imports the traces it replays. The `strata` binary
//! (`strata-tools`) only adds the CLI (`strata bench replay`, `strata trace`).

pub mod replay;
pub mod trace;
