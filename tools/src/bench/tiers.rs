//! `strata bench tiers`: get throughput and p50/p99 latency of each cache tier for
//! 4 KiB, 1 MiB and 16 MiB values, each next to its physical ceiling measured in the
//! same run on the same data sizes:
//!
//! - **memory**: a `MemoryTier` hit *copied into a caller's buffer* (a hit alone is a
//!   reference-count bump; a reader such as FUSE must copy the bytes out), against
//!   `memcpy` of the same size from the same number of distinct sources;
//! - **disk**: a `DiskTier` hit (open-descriptor cache, one aligned read of header and
//!   data, header and crc32c checks), against raw `pread`s of same-sized, aligned
//!   ranges of one file in the same directory. Both use `O_DIRECT` when the file system
//!   allows it (reported as `o_direct`), so neither is served by the page cache;
//! - **store**: `BackingStore::get_range` (retry/timeout policy, `If-Match` on the
//!   version) against direct `object_store` `LocalFileSystem::get_range` of the same
//!   ranges. Both go through the page cache (the files were just written).
//!
//! Gets run one at a time (queue depth 1), round-robin over a working set of distinct
//! keys, after a warm-up; ceiling and tier alternate in five rounds so that drift and
//! bursts of other load hit both. Throughput (decimal GB/s) is the median over the
//! rounds of bytes / wall time of the round; latencies are over all rounds.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use object_store::ObjectStoreExt;
use serde::Serialize;
use strata_cache_core::io::{AlignedBuf, IoEngineKind};
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier, Durability};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{BackingStore, Block, CacheKey, StoreOptions, Tier, TierGet};

#[derive(Debug, clap::Args)]
pub struct TiersArgs {
    /// Print one JSON object `{"results": [...]}` instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Directory for the disk tier, the raw-read file and the store; put it on the
    /// device you want to measure. Default: a fresh temporary directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Gets per measurement. Default: enough to move ~256 MiB (between 32 and 20,000).
    #[arg(long)]
    pub iters: Option<usize>,
    /// Tiers to measure (comma-separated): memory, disk, store.
    #[arg(long, value_delimiter = ',', default_value = "memory,disk,store",
          value_parser = ["memory", "disk", "store"])]
    pub tiers: Vec<String>,
    /// I/O engine of the disk tier: auto, io_uring or psync.
    #[arg(long, default_value = "auto")]
    pub engine: IoEngineKind,
    /// Also time the steps of a disk hit side by side (JSON `disk_breakdown`): a raw
    /// `pread` of the tier's own block files, the same plus the crc32c of the value,
    /// the I/O engine's read, its read with the checksum, and the whole tier get.
    #[arg(long)]
    pub breakdown: bool,
}

const SIZES: [usize; 3] = [4 << 10, 1 << 20, 16 << 20];
/// Bytes each default measurement moves: two passes over the working set, long
/// enough for stable percentiles, short enough that the whole run stays well under a
/// minute on a ~1 GB/s device.
const BYTES_PER_MEASUREMENT: usize = 512 << 20;
/// Bytes of distinct values per size (at most 1024 values: the disk tier's default
/// open-descriptor cache, so that after the warm-up pass a hit does not pay an `open`,
/// as for the ceiling, which reads one open file).
const WORKING_SET_BYTES: usize = 256 << 20;

#[derive(Debug, Serialize)]
pub struct TierResult {
    pub tier: &'static str,
    pub value_size: usize,
    pub gbps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub ceiling_gbps: f64,
    /// Median latency of one ceiling operation (table only).
    #[serde(skip)]
    pub ceiling_p50_us: f64,
}

#[derive(Debug, Serialize)]
pub struct TiersReport {
    pub results: Vec<TierResult>,
    /// I/O engine the disk tier ran on.
    pub disk_engine: String,
    /// Whether the disk tier and its ceiling used O_DIRECT.
    pub o_direct: bool,
    /// crc32c throughput on this CPU (the disk tier verifies every byte it serves).
    pub crc32c_gbps: f64,
    /// With `--breakdown`: the steps of a disk hit, per value size.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub disk_breakdown: Vec<StepResult>,
}

/// One step of a disk hit timed alone (see `TiersArgs::breakdown`).
#[derive(Debug, Serialize)]
pub struct StepResult {
    pub value_size: usize,
    pub step: &'static str,
    pub gbps: f64,
    pub p50_us: f64,
}

/// crc32c over 1 MiB values, best of five passes over 64 MiB.
fn crc32c_gbps() -> f64 {
    let data = pattern(64 << 20, 7);
    let mut best = 0.0f64;
    for _ in 0..5 {
        let t = Instant::now();
        for off in (0..data.len()).step_by(1 << 20) {
            // Block::new computes the crc32c, as a disk hit's verification does.
            black_box(Block::new(data.slice(off..off + (1 << 20))).crc());
        }
        best = best.max(data.len() as f64 / t.elapsed().as_secs_f64().max(1e-12) / 1e9);
    }
    best
}

/// Per-get latencies and, per round, the loop's throughput.
#[derive(Default)]
struct Samples {
    lat: Vec<Duration>,
    round_gbps: Vec<f64>,
}

impl Samples {
    /// Median of the rounds' throughputs: robust to a burst of other load on the
    /// machine hitting one round.
    fn gbps(&self) -> f64 {
        let mut v = self.round_gbps.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
    fn percentile_us(&mut self, p: f64) -> f64 {
        if self.lat.is_empty() {
            return 0.0;
        }
        self.lat.sort_unstable();
        let i = ((self.lat.len() as f64 * p) as usize).min(self.lat.len() - 1);
        self.lat[i].as_secs_f64() * 1e6
    }
}

fn iters_for(args: &TiersArgs, size: usize) -> usize {
    args.iters
        .unwrap_or((BYTES_PER_MEASUREMENT / size).clamp(32, 20_000))
        .max(1)
}

/// Distinct values per size: enough that the working set is not one hot buffer,
/// bounded to keep setup short (see `WORKING_SET_BYTES`) and, for short runs, to the
/// number of gets.
fn working_set(size: usize, iters: usize) -> usize {
    (WORKING_SET_BYTES / size).clamp(4, 1024).min(iters.max(4))
}

/// The order in which the working set is visited: a fixed shuffle, the same for the
/// tier and its ceiling, so that neither benefits from sequential placement on the
/// device (block files land wherever the file system puts them; a ceiling reading a
/// file front to back would measure the device's sequential speed instead).
fn visit_order(k: usize) -> Vec<usize> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut v: Vec<usize> = (0..k).collect();
    v.shuffle(&mut rand::rngs::StdRng::seed_from_u64(0x5742_7a7a));
    v
}

/// Deterministic incompressible bytes (the demo's generator).
fn pattern(len: usize, seed: u64) -> Bytes {
    crate::commands::demo::pseudo_random(len, seed)
}

/// Runs `op(i)` for `n` iterations, timing each, into `into` as one round.
async fn measure<F, Fut>(
    n: usize,
    size: usize,
    op: &mut F,
    into: &mut Samples,
) -> anyhow::Result<()>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        op(i).await?;
        into.lat.push(t.elapsed());
    }
    let wall = start.elapsed().as_secs_f64().max(1e-12);
    into.round_gbps.push((n * size) as f64 / wall / 1e9);
    Ok(())
}

/// Rounds of the ceiling and the tier alternate (after a warm-up pass of `warm` gets
/// of each: one over the whole working set), so that
/// drift and bursts of other load hit both; returns (tier, ceiling).
const ROUNDS: usize = 5;

async fn side_by_side<C, CF, T, TF>(
    n: usize,
    size: usize,
    warm: usize,
    mut ceiling: C,
    mut tier: T,
) -> anyhow::Result<(Samples, Samples)>
where
    C: FnMut(usize) -> CF,
    CF: std::future::Future<Output = anyhow::Result<()>>,
    T: FnMut(usize) -> TF,
    TF: std::future::Future<Output = anyhow::Result<()>>,
{
    let per_round = n.div_ceil(ROUNDS).max(1);
    let (mut t, mut c) = (Samples::default(), Samples::default());
    measure(warm, size, &mut ceiling, &mut Samples::default()).await?;
    measure(warm, size, &mut tier, &mut Samples::default()).await?;
    for _ in 0..ROUNDS {
        measure(per_round, size, &mut ceiling, &mut c).await?;
        measure(per_round, size, &mut tier, &mut t).await?;
    }
    Ok((t, c))
}

fn result(tier: &'static str, size: usize, mut t: Samples, mut c: Samples) -> TierResult {
    TierResult {
        ceiling_p50_us: c.percentile_us(0.50),
        tier,
        value_size: size,
        gbps: t.gbps(),
        p50_us: t.percentile_us(0.50),
        p99_us: t.percentile_us(0.99),
        ceiling_gbps: c.gbps(),
    }
}

fn expect_hit(g: strata_cache_core::Result<TierGet>) -> anyhow::Result<Block> {
    match g? {
        TierGet::Hit(b) => Ok(b),
        other => anyhow::bail!("benchmark key not served: {other:?}"),
    }
}

async fn bench_memory(size: usize, n: usize) -> anyhow::Result<TierResult> {
    let k = working_set(size, n);
    let values: Vec<Bytes> = (0..k).map(|i| pattern(size, i as u64)).collect();
    let tier = MemoryTier::new((k * size) as u64);
    let keys: Vec<CacheKey> = (0..k)
        .map(|i| CacheKey::file("bench/memory", "v", i as u64))
        .collect();
    for (key, v) in keys.iter().zip(&values) {
        tier.put(key, Block::new(v.clone())).await?;
    }
    let mut dst_c = vec![0u8; size];
    let dst_t = std::cell::RefCell::new(vec![0u8; size]);
    let (t, c) = side_by_side(
        n,
        size,
        k,
        |i| {
            dst_c.copy_from_slice(&values[i % k]);
            black_box(&mut dst_c);
            async { Ok(()) }
        },
        |i| {
            let (tier, key, dst) = (&tier, &keys[i % k], &dst_t);
            async move {
                let b = expect_hit(tier.get(key).await)?;
                let mut dst = dst.borrow_mut();
                dst.copy_from_slice(b.data());
                black_box(&mut *dst);
                Ok(())
            }
        },
    )
    .await?;
    Ok(result("memory", size, t, c))
}

/// A file of `len` bytes of data, synced, opened for reads (O_DIRECT if allowed).
fn raw_file(path: &Path, len: usize, direct: bool) -> anyhow::Result<File> {
    {
        let mut f = File::create(path).with_context(|| format!("create {}", path.display()))?;
        let chunk = pattern(1 << 20, 42);
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            f.write_all(&chunk[..n])?;
            left -= n;
        }
        f.sync_all()?;
    }
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    Ok(o.open(path)?)
}

async fn bench_disk(
    dir: &Path,
    size: usize,
    n: usize,
    engine: IoEngineKind,
    breakdown: Option<&mut Vec<StepResult>>,
) -> anyhow::Result<(TierResult, &'static str, bool)> {
    let k = working_set(size, n);
    let tier_dir = dir.join(format!("disk-{size}"));
    let opts = DiskOptions {
        engine,
        // Reads are measured; setup need not wait for fsync.
        durability: Durability::Async,
        ..DiskOptions::default()
    };
    let tier = DiskTier::open(&tier_dir, (k * size) as u64, opts)?;
    let keys: Vec<CacheKey> = (0..k)
        .map(|i| CacheKey::file("bench/disk", "v", i as u64))
        .collect();
    for (i, key) in keys.iter().enumerate() {
        tier.put(key, Block::new(pattern(size, i as u64))).await?;
    }
    let direct = tier.direct_io();
    let raw_path = dir.join(format!("raw-{size}.bin"));
    let raw = raw_file(&raw_path, k * size, direct)?;
    let mut buf = AlignedBuf::zeroed(size);
    let order = visit_order(k);
    let (t, c) = side_by_side(
        n,
        size,
        k,
        |i| {
            let off = (order[i % k] * size) as u64;
            let r = raw.read_exact_at(buf.full_mut(), off);
            black_box(&buf);
            async move { Ok(r?) }
        },
        |i| {
            let (tier, key) = (&tier, &keys[order[i % k]]);
            async move {
                let b = expect_hit(tier.get(key).await)?;
                anyhow::ensure!(b.len() as usize == size, "short value");
                black_box(b);
                Ok(())
            }
        },
    )
    .await?;
    if let Some(into) = breakdown {
        let steps = disk_breakdown(&tier, &keys, &order, size, n, engine, direct).await?;
        into.extend(steps);
    }
    let engine_name = tier.engine_name();
    drop(tier);
    let _ = std::fs::remove_file(&raw_path);
    let _ = std::fs::remove_dir_all(&tier_dir);
    Ok((result("disk", size, t, c), engine_name, direct))
}

/// The steps of a disk hit, each timed alone over the same keys in the same order, in
/// interleaved rounds (see `TiersArgs::breakdown`): where the time between a raw read
/// and a tier get goes.
async fn disk_breakdown(
    tier: &DiskTier,
    keys: &[CacheKey],
    order: &[usize],
    size: usize,
    n: usize,
    engine: IoEngineKind,
    direct: bool,
) -> anyhow::Result<Vec<StepResult>> {
    const STEPS: [&str; 5] = [
        "pread_block_file",
        "pread_block_file_then_crc",
        "engine_read",
        "engine_read_crc",
        "tier_get",
    ];
    let k = keys.len();
    let mut files = Vec::with_capacity(k);
    for key in keys {
        let path = tier
            .block_file(key)
            .context("benchmark block not resident")?;
        let mut o = OpenOptions::new();
        o.read(true);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        files.push(std::sync::Arc::new(o.open(&path)?));
    }
    // Bench values are multiples of 4096, so the file is header + value, no padding.
    let file_len = files[0].metadata()?.len() as usize;
    let value = file_len - size..file_len;
    let io = strata_cache_core::io::open_engine(engine)?;
    let pool = strata_cache_core::io::BufPool::new(64 << 20);
    let buf = std::cell::RefCell::new(AlignedBuf::zeroed(file_len));
    let step = |s: usize, i: usize| {
        let j = order[i % k];
        let (file, key, io, pool, buf, value) = (
            files[j].clone(),
            &keys[j],
            io.clone(),
            &pool,
            &buf,
            value.clone(),
        );
        async move {
            match s {
                0 | 1 => {
                    let mut b = buf.borrow_mut();
                    file.read_exact_at(b.full_mut(), 0)?;
                    if s == 1 {
                        black_box(crc32c::crc32c(&b.full_mut()[value]));
                    }
                }
                2 => {
                    let b = io.read_at(file, 0, pool.take(file_len)).await?;
                    anyhow::ensure!(b.len() == file_len, "short read");
                }
                3 => {
                    let (b, crc) = io.read_at_crc(file, 0, pool.take(file_len), value).await?;
                    anyhow::ensure!(b.len() == file_len && crc.is_some(), "short read");
                }
                _ => {
                    black_box(expect_hit(tier.get(key).await)?);
                }
            }
            Ok(())
        }
    };
    let mut samples: Vec<Samples> = STEPS.iter().map(|_| Samples::default()).collect();
    for (s, _) in STEPS.iter().enumerate() {
        measure(k, size, &mut |i| step(s, i), &mut Samples::default()).await?;
    }
    let per_round = n.div_ceil(ROUNDS).max(1);
    for _ in 0..ROUNDS {
        for (s, into) in samples.iter_mut().enumerate() {
            measure(per_round, size, &mut |i| step(s, i), into).await?;
        }
    }
    Ok(STEPS
        .iter()
        .zip(samples.iter_mut())
        .map(|(name, smp)| StepResult {
            value_size: size,
            step: name,
            gbps: smp.gbps(),
            p50_us: smp.percentile_us(0.50),
        })
        .collect())
}

async fn bench_store(dir: &Path, size: usize, n: usize) -> anyhow::Result<TierResult> {
    let k = working_set(size, n);
    let root = dir.join(format!("store-{size}"));
    std::fs::create_dir_all(&root)?;
    let obj = "bench/object.bin";
    let store = BackingStore::from_url(
        &format!("file://{}", root.display()),
        &StoreOptions::default(),
    )?;
    let mut data = Vec::with_capacity(k * size);
    for i in 0..k {
        data.extend_from_slice(&pattern(size, i as u64));
    }
    store.put(obj, Bytes::from(data)).await?;
    let info = store.head(obj).await?;
    let direct = object_store::local::LocalFileSystem::new_with_prefix(&root)?;
    let path = object_store::path::Path::from(obj);
    let (t, c) = side_by_side(
        n,
        size,
        k,
        |i| {
            let (direct, path) = (&direct, &path);
            let off = ((i % k) * size) as u64;
            async move {
                let b = direct.get_range(path, off..off + size as u64).await?;
                black_box(b);
                Ok(())
            }
        },
        |i| {
            let (store, info) = (&store, &info);
            let off = ((i % k) * size) as u64;
            async move {
                let b = store.get_range(info, off..off + size as u64).await?;
                black_box(b);
                Ok(())
            }
        },
    )
    .await?;
    let _ = std::fs::remove_dir_all(&root);
    Ok(result("store", size, t, c))
}

pub async fn bench(args: &TiersArgs, dir: &Path) -> anyhow::Result<TiersReport> {
    let mut results = Vec::new();
    let mut engine = String::new();
    let mut o_direct = false;
    let mut breakdown = Vec::new();
    for size in SIZES {
        let n = iters_for(args, size);
        let on = |t: &str| args.tiers.iter().any(|x| x == t);
        if on("memory") {
            results.push(bench_memory(size, n).await?);
        }
        if on("disk") {
            let steps = args.breakdown.then_some(&mut breakdown);
            let (r, e, d) = bench_disk(dir, size, n, args.engine, steps).await?;
            results.push(r);
            engine = e.to_string();
            o_direct = d;
        }
        if on("store") {
            results.push(bench_store(dir, size, n).await?);
        }
    }
    Ok(TiersReport {
        results,
        disk_engine: engine,
        o_direct,
        crc32c_gbps: crc32c_gbps(),
        disk_breakdown: breakdown,
    })
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s => format!("{} KiB", s >> 10),
    }
}

pub fn run(args: TiersArgs) -> anyhow::Result<()> {
    let tmp = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            tempfile::Builder::new()
                .prefix("strata-bench-tiers-")
                .tempdir_in(d)?
        }
        None => tempfile::Builder::new()
            .prefix("strata-bench-tiers-")
            .tempdir()?,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(bench(&args, tmp.path()))?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    outln!(
        "disk engine: {}, O_DIRECT: {}, crc32c: {:.1} GB/s, dir: {}",
        report.disk_engine,
        report.o_direct,
        report.crc32c_gbps,
        tmp.path().display()
    );
    outln!(
        "{:<7} {:>7} {:>9} {:>10} {:>10} {:>13} {:>7} {:>15}",
        "tier",
        "size",
        "GB/s",
        "p50 us",
        "p99 us",
        "ceiling GB/s",
        "ratio",
        "ceiling p50 us"
    );
    for r in &report.results {
        outln!(
            "{:<7} {:>7} {:>9.2} {:>10.1} {:>10.1} {:>13.2} {:>6.0}% {:>15.1}",
            r.tier,
            human(r.value_size),
            r.gbps,
            r.p50_us,
            r.p99_us,
            r.ceiling_gbps,
            100.0 * r.gbps / r.ceiling_gbps.max(1e-12),
            r.ceiling_p50_us
        );
    }
    for st in &report.disk_breakdown {
        outln!(
            "disk {:>7} {:<26} {:>9.2} GB/s {:>10.1} us p50",
            human(st.value_size),
            st.step,
            st.gbps,
            st.p50_us
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_right_sample() {
        let mut s = Samples {
            lat: (1..=100).rev().map(Duration::from_micros).collect(),
            round_gbps: vec![9.0, 1.0, 2.0, 0.5, 3.0],
        };
        assert_eq!(s.percentile_us(0.50), 51.0);
        assert_eq!(s.percentile_us(0.99), 100.0);
        assert_eq!(s.gbps(), 2.0, "median round");
    }

    #[test]
    fn tiny_run_reports_every_tier_and_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = TiersArgs {
            json: true,
            dir: None,
            iters: Some(4),
            tiers: vec!["memory".into(), "disk".into(), "store".into()],
            engine: IoEngineKind::Auto,
            breakdown: true,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let report = rt.block_on(bench(&args, dir.path())).expect("bench");
        assert_eq!(report.results.len(), 9);
        for r in &report.results {
            assert!(r.gbps > 0.0 && r.ceiling_gbps > 0.0, "{r:?}");
            assert!(r.p99_us >= r.p50_us, "{r:?}");
        }
        let json = serde_json::to_value(&report).expect("json");
        assert!(json["results"][0]["ceiling_gbps"].is_number());
    }
}
