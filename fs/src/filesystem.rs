//! The file system core: everything a FUSE mount does, as async methods with plain
//! reply types, so it is tested without a kernel mount. The fuser adapter
//! ([`crate::fuse`]) only translates.
//!
//! Design:
//! - **Inodes.** One inode per path, handed out on first sight (lookup or readdir). Each
//!   counts the kernel's references (one per LOOKUP reply and per READDIRPLUS entry, as
//!   the kernel counts them) and is dropped when the kernel's FORGET brings the count to
//!   zero, so the table holds what the kernel holds. Inodes only named in a plain
//!   READDIR (never referenced) are swept once the table passes
//!   [`CoreOptions::max_inodes`]. A forgotten path keeps its attributes in the
//!   metadata cache (keyed by path), so the next lookup costs no HEAD; it gets a new
//!   number. A path that changes kind (an object replaced by a prefix of the same
//!   name) gets a new inode, so the kernel never sees a file turn into a directory under
//!   one number.
//! - **Metadata cache.** Attributes and directory listings are kept in `moka` caches
//!   with a TTL (`metadata_ttl`); a listing also fills the attribute cache of every
//!   child, so `ls -l` of a 100k-object directory is one paginated LIST and no HEADs,
//!   and repeated `stat`s hit the store at most once per TTL (mountpoint-s3 #714,
//!   #945, #953). Negative results are cached too (a missing name in a cached listing,
//!   or a failed HEAD), with the same TTL. The kernel is given the same TTL for its own
//!   entry and attribute caches (at most a day). For immutable datasets the TTL can be
//!   indefinite ([`METADATA_TTL_INDEFINITE`], `--metadata-ttl indefinite`): entries
//!   then leave only by the caches' size bounds, so a file's attributes survive the
//!   kernel's FORGET and a cached file never pays a HEAD or LIST again.
//! - **Versions.** `open` snapshots the object's version (ETag) into the handle; every
//!   read of that handle names it, so blocks are cached under (path, version, block)
//!   and a changed object can never mix into an open file: a read of a version the
//!   store no longer has fails with `Changed` (ESTALE). After the TTL, a new open sees
//!   the new version (new cache keys) and is told not to keep the old page cache; from
//!   then on the older handles of that inode fail with ESTALE too, since the page
//!   cache they would fill is the one the new version's handles read.
//! - **Reads** go through [`ObjectReader`], which serves each block from whichever tier
//!   holds it and shares concurrent misses (single-flight). A per-handle
//!   [`Readahead`] policy turns sequential reads into block prefetches, unless
//!   [`CoreOptions::predictors`] is set: then the prefetch crate's access controller
//!   decides every prefetch (within the file and across files) and its priority, and
//!   this core only issues what it orders and reports what became of it
//!   ([`FsCore::read`] -> `predict`; the replay simulator drives the same controller).
//! - **Passthrough copies.** A small object read completely is also written once as a
//!   plain file under `<cache_dir>/passthrough/` (the disk tier's block files carry a
//!   header, so they cannot be handed to the kernel). Later opens of that version get
//!   the file back in [`Opened::passthrough`] so the adapter can open it in FUSE
//!   passthrough mode: reads then bypass userspace entirely.
//! - **Access context.** Each read carries its job: the FUSE request's pid is the
//!   calling *thread*, which [`JobResolver`] maps to its process group (by default;
//!   [`CoreOptions::job_scope`]), so a data loader's reader threads and worker
//!   processes are one job to the engine's policies, its stream tree and the
//!   predictors, not one job per thread.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;
use strata_cache_core::{AccessContext, CacheError, CacheKey, JobId, ObjectInfo, ObjectReader};

use strata_cache_core::fetch_plan::{plan_runs, stretch_readahead, FetchWindowConfig, RequestRamp};
use strata_cache_core::reader::RunBlock;
use strata_cache_core::scheduler::Class;
use strata_prefetch::{
    AccessController, AccessEvent, Admission, ControllerConfig, Origin, PrefetchOrder,
};

use crate::error::{Error, Result};
use crate::job::{JobResolver, JobScope};
use crate::passthrough::PassthroughStore;
use crate::readahead::{Readahead, WindowConfig, WindowDoubling};

/// A metadata TTL that never expires (see [`CoreOptions::metadata_ttl`]).
pub const METADATA_TTL_INDEFINITE: Duration = Duration::MAX;

/// TTLs from this long on are indefinite: 100 years, longer than any mount lives, and
/// within what the metadata caches accept as a TTL (they refuse over 1000 years).
pub const INDEFINITE_FROM: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The longest TTL handed to the kernel: one day. With an indefinite TTL the kernel
/// asks again once a day and finds our cached answer; a longer one gains nothing and
/// risks overflow in the kernel's time arithmetic.
const KERNEL_TTL_MAX: Duration = Duration::from_secs(24 * 3600);

/// Inode number of the mount's root directory (FUSE's fixed root).
pub const ROOT_INO: u64 = 1;

/// Renamed objects remembered for the handles open on them (`FsCore::moved`): a
/// rename is remembered only while such a handle exists at its time, so a few suffice;
/// past this the table starts afresh (a handle then may get ENOENT, as before).
const MOVED_MAX: usize = 1024;

/// One version of an object: (path, version).
type VersionKey = (Arc<str>, Arc<str>);

mod copies;
mod dirs;
mod inodes;
mod listing_log;
mod namespace;
mod predict;
mod read;
mod write;

use copies::{ExpectedCopies, KeptCopies};
use dirs::OpenDir;
use inodes::{InodeTable, Node};
use read::FileHandle;
pub use write::{fsync_records, staged_files_dir, WriteOptions};

/// Builds the readahead policy of each newly opened file.
pub type ReadaheadFactory = Arc<dyn Fn() -> Box<dyn Readahead> + Send + Sync>;

/// Options of the core.
#[derive(Clone)]
pub struct CoreOptions {
    /// How long listings and attributes are trusted. 5 s: `ls`/`stat` storms of a
    /// training job's start hit the store once, while a dataset updated in place is
    /// seen within seconds (mountpoint-s3 defaults to 1 s; its users' top complaint is
    /// slow metadata, so we lean longer).
    /// [`METADATA_TTL_INDEFINITE`] (any TTL of 100 years or more): attributes and
    /// listings stay cached for the mount's life (bounded by `metadata_bytes`), for
    /// immutable datasets: a cached file never pays a HEAD or
    /// LIST again, and new or changed objects are not seen until a remount.
    pub metadata_ttl: Duration,
    /// Owner reported for every entry (default: the daemon's uid/gid).
    pub uid: u32,
    pub gid: u32,
    /// Permission bits of every file / folder (None: 0444 / 0555, writable mounts
    /// 0644 / 0755): with `allow_other` the kernel checks users against them.
    pub file_mode: Option<u16>,
    pub dir_mode: Option<u16>,
    /// Readahead policy per open file; default: [`WindowDoubling`].
    pub readahead: ReadaheadFactory,
    /// Plain-file copies for FUSE passthrough; None disables them.
    pub passthrough: Option<PassthroughOptions>,
    /// The mount-wide access controller, fed every demand read and every listing; its
    /// prefetch orders may name other files. None: only per-handle readahead.
    pub predictors: Option<Arc<Predictors>>,
    /// Memory for cached attributes and listings: half for each, every entry weighed
    /// by its estimated footprint ([`attr_weight`], [`listing_weight`]: its names and
    /// versions and the caches' own cost per entry), so a listing of 200,000 names
    /// weighs what it holds, not one entry. 512 MiB: ~700,000 names listed and stat'ed
    /// (~750 B each in both caches, as weighed). The daemon sets an eighth of its memory limit
    /// (black-box finding: entry counts alone let 400,000 names take 575 MB, and the
    /// daemon was OOM-killed in a 400 MiB cgroup by `find` over the mount).
    pub metadata_bytes: u64,
    /// Inodes the kernel does not reference (named by a plain READDIR only) may
    /// accumulate until the table holds this many: 1 M (~100 MB); then they are swept.
    /// Referenced inodes are never swept: the kernel's FORGETs bound those.
    pub max_inodes: usize,
    /// What one job is (the FUSE request names a thread): default
    /// [`JobScope::ProcessGroup`], so a data loader's threads and worker processes are
    /// one job (see [`crate::job`] for why).
    pub job_scope: JobScope,
    /// Writes through the mount (new objects, uploaded at close; see the `write`
    /// module). None: read-only, the default for a dataset mount.
    pub writes: Option<WriteOptions>,
    /// Where listings are logged for a start with the store down (`listing_log.rs`):
    /// set for a mount whose metadata TTL is indefinite. None: not logged.
    pub listing_log: Option<PathBuf>,
}

impl std::fmt::Debug for CoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreOptions")
            .field("metadata_ttl", &self.metadata_ttl)
            .field("passthrough", &self.passthrough)
            .field("job_scope", &self.job_scope)
            .field("writes", &self.writes)
            .finish_non_exhaustive()
    }
}

impl Default for CoreOptions {
    fn default() -> Self {
        // SAFETY-free libc calls: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        CoreOptions {
            metadata_ttl: Duration::from_secs(5),
            uid,
            gid,
            file_mode: None,
            dir_mode: None,
            readahead: Arc::new(|| Box::new(WindowDoubling::new(WindowConfig::default()))),
            passthrough: None,
            predictors: None,
            metadata_bytes: 512 << 20,
            max_inodes: 1 << 20,
            job_scope: JobScope::default(),
            writes: None,
            listing_log: None,
        }
    }
}

/// The prefetch crate's [`AccessController`], shared by every open file of a mount and
/// locked only for its (pure, I/O-free) calls: it decides what to prefetch and in which
/// order, and tracks the outcomes; the core resolves and fetches what it orders (the
/// replay simulator drives the same controller, see `strata_replay::replay`).
pub struct Predictors {
    controller: Mutex<AccessController<CacheKey>>,
    /// The controller does readahead within files (the per-handle window is off).
    sequential: bool,
}

impl std::fmt::Debug for Predictors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Predictors")
            .field("controller", &*self.controller.lock())
            .finish()
    }
}

impl Default for Predictors {
    /// No predictors: listings and reads are observed, nothing is prefetched.
    fn default() -> Self {
        Self::new(AccessController::with_predictors(false, false))
    }
}

impl Predictors {
    /// The sequential and semantic predictors with their default tuning.
    pub fn standard() -> Self {
        Self::new(AccessController::standard())
    }

    /// The standard predictors, remembering at most `max_names` listed names.
    pub fn standard_with_names(max_names: usize) -> Self {
        Self::new(AccessController::standard_with_names(max_names))
    }

    pub fn new(controller: AccessController<CacheKey>) -> Self {
        Predictors {
            sequential: controller.has_sequential(),
            controller: Mutex::new(controller),
        }
    }
}

/// A mount's passthrough copies: the daemon's one store of them (shared by its mounts,
/// see [`PassthroughStore`]) and what this mount copies.
#[derive(Clone, Debug)]
pub struct PassthroughOptions {
    pub copies: Arc<PassthroughStore>,
    /// Largest object copied. 64 MiB: model shards and dataset files of that size are
    /// read whole and often; larger objects stay in blocks (partial reads are common).
    pub max_object: u64,
    /// Names this mount's store among the daemon's (its URL), so objects of two stores
    /// with equal keys and versions never share a copy. "" for a store of its own.
    pub namespace: String,
}

impl PassthroughOptions {
    /// Copies in `dir` within `budget` bytes, for a mount with a store of its own.
    pub fn open(dir: PathBuf, budget: u64) -> std::io::Result<Self> {
        Ok(PassthroughOptions {
            copies: Arc::new(PassthroughStore::open(dir, budget)?),
            max_object: 64 << 20,
            namespace: String::new(),
        })
    }

    /// The copy name of one version of an object, if objects of `size` are copied: up to
    /// `max_object`, and up to half of the copies' budget, so that one copy cannot
    /// empty the store of the others. Black-box finding: a file under `max_object` but
    /// larger than the whole budget was never copied, and as a copy was expected its
    /// blocks skipped the disk tier (one copy per byte): each re-read went to the store.
    pub fn name_for(&self, path: &str, version: &str, size: u64) -> Option<String> {
        let largest = self.max_object.min(self.copies.budget() / 2);
        (size > 0 && size <= largest)
            .then(|| PassthroughStore::name(&self.namespace, path, version, size))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

/// Attributes of an inode, as `stat` shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub kind: Kind,
    pub mtime: SystemTime,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub blksize: u32,
}

/// A lookup result: the attributes, the inode generation and how long the kernel may
/// cache them.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub attr: Attr,
    pub generation: u64,
    pub ttl: Duration,
}

/// One directory entry; `offset` is the cookie of the entry after it.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: String,
    pub offset: u64,
    pub entry: Entry,
}

/// What a core's metadata caches hold ([`FsCore::metadata_cached`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetadataCached {
    pub bytes: u64,
    pub attributes: u64,
    pub listings: u64,
    /// Inodes the table holds (the kernel's references and unreferenced ones).
    pub inodes: u64,
}

/// An opened file.
#[derive(Debug)]
pub struct Opened {
    pub fh: u64,
    /// The kernel may keep its page cache: the version is the one opened last time.
    pub keep_cache: bool,
    /// A plain local copy of exactly this version, for FUSE passthrough.
    pub passthrough: Option<std::fs::File>,
    /// Every read must reach the daemon (`FOPEN_DIRECT_IO`): a file being written grows
    /// under its readers, so the kernel's idea of its size and its page cache are stale.
    pub direct_io: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

#[derive(Clone, Debug)]
enum Meta {
    File(Arc<ObjectInfo>),
    Dir,
    Missing,
}

#[derive(Debug)]
struct Listing {
    /// (name, kind, object for files), sorted by name.
    entries: Vec<(String, Meta)>,
    /// The directory exists even if empty ([`strata_cache_core::DirListing::exists`]).
    exists: bool,
}

/// The attribute cache's estimated cost of one entry, in bytes: the cache's own
/// bookkeeping per entry (~170 B measured with heaptrack over 400,000 names), the path
/// and, for a file, its shared [`ObjectInfo`] (counted here and in its listing: an
/// over-estimate where both hold it).
fn attr_weight(path: &str, m: &Meta) -> u32 {
    let bytes = 192 + path.len() + meta_weight(m);
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// A listing's estimated cost: its entries' names and objects (~130 B per entry besides
/// the names, measured as [`attr_weight`]'s).
fn listing_weight(path: &str, l: &Listing) -> u32 {
    let entries: usize = l
        .entries
        .iter()
        .map(|(name, m)| 64 + name.len() + meta_weight(m))
        .sum();
    u32::try_from(128 + path.len() + entries).unwrap_or(u32::MAX)
}

fn meta_weight(m: &Meta) -> usize {
    match m {
        Meta::File(o) => 64 + o.path.len() + o.version.len(),
        Meta::Dir | Meta::Missing => 0,
    }
}

/// Whether `e` says the store did not answer (down, silent, failing), rather than
/// answering no: then a logged listing may stand in (`listing_log.rs`).
fn store_unreachable(e: &CacheError) -> bool {
    matches!(
        e,
        CacheError::Store { .. } | CacheError::StoreTimeout { .. }
    )
}

/// Tells the kernel that the attributes it caches for an inode are stale, so its next
/// use of them (a read past the size it knows, a `stat`) asks again.
pub type AttrInvalidator = Box<dyn Fn(u64) + Send + Sync>;

/// The core. Cheap to share (`Arc`); all methods take `&self`.
pub struct FsCore {
    /// Listings logged for a start with the store down (`listing_log.rs`), and what
    /// an earlier run logged (taken by [`FsCore::preload_listings`], or dropped).
    listing_log: Option<listing_log::ListingLog>,
    logged: Mutex<Option<Arc<listing_log::Logged>>>,
    reader: ObjectReader,
    root: Arc<str>,
    opts: CoreOptions,
    mounted_at: SystemTime,
    started: Instant,
    inodes: parking_lot::RwLock<InodeTable>,
    attrs: moka::future::Cache<Arc<str>, Meta>,
    listings: moka::future::Cache<Arc<str>, Arc<Listing>>,
    /// Folders whose listing was too large for the listing cache (at most 4,096,
    /// forgotten all at once past that): a create there does not list them to answer
    /// the next names' lookups, which the cache would not keep.
    uncacheable_listings: Mutex<std::collections::HashSet<Arc<str>>>,
    files: Mutex<HashMap<u64, Arc<FileHandle>>>,
    dirs: Mutex<HashMap<u64, Arc<OpenDir>>>,
    /// Paths (and their folders) this mount changed, with the number of the change
    /// (`change_seq`): a listing or HEAD fetched before a change does not install what
    /// it read over it ([`FsCore::changing`]).
    changed: moka::sync::Cache<Arc<str>, u64>,
    change_seq: AtomicU64,
    /// Table size at which the next inode sweep may run (see `sweep_inodes`).
    next_sweep_at: AtomicU64,
    next_fh: AtomicU64,
    /// Version last opened per inode: decides `keep_cache`.
    opened_versions: Mutex<HashMap<u64, Arc<str>>>,
    /// Inodes whose page cache a handle of another version filled while the inode was
    /// being written: their next open keeps no cache (black-box finding: a reader of
    /// the old version, open across an overwrite and a rename while open, left its
    /// bytes cut to the new size in the pages every later open was told to keep).
    mixed_pages: Mutex<std::collections::HashSet<u64>>,
    /// See [`FsCore::writes_refused`].
    writes_refused: Option<String>,
    /// Objects this mount renamed while a handle had them open for reading: (old path,
    /// version) -> the object now holding those bytes, where such a handle reads what
    /// is not cached (see `namespace::rename`). At most [`MOVED_MAX`].
    moved: Mutex<HashMap<VersionKey, Arc<ObjectInfo>>>,
    /// Tells the kernel an inode's cached attributes are stale (set by the FUSE
    /// adapter once mounted; see [`FsCore::set_attr_invalidator`]).
    attr_invalidator: std::sync::OnceLock<AttrInvalidator>,
    /// The FUSE connection of the kernel mount (the minor of its device), once
    /// mounted: a close finds the closing process's other descriptors of a file by it.
    fuse_conn: std::sync::OnceLock<u32>,
    /// The passthrough copies (verified, budgeted); None without passthrough
    /// or when its directory could not be opened.
    passthrough: Option<PassthroughOptions>,
    /// Copy names of the objects (path, version) known to have a passthrough copy: the
    /// engine's disk levels do not keep their blocks (one copy per byte on disk).
    kept: Arc<Mutex<KeptCopies>>,
    /// Objects open now that may get a passthrough copy (small enough, none yet), with
    /// their open handles: their blocks skip the disk tier meanwhile, so a file read
    /// whole is written to disk once, as its copy, instead of as a block that the copy
    /// then replaces. A file not read whole reaches disk by demotion, as before.
    expected: Arc<Mutex<ExpectedCopies>>,
    jobs: JobResolver,
    /// Bytes of demand reads in progress (the controller counts them against its
    /// prefetch backlog bound: they share the store link).
    demand_in_flight: AtomicU64,
    counters: Counters,
    /// FLUSH, FSYNC and RELEASE requests of write handles being served (each may be
    /// uploading): an unmount waits for them (see [`crate::MountHandle::unmount`]).
    flushes: Arc<AtomicU64>,
    /// Files being written and directories made here; None: a read-only mount (also
    /// when the staging directory could not be used).
    writes: Option<write::Writes>,
}

/// A FLUSH or FSYNC being served ([`FsCore::flush_guard`]).
pub struct FlushGuard(Arc<AtomicU64>);

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the core has done, for tests and stats.
#[derive(Default, Debug)]
pub struct Counters {
    pub lookups: AtomicU64,
    /// Requests sent for this mount through another handle than its own (the start's
    /// probe of the store): [`FsCore::store_heads`] and [`FsCore::store_lists`] add
    /// the handle's own.
    pub store_heads: AtomicU64,
    pub store_lists: AtomicU64,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub prefetch_requests: AtomicU64,
    /// Prefetches of other files than the one read (the semantic predictor's); a file
    /// already cached or already on its way is not counted...
    pub prefetch_files: AtomicU64,
    /// ...of which a demand read later read the first prefetched block (`Used`)...
    pub prefetch_files_used: AtomicU64,
    /// ...and which were evicted unread (`Wasted`).
    pub prefetch_files_wasted: AtomicU64,
    pub passthrough_opens: AtomicU64,
    pub passthrough_copies: AtomicU64,
    /// Files written through the mount whose upload completed, and their bytes...
    pub uploads: AtomicU64,
    pub upload_bytes: AtomicU64,
    /// ...uploads that failed (their flush or fsync returned the error)...
    pub upload_failures: AtomicU64,
    /// ...of which sent while written (a stream completed at the flush).
    pub uploads_streamed: AtomicU64,
    /// Objects deleted and files renamed through the mount.
    pub deletes: AtomicU64,
    pub renames: AtomicU64,
    /// Times the kernel was told an inode's attributes are stale (a handle reads a
    /// version of another size than the kernel knows)...
    pub attr_invalidations: AtomicU64,
    /// ...and handles that found their version replaced in the store before serving a
    /// byte, and went on with the new version instead of failing with ESTALE.
    pub handles_renewed: AtomicU64,
    /// Reads that failed (EIO, ENOENT...), of which...
    pub read_errors: AtomicU64,
    /// ...ESTALE: the handle's version was replaced or superseded (black-box finding:
    /// reads failed with EIO and nothing in `strata stats` or `/metrics` moved).
    pub read_stale: AtomicU64,
}

impl Counters {
    /// An upload of `bytes` landed (a close's, or the fsync replay's).
    pub(crate) fn uploaded(&self, bytes: u64) {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        self.upload_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

impl FsCore {
    /// A core serving the sub-tree `prefix` ("" for all) of `reader`'s store.
    pub fn new(reader: ObjectReader, prefix: &str, opts: CoreOptions) -> Self {
        let root: Arc<str> = Arc::from(prefix.trim_matches('/'));
        let indefinite = opts.metadata_ttl >= INDEFINITE_FROM;
        let share = (opts.metadata_bytes / 2).max(1);
        let mut attrs = moka::future::Cache::builder()
            .max_capacity(share)
            .weigher(|path: &Arc<str>, m: &Meta| attr_weight(path, m));
        let mut listings = moka::future::Cache::builder()
            .max_capacity(share)
            .weigher(|path: &Arc<str>, l: &Arc<Listing>| listing_weight(path, l));
        if !indefinite {
            attrs = attrs.time_to_live(opts.metadata_ttl);
            listings = listings.time_to_live(opts.metadata_ttl);
        }
        let (attrs, listings) = (attrs.build(), listings.build());
        let jobs = JobResolver::new(opts.job_scope);
        let passthrough = opts.passthrough.clone();
        let kept: Arc<Mutex<KeptCopies>> = Arc::default();
        let expected: Arc<Mutex<ExpectedCopies>> = Arc::default();
        if let Some(pt) = &passthrough {
            let (store, kept, expected) = (pt.copies.clone(), kept.clone(), expected.clone());
            reader
                .engine()
                .add_kept_elsewhere(Arc::new(move |key: &CacheKey| {
                    let CacheKey::File(k) = key else {
                        return false;
                    };
                    let id = (k.location.clone(), k.version.clone());
                    if expected.lock().contains(&id) {
                        return true;
                    }
                    let mut kept = kept.lock();
                    match kept.get(&id) {
                        Some(name) if store.contains(name) => true,
                        // The copy was evicted from its budget: the blocks may go to
                        // disk again.
                        Some(_) => {
                            kept.remove(&id);
                            false
                        }
                        None => false,
                    }
                }));
        }
        if let Some(p) = &opts.predictors {
            // Readahead no deeper than the cache keeps of unread prefetch (the
            // pattern-aware policy's `ahead` share of every level's budget; the replay
            // sets the same): beyond it the oldest unread prefetch, the block the reader
            // needs next, is evicted before the reader gets to it. The budgets are fixed
            // for the mount's life, so this is set once.
            let window = strata_cache_core::policy::PatternAwareConfig::default()
                .unread_prefetch_bytes(reader.engine().capacity_bytes());
            p.controller.lock().set_cache_window(window);
        }
        // The store and prefix this mount shows: its listing log and fsync records are
        // used by a later mount of the same source only.
        let source = format!("{}|{root}", reader.store().identity());
        let legacy_source = (reader.store().identity() != reader.store().label())
            .then(|| format!("{}|{root}", reader.store().label()));
        let mut writes_refused = None;
        let writes = opts.writes.clone().and_then(|mut o| {
            if o.local_files.is_none() {
                o.local_files = passthrough.as_ref().map(|p| p.copies.clone());
            }
            write::Writes::open(o, &source, legacy_source.as_deref())
                .map_err(|e| writes_refused = Some(e.to_string()))
                .ok()
        });
        let (listing_log, logged) = match &opts.listing_log {
            Some(path) => match listing_log::ListingLog::open(path, reader.block_size(), &source) {
                Ok((log, logged)) => (Some(log), logged),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e,
                        "listings not logged: a start with the store down will not see them");
                    (None, listing_log::Logged::default())
                }
            },
            None => (None, listing_log::Logged::default()),
        };
        FsCore {
            writes_refused,
            writes,
            kept,
            expected,
            listing_log,
            logged: Mutex::new((!logged.is_empty()).then(|| Arc::new(logged))),
            reader,
            inodes: parking_lot::RwLock::new(InodeTable::new(root.clone(), opts.max_inodes)),
            root,
            opts,
            mounted_at: SystemTime::now(),
            started: Instant::now(),
            attrs,
            listings,
            uncacheable_listings: Mutex::new(std::collections::HashSet::new()),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            // 65,536 changes, each kept 10 minutes: far more than a listing or HEAD in
            // flight can overlap (their store calls are bounded well under that).
            changed: moka::sync::Cache::builder()
                .max_capacity(1 << 16)
                .time_to_live(std::time::Duration::from_secs(600))
                .build(),
            change_seq: AtomicU64::new(0),
            next_sweep_at: AtomicU64::new(0),
            next_fh: AtomicU64::new(1),
            opened_versions: Mutex::new(HashMap::new()),
            mixed_pages: Mutex::new(std::collections::HashSet::new()),
            moved: Mutex::new(HashMap::new()),
            attr_invalidator: std::sync::OnceLock::new(),
            fuse_conn: std::sync::OnceLock::new(),
            passthrough,
            jobs,
            demand_in_flight: AtomicU64::new(0),
            counters: Counters::default(),
            flushes: Arc::default(),
        }
    }

    /// Installs the kernel's attribute invalidation (the FUSE adapter, once mounted).
    pub fn set_attr_invalidator(&self, f: AttrInvalidator) {
        let _ = self.attr_invalidator.set(f);
    }

    /// Tells the core the FUSE connection number of its kernel mount (see
    /// [`FsCore::close`]).
    pub fn set_fuse_conn(&self, conn: u32) {
        let _ = self.fuse_conn.set(conn);
    }

    /// A handle of `ino` reads a version of another size than the kernel was told: the
    /// kernel would cut its reads at the size it knows (new bytes cut to the old length:
    /// black-box finding) or fault past it (SIGBUS in an mmap), so its attributes are
    /// invalidated before the handle is used.
    fn size_told_differs(&self, ino: u64, size: u64) {
        let told = self.inodes.read().nodes.get(&ino).and_then(|n| n.told_size);
        if told.is_some_and(|t| t != size) {
            self.counters
                .attr_invalidations
                .fetch_add(1, Ordering::Relaxed);
            if let Some(f) = self.attr_invalidator.get() {
                f(ino);
            }
        }
    }

    pub fn reader(&self) -> &ObjectReader {
        &self.reader
    }

    pub fn options(&self) -> &CoreOptions {
        &self.opts
    }

    /// Marks a FLUSH, FSYNC or RELEASE of a write handle as being served until the
    /// guard is dropped (after its reply is sent).
    pub fn flush_guard(&self) -> FlushGuard {
        self.flushes.fetch_add(1, Ordering::AcqRel);
        FlushGuard(self.flushes.clone())
    }

    /// FLUSH and FSYNC requests of write handles being served now.
    pub fn flushes_in_flight(&self) -> u64 {
        self.flushes.load(Ordering::Acquire)
    }

    /// Store requests of this mount that failed after their retries.
    pub fn store_failures(&self) -> u64 {
        self.reader.store().failures()
    }

    /// Attempts the store failed for this mount, those retried to success included.
    pub fn store_failed_attempts(&self) -> u64 {
        self.reader.store().failed_attempts()
    }

    /// HEADs this mount sent: its store handle's (each attempt, reads, writes,
    /// renames and removals alike), and those [`Counters::store_heads`] adds.
    pub fn store_heads(&self) -> u64 {
        self.counters.store_heads.load(Ordering::Relaxed) + self.reader.store().heads()
    }

    /// LISTs this mount sent (each page), as [`Self::store_heads`] counts HEADs.
    pub fn store_lists(&self) -> u64 {
        self.counters.store_lists.load(Ordering::Relaxed) + self.reader.store().lists()
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// What the attribute and listing caches hold once their pending evictions are
    /// done, in their estimated bytes (bounded by [`CoreOptions::metadata_bytes`]) and
    /// entries.
    pub async fn metadata_cached(&self) -> MetadataCached {
        self.attrs.run_pending_tasks().await;
        self.listings.run_pending_tasks().await;
        self.metadata_cached_now()
    }

    /// [`Self::metadata_cached`] as last settled (the stats' figures).
    pub fn metadata_cached_now(&self) -> MetadataCached {
        MetadataCached {
            bytes: self.attrs.weighted_size() + self.listings.weighted_size(),
            attributes: self.attrs.entry_count(),
            listings: self.listings.entry_count(),
            inodes: self.inodes.read().nodes.len() as u64,
        }
    }

    /// A fresh request ramp: one block up to the largest ranged GET.
    fn request_ramp(&self) -> RequestRamp {
        RequestRamp::new(
            FetchWindowConfig::default().max_request,
            self.reader.block_size(),
        )
    }

    /// Whether this mount takes writes (asked for, and its staging folder usable).
    pub fn is_writable(&self) -> bool {
        self.writes.is_some()
    }

    /// Why writes were asked for and cannot be taken (the staging folder's error).
    pub fn writes_refused(&self) -> Option<&str> {
        self.writes_refused.as_deref()
    }

    /// The TTL handed to the kernel for entries and attributes.
    pub fn ttl(&self) -> Duration {
        self.opts.metadata_ttl.min(KERNEL_TTL_MAX)
    }

    fn node(&self, ino: u64) -> Result<Node> {
        self.inodes
            .read()
            .nodes
            .get(&ino)
            .cloned()
            .ok_or(Error::BadHandle {
                what: "inode",
                id: ino,
            })
    }

    /// The path `ino` names now (it follows renames); None once it names none
    /// (unlinked, or replaced by a rename over its name).
    fn path_of(&self, ino: u64) -> Option<Arc<str>> {
        let inodes = self.inodes.read();
        let path = &inodes.nodes.get(&ino)?.path;
        (inodes.by_path.get(&**path) == Some(&ino)).then(|| path.clone())
    }

    /// Whether a listing of `dir` fetched now would stay in the listing cache: not with
    /// `--metadata-ttl 0`, nor for a folder whose last listing was too large for it.
    pub(super) fn listing_would_be_kept(&self, dir: &Arc<str>) -> bool {
        !self.opts.metadata_ttl.is_zero() && !self.uncacheable_listings.lock().contains(dir)
    }

    fn child_path(&self, dir: &str, name: &str) -> Arc<str> {
        if dir.is_empty() {
            Arc::from(name)
        } else {
            Arc::from(format!("{dir}/{name}"))
        }
    }

    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    fn attr_of(&self, ino: u64, meta: &Meta) -> Attr {
        let bs = self.reader.block_size().min(u32::MAX as u64) as u32;
        match meta {
            Meta::File(obj) => Attr {
                ino,
                size: obj.size,
                kind: Kind::File,
                mtime: unix_ns_time(obj.last_modified_unix_ns),
                // Writable mounts say so (the kernel checks `default_permissions`).
                perm: self.opts.file_mode.unwrap_or(if self.writes.is_some() {
                    0o644
                } else {
                    0o444
                }),
                nlink: 1,
                uid: self.opts.uid,
                gid: self.opts.gid,
                blksize: bs,
            },
            _ => Attr {
                ino,
                size: 0,
                kind: Kind::Dir,
                mtime: self.mounted_at,
                perm: self.opts.dir_mode.unwrap_or(if self.writes.is_some() {
                    0o755
                } else {
                    0o555
                }),
                nlink: 2,
                uid: self.opts.uid,
                gid: self.opts.gid,
                blksize: bs,
            },
        }
    }

    /// The entry of `path`; `reference`: the reply hands the kernel a reference (a
    /// LOOKUP reply; not GETATTR nor a directory listing).
    fn entry_for(&self, path: &Arc<str>, meta: &Meta, reference: bool) -> Result<Entry> {
        let kind = match meta {
            Meta::File(_) => Kind::File,
            Meta::Dir => Kind::Dir,
            Meta::Missing => return Err(Error::NotFound(path.to_string())),
        };
        // A file being written stands for no store version yet.
        let version = match meta {
            Meta::File(obj) if self.written_meta(path).is_none() => Some(&obj.version),
            _ => None,
        };
        let (ino, generation, superseded) = {
            let mut inodes = self.inodes.write();
            // The version (and size) the path's inode stood for until now.
            let had = inodes
                .by_path
                .get(path)
                .and_then(|i| inodes.nodes.get(i))
                .and_then(|n| Some((n.version.clone()?, n.told_size?)));
            let (ino, generation) = inodes.intern(path, kind, version, reference);
            if let (Meta::File(obj), Some(node)) = (meta, inodes.nodes.get_mut(&ino)) {
                node.told_size = Some(obj.size);
            }
            let superseded = had.filter(|(v, _)| reference && version.is_some_and(|now| now != v));
            (ino, generation, superseded)
        };
        if let Some((version, size)) = superseded {
            // The store names another version now (another client replaced it): the
            // old one's passthrough copy can never be opened again.
            self.drop_copy(path, &version, size);
        }
        Ok(Entry {
            attr: self.attr_of(ino, meta),
            generation,
            ttl: self.ttl(),
        })
    }

    fn parent_of<'a>(&self, path: &'a str) -> Option<&'a str> {
        if path == &*self.root {
            return None;
        }
        Some(path.rsplit_once('/').map(|(p, _)| p).unwrap_or(""))
    }

    /// What `path` is: from the attribute cache, the parent's cached listing, or the
    /// store (HEAD, then a listing to tell a directory from nothing).
    async fn meta(&self, path: &Arc<str>) -> Result<Meta> {
        if path == &self.root {
            return Ok(Meta::Dir);
        }
        if let Some(m) = self.written_meta(path) {
            return Ok(m);
        }
        if let Some(m) = self.attrs.get(path).await {
            return Ok(m);
        }
        if let Some(parent) = self.parent_of(path) {
            let started = self.change_seq.load(Ordering::Acquire);
            if let Some(listing) = self.listings.get(parent).await {
                let name = path.rsplit('/').next().unwrap_or(path);
                let m = listing
                    .entries
                    .binary_search_by(|(n, _)| n.as_str().cmp(name))
                    .map(|i| listing.entries[i].1.clone())
                    .unwrap_or(Meta::Missing);
                self.install_attrs(path, m.clone(), started).await;
                return Ok(m);
            }
        }
        let store = self.reader.store();
        if store.unnameable(path) {
            // No object can have this name (a local store refuses to look it up).
            return Ok(Meta::Missing);
        }
        let started = self.change_seq.load(Ordering::Acquire);
        // On an object store a key can also be a prefix of other keys (`a` beside
        // `a/b`): the folder wins there, as in a listing (`DirListing`), so the prefix
        // is asked beside the HEAD, at once (as mountpoint-s3 does). Black-box finding:
        // a path lookup found the object and answered "file", and `a/b` failed ENOTDIR
        // unless `a`'s folder had just been listed.
        let (head, prefix) = futures::join!(store.head(path), async {
            if store.is_local() {
                return None;
            }
            Some(store.dir_exists(path).await)
        });
        let also_folder = matches!(prefix, Some(Ok(true)));
        let m = match head {
            Ok(_) if also_folder => {
                tracing::warn!(%path, "a key that is also a folder of other keys: shown as the folder, the object itself is hidden");
                Meta::Dir
            }
            Ok(obj) => {
                if let Some(log) = &self.listing_log {
                    log.append_file(&obj);
                }
                Meta::File(Arc::new(obj))
            }
            // The HEAD failed (a policy granting GetObject under the folder only refuses
            // `HEAD data`, outside `data/*`) and the prefix holds keys: the folder, as
            // its parent's listing shows it (black-box finding: such a folder was EACCES
            // on every path lookup past the listing's TTL).
            Err(e) if also_folder && !matches!(e, CacheError::NotFound(_)) => {
                tracing::debug!(%path, error = %e, "the HEAD failed, the prefix holds keys: a folder");
                Meta::Dir
            }
            // No object, and the prefix beside it held nothing: nothing there (a name
            // probed and absent costs the HEAD and one LIST page, as before the prefix
            // was asked).
            Err(CacheError::NotFound(_)) if matches!(prefix, Some(Ok(false))) => {
                // Logged as an empty listing, as a listing of it would be: an offline
                // start finds it absent, not unknown.
                if let Some(log) = &self.listing_log {
                    log.append(path, false, Vec::new());
                }
                Meta::Missing
            }
            // Nothing is cached (a TTL of 0): listing the whole directory to learn it
            // is one would be thrown away at once, and every path through it pays it
            // (black-box finding: 8 LIST pages per open under a 4,000-file folder, 22x
            // slower than a small one). One page of the prefix answers.
            Err(CacheError::NotFound(_)) if self.opts.metadata_ttl.is_zero() => {
                // The prefix was asked beside the HEAD already, unless the store is local.
                let is_dir = match prefix {
                    Some(asked) => asked?,
                    None => store.dir_exists(path).await?,
                };
                match is_dir {
                    true => Meta::Dir,
                    false => Meta::Missing,
                }
            }
            Err(CacheError::NotFound(_)) => match self.fetch_listing_if_small(path).await? {
                Some(listing) if listing.entries.is_empty() && !listing.exists => Meta::Missing,
                _ => Meta::Dir,
            },
            // The store does not answer: the parent's listing as an earlier run logged
            // it, if it was (an indefinite metadata TTL).
            Err(e) if store_unreachable(&e) => {
                let parent = match self.parent_of(path) {
                    Some(parent) => self.logged_listing(&Arc::from(parent)).await,
                    None => None,
                };
                let name = path.rsplit('/').next().unwrap_or(path);
                match parent {
                    Some(listing) => listing
                        .entries
                        .binary_search_by(|(n, _)| n.as_str().cmp(name))
                        .map(|i| listing.entries[i].1.clone())
                        .unwrap_or(Meta::Missing),
                    // Its parent was never listed: looked up by name, or listed itself.
                    // A listing logged empty of a folder the store did not show is
                    // a name found absent (a lookup's probe, a file since removed):
                    // absent still, not a folder (black-box finding: unlinked files
                    // and names the predictor probed came back as empty folders).
                    None => match self.logged_file(path) {
                        Some(obj) => Meta::File(Arc::new(obj)),
                        None => match self.logged_listing(path).await {
                            Some(l) if l.entries.is_empty() && !l.exists => Meta::Missing,
                            Some(_) => Meta::Dir,
                            None => return Err(e.into()),
                        },
                    },
                }
            }
            Err(e) => return Err(e.into()),
        };
        self.install_attrs(path, m.clone(), started).await;
        Ok(m)
    }

    /// The listing of directory `path`, from the cache or the store; fills the
    /// attribute cache of each child.
    async fn listing(&self, path: &Arc<str>) -> Result<Arc<Listing>> {
        if let Some(l) = self.listings.get(path).await {
            return Ok(l);
        }
        self.fetch_listing(path).await
    }

    async fn fetch_listing(&self, path: &Arc<str>) -> Result<Arc<Listing>> {
        let mut tries = 0;
        loop {
            tries += 1;
            let started = self.change_seq.load(Ordering::Acquire);
            let listed = self.reader.store().list_dir(path).await.map(Some);
            // A change made here while the store listed may be missing from what it
            // listed: asked again (twice at most; then it is not kept, see
            // `keep_listing`).
            if tries < 3 && listed.is_ok() && self.changed_since(path, started) {
                continue;
            }
            return self
                .kept_or_logged(path, listed, started)
                .await?
                .ok_or_else(|| Error::NotFound(path.to_string()));
        }
    }

    /// For a lookup of `path`, which only asks whether it is a folder: its listing if
    /// one page of the store's holds it all (kept as [`Self::fetch_listing`] keeps
    /// it, so opening its files asks the store nothing more), None if it has more:
    /// a folder, listed whole only when read (as mountpoint-s3 does, a lookup costs
    /// a page, not the folder's size).
    async fn fetch_listing_if_small(&self, path: &Arc<str>) -> Result<Option<Arc<Listing>>> {
        let started = self.change_seq.load(Ordering::Acquire);
        let listed = self.reader.store().list_dir_for_lookup(path).await;
        self.kept_or_logged(path, listed, started).await
    }

    /// What a listing of `path` the store gave (or did not give) becomes: kept (see
    /// [`Self::keep_listing`]), or, with the store silent, the listing an earlier run
    /// logged.
    async fn kept_or_logged(
        &self,
        path: &Arc<str>,
        listed: std::result::Result<Option<strata_cache_core::DirListing>, CacheError>,
        started: u64,
    ) -> Result<Option<Arc<Listing>>> {
        match listed {
            Ok(Some(raw)) => Ok(Some(self.keep_listing(path, raw, started).await)),
            Ok(None) => Ok(None),
            Err(e) if store_unreachable(&e) => match self.logged_listing(path).await {
                Some(l) => Ok(Some(l)),
                None => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// A listing the store gave: the attributes of its entries, the predictors'
    /// names, the listing log and the listing cache take it.
    ///
    /// `started`: the change number when the store was asked. What this mount changed
    /// since is not overwritten: a child changed since keeps its attributes, and the
    /// listing is not kept when the folder changed meanwhile (black-box finding: a
    /// listing that raced a close set the file's size back to the one before, and the
    /// next `>>` wrote at that offset over the last append: acknowledged appends lost).
    async fn keep_listing(
        &self,
        path: &Arc<str>,
        raw: strata_cache_core::store::DirListing,
        started: u64,
    ) -> Arc<Listing> {
        // The store answers: the earlier run's listings are not needed (nor kept in
        // memory) any more.
        if self.listing_log.is_some() {
            self.logged.lock().take();
        }
        let mut entries: Vec<(String, Meta)> = Vec::with_capacity(raw.dirs.len() + raw.files.len());
        for d in raw.dirs {
            let name = d.trim_end_matches('/').to_string();
            if !name.is_empty() {
                entries.push((name, Meta::Dir));
            }
        }
        for f in raw.files {
            let name = f.path.rsplit('/').next().unwrap_or(&f.path).to_string();
            if name.is_empty() {
                continue;
            }
            entries.push((name, Meta::File(Arc::new(f))));
        }
        // A name both an object and a prefix: the object wins (it can be read; the
        // prefix's objects stay reachable by their other names only through the store).
        entries.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| matches!(a.1, Meta::Dir).cmp(&matches!(b.1, Meta::Dir)))
        });
        entries.dedup_by(|a, b| a.0 == b.0);
        // The children's attributes, as far as the attribute cache holds them: past
        // its capacity each insert only evicts an earlier one (a folder of 300,000
        // names churned 200,000 entries through a 32 MiB cache, and the memory it
        // left behind killed a 256 MiB daemon at the next listing). The rest are
        // answered from the listing while it is cached, or asked again.
        let mut room = self.attrs.policy().max_capacity().unwrap_or(u64::MAX);
        for (name, m) in &entries {
            let child = self.child_path(path, name);
            let weight = u64::from(attr_weight(&child, m));
            if weight > room {
                break;
            }
            room -= weight;
            self.install_attrs(&child, m.clone(), started).await;
        }
        // A folder the store does not have (a lookup's probe of an absent name) is no
        // listing to learn from.
        if let Some(p) = self.opts.predictors.as_ref().filter(|_| raw.exists) {
            let sized: Vec<(&str, u64)> = entries
                .iter()
                .filter_map(|(n, m)| match m {
                    Meta::File(o) => Some((n.as_str(), o.size)),
                    _ => None,
                })
                .collect();
            p.controller.lock().on_listing(path, &sized);
        }
        let listing = Arc::new(Listing {
            entries,
            exists: raw.exists,
        });
        if let Some(log) = &self.listing_log {
            let logged = listing
                .entries
                .iter()
                .map(|(n, m)| match m {
                    Meta::File(o) => (n.clone(), Some((**o).clone())),
                    _ => (n.clone(), None),
                })
                .collect();
            log.append(path, listing.exists, logged);
        }
        // A listing larger than the listing cache is not put in it: the cache would drop
        // it at its next upkeep, holding it until then (300,000 names held ~90 MB after
        // `ls -f` ended, measured).
        let capacity = self.listings.policy().max_capacity().unwrap_or(u64::MAX);
        let fits = u64::from(listing_weight(path, &listing)) <= capacity;
        if !fits {
            let mut big = self.uncacheable_listings.lock();
            if big.len() >= 4096 {
                big.clear();
            }
            big.insert(path.clone());
        }
        if fits && !self.changed_since(path, started) {
            self.listings.insert(path.clone(), listing.clone()).await;
            if self.changed_since(path, started) {
                self.listings.invalidate(path).await;
            }
        }
        listing
    }

    /// Puts `m`, which the store (or a cached listing) gave when the change number was
    /// `started`, in the attribute cache, unless this mount changed `path` since. A
    /// change that begins while it goes in may have put its own attributes there first:
    /// both are dropped then, and the next lookup asks again. One rule for every path
    /// that caches what it read (a lookup from a cached listing took none before: a
    /// listing read just before a close's upload could put the old size back over the
    /// close's own, and the kernel would take it at its next GETATTR; found by reading,
    /// while chasing the lost appends of `Writes::stage`).
    async fn install_attrs(&self, path: &Arc<str>, m: Meta, started: u64) {
        if self.changed_since(path, started) {
            return;
        }
        self.attrs.insert(path.clone(), m).await;
        if self.changed_since(path, started) {
            self.attrs.invalidate(path).await;
        }
    }

    /// A change this mount makes to `path` begins (call it before the change's own
    /// attributes go in): a listing or HEAD of it, or of its folder, fetched before
    /// does not install what it read over the change.
    pub(super) fn changing(&self, path: &str) {
        let seq = self.change_seq.fetch_add(1, Ordering::AcqRel) + 1;
        self.changed.insert(Arc::from(path), seq);
        if let Some(dir) = self.parent_of(path) {
            self.changed.insert(Arc::from(dir), seq);
        }
    }

    /// Whether this mount changed `path` (or, for a folder, something in it) after
    /// change number `seq`.
    pub(super) fn changed_since(&self, path: &str, seq: u64) -> bool {
        self.changed.get(path).is_some_and(|s| s > seq)
    }

    /// An object an earlier run looked up by name (see [`Self::logged_listing`]).
    fn logged_file(&self, path: &str) -> Option<ObjectInfo> {
        // Read from the log outside the lock.
        let logged = self.logged.lock().clone()?;
        let obj = logged.file(path)?;
        tracing::warn!(%path, "the store did not answer: found as an earlier run logged it");
        Some(obj)
    }

    /// The listing of `dir` an earlier run logged (an indefinite metadata TTL), taken
    /// as this mount's when the store does not answer (see `listing_log.rs`): cached
    /// as a listing fetched now would be. None: none was logged.
    async fn logged_listing(&self, dir: &Arc<str>) -> Option<Arc<Listing>> {
        let logged = self.logged.lock().clone()?;
        let (exists, entries) = logged.dir(dir)?;
        let mut out: Vec<(String, Meta)> = Vec::with_capacity(entries.len());
        for (name, obj) in entries {
            let meta = match obj {
                Some(o) => Meta::File(Arc::new(o)),
                None => Meta::Dir,
            };
            self.attrs
                .insert(self.child_path(dir, &name), meta.clone())
                .await;
            out.push((name, meta));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let listing = Arc::new(Listing {
            entries: out,
            exists,
        });
        self.listings.insert(dir.clone(), listing.clone()).await;
        tracing::warn!(dir = %dir, "the store did not answer: listed as an earlier run logged it");
        Some(listing)
    }

    /// Looks `name` up in directory `parent`.
    pub async fn lookup(&self, parent: u64, name: &str) -> Result<Entry> {
        self.counters.lookups.fetch_add(1, Ordering::Relaxed);
        let dir = self.node(parent)?;
        if dir.kind != Kind::Dir {
            return Err(Error::NotDir(dir.path.to_string()));
        }
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(Error::Invalid(format!("bad name {name:?}")));
        }
        let path = self.child_path(&dir.path, name);
        let meta = self.meta(&path).await?;
        let mut entry = self.entry_for(&path, &meta, true)?;
        if self.is_being_written(&path) {
            entry.ttl = Duration::ZERO; // see `FsCore::create`
        }
        Ok(entry)
    }

    /// The kernel forgot `nlookup` references to `ino` (FUSE FORGET).
    pub fn forget(&self, ino: u64, nlookup: u64) {
        self.inodes.write().forget(ino, nlookup);
    }

    /// Inodes in the table now.
    pub fn inode_count(&self) -> usize {
        self.inodes.read().nodes.len()
    }

    /// Keeps the table within `max_inodes` by dropping unreferenced inodes, except
    /// those of open files and the entries an open directory's last read handed out.
    /// A sweep that leaves the table over a quarter
    /// of the bound above it is not retried until the table grows by that much (the
    /// kernel's own references alone may exceed the bound: no sweep per opendir then).
    fn sweep_inodes(&self) {
        let len = self.inodes.read().nodes.len();
        let next = self.next_sweep_at.load(Ordering::Relaxed) as usize;
        if len <= self.opts.max_inodes || len < next {
            return;
        }
        let mut keep: std::collections::HashSet<u64> =
            self.files.lock().values().map(|h| h.ino).collect();
        for dir in self.dirs.lock().values() {
            keep.extend(dir.handed_out.lock().iter().copied());
        }
        let mut inodes = self.inodes.write();
        let swept = inodes.sweep(self.opts.max_inodes, &keep);
        let left = inodes.nodes.len();
        drop(inodes);
        self.next_sweep_at.store(
            (left + self.opts.max_inodes / 4 + 1) as u64,
            Ordering::Relaxed,
        );
        tracing::debug!(swept, left, "unreferenced inodes dropped");
    }

    /// Current attributes of `ino` (re-resolved after the TTL).
    ///
    /// A file open here is the version its handles opened, as a local file is for
    /// the descriptors open on it: a newer version of its path reaches the kernel
    /// through a lookup, as a new inode ([`InodeTable::intern`]). Black-box finding
    /// (`--metadata-ttl 0`, an object replaced every 50 ms while read whole): each
    /// GETATTR asked the store afresh, so the kernel took one version's size while the
    /// handle read another's, and reads came back cut at a block boundary or padded
    /// with zeros, as successes.
    pub async fn getattr(&self, ino: u64) -> Result<Entry> {
        let node = self.node(ino)?;
        if node.kind == Kind::File {
            if let Some(meta) = self.open_meta(ino) {
                return Ok(Entry {
                    attr: self.attr_of(ino, &meta),
                    generation: node.generation,
                    ttl: self.ttl(),
                });
            }
        }
        let meta = self.meta(&node.path).await?;
        let entry = self.entry_for(&node.path, &meta, false)?;
        if entry.attr.ino != ino {
            if node.kind == Kind::File && matches!(meta, Meta::File(_)) {
                // A newer version of its path took another inode, and no handle holds
                // this one's: the kernel asks between its lookup and its open (another
                // reader's lookup moved the path meanwhile, maybe while this one asked
                // the store). The file is still there: not ENOENT (black-box finding:
                // 43-53 opens of an object being replaced failed so).
                return Ok(Entry {
                    attr: self.attr_of(ino, &meta),
                    generation: node.generation,
                    ttl: self.ttl(),
                });
            }
            // The path changed kind since this inode was issued.
            return Err(Error::NotFound(node.path.to_string()));
        }
        Ok(entry)
    }

    /// The file as a handle of `ino` open now sees it, if any: the file a write handle
    /// is writing, else the object the newest read handle opened (older ones of another
    /// version fail with ESTALE: `superseded`).
    fn open_meta(&self, ino: u64) -> Option<Meta> {
        if let Some(written) = self.handle_meta(ino) {
            return Some(written);
        }
        let newest = self.opened_versions.lock().get(&ino).cloned();
        let files = self.files.lock();
        let mut found = None;
        for h in files.values().filter(|h| h.ino == ino) {
            if newest.as_deref() == Some(&*h.obj.version) {
                return Some(Meta::File(h.obj.clone()));
            }
            found.get_or_insert_with(|| h.obj.clone());
        }
        // Handles of a version superseded on this inode (written anew through the
        // mount) do not answer for it: the path's attributes do (black-box finding:
        // after an overwrite through the mount, `stat` showed the old size for the
        // TTL while another process held the old version open).
        if newest.is_some() {
            return None;
        }
        found.map(Meta::File)
    }

    pub fn statfs(&self) -> StatFs {
        let bsize = self.reader.block_size().min(u32::MAX as u64) as u32;
        // A store has no fixed size: report a large, constant one so tools that check
        // free space (du, df, installers) behave. A read-only mount has no free space;
        // a writable one has what its staging directory's disk has (a file is staged
        // whole before its upload).
        let (free, total) = self.writes.as_ref().and_then(|w| w.free_bytes()).map_or(
            (0, 1 << 30),
            |(free, total)| {
                (
                    free / u64::from(bsize.max(1)),
                    total / u64::from(bsize.max(1)),
                )
            },
        );
        StatFs {
            blocks: total,
            bfree: free,
            bavail: free,
            // The inodes the mount holds, and for a writable mount room for many more,
            // not none (`df -i` showed 100% of inodes used; some installers refuse a
            // full file system), counted in the total too (black-box finding: 1 total
            // beside 2^32 free, `df -i` IUsed -4294967294). A read-only mount makes no
            // files: all its inodes are used, as squashfs reports.
            files: self.inodes.read().nodes.len() as u64
                + if self.writes.is_some() { 1 << 32 } else { 0 },
            ffree: if self.writes.is_some() { 1 << 32 } else { 0 },
            bsize,
            // What the store takes: a local directory's names are shorter (`#N`).
            namelen: self.reader.store().name_max().min(u32::MAX as usize) as u32,
        }
    }
}

/// The time `ns` nanoseconds from the Unix epoch, before it too (black-box finding:
/// objects of 1969 and 1901 showed as 1970).
fn unix_ns_time(ns: i64) -> SystemTime {
    match u64::try_from(ns) {
        Ok(after) => UNIX_EPOCH + Duration::from_nanos(after),
        Err(_) => UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs()),
    }
}

/// An OPEN of an inode whose path holds nothing now: ESTALE, not ENOENT. The kernel
/// found the name when it looked it up; renamed away (and perhaps back) or removed
/// since, a fresh lookup finds what is there now, and an `open(O_CREAT)` then creates
/// it, where ENOENT, which the kernel does not retry, said the folder was missing
/// (black-box finding: 11-17% of `O_CREAT` opens failed ENOENT while another process
/// renamed the name away and back).
pub(crate) fn gone_since_lookup(path: &str) -> Error {
    Error::Cache(CacheError::Changed(format!(
        "{path}: gone since it was looked up (a lookup finds what is there now)"
    )))
}

#[cfg(test)]
mod time_tests {
    use super::*;

    #[test]
    fn times_before_the_epoch_are_kept() {
        assert_eq!(
            unix_ns_time(-2_000_000_000),
            UNIX_EPOCH - Duration::from_secs(2)
        );
        assert_eq!(
            unix_ns_time(1_500),
            UNIX_EPOCH + Duration::from_nanos(1_500)
        );
        assert!(unix_ns_time(i64::MIN) < UNIX_EPOCH);
    }
}
