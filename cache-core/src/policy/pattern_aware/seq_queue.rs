//! [`SeqQueue`]: the pools' queue ordered by sequence number.

use std::collections::VecDeque;

/// A pool ordered by sequence number alone (`consumed`, `ahead`, `window`): the same
/// answers as a `BTreeMap<u64, V>` for the operations the policy uses (insert, remove
/// by key, the first entry, the entries in order, emptiness), at a fraction of its cost.
/// These pools only ever insert a fresh sequence number (`next_seq`, larger than every
/// one before), so their order is insertion order: a deque sorted by sequence number,
/// where a removal is a binary search and leaves a hole (the slot's value taken), holes
/// at the front are popped at once (so the first slot is always a live entry) and the
/// deque is compacted when holes outnumber the live entries. A hit in `consumed` or
/// `window` (a remove and an insert at the young end) was two B-tree updates moving
/// 64-byte keys within their nodes: ~10% of a replay's instructions on the generator's
/// shard and preprocessing traces. An insert that is not the largest (never made by the
/// policy) is still placed in order, so the map semantics hold for any sequence.
#[derive(Debug)]
pub(super) struct SeqQueue<V> {
    pub(super) slots: VecDeque<(u64, Option<V>)>,
    live: usize,
    /// Slots popped from the front so far: `base + i` names slot `i` until the next
    /// compaction or insert below the largest. `insert` returns that name and
    /// `remove_at` tries it first (the slot is the one when it holds the sequence
    /// number, which is unique), so the policy's removals skip the binary search
    /// (its probes were cache misses in a queue of thousands).
    base: u64,
}

impl<V> Default for SeqQueue<V> {
    fn default() -> Self {
        SeqQueue {
            slots: VecDeque::new(),
            live: 0,
            base: 0,
        }
    }
}

impl<V> SeqQueue<V> {
    /// `BTreeMap::insert` (a value already under `seq` is replaced); returns the
    /// slot's position hint for [`Self::remove_at`].
    pub(super) fn insert(&mut self, seq: u64, v: V) -> u64 {
        let at = match self.slots.back() {
            Some(&(last, _)) if last >= seq => {
                let at = self.slots.partition_point(|(s, _)| *s < seq);
                match self.slots.get_mut(at) {
                    Some((s, slot)) if *s == seq => {
                        if slot.replace(v).is_none() {
                            self.live += 1;
                        }
                    }
                    _ => {
                        self.slots.insert(at, (seq, Some(v)));
                        self.live += 1;
                    }
                }
                at
            }
            _ => {
                self.slots.push_back((seq, Some(v)));
                self.live += 1;
                self.slots.len() - 1
            }
        };
        self.base + at as u64
    }

    /// `BTreeMap::remove`.
    #[cfg(test)]
    pub(super) fn remove(&mut self, seq: &u64) -> Option<V> {
        self.remove_at(seq, u64::MAX)
    }

    /// `BTreeMap::remove`, looking first at the slot `insert` named `hint` (any value
    /// is safe: a slot that does not hold `seq` sends it to the binary search).
    pub(super) fn remove_at(&mut self, seq: &u64, hint: u64) -> Option<V> {
        let guess = hint
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| self.slots.get(i).is_some_and(|(s, _)| s == seq));
        let at = guess.unwrap_or_else(|| self.slots.partition_point(|(s, _)| s < seq));
        let v = match self.slots.get_mut(at) {
            Some((s, slot)) if s == seq => slot.take()?,
            _ => return None,
        };
        self.live -= 1;
        while matches!(self.slots.front(), Some((_, None))) {
            self.slots.pop_front();
            self.base += 1;
        }
        if self.slots.len() > 2 * self.live + 32 {
            self.slots.retain(|(_, v)| v.is_some());
        }
        Some(v)
    }

    /// `BTreeMap::first_key_value` (the front slot is live whenever there is one).
    pub(super) fn first_key_value(&self) -> Option<(&u64, &V)> {
        self.slots
            .front()
            .and_then(|(s, v)| v.as_ref().map(|v| (s, v)))
    }

    /// `BTreeMap::pop_first`: the oldest entry, taken out.
    pub(super) fn pop_first(&mut self) -> Option<(u64, V)> {
        let seq = *self.first_key_value()?.0;
        self.remove_at(&seq, self.base).map(|v| (seq, v))
    }

    /// `BTreeMap::values`: live values in sequence order.
    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.slots.iter().filter_map(|(_, v)| v.as_ref())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.live == 0
    }
}
