//! Transfers between disk, host, object store and device, and the choice of path.
//!
//! Three paths ([`TransferPath`]):
//! - **GdsDirect**: cuFile DMA's NVMe blocks straight into device memory (GPUDirect
//!   Storage). Chosen when built with the `cuda` feature, `libcufile` loads and its
//!   driver opens; a file cuFile cannot register (unsupported file system) falls back
//!   to the compat path for that read and is counted.
//! - **CompatBounce**: what cuFile's compat mode and kvikio do: `O_DIRECT` reads into
//!   pinned staging buffers, then host -> device copies, split into chunks and
//!   pipelined over `depth` buffers, so the disk read of chunk *i+1* overlaps the copy of
//!   chunk *i* (the copy runs on the stream's worker while the caller reads).
//! - **Emulated**: the compat pipeline with the host-emulated device as the target.
//!
//! The choice is a pure function of what was probed ([`select_path`]), so it is tested
//! without GPUs. Host -> device copies of in-memory bytes (object-store misses, tier
//! puts) and device -> host copies (tier reads, demotion) use the same chunked,
//! pipelined staging.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::device::{
    Device, DeviceBuffer, DeviceCopy, DeviceInfo, DeviceKind, DeviceStream, Done, Pending,
    PinnedBuffer,
};
use crate::error::{GdsError, Result};
use crate::file::{DirectFile, ReadAt};
use crate::pool::PinnedPool;

/// Which path disk -> device reads take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferPath {
    GdsDirect,
    CompatBounce,
    Emulated,
}

impl TransferPath {
    pub fn as_str(&self) -> &'static str {
        match self {
            TransferPath::GdsDirect => "gds-direct",
            TransferPath::CompatBounce => "compat-bounce",
            TransferPath::Emulated => "emulated",
        }
    }
}

/// NVMe -> device DMA (cuFile), supplied by a device backend that has it.
pub trait DirectStorage: Send + Sync {
    fn name(&self) -> String;
    /// Registers a file; fails where the file system or platform does not allow DMA.
    fn open(&self, path: &Path) -> Result<Box<dyn DirectFileHandle>>;
}

/// One registered file.
pub trait DirectFileHandle: Send + Sync {
    /// Reads `len` bytes at `file_off` into `dst[dst_off..]`; returns bytes read.
    fn read_into(
        &self,
        file_off: u64,
        len: usize,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<usize>;
}

/// What was probed about direct storage on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirectProbe {
    /// cuFile's driver opened.
    Ready,
    /// Not available, and why (not built with `cuda`, no libcufile, driver refused...).
    Unavailable(String),
}

/// Chooses the transfer path from the probe results (no I/O here).
pub fn select_path(
    kind: DeviceKind,
    probe: &DirectProbe,
    force_compat: bool,
) -> (TransferPath, String) {
    match (kind, probe) {
        (DeviceKind::Emulated, _) => (
            TransferPath::Emulated,
            "host-emulated device: disk reads bounce through staging buffers".into(),
        ),
        (DeviceKind::Cuda, _) if force_compat => (
            TransferPath::CompatBounce,
            "compat mode forced by configuration".into(),
        ),
        (DeviceKind::Cuda, DirectProbe::Ready) => (
            TransferPath::GdsDirect,
            "cuFile driver open: NVMe -> GPU DMA".into(),
        ),
        (DeviceKind::Cuda, DirectProbe::Unavailable(why)) => (
            TransferPath::CompatBounce,
            format!("GPUDirect Storage unavailable ({why}): O_DIRECT reads into pinned buffers"),
        ),
    }
}

/// Tuning of the staging pipeline.
#[derive(Clone, Debug)]
pub struct TransferConfig {
    /// Bytes per staged chunk. 4 MiB: kvikio's task size; large enough that per-chunk
    /// costs (a syscall, a copy submission, ~10 us) stay a few percent of the chunk's
    /// time at NVMe and PCIe rates, small enough that a double buffer is cheap in
    /// pinned memory.
    pub chunk_bytes: usize,
    /// Staging buffers per transfer. 2 is double buffering (read one chunk while the
    /// previous one is copied); a third absorbs jitter between the two stages.
    pub depth: usize,
    /// Copy streams (worker threads) shared round-robin by concurrent transfers. 2 lets
    /// a read-back and a write overlap without more threads than this tier needs.
    pub streams: usize,
    /// Staging buffers in the pool: enough for `streams` transfers at full depth.
    pub max_staging_buffers: usize,
    /// Use the compat path even when cuFile is available (for comparison, or where
    /// GDS is known to misbehave).
    pub force_compat: bool,
}

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            chunk_bytes: 4 << 20,
            depth: 3,
            streams: 2,
            max_staging_buffers: 6,
            force_compat: false,
        }
    }
}

#[derive(Default)]
struct Counters {
    h2d_bytes: AtomicU64,
    d2h_bytes: AtomicU64,
    d2d_bytes: AtomicU64,
    file_bytes: AtomicU64,
    direct_reads: AtomicU64,
    compat_reads: AtomicU64,
    direct_fallbacks: AtomicU64,
    buffered_files: AtomicU64,
    errors: AtomicU64,
}

/// A point-in-time view of the transfer layer, for `strata stats`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TransferStats {
    pub path: TransferPath,
    pub path_reason: String,
    pub device: DeviceInfo,
    pub device_allocated_bytes: u64,
    pub device_lost: bool,
    pub chunk_bytes: usize,
    pub depth: usize,
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
    pub d2d_bytes: u64,
    pub file_to_device_bytes: u64,
    pub direct_reads: u64,
    pub compat_reads: u64,
    /// Reads that wanted GdsDirect but whose file cuFile refused.
    pub direct_fallbacks: u64,
    /// Files read through the page cache because O_DIRECT was refused.
    pub buffered_files: u64,
    pub errors: u64,
}

/// Moves bytes to and from one device.
pub struct Transfers {
    device: Arc<dyn Device>,
    streams: Vec<DeviceStream>,
    next_stream: AtomicUsize,
    pool: PinnedPool,
    config: TransferConfig,
    path: TransferPath,
    path_reason: String,
    direct: Option<Arc<dyn DirectStorage>>,
    counters: Counters,
}

impl std::fmt::Debug for Transfers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Puts a completed copy's buffer back in `free`; returns the copy's result.
fn reclaim(done: Done<PinnedBuffer>, free: &mut Vec<PinnedBuffer>, lost: &mut usize) -> Result<()> {
    match done.value {
        Some(b) => free.push(b),
        None => *lost += 1,
    }
    done.result
}

/// In-flight copies of one transfer and the buffers not in flight.
struct Staging<'a> {
    pool: &'a PinnedPool,
    free: Vec<PinnedBuffer>,
    inflight: VecDeque<Pending<PinnedBuffer>>,
    lost: usize,
}

impl<'a> Staging<'a> {
    fn new(pool: &'a PinnedPool, depth: usize) -> Result<Self> {
        Ok(Staging {
            free: pool.take(depth)?,
            pool,
            inflight: VecDeque::new(),
            lost: 0,
        })
    }

    /// A free buffer, waiting for the oldest copy if all are in flight.
    fn next(&mut self) -> Result<PinnedBuffer> {
        loop {
            if let Some(b) = self.free.pop() {
                return Ok(b);
            }
            let Some(p) = self.inflight.pop_front() else {
                return Err(GdsError::InvalidRange("no staging buffer".into()));
            };
            reclaim(p.wait(), &mut self.free, &mut self.lost)?;
        }
    }

    /// Waits for every copy; returns the first error.
    fn drain(&mut self) -> Result<()> {
        let mut first = Ok(());
        while let Some(p) = self.inflight.pop_front() {
            let r = reclaim(p.wait(), &mut self.free, &mut self.lost);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        // Never hand back a buffer a copy may still be using.
        let _ = self.drain();
        self.pool.give(std::mem::take(&mut self.free), self.lost);
    }
}

/// Reads `needed` bytes (at least) into `buf` at file offset `pos`, tolerating partial
/// reads; fails with `ShortRead` if the source ends first.
fn fill(src: &dyn ReadAt, buf: &mut [u8], pos: u64, needed: usize) -> Result<usize> {
    let align = src.alignment().max(1);
    let mut filled = 0;
    while filled < needed {
        let n = src.read_at(&mut buf[filled..], pos + filled as u64)?;
        if n == 0 {
            break;
        }
        filled += n;
        // An O_DIRECT read that stops off a block boundary is at end of file; reading
        // on from an unaligned offset would fail with EINVAL.
        if align > 1 && filled % align != 0 {
            break;
        }
    }
    if filled < needed {
        return Err(GdsError::ShortRead {
            offset: pos + filled as u64,
            expected: needed as u64,
            got: filled as u64,
        });
    }
    Ok(filled)
}

impl Transfers {
    /// Sets up streams and staging for `device` and selects the transfer path.
    pub fn new(device: Arc<dyn Device>, config: TransferConfig) -> Result<Arc<Self>> {
        if config.chunk_bytes == 0
            || !config
                .chunk_bytes
                .is_multiple_of(crate::device::STAGING_ALIGN)
        {
            return Err(GdsError::InvalidRange(format!(
                "chunk_bytes {} must be a non-zero multiple of {}",
                config.chunk_bytes,
                crate::device::STAGING_ALIGN
            )));
        }
        let info = device.info();
        let (direct, probe) = match info.kind {
            DeviceKind::Cuda if !config.force_compat => match device.direct_storage() {
                Ok(d) => (Some(d), DirectProbe::Ready),
                Err(why) => (None, DirectProbe::Unavailable(why)),
            },
            DeviceKind::Cuda => (None, DirectProbe::Unavailable("not probed".into())),
            DeviceKind::Emulated => (None, DirectProbe::Unavailable("emulated device".into())),
        };
        let (path, path_reason) = select_path(info.kind, &probe, config.force_compat);
        let direct = if path == TransferPath::GdsDirect {
            direct
        } else {
            None
        };
        let streams = (0..config.streams.max(1))
            .map(|_| device.new_stream())
            .collect::<Result<Vec<_>>>()?;
        let depth = config.depth.max(1);
        let pool = PinnedPool::new(
            device.clone(),
            config.chunk_bytes,
            config.max_staging_buffers.max(depth),
        );
        tracing::info!(path = path.as_str(), reason = %path_reason, "gds transfer path");
        Ok(Arc::new(Transfers {
            device,
            streams,
            next_stream: AtomicUsize::new(0),
            pool,
            config: TransferConfig { depth, ..config },
            path,
            path_reason,
            direct,
            counters: Counters::default(),
        }))
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    pub fn path(&self) -> TransferPath {
        self.path
    }

    pub fn config(&self) -> &TransferConfig {
        &self.config
    }

    fn stream(&self) -> &DeviceStream {
        let i = self.next_stream.fetch_add(1, Ordering::Relaxed) % self.streams.len();
        &self.streams[i]
    }

    fn count<T>(&self, r: Result<T>, counter: &AtomicU64, bytes: u64) -> Result<T> {
        match &r {
            Ok(_) => {
                counter.fetch_add(bytes, Ordering::Relaxed);
            }
            Err(_) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }

    /// Allocates device memory.
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        self.device.alloc(len)
    }

    /// Reads `len` bytes of `src` at `offset` into `dst[dst_off..]` through the staging
    /// pipeline. On error the destination range holds unspecified bytes.
    pub fn read_from_into_device_blocking(
        &self,
        src: &dyn ReadAt,
        offset: u64,
        len: u64,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<u64> {
        let r = self.staged_file_read(src, offset, len, dst, dst_off);
        self.counters.compat_reads.fetch_add(1, Ordering::Relaxed);
        self.count(r, &self.counters.file_bytes, len)
    }

    fn staged_file_read(
        &self,
        src: &dyn ReadAt,
        offset: u64,
        len: u64,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<u64> {
        let len_us = usize::try_from(len)
            .map_err(|_| GdsError::InvalidRange(format!("length {len} too large")))?;
        dst.check_range(dst_off, len_us)?;
        if len == 0 {
            return Ok(0);
        }
        let align = src.alignment().max(1) as u64;
        let chunk = self.pool.chunk() as u64;
        if !chunk.is_multiple_of(align) {
            return Err(GdsError::InvalidRange(format!(
                "chunk {chunk} is not a multiple of the file's alignment {align}"
            )));
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| GdsError::InvalidRange("offset + len overflows".into()))?;
        let stream = self.stream();
        let mut staging = Staging::new(&self.pool, self.config.depth)?;
        let mut pos = offset - offset % align;
        let mut dev = dst_off;
        while pos < end {
            let want_end = end.min(pos + chunk);
            let read_len = align_up(want_end - pos, align) as usize;
            let needed = (want_end - pos) as usize;
            let mut buf = staging.next()?;
            let filled = fill(src, &mut buf.as_mut_slice()[..read_len], pos, needed);
            if let Err(e) = filled {
                staging.free.push(buf);
                return Err(e);
            }
            let skip = offset.saturating_sub(pos) as usize;
            staging
                .inflight
                .push_back(stream.htod(buf, skip..needed, dst, dev));
            dev += needed - skip;
            pos += read_len as u64;
        }
        staging.drain()?;
        Ok(len)
    }

    /// Reads a byte range of a file into a device buffer (kvikio's `pread` into device
    /// memory): cuFile when the GdsDirect path is active and the file registers,
    /// otherwise the staged compat pipeline.
    pub fn read_into_device_blocking(
        &self,
        path: &Path,
        offset: u64,
        len: u64,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<u64> {
        if let Some(direct) = &self.direct {
            match direct.open(path) {
                Ok(handle) => {
                    let len_us = usize::try_from(len)
                        .map_err(|_| GdsError::InvalidRange(format!("length {len} too large")))?;
                    dst.check_range(dst_off, len_us)?;
                    self.counters.direct_reads.fetch_add(1, Ordering::Relaxed);
                    let r = handle
                        .read_into(offset, len_us, dst, dst_off)
                        .and_then(|n| {
                            if n < len_us {
                                Err(GdsError::ShortRead {
                                    offset: offset + n as u64,
                                    expected: len,
                                    got: n as u64,
                                })
                            } else {
                                Ok(len)
                            }
                        });
                    return self.count(r, &self.counters.file_bytes, len);
                }
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "cuFile refused the file; compat read");
                    self.counters
                        .direct_fallbacks
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let file = DirectFile::open(path)?;
        if !file.is_direct() {
            self.counters.buffered_files.fetch_add(1, Ordering::Relaxed);
        }
        self.read_from_into_device_blocking(&file, offset, len, dst, dst_off)
    }

    /// Async form of [`Self::read_into_device_blocking`] (runs on the blocking pool).
    pub async fn read_into_device(
        self: &Arc<Self>,
        path: PathBuf,
        offset: u64,
        len: u64,
        dst: DeviceBuffer,
        dst_off: usize,
    ) -> Result<u64> {
        let me = self.clone();
        blocking(move || me.read_into_device_blocking(&path, offset, len, &dst, dst_off)).await
    }

    /// Copies host bytes to `dst[dst_off..]` through pinned staging (chunked, so the
    /// memcpy into one staging buffer overlaps the device copy of the previous one).
    pub fn host_to_device_blocking(
        &self,
        src: &[u8],
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<()> {
        let r = self.staged_h2d(src, dst, dst_off);
        self.count(r, &self.counters.h2d_bytes, src.len() as u64)
    }

    fn staged_h2d(&self, src: &[u8], dst: &DeviceBuffer, dst_off: usize) -> Result<()> {
        dst.check_range(dst_off, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let stream = self.stream();
        let mut staging = Staging::new(&self.pool, self.config.depth)?;
        for (i, piece) in src.chunks(self.pool.chunk()).enumerate() {
            let mut buf = staging.next()?;
            buf.as_mut_slice()[..piece.len()].copy_from_slice(piece);
            let at = dst_off + i * self.pool.chunk();
            staging
                .inflight
                .push_back(stream.htod(buf, 0..piece.len(), dst, at));
        }
        staging.drain()
    }

    /// Copies `src[src_off..src_off+out.len()]` to host memory through pinned staging.
    pub fn device_to_host_blocking(
        &self,
        src: &DeviceBuffer,
        src_off: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let n = out.len() as u64;
        let r = self.staged_d2h(src, src_off, out);
        self.count(r, &self.counters.d2h_bytes, n)
    }

    fn staged_d2h(&self, src: &DeviceBuffer, src_off: usize, out: &mut [u8]) -> Result<()> {
        src.check_range(src_off, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let chunk = self.pool.chunk();
        let stream = self.stream();
        let mut staging = Staging::new(&self.pool, self.config.depth)?;
        // (out offset, length) of each copy in flight, in submission order.
        let mut spans: VecDeque<(usize, usize)> = VecDeque::new();
        let mut pos = 0;
        while pos < out.len() || !staging.inflight.is_empty() {
            let can_submit = pos < out.len() && !staging.free.is_empty();
            if can_submit {
                let n = chunk.min(out.len() - pos);
                let buf = staging.next()?;
                staging
                    .inflight
                    .push_back(stream.dtoh(src, src_off + pos, buf, 0..n));
                spans.push_back((pos, n));
                pos += n;
                continue;
            }
            let (Some(p), Some((at, n))) = (staging.inflight.pop_front(), spans.pop_front()) else {
                break;
            };
            let done = p.wait();
            if let Some(b) = &done.value {
                if done.result.is_ok() {
                    out[at..at + n].copy_from_slice(&b.as_slice()[..n]);
                }
            }
            reclaim(done, &mut staging.free, &mut staging.lost)?;
        }
        Ok(())
    }

    /// Device -> device copy (a GPU-tier hit delivered into a caller's buffer).
    pub fn device_to_device_blocking(
        &self,
        src: &DeviceBuffer,
        src_off: usize,
        dst: &DeviceBuffer,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        let copy = DeviceCopy {
            src,
            src_off,
            dst,
            dst_off,
            len,
        };
        let r = self.stream().dtod(copy).wait().result;
        self.count(r, &self.counters.d2d_bytes, len as u64)
    }

    /// Object store -> pinned -> device: allocates a device buffer for `data` and copies
    /// it in. On failure nothing stays allocated.
    pub fn bytes_to_device_blocking(&self, data: &[u8]) -> Result<DeviceBuffer> {
        let buf = self.device.alloc(data.len())?;
        self.host_to_device_blocking(data, &buf, 0)?;
        Ok(buf)
    }

    /// Fetches bytes (an object-store GET on a miss) and lands them in device memory.
    pub async fn fetch_to_device<F>(self: &Arc<Self>, fetch: F) -> Result<DeviceBuffer>
    where
        F: std::future::Future<Output = Result<Bytes>>,
    {
        let data = fetch.await?;
        let me = self.clone();
        blocking(move || me.bytes_to_device_blocking(&data)).await
    }

    /// Copies a whole device buffer back to host memory.
    pub fn device_to_vec_blocking(&self, src: &DeviceBuffer) -> Result<Vec<u8>> {
        let mut out = vec![0u8; src.len()];
        self.device_to_host_blocking(src, 0, &mut out)?;
        Ok(out)
    }

    pub fn stats(&self) -> TransferStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TransferStats {
            path: self.path,
            path_reason: self.path_reason.clone(),
            device: self.device.info(),
            device_allocated_bytes: self.device.allocated_bytes(),
            device_lost: self.device.is_lost(),
            chunk_bytes: self.config.chunk_bytes,
            depth: self.config.depth,
            h2d_bytes: l(&c.h2d_bytes),
            d2h_bytes: l(&c.d2h_bytes),
            d2d_bytes: l(&c.d2d_bytes),
            file_to_device_bytes: l(&c.file_bytes),
            direct_reads: l(&c.direct_reads),
            compat_reads: l(&c.compat_reads),
            direct_fallbacks: l(&c.direct_fallbacks),
            buffered_files: l(&c.buffered_files),
            errors: l(&c.errors),
        }
    }

    /// One line for `strata stats`: device, path and why.
    pub fn describe(&self) -> String {
        let info = self.device.info();
        format!(
            "gpu: {:?} device `{}` #{} ({} MiB limit), transfer path {} ({}), {} x {} KiB staging",
            info.kind,
            info.name,
            info.ordinal,
            info.memory_limit >> 20,
            self.path.as_str(),
            self.path_reason,
            self.config.depth,
            self.config.chunk_bytes >> 10
        )
    }
}

/// Runs blocking transfer work on tokio's blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| GdsError::Io(std::io::Error::other(format!("transfer task failed: {e}"))))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_selection() {
        let ready = DirectProbe::Ready;
        let missing = DirectProbe::Unavailable("libcufile.so not found".into());
        assert_eq!(
            select_path(DeviceKind::Emulated, &ready, false).0,
            TransferPath::Emulated
        );
        assert_eq!(
            select_path(DeviceKind::Cuda, &ready, false).0,
            TransferPath::GdsDirect
        );
        assert_eq!(
            select_path(DeviceKind::Cuda, &ready, true).0,
            TransferPath::CompatBounce
        );
        let (p, why) = select_path(DeviceKind::Cuda, &missing, false);
        assert_eq!(p, TransferPath::CompatBounce);
        assert!(why.contains("libcufile.so not found"), "{why}");
    }
}
