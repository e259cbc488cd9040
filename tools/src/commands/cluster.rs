//! `strata cluster status [--json]`: the cache group's members and each one's share of
//! the keys, read from etcd directly (it works while every daemon is down, and shows
//! what the daemons themselves will see).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;
use strata_cluster::{read_group, GroupConfig, Membership, Placement};

use crate::config::StrataConfig;

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The members of the group and each one's expected share of the keys.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The `strata.toml` whose `[cluster]` names the etcd endpoints and the group.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// etcd endpoints (instead of, or overriding, the config's).
    #[arg(long = "etcd", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// The group (instead of, or overriding, the config's).
    #[arg(long)]
    pub group: Option<String>,
    /// Owners of each KV block, for the shares of copies (default: the config's, else 2).
    #[arg(long)]
    pub replication: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: ClusterCommand) -> anyhow::Result<()> {
    match cmd {
        ClusterCommand::Status(args) => status(args),
    }
}

fn status(args: StatusArgs) -> anyhow::Result<()> {
    let group = group_of(&args)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let m = rt
        .block_on(read_group(&group))
        .with_context(|| format!("reading group {:?} from {:?}", group.group, group.endpoints))?;
    let replication = match (args.replication, &args.config) {
        (Some(r), _) => r,
        (None, Some(p)) => StrataConfig::load(p)?
            .cluster
            .map_or(crate::config::default_replication(), |c| c.replication),
        (None, None) => crate::config::default_replication(),
    };
    let report = Report::new(&group.group, &m, replication);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{}", report.render());
    }
    Ok(())
}

fn group_of(args: &StatusArgs) -> anyhow::Result<GroupConfig> {
    let from_file = match &args.config {
        Some(p) => StrataConfig::load(p)?.cluster,
        None => None,
    };
    let mut g = match (&from_file, args.group.as_deref()) {
        (Some(c), _) => c.group_config(),
        (None, Some(name)) => GroupConfig::new(Vec::new(), name),
        (None, None) => anyhow::bail!("give --config (with a [cluster] section) or --group"),
    };
    if let Some(name) = &args.group {
        g.group = name.clone();
    }
    if !args.etcd.is_empty() {
        g.endpoints = args.etcd.clone();
    }
    g.check()?;
    Ok(g)
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub group: String,
    pub revision: i64,
    pub nodes: Vec<NodeReport>,
}

#[derive(Debug, Serialize)]
pub struct NodeReport {
    pub id: String,
    pub advertise: String,
    pub zone: String,
    pub capacity: std::collections::BTreeMap<String, u64>,
    /// The fraction of the KV blocks' copies placement gives this node with the
    /// group's replication: with R = 1 its weight over the group's; above, a node holds
    /// at most one copy of a block (`Placement::expected_copy_shares`).
    pub share: f64,
}

impl Report {
    pub fn new(group: &str, m: &Membership, replication: usize) -> Report {
        let shares: std::collections::BTreeMap<_, _> = Placement::from_membership(m)
            .expected_copy_shares(replication)
            .into_iter()
            .collect();
        Report {
            group: group.to_string(),
            revision: m.revision,
            nodes: m
                .nodes
                .iter()
                .map(|(id, n)| NodeReport {
                    id: id.to_string(),
                    advertise: n.advertise.clone(),
                    zone: n.zone.clone(),
                    capacity: n.capacity.clone(),
                    share: shares.get(id).copied().unwrap_or(0.0),
                })
                .collect(),
        }
    }

    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "group {}: {} node(s) (etcd revision {})",
            self.group,
            self.nodes.len(),
            self.revision
        );
        let _ = writeln!(
            out,
            "{:<20} {:<24} {:<10} {:>12} {:>7}",
            "node", "advertise", "zone", "capacity", "share"
        );
        for n in &self.nodes {
            let total: u64 = n.capacity.values().sum();
            let _ = writeln!(
                out,
                "{:<20} {:<24} {:<10} {:>12} {:>6.1}%",
                n.id,
                n.advertise,
                if n.zone.is_empty() { "-" } else { &n.zone },
                human_bytes(total),
                n.share * 100.0
            );
        }
        out
    }
}

/// Bytes in the largest binary unit that keeps the number at least 1 ("48.0 MiB").
fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use strata_cluster::{NodeId, NodeInfo};

    /// Shares follow capacity: a node with three times the bytes gets three times the
    /// keys; the table and the JSON say so.
    #[test]
    fn status_reports_shares_from_capacity() {
        let mut m = Membership::default();
        for (id, gib) in [("a", 1u64), ("b", 3)] {
            m.nodes.insert(
                NodeId::new(id),
                NodeInfo {
                    id: NodeId::new(id),
                    advertise: format!("{id}:7073"),
                    capacity: BTreeMap::from([("disk".to_string(), gib << 30)]),
                    zone: String::new(),
                    admin: String::new(),
                },
            );
        }
        let r = Report::new("g", &m, 1);
        assert_eq!(r.nodes.len(), 2);
        assert!((r.nodes[0].share - 0.25).abs() < 1e-9);
        assert!((r.nodes[1].share - 0.75).abs() < 1e-9);
        let text = r.render();
        assert!(text.contains("25.0%") && text.contains("75.0%"), "{text}");
        assert!(text.contains("3.0 GiB"), "{text}");
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["nodes"][1]["id"], "b");
    }
}
