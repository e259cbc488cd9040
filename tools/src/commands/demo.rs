//! `strata demo`: the README's main job, the whole system on an embedded default.
//!
//! A sample dataset is generated into a local directory that serves as the object
//! store; one daemon (`crate::daemon`, as `strata serve` runs it, in-process) runs the cache core with its
//! caches in a temp dir, a FUSE mount of the dataset, the KV service and the admin API;
//! a short workload goes through both doors (two epochs of reads through the mount, a
//! prefix-sharing KV workload over gRPC), and the daemon's stats are printed as
//! `strata stats` shows them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use strata_kvcache::client::KvClient;
use strata_kvcache::keys::chain_hashes_v1;
use tokio_util::sync::CancellationToken;

use crate::admin::fetch_stats;
use crate::commands::stats::render;
use crate::config::{AdminConfig, CacheConfig, KvConfig, MountConfig, StoreConfig, StrataConfig};

/// A progress line: on stdout for a reader, on stderr with `--json` so that stdout is
/// the JSON alone (black-box finding: `strata demo --json | jq` failed).
macro_rules! progress {
    ($json:expr, $($arg:tt)*) => {
        if $json {
            eprintln!($($arg)*);
        } else {
            outln!($($arg)*);
        }
    };
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where to generate the sample dataset (default: a temp dir).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Number of small sample files.
    #[arg(long, default_value_t = 500)]
    pub files: usize,
    /// Print the final stats as JSON.
    #[arg(long)]
    pub json: bool,
}

/// How long a stop signal waits for the demo's orderly stop (the workload leaves the
/// mount, the daemon unmounts) before the mount is released by force.
const STOP_GRACE: Duration = Duration::from_secs(15);

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    // The demo serves its own mount: a signal's default exit wedged it on that mount,
    // and an inherited ignored SIGINT let it run on (black-box findings). Caught, a
    // signal stops it in order; `exit_on_signal` is the backstop.
    crate::signals::catch().context("catching stop signals")?;
    crate::signals::exit_on_signal(STOP_GRACE).context("watching stop signals")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if !args.json {
        return rt.block_on(run_async(args)).map(|_| ());
    }
    // With --json, stdout is the JSON alone: what the in-process daemon prints as it
    // starts (its listeners, "ready") goes to stderr meanwhile (black-box finding:
    // `strata demo --json | jq` failed on those lines).
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: dup/dup2 of the process's standard descriptors; no memory is passed.
    let saved = unsafe { libc::dup(1) };
    if saved >= 0 {
        // SAFETY: as above.
        unsafe { libc::dup2(2, 1) };
    }
    let result = rt.block_on(run_async(args));
    let _ = std::io::stdout().flush();
    if saved >= 0 {
        // SAFETY: as above; `saved` is ours to close.
        unsafe {
            libc::dup2(saved, 1);
            libc::close(saved);
        }
    }
    if let Some(json) = result? {
        outln!("{json}");
    }
    Ok(())
}

/// Runs the demo; with `--json`, returns the final stats as JSON instead of printing.
async fn run_async(args: DemoArgs) -> anyhow::Result<Option<String>> {
    if args.files == 0 {
        // The demo waits for its dataset's directory to show in the mount.
        anyhow::bail!("--files must be at least 1: the demo reads the dataset it makes");
    }
    let temp = tempfile::Builder::new().prefix("strata-demo-").tempdir()?;
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| temp.path().join("dataset"));
    let files = generate_dataset(&data_dir, args.files)?;
    if let Some(sig) = crate::signals::received() {
        return Err(crate::signals::interrupted(
            sig,
            "before the daemon started",
        ));
    }
    progress!(
        args.json,
        "sample dataset: {} files in {}",
        files.len(),
        data_dir.display()
    );

    let mountpoint = temp.path().join("mnt");
    let socket = temp.path().join("kv.sock");
    let admin = format!("127.0.0.1:{}", free_port()?);
    let cfg = StrataConfig {
        store: StoreConfig {
            url: Some(format!("file://{}", data_dir.display())),
            ..Default::default()
        },
        cache: CacheConfig {
            dir: Some(temp.path().join("cache")),
            memory: "256MiB".into(),
            disk: "1GiB".into(),
            ..Default::default()
        },
        kv: KvConfig {
            listen: None,
            unix_socket: Some(socket.clone()),
            ..Default::default()
        },
        admin: AdminConfig {
            listen: Some(admin.clone()),
            ..Default::default()
        },
        mounts: vec![MountConfig {
            mountpoint: mountpoint.clone(),
            ..Default::default()
        }],
        // The demo is one node.
        cluster: None,
    };
    crate::signals::own_mount(&mountpoint);
    let stop = CancellationToken::new();
    let daemon = tokio::spawn(crate::daemon::run(cfg, stop.clone()));
    let cancel = CancellationToken::new();
    let work = workload(&mountpoint, &socket, &admin, args.json, &cancel);
    tokio::pin!(work);
    let result = tokio::select! {
        r = &mut work => r,
        sig = crate::signals::recv() => {
            progress!(args.json, "{}: stopping the workload, then the daemon", signal_word(sig));
            cancel.cancel();
            // Run to its end: the readers on the mount close their files at their next
            // one, while the mount still serves them, before the daemon unmounts.
            let _ = work.await;
            Err(crate::signals::interrupted(sig, "the workload stopped and the mount is gone"))
        }
    };
    stop.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(30), daemon).await;
    let json = result?;
    match stopped {
        Ok(Ok(Ok(()))) => Ok(json),
        Ok(Ok(Err(e))) => Err(e.context("daemon")),
        Ok(Err(join)) => bail!("daemon task failed: {join}"),
        Err(_) => bail!("daemon did not stop within 30 s"),
    }
}

fn signal_word(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "interrupted",
        libc::SIGHUP => "hung up",
        _ => "terminated",
    }
}

/// An error once `cancel` was cancelled (a stop signal): the workload's steps check
/// it, so that it ends soon, in order.
fn check(cancel: &CancellationToken) -> anyhow::Result<()> {
    if cancel.is_cancelled() {
        bail!("the workload was stopped");
    }
    Ok(())
}

async fn workload(
    mountpoint: &Path,
    socket: &Path,
    admin: &str,
    json: bool,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<String>> {
    wait_for(|| mountpoint.join("train").is_dir(), "the mount", cancel).await?;
    wait_for(|| socket.exists(), "the KV socket", cancel).await?;
    progress!(
        json,
        "daemon up: mount at {}, KV service on {}, admin on {admin}",
        mountpoint.display(),
        socket.display()
    );

    // Door 1: a training job reads the dataset through the mount, twice.
    for epoch in 1..=2 {
        let root = mountpoint.to_path_buf();
        let stopped = cancel.clone();
        let (n, bytes, secs) =
            tokio::task::spawn_blocking(move || read_tree(&root, &stopped)).await??;
        progress!(
            json,
            "mount epoch {epoch}: {n} files, {:.1} MiB in {secs:.3} s ({:.0} MiB/s)",
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
        );
    }

    // Door 2: an inference engine shares a system prompt across requests.
    let mut kv = KvClient::connect(&format!("unix://{}", socket.display())).await?;
    let ns = "demo-model/tenant-a";
    let block_tokens = 256;
    let block_bytes = 256 << 10;
    let system_prompt: Vec<u32> = (0..4 * block_tokens as u32).collect();
    let mut reused = 0usize;
    let mut total = 0usize;
    for request in 0..8u32 {
        check(cancel)?;
        let mut tokens = system_prompt.clone();
        tokens.extend((0..4 * block_tokens as u32).map(|t| 100_000 + request * 10_000 + t));
        let chain = chain_hashes_v1(&tokens, block_tokens, b"", false);
        let cached = kv.match_prefix(ns, &chain).await?;
        reused += cached;
        total += chain.len();
        for (i, h) in chain.iter().enumerate().skip(cached) {
            kv.put(ns, h, block_payload(h, i, block_bytes)).await?;
        }
        // Read back the whole chain as the engine would before decoding.
        for (i, h) in chain.iter().enumerate() {
            let got = kv
                .get(ns, h)
                .await?
                .context("a block just put is missing")?;
            if got != block_payload(h, i, block_bytes) {
                bail!("KV block {i} of request {request} came back different");
            }
        }
    }
    progress!(json, "kv: 8 requests, {reused} of {total} prefix blocks reused from the cache instead of recomputed");

    check(cancel)?;
    let stats = fetch_stats(&format!("http://{admin}")).await?;
    if json {
        return Ok(Some(serde_json::to_string_pretty(&stats)?));
    }
    outln!();
    out!("{}", render(admin, &stats, None));
    Ok(None)
}

fn block_payload(hash: &[u8], index: usize, len: usize) -> Bytes {
    let seed = u64::from_le_bytes(hash[..8].try_into().unwrap_or([0; 8])) ^ index as u64;
    pseudo_random(len, seed)
}

/// Reads every file under `root`, until `cancel`; returns (files, bytes, seconds).
fn read_tree(root: &Path, cancel: &CancellationToken) -> anyhow::Result<(usize, u64, f64)> {
    let t = Instant::now();
    let (mut n, mut bytes) = (0usize, 0u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            check(cancel)?;
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                bytes += std::fs::read(&path)
                    .with_context(|| format!("reading {}", path.display()))?
                    .len() as u64;
                n += 1;
            }
        }
    }
    Ok((n, bytes, t.elapsed().as_secs_f64()))
}

async fn wait_for(
    ready: impl Fn() -> bool,
    what: &str,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        check(cancel)?;
        if Instant::now() > deadline {
            bail!("{what} did not come up within 30 s (FUSE needs root and /dev/fuse)");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Writes `n` small files (imagenet-like names) and two multi-block files.
fn generate_dataset(dir: &std::path::Path, n: usize) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for i in 0..n {
        // A large dataset takes a while to write: a stop signal ends it.
        if crate::signals::received().is_some() {
            break;
        }
        let class = format!("n{:08}", 1_440_764 + (i % 10));
        let p = dir
            .join("train")
            .join(&class)
            .join(format!("{class}_{:05}.JPEG", i));
        let size = 8 * 1024 + (i * 7919) % (64 * 1024);
        write_file(&p, &pseudo_random(size, i as u64))?;
        out.push(p);
    }
    for i in 0..2 {
        let p = dir.join("shards").join(format!("train-{i:06}.tar"));
        write_file(&p, &pseudo_random(12 << 20, 1000 + i))?;
        out.push(p);
    }
    Ok(out)
}

fn write_file(p: &std::path::Path, data: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(p, data).with_context(|| format!("writing {}", p.display()))
}

/// Deterministic bytes (xorshift) so runs are comparable.
pub fn pseudo_random(len: usize, seed: u64) -> Bytes {
    strata_cache_core::testdata::xorshift_bytes(len, seed).into()
}
