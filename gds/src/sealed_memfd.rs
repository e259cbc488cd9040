//! One sealed memfd mapped shared into this process: the memory that same-host clients
//! map from a file descriptor passed over a Unix socket. The emulated device's memory
//! ([`crate::emulated`]) and the KV service's shared-memory arena both are one.
//!
//! Sealed against shrinking (a client reading past a truncation would take SIGBUS) and
//! growing (behind the owner's bookkeeping), and the seals themselves sealed. Memory
//! only the owner writes is also sealed against future writes once the owner has
//! mapped it (`F_SEAL_FUTURE_WRITE`): the fd a client receives then maps read-only
//! and `write(2)` on it fails, whatever access mode it carries (black-box finding: a
//! client mapped the KV arena writable and rewrote a stored block that `shm=True`
//! readers then loaded as KV).

use std::ffi::CStr;
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

/// Which step of [`SealedMemfd::create`] failed, and why.
#[derive(Debug)]
pub struct MemfdError {
    pub step: &'static str,
    pub source: nix::Error,
}

/// A memfd of a fixed size, sealed, mapped read-write and shared; unmapped on drop.
pub struct SealedMemfd {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: NonZeroUsize,
}

// SAFETY: `base` is a shared mapping owned by this value for its whole life; the owners
// order the accesses to each byte range (one writer per allocated range).
unsafe impl Send for SealedMemfd {}
unsafe impl Sync for SealedMemfd {}

impl SealedMemfd {
    /// A memfd named `name` of `len` bytes, sealed and mapped. `noreserve`: no swap is
    /// reserved for the mapping (memory that is mostly never touched). `owner_writes_only`:
    /// no one else may ever write it (see the module doc).
    pub fn create(
        name: &CStr,
        len: NonZeroUsize,
        noreserve: bool,
        owner_writes_only: bool,
    ) -> Result<Self, MemfdError> {
        let fail = |step| move |source| MemfdError { step, source };
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .map_err(fail("memfd_create"))?;
        let size = i64::try_from(len.get()).map_err(|_| fail("ftruncate")(nix::Error::EFBIG))?;
        nix::unistd::ftruncate(&fd, size).map_err(fail("ftruncate"))?;
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )
        .map_err(fail("sealing"))?;
        let mut flags = MapFlags::MAP_SHARED;
        if noreserve {
            flags |= MapFlags::MAP_NORESERVE;
        }
        // SAFETY: a fresh shared mapping of the whole memfd we own.
        let base = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                flags,
                &fd,
                0,
            )
        }
        .map_err(fail("mmap"))?;
        // After the owner's own writable mapping, which the future-write seal spares.
        let mut last = SealFlag::F_SEAL_SEAL;
        if owner_writes_only {
            last |= SealFlag::F_SEAL_FUTURE_WRITE;
        }
        if let Err(e) = fcntl(&fd, FcntlArg::F_ADD_SEALS(last)) {
            // SAFETY: mapped just above with this base and length; not used after.
            unsafe {
                let _ = munmap(base, len.get());
            }
            return Err(fail("sealing")(e));
        }
        Ok(SealedMemfd {
            fd,
            base: base.cast(),
            len,
        })
    }

    /// The first byte of the mapping.
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len.get()
    }

    /// Never empty (the length is non-zero); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The memfd clients map.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

impl Drop for SealedMemfd {
    fn drop(&mut self) {
        // SAFETY: mapped in `create` with this base and length; unused after drop.
        unsafe {
            let _ = munmap(self.base.cast(), self.len.get());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_seen_through_the_fd_and_the_size_is_sealed() {
        let len = NonZeroUsize::new(8192).expect("non-zero");
        let m = SealedMemfd::create(c"strata-test", len, false, false).expect("memfd");
        // SAFETY: inside the mapping, nothing else uses it.
        unsafe { m.base().as_ptr().add(4096).write(7) };
        let mut byte = [0u8; 1];
        nix::sys::uio::pread(m.fd(), &mut byte, 4096).expect("pread");
        assert_eq!(byte[0], 7);
        assert!(
            nix::unistd::ftruncate(m.fd(), 4096).is_err(),
            "shrink is sealed"
        );
        assert!(
            nix::unistd::ftruncate(m.fd(), 16384).is_err(),
            "grow is sealed"
        );
    }

    /// Memory only its owner writes: the owner's mapping writes, anyone else's fd maps
    /// read-only at most and cannot `write(2)`, and the seal cannot be removed.
    #[test]
    fn owner_only_memory_refuses_every_other_writer() {
        let len = NonZeroUsize::new(8192).expect("non-zero");
        let m = SealedMemfd::create(c"strata-test", len, false, true).expect("memfd");
        // SAFETY: inside the mapping, nothing else uses it.
        unsafe { m.base().as_ptr().write(9) };
        let other = nix::unistd::dup(m.fd()).expect("dup: as a client receives it");
        // SAFETY: a new mapping of our own memfd; unmapped if it succeeds.
        let writable = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &other,
                0,
            )
        };
        assert!(writable.is_err(), "a writable shared mapping is refused");
        assert!(
            nix::sys::uio::pwrite(&other, b"x", 0).is_err(),
            "write(2) is refused"
        );
        // SAFETY: a new read-only mapping of our own memfd, unmapped below.
        let ro = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED,
                &other,
                0,
            )
        }
        .expect("a read-only mapping is fine");
        // SAFETY: the mapping is `len` bytes; read one, then unmap it.
        unsafe {
            assert_eq!(ro.cast::<u8>().as_ptr().read(), 9);
            munmap(ro, len.get()).expect("munmap");
        }
        assert!(
            fcntl(&other, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_WRITE)).is_err(),
            "the seals are sealed"
        );
    }
}
