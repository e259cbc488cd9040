//! The cache core's error type. Front doors map it once at their edge (errno at FUSE,
//! `tonic::Status` at gRPC).

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The item is not in the cache, nor in the backing store.
    #[error("not found: {0}")]
    NotFound(String),
    /// Stored bytes failed their checksum or header check; they are dropped, not served.
    #[error("corrupt cache data: {0}")]
    Corrupt(String),
    /// A value larger than the tier (or the configured limit) can ever hold.
    #[error("value of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    /// No tier could make room (everything pinned, or admission refused).
    #[error("cache full: {0}")]
    Full(String),
    /// A persistent level is skipped for a while after a device error (a full or
    /// failing disk; `engine` module docs): the message names the tier, the error and
    /// when writes to it resume. Not "full": the daemon's room is not the matter.
    #[error("{0}")]
    Degraded(String),
    /// Bad argument from a caller (bad URL, bad key, bad range).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The backing store failed after bounded retries.
    #[error("object store error after {attempts} attempt(s): {message}")]
    Store { attempts: u32, message: String },
    /// The backing store did not answer within the configured time.
    #[error("object store timed out after {attempts} attempt(s)")]
    StoreTimeout { attempts: u32 },
    /// Local I/O (disk tier, index).
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The persistent index failed.
    #[error("index error: {0}")]
    Index(String),
    /// The concurrent fetch this caller waited on failed (single-flight).
    #[error("shared fetch failed: {0}")]
    SharedFetch(String),
    /// An object was created under the name meanwhile, and the write was to create
    /// it, not replace it.
    #[error("already exists: {0}")]
    Exists(String),
    /// The object changed while being read (its version no longer matches).
    #[error("object changed: {0}")]
    Changed(String),
    /// The device tier failed (GPU or emulated).
    #[error("device error: {0}")]
    Device(String),
    /// A prefetch was cancelled before it sent its request (its stream changed
    /// course); a demand read that joined it fetches the block itself.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// A local directory store's path to the object is `PATH_MAX` bytes or longer: no
    /// system call can name it, so it can be neither listed nor read.
    #[error("path too long for the local file system: {0}")]
    NameTooLong(String),
    /// The store refused access to the object or folder (an HTTP 401/403, a local
    /// file the daemon may not read): permanent, so not retried.
    #[error("permission denied by the store: {0}")]
    PermissionDenied(String),
}

impl CacheError {
    /// A copy of this error for each caller that shared one failed fetch (io::Error is
    /// not `Clone`, so it is rebuilt from its kind and message).
    pub fn duplicate(&self) -> CacheError {
        match self {
            CacheError::NotFound(s) => CacheError::NotFound(s.clone()),
            CacheError::Corrupt(s) => CacheError::Corrupt(s.clone()),
            CacheError::TooLarge { size, limit } => CacheError::TooLarge {
                size: *size,
                limit: *limit,
            },
            CacheError::Full(s) => CacheError::Full(s.clone()),
            CacheError::Degraded(s) => CacheError::Degraded(s.clone()),
            CacheError::InvalidArgument(s) => CacheError::InvalidArgument(s.clone()),
            CacheError::Store { attempts, message } => CacheError::Store {
                attempts: *attempts,
                message: message.clone(),
            },
            CacheError::StoreTimeout { attempts } => CacheError::StoreTimeout {
                attempts: *attempts,
            },
            // An OS error stays one, so its errno can still be told apart.
            CacheError::Io(e) => CacheError::Io(match e.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(e.kind(), e.to_string()),
            }),
            CacheError::Index(s) => CacheError::Index(s.clone()),
            CacheError::SharedFetch(s) => CacheError::SharedFetch(s.clone()),
            CacheError::Device(s) => CacheError::Device(s.clone()),
            CacheError::Changed(s) => CacheError::Changed(s.clone()),
            CacheError::Exists(s) => CacheError::Exists(s.clone()),
            CacheError::Cancelled(s) => CacheError::Cancelled(s.clone()),
            CacheError::NameTooLong(s) => CacheError::NameTooLong(s.clone()),
            CacheError::PermissionDenied(s) => CacheError::PermissionDenied(s.clone()),
        }
    }

    /// True for an I/O error that is a shortage of this process's resources, not a fault
    /// of the device: out of descriptors (`EMFILE`, `ENFILE`), of memory (`ENOMEM`), of
    /// threads (`EAGAIN` from a thread spawn; `ECANCELED` when io_uring's worker pool
    /// could not start one). It fails the attempt; a retry once the load drops succeeds.
    pub fn is_resource_shortage(&self) -> bool {
        let CacheError::Io(e) = self else {
            return false;
        };
        matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN | libc::ECANCELED)
        )
    }

    /// True when retrying later may succeed (timeouts, throttling, 5xx).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            CacheError::StoreTimeout { .. } | CacheError::Store { .. } | CacheError::SharedFetch(_)
        )
    }
}

pub type Result<T, E = CacheError> = std::result::Result<T, E>;
