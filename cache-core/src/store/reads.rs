//! Reads of one object: its metadata (`head`) and ranges of its bytes, each pinned to
//! the version it was planned on (`version.rs`), in pieces that land as they arrive
//! (`pieces.rs`).

use super::*;

impl BackingStore {
    /// Size and version of one object.
    pub async fn head(&self, path: &str) -> Result<ObjectInfo> {
        self.local_path_fits(path)?;
        let p = object_key(path);
        let meta = self
            .retrying(|| {
                let p = p.clone();
                self.count_head();
                let local = self.local_root.clone();
                async move {
                    // object_store's local HEAD opens the file: a FIFO's open waits for a
                    // writer (`local_infos`), so what is no regular file is not found.
                    if let Some(root) = local {
                        regular_local_file(root, &p).await?;
                    }
                    self.store.head(&p).await
                }
            })
            .await?;
        let info = info_from_meta(&meta, self.block_size);
        match &self.local_root {
            Some(root) => local_info(root.clone(), info, self.follow_symlinks).await,
            None => Ok(info),
        }
    }

    /// Bytes `range` of version `obj` of an object; fails with `Changed` if the object
    /// is no longer that version; a short body is retried as a transient fault.
    pub async fn get_range(&self, obj: &ObjectInfo, range: Range<u64>) -> Result<Bytes> {
        self.get_range_timed(obj, range).await.map(|(b, _)| b)
    }

    /// [`Self::get_range`], also saying how long the successful attempt took to its
    /// first byte (the response headers), for the link estimate of
    /// [`crate::fetch_plan::LinkEstimator`].
    pub async fn get_range_timed(
        &self,
        obj: &ObjectInfo,
        range: Range<u64>,
    ) -> Result<(Bytes, Duration)> {
        if range.start >= range.end {
            return Ok((Bytes::new(), Duration::ZERO));
        }
        let want = range.end - range.start;
        let p = object_key(obj.path.as_ref());
        let pin = VersionPin::of(obj);
        let (bytes, ttfb) = self
            .retrying(|| async {
                let (res, ttfb) = self.open_range(&p, &pin, &range).await?;
                let bytes = res.bytes().await?;
                // A body cut short (a connection closed early behind a proxy, a
                // Content-Length that agreed with it) is a transient fault like a reset:
                // retried (black-box finding: two in a row failed the read with EIO
                // while two 500s were ridden out).
                if bytes.len() as u64 != want {
                    return Err(object_store::Error::Generic {
                        store: "strata",
                        source: format!(
                            "{}: store returned {} bytes for a {want}-byte range",
                            p,
                            bytes.len()
                        )
                        .into(),
                    });
                }
                Ok((bytes, ttfb))
            })
            .await?;
        if bytes.len() as u64 != want {
            return Err(CacheError::Corrupt(format!(
                "{}: store returned {} bytes for a {want}-byte range",
                obj.path,
                bytes.len()
            )));
        }
        self.check_local_version(obj).await?;
        self.reads.count(want);
        Ok((bytes, ttfb))
    }

    /// One attempt at bytes `range` of the version `pin` names: the response, whose
    /// body is still to be read, and its time to first byte.
    async fn open_range(
        &self,
        p: &Path,
        pin: &VersionPin,
        range: &Range<u64>,
    ) -> object_store::Result<(object_store::GetResult, Duration)> {
        let opts = GetOptions {
            if_match: pin.etag.clone(),
            range: Some(GetRange::Bounded(range.clone())),
            ..Default::default()
        };
        let sent = std::time::Instant::now();
        if let Some(root) = &self.local_root {
            regular_local_file(root.clone(), p).await?;
        }
        let res = match self.store.get_opts(p, opts.clone()).await {
            // A store may answer a range with the whole object (RFC 9110 lets it ignore
            // Range), which object_store refuses; where the range is the whole object
            // that answer is the one asked for (black-box finding: such small files
            // were EIO after 8 attempts each).
            Err(e) if range.start == 0 && range.end == pin.size && not_partial(&e) => {
                let whole = GetOptions {
                    range: None,
                    ..opts
                };
                self.store.get_opts(p, whole).await?
            }
            r => r?,
        };
        if let Some(changed) = pin.mismatch(&res.meta) {
            return Err(object_store::Error::Precondition {
                path: p.to_string(),
                source: changed.into(),
            });
        }
        Ok((res, sent.elapsed()))
    }

    /// A local file's ETag (inode, mtime in µs, size) misses a rewrite in place that
    /// restores the mtime; its ctime cannot be restored. Checked after a read, so a
    /// change before or during it fails the read instead of mixing versions.
    async fn check_local_version(&self, obj: &ObjectInfo) -> Result<()> {
        if let Some(root) = &self.local_root {
            let now = local_info(root.clone(), obj.clone(), self.follow_symlinks).await?;
            if now.version != obj.version {
                return Err(CacheError::Changed(obj.path.to_string()));
            }
        }
        Ok(())
    }

    /// Bytes `range` of version `obj` as one ranged GET, cut into pieces of
    /// `block_size` (the last one shorter) as the body streams in: each piece is its
    /// own buffer, so a cache that keeps some of them and evicts others frees what it
    /// evicts (slices of one buffer would keep all of it alive). Also returns the time
    /// to first byte of the first response. Fails as [`Self::get_range`] does.
    /// Each piece is also handed to `on_block` (with its index) as soon as it is
    /// complete, so a reader waiting on it need not wait for the whole range; from an
    /// object store only.
    ///
    /// A slow body is not a failed one: the deadlines bound the wait for a response
    /// (the retry policy, as every request) and then the time between two whole pieces
    /// (`total_timeout`, and `attempt_timeout` without a byte), not the whole body. A
    /// body cut off (a reset, a short body, such a deadline) is asked again from its
    /// first piece not yet whole. Black-box finding: on a link of 150 KB/s an 8 MiB
    /// run could not arrive within one attempt's 30 s, each retry asked for all of it
    /// again from its start, and the reader got EIO after 95 s of steady bytes.
    pub async fn get_range_blocks(
        &self,
        obj: &ObjectInfo,
        range: Range<u64>,
        block_size: u64,
        on_block: &(dyn Fn(usize, &Bytes) + Sync),
    ) -> Result<(Vec<Bytes>, Duration)> {
        if range.start >= range.end {
            return Ok((Vec::new(), Duration::ZERO));
        }
        if block_size == 0 {
            return Err(CacheError::InvalidArgument("block size must be > 0".into()));
        }
        let want = range.end - range.start;
        let p = object_key(obj.path.as_ref());
        let pin = VersionPin::of(obj);
        // A local file is checked for a rewrite after the read: its pieces go out only
        // then, so a change mid-read never reaches a reader.
        let early = self.local_root.is_none();
        let mut blocks: Vec<Bytes> = Vec::with_capacity(want.div_ceil(block_size) as usize);
        let mut first_ttfb = None;
        let mut backoff = self.retry.base_backoff;
        let mut progress_at = tokio::time::Instant::now();
        // Errors the store answered since the last whole piece.
        let mut errors_in_a_row = 0u32;
        loop {
            let done = blocks.len() as u64 * block_size;
            let rest = range.start + done..range.end;
            let (res, ttfb) = self.retrying(|| self.open_range(&p, &pin, &rest)).await?;
            first_ttfb.get_or_insert(ttfb);
            let before = blocks.len();
            let body = self
                .read_pieces(
                    res,
                    (rest.end - rest.start, done, want, block_size),
                    &mut blocks,
                    &mut progress_at,
                    early.then_some(on_block),
                )
                .await;
            if body.is_err() {
                // A body the store failed (cut off, an error mid-way): an attempt failed.
                self.counts
                    .failed_attempts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            match body {
                Ok(()) => break,
                Err(e) if !e.transient => {
                    self.count_failure();
                    return Err(map_store_error(e.error, 1));
                }
                Err(e) => {
                    if blocks.len() > before {
                        backoff = self.retry.base_backoff;
                        errors_in_a_row = 0;
                        tracing::debug!(store = %self.label, path = %p, error = %e.error,
                            "body cut off after whole pieces; asking for the rest");
                        continue;
                    }
                    // A store that answers errors (a failing disk under a local store,
                    // a body cut by the server each time) is asked as often as any
                    // request, and its error is what the caller gets (black-box
                    // finding: EIO of every read(2) of a local file was asked again for
                    // 80 s and reported as "object store timed out").
                    errors_in_a_row = if e.answered { errors_in_a_row + 1 } else { 0 };
                    if errors_in_a_row >= self.retry.attempts.max(1) {
                        self.count_failure();
                        return Err(map_store_error(e.error, errors_in_a_row));
                    }
                    let now = tokio::time::Instant::now();
                    if now + backoff >= progress_at + self.retry.total_timeout {
                        self.count_failure();
                        if e.answered {
                            return Err(map_store_error(e.error, errors_in_a_row));
                        }
                        tracing::debug!(store = %self.label, path = %p, error = %e.error,
                            "no whole piece within the deadline");
                        return Err(CacheError::StoreTimeout { attempts: 1 });
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2).min(self.retry.max_backoff);
                }
            }
        }
        self.check_local_version(obj).await?;
        self.reads.count(want);
        Ok((blocks, first_ttfb.unwrap_or_default()))
    }

    /// Reads the body of one response of [`Self::get_range_blocks`] into whole pieces
    /// appended to `blocks`. `shape`: the body's length, the offset in the range it
    /// starts at (a piece boundary), the range's length and the piece size. Each whole
    /// piece moves `progress_at` (and the store's "answered" clock) on; a chunk must
    /// arrive within `attempt_timeout` and the next piece be whole within
    /// `total_timeout` of `progress_at`.
    async fn read_pieces(
        &self,
        res: object_store::GetResult,
        shape: (u64, u64, u64, u64),
        blocks: &mut Vec<Bytes>,
        progress_at: &mut tokio::time::Instant,
        on_block: Option<&PieceSink<'_>>,
    ) -> std::result::Result<(), BodyError> {
        let (len, start, want, block_size) = shape;
        let piece = |done: u64| (want - done).min(block_size) as usize;
        let mut stream = res.into_stream();
        let mut got = 0u64;
        let mut target = piece(start);
        let mut cur = Piece::new(target);
        loop {
            let deadline = (*progress_at + self.retry.total_timeout)
                .min(tokio::time::Instant::now() + self.retry.attempt_timeout);
            let chunk = match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(chunk)) => chunk.map_err(BodyError::of)?,
                Ok(None) => break,
                Err(_) => {
                    let now = tokio::time::Instant::now();
                    if crate::stall::stalled(deadline, now) {
                        // The daemon was stopped, not the store slow: the rest is asked
                        // for afresh, with a fresh deadline (see `crate::stall`).
                        *progress_at = now;
                    }
                    return Err(BodyError::transient(format!(
                        "no whole piece of {block_size} bytes within the deadline ({got} of {len} bytes)"
                    )));
                }
            };
            let mut chunk = chunk;
            got += chunk.len() as u64;
            if got > len {
                break; // a longer body than asked: refused below
            }
            while !chunk.is_empty() && target > 0 {
                let take = (target - cur.len()).min(chunk.len());
                cur.extend(&chunk.split_to(take));
                if cur.len() == target {
                    let done = (blocks.len() as u64 + 1) * block_size;
                    target = if done < want { piece(done) } else { 0 };
                    let full = std::mem::replace(&mut cur, Piece::new(target)).freeze();
                    if let Some(on_block) = on_block {
                        on_block(blocks.len(), &full);
                    }
                    blocks.push(full);
                    *progress_at = tokio::time::Instant::now();
                    self.answered_at
                        .fetch_max(since_start(), std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        // Cut short (or longer): retried, as in `get_range_timed` (the pieces handed out
        // so far are whole and right; the next request starts after them).
        if got != len {
            return Err(BodyError::transient(format!(
                "store returned {got} bytes for a {len}-byte range"
            )));
        }
        Ok(())
    }
}
