//! `strata demo`: the README's main job on an embedded default. A sample dataset is
//! generated into a local directory that serves as the object store, caches live in a
//! temp dir, a short workload reads the dataset through the cache core twice (a cold
//! and a warm epoch), and the stats are printed.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use strata_cache_core::{AccessContext, JobId, ObjectReader};

use crate::config::{open_core, open_store, CacheConfig, StoreConfig};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where to generate the sample dataset (default: a temp dir).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Number of small sample files.
    #[arg(long, default_value_t = 500)]
    pub files: usize,
    /// Print the final stats as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(args))
}

async fn run_async(args: DemoArgs) -> anyhow::Result<()> {
    let temp = tempfile::Builder::new().prefix("strata-demo-").tempdir()?;
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| temp.path().join("dataset"));
    let files = generate_dataset(&data_dir, args.files)?;
    println!(
        "sample dataset: {} files in {}",
        files.len(),
        data_dir.display()
    );

    let store = open_store(
        &format!("file://{}", data_dir.display()),
        &StoreConfig::default(),
    )?;
    let cache = CacheConfig {
        dir: Some(temp.path().join("cache")),
        memory: "64MiB".into(),
        disk: "1GiB".into(),
        ..Default::default()
    };
    let core = open_core(&cache)?;
    println!(
        "cache: memory 64 MiB, disk 1 GiB in {}",
        core.cache_dir.display()
    );
    let reader = ObjectReader::new(core.engine.clone(), store.clone(), core.block_size)?;

    let objects = store.list_all("").await?;
    for epoch in 1..=2 {
        let t = Instant::now();
        let mut bytes = 0u64;
        for obj in &objects {
            let ctx = AccessContext::demand(JobId(1), 0);
            bytes += reader.read(obj, 0, obj.size, &ctx).await?.len() as u64;
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "epoch {epoch}: read {} objects, {:.1} MiB in {:.3} s ({:.0} MiB/s)",
            objects.len(),
            bytes as f64 / (1 << 20) as f64,
            s,
            bytes as f64 / (1 << 20) as f64 / s.max(1e-9)
        );
    }
    let stats = core.engine.stats();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
    } else {
        println!(
            "\n{:<10} {:>12} {:>12} {:>9} {:>9} {:>7} {:>10}",
            "tier", "used", "capacity", "hits", "misses", "hit%", "evictions"
        );
        for t in &stats.tiers {
            println!(
                "{:<10} {:>12} {:>12} {:>9} {:>9} {:>6.1}% {:>10}",
                t.name.split(':').next().unwrap_or(&t.name),
                t.used_bytes,
                t.capacity_bytes,
                t.hits,
                t.misses,
                100.0 * t.hit_ratio(),
                t.evictions
            );
        }
        println!(
            "fetched from store: {} blocks, {} bytes",
            stats.fills, stats.fill_bytes
        );
    }
    Ok(())
}

/// Writes `n` small files (imagenet-like names) and two multi-block files.
fn generate_dataset(dir: &std::path::Path, n: usize) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for i in 0..n {
        let class = format!("n{:08}", 1_440_764 + (i % 10));
        let p = dir
            .join("train")
            .join(&class)
            .join(format!("{class}_{:05}.JPEG", i));
        let size = 8 * 1024 + (i * 7919) % (64 * 1024);
        write_file(&p, &pseudo_random(size, i as u64))?;
        out.push(p);
    }
    for i in 0..2 {
        let p = dir.join("shards").join(format!("train-{i:06}.tar"));
        write_file(&p, &pseudo_random(12 << 20, 1000 + i))?;
        out.push(p);
    }
    Ok(out)
}

fn write_file(p: &std::path::Path, data: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(p, data).with_context(|| format!("writing {}", p.display()))
}

/// Deterministic bytes (xorshift) so runs are comparable.
pub fn pseudo_random(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v.into()
}
