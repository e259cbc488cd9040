//! A do-nothing file system: a flat directory of files of given sizes whose bytes are
//! all zero, replied inline on the session threads. Mounted with exactly Strata's mount
//! options and kernel settings ([`crate::mount::mount_fs`]), it is the FUSE ceiling the
//! benchmark measures the real mount against.

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
    now: SystemTime,
}

const TTL: Duration = Duration::from_secs(3600);

impl NullFs {
    pub fn new(files: Vec<(String, u64)>) -> Self {
        NullFs {
            files,
            served: Default::default(),
            zeros: vec![0; 16 << 20],
            now: SystemTime::now(),
        }
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
