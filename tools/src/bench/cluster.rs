//! `strata bench cluster` (issue 16): N real daemons on loopback in one cache group
//! ([`super::group`]: a real etcd, `strata serve` children, FUSE mounts) over one
//! store behind injected latency and bandwidth (`[store] inject_*`, the in-process
//! benches' `FaultyStore`), against the same daemons as independent nodes and one
//! node of N times the capacity. Measured side by side in one run:
//!
//! - `store_bytes_group` / `_independent`: store bytes after every node read the
//!   working set once (the target: the group ~1x the unique bytes, independent ~Nx);
//! - `hit_ratio_*`: 1 - store bytes / bytes read over `--epochs` passes of every node
//!   over the working set (`--working-set` x the per-node capacity C), each node in its
//!   own shuffled order; the one-node baseline (capacity N x C) serves the same N
//!   streams on one mount;
//! - `peer_read_gbps`: bytes node A received from its peers over a warm pass of the
//!   working set, divided by the pass's time (GB/s);
//! - `failover_ms`: a reader on A reads continuously while node C is killed with
//!   SIGKILL; the longest gap between two completed reads across the kill (and reads
//!   that failed, which must be 0).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use strata_cluster::peer::pb::FetchBlockRequest;
use strata_cluster::NodeId;

use super::fs::ColdStoreArgs;
use super::group::{count_wrong, write_dataset, Group, GroupSpec};
use crate::config::parse_size;

#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Daemons in the group.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Cache capacity C of each node (its memory tier; no disk tier, so the capacity is
    /// exactly this). 32MiB: a working set of 2.5 C reads in seconds on loopback.
    #[arg(long, default_value = "32MiB")]
    pub capacity: String,
    /// Working set as a multiple of C. 2.5: the target case (fits the group's
    /// N x C, not one node's C).
    #[arg(long, default_value_t = 2.5)]
    pub working_set: f64,
    /// Size of each file of the working set. 4 MiB: four 1 MiB blocks, spread over
    /// the owners.
    #[arg(long, default_value = "4MiB")]
    pub file_size: String,
    /// Passes of every node over the working set.
    #[arg(long, default_value_t = 3)]
    pub epochs: usize,
    /// The daemons' block size, the unit of placement. 1 MiB: the daemon's default.
    #[arg(long, default_value = "1MiB")]
    pub block_size: String,
    #[command(flatten)]
    pub store: ColdStoreArgs,
    /// The group's lease TTL: a killed node leaves after it.
    #[arg(long, default_value_t = 2)]
    pub lease_ttl_secs: u64,
    #[arg(long, default_value_t = 16)]
    pub seed: u64,
    /// The `strata` binary the daemons run (default: this one; tests name theirs).
    #[arg(long)]
    pub binary: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct ClusterReport {
    pub nodes: usize,
    pub capacity_bytes: u64,
    pub unique_bytes: u64,
    pub store_bytes_group: u64,
    pub store_bytes_independent: u64,
    pub hit_ratio_group: f64,
    pub hit_ratio_independent: f64,
    pub hit_ratio_one_node: f64,
    pub peer_read_gbps: f64,
    /// Bytes of the working set the most loaded owner owns. Placement over a few dozen
    /// blocks is lumpy: an owner drawing more than C evicts its own blocks and reads
    /// them again, so `store_bytes_group` rises above the unique bytes by about
    /// `owned_bytes_max - capacity_bytes` times the streams that reread them.
    pub owned_bytes_max: u64,
    pub failover_ms: f64,
    pub failed_reads: u64,
    pub wrong_reads: u64,
    /// Store fetches the group's readers started because an owner was slower than its
    /// p99, and reads of a peer's block answered by the store.
    pub hedges_group: u64,
    pub fallbacks_group: u64,
    pub latency_ms: u64,
    pub bandwidth_bytes_per_sec: u64,
}

pub fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let _log = crate::init_logging("warn");
    let r = bench(&args)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        outln!(
            "{} nodes of {} B, working set {} B; store +{} ms, {} B/s",
            r.nodes,
            r.capacity_bytes,
            r.unique_bytes,
            r.latency_ms,
            r.bandwidth_bytes_per_sec
        );
        for (k, v) in [
            ("store_bytes_group", r.store_bytes_group as f64),
            ("store_bytes_independent", r.store_bytes_independent as f64),
            ("hit_ratio_group", r.hit_ratio_group),
            ("hit_ratio_independent", r.hit_ratio_independent),
            ("hit_ratio_one_node", r.hit_ratio_one_node),
            ("peer_read_gbps", r.peer_read_gbps),
            ("owned_bytes_max", r.owned_bytes_max as f64),
            ("failover_ms", r.failover_ms),
            ("failed_reads", r.failed_reads as f64),
        ] {
            outln!("{k:<26}{v:>16.3}");
        }
    }
    Ok(())
}

/// Reads `path` whole and drops it from the page cache (the next pass reaches the
/// daemon again).
fn read_uncached(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut &f, &mut out)?;
    // SAFETY: advice about our own open descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(out)
}

/// What a set of readers did.
#[derive(Default)]
struct Pass {
    bytes: u64,
    wrong: u64,
    failed: u64,
}

/// One reader per stream: stream `s` reads `files` in its own order through `mounts[s]`.
fn pass(mounts: &[PathBuf], names: &[String], seed: u64, orders: &[Vec<usize>]) -> Pass {
    let handles: Vec<_> = mounts
        .iter()
        .zip(orders)
        .map(|(m, order)| {
            let (m, order, names) = (m.clone(), order.clone(), names.to_vec());
            std::thread::spawn(move || {
                let mut p = Pass::default();
                for i in order {
                    match read_uncached(&m.join(&names[i])) {
                        Ok(got) => {
                            p.bytes += got.len() as u64;
                            p.wrong += u64::from(count_wrong(seed, i, 0, &got) > 0);
                        }
                        Err(_) => p.failed += 1,
                    }
                }
                p
            })
        })
        .collect();
    let mut total = Pass::default();
    for h in handles {
        let p = h.join().unwrap_or(Pass {
            failed: 1,
            ..Pass::default()
        });
        total.bytes += p.bytes;
        total.wrong += p.wrong;
        total.failed += p.failed;
    }
    total
}

fn store_bytes(g: &Group) -> anyhow::Result<u64> {
    let mut sum = 0;
    for n in g.nodes.iter().filter(|n| n.is_running()) {
        sum += n.store_reads()?.1;
    }
    Ok(sum)
}

/// A per-peer counter summed over every peer of every running node.
fn counter_sum(g: &Group, field: &str) -> anyhow::Result<u64> {
    let mut sum = 0;
    for n in g.nodes.iter().filter(|n| n.is_running()) {
        let s = n.stats()?;
        sum += s["peer"]["peers"]
            .as_object()
            .map(|m| m.values().filter_map(|c| c[field].as_u64()).sum::<u64>())
            .unwrap_or(0);
    }
    Ok(sum)
}

/// Every block of the working set as its owner is asked for it: the owner's id and
/// address, and the `FetchBlock` request (versions as the daemons see them).
async fn owned_blocks(
    g: &Group,
    names: &[String],
    url: &str,
) -> anyhow::Result<Vec<(NodeId, String, FetchBlockRequest)>> {
    let m = strata_cluster::read_group(&g.group_config()).await?;
    let placement = strata_cluster::Placement::from_membership(&m);
    let addrs: std::collections::HashMap<_, _> = m
        .nodes
        .values()
        .map(|n| (n.id.clone(), n.advertise.clone()))
        .collect();
    // Versions as the daemons see them (their store handle, see `open_store`).
    let base = strata_cache_core::BackingStore::from_url(url, &Default::default())?;
    let store = strata_cache_core::BackingStore::new(
        base.inner().clone(),
        url,
        strata_cache_core::RetryPolicy::default(),
    );
    let bs = parse_size(&g.spec.block_size)?;
    let mut out = Vec::new();
    for n in names {
        let obj = store.head(n).await?;
        for b in 0..obj.size.div_ceil(bs) {
            let key = strata_cache_core::CacheKey::file_block(
                obj.path.clone(),
                obj.version.clone(),
                bs,
                b,
            );
            let owner = placement.owner(&key.encode()).context("an empty group")?;
            let addr = addrs.get(&owner).context("owner address")?.clone();
            out.push((
                owner,
                addr,
                FetchBlockRequest {
                    store: url.to_string(),
                    location: obj.path.to_string(),
                    version: obj.version.to_string(),
                    block_size: bs,
                    block_index: b,
                    object_size: obj.size,
                    has_etag: obj.has_etag,
                    last_modified_unix_ns: obj.last_modified_unix_ns,
                    from_node: "bench".into(),
                    job: 0,
                    prefetch: false,
                },
            ));
        }
    }
    Ok(out)
}

/// Bytes the most loaded owner owns (see [`ClusterReport::owned_bytes_max`]).
fn owned_bytes_max(blocks: &[(NodeId, String, FetchBlockRequest)]) -> u64 {
    let mut per: std::collections::HashMap<&NodeId, u64> = Default::default();
    for (owner, _, r) in blocks {
        let len = r
            .object_size
            .saturating_sub(r.block_index * r.block_size)
            .min(r.block_size);
        *per.entry(owner).or_default() += len;
    }
    per.values().copied().max().unwrap_or(0)
}

/// GB/s of blocks fetched with `FetchBlock` from their owners (8 in flight), the
/// bench acting as a peer with the group token: once to warm the owners, then timed.
async fn peer_throughput(
    g: &Group,
    blocks: &[(NodeId, String, FetchBlockRequest)],
) -> anyhow::Result<f64> {
    use futures::{StreamExt, TryStreamExt};
    let channels =
        strata_cluster::peer::PeerChannels::new(g.spec.token.as_deref(), Duration::from_secs(2))?;
    let reqs: Vec<(String, FetchBlockRequest)> = blocks
        .iter()
        .map(|(_, a, r)| (a.clone(), r.clone()))
        .collect();
    let fetch_all = || {
        futures::stream::iter(reqs.clone())
            .map(|(addr, r)| {
                let channels = channels.clone();
                async move {
                    let mut c = channels.file_client(&addr)?;
                    let mut s = c.fetch_block(r).await?.into_inner();
                    let mut n = 0u64;
                    while let Some(m) = s.message().await? {
                        n += m.data.len() as u64;
                    }
                    anyhow::Ok(n)
                }
            })
            .buffer_unordered(8)
            .try_fold(0u64, |a, n| async move { Ok(a + n) })
    };
    fetch_all().await?;
    let t = Instant::now();
    let bytes = fetch_all().await?;
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e9)
}

struct Run {
    store_after_first: u64,
    hit_ratio: f64,
    wrong: u64,
    failed: u64,
}

/// Every stream reads the working set `epochs` times (each in its own order).
fn epochs(
    g: &Group,
    mounts: &[PathBuf],
    names: &[String],
    args: &ClusterArgs,
    orders: &[Vec<usize>],
) -> anyhow::Result<Run> {
    let mut read = Pass::default();
    let mut store_after_first = 0;
    for e in 0..args.epochs {
        let p = pass(mounts, names, args.seed, orders);
        read.bytes += p.bytes;
        read.wrong += p.wrong;
        read.failed += p.failed;
        if e == 0 {
            store_after_first = store_bytes(g)?;
        }
    }
    let store = store_bytes(g)?;
    Ok(Run {
        store_after_first,
        hit_ratio: 1.0 - store as f64 / read.bytes.max(1) as f64,
        wrong: read.wrong,
        failed: read.failed,
    })
}

pub fn bench(args: &ClusterArgs) -> anyhow::Result<ClusterReport> {
    if args.nodes < 2 {
        bail!("--nodes must be at least 2");
    }
    let c = parse_size(&args.capacity)?;
    let file_size = parse_size(&args.file_size)? as usize;
    let n_files = ((args.working_set * c as f64) / file_size as f64).ceil() as usize;
    let data = tempfile::Builder::new()
        .prefix("strata-bench-cluster-")
        .tempdir()?;
    let names = write_dataset(data.path(), args.seed, n_files, file_size)?;
    let unique = (n_files * file_size) as u64;
    let binary = match &args.binary {
        Some(b) => b.clone(),
        None => std::env::current_exe().context("the strata binary")?,
    };
    let bw = args.store.bandwidth_bytes()?;
    let base = GroupSpec {
        binary,
        nodes: args.nodes,
        store_url: Some(format!("file://{}", data.path().display())),
        memory: args.capacity.clone(),
        disk: "0".into(),
        lease_ttl_secs: args.lease_ttl_secs,
        block_size: args.block_size.clone(),
        store_toml: format!(
            "inject_latency_ms = {}\ninject_bandwidth = \"{bw}\"\n",
            args.store.latency_ms
        ),
        ..GroupSpec::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let orders: Vec<Vec<usize>> = (0..args.nodes)
        .map(|_| {
            let mut o: Vec<usize> = (0..n_files).collect();
            o.shuffle(&mut rng);
            o
        })
        .collect();

    // The group.
    let mut g = Group::start(base.clone())?;
    let mounts: Vec<PathBuf> = g
        .nodes
        .iter()
        .map(|n| n.mounted(""))
        .collect::<anyhow::Result<_>>()?;
    let group = epochs(&g, &mounts, &names, args, &orders)?;
    let hedges = counter_sum(&g, "hedges")?;
    let fallbacks = counter_sum(&g, "fallbacks")?;
    // The peer path's throughput: every block fetched from its owner, warm.
    let rt = tokio::runtime::Runtime::new()?;
    let url = base.store_url.clone().unwrap_or_default();
    let blocks = rt.block_on(owned_blocks(&g, &names, &url))?;
    let peer_read_gbps = rt.block_on(peer_throughput(&g, &blocks))?;
    // Failover: A reads on while C is killed.
    let (failover_ms, fo_failed, fo_wrong) = failover(&mut g, &mounts[0], &names, args)?;
    drop(g);

    // Independent nodes, same config, same streams.
    let ind = Group::start(GroupSpec {
        independent: true,
        ..base.clone()
    })?;
    let ind_mounts: Vec<PathBuf> = ind
        .nodes
        .iter()
        .map(|n| n.mounted(""))
        .collect::<anyhow::Result<_>>()?;
    let independent = epochs(&ind, &ind_mounts, &names, args, &orders)?;
    drop(ind);

    // One node of N x C serving the N streams.
    let one = Group::start(GroupSpec {
        nodes: 1,
        independent: true,
        memory: format!("{}", c * args.nodes as u64),
        ..base
    })?;
    let one_mount = one.nodes[0].mounted("")?;
    let one_mounts = vec![one_mount; args.nodes];
    let one_node = epochs(&one, &one_mounts, &names, args, &orders)?;
    drop(one);

    Ok(ClusterReport {
        nodes: args.nodes,
        capacity_bytes: c,
        unique_bytes: unique,
        store_bytes_group: group.store_after_first,
        store_bytes_independent: independent.store_after_first,
        hit_ratio_group: group.hit_ratio,
        hit_ratio_independent: independent.hit_ratio,
        hit_ratio_one_node: one_node.hit_ratio,
        peer_read_gbps,
        owned_bytes_max: owned_bytes_max(&blocks),
        failover_ms,
        failed_reads: group.failed + independent.failed + one_node.failed + fo_failed,
        wrong_reads: group.wrong + independent.wrong + one_node.wrong + fo_wrong,
        hedges_group: hedges,
        fallbacks_group: fallbacks,
        latency_ms: args.store.latency_ms,
        bandwidth_bytes_per_sec: bw,
    })
}

/// A reader on `mount` reads file after file while the last node is killed: the longest
/// gap between completed reads from the kill until reads have run `2 x TTL` past it.
fn failover(
    g: &mut Group,
    mount: &Path,
    names: &[String],
    args: &ClusterArgs,
) -> anyhow::Result<(f64, u64, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let (m, names2, seed, stop2) = (mount.to_path_buf(), names.to_vec(), args.seed, stop.clone());
    let reader = std::thread::spawn(move || {
        let mut done: Vec<Instant> = Vec::new();
        let (mut failed, mut wrong) = (0u64, 0u64);
        let mut i = 0usize;
        while !stop2.load(Ordering::SeqCst) {
            let k = i % names2.len();
            match read_uncached(&m.join(&names2[k])) {
                Ok(got) => wrong += u64::from(count_wrong(seed, k, 0, &got) > 0),
                Err(_) => failed += 1,
            }
            done.push(Instant::now());
            i += 1;
        }
        (done, failed, wrong)
    });
    std::thread::sleep(Duration::from_millis(500));
    let killed = Instant::now();
    let last = g.nodes.len() - 1;
    g.nodes[last].kill9();
    std::thread::sleep(Duration::from_secs(2 * args.lease_ttl_secs) + Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    let (done, failed, wrong) = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the failover reader panicked"))?;
    // The gap that spans the kill, and every later one.
    let mut prev = done
        .iter()
        .rev()
        .find(|t| **t <= killed)
        .copied()
        .unwrap_or(killed);
    let mut worst = Duration::ZERO;
    for t in done.iter().filter(|t| **t > killed) {
        worst = worst.max(t.duration_since(prev));
        prev = *t;
    }
    Ok((worst.as_secs_f64() * 1e3, failed, wrong))
}
