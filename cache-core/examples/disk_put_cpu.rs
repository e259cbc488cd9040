//! The disk tier's CPU per stored byte, for values that lie page-aligned in memory (as
//! the store's pieces do: written in place) against values that do not (copied behind
//! their header first): the same puts, rounds of each in turn.
//!
//! `cargo run --release -p strata-cache-core --example disk_put_cpu -- [DIR] [BLOCKS] [ROUNDS]`
//!
//! DIR (default: a temporary directory) should be on the file system the cache uses
//! (`O_DIRECT` is probed there); BLOCKS 1 MiB values per round (default 512), ROUNDS
//! per kind (default 4). Prints, per round, the process's CPU seconds (user + system,
//! every thread: the runtime, the io_uring thread, the blocking pool) and wall seconds
//! for the puts alone (the values are built and checksummed before the clock starts).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use strata_cache_core::io::AlignedBuf;
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
use strata_cache_core::{Block, CacheKey, Tier};

const BLOCK: usize = 1 << 20;
/// Puts in flight at once (the engine's write-through of a prefetch run is about this).
const CONCURRENT: usize = 8;

fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain integers, for which all-zero bytes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we pass and reads nothing else.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// `n` blocks of 1 MiB; page-aligned in memory, or one byte past a page boundary.
fn blocks(n: usize, aligned: bool, seed: u8) -> Vec<Block> {
    (0..n)
        .map(|i| {
            let skew = usize::from(!aligned);
            let mut fill = AlignedBuf::filler(BLOCK + skew);
            fill.extend(&[0u8][..skew]);
            let v: Vec<u8> = (0..BLOCK)
                .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8 ^ seed))
                .collect();
            fill.extend(&v);
            let b: Bytes = fill.finish().into_bytes().slice(skew..);
            Block::new(b)
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = args
        .get(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let n: usize = args.get(2).map_or(512, |s| s.parse().expect("BLOCKS"));
    let rounds: usize = args.get(3).map_or(4, |s| s.parse().expect("ROUNDS"));
    println!("| round | value in memory | CPU s | wall s | CPU us per MiB |");
    println!("|---|---|---|---|---|");
    let mut sums = [(0.0f64, 0usize); 2];
    let mut dirs = Vec::new();
    for r in 0..rounds {
        for aligned in [false, true] {
            let dir = root.join(format!("disk-put-cpu-{r}-{aligned}"));
            let tier = Arc::new(
                DiskTier::open(&dir, (n as u64 + 16) * BLOCK as u64, DiskOptions::default())
                    .expect("open"),
            );
            let bs = blocks(n, aligned, r as u8);
            let (c0, t0) = (cpu_seconds(), Instant::now());
            futures::stream::iter(bs.into_iter().enumerate())
                .map(|(i, b)| {
                    let tier = tier.clone();
                    async move {
                        let key = CacheKey::file("large.bin", "etag", i as u64);
                        tier.put(&key, b).await.expect("put");
                    }
                })
                .buffer_unordered(CONCURRENT)
                .collect::<Vec<()>>()
                .await;
            let (cpu, wall) = (cpu_seconds() - c0, t0.elapsed().as_secs_f64());
            let what = if aligned {
                "aligned (in place)"
            } else {
                "unaligned (copied)"
            };
            println!(
                "| {r} | {what} | {cpu:.3} | {wall:.3} | {:.0} |",
                cpu * 1e6 / n as f64
            );
            sums[usize::from(aligned)].0 += cpu;
            sums[usize::from(aligned)].1 += n;
            drop(tier);
            dirs.push(dir);
        }
    }
    // Removed only at the end: ext4 skips inodes freed in the last seconds when it
    // allocates one (`recently_deleted`, a read of the inode table per candidate),
    // which made the creates of a round that followed a removal several times dearer.
    for dir in dirs {
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
    for (i, what) in ["unaligned (copied)", "aligned (in place)"]
        .iter()
        .enumerate()
    {
        let (cpu, blocks) = sums[i];
        println!("{what}: {:.0} us CPU per MiB", cpu * 1e6 / blocks as f64);
    }
}
