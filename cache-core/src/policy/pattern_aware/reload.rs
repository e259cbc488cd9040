//! The reload ghost: a file re-read whole at a distance of its size, beyond the consumed
//! queue's probe (module docs of `pattern_aware`, "Evict-behind only when it is behind").

use super::*;

impl PatternAwarePolicy {
    /// Whether a demand miss on `h` re-reads, in a stream sequential at the block level,
    /// a block the scan queue `consumed` let go while an LRU of this capacity would still
    /// hold it: fewer than a capacity of bytes were read (`touched`) since its last read
    /// (`reload_ghost`). The entry is used up either way. Random streams and streams
    /// sequential only across files (one-block chunk files) are left to the marginal
    /// probe: a shuffled epoch re-reads a few blocks within a capacity by chance, and
    /// counted with a whole capacity of reach they took the stable subset's space (the
    /// module docs, "Evict-behind only when it is behind"); measured, docs/BENCHMARKS.md
    /// "A file re-read whole".
    pub(super) fn reload_ghost_hit(&mut self, h: u64, obs: &Observation) -> bool {
        if !self.cfg.reload_ghost || self.reload.is_empty() {
            return false;
        }
        let Some((touch, _)) = self.reload.remove(&h) else {
            return false;
        };
        obs.retention() == Pattern::Sequential
            && obs.blocks == Pattern::Sequential
            && self.cap > 0
            && self.touched.saturating_sub(touch) <= self.cap
    }

    /// A reload ghost hit: scan data is re-read, and a larger scan queue would have
    /// kept it (the consumed ghost's evidence, with the whole capacity's reach).
    pub(super) fn reload_evidence(&mut self, size: u64) {
        self.reload_hits += 1;
        self.scan_reuse_seen = true;
        self.consumed_hit_evidence(size, true);
    }

    /// A scan miss of `job` that the reload ghost knew (`hit`, with `size` the bytes it
    /// may count) or did not: hits count once `reload_run` of them came in a row.
    /// Returns whether this miss's bytes counted.
    pub(super) fn reload_observed(&mut self, job: u64, size: u64, hit: bool) -> bool {
        if !hit {
            if self.reload_run_job == Some(job) {
                self.reload_run = 0;
                self.reload_run_bytes = 0;
            }
            return false;
        }
        if self.reload_run_job != Some(job) {
            self.reload_run_job = Some(job);
            self.reload_run = 0;
            self.reload_run_bytes = 0;
        }
        self.reload_run += 1;
        self.reload_run_bytes += size;
        if self.reload_run < self.cfg.reload_run.max(1) {
            return false;
        }
        let b = std::mem::take(&mut self.reload_run_bytes);
        if b > 0 {
            self.reload_evidence(b);
        }
        size > 0
    }

    /// Remembers a victim of `consumed` read last at `touch`, up to a capacity of bytes
    /// of such victims and no more entries than the cache holds items (ARC's bound on
    /// its recency ghost; at least the newest, and 64).
    pub(super) fn push_reload(&mut self, h: u64, size: u64, touch: u64) {
        self.reload_seq += 1;
        let seq = self.reload_seq;
        self.reload.insert(h, (touch, seq));
        self.reload_fifo.push_back((h, size, seq));
        self.reload_bytes += size;
        let max_len = self.entries.len().max(64);
        while (self.reload_bytes > self.cap || self.reload_fifo.len() > max_len)
            && self.reload_fifo.len() > 1
        {
            let Some((gh, gs, gseq)) = self.reload_fifo.pop_front() else {
                break;
            };
            self.reload_bytes -= gs;
            if self.reload.get(&gh).is_some_and(|&(_, s)| s == gseq) {
                self.reload.remove(&gh);
            }
        }
    }
}
