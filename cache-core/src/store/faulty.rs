//! A failure-injecting wrapper around any `ObjectStore`: added latency, a shared
//! bandwidth limit, error rates, and hangs. Reads of data (`get_opts`) and listings are
//! affected; writes pass through so tests can seed data, unless `writes_down` or
//! `fail_parts_after` says otherwise.
//!
//! The bandwidth model is a single link: each transfer of `n` bytes reserves `n / bw`
//! seconds on it, after whatever is already queued, so concurrent readers share the
//! bandwidth as they would share a NIC or a store's per-prefix limit.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::list::{PaginatedListOptions, PaginatedListResult, PaginatedListStore};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartId, MultipartUpload,
    ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use parking_lot::Mutex;

/// What to inject. All off by default.
#[derive(Clone, Debug, Default)]
pub struct FaultConfig {
    /// Added to every read and listing (models a store's time to first byte).
    pub latency: Duration,
    /// Shared bandwidth for read bodies, bytes per second (None: unlimited).
    pub bandwidth_bytes_per_sec: Option<u64>,
    /// Every n-th read fails with a transient (5xx-like) error (0: never).
    pub fail_every: u64,
    /// Every n-th read hangs until the caller's timeout (0: never).
    pub hang_every: u64,
    /// Reads of keys containing this text hang until the caller's timeout (one stuck
    /// object in a store that answers everything else).
    pub hang_key: Option<String>,
    /// All reads fail while set (a store that is down).
    pub down: bool,
    /// A key the store holds that `object_store` cannot name (as S3's `d//x`, with an
    /// empty segment): listing its directory level fails with `InvalidPath` (as the S3
    /// client fails the whole page), and a plain listing yields an error item for it
    /// (S3's client ends the listing there: `tests/tests/store_s3.rs` checks that case
    /// against a real server).
    pub bad_key: Option<String>,
    /// Every write (PUT, multipart start, part, completion, server-side copy) fails
    /// while set.
    pub writes_down: bool,
    /// Parts of a multipart upload after its first `n` fail (an upload that breaks
    /// midway), however often they are retried.
    pub fail_parts_after: Option<u64>,
    /// The first attempt to send every n-th part of an upload (by index) fails
    /// transiently (0: never): a part retried on its own gets through.
    pub part_fail_every: u64,
    /// Added to every part sent by index (a part's time on the wire).
    pub part_latency: Duration,
    /// Copies from a key containing this text fail (a server-side copy the store
    /// refuses), however often they are retried.
    pub fail_copy_of: Option<String>,
    /// Bodies stream in pieces of this many bytes, one each `trickle_every` after the
    /// response (a slow link whose bytes keep coming; 0: the body at once).
    pub trickle_bytes: usize,
    /// See `trickle_bytes`.
    pub trickle_every: Duration,
    /// A trickled body stops (hangs) after this many bytes of each response (0: never).
    pub trickle_stall_after: u64,
    /// Reads ignore `If-Match` (as a gateway or S3-compatible store that does not do
    /// conditional GETs): the current version answers whatever was asked for.
    pub ignore_if_match: bool,
    /// Answers name no ETag (heads, reads and listings; a gateway that drops the
    /// header), and reads ignore `If-Match` for want of one.
    pub drop_etags: bool,
    /// Reads' answers (not heads nor listings) name no ETag, and reads ignore
    /// `If-Match`: a gateway that drops the header from GETs only.
    pub drop_read_etags: bool,
    /// Reads' answers name no Last-Modified either (object_store reads it as the epoch).
    pub drop_read_dates: bool,
    /// A ranged read of a whole object is answered `200 OK` with no Content-Range, as
    /// object_store's HTTP clients then report it ("non-partial response").
    pub whole_range_not_partial: bool,
    /// Deletes panic inside the client library (as object_store does on a
    /// DeleteObjects answer naming the key in another spelling).
    pub panic_on_delete: bool,
    /// Listings come in pages of this many entries, each costing `latency` (0: one
    /// listing, one `latency`): a whole listing takes a page's latency per page, and
    /// the store answers paged listings ([`PaginatedListStore`], with a delimiter).
    pub list_page_keys: usize,
    /// A multipart completion is applied, and its answer lost on the way back (the
    /// caller sees an error; a retry finds no such upload).
    pub lose_completion_answers: bool,
    /// A rename is a copy and then a delete in one call, as object_store does it on
    /// S3 (no rename of its own): a lost delete answer fails the whole call.
    pub rename_as_copy_and_delete: bool,
    /// Paged listings answer this many empty pages with a token before the first page
    /// of keys (S3 may, scanning past deleted keys); a page asked with that token goes on.
    pub empty_list_pages: usize,
    /// Deletes of keys starting with this are refused as S3's DeleteObjects refuses a
    /// key a policy denies `s3:DeleteObject` on (a per-key `AccessDenied` in a 200).
    pub denied_delete: Option<String>,
    /// Reads and heads of this exact key are refused (403), while listings answer: a
    /// policy granting `s3:GetObject` on `bkt/data/*` only refuses `HEAD data`.
    pub denied_key: Option<String>,
    /// Every GET of this exact key answers its headers, then fails its body with an
    /// I/O error (a failing disk under a local store: each `read(2)` of the file EIO).
    pub body_error_key: Option<String>,
    /// Listings say each object is this many bytes shorter than it is, its ETag right
    /// (a listing index out of step with the objects).
    pub list_sizes_short_by: u64,
}

impl FaultConfig {
    /// Whether part `idx` (from 0) of any upload is refused however often it is sent.
    fn refuses_part(&self, idx: u64) -> bool {
        self.writes_down || self.fail_parts_after.is_some_and(|n| idx >= n)
    }
}

/// The error `object_store` gives for `key`, which it cannot name.
fn bad_key_error(key: &str) -> object_store::Error {
    object_store::Error::InvalidPath {
        source: object_store::path::Error::EmptySegment {
            path: key.to_string(),
        },
    }
}

/// Whether `key` lies under `prefix` (None: the root).
fn under(prefix: Option<&Path>, key: &str) -> bool {
    match prefix {
        None => true,
        Some(p) => key
            .strip_prefix(p.as_ref())
            .is_some_and(|rest| rest.starts_with('/')),
    }
}

/// See the module doc.
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    config: Arc<Mutex<FaultConfig>>,
    reads: AtomicU64,
    /// The next this-many reads fail with a transient error (see [`Self::fail_next`]).
    burst: AtomicU64,
    /// GETs still to answer with their body cut in half ([`Self::cut_next`]).
    cut: AtomicU64,
    /// Deletes still to apply and then lose the answer of ([`Self::lose_next_deletes`]).
    lost_deletes: Arc<AtomicU64>,
    link_free_at: Mutex<Option<Instant>>,
    gets: GetCounters,
    /// Multipart upload parts sent (not failed by injection).
    parts_put: Arc<AtomicU64>,
    /// Parts sent by index in progress now, and the most at once.
    parts_in_flight: AtomicU64,
    max_parts_in_flight: AtomicU64,
    /// Parts (upload id, index) whose first attempt was failed by `part_fail_every`.
    parts_failed_once: Mutex<std::collections::HashSet<(String, usize)>>,
    /// The inner store's multipart API, when it has one (see [`Self::with_parts`]).
    parts_inner: Option<Arc<dyn MultipartStore>>,
    /// Uploads completed: an abort of one finds no such upload, as on S3 (the
    /// in-memory store answers it Ok).
    completed: Mutex<std::collections::HashSet<String>>,
}

/// What the data GETs (not HEADs, not listings) through a [`FaultyStore`] looked like:
/// how many, how large, how many at once.
#[derive(Default)]
struct GetCounters {
    count: AtomicU64,
    bytes: AtomicU64,
    largest: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// Bytes asked for by the bounded ranged GETs in flight, and the most at once.
    in_flight_bytes: AtomicU64,
    max_in_flight_bytes: AtomicU64,
    /// Each GET's body size and GETs in flight when it started, in completion order.
    log: Mutex<Vec<(u64, u64)>>,
}

/// A snapshot of [`FaultyStore::gets`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GetStats {
    /// Data GETs that returned a body.
    pub count: u64,
    pub bytes: u64,
    /// The largest body of one GET.
    pub largest: u64,
    /// The most GETs in progress at once (injected failures included).
    pub max_in_flight: u64,
    /// The most bytes the bounded ranged GETs in progress asked for at once.
    pub max_in_flight_bytes: u64,
}

/// Counts a GET in flight while alive.
struct InFlightGet<'a>(&'a GetCounters);

impl<'a> InFlightGet<'a> {
    fn new(c: &'a GetCounters) -> (Self, u64) {
        let now = c.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        c.max_in_flight.fetch_max(now, Ordering::Relaxed);
        (InFlightGet(c), now)
    }
}

/// Counts a GET's asked-for bytes in flight while alive.
struct InFlightBytes<'a>(&'a GetCounters, u64);

impl<'a> InFlightBytes<'a> {
    fn new(c: &'a GetCounters, bytes: u64) -> Self {
        let now = c.in_flight_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        c.max_in_flight_bytes.fetch_max(now, Ordering::Relaxed);
        InFlightBytes(c, bytes)
    }
}

impl Drop for InFlightBytes<'_> {
    fn drop(&mut self) {
        self.0.in_flight_bytes.fetch_sub(self.1, Ordering::Relaxed);
    }
}

impl Drop for InFlightGet<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>, config: FaultConfig) -> Self {
        FaultyStore {
            inner,
            config: Arc::new(Mutex::new(config)),
            reads: AtomicU64::new(0),
            burst: AtomicU64::new(0),
            cut: AtomicU64::new(0),
            lost_deletes: Arc::default(),
            link_free_at: Mutex::new(None),
            gets: GetCounters::default(),
            parts_put: Arc::default(),
            parts_failed_once: Mutex::default(),
            parts_in_flight: AtomicU64::new(0),
            max_parts_in_flight: AtomicU64::new(0),
            parts_inner: None,
            completed: Mutex::default(),
        }
    }

    /// Whether a copy or rename out of `from` is refused (writes down, or
    /// `fail_copy_of` names it).
    fn refuses_moving(&self, from: &Path) -> bool {
        let c = self.config.lock();
        c.writes_down
            || c.fail_copy_of
                .as_deref()
                .is_some_and(|k| from.as_ref().contains(k))
    }

    /// The data GETs so far: count, bytes, largest, most at once.
    pub fn gets(&self) -> GetStats {
        let g = &self.gets;
        GetStats {
            count: g.count.load(Ordering::Relaxed),
            bytes: g.bytes.load(Ordering::Relaxed),
            largest: g.largest.load(Ordering::Relaxed),
            max_in_flight: g.max_in_flight.load(Ordering::Relaxed),
            max_in_flight_bytes: g.max_in_flight_bytes.load(Ordering::Relaxed),
        }
    }

    /// Each data GET so far, in completion order: its body size and how many GETs were
    /// in flight when it started (itself included).
    pub fn get_log(&self) -> Vec<(u64, u64)> {
        self.gets.log.lock().clone()
    }

    /// This store with the multipart API by part index of `inner` (the same store as
    /// its inner one), so that uploads may retry parts one by one through it.
    pub fn with_parts(mut self, inner: Arc<dyn MultipartStore>) -> Self {
        self.parts_inner = Some(inner);
        self
    }

    /// The most parts (sent by index) in progress at once so far.
    pub fn max_parts_in_flight(&self) -> u64 {
        self.max_parts_in_flight.load(Ordering::Relaxed)
    }

    /// Multipart upload parts sent to the inner store so far.
    pub fn parts_put(&self) -> u64 {
        self.parts_put.load(Ordering::Relaxed)
    }

    /// Changes the injected faults (e.g. take the store down mid-test).
    pub fn set_config(&self, config: FaultConfig) {
        *self.config.lock() = config;
    }

    /// Makes the next `n` reads fail with a transient (503-like) error: a run of errors
    /// in a row, as a store answering a fraction of requests with 5xx sometimes gives.
    pub fn fail_next(&self, n: u64) {
        self.burst.store(n, Ordering::Relaxed);
    }

    /// Makes the next `n` deletes happen and their answers be lost on the way back
    /// (the caller sees a transient error; the object is gone).
    pub fn lose_next_deletes(&self, n: u64) {
        self.lost_deletes.store(n, Ordering::Relaxed);
    }

    /// Makes the next `n` ranged GETs answer with half their body and a success (a
    /// connection closed early whose length agreed with what arrived).
    pub fn cut_next(&self, n: u64) {
        self.cut.store(n, Ordering::Relaxed);
    }

    /// Reads (gets and listings) seen so far, injected failures included.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// A server-side copy or rename takes `latency` too.
    async fn copy_latency(&self) {
        let latency = self.config.lock().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    /// Applies latency and the injected failure for one read; returns the config.
    async fn before_read(&self, location: &str) -> object_store::Result<FaultConfig> {
        let n = self.reads.fetch_add(1, Ordering::Relaxed) + 1;
        let cfg = self.config.lock().clone();
        if !cfg.latency.is_zero() {
            tokio::time::sleep(cfg.latency).await;
        }
        let in_burst = self
            .burst
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
            .is_ok();
        if in_burst || cfg.down || (cfg.fail_every > 0 && n.is_multiple_of(cfg.fail_every)) {
            return Err(injected(location, "injected 503 Service Unavailable"));
        }
        let stuck = cfg
            .hang_key
            .as_deref()
            .is_some_and(|k| location.contains(k));
        if stuck || (cfg.hang_every > 0 && n.is_multiple_of(cfg.hang_every)) {
            // Hang "forever": the caller's per-attempt timeout must cut this short.
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Ok(cfg)
    }

    /// Waits for `bytes` to cross the shared link.
    async fn transfer(&self, bytes: u64, cfg: &FaultConfig) {
        let Some(bw) = cfg.bandwidth_bytes_per_sec.filter(|b| *b > 0) else {
            return;
        };
        let cost = Duration::from_secs_f64(bytes as f64 / bw as f64);
        let done = {
            let mut free = self.link_free_at.lock();
            let now = Instant::now();
            let start = free.map_or(now, |f| f.max(now));
            let done = start + cost;
            *free = Some(done);
            done
        };
        tokio::time::sleep_until(done.into()).await;
    }
}

#[async_trait]
impl MultipartStore for FaultyStore {
    async fn create_multipart(&self, path: &Path) -> object_store::Result<MultipartId> {
        if self.config.lock().writes_down {
            return Err(injected(path.as_ref(), "injected 503 on upload start"));
        }
        self.parts_api()?.create_multipart(path).await
    }

    async fn put_part(
        &self,
        path: &Path,
        id: &MultipartId,
        part_idx: usize,
        data: PutPayload,
    ) -> object_store::Result<PartId> {
        let cfg = self.config.lock().clone();
        let first_try_fails = cfg.part_fail_every > 0
            && (part_idx as u64).is_multiple_of(cfg.part_fail_every)
            && self.parts_failed_once.lock().insert((id.clone(), part_idx));
        if cfg.refuses_part(part_idx as u64) || first_try_fails {
            return Err(injected(path.as_ref(), "injected 503 on a part"));
        }
        let now = self.parts_in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_parts_in_flight.fetch_max(now, Ordering::Relaxed);
        if !cfg.part_latency.is_zero() {
            tokio::time::sleep(cfg.part_latency).await;
        }
        let part = self.parts_api()?.put_part(path, id, part_idx, data).await;
        self.parts_in_flight.fetch_sub(1, Ordering::Relaxed);
        let part = part?;
        self.parts_put.fetch_add(1, Ordering::Relaxed);
        Ok(part)
    }

    async fn complete_multipart(
        &self,
        path: &Path,
        id: &MultipartId,
        parts: Vec<PartId>,
    ) -> object_store::Result<PutResult> {
        if self.config.lock().writes_down {
            return Err(injected(path.as_ref(), "injected 503 on completion"));
        }
        let done = self.parts_api()?.complete_multipart(path, id, parts).await;
        if done.is_ok() {
            self.completed.lock().insert(id.clone());
        }
        if done.is_ok() && self.config.lock().lose_completion_answers {
            return Err(injected(
                path.as_ref(),
                "injected: the completion's answer lost",
            ));
        }
        done
    }

    async fn abort_multipart(&self, path: &Path, id: &MultipartId) -> object_store::Result<()> {
        if self.completed.lock().contains(id) {
            return Err(object_store::Error::NotFound {
                path: path.to_string(),
                source: "NoSuchUpload: completed".into(),
            });
        }
        self.parts_api()?.abort_multipart(path, id).await
    }
}

impl FaultyStore {
    fn parts_api(&self) -> object_store::Result<&Arc<dyn MultipartStore>> {
        self.parts_inner
            .as_ref()
            .ok_or_else(|| object_store::Error::NotSupported {
                source: "this FaultyStore was built without with_parts".into(),
            })
    }
}

/// A multipart upload through a [`FaultyStore`]: its parts and completion fail as the
/// store's config says at the time they are sent.
#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    location: String,
    config: Arc<Mutex<FaultConfig>>,
    parts: u64,
    sent: Arc<AtomicU64>,
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> object_store::UploadPart {
        let idx = self.parts;
        self.parts += 1;
        if self.config.lock().refuses_part(idx) {
            let e = injected(&self.location, "injected 503 on a part");
            return Box::pin(async move { Err(e) });
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        if self.config.lock().writes_down {
            return Err(injected(&self.location, "injected 503 on completion"));
        }
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

fn injected(location: &str, msg: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: format!("{location}: {msg}").into(),
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if self.config.lock().writes_down {
            return Err(injected(location.as_ref(), "injected 503 on PUT"));
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        if self.config.lock().writes_down {
            return Err(injected(location.as_ref(), "injected 503 on upload start"));
        }
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultyUpload {
            inner,
            location: location.to_string(),
            config: self.config.clone(),
            parts: 0,
            sent: self.parts_put.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let head = options.head;
        let in_flight = (!head).then(|| InFlightGet::new(&self.gets));
        let asked = match &options.range {
            Some(object_store::GetRange::Bounded(r)) if !head => r.end - r.start,
            _ => 0,
        };
        let _asked = InFlightBytes::new(&self.gets, asked);
        let cfg = self.before_read(location.as_ref()).await?;
        if cfg.denied_key.as_deref() == Some(location.as_ref()) {
            return Err(object_store::Error::PermissionDenied {
                path: location.to_string(),
                source: "403 Forbidden: AccessDenied".into(),
            });
        }
        let mut options = options;
        if cfg.ignore_if_match || cfg.drop_etags || cfg.drop_read_etags {
            options.if_match = None;
        }
        if let (true, Some(object_store::GetRange::Bounded(r))) =
            (cfg.whole_range_not_partial && !head, &options.range)
        {
            let size = object_store::ObjectStoreExt::head(&*self.inner, location)
                .await?
                .size;
            if r.start == 0 && r.end == size {
                return Err(object_store::Error::Generic {
                    store: "S3",
                    source: "Received non-partial response when range requested".into(),
                });
            }
        }
        let mut result = self.inner.get_opts(location, options).await?;
        if cfg.drop_etags || (cfg.drop_read_etags && !head) {
            result.meta.e_tag = None;
        }
        if cfg.drop_read_dates && !head {
            result.meta.last_modified = Default::default();
        }
        if head {
            return Ok(result);
        }
        // Buffer the body so the bandwidth model sees its size, then hand it back.
        let meta = result.meta.clone();
        let range: Range<u64> = result.range.clone();
        let attributes = result.attributes.clone();
        let extensions = result.extensions.clone();
        let mut body: Bytes = result.bytes().await?;
        let cut = self
            .cut
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_sub(1))
            .is_ok();
        if cut {
            body.truncate(body.len() / 2);
        }
        self.transfer(body.len() as u64, &cfg).await;
        let g = &self.gets;
        g.count.fetch_add(1, Ordering::Relaxed);
        g.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        g.largest.fetch_max(body.len() as u64, Ordering::Relaxed);
        let at_start = in_flight.as_ref().map_or(0, |(_, n)| *n);
        g.log.lock().push((body.len() as u64, at_start));
        let body_fails = cfg.body_error_key.as_deref() == Some(location.as_ref());
        let stream: BoxStream<'static, object_store::Result<Bytes>> = if body_fails {
            Box::pin(futures::stream::once(async move {
                Err(object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: Box::new(std::io::Error::from_raw_os_error(libc::EIO)),
                })
            }))
        } else if cfg.trickle_bytes > 0 {
            let (every, piece, stall) = (
                cfg.trickle_every,
                cfg.trickle_bytes,
                cfg.trickle_stall_after,
            );
            Box::pin(futures::stream::unfold(
                (body, 0u64),
                move |(mut rest, sent)| async move {
                    if rest.is_empty() {
                        return None;
                    }
                    if stall > 0 && sent >= stall {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    tokio::time::sleep(every).await;
                    let chunk = rest.split_to(piece.min(rest.len()));
                    let sent = sent + chunk.len() as u64;
                    Some((Ok(chunk), (rest, sent)))
                },
            ))
        } else {
            Box::pin(futures::stream::once(async move { Ok(body) }))
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(Box::pin(stream)),
            meta,
            range,
            attributes,
            extensions,
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        if self.config.lock().panic_on_delete {
            panic!("injected: a delete answer the client library cannot match");
        }
        if let Some(denied) = self.config.lock().denied_delete.clone() {
            let inner = self.inner.clone();
            return Box::pin(futures::StreamExt::then(locations, move |r| {
                let (inner, denied) = (inner.clone(), denied.clone());
                async move {
                    let p = r?;
                    if p.as_ref().starts_with(&denied) {
                        return Err(object_store::Error::Generic {
                            store: "S3",
                            source: format!(
                                "DeleteObjects request failed for key {p}: Access Denied (code: AccessDenied)"
                            )
                            .into(),
                        });
                    }
                    object_store::ObjectStoreExt::delete(&*inner, &p)
                        .await
                        .map(|()| p)
                }
            }));
        }
        let lost = self.lost_deletes.clone();
        Box::pin(futures::StreamExt::map(
            self.inner.delete_stream(locations),
            move |r| match r {
                Ok(p)
                    if lost
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                        .is_ok() =>
                {
                    Err(injected(p.as_ref(), "injected: the delete's answer lost"))
                }
                r => r,
            },
        ))
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let cfg = self.config.lock().clone();
        if cfg.down {
            let err = injected(
                prefix.map(|p| p.as_ref()).unwrap_or(""),
                "injected 503 Service Unavailable",
            );
            return Box::pin(futures::stream::once(async move { Err(err) }));
        }
        match cfg.bad_key {
            Some(k) if under(prefix, &k) => {
                let bad = futures::stream::once(async move { Err(bad_key_error(&k)) });
                Box::pin(futures::StreamExt::chain(self.inner.list(prefix), bad))
            }
            _ if cfg.drop_etags => {
                Box::pin(futures::StreamExt::map(self.inner.list(prefix), |m| {
                    m.map(|mut m| {
                        m.e_tag = None;
                        m
                    })
                }))
            }
            _ => self.inner.list(prefix),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let cfg = self
            .before_read(prefix.map(|p| p.as_ref()).unwrap_or(""))
            .await?;
        match cfg.bad_key {
            Some(k) if under(prefix, &k) => Err(bad_key_error(&k)),
            _ => {
                let mut listed = self.inner.list_with_delimiter(prefix).await?;
                if cfg.list_page_keys > 0 {
                    let n = listed.objects.len() + listed.common_prefixes.len();
                    let pages = n.div_ceil(cfg.list_page_keys).max(1) as u32;
                    tokio::time::sleep(cfg.latency * (pages - 1)).await;
                }
                if cfg.drop_etags {
                    listed.objects.iter_mut().for_each(|m| m.e_tag = None);
                }
                listed
                    .objects
                    .iter_mut()
                    .for_each(|m| m.size = m.size.saturating_sub(cfg.list_sizes_short_by));
                Ok(listed)
            }
        }
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        if self.refuses_moving(from) {
            return Err(injected(from.as_ref(), "injected 503 on copy"));
        }
        self.copy_latency().await;
        self.inner.copy_opts(from, to, options).await
    }

    /// The inner store's own rename (a local directory's `rename(2)`, which leaves the
    /// source's folder behind where a delete removes it), refused as a copy would be.
    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        if self.refuses_moving(from) {
            return Err(injected(from.as_ref(), "injected 503 on rename"));
        }
        if self.config.lock().rename_as_copy_and_delete {
            let mode = match options.target_mode {
                object_store::RenameTargetMode::Create => object_store::CopyMode::Create,
                _ => object_store::CopyMode::Overwrite,
            };
            self.copy_opts(from, to, CopyOptions::new().with_mode(mode))
                .await?;
            return object_store::ObjectStoreExt::delete(self, from).await;
        }
        self.copy_latency().await;
        self.inner.rename_opts(from, to, options).await
    }
}

/// One page of a listing with a delimiter, `latency` each (see
/// [`FaultConfig::list_page_keys`]): entries in name order after the offset.
#[async_trait::async_trait]
impl PaginatedListStore for FaultyStore {
    async fn list_paginated(
        &self,
        prefix: Option<&str>,
        opts: PaginatedListOptions,
    ) -> object_store::Result<PaginatedListResult> {
        let cfg = self.before_read(prefix.unwrap_or("")).await?;
        let empties_sent = match opts
            .page_token
            .as_deref()
            .and_then(|t| t.strip_prefix("empty-"))
        {
            Some(n) => n.parse::<usize>().unwrap_or(0),
            None if opts.offset.is_none() => 0,
            None => cfg.empty_list_pages,
        };
        if empties_sent < cfg.empty_list_pages {
            return Ok(PaginatedListResult {
                result: ListResult {
                    common_prefixes: Vec::new(),
                    objects: Vec::new(),
                    extensions: Default::default(),
                },
                page_token: Some(format!("empty-{}", empties_sent + 1)),
            });
        }
        if opts.delimiter.is_none() {
            return Err(object_store::Error::NotImplemented {
                operation: "a paged listing without a delimiter".into(),
                implementer: "FaultyStore".into(),
            });
        }
        let dir = prefix
            .map(|p| p.trim_end_matches('/'))
            .filter(|p| !p.is_empty())
            .map(Path::from);
        let level = self.inner.list_with_delimiter(dir.as_ref()).await?;
        let mut entries: Vec<(String, Option<ObjectMeta>)> = level
            .objects
            .into_iter()
            .map(|m| (m.location.to_string(), Some(m)))
            .chain(
                level
                    .common_prefixes
                    .into_iter()
                    .map(|p| (format!("{p}/"), None)),
            )
            .filter(|(name, _)| opts.offset.as_ref().is_none_or(|o| name > o))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let page = opts.max_keys.unwrap_or(1000).min(cfg.list_page_keys.max(1));
        let more = entries.len() > page;
        entries.truncate(page);
        let mut result = ListResult {
            common_prefixes: Vec::new(),
            objects: Vec::new(),
            extensions: Default::default(),
        };
        for (name, meta) in entries {
            match meta {
                Some(mut m) => {
                    m.size = m.size.saturating_sub(cfg.list_sizes_short_by);
                    result.objects.push(m)
                }
                None => result
                    .common_prefixes
                    .push(Path::from(name.trim_end_matches('/'))),
            }
        }
        Ok(PaginatedListResult {
            result,
            page_token: more.then(|| "more".to_string()),
        })
    }
}
