//! The KV routing planner of the cache group (issue 16): pure decisions, no I/O.
//!
//! Every key has candidates: its `R` owners in placement order, then the next node of
//! the placement (the one that becomes an owner when one of the `R` leaves). The
//! planner decides whom to ask about which key, batched per node, and what the
//! answers mean; the router (`group.rs`) does the asking.
//!
//! - [`Lookup`]: Get, Exists, MatchPrefix, EstimateLoad. A round asks each unresolved
//!   key's next candidate, one batch per node. A key is found at the first candidate
//!   that has it; it is missing once every candidate was asked: a Put that found an
//!   owner down (or recently failed) left its copy on the next candidate, and stopping
//!   after `R` owners said no made such an acknowledged block unreadable from every
//!   node but that one, for good (black-box finding: 14 of 60 blocks put while one
//!   owner was frozen and another killed). A miss costs one more round for it. A
//!   candidate that failed (down, timed out) does
//!   not count as a "no": the key goes to its next candidate, so one node down costs a
//!   round, never a block. In prefix mode (MatchPrefix over a chain) only keys before
//!   the first missing one are still asked: what follows a miss cannot match.
//! - [`Replicate`]: Put. The first `R` candidates store the block; one that fails is
//!   replaced by the next candidate, so with a node down (still in the membership until
//!   its lease runs out) an acknowledged block still sits on `R` live nodes.
//! - [`demote_suspects`]: nodes that failed recently are tried after the others.

use std::collections::BTreeMap;

/// A node in a request's node table (an index: the planner never sees addresses).
pub type NodeIdx = usize;

/// What a candidate said about a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Hit,
    Miss,
    /// Down, timed out, refused: says nothing about the key.
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyState {
    Pending,
    Found(NodeIdx),
    Missing,
}

/// The lookup of a batch of keys across their candidates.
#[derive(Clone, Debug)]
pub struct Lookup {
    candidates: Vec<Vec<NodeIdx>>,
    prefix: bool,
    /// Next candidate to ask, per key.
    cursor: Vec<usize>,
    /// Asked in the current round and not answered yet, per key.
    asked: Vec<bool>,
    state: Vec<KeyState>,
}

impl Lookup {
    /// `candidates[i]`: key i's candidates, best first. `prefix`: a chain, where only
    /// the leading found keys matter.
    pub fn new(candidates: Vec<Vec<NodeIdx>>, prefix: bool) -> Lookup {
        let n = candidates.len();
        let mut l = Lookup {
            candidates,
            prefix,
            cursor: vec![0; n],
            asked: vec![false; n],
            state: vec![KeyState::Pending; n],
        };
        for i in 0..n {
            l.settle(i);
        }
        l
    }

    /// Records what was already known before any round (the local node's answer,
    /// which costs nothing to get): a hit resolves the key; anything else leaves it
    /// to its candidates (a "no" from a node that is not a candidate proves nothing).
    pub fn known_hit(&mut self, key: usize, node: NodeIdx) {
        if self.state[key] == KeyState::Pending {
            self.state[key] = KeyState::Found(node);
        }
    }

    /// The next round: for each node, the keys to ask it (in key order), nodes in
    /// index order. Empty when every key that matters is resolved.
    pub fn next_round(&mut self) -> Vec<(NodeIdx, Vec<usize>)> {
        let limit = self.relevant_len();
        let mut by_node: BTreeMap<NodeIdx, Vec<usize>> = BTreeMap::new();
        for i in 0..limit {
            if self.state[i] != KeyState::Pending || self.asked[i] {
                continue;
            }
            let node = self.candidates[i][self.cursor[i]];
            self.cursor[i] += 1;
            self.asked[i] = true;
            by_node.entry(node).or_default().push(i);
        }
        by_node.into_iter().collect()
    }

    /// Records `node`'s answer about `key` (asked in the current round).
    pub fn answer(&mut self, key: usize, node: NodeIdx, answer: Answer) {
        if !std::mem::take(&mut self.asked[key]) || self.state[key] != KeyState::Pending {
            return;
        }
        match answer {
            Answer::Hit => self.state[key] = KeyState::Found(node),
            Answer::Miss | Answer::Failed => self.settle(key),
        }
    }

    /// Missing once every candidate was asked (see the module doc).
    fn settle(&mut self, key: usize) {
        if self.state[key] == KeyState::Pending && self.cursor[key] >= self.candidates[key].len() {
            self.state[key] = KeyState::Missing;
        }
    }

    /// Keys that still matter: all of them, or in prefix mode those before the first
    /// missing one.
    fn relevant_len(&self) -> usize {
        if self.prefix {
            self.state
                .iter()
                .position(|s| *s == KeyState::Missing)
                .unwrap_or(self.state.len())
        } else {
            self.state.len()
        }
    }

    /// Every key that matters is resolved.
    pub fn done(&self) -> bool {
        self.state[..self.relevant_len()]
            .iter()
            .all(|s| *s != KeyState::Pending)
    }

    pub fn state(&self, key: usize) -> KeyState {
        self.state[key]
    }

    /// Leading keys found (MatchPrefix), meaningful once [`Lookup::done`].
    pub fn matched(&self) -> usize {
        self.state
            .iter()
            .take_while(|s| matches!(s, KeyState::Found(_)))
            .count()
    }
}

/// Where a Put's copies go.
#[derive(Clone, Debug)]
pub struct Replicate {
    candidates: Vec<NodeIdx>,
    replication: usize,
    next: usize,
    stored: Vec<NodeIdx>,
    failed: Vec<NodeIdx>,
}

impl Replicate {
    pub fn new(candidates: Vec<NodeIdx>, replication: usize) -> Replicate {
        Replicate {
            candidates,
            replication: replication.max(1),
            next: 0,
            stored: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// The first targets: the first `R` candidates (fewer in a smaller group).
    pub fn initial(&mut self) -> Vec<NodeIdx> {
        let n = self.replication.min(self.candidates.len());
        self.next = n;
        self.candidates[..n].to_vec()
    }

    /// Records a target's outcome; a failed one is replaced by the next candidate, if
    /// any (returned: send it the block too).
    pub fn outcome(&mut self, node: NodeIdx, stored: bool) -> Option<NodeIdx> {
        if stored {
            self.stored.push(node);
            return None;
        }
        self.failed.push(node);
        let sub = self.candidates.get(self.next).copied();
        if sub.is_some() {
            self.next += 1;
        }
        sub
    }

    /// Nodes that stored the block.
    pub fn stored(&self) -> &[NodeIdx] {
        &self.stored
    }

    /// Fewer than `R` copies landed although the group has `R` nodes.
    pub fn under_replicated(&self) -> bool {
        self.stored.len() < self.replication.min(self.candidates.len())
    }
}

/// `candidates` with the nodes `suspect` names (failed recently) moved to the end,
/// each group keeping placement order: a read goes to a live owner first, and a dead
/// one is still tried last rather than never (it may be back).
pub fn demote_suspects(candidates: &mut [NodeIdx], suspect: impl Fn(NodeIdx) -> bool) {
    // A stable sort on one boolean is a stable partition.
    candidates.sort_by_key(|n| suspect(*n));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A group of `nodes` nodes where `has[n][k]` says node n holds key k and `down[n]`
    /// that it does not answer; every key's candidates are a permutation prefix.
    #[derive(Debug, Clone)]
    struct World {
        has: Vec<Vec<bool>>,
        down: Vec<bool>,
        candidates: Vec<Vec<NodeIdx>>,
        replication: usize,
    }

    fn world() -> impl Strategy<Value = World> {
        (2usize..7, 1usize..4, 1usize..40).prop_flat_map(|(nodes, r, keys)| {
            let cand = proptest::sample::subsequence((0..nodes).collect::<Vec<_>>(), 1..=nodes)
                .prop_shuffle();
            (
                proptest::collection::vec(proptest::collection::vec(any::<bool>(), keys), nodes),
                proptest::collection::vec(proptest::bool::weighted(0.25), nodes),
                proptest::collection::vec(cand, keys),
                Just(r),
            )
                .prop_map(|(has, down, candidates, replication)| World {
                    has,
                    down,
                    // R owners plus the next node, as the router asks.
                    candidates: candidates
                        .into_iter()
                        .map(|mut c| {
                            c.truncate(replication + 1);
                            c
                        })
                        .collect(),
                    replication,
                })
        })
    }

    impl World {
        fn ask(&self, node: NodeIdx, key: usize) -> Answer {
            if self.down[node] {
                Answer::Failed
            } else if self.has[node][key] {
                Answer::Hit
            } else {
                Answer::Miss
            }
        }

        /// Whether a key can be found: some live candidate has it.
        fn findable(&self, key: usize) -> bool {
            self.candidates[key]
                .iter()
                .any(|&n| self.ask(n, key) == Answer::Hit)
        }

        fn run(&self, prefix: bool) -> (Lookup, usize) {
            let mut l = Lookup::new(self.candidates.clone(), prefix);
            let mut rounds = 0;
            while !l.done() {
                let round = l.next_round();
                assert!(!round.is_empty(), "not done but nothing to ask");
                let mut nodes: Vec<_> = round.iter().map(|(n, _)| *n).collect();
                nodes.dedup();
                assert_eq!(nodes.len(), round.len(), "one batch per node per round");
                for (node, keys) in round {
                    for k in keys {
                        assert!(self.candidates[k].contains(&node), "asked a non-candidate");
                        l.answer(k, node, self.ask(node, k));
                    }
                }
                rounds += 1;
            }
            (l, rounds)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Every key ends found (at a live node that has it) or missing exactly when
        /// the walk over its candidates finds it; at most R+1 rounds.
        #[test]
        fn lookups_find_what_live_candidates_hold(w in world()) {
            let (l, rounds) = w.run(false);
            prop_assert!(rounds <= w.replication + 1);
            for k in 0..w.candidates.len() {
                match l.state(k) {
                    KeyState::Found(n) => {
                        prop_assert!(!w.down[n] && w.has[n][k]);
                        prop_assert!(w.findable(k));
                    }
                    KeyState::Missing => prop_assert!(!w.findable(k)),
                    KeyState::Pending => prop_assert!(false, "pending after done"),
                }
            }
        }

        /// MatchPrefix across owners: the longest run of leading findable keys, and no
        /// key past the first missing one is ever asked twice... or needlessly.
        #[test]
        fn prefix_lookups_match_the_longest_findable_run(w in world()) {
            let (l, _) = w.run(true);
            let want = (0..w.candidates.len()).take_while(|k| w.findable(*k)).count();
            prop_assert_eq!(l.matched(), want);
        }

        /// A put lands on R live nodes whenever R of its candidates are live, and never
        /// on a down one.
        #[test]
        fn puts_land_on_r_live_candidates(w in world()) {
            for c in &w.candidates {
                let mut p = Replicate::new(c.clone(), w.replication);
                let mut queue = p.initial();
                prop_assert_eq!(queue.len(), w.replication.min(c.len()));
                while let Some(n) = queue.pop() {
                    if let Some(sub) = p.outcome(n, !w.down[n]) {
                        queue.push(sub);
                    }
                }
                let live = c.iter().filter(|n| !w.down[**n]).count();
                prop_assert_eq!(p.stored().len(), live.min(w.replication));
                prop_assert!(p.stored().iter().all(|n| !w.down[*n]));
                prop_assert_eq!(p.under_replicated(), live < w.replication.min(c.len()));
            }
        }

        /// Suspects go last; the others and the suspects each keep their order.
        #[test]
        fn suspects_are_tried_last_in_order(mut c in Just((0..8).collect::<Vec<_>>()).prop_shuffle(), mask in any::<u8>()) {
            let orig = c.clone();
            let sus = |n: NodeIdx| mask & (1 << n) != 0;
            demote_suspects(&mut c, sus);
            let want: Vec<_> = orig.iter().copied().filter(|n| !sus(*n))
                .chain(orig.iter().copied().filter(|n| sus(*n))).collect();
            prop_assert_eq!(c, want);
        }
    }

    #[test]
    fn a_local_hit_is_not_asked_again_and_a_miss_asks_every_candidate() {
        // Key 0 found locally; key 1's two owners say no: the third candidate is asked
        // too (a put that found an owner down left its copy there), and has it.
        let mut l = Lookup::new(vec![vec![1, 2, 0], vec![1, 2, 0]], false);
        l.known_hit(0, 0);
        let r = l.next_round();
        assert_eq!(r, vec![(1, vec![1])]);
        l.answer(1, 1, Answer::Miss);
        assert_eq!(l.next_round(), vec![(2, vec![1])]);
        l.answer(1, 2, Answer::Miss);
        assert!(!l.done(), "two owners said no; the spare is asked");
        assert_eq!(l.next_round(), vec![(0, vec![1])]);
        l.answer(1, 0, Answer::Hit);
        assert!(l.done());
        assert_eq!(l.state(1), KeyState::Found(0));
        assert_eq!(l.state(0), KeyState::Found(0));
    }

    #[test]
    fn a_failed_owner_sends_its_keys_to_the_next_candidate_in_one_batch() {
        let mut l = Lookup::new(vec![vec![0, 1, 2]; 4], true);
        let r = l.next_round();
        assert_eq!(r, vec![(0, vec![0, 1, 2, 3])]);
        for k in 0..4 {
            l.answer(k, 0, Answer::Failed);
        }
        assert_eq!(l.next_round(), vec![(1, vec![0, 1, 2, 3])]);
        l.answer(0, 1, Answer::Hit);
        l.answer(1, 1, Answer::Hit);
        l.answer(2, 1, Answer::Miss);
        l.answer(3, 1, Answer::Hit);
        // Key 2 has one "no" (node 0 failed): its third candidate decides; key 3 waits.
        assert_eq!(l.next_round(), vec![(2, vec![2])]);
        l.answer(2, 2, Answer::Miss);
        assert!(l.done());
        assert_eq!(l.matched(), 2);
    }
}
