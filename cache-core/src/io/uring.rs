//! The io_uring engine: one thread owns the ring.
//!
//! Callers send a request (the file, the offset and the owned buffer) through a
//! channel, then write to an eventfd that the ring thread always has a read pending on,
//! so the thread wakes from `io_uring_enter` for new work as well as for completions.
//! The thread keeps each in-flight request (and with it the buffer and the file) in a
//! slab until its completion is reaped, then sends the result and the buffer back
//! through a oneshot. This ownership is what makes the unsafe `push` calls sound: the
//! kernel only ever sees addresses of memory the ring thread owns and keeps alive.
//!
//! Defaults: 256 submission entries (enough to keep an NVMe queue busy; the engine
//! never has more than that many requests in flight, so the 512-entry completion queue
//! cannot overflow). A dropped caller future does not cancel its request: the thread
//! still owns the buffer and drops it after the completion. When the engine is dropped
//! the thread drains every in-flight request before it exits, for the same reason.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::sync::Arc;

use async_trait::async_trait;
use io_uring::{opcode, types, IoUring};
use tokio::sync::oneshot;

use super::{align_up, iovecs, parts_len, AlignedBuf, IoEngine, WritePart};
use crate::checksum::{crc32c, Crc32c};

/// Submission-queue entries; see the module doc.
const RING_ENTRIES: u32 = 256;
/// `user_data` of the eventfd read; requests use slab ids below it.
const WAKE_TOKEN: u64 = u64::MAX;
/// One request's largest transfer: the kernel caps a single read/write near 2 GiB.
const MAX_TRANSFER: usize = 1 << 30;
/// A checksummed read goes as parts of at least this size, submitted together, the
/// ring thread checksumming each as it arrives in order: 128 KiB, so a 1 MiB value
/// leaves 1/8 of its checksum after the last byte arrives on a device that completes
/// parts in order (NVMe, where the block layer splits at its smaller request limit).
/// On virtio-blk the block layer merges adjacent parts up to 254 pages and the host
/// may signal completions in batches, so there a 1 MiB hit overlaps less (see
/// docs/BENCHMARKS.md, "Disk tier and warm FUSE path, issue 14"; 512 KiB parts were
/// measured too and were not better there).
const MIN_PART: usize = 128 << 10;
/// At most this many parts per read (larger values get larger parts): 16, a bound on
/// the ring entries one request takes.
const MAX_PARTS: usize = 16;

enum OpKind {
    Read,
    /// A read in parts with the crc32c of `Request::crc` computed as they arrive.
    ReadCrc,
    Write,
    /// A vectored write of `Request::wparts` from byte `pos` of their concatenation.
    WriteV,
    Fsync,
}

/// The state of a [`OpKind::ReadCrc`] in flight.
struct Parts {
    /// Each part's `(pos, len)` in the buffer, and its result once completed.
    spans: Vec<(usize, usize)>,
    results: Vec<Option<i32>>,
    remaining: usize,
    /// Parts checksummed so far (in order, while every earlier part was full).
    next: usize,
    /// Every part before `next` came back full.
    full_prefix: bool,
    crc: Crc32c,
    /// How far (a buffer position) the checksum has got.
    crc_pos: usize,
}

struct Request {
    kind: OpKind,
    file: Arc<File>,
    /// Position in the file of `buf[pos..]`.
    offset: u64,
    buf: Option<AlignedBuf>,
    pos: usize,
    /// Bytes to transfer from `pos`.
    len: usize,
    /// [`OpKind::ReadCrc`]: the buffer range to checksum.
    crc: std::ops::Range<usize>,
    parts: Option<Parts>,
    /// [`OpKind::WriteV`]: what is written (owned here until the completion).
    wparts: Vec<WritePart>,
    reply: oneshot::Sender<Reply>,
}

struct Reply {
    result: io::Result<usize>,
    buf: Option<AlignedBuf>,
    /// [`OpKind::ReadCrc`]: the checksum, when the read covered the whole range.
    crc: Option<u32>,
    /// [`OpKind::WriteV`]: the parts, handed back for a resumed short write.
    wparts: Vec<WritePart>,
}

enum Msg {
    /// Boxed: a request (with its checksum state) is ~500 bytes, `Shutdown` none.
    Op(Box<Request>),
    Shutdown,
}

#[derive(Debug)]
pub struct UringEngine {
    tx: mpsc::Sender<Msg>,
    wake: File,
}

impl UringEngine {
    /// Sets up a ring, checks it with one no-op round trip, and starts its thread.
    pub fn new() -> io::Result<Self> {
        let mut ring: IoUring = IoUring::builder().build(RING_ENTRIES)?;
        probe_nop(&mut ring)?;
        // SAFETY: eventfd(2) takes no pointers; a non-negative return is a new fd that
        // nothing else owns, so handing it to OwnedFd is the only ownership of it.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: see above: `raw` is a fresh, valid, unowned descriptor.
        let wake_fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let wake = File::from(wake_fd.try_clone()?);
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("strata-uring".to_string())
            .spawn(move || RingThread::new(ring, rx, wake_fd).run())?;
        Ok(UringEngine { tx, wake })
    }

    async fn submit(
        &self,
        kind: OpKind,
        file: Arc<File>,
        offset: u64,
        buf: Option<AlignedBuf>,
        pos: usize,
        len: usize,
    ) -> io::Result<Reply> {
        self.submit_with_crc(kind, file, offset, buf, pos, len, 0..0)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn submit_with_crc(
        &self,
        kind: OpKind,
        file: Arc<File>,
        offset: u64,
        buf: Option<AlignedBuf>,
        pos: usize,
        len: usize,
        crc: std::ops::Range<usize>,
    ) -> io::Result<Reply> {
        let (reply, rx) = oneshot::channel();
        let req = Request {
            kind,
            file,
            offset,
            buf,
            pos,
            len,
            crc,
            parts: None,
            wparts: Vec::new(),
            reply,
        };
        self.send(req, rx).await
    }

    /// Hands `req` to the ring thread and waits for its reply (`rx`, the receiving end
    /// of `req.reply`).
    async fn send(&self, req: Request, rx: oneshot::Receiver<Reply>) -> io::Result<Reply> {
        self.tx
            .send(Msg::Op(Box::new(req)))
            .map_err(|_| io::Error::other("io_uring thread has stopped"))?;
        (&self.wake).write_all(&1u64.to_ne_bytes())?;
        rx.await
            .map_err(|_| io::Error::other("io_uring thread dropped a request"))
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // The thread drains in-flight requests, then exits; nothing to wait for here.
        let _ = self.tx.send(Msg::Shutdown);
        let _ = (&self.wake).write_all(&1u64.to_ne_bytes());
    }
}

fn probe_nop(ring: &mut IoUring) -> io::Result<()> {
    let nop = opcode::Nop::new().build().user_data(0);
    // SAFETY: a no-op references no memory.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| io::Error::other("io_uring submission queue full at set-up"))?;
    ring.submit_and_wait(1)?;
    let cqe = ring
        .completion()
        .next()
        .ok_or_else(|| io::Error::other("io_uring no-op did not complete"))?;
    if cqe.result() < 0 {
        return Err(io::Error::from_raw_os_error(-cqe.result()));
    }
    Ok(())
}

#[async_trait]
impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    async fn read_at(
        &self,
        file: Arc<File>,
        offset: u64,
        mut buf: AlignedBuf,
    ) -> io::Result<AlignedBuf> {
        let len = buf.len();
        let mut filled = 0usize;
        while filled < len {
            // Whole aligned units (O_DIRECT), never past the buffer.
            let ask = align_up(len - filled)
                .min(buf.capacity() - filled)
                .min(MAX_TRANSFER);
            let reply = self
                .submit(OpKind::Read, file.clone(), offset, Some(buf), filled, ask)
                .await?;
            buf = reply
                .buf
                .ok_or_else(|| io::Error::other("io_uring read lost its buffer"))?;
            let n = reply.result?;
            if n == 0 {
                break;
            }
            filled += n.min(len - filled);
            if !super::is_aligned(n) {
                break; // short, unaligned: end of file
            }
        }
        buf.set_len(filled);
        Ok(buf)
    }

    async fn read_at_crc(
        &self,
        file: Arc<File>,
        offset: u64,
        buf: AlignedBuf,
        crc: std::ops::Range<usize>,
    ) -> io::Result<(AlignedBuf, Option<u32>)> {
        let len = buf.len();
        if len <= MIN_PART || crc.start > crc.end || crc.end > len || len > MAX_TRANSFER {
            // One part (nothing to overlap), or more than one transfer: read, then
            // checksum.
            let buf = self.read_at(file, offset, buf).await?;
            let sum = buf.get(crc).map(crc32c);
            return Ok((buf, sum));
        }
        let ask = align_up(len).min(buf.capacity());
        let reply = self
            .submit_with_crc(
                OpKind::ReadCrc,
                file.clone(),
                offset,
                Some(buf),
                0,
                ask,
                crc.clone(),
            )
            .await?;
        let mut buf = reply
            .buf
            .ok_or_else(|| io::Error::other("io_uring read lost its buffer"))?;
        let n = reply.result?;
        if n < len {
            // Short: the end of the file, or a partial transfer the parts do not
            // resume. The plain read resumes partial transfers; its answer stands.
            buf.set_len(len);
            let buf = self.read_at(file, offset, buf).await?;
            let sum = buf.get(crc).map(crc32c);
            return Ok((buf, sum));
        }
        buf.set_len(len);
        Ok((buf, reply.crc))
    }

    async fn write_at(&self, file: Arc<File>, offset: u64, buf: AlignedBuf) -> io::Result<()> {
        let total = buf.capacity();
        let mut buf = Some(buf);
        let mut done = 0usize;
        while done < total {
            let ask = (total - done).min(MAX_TRANSFER);
            let reply = self
                .submit(OpKind::Write, file.clone(), offset, buf.take(), done, ask)
                .await?;
            buf = reply.buf;
            match reply.result? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => done += n,
            }
        }
        Ok(())
    }

    async fn write_parts_at(
        &self,
        file: Arc<File>,
        offset: u64,
        parts: Vec<WritePart>,
    ) -> io::Result<()> {
        let total = parts_len(&parts);
        let mut parts = parts;
        let mut done = 0usize;
        while done < total {
            let (reply, rx) = oneshot::channel();
            let req = Request {
                kind: OpKind::WriteV,
                file: file.clone(),
                offset,
                buf: None,
                pos: done,
                len: total - done,
                crc: 0..0,
                parts: None,
                wparts: parts,
                reply,
            };
            let reply = self.send(req, rx).await?;
            parts = reply.wparts;
            match reply.result? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => done += n,
            }
        }
        Ok(())
    }

    async fn sync_data(&self, file: Arc<File>) -> io::Result<()> {
        self.submit(OpKind::Fsync, file, 0, None, 0, 0)
            .await?
            .result
            .map(|_| ())
    }
}

struct RingThread {
    ring: IoUring,
    rx: mpsc::Receiver<Msg>,
    wake_fd: OwnedFd,
    /// The eventfd read's 8-byte target; boxed so its address is stable.
    wake_buf: Box<[u8; 8]>,
    wake_armed: bool,
    inflight: HashMap<u64, Request>,
    /// Ring entry id of each part of a [`OpKind::ReadCrc`] -> (its request's id, part).
    part_of: HashMap<u64, (u64, usize)>,
    /// The `iovec` array of each [`OpKind::WriteV`] in flight, by ring entry id: kept
    /// until the completion (kept here, not in the request, because raw pointers would
    /// make requests unsendable to this thread).
    iovecs: HashMap<u64, Vec<libc::iovec>>,
    /// Entries submitted and not yet completed (the wake read excluded).
    entries_in_flight: usize,
    next_id: u64,
    shutting_down: bool,
}

impl RingThread {
    fn new(ring: IoUring, rx: mpsc::Receiver<Msg>, wake_fd: OwnedFd) -> Self {
        RingThread {
            ring,
            rx,
            wake_fd,
            wake_buf: Box::new([0u8; 8]),
            wake_armed: false,
            inflight: HashMap::new(),
            part_of: HashMap::new(),
            iovecs: HashMap::new(),
            entries_in_flight: 0,
            next_id: 0,
            shutting_down: false,
        }
    }

    fn run(mut self) {
        loop {
            self.take_new_requests();
            if self.shutting_down && self.inflight.is_empty() && !self.wake_armed {
                return;
            }
            if !self.shutting_down && !self.wake_armed {
                self.arm_wake();
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => {
                    tracing::error!(error = %e, "io_uring_enter failed; engine stopped");
                    self.fail_forever(&e);
                    return;
                }
            }
            self.reap();
        }
    }

    /// Moves queued requests into the ring while there is room for them.
    fn take_new_requests(&mut self) {
        // Room for a request of the most entries (the completion queue, twice the
        // submission queue, then never overflows).
        while self.entries_in_flight + MAX_PARTS < (RING_ENTRIES - 1) as usize
            && !self.shutting_down
        {
            match self.rx.try_recv() {
                Ok(Msg::Op(req)) => self.push(*req),
                Ok(Msg::Shutdown) | Err(mpsc::TryRecvError::Disconnected) => {
                    self.shutting_down = true;
                }
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
    }

    fn fresh_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id = (self.next_id + 1) % (WAKE_TOKEN - 1);
        id
    }

    /// A [`OpKind::ReadCrc`]: one read entry per part, all submitted now.
    fn push_parts(&mut self, mut req: Request) {
        let id = self.fresh_id();
        let fd = types::Fd(req.file.as_raw_fd());
        let Some(buf) = req.buf.as_mut() else {
            let _ = req.reply.send(Reply {
                result: Err(io::Error::other("read without a buffer")),
                buf: None,
                crc: None,
                wparts: Vec::new(),
            });
            return;
        };
        let len = req.len.min(buf.capacity().saturating_sub(req.pos));
        // Parts of equal aligned size but the last (no small trailing part that would
        // cost the device a request of its own), as many of at least MIN_PART as fit.
        let count = (len / MIN_PART).clamp(1, MAX_PARTS);
        let part = align_up(len.div_ceil(count));
        let mut spans = Vec::with_capacity(count);
        let mut at = req.pos;
        while at < req.pos + len {
            let n = part.min(req.pos + len - at);
            spans.push((at, n));
            at += n;
        }
        for (i, &(pos, n)) in spans.iter().enumerate() {
            let part_id = self.fresh_id();
            // Parts are pushed in order, so this window starts past every part already
            // in flight: no reference overlaps memory the kernel is writing.
            let ptr = buf.window_mut(pos).as_mut_ptr();
            let entry = opcode::Read::new(fd, ptr, n as u32)
                .offset(req.offset + pos as u64)
                .build()
                .user_data(part_id);
            // SAFETY: as in `push`: `req` (the buffer's heap storage and the file) is
            // stored in `inflight` below and removed only after every part's
            // completion was reaped (`Parts::remaining` reaches 0).
            self.push_entry(&entry);
            self.entries_in_flight += 1;
            self.part_of.insert(part_id, (id, i));
        }
        let n = spans.len();
        req.parts = Some(Parts {
            spans,
            results: vec![None; n],
            remaining: n,
            next: 0,
            full_prefix: true,
            crc: Crc32c::new(),
            crc_pos: req.crc.start,
        });
        if n == 0 {
            let _ = req.reply.send(Reply {
                result: Ok(0),
                buf: req.buf,
                crc: (req.crc.is_empty()).then_some(0),
                wparts: Vec::new(),
            });
            return;
        }
        self.inflight.insert(id, req);
    }

    /// Part `i` of request `id` completed with `res`: checksums what has arrived in
    /// order, and answers the request once every part is in.
    fn part_done(&mut self, id: u64, i: usize, res: i32) {
        let Some(req) = self.inflight.get_mut(&id) else {
            return;
        };
        let (Some(parts), Some(buf)) = (req.parts.as_mut(), req.buf.as_ref()) else {
            return;
        };
        parts.results[i] = Some(res);
        parts.remaining -= 1;
        while parts.next < parts.spans.len() {
            let Some(r) = parts.results[parts.next] else {
                break;
            };
            let (pos, n) = parts.spans[parts.next];
            parts.next += 1;
            if !parts.full_prefix || r < 0 {
                parts.full_prefix = false;
                continue;
            }
            // What arrived of this part (all of it, or up to the end of the file).
            let got = (r as usize).min(n);
            // The crc range's share of it, from where the checksum got to.
            let from = parts.crc_pos.max(pos);
            let to = req.crc.end.min(pos + got);
            if from < to {
                if let Some(bytes) = buf.capacity_range(from..to) {
                    parts.crc.update(bytes);
                    parts.crc_pos = to;
                }
            }
            if got != n {
                parts.full_prefix = false;
            }
        }
        if parts.remaining > 0 {
            return;
        }
        let Some(req) = self.inflight.remove(&id) else {
            return;
        };
        let Some(parts) = req.parts else {
            return;
        };
        // As a plain read: bytes up to the first short part; an error in that prefix
        // fails the read.
        let mut filled = 0usize;
        let mut result = Ok(0usize);
        for (&(_, n), r) in parts.spans.iter().zip(&parts.results) {
            let r = r.unwrap_or(0);
            if r < 0 {
                result = Err(io::Error::from_raw_os_error(-r));
                break;
            }
            filled += r as usize;
            if r as usize != n {
                break;
            }
        }
        let result = result.map(|_| filled);
        let crc = (parts.crc_pos >= req.crc.end).then(|| parts.crc.value());
        let _ = req.reply.send(Reply {
            result,
            buf: req.buf,
            crc,
            wparts: Vec::new(),
        });
    }

    fn push(&mut self, mut req: Request) {
        if matches!(req.kind, OpKind::ReadCrc) {
            return self.push_parts(req);
        }
        if matches!(req.kind, OpKind::WriteV) {
            return self.push_writev(req);
        }
        let id = self.fresh_id();
        let fd = types::Fd(req.file.as_raw_fd());
        let entry = match req.kind {
            OpKind::Fsync => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            OpKind::Read | OpKind::ReadCrc | OpKind::Write | OpKind::WriteV => {
                let Some(buf) = req.buf.as_mut() else {
                    let _ = req.reply.send(Reply {
                        result: Err(io::Error::other("read/write without a buffer")),
                        buf: None,
                        crc: None,
                        wparts: Vec::new(),
                    });
                    return;
                };
                let window = buf.window_mut(req.pos);
                let len = req.len.min(window.len()) as u32;
                let ptr = window.as_mut_ptr();
                let at = req.offset + req.pos as u64;
                match req.kind {
                    OpKind::Read => opcode::Read::new(fd, ptr, len).offset(at).build(),
                    _ => opcode::Write::new(fd, ptr, len).offset(at).build(),
                }
            }
        }
        .user_data(id);
        // SAFETY: the entry points at `req.buf`'s heap storage (which does not move
        // when `req` moves) and at `req.file`'s descriptor. `req` is stored in
        // `inflight` below and removed only in `reap`, after the kernel has posted the
        // completion for `id`, so both outlive the kernel's use of them.
        self.push_entry(&entry);
        self.entries_in_flight += 1;
        self.inflight.insert(id, req);
    }

    /// A [`OpKind::WriteV`]: one `WRITEV` entry for the parts from byte `pos` on.
    fn push_writev(&mut self, req: Request) {
        let id = self.fresh_id();
        let fd = types::Fd(req.file.as_raw_fd());
        let iov = iovecs(&req.wparts, req.pos);
        if iov.is_empty() {
            let _ = req.reply.send(Reply {
                result: Ok(0),
                buf: None,
                crc: None,
                wparts: req.wparts,
            });
            return;
        }
        let entry = opcode::Writev::new(fd, iov.as_ptr(), iov.len() as u32)
            .offset(req.offset + req.pos as u64)
            .build()
            .user_data(id);
        // SAFETY: the entry points at the `iovec` array (its heap storage does not move
        // when the Vec moves into `iovecs`) and through it at `req.wparts`' memory
        // (heap storage of `AlignedBuf`s and `Bytes`, which does not move when `req`
        // does) and at `req.file`'s descriptor. The array is kept in `iovecs` and `req`
        // in `inflight` until `reap` has seen the completion for `id`.
        self.push_entry(&entry);
        self.entries_in_flight += 1;
        self.iovecs.insert(id, iov);
        self.inflight.insert(id, req);
    }

    fn arm_wake(&mut self) {
        let entry = opcode::Read::new(
            types::Fd(self.wake_fd.as_raw_fd()),
            self.wake_buf.as_mut_ptr(),
            8,
        )
        .build()
        .user_data(WAKE_TOKEN);
        // SAFETY: `wake_buf` and `wake_fd` are owned by this thread's state, which is
        // never dropped while `wake_armed` is true (`run` returns only when it is false).
        self.push_entry(&entry);
        self.wake_armed = true;
    }

    fn push_entry(&mut self, entry: &io_uring::squeue::Entry) {
        loop {
            // SAFETY: callers guarantee that what `entry` references stays valid until
            // its completion is reaped (see `push` and `arm_wake`).
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return;
            }
            // Queue full: hand what is queued to the kernel and retry. The in-flight
            // bound keeps this from looping for long.
            if let Err(e) = self.ring.submit() {
                if e.kind() != io::ErrorKind::Interrupted && e.raw_os_error() != Some(libc::EBUSY) {
                    tracing::warn!(error = %e, "io_uring submit while queue full");
                }
            }
        }
    }

    fn reap(&mut self) {
        let done: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (id, res) in done {
            if id == WAKE_TOKEN {
                self.wake_armed = false;
                continue;
            }
            self.entries_in_flight = self.entries_in_flight.saturating_sub(1);
            if let Some((parent, i)) = self.part_of.remove(&id) {
                self.part_done(parent, i, res);
                continue;
            }
            self.iovecs.remove(&id);
            let Some(req) = self.inflight.remove(&id) else {
                continue;
            };
            let result = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else {
                Ok(res as usize)
            };
            // The caller may have gone away; its buffer is dropped here then.
            let _ = req.reply.send(Reply {
                result,
                buf: req.buf,
                crc: None,
                wparts: req.wparts,
            });
        }
    }

    /// The ring is unusable: answer every later request with an error until the engine
    /// is dropped, then leak what the kernel may still reference instead of freeing it.
    fn fail_forever(mut self, e: &io::Error) {
        while let Ok(msg) = self.rx.recv() {
            match msg {
                Msg::Op(req) => {
                    let _ = req.reply.send(Reply {
                        result: Err(io::Error::new(e.kind(), e.to_string())),
                        buf: req.buf,
                        crc: None,
                        wparts: req.wparts,
                    });
                }
                Msg::Shutdown => break,
            }
        }
        // Leaking is safe; freeing buffers the kernel may still write into is not.
        std::mem::forget(std::mem::take(&mut self.inflight));
        std::mem::forget(std::mem::take(&mut self.iovecs));
        std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new([0u8; 8])));
    }
}

#[cfg(test)]
mod tests {
    use super::super::ALIGN;
    use super::*;
    use futures::FutureExt;

    /// Regression guard for lost wakeups: more requests than the ring has entries
    /// (so the thread runs at its in-flight cap with work queued in the channel), slow
    /// `fdatasync`s among them (served by io-wq workers), submitted both from tasks on a
    /// 2-worker runtime and from plain threads that poll each call once with
    /// `now_or_never` before spawning it (as the FUSE adapter does), and some callers
    /// dropped mid-flight. Every surviving call must complete within the bound.
    #[test]
    fn no_lost_wakeup_at_the_in_flight_cap() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let engine: Arc<dyn IoEngine> = Arc::new(UringEngine::new().expect("io_uring"));
        let (_dir, file) = super::super::temp_file();
        const PER_SOURCE: u64 = 1500;
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        let op = move |engine: Arc<dyn IoEngine>, file: Arc<File>, i: u64| async move {
            let mut buf = AlignedBuf::zeroed(ALIGN);
            buf.full_mut().fill((i % 251) as u8);
            let at = (i % 512) * ALIGN as u64;
            engine.write_at(file.clone(), at, buf).await.expect("write");
            let got = engine
                .read_at(file.clone(), at, AlignedBuf::zeroed(ALIGN))
                .await
                .expect("read");
            assert_eq!(got.len(), ALIGN);
            // Last, so that some callers end on a slow request nothing follows.
            if i.is_multiple_of(8) {
                engine.sync_data(file).await.expect("sync");
            }
        };
        let handle = rt.handle().clone();
        let outcome = rt.block_on(async {
            let mut expected = 0u64;
            for i in 0..PER_SOURCE {
                let (engine, file, done) = (engine.clone(), file.clone(), done_tx.clone());
                let fut = op(engine, file, i);
                if i % 10 == 9 {
                    // Dropped after its first request is queued: the thread still
                    // owns the buffer and must carry on with the others.
                    let mut fut = Box::pin(fut);
                    let _ = (&mut fut).now_or_never();
                    continue;
                }
                expected += 1;
                tokio::spawn(async move {
                    fut.await;
                    let _ = done.send(i);
                });
            }
            let mut threads = Vec::new();
            for t in 0..2u64 {
                let (engine, file, done) = (engine.clone(), file.clone(), done_tx.clone());
                let handle = handle.clone();
                threads.push(std::thread::spawn(move || {
                    let _ctx = handle.enter();
                    for i in 0..PER_SOURCE / 2 {
                        let n = PER_SOURCE + t * PER_SOURCE + i;
                        let (engine, file, done) = (engine.clone(), file.clone(), done.clone());
                        let mut fut = Box::pin(async move {
                            op(engine, file, n).await;
                            let _ = done.send(n);
                        });
                        if (&mut fut).now_or_never().is_none() {
                            handle.spawn(fut);
                        }
                    }
                }));
                expected += PER_SOURCE / 2;
            }
            drop(done_tx);
            for th in threads {
                th.join().expect("submitting thread");
            }
            let mut got = 0u64;
            let all = async {
                while done_rx.recv().await.is_some() {
                    got += 1;
                }
            };
            let finished = tokio::time::timeout(std::time::Duration::from_secs(60), all)
                .await
                .is_ok();
            (finished, got, expected)
        });
        rt.shutdown_timeout(std::time::Duration::from_secs(5));
        let (finished, got, expected) = outcome;
        assert!(
            finished,
            "io_uring engine hung: {got} of {expected} calls completed"
        );
        assert_eq!(got, expected);
    }
}
