//! A do-nothing file system: a flat directory of files of given sizes whose bytes are
//! all zero, replied inline on the session threads. Mounted with exactly Strata's mount
//! options and kernel settings ([`crate::mount::mount_fs`]), it is the FUSE ceiling the
//! benchmark measures the real mount against.
//!
//! Its replies come from the first bytes of one zero buffer, which stay in the CPU's
//! caches: a ceiling no file system serving real bytes reaches, since the kernel's
//! copy of each reply then reads memory. [`NullFs::with_spread`] adds the same fs
//! replying from a large buffer of distinct bytes at the read's offset (switched on
//! and off at run time): the ceiling with that memory traffic, to tell it apart from
//! the file system's own cost per request.

use std::ffi::OsStr;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry,
    ReplyOpen, Request,
};

use crate::fuse::configure_kernel;

/// See the module doc. File `i` has inode `i + 2`.
pub struct NullFs {
    files: Vec<(String, u64)>,
    served: std::sync::Arc<std::sync::atomic::AtomicU64>,
    zeros: Vec<u8>,
    /// See [`NullFs::with_spread`]; empty when not asked for.
    spread: Vec<u8>,
    spread_on: std::sync::Arc<std::sync::atomic::AtomicBool>,
    now: SystemTime,
}

const TTL: Duration = Duration::from_secs(3600);

impl NullFs {
    pub fn new(files: Vec<(String, u64)>) -> Self {
        NullFs {
            files,
            served: Default::default(),
            zeros: vec![0; 16 << 20],
            spread: Vec::new(),
            spread_on: Default::default(),
            now: SystemTime::now(),
        }
    }

    /// Also holds `bytes` (at least 16 MiB) of distinct non-zero bytes; while the switch
    /// returned by [`Self::spread_switch`] is on, a read at `offset` is answered from
    /// them at `offset` modulo their length (written, so every page is backed by its
    /// own memory, not the shared zero page).
    pub fn with_spread(mut self, bytes: usize) -> Self {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut spread = vec![0u8; bytes.max(self.zeros.len()).div_ceil(8) * 8];
        for word in spread.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&(x | 1).to_le_bytes());
        }
        self.spread = spread;
        self
    }

    /// The switch between zero replies (off, the default) and spread ones.
    pub fn spread_switch(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        self.spread_on.clone()
    }

    /// Bytes replied to reads so far (shared; survives moving the fs into a session).
    pub fn served(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.served.clone()
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm) = if ino == 1 {
            (FileType::Directory, 0, 0o555)
        } else {
            let (_, size) = self.files.get((ino as usize).checked_sub(2)?)?;
            (FileType::RegularFile, *size, 0o444)
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.now,
            mtime: self.now,
            ctime: self.now,
            crtime: self.now,
            kind,
            perm,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        })
    }
}

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        configure_kernel(config, false);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = (parent.0 == 1)
            .then(|| self.files.iter().position(|(n, _)| OsStr::new(n) == name))
            .flatten()
            .and_then(|i| self.attr(i as u64 + 2));
        match found {
            Some(a) => reply.entry(&TTL, &a, Generation(1)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(a) = self.attr(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let n = a.size.saturating_sub(offset).min(size as u64) as usize;
        self.served
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        if !self.spread.is_empty() && self.spread_on.load(std::sync::atomic::Ordering::Relaxed) {
            let n = n.min(self.zeros.len());
            let at = (offset as usize) % (self.spread.len() - n + 1);
            return reply.data(&self.spread[at..at + n]);
        }
        reply.data(&self.zeros[..n.min(self.zeros.len())]);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != 1 {
            return reply.error(Errno::ENOTDIR);
        }
        for (i, (name, _)) in self.files.iter().enumerate().skip(offset as usize) {
            if reply.add(
                INodeNo(i as u64 + 2),
                i as u64 + 1,
                FileType::RegularFile,
                name,
            ) {
                break;
            }
        }
        reply.ok();
    }
}
