//! Recent answer times of one peer: the hedges of the file peer path (`strata-cluster`)
//! and of the KV group (`strata-kvcache`) both take their delay from its quantiles.

use std::collections::VecDeque;
use std::time::Duration;

/// The last `cap` answer times of one peer.
#[derive(Clone, Debug)]
pub struct LatencyWindow {
    samples: VecDeque<Duration>,
    cap: usize,
}

impl LatencyWindow {
    /// 256 answers: a p99 over a window that follows a change within seconds of load.
    pub const DEFAULT_CAP: usize = 256;

    pub fn new(cap: usize) -> Self {
        LatencyWindow {
            samples: VecDeque::with_capacity(cap.max(1)),
            cap: cap.max(1),
        }
    }

    pub fn observe(&mut self, d: Duration) {
        if self.samples.len() == self.cap {
            self.samples.pop_front();
        }
        self.samples.push_back(d);
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `q` quantile (nearest rank) of the window; None when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut v: Vec<Duration> = self.samples.iter().copied().collect();
        v.sort_unstable();
        let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
        Some(v[rank - 1])
    }
}

impl Default for LatencyWindow {
    fn default() -> Self {
        LatencyWindow::new(Self::DEFAULT_CAP)
    }
}
