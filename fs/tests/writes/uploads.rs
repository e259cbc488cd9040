//! Writes reaching the store: uploads at flush and close, streamed parts, failures
//! and retries, the upload memory and budget, appends, modes and read-only refusals.

use super::*;

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

/// An upload takes at most 10,000 parts (`MAX_UPLOAD_PARTS`), so a stream of parts of
/// one size covers a file up to 10,000 of them. Past that, a file that freed what it
/// sent fails the write that crosses it with EFBIG, at once, and its close fails
/// (black-box finding: 78 GiB written in order all returned 0, then the close failed
/// ENOTSUP and nothing was stored); one that freed nothing is uploaded at its close in
/// larger parts, whole.
#[tokio::test]
async fn a_file_streamed_past_the_most_parts_fails_at_the_write_or_uploads_whole() {
    timed(async {
        // Parts of 1 KiB: 10,000 of them make 10,240,000 bytes.
        let tune = |o: &mut CoreOptions| {
            let w = o.writes.as_mut().expect("writable");
            w.part_size = 1 << 10;
            w.stream_from = 8 << 10;
        };
        let largest = 10_000u64 << 10;
        let want = data(largest as usize + (200 << 10), 41);
        // A short budget: the stream's parts are freed as they are sent.
        let (fx, copies) = fixture_with_copies(512 << 10, tune).await;
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "huge.bin", 0).await.expect("create");
        let mut refused = None;
        for (i, piece) in want.chunks(64 << 10).enumerate() {
            let at = (i as u64) * (64 << 10);
            match c.write(fh, at, piece) {
                Ok(_) => assert!(at + piece.len() as u64 <= largest, "past {largest}"),
                Err(e) => {
                    refused = Some((at + piece.len() as u64, e));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (end, err) = refused.expect("a write past the most parts is refused");
        assert!(end > largest, "refused at {end}");
        assert_eq!(err.errno(), libc::EFBIG, "{err}");
        assert!(err.to_string().contains("10000 parts"), "{err}");
        let err = c.flush(fh).await.expect_err("the file missed a write");
        assert_eq!(err.errno(), libc::EFBIG, "{err}");
        c.release_write(fh).await;
        assert_eq!(stored(&fx, "huge.bin").await, None, "nothing published");
        assert_eq!(copies.staged_bytes(), 0);

        // Room for all of it: nothing is freed, and the close uploads it whole.
        let fx = fixture(|o, _| tune(o)).await;
        let c = &fx.core;
        let (_, fh) = c.create(ROOT_INO, "huge.bin", 0).await.expect("create");
        for (i, piece) in want.chunks(64 << 10).enumerate() {
            c.write(fh, (i as u64) * (64 << 10), piece).expect("write");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        c.flush(fh).await.expect("uploaded in larger parts");
        c.release_write(fh).await;
        assert!(
            stored(&fx, "huge.bin").await.as_deref() == Some(&want[..]),
            "whole"
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

/// A stream takes room on the wire before it reads a part from the staging file: while
/// the store is slow, the bytes past the mount's upload window wait on disk (the
/// writer held back by the budget), not in the daemon's memory (black-box finding: each
/// file written in order on a stalled store held a part read and waiting for room on
/// top of the window; with the old 512 MiB window, 8 writers got the daemon OOM-killed).
#[tokio::test]
async fn a_stream_reads_a_part_only_once_it_has_room_on_the_wire() {
    timed(async {
        let (fx, copies) = fixture_with_copies(256 << 10, |o| {
            let w = o.writes.as_mut().expect("writable");
            w.upload_memory = 64 << 10; // one part on the wire across the mount
        })
        .await;
        fx.faulty.set_config(FaultConfig {
            part_latency: Duration::from_secs(3),
            ..Default::default()
        });
        let c = &fx.core;
        let want = data(1 << 20, 43);
        let (_, fh) = c.create(ROOT_INO, "slow.bin", 0).await.expect("create");
        let until = tokio::time::Instant::now() + Duration::from_millis(1200);
        let mut written = 0u64;
        for (i, piece) in want.chunks(64 << 10).enumerate() {
            let offset = (i as u64) * (64 << 10);
            if let Some(wait) = c.write_wait(fh, offset + piece.len() as u64) {
                if tokio::time::timeout_at(until, wait).await.is_err() {
                    break;
                }
            }
            if tokio::time::Instant::now() >= until {
                break;
            }
            c.write(fh, offset, piece).expect("write");
            written = offset + piece.len() as u64;
        }
        // One write past the budget, not waiting: the file frees what its stream read.
        c.write(
            fh,
            written,
            &want[written as usize..written as usize + (64 << 10)],
        )
        .expect("write past the budget");
        written += 64 << 10;
        // No part has landed yet (3 s each): what was written and is not staged on
        // disk any more is what the stream read into memory.
        let in_memory = written - copies.staged_bytes();
        assert!(
            in_memory <= 64 << 10,
            "one part, the one on the wire, read: {in_memory} bytes"
        );
        fx.faulty.set_config(FaultConfig::default());
        for (i, piece) in want.chunks(64 << 10).enumerate() {
            let offset = (i as u64) * (64 << 10);
            if offset >= written {
                if let Some(wait) = c.write_wait(fh, offset + piece.len() as u64) {
                    wait.await;
                }
                c.write(fh, offset, piece).expect("write on");
            }
        }
        c.flush(fh).await.expect("flush");
        c.release_write(fh).await;
        assert_eq!(stored(&fx, "slow.bin").await.as_deref(), Some(&want[..]));
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

/// Black-box finding (round 23): when a lazily unmounted mount's last file closes, the
/// kernel's release is lost with the connection: a file uploaded whole at its close kept
/// its staging copy, which the next start removed warning "never uploaded". After the
/// session, what an upload took whole is released; a file with bytes no upload took
/// stays as a crash would leave it.
#[tokio::test]
async fn after_the_session_files_uploaded_at_their_close_are_released() {
    timed(async {
        let fx = fixture(|_, _| {}).await;
        let c = &fx.core;
        let (_, done) = c.create(ROOT_INO, "done.bin", 0).await.expect("create");
        c.write(done, 0, &data(300_000, 1)).expect("write");
        c.close(done, 0).await.expect("close uploads");
        let (_, open) = c.create(ROOT_INO, "open.bin", 0).await.expect("create");
        c.write(open, 0, &data(1000, 2))
            .expect("write, never closed");
        assert_eq!(staged_files(&staging_dir(&fx)).len(), 2);
        assert_eq!(c.release_uploaded_after_session(), 1);
        let left = staged_files(&staging_dir(&fx));
        assert_eq!(left.len(), 1, "the unclosed file stays: {left:?}");
        assert_eq!(stored(&fx, "done.bin").await, Some(data(300_000, 1)));
        assert_eq!(stored(&fx, "open.bin").await, None, "never published");
        assert_eq!(c.release_uploaded_after_session(), 0, "once");
    })
    .await
    .expect("bounded");
}
