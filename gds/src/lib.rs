//! Strata's GPU tier: GPU memory as the top cache tier, GPUDirect-style transfers, and a
//! host-emulated device so every path runs and is tested without a GPU.
//!
//! Layers, bottom up:
//! - [`device`]: the [`Device`] trait (allocations under a byte limit, pinned host
//!   buffers, ordered async copy streams, a "lost" state) with two backends:
//!   [`EmulatedDevice`] (host memory; CI) and, behind the `cuda` cargo feature,
//!   `cuda::CudaDevice` (cudarc with dynamic loading; a missing driver is an error
//!   from [`open_device`], never a panic).
//! - [`file`]: `O_DIRECT` positional reads (buffered fallback where refused).
//! - [`transfer`]: the [`Transfers`]: disk -> device (cuFile when available, else
//!   the chunked, double-buffered bounce pipeline), host <-> device, device -> device,
//!   object-store bytes -> device; the active [`TransferPath`] and counters for
//!   `strata stats`. `read_into_device` is the file-data API for GPU-aware loaders.
//! - [`tier`]: [`GpuTier`], a `strata_cache_core::Tier` in device memory, checksummed.
//! - [`ipc`]: handing device-resident blocks to a local inference process by handle
//!   (CUDA IPC, or the emulated device's memfd), under a lease.

pub mod bench;
pub mod device;
pub mod emulated;
pub mod error;
pub mod file;
pub mod ipc;
pub mod pool;
pub mod sealed_memfd;
pub mod tier;
pub mod transfer;

#[cfg(feature = "cuda")]
pub mod cuda;

use std::sync::Arc;

pub use device::{
    Device, DeviceBuffer, DeviceCopy, DeviceInfo, DeviceKind, DeviceStream, PinnedBuffer,
};
pub use emulated::EmulatedDevice;
pub use error::{GdsError, Result};
pub use ipc::{ClientMemory, IpcBackend, IpcExport, IpcHandle, IpcView};
pub use tier::GpuTier;
pub use transfer::{TransferConfig, TransferPath, TransferStats, Transfers};

/// Which device to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The emulated device with this memory limit.
    Emulated { memory_limit: u64 },
    /// CUDA device `ordinal`, allocating at most `memory_limit` bytes; an error if CUDA
    /// is not built in or not present.
    Cuda { ordinal: usize, memory_limit: u64 },
    /// CUDA if present, else the emulated device (with the same limit).
    CudaOrEmulated { ordinal: usize, memory_limit: u64 },
}

/// Opens a device. Missing CUDA (not compiled in, no libcuda, no GPU) is an
/// `Unavailable` error for `Cuda` and a logged fallback for `CudaOrEmulated`.
pub fn open_device(choice: &DeviceChoice) -> Result<Arc<dyn Device>> {
    match *choice {
        DeviceChoice::Emulated { memory_limit } => {
            Ok(Arc::new(EmulatedDevice::try_new(memory_limit)?))
        }
        DeviceChoice::Cuda {
            ordinal,
            memory_limit,
        } => open_cuda(ordinal, memory_limit),
        DeviceChoice::CudaOrEmulated {
            ordinal,
            memory_limit,
        } => open_cuda(ordinal, memory_limit).or_else(|e| {
            tracing::warn!(error = %e, "CUDA unavailable; using the emulated device");
            Ok(Arc::new(EmulatedDevice::try_new(memory_limit)?) as Arc<dyn Device>)
        }),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize, memory_limit: u64) -> Result<Arc<dyn Device>> {
    Ok(Arc::new(cuda::CudaDevice::open(ordinal, memory_limit)?))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize, _memory_limit: u64) -> Result<Arc<dyn Device>> {
    Err(GdsError::Unavailable(
        "built without the `cuda` feature (cargo build --features cuda)".into(),
    ))
}
