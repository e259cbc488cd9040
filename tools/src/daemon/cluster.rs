//! `[cluster]`: the daemon's place in the cache group (issue 16). It registers this node
//! (id, advertise address, capacity per tier, zone) on etcd and follows the group; the
//! membership is logged as it changes, saved in the cache dir ([`MEMBERSHIP_FILE`], for
//! a start while etcd is down) and kept for the peer data plane, which builds its
//! placement from [`ClusterHandle::membership`].

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
    /// The KV namespaces' identity bindings the group shares (on the same etcd).
    pub bindings: std::sync::Arc<strata_cluster::SharedBindings>,
    logger: tokio::task::JoinHandle<()>,
    /// The watch of the binding records' changes (`SharedBindings::watch_changes`).
    binding_changes: tokio::task::JoinHandle<()>,
}

impl ClusterHandle {
    /// The group as this node sees it, and its changes.
    pub fn membership(&self) -> watch::Receiver<Membership> {
        self.member.membership()
    }

    /// Leaves the group at once (revokes the lease) instead of after the TTL.
    pub async fn leave(self) {
        self.logger.abort();
        self.binding_changes.abort();
        self.member.leave().await;
    }
}

/// This node's record: the tiers' budgets are its capacity (its placement weight);
/// `admin`: its admin API's bound address, if it serves one.
pub fn node_info(
    c: &ClusterConfig,
    cache: &CacheConfig,
    admin: Option<std::net::SocketAddr>,
) -> anyhow::Result<NodeInfo> {
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
        admin: admin.map(|a| a.to_string()).unwrap_or_default(),
    })
}

/// The file in the cache dir that keeps the last membership etcd gave this node.
pub const MEMBERSHIP_FILE: &str = "cluster-membership.json";

/// Starts the membership; returns at once. etcd may be down: the node keeps trying and
/// routes meanwhile by the last membership it saved in `cache_dir` ([`MEMBERSHIP_FILE`]),
/// or, with none saved, keeps its Puts locally (see [`MembershipView`]).
pub fn start(
    c: &ClusterConfig,
    cache: &CacheConfig,
    admin: Option<std::net::SocketAddr>,
    cache_dir: &std::path::Path,
) -> anyhow::Result<ClusterHandle> {
    let me = node_info(c, cache, admin)?;
    let node = me.id.clone();
    let member =
        Member::start_with_snapshot(c.group_config(), me, Some(cache_dir.join(MEMBERSHIP_FILE)))
            .context("starting cluster membership")?;
    let bindings = std::sync::Arc::new(
        strata_cluster::SharedBindings::new(c.group_config())
            .context("the group's KV namespace bindings")?,
    );
    let binding_changes = bindings.watch_changes();
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
        bindings,
        logger,
        binding_changes,
    })
}

/// The group as the KV service routes by it (`strata_kvcache::group::GroupView`): the
/// last membership seen (kept while etcd is away), placed by weighted rendezvous.
pub struct MembershipView {
    me: NodeId,
    me_str: std::sync::Arc<str>,
    replication: usize,
    rx: watch::Receiver<Membership>,
    bindings: std::sync::Arc<strata_cluster::SharedBindings>,
    /// The placement of the last membership revision seen (rebuilt when it changes, so
    /// a lookup costs the owners' scores only).
    cache: std::sync::Mutex<Option<Placed>>,
    /// Whether the "no membership known" warning was logged since the last membership.
    warned_unknown: std::sync::atomic::AtomicBool,
}

struct Placed {
    revision: i64,
    ids: Vec<NodeId>,
    placement: Placement,
    table: Vec<strata_kvcache::group::PeerNode>,
    index: std::collections::HashMap<NodeId, usize>,
}

impl MembershipView {
    pub fn new(
        me: NodeId,
        replication: usize,
        rx: watch::Receiver<Membership>,
        bindings: std::sync::Arc<strata_cluster::SharedBindings>,
    ) -> Self {
        MembershipView {
            me_str: std::sync::Arc::from(me.as_str()),
            me,
            replication: replication.max(1),
            rx,
            bindings,
            cache: std::sync::Mutex::new(None),
            warned_unknown: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn place(&self, m: &Membership) -> Placed {
        let placement = Placement::from_membership(m);
        let mut table = Vec::new();
        let mut index = std::collections::HashMap::new();
        for (id, info) in &m.nodes {
            index.insert(id.clone(), table.len());
            table.push(strata_kvcache::group::PeerNode {
                id: std::sync::Arc::from(id.as_str()),
                addr: std::sync::Arc::from(info.advertise.as_str()),
                local: *id == self.me,
            });
        }
        Placed {
            revision: m.revision,
            ids: m.ids(),
            placement,
            table,
            index,
        }
    }
}

impl strata_kvcache::group::GroupView for MembershipView {
    fn local_id(&self) -> std::sync::Arc<str> {
        self.me_str.clone()
    }

    fn refused(&self) -> Option<String> {
        self.rx.borrow().refused.clone()
    }

    fn registrations(&self) -> u64 {
        self.rx.borrow().registrations
    }

    fn changed_bindings(&self) -> strata_kvcache::group::ChangedBindings {
        let d = self.bindings.take_changed();
        strata_kvcache::group::ChangedBindings {
            namespaces: d.namespaces,
            all: d.all,
        }
    }

    fn shared_binding(
        &self,
        namespace: &str,
        identity: &[u8; 32],
        since_ms: u64,
        op: strata_kvcache::group::SharedBindingOp,
    ) -> strata_kvcache::group::SharedBindingAnswer {
        use strata_kvcache::group::{GroupBinding, SharedBindingOp};
        let bindings = self.bindings.clone();
        let namespace = namespace.to_string();
        let identity = *identity;
        Box::pin(async move {
            let r = match op {
                SharedBindingOp::Bind => bindings
                    .bind(&namespace, &identity, since_ms)
                    .await
                    .map(Some),
                SharedBindingOp::Publish => bindings
                    .publish(&namespace, &identity, since_ms)
                    .await
                    .map(Some),
                SharedBindingOp::Check => bindings
                    .check(&namespace, &identity, since_ms)
                    .await
                    .map(Some),
                SharedBindingOp::Withdraw => bindings
                    .withdraw(&namespace, &identity)
                    .await
                    .map(|()| None),
            };
            match r {
                Ok(bound) => bound.map(|b| GroupBinding {
                    identity: b.identity,
                    since_ms: b.since_ms,
                }),
                Err(strata_cluster::ClusterError::Resting(_)) => None,
                Err(e) => {
                    // The node's own binding decides meanwhile (as without the group's).
                    tracing::warn!(namespace = %namespace, error = %e, "the group's KV namespace binding could not be asked");
                    None
                }
            }
        })
    }

    fn routes(&self, keys: &[Vec<u8>]) -> Option<strata_kvcache::group::Routes> {
        let m = self.rx.borrow();
        // (A call with no keys only refreshes the members: no put to warn about, and
        // the router makes one at start, before etcd had time to answer.)
        if m.nodes.is_empty() && !m.connected && !keys.is_empty() {
            // etcd never answered and no membership was saved: the group is unknown,
            // not a group of one. Routes with no candidate make each Put kept on this
            // node and counted so (`puts_kept_locally`), where serving as a single node
            // acknowledged them as normal puts that no other member would ever ask
            // this node for (black-box finding).
            if !self
                .warned_unknown
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::warn!(node = %self.me,
                    "no group membership known yet (etcd unreachable, none saved): KV puts are kept on this node only until etcd answers");
            }
            return Some(strata_kvcache::group::Routes {
                nodes: vec![strata_kvcache::group::PeerNode {
                    id: self.me_str.clone(),
                    addr: std::sync::Arc::from(""),
                    local: true,
                }],
                candidates: vec![Vec::new(); keys.len()],
                replication: self.replication,
            });
        }
        self.warned_unknown
            .store(false, std::sync::atomic::Ordering::Relaxed);
        // No other member: a group of one, the single node of today.
        if m.nodes.keys().all(|id| *id == self.me) {
            return None;
        }
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let stale = cache
            .as_ref()
            .is_none_or(|p| p.revision != m.revision || p.ids.len() != m.nodes.len());
        if stale {
            *cache = Some(self.place(&m));
        }
        drop(m);
        let p = cache.as_ref()?;
        // The R owners and the next node: a Put's substitute for a dead owner, and
        // the owner-to-be once the dead node's lease expires.
        let candidates = keys
            .iter()
            .map(|k| {
                p.placement
                    .owners(k, self.replication + 1)
                    .iter()
                    .filter_map(|id| p.index.get(id).copied())
                    .collect()
            })
            .collect();
        Some(strata_kvcache::group::Routes {
            nodes: p.table.clone(),
            candidates,
            replication: self.replication,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_kvcache::group::GroupView;

    fn view(m: Membership) -> MembershipView {
        let cfg = strata_cluster::GroupConfig::new(vec!["http://127.0.0.1:1".into()], "g");
        let bindings =
            std::sync::Arc::new(strata_cluster::SharedBindings::new(cfg).expect("bindings"));
        let (_tx, rx) = watch::channel(m);
        MembershipView::new(NodeId::new("me"), 2, rx, bindings)
    }

    fn info(id: &str) -> NodeInfo {
        NodeInfo {
            id: NodeId::new(id),
            advertise: format!("{id}:7073"),
            capacity: BTreeMap::from([("memory".to_string(), 1u64 << 30)]),
            zone: String::new(),
            admin: String::new(),
        }
    }

    /// Black-box finding: a daemon that never reached etcd (and had no membership
    /// saved) served as a group of one, acknowledging Puts as normal ones that no other
    /// member would ask it for. Its routes now have no candidate, so each Put is kept
    /// locally and counted so; a known group of one still serves as a single node.
    #[test]
    fn an_unknown_membership_is_not_a_group_of_one() {
        let unknown = view(Membership::default());
        let r = unknown
            .routes(&[b"k1".to_vec(), b"k2".to_vec()])
            .expect("routes");
        assert_eq!(r.candidates, vec![Vec::<usize>::new(), Vec::new()]);
        assert_eq!(r.nodes.len(), 1);
        assert!(r.nodes[0].local);

        let mut alone = Membership {
            connected: true,
            ..Membership::default()
        };
        alone.nodes.insert(NodeId::new("me"), info("me"));
        assert!(view(alone.clone()).routes(&[b"k".to_vec()]).is_none());
        // The same membership kept while etcd is away: still a group of one.
        alone.connected = false;
        assert!(view(alone).routes(&[b"k".to_vec()]).is_none());
    }
}
