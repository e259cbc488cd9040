//! The store's retry/timeout policy under injected faults, and version checks on a
//! local directory store: transient errors are retried, a dead or hung store gives a
//! clear error in bounded time, and a changed object is never mixed with the old one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{
    AccessContext, BackingStore, CacheEngine, CacheError, ObjectInfo, ObjectReader, RetryPolicy,
    StoreOptions,
};

fn quick_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        base_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_secs(1),
        attempt_timeout: Duration::from_millis(300),
        silent_pause: Duration::ZERO,
        ..RetryPolicy::default()
    }
}

/// A faulty store (injecting `config`) that holds `data` at `path`, and that object.
async fn faulty_holding(
    config: FaultConfig,
    path: &str,
    data: Bytes,
) -> (BackingStore, Arc<FaultyStore>, ObjectInfo) {
    faulty_holding_with(quick_retry(), config, path, data).await
}

/// [`faulty_holding`] under the policy `retry`.
async fn faulty_holding_with(
    retry: RetryPolicy,
    config: FaultConfig,
    path: &str,
    data: Bytes,
) -> (BackingStore, Arc<FaultyStore>, ObjectInfo) {
    let inner = Arc::new(object_store::memory::InMemory::new());
    let f = Arc::new(FaultyStore::new(inner, config));
    let store = BackingStore::new(f.clone(), "faulty", retry);
    store.put(path, data).await.expect("put");
    let obj = store.head(path).await.expect("head");
    (store, f, obj)
}

/// A store holding `a` under `retry`, then hanging on every request.
async fn hanging(retry: RetryPolicy) -> (BackingStore, Arc<FaultyStore>, ObjectInfo) {
    let held = faulty_holding_with(
        retry,
        FaultConfig::default(),
        "a",
        Bytes::from_static(b"data"),
    )
    .await;
    held.1.set_config(FaultConfig {
        hang_every: 1,
        ..Default::default()
    });
    held
}

#[tokio::test]
async fn transient_errors_are_retried() {
    let (store, f, obj) = faulty_holding(
        FaultConfig {
            fail_every: 2,
            ..Default::default()
        },
        "a",
        Bytes::from_static(b"0123456789"),
    )
    .await;
    for _ in 0..10 {
        assert_eq!(
            store.get_range(&obj, 2..5).await.expect("get"),
            Bytes::from_static(b"234")
        );
    }
    assert!(f.reads() > 10, "some reads failed and were retried");
}

/// Issue 12, found by `strata bench chaos`: behind a store answering 30% of requests
/// with 5xx, reads through the mount failed with EIO while the store was up, because
/// the default policy gave up after 4 errors in a row (0.3^4: about 1 request in 120).
/// 7 in a row (0.3^7: about 1 in 4,500) must be ridden out by the default policy, and
/// within its bounded backoff.
#[tokio::test]
async fn the_default_policy_rides_out_a_run_of_seven_transient_errors() {
    let inner = Arc::new(object_store::memory::InMemory::new());
    let f = Arc::new(FaultyStore::new(inner, FaultConfig::default()));
    let store = BackingStore::new(f.clone(), "faulty", RetryPolicy::default());
    store
        .put("a", Bytes::from_static(b"0123456789"))
        .await
        .expect("put");
    let obj = store.head("a").await.expect("head");
    f.fail_next(7);
    let reads_before = f.reads();
    let t = Instant::now();
    let got = store.get_range(&obj, 2..5).await;
    assert_eq!(
        got.expect("7 transient errors in a row are retried"),
        Bytes::from_static(b"234")
    );
    assert_eq!(
        f.reads() - reads_before,
        8,
        "7 failed attempts, then one that worked"
    );
    // 50+100+200+400+800+1000+1000 ms of backoff: bounded, with room for a busy machine.
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_dead_store_fails_clearly_and_quickly() {
    let (store, f, obj) =
        faulty_holding(FaultConfig::default(), "a", Bytes::from_static(b"data")).await;
    f.set_config(FaultConfig {
        down: true,
        ..Default::default()
    });
    let t = Instant::now();
    match store.get_range(&obj, 0..4).await {
        Err(CacheError::Store {
            attempts: 3,
            message,
        }) => assert!(message.contains("503"), "{message}"),
        other => panic!("expected a store error after 3 attempts, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(store.list_dir("").await.is_err());
}

#[tokio::test]
async fn a_hung_store_times_out() {
    let (store, f, obj) =
        faulty_holding(FaultConfig::default(), "a", Bytes::from_static(b"data")).await;
    f.set_config(FaultConfig {
        hang_every: 1,
        ..Default::default()
    });
    let t = Instant::now();
    assert!(matches!(
        store.get_range(&obj, 0..4).await,
        Err(CacheError::StoreTimeout { attempts: 3 })
    ));
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// A store that stops answering fails a request within the policy's whole deadline,
/// not after every attempt's timeout (a FUSE caller waits uninterruptibly meanwhile).
#[tokio::test]
async fn a_hung_store_fails_within_the_whole_deadline() {
    let retry = RetryPolicy {
        attempts: 8,
        attempt_timeout: Duration::from_millis(400),
        total_timeout: Duration::from_millis(600),
        ..quick_retry()
    };
    let (store, _, obj) = hanging(retry).await;
    let t = Instant::now();
    assert!(matches!(
        store.get_range(&obj, 0..4).await,
        Err(CacheError::StoreTimeout { attempts: 2 })
    ));
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(550) && took < Duration::from_millis(2500),
        "{took:?} (8 x 400 ms without the deadline)"
    );
}

/// After a request's whole deadline passed without an answer, requests fail at once
/// for the policy's pause (a FUSE caller waits uninterruptibly otherwise), then the
/// store is asked again.
#[tokio::test]
async fn a_silent_store_fails_requests_at_once_for_a_pause() {
    let retry = RetryPolicy {
        attempts: 2,
        attempt_timeout: Duration::from_millis(200),
        total_timeout: Duration::from_millis(300),
        silent_pause: Duration::from_millis(800),
        ..quick_retry()
    };
    let (store, f, obj) = hanging(retry).await;
    assert!(matches!(
        store.get_range(&obj, 0..4).await,
        Err(CacheError::StoreTimeout { .. })
    ));
    f.set_config(FaultConfig::default());
    let t = Instant::now();
    match store.head("a").await {
        Err(CacheError::Store {
            attempts: 0,
            message,
        }) => {
            assert!(message.contains("not asked again"), "{message}")
        }
        other => panic!("expected an immediate failure, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_millis(100), "at once");
    assert_eq!(
        store.failures(),
        2,
        "both failures are counted (strata stats)"
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        store
            .get_range(&obj, 0..4)
            .await
            .expect("asked again after the pause"),
        Bytes::from_static(b"data")
    );
}

/// Black-box finding: one object whose GET stalled made the whole store "silent": for
/// the next 10 s every read of healthy files failed at once, though the store answered
/// hundreds of GETs meanwhile. Only a deadline with no answer to anyone pauses it.
#[tokio::test]
async fn one_stuck_object_does_not_pause_a_store_that_answers() {
    let retry = RetryPolicy {
        attempts: 2,
        attempt_timeout: Duration::from_millis(300),
        total_timeout: Duration::from_millis(400),
        silent_pause: Duration::from_secs(10),
        ..quick_retry()
    };
    let (store, f, _) = faulty_holding_with(
        retry,
        FaultConfig::default(),
        "ok",
        Bytes::from_static(b"fine"),
    )
    .await;
    store
        .put("stuck", Bytes::from_static(b"slow"))
        .await
        .expect("put");
    let stuck = store.head("stuck").await.expect("head");
    let ok = store.head("ok").await.expect("head");
    f.set_config(FaultConfig {
        hang_key: Some("stuck".into()),
        ..Default::default()
    });
    // Other readers are answered while the stuck GET waits out its deadline.
    let (s2, ok2) = (store.clone(), ok.clone());
    let others = tokio::spawn(async move {
        for _ in 0..8 {
            s2.get_range(&ok2, 0..4).await.expect("a healthy object");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert!(matches!(
        store.get_range(&stuck, 0..4).await,
        Err(CacheError::StoreTimeout { .. })
    ));
    others.await.expect("others");
    assert_eq!(
        store
            .get_range(&ok, 0..4)
            .await
            .expect("the store is not paused"),
        Bytes::from_static(b"fine")
    );
}

/// Black-box finding: two bodies cut short in a row failed a read with EIO, while two
/// 500s or resets in the same place were retried unnoticed. A short body is retried
/// like them, and only bytes of the asked length are ever returned.
#[tokio::test]
async fn short_bodies_are_retried_like_other_transient_faults() {
    let data = Bytes::from((0..20_000u32).map(|i| i as u8).collect::<Vec<u8>>());
    let (store, f, obj) = faulty_holding(FaultConfig::default(), "a", data.clone()).await;
    f.cut_next(2);
    assert_eq!(
        store.get_range(&obj, 0..20_000).await.expect("retried"),
        data
    );
    f.cut_next(100);
    assert!(
        store.get_range(&obj, 0..20_000).await.is_err(),
        "a store that keeps cutting fails the read, never returns short bytes"
    );
}

/// Black-box finding: on a slow but steady link (150 KB/s) an 8 MiB run could not
/// arrive within one attempt's deadline, each retry asked for the whole range again from
/// its start, and the reader got EIO after 95 s of bytes flowing. The deadlines now bound
/// the time between whole pieces, and a body cut off resumes at its first piece not yet
/// whole. Here: 8 pieces of 4 KiB at one piece per 100 ms, 800 ms in all, under an
/// attempt deadline of 300 ms.
#[tokio::test]
async fn a_slow_body_whose_pieces_keep_coming_is_read_whole() {
    let data = Bytes::from((0..32_768u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let retry = RetryPolicy {
        total_timeout: Duration::from_millis(400),
        ..quick_retry()
    };
    let slow = FaultConfig {
        trickle_bytes: 4096,
        trickle_every: Duration::from_millis(100),
        ..FaultConfig::default()
    };
    let (store, f, obj) = faulty_holding_with(retry, slow, "a", data.clone()).await;
    let seen = std::sync::Mutex::new(Vec::new());
    let (blocks, _) = store
        .get_range_blocks(&obj, 0..32_768, 4096, &|i, _| {
            seen.lock().expect("lock").push(i)
        })
        .await
        .expect("bytes keep coming: no deadline passes between two pieces");
    assert_eq!(blocks.concat(), data.to_vec());
    assert_eq!(
        *seen.lock().expect("lock"),
        (0..8).collect::<Vec<_>>(),
        "each piece once, in order"
    );
    assert_eq!(f.gets().count, 1, "one request");

    // A body that stops after 3 pieces each time: the next request asks for the rest.
    f.set_config(FaultConfig {
        trickle_bytes: 4096,
        trickle_every: Duration::from_millis(10),
        trickle_stall_after: 3 * 4096,
        ..FaultConfig::default()
    });
    let asked_before = f.get_log().len();
    let (blocks, _) = store
        .get_range_blocks(&obj, 0..32_768, 4096, &|_, _| {})
        .await
        .expect("resumed after each stall");
    assert_eq!(blocks.concat(), data.to_vec());
    let sizes: Vec<u64> = f.get_log()[asked_before..]
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(
        sizes,
        vec![32_768, 20_480, 8_192],
        "each asks only what is missing"
    );

    // A body that never completes a piece fails within the deadline, not later.
    f.set_config(FaultConfig {
        trickle_bytes: 1024,
        trickle_every: Duration::from_millis(10),
        trickle_stall_after: 1024,
        ..FaultConfig::default()
    });
    let started = Instant::now();
    let e = store
        .get_range_blocks(&obj, 0..32_768, 4096, &|_, _| {})
        .await
        .expect_err("no whole piece");
    assert!(matches!(e, CacheError::StoreTimeout { .. }), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Reads of `old` (a version replaced since) fail as `Changed`, a range and a run of
/// blocks alike: never another version's bytes.
async fn refuses_as_changed(store: &BackingStore, old: &ObjectInfo) {
    let e = store
        .get_range(old, 0..100)
        .await
        .expect_err("another version");
    assert!(matches!(e, CacheError::Changed(_)), "{e}");
    let e = store
        .get_range_blocks(old, 0..old.size.min(10_000), 4096, &|_, _| {})
        .await
        .expect_err("another version");
    assert!(matches!(e, CacheError::Changed(_)), "{e}");
}

/// Black-box finding: behind a gateway that ignored If-Match, one open file read the
/// old version's first MiB and the new version's rest, and the new bytes were cached
/// under the old version's keys. The response's ETag is checked too.
#[tokio::test]
async fn a_store_that_ignores_if_match_still_never_answers_another_version() {
    let ignoring = FaultConfig {
        ignore_if_match: true,
        ..FaultConfig::default()
    };
    let (store, _f, old) = faulty_holding(ignoring, "a", Bytes::from(vec![1u8; 10_000])).await;
    store
        .put("a", Bytes::from(vec![2u8; 10_000]))
        .await
        .expect("replace");
    refuses_as_changed(&store, &old).await;
    let now = store.head("a").await.expect("head");
    assert_eq!(
        store.get_range(&now, 0..3).await.expect("current"),
        Bytes::from(vec![2u8; 3])
    );
}

/// Black-box finding: behind a gateway that drops ETags, an object overwritten out of
/// band during a read was served as the old version's first MiBs and the new one's
/// rest, and cached so. Without an ETag the size and Last-Modified pin the version.
#[tokio::test]
async fn a_store_without_etags_never_answers_another_version() {
    let no_etags = FaultConfig {
        drop_etags: true,
        ..FaultConfig::default()
    };
    let (store, _f, old) = faulty_holding(no_etags, "a", Bytes::from(vec![1u8; 10_000])).await;
    assert!(!old.has_etag, "{old:?}");
    // Another size: caught at once.
    store
        .put("a", Bytes::from(vec![2u8; 9_000]))
        .await
        .expect("replace");
    let e = store
        .get_range(&old, 0..100)
        .await
        .expect_err("another size");
    assert!(matches!(e, CacheError::Changed(_)), "{e}");
    // The same size, written in a later second (Last-Modified has whole seconds).
    let second = |o: &ObjectInfo| o.last_modified_unix_ns.div_euclid(1_000_000_000);
    let mut same_size = store.head("a").await.expect("head");
    while second(&same_size) == second(&old) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store
            .put("a", Bytes::from(vec![3u8; 10_000]))
            .await
            .expect("replace");
        same_size = store.head("a").await.expect("head");
    }
    refuses_as_changed(&store, &old).await;
    assert_ne!(same_size.version, old.version, "new blocks, new keys");
    // A listing names the version as a head does (same blocks whichever found it).
    let listed = store.list_all("").await.expect("list");
    let a = listed.iter().find(|o| &*o.path == "a").expect("listed");
    assert_eq!(a.version, same_size.version);
    assert_eq!(
        store.get_range(&same_size, 0..3).await.expect("current"),
        Bytes::from(vec![3u8; 3])
    );
}

/// Black-box finding: ETags in heads and listings, none in GET answers, If-Match
/// ignored: an object overwritten during a read was spliced as before. The answer's
/// size and Last-Modified must match when it names no ETag.
#[tokio::test]
async fn a_read_answer_without_an_etag_is_checked_by_size_and_date() {
    let cfg = FaultConfig {
        drop_read_etags: true,
        ..FaultConfig::default()
    };
    let (store, f, old) = faulty_holding(cfg, "a", Bytes::from(vec![1u8; 10_000])).await;
    assert!(old.has_etag, "heads name it");
    // An answer without a date either: nothing to compare it by but its size (every
    // read of such a store must not be refused).
    f.set_config(FaultConfig {
        drop_read_etags: true,
        drop_read_dates: true,
        ..FaultConfig::default()
    });
    assert_eq!(
        store
            .get_range(&old, 0..3)
            .await
            .expect("no date to tell it by"),
        Bytes::from(vec![1u8; 3])
    );
    f.set_config(FaultConfig {
        drop_read_etags: true,
        ..FaultConfig::default()
    });
    assert_eq!(
        store.get_range(&old, 0..3).await.expect("the same version"),
        Bytes::from(vec![1u8; 3])
    );
    store
        .put("a", Bytes::from(vec![2u8; 9_000]))
        .await
        .expect("replace");
    let e = store
        .get_range(&old, 0..100)
        .await
        .expect_err("another version");
    assert!(matches!(e, CacheError::Changed(_)), "{e}");
}

/// Black-box finding (round 22): `store_failures` counted requests that failed after
/// their retries, so a store failing every other request while the retries won showed
/// 0 (103 injected 5xx answers, 0 counted). Every failed attempt is counted apart.
#[tokio::test]
async fn attempts_the_store_failed_are_counted_when_the_retries_win() {
    let (store, f, obj) =
        faulty_holding(FaultConfig::default(), "a", Bytes::from(vec![5u8; 10_000])).await;
    f.set_config(FaultConfig {
        fail_every: 2,
        ..FaultConfig::default()
    });
    for _ in 0..6 {
        store
            .get_range(&obj, 0..100)
            .await
            .expect("retried to success");
        store.head("a").await.expect("retried to success");
    }
    assert_eq!(store.failures(), 0, "no request failed after its retries");
    assert!(
        store.failed_attempts() >= 5,
        "every other attempt failed: {}",
        store.failed_attempts()
    );
    let before = store.failed_attempts();
    f.set_config(FaultConfig::default());
    assert!(matches!(
        store.head("missing").await,
        Err(CacheError::NotFound(_))
    ));
    assert_eq!(store.failed_attempts(), before, "an answer is no failure");
}

/// Black-box finding (round 22): one HEAD (or listing) answering an object 1,000 bytes
/// short, its ETag right, made a read plan by that size: the last block was cut there
/// and cached as the version's, the file served short without an error. The GET's
/// answer says the object's size (Content-Range): another size at the same version is
/// refused as changed.
#[tokio::test]
async fn a_read_planned_by_a_wrong_size_is_refused_at_the_same_version() {
    let (store, _f, right) =
        faulty_holding(FaultConfig::default(), "a", Bytes::from(vec![7u8; 10_000])).await;
    let mut short = right.clone();
    short.size -= 1_000;
    let e = store
        .get_range(&short, 8_000..9_000)
        .await
        .expect_err("the object is longer than the answer the read was planned by");
    assert!(matches!(e, CacheError::Changed(_)), "{e}");
    assert_eq!(
        store
            .get_range(&right, 9_000..10_000)
            .await
            .expect("right size"),
        Bytes::from(vec![7u8; 1_000])
    );
}

/// Black-box finding: a store answering a range that covers the whole object with
/// `200 OK` made small files unreadable (EIO after 8 attempts). That answer is the
/// object asked for: it is read whole, once.
#[tokio::test]
async fn a_whole_object_answered_to_its_whole_range_is_taken() {
    let cfg = FaultConfig {
        whole_range_not_partial: true,
        ..FaultConfig::default()
    };
    let (store, f, obj) = faulty_holding(cfg, "small", Bytes::from_static(b"tiny file")).await;
    let reads = f.gets().count;
    assert_eq!(
        store.get_range(&obj, 0..9).await.expect("whole"),
        Bytes::from_static(b"tiny file")
    );
    assert_eq!(f.gets().count - reads, 1, "one read answered");
    assert_eq!(
        store.get_range(&obj, 2..6).await.expect("a part"),
        Bytes::from_static(b"ny f")
    );
}

/// Black-box finding: object_store panicked on a store's answer to a delete, and the
/// FUSE request was never answered. The delete fails with an error instead.
#[tokio::test]
async fn a_delete_the_client_library_panics_on_is_an_error() {
    let cfg = FaultConfig {
        panic_on_delete: true,
        ..FaultConfig::default()
    };
    let (store, f, _) = faulty_holding(cfg, "a", Bytes::from_static(b"x")).await;
    let e = store.delete("a").await.expect_err("a panic is an error");
    assert!(matches!(e, CacheError::Store { .. }), "{e}");
    f.set_config(FaultConfig::default());
    store.delete("a").await.expect("a well-behaved answer");
}

#[tokio::test]
async fn failed_reads_leave_the_cache_clean_and_recover() {
    let (store, f, obj) =
        faulty_holding(FaultConfig::default(), "obj", Bytes::from(vec![9u8; 5000])).await;
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(1 << 20)))
        .build()
        .expect("engine");
    let reader = ObjectReader::new(engine.clone(), store, 1024).expect("reader");
    f.set_config(FaultConfig {
        down: true,
        ..Default::default()
    });
    assert!(reader
        .read(&obj, 0, 5000, &AccessContext::default())
        .await
        .is_err());
    assert_eq!(engine.stats().fills, 0, "nothing cached from a failed read");
    f.set_config(FaultConfig::default());
    assert_eq!(
        reader
            .read(&obj, 0, 5000, &AccessContext::default())
            .await
            .expect("read"),
        vec![9u8; 5000]
    );
}

#[tokio::test]
async fn local_directory_store_detects_changed_objects() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("sub")).expect("mkdir");
    std::fs::write(dir.path().join("sub/f.txt"), b"version one").expect("write");
    let url = format!("file://{}", dir.path().display());
    let store = BackingStore::from_url(&url, &StoreOptions::default()).expect("open");
    let listing = store.list_dir("").await.expect("list");
    assert_eq!(listing.dirs, vec!["sub".to_string()]);
    let obj = store.head("sub/f.txt").await.expect("head");
    assert_eq!(
        store.get_range(&obj, 0..7).await.expect("get"),
        Bytes::from_static(b"version")
    );
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(dir.path().join("sub/f.txt"), b"version two, longer").expect("rewrite");
    assert!(matches!(
        store.get_range(&obj, 0..7).await,
        Err(CacheError::Changed(_))
    ));
    assert!(matches!(
        BackingStore::from_url("file:///definitely/not/here", &StoreOptions::default()),
        Err(CacheError::InvalidArgument(_))
    ));
    assert!(BackingStore::from_url("ftp://x", &StoreOptions::default()).is_err());
}

fn shape(part_size: usize, in_flight: usize) -> strata_cache_core::store::UploadShape {
    strata_cache_core::store::UploadShape {
        part_size,
        in_flight,
        slots: None,
        only_if_absent: false,
    }
}

#[tokio::test]
async fn an_upload_never_has_more_parts_than_the_store_takes_and_a_failed_one_leaves_nothing() {
    let (store, f, _) = faulty_holding(FaultConfig::default(), "seed", Bytes::from("x")).await;
    let data: Vec<u8> = (0..25_000u32).map(|i| (i % 251) as u8).collect();
    let body = Bytes::from(data.clone());
    // Parts of 1 byte asked for: 25,000 would be over S3's 10,000, so they grow to 3.
    store
        .upload("big", data.len() as u64, &shape(1, 16), |off, len| {
            let b = body.slice(off as usize..off as usize + len);
            async move { Ok(b) }
        })
        .await
        .expect("upload");
    assert!(f.parts_put() <= 10_000, "parts: {}", f.parts_put());
    let obj = store.head("big").await.expect("head");
    let got = store.get_range(&obj, 0..obj.size).await.expect("get");
    assert_eq!(&got[..], &data[..]);
    // Parts failing after the second: an error, and no object at all.
    f.set_config(FaultConfig {
        fail_parts_after: Some(2),
        ..Default::default()
    });
    let body = Bytes::from(vec![7u8; 64]);
    let e = store
        .upload("broken", 64, &shape(8, 2), |off, len| {
            let b = body.slice(off as usize..off as usize + len);
            async move { Ok(b) }
        })
        .await
        .expect_err("parts fail");
    assert!(matches!(e, CacheError::Store { .. }), "{e}");
    f.set_config(FaultConfig::default());
    assert!(matches!(
        store.head("broken").await,
        Err(CacheError::NotFound(_))
    ));
}

#[tokio::test]
async fn odd_names_and_prefixes_are_the_keys_listed_read_and_uploaded() {
    // A prefix and names object_store's Path::from would percent-encode.
    let store =
        BackingStore::from_url("memory://50%off/ünï", &StoreOptions::default()).expect("store");
    let body = Bytes::from(vec![9u8; 3000]);
    store.put("d/a b#1.bin", body.clone()).await.expect("put");
    // Multipart through the store's parts by index, under the same prefix.
    let big: Vec<u8> = (0..20_000u32).map(|i| (i % 7) as u8).collect();
    let big_body = Bytes::from(big.clone());
    store
        .upload(
            "d/ünïcødé.bin",
            big.len() as u64,
            &shape(4096, 2),
            |off, len| {
                let b = big_body.slice(off as usize..off as usize + len);
                async move { Ok(b) }
            },
        )
        .await
        .expect("upload");
    let listed = store.list_dir("d").await.expect("list");
    let mut names: Vec<String> = listed.files.iter().map(|f| f.path.to_string()).collect();
    names.sort();
    assert_eq!(names, vec!["d/a b#1.bin", "d/ünïcødé.bin"]);
    for f in &listed.files {
        let got = store.get_range(f, 0..f.size).await.expect("read as listed");
        let want: &[u8] = if f.path.ends_with(".bin") && f.size == 3000 {
            &body
        } else {
            &big
        };
        assert_eq!(&got[..], want, "{}", f.path);
    }
    store
        .rename("d/a b#1.bin", "d/50%.bin")
        .await
        .expect("rename");
    assert!(store.head("d/50%.bin").await.is_ok());
    store.delete("d/50%.bin").await.expect("delete");
    assert!(matches!(
        store.head("d/50%.bin").await,
        Err(CacheError::NotFound(_))
    ));
}

/// Black-box finding (round 18): with `s3:DeleteObject` denied on `raw/*`, `mv raw/b
/// work/b` failed (EIO, after 8 attempts) and the copy stayed under the new name. The
/// refusal is EACCES at once and the copy is deleted again: the store is as it was.
#[tokio::test]
async fn a_move_whose_source_may_not_be_deleted_is_undone() {
    let (store, faulty, _) = faulty_holding(
        FaultConfig::default(),
        "raw/b",
        Bytes::from_static(b"source"),
    )
    .await;
    faulty.set_config(FaultConfig {
        denied_delete: Some("raw/".into()),
        ..FaultConfig::default()
    });
    let e = store
        .rename_new("raw/b", "work/b", 6)
        .await
        .expect_err("refused");
    assert!(matches!(e, CacheError::PermissionDenied(_)), "{e}");
    assert!(matches!(
        store.head("work/b").await,
        Err(CacheError::NotFound(_))
    ));
    assert_eq!(store.head("raw/b").await.expect("source kept").size, 6);
    let e = store.rename("raw/b", "work/c").await.expect_err("refused");
    assert!(matches!(e, CacheError::PermissionDenied(_)), "{e}");
}

/// Black-box finding: every read(2) of a local store's file failing EIO (a failing
/// disk) was asked again for 80 s and reported as "object store timed out". A body
/// the store fails is asked for as often as any request, then fails with the store's
/// error.
#[tokio::test]
async fn a_body_the_store_fails_each_time_fails_with_its_error_after_the_attempts() {
    let data = Bytes::from(vec![5u8; 32_768]);
    let retry = RetryPolicy {
        total_timeout: Duration::from_secs(60),
        ..quick_retry()
    };
    let (store, f, obj) = faulty_holding_with(retry, FaultConfig::default(), "r.bin", data).await;
    f.set_config(FaultConfig {
        body_error_key: Some("r.bin".into()),
        ..FaultConfig::default()
    });
    let started = Instant::now();
    let e = store
        .get_range_blocks(&obj, 0..32_768, 4096, &|_, _| {})
        .await
        .expect_err("the body fails every time");
    assert!(
        matches!(e, CacheError::Store { .. }),
        "the store's error, not a time-out: {e}"
    );
    assert!(e.to_string().contains("Input/output error"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// Black-box findings (round 20): a failed request of one mount showed in every mount's
/// `store_failures` (the mounts' handles shared one count), and a multipart upload
/// that failed on the store was not counted at all. Handles made apart count apart,
/// and an upload that fails counts once.
#[tokio::test]
async fn each_handle_counts_its_own_failures_uploads_included() {
    let (store, f, obj) = faulty_holding(FaultConfig::default(), "seed", Bytes::from("x")).await;
    let (one, two) = (
        store.clone().with_own_counts(),
        store.clone().with_own_counts(),
    );
    f.set_config(FaultConfig {
        fail_parts_after: Some(2),
        ..Default::default()
    });
    let body = Bytes::from(vec![7u8; 64]);
    one.upload("broken", 64, &shape(8, 2), |off, len| {
        let b = body.slice(off as usize..off as usize + len);
        async move { Ok(b) }
    })
    .await
    .expect_err("parts fail");
    assert_eq!((one.failures(), two.failures()), (1, 0), "the upload, once");
    f.set_config(FaultConfig {
        down: true,
        ..Default::default()
    });
    two.get_range(&obj, 0..1).await.expect_err("down");
    assert_eq!(
        (one.failures(), two.failures()),
        (1, 1),
        "the read, its handle's"
    );
}
