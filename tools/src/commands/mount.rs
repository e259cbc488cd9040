//! `strata mount SOURCE MOUNTPOINT`: mount a bucket/prefix (or a local directory) as a
//! read-only directory through the cache.
//!
//! Without `--foreground` the command re-executes itself in the foreground as a
//! detached child (new session, output to `<cache dir>/mount.log` or /dev/null), waits
//! until the mount shows up in the mount table, and exits: a fork after the tokio
//! runtime exists would be unsafe, a re-exec is not. The foreground process unmounts
//! cleanly on SIGINT/SIGTERM, and exits when the mount is removed from outside
//! (`fusermount3 -u`/`umount`); `auto_unmount` covers a crash.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use strata_cache_core::ObjectReader;
use strata_fs::{MountOptions, PassthroughOptions};

use crate::config::{open_core, open_store, parse_size, CacheConfig, StoreConfig};

#[derive(Debug, Args)]
pub struct MountArgs {
    /// Store URL: file:///data, s3://bucket/prefix, gs://..., az://...
    pub source: String,
    /// Existing empty directory to mount on.
    pub mountpoint: PathBuf,
    /// Cache directory (disk tier, passthrough copies); default: a temp dir.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Memory tier budget.
    #[arg(long, default_value = "1GiB")]
    pub memory_cache: String,
    /// Disk tier budget ("0" disables it).
    #[arg(long, default_value = "10GiB")]
    pub disk_cache: String,
    /// Seconds listings and attributes are cached (see strata_fs::CoreOptions).
    #[arg(long, default_value_t = 5)]
    pub metadata_ttl: u64,
    /// Stay in the foreground (logs to stderr).
    #[arg(long)]
    pub foreground: bool,
    /// Let other users read the mount.
    #[arg(long)]
    pub allow_other: bool,
    /// S3-compatible endpoint (e.g. http://127.0.0.1:9000).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Allow a plain-HTTP endpoint.
    #[arg(long)]
    pub allow_http: bool,
    #[arg(long)]
    pub region: Option<String>,
    /// Access key (default: AWS_ACCESS_KEY_ID from the environment).
    #[arg(long)]
    pub access_key_id: Option<String>,
    /// Secret key (default: AWS_SECRET_ACCESS_KEY from the environment).
    #[arg(long)]
    pub secret_access_key: Option<String>,
    /// Largest object kept as a plain file for FUSE passthrough ("0" disables
    /// passthrough).
    #[arg(long, default_value = "64MiB")]
    pub passthrough_max: String,
    /// Prefetching: `predictors` (the prefetch crate's rate-following sequential and
    /// semantic next-file predictors, fed every read and listing) or `window`
    /// (per-file window doubling only).
    #[arg(long, value_enum, default_value_t = PrefetchMode::Predictors)]
    pub prefetch: PrefetchMode,
    /// Kernel readahead of the mount in KiB.
    #[arg(long, default_value_t = 4096)]
    pub read_ahead_kb: u32,
}

/// How a mount prefetches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrefetchMode {
    /// Per-file window doubling (strata_fs::readahead).
    Window,
    /// Sequential + semantic predictors (strata_prefetch).
    Predictors,
}

impl PrefetchMode {
    /// Applies the mode to a core's options.
    pub fn apply(self, core: &mut strata_fs::CoreOptions) {
        core.predictors = match self {
            PrefetchMode::Window => None,
            PrefetchMode::Predictors => {
                Some(std::sync::Arc::new(strata_fs::Predictors::standard()))
            }
        };
    }
}

pub fn run(args: MountArgs) -> anyhow::Result<()> {
    if !args.mountpoint.is_dir() {
        bail!(
            "mountpoint {} is not a directory",
            args.mountpoint.display()
        );
    }
    if !args.foreground {
        return daemonize(&args);
    }
    crate::init_logging("info");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata-fs")
        .build()
        .context("starting the runtime")?;
    rt.block_on(serve(args))
}

async fn serve(args: MountArgs) -> anyhow::Result<()> {
    let store_cfg = StoreConfig {
        url: Some(args.source.clone()),
        endpoint: args.endpoint.clone(),
        region: args.region.clone(),
        access_key_id: args.access_key_id.clone(),
        secret_access_key: args.secret_access_key.clone(),
        allow_http: args.allow_http,
    };
    let store = open_store(&args.source, &store_cfg)?;
    let cache_cfg = CacheConfig {
        dir: args.cache_dir.clone(),
        memory: args.memory_cache.clone(),
        disk: args.disk_cache.clone(),
        ..Default::default()
    };
    let core = open_core(&cache_cfg)?;
    let reader = ObjectReader::new(core.engine.clone(), store, core.block_size)?;
    let mut opts = MountOptions {
        allow_other: args.allow_other,
        fsname: args.source.clone(),
        read_ahead_kb: Some(args.read_ahead_kb),
        ..Default::default()
    };
    opts.core.metadata_ttl = Duration::from_secs(args.metadata_ttl);
    args.prefetch.apply(&mut opts.core);
    let pt_max = parse_size(&args.passthrough_max)?;
    if pt_max > 0 {
        let mut pt = PassthroughOptions::new(core.cache_dir.join("passthrough"));
        pt.max_object = pt_max;
        opts.core.passthrough = Some(pt);
    }
    let handle = strata_fs::spawn(reader, "", &args.mountpoint, opts)
        .with_context(|| format!("mounting {} at {}", args.source, args.mountpoint.display()))?;
    println!("mounted {} at {}", args.source, args.mountpoint.display());

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT: unmounting"); break; }
            _ = term.recv() => { tracing::info!("SIGTERM: unmounting"); break; }
            _ = tick.tick() => if handle.is_finished() {
                tracing::info!("unmounted from outside");
                break;
            },
        }
    }
    tokio::task::spawn_blocking(move || handle.unmount())
        .await
        .context("unmount task")??;
    drop(core);
    Ok(())
}

/// Re-executes this command with `--foreground` in a new session and waits until the
/// mount appears (or the child fails).
fn daemonize(args: &MountArgs) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("locating the strata binary")?;
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    argv.push("--foreground".into());
    let log = match &args.cache_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            std::fs::File::create(d.join("mount.log"))?.into()
        }
        None => std::process::Stdio::null(),
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(argv)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no parent state.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the mount daemon")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if is_mounted(&args.mountpoint) {
            println!(
                "mounted {} at {} (pid {})",
                args.source,
                args.mountpoint.display(),
                child.id()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("mount daemon exited with {status} (see --foreground for its log)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    bail!("mount did not appear within 60 s")
}

/// Whether `path` is a mount point in this namespace's mount table.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(p) = path.canonicalize() else {
        return false;
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .any(|l| l.split(' ').nth(4).map(Path::new) == Some(p.as_path()))
}
