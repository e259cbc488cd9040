//! Telling a stall of the daemon from a slow peer.
//!
//! A timer measures monotonic time, which runs on while the process is stopped
//! (SIGSTOP, a frozen cgroup or `docker pause`, a paused VM, a swap storm). After such
//! a stall every timer that was running fires at once, and a deadline meant for a
//! store, a client or a peer that did not answer blames them for time the daemon
//! itself was not running (black-box findings: reads across a 40 s SIGSTOP of a mount
//! failed EIO "object store timed out" the instant it resumed, with no request sent
//! after; a KV put mid-transfer across a 15 s stop failed "idle"). A timer that fires
//! well past its deadline fired late: the waits that use one give the other side a
//! fresh chance instead of an error.

use std::time::Duration;

use tokio::time::Instant;

/// A timer that fires this much past its deadline fired late because the daemon was
/// stopped, not because the other side was slow: 1 s, far past a loaded runtime's
/// lateness (milliseconds).
pub const STALL: Duration = Duration::from_secs(1);

/// After such a stall a wait gets this long before it counts as expired: what the
/// other side sent meanwhile waits in the socket, and is read within milliseconds of
/// the resume.
pub const STALL_GRACE: Duration = Duration::from_secs(2);

/// How far past `deadline` it is at `now`, if that is a stall (see [`STALL`]).
pub fn stalled_by(deadline: Instant, now: Instant) -> Option<Duration> {
    Some(now.saturating_duration_since(deadline)).filter(|late| *late > STALL)
}

/// Whether a timer due at `deadline` that fired at `now` fired late (see [`STALL`]).
pub fn stalled(deadline: Instant, now: Instant) -> bool {
    stalled_by(deadline, now).is_some()
}
