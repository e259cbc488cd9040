//! The asking side of the cache group's file data plane (issue 16): the
//! [`PeerSource`] the daemon's mounts read through. A missed block another node owns
//! (weighted rendezvous over the block's key: location, version, block size, index) is
//! asked of that node; the answer is checked against its crc32c. If the owner fails,
//! is paused after a failure, or is slower than its recent p99 (then the store fetch
//! starts too and the first answer wins), this node reads the store itself: never an
//! error a single node would not have had. Decisions are in [`strata_cluster::hedge`];
//! this module is the I/O around them.
//!
//! Keeping copies: a block fetched from its owner is written into this node's tiers
//! only on its `keep_remote_after`-th fetch ([`RemoteAdmission`]; default never), so a
//! block lives on its owner and the group's capacity adds up. Blocks not kept sit in a small buffer of recent
//! remote blocks ([`recent_budget`]), so the kernel's sub-block reads of one block and
//! a prefetched block's demand read do not ask the owner again. A block this node read
//! from the store because its owner failed is kept, as a single node would; one a
//! hedge won is not (the owner is fetching it too).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, FutureExt};
use parking_lot::{Mutex, RwLock};
use strata_cache_core::{CacheKey, PeerFetch, PeerSource, StoreFetch};
use strata_cluster::hedge::{
    self, HedgeBudget, HedgePolicy, LatencyWindow, PeerBackoff, RemoteAdmission, Route,
};
use strata_cluster::peer::pb::FetchBlockRequest;
use strata_cluster::peer::PeerChannels;
use strata_cluster::{Membership, NodeId, Placement};
use tokio::sync::watch;

use super::peer_metrics::PeerMetrics;

/// Bytes of recent remote blocks kept outside the tiers: a sixteenth of the memory
/// tier (it is memory the tier's budget does not count), at least 2 MiB (the block
/// being read and the next one) and at most 64 MiB (a sequential reader's prefetch
/// window of 1 MiB blocks, so prefetched remote blocks wait here for their demand
/// read).
pub fn recent_budget(memory_tier_bytes: u64) -> u64 {
    (memory_tier_bytes / 16).clamp(2 << 20, 64 << 20)
}

/// Longest a peer call may take in all. 30 s: a hedge answers a slow read long before;
/// this only frees what a hung peer holds.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How the reads decide (from `[cluster]` and the memory tier's size).
#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    pub hedge: HedgePolicy,
    /// See [`recent_budget`].
    pub recent_budget: u64,
    /// See `[cluster] keep_remote_after`.
    pub keep_remote_after: u32,
}

/// The group as the reads see it: rebuilt on each membership change.
struct View {
    placement: Placement,
    addrs: HashMap<NodeId, String>,
}

struct State {
    windows: HashMap<NodeId, LatencyWindow>,
    budget: HedgeBudget,
    backoff: PeerBackoff,
    admit: RemoteAdmission,
    recent: VecDeque<(CacheKey, Bytes)>,
    recent_bytes: u64,
}

struct Inner {
    me: NodeId,
    store_label: String,
    view: RwLock<Arc<View>>,
    channels: PeerChannels,
    metrics: Arc<PeerMetrics>,
    policy: HedgePolicy,
    recent_budget: u64,
    state: Mutex<State>,
    epoch: Instant,
}

/// The daemon's [`PeerSource`]; clones share everything.
#[derive(Clone)]
pub struct GroupReads {
    inner: Arc<Inner>,
}

fn view_of(m: &Membership) -> View {
    View {
        placement: Placement::from_membership(m),
        addrs: m
            .nodes
            .values()
            .map(|n| (n.id.clone(), n.advertise.clone()))
            .collect(),
    }
}

impl GroupReads {
    /// Reads through the group `membership` describes, as node `me`, for the store
    /// labelled `store_label`. Follows membership changes until the sender is gone.
    pub fn start(
        me: NodeId,
        store_label: String,
        mut membership: watch::Receiver<Membership>,
        channels: PeerChannels,
        metrics: Arc<PeerMetrics>,
        opts: ReadOptions,
    ) -> GroupReads {
        let first = view_of(&membership.borrow_and_update());
        let g = GroupReads {
            inner: Arc::new(Inner {
                me,
                store_label,
                view: RwLock::new(Arc::new(first)),
                channels,
                metrics,
                policy: opts.hedge,
                recent_budget: opts.recent_budget,
                state: Mutex::new(State {
                    windows: HashMap::new(),
                    budget: HedgeBudget::default(),
                    backoff: PeerBackoff::default(),
                    admit: RemoteAdmission::new(
                        opts.keep_remote_after,
                        RemoteAdmission::DEFAULT_CAP,
                    ),
                    recent: VecDeque::new(),
                    recent_bytes: 0,
                }),
                epoch: Instant::now(),
            }),
        };
        let weak = Arc::downgrade(&g.inner);
        tokio::spawn(async move {
            // While etcd is unreachable the membership keeps its last snapshot: reads
            // go on with the last placement (a partition's behaviour, by design).
            while membership.changed().await.is_ok() {
                let v = view_of(&membership.borrow_and_update());
                let Some(inner) = weak.upgrade() else { return };
                *inner.view.write() = Arc::new(v);
            }
        });
        g
    }

    fn route(&self, key: &CacheKey) -> (Route, Option<String>) {
        let view = self.inner.view.read().clone();
        let r = hedge::route(&view.placement, &self.inner.me, &key.encode());
        let addr = match &r {
            Route::Peer(id) => view.addrs.get(id).cloned(),
            Route::Store => None,
        };
        (r, addr)
    }

    fn now_ns(&self) -> u64 {
        self.inner.epoch.elapsed().as_nanos() as u64
    }

    fn recent(&self, key: &CacheKey) -> Option<Bytes> {
        let st = self.inner.state.lock();
        st.recent
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, b)| b.clone())
    }

    fn remember(&self, key: CacheKey, data: Bytes) {
        let mut st = self.inner.state.lock();
        st.recent_bytes += data.len() as u64;
        st.recent.push_back((key, data));
        while st.recent_bytes > self.inner.recent_budget {
            match st.recent.pop_front() {
                Some((_, b)) => st.recent_bytes -= b.len() as u64,
                None => break,
            }
        }
    }

    /// The owner's answer: the verified block of `req`.
    async fn ask(&self, owner: &NodeId, addr: &str, req: &PeerFetch) -> Result<Bytes, String> {
        self.inner.metrics.asked(owner.as_str());
        let want = req.range.end - req.range.start;
        let call = async {
            let mut c = self
                .inner
                .channels
                .file_client(addr)
                .map_err(|e| e.to_string())?;
            let r = FetchBlockRequest {
                store: self.inner.store_label.clone(),
                location: req.obj.path.to_string(),
                version: req.obj.version.to_string(),
                block_size: req.block_size,
                block_index: req.block,
                object_size: req.obj.size,
                has_etag: req.obj.has_etag,
                last_modified_unix_ns: req.obj.last_modified_unix_ns,
                from_node: self.inner.me.to_string(),
                job: req.ctx.job.0,
                prefetch: req.ctx.is_prefetch(),
            };
            let mut stream = c
                .fetch_block(r)
                .await
                .map_err(|s| s.to_string())?
                .into_inner();
            let first = stream
                .message()
                .await
                .map_err(|s| s.to_string())?
                .ok_or("the owner sent no data")?;
            if first.total_len != want {
                return Err(format!(
                    "the owner sent a {}-byte block, expected {want}",
                    first.total_len
                ));
            }
            let crc = first.crc32c;
            let data = if first.data.len() as u64 == want {
                first.data
            } else {
                let mut buf = BytesMut::with_capacity(want as usize);
                buf.extend_from_slice(&first.data);
                while let Some(m) = stream.message().await.map_err(|s| s.to_string())? {
                    if buf.len() as u64 + m.data.len() as u64 > want {
                        return Err("the owner sent more than the block".into());
                    }
                    buf.extend_from_slice(&m.data);
                }
                buf.freeze()
            };
            if data.len() as u64 != want {
                return Err(format!("the owner sent {} of {want} bytes", data.len()));
            }
            if crc32c::crc32c(&data) != crc {
                return Err("checksum mismatch on a peer block".into());
            }
            Ok(data)
        };
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(d)) => {
                self.inner.metrics.received(owner.as_str(), d.len() as u64);
                Ok(d)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
        }
    }

    fn failed(&self, owner: &NodeId, addr: &str, why: &str) {
        tracing::debug!(peer = %owner, error = why, "peer fetch failed; reading the store");
        self.inner.metrics.error(owner.as_str());
        self.inner.channels.forget(addr);
        let now = self.now_ns();
        self.inner.state.lock().backoff.failed(owner, now);
    }

    fn answered(&self, owner: &NodeId, took: Duration) {
        let mut st = self.inner.state.lock();
        st.backoff.succeeded(owner);
        st.windows.entry(owner.clone()).or_default().observe(took);
    }

    /// Whether to keep a verified remote block; if not, it goes to the recent buffer.
    fn keep(&self, key: &CacheKey, data: &Bytes) -> bool {
        let keep = self.inner.state.lock().admit.admit(key.content_hash());
        self.inner.metrics.kept(keep);
        if !keep {
            self.remember(key.clone(), data.clone());
        }
        keep
    }

    async fn fetch_block(
        &self,
        req: PeerFetch,
        from_store: StoreFetch,
    ) -> strata_cache_core::Result<(Bytes, bool)> {
        let (route, addr) = self.route(&req.key);
        let (owner, addr) = match (route, addr) {
            (Route::Peer(o), Some(a)) => (o, a),
            // Ours (the group changed since the reader asked), or no address known.
            _ => return from_store().await.map(|b| (b, true)),
        };
        if let Some(b) = self.recent(&req.key) {
            return Ok((b, false));
        }
        let (available, delay) = {
            let mut st = self.inner.state.lock();
            st.budget.on_request();
            let delay = st
                .windows
                .get(&owner)
                .map_or(self.inner.policy.initial, |w| self.inner.policy.delay(w));
            (st.backoff.available(&owner, self.now_ns()), delay)
        };
        if !available {
            self.inner.metrics.fallback(owner.as_str());
            return from_store().await.map(|b| (b, true));
        }
        let started = Instant::now();
        let peer = self.ask(&owner, &addr, &req);
        tokio::pin!(peer);
        tokio::select! {
            r = &mut peer => {
                return self.settle(&owner, &addr, started, &req.key, r, from_store()).await;
            }
            _ = tokio::time::sleep(delay) => {}
        }
        // Slower than its p99; without hedge budget, wait on up to the hard limit.
        if !self.inner.state.lock().budget.try_hedge() {
            let hard = HedgeBudget::hard_wait(delay, &self.inner.policy).saturating_sub(delay);
            tokio::select! {
                r = &mut peer => {
                    return self.settle(&owner, &addr, started, &req.key, r, from_store()).await;
                }
                _ = tokio::time::sleep(hard) => {}
            }
        }
        // Race the store.
        self.inner.metrics.hedge(owner.as_str());
        let store = from_store();
        tokio::pin!(store);
        tokio::select! {
            r = &mut peer => self.settle(&owner, &addr, started, &req.key, r, store).await,
            r = &mut store => {
                // The wait so far is a lower bound of this answer's time: the window
                // learns that the peer is slow.
                self.answered_late(&owner, started.elapsed());
                match r {
                    // The owner is fetching it too and will hold it: no second copy
                    // here, only the recent buffer.
                    Ok(b) => {
                        self.inner.metrics.fallback(owner.as_str());
                        self.remember(req.key.clone(), b.clone());
                        Ok((b, false))
                    }
                    // The store failed: the peer may still answer.
                    Err(e) => match peer.await {
                        Ok(b) => Ok(self.owner_answered(&owner, started, &req.key, b)),
                        Err(pe) => {
                            self.failed(&owner, &addr, &pe);
                            Err(e)
                        }
                    },
                }
            }
        }
    }

    /// The owner's answer `r` to a read started at `started`: its bytes (kept here if
    /// the keep rule says so), or on a failure the read from the store.
    async fn settle(
        &self,
        owner: &NodeId,
        addr: &str,
        started: Instant,
        key: &CacheKey,
        r: Result<Bytes, String>,
        store: impl std::future::Future<Output = strata_cache_core::Result<Bytes>>,
    ) -> strata_cache_core::Result<(Bytes, bool)> {
        match r {
            Ok(b) => Ok(self.owner_answered(owner, started, key, b)),
            Err(e) => {
                self.failed(owner, addr, &e);
                self.inner.metrics.fallback(owner.as_str());
                store.await.map(|b| (b, true))
            }
        }
    }

    /// Bytes the owner sent: its answer time learned, and whether to keep them here.
    fn owner_answered(
        &self,
        owner: &NodeId,
        started: Instant,
        key: &CacheKey,
        b: Bytes,
    ) -> (Bytes, bool) {
        self.answered(owner, started.elapsed());
        let keep = self.keep(key, &b);
        (b, keep)
    }

    fn answered_late(&self, owner: &NodeId, at_least: Duration) {
        self.inner
            .state
            .lock()
            .windows
            .entry(owner.clone())
            .or_default()
            .observe(at_least);
    }
}

impl PeerSource for GroupReads {
    fn remote(&self, key: &CacheKey) -> bool {
        matches!(self.route(key).0, Route::Peer(_))
    }

    fn fetch(
        &self,
        req: PeerFetch,
        from_store: StoreFetch,
    ) -> BoxFuture<'static, strata_cache_core::Result<(Bytes, bool)>> {
        let this = self.clone();
        async move { this.fetch_block(req, from_store).await }.boxed()
    }
}
