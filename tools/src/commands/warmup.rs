//! `strata warmup PATH... [--recursive]`: pull files of a Strata mount into the cache
//! ahead of a job, with a progress bar (files, bytes, rate, ETA), like `juicefs warmup`.
//!
//! How: the files are read through the mount by `--jobs` parallel readers, and their
//! pages dropped from the kernel page cache right after (`POSIX_FADV_DONTNEED`), so
//! only Strata's tiers keep them. Why this rather than a control file or an xattr
//! verb: it works on any Strata mount (standalone `strata mount` or a mount of
//! `strata serve`) with no private protocol, it warms exactly the versions a reader
//! would get, and the sequential reads trigger the mount's readahead, so each file is
//! fetched from the store with many blocks in flight. The bytes cross the FUSE
//! boundary once, which costs far less than the store fetch it front-loads.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Args)]
pub struct WarmupArgs {
    /// Files or directories inside a Strata mount.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Descend into directories.
    #[arg(short, long)]
    pub recursive: bool,
    /// Parallel readers. 8: enough to keep a store link busy with small files (each
    /// file costs a round trip) while large files get readahead of their own.
    #[arg(short, long, default_value_t = 8)]
    pub jobs: usize,
    /// No progress bar (e.g. in CI logs); prints a summary line.
    #[arg(long)]
    pub quiet: bool,
}

/// Summary of a warmup.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct WarmupReport {
    pub files: u64,
    pub bytes: u64,
    pub failed: u64,
    pub seconds: f64,
}

pub fn run(args: WarmupArgs) -> anyhow::Result<()> {
    let r = warmup(&args.paths, args.recursive, args.jobs, !args.quiet)?;
    let cap = args.paths.first().and_then(|p| cache_bytes(p));
    if let Some(w) = over_capacity(r.bytes, cap) {
        eprintln!("{w}");
    }
    outln!(
        "warmed {} files, {} bytes in {:.2} s ({:.1} MB/s){}",
        r.files,
        r.bytes,
        r.seconds,
        r.bytes as f64 / r.seconds.max(1e-9) / 1e6,
        if r.failed > 0 {
            format!(", {} failed", r.failed)
        } else {
            String::new()
        }
    );
    if r.failed > 0 {
        anyhow::bail!("{} files could not be read", r.failed);
    }
    Ok(())
}

/// The warning when `bytes` warmed exceed the cache's capacity `cap` (black-box finding:
/// 300 MB "warmed" into a 12 MiB cache, with no word of it).
fn over_capacity(bytes: u64, cap: Option<u64>) -> Option<String> {
    let cap = cap.filter(|c| bytes > *c)?;
    Some(format!(
        "warning: warmed {bytes} bytes, which exceeds the mount's cache budget of {cap} \
         bytes: the rest will be read from the store again (raise --memory-cache / \
         --disk-cache, or warm less)"
    ))
}

/// The capacity of the cache of the Strata mount `path` is in (the mount answers it as
/// an extended attribute of every path); None on anything else.
fn cache_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let name = std::ffi::CString::new(strata_fs::fuse::CACHE_BYTES_XATTR).ok()?;
    let mut buf = [0u8; 32];
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let n = unsafe {
        libc::getxattr(
            c_path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.parse().ok()
}

/// Collects the files under `paths` (directories only with `recursive`).
fn collect(paths: &[PathBuf], recursive: bool) -> anyhow::Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    let mut queue: VecDeque<PathBuf> = paths.iter().cloned().collect();
    while let Some(p) = queue.pop_front() {
        let md = std::fs::metadata(&p).with_context(|| format!("stat {}", p.display()))?;
        if md.is_file() {
            out.push((p, md.len()));
        } else if md.is_dir() {
            if !recursive && !paths.contains(&p) {
                continue;
            }
            let mut children: Vec<PathBuf> = std::fs::read_dir(&p)
                .with_context(|| format!("listing {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            children.sort();
            for c in children {
                if recursive || std::fs::metadata(&c).map(|m| m.is_file()).unwrap_or(false) {
                    queue.push_back(c);
                }
            }
        }
    }
    Ok(out)
}

fn read_and_drop(path: &Path, bytes: &AtomicU64, bar: &ProgressBar) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    let read = count_through(&f, bytes, bar);
    // SAFETY: a valid open fd; advice only affects the page cache.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    read
}

/// Reads `r` to its end, adding what it reads to `bytes` and the bar. On an error the
/// bytes it added are taken back: a file that failed warmed nothing the report should
/// count, and a retry reads it from the start (the ESTALE retry counted the first
/// try's bytes twice: round 22b).
fn count_through(
    mut r: impl std::io::Read,
    bytes: &AtomicU64,
    bar: &ProgressBar,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut counted = 0u64;
    let read = loop {
        match r.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                counted += n as u64;
                bytes.fetch_add(n as u64, Ordering::Relaxed);
                bar.inc(n as u64);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    if read.is_err() {
        bytes.fetch_sub(counted, Ordering::Relaxed);
        bar.dec(counted);
    }
    read
}

/// Reads every file under `paths` through the mount with `jobs` readers.
pub fn warmup(
    paths: &[PathBuf],
    recursive: bool,
    jobs: usize,
    progress: bool,
) -> anyhow::Result<WarmupReport> {
    // Black-box finding: a plain local file "warmed" (read whole, exit 0), and a store's
    // own folder read by mistake reported 6.5 GB warmed into nothing.
    for p in paths {
        std::fs::metadata(p).with_context(|| format!("stat {}", p.display()))?;
        if cache_bytes(p).is_none() {
            anyhow::bail!(
                "{} is not inside a Strata mount: warmup reads files through a mount to cache \
                 them (give a path under the mountpoint of `strata mount` or `strata serve`)",
                p.display()
            );
        }
    }
    let files = collect(paths, recursive)?;
    let total: u64 = files.iter().map(|(_, s)| s).sum();
    let n_files = files.len() as u64;
    let bar = if progress {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
            )
            .context("progress template")?,
        );
        b
    } else {
        ProgressBar::hidden()
    };
    bar.set_message(format!("0/{n_files} files"));
    let queue = Arc::new(Mutex::new(VecDeque::from(files)));
    let bytes = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    // No more readers than files; a reader the system refuses (a thread limit) is
    // done without: those started share the queue.
    let readers = (jobs.max(1) as u64).min(n_files.max(1)) as usize;
    let started = std::thread::scope(|s| {
        let mut started = 0usize;
        for _ in 0..readers {
            let (queue, bytes, done, failed, bar) = (&queue, &bytes, &done, &failed, &bar);
            let spawned = std::thread::Builder::new().spawn_scoped(s, move || loop {
                let next = queue.lock().map(|mut q| q.pop_front()).unwrap_or(None);
                let Some((path, _)) = next else { break };
                let read = match read_and_drop(&path, bytes, bar) {
                    // Replaced in the store since it was listed (or its listed size was
                    // wrong): the mount renewed its attributes, and a fresh open reads
                    // the version there now (black-box finding, round 22b: 5 files
                    // failed, a rerun at once read them).
                    Err(e) if e.raw_os_error() == Some(libc::ESTALE) => {
                        read_and_drop(&path, bytes, bar)
                    }
                    r => r,
                };
                if let Err(e) = read {
                    failed.fetch_add(1, Ordering::Relaxed);
                    let line = format!("warmup: {}: {e}", path.display());
                    // A hidden bar (--quiet) prints nothing: the reason goes to stderr.
                    if bar.is_hidden() {
                        eprintln!("{line}");
                    } else {
                        bar.println(line);
                    }
                }
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                bar.set_message(format!("{d}/{n_files} files"));
            });
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    bar.println(format!("warmup: {started} readers (no more threads: {e})"));
                    break;
                }
            }
        }
        started
    });
    bar.finish();
    if started == 0 && n_files > 0 {
        anyhow::bail!("warmup: could not start a reader thread");
    }
    Ok(WarmupReport {
        files: n_files - failed.load(Ordering::Relaxed),
        bytes: bytes.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use strata_cache_core::tiers::MemoryTier;
    use strata_cache_core::{BackingStore, CacheEngine, ObjectReader, StoreOptions};

    use super::*;

    /// Warming a real mount pulls every block of every file into the cache: a second
    /// full read then costs the store nothing.
    /// A file whose read fails part way counts none of its bytes (a retry would count
    /// them twice; a failed file warmed nothing the report should claim).
    #[test]
    fn a_failed_read_takes_back_its_bytes() {
        /// Two MiB of data, then an error.
        struct FailsAfter(u64);
        impl std::io::Read for FailsAfter {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0 == 0 {
                    return Err(std::io::Error::from_raw_os_error(libc::ESTALE));
                }
                let n = (buf.len() as u64).min(self.0);
                self.0 -= n;
                Ok(n as usize)
            }
        }
        let (bytes, bar) = (AtomicU64::new(5), ProgressBar::hidden());
        bar.set_length(10 << 20);
        bar.inc(5);
        let e = count_through(FailsAfter(2 << 20), &bytes, &bar).expect_err("fails");
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
        assert_eq!((bytes.load(Ordering::Relaxed), bar.position()), (5, 5));
        count_through(&[7u8; 3000][..], &bytes, &bar).expect("reads");
        assert_eq!(
            (bytes.load(Ordering::Relaxed), bar.position()),
            (3005, 3005)
        );
    }

    #[test]
    fn warmup_fills_the_cache_through_a_real_mount() {
        let src = tempfile::tempdir().expect("src");
        let mut total = 0u64;
        for (i, n) in [0usize, 10, 300_000, 70_000].iter().enumerate() {
            let p = src.path().join(format!("d{}/f{i}", i % 2));
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, vec![i as u8; *n]).expect("write");
            total += *n as u64;
        }
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let store = BackingStore::from_url(
            &format!("file://{}", src.path().display()),
            &StoreOptions::default(),
        )
        .expect("store");
        let engine = CacheEngine::builder()
            .tier(Arc::new(MemoryTier::new(64 << 20)))
            .build()
            .expect("engine");
        let reader = ObjectReader::new(engine.clone(), store, 64 << 10).expect("reader");
        let mnt = tempfile::tempdir().expect("mnt");
        let opts = strata_fs::MountOptions {
            runtime: Some(rt.handle().clone()),
            ..Default::default()
        };
        let h = strata_fs::spawn(reader, "", mnt.path(), opts).expect("mount");
        // The mount tells any of its paths its cache's size; anything else says nothing.
        assert_eq!(cache_bytes(mnt.path()), Some(64 << 20));
        assert_eq!(cache_bytes(&mnt.path().join("d1/f1")), Some(64 << 20));
        assert_eq!(cache_bytes(src.path()), None);
        let e = warmup(&[src.path().join("d1/f1")], false, 1, false)
            .expect_err("not a mount")
            .to_string();
        assert!(e.contains("not inside a Strata mount"), "{e}");
        assert!(over_capacity(65 << 20, Some(64 << 20)).is_some());
        assert!(over_capacity(64 << 20, Some(64 << 20)).is_none());
        assert!(over_capacity(65 << 20, None).is_none());
        let r = warmup(&[mnt.path().to_path_buf()], true, 3, false).expect("warmup");
        assert_eq!((r.files, r.bytes, r.failed), (4, total, 0));
        let fills = engine.stats().fills;
        assert!(fills >= 1 + 5 + 2, "every block fetched: {fills}");
        // Non-recursive on the root sees no files (they are all in subdirectories).
        let r = warmup(&[mnt.path().to_path_buf()], false, 3, false).expect("warmup");
        assert_eq!(r.files, 0);
        // Everything is cached now: reading it all again fetches nothing.
        let again = warmup(
            &[mnt.path().join("d0"), mnt.path().join("d1")],
            false,
            2,
            false,
        )
        .expect("again");
        assert_eq!(again.bytes, total);
        assert_eq!(engine.stats().fills, fills, "served from the cache");
        h.unmount().expect("unmount");
    }
}
