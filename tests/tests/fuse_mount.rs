//! End-to-end tests of the FUSE mount through the real kernel, against a local
//! directory store and against an S3-compatible server (moto): bytes, shell tools,
//! concurrency, mmap, read-only refusals, writes uploaded as objects, a failing store,
//! and unmounting.

mod fuse_common;

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use fuse_common::*;
use strata_cache_core::store::faulty::FaultConfig;

fn bytes_equal_the_source(b: Backend) {
    let fx = Fixture::new(b);
    for (p, want) in source_files() {
        let got = std::fs::read(fx.m(&p)).unwrap_or_else(|e| panic!("read {p}: {e}"));
        assert!(
            got == want,
            "{p}: {} bytes vs {} expected",
            got.len(),
            want.len()
        );
    }
    // Odd offsets and sizes, across block boundaries and past the end.
    let want = std::fs::read(fx.s("big.bin")).expect("source");
    let f = File::open(fx.m("big.bin")).expect("open");
    for (off, len) in [
        (0u64, 1usize),
        (BLOCK - 3, 7),
        (12345, 3 * BLOCK as usize + 11),
        (5 * BLOCK, 4321),
        (5 * BLOCK + 4320, 100),
        (want.len() as u64 + 10, 10),
    ] {
        let mut buf = vec![0u8; len];
        let n = f.read_at(&mut buf, off).expect("pread");
        let s = (off as usize).min(want.len());
        let e = (off as usize + len).min(want.len());
        assert_eq!(&buf[..n], &want[s..e], "range {off}+{len}");
    }
    let mut empty = Vec::new();
    File::open(fx.m("empty"))
        .expect("open empty")
        .read_to_end(&mut empty)
        .expect("read empty");
    assert!(empty.is_empty());
}

fn shell_tools_agree_with_the_source(b: Backend) {
    let fx = Fixture::new(b);
    let find = "find . -mindepth 1 -printf '%P %y %s\\n' | sed 's/ d [0-9]*$/ d/' | sort";
    assert_eq!(sh(fx.mnt.path(), find), sh(fx.src.path(), find), "find");
    let ls = "ls -1 . dir dir/sub wide | head -n 400";
    assert_eq!(sh(fx.mnt.path(), ls), sh(fx.src.path(), ls), "ls");
    let stat = "stat -c '%n %s %F' big.bin small.txt empty dir/sub/b.bin";
    assert_eq!(sh(fx.mnt.path(), stat), sh(fx.src.path(), stat), "stat");
    let sums = "find . -type f -print0 | sort -z | xargs -0 sha256sum";
    assert_eq!(
        sh(fx.mnt.path(), sums),
        sh(fx.src.path(), sums),
        "sha256sum"
    );
    let tar = "tar -c --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=a=rX -f - . | sha256sum";
    assert_eq!(sh(fx.mnt.path(), tar), sh(fx.src.path(), tar), "tar -c");
    // ls -l of the wide directory twice: the second is served from the metadata cache.
    let reads = fx.faulty.reads();
    sh(
        fx.mnt.path(),
        "ls -l wide > /dev/null && stat wide/f0001 > /dev/null",
    );
    assert_eq!(fx.faulty.reads(), reads, "metadata served from the cache");
}

fn concurrent_readers_and_mmap(b: Backend) {
    let fx = Fixture::new(b);
    let want = std::sync::Arc::new(std::fs::read(fx.s("big.bin")).expect("source"));
    let path = fx.m("big.bin");
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (want, path) = (want.clone(), path.clone());
            std::thread::spawn(move || {
                let f = File::open(&path).expect("open");
                let mut off = (t * 97_531) as u64 % want.len() as u64;
                for _ in 0..20 {
                    let mut buf = vec![0u8; 200_000];
                    let n = f.read_at(&mut buf, off).expect("pread");
                    let e = (off as usize + buf.len()).min(want.len());
                    assert_eq!(&buf[..n], &want[off as usize..e]);
                    off = (off + 333_333) % want.len() as u64;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("reader thread");
    }
    // mmap reads (page cache path: no direct_io).
    let f = File::open(fx.m("dir/sub/b.bin")).expect("open");
    let want = std::fs::read(fx.s("dir/sub/b.bin")).expect("source");
    let len = want.len();
    // SAFETY: a fresh read-only shared mapping of `len` bytes of an open file, unmapped
    // below; the slice does not outlive it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        let s = std::slice::from_raw_parts(p as *const u8, len);
        assert!(s == &want[..], "mmap bytes");
        libc::munmap(p, len);
    }
}

fn writes_are_refused(b: Backend) {
    let fx = Fixture::new(b);
    let err = File::create(fx.m("new")).expect_err("create");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(fx.m("small.txt"))
        .expect_err("write open");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let err = std::fs::remove_file(fx.m("small.txt")).expect_err("unlink");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let err = std::fs::create_dir(fx.m("d2")).expect_err("mkdir");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
}

/// The object `rel` as the store holds it (not through the mount).
fn stored(fx: &Fixture, rel: &str) -> Option<Vec<u8>> {
    fx.rt.block_on(async {
        let info = match fx.store.head(rel).await {
            Ok(i) => i,
            Err(strata_cache_core::CacheError::NotFound(_)) => return None,
            Err(e) => panic!("head {rel}: {e}"),
        };
        if info.size == 0 {
            return Some(Vec::new());
        }
        Some(
            fx.store
                .get_range(&info, 0..info.size)
                .await
                .expect("get")
                .to_vec(),
        )
    })
}

/// A mount that takes writes (`tune` sets the permissions), with its staging files in
/// the returned directory's `s/` (kept alive as long as the mount).
fn writable(
    b: Backend,
    tune: impl FnOnce(&mut strata_fs::WriteOptions),
) -> (Fixture, tempfile::TempDir) {
    let staging = tempfile::tempdir().expect("staging");
    let mut w = strata_fs::WriteOptions::new(staging.path().join("s"));
    tune(&mut w);
    let fx = Fixture::with_core(
        b,
        strata_fs::CoreOptions {
            metadata_ttl: Duration::from_secs(60),
            writes: Some(w),
            ..Default::default()
        },
        retry_fast(),
    );
    (fx, staging)
}

fn writes_through_the_kernel_become_objects(b: Backend) {
    let (fx, staging) = writable(b, |w| w.allow_delete = true);
    // A checkpoint directory and a file larger than one upload part (8 MiB): a
    // multipart upload, its parts over S3's 5 MiB minimum.
    std::fs::create_dir_all(fx.m("ckpt/step-1")).expect("mkdir -p");
    let big = pattern(20 * 1024 * 1024 + 123, 77);
    std::fs::write(fx.m("ckpt/step-1/model.bin"), &big).expect("write big");
    assert!(
        stored(&fx, "ckpt/step-1/model.bin") == Some(big.clone()),
        "uploaded at close"
    );
    assert!(std::fs::read(fx.m("ckpt/step-1/model.bin")).expect("read back") == big);
    // Seek back and patch before closing (what zip writers do).
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(fx.m("ckpt/patched"))
            .expect("create");
        f.write_all_at(b"world", 6).expect("tail");
        f.write_all_at(b"hello ", 0).expect("head");
        // fsync: durable on the cache disk, uploaded at the close, not per fsync.
        f.sync_all().expect("fsync");
        assert_eq!(stored(&fx, "ckpt/patched"), None);
        f.write_all_at(b"H", 0).expect("patch");
    }
    assert_eq!(
        stored(&fx, "ckpt/patched").as_deref(),
        Some(&b"Hello world"[..])
    );
    // A file being written reads back, from another descriptor, what was written so
    // far, also once it grew (a `tail -f` of a log written into the mount).
    {
        let mut f = File::create(fx.m("ckpt/growing.log")).expect("create");
        f.write_all(b"step 1\n").expect("write");
        assert_eq!(
            std::fs::read(fx.m("ckpt/growing.log")).expect("read"),
            b"step 1\n"
        );
        f.write_all(b"step 2\n").expect("write on");
        let mut r = File::open(fx.m("ckpt/growing.log")).expect("open to read");
        let mut got = String::new();
        r.read_to_string(&mut got).expect("read");
        assert_eq!(got, "step 1\nstep 2\n");
    }
    assert_eq!(
        stored(&fx, "ckpt/growing.log").as_deref(),
        Some(&b"step 1\nstep 2\n"[..])
    );
    // A child process given a copy of the descriptor closes it when it exits (the
    // kernel's FLUSH comes from the child): nothing half-written is uploaded then; the
    // opener's close uploads the whole file.
    {
        // The shell opens the file, children write through the descriptor they
        // inherit and exit (not the shell's builtin echo: its redirection closes a copy
        // in the shell itself, a close by the opener); the shell then waits for `go`
        // before closing.
        let sync = tempfile::tempdir().expect("sync dir");
        let (ready, go) = (sync.path().join("ready"), sync.path().join("go"));
        let script = format!(
            "exec 3>ckpt/forked.txt; env echo one >&3; bash -c true; env echo two >&3; \
             touch {r}; for i in $(seq 200); do [ -e {g} ] && break; sleep 0.05; done; \
             exec 3>&-",
            r = ready.display(),
            g = go.display()
        );
        let mut shell = std::process::Command::new("timeout")
            .args(["60", "bash", "-c", &script])
            .current_dir(fx.mnt.path())
            .spawn()
            .expect("shell");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the shell never got ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            stored(&fx, "ckpt/forked.txt").is_none_or(|b| b.is_empty()),
            "the child's close uploaded nothing half-written"
        );
        File::create(&go).expect("go");
        assert!(shell.wait().expect("shell").success());
    }
    assert_eq!(
        stored(&fx, "ckpt/forked.txt").as_deref(),
        Some(&b"one\ntwo\n"[..])
    );
    // Shell tools: cp, tar -x (mkdir, create, then times and modes set after close),
    // ls of new entries, sha256sum of what came back.
    sh(
        fx.mnt.path(),
        "cp small.txt ckpt/copy.txt && tar -C dir -cf - . | tar -C ckpt -xf - && ls ckpt/sub/deeper/c",
    );
    assert_eq!(
        sh(
            fx.mnt.path(),
            "cd ckpt && find . -type f -path './sub/*' | sort | xargs sha256sum"
        ),
        sh(
            fx.s("dir").as_path(),
            "find . -type f -path './sub/*' | sort | xargs sha256sum"
        ),
    );
    assert_eq!(
        stored(&fx, "ckpt/copy.txt").as_deref(),
        Some(&b"hello, strata\n"[..])
    );
    // Changing an object needs --allow-overwrite; nothing changes.
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(fx.m("small.txt"))
        .expect_err("write in place");
    assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    // A directory renamed (a checkpoint directory saved under a temporary name): every
    // object under it moves; the tree reads back the same under its new name.
    std::fs::rename(fx.m("ckpt/sub"), fx.m("ckpt/sub.moved")).expect("rename a directory");
    assert!(!fx.m("ckpt/sub").exists());
    assert_eq!(
        sh(
            fx.mnt.path(),
            "cd ckpt/sub.moved && find . -type f | sort | xargs sha256sum"
        ),
        sh(
            fx.s("dir/sub").as_path(),
            "find . -type f | sort | xargs sha256sum"
        ),
    );
    assert!(stored(&fx, "ckpt/sub.moved/deeper/c").is_some());
    assert!(stored(&fx, "ckpt/sub/deeper/c").is_none());
    // Write, then rename into place (an atomic save): the object moves, the inode
    // follows; replacing an existing file needs allow_overwrite.
    std::fs::rename(fx.m("ckpt/copy.txt"), fx.m("ckpt/moved.txt")).expect("rename");
    assert!(stored(&fx, "ckpt/copy.txt").is_none());
    assert_eq!(
        stored(&fx, "ckpt/moved.txt").as_deref(),
        Some(&b"hello, strata\n"[..])
    );
    assert_eq!(
        std::fs::read(fx.m("ckpt/moved.txt")).expect("read moved"),
        b"hello, strata\n"
    );
    let err = std::fs::rename(fx.m("ckpt/moved.txt"), fx.m("small.txt")).expect_err("replace");
    assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    std::fs::rename(fx.m("ckpt/moved.txt"), fx.m("ckpt/copy.txt")).expect("rename back");
    let err = File::create(fx.m("small.txt")).expect_err("overwrite not allowed");
    assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    assert!(stored(&fx, "small.txt").as_deref() == Some(&b"hello, strata\n"[..]));
    // Deletes with allow_delete.
    std::fs::remove_file(fx.m("ckpt/copy.txt")).expect("rm");
    assert!(stored(&fx, "ckpt/copy.txt").is_none());
    assert!(!fx.m("ckpt/copy.txt").exists());
    // A failed upload fails close (EIO) and leaves no object; a file fsync'd before
    // such a close is kept and uploaded once the store answers (as after a crash).
    let f = File::create(fx.m("ckpt/lost")).expect("create");
    (&f).write_all(b"never stored").expect("write");
    let k = File::create(fx.m("ckpt/kept")).expect("create");
    (&k).write_all(b"fsync'd").expect("write");
    fx.faulty.set_config(FaultConfig {
        writes_down: true,
        ..Default::default()
    });
    // fsync is durable on the cache disk; the close reports the upload's failure.
    k.sync_all().expect("fsync");
    for f in [f, k] {
        let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
        // SAFETY: closing the descriptor this test owns, once.
        let rc = unsafe { libc::close(fd) };
        let err = std::io::Error::last_os_error();
        assert_eq!(
            (rc, err.raw_os_error()),
            (-1, Some(libc::EIO)),
            "store refuses writes"
        );
    }
    fx.faulty.set_config(FaultConfig::default());
    assert!(stored(&fx, "ckpt/lost").is_none());
    // The staging files are gone once released (the kernel sends RELEASE after close
    // returns, so this waits for it), the fsync'd one once uploaded (its first retry
    // comes 5 s after the close).
    let deadline = Instant::now() + Duration::from_secs(30);
    let files = strata_fs::filesystem::staged_files_dir(&staging.path().join("s"));
    while std::fs::read_dir(&files).expect("staging").count() > 0 {
        assert!(
            Instant::now() < deadline,
            "staging files left after release"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stored(&fx, "ckpt/kept").as_deref(), Some(&b"fsync'd"[..]));
    assert!(stored(&fx, "ckpt/lost").is_none());
    // Saved again at once under the same name: a create (the kernel kept no entry for
    // the file that failed; it was ENOENT until the entry expired).
    std::fs::write(fx.m("ckpt/lost"), b"stored now").expect("save again");
    assert_eq!(
        stored(&fx, "ckpt/lost").as_deref(),
        Some(&b"stored now"[..])
    );
}

/// A checkpoint larger than the disk budget's share for staged files, written in order
/// through the kernel while the store takes each part slowly: writes that outrun the
/// upload wait for it (off the FUSE session thread), what is staged stays within the
/// share, and the object arrives whole.
fn a_checkpoint_larger_than_the_budget_stays_within_it(b: Backend) {
    let budget = tempfile::tempdir().expect("budget dir");
    let local = std::sync::Arc::new(
        strata_fs::PassthroughStore::open(budget.path().join("pt"), 12 << 20).expect("store"),
    );
    let charged = local.clone();
    let (fx, _staging) = writable(b, move |w| {
        // S3 takes parts of at least 5 MiB.
        w.part_size = 5 << 20;
        w.parts_in_flight = 2;
        w.local_files = Some(local);
    });
    fx.faulty.set_config(FaultConfig {
        part_latency: Duration::from_millis(150),
        ..Default::default()
    });
    let want = pattern(60 << 20, 91);
    let mut most = 0;
    {
        let mut f = File::create(fx.m("big-ckpt.bin")).expect("create");
        for piece in want.chunks(1 << 20) {
            f.write_all(piece).expect("write");
            most = most.max(charged.staged_bytes());
        }
    }
    fx.faulty.set_config(FaultConfig::default());
    assert!(most <= 12 << 20, "staged within the share: {most}");
    assert!(stored(&fx, "big-ckpt.bin") == Some(want), "uploaded whole");
    assert_eq!(charged.staged_bytes(), 0);
}

fn overwrites_replace_objects_whole(b: Backend) {
    let (fx, _staging) = writable(b, |w| w.allow_overwrite = true);
    // Read first, so the kernel and the cache hold the old version.
    assert_eq!(
        std::fs::read(fx.m("small.txt")).expect("old"),
        b"hello, strata\n"
    );
    std::fs::write(fx.m("small.txt"), b"replaced").expect("overwrite (O_TRUNC)");
    assert_eq!(stored(&fx, "small.txt").as_deref(), Some(&b"replaced"[..]));
    assert_eq!(std::fs::read(fx.m("small.txt")).expect("new"), b"replaced");
    assert_eq!(std::fs::metadata(fx.m("small.txt")).expect("stat").len(), 8);
    // Appended to (a log opened with "a", a shell's `>>`) and patched in place
    // (`O_RDWR`): read into staging at the open, uploaded whole at the close.
    sh(fx.mnt.path(), "echo ' and more' >> small.txt");
    assert_eq!(
        stored(&fx, "small.txt").as_deref(),
        Some(&b"replaced and more\n"[..])
    );
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(fx.m("small.txt"))
            .expect("open read-write");
        f.write_all_at(b"R", 0).expect("patch");
        let mut back = vec![0u8; 8];
        f.read_exact_at(&mut back, 0)
            .expect("read back what was written");
        assert_eq!(&back, b"Replaced");
    }
    assert_eq!(
        stored(&fx, "small.txt").as_deref(),
        Some(&b"Replaced and more\n"[..])
    );
    assert_eq!(
        std::fs::read(fx.m("small.txt")).expect("read"),
        b"Replaced and more\n"
    );
    // O_TRUNC|O_APPEND (Go's log-file idiom) truncates, then appends (it kept the old
    // bytes and wrote over them, black-box finding).
    {
        use std::os::unix::fs::OpenOptionsExt;
        // (std refuses append with truncate; the flags as a C program passes them.)
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_APPEND | libc::O_TRUNC)
            .open(fx.m("small.txt"))
            .expect("open O_TRUNC|O_APPEND");
        f.write_all(b"new").expect("append");
    }
    assert_eq!(stored(&fx, "small.txt").as_deref(), Some(&b"new"[..]));
    // truncate(path), no descriptor: the object resized (was ENOTSUP whatever its
    // size), shrunk and grown with zeros.
    let c =
        std::ffi::CString::new(fx.m("small.txt").as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(
        unsafe { libc::truncate(c.as_ptr(), 2) },
        0,
        "truncate: {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(stored(&fx, "small.txt").as_deref(), Some(&b"ne"[..]));
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::truncate(c.as_ptr(), 4) },
        0,
        "grow: {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(stored(&fx, "small.txt").as_deref(), Some(&b"ne\0\0"[..]));
    assert_eq!(std::fs::read(fx.m("small.txt")).expect("read"), b"ne\0\0");
}

/// A file held open by a reader while another process replaces, appends to or patches
/// it (`tail -f` of a log, a checkpoint loaded while the next is saved over it). The
/// kernel gives every open of an inode that has a passthrough handle the same backing
/// file, so a writer opened then would write into the cached copy behind the daemon's
/// back and the close would upload the (truncated) staging file: a mount that can change
/// objects opens nothing for passthrough.
fn writes_while_a_reader_holds_the_file_reach_the_store(b: Backend) {
    let staging = tempfile::tempdir().expect("staging");
    let mut w = strata_fs::WriteOptions::new(staging.path().join("s"));
    w.allow_overwrite = true;
    let fx = Fixture::with_core(
        b,
        strata_fs::CoreOptions {
            metadata_ttl: Duration::from_secs(60),
            passthrough: Some(
                strata_fs::PassthroughOptions::open(staging.path().join("pt"), 1 << 30)
                    .expect("copies"),
            ),
            writes: Some(w),
            ..Default::default()
        },
        retry_fast(),
    );
    let old = std::fs::read(fx.s("dir/a.txt")).expect("source");
    // Read whole twice: the copy a passthrough open would use is made.
    for _ in 0..2 {
        assert_eq!(std::fs::read(fx.m("dir/a.txt")).expect("read"), old);
        std::thread::sleep(Duration::from_millis(200));
    }
    let reader = File::open(fx.m("dir/a.txt")).expect("reader");
    std::fs::write(fx.m("dir/a.txt"), b"replaced").expect("replace (O_TRUNC)");
    assert_eq!(stored(&fx, "dir/a.txt").as_deref(), Some(&b"replaced"[..]));
    sh(fx.mnt.path(), "echo ' and more' >> dir/a.txt");
    assert_eq!(
        stored(&fx, "dir/a.txt").as_deref(),
        Some(&b"replaced and more\n"[..])
    );
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(fx.m("dir/a.txt"))
            .expect("open read-write");
        f.write_all_at(b"R", 0).expect("patch");
    }
    assert_eq!(
        stored(&fx, "dir/a.txt").as_deref(),
        Some(&b"Replaced and more\n"[..])
    );
    // The reader's handle still reads the version it opened (or fails: never a mix).
    let mut buf = vec![0u8; old.len()];
    if let Ok(n) = reader.read_at(&mut buf, 0) {
        assert_eq!(&buf[..n], &old[..n], "the reader's version");
    }
    drop(reader);
    assert_eq!(
        std::fs::read(fx.m("dir/a.txt")).expect("read back"),
        b"Replaced and more\n"
    );
    // `tail -f` of a log appended to with `>>`: a reader's short read of the old
    // version made the kernel shrink the file, and each append landed over the last.
    std::fs::write(fx.m("log.txt"), b"line0\n").expect("create the log");
    let tail = File::open(fx.m("log.txt")).expect("reader");
    let mut buf = vec![0u8; 4096];
    for i in 1..=3 {
        // It reads what is there now, or fails once a newer version replaced the one
        // it opened; never a short read of it.
        if let Ok(n) = tail.read_at(&mut buf, 0) {
            assert!(buf[..n].starts_with(b"line0\n"), "{:?}", &buf[..n]);
        }
        sh(fx.mnt.path(), &format!("echo line{i} >> log.txt"));
        if let Ok(n) = tail.read_at(&mut buf, 0) {
            assert!(buf[..n].starts_with(b"line0\n"), "{:?}", &buf[..n]);
        }
    }
    let want = b"line0\nline1\nline2\nline3\n";
    assert_eq!(stored(&fx, "log.txt").as_deref(), Some(&want[..]));
    assert_eq!(std::fs::read(fx.m("log.txt")).expect("read the log"), want);
    // A reader of a file still being written maps it shared, as numpy.memmap and
    // safetensors do (black-box finding: its direct-I/O handle failed ENODEV).
    let mut writer = File::create(fx.m("mapped.bin")).expect("create");
    writer.write_all(&[7u8; 8192]).expect("write");
    let reader = File::open(fx.m("mapped.bin")).expect("reader");
    // SAFETY: a fresh read-only shared mapping of 8 KiB of an open file, unmapped
    // below; the copy is taken before.
    let mapped = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&reader),
            0,
        );
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap of a file being written: {}",
            std::io::Error::last_os_error()
        );
        let got = std::slice::from_raw_parts(p as *const u8, 8192).to_vec();
        libc::munmap(p, 8192);
        got
    };
    assert_eq!(mapped, vec![7u8; 8192]);
    drop((reader, writer));
}

/// `rm -rf` of a tree of the store and of a tree just copied in: each directory goes
/// once its last object is deleted (it was ENOTSUP, then ENOTEMPTY from a stale listing
/// of its parent). A name the store cannot keep as it is (a control character, which a
/// key would percent-encode) is refused, not stored under another name.
fn trees_are_removed_and_unstorable_names_refused(b: Backend) {
    let (fx, _staging) = writable(b, |w| w.allow_delete = true);
    let held = File::open(fx.m("dir/a.txt")).expect("held open");
    sh(fx.mnt.path(), "ls -R dir > /dev/null && rm -rf dir");
    assert!(!fx.m("dir").exists(), "dir removed");
    // An fstat of a file deleted while open answers as it was opened (as `dd` needs).
    assert_eq!(held.metadata().expect("fstat after the delete").len(), 1000);
    for p in ["dir/a.txt", "dir/sub/b.bin", "dir/sub/deeper/c"] {
        assert_eq!(stored(&fx, p), None, "{p} deleted");
    }
    let src = tempfile::tempdir().expect("tree");
    std::fs::create_dir_all(src.path().join("t/b/c")).expect("mkdir");
    std::fs::write(src.path().join("t/b/c/deep"), b"deep").expect("deep");
    for i in 0..20 {
        std::fs::write(src.path().join(format!("t/b/f{i}")), vec![i as u8; 100]).expect("f");
    }
    let cp = format!("cp -r {}/t copied && rm -rf copied", src.path().display());
    sh(fx.mnt.path(), &cp);
    assert!(!fx.m("copied").exists(), "copied tree removed");
    // A folder a rename emptied (the download-then-move of tempfile.TemporaryDirectory):
    // rmdir removes it from the store too (on file:// it stayed, listed, after a 0).
    std::fs::create_dir(fx.m("tmpdl")).expect("mkdir");
    std::fs::write(fx.m("tmpdl/model.bin"), b"weights").expect("download");
    std::fs::rename(fx.m("tmpdl/model.bin"), fx.m("model.bin")).expect("move out");
    std::fs::remove_dir(fx.m("tmpdl")).expect("rmdir");
    assert!(!fx.m("tmpdl").exists(), "gone from the mount");
    assert!(!fx.src.path().join("tmpdl").exists(), "gone from the store");
    assert_eq!(stored(&fx, "model.bin").as_deref(), Some(&b"weights"[..]));
    assert_eq!(stored(&fx, "copied/b/f0"), None);
    let bad = fx.m("tab\tname");
    let e = std::fs::write(&bad, b"x").expect_err("a control character is refused");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    let e = std::fs::create_dir(fx.m("nl\ndir")).expect_err("in a directory name too");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    assert_eq!(stored(&fx, "tab%09name"), None, "nothing stored renamed");
    // A name that is not UTF-8 (Latin-1 from an old archive) is refused too: its lossy
    // spelling made two such names one object, the second overwriting the first.
    use std::os::unix::ffi::OsStrExt;
    let latin1 = |b: &[u8]| fx.mnt.path().join(std::ffi::OsStr::from_bytes(b));
    let e = std::fs::write(latin1(b"ckpt-\xff.bin"), b"x").expect_err("not UTF-8");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    let e = std::fs::create_dir(latin1(b"dir-\xe9")).expect_err("not UTF-8");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    let e = std::fs::metadata(latin1(b"ckpt-\xfe.bin")).expect_err("no such key");
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    assert_eq!(
        stored(&fx, "ckpt-\u{fffd}.bin"),
        None,
        "nothing stored renamed"
    );
    // A local directory store keeps uploads in progress as NAME#N (and lists none).
    let hashed = std::fs::write(fx.m("issue#12"), b"x");
    match b {
        Backend::Local => assert_eq!(
            hashed.expect_err("refused").raw_os_error(),
            Some(libc::EINVAL)
        ),
        Backend::S3 => {
            hashed.expect("an S3 key may end so");
            assert_eq!(stored(&fx, "issue#12").as_deref(), Some(&b"x"[..]));
        }
    }
    // A 255-byte name: the local store's NAME#N of it is too long, so it is refused at
    // the create (it failed at the close, after the whole write); S3 takes it.
    let long = "n".repeat(255);
    let r = std::fs::write(fx.m(&long), b"x");
    match b {
        Backend::Local => assert_eq!(r.expect_err("refused").raw_os_error(), Some(libc::EINVAL)),
        Backend::S3 => {
            r.expect("an S3 key takes it");
            assert_eq!(stored(&fx, &long).as_deref(), Some(&b"x"[..]));
        }
    }
    // A path whose key would pass S3's 1,024 bytes is refused when named, as too long
    // (the local test server takes it; a real store failed it at the upload).
    if b == Backend::S3 {
        let deep = (0..4)
            .map(|i| format!("{i}{}", "d".repeat(199)))
            .collect::<Vec<_>>();
        let dir = fx.m(&deep.join("/"));
        std::fs::create_dir_all(&dir).expect("803-byte folders");
        let name = "f".repeat(250);
        let e = std::fs::write(dir.join(name), b"x").expect_err("a key past 1,024 bytes");
        assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG), "{e}");
    }
}

fn a_failing_store_gives_eio_and_the_mount_stays_usable(b: Backend) {
    let fx = Fixture::new(b);
    // Prime metadata, then take the store down: uncached data fails with EIO, in time.
    sh(fx.mnt.path(), "ls -l . dir > /dev/null");
    fx.faulty.set_config(FaultConfig {
        down: true,
        ..Default::default()
    });
    let t = Instant::now();
    let err = std::fs::read(fx.m("big.bin")).expect_err("store down");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "EIO in bounded time: {:?}",
        t.elapsed()
    );
    // Hanging requests are cut by the attempt timeout: EIO again, bounded.
    fx.faulty.set_config(FaultConfig {
        hang_every: 1,
        ..Default::default()
    });
    let t = Instant::now();
    let err = std::fs::read(fx.m("dir/a.txt")).expect_err("store hangs");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "bounded: {:?}",
        t.elapsed()
    );
    // 5xx on every other request: the retry policy rides it out.
    fx.faulty.set_config(FaultConfig {
        fail_every: 2,
        ..Default::default()
    });
    assert_eq!(
        std::fs::read(fx.m("exact.bin")).expect("flaky store"),
        std::fs::read(fx.s("exact.bin")).expect("src")
    );
    // Back up: the same mount reads everything.
    fx.faulty.set_config(FaultConfig::default());
    for p in ["big.bin", "dir/a.txt", "small.txt"] {
        assert_eq!(
            std::fs::read(fx.m(p)).expect("recovered"),
            std::fs::read(fx.s(p)).expect("src"),
            "{p}"
        );
    }
}

/// A second mount on a directory a Strata mount holds is refused (the kernel would
/// stack it over the first), and the first keeps serving.
fn a_second_mount_on_the_same_directory_is_refused(b: Backend) {
    let fx = Fixture::new(b);
    let err = strata_fs::mount::mount_fs(
        strata_fs::null::NullFs::new(vec![("x".into(), 1)]),
        fx.mnt.path(),
        &strata_fs::MountOptions::default(),
    )
    .expect_err("refused");
    assert!(err.to_string().contains("already mounted"), "{err}");
    assert_eq!(
        std::fs::read(fx.m("small.txt")).expect("the first mount serves"),
        b"hello, strata\n"
    );
}

/// Black-box finding: `fusermount3 -u -z M`, then a new mount at M: the old mount's
/// handle, ending, unmounted M by its path, taking the new mount away. A mount gone
/// from outside is never unmounted again, nor detached as a failed one (round 23b).
fn a_mount_detached_from_outside_leaves_the_next_mount_there_alone(b: Backend) {
    let mut fx = Fixture::new(b);
    let old = fx.mount.take().expect("mounted");
    let c = std::ffi::CString::new(fx.mnt.path().as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path; MNT_DETACH is a lazy unmount.
    assert_eq!(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !old.is_finished() {
        assert!(Instant::now() < deadline, "the old session did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let new = strata_fs::mount::mount_fs(
        strata_fs::null::NullFs::new(vec![("x".into(), 3)]),
        fx.mnt.path(),
        &strata_fs::MountOptions::default(),
    )
    .expect("a new mount at the same point");
    // The new mount may have the old one's connection number (freed with it): the old
    // daemon must not take it for its own dead mount (round 23b: detached).
    assert!(!old.session_failed(), "the old session ended by an unmount");
    old.detach_failed();
    assert!(
        is_mounted(fx.mnt.path()),
        "a detach of the old mount leaves the new one"
    );
    old.unmount().expect("the old mount's end");
    assert!(is_mounted(fx.mnt.path()), "the new mount stays");
    assert_eq!(
        std::fs::read(fx.m("x"))
            .expect("read through the new mount")
            .len(),
        3
    );
    new.unmount().expect("unmount");
}

/// Black-box finding (round 23): the daemon's stop unmounted its mountpoint by the path
/// it was given: a tmpfs an operator had mounted over it was unmounted instead (its
/// files lost) and this mount left dead below; with the mountpoint's folder renamed, the
/// file system mounted at the old path since was unmounted. An unmount goes by where
/// the mount table has this mount, and only where it is on top.
#[test]
fn an_unmount_never_takes_another_file_system_away() {
    bounded(60, || {
        let run = |args: &[&str]| {
            let ok = std::process::Command::new(args[0])
                .args(&args[1..])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "{args:?} (the test needs root, as CI runs it)");
        };
        let mount = |at: &std::path::Path| {
            strata_fs::mount::mount_fs(
                strata_fs::null::NullFs::new(vec![("x".into(), 3)]),
                at,
                &strata_fs::MountOptions::default(),
            )
            .expect("mount")
        };
        let dir = tempfile::tempdir().expect("tempdir");
        // A tmpfs over the mount: left alone, with its file.
        let mp = dir.path().join("mp");
        std::fs::create_dir(&mp).expect("mkdir");
        let m = mount(&mp);
        let mp_s = mp.to_str().expect("utf-8");
        run(&["mount", "-t", "tmpfs", "-o", "size=1m", "over", mp_s]);
        std::fs::write(mp.join("mine.txt"), b"the other one's").expect("write to the tmpfs");
        m.unmount().expect("unmount");
        assert_eq!(
            std::fs::read(mp.join("mine.txt")).expect("the tmpfs is still there"),
            b"the other one's"
        );
        run(&["umount", mp_s]);
        // The dead mount left below (aborted): detached so the folder can go.
        run(&["umount", "-l", mp_s]);
        // The mountpoint's folder renamed, another file system at the old path since:
        // this mount is unmounted where it is now, the other one stays.
        let parent = dir.path().join("parent");
        let mp = parent.join("mp");
        std::fs::create_dir_all(&mp).expect("mkdir");
        let m = mount(&mp);
        let moved = dir.path().join("moved");
        std::fs::rename(&parent, &moved).expect("rename the mountpoint's folder");
        std::fs::create_dir_all(&mp).expect("a new folder at the old path");
        let mp_s = mp.to_str().expect("utf-8");
        run(&["mount", "-t", "tmpfs", "-o", "size=1m", "later", mp_s]);
        std::fs::write(mp.join("later.txt"), b"mounted later").expect("write to the tmpfs");
        m.unmount().expect("unmount");
        assert!(
            !is_mounted(&moved.join("mp")),
            "this mount is gone from where its folder went"
        );
        assert_eq!(
            std::fs::read(mp.join("later.txt")).expect("the later tmpfs is still there"),
            b"mounted later"
        );
        run(&["umount", mp_s]);
    })
}

fn unmount_with_open_files_does_not_hang(b: Backend) {
    let mut fx = Fixture::new(b);
    let f = File::open(fx.m("big.bin")).expect("open");
    let unread = File::open(fx.m("dir/a.txt")).expect("open");
    let mut buf = [0u8; 10];
    f.read_at(&mut buf, 0).expect("read");
    let mount = fx.mount.take().expect("mounted");
    let t = Instant::now();
    mount.unmount().expect("unmount");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "unmount took {:?}",
        t.elapsed()
    );
    // Open files fail (or are served from the page cache) instead of hanging, and
    // the busy mount stays in the table, failing calls with ENOTCONN as after a crash:
    // detached, it would turn back into a local directory under the jobs using it.
    let _ = f.read_at(&mut buf, 0);
    assert!(
        unread.read_at(&mut buf, 0).is_err(),
        "uncached data of a dead mount"
    );
    assert!(is_mounted(fx.mnt.path()), "a busy mount is not detached");
    let e = std::fs::write(fx.m("new.txt"), b"x").expect_err("nothing lands locally");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    drop((f, unread));
    let gone = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(fx.mnt.path())
        .status()
        .expect("fusermount3");
    assert!(gone.success(), "once its files close it unmounts");
    assert!(!is_mounted(fx.mnt.path()), "gone from the mount table");
}

fn passthrough_opens_read_the_same_bytes(b: Backend) {
    let cache = tempfile::tempdir().expect("cache dir");
    let core = strata_fs::CoreOptions {
        metadata_ttl: Duration::from_secs(60),
        passthrough: Some(
            strata_fs::PassthroughOptions::open(cache.path().join("pt"), 4 << 30).expect("copies"),
        ),
        ..Default::default()
    };
    let fx = Fixture::with_core(b, core, retry_fast());
    let counters = || {
        fx.mount
            .as_ref()
            .and_then(|m| m.core())
            .expect("core")
            .counters()
    };
    for p in ["big.bin", "dir/a.txt"] {
        let want = std::fs::read(fx.s(p)).expect("source");
        assert_eq!(std::fs::read(fx.m(p)).expect("first read"), want, "{p}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters()
        .passthrough_copies
        .load(std::sync::atomic::Ordering::Relaxed)
        < 2
    {
        assert!(Instant::now() < deadline, "copies written");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Reopened (twice, and concurrently): passthrough opens, same bytes.
    for p in ["big.bin", "dir/a.txt"] {
        let want = std::fs::read(fx.s(p)).expect("source");
        let f1 = File::open(fx.m(p)).expect("open 1");
        let f2 = File::open(fx.m(p)).expect("open 2");
        let mut got = Vec::new();
        (&f1).read_to_end(&mut got).expect("read 1");
        assert_eq!(got, want, "{p} via passthrough");
        let mut buf = vec![0u8; 100];
        let n = f2.read_at(&mut buf, 7).expect("pread 2");
        assert_eq!(&buf[..n], &want[7..(7 + 100).min(want.len())]);
    }
    assert!(
        counters()
            .passthrough_opens
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 4
    );
    // An O_DIRECT read that is not aligned reads the same bytes whether the file has a
    // copy or not (black-box finding: EINVAL once the copy existed, the cache file
    // system's O_DIRECT rules).
    for p in ["big.bin", "dir/a.txt"] {
        use std::os::unix::fs::OpenOptionsExt;
        let want = std::fs::read(fx.s(p)).expect("source");
        for round in 0..2 {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(fx.m(p))
                .expect("O_DIRECT open");
            let mut buf = vec![0u8; 1000];
            let n = f
                .read_at(&mut buf[1..], 7)
                .expect("unaligned O_DIRECT read");
            let end = (7 + 999).min(want.len());
            assert_eq!(&buf[1..1 + n], &want[7..end], "{p} round {round}");
        }
    }
}

/// A name removed and made again is a new file or directory, as on a local disk: a
/// descriptor open on the deleted file keeps that file (never the new one's bytes or
/// size), a directory made again takes entries, and an fstat of a file unlinked while
/// being written describes it. (Black-box findings: the new file took the old one's
/// inode number, so the kernel served the old descriptor the new file's page cache and
/// refused creates in the re-made directory, which it had marked removed.)
fn a_name_made_again_is_a_new_file(b: Backend) {
    use std::os::unix::fs::FileExt;
    let (fx, _staging) = writable(b, |w| {
        w.allow_delete = true;
        w.allow_overwrite = true;
    });
    let old = vec![b'O'; 1_000_000];
    std::fs::write(fx.m("ckpt"), &old).expect("write old");
    let reader = File::open(fx.m("ckpt")).expect("open old");
    let mut first = vec![0u8; 500_000];
    reader
        .read_exact_at(&mut first, 0)
        .expect("read first half");
    std::fs::remove_file(fx.m("ckpt")).expect("unlink");
    std::fs::write(fx.m("ckpt"), vec![b'N'; 1_000_000]).expect("write new");
    let mut second = vec![0u8; 500_000];
    match reader.read_at(&mut second, 500_000) {
        // The old bytes (still cached) or ESTALE (the deleted object is gone): never
        // the new file's.
        Ok(n) => assert!(
            second[..n].iter().all(|&c| c == b'O'),
            "the deleted file's descriptor read the new file's bytes"
        ),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}"),
    }
    assert_eq!(
        std::fs::read(fx.m("ckpt")).expect("read new"),
        vec![b'N'; 1_000_000]
    );
    drop(reader);

    // A directory removed while a file in it is still open, then made again.
    std::fs::create_dir(fx.m("run")).expect("mkdir");
    let log = File::create(fx.m("run/old.log")).expect("create in dir");
    std::fs::remove_file(fx.m("run/old.log")).expect("unlink open file");
    std::fs::remove_dir(fx.m("run")).expect("rmdir");
    std::fs::create_dir(fx.m("run")).expect("mkdir again");
    std::fs::write(fx.m("run/new.log"), b"new").expect("create in the re-made directory");
    assert_eq!(stored(&fx, "run/new.log").as_deref(), Some(&b"new"[..]));
    drop(log);

    // fstat of a descriptor writing a file unlinked while open, and after the name
    // was made again by another file.
    let mut w = File::create(fx.m("tmp")).expect("create tmp");
    w.write_all(&[b'B'; 50]).expect("write tmp");
    std::fs::remove_file(fx.m("tmp")).expect("unlink tmp");
    assert_eq!(w.metadata().expect("fstat unlinked").len(), 50);
    std::fs::write(fx.m("tmp"), [b'n'; 20]).expect("make the name again");
    assert_eq!(
        w.metadata().expect("fstat after").len(),
        50,
        "the old file's size"
    );
    drop(w);
    assert_eq!(stored(&fx, "tmp").as_deref(), Some(&[b'n'; 20][..]));
}

/// Inodes in the mount's table, as `statfs` reports them (`f_files`).
fn inode_count(path: &std::path::Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: a valid NUL-terminated path and a zeroed out-struct statvfs fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_files
}

/// The kernel's FORGET reaches the mount: after the kernel drops its cached inodes
/// (`drop_caches`, as memory pressure would) the mount's inode table shrinks back,
/// and every file is still found by name.
fn the_kernel_forgets_inodes_and_the_table_shrinks(b: Backend) {
    let fx = Fixture::new(b);
    for i in 0..150 {
        std::fs::metadata(fx.m(&format!("wide/f{i:04}"))).expect("stat");
    }
    let referenced = inode_count(fx.mnt.path());
    assert!(referenced >= 150, "{referenced}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop caches (root)");
        let now = inode_count(fx.mnt.path());
        if now + 100 <= referenced {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "FORGET did not shrink the table: {referenced} -> {now}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in (0..150).step_by(7) {
        let got = std::fs::read(fx.m(&format!("wide/f{i:04}"))).expect("read again");
        assert_eq!(got.len(), 100 + i);
    }
}

#[test]
fn the_kernel_forgets_inodes_and_the_table_shrinks_local() {
    bounded(120, || {
        the_kernel_forgets_inodes_and_the_table_shrinks(Backend::Local)
    })
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod local {
            use super::*;
            $( #[test] fn $name() { bounded(120, || super::$name(Backend::Local)) } )*
        }
        mod s3 {
            use super::*;
            $( #[test] fn $name() { bounded(180, || super::$name(Backend::S3)) } )*
        }
    };
}

both_backends!(
    bytes_equal_the_source,
    shell_tools_agree_with_the_source,
    concurrent_readers_and_mmap,
    writes_are_refused,
    writes_through_the_kernel_become_objects,
    a_checkpoint_larger_than_the_budget_stays_within_it,
    overwrites_replace_objects_whole,
    writes_while_a_reader_holds_the_file_reach_the_store,
    trees_are_removed_and_unstorable_names_refused,
    a_failing_store_gives_eio_and_the_mount_stays_usable,
    unmount_with_open_files_does_not_hang,
    a_second_mount_on_the_same_directory_is_refused,
    a_mount_detached_from_outside_leaves_the_next_mount_there_alone,
    passthrough_opens_read_the_same_bytes,
    a_name_made_again_is_a_new_file,
);

/// Black-box finding: `cmd > MNT/file` (and `dd of=`) put an empty object in the store
/// before the command wrote a byte: the shell opens the file, `dup2`s it onto stdout
/// and closes the first descriptor, and that close uploaded. A close while the same
/// process still writes through a copy of the descriptor leaves the upload to the
/// last close; a file closed without copies is an object when close returns (a marker
/// a `touch` makes, as before).
fn a_redirect_uploads_at_its_last_close(b: Backend) {
    let (fx, _staging) = writable(b, |_| {});
    let out = fx.m("out.txt");
    let script = format!(
        "exec 3>'{}'; exec 1>&3; exec 3>&-; sleep 1; printf result=42",
        out.display()
    );
    let mut child = std::process::Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .expect("sh");
    std::thread::sleep(Duration::from_millis(500));
    let during = stored(&fx, "out.txt");
    let status = child.wait().expect("wait");
    assert!(status.success());
    assert_eq!(during, None, "nothing in the store before the last close");
    assert_eq!(stored(&fx, "out.txt").as_deref(), Some(&b"result=42"[..]));
    std::fs::File::create(fx.m("_SUCCESS")).expect("touch");
    assert_eq!(stored(&fx, "_SUCCESS").as_deref(), Some(&b""[..]));
}

#[test]
fn a_redirect_uploads_at_its_last_close_local() {
    bounded(60, || a_redirect_uploads_at_its_last_close(Backend::Local));
}

/// Black-box finding (round 18): on a local store, `echo data > link` where `link` leads
/// out of the store (hidden from the mount) exited 0: the create and writes took, the
/// close's EINVAL went unseen by the shell, and the data was dropped. The create is
/// refused, EINVAL, and the link's target is untouched; so is a file created in a
/// folder made (`mkdir`) over a folder link out of the store.
#[test]
fn a_create_over_a_link_out_of_a_local_store_is_refused_at_once() {
    bounded(60, || {
        let (fx, _staging) = writable(Backend::Local, |w| w.allow_overwrite = true);
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("victim"), b"keep").expect("victim");
        std::os::unix::fs::symlink(outside.path().join("victim"), fx.s("flink")).expect("link");
        std::os::unix::fs::symlink(outside.path(), fx.s("dlink")).expect("folder link");
        let e = File::create(fx.m("flink")).expect_err("refused at the create");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        std::fs::create_dir(fx.m("dlink")).expect("a folder of the mount's own");
        let e = File::create(fx.m("dlink/new")).expect_err("refused at the create");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        assert_eq!(
            std::fs::read(outside.path().join("victim")).expect("victim"),
            b"keep"
        );
        assert!(!outside.path().join("new").exists());
    });
}
