//! `strata.toml`: one file configures the store, the cache tiers, the KV service and
//! the mounts of one daemon. Every field has a default, so an empty file (or none) runs.
//! This module is only the data and its checks; `crate::daemon` builds the daemon from
//! it (`strata serve` reads the file, `strata mount` fills the same structs from flags).
//!
//! ```toml
//! [store]
//! url = "s3://bucket/prefix"          # or file:///data, memory://, gs://, az://
//! endpoint = "http://127.0.0.1:9000"  # S3-compatible servers
//! allow_http = true
//! # credentials: from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...,
//! # as object_store reads them), or the secret from a file readable by the daemon only:
//! secret_access_key_file = "/etc/strata/s3-secret"
//! follow_symlinks = false            # file://: links out of the root stay invisible
//!
//! [cache]
//! dir = "/var/cache/strata"           # default: a fresh temp dir
//! memory = "4GiB"
//! disk = "100GiB"
//! policy = "strata"                  # or lru, lfu, arc, 2random, tinylfu
//! gpu = "8GiB"                        # a GPU-memory tier above memory (optional)
//! gpu_device = "0"                    # CUDA ordinal, or "emulated"; required with gpu
//!
//! [kv]
//! listen = "127.0.0.1:7070"
//! shm = "256MiB"                      # same-host zero-copy arena ("0": off)
//!
//! [[kv.tenants]]                      # none: the single-tenant loopback demo
//! name = "team-a"
//! token_file = "/etc/strata/team-a.token"   # or token = "..."
//! namespaces = ["llama3-*"]           # patterns: * any run, ? one character
//! quota = "20GiB"                     # bytes of blocks the tenant may keep cached
//!
//! [admin]
//! listen = "127.0.0.1:7071"
//!
//! [cluster]                           # none: a single node, as before (issue 16)
//! etcd_endpoints = ["http://10.0.0.5:2379"]
//! group = "train-cache"
//! node_id = "node-a"                  # default: the host name
//! advertise = "10.0.0.11:7073"        # where the peers reach this node
//! zone = "rack-1"                     # optional failure domain
//! replication = 2                     # owners of each KV block
//! lease_ttl_secs = 10                 # a silent node leaves the group after this
//! listen = "0.0.0.0:7073"             # the peer service (default: 0.0.0.0:<advertise port>)
//! token_file = "/etc/strata/peer.token"     # the group's shared secret; required off-loopback
//! hedge_min_ms = 2                    # shortest wait for a block's owner before the store
//! keep_remote_after = 0               # keep another node's block on its n-th fetch (0: never)
//!
//! [[mounts]]                          # as `strata mount`; same fields, same defaults
//! mountpoint = "/mnt/data"
//! prefix = "train"                    # a sub-tree of the store (optional)
//! prefetch = "predictors"             # or "window"
//! passthrough_max = "64MiB"           # "0" disables passthrough
//! metadata_ttl = "5s"                # or "indefinite" for immutable datasets
//! read_ahead_kb = 4096
//! allow_writes = false                # true: new files are uploaded at close
//! allow_overwrite = false             # with allow_writes: replace (or append to) objects
//! allow_delete = false                # with allow_writes: rm deletes objects
//! ```

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;
use strata_cache_core::DEFAULT_BLOCK_SIZE;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StrataConfig {
    pub store: StoreConfig,
    pub cache: CacheConfig,
    pub kv: KvConfig,
    pub admin: AdminConfig,
    pub mounts: Vec<MountConfig>,
    /// The cache group; None: a single node.
    pub cluster: Option<ClusterConfig>,
}

/// `[cluster]`: this daemon's membership in a cache group on etcd (issue 16).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd client URLs (`http://host:2379`).
    pub etcd_endpoints: Vec<String>,
    /// The group's name: daemons with the same name (and etcd) form one cache.
    pub group: String,
    /// This node's id in the group; default: the host name, so one config serves every
    /// node of a DaemonSet.
    #[serde(default)]
    pub node_id: Option<String>,
    /// `host:port` the peers reach this node at.
    pub advertise: String,
    /// Failure domain (rack, zone); empty: none.
    #[serde(default)]
    pub zone: String,
    /// Owners of each KV block. 2: one node can crash without losing a block.
    #[serde(default = "default_replication")]
    pub replication: usize,
    /// Seconds a node that stopped renewing stays in the group. 10: a crash is noticed
    /// within 10 s, while renewals every ~3 s ride out short blips.
    #[serde(default = "default_lease_ttl_secs")]
    pub lease_ttl_secs: u64,
    /// Root of the group's keys in etcd (several groups, or other users, share one
    /// etcd).
    #[serde(default = "default_cluster_prefix")]
    pub prefix: String,
    /// Where the peer service (`strata.peer.v1`, and the KV routing service) listens.
    /// None: `0.0.0.0:<advertise port>`, so the advertised port is reachable on every
    /// interface without repeating it (behind NAT or a pod IP, set both).
    #[serde(default)]
    pub listen: Option<String>,
    /// The group's shared secret (one line): peers send it as a bearer token and refuse
    /// calls without it. Required unless the peer service listens on loopback only.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Shortest wait (ms) for a block's owner before this node also asks the store
    /// (the wait is otherwise the owner's measured p99). 2: below it a hedge mostly
    /// doubles store traffic for jitter. Tests raise it so that every block is read
    /// from the store exactly once.
    #[serde(default = "default_hedge_min_ms")]
    pub hedge_min_ms: u64,
    /// Keep a copy of a block another node owns on its n-th fetch from the owner; 0
    /// (default): never, so the group's capacity adds up (see
    /// `strata_cluster::hedge::RemoteAdmission`).
    #[serde(default)]
    pub keep_remote_after: u32,
}

fn default_hedge_min_ms() -> u64 {
    2
}

pub(crate) fn default_replication() -> usize {
    2
}

fn default_lease_ttl_secs() -> u64 {
    10
}

fn default_cluster_prefix() -> String {
    strata_cluster::DEFAULT_PREFIX.to_string()
}

impl ClusterConfig {
    /// The checks that need no I/O.
    pub fn check(&self) -> anyhow::Result<()> {
        for e in &self.etcd_endpoints {
            if e.starts_with("https://") {
                bail!("[cluster] etcd endpoint {e:?}: TLS to etcd is not supported yet; use http:// on a private network");
            }
            if !e.starts_with("http://") {
                bail!("[cluster] etcd endpoint {e:?} must be an http:// URL");
            }
        }
        if self.replication == 0 {
            bail!("[cluster] replication must be at least 1");
        }
        let (host, port) = self.advertise.rsplit_once(':').with_context(|| {
            format!("[cluster] advertise {:?} must be host:port", self.advertise)
        })?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            bail!("[cluster] advertise {:?} must be host:port", self.advertise);
        }
        if let Some(id) = &self.node_id {
            strata_cluster::membership::check_segment("[cluster] node_id", id)?;
        }
        let listen = self.peer_listen()?;
        if self.token_file.is_none() && !listen.ip().is_loopback() {
            bail!(
                "[cluster] the peer service listens on {listen}, beyond this host: refusing \
                 without the group's token (set token_file), or listen on loopback"
            );
        }
        self.group_config().check()?;
        Ok(())
    }

    /// The address the peer service binds: `listen`, or every interface on the
    /// advertised port.
    pub fn peer_listen(&self) -> anyhow::Result<std::net::SocketAddr> {
        match &self.listen {
            Some(l) => l
                .parse()
                .with_context(|| format!("[cluster] listen {l:?} must be ip:port")),
            None => {
                let port = self
                    .advertise
                    .rsplit_once(':')
                    .and_then(|(_, p)| p.parse::<u16>().ok())
                    .with_context(|| {
                        format!("[cluster] advertise {:?} must be host:port", self.advertise)
                    })?;
                Ok(std::net::SocketAddr::from(([0, 0, 0, 0], port)))
            }
        }
    }

    /// The group token from `token_file`; None without one (loopback-only groups).
    pub fn token(&self) -> anyhow::Result<Option<String>> {
        self.token_file
            .as_deref()
            .map(|p| read_secret_file(p).context("[cluster] token_file"))
            .transpose()
    }

    /// The group as the membership code takes it.
    pub fn group_config(&self) -> strata_cluster::GroupConfig {
        let mut g = strata_cluster::GroupConfig::new(self.etcd_endpoints.clone(), &self.group);
        g.prefix = self.prefix.clone();
        g.lease_ttl = std::time::Duration::from_secs(self.lease_ttl_secs);
        g
    }

    /// This node's id: `node_id`, or the host name.
    pub fn node_id(&self) -> anyhow::Result<String> {
        if let Some(id) = &self.node_id {
            return Ok(id.clone());
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("[cluster] node_id unset and the host name unreadable")?;
        let host = host.trim();
        if host.is_empty() {
            bail!("[cluster] node_id unset and the host name is empty");
        }
        Ok(host.to_string())
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Store URL; default: a local directory is required on the command line.
    pub url: Option<String>,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    /// The secret inline (kept for existing configs; prefer the environment or
    /// `secret_access_key_file`). Unset: `AWS_SECRET_ACCESS_KEY` etc. from the
    /// environment, read by the store client itself.
    pub secret_access_key: Option<String>,
    /// A file holding the secret (trailing newline ignored), so it is never in a
    /// command line (`ps`) nor in the config file.
    pub secret_access_key_file: Option<PathBuf>,
    pub allow_http: bool,
    /// `file://` stores: follow symlinks that lead out of the store's root. Off: such
    /// entries are left out of listings and not found, and no write, rename or delete
    /// goes through them, so a link planted in a dataset can neither expose nor replace
    /// other files through the mount.
    pub follow_symlinks: bool,
    /// Benchmarks only: latency (ms) added to every store request and a bandwidth
    /// ("200MB") shared by this daemon's store reads, as the in-process benches inject
    /// them (`strata bench cluster` runs daemons as child processes). 0 / None: off.
    pub inject_latency_ms: u64,
    pub inject_bandwidth: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Directory of the disk tier; None: a temp dir removed at exit.
    pub dir: Option<PathBuf>,
    /// CPU-memory tier budget (e.g. "1GiB"). 1 GiB: room for a working set of small
    /// files and hot blocks without crowding the training job out of RAM.
    pub memory: String,
    /// Disk budget (e.g. "10GiB"; "0": nothing on disk): everything Strata writes
    /// under the cache dir, the disk tier's blocks and the mounts' local files (a
    /// quarter of it, at most 4 GiB, with mounts; see `daemon::cache::passthrough_share`):
    /// their passthrough copies and the files written through them until uploaded (these
    /// evict copies, and are not refused past the share: `strata_fs::PassthroughStore`).
    /// A daemon without mounts gives the disk tier all of it.
    pub disk: String,
    /// File block size. 1 MiB: see `strata_cache_core::DEFAULT_BLOCK_SIZE`.
    pub block_size: String,
    /// Eviction policy of every tier: `strata` (the pattern-aware policy: scans cannot
    /// push out hot data, shuffled epochs keep a stable subset, skewed reads are ranked
    /// by frequency; docs/PATTERNS.md), or a baseline (`lru`, `lfu`, `arc`, `2random`,
    /// `tinylfu`) for comparison. `tinylfu` admits a new block only if it is estimated
    /// more frequent than its victim, so it refuses KV puts that lose that contest
    /// (`RESOURCE_EXHAUSTED ... did not admit`): all of them once the disk holds blocks
    /// read before (round 25); use another policy for a KV service.
    pub policy: String,
    /// Fetch and cache units of file reads (issue 13): `auto` reads a small read (at
    /// most 64 KiB) of a stream the tracker classifies random or skewed, in a file of at
    /// least 16 blocks and over 3/4 of the cache (all tiers), through the aligned 4-64
    /// KiB unit around it instead of its whole block; a second miss in a block with a
    /// unit cached fetches the block, unless the stream reads mostly in small pieces and
    /// the file is over twice the cache (`strata_cache_core::granularity` has the
    /// reasons and figures); `block` always reads whole blocks. `auto` by default: on
    /// the recorded SQLite lookups it is 0.75 / 0.74 / 0.62x the best baseline's JCT at
    /// 10 / 20 / 40% of the file with 1.45 / 1.29 / 1.35x its byte hit ratio, and through
    /// the mount (43 MB database, 8 MiB cache) it moved 230 MB from the store where
    /// whole blocks moved 3.3 GB (docs/BENCHMARKS.md, "Skewed small reads of a large
    /// file").
    pub read_units: String,
    /// GPU-memory tier budget (e.g. "8GiB"), the fastest level, above memory and disk.
    /// None (or "0"): no GPU tier. Off by default: device memory belongs to the training
    /// or inference job unless the operator hands some of it to the cache.
    pub gpu: Option<String>,
    /// Device of the GPU tier: a CUDA ordinal ("0"; needs a build with the `cuda`
    /// feature) or "emulated" (host memory standing in for a device, for machines
    /// without a GPU). Required with `gpu`: the device is never chosen silently, so a
    /// daemon never runs on the emulated device believing it has a GPU.
    pub gpu_device: Option<String>,
}

/// The device a GPU tier lives on (`[cache] gpu_device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuDevice {
    /// Host memory standing in for device memory.
    Emulated,
    /// CUDA device with this ordinal.
    Cuda(usize),
}

/// A configured GPU tier: its budget and device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuTierConfig {
    pub bytes: u64,
    pub device: GpuDevice,
}

impl CacheConfig {
    /// The fetch and cache units `read_units` names.
    pub fn granularity(&self) -> anyhow::Result<strata_cache_core::granularity::Granularity> {
        use strata_cache_core::granularity::Granularity;
        match self.read_units.trim() {
            "auto" => Ok(Granularity::default()),
            "block" => Ok(Granularity::BLOCKS),
            other => bail!(
                "[cache] read_units = {other:?}: expected \"auto\" (sub-block units for \
                 small random reads) or \"block\" (whole blocks always)"
            ),
        }
    }

    /// The GPU tier `gpu` and `gpu_device` ask for; None when `gpu` is unset or "0".
    /// Either field without the other is an error that says what to write.
    pub fn gpu_tier(&self) -> anyhow::Result<Option<GpuTierConfig>> {
        let bytes = match self.gpu.as_deref() {
            Some(s) => parse_size(s).context("[cache] gpu")?,
            None => 0,
        };
        let Some(device) = self.gpu_device.as_deref().map(str::trim) else {
            if bytes == 0 {
                return Ok(None);
            }
            bail!(
                "[cache] gpu = {:?} needs a device: add gpu_device = \"0\" (CUDA device 0; \
                 strata built with --features cuda) or gpu_device = \"emulated\" (host memory \
                 standing in for a GPU, on machines without one)",
                self.gpu.as_deref().unwrap_or_default()
            );
        };
        if bytes == 0 {
            bail!(
                "[cache] gpu_device = {device:?} without a GPU tier size: add gpu = \"1GiB\" \
                 (or remove gpu_device)"
            );
        }
        let device = if device.eq_ignore_ascii_case("emulated") {
            GpuDevice::Emulated
        } else {
            let n = device.parse::<usize>().with_context(|| {
                format!(
                    "[cache] gpu_device = {device:?}: expected a CUDA ordinal (\"0\", \"1\", ...) \
                     or \"emulated\""
                )
            })?;
            GpuDevice::Cuda(n)
        };
        Ok(Some(GpuTierConfig { bytes, device }))
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            dir: None,
            memory: "1GiB".into(),
            disk: "10GiB".into(),
            block_size: DEFAULT_BLOCK_SIZE.to_string(),
            policy: "strata".into(),
            read_units: "auto".into(),
            gpu: None,
            gpu_device: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvConfig {
    /// Serve the KV service at all. On by default (it is half of what the daemon is
    /// for); `strata mount` turns it off, running mounts only.
    pub enabled: bool,
    /// TCP address of the KV service. Loopback by default: any other address needs TLS
    /// and a token.
    pub listen: Option<String>,
    /// Unix socket of the KV service (default: `<cache dir>/kv.sock`).
    pub unix_socket: Option<PathBuf>,
    /// Largest KV block accepted (default 64 MiB, the cache core's limit).
    pub max_block: String,
    /// Smallest KV block accepted (default 1 KiB, the cache core's limit: below it
    /// each block's file, inode and fsyncs cost more than its bytes; see
    /// `strata_kvcache::ServerConfig::min_block`).
    pub min_block: String,
    /// Seconds a Put stream may send nothing, or a Get stream go unread, before it is
    /// aborted and releases what it holds (default 10: see
    /// `strata_kvcache::ServerConfig::idle_timeout`).
    pub idle_timeout_secs: u64,
    /// Most connections each KV listener (TCP, Unix socket) keeps at once; one more
    /// takes the slot of the oldest that has not sent a byte yet, or is closed at
    /// accept when there is none (default 1024: see
    /// `strata_kvcache::ServerConfig::max_connections`).
    pub max_connections: usize,
    /// Seconds a new KV connection may take to send its first bytes (the HTTP/2
    /// preface) before it is closed (default 10: see
    /// `strata_kvcache::ServerConfig::preface_timeout`).
    pub preface_timeout_secs: u64,
    /// PEM certificate and key for TLS (required for non-loopback `listen`).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Bearer token clients must send (required for non-loopback `listen`).
    pub token: Option<String>,
    /// Namespaces served (e.g. "llama3-8b/tenant-a"); empty: any namespace, created
    /// on first put. When set, any other namespace is refused with NOT_FOUND.
    pub namespaces: Vec<String>,
    /// Tenants (`[[kv.tenants]]`): each with its own token, namespace patterns, key
    /// space and byte quota (`strata_kvcache::tenants`). None: the single-tenant demo,
    /// where any client that reaches the service may read, overwrite and remove any
    /// namespace (the daemon says so at start).
    pub tenants: Vec<KvTenantConfig>,
    /// Size of the same-host zero-copy arena (`strata_kvcache::shm`), handed to local
    /// clients over `kv-shm.sock` beside the Unix socket; "0" disables it. Default
    /// 256 MiB: the blocks of a few prefills in flight, shared with clients instead of
    /// copied through the socket. Off with tenants: every attached client maps the
    /// whole arena, so it would show one tenant's blocks to another.
    pub shm: String,
}

/// One `[[kv.tenants]]` entry.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvTenantConfig {
    /// Letters, digits, '-', '_' and '.'; shown in stats.
    pub name: String,
    /// The tenant's bearer token; or `token_file`, a file holding it (kept out of the
    /// config file and of `ps`). Exactly one of the two.
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    /// Namespace patterns the tenant may use: `*` any run of characters, `?` one.
    pub namespaces: Vec<String>,
    /// Bytes of blocks the tenant may keep cached (e.g. "20GiB"); required, so one
    /// tenant cannot fill the cache for all.
    pub quota: String,
}

impl std::fmt::Debug for KvTenantConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvTenantConfig")
            .field("name", &self.name)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .field("namespaces", &self.namespaces)
            .field("quota", &self.quota)
            .finish()
    }
}

/// A secret given inline or in a file (trimmed), for error messages as `what`; None
/// when neither is set, an error when both are.
pub fn secret(
    what: &str,
    inline: Option<&str>,
    file: Option<&Path>,
) -> anyhow::Result<Option<String>> {
    let token = match (inline, file) {
        (Some(_), Some(_)) => bail!("{what}: set token or token_file, not both"),
        (Some(t), None) => t.to_string(),
        (None, Some(f)) => {
            let t = strata_cache_core::state_file::read_operator_text(f)
                .with_context(|| format!("{what}: reading token_file {}", f.display()))?;
            t.trim().to_string()
        }
        (None, None) => return Ok(None),
    };
    // A token travels as `authorization: Bearer <token>`: one that no header can carry
    // would lock its holder out for good (black-box finding: a token_file of two lines
    // started without a word, and its tenant could never authenticate).
    if let Some(bad) = token.chars().find(|c| !c.is_ascii_graphic()) {
        bail!(
            "{what}: the token holds {bad:?}; a token is printable ASCII without spaces \
             (it is sent in an HTTP header)"
        );
    }
    Ok(Some(token))
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            enabled: true,
            listen: Some("127.0.0.1:7070".into()),
            unix_socket: None,
            max_block: "64MiB".into(),
            min_block: "1KiB".into(),
            idle_timeout_secs: 10,
            max_connections: 1024,
            preface_timeout_secs: 10,
            tls_cert: None,
            tls_key: None,
            token: None,
            namespaces: Vec::new(),
            tenants: Vec::new(),
            shm: "256MiB".into(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// HTTP address of the admin API and Prometheus `/metrics`.
    pub listen: Option<String>,
    /// Admin bearer token (or `token_file`). When set, every endpoint but `/healthz`
    /// requires it; without it the API is read-only. Required when `listen` is not
    /// loopback, and when `[[kv.tenants]]` are configured (the stats name every
    /// tenant's namespaces).
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some("127.0.0.1:7071".into()),
            token: None,
            token_file: None,
        }
    }
}

/// One mount: `[[mounts]]` in strata.toml and the flags of `strata mount` are this one
/// struct (the flags are derived from it), with one set of defaults (its `Default`), and
/// `crate::daemon::mount` is the one place a mount is built from it.
#[derive(Clone, Debug, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct MountConfig {
    /// Directory to mount on.
    pub mountpoint: PathBuf,
    /// Sub-tree of the store to mount ("" for all of it).
    #[arg(long, default_value_t = MountConfig::default().prefix)]
    pub prefix: String,
    /// How long listings and attributes are cached: seconds ("5"), a duration ("500ms",
    /// "10m", "2h", "1d") or "indefinite" (for immutable datasets: a cached file never
    /// pays a HEAD or LIST again; new or changed objects need a remount). 5 s: the
    /// `ls`/`stat` storm of a job's start hits the store once, and a dataset updated in
    /// place is seen within seconds (see strata_fs::CoreOptions::metadata_ttl). The
    /// old `metadata_ttl_secs` key is still read.
    #[arg(long = "metadata-ttl", default_value_t = MountConfig::default().metadata_ttl)]
    #[serde(alias = "metadata_ttl_secs")]
    pub metadata_ttl: MetadataTtl,
    /// Let other users read the mount (needs `user_allow_other` for non-root). The
    /// kernel then checks each user against the owner and modes below: restrict them
    /// (`--gid`, `--file-mode 0440`) rather than show every file to every user.
    #[arg(long)]
    pub allow_other: bool,
    /// Owner shown for every file and folder (default: the daemon's user).
    #[arg(long)]
    pub uid: Option<u32>,
    /// Group shown for every file and folder (default: the daemon's group).
    #[arg(long)]
    pub gid: Option<u32>,
    /// Permission bits of every file, in octal (default 0444, 0644 with
    /// `--allow-writes`), as mountpoint-s3's `--file-mode`.
    #[arg(long, value_parser = parse_mode)]
    #[serde(deserialize_with = "mode_from_text", default)]
    pub file_mode: Option<u16>,
    /// Permission bits of every folder, in octal (default 0555, 0755 with
    /// `--allow-writes`).
    #[arg(long, value_parser = parse_mode)]
    #[serde(deserialize_with = "mode_from_text", default)]
    pub dir_mode: Option<u16>,
    /// Prefetching. `predictors` by default: the prefetch crate's rate-following
    /// sequential and semantic next-file predictors, fed every read and listing, which
    /// is what makes a job reading many files in name order find the next one cached;
    /// `window` is per-file window doubling only.
    #[arg(long, value_enum, default_value_t = MountConfig::default().prefetch)]
    pub prefetch: PrefetchMode,
    /// Largest object kept as a plain file in `<cache dir>/passthrough` for FUSE
    /// passthrough ("0" disables it). 64 MiB: files of that size are read whole and
    /// often, and then bypass userspace entirely; larger ones stay in blocks, as do
    /// files larger than half the copies' share of the disk budget.
    #[arg(long, default_value_t = MountConfig::default().passthrough_max)]
    pub passthrough_max: String,
    /// Kernel readahead of the mount in KiB. 4096: four 1 MiB requests in flight per
    /// sequential reader (the kernel's own default is 128 KiB).
    #[arg(long, default_value_t = MountConfig::default().read_ahead_kb)]
    pub read_ahead_kb: u32,
    /// Take writes: new files are staged under the cache dir and uploaded as objects
    /// when closed (checkpoints saved where the data is read). Off by default: a
    /// dataset mount is read-only.
    #[arg(long)]
    pub allow_writes: bool,
    /// With `allow_writes`: an existing object may be replaced (written whole, opened
    /// with O_TRUNC), or, up to 256 MiB, changed (appended to, patched in place: read
    /// into staging at the open, replaced whole at the close).
    #[arg(long, requires = "allow_writes")]
    pub allow_overwrite: bool,
    /// With `allow_writes`: `rm` deletes objects, `mv` renames files and directories.
    #[arg(long, requires = "allow_writes")]
    pub allow_delete: bool,
    /// Unmount when the daemon dies (fusermount3 stays as a watchdog). Off by default,
    /// as in mountpoint-s3: the mountpoint would turn back into a local directory under
    /// the jobs still using it, so what they write there lands on local disk and never
    /// in the store (and is hidden by the next mount). Without it a dead daemon's mount
    /// fails with ENOTCONN until the next mount there replaces it.
    #[arg(long)]
    pub auto_unmount: bool,
}

/// Permission bits in octal ("0640", "640", "0o640"): at most 0o7777.
pub fn parse_mode(text: &str) -> Result<u16, String> {
    let digits = text.trim().trim_start_matches("0o");
    u16::from_str_radix(digits, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{text:?} is not a mode in octal (e.g. 0640)"))
}

fn mode_from_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    text.map(|t| parse_mode(&t).map_err(serde::de::Error::custom))
        .transpose()
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            mountpoint: PathBuf::new(),
            prefix: String::new(),
            metadata_ttl: MetadataTtl::After(std::time::Duration::from_secs(5)),
            allow_other: false,
            uid: None,
            gid: None,
            file_mode: None,
            dir_mode: None,
            prefetch: PrefetchMode::Predictors,
            passthrough_max: "64MiB".into(),
            read_ahead_kb: 4096,
            allow_writes: false,
            allow_overwrite: false,
            allow_delete: false,
            auto_unmount: false,
        }
    }
}

/// How long a mount trusts cached metadata (`--metadata-ttl`, `metadata_ttl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetadataTtl {
    After(std::time::Duration),
    /// For the mount's life (immutable datasets).
    Indefinite,
}

impl MetadataTtl {
    /// The TTL the filesystem core takes.
    pub fn duration(self) -> std::time::Duration {
        match self {
            MetadataTtl::After(d) => d,
            MetadataTtl::Indefinite => strata_fs::METADATA_TTL_INDEFINITE,
        }
    }
}

impl std::fmt::Display for MetadataTtl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetadataTtl::Indefinite => f.write_str("indefinite"),
            MetadataTtl::After(d) if d.subsec_nanos() == 0 => write!(f, "{}s", d.as_secs()),
            MetadataTtl::After(d) => write!(f, "{}ms", d.as_millis()),
        }
    }
}

impl std::str::FromStr for MetadataTtl {
    type Err = anyhow::Error;

    /// "indefinite", plain seconds ("5"), or a number with a unit: ms, s, m, h, d.
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        if t == "indefinite" {
            return Ok(MetadataTtl::Indefinite);
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().with_context(|| {
            format!("bad metadata TTL {s:?} (seconds, 500ms, 10m, 2h, 1d or indefinite)")
        })?;
        let ms = match unit.trim() {
            "ms" => 1,
            "" | "s" => 1_000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            other => bail!("bad metadata TTL unit {other:?} in {s:?}"),
        };
        let ms = n
            .checked_mul(ms)
            .with_context(|| format!("metadata TTL {s:?} is too long; use \"indefinite\""))?;
        Ok(MetadataTtl::After(std::time::Duration::from_millis(ms)))
    }
}

impl<'de> Deserialize<'de> for MetadataTtl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(n) => Ok(MetadataTtl::After(std::time::Duration::from_secs(n))),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// How a mount prefetches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PrefetchMode {
    /// Per-file window doubling (strata_fs::readahead).
    Window,
    /// Sequential + semantic predictors (strata_prefetch).
    Predictors,
}

impl StrataConfig {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = strata_cache_core::state_file::read_operator_text(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let cfg: StrataConfig =
            toml::from_str(&text).with_context(|| format!("parsing config {}", path.display()))?;
        cfg.check()
            .with_context(|| format!("checking config {}", path.display()))?;
        Ok(cfg)
    }

    /// The checks that need no I/O (the daemon repeats them before opening anything),
    /// so a bad file is refused when read.
    pub fn check(&self) -> anyhow::Result<()> {
        self.cache.gpu_tier()?;
        let mut mountpoints: Vec<PathBuf> = Vec::new();
        for m in &self.mounts {
            if m.mountpoint.as_os_str().is_empty() {
                bail!("a [[mounts]] entry needs a mountpoint");
            }
            // (Components: "/x" and "/x/" are one directory; relative paths are taken
            // from the working directory, without following links: no I/O here.)
            let at: PathBuf = std::path::absolute(&m.mountpoint)
                .unwrap_or_else(|_| m.mountpoint.clone())
                .components()
                .collect();
            for other in &mountpoints {
                if *other == at {
                    bail!(
                        "two [[mounts]] entries on {}: one mount per directory",
                        m.mountpoint.display()
                    );
                }
                // A mount inside another hides a folder of the outer one, and the outer
                // cannot be unmounted while the inner stands (black-box finding: a clean
                // stop left the outer mount failing with ENOTCONN).
                if at.starts_with(other) || other.starts_with(&at) {
                    bail!(
                        "[[mounts]] {} and {} are nested: mount them side by side",
                        other.display(),
                        at.display()
                    );
                }
            }
            check_prefix(&m.prefix)?;
            parse_size(&m.passthrough_max).context("[[mounts]] passthrough_max")?;
            mountpoints.push(at);
        }
        if let Some(socket) = &self.kv.unix_socket {
            let socket = std::path::absolute(socket).unwrap_or_else(|_| socket.clone());
            if let Some(mp) = mountpoints.iter().find(|mp| socket.starts_with(mp)) {
                bail!(
                    "[kv] unix_socket {} is inside the mountpoint {}: the mount would hide it",
                    socket.display(),
                    mp.display()
                );
            }
        }
        if !self.mounts.is_empty() && self.store.url.is_none() {
            bail!("[[mounts]] need a [store] url");
        }
        if let Some(c) = &self.cluster {
            c.check()?;
        }
        Ok(())
    }
}

/// Parses "123", "64KiB", "1MiB", "4GiB", "1TiB" (also K/M/G/T, KB/MB/GB as powers of 10).
/// A mount's prefix names a folder of the store: `.`, `..` and empty segments name none
/// (black-box findings: a mount of "./ds" was silently empty and refused every write;
/// one of "a//b" listed `a/b/` and refused every create).
fn check_prefix(prefix: &str) -> anyhow::Result<()> {
    if let Some(why) = strata_cache_core::store::folder_prefix_problem(prefix) {
        bail!("[[mounts]] prefix {prefix:?}: {why}");
    }
    Ok(())
}

pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        anyhow::anyhow!("{s:?} is not a size: a number and a unit, e.g. 64MiB, 2GiB, 500MB")
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => bail!("bad size unit {other:?} in {s:?}"),
    };
    // (An `as` cast would saturate: "99999999999999999999GiB" read as 16 EiB.)
    let bytes = n * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        bail!("size {s:?} is too large");
    }
    Ok(bytes as u64)
}

impl StoreConfig {
    /// The secret key the configuration gives, inline or from its file; None: the store
    /// client takes it from the environment (`AWS_SECRET_ACCESS_KEY`, ...).
    pub fn secret_access_key(&self) -> anyhow::Result<Option<String>> {
        match (&self.secret_access_key, &self.secret_access_key_file) {
            (Some(_), Some(_)) => {
                bail!("[store] secret_access_key and secret_access_key_file are both set; keep one")
            }
            (Some(s), None) => Ok(Some(s.clone())),
            (None, Some(path)) => read_secret_file(path).map(Some),
            (None, None) => Ok(None),
        }
    }
}

/// Reads a secret from `path`: the whole file, trailing newline (or CR LF) removed.
/// Warns when other users can read the file.
pub fn read_secret_file(path: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(path).with_context(|| format!("secret file {}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(
            file = %path.display(),
            "secret file is readable by other users; chmod 600 it"
        );
    }
    let text = strata_cache_core::state_file::read_operator_text(path)
        .with_context(|| format!("reading secret file {}", path.display()))?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        bail!("secret file {} is empty", path.display());
    }
    Ok(secret.to_string())
}

#[cfg(test)]
mod tests {

    /// The `strata.toml` the Kubernetes manifests ship (deploy/kubernetes) parses and
    /// passes the checks, once the DaemonSet has filled in the pod's address.
    #[test]
    fn the_kubernetes_configmap_is_a_valid_config() {
        let yaml = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/kubernetes/strata.yaml"
        ))
        .expect("manifests in the repo");
        let start = yaml
            .find("strata.toml: |")
            .expect("the ConfigMap's strata.toml")
            + 15;
        let toml_text: String = yaml[start..]
            .lines()
            .take_while(|l| !l.starts_with("---"))
            .map(|l| l.strip_prefix("    ").unwrap_or(l.trim()))
            .collect::<Vec<_>>()
            .join("\n")
            .replace("@POD_IP@", "10.0.0.7");
        let cfg: StrataConfig = toml::from_str(&toml_text).expect("parses");
        cfg.check().expect("passes the checks");
        assert_eq!(cfg.mounts.len(), 1);
        assert_eq!(
            cfg.cluster.as_ref().map(|c| c.advertise.as_str()),
            Some("10.0.0.7:7072")
        );
    }
    use super::*;

    /// `[cluster]` parses with its defaults, and the checks refuse what would fail later.
    #[test]
    fn cluster_section_parses_and_is_checked() {
        let ok = r#"
            [cluster]
            etcd_endpoints = ["http://127.0.0.1:2379"]
            group = "g"
            node_id = "a"
            advertise = "10.0.0.1:7073"
        "#;
        let cfg: StrataConfig = toml::from_str(ok).expect("parse");
        // The peer service would listen on every interface: not without the token.
        let err = format!("{:#}", cfg.check().expect_err("no token"));
        assert!(err.contains("token_file"), "{err}");
        let ok = format!("{ok}\ntoken_file = \"/etc/strata/peer.token\"\n");
        let ok = ok.as_str();
        let cfg: StrataConfig = toml::from_str(ok).expect("parse");
        cfg.check().expect("valid");
        let c = cfg.cluster.as_ref().expect("cluster");
        assert_eq!(c.peer_listen().expect("listen").to_string(), "0.0.0.0:7073");
        let local: StrataConfig = toml::from_str(
            "[cluster]\netcd_endpoints = [\"http://127.0.0.1:2379\"]\ngroup = \"g\"\n\
             advertise = \"127.0.0.1:7073\"\nlisten = \"127.0.0.1:7073\"\n",
        )
        .expect("parse");
        local.check().expect("a loopback-only group needs no token");
        assert_eq!((c.replication, c.lease_ttl_secs), (2, 10));
        assert_eq!(c.group_config().nodes_prefix(), "/strata/g/nodes/");
        assert!(StrataConfig::default().cluster.is_none());

        for (bad, why) in [
            (ok.replace("http://127", "https://127"), "TLS"),
            (
                ok.replace("http://127.0.0.1:2379", "127.0.0.1:2379"),
                "http://",
            ),
            (ok.replace("10.0.0.1:7073", "10.0.0.1"), "host:port"),
            (
                ok.replace("node_id = \"a\"", "node_id = \"a/b\""),
                "node_id",
            ),
            (ok.replace("group = \"g\"", "group = \"\""), "group"),
            (ok.replace("[\"http://127.0.0.1:2379\"]", "[]"), "endpoints"),
            (format!("{ok}\nreplication = 0"), "replication"),
            (format!("{ok}\nlisten = \"nowhere\""), "ip:port"),
        ] {
            let cfg: StrataConfig = toml::from_str(&bad).expect("parse");
            let err = format!("{:#}", cfg.check().expect_err(why));
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    /// Finding 9 of issue 12 (secrets): the secret comes from a file (or the
    /// environment), never needs to be on a command line; ambiguity is an error.
    /// Black-box finding (round 13): a token_file of two lines started without a word,
    /// and its holder could never authenticate (no header carries a newline).
    #[test]
    fn a_token_no_header_can_carry_is_refused_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("token");
        std::fs::write(&file, "tok\nother\n").expect("write");
        let e = secret("[[kv.tenants]] \"a\"", None, Some(&file)).expect_err("two lines");
        assert!(format!("{e:#}").contains("printable ASCII"), "{e:#}");
        assert!(secret("[admin]", Some("a b"), None).is_err(), "a space");
        assert!(
            secret("[admin]", Some("t\u{e9}"), None).is_err(),
            "not ASCII"
        );
        std::fs::write(&file, "  tok-1/+=\n").expect("write");
        assert_eq!(
            secret("[admin]", None, Some(&file))
                .expect("one line")
                .as_deref(),
            Some("tok-1/+=")
        );
        assert_eq!(secret("[admin]", None, None).expect("none"), None);
    }

    #[test]
    fn the_secret_key_comes_from_a_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("secret");
        std::fs::write(&file, "s3cr3t/with+chars\n").expect("write");
        let cfg: StrataConfig = toml::from_str(&format!(
            "[store]\nurl = \"s3://b\"\nsecret_access_key_file = \"{}\"\n",
            file.display()
        ))
        .expect("parse");
        assert_eq!(
            cfg.store.secret_access_key().expect("read").as_deref(),
            Some("s3cr3t/with+chars")
        );
        let both = StoreConfig {
            secret_access_key: Some("x".into()),
            ..cfg.store.clone()
        };
        assert!(
            both.secret_access_key().is_err(),
            "inline and file: ambiguous"
        );
        let missing = StoreConfig {
            secret_access_key_file: Some(dir.path().join("nope")),
            ..StoreConfig::default()
        };
        let err = missing.secret_access_key().expect_err("missing file");
        assert!(format!("{err:#}").contains("nope"), "{err:#}");
        std::fs::write(&file, "\n").expect("write");
        assert!(cfg.store.secret_access_key().is_err(), "an empty secret");
        assert_eq!(
            StoreConfig::default().secret_access_key().expect("none"),
            None
        );
    }

    #[test]
    fn one_mount_per_directory() {
        let twice: StrataConfig = toml::from_str(
            "[store]\nurl = \"file:///d\"\n[[mounts]]\nmountpoint = \"/x\"\n[[mounts]]\nmountpoint = \"/x/\"\n",
        )
        .unwrap();
        let e = twice.check().expect_err("one mount per directory");
        assert!(e.to_string().contains("two [[mounts]]"), "{e}");
    }

    fn checked(toml_text: &str) -> anyhow::Result<()> {
        let cfg: StrataConfig = toml::from_str(toml_text).expect("parses");
        cfg.check()
    }

    #[test]
    fn nested_mounts_a_socket_under_a_mount_and_dot_prefixes_are_refused() {
        let store = "[store]\nurl = \"file:///d\"\n";
        let e = checked(&format!(
            "{store}[[mounts]]\nmountpoint = \"/m1\"\n[[mounts]]\nmountpoint = \"/m1/ds\"\n"
        ))
        .expect_err("nested");
        assert!(e.to_string().contains("nested"), "{e}");
        checked(&format!(
            "{store}[[mounts]]\nmountpoint = \"/m1\"\n[[mounts]]\nmountpoint = \"/m10\"\n"
        ))
        .expect("side by side (a shared name prefix is not nesting)");
        let e = checked(&format!(
            "{store}[kv]\nunix_socket = \"/m1/kv.sock\"\n[[mounts]]\nmountpoint = \"/m1\"\n"
        ))
        .expect_err("socket under the mount");
        assert!(e.to_string().contains("unix_socket"), "{e}");
        for prefix in ["./ds", "../etc", "a/../b", "a/.", "a//b"] {
            let e = checked(&format!(
                "{store}[[mounts]]\nmountpoint = \"/m1\"\nprefix = \"{prefix}\"\n"
            ))
            .expect_err(prefix);
            assert!(e.to_string().contains("segment"), "{prefix}: {e}");
        }
        checked(&format!(
            "{store}[[mounts]]\nmountpoint = \"/m1\"\nprefix = \"a.b/..c/\"\n"
        ))
        .expect("dots inside names are names");
        checked(&format!(
            "{store}[[mounts]]\nmountpoint = \"/m1\"\nprefix = \"/a/b/\"\n"
        ))
        .expect("slashes at either end are no segments");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("123").unwrap(), 123);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("2MB").unwrap(), 2_000_000);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert!(
            parse_size("99999999999999999999GiB").is_err(),
            "no saturation"
        );
        assert!(parse_size("17179869184GiB").is_err(), "2^64 bytes");
        assert_eq!(parse_size("1TiB").unwrap(), 1 << 40);
        // Black-box finding: "-1" said "cannot parse float from empty string".
        for bad in ["-1", "abc", "\u{ff16}\u{ff14}MiB"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(
                e.contains("is not a size") && e.contains("64MiB"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn config_parses_and_rejects_unknown_keys() {
        let c: StrataConfig = toml::from_str(
            "[store]\nurl = \"file:///data\"\n[cache]\nmemory = \"2GiB\"\n[[mounts]]\nmountpoint = \"/mnt/x\"\n",
        )
        .unwrap();
        assert_eq!(c.store.url.as_deref(), Some("file:///data"));
        assert_eq!(c.mounts.len(), 1);
        assert_eq!(c.cache.disk, "10GiB");
        assert!(toml::from_str::<StrataConfig>("[cache]\nmemroy = \"1G\"\n").is_err());
    }

    #[test]
    fn mount_flags_and_mounts_entries_share_defaults() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            mount: MountConfig,
        }
        let flags = Cli::parse_from(["strata", "/mnt/x"]).mount;
        let entry: StrataConfig = toml::from_str("[[mounts]]\nmountpoint = \"/mnt/x\"\n").unwrap();
        let entry = &entry.mounts[0];
        // Debug covers every field, so a field added to one side only shows here.
        assert_eq!(format!("{flags:?}"), format!("{entry:?}"));
        assert_eq!(entry.prefetch, PrefetchMode::Predictors);
        assert_eq!(entry.passthrough_max, "64MiB");
        let c: StrataConfig = toml::from_str(
            "[[mounts]]\nmountpoint = \"/m\"\nprefetch = \"window\"\npassthrough_max = \"0\"\nmetadata_ttl_secs = 1\n",
        )
        .unwrap();
        assert_eq!(c.mounts[0].prefetch, PrefetchMode::Window);
        assert_eq!(
            c.mounts[0].metadata_ttl,
            MetadataTtl::After(std::time::Duration::from_secs(1))
        );
        assert!(!c.mounts[0].allow_writes, "read-only unless asked");
        let c: StrataConfig = toml::from_str(
            "[[mounts]]\nmountpoint = \"/m\"\nallow_writes = true\nallow_delete = true\n",
        )
        .unwrap();
        assert!(c.mounts[0].allow_writes && c.mounts[0].allow_delete);
        let c: StrataConfig = toml::from_str(
            "[[mounts]]\nmountpoint = \"/m\"\nfile_mode = \"0440\"\ndir_mode = \"750\"\ngid = 7\n",
        )
        .unwrap();
        assert_eq!(c.mounts[0].file_mode, Some(0o440));
        assert_eq!(c.mounts[0].dir_mode, Some(0o750));
        assert_eq!(c.mounts[0].gid, Some(7));
        let flags = Cli::parse_from(["strata", "/mnt/x", "--file-mode", "0o640"]).mount;
        assert_eq!(flags.file_mode, Some(0o640));
        assert!(Cli::try_parse_from(["strata", "/mnt/x", "--file-mode", "0999"]).is_err());
        assert!(!c.mounts[0].allow_overwrite);
    }

    #[test]
    fn metadata_ttl_takes_durations_and_indefinite_in_flags_and_files() {
        use clap::Parser;
        use std::time::Duration;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            mount: MountConfig,
        }
        let flag = |v: &str| {
            Cli::try_parse_from(["strata", "/mnt/x", "--metadata-ttl", v])
                .map(|c| c.mount.metadata_ttl)
        };
        assert_eq!(flag("indefinite").unwrap(), MetadataTtl::Indefinite);
        assert_eq!(
            flag("30").unwrap(),
            MetadataTtl::After(Duration::from_secs(30))
        );
        assert_eq!(
            flag("500ms").unwrap(),
            MetadataTtl::After(Duration::from_millis(500))
        );
        assert_eq!(
            flag("10m").unwrap(),
            MetadataTtl::After(Duration::from_secs(600))
        );
        assert_eq!(
            flag("2h").unwrap(),
            MetadataTtl::After(Duration::from_secs(7200))
        );
        assert!(flag("forever").is_err());
        assert!(flag("5 parsecs").is_err());
        let file = |t: &str| {
            toml::from_str::<StrataConfig>(&format!("[[mounts]]\nmountpoint = \"/m\"\n{t}\n"))
                .map(|c| c.mounts[0].metadata_ttl)
        };
        assert_eq!(
            file("metadata_ttl = \"indefinite\"").unwrap(),
            MetadataTtl::Indefinite
        );
        assert_eq!(
            file("metadata_ttl = 7").unwrap(),
            MetadataTtl::After(Duration::from_secs(7))
        );
        assert_eq!(
            file("metadata_ttl = \"1d\"").unwrap(),
            MetadataTtl::After(Duration::from_secs(86_400))
        );
        assert!(file("metadata_ttl = \"soon\"").is_err());
        // The core gets a TTL it treats as never expiring.
        assert_eq!(
            MetadataTtl::Indefinite.duration(),
            strata_fs::METADATA_TTL_INDEFINITE
        );
        // Display round-trips (it is the flag's shown default).
        for t in ["indefinite", "5s", "500ms"] {
            assert_eq!(t.parse::<MetadataTtl>().unwrap().to_string(), t);
        }
    }

    #[test]
    fn a_gpu_tier_needs_an_explicit_device() {
        let parse = |t: &str| toml::from_str::<StrataConfig>(t).unwrap().cache.gpu_tier();
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("[cache]\ngpu = \"0\"\n").unwrap(), None);
        let err = format!("{:#}", parse("[cache]\ngpu = \"1GiB\"\n").unwrap_err());
        assert!(
            err.contains("gpu_device = \"emulated\"") && err.contains("gpu_device = \"0\""),
            "says what to write: {err}"
        );
        assert_eq!(
            parse("[cache]\ngpu = \"1GiB\"\ngpu_device = \"emulated\"\n").unwrap(),
            Some(GpuTierConfig {
                bytes: 1 << 30,
                device: GpuDevice::Emulated
            })
        );
        assert_eq!(
            parse("[cache]\ngpu = \"1GiB\"\ngpu_device = \"1\"\n")
                .unwrap()
                .map(|g| g.device),
            Some(GpuDevice::Cuda(1))
        );
        assert!(parse("[cache]\ngpu = \"1GiB\"\ngpu_device = \"tpu\"\n").is_err());
        assert!(parse("[cache]\ngpu_device = \"emulated\"\n").is_err());
    }
}
