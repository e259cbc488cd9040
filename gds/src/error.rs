//! The GPU tier's error type, mapped once into [`CacheError`] at the tier boundary.

use std::io;

use strata_cache_core::CacheError;

#[derive(Debug, thiserror::Error)]
pub enum GdsError {
    /// Device memory (or the configured device budget) cannot hold the allocation.
    #[error("device out of memory: {requested} bytes requested, {available} of {limit} available")]
    OutOfMemory {
        requested: u64,
        available: u64,
        limit: u64,
    },
    /// The device stopped answering (Xid error, reset, or an injected fault); every
    /// buffer on it is gone and every later call fails.
    #[error("device lost: {0}")]
    DeviceLost(String),
    /// A file ended (or a reader stopped) before the requested range was read.
    #[error("short read at file offset {offset}: wanted {expected} bytes, got {got}")]
    ShortRead {
        offset: u64,
        expected: u64,
        got: u64,
    },
    /// Offsets or lengths outside a buffer, or misaligned where alignment is required.
    #[error("invalid range: {0}")]
    InvalidRange(String),
    /// The requested backend is not present on this machine (no libcuda, no GPU, no
    /// libcufile); callers fall back to the emulated device or the compat path.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A CUDA driver or cuFile call failed.
    #[error("cuda: {0}")]
    Cuda(String),
    /// Bytes read back from the device failed their checksum.
    #[error("corrupt device data: {0}")]
    Corrupt(String),
    /// Exporting or opening an IPC handle failed.
    #[error("ipc: {0}")]
    Ipc(String),
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
}

impl GdsError {
    pub fn is_device_lost(&self) -> bool {
        matches!(self, GdsError::DeviceLost(_))
    }
}

impl From<GdsError> for CacheError {
    fn from(e: GdsError) -> Self {
        match e {
            GdsError::OutOfMemory { .. } => CacheError::Full(e.to_string()),
            GdsError::Io(io) => CacheError::Io(io),
            GdsError::Corrupt(m) => CacheError::Corrupt(m),
            GdsError::InvalidRange(m) => CacheError::InvalidArgument(m),
            other => CacheError::Device(other.to_string()),
        }
    }
}

pub type Result<T, E = GdsError> = std::result::Result<T, E>;
