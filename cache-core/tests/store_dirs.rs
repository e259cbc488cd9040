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

/// Black-box finding: a local directory 16 levels of 250-byte names deep (its path past
/// `PATH_MAX`) was listed through the mount as empty, with no error, and everything
/// under it vanished. A local path no system call can name is `NameTooLong` (the mount's
/// ENAMETOOLONG) for a listing, a lookup and the directory probe; one just under the
/// limit is answered as any other.
#[tokio::test]
async fn a_local_path_past_path_max_is_name_too_long() {
    use strata_cache_core::CacheError;
    let dir = tempfile::tempdir().expect("tempdir");
    let local = BackingStore::from_url(
        &format!("file://{}", dir.path().display()),
        &StoreOptions::default(),
    )
    .expect("store");
    let root_len = dir.path().as_os_str().len() + 1;
    let deep = |bytes: usize| -> String {
        let mut p = String::new();
        while p.len() + 251 <= bytes {
            if !p.is_empty() {
                p.push('/');
            }
            p.push_str(&"d".repeat(250));
        }
        p
    };
    let long = deep(4400 - root_len);
    assert!(root_len + long.len() >= 4096, "past PATH_MAX");
    let too_long = |r: Result<(), CacheError>| matches!(r, Err(CacheError::NameTooLong(_)));
    assert!(too_long(local.list_dir(&long).await.map(|_| ())));
    assert!(too_long(local.head(&format!("{long}/f")).await.map(|_| ())));
    assert!(too_long(local.dir_exists(&long).await.map(|_| ())));
    // 4,000 bytes with the root: it fits, an entry of 250 bytes in a folder in it not.
    let mut fits = deep(3700 - root_len);
    while root_len + fits.len() < 4000 {
        let k = (4000 - root_len - fits.len() - 1).clamp(1, 250);
        fits.push('/');
        fits.push_str(&"m".repeat(k));
    }
    assert!(
        matches!(local.dir_exists(&fits).await, Ok(false)),
        "under the limit: absent, as any missing folder"
    );
    // A folder that fits holding an entry that does not (made short, then moved deep:
    // no call names the entry's whole path): the listing fails, it does not drop it.
    std::fs::create_dir_all(dir.path().join(&fits)).expect("deep folder");
    let short = dir.path().join("short");
    std::fs::create_dir(&short).expect("short");
    std::fs::write(short.join("n".repeat(250)), b"1").expect("entry");
    std::fs::rename(&short, dir.path().join(format!("{fits}/s"))).expect("move deep");
    assert!(
        root_len + fits.len() + 3 + 250 >= 4096,
        "the entry is past PATH_MAX"
    );
    assert!(too_long(
        local.list_dir(&format!("{fits}/s")).await.map(|_| ())
    ));
    assert!(
        local.list_dir(&fits).await.is_ok(),
        "the folder above lists (its entry `s` fits)"
    );
}

/// Black-box finding (security): a local store holding `ckpt -> <a folder outside>`,
/// hidden from listings, took writes through it: `ckpt/new.bin` was created outside the
/// store and, with overwrites allowed, a file there was replaced; a rename moved a store
/// file over one outside. Every write, rename, copy and delete whose folder leads out of
/// the store through a link is refused, and nothing outside changes; inside the store,
/// and through a link when the store follows links, writes go on as before.
#[tokio::test]
async fn writes_through_a_link_out_of_a_local_store_are_refused() {
    use strata_cache_core::CacheError;
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("victim.conf"), b"ORIGINAL").expect("victim");
    let dir = tempfile::tempdir().expect("store");
    std::os::unix::fs::symlink(outside.path(), dir.path().join("ckpt")).expect("link");
    std::fs::create_dir(dir.path().join("in")).expect("in");
    std::fs::write(dir.path().join("in/ok.txt"), b"inside").expect("ok");
    let url = format!("file://{}", dir.path().display());
    let store = BackingStore::from_url(&url, &StoreOptions::default()).expect("store");
    let refused = |r: Result<(), CacheError>| matches!(r, Err(CacheError::InvalidArgument(_)));
    let data = || Bytes::from_static(b"CLOBBERED");
    assert!(refused(store.put("ckpt/new.bin", data()).await));
    assert!(refused(store.put("ckpt/victim.conf", data()).await));
    assert!(refused(store.put_new("ckpt/deeper/new.bin", data()).await));
    assert!(refused(store.rename("in/ok.txt", "ckpt/victim.conf").await));
    assert!(refused(store.copy("in/ok.txt", "ckpt/victim.conf").await));
    assert!(refused(
        store.copy("ckpt/victim.conf", "in/stolen.conf").await
    ));
    assert!(refused(store.delete("ckpt/victim.conf").await));
    let shape = strata_cache_core::store::UploadShape {
        part_size: 5 << 20,
        in_flight: 1,
        slots: None,
        only_if_absent: false,
    };
    assert!(store.start_upload("ckpt/big.bin", &shape).await.is_err());
    // A name that is itself a link out of the store (hidden from listings) is not
    // replaced by a write or a rename onto it (round 17b: it became a regular file).
    std::os::unix::fs::symlink(
        outside.path().join("victim.conf"),
        dir.path().join("in/lfile"),
    )
    .expect("a file link out");
    assert!(refused(store.put("in/lfile", data()).await));
    assert!(refused(store.rename("in/ok.txt", "in/lfile").await));
    assert!(std::fs::symlink_metadata(dir.path().join("in/lfile"))
        .expect("lstat")
        .file_type()
        .is_symlink());
    let left: Vec<_> = std::fs::read_dir(outside.path())
        .expect("outside")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("victim.conf")]);
    assert_eq!(
        std::fs::read(outside.path().join("victim.conf")).expect("victim"),
        b"ORIGINAL"
    );
    assert_eq!(
        std::fs::read(dir.path().join("in/ok.txt")).expect("ok"),
        b"inside"
    );
    // Inside the store, writes go on; a store that follows links takes them through it.
    store.put("in/new.txt", data()).await.expect("inside");
    store
        .put("fresh/a/b.txt", data())
        .await
        .expect("new folders");
    let follow = BackingStore::from_url(
        &url,
        &StoreOptions {
            follow_symlinks: true,
            ..StoreOptions::default()
        },
    )
    .expect("store");
    follow
        .put("ckpt/new.bin", data())
        .await
        .expect("followed, as asked");
    assert!(outside.path().join("new.bin").exists());
}

/// Black-box finding: `rm -rf data/latest` through a mount of a local directory, where
/// `latest -> v2` (shown as a folder), deleted every file of v2 and left the link. A
/// delete or move through a linked folder is refused; the target's own names work.
#[tokio::test]
async fn deletes_and_moves_through_a_linked_folder_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("data/v2")).expect("mkdir");
    for f in ["shard0", "shard1"] {
        std::fs::write(dir.path().join("data/v2").join(f), b"weights").expect("write");
    }
    std::os::unix::fs::symlink("v2", dir.path().join("data/latest")).expect("symlink");
    let store = BackingStore::from_url(
        &format!("file://{}", dir.path().display()),
        &StoreOptions::default(),
    )
    .expect("local store");
    let refused = |r: Result<(), strata_cache_core::CacheError>| {
        matches!(r, Err(strata_cache_core::CacheError::PermissionDenied(_)))
    };
    assert!(refused(store.delete("data/latest/shard0").await));
    assert!(refused(
        store.rename("data/latest/shard1", "data/moved").await
    ));
    assert!(
        dir.path().join("data/v2/shard0").exists(),
        "the target's file stays"
    );
    assert!(
        dir.path().join("data/v2/shard1").exists(),
        "the target's file stays"
    );
    store
        .delete("data/v2/shard0")
        .await
        .expect("by its own name");
    assert!(!dir.path().join("data/v2/shard0").exists());
}

/// Black-box finding: a lookup of a folder of a local directory store listed the whole
/// folder (a stat and a readlink per entry: 1.1-3.2 s for 64,000 files), again at
/// every expiry of its attributes. The lookup's listing (`list_dir_for_lookup`) is
/// one stat there: None (a folder, listed whole when read); what is no folder is
/// listed as before; `rmdir`'s own check (`list_dir_if_one_page`) still sees entries.
#[tokio::test]
async fn a_lookup_of_a_local_folder_is_one_stat_not_a_listing() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("big")).expect("mkdir");
    for i in 0..300 {
        std::fs::write(dir.path().join(format!("big/f{i}")), b"1").expect("write");
    }
    let local = BackingStore::from_url(
        &format!("file://{}", dir.path().display()),
        &StoreOptions::default(),
    )
    .expect("store");
    assert!(
        local
            .list_dir_for_lookup("big")
            .await
            .expect("lookup")
            .is_none(),
        "a folder, not listed"
    );
    let whole = local
        .list_dir_if_one_page("big")
        .await
        .expect("rmdir's check")
        .expect("listed");
    assert_eq!(whole.files.len(), 300);
    let none = local
        .list_dir_for_lookup("nothing")
        .await
        .expect("lookup")
        .expect("listed: no folder there");
    assert!(!none.exists);
    let file = local
        .list_dir_for_lookup("big/f1")
        .await
        .expect("lookup")
        .expect("listed: a file is no folder");
    assert!(!file.exists);
}
