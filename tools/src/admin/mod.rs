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
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use strata_cache_core::CacheEngine;
use strata_kvcache::accept::{accept_error, Admission, Gate, Gated};
use strata_kvcache::tenants::constant_time_eq;
use strata_kvcache::KvService;

mod client;
mod metrics;
mod stats;

pub use client::*;
pub use metrics::*;
pub use stats::*;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

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
}
