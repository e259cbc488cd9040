//! `strata bench fs-small`: semantic prefetch through the real FUSE mount.
//!
//! Dataset: `--files` small files (`--min-size`..`--max-size`, uniform) with
//! ImageNet-like names (`train/n0XXXXXXX/n0XXXXXXX_<id>.JPEG`, ids increasing with
//! random gaps) under `--classes` class directories, in a local directory behind a
//! `FaultyStore` adding `--latency-ms` per request and sharing `--bandwidth`.
//!
//! For each job scope (`--job-scopes`: what the mount counts as one job, see
//! `strata_fs::job`), each prefetch mode (`--modes`; `window`: per-file readahead only,
//! which cannot name the next file, i.e. no cross-file prefetch; `predictors`:
//! sequential + semantic predictors) and each order (`--orders`; name order, or one
//! shuffled epoch), a fresh cache and a fresh mount (so everything is cold) are set up,
//! the job lists every class directory (as a data loader indexing its dataset does;
//! untimed), then `--threads` workers read the order and time `open` + reading the
//! whole file. Reported per cell: mean and p99 of that per-file latency, and the job's
//! wall time.
//!
//! How the workers split the order:
//! - `--batch 0` (default): each takes the next file from a shared counter (a thread
//!   pool over one queue);
//! - `--batch B`: like a PyTorch `DataLoader(batch_size=B, num_workers=N)`: the order is
//!   cut into batches of B consecutive files and worker `w` reads batches `w, w+N, ...`
//!   (a static round-robin; the main process's back-pressure, at most
//!   `prefetch_factor` batches ahead per worker, is not modelled, so workers may drift
//!   apart a little more than in PyTorch).
//! - `--processes`: the workers are child processes (this binary re-run with the
//!   hidden `--worker-list`), as a `DataLoader`'s workers are; needs `--batch` > 0
//!   (there is no shared counter), and latencies come back on the children's stdout.
//!
//! Epochs (`--epochs E`): the pass reads the order E times on the same mount and cache
//! (name order every epoch; a fresh permutation per epoch when shuffled). Each file's
//! kernel page cache is dropped after it is read (`posix_fadvise(DONTNEED)`), so a
//! later epoch is served by Strata's cache or the store, as for a dataset larger than
//! RAM; with `--cache-frac` below 0.5 the cache's two tiers together hold less than
//! the dataset, the case the per-epoch permutation pool is for.
//!
//! Mounts are unmounted by `MountHandle`'s `Drop` on every path, errors included.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use strata_cache_core::store::faulty::FaultConfig;

use super::fs::{faulty_store, ColdStoreArgs};
use strata_cache_core::ObjectReader;
use strata_fs::{JobScope, MountOptions};

use crate::config::{parse_size, CacheConfig, PrefetchMode};
use crate::daemon::open_core;

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
    /// The cold store's latency and bandwidth.
    #[command(flatten)]
    pub store: ColdStoreArgs,
    /// Seed of the sizes, names and shuffle.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Working directory (dataset, caches, mount points). Default: a temp dir.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// What the mount counts as one job, one set of cells per scope: `group` (process
    /// group, the mount's default), `process`, `thread` (the FUSE request's pid as is).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Scope::Group])]
    pub job_scopes: Vec<Scope>,
    /// Prefetch modes to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [PrefetchMode::Window, PrefetchMode::Predictors])]
    pub modes: Vec<PrefetchMode>,
    /// Orders to read.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Order::Name, Order::Shuffled])]
    pub orders: Vec<Order>,
    /// Files per batch, each worker reading whole batches round-robin (0: one shared
    /// queue of files). See the module doc.
    #[arg(long, default_value_t = 0)]
    pub batch: usize,
    /// Workers are child processes instead of threads (needs --batch > 0).
    #[arg(long)]
    pub processes: bool,
    /// Epochs per pass (same mount and cache; see the module doc).
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Size of each of the cache's two tiers (memory, disk) as a fraction of the
    /// dataset. 2: everything fits (a cold first epoch measures prefetch alone).
    #[arg(long, default_value_t = 2.0)]
    pub cache_frac: f64,
    /// Internal: run as one worker process reading the files listed in this file.
    #[arg(long, hide = true)]
    pub worker_list: Option<PathBuf>,
}

/// `--job-scopes` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Thread,
    Process,
    Group,
}

impl From<Scope> for JobScope {
    fn from(s: Scope) -> JobScope {
        match s {
            Scope::Thread => JobScope::Thread,
            Scope::Process => JobScope::Process,
            Scope::Group => JobScope::ProcessGroup,
        }
    }
}

/// `--orders` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Order {
    /// Name order (sorted paths).
    Name,
    /// One seeded permutation (one cold epoch).
    Shuffled,
}

#[derive(Debug, Serialize)]
pub struct Cell {
    pub job_scope: Scope,
    pub prefetch: String,
    pub order: String,
    pub mean_ms: f64,
    pub p99_ms: f64,
    pub job_s: f64,
    pub bytes: u64,
    /// Mean per-file latency of each epoch.
    pub epoch_mean_ms: Vec<f64>,
    /// Files prefetched ahead of their first read (the semantic predictor's requests).
    pub prefetched_files: u64,
    /// ...of which the job then read (precision = used / prefetched; the rest were
    /// still cached and unread at the end, or evicted unread: `prefetched_wasted`).
    pub prefetched_used: u64,
    pub prefetched_wasted: u64,
}

/// What one pass measured.
struct PassResult {
    /// Per epoch.
    lat: Vec<Vec<Duration>>,
    job: Duration,
    bytes: u64,
    prefetched: (u64, u64, u64),
}

#[derive(Debug, Serialize)]
pub struct FsSmallReport {
    pub files: usize,
    pub classes: usize,
    pub threads: usize,
    pub batch: usize,
    pub processes: bool,
    pub epochs: usize,
    pub cache_frac: f64,
    pub dataset_bytes: u64,
    pub latency_ms: u64,
    pub bandwidth_bytes_per_sec: u64,
    pub cells: Vec<Cell>,
    /// Per (job scope, order) with both modes measured: 1 - mean(predictors) /
    /// mean(window).
    pub mean_cuts: Vec<MeanCut>,
}

#[derive(Debug, Serialize)]
pub struct MeanCut {
    pub job_scope: Scope,
    pub order: String,
    pub cut: f64,
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

/// How the workers of one pass split the order.
enum Plan<'a> {
    /// One shared queue.
    Shared(&'a [String]),
    /// Worker `w` reads `lists[w]` in order.
    PerWorker(Vec<Vec<String>>),
}

/// Batches of `batch` consecutive files dealt round-robin to `workers` workers.
fn deal_batches(order: &[String], batch: usize, workers: usize) -> Vec<Vec<String>> {
    let mut lists = vec![Vec::new(); workers.max(1)];
    for (k, b) in order.chunks(batch.max(1)).enumerate() {
        lists[k % workers.max(1)].extend(b.iter().cloned());
    }
    lists
}

/// Opens and reads each file whole; per-file latency and total bytes.
fn read_files<'a>(
    mnt: &Path,
    files: impl Iterator<Item = &'a str>,
    drop_page_cache: bool,
) -> anyhow::Result<(Vec<Duration>, u64)> {
    let mut lat = Vec::new();
    let mut bytes = 0u64;
    let mut buf = Vec::with_capacity(1 << 16);
    for rel in files {
        let t0 = Instant::now();
        buf.clear();
        let mut f = File::open(mnt.join(rel)).with_context(|| format!("open {rel}"))?;
        bytes += f
            .read_to_end(&mut buf)
            .with_context(|| format!("read {rel}"))? as u64;
        lat.push(t0.elapsed());
        if drop_page_cache {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open fd; the call only drops clean cached pages.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
    Ok((lat, bytes))
}

/// The hidden worker-process mode: the list's first line is the mount, the second
/// `dontneed 0|1` (drop each file's page cache), the others the files; prints `bytes N` and then one latency in ns per line.
fn worker_process(list: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(list)?;
    let mut lines = text.lines();
    let mnt = PathBuf::from(lines.next().context("empty worker list")?);
    let dontneed = lines.next() == Some("dontneed 1");
    let (lat, bytes) = read_files(&mnt, lines, dontneed)?;
    let mut out = String::with_capacity(lat.len() * 10 + 32);
    out.push_str(&format!("bytes {bytes}\n"));
    for d in lat {
        out.push_str(&format!("{}\n", d.as_nanos()));
    }
    std::io::stdout().write_all(out.as_bytes())?;
    Ok(())
}

/// Runs one worker list per child process; waits for all.
fn run_processes(
    work: &Path,
    tag: &str,
    mnt: &Path,
    lists: &[Vec<String>],
    dontneed: bool,
) -> anyhow::Result<Vec<(Vec<Duration>, u64)>> {
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for (w, files) in lists.iter().enumerate() {
        let list = work.join(format!("worker-{tag}-{w}.txt"));
        let mut text = format!("{}\ndontneed {}\n", mnt.display(), u8::from(dontneed));
        for f in files {
            text.push_str(f);
            text.push('\n');
        }
        std::fs::write(&list, text)?;
        let child = std::process::Command::new(&exe)
            .args(["bench", "fs-small", "--worker-list"])
            .arg(&list)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("spawn worker {w} ({})", exe.display()))?;
        children.push(child);
    }
    let mut out = Vec::new();
    for (w, c) in children.into_iter().enumerate() {
        let o = c.wait_with_output()?;
        anyhow::ensure!(o.status.success(), "worker {w} failed: {}", o.status);
        let text = String::from_utf8(o.stdout)?;
        let mut lines = text.lines();
        let bytes = lines
            .next()
            .and_then(|l| l.strip_prefix("bytes "))
            .context("worker output")?
            .parse()?;
        let lat = lines
            .map(|l| l.parse::<u64>().map(Duration::from_nanos))
            .collect::<Result<Vec<_>, _>>()?;
        out.push((lat, bytes));
    }
    Ok(out)
}

/// One cold pass: fresh cache, fresh mount, list, read the plan with the workers.
#[allow(clippy::too_many_arguments)]
fn pass(
    work: &Path,
    tag: &str,
    mode: PrefetchMode,
    scope: Scope,
    epochs: &[Plan<'_>],
    args: &FsSmallArgs,
    cold: &FaultConfig,
    total: u64,
) -> anyhow::Result<PassResult> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let core = open_core(&CacheConfig {
        dir: Some(work.join(format!("cache-{tag}"))),
        memory: format!("{}", (total as f64 * args.cache_frac) as u64),
        disk: format!("{}", (total as f64 * args.cache_frac) as u64),
        ..Default::default()
    })?;
    let store = faulty_store(&work.join("data"), cold.clone())?;
    let mnt = work.join(format!("mnt-{tag}"));
    std::fs::create_dir_all(&mnt)?;
    crate::signals::own_mount(&mnt);
    let reader = ObjectReader::new(core.engine.clone(), store, core.block_size)?;
    let mut copts = strata_fs::CoreOptions {
        job_scope: scope.into(),
        ..Default::default()
    };
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
    let dontneed = epochs.len() > 1;
    let t = Instant::now();
    let mut lat = Vec::new();
    let mut bytes = 0;
    for (e, plan) in epochs.iter().enumerate() {
        let next = AtomicUsize::new(0);
        let per: Vec<(Vec<Duration>, u64)> = match plan {
            Plan::PerWorker(lists) if args.processes => {
                run_processes(work, &format!("{tag}-e{e}"), &mnt, lists, dontneed)?
            }
            _ => std::thread::scope(|s| {
                let mnt = &mnt;
                let next = &next;
                let hs: Vec<_> = (0..args.threads.max(1))
                    .map(|w| {
                        s.spawn(move || match plan {
                            Plan::Shared(order) => read_files(
                                mnt,
                                std::iter::from_fn(|| {
                                    order
                                        .get(next.fetch_add(1, Ordering::Relaxed))
                                        .map(|s| s.as_str())
                                }),
                                dontneed,
                            ),
                            Plan::PerWorker(lists) => read_files(
                                mnt,
                                lists.get(w).into_iter().flatten().map(|s| s.as_str()),
                                dontneed,
                            ),
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().map_err(|_| anyhow::anyhow!("reader panicked"))?)
                    .collect::<anyhow::Result<Vec<_>>>()
            })?,
        };
        bytes += per.iter().map(|p| p.1).sum::<u64>();
        lat.push(per.into_iter().flat_map(|p| p.0).collect());
    }
    let job = t.elapsed();
    let prefetched = h.core().map_or((0, 0, 0), |c| {
        let c = c.counters();
        (
            c.prefetch_files.load(Ordering::Relaxed),
            c.prefetch_files_used.load(Ordering::Relaxed),
            c.prefetch_files_wasted.load(Ordering::Relaxed),
        )
    });
    h.unmount()?;
    drop(core);
    Ok(PassResult {
        lat,
        job,
        bytes,
        prefetched,
    })
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
    let bw = args.store.bandwidth_bytes()?;
    let (work, _tmp) = super::fs::work_dir(args.dir.as_deref(), "strata-bench-fs-small-")?;
    if _tmp.is_some() {
        crate::signals::remove_on_signal(&work);
    }
    let data = work.join("data");
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let (names, total) = make_dataset(&data, args, &mut rng)?;
    anyhow::ensure!(args.epochs >= 1, "--epochs must be at least 1");
    anyhow::ensure!(args.cache_frac > 0.0, "--cache-frac must be positive");
    // One permutation per epoch.
    let shuffled: Vec<Vec<String>> = (0..args.epochs)
        .map(|_| {
            let mut o = names.clone();
            o.shuffle(&mut rng);
            o
        })
        .collect();
    let cold = args.store.fault_config()?;
    anyhow::ensure!(
        !args.processes || args.batch > 0,
        "--processes needs --batch > 0 (child processes share no queue)"
    );
    let mut cells = Vec::new();
    for &scope in &args.job_scopes {
        for &mode in &args.modes {
            for &o in &args.orders {
                let (oname, orders): (&str, Vec<&[String]>) = match o {
                    Order::Name => ("name", vec![&names[..]; args.epochs]),
                    Order::Shuffled => ("shuffled", shuffled.iter().map(|v| &v[..]).collect()),
                };
                let plans: Vec<Plan<'_>> = orders
                    .into_iter()
                    .map(|order| {
                        if args.batch == 0 {
                            Plan::Shared(order)
                        } else {
                            Plan::PerWorker(deal_batches(order, args.batch, args.threads))
                        }
                    })
                    .collect();
                let m = format!("{mode:?}").to_lowercase();
                let tag = format!("{scope:?}-{m}-{oname}").to_lowercase();
                let r = pass(&work, &tag, mode, scope, &plans, args, &cold, total)?;
                let bytes = r.bytes;
                let want = total * args.epochs as u64;
                anyhow::ensure!(bytes == want, "{tag}: read {bytes} of {want} bytes");
                let epoch_mean_ms = r.lat.iter().map(|l| stats(l.clone()).0).collect();
                let (mean_ms, p99_ms) = stats(r.lat.concat());
                cells.push(Cell {
                    job_scope: scope,
                    prefetch: m,
                    order: oname.into(),
                    mean_ms,
                    p99_ms,
                    job_s: r.job.as_secs_f64(),
                    bytes,
                    epoch_mean_ms,
                    prefetched_files: r.prefetched.0,
                    prefetched_used: r.prefetched.1,
                    prefetched_wasted: r.prefetched.2,
                });
            }
        }
    }
    let mean = |sc: Scope, p: &str, o: &str| {
        cells
            .iter()
            .find(|c| c.job_scope == sc && c.prefetch == p && c.order == o)
            .map(|c| c.mean_ms)
    };
    let mut mean_cuts = Vec::new();
    for &sc in &args.job_scopes {
        for o in ["name", "shuffled"] {
            if let (Some(p), Some(w)) = (mean(sc, "predictors", o), mean(sc, "window", o)) {
                mean_cuts.push(MeanCut {
                    job_scope: sc,
                    order: o.into(),
                    cut: 1.0 - p / w.max(1e-12),
                });
            }
        }
    }
    Ok(FsSmallReport {
        files: names.len(),
        classes: args.classes,
        threads: args.threads,
        batch: args.batch,
        processes: args.processes,
        epochs: args.epochs,
        cache_frac: args.cache_frac,
        dataset_bytes: total,
        latency_ms: args.store.latency_ms,
        bandwidth_bytes_per_sec: bw,
        cells,
        mean_cuts,
    })
}

pub fn run(args: FsSmallArgs) -> anyhow::Result<()> {
    if let Some(list) = &args.worker_list {
        return worker_process(list);
    }
    let _log = crate::init_logging("warn");
    // As `bench fs`: its own mount must be released before a signal's exit.
    crate::signals::catch().context("catching stop signals")?;
    crate::signals::exit_on_signal(Duration::ZERO).context("watching stop signals")?;
    let r = bench(&args)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let loader = match (r.batch, r.processes) {
        (0, _) => "one shared queue".to_string(),
        (b, false) => format!("batches of {b} round-robin, threads"),
        (b, true) => format!("batches of {b} round-robin, processes"),
    };
    outln!(
        "{} files in {} classes, {} bytes; {} workers ({loader}); store +{} ms, {} B/s; \
         {} epoch(s), cache tiers {} x dataset each",
        r.files,
        r.classes,
        r.dataset_bytes,
        r.threads,
        r.latency_ms,
        r.bandwidth_bytes_per_sec,
        r.epochs,
        r.cache_frac
    );
    outln!(
        "{:<8}{:<12}{:<10}{:>10}{:>10}{:>10}{:>12}{:>10}{:>10}",
        "job",
        "prefetch",
        "order",
        "mean ms",
        "p99 ms",
        "job s",
        "pf files",
        "used",
        "wasted"
    );
    for c in &r.cells {
        outln!(
            "{:<8}{:<12}{:<10}{:>10.2}{:>10.2}{:>10.2}{:>12}{:>10}{:>10}",
            format!("{:?}", c.job_scope).to_lowercase(),
            c.prefetch,
            c.order,
            c.mean_ms,
            c.p99_ms,
            c.job_s,
            c.prefetched_files,
            c.prefetched_used,
            c.prefetched_wasted
        );
        if r.epochs > 1 {
            let e: Vec<String> = c.epoch_mean_ms.iter().map(|m| format!("{m:.2}")).collect();
            outln!("        mean ms per epoch: {}", e.join(" / "));
        }
    }
    for m in &r.mean_cuts {
        outln!(
            "mean latency cut by predictors, job = {:?}, {} order: {:.1}%",
            m.job_scope,
            m.order,
            m.cut * 100.0
        );
    }
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
            store: ColdStoreArgs {
                latency_ms: 1,
                bandwidth: "1GB".into(),
            },
            seed: 7,
            dir: None,
            job_scopes: vec![Scope::Group],
            modes: vec![PrefetchMode::Window, PrefetchMode::Predictors],
            orders: vec![Order::Name, Order::Shuffled],
            batch: 0,
            processes: false,
            epochs: 1,
            cache_frac: 2.0,
            worker_list: None,
        };
        let r = bench(&args).expect("bench");
        assert_eq!(r.files, 30);
        assert_eq!(r.cells.len(), 4);
        assert_eq!(r.mean_cuts.len(), 2);
        for c in &r.cells {
            assert_eq!(c.bytes, r.dataset_bytes, "{}/{}", c.prefetch, c.order);
            assert!(c.mean_ms > 0.0 && c.p99_ms >= c.mean_ms * 0.999);
            assert!(c.job_s > 0.0);
            assert!(c.prefetched_used + c.prefetched_wasted <= c.prefetched_files);
            if c.prefetch == "window" {
                assert_eq!(c.prefetched_files, 0, "window readahead stays in its file");
            }
        }
        // Batches dealt to threads, two job scopes, one mode and order, two epochs on a
        // cache smaller than the set: every file read once per epoch in each cell; no
        // cut without the window cells.
        let r = bench(&FsSmallArgs {
            batch: 4,
            epochs: 2,
            cache_frac: 0.3,
            job_scopes: vec![Scope::Thread, Scope::Group],
            modes: vec![PrefetchMode::Predictors],
            orders: vec![Order::Shuffled],
            ..args
        })
        .expect("bench batches");
        assert_eq!(r.cells.len(), 2);
        assert!(r.mean_cuts.is_empty());
        for c in &r.cells {
            assert_eq!(c.bytes, 2 * r.dataset_bytes, "{:?}", c.job_scope);
            assert_eq!(c.epoch_mean_ms.len(), 2);
        }
    }

    #[test]
    fn batches_are_dealt_round_robin_and_cover_the_order_once() {
        let order: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        let lists = deal_batches(&order, 3, 2);
        assert_eq!(lists[0], ["0", "1", "2", "6", "7", "8"]);
        assert_eq!(lists[1], ["3", "4", "5", "9"]);
        let mut all: Vec<_> = deal_batches(&order, 2, 4).concat();
        all.sort();
        let mut want = order.clone();
        want.sort();
        assert_eq!(all, want);
    }

    #[test]
    fn processes_need_batches() {
        let err = bench(&FsSmallArgs {
            json: true,
            files: 4,
            classes: 1,
            min_size: "1KiB".into(),
            max_size: "1KiB".into(),
            threads: 2,
            store: ColdStoreArgs {
                latency_ms: 0,
                bandwidth: "1GB".into(),
            },
            seed: 1,
            dir: None,
            job_scopes: vec![Scope::Group],
            modes: vec![PrefetchMode::Window],
            orders: vec![Order::Name],
            batch: 0,
            processes: true,
            epochs: 1,
            cache_frac: 2.0,
            worker_list: None,
        })
        .expect_err("no shared queue across processes");
        assert!(err.to_string().contains("--batch"), "{err}");
    }
}
