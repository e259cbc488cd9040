//! The daemon: one cache core (GPU / memory / disk tiers over the object store) with
//! the KV service, any number of mounts and the admin API on it, built from a
//! [`StrataConfig`]. `strata serve` (a config file) and `strata mount` (flags, one
//! mount, no KV service) both parse their arguments into a config and call [`run`];
//! `strata demo` runs it in-process.
//!
//! - [`cache`]: the store and the tier hierarchy (`[store]`, `[cache]`).
//! - [`kv`]: the KV service (`[kv]`): loopback by default; any other address is refused
//!   without TLS and a token.
//! - [`mount`]: the one builder of a mount (`[[mounts]]` and `strata mount` alike).
//! - [`cluster`]: membership in the cache group on etcd (`[cluster]`; none: one node).
//! - [`peer`]: the group's peer listener (`[cluster] listen`, the group token): the
//!   owner side of the peer data plane.
//! - The admin API (`[admin] listen`) serves `/stats` and `/metrics`; `strata stats`
//!   reads it.
//!
//! Once listening, the daemon prints one line per endpoint (`kv tcp 127.0.0.1:7070`,
//! `kv unix /path`, `mount /mnt/x`, `admin 127.0.0.1:7071`) then `ready`, so scripts and
//! tests can start it with port 0 and read the bound addresses. It runs until `stop` is
//! cancelled (SIGINT/SIGTERM in [`run_until_signal`]), until a server fails, or, with no
//! KV service, until every mount was removed from outside (`fusermount3 -u`); then it
//! finishes requests in flight and unmounts.

/// A line of the daemon's start-up protocol on stdout ("mount ...", "ready": tools and
/// tests wait for them). Not println!, which panics when stdout cannot be written (a
/// file on a full disk): the daemon must not die of its output.
macro_rules! announce {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

pub mod allocator;
pub mod cache;
pub mod cluster;
pub mod kv;
pub mod memory_limit;
pub mod mount;
pub mod peer;
pub mod peer_metrics;
pub mod peer_reads;

use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminState, MountInfo};
use std::path::PathBuf;

use crate::config::StrataConfig;
pub use cache::{open_core, open_core_for, open_store, Core};

/// Runs the daemon of `cfg` until `stop` is cancelled (or it stops on its own, see the
/// module docs).
pub async fn run(cfg: StrataConfig, stop: CancellationToken) -> anyhow::Result<()> {
    let started = Instant::now();
    // Check before opening anything, so a refused configuration leaves no trace.
    cfg.check()?;
    let mut resolved: Vec<(PathBuf, &std::path::Path)> = Vec::new();
    for m in &cfg.mounts {
        // Asked first, on a thread with a deadline: a stat of the mountpoint of a
        // stopped or hung FUSE daemon sleeps in the kernel, where SIGTERM cannot end it
        // (black-box finding: `strata serve` hung for good on such a mountpoint).
        strata_fs::mount::dead_mount_or_refuse_stuck(&m.mountpoint)?;
        // Before the KV service starts: a mountpoint that cannot be one fails the start.
        if m.mountpoint.exists() && !m.mountpoint.is_dir() {
            anyhow::bail!(
                "[[mounts]] mountpoint {} is not a directory",
                m.mountpoint.display()
            );
        }
        // The config's check compares spellings; two spellings of one directory, or
        // of nested ones, through a symbolic link or `..`, are caught here (black-box
        // finding: such mounts started, one hid the other, and a stop left a mount
        // failing ENOTCONN).
        let at = mount::resolved_mountpoint(&m.mountpoint);
        for (other, spelled) in &resolved {
            if *other == at {
                anyhow::bail!(
                    "[[mounts]] {} and {} are one directory ({}): one mount per directory",
                    spelled.display(),
                    m.mountpoint.display(),
                    at.display()
                );
            }
            if at.starts_with(other) || other.starts_with(&at) {
                anyhow::bail!(
                    "[[mounts]] {} and {} are nested ({} and {}): mount them side by side",
                    spelled.display(),
                    m.mountpoint.display(),
                    other.display(),
                    at.display()
                );
            }
        }
        resolved.push((at, &m.mountpoint));
    }
    // Before the cache dir is made (black-box finding: a cache dir refused as inside
    // the store was created and initialised first, and stayed there).
    mount::refuse_self_references(&cfg)?;
    mount::refuse_cache_dir_on_a_strata_mount(cfg.cache.dir.as_deref())?;
    let kv_plan = kv::plan(&cfg.kv)?;
    let tenant_tokens = kv_plan
        .as_ref()
        .map(|p| p.tenant_tokens())
        .unwrap_or_default();
    let admin_plan = admin::plan(&cfg.admin, &tenant_tokens)?;
    let store = match cfg.store.url.as_deref() {
        Some(url) if !cfg.mounts.is_empty() => Some((url, open_store(url, &cfg.store)?)),
        _ => None,
    };
    // Mounts whose store refused their first listing while the KV service is served:
    // mounted all the same (their operations fail with the store's answer; skipped, the
    // bare mountpoint took jobs' writes onto local disk: black-box finding), named by
    // /healthz (black-box finding: one refused mount, credentials not yet valid, took
    // the whole daemon down, the KV service with it, in a crash loop).
    let mut refused_mounts: Vec<(PathBuf, String)> = Vec::new();
    if let Some((url, store)) = &store {
        for m in &cfg.mounts {
            // A stop while the store is silent (up to 10 s) cancels the start
            // (black-box finding: Ctrl-C on `strata mount` mounted 10 s later anyway).
            tokio::select! {
                r = check_store(url, store, &m.prefix) => match r {
                    Ok(()) => {}
                    Err(e) if kv_plan.is_some() => {
                        tracing::error!(mountpoint = %m.mountpoint.display(), error = %format!("{e:#}"),
                            "the store refused the mount's first listing: mounted all the same, so its operations fail with the store's answer (a job never writes into the bare folder beneath), the KV service is served, and /healthz answers 503 naming it");
                        refused_mounts.push((m.mountpoint.clone(), format!("{e:#}")));
                    }
                    Err(e) => return Err(e),
                },
                _ = stop.cancelled() => {
                    tracing::info!("stopped before mounting");
                    return Ok(());
                }
            }
        }
    }
    let mut core = open_core_for(&cfg.cache, cfg.mounts.iter().any(mount::keeps_local_files))?;
    core.mounts = cfg.mounts.len();
    let mut tasks = Servers::new();
    // What ends the servers (KV, admin, peer): cancelled only after the mounts are
    // unmounted, so the KV service answers while a stop waits for the mounts' uploads
    // (black-box finding: a SIGTERM during an upload to a stalled store took the KV
    // service down for the 20 s the upload was waited for).
    let serving = CancellationToken::new();
    // The admin API is bound before the group is joined: the node's record carries
    // its address, for `strata stats --cluster`.
    let admin_listener = match &admin_plan {
        Some((addr, _)) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding admin API on {addr}"))?,
        ),
        None => None,
    };
    let admin_addr = admin_listener
        .as_ref()
        .map(tokio::net::TcpListener::local_addr)
        .transpose()?;
    // The KV service first: in a group, the peer listener serves its peer face.
    let kv = match kv_plan {
        Some(plan) => {
            let socket = cfg
                .kv
                .unix_socket
                .clone()
                .unwrap_or_else(|| core.cache_dir.join("kv.sock"));
            Some(
                kv::start(
                    plan,
                    socket,
                    &core.cache_dir,
                    core.engine.clone(),
                    core.gpu.clone(),
                    &serving,
                    &mut tasks,
                )
                .await?,
            )
        }
        None => None,
    };
    let cluster = match &cfg.cluster {
        Some(c) => {
            let token = c.token()?;
            let h = cluster::start(c, &cfg.cache, admin_addr, &core.cache_dir)?;
            announce!("cluster {} {}", c.group, h.node);
            // In a group the KV service routes by key to the owners
            // (`strata_kvcache::group`).
            if let Some(k) = &kv {
                kv::join_group(&k.service, &h, token.clone(), &core.cache_dir)?;
            }
            let metrics = std::sync::Arc::new(peer_metrics::PeerMetrics::new(h.node.as_str()));
            let ctx = peer::PeerContext {
                group: c.group.clone(),
                node: h.node.clone(),
                engine: core.engine.clone(),
                store: store.as_ref().map(|(_, s)| s.clone()),
                metrics: metrics.clone(),
                kv: kv.as_ref().map(|k| k.service.clone()),
            };
            let addr = peer::start(
                c.peer_listen()?,
                token.as_deref(),
                ctx,
                &serving,
                &mut tasks,
            )
            .await?;
            announce!("peer {addr}");
            // A dial to a dead peer gives up after 1 s (the read hedges to the store
            // after the peer's p99 anyway; this bounds what dead dials hold).
            let channels =
                strata_cluster::peer::PeerChannels::new(token.as_deref(), Duration::from_secs(1))?;
            let reads = store.as_ref().map(|(url, _)| {
                std::sync::Arc::new(peer_reads::GroupReads::start(
                    h.node.clone(),
                    url.to_string(),
                    h.membership(),
                    channels,
                    metrics.clone(),
                    peer_reads::ReadOptions {
                        hedge: strata_cluster::hedge::HedgePolicy::with_floor(
                            Duration::from_millis(c.hedge_min_ms),
                        ),
                        recent_budget: peer_reads::recent_budget(
                            strata_cache_core::Tier::capacity_bytes(core.memory.as_ref()),
                        ),
                        keep_remote_after: c.keep_remote_after,
                    },
                )) as std::sync::Arc<dyn strata_cache_core::PeerSource>
            });
            Some((h, metrics, reads))
        }
        None => None,
    };

    mount::remove_other_staging(&core.cache_dir, &cfg.mounts);
    if let (true, Some(url)) = (cfg.mounts.is_empty(), cfg.store.url.as_deref()) {
        // No mount any more, but uploads an earlier run's mounts left unfinished in
        // the store: aborted all the same (black-box finding: a KV-only restart after
        // a crash kept a cut multipart upload in the bucket for good).
        if mount::other_mounts_left_uploads(&core.cache_dir, &cfg.mounts) {
            match open_store(url, &cfg.store) {
                Ok(store) => mount::abort_other_mounts_uploads(
                    &core.cache_dir,
                    &cfg.mounts,
                    &store,
                    url,
                    cfg.store.endpoint.as_deref(),
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "the store could not be opened: uploads left unfinished by an earlier run's mounts are not aborted")
                }
            }
        }
    }
    let mut mounts = Vec::new();
    let mut infos = Vec::new();
    if let Some((url, store)) = &store {
        mount::abort_other_mounts_uploads(
            &core.cache_dir,
            &cfg.mounts,
            store,
            url,
            cfg.store.endpoint.as_deref(),
        );
        for m in &cfg.mounts {
            if stop.is_cancelled() {
                break; // stopped while starting: mount nothing more
            }
            // On an error, dropping the handles unmounts what was mounted so far.
            let peers = cluster.as_ref().and_then(|(_, _, r)| r.clone());
            let h = mount::mount(m, &core, store, url, cfg.store.endpoint.as_deref(), peers)?;
            if let Some(c) = h.core() {
                // The start's check of the store (`check_store`) listed the mount's
                // folder once: counted as the mount's, as the store bills it (black-box
                // finding: the LIST counter showed one less than the store received).
                c.counters()
                    .store_lists
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            announce!("mount {}", m.mountpoint.display());
            infos.push(MountInfo {
                mountpoint: m.mountpoint.clone(),
                prefix: m.prefix.clone(),
                stats: None,
            });
            mounts.push(h);
        }
    }

    // Set by `supervise` for each mount unmounted from outside; the admin API drops it.
    let unmounted: std::sync::Arc<[std::sync::atomic::AtomicBool]> = mounts
        .iter()
        .map(|_| std::sync::atomic::AtomicBool::new(false))
        .collect();
    if let (Some((addr, token)), Some(l)) = (admin_plan, admin_listener) {
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "admin API (token required) is reachable beyond this host");
        }
        let bound = l.local_addr()?;
        announce!("admin {bound}");
        // In the log too: a background mount's stdout goes nowhere, and a port-0
        // address was reported nowhere else (black-box finding).
        tracing::info!(admin = %bound, "admin API listening");
        let state = AdminState {
            engine: core.engine.clone(),
            kv: kv.as_ref().map(|k| k.service.clone()),
            mounts: infos,
            mount_cores: mounts.iter().filter_map(|h| h.core().cloned()).collect(),
            unmounted: unmounted.clone(),
            not_mounted: refused_mounts
                .iter()
                .map(|(p, why)| format!("{} ({why})", p.display()))
                .collect(),
            local_files: core.local_files.clone(),
            started,
            token: token.map(std::sync::Arc::from),
            cluster: cluster.as_ref().map(|(h, _, _)| {
                let replication = cfg.cluster.as_ref().map_or(1, |c| c.replication);
                (h.node.clone(), h.membership(), replication)
            }),
            peer: cluster
                .as_ref()
                .map(|(_, m, _)| (m.clone(), store.as_ref().map(|(_, s)| s.clone()))),
        };
        let serving = serving.clone();
        tasks.spawn(async move { admin::serve(l, state, serving.cancelled_owned()).await });
    }
    // Each mount answers before "ready": a FUSE session that ended as it started (a
    // worker that could not open /dev/fuse or be created) left a dead mount, and the
    // daemon announced it ready, so `strata mount` said "mounted" (black-box finding).
    for m in &mounts {
        let at = m.mountpoint().to_path_buf();
        let state = tokio::task::spawn_blocking(move || {
            strata_fs::mount::probe_mount(&at, strata_fs::mount::PROBE_WAIT)
        })
        .await
        .unwrap_or(strata_fs::mount::MountState::Answers);
        if state == strata_fs::mount::MountState::Dead || m.session_failed() {
            m.detach_failed();
            anyhow::bail!(
                "the FUSE session of {} ended as it started (a FUSE thread could not open or \
                 read /dev/fuse: out of descriptors, memory or threads?); the mount was detached",
                m.mountpoint().display()
            );
        }
    }
    let release_stdout = RELEASE_STDOUT_WHEN_READY.load(std::sync::atomic::Ordering::Relaxed);
    if release_stdout {
        // Before "ready": the starting command may exit as soon as it reads it.
        // SAFETY: prctl(PR_SET_PDEATHSIG, 0) only clears this process's parent-death
        // signal.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, 0) };
    }
    announce!("ready");
    STARTING.store(false, std::sync::atomic::Ordering::Release);
    if release_stdout {
        stdout_released();
    }
    if RELEASE_STDERR_WHEN_READY.load(std::sync::atomic::Ordering::Relaxed) {
        to_dev_null(libc::STDERR_FILENO);
    }

    let result = supervise(&stop, &mut tasks, &mounts, &unmounted, kv.is_some()).await;
    shut_down(tasks, mounts, &serving).await;
    if let Some((c, _, _)) = cluster {
        c.leave().await;
    }
    drop(kv);
    drop(core);
    result
}

/// Set by [`run_until_signal`]: this process is the daemon and nothing else, so it never
/// reads its own mounts (`MountOptions::refuse_own_process`). A process that embeds
/// [`run`] (the tests) and reads the mounts it serves leaves it unset.
static DAEMON_PROCESS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process is a daemon started by [`run_until_signal`].
pub fn is_daemon_process() -> bool {
    DAEMON_PROCESS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Set for a detached daemon: its stdout is the starting command's "ready" pipe.
static RELEASE_STDOUT_WHEN_READY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Once ready, the daemon no longer stops with the command that started it and lets go
/// of its stdout (the command's pipe), so that command reads "ready" and then its end
/// (see `commands::mount::daemonize`).
pub fn release_stdout_when_ready() {
    RELEASE_STDOUT_WHEN_READY.store(true, std::sync::atomic::Ordering::Relaxed);
}

static RELEASE_STDERR_WHEN_READY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Once ready, the daemon lets go of its stderr (the starting command's pipe, which
/// shows the start's warnings). At ready, not when a mount appears at the mountpoint:
/// a crashed daemon's dead mount there appeared at once, and the start's warnings went
/// to /dev/null (black-box finding, round 21).
pub fn release_stderr_when_ready() {
    RELEASE_STDERR_WHEN_READY.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn stdout_released() {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().flush();
    to_dev_null(libc::STDOUT_FILENO);
}

/// Points descriptor `fd` (stdout or stderr) at /dev/null, letting go of the pipe it
/// was.
pub(crate) fn to_dev_null(fd: libc::c_int) {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto `fd` swaps what it refers to; writers use the fd number,
        // never a cached pointer, and `null` stays open until after.
        unsafe { libc::dup2(null.as_raw_fd(), fd) };
    }
}

/// How long a mount waits for its store's first listing before it goes ahead on the
/// cache alone. 10 s: a live store lists a folder in well under a second, even far
/// away; an unanswered one must not hold the mount (the cache serves what it holds).
const STORE_CHECK_DEADLINE: Duration = Duration::from_secs(10);

/// Fails the start when the store refuses to list the mount's folder (no such bucket,
/// credentials refused), so the mount command says why rather than every `ls` EIO.
async fn check_store(
    url: &str,
    store: &strata_cache_core::BackingStore,
    prefix: &str,
) -> anyhow::Result<()> {
    use strata_cache_core::store::Probe;
    match store.probe(prefix, STORE_CHECK_DEADLINE).await {
        Probe::Answered => Ok(()),
        Probe::Refused(why) => {
            let folder = if prefix.is_empty() {
                "its root"
            } else {
                prefix
            };
            // With no credentials configured the S3 client asks the instance metadata
            // service for some, and its refusal read as the store's (black-box finding:
            // "refused to list its root ... PUT http://169.254.169.254/... 403", the
            // store never asked).
            if url.starts_with("s3://") && why.contains("169.254.169.254") {
                anyhow::bail!(
                    "no S3 credentials for {url}: set AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY (or --access-key-id and \
                     --secret-access-key-file); the instance metadata service gave none \
                     ({why})"
                )
            }
            anyhow::bail!("the store {url} refused to list {folder}: {why}")
        }
        Probe::Unanswered(why) => {
            tracing::warn!(store = url, error = %why, "the store did not answer the mount's first listing; mounting on what the cache holds");
            Ok(())
        }
    }
}

type Servers = tokio::task::JoinSet<anyhow::Result<()>>;

/// Waits until `stop` is cancelled, a server fails (then stops the others), or, with
/// no KV service, the last mount was removed from outside.
async fn supervise(
    stop: &CancellationToken,
    tasks: &mut Servers,
    mounts: &[strata_fs::MountHandle],
    unmounted: &[std::sync::atomic::AtomicBool],
    kv_running: bool,
) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    // Mounts whose FUSE session failed (not unmounted from outside).
    let mut failed: Vec<String> = Vec::new();
    let mut trimmed = tokio::time::Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Ok(()),
            Some(r) = tasks.join_next() => {
                let mut result = r.context("server task panicked").and_then(|r| r);
                // A server that ends cleanly because a stop was requested meanwhile is
                // the normal shutdown, not a failure.
                if result.is_ok() && !stop.is_cancelled() {
                    result = Err(anyhow::anyhow!("a server stopped unexpectedly"));
                }
                stop.cancel();
                return result;
            }
            _ = tick.tick() => {
                if trimmed.elapsed() >= allocator::TRIM_EVERY {
                    trimmed = tokio::time::Instant::now();
                    tokio::task::spawn_blocking(allocator::trim);
                }
                for (m, g) in mounts.iter().zip(unmounted) {
                    if !g.load(Relaxed) && m.is_finished() {
                        g.store(true, Relaxed);
                        if m.session_failed() {
                            // Not an unmount: a read of /dev/fuse failed and fuser ended
                            // the session, leaving the mount dead.
                            tracing::error!(mountpoint = %m.mountpoint().display(),
                                "the FUSE session failed while mounted (a read of /dev/fuse failed: out of memory or descriptors, or a device error); the dead mount is detached; restart the daemon to mount again");
                            m.detach_failed();
                            failed.push(m.mountpoint().display().to_string());
                        } else {
                            tracing::warn!(mountpoint = %m.mountpoint().display(), "unmounted from outside");
                        }
                    }
                }
                if !kv_running && !unmounted.is_empty() && unmounted.iter().all(|g| g.load(Relaxed)) {
                    stop.cancel();
                    if !failed.is_empty() {
                        anyhow::bail!(
                            "the FUSE session of {} failed while mounted; the mount was detached",
                            failed.join(", ")
                        );
                    }
                    tracing::info!("every mount is gone and no KV service runs: exiting");
                    return Ok(());
                }
            }
        }
    }
}

/// Unmounts (each mount waits, bounded, for its uploads in progress) while the servers
/// still answer, then stops the servers and lets them finish requests in flight
/// (bounded, so a stuck client cannot hold the exit).
async fn shut_down(
    mut tasks: Servers,
    mounts: Vec<strata_fs::MountHandle>,
    serving: &CancellationToken,
) {
    // Off the runtime's workers: an unmount waits for the session to end.
    let unmounted = tokio::task::spawn_blocking(move || {
        for m in mounts {
            if let Err(e) = m.unmount() {
                tracing::warn!(error = %e, "unmount failed");
            }
        }
    });
    if let Err(e) = unmounted.await {
        tracing::warn!(error = %e, "unmount task failed");
    }
    serving.cancel();
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
}

/// Set while the daemon process starts, until "ready" ([`exit_on_panic_while_starting`]).
static STARTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A panic before "ready" ends the daemon process at once, exit 1: a runtime that
/// cannot start its threads (a container at its `pids.max`: tokio panics "OS can't
/// spawn worker thread") otherwise unwound into waiting for threads that never came,
/// and the process stayed up, serving nothing, never ready (black-box finding). After
/// "ready", panics are the tasks' own (caught, the request fails) as before.
fn exit_on_panic_while_starting() {
    STARTING.store(true, std::sync::atomic::Ordering::Release);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        if STARTING.load(std::sync::atomic::Ordering::Acquire) {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "Error: the daemon failed while starting (see the panic above; \
                 \"can't spawn\" means the process or its container is at its thread limit)"
            );
            // SAFETY: _exit ends the process at once, without unwinding into waits
            // for threads that were never started.
            unsafe { libc::_exit(1) };
        }
    }));
}

/// The process entry of `strata serve` and `strata mount --foreground`: a runtime,
/// [`run`] until SIGINT or SIGTERM.
pub fn run_until_signal(cfg: StrataConfig) -> anyhow::Result<()> {
    // Before any thread starts (the log writer's included): threads inherit the mask.
    unblock_stop_signals();
    DAEMON_PROCESS.store(true, std::sync::atomic::Ordering::Relaxed);
    exit_on_panic_while_starting();
    let _log = crate::init_logging("info");
    // SIGUSR1/SIGUSR2 (a log rotator's "reopen", a stray `kill -USR1`) would end the
    // daemon by default, every job on its mounts then failing ENOTCONN (black-box
    // finding). They mean nothing here.
    for sig in [libc::SIGUSR1, libc::SIGUSR2] {
        // SAFETY: setting a standard signal's disposition to SIG_IGN, before any
        // thread is started.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let stops = StopSignals::inherited();
    allocator::tune(memory_limit::memory_limit().map(|l| l.bytes));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata")
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let stop = CancellationToken::new();
        let signal_stop = stop.clone();
        tokio::spawn(async move {
            wait_for_signal(stops).await;
            // Through the log's queue, not stderr itself: eprintln! panics when stderr
            // cannot be written (a log file on a full disk), and a write blocks for
            // good on a pipe nobody reads; a daemon must neither die nor hang of its log.
            tracing::info!("shutting down");
            signal_stop.cancel();
        });
        run(cfg, stop).await
    })
}

/// Which stop signals the daemon answers: SIGTERM always (a supervisor's stop);
/// SIGINT and SIGHUP unless they were ignored when it started. `nohup` and a script's
/// background job start it with them ignored, so that a closed terminal or a Ctrl-C
/// meant for the foreground job leaves it running (black-box finding: the daemon
/// replaced the inherited SIG_IGN with its handler, and `nohup strata serve` died with
/// the ssh session that started it).
#[derive(Clone, Copy, Debug)]
struct StopSignals {
    interrupt: bool,
    hangup: bool,
}

impl StopSignals {
    fn inherited() -> Self {
        StopSignals {
            interrupt: !ignored(libc::SIGINT),
            hangup: !ignored(libc::SIGHUP),
        }
    }
}

/// Whether `sig`'s disposition is SIG_IGN now.
pub(crate) fn ignored(sig: libc::c_int) -> bool {
    // SAFETY: a zeroed sigaction is valid to write into; a null new action only reads.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Unblocks the stop signals in this thread's mask, which the threads started from it
/// inherit: a mask inherited blocked (a supervisor's, a parent that blocked them around
/// its fork) left SIGTERM pending forever, and only SIGKILL, which leaves the mount
/// failing ENOTCONN, stopped the daemon (black-box finding).
fn unblock_stop_signals() {
    // SAFETY: sigset operations on a local set; pthread_sigmask changes only this
    // thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

async fn wait_for_signal(stops: StopSignals) {
    use tokio::signal::unix::{signal, SignalKind};
    let watch = |on: bool, kind: SignalKind| on.then(|| signal(kind).ok()).flatten();
    let mut term = signal(SignalKind::terminate());
    if let Err(e) = &term {
        tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT and SIGHUP stop the daemon");
    }
    // SIGHUP too (a closed terminal, `kill -HUP`): its default would end the daemon
    // without unmounting, leaving the mount failing with ENOTCONN (black-box finding).
    let mut hup = watch(stops.hangup, SignalKind::hangup());
    let mut int = watch(stops.interrupt, SignalKind::interrupt());
    async fn next(s: Option<&mut tokio::signal::unix::Signal>) {
        match s {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
    tokio::select! {
        _ = next(term.as_mut().ok()) => {}
        _ = next(hup.as_mut()) => {}
        _ = next(int.as_mut()) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::fetch_stats;

    /// A daemon of `cfg` (caches in `dir`, KV on its Unix socket only, admin on a free
    /// port), started in the background; returns its admin address.
    async fn start(
        mut cfg: StrataConfig,
        dir: &std::path::Path,
        stop: &CancellationToken,
    ) -> (tokio::task::JoinHandle<anyhow::Result<()>>, String) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let admin = format!("127.0.0.1:{port}");
        cfg.cache.dir = Some(dir.to_path_buf());
        cfg.kv.listen = None;
        cfg.admin.listen = Some(admin.clone());
        let daemon = tokio::spawn(run(cfg, stop.clone()));
        for _ in 0..200 {
            if fetch_stats(&admin).await.is_ok() {
                return (daemon, admin);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("daemon did not answer on {admin}");
    }

    async fn kv_client(dir: &std::path::Path) -> strata_kvcache::KvClient {
        let sock = dir.join("kv.sock");
        strata_kvcache::KvClient::connect(&format!("unix://{}", sock.display()))
            .await
            .expect("daemon listens on its unix socket")
    }

    async fn stopped(stop: CancellationToken, daemon: tokio::task::JoinHandle<anyhow::Result<()>>) {
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), daemon)
            .await
            .expect("stops within 10 s")
            .expect("joins")
            .expect("ran without error");
    }

    /// Black-box finding: a daemon started against an etcd it cannot reach, with no
    /// membership saved, answered `members: []` and acknowledged KV Puts as a group of
    /// one. They are now kept on this node and counted so (`puts_kept_locally`), and
    /// read back through it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_daemon_that_never_reached_etcd_counts_its_puts_as_kept_locally() {
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port");
        let test = async {
            let dir = tempfile::tempdir().expect("tempdir");
            let stop = CancellationToken::new();
            let mut cfg = StrataConfig::default();
            cfg.cache.disk = "0".into();
            cfg.cache.memory = "16MiB".into();
            cfg.cluster = Some(test_cluster(format!("http://{dead}"), "a", 7001));
            let (daemon, admin) = start(cfg, dir.path(), &stop).await;
            let mut kv = kv_client(dir.path()).await;
            for i in 0..3u8 {
                kv.put("ns", &[i; 16], bytes::Bytes::from(vec![i; 4096]))
                    .await
                    .expect("put kept locally");
            }
            assert_eq!(
                kv.get("ns", &[1; 16]).await.expect("get").as_deref(),
                Some(&[1u8; 4096][..])
            );
            let stats = fetch_stats(&admin).await.expect("stats");
            let group = stats.kv.and_then(|k| k.group).expect("group stats");
            assert_eq!(group.puts_kept_locally, 3);
            stopped(stop, daemon).await;
        };
        tokio::time::timeout(Duration::from_secs(60), test)
            .await
            .expect("test took more than 60 s");
    }

    /// A `[cluster]` section for tests: group `g`, R=2, 2 s leases, node `id`
    /// advertising `127.0.0.1:<port>`, its peer listener on any port.
    fn test_cluster(etcd: String, id: &str, port: u16) -> crate::config::ClusterConfig {
        crate::config::ClusterConfig {
            etcd_endpoints: vec![etcd],
            group: "g".into(),
            node_id: Some(id.into()),
            advertise: format!("127.0.0.1:{port}"),
            zone: String::new(),
            replication: 2,
            lease_ttl_secs: 2,
            prefix: "strata".into(),
            listen: Some("127.0.0.1:0".into()),
            token_file: None,
            hedge_min_ms: 2,
            keep_remote_after: 0,
        }
    }

    /// `[cluster]` (issue 16): two daemons on a real etcd register with their tier
    /// budgets as capacity, `strata cluster status`'s report gives each its share by
    /// capacity, and a daemon that stops leaves the group at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn daemons_with_a_cluster_section_join_the_group_and_leave_on_stop() {
        use strata_cluster::{read_group, NodeId};
        let etcd = strata_cluster::testing::Etcd::start();
        let test = async {
            let cluster =
                |id: &str| test_cluster(etcd.endpoint(), id, if id == "a" { 7001 } else { 7002 });
            let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
            let mut cfg = StrataConfig::default();
            cfg.cache.disk = "0".into();
            cfg.cache.memory = "16MiB".into();
            cfg.cluster = Some(cluster("a"));
            let (a, _) = start(cfg.clone(), dir_a.path(), &stop_a).await;
            cfg.cache.memory = "48MiB".into();
            cfg.cluster = Some(cluster("b"));
            let (b, _) = start(cfg, dir_b.path(), &stop_b).await;

            let group = cluster("a").group_config();
            let mut seen = Default::default();
            for _ in 0..100 {
                seen = read_group(&group).await.expect("read group");
                if seen.nodes.len() == 2 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(seen.ids(), vec![NodeId::new("a"), NodeId::new("b")]);
            let report = crate::commands::cluster::Report::new("g", &seen, 1);
            let shares: Vec<f64> = report.nodes.iter().map(|n| n.share).collect();
            assert!(
                (shares[0] - 0.25).abs() < 1e-9 && (shares[1] - 0.75).abs() < 1e-9,
                "{shares:?}"
            );
            assert_eq!(report.nodes[1].capacity["memory"], 48 << 20);

            // A stop revokes the lease: gone without waiting for the 2 s TTL to run out.
            stopped(stop_b, b).await;
            let left = read_group(&group).await.expect("read group");
            assert_eq!(left.ids(), vec![NodeId::new("a")]);
            stopped(stop_a, a).await;
            assert!(read_group(&group)
                .await
                .expect("read group")
                .nodes
                .is_empty());
        };
        tokio::time::timeout(Duration::from_secs(60), test)
            .await
            .expect("test took more than 60 s");
    }

    #[tokio::test]
    async fn refused_configuration_fails_before_binding() {
        let mut cfg = StrataConfig::default();
        cfg.kv.listen = Some("0.0.0.0:0".into());
        let e = run(cfg, CancellationToken::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("refusing"), "{e}");
    }

    #[tokio::test]
    async fn a_mountpoint_that_is_a_file_fails_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        let mut cfg: StrataConfig = toml::from_str(&format!(
            "[store]\nurl = \"file://{}\"\n[[mounts]]\nmountpoint = \"{}\"\n",
            dir.path().display(),
            file.display()
        ))
        .unwrap();
        cfg.kv.listen = Some("127.0.0.1:0".into());
        let e = run(cfg, CancellationToken::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }

    /// Black-box finding: mountpoints nested, or one directory, only through a symbolic
    /// link or `..` passed the config's check (spellings): the inner mount hid the outer
    /// one's folder and a stop left a mount failing ENOTCONN. Refused before anything
    /// is opened or mounted.
    #[tokio::test]
    async fn mountpoints_nested_or_equal_through_a_link_fail_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mp) = (dir.path().join("store"), dir.path().join("mp"));
        std::fs::create_dir_all(mp.join("sub")).unwrap();
        std::fs::create_dir_all(&store).unwrap();
        std::os::unix::fs::symlink(&mp, dir.path().join("lnk")).unwrap();
        for (first, second, says) in [
            ("lnk/sub", "mp", "nested"),
            ("lnk", "mp", "one directory"),
            ("mp/../mp/new", "mp/new", "one directory"),
        ] {
            let mut cfg: StrataConfig = toml::from_str(&format!(
                "[store]\nurl = \"file://{}\"\n[[mounts]]\nmountpoint = \"{}\"\n[[mounts]]\nmountpoint = \"{}\"\n",
                store.display(),
                dir.path().join(first).display(),
                dir.path().join(second).display(),
            ))
            .unwrap();
            cfg.kv.listen = Some("127.0.0.1:0".into());
            let e = run(cfg, CancellationToken::new())
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{first} and {second}: {e}");
        }
        assert!(!mp.join("new").exists(), "nothing made");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_kv_and_admin_then_stops() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = StrataConfig::default();
        cfg.cache.memory = "16MiB".into();
        cfg.cache.disk = "0".into();
        let stop = CancellationToken::new();
        let (daemon, _) = start(cfg, dir.path(), &stop).await;
        let mut c = kv_client(dir.path()).await;
        c.put("m/t", b"k", bytes::Bytes::from(vec![1u8; 4096]))
            .await
            .unwrap();
        assert!(c.exists("m/t", b"k").await.unwrap());
        stopped(stop, daemon).await;
        assert!(
            !dir.path().join("kv.sock").exists(),
            "socket removed at exit"
        );
    }

    /// `[cache] gpu = "1GiB"`, `gpu_device = "emulated"`: three levels in the stats,
    /// the GPU one first; a KV block put lands in it and is read back from it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_configured_gpu_tier_runs_above_memory_and_disk() {
        let dir = tempfile::tempdir().unwrap();
        let cfg: StrataConfig = toml::from_str(
            "[cache]\nmemory = \"16MiB\"\ndisk = \"64MiB\"\ngpu = \"1GiB\"\ngpu_device = \"emulated\"\n",
        )
        .unwrap();
        let stop = CancellationToken::new();
        let (daemon, admin) = start(cfg, dir.path(), &stop).await;
        let mut c = kv_client(dir.path()).await;
        let block = bytes::Bytes::from(vec![7u8; 256 << 10]);
        c.put("m/t", b"k", block.clone()).await.unwrap();
        assert_eq!(c.get("m/t", b"k").await.unwrap(), Some(block));

        let s = fetch_stats(&admin).await.unwrap();
        let json = serde_json::to_value(&s).unwrap();
        let tiers = json["engine"]["tiers"].as_array().expect("engine.tiers");
        let names: Vec<&str> = tiers.iter().filter_map(|t| t["name"].as_str()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert_eq!(names[0], "gpu:emulated", "{names:?}");
        assert_eq!(tiers[0]["capacity_bytes"], 1u64 << 30);
        let gpu = &s.engine.tiers[0];
        assert!(
            gpu.used_bytes >= 256 << 10,
            "the put landed in the GPU tier: {gpu:?}"
        );
        assert!(gpu.hits >= 1, "the get was served by the GPU tier: {gpu:?}");
        let human = crate::commands::stats::render(&admin, &s, None);
        assert!(human.contains("gpu:emulated"), "{human}");
        stopped(stop, daemon).await;
    }

    #[tokio::test]
    async fn a_gpu_size_without_a_device_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg: StrataConfig = toml::from_str("[cache]\ngpu = \"1GiB\"\n").unwrap();
        cfg.cache.dir = Some(dir.path().join("cache"));
        let e = format!(
            "{:#}",
            run(cfg, CancellationToken::new()).await.unwrap_err()
        );
        assert!(
            e.contains("needs a device") && e.contains("gpu_device = \"emulated\""),
            "{e}"
        );
        assert!(
            !dir.path().join("cache").exists(),
            "refused before opening anything"
        );

        let path = dir.path().join("strata.toml");
        std::fs::write(&path, "[cache]\ngpu = \"1GiB\"\n").unwrap();
        let e = format!("{:#}", StrataConfig::load(&path).unwrap_err());
        assert!(e.contains("gpu_device"), "refused when read: {e}");
    }
}
