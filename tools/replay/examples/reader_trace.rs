//! A recorded trace's reads through the daemon's real `ObjectReader` (not the replay's
//! model of it): each file of the trace is an object of its size in an in-memory store
//! behind a modelled link (a time to first byte per GET and a shared bandwidth), read
//! through a memory tier of the given capacity with the `strata` policy, in trace
//! order, one read at a time (think time left out). Prints the reads' wall time, mean
//! and p99 read latency, and the store GETs and bytes, for `[cache] read_units` =
//! `auto` or `block` (issue 13: the sub-block units the replay's `strata`
//! models).
//!
//! `cargo run --release -p strata-replay --example reader_trace -- TRACE CAPACITY
//! auto|block [TTFB_MS] [MBPS] [MAX_READS]`, e.g. `... -- tools/replay/traces/sqlite.csv.gz
//! 20% auto 2 200`. CAPACITY: bytes or a percentage of the trace's unique bytes
//! (1 MiB blocks), as `replay_json`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use strata_cache_core::granularity::Granularity;
use strata_cache_core::policy;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{
    AccessContext, BackingStore, CacheEngine, JobId, ObjectReader, RetryPolicy, DEFAULT_BLOCK_SIZE,
};
use strata_replay::replay::parse_capacity;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        (4..=7).contains(&args.len()),
        "usage: reader_trace TRACE CAPACITY auto|block [TTFB_MS] [MBPS] [MAX_READS]"
    );
    let path = std::path::PathBuf::from(&args[1]);
    let units = args[3].clone();
    let trace = strata_replay::trace::read_file(&path)?;
    let unique = trace.unique_bytes(DEFAULT_BLOCK_SIZE);
    let capacity = parse_capacity(&args[2], unique)?;
    let granularity = match units.as_str() {
        "auto" => Granularity::default(),
        "block" => Granularity::BLOCKS,
        other => anyhow::bail!("read units {other:?}: auto or block"),
    };
    let ttfb_ms: u64 = args.get(4).map_or(Ok(2), |s| s.parse())?;
    let mbps: u64 = args.get(5).map_or(Ok(200), |s| s.parse())?;
    let max_reads: usize = args.get(6).map_or(Ok(usize::MAX), |s| s.parse())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let inner: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let faulty = Arc::new(FaultyStore::new(inner, FaultConfig::default()));
        let store = BackingStore::new(
            faulty.clone() as Arc<dyn ObjectStore>,
            "mem",
            RetryPolicy::default(),
        );
        // Every file of the trace, at its size (contents do not matter here).
        let mut sizes = vec![0u64; trace.paths.len()];
        for r in &trace.records {
            sizes[r.path as usize] = sizes[r.path as usize].max(r.size);
        }
        for (p, &size) in trace.paths.iter().zip(&sizes) {
            store
                .put(p, bytes::Bytes::from(vec![7u8; size as usize]))
                .await?;
        }
        let engine = CacheEngine::builder()
            .tier_with_policy(
                Arc::new(MemoryTier::new(capacity)),
                policy::by_name("strata", capacity)?,
            )
            .build()?;
        let reader = ObjectReader::new(engine, store, DEFAULT_BLOCK_SIZE)?
            .with_granularity(granularity);
        let mut objs = Vec::new();
        for p in &trace.paths {
            objs.push(reader.store().head(p).await?);
        }
        faulty.set_config(FaultConfig {
            latency: Duration::from_millis(ttfb_ms),
            bandwidth_bytes_per_sec: Some(mbps << 20),
            ..FaultConfig::default()
        });
        let epoch = Instant::now();
        let mut lat = Vec::with_capacity(trace.records.len().min(max_reads));
        let mut bytes_read = 0u64;
        for r in trace.records.iter().take(max_reads) {
            let ctx = AccessContext::demand(
                JobId(u64::from(r.job)),
                epoch.elapsed().as_nanos() as u64,
            );
            let t = Instant::now();
            let got = reader
                .read(&objs[r.path as usize], r.offset, r.len, &ctx)
                .await?;
            lat.push(t.elapsed());
            bytes_read += got.len() as u64;
        }
        let wall = epoch.elapsed();
        lat.sort();
        let gets = faulty.gets();
        let (unit_gets, unit_bytes) = reader.unit_requests();
        let mean = lat.iter().sum::<Duration>() / lat.len().max(1) as u32;
        let p99 = lat
            .get(lat.len().saturating_sub(1) * 99 / 100)
            .copied()
            .unwrap_or_default();
        println!(
            "{{\"trace\": {:?}, \"capacity_bytes\": {capacity}, \"read_units\": {:?}, \
             \"ttfb_ms\": {ttfb_ms}, \"mbps\": {mbps}, \"reads\": {}, \"bytes_read\": {bytes_read}, \
             \"wall_s\": {:.3}, \"mean_read_ms\": {:.3}, \"p99_read_ms\": {:.3}, \
             \"store_gets\": {}, \"store_bytes\": {}, \"unit_gets\": {unit_gets}, \
             \"unit_bytes\": {unit_bytes}}}",
            path.display().to_string(),
            units,
            lat.len(),
            wall.as_secs_f64(),
            mean.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            gets.count,
            gets.bytes,
        );
        anyhow::Ok(())
    })
}
