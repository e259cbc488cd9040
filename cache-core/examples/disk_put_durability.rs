//! The disk tier's write rate with and without its syncs: `put` (durable: `fdatasync`
//! of the block file, `fsync` of its directory, a synced index WAL) against
//! `put_refetchable` (the engine's fills and demotions of file blocks, which the object
//! store still holds), for 4 KiB units and 1 MiB blocks, rounds of each in turn.
//!
//! `cargo run --release -p strata-cache-core --example disk_put_durability -- [DIR] [MIB] [ROUNDS]`
//!
//! DIR (default: a temporary directory) should be on the device the cache uses; MIB is
//! the bytes written per round for 1 MiB values (default 256; 4 KiB values write a
//! sixteenth of it, 4,096 puts for the default), ROUNDS per kind (default 3). Puts run
//! 8 at a time, as the engine's write-through of a prefetch run does. Prints one row
//! per round and kind: puts per second, MB/s and the process's CPU per put.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
use strata_cache_core::{Block, CacheKey, Tier};

/// Puts in flight at once.
const CONCURRENT: usize = 8;

fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain integers, for which all-zero bytes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we pass and reads nothing else.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn values(n: usize, size: usize, seed: u8) -> Vec<Block> {
    (0..n)
        .map(|i| {
            let v: Vec<u8> = (0..size)
                .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8 ^ seed))
                .collect();
            Block::new(Bytes::from(v))
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
    let mib: usize = args.get(2).map_or(256, |s| s.parse().expect("MIB"));
    let rounds: usize = args.get(3).map_or(3, |s| s.parse().expect("ROUNDS"));
    println!("| value | write | round | puts/s | MB/s | CPU us per put |");
    println!("|---|---|---|---|---|---|");
    for (size, n) in [(4usize << 10, mib * 16), (1 << 20, mib)] {
        for r in 0..rounds {
            for refetchable in [false, true] {
                let dir = root.join(format!("disk-put-durability-{size}-{r}-{refetchable}"));
                let capacity = (n as u64 + 16) * size as u64;
                let tier =
                    Arc::new(DiskTier::open(&dir, capacity, DiskOptions::default()).expect("open"));
                let vs = values(n, size, r as u8);
                let (c0, t0) = (cpu_seconds(), Instant::now());
                futures::stream::iter(vs.into_iter().enumerate())
                    .map(|(i, b)| {
                        let tier = tier.clone();
                        async move {
                            let key = CacheKey::file("data.bin", "etag", i as u64);
                            let put = if refetchable {
                                tier.put_refetchable(&key, b).await
                            } else {
                                tier.put(&key, b).await
                            };
                            put.expect("put");
                        }
                    })
                    .buffer_unordered(CONCURRENT)
                    .collect::<Vec<()>>()
                    .await;
                let (cpu, wall) = (cpu_seconds() - c0, t0.elapsed().as_secs_f64());
                let kind = if refetchable {
                    "put_refetchable"
                } else {
                    "put"
                };
                println!(
                    "| {} KiB | {kind} | {r} | {:.0} | {:.1} | {:.0} |",
                    size >> 10,
                    n as f64 / wall,
                    (n * size) as f64 / wall / 1e6,
                    cpu / n as f64 * 1e6
                );
                drop(tier);
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}
