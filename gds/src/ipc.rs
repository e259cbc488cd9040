//! Client access: a local inference process reading KV blocks held in the GPU tier
//! straight from device memory, by handle, without a copy through a socket.
//!
//! Protocol (the same as the KV service's shared-memory arena, `kvcache/src/shm.rs`):
//! the client asks Get for a device-resident block; the service exports the block's
//! allocation and answers with an [`IpcHandle`] (device kind, memory id, offset,
//! length, crc32c) and a lease id instead of the bytes. The client opens the handle,
//! reads (or copies device-to-device into its own KV buffers), and releases the lease.
//! While the lease is held the daemon keeps the allocation (the [`IpcExport`] holds a
//! reference to its [`DeviceBuffer`]): evicting the key drops it from the tier, but
//! the device memory is freed, and its range reused, only when the last lease on it
//! ends. KV values are immutable, so a leased block never changes under its reader.
//!
//! Backends, behind one trait ([`IpcBackend`]):
//! - CUDA (`cuda` feature): the handle's token is the 64-byte `cuIpcGetMemHandle` of
//!   the allocation; the client maps it with `cuIpcOpenMemHandle` (`cudaIpc*` in the
//!   runtime API; the Python client calls it through the driver library) at `offset`,
//!   copies, and closes it. CUDA IPC works only between processes on the same GPU (or
//!   peer-accessible GPUs); opening in the exporting process fails.
//! - Emulated: the device's memory is one sealed memfd ([`EmulatedDevice::memory_fd`]);
//!   the handle's token is the device's random 16-byte memory id and `offset` is the
//!   allocation's place in the memfd. A client receives the memfd once, over a Unix
//!   socket with `SCM_RIGHTS` (the KV service sends it beside the arena's),
//!   maps it read-only ([`EmulatedDevice::attach_peer`]) and reads at the offset. So the
//!   whole path (request, handle, lease, open, byte-exact read, release, eviction
//!   deferred by the lease) runs without a GPU, with CUDA's semantics: a handle opens
//!   only where the device's memory was received, and only while exported.
//!
//! The crc in the handle lets an importer check what it read ([`IpcBackend::import_into`]
//! does): a handle used after its lease ended reads whatever the range holds now and
//! is refused as stale rather than copied.

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use crate::device::Device;
use crate::device::{DeviceBuffer, DeviceKind};
use crate::emulated::{EmulatedDevice, PeerMemory};
use crate::error::{GdsError, Result};

/// What a client needs to open one exported block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcHandle {
    pub kind: DeviceKind,
    pub len: u64,
    pub crc: u32,
    /// Where the block starts in what `token` names (the CUDA allocation, or the
    /// emulated device's memory).
    pub offset: u64,
    /// Backend token: a CUDA IPC memory handle (64 bytes) or an emulated device's
    /// 16-byte memory id.
    pub token: Vec<u8>,
}

const MAGIC: &[u8; 4] = b"SGIP";
/// Version 2 added `offset`; version 1 (offset 0) is still read.
const VERSION: u8 = 2;

impl IpcHandle {
    /// Wire form (version 2): `SGIP`, version, kind (0 emulated, 1 cuda), len u64,
    /// crc u32, token length u32, token, offset u64; integers big-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(30 + self.token.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(match self.kind {
            DeviceKind::Emulated => 0,
            DeviceKind::Cuda => 1,
        });
        out.extend_from_slice(&self.len.to_be_bytes());
        out.extend_from_slice(&self.crc.to_be_bytes());
        out.extend_from_slice(&(self.token.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.token);
        out.extend_from_slice(&self.offset.to_be_bytes());
        out
    }

    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let bad = |why: &str| GdsError::Ipc(format!("bad handle: {why}"));
        if b.len() < 22 || &b[..4] != MAGIC {
            return Err(bad("too short or wrong magic"));
        }
        let version = b[4];
        if version != 1 && version != VERSION {
            return Err(bad("unknown version"));
        }
        let kind = match b[5] {
            0 => DeviceKind::Emulated,
            1 => DeviceKind::Cuda,
            _ => return Err(bad("unknown device kind")),
        };
        let u64_at = |i: usize| {
            b.get(i..i + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_be_bytes)
        };
        let u32_at = |i: usize| {
            b.get(i..i + 4)
                .and_then(|s| s.try_into().ok())
                .map(u32::from_be_bytes)
        };
        let len = u64_at(6).ok_or_else(|| bad("len"))?;
        let crc = u32_at(14).ok_or_else(|| bad("crc"))?;
        let tlen = u32_at(18).ok_or_else(|| bad("token length"))? as usize;
        let tail = if version == 1 { 0 } else { 8 };
        let token = b
            .get(22..)
            .filter(|t| t.len() == tlen + tail)
            .map(|t| &t[..tlen])
            .ok_or_else(|| bad("token"))?;
        let offset = if version == 1 {
            0
        } else {
            u64_at(22 + tlen).ok_or_else(|| bad("offset"))?
        };
        Ok(IpcHandle {
            kind,
            len,
            crc,
            offset,
            token: token.to_vec(),
        })
    }

    /// The wire form in lowercase hex, to pass on a command line.
    pub fn to_hex(&self) -> String {
        self.to_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads [`Self::to_hex`]'s form.
    pub fn from_hex(hex: &str) -> Result<Self> {
        let bad = |why: &str| GdsError::Ipc(format!("bad handle: {why}"));
        if !hex.len().is_multiple_of(2) {
            return Err(bad("odd-length hex"));
        }
        let wire = hex
            .as_bytes()
            .chunks(2)
            .map(|d| {
                std::str::from_utf8(d)
                    .ok()
                    .and_then(|d| u8::from_str_radix(d, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| bad("not hex"))?;
        Self::from_bytes(&wire)
    }
}

/// A live export: the handle stays valid until this is dropped.
pub struct IpcExport {
    handle: IpcHandle,
    _keep: Option<Box<dyn Send + Sync>>,
}

impl std::fmt::Debug for IpcExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcExport")
            .field("handle", &self.handle)
            .finish()
    }
}

impl IpcExport {
    pub fn new(handle: IpcHandle, keep: Box<dyn Send + Sync>) -> Self {
        IpcExport {
            handle,
            _keep: Some(keep),
        }
    }
    /// An empty block needs no device memory: the handle carries everything.
    pub fn empty(kind: DeviceKind, crc: u32) -> Self {
        IpcExport {
            handle: IpcHandle {
                kind,
                len: 0,
                crc,
                offset: 0,
                token: Vec::new(),
            },
            _keep: None,
        }
    }
    pub fn handle(&self) -> &IpcHandle {
        &self.handle
    }
}

/// What a client must receive out of band before it can open a device's handles:
/// the emulated device's memfd, its size and id. CUDA needs nothing (the driver opens
/// the handle).
pub struct ClientMemory<'a> {
    pub fd: BorrowedFd<'a>,
    pub size: u64,
    pub id: [u8; 16],
}

/// Exporting device buffers to, and importing them in, another process.
pub trait IpcBackend: Send + Sync {
    /// Daemon side: exports `buf`, whose bytes have checksum `crc`.
    fn export(&self, buf: &DeviceBuffer, crc: u32) -> Result<IpcExport>;
    /// Client side: opens `handle` and copies its bytes into `dst[dst_off..]`.
    fn import_into(&self, handle: &IpcHandle, dst: &DeviceBuffer, dst_off: usize) -> Result<()>;
    /// Daemon side: what a client needs before it can open this device's handles
    /// (passed over the Unix socket); None when the handle is enough.
    fn client_memory(&self) -> Option<ClientMemory<'_>> {
        None
    }
}

/// An opened emulated handle: the exported bytes, in place in the exporter's memory.
pub struct IpcView {
    peer: Arc<PeerMemory>,
    offset: u64,
    len: u64,
}

impl std::ops::Deref for IpcView {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // Checked when the view was made.
        self.peer.bytes(self.offset, self.len).unwrap_or(&[])
    }
}

impl EmulatedDevice {
    /// Client side: opens an emulated handle in place (no copy): its bytes are read
    /// straight from the exporter's memory, valid while the export's lease is held.
    pub fn open_view(&self, handle: &IpcHandle) -> Result<IpcView> {
        if handle.kind != DeviceKind::Emulated {
            return Err(GdsError::Ipc(format!(
                "cannot open a {:?} handle on an emulated device",
                handle.kind
            )));
        }
        let peer = self.peer(&handle.token).ok_or_else(|| {
            GdsError::Ipc("the handle's device memory was not received (attach_peer)".into())
        })?;
        if peer.bytes(handle.offset, handle.len).is_none() {
            return Err(GdsError::Ipc(format!(
                "handle {}+{} outside the device's memory",
                handle.offset, handle.len
            )));
        }
        Ok(IpcView {
            peer,
            offset: handle.offset,
            len: handle.len,
        })
    }
}

impl IpcBackend for EmulatedDevice {
    fn export(&self, buf: &DeviceBuffer, crc: u32) -> Result<IpcExport> {
        if self.is_lost() {
            return Err(GdsError::DeviceLost("emulated device was lost".into()));
        }
        let offset = self.offset_of(buf)?;
        Ok(IpcExport::new(
            IpcHandle {
                kind: DeviceKind::Emulated,
                len: buf.len() as u64,
                crc,
                offset,
                token: self.memory_id().to_vec(),
            },
            // Keeps the allocation (and so its range of the memfd) while exported.
            Box::new(buf.clone()),
        ))
    }

    fn import_into(&self, handle: &IpcHandle, dst: &DeviceBuffer, dst_off: usize) -> Result<()> {
        let len = usize::try_from(handle.len).map_err(|_| GdsError::Ipc("length".into()))?;
        dst.check_range(dst_off, len)?;
        if len == 0 {
            return Ok(());
        }
        let view = self.open_view(handle)?;
        let crc = crc32c::crc32c(&view);
        if crc != handle.crc {
            return Err(GdsError::Corrupt(format!(
                "imported block crc {crc:#010x} != handle crc {:#010x} (export revoked: \
                 the lease ended and the range was reused)",
                handle.crc
            )));
        }
        self.write_raw(&view, dst, dst_off)
    }

    fn client_memory(&self) -> Option<ClientMemory<'_>> {
        let (fd, size) = self.memory_fd();
        Some(ClientMemory {
            fd,
            size,
            id: self.memory_id(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_what_is_not_hex() {
        let h = IpcHandle {
            kind: DeviceKind::Cuda,
            len: 1 << 33,
            crc: 0xDEAD_BEEF,
            offset: 1 << 40,
            token: vec![0, 1, 0xAB, 0xFF],
        };
        assert_eq!(IpcHandle::from_hex(&h.to_hex()).expect("round trip"), h);
        assert!(IpcHandle::from_hex("abc").is_err());
        assert!(IpcHandle::from_hex(&h.to_hex().replace('a', "g")).is_err());
        assert!(IpcHandle::from_hex("é00").is_err());
    }

    #[test]
    fn version_1_handles_still_read_with_offset_zero() {
        let mut v1 = Vec::new();
        v1.extend_from_slice(b"SGIP");
        v1.extend_from_slice(&[1, 1]);
        v1.extend_from_slice(&7u64.to_be_bytes());
        v1.extend_from_slice(&9u32.to_be_bytes());
        v1.extend_from_slice(&2u32.to_be_bytes());
        v1.extend_from_slice(&[0xAA, 0xBB]);
        let h = IpcHandle::from_bytes(&v1).expect("v1");
        assert_eq!((h.len, h.crc, h.offset), (7, 9, 0));
        assert_eq!(h.token, vec![0xAA, 0xBB]);
        let mut v3 = v1.clone();
        v3[4] = 3;
        assert!(IpcHandle::from_bytes(&v3).is_err());
    }
}
