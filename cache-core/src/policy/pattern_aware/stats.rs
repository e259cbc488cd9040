//! [`PatternAwareStats`]: counters describing the policy's decisions.

/// Counters describing the policy's decisions (for benchmarks and docs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PatternAwareStats {
    pub stable_share: f64,
    pub stable_bytes: u64,
    pub freq_bytes: u64,
    pub consumed_bytes: u64,
    pub ahead_bytes: u64,
    pub rebalances: u64,
    /// Current recency-window share of the frequency side.
    pub window_share: f64,
    pub window_bytes: u64,
    /// Demand misses that hit the window's / the main's ghost list.
    pub window_ghost_hits: u64,
    pub main_ghost_hits: u64,
    /// Bytes of recently read scan data kept before evict-behind applies (learnt).
    pub consumed_target: u64,
    /// Demand misses that hit the consumed pool's ghost list.
    pub consumed_ghost_hits: u64,
    /// Times an idle frequency side's space went to the stable subset.
    pub idle_releases: u64,
    /// Prefetched blocks evicted as stale (unread a whole idleness period later).
    pub stale_ahead_victims: u64,
    /// Victims taken from consumed / ahead / stable / freq main / window.
    pub victims: [u64; 5],
    /// Sequential re-reads within a capacity of a block the scan queue let go
    /// (`reload_ghost`).
    pub reload_ghost_hits: u64,
    /// Recency periods the guard began (`recency_guard`).
    pub recency_periods: u64,
    /// Frequency periods the frequency guard began (`frequency_guard`).
    pub frequency_periods: u64,
    /// Periods begun in which a job's items were spared, and the victims replaced
    /// (`spare_starved_jobs`).
    pub spared_periods: u64,
    /// Spared periods ended early because the other jobs paid for them
    /// (`spare_ends_when_costly`).
    pub costly_spares_ended: u64,
    pub spared_victims: u64,
}
