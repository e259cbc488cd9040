//! What the cache knows about an access beyond its key: who made it and when. Front doors
//! fill it in; the access-stream tree and the policies read it.

/// Identifies the job making an access: a reading process or open handle at the FUSE
/// mount, a client connection or namespace at the KV service, a trace's job column in
/// replay. Streams of different jobs are never merged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

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
