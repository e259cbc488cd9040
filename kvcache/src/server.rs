//! The `strata.kv.v1` service over a [`CacheEngine`].
//!
//! Entry points (mini-redis style): [`run`] serves one listener until `shutdown`
//! resolves; [`serve`] does the same with a [`KvService`] built beforehand, so that one
//! service (one set of counters) can answer on a Unix socket and on TCP at once.
//!
//! Design:
//! - Every request is validated before it touches the cache: namespace 1..=128 bytes of
//!   printable UTF-8 (registered, when the server registers namespaces), hash 1..=64
//!   bytes, declared block size `min_block..=max_block`. Errors are [`KvError`], turned into a
//!   `tonic::Status` once at the edge (`error.rs`).
//! - A Put buffers its block before storing it (values are immutable, a block is stored
//!   whole or not at all, so a truncated stream stores nothing). The bytes of all puts
//!   in flight are bounded (`max_inflight_put_bytes`), and so are one connection's
//!   (`per_connection_put_bytes`); a Put reserves the bytes it has received, not the
//!   size it declares (`limits.rs`). A single gRPC message is bounded by
//!   `max_message_bytes`, so a client must chunk large blocks.
//! - Nothing waits on a client forever: a Put stream that sends nothing for
//!   `idle_timeout` is aborted (DEADLINE_EXCEEDED, its reservation released), a Get or
//!   BatchGet stream the client does not read for `idle_timeout` is dropped with the
//!   block it pins; HTTP/2 keepalive closes dead connections, and one connection opens at
//!   most `max_concurrent_streams` streams.
//! - A Get slices the cached `Bytes` into `chunk_bytes` messages (no copy until tonic
//!   encodes them). Large HTTP/2 windows keep a 1 MiB+ block flowing without waiting
//!   for window updates; TCP_NODELAY keeps small-block latency low.
//! - Tenants (`tenants.rs`): with `tenants` configured, a request's token names its
//!   tenant, which uses only the namespaces its patterns allow (others are
//!   PERMISSION_DENIED), in a key space of its own, within its byte quota
//!   (RESOURCE_EXHAUSTED past it).
//! - Unknown namespaces: when `namespaces` is non-empty only those are served and any
//!   other is NOT_FOUND; when empty (the default) a namespace is created by its first
//!   put and reads of an unseen namespace are plain misses.
//! - A full cache evicts (the engine's policy); a block no tier can admit is
//!   RESOURCE_EXHAUSTED.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use strata_cache_core::key::{KV_BLOCK_MAX, KV_BLOCK_MIN};
use strata_cache_core::{AccessContext, CacheEngine, CacheKey, JobId, TierKind};
use strata_prefetch::Admission;
use tokio::net::{TcpListener, UnixListener};
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::blocks::BlocksRequest;
use crate::error::{KvError, Result};
use crate::group::{
    placement_key, Forward, GroupOptions, GroupView, RemoteError, Router, Routes,
    GROUP_TOKEN_METADATA, PEER_TENANT_METADATA,
};
use crate::identity::{IdentityBindings, IdentityDigest};
use crate::keys::{parse_identity_hex, IDENTITY_METADATA};
use crate::limits::{ConnInfo, ConnIo, IdleGuard, PutBudget, Reservation};
use crate::pb::kv_cache_server::{KvCache, KvCacheServer};
use crate::pb::{self, Tier};
use crate::routing::{demote_suspects, Answer, KeyState, Lookup, Replicate};
use crate::shm::{parse_session, ShmArena, DEVICE_IPC_METADATA, SHM_SESSION_METADATA};
use crate::staging::Staging;
use crate::stats::KvStats;
use crate::tenants::{constant_time_eq, Tenant, TenantConfig, Tenants};

/// Longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 128;
/// Longest hash accepted, in bytes (the cache core's limit).
pub const MAX_HASH_LEN: usize = 64;
/// Most keys in one batched request: 64 Ki keys of a 1 KiB... chain is far beyond any
/// context length (1M tokens / 16-token blocks), and bounds the work of one request.
pub const MAX_BATCH_KEYS: usize = 1 << 16;

/// Default size of the messages a Get streams: 1 MiB, large enough that per-message
/// overhead is negligible and small enough that the first bytes leave early.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;

/// PEM files of the server's TLS identity.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Server settings; every default is explained next to it.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Largest block accepted. Default 64 MiB: the cache core's KV limit.
    pub max_block: u64,
    /// Smallest block accepted. Default 1 KiB (the cache core's `KV_BLOCK_MIN`): one
    /// token of the smallest served models is tens of KiB of KV, so a real block is far
    /// above it, while each block costs a disk-tier file (a 4 KiB page at least, an
    /// inode, two fsyncs) and its index entries whatever its size: below 1 KiB the
    /// overhead dwarfs the data, and a flood of tiny blocks is the cheapest way to wear
    /// the cache out.
    pub min_block: u64,
    /// Namespaces served; empty: any namespace, created on first put.
    pub namespaces: Vec<String>,
    /// Bearer token clients must send (`authorization: Bearer <token>`); None: none.
    /// Ignored when `tenants` are configured (each tenant has its own).
    pub token: Option<String>,
    /// Tenants (`tenants.rs`); empty: the single-tenant service (any namespace, one
    /// optional token). Check them with [`crate::tenants::check_tenants`].
    pub tenants: Vec<TenantConfig>,
    /// TLS identity; None: plaintext (loopback and Unix socket only, enforced by the
    /// daemon, which refuses a non-loopback address without TLS and a token).
    pub tls: Option<TlsFiles>,
    /// Bytes of all puts buffered at once. Default 1 GiB: sixteen 64 MiB blocks in
    /// flight, a bounded fraction of a server's memory whatever the client count.
    pub max_inflight_put_bytes: u64,
    /// Bytes the puts of one connection may buffer at once. Default 256 MiB, a quarter
    /// of the global budget: one connection (however many streams it opens) leaves at
    /// least three quarters to the others, and still buffers four largest blocks at once.
    pub per_connection_put_bytes: u64,
    /// Bytes the puts of one tenant may buffer at once, over all its connections.
    /// Default 512 MiB, half the global budget: one tenant, however many connections it
    /// opens, leaves at least half to the others.
    pub per_tenant_put_bytes: u64,
    /// A Put stream that sends nothing, or a Get stream the client does not read, for
    /// this long is aborted and releases what it holds; a Put waits at most this long
    /// for budget. Default 10 s: a live client sends a 1 MiB message in well under 10 ms
    /// even over a 1 Gb/s link, so 10 s of silence mid-block is a stalled or dead client,
    /// while a GC pause or a loaded host of a healthy one stays far below it.
    pub idle_timeout: Duration,
    /// Most concurrent streams one HTTP/2 connection may open. Default 256: an inference
    /// engine multiplexes its in-flight requests over one connection (tens to a few
    /// hundred), and the bound caps what one connection makes the server track.
    pub max_concurrent_streams: u32,
    /// HTTP/2 keepalive: a PING after this much silence on a connection, and the
    /// connection is closed when the answer takes longer than `keepalive_timeout`.
    /// Defaults 30 s / 10 s: a dead peer (host gone, cable pulled) is noticed within
    /// 40 s, at one small frame per idle connection every 30 s.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Size of the messages a Get streams (see [`DEFAULT_CHUNK_BYTES`]).
    pub chunk_bytes: usize,
    /// Largest gRPC message accepted. Default 4 MiB (tonic's default): clients send
    /// blocks in chunks, and one message never buffers more than this per stream.
    pub max_message_bytes: usize,
    /// HTTP/2 stream and connection windows. Default 8 MiB / 32 MiB: a 1 MiB+ block
    /// on loopback is sent without stalling on window updates (the 64 KiB protocol
    /// default halves throughput).
    pub stream_window: u32,
    pub connection_window: u32,
    /// Where namespaces' model-identity bindings persist (`identity.rs`); None: in
    /// memory only. The daemon puts it in the cache dir, next to the blocks it guards.
    pub identity_file: Option<PathBuf>,
    /// Size of the same-host zero-copy arena (`shm.rs`); 0 disables it. Default 0 here
    /// (the library serves TCP too); the daemon sets `[kv] shm` (default 256 MiB: 64
    /// blocks of 4 MiB, 16 MiB... enough for the blocks of a few prefills in flight,
    /// memory that is shared with clients rather than copied to them).
    pub shm_bytes: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_block: KV_BLOCK_MAX as u64,
            min_block: KV_BLOCK_MIN as u64,
            namespaces: Vec::new(),
            token: None,
            tenants: Vec::new(),
            tls: None,
            max_inflight_put_bytes: 1 << 30,
            per_connection_put_bytes: 256 << 20,
            per_tenant_put_bytes: 512 << 20,
            idle_timeout: Duration::from_secs(10),
            max_concurrent_streams: 256,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            max_message_bytes: 4 << 20,
            stream_window: 8 << 20,
            connection_window: 32 << 20,
            identity_file: None,
            shm_bytes: 0,
        }
    }
}

/// A bound listener: TCP or Unix socket.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Listener::Tcp(l)
    }
}

impl From<UnixListener> for Listener {
    fn from(l: UnixListener) -> Self {
        Listener::Unix(l)
    }
}

/// Serves `strata.kv.v1` on `listener` over `engine` until `shutdown` resolves, then
/// finishes the requests in flight and returns.
pub async fn run(
    listener: impl Into<Listener>,
    engine: CacheEngine,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    serve(listener, KvService::new(engine, config), shutdown).await
}

/// As [`run`], with a service built beforehand (shared by several listeners).
pub async fn serve(
    listener: impl Into<Listener>,
    service: KvService,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let cfg = service.inner.config.clone();
    let mut builder = Server::builder()
        .tcp_nodelay(true)
        .initial_stream_window_size(cfg.stream_window)
        .initial_connection_window_size(cfg.connection_window)
        .max_concurrent_streams(Some(cfg.max_concurrent_streams))
        .http2_keepalive_interval(Some(cfg.keepalive_interval))
        .http2_keepalive_timeout(Some(cfg.keepalive_timeout))
        // 1 MiB frames: fewer frames (and syscalls) per block than the 16 KiB default.
        .max_frame_size(Some((1 << 20) - 1));
    let listener = listener.into();
    if let Some(tls) = &cfg.tls {
        if matches!(listener, Listener::Tcp(_)) {
            crate::ensure_crypto_provider();
            let cert = std::fs::read(&tls.cert).map_err(|e| {
                KvError::Config(format!("reading TLS cert {}: {e}", tls.cert.display()))
            })?;
            let key = std::fs::read(&tls.key).map_err(|e| {
                KvError::Config(format!("reading TLS key {}: {e}", tls.key.display()))
            })?;
            builder = builder
                .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))?;
        }
    }
    let router = builder.add_service(service.grpc());
    // At least one largest block, so a lone put of it on a connection can proceed.
    let per_conn = cfg.per_connection_put_bytes.max(cfg.max_block);
    match listener {
        Listener::Tcp(l) => {
            let incoming = tonic::transport::server::TcpIncoming::from(l)
                .with_nodelay(Some(true))
                .map(move |c| c.map(|io| ConnIo::new(io, per_conn)));
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
        Listener::Unix(l) => {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(l)
                .map(move |c| c.map(|io| ConnIo::new(io, per_conn)));
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
    }
    Ok(())
}

/// Tunes glibc's allocator for a process serving large blocks; call once at start
/// (the daemon and `strata bench kv` do).
///
/// Every Get and Put allocates and frees buffers of 64 KiB..64 MiB. glibc serves
/// allocations over its mmap threshold (128 KiB at start) with a fresh `mmap`, so each
/// 1 MiB message costs ~256 page faults and zeroed pages: a quarter of the CPU of a
/// loopback Get in a profile. Raising the threshold to 32 MiB (glibc's maximum) and the
/// trim threshold to 256 MiB keeps those buffers in the heap for reuse; the cache's
/// byte budgets still bound what stays allocated. No-op on other C libraries.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before the serving
    // threads allocate (and glibc serialises it with its own lock anyway).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

struct Inner {
    engine: CacheEngine,
    config: ServerConfig,
    registered: HashSet<String>,
    tenants: Arc<Tenants>,
    put_budget: PutBudget,
    stats: KvStats,
    started: Instant,
    top_tier: Option<TierKind>,
    /// The KV `Prefetch`, decided and accounted by the daemon's access controller.
    staging: Staging,
    /// Namespaces bound to a model identity (keys v2).
    identities: IdentityBindings,
    /// The same-host zero-copy arena (`shm.rs`); None: disabled.
    shm: Option<Arc<ShmArena>>,
    /// The cache group's router (`group.rs`), set once by [`KvService::join_group`].
    router: OnceLock<Arc<Router>>,
    /// The engine's GPU tier, whose blocks same-host clients may read by device handle
    /// (set once by [`KvService::attach_gpu_tier`]).
    gpu: OnceLock<Arc<strata_gds::GpuTier>>,
    /// Requests served for other nodes on the peer listener, and their block bytes.
    served_for_peers: AtomicU64,
    served_bytes_out: AtomicU64,
    served_bytes_in: AtomicU64,
}

/// The service: cheap to clone; clones share counters and the put budget.
#[derive(Clone)]
pub struct KvService {
    inner: Arc<Inner>,
    /// The face served on the peer listener: serves from the local tiers only, never
    /// forwards (`group.rs`).
    peer_side: bool,
}

impl KvService {
    pub fn new(engine: CacheEngine, config: ServerConfig) -> Self {
        let top_tier = engine.tier_kinds().first().copied();
        KvService {
            inner: Arc::new(Inner {
                registered: config.namespaces.iter().cloned().collect(),
                tenants: Arc::new(Tenants::new(
                    &config.tenants,
                    config.per_tenant_put_bytes.max(config.max_block),
                )),
                // At least one largest block, so a lone put of it can always proceed.
                put_budget: PutBudget::new(config.max_inflight_put_bytes.max(config.max_block)),
                // Registered namespaces are always tracked one by one (with tenants,
                // stats name the tenant's key space, "<tenant>:<namespace>", instead).
                stats: KvStats::with_pinned(if config.tenants.is_empty() {
                    &config.namespaces
                } else {
                    &[]
                }),
                started: Instant::now(),
                top_tier,
                staging: Staging::default(),
                identities: IdentityBindings::open(config.identity_file.clone()),
                shm: match config.shm_bytes {
                    0 => None,
                    n => match ShmArena::new(n as usize) {
                        Ok(a) => Some(Arc::new(a)),
                        Err(e) => {
                            tracing::error!(error = %e, "shared-memory arena unavailable; same-host Gets send bytes inline");
                            None
                        }
                    },
                },
                router: OnceLock::new(),
                gpu: OnceLock::new(),
                served_for_peers: AtomicU64::new(0),
                served_bytes_out: AtomicU64::new(0),
                served_bytes_in: AtomicU64::new(0),
                engine,
                config,
            }),
            peer_side: false,
        }
    }

    /// Joins the cache group: from now on the client-facing service routes requests
    /// by key to their owners (`group.rs`). Once per service.
    pub fn join_group(&self, view: Arc<dyn GroupView>, mut opts: GroupOptions) -> Result<()> {
        opts.max_message_bytes = self.inner.config.max_message_bytes;
        opts.chunk_bytes = self.inner.config.chunk_bytes;
        let router = Router::new(view, opts)?;
        self.inner
            .router
            .set(Arc::new(router))
            .map_err(|_| KvError::Config("the KV service is already in a group".into()))
    }

    /// The face of this service for the peer listener: the group token required, the
    /// forwarded tenant and identity applied, served from the local tiers only.
    pub fn peer_grpc(
        &self,
    ) -> tonic::service::interceptor::InterceptedService<KvCacheServer<KvService>, PeerCheck> {
        let max = self.inner.config.max_message_bytes;
        let peer = KvService {
            inner: self.inner.clone(),
            peer_side: true,
        };
        let svc = KvCacheServer::new(peer.clone())
            .max_decoding_message_size(max.max(self.inner.config.chunk_bytes + 1024))
            .max_encoding_message_size(max.max(self.inner.config.chunk_bytes + 1024));
        tonic::service::interceptor::InterceptedService::new(svc, PeerCheck { svc: peer })
    }

    /// The router, when this face routes (the client face of a service in a group).
    fn router(&self) -> Option<&Arc<Router>> {
        if self.peer_side {
            None
        } else {
            self.inner.router.get()
        }
    }

    /// The group's view of the figures (None outside a group).
    pub fn group_stats(&self) -> Option<crate::group::GroupKvStats> {
        self.inner.router.get().map(|r| {
            let mut s = r.stats();
            s.served_for_peers = self.inner.served_for_peers.load(Ordering::Relaxed);
            s.served_bytes_out = self.inner.served_bytes_out.load(Ordering::Relaxed);
            s.served_bytes_in = self.inner.served_bytes_in.load(Ordering::Relaxed);
            s
        })
    }

    /// The tonic service, with the token check and message limits applied.
    /// `Get` is encoded without copying blocks (`wire.rs`); every other method is
    /// tonic's generated server behind the same interceptor.
    pub fn grpc(&self) -> crate::wire::GrpcService {
        let max = self.inner.config.max_message_bytes;
        let svc = KvCacheServer::new(self.clone())
            .max_decoding_message_size(max)
            .max_encoding_message_size(max.max(self.inner.config.chunk_bytes + 1024));
        let check = TokenCheck {
            token: self.inner.config.token.clone().map(Arc::from),
            tenants: self.inner.tenants.clone(),
            stats: self.clone(),
        };
        crate::wire::GrpcService::new(
            self.clone(),
            check.clone(),
            tonic::service::interceptor::InterceptedService::new(svc, check),
        )
    }

    /// Largest gRPC message accepted (`ServerConfig::max_message_bytes`).
    pub(crate) fn max_message_bytes(&self) -> usize {
        self.inner.config.max_message_bytes
    }

    pub fn stats(&self) -> crate::stats::KvStatsSnapshot {
        let mut s = self.inner.stats.snapshot();
        let staged = self.inner.staging.stats();
        s.prefetch_used = staged.used;
        s.prefetch_wasted = staged.wasted;
        s.prefetch_deferred = staged.deferred;
        s.put_reserved_bytes = self.inner.put_budget.reserved_bytes();
        s.group = self.group_stats();
        s.shm = self.inner.shm.as_ref().map(|a| a.stats());
        s
    }

    pub fn engine(&self) -> &CacheEngine {
        &self.inner.engine
    }

    /// Lets same-host clients read blocks resident in `gpu` (the engine's GPU tier) by
    /// device handle (`shm.rs`, `strata_gds::ipc`). Needs the shared-memory arena (its
    /// sessions carry the leases): without it, or called twice, nothing changes.
    pub fn attach_gpu_tier(&self, gpu: Arc<strata_gds::GpuTier>) {
        let Some(arena) = &self.inner.shm else {
            return;
        };
        // The emulated device's memory goes to every session; CUDA handles need nothing.
        let memory = gpu
            .ipc_client_memory()
            .and_then(|m| match m.fd.try_clone_to_owned() {
                Ok(fd) => Some((fd, m.size, m.id)),
                Err(e) => {
                    tracing::warn!(error = %e, "GPU tier memory not shared; device handles off");
                    None
                }
            });
        if gpu.ipc_client_memory().is_some() && memory.is_none() {
            return;
        }
        if self.inner.gpu.set(gpu.clone()).is_ok() {
            arena.enable_device_leases(
                strata_cache_core::Tier::capacity_bytes(gpu.as_ref()),
                memory,
            );
        }
    }

    /// A device lease on `key` for `session` when the GPU tier holds it: (lease id,
    /// handle wire bytes, block size). None: not resident there, no device leases, or
    /// the session's cap reached (the Get then serves bytes as usual).
    fn device_lease(
        &self,
        ns: &str,
        session: crate::shm::SessionId,
        key: &CacheKey,
    ) -> Option<(u64, Vec<u8>, u64)> {
        let (gpu, arena) = (self.inner.gpu.get()?, self.inner.shm.as_ref()?);
        if self.inner.engine.locate(key) != Some(TierKind::Gpu) {
            return None;
        }
        let export = match gpu.export_ipc(key) {
            Ok(Some(e)) => e,
            Ok(None) => return None,
            Err(e) => {
                tracing::debug!(error = %e, "device export failed; serving bytes");
                return None;
            }
        };
        let (handle, size) = (export.handle().to_bytes(), export.handle().len);
        let lease = arena.lease_device(session, size, Box::new(export))?;
        // Recorded only once leased: a refused lease falls back to a Get that records
        // the read itself, and one read must count once.
        self.inner
            .engine
            .record_read_in_place(key, &self.ctx(ns, false));
        self.record_served(ns, key, Some(size));
        Some((lease, handle, size))
    }

    /// What every local read records once answered, whichever way its bytes leave
    /// (copied, leased in the arena, or by device handle), so no way of reading is
    /// invisible to the counters or the staging controller: the namespace's hit or
    /// miss and, for a hit, a staged block used. (The engine records the access for
    /// its tracker and policies: [`CacheEngine::get`], or
    /// [`CacheEngine::record_read_in_place`] for a read that bypasses it.)
    fn record_served(&self, ns: &str, key: &CacheKey, size: Option<u64>) {
        self.inner.stats.get(ns, size);
        if size.is_some() {
            // A staged block read (used); a few staged ones checked for having left the
            // fastest tier unread (wasted).
            let engine = &self.inner.engine;
            let top = self.inner.top_tier;
            self.inner
                .staging
                .on_get(key, self.job(ns), |k| engine.locate(k) == top);
        }
    }

    /// The same-host arena, to serve its side socket ([`crate::shm::serve_side_socket`]).
    pub fn shm_arena(&self) -> Option<Arc<ShmArena>> {
        self.inner.shm.clone()
    }

    /// One job per namespace: streams of different tenants are never merged.
    fn job(&self, ns: &str) -> JobId {
        JobId(fnv1a(ns.as_bytes()))
    }

    fn ctx(&self, ns: &str, prefetch: bool) -> AccessContext {
        let job = self.job(ns);
        let now_ns = self.inner.started.elapsed().as_nanos() as u64;
        if prefetch {
            AccessContext::prefetch(job, now_ns)
        } else {
            AccessContext::demand(job, now_ns)
        }
    }

    /// The cache namespace of the client's `ns`: checked, and scoped to the tenant
    /// when tenants are configured (`tenants.rs`).
    /// `caller`: the tenant and model identity the request came with; `bind`: a put,
    /// which binds an unbound namespace to its identity (`identity.rs`).
    fn scope(&self, ns: &str, caller: &Caller, bind: bool) -> Result<Arc<str>> {
        self.check_namespace(ns)?;
        let scoped = match caller.tenant.as_deref() {
            Some(t) => t.scope(ns)?,
            None => Arc::from(ns),
        };
        self.inner
            .identities
            .check(&scoped, caller.identity.as_ref(), bind)?;
        Ok(scoped)
    }

    fn check_namespace(&self, ns: &str) -> Result<()> {
        if ns.is_empty() || ns.len() > MAX_NAMESPACE_LEN {
            return Err(KvError::Invalid(format!(
                "namespace must be 1..={MAX_NAMESPACE_LEN} bytes, got {}",
                ns.len()
            )));
        }
        if ns.chars().any(char::is_control) {
            return Err(KvError::Invalid(
                "namespace contains control characters".into(),
            ));
        }
        if !self.inner.registered.is_empty() && !self.inner.registered.contains(ns) {
            return Err(KvError::UnknownNamespace(ns.to_string()));
        }
        Ok(())
    }

    fn key(&self, ns: &Arc<str>, hash: &[u8]) -> Result<CacheKey> {
        if hash.is_empty() || hash.len() > MAX_HASH_LEN {
            return Err(KvError::Invalid(format!(
                "hash must be 1..={MAX_HASH_LEN} bytes, got {}",
                hash.len()
            )));
        }
        Ok(CacheKey::kv(ns.clone(), hash))
    }

    fn keys(
        &self,
        ns: &str,
        hashes: &[Bytes],
        caller: &Caller,
    ) -> Result<(Arc<str>, Vec<CacheKey>)> {
        let ns = self.scope(ns, caller, false)?;
        if hashes.len() > MAX_BATCH_KEYS {
            return Err(KvError::Invalid(format!(
                "at most {MAX_BATCH_KEYS} keys per request, got {}",
                hashes.len()
            )));
        }
        let keys = hashes
            .iter()
            .map(|h| self.key(&ns, h))
            .collect::<Result<Vec<_>>>()?;
        Ok((ns, keys))
    }

    fn reject<T>(&self, r: Result<T>) -> std::result::Result<T, Status> {
        r.map_err(|e| {
            if e.code() != tonic::Code::NotFound {
                self.inner.stats.rejected();
            }
            Status::from(e)
        })
    }

    /// A request that names blocks, opened: its tenant, body, scoped namespace and keys
    /// (an invalid namespace or hash is rejected).
    fn blocks<R: BlocksRequest>(
        &self,
        request: Request<R>,
    ) -> std::result::Result<Blocks<R>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let (ns, keys) = self.reject(self.keys(req.namespace(), req.hashes(), &caller))?;
        Ok(Blocks {
            tenant: caller.tenant,
            req,
            ns,
            keys,
        })
    }

    /// The next message of a Put stream, or [`KvError::Idle`] after `idle_timeout`.
    async fn next_put(
        &self,
        stream: &mut Streaming<pb::PutRequest>,
    ) -> Result<Option<pb::PutRequest>> {
        let idle = self.inner.config.idle_timeout;
        match tokio::time::timeout(idle, stream.message()).await {
            Ok(m) => Ok(m?),
            Err(_) => {
                self.inner.stats.idle_aborted();
                Err(KvError::Idle { what: "put", idle })
            }
        }
    }

    async fn do_put(
        &self,
        conn: Option<ConnInfo>,
        caller: Caller,
        mut stream: Streaming<pb::PutRequest>,
    ) -> Result<pb::PutResponse> {
        let first = self.next_put(&mut stream).await?.ok_or_else(|| {
            KvError::Invalid("empty put stream: the first message must carry the key".into())
        })?;
        let ns = self.scope(&first.namespace, &caller, true)?;
        let tenant = caller.tenant;
        let key = self.key(&ns, &first.hash)?;
        let size = first.size;
        let limit = self.inner.config.max_block;
        if size == 0 {
            return Err(KvError::Invalid("declared block size is 0".into()));
        }
        let min = self.inner.config.min_block;
        if size < min {
            return Err(KvError::TooSmall { size, min });
        }
        if size > limit {
            return Err(KvError::TooLarge { size, limit });
        }
        if first.data.len() as u64 > size {
            return Err(KvError::Invalid(format!(
                "got more than the declared {size} bytes"
            )));
        }
        // In a group the owners store the block (and check the quota); this node only
        // buffers it on the way.
        let group = self.routes_for(&ns, std::slice::from_ref(&first.hash));
        if group.is_none() && self.inner.engine.contains(&key) {
            // Immutable values: the same key holds the same bytes; skip the transfer.
            self.inner.stats.put(&ns, size, true);
            return Ok(pb::PutResponse {
                already_present: true,
            });
        }
        // The tenant's quota first, so a tenant past it fails before sending the block;
        // the charge is refunded unless the block is stored.
        let mut charge = match &tenant {
            Some(t) if group.is_none() && t.charge(&key, size, &self.inner.engine)? => {
                Some(QuotaCharge {
                    tenant: t,
                    key: &key,
                    keep: false,
                })
            }
            _ => None,
        };
        // Reserve what arrives, not what is declared (see `limits.rs`); the reservation
        // is released when this function returns, whatever the outcome.
        let mut reserved: Reservation = self.inner.put_budget.reservation(
            conn,
            tenant.as_ref().map(|t| t.inflight()),
            self.inner.config.idle_timeout,
        );
        let mut got = first.data.len() as u64;
        reserved.cover(got).await?;
        let mut parts = vec![first.data];
        while got < size {
            let Some(msg) = self.next_put(&mut stream).await? else {
                return Err(KvError::Truncated {
                    got,
                    declared: size,
                });
            };
            if got + msg.data.len() as u64 > size {
                return Err(KvError::Invalid(format!(
                    "got more than the declared {size} bytes"
                )));
            }
            got += msg.data.len() as u64;
            reserved.cover(got).await?;
            if !msg.data.is_empty() {
                parts.push(msg.data);
            }
        }
        // The stream must end here: more bytes mean the declared size was wrong.
        while let Some(msg) = self.next_put(&mut stream).await? {
            if !msg.data.is_empty() {
                return Err(KvError::Invalid(format!(
                    "got more than the declared {size} bytes"
                )));
            }
        }
        let data = if parts.len() == 1 {
            parts.swap_remove(0)
        } else {
            // One copy into a block of its exact size (as when the buffer was
            // preallocated from the declared size, which a stalled client could abuse).
            let mut buf = BytesMut::with_capacity(size as usize);
            for p in parts.drain(..) {
                buf.extend_from_slice(&p);
            }
            buf.freeze()
        };
        if self.peer_side {
            self.inner
                .served_bytes_in
                .fetch_add(size, Ordering::Relaxed);
        }
        if let Some((router, routes)) = group {
            let fwd = Forward {
                tenant: tenant.as_ref().map(|t| t.name().to_string()),
                identity: caller.identity,
            };
            let already_present = self
                .put_to_group(
                    &router,
                    &routes,
                    tenant.as_ref(),
                    &fwd,
                    &first.namespace,
                    &ns,
                    &key,
                    data,
                )
                .await?;
            return Ok(pb::PutResponse { already_present });
        }
        let ctx = self.ctx(&ns, false);
        self.inner.engine.put(&key, data, &ctx).await?;
        if let Some(c) = charge.as_mut() {
            c.keep = true;
        }
        self.inner.stats.put(&ns, size, false);
        Ok(pb::PutResponse {
            already_present: false,
        })
    }

    /// `stream`, dropped (with the blocks it pins) when the client stops reading it.
    fn idle_guarded<T: Send + 'static>(
        &self,
        stream: BoxStream<T>,
        what: &'static str,
    ) -> BoxStream<T> {
        let this = self.clone();
        Box::pin(IdleGuard::new(
            stream,
            self.inner.config.idle_timeout,
            what,
            move || this.inner.stats.idle_aborted(),
        ))
    }

    /// Fetches one block, counting the hit or miss.
    async fn fetch(&self, ns: &str, key: &CacheKey) -> Result<Option<(Bytes, Option<TierKind>)>> {
        // A block being staged by a Prefetch: wait for it rather than read it twice.
        self.inner
            .staging
            .wait(key, self.inner.config.idle_timeout)
            .await;
        let tier = self.inner.engine.locate(key);
        let got = self.inner.engine.get(key, &self.ctx(ns, false)).await?;
        self.record_served(ns, key, got.as_ref().map(|b| b.len() as u64));
        Ok(got.map(|b| (b, tier)))
    }

    fn chunks(&self, data: &Bytes) -> Vec<Bytes> {
        let step = self.inner.config.chunk_bytes.max(1);
        let mut out = Vec::with_capacity(data.len() / step + 1);
        let mut off = 0;
        while off < data.len() {
            let end = (off + step).min(data.len());
            out.push(data.slice(off..end));
            off = end;
        }
        out
    }
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// What a Get serves: the block's bytes (inline or leased in the arena), or a device
/// handle (lease id, handle wire bytes, size).
enum Served {
    Bytes(CacheKey, Bytes, Option<TierKind>),
    Device((u64, Vec<u8>, u64)),
}

fn tier_pb(t: Option<TierKind>) -> Tier {
    match t {
        None | Some(TierKind::Store) => Tier::None,
        Some(TierKind::Gpu) => Tier::Gpu,
        Some(TierKind::Memory) => Tier::Memory,
        Some(TierKind::Disk) => Tier::Disk,
    }
}

/// The tenant a request authenticated as (set by [`TokenCheck`]).
#[derive(Clone)]
struct AuthTenant(Arc<Tenant>);

/// The model identity digest a request carried (set by [`TokenCheck`]).
#[derive(Clone, Copy)]
struct CallerIdentity(IdentityDigest);

/// Who a request comes from: its tenant (when tenants are configured) and the model
/// identity it declared (keys v2), both set by [`TokenCheck`].
struct Caller {
    tenant: Option<Arc<Tenant>>,
    identity: Option<IdentityDigest>,
}

impl Caller {
    fn of<T>(req: &Request<T>) -> Self {
        Caller {
            tenant: req.extensions().get::<AuthTenant>().map(|a| a.0.clone()),
            identity: req.extensions().get::<CallerIdentity>().map(|i| i.0),
        }
    }

    /// Who a forwarded request acts for.
    fn forward(&self) -> Forward {
        Forward {
            tenant: self.tenant.as_ref().map(|t| t.name().to_string()),
            identity: self.identity,
        }
    }
}

/// An opened [`BlocksRequest`] (see [`KvService::blocks`]).
struct Blocks<R> {
    tenant: Option<Arc<Tenant>>,
    req: R,
    ns: Arc<str>,
    keys: Vec<CacheKey>,
}

/// A tenant's quota charge for one put, refunded on drop unless kept (the put failed,
/// was aborted or truncated).
struct QuotaCharge<'a> {
    tenant: &'a Tenant,
    key: &'a CacheKey,
    keep: bool,
}

impl Drop for QuotaCharge<'_> {
    fn drop(&mut self) {
        if !self.keep {
            self.tenant.forget(self.key);
        }
    }
}

/// Checks the bearer token of every request: a tenant's token when tenants are
/// configured (the request then carries its tenant), else the one token if set.
#[derive(Clone)]
pub struct TokenCheck {
    token: Option<Arc<str>>,
    tenants: Arc<Tenants>,
    stats: KvService,
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(v) = req.metadata().get(IDENTITY_METADATA) {
            let digest = v
                .to_str()
                .ok()
                .and_then(parse_identity_hex)
                .ok_or_else(|| {
                    self.stats.inner.stats.rejected();
                    Status::invalid_argument(format!(
                        "{IDENTITY_METADATA} must be a 32-byte digest in hex (64 digits)"
                    ))
                })?;
            req.extensions_mut().insert(CallerIdentity(digest));
        }
        if self.tenants.is_empty() && self.token.is_none() {
            return Ok(req);
        }
        let got = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::as_bytes);
        if !self.tenants.is_empty() {
            if let Some(t) = got.and_then(|g| self.tenants.authenticate(g)) {
                req.extensions_mut().insert(AuthTenant(t));
                return Ok(req);
            }
        } else if let (Some(want), Some(g)) = (&self.token, got) {
            if constant_time_eq(g, want.as_bytes()) {
                return Ok(req);
            }
        }
        self.stats.inner.stats.rejected();
        Err(Status::unauthenticated("missing or wrong bearer token"))
    }
}

pub(crate) type BoxStream<T> = Pin<Box<dyn Stream<Item = std::result::Result<T, Status>> + Send>>;

/// A Get's response stream; tells the load model when the last chunk left.
struct TimedStream<S> {
    inner: S,
    service: KvService,
    tier: Option<TierKind>,
    bytes: u64,
    start: Instant,
    done: bool,
}

impl<S> TimedStream<S> {
    fn new(inner: S, service: KvService, tier: Option<TierKind>, bytes: u64) -> Self {
        if let Some(t) = tier {
            service.inner.stats.load.started(t, bytes);
        }
        TimedStream {
            inner,
            service,
            tier,
            bytes,
            start: Instant::now(),
            done: false,
        }
    }

    fn finish(&mut self, completed: bool) {
        if self.done {
            return;
        }
        self.done = true;
        if let Some(t) = self.tier {
            // A cancelled Get only releases its queued bytes: no timing sample.
            let elapsed = completed.then(|| self.start.elapsed());
            self.service
                .inner
                .stats
                .load
                .finished(t, self.bytes, elapsed);
        }
    }
}

impl<S: Stream + Unpin> Stream for TimedStream<S> {
    type Item = S::Item;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let r = self.inner.poll_next_unpin(cx);
        if let Poll::Ready(None) = r {
            self.finish(true);
        }
        r
    }
}

impl<S> Drop for TimedStream<S> {
    fn drop(&mut self) {
        self.finish(false);
    }
}

#[tonic::async_trait]
impl KvCache for KvService {
    async fn put(
        &self,
        request: Request<Streaming<pb::PutRequest>>,
    ) -> std::result::Result<Response<pb::PutResponse>, Status> {
        let conn = ConnInfo::of(&request);
        let caller = Caller::of(&request);
        let r = self.do_put(conn, caller, request.into_inner()).await;
        self.reject(r).map(Response::new)
    }

    type GetStream = BoxStream<pb::GetResponse>;

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> std::result::Result<Response<Self::GetStream>, Status> {
        let caller = Caller::of(&request);
        // A peer's call never leases this host's arena.
        let session = request
            .metadata()
            .get(SHM_SESSION_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_session)
            .filter(|_| !self.peer_side);
        let wants_device =
            session.is_some() && request.metadata().contains_key(DEVICE_IPC_METADATA);
        let req = request.into_inner();
        let r = async {
            let ns = self.scope(&req.namespace, &caller, false)?;
            let key = self.key(&ns, &req.hash)?;
            if let (true, Some(s)) = (wants_device, session) {
                if let Some(lease) = self.device_lease(&ns, s, &key) {
                    return Ok(Served::Device(lease));
                }
            }
            let (data, tier) = self
                .fetch_routed(&req.namespace, &ns, &key, &req.hash, &caller.forward())
                .await?
                .ok_or(KvError::NotFound)?;
            Ok(Served::Bytes(key, data, tier))
        }
        .await;
        let (key, data, tier) = match self.reject(r)? {
            Served::Bytes(key, data, tier) => (key, data, tier),
            Served::Device((lease, handle, size)) => {
                let msg = pb::GetResponse {
                    size,
                    shm_lease: lease,
                    device_handle: Bytes::from(handle),
                    ..Default::default()
                };
                // Not timed as a GPU-tier read: no bytes move here, and counting it would
                // tell `EstimateLoad` the tier is as fast as sending a handle.
                let stream: BoxStream<pb::GetResponse> = Box::pin(TimedStream::new(
                    futures::stream::iter(vec![Ok(msg)]),
                    self.clone(),
                    None,
                    size,
                ));
                return Ok(Response::new(stream));
            }
        };
        let size = data.len() as u64;
        if self.peer_side {
            self.inner
                .served_bytes_out
                .fetch_add(size, Ordering::Relaxed);
        }
        // Same host, attached to the arena: a lease on the block instead of its bytes.
        let lease = match (&self.inner.shm, session) {
            (Some(arena), Some(s)) => arena.lease(s, &key, &data),
            _ => None,
        };
        let msgs: Vec<_> = match lease {
            Some(l) => vec![Ok(pb::GetResponse {
                size,
                data: Bytes::new(),
                shm_offset: l.offset,
                shm_lease: l.id,
                ..Default::default()
            })],
            None => self
                .chunks(&data)
                .into_iter()
                .enumerate()
                .map(|(i, d)| {
                    Ok(pb::GetResponse {
                        size: if i == 0 { size } else { 0 },
                        data: d,
                        ..Default::default()
                    })
                })
                .collect(),
        };
        let single = msgs.len() <= 1;
        let stream: BoxStream<pb::GetResponse> = Box::pin(TimedStream::new(
            futures::stream::iter(msgs),
            self.clone(),
            tier,
            size,
        ));
        if single {
            // One message: taken (and copied into the response) on the first poll, so
            // nothing stays pinned by a client that does not read.
            return Ok(Response::new(stream));
        }
        Ok(Response::new(self.idle_guarded(stream, "get")))
    }

    type BatchGetStream = BoxStream<pb::BatchGetResponse>;

    async fn batch_get(
        &self,
        request: Request<pb::BatchGetRequest>,
    ) -> std::result::Result<Response<Self::BatchGetStream>, Status> {
        let fwd = Caller::of(&request).forward();
        let Blocks { req, ns, keys, .. } = self.blocks(request)?;
        let this = self.clone();
        let client_ns: Arc<str> = Arc::from(req.namespace.as_str());
        // Blocks are fetched one at a time as the client drains the stream, so a batch
        // never holds more than one block beyond what the cache already holds (in a
        // group, each from the local tiers or its owners, as a Get).
        let stream = futures::stream::iter(keys.into_iter().zip(req.hashes).enumerate())
            .then(move |(i, (key, hash))| {
                let this = this.clone();
                let ns = ns.clone();
                let client_ns = client_ns.clone();
                let fwd = fwd.clone();
                async move {
                    let index = i as u32;
                    match this.fetch_routed(&client_ns, &ns, &key, &hash, &fwd).await {
                        Ok(Some((data, _))) => {
                            let size = data.len() as u64;
                            let msgs: Vec<_> = this
                                .chunks(&data)
                                .into_iter()
                                .enumerate()
                                .map(|(j, d)| {
                                    Ok(pb::BatchGetResponse {
                                        index,
                                        found: true,
                                        size: if j == 0 { size } else { 0 },
                                        data: d,
                                    })
                                })
                                .collect();
                            msgs
                        }
                        Ok(None) => vec![Ok(pb::BatchGetResponse {
                            index,
                            found: false,
                            size: 0,
                            data: Bytes::new(),
                        })],
                        Err(e) => vec![Err(Status::from(e))],
                    }
                }
            })
            .flat_map(futures::stream::iter);
        Ok(Response::new(
            self.idle_guarded(Box::pin(stream), "batch get"),
        ))
    }

    async fn exists(
        &self,
        request: Request<pb::ExistsRequest>,
    ) -> std::result::Result<Response<pb::ExistsResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let r = async {
            let ns = self.scope(&req.namespace, &caller, false)?;
            let key = self.key(&ns, &req.hash)?;
            self.inner.stats.lookups(1);
            let tier = self.inner.engine.locate(&key);
            if tier.is_none() {
                let hashes = [req.hash.clone()];
                if let Some(found) = self
                    .exists_routed(
                        &req.namespace,
                        &ns,
                        &hashes,
                        &[key],
                        false,
                        &caller.forward(),
                    )
                    .await?
                {
                    let remote = matches!(found.state(0), KeyState::Found(_));
                    // Where it is on the owner is the owner's business: memory for an
                    // engine that asks "is it cached" (the tier field is advisory).
                    return Ok(pb::ExistsResponse {
                        exists: remote,
                        tier: if remote { Tier::Memory } else { Tier::None } as i32,
                    });
                }
            }
            Ok(pb::ExistsResponse {
                exists: tier.is_some(),
                tier: tier_pb(tier) as i32,
            })
        }
        .await;
        self.reject(r).map(Response::new)
    }

    async fn batch_exists(
        &self,
        request: Request<pb::BatchExistsRequest>,
    ) -> std::result::Result<Response<pb::BatchExistsResponse>, Status> {
        let fwd = Caller::of(&request).forward();
        let Blocks { req, ns, keys, .. } = self.blocks(request)?;
        self.inner.stats.lookups(keys.len() as u64);
        let routed = self
            .exists_routed(&req.namespace, &ns, &req.hashes, &keys, false, &fwd)
            .await;
        if let Some(l) = self.reject(routed)? {
            return Ok(Response::new(pb::BatchExistsResponse {
                exists: (0..keys.len())
                    .map(|i| matches!(l.state(i), KeyState::Found(_)))
                    .collect(),
            }));
        }
        Ok(Response::new(pb::BatchExistsResponse {
            exists: keys.iter().map(|k| self.inner.engine.contains(k)).collect(),
        }))
    }

    async fn match_prefix(
        &self,
        request: Request<pb::MatchPrefixRequest>,
    ) -> std::result::Result<Response<pb::MatchPrefixResponse>, Status> {
        let fwd = Caller::of(&request).forward();
        let Blocks { req, ns, keys, .. } = self.blocks(request)?;
        let routed = self
            .exists_routed(&req.namespace, &ns, &req.hashes, &keys, true, &fwd)
            .await;
        if let Some(l) = self.reject(routed)? {
            self.inner.stats.lookups(keys.len() as u64);
            return Ok(Response::new(pb::MatchPrefixResponse {
                matched: l.matched() as u32,
            }));
        }
        let matched = keys
            .iter()
            .take_while(|k| self.inner.engine.contains(k))
            .count();
        self.inner.stats.lookups(matched as u64 + 1);
        Ok(Response::new(pb::MatchPrefixResponse {
            matched: matched as u32,
        }))
    }

    async fn remove(
        &self,
        request: Request<pb::RemoveRequest>,
    ) -> std::result::Result<Response<pb::RemoveResponse>, Status> {
        let fwd = Caller::of(&request).forward();
        let Blocks {
            tenant,
            req,
            ns,
            keys,
        } = self.blocks(request)?;
        let r = async {
            if let Some(removed) = self
                .remove_routed(&req.namespace, &ns, &req.hashes, &keys, &fwd)
                .await?
            {
                self.remove_local(&keys, tenant.as_ref()).await?;
                return Ok(pb::RemoveResponse { removed });
            }
            let removed = self.remove_local(&keys, tenant.as_ref()).await?;
            Ok(pb::RemoveResponse { removed })
        }
        .await;
        self.reject(r).map(Response::new)
    }

    async fn prefetch(
        &self,
        request: Request<pb::PrefetchRequest>,
    ) -> std::result::Result<Response<pb::PrefetchResponse>, Status> {
        let fwd = Caller::of(&request).forward();
        let Blocks { req, ns, keys, .. } = self.blocks(request)?;
        let routed = self
            .prefetch_routed(&req.namespace, &ns, &req.hashes, &keys, &fwd)
            .await;
        if let Some(resp) = self.reject(routed)? {
            return Ok(Response::new(resp));
        }
        Ok(Response::new(self.prefetch_local(&ns, keys)))
    }

    async fn estimate_load(
        &self,
        request: Request<pb::EstimateLoadRequest>,
    ) -> std::result::Result<Response<pb::EstimateLoadResponse>, Status> {
        let fwd = Caller::of(&request).forward();
        let Blocks { req, ns, keys, .. } = self.blocks(request)?;
        // Unknown block size: the namespace's mean put size, else 1 MiB (a
        // 256-token LMCache chunk of a 7-8B model is ~1-32 MiB).
        let bytes = match req.block_bytes {
            0 => self.inner.stats.mean_put_bytes(&ns).unwrap_or(1 << 20),
            b => b,
        };
        self.inner.stats.lookups(keys.len() as u64);
        let routed = self.estimate_routed(&req, &ns, &keys, bytes, &fwd).await;
        if let Some(resp) = self.reject(routed)? {
            return Ok(Response::new(resp));
        }
        let model = &self.inner.stats.load;
        let mut resp = pb::EstimateLoadResponse::default();
        let mut in_prefix = true;
        for k in &keys {
            let tier = self.inner.engine.locate(k);
            let load_us = model.estimate_us(tier, bytes);
            if in_prefix && tier.is_some() {
                resp.matched += 1;
                resp.total_us += load_us;
            } else {
                in_prefix = false;
            }
            resp.blocks.push(pb::BlockLoad {
                tier: tier_pb(tier) as i32,
                load_us,
            });
        }
        Ok(Response::new(resp))
    }

    async fn ping(
        &self,
        _request: Request<pb::PingRequest>,
    ) -> std::result::Result<Response<pb::PingResponse>, Status> {
        Ok(Response::new(pb::PingResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            api: crate::API_VERSION.to_string(),
            max_block_bytes: self.inner.config.max_block,
        }))
    }
}

impl KvService {
    /// Removes `keys` from the local tiers; the number removed.
    async fn remove_local(&self, keys: &[CacheKey], tenant: Option<&Arc<Tenant>>) -> Result<u32> {
        let mut removed = 0u32;
        for k in keys {
            if self.inner.engine.remove(k).await? {
                removed += 1;
            }
            if let Some(arena) = &self.inner.shm {
                arena.forget(k);
            }
            if let Some(t) = tenant {
                t.forget(k);
            }
        }
        self.inner.stats.removed(removed as u64);
        Ok(removed)
    }

    /// Stages those of `keys` in a lower local tier into the fastest one.
    fn prefetch_local(&self, ns: &Arc<str>, keys: Vec<CacheKey>) -> pb::PrefetchResponse {
        let ctx = self.ctx(ns, true);
        let mut resp = pb::PrefetchResponse::default();
        let staging = &self.inner.staging;
        let mut issued = Vec::new();
        for k in keys {
            match self.inner.engine.locate(&k) {
                None => resp.missing += 1,
                Some(t) if Some(t) == self.inner.top_tier => resp.already_fast += 1,
                Some(_) => {
                    // The staging controller decides (backlog bound, one staging per
                    // block); a get promotes a lower-tier hit into the fastest tier.
                    let bytes = self.inner.stats.mean_put_bytes(ns).unwrap_or(1 << 20);
                    match staging.admit(&k, ctx.job, ns, bytes) {
                        Admission::Issue => {
                            resp.staged += 1;
                            issued.push(k);
                        }
                        // Being staged by another call: it will be fast.
                        Admission::Outstanding => resp.staged += 1,
                        // Deferred: left where it is (counted in stats).
                        Admission::BacklogFull => {}
                    }
                }
            }
        }
        if !issued.is_empty() {
            // Answered now; the moves run in the background, in the order asked (the
            // engine reads the first blocks first), bounded by the staging backlog.
            let this = self.clone();
            tokio::spawn(async move {
                let staging = &this.inner.staging;
                let guards: Vec<_> = issued.iter().map(|k| staging.begin(k)).collect();
                for (k, guard) in issued.iter().zip(guards) {
                    match this.inner.engine.get(k, &ctx).await {
                        Ok(Some(_)) => {
                            staging.landed(k);
                            this.inner.stats.prefetched();
                        }
                        Ok(None) => staging.failed(k),
                        Err(e) => {
                            staging.failed(k);
                            tracing::warn!(key = %k, error = %e, "KV staging failed");
                        }
                    }
                    drop(guard);
                }
            });
        }
        resp
    }

    /// The routes of `hashes` in the scoped namespace `ns`, when this face routes and
    /// the group has other nodes.
    fn routes_for(&self, ns: &str, hashes: &[Bytes]) -> Option<(Arc<Router>, Routes)> {
        let router = self.router()?;
        let keys: Vec<Vec<u8>> = hashes.iter().map(|h| placement_key(ns, h)).collect();
        let routes = router.routes(&keys)?;
        Some((router.clone(), routes))
    }

    /// One block from the local tiers, else (in a group) from its owners.
    async fn fetch_routed(
        &self,
        client_ns: &str,
        ns: &Arc<str>,
        key: &CacheKey,
        hash: &[u8],
        fwd: &Forward,
    ) -> Result<Option<(Bytes, Option<TierKind>)>> {
        let Some(router) = self.router() else {
            return self.fetch(ns, key).await;
        };
        if self.inner.engine.contains(key) {
            if let Some(hit) = self.fetch(ns, key).await? {
                router.local_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(hit));
            }
        }
        let Some((router, routes)) = self.routes_for(ns, &[Bytes::copy_from_slice(hash)]) else {
            return self.fetch(ns, key).await;
        };
        let got = self
            .get_from_group(&router, &routes, fwd, client_ns, hash)
            .await?;
        self.inner
            .stats
            .get(ns, got.as_ref().map(|b| b.len() as u64));
        if got.is_some() {
            router.remote_hits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(got.map(|b| (b, None)))
    }

    /// A Get over the key's candidates (the local node already missed): in placement
    /// order, suspects last, the next one asked too when one is slower than its p99.
    async fn get_from_group(
        &self,
        router: &Arc<Router>,
        routes: &Routes,
        fwd: &Forward,
        client_ns: &str,
        hash: &[u8],
    ) -> Result<Option<Bytes>> {
        let mut cands = routes.candidates.first().cloned().unwrap_or_default();
        let replication = routes.replication.max(1);
        // The local node answered already: an owner that said no (the candidate past
        // the R owners only counts when asked in its turn, which it was not).
        let mut misses = 0;
        if let Some(pos) = cands.iter().position(|n| routes.nodes[*n].local) {
            cands.remove(pos);
            if pos < replication {
                misses += 1;
            }
        }
        demote_suspects(&mut cands, |n| router.is_suspect(&routes.nodes[n]));
        let mut inflight = futures::stream::FuturesUnordered::new();
        let mut next = 0;
        let launch = |n: usize| {
            let node = routes.nodes[n].clone();
            let router = router.clone();
            async move {
                let r = router.remote_get(&node, fwd, client_ns, hash).await;
                (node, r)
            }
        };
        let mut last_launched = None;
        loop {
            // A miss is final once R candidates said no and nothing is in flight (a
            // hedged request to the next node may answer "no" before a slow owner
            // answers "here").
            if inflight.is_empty() {
                if misses >= replication {
                    return Ok(None);
                }
                let Some(&n) = cands.get(next) else {
                    return Ok(None);
                };
                next += 1;
                last_launched = Some(routes.nodes[n].clone());
                inflight.push(launch(n));
            }
            let hedge = match (&last_launched, cands.get(next)) {
                (Some(node), Some(_)) if misses < replication => router.hedge_delay(node),
                // Nothing left to hedge with: wait for what is in flight.
                _ => Duration::from_secs(3600),
            };
            tokio::select! {
                Some((node, r)) = inflight.next() => match r {
                    Ok(Some(b)) => return Ok(Some(b)),
                    Ok(None) => misses += 1,
                    Err(RemoteError::Down(s)) => {
                        tracing::debug!(node = %node.id, status = %s, "KV owner down; next replica");
                    }
                    Err(RemoteError::Refused(s)) => return Err(KvError::Status(s)),
                },
                _ = tokio::time::sleep(hedge) => {
                    if let (Some(slow), Some(&n)) = (&last_launched, cands.get(next)) {
                        router.count_hedge(slow);
                        next += 1;
                        last_launched = Some(routes.nodes[n].clone());
                        inflight.push(launch(n));
                    }
                }
            }
        }
    }

    /// Stores a received block on this node (quota, then the engine); Ok(already
    /// present).
    async fn store_local(
        &self,
        tenant: Option<&Arc<Tenant>>,
        ns: &Arc<str>,
        key: &CacheKey,
        data: Bytes,
    ) -> Result<bool> {
        let size = data.len() as u64;
        if self.inner.engine.contains(key) {
            self.inner.stats.put(ns, size, true);
            return Ok(true);
        }
        let mut charge = match tenant {
            Some(t) if t.charge(key, size, &self.inner.engine)? => Some(QuotaCharge {
                tenant: t,
                key,
                keep: false,
            }),
            _ => None,
        };
        let ctx = self.ctx(ns, false);
        self.inner.engine.put(key, data, &ctx).await?;
        if let Some(c) = charge.as_mut() {
            c.keep = true;
        }
        self.inner.stats.put(ns, size, false);
        Ok(false)
    }

    /// A received block to its R owners (see `group.rs` for when it is acknowledged).
    #[allow(clippy::too_many_arguments)]
    async fn put_to_group(
        &self,
        router: &Arc<Router>,
        routes: &Routes,
        caller_tenant: Option<&Arc<Tenant>>,
        fwd: &Forward,
        client_ns: &str,
        ns: &Arc<str>,
        key: &CacheKey,
        data: Bytes,
    ) -> Result<bool> {
        let cands = routes.candidates.first().cloned().unwrap_or_default();
        let mut plan = Replicate::new(cands, routes.replication);
        let mut inflight = futures::stream::FuturesUnordered::new();
        let store = |n: usize| {
            let node = routes.nodes[n].clone();
            let router = router.clone();
            let data = data.clone();
            async move {
                let r = if node.local {
                    self.store_local(caller_tenant, ns, key, data)
                        .await
                        .map_err(|e| RemoteError::Refused(Status::from(e)))
                } else {
                    router
                        .remote_put(&node, fwd, client_ns, key_hash(key), data)
                        .await
                };
                (n, r)
            }
        };
        for n in plan.initial() {
            inflight.push(store(n));
        }
        let mut all_present = true;
        let mut refused = None;
        while let Some((n, r)) = inflight.next().await {
            match r {
                Ok(present) => {
                    all_present &= present;
                    plan.outcome(n, true);
                }
                Err(RemoteError::Down(s)) => {
                    tracing::debug!(node = %routes.nodes[n].id, status = %s, "KV put: owner down, trying the next node");
                    if let Some(sub) = plan.outcome(n, false) {
                        inflight.push(store(sub));
                    }
                }
                Err(RemoteError::Refused(s)) => {
                    // Not a node failure: no substitute; the caller gets the refusal.
                    refused.get_or_insert(s);
                }
            }
        }
        if let Some(s) = refused {
            return Err(KvError::Status(s));
        }
        if plan.stored().is_empty() {
            // No owner reachable: keep it here, where this node's Gets find it first,
            // rather than fail a put a single node would have taken.
            router.kept_locally.fetch_add(1, Ordering::Relaxed);
            return self.store_local(caller_tenant, ns, key, data).await;
        }
        if plan.under_replicated() {
            router.under_replicated.fetch_add(1, Ordering::Relaxed);
        }
        Ok(all_present)
    }

    /// Which of `keys` the group holds (None outside a group): local hits first, then
    /// batched rounds over the candidates.
    async fn exists_routed(
        &self,
        client_ns: &str,
        ns: &str,
        hashes: &[Bytes],
        keys: &[CacheKey],
        prefix: bool,
        fwd: &Forward,
    ) -> Result<Option<Lookup>> {
        let Some((router, routes)) = self.routes_for(ns, hashes) else {
            return Ok(None);
        };
        let (l, _) = self
            .lookup(&router, &routes, fwd, client_ns, hashes, keys, prefix, None)
            .await?;
        Ok(Some(l))
    }

    /// The lookup of `keys` over the group; with `estimate` (block bytes), each found
    /// block's load estimate as its holder gave it plus the hop from there.
    #[allow(clippy::too_many_arguments)]
    async fn lookup(
        &self,
        router: &Arc<Router>,
        routes: &Routes,
        fwd: &Forward,
        client_ns: &str,
        hashes: &[Bytes],
        keys: &[CacheKey],
        prefix: bool,
        estimate: Option<u64>,
    ) -> Result<(Lookup, Vec<Option<pb::BlockLoad>>)> {
        let local = routes.nodes.iter().position(|n| n.local);
        let mut cands = routes.candidates.clone();
        for c in &mut cands {
            demote_suspects(c, |n| router.is_suspect(&routes.nodes[n]));
        }
        let mut l = Lookup::new(cands, routes.replication, prefix);
        let mut loads: Vec<Option<pb::BlockLoad>> = vec![None; keys.len()];
        let model = &self.inner.stats.load;
        let local_load = |tier: Option<TierKind>| {
            estimate.map(|bytes| pb::BlockLoad {
                tier: tier_pb(tier) as i32,
                load_us: model.estimate_us(tier, bytes),
            })
        };
        // What this node holds costs nothing to ask.
        for (i, k) in keys.iter().enumerate() {
            if let Some(t) = self.inner.engine.locate(k) {
                l.known_hit(i, local.unwrap_or(usize::MAX));
                loads[i] = local_load(Some(t));
            }
        }
        while !l.done() {
            let round = l.next_round();
            let mut calls = futures::stream::FuturesUnordered::new();
            for (n, idx) in round {
                let node = routes.nodes[n].clone();
                if node.local {
                    for i in idx {
                        let t = self.inner.engine.locate(&keys[i]);
                        if t.is_some() {
                            loads[i] = local_load(t);
                        }
                        l.answer(
                            i,
                            n,
                            if t.is_some() {
                                Answer::Hit
                            } else {
                                Answer::Miss
                            },
                        );
                    }
                    continue;
                }
                let batch: Vec<Bytes> = idx.iter().map(|i| hashes[*i].clone()).collect();
                let router = router.clone();
                calls.push(async move {
                    let r = match estimate {
                        None => router
                            .remote_exists(&node, fwd, client_ns, batch)
                            .await
                            .map(|v| v.into_iter().map(|e| (e, None)).collect::<Vec<_>>()),
                        Some(bytes) => router
                            .remote_estimate(&node, fwd, client_ns, batch, bytes)
                            .await
                            .map(|v| {
                                v.into_iter()
                                    .map(|mut b| {
                                        let hit = b.tier != Tier::None as i32
                                            && b.tier != Tier::Unspecified as i32;
                                        b.load_us += router.hop_us(&node, bytes);
                                        (hit, Some(b))
                                    })
                                    .collect()
                            }),
                    };
                    (n, idx, r)
                });
            }
            while let Some((n, idx, r)) = calls.next().await {
                match r {
                    Ok(v) => {
                        for (i, (hit, load)) in idx.into_iter().zip(v) {
                            if hit {
                                loads[i] = load;
                            }
                            l.answer(i, n, if hit { Answer::Hit } else { Answer::Miss });
                        }
                    }
                    Err(RemoteError::Down(_)) => {
                        for i in idx {
                            l.answer(i, n, Answer::Failed);
                        }
                    }
                    Err(RemoteError::Refused(s)) => return Err(KvError::Status(s)),
                }
            }
        }
        Ok((l, loads))
    }

    /// EstimateLoad over the group (None outside a group).
    async fn estimate_routed(
        &self,
        req: &pb::EstimateLoadRequest,
        ns: &str,
        keys: &[CacheKey],
        bytes: u64,
        fwd: &Forward,
    ) -> Result<Option<pb::EstimateLoadResponse>> {
        let Some((router, routes)) = self.routes_for(ns, &req.hashes) else {
            return Ok(None);
        };
        let (l, loads) = self
            .lookup(
                &router,
                &routes,
                fwd,
                &req.namespace,
                &req.hashes,
                keys,
                false,
                Some(bytes),
            )
            .await?;
        let mut resp = pb::EstimateLoadResponse::default();
        let mut in_prefix = true;
        for (i, load) in loads.into_iter().enumerate() {
            let found = matches!(l.state(i), KeyState::Found(_));
            let b = match load {
                Some(b) if found => b,
                _ => pb::BlockLoad {
                    tier: Tier::None as i32,
                    load_us: 0.0,
                },
            };
            if in_prefix && found {
                resp.matched += 1;
                resp.total_us += b.load_us;
            } else {
                in_prefix = false;
            }
            resp.blocks.push(b);
        }
        Ok(Some(resp))
    }

    /// Remove everywhere a key may be (its candidates and this node); the number of
    /// keys the group held (None outside a group).
    async fn remove_routed(
        &self,
        client_ns: &str,
        ns: &str,
        hashes: &[Bytes],
        keys: &[CacheKey],
        fwd: &Forward,
    ) -> Result<Option<u32>> {
        let Some((router, routes)) = self.routes_for(ns, hashes) else {
            return Ok(None);
        };
        let (l, _) = self
            .lookup(&router, &routes, fwd, client_ns, hashes, keys, false, None)
            .await?;
        let held = (0..keys.len())
            .filter(|i| matches!(l.state(*i), KeyState::Found(_)))
            .count() as u32;
        let mut per_node: std::collections::BTreeMap<usize, Vec<Bytes>> = Default::default();
        for (i, c) in routes.candidates.iter().enumerate() {
            for n in c {
                if !routes.nodes[*n].local {
                    per_node.entry(*n).or_default().push(hashes[i].clone());
                }
            }
        }
        let calls = per_node.into_iter().map(|(n, batch)| {
            let node = routes.nodes[n].clone();
            let router = router.clone();
            async move { router.remote_remove(&node, fwd, client_ns, batch).await }
        });
        for r in futures::future::join_all(calls).await {
            if let Err(RemoteError::Refused(s)) = r {
                return Err(KvError::Status(s));
            }
        }
        Ok(Some(held))
    }

    /// Prefetch where each block is (None outside a group).
    async fn prefetch_routed(
        &self,
        client_ns: &str,
        ns: &Arc<str>,
        hashes: &[Bytes],
        keys: &[CacheKey],
        fwd: &Forward,
    ) -> Result<Option<pb::PrefetchResponse>> {
        let Some((router, routes)) = self.routes_for(ns, hashes) else {
            return Ok(None);
        };
        let (l, _) = self
            .lookup(&router, &routes, fwd, client_ns, hashes, keys, false, None)
            .await?;
        let mut resp = pb::PrefetchResponse::default();
        let mut local_keys = Vec::new();
        let mut per_node: std::collections::BTreeMap<usize, Vec<Bytes>> = Default::default();
        for i in 0..keys.len() {
            match l.state(i) {
                KeyState::Found(n) if n < routes.nodes.len() && !routes.nodes[n].local => {
                    per_node.entry(n).or_default().push(hashes[i].clone());
                }
                KeyState::Found(_) => local_keys.push(keys[i].clone()),
                _ => resp.missing += 1,
            }
        }
        let local = self.prefetch_local(ns, local_keys);
        resp.staged += local.staged;
        resp.already_fast += local.already_fast;
        resp.missing += local.missing;
        let calls = per_node.into_iter().map(|(n, batch)| {
            let node = routes.nodes[n].clone();
            let router = router.clone();
            async move { router.remote_prefetch(&node, fwd, client_ns, batch).await }
        });
        for r in futures::future::join_all(calls).await {
            match r {
                Ok(p) => {
                    resp.staged += p.staged;
                    resp.already_fast += p.already_fast;
                    resp.missing += p.missing;
                }
                // Staging is advisory: a holder that went away stages nothing.
                Err(RemoteError::Down(_)) => {}
                Err(RemoteError::Refused(s)) => return Err(KvError::Status(s)),
            }
        }
        Ok(Some(resp))
    }
}

/// The hash of a KV key.
fn key_hash(key: &CacheKey) -> &[u8] {
    match key {
        CacheKey::Kv(k) => k.hash.as_ref(),
        _ => &[],
    }
}

/// Checks the calls on the peer listener: the group token, then the tenant and model
/// identity the entry node forwards (`group.rs`).
#[derive(Clone)]
pub struct PeerCheck {
    svc: KvService,
}

impl tonic::service::Interceptor for PeerCheck {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        let inner = &self.svc.inner;
        let Some(router) = inner.router.get() else {
            return Err(Status::unavailable(
                "this node's KV service is not in a group",
            ));
        };
        if let Some(want) = router.opts.token.as_deref() {
            let got = req
                .metadata()
                .get(GROUP_TOKEN_METADATA)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::as_bytes)
                .unwrap_or_default();
            if !constant_time_eq(got, want.as_bytes()) {
                inner.stats.rejected();
                return Err(Status::unauthenticated("missing or wrong group token"));
            }
        }
        if let Some(v) = req.metadata().get(IDENTITY_METADATA) {
            let digest = v
                .to_str()
                .ok()
                .and_then(parse_identity_hex)
                .ok_or_else(|| Status::invalid_argument("bad forwarded model identity"))?;
            req.extensions_mut().insert(CallerIdentity(digest));
        }
        if !inner.tenants.is_empty() {
            // With tenants, a forwarded call acts for one, named by the entry node that
            // authenticated it; its patterns, key space and quota apply here again.
            let tenant = req
                .metadata()
                .get(PEER_TENANT_METADATA)
                .and_then(|v| v.to_str().ok())
                .and_then(|name| inner.tenants.by_name(name))
                .ok_or_else(|| {
                    inner.stats.rejected();
                    Status::permission_denied("a forwarded call must name a known tenant")
                })?;
            req.extensions_mut().insert(AuthTenant(tenant));
        }
        inner.served_for_peers.fetch_add(1, Ordering::Relaxed);
        Ok(req)
    }
}
