//! `strata bench kv [--json]`: the KV service over loopback, next to its ceiling.
//!
//! One process runs the server (memory tier only, so the figures are the service's,
//! not a disk's) and the clients; each client is its own connection, as separate
//! engine processes would be. For every block size (64 KiB, 1 MiB, 16 MiB) and client
//! count (1, 4, 16), over each transport (`tcp`: loopback TCP; `unix`: the daemon's
//! Unix socket, what a client on the same host uses; `shm`: the Unix socket with the
//! shared-memory arena attached, the block read in place, each page touched): a put phase (distinct new keys)
//! then a get phase (random keys of a resident working set), each for `--secs` seconds.
//! Alongside, in the same run:
//! - raw loopback TCP throughput (one connection, 1 MiB writes, no framing): the
//!   physical ceiling a TCP Get is compared with;
//! - memcpy throughput (64 MiB buffers, one thread): the ceiling of any same-host
//!   transport, since a block must at least be copied once into the client's memory;
//! - p50/p99 of a 256 KiB memory hit with 4 and with 16 clients;
//! - p50/p99 of `MatchPrefix` over a 1,000-key chain.
//!
//! Both ends share the machine's cores, as the baseline's ends do, so the ratio
//! get/loopback is like for like.
//!
//! Opt-in transports over a second server whose top tier is a GPU tier on the emulated
//! device (so the blocks are device-resident): `gpu-shm` (the arena: the tier reads the
//! block back, checks its crc, copies it into the arena) and `gpu-handle` (a device
//! handle: read in place in the device memory, nothing copied); side by side they show
//! what handing out device handles saves. On a real GPU the handle path is a CUDA IPC
//! device-to-device copy instead (kvcache/python/scripts/device-check.sh).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use serde::Serialize;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::CacheEngine;
use strata_kvcache::server::{KvService, ServerConfig};
use strata_kvcache::KvClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Args)]
pub struct KvArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Seconds per phase (put or get) of each cell.
    #[arg(long, default_value_t = 1.0)]
    pub secs: f64,
    /// Memory tier budget of the server, in MiB. 2 GiB: the largest working set
    /// (1 GiB) plus the put phase's churn, with eviction running as in production.
    #[arg(long, default_value_t = 2048)]
    pub memory_mib: u64,
    /// Block sizes in KiB (default: 64, 1024, 16384).
    #[arg(long, value_delimiter = ',', default_values_t = [64u64, 1024, 16384],
          value_parser = super::at_least_one::<u64>)]
    pub sizes_kib: Vec<u64>,
    /// Client counts (default: 1, 4, 16).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16],
          value_parser = super::at_least_one::<usize>)]
    pub clients: Vec<usize>,
    /// Transports (default: tcp, unix).
    #[arg(long, value_delimiter = ',', default_values_t = [Transport::Tcp, Transport::Unix, Transport::Shm])]
    pub transports: Vec<Transport>,
    /// Size of the messages a Get streams, in KiB (the server's `chunk_bytes`).
    #[arg(long, default_value_t = 1024, value_parser = super::at_least_one::<usize>)]
    pub chunk_kib: usize,
    /// Keep glibc's default allocator settings (to measure what `daemon::allocator::tune` buys).
    #[arg(long)]
    pub default_malloc: bool,
}

/// How the clients reach the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Tcp,
    Unix,
    /// The Unix socket with the shared-memory arena attached (Gets read in place).
    Shm,
    /// The arena, over a server whose blocks sit in an (emulated) GPU tier.
    #[serde(rename = "gpu-shm")]
    GpuShm,
    /// Device handles of that GPU tier (read in place in the device memory).
    #[serde(rename = "gpu-handle")]
    GpuHandle,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Transport::Tcp => "tcp",
            Transport::Unix => "unix",
            Transport::Shm => "shm",
            Transport::GpuShm => "gpu-shm",
            Transport::GpuHandle => "gpu-handle",
        })
    }
}

#[derive(Debug, Serialize)]
pub struct CellResult {
    pub transport: Transport,
    pub block_size: usize,
    pub clients: usize,
    pub put_gbps: f64,
    pub get_gbps: f64,
    pub get_p50_us: f64,
    pub get_p99_us: f64,
    pub puts: u64,
    pub gets: u64,
}

#[derive(Debug, Serialize)]
pub struct KvReport {
    pub loopback_tcp_gbps: f64,
    /// One thread copying 64 MiB buffers, Gb/s (the unit of every other figure).
    pub memcpy_gbps: f64,
    pub results: Vec<CellResult>,
    /// TCP Get of blocks >= 1 MiB, best client count, over raw loopback TCP.
    pub large_get_vs_loopback: f64,
    /// Unix-socket Get of 1 MiB blocks by one client, over memcpy.
    pub unix_1m_1client_get_vs_memcpy: Option<f64>,
    /// Shared-memory Get (in place) of 1 MiB blocks by one client, over memcpy.
    pub shm_1m_1client_get_vs_memcpy: Option<f64>,
    /// GPU-tier blocks, 1 MiB, one client: by device handle over through the arena.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_handle_1m_1client_get_vs_gpu_shm: Option<f64>,
    /// TCP Get of 1 MiB blocks by one client, over raw loopback TCP.
    pub tcp_1m_1client_get_vs_loopback: Option<f64>,
    pub get_256k_4clients_p99_us: f64,
    pub get_256k_16clients_p99_us: f64,
    /// The same cell over every transport measured (`tcp` is the figure above).
    pub get_256k_16clients_p99_us_by_transport: std::collections::BTreeMap<String, f64>,
    /// Least mean latency 16 closed-loop clients of 256 KiB Gets can see when the
    /// bytes move at raw loopback TCP's rate (Little's law: 16 blocks in flight over
    /// the link's throughput); a TCP p99 under it is impossible on this machine.
    pub get_256k_16clients_tcp_mean_floor_us: f64,
    pub match_prefix_1000_p50_us: f64,
    pub match_prefix_1000_p99_us: f64,
    pub secs_per_phase: f64,
}

const NS: &str = "bench/kv";

pub fn run(args: KvArgs) -> anyhow::Result<()> {
    if !args.default_malloc {
        crate::daemon::allocator::tune(None);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(bench(&args))?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(
            "raw loopback TCP: {:.2} Gb/s   memcpy: {:.2} Gb/s",
            report.loopback_tcp_gbps,
            report.memcpy_gbps
        );
        outln!(
            "{:>9} {:>10} {:>7} {:>9} {:>9} {:>10} {:>10}",
            "transport",
            "block",
            "clients",
            "put Gb/s",
            "get Gb/s",
            "get p50us",
            "get p99us"
        );
        for r in &report.results {
            outln!(
                "{:>9} {:>10} {:>7} {:>9.2} {:>9.2} {:>10.0} {:>10.0}",
                r.transport,
                r.block_size,
                r.clients,
                r.put_gbps,
                r.get_gbps,
                r.get_p50_us,
                r.get_p99_us
            );
        }
        let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0));
        outln!(
            "1 MiB x1 get: tcp/loopback {}, unix/memcpy {}, shm/memcpy {}",
            pct(report.tcp_1m_1client_get_vs_loopback),
            pct(report.unix_1m_1client_get_vs_memcpy),
            pct(report.shm_1m_1client_get_vs_memcpy)
        );
        outln!(
            "large get / loopback: {:.0}%   256 KiB p99 x4/x16: {:.0}/{:.0} us   MatchPrefix(1000) p50/p99: {:.0}/{:.0} us",
            report.large_get_vs_loopback * 100.0,
            report.get_256k_4clients_p99_us,
            report.get_256k_16clients_p99_us,
            report.match_prefix_1000_p50_us,
            report.match_prefix_1000_p99_us
        );
        outln!(
            "256 KiB x16 p99 by transport: {:?} us (TCP mean floor at loopback rate: {:.0} us)",
            report.get_256k_16clients_p99_us_by_transport,
            report.get_256k_16clients_tcp_mean_floor_us
        );
    }
    Ok(())
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 * 8.0 / d.as_secs_f64() / 1e9
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64
}

/// Raw loopback TCP: one connection, the sender writes a 1 MiB buffer in a loop.
async fn loopback_tcp(secs: f64) -> anyhow::Result<f64> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let dur = Duration::from_secs_f64(secs);
    let sender = tokio::spawn(async move {
        let (mut s, _) = l.accept().await?;
        s.set_nodelay(true)?;
        let buf = vec![7u8; 1 << 20];
        let start = Instant::now();
        while start.elapsed() < dur {
            s.write_all(&buf).await?;
        }
        anyhow::Ok(())
    });
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let start = Instant::now();
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let elapsed = start.elapsed();
    sender.await??;
    Ok(gbps(total, elapsed))
}

fn key(tag: &str, client: usize, i: u64) -> Vec<u8> {
    format!("{tag}-{client}-{i}").into_bytes()
}

async fn clients(
    addr: &str,
    n: usize,
    shm: Option<&std::path::Path>,
    device_handles: bool,
) -> anyhow::Result<Vec<KvClient>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = KvClient::connect(addr)
            .await
            .context("connecting to the bench server")?;
        if let Some(side) = shm {
            c.attach_shm(side)
                .await
                .context("attaching the shared-memory arena")?;
            c.want_device_handles(device_handles);
        }
        v.push(c);
    }
    Ok(v)
}

/// Puts distinct keys from every client for `secs`; returns the bytes put.
async fn put_phase(
    cs: &[KvClient],
    size: usize,
    secs: f64,
    tag: &str,
) -> anyhow::Result<(u64, Duration)> {
    let data = Bytes::from(vec![0xA5u8; size]);
    let start = Instant::now();
    let dur = Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (ci, c) in cs.iter().enumerate() {
        let (mut c, data, tag) = (c.clone(), data.clone(), tag.to_string());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while start.elapsed() < dur {
                c.put(NS, &key(&tag, ci, n), data.clone()).await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut puts = 0;
    for t in tasks {
        puts += t.await??;
    }
    Ok((puts * size as u64, start.elapsed()))
}

/// Gets random keys of `ws` from every client for `secs`; returns bytes, time and the
/// sorted latencies in microseconds.
async fn get_phase(
    cs: &[KvClient],
    ws: &Arc<Vec<Vec<u8>>>,
    secs: f64,
) -> anyhow::Result<(u64, Duration, Vec<u32>)> {
    let start = Instant::now();
    let dur = Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (ci, c) in cs.iter().enumerate() {
        let (mut c, ws) = (c.clone(), ws.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut bytes = 0u64;
            // A cheap per-client LCG picks keys: no shared RNG on the hot path.
            let mut x = 0x9E37_79B9u64 ^ ci as u64;
            while start.elapsed() < dur {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let k = &ws[(x >> 33) as usize % ws.len()];
                let t = Instant::now();
                // In place (a leased arena range when attached, else the bytes that
                // came through the socket); every page touched so an arena block is
                // really readable here, not just named.
                let got = c
                    .get_block(NS, k)
                    .await?
                    .context("working-set block missing: memory budget too small")?;
                let mut touch = 0u8;
                for p in got.iter().step_by(4096) {
                    touch ^= *p;
                }
                std::hint::black_box(touch);
                lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                bytes += got.len() as u64;
            }
            anyhow::Ok((bytes, lat))
        }));
    }
    let mut bytes = 0;
    let mut lat = Vec::new();
    for t in tasks {
        let (b, l) = t.await??;
        bytes += b;
        lat.extend(l);
    }
    let elapsed = start.elapsed();
    lat.sort_unstable();
    Ok((bytes, elapsed, lat))
}

/// One thread copying a 64 MiB buffer into another for `secs`; Gb/s.
fn memcpy_gbps(secs: f64) -> f64 {
    let src = vec![0xA5u8; 64 << 20];
    let mut dst = vec![0u8; 64 << 20];
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        bytes += src.len() as u64;
    }
    gbps(bytes, start.elapsed())
}

async fn cell(
    addr: &str,
    shm: Option<&std::path::Path>,
    transport: Transport,
    size: usize,
    n: usize,
    secs: f64,
) -> anyhow::Result<CellResult> {
    let cs = clients(addr, n, shm, transport == Transport::GpuHandle).await?;
    let tag = format!("p{size}x{n}{transport}");
    let (put_bytes, put_time) = put_phase(&cs, size, secs, &tag).await?;
    // Working set: at most 1 GiB and 64 blocks, put last so that it is resident; its
    // keys are new for each cell (an earlier cell's working set may have been evicted
    // by this cell's put phase, and a re-put of a key the server still counts is a no-op).
    let ws_len = ((1usize << 30) / size).clamp(1, 64);
    let ws: Vec<Vec<u8>> = (0..ws_len as u64)
        .map(|i| key(&format!("w{size}x{n}{transport}"), 0, i))
        .collect();
    let mut c0 = cs[0].clone();
    let data = Bytes::from(vec![0x5Au8; size]);
    for k in &ws {
        c0.put(NS, k, data.clone()).await?;
    }
    let (get_bytes, get_time, lat) = get_phase(&cs, &Arc::new(ws), secs).await?;
    Ok(CellResult {
        transport,
        block_size: size,
        clients: n,
        put_gbps: gbps(put_bytes, put_time),
        get_gbps: gbps(get_bytes, get_time),
        get_p50_us: percentile(&lat, 0.50),
        get_p99_us: percentile(&lat, 0.99),
        puts: put_bytes / size as u64,
        gets: lat.len() as u64,
    })
}

type ServerTask = tokio::task::JoinHandle<anyhow::Result<()>>;

/// The second server of the `gpu-*` transports: an emulated GPU tier of `memory_mib`
/// above a memory tier of the same size, on its own Unix socket and side socket.
/// Returns its address, its side socket and its tasks (they stop with `stop`).
async fn gpu_server(
    args: &KvArgs,
    cfg: &ServerConfig,
    dir: &std::path::Path,
    stop: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<(String, std::path::PathBuf, Vec<ServerTask>)> {
    let bytes = args.memory_mib << 20;
    let device = Arc::new(strata_gds::EmulatedDevice::try_new(bytes)?);
    let transfers = strata_gds::Transfers::new(device, strata_gds::TransferConfig::default())?;
    let gpu = Arc::new(strata_gds::GpuTier::new(transfers, bytes));
    let engine = CacheEngine::builder()
        .tier(gpu.clone())
        .tier(Arc::new(MemoryTier::new(bytes)))
        .build()?;
    let service = KvService::new(engine, cfg.clone());
    service.attach_gpu_tier(gpu);
    let sock = dir.join("kv-gpu.sock");
    let side = dir.join("kv-gpu-shm.sock");
    let listener = tokio::net::UnixListener::bind(&sock)?;
    let side_listener = tokio::net::UnixListener::bind(&side)?;
    let arena = service
        .shm_arena()
        .context("the shared-memory arena could not be created")?;
    let side_task: ServerTask = tokio::spawn({
        let stop = stop.clone();
        async move {
            strata_kvcache::shm::serve_side_socket(side_listener, arena, stop.cancelled_owned())
                .await;
            Ok(())
        }
    });
    let serve_task: ServerTask = tokio::spawn({
        let stop = stop.clone();
        async move {
            strata_kvcache::server::serve(listener, service, stop.cancelled_owned()).await?;
            Ok(())
        }
    });
    Ok((
        format!("unix://{}", sock.display()),
        side,
        vec![side_task, serve_task],
    ))
}

async fn bench(args: &KvArgs) -> anyhow::Result<KvReport> {
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(args.memory_mib << 20)))
        .build()?;
    let cfg = ServerConfig {
        chunk_bytes: args.chunk_kib << 10,
        // The daemon's default arena: room for the largest working set's hot part.
        shm_bytes: 256 << 20,
        ..Default::default()
    };
    let service = KvService::new(engine, cfg.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let stop = tokio_util::sync::CancellationToken::new();
    let sock_dir = tempfile::tempdir()?;
    let sock = sock_dir.path().join("kv.sock");
    let unix_listener = tokio::net::UnixListener::bind(&sock)?;
    let unix_addr = format!("unix://{}", sock.display());
    let shm_sock = sock_dir.path().join("kv-shm.sock");
    let shm_listener = tokio::net::UnixListener::bind(&shm_sock)?;
    let arena = service
        .shm_arena()
        .context("the shared-memory arena could not be created")?;
    let shm_server = tokio::spawn(strata_kvcache::shm::serve_side_socket(
        shm_listener,
        arena,
        stop.clone().cancelled_owned(),
    ));
    let server = tokio::spawn(strata_kvcache::server::serve(
        listener,
        service.clone(),
        stop.clone().cancelled_owned(),
    ));
    let unix_server = tokio::spawn(strata_kvcache::server::serve(
        unix_listener,
        service,
        stop.clone().cancelled_owned(),
    ));

    let loopback_tcp_gbps = loopback_tcp(args.secs.max(0.5)).await?;
    let memcpy_gbps = tokio::task::spawn_blocking({
        let secs = args.secs.max(0.5);
        move || memcpy_gbps(secs)
    })
    .await?;
    let gpu = if args
        .transports
        .iter()
        .any(|t| matches!(t, Transport::GpuShm | Transport::GpuHandle))
    {
        Some(gpu_server(args, &cfg, sock_dir.path(), &stop).await?)
    } else {
        None
    };
    let endpoint = |t: Transport| -> anyhow::Result<(String, Option<std::path::PathBuf>)> {
        Ok(match t {
            Transport::Tcp => (addr.clone(), None),
            Transport::Unix => (unix_addr.clone(), None),
            Transport::Shm => (unix_addr.clone(), Some(shm_sock.clone())),
            Transport::GpuShm | Transport::GpuHandle => {
                let g = gpu.as_ref().context("GPU-tier server not started")?;
                (g.0.clone(), Some(g.1.clone()))
            }
        })
    };
    let mut results = Vec::new();
    for &transport in &args.transports {
        let (a, shm) = endpoint(transport)?;
        let (a, shm) = (a.as_str(), shm.as_deref());
        for &size in &args.sizes_kib {
            for &n in &args.clients {
                results.push(cell(a, shm, transport, (size as usize) << 10, n, args.secs).await?);
            }
        }
    }
    let small = cell(&addr, None, Transport::Tcp, 256 << 10, 4, args.secs).await?;
    let get_256k_4clients_p99_us = small.get_p99_us;
    results.push(small);
    let mut by_transport = std::collections::BTreeMap::new();
    for &transport in &args.transports {
        let (a, shm) = endpoint(transport)?;
        let c = cell(&a, shm.as_deref(), transport, 256 << 10, 16, args.secs).await?;
        by_transport.insert(transport.to_string(), c.get_p99_us);
        results.push(c);
    }
    let get_256k_16clients_p99_us = match by_transport.get("tcp") {
        Some(p) => *p,
        None => {
            let c = cell(&addr, None, Transport::Tcp, 256 << 10, 16, args.secs).await?;
            let p = c.get_p99_us;
            results.push(c);
            p
        }
    };

    // MatchPrefix over a 1,000-key chain, all cached (the longest walk).
    let mut c = KvClient::connect(&addr).await?;
    let chain: Vec<Vec<u8>> = (0..1000u64).map(|i| key("chain", 0, i)).collect();
    let small_block = Bytes::from(vec![1u8; 1024]);
    for k in &chain {
        c.put(NS, k, small_block.clone()).await?;
    }
    let mut lat = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        let m = c.match_prefix(NS, &chain).await?;
        lat.push(t.elapsed().as_micros() as u32);
        anyhow::ensure!(m == chain.len(), "chain not fully cached ({m})");
    }
    lat.sort_unstable();

    stop.cancel();
    server.await??;
    unix_server.await??;
    shm_server.await?;
    if let Some((_, _, tasks)) = gpu {
        for t in tasks {
            t.await??;
        }
    }
    let best_large = results
        .iter()
        .filter(|r| r.transport == Transport::Tcp && r.block_size >= 1 << 20)
        .map(|r| r.get_gbps)
        .fold(0.0, f64::max);
    let one_mib_one_client = |t: Transport| {
        results
            .iter()
            .find(|r| r.transport == t && r.block_size == 1 << 20 && r.clients == 1)
            .map(|r| r.get_gbps)
    };
    Ok(KvReport {
        loopback_tcp_gbps,
        memcpy_gbps,
        large_get_vs_loopback: best_large / loopback_tcp_gbps,
        unix_1m_1client_get_vs_memcpy: one_mib_one_client(Transport::Unix).map(|g| g / memcpy_gbps),
        shm_1m_1client_get_vs_memcpy: one_mib_one_client(Transport::Shm).map(|g| g / memcpy_gbps),
        gpu_handle_1m_1client_get_vs_gpu_shm: one_mib_one_client(Transport::GpuHandle)
            .zip(one_mib_one_client(Transport::GpuShm))
            .map(|(h, s)| h / s),
        tcp_1m_1client_get_vs_loopback: one_mib_one_client(Transport::Tcp)
            .map(|g| g / loopback_tcp_gbps),
        get_256k_4clients_p99_us,
        get_256k_16clients_p99_us,
        get_256k_16clients_p99_us_by_transport: by_transport,
        get_256k_16clients_tcp_mean_floor_us: 16.0 * (256u64 << 10) as f64 * 8.0
            / (loopback_tcp_gbps * 1e9)
            * 1e6,
        match_prefix_1000_p50_us: percentile(&lat, 0.5),
        match_prefix_1000_p99_us: percentile(&lat, 0.99),
        secs_per_phase: args.secs,
        results,
    })
}
