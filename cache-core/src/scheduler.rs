//! Demand before prefetch on the wire (issue 13, item 4): the one scheduler of store
//! requests, shared by the daemon's store path ([`crate::reader::ObjectReader`]) and the
//! replay's link model. Pure logic: the caller sends the requests it is told
//! to send and reports when each one ends.
//!
//! # Rules
//!
//! - **Classes.** [`Class::Demand`] (a reader waits for it), then [`Class::Prefetch`]
//!   (readahead of the stream being read, or a client's explicit request), then
//!   [`Class::Speculative`] (cross-file prediction). Demand is never queued.
//! - **Share.** Beyond a floor of [`StoreScheduler::DEFAULT_FLOOR`] prefetch requests, a
//!   prefetch or speculative request starts only while prefetch would keep at most
//!   [`LinkShare::prefetch_cap`] of the requests in flight with demand active
//!   (`(p + 1) / (d + p + 1) <= cap`); with no demand in flight it starts at once
//!   (work-conserving). Concurrent GETs share a link about equally, so the request share
//!   is the bandwidth share a store client can enforce; the replay's link also splits
//!   its rates by [`LinkShare`] for the transfers already started.
//! - **Queue.** Requests held back wait in their class, oldest first; when a request
//!   ends, the queue is drained as far as the share allows, prefetch before
//!   speculative.
//! - **Demand overtakes.** A demand read of a block whose prefetch is still queued
//!   [`promotes`](StoreScheduler::promote) it: it starts at once, as demand.
//! - **Cancel.** When a stream changes course ([`CourseWatch`]), its queued requests are
//!   [`cancelled`](StoreScheduler::cancel_stream): they never send a request. Requests
//!   already on the wire finish (a GET cannot be taken back without wasting what it
//!   already moved).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use strata_types::{FxBuild, Pattern};

use crate::link_share::LinkShare;

/// Priority class of a store request, highest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    Demand = 0,
    Prefetch = 1,
    Speculative = 2,
}

impl Class {
    fn queue(self) -> usize {
        self as usize - 1
    }
}

/// What a queued request is waiting as.
#[derive(Clone, Copy, Debug)]
struct Queued {
    class: Class,
    seq: u64,
}

/// See the module docs. `R` names a request (the replay's block id, the daemon's run
/// id), `S` the stream it belongs to (job and file).
#[derive(Debug)]
pub struct StoreScheduler<R, S> {
    share: LinkShare,
    /// Prefetch requests that may be in flight whatever demand does.
    floor: usize,
    /// Requests in flight per class.
    active: [usize; 3],
    /// Held-back requests of [`Class::Prefetch`] and [`Class::Speculative`], oldest
    /// first; entries no longer in `queued` (promoted, cancelled) are skipped.
    queues: [VecDeque<(u64, R, S)>; 2],
    queued: HashMap<R, Queued, FxBuild>,
    seq: u64,
}

impl<R: Copy + Eq + Hash, S: Eq> StoreScheduler<R, S> {
    /// Prefetch requests allowed in flight beside demand regardless of the share
    /// (see [`Self::with_floor`]): 16. Measured on the whole replay corpus (17 traces x
    /// 10/20/40%, docs/BENCHMARKS.md "Demand before prefetch on the wire"): floors of
    /// 0 / 1 / 4 cost the sequential wins 8-55% JCT (generator shards 10%: 0.89 / 0.76 /
    /// 0.62x the best baseline against 0.575x with no hold-back) and helped two of 51
    /// pairs by 2.4%; at 16 no pair moves more than 2.5% (generator shards 20%:
    /// 0.977x). The controller's backlog (20 MB, about 20 blocks) is then the tighter
    /// bound, and the link's split of bandwidth ([`LinkShare`]) what keeps demand
    /// first in the replay.
    pub const DEFAULT_FLOOR: usize = 16;

    pub fn new(share: LinkShare) -> Self {
        Self::with_floor(share, Self::DEFAULT_FLOOR)
    }

    /// A scheduler that lets `floor` prefetch requests be in flight beside demand
    /// whatever the share says: a GET spends its first-byte latency (20 ms) moving no
    /// bytes, so one prefetch started beside a demand fetch overlaps its latency with
    /// it, where holding it back adds that latency to the reader's next block.
    pub fn with_floor(share: LinkShare, floor: usize) -> Self {
        StoreScheduler {
            share,
            floor,
            active: [0; 3],
            queues: [VecDeque::new(), VecDeque::new()],
            queued: HashMap::default(),
            seq: 0,
        }
    }

    /// Requests in flight of `class`.
    pub fn in_flight(&self, class: Class) -> usize {
        self.active[class as usize]
    }

    /// Requests waiting to start.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// Whether `req` is waiting to start.
    pub fn is_queued(&self, req: &R) -> bool {
        self.queued.contains_key(req)
    }

    /// Whether one more non-demand request may start now.
    fn prefetch_may_start(&self) -> bool {
        let d = self.active[0];
        if d == 0 {
            return true;
        }
        let p = self.active[1] + self.active[2] + 1;
        p <= self.floor || p as f64 / (d + p) as f64 <= self.share.prefetch_cap + 1e-12
    }

    /// A demand request starts (it always does).
    pub fn demand_started(&mut self) {
        self.active[0] += 1;
    }

    /// Asks to send `req` of `class` for `stream`: true if it starts now (report its end
    /// with [`Self::finished`]), false if it waits (it comes back from
    /// [`Self::finished`] when it may start, unless promoted or cancelled first).
    pub fn submit(&mut self, req: R, class: Class, stream: S) -> bool {
        if class == Class::Demand {
            self.demand_started();
            return true;
        }
        if self.queued.is_empty() && self.prefetch_may_start() {
            self.active[class as usize] += 1;
            return true;
        }
        self.seq += 1;
        self.queued.insert(
            req,
            Queued {
                class,
                seq: self.seq,
            },
        );
        self.queues[class.queue()].push_back((self.seq, req, stream));
        false
    }

    /// A request of `class` ended (done, failed, or started and not needed): appends
    /// the queued requests that start now to `start`, in order.
    pub fn finished(&mut self, class: Class, start: &mut Vec<R>) {
        let a = &mut self.active[class as usize];
        *a = a.saturating_sub(1);
        self.drain(start);
    }

    fn drain(&mut self, start: &mut Vec<R>) {
        while !self.queued.is_empty() && self.prefetch_may_start() {
            let Some((class, req)) = self.pop() else {
                break;
            };
            self.active[class as usize] += 1;
            start.push(req);
        }
    }

    fn pop(&mut self) -> Option<(Class, R)> {
        for q in &mut self.queues {
            while let Some((seq, req, _)) = q.pop_front() {
                match self.queued.get(&req) {
                    Some(e) if e.seq == seq => {
                        let class = e.class;
                        self.queued.remove(&req);
                        return Some((class, req));
                    }
                    _ => continue,
                }
            }
        }
        None
    }

    /// A demand read wants what queued `req` brings: it starts now, as demand (report
    /// its end as [`Class::Demand`]). False if `req` was not queued.
    pub fn promote(&mut self, req: &R) -> bool {
        if self.queued.remove(req).is_none() {
            return false;
        }
        self.active[0] += 1;
        true
    }

    /// `stream` changed course: its queued requests are dropped (appended to
    /// `cancelled`; none of them sends anything).
    pub fn cancel_stream(&mut self, stream: &S, cancelled: &mut Vec<R>) {
        if self.queued.is_empty() {
            return;
        }
        for q in &mut self.queues {
            q.retain(|(seq, req, s)| {
                let live = self.queued.get(req).is_some_and(|e| e.seq == *seq);
                if live && s == stream {
                    self.queued.remove(req);
                    cancelled.push(*req);
                    return false;
                }
                live
            });
        }
    }
}

/// Remembers, per stream (job and file), the pattern and direction of its last demand
/// read, so a driver knows when the stream changes course and cancels its queued
/// prefetch. Pure logic; bounded (cleared at [`CourseWatch::MAX_STREAMS`]).
#[derive(Debug, Default)]
pub struct CourseWatch<S> {
    last: HashMap<S, (Pattern, u64), FxBuild>,
}

impl<S: Eq + Hash> CourseWatch<S> {
    /// Streams remembered at most: 64Ki (as the controller's per-job memory); beyond
    /// it the memory is cleared, and each stream's next read starts afresh.
    pub const MAX_STREAMS: usize = 1 << 16;

    /// A demand read of `stream` at `offset` classified `pattern`: true if the stream
    /// changed course since its last read: its pattern became another known one (a
    /// sequential stream turned random, or the reverse), or a sequential stream went
    /// backwards (a new pass, or a seek: what readahead queued for the old position
    /// is not what the reader wants next).
    pub fn changed(&mut self, stream: S, pattern: Pattern, offset: u64) -> bool {
        if self.last.len() >= Self::MAX_STREAMS {
            self.last.clear();
        }
        let prev = self.last.insert(stream, (pattern, offset));
        let Some((p0, off0)) = prev else {
            return false;
        };
        let known = |p: Pattern| p != Pattern::Unknown;
        (known(p0) && known(pattern) && p0 != pattern)
            || (pattern == Pattern::Sequential && offset < off0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Sched = StoreScheduler<u32, u8>;

    /// No floor: the share alone decides (the floor has its own test).
    fn sched() -> Sched {
        StoreScheduler::with_floor(LinkShare::default(), 0)
    }

    #[test]
    fn the_floor_lets_one_prefetch_overlap_demand() {
        let mut s: Sched = StoreScheduler::with_floor(LinkShare::default(), 1);
        s.demand_started();
        assert!(
            s.submit(1, Class::Prefetch, 0),
            "the first goes beside demand"
        );
        assert!(!s.submit(2, Class::Prefetch, 0), "the second waits");
        for _ in 0..7 {
            s.demand_started();
        }
        // 8 demand, 1 prefetch: a second prefetch makes 2 of 10, within the share.
        let mut start = Vec::new();
        s.finished(Class::Prefetch, &mut start);
        assert_eq!(start, vec![2]);
        assert!(
            s.submit(3, Class::Prefetch, 0),
            "2 of 10 in flight is within 20%"
        );
        assert!(!s.submit(4, Class::Prefetch, 0), "3 of 11 is not");
    }

    #[test]
    fn an_idle_link_starts_prefetch_at_once() {
        let mut s = sched();
        for r in 0..10 {
            assert!(s.submit(r, Class::Prefetch, 0));
        }
        assert_eq!(s.in_flight(Class::Prefetch), 10);
    }

    #[test]
    fn a_demand_request_overtakes_queued_prefetch() {
        let mut s = sched();
        s.demand_started();
        assert!(
            !s.submit(1, Class::Prefetch, 0),
            "held back while demand waits"
        );
        assert!(!s.submit(2, Class::Speculative, 0));
        // A second reader's demand still starts at once, ahead of both.
        assert!(s.submit(3, Class::Demand, 1));
        assert_eq!(s.in_flight(Class::Demand), 2);
        // Demand for what prefetch 2 would bring takes it over, before prefetch 1.
        assert!(s.promote(&2));
        assert!(!s.is_queued(&2) && s.is_queued(&1));
        assert_eq!(s.in_flight(Class::Demand), 3);
        let mut start = Vec::new();
        for _ in 0..3 {
            s.finished(Class::Demand, &mut start);
        }
        assert_eq!(start, vec![1], "the promoted request is not started twice");
    }

    #[test]
    fn prefetch_goes_before_speculation() {
        let mut s = sched();
        s.demand_started();
        assert!(!s.submit(7, Class::Speculative, 0));
        assert!(!s.submit(8, Class::Prefetch, 0));
        let mut start = Vec::new();
        s.finished(Class::Demand, &mut start);
        assert_eq!(start, vec![8, 7]);
    }

    #[test]
    fn a_cancelled_prefetch_sends_no_request() {
        let mut s = sched();
        s.demand_started();
        assert!(!s.submit(1, Class::Prefetch, 5));
        assert!(!s.submit(2, Class::Prefetch, 6));
        assert!(!s.submit(3, Class::Speculative, 5));
        let mut cancelled = Vec::new();
        s.cancel_stream(&5, &mut cancelled);
        assert_eq!(cancelled, vec![1, 3]);
        assert!(!s.promote(&1), "a cancelled request cannot start");
        let mut start = Vec::new();
        s.finished(Class::Demand, &mut start);
        assert_eq!(start, vec![2], "only the other stream's request is sent");
        s.finished(Class::Prefetch, &mut start);
        assert_eq!(start, vec![2]);
        assert_eq!(s.queued(), 0);
    }

    #[test]
    fn a_resubmitted_request_is_not_started_twice() {
        let mut s = sched();
        s.demand_started();
        assert!(!s.submit(1, Class::Prefetch, 0));
        let mut c = Vec::new();
        s.cancel_stream(&0, &mut c);
        assert!(!s.submit(1, Class::Prefetch, 0));
        let mut start = Vec::new();
        s.finished(Class::Demand, &mut start);
        assert_eq!(start, vec![1]);
    }

    #[test]
    fn course_changes_on_a_new_pattern_or_a_backward_sequential_read() {
        let mut w = CourseWatch::default();
        assert!(!w.changed(1u8, Pattern::Unknown, 0));
        assert!(!w.changed(1, Pattern::Sequential, 4096));
        assert!(!w.changed(1, Pattern::Sequential, 8192));
        assert!(w.changed(1, Pattern::Sequential, 0), "a second pass");
        assert!(
            w.changed(1, Pattern::Random, 1 << 20),
            "sequential turned random"
        );
        assert!(
            !w.changed(1, Pattern::Random, 0),
            "random reads go anywhere"
        );
        assert!(!w.changed(2, Pattern::Sequential, 0), "another stream");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Demand,
        Submit(u32, bool),
        Finish(u8),
        Promote(u32),
        Cancel(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Demand),
            (0u32..16, any::<bool>()).prop_map(|(r, spec)| Op::Submit(r, spec)),
            (0u8..3).prop_map(Op::Finish),
            (0u32..16).prop_map(Op::Promote),
            (0u8..4).prop_map(Op::Cancel),
        ]
    }

    proptest! {
        /// Whatever happens, a prefetch or speculative request only starts while
        /// prefetch stays within its share of the requests in flight with demand
        /// active, nothing cancelled or promoted ever comes out of the queue, and
        /// nothing starts twice.
        #[test]
        fn prefetch_never_exceeds_its_share_while_demand_waits(ops in proptest::collection::vec(op(), 1..200)) {
            let mut s = sched();
            let cap = LinkShare::default().prefetch_cap;
            let mut gone: std::collections::HashSet<u32> = Default::default();
            let mut waiting: std::collections::HashSet<u32> = Default::default();
            let check = |s: &Sched| {
                let d = s.in_flight(Class::Demand);
                let p = s.in_flight(Class::Prefetch) + s.in_flight(Class::Speculative);
                d == 0 || p as f64 / (d + p) as f64 <= cap + 1e-9
            };
            for o in ops {
                match o {
                    Op::Demand => s.demand_started(),
                    Op::Submit(r, spec) => {
                        if waiting.contains(&r) { continue; }
                        let class = if spec { Class::Speculative } else { Class::Prefetch };
                        let stream = (r % 4) as u8;
                        let p0 = s.in_flight(Class::Prefetch) + s.in_flight(Class::Speculative);
                        if s.submit(r, class, stream) {
                            prop_assert!(check(&s) || s.in_flight(Class::Demand) == 0);
                            prop_assert_eq!(p0 + 1, s.in_flight(Class::Prefetch) + s.in_flight(Class::Speculative));
                        } else {
                            waiting.insert(r);
                            gone.remove(&r);
                        }
                    }
                    Op::Finish(c) => {
                        let class = [Class::Demand, Class::Prefetch, Class::Speculative][c as usize];
                        if s.in_flight(class) == 0 { continue; }
                        let mut start = Vec::new();
                        s.finished(class, &mut start);
                        // Ending a demand request may leave the prefetch already on
                        // the wire over the share; starting one may not.
                        if !start.is_empty() { prop_assert!(check(&s)); }
                        for r in start {
                            prop_assert!(waiting.remove(&r), "started twice or never queued");
                            prop_assert!(!gone.contains(&r));
                        }
                    }
                    Op::Promote(r) => {
                        if s.promote(&r) {
                            prop_assert!(waiting.remove(&r));
                            gone.insert(r);
                        }
                    }
                    Op::Cancel(stream) => {
                        let mut c = Vec::new();
                        s.cancel_stream(&stream, &mut c);
                        for r in c {
                            prop_assert!(waiting.remove(&r));
                            prop_assert_eq!((r % 4) as u8, stream);
                            gone.insert(r);
                        }
                    }
                }
            }
            prop_assert_eq!(waiting.len(), s.queued());
        }
    }
}
