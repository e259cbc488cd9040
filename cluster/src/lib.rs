//! The cache group (issue 16): many daemons, one cache.
//!
//! - [`placement`]: which nodes own a key, by weighted rendezvous (highest-random-weight)
//!   hashing over the members' ids, weighted by capacity. Pure: no I/O, no clocks.
//! - [`membership`]: the group's members on etcd. Each daemon registers its
//!   [`NodeInfo`] under a lease it keeps alive and watches the group; the current
//!   members are a [`Membership`] snapshot in a `tokio::sync::watch`. A node that stops
//!   renewing leaves after the lease TTL; while etcd is unreachable a node keeps the last
//!   membership it saw (kept on disk too, for a start without etcd: `snapshot`) and
//!   re-registers when etcd returns.
//!
//! - [`bindings`]: the KV namespaces' model-identity bindings, one per namespace for
//!   the whole group on etcd, so a member that joins later refuses another model too.
//! - [`hedge`]: the peer read path's decisions (which node to ask, when to hedge with
//!   the store, when to pause a failing peer, whether to keep a remote block). Pure.
//! - [`peer`]: the peer data plane's wire side: the `strata.peer.v1` services, the
//!   group token on both ends, a pool of channels to the members. The daemon serves it
//!   and its readers use it, building a [`Placement`] from each membership snapshot
//!   and dialing the owners' `advertise` addresses.

pub mod bindings;
pub mod hedge;
pub mod membership;
pub mod peer;
pub mod placement;
mod snapshot;
#[cfg(feature = "testing")]
pub mod testing;

pub use bindings::{Binding, SharedBindings};
pub use membership::{
    read_group, GroupConfig, Member, Membership, NodeId, NodeInfo, DEFAULT_PREFIX,
};
pub use placement::Placement;

/// What can go wrong in the group logic.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("invalid cluster configuration: {0}")]
    Config(String),
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error("etcd ended the {0} stream")]
    StreamEnded(&'static str),
    #[error("the lease of this node expired before it was renewed")]
    LeaseExpired,
    #[error("the watch of the group was cancelled by etcd (compacted revision {0})")]
    WatchCancelled(i64),
    #[error("node record {key}: {source}")]
    BadRecord {
        key: String,
        source: serde_json::Error,
    },
    #[error("encoding the node record: {0}")]
    Encode(serde_json::Error),
    #[error("etcd failed less than {0:?} ago; not asked again yet")]
    Resting(std::time::Duration),
    #[error("node id {id} is registered by another live daemon (at {at}); give each daemon its own node_id")]
    IdTaken { id: String, at: String },
}
