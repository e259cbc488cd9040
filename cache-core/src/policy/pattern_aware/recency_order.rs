//! The recency order the recency guard evicts in while it overrides the policy, and the
//! sparing of a starved job (module docs of `pattern_aware`, "A bound on losing to LRU").

use super::*;

impl PatternAwarePolicy {
    /// Slot `id` was just read or inserted: the youngest in `recent`.
    pub(super) fn touch_recent(&mut self, id: u32) {
        if self.guard.is_none() {
            return;
        }
        let seq = self.next_seq();
        if !self.recent_built {
            self.slots[id as usize].recent.0 = seq;
            return;
        }
        let (old, pos) = self.slots[id as usize].recent;
        self.recent.remove_at(&old, pos);
        let pos = self.recent.insert(seq, id);
        self.slots[id as usize].recent = (seq, pos);
    }

    /// The least recently read or inserted resident, for a recency period: the queue is
    /// built from the slots' sequence numbers when the period begins and dropped when
    /// it ends.
    pub(super) fn least_recent(&mut self, in_period: bool, keep: bool) -> Option<u32> {
        if !in_period && !keep {
            if self.recent_built {
                self.recent = SeqQueue::default();
                self.recent_built = false;
            }
            return None;
        }
        if !self.recent_built {
            let mut live: Vec<(u64, u32)> = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.key.is_some())
                .map(|(id, s)| (s.recent.0, id as u32))
                .collect();
            live.sort_unstable();
            for (seq, id) in live {
                let pos = self.recent.insert(seq, id);
                self.slots[id as usize].recent.1 = pos;
            }
            self.recent_built = true;
        }
        if !in_period {
            return None;
        }
        self.recent.first_key_value().map(|(_, &k)| k)
    }

    /// `k`, unless the job that read it last is one the guard spares
    /// (`spare_starved_jobs`): then the least recently read resident of a job not
    /// spared (among the [`Self::SPARE_SEARCH`] oldest), not the policy's choice (its
    /// ghosts learn nothing from it).
    pub(super) fn spare_starved(&mut self, k: u32) -> u32 {
        let Some(g) = self.guard.as_ref() else {
            return k;
        };
        if !g.spares(self.slots[k as usize].e.reader) {
            return k;
        }
        let other = self
            .recent
            .values()
            .take(Self::SPARE_SEARCH)
            .copied()
            .find(|&id| !g.spares(self.slots[id as usize].e.reader));
        match other {
            Some(o) => {
                self.last_victim = None;
                self.spared_victims += 1;
                o
            }
            None => k,
        }
    }
}
