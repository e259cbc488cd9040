//! `[cluster]`: the daemon's place in the cache group (issue 16). It registers this node
//! (id, advertise address, capacity per tier, zone) on etcd and follows the group; the
//! membership is logged as it changes and kept for the peer data plane, which will build
//! its placement from [`ClusterHandle::membership`].

use std::collections::BTreeMap;

use anyhow::Context;
use strata_cluster::{Member, Membership, NodeId, NodeInfo, Placement};
use tokio::sync::watch;

use crate::config::{parse_size, CacheConfig, ClusterConfig};

/// The running membership of this daemon.
pub struct ClusterHandle {
    member: Member,
    pub node: NodeId,
    pub replication: usize,
    logger: tokio::task::JoinHandle<()>,
}

impl ClusterHandle {
    /// The group as this node sees it, and its changes.
    pub fn membership(&self) -> watch::Receiver<Membership> {
        self.member.membership()
    }

    /// Leaves the group at once (revokes the lease) instead of after the TTL.
    pub async fn leave(self) {
        self.logger.abort();
        self.member.leave().await;
    }
}

/// This node's record: the tiers' budgets are its capacity (its placement weight).
pub fn node_info(c: &ClusterConfig, cache: &CacheConfig) -> anyhow::Result<NodeInfo> {
    let mut capacity = BTreeMap::new();
    capacity.insert(
        "memory".to_string(),
        parse_size(&cache.memory).context("[cache] memory")?,
    );
    capacity.insert(
        "disk".to_string(),
        parse_size(&cache.disk).context("[cache] disk")?,
    );
    if let Some(gpu) = cache.gpu_tier()? {
        capacity.insert("gpu".to_string(), gpu.bytes);
    }
    Ok(NodeInfo {
        id: NodeId::new(c.node_id()?),
        advertise: c.advertise.clone(),
        capacity,
        zone: c.zone.clone(),
    })
}

/// Starts the membership; returns at once (etcd may be down: the node keeps trying and
/// serves as a single node meanwhile).
pub fn start(c: &ClusterConfig, cache: &CacheConfig) -> anyhow::Result<ClusterHandle> {
    let me = node_info(c, cache)?;
    let node = me.id.clone();
    let member = Member::start(c.group_config(), me).context("starting cluster membership")?;
    let mut rx = member.membership();
    let group = c.group.clone();
    let logger = tokio::spawn(async move {
        let mut last: Option<(Vec<NodeId>, bool)> = None;
        while rx.changed().await.is_ok() {
            let m = rx.borrow_and_update().clone();
            let now = (m.ids(), m.connected);
            if last.as_ref() != Some(&now) {
                let placement = Placement::from_membership(&m);
                tracing::info!(
                    group = %group,
                    connected = m.connected,
                    members = %now.0.iter().map(NodeId::as_str).collect::<Vec<_>>().join(","),
                    owning = placement.len(),
                    "cache group membership"
                );
                last = Some(now);
            }
        }
    });
    Ok(ClusterHandle {
        member,
        node,
        replication: c.replication,
        logger,
    })
}
