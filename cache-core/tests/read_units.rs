//! Sub-block read units (issue 13): a stream of small random reads of a large object is
//! fetched and cached in the unit around each read (ranged GETs of 4 KiB where a
//! block is 256 KiB here), every read returns the object's bytes whatever mix of
//! units and blocks the cache holds, and concurrent misses on one unit share one GET.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use proptest::prelude::*;
use strata_cache_core::granularity::Granularity;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore, GetStats};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{
    AccessContext, BackingStore, CacheEngine, JobId, ObjectInfo, ObjectReader, Pattern, RetryPolicy,
};
use strata_types::SplitMix64;

const BS: u64 = 256 << 10;
const PAGE: u64 = 4096;
/// The unit a 4 KiB page read gets (`Granularity::default().min_unit`).
const UNIT: u64 = 4 << 10;
/// 64 blocks, the last one short and its last unit too: 16 MiB less 5000 bytes.
const SIZE: u64 = 64 * BS - 5000;
/// A memory tier the object does not fit 3/4 of (so it is read in units,
/// `Granularity::fits_whole_percent`) and is not over twice (so the dense rule holds).
const MEM: u64 = 16 << 20;

fn data(n: usize) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add((i >> 16) as u8))
        .collect::<Vec<u8>>()
        .into()
}

struct Fixture {
    reader: ObjectReader,
    faulty: Arc<FaultyStore>,
    obj: ObjectInfo,
    bytes: Bytes,
}

/// An object of `size` bytes behind a store with `faults`, read in blocks of `bs`
/// through a memory tier of `mem` bytes, in units `g`.
async fn fixture(size: u64, bs: u64, mem: u64, g: Granularity, faults: FaultConfig) -> Fixture {
    let inner: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let faulty = Arc::new(FaultyStore::new(inner, FaultConfig::default()));
    let retry = RetryPolicy {
        attempts: 2,
        base_backoff: Duration::from_millis(5),
        attempt_timeout: Duration::from_secs(5),
        max_backoff: Duration::from_millis(50),
        ..RetryPolicy::default()
    };
    let store = BackingStore::new(faulty.clone() as Arc<dyn ObjectStore>, "mem", retry);
    let bytes = data(size as usize);
    store
        .put("db/app.sqlite", bytes.clone())
        .await
        .expect("seed");
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(mem)))
        .build()
        .expect("engine");
    let reader = ObjectReader::new(engine, store, bs)
        .expect("reader")
        .with_granularity(g);
    let obj = reader.store().head("db/app.sqlite").await.expect("head");
    faulty.set_config(faults);
    Fixture {
        reader,
        faulty,
        obj,
        bytes,
    }
}

fn ctx() -> AccessContext {
    AccessContext::demand(JobId(7), 0)
}

fn timed<F: std::future::Future>(f: F) -> tokio::time::Timeout<F> {
    tokio::time::timeout(Duration::from_secs(60), f)
}

impl Fixture {
    /// Reads `len` bytes at `offset` and checks them against the object.
    async fn read_ok(&self, offset: u64, len: u64) {
        let got = self
            .reader
            .read(&self.obj, offset, len, &ctx())
            .await
            .expect("read");
        let end = (offset + len).min(self.obj.size) as usize;
        let want = self.bytes.slice((offset as usize).min(end)..end);
        assert_eq!(got.len(), want.len(), "length of {len} at {offset}");
        assert!(got == want, "bytes of {len} at {offset}");
    }

    /// 4 KiB page reads at random pages of blocks `0..32` until the tracker calls the
    /// stream random (or skewed); blocks `32..64` are left untouched.
    async fn warm_up_random(&self) {
        let mut rng = SplitMix64::new(13);
        for _ in 0..64 {
            let page = rng.next_u64() % (32 * BS / PAGE);
            self.read_ok(page * PAGE, PAGE).await;
        }
        let p = self
            .reader
            .engine()
            .pattern_of(&self.reader.key(&self.obj, 0), &ctx());
        assert!(
            matches!(p, Pattern::Random | Pattern::Skewed),
            "random page reads classified {p:?}"
        );
    }

    fn gets(&self) -> GetStats {
        self.faulty.gets()
    }
}

/// The object behind a 4 MiB memory tier (the object is over twice the cache, so a
/// stream of small reads stays in units: `Granularity::sparse_file_ratio`), after
/// [`Fixture::warm_up_random`].
async fn over_twice_the_cache() -> Fixture {
    let fx = fixture(
        SIZE,
        BS,
        4 << 20,
        Granularity::default(),
        FaultConfig::default(),
    )
    .await;
    fx.warm_up_random().await;
    fx
}

/// Blocks 32..64 in an order with no run in it (each step jumps by 13, mod 32).
fn untouched_blocks() -> impl Iterator<Item = u64> {
    (0..32u64).map(|i| 32 + (i * 13) % 32)
}

#[tokio::test]
async fn small_random_reads_fetch_unit_sized_ranges() {
    timed(async {
        let fx = fixture(
            SIZE,
            BS,
            MEM,
            Granularity::default(),
            FaultConfig::default(),
        )
        .await;
        fx.warm_up_random().await;
        let before = fx.gets();
        let mut rng = SplitMix64::new(5);
        for b in untouched_blocks() {
            let page = rng.next_u64() % (BS / PAGE);
            fx.read_ok(b * BS + page * PAGE, PAGE).await;
        }
        let after = fx.gets();
        // One GET of one unit per read, where whole blocks would move 16x the bytes.
        assert_eq!(after.count - before.count, 32, "one GET per read");
        assert_eq!(after.bytes - before.bytes, 32 * UNIT, "each GET one unit");
        assert!(fx.reader.unit_requests().0 >= 32);
        // A second pass over the same pages is served from the cached units.
        let mut rng = SplitMix64::new(5);
        for b in untouched_blocks() {
            let page = rng.next_u64() % (BS / PAGE);
            fx.read_ok(b * BS + page * PAGE, PAGE).await;
        }
        assert_eq!(fx.gets().count, after.count, "cached units serve re-reads");
    })
    .await
    .expect("bounded");
}

/// A file more than twice the cache: page lookups in blocks that hold units of
/// theirs already still fetch units (`Granularity::sparse_file_ratio`), where the
/// dense rule alone would fetch each such block whole, and a whole block would be
/// evicted before the reader came back to it.
#[tokio::test]
async fn page_lookups_in_a_file_over_twice_the_cache_stay_units() {
    timed(async {
        let fx = over_twice_the_cache().await;
        let before = fx.gets();
        let mut rng = SplitMix64::new(21);
        for _ in 0..64 {
            // Pages of blocks 0..32, which the warm-up left units of.
            let page = rng.next_u64() % (32 * BS / PAGE);
            fx.read_ok(page * PAGE, PAGE).await;
        }
        let after = fx.gets();
        let gets = after.count - before.count;
        assert!(gets >= 16, "lookups miss: {gets}");
        assert_eq!(
            after.bytes - before.bytes,
            gets * UNIT,
            "every GET one unit"
        );
    })
    .await
    .expect("bounded");
}

/// Four tensor-parallel ranks in one job each read 1 KiB of every 4 KiB row of a file
/// over twice the cache, at different rows: the tracker sees a sweep
/// (`Observation::sweeping`) and the reader fetches whole blocks, one GET per block
/// passed, where units would take one per row.
#[tokio::test]
async fn interleaved_slices_of_every_row_fetch_whole_blocks() {
    timed(async {
        let fx = over_twice_the_cache().await;
        let before = fx.gets();
        // Blocks 32..64 (untouched by the warm-up), 64 rows of 4 KiB each; the ranks
        // start 11, 5 and 15 blocks after rank 0 and read 256 rows (4 blocks) each, so
        // the job jumps between four places.
        let starts = [0u64, 11, 5, 15];
        for row in 0..256u64 {
            for (rank, start) in starts.iter().enumerate() {
                let at = 32 * BS + (start * 64 + row) * PAGE + rank as u64 * 1024;
                fx.read_ok(at, 1024).await;
            }
        }
        let gets = fx.gets().count - before.count;
        // 16 blocks are read, each by one rank; units took a GET per row (1,020 without
        // the sweep rule: the job's block pattern is skewed).
        assert!(gets <= 60, "{gets} GETs for 16 blocks swept by 4 ranks");
    })
    .await
    .expect("bounded");
}

/// Records read in 4 KiB pieces at random places (zip members): once the tracker has
/// seen a few, the first piece of a record fetches a unit holding the whole record
/// (`Observation::run_ahead`), and the pieces after it are served from that unit: about
/// one GET per record where 4 KiB units would take one per piece.
#[tokio::test]
async fn records_read_in_pieces_take_one_get_each() {
    timed(async {
        let fx = over_twice_the_cache().await;
        let record = 16 << 10;
        let mut rng = SplitMix64::new(77);
        // Within one block each: a record across a block's end takes a GET per block (a
        // unit never straddles blocks), and blocks read in pairs look sequential.
        let starts: Vec<u64> = (0..80)
            .map(|_| (rng.next_u64() % 63) * BS + rng.next_u64() % (BS - record))
            .collect();
        let mut before = fx.gets();
        for (i, start) in starts.into_iter().enumerate() {
            if i == 48 {
                before = fx.gets();
            }
            for piece in 0..4 {
                fx.read_ok(start + piece * PAGE, PAGE).await;
            }
        }
        let gets = fx.gets().count - before.count;
        // A record's unit is 16-32 KiB, or more where it lies across an aligned
        // boundary; 4 KiB units would take 4 GETs per record.
        assert!(gets <= 34, "{gets} GETs for 32 records of 4 pieces");
        assert!(
            fx.gets().bytes - before.bytes < 32 * BS / 2,
            "units, not whole blocks"
        );
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn block_mode_fetches_whole_blocks() {
    timed(async {
        let fx = fixture(
            SIZE,
            BS,
            64 << 20,
            Granularity::BLOCKS,
            FaultConfig::default(),
        )
        .await;
        fx.warm_up_random().await;
        let before = fx.gets();
        for b in untouched_blocks() {
            fx.read_ok(b * BS + 3 * PAGE, PAGE).await;
        }
        let after = fx.gets();
        assert_eq!(after.count - before.count, 32);
        // Block 63 is short (SIZE is not a multiple of the block).
        assert_eq!(after.bytes - before.bytes, 31 * BS + (SIZE - 63 * BS));
        assert_eq!(fx.reader.unit_requests().0, 0);
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn reads_straddling_cached_and_uncached_units_are_byte_exact() {
    timed(async {
        let fx = fixture(
            SIZE,
            BS,
            MEM,
            Granularity::default(),
            FaultConfig::default(),
        )
        .await;
        fx.warm_up_random().await;
        // A unit of block 40 cached, then reads reaching past it on either side, inside
        // the block and into the next block (whose own unit is cached too).
        let b40 = 40 * BS;
        fx.read_ok(b40 + 5 * PAGE, PAGE).await; // unit 20..24 KiB of the block
        fx.read_ok(41 * BS + PAGE, PAGE).await; // unit 4..8 KiB of block 41
        let units = fx.reader.unit_requests().0;
        fx.read_ok(b40 + UNIT - 100, 200).await; // into the unit from before it
        fx.read_ok(b40 + 2 * UNIT - 10, 3 * PAGE).await; // from the unit past its end
        fx.read_ok(b40 + BS - 3000, 6000).await; // across the block boundary
        fx.read_ok(41 * BS + UNIT - 1, 2).await; // the last byte of block 41's unit and one more
                                                 // A unit of a block with another of its units cached is not fetched: the
                                                 // block is (dense; see `Granularity::dense_units`).
        assert_eq!(fx.reader.unit_requests().0, units);
        // Units at the object's end: the last unit is short.
        let last_unit = SIZE / UNIT * UNIT;
        fx.read_ok(last_unit + 100, PAGE).await;
        fx.read_ok(SIZE - 10, 100).await; // clamped at the end
        fx.read_ok(SIZE - PAGE - 5, PAGE + 5).await;
        fx.read_ok(SIZE, 10).await; // nothing past the end
                                    // Everything, in one read across units and blocks.
        fx.read_ok(0, SIZE).await;
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn concurrent_misses_on_one_unit_share_one_get() {
    timed(async {
        let fx = fixture(
            SIZE,
            BS,
            MEM,
            Granularity::default(),
            FaultConfig::default(),
        )
        .await;
        fx.warm_up_random().await;
        fx.faulty.set_config(FaultConfig {
            latency: Duration::from_millis(100),
            ..FaultConfig::default()
        });
        let before = fx.gets();
        let base = 50 * BS + 3 * UNIT;
        let reads = (0..8u64).map(|i| {
            let reader = fx.reader.clone();
            let obj = fx.obj.clone();
            tokio::spawn(async move {
                let at = base + i * 512;
                (at, reader.read(&obj, at, 512, &ctx()).await.expect("read"))
            })
        });
        for r in futures::future::join_all(reads).await {
            let (at, got) = r.expect("task");
            assert!(got == fx.bytes.slice(at as usize..at as usize + 512));
        }
        let after = fx.gets();
        assert_eq!(after.count - before.count, 1, "one GET for eight readers");
        assert_eq!(after.bytes - before.bytes, UNIT);
    })
    .await
    .expect("bounded");
}

/// Units are cache items like blocks: written through to the disk tier with their
/// checksums, found there by a restarted engine and served without a store GET.
#[tokio::test]
async fn units_on_the_disk_tier_survive_a_restart() {
    use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
    timed(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let inner: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let faulty = Arc::new(FaultyStore::new(inner, FaultConfig::default()));
        let store = BackingStore::new(
            faulty.clone() as Arc<dyn ObjectStore>,
            "mem",
            RetryPolicy::default(),
        );
        let bytes = data(SIZE as usize);
        store
            .put("db/app.sqlite", bytes.clone())
            .await
            .expect("seed");
        let open = |store: BackingStore| {
            let disk =
                DiskTier::open(dir.path(), 12 << 20, DiskOptions::default()).expect("disk tier");
            let disk = Arc::new(disk);
            let weak = Arc::downgrade(&disk);
            let engine = CacheEngine::builder()
                .tier(Arc::new(MemoryTier::new(8 << 20)))
                .tier(disk)
                .build()
                .expect("engine");
            (ObjectReader::new(engine, store, BS).expect("reader"), weak)
        };
        let (reader, first_disk) = open(store.clone());
        let obj = reader.store().head("db/app.sqlite").await.expect("head");
        let fx = Fixture {
            reader,
            faulty: faulty.clone(),
            obj: obj.clone(),
            bytes: bytes.clone(),
        };
        fx.warm_up_random().await;
        let pages: Vec<u64> = untouched_blocks().map(|b| b * BS + 2 * PAGE).collect();
        for &at in &pages {
            fx.read_ok(at, PAGE).await;
        }
        assert!(fx.reader.unit_requests().0 >= 32);
        // The write-through to disk runs in the background: wait until it has landed.
        let last = strata_cache_core::CacheKey::file_block(
            obj.path.clone(),
            obj.version.clone(),
            UNIT,
            *pages.last().expect("pages") / UNIT,
        );
        while fx.reader.engine().stats().tiers[1].used_bytes < 32 * UNIT
            || !fx.reader.engine().contains(&last)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(fx);
        // The first engine's background writes hold its disk tier (and the directory's
        // lock) until they finish.
        while first_disk.upgrade().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let fx = Fixture {
            reader: open(store).0,
            faulty: faulty.clone(),
            obj,
            bytes,
        };
        // The pages first, by a stream the new tracker has not classified: each is
        // served by its cached unit (a fetch in units needs the pattern, a hit does
        // not); then the warm-up's reads, whose blocks and units are on disk too.
        let before = faulty.gets().count;
        for &at in &pages {
            fx.read_ok(at, PAGE).await;
        }
        assert_eq!(
            faulty.gets().count,
            before,
            "every unit came from the disk tier"
        );
        fx.warm_up_random().await;
        assert_eq!(
            faulty.gets().count,
            before,
            "every item came from the disk tier"
        );
        assert_eq!(fx.reader.unit_requests().0, 0);
    })
    .await
    .expect("bounded");
}

/// Reads of a random object against the object itself (the reference model): any
/// sequence of reads, small and large, random and sequential, through a cache small
/// enough to evict units and blocks, returns the object's bytes.
/// Returns the unit GETs the reads sent.
fn random_reads_case(size: u64, cache: u64, reads: &[(u64, u64)]) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        timed(async {
            let fx = fixture(
                size,
                64 << 10,
                cache,
                Granularity::default(),
                FaultConfig::default(),
            )
            .await;
            for &(at, len) in reads {
                fx.read_ok(at % (size + 100), len).await;
            }
            fx.reader.unit_requests().0
        })
        .await
    })
    .expect("bounded")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_reads_return_the_objects_bytes(
        size in (1u64 << 20)..(3 << 20),
        cache in prop::sample::select(vec![96u64 << 10, 512 << 10, 64 << 20]),
        reads in prop::collection::vec(
            (any::<u64>(), prop_oneof![6 => 1u64..9000, 1 => 9000u64..200_000]),
            40..120,
        ),
    ) {
        random_reads_case(size, cache, &reads);
    }
}

/// The model above does exercise units: random page reads of a 2 MiB object in
/// 64 KiB blocks through a cache that evicts.
#[test]
fn the_reference_model_reads_through_units() {
    let mut rng = SplitMix64::new(99);
    let reads: Vec<(u64, u64)> = (0..100)
        .map(|_| (rng.next_u64() % (2 << 20), 1 + rng.next_u64() % 6000))
        .collect();
    assert!(random_reads_case(2 << 20, 96 << 10, &reads) > 10);
}
