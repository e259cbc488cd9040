//! `strata stats [--endpoint ADDR] [--json] [--watch SECS]`: the daemon's figures from
//! its admin API. `--watch` redraws a live view every SECS seconds with rates over the
//! last interval, like `juicefs stats`. `--cluster`: every member of the daemon's cache
//! group (issue 16), each asked at the admin address it registered.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use clap::Args;

use crate::admin::{fetch_stats, DaemonStats};

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Admin API address of the daemon (`[admin] listen` in strata.toml).
    #[arg(long, default_value = "127.0.0.1:7071")]
    pub endpoint: String,
    /// Print the raw figures as JSON.
    #[arg(long)]
    pub json: bool,
    /// Redraw every SECS seconds until interrupted (rates are per second over the
    /// last interval).
    #[arg(long, value_name = "SECS", value_parser = parse_watch)]
    pub watch: Option<f64>,
    /// Every node of the daemon's cache group: its share of the keys, the peer bytes
    /// in and out, the store bytes the group saved.
    #[arg(long, conflicts_with = "watch")]
    pub cluster: bool,
}

/// `--watch SECS`: a finite interval from 0.1 s to a day (black-box finding: `inf`
/// panicked converting it to a duration, `nan` redrew ten times a second).
fn parse_watch(text: &str) -> Result<f64, String> {
    let secs: f64 = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    if !(0.1..=86_400.0).contains(&secs) {
        return Err(format!("{text:?}: must be between 0.1 and 86400 seconds"));
    }
    Ok(secs)
}

pub fn run(args: StatsArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        if args.cluster {
            let r = cluster_report(&args.endpoint).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                out!("{}", r.render());
            }
            return Ok(());
        }
        let Some(secs) = args.watch else {
            let s = fetch_stats(&args.endpoint).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                out!("{}", render(&args.endpoint, &s, None));
            }
            return Ok(());
        };
        let every = Duration::from_secs_f64(secs.max(0.1));
        let mut prev: Option<DaemonStats> = None;
        loop {
            // The first fetch must answer (a wrong endpoint is an error at once); a later
            // one that fails is shown and tried again at the next interval (black-box
            // finding: the live view exited on one reset connection of a full admin
            // listener).
            let s = match fetch_retrying(&args.endpoint).await {
                Ok(s) => s,
                Err(e) if prev.is_some() => {
                    // Not fatal: a closed stderr loses the line, nothing else.
                    let _ = writeln!(
                        std::io::stderr(),
                        "strata stats: {e:#}; trying again in {secs} s"
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(every) => continue,
                        _ = tokio::signal::ctrl_c() => return Ok(()),
                    }
                }
                Err(e) => return Err(e),
            };
            if args.json {
                outln!("{}", serde_json::to_string(&s)?);
            } else {
                // Clear the screen and home the cursor, then redraw.
                out!("\x1b[2J\x1b[H{}", render(&args.endpoint, &s, prev.as_ref()));
            }
            prev = Some(s);
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
    })
}

/// [`fetch_stats`], asked twice more 100 ms apart when it fails: a full admin listener
/// closes new connections to make room (reset before the answer), and a live view
/// should not miss a redraw for one of them.
async fn fetch_retrying(endpoint: &str) -> anyhow::Result<DaemonStats> {
    let mut tries = 0;
    loop {
        match fetch_stats(endpoint).await {
            Err(_) if tries < 2 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            r => return r,
        }
    }
}

/// `strata stats --cluster`: one row per member of the group.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClusterReport {
    /// The node asked first (the members are as it sees them).
    pub asked: String,
    /// False while that node cannot reach etcd (the members are the last seen).
    pub connected: bool,
    /// Why the group keeps that node out, while it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    pub nodes: Vec<ClusterNodeRow>,
    /// Sums over the reachable nodes.
    pub peer_bytes_in: u64,
    pub peer_bytes_out: u64,
    pub store_bytes_saved: u64,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClusterNodeRow {
    pub id: String,
    pub admin: String,
    /// Its `/stats` answered.
    pub reachable: bool,
    /// Why not, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The share of the keys placement gives it (capacity over the group's).
    pub expected_share: f64,
    /// KV blocks it stored (puts that wrote, its own clients' and the ones other nodes
    /// routed to it) and their share of the group's.
    pub kv_blocks_stored: u64,
    pub share_of_keys: f64,
    /// Bytes its tiers hold, and their share of the group's.
    pub bytes_held: u64,
    pub share_of_bytes: f64,
    /// Bytes received from / sent to the other nodes (KV blocks both ways).
    pub peer_bytes_in: u64,
    pub peer_bytes_out: u64,
    /// Bytes it got from a peer instead of the object store (file blocks).
    pub store_bytes_saved: u64,
}

impl ClusterNodeRow {
    fn fill(&mut self, s: &DaemonStats) {
        self.reachable = true;
        self.bytes_held = s.engine.tiers.iter().map(|t| t.used_bytes).sum();
        if let Some(kv) = &s.kv {
            self.kv_blocks_stored = kv.puts.saturating_sub(kv.puts_already_present);
            if let Some(g) = &kv.group {
                self.peer_bytes_in =
                    g.served_bytes_in + g.peers.iter().map(|p| p.bytes_in).sum::<u64>();
                self.peer_bytes_out =
                    g.served_bytes_out + g.peers.iter().map(|p| p.bytes_out).sum::<u64>();
            }
        }
        // File blocks: what peers sent this node is what the store did not have to.
        if let Some(p) = &s.peer {
            let file_in: u64 = p.peers.values().map(|c| c.bytes_in).sum();
            self.peer_bytes_in += file_in;
            self.peer_bytes_out += p.peers.values().map(|c| c.bytes_out).sum::<u64>();
            self.store_bytes_saved = file_in;
        }
    }
}

impl ClusterReport {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "cache group as {} sees it{}",
            self.asked,
            match (&self.refused, self.connected) {
                (Some(why), _) => format!(" (kept out of the group: {why})"),
                (None, true) => String::new(),
                (None, false) => " (etcd unreachable: last membership)".to_string(),
            }
        );
        let _ = writeln!(
            out,
            "{:<16} {:>8} {:>10} {:>8} {:>12} {:>8} {:>12} {:>12} {:>12}",
            "node",
            "expected",
            "kv stored",
            "stored",
            "held MiB",
            "bytes",
            "peer in MiB",
            "peer out MiB",
            "saved MiB"
        );
        for n in &self.nodes {
            if !n.reachable {
                let _ = writeln!(
                    out,
                    "{:<16} {:>7.1}%  unreachable: {}",
                    n.id,
                    n.expected_share * 100.0,
                    n.error.as_deref().unwrap_or("no admin API")
                );
                continue;
            }
            let _ = writeln!(
                out,
                "{:<16} {:>7.1}% {:>10} {:>7.1}% {:>12.1} {:>7.1}% {:>12.1} {:>12.1} {:>12.1}",
                n.id,
                n.expected_share * 100.0,
                n.kv_blocks_stored,
                n.share_of_keys * 100.0,
                mib(n.bytes_held),
                n.share_of_bytes * 100.0,
                mib(n.peer_bytes_in),
                mib(n.peer_bytes_out),
                mib(n.store_bytes_saved),
            );
        }
        let _ = writeln!(
            out,
            "group: peer in {:.1} MiB, peer out {:.1} MiB, store bytes saved {:.1} MiB",
            mib(self.peer_bytes_in),
            mib(self.peer_bytes_out),
            mib(self.store_bytes_saved)
        );
        out
    }
}

/// Asks the daemon at `endpoint` for its group, then every member for its figures
/// (each within 3 s: a member that is down is a row that says so, not a failure).
pub async fn cluster_report(endpoint: &str) -> anyhow::Result<ClusterReport> {
    let local = fetch_stats(endpoint).await?;
    let Some(c) = &local.cluster else {
        anyhow::bail!("the daemon at {endpoint} is not in a cache group (no [cluster])");
    };
    let mut r = ClusterReport {
        asked: c.node.clone(),
        connected: c.connected,
        refused: c.refused.clone(),
        ..Default::default()
    };
    let asks = c.members.iter().map(|m| async move {
        let mut row = ClusterNodeRow {
            id: m.id.clone(),
            admin: m.admin.clone(),
            expected_share: m.expected_share,
            ..Default::default()
        };
        if m.admin.is_empty() {
            row.error = Some("no admin API".into());
            return row;
        }
        match tokio::time::timeout(Duration::from_secs(3), fetch_stats(&m.admin)).await {
            Ok(Ok(s)) => row.fill(&s),
            Ok(Err(e)) => row.error = Some(format!("{e:#}")),
            Err(_) => row.error = Some("no answer within 3 s".into()),
        }
        row
    });
    r.nodes = futures::future::join_all(asks).await;
    let keys: u64 = r.nodes.iter().map(|n| n.kv_blocks_stored).sum();
    let bytes: u64 = r.nodes.iter().map(|n| n.bytes_held).sum();
    for n in &mut r.nodes {
        n.share_of_keys = if keys > 0 {
            n.kv_blocks_stored as f64 / keys as f64
        } else {
            0.0
        };
        n.share_of_bytes = if bytes > 0 {
            n.bytes_held as f64 / bytes as f64
        } else {
            0.0
        };
    }
    r.peer_bytes_in = r.nodes.iter().map(|n| n.peer_bytes_in).sum();
    r.peer_bytes_out = r.nodes.iter().map(|n| n.peer_bytes_out).sum();
    r.store_bytes_saved = r.nodes.iter().map(|n| n.store_bytes_saved).sum();
    Ok(r)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn pct(r: f64) -> String {
    format!("{:.1}%", r * 100.0)
}

fn ratio(h: u64, m: u64) -> f64 {
    if h + m == 0 {
        0.0
    } else {
        h as f64 / (h + m) as f64
    }
}

/// Human view of `s`; with `prev`, the rates since that snapshot. One section per
/// part of the daemon, in the order of the data path.
pub fn render(endpoint: &str, s: &DaemonStats, prev: Option<&DaemonStats>) -> String {
    let mut o = String::new();
    let r = Rates::new(s, prev);
    let _ = writeln!(
        o,
        "strata {} @ {endpoint}   up {:.0}s   mounts {}",
        s.version,
        s.uptime_secs,
        s.mounts.len()
    );
    let _ = writeln!(o);
    render_tiers(&mut o, s, prev, &r);
    render_engine(&mut o, s, prev, &r);
    render_streams(&mut o, s);
    render_kv(&mut o, s, prev, &r);
    if let Some(l) = &s.local_files {
        let _ = writeln!(
            o,
            "local files: {} passthrough copies {:.1} MiB + staged writes {:.1} MiB of {:.1} MiB{}",
            l.copies,
            mib(l.copy_bytes),
            mib(l.staged_bytes),
            mib(l.budget_bytes),
            if l.copy_bytes + l.staged_bytes > l.budget_bytes {
                "   (over: staged writes are never refused for the budget)"
            } else {
                ""
            }
        );
    }
    for m in &s.mounts {
        let _ = writeln!(o, "mount {} <- {:?}", m.mountpoint.display(), m.prefix);
        if let Some(st) = &m.stats {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            let _ = writeln!(
                o,
                "  reads {} ({:.1} MiB)   prefetched files {} (used {}, wasted {})   passthrough opens {}",
                st.reads,
                mib(st.read_bytes),
                st.prefetch_files,
                st.prefetch_files_used,
                st.prefetch_files_wasted,
                st.passthrough_opens,
            );
            let _ = writeln!(
                o,
                "  metadata: {} HEADs, {} LISTs   cached {:.1} MiB   inodes {}",
                st.store_heads,
                st.store_lists,
                mib(st.metadata_bytes),
                st.inodes,
            );
            if st.read_errors > 0 || st.store_failures > 0 || st.store_failed_attempts > 0 {
                let _ = writeln!(
                    o,
                    "  failed: {} reads ({} ESTALE), {} store requests ({} attempts failed, retried ones included)",
                    st.read_errors, st.read_stale, st.store_failures, st.store_failed_attempts,
                );
            }
            if st.writable {
                let _ = writeln!(
                    o,
                    "  written: {} files uploaded ({:.1} MiB, {} sent while written), {} failed, {} deleted, {} renamed",
                    st.uploads,
                    mib(st.upload_bytes),
                    st.uploads_streamed,
                    st.upload_failures,
                    st.deletes,
                    st.renames,
                );
            }
        }
    }
    o
}

/// Per-second rates since the previous snapshot (empty without one).
struct Rates {
    dt: Option<f64>,
}

impl Rates {
    fn new(s: &DaemonStats, prev: Option<&DaemonStats>) -> Self {
        Rates {
            dt: prev.map(|p| (s.uptime_secs - p.uptime_secs).max(1e-3)),
        }
    }

    fn of(&self, now: u64, before: Option<u64>) -> String {
        match (self.dt, before) {
            (Some(dt), Some(b)) => format!("{:.1}/s", now.saturating_sub(b) as f64 / dt),
            _ => String::new(),
        }
    }
}

/// The tier levels, fastest first (GPU, memory, disk: as configured).
fn render_tiers(o: &mut String, s: &DaemonStats, prev: Option<&DaemonStats>, r: &Rates) {
    let _ = writeln!(
        o,
        "{:<24} {:>10} {:>10} {:>6} {:>10} {:>10} {:>7} {:>9} {:>10} {:>11} {:>12}",
        "TIER",
        "USED MiB",
        "CAP MiB",
        "USE%",
        "HITS",
        "MISSES",
        "HIT%",
        "EVICTED",
        "HITS/s",
        "LRU PERIODS",
        "FREQ PERIODS"
    );
    for (i, t) in s.engine.tiers.iter().enumerate() {
        let earlier = prev.and_then(|p| p.engine.tiers.get(i));
        let before = earlier.map(|b| b.hits);
        let use_pct = if t.capacity_bytes == 0 {
            0.0
        } else {
            t.used_bytes as f64 / t.capacity_bytes as f64
        };
        // Watching: the interval's ratio, as `juicefs stats` shows (black-box finding:
        // the lifetime ratio read 77% through an interval of nothing but misses).
        let hit_pct = match earlier {
            Some(b) => {
                let (h, m) = (
                    t.hits.saturating_sub(b.hits),
                    t.misses.saturating_sub(b.misses),
                );
                if h + m == 0 {
                    "-".to_string()
                } else {
                    pct(h as f64 / (h + m) as f64)
                }
            }
            None => pct(t.hit_ratio()),
        };
        let _ = writeln!(
            o,
            "{:<24} {:>10.1} {:>10.1} {:>6} {:>10} {:>10} {:>7} {:>9} {:>10} {:>11} {:>12}",
            tail(&t.name, 24),
            mib(t.used_bytes),
            mib(t.capacity_bytes),
            pct(use_pct),
            t.hits,
            t.misses,
            hit_pct,
            t.evictions,
            r.of(t.hits, before),
            t.policy_recency_periods,
            t.policy_frequency_periods
        );
    }
    if prev.is_some() {
        let _ = writeln!(o, "(HIT% and HITS/s over the last interval)");
    }
    // Failures are shown, not only counted (black-box finding: 7 disk-tier errors and
    // 7 lost blocks were in /stats and /metrics, and the table showed 7 misses).
    let failing: Vec<String> = s
        .engine
        .tiers
        .iter()
        .filter(|t| t.errors > 0)
        .map(|t| format!("{} {}", tail(&t.name, 24), t.errors))
        .collect();
    if !failing.is_empty() || s.engine.lost_blocks > 0 || !s.engine.degraded.is_empty() {
        let _ = writeln!(
            o,
            "tier errors: {}   blocks lost (unreadable, fetched again): {}{}",
            if failing.is_empty() {
                "none".to_string()
            } else {
                failing.join(", ")
            },
            s.engine.lost_blocks,
            if s.engine.degraded.is_empty() {
                String::new()
            } else {
                format!(
                    "   degraded (writes skip): {}",
                    s.engine.degraded.join(", ")
                )
            }
        );
    }
}

/// `s` cut to its last `width` characters (with `...` in front) if longer.
fn tail(s: &str, width: usize) -> String {
    let chars = s.chars().count();
    if chars <= width {
        return s.to_string();
    }
    let kept: String = s.chars().skip(chars - (width - 3)).collect();
    format!("...{kept}")
}

/// Streams shown in the human view: the most recently active, 12 (the JSON has more).
const STREAMS_SHOWN: usize = 12;

/// The access tracker's streams: per job and granularity, the pattern and the test
/// that decided it (classified whatever the eviction policy).
fn render_streams(o: &mut String, s: &DaemonStats) {
    let t = &s.engine.tracker;
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "access tracker: {} demand accesses observed, {} streams",
        t.observed, t.streams
    );
    if t.recent.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "{:>20} {:<9} {:<10} {:>7}  {:<32} DECIDED BY",
        "JOB", "ITEMS", "PATTERN", "VISITS", "STREAM"
    );
    // A file read in one visit (a small file) is a stream of one block: nothing to
    // classify, and hundreds of them would hide the streams that say something.
    let telling = t
        .recent
        .iter()
        .filter(|r| r.granularity != "blocks" || r.visits > 1);
    for r in telling.take(STREAMS_SHOWN) {
        let name = tail(&r.name, 32);
        let _ = writeln!(
            o,
            "{:>20} {:<9} {:<10} {:>7}  {:<32} {}",
            r.job,
            r.granularity,
            format!("{:?}", r.pattern).to_lowercase(),
            r.visits,
            name,
            r.decided_by
        );
    }
}

/// Engine-wide movement: fills, promotions, demotions, prefetch.
fn render_engine(o: &mut String, s: &DaemonStats, prev: Option<&DaemonStats>, r: &Rates) {
    let e = &s.engine;
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "fills {} ({:.1} MiB from store or puts) {}   promotions {}   demotions {}   single-flight joins {}",
        e.fills,
        mib(e.fill_bytes),
        r.of(e.fills, prev.map(|p| p.engine.fills)),
        e.promotions,
        e.demotions,
        e.singleflight_joins
    );
    if e.writes_shed > 0 || e.write_behind_bytes > 0 {
        // A cache disk slower than the store: copies it could not take in time.
        let _ = writeln!(
            o,
            "disk copies written behind readers: {:.1} MiB pending, {} shed (the disk could not keep up)",
            mib(e.write_behind_bytes),
            e.writes_shed
        );
    }
    let kv = s.kv.clone().unwrap_or_default();
    let _ = writeln!(
        o,
        "prefetch: {} fills ({:.1} MiB)   KV staged {} / used {} / wasted {} / deferred {}",
        e.prefetch_fills,
        mib(e.prefetch_bytes),
        kv.prefetch_issued,
        kv.prefetch_used,
        kv.prefetch_wasted,
        kv.prefetch_deferred
    );
}

/// The KV service: totals, per-namespace figures, the load model.
fn render_kv(o: &mut String, s: &DaemonStats, prev: Option<&DaemonStats>, r: &Rates) {
    let Some(kv) = &s.kv else {
        return;
    };
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "KV: puts {} ({:.1} MiB, {} already present)   gets {} {}   hit {}   lookups {}   removed {}   rejected {}",
        kv.puts,
        mib(kv.put_bytes),
        kv.puts_already_present,
        kv.gets,
        r.of(kv.gets, prev.and_then(|p| p.kv.as_ref()).map(|k| k.gets)),
        pct(kv.hit_ratio),
        kv.lookups,
        kv.removes,
        kv.rejected
    );
    if !kv.namespaces.is_empty() {
        let _ = writeln!(
            o,
            "{:<32} {:>8} {:>10} {:>10} {:>10} {:>7} {:>10}",
            "NAMESPACE", "PUTS", "PUT MiB", "HITS", "MISSES", "HIT%", "GET MiB"
        );
        for n in &kv.namespaces {
            let _ = writeln!(
                o,
                "{:<32} {:>8} {:>10.1} {:>10} {:>10} {:>7} {:>10.1}",
                n.namespace,
                n.puts,
                mib(n.put_bytes),
                n.hits,
                n.misses,
                pct(ratio(n.hits, n.misses)),
                mib(n.get_bytes)
            );
        }
    }
    let model: Vec<String> = kv
        .load_model
        .iter()
        .map(|t| {
            format!(
                "{} {:.0} us + {:.1} Gb/s",
                t.tier, t.latency_us, t.bandwidth_gbps
            )
        })
        .collect();
    let _ = writeln!(o, "load model: {}", model.join(", "));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_takes_a_finite_interval_only() {
        assert_eq!(super::parse_watch("1"), Ok(1.0));
        assert_eq!(super::parse_watch("0.5"), Ok(0.5));
        for bad in ["inf", "1e20", "nan", "0", "-1", "x"] {
            assert!(super::parse_watch(bad).is_err(), "{bad}");
        }
    }
    use strata_cache_core::stats::TierStatsSnapshot;

    #[test]
    fn render_shows_tiers_namespaces_and_rates() {
        let mut s = DaemonStats {
            version: "x".into(),
            uptime_secs: 10.0,
            ..Default::default()
        };
        s.engine.tiers.push(TierStatsSnapshot {
            name: "memory".into(),
            used_bytes: 1 << 20,
            capacity_bytes: 4 << 20,
            hits: 30,
            misses: 10,
            policy_recency_periods: 3,
            policy_frequency_periods: 5,
            ..Default::default()
        });
        s.kv = Some(strata_kvcache::KvStatsSnapshot {
            namespaces: vec![strata_kvcache::stats::NamespaceStats {
                namespace: "m/t".into(),
                hits: 1,
                misses: 3,
                ..Default::default()
            }],
            ..Default::default()
        });
        let mut p = s.clone();
        p.uptime_secs = 8.0;
        p.engine.tiers[0].hits = 10;
        p.engine.tiers[0].misses = 5;
        let text = render("e", &s, Some(&p));
        assert!(text.contains("25.0%"), "memory use 1/4:\n{text}");
        // Black-box finding (round 14): watching showed the lifetime ratio.
        assert!(
            text.contains("80.0%") && text.contains("over the last interval"),
            "the interval's hit ratio 20/25:\n{text}"
        );
        assert!(
            render("e", &s, None).contains("75.0%"),
            "once: the lifetime ratio 30/40"
        );
        assert!(!text.contains("tier errors"), "none to show");
        assert!(text.contains("10.0/s"), "20 hits over 2 s:\n{text}");
        assert!(
            text.contains("LRU PERIODS")
                && text.contains("FREQ PERIODS")
                && text.contains("10.0/s           3            5"),
            "the guards' periods:\n{text}"
        );
        assert!(
            text.contains("m/t") && text.contains("25.0%"),
            "namespace hit ratio 1/4:\n{text}"
        );
        assert!(!text.contains("local files"), "none without a disk budget");
        // Black-box finding (round 14): errors and lost blocks were only counted.
        let mut failing = s.clone();
        failing.engine.tiers[0].errors = 7;
        failing.engine.lost_blocks = 7;
        let text = render("e", &failing, None);
        assert!(
            text.contains("tier errors: memory 7")
                && text.contains("blocks lost (unreadable, fetched again): 7"),
            "{text}"
        );
        s.local_files = Some(crate::admin::LocalFilesStats {
            copies: 3,
            copy_bytes: 1 << 20,
            staged_bytes: 4 << 20,
            budget_bytes: 4 << 20,
        });
        let text = render("e", &s, None);
        assert!(
            text.contains("3 passthrough copies 1.0 MiB + staged writes 4.0 MiB of 4.0 MiB")
                && text.contains("(over: staged writes are never refused"),
            "local files, over their budget:\n{text}"
        );
    }
}
