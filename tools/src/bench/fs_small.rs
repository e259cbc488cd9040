//! `strata bench fs-small`: semantic prefetch through the real FUSE mount.
//!
//! Dataset: `--files` small files (`--min-size`..`--max-size`, uniform) with
//! ImageNet-like names (`train/n0XXXXXXX/n0XXXXXXX_<id>.JPEG`, ids increasing with
//! random gaps) under `--classes` class directories, in a local directory behind a
//! `FaultyStore` adding `--latency-ms` per request and sharing `--bandwidth`.
//!
//! For each prefetch mode (`window`: per-file readahead only, which cannot name the
//! next file, i.e. no cross-file prefetch; `predictors`: sequential + semantic
//! predictors) and each order (name order; one shuffled epoch), a fresh cache and a
//! fresh mount (so everything is cold) are set up, the job lists every class directory
//! (as a data loader indexing its dataset does; untimed), then `--threads` reader
//! threads (data-loader workers) take the next file of the order from a shared counter
//! and time `open` + reading the whole file. Reported per (mode, order): mean and p99
//! of that per-file latency, and the job's wall time.
//!
//! Mounts are unmounted by `MountHandle`'s `Drop` on every path, errors included.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use object_store::ObjectStore;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore};
use strata_cache_core::{BackingStore, ObjectReader, RetryPolicy, StoreOptions};
use strata_fs::MountOptions;

use crate::commands::mount::PrefetchMode;
use crate::config::{open_core, parse_size, CacheConfig};

#[derive(Debug, clap::Args)]
pub struct FsSmallArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Number of files. 20,000: an ImageNet-sized class sample, many more files than
    /// any predictor lookahead.
    #[arg(long, default_value_t = 20_000)]
    pub files: usize,
    /// Class directories the files are spread over.
    #[arg(long, default_value_t = 20)]
    pub classes: usize,
    /// Smallest file.
    #[arg(long, default_value = "4KiB")]
    pub min_size: String,
    /// Largest file.
    #[arg(long, default_value = "16KiB")]
    pub max_size: String,
    /// Reader threads (data-loader workers). 4: PyTorch's usual `num_workers` per GPU.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Added latency per store request.
    #[arg(long, default_value_t = 20)]
    pub latency_ms: u64,
    /// Shared store bandwidth, e.g. 200MB.
    #[arg(long, default_value = "200MB")]
    pub bandwidth: String,
    /// Seed of the sizes, names and shuffle.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Working directory (dataset, caches, mount points). Default: a temp dir.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct Cell {
    pub prefetch: String,
    pub order: String,
    pub mean_ms: f64,
    pub p99_ms: f64,
    pub job_s: f64,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct FsSmallReport {
    pub files: usize,
    pub classes: usize,
    pub threads: usize,
    pub dataset_bytes: u64,
    pub latency_ms: u64,
    pub bandwidth_bytes_per_sec: u64,
    pub cells: Vec<Cell>,
    /// 1 - mean(predictors) / mean(window), name order.
    pub name_order_mean_cut: f64,
    /// The same for the shuffled epoch.
    pub shuffled_mean_cut: f64,
}

fn faulty_store(root: &Path, cfg: FaultConfig) -> anyhow::Result<BackingStore> {
    let url = format!("file://{}", root.display());
    let base = BackingStore::from_url(&url, &StoreOptions::default())?;
    let faulty: Arc<dyn ObjectStore> = Arc::new(FaultyStore::new(base.inner().clone(), cfg));
    Ok(BackingStore::new(faulty, "faulty", RetryPolicy::default()))
}

/// Writes the dataset; returns relative paths in name order, and total bytes.
fn make_dataset(
    data: &Path,
    args: &FsSmallArgs,
    rng: &mut rand::rngs::StdRng,
) -> anyhow::Result<(Vec<String>, u64)> {
    let (lo, hi) = (parse_size(&args.min_size)?, parse_size(&args.max_size)?);
    anyhow::ensure!(lo > 0 && lo <= hi, "need 0 < min-size <= max-size");
    let classes = args.classes.max(1);
    let mut names = Vec::with_capacity(args.files);
    let mut buf = vec![0u8; hi as usize];
    let mut total = 0u64;
    for c in 0..classes {
        let class = format!("n{:08}", 1_440_764 + c * 7_919);
        let dir = data.join("train").join(&class);
        std::fs::create_dir_all(&dir)?;
        let n = args.files / classes + usize::from(c < args.files % classes);
        let mut id = 10_000u64;
        for _ in 0..n {
            id += rng.random_range(1..=40); // ImageNet ids have gaps
            let rel = format!("train/{class}/{class}_{id}.JPEG");
            let size = rng.random_range(lo..=hi) as usize;
            rng.fill(&mut buf[..size]);
            File::create(data.join(&rel))?.write_all(&buf[..size])?;
            total += size as u64;
            names.push(rel);
        }
    }
    names.sort();
    Ok((names, total))
}

/// One cold pass: fresh cache, fresh mount, list, read `order` with the worker pool.
fn pass(
    work: &Path,
    tag: &str,
    mode: PrefetchMode,
    order: &[String],
    args: &FsSmallArgs,
    cold: &FaultConfig,
    total: u64,
) -> anyhow::Result<(Vec<Duration>, Duration, u64)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let core = open_core(&CacheConfig {
        dir: Some(work.join(format!("cache-{tag}"))),
        memory: format!("{}", total * 2),
        disk: format!("{}", total * 2),
        ..Default::default()
    })?;
    let store = faulty_store(&work.join("data"), cold.clone())?;
    let mnt = work.join(format!("mnt-{tag}"));
    std::fs::create_dir_all(&mnt)?;
    let reader = ObjectReader::new(core.engine.clone(), store, core.block_size)?;
    let mut copts = strata_fs::CoreOptions::default();
    mode.apply(&mut copts);
    let opts = MountOptions {
        core: copts,
        runtime: Some(rt.handle().clone()),
        fsname: "strata-bench".into(),
        ..Default::default()
    };
    let h = rt.block_on(async { strata_fs::spawn(reader, "", &mnt, opts) })?;
    // The data loader indexes its dataset first (untimed, same in every mode).
    for e in std::fs::read_dir(mnt.join("train"))? {
        let d = e?.path();
        for f in std::fs::read_dir(&d)? {
            f?;
        }
    }
    let next = AtomicUsize::new(0);
    let t = Instant::now();
    let per: Vec<(Vec<Duration>, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..args.threads.max(1))
            .map(|_| {
                s.spawn(|| -> anyhow::Result<(Vec<Duration>, u64)> {
                    let mut lat = Vec::new();
                    let mut bytes = 0u64;
                    let mut buf = Vec::with_capacity(1 << 16);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(rel) = order.get(i) else { break };
                        let t0 = Instant::now();
                        buf.clear();
                        let mut f =
                            File::open(mnt.join(rel)).with_context(|| format!("open {rel}"))?;
                        bytes += f
                            .read_to_end(&mut buf)
                            .with_context(|| format!("read {rel}"))?
                            as u64;
                        lat.push(t0.elapsed());
                    }
                    Ok((lat, bytes))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("reader panicked"))?)
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let job = t.elapsed();
    h.unmount()?;
    drop(core);
    let bytes = per.iter().map(|p| p.1).sum();
    let lat = per.into_iter().flat_map(|p| p.0).collect();
    Ok((lat, job, bytes))
}

fn stats(mut lat: Vec<Duration>) -> (f64, f64) {
    if lat.is_empty() {
        return (0.0, 0.0);
    }
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mean = lat.iter().map(|d| ms(*d)).sum::<f64>() / lat.len() as f64;
    let p99 = ms(lat[((lat.len() * 99).div_ceil(100)).saturating_sub(1)]);
    (mean, p99)
}

pub fn bench(args: &FsSmallArgs) -> anyhow::Result<FsSmallReport> {
    let bw = parse_size(&args.bandwidth)?;
    let (work, _tmp) = super::fs::work_dir(args.dir.as_deref(), "strata-bench-fs-small-")?;
    let data = work.join("data");
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let (names, total) = make_dataset(&data, args, &mut rng)?;
    let mut shuffled = names.clone();
    shuffled.shuffle(&mut rng);
    let cold = FaultConfig {
        latency: Duration::from_millis(args.latency_ms),
        bandwidth_bytes_per_sec: Some(bw),
        ..Default::default()
    };
    let mut cells = Vec::new();
    for mode in [PrefetchMode::Window, PrefetchMode::Predictors] {
        for (oname, order) in [("name", &names), ("shuffled", &shuffled)] {
            let m = format!("{mode:?}").to_lowercase();
            let tag = format!("{m}-{oname}");
            let (lat, job, bytes) = pass(&work, &tag, mode, order, args, &cold, total)?;
            anyhow::ensure!(bytes == total, "{tag}: read {bytes} of {total} bytes");
            let (mean_ms, p99_ms) = stats(lat);
            cells.push(Cell {
                prefetch: m,
                order: oname.into(),
                mean_ms,
                p99_ms,
                job_s: job.as_secs_f64(),
                bytes,
            });
        }
    }
    let mean = |p: &str, o: &str| {
        cells
            .iter()
            .find(|c| c.prefetch == p && c.order == o)
            .map_or(0.0, |c| c.mean_ms)
    };
    let cut = |o: &str| 1.0 - mean("predictors", o) / mean("window", o).max(1e-12);
    Ok(FsSmallReport {
        files: names.len(),
        classes: args.classes,
        threads: args.threads,
        dataset_bytes: total,
        latency_ms: args.latency_ms,
        bandwidth_bytes_per_sec: bw,
        name_order_mean_cut: cut("name"),
        shuffled_mean_cut: cut("shuffled"),
        cells,
    })
}

pub fn run(args: FsSmallArgs) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let r = bench(&args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "{} files in {} classes, {} bytes; {} reader threads; store +{} ms, {} B/s",
        r.files, r.classes, r.dataset_bytes, r.threads, r.latency_ms, r.bandwidth_bytes_per_sec
    );
    println!(
        "{:<12}{:<10}{:>10}{:>10}{:>10}",
        "prefetch", "order", "mean ms", "p99 ms", "job s"
    );
    for c in &r.cells {
        println!(
            "{:<12}{:<10}{:>10.2}{:>10.2}{:>10.2}",
            c.prefetch, c.order, c.mean_ms, c.p99_ms, c.job_s
        );
    }
    println!(
        "mean latency cut by predictors: name order {:.1}%, shuffled {:.1}%",
        r.name_order_mean_cut * 100.0,
        r.shuffled_mean_cut * 100.0
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny run end to end: four cells, every file read whole in each, latencies
    /// positive and p99 >= mean.
    #[test]
    fn tiny_run_reads_every_file_in_every_cell() {
        let args = FsSmallArgs {
            json: true,
            files: 30,
            classes: 3,
            min_size: "1KiB".into(),
            max_size: "2KiB".into(),
            threads: 2,
            latency_ms: 1,
            bandwidth: "1GB".into(),
            seed: 7,
            dir: None,
        };
        let r = bench(&args).expect("bench");
        assert_eq!(r.files, 30);
        assert_eq!(r.cells.len(), 4);
        for c in &r.cells {
            assert_eq!(c.bytes, r.dataset_bytes, "{}/{}", c.prefetch, c.order);
            assert!(c.mean_ms > 0.0 && c.p99_ms >= c.mean_ms * 0.999);
            assert!(c.job_s > 0.0);
        }
    }
}
