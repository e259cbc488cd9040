//! The file system's error type, mapped to an errno exactly once, at the FUSE edge
//! ([`Error::errno`]). The core returns these; the adapter never invents errnos.

use strata_cache_core::CacheError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such file or directory (in the store, or in a cached listing).
    #[error("no such entry: {0}")]
    NotFound(String),
    #[error("not a directory: {0}")]
    NotDir(String),
    #[error("is a directory: {0}")]
    IsDir(String),
    /// The mount is read-only: any write, create, rename or delete.
    #[error("read-only file system")]
    ReadOnly,
    /// An inode or handle number the kernel sent that this mount never issued (or
    /// already released).
    #[error("unknown {what} {id}")]
    BadHandle { what: &'static str, id: u64 },
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A write the mount's options do not allow (replacing or deleting an object
    /// without `--allow-overwrite` / `--allow-delete`).
    #[error("not permitted: {0}")]
    NotPermitted(String),
    /// What object storage cannot do (rename, changing part of an existing object).
    #[error("not supported on object storage: {0}")]
    Unsupported(String),
    /// A file larger than the mount can upload as it was written (EFBIG).
    #[error("file too large: {0}")]
    FileTooLarge(String),
    /// The name exists (create without overwrite).
    #[error("already exists: {0}")]
    Exists(String),
    /// The object is being written through another handle.
    #[error("busy: {0} is being written")]
    Busy(String),
    /// A local file operation failed (a staging file: a full disk gives ENOSPC).
    #[error("{what}: {source}")]
    Local {
        what: String,
        source: std::io::Error,
    },
    /// Mounting or unmounting failed.
    #[error("{what} {path}: {source}")]
    Mount {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    /// An upload that several callers waited on failed (each gets its error).
    #[error("upload failed: {0}")]
    Upload(std::sync::Arc<Error>),
    /// The cache core or the store failed.
    #[error(transparent)]
    Cache(#[from] CacheError),
}

impl Error {
    /// The errno the kernel gets for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound(_) => libc::ENOENT,
            Error::NotDir(_) => libc::ENOTDIR,
            Error::IsDir(_) => libc::EISDIR,
            Error::ReadOnly => libc::EROFS,
            Error::BadHandle { .. } => libc::EBADF,
            Error::Invalid(_) => libc::EINVAL,
            Error::NotPermitted(_) => libc::EPERM,
            Error::Unsupported(_) => libc::ENOTSUP,
            Error::FileTooLarge(_) => libc::EFBIG,
            Error::Exists(_) => libc::EEXIST,
            Error::Busy(_) => libc::EBUSY,
            Error::Local { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Upload(inner) => inner.errno(),
            Error::Mount { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Cache(e) => match e {
                CacheError::NotFound(_) => libc::ENOENT,
                // The object changed under an open file: its handle names a version
                // that no longer exists. ESTALE tells the reader to reopen, which then
                // snapshots the new version; it never sees a mix of the two.
                CacheError::Changed(_) => libc::ESTALE,
                CacheError::InvalidArgument(_) => libc::EINVAL,
                CacheError::NameTooLong(_) => libc::ENAMETOOLONG,
                CacheError::PermissionDenied(_) => libc::EACCES,
                CacheError::TooLarge { .. } => libc::EFBIG,
                // Another writer created the object a new file was to create.
                CacheError::Exists(_) => libc::EEXIST,
                // Store down, 5xx after retries, timeouts, local I/O, corruption: EIO.
                _ => libc::EIO,
            },
        }
    }

    /// Whether this is an expected outcome (ENOENT on a lookup) rather than a failure
    /// worth a warning in the log.
    pub fn is_expected(&self) -> bool {
        matches!(
            self,
            Error::NotFound(_)
                | Error::Cache(CacheError::NotFound(_))
                | Error::ReadOnly
                | Error::Exists(_)
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
