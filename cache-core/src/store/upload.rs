//! Multipart uploads of objects written through a mount ([`StreamingUpload`]).
//!
//! A large object goes up in parts, and a part is one request among hundreds: a store
//! that answers 0.1% of requests with a 5xx fails a 10 GiB upload of 1,280 parts more
//! often than not unless each part is retried on its own. So where the store exposes
//! parts by index (`MultipartStore`: S3, GCS, Azure, memory), each part, the creation
//! and the completion are retried under the store's [`RetryPolicy`]; a part re-sent
//! under its index replaces the failed attempt. Elsewhere (a local directory, whose
//! writes do not fail transiently) `object_store`'s `WriteMultipart` sends them.
//! Either way a failure aborts the upload: an object appears only at
//! [`StreamingUpload::finish`], whole, or not at all.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{MultipartId, PutPayload, WriteMultipart};
use tokio::task::JoinSet;

use super::{map_store_error, retry_op, RetryPolicy};
use crate::{CacheError, Result};

/// Parts one multipart upload may have: S3's limit (GCS's and Azure's allow at least
/// as many).
pub const MAX_UPLOAD_PARTS: u64 = 10_000;

/// How an upload is cut and paced.
#[derive(Clone, Debug)]
pub struct UploadShape {
    /// Bytes per part (the last may be smaller).
    pub part_size: usize,
    /// Parts of this upload on the wire at once.
    pub in_flight: usize,
    /// Shared by uploads that together may have only so many parts on the wire (one
    /// permit per part, held until the store answered it; where parts go by index):
    /// many files closed at once then wait for room instead of each buffering
    /// `in_flight` parts.
    pub slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Create the object only if no object has its name: a single PUT is sent with
    /// If-None-Match (`PutMode::Create`); a multipart upload checks just before it
    /// completes ([`super::BackingStore::check_absent`]; the stores' completions take
    /// no condition here). A mount that may not replace objects writes so: another
    /// writer's object created after the mount listed the folder is not overwritten.
    pub only_if_absent: bool,
}

/// The error of a wait on the store that outlived its budget.
pub(super) fn bounded_wait(path: &str, what: &str, budget: Duration) -> CacheError {
    CacheError::Store {
        attempts: 1,
        message: format!("{path}: {what} did not finish within {budget:?}"),
    }
}

/// A multipart upload in progress ([`super::BackingStore::start_upload`]): bytes are
/// queued with [`Self::put`] (cut into parts of the part size, up to `in_flight` parts
/// on the wire), and the object appears only at [`Self::finish`]. A failure aborts
/// the upload (so does dropping it unfinished: its parts are the store's to collect).
pub struct StreamingUpload {
    path: String,
    sink: Option<Sink>,
    /// Its record in the mount's journal, removed once it completed or was aborted.
    recorded: Option<super::journal::Recorded>,
    in_flight: usize,
    /// Bound on one wait for the store where parts are not retried one by one.
    budget: Duration,
    /// A local directory store's file of the object, synced once it is complete
    /// (`super::sync_local_file`).
    local_file: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The object is new (a create-only upload): removed if that sync fails, so a
    /// failed upload leaves no object (as `BackingStore::put_new` does).
    new_object: bool,
    /// The store handle's failed-request count: an upload that fails on the store
    /// counts once (see `BackingStore::failures`).
    counts: Option<Arc<super::HandleCounts>>,
}

enum Sink {
    /// Parts by index, each retried (see the module doc).
    Parts(Box<PartSink>),
    /// `object_store`'s own parts: a failed part fails the upload.
    Whole(WriteMultipart),
}

struct PartSink {
    store: Arc<dyn MultipartStore>,
    /// The object's path in `store` (with the handle's prefix).
    location: Path,
    id: MultipartId,
    part_size: usize,
    /// Bytes queued for the next part.
    pending: Vec<Bytes>,
    pending_len: usize,
    next_idx: usize,
    tasks: JoinSet<Result<(usize, PartId)>>,
    done: Vec<(usize, PartId)>,
    retry: RetryPolicy,
    label: String,
    slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Room for the next part, taken before its bytes were read ([`StreamingUpload::
    /// ready_for_part`]): held by the part's task once it is sent.
    reserved: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Where the object is read back (HEAD) after a completion whose answer was lost.
    head: Option<(Arc<dyn object_store::ObjectStore>, Path)>,
    /// Bytes sent in parts so far.
    sent: u64,
    /// The completion was sent (its failure may be a lost answer).
    completing: bool,
    /// The store handle's counts (each failed attempt of a part counts).
    counts: Arc<super::HandleCounts>,
}

/// How an abort of a multipart upload went.
#[derive(Debug, PartialEq, Eq)]
enum Aborted {
    Yes,
    /// The store knows no such upload: completed (or aborted) already.
    Gone,
    Failed,
}

impl StreamingUpload {
    /// An upload whose parts go by index through `store` at `location`.
    /// `head`: where the object is read back, to tell a completion whose answer was
    /// lost from one that failed.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn by_parts(
        store: Arc<dyn MultipartStore>,
        location: Path,
        path: &str,
        shape: &UploadShape,
        retry: RetryPolicy,
        label: &str,
        journal: Option<Arc<super::UploadJournal>>,
        head: Option<(Arc<dyn object_store::ObjectStore>, Path)>,
        counts: Arc<super::HandleCounts>,
    ) -> Result<StreamingUpload> {
        // Recorded before the request too: a crash during it leaves an upload the
        // store knows and no record names (crash finding: 3-7 of ~240 killed uploads).
        let starting = journal
            .as_ref()
            .map(|j| j.record_starting(location.as_ref()));
        let id = retry_op(&retry, label, Some(&counts.failed_attempts), || {
            store.create_multipart(&location)
        })
        .await;
        let recorded = match (&id, &journal) {
            (Ok(id), Some(j)) => Some(j.record(location.as_ref(), Some(id.as_str()))),
            _ => None,
        };
        if let Some(s) = starting {
            s.done();
        }
        let id = id?;
        Ok(StreamingUpload {
            recorded,
            path: path.to_string(),
            sink: Some(Sink::Parts(Box::new(PartSink {
                store,
                location,
                id,
                part_size: shape.part_size.max(1),
                pending: Vec::new(),
                pending_len: 0,
                next_idx: 0,
                tasks: JoinSet::new(),
                done: Vec::new(),
                retry: retry.clone(),
                label: label.to_string(),
                slots: shape.slots.clone(),
                reserved: None,
                head,
                sent: 0,
                completing: false,
                counts,
            }))),
            in_flight: shape.in_flight.max(1),
            budget: retry.attempt_timeout * retry.attempts.max(1),
            local_file: None,
            new_object: false,
            counts: None,
        })
    }

    /// An upload through `object_store`'s `WriteMultipart`.
    pub(super) fn whole(
        parts: WriteMultipart,
        path: &str,
        in_flight: usize,
        budget: Duration,
        recorded: Option<super::journal::Recorded>,
        local_file: Option<(std::path::PathBuf, std::path::PathBuf)>,
        new_object: bool,
    ) -> StreamingUpload {
        StreamingUpload {
            recorded,
            path: path.to_string(),
            sink: Some(Sink::Whole(parts)),
            in_flight: in_flight.max(1),
            budget,
            local_file,
            new_object,
            counts: None,
        }
    }

    /// Counts a failure of this upload on the store in `failed`.
    pub(super) fn counting_failures(mut self, counts: Arc<super::HandleCounts>) -> Self {
        self.counts = Some(counts);
        self
    }

    /// `result`, counted if it is the store's failure.
    fn counted<T>(&self, result: Result<T>) -> Result<T> {
        if let Some(counts) = &self.counts {
            counts.note(&result);
        }
        result
    }

    fn ended(&self) -> CacheError {
        CacheError::InvalidArgument(format!("{}: the upload already ended", self.path))
    }

    /// Waits until one more part may go on the wire (this upload's `in_flight`, and the
    /// bound shared with the mount's other uploads), and keeps that room for the next
    /// [`Self::put`]: a caller that reads its parts from a file waits here before it
    /// reads, so a slow store keeps the bytes in the file, not in memory (black-box
    /// finding: each file written in order held a part read and waiting, on top of the
    /// shared window). An error aborts the upload.
    pub async fn ready_for_part(&mut self) -> Result<()> {
        let result = match self.sink.as_mut() {
            None => return Err(self.ended()),
            Some(Sink::Parts(p)) => p.reserve(self.in_flight).await,
            Some(Sink::Whole(parts)) => {
                whole_room(parts, self.in_flight, self.budget, &self.path).await
            }
        };
        if result.is_err() {
            self.abort().await;
        }
        self.counted(result)
    }

    /// Queues `data`, first waiting while `in_flight` parts are on the wire. An error
    /// aborts the upload.
    pub async fn put(&mut self, data: Bytes) -> Result<()> {
        let result = match self.sink.as_mut() {
            None => return Err(self.ended()),
            Some(Sink::Parts(p)) => p.put(data, self.in_flight).await,
            Some(Sink::Whole(parts)) => whole_room(parts, self.in_flight, self.budget, &self.path)
                .await
                .map(|()| parts.put(data)),
        };
        if result.is_err() {
            self.abort().await;
        }
        self.counted(result)
    }

    /// Sends what is queued and completes the upload: the object appears now.
    pub async fn finish(mut self) -> Result<()> {
        let counts = self.counts.take();
        let result = self.finish_inner().await;
        if let Some(counts) = counts {
            counts.note(&result);
        }
        result
    }

    async fn finish_inner(&mut self) -> Result<()> {
        match self.sink.take() {
            None => Err(self.ended()),
            Some(Sink::Parts(mut p)) => match p.finish().await {
                Ok(()) => {
                    self.settled();
                    Ok(())
                }
                Err(e) => match p.abort().await {
                    Aborted::Yes => {
                        self.settled();
                        Err(e)
                    }
                    // No such upload after its completion was sent: completed, its
                    // answer lost, if the object holds what was sent (crash finding: a
                    // close failed EIO while the store had replaced the object).
                    Aborted::Gone if p.landed().await => {
                        tracing::info!(path = %self.path, "the upload's completion was lost on the way back, not refused: it landed");
                        self.settled();
                        Ok(())
                    }
                    Aborted::Gone => {
                        self.settled();
                        Err(e)
                    }
                    Aborted::Failed => Err(e),
                },
            },
            Some(Sink::Whole(parts)) => {
                // `finish` aborts the upload itself when a part or the completion fails;
                // a timeout drops it, and its record lets the next start abort it.
                tokio::time::timeout(self.budget, parts.finish())
                    .await
                    .map_err(|_| bounded_wait(&self.path, "completing the upload", self.budget))?
                    .map_err(|e| {
                        self.settled();
                        map_store_error(e, 1)
                    })?;
                self.settled();
                match self.local_file.take() {
                    Some((root, file)) => {
                        let synced = super::sync_local_file(root, file.clone()).await;
                        if synced.is_err() && self.new_object {
                            // Black-box finding: a 50 MB file's failed sync left the
                            // object, and the close's retry met EEXIST.
                            super::remove_unsynced(&file).await;
                        }
                        synced
                    }
                    None => Ok(()),
                }
            }
        }
    }

    /// Aborts the upload (its parts are deleted; errors are only logged, and the
    /// upload's record then stays for the next start).
    pub async fn abort(&mut self) {
        let result = match self.sink.take() {
            None => return,
            Some(Sink::Parts(mut p)) => {
                if p.abort().await != Aborted::Failed {
                    self.settled();
                }
                return;
            }
            Some(Sink::Whole(parts)) => parts.abort().await,
        };
        match result {
            Ok(()) => self.settled(),
            Err(e) => {
                tracing::warn!(path = %self.path, error = %e, "aborting a failed upload failed")
            }
        }
    }

    /// The upload completed or is gone from the store: its record goes.
    fn settled(&mut self) {
        if let Some(r) = self.recorded.take() {
            r.done();
        }
    }
}

/// Waits (within `budget`) until `object_store`'s upload has fewer than `in_flight`
/// parts on the wire.
async fn whole_room(
    parts: &mut WriteMultipart,
    in_flight: usize,
    budget: Duration,
    path: &str,
) -> Result<()> {
    tokio::time::timeout(budget, parts.wait_for_capacity(in_flight))
        .await
        .map_err(|_| bounded_wait(path, "a part", budget))
        .and_then(|r| r.map_err(|e| map_store_error(e, 1)))
}

impl PartSink {
    async fn put(&mut self, data: Bytes, in_flight: usize) -> Result<()> {
        self.pending_len += data.len();
        self.pending.push(data);
        while self.pending_len >= self.part_size {
            let part = self.take(self.part_size);
            self.send(part, in_flight).await?;
        }
        Ok(())
    }

    /// The first `n` queued bytes, as one payload (no copy).
    fn take(&mut self, n: usize) -> PutPayload {
        let mut out = Vec::new();
        let mut left = n;
        while left > 0 {
            let Some(first) = self.pending.first_mut() else {
                break;
            };
            if first.len() <= left {
                left -= first.len();
                out.push(self.pending.remove(0));
            } else {
                out.push(first.split_to(left));
                left = 0;
            }
        }
        self.pending_len -= n - left;
        PutPayload::from_iter(out)
    }

    /// Waits for room for one more part (see [`StreamingUpload::ready_for_part`]).
    async fn reserve(&mut self, in_flight: usize) -> Result<()> {
        while self.tasks.len() >= in_flight {
            self.join_one().await?;
        }
        if self.reserved.is_none() {
            self.reserved = self.slot().await?;
        }
        Ok(())
    }

    /// A permit of the shared bound (None: no bound).
    async fn slot(&self) -> Result<Option<tokio::sync::OwnedSemaphorePermit>> {
        match &self.slots {
            Some(s) => Ok(Some(s.clone().acquire_owned().await.map_err(|e| {
                CacheError::InvalidArgument(format!("upload slots closed: {e}"))
            })?)),
            None => Ok(None),
        }
    }

    /// Sends one part (retried on its own), after waiting for room.
    async fn send(&mut self, part: PutPayload, in_flight: usize) -> Result<()> {
        while self.tasks.len() >= in_flight {
            self.join_one().await?;
        }
        // A permit of the shared bound, held by the part's task until the store answered.
        let permit = match self.reserved.take() {
            Some(p) => Some(p),
            None => self.slot().await?,
        };
        let idx = self.next_idx;
        self.next_idx += 1;
        self.sent += part.content_length() as u64;
        let (store, location, id) = (self.store.clone(), self.location.clone(), self.id.clone());
        let (retry, label) = (self.retry.clone(), self.label.clone());
        let counts = self.counts.clone();
        self.tasks.spawn(async move {
            let part_id = retry_op(&retry, &label, Some(&counts.failed_attempts), || {
                store.put_part(&location, &id, idx, part.clone())
            })
            .await?;
            drop(permit);
            Ok((idx, part_id))
        });
        Ok(())
    }

    async fn join_one(&mut self) -> Result<()> {
        match self.tasks.join_next().await {
            Some(Ok(Ok(done))) => {
                self.done.push(done);
                Ok(())
            }
            Some(Ok(Err(e))) => Err(e),
            Some(Err(e)) => Err(CacheError::Store {
                attempts: 1,
                message: format!("{}: a part's task failed: {e}", self.location),
            }),
            None => Ok(()),
        }
    }

    async fn finish(&mut self) -> Result<()> {
        if self.pending_len > 0 || self.next_idx == 0 {
            let part = self.take(self.pending_len);
            self.send(part, usize::MAX).await?;
        }
        while !self.tasks.is_empty() {
            self.join_one().await?;
        }
        self.done.sort_by_key(|(idx, _)| *idx);
        let parts: Vec<PartId> = self.done.iter().map(|(_, p)| p.clone()).collect();
        let (store, location, id) = (&self.store, &self.location, &self.id);
        self.completing = true;
        retry_op(
            &self.retry,
            &self.label,
            Some(&self.counts.failed_attempts),
            || store.complete_multipart(location, id, parts.clone()),
        )
        .await?;
        Ok(())
    }

    /// Aborts the upload.
    async fn abort(&mut self) -> Aborted {
        self.tasks.abort_all();
        let (store, location, id) = (&self.store, &self.location, &self.id);
        match retry_op(
            &self.retry,
            &self.label,
            Some(&self.counts.failed_attempts),
            || store.abort_multipart(location, id),
        )
        .await
        {
            Ok(()) => Aborted::Yes,
            Err(CacheError::NotFound(_)) => Aborted::Gone,
            Err(e) => {
                tracing::warn!(path = %self.location, error = %e, "aborting a failed upload failed");
                Aborted::Failed
            }
        }
    }

    /// After its completion failed: whether it landed all the same, the object being
    /// exactly the bytes sent (asked only once the store knows no such upload).
    async fn landed(&self) -> bool {
        let Some((store, path)) = self.head.as_ref().filter(|_| self.completing) else {
            return false;
        };
        let mut read = None;
        for _ in 0..self.retry.attempts.max(1) {
            match tokio::time::timeout(
                self.retry.attempt_timeout,
                object_store::ObjectStoreExt::head(store.as_ref(), path),
            )
            .await
            {
                Ok(Ok(meta)) => {
                    read = Some(meta);
                    break;
                }
                Ok(Err(object_store::Error::NotFound { .. })) => return false,
                _ => {}
            }
        }
        read.is_some_and(|m| m.size == self.sent)
    }
}
