//! The client end of the shared-memory arena (`shm.rs`): attaches to the side socket,
//! maps the arena read-only, reads leased ranges in place and releases them.

use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;

use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use crate::error::{KvError, Result};
use crate::shm::SessionId;

/// An attached arena. Cheap to share behind an `Arc`; dropping it ends the session.
pub struct ShmClient {
    base: NonNull<u8>,
    size: usize,
    session: SessionId,
    releases: tokio::sync::mpsc::UnboundedSender<u64>,
    /// The daemon's emulated GPU memory (mapped read-only) and its id, when it sent one.
    device: Option<(NonNull<u8>, usize, [u8; 16])>,
}

// SAFETY: `base` is a read-only shared mapping owned by this value for its whole life;
// only reads go through it.
unsafe impl Send for ShmClient {}
unsafe impl Sync for ShmClient {}

impl Drop for ShmClient {
    fn drop(&mut self) {
        // SAFETY: the mappings made in `connect`, unused after this.
        unsafe {
            let _ = munmap(self.base.cast(), self.size);
            if let Some((base, size, _)) = self.device {
                let _ = munmap(base.cast(), size);
            }
        }
    }
}

fn cfg(what: &str, e: impl std::fmt::Display) -> KvError {
    KvError::Config(format!("shared memory: {what}: {e}"))
}

impl ShmClient {
    /// Connects to the daemon's side socket (`kv-shm.sock` beside `kv.sock`).
    pub async fn connect(path: &Path) -> Result<Self> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| cfg(&format!("connecting {}", path.display()), e))?;
        let mut hello = [0u8; crate::shm::HELLO_BYTES + 16];
        let (fd, device_fd, got) = loop {
            stream
                .readable()
                .await
                .map_err(|e| cfg("waiting for the hello", e))?;
            let got = stream.try_io(tokio::io::Interest::READABLE, || {
                let mut iov = [std::io::IoSliceMut::new(&mut hello)];
                let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 2]);
                let msg = recvmsg::<()>(
                    stream.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::MSG_CMSG_CLOEXEC,
                )
                .map_err(std::io::Error::from)?;
                let mut fds = Vec::new();
                for c in msg.cmsgs().map_err(std::io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        for raw in raw {
                            // SAFETY: a descriptor just received with SCM_RIGHTS is
                            // ours alone; wrapping it makes sure it is closed.
                            fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                        }
                    }
                }
                Ok((msg.bytes, fds))
            });
            match got {
                Ok((n, mut fds)) if n >= crate::shm::HELLO_BYTES && !fds.is_empty() => {
                    let device = (fds.len() > 1).then(|| fds.remove(1));
                    break (fds.remove(0), device, n);
                }
                Ok((n, _)) if hello[..n].starts_with(crate::shm::REFUSED_SESSIONS_FULL) => {
                    return Err(cfg(
                        "hello",
                        format!(
                            "the daemon refused a shared-memory session: all its sessions \
                             (at most {}, fewer under a low descriptor limit) hold leases; \
                             use the socket",
                            crate::shm::MAX_SESSIONS
                        ),
                    ))
                }
                Ok((n, _)) => return Err(cfg("hello", format!("{n} bytes, no arena descriptor"))),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(cfg("hello", e)),
            }
        };
        let mut id = [0u8; 16];
        id.copy_from_slice(&hello[..16]);
        let mut sz = [0u8; 8];
        sz.copy_from_slice(&hello[16..24]);
        let size = u64::from_le_bytes(sz) as usize;
        let len = NonZeroUsize::new(size).ok_or_else(|| cfg("arena", "size 0"))?;
        // SAFETY: a read-only shared mapping of the arena's full size; the memfd is
        // sealed against shrinking, so no page of it can disappear under us.
        let base = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| cfg("mmap", e))?;
        drop(fd);
        let mut dsz = [0u8; 8];
        dsz.copy_from_slice(&hello[24..32]);
        let device_size = u64::from_le_bytes(dsz) as usize;
        let device = match (device_fd, NonZeroUsize::new(device_size)) {
            (Some(dfd), Some(dlen)) if got == hello.len() => {
                let mut dev_id = [0u8; 16];
                dev_id.copy_from_slice(&hello[32..48]);
                // SAFETY: a read-only shared mapping of the device's sealed memfd.
                let dbase = unsafe {
                    mmap(
                        None,
                        dlen,
                        ProtFlags::PROT_READ,
                        MapFlags::MAP_SHARED,
                        &dfd,
                        0,
                    )
                }
                .map_err(|e| cfg("mmap of the device memory", e))?;
                Some((dbase.cast(), device_size, dev_id))
            }
            _ => None,
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        let mut stream = stream;
        tokio::spawn(async move {
            // Closing the stream (this task ending) ends the session on the server.
            while let Some(id) = rx.recv().await {
                if stream.write_all(&id.to_le_bytes()).await.is_err() {
                    return;
                }
            }
        });
        Ok(ShmClient {
            base: base.cast(),
            size,
            session: u128::from_le_bytes(id),
            releases: tx,
            device,
        })
    }

    /// Whether the daemon sent its emulated GPU memory (its handles open here).
    pub fn has_device_memory(&self) -> bool {
        self.device.is_some()
    }

    /// The bytes an emulated device handle names: `len` at `offset` of the device
    /// memory whose id is `id`; None if that is not the memory received, or out of it.
    pub fn device_read(&self, id: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
        let (base, size, dev_id) = self.device.as_ref()?;
        if id != dev_id {
            return None;
        }
        let end = offset.checked_add(len)?;
        if end > *size as u64 {
            return None;
        }
        // SAFETY: inside the mapping; a leased device range is never rewritten.
        Some(unsafe {
            std::slice::from_raw_parts(base.as_ptr().add(offset as usize), len as usize)
        })
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn session(&self) -> SessionId {
        self.session
    }

    /// The session id as the metadata value the server expects.
    pub fn session_hex(&self) -> String {
        format!("{:032x}", self.session)
    }

    /// The bytes of a leased range; None if it lies outside the arena (a bad answer).
    pub fn read(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.size as u64 {
            return None;
        }
        // SAFETY: inside the mapping; the server never rewrites a leased range.
        Some(unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().add(offset as usize), len as usize)
        })
    }

    /// Releases a lease (queued; the range may be reused once the server reads it).
    pub async fn release(&self, lease: u64) -> Result<()> {
        self.release_now(lease);
        Ok(())
    }

    /// As [`Self::release`], from synchronous code (a guard's drop).
    pub fn release_now(&self, lease: u64) {
        let _ = self.releases.send(lease);
    }

    /// Gives up the leases that answered the leasing call numbered `call` (sent as
    /// [`crate::shm::SHM_REQUEST_METADATA`]): its answer never came, so their ids are
    /// unknown here.
    pub fn abandon(&self, call: u64) {
        let _ = self.releases.send(call | crate::shm::ABANDON_BIT);
    }
}
