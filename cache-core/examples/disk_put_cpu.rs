//! The disk tier's cost per stored byte, two comparisons, the same puts in rounds of
//! each side in turn:
//!
//! - `layout` (default): 1 MiB values that lie page-aligned in memory (as the store's
//!   pieces do: written in place) against values that do not (copied behind their
//!   header first);
//! - `durability`: `put` (the tier's full durability: `fdatasync` of the block file,
//!   `fsync` of its directory, a synced index WAL) against `put_refetchable` (the
//!   engine's copies of file blocks, which the object store still holds), for values of
//!   VALUE_KIB.
//!
//! `cargo run --release -p strata-cache-core --example disk_put_cpu -- [DIR] [BLOCKS] [ROUNDS] [layout|durability] [VALUE_KIB]`
//!
//! DIR (default: a temporary directory) should be on the file system the cache uses
//! (`O_DIRECT` is probed there); BLOCKS values per round (default 512), ROUNDS per side
//! (default 4), VALUE_KIB the value size of the durability comparison (default 1024).
//! Prints, per round, the process's CPU seconds (user + system, every thread: the
//! runtime, the io_uring thread, the blocking pool) and wall seconds for the puts alone
//! (the values are built and checksummed before the clock starts), then the totals.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use strata_cache_core::io::AlignedBuf;
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
use strata_cache_core::{Block, CacheKey, Tier};

/// The layout comparison's value size.
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

/// `n` values of `size` bytes; page-aligned in memory, or one byte past a page boundary.
fn blocks(n: usize, size: usize, aligned: bool, seed: u8) -> Vec<Block> {
    (0..n)
        .map(|i| {
            let skew = usize::from(!aligned);
            let mut fill = AlignedBuf::filler(size + skew);
            fill.extend(&[0u8][..skew]);
            let v: Vec<u8> = (0..size)
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
    let durability = match args.get(4).map(String::as_str) {
        None | Some("layout") => false,
        Some("durability") => true,
        Some(other) => panic!("unknown comparison `{other}` (layout, durability)"),
    };
    let size = if durability {
        args.get(5)
            .map_or(1024, |s| s.parse::<usize>().expect("VALUE_KIB"))
            << 10
    } else {
        BLOCK
    };
    // The two sides: (label, values page-aligned, written with `put_refetchable`).
    let sides = if durability {
        [
            ("put (synced)", true, false),
            ("put_refetchable", true, true),
        ]
    } else {
        [
            ("unaligned (copied)", false, false),
            ("aligned (in place)", true, false),
        ]
    };
    println!("| round | side | CPU s | wall s | CPU us per MiB | MB/s |");
    println!("|---|---|---|---|---|---|");
    let mut sums = [(0.0f64, 0.0f64); 2];
    let mut dirs = Vec::new();
    for r in 0..rounds {
        for (side, &(what, aligned, refetchable)) in sides.iter().enumerate() {
            let dir = root.join(format!("disk-put-cpu-{r}-{side}"));
            let tier = Arc::new(
                DiskTier::open(&dir, (n as u64 + 16) * size as u64, DiskOptions::default())
                    .expect("open"),
            );
            let bs = blocks(n, size, aligned, r as u8);
            let (c0, t0) = (cpu_seconds(), Instant::now());
            futures::stream::iter(bs.into_iter().enumerate())
                .map(|(i, b)| {
                    let tier = tier.clone();
                    async move {
                        let key = CacheKey::file("large.bin", "etag", i as u64);
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
            let mib = (n * size) as f64 / f64::from(1u32 << 20);
            println!(
                "| {r} | {what} | {cpu:.3} | {wall:.3} | {:.0} | {:.0} |",
                cpu * 1e6 / mib,
                (n * size) as f64 / wall / 1e6
            );
            sums[side].0 += cpu;
            sums[side].1 += mib;
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
    for (side, (what, ..)) in sides.iter().enumerate() {
        let (cpu, mib) = sums[side];
        println!("{what}: {:.0} us CPU per MiB", cpu * 1e6 / mib);
    }
}
