//! `strata serve --config strata.toml`: one daemon running the KV service, any number
//! of mounts and the admin API on ONE cache core (one budget per tier). This command
//! only reads the file and applies the flags; `crate::daemon` builds and runs it (see
//! there for the endpoints it prints, shutdown, and the KV exposure rule).

use std::path::PathBuf;

use clap::Args;

use crate::config::StrataConfig;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (see `tools/src/config.rs`); default: built-in defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override `[kv] listen` (e.g. 127.0.0.1:0 for any free port).
    #[arg(long)]
    pub listen: Option<String>,
    /// Override `[kv] unix_socket`.
    #[arg(long)]
    pub unix_socket: Option<PathBuf>,
    /// Override `[admin] listen`.
    #[arg(long)]
    pub admin: Option<String>,
    /// Override `[cache] dir`. Default: a temp dir removed at exit (nothing cached
    /// survives a restart, and the KV socket in it moves): give one for a daemon whose
    /// restarts are warm.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Override `[cache] memory` (e.g. 2GiB).
    #[arg(long)]
    pub memory: Option<String>,
    /// Override `[cache] disk` (e.g. 10GiB, 0 to disable).
    #[arg(long)]
    pub disk: Option<String>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut cfg = match &args.config {
        Some(p) => StrataConfig::load(p)?,
        None => StrataConfig::default(),
    };
    if let Some(l) = args.listen {
        cfg.kv.listen = Some(l);
    }
    if let Some(u) = args.unix_socket {
        cfg.kv.unix_socket = Some(u);
    }
    if let Some(a) = args.admin {
        cfg.admin.listen = Some(a);
    }
    if let Some(d) = args.cache_dir {
        cfg.cache.dir = Some(d);
    }
    if let Some(m) = args.memory {
        cfg.cache.memory = m;
    }
    if let Some(d) = args.disk {
        cfg.cache.disk = d;
    }
    crate::daemon::run_until_signal(cfg)
}
