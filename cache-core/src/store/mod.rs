//! The backing object store: whatever `object_store` reaches (local directory,
//! in-memory, S3 with a custom endpoint, GCS, Azure), chosen by URL, behind one retry
//! and timeout policy so that no backend can hang a reader or return a wrong byte.
//!
//! - Each attempt has a deadline (`attempt_timeout`); timeouts and transient errors
//!   (5xx, connection resets: `object_store::Error::Generic`) are retried with
//!   exponential backoff up to `attempts` times, then a clear [`CacheError`] is
//!   returned. Cloud clients' own retries are turned off so this is the only policy.
//! - Reads of one object name its version (ETag, sent as `If-Match`): an object that
//!   changes mid-read fails with [`CacheError::Changed`] instead of mixing versions.
//! - A `file://` store does not follow symlinks out of its root (unless
//!   [`StoreOptions::follow_symlinks`]): such entries are left out of listings (with a
//!   warning) and are not found by `head` or reads, so a link planted in a dataset
//!   cannot expose files outside it. Links that stay inside the root work.
//! - A key the client library cannot name (S3's `d//x`, `d/./x`, a control character)
//!   costs that key, not its directory: the listing is redone in pages that step
//!   around it (`listing.rs`), the key skipped with a warning.
//! - [`faulty::FaultyStore`] wraps any store to inject latency, bandwidth limits,
//!   errors and hangs, for tests and for the cold-read benchmarks.
//!
//! This file holds the handle ([`BackingStore`]): its construction from a URL, its
//! counters and the retry wrapper every request goes through. Its operations, by kind:
//! `reads.rs` (metadata and ranged reads), `folders.rs` (listings), `writes.rs` (puts,
//! uploads, renames, copies, deletes), `names.rs` (what names a store can hold). Beside
//! them: `retry.rs` (the retry loop and how errors are told apart), `version.rs` (version
//! tags and the pin a read's answers must match), `pieces.rs` (a ranged read's body
//! in pieces), `listing.rs` (paged listings around unnameable keys), `local.rs` (a
//! `file://` store's own rules), `cloud.rs` (the S3/GCS/Azure clients), `upload.rs`
//! (multipart uploads), `journal.rs` (uploads left by a crash), `probe.rs` (the start's
//! check that the store answers).

mod cloud;
pub mod faulty;
mod folders;
mod journal;
mod listing;
mod local;
mod names;
mod pieces;
mod probe;
mod reads;
mod retry;
mod upload;
mod version;
mod writes;

pub use cloud::CLOUD_KEY_MAX;
pub use journal::{LeftUpload, UploadJournal, UploadRecord};
pub use names::folder_prefix_problem;
pub use probe::Probe;
pub use upload::{StreamingUpload, UploadShape, MAX_UPLOAD_PARTS};

use cloud::{check_endpoint, cloud_store};
use local::{
    folder_inside_root, folder_link_in, inside_root, local_info, local_infos, local_len_fits,
    local_level, local_path_fits, local_stat, local_walk, regular_local_file, remove_local_temp,
    remove_unsynced, sync_local_dirs, sync_local_file, upload_in_progress_name, LOCAL_NAME_MAX,
};
use pieces::{BodyError, Piece, PieceSink};
use retry::{map_store_error, not_partial, retry_op};
use version::{bare_etag, etag_of, info_from_meta, VersionPin};

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ListResult, ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::{CacheError, Result};

/// Retry and timeout policy for store requests.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Total attempts per request (1 = no retry). 8: a sick store answering 30% of
    /// requests with 5xx (issue 12's chaos figure) fails a request only when 8 answers
    /// in a row are errors (0.3^8, about 1 in 15,000); with 4 attempts about 1 request
    /// in 120 failed and `strata bench chaos` saw reads fail with the store up. A store
    /// that is really down still fails a caller within `max_backoff`-bounded seconds.
    pub attempts: u32,
    /// Backoff before the first retry, doubled each time (50 ms -> 100 -> 200 ...).
    pub base_backoff: Duration,
    /// Cap of one backoff. 1 s: with 8 attempts a request gives up after about 3.6 s
    /// of backoff (50+100+200+400+800+1000+1000 ms), a bounded stall for a FUSE reader.
    pub max_backoff: Duration,
    /// Deadline of one attempt. 30 s: a 64 MiB range at a slow 5 MB/s still fits, and
    /// FUSE readers get EIO within a few minutes at worst, never a hang.
    pub attempt_timeout: Duration,
    /// Deadline of a whole request, retries included. 40 s: one full attempt and a
    /// shorter second one. A FUSE request waiting on the store cannot be interrupted
    /// (fuser takes no FUSE_INTERRUPT, and even SIGKILL waits for the answer of a
    /// request the daemon already read), so a store that stopped answering must fail it
    /// within a bound a person waits out; 8 attempts of 30 s held `ls` for 4 minutes.
    pub total_timeout: Duration,
    /// How long requests then fail at once, after the store let a whole request's
    /// deadline pass without an answer. 10 s: during an outage each FUSE request would
    /// otherwise wait the whole deadline, uninterruptibly (`ls -l` of 100 uncached
    /// names: an hour); the store is asked again soon enough that a short outage costs
    /// seconds.
    pub silent_pause: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            base_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            attempt_timeout: Duration::from_secs(30),
            total_timeout: Duration::from_secs(40),
            silent_pause: Duration::from_secs(10),
        }
    }
}

/// Connection options for cloud stores (S3-compatible endpoints in particular).
#[derive(Clone, Debug, Default)]
pub struct StoreOptions {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Allow plain-HTTP endpoints (local test servers).
    pub allow_http: bool,
    /// `file://` stores: follow symlinks that lead out of the root (off: such entries
    /// are invisible, and writes, renames and deletes through them are refused).
    pub follow_symlinks: bool,
    /// Further backend config keys, as `object_store` names them (e.g. `aws_session_token`).
    pub extra: Vec<(String, String)>,
    pub retry: RetryPolicy,
}

/// An object as listed or headed: its size and the version tag that names its blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Path relative to the store root (no leading slash).
    pub path: Arc<str>,
    pub size: u64,
    /// ETag when the store has one, else a tag derived from mtime and size.
    pub version: Arc<str>,
    /// Whether `version` is a real ETag (and so can be sent as `If-Match`).
    pub has_etag: bool,
    pub last_modified_unix_ns: i64,
    /// Block size of the layout the listing handle reads in: an [`crate::ObjectReader`]'s
    /// store handle ([`crate::ObjectReader::store`]) sets its own, so
    /// [`crate::ObjectReader::block_key`] names blocks of that layout; a plain handle
    /// says [`crate::DEFAULT_BLOCK_SIZE`].
    pub block_size: u64,
}

/// One level of a directory-style listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirListing {
    /// Sub-directory names (no trailing slash, relative to the listed directory).
    pub dirs: Vec<String>,
    pub files: Vec<ObjectInfo>,
    /// Whether the store shows the directory itself, even with nothing in it: a local
    /// folder, or an S3 "folder marker" (a key ending in `/`, which the console makes).
    pub exists: bool,
}

/// The object store behind the cache.
#[derive(Clone)]
pub struct BackingStore {
    store: Arc<dyn ObjectStore>,
    label: String,
    /// The service a cloud URL was opened at, when not the provider's own (`--endpoint`).
    endpoint: Option<Arc<str>>,
    retry: RetryPolicy,
    /// Written into every [`ObjectInfo`] this handle returns.
    block_size: u64,
    /// The root directory of a `file://` store: versions of its files are taken from
    /// our own `stat` (see [`local_version`]), not only from `object_store`'s ETag.
    local_root: Option<Arc<std::path::Path>>,
    /// A `file://` store's folders are read directly (`local_level`), not through
    /// object_store's walk; off for a handle [`Self::around`] another store (a
    /// fault-injecting wrapper: its listings must go through it).
    reads_folders_itself: bool,
    /// See [`StoreOptions::follow_symlinks`].
    follow_symlinks: bool,
    /// The longest key this handle may name, in bytes, its prefix taken off (S3, GCS and
    /// Azure take keys of at most [`CLOUD_KEY_MAX`] bytes); None: no such limit.
    key_max: Option<usize>,
    /// Ranged GETs that returned data and their bytes, shared by every clone of this
    /// handle (the cache group's "fetched from the store once" is read from these).
    reads: Arc<StoreReads>,
    /// Requests this handle's lineage sent or failed (see [`Self::with_own_counts`]).
    counts: Arc<HandleCounts>,
    /// Until when requests fail at once: the store let a whole request's deadline pass
    /// without an answer (see [`RetryPolicy::silent_pause`]). Shared by every clone.
    silent_until: Arc<parking_lot::Mutex<Option<tokio::time::Instant>>>,
    /// When the store last answered a request (any answer), in [`since_start`]
    /// nanoseconds: a request that timed out while others were answered says that
    /// object is stuck, not the store. Shared by every clone.
    answered_at: Arc<std::sync::atomic::AtomicU64>,
    /// The store's multipart API by part index, with this handle's prefix, where it
    /// has one: uploads then retry each part on its own (see `upload`).
    part_store: Option<(Arc<dyn object_store::multipart::MultipartStore>, String)>,
    /// Where uploads in progress are recorded (a writable mount's; see
    /// [`UploadJournal`]).
    journal: Option<Arc<UploadJournal>>,
    /// Paged listing (S3, GCS), to list around keys object_store cannot name (see
    /// `listing.rs`).
    paged: Option<Arc<listing::PagedLister>>,
    /// The store's create-only copy leaves the source's headers and metadata behind
    /// (S3's multipart copy: its CreateMultipartUpload names none), so a rename of an
    /// object that carries some goes another way (see `writes::create_only`).
    create_only_copy_drops_metadata: bool,
}

/// Metadata requests a [`BackingStore`] handle sent (each attempt, each page: what the
/// store receives and bills), its requests that failed after their retries, and every
/// attempt the store failed (retried or not).
#[derive(Debug, Default)]
pub(super) struct HandleCounts {
    failed: std::sync::atomic::AtomicU64,
    pub(super) failed_attempts: std::sync::atomic::AtomicU64,
    heads: std::sync::atomic::AtomicU64,
    lists: std::sync::atomic::AtomicU64,
}

impl HandleCounts {
    /// Counts `result` as a failed request if it is the store failing one after its
    /// retries, or refusing it (403, an archived object): not an answer the caller asked
    /// for (absent, changed, exists), nor a local error. A refused attempt counted as a
    /// failed attempt while its request was no failure read as retries that won
    /// (black-box finding: reads of GLACIER objects showed 6 failed attempts, 0
    /// failures).
    fn note<T>(&self, result: &Result<T>) {
        if matches!(
            result,
            Err(CacheError::Store { .. }
                | CacheError::StoreTimeout { .. }
                | CacheError::PermissionDenied(_))
        ) {
            self.failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Counters of a [`BackingStore`]'s successful data reads.
#[derive(Debug, Default)]
pub struct StoreReads {
    pub gets: std::sync::atomic::AtomicU64,
    pub bytes: std::sync::atomic::AtomicU64,
}

impl StoreReads {
    fn count(&self, bytes: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.gets.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
    }
}

impl std::fmt::Debug for BackingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackingStore")
            .field("label", &self.label)
            .finish()
    }
}

impl BackingStore {
    /// Wraps an existing store (tests, fault injection).
    pub fn new(store: Arc<dyn ObjectStore>, label: impl Into<String>, retry: RetryPolicy) -> Self {
        BackingStore {
            store,
            label: label.into(),
            endpoint: None,
            retry,
            block_size: crate::DEFAULT_BLOCK_SIZE,
            local_root: None,
            reads_folders_itself: false,
            follow_symlinks: false,
            key_max: None,
            reads: Arc::default(),
            counts: Arc::default(),
            silent_until: Arc::default(),
            answered_at: Arc::default(),
            part_store: None,
            paged: None,
            journal: None,
            create_only_copy_drops_metadata: false,
        }
    }

    /// This handle's settings (a local directory's checks and names) around another
    /// view of its store, which then takes every request (uploads too): a
    /// fault-injecting wrapper in tests.
    pub fn around(&self, store: Arc<dyn ObjectStore>, retry: RetryPolicy) -> Self {
        BackingStore {
            store,
            retry,
            reads: Arc::default(),
            counts: Arc::default(),
            silent_until: Arc::default(),
            answered_at: Arc::default(),
            part_store: None,
            // Paged listings went to the store beside the wrapper, past its faults, as
            // a local folder's direct reads would.
            paged: None,
            reads_folders_itself: false,
            ..self.clone()
        }
    }

    /// This handle with uploads sent part by part through `parts` (the same store as
    /// the handle's, seen through its multipart API), under `prefix`.
    pub fn with_part_store(
        mut self,
        parts: Arc<dyn object_store::multipart::MultipartStore>,
        prefix: &str,
    ) -> Self {
        self.part_store = Some((parts, prefix.trim_matches('/').to_string()));
        self
    }

    /// This handle with its uploads recorded in `journal` while they are in progress,
    /// so the next start can abort those a crash cut off ([`Self::abort_left`]).
    pub fn with_upload_journal(mut self, journal: Arc<UploadJournal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// Requests through this handle or its clones that failed after their retries
    /// (a missing object is an answer, not a failure), multipart uploads counted as
    /// one request; since [`Self::with_own_counts`], this handle's only.
    pub fn failures(&self) -> u64 {
        self.counts
            .failed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Attempts the store failed through this handle or its clones (an error or no
    /// answer in time), those later retried to success included: a store throttling
    /// or failing while the retries still win shows here, not in [`Self::failures`].
    pub fn failed_attempts(&self) -> u64 {
        self.counts
            .failed_attempts
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// HEAD requests through this handle or its clones (each attempt; a local store's
    /// stat of an object counts as one).
    pub fn heads(&self) -> u64 {
        self.counts.heads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// LIST requests through this handle or its clones (each page, each attempt).
    pub fn lists(&self) -> u64 {
        self.counts.lists.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This handle (and its clones from now on) counts its requests apart from the
    /// handle it came from: a mount's, among the daemon's mounts of one store
    /// (black-box findings: one mount's failed GETs showed in every mount's
    /// `store_failures`; HEADs and LISTs of writes, renames and removals were
    /// missing from the mount's counts).
    pub fn with_own_counts(mut self) -> Self {
        self.counts = Arc::default();
        self
    }

    fn count_failure(&self) {
        self.counts
            .failed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn count_head(&self) {
        self.counts
            .heads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn count_lists(&self, pages: u64) {
        self.counts
            .lists
            .fetch_add(pages, std::sync::atomic::Ordering::Relaxed);
    }

    /// Ranged GETs that returned data through this handle or its clones, and their
    /// bytes.
    pub fn read_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.reads.gets.load(Relaxed),
            self.reads.bytes.load(Relaxed),
        )
    }

    /// This handle with `block_size` written into the [`ObjectInfo`]s it returns (what
    /// [`crate::ObjectReader::new`] does to its handle).
    pub fn with_block_size(mut self, block_size: u64) -> Self {
        self.block_size = block_size;
        self
    }

    /// Opens a store by URL: `file:///data`, `memory://`, `s3://bucket/prefix`,
    /// `gs://bucket/prefix`, `az://container/prefix`.
    pub fn from_url(url: &str, opts: &StoreOptions) -> Result<Self> {
        let bad = |why: String| CacheError::InvalidArgument(format!("store URL {url:?}: {why}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected scheme://...".into()))?;
        let mut local_root = None;
        let mut endpoint = None;
        let mut part_store: Option<Arc<dyn object_store::multipart::MultipartStore>> = None;
        let mut paged_store: Option<Arc<dyn object_store::list::PaginatedListStore>> = None;
        let mut create_only_copy_drops_metadata = false;
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match scheme {
            "file" => {
                let dir = std::path::Path::new(rest);
                if !dir.is_dir() {
                    return Err(bad(format!("{} is not a directory", dir.display())));
                }
                let dir = dir.canonicalize().map_err(|e| bad(e.to_string()))?;
                // Deletes remove the directories they leave empty: an object store has
                // no directories, and a listing would show an emptied one forever.
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| bad(e.to_string()))?
                    .with_automatic_cleanup(true);
                local_root = Some(Arc::from(dir.as_path()));
                (Arc::new(fs), String::new())
            }
            "memory" => {
                let m = Arc::new(object_store::memory::InMemory::new());
                part_store = Some(m.clone());
                (m, rest.trim_matches('/').to_string())
            }
            "s3" | "gs" | "az" => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(bad("missing bucket".into()));
                }
                if let Some(e) = &opts.endpoint {
                    check_endpoint(e, opts.allow_http).map_err(bad)?;
                }
                let ((store, parts, paged), at, multipart_copies) =
                    cloud_store(scheme, bucket, opts).map_err(|e| bad(e.to_string()))?;
                create_only_copy_drops_metadata = multipart_copies;
                part_store = Some(parts);
                paged_store = paged;
                endpoint = at.filter(|e| !e.is_empty()).map(Arc::from);
                (store, prefix.trim_matches('/').to_string())
            }
            other => return Err(bad(format!("unsupported scheme {other:?}"))),
        };
        // A prefix names a folder of the store: an empty, `.` or `..` segment names none
        // (black-box finding: `s3://b/a//b` listed `a//b/`, nothing, and wrote `a/b/`;
        // `s3://b/dot/../` wrote under `dot/%2E%2E/`; an empty shell variable in a
        // mount URL makes the first).
        if let Some(why) = folder_prefix_problem(&prefix) {
            return Err(bad(format!("prefix {prefix:?}: {why}")));
        }
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            store
        } else {
            // The prefix as text too (see `object_key`): the part store's keys are
            // built from the same string.
            Arc::new(object_store::prefix::PrefixStore::new(
                store,
                object_key(&prefix),
            ))
        };
        let key_max = matches!(scheme, "s3" | "gs" | "az").then(|| {
            let taken = if prefix.is_empty() {
                0
            } else {
                prefix.len() + 1
            };
            CLOUD_KEY_MAX.saturating_sub(taken)
        });
        Ok(BackingStore {
            store,
            label: url.to_string(),
            endpoint,
            retry: opts.retry.clone(),
            block_size: crate::DEFAULT_BLOCK_SIZE,
            reads_folders_itself: local_root.is_some(),
            local_root,
            follow_symlinks: opts.follow_symlinks,
            key_max,
            reads: Arc::default(),
            counts: Arc::default(),
            silent_until: Arc::default(),
            answered_at: Arc::default(),
            paged: paged_store.map(|p| Arc::new(listing::PagedLister::new(p, &prefix))),
            part_store: part_store.map(|p| (p, prefix)),
            journal: None,
            create_only_copy_drops_metadata,
        })
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// This handle as one opened at `endpoint` (what [`Self::from_url`] records from
    /// `--endpoint`): its [`Self::identity`] names it.
    pub fn at_endpoint(mut self, endpoint: &str) -> Self {
        self.endpoint = Some(Arc::from(endpoint));
        self
    }

    /// Which store this is, for what is kept for it across runs (listing logs, fsync
    /// records) and checked between group nodes: the URL, and the service it is at
    /// when not the provider's own. A bucket of one name at another endpoint is another
    /// store (black-box finding: a cache dir's listing log of `s3://b` at one S3
    /// service was shown, with its blocks, as `s3://b` at another that was down).
    pub fn identity(&self) -> String {
        match &self.endpoint {
            Some(e) => format!("{} at {e}", self.label),
            None => self.label.clone(),
        }
    }

    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Whether this is a local directory store (`file://`), whose folders are real.
    /// The root of a `file://` store whose folders this handle reads itself (see
    /// `reads_folders_itself`).
    pub(super) fn folders_read_here(&self) -> Option<&Arc<std::path::Path>> {
        self.local_root
            .as_ref()
            .filter(|_| self.reads_folders_itself)
    }

    pub fn is_local(&self) -> bool {
        self.local_root.is_some()
    }

    /// The longest name of one path segment this store takes (`statfs`'s `namelen`).
    pub fn name_max(&self) -> usize {
        if self.local_root.is_some() {
            LOCAL_NAME_MAX
        } else {
            CLOUD_KEY_MAX
        }
    }

    /// Runs `op` under the retry policy, mapping the final error; at once with an
    /// error while the store is taken as silent.
    async fn retrying<T, F, Fut>(&self, op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        let silent = *self.silent_until.lock();
        if silent.is_some_and(|t| tokio::time::Instant::now() < t) {
            self.count_failure();
            return Err(CacheError::Store {
                attempts: 0,
                message: format!(
                    "{} did not answer a request for its whole deadline; not asked again \
                     for {:.0} s",
                    self.label,
                    self.retry.silent_pause.as_secs_f64()
                ),
            });
        }
        let started = since_start();
        let answered = &self.answered_at;
        let mut op = op;
        let r = retry_op(
            &self.retry,
            &self.label,
            Some(&self.counts.failed_attempts),
            || {
                let attempt = op();
                async move {
                    let r = attempt.await;
                    answered.fetch_max(since_start(), std::sync::atomic::Ordering::Relaxed);
                    r
                }
            },
        )
        .await;
        self.counts.note(&r);
        let pause = self.retry.silent_pause;
        // Silent means no answer to anyone meanwhile (black-box finding: one object's
        // stalled GET paused the whole store for 10 s, 131 reads of healthy files
        // failed, while it answered ~590 other GETs in the same 40 s).
        let nobody_answered = || answered.load(std::sync::atomic::Ordering::Relaxed) < started;
        if matches!(r, Err(CacheError::StoreTimeout { .. }))
            && !pause.is_zero()
            && nobody_answered()
        {
            tracing::warn!(store = %self.label, pause_s = pause.as_secs_f64(), "store silent for a whole request deadline; failing requests at once meanwhile");
            *self.silent_until.lock() = Some(tokio::time::Instant::now() + pause);
        }
        r
    }
}

/// Nanoseconds since the first call in this process: the clock of `answered_at`.
fn since_start() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// The store key of `path` as the mount and the listings name it: the text as it is
/// (`Path::parse`), so a key with `%`, `#`, spaces or non-ASCII letters (as listed) is
/// the key read and written. `Path::from` would percent-encode those and name another
/// key, so such objects were listed but unreadable. Only what a key cannot hold as text
/// (control characters, `.` or `..` segments, empty segments) is encoded.
pub(crate) fn object_key(path: &str) -> Path {
    Path::parse(path).unwrap_or_else(|_| Path::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request the store failed or refused counts as a failed request; the answers a
    /// caller asks for (absent, changed, exists) do not.
    #[test]
    fn refused_requests_count_as_failures_and_answers_do_not() {
        let counts = HandleCounts::default();
        let failed = || counts.failed.load(std::sync::atomic::Ordering::Relaxed);
        counts.note::<()>(&Err(CacheError::PermissionDenied("archived".into())));
        counts.note::<()>(&Err(CacheError::Store {
            attempts: 8,
            message: "503".into(),
        }));
        assert_eq!(failed(), 2);
        counts.note::<()>(&Err(CacheError::NotFound("a".into())));
        counts.note::<()>(&Err(CacheError::Changed("a".into())));
        counts.note::<()>(&Err(CacheError::Exists("a".into())));
        counts.note(&Ok(()));
        assert_eq!(failed(), 2);
    }

    /// Black-box finding (round 14): a rename out of a local folder left the folder it
    /// emptied behind, and a new folder of its name showed it. The rename removes the
    /// folders it empties, up to the first that still holds something.
    #[tokio::test]
    async fn a_rename_removes_the_local_folders_it_empties() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("d0/e/g")).expect("mkdir");
        std::fs::write(dir.path().join("d0/e/g/f"), b"x").expect("write");
        std::fs::write(dir.path().join("d0/keep"), b"y").expect("write");
        let url = format!("file://{}", dir.path().display());
        let store = BackingStore::from_url(&url, &StoreOptions::default()).expect("store");
        store.rename("d0/e/g/f", "moved").await.expect("rename");
        assert_eq!(
            std::fs::read(dir.path().join("moved")).expect("moved"),
            b"x"
        );
        assert!(!dir.path().join("d0/e").exists(), "emptied folders gone");
        assert!(
            dir.path().join("d0/keep").exists(),
            "a folder holding more stays"
        );
    }
}

#[cfg(test)]
mod local_store_tests {
    use super::*;

    pub(super) fn local_store(root: &std::path::Path) -> BackingStore {
        BackingStore::from_url(
            &format!("file://{}", root.display()),
            &StoreOptions::default(),
        )
        .expect("store")
    }

    /// The file and its folders up to the root are synced; a file or folder deleted
    /// meanwhile is no error, and a folder outside the root is not walked into.
    #[tokio::test]
    async fn a_local_object_is_synced_up_to_the_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("a/b")).expect("mkdir");
        std::fs::write(root.join("a/b/f"), b"x").expect("write");
        sync_local_file(root.clone(), root.join("a/b/f"))
            .await
            .expect("synced");
        sync_local_file(root.clone(), root.join("a/b/gone"))
            .await
            .expect("a file deleted meanwhile");
        sync_local_dirs(root.clone(), root.join("a/removed"))
            .await
            .expect("a folder removed meanwhile");
        let store = local_store(&root);
        store
            .put("c/d/obj", Bytes::from_static(b"durable"))
            .await
            .expect("put");
        store.rename("c/d/obj", "e/obj").await.expect("rename");
        assert_eq!(std::fs::read(root.join("e/obj")).expect("read"), b"durable");
    }

    /// Black-box finding (round 21): a folder rename copied every object, then deleted
    /// the sources, also those another client had overwritten meanwhile. The delete
    /// spares a source whose version changed since it was listed; a local copy (a hard
    /// link, which changes the source's ctime) is no change; on a store with ETags too.
    #[tokio::test]
    async fn a_delete_after_a_copy_spares_what_another_client_wrote_since() {
        let dir = tempfile::tempdir().expect("tempdir");
        let local = local_store(dir.path());
        let memory = BackingStore::from_url("memory://", &StoreOptions::default()).expect("store");
        for (store, overwrite) in [(&local, true), (&memory, false)] {
            store
                .put("d/a", Bytes::from_static(b"a1"))
                .await
                .expect("put");
            store
                .put("d/b", Bytes::from_static(b"b1"))
                .await
                .expect("put");
            let listed = store.list_all("d/").await.expect("listed");
            assert_eq!(listed.len(), 2);
            store.copy("d/a", "e/a").await.expect("copy");
            store.copy("d/b", "e/b").await.expect("copy");
            // Another client overwrites d/b after its copy.
            match overwrite {
                true => std::fs::write(dir.path().join("d/b"), b"b2, theirs").expect("write"),
                false => store
                    .put("d/b", Bytes::from_static(b"b2, theirs"))
                    .await
                    .expect("put"),
            }
            let mut deleted = Vec::new();
            for o in &listed {
                if store.delete_if_unchanged(o).await.expect("asked") {
                    deleted.push(o.path.to_string());
                }
            }
            assert_eq!(deleted, ["d/a"], "only the unchanged source goes");
            let b = store.head("d/b").await.expect("theirs stays");
            assert_eq!(b.size, 10);
            assert!(matches!(
                store.head("d/a").await,
                Err(CacheError::NotFound(_))
            ));
        }
    }

    /// Black-box finding (round 21): a FIFO in a `file://` store was listed as a 0-byte
    /// file and its HEAD opened it, waiting for a writer (40 s, then the store taken for
    /// silent). It is no object now: not listed, not found at once; what is beside it is.
    #[tokio::test]
    async fn a_fifo_in_a_local_store_is_no_object_and_blocks_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("d")).expect("mkdir");
        std::fs::write(root.join("d/ok"), b"fine").expect("write");
        let fifo =
            std::ffi::CString::new(root.join("d/pipe").to_str().expect("utf-8")).expect("path");
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo");
        let store = local_store(&root);
        let within = Duration::from_secs(5);
        let listing = tokio::time::timeout(within, store.list_dir("d"))
            .await
            .expect("the listing does not block")
            .expect("listed");
        let names: Vec<&str> = listing.files.iter().map(|f| &*f.path).collect();
        assert_eq!(names, ["d/ok"]);
        let head = tokio::time::timeout(within, store.head("d/pipe"))
            .await
            .expect("the HEAD does not block");
        assert!(matches!(head, Err(CacheError::NotFound(_))), "{head:?}");
        let all = tokio::time::timeout(within, store.list_all("d"))
            .await
            .expect("the walk does not block")
            .expect("walked");
        assert_eq!(all.len(), 1, "{all:?}");
        store.head("d/ok").await.expect("the file beside it");
    }

    /// Black-box finding (round 22): a store URL whose prefix held an empty segment
    /// (`s3://b/a//b`, an empty shell variable) listed one prefix and wrote another; one
    /// with `..` wrote under `dot/%2E%2E/`. Such a prefix is refused, naming why.
    #[test]
    fn a_prefix_with_an_empty_or_dot_segment_is_refused() {
        for url in [
            "memory:///a//b",
            "memory:///dot/../",
            "memory:///../up",
            "memory:///a/./b",
        ] {
            let e = BackingStore::from_url(url, &StoreOptions::default())
                .err()
                .unwrap_or_else(|| panic!("{url} refused"));
            assert!(e.to_string().contains("names no folder"), "{url}: {e}");
        }
        for url in ["memory:///a/b/", "memory:///data//", "memory://"] {
            BackingStore::from_url(url, &StoreOptions::default())
                .unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    /// Black-box finding (round 22): files of 252-255-byte names in a `file://` store
    /// (legal on ext4) were listed, then "missing" to every lookup past the listing's
    /// TTL: the rule for names this store can write (room for `NAME#N`) was applied to
    /// names it reads. Such a name is refused for writing only.
    #[tokio::test]
    async fn a_local_file_of_a_name_too_long_to_write_is_still_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let long = "a".repeat(255);
        std::fs::write(root.join(&long), b"long name").expect("write");
        let store = local_store(&root);
        assert!(!store.unnameable(&long), "a name a file can have");
        assert!(
            matches!(
                store.unstorable_name(&long),
                Some(CacheError::InvalidArgument(_))
            ),
            "not one the store can write"
        );
        assert_eq!(store.head(&long).await.expect("found").size, 9);
        assert!(
            store.unnameable("x#3"),
            "an upload in progress is no object"
        );
        assert!(
            store.unnameable(&"a".repeat(256)),
            "past the file system's names"
        );
    }
}

#[cfg(test)]
mod local_loop_tests {
    use super::*;

    /// Black-box finding (round 15b): a folder reached through a link that loops (or
    /// into the daemon's own mount) was retried as a store error for 3.5-7 s, then EIO.
    /// It is not found at once, and left out of its parent's listing.
    #[test]
    fn a_folder_through_a_looping_link_is_not_found_and_not_listed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::write(root.join("a"), b"x").expect("write");
        std::os::unix::fs::symlink(root.join("loop"), root.join("loop")).expect("link");
        let e = local_level(root, "loop").expect_err("a loop");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        let all = local_walk(root, "").expect("the walk goes on");
        let names: Vec<String> = all.iter().map(|m| m.location.to_string()).collect();
        assert_eq!(names, vec!["a".to_string()]);
    }
}

#[cfg(test)]
mod link_probe_tests {
    use super::local_store_tests::local_store;
    use super::*;

    /// The hard-link probe of a local store leaves nothing behind; other stores have
    /// none. (Its failing side needs a file system without links, exFAT: round 16b's
    /// repro `store_nolinks.sh`.)
    #[test]
    fn the_link_probe_answers_for_local_stores_and_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let local = local_store(dir.path());
        assert!(matches!(local.local_links_work(), Some(Ok(()))));
        assert_eq!(std::fs::read_dir(dir.path()).expect("read").count(), 0);
        let mem = BackingStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            "mem",
            RetryPolicy::default(),
        );
        assert!(mem.local_links_work().is_none());
    }

    /// A looping link at a local store's top is left out of its first listing, as of
    /// every listing, not taken for the store not answering (round 23b: ELOOP).
    #[tokio::test]
    async fn a_looping_link_does_not_fail_a_local_store_s_probe() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("top.txt"), b"x").expect("write");
        std::os::unix::fs::symlink("l2", dir.path().join("l1")).expect("link");
        std::os::unix::fs::symlink("l1", dir.path().join("l2")).expect("link");
        let local = local_store(dir.path());
        let answer = local.probe("", Duration::from_secs(5)).await;
        assert!(matches!(answer, Probe::Answered), "{answer:?}");
        let listed = local.list_dir("").await.expect("listed");
        let names: Vec<&str> = listed.files.iter().map(|f| &*f.path).collect();
        assert_eq!(names, vec!["top.txt"]);
    }
}

#[cfg(test)]
mod mtime_tests {
    use super::local_store_tests::local_store;
    use super::*;

    /// Black-box finding (round 16): objects modified after 2262-04-11 (past i64
    /// nanoseconds) or before 1970 showed as 1970-01-01. Before 1970 is kept; past 2262
    /// the nearest time that fits.
    #[tokio::test]
    async fn times_before_1970_are_kept_and_after_2262_saturate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = local_store(dir.path());
        for (name, secs, want_ns) in [
            ("y1901", -2_147_000_000i64, -2_147_000_000_000_000_000i64),
            ("y1969", -2, -2_000_000_000),
            ("y2300", 10_413_792_000, i64::MAX),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, b"x").expect("write");
            let t = match u64::try_from(secs) {
                Ok(s) => std::time::UNIX_EPOCH + Duration::from_secs(s),
                Err(_) => std::time::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()),
            };
            std::fs::File::options()
                .write(true)
                .open(&path)
                .expect("open")
                .set_modified(t)
                .expect("set mtime");
            let obj = store.head(name).await.expect("head");
            assert_eq!(obj.last_modified_unix_ns, want_ns, "{name}");
        }
    }
}
