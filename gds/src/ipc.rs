//! Client access: a local inference process receiving KV blocks into its own GPU
//! buffers.
//!
//! Mechanism (CUDA): the daemon holds each block in its own device allocation and
//! exports it with `cuIpcGetMemHandle`, a 64-byte handle naming the live allocation.
//! The handle (plus length and crc32c) travels to the client over the local control
//! channel (the KV service's gRPC response or a Unix socket) as [`IpcHandle::to_bytes`].
//! The client calls `cuIpcOpenMemHandle` in its own context, copies device-to-device
//! into its own buffer (the copy never leaves the GPU), and closes the mapping. The
//! daemon keeps the allocation alive while the [`IpcExport`] lives: KV values are
//! immutable, so the client reads a stable value even if the daemon evicts the key in
//! the meantime (the free is deferred until the export is dropped). CUDA IPC only works
//! between processes (opening a handle in the exporting process fails) and on the same
//! GPU or peer-accessible GPUs.
//!
//! Emulated stand-in: the exporter writes the block into a named shared-memory file
//! (`/dev/shm/strata-ipc-<pid>-<n>`, mode 0600, unlinked when the export drops); the
//! handle carries its name; the client opens it, verifies the crc and copies it into
//! its own (emulated) device buffer. Same handle format, same life cycle, same errors.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::device::{DeviceBuffer, DeviceKind};
use crate::emulated::EmulatedDevice;
use crate::error::{GdsError, Result};

/// What a client needs to open one exported block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcHandle {
    pub kind: DeviceKind,
    pub len: u64,
    pub crc: u32,
    /// Backend token: a CUDA IPC memory handle (64 bytes) or a shared-memory file name.
    pub token: Vec<u8>,
}

const MAGIC: &[u8; 4] = b"SGIP";
const VERSION: u8 = 1;

impl IpcHandle {
    /// Wire form: `SGIP`, version, kind (0 emulated, 1 cuda), len u64, crc u32,
    /// token length u32, token; integers big-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(22 + self.token.len());
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
        out
    }

    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let bad = |why: &str| GdsError::Ipc(format!("bad handle: {why}"));
        if b.len() < 22 || &b[..4] != MAGIC {
            return Err(bad("too short or wrong magic"));
        }
        if b[4] != VERSION {
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
        let token = b
            .get(22..)
            .filter(|t| t.len() == tlen)
            .ok_or_else(|| bad("token"))?;
        Ok(IpcHandle {
            kind,
            len,
            crc,
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
                token: Vec::new(),
            },
            _keep: None,
        }
    }
    pub fn handle(&self) -> &IpcHandle {
        &self.handle
    }
}

/// Exporting device buffers to, and importing them in, another process.
pub trait IpcBackend: Send + Sync {
    /// Daemon side: exports `buf`, whose bytes have checksum `crc`.
    fn export(&self, buf: &DeviceBuffer, crc: u32) -> Result<IpcExport>;
    /// Client side: opens `handle` and copies its bytes into `dst[dst_off..]`.
    fn import_into(&self, handle: &IpcHandle, dst: &DeviceBuffer, dst_off: usize) -> Result<()>;
}

/// Unlinks the shared-memory file when the export is dropped.
struct ShmFile(PathBuf);

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn shm_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

static NEXT_EXPORT: AtomicU64 = AtomicU64::new(0);

impl IpcBackend for EmulatedDevice {
    fn export(&self, buf: &DeviceBuffer, crc: u32) -> Result<IpcExport> {
        let bytes = self.read_raw(buf)?;
        let n = NEXT_EXPORT.fetch_add(1, Ordering::Relaxed);
        let path = shm_dir().join(format!("strata-ipc-{}-{n}", std::process::id()));
        let guard = ShmFile(path.clone());
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| GdsError::Ipc(format!("create {}: {e}", path.display())))?;
        f.write_all(&bytes)?;
        let token = path.into_os_string().into_encoded_bytes();
        Ok(IpcExport::new(
            IpcHandle {
                kind: DeviceKind::Emulated,
                len: bytes.len() as u64,
                crc,
                token,
            },
            Box::new(guard),
        ))
    }

    fn import_into(&self, handle: &IpcHandle, dst: &DeviceBuffer, dst_off: usize) -> Result<()> {
        if handle.kind != DeviceKind::Emulated {
            return Err(GdsError::Ipc(format!(
                "cannot open a {:?} handle on an emulated device",
                handle.kind
            )));
        }
        let len = usize::try_from(handle.len).map_err(|_| GdsError::Ipc("length".into()))?;
        dst.check_range(dst_off, len)?;
        if len == 0 {
            return Ok(());
        }
        let path = PathBuf::from(
            String::from_utf8(handle.token.clone())
                .map_err(|_| GdsError::Ipc("token is not a path".into()))?,
        );
        let bytes = std::fs::read(&path).map_err(|e| {
            GdsError::Ipc(format!("open {}: {e} (export revoked?)", path.display()))
        })?;
        if bytes.len() != len {
            return Err(GdsError::Ipc(format!(
                "exported {} bytes, handle says {len}",
                bytes.len()
            )));
        }
        let crc = crc32c::crc32c(&bytes);
        if crc != handle.crc {
            return Err(GdsError::Corrupt(format!(
                "imported block crc {crc:#010x} != handle crc {:#010x}",
                handle.crc
            )));
        }
        self.write_raw(&bytes, dst, dst_off)
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
            token: vec![0, 1, 0xAB, 0xFF],
        };
        assert_eq!(IpcHandle::from_hex(&h.to_hex()).expect("round trip"), h);
        assert!(IpcHandle::from_hex("abc").is_err());
        assert!(IpcHandle::from_hex(&h.to_hex().replace('a', "g")).is_err());
        assert!(IpcHandle::from_hex("é00").is_err());
    }
}
