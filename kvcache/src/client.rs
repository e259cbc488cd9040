//! Rust client of `strata.kv.v1`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), strata_kvcache::KvError> {
//! use strata_kvcache::{keys, KvClient};
//! let mut c = KvClient::connect("unix:///var/cache/strata/kv.sock").await?;
//! let tokens: Vec<u32> = (0..512).collect();
//! let hashes = keys::chain_hashes_v1(&tokens, 256, b"", false);
//! c.put("llama3-8b/tenant-a", &hashes[0], bytes::Bytes::from(vec![0u8; 4096])).await?;
//! let cached = c.match_prefix("llama3-8b/tenant-a", &hashes).await?; // 1
//! # let _ = cached; Ok(()) }
//! ```
//!
//! Addresses: `unix:///path/kv.sock`, `http://host:port`, `https://host:port` (TLS,
//! see [`ClientOptions`]) or a bare `host:port` (plaintext). The client is cheap to
//! clone: clones share one HTTP/2 connection, which multiplexes concurrent requests.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use hyper_util::rt::TokioIo;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Uri};
use tonic::Request;

use crate::blocks::BlocksRequest;

/// Numbers this process's leasing calls ([`crate::shm::SHM_REQUEST_METADATA`]).
static NEXT_SHM_CALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A leasing call in flight: unless it completes, the leases that answered it are
/// given up (a call cut off by an error, or dropped by a caller's timeout, never
/// delivered their ids; black-box finding: they stayed leased for the session's life).
struct LeasingCall {
    shm: Arc<crate::shm_client::ShmClient>,
    number: u64,
    completed: bool,
}

impl LeasingCall {
    fn new(shm: Arc<crate::shm_client::ShmClient>) -> Self {
        let number = NEXT_SHM_CALL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            & !crate::shm::ABANDON_BIT;
        LeasingCall {
            shm,
            number,
            completed: false,
        }
    }

    fn metadata(&self) -> MetadataValue<tonic::metadata::Ascii> {
        MetadataValue::from(self.number)
    }
}

impl Drop for LeasingCall {
    fn drop(&mut self) {
        if !self.completed {
            self.shm.abandon(self.number);
        }
    }
}
use crate::error::{KvError, Result};
use crate::pb;
use crate::pb::kv_cache_client::KvCacheClient;
use crate::server::DEFAULT_CHUNK_BYTES;

/// Connection options beyond the address.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// Bearer token sent with every request.
    pub token: Option<String>,
    /// PEM of the CA that signed the server's certificate (for `https://`).
    pub ca_cert: Option<PathBuf>,
    /// Name the server's certificate must carry (default: the address's host).
    pub tls_domain: Option<String>,
    /// The model identity digest ([`crate::keys::ModelIdentity::digest`]) sent with
    /// every request: the service binds each namespace to the first identity that puts
    /// into it and refuses another (FAILED_PRECONDITION).
    pub identity: Option<[u8; 32]>,
}

/// Where a block is, as the server reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockTier {
    None,
    Gpu,
    Memory,
    Disk,
}

impl From<i32> for BlockTier {
    fn from(t: i32) -> Self {
        match pb::Tier::try_from(t) {
            Ok(pb::Tier::Gpu) => BlockTier::Gpu,
            Ok(pb::Tier::Memory) => BlockTier::Memory,
            Ok(pb::Tier::Disk) => BlockTier::Disk,
            _ => BlockTier::None,
        }
    }
}

/// Answer of [`KvClient::estimate_load`].
#[derive(Clone, Debug, PartialEq)]
pub struct LoadEstimate {
    /// Per key: where it is and the expected load time now (microseconds).
    pub blocks: Vec<(BlockTier, f64)>,
    /// Leading keys cached.
    pub matched: usize,
    /// Expected time to load the matched prefix, in microseconds.
    pub total_us: f64,
}

/// Answer of [`KvClient::prefetch`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchOutcome {
    pub staged: u32,
    pub already_fast: u32,
    pub missing: u32,
}

/// A connection to a Strata KV service.
#[derive(Clone)]
pub struct KvClient {
    inner: KvCacheClient<Channel>,
    /// The same connection, for `Get`, which this client decodes itself (`wire.rs`).
    channel: Channel,
    /// Scheme and authority of the requests sent on `channel`.
    origin: Uri,
    token: Option<MetadataValue<tonic::metadata::Ascii>>,
    identity: Option<MetadataValue<tonic::metadata::Ascii>>,
    chunk_bytes: usize,
    /// The attached shared-memory arena and its session id (same host only).
    shm: Option<Arc<crate::shm_client::ShmClient>>,
    shm_session: Option<MetadataValue<tonic::metadata::Ascii>>,
    /// The side socket attached to, to attach again after the daemon restarts.
    shm_path: Option<std::path::PathBuf>,
    /// Ask for device handles of GPU-tier blocks ([`Self::want_device_handles`]).
    want_device: bool,
}

/// A fetched block: owned bytes, or a leased range of the shared-memory arena read in
/// place (the lease is released when this drops).
pub enum Block {
    Inline(Bytes),
    Shared {
        shm: Arc<crate::shm_client::ShmClient>,
        lease: u64,
        offset: u64,
        len: u64,
    },
    /// A block of the daemon's GPU tier, by device handle (`strata_gds::ipc`), leased
    /// until this drops. Dereferences to its bytes for an emulated device (read in place
    /// in the device memory the daemon sent); for CUDA to nothing: open `handle` with
    /// the CUDA IPC API instead.
    Device {
        shm: Arc<crate::shm_client::ShmClient>,
        lease: u64,
        handle: strata_gds::IpcHandle,
    },
}

impl Block {
    /// Whether it was served from the shared-memory arena.
    pub fn is_shared(&self) -> bool {
        matches!(self, Block::Shared { .. })
    }

    /// The device handle, when it was served by one.
    pub fn device_handle(&self) -> Option<&strata_gds::IpcHandle> {
        match self {
            Block::Device { handle, .. } => Some(handle),
            _ => None,
        }
    }
}

impl std::ops::Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Block::Inline(b) => b,
            // Checked in range when the lease was received.
            Block::Shared {
                shm, offset, len, ..
            } => shm.read(*offset, *len).unwrap_or_default(),
            // Checked in range when the handle was received.
            Block::Device { shm, handle, .. } => shm
                .device_read(&handle.token, handle.offset, handle.len)
                .unwrap_or_default(),
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        match self {
            Block::Shared { shm, lease, .. } | Block::Device { shm, lease, .. } => {
                shm.release_now(*lease)
            }
            Block::Inline(_) => {}
        }
    }
}

/// One entry of a BatchLease answer, before the blocks not leased are fetched.
enum LeaseEntry {
    Missing,
    AsBytes,
    Block(Block),
}

/// Largest message the client accepts: 8 MiB, above the server's chunk size with room.
const MAX_MESSAGE_BYTES: usize = 8 << 20;

impl KvClient {
    /// Connects to `addr` (see the module docs for the forms accepted).
    pub async fn connect(addr: &str) -> Result<Self> {
        Self::connect_with(addr, ClientOptions::default()).await
    }

    pub async fn connect_with(addr: &str, opts: ClientOptions) -> Result<Self> {
        let mut origin = Uri::from_static("http://localhost");
        let channel = if let Some(path) = addr.strip_prefix("unix://") {
            let path = PathBuf::from(path);
            // The URI is ignored by the connector; it must merely parse.
            tune(Endpoint::from_static("http://localhost"))
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await?
        } else {
            let url = if addr.contains("://") {
                addr.to_string()
            } else {
                format!("http://{addr}")
            };
            let mut ep = tune(
                Endpoint::from_shared(url.clone())
                    .map_err(|e| KvError::Config(format!("bad address {addr:?}: {e}")))?,
            );
            origin = ep.uri().clone();
            if url.starts_with("https://") {
                crate::ensure_crypto_provider();
                let mut tls = ClientTlsConfig::new();
                if let Some(ca) = &opts.ca_cert {
                    let pem =
                        strata_cache_core::state_file::read_operator_file(ca).map_err(|e| {
                            KvError::Config(format!("reading CA {}: {e}", ca.display()))
                        })?;
                    tls = tls.ca_certificate(Certificate::from_pem(pem));
                }
                if let Some(d) = &opts.tls_domain {
                    tls = tls.domain_name(d.clone());
                }
                ep = ep.tls_config(tls)?;
            }
            ep.connect().await?
        };
        let token = match &opts.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| KvError::Config("token must be printable ASCII".into()))?,
            ),
            None => None,
        };
        Ok(KvClient {
            inner: KvCacheClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            token,
            identity: opts
                .identity
                .map(|d| MetadataValue::try_from(hex::encode(d)))
                .transpose()
                .map_err(|_| KvError::Config("identity digest as metadata".into()))?,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            channel,
            origin,
            shm: None,
            shm_session: None,
            shm_path: None,
            want_device: false,
        })
    }

    fn req<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        if let Some(t) = &self.token {
            r.metadata_mut().insert("authorization", t.clone());
        }
        if let Some(i) = &self.identity {
            r.metadata_mut()
                .insert(crate::keys::IDENTITY_METADATA, i.clone());
        }
        r
    }

    /// Stores a block; returns whether the key was already cached (idempotent put).
    pub async fn put(&mut self, namespace: &str, hash: &[u8], data: Bytes) -> Result<bool> {
        let size = data.len() as u64;
        let step = self.chunk_bytes;
        let mut msgs = Vec::with_capacity(data.len() / step + 1);
        let mut off = 0;
        loop {
            let end = (off + step).min(data.len());
            let first = off == 0;
            msgs.push(pb::PutRequest {
                namespace: if first {
                    namespace.to_string()
                } else {
                    String::new()
                },
                hash: if first {
                    Bytes::copy_from_slice(hash)
                } else {
                    Bytes::new()
                },
                size: if first { size } else { 0 },
                data: data.slice(off..end),
            });
            off = end;
            if off >= data.len() {
                break;
            }
        }
        let resp = self.inner.put(self.req(tokio_stream::iter(msgs))).await?;
        Ok(resp.into_inner().already_present)
    }

    /// Fetches a block; `None` when it is not cached.
    pub async fn get(&mut self, namespace: &str, hash: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.get_block(namespace, hash).await?.map(|b| match &b {
            Block::Inline(bytes) => bytes.clone(),
            // The caller wants owned bytes: one copy out of the arena, lease released.
            Block::Shared { .. } | Block::Device { .. } => Bytes::copy_from_slice(&b),
        }))
    }

    /// Attaches to the daemon's shared-memory arena (its side socket, `kv-shm.sock`
    /// beside `kv.sock`): later Gets of this client are answered with leased ranges of
    /// the arena where possible ([`Self::get_block`]), without a copy through the socket.
    /// After the daemon restarts (its sessions are gone), [`Self::get_blocks`] attaches
    /// again at the same socket, or, when that fails, fetches blocks as bytes.
    pub async fn attach_shm(&mut self, side_socket: &std::path::Path) -> Result<()> {
        let shm = crate::shm_client::ShmClient::connect(side_socket).await?;
        self.shm_session = Some(
            MetadataValue::try_from(shm.session_hex())
                .map_err(|_| KvError::Config("session id as metadata".into()))?,
        );
        self.shm = Some(Arc::new(shm));
        self.shm_path = Some(side_socket.to_path_buf());
        Ok(())
    }

    /// The daemon no longer holds this client's session: attach again, or go on
    /// without the arena when that fails (blocks come as bytes). Blocks leased from the
    /// old arena stay readable (they hold its mapping).
    async fn attach_again(&mut self) {
        let Some(path) = self.shm_path.clone() else {
            return;
        };
        if let Err(e) = self.attach_shm(&path).await {
            tracing::warn!(path = %path.display(), "the shared-memory session ended and attaching again failed ({e}); blocks now come as bytes");
            self.shm = None;
            self.shm_session = None;
        }
    }

    /// After [`Self::attach_shm`]: ask for device handles of blocks resident in the
    /// daemon's GPU tier (for a client whose own buffers are on the same device);
    /// [`Self::get_block`] then returns [`Block::Device`] for those.
    pub fn want_device_handles(&mut self, on: bool) {
        self.want_device = on;
    }

    /// Fetches one block: in place in the shared-memory arena when attached and the
    /// server leased it (released when the [`Block`] drops), else inline bytes.
    pub async fn get_block(&mut self, namespace: &str, hash: &[u8]) -> Result<Option<Block>> {
        let mut req = self.req(pb::GetRequest {
            namespace: namespace.to_string(),
            hash: Bytes::copy_from_slice(hash),
        });
        let mut call = None;
        if let (Some(s), Some(shm)) = (&self.shm_session, &self.shm) {
            let c = LeasingCall::new(shm.clone());
            req.metadata_mut()
                .insert(crate::shm::SHM_SESSION_METADATA, s.clone());
            req.metadata_mut()
                .insert(crate::shm::SHM_REQUEST_METADATA, c.metadata());
            call = Some(c);
            if self.want_device {
                req.metadata_mut().insert(
                    crate::shm::DEVICE_IPC_METADATA,
                    MetadataValue::from_static("1"),
                );
            }
        }
        let (metadata, _, msg) = req.into_parts();
        // The first message (size, or a lease), then the chunks of an inline block:
        // one chunk is kept as it came (sliced out of its frame), several are gathered.
        let mut first: Option<pb::GetResponse> = None;
        let mut gathered: Option<BytesMut> = None;
        let r = crate::wire::call_get(
            &mut self.channel,
            &self.origin,
            metadata,
            &msg,
            MAX_MESSAGE_BYTES,
            |m| {
                match (&mut first, &mut gathered) {
                    (None, _) => first = Some(m),
                    (Some(f), None) => {
                        // The declared size, within the largest block a server stores.
                        let cap = (f.size as usize).min(strata_cache_core::key::KV_BLOCK_MAX);
                        let mut buf = BytesMut::with_capacity(cap);
                        buf.extend_from_slice(&std::mem::take(&mut f.data));
                        buf.extend_from_slice(&m.data);
                        gathered = Some(buf);
                    }
                    (Some(_), Some(buf)) => buf.extend_from_slice(&m.data),
                }
                Ok(true)
            },
        )
        .await;
        match r {
            Ok(()) => {}
            Err(KvError::Status(s))
                if s.code() == tonic::Code::NotFound && s.message() == "block not found" =>
            {
                if let Some(c) = call.as_mut() {
                    c.completed = true; // answered: nothing leased
                }
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        // The answer came: its lease (if any) is owned from here on.
        if let Some(c) = call.as_mut() {
            c.completed = true;
        }
        let Some(first) = first else {
            return Err(KvError::Invalid("empty Get stream".into()));
        };
        let size = first.size as usize;
        if !first.device_handle.is_empty() {
            let shm = self.shm.clone().ok_or_else(|| {
                KvError::Invalid("server answered with a device handle unasked".into())
            })?;
            let handle = match strata_gds::IpcHandle::from_bytes(&first.device_handle) {
                Ok(h) if h.len == first.size => h,
                other => {
                    shm.release_now(first.shm_lease);
                    return Err(KvError::Invalid(format!("bad device handle: {other:?}")));
                }
            };
            if handle.kind == strata_gds::DeviceKind::Emulated
                && shm
                    .device_read(&handle.token, handle.offset, handle.len)
                    .is_none()
            {
                shm.release_now(first.shm_lease);
                return Err(KvError::Invalid(
                    "device handle outside the device memory the daemon sent".into(),
                ));
            }
            return Ok(Some(Block::Device {
                shm,
                lease: first.shm_lease,
                handle,
            }));
        }
        if first.shm_lease != 0 {
            let shm = self.shm.clone().ok_or_else(|| {
                KvError::Invalid("server answered with a shared-memory lease unasked".into())
            })?;
            if shm.read(first.shm_offset, first.size).is_none() {
                shm.release_now(first.shm_lease);
                return Err(KvError::Invalid(format!(
                    "lease [{}, +{}) lies outside the {}-byte arena",
                    first.shm_offset,
                    first.size,
                    shm.size()
                )));
            }
            return Ok(Some(Block::Shared {
                shm,
                lease: first.shm_lease,
                offset: first.shm_offset,
                len: first.size,
            }));
        }
        let data = match gathered {
            Some(buf) => buf.freeze(),
            None => first.data,
        };
        if data.len() != size {
            return Err(KvError::Truncated {
                got: data.len() as u64,
                declared: size as u64,
            });
        }
        Ok(Some(Block::Inline(data)))
    }

    /// Fetches several blocks: attached to the shared-memory arena, leased in place in
    /// one round trip (the BatchLease call), a block the arena could not lease then as
    /// [`Self::get_block`] does; not attached, as [`Self::batch_get`]'s bytes. `None` for
    /// each one not cached.
    pub async fn get_blocks(
        &mut self,
        namespace: &str,
        hashes: &[impl AsRef<[u8]>],
    ) -> Result<Vec<Option<Block>>> {
        let mut attached_again = false;
        let (shm, answer) = loop {
            let (Some(shm), Some(session)) = (self.shm.clone(), self.shm_session.clone()) else {
                let got = self.batch_get(namespace, hashes).await?;
                return Ok(got.into_iter().map(|b| b.map(Block::Inline)).collect());
            };
            let mut req = self.req(pb::BatchGetRequest::named(namespace, hashes));
            let mut call = LeasingCall::new(shm.clone());
            req.metadata_mut()
                .insert(crate::shm::SHM_SESSION_METADATA, session);
            req.metadata_mut()
                .insert(crate::shm::SHM_REQUEST_METADATA, call.metadata());
            match self.inner.batch_lease(req).await {
                Ok(a) => {
                    call.completed = true;
                    break (shm, a.into_inner());
                }
                Err(s)
                    if !attached_again
                        && s.code() == tonic::Code::FailedPrecondition
                        && s.message() == crate::shm::SESSION_ENDED =>
                {
                    attached_again = true;
                    self.attach_again().await;
                }
                Err(s) => return Err(s.into()),
            }
        };
        // Each lease is owned by a Block from here on, so any early return releases it.
        let mut leased: Vec<LeaseEntry> = answer
            .blocks
            .into_iter()
            .map(|b| match (b.found, b.shm_lease) {
                (false, _) => LeaseEntry::Missing,
                (true, 0) => LeaseEntry::AsBytes,
                (true, lease) => LeaseEntry::Block(Block::Shared {
                    shm: shm.clone(),
                    lease,
                    offset: b.shm_offset,
                    len: b.size,
                }),
            })
            .collect();
        if leased.len() != hashes.len() {
            return Err(KvError::Invalid(format!(
                "BatchLease answered {} entries for {} keys",
                leased.len(),
                hashes.len()
            )));
        }
        for l in &leased {
            if let LeaseEntry::Block(Block::Shared { offset, len, .. }) = l {
                if shm.read(*offset, *len).is_none() {
                    return Err(KvError::Invalid(format!(
                        "lease [{offset}, +{len}) lies outside the {}-byte arena",
                        shm.size()
                    )));
                }
            }
        }
        let mut out = Vec::with_capacity(leased.len());
        for (l, hash) in leased.drain(..).zip(hashes) {
            out.push(match l {
                LeaseEntry::Missing => None,
                LeaseEntry::Block(b) => Some(b),
                LeaseEntry::AsBytes => self.get_block(namespace, hash.as_ref()).await?,
            });
        }
        Ok(out)
    }

    /// Fetches several blocks; `None` for each one not cached.
    pub async fn batch_get(
        &mut self,
        namespace: &str,
        hashes: &[impl AsRef<[u8]>],
    ) -> Result<Vec<Option<Bytes>>> {
        let req = self.req(pb::BatchGetRequest::named(namespace, hashes));
        let mut stream = self.inner.batch_get(req).await?.into_inner();
        let mut out: Vec<Option<Bytes>> = vec![None; hashes.len()];
        let mut cur: Option<(usize, usize, BytesMut)> = None;
        while let Some(m) = stream.message().await? {
            let i = m.index as usize;
            if i >= out.len() {
                return Err(KvError::Invalid(format!(
                    "server sent index {i} of {}",
                    out.len()
                )));
            }
            if !m.found {
                continue;
            }
            if m.size > 0 {
                if let Some((j, _, buf)) = cur.take() {
                    out[j] = Some(buf.freeze());
                }
                let mut buf = BytesMut::with_capacity(m.size as usize);
                buf.extend_from_slice(&m.data);
                cur = Some((i, m.size as usize, buf));
            } else if let Some((_, _, buf)) = cur.as_mut() {
                buf.extend_from_slice(&m.data);
            }
            if let Some((j, size, buf)) = cur.as_ref() {
                if buf.len() >= *size {
                    let j = *j;
                    if let Some((_, _, buf)) = cur.take() {
                        out[j] = Some(buf.freeze());
                    }
                }
            }
        }
        Ok(out)
    }

    pub async fn exists(&mut self, namespace: &str, hash: &[u8]) -> Result<bool> {
        let req = self.req(pb::ExistsRequest {
            namespace: namespace.to_string(),
            hash: Bytes::copy_from_slice(hash),
        });
        Ok(self.inner.exists(req).await?.into_inner().exists)
    }

    /// Where a block is (None when not cached).
    pub async fn locate(&mut self, namespace: &str, hash: &[u8]) -> Result<BlockTier> {
        let req = self.req(pb::ExistsRequest {
            namespace: namespace.to_string(),
            hash: Bytes::copy_from_slice(hash),
        });
        Ok(self.inner.exists(req).await?.into_inner().tier.into())
    }

    /// Whether each key is cached.
    pub async fn batch_exists(
        &mut self,
        namespace: &str,
        hashes: &[impl AsRef<[u8]>],
    ) -> Result<Vec<bool>> {
        let req = self.req(pb::BatchExistsRequest::named(namespace, hashes));
        Ok(self.inner.batch_exists(req).await?.into_inner().exists)
    }

    /// Number of leading keys of the chain that are cached (stops at the first miss).
    pub async fn match_prefix(
        &mut self,
        namespace: &str,
        hashes: &[impl AsRef<[u8]>],
    ) -> Result<usize> {
        let req = self.req(pb::MatchPrefixRequest::named(namespace, hashes));
        Ok(self.inner.match_prefix(req).await?.into_inner().matched as usize)
    }

    /// LMCache's name for [`Self::match_prefix`].
    pub async fn batched_contains(
        &mut self,
        namespace: &str,
        hashes: &[impl AsRef<[u8]>],
    ) -> Result<usize> {
        self.match_prefix(namespace, hashes).await
    }

    /// Removes keys; returns how many were cached.
    pub async fn remove(&mut self, namespace: &str, hashes: &[impl AsRef<[u8]>]) -> Result<u32> {
        let req = self.req(pb::RemoveRequest::named(namespace, hashes));
        Ok(self.inner.remove(req).await?.into_inner().removed)
    }

    /// Stages blocks into the server's fastest tier.
    pub async fn prefetch(
        &mut self,
        namespace: &str,
        hashes: &[impl AsRef<[u8]>],
    ) -> Result<PrefetchOutcome> {
        let req = self.req(pb::PrefetchRequest::named(namespace, hashes));
        let r = self.inner.prefetch(req).await?.into_inner();
        Ok(PrefetchOutcome {
            staged: r.staged,
            already_fast: r.already_fast,
            missing: r.missing,
        })
    }

    /// Where each block of a chain is and the expected load time now; `block_bytes` 0
    /// lets the server assume the namespace's mean block size.
    pub async fn estimate_load(
        &mut self,
        namespace: &str,
        hashes: &[impl AsRef<[u8]>],
        block_bytes: u64,
    ) -> Result<LoadEstimate> {
        let req = self.req(pb::EstimateLoadRequest {
            block_bytes,
            ..BlocksRequest::named(namespace, hashes)
        });
        let r = self.inner.estimate_load(req).await?.into_inner();
        Ok(LoadEstimate {
            blocks: r
                .blocks
                .iter()
                .map(|b| (BlockTier::from(b.tier), b.load_us))
                .collect(),
            matched: r.matched as usize,
            total_us: r.total_us,
        })
    }

    /// The server's version, API version and block size limit.
    pub async fn ping(&mut self) -> Result<pb::PingResponse> {
        Ok(self
            .inner
            .ping(self.req(pb::PingRequest {}))
            .await?
            .into_inner())
    }

    /// The raw generated client, for requests this wrapper does not shape (tests send
    /// malformed streams through it).
    pub fn raw(&mut self) -> &mut KvCacheClient<Channel> {
        &mut self.inner
    }
}

fn tune(ep: Endpoint) -> Endpoint {
    // Same windows as the server (see `ServerConfig`). The frame size a client
    // advertises bounds the DATA frames the server sends it. No Nagle delay.
    ep.tcp_nodelay(true)
        .initial_stream_window_size(8 << 20)
        .initial_connection_window_size(32 << 20)
        // The largest frame HTTP/2 allows (2^24 - 1): a Get's block chunk (1 MiB by
        // default) then arrives as one frame, which `wire.rs` slices instead of copying.
        .max_frame_size((1u32 << 24) - 1)
}
