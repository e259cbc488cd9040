//! The `KvCache` trait: each RPC validated, then served locally or through the group.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::{tier_pb, Blocks, BoxStream, Caller, GetHold, KvService, Served, TimedStream};
use crate::error::KvError;
use crate::limits::ConnInfo;
use crate::pb::kv_cache_server::KvCache;
use crate::pb::{self, Tier};
use crate::routing::KeyState;
use crate::shm::{parse_session, DEVICE_IPC_METADATA, SHM_SESSION_METADATA};

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
        let conn = ConnInfo::of(&request);
        let session = self.shm_session(&request);
        let call = shm_call(&request);
        let wants_device =
            session.is_some() && request.metadata().contains_key(DEVICE_IPC_METADATA);
        let req = request.into_inner();
        // The get budget (`limits.rs`): the block's bytes are reserved before it is
        // fetched (a disk-resident block is read into a copy of its own), at the size
        // this namespace's blocks have had, then trimmed to the block's: Gets waiting
        // for budget hold no block.
        let mut held = self.inner.get_budget.get_reservation(
            conn.clone(),
            caller.tenant.as_ref().map(|t| t.get_inflight()),
            self.inner.config.idle_timeout,
        );
        let r = async {
            let ns = self.scope(&req.namespace, &caller, false)?;
            let key = self.key(&ns, &req.hash)?;
            if let (true, Some(s)) = (wants_device, session) {
                if let Some(lease) = self.device_lease(&ns, s, &key) {
                    return Ok(Served::Device(lease));
                }
            }
            let estimate = self.get_size_estimate(&ns);
            held.cover(estimate).await?;
            let since = self.inner.shm.as_ref().map(|a| a.changes(&key));
            let read_from = std::time::Instant::now();
            let (data, tier) = self
                .fetch_routed(&req.namespace, &ns, &key, &req.hash, &caller.forward())
                .await?
                .ok_or(KvError::NotFound)?;
            let size = data.len() as u64;
            self.note_get_size(&ns, size);
            if size > estimate {
                held.cover(size).await?;
            } else {
                held.shrink_to(size);
            }
            Ok(Served::Bytes(key, data, tier, tier.and(since), read_from))
        }
        .await;
        let (key, data, tier, local_since, read_from) = match self.reject(r)? {
            Served::Bytes(key, data, tier, since, from) => (key, data, tier, since, from),
            Served::Device((lease, handle, size)) => {
                if let (Some(arena), Some(s), Some(c)) = (&self.inner.shm, session, call) {
                    arena.answered(s, c, &[lease]);
                }
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
            (Some(arena), Some(s)) => {
                let lease = arena.lease(s, &key, &data, local_since);
                if let (Some(l), Some(c)) = (&lease, call) {
                    arena.answered(s, c, &[l.id]);
                }
                lease
            }
            _ => None,
        };
        // Inline bytes: the response holds the block (a private copy when it came from
        // disk) until HTTP/2 has it; the get budget bounds what all of them hold.
        let hold = match lease {
            Some(_) => None,
            None => Some(GetHold(Arc::new(held))),
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
        drop(data);
        let Some(hold) = hold else {
            // One small message: the block stays in the arena, not in the response.
            return Ok(Response::new(Box::pin(
                TimedStream::new(futures::stream::iter(msgs), self.clone(), tier, size)
                    .timed_from(read_from),
            )));
        };
        let held = hold.clone();
        let stream: BoxStream<pb::GetResponse> = Box::pin(
            TimedStream::new(
                futures::stream::iter(msgs).map(move |m| {
                    let _ = &held;
                    m
                }),
                self.clone(),
                tier,
                size,
            )
            .timed_from(read_from),
        );
        // Even a one-message answer is guarded: HTTP/2 takes the message on the first
        // poll but holds it (a slice that pins the whole block) until the client's
        // window has room, so a client that never opens it would pin the block for as
        // long as it keeps the connection alive; the guard closes that connection.
        let mut resp = Response::new(self.idle_guarded(stream, "get", conn));
        resp.extensions_mut().insert(hold);
        Ok(resp)
    }

    type BatchGetStream = BoxStream<pb::BatchGetResponse>;

    async fn batch_get(
        &self,
        request: Request<pb::BatchGetRequest>,
    ) -> std::result::Result<Response<Self::BatchGetStream>, Status> {
        let fwd = Caller::of(&request).forward();
        let conn = ConnInfo::of(&request);
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
        Ok(Response::new(self.idle_guarded(
            Box::pin(stream),
            "batch get",
            conn,
        )))
    }

    async fn batch_lease(
        &self,
        request: Request<pb::BatchGetRequest>,
    ) -> std::result::Result<Response<pb::BatchLeaseResponse>, Status> {
        let fwd = Caller::of(&request).forward();
        let session = self.shm_session(&request);
        let (Some(arena), Some(session)) = (self.inner.shm.clone(), session) else {
            return Err(Status::failed_precondition(
                "BatchLease needs a shared-memory session (attach to kv-shm.sock)",
            ));
        };
        if !arena.has_session(session) {
            return Err(Status::failed_precondition(crate::shm::SESSION_ENDED));
        }
        let call = shm_call(&request);
        let Blocks { req, ns, keys, .. } = self.blocks(request)?;
        // Leases granted so far go back if this call fails or is dropped (the client
        // cancelled it) before its answer leaves.
        let mut granted = LeasesUntilSent::new(arena.clone(), session);
        let mut blocks = Vec::with_capacity(keys.len());
        // One block at a time: the batch holds no block beyond what the cache holds
        // except the one being copied into the arena.
        for (key, hash) in keys.iter().zip(&req.hashes) {
            let since = arena.changes(key);
            let fetched = self
                .fetch_routed(&req.namespace, &ns, key, hash, &fwd)
                .await;
            let entry = match self.reject(fetched)? {
                Some((data, tier)) => {
                    let size = data.len() as u64;
                    match arena.lease(session, key, &data, tier.map(|_| since)) {
                        Some(l) => {
                            granted.push(l.id);
                            pb::LeasedBlock {
                                found: true,
                                size,
                                shm_offset: l.offset,
                                shm_lease: l.id,
                            }
                        }
                        None => pb::LeasedBlock {
                            found: true,
                            size,
                            ..Default::default()
                        },
                    }
                }
                None => pb::LeasedBlock::default(),
            };
            blocks.push(entry);
        }
        if let Some(c) = call {
            arena.answered(session, c, &granted.ids);
        }
        granted.sent();
        Ok(Response::new(pb::BatchLeaseResponse { blocks }))
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
        let max = self.inner.config.max_block;
        let bytes = match req.block_bytes {
            0 => self.inner.stats.mean_put_bytes(&ns).unwrap_or(1 << 20),
            // No block this service stores is larger: an estimate for one would be
            // nonsense (2^64-1 bytes answered 390 years).
            b if b > max => {
                return Err(KvError::Invalid(format!(
                    "block_bytes {b} is over the largest block this service takes ({max})"
                ))
                .into())
            }
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

/// The arena leases a BatchLease has granted, released unless its answer is sent.
struct LeasesUntilSent {
    arena: Arc<crate::shm::ShmArena>,
    session: crate::shm::SessionId,
    ids: Vec<u64>,
}

impl LeasesUntilSent {
    fn new(arena: Arc<crate::shm::ShmArena>, session: crate::shm::SessionId) -> Self {
        LeasesUntilSent {
            arena,
            session,
            ids: Vec::new(),
        }
    }

    fn push(&mut self, id: u64) {
        self.ids.push(id);
    }

    /// The answer carries them now: the client releases them.
    fn sent(mut self) {
        self.ids.clear();
    }
}

impl Drop for LeasesUntilSent {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            self.arena.release(self.session, id);
        }
    }
}

/// The client's number of a leasing call ([`crate::shm::SHM_REQUEST_METADATA`]).
fn shm_call<T>(request: &Request<T>) -> Option<u64> {
    request
        .metadata()
        .get(crate::shm::SHM_REQUEST_METADATA)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|c| c & crate::shm::ABANDON_BIT == 0)
}

impl KvService {
    /// The caller's shared-memory session, from its metadata. A peer's call never
    /// leases this host's arena.
    fn shm_session<T>(&self, request: &Request<T>) -> Option<crate::shm::SessionId> {
        request
            .metadata()
            .get(SHM_SESSION_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_session)
            .filter(|_| !self.peer_side)
    }
}
