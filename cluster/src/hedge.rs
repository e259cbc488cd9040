//! The peer read path's decisions, free of I/O and clocks (issue 16): which node to ask
//! for a block, how long to wait for it before also asking the store, when to stop
//! asking a peer that just failed, and whether to keep a copy of a remote block. The
//! daemon's reader does the I/O around them.

use std::collections::HashMap;
use std::time::Duration;

pub use strata_types::LatencyWindow;

use crate::membership::NodeId;
use crate::placement::Placement;

/// Where a missed block comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// This node owns the block (or there is no group to ask): the store.
    Store,
    /// Another member owns it: ask it first.
    Peer(NodeId),
}

/// The route of the block whose placement key is `key`: its owner unless that is us.
pub fn route(placement: &Placement, me: &NodeId, key: &[u8]) -> Route {
    match placement.owner(key) {
        Some(owner) if owner != *me => Route::Peer(owner),
        _ => Route::Store,
    }
}

/// How long to wait for a peer before hedging with the store.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HedgePolicy {
    /// The delay until a peer has `min_samples` measured answers. 50 ms: well above a
    /// 1 MiB block over a LAN or loopback (~1-10 ms), below an object store's tail.
    pub initial: Duration,
    /// Bounds of the measured p99. At least 2 ms: below it a hedge mostly doubles store
    /// traffic for a microsecond-scale jitter. At most 1 s: a peer that slow is better
    /// raced early.
    pub floor: Duration,
    pub ceiling: Duration,
    /// Answers needed before the p99 is trusted. 20: the 99th percentile of fewer is
    /// just the maximum of a handful.
    pub min_samples: usize,
}

impl Default for HedgePolicy {
    fn default() -> Self {
        HedgePolicy {
            initial: Duration::from_millis(50),
            floor: Duration::from_millis(2),
            ceiling: Duration::from_secs(1),
            min_samples: 20,
        }
    }
}

impl HedgePolicy {
    /// The defaults with a shortest wait of `floor` (the initial wait and the ceiling
    /// raised to it if below).
    pub fn with_floor(floor: Duration) -> HedgePolicy {
        let d = HedgePolicy::default();
        HedgePolicy {
            floor,
            initial: d.initial.max(floor),
            ceiling: d.ceiling.max(floor),
            ..d
        }
    }

    /// The hedge delay for a peer whose recent answers are `window`.
    pub fn delay(&self, window: &LatencyWindow) -> Duration {
        if window.len() < self.min_samples {
            return self.initial;
        }
        window
            .quantile(0.99)
            .unwrap_or(self.initial)
            .clamp(self.floor, self.ceiling)
    }
}

/// A cap on hedges: each peer request earns `fraction` of a hedge (up to `burst`
/// saved), each hedge spends one. A hedge past an owner that is itself fetching the
/// block from the store is a second GET of the same bytes; the budget keeps those at
/// about `fraction` of the peer requests (as "The Tail at Scale" bounds hedged
/// requests), while a peer that is really stuck is still raced after
/// [`HedgeBudget::hard_wait`].
#[derive(Clone, Debug)]
pub struct HedgeBudget {
    /// 0.02: at most ~2 % more store requests than the group needs.
    pub fraction: f64,
    /// 4 hedges saved at most: a burst of slow answers gets a few races, not many.
    pub burst: f64,
    tokens: f64,
}

impl Default for HedgeBudget {
    fn default() -> Self {
        HedgeBudget {
            fraction: 0.02,
            burst: 4.0,
            // One to start with: the first slow answer may be raced.
            tokens: 1.0,
        }
    }
}

impl HedgeBudget {
    /// A peer request was sent.
    pub fn on_request(&mut self) {
        self.tokens = (self.tokens + self.fraction).min(self.burst);
    }

    /// Whether a hedge may start now (spends one if so).
    pub fn try_hedge(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long a read waits for its owner before racing the store even without
    /// budget: 4 x the hedge delay, at least the policy's ceiling (a stuck peer costs
    /// at most this, never an error).
    pub fn hard_wait(delay: Duration, policy: &HedgePolicy) -> Duration {
        (delay * 4).max(policy.ceiling)
    }
}

/// Peers that just failed are skipped for a while (reads go straight to the store)
/// instead of each read paying a failed dial until the membership drops them. The
/// pause doubles on consecutive failures and resets on a success.
#[derive(Clone, Debug)]
pub struct PeerBackoff {
    /// First pause after a failure. 200 ms: a restarting peer is retried soon.
    pub min: Duration,
    /// Longest pause. 5 s: within a lease TTL a crashed peer leaves the group anyway.
    pub max: Duration,
    state: HashMap<NodeId, (u32, u64)>,
}

impl Default for PeerBackoff {
    fn default() -> Self {
        PeerBackoff {
            min: Duration::from_millis(200),
            max: Duration::from_secs(5),
            state: HashMap::new(),
        }
    }
}

impl PeerBackoff {
    /// Whether `peer` may be asked at `now_ns`.
    pub fn available(&self, peer: &NodeId, now_ns: u64) -> bool {
        self.state
            .get(peer)
            .is_none_or(|&(_, until)| now_ns >= until)
    }

    /// `peer` failed at `now_ns`: pause it.
    pub fn failed(&mut self, peer: &NodeId, now_ns: u64) {
        let e = self.state.entry(peer.clone()).or_insert((0, 0));
        let pause = self.min.saturating_mul(1u32 << e.0.min(16)).min(self.max);
        e.0 = e.0.saturating_add(1);
        e.1 = now_ns.saturating_add(pause.as_nanos() as u64);
    }

    /// `peer` answered: ask it again freely.
    pub fn succeeded(&mut self, peer: &NodeId) {
        self.state.remove(peer);
    }
}

/// Whether a block read from its owner is kept in this node's tiers: on its `after`-th
/// fetch from the owner (0: never). Never by default: a block lives only on its owner,
/// so the group's capacity adds up (a dataset read every epoch would otherwise be
/// copied to every reader by its second epoch); an operator whose hot set is small and
/// latency-bound sets `[cluster] keep_remote_after = 2`, and the copies then compete in
/// the tiers under the pattern-aware policy like any block. The counts are bounded:
/// when full they are cleared (forgetting old touches, never admitting early).
#[derive(Clone, Debug)]
pub struct RemoteAdmission {
    after: u32,
    counts: HashMap<u64, u32>,
    cap: usize,
}

impl RemoteAdmission {
    /// 65,536 keys (~1 MiB of counts): a minute of misses at 1 GB/s of 1 MiB blocks.
    pub const DEFAULT_CAP: usize = 1 << 16;

    pub fn new(after: u32, cap: usize) -> Self {
        RemoteAdmission {
            after,
            counts: HashMap::new(),
            cap: cap.max(1),
        }
    }

    /// A block (by its key's hash) was fetched from its owner: keep a copy?
    pub fn admit(&mut self, key_hash: u64) -> bool {
        if self.after == 0 {
            return false;
        }
        if !self.counts.contains_key(&key_hash) && self.counts.len() >= self.cap {
            self.counts.clear();
        }
        let c = self.counts.entry(key_hash).or_insert(0);
        *c += 1;
        if *c >= self.after {
            self.counts.remove(&key_hash);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(n: usize) -> Vec<NodeId> {
        (0..n).map(|i| NodeId::new(format!("node-{i}"))).collect()
    }

    proptest! {
        /// Every node routes a key to the same owner, and only its owner reads it from
        /// the store: exactly one node of the group fetches each block.
        #[test]
        fn exactly_one_member_reads_each_key_from_the_store(n in 1usize..8, key in any::<u64>()) {
            let p = Placement::new(ids(n).into_iter().map(|id| (id, 1.0)));
            let routes: Vec<Route> = ids(n).iter().map(|me| route(&p, me, &key.to_le_bytes())).collect();
            let from_store = routes.iter().filter(|r| **r == Route::Store).count();
            prop_assert_eq!(from_store, 1);
            let owner = p.owner(&key.to_le_bytes()).expect("owner");
            for (me, r) in ids(n).iter().zip(&routes) {
                if *me != owner {
                    prop_assert_eq!(r, &Route::Peer(owner.clone()));
                }
            }
        }

        /// The hedge delay stays within its bounds, whatever the samples.
        #[test]
        fn the_hedge_delay_is_bounded(samples in proptest::collection::vec(0u64..5_000_000_000, 0..300)) {
            let pol = HedgePolicy::default();
            let mut w = LatencyWindow::default();
            for s in &samples {
                w.observe(Duration::from_nanos(*s));
            }
            let d = pol.delay(&w);
            if samples.len() < pol.min_samples {
                prop_assert_eq!(d, pol.initial);
            } else {
                prop_assert!(d >= pol.floor && d <= pol.ceiling, "{d:?}");
            }
        }

        /// The p99 is at least 99 % of the window's samples.
        #[test]
        fn the_p99_bounds_99_percent_of_the_window(samples in proptest::collection::vec(1u64..1_000_000, 1..400)) {
            let mut w = LatencyWindow::new(256);
            for s in &samples {
                w.observe(Duration::from_micros(*s));
            }
            let p99 = w.quantile(0.99).expect("samples");
            let kept = &samples[samples.len().saturating_sub(256)..];
            let below = kept.iter().filter(|s| Duration::from_micros(**s) <= p99).count();
            prop_assert!(below as f64 >= 0.99 * kept.len() as f64);
        }
    }

    /// A group without members, or a key this node owns: the store.
    #[test]
    fn no_group_or_own_key_reads_the_store() {
        let me = NodeId::new("a");
        assert_eq!(route(&Placement::default(), &me, b"k"), Route::Store);
        let alone = Placement::new([(me.clone(), 1.0)]);
        assert_eq!(route(&alone, &me, b"k"), Route::Store);
    }

    /// A slow tail moves the hedge up; a fast peer's hedge is its p99, not the default.
    #[test]
    fn the_hedge_follows_the_measured_p99() {
        let pol = HedgePolicy::default();
        let mut w = LatencyWindow::default();
        for _ in 0..99 {
            w.observe(Duration::from_millis(4));
        }
        assert_eq!(pol.delay(&w), Duration::from_millis(4));
        for _ in 0..10 {
            w.observe(Duration::from_millis(300));
        }
        assert_eq!(pol.delay(&w), Duration::from_millis(300));
        for _ in 0..300 {
            w.observe(Duration::from_micros(100));
        }
        assert_eq!(
            pol.delay(&w),
            pol.floor,
            "old samples age out; the floor holds"
        );
    }

    #[test]
    fn hedges_are_capped_to_a_fraction_of_the_requests() {
        let mut b = HedgeBudget::default();
        assert!(b.try_hedge(), "the first slow answer may be raced");
        assert!(!b.try_hedge());
        let mut hedges = 0;
        for _ in 0..1000 {
            b.on_request();
            if b.try_hedge() {
                hedges += 1;
            }
        }
        assert!(
            (19..=20).contains(&hedges),
            "{hedges} hedges per 1000 requests"
        );
        let pol = HedgePolicy::default();
        assert_eq!(
            HedgeBudget::hard_wait(Duration::from_millis(5), &pol),
            pol.ceiling
        );
        assert_eq!(
            HedgeBudget::hard_wait(Duration::from_secs(1), &pol),
            Duration::from_secs(4)
        );
    }

    #[test]
    fn a_failed_peer_pauses_with_doubling_backoff_until_it_answers() {
        let mut b = PeerBackoff::default();
        let p = NodeId::new("b");
        let ms = 1_000_000u64;
        assert!(b.available(&p, 0));
        b.failed(&p, 0);
        assert!(!b.available(&p, 199 * ms));
        assert!(b.available(&p, 200 * ms));
        b.failed(&p, 200 * ms);
        assert!(!b.available(&p, 599 * ms), "second failure: 400 ms");
        assert!(b.available(&p, 600 * ms));
        for i in 0..20 {
            b.failed(&p, i * ms);
        }
        assert!(b.available(&p, 19 * ms + 5_000 * ms), "capped at 5 s");
        b.succeeded(&p);
        assert!(b.available(&p, 0));
    }

    #[test]
    fn a_remote_block_is_kept_on_its_nth_fetch_or_never() {
        let mut never = RemoteAdmission::new(0, 4);
        assert!((0..10).all(|_| !never.admit(1)), "0: never kept");
        let mut d = RemoteAdmission::new(2, 4);
        assert!(!d.admit(1));
        assert!(!d.admit(2));
        assert!(d.admit(1), "second fetch of 1 keeps it");
        assert!(!d.admit(1), "kept: the next fetch starts over");
        for k in 10..14 {
            assert!(!d.admit(k));
        }
        // The counts were full and cleared: 2's first touch is forgotten, never a
        // wrong yes.
        assert!(!d.admit(2));
    }
}
