//! The service's own operations: building it, validating requests, storing and
//! fetching blocks locally.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use strata_cache_core::{AccessContext, CacheEngine, CacheKey, JobId, TierKind};
use tonic::{Request, Status, Streaming};

use super::{
    fnv1a, Blocks, BoxStream, Caller, ChargeEnd, Inner, KvService, PeerCheck, QuotaCharge,
    ServerConfig, TokenCheck, MAX_BATCH_KEYS, MAX_HASH_LEN, MAX_NAMESPACE_LEN,
    MAX_SIZED_NAMESPACES,
};
use crate::blocks::BlocksRequest;
use crate::error::{KvError, Result};
use crate::group::{Forward, GroupOptions, GroupView, Router};
use crate::identity::IdentityBindings;
use crate::limits::{
    put_reservation_for, ConnInfo, IdleGuard, InflightBudget, PutBudget, Reservation,
};
use crate::pb::kv_cache_server::KvCacheServer;
use crate::pb::{self};
use crate::shm::ShmArena;
use crate::staging::Staging;
use crate::stats::KvStats;
use crate::tenants::Tenants;

/// Put messages of fewer bytes than this are copied together into chunks of
/// [`COALESCED_CHUNK`] as they arrive, rather than each kept as a slice of the receive
/// buffer until the put completes (black-box finding: a 32 MiB block sent as 1-byte
/// messages held ~45x its size, 1.45 GB, outside every budget). 16 KiB: clients send
/// far larger messages (the Python client 1 MiB), which stay slices.
const COALESCE_BELOW: usize = 16 << 10;
const COALESCED_CHUNK: usize = 256 << 10;

/// The parts of a put's value as they arrive (see [`COALESCE_BELOW`]).
#[derive(Default)]
struct Parts {
    parts: Vec<Bytes>,
    small: BytesMut,
}

impl Parts {
    fn take(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        if data.len() >= COALESCE_BELOW {
            self.flush_small();
            self.parts.push(data);
            return;
        }
        if self.small.capacity() - self.small.len() < data.len() {
            self.flush_small();
            self.small.reserve(COALESCED_CHUNK);
        }
        self.small.extend_from_slice(&data);
    }

    fn flush_small(&mut self) {
        if !self.small.is_empty() {
            self.parts.push(std::mem::take(&mut self.small).freeze());
        }
    }

    fn done(mut self) -> Vec<Bytes> {
        self.flush_small();
        self.parts
    }
}

/// A put's value of fewer bytes than this, sent as one message, is copied out of the
/// receive buffer rather than kept as a slice of it (see the put's end): 256 KiB, past
/// which the value is most of the buffer it came in.
const SLICE_KEPT_FROM: u64 = 256 << 10;

impl KvService {
    pub fn new(engine: CacheEngine, config: ServerConfig) -> Self {
        let top_tier = engine.tier_kinds().first().copied();
        KvService {
            inner: Arc::new(Inner {
                registered: config.namespaces.iter().cloned().collect(),
                tenants: {
                    let t = Tenants::new(
                        &config.tenants,
                        config.per_tenant_put_bytes.max(config.max_block),
                        config.per_tenant_get_bytes.max(config.max_block),
                    );
                    t.count_recovered(&engine);
                    Arc::new(t)
                },
                // At least one largest block, so a lone put of it can always proceed.
                put_budget: PutBudget::new(config.max_inflight_put_bytes.max(config.max_block)),
                get_budget: InflightBudget::new(
                    config.max_inflight_get_bytes.max(config.max_block),
                ),
                get_sizes: Default::default(),
                // Registered namespaces are always tracked one by one (with tenants,
                // stats name the tenant's key space, "<tenant>:<namespace>", instead).
                stats: KvStats::with_pinned(if config.tenants.is_empty() {
                    &config.namespaces
                } else {
                    &[]
                }),
                storing: Default::default(),
                started: Instant::now(),
                top_tier,
                staging: Staging::default(),
                identities: Arc::new(
                    IdentityBindings::open(config.identity_file.clone())
                        .share_among_tenants(config.tenants.len()),
                ),
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
        let router = Arc::new(Router::new(view, opts)?);
        self.inner
            .router
            .set(router.clone())
            .map_err(|_| KvError::Config("the KV service is already in a group".into()))?;
        router.watch_members();
        self.publish_bindings(router);
        Ok(())
    }

    /// Writes this node's bindings to the group's copy now and every
    /// [`crate::group::REPUBLISH_BINDINGS_EVERY`] (sooner while the group cannot be
    /// asked): bindings made before the group kept them, or loaded from a warm cache
    /// dir, reach the members that join later, and the records of those this node holds
    /// stay alive. Bindings made while the group could not be asked are checked every
    /// [`crate::group::RECHECK_UNCONFIRMED`] until it answers (and at once when a call
    /// is refused for one), and those made in the [`crate::group::RECHECK_RECENT`]
    /// after a registration as often for that time. A binding the group holds for
    /// another identity, made before this node's, gives way to it
    /// ([`Self::adopt_group_binding`]). Each time this node registers with the
    /// group again ([`crate::group::GroupView::registrations`]: etcd back, perhaps
    /// restored empty) a full pass runs within [`crate::group::REGISTRATION_POLL`];
    /// a record deleted or rewritten on etcd that this node holds is checked as soon
    /// ([`crate::group::GroupView::changed_bindings`]). Stops with the service.
    fn publish_bindings(&self, router: Arc<Router>) {
        use crate::group::{
            SharedBindingOp, RECHECK_RECENT, RECHECK_UNCONFIRMED, REGISTRATION_POLL,
            REPUBLISH_BINDINGS_EVERY, REPUBLISH_RETRY,
        };
        let inner = Arc::downgrade(&self.inner);
        // Not the bindings themselves: the task must not keep them (their drop writes
        // the file) past the service.
        let recheck = self.inner.identities.recheck.clone();
        tokio::spawn(async move {
            let mut full_due = tokio::time::Instant::now();
            let mut recheck_due = full_due;
            let mut registrations = router.registrations();
            // Bindings made soon after a registration are checked often (RECHECK_RECENT):
            // only then can a member holding an older one be writing it back.
            let mut registered_at = full_due;
            loop {
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let now_registered = router.registrations();
                let reregistered = now_registered != registrations;
                if reregistered {
                    registrations = now_registered;
                    full_due = tokio::time::Instant::now();
                    registered_at = full_due;
                }
                // Bindings made soon after a registration are checked while it is recent.
                let in_window = registered_at.elapsed() < RECHECK_RECENT;
                let this = KvService {
                    inner,
                    peer_side: false,
                };
                let ids = this.inner.identities.clone();
                // Records deleted or written on etcd: those held here are checked now.
                let changed = router.changed_bindings();
                let now = tokio::time::Instant::now();
                let full = now >= full_due || changed.all;
                let unconfirmed_due = !full && now >= recheck_due;
                let bindings = if full {
                    ids.all()
                } else {
                    let mut some: Vec<_> = changed
                        .namespaces
                        .iter()
                        .filter_map(|ns| {
                            ids.bound(ns).map(|id| (Arc::<str>::from(ns.as_str()), id))
                        })
                        .collect();
                    if unconfirmed_due {
                        some.extend(ids.unconfirmed());
                        if in_window {
                            some.extend(ids.recent(RECHECK_RECENT));
                        }
                    }
                    some.sort_unstable();
                    some.dedup();
                    some
                };
                let mut unanswered = 0usize;
                for (ns, id) in bindings {
                    // Gone or rebound since the listing: nothing of this node's to write.
                    let Some(since_ms) = ids.since_ms(&ns).filter(|_| ids.bound(&ns) == Some(id))
                    else {
                        continue;
                    };
                    // Full passes keep the records alive on this node's lease too;
                    // the frequent checks only correct what is wrong.
                    let op = match full {
                        true => SharedBindingOp::Publish,
                        false => SharedBindingOp::Check,
                    };
                    match router.shared_binding(&ns, &id, since_ms, op).await {
                        None => unanswered += 1,
                        Some(group) => {
                            ids.confirmed(&ns);
                            if group.identity != id {
                                this.adopt_group_binding(&ns, &id, &group).await;
                            }
                        }
                    }
                }
                let now = tokio::time::Instant::now();
                if full {
                    full_due = now
                        + match unanswered {
                            0 => REPUBLISH_BINDINGS_EVERY,
                            // Just registered: etcd answers, so soon again.
                            _ if reregistered => RECHECK_UNCONFIRMED,
                            _ => REPUBLISH_RETRY,
                        };
                }
                if full || unconfirmed_due {
                    recheck_due = now + RECHECK_UNCONFIRMED;
                }
                // A new registration is looked for every REGISTRATION_POLL (no etcd
                // call without one): the sooner the bindings are back after etcd lost
                // them, the shorter the time another model can bind a namespace.
                let mut next = full_due.min(now + REGISTRATION_POLL);
                if !ids.unconfirmed().is_empty() || (in_window && ids.any_recent(RECHECK_RECENT)) {
                    next = next.min(recheck_due);
                }
                drop((ids, this));
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {}
                    // At most a pass a second, however many calls are refused.
                    _ = recheck.notified() => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        recheck_due = tokio::time::Instant::now();
                    }
                }
            }
        });
    }

    /// This node bound the scoped namespace `ns` to `here` while the group's binding,
    /// `group`, names another identity, made before this node's: the group's oldest
    /// binding decides (docs/KV_KEYS.md), so this node takes it and drops the blocks
    /// it stored in `ns` under its own (another model's, or v1 clients' that no binding
    /// guarded). Black-box finding: a member replaced while etcd was away bound a
    /// namespace to model B and kept it after etcd came back, refusing the
    /// namespace's real model its own blocks through every entry node.
    pub(super) async fn adopt_group_binding(
        &self,
        ns: &Arc<str>,
        here: &crate::identity::IdentityDigest,
        group: &crate::group::GroupBinding,
    ) {
        let ids = &self.inner.identities;
        let Some(generation) = ids.adopt(ns, here, &group.identity, group.since_ms) else {
            return;
        };
        // Rebound first, so no put of the other identity stores here from now on
        // (one already past its check takes its block back, `keep_if_still_bound`).
        // (A failed write is logged; the rebinding holds for this run.)
        let _ = ids.durable(generation).await;
        let keys: Vec<CacheKey> = self
            .inner
            .engine
            .resident_kv()
            .into_iter()
            .filter_map(|(k, _)| match &k {
                CacheKey::Kv(kv) if *kv.namespace == **ns => Some(k),
                _ => None,
            })
            .collect();
        let tenant = self.inner.tenants.of_scoped(ns);
        match self.remove_local(&keys, tenant.as_ref()).await {
            Ok(dropped) => tracing::warn!(
                namespace = %ns,
                here = %hex::encode(&here[..6]),
                group = %hex::encode(&group.identity[..6]),
                dropped,
                "this node's KV namespace binding differed from the group's: took the group's and dropped the blocks stored under this node's"
            ),
            Err(e) => tracing::error!(namespace = %ns, error = %e,
                "took the group's KV namespace binding; dropping the blocks stored under this node's failed"),
        }
    }

    /// After a put stored `key` in `ns` for `identity`: if meanwhile the namespace was
    /// rebound to another identity ([`Self::adopt_group_binding`], whose sweep may have
    /// run before this block landed), the block is removed and the put refused.
    pub(super) async fn keep_if_still_bound(
        &self,
        ns: &Arc<str>,
        identity: Option<&crate::identity::IdentityDigest>,
        key: &CacheKey,
        tenant: Option<&Arc<crate::tenants::Tenant>>,
    ) -> Result<()> {
        let Some(id) = identity else {
            return Ok(());
        };
        match self.inner.identities.bound(ns) {
            Some(bound) if bound != *id => {
                if let Err(e) = self.remove_local(std::slice::from_ref(key), tenant).await {
                    tracing::error!(%key, error = %e, "could not drop a block its namespace was rebound under");
                }
                Err(KvError::IdentityMismatch {
                    namespace: ns.to_string(),
                    bound: hex::encode(&bound[..6]),
                    got: hex::encode(&id[..6]),
                })
            }
            _ => Ok(()),
        }
    }

    /// Before a put binds the scoped namespace `ns` on this node for the first time:
    /// the group's binding of it (see [`crate::group::SharedBindingOp::Bind`]), which
    /// refuses the put when it names another identity. A namespace this node has bound
    /// costs nothing (its own binding decides, in [`Self::bind_identity`]).
    /// Ok(false): the group did not answer (etcd away), so the binding the put makes
    /// is this node's alone, to be marked unconfirmed once made
    /// ([`crate::identity::IdentityBindings::mark_unconfirmed`]).
    pub(super) async fn check_shared_binding(
        &self,
        ns: &Arc<str>,
        identity: Option<&crate::identity::IdentityDigest>,
    ) -> Result<bool> {
        let (Some(id), Some(router)) = (identity, self.inner.router.get()) else {
            return Ok(true);
        };
        if self.inner.identities.bound(ns).is_some() {
            return Ok(true);
        }
        // The binding this put makes is made now (`IdentityBindings::check`).
        let since_ms = crate::identity::unix_ms();
        match router
            .shared_binding(ns, id, since_ms, crate::group::SharedBindingOp::Bind)
            .await
        {
            // Unanswered (etcd away): this node's binding decides for now, and is
            // checked against the group's once it answers (`publish_bindings`).
            None => Ok(false),
            Some(group) if group.identity != *id => Err(KvError::IdentityMismatch {
                namespace: ns.to_string(),
                bound: hex::encode(&group.identity[..6]),
                got: hex::encode(&id[..6]),
            }),
            Some(_) => Ok(true),
        }
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
    pub(super) fn router(&self) -> Option<&Arc<Router>> {
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
        s.get_reserved_bytes = self.inner.get_budget.reserved_bytes();
        s.group = self.group_stats();
        s.shm = self.inner.shm.as_ref().map(|a| a.stats());
        s.tenants = self.inner.tenants.stats(&self.inner.engine);
        // Only the tiers this cache has: the others' figures are the model's priors,
        // which a dashboard would show as measured (black-box finding).
        let kinds: Vec<&str> = self
            .inner
            .engine
            .tier_kinds()
            .into_iter()
            .map(|k| k.as_str())
            .collect();
        s.load_model.retain(|t| kinds.contains(&t.tier.as_str()));
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
    pub(super) fn device_lease(
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
    pub(super) fn record_served(&self, ns: &str, key: &CacheKey, size: Option<u64>) {
        self.inner.stats.get(ns, size);
        if size.is_some() {
            // The tenant's quota makes room least recently used first: a read is a use.
            if let Some(t) = self.inner.tenants.of_scoped(ns) {
                t.touched(key);
            }
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
    pub(super) fn job(&self, ns: &str) -> JobId {
        JobId(fnv1a(ns.as_bytes()))
    }

    pub(super) fn ctx(&self, ns: &str, prefetch: bool) -> AccessContext {
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
    pub(super) fn scope(&self, ns: &str, caller: &Caller, bind: bool) -> Result<Arc<str>> {
        if let Some(why) = self.router().and_then(|r| r.refused()) {
            return Err(KvError::NotMember(why));
        }
        self.check_namespace(ns)?;
        let scoped = match caller.tenant.as_deref() {
            Some(t) => t.scope(ns)?,
            None => Arc::from(ns),
        };
        if let Err(e) = self.bind_identity(&scoped, caller.identity.as_ref(), bind) {
            if matches!(e, KvError::IdentityMismatch { .. }) && self.inner.router.get().is_some() {
                // This node's binding may be one made while the group could not be
                // asked: checked against the group's now, not at the next round.
                self.inner.identities.recheck.notify_one();
            }
            return Err(e);
        }
        Ok(scoped)
    }

    /// Checks a call on the scoped namespace `ns` against its identity binding; with
    /// `bind` (a put storing here) an unbound namespace is bound to `identity`. For a
    /// put with an identity, the generation of the binding, to be made durable before
    /// the put is acknowledged.
    pub(super) fn bind_identity(
        &self,
        ns: &Arc<str>,
        identity: Option<&crate::identity::IdentityDigest>,
        bind: bool,
    ) -> Result<Option<u64>> {
        let engine = &self.inner.engine;
        self.inner
            .identities
            .check_reclaiming(ns, identity, bind, || {
                engine
                    .resident_kv()
                    .into_iter()
                    .filter_map(|(k, _)| match k {
                        strata_cache_core::CacheKey::Kv(kv) => Some(kv.namespace.clone()),
                        _ => None,
                    })
                    .collect()
            })
    }

    pub(super) fn check_namespace(&self, ns: &str) -> Result<()> {
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

    pub(super) fn key(&self, ns: &Arc<str>, hash: &[u8]) -> Result<CacheKey> {
        if hash.is_empty() || hash.len() > MAX_HASH_LEN {
            return Err(KvError::Invalid(format!(
                "hash must be 1..={MAX_HASH_LEN} bytes, got {}",
                hash.len()
            )));
        }
        Ok(CacheKey::kv(ns.clone(), hash))
    }

    pub(super) fn keys(
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

    pub(super) fn reject<T>(&self, r: Result<T>) -> std::result::Result<T, Status> {
        r.map_err(|e| {
            if e.code() != tonic::Code::NotFound {
                self.inner.stats.rejected();
            }
            Status::from(e)
        })
    }

    /// A request that names blocks, opened: its tenant, body, scoped namespace and keys
    /// (an invalid namespace or hash is rejected).
    pub(super) fn blocks<R: BlocksRequest>(
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
    pub(super) async fn next_put(
        &self,
        stream: &mut Streaming<pb::PutRequest>,
    ) -> Result<Option<pb::PutRequest>> {
        let idle = self.inner.config.idle_timeout;
        let deadline = tokio::time::Instant::now() + idle;
        let mut next = tokio::time::timeout_at(deadline, stream.message()).await;
        if next.is_err() && strata_cache_core::stall::stalled(deadline, tokio::time::Instant::now())
        {
            // The timer fired late: the daemon was stopped, not the client idle.
            next =
                tokio::time::timeout(strata_cache_core::stall::STALL_GRACE, stream.message()).await;
        }
        match next {
            Ok(m) => Ok(m?),
            Err(_) => {
                self.inner.stats.idle_aborted();
                Err(KvError::Idle { what: "put", idle })
            }
        }
    }

    pub(super) async fn do_put(
        &self,
        conn: Option<ConnInfo>,
        caller: Caller,
        mut stream: Streaming<pb::PutRequest>,
    ) -> Result<pb::PutResponse> {
        // A Remove of the key from now on overlaps this Put (see `store_claimed`).
        let arrived = self.inner.engine.removal_seq();
        let mut first = self.next_put(&mut stream).await?.ok_or_else(|| {
            KvError::Invalid("empty put stream: the first message must carry the key".into())
        })?;
        // Checked here, bound where the block is stored: in a group this node may only
        // pass it on, and the owners decide (black-box finding: a node that rejoined
        // a group, its bindings missed, bound a namespace to a wrong model whose puts
        // every owner refused, and then refused the namespace's real model for good).
        let ns = self.scope(&first.namespace, &caller, false)?;
        let tenant = caller.tenant.clone();
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
        if group.is_none() {
            let answered = self
                .check_shared_binding(&ns, caller.identity.as_ref())
                .await?;
            let made = self.bind_identity(&ns, caller.identity.as_ref(), true)?;
            if !answered {
                self.inner.identities.mark_unconfirmed(&ns);
            }
            if let Some(generation) = made {
                // The block will outlive a crash; so must the binding that guards it.
                if let Err(e) = self.inner.identities.durable(generation).await {
                    self.inner.identities.unbind(&ns, generation);
                    return Err(KvError::BindingNotSaved(e));
                }
            }
        }
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
            Some(t) if group.is_none() => Some(self.charge_quota(t, &key, size).await?),
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
        reserved.cover(put_reservation_for(got, size)).await?;
        let mut parts = Parts::default();
        parts.take(std::mem::take(&mut first.data));
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
            // A later message that names a key names the stream's own, or none: bytes
            // labelled for another key must not become part of this one's value.
            let renamed = (!msg.namespace.is_empty() && msg.namespace != first.namespace)
                || (!msg.hash.is_empty() && msg.hash != first.hash);
            if renamed {
                return Err(KvError::Invalid(
                    "a put stream's later message names another key: one stream stores one block"
                        .into(),
                ));
            }
            got += msg.data.len() as u64;
            reserved.cover(put_reservation_for(got, size)).await?;
            parts.take(msg.data);
        }
        let mut parts = parts.done();
        // The stream must end here: more bytes mean the declared size was wrong.
        while let Some(msg) = self.next_put(&mut stream).await? {
            if !msg.data.is_empty() {
                return Err(KvError::Invalid(format!(
                    "got more than the declared {size} bytes"
                )));
            }
        }
        let data = if parts.len() == 1 && size >= SLICE_KEPT_FROM {
            parts.swap_remove(0)
        } else if parts.len() == 1 {
            // A small value is a slice of the connection's receive buffer, which it
            // would pin whole for as long as the cache keeps it: its own copy instead
            // (black-box finding: 1 KiB blocks cost ~7x the memory budget's bytes).
            Bytes::copy_from_slice(&parts[0])
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
                    arrived,
                )
                .await?;
            return Ok(pb::PutResponse { already_present });
        }
        let engine = &self.inner.engine;
        let Some(slot) = self
            .inner
            .storing
            .claim(&key, || engine.contains(&key))
            .await
        else {
            // Another Put of the key stored it while this one was receiving: the block
            // is in the cache, so this Put's charge stays (another's may have relied on it).
            if let Some(c) = charge.as_mut() {
                c.end = ChargeEnd::StoredByAnother;
            }
            self.inner.stats.put(&ns, size, true);
            return Ok(pb::PutResponse {
                already_present: true,
            });
        };
        self.store_claimed(slot, charge, ns.clone(), key.clone(), data, arrived)
            .await?;
        self.keep_if_still_bound(&ns, caller.identity.as_ref(), &key, tenant.as_ref())
            .await?;
        Ok(pb::PutResponse {
            already_present: false,
        })
    }

    /// Stores `data` under `key` (claimed by `slot`) in a task of its own, which keeps
    /// the slot and the quota charge to the end: a Put whose caller is cancelled
    /// mid-store still finishes (or fails) before another Put or a Remove of the key
    /// looks at it (see `storing.rs`). A Put that a Remove of its key overlapped
    /// (removed after `arrived`, the engine's removal number when the Put came in)
    /// takes effect before that Remove and stores nothing: its client may have given
    /// up while its bytes were still on the way, and sent the Remove, which must not
    /// be undone (crash finding: 1 in ~300 such Puts landed after the Remove).
    pub(super) async fn store_claimed(
        &self,
        slot: super::storing::StoringSlot,
        mut charge: Option<QuotaCharge>,
        ns: Arc<str>,
        key: CacheKey,
        data: Bytes,
        arrived: u64,
    ) -> Result<()> {
        let ctx = self.ctx(&ns, false);
        let inner = self.inner.clone();
        let size = data.len() as u64;
        let store = tokio::spawn(async move {
            if inner.engine.known_removed_since(&key, arrived) {
                // Said to the client, not acknowledged (black-box finding: 52-86 of 300
                // racing Puts were acknowledged while their Remove answered 0, and the
                // block was gone).
                drop(charge);
                drop(slot);
                return Err(KvError::RemovedMeanwhile);
            }
            // The arena's copy of an earlier value goes first (values are immutable
            // only while held: this key may have been evicted and now hold others).
            if let Some(arena) = &inner.shm {
                arena.forget(&key);
            }
            let stored = inner.engine.put(&key, data, &ctx).await;
            if stored.is_ok() {
                if let Some(c) = charge.as_mut() {
                    c.end = ChargeEnd::Stored;
                }
                inner.stats.put(&ns, size, false);
            }
            drop(charge);
            drop(slot);
            stored.map_err(KvError::from)
        });
        match store.await {
            Ok(r) => r,
            Err(e) => Err(KvError::Cache(strata_cache_core::CacheError::Io(
                std::io::Error::other(format!("storing a put failed: {e}")),
            ))),
        }
    }

    /// What a Get in `ns` reserves before it fetches its block: the largest block of
    /// the namespace Gets have served (a model's blocks are all one size), or
    /// `max_block` for a namespace not served yet.
    pub(super) fn get_size_estimate(&self, ns: &str) -> u64 {
        let known = self.inner.get_sizes.read().get(ns).copied();
        known.unwrap_or(self.inner.config.max_block)
    }

    /// Notes the size of a block served in `ns` (see [`Self::get_size_estimate`]).
    pub(super) fn note_get_size(&self, ns: &Arc<str>, size: u64) {
        if self
            .inner
            .get_sizes
            .read()
            .get(&**ns)
            .is_some_and(|&s| s >= size)
        {
            return;
        }
        let mut sizes = self.inner.get_sizes.write();
        if sizes.len() < MAX_SIZED_NAMESPACES || sizes.contains_key(&**ns) {
            let s = sizes.entry(ns.clone()).or_insert(0);
            *s = (*s).max(size);
        }
    }

    /// `stream`, dropped (with the blocks it pins) when the client stops reading it;
    /// when the client keeps its HTTP/2 window shut so that it cannot even be told, its
    /// connection `conn` is closed another idle timeout later (`IdleGuard`).
    pub(super) fn idle_guarded<T: Send + 'static>(
        &self,
        stream: BoxStream<T>,
        what: &'static str,
        conn: Option<ConnInfo>,
    ) -> BoxStream<T> {
        let this = self.clone();
        let stuck = self.clone();
        Box::pin(IdleGuard::new(
            stream,
            self.inner.config.idle_timeout,
            what,
            move || this.inner.stats.idle_aborted(),
            move || {
                if conn.is_some_and(|c| c.abort()) {
                    stuck.inner.stats.idle_connections_closed();
                    tracing::debug!("closed a connection whose {what} stream stays unread");
                }
            },
        ))
    }

    /// Fetches one block, counting the hit or miss.
    pub(super) async fn fetch(
        &self,
        ns: &str,
        key: &CacheKey,
    ) -> Result<Option<(Bytes, Option<TierKind>)>> {
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

    pub(super) fn chunks(&self, data: &Bytes) -> Vec<Bytes> {
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

#[cfg(test)]
mod parts_tests {
    use super::*;

    /// Black-box finding (round 16): a 32 MiB block put as 1-byte messages held each as
    /// its own slice of the receive buffer until the put completed, ~45x the block.
    /// Small messages are copied together as they arrive, in order; large ones stay
    /// slices.
    #[test]
    fn tiny_put_messages_are_coalesced_in_order() {
        let mut parts = Parts::default();
        let mut want = Vec::new();
        for i in 0..300_000u32 {
            let b = [(i % 251) as u8];
            want.extend_from_slice(&b);
            parts.take(Bytes::copy_from_slice(&b));
        }
        let big = Bytes::from(vec![7u8; COALESCE_BELOW]);
        want.extend_from_slice(&big);
        parts.take(big.clone());
        parts.take(Bytes::new());
        parts.take(Bytes::from_static(b"end"));
        want.extend_from_slice(b"end");
        let parts = parts.done();
        assert!(parts.len() <= 5, "{} pieces held", parts.len());
        assert!(
            parts.iter().any(|p| p.as_ptr() == big.as_ptr()),
            "kept as a slice"
        );
        assert_eq!(parts.concat(), want);
    }
}
