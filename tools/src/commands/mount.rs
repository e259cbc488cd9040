//! `strata mount SOURCE MOUNTPOINT`: mount a bucket/prefix (or a local directory) as a
//! read-only directory through the cache.
//!
//! Without `--foreground` the command re-executes itself in the foreground as a
//! detached child (new session, output to `<cache dir>/mount.log` or /dev/null), waits
//! until the mount shows up in the mount table, and exits: a fork after the tokio
//! runtime exists would be unsafe, a re-exec is not. The foreground process is the
//! daemon (`crate::daemon::run`, as `strata serve` runs it) with this one mount, built
//! from the same `MountConfig` as a `[[mounts]]` entry, and no KV service: it unmounts
//! cleanly on SIGINT/SIGTERM, and exits when the mount is removed from outside
//! (`fusermount3 -u`/`umount`); `auto_unmount` covers a crash.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

use crate::config::{AdminConfig, CacheConfig, KvConfig, MountConfig, StoreConfig, StrataConfig};

#[derive(Debug, Args)]
pub struct MountArgs {
    /// Store URL: file:///data, s3://bucket/prefix, gs://..., az://...
    pub source: String,
    /// The mount: MOUNTPOINT and the options `[[mounts]]` in strata.toml takes, with
    /// the same defaults.
    #[command(flatten)]
    pub mount: MountConfig,
    /// Cache directory (disk tier, passthrough copies); default: a temp dir.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Memory tier budget (`[cache] memory`).
    #[arg(long, default_value_t = CacheConfig::default().memory)]
    pub memory_cache: String,
    /// Disk tier budget ("0" disables it; `[cache] disk`).
    #[arg(long, default_value_t = CacheConfig::default().disk)]
    pub disk_cache: String,
    /// Admin API address for `strata stats` (e.g. 127.0.0.1:7072); default: none, so
    /// several mounts and a `strata serve` can run side by side.
    #[arg(long)]
    pub admin: Option<String>,
    /// Stay in the foreground (logs to stderr).
    #[arg(long)]
    pub foreground: bool,
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
}

impl MountArgs {
    /// The daemon configuration these flags describe: the store, the cache, this one
    /// mount, no KV service.
    pub fn to_config(&self) -> StrataConfig {
        StrataConfig {
            store: StoreConfig {
                url: Some(self.source.clone()),
                endpoint: self.endpoint.clone(),
                region: self.region.clone(),
                access_key_id: self.access_key_id.clone(),
                secret_access_key: self.secret_access_key.clone(),
                allow_http: self.allow_http,
            },
            cache: CacheConfig {
                dir: self.cache_dir.clone(),
                memory: self.memory_cache.clone(),
                disk: self.disk_cache.clone(),
                ..Default::default()
            },
            kv: KvConfig {
                enabled: false,
                ..Default::default()
            },
            admin: AdminConfig {
                listen: self.admin.clone(),
                ..Default::default()
            },
            mounts: vec![self.mount.clone()],
        }
    }
}

pub fn run(args: MountArgs) -> anyhow::Result<()> {
    if !args.mount.mountpoint.is_dir() {
        bail!(
            "mountpoint {} is not a directory",
            args.mount.mountpoint.display()
        );
    }
    if !args.foreground {
        return daemonize(&args);
    }
    crate::daemon::run_until_signal(args.to_config())
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
        if is_mounted(&args.mount.mountpoint) {
            println!(
                "mounted {} at {} (pid {})",
                args.source,
                args.mount.mountpoint.display(),
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
