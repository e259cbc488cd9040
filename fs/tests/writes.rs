//! Writes through the core without a kernel: files staged and uploaded at flush, over
//! an in-memory store behind the fault-injecting wrapper (see `filesystem::write`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{CacheEngine, ObjectReader};
use strata_fs::filesystem::{Entry, Kind, ROOT_INO};
use strata_fs::{CoreOptions, FsCore, PassthroughOptions, WriteOptions};

mod write_common;
use write_common::{part_store, PartStore};

const BS: u64 = 64 << 10;

struct Fixture {
    core: Arc<FsCore>,
    mem: Arc<dyn ObjectStore>,
    faulty: Arc<FaultyStore>,
    dir: tempfile::TempDir,
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// A writable core over a store holding `old/obj` (1000 bytes) and `data/x`;
/// `tune` adjusts the write options (parts of 64 KiB by default, so a few hundred KiB
/// make a multipart upload).
async fn fixture(tune: impl FnOnce(&mut CoreOptions, &std::path::Path)) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let PartStore { mem, faulty, store } = part_store();
    store
        .put("old/obj", Bytes::from(data(1000, 1)))
        .await
        .expect("seed");
    store
        .put("data/x", Bytes::from(data(10, 2)))
        .await
        .expect("seed");
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(64 << 20)))
        .build()
        .expect("engine");
    let reader = ObjectReader::new(engine, store, BS).expect("reader");
    let mut w = WriteOptions::new(dir.path().join("staging"));
    w.part_size = 64 << 10;
    w.parts_in_flight = 3;
    w.stream_from = 128 << 10;
    let mut opts = CoreOptions {
        writes: Some(w),
        ..Default::default()
    };
    tune(&mut opts, dir.path());
    Fixture {
        core: Arc::new(FsCore::new(reader, "", opts)),
        mem,
        faulty,
        dir,
    }
}

/// A fixture whose mount keeps passthrough copies within `budget` bytes (in the
/// fixture's dir), tuned further by `tune`; with the copies' store.
async fn fixture_with_copies(
    budget: u64,
    tune: impl FnOnce(&mut CoreOptions),
) -> (Fixture, Arc<strata_fs::passthrough::PassthroughStore>) {
    let mut copies = None;
    let fx = fixture(|o, dir| {
        let pt = PassthroughOptions::open(dir.join("pt"), budget).expect("copies");
        copies = Some(pt.copies.clone());
        o.passthrough = Some(pt);
        tune(o);
    })
    .await;
    (fx, copies.expect("opened"))
}

/// A fixture whose mount may replace and delete objects (`--allow-overwrite
/// --allow-delete`).
async fn fixture_replacing() -> Fixture {
    fixture(|o, _| {
        let w = o.writes.as_mut().expect("writes");
        w.allow_overwrite = true;
        w.allow_delete = true;
    })
    .await
}

async fn stored(fx: &Fixture, path: &str) -> Option<Vec<u8>> {
    write_common::stored(&fx.mem, path).await
}

/// Another writer puts `data` at `path` in the store, behind the mount's back.
async fn put_elsewhere(fx: &Fixture, path: &str, data: Vec<u8>) {
    object_store::ObjectStoreExt::put(
        &*fx.mem,
        &object_store::path::Path::from(path),
        Bytes::from(data).into(),
    )
    .await
    .expect("a put by another writer");
}

fn timed<F: std::future::Future>(f: F) -> tokio::time::Timeout<F> {
    tokio::time::timeout(Duration::from_secs(20), f)
}

/// Reads all of `ino` through a fresh read handle.
async fn read_back(core: &Arc<FsCore>, ino: u64) -> Vec<u8> {
    let o = core.open(ino, false).await.expect("open for read");
    let mut out = Vec::new();
    loop {
        let b = core
            .read(o.fh, out.len() as u64, BS as u32, 1)
            .await
            .expect("read");
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    core.release(o.fh);
    out
}

#[tokio::test]
async fn a_created_file_is_uploaded_at_flush_at_any_offsets_and_read_back() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        assert_eq!(dir.attr.perm, 0o755, "a writable mount says so");
        let (e, fh) = c.create(dir.attr.ino, "ckpt.bin", 0).await.expect("create");
        assert_eq!(e.attr.size, 0);
        // 300 KiB + 17 written out of order: the tail first, then the head, then a
        // header patched in place (what zipfile does).
        let want = data(300 * 1024 + 17, 7);
        let cut = 100 * 1024 + 3;
        c.write(fh, cut as u64, &want[cut..]).expect("tail");
        c.write(fh, 0, &want[..cut]).expect("head");
        c.write(fh, 10, &want[10..30]).expect("patch");
        let during = c.getattr(e.attr.ino).await.expect("getattr while staged");
        assert_eq!(during.attr.size, want.len() as u64);
        assert!(
            stored(&fx, "data/ckpt.bin").await.is_none(),
            "nothing visible before the upload"
        );
        let listed = c.opendir(dir.attr.ino).await.expect("opendir");
        let names: Vec<String> = c
            .readdir(listed, 0, 100)
            .await
            .expect("readdir")
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert!(
            names.contains(&"ckpt.bin".to_string()),
            "listed while staged: {names:?}"
        );
        c.flush(fh).await.expect("flush uploads");
        assert_eq!(
            stored(&fx, "data/ckpt.bin").await.as_deref(),
            Some(&want[..])
        );
        // Reads through the write handle come from the staging file.
        let back = c.read(fh, 5, 40, 1).await.expect("read own writes");
        assert_eq!(&back[..], &want[5..45]);
        c.release_write(fh).await;
        assert_eq!(
            staged_files(&fx.dir.path().join("staging")).len(),
            0,
            "staging file gone after release"
        );
        let after = c.lookup(dir.attr.ino, "ckpt.bin").await.expect("lookup");
        assert_eq!(after.attr.size, want.len() as u64);
        assert_eq!(read_back(c, after.attr.ino).await, want);
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn an_empty_file_is_an_empty_object_and_a_second_flush_uploads_nothing_new() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "empty", 0).await.expect("create");
        c.flush(fh).await.expect("flush");
        assert_eq!(stored(&fx, "empty").await, Some(Vec::new()));
        // The store going down after the upload does not fail a flush with no change.
        fx.faulty.set_config(FaultConfig {
            writes_down: true,
            ..Default::default()
        });
        c.flush(fh).await.expect("nothing to upload");
        c.release_write(fh).await;
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_failed_upload_fails_the_flush_leaves_no_object_and_is_retried_by_the_next() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let want = data(400 * 1024, 3);
        // Down: the multipart upload cannot start.
        let (_, fh) = c.create(ROOT_INO, "a.bin", 0).await.expect("create");
        c.write(fh, 0, &want).expect("write");
        fx.faulty.set_config(FaultConfig {
            writes_down: true,
            ..Default::default()
        });
        let e = c.flush(fh).await.expect_err("store down");
        assert_eq!(e.errno(), libc::EIO, "{e}");
        assert!(stored(&fx, "a.bin").await.is_none());
        // Up again: the next flush (or fsync) uploads the unchanged file.
        fx.faulty.set_config(FaultConfig::default());
        c.flush(fh).await.expect("retried");
        assert_eq!(stored(&fx, "a.bin").await.as_deref(), Some(&want[..]));
        c.release_write(fh).await;

        // Broken midway: parts after the first fail; the upload is aborted and no
        // object (not a prefix of one) appears.
        let (_, fh) = c.create(ROOT_INO, "b.bin", 0).await.expect("create");
        c.write(fh, 0, &want).expect("write");
        fx.faulty.set_config(FaultConfig {
            fail_parts_after: Some(1),
            ..Default::default()
        });
        let e = c.flush(fh).await.expect_err("parts fail");
        assert_eq!(e.errno(), libc::EIO, "{e}");
        assert!(stored(&fx, "b.bin").await.is_none(), "no partial object");
        // A release after a failed flush does not retry behind the caller's back.
        fx.faulty.set_config(FaultConfig::default());
        c.release_write(fh).await;
        assert!(stored(&fx, "b.bin").await.is_none());
        let e = c
            .lookup(ROOT_INO, "b.bin")
            .await
            .expect_err("never written");
        assert_eq!(e.errno(), libc::ENOENT);
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn concurrent_flushes_share_one_upload_and_writes_during_it_are_uploaded_next() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "c.bin", 0).await.expect("create");
        let first = data(256 * 1024, 9);
        c.write(fh, 0, &first).expect("write");
        let flushes: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move { c.flush(fh).await })
            })
            .collect();
        for f in flushes {
            f.await.expect("join").expect("flush");
        }
        assert_eq!(stored(&fx, "c.bin").await.as_deref(), Some(&first[..]));
        c.write(fh, 0, b"changed").expect("write again");
        c.flush(fh).await.expect("flush again");
        let mut second = first.clone();
        second[..7].copy_from_slice(b"changed");
        assert_eq!(stored(&fx, "c.bin").await.as_deref(), Some(&second[..]));
        c.release_write(fh).await;
    })
    .await
    .expect("bounded");
}

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

/// Reads `len` bytes at 0 of write handle `fh` (opened read-write) back from staging.
async fn read_staged(c: &Arc<FsCore>, fh: u64, len: u32) -> Vec<u8> {
    c.read(fh, 0, len, 0)
        .await
        .expect("read from staging")
        .to_vec()
}

#[tokio::test]
async fn directories_made_here_hold_new_files_and_only_empty_ones_go() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let d = c.mkdir(ROOT_INO, "ckpt").await.expect("mkdir");
        assert_eq!(d.attr.kind, Kind::Dir);
        let e = c.mkdir(ROOT_INO, "ckpt").await.expect_err("twice");
        assert_eq!(e.errno(), libc::EEXIST);
        let e = c.mkdir(ROOT_INO, "data").await.expect_err("store dir");
        assert_eq!(e.errno(), libc::EEXIST);
        let step = c.mkdir(d.attr.ino, "step-100").await.expect("nested");
        let (_, fh) = c
            .create(step.attr.ino, "model.pt", 0)
            .await
            .expect("create");
        c.write(fh, 0, b"weights").expect("write");
        c.flush(fh).await.expect("flush");
        c.release_write(fh).await;
        assert_eq!(
            stored(&fx, "ckpt/step-100/model.pt").await.as_deref(),
            Some(&b"weights"[..])
        );
        let e = c
            .rmdir(d.attr.ino, "step-100")
            .await
            .expect_err("not empty");
        assert_eq!(e.errno(), libc::ENOTEMPTY);
        let empty = c.mkdir(d.attr.ino, "step-200").await.expect("mkdir");
        c.rmdir(d.attr.ino, "step-200").await.expect("rmdir empty");
        let e = c.getattr(empty.attr.ino).await.expect_err("gone");
        assert_eq!(e.errno(), libc::ENOENT);
        // The store decides, not the cached listing (black-box finding: `rm -rf`
        // returned 0 over files a stale listing missed, and they stayed in the store).
        let late = c.mkdir(d.attr.ino, "step-300").await.expect("mkdir");
        let listed = c.opendir(late.attr.ino).await.expect("opendir");
        c.releasedir(listed);
        fx.mem
            .put_opts(
                &"ckpt/step-300/written-elsewhere".into(),
                Bytes::from_static(b"x").into(),
                Default::default(),
            )
            .await
            .expect("another writer");
        let e = c
            .rmdir(d.attr.ino, "step-300")
            .await
            .expect_err("the store holds a file there");
        assert_eq!(e.errno(), libc::ENOTEMPTY);
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_written_file_becomes_its_passthrough_copy_and_leftovers_are_cleared() {
    timed(async {
        // A staging file left by a crash is removed at start and never uploaded.
        let pre = tempfile::tempdir().expect("tempdir");
        let staging = pre.path().join("staging");
        std::fs::create_dir_all(&staging).expect("mkdir");
        std::fs::write(staging.join("7.part"), b"torn").expect("leftover");
        let fx = fixture(|o, dir| {
            o.writes.as_mut().expect("writes").staging_dir = staging.clone();
            o.passthrough =
                Some(PassthroughOptions::open(dir.join("pt"), 4 << 30).expect("copies"));
        })
        .await;
        assert_eq!(staged_files(&staging).len(), 0);
        let c = &fx.core;
        let want = data(200 * 1024, 5);
        let (e, fh) = c.create(ROOT_INO, "shard.tar", 0).await.expect("create");
        c.write(fh, 0, &want).expect("write");
        c.flush(fh).await.expect("flush");
        c.release_write(fh).await;
        // The next open passes through to the staged bytes, now the copy: no GET.
        let gets = fx.faulty.gets().count;
        let o = c.open(e.attr.ino, false).await.expect("open");
        let file = o.passthrough.expect("served from the copy");
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut buf).expect("read copy");
        assert_eq!(buf, want);
        assert_eq!(fx.faulty.gets().count, gets);
        assert_eq!(stored(&fx, "shard.tar").await.as_deref(), Some(&want[..]));
    })
    .await
    .expect("bounded");
}

/// Black-box finding: with `--allow-other`, files a local store keeps private were
/// shown 0444 to every user. The owner and modes shown are the operator's to set.
#[tokio::test]
async fn owner_and_modes_shown_are_the_ones_asked_for() {
    timed(async {
        let fx = fixture(|o, _| {
            o.uid = 4321;
            o.gid = 8765;
            o.file_mode = Some(0o440);
            o.dir_mode = Some(0o750);
        })
        .await;
        let c = &fx.core;
        let d = c.lookup(ROOT_INO, "old").await.expect("a folder");
        assert_eq!((d.attr.perm, d.attr.uid, d.attr.gid), (0o750, 4321, 8765));
        let f = c.lookup(d.attr.ino, "obj").await.expect("a file");
        assert_eq!((f.attr.perm, f.attr.uid, f.attr.gid), (0o440, 4321, 8765));
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_read_only_core_refuses_every_write_with_erofs() {
    timed(async {
        // Black-box finding: a writable mount said it had no free inodes (`df -i`
        // 100%); a read-only one has none to give.
        // Black-box finding (round 16): and 1 total beside 2^32 free (`df -i` IUsed
        // -4294967294): the total counts the free ones too.
        let writable = fixture(|_, _| {}).await;
        let st = writable.core.statfs();
        assert!(
            st.ffree > 0 && st.ffree < st.files,
            "{} of {}",
            st.ffree,
            st.files
        );
        let fx = fixture(|o, _| o.writes = None).await;
        let c = &fx.core;
        assert_eq!(c.statfs().ffree, 0);
        assert!(c.statfs().files >= 1);
        assert_eq!(
            c.create(ROOT_INO, "x", 0)
                .await
                .expect_err("create")
                .errno(),
            libc::EROFS
        );
        assert_eq!(
            c.mkdir(ROOT_INO, "d").await.expect_err("mkdir").errno(),
            libc::EROFS
        );
        assert_eq!(
            c.unlink(ROOT_INO, "x").await.expect_err("unlink").errno(),
            libc::EROFS
        );
        let d = c.lookup(ROOT_INO, "data").await.expect("dir");
        assert_eq!(d.attr.perm, 0o555);
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_file_written_in_order_is_sent_while_written_and_a_rewrite_falls_back() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        // In order, 20 writes of 32 KiB: parts go out before the flush.
        let want = data(20 * 32 * 1024 + 5, 11);
        let (_, fh) = c.create(ROOT_INO, "stream.bin", 0).await.expect("create");
        for (i, piece) in want.chunks(32 * 1024).enumerate() {
            c.write(fh, (i * 32 * 1024) as u64, piece).expect("write");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while fx.faulty.parts_put() < 5 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "parts sent while written"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            stored(&fx, "stream.bin").await.is_none(),
            "not visible before the flush"
        );
        c.flush(fh).await.expect("flush completes the stream");
        assert_eq!(stored(&fx, "stream.bin").await.as_deref(), Some(&want[..]));
        assert!(
            fx.faulty.parts_put() <= 11,
            "each part sent once: {}",
            fx.faulty.parts_put()
        );
        c.release_write(fh).await;

        // In order past the threshold, then a header patched at the start: the stream
        // breaks and the flush uploads the file as it is.
        let mut want = data(400 * 1024, 12);
        let (_, fh) = c.create(ROOT_INO, "patched.bin", 0).await.expect("create");
        for (i, piece) in want.chunks(64 * 1024).enumerate() {
            c.write(fh, (i * 64 * 1024) as u64, piece).expect("write");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.write(fh, 3, b"HEADER").expect("patch");
        want[3..9].copy_from_slice(b"HEADER");
        c.flush(fh).await.expect("flush falls back");
        assert_eq!(stored(&fx, "patched.bin").await.as_deref(), Some(&want[..]));
        c.release_write(fh).await;

        // The store failing a streamed part: the flush falls back and, with the store
        // back, uploads the file whole.
        let want = data(300 * 1024, 13);
        let (_, fh) = c.create(ROOT_INO, "flaky.bin", 0).await.expect("create");
        fx.faulty.set_config(FaultConfig {
            fail_parts_after: Some(1),
            ..Default::default()
        });
        for (i, piece) in want.chunks(64 * 1024).enumerate() {
            c.write(fh, (i * 64 * 1024) as u64, piece).expect("write");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        fx.faulty.set_config(FaultConfig::default());
        c.flush(fh).await.expect("fallback upload");
        assert_eq!(stored(&fx, "flaky.bin").await.as_deref(), Some(&want[..]));
        c.release_write(fh).await;
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn many_files_created_in_one_directory_do_not_list_it_per_file() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        let before = fx.faulty.reads();
        for i in 0..20 {
            let name = format!("out-{i:03}");
            // The kernel looks each new name up (a miss) before creating it.
            let e = c.lookup(dir.attr.ino, &name).await.expect_err("new");
            assert_eq!(e.errno(), libc::ENOENT);
            let (_, fh) = c.create(dir.attr.ino, &name, 0).await.expect("create");
            c.write(fh, 0, name.as_bytes()).expect("write");
            c.flush(fh).await.expect("flush");
            c.release_write(fh).await;
        }
        // One HEAD per upload (the store's ETag), the first name's HEAD and LIST, and
        // one listing of the directory: not a HEAD and a LIST per new name.
        let reads = fx.faulty.reads() - before;
        assert!(reads <= 20 + 3, "store reads for 20 new files: {reads}");
        // The listing, updated in place, shows every new file.
        let h = c.opendir(dir.attr.ino).await.expect("opendir");
        let names: Vec<String> = c
            .readdir(h, 0, 100)
            .await
            .expect("readdir")
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(names.iter().filter(|n| n.starts_with("out-")).count(), 20);
        let got = c.lookup(dir.attr.ino, "out-007").await.expect("written");
        assert_eq!(read_back(c, got.attr.ino).await, b"out-007".to_vec());
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_part_the_store_fails_now_and_then_is_sent_again_not_the_whole_upload() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        // Every third attempt to send a part fails (5xx-like); each part is retried
        // on its own, so the upload of 12 parts goes through.
        fx.faulty.set_config(FaultConfig {
            part_fail_every: 3,
            ..Default::default()
        });
        let want = data(12 * 64 * 1024 - 100, 21);
        let (_, fh) = c.create(ROOT_INO, "retried.bin", 0).await.expect("create");
        c.write(fh, 0, &want).expect("write");
        c.flush(fh).await.expect("flush despite failing parts");
        c.release_write(fh).await;
        assert_eq!(stored(&fx, "retried.bin").await.as_deref(), Some(&want[..]));
    })
    .await
    .expect("bounded");
}

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

#[tokio::test]
async fn many_files_uploading_at_once_share_a_bounded_upload_memory() {
    timed(async {
        // Six files of five parts closed at once, each allowed 3 parts on the wire;
        // parts take 20 ms. With room for two parts across the mount, at most two are
        // on the wire (and none waits forever); without the bound, many more.
        for (memory, most) in [(128u64 << 10, Some(2)), (1 << 30, None)] {
            let fx = fixture(|o, _| {
                let w = o.writes.as_mut().expect("writes");
                w.upload_memory = memory;
                w.stream_from = 0;
            })
            .await;
            fx.faulty.set_config(FaultConfig {
                part_latency: Duration::from_millis(20),
                ..Default::default()
            });
            let c = &fx.core;
            let mut handles = Vec::new();
            for i in 0..6u8 {
                let want = data(300 * 1024 + i as usize * 1000, 30 + i);
                let (_, fh) = c
                    .create(ROOT_INO, &format!("f{i}"), 0)
                    .await
                    .expect("create");
                for (k, piece) in want.chunks(50_000).enumerate() {
                    c.write(fh, (k * 50_000) as u64, piece).expect("write");
                }
                handles.push((fh, want));
            }
            let flushes: Vec<_> = handles
                .iter()
                .map(|(fh, _)| {
                    let (c, fh) = (c.clone(), *fh);
                    tokio::spawn(async move { c.flush(fh).await })
                })
                .collect();
            for f in flushes {
                f.await.expect("join").expect("flush");
            }
            for (i, (fh, want)) in handles.into_iter().enumerate() {
                c.release_write(fh).await;
                assert_eq!(stored(&fx, &format!("f{i}")).await, Some(want));
            }
            let seen = fx.faulty.max_parts_in_flight();
            match most {
                Some(m) => assert!(seen <= m, "parts on the wire at once: {seen}"),
                None => assert!(seen > 2, "unbounded, parts at once: {seen}"),
            }
        }
    })
    .await
    .expect("bounded: no upload waits forever for memory");
}

#[tokio::test]
async fn written_files_become_copies_only_in_free_room() {
    timed(async {
        // Room for 300 KiB of copies.
        let fx = fixture(|o, dir| {
            o.passthrough =
                Some(PassthroughOptions::open(dir.join("pt"), 300 << 10).expect("copies"));
        })
        .await;
        let c = &fx.core;
        let mut inos = Vec::new();
        for i in 0..3u8 {
            let want = data(120 * 1024, 40 + i);
            let (e, fh) = c
                .create(ROOT_INO, &format!("shard{i}"), 0)
                .await
                .expect("create");
            c.write(fh, 0, &want).expect("write");
            c.flush(fh).await.expect("flush");
            c.release_write(fh).await;
            inos.push(e.attr.ino);
        }
        // The first two fit; the third's staging evicted the least recently opened
        // copy to make room, and a file that borrowed room is not kept as a copy.
        let opened: Vec<bool> = {
            let mut v = Vec::new();
            for ino in &inos {
                let o = c.open(*ino, false).await.expect("open");
                v.push(o.passthrough.is_some());
                c.release(o.fh);
            }
            v
        };
        assert_eq!(opened, vec![false, true, false]);
        // Every file is in the store whole either way.
        for i in 0..3u8 {
            assert_eq!(
                stored(&fx, &format!("shard{i}")).await,
                Some(data(120 * 1024, 40 + i))
            );
        }
    })
    .await
    .expect("bounded");
}

/// A file being written is charged to the local files' budget it shares with the
/// copies: it evicts the least recently opened copies while it grows (a copy can be
/// made again; a staged file is the only copy of what was written), its charge ends
/// when it leaves staging, and one that made room that way is not kept as a copy (the
/// room goes back to copies reads earn); one that fit is.
#[tokio::test]
async fn staged_files_count_against_the_copies_budget() {
    timed(async {
        let (fx, copies) = fixture_with_copies(300 << 10, |_| {}).await;
        let c = &fx.core;
        let mut inos = Vec::new();
        for i in 0..2u8 {
            let (e, fh) = c
                .create(ROOT_INO, &format!("shard{i}"), 0)
                .await
                .expect("create");
            c.write(fh, 0, &data(120 << 10, i)).expect("write");
            c.flush(fh).await.expect("flush");
            c.release_write(fh).await;
            inos.push(e.attr.ino);
        }
        assert_eq!((copies.len(), copies.bytes()), (2, 240 << 10));
        let (e, fh) = c.create(ROOT_INO, "big", 0).await.expect("create");
        let big = data(150 << 10, 9);
        for (i, chunk) in big.chunks(50 << 10).enumerate() {
            c.write(fh, (i as u64) * (50 << 10), chunk).expect("write");
        }
        assert_eq!(copies.staged_bytes(), 150 << 10, "charged as written");
        assert_eq!(
            (copies.len(), copies.bytes()),
            (1, 120 << 10),
            "the older copy made room"
        );
        let served: Vec<bool> = {
            let mut v = Vec::new();
            for ino in &inos {
                let o = c.open(*ino, false).await.expect("open");
                v.push(o.passthrough.is_some());
                c.release(o.fh);
            }
            v
        };
        assert_eq!(served, vec![false, true]);
        // A write the disk refuses (past the largest file size) keeps no charge.
        c.write(fh, 1 << 62, b"x").expect_err("EFBIG");
        assert_eq!(copies.staged_bytes(), 150 << 10);
        // A truncate gives bytes back; a regrowth takes them again.
        c.setattr(e.attr.ino, Some(10 << 10), None)
            .await
            .expect("truncate");
        assert_eq!(copies.staged_bytes(), 10 << 10);
        for (i, chunk) in big.chunks(50 << 10).enumerate() {
            c.write(fh, (i as u64) * (50 << 10), chunk).expect("write");
        }
        assert_eq!(copies.staged_bytes(), 150 << 10);
        c.flush(fh).await.expect("flush");
        c.release_write(fh).await;
        assert_eq!(copies.staged_bytes(), 0, "uncharged when it left staging");
        assert_eq!(
            (copies.len(), copies.bytes()),
            (1, 120 << 10),
            "not adopted: its staging evicted a copy"
        );
        let o = c.open(e.attr.ino, false).await.expect("open");
        assert!(o.passthrough.is_none());
        c.release(o.fh);
        assert_eq!(stored(&fx, "big").await, Some(big));
        // A file that fits beside the copies all along is adopted.
        let small = data(100 << 10, 11);
        let (e, fh) = c.create(ROOT_INO, "small", 0).await.expect("create");
        c.write(fh, 0, &small).expect("write");
        c.flush(fh).await.expect("flush");
        c.release_write(fh).await;
        assert_eq!((copies.len(), copies.bytes()), (2, 220 << 10));
        let o = c.open(e.attr.ino, false).await.expect("open");
        assert!(o.passthrough.is_some());
        c.release(o.fh);
        let staging = staged_files(&fx.dir.path().join("staging"));
        assert_eq!(staging.len(), 0, "nothing left staged");
    })
    .await
    .expect("bounded");
}

/// A large file written in order past the budget evicts the copies, then frees what
/// its stream has sent (a hole punched in the staging file) rather than overrun the
/// budget: its local footprint stays near its parts in flight and the object is whole.
/// A write below the freed bytes is refused with the reason (the file could no longer
/// be uploaded whole), and the file is then not uploaded: its close fails (black-box
/// finding: a zip or header-patched file whose patch was refused was published
/// unpatched, the close returning 0).
#[tokio::test]
async fn a_streamed_file_frees_what_it_sent_when_the_budget_is_short() {
    timed(async {
        let (fx, copies) = fixture_with_copies(512 << 10, |_| {}).await;
        let c = &fx.core;
        for i in 0..2u8 {
            let (_, fh) = c
                .create(ROOT_INO, &format!("read{i}"), 0)
                .await
                .expect("create");
            c.write(fh, 0, &data(100 << 10, i)).expect("write");
            c.flush(fh).await.expect("flush");
            c.release_write(fh).await;
        }
        assert_eq!((copies.len(), copies.bytes()), (2, 200 << 10));
        // 4 MiB in 64 KiB writes: 512 KiB of room with the copies evicted, 8x less.
        let want = data(4 << 20, 21);
        let (_, fh) = c.create(ROOT_INO, "ckpt.bin", 0).await.expect("create");
        let mut most_staged = 0;
        for (i, piece) in want.chunks(64 << 10).enumerate() {
            c.write(fh, (i as u64) * (64 << 10), piece).expect("write");
            most_staged = most_staged.max(copies.staged_bytes());
            // Let the stream take what was written (it reads off the runtime).
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(copies.len(), 0, "the copies made room first");
        assert!(
            most_staged <= 512 << 10,
            "staged within the budget: {most_staged}"
        );
        let staging = staged_files(&fx.dir.path().join("staging"))
            .into_iter()
            .next()
            .expect("the staged file");
        let meta = std::fs::metadata(&staging).expect("meta");
        assert_eq!(meta.len(), 4 << 20, "the size stays");
        let on_disk = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
        assert!(on_disk <= 1 << 20, "sent bytes freed: {on_disk} on disk");
        let err = c
            .write(fh, 4096, b"patch")
            .expect_err("below the freed bytes");
        assert!(err.to_string().contains("freed"), "{err}");
        let err = c.flush(fh).await.expect_err("a file that missed a write");
        assert_eq!(err.errno(), libc::ENOTSUP, "{err}");
        c.release_write(fh).await;
        assert_eq!(stored(&fx, "ckpt.bin").await, None, "nothing published");
        assert_eq!(copies.staged_bytes(), 0);
        assert_eq!(copies.len(), 0, "a freed file is not adopted as a copy");

        // A close in the middle (a forked child's copy of the descriptor exiting)
        // completes the upload of a freed file as it is, and seals it: the next write
        // is refused, never sent again from the freed (zeroed) start.
        let (_, fh) = c.create(ROOT_INO, "ckpt2.bin", 0).await.expect("create");
        for (i, piece) in want.chunks(64 << 10).enumerate().take(32) {
            c.write(fh, (i as u64) * (64 << 10), piece).expect("write");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        c.flush(fh).await.expect("the close of a dup");
        let err = c.write(fh, 2 << 20, &want[2 << 20..(2 << 20) + 100]);
        assert!(err.expect_err("sealed").to_string().contains("freed"));
        let err = c
            .flush(fh)
            .await
            .expect_err("the refused write is reported");
        assert_eq!(err.errno(), libc::ENOTSUP, "{err}");
        c.release_write(fh).await;
        assert_eq!(
            stored(&fx, "ckpt2.bin").await.as_deref(),
            Some(&want[..2 << 20]),
            "what the first close uploaded, whole"
        );
    })
    .await
    .expect("bounded");
}

/// A close in another process than the opener (a forked child exiting, or an `exec`
/// closing its copy of the descriptor) does not upload: the opener may still be
/// writing, and its own close uploads the whole file (with the error, if any).
#[tokio::test]
async fn a_close_in_another_process_leaves_the_upload_to_the_opener() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        let mut child = std::process::Command::new("sleep")
            .arg("20")
            .spawn()
            .expect("a child process");
        let other = child.id();
        let want = data(300 << 10, 31);
        let (_, fh) = c.create(ROOT_INO, "forked.bin", me).await.expect("create");
        c.write(fh, 0, &want[..100 << 10]).expect("write");
        c.close(fh, other).await.expect("the child's close");
        assert_eq!(
            stored(&fx, "forked.bin").await,
            None,
            "nothing half-written sent"
        );
        c.write(fh, 100 << 10, &want[100 << 10..])
            .expect("the opener writes on");
        c.close(fh, me).await.expect("the opener's close");
        assert_eq!(stored(&fx, "forked.bin").await.as_deref(), Some(&want[..]));
        // An unknown closer (0: outside the daemon's pid namespace) uploads, as before.
        let (_, fh) = c.create(ROOT_INO, "unknown.bin", me).await.expect("create");
        c.write(fh, 0, b"x").expect("write");
        c.close(fh, 0).await.expect("close");
        assert_eq!(stored(&fx, "unknown.bin").await.as_deref(), Some(&b"x"[..]));
        // A close before anything was written (a `touch`ed marker) uploads the empty
        // file: it is an object once close() returns, not only at the release the
        // kernel sends later (crash finding: a kill -9 in between lost it). A shell's
        // `>` closes that first descriptor before the command writes: the empty object
        // goes first, then the whole file at the last close.
        let (_, fh) = c.create(ROOT_INO, "empty.bin", me).await.expect("create");
        c.close(fh, me).await.expect("close");
        assert_eq!(stored(&fx, "empty.bin").await.as_deref(), Some(&b""[..]));
        c.write(fh, 0, b"echoed\n").expect("the command writes");
        c.close(fh, me).await.expect("the last close");
        assert_eq!(
            stored(&fx, "empty.bin").await.as_deref(),
            Some(&b"echoed\n"[..])
        );
        c.release_write(fh).await;
        assert_eq!(
            stored(&fx, "empty.bin").await.as_deref(),
            Some(&b"echoed\n"[..])
        );
        child.kill().expect("kill");
        child.wait().expect("reaped");
    })
    .await
    .expect("bounded");
}

/// Names in directory `ino`, through a fresh directory handle.
async fn names_in(c: &Arc<FsCore>, ino: u64) -> Vec<String> {
    let h = c.opendir(ino).await.expect("opendir");
    let mut names: Vec<String> = c
        .readdir(h, 0, 1000)
        .await
        .expect("readdir")
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != "." && n != "..")
        .collect();
    c.releasedir(h);
    names.sort();
    names
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

/// Past the budget, a file written faster than the store takes its parts waits for its
/// stream (`write_wait`, awaited before each write as the FUSE adapter does): what is
/// staged stays within the budget instead of piling up, and the object is whole.
#[tokio::test]
async fn a_write_past_the_budget_waits_for_a_lagging_stream() {
    timed(async {
        let (fx, copies) = fixture_with_copies(512 << 10, |_| {}).await;
        fx.faulty.set_config(FaultConfig {
            part_latency: Duration::from_millis(20),
            ..Default::default()
        });
        let c = &fx.core;
        let want = data(4 << 20, 41);
        let (_, fh) = c.create(ROOT_INO, "slow.bin", 0).await.expect("create");
        let (mut most_staged, mut waits) = (0, 0);
        for (i, piece) in want.chunks(64 << 10).enumerate() {
            let offset = (i as u64) * (64 << 10);
            if let Some(wait) = c.write_wait(fh, offset + piece.len() as u64) {
                waits += 1;
                wait.await;
            }
            c.write(fh, offset, piece).expect("write");
            most_staged = most_staged.max(copies.staged_bytes());
        }
        assert!(waits > 0, "the writer outran the store");
        assert!(
            most_staged <= 512 << 10,
            "staged within the budget: {most_staged}"
        );
        c.flush(fh).await.expect("flush");
        assert_eq!(stored(&fx, "slow.bin").await.as_deref(), Some(&want[..]));
        c.release_write(fh).await;
        assert_eq!(copies.staged_bytes(), 0);
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

/// Black-box findings (round 10): READDIRPLUS handed the kernel the opendir's
/// snapshot, which it links into its dentry cache with the attributes given. While a
/// program wrote in the folder, that linked `state.json` to the inode `os.replace`
/// had replaced (since forgotten: `open` failed EBADF, "unknown inode"), a removed name
/// to its detached inode (a create there failed EBADF or ENOENT), and a file just
/// uploaded to the 0 bytes it had when listed (its read-back was empty). Each entry is
/// now resolved again when it is handed out.
#[tokio::test]
async fn readdirplus_hands_out_each_name_as_it_is_now_not_as_opendir_listed_it() {
    timed(async {
        let fx = fixture_replacing().await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        let write = |name: &'static str, bytes: &'static [u8]| save(c, dir.attr.ino, name, bytes);
        let old_state = write("state.json", b"{}").await;
        write("lock", b"1").await;
        let (_, growing) = c.create(dir.attr.ino, "log", 0).await.expect("create");
        // A lister opens the folder: its snapshot holds every name as it is now.
        let listed = c.opendir(dir.attr.ino).await.expect("opendir");
        // Meanwhile: an atomic save over state.json, lock removed, log written on.
        let tmp = write("state.json.tmp", b"{\"step\": 2}").await;
        c.rename(
            dir.attr.ino,
            "state.json.tmp",
            dir.attr.ino,
            "state.json",
            false,
        )
        .await
        .expect("replace");
        c.unlink(dir.attr.ino, "lock").await.expect("unlink");
        c.write(growing, 0, b"0123456789").expect("write on");
        let entries = c.readdir_plus(listed, 0, 100).await.expect("readdirplus");
        let by_name = |n: &str| entries.iter().find(|e| e.name == n).map(|e| e.entry);
        let state = by_name("state.json").expect("state.json listed");
        assert_eq!(
            state.attr.ino, tmp.attr.ino,
            "the inode the rename moved there"
        );
        assert_ne!(state.attr.ino, old_state.attr.ino);
        assert_eq!(state.attr.size, 11);
        assert!(by_name("lock").is_none(), "removed since the opendir");
        assert!(by_name("state.json.tmp").is_none(), "renamed away");
        assert_eq!(by_name("log").expect("log").attr.size, 10, "its size now");
        // Each entry handed out holds a reference, as the kernel counts one: given
        // back (it did not fit), the one it took is gone, and the inode with it.
        let state_gone = entries
            .iter()
            .find(|e| e.name == "state.json")
            .expect("entry");
        c.forget(tmp.attr.ino, 1); // create's reference, forgotten by the kernel
        c.not_handed_out(state_gone);
        let e = c
            .getattr(tmp.attr.ino)
            .await
            .expect_err("no reference left");
        assert_eq!(e.errno(), libc::EBADF);
        c.releasedir(listed);
        c.flush(growing).await.expect("flush");
        c.release_write(growing).await;
    })
    .await
    .expect("bounded");
}

/// Crash finding: the staging folder removed under a live writable mount (a tmp
/// cleaner under the default temp cache dir) made every later create fail ENOENT until
/// a restart. It is made again when a create finds it gone.
#[tokio::test]
async fn a_staging_folder_removed_under_the_mount_is_made_again() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        std::fs::remove_dir_all(fx.dir.path().join("staging")).expect("rm -rf staging");
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        let (_, fh) = c.create(dir.attr.ino, "new.bin", 0).await.expect("create");
        c.write(fh, 0, b"written").expect("write");
        c.flush(fh).await.expect("flush");
        c.release_write(fh).await;
        assert_eq!(
            stored(&fx, "data/new.bin").await.as_deref(),
            Some(&b"written"[..])
        );
    })
    .await
    .expect("bounded");
}

/// Crash finding (round 10): a multipart completion the store applied, its answer
/// lost, failed the close with EIO though the object had been replaced (the clean-up's
/// abort found no such upload). That case now reads the object back: the bytes sent
/// are there, so the close succeeds.
#[tokio::test]
async fn a_completion_whose_answer_was_lost_is_a_success_when_the_object_landed() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let want = data(400 * 1024, 5);
        let (_, fh) = c.create(ROOT_INO, "ckpt.bin", 0).await.expect("create");
        c.write(fh, 0, &want).expect("write");
        fx.faulty.set_config(FaultConfig {
            lose_completion_answers: true,
            ..Default::default()
        });
        c.flush(fh).await.expect("landed: the close succeeds");
        c.release_write(fh).await;
        fx.faulty.set_config(FaultConfig::default());
        assert_eq!(stored(&fx, "ckpt.bin").await.as_deref(), Some(&want[..]));
    })
    .await
    .expect("bounded");
}

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

/// Black-box finding (round 10): while an open to append was filling its staging file
/// from the object, the path showed that partial file (size 0) to a listing, the
/// kernel took that size, and the append that followed was written at offset 0 over
/// the file's start: acknowledged appends lost while another process ran `ls -l`.
/// Until the fill ends the path shows the object.
#[tokio::test]
async fn a_file_being_filled_for_an_append_shows_the_object_not_the_partial_copy() {
    timed(async {
        let fx = fixture(|o, _| {
            o.writes.as_mut().expect("writes").allow_overwrite = true;
        })
        .await;
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("old");
        let obj = c.lookup(old.attr.ino, "obj").await.expect("obj");
        fx.faulty.set_config(FaultConfig {
            latency: Duration::from_millis(400),
            ..Default::default()
        });
        let core = fx.core.clone();
        let ino = obj.attr.ino;
        let opening = tokio::spawn(async move { core.open_write(ino, false, 0).await });
        // Past the version check (a HEAD, one latency), within the fill (a read, one more).
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!opening.is_finished(), "still filling");
        let listed = c.opendir(old.attr.ino).await.expect("opendir");
        let entries = c.readdir_plus(listed, 0, 100).await.expect("readdirplus");
        let e = entries.iter().find(|e| e.name == "obj").expect("listed");
        assert_eq!(
            e.entry.attr.size, 1000,
            "the object's size, not the partial copy's"
        );
        for e in &entries {
            c.not_handed_out(e);
        }
        c.releasedir(listed);
        let o = opening.await.expect("join").expect("opened");
        fx.faulty.set_config(FaultConfig::default());
        c.write(o.fh, 1000, b"appended").expect("append");
        c.close(o.fh, 0).await.expect("close");
        c.release_write(o.fh).await;
        let mut want = data(1000, 1);
        want.extend_from_slice(b"appended");
        assert_eq!(stored(&fx, "old/obj").await, Some(want));
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 22): a listing that said an object was 1,000 bytes shorter
/// than it is (its ETag right) made an append fill its staging file up to the listed
/// size, and the close stored the object without its last 1,000 bytes, returning 0. The
/// open's HEAD, which says the real size, now renews the attributes (ESTALE, the next
/// open is right), and the fill's GET is refused at another size anyway.
#[tokio::test]
async fn an_append_over_a_listing_with_a_wrong_size_keeps_every_byte() {
    timed(async {
        let fx = fixture(|o, _| {
            o.writes.as_mut().expect("writes").allow_overwrite = true;
        })
        .await;
        fx.faulty.set_config(FaultConfig {
            list_sizes_short_by: 100,
            ..Default::default()
        });
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("old");
        let listed = c.opendir(old.attr.ino).await.expect("opendir");
        let entries = c.readdir_plus(listed, 0, 100).await.expect("readdirplus");
        let e = entries.iter().find(|e| e.name == "obj").expect("listed");
        assert_eq!(e.entry.attr.size, 900, "the listing's size");
        for e in &entries {
            c.not_handed_out(e);
        }
        c.releasedir(listed);
        let obj = c.lookup(old.attr.ino, "obj").await.expect("obj");
        assert_eq!(obj.attr.size, 900, "the listing's size");
        let ino = obj.attr.ino;
        let o = match c.open_write(ino, false, 0).await {
            Ok(o) => o,
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        strata_fs::Error::Cache(strata_cache_core::CacheError::Changed(_))
                    ),
                    "{e}"
                );
                let again = c.lookup(old.attr.ino, "obj").await.expect("obj");
                assert_eq!(again.attr.size, 1000, "the HEAD's size now");
                c.open_write(again.attr.ino, false, 0)
                    .await
                    .expect("opened again")
            }
        };
        c.write(o.fh, 1000, b"appended").expect("append");
        c.close(o.fh, 0).await.expect("close");
        c.release_write(o.fh).await;
        let mut want = data(1000, 1);
        want.extend_from_slice(b"appended");
        assert_eq!(stored(&fx, "old/obj").await, Some(want));
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 11): files closed at once in one folder each updated the
/// folder's cached listing by reading it, adding their name and putting it back; the
/// later put dropped the earlier name, and a listing right after that file's close did
/// not show it (22-55 of ~2,000 creates beside a lister). Every name closed is listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_closed_at_once_in_one_folder_are_all_in_its_listing() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        for round in 0..8 {
            // The folder's listing cached, as a lister keeps it.
            let listed = c.opendir(dir.attr.ino).await.expect("opendir");
            c.releasedir(listed);
            let tasks: Vec<_> = (0..16)
                .map(|i| {
                    let core = fx.core.clone();
                    let ino = dir.attr.ino;
                    tokio::spawn(async move {
                        let name = format!("r{round}_f{i}");
                        let (_, fh) = core.create(ino, &name, 0).await.expect("create");
                        core.write(fh, 0, b"x").expect("write");
                        core.close(fh, 0).await.expect("close");
                        core.release_write(fh).await;
                        name
                    })
                })
                .collect();
            let mut names = Vec::new();
            for t in tasks {
                names.push(t.await.expect("join"));
            }
            let listed = c.opendir(dir.attr.ino).await.expect("opendir");
            let shown: std::collections::HashSet<String> = c
                .readdir(listed, 0, 10_000)
                .await
                .expect("readdir")
                .into_iter()
                .map(|e| e.name)
                .collect();
            c.releasedir(listed);
            let missing: Vec<_> = names.iter().filter(|n| !shown.contains(*n)).collect();
            assert!(
                missing.is_empty(),
                "round {round}: not listed after close: {missing:?}"
            );
        }
    })
    .await
    .expect("bounded");
}

/// The fixture's staging folder (`fixture` gives every core `<dir>/staging`).
fn staging_dir(fx: &Fixture) -> std::path::PathBuf {
    fx.dir.path().join("staging")
}

/// The regular files in staging folder `dir` (its `files` folder, and its top).
fn staged_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    [
        dir.to_path_buf(),
        strata_fs::filesystem::staged_files_dir(dir),
    ]
    .iter()
    .filter_map(|d| std::fs::read_dir(d).ok())
    .flat_map(|d| d.flatten())
    .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
    .map(|e| e.path())
    .collect()
}

fn fsync_records(dir: &std::path::Path) -> usize {
    strata_fs::filesystem::fsync_records(dir)
}

/// The object `path` once the store holds it, polled for at most `wait`.
async fn stored_within(fx: &Fixture, path: &str, wait: Duration) -> Option<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let got = stored(fx, path).await;
        if got.is_some() || tokio::time::Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A core over the fixture's store (labelled `label`) and `staging_dir`, as the next
/// start of a mount after a crash.
fn restarted(fx: &Fixture, staging_dir: std::path::PathBuf, label: &str) -> Arc<FsCore> {
    restarted_at(fx, staging_dir, label, None)
}

fn restarted_at(
    fx: &Fixture,
    staging_dir: std::path::PathBuf,
    label: &str,
    endpoint: Option<&str>,
) -> Arc<FsCore> {
    restarted_mounted(fx, staging_dir, label, endpoint, None)
}

/// As [`restarted_at`], for a mount at canonical mountpoint `mountpoint`.
/// What a restarted daemon reads `fx`'s store (through its fault injector) with: a fresh
/// memory tier, and the store as `label`.
fn restarted_parts(fx: &Fixture, label: &str) -> (CacheEngine, strata_cache_core::BackingStore) {
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(64 << 20)))
        .build()
        .expect("engine");
    let store = strata_cache_core::BackingStore::new(
        fx.faulty.clone() as Arc<dyn ObjectStore>,
        label,
        strata_cache_core::RetryPolicy::default(),
    );
    (engine, store)
}

fn restarted_mounted(
    fx: &Fixture,
    staging_dir: std::path::PathBuf,
    label: &str,
    endpoint: Option<&str>,
    mountpoint: Option<&str>,
) -> Arc<FsCore> {
    let (engine, mut store) = restarted_parts(fx, label);
    if let Some(e) = endpoint {
        store = store.at_endpoint(e);
    }
    let mut w = WriteOptions::new(staging_dir);
    w.part_size = 64 << 10;
    w.mountpoint = mountpoint.map(std::path::PathBuf::from);
    core_writing(engine, store, w)
}

/// A core over `engine` and `store` whose mount takes writes as `w` says.
fn core_writing(
    engine: CacheEngine,
    store: strata_cache_core::BackingStore,
    w: WriteOptions,
) -> Arc<FsCore> {
    Arc::new(FsCore::new(
        ObjectReader::new(engine, store, BS).expect("reader"),
        "",
        CoreOptions {
            writes: Some(w),
            ..Default::default()
        },
    ))
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

/// Black-box finding (round 18b): files kept for a later upload were counted in no
/// budget nor in the figures (27 MiB kept against a 16 MiB budget showed "staged writes
/// 0.0 MiB"). A kept file is charged to the local files' budget as a staged write until
/// it lands.
#[tokio::test]
async fn a_kept_file_counts_as_a_staged_write_until_it_lands() {
    timed(async {
        let (fx, copies) = fixture_with_copies(1 << 20, |_| {}).await;
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "ck", 0).await.expect("create");
        // Out of order, so not sent while written (such a file is uploaded at its fsync).
        let whole = data(200 << 10, 3);
        c.write(fh, 100 << 10, &whole[100 << 10..]).expect("write");
        c.write(fh, 0, &whole[..100 << 10]).expect("write");
        c.fsync(fh).await.expect("fsync");
        // Changed after the fsync: the close has an upload to make.
        c.write(fh, 0, b"head").expect("write after the fsync");
        fx.faulty.set_config(FaultConfig {
            writes_down: true,
            ..Default::default()
        });
        assert!(
            c.close(fh, 0).await.is_err(),
            "the close reports the failure"
        );
        c.release_write(fh).await;
        // Charged by the uploader's task, once it runs.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while copies.staged_bytes() != 200 << 10 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "kept, and charged: {} bytes",
                copies.staged_bytes()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fx.faulty.set_config(FaultConfig::default());
        let mut want = data(200 << 10, 3);
        want[..4].copy_from_slice(b"head");
        assert_eq!(
            stored_within(&fx, "ck", Duration::from_secs(15)).await,
            Some(want),
            "uploaded once the store is back"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while copies.staged_bytes() != 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "released once landed: {} bytes",
                copies.staged_bytes()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 22): passthrough copies of versions the mount itself
/// replaced or removed stayed on the cache disk, in the copies' budget and in `strata
/// stats` as live copies (20 files written 6 times and removed: 120 copies, 120 MiB).
/// Each is dropped once its version is replaced, removed or renamed away.
#[tokio::test]
async fn copies_of_replaced_and_removed_versions_are_dropped() {
    timed(async {
        let (fx, copies) = fixture_with_copies(4 << 20, |o| {
            let w = o.writes.as_mut().expect("writes");
            w.allow_overwrite = true;
            w.allow_delete = true;
        })
        .await;
        let c = &fx.core;
        let settled = |want: usize| {
            let copies = copies.clone();
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                while copies.len() != want {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "{} copies, not {want}",
                        copies.len()
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        for round in 0..3u8 {
            let fh = if round == 0 {
                c.create(ROOT_INO, "ck", 0).await.expect("create").1
            } else {
                let e = c.lookup(ROOT_INO, "ck").await.expect("ck");
                c.open_write(e.attr.ino, true, 0)
                    .await
                    .expect("overwrite")
                    .fh
            };
            c.write(fh, 0, &data(100 << 10, round)).expect("write");
            c.close(fh, 0).await.expect("close");
            c.release_write(fh).await;
            settled(1).await;
        }
        c.unlink(ROOT_INO, "ck").await.expect("rm");
        settled(0).await;
        assert_eq!(copies.bytes(), 0);
        // A rename too: the copy is named by the old path (round 22b: 2 copies for one
        // object after `mv a b` and a read of b).
        let (_, fh) = c.create(ROOT_INO, "a", 0).await.expect("create");
        c.write(fh, 0, &data(100 << 10, 9)).expect("write");
        c.close(fh, 0).await.expect("close");
        c.release_write(fh).await;
        settled(1).await;
        c.rename(ROOT_INO, "a", ROOT_INO, "b", false)
            .await
            .expect("mv a b");
        settled(0).await;
    })
    .await
    .expect("bounded");
}

/// A version another client replaced in the store: its passthrough copy is dropped
/// once the mount sees the new version (a lookup hands out the new inode), not kept in
/// the copies' budget until evicted (round 22b's leftover). Another object's copy stays.
#[tokio::test]
async fn the_copy_of_a_version_another_client_replaced_is_dropped() {
    timed(async {
        let (fx, copies) = fixture_with_copies(4 << 20, |o| o.metadata_ttl = Duration::ZERO).await;
        let c = &fx.core;
        let settled = |want: usize| {
            let copies = copies.clone();
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                while copies.len() != want {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "{} copies, not {want}",
                        copies.len()
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        let read_whole = |name: &'static str, size: usize| async move {
            let e = c.lookup(ROOT_INO, name).await.expect("lookup");
            let o = c.open(e.attr.ino, false).await.expect("open");
            let got = c.read(o.fh, 0, size as u32, 1).await.expect("read");
            c.release(o.fh);
            (e.attr.ino, got.to_vec())
        };
        put_elsewhere(&fx, "kept", data(90 << 10, 1)).await;
        put_elsewhere(&fx, "shard", data(100 << 10, 2)).await;
        read_whole("kept", 90 << 10).await;
        settled(1).await;
        let kept_bytes = copies.bytes();
        let (old_ino, _) = read_whole("shard", 100 << 10).await;
        settled(2).await;
        put_elsewhere(&fx, "shard", data(100 << 10, 3)).await;
        let e = c.lookup(ROOT_INO, "shard").await.expect("the new version");
        assert_ne!(e.attr.ino, old_ino, "a new inode for the new version");
        settled(1).await;
        assert_eq!(copies.bytes(), kept_bytes, "the other object's copy stays");
        let (_, got) = read_whole("shard", 100 << 10).await;
        assert_eq!(got, data(100 << 10, 3));
        settled(2).await;
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

/// `data/r` (5,000 `R`s) opened by a reader, then opened to be overwritten, 10 `W`s
/// written, and renamed to `data/r_2` while both are open: (inode, reader, writer).
async fn read_across_an_overwrite_and_a_rename(
    c: &std::sync::Arc<FsCore>,
) -> (
    u64,
    strata_fs::filesystem::Opened,
    strata_fs::filesystem::Opened,
) {
    let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
    let (e, fh) = c.create(dir.attr.ino, "r", 0).await.expect("create");
    c.write(fh, 0, &[b'R'; 5000]).expect("write");
    c.close(fh, 0).await.expect("close");
    c.release_write(fh).await;
    let ino = e.attr.ino;
    let rd = c.open(ino, false).await.expect("reader");
    let w = c.open_write(ino, true, 0).await.expect("overwrite");
    c.write(w.fh, 0, &[b'W'; 10]).expect("write");
    c.rename(dir.attr.ino, "r", dir.attr.ino, "r_2", false)
        .await
        .expect("rename while open");
    (ino, rd, w)
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

/// The JSON of fsync record file `bytes`: the newest of its two slots (each "SJR2",
/// sequence number u64, length u32, crc32c u32, then the JSON), or the whole file in
/// the older format. The crc32c is not checked here.
fn record_json(bytes: &[u8]) -> Option<serde_json::Value> {
    if bytes.first() == Some(&b'{') {
        return serde_json::from_slice(bytes).ok();
    }
    let (a, b) = bytes.split_at(bytes.len() / 2);
    fn slot(s: &[u8]) -> Option<(u64, &[u8])> {
        let seq = u64::from_le_bytes(s.get(4..12)?.try_into().ok()?);
        let len = u32::from_le_bytes(s.get(12..16)?.try_into().ok()?) as usize;
        (s.get(..4)? == b"SJR2").then_some((seq, s.get(20..20 + len)?))
    }
    let (_, json) = [slot(a), slot(b)]
        .into_iter()
        .flatten()
        .max_by_key(|(seq, _)| *seq)?;
    serde_json::from_slice(json).ok()
}

/// The fsync record in staging folder `dir` of the file to be uploaded to `path`.
fn record_of(dir: &std::path::Path, path: &str) -> std::path::PathBuf {
    staged_files(dir)
        .into_iter()
        .find(|f| {
            f.to_string_lossy().ends_with(".part.json")
                && std::fs::read(f)
                    .ok()
                    .and_then(|b| record_json(&b))
                    .is_some_and(|v| v["path"] == path)
        })
        .expect("its fsync record")
}

/// The staged file of fsync record `record`.
fn file_of(record: &std::path::Path) -> std::path::PathBuf {
    let name = record.to_string_lossy();
    std::path::PathBuf::from(name.strip_suffix(".json").expect("a record"))
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

/// Rewrites the fsync record of `path` in staging folder `dir` as written before a
/// power cut: in another page cache than the one the restart reads (in the older
/// format, which a start still reads).
fn before_a_power_cut(dir: &std::path::Path, path: &str) {
    let record = record_of(dir, path);
    let mut v = record_json(&std::fs::read(&record).expect("read")).expect("json");
    assert!(v["epoch"].is_string(), "the record names its page cache");
    v["epoch"] = serde_json::json!("another boot");
    std::fs::write(&record, serde_json::to_vec(&v).expect("json")).expect("write");
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

/// Creates `name` in folder `dir` holding `bytes`, flushed (uploaded) and released.
async fn save(c: &std::sync::Arc<FsCore>, dir: u64, name: &str, bytes: &[u8]) -> Entry {
    let (e, fh) = c.create(dir, name, 0).await.expect("create");
    c.write(fh, 0, bytes).expect("write");
    c.flush(fh).await.expect("flush");
    c.release_write(fh).await;
    e
}

/// Black-box finding (round 15): with `--metadata-ttl 0`, a listing left out a name
/// that existed throughout once it was saved by a rename over it (41% of listings), and
/// a folder whose one file was re-saved so listed as missing. A name whose listed inode
/// is stale is handed out as it is now.
#[tokio::test]
async fn with_no_ttl_a_name_renamed_over_since_the_opendir_is_still_listed() {
    timed(async {
        let fx = fixture(|o, _| {
            let w = o.writes.as_mut().expect("writes");
            w.allow_overwrite = true;
            w.allow_delete = true;
            o.metadata_ttl = Duration::ZERO;
        })
        .await;
        let c = &fx.core;
        let dir = c.lookup(ROOT_INO, "data").await.expect("dir");
        let write = |name: &'static str, bytes: &'static [u8]| save(c, dir.attr.ino, name, bytes);
        let old = write("state.json", b"{}").await;
        let listed = c.opendir(dir.attr.ino).await.expect("opendir");
        let tmp = write("state.json.tmp", b"{\"step\": 2}").await;
        c.rename(
            dir.attr.ino,
            "state.json.tmp",
            dir.attr.ino,
            "state.json",
            false,
        )
        .await
        .expect("replace");
        let entries = c.readdir_plus(listed, 0, 100).await.expect("readdirplus");
        let state = entries
            .iter()
            .find(|e| e.name == "state.json")
            .expect("state.json listed: it existed throughout");
        assert_eq!(state.entry.attr.ino, tmp.attr.ino, "the inode now there");
        assert_ne!(state.entry.attr.ino, old.attr.ino);
        assert_eq!(state.entry.attr.size, 11);
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

/// A writable core whose closes upload slowly (parts of 64 KiB, 30 ms each, never sent
/// while written), with `name` created and 512 KiB of `seed` bytes written: for what
/// another process does while a close uploads.
async fn slow_close_fixture(name: &str, seed: u8) -> (Fixture, Entry, u64, Vec<u8>) {
    let fx = fixture(|o, _| {
        let w = o.writes.as_mut().expect("writes");
        w.allow_overwrite = true;
        w.allow_delete = true;
        w.stream_from = u64::MAX;
    })
    .await;
    fx.faulty.set_config(FaultConfig {
        part_latency: Duration::from_millis(30),
        ..Default::default()
    });
    let (e, fh) = fx.core.create(ROOT_INO, name, 0).await.expect("create");
    let want = data(512 << 10, seed);
    fx.core.write(fh, 0, &want).expect("write");
    (fx, e, fh, want)
}

/// Black-box finding: a truncate by path from another process (no handle) while the
/// writer's close was uploading the file shrank it under the parts being read, and the
/// close failed EIO ("failed to fill whole buffer"), the file unpublished. The upload
/// now goes again as the file is when it failed: the close succeeds and the store holds
/// the truncated file, as a local disk would.
#[tokio::test]
async fn a_truncate_by_path_during_the_close_s_upload_does_not_fail_the_close() {
    timed(async {
        let (fx, e, fh, want) = slow_close_fixture("log.txt", 5).await;
        let c = &fx.core;
        // The close (FLUSH) and the release right after it, as the kernel sends them.
        let closing = {
            let c = c.clone();
            tokio::spawn(async move {
                let closed = c.flush(fh).await;
                c.release_write(fh).await;
                closed
            })
        };
        tokio::time::sleep(Duration::from_millis(45)).await;
        c.setattr(e.attr.ino, Some(7), None)
            .await
            .expect("truncate by path");
        closing.await.expect("join").expect("the close's upload");
        // The truncate, which returned 0, is in the store too (round 17b: it changed
        // the staged file after the close's upload and the release, and was lost).
        assert_eq!(stored(&fx, "log.txt").await.as_deref(), Some(&want[..7]));
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

/// Black-box finding: the folder of a store object stayed in the mount only as long as
/// the object did: `rm ckpt/step1/model.bin`, then writing the next checkpoint into
/// `ckpt/step1` failed ENOENT once the listing expired (and `.` in a shell there). A
/// folder a file left through the mount (removed, renamed away) stays, as one made by
/// `mkdir` does, until `rmdir`.
#[tokio::test]
async fn a_folder_whose_last_file_left_through_the_mount_stays_until_rmdir() {
    timed(async {
        let fx = fixture(|o, _| {
            o.metadata_ttl = Duration::ZERO;
            let w = o.writes.as_mut().expect("writes");
            w.allow_overwrite = true;
            w.allow_delete = true;
        })
        .await;
        let c = &fx.core;
        let old = c.lookup(ROOT_INO, "old").await.expect("lookup old");
        c.unlink(old.attr.ino, "obj").await.expect("rm old/obj");
        // A folder whose one object was deeper: `ckpt` goes with `ckpt/step1`.
        put_elsewhere(&fx, "ckpt/step1/model.bin", b"step 1".to_vec()).await;
        let ckpt = c.lookup(ROOT_INO, "ckpt").await.expect("lookup ckpt");
        let step1 = c
            .lookup(ckpt.attr.ino, "step1")
            .await
            .expect("lookup step1");
        c.unlink(step1.attr.ino, "model.bin")
            .await
            .expect("rm the model");
        let ckpt = c.lookup(ROOT_INO, "ckpt").await.expect("ckpt still there");
        c.lookup(ckpt.attr.ino, "step1")
            .await
            .expect("step1 still there");
        let data = c.lookup(ROOT_INO, "data").await.expect("lookup data");
        c.rename(data.attr.ino, "x", ROOT_INO, "x", false)
            .await
            .expect("mv data/x .");
        for folder in ["old", "data"] {
            let again = c.lookup(ROOT_INO, folder).await.expect("still there");
            assert!(
                names_in(c, ROOT_INO).await.contains(&folder.to_string()),
                "{folder} listed"
            );
            let (_, fh) = c
                .create(again.attr.ino, "next.bin", 0)
                .await
                .expect("a new file in it");
            c.write(fh, 0, b"step 2").expect("write");
            c.flush(fh).await.expect("close");
            c.release_write(fh).await;
            c.unlink(again.attr.ino, "next.bin").await.expect("rm");
            c.rmdir(ROOT_INO, folder).await.expect("rmdir");
            let gone = c.lookup(ROOT_INO, folder).await.expect_err("removed");
            assert_eq!(gone.errno(), libc::ENOENT, "{gone}");
        }
    })
    .await
    .expect("bounded");
}

/// Black-box finding: an open folder read again from its start (`rewinddir`, and
/// `os.listdir(fd)` / `scandir(fd)` of an open folder) kept showing the listing of its
/// opendir: a file removed since, and none made since, also past the TTL. POSIX has a
/// rewind see the folder as it is then; a pass from the start lists it again.
#[tokio::test]
async fn a_folder_read_again_from_its_start_is_listed_again() {
    timed(async {
        let fx = fixture_replacing().await;
        let c = &fx.core;
        let data = c.lookup(ROOT_INO, "data").await.expect("lookup data");
        let h = c.opendir(data.attr.ino).await.expect("opendir");
        let names = |entries: Vec<strata_fs::filesystem::DirEntry>| -> Vec<String> {
            entries.into_iter().map(|e| e.name).collect()
        };
        let first = names(c.readdir(h, 0, 100).await.expect("first pass"));
        assert!(first.contains(&"x".to_string()), "{first:?}");
        c.unlink(data.attr.ino, "x").await.expect("rm data/x");
        let (_, fh) = c.create(data.attr.ino, "y", 0).await.expect("create");
        c.flush(fh).await.expect("close");
        c.release_write(fh).await;
        // Further reads of the same pass keep its snapshot (cookies stay valid).
        let rest = names(c.readdir(h, 2, 100).await.expect("same pass"));
        assert!(rest.contains(&"x".to_string()), "{rest:?}");
        let again = names(c.readdir(h, 0, 100).await.expect("rewound"));
        assert!(
            again.contains(&"y".to_string()),
            "a file made since: {again:?}"
        );
        assert!(
            !again.contains(&"x".to_string()),
            "a file removed since: {again:?}"
        );
        let plus = names(c.readdir_plus(h, 0, 100).await.expect("rewound plus"));
        assert!(plus.contains(&"y".to_string()), "{plus:?}");
        c.releasedir(h);
    })
    .await
    .expect("bounded");
}

/// Round 17b: an unlink by another process while a writer's close uploaded the file
/// failed EBUSY (16-226 per run beside a create-write-close loop). It waits for the
/// upload under way and then removes the file, as a local disk would.
#[tokio::test]
async fn an_unlink_during_a_close_s_upload_waits_for_it() {
    timed(async {
        let (fx, _, fh, _) = slow_close_fixture("out.bin", 8).await;
        let c = &fx.core;
        let closing = {
            let c = c.clone();
            tokio::spawn(async move { c.flush(fh).await })
        };
        tokio::time::sleep(Duration::from_millis(45)).await;
        c.unlink(ROOT_INO, "out.bin")
            .await
            .expect("unlink, not EBUSY");
        closing.await.expect("join").expect("the close's upload");
        c.release_write(fh).await;
        assert_eq!(
            stored(&fx, "out.bin").await,
            None,
            "removed after its upload"
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 20): the HEAD after each upload (and the LISTs and HEADs of
/// renames and removals) were missing from the mount's `store_heads`/`store_lists`,
/// which counted lookups and listings only: a checkpoint writer's requests did not
/// show. They are counted where the mount's store handle sends them.
#[tokio::test]
async fn the_requests_of_writes_are_counted() {
    timed(async {
        let fx = fixture(|o, _| o.writes.as_mut().expect("writes").allow_delete = true).await;
        let c = &fx.core;
        let (heads, lists) = (c.store_heads(), c.store_lists());
        let (_, fh) = c.create(ROOT_INO, "counted.bin", 0).await.expect("create");
        c.write(fh, 0, b"bytes").expect("write");
        c.flush(fh).await.expect("flush uploads");
        c.release_write(fh).await;
        assert!(
            c.store_heads() > heads,
            "the upload's HEAD counted: {} then {}",
            heads,
            c.store_heads()
        );
        let heads = c.store_heads();
        c.unlink(ROOT_INO, "counted.bin").await.expect("unlink");
        assert!(
            c.store_heads() + c.store_lists() > heads + lists,
            "the removal's requests counted"
        );
    })
    .await
    .expect("bounded");
}

/// Black-box finding (round 20b): with `--metadata-ttl 0` every create in a folder
/// listed the whole folder again (to answer the next new names' lookups from a listing
/// the cache then did not keep): 0.38 s per file in a folder of 20,000 names. A create
/// lists a folder only where the listing cache keeps it.
#[tokio::test]
async fn creates_do_not_list_a_folder_the_cache_will_not_keep() {
    timed(async {
        let fx = fixture(|o, _| o.metadata_ttl = Duration::ZERO).await;
        for i in 0..3000 {
            put_elsewhere(&fx, &format!("many/f{i:05}"), vec![1]).await;
        }
        let c = &fx.core;
        let many = c.lookup(ROOT_INO, "many").await.expect("many");
        let lists = c.store_lists();
        for i in 0..5 {
            let (_, fh) = c
                .create(many.attr.ino, &format!("new{i}"), 0)
                .await
                .expect("create");
            c.release_write(fh).await;
        }
        // Each create asks whether its name is a folder (one LIST); a listing of the
        // 3,000 names would add 4 pages per create.
        let sent = c.store_lists() - lists;
        assert!(sent <= 10, "{sent} LIST pages for 5 creates");
    })
    .await
    .expect("bounded");
}
