//! `strata serve --config strata.toml`: one daemon running the KV service, any number
//! of mounts and the admin API on ONE cache core (one budget per tier).
//!
//! - The KV service listens on a Unix socket (default `<cache dir>/kv.sock`) and on TCP
//!   (`[kv] listen`, default 127.0.0.1:7070). A non-loopback TCP address is refused
//!   unless TLS (`tls_cert`, `tls_key`) and a `token` are configured: KV blocks are a
//!   tenant's prompts in another form, and must not leave the host in clear or to
//!   anyone who asks.
//! - The admin API (`[admin] listen`, default 127.0.0.1:7071) serves `/stats` and
//!   `/metrics`; `strata stats` reads it.
//! - SIGINT or SIGTERM: stop accepting, finish requests in flight, unmount, exit.
//!
//! Once listening, the daemon prints one line per endpoint (`kv tcp 127.0.0.1:7070`,
//! `kv unix /path`, `admin 127.0.0.1:7071`, `mount /mnt/x`) then `ready`, so scripts
//! and tests can start it with port 0 and read the bound addresses.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use strata_kvcache::server::{self as kv, KvService, ServerConfig, TlsFiles};
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminState, MountInfo};
use crate::config::{open_core, open_store, parse_size, KvConfig, StrataConfig};

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
    /// Override `[cache] dir`.
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
    strata_kvcache::server::tune_allocator();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let stop = CancellationToken::new();
        let signal_stop = stop.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            eprintln!("shutting down");
            signal_stop.cancel();
        });
        serve(cfg, stop).await
    })
}

async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the daemon");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Checks that exposing the KV service on `addr` is allowed by `kv`: loopback always;
/// any other address only with TLS and a token.
pub fn check_exposure(addr: &SocketAddr, kv: &KvConfig) -> anyhow::Result<()> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    let mut missing = Vec::new();
    if kv.tls_cert.is_none() || kv.tls_key.is_none() {
        missing.push("TLS (`tls_cert` and `tls_key`)");
    }
    if kv.token.as_deref().is_none_or(str::is_empty) {
        missing.push("a `token`");
    }
    if !missing.is_empty() {
        bail!(
            "refusing to serve the KV service on non-loopback address {addr} without {}: \
             set them in [kv] of strata.toml, or listen on 127.0.0.1",
            missing.join(" and ")
        );
    }
    Ok(())
}

fn resolve(listen: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    listen
        .to_socket_addrs()
        .with_context(|| format!("bad listen address {listen:?}"))?
        .next()
        .with_context(|| format!("{listen:?} resolves to no address"))
}

/// The KV server settings of `kv` (sizes parsed, TLS files named).
pub fn server_config(kv: &KvConfig) -> anyhow::Result<ServerConfig> {
    Ok(ServerConfig {
        max_block: parse_size(&kv.max_block)?,
        namespaces: kv.namespaces.clone(),
        token: kv.token.clone().filter(|t| !t.is_empty()),
        tls: match (&kv.tls_cert, &kv.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None) => None,
            _ => bail!("[kv] needs both tls_cert and tls_key, or neither"),
        },
        ..Default::default()
    })
}

/// Runs the daemon of `cfg` until `stop` is cancelled.
pub async fn serve(cfg: StrataConfig, stop: CancellationToken) -> anyhow::Result<()> {
    let started = Instant::now();
    let kv_cfg = server_config(&cfg.kv)?;
    // Check before opening anything, so a refused configuration leaves no trace.
    let tcp_addr = match &cfg.kv.listen {
        Some(l) if !l.is_empty() => {
            let a = resolve(l)?;
            check_exposure(&a, &cfg.kv)?;
            Some(a)
        }
        _ => None,
    };
    let core = open_core(&cfg.cache)?;
    let service = KvService::new(core.engine.clone(), kv_cfg);
    let mut tasks = tokio::task::JoinSet::new();

    if let Some(addr) = tcp_addr {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding KV service on {addr}"))?;
        println!("kv tcp {}", l.local_addr()?);
        let (svc, stop) = (service.clone(), stop.clone());
        tasks.spawn(async move {
            kv::serve(l, svc, stop.cancelled_owned())
                .await
                .context("KV service (tcp)")
        });
    }
    let sock = cfg
        .kv
        .unix_socket
        .clone()
        .unwrap_or_else(|| core.cache_dir.join("kv.sock"));
    // A socket file left by a daemon that died is stale: nothing can be listening on it
    // if binding fails otherwise, so remove it first.
    if sock.exists() {
        if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            bail!("another daemon is listening on {}", sock.display());
        }
        std::fs::remove_file(&sock)
            .with_context(|| format!("removing stale socket {}", sock.display()))?;
    }
    let ul = tokio::net::UnixListener::bind(&sock)
        .with_context(|| format!("binding {}", sock.display()))?;
    println!("kv unix {}", sock.display());
    {
        let (svc, stop) = (service.clone(), stop.clone());
        tasks.spawn(async move {
            kv::serve(ul, svc, stop.cancelled_owned())
                .await
                .context("KV service (unix)")
        });
    }

    let mut mounts = Vec::new();
    let mut infos = Vec::new();
    if !cfg.mounts.is_empty() {
        let url = cfg
            .store
            .url
            .as_deref()
            .context("[[mounts]] need a [store] url")?;
        let store = open_store(url, &cfg.store)?;
        for m in &cfg.mounts {
            let reader = strata_cache_core::ObjectReader::new(
                core.engine.clone(),
                store.clone(),
                core.block_size,
            )?;
            let mut opts = strata_fs::MountOptions {
                allow_other: m.allow_other,
                fsname: url.to_string(),
                ..Default::default()
            };
            if let Some(ttl) = m.metadata_ttl_secs {
                opts.core.metadata_ttl = Duration::from_secs(ttl);
            }
            std::fs::create_dir_all(&m.mountpoint)
                .with_context(|| format!("creating {}", m.mountpoint.display()))?;
            let h = strata_fs::spawn(reader, &m.prefix, &m.mountpoint, opts)
                .with_context(|| format!("mounting {} at {}", url, m.mountpoint.display()))?;
            println!("mount {}", m.mountpoint.display());
            infos.push(MountInfo {
                mountpoint: m.mountpoint.clone(),
                prefix: m.prefix.clone(),
            });
            mounts.push(h);
        }
    }

    if let Some(a) = cfg.admin.listen.as_deref().filter(|a| !a.is_empty()) {
        let addr = resolve(a)?;
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "admin API (read-only stats) is reachable beyond this host");
        }
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding admin API on {addr}"))?;
        println!("admin {}", l.local_addr()?);
        let state = AdminState {
            engine: core.engine.clone(),
            kv: Some(service.clone()),
            mounts: infos,
            started,
        };
        let stop = stop.clone();
        tasks.spawn(async move { admin::serve(l, state, stop.cancelled_owned()).await });
    }
    println!("ready");

    // Run until stopped, or until a server fails (then stop the others).
    let mut result = Ok(());
    tokio::select! {
        biased;
        _ = stop.cancelled() => {}
        Some(r) = tasks.join_next() => {
            result = r.context("server task panicked").and_then(|r| r);
            // A server that ends cleanly because a stop was requested meanwhile is
            // the normal shutdown, not a failure.
            if result.is_ok() && !stop.is_cancelled() {
                result = Err(anyhow::anyhow!("a server stopped unexpectedly"));
            }
            stop.cancel();
        }
    }
    // Finish in-flight requests; bounded so a stuck client cannot hold the exit.
    let drain = async {
        while let Some(r) = tasks.join_next().await {
            if let Ok(Err(e)) = r {
                tracing::warn!(error = %e, "server ended with an error");
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after 10 s; exiting anyway");
    }
    for m in mounts {
        if let Err(e) = m.unmount() {
            tracing::warn!(error = %e, "unmount failed");
        }
    }
    let _ = std::fs::remove_file(&sock);
    drop(core);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_loopback_needs_tls_and_token() {
        let mut kv = KvConfig::default();
        let lo: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        assert!(check_exposure(&lo, &kv).is_ok());
        let e = check_exposure(&any, &kv).unwrap_err().to_string();
        assert!(e.contains("TLS") && e.contains("token"), "{e}");
        kv.token = Some("t".into());
        let e = check_exposure(&any, &kv).unwrap_err().to_string();
        assert!(e.contains("TLS") && !e.contains("a `token`"), "{e}");
        kv.tls_cert = Some("c.pem".into());
        kv.tls_key = Some("k.pem".into());
        assert!(check_exposure(&any, &kv).is_ok());
        kv.token = Some(String::new());
        assert!(
            check_exposure(&any, &kv).is_err(),
            "an empty token is no token"
        );
    }

    #[tokio::test]
    async fn refused_configuration_fails_before_binding() {
        let mut cfg = StrataConfig::default();
        cfg.kv.listen = Some("0.0.0.0:0".into());
        let e = serve(cfg, CancellationToken::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("refusing"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_kv_and_admin_then_stops() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = StrataConfig::default();
        cfg.cache.dir = Some(dir.path().to_path_buf());
        cfg.cache.memory = "16MiB".into();
        cfg.cache.disk = "0".into();
        cfg.kv.listen = None;
        cfg.admin.listen = Some("127.0.0.1:0".into());
        let stop = CancellationToken::new();
        let daemon = tokio::spawn(serve(cfg, stop.clone()));
        let sock = dir.path().join("kv.sock");
        let mut client = None;
        for _ in 0..100 {
            if let Ok(c) =
                strata_kvcache::KvClient::connect(&format!("unix://{}", sock.display())).await
            {
                client = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut c = client.expect("daemon listens on its unix socket");
        c.put("m/t", b"k", bytes::Bytes::from(vec![1u8; 4096]))
            .await
            .unwrap();
        assert!(c.exists("m/t", b"k").await.unwrap());
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), daemon)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(!sock.exists(), "socket removed at exit");
    }
}
