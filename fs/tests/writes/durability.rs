//! Durability: fsync records on the cache disk, and what a restart or crash uploads.

use super::*;

/// Black-box finding (round 10): every fsync uploaded the whole file again, so a log
/// fsync'd per line or sqlite committing uploaded the square of the file (1,000 lines
/// of 100 bytes: 50 MB sent). An fsync now makes the staged file durable on the cache
/// disk with a record of where it goes, and the close uploads it once; a crash before
/// the close loses nothing fsync'd: the next start uploads it to its name.
#[tokio::test]
async fn fsync_is_durable_on_the_cache_disk_and_the_close_uploads_once() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        let uploads = || {
            c.counters()
                .uploads
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let (_, fh) = c.create(ROOT_INO, "app.log", 0).await.expect("create");
        let mut want = Vec::new();
        for i in 0..50u32 {
            let line = format!("line {i}\n");
            c.write(fh, want.len() as u64, line.as_bytes())
                .expect("write");
            want.extend_from_slice(line.as_bytes());
            c.fsync(fh).await.expect("fsync");
        }
        assert_eq!(uploads(), 0, "no upload per fsync");
        assert!(stored(&fx, "app.log").await.is_none());
        c.close(fh, 0).await.expect("close uploads");
        c.release_write(fh).await;
        assert_eq!(uploads(), 1);
        assert_eq!(stored(&fx, "app.log").await, Some(want.clone()));

        // A crash after an fsync: the handle is never closed, and the next start of a
        // mount over the same staging folder uploads what was fsync'd.
        let (_, fh) = c.create(ROOT_INO, "db.sqlite", 0).await.expect("create");
        c.write(fh, 0, &data(100 << 10, 4)).expect("write");
        c.fsync(fh).await.expect("fsync");
        c.write(fh, 100 << 10, b"not fsync'd, may be lost")
            .expect("write");
        let after_crash = restarted(&fx, staging_dir.clone(), "mem");
        assert!(
            stored(&fx, "db.sqlite").await.is_none(),
            "not before the restart"
        );
        after_crash.recover_journaled(&tokio::runtime::Handle::current());
        let got = stored_within(&fx, "db.sqlite", Duration::from_secs(5))
            .await
            .expect("uploaded at the restart");
        assert_eq!(
            &got[..100 << 10],
            &data(100 << 10, 4)[..],
            "what was fsync'd"
        );
        // Counted as the mount's upload, as a close's is (black-box finding: the
        // replay's uploads were missing from stats and /metrics).
        let replayed = || {
            after_crash
                .counters()
                .uploads
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        for _ in 0..250 {
            if replayed() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(replayed(), 1, "the replay's upload counted");
        let bytes = after_crash
            .counters()
            .upload_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(bytes >= 100 << 10, "its bytes counted: {bytes}");
        // An unlinked file's record goes with it: nothing to upload after a crash.
        let (_, fh2) = c.create(ROOT_INO, "scratch", 0).await.expect("create");
        c.write(fh2, 0, b"tmp").expect("write");
        c.fsync(fh2).await.expect("fsync");
        let before = fsync_records(&staging_dir);
        c.unlink(ROOT_INO, "scratch").await.ok();
        assert_eq!(
            fsync_records(&staging_dir),
            before - 1,
            "its record removed"
        );
        let _crashed = fh; // never closed, as after a kill
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 21): after a crash, the files fsync'd before it were
/// ENOENT until the start's replay uploaded each; an O_EXCL create of one succeeded
/// (the replay then dropped the fsync'd bytes) and `rm` answered ENOENT, the file
/// coming back. The start now says when each was tried once (the mount waits for that
/// before appearing), and while one is still on its way (here the store refuses writes)
/// an exclusive create of its name is EEXIST and an unlink drops its upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_fsyncd_before_a_crash_exist_while_the_start_uploads_them() {
    timed(async {
        let fx = fixture(|o, _| {
            o.writes.as_mut().expect("writes").allow_delete = true;
        })
        .await;
        let c = &fx.core;
        for (name, seed) in [("lock", 1u8), ("gone", 2)] {
            let (_, fh) = c.create(ROOT_INO, name, 0).await.expect("create");
            c.write(fh, 0, &data(4096, seed)).expect("write");
            c.fsync(fh).await.expect("fsync");
        }
        // The crash; the store refuses writes at the restart.
        fx.faulty.set_config(FaultConfig {
            writes_down: true,
            ..Default::default()
        });
        let (engine, _) = restarted_parts(&fx, "mem");
        let store = strata_cache_core::BackingStore::new(
            fx.faulty.clone() as Arc<dyn ObjectStore>,
            "mem",
            strata_cache_core::RetryPolicy {
                attempts: 2,
                base_backoff: Duration::from_millis(10),
                ..Default::default()
            },
        );
        let mut w = WriteOptions::new(staging_dir(&fx));
        w.allow_delete = true;
        w.allow_overwrite = true;
        let after = core_writing(engine, store, w);
        let tried = after
            .recover_journaled(&tokio::runtime::Handle::current())
            .expect("files to upload");
        tokio::task::spawn_blocking(move || tried.recv_timeout(Duration::from_secs(15)))
            .await
            .expect("joined")
            .expect("each tried once");
        assert!(stored(&fx, "lock").await.is_none(), "writes refused");
        let e = after
            .create_with(ROOT_INO, "lock", 0, libc::O_EXCL)
            .await
            .expect_err("the fsync'd file exists");
        assert_eq!(e.errno(), libc::EEXIST);
        // Round 21b: an open that keeps the content (`>>`) started from nothing and the
        // fsync'd bytes were dropped; a rename onto the name was overwritten by them.
        let e = after
            .create_with(ROOT_INO, "lock", 0, libc::O_APPEND)
            .await
            .expect_err("not until the fsync'd bytes land");
        assert_eq!(e.errno(), libc::EBUSY);
        let e = after
            .create_with(ROOT_INO, "lock", 0, libc::O_TRUNC)
            .await
            .expect_err("nor replaced while its upload may be on the wire");
        assert_eq!(e.errno(), libc::EBUSY);
        let (_, tmp) = after.create(ROOT_INO, "tmp", 0).await.expect("create");
        after.write(tmp, 0, b"new").expect("write");
        let e = after
            .rename(ROOT_INO, "tmp", ROOT_INO, "lock", false)
            .await
            .expect_err("not onto a name being uploaded");
        assert_eq!(e.errno(), libc::EBUSY);
        after.unlink(ROOT_INO, "gone").await.expect("removed");
        fx.faulty.set_config(FaultConfig::default());
        // The replay's next round (5 s after the first) lands the one, drops the other.
        let got = stored_within(&fx, "lock", Duration::from_secs(12))
            .await
            .expect("the fsync'd file lands once the store takes writes");
        assert_eq!(got, data(4096, 1));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(stored(&fx, "gone").await.is_none(), "the removal stands");
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 18, docs audit): with `--metadata-ttl indefinite`, a
/// folder made by `mkdir` and given a file through the mount was missing from its
/// parent after a restart with the store silent (its file ENOENT): the folder is
/// logged in its parent once its first file is uploaded.
#[tokio::test]
async fn a_made_folder_with_a_file_is_found_at_a_restart_with_the_store_down() {
    timed(async {
        let fx = fixture(|o, dir| {
            o.metadata_ttl = strata_fs::filesystem::METADATA_TTL_INDEFINITE;
            o.listing_log = Some(dir.join("metadata/m.jsonl"));
        })
        .await;
        let c = &fx.core;
        let fh = c.opendir(ROOT_INO).await.expect("opendir");
        c.readdir(fh, 0, 100)
            .await
            .expect("the root listed, and logged");
        let nd = c.mkdir(ROOT_INO, "nd").await.expect("mkdir");
        let (_, f) = c.create(nd.attr.ino, "f.txt", 0).await.expect("create");
        c.write(f, 0, b"in a new folder").expect("write");
        c.close(f, 0).await.expect("close uploads");
        c.release_write(f).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        fx.faulty.set_config(FaultConfig {
            down: true,
            ..Default::default()
        });
        let (engine, store) = restarted_parts(&fx, "mem");
        let after = Arc::new(FsCore::new(
            ObjectReader::new(engine, store, BS).expect("reader"),
            "",
            CoreOptions {
                metadata_ttl: strata_fs::filesystem::METADATA_TTL_INDEFINITE,
                listing_log: Some(fx.dir.path().join("metadata/m.jsonl")),
                ..Default::default()
            },
        ));
        let nd = after
            .lookup(ROOT_INO, "nd")
            .await
            .expect("the folder, as logged");
        assert_eq!(nd.attr.kind, strata_fs::filesystem::Kind::Dir);
        let f = after
            .lookup(nd.attr.ino, "f.txt")
            .await
            .expect("its file, as logged");
        assert_eq!(f.attr.size, 15);
    })
    .await
    .expect("bounded");
}

/// Crash findings (round 11) on the fsync records of files a crash left unclosed:
/// (1) the next mount at the mountpoint uploaded them whatever store it showed (a
/// checkpoint of one bucket landed in another); (2) a start killed after its recovery
/// upload landed, before the record went, left a record every later start reported as
/// failed ("already exists") and kept; (3) once those names were deleted through the
/// mount, the next start uploaded them again. Now a record goes to its own store only;
/// an object already holding its bytes completes it; a name changed through the mount
/// supersedes it.
#[tokio::test]
async fn fsync_records_go_to_their_own_store_once_and_yield_to_later_changes() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        let ckpt = data(100 << 10, 7);
        let (_, a) = c.create(ROOT_INO, "ckpt.bin", 0).await.expect("create");
        c.write(a, 0, &ckpt).expect("write");
        c.fsync(a).await.expect("fsync");
        let (_, b) = c.create(ROOT_INO, "later.bin", 0).await.expect("create");
        c.write(b, 0, b"fsync'd, then replaced").expect("write");
        c.fsync(b).await.expect("fsync");
        let _crashed = (a, b); // never closed, as after a kill
        assert_eq!(fsync_records(&staging_dir), 2);

        // (1) Another source mounted there: nothing uploaded, the records kept.
        let other = restarted(&fx, staging_dir.clone(), "s3://another-bucket");
        other.recover_journaled(&tokio::runtime::Handle::current());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            stored(&fx, "ckpt.bin").await.is_none(),
            "not into another store"
        );
        assert_eq!(
            fsync_records(&staging_dir),
            2,
            "kept for a mount of their own store"
        );
        drop(other);

        // (2) An earlier start's upload of ckpt.bin landed before it was killed.
        fx.mem
            .put_opts(
                &"ckpt.bin".into(),
                Bytes::from(ckpt.clone()).into(),
                Default::default(),
            )
            .await
            .expect("landed");
        // (3) later.bin was written anew through the mount before its record's turn.
        let own = restarted(&fx, staging_dir.clone(), "mem");
        let (_, n) = own.create(ROOT_INO, "later.bin", 0).await.expect("create");
        own.write(n, 0, b"the newer file").expect("write");
        own.close(n, 0).await.expect("close");
        own.release_write(n).await;
        own.recover_journaled(&tokio::runtime::Handle::current());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while fsync_records(&staging_dir) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            fsync_records(&staging_dir),
            0,
            "both records completed, none kept"
        );
        assert_eq!(stored(&fx, "ckpt.bin").await, Some(ckpt));
        assert_eq!(
            stored(&fx, "later.bin").await.as_deref(),
            Some(&b"the newer file"[..]),
            "the newer file stays"
        );
    })
    .await
    .expect("bounded");
}

/// The endpoint became part of a store's identity (a bucket of one name at another S3
/// service is another store): records written before, naming the bucket alone, are
/// still uploaded by the same bucket's mount after the upgrade; a record naming one
/// endpoint is kept from a mount of the bucket at another.
#[tokio::test]
async fn fsync_records_follow_the_endpoint_and_records_from_before_it_still_upload() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        let (_, a) = c.create(ROOT_INO, "old.bin", 0).await.expect("create");
        c.write(a, 0, b"fsync'd by a release that named no endpoint")
            .expect("write");
        c.fsync(a).await.expect("fsync");
        let _crashed = a;
        // (1) Written at E1 after the upgrade: kept from the same bucket at E2.
        let e1 = restarted_at(&fx, staging_dir.clone(), "mem", Some("http://e1:9000"));
        let (_, b) = e1.create(ROOT_INO, "new.bin", 0).await.expect("create");
        e1.write(b, 0, b"fsync'd at e1").expect("write");
        e1.fsync(b).await.expect("fsync");
        let _crashed = b;
        drop(e1);
        let e2 = restarted_at(&fx, staging_dir.clone(), "mem", Some("http://e2:9000"));
        e2.recover_journaled(&tokio::runtime::Handle::current());
        assert_eq!(
            stored_within(&fx, "old.bin", Duration::from_secs(10)).await,
            Some(b"fsync'd by a release that named no endpoint".to_vec()),
            "a record from before the endpoint counted is this bucket's"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            stored(&fx, "new.bin").await.is_none(),
            "not uploaded through another service"
        );
        assert_eq!(fsync_records(&staging_dir), 1, "kept for its own endpoint");
        drop(e2);
        let e1 = restarted_at(&fx, staging_dir.clone(), "mem", Some("http://e1:9000"));
        e1.recover_journaled(&tokio::runtime::Handle::current());
        assert_eq!(
            stored_within(&fx, "new.bin", Duration::from_secs(10)).await,
            Some(b"fsync'd at e1".to_vec())
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 13): a downgrade after a crash to a release from before the
/// fsync journal deleted the fsync'd file pending upload: such releases remove every
/// file at the top of the staging folder. Staged files now live in its `files` folder,
/// which they leave alone; records at the top (written by the releases between) are
/// still recovered.
#[tokio::test]
async fn fsync_records_survive_an_older_releases_cleanup_and_the_top_level_ones_upload() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "new.bin", 0).await.expect("create");
        c.write(fh, 0, b"fsync'd in the files folder")
            .expect("write");
        c.fsync(fh).await.expect("fsync");
        let _crashed = fh;
        // The older release's start: every file at the top of the staging folder goes.
        for e in std::fs::read_dir(&staging_dir).expect("read_dir").flatten() {
            if e.file_type().expect("type").is_file() {
                std::fs::remove_file(e.path()).expect("rm");
            }
        }
        assert_eq!(fsync_records(&staging_dir), 1, "kept in the files folder");
        // A record the releases between wrote at the top.
        std::fs::write(staging_dir.join("900.part"), b"fsync'd at the top").expect("write");
        std::fs::write(
            staging_dir.join("900.part.json"),
            r#"{"path": "old.bin", "only_if_absent": false, "source": "mem|"}"#,
        )
        .expect("write");
        let after = restarted(&fx, staging_dir.clone(), "mem");
        after.recover_journaled(&tokio::runtime::Handle::current());
        assert_eq!(
            stored_within(&fx, "new.bin", Duration::from_secs(10)).await,
            Some(b"fsync'd in the files folder".to_vec())
        );
        assert_eq!(
            stored_within(&fx, "old.bin", Duration::from_secs(10)).await,
            Some(b"fsync'd at the top".to_vec())
        );
    })
    .await
    .expect("bounded");
}

/// Crash finding (round 11): a start into a store outage tried the fsync'd file once,
/// and kept it out of the store until the next restart however soon the store came
/// back. The recovery tries again while the store does not answer.
#[tokio::test]
async fn an_fsync_record_is_uploaded_once_the_store_answers_again() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "ck", 0).await.expect("create");
        c.write(fh, 0, &data(50 << 10, 9)).expect("write");
        c.fsync(fh).await.expect("fsync");
        let _crashed = fh;
        fx.faulty.set_config(FaultConfig {
            down: true,
            writes_down: true,
            ..Default::default()
        });
        let after = restarted(&fx, staging_dir, "mem");
        after.recover_journaled(&tokio::runtime::Handle::current());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(stored(&fx, "ck").await.is_none(), "the store is down");
        fx.faulty.set_config(FaultConfig::default());
        assert_eq!(
            stored_within(&fx, "ck", Duration::from_secs(15)).await,
            Some(data(50 << 10, 9)),
            "uploaded once the store is back"
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 18): the store answering 503 for a few seconds at the close
/// of an fsync'd file failed the close and deleted the file, while a crash at that
/// moment would have kept and uploaded it. It is kept (with what was written after the
/// fsync) and uploaded once the store answers; a file never fsync'd is not.
#[tokio::test]
async fn an_fsyncd_file_whose_close_the_store_did_not_answer_is_uploaded_later() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "ck", 0).await.expect("create");
        c.write(fh, 0, &data(50 << 10, 9)).expect("write");
        c.fsync(fh).await.expect("fsync");
        c.write(fh, 50 << 10, b"tail")
            .expect("write after the fsync");
        let (_, plain) = c.create(ROOT_INO, "plain", 0).await.expect("create");
        c.write(plain, 0, b"never fsync'd").expect("write");
        fx.faulty.set_config(FaultConfig {
            writes_down: true,
            ..Default::default()
        });
        assert!(
            c.close(fh, 0).await.is_err(),
            "the close reports the failure"
        );
        c.release_write(fh).await;
        assert!(c.close(plain, 0).await.is_err());
        c.release_write(plain).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(stored(&fx, "ck").await.is_none(), "the store is down");
        fx.faulty.set_config(FaultConfig::default());
        let mut want = data(50 << 10, 9);
        want.extend_from_slice(b"tail");
        assert_eq!(
            stored_within(&fx, "ck", Duration::from_secs(15)).await,
            Some(want),
            "uploaded once the store is back, as closed"
        );
        assert!(
            stored(&fx, "plain").await.is_none(),
            "a close's failure stands"
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 18b): a file kept after its close's upload failed, whose
/// name another writer took meanwhile, was kept to land once that object was deleted
/// (rm, restart: the old bytes back). It is dropped. (Its folder removed meanwhile is
/// the round's repro: a check against the first attempt's pause, too tight for a test
/// on a loaded CI machine.)
#[tokio::test]
async fn a_kept_file_whose_name_was_taken_is_dropped() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let (_, t) = c.create(ROOT_INO, "taken.pt", 0).await.expect("create");
        c.write(t, 0, b"older").expect("write");
        c.fsync(t).await.expect("fsync");
        fx.faulty.set_config(FaultConfig {
            writes_down: true,
            ..Default::default()
        });
        assert!(c.close(t, 0).await.is_err());
        c.release_write(t).await;
        fx.faulty.set_config(FaultConfig::default());
        put_elsewhere(&fx, "taken.pt", b"newer, by another writer".to_vec()).await;
        // The first attempt comes 5 s after the close.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while !staged_files(&staging_dir(&fx)).is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the copy is still kept"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            stored(&fx, "taken.pt").await.as_deref(),
            Some(&b"newer, by another writer"[..])
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 14, fsx): a file fsync'd into a new folder before a crash was
/// uploaded at the next start, but the folder never joined the root's cached listing:
/// `ls` and `stat` said ENOENT until the listing's TTL ran out, for good with
/// `--metadata-ttl indefinite`. Its folders show once it is uploaded.
#[tokio::test]
async fn a_file_recovered_into_a_new_folder_shows_with_its_folder() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        let d = c.mkdir(ROOT_INO, "step9").await.expect("mkdir");
        let e = c.mkdir(d.attr.ino, "shard").await.expect("mkdir");
        let (_, fh) = c.create(e.attr.ino, "h", 0).await.expect("create");
        c.write(fh, 0, b"fsync'd").expect("write");
        c.fsync(fh).await.expect("fsync");
        let _crashed = fh; // never closed, as after a kill

        let (engine, store) = restarted_parts(&fx, "mem");
        let mut w = WriteOptions::new(staging_dir.clone());
        w.part_size = 64 << 10;
        let own = Arc::new(FsCore::new(
            ObjectReader::new(engine, store, BS).expect("reader"),
            "",
            CoreOptions {
                writes: Some(w),
                metadata_ttl: strata_fs::filesystem::METADATA_TTL_INDEFINITE,
                ..Default::default()
            },
        ));
        // The job's start lists and looks up before the recovery upload lands.
        assert!(!names_in(&own, ROOT_INO)
            .await
            .contains(&"step9".to_string()));
        assert!(own.lookup(ROOT_INO, "step9").await.is_err());
        own.recover_journaled(&tokio::runtime::Handle::current());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while fsync_records(&staging_dir) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            stored(&fx, "step9/shard/h").await.as_deref(),
            Some(&b"fsync'd"[..])
        );
        assert!(names_in(&own, ROOT_INO)
            .await
            .contains(&"step9".to_string()));
        let d = own
            .lookup(ROOT_INO, "step9")
            .await
            .expect("the folder shows");
        let e = own
            .lookup(d.attr.ino, "shard")
            .await
            .expect("and its folder");
        assert_eq!(names_in(&own, e.attr.ino).await, vec!["h".to_string()]);
        assert_eq!(
            own.lookup(e.attr.ino, "h")
                .await
                .expect("the file")
                .attr
                .size,
            7
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (EIO on the cache disk): one EIO reading an fsync record at start
/// deleted the record and the fsync'd file with it, and the file never reached the
/// store. A record that cannot be read now (here ELOOP) is kept with its file for the
/// next start; one that is not valid is kept with its file too, never uploaded.
#[tokio::test]
async fn an_fsync_record_that_cannot_be_read_keeps_its_file() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "ckpt", 0).await.expect("create");
        c.write(fh, 0, &data(3000, 7)).expect("write");
        c.fsync(fh).await.expect("fsync");
        let (_, fh2) = c.create(ROOT_INO, "torn", 0).await.expect("create");
        c.write(fh2, 0, b"fsync'd").expect("write");
        c.fsync(fh2).await.expect("fsync");
        let _crashed = (fh, fh2); // never closed, as after a kill

        let record = record_of(&staging_dir, "ckpt");
        let body = std::fs::read(&record).expect("read");
        std::fs::remove_file(&record).expect("rm");
        // Opening it fails (ELOOP), as an EIO would: an error of the disk, not of it.
        std::os::unix::fs::symlink(record.file_name().expect("name"), &record).expect("loop");
        let torn = record_of(&staging_dir, "torn");
        std::fs::write(&torn, b"{\"path\": \"to").expect("tear");

        let after = restarted(&fx, staging_dir.clone(), "mem");
        after.recover_journaled(&tokio::runtime::Handle::current());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(stored(&fx, "ckpt").await.is_none());
        assert!(stored(&fx, "torn").await.is_none());
        assert!(file_of(&record).is_file(), "the fsync'd file kept");
        assert!(
            std::fs::symlink_metadata(&record).is_ok(),
            "its record kept"
        );
        assert!(file_of(&torn).is_file(), "a torn record's file kept");
        assert!(torn.is_file(), "and the torn record");

        // Readable again: the next start uploads it.
        std::fs::remove_file(&record).expect("rm");
        std::fs::write(&record, body).expect("restore");
        let again = restarted(&fx, staging_dir.clone(), "mem");
        again.recover_journaled(&tokio::runtime::Handle::current());
        assert_eq!(
            stored_within(&fx, "ckpt", Duration::from_secs(5)).await,
            Some(data(3000, 7))
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (power cut on ext4 `data=writeback,nodelalloc`): the replay
/// uploaded the staged file as the disk had it, its unsynced tail included, which
/// held a deleted file's bytes. The record names the fsync'd length and crc32c: after
/// a power cut the replay uploads that much, and nothing when those bytes do not check.
#[tokio::test]
async fn the_replay_uploads_what_was_fsyncd_and_only_if_it_checks() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "ckpt", 0).await.expect("create");
        c.write(fh, 0, &data(100_000, 3)).expect("write");
        c.fsync(fh).await.expect("fsync");
        c.write(fh, 100_000, &data(40_000, 9)).expect("write");
        let (_, fh2) = c.create(ROOT_INO, "db", 0).await.expect("create");
        c.write(fh2, 0, &data(5000, 5)).expect("write");
        c.fsync(fh2).await.expect("fsync");
        let _crashed = (fh, fh2); // never closed, as after a kill
                                  // What the disk holds of the fsync'd bytes is not what was synced.
        let db = file_of(&record_of(&staging_dir, "db"));
        std::os::unix::fs::FileExt::write_all_at(
            &std::fs::OpenOptions::new()
                .write(true)
                .open(&db)
                .expect("open"),
            b"STALE",
            100,
        )
        .expect("garble");
        before_a_power_cut(&staging_dir, "ckpt");
        before_a_power_cut(&staging_dir, "db");

        let after = restarted(&fx, staging_dir.clone(), "mem");
        after.recover_journaled(&tokio::runtime::Handle::current());
        assert_eq!(
            stored_within(&fx, "ckpt", Duration::from_secs(5)).await,
            Some(data(100_000, 3)),
            "exactly the fsync'd bytes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(stored(&fx, "db").await.is_none(), "not uploaded");
        assert!(db.is_file(), "kept");
    })
    .await
    .expect("bounded");
}

/// Black-box finding (lifecycle F9): a staging folder is named after the mountpoint as
/// given, so a file fsync'd through a mount at a symlink was never uploaded by the
/// restart at the folder it names (nor the other way round). Records name the
/// canonical mountpoint, and a start takes those of its own from the other folders.
#[tokio::test]
async fn a_record_is_uploaded_by_a_mount_at_its_directory_spelt_another_way() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let staging = fx.dir.path().join("staging");
        let (link, other) = (staging.join("_m_link-1"), staging.join("_m_other-3"));
        for (dir, mp, name) in [
            (&link, "/m/real", "ckpt"),
            (&other, "/m/elsewhere", "theirs"),
        ] {
            let c = restarted_mounted(&fx, dir.clone(), "mem", None, Some(mp));
            let (_, fh) = c.create(ROOT_INO, name, 0).await.expect("create");
            c.write(fh, 0, name.as_bytes()).expect("write");
            c.fsync(fh).await.expect("fsync");
            assert_eq!(Arc::strong_count(&c), 1, "its mount gone, as after a kill");
        }
        let real = restarted_mounted(&fx, staging.join("_m_real-2"), "mem", None, Some("/m/real"));
        real.recover_journaled(&tokio::runtime::Handle::current());
        assert_eq!(
            stored_within(&fx, "ckpt", Duration::from_secs(5)).await,
            Some(b"ckpt".to_vec())
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while fsync_records(&link) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(fsync_records(&link), 0, "its record done");
        assert!(
            stored(&fx, "theirs").await.is_none(),
            "another mountpoint's"
        );
        assert_eq!(fsync_records(&other), 1, "kept for it");
    })
    .await
    .expect("bounded");
}

/// A crash of the daemon alone (the cache file system's page cache kept) uploads the
/// fsync'd file as it was written, past its last fsync too, as a local file keeps what
/// a killed process wrote: the check of what was fsync'd is for a power cut.
#[tokio::test]
async fn after_a_daemon_crash_the_replay_uploads_the_file_as_written() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "db", 0).await.expect("create");
        c.write(fh, 0, &data(5000, 5)).expect("write");
        c.fsync(fh).await.expect("fsync");
        // A page rewritten and a tail appended, not fsync'd yet.
        c.write(fh, 100, b"NEW PAGE").expect("write");
        c.write(fh, 5000, b"tail").expect("write");
        let _crashed = fh; // never closed, as after a kill
        let mut want = data(5000, 5);
        want[100..108].copy_from_slice(b"NEW PAGE");
        want.extend_from_slice(b"tail");

        let after = restarted(&fx, staging_dir.clone(), "mem");
        after.recover_journaled(&tokio::runtime::Handle::current());
        assert_eq!(
            stored_within(&fx, "db", Duration::from_secs(5)).await,
            Some(want)
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 16): inode numbers start again at each daemon start and
/// the generation was always 1, so a file handle saved before a remount
/// (`name_to_handle_at`, an NFS re-export) opened whatever file got its number next.
/// Each start's inodes carry a generation of their own: the old handle is ESTALE.
#[tokio::test]
async fn a_restart_gives_its_inodes_another_generation() {
    let before = fixture(|_, _| {}).await;
    let after = fixture(|_, _| {}).await;
    let a = before.core.lookup(ROOT_INO, "old").await.expect("old");
    let b = after.core.lookup(ROOT_INO, "data").await.expect("data");
    assert_eq!(a.attr.ino, b.attr.ino, "the same number, another file");
    assert_ne!(a.generation, b.generation);
    let again = before.core.lookup(ROOT_INO, "old").await.expect("old");
    assert_eq!(
        (again.attr.ino, again.generation),
        (a.attr.ino, a.generation)
    );
}

/// Black-box finding (round 16b): a file changed in place (opened to append), fsync'd,
/// then the daemon killed; another writer replaced the object while it was down; the
/// next start uploaded the fsync'd file (the old version plus the append) over the
/// newer object. The record names the version it changes: the replay uploads only
/// over that one, and otherwise drops the file, as its close would have.
#[tokio::test]
async fn the_replay_never_puts_a_changed_file_over_a_newer_object() {
    timed(async {
        let fx = fixture_replacing().await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        for name in ["kept.txt", "replaced.txt"] {
            put_elsewhere(&fx, &format!("data/{name}"), b"BASE".repeat(250)).await;
        }
        let dir = c.lookup(ROOT_INO, "data").await.expect("data");
        let mut crashed = Vec::new();
        for name in ["kept.txt", "replaced.txt"] {
            let e = c.lookup(dir.attr.ino, name).await.expect("lookup");
            let o = c
                .open_write(e.attr.ino, false, 0)
                .await
                .expect("open to append");
            c.write(o.fh, 1000, &b"MINE".repeat(300)).expect("append");
            c.fsync(o.fh).await.expect("fsync");
            crashed.push(o.fh); // never closed, as after a kill
        }
        put_elsewhere(&fx, "data/replaced.txt", b"NEWER".repeat(100)).await;
        let after = restarted(&fx, staging_dir.clone(), "mem");
        after.recover_journaled(&tokio::runtime::Handle::current());
        let mut want = b"BASE".repeat(250);
        want.extend_from_slice(&b"MINE".repeat(300));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while stored(&fx, "data/kept.txt").await.as_deref() != Some(&want[..])
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            stored(&fx, "data/kept.txt").await.as_deref(),
            Some(&want[..]),
            "over the version it changed: uploaded"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            stored(&fx, "data/replaced.txt").await.as_deref(),
            Some(&b"NEWER".repeat(100)[..]),
            "the newer object stays"
        );
        // Dropped, as its close would have failed ESTALE and dropped it (black-box
        // finding, round 21: kept, it failed again with an ERROR at every start and
        // held its bytes in staging for good, counted nowhere).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while fsync_records(&staging_dir) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            fsync_records(&staging_dir),
            0,
            "the changed file's copy dropped"
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 20): with `--allow-overwrite`, a file made new (or replaced
/// whole) and fsync'd before a crash was uploaded by the next start over the newer
/// object another writer put under its name meanwhile (a job on another mount, or on a
/// release rolled back to). The record names what the file replaced: the replay
/// uploads only over that, and drops the older copy otherwise.
#[tokio::test]
async fn the_replay_never_puts_a_new_file_over_a_newer_object() {
    timed(async {
        let fx = fixture_replacing().await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        for name in ["over.bin", "over-quiet.bin", "renamed.bin"] {
            put_elsewhere(&fx, &format!("data/{name}"), b"OLD".to_vec()).await;
        }
        let dir = c.lookup(ROOT_INO, "data").await.expect("data");
        let mut crashed = Vec::new();
        for name in [
            "new.bin",
            "new-quiet.bin",
            "over.bin",
            "over-quiet.bin",
            "tmp.bin",
        ] {
            let fh = if name.starts_with("new") || name == "tmp.bin" {
                c.create(dir.attr.ino, name, 0).await.expect("create").1
            } else {
                let e = c.lookup(dir.attr.ino, name).await.expect("lookup");
                c.open_write(e.attr.ino, true, 0)
                    .await
                    .expect("open O_TRUNC")
                    .fh
            };
            c.write(fh, 0, &b"FSYNCD".repeat(100)).expect("write");
            c.fsync(fh).await.expect("fsync");
            crashed.push(fh); // never closed, as after a kill
        }
        // Renamed over an object after its fsync (round 20b: the record kept the old
        // name's precondition, and the replay dropped it).
        c.rename(dir.attr.ino, "tmp.bin", dir.attr.ino, "renamed.bin", false)
            .await
            .expect("rename over");
        for name in ["new.bin", "over.bin"] {
            put_elsewhere(&fx, &format!("data/{name}"), b"NEWER".to_vec()).await;
        }
        let after = restarted(&fx, staging_dir.clone(), "mem");
        after.recover_journaled(&tokio::runtime::Handle::current());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while fsync_records(&staging_dir) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for name in ["new-quiet.bin", "over-quiet.bin", "renamed.bin"] {
            assert_eq!(
                stored(&fx, &format!("data/{name}")).await.as_deref(),
                Some(&b"FSYNCD".repeat(100)[..]),
                "{name}: nothing newer, uploaded"
            );
        }
        for name in ["new.bin", "over.bin"] {
            assert_eq!(
                stored(&fx, &format!("data/{name}")).await.as_deref(),
                Some(&b"NEWER"[..]),
                "{name}: the newer object stays"
            );
        }
        assert_eq!(fsync_records(&staging_dir), 0, "the older copies dropped");
    })
    .await
    .expect("bounded");
}
