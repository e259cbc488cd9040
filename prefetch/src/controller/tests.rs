use super::*;
use proptest::prelude::*;
use strata_types::Pattern;

const MB: u64 = 1 << 20;

fn ev(job: u64, path: &str, offset: u64, len: u64, size: u64, now_ns: u64) -> AccessEvent {
    AccessEvent {
        now_ns,
        pattern: Pattern::Sequential,
        ..AccessEvent::read(job, path, offset, len, size)
    }
}

/// Asks for `f<i+1>` (whole, 1000 bytes) on an access to `f<i>`; counts calls and feedback.
#[derive(Default)]
struct NextFile {
    calls: Arc<std::sync::atomic::AtomicU64>,
    used: Arc<std::sync::atomic::AtomicU64>,
    wasted: Arc<std::sync::atomic::AtomicU64>,
}

impl Predictor for NextFile {
    fn name(&self) -> &'static str {
        "next-file"
    }
    fn on_access(&mut self, e: &AccessEvent, out: &mut Vec<PrefetchRequest>) {
        use std::sync::atomic::Ordering::Relaxed;
        self.calls.fetch_add(1, Relaxed);
        let i: u64 = e.path[1..].parse().expect("f<i>");
        out.push(PrefetchRequest {
            path: Arc::from(format!("f{}", i + 1)),
            offset: 0,
            len: 1000,
            confidence: 0.5,
        });
    }
    fn on_feedback(&mut self, _job: JobId, _path: &str, fb: Feedback) {
        use std::sync::atomic::Ordering::Relaxed;
        match fb {
            Feedback::Used { .. } | Feedback::Late { .. } => self.used.fetch_add(1, Relaxed),
            Feedback::Wasted { .. } => self.wasted.fetch_add(1, Relaxed),
        };
    }
}

fn with_next_file(bound: u64) -> (AccessController<u64>, NextFile) {
    let p = NextFile::default();
    let probe = NextFile {
        calls: p.calls.clone(),
        used: p.used.clone(),
        wasted: p.wasted.clone(),
    };
    let c = AccessController::new(
        ControllerConfig {
            max_backlog_bytes: bound,
            ..ControllerConfig::default()
        },
        Some(Box::new(crate::sequential::SequentialPredictor::default())),
        Some(Box::new(p)),
    );
    (c, probe)
}

/// A cross-file order of job 1 for `f2`.
fn cross_file_order() -> PrefetchOrder {
    PrefetchOrder {
        job: JobId(1),
        path: Arc::from("f2"),
        offset: 0,
        len: 1000,
        origin: Origin::CrossFile,
        priority: 0.5,
    }
}

/// The first access of a file per job since it read another one feeds the cross-file
/// predictor; further chunks of the same file do not.
#[test]
fn cross_file_predictor_is_fed_once_per_file_visit() {
    use std::sync::atomic::Ordering::Relaxed;
    let (mut c, probe) = with_next_file(u64::MAX);
    let mut out = Vec::new();
    for (job, path, off) in [
        (1, "f1", 0),
        (1, "f1", 4096),
        (2, "f1", 0), // another job: its own first visit
        (1, "f1", 8192),
        (1, "f2", 0),
        (1, "f1", 0), // back to f1 after another file: a new visit
    ] {
        c.on_access(&ev(job, path, off, 4096, 1000, 1), |_| true, &mut out);
    }
    assert_eq!(probe.calls.load(Relaxed), 4);
}

#[test]
fn readahead_comes_before_cross_file_and_outcomes_reach_the_predictor() {
    use std::sync::atomic::Ordering::Relaxed;
    let (mut c, probe) = with_next_file(u64::MAX);
    let mut out = Vec::new();
    // Contiguous 1 MiB reads of a 100 MiB f1 at 100 MB/s: readahead of f1 starts.
    for i in 0..4u64 {
        out.clear();
        c.on_access(
            &ev(1, "f1", i * MB, MB, 100 * MB, 1 + i * 10_000_000),
            |_| true,
            &mut out,
        );
    }
    // Now a new file: both predictors speak.
    out.clear();
    c.on_access(
        &ev(1, "f7", 0, MB, 100 * MB, 50_000_000),
        |_| true,
        &mut out,
    );
    let origins: Vec<Origin> = out.iter().map(|o| o.origin).collect();
    assert_eq!(
        origins,
        vec![Origin::Readahead, Origin::CrossFile],
        "{out:?}"
    );
    assert!(out.windows(2).all(|w| w[0].priority >= w[1].priority));
    let cross = out[1].clone();
    assert_eq!(&*cross.path, "f8");
    assert_eq!(c.issue(80, &cross, 1000, true), Admission::Issue);
    assert_eq!(c.issue(80, &cross, 1000, true), Admission::Outstanding);
    let o = c.demand(&80).expect("outstanding");
    assert!(o.used && o.lead && o.origin == Origin::CrossFile);
    assert_eq!(c.demand(&80), None, "one outcome per issue");
    assert_eq!(probe.used.load(Relaxed), 1);
    // Evicted unread: wasted, reported once.
    assert_eq!(c.issue(81, &cross, 1000, true), Admission::Issue);
    c.landed(&81);
    assert!(!c.evicted(&81).expect("outstanding").used);
    assert_eq!(c.evicted(&81), None);
    assert_eq!(probe.wasted.load(Relaxed), 1);
    // A failed fetch has no outcome.
    assert_eq!(c.issue(82, &cross, 1000, true), Admission::Issue);
    assert!(c.failed(&82));
    assert_eq!(c.demand(&82), None);
    assert_eq!(c.outstanding(), 0);
}

#[test]
fn the_sweep_finds_landed_blocks_evicted_unread_at_the_next_new_file() {
    let (mut c, probe) = with_next_file(u64::MAX);
    let order = cross_file_order();
    for h in 0..3u64 {
        assert_eq!(c.issue(h, &order, 1000, h == 0), Admission::Issue);
    }
    c.landed(&0);
    c.landed(&1);
    let mut out = Vec::new();
    // Not gone: 0 and 2 (2 is in flight, never swept as wasted).
    let w = c.on_access(&ev(1, "f1", 0, 10, 10, 1), |h| *h != 1 && *h != 2, &mut out);
    assert_eq!(w.len(), 1);
    assert_eq!(c.outstanding(), 2);
    // Same file again: no sweep.
    let w = c.on_access(&ev(1, "f1", 10, 10, 10, 2), |_| false, &mut out);
    assert!(w.is_empty());
    assert_eq!(probe.wasted.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn the_backlog_refuses_past_the_bound_counting_demand_in_flight() {
    let (mut c, _) = with_next_file(3000);
    let order = cross_file_order();
    // One block larger than the bound goes alone.
    assert_eq!(c.issue(0, &order, 5000, true), Admission::Issue);
    assert_eq!(c.issue(1, &order, 1, false), Admission::BacklogFull);
    c.landed(&0);
    assert_eq!(c.backlog_bytes(), 0);
    assert_eq!(c.issue(1, &order, 1500, false), Admission::Issue);
    assert_eq!(c.issue(2, &order, 1500, false), Admission::Issue);
    assert_eq!(c.issue(3, &order, 1, false), Admission::BacklogFull);
    // Demand claims one in flight: its bytes leave the backlog.
    c.demand(&1);
    assert_eq!(c.backlog_bytes(), 1500);
    // Demand in flight counts against the bound too, twice.
    c.set_demand_in_flight(500);
    assert_eq!(c.issue(3, &order, 600, false), Admission::BacklogFull);
    assert_eq!(c.issue(3, &order, 500, false), Admission::Issue);
    c.set_demand_in_flight(0);
    assert_eq!(c.backlog_bytes(), 2000);
}

#[derive(Clone, Debug)]
enum Op {
    Issue(u8, u64),
    Landed(u8),
    Demand(u8),
    Evicted(u8),
    Failed(u8),
    Sweep(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..16, 1u64..2000).prop_map(|(h, b)| Op::Issue(h, b)),
        (0u8..16).prop_map(Op::Landed),
        (0u8..16).prop_map(Op::Demand),
        (0u8..16).prop_map(Op::Evicted),
        (0u8..16).prop_map(Op::Failed),
        (0u8..16).prop_map(Op::Sweep),
    ]
}

proptest! {
    /// The backlog never exceeds its bound (but for one oversized block alone), and every
    /// issued block gets at most one outcome (Used or Wasted), none after a failure.
    #[test]
    fn backlog_is_bounded_and_outcomes_are_unique(ops in proptest::collection::vec(op(), 1..200)) {
        let bound = 4000;
        let (mut c, _) = with_next_file(bound);
        let order = cross_file_order();
        // Per handle: Some(landed) while issued and unsettled.
        let mut model: HashMap<u8, (bool, u64)> = HashMap::default();
        let mut file = 0u64;
        for op in ops {
            match op {
                Op::Issue(h, b) => {
                    let a = c.issue(u64::from(h), &order, b, true);
                    match a {
                        Admission::Issue => {
                            prop_assert!(!model.contains_key(&h));
                            model.insert(h, (false, b));
                        }
                        Admission::Outstanding => prop_assert!(model.contains_key(&h)),
                        Admission::BacklogFull => prop_assert!(!model.contains_key(&h)),
                    }
                }
                Op::Landed(h) => {
                    c.landed(&u64::from(h));
                    if let Some(e) = model.get_mut(&h) {
                        e.0 = true;
                    }
                }
                Op::Demand(h) => {
                    let o = c.demand(&u64::from(h));
                    prop_assert_eq!(o.is_some(), model.remove(&h).is_some());
                }
                Op::Evicted(h) => {
                    let o = c.evicted(&u64::from(h));
                    prop_assert_eq!(o.is_some(), model.remove(&h).is_some());
                }
                Op::Failed(h) => {
                    prop_assert_eq!(c.failed(&u64::from(h)), model.remove(&h).is_some());
                }
                Op::Sweep(gone) => {
                    file += 1;
                    let path = format!("f{}", 100 + file);
                    let mut out = Vec::new();
                    let w = c.on_access(&ev(1, &path, 0, 10, 10, file), |h| *h != u64::from(gone), &mut out);
                    for o in w {
                        prop_assert!(!o.used);
                        let e = model.remove(&gone);
                        prop_assert!(e.is_some_and(|e| e.0), "only a landed block is swept");
                    }
                }
            }
            let in_flight: u64 = model.values().filter(|e| !e.0).map(|e| e.1).sum();
            prop_assert_eq!(c.backlog_bytes(), in_flight);
            let alone = model.values().filter(|e| !e.0).count() == 1;
            prop_assert!(in_flight <= bound || alone, "{} > {}", in_flight, bound);
            prop_assert_eq!(c.outstanding(), model.len());
        }
    }
}

/// Readahead refused by a full backlog is ordered again, first, at the stream's next
/// access while the reader is short of it; cross-file orders are just dropped.
#[test]
fn refused_readahead_is_ordered_again_while_still_ahead() {
    let (mut c, _) = with_next_file(u64::MAX);
    let ra = PrefetchOrder {
        job: JobId(1),
        path: Arc::from("f1"),
        offset: 4 * MB,
        len: 8 * MB,
        origin: Origin::Readahead,
        priority: 1.9,
    };
    c.refused(&ra, 6 * MB);
    c.refused(&cross_file_order(), 0);
    let mut out = Vec::new();
    c.on_access(&ev(1, "f1", 3 * MB, MB, 100 * MB, 1), |_| true, &mut out);
    let first = &out[0];
    assert_eq!(
        (first.origin, first.offset, first.len),
        (Origin::Readahead, 6 * MB, 6 * MB)
    );
    assert!(out.iter().skip(1).all(|o| o.priority < first.priority));
    // Ordered once: the next access does not repeat it.
    out.clear();
    c.on_access(&ev(1, "f1", 4 * MB, MB, 100 * MB, 2), |_| true, &mut out);
    assert!(
        out.iter().all(|o| o.offset != 6 * MB || o.len != 6 * MB),
        "{out:?}"
    );
    // A reader that jumped into the hole gets no deferred order.
    c.refused(&ra, 6 * MB);
    out.clear();
    c.on_access(&ev(1, "f1", 7 * MB, MB, 100 * MB, 3), |_| true, &mut out);
    assert!(out.iter().all(|o| o.priority <= 2.0), "{out:?}");
}

/// Readahead read by demand before it landed is `Late` for the sequential predictor,
/// whose window then deepens past its fixed maximum to the link's window (issue 14);
/// read after it landed, it is `Used` and the window stays.
#[test]
fn readahead_read_before_it_landed_deepens_the_window() {
    let run = |land_first: bool| {
        let mut c: AccessController<u64> = AccessController::with_predictors(true, false);
        c.set_link_window(256 * MB);
        c.set_config(ControllerConfig {
            max_backlog_bytes: u64::MAX,
            ..ControllerConfig::default()
        });
        let mut out = Vec::new();
        let mut deepest = 0u64;
        for i in 0..40u64 {
            // The reader reaches block i: report it, then the access.
            if land_first {
                c.landed(&i);
            }
            c.demand(&i);
            out.clear();
            c.on_access(
                &ev(1, "f", i * MB, MB, 1 << 40, 1 + i * 5_000_000),
                |_| true,
                &mut out,
            );
            for o in &out {
                deepest = deepest.max(o.offset + o.len - (i + 1) * MB);
                let order = o.clone();
                let (first, end) = (o.offset / MB, (o.offset + o.len).div_ceil(MB));
                for b in first..end {
                    let _ = c.issue(b, &order, MB, b == first);
                }
            }
        }
        deepest
    };
    let late = run(false);
    let on_time = run(true);
    assert!(on_time <= 32 * MB, "a reader served on time: {on_time}");
    assert!(
        late > 64 * MB,
        "a reader that waits deepens: {late} (on time {on_time})"
    );
}
