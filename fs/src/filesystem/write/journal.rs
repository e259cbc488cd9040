//! `fsync` of a file being written: durable on the cache disk, uploaded at the close.
//!
//! The object is written whole, so an `fsync` that uploads sends the whole file each
//! time: a log fsync'd per line, or sqlite committing, uploaded the square of the file
//! (black-box finding: 1,000 fsync'd 100-byte lines sent 50 MB for a 100 KB log; 200
//! sqlite autocommits, 98 MB for a 930 KB database). Instead, an `fsync` of a file with
//! changes not uploaded makes its staging file durable (`fdatasync`) and records where
//! it goes beside it (`<n>.part.json`, written atomically and synced): the close uploads
//! it once, as without the fsync. A crash before the close leaves both files, and the
//! next start of the mount uploads the staged file to its recorded name
//! ([`FsCore::recover_journaled`]): what an fsync acknowledged is not lost. (JuiceFS's
//! write-back cache makes the same trade: durable on the local disk at fsync, in the
//! store at the close or once the daemon is back.)
//!
//! A file the fsync cannot leave on local disk is uploaded as before: one being sent
//! while written (its stream may free what it sent), or one whose first bytes were
//! freed already. A journaled file is not streamed (the record names the staged file
//! whole). A rename while open rewrites the record; an unlink, a release and a
//! completed upload of everything written remove it (durably: below).
//!
//! The record names the store and prefix it was written for: a mount of another
//! source at the same mountpoint (and cache dir) keeps it, uploading nothing into its
//! own store (crash finding: an fsync'd checkpoint of one bucket was uploaded into
//! the bucket mounted there next, and never into its own). A start killed after a
//! recovery upload landed and before its record went finds the name taken: an object
//! holding exactly the staged bytes completes the record (crash finding: such records
//! were kept, and reported as failed, at every later start, and uploaded again once
//! the names were deleted through the mount). A name the mount changes before the
//! record's upload (a delete, a new file there) supersedes it.
//!
//! After a power cut (black-box findings):
//! - A record's removal (the upload done, the file released or unlinked, a recovery
//!   done) syncs its folder before it counts: the record was durable, its removal
//!   was not, and it came back to put old bytes over a name changed since.
//! - The record names the fsync'd length and its crc32c (read back before the sync, so
//!   every byte checksummed is one the sync made durable): the replay uploads that
//!   prefix after a power cut (one that may have lost the page cache: another boot,
//!   or the file system mounted again since), as no file system promises more past
//!   the last fsync (ext4
//!   `data=writeback,nodelalloc` commits a longer size before the data: the tail held
//!   a deleted file's bytes), and uploads nothing, keeping the files, when the prefix
//!   does not check. The cost: each fsync that changed the file reads back what changed
//!   (page cache) and rewrites the record (see "The record file" below); and a power cut between an fsync and the next of a file rewritten in place (not
//!   appended) leaves it unuploaded, kept and reported, since the replay cannot tell
//!   the bytes written since from stale ones. A crash of the daemon alone (the same
//!   boot and mount of the cache file system: `page_cache_epoch`) uploads the file
//!   as written, as before. An older release's record, naming neither, uploads the
//!   file whole.
//! - A record that cannot be read now (EIO, EMFILE, ENOMEM), or is not valid, is kept
//!   with its staged file and reported; only a record whose file is gone is removed.
//! - The record names the canonical mountpoint (symlinks resolved): the staging
//!   folder is named after the mountpoint as given, and a start takes its records
//!   from the folders of other spellings too.
//!
//! The record file: two slots of a fixed size (a multiple of 4 KiB), each a header
//! (magic, sequence number, length, crc32c) and the record's JSON; the valid slot with
//! the higher sequence number is the record. The first fsync creates it atomically
//! (temp file, sync, rename, folder sync); each later one rewrites the older slot in
//! place and syncs its data (one `pwrite` + `fdatasync`): a power cut inside that write
//! tears one slot, whose crc32c then fails, and the other still names bytes an earlier
//! fsync made durable. Rewritten through a temp file each time, the record cost sqlite
//! in WAL mode 71% of its commit rate (1,010 commits/s against 3,517; a temp-file
//! record costs 0.46 ms here, an in-place one 0.04 ms). One file's fsyncs take turns
//! (`Staged::record_file`), so the newest slot always names the newest synced bytes.
//! A record of the older format (the JSON alone, up to release f01573b) is still read.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use strata_cache_core::CacheError;

use super::{Staged, Writes};
use crate::error::{Error, Result};

/// A recovery upload the store did not answer is tried again after 5 s, then at
/// doubling pauses up to a minute, for as long as the daemon runs (crash finding: a
/// start into a store outage left the fsync'd file out of the store until the next
/// restart, however soon the store came back).
const RECOVERY_RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(5);
const RECOVERY_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Bytes read at a time to checksum a staged file.
const CRC_CHUNK: usize = 1 << 20;

/// A record slot's first bytes: "SJR2", then its sequence number (u64), its JSON's
/// length (u32) and the crc32c (u32) of the sequence number, length and JSON, all
/// little-endian.
const SLOT_MAGIC: [u8; 4] = *b"SJR2";
const SLOT_HEADER: usize = 20;
/// Slots are whole 4 KiB pages: a rewrite never shares a page with the other slot.
const SLOT_ALIGN: usize = 4096;

/// The record file of a journaled staged file, open to rewrite its older slot in
/// place (see the module doc).
#[derive(Debug)]
pub(super) struct RecordFile {
    file: std::fs::File,
    /// Bytes per slot.
    slot: usize,
    /// The sequence number of the newest slot; slot `seq % 2` holds it.
    seq: u64,
    /// The staged file's [`page_cache_epoch`] (fixed while it is open).
    epoch: Option<String>,
}

/// The record beside a journaled staging file (JSON: `{"path", "only_if_absent",
/// "source", "mountpoint", "size", "crc32c"}`; the last three since 2026-12-06).
#[derive(Debug)]
pub(crate) struct JournalRecord {
    /// The object it is uploaded to.
    pub path: String,
    /// Uploaded only if no object has the name (a create on a mount without
    /// `allow_overwrite`).
    pub only_if_absent: bool,
    /// The mount's store and prefix (`<store label>|<prefix>`) it was written for; None
    /// in a record that names none (kept, never uploaded: its store is unknown).
    pub source: Option<String>,
    /// The canonical mountpoint of the mount that wrote it (None: an older release's,
    /// taken by the mount of the staging folder it is in).
    pub mountpoint: Option<String>,
    /// What the fsync made durable: its length and the crc32c of those bytes (None:
    /// an older release's record; the file is uploaded whole).
    pub synced: Option<Synced>,
    /// The page cache the staged file's writes were in (see [`page_cache_epoch`]).
    pub epoch: Option<String>,
    /// The store version the file changes in place (opened without `O_TRUNC`): the
    /// replay uploads it only over that version (black-box finding: an fsync'd append
    /// to a file another writer replaced while the daemon was down put the old
    /// version, plus the append, over the newer object). None: a new file, or one
    /// replaced whole.
    pub base: Option<String>,
    /// For a new file or one replaced whole, not uploaded since (then `base` names its
    /// upload): what the store held under the name when it was made; the replay
    /// uploads it only over that (black-box
    /// finding: with `--allow-overwrite`, a checkpoint fsync'd before a crash was put
    /// back over the newer one a job wrote through another mount, or through a release
    /// rolled back to, while this one was down). None: an older release's record, or a
    /// file renamed into its name (unknown).
    pub replaces: Option<Replaces>,
}

/// Where a staged file made new or replaced whole stands on [`JournalRecord::replaces`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Precondition {
    /// Not known: a file renamed into its name, uploaded since (its `base` decides
    /// then), or changed in place.
    Unknown,
    /// Made by a create or an O_TRUNC open: asked of the store at the next fsync (what
    /// the mount's cache said then may be stale, and the store's clock is no guide).
    Ask,
    /// What the store held under the name when asked.
    Is(Replaces),
}

/// What a file replaced whole replaces ([`JournalRecord::replaces`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Replaces {
    /// No object had the name.
    Nothing,
    /// The object of this version.
    Version(String),
}

/// The bytes an fsync made durable (see [`JournalRecord::synced`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Synced {
    pub size: u64,
    pub crc: u32,
}

/// A staged file an earlier run journaled and did not upload.
#[derive(Debug)]
pub(crate) struct Journaled {
    pub file: PathBuf,
    pub record_file: PathBuf,
    pub record: JournalRecord,
}

/// What a start found in one staging folder (see [`Writes::journaled_left`]).
#[derive(Debug, Default)]
pub(crate) struct Left {
    /// Records to upload.
    pub records: Vec<Journaled>,
    /// Files left where they are and not uploaded by this start (a record it could not
    /// read now, one that is not valid, or one of another mountpoint), with their
    /// staged files.
    pub kept: Vec<PathBuf>,
}

/// The record file of staging file `file`.
pub(super) fn record_path(file: &Path) -> PathBuf {
    let mut p = file.as_os_str().to_owned();
    p.push(".json");
    PathBuf::from(p)
}

/// The JSON of `record` (a slot's payload).
fn record_json(record: &JournalRecord) -> io::Result<Vec<u8>> {
    serde_json::to_vec(&serde_json::json!({
        "path": record.path,
        "only_if_absent": record.only_if_absent,
        "source": record.source,
        "mountpoint": record.mountpoint,
        "size": record.synced.map(|s| s.size),
        "crc32c": record.synced.map(|s| s.crc),
        "epoch": record.epoch,
        "base": record.base,
        "replaces": match &record.replaces {
            None => serde_json::Value::Null,
            Some(Replaces::Nothing) => serde_json::json!({ "nothing": true }),
            Some(Replaces::Version(v)) => serde_json::json!({ "version": v }),
        },
    }))
    .map_err(io::Error::other)
}

/// Slot `seq` holding `json`, `slot` bytes long (zero padded).
fn encode_slot(seq: u64, json: &[u8], slot: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(slot);
    out.extend_from_slice(&SLOT_MAGIC);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[4..16]), json);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(json);
    out.resize(slot.max(out.len()), 0);
    out
}

/// A slot's sequence number and JSON; None if it is torn, blank or not a slot.
fn decode_slot(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let header = bytes.get(..SLOT_HEADER)?;
    if header[..4] != SLOT_MAGIC {
        return None;
    }
    let seq = u64::from_le_bytes(header[4..12].try_into().ok()?);
    let len = u32::from_le_bytes(header[12..16].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[16..20].try_into().ok()?);
    let json = bytes.get(SLOT_HEADER..SLOT_HEADER.checked_add(len)?)?;
    (crc32c::crc32c_append(crc32c::crc32c(&header[4..16]), json) == crc).then_some((seq, json))
}

/// The slot size that holds `json_len` bytes of JSON.
fn slot_size(json_len: usize) -> usize {
    (SLOT_HEADER + json_len).div_ceil(SLOT_ALIGN) * SLOT_ALIGN
}

/// Writes record `json` beside `file`: in place in the older slot of the record file
/// `open` holds, or into a new record file made atomically (none open yet, the last
/// rewrite failed, or the JSON outgrew the slots). Durable when it returns. On an
/// error the file is dropped: the next record is made anew. Blocking.
fn write_record(
    file: &Path,
    open: &mut Option<RecordFile>,
    json: &[u8],
    epoch: Option<String>,
) -> io::Result<()> {
    let written = match open.as_mut() {
        Some(r) if SLOT_HEADER + json.len() <= r.slot => {
            let seq = r.seq + 1;
            let at = (seq % 2) * r.slot as u64;
            r.file
                .write_all_at(&encode_slot(seq, json, r.slot), at)
                .and_then(|()| r.file.sync_data())
                .map(|()| r.seq = seq)
        }
        _ => {
            let seq = open.as_ref().map_or(1, |r| r.seq + 1);
            let slot = slot_size(json.len());
            let mut bytes = vec![0u8; 2 * slot];
            let at = (seq % 2) as usize * slot;
            bytes[at..at + slot].copy_from_slice(&encode_slot(seq, json, slot));
            strata_cache_core::state_file::write_atomically_keep(&record_path(file), &bytes).map(
                |f| {
                    *open = Some(RecordFile {
                        file: f,
                        slot,
                        seq,
                        epoch,
                    })
                },
            )
        }
    };
    if written.is_err() {
        *open = None;
    }
    written
}

/// Parses a record file's bytes; None if they are not a record.
fn parse_record(bytes: &[u8]) -> Option<JournalRecord> {
    if bytes.first() == Some(&b'{') {
        // The older format: the JSON alone.
        return parse_record_json(bytes);
    }
    if bytes.len() < 2 * SLOT_HEADER || !bytes.len().is_multiple_of(2) {
        return None;
    }
    let (a, b) = bytes.split_at(bytes.len() / 2);
    let (_, json) = [decode_slot(a), decode_slot(b)]
        .into_iter()
        .flatten()
        .max_by_key(|(seq, _)| *seq)?;
    parse_record_json(json)
}

/// Parses a record's JSON; None if it is not one.
fn parse_record_json(bytes: &[u8]) -> Option<JournalRecord> {
    let v = serde_json::from_slice::<serde_json::Value>(bytes).ok()?;
    let size = v.get("size").and_then(|s| s.as_u64());
    let crc = v
        .get("crc32c")
        .and_then(|c| c.as_u64())
        .and_then(|c| u32::try_from(c).ok());
    Some(JournalRecord {
        path: v.get("path")?.as_str()?.to_string(),
        only_if_absent: v.get("only_if_absent")?.as_bool()?,
        source: v.get("source").and_then(|s| s.as_str()).map(String::from),
        mountpoint: v
            .get("mountpoint")
            .and_then(|s| s.as_str())
            .map(String::from),
        synced: match (size, crc) {
            (Some(size), Some(crc)) => Some(Synced { size, crc }),
            _ => None,
        },
        epoch: v.get("epoch").and_then(|s| s.as_str()).map(String::from),
        base: v.get("base").and_then(|s| s.as_str()).map(String::from),
        replaces: v
            .get("replaces")
            .and_then(|r| match r.get("version").and_then(|v| v.as_str()) {
                Some(version) => Some(Replaces::Version(version.to_string())),
                None => (r.get("nothing")?.as_bool()?).then_some(Replaces::Nothing),
            }),
    })
}

/// The page cache that holds the latest writes of staged file `file`: this boot and
/// this mount of its file system (`<boot id>/<unique mount id>`). While both are the
/// same, a crash of the daemon alone lost nothing it wrote, fsync'd or not; a power
/// cut, an OS crash or a file system shut down and mounted again may have. None where
/// the kernel cannot tell (no unique mount ids before Linux 6.8).
fn page_cache_epoch(file: &std::fs::File) -> Option<String> {
    use std::os::fd::AsRawFd;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    // SAFETY: statx fills the zeroed struct it is given; the path is empty and
    // AT_EMPTY_PATH names the descriptor `file` owns for the call's duration.
    let (rc, stx) = unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let rc = libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_MNT_ID_UNIQUE,
            &mut stx,
        );
        (rc, stx)
    };
    (rc == 0 && stx.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0)
        .then(|| format!("{}/{}", boot.trim(), stx.stx_mnt_id))
}

/// Length and crc32c of the first `upto` bytes of `file` (all of it: None), read to
/// its end or `upto`. Blocking.
fn checksum(file: &std::fs::File, upto: Option<u64>) -> io::Result<Synced> {
    checksum_from(file, Synced { size: 0, crc: 0 }, upto)
}

/// [`checksum`] extending `from` (the length and crc32c of the file's first bytes,
/// unchanged since) over the bytes after it. Blocking.
fn checksum_from(file: &std::fs::File, from: Synced, upto: Option<u64>) -> io::Result<Synced> {
    let mut buf = vec![0u8; CRC_CHUNK];
    let (mut at, mut crc) = (from.size, from.crc);
    loop {
        let want = match upto {
            Some(end) => (end - at).min(CRC_CHUNK as u64) as usize,
            None => CRC_CHUNK,
        };
        if want == 0 {
            break;
        }
        let n = match file.read_at(&mut buf[..want], at) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        at += n as u64;
    }
    Ok(Synced { size: at, crc })
}

/// Syncs folder `dir`, so the names removed from it stay removed after a power cut.
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(test)]
    tests::DIR_SYNCS.with(|d| d.borrow_mut().push(dir.to_path_buf()));
    std::fs::File::open(dir)?.sync_all()
}

/// Removes `files` (a record first, then its staged file) and syncs their folder: a
/// removal left in the file system's running transaction comes undone at a power cut,
/// and the record, made durable by its fsync, would come back and upload bytes the
/// mount replaced or deleted since (black-box finding: after a power cut, a file
/// uploaded, closed and then removed, renamed or rewritten through the mount was put
/// back at its fsync'd bytes). Blocking.
pub(super) fn remove_durably(files: &[&Path]) -> io::Result<()> {
    for f in files {
        match std::fs::remove_file(f) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    match files.first().and_then(|f| f.parent()) {
        Some(dir) => sync_dir(dir),
        None => Ok(()),
    }
}

impl Staged {
    /// Makes what was written durable here and records where it goes, and its length
    /// and crc32c (see the module doc). Blocking.
    pub(super) fn journal(&self, only_if_absent: bool) -> io::Result<()> {
        // Held across this fsync's checksum, sync and record write (on a blocking
        // thread): the record written last names the bytes synced last.
        let mut open = self.record_file.lock();
        // Checksummed before the sync: every byte read is then made durable by it. Only
        // what was appended since the last record is read when nothing below its length
        // changed: read whole, each fsync of a log appended line by line cost the file's
        // size (black-box finding: 33 ms per fsync of a 200 MiB file, 470x before).
        let low = self.low_write.swap(u64::MAX, Ordering::AcqRel);
        let last = self.journaled.lock().as_ref().map(|(_, s)| *s);
        let synced = match last {
            Some(last) if low >= last.size => checksum_from(&self.file, last, None),
            _ => checksum(&self.file, None),
        };
        let synced = synced.inspect_err(|_| {
            self.low_write.fetch_min(low, Ordering::AcqRel);
        })?;
        if let Err(e) = self.file.sync_data() {
            self.low_write.fetch_min(low, Ordering::AcqRel);
            return Err(e);
        }
        let path = self.path();
        let now = Some((path.clone(), synced));
        if *self.journaled.lock() == now {
            return Ok(());
        }
        let epoch = match open.as_ref() {
            Some(r) => r.epoch.clone(),
            None => page_cache_epoch(&self.file),
        };
        // (Each lock taken and let go on its own: `replaces_now` takes `base` too.)
        let base = self.base.lock().as_ref().map(|b| b.version.to_string());
        let replaces = self.replaces_now();
        let json = record_json(&JournalRecord {
            path: path.to_string(),
            only_if_absent,
            source: Some(self.source.to_string()),
            mountpoint: self.mountpoint.as_deref().map(String::from),
            synced: Some(synced),
            epoch: epoch.clone(),
            base,
            replaces,
        })?;
        write_record(&self.file_path, &mut open, &json, epoch)?;
        *self.journaled.lock() = now;
        Ok(())
    }

    /// The record goes (uploaded, released or unlinked), durably. Blocking.
    pub(super) fn unjournal(&self) {
        // After an fsync in progress: its record must not land after the removal.
        let mut open = self.record_file.lock();
        *open = None;
        if self.journaled.lock().take().is_some() {
            if let Err(e) = remove_durably(&[&record_path(&self.file_path)]) {
                tracing::error!(path = %self.path(), error = %e, "the fsync record of an uploaded or removed file could not be removed durably: a power cut may upload its fsync'd bytes again");
            }
        }
    }

    /// The file moved to another name while journaled: its record follows. Blocking.
    pub(super) fn rejournal(&self, only_if_absent: bool) {
        if self.journaled.lock().is_none() {
            return;
        }
        if let Err(e) = self.journal(only_if_absent) {
            tracing::error!(path = %self.path(), error = %e, "cannot move the fsync record of a renamed file; a crash before its close loses what was fsync'd");
        }
    }

    pub(super) fn is_journaled(&self) -> bool {
        self.journaled.lock().is_some()
    }
}

/// What reading one record at start found.
enum Found {
    Record(JournalRecord),
    /// The record is gone (removed since the folder was listed).
    Gone,
    /// Not a record (not JSON of one, or not a regular file).
    Invalid,
    /// It could not be read now (EIO, EMFILE, ENOMEM...): not a damaged record.
    Unreadable(io::Error),
}

fn read_record(path: &Path) -> Found {
    match strata_cache_core::state_file::read_regular(path) {
        Ok(bytes) => parse_record(&bytes).map_or(Found::Invalid, Found::Record),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Found::Gone,
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Found::Invalid,
        Err(e) => Found::Unreadable(e),
    }
}

/// Of several records for one name (saves kept while the store did not answer, each
/// newer than the last), the newest, by its record's time: the older are superseded and
/// dropped (black-box finding: a start uploaded the oldest of three saves, then dropped
/// the newer two as changed since, publishing stale bytes).
fn newest_per_name(pending: Vec<(Journaled, Option<u64>)>) -> Vec<(Journaled, Option<u64>)> {
    let written = |j: &Journaled| {
        std::fs::metadata(&j.record_file)
            .and_then(|m| m.modified())
            .unwrap_or(std::time::SystemTime::UNIX_EPOCH)
    };
    let mut newest: std::collections::HashMap<String, (Journaled, Option<u64>)> =
        std::collections::HashMap::new();
    for (j, since) in pending {
        match newest.remove(&j.record.path) {
            Some((other, s)) if written(&other) > written(&j) => {
                tracing::warn!(path = %j.record.path, file = %j.file.display(), "an fsync'd copy superseded by a newer one of the same name: dropped");
                j.done();
                newest.insert(other.record.path.clone(), (other, s));
            }
            Some((other, _)) => {
                tracing::warn!(path = %other.record.path, file = %other.file.display(), "an fsync'd copy superseded by a newer one of the same name: dropped");
                other.done();
                newest.insert(j.record.path.clone(), (j, since));
            }
            None => {
                newest.insert(j.record.path.clone(), (j, since));
            }
        }
    }
    newest.into_values().collect()
}

/// The local files' budget charges of files kept for a later upload, released as each
/// leaves the uploader (uploaded, dropped, or left for the next start) or with it.
struct KeptCharges {
    budget: Option<Arc<crate::passthrough::PassthroughStore>>,
    bytes: std::collections::HashMap<PathBuf, u64>,
}

impl KeptCharges {
    /// Charges each of `files` by its size (blocking work on a blocking thread: a charge
    /// may evict passthrough copies).
    async fn charge(
        budget: Option<Arc<crate::passthrough::PassthroughStore>>,
        files: Vec<PathBuf>,
    ) -> KeptCharges {
        let Some(b) = budget.clone() else {
            return KeptCharges {
                budget,
                bytes: Default::default(),
            };
        };
        let bytes = tokio::task::spawn_blocking(move || {
            files
                .into_iter()
                .filter_map(|f| {
                    let len = std::fs::metadata(&f).ok()?.len();
                    b.charge_staged(len);
                    Some((f, len))
                })
                .collect()
        })
        .await
        .unwrap_or_default();
        KeptCharges { budget, bytes }
    }

    /// Releases the charges of every file but `still` (those kept for another try).
    fn keep_only<'a>(&mut self, still: impl Iterator<Item = &'a PathBuf>) {
        let still: std::collections::HashSet<&PathBuf> = still.collect();
        let budget = &self.budget;
        self.bytes.retain(|f, len| {
            let keep = still.contains(f);
            if let (false, Some(b)) = (keep, budget) {
                b.release_staged(*len);
            }
            keep
        });
    }
}

impl Drop for KeptCharges {
    fn drop(&mut self) {
        self.keep_only(std::iter::empty());
    }
}

impl Journaled {
    /// Uploaded or superseded: the record and its file go, durably (a record back
    /// after a power cut would upload its bytes again).
    fn done(&self) {
        if let Err(e) = remove_durably(&[&self.record_file, &self.file]) {
            tracing::error!(path = %self.record.path, record = %self.record_file.display(), error = %e,
                "the fsync record of a recovered file could not be removed durably: a power cut may upload it again");
        }
    }
}

impl Writes {
    /// At start: the staged files an earlier run journaled in `dir` (kept for
    /// [`FsCore::recover_journaled`]).
    ///
    /// `own`: `dir` is this mount's staging folder: a record whose file is gone is
    /// removed, and a record of another canonical mountpoint is kept for that one.
    /// Otherwise (another mountpoint spelling's folder) only records naming
    /// `mountpoint` are taken, and nothing is removed.
    ///
    /// A record that cannot be read now, or is not valid, is kept with its staged file
    /// and reported, never removed: one EIO must not delete what an fsync acknowledged
    /// (black-box finding: it deleted the record and the fsync'd file with it).
    pub(super) fn journaled_left(
        dir: &Path,
        mountpoint: Option<&str>,
        own: bool,
    ) -> io::Result<Left> {
        let mut out = Left::default();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".part.json")) else {
                continue;
            };
            let file = dir.join(format!("{stem}.part"));
            let record_file = entry.path();
            let keep = |out: &mut Left| out.kept.extend([file.clone(), record_file.clone()]);
            let record = match read_record(&record_file) {
                Found::Record(r) => r,
                Found::Gone => continue,
                Found::Invalid if own => {
                    tracing::error!(record = %record_file.display(), file = %file.display(),
                        "an fsync record that is not valid: kept with its staged file, not uploaded; remove both by hand once inspected");
                    keep(&mut out);
                    continue;
                }
                Found::Unreadable(e) if own => {
                    tracing::error!(record = %record_file.display(), file = %file.display(), error = %e,
                        "an fsync record could not be read: kept with its staged file, not uploaded at this start (the next start tries again)");
                    keep(&mut out);
                    continue;
                }
                Found::Invalid | Found::Unreadable(_) => continue,
            };
            let mine = match (&record.mountpoint, mountpoint) {
                (Some(theirs), Some(ours)) => theirs == ours,
                (None, _) | (_, None) => own,
            };
            if !mine {
                if own {
                    tracing::warn!(record = %record_file.display(), path = %record.path,
                        written_at = ?record.mountpoint, mounted_at = ?mountpoint,
                        "a file fsync'd before a crash by a mount at another directory: kept for a mount there");
                    keep(&mut out);
                }
                continue;
            }
            match std::fs::symlink_metadata(&file) {
                Ok(m) if m.is_file() => out.records.push(Journaled {
                    file,
                    record_file,
                    record,
                }),
                Err(e) if own && e.kind() != io::ErrorKind::NotFound => {
                    tracing::error!(record = %record_file.display(), file = %file.display(), error = %e,
                        "the file of an fsync record could not be read: both kept, not uploaded at this start");
                    keep(&mut out);
                }
                _ if own => {
                    tracing::warn!(record = %record_file.display(), "an fsync record without its file: removed");
                    remove_durably(&[&record_file])?;
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

impl super::FsCore {
    /// FSYNC of write handle `fh`: durable on the cache disk, uploaded at the close
    /// (see the module doc); a file that cannot wait there is uploaded now.
    pub async fn fsync(self: &Arc<Self>, fh: u64) -> Result<()> {
        let Some(staged) = self.writes.as_ref().and_then(|w| w.handle(fh)) else {
            return Ok(());
        };
        let waits_here = !staged.unlinked.load(Ordering::Acquire)
            && staged.lost.lock().is_none()
            && staged.stream.lock().is_none()
            && staged.freed() == 0
            && staged.uploaded.load(Ordering::Acquire) < staged.written.load(Ordering::Acquire);
        if !waits_here {
            return self.upload(&staged).await;
        }
        let only_if_absent = super::creates_only(&self.writes()?.opts, &staged);
        self.ask_what_it_replaces(&staged).await;
        let s = staged.clone();
        tokio::task::spawn_blocking(move || s.journal(only_if_absent))
            .await
            .map_err(|e| Error::Local {
                what: format!("fsync of {}", staged.path()),
                source: std::io::Error::other(e),
            })?
            .map_err(|source| Error::Local {
                what: format!("fsync of {}", staged.path()),
                source,
            })
    }

    /// At the first fsync of a file made new or replaced whole: what the store holds
    /// under its name now, the precondition of its replay after a crash (one HEAD per
    /// file; none if the store does not answer, and the replay then checks nothing).
    async fn ask_what_it_replaces(&self, staged: &Arc<Staged>) {
        if *staged.replaces.lock() != Precondition::Ask {
            return;
        }
        let now = match self.reader.store().head(&staged.path()).await {
            Ok(obj) => Replaces::Version(obj.version.to_string()),
            Err(CacheError::NotFound(_)) => Replaces::Nothing,
            // Asked again at the next fsync.
            Err(_) => return,
        };
        let mut state = staged.replaces.lock();
        // Not if a rename or an upload settled it meanwhile.
        if *state == Precondition::Ask {
            *state = Precondition::Is(now);
        }
    }

    /// Uploads the staged files an earlier run fsync'd and did not upload (a crash
    /// before their close), each to its recorded name, in the background; each is
    /// removed once uploaded, kept (for the next start) if the upload fails. The
    /// receiver hears once every file was tried once (uploaded, dropped, or waiting for
    /// a store that does not answer): a mount waits for that before it appears
    /// ([`crate::mount::spawn`]), so a job restarted with the daemon finds the files
    /// it fsync'd (black-box finding, round 21: 362-397 of 400 were ENOENT for the
    /// replay's ~2 s after `ready`). None: nothing to upload.
    pub fn recover_journaled(
        self: &Arc<Self>,
        rt: &tokio::runtime::Handle,
    ) -> Option<std::sync::mpsc::Receiver<()>> {
        let writes = self.writes.as_ref()?;
        let left = std::mem::take(&mut *writes.journaled_left.lock());
        if left.is_empty() {
            return None;
        }
        let source = writes.source.clone();
        let legacy = writes.legacy_source.clone();
        let pending = left
            .into_iter()
            .filter(|j| {
                let written_for = j.record.source.as_deref();
                let ours = written_for == Some(&*source)
                    || (legacy.is_some() && written_for == legacy.as_deref());
                if !ours {
                    tracing::warn!(path = %j.record.path, file = %j.file.display(),
                        written_for = ?j.record.source, mounted = %source,
                        "a file fsync'd before a crash belongs to another store or prefix: kept for a mount of that one, not uploaded here");
                }
                ours
            })
            .map(|j| (j, None))
            .collect();
        let pending = newest_per_name(pending);
        writes.replaying.lock().extend(
            pending
                .iter()
                .map(|(j, _)| Arc::<str>::from(j.record.path.as_str())),
        );
        let (tried, tried_all) = std::sync::mpsc::channel();
        self.upload_kept_then(rt, pending, "before a crash", Some(tried));
        Some(tried_all)
    }

    /// Uploads journaled files in the background, retrying while the store does not
    /// answer; each is removed once uploaded, kept (for the next start) if the upload
    /// fails otherwise. With each file the change number after which a change of its
    /// name through this mount supersedes it: None for one found at start (any change
    /// since the start), Some for one kept while this mount runs (its folder is also
    /// checked). `when` says which files in the logs
    /// ("before a crash", "at a close the store did not answer").
    pub(super) fn upload_kept(
        self: &Arc<Self>,
        rt: &tokio::runtime::Handle,
        pending: Vec<(Journaled, Option<u64>)>,
        when: &'static str,
    ) {
        self.upload_kept_then(rt, pending, when, None);
    }

    /// [`Self::upload_kept`], telling `tried` once every file was tried once; each name
    /// leaves the replaying set ([`super::Writes::is_replaying`]) once it is done with.
    fn upload_kept_then(
        self: &Arc<Self>,
        rt: &tokio::runtime::Handle,
        mut pending: Vec<(Journaled, Option<u64>)>,
        when: &'static str,
        mut tried: Option<std::sync::mpsc::Sender<()>>,
    ) {
        let core = self.clone();
        let done_with = move |core: &Arc<Self>, path: &str| {
            if let Some(w) = core.writes.as_ref() {
                w.replaying.lock().remove(path);
            }
        };
        // A file kept while the mount runs has just failed its upload: it waits one pause
        // first, so a change of its name or folder right after the failed close (the job
        // moving on: `mv`, `rm -rf`) is seen before it is sent, not during the upload's
        // own retries (black-box finding: `rm -rf ckB` right after the close, and
        // `ckB/b.pt` landed all the same).
        let first_wait = pending.iter().any(|(_, since)| since.is_some());
        let budget = self
            .writes
            .as_ref()
            .and_then(|w| w.opts.local_files.clone());
        rt.spawn(async move {
            // Kept files take local disk as staged writes do: charged to the local files'
            // budget (and shown as staged writes) until each is done with (black-box
            // finding: 27 MiB kept against a 16 MiB budget showed "staged writes 0.0 MiB").
            let files: Vec<PathBuf> = pending.iter().map(|(j, _)| j.file.clone()).collect();
            let mut charged = KeptCharges::charge(budget, files).await;
            let mut pause = RECOVERY_RETRY_FIRST;
            if first_wait {
                tokio::time::sleep(pause).await;
            }
            loop {
                let mut again = Vec::new();
                let round: Vec<String> = pending.iter().map(|(j, _)| j.record.path.clone()).collect();
                for (j, since) in pending {
                    // Changed through this mount since (deleted, written anew): what
                    // the fsync kept is superseded.
                    if core.changed_since(&j.record.path, since.unwrap_or(0)) {
                        tracing::warn!(path = %j.record.path, "a file fsync'd {when} was changed through the mount since; its fsync'd copy dropped");
                        j.done();
                        continue;
                    }
                    // Kept while this mount runs, and its folder since renamed or
                    // removed through it: not put back under the old name (black-box
                    // finding: `mv ckA ckA2` and `rm -rf ckB` during the outage, then
                    // both files landed under their old folders).
                    if since.is_some() && core.folder_gone(&j.record.path).await {
                        tracing::warn!(path = %j.record.path, "a file fsync'd {when}: its folder was renamed or removed through the mount since; its fsync'd copy dropped");
                        j.done();
                        continue;
                    }
                    match core.upload_journaled(&j).await {
                        Ok(()) => {
                            tracing::info!(path = %j.record.path, "a file fsync'd {when} uploaded");
                            j.done();
                        }
                        Err(Error::Cache(e)) if super::super::store_unreachable(&e) => {
                            tracing::warn!(path = %j.record.path, error = %e, retry_in = ?pause,
                                "a file fsync'd {when} could not be uploaded yet: the store does not answer");
                            again.push((j, since));
                        }
                        // Another object took the name since (a create-only upload):
                        // newer than what the fsync kept, which is dropped rather than
                        // kept to land once that object is deleted (black-box finding:
                        // replaced, then `rm`, and the next start brought the old bytes
                        // back under the name).
                        Err(Error::Cache(CacheError::Exists(_))) => {
                            tracing::warn!(path = %j.record.path, "a file fsync'd {when}: another object took its name, or it was removed, since; its fsync'd copy dropped");
                            j.done();
                        }
                        // A change in place of a version the store no longer holds
                        // (another writer replaced or removed it): the same rule, not
                        // kept to fail again at every start (black-box finding, round
                        // 21: an ERROR at each start, 42 MB kept in staging for good,
                        // counted nowhere).
                        Err(Error::Cache(CacheError::Changed(_))) => {
                            tracing::warn!(path = %j.record.path, "a file fsync'd {when} changed a version another writer has replaced or removed since; its fsync'd copy dropped");
                            j.done();
                        }
                        Err(e) => tracing::error!(path = %j.record.path, file = %j.file.display(), error = %e,
                            "a file fsync'd {when} could not be uploaded; kept for the next start"),
                    }
                }
                for path in &round {
                    if !again.iter().any(|(j, _)| j.record.path == *path) {
                        done_with(&core, path);
                    }
                }
                charged.keep_only(again.iter().map(|(j, _)| &j.file));
                if let Some(tried) = tried.take() {
                    let _ = tried.send(());
                }
                if again.is_empty() {
                    break;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RECOVERY_RETRY_MAX);
                pending = again;
            }
        });
    }

    /// `staged`, fsync'd, failed its close's upload because the store did not answer:
    /// what the close had is made durable and recorded, and uploaded in the background
    /// once the store answers, as after a crash (black-box finding: a few seconds of
    /// 503 SlowDown at the close of an fsync'd checkpoint deleted it, while a crash at
    /// the same moment would have kept and uploaded it). Returns whether it was kept
    /// (the caller leaves its staging file); blocking work on a blocking thread.
    pub(super) async fn keep_unanswered(self: &Arc<Self>, staged: &Arc<Staged>) -> bool {
        let Ok(writes) = self.writes() else {
            return false;
        };
        let only_if_absent = super::creates_only(&writes.opts, staged);
        let s = staged.clone();
        let found = tokio::task::spawn_blocking(move || {
            s.journal(only_if_absent)?;
            Ok::<_, io::Error>(read_record(&record_path(&s.file_path)))
        })
        .await;
        let record = match found {
            Ok(Ok(Found::Record(r))) => r,
            Ok(Err(e)) => {
                tracing::error!(path = %staged.path(), error = %e, "a file fsync'd and not uploaded at its close could not be kept; dropped");
                return false;
            }
            _ => return false,
        };
        let since = self.change_seq.load(Ordering::Acquire);
        let kept = Journaled {
            file: staged.file_path.clone(),
            record_file: record_path(&staged.file_path),
            record,
        };
        tracing::warn!(path = %staged.path(), file = %staged.file_path.display(),
            "the store did not answer the close's upload of an fsync'd file: kept, and uploaded once it answers (or by the next start)");
        self.upload_kept(
            &tokio::runtime::Handle::current(),
            vec![(kept, Some(since))],
            "at a close the store did not answer",
        );
        true
    }

    async fn upload_journaled(&self, j: &Journaled) -> Result<()> {
        let opts = self.writes()?.opts.clone();
        let file = Arc::new(std::fs::File::open(&j.file).map_err(|source| Error::Local {
            what: format!("opening {}", j.file.display()),
            source,
        })?);
        let size = self.synced_size(j, &file).await?;
        if let Some(base) = &j.record.base {
            // Changed in place: only over the version it changes, as its close would
            // have checked (`FsCore::upload`).
            let store = self.reader.store();
            match store.head(&j.record.path).await {
                Ok(now) if *now.version == **base => {}
                Ok(_) | Err(CacheError::NotFound(_)) => {
                    return Err(Error::Cache(CacheError::Changed(format!(
                        "{}: replaced or removed in the store since it was changed here; \
                         the fsync'd copy is not uploaded over it",
                        j.record.path
                    ))))
                }
                Err(e) => return Err(e.into()),
            }
        }
        // Replaced whole: only over what it replaced. Anything else there now was put
        // by a later writer (its own earlier upload of these bytes aside), and what the
        // fsync kept is older than that: dropped, as a create-only upload's is. (What
        // it replaced is what the store held at its first fsync, asked then: neither
        // the mount's cached metadata nor the store's clock decides; round 20b: a
        // store clock 2 s behind made a later writer's object look older.)
        let mut landed = false;
        if let Some(replaces) = &j.record.replaces {
            let now = match self.reader.store().head(&j.record.path).await {
                Ok(now) => Some(now),
                Err(CacheError::NotFound(_)) => None,
                Err(e) => return Err(e.into()),
            };
            let same = match (replaces, &now) {
                (Replaces::Nothing, None) => true,
                (Replaces::Version(v), Some(now)) => *now.version == **v,
                _ => false,
            };
            if !same {
                if now.is_none() || !self.store_holds(&j.record.path, &file, size).await? {
                    return Err(Error::Cache(CacheError::Exists(format!(
                        "{}: written or removed in the store since this file was made",
                        j.record.path
                    ))));
                }
                landed = true;
            }
        }
        if !landed {
            let shape = strata_cache_core::store::UploadShape {
                part_size: opts.part_size,
                in_flight: opts.parts_in_flight,
                slots: Some(self.writes()?.upload_slots.clone()),
                only_if_absent: j.record.only_if_absent,
            };
            let uploaded = self
                .reader
                .store()
                .upload(&j.record.path, size, &shape, |offset, len| {
                    let file = file.clone();
                    async move { super::stream::read_part(file, offset, len).await }
                })
                .await;
            match uploaded {
                // Counted as the mount's, as a close's upload is (black-box finding: the
                // replay's uploads were missing from `strata stats` and /metrics).
                Ok(_) => self.counters.uploaded(size),
                // An earlier start's upload of it landed (killed before the record went).
                Err(CacheError::Exists(_))
                    if self.store_holds(&j.record.path, &file, size).await? => {}
                Err(e) => return Err(e.into()),
            }
        }
        let path: Arc<str> = Arc::from(j.record.path.as_str());
        if let Some(dir) = self.parent_of(&path).map(Arc::<str>::from) {
            self.refresh(&dir, &path).await;
        }
        self.show_folders_of(&path).await;
        Ok(())
    }

    /// How many bytes of `j`'s staged file to upload: all of it when the page cache it
    /// was written in is still the one it is read from (the daemon died, not the
    /// system: what it wrote is there, as a local file keeps it), and an older
    /// release's record, which says nothing; else those the record says the fsync made
    /// durable, once their crc32c is checked.
    ///
    /// After a power cut a file system keeps nothing promised past the last fsync:
    /// ext4 with `data=writeback` (or without a journal) and `nodelalloc` commits a
    /// longer size and new blocks before their data, and the file then ends in other
    /// files' freed bytes (black-box finding: an fsync'd checkpoint was uploaded with
    /// 4 MiB of a deleted file's bytes after it). So a longer file is cut to what was
    /// fsync'd, and a file whose fsync'd bytes do not check (written again after the
    /// fsync, or never on disk as synced) is not uploaded at all: it cannot tell the
    /// bytes written since from stale ones, and is kept for inspection.
    async fn synced_size(&self, j: &Journaled, file: &Arc<std::fs::File>) -> Result<u64> {
        let local = |source| Error::Local {
            what: format!("reading {}", j.file.display()),
            source,
        };
        let whole = j.record.synced.is_none()
            || (j.record.epoch.is_some() && page_cache_epoch(file) == j.record.epoch);
        let Some(want) = j.record.synced.filter(|_| !whole) else {
            return Ok(file.metadata().map_err(local)?.len());
        };
        let f = file.clone();
        let found = tokio::task::spawn_blocking(move || checksum(&f, Some(want.size)))
            .await
            .map_err(|e| local(io::Error::other(e)))?
            .map_err(local)?;
        if found != want {
            return Err(Error::Local {
                what: format!(
                    "{}: its fsync'd file {} does not hold what was fsync'd ({} bytes, crc32c {:08x}; found {} bytes, crc32c {:08x}): written again since, or not on disk as synced; not uploaded, kept",
                    j.record.path,
                    j.file.display(),
                    want.size,
                    want.crc,
                    found.size,
                    found.crc
                ),
                source: io::Error::from(io::ErrorKind::InvalidData),
            });
        }
        Ok(want.size)
    }

    /// Whether the store's object `path` holds exactly `size` bytes of `file` (read back
    /// part by part; only a recovery whose create-only upload found the name taken asks).
    async fn store_holds(&self, path: &str, file: &Arc<std::fs::File>, size: u64) -> Result<bool> {
        let store = self.reader.store();
        let obj = match store.head(path).await {
            Ok(obj) => obj,
            Err(CacheError::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if obj.size != size {
            return Ok(false);
        }
        let step = self.writes()?.opts.part_size.max(1 << 20) as u64;
        let mut at = 0;
        while at < size {
            let len = step.min(size - at);
            let theirs = store.get_range(&obj, at..at + len).await?;
            let ours = super::stream::read_part(file.clone(), at, len as usize)
                .await
                .map_err(|source| Error::Local {
                    what: format!("reading back the fsync'd copy of {path}"),
                    source,
                })?;
            if theirs != ours {
                return Ok(false);
            }
            at += len;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::super::{staged_files_dir, WriteOptions, Writes};
    use super::*;

    /// Black-box finding (round 18b): three saves of one name kept while the store did
    /// not answer, then a restart: the oldest was uploaded and the newer dropped. The
    /// newest record of a name is kept, the older dropped with their files.
    #[test]
    fn of_several_records_for_one_name_the_newest_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kept = |n: u32, path: &str, age_s: u64| {
            let file = dir.path().join(format!("{n}.part"));
            std::fs::write(&file, format!("v{n}")).expect("staged");
            let record_file = record_path(&file);
            let f = std::fs::File::create(&record_file).expect("record");
            f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(age_s))
                .expect("mtime");
            let record = JournalRecord {
                path: path.into(),
                only_if_absent: false,
                source: None,
                mountpoint: None,
                synced: None,
                epoch: None,
                base: None,
                replaces: None,
            };
            (
                Journaled {
                    file,
                    record_file,
                    record,
                },
                None,
            )
        };
        // The newest of `ck` was written last but is listed first (staging numbers
        // are no order across runs).
        let left = newest_per_name(vec![
            kept(7, "ck", 10),
            kept(1, "ck", 30),
            kept(2, "ck", 20),
            kept(3, "other", 5),
        ]);
        let mut files: Vec<_> = left
            .iter()
            .map(|(j, _)| {
                j.file
                    .file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        files.sort();
        assert_eq!(files, ["3.part", "7.part"]);
        assert!(!dir.path().join("1.part").exists() && !dir.path().join("2.part").exists());
    }

    thread_local! {
        /// The folders this thread synced (`sync_dir`), in order.
        pub(super) static DIR_SYNCS: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
    }

    /// Black-box finding (power cut): a file fsync'd, then closed (uploaded: its record
    /// removed), then removed, renamed or rewritten through the mount came back at its
    /// fsync'd bytes after a power cut: the record's removal was never synced, and the
    /// restart found the record as the fsync had left it. The removal syncs the folder.
    #[test]
    fn an_fsync_records_removal_is_synced_before_it_counts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let writes = Writes::open(WriteOptions::new(dir.path().join("staging")), "mem|", None)
            .expect("open");
        let staged = writes.stage(&Arc::from("ckpt"), 0, false).expect("stage");
        staged.file.write_all_at(b"fsync'd", 0).expect("write");
        staged.journal(false).expect("fsync");
        let record = record_path(&staged.file_path);
        assert!(record.is_file());
        DIR_SYNCS.with(|d| d.borrow_mut().clear());
        staged.unjournal();
        assert!(!record.exists(), "removed");
        let files = staged_files_dir(&dir.path().join("staging"));
        assert_eq!(
            DIR_SYNCS.with(|d| d.borrow().clone()),
            vec![files],
            "the removal synced"
        );
    }

    /// Black-box finding (round 15b): each fsync read the whole file for its crc32c, 33
    /// ms per fsync of a line appended to a 200 MiB log (470x before). Appended bytes
    /// extend the last record's crc32c; a change below its length reads the file again.
    #[test]
    fn an_fsync_after_appends_reads_only_what_was_appended() {
        let dir = tempfile::tempdir().expect("tempdir");
        let writes = Writes::open(WriteOptions::new(dir.path().join("staging")), "mem|", None)
            .expect("open");
        let staged = writes.stage(&Arc::from("log"), 0, false).expect("stage");
        let write = |at: u64, bytes: &[u8]| {
            staged.changed_from(at);
            staged.file.write_all_at(bytes, at).expect("write");
        };
        let synced = || match read_record(&record_path(&staged.file_path)) {
            Found::Record(r) => r.synced.expect("synced"),
            _ => panic!("a record"),
        };
        write(0, b"line 1\n");
        staged.journal(false).expect("fsync");
        // Changed behind the record's back (not through a write): an fsync that read the
        // whole file again would see it; one that reads the appended bytes only does not.
        staged.file.write_all_at(b"LINE", 0).expect("poke");
        write(7, b"line 2\n");
        staged.journal(false).expect("fsync");
        assert_eq!(
            synced().crc,
            crc32c::crc32c(b"line 1\nline 2\n"),
            "extended"
        );
        // A write below the record's length: read whole again.
        write(0, b"Line");
        staged.journal(false).expect("fsync");
        assert_eq!(
            synced().crc,
            crc32c::crc32c(b"Line 1\nline 2\n"),
            "read again"
        );
        assert_eq!(synced().size, 14);
    }

    /// The record holds the length and crc32c of what the fsync made durable.
    #[test]
    fn an_fsync_record_names_the_bytes_it_made_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let writes = Writes::open(WriteOptions::new(dir.path().join("staging")), "mem|", None)
            .expect("open");
        let staged = writes.stage(&Arc::from("log"), 0, false).expect("stage");
        staged.file.write_all_at(b"line 1\n", 0).expect("write");
        staged.journal(false).expect("fsync");
        let read = || match read_record(&record_path(&staged.file_path)) {
            Found::Record(r) => r.synced,
            _ => panic!("a record"),
        };
        assert_eq!(
            read(),
            Some(Synced {
                size: 7,
                crc: crc32c::crc32c(b"line 1\n")
            })
        );
        staged.file.write_all_at(b"line 2\n", 7).expect("write");
        staged.journal(false).expect("fsync");
        assert_eq!(
            read(),
            Some(Synced {
                size: 14,
                crc: crc32c::crc32c(b"line 1\nline 2\n")
            }),
            "each fsync that changed the file rewrites it"
        );
    }

    /// Black-box cost (round 15b): each fsync rewrote its record through a temp file
    /// (write, sync, rename, folder sync), and sqlite in WAL mode committed at 0.29x its
    /// old rate. After the first, a record is rewritten in place: the same file, its
    /// older slot, no folder sync.
    #[test]
    fn a_later_fsync_rewrites_its_record_in_place() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let writes = Writes::open(WriteOptions::new(dir.path().join("staging")), "mem|", None)
            .expect("open");
        let staged = writes.stage(&Arc::from("wal"), 0, false).expect("stage");
        let record = record_path(&staged.file_path);
        staged.file.write_all_at(b"frame 1\n", 0).expect("write");
        staged.journal(false).expect("fsync");
        let ino = std::fs::metadata(&record).expect("record").ino();
        for (i, at) in [(2u8, 8u64), (3, 16), (4, 24)] {
            staged
                .file
                .write_all_at(format!("frame {i}\n").as_bytes(), at)
                .expect("write");
            staged.journal(false).expect("fsync");
        }
        let meta = std::fs::metadata(&record).expect("record");
        assert_eq!(meta.ino(), ino, "the same record file");
        assert_eq!(meta.len(), 2 * SLOT_ALIGN as u64, "two slots");
        match read_record(&record) {
            Found::Record(r) => assert_eq!(
                r.synced,
                Some(Synced {
                    size: 32,
                    crc: crc32c::crc32c(b"frame 1\nframe 2\nframe 3\nframe 4\n")
                })
            ),
            _ => panic!("a record"),
        }
    }

    /// A power cut inside an in-place rewrite tears the slot being written: its crc32c
    /// fails and the other slot, an earlier fsync's record, is the record.
    #[test]
    fn a_torn_slot_leaves_the_earlier_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let writes = Writes::open(WriteOptions::new(dir.path().join("staging")), "mem|", None)
            .expect("open");
        let staged = writes.stage(&Arc::from("log"), 0, false).expect("stage");
        let record = record_path(&staged.file_path);
        staged.file.write_all_at(b"line 1\n", 0).expect("write");
        staged.journal(false).expect("fsync");
        staged.file.write_all_at(b"line 2\n", 7).expect("write");
        staged.journal(false).expect("fsync");
        // The second record (sequence 2) is in slot 0: tear a byte of its JSON.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&record)
            .expect("open");
        f.write_all_at(b"#", SLOT_HEADER as u64 + 3).expect("tear");
        match read_record(&record) {
            Found::Record(r) => assert_eq!(
                r.synced,
                Some(Synced {
                    size: 7,
                    crc: crc32c::crc32c(b"line 1\n")
                }),
                "the first fsync's record"
            ),
            _ => panic!("a record"),
        }
        // Both torn: not a record (kept and reported at start, never uploaded).
        f.write_all_at(b"#", SLOT_ALIGN as u64 + SLOT_HEADER as u64 + 3)
            .expect("tear");
        assert!(matches!(read_record(&record), Found::Invalid));
    }

    /// A record that outgrows its slots (a rename to a long name) is made anew, and a
    /// record of the older format (the JSON alone) is still read.
    #[test]
    fn a_record_outgrowing_its_slots_or_of_the_older_format_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let writes = Writes::open(WriteOptions::new(dir.path().join("staging")), "mem|", None)
            .expect("open");
        let staged = writes.stage(&Arc::from("a"), 0, false).expect("stage");
        let record = record_path(&staged.file_path);
        staged.file.write_all_at(b"bytes", 0).expect("write");
        staged.journal(false).expect("fsync");
        let long: Arc<str> = Arc::from(format!("{}/b", "d".repeat(5000)).as_str());
        *staged.path.lock() = long.clone();
        staged.rejournal(false);
        assert_eq!(
            std::fs::metadata(&record).expect("record").len(),
            4 * SLOT_ALIGN as u64,
            "two slots of two pages"
        );
        match read_record(&record) {
            Found::Record(r) => assert_eq!(r.path, &*long),
            _ => panic!("a record"),
        }
        std::fs::write(
            &record,
            br#"{"path":"old","only_if_absent":true,"source":"mem|","size":5,"crc32c":7}"#,
        )
        .expect("older record");
        match read_record(&record) {
            Found::Record(r) => {
                assert_eq!(r.path, "old");
                assert!(r.only_if_absent);
                assert_eq!(r.synced, Some(Synced { size: 5, crc: 7 }));
            }
            _ => panic!("a record"),
        }
    }
}
