//! A full or failing disk level: write errors mark it degraded for a back-off, its
//! budget comes down to what it holds and goes up again with the device's room, and
//! writes that cannot be made again shed cached blocks (see the module docs of
//! [`super`]).

use super::*;

impl CacheEngine {
    /// The error of a durable write refused because level `i` is degraded: the tier,
    /// the device's error and when writes to it resume (not "cache full": the room is
    /// not the matter, and a client told so would not retry).
    pub(super) fn degraded_refusal(&self, i: usize, key: &CacheKey) -> CacheError {
        let level = &self.inner.levels[i];
        let until = level.degraded_until.load(Ordering::Relaxed);
        let left = Duration::from_nanos(until.saturating_sub(self.now_ns()));
        let cause = level.degraded_cause.lock().clone();
        CacheError::Degraded(format!(
            "{} is degraded after a device error ({cause}): {key} not stored durably; \
             writes to it resume in {:.1} s",
            level.tier.name(),
            left.as_secs_f64()
        ))
    }

    /// Whether writes skip level `i` now.
    pub(super) fn is_degraded(&self, i: usize) -> bool {
        let until = self.inner.levels[i].degraded_until.load(Ordering::Relaxed);
        until != 0 && self.now_ns() < until
    }

    /// After a write error at level `i`: a device error on a persistent level starts
    /// (or extends) a degraded spell. One log line per spell. A shortage of the
    /// process's own resources (descriptors, threads, memory) is not the device's
    /// fault and fails only that write (black-box finding: a burst of clients past
    /// the descriptor limit, or a thread limit that bit for a moment, held every put
    /// out of the disk tier for 30 s after the shortage was over).
    pub(super) fn note_write_error(&self, i: usize, e: &CacheError) {
        let level = &self.inner.levels[i];
        let device = matches!(
            e,
            CacheError::Full(_) | CacheError::Io(_) | CacheError::Index(_)
        ) && !e.is_resource_shortage();
        if level.tier.kind() != TierKind::Disk || !device {
            return;
        }
        if let CacheError::Full(_) = e {
            // The file system filled before the budget did (a budget larger than the
            // disk, or other files on it): the level's budget comes down to what it
            // holds, so after the back-off new blocks evict old ones rather than fail
            // again while nothing is evicted (black-box finding: every KV Put refused
            // for good on a full disk). It goes back up with the device's room
            // (`note_write_ok`).
            let mut state = self.inner.state.lock();
            let held = state.level(i).used();
            if self.lower_budget(&mut state, i, held) {
                tracing::warn!(tier = %level.tier.name(), budget = held,
                    "disk full before the disk budget: the budget is what the tier holds until the device has room");
            }
        }
        // The first error of a spell backs off FIRST_DEGRADED_BACKOFF; each failed try
        // after a back-off doubles it, up to the longest.
        let longest = u64::try_from(self.inner.degraded_backoff.as_nanos()).unwrap_or(u64::MAX);
        let first = u64::try_from(FIRST_DEGRADED_BACKOFF.as_nanos())
            .unwrap_or(u64::MAX)
            .min(longest);
        let prev = level.degraded_backoff_ns.load(Ordering::Relaxed);
        let backoff = if prev == 0 {
            first
        } else if self.is_degraded(i) {
            // Another write that was in flight when the spell began: the same fault.
            prev
        } else {
            prev.saturating_mul(2).min(longest)
        };
        level
            .degraded_backoff_ns
            .store(backoff.max(1), Ordering::Relaxed);
        *level.degraded_cause.lock() = e.to_string();
        let until = self.now_ns().saturating_add(backoff).max(1);
        level.degraded_until.store(until, Ordering::Relaxed);
        if !level.degraded.swap(true, Ordering::Relaxed) {
            self.inner
                .counters
                .degradations
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                tier = %level.tier.name(),
                error = %e,
                backoff = ?Duration::from_nanos(backoff),
                "disk level degraded: writes skip it for the back-off, doubled while tries fail (reads go on)"
            );
        }
    }

    /// Lowers level `i`'s budget to `held` (the device filled before the budget did;
    /// [`Self::note_write_ok`] raises it again with the device's room); true if it was
    /// above.
    pub(super) fn lower_budget(&self, state: &mut Hierarchy, i: usize, held: u64) -> bool {
        if held >= state.level(i).budget() {
            return false;
        }
        state.set_budget(i, held);
        self.inner.levels[i]
            .budget_lowered
            .store(true, Ordering::Relaxed);
        true
    }

    /// Gives level `i` back the budget a full device took, as far as the device has room
    /// now (a statvfs, outside the lock).
    pub(super) fn raise_lowered_budget(&self, i: usize) {
        let level = &self.inner.levels[i];
        if !level.budget_lowered.load(Ordering::Relaxed) {
            return;
        }
        if let Some(free) = level.tier.free_bytes() {
            let configured = level.tier.capacity_bytes();
            let mut state = self.inner.state.lock();
            let room = state.level(i).used().saturating_add(free);
            let to = room.min(configured).max(state.level(i).budget());
            state.set_budget(i, to);
            if to >= configured {
                level.budget_lowered.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Before a write to level `i` whose budget a full device brought down: the budget
    /// goes back up with the device's room, at most once a second. After a successful
    /// write alone was not enough: a level brought down to what it held, nothing,
    /// admitted no write, so none succeeded and it cached nothing again for good
    /// (black-box finding: after a write through the mount filled the staging disk,
    /// the disk tier stored nothing though the disk was empty again).
    pub(super) fn recheck_lowered_budget(&self, i: usize) {
        let level = &self.inner.levels[i];
        if !level.budget_lowered.load(Ordering::Relaxed) {
            return;
        }
        // 0: never checked.
        let now = self.now_ns().max(1);
        let last = level.budget_checked_at.load(Ordering::Relaxed);
        if (last != 0 && now.saturating_sub(last) < 1_000_000_000)
            || level
                .budget_checked_at
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.raise_lowered_budget(i);
    }

    /// After a successful write at level `i`: ends a degraded spell, and gives back
    /// budget a full device took, as far as the device has room now.
    pub(super) fn note_write_ok(&self, i: usize) {
        let level = &self.inner.levels[i];
        self.raise_lowered_budget(i);
        if level.degraded.swap(false, Ordering::Relaxed) {
            level.degraded_until.store(0, Ordering::Relaxed);
            level.degraded_backoff_ns.store(0, Ordering::Relaxed);
            tracing::info!(tier = %level.tier.name(), "disk level recovered: writes resume");
        }
    }

    /// Frees about `bytes` of the disk levels kept on device `dev` (`st_dev`), the
    /// policy's victims first, for a write that cannot be made again (a file being
    /// written through a mount) that found that device full: blocks can be fetched
    /// again. The level's budget comes down to what it holds, as after its own ENOSPC,
    /// so the room is not taken back at once; it goes up again with the device's room
    /// ([`Self::note_write_ok`]). Returns the bytes freed.
    pub async fn shed_persistent(&self, dev: u64, bytes: u64) -> u64 {
        let mut freed = 0;
        for (i, level) in self.inner.levels.iter().enumerate() {
            if freed >= bytes
                || level.tier.kind() != TierKind::Disk
                || level.tier.device() != Some(dev)
            {
                continue;
            }
            let victims = {
                let mut state = self.inner.state.lock();
                let victims = state.shed(i, bytes - freed);
                let held = state.level(i).used() + state.level(i).reserved();
                self.lower_budget(&mut state, i, held);
                victims
            };
            for (victim, size) in victims {
                level.evictions.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = level.tier.remove(&victim).await {
                    tracing::warn!(tier = %level.tier.name(), key = %victim, error = %e, "evict failed");
                }
                freed += size;
            }
        }
        freed
    }
}
