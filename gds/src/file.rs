//! File reads for the compat path: `O_DIRECT` positional reads into aligned staging
//! buffers, bypassing the page cache the way cuFile's compat mode and kvikio do (the
//! data is headed for the device; caching it in host RAM as well would double its
//! footprint and cost an extra copy).
//!
//! `O_DIRECT` needs the buffer address, file offset and length aligned to the logical
//! block size; callers read aligned windows and trim. Where the file system refuses
//! `O_DIRECT` (tmpfs, some FUSE and network file systems) the file is reopened buffered
//! and reports an alignment of 1, so the same pipeline runs either way.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::device::{AlignedBuf, PinnedMemory, STAGING_ALIGN};

/// A source of positional reads (a file, or a test double injecting faults).
pub trait ReadAt: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; 0 means end of file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Offsets, lengths and buffer addresses must be multiples of this (1: anything).
    fn alignment(&self) -> usize;
}

/// A file opened for reading, with `O_DIRECT` when the file system allows it.
#[derive(Debug)]
pub struct DirectFile {
    file: File,
    direct: bool,
    len: u64,
}

impl DirectFile {
    /// Opens `path` with `O_DIRECT`, falling back to buffered reads if the file system
    /// refuses it (checked by a probe read, since some refuse only at read time).
    pub fn open(path: &Path) -> io::Result<Self> {
        match Self::open_direct(path) {
            Ok(f) => Ok(f),
            Err(_) => Self::open_buffered(path),
        }
    }

    /// Opens without `O_DIRECT` (page-cache reads).
    pub fn open_buffered(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(DirectFile {
            file,
            direct: false,
            len,
        })
    }

    /// Opens with `O_DIRECT` or fails.
    pub fn open_direct(path: &Path) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        let len = file.metadata()?.len();
        if len > 0 {
            let mut probe = AlignedBuf::zeroed(STAGING_ALIGN).map_err(io::Error::other)?;
            file.read_at(probe.as_mut_slice(), 0)?;
        }
        Ok(DirectFile {
            file,
            direct: true,
            len,
        })
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn file(&self) -> &File {
        &self.file
    }
}

impl ReadAt for DirectFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        loop {
            match self.file.read_at(buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
    fn alignment(&self) -> usize {
        if self.direct {
            STAGING_ALIGN
        } else {
            1
        }
    }
}
