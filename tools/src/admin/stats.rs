//! The figures the admin API serves (`/stats` as JSON; `/metrics` renders the same).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use strata_cache_core::EngineStatsSnapshot;
use strata_kvcache::KvStatsSnapshot;

/// One mount of the daemon, as the stats report it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MountInfo {
    pub mountpoint: PathBuf,
    pub prefix: String,
    /// What the mount has done since it started (None from a daemon that did not say).
    #[serde(default)]
    pub stats: Option<MountStats>,
}

/// A mount's counters (see `strata_fs::filesystem::Counters`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MountStats {
    pub writable: bool,
    pub lookups: u64,
    pub store_heads: u64,
    pub store_lists: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub prefetch_files: u64,
    pub prefetch_files_used: u64,
    pub prefetch_files_wasted: u64,
    pub passthrough_opens: u64,
    pub passthrough_copies: u64,
    pub uploads: u64,
    pub upload_bytes: u64,
    pub upload_failures: u64,
    pub uploads_streamed: u64,
    pub deletes: u64,
    pub renames: u64,
    /// Reads that failed, of which ESTALE (a replaced version).
    #[serde(default)]
    pub read_errors: u64,
    #[serde(default)]
    pub read_stale: u64,
    /// Store requests that failed after their retries (or at once while the store
    /// was paused as silent), and ranged GETs that returned data.
    #[serde(default)]
    pub store_failures: u64,
    /// Attempts the store failed (an error or no answer in time), those retried to
    /// success included: a store throttling while the retries win shows here.
    #[serde(default)]
    pub store_failed_attempts: u64,
    /// Cached attributes and listings, in their estimated bytes, and inodes held.
    #[serde(default)]
    pub metadata_bytes: u64,
    #[serde(default)]
    pub inodes: u64,
}

impl MountStats {
    pub fn of(core: &strata_fs::FsCore) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let c = core.counters();
        let meta = core.metadata_cached_now();
        MountStats {
            writable: core.writable(),
            lookups: c.lookups.load(Relaxed),
            store_heads: core.store_heads(),
            store_lists: core.store_lists(),
            reads: c.reads.load(Relaxed),
            read_bytes: c.read_bytes.load(Relaxed),
            prefetch_files: c.prefetch_files.load(Relaxed),
            prefetch_files_used: c.prefetch_files_used.load(Relaxed),
            prefetch_files_wasted: c.prefetch_files_wasted.load(Relaxed),
            passthrough_opens: c.passthrough_opens.load(Relaxed),
            passthrough_copies: c.passthrough_copies.load(Relaxed),
            uploads: c.uploads.load(Relaxed),
            upload_bytes: c.upload_bytes.load(Relaxed),
            upload_failures: c.upload_failures.load(Relaxed),
            uploads_streamed: c.uploads_streamed.load(Relaxed),
            deletes: c.deletes.load(Relaxed),
            renames: c.renames.load(Relaxed),
            read_errors: c.read_errors.load(Relaxed),
            read_stale: c.read_stale.load(Relaxed),
            store_failures: core.store_failures(),
            store_failed_attempts: core.store_failed_attempts(),
            metadata_bytes: meta.bytes,
            inodes: meta.inodes,
        }
    }
}

/// Everything `GET /stats` returns. A new part of the daemon (next: the access
/// tracker's per-stream classification) adds its own field, `#[serde(default)]` so a
/// `strata stats` of another version still reads the answer.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DaemonStats {
    pub version: String,
    pub uptime_secs: f64,
    pub engine: EngineStatsSnapshot,
    pub kv: Option<KvStatsSnapshot>,
    pub mounts: Vec<MountInfo>,
    /// The cache group as this node sees it (issue 16); None: a single node.
    #[serde(default)]
    pub cluster: Option<ClusterMembers>,
    /// The cache group's data plane (issue 16): per-peer bytes and requests, this
    /// node's store reads. None: a single node.
    #[serde(default)]
    pub peer: Option<crate::daemon::peer_metrics::PeerStats>,
    /// The mounts' local files: passthrough copies and staged writes, within the disk
    /// budget's share for them. None: no disk budget (or a daemon that did not say).
    #[serde(default)]
    pub local_files: Option<LocalFilesStats>,
}

/// What the daemon's mounts keep as plain local files (`strata_fs::PassthroughStore`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LocalFilesStats {
    pub copies: u64,
    pub copy_bytes: u64,
    /// Bytes of files being written through the mounts, not yet uploaded and removed.
    pub staged_bytes: u64,
    pub budget_bytes: u64,
}

impl LocalFilesStats {
    pub fn of(s: &strata_fs::PassthroughStore) -> Self {
        LocalFilesStats {
            copies: s.len() as u64,
            copy_bytes: s.bytes(),
            staged_bytes: s.staged_bytes(),
            budget_bytes: s.budget(),
        }
    }
}

/// The group's members as one node sees them: what `strata stats --cluster` starts
/// from (each member's admin address, to ask it for its own figures).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterMembers {
    pub node: String,
    /// False while etcd is unreachable (the members are the last ones seen).
    pub connected: bool,
    /// Why the group keeps this node out, while it does (another live daemon holds
    /// its node id); its KV calls are refused meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    pub members: Vec<ClusterMember>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterMember {
    pub id: String,
    pub advertise: String,
    /// Empty: the member serves no admin API.
    pub admin: String,
    /// The share of the KV blocks' copies placement gives it with the group's
    /// replication (`Placement::expected_copy_shares`: with R = 1 its capacity over the
    /// group's; above, at most one copy of a block per node).
    pub expected_share: f64,
}
