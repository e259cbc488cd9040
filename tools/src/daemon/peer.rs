//! The peer listener of the cache group (issue 16): one gRPC server per daemon at
//! `[cluster] listen` (default: every interface on the advertised port), every service
//! behind the group token ([`strata_cluster::peer::PeerAuth`]).
//!
//! Services are added in [`routes`], the one place that lists them: today the file
//! peer (`strata.peer.v1.FilePeer`): an owner serves a block from its tiers, or fetches
//! it from the store through its engine's single-flight, so concurrent asks from the
//! whole group cost one store GET.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use futures::Stream;
use strata_cache_core::{AccessContext, BackingStore, CacheEngine, CacheError, CacheKey, JobId};
use strata_cluster::peer::pb::file_peer_server::{FilePeer, FilePeerServer};
use strata_cluster::peer::pb::{BlockChunk, FetchBlockRequest, HelloRequest, HelloResponse};
use strata_cluster::peer::PeerAuth;
use strata_cluster::NodeId;
use strata_kvcache::accept;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::peer_metrics::PeerMetrics;

/// What the peer services serve from.
#[derive(Clone)]
pub struct PeerContext {
    pub group: String,
    pub node: NodeId,
    pub engine: CacheEngine,
    /// The store the mounts read (None: no mounts, no file blocks to serve).
    pub store: Option<BackingStore>,
    pub metrics: Arc<PeerMetrics>,
    /// The KV service, whose peer face (local-only, `strata_kvcache::group`) is served
    /// here; None: no KV service.
    pub kv: Option<strata_kvcache::KvService>,
}

/// Every service of the peer listener, each behind the group token. A new peer service
/// is one more `add_service(auth.wrap(...))` line here.
fn routes(auth: &PeerAuth, ctx: &PeerContext) -> Routes {
    let auth = VouchingAuth(auth.clone());
    let mut routes = Routes::builder();
    routes.add_service(auth.wrap(FilePeerServer::new(FileService::new(ctx.clone()))));
    if let Some(kv) = &ctx.kv {
        routes.add_service(auth.wrap(kv.peer_grpc()));
    }
    routes.routes()
}

/// The group token check, and a connection whose call passed it keeps its listener
/// slot (`strata_kvcache::accept`): connections that never present the token may be
/// closed to make room, so they cannot lock the group's nodes out.
#[derive(Clone)]
struct VouchingAuth(PeerAuth);

impl VouchingAuth {
    fn wrap<S>(&self, svc: S) -> tonic::service::interceptor::InterceptedService<S, VouchingAuth> {
        tonic::service::interceptor::InterceptedService::new(svc, self.clone())
    }
}

impl tonic::service::Interceptor for VouchingAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let req = self.0.call(req)?;
        if let Some(a) = accept::Admission::of(&req) {
            a.vouch();
        }
        Ok(req)
    }
}

/// Most connections the peer listener keeps at once (`strata_kvcache::accept`): 1024.
/// Its clients are the other nodes of the group, a channel or two each; it listens
/// beyond loopback, so without a cap connections that never close (no token needed to
/// open one) would exhaust the daemon's file descriptors.
const PEER_MAX_CONNECTIONS: usize = 1024;
/// A new peer connection must send the HTTP/2 preface within this long: 10 s, while a
/// live node sends it within a round trip.
const PEER_PREFACE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Binds the peer listener at `listen` and spawns its server into `tasks`; it stops
/// when `stop` is cancelled. Returns the bound address (printed as `peer ADDR`).
pub(crate) async fn start(
    listen: SocketAddr,
    token: Option<&str>,
    ctx: PeerContext,
    stop: &CancellationToken,
    tasks: &mut super::Servers,
) -> anyhow::Result<SocketAddr> {
    let l = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding the peer service on {listen}"))?;
    let addr = l.local_addr()?;
    if token.is_none() {
        tracing::warn!(%addr, "peer service without a group token (loopback only)");
    }
    let auth = PeerAuth::new(token);
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        // Blocks are 1 MiB and up: windows of a few blocks keep a peer link busy.
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        // One connection carries every call a node forwards here: calls its clients
        // gave up reset their streams at once, and past h2's 20 not yet taken the
        // GOAWAY would fail every other forwarded call (as on the KV listener).
        .http2_max_pending_accept_reset_streams(Some(1024))
        .add_routes(routes(&auth, &ctx));
    let stop = stop.clone();
    tasks.spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
        let incoming = accept::gated(
            incoming,
            Arc::new(
                accept::Gate::new(
                    "peer",
                    PEER_MAX_CONNECTIONS,
                    accept::H2_START_BYTES,
                    PEER_PREFACE_TIMEOUT,
                )
                .until_vouched(),
            ),
        );
        router
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await
            .context("peer service")
    });
    Ok(addr)
}

/// Largest block an owner serves: the cache core's largest block.
const MAX_BLOCK: u64 = 64 << 20;
/// Bytes per streamed message: 1 MiB keeps a default-size block in one message and
/// larger ones in a few, well under the 16 MiB the askers accept.
const CHUNK: usize = 1 << 20;

#[derive(Clone)]
struct FileService {
    ctx: PeerContext,
    epoch: Instant,
}

impl FileService {
    fn new(ctx: PeerContext) -> Self {
        FileService {
            ctx,
            epoch: Instant::now(),
        }
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<BlockChunk, Status>> + Send>>;

/// A cache error as the asker sees it: what it may retry elsewhere is UNAVAILABLE.
fn status_of(e: CacheError) -> Status {
    match e {
        CacheError::NotFound(m) => Status::not_found(m),
        CacheError::Changed(m) => Status::failed_precondition(format!("object changed: {m}")),
        CacheError::InvalidArgument(m) => Status::invalid_argument(m),
        other => Status::unavailable(other.to_string()),
    }
}

#[tonic::async_trait]
impl FilePeer for FileService {
    async fn hello(&self, _: Request<HelloRequest>) -> Result<Response<HelloResponse>, Status> {
        Ok(Response::new(HelloResponse {
            group: self.ctx.group.clone(),
            node_id: self.ctx.node.to_string(),
        }))
    }

    type FetchBlockStream = ChunkStream;

    async fn fetch_block(
        &self,
        req: Request<FetchBlockRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let r = req.into_inner();
        let Some(store) = &self.ctx.store else {
            return Err(Status::failed_precondition(
                "this node serves no file store (no [[mounts]])",
            ));
        };
        if r.store != store.label() {
            return Err(Status::failed_precondition(format!(
                "this node reads store {:?}, not {:?}",
                store.label(),
                r.store
            )));
        }
        if r.block_size == 0 || r.block_size > MAX_BLOCK {
            return Err(Status::invalid_argument(format!(
                "block size {} outside 1..={MAX_BLOCK}",
                r.block_size
            )));
        }
        let start = r.block_index.saturating_mul(r.block_size);
        if start >= r.object_size {
            return Err(Status::invalid_argument(format!(
                "block {} of size {} is past the end of a {}-byte object",
                r.block_index, r.block_size, r.object_size
            )));
        }
        let end = start.saturating_add(r.block_size).min(r.object_size);
        let obj = strata_cache_core::ObjectInfo {
            path: r.location.as_str().into(),
            size: r.object_size,
            version: r.version.as_str().into(),
            has_etag: r.has_etag,
            last_modified_unix_ns: r.last_modified_unix_ns,
            block_size: r.block_size,
        };
        let key = CacheKey::file_block(
            obj.path.clone(),
            obj.version.clone(),
            r.block_size,
            r.block_index,
        );
        // The asker's streams stay apart from this node's own in the tracker.
        let job = JobId(strata_types::mix64(
            strata_types::hash_bytes(r.from_node.as_bytes()) ^ r.job,
        ));
        let now = self.epoch.elapsed().as_nanos() as u64;
        let actx = if r.prefetch {
            AccessContext::prefetch(job, now)
        } else {
            AccessContext::demand(job, now)
        };
        let store = store.clone();
        let data = self
            .ctx
            .engine
            .get_or_fetch(&key, &actx, move || async move {
                store.get_range(&obj, start..end).await
            })
            .await
            .map_err(status_of)?;
        self.ctx.metrics.served(&r.from_node, data.len() as u64);
        Ok(Response::new(Box::pin(futures::stream::iter(chunks(data)))))
    }
}

/// `data` as the stream's messages: the first carries the length and crc32c.
fn chunks(data: Bytes) -> Vec<Result<BlockChunk, Status>> {
    let total_len = data.len() as u64;
    let crc32c = crc32c::crc32c(&data);
    let mut out = Vec::with_capacity(data.len().div_ceil(CHUNK).max(1));
    let mut off = 0;
    loop {
        let to = (off + CHUNK).min(data.len());
        let first = off == 0;
        out.push(Ok(BlockChunk {
            data: data.slice(off..to),
            total_len: if first { total_len } else { 0 },
            crc32c: if first { crc32c } else { 0 },
        }));
        off = to;
        if off >= data.len() {
            return out;
        }
    }
}
