//! Versions: replacing objects whole and only when allowed, never over what another
//! writer made meanwhile, and what readers of an older version see.

use super::*;

#[tokio::test]
async fn existing_objects_are_replaced_only_whole_and_only_when_allowed() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("old");
        let obj = c.lookup(old.attr.ino, "obj").await.expect("obj");
        let e = c.create(old.attr.ino, "obj", 0).await.expect_err("exists");
        assert_eq!(e.errno(), libc::EEXIST);
        let e = c
            .open_write(obj.attr.ino, false, 0)
            .await
            .expect_err("in place");
        assert_eq!(e.errno(), libc::EPERM);
        let e = c
            .open_write(obj.attr.ino, true, 0)
            .await
            .expect_err("no overwrite");
        assert_eq!(e.errno(), libc::EPERM);
        let e = c.unlink(old.attr.ino, "obj").await.expect_err("no delete");
        assert_eq!(e.errno(), libc::EPERM);
        let e = c
            .setattr(obj.attr.ino, Some(0), None)
            .await
            .expect_err("no resize without allow_overwrite");
        assert_eq!(e.errno(), libc::EPERM);
        assert_eq!(stored(&fx, "old/obj").await, Some(data(1000, 1)));

        let fx = fixture_replacing().await;
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("old");
        let obj = c.lookup(old.attr.ino, "obj").await.expect("obj");
        assert_eq!(read_back(c, obj.attr.ino).await, data(1000, 1));
        let o = c
            .open_write(obj.attr.ino, true, 0)
            .await
            .expect("overwrite");
        c.write(o.fh, 0, b"new content").expect("write");
        // Being written: a reader sees what was written so far, as on a local disk,
        // not the old object (and every read reaches the daemon: the file grows).
        let r = c
            .open(obj.attr.ino, false)
            .await
            .expect("open while written");
        assert!(r.direct_io);
        assert_eq!(
            c.read(r.fh, 0, 100, 0).await.expect("read").as_ref(),
            b"new content"
        );
        c.write(o.fh, 11, b"!").expect("write on");
        assert_eq!(c.read(r.fh, 11, 100, 0).await.expect("read").as_ref(), b"!");
        c.release(r.fh);
        c.setattr(obj.attr.ino, Some(11), None)
            .await
            .expect("truncate back");
        c.flush(o.fh).await.expect("flush");
        c.release_write(o.fh).await;
        assert_eq!(read_back(c, obj.attr.ino).await, b"new content".to_vec());
        // Changed in place (a log opened to append, a patch at an offset): its bytes are
        // read into staging at the open; an open and close without a write uploads
        // nothing, one with writes uploads the whole file.
        let uploads = || {
            c.counters()
                .uploads
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let before = uploads();
        let o = c
            .open_write(obj.attr.ino, false, 0)
            .await
            .expect("open to change");
        assert_eq!(read_staged(c, o.fh, 11).await, b"new content".to_vec());
        c.close(o.fh, 0).await.expect("close");
        c.release_write(o.fh).await;
        assert_eq!(uploads(), before, "nothing changed, nothing sent");
        let o = c
            .open_write(obj.attr.ino, false, 0)
            .await
            .expect("open to append");
        c.write(o.fh, 11, b", appended").expect("append");
        c.write(o.fh, 0, b"N").expect("patch");
        c.close(o.fh, 0).await.expect("close uploads");
        c.release_write(o.fh).await;
        assert_eq!(
            stored(&fx, "old/obj").await.as_deref(),
            Some(&b"New content, appended"[..])
        );
        assert_eq!(
            read_back(c, obj.attr.ino).await,
            b"New content, appended".to_vec()
        );
        // Over the bound: only replaced whole.
        let fx2 = fixture(|o, _| {
            let w = o.writes.as_mut().expect("writes");
            w.allow_overwrite = true;
            w.rewrite_max = 999;
        })
        .await;
        let old2 = fx2.core.lookup(ROOT_INO, "old").await.expect("old");
        let obj2 = fx2.core.lookup(old2.attr.ino, "obj").await.expect("obj");
        let e = fx2
            .core
            .open_write(obj2.attr.ino, false, 0)
            .await
            .expect_err("1000 bytes > 999");
        assert_eq!(e.errno(), libc::ENOTSUP);
        c.unlink(old.attr.ino, "obj").await.expect("delete");
        assert!(stored(&fx, "old/obj").await.is_none());
        let e = c.lookup(old.attr.ino, "obj").await.expect_err("gone");
        assert_eq!(e.errno(), libc::ENOENT);
    })
    .await
    .expect("bounded");
}

/// Black-box finding: on a mount that may not replace objects, a file created while
/// the mount's listing said its name was free overwrote the object another writer had
/// created there meanwhile. The upload now creates only: the close fails with EEXIST
/// and the other writer's object stays, for a single PUT, a multipart upload and a
/// file sent while written.
#[tokio::test]
async fn a_new_file_never_replaces_an_object_another_writer_created_meanwhile() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        // small: one PUT; big: a multipart upload; streamed: in order past stream_from.
        for (name, len, in_order) in [
            ("small", 1000, false),
            ("big", 300 << 10, false),
            ("streamed", 400 << 10, true),
        ] {
            let (_, fh) = c.create(dir.attr.ino, name, 0).await.expect("create");
            let mine = data(len, 9);
            if in_order {
                for (i, chunk) in mine.chunks(32 << 10).enumerate() {
                    c.write(fh, (i * (32 << 10)) as u64, chunk).expect("write");
                }
            } else {
                c.write(fh, 1, &mine[1..]).expect("tail");
                c.write(fh, 0, &mine[..1]).expect("head");
            }
            let theirs = Bytes::from(format!("another writer's {name}"));
            object_store::ObjectStoreExt::put(
                fx.mem.as_ref(),
                &format!("data/{name}").into(),
                theirs.clone().into(),
            )
            .await
            .expect("the other writer");
            let err = c.flush(fh).await.expect_err("refused");
            assert_eq!(err.errno(), libc::EEXIST, "{name}: {err}");
            c.release_write(fh).await;
            assert_eq!(
                stored(&fx, &format!("data/{name}")).await.as_deref(),
                Some(&theirs[..]),
                "{name}: the other writer's object stays"
            );
        }
        // A file of this mount uploaded twice (fsync, then more writes) replaces what
        // its own first upload made.
        let (_, fh) = c.create(dir.attr.ino, "twice", 0).await.expect("create");
        c.write(fh, 0, b"first").expect("write");
        c.flush(fh).await.expect("first upload (fsync)");
        c.write(fh, 5, b" and second").expect("write");
        c.flush(fh).await.expect("second upload");
        c.release_write(fh).await;
        assert_eq!(
            stored(&fx, "data/twice").await.as_deref(),
            Some(&b"first and second"[..])
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding: after an overwrite through the mount while another process still
/// had the old version open, `stat` showed the old size for the metadata TTL (a new
/// open read the new one). The inode written through stands for the new version; the
/// old version's handle no longer answers for it.
#[tokio::test]
async fn an_overwrite_shows_its_size_while_a_reader_holds_the_old_version() {
    timed(async {
        let fx = fixture(|o, _| {
            let w = o.writes.as_mut().expect("writes");
            w.allow_overwrite = true;
        })
        .await;
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("old");
        let obj = c.lookup(old.attr.ino, "obj").await.expect("obj");
        let reader = c.open(obj.attr.ino, false).await.expect("reader");
        assert_eq!(
            c.read(reader.fh, 0, 10, 1)
                .await
                .expect("old bytes")
                .as_ref(),
            &data(1000, 1)[..10]
        );
        let w = c
            .open_write(obj.attr.ino, true, 0)
            .await
            .expect("overwrite");
        c.write(w.fh, 0, b"short").expect("write");
        c.close(w.fh, 0).await.expect("close");
        c.release_write(w.fh).await;
        assert_eq!(
            c.getattr(obj.attr.ino).await.expect("stat").attr.size,
            5,
            "the written version's size"
        );
        assert_eq!(read_back(c, obj.attr.ino).await, b"short".to_vec());
        c.release(reader.fh);
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 10): a file another node replaced in the store within the
/// metadata TTL, its old version's bytes cached here, was changed in place (`>>`, an
/// `r+` patch, `truncate -s`) from the old version and uploaded whole over the new one,
/// exit code 0: the new version lost. An open to change a file now checks its version
/// with the store first; a changed one is ESTALE (the kernel looks the path up again),
/// and the change then applies to the current version.
#[tokio::test]
async fn a_change_in_place_applies_to_the_current_version_not_a_cached_older_one() {
    timed(async {
        let fx = fixture(|o, _| {
            o.writes.as_mut().expect("writes").allow_overwrite = true;
        })
        .await;
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("old");
        let obj = c.lookup(old.attr.ino, "obj").await.expect("obj");
        assert_eq!(read_back(c, obj.attr.ino).await, data(1000, 1), "cached");
        // Another writer publishes a new version behind the mount's back.
        put_elsewhere(&fx, "old/obj", data(2000, 9)).await;
        let e = c
            .open_write(obj.attr.ino, false, 0)
            .await
            .expect_err("an older version is not changed");
        assert_eq!(e.errno(), libc::ESTALE);
        let e = c
            .setattr(obj.attr.ino, Some(1500), None)
            .await
            .expect_err("nor truncated");
        assert_eq!(e.errno(), libc::ESTALE);
        assert_eq!(stored(&fx, "old/obj").await, Some(data(2000, 9)), "kept");
        // The kernel's retry: a fresh lookup, the current version, changed.
        let fresh = c.lookup(old.attr.ino, "obj").await.expect("lookup again");
        let o = c
            .open_write(fresh.attr.ino, false, 0)
            .await
            .expect("open the current version");
        c.write(o.fh, 2000, b"C\n").expect("append");
        c.close(o.fh, 0).await.expect("close uploads");
        c.release_write(o.fh).await;
        let mut want = data(2000, 9);
        want.extend_from_slice(b"C\n");
        assert_eq!(stored(&fx, "old/obj").await, Some(want));
        // Removed behind the mount's back: ESTALE too, and the lookup then finds nothing.
        let again = c.lookup(old.attr.ino, "obj").await.expect("lookup");
        object_store::ObjectStoreExt::delete(&*fx.mem, &object_store::path::Path::from("old/obj"))
            .await
            .expect("delete out of band");
        let e = c
            .open_write(again.attr.ino, false, 0)
            .await
            .expect_err("gone");
        assert_eq!(e.errno(), libc::ESTALE);
        let e = c.lookup(old.attr.ino, "obj").await.expect_err("gone");
        assert_eq!(e.errno(), libc::ENOENT);
    })
    .await
    .expect("bounded");
}

/// Black-box finding: an append closed over a version another writer put after the
/// open (and acknowledged), and that version was lost, the close reporting success.
/// The close finds the version it changes replaced: ESTALE, the other writer's kept.
#[tokio::test]
async fn a_change_in_place_is_not_uploaded_over_a_version_put_since_the_open() {
    timed(async {
        let fx = fixture(|o, _| {
            o.writes.as_mut().expect("writes").allow_overwrite = true;
        })
        .await;
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("old");
        let obj = c.lookup(old.attr.ino, "obj").await.expect("obj");
        let o = c
            .open_write(obj.attr.ino, false, 0)
            .await
            .expect("open to append");
        c.write(o.fh, 1000, b"mine\n").expect("append");
        put_elsewhere(&fx, "old/obj", data(3000, 7)).await;
        let e = c.close(o.fh, 0).await.expect_err("replaced since the open");
        assert_eq!(e.errno(), libc::ESTALE);
        c.release_write(o.fh).await;
        assert_eq!(
            stored(&fx, "old/obj").await,
            Some(data(3000, 7)),
            "theirs kept"
        );
        // A file this mount created and uploaded is checked the same way at its next upload.
        let (e, fh) = c.create(old.attr.ino, "mine", 0).await.expect("create");
        c.write(fh, 0, b"v1").expect("write");
        c.flush(fh).await.expect("first upload");
        c.write(fh, 2, b"v2").expect("write more");
        c.flush(fh).await.expect("second upload: still our version");
        c.release_write(fh).await;
        assert_eq!(stored(&fx, "old/mine").await.as_deref(), Some(&b"v1v2"[..]));
        let _ = e;

        // Black-box finding (round 21): removed by another client between the open and
        // the close, the object came back as its old bytes plus the change.
        let obj = c.lookup(old.attr.ino, "obj").await.expect("obj, theirs");
        let o = c
            .open_write(obj.attr.ino, false, 0)
            .await
            .expect("open the other writer's version to append");
        c.write(o.fh, 3000, b"mine\n").expect("append");
        object_store::ObjectStoreExt::delete(&*fx.mem, &object_store::path::Path::from("old/obj"))
            .await
            .expect("a delete by another client");
        let e = c.close(o.fh, 0).await.expect_err("removed since the open");
        assert_eq!(e.errno(), libc::ESTALE);
        c.release_write(o.fh).await;
        assert_eq!(stored(&fx, "old/obj").await, None, "the removal stands");
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 16): the mount looked `theirs` up (absent), another writer
/// then made it, and within the metadata TTL a rename over it replaced their object:
/// on a mount that may not replace objects (`mv`), with `RENAME_NOREPLACE` (`mv -n`),
/// a directory renamed onto a name the other writer filled meanwhile (folders merged),
/// a file created with `O_EXCL` on a mount that may replace objects, and `>>` of a
/// name made meanwhile. Each now fails (EPERM, EEXIST, ENOTEMPTY, EEXIST at the close;
/// ESTALE, which makes the kernel open the file made) and their object stays.
#[tokio::test]
async fn a_rename_or_exclusive_create_never_replaces_an_object_made_meanwhile() {
    timed(async {
        let create_only =
            fixture(|o, _| o.writes.as_mut().expect("writes").allow_delete = true).await;
        let replacing = fixture_replacing().await;
        for (fx, noreplace, errno) in [
            (&create_only, false, libc::EPERM),
            (&replacing, true, libc::EEXIST),
        ] {
            let c = &fx.core;
            put_elsewhere(fx, "data/mine", b"MINE".to_vec()).await;
            let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
            c.lookup(dir.attr.ino, "mine").await.expect("mine");
            c.lookup(dir.attr.ino, "theirs").await.expect_err("absent");
            put_elsewhere(fx, "data/theirs", b"OTHER".to_vec()).await;
            let e = c
                .rename(dir.attr.ino, "mine", dir.attr.ino, "theirs", noreplace)
                .await
                .expect_err("refused");
            assert_eq!(e.errno(), errno, "{e}");
            assert_eq!(
                stored(fx, "data/theirs").await.as_deref(),
                Some(&b"OTHER"[..])
            );
            assert_eq!(stored(fx, "data/mine").await.as_deref(), Some(&b"MINE"[..]));
            // Shown from now on.
            c.lookup(dir.attr.ino, "theirs")
                .await
                .expect("theirs shown");

            // A directory onto a name another writer put objects under meanwhile: the
            // same name as one moved, and another.
            for (i, (theirs, noreplace_errno)) in [("x", libc::EEXIST), ("y", libc::EEXIST)]
                .into_iter()
                .enumerate()
            {
                let (da, db) = (format!("da{i}"), format!("db{i}"));
                put_elsewhere(fx, &format!("{da}/x"), b"MOVED".to_vec()).await;
                c.lookup(ROOT_INO, &da).await.expect("da");
                c.lookup(ROOT_INO, &db).await.expect_err("absent");
                put_elsewhere(fx, &format!("{db}/{theirs}"), b"OTHER".to_vec()).await;
                let e = c
                    .rename(ROOT_INO, &da, ROOT_INO, &db, noreplace)
                    .await
                    .expect_err("refused");
                let want = if noreplace {
                    noreplace_errno
                } else {
                    libc::ENOTEMPTY
                };
                assert_eq!(e.errno(), want, "{e}");
                assert_eq!(
                    stored(fx, &format!("{db}/{theirs}")).await.as_deref(),
                    Some(&b"OTHER"[..])
                );
                assert_eq!(
                    stored(fx, &format!("{da}/x")).await.as_deref(),
                    Some(&b"MOVED"[..])
                );
                if theirs != "x" {
                    assert_eq!(stored(fx, &format!("{db}/x")).await, None, "nothing moved");
                }
            }
        }

        // O_EXCL on a mount that may replace objects.
        let c = &replacing.core;
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        c.lookup(dir.attr.ino, "lock").await.expect_err("absent");
        let (_, fh) = c
            .create_with(dir.attr.ino, "lock", 0, libc::O_EXCL)
            .await
            .expect("create");
        c.write(fh, 0, b"node A").expect("write");
        put_elsewhere(&replacing, "data/lock", b"node B".to_vec()).await;
        let e = c.flush(fh).await.expect_err("refused");
        assert_eq!(e.errno(), libc::EEXIST, "{e}");
        c.release_write(fh).await;
        assert_eq!(
            stored(&replacing, "data/lock").await.as_deref(),
            Some(&b"node B"[..])
        );
        // O_EXCL of a name the mount knows is taken: EEXIST at once.
        let e = c
            .create_with(dir.attr.ino, "lock", 0, libc::O_EXCL)
            .await
            .expect_err("taken");
        assert_eq!(e.errno(), libc::EEXIST, "{e}");

        // `>>` (O_CREAT without O_TRUNC) of a name made meanwhile: ESTALE, so the
        // kernel looks it up again and opens it; its bytes stay.
        c.lookup(dir.attr.ino, "log").await.expect_err("absent");
        put_elsewhere(&replacing, "data/log", b"their line\n".to_vec()).await;
        let e = c
            .create_with(dir.attr.ino, "log", 0, libc::O_APPEND)
            .await
            .expect_err("made meanwhile");
        assert_eq!(e.errno(), libc::ESTALE, "{e}");
        let log = c.lookup(dir.attr.ino, "log").await.expect("shown now");
        assert_eq!(log.attr.size, 11);
        assert_eq!(
            stored(&replacing, "data/log").await.as_deref(),
            Some(&b"their line\n"[..])
        );
        // A name still free is created as before.
        let (_, fh) = c
            .create_with(dir.attr.ino, "new.log", 0, libc::O_APPEND)
            .await
            .expect("free");
        c.write(fh, 0, b"mine").expect("write");
        c.flush(fh).await.expect("upload");
        c.release_write(fh).await;
        assert_eq!(
            stored(&replacing, "data/new.log").await.as_deref(),
            Some(&b"mine"[..])
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 14b): a reader of the old version, open across an overwrite
/// and a rename while open, read the old bytes into the inode's page cache (cut to the
/// new size); the upload then told every later open of that inode to keep the cache, so
/// `cat` of the new name showed the old bytes for good. An inode whose pages a handle of
/// another version filled while it was being written keeps no cache at its next open.
#[tokio::test]
async fn pages_an_old_version_filled_during_a_write_are_not_kept() {
    timed(async {
        let fx = fixture_replacing().await;
        let c = &fx.core;
        let (ino, rd, w) = read_across_an_overwrite_and_a_rename(c).await;
        let _ = c.read(rd.fh, 0, 4096, 0).await;
        c.close(w.fh, 0).await.expect("close");
        c.release_write(w.fh).await;
        c.release(rd.fh);
        let fresh = c.open(ino, false).await.expect("open the new name's inode");
        assert!(!fresh.keep_cache, "the old version's pages are not kept");
        assert_eq!(
            c.read(fresh.fh, 0, 4096, 0).await.expect("read").as_ref(),
            &[b'W'; 10][..]
        );
        c.release(fresh.fh);
        let again = c.open(ino, false).await.expect("open again");
        assert!(again.keep_cache, "its own pages are kept from then on");
        c.release(again.fh);
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 14b, F4): a reader open across `O_TRUNC` and a rename while
/// open read the old version's bytes under the new size (10 of 5000 `R`s: a version that
/// never existed). The handle's inode is the file being written, whatever its name now:
/// it reads what was written, as on a local disk.
#[tokio::test]
async fn a_reader_open_across_an_overwrite_and_a_rename_reads_what_is_written() {
    timed(async {
        let fx = fixture_replacing().await;
        let c = &fx.core;
        let (_, rd, w) = read_across_an_overwrite_and_a_rename(c).await;
        let during = c.read(rd.fh, 0, 4096, 0).await.expect("read while written");
        assert_eq!(
            during.as_ref(),
            &[b'W'; 10][..],
            "what is written, not old bytes"
        );
        c.close(w.fh, 0).await.expect("close");
        c.release_write(w.fh).await;
        c.release(rd.fh);
    })
    .await
    .expect("bounded");
}

/// Black-box finding: `open(O_CREAT)` of a name another process kept renaming away and
/// back failed ENOENT (11-17% of opens): the kernel had looked the name up, and the OPEN
/// of that inode found nothing at its path. ENOENT is not retried and says the folder
/// is missing; the OPEN (for reading or writing) of an inode whose path holds nothing
/// now is ESTALE, so the kernel looks the name up again (and creates it, for O_CREAT).
#[tokio::test]
async fn opening_an_inode_whose_object_went_since_its_lookup_is_estale() {
    timed(async {
        let fx = fixture(|o, _| {
            o.metadata_ttl = Duration::ZERO;
            let w = o.writes.as_mut().expect("writes");
            w.allow_overwrite = true;
        })
        .await;
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("lookup old");
        let obj = c.lookup(old.attr.ino, "obj").await.expect("lookup obj");
        object_store::ObjectStoreExt::delete(&*fx.mem, &object_store::path::Path::from("old/obj"))
            .await
            .expect("removed behind the mount's back");
        let read = c.open(obj.attr.ino, false).await.expect_err("gone");
        assert_eq!(read.errno(), libc::ESTALE, "{read}");
        let write = c
            .open_write(obj.attr.ino, false, 0)
            .await
            .expect_err("gone");
        assert_eq!(write.errno(), libc::ESTALE, "{write}");
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 13): two processes saving one name by temp file and
/// rename, a reader that looked the name up before a rename opened it after: the
/// replaced inode was opened on whatever the name held then, so the reader got the
/// size its kernel had for one version and the bytes of another, as a success. An
/// inode another file was renamed over is ESTALE to open (the kernel looks the name
/// up again); the name's new inode reads its own bytes whole.
#[tokio::test]
async fn an_inode_renamed_over_is_stale_to_open_and_the_name_reads_the_new_file() {
    timed(async {
        let fx = fixture_replacing().await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        let save = |name: &'static str, body: &'static [u8]| async move {
            let (e, fh) = c.create(dir.attr.ino, name, 0).await.expect("create");
            c.write(fh, 0, body).expect("write");
            c.close(fh, 0).await.expect("close uploads");
            c.release_write(fh).await;
            e.attr.ino
        };
        save("latest.json", b"{\"v\": 0}").await;
        let v0 = c.lookup(dir.attr.ino, "latest.json").await.expect("v0");
        let a = save(".tmpA", b"{\"v\": 1, \"pad\": \"xxxxxxxxxxxxxxxx\"}").await;
        let b = save(".tmpB", b"{\"v\": 2}").await;
        c.rename(dir.attr.ino, ".tmpA", dir.attr.ino, "latest.json", false)
            .await
            .expect("rename A over");
        let e = c
            .open(v0.attr.ino, false)
            .await
            .expect_err("v0 was replaced");
        assert_eq!(e.errno(), libc::ESTALE);
        // A reader's kernel resolved the name to A's inode; B is renamed over it
        // before the reader's open reaches the mount.
        c.rename(dir.attr.ino, ".tmpB", dir.attr.ino, "latest.json", false)
            .await
            .expect("rename B over");
        let e = c.open(a, false).await.expect_err("A was replaced");
        assert_eq!(e.errno(), libc::ESTALE, "never B's bytes under A's size");
        let now = c.lookup(dir.attr.ino, "latest.json").await.expect("now");
        assert_eq!(now.attr.ino, b, "the name is B's inode, as in the kernel");
        assert_eq!(now.attr.size, 8);
        assert_eq!(read_back(c, now.attr.ino).await, b"{\"v\": 2}".to_vec());
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 14, fsx): an `ftruncate` of a file unlinked while open made
/// its path an inode again, and the next file created there got that number too: the
/// kernel took the two for one, the new file's close was taken for the close of a
/// copy of the other's descriptor (its upload left to the release) and an open for
/// writing right after it was EBUSY. The truncate answers for the inode it was asked
/// about, and a new file there is a new inode.
#[tokio::test]
async fn a_truncate_of_an_unlinked_file_keeps_its_inode_apart_from_a_new_one() {
    timed(async {
        let fx = fixture_replacing().await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        let (a, fa) = c.create(dir.attr.ino, "h", 0).await.expect("create a");
        c.unlink(dir.attr.ino, "h")
            .await
            .expect("unlink while open");
        let e = c
            .setattr(a.attr.ino, Some(5000), Some(fa))
            .await
            .expect("ftruncate");
        assert_eq!(e.attr.ino, a.attr.ino, "the inode asked about");
        assert_eq!(e.attr.size, 5000);
        let (b, fb) = c.create(dir.attr.ino, "h", 0).await.expect("create b");
        assert_ne!(b.attr.ino, a.attr.ino, "a new file is a new inode");
        c.write(fb, 0, b"bb").expect("write");
        c.close(fb, 0).await.expect("close");
        c.release_write(fb).await;
        assert_eq!(stored(&fx, "data/h").await.as_deref(), Some(&b"bb"[..]));
        c.release_write(fa).await;
        assert_eq!(
            stored(&fx, "data/h").await.as_deref(),
            Some(&b"bb"[..]),
            "a is never uploaded"
        );
    })
    .await
    .expect("bounded");
}
