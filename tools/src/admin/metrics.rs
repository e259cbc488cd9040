//! `/metrics`: the stats rendered as OpenMetrics (a fresh registry per scrape), and
//! the Prometheus text format 0.0.4 made from it.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{DaemonStats, MountInfo, MountStats};

/// The Prometheus text format 0.0.4 of an OpenMetrics exposition: a counter's `# HELP`
/// and `# TYPE` name its `_total` samples, and `# UNIT` and `# EOF` (OpenMetrics only)
/// go; samples are the same.
pub fn openmetrics_to_text_004(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        if let Some((prefix, rest)) = meta {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            if counters.contains(name) {
                out.push_str(&format!("{prefix}{name}_total {tail}\n"));
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

type Labels = Vec<(String, String)>;

fn counter_family(reg: &mut Registry, name: &str, help: &str, values: &[(Labels, u64)]) {
    let fam = Family::<Labels, Counter>::default();
    for (labels, v) in values {
        fam.get_or_create(labels).inc_by(*v);
    }
    reg.register(name, help, fam);
}

fn gauge_family(reg: &mut Registry, name: &str, help: &str, values: &[(Labels, f64)]) {
    let fam = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    for (labels, v) in values {
        fam.get_or_create(labels).set(*v);
    }
    reg.register(name, help, fam);
}

/// One labelled value per item, for a metric family.
fn per<T, V>(
    items: &[T],
    labels: impl Fn(&T) -> Labels,
    value: impl Fn(&T) -> V,
) -> Vec<(Labels, V)> {
    items.iter().map(|i| (labels(i), value(i))).collect()
}

fn counter(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(v);
    reg.register(name, help, c);
}

/// Per mount (`mountpoint="/mnt/data"`): reads, prefetched files, passthrough, and
/// what was written through it.
fn render_mount_metrics(reg: &mut Registry, mounts: &[MountInfo]) {
    let with: Vec<(Labels, &MountStats)> = mounts
        .iter()
        .filter_map(|m| {
            let labels = vec![("mountpoint".to_string(), m.mountpoint.display().to_string())];
            m.stats.as_ref().map(|st| (labels, st))
        })
        .collect();
    let family = |reg: &mut Registry, name: &str, help: &str, f: fn(&MountStats) -> u64| {
        let values: Vec<(Labels, u64)> = with.iter().map(|(l, st)| (l.clone(), f(st))).collect();
        counter_family(reg, name, help, &values);
    };
    family(reg, "mount_reads", "Reads the mount served", |m| m.reads);
    family(
        reg,
        "mount_read_bytes",
        "Bytes the mount's reads returned",
        |m| m.read_bytes,
    );
    family(
        reg,
        "mount_store_heads",
        "HEADs the mount sent for metadata",
        |m| m.store_heads,
    );
    family(reg, "mount_store_lists", "LISTs the mount sent", |m| {
        m.store_lists
    });
    family(
        reg,
        "mount_prefetch_files",
        "Other files the mount prefetched ahead of their readers",
        |m| m.prefetch_files,
    );
    family(
        reg,
        "mount_prefetch_files_used",
        "Prefetched files a reader then read",
        |m| m.prefetch_files_used,
    );
    family(
        reg,
        "mount_prefetch_files_wasted",
        "Prefetched files evicted unread",
        |m| m.prefetch_files_wasted,
    );
    family(
        reg,
        "mount_passthrough_opens",
        "Opens served by a passthrough copy",
        |m| m.passthrough_opens,
    );
    family(
        reg,
        "mount_uploads",
        "Files written through the mount and uploaded",
        |m| m.uploads,
    );
    family(
        reg,
        "mount_upload_bytes",
        "Bytes of the files uploaded",
        |m| m.upload_bytes,
    );
    family(
        reg,
        "mount_upload_failures",
        "Uploads that failed (their close or fsync returned the error)",
        |m| m.upload_failures,
    );
    family(
        reg,
        "mount_read_errors",
        "Reads through the mount that failed (EIO, ESTALE, ...)",
        |m| m.read_errors,
    );
    family(
        reg,
        "mount_read_stale",
        "Reads that failed with ESTALE: the handle's version was replaced",
        |m| m.read_stale,
    );
    family(
        reg,
        "mount_store_failures",
        "Store requests of the mount that failed after their retries",
        |m| m.store_failures,
    );
    family(
        reg,
        "mount_store_failed_attempts",
        "Store attempts of the mount that failed (errors, no answer in time), retried to success or not",
        |m| m.store_failed_attempts,
    );
    family(
        reg,
        "mount_deletes",
        "Objects deleted through the mount",
        |m| m.deletes,
    );
    family(
        reg,
        "mount_renames",
        "Files renamed through the mount",
        |m| m.renames,
    );
    let gauges = |reg: &mut Registry, name: &str, help: &str, f: fn(&MountStats) -> u64| {
        let values: Vec<(Labels, f64)> = with
            .iter()
            .map(|(l, st)| (l.clone(), f(st) as f64))
            .collect();
        gauge_family(reg, name, help, &values);
    };
    gauges(
        reg,
        "mount_metadata_bytes",
        "Estimated bytes of the mount's cached attributes and listings",
        |m| m.metadata_bytes,
    );
    gauges(reg, "mount_inodes", "Inodes the mount's table holds", |m| {
        m.inodes
    });
}

/// The cache group's data plane: per peer (`peer="node-b"`), and this node's store reads.
fn render_peer_metrics(reg: &mut Registry, p: &crate::daemon::peer_metrics::PeerStats) {
    let peers: Vec<(&String, &crate::daemon::peer_metrics::PeerCounters)> =
        p.peers.iter().collect();
    let label = |(id, _): &(&String, &crate::daemon::peer_metrics::PeerCounters)| {
        vec![("peer".to_string(), id.to_string())]
    };
    type C<'a> = (&'a String, &'a crate::daemon::peer_metrics::PeerCounters);
    type Field = fn(&C<'_>) -> u64;
    let fams: [(&str, &str, Field); 7] = [
        (
            "peer_requests_out",
            "Blocks this node asked the peer for",
            |c| c.1.requests_out,
        ),
        (
            "peer_bytes_in",
            "Verified bytes received from the peer",
            |c| c.1.bytes_in,
        ),
        (
            "peer_requests_in",
            "Blocks the peer asked this node for",
            |c| c.1.requests_in,
        ),
        ("peer_bytes_out", "Bytes served to the peer", |c| {
            c.1.bytes_out
        }),
        (
            "peer_errors",
            "Asks to the peer that failed (unreachable, error, bad checksum)",
            |c| c.1.errors,
        ),
        (
            "peer_fallbacks",
            "Reads of the peer's blocks answered by the store instead",
            |c| c.1.fallbacks,
        ),
        (
            "peer_hedges",
            "Store fetches started because the peer was slower than its p99",
            |c| c.1.hedges,
        ),
    ];
    for (name, help, f) in fams {
        counter_family(reg, name, help, &per(&peers, label, f));
    }
    counter(
        reg,
        "store_gets",
        "Ranged GETs sent to the object store",
        p.store_gets,
    );
    counter(
        reg,
        "store_read_bytes",
        "Bytes read from the object store",
        p.store_bytes,
    );
    counter(
        reg,
        "peer_remote_kept",
        "Remote blocks admitted into this node's tiers",
        p.remote_kept,
    );
    counter(
        reg,
        "peer_remote_not_kept",
        "Remote blocks read without keeping a copy",
        p.remote_not_kept,
    );
}

/// Renders `s` in the Prometheus/OpenMetrics text format.
pub fn render_metrics(s: &DaemonStats) -> String {
    let mut reg = Registry::with_prefix("strata");
    let e = &s.engine;
    let tier = |name: &str| vec![("tier".to_string(), name.to_string())];
    let per_tier = |t: &strata_cache_core::stats::TierStatsSnapshot| tier(&t.name);
    gauge_family(
        &mut reg,
        "tier_used_bytes",
        "Bytes held by the tier",
        &per(&e.tiers, per_tier, |t| t.used_bytes as f64),
    );
    gauge_family(
        &mut reg,
        "tier_capacity_bytes",
        "Byte budget of the tier",
        &per(&e.tiers, per_tier, |t| t.capacity_bytes as f64),
    );
    gauge_family(
        &mut reg,
        "tier_hit_ratio",
        "Hits / (hits + misses) of the tier",
        &per(&e.tiers, per_tier, |t| t.hit_ratio()),
    );
    counter_family(
        &mut reg,
        "tier_hits",
        "Lookups the tier answered",
        &per(&e.tiers, per_tier, |t| t.hits),
    );
    counter_family(
        &mut reg,
        "tier_misses",
        "Lookups the tier missed",
        &per(&e.tiers, per_tier, |t| t.misses),
    );
    counter_family(
        &mut reg,
        "tier_evictions",
        "Blocks evicted from the tier",
        &per(&e.tiers, per_tier, |t| t.evictions),
    );
    counter_family(
        &mut reg,
        "tier_read_bytes",
        "Bytes of the blocks read from the tier (whole blocks: a 4 KiB read of a cached 1 MiB block counts 1 MiB)",
        &per(&e.tiers, per_tier, |t| t.bytes_out),
    );
    counter_family(
        &mut reg,
        "tier_written_bytes",
        "Bytes written to the tier",
        &per(&e.tiers, per_tier, |t| t.bytes_in),
    );
    counter_family(
        &mut reg,
        "tier_errors",
        "Failed tier operations",
        &per(&e.tiers, per_tier, |t| t.errors),
    );
    counter_family(
        &mut reg,
        "tier_policy_recency_periods",
        "Times the tier's policy evicted in plain recency order for a while because a shadow LRU out-hit it",
        &per(&e.tiers, per_tier, |t| t.policy_recency_periods),
    );
    counter_family(
        &mut reg,
        "tier_policy_frequency_periods",
        "Times the tier's policy ranked every stream by frequency for a while because a shadow W-TinyLFU out-hit it",
        &per(&e.tiers, per_tier, |t| t.policy_frequency_periods),
    );
    counter(
        &mut reg,
        "fills",
        "Blocks filled into the cache (store reads and KV puts)",
        e.fills,
    );
    counter(
        &mut reg,
        "fill_bytes",
        "Bytes filled into the cache (store reads and KV puts)",
        e.fill_bytes,
    );
    counter(
        &mut reg,
        "promotions",
        "Blocks promoted to a faster tier",
        e.promotions,
    );
    counter(
        &mut reg,
        "demotions",
        "Blocks demoted to a slower tier",
        e.demotions,
    );
    counter(
        &mut reg,
        "singleflight_joins",
        "Misses that joined a fetch in flight",
        e.singleflight_joins,
    );
    counter(
        &mut reg,
        "prefetch_fills",
        "Blocks filled by prefetch",
        e.prefetch_fills,
    );
    counter(
        &mut reg,
        "prefetch_bytes",
        "Bytes filled by prefetch",
        e.prefetch_bytes,
    );
    counter(
        &mut reg,
        "writes_shed",
        "Copies of file blocks not written to disk: the bytes written behind readers were at their bound (a cache disk slower than the store)",
        e.writes_shed,
    );
    if let Some(p) = &s.peer {
        render_peer_metrics(&mut reg, p);
    }
    let up = Gauge::<f64, AtomicU64>::default();
    up.set(s.uptime_secs);
    reg.register("uptime_seconds", "Seconds since the daemon started", up);
    let mounts = Gauge::<i64>::default();
    mounts.set(s.mounts.len() as i64);
    reg.register("mounts", "Mounts served by the daemon", mounts);
    render_mount_metrics(&mut reg, &s.mounts);
    if let Some(l) = &s.local_files {
        let g = |reg: &mut Registry, name: &str, help: &str, v: u64| {
            let gauge = Gauge::<i64>::default();
            gauge.set(v as i64);
            reg.register(name, help, gauge);
        };
        g(
            &mut reg,
            "local_copy_bytes",
            "Bytes of the mounts' passthrough copies",
            l.copy_bytes,
        );
        g(
            &mut reg,
            "local_staged_bytes",
            "Bytes of files written through the mounts and not yet uploaded",
            l.staged_bytes,
        );
        g(
            &mut reg,
            "local_files_budget_bytes",
            "Disk budget of the copies and staged files together",
            l.budget_bytes,
        );
    }
    if let Some(kv) = &s.kv {
        let ns = |n: &str| vec![("namespace".to_string(), n.to_string())];
        let per_ns = |n: &strata_kvcache::stats::NamespaceStats| ns(&n.namespace);
        let per_model_tier = |t: &strata_kvcache::stats::TierLoadEstimate| tier(&t.tier);
        counter_family(
            &mut reg,
            "kv_hits",
            "KV Gets that hit",
            &per(&kv.namespaces, per_ns, |n| n.hits),
        );
        counter_family(
            &mut reg,
            "kv_misses",
            "KV Gets that missed",
            &per(&kv.namespaces, per_ns, |n| n.misses),
        );
        counter_family(
            &mut reg,
            "kv_puts",
            "KV blocks stored",
            &per(&kv.namespaces, per_ns, |n| n.puts),
        );
        counter_family(
            &mut reg,
            "kv_put_bytes",
            "KV bytes stored",
            &per(&kv.namespaces, per_ns, |n| n.put_bytes),
        );
        counter_family(
            &mut reg,
            "kv_get_bytes",
            "KV bytes served",
            &per(&kv.namespaces, per_ns, |n| n.get_bytes),
        );
        gauge_family(
            &mut reg,
            "kv_hit_ratio",
            "KV hit ratio per namespace",
            &per(&kv.namespaces, per_ns, |n| n.hit_ratio),
        );
        counter(
            &mut reg,
            "kv_lookups",
            "Keys looked up by Exists/BatchExists/MatchPrefix/EstimateLoad",
            kv.lookups,
        );
        counter(&mut reg, "kv_removes", "KV blocks removed", kv.removes);
        counter(
            &mut reg,
            "kv_puts_already_present",
            "Idempotent KV puts of a cached key",
            kv.puts_already_present,
        );
        counter(
            &mut reg,
            "kv_prefetch_issued",
            "KV blocks staged into the fastest tier by Prefetch",
            kv.prefetch_issued,
        );
        counter(
            &mut reg,
            "kv_prefetch_used",
            "Prefetched KV blocks later read",
            kv.prefetch_used,
        );
        counter(
            &mut reg,
            "kv_prefetch_wasted",
            "Prefetched KV blocks that left the fastest tier unread",
            kv.prefetch_wasted,
        );
        counter(
            &mut reg,
            "kv_prefetch_deferred",
            "KV blocks not staged because the staging backlog was full",
            kv.prefetch_deferred,
        );
        counter(
            &mut reg,
            "kv_rejected",
            "KV requests refused with an error status",
            kv.rejected,
        );
        gauge_family(
            &mut reg,
            "kv_load_latency_us",
            "Load model: fixed cost of a Get per tier",
            &per(&kv.load_model, per_model_tier, |t| t.latency_us),
        );
        gauge_family(
            &mut reg,
            "kv_load_bandwidth_gbps",
            "Load model: Get bandwidth per tier",
            &per(&kv.load_model, per_model_tier, |t| t.bandwidth_gbps),
        );
        if !kv.tenants.is_empty() {
            let per_tenant = |t: &strata_kvcache::stats::TenantStats| {
                vec![("tenant".to_string(), t.tenant.clone())]
            };
            gauge_family(
                &mut reg,
                "kv_tenant_bytes",
                "Bytes of a tenant's KV blocks",
                &per(&kv.tenants, per_tenant, |t| t.used_bytes as f64),
            );
            gauge_family(
                &mut reg,
                "kv_tenant_quota_bytes",
                "A tenant's KV quota",
                &per(&kv.tenants, per_tenant, |t| t.quota_bytes as f64),
            );
            counter_family(
                &mut reg,
                "kv_tenant_quota_evictions",
                "A tenant's KV blocks evicted to keep it within its quota",
                &per(&kv.tenants, per_tenant, |t| t.quota_evictions),
            );
        }
        if let Some(g) = &kv.group {
            render_kv_group_metrics(&mut reg, g);
        }
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &reg);
    out
}

/// The KV service across the cache group (issue 16): routed hits, replication, and
/// per peer (`peer="node-b"`) the KV requests, failures, hedges and block bytes.
fn render_kv_group_metrics(reg: &mut Registry, g: &strata_kvcache::group::GroupKvStats) {
    counter(
        reg,
        "kv_group_remote_hits",
        "KV Gets answered from another node's tiers",
        g.remote_hits,
    );
    counter(
        reg,
        "kv_group_local_hits",
        "KV Gets answered from this node's tiers while in a group",
        g.local_hits,
    );
    counter(
        reg,
        "kv_group_puts_under_replicated",
        "KV Puts stored on fewer than R nodes",
        g.puts_under_replicated,
    );
    counter(
        reg,
        "kv_group_puts_kept_locally",
        "KV Puts no owner could take, kept on this node",
        g.puts_kept_locally,
    );
    counter(
        reg,
        "kv_group_served_for_peers",
        "KV requests served for other nodes",
        g.served_for_peers,
    );
    counter(
        reg,
        "kv_group_served_bytes_out",
        "KV block bytes served to other nodes",
        g.served_bytes_out,
    );
    counter(
        reg,
        "kv_group_served_bytes_in",
        "KV block bytes stored for other nodes",
        g.served_bytes_in,
    );
    let peer = |p: &strata_kvcache::group::PeerStats| vec![("peer".to_string(), p.node.clone())];
    counter_family(
        reg,
        "kv_peer_requests",
        "KV requests forwarded to the peer",
        &per(&g.peers, peer, |p| p.requests),
    );
    counter_family(
        reg,
        "kv_peer_failures",
        "KV requests to the peer that failed (down, timed out)",
        &per(&g.peers, peer, |p| p.failures),
    );
    counter_family(
        reg,
        "kv_peer_hedges",
        "KV Gets also sent to the next replica because the peer was slower than its p99",
        &per(&g.peers, peer, |p| p.hedges),
    );
    counter_family(
        reg,
        "kv_peer_bytes_in",
        "KV block bytes received from the peer",
        &per(&g.peers, peer, |p| p.bytes_in),
    );
    counter_family(
        reg,
        "kv_peer_bytes_out",
        "KV block bytes sent to the peer",
        &per(&g.peers, peer, |p| p.bytes_out),
    );
    gauge_family(
        reg,
        "kv_peer_get_p99_us",
        "Recent p99 of KV Gets from the peer (the hedge delay)",
        &per(&g.peers, peer, |p| p.get_p99_us),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::LocalFilesStats;
    use strata_cache_core::EngineStatsSnapshot;
    use strata_kvcache::KvStatsSnapshot;

    use strata_cache_core::stats::TierStatsSnapshot;

    fn sample() -> DaemonStats {
        DaemonStats {
            version: "0".into(),
            uptime_secs: 3.0,
            engine: EngineStatsSnapshot {
                tiers: vec![TierStatsSnapshot {
                    name: "memory".into(),
                    used_bytes: 100,
                    capacity_bytes: 1000,
                    hits: 3,
                    misses: 1,
                    evictions: 7,
                    policy_recency_periods: 2,
                    policy_frequency_periods: 4,
                    ..Default::default()
                }],
                fills: 4,
                fill_bytes: 4096,
                ..Default::default()
            },
            kv: Some(KvStatsSnapshot {
                namespaces: vec![strata_kvcache::stats::NamespaceStats {
                    namespace: "m/t".into(),
                    hits: 9,
                    misses: 1,
                    hit_ratio: 0.9,
                    ..Default::default()
                }],
                prefetch_issued: 2,
                tenants: vec![strata_kvcache::stats::TenantStats {
                    tenant: "acme".into(),
                    used_bytes: 3 << 20,
                    quota_bytes: 4 << 20,
                    quota_evictions: 12,
                }],
                load_model: vec![strata_kvcache::stats::TierLoadEstimate {
                    tier: "memory".into(),
                    latency_us: 50.0,
                    bandwidth_gbps: 16.0,
                    inflight_bytes: 0,
                }],
                ..Default::default()
            }),
            mounts: vec![],
            peer: Some(crate::daemon::peer_metrics::PeerStats {
                node: "node-a".into(),
                peers: [(
                    "node-b".to_string(),
                    crate::daemon::peer_metrics::PeerCounters {
                        requests_out: 2,
                        bytes_in: 2048,
                        ..Default::default()
                    },
                )]
                .into(),
                store_gets: 5,
                store_bytes: 5120,
                ..Default::default()
            }),
            cluster: None,
            local_files: Some(LocalFilesStats {
                copies: 2,
                copy_bytes: 300,
                staged_bytes: 700,
                budget_bytes: 1000,
            }),
        }
    }

    /// The Grafana dashboard in the repo (`deploy/grafana`) only queries metrics the
    /// daemon exports: a renamed metric fails here, not on an operator's screen.
    #[test]
    fn the_grafana_dashboard_queries_only_exported_metrics() {
        let text = render_metrics(&sample());
        // Every family the daemon registers, whether or not the sample fills it.
        let mut exported = std::collections::HashSet::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                if let (Some(name), Some(kind)) = (it.next(), it.next()) {
                    exported.insert(name.to_string());
                    if kind == "counter" {
                        exported.insert(format!("{name}_total"));
                    }
                }
            }
        }
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/grafana/strata-dashboard.json"
        );
        let dash: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("dashboard in the repo"))
                .expect("dashboard is JSON");
        let mut exprs = Vec::new();
        fn walk<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
            match v {
                serde_json::Value::Object(m) => {
                    for (k, x) in m {
                        match (k.as_str(), x.as_str()) {
                            ("expr" | "query", Some(e)) => out.push(e),
                            _ => walk(x, out),
                        }
                    }
                }
                serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
                _ => {}
            }
        }
        walk(&dash, &mut exprs);
        assert!(exprs.len() >= 10, "{} queries", exprs.len());
        let mut used = 0;
        for e in exprs {
            for (i, _) in e.match_indices("strata_") {
                let name: String = e[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    exported.contains(name.as_str()),
                    "{name} (in {e:?}) is not exported"
                );
                used += 1;
            }
        }
        assert!(used >= 15);
    }

    #[test]
    fn metrics_carry_the_stats_figures() {
        let text = render_metrics(&sample());
        for line in [
            "strata_tier_used_bytes{tier=\"memory\"} 100",
            "strata_peer_bytes_in_total{peer=\"node-b\"} 2048",
            "strata_store_read_bytes_total 5120",
            "strata_tier_capacity_bytes{tier=\"memory\"} 1000",
            "strata_tier_hits_total{tier=\"memory\"} 3",
            "strata_tier_evictions_total{tier=\"memory\"} 7",
            "strata_tier_policy_recency_periods_total{tier=\"memory\"} 2",
            "strata_tier_policy_frequency_periods_total{tier=\"memory\"} 4",
            "strata_tier_hit_ratio{tier=\"memory\"} 0.75",
            "strata_fill_bytes_total 4096",
            "strata_kv_hits_total{namespace=\"m/t\"} 9",
            "strata_kv_hit_ratio{namespace=\"m/t\"} 0.9",
            "strata_kv_prefetch_issued_total 2",
            "strata_kv_tenant_quota_evictions_total{tenant=\"acme\"} 12",
            "strata_kv_tenant_quota_bytes{tenant=\"acme\"} 4194304",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    /// The 0.0.4 text of the same figures: counters typed by their `_total` names, no
    /// OpenMetrics-only lines, every sample kept.
    #[test]
    fn metrics_convert_to_the_prometheus_text_format() {
        let om = render_metrics(&sample());
        let text = openmetrics_to_text_004(&om);
        assert!(
            text.contains("# TYPE strata_tier_hits_total counter\n"),
            "{text}"
        );
        assert!(text.contains("# HELP strata_tier_hits_total "), "{text}");
        assert!(text.contains("# TYPE strata_tier_used_bytes gauge\n"));
        assert!(!text.contains("# EOF") && !text.contains("# UNIT "));
        let samples = |t: &str| t.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(samples(&text), samples(&om));
        // Every sample's family is typed, by the sample's own name (0.0.4's rule).
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().expect("name");
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "untyped sample {name}"
            );
        }
    }
}
