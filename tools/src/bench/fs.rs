//! `strata bench fs`: the FUSE mount side by side with its ceilings, in one run.
//!
//! Dataset: `--files` files of `--file-size` random bytes in a local directory (fsync'd
//! so they can be evicted from the page cache). Measured, in this order:
//!
//! - **local**: the files read sequentially (1 MiB `read`s) straight from the local
//!   directory, page cache evicted first (`POSIX_FADV_DONTNEED`): local-disk speed.
//! - **null FUSE**: a do-nothing file system returning zeros for files of the same
//!   sizes, mounted with exactly Strata's options ([`strata_fs::null`]): the same
//!   sequential reads (page cache evicted first), and random 4 KiB `O_DIRECT` `pread`s
//!   from `--threads` threads for `--rand-secs`: the FUSE ceiling of this machine.
//!   Measured twice (before the Strata passes and after the warm ones); the better
//!   round is reported, so background load cannot flatter the ratios.
//! - **store direct**: every object read with 1 MiB ranged GETs, 16 in flight, through a
//!   `FaultyStore` that adds `--latency-ms` per request and shares `--bandwidth` (the
//!   cold store model), straight through `BackingStore`: the ceiling for cold reads.
//! - **cold**: the same sequential reads through a Strata mount (memory + disk tier,
//!   empty) over an identically configured `FaultyStore`.
//! - **warm** (second epoch): the page cache of the mount evicted, the files read again;
//!   the blocks come from Strata's memory tier. `second_epoch_vs_local` = warm time /
//!   local time. Then random 4 KiB `O_DIRECT` reads as on the null file system.
//! - **passthrough**: a second mount of the same warm cache with passthrough copies
//!   enabled (objects up to the file size); after one read of each file writes its copy,
//!   the sequential reads are repeated (page cache of the copies evicted too): reads then
//!   go from the kernel to the local copy without entering Strata.
//!
//! Throughputs are decimal GB/s (bytes / wall time).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use serde::Serialize;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore};
use strata_cache_core::{BackingStore, ObjectReader, RetryPolicy, StoreOptions};
use strata_fs::{MountOptions, PassthroughOptions};

use crate::config::{parse_size, CacheConfig, PrefetchMode};
use crate::daemon::open_core;

/// The cold store both fs benches put behind the mount: a `FaultyStore` adding latency
/// per request and sharing one bandwidth between all of them.
#[derive(Debug, Clone, clap::Args)]
pub struct ColdStoreArgs {
    /// Added latency per store request (20 ms: an S3 GET's first byte).
    #[arg(long, default_value_t = 20)]
    pub latency_ms: u64,
    /// Shared store bandwidth, e.g. 200MB (one client's sustained S3 throughput).
    #[arg(long, default_value = "200MB")]
    pub bandwidth: String,
}

impl ColdStoreArgs {
    pub fn bandwidth_bytes(&self) -> anyhow::Result<u64> {
        parse_size(&self.bandwidth)
    }

    pub fn fault_config(&self) -> anyhow::Result<FaultConfig> {
        Ok(FaultConfig {
            latency: Duration::from_millis(self.latency_ms),
            bandwidth_bytes_per_sec: Some(self.bandwidth_bytes()?),
            ..Default::default()
        })
    }
}

#[derive(Debug, clap::Args)]
pub struct FsArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Number of files. 8 x 128 MiB = 1 GiB: well beyond any single readahead window,
    /// small enough that the cold passes take ~5 s each at 200 MB/s.
    #[arg(long, default_value_t = 8, value_parser = super::at_least_one::<usize>)]
    pub files: usize,
    /// Size of each file.
    #[arg(long, default_value = "128MiB")]
    pub file_size: String,
    /// Seconds of each random-read measurement.
    #[arg(long, default_value_t = 3.0)]
    pub rand_secs: f64,
    /// Threads issuing random reads. 4: two per core here, enough to keep FUSE busy.
    #[arg(long, default_value_t = 4, value_parser = super::at_least_one::<usize>)]
    pub threads: usize,
    /// The cold store's latency and bandwidth.
    #[command(flatten)]
    pub store: ColdStoreArgs,
    /// Prefetching of the Strata mounts (as `strata mount --prefetch`).
    #[arg(long, value_enum, default_value_t = PrefetchMode::Predictors)]
    pub prefetch: PrefetchMode,
    /// Working directory (dataset, caches, mount points). Default: a temp dir.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct FsReport {
    pub null_fuse_seq_gbps: f64,
    pub null_fuse_rand_iops: f64,
    pub local_seq_gbps: f64,
    pub warm_seq_gbps: f64,
    pub warm_rand_iops: f64,
    pub cold_seq_gbps: f64,
    pub store_direct_seq_gbps: f64,
    pub second_epoch_vs_local: f64,
    pub warm_passthrough_seq_gbps: f64,
    pub warm_seq_vs_null: f64,
    pub warm_rand_vs_null: f64,
    pub cold_vs_direct: f64,
    pub dataset_bytes: u64,
    pub files: usize,
    pub latency_ms: u64,
    pub bandwidth_bytes_per_sec: u64,
    pub read_ahead_kb: u32,
    pub prefetch: String,
    /// Bytes the null fs / Strata served through FUSE during the seq passes: equal to
    /// the dataset when the page cache was really evicted (no page-cache hits).
    pub null_seq_fuse_bytes: u64,
    pub warm_seq_fuse_bytes: u64,
    /// Read requests Strata served in the warm sequential pass (the dataset over this
    /// is the mean request size: what per-request costs are spread over).
    pub warm_seq_fuse_reads: u64,
    /// The null fs replying from a 256 MiB buffer of distinct bytes instead of a hot
    /// zero buffer (`NullFs::with_spread`), better of two passes: the FUSE ceiling when
    /// each reply's bytes come from memory, as a cache's do.
    pub null_fuse_spread_seq_gbps: f64,
    pub warm_seq_vs_null_spread: f64,
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

fn evict(path: &Path) -> anyhow::Result<()> {
    let f = File::open(path).with_context(|| format!("open {}", path.display()))?;
    // SAFETY: valid fd; advice only affects the page cache.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(())
}

/// Reads every file once, sequentially with 1 MiB reads, after evicting its pages.
fn seq_read(dir: &Path, names: &[String]) -> anyhow::Result<(u64, Duration)> {
    for n in names {
        evict(&dir.join(n))?;
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let t = Instant::now();
    for n in names {
        let mut f = File::open(dir.join(n)).with_context(|| format!("open {n}"))?;
        loop {
            let k = f.read(&mut buf).with_context(|| format!("read {n}"))?;
            if k == 0 {
                break;
            }
            total += k as u64;
        }
    }
    Ok((total, t.elapsed()))
}

/// Random 4 KiB O_DIRECT preads over the files from `threads` threads for `secs`.
fn rand_read(
    dir: &Path,
    names: &[String],
    size: u64,
    threads: usize,
    secs: f64,
) -> anyhow::Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let mut files = Vec::new();
    for n in names {
        files.push(Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(dir.join(n))
                .with_context(|| format!("open O_DIRECT {n}"))?,
        ));
    }
    let pages = (size / 4096).max(1);
    let t = Instant::now();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let mut hs = Vec::new();
        for th in 0..threads.max(1) {
            let (stop, ops, files) = (stop.clone(), ops.clone(), files.clone());
            hs.push(s.spawn(move || -> std::io::Result<()> {
                // 4 KiB-aligned buffer for O_DIRECT.
                let mut raw = vec![0u8; 8192];
                let off = raw.as_ptr().align_offset(4096);
                let buf = &mut raw[off..off + 4096];
                let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ (th as u64 + 1);
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let f = &files[(x % files.len() as u64) as usize];
                        let page = (x >> 8) % pages;
                        f.read_at(buf, page * 4096)?;
                    }
                    ops.fetch_add(64, Ordering::Relaxed);
                }
                Ok(())
            }));
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
        }
        Ok(())
    })?;
    Ok(ops.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64())
}

/// A `file://` store at `root` behind a `FaultyStore` configured by `cfg`.
pub(super) fn faulty_store(root: &Path, cfg: FaultConfig) -> anyhow::Result<BackingStore> {
    let url = format!("file://{}", root.display());
    let base = BackingStore::from_url(&url, &StoreOptions::default())?;
    let faulty: Arc<dyn ObjectStore> = Arc::new(FaultyStore::new(base.inner().clone(), cfg));
    Ok(BackingStore::new(faulty, "faulty", RetryPolicy::default()))
}

/// A mountpoint for one of the bench's own mounts (released at a stop signal).
fn mountpoint(work: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let p = work.join(name);
    std::fs::create_dir_all(&p)?;
    crate::signals::own_mount(&p);
    Ok(p)
}

pub fn run(args: FsArgs) -> anyhow::Result<()> {
    let _log = crate::init_logging("warn");
    // The bench serves its mounts itself: a signal's default exit wedged it on them
    // (black-box finding); nothing here needs an orderly stop, so at once.
    crate::signals::catch().context("catching stop signals")?;
    crate::signals::exit_on_signal(Duration::ZERO).context("watching stop signals")?;
    let report = bench(&args)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let r = &report;
        outln!(
            "dataset: {} files, {} bytes; cold store: +{} ms, {} B/s",
            r.files,
            r.dataset_bytes,
            r.latency_ms,
            r.bandwidth_bytes_per_sec
        );
        outln!("{:<34}{:>12}", "measure", "value");
        for (k, v) in [
            ("null FUSE seq GB/s", r.null_fuse_seq_gbps),
            (
                "null FUSE seq, spread data GB/s",
                r.null_fuse_spread_seq_gbps,
            ),
            ("null FUSE rand 4K IOPS", r.null_fuse_rand_iops),
            ("local dir seq GB/s", r.local_seq_gbps),
            ("warm seq GB/s", r.warm_seq_gbps),
            ("warm rand 4K IOPS", r.warm_rand_iops),
            ("warm passthrough seq GB/s", r.warm_passthrough_seq_gbps),
            ("cold seq GB/s", r.cold_seq_gbps),
            ("store direct seq GB/s", r.store_direct_seq_gbps),
            ("warm seq / null", r.warm_seq_vs_null),
            ("warm seq / null spread", r.warm_seq_vs_null_spread),
            ("warm rand / null", r.warm_rand_vs_null),
            ("cold / direct", r.cold_vs_direct),
            ("second epoch / local time", r.second_epoch_vs_local),
        ] {
            outln!("{k:<34}{v:>12.3}");
        }
    }
    Ok(())
}

/// The benchmark's working directory: `dir` if given (created), else a temp dir that
/// lives as long as the returned guard.
pub(crate) fn work_dir(
    dir: Option<&std::path::Path>,
    prefix: &str,
) -> anyhow::Result<(std::path::PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            Ok((d.to_path_buf(), None))
        }
        None => {
            let t = tempfile::Builder::new().prefix(prefix).tempdir()?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}

pub fn bench(args: &FsArgs) -> anyhow::Result<FsReport> {
    let size = parse_size(&args.file_size)?;
    // Empty files measure nothing (the "IOPS" of reads that return at once at EOF).
    anyhow::ensure!(size > 0, "--file-size must be > 0");
    let bw = args.store.bandwidth_bytes()?;
    let (work, _tmp) = work_dir(args.dir.as_deref(), "strata-bench-fs-")?;
    if _tmp.is_some() {
        crate::signals::remove_on_signal(&work);
    }
    let data_dir = work.join("data");
    std::fs::create_dir_all(&data_dir)?;
    let names: Vec<String> = (0..args.files)
        .map(|i| format!("shard-{i:05}.bin"))
        .collect();
    let mut chunk = vec![0u8; 1 << 20];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for n in &names {
        let mut f = File::create(data_dir.join(n))?;
        let mut left = size;
        while left > 0 {
            for b in chunk.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let k = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..k])?;
            left -= k as u64;
        }
        f.sync_all()?;
    }
    let total = size * names.len() as u64;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mopts = |mut core: strata_fs::CoreOptions| MountOptions {
        core: {
            args.prefetch.apply(&mut core);
            core
        },
        runtime: Some(rt.handle().clone()),
        fsname: "strata-bench".into(),
        ..Default::default()
    };
    let read_ahead_kb = MountOptions::default().read_ahead_kb.unwrap_or(128);

    // Local directory.
    let (b, local_t) = seq_read(&data_dir, &names)?;
    let local_seq_gbps = gbps(b, local_t);

    // Null FUSE, same options.
    let null_mnt = mountpoint(&work, "null")?;
    // Kept mounted: measured again after the warm passes, and the better of the two
    // rounds is the ceiling (background load on this small machine moves both).
    // 256 MiB (at most the dataset): far beyond the last-level cache of the machines
    // this runs on.
    let null_fs = strata_fs::null::NullFs::new(names.iter().map(|n| (n.clone(), size)).collect())
        .with_spread((256usize << 20).min(total as usize));
    let null_served = null_fs.served();
    let null_spread = null_fs.spread_switch();
    let null_h = strata_fs::mount::mount_fs(null_fs, &null_mnt, &mopts(Default::default()))?;
    let (b, t) = seq_read(&null_mnt, &names)?;
    let null_seq_fuse_bytes = null_served.load(Ordering::Relaxed);
    let mut null_fuse_seq_gbps = gbps(b, t);
    let mut null_fuse_rand_iops = rand_read(&null_mnt, &names, size, args.threads, args.rand_secs)?;

    // Direct store reads under the cold model.
    let cold = args.store.fault_config()?;
    let store_direct_seq_gbps = {
        let store = faulty_store(&data_dir, cold.clone())?;
        let t = Instant::now();
        let mut bytes = 0u64;
        rt.block_on(async {
            for n in &names {
                let obj = store.head(n).await?;
                let ranges: Vec<_> = (0..obj.size.div_ceil(1 << 20))
                    .map(|i| (i << 20)..((i + 1) << 20).min(obj.size))
                    .collect();
                bytes += futures::stream::iter(ranges)
                    .map(|r| store.get_range(&obj, r))
                    .buffered(16)
                    .try_fold(0u64, |acc, b| async move { Ok(acc + b.len() as u64) })
                    .await?;
            }
            Ok::<_, anyhow::Error>(())
        })?;
        gbps(bytes, t.elapsed())
    };

    // Strata: cold, then warm (second epoch), then random.
    let cache_cfg = CacheConfig {
        dir: Some(work.join("cache")),
        memory: format!("{}", total * 2),
        disk: format!("{}", total * 2),
        ..Default::default()
    };
    let core = open_core(&cache_cfg)?;
    let store = faulty_store(&data_dir, cold)?;
    let strata_mnt = mountpoint(&work, "strata")?;
    let warm_seq_fuse_bytes;
    let warm_seq_fuse_reads;
    let (cold_seq_gbps, warm_seq_gbps, warm_t, warm_rand_iops) = {
        let reader = ObjectReader::new(core.engine.clone(), store.clone(), core.block_size)?;
        let h = rt.block_on(async {
            strata_fs::spawn(reader, "", &strata_mnt, mopts(Default::default()))
        })?;
        let (b, t) = seq_read(&strata_mnt, &names)?;
        let cold = gbps(b, t);
        let served = |h: &strata_fs::MountHandle| {
            h.core()
                .map(|c| c.counters().read_bytes.load(Ordering::Relaxed))
                .unwrap_or(0)
        };
        let reads = |h: &strata_fs::MountHandle| {
            h.core()
                .map(|c| c.counters().reads.load(Ordering::Relaxed))
                .unwrap_or(0)
        };
        let (before, reads_before) = (served(&h), reads(&h));
        let (b, warm_t) = seq_read(&strata_mnt, &names)?;
        warm_seq_fuse_bytes = served(&h) - before;
        warm_seq_fuse_reads = reads(&h) - reads_before;
        let warm = gbps(b, warm_t);
        let iops = rand_read(&strata_mnt, &names, size, args.threads, args.rand_secs)?;
        h.unmount()?;
        (cold, warm, warm_t, iops)
    };

    let (b, t) = seq_read(&null_mnt, &names)?;
    null_fuse_seq_gbps = null_fuse_seq_gbps.max(gbps(b, t));
    null_fuse_rand_iops = null_fuse_rand_iops.max(rand_read(
        &null_mnt,
        &names,
        size,
        args.threads,
        args.rand_secs,
    )?);
    null_spread.store(true, Ordering::Relaxed);
    let mut null_fuse_spread_seq_gbps = 0.0f64;
    for _ in 0..2 {
        let (b, t) = seq_read(&null_mnt, &names)?;
        null_fuse_spread_seq_gbps = null_fuse_spread_seq_gbps.max(gbps(b, t));
    }
    null_h.unmount()?;

    // Passthrough: same warm cache, copies enabled.
    let warm_passthrough_seq_gbps = {
        let reader = ObjectReader::new(core.engine.clone(), store, core.block_size)?;
        let mut pt = PassthroughOptions::open(work.join("cache").join("passthrough"), total * 2)?;
        pt.max_object = size;
        let opts = mopts(strata_fs::CoreOptions {
            passthrough: Some(pt),
            ..Default::default()
        });
        let h = rt.block_on(async { strata_fs::spawn(reader, "", &strata_mnt, opts) })?;
        seq_read(&strata_mnt, &names)?; // writes the copies
        let deadline = Instant::now() + Duration::from_secs(60);
        let copies = |h: &strata_fs::MountHandle| {
            h.core()
                .map(|c| c.counters().passthrough_copies.load(Ordering::Relaxed))
                .unwrap_or(0)
        };
        while copies(&h) < names.len() as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // Evict the copies too: the kernel reads them from the disk, like the local pass.
        for e in std::fs::read_dir(work.join("cache").join("passthrough"))? {
            let p = e?.path();
            File::open(&p)?.sync_all()?; // dirty pages cannot be evicted
            evict(&p)?;
        }
        let (b, t) = seq_read(&strata_mnt, &names)?;
        let opened = h
            .core()
            .map(|c| c.counters().passthrough_opens.load(Ordering::Relaxed))
            .unwrap_or(0);
        if opened < names.len() as u64 {
            tracing::warn!(opened, "not every file was opened in passthrough");
        }
        h.unmount()?;
        gbps(b, t)
    };
    drop(core);

    Ok(FsReport {
        null_fuse_seq_gbps,
        null_fuse_rand_iops,
        local_seq_gbps,
        warm_seq_gbps,
        warm_rand_iops,
        cold_seq_gbps,
        store_direct_seq_gbps,
        second_epoch_vs_local: warm_t.as_secs_f64() / local_t.as_secs_f64().max(1e-9),
        warm_passthrough_seq_gbps,
        warm_seq_vs_null: warm_seq_gbps / null_fuse_seq_gbps.max(1e-12),
        warm_rand_vs_null: warm_rand_iops / null_fuse_rand_iops.max(1e-12),
        cold_vs_direct: cold_seq_gbps / store_direct_seq_gbps.max(1e-12),
        dataset_bytes: total,
        files: names.len(),
        latency_ms: args.store.latency_ms,
        bandwidth_bytes_per_sec: bw,
        read_ahead_kb,
        prefetch: format!("{:?}", args.prefetch).to_lowercase(),
        null_seq_fuse_bytes,
        warm_seq_fuse_bytes,
        warm_seq_fuse_reads,
        null_fuse_spread_seq_gbps,
        warm_seq_vs_null_spread: warm_seq_gbps / null_fuse_spread_seq_gbps.max(1e-12),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny run end to end: every figure is measured (positive) and the JSON has the
    /// fields the issue names.
    #[test]
    fn tiny_bench_produces_every_figure() {
        let args = FsArgs {
            json: true,
            files: 2,
            file_size: "3MiB".into(),
            rand_secs: 0.2,
            threads: 2,
            store: ColdStoreArgs {
                latency_ms: 1,
                bandwidth: "1GB".into(),
            },
            prefetch: PrefetchMode::Predictors,
            dir: None,
        };
        let r = bench(&args).expect("bench");
        let v = serde_json::to_value(&r).expect("json");
        for k in [
            "null_fuse_seq_gbps",
            "null_fuse_rand_iops",
            "local_seq_gbps",
            "warm_seq_gbps",
            "warm_rand_iops",
            "cold_seq_gbps",
            "store_direct_seq_gbps",
            "second_epoch_vs_local",
            "null_fuse_spread_seq_gbps",
        ] {
            assert!(v[k].as_f64().expect(k) > 0.0, "{k} = {}", v[k]);
        }
    }
}
