//! What the predictors order for a read, issued as fetches: the access controller's
//! prefetches (within the file and across files) and their outcome told back.

use super::read::demand_blocks;
use super::*;

impl FsCore {
    /// Drives the access controller for one demand read: reports the blocks it reads
    /// (a prefetched one is `Used`), hands it the access, and issues the orders it returns
    /// in their order: ranges of this object at once, other paths after resolving them
    /// (a metadata-cache hit usually).
    pub(super) fn predict(
        self: &Arc<Self>,
        p: &Arc<Predictors>,
        h: &FileHandle,
        offset: u64,
        len: u64,
        ctx: &AccessContext,
    ) {
        let obj = &h.obj;
        let bs = self.reader.block_size();
        let engine = self.reader.engine();
        // The link's bandwidth-delay product bounds what prefetch keeps in flight.
        let in_flight_target = self.reader.link().in_flight_target();
        let ev = AccessEvent {
            job: ctx.job,
            path: obj.path.clone(),
            offset,
            len,
            file_size: obj.size,
            now_ns: ctx.now_ns,
            pattern: engine.pattern_of(&self.reader.key(obj, offset / bs), ctx),
        };
        // A stream that changed course drops the prefetch it still has queued.
        self.reader
            .wire()
            .course(ctx.job, &obj.path, ev.pattern, offset);
        let demand = demand_blocks(offset, len, obj.size, bs);
        let mut orders: Vec<PrefetchOrder> = Vec::new();
        let outcomes = {
            let mut c = p.controller.lock();
            if c.config().max_backlog_bytes != in_flight_target {
                let cfg = ControllerConfig {
                    max_backlog_bytes: in_flight_target,
                    ..c.config().clone()
                };
                c.set_config(cfg);
            }
            // Readahead of a reader that waits on it may deepen to the same window.
            c.set_link_window(in_flight_target);
            c.set_demand_in_flight(self.demand_in_flight.load(Ordering::Relaxed));
            if let Some(t) = self.reader.small_request_latency() {
                c.set_request_latency(t.as_nanos().min(u128::from(u64::MAX)) as u64);
            }
            let mut outcomes = Vec::new();
            if c.outstanding() > 0 {
                for b in demand.clone() {
                    outcomes.extend(c.demand(&self.reader.key(obj, b)));
                }
            }
            outcomes.extend(c.on_access(&ev, |k| engine.contains(k), &mut orders));
            outcomes
        };
        for o in outcomes
            .iter()
            .filter(|o| o.origin == Origin::CrossFile && o.lead)
        {
            let counter = if o.used {
                &self.counters.prefetch_files_used
            } else {
                &self.counters.prefetch_files_wasted
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        for order in orders {
            if order.path == obj.path {
                // The blocks this read fetches itself are not prefetches. Readahead
                // requests ramp up with the stream.
                self.issue(p, obj, &order, demand.clone(), &h.ramp, ctx);
                continue;
            }
            let core = self.clone();
            let p = p.clone();
            let ctx = *ctx;
            // Another file: fetched whole in as few GETs as the request cap allows.
            let mut full = self.request_ramp();
            full.skip_to_max();
            tokio::spawn(async move {
                if let Ok(Meta::File(o)) = core.meta(&order.path).await {
                    core.issue(&p, &o, &order, 0..0, &Mutex::new(full), &ctx);
                }
            });
        }
    }

    /// Fetches the blocks of `order`'s range of `obj` ahead of demand, except those in
    /// `skip`, those cached already and those the controller refuses (already
    /// outstanding, or the backlog is full): the admitted blocks go in ranged GETs of
    /// up to `max_blocks` consecutive blocks ([`strata_cache_core::fetch_plan`]), each
    /// run in its own task. Reports each block's landing back, or, when it failed or
    /// was no fetch after all (a demand read fetched it meanwhile: the replay does not
    /// count that as a prefetch either), its failure.
    pub(super) fn issue(
        self: &Arc<Self>,
        p: &Arc<Predictors>,
        obj: &Arc<ObjectInfo>,
        order: &PrefetchOrder,
        skip: Range<u64>,
        ramp: &Mutex<RequestRamp>,
        ctx: &AccessContext,
    ) -> u64 {
        let end = order.offset.saturating_add(order.len.max(1)).min(obj.size);
        if order.offset >= end {
            return 0;
        }
        self.counters
            .prefetch_requests
            .fetch_add(1, Ordering::Relaxed);
        let bs = self.reader.block_size();
        let ctx = AccessContext::prefetch(ctx.job, ctx.now_ns);
        let engine = self.reader.engine();
        let mut admitted: Vec<u64> = Vec::new();
        let mut lead_block = None;
        let first = order.offset / bs;
        let mut last = (end - 1) / bs;
        // Readahead is stretched to one whole request from the first block it sends,
        // not from the order's start: the predictor orders the next block or two at
        // each read, just past what is in flight, and a stretch from there covers
        // mostly blocks in flight already, so the one new block would go alone (one
        // GET per read, issue 14).
        let request = (order.origin == Origin::Readahead).then(|| ramp.lock().peek_blocks());
        let total_blocks = obj.size.div_ceil(bs);
        let mut stopped_by_backlog = false;
        let mut next = first;
        while next <= last {
            let b = next;
            next += 1;
            let key = self.reader.key(obj, b);
            if skip.contains(&b) || engine.contains(&key) {
                continue;
            }
            let bytes = (obj.size - b * bs).min(bs);
            let mut c = p.controller.lock();
            match c.issue(key, order, bytes, admitted.is_empty()) {
                Admission::Issue => {}
                Admission::Outstanding => continue,
                Admission::BacklogFull => {
                    c.refused(order, (b * bs).max(order.offset));
                    stopped_by_backlog = true;
                    break;
                }
            }
            drop(c);
            if admitted.is_empty() && order.origin == Origin::CrossFile {
                // A file prefetch counts from its issue: each counted file gets at
                // most one outcome (used or wasted), so used + wasted <= files.
                self.counters.prefetch_files.fetch_add(1, Ordering::Relaxed);
                lead_block = Some(b);
                self.mark_prefetched_copy(obj, order);
            }
            if admitted.is_empty() {
                if let Some(request) = request {
                    last = stretch_readahead(b, last, request, total_blocks);
                }
            }
            admitted.push(b);
        }
        let (runs, released) = plan_runs(&admitted, &mut ramp.lock(), stopped_by_backlog);
        if let Some(&from) = released.first() {
            // Sent with the stream's next prefetch, as part of a full request.
            let mut c = p.controller.lock();
            for &b in &released {
                c.failed(&self.reader.key(obj, b));
                if lead_block == Some(b) {
                    self.counters.prefetch_files.fetch_sub(1, Ordering::Relaxed);
                }
            }
            c.refused(order, (from * bs).max(order.offset));
        }
        // Cross-file prediction is speculative: it goes after the readahead of streams
        // being read.
        let class = if order.origin == Origin::CrossFile {
            Class::Speculative
        } else {
            Class::Prefetch
        };
        for run in runs {
            let core = self.clone();
            let p = p.clone();
            let obj = obj.clone();
            tokio::spawn(async move {
                let results = core.reader.fetch_run_as(&obj, run, &ctx, class).await;
                let mut c = p.controller.lock();
                for (b, r) in results {
                    let key = core.reader.key(&obj, b);
                    let made = match r {
                        RunBlock::Fetched => {
                            c.landed(&key);
                            true
                        }
                        RunBlock::NotFetched => false,
                        RunBlock::Failed(e) => {
                            tracing::debug!(path = %obj.path, block = b, error = %e, "prefetch failed");
                            false
                        }
                    };
                    // Not a prefetch after all (cached already, another reader's
                    // fetch, or a failure) and no outcome given yet: uncounted. One a
                    // demand read already claimed (used) stays counted: the prediction
                    // was right.
                    if !made && c.failed(&key) && lead_block == Some(b) {
                        core.counters.prefetch_files.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            });
        }
        (admitted.len() - released.len()) as u64
    }

    pub(super) fn prefetch(
        &self,
        obj: &ObjectInfo,
        range: Range<u64>,
        ramp: &Mutex<RequestRamp>,
        ctx: &AccessContext,
    ) {
        if range.start >= range.end {
            return;
        }
        let bs = self.reader.block_size();
        let first = range.start / bs;
        let last = stretch_readahead(
            first,
            (range.end - 1) / bs,
            ramp.lock().peek_blocks(),
            obj.size.div_ceil(bs),
        );
        self.counters
            .prefetch_requests
            .fetch_add(1, Ordering::Relaxed);
        self.reader
            .prefetch(obj, first, last - first + 1, &mut ramp.lock(), ctx);
    }
}
