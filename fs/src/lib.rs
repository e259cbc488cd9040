//! Strata's FUSE mount: object storage read as a local directory, through the cache.
//!
//! - [`core::FsCore`]: the file system as async methods with plain reply types (inode
//!   table, metadata cache with TTL, version-consistent opens, reads through the
//!   cache core's [`strata_cache_core::ObjectReader`], readahead, passthrough copies).
//!   Tested without a kernel.
//! - [`fuse`]: the thin `fuser` adapter: translates requests, spawns each onto the tokio
//!   runtime, replies from the task, maps [`Error`] to errno once.
//! - [`mount`]: the library entry point the daemon uses:
//!   `mount::spawn(reader, prefix, mountpoint, MountOptions) -> Result<MountHandle>`, with
//!   `MountHandle::unmount()`; several mounts can share one cache core.
//! - [`null`]: a do-nothing file system (zeros) mounted with the same options, the
//!   FUSE ceiling the benchmark compares against.
//! - [`readahead`]: the readahead trait and its window-doubling default.

pub mod core;
pub mod error;
pub mod fuse;
pub mod mount;
pub mod null;
pub mod readahead;

pub use crate::core::{CoreOptions, FsCore, PassthroughOptions, Predictors};
pub use crate::error::{Error, Result};
pub use crate::mount::{spawn, MountHandle, MountOptions};
