//! Renames of files and folders through the mount, with readers and writers open.

use super::*;

#[tokio::test]
async fn a_file_renamed_into_place_moves_its_object_and_keeps_its_inode() {
    timed(async {
        // Without allow_delete a rename (which deletes its source) is refused.
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("old");
        let e = c
            .rename(old.attr.ino, "obj", ROOT_INO, "moved", false)
            .await
            .expect_err("no delete");
        assert_eq!(e.errno(), libc::EPERM);
        assert_eq!(stored(&fx, "old/obj").await, Some(data(1000, 1)));

        let fx = fixture(|o, _| o.writes.as_mut().expect("writes").allow_delete = true).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        // Write to a temporary name, close, rename into place.
        let (tmp, fh) = c
            .create(dir.attr.ino, "model.tmp", 0)
            .await
            .expect("create");
        c.write(fh, 0, b"weights").expect("write");
        c.flush(fh).await.expect("flush");
        c.release_write(fh).await;
        c.rename(dir.attr.ino, "model.tmp", dir.attr.ino, "model.bin", false)
            .await
            .expect("rename");
        assert!(stored(&fx, "data/model.tmp").await.is_none());
        assert_eq!(
            stored(&fx, "data/model.bin").await.as_deref(),
            Some(&b"weights"[..])
        );
        // The kernel keeps the inode across the rename: it now names the new path.
        let moved = c.getattr(tmp.attr.ino).await.expect("inode follows");
        assert_eq!(moved.attr.size, 7);
        let e = c.lookup(dir.attr.ino, "model.tmp").await.expect_err("gone");
        assert_eq!(e.errno(), libc::ENOENT);
        assert_eq!(read_back(c, tmp.attr.ino).await, b"weights".to_vec());
        // Onto an existing file: refused without allow_overwrite, and with noreplace.
        let e = c
            .rename(dir.attr.ino, "model.bin", dir.attr.ino, "x", false)
            .await
            .expect_err("exists");
        assert_eq!(e.errno(), libc::EPERM);
        let e = c
            .rename(dir.attr.ino, "model.bin", dir.attr.ino, "x", true)
            .await
            .expect_err("noreplace");
        assert_eq!(e.errno(), libc::EEXIST);

        // Write a temporary file, close it, rename it at once (`tempfile`'s persist,
        // safetensors' save): the kernel's RELEASE comes after the close returned, so
        // the rename waits for it instead of failing with EBUSY.
        let (_, fh) = c.create(dir.attr.ino, ".tmpXYZ", 0).await.expect("create");
        c.write(fh, 0, b"tensors").expect("write");
        c.close(fh, 0).await.expect("close uploads");
        let core = fx.core.clone();
        let late_release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            core.release_write(fh).await;
        });
        c.rename(
            dir.attr.ino,
            ".tmpXYZ",
            dir.attr.ino,
            "model.safetensors",
            false,
        )
        .await
        .expect("rename after the release");
        late_release.await.expect("release");
        assert_eq!(
            stored(&fx, "data/model.safetensors").await.as_deref(),
            Some(&b"tensors"[..])
        );
        assert!(stored(&fx, "data/.tmpXYZ").await.is_none());
        // Renamed while still open (`tempfile`'s persist renames the file it holds, as
        // safetensors saves): no wait, the file moves, and its close uploads it under
        // the new name; one flushed before the rename leaves no object behind.
        let (_, fh) = c.create(dir.attr.ino, "open.bin", 0).await.expect("create");
        c.write(fh, 0, b"x").expect("write");
        c.flush(fh).await.expect("an fsync before the rename");
        assert!(stored(&fx, "data/open.bin").await.is_some());
        let t0 = std::time::Instant::now();
        c.rename(dir.attr.ino, "open.bin", dir.attr.ino, "moved.bin", false)
            .await
            .expect("rename while written");
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "no wait for an open file"
        );
        assert!(
            stored(&fx, "data/open.bin").await.is_none(),
            "the old object went"
        );
        let e = c.lookup(dir.attr.ino, "open.bin").await.expect_err("moved");
        assert_eq!(e.errno(), libc::ENOENT);
        assert_eq!(
            c.lookup(dir.attr.ino, "moved.bin")
                .await
                .expect("new name")
                .attr
                .size,
            1
        );
        c.write(fh, 1, b"yz").expect("write on");
        c.close(fh, 0).await.expect("close");
        c.release_write(fh).await;
        assert_eq!(
            stored(&fx, "data/moved.bin").await.as_deref(),
            Some(&b"xyz"[..])
        );
        assert!(stored(&fx, "data/open.bin").await.is_none());

        // Unlinked while open (an anonymous temporary file): the name goes at once, the
        // handle writes, reads and stats on, and nothing is ever uploaded.
        let (e, fh) = c.create(dir.attr.ino, "scratch", 0).await.expect("create");
        c.write(fh, 0, b"abc").expect("write");
        c.unlink(dir.attr.ino, "scratch")
            .await
            .expect("unlink while open");
        let gone = c.lookup(dir.attr.ino, "scratch").await.expect_err("gone");
        assert_eq!(gone.errno(), libc::ENOENT);
        c.write(fh, 3, b"def").expect("write on");
        c.setattr(e.attr.ino, Some(5), Some(fh))
            .await
            .expect("ftruncate");
        assert_eq!(c.staged_attr(e.attr.ino, fh).expect("fstat").attr.size, 5);
        assert_eq!(
            c.read(fh, 0, 100, 0).await.expect("read").as_ref(),
            b"abcde"
        );
        c.close(fh, 0).await.expect("close");
        c.release_write(fh).await;
        assert!(
            stored(&fx, "data/scratch").await.is_none(),
            "never uploaded"
        );
        let (_, fh) = c
            .create(dir.attr.ino, "scratch", 0)
            .await
            .expect("the name is free");
        c.release_write(fh).await;
    })
    .await
    .expect("bounded");
}

/// A checkpoint directory written under a temporary name and renamed into place
/// (Orbax, TensorFlow): every object moves, the inodes follow, and what cannot be done
/// is refused with its errno before anything moves. A copy the store refuses leaves
/// the source whole and no copy behind.
#[tokio::test]
async fn a_directory_renamed_into_place_moves_every_object_under_it() {
    timed(async {
        let fx = fixture(|o, _| o.writes.as_mut().expect("writes").allow_delete = true).await;
        let c = &fx.core;
        let tmp = c.mkdir(ROOT_INO, "tmp-ckpt").await.expect("mkdir");
        let sub = c.mkdir(tmp.attr.ino, "sub").await.expect("mkdir sub");
        let mut files = Vec::new();
        for (dir, name, seed) in [(tmp.attr.ino, "a.bin", 1u8), (sub.attr.ino, "b.bin", 2)] {
            let (e, fh) = c.create(dir, name, 0).await.expect("create");
            c.write(fh, 0, &data(3000, seed)).expect("write");
            c.flush(fh).await.expect("flush");
            c.release_write(fh).await;
            files.push(e.attr.ino);
        }
        // Busy while a file under it is being written; into itself is invalid.
        let (_, open_fh) = c.create(sub.attr.ino, "c.bin", 0).await.expect("create");
        let e = c
            .rename(ROOT_INO, "tmp-ckpt", ROOT_INO, "ckpt-1", false)
            .await
            .expect_err("busy");
        assert_eq!(e.errno(), libc::EBUSY);
        c.write(open_fh, 0, b"c").expect("write");
        c.flush(open_fh).await.expect("flush");
        c.release_write(open_fh).await;
        let e = c
            .rename(ROOT_INO, "tmp-ckpt", sub.attr.ino, "inside", false)
            .await
            .expect_err("into itself");
        assert_eq!(e.errno(), libc::EINVAL);
        // Onto a non-empty directory: ENOTEMPTY; onto an existing one with noreplace:
        // EEXIST. Nothing moved.
        let e = c
            .rename(ROOT_INO, "tmp-ckpt", ROOT_INO, "data", false)
            .await
            .expect_err("not empty");
        assert_eq!(e.errno(), libc::ENOTEMPTY);
        let e = c
            .rename(ROOT_INO, "tmp-ckpt", ROOT_INO, "data", true)
            .await
            .expect_err("noreplace");
        assert_eq!(e.errno(), libc::EEXIST);
        // A copy refused by the store: the source stays whole, no copy is left.
        fx.faulty.set_config(FaultConfig {
            fail_copy_of: Some("b.bin".into()),
            ..Default::default()
        });
        let e = c
            .rename(ROOT_INO, "tmp-ckpt", ROOT_INO, "ckpt-1", false)
            .await
            .expect_err("a copy fails");
        // The store's error (black-box finding, round 16b: ENOTSUP, as if folders
        // could not be renamed here).
        assert_eq!(e.errno(), libc::EIO, "{e}");
        fx.faulty.set_config(FaultConfig::default());
        assert_eq!(stored(&fx, "tmp-ckpt/a.bin").await, Some(data(3000, 1)));
        assert_eq!(stored(&fx, "tmp-ckpt/sub/b.bin").await, Some(data(3000, 2)));
        assert_eq!(
            stored(&fx, "ckpt-1/a.bin").await,
            None,
            "the copy made was removed"
        );
        // Onto an empty directory made here: moved, object by object.
        c.mkdir(ROOT_INO, "ckpt-1").await.expect("empty target");
        c.rename(ROOT_INO, "tmp-ckpt", ROOT_INO, "ckpt-1", false)
            .await
            .expect("rename the directory");
        assert_eq!(stored(&fx, "ckpt-1/a.bin").await, Some(data(3000, 1)));
        assert_eq!(stored(&fx, "ckpt-1/sub/b.bin").await, Some(data(3000, 2)));
        assert_eq!(
            stored(&fx, "ckpt-1/sub/c.bin").await.as_deref(),
            Some(&b"c"[..])
        );
        for gone in ["tmp-ckpt/a.bin", "tmp-ckpt/sub/b.bin", "tmp-ckpt/sub/c.bin"] {
            assert_eq!(stored(&fx, gone).await, None, "{gone}");
        }
        // The mount sees the new tree at once, and the old name no more.
        let e = c.lookup(ROOT_INO, "tmp-ckpt").await.expect_err("gone");
        assert_eq!(e.errno(), libc::ENOENT);
        assert!(names_in(c, ROOT_INO).await.contains(&"ckpt-1".to_string()));
        assert!(!names_in(c, ROOT_INO)
            .await
            .contains(&"tmp-ckpt".to_string()));
        let moved = c.lookup(ROOT_INO, "ckpt-1").await.expect("moved");
        assert_eq!(
            moved.attr.ino, tmp.attr.ino,
            "the inode follows the directory"
        );
        assert_eq!(names_in(c, moved.attr.ino).await, vec!["a.bin", "sub"]);
        assert_eq!(names_in(c, sub.attr.ino).await, vec!["b.bin", "c.bin"]);
        // Inodes under it follow too: the kernel reads them by inode.
        assert_eq!(read_back(c, files[0]).await, data(3000, 1));
        assert_eq!(read_back(c, files[1]).await, data(3000, 2));
    })
    .await
    .expect("bounded");
}

/// Black-box finding: a reader of a large object that another process renamed through
/// the mount (`mv`) got ENOENT for its next bytes not cached yet; on a local disk the
/// open file reads on. The handle now reads them from the object's new name.
#[tokio::test]
async fn a_file_renamed_while_open_for_reading_reads_on() {
    timed(async {
        let fx = fixture(|o, _| o.writes.as_mut().expect("writes").allow_delete = true).await;
        let c = &fx.core;
        let want = data((64 * BS) as usize, 9);
        object_store::ObjectStoreExt::put(
            &*fx.mem,
            &"data/big".into(),
            Bytes::from(want.clone()).into(),
        )
        .await
        .expect("seed");
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        let big = c.lookup(dir.attr.ino, "big").await.expect("big");
        let o = c.open(big.attr.ino, false).await.expect("open");
        let first = c.read(o.fh, 0, BS as u32, 1).await.expect("read");
        assert_eq!(&first[..], &want[..BS as usize]);
        c.rename(dir.attr.ino, "big", ROOT_INO, "moved", false)
            .await
            .expect("rename");
        assert!(
            stored(&fx, "data/big").await.is_none(),
            "the old key is gone"
        );
        let at = 60 * BS;
        let later = c
            .read(o.fh, at, BS as u32, 1)
            .await
            .expect("reads on after the rename");
        assert_eq!(&later[..], &want[at as usize..(at + BS) as usize]);
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 14, fsx): `mv` of a file open for a change in place deleted
/// its object at the rename, leaving the bytes only in the unsynced staging file: a
/// daemon killed (or stopped) before the writer's close lost a file closed long
/// before. The object moves to the new name and the close replaces it there.
#[tokio::test]
async fn a_file_renamed_while_changed_in_place_keeps_its_object_under_the_new_name() {
    timed(async {
        let fx = fixture_replacing().await;
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("old");
        let obj = c.lookup(old.attr.ino, "obj").await.expect("obj");
        let o = c
            .open_write(obj.attr.ino, false, 0)
            .await
            .expect("open in place");
        c.write(o.fh, 0, b"abc").expect("patch");
        c.rename(old.attr.ino, "obj", old.attr.ino, "moved", false)
            .await
            .expect("rename while written");
        // What a crash here would leave: the durable version, under the new name.
        assert_eq!(
            stored(&fx, "old/moved").await,
            Some(data(1000, 1)),
            "the object moved with the name"
        );
        assert!(stored(&fx, "old/obj").await.is_none());
        c.close(o.fh, 0).await.expect("close uploads");
        c.release_write(o.fh).await;
        let mut want = data(1000, 1);
        want[..3].copy_from_slice(b"abc");
        assert_eq!(stored(&fx, "old/moved").await, Some(want));
        assert!(stored(&fx, "old/obj").await.is_none());
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 16): files created in a folder while `mv` of it copied its
/// objects stayed under the old name (99-212 of them beside 3,000 objects), and the
/// old folder came back beside the new one, though the rename returned 0. A create in
/// a folder being renamed waits for the rename, and lands under the new name.
#[tokio::test]
async fn a_file_created_in_a_folder_being_renamed_follows_it() {
    timed(async {
        let fx = fixture_replacing().await;
        // Six rounds of copies (16 at a time) and of deletes.
        for i in 0..96 {
            put_elsewhere(&fx, &format!("d/{i:02}"), vec![i as u8; 10]).await;
        }
        let c = fx.core.clone();
        let d = c.lookup(ROOT_INO, "d").await.expect("d");
        // Every store call takes 100 ms: the rename takes over a second, its copies
        // from about 0.3 s on.
        fx.faulty.set_config(FaultConfig {
            latency: Duration::from_millis(100),
            ..FaultConfig::default()
        });
        let renaming = {
            let c = c.clone();
            tokio::spawn(async move { c.rename(ROOT_INO, "d", ROOT_INO, "e", false).await })
        };
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            !renaming.is_finished(),
            "the create comes while the folder is copied"
        );
        let (_, fh) = c.create(d.attr.ino, "new", 0).await.expect("create");
        c.write(fh, 0, b"made during the rename").expect("write");
        c.flush(fh).await.expect("upload");
        c.release_write(fh).await;
        renaming.await.expect("join").expect("renamed");
        fx.faulty.set_config(FaultConfig::default());
        assert_eq!(
            stored(&fx, "e/new").await.as_deref(),
            Some(&b"made during the rename"[..])
        );
        let left = futures::StreamExt::collect::<Vec<_>>(fx.mem.list(Some(&"d".into()))).await;
        assert!(left.is_empty(), "nothing left under the old name: {left:?}");
    })
    .await
    .expect("bounded");
}

/// Black-box findings (round 16): a reader of a file survived one rename, but not a
/// second (logrotate's `.1 -> .2`: ENOENT), nor a new file made at its old name
/// (logrotate's `create`: ESTALE), nor a rename of its folder (`mv run1 run1.old`:
/// ENOENT). Each is followed: the handle reads on from wherever the bytes went.
#[tokio::test]
async fn a_reader_follows_renames_of_renames_of_its_folder_and_over_its_old_name() {
    timed(async {
        let fx = fixture_replacing().await;
        let c = &fx.core;
        let want = data((64 * BS) as usize, 5);
        for p in ["logs/app.log", "logs/b.log", "run1/big"] {
            put_elsewhere(&fx, p, want.clone()).await;
        }
        let logs = c.lookup(ROOT_INO, "logs").await.expect("logs");
        let run1 = c.lookup(ROOT_INO, "run1").await.expect("run1");
        let mut fhs = Vec::new();
        for (dir, name) in [
            (logs.attr.ino, "app.log"),
            (logs.attr.ino, "b.log"),
            (run1.attr.ino, "big"),
        ] {
            let e = c.lookup(dir, name).await.expect("lookup");
            let o = c.open(e.attr.ino, false).await.expect("open");
            let first = c.read(o.fh, 0, BS as u32, 1).await.expect("read");
            assert_eq!(&first[..], &want[..BS as usize]);
            fhs.push(o.fh);
        }
        let (rotated, recreated, in_folder) = (fhs[0], fhs[1], fhs[2]);
        let l = logs.attr.ino;
        c.rename(l, "app.log", l, "app.log.1", false)
            .await
            .expect("rename");
        c.rename(l, "app.log.1", l, "app.log.2", false)
            .await
            .expect("rename");
        c.rename(l, "b.log", l, "b.log.1", false)
            .await
            .expect("rename");
        let (_, fh) = c.create(l, "b.log", 0).await.expect("create");
        c.write(fh, 0, b"a new log").expect("write");
        c.flush(fh).await.expect("upload");
        c.release_write(fh).await;
        c.rename(ROOT_INO, "run1", ROOT_INO, "run1.old", false)
            .await
            .expect("rename the folder");
        let at = 60 * BS;
        for (fh, what) in [
            (rotated, "renamed twice"),
            (recreated, "a new file at its old name"),
            (in_folder, "its folder renamed"),
        ] {
            let later = c
                .read(fh, at, BS as u32, 1)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(&later[..], &want[at as usize..(at + BS) as usize], "{what}");
        }
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 16b): a rename whose delete of the source was applied but
/// its answer lost had the retry copy again from the source just deleted, and a rename
/// that had completed failed ENOENT (also the create-only rename). The copy and the
/// delete are retried each on its own: the rename succeeds.
#[tokio::test]
async fn a_rename_whose_delete_answer_is_lost_succeeds() {
    timed(async {
        let create_only =
            fixture(|o, _| o.writes.as_mut().expect("writes").allow_delete = true).await;
        let replacing = fixture_replacing().await;
        for fx in [&create_only, &replacing] {
            let c = &fx.core;
            put_elsewhere(fx, "data/a", b"moved".to_vec()).await;
            let dir = c.lookup(ROOT_INO, "data").await.expect("data");
            c.lookup(dir.attr.ino, "a").await.expect("a");
            // A store without a rename of its own (S3).
            fx.faulty.set_config(FaultConfig {
                rename_as_copy_and_delete: true,
                ..FaultConfig::default()
            });
            fx.faulty.lose_next_deletes(1);
            c.rename(dir.attr.ino, "a", dir.attr.ino, "b", false)
                .await
                .expect("the rename completed");
            assert_eq!(stored(fx, "data/b").await.as_deref(), Some(&b"moved"[..]));
            assert_eq!(stored(fx, "data/a").await, None);
        }
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 16b): `mv T Z` beside `mv T/b T/c` both returned 0, and
/// the files of `b` ended up twice (`Z/b/*` and a `T/c/*` that brought `T` back). Two
/// folder renames that involve each other's folders now take turns, whichever comes
/// first: the end state is as on a local disk, `Z/c/*` and `Z/g*` only.
#[tokio::test]
async fn nested_folder_renames_take_turns() {
    timed(async {
        for inner_first in [true, false] {
            let fx = fixture_replacing().await;
            // Four rounds of 16 copies of `b`: each rename takes a while.
            for i in 0..64 {
                put_elsewhere(&fx, &format!("T/b/f{i:02}"), vec![1; 10]).await;
                put_elsewhere(&fx, &format!("T/g{i:02}"), vec![2; 10]).await;
            }
            let c = fx.core.clone();
            let t = c.lookup(ROOT_INO, "T").await.expect("T");
            c.lookup(t.attr.ino, "b").await.expect("b");
            fx.faulty.set_config(FaultConfig {
                latency: Duration::from_millis(100),
                ..FaultConfig::default()
            });
            let inner = {
                let c = c.clone();
                async move { c.rename(t.attr.ino, "b", t.attr.ino, "c", false).await }
            };
            let outer = {
                let c = c.clone();
                async move { c.rename(ROOT_INO, "T", ROOT_INO, "Z", false).await }
            };
            let (a, b) = if inner_first {
                let a = tokio::spawn(inner);
                tokio::time::sleep(Duration::from_millis(150)).await;
                (a, tokio::spawn(outer))
            } else {
                let a = tokio::spawn(outer);
                tokio::time::sleep(Duration::from_millis(150)).await;
                (a, tokio::spawn(inner))
            };
            a.await.expect("join").expect("first rename");
            b.await.expect("join").expect("second rename");
            fx.faulty.set_config(FaultConfig::default());
            let mut keys: Vec<String> = futures::StreamExt::collect::<Vec<_>>(fx.mem.list(None))
                .await
                .into_iter()
                .map(|m| m.expect("meta").location.to_string())
                .filter(|k| k.starts_with("T/") || k.starts_with("Z/"))
                .collect();
            keys.sort();
            let mut want: Vec<String> = (0..64)
                .map(|i| format!("Z/c/f{i:02}"))
                .chain((0..64).map(|i| format!("Z/g{i:02}")))
                .collect();
            want.sort();
            assert_eq!(keys, want, "inner first: {inner_first}");
        }
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 16b): a file opened to append while its folder was being
/// renamed was uploaded under the old folder name (appends lost from the live folder,
/// and the old name came back). The open waits for the rename and changes the file
/// under its new name.
#[tokio::test]
async fn a_file_opened_to_append_in_a_folder_being_renamed_follows_it() {
    timed(async {
        let fx = fixture_replacing().await;
        for i in 0..96 {
            put_elsewhere(&fx, &format!("d/{i:02}"), vec![i as u8; 10]).await;
        }
        let c = fx.core.clone();
        let d = c.lookup(ROOT_INO, "d").await.expect("d");
        let log = c.lookup(d.attr.ino, "05").await.expect("d/05");
        fx.faulty.set_config(FaultConfig {
            latency: Duration::from_millis(100),
            ..FaultConfig::default()
        });
        let renaming = {
            let c = c.clone();
            tokio::spawn(async move { c.rename(ROOT_INO, "d", ROOT_INO, "e", false).await })
        };
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            !renaming.is_finished(),
            "the open comes while the folder is copied"
        );
        let o = c
            .open_write(log.attr.ino, false, 0)
            .await
            .expect("open to append");
        c.write(o.fh, 10, b"+more").expect("append");
        c.flush(o.fh).await.expect("upload");
        c.release_write(o.fh).await;
        renaming.await.expect("join").expect("renamed");
        fx.faulty.set_config(FaultConfig::default());
        let mut want = vec![5u8; 10];
        want.extend_from_slice(b"+more");
        assert_eq!(stored(&fx, "e/05").await.as_deref(), Some(&want[..]));
        let left = futures::StreamExt::collect::<Vec<_>>(fx.mem.list(Some(&"d".into()))).await;
        assert!(
            left.is_empty(),
            "nothing under the old name: {}",
            left.len()
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 22): an object named as a folder (`x` beside `x/in`) is
/// hidden while the folder is there; after the mount moved the folder away it stayed
/// hidden (ENOENT to `cat`, EEXIST to an exclusive create) for the metadata TTL, for good
/// with `--metadata-ttl indefinite`. The rename shows it at once.
#[tokio::test]
async fn an_object_a_folder_hid_is_shown_once_the_folder_is_moved_away() {
    timed(async {
        let fx = fixture_replacing().await;
        put_elsewhere(&fx, "x", b"the object".to_vec()).await;
        put_elsewhere(&fx, "x/in", b"inside".to_vec()).await;
        let c = &fx.core;
        let x = c.lookup(ROOT_INO, "x").await.expect("x");
        assert_eq!(x.attr.kind, Kind::Dir, "the folder wins");
        c.rename(ROOT_INO, "x", ROOT_INO, "z", false)
            .await
            .expect("moved");
        let x = c.lookup(ROOT_INO, "x").await.expect("the object shows");
        assert_eq!((x.attr.kind, x.attr.size), (Kind::File, 10));
        assert_eq!(stored(&fx, "z/in").await.as_deref(), Some(&b"inside"[..]));
    })
    .await
    .expect("bounded");
}

/// Reference-model finding (`writes_model`, a random case of a CI run): a file whose
/// upload failed was renamed onto a stored object and on again; the object moved with
/// it, and once the file was released (not uploaded: its upload had failed) a lookup of
/// the new name answered ENOENT while the store held the object there.
#[tokio::test]
async fn an_object_moved_with_a_failed_file_stays_visible_after_its_release() {
    timed(async {
        let fx = fixture_replacing().await;
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "b", 0).await.expect("create b");
        c.flush(fh).await.expect("flush b");
        c.release_write(fh).await;
        assert_eq!(stored(&fx, "b").await.as_deref(), Some(&b""[..]));
        fx.faulty.set_config(FaultConfig {
            writes_down: true,
            ..Default::default()
        });
        let (_, fa) = c.create(ROOT_INO, "a", 0).await.expect("create a");
        assert_eq!(c.flush(fa).await.expect_err("down").errno(), libc::EIO);
        c.rename(ROOT_INO, "a", ROOT_INO, "b", false)
            .await
            .expect("a onto b");
        let (_, fa2) = c.create(ROOT_INO, "a", 0).await.expect("create a again");
        fx.faulty.set_config(FaultConfig::default());
        c.rename(ROOT_INO, "b", ROOT_INO, "c", false)
            .await
            .expect("b to c");
        assert_eq!(stored(&fx, "c").await.as_deref(), Some(&b""[..]), "moved");
        c.release_write(fa).await;
        assert_eq!(stored(&fx, "c").await.as_deref(), Some(&b""[..]));
        let e = c.lookup(ROOT_INO, "c").await.expect("c is an object");
        assert_eq!(e.attr.size, 0);
        c.release_write(fa2).await;
    })
    .await
    .expect("bounded");
}

/// An atomic save (`tempfile.NamedTemporaryFile`, `mkstemp`: a temporary file created
/// with `O_EXCL`, written, fsync'd and renamed over the file it replaces while still
/// open) replaces that file on a mount that may replace objects: the exclusive create
/// was the temporary name's, not the target's. Its close failed EEXIST and the new
/// bytes were lost; after a crash, its fsync'd copy was dropped as "only if absent"
/// (black-box finding, round 25).
#[tokio::test]
async fn an_exclusive_temp_file_renamed_over_a_file_replaces_it() {
    timed(async {
        let fx = fixture_replacing().await;
        let staging_dir = staging_dir(&fx);
        let c = &fx.core;
        for name in ["closed.json", "crashed.json"] {
            let (_, fh) = c.create(ROOT_INO, name, 0).await.expect("create");
            c.write(fh, 0, b"v1").expect("write");
            c.close(fh, 0).await.expect("close");
            c.release_write(fh).await;
            assert_eq!(stored(&fx, name).await.as_deref(), Some(&b"v1"[..]));
        }
        let save = |tmp: &'static str, to: &'static str| async move {
            let (_, fh) = c
                .create_with(ROOT_INO, tmp, 0, libc::O_EXCL)
                .await
                .expect("exclusive create");
            c.write(fh, 0, b"v2").expect("write");
            c.fsync(fh).await.expect("fsync");
            c.rename(ROOT_INO, tmp, ROOT_INO, to, false)
                .await
                .expect("rename over the file");
            fh
        };
        let fh = save(".closed.tmp", "closed.json").await;
        c.close(fh, 0).await.expect("the close replaces the file");
        c.release_write(fh).await;
        assert_eq!(
            stored(&fx, "closed.json").await.as_deref(),
            Some(&b"v2"[..])
        );
        // Saved, then the daemon dies before the close: the next start uploads it.
        let _crashed = save(".crashed.tmp", "crashed.json").await;
        let after = restarted(&fx, staging_dir, "mem");
        after.recover_journaled(&tokio::runtime::Handle::current());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while stored(&fx, "crashed.json").await.as_deref() != Some(&b"v2"[..]) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the fsync'd save was not uploaded over the old file"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(stored(&fx, ".crashed.tmp").await.is_none());
    })
    .await
    .expect("bounded");
}

/// A file still open for writing, renamed onto a name another writer created since the
/// mount looked, where its upload may only create (a create-only mount, or
/// `RENAME_NOREPLACE`): the rename asks the store and is refused as the rename of a
/// closed file is, and the file stays whole under its name. Taken on the mount's stale
/// view, the rename returned 0, the close failed EEXIST and the bytes were under
/// neither name (black-box finding, round 25b).
#[tokio::test]
async fn an_open_file_renamed_onto_a_name_created_elsewhere_is_refused_and_kept() {
    timed(async {
        for (overwrite, noreplace, errno) in
            [(false, false, libc::EPERM), (true, true, libc::EEXIST)]
        {
            let fx = fixture(|o, _| {
                let w = o.writes.as_mut().expect("writes");
                w.allow_delete = true;
                w.allow_overwrite = overwrite;
            })
            .await;
            let c = &fx.core;
            let (_, fh) = c.create(ROOT_INO, "work.tmp", 0).await.expect("create");
            c.write(fh, 0, b"mine").expect("write");
            c.fsync(fh).await.expect("fsync");
            // The mount looks, then another writer creates the name.
            let e = c.lookup(ROOT_INO, "final").await.expect_err("absent");
            assert_eq!(e.errno(), libc::ENOENT);
            put_elsewhere(&fx, "final", b"theirs".to_vec()).await;
            let e = c
                .rename(ROOT_INO, "work.tmp", ROOT_INO, "final", noreplace)
                .await
                .expect_err("the name is taken");
            assert_eq!(e.errno(), errno, "overwrite {overwrite}: {e}");
            c.close(fh, 0)
                .await
                .expect("the close uploads under its name");
            c.release_write(fh).await;
            assert_eq!(stored(&fx, "work.tmp").await.as_deref(), Some(&b"mine"[..]));
            assert_eq!(stored(&fx, "final").await.as_deref(), Some(&b"theirs"[..]));
        }
    })
    .await
    .expect("bounded");
}
