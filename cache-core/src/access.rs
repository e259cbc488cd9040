//! What the cache knows about an access beyond its key: who made it, when, why, and what
//! the engine's access tracker saw. Front doors fill in the first three; the engine fills
//! in the observation before any policy sees the access.

use crate::stream::Observation;

/// Defined in `strata-types` (the pure-logic crates share it without linking the core).
pub use strata_types::JobId;

/// Why a block is being read or placed. Only `Demand` is observed by the access
/// tracker: a prefetch, a promotion or a demotion is the cache moving data, not the job
/// reading it, and must not teach the classifier anything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AccessKind {
    /// A read the job is waiting for (or a put it made).
    #[default]
    Demand,
    /// A fill ahead of demand, decided by the prefetch controller.
    Prefetch,
    /// A copy of a lower level's hit into a faster level.
    Promotion,
    /// A victim of a faster level moved down.
    Demotion,
}

/// Context handed with every access to the engine, the tracker and the policies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessContext {
    pub job: JobId,
    /// Monotonic time in nanoseconds (wall clock in the daemon, simulated time in replay).
    pub now_ns: u64,
    pub kind: AccessKind,
    /// The patterns of the access's streams, as the engine's tracker classified them when
    /// the access arrived (all `Unknown` for anything but a demand access, and until the
    /// engine has observed it). Policies read it; they never classify on their own.
    pub obs: Observation,
    /// Bytes the read this access is part of asks for (0: not a read, or not known).
    /// The tracker learns from it which streams read in small pieces (see
    /// [`Observation::small_reads`]).
    pub read_len: u64,
    /// Where in the file the read this access is part of starts (`None`: not a file
    /// read, or not known). The tracker learns from it how far a stream reads on
    /// after each jump (see [`Observation::run_ahead`]).
    pub read_offset: Option<u64>,
}

impl AccessContext {
    pub fn demand(job: JobId, now_ns: u64) -> Self {
        AccessContext {
            job,
            now_ns,
            ..Default::default()
        }
    }

    pub fn prefetch(job: JobId, now_ns: u64) -> Self {
        AccessContext {
            job,
            now_ns,
            kind: AccessKind::Prefetch,
            ..Default::default()
        }
    }

    /// The same job and time, for data the cache moves on its own (`kind` must not be
    /// `Demand`); carries no observation.
    pub fn moved(&self, kind: AccessKind) -> Self {
        AccessContext {
            job: self.job,
            now_ns: self.now_ns,
            kind,
            obs: Observation::default(),
            read_len: 0,
            read_offset: None,
        }
    }

    /// This context for an access that is part of a read of `len` bytes.
    pub fn with_read_len(mut self, len: u64) -> Self {
        self.read_len = len;
        self
    }

    /// This context for an access that is part of a read of `len` bytes at `offset` of
    /// a file.
    pub fn with_read(mut self, offset: u64, len: u64) -> Self {
        self.read_len = len;
        self.read_offset = Some(offset);
        self
    }

    /// A read the job waits for (the only kind the tracker observes).
    pub fn is_demand(&self) -> bool {
        self.kind == AccessKind::Demand
    }

    pub fn is_prefetch(&self) -> bool {
        self.kind == AccessKind::Prefetch
    }
}
