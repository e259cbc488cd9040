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
//!   block it pins (and when the client keeps its HTTP/2 window shut so that the
//!   stream cannot even be ended, its connection is closed another idle timeout later);
//!   HTTP/2 keepalive closes dead connections, one connection opens at most
//!   `max_concurrent_streams` streams, a listener keeps at most `max_connections`
//!   connections, and a new one that sends nothing for `preface_timeout` is closed
//!   (`accept.rs`).
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
//!
//! Layout: this module holds the configuration, the entry points and the types the
//! parts share; `service.rs` builds the service and validates, stores and fetches
//! locally; `handlers.rs` is the `KvCache` trait (one method per RPC); `routed.rs`
//! serves keys another node of the cache group may own; `auth.rs` holds the
//! interceptors of the client and peer listeners; `timed_stream.rs` the Get stream that
//! reports to the load model.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use strata_cache_core::key::{KV_BLOCK_MAX, KV_BLOCK_MIN};
use strata_cache_core::{CacheEngine, CacheKey, TierKind};
use tokio::net::{TcpListener, UnixListener};
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Status};

use crate::accept::{self, Gate, H2_START_BYTES};
use crate::error::{KvError, Result};
use crate::group::{Forward, Router};
use crate::identity::{IdentityBindings, IdentityDigest};
use crate::limits::{ConnIo, InflightBudget, PutBudget, Reservation};
use crate::pb::Tier;
use crate::shm::ShmArena;
use crate::staging::Staging;
use crate::stats::KvStats;
use crate::tenants::{Tenant, TenantConfig, Tenants};

mod auth;
mod handlers;
mod routed;
mod service;
mod storing;
mod timed_stream;

pub use auth::{PeerCheck, TokenCheck};
use timed_stream::TimedStream;

/// Longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 128;
/// Longest hash accepted, in bytes (the cache core's limit).
pub const MAX_HASH_LEN: usize = 64;
/// Most keys in one batched request: 64 Ki keys of a 1 KiB... chain is far beyond any
/// context length (1M tokens / 16-token blocks), and bounds the work of one request.
pub const MAX_BATCH_KEYS: usize = 1 << 16;

/// Most namespaces whose block size the get budget remembers (`KvService::
/// get_size_estimate`); a Get in any other reserves `max_block` while it fetches. 4096:
/// far more than the models one cache serves, and a bound on what clients that make
/// up namespaces can make the server keep.
const MAX_SIZED_NAMESPACES: usize = 4096;

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
    /// Bytes of blocks all Get responses hold at once, from when the block is fetched
    /// until the response's body is done (handed to HTTP/2) or dropped. Default 1 GiB,
    /// as the put budget: a Get of a disk-resident block holds its own copy, and a
    /// client that opens many Gets and reads none (zero HTTP/2 window) made the server
    /// hold any number of them (4.9 GB in the finding); past the budget Gets wait for
    /// it (at most `idle_timeout`, then RESOURCE_EXHAUSTED). Loopback Gets at tens of
    /// GB/s hand a block to HTTP/2 in milliseconds, so a healthy load holds far less.
    pub max_inflight_get_bytes: u64,
    /// Bytes of blocks one tenant's Get responses may hold at once, over all its
    /// connections. Default 512 MiB, half the get budget, as for puts: one tenant that
    /// asks for blocks and never reads them leaves at least half to the others
    /// (black-box finding: a tenant's unread Gets over 12 connections held the whole
    /// 1 GiB, and another tenant's Gets timed out, 5 of 6).
    pub per_tenant_get_bytes: u64,
    /// The part of the get budget one connection may hold. Default 256 MiB, a quarter:
    /// one connection that stops reading leaves at least three quarters to the others,
    /// and still has four largest blocks in flight.
    pub per_connection_get_bytes: u64,
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
    /// HTTP/2 stream and connection windows (what a client may send before the server
    /// reads it). Default 8 MiB / 16 MiB: a 1 MiB+ block on loopback is sent without
    /// stalling on window updates (the 64 KiB protocol default halves throughput), two
    /// streams at a time flow at full speed, and the connection window is also what one
    /// connection can make the server buffer past the put budget (Puts waiting for
    /// budget stop reading; the bytes already in flight sit in HTTP/2's buffers), so
    /// it is kept at a few blocks, not more: `max_connections` x `connection_window`
    /// bounds those buffers.
    pub stream_window: u32,
    pub connection_window: u32,
    /// Most connections one listener keeps at once; one more takes the slot of the
    /// oldest connection that has not sent its first bytes, or is closed as soon as it
    /// is accepted when every connection has (`accept.rs`). Default 1024: a node's
    /// clients are its inference engines' workers, a few channels each (tens to a few
    /// hundred connections), while
    /// each connection costs a file descriptor and up to `connection_window` of
    /// buffers, so the cap keeps a flood of connections from exhausting the process's
    /// descriptors (which stops the service for everyone) or its memory.
    pub max_connections: usize,
    /// A new connection must send its first bytes (the HTTP/2 preface and its SETTINGS
    /// frame's header, or a TLS ClientHello) within this long, or it is closed. Default 10 s: a live client
    /// sends them at once (within a round trip of connecting), while a connection that
    /// sends nothing holds a descriptor and a slot of `max_connections` for nothing.
    pub preface_timeout: Duration,
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
            per_tenant_get_bytes: 512 << 20,
            max_inflight_get_bytes: 1 << 30,
            per_connection_get_bytes: 256 << 20,
            idle_timeout: Duration::from_secs(10),
            max_concurrent_streams: 256,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            max_message_bytes: 4 << 20,
            stream_window: 8 << 20,
            connection_window: 16 << 20,
            max_connections: 1024,
            preface_timeout: Duration::from_secs(10),
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
        // Streams a client may reset before the server took them, at once, before h2
        // closes the connection (GOAWAY "too_many_resets", the rapid-reset guard): as
        // many as it may open, not h2's 20. A batch of Gets given up at its deadline
        // resets them all at once, and at 20 the GOAWAY failed the client's other calls
        // on the connection (black-box finding: puts UNAVAILABLE beside a timed-out
        // batch). Still bounded, so a reset flood holds no more than open streams would.
        .http2_max_pending_accept_reset_streams(Some(cfg.max_concurrent_streams as usize))
        .http2_keepalive_interval(Some(cfg.keepalive_interval))
        .http2_keepalive_timeout(Some(cfg.keepalive_timeout))
        // 1 MiB frames: fewer frames (and syscalls) per block than the 16 KiB default.
        .max_frame_size(Some((1 << 20) - 1));
    let listener = listener.into();
    if let Some(tls) = &cfg.tls {
        if matches!(listener, Listener::Tcp(_)) {
            crate::ensure_crypto_provider();
            let cert =
                strata_cache_core::state_file::read_operator_file(&tls.cert).map_err(|e| {
                    KvError::Config(format!("reading TLS cert {}: {e}", tls.cert.display()))
                })?;
            let key = strata_cache_core::state_file::read_operator_file(&tls.key).map_err(|e| {
                KvError::Config(format!("reading TLS key {}: {e}", tls.key.display()))
            })?;
            builder = builder
                .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))?;
        }
    }
    let router = builder.add_service(service.grpc());
    // At least one largest block, so a lone put of it on a connection can proceed.
    let per_conn = cfg.per_connection_put_bytes.max(cfg.max_block);
    let per_conn_get = cfg.per_connection_get_bytes.max(cfg.max_block);
    // Until a request passed authentication, a connection may be closed to make room;
    // after, once idle for the idle timeout (no call, keepalive PINGs aside) while the
    // listener is full (`accept.rs`).
    let gate = |what| {
        Arc::new(
            Gate::new(
                what,
                cfg.max_connections,
                H2_START_BYTES,
                cfg.preface_timeout,
            )
            .until_vouched()
            .evict_idle_after(cfg.idle_timeout),
        )
    };
    match listener {
        Listener::Tcp(l) => {
            let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
            let incoming = accept::gated(incoming, gate("kv tcp"))
                .map(move |c| c.map(|io| ConnIo::gated(io, per_conn, per_conn_get)));
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
        Listener::Unix(l) => {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(l);
            let incoming = accept::gated(incoming, gate("kv unix"))
                .map(move |c| c.map(|io| ConnIo::gated(io, per_conn, per_conn_get)));
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
    }
    Ok(())
}

struct Inner {
    engine: CacheEngine,
    config: ServerConfig,
    registered: HashSet<String>,
    tenants: Arc<Tenants>,
    put_budget: PutBudget,
    /// The bytes Get responses hold (`limits.rs`).
    get_budget: InflightBudget,
    /// The largest block served per namespace: what a Get reserves before fetching.
    get_sizes: parking_lot::RwLock<std::collections::HashMap<Arc<str>, u64>>,
    /// Keys being stored now: one store per key (`storing.rs`).
    storing: Arc<storing::Storing>,
    stats: KvStats,
    started: Instant,
    top_tier: Option<TierKind>,
    /// The KV `Prefetch`, decided and accounted by the daemon's access controller.
    staging: Staging,
    /// Namespaces bound to a model identity (keys v2).
    identities: Arc<IdentityBindings>,
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

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// What a Get serves: the block's bytes (inline or leased in the arena), or a device
/// handle (lease id, handle wire bytes, size).
enum Served {
    /// The block, the tier it was read from, when it was read from this node's tiers
    /// the key's arena change count noted before the read (`ShmArena::lease`), and when
    /// the read began (the load model times the tier from there).
    Bytes(
        CacheKey,
        Bytes,
        Option<TierKind>,
        Option<u64>,
        std::time::Instant,
    ),
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

/// The get budget a Get response holds, shared by its stream and (through the
/// response's extensions) by the body `wire.rs` sends it with: released when both are
/// gone, so a response whose stream the idle guard dropped keeps counting while
/// HTTP/2 still holds its chunks.
#[derive(Clone)]
pub(crate) struct GetHold(#[allow(dead_code)] Arc<Reservation>);

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
/// was aborted or truncated). A Put of a key the ledger already holds relies on that
/// charge, and counts the block itself once stored if that charge was taken back
/// meanwhile (black-box finding: with Puts of repeated keys racing, the Put that had
/// charged a key found it stored by another and refunded it, and the block stayed
/// uncounted: a tenant held 3x its quota while its figure showed it within).
struct QuotaCharge {
    tenant: Arc<Tenant>,
    key: CacheKey,
    size: u64,
    /// This Put added the key to the ledger (false: an earlier or concurrent Put of it
    /// had; a failure then leaves that charge alone).
    new: bool,
    /// How the Put ended, as far as the charge is concerned.
    end: ChargeEnd,
}

/// What becomes of a [`QuotaCharge`] when it is dropped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ChargeEnd {
    /// The Put failed or was cut short: a charge it added is refunded.
    Refunded,
    /// This Put stored the block: it stays charged at its size (counted anew if the
    /// charge it relied on was taken back meanwhile).
    Stored,
    /// Another Put of the key stored it: the charge stays as that Put left it (its size
    /// is the stored block's, not this Put's).
    StoredByAnother,
}

impl Drop for QuotaCharge {
    fn drop(&mut self) {
        match self.end {
            ChargeEnd::Stored => self.tenant.stored(&self.key, self.size),
            ChargeEnd::StoredByAnother => self.tenant.stored_elsewhere(&self.key),
            ChargeEnd::Refunded if self.new => self.tenant.forget(&self.key),
            ChargeEnd::Refunded => {}
        }
    }
}

pub(crate) type BoxStream<T> = Pin<Box<dyn Stream<Item = std::result::Result<T, Status>> + Send>>;

/// The hash of a KV key.
fn key_hash(key: &CacheKey) -> &[u8] {
    match key {
        CacheKey::Kv(k) => k.hash.as_ref(),
        _ => &[],
    }
}
