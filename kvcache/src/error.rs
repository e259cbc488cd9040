//! The KV service's error type and its one mapping to `tonic::Status`.
//!
//! Handlers return `Result<_, KvError>`; the conversion to a gRPC status happens in one
//! place ([`From<KvError> for tonic::Status`]), so every bad input gets the same code
//! everywhere: malformed requests, oversized and truncated blocks are
//! `INVALID_ARGUMENT`, an unknown namespace or a missing block `NOT_FOUND`, a cache that
//! cannot make room or a full in-flight budget `RESOURCE_EXHAUSTED`, a stream idle past
//! the idle timeout `DEADLINE_EXCEEDED`, a bad token `UNAUTHENTICATED`, a tenant's
//! namespace outside its patterns `PERMISSION_DENIED`, a tenant past its quota
//! `RESOURCE_EXHAUSTED`, a model identity other than the namespace's
//! `FAILED_PRECONDITION`, a Put a Remove of its key overlapped `ABORTED`.

use strata_cache_core::CacheError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The namespace is not registered with the server.
    #[error("unknown namespace {0:?}")]
    UnknownNamespace(String),
    /// A malformed request (empty or oversized hash, bad namespace, missing header...).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A block smaller than the server's minimum.
    #[error(
        "block of {size} bytes is below the server's minimum of {min} bytes \
         (pack smaller KV blocks together)"
    )]
    TooSmall { size: u64, min: u64 },
    /// A block larger than the server's limit.
    #[error("block of {size} bytes exceeds the server's limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    /// A put stream that ended before its declared size.
    #[error("put stream ended after {got} of {declared} declared bytes; nothing stored")]
    Truncated { got: u64, declared: u64 },
    /// A stream the client stopped sending (Put) or reading (Get) for the idle timeout;
    /// it was aborted and released what it held.
    #[error("{what} stream idle for more than {idle:?}: aborted, nothing kept")]
    Idle {
        what: &'static str,
        idle: std::time::Duration,
    },
    /// The server cannot take the request now (a shared budget stayed full); retry.
    #[error("server busy: {0}")]
    Busy(String),
    /// The server is shutting down.
    #[error("server shutting down")]
    ShuttingDown,
    /// This node is kept out of its group (another live daemon holds its node id):
    /// what it stored no member could read (black-box finding: 30 of 30 puts
    /// acknowledged, none readable through the group).
    #[error("this node is not a member of its group: {0}")]
    NotMember(String),
    /// A tenant named a namespace its patterns do not allow. The answer depends only on
    /// the tenant's own patterns, so it reveals nothing about what others stored.
    #[error("namespace {namespace:?} is not one of tenant {tenant:?}'s namespaces")]
    Denied { tenant: String, namespace: String },
    /// A put would take the tenant past its byte quota.
    #[error(
        "tenant {tenant:?} is over its quota: {used} of {quota} bytes used, a block of \
         {size} bytes does not fit (remove blocks, or raise the quota)"
    )]
    Quota {
        tenant: String,
        used: u64,
        size: u64,
        quota: u64,
    },
    /// The call's model identity differs from the one its namespace is bound to
    /// (`identity.rs`): blocks of one model are never served to, or mixed with, another.
    #[error(
        "namespace {namespace:?} holds KV of model identity {bound}..., this client \
         sends {got}... (another revision, RoPE scaling, KV dtype, layout or LoRA?): use \
         a namespace per model"
    )]
    IdentityMismatch {
        namespace: String,
        bound: String,
        got: String,
    },
    /// A Remove of the key came while this Put's block was arriving: the Put is
    /// ordered before it, so nothing is stored (the Remove did not count it, and an
    /// acknowledged Put must not vanish behind a Remove that answered 0).
    #[error("a Remove of this key overlapped the Put: nothing stored; put again to store it")]
    RemovedMeanwhile,
    /// The binding of the Put's namespace to its model identity could not be saved
    /// (the cache disk failed or is full): nothing is stored, since the block would
    /// outlive the binding that guards it across a restart.
    #[error("the namespace's binding to its model identity could not be saved ({0}): nothing stored; retry once the cache disk recovers")]
    BindingNotSaved(String),
    /// The block is not cached.
    #[error("block not found")]
    NotFound,
    /// The cache core failed.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// Client side: the server answered with an error status.
    #[error("server error: {}: {}", .0.code(), .0.message())]
    Status(#[from] Status),
    /// Client side: connecting failed.
    #[error("transport error: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Client side: a bad address or option.
    #[error("client configuration: {0}")]
    Config(String),
}

impl KvError {
    /// The gRPC code this error is answered with.
    pub fn code(&self) -> Code {
        match self {
            KvError::UnknownNamespace(_) | KvError::NotFound => Code::NotFound,
            KvError::Invalid(_)
            | KvError::TooSmall { .. }
            | KvError::TooLarge { .. }
            | KvError::Truncated { .. } => Code::InvalidArgument,
            KvError::Cache(e) => match e {
                // A refusal of this put, not the daemon down: a connector that paused
                // every call on UNAVAILABLE would give up its Gets, which still work.
                CacheError::Full(_) | CacheError::Degraded(_) => Code::ResourceExhausted,
                // Out of descriptors, threads or memory: the daemon's limits, worth a
                // retry once its load drops (not an internal fault).
                e if e.is_resource_shortage() => Code::ResourceExhausted,
                CacheError::TooLarge { .. } => Code::ResourceExhausted,
                CacheError::InvalidArgument(_) | CacheError::NameTooLong(_) => {
                    Code::InvalidArgument
                }
                CacheError::NotFound(_) => Code::NotFound,
                CacheError::PermissionDenied(_) => Code::PermissionDenied,
                CacheError::StoreTimeout { .. } => Code::DeadlineExceeded,
                CacheError::Store { .. } | CacheError::SharedFetch(_) => Code::Unavailable,
                CacheError::Corrupt(_) => Code::DataLoss,
                _ => Code::Internal,
            },
            KvError::Idle { .. } => Code::DeadlineExceeded,
            KvError::Busy(_) | KvError::Quota { .. } => Code::ResourceExhausted,
            KvError::Denied { .. } => Code::PermissionDenied,
            KvError::RemovedMeanwhile => Code::Aborted,
            KvError::IdentityMismatch { .. } => Code::FailedPrecondition,
            KvError::ShuttingDown | KvError::NotMember(_) | KvError::BindingNotSaved(_) => {
                Code::Unavailable
            }
            KvError::Status(s) => s.code(),
            KvError::Transport(_) => Code::Unavailable,
            KvError::Config(_) => Code::InvalidArgument,
        }
    }
}

impl From<KvError> for Status {
    fn from(e: KvError) -> Status {
        match e {
            KvError::Status(s) => s,
            other => Status::new(other.code(), other.to_string()),
        }
    }
}

pub type Result<T, E = KvError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_documented_mapping() {
        let emfile = CacheError::Io(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(KvError::Cache(emfile).code(), Code::ResourceExhausted);
        let full: Status = KvError::Cache(CacheError::Full("x".into())).into();
        assert_eq!(full.code(), Code::ResourceExhausted);
        let trunc: Status = KvError::Truncated {
            got: 3,
            declared: 9,
        }
        .into();
        assert_eq!(trunc.code(), Code::InvalidArgument);
        assert!(trunc.message().contains("3 of 9"));
        let ns: Status = KvError::UnknownNamespace("m/t".into()).into();
        assert_eq!(ns.code(), Code::NotFound);
        assert!(ns.message().contains("m/t"));
    }
}
