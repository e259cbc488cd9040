//! Operations on keys another node of the cache group may own (`group.rs`): each
//! routed to the owner or served from the local tiers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use strata_cache_core::{CacheKey, TierKind};
use strata_prefetch::Admission;
use tonic::Status;

use super::{key_hash, tier_pb, ChargeEnd, KvService, QuotaCharge};
use crate::error::{KvError, Result};
use crate::group::{placement_key, Forward, RemoteError, Router, Routes};
use crate::pb::{self, Tier};
use crate::routing::{demote_suspects, Answer, KeyState, Lookup, Replicate};
use crate::tenants::Tenant;

/// How long a Get that R candidates answered "no" still waits for calls in flight
/// before it is a miss: 200 ms, ten LAN round trips and a memory-tier read of a large
/// block; past it a straggler is a frozen or overloaded node.
pub const STRAGGLER_WAIT: Duration = Duration::from_millis(200);

impl KvService {
    /// Removes `keys` from the local tiers; the number removed.
    pub(super) async fn remove_local(
        &self,
        keys: &[CacheKey],
        tenant: Option<&Arc<Tenant>>,
    ) -> Result<u32> {
        let mut removed = 0u32;
        for k in keys {
            if self.drop_local(k, true).await? {
                removed += 1;
            }
            if let Some(t) = tenant {
                t.forget(k);
            }
        }
        self.inner.stats.removed(removed as u64);
        Ok(removed)
    }

    /// Charges `size` bytes of `key` to tenant `t` (see [`crate::tenants::Charge`] and
    /// [`QuotaCharge`]), evicting the tenant's own oldest blocks the charge took out of
    /// its ledger to make room.
    pub(super) async fn charge_quota(
        &self,
        t: &Arc<Tenant>,
        key: &CacheKey,
        size: u64,
    ) -> Result<QuotaCharge> {
        let charged = t.charge(key, size, &self.inner.engine)?;
        t.note_quota_evictions(charged.evict.len());
        for old in &charged.evict {
            if let Err(e) = self.drop_local(old, false).await {
                tracing::warn!(key = %old, error = %e, "evicting a block over its tenant's quota failed");
            }
        }
        Ok(QuotaCharge {
            tenant: t.clone(),
            key: key.clone(),
            size,
            new: charged.new,
            end: ChargeEnd::Refunded,
        })
    }

    /// Drops block `k` from this node's cache and arena; whether the cache held it.
    /// `asked`: a client's Remove (a Put of the key that arrived before it stores
    /// nothing), not an eviction of the cache's own (see `CacheEngine::evict`).
    async fn drop_local(&self, k: &CacheKey, asked: bool) -> Result<bool> {
        // After any store of the key in progress (one whose Put was cancelled still
        // finishes): it must not land after this drop is acknowledged.
        let _slot = self.inner.storing.claim(k, || false).await;
        let engine = &self.inner.engine;
        let removed = if asked {
            engine.remove(k).await?
        } else {
            engine.evict(k).await?
        };
        if let Some(arena) = &self.inner.shm {
            arena.forget(k);
        }
        Ok(removed)
    }

    /// Stages those of `keys` in a lower local tier into the fastest one.
    pub(super) fn prefetch_local(
        &self,
        ns: &Arc<str>,
        keys: Vec<CacheKey>,
    ) -> pb::PrefetchResponse {
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
    pub(super) fn routes_for(&self, ns: &str, hashes: &[Bytes]) -> Option<(Arc<Router>, Routes)> {
        let router = self.router()?;
        let keys: Vec<Vec<u8>> = hashes.iter().map(|h| placement_key(ns, h)).collect();
        let routes = router.routes(&keys)?;
        Some((router.clone(), routes))
    }

    /// One block from the local tiers, else (in a group) from its owners.
    pub(super) async fn fetch_routed(
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
            .get_from_group(&router, &routes, fwd, client_ns, ns, hash)
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
    /// A candidate that refuses the caller's model identity is passed over like one
    /// that misses (its binding may be one the group has not settled yet, and another
    /// candidate may hold the block under the caller's identity: black-box finding,
    /// the keys a member bound to another model owned answered its refusal through
    /// every entry node); the refusal is the answer only when no candidate, this node
    /// included, took the caller's identity and none had the block.
    pub(super) async fn get_from_group(
        &self,
        router: &Arc<Router>,
        routes: &Routes,
        fwd: &Forward,
        client_ns: &str,
        ns: &str,
        hash: &[u8],
    ) -> Result<Option<Bytes>> {
        // A remote "no" took the identity; so did this node if it holds the binding.
        let mut accepted = fwd
            .identity
            .is_some_and(|id| self.inner.identities.bound(ns) == Some(id));
        let mut refusal: Option<Status> = None;
        let missed = |refusal: Option<Status>, accepted: bool| match refusal {
            Some(s) if !accepted => Err(KvError::Status(s)),
            _ => Ok(None),
        };
        let mut cands = routes.candidates.first().cloned().unwrap_or_default();
        // A miss once every candidate said no, not only the R owners: a Put that found
        // an owner down left its copy on the next candidate (`routing.rs`).
        let needed = cands.len().max(1);
        let replication = routes.replication.max(1);
        let owners: Vec<usize> = cands.iter().take(replication).copied().collect();
        let mut owner_said_no = false;
        // The local node answered already: one of the candidates that said no.
        let mut misses = 0;
        if let Some(pos) = cands.iter().position(|n| routes.nodes[*n].local) {
            owner_said_no |= owners.contains(&cands[pos]);
            cands.remove(pos);
            misses += 1;
        }
        demote_suspects(&mut cands, |n| router.is_suspect(&routes.nodes[n]));
        let mut inflight = futures::stream::FuturesUnordered::new();
        let mut next = 0;
        let launch = |n: usize, past_pause: bool| {
            let node = routes.nodes[n].clone();
            let router = router.clone();
            async move {
                let r = router
                    .remote_get(&node, fwd, client_ns, hash, past_pause)
                    .await;
                (node, r)
            }
        };
        // Candidates not asked because they are paused after failures: asked last,
        // past their pause (a probe, at most 1 s), when no owner said no, so nothing
        // else can tell a miss; an owner's no is a miss at once, as before, so a frozen
        // owner does not slow the misses of a healthy group. Black-box finding: an
        // owner restarted within its lease stayed paused, and once the other owner
        // died its blocks answered "miss" for ~3 s (316-429 Gets).
        let mut paused: Vec<usize> = Vec::new();
        let mut last_launched = None;
        // When every candidate had said no, or R had and the others were asked, the last
        // one asked slower than its p99 (nobody left to hedge with), with calls still
        // in flight.
        let mut missed_at: Option<tokio::time::Instant> = None;
        let mut exhausted = false;
        loop {
            // A miss is final once every candidate said no and nothing is in flight (a
            // hedged request to the next node may answer "no" before a slow owner
            // answers "here"), or once what is in flight has had [`STRAGGLER_WAIT`]
            // more: a frozen owner held every miss for the whole request timeout
            // (black-box finding), while a slow one that has the block costs at most a
            // recompute.
            if (misses >= needed || exhausted) && !inflight.is_empty() {
                let at = *missed_at.get_or_insert_with(tokio::time::Instant::now);
                if at.elapsed() >= STRAGGLER_WAIT {
                    return missed(refusal, accepted);
                }
            }
            if inflight.is_empty() {
                if misses >= needed {
                    return missed(refusal, accepted);
                }
                let Some(&n) = cands.get(next) else {
                    if !owner_said_no && !paused.is_empty() {
                        for n in paused.drain(..) {
                            inflight.push(launch(n, true));
                        }
                        // Their answers are awaited (each bounded by the probe's).
                        exhausted = false;
                        missed_at = None;
                        continue;
                    }
                    return missed(refusal, accepted);
                };
                next += 1;
                if router.is_suspect(&routes.nodes[n]) {
                    paused.push(n);
                    continue;
                }
                last_launched = Some(routes.nodes[n].clone());
                inflight.push(launch(n, false));
            }
            let hedge = match (&last_launched, cands.get(next)) {
                // All said no: wait for the stragglers, a little.
                _ if misses >= needed || exhausted => STRAGGLER_WAIT,
                // The next candidate is asked too when this one is slow.
                (Some(node), Some(_)) => router.hedge_delay(node),
                // Nobody left to hedge with and R said no (every owner but a straggler,
                // as before the spare was asked too): the straggler has its hedge delay,
                // then the little wait. Fewer noes (an owner failed): wait for what is
                // in flight, which may hold the only copy.
                (Some(node), None) if misses >= replication => router.hedge_delay(node),
                _ => Duration::from_secs(3600),
            };
            tokio::select! {
                Some((node, r)) = inflight.next() => match r {
                    Ok(Some(b)) => return Ok(Some(b)),
                    Ok(None) => {
                        misses += 1;
                        accepted = true;
                        owner_said_no |= owners.iter().any(|&o| routes.nodes[o].id == node.id);
                    }
                    Err(RemoteError::Down(s)) => {
                        tracing::debug!(node = %node.id, status = %s, "KV owner down; next replica");
                    }
                    Err(RemoteError::Refused(s)) if s.code() == tonic::Code::FailedPrecondition => {
                        // Another candidate may hold it under the caller's identity.
                        misses += 1;
                        refusal.get_or_insert(s);
                    }
                    Err(RemoteError::Refused(s)) => return Err(KvError::Status(s)),
                },
                _ = tokio::time::sleep(hedge) => {
                    if misses >= needed || exhausted {
                        continue; // the stragglers' time is checked at the top
                    }
                    if cands.get(next).is_none() {
                        // Nobody left to hedge with (a frozen owner held such misses
                        // for its whole timeout, black-box finding).
                        exhausted = true;
                        if let Some(slow) = &last_launched {
                            router.count_hedge(slow);
                        }
                        continue;
                    }
                    if let (Some(slow), Some(&n)) = (&last_launched, cands.get(next)) {
                        router.count_hedge(slow);
                        next += 1;
                        if router.is_suspect(&routes.nodes[n]) {
                            paused.push(n);
                            continue;
                        }
                        last_launched = Some(routes.nodes[n].clone());
                        inflight.push(launch(n, false));
                    }
                }
            }
        }
    }

    /// Stores a received block on this node (quota, then the engine); Ok(already
    /// present).
    pub(super) async fn store_local(
        &self,
        tenant: Option<&Arc<Tenant>>,
        ns: &Arc<str>,
        key: &CacheKey,
        data: Bytes,
        arrived: u64,
    ) -> Result<bool> {
        let size = data.len() as u64;
        let engine = &self.inner.engine;
        let Some(slot) = self.inner.storing.claim(key, || engine.contains(key)).await else {
            self.inner.stats.put(ns, size, true);
            return Ok(true);
        };
        let charge = match tenant {
            Some(t) => Some(self.charge_quota(t, key, size).await?),
            _ => None,
        };
        self.store_claimed(slot, charge, ns.clone(), key.clone(), data, arrived)
            .await?;
        Ok(false)
    }

    /// [`Self::store_local`] of a block a group Put stores on this node: its namespace
    /// is bound here first, durably, as a single node's Put binds it (the entry node
    /// only checks; see `do_put`). `bound_here`: the generation of a binding this call
    /// made, for the Put to undo if the group refuses it.
    #[allow(clippy::too_many_arguments)]
    async fn bind_and_store_local(
        &self,
        tenant: Option<&Arc<Tenant>>,
        fwd: &Forward,
        ns: &Arc<str>,
        key: &CacheKey,
        data: Bytes,
        arrived: u64,
        bound_here: &parking_lot::Mutex<Option<u64>>,
    ) -> Result<bool> {
        let ids = &self.inner.identities;
        let answered = self.check_shared_binding(ns, fwd.identity.as_ref()).await?;
        let was_bound = ids.bound(ns).is_some();
        let made = self.bind_identity(ns, fwd.identity.as_ref(), true)?;
        if !answered {
            ids.mark_unconfirmed(ns);
        }
        if let Some(generation) = made {
            if !was_bound {
                *bound_here.lock() = Some(generation);
            }
            if let Err(e) = ids.durable(generation).await {
                ids.unbind(ns, generation);
                bound_here.lock().take();
                return Err(KvError::BindingNotSaved(e));
            }
        }
        let present = self.store_local(tenant, ns, key, data, arrived).await?;
        self.keep_if_still_bound(ns, fwd.identity.as_ref(), key, tenant)
            .await?;
        Ok(present)
    }

    /// Undoes a group Put another owner refused for its model identity: the copies it
    /// left (`plan`'s stores) are removed, and a binding it made on this node dropped.
    #[allow(clippy::too_many_arguments)]
    async fn undo_refused_put(
        &self,
        router: &Arc<Router>,
        routes: &Routes,
        plan: &Replicate,
        fwd: &Forward,
        client_ns: &str,
        ns: &Arc<str>,
        key: &CacheKey,
        bound_here: &parking_lot::Mutex<Option<u64>>,
    ) {
        for &n in plan.stored() {
            let node = &routes.nodes[n];
            let r = if node.local {
                self.remove_local(std::slice::from_ref(key), None)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            } else {
                router
                    .remote_remove(
                        node,
                        fwd,
                        client_ns,
                        vec![Bytes::copy_from_slice(key_hash(key))],
                    )
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("{e:?}"))
            };
            if let Err(e) = r {
                tracing::warn!(node = %node.id, %key, error = %e, "undoing a refused put failed");
            }
        }
        let generation = bound_here.lock().take();
        if let Some(generation) = generation {
            if let Some(g) = self.inner.identities.unbind(ns, generation) {
                let _ = self.inner.identities.durable(g).await;
                // The group's record, made for this put, names the refused identity.
                if let Some(id) = fwd.identity.as_ref() {
                    router
                        .shared_binding(ns, id, 0, crate::group::SharedBindingOp::Withdraw)
                        .await;
                }
            }
        }
    }

    /// A received block to its R owners (see `group.rs` for when it is acknowledged).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn put_to_group(
        &self,
        router: &Arc<Router>,
        routes: &Routes,
        caller_tenant: Option<&Arc<Tenant>>,
        fwd: &Forward,
        client_ns: &str,
        ns: &Arc<str>,
        key: &CacheKey,
        data: Bytes,
        arrived: u64,
    ) -> Result<bool> {
        let cands = routes.candidates.first().cloned().unwrap_or_default();
        let mut plan = Replicate::new(cands, routes.replication);
        // Before `inflight`, whose futures borrow it.
        let bound_here = parking_lot::Mutex::new(None);
        let bound_here = &bound_here;
        let mut inflight = futures::stream::FuturesUnordered::new();
        // `replace`: the node holds another life's value of the key (see below); it is
        // removed there first.
        let store = |n: usize, replace: bool| {
            let node = routes.nodes[n].clone();
            let router = router.clone();
            let data = data.clone();
            async move {
                if replace {
                    let hash = Bytes::copy_from_slice(key_hash(key));
                    let gone = if node.local {
                        self.remove_local(std::slice::from_ref(key), caller_tenant)
                            .await
                            .map(|_| ())
                            .map_err(|e| RemoteError::Refused(Status::from(e)))
                    } else {
                        router
                            .remote_remove(&node, fwd, client_ns, vec![hash])
                            .await
                            .map(|_| ())
                    };
                    if let Err(e) = gone {
                        return (n, Err(e));
                    }
                }
                // A Put overlapped by a Remove stores nothing: not this Remove, its own.
                let arrived = if replace {
                    self.inner.engine.removal_seq()
                } else {
                    arrived
                };
                let r = if node.local {
                    self.bind_and_store_local(
                        caller_tenant,
                        fwd,
                        ns,
                        key,
                        data,
                        arrived,
                        bound_here,
                    )
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
        // The first owner decides, then the others copy: two concurrent Puts of
        // different bytes under one key meet at that owner, which keeps one value and
        // answers the other `already_present`, so the others never see the loser
        // (black-box finding: sent to every owner at once, 79 of 300 racing keys won on
        // different owners and members answered with different values). A substitute
        // for a primary that is down decides in its place.
        let mut rest = plan.initial();
        if !rest.is_empty() {
            inflight.push(store(rest.remove(0), false));
        }
        let mut decided = false;
        let mut stored_fresh = false;
        let mut replaced = std::collections::HashSet::new();
        let mut all_present = true;
        let mut refused = None;
        while let Some((n, r)) = inflight.next().await {
            match r {
                Ok(present) => {
                    if !decided {
                        decided = true;
                        if present {
                            // One value already, and its Put copied it (or is copying it).
                            plan.outcome(n, true);
                            return Ok(true);
                        }
                        stored_fresh = true;
                        for m in rest.drain(..) {
                            inflight.push(store(m, false));
                        }
                    } else if present && stored_fresh && replaced.insert(n) {
                        // The deciding owner had no value, this one has: a value of an
                        // earlier life of the key (removed or evicted on the decider
                        // only, e.g. a Remove that raced the copy of an earlier Put),
                        // which may differ from this one. Replaced, so the owners agree
                        // (black-box finding: after a Put raced a Remove, a later Put
                        // of new bytes left 41-49 of 200 keys answering the old value
                        // through one entry node and the new one through the others).
                        inflight.push(store(n, true));
                        continue;
                    }
                    all_present &= present;
                    plan.outcome(n, true);
                }
                Err(RemoteError::Down(s)) => {
                    tracing::debug!(node = %routes.nodes[n].id, status = %s, "KV put: owner down, trying the next node");
                    if let Some(sub) = plan.outcome(n, false) {
                        inflight.push(store(sub, false));
                    } else if !decided {
                        // No substitute left to decide: the other owners take it as before.
                        decided = true;
                        for m in rest.drain(..) {
                            inflight.push(store(m, false));
                        }
                    }
                }
                Err(RemoteError::Refused(s)) => {
                    // Not a node failure: no substitute; the caller gets the refusal.
                    refused.get_or_insert(s);
                    rest.clear();
                }
            }
        }
        if let Some(s) = refused {
            drop(inflight);
            // A Remove that overlapped the Put on one owner orders the Put before it:
            // the copies the others took go too, so no owner keeps what the Remove
            // removed elsewhere.
            if matches!(
                s.code(),
                tonic::Code::FailedPrecondition | tonic::Code::Aborted
            ) {
                // Another owner holds the namespace for another model: what the owners
                // without its binding took of this Put goes, and so does a binding it
                // made here (black-box finding: a member back in the group, its
                // bindings missed, kept the wrong model's binding and refused the
                // right one's puts for good).
                self.undo_refused_put(router, routes, &plan, fwd, client_ns, ns, key, bound_here)
                    .await;
            }
            return Err(KvError::Status(s));
        }
        if plan.stored().is_empty() {
            // No owner reachable: keep it here, where this node's Gets find it first,
            // rather than fail a put a single node would have taken.
            router.kept_locally.fetch_add(1, Ordering::Relaxed);
            return self
                .bind_and_store_local(caller_tenant, fwd, ns, key, data, arrived, bound_here)
                .await;
        }
        if plan.under_replicated() {
            router.under_replicated.fetch_add(1, Ordering::Relaxed);
        }
        Ok(all_present)
    }

    /// Which of `keys` the group holds (None outside a group): local hits first, then
    /// batched rounds over the candidates.
    pub(super) async fn exists_routed(
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
    pub(super) async fn lookup(
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
        let mut l = Lookup::new(cands, prefix);
        // A candidate refusing the caller's identity is passed over, as in
        // `get_from_group`: its refusal is the answer only if nobody took the identity.
        let mut accepted = fwd.identity.is_some_and(|id| {
            keys.first().and_then(|k| match k {
                CacheKey::Kv(kv) => self.inner.identities.bound(&kv.namespace),
                _ => None,
            }) == Some(id)
        });
        let mut refusal: Option<Status> = None;
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
                        accepted = true;
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
                    Err(RemoteError::Refused(s)) if s.code() == tonic::Code::FailedPrecondition => {
                        refusal.get_or_insert(s);
                        for i in idx {
                            l.answer(i, n, Answer::Failed);
                        }
                    }
                    Err(RemoteError::Refused(s)) => return Err(KvError::Status(s)),
                }
            }
        }
        match refusal {
            Some(s) if !accepted => Err(KvError::Status(s)),
            _ => Ok((l, loads)),
        }
    }

    /// EstimateLoad over the group (None outside a group).
    pub(super) async fn estimate_routed(
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

    /// Remove everywhere a key may be: every member, not only the key's candidates (a
    /// copy stays wherever a key was placed before the membership changed, and a Get
    /// there reads it first; black-box finding: after two members joined, gets through
    /// the old owners served 9-13 of 100 removed blocks). The number of keys the
    /// group held (None outside a group).
    pub(super) async fn remove_routed(
        &self,
        client_ns: &str,
        ns: &str,
        hashes: &[Bytes],
        keys: &[CacheKey],
        fwd: &Forward,
    ) -> Result<Option<u32>> {
        let Some(router) = self.router() else {
            return Ok(None);
        };
        let routes = self.routes_for(ns, hashes);
        // A member that left the membership is no key's candidate, but it may come
        // back on its warm disk (black-box finding: it served removed blocks again):
        // the Remove is replayed to it once it answers.
        for node in router.departed() {
            router.missed_remove(&node, fwd, client_ns, hashes.to_vec());
        }
        let Some((router, routes)) = routes else {
            return Ok(None);
        };
        let (l, _) = self
            .lookup(&router, &routes, fwd, client_ns, hashes, keys, false, None)
            .await?;
        // Each key once, as one node counts a Remove listing it twice (black-box
        // finding: remove([k, k, k]) answered 3 through a group, 1 on one node).
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
        let held = (0..keys.len())
            .filter(|i| matches!(l.state(*i), KeyState::Found(_)) && seen.insert(&keys[*i]))
            .count() as u32;
        let calls = routes.nodes.iter().filter(|n| !n.local).map(|node| {
            let (node, batch) = (node.clone(), hashes.to_vec());
            let router = router.clone();
            async move {
                let r = router
                    .remote_remove(&node, fwd, client_ns, batch.clone())
                    .await;
                if matches!(r, Err(RemoteError::Down(_))) {
                    // Replayed when it is back (its warm disk would serve the blocks).
                    router.missed_remove(&node, fwd, client_ns, batch);
                }
                r
            }
        });
        for r in futures::future::join_all(calls).await {
            if let Err(RemoteError::Refused(s)) = r {
                return Err(KvError::Status(s));
            }
        }
        Ok(Some(held))
    }

    /// Prefetch where each block is (None outside a group).
    pub(super) async fn prefetch_routed(
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
