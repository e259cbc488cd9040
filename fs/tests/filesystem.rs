//! The file system core without a kernel: an in-memory store (and a fault-injecting
//! wrapper) behind the real cache engine and reader.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::ObjectStore;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{BackingStore, CacheEngine, ObjectReader, RetryPolicy};
use strata_fs::filesystem::{Kind, Opened, ROOT_INO};
use strata_fs::{CoreOptions, FsCore, PassthroughOptions};

const BS: u64 = 64 << 10;

struct Fixture {
    core: Arc<FsCore>,
    store: BackingStore,
    faulty: Arc<FaultyStore>,
    engine: CacheEngine,
}

fn data(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

async fn fixture(opts: CoreOptions) -> Fixture {
    let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let faulty = Arc::new(FaultyStore::new(mem, FaultConfig::default()));
    let retry = RetryPolicy {
        attempts: 2,
        base_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_secs(1),
        attempt_timeout: Duration::from_millis(300),
        silent_pause: Duration::ZERO,
        ..RetryPolicy::default()
    };
    let store = BackingStore::new(faulty.clone() as Arc<dyn ObjectStore>, "mem", retry);
    for (p, d) in [
        ("top.txt", data(10, 1)),
        ("empty", Bytes::new()),
        ("dir/big.bin", data((5 * BS + 123) as usize, 2)),
        ("dir/small", data(1000, 3)),
        ("dir/sub/deep", data(77, 4)),
        ("pre/fix/x", data(5, 5)),
    ] {
        store.put(p, d).await.expect("seed");
    }
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(64 << 20)))
        .build()
        .expect("engine");
    let reader = ObjectReader::new(engine.clone(), store.clone(), BS).expect("reader");
    Fixture {
        core: Arc::new(FsCore::new(reader, "", opts)),
        store,
        faulty,
        engine,
    }
}

fn timed<F: std::future::Future>(f: F) -> tokio::time::Timeout<F> {
    tokio::time::timeout(Duration::from_secs(20), f)
}

#[tokio::test]
async fn lookup_getattr_and_readdir_describe_the_tree() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        assert_eq!(dir.attr.kind, Kind::Dir);
        let big = c.lookup(dir.attr.ino, "big.bin").await.expect("big");
        assert_eq!(big.attr.kind, Kind::File);
        assert_eq!(big.attr.size, 5 * BS + 123);
        assert_eq!(big.attr.perm, 0o444);
        // Same path, same inode.
        assert_eq!(
            c.lookup(dir.attr.ino, "big.bin")
                .await
                .expect("again")
                .attr
                .ino,
            big.attr.ino
        );
        assert_eq!(
            c.getattr(big.attr.ino).await.expect("getattr").attr.size,
            big.attr.size
        );
        let err = c.lookup(ROOT_INO, "nope").await.expect_err("missing");
        assert_eq!(err.errno(), libc::ENOENT);
        let err = c.lookup(big.attr.ino, "x").await.expect_err("file as dir");
        assert_eq!(err.errno(), libc::ENOTDIR);

        let fh = c.opendir(ROOT_INO).await.expect("opendir");
        let names: Vec<String> = c
            .readdir(fh, 0, 100)
            .await
            .expect("readdir")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec![".", "..", "dir", "empty", "pre", "top.txt"]);
        // Cookies resume where the previous call stopped.
        let rest: Vec<String> = c
            .readdir(fh, 3, 100)
            .await
            .expect("resume")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(rest, vec!["empty", "pre", "top.txt"]);
        c.releasedir(fh);
        assert!(c.readdir(fh, 0, 10).await.is_err(), "released handle");

        let fh = c.opendir(dir.attr.ino).await.expect("opendir dir");
        let entries = c.readdir(fh, 2, 100).await.expect("readdir dir");
        let got: Vec<(String, Kind, u64)> = entries
            .iter()
            .map(|e| (e.name.clone(), e.entry.attr.kind, e.entry.attr.size))
            .collect();
        assert_eq!(
            got,
            vec![
                ("big.bin".into(), Kind::File, 5 * BS + 123),
                ("small".into(), Kind::File, 1000),
                ("sub".into(), Kind::Dir, 0),
            ]
        );
        assert_eq!(
            entries[0].entry.attr.ino, big.attr.ino,
            "readdir reuses lookup's inode"
        );
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn listings_and_attributes_are_served_from_the_cache() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let fh = c.opendir(dir.attr.ino).await.expect("opendir");
        c.releasedir(fh);
        let before = fx.faulty.reads();
        for _ in 0..50 {
            for name in ["big.bin", "small", "sub"] {
                let e = c.lookup(dir.attr.ino, name).await.expect("lookup");
                c.getattr(e.attr.ino).await.expect("getattr");
            }
            assert!(c.lookup(dir.attr.ino, "absent").await.is_err());
            let fh = c.opendir(dir.attr.ino).await.expect("opendir");
            c.releasedir(fh);
        }
        assert_eq!(fx.faulty.reads(), before, "no store request within the TTL");
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn reads_match_the_object_at_odd_offsets() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let big = c.lookup(dir.attr.ino, "big.bin").await.expect("big");
        let want = data((5 * BS + 123) as usize, 2);
        let o = c.open(big.attr.ino, false).await.expect("open");
        for (off, len) in [
            (0u64, 1u32),
            (BS - 1, 2),
            (3, (3 * BS) as u32),
            (5 * BS, 1000),
            (5 * BS + 122, 10),
            (10 * BS, 10),
        ] {
            let got = c.read(o.fh, off, len, 42).await.expect("read");
            let s = (off as usize).min(want.len());
            let e = (off as usize + len as usize).min(want.len());
            assert_eq!(got, want.slice(s..e), "range {off}+{len}");
        }
        c.release(o.fh);
        assert_eq!(
            c.read(o.fh, 0, 1, 0).await.expect_err("released").errno(),
            libc::EBADF
        );

        let empty = c.lookup(ROOT_INO, "empty").await.expect("empty");
        assert_eq!(empty.attr.size, 0);
        let o = c.open(empty.attr.ino, false).await.expect("open empty");
        assert!(c
            .read(o.fh, 0, 4096, 1)
            .await
            .expect("read empty")
            .is_empty());
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn writes_are_refused_with_erofs_and_dirs_cannot_be_opened() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        let top = fx.core.lookup(ROOT_INO, "top.txt").await.expect("top");
        assert_eq!(
            fx.core
                .open(top.attr.ino, true)
                .await
                .expect_err("write")
                .errno(),
            libc::EROFS
        );
        assert_eq!(
            fx.core
                .open(ROOT_INO, false)
                .await
                .expect_err("dir")
                .errno(),
            libc::EISDIR
        );
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn sequential_reads_prefetch_ahead_and_random_reads_do_not() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let big = c.lookup(dir.attr.ino, "big.bin").await.expect("big");
        let o = c.open(big.attr.ino, false).await.expect("open");
        c.read(o.fh, 0, BS as u32, 7).await.expect("read 0");
        // Let the background prefetches land.
        let deadline = Instant::now() + Duration::from_secs(5);
        while fx.engine.stats().prefetch_fills < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            fx.engine.stats().prefetch_fills >= 2,
            "blocks 1.. prefetched: {:?}",
            fx.engine.stats()
        );
        let fills = fx.engine.stats().fills;
        c.read(o.fh, BS, BS as u32, 7).await.expect("read 1");
        c.read(o.fh, 2 * BS, BS as u32, 7).await.expect("read 2");
        assert!(fx.engine.stats().fills >= fills, "no refetch");

        let small = c.lookup(dir.attr.ino, "small").await.expect("small");
        let o2 = c.open(small.attr.ino, false).await.expect("open small");
        let before = c
            .counters()
            .prefetch_requests
            .load(std::sync::atomic::Ordering::Relaxed);
        c.read(o2.fh, 500, 10, 8).await.expect("random read");
        c.read(o2.fh, 100, 10, 8).await.expect("random read");
        assert_eq!(
            c.counters()
                .prefetch_requests
                .load(std::sync::atomic::Ordering::Relaxed),
            before
        );
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_changed_object_is_seen_after_the_ttl_and_never_mixed() {
    timed(async {
        let opts = CoreOptions {
            metadata_ttl: Duration::from_millis(200),
            ..Default::default()
        };
        let fx = fixture(opts).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let small = c.lookup(dir.attr.ino, "small").await.expect("small");
        let old = c.open(small.attr.ino, false).await.expect("open old");
        assert_eq!(
            c.read(old.fh, 0, 10, 1).await.expect("old bytes"),
            data(1000, 3).slice(0..10)
        );
        fx.store
            .put("dir/small", data(3000, 9))
            .await
            .expect("overwrite");
        // Within the TTL the attributes are the cached ones.
        assert_eq!(
            c.getattr(small.attr.ino).await.expect("cached").attr.size,
            1000
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        // With a handle open the inode is the version it opened, as a local file's is
        // for its descriptors; the path's new version comes through a lookup, as a new
        // inode.
        assert_eq!(
            c.getattr(small.attr.ino)
                .await
                .expect("as opened")
                .attr
                .size,
            1000
        );
        let fresh = c.lookup(dir.attr.ino, "small").await.expect("fresh");
        assert_eq!(fresh.attr.size, 3000);
        assert_ne!(fresh.attr.ino, small.attr.ino);
        // The old handle still reads its version from the cache (block 0 is cached)...
        assert_eq!(
            c.read(old.fh, 0, 10, 1).await.expect("cached old"),
            data(1000, 3).slice(0..10)
        );
        // The old inode stands for the old version: an open of it now is ESTALE, and
        // the kernel's retry looks the path up again, which names the new inode.
        let stale = c.open(small.attr.ino, false).await.expect_err("old inode");
        assert_eq!(stale.errno(), libc::ESTALE);
        let new = c.open(fresh.attr.ino, false).await.expect("open new");
        assert!(
            !new.keep_cache,
            "a new version drops the kernel's page cache"
        );
        assert_eq!(
            c.read(new.fh, 0, 3000, 1).await.expect("new bytes"),
            data(3000, 9)
        );
        let again = c.open(fresh.attr.ino, false).await.expect("open same");
        assert!(again.keep_cache, "same version keeps it");
        // The old handle reads on in its own inode's page cache: its version only.
        assert_eq!(
            c.read(old.fh, 0, 10, 1)
                .await
                .expect("the old version, cached"),
            data(1000, 3).slice(0..10)
        );
        assert_eq!(
            c.read(again.fh, 0, 10, 1)
                .await
                .expect("the new handle reads on"),
            data(3000, 9).slice(0..10)
        );

        // ...and an uncached block of the old version fails with ESTALE, not new bytes,
        // once the handle has served bytes of the old version.
        let big = c.lookup(dir.attr.ino, "big.bin").await.expect("big");
        let h = c.open(big.attr.ino, false).await.expect("open big");
        assert_eq!(
            c.read(h.fh, 5 * BS, 10, 1).await.expect("old tail"),
            data((5 * BS + 123) as usize, 2).slice((5 * BS) as usize..(5 * BS + 10) as usize)
        );
        fx.store
            .put("dir/big.bin", data((5 * BS + 123) as usize, 77))
            .await
            .expect("overwrite big");
        let err = c.read(h.fh, BS, 10, 1).await.expect_err("stale");
        assert_eq!(err.errno(), libc::ESTALE);
        // Counted, for `strata stats` and /metrics (black-box finding: failed reads
        // moved no figure).
        assert_eq!(c.counters().read_errors.load(Ordering::Relaxed), 1);
        assert_eq!(c.counters().read_stale.load(Ordering::Relaxed), 1);
    })
    .await
    .expect("bounded");
}

/// An open as the kernel makes it: of inode `ino` of `name` in `parent`, and when that
/// is ESTALE (the inode stands for a version the path no longer has), once more after
/// a fresh lookup (`do_filp_open`'s LOOKUP_REVAL retry). The inode opened, and the open.
async fn kernel_open(c: &Arc<FsCore>, parent: u64, name: &str, ino: u64) -> (u64, Opened) {
    match c.open(ino, false).await {
        Ok(o) => (ino, o),
        Err(e) if e.errno() == libc::ESTALE => {
            let fresh = c.lookup(parent, name).await.expect("lookup again");
            let o = c
                .open(fresh.attr.ino, false)
                .await
                .expect("open the fresh inode");
            (fresh.attr.ino, o)
        }
        Err(e) => panic!("open: {e}"),
    }
}

/// Black-box findings: the kernel keeps one page cache and one passthrough backing
/// file per inode, so two versions on one inode mixed: a handle of the old version
/// read the new version's bytes another reader had brought into the page cache, and
/// while one handle held the old version's passthrough copy every new open was served
/// the old bytes. A lookup that finds a new version now answers another inode; the
/// old one stands for its handles' version until the kernel forgets it.
#[tokio::test]
async fn a_new_version_is_a_new_inode_and_the_old_one_keeps_its_version() {
    timed(async {
        let opts = CoreOptions {
            metadata_ttl: Duration::from_millis(100),
            ..Default::default()
        };
        let fx = fixture(opts).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let old = c.lookup(dir.attr.ino, "small").await.expect("small");
        let h = c.open(old.attr.ino, false).await.expect("open");
        assert_eq!(
            c.read(h.fh, 0, 10, 1).await.expect("old bytes"),
            data(1000, 3).slice(0..10)
        );
        let same = c.lookup(dir.attr.ino, "small").await.expect("again");
        assert_eq!(
            same.attr.ino, old.attr.ino,
            "the same version keeps its number"
        );
        fx.store
            .put("dir/small", data(3000, 9))
            .await
            .expect("replace");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let new = c.lookup(dir.attr.ino, "small").await.expect("new version");
        assert_ne!(new.attr.ino, old.attr.ino, "a new version is a new inode");
        assert_eq!(new.attr.size, 3000);
        let h2 = c.open(new.attr.ino, false).await.expect("open new");
        assert_eq!(
            c.read(h2.fh, 0, 3000, 1).await.expect("new bytes"),
            data(3000, 9)
        );
        // The old inode is its handle's version: its size, its bytes (or ESTALE,
        // never the new version's bytes).
        assert_eq!(
            c.getattr(old.attr.ino).await.expect("old attrs").attr.size,
            1000
        );
        match c.read(h.fh, 0, 10, 1).await {
            Ok(b) => assert_eq!(b, data(1000, 3).slice(0..10)),
            Err(e) => assert_eq!(e.errno(), libc::ESTALE),
        }
        assert_eq!(
            c.getattr(new.attr.ino).await.expect("new attrs").attr.size,
            3000
        );
        c.release(h.fh);
        c.release(h2.fh);
    })
    .await
    .expect("bounded");
}

/// Black-box finding: with `--metadata-ttl 0` every lookup of a directory listed all of
/// it to learn it was one (8 LIST pages per open under a 4,000-file folder, 22x slower
/// than a small one). Without a cache to fill, one page of the prefix answers, whatever
/// the folder holds.
#[tokio::test]
async fn with_no_ttl_a_directory_lookup_reads_one_listing_page() {
    timed(async {
        let opts = CoreOptions {
            metadata_ttl: Duration::ZERO,
            ..Default::default()
        };
        let fx = fixture(opts).await;
        for i in 0..2500 {
            fx.store
                .put(&format!("big/f{i:05}"), Bytes::from_static(b"x"))
                .await
                .expect("seed");
        }
        let c = &fx.core;
        let reads_before = fx.faulty.reads();
        for _ in 0..3 {
            let big = c.lookup(ROOT_INO, "big").await.expect("a directory");
            assert_eq!(big.attr.kind, Kind::Dir);
            let f = c.lookup(big.attr.ino, "f01234").await.expect("a file");
            assert_eq!(f.attr.size, 1);
        }
        // Per round: HEAD big (404), HEAD of the file, and the probe: the first item
        // of a flat listing of `big/` (FaultyStore counts GETs, HEADs and level
        // listings, not flat ones). A level listing of all of `big` (before: one per
        // round) would add one read per round.
        let reads = fx.faulty.reads() - reads_before;
        assert_eq!(reads, 2 * 3, "no level listing of the folder");
        let missing = c.lookup(ROOT_INO, "nothing").await.expect_err("missing");
        assert_eq!(missing.errno(), libc::ENOENT);
        let sub = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let deep = c
            .lookup(sub.attr.ino, "sub")
            .await
            .expect("a directory of directories");
        assert_eq!(deep.attr.kind, Kind::Dir);
    })
    .await
    .expect("bounded");
}

/// Records the inodes whose attributes the core tells the kernel to drop.
fn record_invalidations(c: &strata_fs::FsCore) -> Arc<std::sync::Mutex<Vec<u64>>> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    c.set_attr_invalidator(Box::new(move |ino| s.lock().expect("lock").push(ino)));
    seen
}

/// Opens `dir/small` (1,000 bytes) as the kernel would, then replaces it in the store by
/// `by`, before the handle reads a byte: its inode and the handle's `fh`.
async fn open_small_then_replace(fx: &Fixture, by: Bytes) -> (u64, u64) {
    let c = &fx.core;
    let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
    let small = c.lookup(dir.attr.ino, "small").await.expect("small");
    assert_eq!(small.attr.size, 1000);
    let h = c.open(small.attr.ino, false).await.expect("open");
    fx.store.put("dir/small", by).await.expect("replace");
    (small.attr.ino, h.fh)
}

/// Black-box finding: a file the mount had only listed or stat-ed, then replaced by
/// another writer, failed every open with ESTALE for the whole metadata TTL. A handle
/// that has served nothing goes on with a new version of the same size. A longer or
/// shorter one fails the read with ESTALE (black-box findings, round 13: the kernel,
/// which reads up to the size it was told, cut the new bytes at the old length, or
/// padded them with zeros, as successes) and the next open reads it whole.
#[tokio::test]
async fn a_handle_that_read_nothing_reads_the_replacing_version_whole() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        let c = &fx.core;
        let (_, fh) = open_small_then_replace(&fx, data(1000, 8)).await;
        assert_eq!(
            c.read(fh, 0, 4096, 1).await.expect("the new version"),
            data(1000, 8)
        );
        assert_eq!(c.counters().handles_renewed.load(Ordering::Relaxed), 1);
        c.release(fh);
        // Shorter, the first read inside it: not renewed either (the kernel, told 1,000
        // bytes, would pad the 600 with zeros up to them).
        let fx = fixture(CoreOptions::default()).await;
        let c = &fx.core;
        let (_, fh) = open_small_then_replace(&fx, data(600, 7)).await;
        let e = c
            .read(fh, 0, 100, 1)
            .await
            .expect_err("shorter: not padded");
        assert_eq!(e.errno(), libc::ESTALE);
        c.release(fh);
        let fx = fixture(CoreOptions::default()).await;
        let c = &fx.core;
        let seen = record_invalidations(c);
        let (ino, fh) = open_small_then_replace(&fx, data(3000, 9)).await;
        let e = c.read(fh, 0, 4096, 1).await.expect_err("longer: not cut");
        assert_eq!(e.errno(), libc::ESTALE);
        assert_eq!(c.counters().handles_renewed.load(Ordering::Relaxed), 0);
        assert_eq!(*seen.lock().expect("lock"), vec![ino], "told to ask again");
        c.release(fh);
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let (ino, h) = kernel_open(c, dir.attr.ino, "small", ino).await;
        assert_eq!(
            c.read(h.fh, 0, 4096, 1).await.expect("the next open"),
            data(3000, 9)
        );
        c.release(h.fh);
        assert_eq!(
            c.getattr(ino).await.expect("attrs").attr.size,
            3000,
            "what the kernel asks next"
        );
        // Another handle open on the inode: its page cache may hold the old bytes, so
        // the handle fails as before rather than mix.
        let a = c.open(ino, false).await.expect("open a");
        let b = c.open(ino, false).await.expect("open b");
        fx.store
            .put("dir/small", data(2000, 11))
            .await
            .expect("replace again");
        let err = c.read(b.fh, 0, 10, 1).await;
        // The new version's block 0 is cached (read above): a cache hit is its version.
        assert_eq!(err.expect("cached block"), data(3000, 9).slice(0..10));
        c.release(a.fh);
        c.release(b.fh);
    })
    .await
    .expect("bounded");
}

/// Black-box finding (`--metadata-ttl 0`, an object replaced every 50 ms, read whole):
/// each GETATTR asked the store afresh, so the kernel took one version's size while the
/// handle read another's (reads cut at a block boundary or padded with zeros, as
/// successes), and a GETATTR between a lookup and an open, after another reader's lookup
/// moved the path to a newer inode, answered ENOENT for a file that always existed.
#[tokio::test]
async fn an_open_files_attributes_are_its_opened_version_and_an_older_inode_still_answers() {
    timed(async {
        let opts = CoreOptions {
            metadata_ttl: Duration::ZERO,
            ..Default::default()
        };
        let fx = fixture(opts).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let first = c.lookup(dir.attr.ino, "small").await.expect("small");
        fx.store
            .put("dir/small", data(3000, 9))
            .await
            .expect("replace");
        let second = c.lookup(dir.attr.ino, "small").await.expect("again");
        assert_ne!(
            second.attr.ino, first.attr.ino,
            "a new version, a new inode"
        );
        let older = c.getattr(first.attr.ino).await.expect("not ENOENT");
        assert_eq!(older.attr.size, 3000);
        // Opened through the older inode (a lookup raced the replace), the kernel's
        // retry reads the new version on the new inode.
        let (ino, h) = kernel_open(c, dir.attr.ino, "small", first.attr.ino).await;
        assert_eq!(ino, second.attr.ino);
        assert_eq!(c.read(h.fh, 0, 4096, 1).await.expect("read"), data(3000, 9));
        fx.store
            .put("dir/small", data(2000, 4))
            .await
            .expect("replace again");
        assert_eq!(
            c.getattr(ino).await.expect("open").attr.size,
            3000,
            "the version the handle reads"
        );
        c.release(h.fh);
        assert_eq!(
            c.getattr(ino).await.expect("closed").attr.size,
            2000,
            "once closed, the store's"
        );
    })
    .await
    .expect("bounded");
}

/// No prefetch: a test that needs blocks left uncached.
struct NoReadahead;
impl strata_fs::readahead::Readahead for NoReadahead {
    fn on_read(&mut self, _: u64, _: u64, _: u64) -> Option<std::ops::Range<u64>> {
        None
    }
}

/// Black-box finding: a file read through one mount and rewritten through another mount
/// of the same prefix failed every new open with ESTALE for the whole metadata TTL (for
/// good with `indefinite`): each open took the old version's attributes, read its cached
/// first block and met the new version at the next. The read that meets it fails (its
/// handle served old bytes), and the mount takes the store's version from then on.
#[tokio::test]
async fn after_a_read_meets_a_replaced_version_the_next_open_reads_the_new_one() {
    timed(async {
        let opts = CoreOptions {
            metadata_ttl: strata_fs::METADATA_TTL_INDEFINITE,
            readahead: Arc::new(|| Box::new(NoReadahead)),
            ..Default::default()
        };
        let fx = fixture(opts).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let big = c.lookup(dir.attr.ino, "big.bin").await.expect("big");
        let old = data((5 * BS + 123) as usize, 2);
        let h = c.open(big.attr.ino, false).await.expect("open");
        let bs = BS as u32;
        assert_eq!(
            c.read(h.fh, 0, bs, 1).await.expect("block 0"),
            old.slice(0..BS as usize)
        );
        c.release(h.fh);
        let new = data((5 * BS + 123) as usize, 7);
        fx.store
            .put("dir/big.bin", new.clone())
            .await
            .expect("replace");
        let h = c.open(big.attr.ino, false).await.expect("open");
        c.read(h.fh, 0, bs, 1)
            .await
            .expect("cached block 0 of the old version");
        let err = c.read(h.fh, BS, bs, 1).await.expect_err("block 1 is gone");
        assert_eq!(err.errno(), libc::ESTALE);
        c.release(h.fh);
        let (_, h) = kernel_open(c, dir.attr.ino, "big.bin", big.attr.ino).await;
        let mut got = Vec::new();
        for b in 0..6u64 {
            got.extend_from_slice(&c.read(h.fh, b * BS, bs, 1).await.expect("the new version"));
        }
        assert_eq!(got, new.to_vec());
        c.release(h.fh);
    })
    .await
    .expect("bounded");
}

/// Black-box finding: a handle of a 20 MiB file replaced by a 1 MiB one, whose first
/// read was at 10 MiB, went on with the new version and answered nothing: the kernel,
/// which sent the read under the old size, filled the reply with 1 MiB of zeros that
/// exist in neither version. A read past a shrunk version's end fails with ESTALE; the
/// kernel is still told to drop the old size, and the next open reads the new version.
#[tokio::test]
async fn a_first_read_past_the_end_of_a_shorter_replacement_is_estale() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        let c = &fx.core;
        let seen = record_invalidations(c);
        let (ino, fh) = open_small_then_replace(&fx, data(300, 5)).await;
        let err = c.read(fh, 512, 256, 1).await.expect_err("past the new end");
        assert_eq!(err.errno(), libc::ESTALE);
        assert_eq!(*seen.lock().expect("lock"), vec![ino]);
        assert_eq!(c.counters().handles_renewed.load(Ordering::Relaxed), 0);
        c.release(fh);
        assert_eq!(c.getattr(ino).await.expect("attrs").attr.size, 300);
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let (_, h) = kernel_open(c, dir.attr.ino, "small", ino).await;
        assert_eq!(
            c.read(h.fh, 0, 4096, 1).await.expect("the new version"),
            data(300, 5)
        );
        c.release(h.fh);
    })
    .await
    .expect("bounded");
}

/// Black-box finding: about 1 read in 1,000 returned the new version's bytes cut to
/// the old size: the mount's cache had the new version while the kernel still held
/// the old size. An open that finds another version than the kernel's inode stands
/// for is ESTALE; the kernel's retry looks the path up and gets the new version's
/// inode and size.
#[tokio::test]
async fn an_open_of_another_version_than_the_kernels_inode_goes_to_a_new_inode() {
    timed(async {
        let opts = CoreOptions {
            metadata_ttl: Duration::from_millis(100),
            ..Default::default()
        };
        let fx = fixture(opts).await;
        let c = &fx.core;
        let seen = record_invalidations(c);
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let small = c.lookup(dir.attr.ino, "small").await.expect("small");
        let same = c.open(small.attr.ino, false).await.expect("open");
        assert!(seen.lock().expect("lock").is_empty(), "the size it knows");
        c.release(same.fh);
        fx.store
            .put("dir/small", data(1500, 4))
            .await
            .expect("replace");
        // The mount's cache entry expires before the kernel's (they start at different
        // replies): the open finds the new version while the kernel holds the old size.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (ino, h) = kernel_open(c, dir.attr.ino, "small", small.attr.ino).await;
        assert_ne!(ino, small.attr.ino, "a new version, a new inode");
        assert_eq!(c.getattr(ino).await.expect("attrs").attr.size, 1500);
        assert!(seen.lock().expect("lock").is_empty(), "{seen:?}");
        assert_eq!(c.read(h.fh, 0, 4096, 1).await.expect("read"), data(1500, 4));
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_failing_store_gives_eio_in_bounded_time_and_recovers() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        let c = &fx.core;
        let top = c.lookup(ROOT_INO, "top.txt").await.expect("top");
        let o = c.open(top.attr.ino, false).await.expect("open");
        fx.faulty.set_config(FaultConfig {
            down: true,
            ..Default::default()
        });
        let t = Instant::now();
        let err = c.read(o.fh, 0, 10, 1).await.expect_err("down");
        assert_eq!(err.errno(), libc::EIO);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "bounded: {:?}",
            t.elapsed()
        );
        fx.faulty.set_config(FaultConfig {
            hang_every: 1,
            ..Default::default()
        });
        let err = c.read(o.fh, 0, 10, 1).await.expect_err("hangs");
        assert_eq!(err.errno(), libc::EIO);
        fx.faulty.set_config(FaultConfig::default());
        assert_eq!(
            c.read(o.fh, 0, 10, 1).await.expect("recovered"),
            data(10, 1)
        );
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_whole_small_object_read_gets_a_passthrough_copy() {
    timed(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = CoreOptions {
            passthrough: Some(
                PassthroughOptions::open(dir.path().join("pt"), 4 << 30).expect("copies"),
            ),
            ..Default::default()
        };
        let fx = fixture(opts).await;
        let c = &fx.core;
        let d = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let big = c.lookup(d.attr.ino, "big.bin").await.expect("big");
        let o = c.open(big.attr.ino, false).await.expect("open");
        assert!(o.passthrough.is_none(), "nothing cached yet");
        let mut off = 0;
        while off < big.attr.size {
            off += c.read(o.fh, off, BS as u32, 1).await.expect("read").len() as u64;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let file = loop {
            let o2 = c.open(big.attr.ino, false).await.expect("reopen");
            if let Some(f) = o2.passthrough {
                break f;
            }
            assert!(Instant::now() < deadline, "copy written");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut buf).expect("read copy");
        assert_eq!(Bytes::from(buf), data((5 * BS + 123) as usize, 2));
    })
    .await
    .expect("bounded");
}

/// A core with the standard predictors over 12 shards `shards/shard-NNNNN.tar` of 3000
/// bytes each, their directory already listed (as a loader indexes its dataset).
async fn listed_shards_with_predictors() -> (Fixture, strata_fs::filesystem::Entry) {
    let opts = CoreOptions {
        predictors: Some(Arc::new(strata_fs::Predictors::standard())),
        ..Default::default()
    };
    let fx = fixture(opts).await;
    for i in 0..12 {
        fx.store
            .put(&format!("shards/shard-{i:05}.tar"), data(3000, i as u8))
            .await
            .expect("seed shard");
    }
    let dir = fx.core.lookup(ROOT_INO, "shards").await.expect("shards");
    let fh = fx.core.opendir(dir.attr.ino).await.expect("list");
    fx.core.releasedir(fh);
    (fx, dir)
}

#[tokio::test]
async fn the_semantic_predictor_prefetches_the_next_shards() {
    timed(async {
        let (fx, dir) = listed_shards_with_predictors().await;
        let c = &fx.core;
        for i in 0..5 {
            let e = c
                .lookup(dir.attr.ino, &format!("shard-{i:05}.tar"))
                .await
                .expect("shard");
            let o = c.open(e.attr.ino, false).await.expect("open");
            let got = c.read(o.fh, 0, 3000, 99).await.expect("read");
            assert_eq!(got, data(3000, i as u8));
            c.release(o.fh);
        }
        let reader = c.reader().clone();
        let deadline = Instant::now() + Duration::from_secs(5);
        let next = fx.store.head("shards/shard-00005.tar").await.expect("head");
        while !fx.engine.contains(&reader.key(&next, 0)) {
            assert!(
                Instant::now() < deadline,
                "shard 5 prefetched before it is read: {:?}",
                fx.engine.stats()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(reader.engine().stats().prefetch_fills >= 1);
    })
    .await
    .expect("bounded");
}

/// The FUSE request's pid is a thread id; every thread of this process resolves to one
/// job (its process group by default, the process with `JobScope::Process`), and a
/// caller the daemon cannot see (pid 0) is keyed by its file handle.
#[tokio::test]
async fn reader_threads_of_one_process_are_one_job() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        let by_process = fixture(CoreOptions {
            job_scope: strata_fs::JobScope::Process,
            ..Default::default()
        })
        .await;
        let jobs: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let tid = strata_fs::job::current_tid();
                        (tid, fx.core.job_of(tid, 1), by_process.core.job_of(tid, 1))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        // SAFETY: getpgrp has no preconditions and cannot fail.
        let pgrp = unsafe { libc::getpgrp() } as u64;
        for (tid, group, process) in &jobs {
            assert_eq!(group.0, pgrp, "thread {tid}");
            assert_eq!(process.0, std::process::id() as u64, "thread {tid}");
        }
        assert_eq!(fx.core.job_of(0, 5).0, (1 << 63) | 5);
        assert_ne!(fx.core.job_of(0, 5), fx.core.job_of(0, 6));
    })
    .await
    .expect("bounded");
}

/// Cross-file prefetches are reported back: a prefetched shard read by demand counts as
/// used; prefetched shards that leave the cache unread count as wasted at a later open.
#[tokio::test]
async fn prefetch_outcomes_are_counted_used_and_wasted() {
    use std::sync::atomic::Ordering::Relaxed;
    timed(async {
        let (fx, dir) = listed_shards_with_predictors().await;
        // A store request slower than the reader's pace: the predictor keeps several
        // shards ahead (its window follows latency / pace; against an instant store one
        // shard ahead is all a reader needs, and nothing past shard 5 would be fetched).
        fx.faulty.set_config(FaultConfig {
            latency: Duration::from_millis(50),
            ..Default::default()
        });
        let c = &fx.core;
        let read = |name: String, parent: u64| async move {
            let e = c.lookup(parent, &name).await.expect("lookup");
            let o = c.open(e.attr.ino, false).await.expect("open");
            c.read(o.fh, 0, 4096, 99).await.expect("read");
            c.release(o.fh);
        };
        // Waits until every issued cross-file prefetch has filled its (one) block.
        let settle = || async {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let issued = c.counters().prefetch_files.load(Relaxed);
                if issued > 0 && fx.engine.stats().prefetch_fills >= issued {
                    return issued;
                }
                assert!(
                    Instant::now() < deadline,
                    "prefetches never filled: {issued} {:?} {:?}",
                    fx.engine.stats(),
                    c.counters()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        for i in 0..5 {
            read(format!("shard-{i:05}.tar"), dir.attr.ino).await;
        }
        settle().await;
        read("shard-00005.tar".into(), dir.attr.ino).await;
        assert!(c.counters().prefetch_files_used.load(Relaxed) >= 1);
        assert_eq!(c.counters().prefetch_files_wasted.load(Relaxed), 0);
        let issued = settle().await;
        // Evict every shard not yet read, then open something else: the sweep finds them.
        let mut evicted = 0;
        for i in 6..12 {
            let obj = fx
                .store
                .head(&format!("shards/shard-{i:05}.tar"))
                .await
                .expect("head");
            if fx
                .engine
                .remove(&c.reader().key(&obj, 0))
                .await
                .expect("remove")
            {
                evicted += 1;
            }
        }
        assert!(
            evicted >= 1,
            "some shard past 5 was prefetched ({issued} issued)"
        );
        read("top.txt".into(), ROOT_INO).await;
        assert_eq!(
            c.counters().prefetch_files_wasted.load(Relaxed),
            evicted,
            "each evicted unread prefetch reported once"
        );
    })
    .await
    .expect("bounded");
}

/// FORGET is honoured: an inode lives while the kernel references it (one reference per
/// LOOKUP reply) and goes when the kernel forgets the last one; the path keeps its
/// attributes in the metadata cache, so looking it up again costs no store request.
#[tokio::test]
async fn forgotten_inodes_leave_the_table_and_cost_nothing_to_find_again() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        let base = c.inode_count();
        let small = c.lookup(dir.attr.ino, "small").await.expect("small");
        assert_eq!(c.inode_count(), base + 1);
        c.lookup(dir.attr.ino, "small").await.expect("again");
        c.lookup(dir.attr.ino, "small").await.expect("again");
        // Three references: two forgotten, the inode stays.
        c.forget(small.attr.ino, 2);
        c.getattr(small.attr.ino).await.expect("still referenced");
        c.forget(small.attr.ino, 1);
        assert_eq!(c.inode_count(), base);
        let err = c.getattr(small.attr.ino).await.expect_err("forgotten");
        assert_eq!(err.errno(), libc::EBADF, "{err}");
        // The root is never forgotten; unknown inodes are ignored.
        c.forget(ROOT_INO, 100);
        c.forget(987_654, 1);
        c.getattr(ROOT_INO).await.expect("root");
        let reads = fx.faulty.reads();
        let again = c.lookup(dir.attr.ino, "small").await.expect("found again");
        // Its old number (black-box finding: git saw every file of a tree whose inodes
        // the kernel had forgotten as changed, by inode number, and re-hashed it).
        assert_eq!(again.attr.ino, small.attr.ino, "the same number");
        assert_eq!(again.attr.size, 1000);
        assert_eq!(fx.faulty.reads(), reads, "attributes still cached by path");
    })
    .await
    .expect("bounded");
}

/// Inodes named only by a plain READDIR (never referenced by the kernel) are swept
/// once the table passes `max_inodes`; referenced ones, open files and the entries of
/// open directories (a READDIRPLUS reply may still hand them out) are kept.
#[tokio::test]
async fn unreferenced_inodes_are_swept_past_the_bound() {
    timed(async {
        let fx = fixture(CoreOptions {
            max_inodes: 3,
            ..CoreOptions::default()
        })
        .await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "dir").await.expect("dir");
        // A plain listing names dir's entries without referencing them; while the
        // directory is open they stay.
        let fh = c.opendir(dir.attr.ino).await.expect("opendir");
        let listed = c.readdir(fh, 0, 100).await.expect("readdir");
        let ino_of = |name: &str| {
            listed
                .iter()
                .find(|e| e.name == name)
                .map(|e| e.entry.attr.ino)
                .expect("listed")
        };
        let (big, small, sub) = (ino_of("big.bin"), ino_of("small"), ino_of("sub"));
        c.getattr(small).await.expect("entry of an open directory");
        c.releasedir(fh);
        let opened = c.open(big, false).await.expect("open");
        // Listing the root passes the bound: small and sub (unreferenced, their
        // directory closed) go; big.bin (open), dir (referenced) and the root's entries
        // (just handed out, its handle open) stay.
        let root_fh = c.opendir(ROOT_INO).await.expect("opendir root");
        c.readdir(root_fh, 0, 100).await.expect("readdir root");
        assert!(c.getattr(small).await.is_err());
        assert!(c.getattr(sub).await.is_err());
        c.getattr(big).await.expect("open file kept");
        c.getattr(dir.attr.ino).await.expect("referenced dir kept");
        // root, dir, big.bin, top.txt, empty, pre.
        assert_eq!(c.inode_count(), 6);
        c.releasedir(root_fh);
        let got = c.read(opened.fh, 0, 10, 0).await.expect("read");
        assert_eq!(got.len(), 10);
        // Looked up again by name: found, under its old number.
        let again = c.lookup(dir.attr.ino, "small").await.expect("lookup");
        assert_eq!(again.attr.ino, small);
    })
    .await
    .expect("bounded");
}

/// A folder open for reading holds its listing, not an inode per name: its entries are
/// numbered as they are read, and those read before are swept past the bound (a folder
/// of 300,000 names held ~1.1 KB per name while `ls -f` read it, and a 256 MiB daemon
/// was OOM-killed).
#[tokio::test]
async fn an_open_folder_numbers_its_entries_as_they_are_read() {
    timed(async {
        let fx = fixture(CoreOptions {
            max_inodes: 16,
            ..CoreOptions::default()
        })
        .await;
        for i in 0..500 {
            fx.store
                .put(&format!("many/f{i:04}"), data(3, i as u8))
                .await
                .expect("seed");
        }
        let c = &fx.core;
        let many = c.lookup(ROOT_INO, "many").await.expect("many");
        let fh = c.opendir(many.attr.ino).await.expect("opendir");
        assert!(
            c.inode_count() <= 16,
            "{} inodes after opendir",
            c.inode_count()
        );
        let (mut names, mut offset, mut most) = (Vec::new(), 0, 0);
        loop {
            let page = c.readdir(fh, offset, 50).await.expect("readdir");
            let Some(last) = page.last() else { break };
            offset = last.offset;
            most = most.max(c.inode_count());
            names.extend(page.into_iter().map(|e| e.name));
        }
        assert_eq!(names.len(), 502);
        assert_eq!(names[2], "f0000");
        assert_eq!(names[501], "f0499");
        assert!(most <= 16 + 50 + 16, "{most} inodes while reading");
        // The last page's numbers stay while the folder is open; a lookup agrees.
        let last = c.readdir(fh, 501, 1).await.expect("last");
        let looked = c.lookup(many.attr.ino, "f0499").await.expect("lookup");
        assert_eq!(looked.attr.ino, last[0].entry.attr.ino);
        c.releasedir(fh);
    })
    .await
    .expect("bounded");
}

/// Reads all of `ino` through a fresh handle.
async fn read_all(c: &Arc<FsCore>, ino: u64, size: u64) -> strata_fs::Result<Vec<u8>> {
    let o = c.open(ino, false).await?;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let got = c.read(o.fh, out.len() as u64, 128 << 10, 0).await?;
        if got.is_empty() {
            break;
        }
        out.extend_from_slice(&got);
    }
    c.release(o.fh);
    Ok(out)
}

/// A mount with an indefinite metadata TTL logs its listings, so a restart while the
/// store does not answer still finds and reads what the cache holds (it failed every
/// lookup: black-box finding); without the log the same restart finds nothing.
#[tokio::test]
async fn a_restart_with_the_store_down_reads_what_the_cache_holds() {
    timed(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("metadata/m.jsonl");
        let opts = || CoreOptions {
            metadata_ttl: strata_fs::filesystem::METADATA_TTL_INDEFINITE,
            listing_log: Some(log.clone()),
            ..Default::default()
        };
        let fx = fixture(opts()).await;
        let want = data((5 * BS + 123) as usize, 2);
        {
            let c = &fx.core;
            let d = c.lookup(ROOT_INO, "dir").await.expect("dir");
            let big = c.lookup(d.attr.ino, "big.bin").await.expect("big");
            assert_eq!(
                read_all(c, big.attr.ino, big.attr.size)
                    .await
                    .expect("read"),
                want
            );
            // Opened by name, its directory never listed (a HEAD).
            let top = c.lookup(ROOT_INO, "top.txt").await.expect("top");
            assert_eq!(
                read_all(c, top.attr.ino, 10).await.expect("read"),
                data(10, 1)
            );
            // Looked up and found absent (its probe is logged as an empty listing).
            let ghost = c.lookup(ROOT_INO, "ghost").await;
            assert!(matches!(ghost, Err(e) if e.errno() == libc::ENOENT));
        }
        // The log is appended off the caller's task.
        tokio::time::sleep(Duration::from_millis(300)).await;
        fx.faulty.set_config(FaultConfig {
            down: true,
            ..Default::default()
        });
        // "Restarted": a new core on the same cache, its store down.
        let restarted = |listing_log| {
            let reader =
                ObjectReader::new(fx.engine.clone(), fx.store.clone(), BS).expect("reader");
            Arc::new(FsCore::new(
                reader,
                "",
                CoreOptions {
                    listing_log,
                    ..opts()
                },
            ))
        };
        let without = restarted(None);
        assert!(
            without.lookup(ROOT_INO, "dir").await.is_err(),
            "nothing to go on"
        );
        let c = restarted(Some(log.clone()));
        let d = c.lookup(ROOT_INO, "dir").await.expect("dir, as logged");
        let big = c
            .lookup(d.attr.ino, "big.bin")
            .await
            .expect("big.bin, as logged");
        assert_eq!(big.attr.size, 5 * BS + 123);
        assert_eq!(
            read_all(&c, big.attr.ino, big.attr.size)
                .await
                .expect("read from the cache"),
            want
        );
        assert!(
            c.lookup(d.attr.ino, "nope").await.is_err(),
            "not in the listing"
        );
        // Absent as logged, not an empty folder (black-box finding: unlinked files and
        // names the predictor probed came back as folders at an offline start).
        let ghost = c.lookup(ROOT_INO, "ghost").await;
        assert!(
            matches!(&ghost, Err(e) if e.errno() == libc::ENOENT),
            "{:?}",
            ghost.map(|e| e.attr.kind)
        );
        let top = c
            .lookup(ROOT_INO, "top.txt")
            .await
            .expect("top.txt, as logged");
        assert_eq!(
            read_all(&c, top.attr.ino, 10).await.expect("read"),
            data(10, 1)
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding: with `--disk-cache 64MiB` (16 MiB of copies), a 24 MiB file under
/// the 64 MiB `passthrough-max` was expected to get a copy it could never get, so its
/// blocks skipped the disk tier and every re-read went to the store. A copy takes at
/// most half the copies' budget; larger files stay in the disk tier's blocks.
#[test]
fn a_file_too_large_for_the_copies_budget_is_not_expected_to_get_a_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pt = PassthroughOptions::open(dir.path().join("copies"), 16 << 20).expect("open");
    assert!(
        pt.name_for("f", "v", 24 << 20).is_none(),
        "larger than the budget"
    );
    assert!(pt.name_for("f", "v", 9 << 20).is_none(), "over half of it");
    assert!(pt.name_for("f", "v", 8 << 20).is_some());
    assert!(pt.name_for("f", "v", 0).is_none());
}

/// Black-box finding (round 18): with `s3:GetObject` granted on `bkt/data/*` only, S3
/// refuses `HEAD data` (403) while listings show the folder; a path lookup of `data`
/// failed EACCES (every open by path, once the root's listing expired). The prefix
/// holds keys: the folder.
#[tokio::test]
async fn a_folder_whose_own_name_is_refused_is_still_the_folder() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        fx.store
            .put("data/f1", data(9, 7))
            .await
            .expect("seed under it");
        fx.faulty.set_config(FaultConfig {
            denied_key: Some("data".into()),
            ..Default::default()
        });
        let c = &fx.core;
        let d = c.lookup(ROOT_INO, "data").await.expect("lookup");
        assert_eq!(d.attr.kind, Kind::Dir);
        let f = c.lookup(d.attr.ino, "f1").await.expect("reachable by path");
        assert_eq!(f.attr.size, 9);
        // A refused name that is no folder stays refused.
        fx.faulty.set_config(FaultConfig {
            denied_key: Some("top.txt".into()),
            ..Default::default()
        });
        let e = c.lookup(ROOT_INO, "top.txt").await.expect_err("refused");
        assert_eq!(e.errno(), libc::EACCES);
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 11): on an object store, a key that is also a prefix of
/// other keys (`both` beside `both/x`) showed as the folder in a listing but as the
/// file on a path lookup, so `both/x`, opened by path without a listing first (a loader
/// reading a manifest), failed ENOTDIR. The lookup asks the prefix too: the folder wins.
#[tokio::test]
async fn a_key_that_is_also_a_prefix_is_the_folder_on_a_path_lookup_too() {
    timed(async {
        let fx = fixture(CoreOptions::default()).await;
        fx.store
            .put("both", data(7, 6))
            .await
            .expect("seed the object");
        fx.store
            .put("both/x", data(9, 7))
            .await
            .expect("seed under it");
        let c = &fx.core;
        let both = c.lookup(ROOT_INO, "both").await.expect("lookup");
        assert_eq!(both.attr.kind, Kind::Dir, "the folder, not the object");
        let x = c
            .lookup(both.attr.ino, "x")
            .await
            .expect("reachable by path");
        assert_eq!(x.attr.size, 9);
        // A plain object stays a file.
        let top = c.lookup(ROOT_INO, "top.txt").await.expect("lookup");
        assert_eq!(top.attr.kind, Kind::File);
        // A name that is neither costs the HEAD and the prefix's one page, no more.
        let counted = |c: &FsCore| (c.store_heads(), c.store_lists());
        let before = counted(c);
        let e = c.lookup(ROOT_INO, "absent").await.expect_err("absent");
        assert_eq!(e.errno(), libc::ENOENT);
        let after = counted(c);
        assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
    })
    .await
    .expect("bounded");
}

/// Lists and looks up 3,000 names in three folders, then reads every listing again.
async fn list_and_look_up_everything(fx: &Fixture) {
    let c = &fx.core;
    for d in 0..3 {
        let dir = c.lookup(ROOT_INO, &format!("many{d}")).await.expect("dir");
        let fh = c.opendir(dir.attr.ino).await.expect("opendir");
        let mut names = Vec::new();
        let mut offset = 0;
        loop {
            let got = c.readdir(fh, offset, 256).await.expect("readdir");
            let Some(last) = got.last() else { break };
            offset = last.offset;
            names.extend(got.into_iter().map(|e| e.name));
        }
        c.releasedir(fh);
        let files: Vec<_> = names.iter().filter(|n| n.starts_with("item-")).collect();
        assert_eq!(files.len(), 1000, "every name listed in many{d}");
        for n in files {
            let e = c.lookup(dir.attr.ino, n).await.expect("lookup");
            assert_eq!(e.attr.size, 3, "{n}");
        }
    }
}

#[tokio::test]
async fn cached_metadata_stays_within_its_bytes_and_every_name_is_still_served() {
    timed(async {
        let seed = |fx: Fixture| async move {
            for d in 0..3 {
                for i in 0..1000 {
                    let p = format!("many{d}/item-{i:06}-with-a-name-of-some-length.jpeg");
                    fx.store
                        .put(&p, Bytes::from_static(b"abc"))
                        .await
                        .expect("seed");
                }
            }
            fx
        };
        // As before the budget: the whole namespace is cached (~1.7 MB of it).
        let roomy = seed(fixture(CoreOptions::default()).await).await;
        list_and_look_up_everything(&roomy).await;
        let whole = roomy.core.metadata_cached().await;
        assert!(whole.bytes > 1 << 20, "{whole:?}");
        assert!(whole.attributes >= 3000 && whole.listings >= 3, "{whole:?}");

        // A budget of a fifth of that: held within it, and every name still answers
        // (looked up in the store once its listing is not kept).
        let budget = 320 << 10;
        let tight = seed(
            fixture(CoreOptions {
                metadata_bytes: budget,
                ..CoreOptions::default()
            })
            .await,
        )
        .await;
        list_and_look_up_everything(&tight).await;
        let held = tight.core.metadata_cached().await;
        assert!(held.bytes <= budget, "{held:?} within {budget}");
        assert!(held.attributes < 3000, "{held:?}");
        list_and_look_up_everything(&tight).await;
    })
    .await
    .expect("bounded");
}

/// A core over a `file://` store of `root`.
fn local_core(root: &std::path::Path, opts: CoreOptions) -> FsCore {
    let url = format!("file://{}", root.display());
    let store =
        BackingStore::from_url(&url, &strata_cache_core::StoreOptions::default()).expect("store");
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(16 << 20)))
        .build()
        .expect("engine");
    FsCore::new(
        ObjectReader::new(engine, store, BS).expect("reader"),
        "",
        opts,
    )
}

/// Black-box finding (round 22): in a `file://` store, files and folders of 252-255-byte
/// names (legal on ext4) were listed, then ENOENT to every lookup made without a fresh
/// listing: the store's rule for names it can write (room for `NAME#N`) was applied to
/// lookups. A lookup finds them; one of a longer name is ENOENT at once.
#[tokio::test]
async fn a_local_store_file_of_a_255_byte_name_is_found_by_its_path() {
    timed(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let long = "a".repeat(255);
        let folder = "D".repeat(255);
        std::fs::write(dir.path().join(&long), b"long name").expect("write");
        std::fs::create_dir(dir.path().join(&folder)).expect("mkdir");
        std::fs::write(dir.path().join(&folder).join("f"), b"inside").expect("write");
        let c = local_core(dir.path(), CoreOptions::default());
        // No listing first: a path lookup, as an `open` past the metadata TTL makes.
        let f = c.lookup(ROOT_INO, &long).await.expect("the long name");
        assert_eq!(f.attr.size, 9);
        let d = c.lookup(ROOT_INO, &folder).await.expect("the long folder");
        assert_eq!(d.attr.kind, Kind::Dir);
        let inside = c.lookup(d.attr.ino, "f").await.expect("beneath it");
        assert_eq!(inside.attr.size, 6);
        // Past the file system's 255 bytes: no such file, at once (round 22b: a HEAD
        // failing ENAMETOOLONG was retried as a store error, EIO after ~3.7 s).
        let t = Instant::now();
        let e = c
            .lookup(ROOT_INO, &"a".repeat(256))
            .await
            .expect_err("no such name");
        assert_eq!(e.errno(), libc::ENOENT, "{e}");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 22b): an existing 254-255-byte name of a `file://` store
/// opened for O_TRUNC or append took the writes, then failed the close with EIO after
/// ~3.6 s (the store cannot write such a name: no room for `NAME#N`). The open is
/// refused with EINVAL, as a create of the name is.
#[tokio::test]
async fn a_local_store_name_too_long_to_write_is_refused_at_the_open() {
    timed(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let staging = tempfile::tempdir().expect("staging");
        let long = "b".repeat(255);
        std::fs::write(dir.path().join(&long), b"kept as it is").expect("write");
        let mut w = strata_fs::WriteOptions::new(staging.path().join("staging"));
        w.allow_overwrite = true;
        let c = local_core(
            dir.path(),
            CoreOptions {
                writes: Some(w),
                ..Default::default()
            },
        );
        let f = c.lookup(ROOT_INO, &long).await.expect("the long name");
        for truncate in [true, false] {
            let e = c
                .open_write(f.attr.ino, truncate, 0)
                .await
                .expect_err("refused at the open");
            assert_eq!(e.errno(), libc::EINVAL, "{e}");
        }
        assert_eq!(
            std::fs::read(dir.path().join(&long)).expect("read"),
            b"kept as it is"
        );
    })
    .await
    .expect("bounded");
}
