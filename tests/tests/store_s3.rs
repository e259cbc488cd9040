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
