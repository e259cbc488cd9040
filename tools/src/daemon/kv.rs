//! The daemon's KV service: the exposure rule, the server settings of `[kv]`, and its
//! listeners (TCP and the Unix socket).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use strata_kvcache::server::{self as kv, KvService, ServerConfig, TlsFiles};
use strata_kvcache::tenants::{check_tenants, TenantConfig};
use tokio_util::sync::CancellationToken;

use crate::config::{parse_size, secret, KvConfig};

/// Checks that exposing the KV service on `addr` is allowed by `kv`: loopback always;
/// any other address only with TLS and tokens, the one `token` or tenants' (KV blocks
/// are a tenant's prompts in another form, and must not leave the host in clear or to
/// anyone who asks).
pub fn check_exposure(addr: &SocketAddr, kv: &KvConfig) -> anyhow::Result<()> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    let mut missing = Vec::new();
    if kv.tls_cert.is_none() || kv.tls_key.is_none() {
        missing.push("TLS (`tls_cert` and `tls_key`)");
    }
    if kv.token.as_deref().is_none_or(str::is_empty) && kv.tenants.is_empty() {
        missing.push("a `token` (or [[kv.tenants]])");
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
    let tenants = tenants(kv)?;
    let shm_bytes = match parse_size(&kv.shm).context("[kv] shm")? {
        n if n > 0 && !tenants.is_empty() => {
            tracing::info!(
                "[kv] shm off: with tenants, one arena mapped by every client would show \
                 one tenant's blocks to another"
            );
            0
        }
        n => match super::memory_limit::memory_limit() {
            Some(limit) => {
                let (_, fitted) = super::memory_limit::fit(0, n, limit.bytes);
                super::memory_limit::capped("[kv] shm", n, fitted, &limit)
            }
            None => n,
        },
    };
    let mut server = ServerConfig {
        shm_bytes,
        max_block,
        min_block,
        tenants,
        idle_timeout: std::time::Duration::from_secs(kv.idle_timeout_secs.max(1)),
        max_connections: kv.max_connections.max(1),
        preface_timeout: std::time::Duration::from_secs(kv.preface_timeout_secs.max(1)),
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
    };
    if let Some(limit) = super::memory_limit::memory_limit() {
        fit_io_budgets(&mut server, limit.bytes);
    }
    Ok(server)
}

/// The put and get budgets (bytes of blocks the service buffers at once) fitted under a
/// memory limit of `limit` bytes: each at most an eighth of it, and never below two of
/// the largest blocks, so a put of one still goes through (black-box finding: 24
/// clients' 64 MiB puts made the daemon buffer 2 GB, OOM-killed in a 1 GiB cgroup with
/// `--memory 64MiB`). The per-connection and per-tenant shares follow.
///
/// The largest block is fitted first, to a sixteenth of the limit (so the budgets'
/// floor of two blocks stays within an eighth): a put holds its block about twice while
/// it is stored (the received message and the tier's copy), and with 64 MiB blocks
/// allowed a daemon in a 256 MiB cgroup was OOM-killed by one 60 MiB put (black-box
/// finding). A larger put is refused with the limit named, the daemon lives.
fn fit_io_budgets(s: &mut ServerConfig, limit: u64) {
    let block_most = (limit / BLOCK_SHARE).max(s.min_block);
    if s.max_block > block_most {
        tracing::warn!(
            configured = s.max_block,
            capped_to = block_most,
            limit,
            "[kv] max_block is larger than this daemon's memory limit leaves room for: \
             capped to a sixteenth of the limit (a put holds its block about twice while \
             it is stored). Raise the limit to store larger blocks"
        );
        s.max_block = block_most;
    }
    let most = (limit / 8).max(2 * s.max_block);
    let fit = |v: &mut u64| *v = (*v).min(most);
    fit(&mut s.max_inflight_put_bytes);
    fit(&mut s.max_inflight_get_bytes);
    fit(&mut s.per_connection_put_bytes);
    fit(&mut s.per_connection_get_bytes);
    fit(&mut s.per_tenant_put_bytes);
    fit(&mut s.per_tenant_get_bytes);
}

/// The share of the memory limit one block may take (see [`fit_io_budgets`]).
const BLOCK_SHARE: u64 = 16;

/// Whether this is the first start of a cache dir that never had a disk tier (no
/// `blocks` folder, no bindings file): there are no blocks a lost bindings file could
/// have guarded, so nothing to drop or mark (black-box finding: every fresh `--disk 0`
/// start logged an ERROR about lost bindings).
fn first_start_without_disk(cache_dir: &std::path::Path, bindings: &std::path::Path) -> bool {
    !cache_dir.join("blocks").exists() && !bindings.exists()
}

/// The tenants of `[[kv.tenants]]`, tokens read and checked.
fn tenants(kv: &KvConfig) -> anyhow::Result<Vec<TenantConfig>> {
    if !kv.tenants.is_empty() && kv.token.is_some() {
        bail!(
            "[kv] token is the single-tenant token: with [[kv.tenants]] each tenant has its \
             own; remove [kv] token"
        );
    }
    let mut out = Vec::new();
    for t in &kv.tenants {
        let what = format!("[[kv.tenants]] {:?}", t.name);
        let token = secret(&what, t.token.as_deref(), t.token_file.as_deref())?
            .with_context(|| format!("{what}: needs a token or a token_file"))?;
        // Said as missing, not as an empty size (black-box finding: `quota: "" is not
        // a size` for an entry without one).
        anyhow::ensure!(
            !t.quota.trim().is_empty(),
            "{what}: needs a quota (bytes of blocks the tenant may keep cached, e.g. \
             quota = \"20GiB\")"
        );
        out.push(TenantConfig {
            name: t.name.clone(),
            token,
            namespaces: t.namespaces.clone(),
            quota_bytes: parse_size(&t.quota).with_context(|| format!("{what}: quota"))?,
        });
    }
    check_tenants(&out).context("[[kv.tenants]]")?;
    Ok(out)
}

/// What `[kv]` asks for, checked before anything is opened so a refused configuration
/// leaves no trace.
pub(crate) struct KvPlan {
    server: ServerConfig,
    tcp: Option<SocketAddr>,
}

impl KvPlan {
    /// The tenants' tokens (empty without tenants).
    pub(crate) fn tenant_tokens(&self) -> Vec<&str> {
        self.server
            .tenants
            .iter()
            .map(|t| t.token.as_str())
            .collect()
    }
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
    shm_socket: Option<PathBuf>,
}

impl Drop for RunningKv {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        if let Some(s) = &self.shm_socket {
            let _ = std::fs::remove_file(s);
        }
    }
}

/// Binds the listeners of `plan` and spawns their servers into `tasks`; they stop when
/// `stop` is cancelled.
pub(crate) async fn start(
    plan: KvPlan,
    socket: PathBuf,
    cache_dir: &std::path::Path,
    engine: strata_cache_core::CacheEngine,
    gpu: Option<std::sync::Arc<strata_gds::GpuTier>>,
    stop: &CancellationToken,
    tasks: &mut super::Servers,
) -> anyhow::Result<RunningKv> {
    if plan.server.tenants.is_empty() {
        tracing::warn!(
            "KV service in single-tenant demo mode (no [[kv.tenants]]): any client that \
             reaches it may read, overwrite and remove any namespace; keep it on loopback \
             and the Unix socket"
        );
    } else {
        tracing::info!(
            tenants = plan.server.tenants.len(),
            "KV service with tenants"
        );
    }
    let mut server = plan.server;
    // Namespaces' model-identity bindings sit in the cache dir, next to the blocks they
    // guard, so a restart over a warm disk tier keeps them.
    if server.identity_file.is_none() {
        server.identity_file = Some(cache_dir.join("kv-identities.json"));
    }
    if let Some(file) = &server.identity_file {
        strata_kvcache::identity::check_readable(file).with_context(|| {
            format!(
                "reading the KV namespace identities {} (nothing was dropped; the start \
                 fails until it can be read)",
                file.display()
            )
        })?;
        if !first_start_without_disk(cache_dir, file) {
            strata_kvcache::identity::drop_blocks_if_bindings_lost(file, &engine).await;
        }
        strata_kvcache::identity::drop_blocks_if_tenancy_changed(
            file,
            &engine,
            !server.tenants.is_empty(),
        )
        .await;
    }
    let service = KvService::new(engine, server);
    // Same-host clients may then read GPU-tier blocks by device handle (before the side
    // socket serves, so every session's hello carries the device memory).
    if let Some(gpu) = gpu {
        service.attach_gpu_tier(gpu);
    }
    if let Some(addr) = plan.tcp {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding KV service on {addr}"))?;
        announce!("kv tcp {}", l.local_addr()?);
        let (svc, stop) = (service.clone(), stop.clone());
        tasks.spawn(async move {
            kv::serve(l, svc, stop.cancelled_owned())
                .await
                .context("KV service (tcp)")
        });
    }
    clear_stale_socket(&socket, "")?;
    // Clients find the shared-memory side socket by its name beside the KV socket, so
    // two daemons whose KV sockets share a folder would share it: the second took the
    // first's over and every shared-memory client of the first failed (black-box
    // finding). Refused as a live KV socket is, before anything is bound.
    if service.shm_arena().is_some() {
        clear_stale_socket(
            &shm_socket_of(&socket),
            " (the shared-memory socket beside the KV socket: give this daemon's KV \
             socket a folder of its own)",
        )?;
    }
    let ul = bind_private(&socket)?;
    announce!("kv unix {}", socket.display());
    let (svc, stop2) = (service.clone(), stop.clone());
    tasks.spawn(async move {
        kv::serve(ul, svc, stop2.cancelled_owned())
            .await
            .context("KV service (unix)")
    });
    // The shared-memory side socket, beside the Unix socket (same owner, 0600): only
    // the daemon's user can attach and map the arena.
    let shm_socket = match service.shm_arena() {
        Some(arena) => {
            let path = shm_socket_of(&socket);
            let l = bind_private(&path)?;
            announce!("kv shm {}", path.display());
            let stop = stop.clone();
            tasks.spawn(async move {
                strata_kvcache::shm::serve_side_socket(l, arena, stop.cancelled_owned()).await;
                Ok(())
            });
            Some(path)
        }
        None => None,
    };
    Ok(RunningKv {
        service,
        socket,
        shm_socket,
    })
}

/// The shared-memory side socket of the KV socket `socket`: `kv-shm.sock` beside it,
/// where clients look for it.
fn shm_socket_of(socket: &std::path::Path) -> PathBuf {
    socket.with_file_name("kv-shm.sock")
}

/// Refuses `path` if a daemon is listening on it (`why` ends the message); removes it if
/// it is a socket file a daemon that died left (nothing listens when connecting fails).
/// Anything but a socket is refused, never removed (black-box finding: a regular file
/// named as `--unix-socket` by mistake was deleted as if it were a stale socket).
fn clear_stale_socket(path: &std::path::Path, why: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => bail!(
            "{} exists and is not a socket: not removing it to bind the KV socket{why} \
             (choose another path, or remove it yourself)",
            path.display()
        ),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!("another daemon is listening on {}{why}", path.display());
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing stale socket {}", path.display())),
    }
}

/// Makes `service` route by key across the group of `cluster` (issue 16): Puts to the
/// R owners, lookups batched per owner (`strata_kvcache::group`). `token`: the group
/// token its forwarded calls carry and its peer face requires. The Removes peers
/// missed are kept in `cache_dir` across a restart (black-box finding: a Remove a
/// down replica missed was held only in the entry node's memory, and a restart of that
/// node brought 13-16 of 24 removed blocks back).
pub(crate) fn join_group(
    service: &KvService,
    cluster: &super::cluster::ClusterHandle,
    token: Option<String>,
    cache_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let view = super::cluster::MembershipView::new(
        cluster.node.clone(),
        cluster.replication,
        cluster.membership(),
        cluster.bindings.clone(),
    );
    service
        .join_group(
            std::sync::Arc::new(view),
            strata_kvcache::group::GroupOptions {
                token,
                missed_removes_file: Some(cache_dir.join("kv-missed-removes.json")),
                ..Default::default()
            },
        )
        .context("joining the KV service to the cache group")
}

/// Binds a Unix socket at `path` that only this user can connect to (mode 0600): bound
/// under a temporary name, restricted, then renamed into place, so it is never
/// reachable with looser permissions.
pub(crate) fn bind_private(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let l = tokio::net::UnixListener::bind(&tmp)
        .with_context(|| format!("binding {}", tmp.display()))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("placing socket {}", path.display()));
    }
    Ok(l)
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
        kv.token = None;
        kv.tenants = vec![Default::default()];
        assert!(check_exposure(&any, &kv).is_ok(), "tenants have tokens");
    }

    #[test]
    fn tenants_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("b.token");
        std::fs::write(&f, "tok-b\n").unwrap();
        let cfg: crate::config::StrataConfig = toml::from_str(&format!(
            "[[kv.tenants]]\nname = \"a\"\ntoken = \"tok-a\"\nnamespaces = [\"llama3-*\"]\nquota = \"1GiB\"\n\
             [[kv.tenants]]\nname = \"b\"\ntoken_file = {f:?}\nnamespaces = [\"m-*\"]\nquota = \"1MiB\"\n"
        ))
        .unwrap();
        let s = server_config(&cfg.kv).unwrap();
        assert_eq!(s.tenants.len(), 2);
        assert_eq!(s.tenants[1].token, "tok-b");
        assert_eq!(s.tenants[1].quota_bytes, 1 << 20);
        assert!(
            !format!("{:?}", cfg.kv).contains("tok-a"),
            "tokens are not logged"
        );
        let mut kv = cfg.kv.clone();
        kv.tenants[1].token = Some("x".into());
        assert!(server_config(&kv).is_err(), "token and token_file");
        let mut kv = cfg.kv.clone();
        kv.tenants[1].token_file = None;
        assert!(server_config(&kv).is_err(), "no token");
        let mut kv = cfg.kv.clone();
        kv.token = Some("single".into());
        assert!(server_config(&kv).is_err(), "[kv] token with tenants");
        let mut kv = cfg.kv;
        kv.tenants[1].quota = String::new();
        let err = server_config(&kv).expect_err("a quota is required");
        assert!(format!("{err:#}").contains("needs a quota"), "{err:#}");
    }

    /// Black-box finding (security): two daemons with KV sockets in one folder shared
    /// `kv-shm.sock`, and the second took it over from the first. A live socket is
    /// refused, a stale one (its daemon gone) removed, a missing one fine.
    #[tokio::test]
    async fn a_live_socket_is_refused_and_a_stale_one_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let kv = dir.path().join("a.sock");
        let shm = shm_socket_of(&kv);
        assert_eq!(shm, dir.path().join("kv-shm.sock"));
        let live = bind_private(&shm).unwrap();
        let e = clear_stale_socket(&shm, " (why)").unwrap_err().to_string();
        assert!(
            e.contains("another daemon is listening") && e.contains("(why)"),
            "{e}"
        );
        assert!(shm.exists(), "left to its daemon");
        drop(live);
        clear_stale_socket(&shm, "").unwrap();
        assert!(!shm.exists(), "stale: removed");
        clear_stale_socket(&shm, "").unwrap();
    }

    /// Black-box finding (round 14): the put and get budgets (1 GiB each) came on top of
    /// a 64 MiB memory tier in a 1 GiB cgroup. They fit under the limit, never below
    /// two of the largest blocks.
    #[test]
    fn io_budgets_fit_under_the_memory_limit() {
        let mut s = ServerConfig::default();
        fit_io_budgets(&mut s, 1 << 30);
        assert_eq!(s.max_inflight_put_bytes, 128 << 20);
        assert_eq!(s.max_inflight_get_bytes, 128 << 20);
        assert!(s.per_connection_put_bytes <= 128 << 20);
        assert!(s.per_tenant_get_bytes <= 128 << 20);
        let mut s = ServerConfig::default();
        fit_io_budgets(&mut s, 64 << 20);
        assert_eq!(s.max_inflight_put_bytes, 8 << 20, "an eighth");
        assert_eq!(s.max_block, 4 << 20, "a sixteenth");
        let mut s = ServerConfig {
            min_block: 16 << 20,
            ..ServerConfig::default()
        };
        fit_io_budgets(&mut s, 64 << 20);
        assert_eq!(s.max_block, 16 << 20, "never below the smallest block");
        assert_eq!(s.max_inflight_put_bytes, 2 * s.max_block);
        let mut s = ServerConfig::default();
        fit_io_budgets(&mut s, 1 << 40);
        assert_eq!(
            s.max_inflight_put_bytes,
            ServerConfig::default().max_inflight_put_bytes
        );
        assert_eq!(s.max_block, ServerConfig::default().max_block);
    }

    /// Black-box finding: a regular file (or a folder, or a symlink to a file) at the
    /// socket's path was removed as a stale socket. Only a socket is.
    #[test]
    fn anything_but_a_socket_at_the_path_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("notes.txt");
        std::fs::write(&file, b"keep me").unwrap();
        let e = clear_stale_socket(&file, "").unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(clear_stale_socket(&link, "").is_err());
        assert!(link.exists(), "the link is kept");
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        assert!(clear_stale_socket(&folder, "").is_err());
        assert!(folder.is_dir());
    }

    #[tokio::test]
    async fn the_socket_is_private_to_its_user() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kv.sock");
        let _l = bind_private(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp left"
        );
    }

    #[test]
    fn only_a_dir_that_never_had_a_disk_tier_or_bindings_is_a_first_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("kv-identities.json");
        assert!(first_start_without_disk(dir.path(), &file));
        std::fs::create_dir(dir.path().join("blocks")).expect("mkdir");
        assert!(
            !first_start_without_disk(dir.path(), &file),
            "a disk tier's blocks may be there: a missing file is lost bindings"
        );
        std::fs::remove_dir(dir.path().join("blocks")).expect("rmdir");
        std::fs::write(&file, "{}").expect("write");
        assert!(!first_start_without_disk(dir.path(), &file));
    }
}
