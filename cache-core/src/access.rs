//! What the cache knows about an access beyond its key: who made it and when. Front doors
//! fill it in; the access-stream tree and the policies read it.

/// Defined in `strata-types` (the pure-logic crates share it without linking the core).
pub use strata_types::JobId;

/// Context handed with every access to the engine, the stream tree and the policies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessContext {
    pub job: JobId,
    /// Monotonic time in nanoseconds (wall clock in the daemon, simulated time in replay).
    pub now_ns: u64,
    /// True when the access is a prefetch, not a demand read.
    pub prefetch: bool,
}

impl AccessContext {
    pub fn demand(job: JobId, now_ns: u64) -> Self {
        AccessContext {
            job,
            now_ns,
            prefetch: false,
        }
    }

    pub fn prefetch(job: JobId, now_ns: u64) -> Self {
        AccessContext {
            job,
            now_ns,
            prefetch: true,
        }
    }
}
