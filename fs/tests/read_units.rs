//! Sub-block read units through the filesystem core (issue 13): SQLite-like point
//! lookups (4 KiB pages of a 32 MiB database, skewed, scattered over the file) fetch a
//! fraction of the bytes whole blocks fetch, and return the same, right bytes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use strata_cache_core::granularity::Granularity;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore, GetStats};
use strata_cache_core::stream::mix64;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{BackingStore, CacheEngine, ObjectReader, RetryPolicy};
use strata_fs::filesystem::ROOT_INO;
use strata_fs::{CoreOptions, FsCore, Predictors};

/// Blocks of 256 KiB: a 32 MiB database is 128 blocks, which 120 lookups touch
/// sparsely (as the recorded SQLite trace's lookups touch its 43 MB database in 1 MiB
/// blocks).
const BS: u64 = 256 << 10;
const FILE: u64 = 32 << 20;
const PAGE: u64 = 4096;

fn data(n: usize) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add((i >> 12) as u8))
        .collect::<Vec<u8>>()
        .into()
}

/// The page offsets of `n` skewed point lookups: the header page first, then pages
/// ranked by a power law (rank = pages * u^3) and scattered over the file by a hash
/// of the rank, as a B-tree's hot interior pages are.
fn lookups(n: usize) -> Vec<u64> {
    let pages = FILE / PAGE;
    let mut out = vec![0];
    for i in 1..n {
        let u = (mix64(2026 + i as u64) >> 11) as f64 / (1u64 << 53) as f64;
        let rank = (pages as f64 * u * u * u) as u64;
        out.push(mix64(rank ^ 0x5eed) % pages * PAGE);
    }
    out
}

/// Replays the lookups through a filesystem core reading in units `g` (the mount's
/// predictors on, as the daemon runs); returns the store's GETs for them.
async fn run(g: Granularity, offsets: &[u64]) -> GetStats {
    let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let faulty = Arc::new(FaultyStore::new(mem, FaultConfig::default()));
    let retry = RetryPolicy {
        attempts: 2,
        base_backoff: Duration::from_millis(5),
        attempt_timeout: Duration::from_secs(5),
        max_backoff: Duration::from_millis(50),
        ..RetryPolicy::default()
    };
    let store = BackingStore::new(faulty.clone() as Arc<dyn ObjectStore>, "mem", retry);
    let bytes = data(FILE as usize);
    store
        .put("db/app.sqlite", bytes.clone())
        .await
        .expect("seed");
    let engine = CacheEngine::builder()
        // 16 MiB: the database does not fit 3/4 of it, so lookups read in units
        // (`Granularity::fits_whole_percent`).
        .tier(Arc::new(MemoryTier::new(16 << 20)))
        .build()
        .expect("engine");
    let reader = ObjectReader::new(engine, store, BS)
        .expect("reader")
        .with_granularity(g);
    let opts = CoreOptions {
        predictors: Some(Arc::new(Predictors::standard())),
        ..Default::default()
    };
    let core = Arc::new(FsCore::new(reader, "", opts));
    let dir = core.lookup(ROOT_INO, "db").await.expect("db");
    let e = core.lookup(dir.attr.ino, "app.sqlite").await.expect("file");
    let o = core.open(e.attr.ino, false).await.expect("open");
    let before = faulty.gets();
    for &off in offsets {
        let got = core.read(o.fh, off, PAGE as u32, 11).await.expect("read");
        assert!(
            got == bytes.slice(off as usize..(off + PAGE) as usize),
            "page at {off}"
        );
    }
    core.release(o.fh);
    let after = faulty.gets();
    GetStats {
        count: after.count - before.count,
        bytes: after.bytes - before.bytes,
        ..after
    }
}

#[tokio::test]
async fn sqlite_like_lookups_fetch_a_fraction_of_the_bytes_of_whole_blocks() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let offsets = lookups(120);
        let blocks = run(Granularity::BLOCKS, &offsets).await;
        let units = run(Granularity::default(), &offsets).await;
        // Whole blocks: every block of the file the lookups touch, 1 MiB each. Units:
        // the blocks touched before the tracker called the stream random, then 4 KiB
        // per missed page (or its block, where a unit of it was cached already).
        assert!(
            units.bytes * 2 <= blocks.bytes,
            "units fetched {units:?}, blocks {blocks:?}"
        );
    })
    .await
    .expect("bounded");
}
