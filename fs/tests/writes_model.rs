//! Writes through the core against a reference model (a proptest state machine, as
//! mountpoint-s3 checks its file system): random sequences of creates, reopens of
//! objects to change them, writes at any
//! offsets, truncates, flushes, releases, reads, deletes and renames over a few names,
//! on a store that takes parts by index and now and then refuses every write. After
//! every step the store holds exactly what the model says was made visible (an object
//! appears at a successful flush or release, whole; a refused upload leaves the store
//! as it was and fails its flush with EIO), reads return those bytes, and every
//! refusal is the errno the model expects.

use std::collections::HashMap;
use std::sync::Arc;

use object_store::ObjectStore;
use proptest::prelude::*;
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore};
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{CacheEngine, ObjectReader};
use strata_fs::filesystem::ROOT_INO;
use strata_fs::{CoreOptions, FsCore, WriteOptions};

mod write_common;
use write_common::{part_store, stored, PartStore};

const NAMES: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Debug)]
enum Op {
    Create(usize),
    /// Opens an existing object to change it (append or patch: no `O_TRUNC`).
    Reopen(usize),
    /// Handle (by position among the open ones), offset, length, byte seed.
    Write(usize, u64, usize, u8),
    Truncate(usize, u64),
    Flush(usize),
    Release(usize),
    Read(usize),
    Unlink(usize),
    Rename(usize, usize),
    /// The store refuses (true) or takes (false) writes from now on.
    WritesDown(bool),
}

fn op() -> impl Strategy<Value = Op> {
    let name = 0..NAMES.len();
    prop_oneof![
        name.clone().prop_map(Op::Create),
        name.clone().prop_map(Op::Reopen),
        // Mostly appends of a few parts (64 KiB) so that streams start; any offset.
        (0usize..4, 0u64..300_000, 1usize..90_000, any::<u8>())
            .prop_map(|(h, o, l, s)| Op::Write(h, o, l, s)),
        (0usize..4, 0u64..200_000).prop_map(|(h, n)| Op::Truncate(h, n)),
        (0usize..4).prop_map(Op::Flush),
        (0usize..4).prop_map(Op::Release),
        name.clone().prop_map(Op::Read),
        name.clone().prop_map(Op::Unlink),
        (name.clone(), name).prop_map(|(a, b)| Op::Rename(a, b)),
        any::<bool>().prop_map(Op::WritesDown),
    ]
}

/// An open write handle in the model: its file's name, inode, handle and contents;
/// whether it changed since its last upload, and whether its last upload failed (then
/// a release does not retry it).
struct Open {
    name: usize,
    ino: u64,
    fh: u64,
    data: Vec<u8>,
    changed: bool,
    failed: bool,
    /// Unlinked while open: written on, never uploaded.
    unlinked: bool,
}

async fn core() -> (
    Arc<FsCore>,
    Arc<dyn ObjectStore>,
    Arc<FaultyStore>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let PartStore { mem, faulty, store } = part_store();
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(16 << 20)))
        .build()
        .expect("engine");
    let reader = ObjectReader::new(engine, store, 64 << 10).expect("reader");
    let mut w = WriteOptions::new(dir.path().join("staging"));
    w.part_size = 64 << 10;
    w.parts_in_flight = 2;
    w.stream_from = 128 << 10;
    w.upload_memory = 192 << 10;
    w.allow_overwrite = true;
    w.allow_delete = true;
    let opts = CoreOptions {
        writes: Some(w),
        ..Default::default()
    };
    (Arc::new(FsCore::new(reader, "", opts)), mem, faulty, dir)
}

/// Reads `name` whole through a fresh handle: its bytes, or the errno.
async fn read_all(c: &Arc<FsCore>, name: &str) -> Result<Vec<u8>, i32> {
    let e = c.lookup(ROOT_INO, name).await.map_err(|e| e.errno())?;
    let o = c.open(e.attr.ino, false).await.map_err(|e| e.errno())?;
    let mut out = Vec::new();
    loop {
        let b = c
            .read(o.fh, out.len() as u64, 64 << 10, 1)
            .await
            .map_err(|e| e.errno())?;
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    c.release(o.fh);
    Ok(out)
}

fn expect_errno(
    got: Result<(), i32>,
    want: Result<(), i32>,
    what: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got, want, "{}", what);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn writes_match_the_reference_model(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("rt");
        rt.block_on(async {
            let (c, mem, faulty, _dir) = core().await;
            let mut down = false;
            // What the store holds, by name (an object appears whole at a flush or
            // release), and the files open for writing.
            let mut visible: HashMap<usize, Vec<u8>> = HashMap::new();
            let mut open: Vec<Open> = Vec::new();
            for (step, op) in ops.into_iter().enumerate() {
                let writing = |n: usize, open: &Vec<Open>| open.iter().any(|o| o.name == n && !o.unlinked);
                match op {
                    Op::Create(n) => {
                        let got = c.create(ROOT_INO, NAMES[n], 0).await;
                        if writing(n, &open) {
                            prop_assert_eq!(got.err().map(|e| e.errno()), Some(libc::EBUSY));
                        } else {
                            let (e, fh) = got.map_err(|e| TestCaseError::fail(format!("create: {e}")))?;
                            open.push(Open { name: n, ino: e.attr.ino, fh, data: Vec::new(), changed: true, failed: false, unlinked: false });
                        }
                    }
                    Op::Reopen(n) => {
                        let got = match c.lookup(ROOT_INO, NAMES[n]).await {
                            Ok(e) => c.open_write(e.attr.ino, false, 0).await.map(|o| (e.attr.ino, o.fh)).map_err(|e| e.errno()),
                            Err(e) => Err(e.errno()),
                        };
                        if writing(n, &open) {
                            prop_assert_eq!(got.err(), Some(libc::EBUSY), "reopen of {} while written", NAMES[n]);
                        } else if let Some(data) = visible.get(&n) {
                            let (ino, fh) = got.map_err(|e| TestCaseError::fail(format!("reopen: errno {e}")))?;
                            open.push(Open { name: n, ino, fh, data: data.clone(), changed: false, failed: false, unlinked: false });
                        } else {
                            prop_assert_eq!(got.err(), Some(libc::ENOENT), "reopen of missing {}", NAMES[n]);
                        }
                    }
                    Op::Write(h, off, len, seed) => {
                        if open.is_empty() { continue; }
                        let i = h % open.len();
                        let o = &mut open[i];
                        let bytes: Vec<u8> = (0..len).map(|i| seed.wrapping_add((i % 251) as u8)).collect();
                        // Mostly appends, so that files are streamed while written.
                        let off = if seed % 3 == 0 { off.min(o.data.len() as u64) } else { o.data.len() as u64 };
                        c.write(o.fh, off, &bytes).map_err(|e| TestCaseError::fail(format!("write: {e}")))?;
                        let end = off as usize + len;
                        if o.data.len() < end { o.data.resize(end, 0); }
                        o.data[off as usize..end].copy_from_slice(&bytes);
                        o.changed = true;
                    }
                    Op::Truncate(h, size) => {
                        if open.is_empty() { continue; }
                        let i = h % open.len();
                        let o = &mut open[i];
                        c.setattr(o.ino, Some(size), Some(o.fh)).await.map_err(|e| TestCaseError::fail(format!("truncate: {e}")))?;
                        o.data.resize(size as usize, 0);
                        o.changed = true;
                    }
                    Op::Flush(h) => {
                        if open.is_empty() { continue; }
                        let i = h % open.len();
                        let o = &mut open[i];
                        let got = c.flush(o.fh).await.map_err(|e| e.errno());
                        if o.unlinked {
                            prop_assert_eq!(got, Ok(()), "a flush of an unlinked file");
                        } else if !o.changed {
                            prop_assert_eq!(got, Ok(()), "a flush with nothing new");
                        } else if down {
                            prop_assert_eq!(got, Err(libc::EIO), "flush with writes refused");
                            o.failed = true;
                        } else {
                            prop_assert_eq!(got, Ok(()), "flush");
                            visible.insert(o.name, o.data.clone());
                            o.changed = false;
                            o.failed = false;
                        }
                    }
                    Op::Release(h) => {
                        if open.is_empty() { continue; }
                        let o = open.remove(h % open.len());
                        c.release_write(o.fh).await;
                        // A release uploads what no flush did, unless the last upload
                        // failed (its close reported it) or the store refuses writes.
                        if o.changed && !o.failed && !down && !o.unlinked {
                            visible.insert(o.name, o.data);
                        }
                    }
                    Op::WritesDown(d) => {
                        down = d;
                        faulty.set_config(FaultConfig { writes_down: d, ..Default::default() });
                    }
                    Op::Read(n) => {
                        let got = read_all(&c, NAMES[n]).await;
                        if let Some(o) = open.iter().find(|o| o.name == n && !o.unlinked) {
                            // What was written so far, as on a local disk.
                            prop_assert!(got.as_ref() == Ok(&o.data), "step {}: read of {} while written ({:?} bytes) != model ({} bytes)", step, NAMES[n], got.as_ref().map(Vec::len), o.data.len());
                        } else {
                            match visible.get(&n) {
                                Some(want) => prop_assert!(got.as_ref() == Ok(want), "step {}: read {} ({:?} bytes) != model ({} bytes)", step, NAMES[n], got.as_ref().map(Vec::len), want.len()),
                                None => prop_assert_eq!(got.err(), Some(libc::ENOENT)),
                            }
                        }
                    }
                    Op::Unlink(n) => {
                        let got = c.unlink(ROOT_INO, NAMES[n]).await.map_err(|e| e.errno());
                        let want = if writing(n, &open) {
                            // Unlinked while open: the name and any object under it go;
                            // the handle writes on and uploads nothing.
                            visible.remove(&n);
                            for o in open.iter_mut().filter(|o| o.name == n && !o.unlinked) {
                                o.unlinked = true;
                            }
                            Ok(())
                        } else if visible.remove(&n).is_some() {
                            Ok(())
                        } else {
                            Err(libc::ENOENT)
                        };
                        expect_errno(got, want, "unlink")?;
                    }
                    Op::Rename(a, b) => {
                        let got = c.rename(ROOT_INO, NAMES[a], ROOT_INO, NAMES[b], false).await.map_err(|e| e.errno());
                        let want = if writing(b, &open) && a != b {
                            Err(libc::EBUSY)
                        } else if writing(a, &open) {
                            // Renamed while written: the file moves, its close uploads
                            // it under the new name, and no object stays under the old;
                            // an object under the old name moves with it (deleted when
                            // the store refuses the copy), until the close replaces it.
                            if a != b {
                                if let Some(v) = visible.remove(&a) {
                                    if !down {
                                        visible.insert(b, v);
                                    }
                                }
                                for o in open.iter_mut().filter(|o| o.name == a && !o.unlinked) {
                                    o.name = b;
                                    o.changed = true;
                                }
                            }
                            Ok(())
                        } else if writing(b, &open) {
                            Err(libc::EBUSY)
                        } else if !visible.contains_key(&a) {
                            Err(libc::ENOENT)
                        } else if down && a != b {
                            // The store's copy is a write: refused, nothing moves.
                            Err(libc::EIO)
                        } else {
                            if a != b {
                                let v = visible.remove(&a).expect("checked");
                                visible.insert(b, v);
                            }
                            Ok(())
                        };
                        expect_errno(got, want, "rename")?;
                    }
                }
                // The store holds exactly what the model made visible.
                for (n, name) in NAMES.iter().enumerate() {
                    let s = stored(&mem, name).await;
                    prop_assert!(s.as_ref() == visible.get(&n), "step {}: store {} has {:?} bytes, model {:?}", step, name, s.as_ref().map(Vec::len), visible.get(&n).map(Vec::len));
                }
            }
            faulty.set_config(FaultConfig::default());
            for o in open.drain(..) {
                c.release_write(o.fh).await;
                if o.changed && !o.failed && !o.unlinked {
                    visible.insert(o.name, o.data);
                }
            }
            for (n, name) in NAMES.iter().enumerate() {
                prop_assert!(stored(&mem, name).await.as_ref() == visible.get(&n), "at the end: {}", name);
            }
            Ok(())
        })?;
    }
}
