//! The store's directory probe, `BackingStore::dir_exists`: what a mount with no
//! metadata TTL asks instead of listing a whole folder.

use std::sync::Arc;

use bytes::Bytes;
use object_store::memory::InMemory;
use strata_cache_core::store::{BackingStore, RetryPolicy, StoreOptions};

/// `dir_exists` (the directory probe of a mount with no metadata TTL): one answer
/// whatever the folder holds, on an object store and on a local directory alike.
#[tokio::test]
async fn dir_exists_answers_for_object_and_local_stores() {
    let mem = Arc::new(InMemory::new());
    let store = BackingStore::new(mem.clone(), "memory://b", RetryPolicy::default());
    for k in ["d/x", "d/sub/y", "dx"] {
        store.put(k, Bytes::from_static(b"1")).await.expect("put");
    }
    assert!(store.dir_exists("d").await.expect("d"));
    assert!(store.dir_exists("d/sub").await.expect("d/sub"));
    assert!(!store
        .dir_exists("dx")
        .await
        .expect("a file is no directory"));
    assert!(!store.dir_exists("nope").await.expect("nope"));

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("a/empty")).expect("mkdir");
    std::fs::write(dir.path().join("a/f"), b"1").expect("write");
    let local = BackingStore::from_url(
        &format!("file://{}", dir.path().display()),
        &StoreOptions::default(),
    )
    .expect("store");
    assert!(local.dir_exists("a").await.expect("a"));
    assert!(local.dir_exists("a/empty").await.expect("an empty folder"));
    assert!(!local.dir_exists("a/f").await.expect("a file"));
    assert!(!local.dir_exists("b").await.expect("b"));
}
