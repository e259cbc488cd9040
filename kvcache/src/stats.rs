//! Counters of the KV service (per namespace, lock-free on the hot path) and the
//! load-time model behind `EstimateLoad`.
//!
//! Load model: loading a block of `b` bytes from tier `t` now is expected to take
//! `latency(t) + (b + inflight(t)) / bandwidth(t)`: the fixed cost of one Get, the
//! transfer, and the queue of bytes other Gets from that tier are still sending
//! (CALVO: loading is a cost the scheduler must count, and it grows with load).
//! `latency` and `bandwidth` start from the defaults below and follow an exponentially
//! weighted average of the Gets the service has completed: small blocks (< 64 KiB)
//! update the latency, large ones (>= 256 KiB) the bandwidth.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use strata_cache_core::TierKind;

/// Most namespaces tracked one by one (besides the registered ones, always tracked);
/// beyond, they are counted under [`OTHER_NS`] so a client inventing namespaces cannot
/// grow the server's memory, nor the metrics' label sets, without bound. 256: a
/// daemon serves a handful of models times a handful of tenants, and 256 namespaces are
/// ~1,500 Prometheus series, what one scrape comfortably carries.
///
/// Only a namespace that stored a block gets its own entry: Gets, misses and lookups
/// of a namespace never put to are counted under [`OTHER_NS`], so probing junk names
/// costs no entry at all, and filling the table takes real puts (of at least
/// `min_block` bytes each).
pub const MAX_TRACKED_NAMESPACES: usize = 256;
/// Bucket of the namespaces beyond [`MAX_TRACKED_NAMESPACES`].
pub const OTHER_NS: &str = "(other)";

/// A tracked namespace with no put or hit for this long gives its entry to the next
/// namespace that would be counted under [`OTHER_NS`], its counts folded there (the
/// totals stay whole): a long-lived daemon whose models and tenants change over days
/// shows the ones in use, not the first 256 it ever saw (a known item of the last
/// notes). 10 minutes: longer than any pause of a serving engine between requests, so
/// a namespace in use never loses its line to a burst of new ones.
pub const NS_IDLE_REPLACE: Duration = Duration::from_secs(600);

#[derive(Default)]
struct NsCounters {
    puts: AtomicU64,
    put_bytes: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    get_bytes: AtomicU64,
    /// Its last put or hit, in seconds of [`now_s`].
    last_active_s: AtomicU64,
}

impl NsCounters {
    fn active(&self) {
        self.last_active_s.store(now_s(), Ordering::Relaxed);
    }

    /// Adds `other`'s counts to this entry's.
    fn fold(&self, other: &NsCounters) {
        for (to, from) in [
            (&self.puts, &other.puts),
            (&self.put_bytes, &other.put_bytes),
            (&self.hits, &other.hits),
            (&self.misses, &other.misses),
            (&self.get_bytes, &other.get_bytes),
        ] {
            to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

/// Seconds since the first call (a monotonic clock for the entries' idleness).
fn now_s() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs()
}

/// Per-namespace figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NamespaceStats {
    pub namespace: String,
    pub puts: u64,
    pub put_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub get_bytes: u64,
    pub hit_ratio: f64,
}

/// A point-in-time copy of the service's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KvStatsSnapshot {
    /// Puts answered OK, those of a key already cached included: the blocks stored are
    /// `puts - puts_already_present`, what the namespaces' `puts` add up to.
    pub puts: u64,
    pub put_bytes: u64,
    /// Puts of a key already cached (idempotent, nothing written).
    pub puts_already_present: u64,
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    pub get_bytes: u64,
    pub hit_ratio: f64,
    pub lookups: u64,
    pub removes: u64,
    pub prefetch_issued: u64,
    /// Staged blocks read by a Get afterwards.
    pub prefetch_used: u64,
    /// Staged blocks that left the fastest tier unread.
    #[serde(default)]
    pub prefetch_wasted: u64,
    /// Blocks not staged because the staging backlog was full.
    #[serde(default)]
    pub prefetch_deferred: u64,
    /// Requests refused with an error status (bad input, full cache, auth).
    pub rejected: u64,
    /// Put or Get streams aborted because the client stopped sending or reading.
    #[serde(default)]
    pub idle_aborted: u64,
    /// Connections closed because a response stream stayed unread with its HTTP/2
    /// window shut for twice the idle timeout (`limits::IdleGuard`).
    #[serde(default)]
    pub idle_connections_closed: u64,
    /// Bytes the Put streams in flight hold in the put budget now.
    #[serde(default)]
    pub put_reserved_bytes: u64,
    /// Bytes of blocks the Get responses in flight hold in the get budget now.
    #[serde(default)]
    pub get_reserved_bytes: u64,
    pub namespaces: Vec<NamespaceStats>,
    /// The load model's current estimates per tier.
    pub load_model: Vec<TierLoadEstimate>,
    /// The cache group's view (issue 16): routed hits, replication, per-peer traffic.
    /// None: a single node.
    #[serde(default)]
    pub group: Option<crate::group::GroupKvStats>,
    /// The same-host arena and its device leases (`shm.rs`). None: no arena.
    #[serde(default)]
    pub shm: Option<crate::shm::ShmStats>,
    /// Per tenant (`[[kv.tenants]]`): bytes held, quota, blocks its quota evicted.
    #[serde(default)]
    pub tenants: Vec<TenantStats>,
}

/// One tenant's use of its quota.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantStats {
    pub tenant: String,
    pub used_bytes: u64,
    pub quota_bytes: u64,
    /// The tenant's blocks evicted to keep it within its quota, since start.
    pub quota_evictions: u64,
}

impl KvStatsSnapshot {
    /// The entry of namespace `name`, if it has one (the folded ones are under
    /// [`OTHER_NS`]).
    pub fn namespace(&self, name: &str) -> Option<&NamespaceStats> {
        self.namespaces.iter().find(|n| n.namespace == name)
    }
}

/// The load model's view of one tier.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TierLoadEstimate {
    pub tier: String,
    pub latency_us: f64,
    pub bandwidth_gbps: f64,
    pub inflight_bytes: u64,
}

fn ratio(h: u64, m: u64) -> f64 {
    if h + m == 0 {
        0.0
    } else {
        h as f64 / (h + m) as f64
    }
}

/// The service's counters.
#[derive(Default)]
pub struct KvStats {
    puts: AtomicU64,
    put_bytes: AtomicU64,
    puts_already_present: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    get_bytes: AtomicU64,
    lookups: AtomicU64,
    removes: AtomicU64,
    prefetch_issued: AtomicU64,
    rejected: AtomicU64,
    idle_aborted: AtomicU64,
    idle_connections_closed: AtomicU64,
    namespaces: RwLock<HashMap<Arc<str>, Arc<NsCounters>>>,
    /// Registered namespaces: tracked outside the cap, never replaced.
    pinned: std::collections::HashSet<Arc<str>>,
    /// [`NS_IDLE_REPLACE`] (None: the default; tests shorten it).
    idle_replace: Option<Duration>,
    /// When a full table was last searched for an idle entry ([`now_s`] + 1; 0:
    /// never): at most once a second, as each put of a namespace under
    /// [`OTHER_NS`] would otherwise scan the table.
    replace_scanned_s: AtomicU64,
    pub load: LoadModel,
}

impl KvStats {
    /// Counters with `pinned` namespaces tracked from the start, outside the cap.
    pub fn with_pinned(pinned: &[String]) -> Self {
        let map: HashMap<Arc<str>, Arc<NsCounters>> = pinned
            .iter()
            .map(|n| (Arc::from(n.as_str()), Arc::default()))
            .collect();
        KvStats {
            pinned: map.keys().cloned().collect(),
            namespaces: RwLock::new(map),
            ..Default::default()
        }
    }

    /// The entry of `ns`, made if there is room, or in the place of an entry idle for
    /// [`NS_IDLE_REPLACE`] (puts and hits only); marked active.
    fn ns_for_put(&self, ns: &str) -> Arc<NsCounters> {
        if let Some(c) = self.namespaces.read().get(ns) {
            c.active();
            return c.clone();
        }
        let mut map = self.namespaces.write();
        let other = usize::from(map.contains_key(OTHER_NS));
        let full = map.len() - other >= MAX_TRACKED_NAMESPACES + self.pinned.len();
        let name: Arc<str> = if full && !map.contains_key(ns) && !self.replace_idle(&mut map) {
            OTHER_NS.into()
        } else {
            ns.into()
        };
        let c = map.entry(name).or_default().clone();
        c.active();
        c
    }

    /// Frees the entry of the namespace idle longest, if one has been idle for
    /// [`NS_IDLE_REPLACE`], folding its counts into [`OTHER_NS`]; true if it did.
    fn replace_idle(&self, map: &mut HashMap<Arc<str>, Arc<NsCounters>>) -> bool {
        let idle_for = self.idle_replace.unwrap_or(NS_IDLE_REPLACE).as_secs();
        let now = now_s();
        let scanned = self.replace_scanned_s.load(Ordering::Relaxed);
        if idle_for > 0 && scanned != 0 && now < scanned {
            return false;
        }
        self.replace_scanned_s.store(now + 1, Ordering::Relaxed);
        let idlest = map
            .iter()
            .filter(|(name, _)| &***name != OTHER_NS && !self.pinned.contains(*name))
            .map(|(name, c)| (c.last_active_s.load(Ordering::Relaxed), name))
            .min();
        let Some((last, name)) = idlest else {
            return false;
        };
        if now.saturating_sub(last) < idle_for {
            return false;
        }
        let name = name.clone();
        if let Some(gone) = map.remove(&name) {
            map.entry(OTHER_NS.into()).or_default().fold(&gone);
        }
        true
    }

    /// The entry of `ns` if it has one, else the shared [`OTHER_NS`] entry.
    fn ns_existing(&self, ns: &str) -> Arc<NsCounters> {
        if let Some(c) = self.namespaces.read().get(ns) {
            return c.clone();
        }
        self.namespaces
            .write()
            .entry(OTHER_NS.into())
            .or_default()
            .clone()
    }

    pub fn put(&self, ns: &str, bytes: u64, already_present: bool) {
        self.puts.fetch_add(1, Ordering::Relaxed);
        if already_present {
            self.puts_already_present.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.put_bytes.fetch_add(bytes, Ordering::Relaxed);
        let c = self.ns_for_put(ns);
        c.puts.fetch_add(1, Ordering::Relaxed);
        c.put_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A Get of `key`: `Some(bytes)` on a hit. A hit proves the namespace holds a block,
    /// as a put does, so it gets an entry if there is room: one whose blocks were put
    /// before a restart is not folded into [`OTHER_NS`] (black-box finding: after a warm
    /// restart every hit of a model's namespace was reported as "(other)"). Misses never
    /// make one.
    pub fn get(&self, ns: &str, hit: Option<u64>) {
        let c = match hit {
            Some(_) => self.ns_for_put(ns),
            None => self.ns_existing(ns),
        };
        match hit {
            Some(bytes) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.get_bytes.fetch_add(bytes, Ordering::Relaxed);
                c.hits.fetch_add(1, Ordering::Relaxed);
                c.get_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                c.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Mean size of the blocks put in `ns` (None before the first put).
    pub fn mean_put_bytes(&self, ns: &str) -> Option<u64> {
        let map = self.namespaces.read();
        let c = map.get(ns)?;
        let n = c.puts.load(Ordering::Relaxed);
        (n > 0).then(|| c.put_bytes.load(Ordering::Relaxed) / n)
    }

    pub fn lookups(&self, n: u64) {
        self.lookups.fetch_add(n, Ordering::Relaxed);
    }
    pub fn removed(&self, n: u64) {
        self.removes.fetch_add(n, Ordering::Relaxed);
    }
    pub fn rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }
    pub fn idle_aborted(&self) {
        self.idle_aborted.fetch_add(1, Ordering::Relaxed);
    }
    pub fn idle_connections_closed(&self) {
        self.idle_connections_closed.fetch_add(1, Ordering::Relaxed);
    }
    /// A block staged into the fastest tier by Prefetch (its outcome is counted by the
    /// staging controller, [`crate::staging::Staging`]).
    pub fn prefetched(&self) {
        self.prefetch_issued.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> KvStatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut namespaces: Vec<NamespaceStats> = self
            .namespaces
            .read()
            .iter()
            .map(|(name, c)| NamespaceStats {
                namespace: name.to_string(),
                puts: l(&c.puts),
                put_bytes: l(&c.put_bytes),
                hits: l(&c.hits),
                misses: l(&c.misses),
                get_bytes: l(&c.get_bytes),
                hit_ratio: ratio(l(&c.hits), l(&c.misses)),
            })
            .collect();
        namespaces.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        let (hits, misses) = (l(&self.hits), l(&self.misses));
        KvStatsSnapshot {
            puts: l(&self.puts),
            put_bytes: l(&self.put_bytes),
            puts_already_present: l(&self.puts_already_present),
            gets: hits + misses,
            hits,
            misses,
            get_bytes: l(&self.get_bytes),
            hit_ratio: ratio(hits, misses),
            lookups: l(&self.lookups),
            removes: l(&self.removes),
            prefetch_issued: l(&self.prefetch_issued),
            // Filled in by the service from its staging controller.
            prefetch_used: 0,
            prefetch_wasted: 0,
            prefetch_deferred: 0,
            rejected: l(&self.rejected),
            idle_aborted: l(&self.idle_aborted),
            idle_connections_closed: l(&self.idle_connections_closed),
            put_reserved_bytes: 0,
            get_reserved_bytes: 0,
            namespaces,
            load_model: self.load.snapshot(),
            group: None,
            shm: None,
            tenants: Vec::new(),
        }
    }
}

/// Per-tier estimates; f64 values stored as bits in atomics.
struct TierModel {
    latency_ns: AtomicU64,
    bytes_per_s: AtomicU64,
    inflight_bytes: AtomicU64,
}

impl TierModel {
    fn new(latency_us: f64, gbps: f64) -> Self {
        TierModel {
            latency_ns: AtomicU64::new((latency_us * 1e3).to_bits()),
            bytes_per_s: AtomicU64::new((gbps * 1e9 / 8.0).to_bits()),
            inflight_bytes: AtomicU64::new(0),
        }
    }
    fn latency_ns(&self) -> f64 {
        f64::from_bits(self.latency_ns.load(Ordering::Relaxed))
    }
    fn bytes_per_s(&self) -> f64 {
        f64::from_bits(self.bytes_per_s.load(Ordering::Relaxed))
    }
}

/// Weight of a new observation in the averages: 1/8, so a handful of Gets moves the
/// estimate and a single outlier does not.
const EWMA_ALPHA: f64 = 0.125;

/// See the module docs.
pub struct LoadModel {
    /// gpu, memory, disk.
    tiers: [TierModel; 3],
}

impl Default for LoadModel {
    fn default() -> Self {
        // Defaults until measured: one gRPC round trip over loopback is ~50 us and a
        // stream carries ~16 Gb/s from memory; a disk-tier hit adds an NVMe read
        // (~100 us) and is bounded by the disk (~1.5 GB/s = 12 Gb/s). GPU memory is
        // served through the same RPC path as CPU memory.
        LoadModel {
            tiers: [
                TierModel::new(50.0, 16.0),
                TierModel::new(50.0, 16.0),
                TierModel::new(150.0, 12.0),
            ],
        }
    }
}

impl LoadModel {
    fn model(&self, tier: TierKind) -> Option<&TierModel> {
        match tier {
            TierKind::Gpu => Some(&self.tiers[0]),
            TierKind::Memory => Some(&self.tiers[1]),
            TierKind::Disk => Some(&self.tiers[2]),
            TierKind::Store => None,
        }
    }

    /// Expected time to load `bytes` from `tier` now, in microseconds; 0 if uncached.
    pub fn estimate_us(&self, tier: Option<TierKind>, bytes: u64) -> f64 {
        match tier.and_then(|t| self.model(t)) {
            None => 0.0,
            Some(m) => {
                let queued = m.inflight_bytes.load(Ordering::Relaxed) as f64;
                (m.latency_ns() + (bytes as f64 + queued) / m.bytes_per_s() * 1e9) / 1e3
            }
        }
    }

    /// A Get of `bytes` from `tier` started.
    pub fn started(&self, tier: TierKind, bytes: u64) {
        if let Some(m) = self.model(tier) {
            m.inflight_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// A Get of `bytes` from `tier` finished after `elapsed` (None: cancelled, no sample).
    pub fn finished(&self, tier: TierKind, bytes: u64, elapsed: Option<Duration>) {
        let Some(m) = self.model(tier) else { return };
        let _ = m
            .inflight_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(bytes))
            });
        let Some(elapsed) = elapsed else { return };
        let ns = elapsed.as_nanos() as f64;
        if bytes < (64 << 10) {
            let new = (1.0 - EWMA_ALPHA) * m.latency_ns() + EWMA_ALPHA * ns;
            m.latency_ns.store(new.to_bits(), Ordering::Relaxed);
        } else if bytes >= (256 << 10) {
            let transfer_ns = (ns - m.latency_ns()).max(ns / 2.0);
            let rate = bytes as f64 / transfer_ns * 1e9;
            let new = (1.0 - EWMA_ALPHA) * m.bytes_per_s() + EWMA_ALPHA * rate;
            m.bytes_per_s.store(new.to_bits(), Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> Vec<TierLoadEstimate> {
        [TierKind::Gpu, TierKind::Memory, TierKind::Disk]
            .iter()
            .zip(&self.tiers)
            .map(|(k, m)| TierLoadEstimate {
                tier: k.as_str().to_string(),
                latency_us: m.latency_ns() / 1e3,
                bandwidth_gbps: m.bytes_per_s() * 8.0 / 1e9,
                inflight_bytes: m.inflight_bytes.load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_grow_with_size_queue_and_slower_tiers() {
        let m = LoadModel::default();
        let mem_small = m.estimate_us(Some(TierKind::Memory), 64 << 10);
        let mem_big = m.estimate_us(Some(TierKind::Memory), 16 << 20);
        let disk_big = m.estimate_us(Some(TierKind::Disk), 16 << 20);
        assert!(mem_small < mem_big && mem_big < disk_big);
        assert_eq!(m.estimate_us(None, 1 << 20), 0.0);
        m.started(TierKind::Memory, 64 << 20);
        assert!(m.estimate_us(Some(TierKind::Memory), 16 << 20) > mem_big * 2.0);
        m.finished(TierKind::Memory, 64 << 20, Some(Duration::from_millis(100)));
        // 64 MiB in 100 ms (~5 Gb/s) pulls the bandwidth estimate down from 16 Gb/s.
        assert!(m.snapshot()[1].bandwidth_gbps < 16.0);
        assert_eq!(m.snapshot()[1].inflight_bytes, 0);
    }

    #[test]
    fn namespaces_are_bounded_and_hit_ratio_counts() {
        let s = KvStats::default();
        // "a" read only, but hit: it holds blocks (put before a restart), its own entry.
        s.get("a", Some(10));
        s.get("a", None);
        // "b" only missed: counted under (other), no entry of its own.
        s.get("b", None);
        for i in 0..(MAX_TRACKED_NAMESPACES + 10) {
            s.put(&format!("ns{i}"), 1, false);
        }
        let snap = s.snapshot();
        assert_eq!(
            snap.namespace("a").expect("a hit makes an entry").hit_ratio,
            0.5
        );
        assert!(snap.namespace("b").is_none());
        assert_eq!(snap.namespaces.len(), MAX_TRACKED_NAMESPACES + 1);
        let other = snap.namespace(OTHER_NS).expect("other bucket");
        assert_eq!(other.puts, 11);
        assert_eq!(other.hit_ratio, 0.0);
    }

    /// A known item of the last notes: the first 256 namespaces kept their entries for
    /// the daemon's life. One idle for the replace period gives its entry to a new
    /// namespace; its counts move to (other), so the sum over entries stays the total;
    /// a registered namespace is never replaced.
    #[test]
    fn an_idle_namespace_gives_its_entry_to_a_new_one() {
        let mut s = KvStats::with_pinned(&["model/tenant".to_string()]);
        s.idle_replace = Some(Duration::from_secs(2));
        s.put("model/tenant", 10, false);
        for i in 0..MAX_TRACKED_NAMESPACES {
            s.put(&format!("ns{i}"), 100, false);
        }
        // Full: a new namespace goes to (other) while every entry is fresh.
        s.put("early", 7, false);
        assert!(s.snapshot().namespace("early").is_none());
        std::thread::sleep(Duration::from_millis(3100));
        // All but ns5 idle now; ns5 is active, and the new one takes an idle entry.
        s.put("ns5", 100, false);
        s.put("late", 1000, false);
        let snap = s.snapshot();
        let late = snap.namespace("late").expect("an entry of its own");
        assert_eq!((late.puts, late.put_bytes), (1, 1000));
        assert!(
            snap.namespace("ns5").is_some(),
            "the active one kept its entry"
        );
        assert!(snap.namespace("model/tenant").is_some(), "registered: kept");
        assert_eq!(snap.namespaces.len(), MAX_TRACKED_NAMESPACES + 2);
        let other = snap.namespace(OTHER_NS).expect("(other)");
        assert_eq!(
            (other.puts, other.put_bytes),
            (2, 107),
            "early + the replaced one"
        );
        let sum: u64 = snap.namespaces.iter().map(|n| n.put_bytes).sum();
        assert_eq!(sum, snap.put_bytes, "entries add up to the total");
    }

    #[test]
    fn junk_reads_make_no_entries_and_registered_namespaces_keep_theirs() {
        let s = KvStats::with_pinned(&["model/tenant".to_string()]);
        for i in 0..10_000 {
            let ns = format!("junk{i}");
            s.get(&ns, None);
        }
        let snap = s.snapshot();
        assert_eq!(snap.namespaces.len(), 2, "{:?}", snap.namespaces);
        assert_eq!(snap.misses, 10_000);
        for i in 0..(2 * MAX_TRACKED_NAMESPACES) {
            s.put(&format!("junk{i}"), 1024, false);
        }
        s.put("model/tenant", 4096, false);
        let snap = s.snapshot();
        assert_eq!(snap.namespaces.len(), MAX_TRACKED_NAMESPACES + 2);
        let t = snap
            .namespace("model/tenant")
            .expect("the registered namespace keeps its entry");
        assert_eq!((t.puts, t.put_bytes), (1, 4096));
    }
}
