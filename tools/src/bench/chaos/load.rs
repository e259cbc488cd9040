//! The load while the daemon is up: mount readers (threads reading seeded-random ranges
//! of the dataset through the FUSE mount and checking every byte) and KV clients
//! (tasks putting blocks whose bytes derive from their keys and getting back earlier
//! acknowledged ones). Every acknowledged put is recorded; a block once acknowledged
//! that the service later answers "not found" is lost.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_kvcache::KvClient;

use super::content::{self, mix};
use super::proxy::Faults;

/// Whether the daemon is up, and which run of it: `epoch` is odd while a daemon is
/// ready and serving, even from the moment the bench decides to kill it until the next
/// one is ready. An operation whose start and end saw the same odd epoch ran against
/// one live daemon; any other was cut by a kill and is not judged.
#[derive(Default)]
pub struct Phase {
    epoch: AtomicU64,
    kv_addr: Mutex<String>,
    stopped: AtomicBool,
}

impl Phase {
    pub fn up(&self, kv_addr: &str) {
        *self.kv_addr.lock().unwrap_or_else(|p| p.into_inner()) = kv_addr.to_string();
        let e = self.epoch.load(Ordering::Acquire);
        if e.is_multiple_of(2) {
            self.epoch.store(e + 1, Ordering::Release);
        }
    }

    pub fn down(&self) {
        let e = self.epoch.load(Ordering::Acquire);
        if e % 2 == 1 {
            self.epoch.store(e + 1, Ordering::Release);
        }
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.down();
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The current epoch when a daemon is up.
    fn up_epoch(&self) -> Option<u64> {
        let e = self.epoch();
        (e % 2 == 1).then_some(e)
    }

    fn kv_addr(&self) -> String {
        self.kv_addr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// What the load saw, updated by every reader and client.
#[derive(Default)]
pub struct LoadStats {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub failed_reads: AtomicU64,
    pub reads_failed_while_store_down: AtomicU64,
    pub reads_interrupted_by_kill: AtomicU64,
    /// Of those, the ones whose span touched a store-down window.
    pub reads_interrupted_while_store_down: AtomicU64,
    /// Longest a read cut by a kill had been waiting (a stall the kill hid).
    pub max_interrupted_read_us: AtomicU64,
    /// Reads that succeeded although their span touched a store-down window.
    pub reads_ok_while_store_down: AtomicU64,
    pub short_reads: AtomicU64,
    pub file_wrong_bytes: AtomicU64,
    pub wrong_reads: AtomicU64,
    /// Longest read (open + read + close) while the daemon was up, in microseconds.
    pub max_read_us: AtomicU64,
    /// Longest read whose span touched no store-down window.
    pub max_read_us_store_up: AtomicU64,
    /// Longest time a read took to fail while the store was down.
    pub max_failed_read_us: AtomicU64,
    pub read_latencies_us: Mutex<Vec<u64>>,
    /// The first few failures while the store was up, for the report.
    pub failed_read_samples: Mutex<Vec<String>>,

    pub kv_puts_acked: AtomicU64,
    pub kv_put_errors_while_up: AtomicU64,
    pub kv_gets: AtomicU64,
    pub kv_gets_found: AtomicU64,
    pub kv_get_errors_while_up: AtomicU64,
    pub kv_wrong_bytes: AtomicU64,
    pub kv_error_samples: Mutex<Vec<String>>,
    /// Files written through the mount: closed with the upload confirmed...
    pub writes_acked: AtomicU64,
    /// ...failed with the daemon and the store up...
    pub write_errors_while_up: AtomicU64,
    pub writes_failed_while_store_down: AtomicU64,
    /// ...or cut by a kill (nothing is promised for them but no torn object).
    pub writes_interrupted_by_kill: AtomicU64,
    pub write_error_samples: Mutex<Vec<String>>,
    /// Every file a writer started, in order, with whether its upload was confirmed.
    pub written: Mutex<Vec<Written>>,
    /// Writers in the middle of a file now.
    pub writes_in_progress: AtomicU64,
    /// Every acknowledged put's key, in order of acknowledgement.
    pub acked: Mutex<Vec<[u8; 32]>>,
    /// Acknowledged keys later answered "not found".
    pub lost: Mutex<HashSet<[u8; 32]>>,
}

const SAMPLES_KEPT: usize = 10;

fn keep_sample(v: &Mutex<Vec<String>>, s: String) {
    let mut v = v.lock().unwrap_or_else(|p| p.into_inner());
    if v.len() < SAMPLES_KEPT {
        v.push(s);
    }
}

impl LoadStats {
    pub fn acked(&self) -> Vec<[u8; 32]> {
        self.acked.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn mark_lost(&self, key: [u8; 32]) {
        self.lost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key);
    }

    pub fn lost_count(&self) -> usize {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A file a writer started through the mount.
#[derive(Clone, Copy, Debug)]
pub struct Written {
    pub writer: u64,
    pub seq: u64,
    pub size: u64,
    /// `fsync` and `close` returned success: the object must exist, exactly.
    pub acked: bool,
}

/// What the load works on.
pub struct LoadCtx {
    pub seed: u64,
    pub phase: Phase,
    pub stats: LoadStats,
    pub faults: Arc<Faults>,
    pub mountpoint: PathBuf,
    /// Sizes of the dataset files, by index.
    pub file_sizes: Vec<u64>,
    pub max_read: u64,
    pub namespace: String,
    pub block_min: u64,
    pub block_max: u64,
    /// Pause between one KV client's operations.
    pub kv_pause: Duration,
    /// Largest file a mount writer writes.
    pub max_write: u64,
    pub started: Instant,
}

/// One mount reader: until stopped, reads a random range of a random file whenever a
/// daemon is up.
pub fn reader(ctx: Arc<LoadCtx>, id: u64) {
    let mut rng = StdRng::seed_from_u64(mix(ctx.seed ^ 0x5EAD_0000 ^ id));
    let s = &ctx.stats;
    while !ctx.phase.stopped() {
        let Some(e0) = ctx.phase.up_epoch() else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let i = rng.random_range(0..ctx.file_sizes.len());
        let size = ctx.file_sizes[i];
        let off = rng.random_range(0..size);
        let len = rng.random_range(1..=ctx.max_read.min(size - off));
        let path = ctx.mountpoint.join(content::file_name(i));
        let t0 = Instant::now();
        let r = read_range(&path, off, len as usize);
        let t1 = Instant::now();
        let us = (t1 - t0).as_micros() as u64;
        if ctx.phase.epoch() != e0 {
            s.reads_interrupted_by_kill.fetch_add(1, Ordering::Relaxed);
            // How long it had been waiting when the kill cut it: a stall the kill hid.
            s.max_interrupted_read_us.fetch_max(us, Ordering::Relaxed);
            if ctx.faults.down_during(t0, t1) {
                s.reads_interrupted_while_store_down
                    .fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        s.max_read_us.fetch_max(us, Ordering::Relaxed);
        let store_down = ctx.faults.down_during(t0, t1);
        if !store_down {
            s.max_read_us_store_up.fetch_max(us, Ordering::Relaxed);
        }
        s.read_latencies_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(us);
        match r {
            Ok(buf) => {
                s.reads.fetch_add(1, Ordering::Relaxed);
                if store_down {
                    s.reads_ok_while_store_down.fetch_add(1, Ordering::Relaxed);
                }
                s.read_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
                if buf.len() != len as usize {
                    s.short_reads.fetch_add(1, Ordering::Relaxed);
                }
                let wrong = content::count_wrong(content::file_seed(ctx.seed, i), off, &buf);
                if wrong > 0 {
                    s.wrong_reads.fetch_add(1, Ordering::Relaxed);
                    s.file_wrong_bytes.fetch_add(wrong, Ordering::Relaxed);
                }
            }
            Err(e) if store_down => {
                s.reads_failed_while_store_down
                    .fetch_add(1, Ordering::Relaxed);
                s.max_failed_read_us.fetch_max(us, Ordering::Relaxed);
                let _ = e;
            }
            Err(e) => {
                s.failed_reads.fetch_add(1, Ordering::Relaxed);
                keep_sample(
                    &s.failed_read_samples,
                    format!(
                        "t={:.1}s {} @{off}+{len}: {e} (after {} ms)",
                        (t0 - ctx.started).as_secs_f64(),
                        content::file_name(i),
                        us / 1000
                    ),
                );
            }
        }
    }
}

/// One mount writer: until stopped, writes a new file whenever a daemon is up (mostly
/// up to 1 MiB, one in five over an upload part, so some are multipart uploads), then
/// `fsync`s and closes it: both return the upload's outcome.
pub fn writer(ctx: Arc<LoadCtx>, id: u64) {
    let mut rng = StdRng::seed_from_u64(mix(ctx.seed ^ 0x3A17_0000 ^ id));
    let s = &ctx.stats;
    let mut seq = 0u64;
    while !ctx.phase.stopped() {
        let Some(e0) = ctx.phase.up_epoch() else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let big = ctx.max_write > (8 << 20) && rng.random_bool(0.2);
        let size = if big {
            rng.random_range((8 << 20)..=ctx.max_write)
        } else {
            rng.random_range(1..=ctx.max_write.min(1 << 20))
        };
        let at = {
            let mut w = s.written.lock().unwrap_or_else(|p| p.into_inner());
            w.push(Written {
                writer: id,
                seq,
                size,
                acked: false,
            });
            w.len() - 1
        };
        let path = ctx.mountpoint.join(content::written_name(id, seq));
        let t0 = Instant::now();
        s.writes_in_progress.fetch_add(1, Ordering::AcqRel);
        let r = write_file(&path, content::written_seed(ctx.seed, id, seq), size);
        let t1 = Instant::now();
        seq += 1;
        if r.is_ok() {
            // Confirmed: the upload completed, whatever happens to the daemon next.
            s.written.lock().unwrap_or_else(|p| p.into_inner())[at].acked = true;
            s.writes_acked.fetch_add(1, Ordering::Relaxed);
        }
        s.writes_in_progress.fetch_sub(1, Ordering::AcqRel);
        match r {
            Ok(()) => {}
            Err(_) if ctx.phase.epoch() != e0 => {
                s.writes_interrupted_by_kill.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) if ctx.faults.down_during(t0, t1) => {
                s.writes_failed_while_store_down
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                s.write_errors_while_up.fetch_add(1, Ordering::Relaxed);
                keep_sample(
                    &s.write_error_samples,
                    format!(
                        "t={:.1}s {} ({size} bytes): {e} (after {} ms)",
                        (t0 - ctx.started).as_secs_f64(),
                        path.display(),
                        (t1 - t0).as_millis()
                    ),
                );
            }
        }
    }
}

/// Writes `size` bytes of `fill(seed, ..)` to the new file `path` in 1 MiB writes,
/// then `fsync` and `close`, checking both (a close's error is its flush's).
fn write_file(path: &Path, seed: u64, size: u64) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(buf.len() as u64) as usize;
        content::fill(seed, off, &mut buf[..n]);
        f.write_all_at(&buf[..n], off)?;
        off += n as u64;
    }
    f.sync_all()?;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just released by the `File`, so it is closed exactly once.
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What the final check of the written files found.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct WrittenCheck {
    pub checked: u64,
    /// Confirmed files missing.
    pub lost: u64,
    /// Files present with other bytes or another size (confirmed or not): a torn or
    /// mixed upload.
    pub torn: u64,
    /// Unconfirmed files present whole (their upload completed as the kill came).
    pub unconfirmed_present: u64,
    /// Files that could not be read within the check's retries.
    pub errors: u64,
}

/// Reads every file the writers started back through the mount of a fresh daemon:
/// a confirmed one must be there with its exact bytes, any other must be absent or
/// whole. Waits (up to 5 min) for the writers' last files (the load is stopped), and
/// retries a read that fails (the proxy still injects faults) for up to 20 s.
pub fn verify_written(ctx: &LoadCtx) -> WrittenCheck {
    let until = Instant::now() + Duration::from_secs(300);
    while ctx.stats.writes_in_progress.load(Ordering::Acquire) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let all = ctx
        .stats
        .written
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut c = WrittenCheck::default();
    for w in all {
        let path = ctx.mountpoint.join(content::written_name(w.writer, w.seq));
        let deadline = Instant::now() + Duration::from_secs(20);
        let got = loop {
            match std::fs::read(&path) {
                Ok(b) => break Some(Ok(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break Some(Err(())),
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(_) => break None,
            }
        };
        c.checked += 1;
        match got {
            None => c.errors += 1,
            Some(Err(())) if w.acked => c.lost += 1,
            Some(Err(())) => {}
            Some(Ok(bytes)) => {
                let seed = content::written_seed(ctx.seed, w.writer, w.seq);
                if bytes.len() as u64 != w.size || content::count_wrong(seed, 0, &bytes) > 0 {
                    c.torn += 1;
                } else if !w.acked {
                    c.unconfirmed_present += 1;
                }
            }
        }
    }
    c
}

/// Opens `path`, reads `len` bytes at `off` (fewer only at end of file), drops the
/// kernel's cached pages so the next read of them reaches the daemon again.
fn read_range(path: &Path, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = f.read_at(&mut buf[got..], off + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open fd; the call only drops clean cached pages.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(buf)
}

/// Bound on one KV request, so a daemon that stops answering shows as errors, not a
/// hung bench. 10 s: far above a loopback put or get of a few KiB.
const KV_OP_TIMEOUT: Duration = Duration::from_secs(10);

/// One KV client: until stopped, alternates puts of new blocks and gets of earlier
/// acknowledged ones whenever a daemon is up; reconnects after each restart.
pub async fn kv_client(ctx: Arc<LoadCtx>, id: usize) {
    let mut rng = StdRng::seed_from_u64(mix(ctx.seed ^ 0xC11E_0000 ^ id as u64));
    let s = &ctx.stats;
    let mut seq = 0u64;
    let mut conn: Option<(u64, KvClient)> = None;
    while !ctx.phase.stopped() {
        let Some(e0) = ctx.phase.up_epoch() else {
            conn = None;
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if !matches!(&conn, Some((e, _)) if *e == e0) {
            let addr = ctx.phase.kv_addr();
            match tokio::time::timeout(KV_OP_TIMEOUT, KvClient::connect(&addr)).await {
                Ok(Ok(c)) => conn = Some((e0, c)),
                _ => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            }
        }
        let Some((_, client)) = conn.as_mut() else {
            continue;
        };
        let acked_len = s.acked.lock().unwrap_or_else(|p| p.into_inner()).len();
        if acked_len == 0 || rng.random_bool(0.5) {
            let key = content::block_key(ctx.seed, id, seq);
            seq += 1;
            let data = Bytes::from(content::block_bytes(&key, ctx.block_min, ctx.block_max));
            let r =
                tokio::time::timeout(KV_OP_TIMEOUT, client.put(&ctx.namespace, &key, data)).await;
            match r {
                // Acknowledged: it must survive every kill from now on, whichever epoch.
                Ok(Ok(_)) => {
                    s.acked.lock().unwrap_or_else(|p| p.into_inner()).push(key);
                    s.kv_puts_acked.fetch_add(1, Ordering::Relaxed);
                }
                other => {
                    if ctx.phase.epoch() == e0 {
                        s.kv_put_errors_while_up.fetch_add(1, Ordering::Relaxed);
                        keep_sample(&s.kv_error_samples, format!("put: {other:?}"));
                    }
                    conn = None;
                }
            }
        } else {
            let key = {
                let acked = s.acked.lock().unwrap_or_else(|p| p.into_inner());
                acked[rng.random_range(0..acked.len())]
            };
            s.kv_gets.fetch_add(1, Ordering::Relaxed);
            let r = tokio::time::timeout(KV_OP_TIMEOUT, client.get(&ctx.namespace, &key)).await;
            match r {
                Ok(Ok(Some(data))) => {
                    s.kv_gets_found.fetch_add(1, Ordering::Relaxed);
                    let wrong = check_block(&key, &data, ctx.block_min, ctx.block_max);
                    s.kv_wrong_bytes.fetch_add(wrong, Ordering::Relaxed);
                }
                Ok(Ok(None)) => {
                    // "Not found" is an answer, not an error: whatever the epoch, the
                    // daemon that gave it had lost the block.
                    s.mark_lost(key);
                    keep_sample(
                        &s.kv_error_samples,
                        format!("get: acknowledged block {} not found", hex8(&key)),
                    );
                }
                other => {
                    if ctx.phase.epoch() == e0 {
                        s.kv_get_errors_while_up.fetch_add(1, Ordering::Relaxed);
                        keep_sample(&s.kv_error_samples, format!("get: {other:?}"));
                    }
                    conn = None;
                }
            }
        }
        tokio::time::sleep(ctx.kv_pause).await;
    }
}

fn hex8(key: &[u8; 32]) -> String {
    key[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Wrong bytes of a block read back: differing bytes, plus the length difference.
fn check_block(key: &[u8; 32], got: &[u8], min: u64, max: u64) -> u64 {
    let (seed, size) = content::block_shape(key, min, max);
    let common = got.len().min(size);
    content::count_wrong(seed, 0, &got[..common]) + got.len().abs_diff(size) as u64
}

/// The outcome of checking acknowledged blocks against a live daemon.
#[derive(Debug, Default)]
pub struct Verified {
    pub checked: u64,
    pub lost: u64,
    pub wrong_bytes: u64,
    /// Requests that failed (after retries) instead of answering.
    pub errors: u64,
}

/// Gets every block of `keys` from `addr` (8 at a time) and checks it; a block not
/// found is recorded as lost in `stats`, wrong bytes are added to `kv_wrong_bytes`.
pub async fn verify(ctx: &LoadCtx, addr: &str, keys: &[[u8; 32]]) -> anyhow::Result<Verified> {
    let client = KvClient::connect(addr).await?;
    let results = futures::stream::iter(keys.iter().copied())
        .map(|key| {
            let mut c = client.clone();
            let ns = ctx.namespace.clone();
            async move {
                // A few tries: a verification counts answers, not transport hiccups.
                let mut last = None;
                for _ in 0..3 {
                    match tokio::time::timeout(KV_OP_TIMEOUT, c.get(&ns, &key)).await {
                        Ok(Ok(v)) => return (key, Ok(v)),
                        Ok(Err(e)) => last = Some(e.to_string()),
                        Err(_) => last = Some("timed out".into()),
                    }
                }
                (key, Err(last.unwrap_or_default()))
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    let mut v = Verified::default();
    for (key, r) in results {
        v.checked += 1;
        match r {
            Ok(Some(data)) => {
                let wrong = check_block(&key, &data, ctx.block_min, ctx.block_max);
                v.wrong_bytes += wrong;
                ctx.stats.kv_wrong_bytes.fetch_add(wrong, Ordering::Relaxed);
            }
            Ok(None) => {
                v.lost += 1;
                ctx.stats.mark_lost(key);
                keep_sample(
                    &ctx.stats.kv_error_samples,
                    format!("verify: acknowledged block {} not found", hex8(&key)),
                );
            }
            Err(e) => {
                v.errors += 1;
                keep_sample(&ctx.stats.kv_error_samples, format!("verify: {e}"));
            }
        }
    }
    Ok(v)
}
