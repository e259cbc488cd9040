//! The daemon's KV service: the exposure rule, the server settings of `[kv]`, and its
//! listeners (TCP and the Unix socket).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use strata_kvcache::server::{self as kv, KvService, ServerConfig, TlsFiles};
use tokio_util::sync::CancellationToken;

use crate::config::{parse_size, KvConfig};

/// Checks that exposing the KV service on `addr` is allowed by `kv`: loopback always;
/// any other address only with TLS and a token (KV blocks are a tenant's prompts in
/// another form, and must not leave the host in clear or to anyone who asks).
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

pub(crate) fn resolve(listen: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    listen
        .to_socket_addrs()
        .with_context(|| format!("bad listen address {listen:?}"))?
        .next()
        .with_context(|| format!("{listen:?} resolves to no address"))
}

/// The KV server settings of `kv` (sizes parsed, TLS files named).
pub fn server_config(kv: &KvConfig) -> anyhow::Result<ServerConfig> {
    let max_block = parse_size(&kv.max_block).context("[kv] max_block")?;
    let min_block = parse_size(&kv.min_block).context("[kv] min_block")?;
    if min_block == 0 || min_block > max_block {
        bail!("[kv] min_block = {:?} must be 1..= max_block", kv.min_block);
    }
    Ok(ServerConfig {
        max_block,
        min_block,
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

/// What `[kv]` asks for, checked before anything is opened so a refused configuration
/// leaves no trace.
pub(crate) struct KvPlan {
    server: ServerConfig,
    tcp: Option<SocketAddr>,
}

pub(crate) fn plan(kv: &KvConfig) -> anyhow::Result<Option<KvPlan>> {
    if !kv.enabled {
        return Ok(None);
    }
    let server = server_config(kv)?;
    let tcp = match &kv.listen {
        Some(l) if !l.is_empty() => {
            let a = resolve(l)?;
            check_exposure(&a, kv)?;
            Some(a)
        }
        _ => None,
    };
    Ok(Some(KvPlan { server, tcp }))
}

/// The running service; dropping it removes its socket file (at exit, and when a
/// later part of the daemon fails to start).
pub(crate) struct RunningKv {
    pub service: KvService,
    socket: PathBuf,
}

impl Drop for RunningKv {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Binds the listeners of `plan` and spawns their servers into `tasks`; they stop when
/// `stop` is cancelled.
pub(crate) async fn start(
    plan: KvPlan,
    socket: PathBuf,
    engine: strata_cache_core::CacheEngine,
    stop: &CancellationToken,
    tasks: &mut super::Servers,
) -> anyhow::Result<RunningKv> {
    let service = KvService::new(engine, plan.server);
    if let Some(addr) = plan.tcp {
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
    // A socket file left by a daemon that died is stale: nothing can be listening on it
    // if connecting fails, so remove it first.
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            bail!("another daemon is listening on {}", socket.display());
        }
        std::fs::remove_file(&socket)
            .with_context(|| format!("removing stale socket {}", socket.display()))?;
    }
    let ul = tokio::net::UnixListener::bind(&socket)
        .with_context(|| format!("binding {}", socket.display()))?;
    println!("kv unix {}", socket.display());
    let (svc, stop) = (service.clone(), stop.clone());
    tasks.spawn(async move {
        kv::serve(ul, svc, stop.cancelled_owned())
            .await
            .context("KV service (unix)")
    });
    Ok(RunningKv { service, socket })
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
}
