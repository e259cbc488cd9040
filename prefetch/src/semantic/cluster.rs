//! Clustering the interleaved request stream into coherent streams.
//!
//! First level: `(job, template)`. Jobs are never merged (a job is a reader: process,
//! handle or trace column), and within a job, files of different templates (images and
//! their JSON sidecars, shards and index files) are different streams.
//!
//! Second level: *lanes* inside a stream, for tenants that share a job id and a
//! template but walk different ranges (four data-loader workers reading shards
//! 0.., 1000.., 2000.., 3000.. through one mount handle). An access joins, in order:
//! the lane that predicted it; the lane whose stride it continues exactly; the nearest
//! lane (L1 distance over fields) within `lane_gap`; else it opens a new lane, replacing
//! the least recently used one beyond `max_lanes`.
//!
//! Streams are bounded by `max_streams`, least recently used evicted first, so hash- or
//! randomly-named workloads cannot grow the table without bound.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use strata_types::{FxBuild, JobId};

use super::permutation::SetTracker;
use super::regularity::Lane;
use super::tokenize::TokenizedPath;
use super::SemanticConfig;

pub type ClusterKey = (JobId, Arc<str>);

/// Files per stream whose re-accesses are not news: 8 covers readers that interleave a
/// few open files (a parquet reader fetching footers, then column chunks, of several
/// files), whose chunk reads would otherwise look like a stride breaking.
pub const RECENT_FILES: usize = 8;

#[derive(Debug)]
pub struct PathCluster {
    pub lanes: Vec<Lane>,
    pub set: Option<SetTracker>,
    /// Files read last (most recent at the back), at most [`RECENT_FILES`].
    recent: VecDeque<Arc<str>>,
    /// Its place in [`ClusterTable`]'s LRU order: the sequence number of a touch, not
    /// necessarily the latest (touches of the most recent stream leave it).
    pub last_seq: u64,
    /// Sum and count of file sizes seen (for pool byte budgets).
    pub size_sum: u64,
    pub size_n: u64,
}

impl PathCluster {
    fn new() -> Self {
        PathCluster {
            lanes: Vec::new(),
            set: None,
            recent: VecDeque::new(),
            last_seq: 0,
            size_sum: 0,
            size_n: 0,
        }
    }

    /// Records a read of `path`; false when it was one of the last [`RECENT_FILES`]
    /// files (a later chunk of a file being read).
    pub fn note_file(&mut self, path: &Arc<str>) -> bool {
        // Pointer first: a file's chunk reads usually carry the same `Arc`.
        if self
            .recent
            .iter()
            .any(|p| Arc::ptr_eq(p, path) || p == path)
        {
            return false;
        }
        if self.recent.len() >= RECENT_FILES {
            self.recent.pop_front();
        }
        self.recent.push_back(path.clone());
        true
    }

    /// Lane index for `t`, or `None` when a new lane should be opened.
    pub fn assign(&self, t: &TokenizedPath, cfg: &SemanticConfig) -> Option<usize> {
        if let Some(i) = self.lanes.iter().position(|l| l.is_pending(&t.path)) {
            return Some(i);
        }
        if let Some(i) = self.lanes.iter().position(|l| l.continues(t)) {
            return Some(i);
        }
        self.lanes
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.distance(t).map(|d| (d, l.last_seq, i)))
            .filter(|(d, _, _)| *d <= cfg.lane_gap)
            // Nearest, then most recent: deterministic tie-break.
            .min_by_key(|(d, seq, _)| (*d, std::cmp::Reverse(*seq)))
            .map(|(_, _, i)| i)
    }

    /// Index of the slot for a new lane (appended, or the LRU lane replaced).
    pub fn open_lane(&mut self, lane: Lane, cfg: &SemanticConfig) -> usize {
        if self.lanes.len() < cfg.max_lanes.max(1) {
            self.lanes.push(lane);
            return self.lanes.len() - 1;
        }
        let i = self
            .lanes
            .iter()
            .enumerate()
            .min_by_key(|(_, l)| l.last_seq)
            .map_or(0, |(i, _)| i);
        self.lanes[i] = lane;
        i
    }

    pub fn avg_size(&self) -> u64 {
        self.size_sum.checked_div(self.size_n).unwrap_or(0)
    }
}

/// `(job, template)` -> the cluster of requests it names (the semantic predictor's
/// "stream", not an access stream of the cache core's tracker), LRU-bounded.
#[derive(Debug, Default)]
pub struct ClusterTable {
    /// Key -> its stream's index in `slots`.
    index: HashMap<ClusterKey, usize, FxBuild>,
    /// The streams, dense (an eviction moves the last one into the hole).
    slots: Vec<(ClusterKey, PathCluster)>,
    /// last_seq -> key, for LRU eviction.
    lru: BTreeMap<u64, ClusterKey>,
    /// Slot of the stream touched last.
    last: Option<usize>,
}

impl ClusterTable {
    /// The stream for `key`, created (evicting the LRU stream beyond `max`) if needed,
    /// and touched at `seq` (sequence numbers must increase).
    ///
    /// A touch of the most recently touched stream (one reader of one template: every
    /// access) changes no stream's rank in the LRU order, so it leaves the order as it
    /// is instead of moving the stream's entry from its previous number to `seq` (a
    /// B-tree remove and insert per access). Eviction takes the same stream either way.
    /// That stream is found by comparing `key` with the last one touched (its template
    /// `Arc` by pointer first), without hashing the template.
    pub fn touch(&mut self, key: &ClusterKey, seq: u64, max: usize) -> &mut PathCluster {
        // The stream touched last holds the newest number in `lru` (a touch that moves a
        // stream gives it `seq`, larger than all; one that does not leaves the newest
        // as it is), so a touch of it again is the "not moved" case below.
        let again = self.last.filter(|&i| {
            let (k, _) = &self.slots[i];
            k.0 == key.0 && (Arc::ptr_eq(&k.1, &key.1) || k.1 == key.1)
        });
        if let Some(i) = again {
            return &mut self.slots[i].1;
        }
        let newest = self.lru.last_key_value().map(|(&k, _)| k);
        let i = match self.index.get(key).copied() {
            Some(i) => {
                let last = self.slots[i].1.last_seq;
                if Some(last) != newest {
                    self.lru.remove(&last);
                    self.lru.insert(seq, key.clone());
                    self.slots[i].1.last_seq = seq;
                }
                i
            }
            None => {
                while self.index.len() >= max.max(1) {
                    let Some((_, old)) = self.lru.pop_first() else {
                        break;
                    };
                    self.evict(&old);
                }
                self.lru.insert(seq, key.clone());
                let mut s = PathCluster::new();
                s.last_seq = seq;
                self.slots.push((key.clone(), s));
                let i = self.slots.len() - 1;
                self.index.insert(key.clone(), i);
                i
            }
        };
        self.last = Some(i);
        &mut self.slots[i].1
    }

    /// Drops `key`'s stream; the last slot moves into its place.
    fn evict(&mut self, key: &ClusterKey) {
        let Some(i) = self.index.remove(key) else {
            return;
        };
        let moved = self.slots.len() - 1;
        self.slots.swap_remove(i);
        if i < self.slots.len() {
            if let Some(j) = self.index.get_mut(&self.slots[i].0) {
                *j = i;
            }
        }
        self.last = match self.last {
            Some(l) if l == i => None,
            Some(l) if l == moved => Some(i),
            l => l,
        };
    }

    pub fn get_mut(&mut self, key: &ClusterKey) -> Option<&mut PathCluster> {
        let i = *self.index.get(key)?;
        Some(&mut self.slots[i].1)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_table_is_lru_bounded() {
        let mut t = ClusterTable::default();
        for i in 0..100u64 {
            let key = (JobId(i % 7), Arc::from(format!("t{i}")));
            t.touch(&key, i + 1, 10);
        }
        assert_eq!(t.len(), 10);
        // The most recent survive.
        assert!(t.get_mut(&(JobId(99 % 7), Arc::from("t99"))).is_some());
        assert!(t.get_mut(&(JobId(0), Arc::from("t0"))).is_none());
    }

    /// The next value of a 64-bit LCG (Knuth's MMIX constants): reproducible test draws.
    fn lcg_next(x: u64) -> u64 {
        x.wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
    }

    /// The table keeps exactly the `max` most recently touched streams, with runs of
    /// touches of one stream (which leave the LRU order alone) among them.
    #[test]
    fn stream_table_keeps_the_most_recently_touched() {
        let mut t = ClusterTable::default();
        let mut model: Vec<u64> = Vec::new(); // most recent last
        let mut x = 7u64;
        for seq in 1..3000u64 {
            x = lcg_next(x);
            // Runs: often the same stream again, else one of 12.
            let id = if (x >> 60) < 9 {
                model.last().copied().unwrap_or(0)
            } else {
                (x >> 33) % 12
            };
            let key = (JobId(id), Arc::from("t"));
            t.touch(&key, seq, 5);
            model.retain(|&m| m != id);
            model.push(id);
            if model.len() > 5 {
                model.remove(0);
            }
            assert_eq!(t.len(), model.len());
            for m in &model {
                assert!(
                    t.get_mut(&(JobId(*m), Arc::from("t"))).is_some(),
                    "{m} at {seq}"
                );
            }
        }
    }

    /// Evictions move streams between slots: every key still finds its own stream
    /// (marked with its id), through `touch` and `get_mut`.
    #[test]
    fn streams_stay_with_their_keys_across_evictions() {
        let mut t = ClusterTable::default();
        let mut x = 11u64;
        for seq in 1..4000u64 {
            x = lcg_next(x);
            let id = if (x >> 61) < 5 {
                seq % 3
            } else {
                (x >> 33) % 40
            };
            let key = (JobId(id % 4), Arc::from(format!("t{id}")));
            let s = t.touch(&key, seq, 16);
            if s.size_n == 0 {
                s.size_n = id + 1;
            }
            assert_eq!(s.size_n, id + 1, "touch {id} at {seq}");
            let again = t.get_mut(&key).map(|s| s.size_n);
            assert_eq!(again, Some(id + 1), "get_mut {id} at {seq}");
            assert!(t.len() <= 16);
        }
    }

    #[test]
    fn recent_files_are_not_news() {
        let mut s = PathCluster::new();
        let a: Arc<str> = Arc::from("a");
        assert!(s.note_file(&a));
        assert!(!s.note_file(&a));
        for i in 0..RECENT_FILES {
            assert!(s.note_file(&Arc::from(format!("x{i}"))));
        }
        assert!(s.note_file(&a), "forgotten after RECENT_FILES others");
    }
}
