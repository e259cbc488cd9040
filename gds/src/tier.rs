//! The GPU-memory tier: cache blocks held in device memory.
//!
//! Each block is one device allocation plus its crc32c kept on the host. Reads back to
//! host memory verify the checksum (a bad block is dropped and reported as a miss, so
//! the engine refetches it from a lower tier); device-to-device hits
//! ([`GpuTier::get_into_device`]) do not, since checking would need a kernel and HBM is
//! ECC-protected.
//!
//! Failures never lose data the tier claims to hold: a put that fails (device out of
//! memory, device lost mid-copy) leaves the tier as it was, minus nothing; when the
//! device is lost every entry is dropped at once (device memory is gone), so
//! `resident()` and `used_bytes()` say so and the engine falls back to lower tiers.
//! The byte budget is the engine's (one `TierSpace` per level); the tier only reports
//! what the device refuses (out of device memory, as `Full`).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use strata_cache_core::stats::{TierStats, TierStatsSnapshot};
use strata_cache_core::{Block, CacheError, CacheKey, Result, Tier, TierGet, TierKind};

use crate::device::DeviceBuffer;
use crate::error::GdsError;
use crate::ipc::{ClientMemory, IpcExport};
use crate::transfer::{blocking, TransferStats, Transfers};

pub struct GpuTier {
    transfers: Arc<Transfers>,
    capacity: u64,
    inner: Mutex<Inner>,
    stats: TierStats,
}

impl Drop for GpuTier {
    /// The tier goes with its owner's shutdown: the blocks it drops now need not be
    /// cleared on the device, and clients holding views of them keep their bytes.
    fn drop(&mut self) {
        self.transfers.device().retire();
    }
}

#[derive(Default)]
struct Inner {
    committed: u64,
    /// Bytes of puts whose copies are in flight.
    reserved: u64,
    map: HashMap<CacheKey, Entry>,
}

#[derive(Clone)]
struct Entry {
    /// None for an empty block (no device allocation).
    buf: Option<DeviceBuffer>,
    len: u64,
    crc: u32,
}

impl GpuTier {
    /// A tier of `capacity_bytes` on `transfers`'s device.
    pub fn new(transfers: Arc<Transfers>, capacity_bytes: u64) -> Self {
        GpuTier {
            transfers,
            capacity: capacity_bytes,
            inner: Mutex::new(Inner::default()),
            stats: TierStats::default(),
        }
    }

    pub fn transfers(&self) -> &Arc<Transfers> {
        &self.transfers
    }

    /// The transfer layer's stats (path, device, bytes moved).
    pub fn transfer_stats(&self) -> TransferStats {
        self.transfers.stats()
    }

    /// One line describing the device and the active transfer path.
    pub fn describe(&self) -> String {
        self.transfers.describe()
    }

    /// Drops everything after the device was lost: its memory is gone.
    fn device_lost(&self) {
        let mut inner = self.inner.lock();
        let dropped = std::mem::take(&mut inner.map);
        inner.committed = 0;
        drop(inner);
        // Freed outside the lock: freeing device memory is a driver call.
        if !dropped.is_empty() {
            tracing::warn!(
                dropped = dropped.len(),
                "gpu tier: device lost, all entries dropped"
            );
        }
    }

    fn check_device(&self) -> Result<()> {
        if self.transfers.device().is_lost() {
            self.device_lost();
            return Err(CacheError::Device("device lost".into()));
        }
        Ok(())
    }

    fn fail(&self, e: GdsError) -> CacheError {
        self.stats.error();
        if e.is_device_lost() || self.transfers.device().is_lost() {
            self.device_lost();
        }
        e.into()
    }

    fn entry(&self, key: &CacheKey) -> Option<Entry> {
        self.inner.lock().map.get(key).cloned()
    }

    /// The device allocation holding a block (for callers doing their own device work,
    /// and for fault-injection tests). None for a miss or an empty block.
    pub fn device_buffer(&self, key: &CacheKey) -> Option<DeviceBuffer> {
        self.entry(key).and_then(|e| e.buf)
    }

    /// Copies a resident block into a caller's device buffer (a GPU-side hit, e.g. into
    /// an inference transfers's KV buffer); returns false on a miss.
    pub async fn get_into_device(
        &self,
        key: &CacheKey,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<bool> {
        self.check_device()?;
        let Some(entry) = self.entry(key) else {
            self.stats.miss();
            return Ok(false);
        };
        if let Some(src) = entry.buf {
            let (transfers, dst) = (self.transfers.clone(), dst.clone());
            let len = entry.len as usize;
            blocking(move || transfers.device_to_device_blocking(&src, 0, &dst, dst_off, len))
                .await
                .map_err(|e| self.fail(e))?;
        }
        self.stats.hit(entry.len);
        Ok(true)
    }

    /// Moves a block down to `lower` (host memory or disk): read back and verified,
    /// stored below, then dropped here. If the lower put fails the block stays here.
    pub async fn demote(&self, key: &CacheKey, lower: &dyn Tier) -> Result<bool> {
        let block = match self.get(key).await? {
            TierGet::Hit(b) => b,
            TierGet::Miss | TierGet::Throttled => return Ok(false),
        };
        lower.put(key, block).await?;
        self.remove(key).await?;
        self.stats.evicted();
        Ok(true)
    }

    /// A miss filled from below (object store -> pinned staging -> device): fetches,
    /// stores, and returns the block so the caller can serve it.
    pub async fn fill_from<F>(&self, key: &CacheKey, fetch: F) -> Result<Block>
    where
        F: std::future::Future<Output = Result<Bytes>> + Send,
    {
        let block = Block::new(fetch.await?);
        self.put(key, block.clone()).await?;
        Ok(block)
    }

    /// What a client must receive before it can open this tier's handles (the emulated
    /// device's memory); None for CUDA, or a device without IPC.
    pub fn ipc_client_memory(&self) -> Option<ClientMemory<'_>> {
        self.transfers.device().ipc()?.client_memory()
    }

    /// Exports a resident block to a local client process (see [`crate::ipc`]); the
    /// export stays valid until the returned value is dropped: removing or evicting
    /// the key meanwhile drops it from the tier, but its device memory is freed (and
    /// reused) only when the last export of it is dropped.
    pub fn export_ipc(&self, key: &CacheKey) -> Result<Option<IpcExport>> {
        self.check_device()?;
        let Some(entry) = self.entry(key) else {
            return Ok(None);
        };
        let ipc = self
            .transfers
            .device()
            .ipc()
            .ok_or_else(|| CacheError::Device("device does not support IPC export".into()))?;
        let export = match &entry.buf {
            Some(buf) => ipc.export(buf, entry.crc),
            None => Ok(IpcExport::empty(
                self.transfers.device().info().kind,
                entry.crc,
            )),
        };
        export.map(Some).map_err(|e| self.fail(e))
    }
}

#[async_trait]
impl Tier for GpuTier {
    fn kind(&self) -> TierKind {
        TierKind::Gpu
    }

    fn name(&self) -> String {
        format!("gpu:{}", self.transfers.device().info().name)
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn used_bytes(&self) -> u64 {
        let inner = self.inner.lock();
        inner.committed + inner.reserved
    }

    async fn get(&self, key: &CacheKey) -> Result<TierGet> {
        self.check_device()?;
        let Some(entry) = self.entry(key) else {
            self.stats.miss();
            return Ok(TierGet::Miss);
        };
        let data = match &entry.buf {
            None => Bytes::new(),
            Some(buf) => {
                let (transfers, buf) = (self.transfers.clone(), buf.clone());
                let v = blocking(move || transfers.device_to_vec_blocking(&buf))
                    .await
                    .map_err(|e| self.fail(e))?;
                Bytes::from(v)
            }
        };
        match Block::from_stored(data, entry.crc) {
            Ok(block) => {
                self.stats.hit(block.len());
                Ok(TierGet::Hit(block))
            }
            Err(e) => {
                tracing::warn!(%key, error = %e, "gpu tier: corrupt block dropped");
                self.stats.error();
                let mut inner = self.inner.lock();
                let same = matches!(
                    (inner.map.get(key), &entry.buf),
                    (Some(Entry { buf: Some(now), .. }), Some(read)) if now.same_allocation(read)
                );
                if same {
                    if let Some(old) = inner.map.remove(key) {
                        inner.committed -= old.len;
                    }
                }
                Ok(TierGet::Miss)
            }
        }
    }

    async fn put(&self, key: &CacheKey, block: Block) -> Result<()> {
        self.check_device()?;
        let size = block.len();
        {
            let mut inner = self.inner.lock();
            if let Some(old) = inner.map.get(key) {
                if old.crc == block.crc() && old.len == size {
                    // Values are immutable: the same key with the same bytes is a no-op.
                    return Ok(());
                }
                let old_len = old.len;
                inner.map.remove(key);
                inner.committed -= old_len;
            }
            inner.reserved += size;
        }
        let copied = if size == 0 {
            Ok(None)
        } else {
            let transfers = self.transfers.clone();
            let data = block.data().clone();
            blocking(move || transfers.bytes_to_device_blocking(&data).map(Some)).await
        };
        let mut inner = self.inner.lock();
        inner.reserved -= size;
        match copied {
            Ok(buf) => {
                if self.transfers.device().is_lost() {
                    drop(inner);
                    self.device_lost();
                    self.stats.error();
                    return Err(CacheError::Device("device lost".into()));
                }
                let entry = Entry {
                    buf,
                    len: size,
                    crc: block.crc(),
                };
                if let Some(prev) = inner.map.insert(key.clone(), entry) {
                    inner.committed -= prev.len;
                }
                inner.committed += size;
                drop(inner);
                self.stats.wrote(size);
                Ok(())
            }
            Err(e) => {
                drop(inner);
                Err(self.fail(e))
            }
        }
    }

    async fn remove(&self, key: &CacheKey) -> Result<bool> {
        let mut inner = self.inner.lock();
        let removed = inner.map.remove(key);
        if let Some(e) = &removed {
            inner.committed -= e.len;
        }
        drop(inner);
        // The allocation is freed here, outside the lock (unless a copy still uses it).
        Ok(removed.is_some())
    }

    async fn contains(&self, key: &CacheKey) -> bool {
        self.inner.lock().map.contains_key(key)
    }

    fn resident(&self) -> Vec<(CacheKey, u64)> {
        self.inner
            .lock()
            .map
            .iter()
            .map(|(k, e)| (k.clone(), e.len))
            .collect()
    }

    fn stats(&self) -> TierStatsSnapshot {
        self.stats
            .snapshot(self.name(), self.used_bytes(), self.capacity)
    }
}
