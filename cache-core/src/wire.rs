//! The daemon's store requests under the one [`StoreScheduler`] (issue 13, item 4): the
//! async shell around the pure scheduler, used by [`crate::reader::ObjectReader`] for
//! its demand block fetches and its prefetch runs. The replay drives the same
//! scheduler in simulated time.
//!
//! - A demand fetch takes a [`WirePermit`] at once ([`Wire::demand`]).
//! - A prefetch run asks with [`Wire::submit`] *before* it claims its blocks in the
//!   engine's single-flight map, so a demand read that finds one of them in flight finds
//!   it in the queue too and [`promotes`](Wire::promote) it (demand never waits behind
//!   queued prefetch).
//! - [`Wire::course`] feeds each demand read's stream pattern to the [`CourseWatch`]; a
//!   stream that changed course has its queued runs cancelled: their [`Ticket`]s resolve
//!   to `None` and the run sends no request.
//!
//! The lock is a plain mutex taken for a few map operations, never across an await.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use strata_types::{FxBuild, JobId, Pattern};

use crate::key::CacheKey;
use crate::link_share::LinkShare;
use crate::scheduler::{Class, CourseWatch, StoreScheduler};

type Stream = (JobId, Arc<str>);

/// See the module docs.
#[derive(Debug)]
pub struct Wire {
    state: Mutex<WireState>,
}

#[derive(Debug)]
struct WireState {
    sched: StoreScheduler<u64, Stream>,
    /// Per queued run: who waits for it, its class and its blocks.
    waiting: HashMap<u64, (oneshot::Sender<Class>, Class, Vec<CacheKey>), FxBuild>,
    /// The queued run bringing each block.
    by_key: HashMap<CacheKey, u64, FxBuild>,
    course: CourseWatch<Stream>,
    next: u64,
    stats: WireStats,
}

/// Counts of what the scheduler did (for `strata stats` and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Prefetch runs that waited in the queue.
    pub queued: u64,
    /// Queued runs a demand read took over.
    pub promoted: u64,
    /// Queued runs cancelled (no request sent).
    pub cancelled: u64,
}

/// The right to send one request; its drop tells the scheduler the request ended.
#[derive(Debug)]
pub struct WirePermit {
    wire: Arc<Wire>,
    class: Class,
}

impl WirePermit {
    /// The class the request went as (a promoted prefetch goes as demand).
    pub fn class(&self) -> Class {
        self.class
    }
}

impl Drop for WirePermit {
    fn drop(&mut self) {
        let mut st = self.wire.state.lock();
        let mut starts = Vec::new();
        st.sched.finished(self.class, &mut starts);
        st.start(starts);
    }
}

/// A run's place on the wire: resolves to its permit when it may send, or to `None`
/// if it was cancelled. Cloneable: every GET of one run awaits the same ticket.
pub type Ticket = Shared<BoxFuture<'static, Option<Arc<WirePermit>>>>;

impl WireState {
    /// Wakes the runs the scheduler released (`starts`); one nobody waits for any more
    /// ends at once and may release more.
    fn start(&mut self, mut starts: Vec<u64>) {
        let mut i = 0;
        while i < starts.len() {
            let id = starts[i];
            i += 1;
            if let Some((tx, class, keys)) = self.waiting.remove(&id) {
                self.forget_keys(id, &keys);
                if tx.send(class).is_err() {
                    self.sched.finished(class, &mut starts);
                }
            }
        }
    }

    fn forget_keys(&mut self, id: u64, keys: &[CacheKey]) {
        for k in keys {
            if self.by_key.get(k) == Some(&id) {
                self.by_key.remove(k);
            }
        }
    }
}

impl Default for Wire {
    fn default() -> Self {
        Wire::new(LinkShare::default())
    }
}

impl Wire {
    pub fn new(share: LinkShare) -> Self {
        Self::with_floor(share, StoreScheduler::<u64, Stream>::DEFAULT_FLOOR)
    }

    /// A wire whose scheduler lets `floor` prefetch requests beside demand whatever
    /// the share ([`StoreScheduler::with_floor`]).
    pub fn with_floor(share: LinkShare, floor: usize) -> Self {
        Wire {
            state: Mutex::new(WireState {
                sched: StoreScheduler::with_floor(share, floor),
                waiting: HashMap::default(),
                by_key: HashMap::default(),
                course: CourseWatch::default(),
                next: 0,
                stats: WireStats::default(),
            }),
        }
    }

    pub fn stats(&self) -> WireStats {
        self.state.lock().stats
    }

    /// Requests in flight of `class`, and runs waiting.
    pub fn load(&self, class: Class) -> (usize, usize) {
        let st = self.state.lock();
        (st.sched.in_flight(class), st.sched.queued())
    }

    /// A demand request starts now.
    pub fn demand(self: &Arc<Self>) -> WirePermit {
        self.state.lock().sched.demand_started();
        WirePermit {
            wire: self.clone(),
            class: Class::Demand,
        }
    }

    /// A prefetch run of `class` for `job`'s stream of `path`, bringing `keys`: its
    /// ticket (ready at once when the scheduler lets it start now).
    pub fn submit(
        self: &Arc<Self>,
        class: Class,
        job: JobId,
        path: Arc<str>,
        keys: &[CacheKey],
    ) -> Ticket {
        let mut st = self.state.lock();
        let id = st.next;
        st.next += 1;
        if st.sched.submit(id, class, (job, path)) {
            let permit = Arc::new(WirePermit {
                wire: self.clone(),
                class,
            });
            return futures::future::ready(Some(permit)).boxed().shared();
        }
        st.stats.queued += 1;
        let (tx, rx) = oneshot::channel();
        for k in keys {
            st.by_key.insert(k.clone(), id);
        }
        st.waiting.insert(id, (tx, class, keys.to_vec()));
        let wire = self.clone();
        async move {
            let class = rx.await.ok()?;
            Some(Arc::new(WirePermit { wire, class }))
        }
        .boxed()
        .shared()
    }

    /// A demand read wants `key`: if a queued run brings it, that run starts now, as
    /// demand. True if one did.
    pub fn promote(&self, key: &CacheKey) -> bool {
        let mut st = self.state.lock();
        if st.by_key.is_empty() {
            return false;
        }
        let Some(id) = st.by_key.get(key).copied() else {
            return false;
        };
        if !st.sched.promote(&id) {
            return false;
        }
        st.stats.promoted += 1;
        if let Some((tx, _, keys)) = st.waiting.remove(&id) {
            st.forget_keys(id, &keys);
            if tx.send(Class::Demand).is_err() {
                let mut starts = Vec::new();
                st.sched.finished(Class::Demand, &mut starts);
                st.start(starts);
            }
        }
        true
    }

    /// A demand read of `job`'s stream of `path` at `offset`, classified `pattern`: if
    /// the stream changed course, its queued runs are cancelled. Returns how many.
    pub fn course(&self, job: JobId, path: &Arc<str>, pattern: Pattern, offset: u64) -> usize {
        let mut st = self.state.lock();
        let stream = (job, path.clone());
        if !st.course.changed(stream.clone(), pattern, offset) {
            return 0;
        }
        let mut ids = Vec::new();
        st.sched.cancel_stream(&stream, &mut ids);
        for &id in &ids {
            if let Some((tx, _, keys)) = st.waiting.remove(&id) {
                st.forget_keys(id, &keys);
                // Dropping the sender resolves the ticket to `None`.
                drop(tx);
            }
        }
        st.stats.cancelled += ids.len() as u64;
        ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> CacheKey {
        CacheKey::file_block(Arc::from("f"), Arc::from("v"), 1 << 20, i)
    }

    /// A demand fetch and the prefetch the floor lets in beside it: the link is busy,
    /// so the next prefetch waits.
    async fn busy(wire: &Arc<Wire>) -> (WirePermit, Arc<WirePermit>) {
        let d = wire.demand();
        let p = wire
            .submit(Class::Prefetch, JobId(9), Arc::from("g"), &[])
            .await
            .expect("the floor's prefetch starts");
        (d, p)
    }

    #[tokio::test]
    async fn queued_prefetch_starts_when_demand_ends() {
        let wire = Arc::new(Wire::with_floor(LinkShare::default(), 1));
        let (d, p0) = busy(&wire).await;
        let t = wire.submit(Class::Prefetch, JobId(1), Arc::from("f"), &[key(3)]);
        assert!(t.peek().is_none(), "held back while demand waits");
        drop(d);
        let p = t.await.expect("started");
        assert_eq!(p.class(), Class::Prefetch);
        assert_eq!(wire.load(Class::Prefetch), (2, 0));
        drop(p);
        drop(p0);
        assert_eq!(wire.load(Class::Prefetch), (0, 0));
    }

    #[tokio::test]
    async fn a_demand_read_promotes_the_queued_run_bringing_its_block() {
        let wire = Arc::new(Wire::with_floor(LinkShare::default(), 1));
        let _busy = busy(&wire).await;
        let t = wire.submit(Class::Prefetch, JobId(1), Arc::from("f"), &[key(3), key(4)]);
        assert!(!wire.promote(&key(5)));
        assert!(wire.promote(&key(4)));
        let p = t.await.expect("started");
        assert_eq!(p.class(), Class::Demand);
        assert_eq!(wire.load(Class::Demand), (2, 0));
        assert!(!wire.promote(&key(3)), "not queued any more");
    }

    #[tokio::test]
    async fn a_cancelled_run_gets_no_permit() {
        let wire = Arc::new(Wire::with_floor(LinkShare::default(), 1));
        let path: Arc<str> = Arc::from("f");
        let _busy = busy(&wire).await;
        assert_eq!(wire.course(JobId(1), &path, Pattern::Sequential, 0), 0);
        let t = wire.submit(Class::Prefetch, JobId(1), path.clone(), &[key(3)]);
        assert_eq!(wire.course(JobId(1), &path, Pattern::Random, 0), 1);
        assert!(t.await.is_none());
        assert_eq!(wire.stats().cancelled, 1);
        assert!(!wire.promote(&key(3)));
    }
}
