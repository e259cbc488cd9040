//! The daemon's admin HTTP API: `GET /stats` (JSON, read by `strata stats`),
//! `GET /metrics` (the same figures: OpenMetrics when the Accept header asks for it, as
//! Prometheus does, else the Prometheus text format 0.0.4), `GET /healthz` (200 "ok",
//! or 503 naming a mount unmounted from outside).
//!
//! Design: the handlers only snapshot lock-free counters (the engine's, the KV
//! service's) and render them; a fresh Prometheus registry is built per scrape from the
//! snapshot, so there is one source of truth for the JSON and the metrics and nothing
//! to keep in sync on the hot paths. The API is read-only.
//!
//! Access: with an admin token (`[admin] token` or `token_file`), every endpoint but
//! `/healthz` needs `Authorization: Bearer <token>` (401 otherwise); without one, only
//! GET/HEAD are served (403 for anything that could change state). The token is
//! required to listen beyond loopback, and with `[[kv.tenants]]` (the stats name every
//! tenant's namespaces). `strata stats` sends `$STRATA_ADMIN_TOKEN` when set.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use strata_cache_core::{CacheEngine, EngineStatsSnapshot};
use strata_kvcache::accept::{accept_error, Admission, Gate, Gated};
use strata_kvcache::tenants::constant_time_eq;
use strata_kvcache::{KvService, KvStatsSnapshot};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// What the admin handlers read.
#[derive(Clone)]
pub struct AdminState {
    pub engine: CacheEngine,
    pub kv: Option<KvService>,
    pub mounts: Vec<MountInfo>,
    /// The mounts' cores, in the order of `mounts` (their counters go into the stats).
    pub mount_cores: Vec<Arc<strata_fs::FsCore>>,
    /// Set for each mount (in the order of `mounts`) the daemon found unmounted from
    /// outside (`fusermount3 -u`): no longer shown (black-box finding: stats and
    /// /metrics still counted it).
    pub unmounted: Arc<[std::sync::atomic::AtomicBool]>,
    /// Mounts whose store refused their first listing at start (mounted, every operation
    /// failing with the store's answer), each with why: /healthz names them.
    pub not_mounted: Arc<[String]>,
    /// The mounts' copies and staged writes (None: no disk budget).
    pub local_files: Option<Arc<strata_fs::PassthroughStore>>,
    pub started: Instant,
    /// The admin token (see the module docs); None: read-only, loopback only.
    pub token: Option<Arc<str>>,
    /// This node's id, the group's membership and its replication (owners per KV
    /// block) (None: a single node).
    pub cluster: Option<(
        strata_cluster::NodeId,
        tokio::sync::watch::Receiver<strata_cluster::Membership>,
        usize,
    )>,
    /// The peer data plane's counters and the store whose reads they are set against
    /// (None: a single node).
    pub peer: Option<(
        Arc<crate::daemon::peer_metrics::PeerMetrics>,
        Option<strata_cache_core::BackingStore>,
    )>,
}

/// Env variable `strata stats` (and [`fetch_stats`]) take the admin token from.
pub const TOKEN_ENV: &str = "STRATA_ADMIN_TOKEN";

/// Where the admin API listens and with which token, checked before anything is
/// opened: None when `listen` is unset or empty.
/// `tenant_tokens`: the KV tenants' tokens (none without tenants).
pub fn plan(
    cfg: &crate::config::AdminConfig,
    tenant_tokens: &[&str],
) -> anyhow::Result<Option<(SocketAddr, Option<String>)>> {
    let tenants = !tenant_tokens.is_empty();
    let Some(listen) = cfg.listen.as_deref().filter(|a| !a.is_empty()) else {
        return Ok(None);
    };
    let addr = crate::daemon::kv::resolve(listen)?;
    let token = crate::config::secret("[admin]", cfg.token.as_deref(), cfg.token_file.as_deref())?
        .filter(|t| !t.is_empty());
    if token.is_none() {
        if !addr.ip().is_loopback() {
            bail!(
                "refusing to serve the admin API on non-loopback address {addr} without an \
                 admin token: set [admin] token_file (or token) in a config for `strata \
                 serve --config` (`strata mount` takes no token: its admin API is \
                 loopback only), or listen on 127.0.0.1"
            );
        }
        if tenants {
            bail!(
                "[[kv.tenants]] need an admin token: the admin API's stats name every \
                 tenant's namespaces; set [admin] token_file (or token), or listen = \"\""
            );
        }
    }
    if let Some(t) = &token {
        // Black-box finding: a tenant whose token was the admin token read every
        // tenant's namespaces from /stats and /metrics.
        if tenant_tokens.iter().any(|tt| tt.as_bytes() == t.as_bytes()) {
            bail!(
                "the [admin] token is also a [[kv.tenants]] token: that tenant would read \
                 every tenant's namespaces from the admin API; give the admin its own token"
            );
        }
    }
    Ok(Some((addr, token)))
}

impl AdminState {
    pub fn snapshot(&self) -> DaemonStats {
        DaemonStats {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_secs: self.started.elapsed().as_secs_f64(),
            engine: self.engine.stats(),
            kv: self.kv.as_ref().map(|k| k.stats()),
            mounts: self
                .mounts
                .iter()
                .enumerate()
                .filter(|(i, _)| {
                    !self
                        .unmounted
                        .get(*i)
                        .is_some_and(|g| g.load(std::sync::atomic::Ordering::Relaxed))
                })
                .map(|(i, m)| MountInfo {
                    stats: self.mount_cores.get(i).map(|c| MountStats::of(c)),
                    ..m.clone()
                })
                .collect(),
            cluster: self.cluster.as_ref().map(|(me, rx, replication)| {
                let m = rx.borrow().clone();
                let shares: std::collections::HashMap<_, _> =
                    strata_cluster::Placement::from_membership(&m)
                        .expected_copy_shares(*replication)
                        .into_iter()
                        .collect();
                ClusterMembers {
                    node: me.to_string(),
                    connected: m.connected,
                    refused: m.refused.clone(),
                    members: m
                        .nodes
                        .values()
                        .map(|n| ClusterMember {
                            id: n.id.to_string(),
                            advertise: n.advertise.clone(),
                            admin: n.admin.clone(),
                            expected_share: shares.get(&n.id).copied().unwrap_or(0.0),
                        })
                        .collect(),
                }
            }),
            peer: self
                .peer
                .as_ref()
                .map(|(m, store)| m.snapshot(store.as_ref().map_or((0, 0), |s| s.read_counts()))),
            local_files: self.local_files.as_deref().map(LocalFilesStats::of),
        }
    }
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/stats", get(stats_handler))
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz_handler))
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

/// `GET /healthz`: 200 "ok", or 503 naming each mount of the daemon that was
/// unmounted from outside (`umount -l`, `fusermount3 -u`): the daemon runs on without
/// it, and its mountpoint is a plain local folder under the jobs, so a liveness or
/// readiness probe must see it (black-box finding: /healthz said ok, and nothing
/// restarted or remounted it).
async fn healthz_handler(State(s): State<AdminState>) -> Response {
    use std::sync::atomic::Ordering::Relaxed;
    let lost: Vec<String> = s
        .mounts
        .iter()
        .zip(s.unmounted.iter())
        .filter(|(_, gone)| gone.load(Relaxed))
        .map(|(m, _)| m.mountpoint.display().to_string())
        .collect();
    if lost.is_empty() && s.not_mounted.is_empty() {
        return "ok\n".into_response();
    }
    let mut why = String::new();
    if !lost.is_empty() {
        why.push_str(&format!(
            "not served (unmounted from outside, or its FUSE session failed: see the log): {}; \
             restart the daemon to mount again\n",
            lost.join(", ")
        ));
    }
    if !s.not_mounted.is_empty() {
        why.push_str(&format!(
            "the store refused these mounts at start, their operations fail: {}; restart the daemon once the store accepts them\n",
            s.not_mounted.join(", ")
        ));
    }
    (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
}

/// The access rule of the module docs, before any handler (and the 404/405 fallback).
/// A request it lets through with a token checked, or on a listener without one, vouches
/// for its connection: under pressure the gate no longer closes it to make room
/// (`strata_kvcache::accept`), while connections that never pass keep nobody out.
async fn authorize(State(s): State<AdminState>, req: Request, next: Next) -> Response {
    let vouch = |req: &Request| {
        if let Some(ConnectInfo(c)) = req.extensions().get::<ConnectInfo<AdminConn>>() {
            c.0.vouch();
        }
    };
    if req.uri().path() == "/healthz" {
        if s.token.is_none() {
            vouch(&req);
        }
        return next.run(req).await;
    }
    match &s.token {
        Some(want) => {
            let ok = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|got| constant_time_eq(got.as_bytes(), want.as_bytes()));
            if ok {
                vouch(&req);
                next.run(req).await
            } else {
                (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "admin token required\n",
                )
                    .into_response()
            }
        }
        None if matches!(*req.method(), Method::GET | Method::HEAD) => {
            vouch(&req);
            next.run(req).await
        }
        None => (
            StatusCode::FORBIDDEN,
            "state-changing admin requests need an admin token ([admin] token_file)\n",
        )
            .into_response(),
    }
}

/// Most connections the admin listener keeps at once; one more takes the slot of the
/// oldest silent one, or is closed at accept (`strata_kvcache::accept`).
/// 256: its clients are a Prometheus scraper or two and operators' `strata stats`, a
/// handful of connections, while each costs the daemon a file descriptor: without a
/// cap, connections that never close exhausted them and the daemon stopped answering
/// anyone (KV clients included).
pub const ADMIN_MAX_CONNECTIONS: usize = 256;
/// A full admin listener closes a keep-alive connection idle this long to admit a new
/// one: 2 s, past any one answer of `/stats` or `/metrics`, so a scrape or `strata
/// stats` gets in however many idle connections others left open (black-box finding:
/// 300 clients that each made one request and kept the connection locked every later
/// scrape out).
const ADMIN_IDLE_EVICTABLE: std::time::Duration = std::time::Duration::from_secs(2);

/// A new admin connection must send its first [`ADMIN_FIRST_BYTES`], and its whole
/// first request head, within this long or is closed: 10 s, while a live HTTP client
/// sends its request at once.
pub const ADMIN_FIRST_BYTES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The shortest HTTP/1 request line (`GET / HTTP/1.1\r\n`).
pub const ADMIN_FIRST_BYTES: usize = 16;

/// The admin API's listener: at most [`ADMIN_MAX_CONNECTIONS`], each to send its
/// request line within [`ADMIN_FIRST_BYTES_TIMEOUT`] (`strata_kvcache::accept`).
struct GatedListener {
    inner: tokio::net::TcpListener,
    gate: Arc<Gate>,
}

impl axum::serve::Listener for GatedListener {
    type Io = Gated<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((io, addr)) => {
                    if let Some(g) = self.gate.admit(io) {
                        return (g, addr);
                    }
                }
                Err(e) => accept_error("admin", &e).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An admin connection's admission to its gate, for [`authorize`] to vouch with.
#[derive(Clone)]
struct AdminConn(Admission);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, GatedListener>>
    for AdminConn
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, GatedListener>) -> Self {
        AdminConn(stream.io().admission())
    }
}

/// Serves the admin API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_gated(
        listener,
        state,
        shutdown,
        ADMIN_MAX_CONNECTIONS,
        ADMIN_FIRST_BYTES_TIMEOUT,
    )
    .await
}

/// As [`serve`], with the connection cap and first-bytes deadline given (tests).
pub async fn serve_gated(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    max_connections: usize,
    first_bytes_timeout: std::time::Duration,
) -> anyhow::Result<()> {
    let listener = GatedListener {
        inner: listener,
        gate: Arc::new(
            Gate::new(
                "admin",
                max_connections,
                ADMIN_FIRST_BYTES,
                first_bytes_timeout,
            )
            .http1()
            .until_vouched()
            .evict_idle_after(ADMIN_IDLE_EVICTABLE),
        ),
    };
    let app = router(state).into_make_service_with_connect_info::<AdminConn>();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("admin server")
}

async fn stats_handler(State(s): State<AdminState>) -> Json<DaemonStats> {
    Json(s.snapshot())
}

/// `GET /metrics`: OpenMetrics to a client that asks for it (Prometheus does, in its
/// Accept header), else the Prometheus text format 0.0.4, which every scraper and
/// parser reads (black-box finding: a 0.0.4 parser, `prometheus_client.parser`, given
/// OpenMetrics whatever it asked, saw 22 counter families with no samples and 22
/// untyped `_total` series).
async fn metrics_handler(
    State(s): State<AdminState>,
    headers: axum::http::HeaderMap,
) -> impl IntoResponse {
    let body = render_metrics(&s.snapshot());
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            openmetrics_to_text_004(&body),
        )
    }
}

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

/// Fetches `GET /stats` from an admin endpoint (`host:port` or `http://host:port`).
pub async fn fetch_stats(endpoint: &str) -> anyhow::Result<DaemonStats> {
    let body = http_get(endpoint, "/stats").await?;
    serde_json::from_str(&body).with_context(|| format!("parsing /stats from {endpoint}"))
}

/// A minimal HTTP/1.1 GET (one request per connection): the admin API is local and
/// tiny, not worth an HTTP client dependency. Sends `$STRATA_ADMIN_TOKEN` when set.
pub async fn http_get(endpoint: &str, path: &str) -> anyhow::Result<String> {
    let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
    let (status, body) = http_request(endpoint, "GET", path, token.as_deref()).await?;
    if status != 200 {
        let hostport = endpoint.trim_start_matches("http://").trim_end_matches('/');
        bail!(
            "admin API at {hostport} answered {status}: {}{}",
            body.trim(),
            if status == 401 {
                format!(" (set {TOKEN_ENV})")
            } else {
                String::new()
            }
        );
    }
    Ok(body)
}

/// How long `strata stats` waits to connect to the admin API, and then for the whole
/// answer: 10 s. A live daemon answers in milliseconds (the handlers only snapshot
/// counters), loaded or not; an endpoint silent that long is not a working admin API,
/// and the CLI must say so rather than hang.
pub const ADMIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Largest admin answer read: 64 MiB. `/stats` and `/metrics` of a daemon with many
/// namespaces, tenants and streams are hundreds of KiB; an endpoint that sends more is
/// not the admin API, and reading it whole would grow the CLI without bound.
pub const MAX_ADMIN_ANSWER: u64 = 64 << 20;

/// One HTTP/1.1 request with an optional bearer token; the status code and body.
pub async fn http_request(
    endpoint: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    http_request_within(
        endpoint,
        method,
        path,
        token,
        ADMIN_TIMEOUT,
        MAX_ADMIN_ANSWER,
    )
    .await
}

/// As [`http_request`], connecting and then reading within `timeout` each, and reading
/// at most `max_answer` bytes.
pub async fn http_request_within(
    endpoint: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    timeout: std::time::Duration,
    max_answer: u64,
) -> anyhow::Result<(u16, String)> {
    let hostport = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let connect = tokio::net::TcpStream::connect(hostport);
    let mut s = match tokio::time::timeout(timeout, connect).await {
        Ok(r) => r.with_context(|| {
            format!("connecting to the admin API at {hostport} (is `strata serve` running?)")
        })?,
        Err(_) => bail!(
            "connecting to the admin API at {hostport}: no connection within {timeout:?} \
             (is `strata serve` running, and is this its admin address?)"
        ),
    };
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\n{auth}Content-Length: 0\r\n\
         Connection: close\r\n\r\n"
    );
    let exchange = async {
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        (&mut s).take(max_answer + 1).read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(buf)) => buf,
        Ok(Err(e)) => bail!("no Strata admin API at {hostport}: {e}"),
        Err(_) => bail!("no Strata admin API at {hostport}: no complete answer within {timeout:?}"),
    };
    if buf.len() as u64 > max_answer {
        bail!(
            "no Strata admin API at {hostport}: its answer exceeds {} bytes (the admin \
             API's are far smaller)",
            max_answer
        );
    }
    if !buf.starts_with(b"HTTP/1.") {
        bail!(
            "no Strata admin API at {hostport}: the answer ({} bytes) is not HTTP/1 (a \
             gRPC port, or another service?)",
            buf.len()
        );
    }
    let text = String::from_utf8(buf)
        .with_context(|| format!("admin API at {hostport} answered non-UTF-8"))?;
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("malformed HTTP answer from {hostport}")
    };
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .with_context(|| format!("malformed HTTP status line from {hostport}"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").context("bad chunk header")?;
        let n = usize::from_str_radix(size.trim(), 16).context("bad chunk size")?;
        if n == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..n).context("short chunk")?);
        body = rest.get(n + 2..).context("short chunk trailer")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Black-box finding: after `fusermount3 -u` of one mount, `strata stats` and
    /// /metrics still counted it (`strata_mounts 2`).
    #[test]
    fn a_mount_unmounted_from_outside_leaves_the_stats() {
        use std::sync::atomic::AtomicBool;
        let engine = CacheEngine::builder()
            .tier(Arc::new(strata_cache_core::tiers::MemoryTier::new(1 << 20)))
            .build()
            .expect("engine");
        let info = |p: &str| MountInfo {
            mountpoint: p.into(),
            prefix: String::new(),
            stats: None,
        };
        let state = AdminState {
            engine,
            kv: None,
            mounts: vec![info("/a"), info("/b")],
            mount_cores: vec![],
            unmounted: vec![AtomicBool::new(false), AtomicBool::new(true)].into(),
            not_mounted: Arc::from(Vec::<String>::new()),
            local_files: None,
            started: Instant::now(),
            token: None,
            cluster: None,
            peer: None,
        };
        let shown: Vec<PathBuf> = state
            .snapshot()
            .mounts
            .into_iter()
            .map(|m| m.mountpoint)
            .collect();
        assert_eq!(shown, vec![PathBuf::from("/a")]);
    }

    /// Black-box finding (round 18): a mount its store refused at start took the KV
    /// service down with the daemon; served without it now, /healthz names it.
    #[tokio::test]
    async fn a_mount_not_mounted_at_start_fails_the_health_check() {
        let engine = CacheEngine::builder()
            .tier(Arc::new(strata_cache_core::tiers::MemoryTier::new(1 << 20)))
            .build()
            .expect("engine");
        let state = |not_mounted: Vec<String>| AdminState {
            engine: engine.clone(),
            kv: None,
            mounts: vec![],
            mount_cores: vec![],
            unmounted: Arc::from(Vec::new()),
            not_mounted: not_mounted.into(),
            local_files: None,
            started: Instant::now(),
            token: None,
            cluster: None,
            peer: None,
        };
        let ok = healthz_handler(State(state(vec![]))).await;
        assert_eq!(ok.status(), StatusCode::OK);
        let refused = healthz_handler(State(state(vec!["/mnt/data (403)".into()]))).await;
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    /// A local endpoint that accepts and then behaves as `serve` does with each
    /// connection.
    async fn bad_endpoint<F, Fut>(serve: F) -> String
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(serve(s));
            }
        });
        addr
    }

    async fn ask(addr: &str) -> String {
        let t = std::time::Instant::now();
        let r = http_request_within(
            addr,
            "GET",
            "/stats",
            None,
            std::time::Duration::from_millis(300),
            1 << 20,
        )
        .await;
        assert!(t.elapsed() < std::time::Duration::from_secs(3), "bounded");
        format!("{:#}", r.expect_err("not an admin API"))
    }

    #[tokio::test]
    async fn stats_gives_up_on_an_endpoint_that_never_answers() {
        let addr = bad_endpoint(|s| async move {
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            drop(s);
        })
        .await;
        let e = ask(&addr).await;
        assert!(
            e.contains(&format!("no Strata admin API at {addr}")) && e.contains("within"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn stats_caps_the_answer_of_an_endpoint_that_streams_forever() {
        let addr = bad_endpoint(|mut s| async move {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await;
            let chunk = vec![b'x'; 64 << 10];
            while s.write_all(&chunk).await.is_ok() {}
        })
        .await;
        let e = ask(&addr).await;
        assert!(
            e.contains(&format!("no Strata admin API at {addr}")) && e.contains("exceeds"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn stats_names_an_endpoint_that_is_not_http() {
        // An HTTP/2-only server (the gRPC port): its SETTINGS, then it closes once it
        // has read a request that is not its preface.
        let addr = bad_endpoint(|mut s| async move {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
        })
        .await;
        let e = ask(&addr).await;
        assert!(
            e.contains(&format!("no Strata admin API at {addr}")) && e.contains("not HTTP"),
            "{e}"
        );
    }
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

    #[test]
    fn chunked_bodies_are_reassembled() {
        assert_eq!(
            dechunk("4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n").unwrap(),
            "Wikipedia"
        );
        assert!(dechunk("zz\r\n").is_err());
    }
}
