//! The group's members, on etcd.
//!
//! Each member writes its [`NodeInfo`] as JSON to `/<prefix>/<group>/nodes/<node id>`,
//! attached to a lease of `lease_ttl` that it renews every third of the TTL; etcd deletes
//! the record when the lease runs out, so a crashed or partitioned node leaves the group
//! after at most the TTL. Each member also reads the group and then watches it from the
//! revision it read, so its [`Membership`] follows every join and leave in etcd's order.
//!
//! When etcd cannot be reached, the member keeps publishing the last membership it saw
//! (marked `connected: false`) and retries with a bounded exponential backoff; once
//! etcd answers it registers again under a new lease and re-reads the group. A member
//! never decides on its own that another one left: only etcd's lease expiry does, so
//! every member sees the same sequence of memberships. With a snapshot file
//! ([`Member::start_with_snapshot`]) the last membership etcd gave is also kept on
//! disk, and a start that cannot reach etcd begins from it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, Event, EventType, GetOptions, PutOptions, Txn,
    TxnOp, TxnOpResponse, WatchOptions,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::ClusterError;

/// The default root of the group keys: `/strata/<group>/nodes/...`.
pub const DEFAULT_PREFIX: &str = "strata";

/// A member's id, unique in its group (the host name is the usual choice).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(String);

impl NodeId {
    pub fn new(id: impl Into<String>) -> NodeId {
        NodeId(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a member tells the group about itself (the JSON record in etcd).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    /// Where the peers reach this node's peer service (`host:port`).
    pub advertise: String,
    /// Bytes per tier (`"gpu"`, `"memory"`, `"disk"`): the placement weighs nodes by
    /// their total.
    #[serde(default)]
    pub capacity: BTreeMap<String, u64>,
    /// Failure domain (rack, availability zone); empty when not configured.
    #[serde(default)]
    pub zone: String,
    /// `host:port` of the node's admin API (`/stats`), for `strata stats --cluster`;
    /// empty when it serves none.
    #[serde(default)]
    pub admin: String,
}

impl NodeInfo {
    /// The node's placement weight: its total capacity in bytes (0: owns nothing).
    pub fn weight(&self) -> f64 {
        self.capacity.values().map(|b| *b as f64).sum()
    }
}

/// The group as one member last saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Membership {
    pub nodes: BTreeMap<NodeId, NodeInfo>,
    /// The etcd revision this snapshot reflects (0 before the first read).
    pub revision: i64,
    /// False while etcd is unreachable: `nodes` is then the last membership seen.
    pub connected: bool,
    /// Why this node is kept out of the group, while it is: another live daemon holds
    /// its node id ([`ClusterError::IdTaken`]). Cleared once it registers.
    pub refused: Option<String>,
    /// The etcd revision that created each member's record: of two records at one
    /// advertise address the later one is the live daemon ([`crate::Placement`]).
    pub created: BTreeMap<NodeId, i64>,
    /// Times this node registered (a session with etcd began, or its record was
    /// written again after a delete): what etcd held may be gone since the last one
    /// (etcd restored empty, the group's keys deleted), so records this node keeps
    /// there, its KV namespace bindings, are written again at each (black-box finding:
    /// after etcd lost its data the members registered again but left their bindings
    /// out for up to 3 hours, and a second model took a namespace over).
    pub registrations: u64,
}

impl Membership {
    pub fn ids(&self) -> Vec<NodeId> {
        self.nodes.keys().cloned().collect()
    }
}

/// Where the group lives and how its members keep their place in it.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// etcd client URLs (`http://10.0.0.5:2379`).
    pub endpoints: Vec<String>,
    /// Root of the keys ([`DEFAULT_PREFIX`]); several groups share one etcd by name.
    pub prefix: String,
    pub group: String,
    /// How long a silent member stays in the group. etcd counts leases in whole
    /// seconds, so this is rounded up to at least 1 s.
    pub lease_ttl: Duration,
    /// Bound of one etcd call (connect, grant, put, get), so a hung etcd is treated as a
    /// down one.
    pub call_timeout: Duration,
    /// Backoff between reconnection attempts: doubles from `backoff_min` up to
    /// `backoff_max`, reset after a session that registered.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl GroupConfig {
    /// A group with the defaults below for the timing knobs.
    pub fn new(endpoints: Vec<String>, group: impl Into<String>) -> GroupConfig {
        GroupConfig {
            endpoints,
            prefix: DEFAULT_PREFIX.to_string(),
            group: group.into(),
            // 10 s: a crashed node's keys are re-placed within 10 s, while a GC pause or
            // a short network blip (renewals every ~3 s) does not evict a live node.
            lease_ttl: Duration::from_secs(10),
            // 3 s: far above a healthy etcd's latency, short enough that a member
            // notices a dead etcd well within one lease TTL.
            call_timeout: Duration::from_secs(3),
            // 100 ms .. 5 s: quick to come back after a restart, without hammering an
            // etcd that is down for longer.
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }

    /// The checks that need no I/O.
    pub fn check(&self) -> Result<(), ClusterError> {
        if self.endpoints.is_empty() {
            return Err(ClusterError::Config("no etcd endpoints".into()));
        }
        check_segment("group", &self.group)?;
        if self.prefix.trim_matches('/').is_empty() {
            return Err(ClusterError::Config("empty key prefix".into()));
        }
        if self.lease_ttl.is_zero() || self.call_timeout.is_zero() {
            return Err(ClusterError::Config(
                "lease TTL and call timeout must be positive".into(),
            ));
        }
        if self.lease_ttl > MAX_LEASE_TTL {
            // etcd refuses leases past its own bound (a node then never joined and said
            // only "connected: false"), and a dead member would hold its share of the
            // keys for that long anyway.
            return Err(ClusterError::Config(format!(
                "lease TTL {:?} is over {:?}: a dead node would stay in the group that long",
                self.lease_ttl, MAX_LEASE_TTL
            )));
        }
        if self.backoff_min.is_zero() || self.backoff_max < self.backoff_min {
            return Err(ClusterError::Config(
                "backoff_min must be positive and at most backoff_max".into(),
            ));
        }
        Ok(())
    }

    /// `/<prefix>/<group>/nodes/`: the key prefix every member record lives under.
    pub fn nodes_prefix(&self) -> String {
        format!("/{}/{}/nodes/", self.prefix.trim_matches('/'), self.group)
    }

    fn node_key(&self, id: &NodeId) -> String {
        format!("{}{}", self.nodes_prefix(), id)
    }

    fn lease_secs(&self) -> i64 {
        let ms = self.lease_ttl.as_millis();
        ms.div_ceil(1000).max(1) as i64
    }
}

/// Longest lease a member may ask for: one hour.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(3600);

/// Group names and node ids become key segments: no slashes, nothing empty.
pub fn check_segment(what: &str, s: &str) -> Result<(), ClusterError> {
    if s.is_empty() || s.contains('/') || s.chars().any(char::is_control) {
        return Err(ClusterError::Config(format!(
            "{what} {s:?} must be non-empty, without '/' or control characters"
        )));
    }
    Ok(())
}

/// One daemon's place in the group: registration, lease renewal and the watch, in a
/// background task. Dropping it stops the task without revoking the lease (as a crash
/// would: the record goes after the TTL); [`Member::leave`] leaves at once.
pub struct Member {
    membership: watch::Receiver<Membership>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Member {
    /// Starts registering `me` in the group and following it. Returns at once; the
    /// membership is empty (`revision` 0, not connected: the group is unknown) until
    /// etcd first answers.
    pub fn start(cfg: GroupConfig, me: NodeInfo) -> Result<Member, ClusterError> {
        Member::start_with_snapshot(cfg, me, None)
    }

    /// As [`Member::start`], keeping the last membership etcd gave in the file
    /// `snapshot` ([`crate::snapshot`]): the membership starts from the one saved there
    /// (not connected) rather than empty, so a daemon restarted while etcd is down
    /// still knows its group.
    pub fn start_with_snapshot(
        cfg: GroupConfig,
        me: NodeInfo,
        snapshot: Option<std::path::PathBuf>,
    ) -> Result<Member, ClusterError> {
        cfg.check()?;
        check_segment("node id", me.id.as_str())?;
        let record = serde_json::to_vec(&me).map_err(ClusterError::Encode)?;
        let first = snapshot
            .as_deref()
            .and_then(|p| crate::snapshot::load(p, &cfg, &me));
        if let Some(m) = &first {
            tracing::info!(node = %me.id, members = m.nodes.len(),
                "starting from the last membership saved; etcd's replaces it once it answers");
        }
        let (tx, rx) = watch::channel(first.unwrap_or_default());
        let (stop_tx, stop_rx) = oneshot::channel();
        if let Some(path) = snapshot {
            // Ends with the member task, which holds the sender.
            tokio::spawn(save_changes(cfg.clone(), path, rx.clone()));
        }
        let task = tokio::spawn(run(cfg, me.id, record, tx, stop_rx));
        Ok(Member {
            membership: rx,
            stop: Some(stop_tx),
            task: Some(task),
        })
    }

    /// The current membership and its changes.
    pub fn membership(&self) -> watch::Receiver<Membership> {
        self.membership.clone()
    }

    /// Leaves the group: revokes the lease (the others see the leave at once, not after
    /// the TTL) and stops the task.
    pub async fn leave(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Writes each membership etcd gave (connected) whose members differ from the last
/// written to `path`. A failed write is logged and tried again at the next change: the
/// file only matters at a start without etcd.
async fn save_changes(
    cfg: GroupConfig,
    path: std::path::PathBuf,
    mut rx: watch::Receiver<Membership>,
) {
    let mut written: Option<(BTreeMap<NodeId, NodeInfo>, BTreeMap<NodeId, i64>)> = None;
    loop {
        let now = {
            let m = rx.borrow_and_update();
            (m.connected && m.refused.is_none()).then(|| m.clone())
        };
        if let Some(m) = now {
            let state = (m.nodes.clone(), m.created.clone());
            if written.as_ref() != Some(&state) {
                let (cfg2, path2) = (cfg.clone(), path.clone());
                let r =
                    tokio::task::spawn_blocking(move || crate::snapshot::save(&path2, &cfg2, &m))
                        .await;
                match r {
                    Ok(Ok(())) => written = Some(state),
                    Ok(Err(e)) => {
                        tracing::warn!(path = %path.display(), error = %e, "saving the last membership failed")
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "saving the last membership failed")
                    }
                }
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Reads the group once (for `strata cluster status`).
pub async fn read_group(cfg: &GroupConfig) -> Result<Membership, ClusterError> {
    cfg.check()?;
    let mut client = connect(cfg).await?;
    read(&mut client, cfg).await
}

pub(crate) async fn connect(cfg: &GroupConfig) -> Result<Client, ClusterError> {
    connect_pinging(cfg, cfg.call_timeout).await
}

/// [`connect`] with HTTP/2 pings every `every`: a silently dead etcd (no RST, e.g. a
/// partition) breaks the watch and keepalive streams instead of leaving them hanging.
/// etcd answers pings more often than `--grpc-keepalive-min-time` (5 s) on a connection
/// that carries no data with GOAWAY (too_many_pings): the membership's connection
/// carries lease renewals, a connection with only a quiet watch on it needs a longer
/// period ([`crate::bindings`]).
pub(crate) async fn connect_pinging(
    cfg: &GroupConfig,
    every: Duration,
) -> Result<Client, ClusterError> {
    let options = ConnectOptions::new()
        .with_connect_timeout(cfg.call_timeout)
        .with_keep_alive(every, cfg.call_timeout)
        .with_keep_alive_while_idle(true);
    bounded(cfg, Client::connect(&cfg.endpoints, Some(options))).await
}

pub(crate) async fn bounded<T>(
    cfg: &GroupConfig,
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, ClusterError> {
    match tokio::time::timeout(cfg.call_timeout, call).await {
        Ok(r) => r.map_err(ClusterError::from),
        Err(_) => Err(ClusterError::Timeout(cfg.call_timeout)),
    }
}

async fn read(client: &mut Client, cfg: &GroupConfig) -> Result<Membership, ClusterError> {
    let prefix = cfg.nodes_prefix();
    let resp = bounded(
        cfg,
        client.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let mut m = Membership {
        revision: resp.header().map(|h| h.revision()).unwrap_or(0),
        connected: true,
        ..Membership::default()
    };
    for kv in resp.kvs() {
        let Some(id) = id_of(cfg, kv.key()) else {
            continue;
        };
        if let Some(info) = parse_record(kv.key(), kv.value()) {
            m.created.insert(id.clone(), kv.create_revision());
            m.nodes.insert(id, info);
        }
    }
    Ok(m)
}

/// The node id a record's key names (records are keyed by id, so the key wins over
/// whatever id the JSON claims).
fn id_of(cfg: &GroupConfig, key: &[u8]) -> Option<NodeId> {
    let id = key.strip_prefix(cfg.nodes_prefix().as_bytes())?;
    std::str::from_utf8(id).ok().map(NodeId::new)
}

/// A record that does not parse is left out (logged), not fatal: one bad writer must
/// not take the whole group's view down.
fn parse_record(key: &[u8], value: &[u8]) -> Option<NodeInfo> {
    match serde_json::from_slice::<NodeInfo>(value) {
        Ok(info) => Some(info),
        Err(source) => {
            let e = ClusterError::BadRecord {
                key: String::from_utf8_lossy(key).into_owned(),
                source,
            };
            tracing::warn!(error = %e, "ignoring a node record");
            None
        }
    }
}

/// The member task: sessions with etcd, separated by backoff, until stopped.
async fn run(
    cfg: GroupConfig,
    me: NodeId,
    record: Vec<u8>,
    tx: watch::Sender<Membership>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut backoff = cfg.backoff_min;
    loop {
        let mut registered = false;
        let outcome = session(&cfg, &me, &record, &tx, &mut stop, &mut registered).await;
        match outcome {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, node = %me, "etcd session ended; keeping the last membership");
                let refused = matches!(e, ClusterError::IdTaken { .. }).then(|| e.to_string());
                tx.send_if_modified(|m| {
                    let changed = m.connected || m.refused != refused;
                    m.connected = false;
                    m.refused = refused;
                    changed
                });
            }
        }
        if registered {
            backoff = cfg.backoff_min;
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(cfg.backoff_max);
    }
}

/// Whether `events` delete this node's record (then it must be written again), and
/// logs another daemon writing a record under this node's id.
fn own_record_lost(cfg: &GroupConfig, me: &NodeId, record: &[u8], events: &[Event]) -> bool {
    let mut lost = false;
    for ev in events {
        let Some(kv) = ev.kv() else { continue };
        if id_of(cfg, kv.key()).as_ref() != Some(me) {
            continue;
        }
        match ev.event_type() {
            EventType::Delete => lost = true,
            EventType::Put => {
                lost = false;
                if kv.value() != record {
                    tracing::error!(node = %me, record = %String::from_utf8_lossy(kv.value()),
                        "another daemon registered under this node's id: the group reaches it, \
                         not this node, until it leaves; give each daemon its own node_id");
                }
            }
        }
    }
    lost
}

/// Writes this node's record under `lease`, unless another daemon's record holds the
/// id: one that names another peer address (a copied config, a second daemon given the
/// same `node_id`). That one is left alone (`IdTaken`; the session retries with
/// backoff, so this daemon joins once the other's lease runs out), where before the
/// newcomer overwrote it and took its keys over (black-box finding: reads through the
/// group of the first daemon's blocks fell from 60/60 to 42/60). A record of this
/// node's own address (its previous run, whose lease has not run out yet) is taken
/// over.
async fn register(
    cfg: &GroupConfig,
    client: &mut Client,
    me: &NodeId,
    record: &[u8],
    lease: i64,
) -> Result<(), ClusterError> {
    let key = cfg.node_key(me);
    let held = match create_or_read(cfg, client, &key, record, lease, "registration").await? {
        Created::Created => return Ok(()),
        Created::Held { value, .. } => value,
    };
    let mine = serde_json::from_slice::<NodeInfo>(record).map(|n| n.advertise);
    let theirs = serde_json::from_slice::<NodeInfo>(&held).map(|n| n.advertise);
    match (mine, theirs) {
        (Ok(a), Ok(b)) if a != b => Err(ClusterError::IdTaken {
            id: me.to_string(),
            at: b,
        }),
        // Its own earlier record (or one nobody can read): replaced, only if it is
        // still the one read.
        _ => match replace_if_same(cfg, client, &key, held, record, lease).await? {
            true => Ok(()),
            false => Err(ClusterError::StreamEnded("registration")),
        },
    }
}

/// Deletes the records of other ids that name this node's advertise address: only one
/// daemon listens there, this one, so they are its earlier runs under another node_id
/// (black-box finding: a daemon restarted under a new id was two members until the old
/// lease ran out, and R=2 put both copies of a fifth of the blocks on that one
/// machine). Each is deleted only if unchanged since it was read.
async fn retire_stale_records(
    cfg: &GroupConfig,
    client: &mut Client,
    me: &NodeId,
    record: &[u8],
) -> Result<(), ClusterError> {
    let Ok(mine) = serde_json::from_slice::<NodeInfo>(record) else {
        return Ok(());
    };
    if mine.advertise.is_empty() {
        return Ok(());
    }
    let prefix = cfg.nodes_prefix();
    let resp = bounded(
        cfg,
        client.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
    )
    .await?;
    for kv in resp.kvs() {
        let Some(id) = id_of(cfg, kv.key()) else {
            continue;
        };
        if id == *me {
            continue;
        }
        match serde_json::from_slice::<NodeInfo>(kv.value()) {
            Ok(info) if info.advertise == mine.advertise => {}
            _ => continue,
        }
        let key = kv.key().to_vec();
        let unchanged = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::delete(key, None)]);
        if bounded(cfg, client.txn(unchanged)).await?.succeeded() {
            tracing::warn!(node = %me, stale = %id, advertise = %mine.advertise,
                "retired the record of another node id at this node's address (an earlier run of this daemon)");
        }
    }
    Ok(())
}

/// What a create-only write of a record found ([`create_or_read`]).
enum Created {
    Created,
    /// A record was there: its value.
    Held {
        value: Vec<u8>,
    },
}

/// Writes `value` at `key` under `lease` if no record is there (one transaction), else
/// reads the record there. A record deleted between the compare and the read is
/// `StreamEnded(what)`: the caller tries again from the top.
async fn create_or_read(
    cfg: &GroupConfig,
    client: &mut Client,
    key: &str,
    value: &[u8],
    lease: i64,
    what: &'static str,
) -> Result<Created, ClusterError> {
    let absent = Txn::new()
        .when([Compare::version(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            value.to_vec(),
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key, None)]);
    let resp = bounded(cfg, client.txn(absent)).await?;
    if resp.succeeded() {
        return Ok(Created::Created);
    }
    resp.op_responses()
        .into_iter()
        .find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| Created::Held {
                value: kv.value().to_vec(),
            }),
            _ => None,
        })
        .ok_or(ClusterError::StreamEnded(what))
}

/// Writes `value` at `key` under `lease` only if the record there still holds `held`;
/// whether it did.
async fn replace_if_same(
    cfg: &GroupConfig,
    client: &mut Client,
    key: &str,
    held: Vec<u8>,
    value: &[u8],
    lease: i64,
) -> Result<bool, ClusterError> {
    let same = Txn::new()
        .when([Compare::value(key, CompareOp::Equal, held)])
        .and_then([TxnOp::put(
            key,
            value.to_vec(),
            Some(PutOptions::new().with_lease(lease)),
        )]);
    Ok(bounded(cfg, client.txn(same)).await?.succeeded())
}

/// One session: connect, register under a fresh lease, read the group, then renew and
/// follow the watch until an error (Err) or a stop (Ok, after revoking the lease).
async fn session(
    cfg: &GroupConfig,
    me: &NodeId,
    record: &[u8],
    tx: &watch::Sender<Membership>,
    stop: &mut oneshot::Receiver<()>,
    registered: &mut bool,
) -> Result<(), ClusterError> {
    let mut client = connect(cfg).await?;
    let lease = bounded(cfg, client.lease_grant(cfg.lease_secs(), None))
        .await?
        .id();
    // A fresh lease each session: the one of a previous session may have expired while
    // etcd was away, taking the record with it. Writing the record again under the new
    // lease also moves it off the old one, whose expiry then deletes nothing.
    if let Err(e) = register(cfg, &mut client, me, record, lease).await {
        let _ = bounded(cfg, client.lease_revoke(lease)).await;
        return Err(e);
    }
    *registered = true;
    if let Err(e) = retire_stale_records(cfg, &mut client, me, record).await {
        // Placement counts one node per address anyway; the stale record goes at its
        // lease's end.
        tracing::warn!(node = %me, error = %e, "retiring stale records at this node's address failed");
    }
    let (mut keeper, mut renewals) = bounded(cfg, client.lease_keep_alive(lease)).await?;

    let mut snapshot = read(&mut client, cfg).await?;
    snapshot.registrations = tx.borrow().registrations + 1;
    let mut watch_stream = bounded(
        cfg,
        client.watch(
            cfg.nodes_prefix(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(snapshot.revision + 1),
            ),
        ),
    )
    .await?;
    tx.send_replace(snapshot);

    // Renew three times per TTL: two renewals may be lost before the lease runs out.
    let mut tick = tokio::time::interval((cfg.lease_ttl / 3).max(Duration::from_millis(100)));
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = &mut *stop => {
                // Leave at once rather than after the TTL; best effort (bounded).
                let _ = bounded(cfg, client.lease_revoke(lease)).await;
                return Ok(());
            }
            _ = tick.tick() => {
                if last_renewal.elapsed() > cfg.lease_ttl {
                    // No answer for a whole TTL: the lease may be gone; start over.
                    return Err(ClusterError::Timeout(cfg.lease_ttl));
                }
                bounded(cfg, keeper.keep_alive()).await?;
            }
            renewal = renewals.message() => {
                match renewal? {
                    Some(r) if r.ttl() > 0 => last_renewal = tokio::time::Instant::now(),
                    Some(_) => return Err(ClusterError::LeaseExpired),
                    None => return Err(ClusterError::StreamEnded("lease keepalive")),
                }
            }
            event = watch_stream.message() => {
                let Some(resp) = event? else {
                    return Err(ClusterError::StreamEnded("watch"));
                };
                if resp.canceled() {
                    return Err(ClusterError::WatchCancelled(resp.compact_revision()));
                }
                let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
                if own_record_lost(cfg, me, record, resp.events()) {
                    // Deleted by hand, or by another daemon that took this node's id and
                    // left: written again, or the group would route around this node
                    // for good while it said "connected" (black-box finding).
                    tracing::warn!(node = %me, "this node's membership record was deleted; registering again");
                    bounded(
                        cfg,
                        client.put(
                            cfg.node_key(me),
                            record.to_vec(),
                            Some(PutOptions::new().with_lease(lease)),
                        ),
                    )
                    .await?;
                    tx.send_modify(|m| m.registrations += 1);
                }
                tx.send_if_modified(|m| {
                    let before = (m.nodes.clone(), m.created.clone());
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        let Some(id) = id_of(cfg, kv.key()) else { continue };
                        match ev.event_type() {
                            EventType::Put => {
                                if let Some(info) = parse_record(kv.key(), kv.value()) {
                                    m.created.insert(id.clone(), kv.create_revision());
                                    m.nodes.insert(id, info);
                                }
                            }
                            EventType::Delete => {
                                m.nodes.remove(&id);
                                m.created.remove(&id);
                            }
                        }
                    }
                    m.revision = m.revision.max(revision);
                    (&m.nodes, &m.created) != (&before.0, &before.1)
                });
            }
        }
    }
}
