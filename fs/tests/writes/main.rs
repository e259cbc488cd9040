//! Writes through the core without a kernel: files staged and uploaded at flush, over
//! an in-memory store behind the fault-injecting wrapper (see `filesystem::write`).
//! The fixtures and helpers are here; the tests by subject in `uploads.rs`,
//! `versions.rs`, `renames.rs`, `folders.rs`, `copies.rs` and `durability.rs`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{CacheEngine, ObjectReader};
use strata_fs::filesystem::{Entry, Kind, ROOT_INO};
use strata_fs::{CoreOptions, FsCore, PassthroughOptions, WriteOptions};

#[path = "../write_common/mod.rs"]
mod write_common;

mod copies;
mod durability;
mod folders;
mod renames;
mod uploads;
mod versions;

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

/// Waits (5 s at most) until `copies` holds `want` copies: they are made and dropped in
/// the background.
async fn copies_settle_at(copies: &strata_fs::passthrough::PassthroughStore, want: usize) {
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

/// Reads `len` bytes at 0 of write handle `fh` (opened read-write) back from staging.
async fn read_staged(c: &Arc<FsCore>, fh: u64, len: u32) -> Vec<u8> {
    c.read(fh, 0, len, 0)
        .await
        .expect("read from staging")
        .to_vec()
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

/// Creates `name` in folder `dir` holding `bytes`, flushed (uploaded) and released.
async fn save(c: &std::sync::Arc<FsCore>, dir: u64, name: &str, bytes: &[u8]) -> Entry {
    let (e, fh) = c.create(dir, name, 0).await.expect("create");
    c.write(fh, 0, bytes).expect("write");
    c.flush(fh).await.expect("flush");
    c.release_write(fh).await;
    e
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
