//! Staging: the KV `Prefetch` RPC (an engine asks for blocks to be moved into the
//! fastest tier before it reads them) decided and accounted by the daemon's
//! [`AccessController`], the same pure logic that decides the mount's prefetches and
//! that the replay simulator drives.
//!
//! The controller here has no predictors (the client says what it wants): it gives the
//! staging its backlog bound (bytes being moved up at once; the rest is deferred, for
//! the client to ask again, rather than queued behind a slow disk), the single-flight
//! of outstanding blocks (a block already being staged is not staged twice), and the
//! ledger of outcomes: a staged block later read by a Get is `used`, one that left the
//! fastest tier unread is `wasted` (found by the controller's sweep, a few outstanding
//! blocks checked per Get), so `strata stats` can say whether clients stage what they
//! read.
//!
//! `Prefetch` is asynchronous: it answers at once and the staging runs in the
//! background, so an engine overlaps the move with its own work (CALVO: the load is its
//! own stage). A Get of a block being staged waits for that staging ([`Staging::wait`])
//! rather than reading the lower tier a second time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strata_cache_core::{CacheKey, JobId};
use strata_prefetch::{
    AccessController, AccessEvent, Admission, ControllerConfig, Origin, PrefetchOrder,
};

/// Bytes being staged at once: 256 MiB, about 100 ms of a fast NVMe's reads (the
/// lower tier a staged block comes from), so a burst of Prefetch calls cannot occupy
/// the disk for longer than a prefill step takes.
pub const STAGING_BACKLOG_BYTES: u64 = 256 << 20;

/// What became of staged blocks. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StagingStats {
    /// Blocks staged and read by a Get afterwards.
    pub used: u64,
    /// Blocks staged that left the fastest tier unread.
    pub wasted: u64,
    /// Blocks not staged because the staging backlog was full.
    pub deferred: u64,
}

/// The KV service's staging controller.
pub struct Staging {
    controller: Mutex<AccessController<CacheKey>>,
    used: AtomicU64,
    wasted: AtomicU64,
    deferred: AtomicU64,
    /// Stagings in flight: a Get of one waits on its channel (true once done).
    in_flight: Mutex<HashMap<CacheKey, tokio::sync::watch::Receiver<bool>>>,
}

/// One staging in flight (from [`Staging::begin`]); dropping it, however the staging
/// ended, wakes the Gets waiting for the block.
pub struct InFlight<'a> {
    staging: &'a Staging,
    key: CacheKey,
    done: tokio::sync::watch::Sender<bool>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.staging.in_flight.lock().remove(&self.key);
        let _ = self.done.send(true);
    }
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for Staging {
    fn default() -> Self {
        Self::new(STAGING_BACKLOG_BYTES)
    }
}

impl Staging {
    /// Staging with at most `max_backlog_bytes` being moved up at once.
    pub fn new(max_backlog_bytes: u64) -> Self {
        let mut controller = AccessController::with_predictors(false, false);
        controller.set_config(ControllerConfig {
            max_backlog_bytes,
            ..ControllerConfig::default()
        });
        Staging {
            controller: Mutex::new(controller),
            used: AtomicU64::new(0),
            wasted: AtomicU64::new(0),
            deferred: AtomicU64::new(0),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Marks the staging of `key` (admitted with `Issue`) as running until the returned
    /// guard drops.
    pub fn begin(&self, key: &CacheKey) -> InFlight<'_> {
        let (done, rx) = tokio::sync::watch::channel(false);
        self.in_flight.lock().insert(key.clone(), rx);
        InFlight {
            staging: self,
            key: key.clone(),
            done,
        }
    }

    /// Waits (at most `limit`) for a staging of `key` in flight to end; returns at once
    /// when there is none. Whether it landed or not, the caller then reads as usual.
    pub async fn wait(&self, key: &CacheKey, limit: Duration) {
        let rx = self.in_flight.lock().get(key).cloned();
        if let Some(mut rx) = rx {
            let _ = tokio::time::timeout(limit, rx.wait_for(|done| *done)).await;
        }
    }

    /// May `key` (`bytes`, for `job` of namespace `ns`) be staged now? On `Issue` the
    /// caller stages it and reports [`Self::landed`] or [`Self::failed`].
    pub fn admit(&self, key: &CacheKey, job: JobId, ns: &Arc<str>, bytes: u64) -> Admission {
        let order = PrefetchOrder {
            job,
            path: ns.clone(),
            offset: 0,
            len: bytes,
            origin: Origin::Requested,
            priority: 1.0,
        };
        let a = self
            .controller
            .lock()
            .issue(key.clone(), &order, bytes, true);
        if a == Admission::BacklogFull {
            self.deferred.fetch_add(1, Ordering::Relaxed);
        }
        a
    }

    /// The staging of `key` completed: it is in the fastest tier.
    pub fn landed(&self, key: &CacheKey) {
        self.controller.lock().landed(key);
    }

    /// The staging of `key` was not made (gone from the cache meanwhile).
    pub fn failed(&self, key: &CacheKey) {
        self.controller.lock().failed(key);
    }

    /// A Get of `key` by `job`: settles it as used if it was staged; then sweeps a few
    /// outstanding staged blocks, `fast(k)` telling whether one is still in the fastest
    /// tier (those that are not were wasted).
    pub fn on_get(&self, key: &CacheKey, job: JobId, fast: impl FnMut(&CacheKey) -> bool) {
        let mut c = self.controller.lock();
        if c.demand(key).is_some() {
            self.used.fetch_add(1, Ordering::Relaxed);
        }
        if c.outstanding() == 0 {
            return;
        }
        let event = AccessEvent {
            job,
            // Each block its own "file", so every Get lets the sweep look at a few.
            path: Arc::from(format!("kv/{key}")),
            offset: 0,
            len: 0,
            file_size: 0,
            now_ns: 0,
            pattern: Default::default(),
        };
        let mut orders = Vec::new();
        let wasted = c.on_access(&event, fast, &mut orders);
        self.wasted
            .fetch_add(wasted.len() as u64, Ordering::Relaxed);
    }

    pub fn stats(&self) -> StagingStats {
        StagingStats {
            used: self.used.load(Ordering::Relaxed),
            wasted: self.wasted.load(Ordering::Relaxed),
            deferred: self.deferred.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_get_waits_for_the_staging_in_flight_and_no_longer() {
        let s = Arc::new(Staging::default());
        let k = key(9);
        // None in flight: no wait at all.
        tokio::time::timeout(
            Duration::from_millis(100),
            s.wait(&k, Duration::from_secs(60)),
        )
        .await
        .expect("returns at once");
        let guard = s.begin(&k);
        let waiter = {
            let s = s.clone();
            let k = k.clone();
            tokio::spawn(async move { s.wait(&k, Duration::from_secs(60)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "waits while the staging runs");
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken when it ends")
            .expect("task");
        // A staging that never ends costs a waiter at most its limit.
        let _stuck = s.begin(&k);
        tokio::time::timeout(
            Duration::from_secs(5),
            s.wait(&k, Duration::from_millis(20)),
        )
        .await
        .expect("bounded by the limit");
    }

    fn key(i: u8) -> CacheKey {
        CacheKey::kv("ns", vec![i; 16])
    }

    #[test]
    fn staging_is_bounded_single_flight_and_accounted() {
        let s = Staging::new(3 << 20);
        let ns: Arc<str> = Arc::from("ns");
        let job = JobId(1);
        assert_eq!(s.admit(&key(1), job, &ns, 2 << 20), Admission::Issue);
        // The same block again: already on its way.
        assert_eq!(s.admit(&key(1), job, &ns, 2 << 20), Admission::Outstanding);
        // A second 2 MiB block would exceed the 3 MiB backlog: deferred.
        assert_eq!(s.admit(&key(2), job, &ns, 2 << 20), Admission::BacklogFull);
        s.landed(&key(1));
        assert_eq!(s.admit(&key(2), job, &ns, 1 << 20), Admission::Issue);
        s.landed(&key(2));
        // Key 1 is read: used. Key 2 left the fast tier unread: wasted at the sweep.
        s.on_get(&key(1), job, |k| *k != key(2));
        s.on_get(&key(3), job, |k| *k != key(2));
        assert_eq!(
            s.stats(),
            StagingStats {
                used: 1,
                wasted: 1,
                deferred: 1
            }
        );
    }
}
