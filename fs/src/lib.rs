//! Strata's FUSE mount: object storage read as a local directory, through the cache.
//!
//! - [`filesystem::FsCore`]: the file system as async methods with plain reply types (inode
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
//! - [`job`]: maps a request's thread id to its job (process group by default), cached.
//! - [`readahead`]: the per-file readahead trait and its window-doubling default;
//!   [`Predictors`] (in `CoreOptions::predictors`) drives the prefetch crate's
//!   [`strata_prefetch::AccessController`] instead (sequential and semantic predictors,
//!   prefetch priority, backlog and outcome feedback; what `strata mount` uses by
//!   default, and what `strata bench replay` measures).
//!
//! Daemon entry point (kept as the issue asked; `strata serve` mounts several prefixes
//! of one store on one cache core with it):
//!
//! ```ignore
//! pub fn spawn(reader: ObjectReader, prefix: &str, mountpoint: &Path, opts: MountOptions)
//!     -> Result<MountHandle>;
//! impl MountHandle { pub fn unmount(self) -> Result<()>; pub fn is_finished(&self) -> bool; }
//! ```

pub mod error;
pub mod filesystem;
pub mod fuse;
pub mod job;
mod log_limit;
pub mod mount;
pub mod null;
pub mod passthrough;
pub mod readahead;

pub use crate::error::{Error, Result};
pub use crate::filesystem::{
    CoreOptions, FsCore, PassthroughOptions, Predictors, WriteOptions, METADATA_TTL_INDEFINITE,
};
pub use crate::job::{JobResolver, JobScope};
pub use crate::mount::{spawn, MountHandle, MountOptions};
pub use crate::passthrough::PassthroughStore;
