//! The staged-copy benchmark behind `strata bench gds`: disk -> pinned bounce buffer ->
//! (emulated) device, next to its two ceilings measured in the same run on the same
//! file: raw `O_DIRECT` sequential reads (the disk) and memcpy (the emulated device's
//! host-to-device copy). Staging overlaps the two, so its target is the slower ceiling.
//! Lives here (not in the CLI) so tests and examples can run it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use strata_cache_core::testdata::fill_xorshift;

use crate::device::Device;
use crate::emulated::EmulatedDevice;
use crate::error::{GdsError, Result};
use crate::file::{DirectFile, ReadAt};
use crate::transfer::{TransferConfig, Transfers};

/// What to measure.
#[derive(Clone, Debug)]
pub struct StagedBenchConfig {
    /// Directory for the test file; must be on a real disk for O_DIRECT (tmpfs is not).
    pub dir: PathBuf,
    pub size_bytes: u64,
    pub chunk_bytes: usize,
    pub depth: usize,
    /// Measured runs of each of the three (interleaved); medians are reported.
    pub runs: usize,
}

/// Results; throughputs in GB/s (1e9 bytes per second).
#[derive(Clone, Debug, serde::Serialize)]
pub struct StagedBenchReport {
    pub staged_gbps: f64,
    pub memcpy_gbps: f64,
    pub disk_gbps: f64,
    /// staged / min(memcpy, disk), from the medians.
    pub ratio_to_ceiling: f64,
    /// The same ratio within each interleaved run (less exposed to load drifting
    /// between runs); its median.
    pub ratio_per_run_median: f64,
    pub ceiling: &'static str,
    pub size_bytes: u64,
    pub chunk_bytes: usize,
    pub depth: usize,
    pub runs: usize,
    pub direct_io: bool,
    pub path: &'static str,
    pub verified: bool,
    pub staged_runs_gbps: Vec<f64>,
    pub memcpy_runs_gbps: Vec<f64>,
    pub disk_runs_gbps: Vec<f64>,
    /// The transfer layer's counters after the run (path, O_DIRECT fallbacks, bytes).
    pub transfer: crate::transfer::TransferStats,
    /// 1-minute load average before and after (other work on the machine skews all
    /// three figures; the ratios are the robust part).
    pub loadavg_before: f64,
    pub loadavg_after: f64,
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// Removes the test file when the benchmark ends, however it ends.
struct TestFile(PathBuf);

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn write_test_file(dir: &Path, size: u64, chunk: usize) -> Result<(TestFile, u32)> {
    let path = dir.join(format!("strata-gds-bench-{}.bin", std::process::id()));
    let guard = TestFile(path.clone());
    let mut f = File::create(&path)?;
    let mut block = vec![0u8; chunk];
    let (mut crc, mut written, mut i) = (0u32, 0u64, 0u64);
    while written < size {
        let n = chunk.min((size - written) as usize);
        fill_xorshift(&mut block[..n], i);
        crc = crc32c::crc32c_append(crc, &block[..n]);
        f.write_all(&block[..n])?;
        written += n as u64;
        i += 1;
    }
    // Synced, so O_DIRECT reads go to the disk.
    f.sync_all()?;
    Ok((guard, crc))
}

/// Runs the benchmark (see the module docs).
pub fn staged_copy_bench(cfg: &StagedBenchConfig) -> Result<StagedBenchReport> {
    if cfg.size_bytes == 0 || cfg.chunk_bytes == 0 || cfg.runs == 0 {
        return Err(GdsError::InvalidRange(
            "size, chunk and runs must be positive".into(),
        ));
    }
    let size = cfg.size_bytes;
    let chunk = cfg.chunk_bytes;
    let loadavg_before = loadavg();
    let (file, crc) = write_test_file(&cfg.dir, size, chunk)?;
    let path = file.0.clone();

    let dev = Arc::new(EmulatedDevice::try_new(size + (64 << 20))?);
    let transfers = Transfers::new(
        dev.clone(),
        TransferConfig {
            chunk_bytes: chunk,
            depth: cfg.depth,
            streams: 1,
            max_staging_buffers: cfg.depth.max(1),
            force_compat: false,
        },
    )?;
    let len = usize::try_from(size).map_err(|_| GdsError::InvalidRange("size".into()))?;
    let dst = dev.alloc(len)?;
    let direct = DirectFile::open(&path)?;

    // memcpy ceiling: a filled source into a touched destination, like the emulated
    // device's resident memory.
    let mut src = vec![0u8; len];
    fill_xorshift(&mut src, 99);
    let mut sink = vec![1u8; len];

    // Warm-up: faults in the device buffer and staging, and checks the bytes.
    transfers.read_into_device_blocking(&path, 0, size, &dst, 0)?;
    let verified = crc32c::crc32c(&dev.read_raw(&dst)?) == crc;
    if !verified {
        return Err(GdsError::Corrupt(
            "staged copy does not match the file".into(),
        ));
    }

    let (mut staged_runs, mut memcpy_runs, mut disk_runs) = (Vec::new(), Vec::new(), Vec::new());
    let mut rbuf = dev.alloc_pinned(chunk)?;
    for run in 0..cfg.runs {
        // Alternate the order so neither ceiling always runs right before staging.
        let order: [u8; 3] = if run % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for which in order {
            match which {
                0 => {
                    // Raw O_DIRECT sequential reads, same request size, one thread.
                    let t = Instant::now();
                    let mut off = 0u64;
                    while off < size {
                        let n = direct.read_at(rbuf.as_mut_slice(), off)?;
                        if n == 0 {
                            return Err(GdsError::ShortRead {
                                offset: off,
                                expected: size,
                                got: off,
                            });
                        }
                        off += n as u64;
                    }
                    disk_runs.push(gbps(size, t.elapsed().as_secs_f64()));
                }
                1 => {
                    // memcpy, chunk by chunk, one thread.
                    let t = Instant::now();
                    for (d, s) in sink.chunks_mut(chunk).zip(src.chunks(chunk)) {
                        d.copy_from_slice(s);
                    }
                    std::hint::black_box(&sink);
                    memcpy_runs.push(gbps(size, t.elapsed().as_secs_f64()));
                }
                _ => {
                    // The staged pipeline: O_DIRECT reads into pinned buffers
                    // overlapping the copies.
                    let t = Instant::now();
                    transfers.read_into_device_blocking(&path, 0, size, &dst, 0)?;
                    staged_runs.push(gbps(size, t.elapsed().as_secs_f64()));
                }
            }
        }
    }

    let per_run: Vec<f64> = staged_runs
        .iter()
        .zip(&memcpy_runs)
        .zip(&disk_runs)
        .map(|((s, m), d)| s / m.min(*d))
        .collect();
    let (staged, memcpy, disk) = (
        median(&staged_runs),
        median(&memcpy_runs),
        median(&disk_runs),
    );
    let (ceiling_val, ceiling) = if disk <= memcpy {
        (disk, "disk")
    } else {
        (memcpy, "memcpy")
    };
    Ok(StagedBenchReport {
        staged_gbps: staged,
        memcpy_gbps: memcpy,
        disk_gbps: disk,
        ratio_to_ceiling: staged / ceiling_val,
        ratio_per_run_median: median(&per_run),
        ceiling,
        size_bytes: size,
        chunk_bytes: chunk,
        depth: transfers.config().depth,
        runs: cfg.runs,
        direct_io: direct.is_direct(),
        path: transfers.path().as_str(),
        verified,
        staged_runs_gbps: staged_runs,
        memcpy_runs_gbps: memcpy_runs,
        disk_runs_gbps: disk_runs,
        transfer: transfers.stats(),
        loadavg_before,
        loadavg_after: loadavg(),
    })
}
