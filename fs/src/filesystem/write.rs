//! Writes through the mount: a training job saves its checkpoints where it reads its
//! data (`torch.save`, `safetensors`, `np.save`, `cp`, `tar -x`), so a mount that
//! refuses every write sends users back to a second tool. Objects are written whole;
//! what object storage cannot do is refused with an errno that says so.
//!
//! - **Staged, uploaded at close.** A created (or, with `allow_overwrite`, truncated)
//!   file is written into a local staging file under the cache directory, at any
//!   offsets (`zipfile` seeks back to patch its headers; a strictly sequential stream,
//!   as mountpoint-s3 requires, would refuse it). With `allow_overwrite`, an object up
//!   to `rewrite_max` (256 MiB) opened to be changed (a log opened with `"a"`, a
//!   shell's `>>`, `O_RDWR` patches) is first read into its staging file, from the
//!   version the store has at the open (one HEAD: a cached older version is ESTALE, and
//!   the kernel's retry opens the current one), and replaced whole at the close if it
//!   changed (the last close wins). `flush` (every `close`) uploads it when it changed
//!   since the last upload (`fsync` makes it durable on the cache disk instead, and a
//!   restart after a crash uploads it: `write/journal.rs`): one PUT up to `part_size`, else a
//!   multipart upload with `parts_in_flight` parts on the wire while the next is read.
//!   The caller waits, so an upload that fails (the store down, 5xx after retries, a
//!   timeout) fails its `close` with EIO and nothing half-written becomes visible: an
//!   object appears only when its upload completes, and a multipart upload that fails
//!   is aborted. Two closes do not upload ([`FsCore::close`]): one before anything was
//!   written (a shell's `> file` moves its descriptor first), and one in another
//!   process than the opener (a `fork`ed child's copy of the descriptor, closed when it
//!   exits or `exec`s: the opener may still be writing); the opener's close, or else
//!   the release when the last copy closes, uploads then.
//! - **Sent while written, when written in order.** A file that every write so far
//!   appended to, once past `stream_from` (16 MiB), starts its multipart upload: a task
//!   reads the staging file behind the writer and queues it part by part, so a large
//!   checkpoint is mostly on the wire when it is closed (mountpoint-s3 streams too, but
//!   only in order; here order is an optimisation, not a rule). A write below what the
//!   task has read, or a truncate, breaks the stream: it aborts, and the flush uploads
//!   the file whole, as does any failure of the stream. With the disk budget short
//!   (below), streaming starts at the first whole part.
//! - **Single-flight per file.** Concurrent flushes of one file share one upload; a
//!   write that lands during an upload leaves the file changed, so the next flush
//!   uploads again (`written` / `uploaded` generations).
//! - **Seen at once.** While staged, the file's attributes come from the staging file
//!   (its size grows as it is written), it is listed in its directory, and an open to
//!   read it reads what was written so far from the staging file (`tail -f` of a log;
//!   `FOPEN_DIRECT_IO`, since it grows); after the upload its metadata is the store's
//!   (one HEAD: the real ETag and time), and the parent's cached listing is updated so
//!   the next `ls` shows it, also under `--metadata-ttl indefinite`.
//! - **One copy per byte, warm after write.** At release, an uploaded file no larger
//!   than the passthrough limit is *renamed* into the passthrough copies as the copy of
//!   the version the store returned, when the copies' budget had free room for it all
//!   along (a file no one has read yet keeps no room taken from copies that reads
//!   earned): the restore that follows a save is served from local disk by the kernel,
//!   and the bytes were written once.
//! - **Within the disk budget, crash-safe.** A staged file is charged to the budget
//!   the daemon's passthrough copies have (`local_files`, shared by its mounts). When
//!   the budget has no free room for its growth, it evicts the least recently opened
//!   copies, which can be made again. When even all of them would not make room, a
//!   file being streamed frees what its stream has sent (a hole punched in the staging
//!   file: a checkpoint written in order takes little more than its parts in flight,
//!   however large: about two 8 MiB parts per file once it waits, so files written at
//!   once each add that much past the budget: a part is the least a multipart upload
//!   sends), and a write that outran its upload waits for it (bounded; no
//!   time lost: the close waits for the upload anyway). That costs the fallback, so once a file freed bytes, a write below
//!   them is refused (ENOTSUP, with the reason), a failed stream fails the close, and a
//!   close (a `dup`'s too: a `fork` and `exec` while the file is open) or `fsync` that
//!   completes its upload seals it: later writes are refused, as in mountpoint-s3
//!   always. Past the budget a staged file degrades to the peer's rules rather than
//!   overrun the disk. Otherwise it is never refused for the budget's sake (what the
//!   user wrote has no other copy): a file written out of order beyond the budget is
//!   reported (`strata stats`, "local files"). A file whose staging evicted copies is
//!   not adopted as one (below): the room it borrowed goes back to the copies reads
//!   earn. A write that meets a full file system (a budget larger than the disk) first
//!   takes the room of what Strata keeps there that can be made again: copies, then
//!   disk-tier blocks (`make_device_room`); a disk full of anything else fails the
//!   `write` with ENOSPC.
//!   Staging files are removed at mount start, but those an fsync recorded
//!   (`write/journal.rs`: uploaded then): a crash before an upload completed
//!   leaves no object (its multipart upload is aborted by the store's lifecycle rules,
//!   as for any S3 client), one after leaves the object and no copy.
//! - **Directories** made with `mkdir` exist in the mount until the daemon stops (object
//!   storage has none: they become real with their first object); `rmdir` removes an
//!   empty one. `unlink` needs `allow_delete` (a file unlinked while open for writing,
//!   an anonymous temporary file, keeps its staging file for its handles and is never
//!   uploaded); so does renaming a file (write, then
//!   rename into place: the store moves the object, by its own rename or a copy and a
//!   delete, and the inode follows; a file still open for writing moves with its
//!   staging file, as `tempfile`'s persist needs: safetensors saves so; an operation
//!   on a file just closed waits for its release, which the kernel sends after the
//!   close returned), and renaming a directory (a checkpoint directory
//!   saved under a temporary name): every object under it is copied, then the sources
//!   deleted, up to 10,000 objects (`namespace::rename_dir`).

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::{BoxFuture, Shared};
use futures::FutureExt;
use parking_lot::Mutex;
use strata_cache_core::store::UploadShape;
use strata_cache_core::{AccessContext, CacheError, ObjectInfo};

use super::{Entry, FsCore, Kind, Meta, Opened};
use crate::error::{Error, Result};
use crate::passthrough::PassthroughStore;

mod journal;
mod moves;
mod staged;
mod stream;
mod upload;

pub(super) use staged::Staged;
use staged::{freed_error, read_back, resize_staged, Charge};
use stream::{read_part, stream_upload, Stream, StreamCtl};

/// How the mount takes writes (`CoreOptions::writes`; None: read-only).
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// Directory of the staging files (`<cache dir>/staging/<mount>`): emptied at start.
    pub staging_dir: PathBuf,
    /// Whether an existing object may be replaced (a create over it, or an open with
    /// `O_TRUNC`). Off by default: a dataset mount should not lose an object to a
    /// mistyped path.
    pub allow_overwrite: bool,
    /// Whether `unlink` deletes objects. Off by default, for the same reason.
    pub allow_delete: bool,
    /// Bytes per upload part, and the largest object sent in one PUT: 8 MiB, the part
    /// size mountpoint-s3 and the AWS CLI use (S3 wants at least 5 MiB per part, and
    /// 10,000 parts of 8 MiB allow 78 GiB objects).
    pub part_size: usize,
    /// Parts on the wire at once: 8, enough to keep a link to S3 busy (each part's
    /// latency is mostly the store's) without buffering more than 64 MiB per file.
    pub parts_in_flight: usize,
    /// A file written in order starts its multipart upload once it holds this many
    /// bytes, and sends parts while it is written (see the module doc): 16 MiB, two
    /// parts, so a small file is still one PUT at close and never a multipart upload.
    /// 0: always upload at close.
    pub stream_from: u64,
    /// Bytes of parts on the wire across all the mount's uploads: 512 MiB (64 parts).
    /// Each upload keeps at most `parts_in_flight` parts on the wire, but many files
    /// closed at once (every rank of a job saving its shard) would otherwise each hold
    /// that much; past the bound their next parts wait (each upload then holds at most
    /// the one part it waits to send). Where the store takes parts by index.
    pub upload_memory: u64,
    /// Largest object opened to be changed in place (appended to, or written without
    /// `O_TRUNC`; needs `allow_overwrite`): its bytes are read into the staging file at
    /// the open, and uploaded whole at the close. 256 MiB: logs, small databases and
    /// configs are far smaller, and an open that reads more would stall its caller for
    /// seconds on a slow store; larger objects can only be replaced.
    pub rewrite_max: u64,
    /// The budget staged files are charged to: the daemon's local files (passthrough
    /// copies and staged writes share the disk budget's passthrough share; see
    /// [`PassthroughStore`]). None: the mount's copies' store if it has one, else
    /// staged files are bounded by the disk alone.
    pub local_files: Option<Arc<PassthroughStore>>,
    /// The mountpoint as the kernel mounts it (symlinks resolved; set by
    /// [`crate::spawn`]): written in fsync records, so a start at the same directory
    /// spelt another way (a symlink to it, or the folder a symlink names), whose
    /// staging folder is another, uploads them too. None: records are found in
    /// `staging_dir` only.
    pub mountpoint: Option<PathBuf>,
}

impl WriteOptions {
    pub fn new(staging_dir: PathBuf) -> Self {
        WriteOptions {
            staging_dir,
            allow_overwrite: false,
            allow_delete: false,
            part_size: 8 << 20,
            parts_in_flight: 8,
            stream_from: 16 << 20,
            upload_memory: 512 << 20,
            rewrite_max: 256 << 20,
            local_files: None,
            mountpoint: None,
        }
    }
}

/// How long an operation on a file that was just closed waits for its release
/// ([`FsCore::settled`]): the kernel's RELEASE follows the close within milliseconds;
/// 2 s covers an upload at release (a file whose flush was skipped) on a busy daemon.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Bytes read at a time into the staging file of an object opened to be changed.
const FILL_CHUNK: u64 = 8 << 20;

/// Room a staged write that met a full device makes beyond its own bytes: enough for
/// the writes that follow (16 MiB, two parts) not to meet it again one by one.
const DEVICE_SLACK: u64 = 16 << 20;

/// Whether a local write failed for want of room on its file system.
fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// Parts of unsent bytes a file written past the budget may run ahead of its stream
/// (`FsCore::write_wait`): 2, one being read while the next is written.
const BACKLOG_PARTS: u64 = 2;

/// How long a write past the budget waits for its stream before it lands anyway (the
/// budget then overrun, and reported): 30 s, long enough for two 8 MiB parts on a
/// slow link, short enough that a stuck store does not hang the writer for good (its
/// close reports the failure).
const BACKLOG_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Longest a write that met a staging file system full of what is staged waits for its
/// stream to send (and free) more: 5 s, polled, as it may hold the FUSE session thread;
/// the writes after it wait off that thread (`write_wait`, the budget having come down).
const FULL_DEVICE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The process (thread group) of thread `tid`, from procfs; None for 0 (a caller
/// outside the daemon's pid namespace) or when it cannot be read.
fn process_of(tid: u32) -> Option<u32> {
    if tid == 0 {
        return None;
    }
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| crate::job::parse_tgid(&s))
}

/// Whether process `pid` still has a descriptor open for writing on inode `ino` of
/// the FUSE mount of connection `conn` (in any of its mount namespace's mounts of it):
/// a copy of the descriptor being closed. A shell's `cmd > file` opens the file,
/// `dup2`s it onto stdout and closes the first descriptor before `cmd` writes a byte,
/// and `dd of=` does the same: that close uploaded an empty object (or the part
/// written so far), which the store held until the last close (black-box finding).
/// The descriptor being closed is already gone from the table when FLUSH comes.
/// False when /proc cannot tell (then the close uploads, as before).
fn writes_on(pid: u32, conn: u32, ino: u64) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return false;
    };
    // The mounts of the process's writable descriptors of an inode of this number
    // (any file system), then whether one of them is this connection's: the mount
    // table is read only when such a descriptor is there.
    let mounts_of_copies: Vec<String> = fds
        .flatten()
        .filter_map(|fd| {
            let info = std::fs::read_to_string(fd.path()).ok()?;
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(str::trim)
            };
            let writable = field("flags:")
                .and_then(|f| u32::from_str_radix(f, 8).ok())
                .is_some_and(|f| f & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32);
            let same_ino = field("ino:").and_then(|i| i.parse::<u64>().ok()) == Some(ino);
            (writable && same_ino)
                .then(|| field("mnt_id:").map(str::to_string))
                .flatten()
        })
        .collect();
    if mounts_of_copies.is_empty() {
        return false;
    }
    let Ok(mounts) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
        return false;
    };
    let dev = format!(" 0:{conn} ");
    mounts
        .lines()
        .filter(|l| l.contains(&dev))
        .filter_map(|l| l.split(' ').next())
        .any(|id| mounts_of_copies.iter().any(|m| m == id))
}

/// Where a mount's staging files and their fsync records live: a folder inside its
/// staging folder, which releases before the fsync journal (2026-12-05) leave alone
/// (they remove only the files at its top), so a downgrade after a crash keeps what an
/// fsync acknowledged for the next start of this release (black-box finding: the
/// older build deleted it, never uploaded).
pub fn staged_files_dir(staging_dir: &Path) -> PathBuf {
    staging_dir.join("files")
}

/// The fsync records (`<n>.part.json`) in staging folder `staging_dir`: in its `files`
/// folder, and at its top, where releases before that folder put them.
pub fn fsync_records(staging_dir: &Path) -> usize {
    let count = |d: &Path| {
        std::fs::read_dir(d)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".part.json"))
                    .count()
            })
            .unwrap_or(0)
    };
    count(staging_dir) + count(&staged_files_dir(staging_dir))
}

/// The staging folders of the mounts this process has open: another mount's start
/// takes no fsync record from them (they are their own mount's to upload).
static LIVE_STAGING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The fsync records of canonical mountpoint `mountpoint` in the staging folders
/// beside `staging_dir`, of mounts not open: those a mount at the same directory spelt
/// another way wrote (a staging folder is named after the mountpoint as given: a
/// symlink to the folder, or the folder a symlink names, is another; black-box
/// finding: a file fsync'd through a mount at a symlink was never uploaded by the
/// restart at the folder it names, nor shown). They are uploaded from where they are.
fn other_spellings(staging_dir: &Path, mountpoint: &str) -> Vec<journal::Journaled> {
    let (Some(parent), Some(own)) = (staging_dir.parent(), staging_dir.file_name()) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let live = LIVE_STAGING.lock().clone();
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        if entry.file_name() == own
            || live.contains(&dir)
            || !entry.file_type().is_ok_and(|t| t.is_dir())
        {
            continue;
        }
        for d in [staged_files_dir(&dir), dir.clone()] {
            match Writes::journaled_left(&d, Some(mountpoint), false) {
                Ok(left) => out.extend(left.records),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(dir = %d.display(), error = %e, "a staging folder of another spelling of this mountpoint could not be read: its fsync records are not uploaded by this start")
                }
            }
        }
    }
    if !out.is_empty() {
        tracing::info!(
            records = out.len(),
            mountpoint,
            "files fsync'd before a crash by a mount at this directory spelt another way: uploaded by this mount"
        );
    }
    out
}

impl Drop for Writes {
    fn drop(&mut self) {
        let mut live = LIVE_STAGING.lock();
        if let Some(i) = live.iter().position(|d| *d == self.opts.staging_dir) {
            live.swap_remove(i);
        }
    }
}

/// Creates `dir` (and its parents) if missing, mode 0700: staged files are the user's.
fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
}

/// Whether `staged`'s upload must create its object, not replace one: on a mount that
/// may not replace objects, a file's first upload (black-box finding: another writer's
/// object created after the mount listed the folder was overwritten by a file the
/// mount created, as if new, within the listing's TTL); on any mount, the first upload
/// of a file created with `O_EXCL` or renamed with `RENAME_NOREPLACE` (black-box
/// finding: a lock file another node created meanwhile was replaced). A later upload
/// of the same file replaces what its first one made.
fn creates_only(opts: &WriteOptions, staged: &Staged) -> bool {
    (!opts.allow_overwrite || staged.exclusive.load(Ordering::Acquire))
        && staged.last.lock().is_none()
}

/// The write state of a mount.
pub(super) struct Writes {
    pub(super) opts: WriteOptions,
    by_path: Mutex<HashMap<Arc<str>, Arc<Staged>>>,
    handles: Mutex<HashMap<u64, Arc<Staged>>>,
    /// Read handles of files being written: they read the staging file.
    pub(super) readers: Mutex<HashMap<u64, Arc<Staged>>>,
    /// A written file was released (its path is free again).
    released: tokio::sync::Notify,
    /// Folder renames in progress, which creates and opens in them wait out.
    pub(super) moves: moves::FolderMoves,
    /// Directories made by `mkdir` that the store may not have yet.
    pub(super) local_dirs: Mutex<HashSet<Arc<str>>>,
    /// Directories files were created in (bounded): the second create lists one.
    created_in: Mutex<HashSet<Arc<str>>>,
    /// Parts on the wire across the mount's uploads (`upload_memory`).
    upload_slots: Arc<tokio::sync::Semaphore>,
    next_file: AtomicU64,
    /// Staged files an earlier run fsync'd and did not upload, until
    /// [`FsCore::recover_journaled`] takes them.
    journaled_left: Mutex<Vec<journal::Journaled>>,
    /// Names whose fsync'd file an earlier run left is being uploaded by this start
    /// ([`FsCore::recover_journaled`]): an exclusive create of one is EEXIST and an
    /// unlink drops the upload, as before the crash (black-box finding, round 21).
    replaying: Mutex<HashSet<Arc<str>>>,
    /// The store and prefix the mount shows (see `Staged::source`).
    source: Arc<str>,
    /// The canonical mountpoint (see `WriteOptions::mountpoint`), if UTF-8.
    mountpoint: Option<Arc<str>>,
    /// The same source as releases before the endpoint was part of it wrote it in
    /// fsync records (`s3://b/p|root`, not `s3://b/p at E|root`): such records are
    /// this mount's, so an upgrade uploads what an fsync kept before it.
    legacy_source: Option<Arc<str>>,
}

impl Writes {
    /// Whether an fsync'd file an earlier run left is being uploaded under `path`.
    pub(super) fn is_replaying(&self, path: &str) -> bool {
        self.replaying.lock().contains(path)
    }

    /// Creates (mode 0700) and empties the staging directory.
    pub(super) fn open(
        opts: WriteOptions,
        source: &str,
        legacy_source: Option<&str>,
    ) -> std::io::Result<Self> {
        make_private_dir(&opts.staging_dir)?;
        let files = staged_files_dir(&opts.staging_dir);
        make_private_dir(&files)?;
        // Files an fsync made durable are uploaded by the mount (`journal.rs`); the
        // rest were never acknowledged. Releases before the `files` folder staged at
        // the top: their records are taken too.
        let mountpoint: Option<Arc<str>> = opts
            .mountpoint
            .as_deref()
            .and_then(Path::to_str)
            .map(Arc::from);
        let mp = mountpoint.as_deref();
        let mut left = Self::journaled_left(&opts.staging_dir, mp, true)?;
        let in_files = Self::journaled_left(&files, mp, true)?;
        left.records.extend(in_files.records);
        left.kept.extend(in_files.kept);
        let kept: HashSet<PathBuf> = left
            .records
            .iter()
            .flat_map(|j| [j.file.clone(), j.record_file.clone()])
            .chain(left.kept.iter().cloned())
            .collect();
        let mut removed = 0;
        for dir in [&opts.staging_dir, &files] {
            for entry in std::fs::read_dir(dir)? {
                let entry = entry?;
                if entry.file_type()?.is_file() && !kept.contains(&entry.path()) {
                    std::fs::remove_file(entry.path())?;
                    removed += 1;
                }
            }
        }
        // New staging files are numbered past the kept ones.
        let next = kept
            .iter()
            .filter_map(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.split('.').next())
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .max()
            .map_or(1, |n| n + 1);
        let mut journaled = left.records;
        LIVE_STAGING.lock().push(opts.staging_dir.clone());
        if let Some(mp) = mp {
            journaled.extend(other_spellings(&opts.staging_dir, mp));
        }
        if removed > 0 {
            tracing::warn!(removed, dir = %opts.staging_dir.display(), "staged writes left by an earlier run removed (never uploaded)");
        }
        Ok(Writes {
            upload_slots: Arc::new(tokio::sync::Semaphore::new(
                (opts.upload_memory / opts.part_size.max(1) as u64).clamp(1, 1 << 20) as usize,
            )),
            opts,
            by_path: Mutex::default(),
            handles: Mutex::default(),
            readers: Mutex::default(),
            released: tokio::sync::Notify::new(),
            moves: moves::FolderMoves::default(),
            local_dirs: Mutex::default(),
            created_in: Mutex::default(),
            next_file: AtomicU64::new(next),
            journaled_left: Mutex::new(journaled),
            replaying: Mutex::new(HashSet::new()),
            source: Arc::from(source),
            mountpoint,
            legacy_source: legacy_source.map(Arc::from),
        })
    }

    /// A new staging file for `path` (refused while `path` is being written).
    /// Registers a new staging file for `path`, opened by thread `pid`. `filling`: it is
    /// to be filled with the object first (an open to change it in place), and hidden
    /// until then, from its birth (black-box finding: registered visible and hidden a
    /// moment later, a READDIRPLUS in between told the kernel its size of 0, and the
    /// `>>` that followed wrote at offset 0 over the file's start: 2-6 acknowledged
    /// appends lost per 20 s run of appends beside a lister on file://).
    fn stage(&self, path: &Arc<str>, pid: u32, filling: bool) -> Result<Arc<Staged>> {
        // Outside the lock: a procfs read.
        let opener = process_of(pid);
        // The staging file is made outside the table's lock, which every read of the
        // mount takes (black-box finding, round 21: one create on a frozen cache disk
        // held unrelated reads for the whole 12 s freeze); the name is checked again
        // before it is taken.
        if self.by_path.lock().contains_key(path) {
            return Err(Error::Busy(path.to_string()));
        }
        let n = self.next_file.fetch_add(1, Ordering::Relaxed);
        let files = staged_files_dir(&self.opts.staging_dir);
        let file_path = files.join(format!("{n}.part"));
        let create = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&file_path)
        };
        let file = create()
            .or_else(|e| {
                // The staging folder was removed under the daemon (a tmp cleaner, an
                // operator freeing space): made again, as at start (crash finding:
                // every create failed ENOENT until a restart).
                if e.kind() != std::io::ErrorKind::NotFound {
                    return Err(e);
                }
                tracing::warn!(dir = %self.opts.staging_dir.display(), "staging folder gone; made again");
                make_private_dir(&self.opts.staging_dir)?;
                make_private_dir(&files)?;
                create()
            })
            .map_err(|source| Error::Local {
                what: format!("creating staging file {}", file_path.display()),
                source,
            })?;
        let staged = Arc::new(Staged {
            path: Mutex::new(path.clone()),
            file,
            file_path,
            size: AtomicU64::new(0),
            written: AtomicU64::new(1),
            uploaded: AtomicU64::new(0),
            last: Mutex::new(None),
            base: Mutex::new(None),
            replaces: Mutex::new(journal::Precondition::Unknown),
            upload: Mutex::new(None),
            failed: AtomicBool::new(false),
            unanswered: AtomicBool::new(false),
            lost: Mutex::new(None),
            appending: AtomicBool::new(true),
            stream: Mutex::new(None),
            charge: Mutex::new(Charge::default()),
            budget: self.opts.local_files.clone(),
            evicted: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            unlinked: AtomicBool::new(false),
            ino: AtomicU64::new(0),
            opener,
            journaled: Mutex::new(None),
            exclusive: AtomicBool::new(false),
            record_file: Mutex::new(None),
            low_write: AtomicU64::new(u64::MAX),
            source: self.source.clone(),
            mountpoint: self.mountpoint.clone(),
            filling: AtomicBool::new(filling),
        });
        {
            let mut by_path = self.by_path.lock();
            if !by_path.contains_key(path) {
                by_path.insert(path.clone(), staged.clone());
                return Ok(staged);
            }
        }
        // Taken meanwhile: this staging file goes (with `staged`'s drop, outside the lock).
        if let Err(e) = std::fs::remove_file(&staged.file_path) {
            tracing::warn!(file = %staged.file_path.display(), error = %e, "removing an unused staging file failed");
        }
        Err(Error::Busy(path.to_string()))
    }

    /// Drops `staged` before any handle took it (an open that failed): its path is free
    /// again and its staging file removed.
    fn unstage(&self, staged: &Arc<Staged>) {
        let mut by_path = self.by_path.lock();
        if by_path
            .get(&staged.path())
            .is_some_and(|s| Arc::ptr_eq(s, staged))
        {
            by_path.remove(&staged.path());
        }
        drop(by_path);
        staged.uncharge();
        let _ = std::fs::remove_file(&staged.file_path);
    }

    /// Notes a create in `dir`; true from the second on.
    fn note_create_in(&self, dir: &Arc<str>) -> bool {
        let mut seen = self.created_in.lock();
        if seen.contains(dir) {
            return true;
        }
        // Directories written to at once are few; forget them all past a bound.
        if seen.len() >= 4096 {
            seen.clear();
        }
        seen.insert(dir.clone());
        false
    }

    /// The files being written under `prefix` (a directory's path and `/`).
    pub(super) fn staged_under(&self, prefix: &str) -> Vec<Arc<str>> {
        self.by_path
            .lock()
            .keys()
            .filter(|p| p.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// The file being written at `path`, once it is what the path shows (not while
    /// an open to change it fills it: black-box finding, its size of 0 went to the
    /// kernel in a listing's attributes, and the append that followed was written at
    /// offset 0 over the file's start: acknowledged appends lost).
    pub(super) fn staged(&self, path: &str) -> Option<Arc<Staged>> {
        self.by_path
            .lock()
            .get(path)
            .filter(|s| !s.filling.load(Ordering::Acquire))
            .cloned()
    }

    /// Whether `path` is being opened to change it in place (its object read into
    /// staging): being written, though [`Self::staged`] does not show it yet.
    pub(super) fn filling(&self, path: &str) -> bool {
        self.by_path
            .lock()
            .get(path)
            .is_some_and(|s| s.filling.load(Ordering::Acquire))
    }

    fn handle(&self, fh: u64) -> Option<Arc<Staged>> {
        self.handles.lock().get(&fh).cloned()
    }

    pub(super) fn is_local_dir(&self, path: &str) -> bool {
        self.local_dirs.lock().contains(path)
    }

    /// Staged files and local directories directly under `dir`, as listing entries.
    pub(super) fn children(&self, dir: &str) -> Vec<(String, Meta)> {
        let under = |p: &str| -> Option<String> {
            let rest = if dir.is_empty() {
                p
            } else {
                p.strip_prefix(dir)?.strip_prefix('/')?
            };
            (!rest.is_empty() && !rest.contains('/')).then(|| rest.to_string())
        };
        let mut out: Vec<(String, Meta)> = self
            .local_dirs
            .lock()
            .iter()
            .filter_map(|d| under(d).map(|n| (n, Meta::Dir)))
            .collect();
        out.extend(
            self.by_path
                .lock()
                .values()
                .filter(|s| !s.filling.load(Ordering::Acquire))
                .filter_map(|s| under(&s.path()).map(|n| (n, s.meta()))),
        );
        out
    }

    /// Free bytes where staging files go (statfs of a writable mount).
    pub(super) fn free_bytes(&self) -> Option<(u64, u64)> {
        use strata_cache_core::tiers::disk::room;
        let st = room::statvfs(&self.opts.staging_dir).ok()?;
        // Out of inodes, no new file fits however many bytes are free: counted as no
        // room, so making room frees files (black-box finding: with the inodes held by
        // passthrough copies, every create failed ENOSPC and no copy was given up,
        // bytes being plentiful).
        let room = room::room_of(&st);
        // A filesystem of no stated size (ramfs) has room, and no less size than room.
        Some((room, st.f_blocks.saturating_mul(st.f_frsize).max(room)))
    }
}

impl FsCore {
    pub(super) fn writes(&self) -> Result<&Writes> {
        self.writes.as_ref().ok_or(Error::ReadOnly)
    }

    /// Whether `path` is still being written, after waiting (up to [`SETTLE_WAIT`]) for
    /// the release of a file that was closed: the kernel sends RELEASE after `close`
    /// returns, without waiting, so a rename (`tempfile`'s persist, an atomic save), an
    /// unlink or a new open that follows a close at once would find the file still
    /// being written and fail with EBUSY. A file written since its last close is being
    /// written: no wait.
    pub(super) async fn settled(&self, path: &str) -> Option<Arc<Staged>> {
        let writes = self.writes.as_ref()?;
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            let released = writes.released.notified();
            let staged = writes.staged(path)?;
            if !staged.closed.load(Ordering::Acquire) {
                return Some(staged);
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return writes.staged(path);
            }
        }
    }

    /// Renames a file while it is being written (`tempfile`'s persist renames the file
    /// it still holds open: safetensors saves so): its staging entry moves to `to`, so
    /// its next flush uploads there. An object under `from` (an earlier flush's, or
    /// the one the file replaces) moves to `to` (so it needs `allow_delete`), where the
    /// close replaces it; a stream sending to `from` is broken, and
    /// the close uploads the file whole under `to`. Refused (EBUSY) during an upload,
    /// and once the file freed sent bytes (it could not be sent again).
    pub(super) async fn rename_staged(
        &self,
        staged: Arc<Staged>,
        from: &Arc<str>,
        from_dir: &super::Node,
        to: &Arc<str>,
        noreplace: bool,
    ) -> Result<()> {
        let writes = self.writes()?;
        self.check_file_target(to, noreplace).await?;
        // Its upload under `to` will only create: the store is asked now, as a closed
        // file's create-only copy asks it, not the mount's view, which may predate
        // another writer's object there (black-box finding, round 25b: the rename
        // returned 0, the close failed EEXIST, and the bytes were under neither name).
        if noreplace || !writes.opts.allow_overwrite {
            match self.reader.store().head(to).await {
                Ok(_) => {
                    self.changing(to);
                    self.attrs.invalidate(to).await;
                    return Err(if noreplace {
                        Error::Exists(to.to_string())
                    } else {
                        Error::NotPermitted(format!(
                            "{to}: replacing an object needs --allow-overwrite"
                        ))
                    });
                }
                Err(strata_cache_core::CacheError::NotFound(_)) => {}
                Err(e) => return Err(Error::Cache(e)),
            }
        }
        // An object under `from` goes with the rename.
        let uploaded = self.object_under(&staged, from).await;
        if uploaded && !writes.opts.allow_delete {
            return Err(Error::NotPermitted(format!(
                "{from}: a rename deletes the source object, which needs --allow-delete"
            )));
        }
        {
            // Under the upload slot's lock: no upload starts (reading the path it
            // sends to) while the path changes.
            let slot = staged.upload.lock();
            if staged.freed() > 0 || slot.is_some() {
                return Err(Error::Busy(from.to_string()));
            }
            let mut by_path = writes.by_path.lock();
            if by_path.contains_key(to) {
                return Err(Error::Busy(to.to_string()));
            }
            by_path.remove(from);
            by_path.insert(to.clone(), staged.clone());
            *staged.path.lock() = to.clone();
        }
        // Under its new name its first upload only creates, as `to` may have been made
        // since the check above.
        *staged.last.lock() = None;
        // Create-only under the new name only if this rename said so: an `O_EXCL`
        // create held for the old name, and an atomic save (a `mkstemp` file renamed
        // over the file it replaces while open) lost its bytes to EEXIST at the close,
        // and its fsync'd copy after a crash (black-box finding, round 25).
        staged.exclusive.store(noreplace, Ordering::Release);
        // Under its new name it replaces whatever is there whole (unknown here): so its
        // record says, rewritten next (round 20b: the record kept the old name's
        // precondition, and the replay dropped the renamed file).
        *staged.base.lock() = None;
        *staged.replaces.lock() = journal::Precondition::Unknown;
        staged.rejournal(creates_only(&writes.opts, &staged));
        staged.break_stream();
        // Changed: the next flush uploads it under its new name.
        staged.written.fetch_add(1, Ordering::AcqRel);
        if uploaded {
            // The object under `from` moves to `to` (until the close replaces it there),
            // unless the file may only be created under `to`: a crash or a failed upload
            // before the close leaves the durable version under the new name, as a
            // local disk would (black-box finding: deleting it at the rename lost a
            // file closed long before, when the daemon died before this writer's close).
            // If the store cannot move it (its writes refused), it is deleted as before:
            // the name must not keep an object the close will not replace.
            let store = self.reader.store();
            let moved = if creates_only(&writes.opts, &staged) {
                None
            } else {
                Some(store.rename(from, to).await)
            };
            let gone = match moved {
                Some(Ok(()) | Err(strata_cache_core::CacheError::NotFound(_))) => Ok(()),
                Some(Err(e)) => {
                    tracing::warn!(path = %from, to = %to, error = %e, "renamed while written; the object under the old name could not be moved: deleted");
                    store.delete(from).await
                }
                None => store.delete(from).await,
            };
            match gone {
                Ok(()) | Err(strata_cache_core::CacheError::NotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(path = %from, error = %e, "renamed while written; the object uploaded under the old name was not deleted")
                }
            }
        }
        self.counters.renames.fetch_add(1, Ordering::Relaxed);
        self.changing(from);
        self.changing(to);
        self.attrs.insert(from.clone(), Meta::Missing).await;
        self.relist(&from_dir.path, from, Some(Meta::Missing)).await;
        // `to` shows the file being written over any listed version until its upload.
        self.attrs.invalidate(to).await;
        // Not uploaded under `to` yet: no version to stand for.
        self.inodes.write().moved(from, to, None);
        Ok(())
    }

    /// Whether an object stands under `path` for a file being written there: one an
    /// earlier flush uploaded, or the one the file replaces.
    async fn object_under(&self, staged: &Staged, path: &str) -> bool {
        staged.uploaded.load(Ordering::Acquire) > 0 || self.reader.store().head(path).await.is_ok()
    }

    /// Unlinks a file while it is being written (POSIX lets a program remove a file it
    /// holds open, and write and read on: an anonymous temporary file): the name goes
    /// at once, the open handles keep the staging file, and nothing is uploaded. An
    /// object under the name (an earlier flush's, or the one the file replaces) is
    /// deleted, which needs `allow_delete`. Refused (EBUSY) during an upload.
    pub(super) async fn unlink_staged(
        &self,
        staged: Arc<Staged>,
        path: &Arc<str>,
        dir: &super::Node,
    ) -> Result<()> {
        let writes = self.writes()?;
        let object = self.object_under(&staged, path).await;
        if object && !writes.opts.allow_delete {
            return Err(Error::NotPermitted(format!(
                "{path}: deleting objects needs --allow-delete"
            )));
        }
        {
            let slot = staged.upload.lock();
            if slot.is_some() {
                return Err(Error::Busy(path.to_string()));
            }
            staged.unlinked.store(true, Ordering::Release);
            // Never uploaded, also after a crash.
            staged.unjournal();
            let mut by_path = writes.by_path.lock();
            if by_path.get(path).is_some_and(|s| Arc::ptr_eq(s, &staged)) {
                by_path.remove(path);
            }
        }
        staged.break_stream();
        if object {
            match self.reader.store().delete(path).await {
                Ok(()) | Err(strata_cache_core::CacheError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            self.counters.deletes.fetch_add(1, Ordering::Relaxed);
        }
        self.inodes.write().detach(path);
        self.changing(path);
        self.attrs.insert(path.clone(), Meta::Missing).await;
        self.relist(&dir.path, path, Some(Meta::Missing)).await;
        writes.released.notify_waiters();
        Ok(())
    }

    /// The file a write handle of inode `ino` is writing, as its attributes say now.
    pub(super) fn handle_meta(&self, ino: u64) -> Option<Meta> {
        let writes = self.writes.as_ref()?;
        let handles = writes.handles.lock();
        let staged = handles
            .values()
            .find(|s| s.ino.load(Ordering::Acquire) == ino)?;
        Some(staged.meta())
    }

    /// Whether this mount takes writes.
    pub fn writable(&self) -> bool {
        self.writes.is_some()
    }

    /// Whether an existing object's file may be opened for writing (`allow_overwrite`).
    pub fn changes_objects(&self) -> bool {
        self.writes.as_ref().is_some_and(|w| w.opts.allow_overwrite)
    }

    /// Creates `name` in directory `parent` for writing, by thread `pid` (the FUSE
    /// request's; 0: unknown); returns its entry and handle.
    pub async fn create(&self, parent: u64, name: &str, pid: u32) -> Result<(Entry, u64)> {
        self.create_with(parent, name, pid, libc::O_TRUNC).await
    }

    /// [`Self::create`] with the caller's open `flags`. `O_EXCL`: the name must be
    /// free, here and in the store when the file is first uploaded (EEXIST at the close
    /// if another writer took it meanwhile), also on a mount that may replace objects.
    /// Without `O_TRUNC` (`>>`, `open(O_CREAT)` of a database) a name the mount's cache
    /// says is free is asked of the store: made by another writer since, it is ESTALE
    /// (its metadata updated), and the kernel looks it up again and opens it, as it
    /// would an existing file (black-box finding: `>>` of a log another writer had
    /// just created replaced it with the appended line).
    pub async fn create_with(
        &self,
        parent: u64,
        name: &str,
        pid: u32,
        flags: i32,
    ) -> Result<(Entry, u64)> {
        let exclusive = flags & libc::O_EXCL != 0;
        let keeps = flags & (libc::O_EXCL | libc::O_TRUNC) == 0;
        let writes = self.writes()?;
        let (path, staged) = loop {
            let _turn = self.wait_while_moving(writes, parent).await?;
            let (path, dir) = self.new_child_of(parent, name)?;
            // A second file created in a directory whose listing is not cached: list it
            // once, so that the kernel's lookup of each next new name (a miss) is answered
            // from the listing, not by a HEAD and a LIST of its own. (Not at the first: one
            // file written into a huge dataset directory should not list all of it. Not
            // where the cache would not keep it: with `--metadata-ttl 0` each create
            // listed the whole folder again, 0.38 s per file in one of 20,000 names.)
            if writes.note_create_in(&dir.path)
                && self.listing_would_be_kept(&dir.path)
                && self.listings.get(&dir.path).await.is_none()
            {
                self.listing(&dir.path).await?;
            }
            if let Some(s) = self.settled(&path).await {
                return Err(Error::Busy(s.path().to_string()));
            }
            // A file fsync'd before a crash, on its way to the store: it exists, as it
            // did before the crash (black-box finding, round 21: an O_EXCL create of
            // such a name succeeded, and the replay then dropped the fsync'd bytes).
            if writes.is_replaying(&path) && (exclusive || !writes.opts.allow_overwrite) {
                return Err(Error::Exists(path.to_string()));
            }
            // Any other create waits until they land: one that keeps the content
            // (`>>`) would start from nothing and drop the fsync'd bytes (round 21b: 6
            // bytes of 2 MiB left), and a replacement (O_TRUNC) could be overwritten
            // by their upload already on the wire (round 21b: `echo new > B` uploaded,
            // then B's fsync'd copy over it).
            if writes.is_replaying(&path) {
                return Err(Error::Busy(format!(
                    "{path}: a file fsync'd before a crash is still being uploaded; try again once it lands"
                )));
            }
            // A name through (or of) a link out of a local store is refused when it is
            // created, not at the close's upload (black-box finding: `echo data >
            // link` exited 0, the close's EINVAL unseen by the shell, the data dropped).
            self.reader.store().local_write_inside(&path).await?;
            match self.meta(&path).await? {
                Meta::Dir => return Err(Error::IsDir(path.to_string())),
                Meta::File(_) if !writes.opts.allow_overwrite || exclusive => {
                    return Err(Error::Exists(path.to_string()))
                }
                Meta::Missing if keeps => self.still_missing(&path).await?,
                _ => {}
            }
            let staged = self.stage_making_room(writes, &path, pid, false)?;
            *staged.replaces.lock() = journal::Precondition::Ask;
            if !writes.moves.covers(&path) {
                break (path, staged);
            }
            // Its folder's rename began since the wait (and may have checked the files
            // being written in it before this one was staged): give way, and try again
            // under the folder's name once the rename is done (black-box finding:
            // creates met a second rename right after the first and failed EBUSY).
            writes.unstage(&staged);
        };
        let (ino, generation) = self.inodes.write().intern(&path, Kind::File, None, true);
        staged.exclusive.store(exclusive, Ordering::Release);
        staged.ino.store(ino, Ordering::Release);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        writes.handles.lock().insert(fh, staged.clone());
        let entry = Entry {
            attr: self.attr_of(ino, &staged.meta()),
            generation,
            // The kernel must not keep this name: a file whose upload fails is gone at
            // its release, and an open(O_CREAT) of a name the kernel still holds is an
            // open of that inode (ENOENT), not a create, until the entry expires.
            ttl: std::time::Duration::ZERO,
        };
        Ok((entry, fh))
    }

    /// Opens existing file `ino` for writing, by thread `pid` (0: unknown), with
    /// `allow_overwrite`: to replace it whole (`truncate`), or to change it (append, or
    /// write in place: a log opened with `"a"`, a small database): then its bytes are
    /// read into the staging file first, and the close uploads it whole if it changed
    /// (the last close wins; the object is replaced, never patched). Objects over
    /// `rewrite_max` are only replaced (ENOTSUP otherwise).
    pub async fn open_write(&self, ino: u64, truncate: bool, pid: u32) -> Result<Opened> {
        let writes = self.writes()?;
        loop {
            // Not while a folder it is in is being renamed: changed under its old name,
            // it would be uploaded there (see `write/moves.rs`).
            let _turn = self.wait_while_moving(writes, ino).await?;
            if let Some(opened) = self.open_write_once(writes, ino, truncate, pid).await? {
                return Ok(opened);
            }
        }
    }

    /// [`Self::open_write`] outside folder renames; None: one began meanwhile.
    async fn open_write_once(
        &self,
        writes: &Writes,
        ino: u64,
        truncate: bool,
        pid: u32,
    ) -> Result<Option<Opened>> {
        let node = self.node(ino)?;
        if let Some(s) = self.settled(&node.path).await {
            return Err(Error::Busy(s.path().to_string()));
        }
        let obj = match self.meta(&node.path).await? {
            Meta::Dir => return Err(Error::IsDir(node.path.to_string())),
            Meta::Missing => return Err(super::gone_since_lookup(&node.path)),
            Meta::File(obj) => obj,
        };
        if !writes.opts.allow_overwrite {
            return Err(Error::NotPermitted(format!(
                "{}: replacing or changing an object needs --allow-overwrite",
                node.path
            )));
        }
        // A name the store holds but cannot write (a local directory's file of 252-255
        // bytes: no room for `NAME#N`) is refused here, as a create of it is, not after
        // the whole write at the close (black-box finding, round 22b: EIO at the close).
        if let Some(e) = self.reader.store().unstorable_name(&node.path) {
            return Err(Error::Cache(e));
        }
        if !truncate && obj.size > writes.opts.rewrite_max {
            return Err(Error::Unsupported(format!(
                "{}: changing an object of {} bytes in place (at most {}: it is read into a \
                 staging file first); replace it whole (open with O_TRUNC)",
                node.path, obj.size, writes.opts.rewrite_max
            )));
        }
        if !truncate {
            if node.version.as_ref().is_some_and(|had| *had != obj.version) {
                // The inode stands for an older version (see `FsCore::open`).
                return Err(Error::Cache(CacheError::Changed(format!(
                    "{}: replaced since it was looked up (a lookup finds the new version)",
                    node.path
                ))));
            }
            self.still_current(&node.path, &obj).await?;
        }
        let staged = self.stage_making_room(writes, &node.path, pid, !truncate)?;
        if writes.moves.covers(&node.path) {
            // Its folder's rename began since the wait (see `create_with`).
            writes.unstage(&staged);
            return Ok(None);
        }
        staged.ino.store(ino, Ordering::Release);
        if !truncate {
            *staged.base.lock() = Some(obj.clone());
        } else {
            *staged.replaces.lock() = journal::Precondition::Ask;
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if !truncate {
            let filled = self.fill_staged(&staged, &obj, pid, fh).await;
            staged.filling.store(false, Ordering::Release);
            if let Err(e) = filled {
                writes.unstage(&staged);
                return Err(e);
            }
        }
        writes.handles.lock().insert(fh, staged);
        Ok(Some(Opened {
            fh,
            keep_cache: false,
            passthrough: None,
            direct_io: false,
        }))
    }

    /// Checks with the store (one HEAD, past the metadata TTL) that `obj` is still the
    /// version of its path, before it is changed in place: the change is uploaded
    /// whole, so one made to an older version would put that version back over the
    /// newer one. A version that changed (or went) is ESTALE after its metadata is
    /// updated, so the kernel looks the path up again and opens the current version
    /// (black-box finding: `>>`, an `r+` patch or a `truncate` of a file another node
    /// had replaced within the TTL, its old blocks cached here, wrote old version +
    /// change over the new one, exit code 0).
    async fn still_current(&self, path: &Arc<str>, obj: &ObjectInfo) -> Result<()> {
        let now = match self.reader.store().head(path).await {
            Ok(info) => Meta::File(Arc::new(info)),
            Err(CacheError::NotFound(_)) => Meta::Missing,
            Err(e) => return Err(e.into()),
        };
        // The same version at another size too: the size came from a wrong listing or
        // HEAD answer, and the staging fill would cut the object there (black-box
        // finding: an append over a listing 1,000 bytes short stored the object without
        // its last 1,000 bytes, close 0).
        if matches!(&now, Meta::File(info) if info.version == obj.version && info.size == obj.size)
        {
            return Ok(());
        }
        self.changing(path);
        self.attrs.insert(path.clone(), now.clone()).await;
        if let Some(dir) = self.parent_of(path).map(Arc::<str>::from) {
            self.relist(&dir, path, Some(now)).await;
        }
        Err(Error::Cache(CacheError::Changed(format!(
            "{path}: replaced or removed in the store since it was looked up; open it again"
        ))))
    }

    /// Waits while inode `ino` is (in) a folder being renamed (see `write/moves.rs`);
    /// the turn it returns, if it waited, is held until the caller staged its file.
    pub(super) async fn wait_while_moving<'w>(
        &self,
        writes: &'w Writes,
        ino: u64,
    ) -> Result<Option<moves::WaitTurn<'w>>> {
        writes
            .moves
            .wait_while_covers(|| Ok(self.node(ino)?.path.clone()))
            .await
    }

    /// Checks with the store (one HEAD) that no object is named `path`, which the
    /// mount's metadata said: one made since is ESTALE, its metadata updated (see
    /// [`Self::create_with`]).
    async fn still_missing(&self, path: &Arc<str>) -> Result<()> {
        let info = match self.reader.store().head(path).await {
            Ok(info) => Arc::new(info),
            Err(CacheError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        self.changing(path);
        let now = Meta::File(info);
        self.attrs.insert(path.clone(), now.clone()).await;
        if let Some(dir) = self.parent_of(path).map(Arc::<str>::from) {
            self.relist(&dir, path, Some(now)).await;
        }
        Err(Error::Cache(CacheError::Changed(format!(
            "{path}: created in the store since the mount looked; open it again"
        ))))
    }

    /// A read handle of `path` if it is being written here: it reads what was written
    /// so far from the staging file, as on a local disk (`tail -f` of a log, a reader of
    /// a shard being saved), every read reaching the daemon since the file grows. Bytes
    /// already sent and freed past the budget cannot be read (ENOTSUP, the reason).
    pub(super) fn open_staged(&self, path: &str) -> Option<Opened> {
        let writes = self.writes.as_ref()?;
        let staged = writes.staged(path)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        writes.readers.lock().insert(fh, staged);
        Some(Opened {
            fh,
            keep_cache: false,
            passthrough: None,
            direct_io: true,
        })
    }

    /// Reads `obj` into the staging file of `staged` (opened to change it in place):
    /// afterwards the file is the object, unchanged, so a close without a write uploads
    /// nothing.
    async fn fill_staged(
        &self,
        staged: &Arc<Staged>,
        obj: &ObjectInfo,
        pid: u32,
        fh: u64,
    ) -> Result<()> {
        staged.written.store(0, Ordering::Release);
        staged.appending.store(false, Ordering::Release);
        let ctx = AccessContext::demand(self.job_of(pid, fh), self.now_ns());
        let mut offset = 0u64;
        while offset < obj.size {
            let len = (obj.size - offset).min(FILL_CHUNK);
            let data = match self.reader.read(obj, offset, len, &ctx).await {
                Ok(data) => data,
                // Renamed away or removed since it was looked up (another process's
                // `mv`): ESTALE, so the kernel looks the name up again, as for the
                // OPEN of a name gone (`gone_since_lookup`; black-box finding: `>>`
                // opens failed ENOENT while the name was renamed away and back).
                Err(CacheError::NotFound(_)) => return Err(super::gone_since_lookup(&obj.path)),
                Err(e) => return Err(e.into()),
            };
            if data.len() as u64 != len {
                return Err(Error::Unsupported(format!(
                    "{}: changed in the store while read for an in-place change",
                    obj.path
                )));
            }
            let s = staged.clone();
            let at = offset;
            tokio::task::spawn_blocking(move || {
                s.charge_upto(at + data.len() as u64);
                s.changed_from(at);
                s.file.write_all_at(&data, at)
            })
            .await
            .map_err(|e| Error::Local {
                what: format!("staging {}", obj.path),
                source: std::io::Error::other(e),
            })?
            .map_err(|source| Error::Local {
                what: format!("staging {}", obj.path),
                source,
            })?;
            offset += len;
        }
        staged.size.store(obj.size, Ordering::Release);
        Ok(())
    }

    /// The attributes of `path` while it is staged, or of a directory made here.
    /// Whether `path` is a file being written (staged) now.
    pub(super) fn is_being_written(&self, path: &str) -> bool {
        self.writes
            .as_ref()
            .is_some_and(|w| w.staged(path).is_some())
    }

    pub(super) fn written_meta(&self, path: &str) -> Option<Meta> {
        let writes = self.writes.as_ref()?;
        if let Some(s) = writes.staged(path) {
            return Some(s.meta());
        }
        writes.is_local_dir(path).then_some(Meta::Dir)
    }

    /// The attributes of inode `ino` through its open handle `fh`, if that handle is of
    /// a file being written: an `fstat` names the file by handle, and a file renamed or
    /// unlinked while open has no path to look up (an anonymous temporary file).
    pub fn staged_attr(&self, ino: u64, fh: u64) -> Option<Entry> {
        let writes = self.writes.as_ref()?;
        let staged = writes
            .handle(fh)
            .or_else(|| writes.readers.lock().get(&fh).cloned())?;
        Some(Entry {
            attr: self.attr_of(ino, &staged.meta()),
            generation: 0,
            ttl: self.ttl(),
        })
    }

    /// Whether `fh` is a handle opened for writing.
    pub fn is_write_handle(&self, fh: u64) -> bool {
        self.writes
            .as_ref()
            .is_some_and(|w| w.handles.lock().contains_key(&fh))
    }

    /// Writes `data` at `offset` of write handle `fh`. Blocking (a local `pwrite`).
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let writes = self.writes()?;
        let staged = writes.handle(fh).ok_or(Error::BadHandle {
            what: "write handle",
            id: fh,
        })?;
        let freed = staged.freed();
        let stream = staged.stream.lock().as_ref().map(|s| s.ctl.clone());
        let below_sent = stream
            .as_ref()
            .is_some_and(|c| offset < c.read_upto.load(Ordering::Acquire));
        // Below what was sent, once some of it was freed, the file cannot be uploaded
        // whole again: refused here rather than at the close. So is any write once a
        // flush completed the stream of a freed file (a second stream would send the
        // freed bytes as zeros): the object is what that close uploaded.
        if offset < freed || (freed > 0 && (below_sent || stream.is_none())) {
            // The file now misses what the program wrote: it is not uploaded, and its
            // close fails (black-box finding: a zip or a header-patched checkpoint
            // whose patch was refused was published unpatched, close returning 0).
            staged.lose(offset..offset + data.len() as u64, libc::ENOTSUP);
            return Err(freed_error(&staged.path(), offset, freed));
        }
        if let Some(ctl) = stream.as_ref().filter(|_| below_sent) {
            // Before the room is made: a broken stream's bytes are not freed.
            ctl.broken.store(true, Ordering::Release);
        }
        let end = offset + data.len() as u64;
        // A stream sends parts of one size, and an upload takes at most
        // `MAX_UPLOAD_PARTS` of them. A file that grows past that is uploaded at its close
        // in larger parts, which needs all of it staged: its stream is broken before
        // anything is freed, or, once some was, the write fails EFBIG at once and the
        // close fails (black-box finding: 78 GiB written in order all returned 0, then
        // the close failed ENOTSUP and nothing was stored).
        let largest = writes.opts.part_size as u64 * strata_cache_core::store::MAX_UPLOAD_PARTS;
        if let Some(ctl) = stream.as_ref().filter(|_| end > largest) {
            if freed > 0 {
                staged.lose(offset..end, libc::EFBIG);
                return Err(Error::FileTooLarge(format!(
                    "{}: a file written in order past {largest} bytes ({} parts of {} \
                     bytes, the most one upload takes) must fit in the disk budget to be \
                     uploaded in larger parts at its close; its first {freed} bytes were \
                     already sent and freed",
                    staged.path(),
                    strata_cache_core::store::MAX_UPLOAD_PARTS,
                    writes.opts.part_size,
                )));
            }
            ctl.broken.store(true, Ordering::Release);
        }
        // Room first (copies evicted before the bytes land: on a nearly full disk that
        // is what lets them land), except for a write past the end that leaves a hole:
        // charged once it landed, so one at an absurd offset (EFBIG) evicts nothing.
        let leaves_hole = offset > staged.size.load(Ordering::Acquire);
        if !leaves_hole {
            staged.charge_upto(end);
        }
        staged.changed_from(offset);
        let mut landed = staged.file.write_all_at(data, offset);
        if landed.as_ref().is_err_and(is_no_space)
            && self.make_device_room(staged.budget.as_deref(), data.len() as u64)
        {
            landed = staged.file.write_all_at(data, offset);
        }
        if landed.as_ref().is_err_and(is_no_space) {
            // Full of what is staged: the budget comes down to it (the next writes wait
            // for their streams, `write_wait`), and this file frees what it has sent.
            if let Some(budget) = staged.budget.as_deref() {
                budget.device_full();
                landed = self.write_freeing_sent(&staged, budget, data, offset);
            }
        }
        if let Err(source) = landed {
            // A write that failed (ENOSPC) keeps no charge.
            staged.charge_exactly(staged.size.load(Ordering::Acquire));
            // Unless refused before anything landed (an offset past the largest file),
            // the file misses bytes it was written: it must not be uploaded so.
            let errno = source.raw_os_error().unwrap_or(libc::EIO);
            if !matches!(errno, libc::EFBIG | libc::EINVAL) {
                staged.lose(offset..end, errno);
            }
            return Err(Error::Local {
                what: format!("writing {}", staged.path()),
                source,
            });
        }
        if leaves_hole {
            staged.charge_upto(end);
        }
        staged.recover(offset..end);
        let before = staged.size.fetch_max(end, Ordering::AcqRel);
        if offset != before {
            staged.appending.store(false, Ordering::Release);
        }
        staged.written.fetch_add(1, Ordering::AcqRel);
        staged.closed.store(false, Ordering::Release);
        // After the bytes landed: a stream that read below them has sent stale bytes.
        let stream = staged.stream.lock().as_ref().map(|s| s.ctl.clone());
        match stream {
            Some(ctl) => {
                if offset < ctl.read_upto.load(Ordering::Acquire) {
                    ctl.broken.store(true, Ordering::Release);
                }
                ctl.wake.notify_one();
            }
            None => self.maybe_stream(&staged),
        }
        Ok(data.len() as u32)
    }

    /// A write that met a staging file system full of what is staged: the file frees
    /// what its stream has sent and writes again, waiting (up to [`FULL_DEVICE_WAIT`],
    /// polled: this may run on the FUSE session thread) for its own stream or the other
    /// files' to send and free more. ENOSPC if no room comes (black-box finding: of
    /// three files written in order at once onto a full staging disk, two failed
    /// ENOSPC within 0.2 s: they had sent nothing of their own to free).
    fn write_freeing_sent(
        &self,
        staged: &Staged,
        budget: &PassthroughStore,
        data: &[u8],
        offset: u64,
    ) -> std::io::Result<()> {
        let ctl = staged.stream.lock().as_ref().map(|s| s.ctl.clone());
        let deadline = std::time::Instant::now() + FULL_DEVICE_WAIT;
        loop {
            staged.free_sent(budget);
            staged.changed_from(offset);
            match staged.file.write_all_at(data, offset) {
                Err(e) if is_no_space(&e) => {}
                r => return r,
            }
            let broken = ctl
                .as_ref()
                .is_some_and(|c| c.broken.load(Ordering::Acquire));
            if broken || std::time::Instant::now() >= deadline {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            if let Some(c) = &ctl {
                c.wake.notify_one();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// [`Writes::stage`], once more after making room when the staging file system is
    /// full (its bytes or its inodes) of what Strata keeps there (copies, blocks).
    fn stage_making_room(
        &self,
        writes: &Writes,
        path: &Arc<str>,
        pid: u32,
        filling: bool,
    ) -> Result<Arc<Staged>> {
        match writes.stage(path, pid, filling) {
            Err(Error::Local { source, .. })
                if source.raw_os_error() == Some(libc::ENOSPC)
                    && self.make_device_room(writes.opts.local_files.as_deref(), 0) =>
            {
                writes.stage(path, pid, filling)
            }
            r => r,
        }
    }

    /// After ENOSPC on the staging directory's file system: what Strata keeps there
    /// that can be made again goes, least recently used first (passthrough copies,
    /// then disk-tier blocks), until a write of `len` bytes and [`DEVICE_SLACK`] more
    /// fit. True if any room was made (the write is tried again). A disk tier whose
    /// budget is larger than its file system only learns the device is full when its
    /// own writes fail: without this, a cache dir filled with copies and blocks
    /// failed every write through the mount with ENOSPC (black-box finding: 86 of 100
    /// writes). Blocking: the engine's removals run on a thread of their own, so this
    /// is safe from any caller, inside the runtime's context or not.
    fn make_device_room(&self, copies: Option<&PassthroughStore>, len: u64) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(writes) = self.writes() else {
            return false;
        };
        let Ok(dev) = std::fs::metadata(&writes.opts.staging_dir).map(|m| m.dev()) else {
            return false;
        };
        let free = || writes.free_bytes().map_or(0, |(free, _)| free);
        let want = len.saturating_add(DEVICE_SLACK);
        let before = free();
        let mut copies_deleted = 0;
        if let Some(copies) = copies.filter(|c| c.device() == Some(dev)) {
            copies_deleted = copies.evict_until(|| free() >= want);
        }
        let mut blocks_freed = 0;
        let short = want.saturating_sub(free());
        if short > 0 {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let engine = self.reader.engine();
                blocks_freed = std::thread::scope(|s| {
                    s.spawn(|| rt.block_on(engine.shed_persistent(dev, short)))
                        .join()
                        .unwrap_or(0)
                });
            }
        }
        let after = free();
        tracing::warn!(
            copies_deleted,
            blocks_freed,
            free_before = before,
            free_after = after,
            "the staging file system was full: made room from cached copies and blocks"
        );
        copies_deleted > 0 || blocks_freed > 0
    }

    /// The wait a write to `fh` ending at `end` owes first, if any: past the budget,
    /// a file whose stream has not taken all but [`BACKLOG_PARTS`] parts of what was
    /// written waits for it (bounded by [`BACKLOG_WAIT`]), so a checkpoint written
    /// faster than the store takes it stays within the budget instead of piling up on
    /// disk. It costs no time: the close waits for the upload anyway. The FUSE adapter
    /// awaits it off the session thread, then writes.
    pub fn write_wait(&self, fh: u64, end: u64) -> Option<BoxFuture<'static, ()>> {
        let writes = self.writes.as_ref()?;
        let staged = writes.handle(fh)?;
        let budget = staged.budget.as_ref()?;
        let ctl = staged.stream.lock().as_ref().map(|s| s.ctl.clone())?;
        let limit = BACKLOG_PARTS * writes.opts.part_size as u64;
        let behind = {
            let ctl = ctl.clone();
            move || {
                !ctl.broken.load(Ordering::Acquire)
                    && end.saturating_sub(ctl.taken_upto.load(Ordering::Acquire)) > limit
            }
        };
        // Past the budget: the room staging has left would not hold this write.
        let growth = end.saturating_sub(staged.size.load(Ordering::Acquire));
        if !behind() || budget.room_for_staging() >= growth.max(1) {
            return None;
        }
        Some(
            async move {
                let waited = tokio::time::timeout(BACKLOG_WAIT, async {
                    loop {
                        let took = ctl.took.notified();
                        if !behind() {
                            return;
                        }
                        took.await;
                    }
                })
                .await;
                if waited.is_err() {
                    tracing::debug!(
                        "a write waited {BACKLOG_WAIT:?} for its stream; it lands past the budget"
                    );
                }
            }
            .boxed(),
        )
    }

    /// Starts streaming `staged` if it was written in order past `stream_from` (and a
    /// runtime is there to run the sender; else it is uploaded at close).
    fn maybe_stream(&self, staged: &Arc<Staged>) {
        let Some(writes) = self.writes.as_ref() else {
            return;
        };
        let opts = &writes.opts;
        if staged.is_journaled() {
            // Its fsync record names the staged file whole (`journal.rs`).
            return;
        }
        if staged.freed() > 0 || staged.unlinked.load(Ordering::Acquire) {
            // Its stream was completed by a flush; what it freed cannot be sent again.
            return;
        }
        // With the budget spent on staged files, from its first whole part: what the
        // stream sent can then be freed instead of the budget overrun
        // (`Staged::free_sent`).
        let short = staged
            .budget
            .as_ref()
            .is_some_and(|b| b.room_for_staging() < opts.part_size as u64);
        let from = if short {
            opts.stream_from.min(opts.part_size as u64)
        } else {
            opts.stream_from
        };
        if opts.stream_from == 0
            || staged.size.load(Ordering::Acquire) < from
            || !staged.appending.load(Ordering::Acquire)
        {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut slot = staged.stream.lock();
        if slot.is_some() {
            return;
        }
        let ctl = Arc::new(StreamCtl::default());
        let task = rt.spawn(stream_upload(
            self.reader.store().clone(),
            staged.clone(),
            ctl.clone(),
            UploadShape {
                part_size: opts.part_size,
                in_flight: opts.parts_in_flight,
                slots: Some(writes.upload_slots.clone()),
                only_if_absent: creates_only(&writes.opts, staged),
            },
        ));
        *slot = Some(Stream { ctl, task });
    }

    /// Reads of a write handle (opened `O_RDWR`), or of a read handle of a file being
    /// written (`open_staged`): from its staging file. Blocking.
    pub(super) fn read_staged(&self, fh: u64, offset: u64, size: u32) -> Option<Result<Bytes>> {
        let writes = self.writes.as_ref()?;
        let staged = writes
            .handle(fh)
            .or_else(|| writes.readers.lock().get(&fh).cloned())?;
        Some(read_back(&staged, offset, size))
    }

    /// A read of a handle opened on `path` before it was opened for writing: while the
    /// file is written, what it holds now (as a local file's reader sees appends). Its
    /// old version's bytes would be a short read of a file that grew, which makes the
    /// kernel shrink the file's size, and the next `O_APPEND` write then lands over the
    /// last one (`tail -f` of a log appended to with `>>` lost lines so).
    pub(super) fn read_written(&self, path: &str, offset: u64, size: u32) -> Option<Result<Bytes>> {
        let staged = self.writes.as_ref()?.staged(path)?;
        Some(read_back(&staged, offset, size))
    }

    /// An upload through this mount made `info` the version of its path: handles of
    /// older versions are superseded (see [`FsCore::read`]), as for a version opened
    /// anew, rather than read the old bytes short; and the inode written through
    /// stands for the new version (its page cache holds what was written), so opens
    /// of it read that.
    fn supersede(&self, info: &ObjectInfo) {
        let mut inodes = self.inodes.write();
        let ino = inodes.by_path.get(info.path.as_ref()).copied();
        if let Some(ino) = ino {
            if let Some(n) = inodes.nodes.get_mut(&ino) {
                n.version = Some(info.version.clone());
            }
            drop(inodes);
            self.opened_versions
                .lock()
                .insert(ino, info.version.clone());
        }
    }

    /// Sets the size of `ino` (truncate). A file being written is resized in place; an
    /// object not being written (`truncate(path)`, no handle) is changed as an open for
    /// writing would change it (needs `allow_overwrite`, at most `rewrite_max` bytes
    /// unless truncated to 0): staged, resized and uploaded before this returns.
    /// Changes of times, mode or owner are accepted and ignored on any file (the store
    /// keeps none of them; `tar -x` and `cp -p` set them after writing and would fail
    /// otherwise).
    /// `fh`: the handle of an `ftruncate` (the file it names, also once renamed or
    /// unlinked while open).
    pub async fn setattr(
        self: &Arc<Self>,
        ino: u64,
        size: Option<u64>,
        fh: Option<u64>,
    ) -> Result<Entry> {
        let writes = self.writes()?;
        let node = self.node(ino)?;
        if let (None, Some(_)) = (fh, size) {
            // Another process's truncate by path waits for an upload under way (a
            // close's), which reads the file at the size it started with (one that
            // still meets it goes again: `upload`); then it finds the file as it is
            // (black-box finding: resized after the close's upload, it changed a file
            // no upload would send again, and returned 0 with the store unchanged).
            if let Some(staged) = writes.staged(&node.path) {
                staged.upload_done().await;
            }
        }
        let by_handle = fh.and_then(|f| writes.handle(f));
        let Some(staged) = by_handle.or_else(|| writes.staged(&node.path)) else {
            let Some(size) = size else {
                let meta = self.meta(&node.path).await?;
                return self.entry_for(&node.path, &meta, false);
            };
            let opened = self.open_write(ino, size == 0, 0).await?;
            let resized = match writes.handle(opened.fh) {
                Some(staged) => match resize_staged(&staged, size) {
                    Ok(()) => {
                        let meta = staged.meta();
                        self.flush(opened.fh).await.map(|()| meta)
                    }
                    Err(e) => Err(e),
                },
                None => Err(Error::BadHandle {
                    what: "write handle",
                    id: opened.fh,
                }),
            };
            self.release_write(opened.fh).await;
            return self.entry_for(&node.path, &resized?, false);
        };
        if let Some(size) = size {
            resize_staged(&staged, size)?;
        }
        // The inode asked about, as it is: not the path's (an `ftruncate` of a file
        // unlinked while open re-made its path an inode, which the next file created
        // there then shared with it; the kernel took the two for one, and that file's
        // close was taken for a close of a copy of the other's descriptor, the upload
        // left to its release and the next open EBUSY: black-box finding).
        let meta = staged.meta();
        if let (Meta::File(obj), Some(n)) = (&meta, self.inodes.write().nodes.get_mut(&ino)) {
            n.told_size = Some(obj.size);
        }
        Ok(Entry {
            attr: self.attr_of(ino, &meta),
            generation: 0,
            ttl: self.ttl(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Black-box finding (round 11): a file opened to be appended to was registered
    /// visible (size 0) and hidden a moment later, on another thread than a concurrent
    /// READDIRPLUS; in between the listing told the kernel size 0 and the append went
    /// to offset 0. Staged to be filled, it is hidden from the moment it is registered.
    #[test]
    fn a_file_staged_to_be_filled_is_hidden_from_its_registration() {
        let dir = tempfile::tempdir().expect("tempdir");
        let writes = Writes::open(WriteOptions::new(dir.path().join("staging")), "mem|", None)
            .expect("open");
        let (filled, created): (Arc<str>, Arc<str>) = (Arc::from("d/log"), Arc::from("d/new"));
        let staged = writes.stage(&filled, 0, true).expect("stage to fill");
        assert!(
            writes.staged(&filled).is_none(),
            "the object, not the partial copy"
        );
        assert!(writes.children("d").is_empty());
        staged.filling.store(false, Ordering::Release);
        assert!(writes.staged(&filled).is_some(), "the file once filled");
        writes.stage(&created, 0, false).expect("stage a create");
        assert!(
            writes.staged(&created).is_some(),
            "a created file shows at once"
        );
        assert_eq!(writes.children("d").len(), 2);
    }
}
