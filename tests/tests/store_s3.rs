//! The object-store backing against a real S3-compatible server (moto), through the
//! engine: put, head, ranged reads, listings, version checks, and read-through caching.

use std::sync::Arc;

use bytes::Bytes;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{AccessContext, BackingStore, CacheEngine, CacheError, ObjectReader};
use strata_tests::s3::MotoServer;

fn s3_store(server: &MotoServer, url: &str) -> BackingStore {
    BackingStore::from_url(url, &server.store_options()).expect("open s3 store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_read_through_the_cache() {
    let server = MotoServer::start();
    server.create_bucket("data");
    let store = s3_store(&server, "s3://data/prefix");
    let big: Bytes = (0..(3 << 20) + 123)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    store
        .put("dir/big.bin", big.clone())
        .await
        .expect("put big");
    store
        .put("dir/small.txt", Bytes::from_static(b"hello"))
        .await
        .expect("put small");
    store.put("empty", Bytes::new()).await.expect("put empty");

    let listing = store.list_dir("").await.expect("list root");
    assert_eq!(listing.dirs, vec!["dir".to_string()]);
    assert_eq!(listing.files.len(), 1);
    let listing = store.list_dir("dir").await.expect("list dir");
    let mut names: Vec<_> = listing.files.iter().map(|f| f.path.to_string()).collect();
    names.sort();
    assert_eq!(names, vec!["dir/big.bin", "dir/small.txt"]);

    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(64 << 20)))
        .build()
        .expect("engine");
    let reader = ObjectReader::new(engine.clone(), store.clone(), 1 << 20).expect("reader");
    let obj = store.head("dir/big.bin").await.expect("head");
    assert_eq!(obj.size, big.len() as u64);
    let ctx = AccessContext::default();
    // Odd offsets spanning blocks, twice: the second read is served from the cache.
    for (off, len) in [
        (0u64, 10u64),
        (1_048_570, 20),
        (100, 3 << 20),
        (big.len() as u64 - 5, 100),
    ] {
        let got = reader.read(&obj, off, len, &ctx).await.expect("read");
        let end = (off + len).min(big.len() as u64) as usize;
        assert_eq!(got, big.slice(off as usize..end), "range {off}+{len}");
    }
    let fills = engine.stats().fills;
    assert_eq!(fills, 4, "each of the 4 blocks fetched once");
    let again = reader
        .read(&obj, 0, big.len() as u64, &ctx)
        .await
        .expect("reread");
    assert_eq!(again, big);
    assert_eq!(engine.stats().fills, fills, "second read all from cache");

    let empty = store.head("empty").await.expect("head empty");
    assert_eq!(
        reader.read(&empty, 0, 100, &ctx).await.expect("read empty"),
        Bytes::new()
    );

    // The object changes: a read naming the old version fails instead of mixing them.
    store
        .put("dir/small.txt", Bytes::from_static(b"HELLO, changed"))
        .await
        .expect("overwrite");
    let old = ObjectReaderProbe::stale(&listing, "dir/small.txt");
    match reader.read(&old, 0, 5, &ctx).await {
        Err(CacheError::Changed(_)) => {}
        other => panic!("expected Changed, got {other:?}"),
    }
    assert!(matches!(
        store.head("nope").await,
        Err(CacheError::NotFound(_))
    ));
}

struct ObjectReaderProbe;
impl ObjectReaderProbe {
    fn stale(listing: &strata_cache_core::DirListing, path: &str) -> strata_cache_core::ObjectInfo {
        listing
            .files
            .iter()
            .find(|f| f.path.as_ref() == path)
            .expect("listed")
            .clone()
    }
}

/// S3 "folders" as the console makes them (an empty object `dir/`): the directory
/// itself, never a file inside it, and a directory even when nothing else is in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_markers_are_directories_not_files() {
    let server = MotoServer::start();
    server.create_bucket("data");
    server.put_raw("data", "p/folder/", "");
    server.put_raw("data", "p/folder/real.txt", "real");
    server.put_raw("data", "p/emptyfolder/", "");
    let store = s3_store(&server, "s3://data/p");
    let root = store.list_dir("").await.expect("list root");
    let mut dirs = root.dirs.clone();
    dirs.sort();
    assert_eq!(dirs, vec!["emptyfolder".to_string(), "folder".to_string()]);
    assert!(root.files.is_empty(), "{:?}", root.files);
    let folder = store.list_dir("folder").await.expect("list folder");
    let files: Vec<&str> = folder.files.iter().map(|f| f.path.as_ref()).collect();
    assert_eq!(files, vec!["folder/real.txt"]);
    let empty = store.list_dir("emptyfolder").await.expect("list empty");
    assert!(
        empty.files.is_empty() && empty.dirs.is_empty(),
        "{:?}",
        empty.files
    );
    assert!(empty.exists, "the marker keeps the folder");
    assert!(!store.list_dir("nothing").await.expect("list").exists);
}

/// Black-box finding (round 21): a folder rename over S3 folder markers copied the
/// marker as a file named as its folder and failed ENOENT. A recursive listing's
/// markers are told apart (listed empty, or as a folder of other keys, and not found by
/// their name) so the rename refuses them as `rmdir` does; an empty real object is no
/// marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_markers_in_a_recursive_listing_are_told_apart() {
    let server = MotoServer::start();
    server.create_bucket("data");
    for key in [
        "top/", "top/f1", "sub/f1", "sub/s/", "sub/s/f2", "e/f1", "e/es/",
    ] {
        server.put_raw("data", key, if key.ends_with('/') { "" } else { "x" });
    }
    server.put_raw("data", "z/_SUCCESS", "");
    server.put_raw("data", "z/part-0", "x");
    // Markers holding bytes (round 22: such a folder's rename was ENOENT).
    for key in ["full/", "full/f", "nest/f", "nest/sub/", "nest/sub/g"] {
        server.put_raw(
            "data",
            key,
            if key.ends_with('/') {
                "marker bytes"
            } else {
                "x"
            },
        );
    }
    let store = s3_store(&server, "s3://data");
    for (folder, want) in [
        ("top/", vec!["top"]),
        ("sub/", vec!["sub/s"]),
        ("e/", vec!["e/es"]),
        ("z/", vec![]),
        ("full/", vec!["full"]),
        ("nest/", vec!["nest/sub"]),
    ] {
        let all = store.list_all(folder).await.expect("listed");
        let got = store.folder_markers(folder, &all).await.expect("asked");
        let got: Vec<&str> = got.iter().map(|m| &**m).collect();
        assert_eq!(got, want, "{folder}");
    }
}

/// A lookup's listing (`list_dir_if_one_page`): a folder one page holds comes whole (a
/// marker, an empty folder and a missing one as `list_dir` tells them); a folder of
/// more than a page is answered without listing the rest (black-box finding: each
/// lookup of a folder of 20,000 keys listed all of it, 22 requests, every TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookups_listing_takes_one_page() {
    let server = MotoServer::start();
    server.create_bucket("data");
    server.put_raw("data", "p/small/a", "a");
    server.put_raw("data", "p/small/b", "b");
    server.put_raw("data", "p/small/sub/c", "c");
    server.put_raw("data", "p/marker/", "");
    for i in 0..1001 {
        server.put_raw("data", &format!("p/big/k{i:04}"), "x");
    }
    let store = s3_store(&server, "s3://data/p");
    let small = store
        .list_dir_if_one_page("small")
        .await
        .expect("list small")
        .expect("one page holds it");
    let files: Vec<&str> = small.files.iter().map(|f| f.path.as_ref()).collect();
    assert_eq!(files, vec!["small/a", "small/b"]);
    assert_eq!(small.dirs, vec!["sub".to_string()]);
    assert!(small.exists);
    let marker = store
        .list_dir_if_one_page("marker")
        .await
        .expect("list marker")
        .expect("one page");
    assert!(marker.exists && marker.files.is_empty(), "{marker:?}");
    let missing = store
        .list_dir_if_one_page("nothing")
        .await
        .expect("list nothing")
        .expect("one page");
    assert!(!missing.exists && missing.files.is_empty());
    assert!(
        store
            .list_dir_if_one_page("big")
            .await
            .expect("list big")
            .is_none(),
        "a folder of 1,001 keys is more than a page"
    );
    // Listing it for its entries still takes every page.
    assert_eq!(
        store.list_dir("big").await.expect("list big").files.len(),
        1001
    );
}

/// A mount's first listing: a missing bucket and refused credentials are refusals the
/// mount fails on (with the store's words), an empty folder of a real bucket is not;
/// and the daemon fails its start on the refusal rather than mounting a folder whose
/// every `ls` fails with EIO (black-box finding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_of_a_missing_bucket_fails_with_the_stores_answer() {
    use std::time::{Duration, Instant};
    use strata_cache_core::store::Probe;
    let server = MotoServer::start();
    server.create_bucket("data");
    let deadline = Duration::from_secs(10);
    let fine = s3_store(&server, "s3://data/prefix");
    assert_eq!(fine.probe("not/yet", deadline).await, Probe::Answered);
    let missing = s3_store(&server, "s3://no-such-bucket");
    let started = Instant::now();
    match missing.probe("", deadline).await {
        Probe::Refused(why) => assert!(why.contains("NoSuchBucket"), "{why}"),
        other => panic!("a missing bucket: {other:?}"),
    }
    // Not retried for seconds as a transient error would be.
    let listed = missing.list_dir("").await;
    assert!(listed.is_err(), "{listed:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("mnt");
    let mut cfg = strata_tools::config::StrataConfig::default();
    let opts = server.store_options();
    cfg.store.url = Some("s3://no-such-bucket/some/prefix".into());
    cfg.store.endpoint = opts.endpoint;
    cfg.store.region = opts.region;
    cfg.store.access_key_id = opts.access_key_id;
    cfg.store.secret_access_key = opts.secret_access_key;
    cfg.store.allow_http = true;
    cfg.cache.dir = Some(dir.path().join("cache"));
    cfg.kv.enabled = false;
    cfg.mounts = vec![strata_tools::config::MountConfig {
        mountpoint: mnt.clone(),
        ..Default::default()
    }];
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::time::timeout(
        Duration::from_secs(30),
        strata_tools::daemon::run(cfg, stop.clone()),
    )
    .await;
    stop.cancel();
    let err = match run {
        Ok(Err(e)) => format!("{e:#}"),
        other => panic!("the daemon did not refuse the mount: {other:?}"),
    };
    assert!(err.contains("refused to list"), "{err}");
    assert!(err.contains("NoSuchBucket"), "{err}");
    assert!(!mnt.join("x").exists());
}

/// Keys object_store cannot name (a control character, a `.` or empty segment: legal in
/// S3, written by other tools) fail the whole S3 listing page they are on, and the
/// listing stops there. They are skipped, and only they: their neighbours in the same
/// page and in the pages after it are all listed, in a directory level and in a
/// recursive listing (black-box finding: one such key emptied its directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_cannot_be_named_hide_only_themselves() {
    let server = Arc::new(MotoServer::start());
    server.create_bucket("data");
    // 1,050 good keys: more than one 1,000-key page.
    let good: Vec<String> = (0..1050).map(|i| format!("d/k{i:04}")).collect();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let server = server.clone();
            let keys: Vec<String> = good.iter().skip(w).step_by(4).cloned().collect();
            std::thread::spawn(move || {
                for k in keys {
                    server.put_raw("data", &format!("p/{k}"), "x");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    // Raw keys, percent-encoded on the wire: `d/k0500<U+0001>`, `d/./hidden`, `d//dbl`,
    // and `d/Icon<CR>` (macOS's folder icon), which the listing's XML turns into
    // `d/Icon<LF>` (black-box finding: that one made the whole folder EIO).
    for bad in ["p/d/k0500%01", "p/d/./hidden", "p/d//dbl", "p/d/Icon%0D"] {
        server.put_raw("data", bad, "x");
    }
    let store = s3_store(&server, "s3://data/p");
    let level = store.list_dir("d").await.expect("list d");
    let mut files: Vec<String> = level.files.iter().map(|f| f.path.to_string()).collect();
    files.sort();
    assert_eq!(files.len(), good.len(), "every neighbour listed");
    assert_eq!(files, good);
    assert!(
        level.dirs.is_empty(),
        "unnamed prefixes left out: {:?}",
        level.dirs
    );
    let mut all: Vec<String> = store
        .list_all("d")
        .await
        .expect("list all")
        .iter()
        .map(|f| f.path.to_string())
        .collect();
    all.sort();
    assert_eq!(all, good, "the recursive listing too");
    assert!(store.dir_exists("d").await.expect("dir exists"));
    // A named neighbour reads.
    let info = store.head("d/k0501").await.expect("head");
    assert_eq!(info.size, 1);
}

/// Black-box finding (round 13): a folder holding a folder marker (`a/`, as the S3
/// console makes) and a key that cannot be named (`a/./b`) was listed for ever: the
/// marker is named `a`, and the page after it started after `a`, which lists `a/`
/// again (113,632 LISTs in 10 minutes, `ls` stuck in D state). Bounded in time here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_marker_beside_a_key_that_cannot_be_named_is_listed_once() {
    let server = MotoServer::start();
    server.create_bucket("data");
    for key in ["a/", "a/./b", "a/b", "a//c", "a/d"] {
        server.put_raw("data", key, "x");
    }
    let store = s3_store(&server, "s3://data");
    let level = tokio::time::timeout(std::time::Duration::from_secs(20), store.list_dir("a"))
        .await
        .expect("listed within 20 s")
        .expect("list a");
    let files: Vec<String> = level.files.iter().map(|f| f.path.to_string()).collect();
    assert_eq!(files, vec!["a/b", "a/d"]);
    assert!(level.dirs.is_empty(), "{:?}", level.dirs);
}

/// Black-box finding (security): one object whose first segment under the mounted
/// folder is `.` or `..` (`./x`, `data/../x`), which anyone allowed to write the bucket
/// can make, failed every `strata mount` of it: the mount's first listing took the
/// client library's refusal to name the key for the store's. The store answered; the
/// listing steps around the key, and the good objects read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dot_key_at_the_mounted_folder_does_not_fail_the_mount() {
    use std::time::Duration;
    use strata_cache_core::store::Probe;
    let server = MotoServer::start();
    server.create_bucket("data");
    server.put_raw("data", "train/shard0.bin", "good");
    server.put_raw("data", "./x", "planted");
    server.put_raw("data", "sub/train/shard0.bin", "good");
    server.put_raw("data", "sub/../y", "planted");
    for (url, dirs) in [
        ("s3://data", vec!["sub", "train"]),
        ("s3://data/sub", vec!["train"]),
    ] {
        let store = s3_store(&server, url);
        assert_eq!(
            store.probe("", Duration::from_secs(10)).await,
            Probe::Answered,
            "{url}"
        );
        let root = store.list_dir("").await.expect("root listed");
        assert_eq!(root.dirs, dirs, "{url}");
        let info = store.head("train/shard0.bin").await.expect("head");
        assert_eq!(info.size, 4, "{url}");
    }
}

/// Black-box finding: a cache dir's listing log of `s3://b` at one S3 service was
/// shown, with the blocks it names, as `s3://b` at another service that did not
/// answer. The endpoint is part of the store's identity: a mount of the same bucket at
/// another service does not use the log; one at the same service does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_log_of_one_endpoint_is_not_shown_for_another() {
    use strata_fs::filesystem::ROOT_INO;
    use strata_fs::{CoreOptions, FsCore};

    let server = MotoServer::start();
    server.create_bucket("shared");
    let quick = strata_cache_core::RetryPolicy {
        attempts: 1,
        ..Default::default()
    };
    let at = |endpoint: String| {
        let opts = strata_cache_core::StoreOptions {
            endpoint: Some(endpoint),
            retry: quick.clone(),
            ..server.store_options()
        };
        BackingStore::from_url("s3://shared", &opts).expect("open s3 store")
    };
    let here = at(server.endpoint());
    here.put("f.txt", Bytes::from_static(b"one service's bytes"))
        .await
        .expect("put");
    // Another service, of which nothing answers (a port just freed).
    let elsewhere = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://127.0.0.1:{}", l.local_addr().expect("addr").port())
    };
    assert_ne!(here.identity(), at(elsewhere.clone()).identity());
    assert_eq!(here.identity(), at(server.endpoint()).identity());

    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("metadata/m.jsonl");
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(64 << 20)))
        .build()
        .expect("engine");
    let core = |store: BackingStore| {
        let reader = ObjectReader::new(engine.clone(), store, 1 << 20).expect("reader");
        FsCore::new(
            reader,
            "",
            CoreOptions {
                metadata_ttl: strata_fs::filesystem::METADATA_TTL_INDEFINITE,
                listing_log: Some(log.clone()),
                ..Default::default()
            },
        )
    };
    {
        let c = core(here.clone());
        let f = c.lookup(ROOT_INO, "f.txt").await.expect("f.txt");
        assert_eq!(f.attr.size, 19);
        // The log is appended off the caller's task.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let other = core(at(elsewhere));
    let got = other.lookup(ROOT_INO, "f.txt").await;
    assert!(
        got.is_err(),
        "another service's listing shown: {:?}",
        got.map(|e| e.attr.size)
    );
    let same = core(at(server.endpoint()));
    assert_eq!(
        same.lookup(ROOT_INO, "f.txt")
            .await
            .expect("f.txt")
            .attr
            .size,
        19
    );
}

/// A file system core over `store` that may delete objects (renames need it), staging
/// under `staging`.
fn deleting_core(store: &BackingStore, staging: &std::path::Path) -> strata_fs::FsCore {
    use strata_fs::{CoreOptions, FsCore, WriteOptions};
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(16 << 20)))
        .build()
        .expect("engine");
    let mut w = WriteOptions::new(staging.join("staging"));
    w.allow_delete = true;
    FsCore::new(
        ObjectReader::new(engine, store.clone(), 1 << 20).expect("reader"),
        "",
        CoreOptions {
            writes: Some(w),
            ..Default::default()
        },
    )
}

/// Black-box finding (round 13): `mv` of a folder holding keys the mount cannot name
/// (`a/./b`, `a//b`) returned 0, moved the rest and left those, and the folder stayed
/// listed, ENOENT to open and ENOTEMPTY to remove. Refused up front, nothing moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_holding_keys_that_cannot_be_named_is_not_half_renamed() {
    use strata_fs::filesystem::ROOT_INO;

    let server = MotoServer::start();
    server.create_bucket("data");
    for key in ["a/b", "a/c/d", "a/./b", "a//b", "k/e"] {
        server.put_raw("data", key, "x");
    }
    let store = s3_store(&server, "s3://data");
    let staging = tempfile::tempdir().expect("tempdir");
    let core = deleting_core(&store, staging.path());
    let e = core
        .rename(ROOT_INO, "a", ROOT_INO, "z", false)
        .await
        .expect_err("refused");
    assert_eq!(e.errno(), libc::ENOTSUP, "{e}");
    assert!(store.head("a/b").await.is_ok(), "nothing moved");
    assert!(store.head("z/b").await.is_err());
    // A folder of named keys only moves.
    core.rename(ROOT_INO, "k", ROOT_INO, "m", false)
        .await
        .expect("renamed");
    assert!(store.head("m/e").await.is_ok());
}

/// Black-box finding (round 22): a folder rename made keys past the 1,024 bytes S3 takes
/// (moto stores them; AWS fails the copy, EIO) where a create of such a name is
/// ENAMETOOLONG. The rename is refused the same way, before anything is copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_rename_past_the_key_length_is_enametoolong_and_moves_nothing() {
    use strata_fs::filesystem::ROOT_INO;

    let server = MotoServer::start();
    server.create_bucket("data");
    let long = format!("ckpt/{}", "m".repeat(1010));
    for key in ["ckpt/a_small", long.as_str(), "ckpt/z_small"] {
        server.put_raw("data", key, "x");
    }
    let store = s3_store(&server, "s3://data");
    let staging = tempfile::tempdir().expect("tempdir");
    let core = deleting_core(&store, staging.path());
    let e = core
        .rename(ROOT_INO, "ckpt", ROOT_INO, "checkpoint-step-000100", false)
        .await
        .expect_err("refused");
    assert_eq!(e.errno(), libc::ENAMETOOLONG, "{e}");
    assert!(store.head("ckpt/a_small").await.is_ok(), "nothing moved");
    assert!(store.head("checkpoint-step-000100/a_small").await.is_err());
}

/// Create-only renames and copies (a rename on a mount that may not replace objects,
/// `RENAME_NOREPLACE`, a directory renamed object by object) on a store: onto a free
/// name they move or copy; onto a taken one they fail with `Exists` and both objects
/// stay as they were.
async fn create_only_moves_never_replace(store: &BackingStore) {
    store
        .put("a", Bytes::from_static(b"MINE"))
        .await
        .expect("put a");
    store
        .put("taken", Bytes::from_static(b"OTHER"))
        .await
        .expect("put taken");
    let exists = |r: Result<(), CacheError>| matches!(r, Err(CacheError::Exists(_)));
    assert!(
        exists(store.rename_new("a", "taken", 4).await),
        "rename onto a taken name"
    );
    assert!(
        exists(store.copy_new("a", "taken", 4).await),
        "copy onto a taken name"
    );
    let get = |p: &'static str| {
        let store = store.clone();
        async move {
            let obj = store.head(p).await.ok()?;
            store
                .get_range(&obj, 0..obj.size)
                .await
                .ok()
                .map(|b| b.to_vec())
        }
    };
    assert_eq!(get("taken").await.as_deref(), Some(&b"OTHER"[..]));
    assert_eq!(get("a").await.as_deref(), Some(&b"MINE"[..]));
    store
        .copy_new("a", "copied", 4)
        .await
        .expect("copy to a free name");
    store
        .rename_new("a", "moved", 4)
        .await
        .expect("rename to a free name");
    assert_eq!(get("copied").await.as_deref(), Some(&b"MINE"[..]));
    assert_eq!(get("moved").await.as_deref(), Some(&b"MINE"[..]));
    assert_eq!(get("a").await, None, "the source went");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_only_moves_never_replace_on_s3_or_a_local_directory() {
    let server = MotoServer::start();
    server.create_bucket("excl");
    create_only_moves_never_replace(&s3_store(&server, "s3://excl/p")).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}", dir.path().display());
    let local = BackingStore::from_url(&url, &Default::default()).expect("local store");
    create_only_moves_never_replace(&local).await;
}

/// Objects whose headers hold bytes other than visible ASCII (raw UTF-8 in a
/// `Content-Disposition` file name or in user metadata, as stores that keep headers as
/// given echo them) read like any other: object_store refused such a response, and
/// every read of the object failed after its retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_with_non_ascii_header_values_read() {
    let server = MotoServer::start();
    server.create_bucket("hdr");
    server.put_with_headers(
        "hdr",
        "p/resume.pdf",
        b"the bytes",
        &[
            (
                "Content-Disposition",
                "attachment; filename=\"résumé.pdf\"".as_bytes(),
            ),
            ("x-amz-meta-author", "Zoë".as_bytes()),
        ],
    );
    let store = s3_store(&server, "s3://hdr/p");
    let obj = store.head("resume.pdf").await.expect("head");
    let got = store.get_range(&obj, 0..obj.size).await.expect("get");
    assert_eq!(&got[..], b"the bytes");
}

/// A create-only rename (a mount that may not replace objects) of an object that
/// carries headers and user metadata keeps them: S3's create-only copy (a multipart
/// copy) would have left them behind. It still never replaces a taken name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_only_rename_keeps_the_objects_headers_and_metadata() {
    let server = MotoServer::start();
    server.create_bucket("meta");
    let headers: &[(&str, &[u8])] = &[
        ("Content-Type", b"application/json"),
        ("Content-Encoding", b"gzip"),
        ("Cache-Control", b"max-age=60"),
        ("x-amz-meta-sha256", b"abc123"),
    ];
    server.put_with_headers("meta", "p/src", b"{}", headers);
    server.put_with_headers("meta", "p/other", b"[]", headers);
    server.put_raw("meta", "p/taken", "TAKEN");
    let store = s3_store(&server, "s3://meta/p");
    assert!(
        matches!(
            store.rename_new("other", "taken", 2).await,
            Err(CacheError::Exists(_))
        ),
        "onto a taken name"
    );
    store
        .rename_new("src", "dst", 2)
        .await
        .expect("rename to a free name");
    let head = object_store::GetOptions {
        head: true,
        ..Default::default()
    };
    let kept = store
        .inner()
        .get_opts(&object_store::path::Path::from("dst"), head)
        .await
        .expect("head dst")
        .attributes;
    use object_store::Attribute;
    for (attribute, value) in [
        (Attribute::ContentType, "application/json"),
        (Attribute::ContentEncoding, "gzip"),
        (Attribute::CacheControl, "max-age=60"),
        (Attribute::Metadata("sha256".into()), "abc123"),
    ] {
        assert_eq!(
            kept.get(&attribute).map(|v| v.as_ref()),
            Some(value),
            "{attribute:?} kept"
        );
    }
    assert!(store.head("src").await.is_err(), "the source went");
    let taken = store.head("taken").await.expect("taken stays");
    assert_eq!(taken.size, 5);
}

/// Black-box findings (round 25): a folder held by its marker `q/` beside an object
/// `q` (the marker's name finds that object) was taken for a folder of real objects:
/// its rename copied the hidden object, moved the children, and failed with a false
/// "changed by another client", or returned 0 and left the marker (a folder renamed
/// into a file). A sub-folder marker with a body and nothing under it (`p/x/`) failed
/// the rename ENOENT. Both are refused ENOTSUP as any marker folder is, nothing moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marker_folders_beside_an_object_of_their_name_are_refused_and_nothing_moves() {
    use strata_fs::filesystem::ROOT_INO;

    let server = MotoServer::start();
    server.create_bucket("data");
    for (key, body) in [
        ("q", "Q"),
        ("q/", ""),
        ("q/child", "c"),
        ("w", ""),
        ("w/", ""),
        ("p/ok", "ok"),
        ("p/x/", "marker bytes"),
    ] {
        server.put_raw("data", key, body);
    }
    let store = s3_store(&server, "s3://data");
    let staging = tempfile::tempdir().expect("tempdir");
    let core = deleting_core(&store, staging.path());
    for (from, to) in [("q", "q2"), ("w", "w2"), ("p", "p2")] {
        let e = core
            .rename(ROOT_INO, from, ROOT_INO, to, false)
            .await
            .expect_err("refused");
        assert_eq!(e.errno(), libc::ENOTSUP, "{from}: {e}");
        let moved = store.list_all(&format!("{to}/")).await.expect("list");
        assert!(moved.is_empty(), "{from}: nothing under {to}: {moved:?}");
        assert!(store.head(to).await.is_err(), "{from}: no object {to}");
    }
    assert!(store.head("q/child").await.is_ok(), "q's child stays");
    assert!(store.head("q").await.is_ok(), "the object q stays");
    assert!(store.head("p/ok").await.is_ok(), "p's file stays");
}
