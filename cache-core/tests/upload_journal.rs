//! Uploads a crash cut off are aborted at the next start (black-box findings: kill -9
//! during a multipart upload left its parts in the bucket; a local directory store kept
//! object_store's temporary `NAME#N` file). The crash is a `mem::forget` of the upload:
//! nothing of it runs again, as after kill -9.

use std::sync::Arc;

use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use strata_cache_core::store::{
    BackingStore, RetryPolicy, StoreOptions, UploadJournal, UploadShape,
};

fn shape(part_size: usize) -> UploadShape {
    UploadShape {
        part_size,
        in_flight: 2,
        slots: None,
        only_if_absent: false,
    }
}

#[tokio::test]
async fn a_multipart_upload_cut_off_by_a_crash_is_aborted_at_the_next_start() {
    let journal_dir = tempfile::tempdir().expect("tempdir");
    let mem = Arc::new(InMemory::new());
    let store = |journal: Arc<UploadJournal>| {
        BackingStore::new(mem.clone(), "memory://b", RetryPolicy::default())
            .with_part_store(mem.clone(), "")
            .with_upload_journal(journal)
    };
    let (journal, left) = UploadJournal::open(journal_dir.path(), "memory://b").expect("journal");
    assert!(left.is_empty());
    let run1 = store(journal);

    // A finished upload leaves no record.
    let mut done = run1.start_upload("ok.bin", &shape(8)).await.expect("start");
    done.put(Bytes::from(vec![1u8; 20])).await.expect("put");
    done.finish().await.expect("finish");

    // The crash: parts sent, never completed nor aborted.
    let mut up = run1
        .start_upload("ckpt/big.bin", &shape(8))
        .await
        .expect("start");
    up.put(Bytes::from(vec![7u8; 20])).await.expect("put");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    std::mem::forget(up);

    let (journal, left) = UploadJournal::open(journal_dir.path(), "memory://b").expect("reopen");
    assert_eq!(left.len(), 1, "only the unfinished upload is left");
    let location = Path::from(left[0].record.location.as_str());
    assert_eq!(location.as_ref(), "ckpt/big.bin");
    let id = left[0].record.upload_id.clone().expect("an upload id");
    // The store still holds the upload: a part can be added to it.
    mem.put_part(&location, &id, 9, Bytes::from_static(b"x").into())
        .await
        .expect("the upload is live before the restart cleans it");

    let run2 = store(journal);
    assert_eq!(run2.abort_left(left).await, 1);
    assert!(
        mem.put_part(&location, &id, 10, Bytes::from_static(b"x").into())
            .await
            .is_err(),
        "the upload was aborted"
    );
    let (_, left) = UploadJournal::open(journal_dir.path(), "memory://b").expect("again");
    assert!(left.is_empty(), "its record is gone");
    assert!(
        run2.head("ckpt/big.bin").await.is_err(),
        "no object appeared"
    );
    assert!(run2.head("ok.bin").await.is_ok());
}

#[tokio::test]
async fn a_local_stores_temporary_file_left_by_a_crash_is_removed_at_the_next_start() {
    let data = tempfile::tempdir().expect("tempdir");
    let journal_dir = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}", data.path().display());
    let open = || {
        let (journal, left) = UploadJournal::open(journal_dir.path(), &url).expect("journal");
        let store = BackingStore::from_url(&url, &StoreOptions::default())
            .expect("store")
            .with_upload_journal(journal);
        (store, left)
    };
    let (run1, _) = open();
    let mut up = run1
        .start_upload("dir/big.bin", &shape(8))
        .await
        .expect("start");
    up.put(Bytes::from(vec![5u8; 64])).await.expect("put");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    std::mem::forget(up);
    let temps = || -> Vec<String> {
        std::fs::read_dir(data.path().join("dir"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        temps(),
        vec!["dir/big.bin#1".replace("dir/", "")],
        "the leak"
    );
    std::fs::write(data.path().join("dir/keep#me"), b"a user's file").expect("write");

    let (run2, left) = open();
    assert_eq!(left.len(), 1);
    assert_eq!(run2.abort_left(left).await, 1);
    assert_eq!(
        temps(),
        vec!["keep#me".to_string()],
        "only the temporary file went"
    );
    let (_, left) = open();
    assert!(left.is_empty());
}
