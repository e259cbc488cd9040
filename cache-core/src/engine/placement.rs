//! Where blocks go: a fill to the top level (and the persistent levels when writing
//! through), promotion on a lower level's hit, demotion of a level's victims to the
//! next level that does not hold them.

use super::*;

impl CacheEngine {
    /// The order `fill` visits the levels in. An inline put written through reaches
    /// the persistent levels first: the block becomes visible when it is durable,
    /// once. Placed in memory first, it was seen there, evicted by other puts while its
    /// disk write ran, and seen again once that committed: present, absent, present for
    /// one put (black-box finding: a lookup that saw a block was followed by a load
    /// that missed it). Otherwise fastest first.
    pub(super) fn fill_order(&self, persist: Persist) -> impl Iterator<Item = usize> + '_ {
        let n = self.inner.levels.len();
        let disk_first = persist == Persist::Inline && self.inner.write_through;
        let is_disk = move |i: &usize| self.inner.levels[*i].tier.kind() == TierKind::Disk;
        // No allocation: this runs for every fill.
        (0..n)
            .filter(move |i| !disk_first || is_disk(i))
            .chain((0..n).filter(move |i| disk_first && !is_disk(i)))
    }

    /// Fills `key` into the top level (and persistent levels when writing through).
    ///
    /// `persist` says how the write-through to persistent levels happens: `Inline` for
    /// explicit puts (acknowledged once on disk, so they survive a restart), `Background`
    /// for read-through fills (the reader must not wait for an fsync; a crash before the
    /// write only loses a cached copy).
    pub(super) async fn fill(
        &self,
        key: &CacheKey,
        block: Block,
        ctx: &AccessContext,
        persist: Persist,
    ) -> Result<Fill> {
        let len = block.len();
        let mut stored = false;
        let mut last_err = None;
        // Why a persistent level that an inline put should reach does not hold the block.
        let mut not_durable: Option<CacheError> = None;
        let mut deferred = Vec::new();
        // A volatile level took the block (the fastest that admits it is filled).
        let mut stored_volatile = false;
        for i in self.fill_order(persist) {
            let persistent = self.inner.levels[i].tier.kind() == TierKind::Disk;
            if self.skip_persistent(i, key) {
                continue;
            }
            // Inline puts must reach every persistent level write-through reaches.
            let must_persist = persistent && persist == Persist::Inline && self.inner.write_through;
            if persistent && stored && !self.inner.write_through {
                continue;
            }
            // A read-through fill's copy goes behind the reader: one a volatile level
            // took already, and one of a file block (the store still holds it; see
            // `write_behind`) where a volatile level is there to take the reads (an
            // engine of disk levels alone writes in turn, as its caller expects).
            if persistent
                && persist == Persist::Background
                && (stored || (key.refetchable() && self.inner.has_volatile_level))
            {
                deferred.push(i);
                continue;
            }
            if !persistent && stored_volatile {
                continue;
            }
            if persistent && self.is_degraded(i) {
                self.inner
                    .counters
                    .degraded_skips
                    .fetch_add(1, Ordering::Relaxed);
                if must_persist {
                    not_durable.get_or_insert_with(|| self.degraded_refusal(i, key));
                }
                continue;
            }
            let kind = match persist {
                Persist::Inline => WriteKind::Durable,
                Persist::Background => WriteKind::of_copy(key),
            };
            match self.insert_at(i, key, block.clone(), ctx, kind, None).await {
                Ok(true) => {
                    stored = true;
                    stored_volatile |= !persistent;
                    if persistent {
                        self.note_write_ok(i);
                    }
                }
                Ok(false) => {
                    if must_persist {
                        not_durable.get_or_insert_with(|| {
                            CacheError::Full(format!(
                                "{} did not admit {key}",
                                self.inner.levels[i].tier.name()
                            ))
                        });
                    }
                }
                Err(e) => {
                    self.note_write_error(i, &e);
                    if must_persist {
                        not_durable = Some(e.duplicate());
                    }
                    last_err = Some(e);
                }
            }
        }
        // A file block's copy is written within the bound, and shed past it; a KV
        // block's copy is the only one outside memory, so it is always written.
        let mut pending = None;
        let mut shed = false;
        if !deferred.is_empty() && key.refetchable() {
            pending = self.take_behind(block.len());
            shed = pending.is_none();
            if shed {
                deferred.clear();
            }
        }
        let mut behind = None;
        if !deferred.is_empty() {
            let engine = self.clone();
            let (key, ctx) = (key.clone(), *ctx);
            behind = Some(tokio::spawn(async move {
                let _pending = pending;
                for i in deferred {
                    if engine.skip_persistent(i, &key) {
                        continue;
                    }
                    if engine.is_degraded(i) {
                        engine
                            .inner
                            .counters
                            .degraded_skips
                            .fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let kind = WriteKind::of_copy(&key);
                    match engine
                        .insert_at(i, &key, block.clone(), &ctx, kind, None)
                        .await
                    {
                        Ok(true) => {
                            engine.note_write_ok(i);
                            // Kept elsewhere meanwhile (its drop may have run before
                            // this write committed): one copy on disk, not two.
                            if engine.skip_persistent(i, &key) {
                                if let Err(e) = engine.drop_persistent(&key).await {
                                    tracing::debug!(%key, error = %e, "dropping a block kept elsewhere failed");
                                }
                            }
                        }
                        Ok(false) => {}
                        Err(e) => {
                            engine.note_write_error(i, &e);
                            tracing::debug!(%key, error = %e, "background write-through failed");
                        }
                    }
                }
            }));
        }
        let filled =
            match (stored, last_err) {
                (true, _) => Ok(Fill {
                    not_durable,
                    behind,
                }),
                // Its copy is on its way to a persistent level, or was shed: a copy a
                // slow disk cannot take is no error.
                (false, None) if behind.is_some() || shed => Ok(Fill {
                    not_durable,
                    behind,
                }),
                (false, Some(e)) => Err(e),
                (false, None) => Err(not_durable
                    .unwrap_or_else(|| CacheError::Full(format!("no tier admitted {key}")))),
            };
        // Counted once filled: a put no level admitted filled nothing (black-box
        // finding: three refused KV puts showed as three fills of 6 MiB).
        if filled.is_ok() {
            let c = &self.inner.counters;
            c.fills.fetch_add(1, Ordering::Relaxed);
            c.fill_bytes.fetch_add(len, Ordering::Relaxed);
            if ctx.is_prefetch() {
                c.prefetch_fills.fetch_add(1, Ordering::Relaxed);
                c.prefetch_bytes.fetch_add(len, Ordering::Relaxed);
            }
        }
        filled
    }

    /// Copies a block found at level `from` into the top level; `read_at`: the
    /// removal number when it was read (a removal since cancels the copy).
    pub(super) async fn promote(
        &self,
        from: usize,
        key: &CacheKey,
        block: Block,
        ctx: &AccessContext,
        read_at: u64,
    ) {
        if from == 0 {
            return;
        }
        let ctx = ctx.moved(AccessKind::Promotion);
        if let Ok(true) = self
            .insert_at(0, key, block, &ctx, WriteKind::of_copy(key), Some(read_at))
            .await
        {
            self.inner
                .counters
                .promotions
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Places `key` at level `start`, demoting the victims it pushes out down the
    /// hierarchy. Returns whether level `start` now holds the block.
    pub(super) async fn insert_at(
        &self,
        start: usize,
        key: &CacheKey,
        block: Block,
        ctx: &AccessContext,
        kind: WriteKind,
        read_at: Option<u64>,
    ) -> Result<bool> {
        let (stored, demotions) = self
            .place_one(start, key, block, ctx, kind, read_at)
            .await?;
        let moved = ctx.moved(AccessKind::Demotion);
        self.demote(demotions, &moved, true).await;
        Ok(stored)
    }

    /// Places the victims `demotions` pushed out of a level in the levels below, and
    /// the victims those push out in turn. With `behind`, a file block bound for a
    /// persistent level is written behind the caller within the bound (shed past it;
    /// see `write_behind`); the rest, and everything when not `behind`, in turn here.
    pub(super) async fn demote(
        &self,
        mut demotions: Vec<(usize, CacheKey, Block, u64)>,
        moved: &AccessContext,
        behind: bool,
    ) {
        while let Some((i, victim, bytes, taken_at)) = demotions.pop() {
            if self.skip_persistent(i, &victim) {
                continue;
            }
            let persistent = self.inner.levels[i].tier.kind() == TierKind::Disk;
            if persistent && self.is_degraded(i) {
                // Only a cached copy is lost; the store (or the client) still has it.
                self.inner
                    .counters
                    .degraded_skips
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let kind = WriteKind::of_copy(&victim);
            if behind && persistent && kind == WriteKind::Refetchable {
                if let Some(pending) = self.take_behind(bytes.len()) {
                    let (engine, moved) = (self.clone(), *moved);
                    tokio::spawn(async move {
                        let _pending = pending;
                        let first = vec![(i, victim, bytes, taken_at)];
                        engine.demote_in_turn(first, moved).await;
                    });
                }
                continue;
            }
            match self
                .place_one(i, &victim, bytes, moved, kind, Some(taken_at))
                .await
            {
                Ok((_, more)) => demotions.extend(more),
                // A failed demotion only loses a cached copy; the store still has it.
                Err(e) => {
                    self.note_write_error(i, &e);
                    tracing::debug!(key = %victim, error = %e, "demotion failed");
                }
            }
        }
    }

    /// [`Self::demote`] in turn, boxed: it runs in the task a demotion written behind
    /// is spawned in (a future cannot hold its own type).
    pub(super) fn demote_in_turn(
        &self,
        demotions: Vec<(usize, CacheKey, Block, u64)>,
        moved: AccessContext,
    ) -> BoxFuture<'static, ()> {
        let engine = self.clone();
        async move { engine.demote(demotions, &moved, false).await }.boxed()
    }

    /// Places one block at level `i`: reserves its bytes (evicting what the policy
    /// names), removes the victims, writes the block, and makes it a resident once its
    /// bytes have landed. Returns whether it was stored plus the victims to demote.
    /// `read_at`: for a copy, the removal number when its bytes were read; a removal
    /// of the key since cancels it (checked at the reservation and at the commit).
    /// Each victim to demote carries the removal number when it was taken.
    pub(super) async fn place_one(
        &self,
        i: usize,
        key: &CacheKey,
        block: Block,
        ctx: &AccessContext,
        kind: WriteKind,
        read_at: Option<u64>,
    ) -> Result<(bool, Vec<(usize, CacheKey, Block, u64)>)> {
        let level = &self.inner.levels[i];
        self.recheck_lowered_budget(i);
        // What the level's budget charges: the tier's bytes for the block, not only its own.
        let size = level.tier.footprint(key, block.len());
        let removed = |state: &Hierarchy| read_at.is_some_and(|s| state.removed_since(key, s));
        let (placement, taken_at) = {
            let mut state = self.inner.state.lock();
            if removed(&state) {
                return Ok((false, Vec::new()));
            }
            (state.reserve(i, key, size, ctx), state.removal_seq())
        };
        let (admitted, evicted) = match placement {
            Ok(Placement::Admitted { evicted }) => (true, evicted),
            // Refused after evicting (only writes in flight left): the victims still go.
            Ok(Placement::Refused { evicted }) => (false, evicted),
            // Values are immutable: already stored. (Bytes the tier lost are forgotten
            // at the first lookup that misses them.)
            Ok(Placement::AlreadyResident) => return Ok((true, Vec::new())),
            Err(CacheError::TooLarge { .. }) => return Ok((false, Vec::new())),
            Err(e) => return Err(e),
        };
        // Charged until released: a caller cancelled mid-way (a client that hung up)
        // must not leave bytes charged forever.
        let mut write = Charge::new(&self.inner.state, i, if admitted { size } else { 0 });
        let mut demotions = Vec::new();
        for (victim, _) in evicted {
            level.evictions.fetch_add(1, Ordering::Relaxed);
            // Read the victim only if a lower level will take it: at the bottom the read
            // would only delay the removal that frees its bytes in the tier.
            let next = self.inner.state.lock().next_level_lacking(i, &victim);
            let bytes = match next {
                Some(_) => match level.tier.get(&victim).await {
                    Ok(TierGet::Hit(b)) => {
                        // The engine's own read, not a client's hit.
                        level.quiet_hits.fetch_add(1, Ordering::Relaxed);
                        Some(b)
                    }
                    _ => None,
                },
                None => None,
            };
            if let Err(e) = level.tier.remove(&victim).await {
                tracing::warn!(tier = %level.tier.name(), key = %victim, error = %e, "evict failed");
            }
            if let (Some(b), Some(next)) = (bytes, next) {
                self.inner
                    .counters
                    .demotions
                    .fetch_add(1, Ordering::Relaxed);
                demotions.push((next, victim, b, taken_at));
            }
        }
        if !admitted {
            return Ok((false, demotions));
        }
        let put = match kind {
            WriteKind::Durable => level.tier.put(key, block).await,
            WriteKind::Refetchable => level.tier.put_refetchable(key, block).await,
        };
        match put {
            Ok(()) => {
                let committed = {
                    let mut state = self.inner.state.lock();
                    let go = !removed(&state);
                    if go {
                        write.bytes = 0; // the commit takes the reservation over
                        state.commit(i, key, size, ctx);
                    }
                    go
                };
                if committed {
                    return Ok((true, demotions));
                }
                // Removed while its bytes were written: they go again (the reservation
                // is released with `write`).
                drop(write);
                if let Err(e) = level.tier.remove(key).await {
                    tracing::warn!(tier = %level.tier.name(), %key, error = %e, "removing a cancelled copy failed");
                }
                Ok((false, demotions))
            }
            Err(e) => {
                drop(write);
                tracing::warn!(tier = %level.tier.name(), %key, error = %e, "tier put failed");
                // Victims already left this level; still demote them.
                if demotions.is_empty() {
                    Err(e)
                } else {
                    Ok((false, demotions))
                }
            }
        }
    }
}
