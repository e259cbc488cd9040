//! The thin `fuser` adapter: translate each request, hand it to the async core on the
//! tokio runtime, reply from the task, map errors to errno once ([`Error::errno`]).
//!
//! - Dispatch: fuser's session reads requests on `MountOptions::threads` threads (each
//!   with its own cloned `/dev/fuse` fd). Each request's future is polled once inline;
//!   if it is not done at once (it waits on the store or the disk) it is spawned onto
//!   the runtime and replies from there, so a slow object never blocks other requests
//!   while a cached block costs no thread hop.
//! - Kernel config at init: readdirplus (so `ls -l` costs no per-entry lookups), the
//!   largest readahead the kernel offers, and FUSE passthrough when the kernel has it and
//!   the core keeps plain copies.
//! - Passthrough bookkeeping (the kernel's rules): all open handles of one inode must be
//!   either passthrough with the same backing file, or not passthrough. So an inode with
//!   normal handles open gets normal opens, and an inode with passthrough handles open
//!   reuses its backing id. Hence no passthrough at all in a mount that can open an
//!   existing object for writing (`allow_overwrite`): a writer opened while a reader holds
//!   a backing would have to share it, and its writes would go into the cached copy
//!   behind the core's back (and its staged file would be uploaded without them).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use futures::FutureExt;
use parking_lot::Mutex;
use tokio::runtime::Handle;

use crate::error::Error;
use crate::filesystem::{Attr, FsCore, Kind};

/// The extended attribute every path of a mount answers with its cache's capacity in
/// bytes (decimal), unlisted (see `getxattr`).
pub const CACHE_BYTES_XATTR: &str = "user.strata.cache_bytes";

/// Converts the core's attributes to fuser's.
pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: match a.kind {
            Kind::Dir => FileType::Directory,
            Kind::File => FileType::RegularFile,
        },
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: a.blksize,
        flags: 0,
    }
}

fn errno(e: &Error, op: &str) -> Errno {
    if e.is_expected() {
        tracing::trace!(op, error = %e, "fuse request failed");
    } else if let Some(left_out) = crate::log_limit::admit() {
        tracing::warn!(op, error = %e, errno = e.errno(), left_out, "fuse request failed");
    }
    Errno::from_i32(e.errno())
}

/// Kernel settings shared by every Strata mount and the null file system, so the
/// benchmark's ceiling is mounted exactly like the real thing.
pub(crate) fn configure_kernel(config: &mut KernelConfig, passthrough: bool) -> bool {
    let caps = config.capabilities();
    let wanted = InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_READDIRPLUS_AUTO
        | InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_SPLICE_WRITE
        | InitFlags::FUSE_SPLICE_MOVE
        // O_TRUNC reaches `open` (else the kernel strips it and truncates by a separate
        // SETATTR): a writable mount replaces an object whole only when asked to.
        | InitFlags::FUSE_ATOMIC_O_TRUNC
        // A handle opened FOPEN_DIRECT_IO (a reader of a file being written) may still
        // be mapped shared (Linux 6.6+); without it MAP_SHARED failed ENODEV, where
        // numpy.memmap, safetensors and mmap(ACCESS_READ) map (black-box finding).
        | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
    let _ = config.add_capabilities(wanted & caps);
    // The largest readahead the kernel allows; requests then carry up to max_pages.
    if let Err(max) = config.set_max_readahead(u32::MAX) {
        let _ = config.set_max_readahead(max);
    }
    let _ = config.set_max_background(64);
    passthrough
        && caps.contains(InitFlags::FUSE_PASSTHROUGH)
        && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        && config.set_max_stack_depth(1).is_ok()
}

#[derive(Default)]
struct InodeOpens {
    normal: u32,
    passthrough: u32,
    backing: Option<Arc<BackingId>>,
}

/// The adapter. See the module doc.
pub struct FuseFs {
    core: Arc<FsCore>,
    rt: Handle,
    want_passthrough: bool,
    passthrough: bool,
    opens: Arc<Mutex<HashMap<u64, InodeOpens>>>,
    /// fh -> (inode, was passthrough).
    handles: Arc<Mutex<HashMap<u64, (u64, bool)>>>,
    /// See [`FuseFs::refusing_own_process`].
    refuse_own_process: bool,
}

impl FuseFs {
    pub fn new(core: Arc<FsCore>, rt: Handle) -> Self {
        let want_passthrough = core.options().passthrough.is_some() && !core.changes_objects();
        FuseFs {
            core,
            rt,
            want_passthrough,
            passthrough: false,
            opens: Default::default(),
            handles: Default::default(),
            refuse_own_process: false,
        }
    }

    /// Answers lookups and listings asked by this process's own threads with ELOOP at
    /// once. A daemon never reads its own mount, but its store may be led into it: a
    /// followed symlink of a file:// store pointing at the mountpoint had the store's
    /// walk re-enter the mount, each level holding a FUSE thread and a blocking thread
    /// until every request hung and the store was taken for dead (black-box finding:
    /// 520 threads, then EIO for every file). `strata demo` and the fs benchmarks read
    /// the mount they serve, and leave this off.
    pub fn refusing_own_process(mut self, refuse: bool) -> Self {
        self.refuse_own_process = refuse;
        self
    }

    /// Whether `req` comes from a thread of this process (and such are refused).
    fn own_request(&self, req: &Request) -> bool {
        self.refuse_own_process && is_own_thread(req.pid())
    }
}

/// Whether thread id `tid` (a FUSE request's pid) is one of this process's threads: a
/// null signal to it within this thread group (one system call per metadata request,
/// no path to format or look up).
pub(crate) fn is_own_thread(tid: u32) -> bool {
    let Ok(tid) = libc::pid_t::try_from(tid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the thread exists in our thread group.
    tid != 0 && unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) } == 0
}

impl FuseFs {
    /// Runs a request's future: polled once inline on the session thread (inside the
    /// runtime's context), so a request the caches answer at once (a memory-tier block,
    /// a cached attribute) is replied without a thread hop; if it must wait (a store
    /// fetch, a disk read), the already-started future moves to the runtime.
    fn dispatch<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let _ctx = self.rt.enter();
        let mut fut = Box::pin(fut);
        if (&mut fut).now_or_never().is_none() {
            self.rt.spawn(fut);
        }
    }
}

impl FuseFs {
    /// FLUSH (`close_by`: the closing thread) and FSYNC (None): uploads what was
    /// written through `fh`; at once for any other handle (no future per close of a
    /// read).
    fn flush_writes(
        &self,
        fh: FileHandle,
        close_by: Option<u32>,
        reply: ReplyEmpty,
        op: &'static str,
    ) {
        if !self.core.is_write_handle(fh.0) {
            return reply.ok();
        }
        let core = self.core.clone();
        let serving = core.flush_guard();
        self.dispatch(async move {
            let done = match close_by {
                Some(pid) => core.close(fh.0, pid).await,
                // FSYNC: durable on the cache disk, uploaded at the close.
                None => core.fsync(fh.0).await,
            };
            match done {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e, op)),
            }
            drop(serving);
        });
    }

    /// The answer to a hard or symbolic link: an object store has none (EPERM, what
    /// Linux file systems without links answer), and a read-only mount takes nothing.
    fn no_links(&self) -> Errno {
        if self.core.writable() {
            Errno::EPERM
        } else {
            Errno::from_i32(libc::EROFS)
        }
    }
}

/// A name the kernel sent for an entry that must exist: object keys are UTF-8, so a
/// name that is not names nothing (ENOENT).
fn existing_name(name: &OsStr) -> Result<String, Error> {
    name.to_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::NotFound(name.to_string_lossy().into_owned()))
}

/// A name the kernel sent for an entry to make: object keys are UTF-8, so a name that
/// is not is refused (EINVAL). A lossy conversion stored every such name under its
/// U+FFFD spelling (black-box finding: `ckpt-\xff.bin` and `ckpt-\xfe.bin` both
/// became `ckpt-\u{fffd}.bin`, the second overwriting the first).
fn new_name(name: &OsStr) -> Result<String, Error> {
    name.to_str().map(str::to_owned).ok_or_else(|| {
        Error::Invalid(format!(
            "{:?} is not UTF-8; object keys are",
            name.to_string_lossy()
        ))
    })
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.passthrough = configure_kernel(config, self.want_passthrough);
        tracing::info!(passthrough = self.passthrough, "fuse session initialised");
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if self.own_request(req) {
            return reply.error(fuser::Errno::from_i32(libc::ELOOP));
        }
        let name = match existing_name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(errno(&e, "lookup")),
        };
        let core = self.core.clone();
        self.dispatch(async move {
            match core.lookup(parent.0, &name).await {
                Ok(e) => reply.entry(&e.ttl, &file_attr(&e.attr), Generation(e.generation)),
                Err(e) => reply.error(errno(&e, "lookup")),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        if self.own_request(req) {
            return reply.error(fuser::Errno::from_i32(libc::ELOOP));
        }
        // An fstat of a file being written: by its handle (it may have no path).
        if let Some(e) = fh.and_then(|f| self.core.staged_attr(ino.0, f.0)) {
            return reply.attr(&e.ttl, &file_attr(&e.attr));
        }
        let core = self.core.clone();
        self.dispatch(async move {
            match core.getattr(ino.0).await {
                Ok(e) => reply.attr(&e.ttl, &file_attr(&e.attr)),
                Err(e) => reply.error(errno(&e, "getattr")),
            }
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let core = self.core.clone();
        let pid = req.pid();
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY
            || flags.0 & (libc::O_TRUNC | libc::O_APPEND) != 0;
        // O_TRUNC|O_APPEND (Go's log-file idiom) truncates, then appends to the empty
        // file; the kernel set its size to 0 at the open (FUSE_ATOMIC_O_TRUNC).
        let truncate = flags.0 & libc::O_TRUNC != 0;
        // An O_DIRECT open starts no passthrough: the kernel would send its reads to the
        // cached copy under that file system's alignment rules, so an unaligned read that
        // worked cold failed EINVAL once the copy existed (black-box finding). Counted as
        // a normal open, it keeps later opens normal while it is open; one made while
        // passthrough handles are open must share their backing (kernel rule).
        let direct = flags.0 & libc::O_DIRECT != 0;
        let passthrough = self.passthrough;
        let opens = self.opens.clone();
        let handles = self.handles.clone();
        self.dispatch(async move {
            let opened = if write && core.writable() {
                core.open_write(ino.0, truncate, pid).await
            } else {
                core.open(ino.0, write).await
            };
            let opened = match opened {
                Ok(o) => o,
                Err(e) => return reply.error(errno(&e, "open")),
            };
            let mut fl = FopenFlags::empty();
            if opened.keep_cache {
                fl |= FopenFlags::FOPEN_KEEP_CACHE;
            }
            if opened.direct_io {
                fl |= FopenFlags::FOPEN_DIRECT_IO;
            }
            let mut map = opens.lock();
            let st = map.entry(ino.0).or_default();
            // Passthrough only if no normal handle of this inode is open (kernel rule),
            // and never for a writer (its writes must reach the core).
            let backing = match (&opened.passthrough, passthrough, st.normal) {
                _ if write => None,
                (Some(file), true, 0) if !direct => match &st.backing {
                    Some(b) if st.passthrough > 0 => Some(b.clone()),
                    _ => match reply.open_backing(file) {
                        Ok(b) => {
                            let b = Arc::new(b);
                            st.backing = Some(b.clone());
                            Some(b)
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "passthrough backing open failed; normal read");
                            None
                        }
                    },
                },
                _ if st.passthrough > 0 => st.backing.clone(),
                _ => None,
            };
            match backing {
                Some(b) => {
                    st.passthrough += 1;
                    handles.lock().insert(opened.fh, (ino.0, true));
                    drop(map);
                    // The kernel accepts only FOPEN_PASSTHROUGH_MASK flags with
                    // passthrough (KEEP_CACHE would fail the open with EIO); the page
                    // cache is the backing file's anyway.
                    reply.opened_passthrough(FileHandle(opened.fh), FopenFlags::empty(), &b);
                }
                None => {
                    st.normal += 1;
                    handles.lock().insert(opened.fh, (ino.0, false));
                    drop(map);
                    reply.opened(FileHandle(opened.fh), fl);
                }
            }
        });
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let core = self.core.clone();
        let pid = req.pid();
        self.dispatch(async move {
            match core.read(fh.0, offset, size, pid).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(&e, "read")),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let writing = self.core.is_write_handle(fh.0);
        if !writing {
            self.core.release(fh.0);
        }
        // Bind first: a guard in an `if let` scrutinee would live through the block and
        // take `handles` before `opens`, the reverse of `open`'s order (a deadlock).
        let removed = self.handles.lock().remove(&fh.0);
        if let Some((ino, pt)) = removed {
            let mut map = self.opens.lock();
            if let Some(st) = map.get_mut(&ino) {
                if pt {
                    st.passthrough = st.passthrough.saturating_sub(1);
                } else {
                    st.normal = st.normal.saturating_sub(1);
                }
                if st.passthrough == 0 && st.normal == 0 {
                    map.remove(&ino);
                }
            }
        }
        if writing {
            // Uploads what no flush did and drops (or keeps as a copy) the staging
            // file; the kernel does not wait on a release's errors. An unmount waits for
            // it as for a flush (black-box finding, round 23: the last close after a
            // `umount -l` ended the session, and the daemon exited before the release
            // removed the uploaded file's staging copy, which the next start then
            // removed as "never uploaded").
            let core = self.core.clone();
            let serving = core.flush_guard();
            self.dispatch(async move {
                core.release_write(fh.0).await;
                reply.ok();
                drop(serving);
            });
            return;
        }
        reply.ok();
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Every close: a file written through this handle is uploaded now, so the
        // close returns the upload's error. A read handle has nothing to flush.
        self.flush_writes(fh, Some(req.pid()), reply, "flush");
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.flush_writes(fh, None, reply, "fsync");
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.own_request(req) {
            return reply.error(fuser::Errno::from_i32(libc::ELOOP));
        }
        let core = self.core.clone();
        self.dispatch(async move {
            match core.opendir(ino.0).await {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(errno(&e, "opendir")),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let core = self.core.clone();
        self.dispatch(async move {
            // The kernel's reply buffer is a page: ~100 entries of typical names, 128
            // of the shortest. Each entry is made (its inode numbered) when asked
            // for, so ask for what fits, not thousands.
            match core.readdir(fh.0, offset, 256).await {
                Ok(entries) => {
                    for e in entries {
                        let kind = match e.entry.attr.kind {
                            Kind::Dir => FileType::Directory,
                            Kind::File => FileType::RegularFile,
                        };
                        if reply.add(INodeNo(e.entry.attr.ino), e.offset, kind, &e.name) {
                            break;
                        }
                    }
                    reply.ok();
                }
                Err(e) => reply.error(errno(&e, "readdir")),
            }
        });
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let core = self.core.clone();
        self.dispatch(async move {
            // Each entry is resolved and referenced before it is known to fit: ask for
            // a few times what a page-sized reply holds (~25), not thousands.
            match core.readdir_plus(fh.0, offset, 256).await {
                Ok(entries) => {
                    let mut entries = entries.into_iter();
                    for e in entries.by_ref() {
                        let attr = file_attr(&e.entry.attr);
                        if reply.add(
                            INodeNo(e.entry.attr.ino),
                            e.offset,
                            &e.name,
                            &e.entry.ttl,
                            &attr,
                            Generation(e.entry.generation),
                        ) {
                            core.not_handed_out(&e);
                            break;
                        }
                    }
                    // The core counted a reference for each entry; the kernel takes
                    // one for those in the reply only.
                    for e in entries {
                        core.not_handed_out(&e);
                    }
                    reply.ok();
                }
                Err(e) => reply.error(errno(&e, "readdirplus")),
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.core.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.core.statfs();
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
        );
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        // Objects carry no extended attributes (security.selinux, capabilities...).
        // One is answered on every path and listed on none (so `cp -a` copies
        // nothing): the bytes the mount's cache may hold, for `strata warmup` to warn
        // when it warms more than that.
        if name.as_encoded_bytes() != CACHE_BYTES_XATTR.as_bytes() {
            reply.error(Errno::from_i32(libc::ENODATA));
            return;
        }
        let value = self.core.reader().engine().capacity_bytes().to_string();
        if size == 0 {
            reply.size(value.len() as u32);
        } else if (size as usize) < value.len() {
            reply.error(Errno::from_i32(libc::ERANGE));
        } else {
            reply.data(value.as_bytes());
        }
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    // ---- requests the mount answers without the core. fuser's defaults log a warning
    // per call: an ioctl comes with every Python open() (isatty asks TCGETS), and a
    // data loader's opens grew the mount's log without bound (black-box finding:
    // ~190 bytes per open).

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // Not a terminal, and no file-system ioctls: what a regular file of a local
        // file system without them answers.
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // Objects carry no extended attributes: `cp -a` and `rsync -X` take ENOTSUP
        // as "this file system has none" and go on.
        reply.error(Errno::from_i32(libc::ENOTSUP));
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::from_i32(libc::ENOTSUP));
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(self.no_links());
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(self.no_links());
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Files are made durable by their own close or fsync, and renames and
        // removals reach the store before they return: nothing is left to sync here.
        // (ENOSYS would mean the same to the kernel, at the cost of a logged warning.)
        reply.ok();
    }

    // ---- writes: refused with EROFS on a read-only mount (also mounted `ro`, so the
    // VFS refuses first); a writable one stages new objects (`FsCore::create`).

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // A local pwrite into the staging file, on this session thread (inside the
        // runtime's context: a file written in order may start its streamed upload).
        // Past the disk budget, a write that outran its file's upload waits for it
        // first, off this thread.
        let _ctx = self.rt.enter();
        if let Some(wait) = self.core.write_wait(fh.0, offset + data.len() as u64) {
            let (core, data) = (self.core.clone(), data.to_vec());
            self.dispatch(async move {
                wait.await;
                let written =
                    tokio::task::spawn_blocking(move || core.write(fh.0, offset, &data)).await;
                match written {
                    Ok(Ok(n)) => reply.written(n),
                    Ok(Err(e)) => reply.error(errno(&e, "write")),
                    Err(_) => reply.error(Errno::from_i32(libc::EIO)),
                }
            });
            return;
        }
        match self.core.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e, "write")),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let core = self.core.clone();
        self.dispatch(async move {
            match core.setattr(ino.0, size, fh.map(|f| f.0)).await {
                Ok(e) => reply.attr(&e.ttl, &file_attr(&e.attr)),
                Err(e) => reply.error(errno(&e, "setattr")),
            }
        });
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let e = if self.core.writable() {
            Error::Unsupported("device and special files".into())
        } else {
            Error::ReadOnly
        };
        reply.error(errno(&e, "mknod"));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let name = match new_name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(errno(&e, "mkdir")),
        };
        let core = self.core.clone();
        self.dispatch(async move {
            match core.mkdir(parent.0, &name).await {
                Ok(e) => reply.entry(&e.ttl, &file_attr(&e.attr), Generation(e.generation)),
                Err(e) => reply.error(errno(&e, "mkdir")),
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match existing_name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(errno(&e, "unlink")),
        };
        let core = self.core.clone();
        self.dispatch(async move {
            match core.unlink(parent.0, &name).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e, "unlink")),
            }
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match existing_name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(errno(&e, "rmdir")),
        };
        let core = self.core.clone();
        self.dispatch(async move {
            match core.rmdir(parent.0, &name).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e, "rmdir")),
            }
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            let e = Error::Unsupported("rename exchange or whiteout".into());
            return reply.error(errno(&e, "rename"));
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let (name, newname) = match (existing_name(name), new_name(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(errno(&e, "rename")),
        };
        let core = self.core.clone();
        self.dispatch(async move {
            match core
                .rename(parent.0, &name, newparent.0, &newname, noreplace)
                .await
            {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e, "rename")),
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = match new_name(name) {
            Ok(n) => n,
            Err(e) => return reply.error(errno(&e, "create")),
        };
        let core = self.core.clone();
        let pid = req.pid();
        let handles = self.handles.clone();
        let opens = self.opens.clone();
        self.dispatch(async move {
            match core.create_with(parent.0, &name, pid, flags).await {
                Ok((e, fh)) => {
                    // Counted as a normal open of its inode (no passthrough for it).
                    opens.lock().entry(e.attr.ino).or_default().normal += 1;
                    handles.lock().insert(fh, (e.attr.ino, false));
                    reply.created(
                        &e.ttl,
                        &file_attr(&e.attr),
                        Generation(e.generation),
                        FileHandle(fh),
                        FopenFlags::empty(),
                    )
                }
                Err(e) => reply.error(errno(&e, "create")),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::is_own_thread;

    #[test]
    fn a_thread_of_this_process_is_its_own_and_init_is_not() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        assert!(is_own_thread(me));
        let other = std::thread::spawn(|| unsafe { libc::gettid() } as u32);
        let tid = other.join().expect("join");
        assert!(
            !is_own_thread(tid) || tid == me,
            "an ended thread is no longer ours"
        );
        assert!(!is_own_thread(1), "init");
        assert!(!is_own_thread(0), "unknown caller");
    }
}
