//! Per-peer counters of the cache group's data plane, for `/stats` and `/metrics`
//! (`strata_peer_*{peer="node-b"}`). A short lock per event, never across an await.

use std::collections::BTreeMap;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// One peer's counters, as this node saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCounters {
    /// Blocks this node asked the peer for, and the bytes that came back verified.
    pub requests_out: u64,
    pub bytes_in: u64,
    /// Blocks the peer asked this node for, and the bytes served.
    pub requests_in: u64,
    pub bytes_out: u64,
    /// Asks that failed (unreachable, error, bad checksum).
    pub errors: u64,
    /// Reads answered by the store instead of the peer (error or slower than the hedge).
    pub fallbacks: u64,
    /// Store fetches started because the peer was slower than its recent p99.
    pub hedges: u64,
}

/// This node's data-plane figures: per peer, and its own store reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerStats {
    pub node: String,
    pub peers: BTreeMap<String, PeerCounters>,
    /// Ranged GETs this node sent to the store and their bytes (its own misses, the
    /// blocks it owns, and fallbacks).
    pub store_gets: u64,
    pub store_bytes: u64,
    /// Remote blocks kept in this node's tiers (admitted as hot) and not kept.
    pub remote_kept: u64,
    pub remote_not_kept: u64,
}

#[derive(Debug, Default)]
pub struct PeerMetrics {
    node: String,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    peers: BTreeMap<String, PeerCounters>,
    remote_kept: u64,
    remote_not_kept: u64,
}

impl PeerMetrics {
    pub fn new(node: impl Into<String>) -> Self {
        PeerMetrics {
            node: node.into(),
            inner: Mutex::default(),
        }
    }

    fn with(&self, peer: &str, f: impl FnOnce(&mut PeerCounters)) {
        let mut g = self.inner.lock();
        match g.peers.get_mut(peer) {
            Some(c) => f(c),
            None => f(g.peers.entry(peer.to_string()).or_default()),
        }
    }

    /// This node served `bytes` to `peer`.
    pub fn served(&self, peer: &str, bytes: u64) {
        self.with(peer, |c| {
            c.requests_in += 1;
            c.bytes_out += bytes;
        });
    }

    /// This node asked `peer` for a block.
    pub fn asked(&self, peer: &str) {
        self.with(peer, |c| c.requests_out += 1);
    }

    /// `peer` answered with `bytes` verified bytes.
    pub fn received(&self, peer: &str, bytes: u64) {
        self.with(peer, |c| c.bytes_in += bytes);
    }

    pub fn error(&self, peer: &str) {
        self.with(peer, |c| c.errors += 1);
    }

    pub fn fallback(&self, peer: &str) {
        self.with(peer, |c| c.fallbacks += 1);
    }

    pub fn hedge(&self, peer: &str) {
        self.with(peer, |c| c.hedges += 1);
    }

    pub fn kept(&self, kept: bool) {
        let mut g = self.inner.lock();
        if kept {
            g.remote_kept += 1;
        } else {
            g.remote_not_kept += 1;
        }
    }

    /// The figures now, with the store's read counters.
    pub fn snapshot(&self, store_reads: (u64, u64)) -> PeerStats {
        let g = self.inner.lock();
        PeerStats {
            node: self.node.clone(),
            peers: g.peers.clone(),
            store_gets: store_reads.0,
            store_bytes: store_reads.1,
            remote_kept: g.remote_kept,
            remote_not_kept: g.remote_not_kept,
        }
    }
}
