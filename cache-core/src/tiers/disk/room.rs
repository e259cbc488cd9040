//! Room for the index to open (crash finding: with the cache dir's filesystem full,
//! every start aborted inside RocksDB, `Assertion 'sync_without_flush_called_'
//! failed`, SIGABRT: a crash loop under a restart policy, whether the tier's own
//! blocks or another program had filled the disk).
//!
//! Opening the index writes a new log, manifest and a preallocated write-ahead log,
//! and the library aborts rather than fails when that cannot be written. So before
//! opening it, the tier makes [`OPEN_ROOM`] free on its filesystem by deleting its own
//! block files, oldest first: they are a cache (recovery drops the index entries whose
//! files are gone). If its blocks cannot free that much, the open fails with a clear
//! error instead of an abort.

use std::path::{Path, PathBuf};

use crate::error::{CacheError, Result};

/// Free bytes the index needs to open: its preallocated write-ahead log (1.1 x the
/// 4 MiB write buffer), a manifest, options and log files, with room to spare.
pub const OPEN_ROOM: u64 = 8 << 20;

/// `statvfs(2)` of the filesystem of `dir`.
pub fn statvfs(dir: &Path) -> std::io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `st` has room for the result.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// Bytes available to an unprivileged writer on the filesystem of `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    Ok(bytes_free(&statvfs(dir)?))
}

/// What a filesystem of no stated size (ramfs reports 0 blocks: no limit) has free:
/// more than any budget, with room left to add to it. Read as 0 bytes free, a cache
/// dir on ramfs was refused as "cache full" (black-box finding).
pub const UNSTATED_ROOM: u64 = 1 << 62;

/// The bytes `st` says an unprivileged writer has free.
fn bytes_free(st: &libc::statvfs) -> u64 {
    if st.f_blocks == 0 {
        return UNSTATED_ROOM;
    }
    st.f_bavail.saturating_mul(st.f_frsize)
}

/// Block files deleted between measures of the room at open: the inodes it takes to
/// open the index are a few.
const INODE_STEP: u64 = 16;

/// Free inodes below which a filesystem counts as full: opening the index makes a few
/// files (log, manifest, options), a write one. (64 refused a start that worked on a
/// tmpfs of 300 inodes with 39 free: black-box finding.)
const MIN_FREE_INODES: u64 = 8;

/// [`free_bytes`], but 0 when the filesystem has (almost) no inode left: no new file fits
/// however many bytes are free (black-box finding: a cache disk out of inodes took one
/// KV put per 30 s for good, its budget raised back to the free bytes after each).
/// Filesystems without an inode table report 0 files and are judged by bytes.
pub fn free_room(dir: &Path) -> std::io::Result<u64> {
    Ok(room_of(&statvfs(dir)?))
}

/// The bytes new files may take on a filesystem that `statvfs` says `st` of:
/// [`free_room`]'s rule.
pub fn room_of(st: &libc::statvfs) -> u64 {
    if st.f_files > 0 && st.f_favail < MIN_FREE_INODES {
        return 0;
    }
    bytes_free(st)
}

/// Makes [`OPEN_ROOM`] free on `dir`'s filesystem by deleting block files under
/// `data_dir`, oldest first. Returns the number deleted.
pub fn make_room_to_open(dir: &Path, data_dir: &Path) -> Result<u64> {
    let free = free_room(dir)?;
    if free >= OPEN_ROOM {
        return Ok(0);
    }
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
    for fan in std::fs::read_dir(data_dir)?.flatten() {
        let Ok(inner) = std::fs::read_dir(fan.path()) else {
            continue;
        };
        for f in inner.flatten() {
            let is_block = f.file_name().to_string_lossy().ends_with(".blk");
            if let Ok(m) = f.metadata() {
                if is_block && m.is_file() {
                    let at = m.modified().unwrap_or(std::time::UNIX_EPOCH);
                    files.push((at, m.len(), f.path()));
                }
            }
        }
    }
    files.sort();
    // What a deletion gives back is measured, not summed from file lengths: a
    // filesystem filled by root first refills its reserved blocks (5% on ext4), so
    // 7.7 MB of deleted blocks once raised the free space by 5.8 MB and the start was
    // refused (crash finding); block files may also take more or less than their length.
    let (mut free, mut deleted, mut gained, mut total) = (free, 0u64, 0u64, 0u64);
    for (_, len, path) in files {
        // Measured again by bytes, and every few files: out of inodes, it is the
        // files deleted that make room, not their bytes.
        if free + gained >= OPEN_ROOM || (deleted > 0 && deleted % INODE_STEP == 0) {
            free = free_room(dir)?;
            gained = 0;
            if free >= OPEN_ROOM {
                break;
            }
        }
        if std::fs::remove_file(&path).is_ok() {
            deleted += 1;
            gained += len;
            total += len;
        }
    }
    let free = free_room(dir)?;
    if free < OPEN_ROOM {
        let st = statvfs(dir)?;
        return Err(CacheError::Full(format!(
            "the filesystem of {} has {} KiB free and {} inodes free and the disk cache index \
             needs {} KiB and {MIN_FREE_INODES} inodes to open; deleting {deleted} cached blocks did not free enough: free space there, \
             or start without the disk tier (`strata serve --disk 0`, `strata mount \
             --disk-cache 0`, read-only mounts only; a writable mount stages files there)",
            dir.display(),
            st.f_bavail.saturating_mul(st.f_frsize) >> 10,
            st.f_favail,
            OPEN_ROOM >> 10
        )));
    }
    tracing::warn!(dir = %dir.display(), deleted, freed_kib = total >> 10,
        "the cache dir's filesystem was full; deleted the oldest cached blocks so the index can open");
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Black-box finding: ramfs states no size (0 blocks, 0 free) and a cache dir on
    /// it was refused as full. No stated size is no limit; a stated 0 free is full.
    #[test]
    fn a_filesystem_of_no_stated_size_has_room() {
        // SAFETY: statvfs is plain data; all zeros is a valid value.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(room_of(&st), UNSTATED_ROOM);
        st.f_blocks = 1000;
        st.f_frsize = 4096;
        assert_eq!(room_of(&st), 0, "a stated size with nothing free is full");
        st.f_bavail = 10;
        assert_eq!(room_of(&st), 40960);
    }

    #[test]
    fn a_filesystem_with_room_loses_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("00")).expect("mkdir");
        std::fs::write(data.join("00/1.blk"), b"block").expect("write");
        if free_bytes(dir.path()).expect("statvfs") >= OPEN_ROOM {
            assert_eq!(make_room_to_open(dir.path(), &data).expect("room"), 0);
            assert!(data.join("00/1.blk").exists());
        }
    }

    /// Black-box finding (round 14): a cache disk out of inodes with bytes free. No new
    /// file fits, so there is no room; a filesystem without an inode table (0 files)
    /// is judged by its bytes.
    #[test]
    fn no_inode_left_is_no_room() {
        // SAFETY: statvfs is plain data; all-zero is a valid value.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        st.f_frsize = 4096;
        st.f_blocks = 2000;
        st.f_bavail = 1000;
        st.f_files = 450;
        st.f_favail = 0;
        assert_eq!(room_of(&st), 0);
        st.f_favail = 3;
        assert_eq!(room_of(&st), 0, "too few to open the index");
        st.f_favail = 39;
        assert_eq!(
            room_of(&st),
            4096 * 1000,
            "enough for the index and a write"
        );
        st.f_files = 0;
        st.f_favail = 0;
        assert_eq!(room_of(&st), 4096 * 1000, "no inode table");
    }
}
