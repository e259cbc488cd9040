//! `strata.toml`: one file configures the store, the cache tiers, the KV service and
//! the mounts of one daemon. Every field has a default, so an empty file (or none) runs.
//!
//! ```toml
//! [store]
//! url = "s3://bucket/prefix"          # or file:///data, memory://, gs://, az://
//! endpoint = "http://127.0.0.1:9000"  # S3-compatible servers
//! allow_http = true
//!
//! [cache]
//! dir = "/var/cache/strata"           # default: a fresh temp dir
//! memory = "4GiB"
//! disk = "100GiB"
//! policy = "strata"                  # or lru, lfu, arc, 2random, tinylfu
//!
//! [kv]
//! listen = "127.0.0.1:7070"
//!
//! [[mounts]]
//! mountpoint = "/mnt/data"
//! prefix = "train"                    # a sub-tree of the store (optional)
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use serde::Deserialize;
use strata_cache_core::policy;
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{BackingStore, CacheEngine, StoreOptions, DEFAULT_BLOCK_SIZE};

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StrataConfig {
    pub store: StoreConfig,
    pub cache: CacheConfig,
    pub kv: KvConfig,
    pub admin: AdminConfig,
    pub mounts: Vec<MountConfig>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Store URL; default: a local directory is required on the command line.
    pub url: Option<String>,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub allow_http: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Directory of the disk tier; None: a temp dir removed at exit.
    pub dir: Option<PathBuf>,
    /// CPU-memory tier budget (e.g. "1GiB"). 1 GiB: room for a working set of small
    /// files and hot blocks without crowding the training job out of RAM.
    pub memory: String,
    /// Disk tier budget (e.g. "10GiB"; "0" disables the tier).
    pub disk: String,
    /// File block size. 1 MiB: see `strata_cache_core::DEFAULT_BLOCK_SIZE`.
    pub block_size: String,
    /// Eviction policy of every tier: `strata` (the pattern-aware policy: scans cannot
    /// push out hot data, shuffled epochs keep a stable subset, skewed reads are ranked
    /// by frequency; docs/PATTERNS.md), or a baseline (`lru`, `lfu`, `arc`, `2random`,
    /// `tinylfu`) for comparison.
    pub policy: String,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            dir: None,
            memory: "1GiB".into(),
            disk: "10GiB".into(),
            block_size: DEFAULT_BLOCK_SIZE.to_string(),
            policy: "strata".into(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvConfig {
    /// TCP address of the KV service. Loopback by default: any other address needs TLS
    /// and a token.
    pub listen: Option<String>,
    /// Unix socket of the KV service (default: `<cache dir>/kv.sock`).
    pub unix_socket: Option<PathBuf>,
    /// Largest KV block accepted (default 64 MiB, the cache core's limit).
    pub max_block: String,
    /// PEM certificate and key for TLS (required for non-loopback `listen`).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Bearer token clients must send (required for non-loopback `listen`).
    pub token: Option<String>,
    /// Namespaces served (e.g. "llama3-8b/tenant-a"); empty: any namespace, created
    /// on first put. When set, any other namespace is refused with NOT_FOUND.
    pub namespaces: Vec<String>,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            listen: Some("127.0.0.1:7070".into()),
            unix_socket: None,
            max_block: "64MiB".into(),
            tls_cert: None,
            tls_key: None,
            token: None,
            namespaces: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// HTTP address of the admin API and Prometheus `/metrics`.
    pub listen: Option<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some("127.0.0.1:7071".into()),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MountConfig {
    pub mountpoint: PathBuf,
    /// Sub-tree of the store to mount ("" for all of it).
    pub prefix: String,
    /// Seconds directory listings and attributes are cached.
    pub metadata_ttl_secs: Option<u64>,
    pub allow_other: bool,
}

impl StrataConfig {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing config {}", path.display()))
    }
}

/// Parses "123", "64KiB", "1MiB", "4GiB", "1TiB" (also K/M/G/T, KB/MB/GB as powers of 10).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().with_context(|| format!("bad size {s:?}"))?;
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
    Ok((n * mult as f64) as u64)
}

/// Opens the backing store named by `url` with the connection options of `cfg`.
pub fn open_store(url: &str, cfg: &StoreConfig) -> anyhow::Result<BackingStore> {
    let opts = StoreOptions {
        endpoint: cfg.endpoint.clone(),
        region: cfg.region.clone(),
        access_key_id: cfg.access_key_id.clone(),
        secret_access_key: cfg.secret_access_key.clone(),
        allow_http: cfg.allow_http,
        ..Default::default()
    };
    Ok(BackingStore::from_url(url, &opts)?)
}

/// The cache core of one daemon: the engine and handles on its tiers.
pub struct Core {
    pub engine: CacheEngine,
    pub memory: Arc<MemoryTier>,
    pub disk: Option<Arc<DiskTier>>,
    pub block_size: u64,
    pub cache_dir: PathBuf,
    /// Keeps a temp cache dir alive for the daemon's lifetime.
    _temp: Option<tempfile::TempDir>,
}

/// Builds the tiers and the engine from `cfg` (memory over disk, each tier evicting
/// with `cfg.policy`).
pub fn open_core(cfg: &CacheConfig) -> anyhow::Result<Core> {
    let (cache_dir, temp) = match &cfg.dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .with_context(|| format!("creating cache dir {}", d.display()))?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("strata-cache-")
                .tempdir()
                .context("creating temp cache dir")?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let memory_bytes = parse_size(&cfg.memory)?;
    let memory = Arc::new(MemoryTier::new(memory_bytes));
    let disk_bytes = parse_size(&cfg.disk)?;
    let mut builder = CacheEngine::builder()
        .tier_with_policy(memory.clone(), policy::by_name(&cfg.policy, memory_bytes)?);
    let disk = if disk_bytes > 0 {
        let d = Arc::new(
            DiskTier::open(cache_dir.join("blocks"), disk_bytes, DiskOptions::default())
                .with_context(|| format!("opening disk tier in {}", cache_dir.display()))?,
        );
        builder = builder.tier_with_policy(d.clone(), policy::by_name(&cfg.policy, disk_bytes)?);
        Some(d)
    } else {
        None
    };
    let engine = builder.build()?;
    Ok(Core {
        engine,
        memory,
        disk,
        block_size: parse_size(&cfg.block_size)?,
        cache_dir,
        _temp: temp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("123").unwrap(), 123);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("2MB").unwrap(), 2_000_000);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
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
    fn tiers_evict_with_the_configured_policy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = CacheConfig {
            dir: Some(dir.path().to_path_buf()),
            memory: "1MiB".into(),
            disk: "4MiB".into(),
            ..CacheConfig::default()
        };
        let core = open_core(&cfg).expect("default policy opens");
        assert_eq!(core.engine.policy_names(), ["strata", "strata"]);
        drop(core);
        cfg.policy = "lru".into();
        let core = open_core(&cfg).expect("lru opens");
        assert_eq!(core.engine.policy_names(), ["lru", "lru"]);
        drop(core);
        cfg.policy = "belady".into();
        let err = open_core(&cfg).err().expect("unknown policy is refused");
        assert!(format!("{err:#}").contains("known: strata, lru"), "{err:#}");
    }
}
