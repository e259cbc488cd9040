//! `strata bench chaos`: the real daemon (`strata serve` as a child process) under mixed
//! load, killed with SIGKILL at seeded-random moments and restarted on the same cache
//! dir, over an S3 store behind a fault-injecting proxy (issue 12).
//!
//! Set-up: an S3-compatible server (`--s3-endpoint`, or a `moto_server` started here),
//! a bucket holding a seeded dataset (`--files` files up to `--max-file-size`, bytes a
//! function of the seed, see [`content`]), the [`proxy`] in front of it (in this
//! process, so it outlives every kill), and a strata.toml with one `[[mounts]]` entry
//! over the proxy, the KV service on loopback, a small memory tier and a disk tier far
//! larger than everything put (so no acknowledged block is ever evicted: a block not
//! found is lost, not evicted).
//!
//! Each cycle: start the daemon, read its endpoints, check a sample of the blocks
//! acknowledged so far, let the [`load`] run (mount readers checking every byte; KV
//! clients putting blocks and getting earlier ones back), SIGKILL it at a random moment
//! within `--kill-after-ms`, detach its dead mount (`fusermount3 -uz`). After the last
//! cycle the daemon is started once more, every acknowledged block is checked, and it
//! is stopped with SIGTERM.
//!
//! Judged: an acknowledged block not found (lost), any wrong byte (mount or KV), a read
//! that fails while the daemon is up and the store is not down (failed), the longest
//! read (stall). Reads cut by a kill are counted apart and not judged.

pub mod content;
pub mod daemon;
pub mod load;
pub mod proxy;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::config::parse_size;
use daemon::{detach_mount, DaemonProc, DaemonSpec};
use load::{LoadCtx, LoadStats, Phase};
use proxy::{FaultPlan, FaultProxy};

#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Kill-restart cycles. 50: the "at least 50 times".
    #[arg(long, default_value_t = 50)]
    pub cycles: usize,
    /// Seed of the dataset, the keys, the kill moments and the faults.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// The kill comes this long after the daemon is ready (ms, a range drawn per
    /// cycle). 500..3000: kills land in every phase, from the first lookups of a
    /// fresh mount to a warmed-up steady state.
    #[arg(long, default_value = "500..3000")]
    pub kill_after_ms: String,
    /// Fraction of store requests answered 500/503. 0.3: the figure.
    #[arg(long, default_value_t = 0.3)]
    pub store_error_rate: f64,
    /// Fraction of store requests delayed by a latency spike.
    #[arg(long, default_value_t = 0.05)]
    pub spike_rate: f64,
    /// A spike's extra latency (ms, range).
    #[arg(long, default_value = "300..1500")]
    pub spike_ms: String,
    /// How long the store stays up between down windows (ms, range). 3000..10000:
    /// several windows per minute, most cycles see one start or end.
    #[arg(long, default_value = "3000..10000")]
    pub store_up_ms: String,
    /// How long the store is down each time (ms, range; "0..0" never). 1000..6000:
    /// "down for seconds", often longer than the ~3.6 s of backoff the store client's
    /// retries ride out, so some reads must fail, and the report shows how fast.
    #[arg(long, default_value = "1000..6000")]
    pub store_down_ms: String,
    /// Dataset files in the bucket. 64 (of up to 8 MiB, ~290 MiB): more than the
    /// readers cover in a run, so reads keep reaching the store cycle after cycle.
    #[arg(long, default_value_t = 64)]
    pub files: usize,
    /// Largest dataset file (sizes uniform from an eighth of it). 8MiB: several
    /// blocks per file at the default 1 MiB block size.
    #[arg(long, default_value = "8MiB")]
    pub max_file_size: String,
    /// Largest range one read asks for.
    #[arg(long, default_value = "1MiB")]
    pub max_read: String,
    /// Mount reader threads. 3: concurrent readers without starving the KV clients on
    /// a small machine.
    #[arg(long, default_value_t = 3)]
    pub readers: usize,
    /// KV clients (one connection each).
    #[arg(long, default_value_t = 4)]
    pub kv_clients: usize,
    /// KV block sizes (range, bytes; each block's size derives from its key).
    #[arg(long, default_value = "4KiB..64KiB")]
    pub block_size: String,
    /// Pause between one KV client's operations (ms). 5: a few hundred operations a
    /// second in all, so 50 cycles put a few hundred MiB, not tens of GiB.
    #[arg(long, default_value_t = 5)]
    pub kv_pause_ms: u64,
    /// Acknowledged blocks checked after each restart (all of them after the last).
    #[arg(long, default_value_t = 200)]
    pub verify_sample: usize,
    /// The daemon's memory tier. 16MiB: small, so blocks move to disk and back.
    #[arg(long, default_value = "16MiB")]
    pub memory: String,
    /// The daemon's disk tier. 16GiB: far above what a run puts (nothing acknowledged
    /// is evicted); only the bytes written use space.
    #[arg(long, default_value = "16GiB")]
    pub disk: String,
    /// The mount's `passthrough_max` (files up to it are copied whole at open and read
    /// by the kernel from the copy; "0": every read goes through the block cache).
    /// Default: the mount's own default.
    #[arg(long, default_value = "64MiB")]
    pub passthrough_max: String,
    /// Mount writers (the mount takes writes when there are any): each writes new
    /// files, `fsync`s and closes them; confirmed ones must survive every kill, and no
    /// file may ever be present torn. 1.
    #[arg(long, default_value_t = 1)]
    pub writers: usize,
    /// Largest file a writer writes (one in five is over 8 MiB, a multipart upload,
    /// when this allows). 12MiB.
    #[arg(long, default_value = "12MiB")]
    pub max_write_size: String,
    /// An S3-compatible endpoint (credentials from AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION). Default: start `moto_server` from PATH.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Bucket of the dataset (created with an unsigned PUT if missing).
    #[arg(long, default_value = "strata-chaos")]
    pub bucket: String,
    /// Working directory (cache, mount point, config, daemon log). Default: a temp dir.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The `strata` binary to run as the daemon. Default: this one.
    #[arg(long)]
    pub strata_bin: Option<PathBuf>,
}

impl Default for ChaosArgs {
    fn default() -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            a: ChaosArgs,
        }
        Wrap::parse_from(["chaos"]).a
    }
}

/// Store faults injected, as counted by the proxy.
#[derive(Debug, Serialize)]
pub struct StoreFaults {
    pub requests: u64,
    pub errors_injected: u64,
    pub spikes_injected: u64,
    pub answered_503_while_down: u64,
    pub connections_refused_while_down: u64,
    pub down_windows: usize,
    pub down_ms_total: u64,
}

/// The bench's result (the JSON printed).
#[derive(Debug, Serialize)]
pub struct ChaosReport {
    pub cycles: usize,
    pub acked_blocks: u64,
    pub lost_blocks: u64,
    /// Wrong bytes read through the mount plus wrong bytes of KV blocks.
    pub wrong_bytes: u64,
    /// Reads that failed while the daemon was up and the store was not down.
    pub failed_reads: u64,
    /// Longest read (open + read + close) while the daemon was up.
    pub max_read_stall_ms: u64,
    pub max_read_stall_ms_store_up: u64,
    pub reads: u64,
    pub read_mib: f64,
    pub read_p50_ms: f64,
    pub read_p99_ms: f64,
    pub reads_failed_while_store_down: u64,
    pub max_failed_read_ms_while_store_down: u64,
    pub reads_interrupted_by_kill: u64,
    pub reads_interrupted_while_store_down: u64,
    /// Longest a read cut by a kill had been waiting: a stall the kill hid, so a lower
    /// bound to add to `max_read_stall_ms` when judging stalls.
    pub max_interrupted_read_ms: u64,
    pub reads_ok_while_store_down: u64,
    pub short_reads: u64,
    pub file_wrong_bytes: u64,
    pub kv_wrong_bytes: u64,
    pub kv_gets: u64,
    pub kv_gets_found: u64,
    pub kv_put_errors_while_up: u64,
    pub kv_get_errors_while_up: u64,
    pub blocks_verified: u64,
    pub verify_errors: u64,
    /// Files written through the mount whose `fsync` and `close` succeeded.
    pub writes_acked: u64,
    pub write_errors_while_up: u64,
    pub writes_failed_while_store_down: u64,
    pub writes_interrupted_by_kill: u64,
    /// The final check of every started file (see `load::verify_written`).
    pub written: load::WrittenCheck,
    pub write_error_samples: Vec<String>,
    pub store_faults_injected: u64,
    pub store: StoreFaults,
    pub restart_ms_p50: u64,
    pub restart_ms_max: u64,
    pub wall_s: f64,
    pub failed_read_samples: Vec<String>,
    pub kv_error_samples: Vec<String>,
}

pub fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let _log = crate::init_logging("warn");
    let json = args.json;
    let report = run_chaos(&args)?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(
            "chaos: {} cycles, {} acknowledged blocks, {} lost, {} wrong bytes, {} failed reads \
             ({} while the store was down), max read stall {} ms ({} ms with the store up), \
             {} reads, {} store faults injected, restart p50 {} ms; written through the \
             mount: {} confirmed, {} lost, {} torn, {} unreadable",
            report.cycles,
            report.acked_blocks,
            report.lost_blocks,
            report.wrong_bytes,
            report.failed_reads,
            report.reads_failed_while_store_down,
            report.max_read_stall_ms,
            report.max_read_stall_ms_store_up,
            report.reads,
            report.store_faults_injected,
            report.restart_ms_p50,
            report.writes_acked,
            report.written.lost,
            report.written.torn,
            report.written.errors,
        );
        for s in report
            .failed_read_samples
            .iter()
            .chain(&report.kv_error_samples)
            .chain(&report.write_error_samples)
        {
            outln!("  {s}");
        }
    }
    Ok(())
}

/// Parses "A..B" into a range of u64 (B exclusive; "A..A" is empty).
fn parse_range(s: &str, what: &str) -> anyhow::Result<std::ops::Range<u64>> {
    let (a, b) = s
        .split_once("..")
        .with_context(|| format!("{what}: expected A..B, got {s:?}"))?;
    let (a, b) = (parse_size(a)?, parse_size(b)?);
    if b < a {
        bail!("{what}: {s:?} ends before it starts");
    }
    Ok(a..b)
}

/// Runs the whole bench and returns its report.
pub fn run_chaos(args: &ChaosArgs) -> anyhow::Result<ChaosReport> {
    let started = Instant::now();
    let kill_after = parse_range(&args.kill_after_ms, "--kill-after-ms")?;
    anyhow::ensure!(!kill_after.is_empty(), "--kill-after-ms must not be empty");
    let plan = FaultPlan {
        error_rate: args.store_error_rate,
        spike_rate: args.spike_rate,
        spike_ms: parse_range(&args.spike_ms, "--spike-ms")?,
        up_ms: parse_range(&args.store_up_ms, "--store-up-ms")?,
        down_ms: parse_range(&args.store_down_ms, "--store-down-ms")?,
    };
    let blocks = parse_range(&args.block_size, "--block-size")?;
    let max_file = parse_size(&args.max_file_size)?.max(8);
    let max_read = parse_size(&args.max_read)?.max(1);
    anyhow::ensure!(args.files > 0, "--files must be at least 1");

    let temp = match &args.dir {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("strata-chaos-")
                .tempdir()
                .context("creating the work dir")?,
        ),
    };
    let work = match (&args.dir, &temp) {
        (Some(d), _) => d.clone(),
        (None, Some(t)) => t.path().to_path_buf(),
        (None, None) => unreachable!("a temp dir is made when no dir is given"),
    };
    std::fs::create_dir_all(&work)?;
    let mnt = work.join("mnt");
    // A mount left by an earlier run in the same dir would make this one fail.
    detach_mount(&mnt);
    std::fs::create_dir_all(&mnt)?;
    let cache_dir = work.join("cache");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;

    // The store.
    let (access_key, secret_key, region) = credentials(args.s3_endpoint.is_none())?;
    let _moto;
    let endpoint = match &args.s3_endpoint {
        Some(e) => e.trim_end_matches('/').to_string(),
        None => {
            let m = Moto::start()?;
            let e = m.endpoint();
            _moto = m;
            e
        }
    };
    let mut rng = StdRng::seed_from_u64(args.seed);
    let file_sizes: Vec<u64> = (0..args.files)
        .map(|_| rng.random_range(max_file / 8..=max_file).max(1))
        .collect();
    rt.block_on(upload_dataset(
        &endpoint,
        &args.bucket,
        (&access_key, &secret_key, &region),
        args.seed,
        &file_sizes,
    ))?;
    let proxy = rt.block_on(FaultProxy::start(&endpoint, plan, args.seed))?;

    // The daemon.
    let config = work.join("strata.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"s3://{bucket}\"\nendpoint = \"{proxy}\"\nregion = \"{region}\"\n\
             allow_http = true\n\n\
             [cache]\ndir = \"{cache}\"\nmemory = \"{memory}\"\ndisk = \"{disk}\"\n\n\
             [kv]\nlisten = \"127.0.0.1:0\"\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n\n\
             [[mounts]]\nmountpoint = \"{mnt}\"\npassthrough_max = \"{passthrough}\"\n\
             allow_writes = {writes}\n",
            bucket = args.bucket,
            proxy = proxy.url(),
            cache = cache_dir.display(),
            memory = args.memory,
            disk = args.disk,
            mnt = mnt.display(),
            passthrough = args.passthrough_max,
            writes = args.writers > 0,
        ),
    )?;
    let binary = match &args.strata_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe().context("locating the strata binary")?,
    };
    let spec = DaemonSpec {
        binary,
        config,
        log: work.join("daemon.log"),
        mountpoint: mnt.clone(),
        env: vec![
            ("AWS_ACCESS_KEY_ID".into(), access_key),
            ("AWS_SECRET_ACCESS_KEY".into(), secret_key),
            ("AWS_REGION".into(), region),
            // The daemon's own log level, unless the caller chose one.
            (
                "RUST_LOG".into(),
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            ),
        ],
        ready_timeout: Duration::from_secs(60),
    };

    let ctx = Arc::new(LoadCtx {
        seed: args.seed,
        phase: Phase::default(),
        stats: LoadStats::default(),
        faults: proxy.faults.clone(),
        mountpoint: mnt.clone(),
        file_sizes,
        max_read,
        namespace: "chaos".into(),
        block_min: blocks.start,
        block_max: blocks.end.max(blocks.start),
        kv_pause: Duration::from_millis(args.kv_pause_ms),
        max_write: parse_size(&args.max_write_size)?.max(1),
        started,
    });
    let readers: Vec<_> = (0..args.readers)
        .map(|i| {
            let c = ctx.clone();
            std::thread::spawn(move || load::reader(c, i as u64))
        })
        .collect();
    let writers: Vec<_> = (0..args.writers)
        .map(|i| {
            let c = ctx.clone();
            std::thread::spawn(move || load::writer(c, i as u64))
        })
        .collect();
    let clients: Vec<_> = (0..args.kv_clients)
        .map(|i| rt.spawn(load::kv_client(ctx.clone(), i)))
        .collect();

    let outcome = cycles(args, &rt, &ctx, &spec, kill_after, &mut rng);
    ctx.phase.stop();
    for r in readers.into_iter().chain(writers) {
        let _ = r.join();
    }
    for c in clients {
        let _ = rt.block_on(c);
    }
    detach_mount(&mnt);
    let (verified, written, restarts) = outcome?;
    Ok(report(
        args, &ctx, &proxy, verified, written, restarts, started,
    ))
}

/// The kill-restart cycles, then the final check of every acknowledged block. Returns
/// the blocks checked and failed checks, and each start's time to ready.
fn cycles(
    args: &ChaosArgs,
    rt: &tokio::runtime::Runtime,
    ctx: &LoadCtx,
    spec: &DaemonSpec,
    kill_after: std::ops::Range<u64>,
    rng: &mut StdRng,
) -> anyhow::Result<(load::Verified, load::WrittenCheck, Vec<Duration>)> {
    let mut restarts = Vec::new();
    let mut total = load::Verified::default();
    for cycle in 0..=args.cycles {
        let d = DaemonProc::start(spec).with_context(|| format!("cycle {cycle}"))?;
        restarts.push(d.started_in);
        let last = cycle == args.cycles;
        let mut keys = ctx.stats.acked();
        if !last && keys.len() > args.verify_sample {
            keys = (0..args.verify_sample)
                .map(|_| keys[rng.random_range(0..keys.len())])
                .collect();
        }
        let v = match rt.block_on(load::verify(ctx, &d.kv_tcp, &keys)) {
            Ok(v) => v,
            Err(e) => {
                let _ = d.kill9();
                detach_mount(&spec.mountpoint);
                return Err(e.context(format!("verifying after restart {cycle}")));
            }
        };
        total.checked += v.checked;
        total.lost += v.lost;
        total.wrong_bytes += v.wrong_bytes;
        total.errors += v.errors;
        if last {
            ctx.phase.stop();
            let written = load::verify_written(ctx);
            d.terminate(Duration::from_secs(30))?;
            detach_mount(&spec.mountpoint);
            return Ok((total, written, restarts));
        }
        ctx.phase.up(&d.kv_tcp);
        std::thread::sleep(Duration::from_millis(rng.random_range(kill_after.clone())));
        // Down first: what runs from here on may be cut by the kill and is not judged.
        ctx.phase.down();
        d.kill9()?;
        detach_mount(&spec.mountpoint);
        tracing::info!(cycle, "killed");
    }
    unreachable!("the last cycle returns")
}

fn report(
    args: &ChaosArgs,
    ctx: &LoadCtx,
    proxy: &FaultProxy,
    verified: load::Verified,
    written: load::WrittenCheck,
    restarts: Vec<Duration>,
    started: Instant,
) -> ChaosReport {
    let s = &ctx.stats;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let mut lat = s
        .read_latencies_us
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() - 1) as f64 * p).round() as usize;
        lat[i] as f64 / 1000.0
    };
    let mut restart_ms: Vec<u64> = restarts.iter().map(|d| d.as_millis() as u64).collect();
    restart_ms.sort_unstable();
    let c = &proxy.faults.counters;
    let windows = proxy.faults.windows();
    let now = Instant::now();
    let store = StoreFaults {
        requests: get(&c.requests),
        errors_injected: get(&c.errors_injected),
        spikes_injected: get(&c.spikes_injected),
        answered_503_while_down: get(&c.answered_503_while_down),
        connections_refused_while_down: get(&c.connections_refused_while_down),
        down_windows: windows.len(),
        down_ms_total: windows
            .iter()
            .map(|w| (w.end.unwrap_or(now) - w.start).as_millis() as u64)
            .sum(),
    };
    let file_wrong = get(&s.file_wrong_bytes);
    let kv_wrong = get(&s.kv_wrong_bytes);
    ChaosReport {
        cycles: args.cycles,
        acked_blocks: get(&s.kv_puts_acked),
        lost_blocks: s.lost_count() as u64,
        wrong_bytes: file_wrong + kv_wrong,
        failed_reads: get(&s.failed_reads),
        max_read_stall_ms: get(&s.max_read_us) / 1000,
        max_read_stall_ms_store_up: get(&s.max_read_us_store_up) / 1000,
        reads: get(&s.reads),
        read_mib: get(&s.read_bytes) as f64 / (1u64 << 20) as f64,
        read_p50_ms: pct(0.5),
        read_p99_ms: pct(0.99),
        reads_failed_while_store_down: get(&s.reads_failed_while_store_down),
        max_failed_read_ms_while_store_down: get(&s.max_failed_read_us) / 1000,
        reads_interrupted_by_kill: get(&s.reads_interrupted_by_kill),
        reads_interrupted_while_store_down: get(&s.reads_interrupted_while_store_down),
        max_interrupted_read_ms: get(&s.max_interrupted_read_us) / 1000,
        reads_ok_while_store_down: get(&s.reads_ok_while_store_down),
        short_reads: get(&s.short_reads),
        file_wrong_bytes: file_wrong,
        kv_wrong_bytes: kv_wrong,
        kv_gets: get(&s.kv_gets),
        kv_gets_found: get(&s.kv_gets_found),
        kv_put_errors_while_up: get(&s.kv_put_errors_while_up),
        kv_get_errors_while_up: get(&s.kv_get_errors_while_up),
        blocks_verified: verified.checked,
        verify_errors: verified.errors,
        writes_acked: get(&s.writes_acked),
        write_errors_while_up: get(&s.write_errors_while_up),
        writes_failed_while_store_down: get(&s.writes_failed_while_store_down),
        writes_interrupted_by_kill: get(&s.writes_interrupted_by_kill),
        written,
        write_error_samples: s
            .write_error_samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        store_faults_injected: store.errors_injected
            + store.spikes_injected
            + store.answered_503_while_down
            + store.connections_refused_while_down,
        store,
        restart_ms_p50: restart_ms.get(restart_ms.len() / 2).copied().unwrap_or(0),
        restart_ms_max: restart_ms.last().copied().unwrap_or(0),
        wall_s: started.elapsed().as_secs_f64(),
        failed_read_samples: s
            .failed_read_samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        kv_error_samples: s
            .kv_error_samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
    }
}

/// (access key, secret key, region) from the environment; moto's conventional test
/// credentials when the bench starts moto itself and the environment has none.
fn credentials(own_moto: bool) -> anyhow::Result<(String, String, String)> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let region = env("AWS_REGION")
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|| "us-east-1".into());
    match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        (Some(a), Some(s)) => Ok((a, s, region)),
        _ if own_moto => Ok(("testing".into(), "testing".into(), region)),
        _ => bail!(
            "--s3-endpoint needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment"
        ),
    }
}

/// Creates the bucket (an unsigned PUT, which moto accepts; an existing bucket is kept)
/// and uploads the dataset, straight to the server (not through the proxy).
async fn upload_dataset(
    endpoint: &str,
    bucket: &str,
    (access_key, secret_key, region): (&str, &str, &str),
    seed: u64,
    sizes: &[u64],
) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    let r = http.put(format!("{endpoint}/{bucket}")).send().await;
    if let Err(e) = &r {
        bail!("cannot reach the S3 server at {endpoint}: {e}");
    }
    let opts = strata_cache_core::StoreOptions {
        endpoint: Some(endpoint.to_string()),
        region: Some(region.to_string()),
        access_key_id: Some(access_key.to_string()),
        secret_access_key: Some(secret_key.to_string()),
        allow_http: true,
        ..Default::default()
    };
    let store = strata_cache_core::BackingStore::from_url(&format!("s3://{bucket}"), &opts)?;
    for (i, &size) in sizes.iter().enumerate() {
        let mut data = vec![0u8; size as usize];
        content::fill(content::file_seed(seed, i), 0, &mut data);
        store
            .put(&content::file_name(i), Bytes::from(data))
            .await
            .with_context(|| {
                format!("uploading {} to {endpoint}/{bucket}", content::file_name(i))
            })?;
    }
    Ok(())
}

/// `moto_server` on a free loopback port, killed on drop.
struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    fn start() -> anyhow::Result<Moto> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context(
                "cannot start moto_server (not on PATH?): install it with \
                 `pip install 'moto[server]'` (scripts/install-deps.sh does), or pass --s3-endpoint",
            )?;
        let mut m = Moto { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(m);
            }
            if let Some(status) = m.child.try_wait()? {
                bail!("moto_server exited at start with {status}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("moto_server did not listen on port {port} within 30 s")
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
