//! Plain-file copies of small objects for FUSE passthrough (reads then bypass the
//! daemon entirely), kept so that they can be trusted and do not grow without bound.
//!
//! - **Named by what they hold**: a copy's name is a hash of (path, version, size), so a
//!   new version of an object is a new copy and an old one is never served for it.
//! - **Verified**: a copy is one file, `<name>.<crc>`, its name carrying the crc32c of
//!   its bytes (8 hex digits). The first open of a copy in a daemon's life reads it whole
//!   and checks the crc (copies are at most `max_object` bytes); a mismatch or a wrong
//!   size deletes the copy and the read goes through the cache instead. Later opens
//!   trust it while the file is the one verified or written: same inode, size, mtime
//!   and ctime (one `fstat` of the descriptor opened anyway). A file changed in place,
//!   swapped for another or put back by a rename fails that and is checked again
//!   (black-box finding: a copy flipped while the mount ran was served as is, and two
//!   swapped copies served each other's bytes). Anything but a regular file under a
//!   copy's name (a FIFO would hang the open) is damage.
//! - **Cheap to write**: a copy of one part (a block) is created exclusively (mode 0600,
//!   never following a link) under its final name and written, with no fsync and no
//!   rename; a larger one is written part by part under a temporary name and renamed,
//!   so only one part of it is in memory at once. A copy a crash
//!   tore (short, or holes of zeros) fails its crc at its first open after the restart
//!   and is removed then, so durability costs nothing on the read path. (The earlier
//!   format, a copy plus a `.crc` sidecar, each fsynced and renamed into place, cost two
//!   file creations, two renames and three fsyncs per copy: about a third of the
//!   daemon's CPU on a cold read of 2,000 small files, issue 14.) Files of that format,
//!   and temporary files, are removed at start.
//! - **Bounded**: the copies' bytes are counted from the directory at start; a new copy
//!   evicts the least recently opened ones until the total fits `budget`. A copy counts
//!   what it takes on disk ([`footprint`]: its length rounded up to whole 4 KiB pages,
//!   one page at least), not its length: 30,000 one-byte copies took 117 MiB against a
//!   64 MiB disk budget when each counted one byte (black-box finding).
//! - **One per daemon**: every mount of a daemon shares the store (and its budget, the
//!   disk budget's passthrough share): two stores indexing one directory would each
//!   count the whole share and delete copies the other serves. A mount's copy names
//!   carry its namespace (the store URL), so two stores' objects with equal keys and
//!   versions never share a copy.
//! - **Staged writes count too**: files being written through a mount (staged on local
//!   disk until uploaded, `filesystem::write`) are charged to the same budget, so the
//!   disk budget counts everything Strata writes. A staged file evicts copies to make
//!   room (a copy can be made again from the store; a staged file is the only copy of
//!   what the user wrote), and is never refused for the budget's sake: staged bytes
//!   beyond the budget, once no copy is left to evict, are allowed and reported
//!   ([`PassthroughStore::staged_bytes`]); a file system that fills first (a budget
//!   larger than the disk) costs copies too ([`PassthroughStore::evict_until`]), and
//!   only a disk full of other things gives ENOSPC.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// Bytes a copy of `size` bytes takes on disk: whole 4 KiB pages (a file system's usual
/// block; a 1-byte file takes one), and one page for an empty file (its inode and
/// directory entry are not free, and counting them bounds the number of copies).
pub fn footprint(size: u64) -> u64 {
    use strata_cache_core::io::{align_up, ALIGN};
    align_up(usize::try_from(size).unwrap_or(usize::MAX - ALIGN)).max(ALIGN) as u64
}

/// The file name of copy `name` holding bytes of crc32c `crc`.
fn file_name(name: &str, crc: u32) -> String {
    format!("{name}.{crc:08x}")
}

/// (name, crc) of a copy's file name; None for anything else (the earlier format's
/// copies, sidecars and temporary files among them).
fn parse_file_name(file: &str) -> Option<(&str, u32)> {
    let (name, crc) = file.rsplit_once('.')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(name, 32) || !hex(crc, 8) {
        return None;
    }
    Some((name, u32::from_str_radix(crc, 16).ok()?))
}

#[derive(Debug)]
struct Copy {
    size: u64,
    crc: u32,
    /// Last open (or write), in `State::tick`s: the LRU order.
    last: u64,
    /// The file as verified (or written) in this daemon's life; None: to verify.
    verified: Option<Stamp>,
}

/// What identifies a file's contents without reading them: a write, a truncate, a
/// rename over it or a swap changes at least one of these (ctime cannot be set back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    copies: HashMap<String, Copy>,
    lru: BTreeMap<u64, String>,
    bytes: u64,
    tick: u64,
    inflight: HashSet<String>,
    /// Bytes of files being written through the mounts, charged to the budget.
    staged: u64,
    /// The budget as the device allows it, once the device filled before the budget
    /// did ([`PassthroughStore::device_full`]); None: the configured budget.
    device_cap: Option<u64>,
}

impl State {
    /// `budget`, or less while the device is full ([`Self::device_cap`]).
    fn cap(&self, budget: u64) -> u64 {
        self.device_cap.map_or(budget, |c| c.min(budget))
    }

    fn touch(&mut self, name: &str) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(c) = self.copies.get_mut(name) {
            self.lru.remove(&c.last);
            c.last = tick;
            self.lru.insert(tick, name.to_string());
        }
    }

    fn forget(&mut self, name: &str) -> Option<Copy> {
        let c = self.copies.remove(name)?;
        self.lru.remove(&c.last);
        self.bytes -= footprint(c.size);
        Some(c)
    }

    /// Evicts the least recently opened copies until the copies and `extra` more
    /// bytes fit `budget` along with what is staged (or none is left); the victims'
    /// (name, crc), whose files the caller removes outside the lock.
    fn make_room(&mut self, budget: u64, extra: u64) -> Vec<(String, u32)> {
        let budget = self.cap(budget);
        let mut victims = Vec::new();
        while self.bytes + self.staged + extra > budget {
            let Some((_, oldest)) = self.lru.pop_first() else {
                break;
            };
            if let Some(c) = self.copies.remove(&oldest) {
                self.bytes -= footprint(c.size);
                victims.push((oldest, c.crc));
            }
        }
        victims
    }
}

/// The copies of one mount. See the module docs.
#[derive(Debug)]
pub struct PassthroughStore {
    dir: PathBuf,
    budget: u64,
    state: Mutex<State>,
}

impl PassthroughStore {
    /// Opens (creating, mode 0700) the copies' directory and indexes what a previous
    /// run left: copies named as this version names them count against the budget;
    /// anything else (temporary files, the earlier format's copies and sidecars) is
    /// removed.
    pub fn open(dir: impl Into<PathBuf>, budget: u64) -> io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let mut state = State::default();
        // Oldest first (by last change: a copy is written once), so the recency order
        // a previous run had is roughly kept, and a smaller budget evicts the oldest.
        let mut entries = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let changed = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            entries.push((changed, entry, meta));
        }
        entries.sort_by_key(|(changed, _, _)| *changed);
        for (_, entry, meta) in entries {
            let file = entry.file_name();
            let parsed = file.to_str().and_then(parse_file_name);
            match parsed {
                Some((name, crc)) if meta.is_file() && !state.copies.contains_key(name) => {
                    state.tick += 1;
                    state.bytes += footprint(meta.len());
                    state.lru.insert(state.tick, name.to_string());
                    state.copies.insert(
                        name.to_string(),
                        Copy {
                            size: meta.len(),
                            crc,
                            last: state.tick,
                            verified: None,
                        },
                    );
                }
                _ => {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        // A previous run with a larger budget: down to this one's (black-box finding:
        // 36 MiB of copies stayed against a 4 MiB share after a restart).
        for (name, crc) in state.make_room(budget, 0) {
            remove_copy(&dir, &name, crc);
        }
        Ok(PassthroughStore {
            dir,
            budget,
            state: Mutex::new(state),
        })
    }

    /// Deletes the least recently opened copies until `enough()` (or none is left); the
    /// number deleted. For a start on a full filesystem: the disk tier's index needs
    /// room to open, and copies are a cache (crash finding: a mount whose passthrough
    /// copies had filled its cache dir's filesystem was refused at every restart).
    pub fn evict_until(&self, mut enough: impl FnMut() -> bool) -> usize {
        let mut deleted = 0;
        while !enough() {
            let victim = {
                let mut st = self.state.lock();
                let Some((_, name)) = st.lru.pop_first() else {
                    break;
                };
                st.copies.remove(&name).map(|c| {
                    st.bytes -= footprint(c.size);
                    (name, c.crc)
                })
            };
            if let Some((name, crc)) = victim {
                remove_copy(&self.dir, &name, crc);
                deleted += 1;
            }
        }
        deleted
    }

    /// Deletes the copy `name` if it is kept (a version the mount removed or replaced:
    /// it can never be served again); whether it was. Blocking (removes a file). An
    /// open descriptor of it reads on.
    pub fn discard(&self, name: &str) -> bool {
        let victim = {
            let mut st = self.state.lock();
            st.copies.remove(name).map(|c| {
                st.bytes -= footprint(c.size);
                st.lru.remove(&c.last);
                c.crc
            })
        };
        match victim {
            Some(crc) => {
                remove_copy(&self.dir, name, crc);
                true
            }
            None => false,
        }
    }

    /// The file system the copies are on (`st_dev`).
    pub fn device(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.dir).ok().map(|m| m.dev())
    }

    /// Bytes the copies and the staged files may take together.
    pub fn budget(&self) -> u64 {
        self.state.lock().cap(self.budget)
    }

    /// The file system filled before the budget did (a budget larger than the disk, or
    /// other files on it) and no copy was left to give up: the budget comes down to
    /// what is held now, so a file written in order frees what its upload has sent and
    /// waits for it, as past the budget (black-box finding: a 150 MiB checkpoint
    /// written in order onto a 64 MiB cache disk failed ENOSPC under the default 10 GiB
    /// budget, and went through under a 48 MiB one). It goes back up once no file is
    /// staged. True if it came down now.
    pub fn device_full(&self) -> bool {
        let mut st = self.state.lock();
        let held = st.bytes + st.staged;
        if st.cap(self.budget) <= held {
            return false;
        }
        st.device_cap = Some(held);
        tracing::warn!(budget = self.budget, held,
            "the staging file system filled before the disk budget: the budget is what is held until no file is staged");
        true
    }

    /// The copy name of one version of an object of the store named `namespace` (""
    /// for a store of its own: the names of copies made before namespaces).
    pub fn name(namespace: &str, path: &str, version: &str, size: u64) -> String {
        let mut h = Sha256::new();
        if !namespace.is_empty() {
            h.update(namespace.as_bytes());
            h.update([0]);
        }
        h.update(path.as_bytes());
        h.update([0]);
        h.update(version.as_bytes());
        h.update(size.to_le_bytes());
        hex::encode(&h.finalize()[..16])
    }

    /// Charges `bytes` more of a staged file to the budget, evicting the least recently
    /// opened copies to make room (see the module docs); true if it evicted any.
    /// Blocking (removes files).
    pub fn charge_staged(&self, bytes: u64) -> bool {
        if bytes == 0 {
            return false;
        }
        let victims = {
            let mut st = self.state.lock();
            st.staged += bytes;
            st.make_room(self.budget, 0)
        };
        let evicted = !victims.is_empty();
        self.remove_files(victims);
        evicted
    }

    /// Bytes the budget has free now (beside the copies and what is staged).
    pub fn free_bytes(&self) -> u64 {
        let st = self.state.lock();
        st.cap(self.budget).saturating_sub(st.bytes + st.staged)
    }

    /// Bytes a staged file could still take within the budget: the free room and what
    /// evicting every copy would free.
    pub fn room_for_staging(&self) -> u64 {
        let st = self.state.lock();
        st.cap(self.budget).saturating_sub(st.staged)
    }

    /// A staged file's `bytes` left the staging directory (removed, truncated, or
    /// about to be adopted as a copy).
    pub fn release_staged(&self, bytes: u64) {
        let mut st = self.state.lock();
        st.staged = st.staged.saturating_sub(bytes);
        if st.staged == 0 {
            st.device_cap = None; // the files that filled the device are gone: try again
        }
    }

    /// Bytes of staged files charged now (may exceed what the budget leaves: see the
    /// module docs).
    pub fn staged_bytes(&self) -> u64 {
        self.state.lock().staged
    }

    /// Whether the copy `name` is kept now.
    pub fn contains(&self, name: &str) -> bool {
        self.state.lock().copies.contains_key(name)
    }

    /// Bytes of the copies kept now.
    pub fn bytes(&self) -> u64 {
        self.state.lock().bytes
    }

    /// Copies kept now.
    pub fn len(&self) -> usize {
        self.state.lock().copies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The copy `name` of `size` bytes, opened for reading, if there is a good one.
    /// Blocking: the first open in this daemon's life reads the copy to verify it.
    pub fn get(&self, name: &str, size: u64) -> Option<File> {
        let (crc, verified) = {
            let mut st = self.state.lock();
            let c = st.copies.get(name)?;
            if c.size != size {
                return None;
            }
            let found = (c.crc, c.verified);
            st.touch(name);
            found
        };
        let path = self.dir.join(file_name(name, crc));
        let file = strata_cache_core::io::open_regular(&path, 0).ok();
        let stamp = file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map(|m| Stamp::of(&m));
        let good = match (&file, stamp) {
            (Some(_), Some(now)) if verified == Some(now) && now.size == size => true,
            (Some(f), Some(now)) => now.size == size && crc_of(f, size).ok() == Some(crc),
            _ => false,
        };
        if !good {
            tracing::warn!(copy = %path.display(), "passthrough copy damaged or gone; removed, reads go through the cache");
            self.state.lock().forget(name);
            remove_copy(&self.dir, name, crc);
            return None;
        }
        if verified != stamp {
            if let Some(c) = self.state.lock().copies.get_mut(name) {
                c.verified = stamp;
            }
        }
        let mut f = file?;
        // Back to the start after verifying (the kernel reads at the FUSE file's
        // offsets, but a fresh-looking handle costs nothing).
        f.seek(SeekFrom::Start(0)).ok()?;
        Some(f)
    }

    /// Whether a copy of `name` (`size` bytes) should be written now: not kept yet,
    /// not being written, small enough for the budget. True reserves it: end with
    /// [`Self::write`] or [`Self::abort`].
    pub fn begin(&self, name: &str, size: u64) -> bool {
        let mut st = self.state.lock();
        if footprint(size) + st.staged > st.cap(self.budget) {
            return false;
        }
        !st.copies.contains_key(name) && st.inflight.insert(name.to_string())
    }

    /// The reserved copy was not made.
    pub fn abort(&self, name: &str) {
        self.state.lock().inflight.remove(name);
    }

    /// Writes the reserved copy `name` (see the module docs), evicting the least
    /// recently opened copies to stay within the budget. Blocking.
    pub fn write(&self, name: &str, data: &[u8]) -> io::Result<()> {
        let result = self.write_files(name, data);
        self.state.lock().inflight.remove(name);
        self.index(name, data.len() as u64, result?);
        Ok(())
    }

    /// Starts writing the reserved copy `name` part by part, for an object larger than
    /// one part: under a temporary name (removed at start if a crash leaves it), renamed
    /// to its name, which carries the crc32c of its bytes, by [`Self::finish_copy`]. So
    /// no more than one part of it is in memory at once (black-box finding: a copy was
    /// read whole into memory, up to `max_object`, 64 MiB, and a daemon in a 128 MiB
    /// cgroup was OOM-killed by readers' copies). End with [`Self::finish_copy`] or
    /// [`Self::abort_copy`]. Blocking.
    pub fn start_copy(&self, name: &str) -> io::Result<CopyWriter> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let file = match create_exclusive(&tmp) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(&tmp).and_then(|()| create_exclusive(&tmp))
            }
            r => r,
        };
        match file {
            Ok(file) => Ok(CopyWriter {
                file,
                tmp,
                crc: 0,
                len: 0,
            }),
            Err(e) => {
                self.abort(name);
                Err(e)
            }
        }
    }

    /// The copy written by `w` is whole: renamed to its name and counted (evicting the
    /// least recently opened copies to stay within the budget). Blocking.
    pub fn finish_copy(&self, name: &str, w: CopyWriter) -> io::Result<()> {
        let CopyWriter {
            file,
            tmp,
            crc,
            len,
        } = w;
        drop(file);
        let path = self.dir.join(file_name(name, crc));
        let renamed = fs::rename(&tmp, &path);
        self.state.lock().inflight.remove(name);
        if let Err(e) = renamed {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        self.index(name, len, crc);
        Ok(())
    }

    /// The copy written by `w` was not made: its temporary file goes. Blocking.
    pub fn abort_copy(&self, name: &str, w: CopyWriter) {
        let _ = fs::remove_file(&w.tmp);
        self.abort(name);
    }

    /// Takes the finished file at `from` (`size` bytes of crc32c `crc`, on the same
    /// file system: a file written through the mount and uploaded) as the copy `name`,
    /// by a rename: the bytes written once become the copy the next open passes
    /// through. False (and `from` left in place) when the budget's free room cannot hold
    /// it, a copy of `name` exists or is being written, or the rename fails. Blocking.
    ///
    /// Only into free room: a written file has not been read yet, while every copy kept
    /// was, so a job saving many checkpoint shards must not push a dataset's copies out.
    pub fn adopt(&self, name: &str, from: &Path, size: u64, crc: u32) -> bool {
        {
            let st = self.state.lock();
            if st.bytes + st.staged + footprint(size) > st.cap(self.budget) {
                return false;
            }
        }
        if !self.begin(name, size) {
            return false;
        }
        let renamed = fs::rename(from, self.dir.join(file_name(name, crc)));
        self.state.lock().inflight.remove(name);
        match renamed {
            Ok(()) => {
                self.index(name, size, crc);
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "written file not adopted as a passthrough copy");
                false
            }
        }
    }

    /// Counts the new copy `name`, evicting the least recently opened copies to stay
    /// within the budget.
    fn index(&self, name: &str, size: u64, crc: u32) {
        // The file as written: trusted by later opens while it stays so.
        let verified = fs::symlink_metadata(self.dir.join(file_name(name, crc)))
            .ok()
            .filter(|m| m.is_file())
            .map(|m| Stamp::of(&m));
        let mut st = self.state.lock();
        let victims = st.make_room(self.budget, footprint(size));
        st.tick += 1;
        let tick = st.tick;
        st.bytes += footprint(size);
        st.lru.insert(tick, name.to_string());
        st.copies.insert(
            name.to_string(),
            Copy {
                size,
                crc,
                last: tick,
                verified,
            },
        );
        drop(st);
        self.remove_files(victims);
    }

    fn remove_files(&self, victims: Vec<(String, u32)>) {
        for (v, crc) in victims {
            remove_copy(&self.dir, &v, crc);
        }
    }

    fn write_files(&self, name: &str, data: &[u8]) -> io::Result<u32> {
        let crc = crc32c::crc32c(data);
        let path = self.dir.join(file_name(name, crc));
        let written = match create_and_write(&path, data) {
            // Left by a failed removal (the index never holds it): its name says it
            // holds these very bytes, but it is replaced rather than trusted.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(&path).and_then(|()| create_and_write(&path, data))
            }
            r => r,
        };
        if let Err(e) = written {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        Ok(crc)
    }
}

/// A copy being written part by part ([`PassthroughStore::start_copy`]).
pub struct CopyWriter {
    file: File,
    tmp: PathBuf,
    crc: u32,
    len: u64,
}

impl CopyWriter {
    /// Appends the next part of the object. Blocking.
    pub fn append(&mut self, data: &[u8]) -> io::Result<()> {
        self.file.write_all(data)?;
        self.crc = crc32c::crc32c_append(self.crc, data);
        self.len += data.len() as u64;
        Ok(())
    }
}

/// Creates `path` exclusively (0600, no link followed).
fn create_exclusive(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Creates `path` exclusively and writes `data`; no fsync (a torn copy fails its crc at
/// its first open after a crash).
fn create_and_write(path: &Path, data: &[u8]) -> io::Result<()> {
    create_exclusive(path)?.write_all(data)
}

/// The crc32c of the `size` bytes of `f`, read 1 MiB at a time (a copy may be as large
/// as `max_object`).
fn crc_of(mut f: &File, size: u64) -> io::Result<u32> {
    let mut buf = vec![0u8; (1 << 20).min(size.max(1)) as usize];
    let (mut crc, mut read) = (0u32, 0u64);
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        read += n as u64;
    }
    if read != size {
        return Err(io::Error::other("size changed"));
    }
    Ok(crc)
}

fn remove_copy(dir: &Path, name: &str, crc: u32) {
    let path = dir.join(file_name(name, crc));
    if let Err(e) = fs::remove_file(&path) {
        if e.kind() == io::ErrorKind::IsADirectory {
            let _ = fs::remove_dir(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn store(dir: &Path, budget: u64) -> PassthroughStore {
        PassthroughStore::open(dir, budget).expect("open")
    }

    /// The one file of copy `name` in `dir`.
    fn copy_file(dir: &Path, name: &str) -> PathBuf {
        let files: Vec<PathBuf> = fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| {
                p.file_name()
                    .and_then(|f| f.to_str())
                    .is_some_and(|f| f.starts_with(name))
            })
            .collect();
        assert_eq!(files.len(), 1, "one file per copy: {files:?}");
        files[0].clone()
    }

    fn contents(f: File) -> Vec<u8> {
        let mut v = Vec::new();
        (&f).read_to_end(&mut v).expect("read");
        v
    }

    /// Black-box finding: 30,000 one-byte copies took 117 MiB of disk against a 64 MiB
    /// budget, each counted as one byte. A copy counts the pages it takes.
    #[test]
    fn a_copy_counts_the_pages_it_takes_on_disk() {
        assert_eq!(footprint(0), 4096);
        assert_eq!(footprint(1), 4096);
        assert_eq!(footprint(4096), 4096);
        assert_eq!(footprint(4097), 8192);
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 10 * 4096);
        for i in 0..30 {
            let n = PassthroughStore::name("", &format!("tiny{i}"), "v", 1);
            assert!(s.begin(&n, 1));
            s.write(&n, b"x").expect("write");
        }
        assert_eq!(s.len(), 10, "ten pages' worth of one-byte copies");
        assert_eq!(s.bytes(), 10 * 4096);
        let on_disk = fs::read_dir(dir.path()).expect("dir").count();
        assert_eq!(on_disk, 10, "the evicted copies' files are removed");
        drop(s);
        let s = store(dir.path(), 4 * 4096);
        assert_eq!(
            (s.len(), s.bytes()),
            (4, 4 * 4096),
            "counted the same at reopen"
        );
    }

    /// Reopened with a smaller budget (a restart with a smaller disk cache), the copies
    /// are evicted down to it, the oldest first (black-box finding: all stayed).
    #[test]
    fn a_smaller_budget_at_reopen_evicts_the_oldest_copies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let names: Vec<String> = (0..6)
            .map(|i| PassthroughStore::name("", &format!("f{i}"), "v", 4096))
            .collect();
        {
            let s = store(dir.path(), 1 << 20);
            for n in &names {
                assert!(s.begin(n, 4096));
                s.write(n, &[7u8; 4096]).expect("write");
                // Distinct change times: the order a reopen sees.
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            assert_eq!(s.bytes(), 24576);
        }
        let s = store(dir.path(), 10240);
        assert_eq!(s.bytes(), 8192, "within the new budget");
        assert!(s.get(&names[0], 4096).is_none(), "the oldest went");
        assert!(s.get(&names[5], 4096).is_some(), "the newest stayed");
        assert_eq!(fs::read_dir(dir.path()).expect("read_dir").count(), 2);
    }

    /// At a start on a full filesystem the oldest copies go until there is room.
    #[test]
    fn evict_until_deletes_the_oldest_copies_until_enough() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 1 << 20);
        let names: Vec<String> = (0..5)
            .map(|i| PassthroughStore::name("", &format!("f{i}"), "v", 4096))
            .collect();
        for n in &names {
            assert!(s.begin(n, 4096));
            s.write(n, &[3u8; 4096]).expect("write");
        }
        let files = |d: &Path| fs::read_dir(d).expect("read_dir").count();
        assert_eq!(s.evict_until(|| files(dir.path()) <= 3), 2);
        assert!(s.get(&names[0], 4096).is_none() && s.get(&names[1], 4096).is_none());
        assert!(s.get(&names[2], 4096).is_some(), "no more than needed");
        assert_eq!(s.bytes(), 3 * 4096);
        assert_eq!(s.evict_until(|| false), 3, "stops when none is left");
        assert_eq!((s.len(), files(dir.path())), (0, 0));
    }

    /// Black-box finding: a copy changed while the daemon ran was served as is (it
    /// was verified once, at its first open), two swapped copies served each other's
    /// bytes, and a FIFO under a copy's name hung the open. Each is caught at the next
    /// open; an untouched copy is not read again to be trusted.
    #[test]
    fn a_copy_changed_swapped_or_replaced_while_running_is_not_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 1 << 20);
        let a = PassthroughStore::name("", "a", "v", 1000);
        let b = PassthroughStore::name("", "b", "v", 1000);
        for (n, byte) in [(&a, 1u8), (&b, 2u8)] {
            assert!(s.begin(n, 1000));
            s.write(n, &[byte; 1000]).expect("write");
        }
        assert_eq!(contents(s.get(&a, 1000).expect("a")), vec![1u8; 1000]);
        assert_eq!(contents(s.get(&b, 1000).expect("b")), vec![2u8; 1000]);

        // Swapped: each name now holds the other's bytes (same sizes).
        let (fa, fb) = (copy_file(dir.path(), &a), copy_file(dir.path(), &b));
        let tmp = dir.path().join("swap");
        fs::rename(&fa, &tmp).expect("mv");
        fs::rename(&fb, &fa).expect("mv");
        fs::rename(&tmp, &fb).expect("mv");
        assert!(s.get(&a, 1000).is_none(), "a holds b's bytes");
        assert!(s.get(&b, 1000).is_none(), "b holds a's bytes");
        assert!(!fa.exists() && !fb.exists(), "both removed");

        // Changed in place, same size.
        let c = PassthroughStore::name("", "c", "v", 1000);
        assert!(s.begin(&c, 1000));
        s.write(&c, &[3u8; 1000]).expect("write");
        assert!(s.get(&c, 1000).is_some());
        let fc = copy_file(dir.path(), &c);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut f = OpenOptions::new().write(true).open(&fc).expect("open");
        f.seek(SeekFrom::Start(500)).expect("seek");
        f.write_all(&[9]).expect("flip");
        drop(f);
        assert!(s.get(&c, 1000).is_none(), "a flipped byte is caught");

        // A FIFO under a copy's name: no hang, no copy.
        let d = PassthroughStore::name("", "d", "v", 1000);
        assert!(s.begin(&d, 1000));
        s.write(&d, &[4u8; 1000]).expect("write");
        let fd = copy_file(dir.path(), &d);
        fs::remove_file(&fd).expect("rm");
        let path = std::ffi::CString::new(fd.to_str().expect("utf-8")).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        assert!(s.get(&d, 1000).is_none());
        assert!(!fd.exists(), "the FIFO is removed");
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn copies_survive_a_restart_and_count_against_the_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 1 << 20);
        let name = PassthroughStore::name("", "a/b.bin", "etag1", 1000);
        assert_ne!(PassthroughStore::name("", "a/b.bin", "etag2", 1000), name);
        assert_ne!(
            PassthroughStore::name("s3://other", "a/b.bin", "etag1", 1000),
            name
        );
        assert!(s.begin(&name, 1000));
        assert!(!s.begin(&name, 1000), "one writer");
        s.write(&name, &[7u8; 1000]).expect("write");
        assert!(!s.begin(&name, 1000), "kept already");
        assert_eq!(contents(s.get(&name, 1000).expect("copy")), vec![7u8; 1000]);
        assert!(
            s.get(&name, 999).is_none(),
            "another size is another object"
        );
        let mode = fs::metadata(copy_file(dir.path(), &name)).expect("meta");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        drop(s);
        // Leftovers: a temporary file, and a copy with its sidecar in the earlier format.
        let old = "0123456789abcdef0123456789abcdef";
        fs::write(dir.path().join("x.tmp"), b"half").expect("tmp");
        fs::write(dir.path().join(old), b"old copy").expect("old copy");
        fs::write(dir.path().join(format!("{old}.crc")), b"00000000").expect("sidecar");
        let s = store(dir.path(), 1 << 20);
        assert_eq!(
            (s.len(), s.bytes()),
            (1, 4096),
            "a page for the 1,000-byte copy"
        );
        assert_eq!(
            fs::read_dir(dir.path()).expect("dir").count(),
            1,
            "only the copy"
        );
        assert_eq!(
            contents(s.get(&name, 1000).expect("after restart")),
            vec![7u8; 1000]
        );
    }

    #[test]
    fn a_damaged_copy_is_removed_not_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 1 << 20);
        let name = PassthroughStore::name("", "f", "v", 4096);
        assert!(s.begin(&name, 4096));
        s.write(&name, &[1u8; 4096]).expect("write");
        drop(s);
        // Same size, one byte flipped on disk.
        let path = copy_file(dir.path(), &name);
        let mut bytes = fs::read(&path).expect("read");
        bytes[100] ^= 0xff;
        fs::write(&path, &bytes).expect("flip");
        let s = store(dir.path(), 1 << 20);
        assert!(s.get(&name, 4096).is_none(), "checked at its first open");
        assert!(!path.exists());
        assert_eq!((s.len(), s.bytes()), (0, 0));
    }

    /// A copy is one file written once: no sidecar, no temporary file (a copy per file
    /// used to cost two creations, two renames and three fsyncs). One torn by a crash
    /// before its pages reached the disk (zeros where its bytes were) is caught by the
    /// crc its name carries, at its first open after the restart.
    #[test]
    fn a_copy_is_one_file_and_a_torn_one_is_caught_after_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 1 << 20);
        let name = PassthroughStore::name("", "g", "v", 8192);
        assert!(s.begin(&name, 8192));
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        s.write(&name, &data).expect("write");
        let files: Vec<_> = fs::read_dir(dir.path()).expect("dir").collect();
        assert_eq!(files.len(), 1, "one file per copy");
        let path = copy_file(dir.path(), &name);
        assert_eq!(
            path.file_name().and_then(|f| f.to_str()),
            Some(file_name(&name, crc32c::crc32c(&data)).as_str())
        );
        drop(s);
        fs::write(&path, vec![0u8; 8192]).expect("torn");
        let s = store(dir.path(), 1 << 20);
        assert_eq!((s.len(), s.bytes()), (1, 8192), "indexed from its name");
        assert!(s.get(&name, 8192).is_none(), "the crc catches it");
        assert!(!path.exists());
        assert_eq!((s.len(), s.bytes()), (0, 0));
    }

    /// A copy larger than one part is written part by part (only one part in memory:
    /// black-box finding, copies read whole got a daemon OOM-killed) under a temporary
    /// name, then renamed to the name its crc gives; a crash's temporary file is removed
    /// at the next start, and an aborted copy leaves nothing.
    #[test]
    fn a_copy_written_part_by_part_is_whole_under_its_crc_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 1 << 20);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 249) as u8).collect();
        let name = PassthroughStore::name("", "p", "v", data.len() as u64);
        assert!(s.begin(&name, data.len() as u64));
        let mut w = s.start_copy(&name).expect("start");
        for part in data.chunks(65_536) {
            w.append(part).expect("append");
        }
        s.finish_copy(&name, w).expect("finish");
        let path = copy_file(dir.path(), &name);
        assert_eq!(
            path.file_name().and_then(|f| f.to_str()),
            Some(file_name(&name, crc32c::crc32c(&data)).as_str())
        );
        let f = s.get(&name, data.len() as u64).expect("served");
        assert_eq!(contents(f), data);
        assert_eq!(s.len(), 1);

        let other = PassthroughStore::name("", "q", "v", 10);
        assert!(s.begin(&other, 10));
        let mut w = s.start_copy(&other).expect("start");
        w.append(b"half").expect("append");
        s.abort_copy(&other, w);
        assert!(s.begin(&other, 10), "an aborted copy can be made again");
        let w = s.start_copy(&other).expect("start again");
        std::mem::forget(w); // a crash mid-copy
        drop(s);
        let s = store(dir.path(), 1 << 20);
        assert_eq!(s.len(), 1, "the torn temporary file is no copy");
        let files: Vec<_> = fs::read_dir(dir.path()).expect("dir").collect();
        assert_eq!(files.len(), 1, "and it is removed at start");
    }

    #[test]
    fn the_least_recently_opened_copies_make_room() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 12288);
        let names: Vec<String> = (0..4)
            .map(|i| PassthroughStore::name("", &format!("f{i}"), "v", 4096))
            .collect();
        for n in &names[..3] {
            assert!(s.begin(n, 4096));
            s.write(n, &[0u8; 4096]).expect("write");
        }
        s.get(&names[0], 4096).expect("opened: now the most recent");
        assert!(s.begin(&names[3], 4096));
        s.write(&names[3], &[0u8; 4096]).expect("write");
        assert_eq!(s.bytes(), 12288);
        assert!(
            s.get(&names[1], 4096).is_none(),
            "least recently opened went"
        );
        assert!(fs::read_dir(dir.path()).expect("dir").all(|e| !e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .starts_with(&names[1])));
        for n in [&names[0], &names[2], &names[3]] {
            assert!(s.get(n, 4096).is_some());
        }
    }

    /// Black-box finding (round 14): a file system smaller than the budget filled with a
    /// file's own staged bytes, and the write failed ENOSPC where a smaller budget would
    /// have made the file free what its upload had sent. The budget comes down to what
    /// is held when the device fills, and goes back up once nothing is staged.
    #[test]
    fn a_full_device_brings_the_budget_down_until_nothing_is_staged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 10 << 20);
        s.charge_staged(3 << 20);
        assert_eq!(s.room_for_staging(), 7 << 20);
        assert!(s.device_full(), "came down");
        assert_eq!(s.budget(), 3 << 20);
        assert_eq!(s.room_for_staging(), 0, "the file must free what it sent");
        assert!(!s.device_full(), "already down");
        s.release_staged(1 << 20);
        assert_eq!(s.budget(), 3 << 20, "still a file staged");
        s.release_staged(2 << 20);
        assert_eq!(s.budget(), 10 << 20, "back up");
    }

    /// Staged writes share the budget: they push copies out (a copy can be made again,
    /// a staged file cannot), a copy never pushes them out, and a written file is
    /// adopted only into the room its own staging leaves.
    #[test]
    fn staged_writes_count_against_the_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 12288);
        let names: Vec<String> = (0..3)
            .map(|i| PassthroughStore::name("", &format!("f{i}"), "v", 4096))
            .collect();
        for n in &names {
            assert!(s.begin(n, 4096));
            s.write(n, &[0u8; 4096]).expect("write");
        }
        assert!(s.charge_staged(6144), "made room");
        assert_eq!((s.len(), s.bytes(), s.staged_bytes()), (1, 4096, 6144));
        assert!(s.get(&names[2], 4096).is_some(), "the most recent stays");
        assert!(s.get(&names[0], 4096).is_none());
        let on_disk = fs::read_dir(dir.path()).expect("dir").count();
        assert_eq!(on_disk, 1, "evicted copies' files are removed");
        // A copy that does not fit beside what is staged is not begun.
        let big = PassthroughStore::name("", "big", "v", 8192);
        assert!(!s.begin(&big, 8192));
        // Beyond the budget once no copy is left: allowed, and reported.
        assert!(s.charge_staged(8192));
        assert_eq!((s.len(), s.staged_bytes()), (0, 14336));
        s.release_staged(14336);
        assert_eq!(s.staged_bytes(), 0);
        // Adoption: only into free room, counting the staged bytes.
        let staged_file = dir.path().join("w.part");
        fs::write(&staged_file, [9u8; 4096]).expect("staged file");
        let crc = crc32c::crc32c(&[9u8; 4096]);
        let adopted = PassthroughStore::name("", "w", "v", 4096);
        assert!(!s.charge_staged(10240), "no copy to evict");
        assert!(!s.adopt(&adopted, &staged_file, 4096, crc), "no free room");
        s.release_staged(10240);
        assert!(s.adopt(&adopted, &staged_file, 4096, crc));
        assert_eq!(
            contents(s.get(&adopted, 4096).expect("adopted")),
            vec![9u8; 4096]
        );
    }
}
