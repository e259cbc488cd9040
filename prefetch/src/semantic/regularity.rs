//! Regularities of one lane (a coherent stream of one job over one template), and the
//! paths they predict.
//!
//! - **Stride**: the vector of field differences between consecutive files repeats
//!   (`train-000122.tar` -> `...123` -> `...124`: +1). Confirmed after `min_run`
//!   equal differences in a row, because one difference is what any two random names
//!   have. Fields moving in lockstep (a class id written in both directory and file
//!   name) move together.
//! - **Rollover**: an outer field steps while the striding field resets
//!   (`date=2025-01-07/part-0007` -> `date=2025-01-08/part-0000`). Learnt once seen; the
//!   walk then rolls over after the last inner value seen (or, when the directory is
//!   listed, at the first name the listing lacks).
//! - **Bounded index**: `model-00003-of-00008` counts up to its `-of-` total. Confirmed
//!   on the first file (a sharded checkpoint is loaded whole) and never walked past `N`.
//! - **Lexical order**: successive files are neighbours in the listing order of their
//!   member set; the walk follows the listing (which knows the exact names, gaps
//!   included) across directories.
//!
//! An unlisted stride walk never looks further ahead than the run it has seen (a run of
//! `r` files is evidence for about `r` more): the end of an unlisted directory costs at
//! most its own length in wasted predictions while the depth ramps up.
//!
//! Depth control per lane, the readahead rule transposed to files: the lane starts at
//! `initial_depth` once a rule is confirmed, doubles its depth on every access that hit an
//! earlier prediction, halves it on every access that missed, and goes quiet (depth 0,
//! evidence reset) after `miss_limit` misses in a row: a lane must re-earn confirmation
//! before it predicts again, which is what keeps random workloads free of prefetch.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use strata_types::FxBuild;

use super::listing::{ListingIndex, MemberSet};
use super::tokenize::{FieldKind, TokenizedPath};
use super::SemanticConfig;

/// An outer field stepping while the inner one resets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rollover {
    pub outer: usize,
    pub outer_step: i64,
    pub inner: usize,
    /// First inner value of a new outer value.
    pub base: i64,
    /// Last inner value seen before the outer one stepped.
    pub end: i64,
}

/// Which rule produced a lane's predictions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Lexical,
    Stride,
}

/// A predicted path, with the listed size when known.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub path: Arc<str>,
    pub size: Option<u64>,
    /// Steps ahead of the last access (1 = next).
    pub step: u32,
}

#[derive(Debug)]
pub struct Lane {
    pub last: TokenizedPath,
    pub last_seq: u64,
    /// Widest zero-padded width seen per field.
    pad: Vec<u8>,
    stride: Option<Vec<i64>>,
    stride_run: u32,
    rollover: Option<Rollover>,
    /// `(field, largest value)` for `-of-N` indices.
    bound: Option<(usize, i64)>,
    lex_run: u32,
    last_member: Option<u32>,
    pub depth: u32,
    /// Depth above which growth is additive (+1 per `depth` hits) instead of doubling:
    /// set to half the depth when a prefetch was dropped unread (TCP's ssthresh: the
    /// cache showed how much read-ahead it keeps, probe above it slowly).
    ceiling: u32,
    hits_since_grow: u32,
    misses: u32,
    pub hits: u64,
    pub judged: u64,
    pending: VecDeque<Arc<str>>,
    pending_set: HashSet<Arc<str>, FxBuild>,
    /// Addresses of the `Arc`s `pending` holds: a listed file's path is one `Arc` for
    /// the listing's life, so asking whether it is pending is a pointer lookup, not a
    /// hash of its text (the window's files are asked about on every access).
    pending_ptrs: HashSet<usize, FxBuild>,
    /// Largest file size seen in the lane: the size guess for unlisted predictions.
    pub max_file_size: u64,
    /// When the lane's last file was first read (`AccessEvent::now_ns`; 0: not yet).
    last_file_ns: u64,
    /// EWMA of the time between the lane's successive files, ns (0: not measured).
    interval_ns: f64,
    /// [`Self::observe`]'s field deltas, kept between accesses (a `Vec` per access
    /// before; a new stride takes it, and the stride it replaces becomes the buffer).
    deltas: Vec<i64>,
}

/// Weight of a new sample in a lane's file interval: 1/4, a few files' memory (a
/// reader's pace changes when prefetch starts hitting, and the window must follow).
const INTERVAL_WEIGHT: f64 = 0.25;

/// Per-field step from `x` to `y`: `None` when the kinds differ, an opaque field changed
/// or the difference overflows.
#[inline]
fn delta(x: &super::tokenize::Field, y: &super::tokenize::Field) -> Option<i64> {
    if x.kind != y.kind {
        None
    } else if x.kind == FieldKind::Opaque {
        (x.value == y.value).then_some(0)
    } else {
        y.value.checked_sub(x.value)
    }
}

/// The position of the only `true` of `flags`; None when there is none or several.
fn only(mut flags: impl Iterator<Item = bool>) -> Option<usize> {
    let first = flags.position(|f| f)?;
    (!flags.any(|f| f)).then_some(first)
}

#[cfg(test)]
fn deltas(a: &TokenizedPath, b: &TokenizedPath) -> Option<Vec<i64>> {
    if a.fields.len() != b.fields.len() {
        return None;
    }
    a.fields
        .iter()
        .zip(&b.fields)
        .map(|(x, y)| delta(x, y))
        .collect()
}

/// [`deltas`] into `out` (cleared first): true where `deltas` is `Some` (then `out`
/// holds its vector), false where it is `None` (`out` then holds a prefix).
fn deltas_into(a: &TokenizedPath, b: &TokenizedPath, out: &mut Vec<i64>) -> bool {
    out.clear();
    if a.fields.len() != b.fields.len() {
        return false;
    }
    for (x, y) in a.fields.iter().zip(&b.fields) {
        match delta(x, y) {
            Some(d) => out.push(d),
            None => return false,
        }
    }
    true
}

impl Lane {
    pub fn new(
        t: TokenizedPath,
        seq: u64,
        member: Option<u32>,
        file_size: u64,
        cfg: &SemanticConfig,
    ) -> Self {
        let pad = t
            .fields
            .iter()
            .map(|f| if f.padded { f.width } else { 0 })
            .collect();
        let mut lane = Lane {
            last: t,
            last_seq: seq,
            pad,
            stride: None,
            stride_run: 0,
            rollover: None,
            bound: None,
            lex_run: 0,
            last_member: member,
            depth: 0,
            ceiling: cfg.max_depth,
            hits_since_grow: 0,
            misses: 0,
            hits: 0,
            judged: 0,
            pending: VecDeque::new(),
            pending_set: HashSet::default(),
            pending_ptrs: HashSet::default(),
            max_file_size: file_size,
            last_file_ns: 0,
            interval_ns: 0.0,
            deltas: Vec::new(),
        };
        lane.arm_bound();
        if lane.bound.is_some() {
            lane.depth = cfg.max_depth;
        }
        lane
    }

    /// `-of-N`: confirm a +1 walk of the index field up to N on the first file.
    fn arm_bound(&mut self) {
        let Some((idx, total)) = self.last.of_total else {
            return;
        };
        let n = self.last.fields[total].value;
        let v = self.last.fields[idx].value;
        // Shards numbered from 0 end at N-1; from 1, at N.
        let max = if v == 0 { n - 1 } else { n };
        if v < max {
            let mut s = vec![0; self.last.fields.len()];
            s[idx] = 1;
            self.stride = Some(s);
            self.stride_run = u32::MAX / 2;
            self.bound = Some((idx, max));
        }
    }

    /// Distance of `t` from this lane's position, for assigning interleaved accesses.
    /// (Sum of |`deltas`|, computed without building the vector: this runs for every
    /// lane on every access.)
    pub fn distance(&self, t: &TokenizedPath) -> Option<u64> {
        if self.last.fields.len() != t.fields.len() {
            return None;
        }
        let mut sum = 0u64;
        for (x, y) in self.last.fields.iter().zip(&t.fields) {
            sum = sum.saturating_add(delta(x, y)?.unsigned_abs());
        }
        Some(sum)
    }

    /// True when `t` is exactly the next step of this lane's stride (`deltas == stride`,
    /// compared field by field).
    pub fn continues(&self, t: &TokenizedPath) -> bool {
        let Some(stride) = &self.stride else {
            return false;
        };
        self.last.fields.len() == t.fields.len()
            && stride.len() == t.fields.len()
            && self
                .last
                .fields
                .iter()
                .zip(&t.fields)
                .zip(stride)
                .all(|((x, y), s)| delta(x, y) == Some(*s))
    }

    pub fn is_pending(&self, path: &str) -> bool {
        self.pending_set.contains(path)
    }

    /// [`Self::is_pending`], by the `Arc`'s address first (the same text in another
    /// `Arc` is found by its text).
    fn is_pending_arc(&self, path: &Arc<str>) -> bool {
        self.pending_ptrs.contains(&arc_addr(path)) || self.pending_set.contains(&**path)
    }

    /// Forgets a pending prediction (its prefetch was dropped unread).
    pub fn drop_pending(&mut self, path: &str) -> bool {
        match self.pending_set.take(path) {
            Some(held) => {
                self.pending_ptrs.remove(&arc_addr(&held));
                // The queue holds the very `Arc` the set held (both are added together),
                // once: found by address, without comparing paths.
                if let Some(i) = self.pending.iter().position(|p| Arc::ptr_eq(p, &held)) {
                    self.pending.remove(i);
                }
                true
            }
            None => false,
        }
    }

    /// The lane's next file was first read at `now_ns`: updates the measured interval
    /// between its files (a clock of 0, as in tests without time, measures nothing).
    pub fn note_file_time(&mut self, now_ns: u64) {
        if now_ns == 0 {
            return;
        }
        if self.last_file_ns != 0 && now_ns > self.last_file_ns {
            let gap = (now_ns - self.last_file_ns) as f64;
            self.interval_ns = if self.interval_ns == 0.0 {
                gap
            } else {
                self.interval_ns + INTERVAL_WEIGHT * (gap - self.interval_ns)
            };
        }
        self.last_file_ns = now_ns;
    }

    /// Measured time between the lane's files, ns (None before two timed files).
    pub fn file_interval_ns(&self) -> Option<f64> {
        (self.interval_ns > 0.0).then_some(self.interval_ns)
    }

    /// Laplace estimate of this lane's hit rate.
    pub fn accuracy(&self) -> f32 {
        (self.hits as f32 + 1.0) / (self.judged as f32 + 2.0)
    }

    /// A prefetch of this lane was dropped unread: it was fetched too far ahead for the
    /// cache to keep, so the depth halves (a lane whose *rule* is wrong is silenced by its
    /// own misses in [`Self::observe`]).
    pub fn penalize(&mut self) {
        if self.depth > 1 {
            self.depth /= 2;
        }
        self.ceiling = self.depth.max(1);
        self.hits_since_grow = 0;
    }

    fn grow(&mut self, cfg: &SemanticConfig) {
        if self.depth < self.ceiling {
            self.depth = (self.depth * 2).clamp(1, self.ceiling);
        } else {
            self.hits_since_grow += 1;
            if self.hits_since_grow >= self.depth {
                self.hits_since_grow = 0;
                self.depth += 1;
                self.ceiling = self.depth;
            }
        }
        self.depth = self.depth.clamp(1, cfg.max_depth);
    }

    fn miss(&mut self, cfg: &SemanticConfig) {
        self.misses += 1;
        self.depth /= 2;
        if self.misses >= cfg.miss_limit {
            self.go_quiet();
        }
    }

    fn go_quiet(&mut self) {
        self.depth = 0;
        self.stride_run = 0;
        self.lex_run = 0;
        self.bound = None;
        self.pending.clear();
        self.pending_set.clear();
        self.pending_ptrs.clear();
    }

    /// Folds the next access of this lane in.
    pub fn observe(
        &mut self,
        t: &TokenizedPath,
        seq: u64,
        member: Option<u32>,
        file_size: u64,
        set: Option<&MemberSet>,
        cfg: &SemanticConfig,
    ) {
        self.last_seq = seq;
        self.max_file_size = self.max_file_size.max(file_size);
        for (p, f) in self.pad.iter_mut().zip(&t.fields) {
            if f.padded {
                *p = (*p).max(f.width);
            }
        }
        let had_pending = !self.pending.is_empty();
        let hit = self.drop_pending(&t.path);
        if had_pending {
            self.judged += 1;
            if hit {
                self.hits += 1;
                self.misses = 0;
                self.grow(cfg);
            } else {
                self.miss(cfg);
            }
        }

        // Lexical order in the listing (`set`: the listing's set of `t.template`, which
        // the caller has looked up already).
        match (set, member, self.last_member) {
            (Some(s), Some(m), Some(prev)) if s.rank(m) == s.rank(prev) + 1 => self.lex_run += 1,
            _ => self.lex_run = 0,
        }
        self.last_member = member;

        // Stride, rollover.
        let mut d = std::mem::take(&mut self.deltas);
        if !deltas_into(&self.last, t, &mut d) {
            self.stride = None;
            self.stride_run = 0;
        } else if d.iter().all(|x| *x == 0) {
        } else if self.stride.as_deref() == Some(&d[..]) {
            self.stride_run += 1;
        } else if let Some(r) = self.as_rollover(&d, t) {
            self.rollover = Some(r);
            self.stride_run += 1;
        } else {
            // The new stride takes the buffer; the one it replaces is the next buffer.
            d = self.stride.replace(d).unwrap_or_default();
            self.stride_run = 1;
            self.bound = None;
        }
        self.deltas = d;
        // Into the lane's own buffers (no allocation once they are large enough).
        self.last.clone_from(t);
        if self.bound.is_none() {
            // A new `-of-N` load starting at its first shard re-arms the bound walk.
            if let Some((idx, _)) = self.last.of_total {
                if self.last.fields[idx].value <= 1 {
                    self.arm_bound();
                }
            }
        }
        if self.depth == 0 && self.rule(cfg).is_some() {
            self.depth = if self.bound.is_some() {
                cfg.max_depth
            } else {
                cfg.initial_depth
            };
            self.misses = 0;
        }
    }

    fn as_rollover(&self, d: &[i64], t: &TokenizedPath) -> Option<Rollover> {
        let stride = self.stride.as_ref()?;
        if self.stride_run < 1 {
            return None;
        }
        // The one field the stride moves and the one other field `d` changes, each
        // found without collecting the candidates (a shuffled reader's every access
        // changes its stride and asks).
        let inner = only(stride.iter().map(|&s| s != 0))?;
        if stride[inner] <= 0 || d[inner] >= 0 {
            return None;
        }
        let outer = only(d.iter().enumerate().map(|(i, &x)| i != inner && x != 0))?;
        (d[outer] > 0).then(|| Rollover {
            outer,
            outer_step: d[outer],
            inner,
            base: t.fields[inner].value,
            end: self.last.fields[inner].value,
        })
    }

    /// The confirmed rule, lexical first (a listing knows the exact names).
    pub fn rule(&self, cfg: &SemanticConfig) -> Option<Rule> {
        if self.lex_run >= cfg.min_run {
            Some(Rule::Lexical)
        } else if self.stride_run >= cfg.min_run {
            Some(Rule::Stride)
        } else {
            None
        }
    }

    /// The lane's next `k` files (steps 1..=k, nearest first, by the confirmed rule)
    /// into `out` (cleared first), less `current` and the files already pending: those
    /// would not be asked for again, so they cost neither a copy of their path nor a
    /// slot (this runs on every access of a confirmed lane, and most of the window is
    /// pending then).
    pub fn candidates_into(
        &self,
        k: u32,
        listing: &ListingIndex,
        cfg: &SemanticConfig,
        current: &str,
        out: &mut Vec<Candidate>,
    ) {
        out.clear();
        match self.rule(cfg) {
            None => {}
            Some(Rule::Lexical) => {
                let (Some(set), Some(m)) = (listing.set(&self.last.template), self.last_member)
                else {
                    return;
                };
                let r = set.rank(m);
                for step in 1..=k {
                    let Some(id) = set.at_rank(r + step as usize) else {
                        break;
                    };
                    let path = set.path(id);
                    if **path == *current || self.is_pending_arc(path) {
                        continue;
                    }
                    let size = set.size(id);
                    out.push(Candidate {
                        path: path.clone(),
                        size: (size > 0).then_some(size),
                        step,
                    });
                }
            }
            // Horizon: no further ahead than the run seen so far. A run of r steps is
            // evidence for about r more (an unlisted dataset's end is unknown; this keeps
            // the overshoot past the end of a short directory to about its length).
            Some(Rule::Stride) => {
                self.walk_stride(k.min(self.stride_run.max(1)), listing, current, out)
            }
        }
    }

    fn walk_stride(&self, k: u32, listing: &ListingIndex, current: &str, out: &mut Vec<Candidate>) {
        let Some(stride) = &self.stride else { return };
        let template = &self.last.template;
        let mut pos: Vec<i64> = self.last.fields.iter().map(|f| f.value).collect();
        // Buffers reused across steps (this runs on every access of a confirmed lane).
        let mut next: Vec<i64> = Vec::with_capacity(pos.len());
        let mut path = String::with_capacity(self.last.path.len() + 4);
        let mut step = 0;
        while step < k {
            step += 1;
            next.clear();
            next.extend(pos.iter().zip(stride).map(|(a, b)| a + b));
            // The listing's answer for `path` as rendered from `next`, when the rollover
            // test below already asked it and left `next` as it was (the same path and
            // the same answer as rendering and asking again).
            let mut known = None;
            // An `-of-N` load stops at N: the next checkpoint is another load.
            if let Some(r) = self.rollover.as_ref().filter(|_| self.bound.is_none()) {
                let past_end = next[r.inner] > r.end;
                path.clear();
                self.last.render_into(&mut path, &next, &self.pad);
                // `exists_and_size(..).0` is `exists(..)`.
                let found = listing.exists_and_size(template, &path);
                let exists = found.0;
                if exists == Some(false) || (past_end && exists.is_none()) {
                    next.clear();
                    next.extend_from_slice(&pos);
                    next[r.outer] += r.outer_step;
                    next[r.inner] = r.base;
                } else {
                    known = Some(found);
                }
            }
            if let Some((idx, max)) = self.bound {
                if next[idx] > max {
                    return;
                }
            }
            if next
                .iter()
                .zip(&self.last.fields)
                .any(|(v, f)| *v < 0 && f.kind == FieldKind::Number)
            {
                return;
            }
            let found = match known {
                Some(found) => found,
                None => {
                    path.clear();
                    self.last.render_into(&mut path, &next, &self.pad);
                    listing.exists_and_size(template, &path)
                }
            };
            match found {
                (Some(false), _) => return,
                (_, size) if path != current && !self.is_pending(&path) => out.push(Candidate {
                    size,
                    path: Arc::from(path.as_str()),
                    step,
                }),
                _ => {}
            }
            std::mem::swap(&mut pos, &mut next);
        }
    }

    /// Remembers an issued prediction for hit accounting (bounded).
    /// False when `path` was pending already.
    pub fn add_pending(&mut self, path: Arc<str>, cfg: &SemanticConfig) -> bool {
        let added = self.pending_set.insert(path.clone());
        if added {
            self.pending_ptrs.insert(arc_addr(&path));
            self.pending.push_back(path);
        }
        let cap = (cfg.max_depth as usize * 4).max(8);
        while self.pending.len() > cap {
            if let Some(p) = self.pending.pop_front() {
                self.pending_ptrs.remove(&arc_addr(&p));
                self.pending_set.remove(&p);
            }
        }
        added
    }
}

/// An `Arc`'s address: an identity for as long as the `Arc` is held.
fn arc_addr(path: &Arc<str>) -> usize {
    Arc::as_ptr(path) as *const u8 as usize
}

#[cfg(test)]
mod tests {
    use super::{deltas, deltas_into, only};
    use crate::semantic::tokenize::tokenize;

    proptest::proptest! {
        /// `deltas_into` gives what the collecting `deltas` it replaced in
        /// `Lane::observe` gave, into a buffer that held anything before.
        #[test]
        fn deltas_into_is_deltas(
            a in proptest::collection::vec((0u8..4, 0u32..40), 1..4),
            b in proptest::collection::vec((0u8..4, 0u32..40), 1..4),
            same_kinds in proptest::bool::ANY,
            junk in proptest::collection::vec(proptest::num::i64::ANY, 0..6),
        ) {
            // Numbers, padded numbers, opaque hashes and words, so kinds differ too.
            let name = |v: &[(u8, u32)]| -> String {
                v.iter()
                    .enumerate()
                    .map(|(i, &(k, x))| match k {
                        0 => format!("p{i}-{x}"),
                        1 => format!("q{i}-{x:05}"),
                        2 => format!("h{i}-9f8e7d6c5b4a3f2e1d0c{x:02x}"),
                        _ => format!("w{i}-abc"),
                    })
                    .collect::<Vec<_>>()
                    .join("/")
            };
            // Half the cases: `b` with `a`'s layout, so the fields line up.
            let b: Vec<(u8, u32)> = if same_kinds {
                a.iter().zip(b.iter().cycle()).map(|(&(k, _), &(_, x))| (k, x)).collect()
            } else {
                b
            };
            let (ta, tb) = (tokenize(&name(&a)), tokenize(&name(&b)));
            let mut out = junk;
            let ok = deltas_into(&ta, &tb, &mut out);
            match deltas(&ta, &tb) {
                Some(d) => {
                    proptest::prop_assert!(ok);
                    proptest::prop_assert_eq!(out, d);
                }
                None => proptest::prop_assert!(!ok),
            }
        }

        /// `only` is `let [i] = positions_of_true[..]`, what it replaced.
        #[test]
        fn only_is_the_single_true_position(flags in proptest::collection::vec(proptest::bool::ANY, 0..8)) {
            let positions: Vec<usize> = (0..flags.len()).filter(|&i| flags[i]).collect();
            let want = if let [i] = positions[..] { Some(i) } else { None };
            proptest::prop_assert_eq!(only(flags.iter().copied()), want);
        }
    }
}
