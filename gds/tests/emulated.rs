//! Every GPU-tier path on the emulated device: transfers in each direction, budgets,
//! path selection, and faults (allocation failure, short reads, device lost
//! mid-transfer, corruption) giving clear errors without losing data.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use strata_cache_core::conformance::TestTier;
use strata_cache_core::tiers::memory::MemoryTier;
use strata_cache_core::{Block, CacheError, CacheKey, Tier, TierGet};
use strata_gds::file::{DirectFile, ReadAt};
use strata_gds::{
    open_device, Device, DeviceChoice, DeviceKind, EmulatedDevice, GdsError, GpuTier, IpcHandle,
    TransferConfig, TransferPath, Transfers,
};

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13).wrapping_add(seed) as u8)
        .collect()
}

/// Small chunks so that even small transfers cross many chunk boundaries.
fn small_chunks() -> TransferConfig {
    TransferConfig {
        chunk_bytes: 64 << 10,
        depth: 2,
        streams: 2,
        max_staging_buffers: 4,
        force_compat: false,
    }
}

fn setup(limit: u64) -> (Arc<EmulatedDevice>, Arc<Transfers>) {
    let dev = Arc::new(EmulatedDevice::new(limit));
    let transfers = Transfers::new(dev.clone(), small_chunks()).expect("transfers");
    (dev, transfers)
}

fn temp_file(data: &[u8]) -> tempfile::NamedTempFile {
    // Under the target dir rather than /tmp, which may be tmpfs (no O_DIRECT).
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let mut f = tempfile::NamedTempFile::new_in(dir).expect("temp file");
    f.write_all(data).expect("write");
    f.flush().expect("flush");
    f
}

async fn hit_bytes(tier: &dyn Tier, key: &CacheKey) -> Option<Bytes> {
    match tier.get(key).await.expect("get") {
        TierGet::Hit(b) => Some(b.into_data()),
        TierGet::Miss | TierGet::Throttled => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gpu_tier_conforms() {
    let (_dev, transfers) = setup(64 << 20);
    strata_cache_core::conformance::run_all(Arc::new(GpuTier::new(transfers, 16 << 20))).await;
}

#[test]
fn file_ranges_land_in_device_memory_byte_for_byte() {
    let data = pattern((1 << 20) + 12_345, 7);
    let file = temp_file(&data);
    let (dev, transfers) = setup(8 << 20);
    let ranges: [(u64, u64); 6] = [
        (0, data.len() as u64),       // whole file, unaligned end
        (4097, 300_001),              // unaligned start and length across chunks
        (100, 1),                     // one byte
        (65_536, 65_536),             // exactly one aligned chunk
        (data.len() as u64 - 10, 10), // tail up to EOF
        (500, 0),                     // empty
    ];
    for (off, len) in ranges {
        let dst = dev.alloc(len as usize + 3).expect("alloc");
        let n = transfers
            .read_into_device_blocking(file.path(), off, len, &dst, 3)
            .expect("read_into_device");
        assert_eq!(n, len);
        let got = dev.read_raw(&dst).expect("raw");
        assert_eq!(
            &got[3..],
            &data[off as usize..(off + len) as usize],
            "range {off}+{len}"
        );
        assert_eq!(&got[..3], &[0, 0, 0], "bytes before dst_off untouched");
    }
    // Buffered files (where O_DIRECT is refused) take the same pipeline.
    let buffered = DirectFile::open_buffered(file.path()).expect("open");
    let dst = dev.alloc(200_000).expect("alloc");
    transfers
        .read_from_into_device_blocking(&buffered, 777, 200_000, &dst, 0)
        .expect("buffered read");
    assert_eq!(dev.read_raw(&dst).expect("raw"), &data[777..200_777]);
    assert_eq!(transfers.path(), TransferPath::Emulated);
    assert!(transfers.stats().file_to_device_bytes >= data.len() as u64);
}

#[tokio::test]
async fn async_read_into_device_matches_file() {
    let data = pattern(300_000, 3);
    let file = temp_file(&data);
    let (dev, transfers) = setup(1 << 20);
    let dst = dev.alloc(data.len()).expect("alloc");
    transfers
        .read_into_device(
            file.path().to_path_buf(),
            0,
            data.len() as u64,
            dst.clone(),
            0,
        )
        .await
        .expect("read");
    assert_eq!(dev.read_raw(&dst).expect("raw"), data);
}

/// Returns at most `max` bytes per call, and reports end of file at `eof`.
struct Stingy {
    data: Vec<u8>,
    max: usize,
    eof: usize,
    calls: AtomicUsize,
}

impl ReadAt for Stingy {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let off = offset as usize;
        if off >= self.eof {
            return Ok(0);
        }
        let n = buf.len().min(self.max).min(self.eof - off);
        buf[..n].copy_from_slice(&self.data[off..off + n]);
        Ok(n)
    }
    fn alignment(&self) -> usize {
        1
    }
}

#[test]
fn partial_reads_are_resumed_and_short_reads_are_clear_errors() {
    let data = pattern(200_000, 11);
    let (dev, transfers) = setup(1 << 20);
    let dst = dev.alloc(data.len()).expect("alloc");
    let partial = Stingy {
        data: data.clone(),
        max: 1000,
        eof: data.len(),
        calls: AtomicUsize::new(0),
    };
    transfers
        .read_from_into_device_blocking(&partial, 0, data.len() as u64, &dst, 0)
        .expect("partial reads resume");
    assert_eq!(dev.read_raw(&dst).expect("raw"), data);
    assert!(partial.calls.load(Ordering::Relaxed) >= 200);

    let short = Stingy {
        data: data.clone(),
        max: usize::MAX,
        eof: 150_000,
        calls: AtomicUsize::new(0),
    };
    let err = transfers
        .read_from_into_device_blocking(&short, 0, data.len() as u64, &dst, 0)
        .expect_err("source ends early");
    assert!(
        matches!(
            err,
            GdsError::ShortRead {
                offset: 150_000,
                ..
            }
        ),
        "{err}"
    );

    // A real file read past its end is the same clear error.
    let file = temp_file(&data);
    let err = transfers
        .read_into_device_blocking(file.path(), 100_000, 150_000, &dst, 0)
        .expect_err("past EOF");
    assert!(matches!(err, GdsError::ShortRead { .. }), "{err}");

    // Staging buffers went back to the pool: the next transfer still runs.
    transfers
        .read_into_device_blocking(file.path(), 0, data.len() as u64, &dst, 0)
        .expect("after errors");
    assert_eq!(dev.read_raw(&dst).expect("raw"), data);
    assert!(transfers.stats().errors >= 2);
}

#[test]
fn host_device_round_trips_across_chunks() {
    let (dev, transfers) = setup(4 << 20);
    for len in [0usize, 1, 4095, 65_536, 65_537, 1_000_003] {
        let data = pattern(len, len as u32);
        let a = transfers.bytes_to_device_blocking(&data).expect("h2d");
        let b = dev.alloc(len).expect("alloc");
        transfers
            .device_to_device_blocking(&a, 0, &b, 0, len)
            .expect("d2d");
        assert_eq!(
            transfers.device_to_vec_blocking(&b).expect("d2h"),
            data,
            "len {len}"
        );
        if len > 10 {
            let mut part = vec![0u8; len - 10];
            transfers
                .device_to_host_blocking(&a, 5, &mut part)
                .expect("d2h part");
            assert_eq!(&part[..], &data[5..len - 5]);
        }
    }
    let s = transfers.stats();
    assert!(s.h2d_bytes > 0 && s.d2h_bytes > 0 && s.d2d_bytes > 0);
    assert_eq!(s.device.kind, DeviceKind::Emulated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_transfers_share_a_small_pool_without_deadlock() {
    let data = pattern(700_000, 5);
    let file = Arc::new(temp_file(&data));
    let (dev, transfers) = setup(32 << 20);
    let mut tasks = Vec::new();
    for i in 0..12u64 {
        let (transfers, dev, file) = (transfers.clone(), dev.clone(), file.clone());
        tasks.push(tokio::spawn(async move {
            let off = i * 1000 + 1;
            let len = 600_000;
            let dst = dev.alloc(len).expect("alloc");
            transfers
                .read_into_device(file.path().to_path_buf(), off, len as u64, dst.clone(), 0)
                .await
                .expect("read");
            (off as usize, dev.read_raw(&dst).expect("raw"))
        }));
    }
    for t in tasks {
        let (off, got) = t.await.expect("task");
        assert_eq!(got, &data[off..off + 600_000]);
    }
}

#[tokio::test]
async fn the_device_limit_is_a_clear_full_error() {
    // (The byte budget is the engine's: cache-core/tests/engine.rs.) Device memory
    // below the configured size: the allocation fails cleanly, as Full.
    let (dev, transfers) = setup(500_000);
    let tier = GpuTier::new(transfers, 8 << 20);
    let a = CacheKey::file("f", "v", 0);
    tier.put(&a, Block::new(Bytes::from(pattern(300_000, 2))))
        .await
        .expect("fits");
    let err = tier
        .put(
            &CacheKey::file("f", "v", 1),
            Block::new(Bytes::from(pattern(300_000, 3))),
        )
        .await
        .expect_err("device full");
    assert!(matches!(err, CacheError::Full(_)), "{err}");
    assert_eq!(tier.used_bytes(), 300_000);
    assert_eq!(dev.allocated_bytes(), 300_000);
    assert_eq!(
        hit_bytes(&tier, &a).await.expect("still there"),
        pattern(300_000, 2)
    );
}

#[tokio::test]
async fn injected_allocation_failure_keeps_the_tier_intact() {
    let (dev, transfers) = setup(8 << 20);
    let tier = GpuTier::new(transfers, 4 << 20);
    let a = CacheKey::kv("ns", vec![1; 8]);
    let b = CacheKey::kv("ns", vec![2; 8]);
    tier.put(&a, Block::new(Bytes::from(pattern(10_000, 1))))
        .await
        .expect("put a");
    dev.fail_next_allocs(1);
    let err = tier
        .put(&b, Block::new(Bytes::from(pattern(10_000, 2))))
        .await
        .expect_err("alloc fails");
    assert!(matches!(err, CacheError::Full(_)), "{err}");
    assert!(!tier.contains(&b).await);
    assert_eq!(tier.used_bytes(), 10_000);
    assert_eq!(
        hit_bytes(&tier, &a).await,
        Some(Bytes::from(pattern(10_000, 1)))
    );
    tier.put(&b, Block::new(Bytes::from(pattern(10_000, 2))))
        .await
        .expect("retry works");
    assert_eq!(tier.stats().errors, 1);
}

#[tokio::test]
async fn device_lost_mid_put_drops_the_tier_cleanly_and_lower_tiers_keep_their_copies() {
    let (dev, transfers) = setup(16 << 20);
    let gpu = GpuTier::new(transfers, 8 << 20);
    let host = MemoryTier::new(8 << 20);
    let keys: Vec<CacheKey> = (0..4).map(|i| CacheKey::file("m", "v", i)).collect();
    for (i, k) in keys.iter().enumerate() {
        gpu.put(k, Block::new(Bytes::from(pattern(200_000, i as u32))))
            .await
            .expect("put");
    }
    // Demote one block: it moves to the host tier, verified, and leaves the GPU.
    assert!(gpu.demote(&keys[0], &host).await.expect("demote"));
    assert!(!gpu.contains(&keys[0]).await);
    assert_eq!(
        hit_bytes(&host, &keys[0]).await,
        Some(Bytes::from(pattern(200_000, 0)))
    );

    dev.lose_after_bytes(100_000);
    let err = gpu
        .put(
            &CacheKey::file("m", "v", 9),
            Block::new(Bytes::from(pattern(300_000, 9))),
        )
        .await
        .expect_err("device lost mid-copy");
    assert!(
        matches!(&err, CacheError::Device(m) if m.contains("lost")),
        "{err}"
    );
    // Device memory is gone: the tier says so rather than pretending to hold blocks.
    assert_eq!(gpu.used_bytes(), 0);
    assert!(gpu.resident().is_empty());
    assert_eq!(dev.allocated_bytes(), 0, "all device memory released");
    assert!(matches!(
        gpu.get(&keys[1]).await,
        Err(CacheError::Device(_))
    ));
    // The lower tier is untouched.
    assert_eq!(
        hit_bytes(&host, &keys[0]).await,
        Some(Bytes::from(pattern(200_000, 0)))
    );
    assert!(gpu.transfer_stats().device_lost);
}

#[tokio::test]
async fn device_lost_mid_read_back_is_an_error_not_a_bad_hit() {
    let (dev, transfers) = setup(16 << 20);
    let gpu = GpuTier::new(transfers, 8 << 20);
    let k = CacheKey::file("r", "v", 0);
    gpu.put(&k, Block::new(Bytes::from(pattern(500_000, 4))))
        .await
        .expect("put");
    dev.lose_after_bytes(200_000);
    assert!(matches!(gpu.get(&k).await, Err(CacheError::Device(_))));
    assert!(gpu.resident().is_empty());
}

#[tokio::test]
async fn demotion_that_cannot_land_keeps_the_block() {
    let (_dev, transfers) = setup(16 << 20);
    let gpu = GpuTier::new(transfers, 8 << 20);
    // A lower tier whose device refuses every write (as a full disk would).
    let failing = TestTier::refusing_puts(MemoryTier::new(1 << 20), "failing");
    let k = CacheKey::file("d", "v", 0);
    gpu.put(&k, Block::new(Bytes::from(pattern(50_000, 8))))
        .await
        .expect("put");
    assert!(gpu.demote(&k, &failing).await.is_err());
    assert_eq!(
        hit_bytes(&gpu, &k).await,
        Some(Bytes::from(pattern(50_000, 8)))
    );
}

#[tokio::test]
async fn corrupt_device_bytes_are_dropped_not_served() {
    let (dev, transfers) = setup(16 << 20);
    let gpu = GpuTier::new(transfers, 8 << 20);
    let k = CacheKey::kv("ns", vec![7; 16]);
    gpu.put(&k, Block::new(Bytes::from(pattern(70_000, 6))))
        .await
        .expect("put");
    let buf = gpu.device_buffer(&k).expect("resident");
    assert!(dev.corrupt_byte(&buf, 69_999));
    drop(buf);
    assert!(matches!(gpu.get(&k).await, Ok(TierGet::Miss)));
    assert!(!gpu.contains(&k).await);
    assert_eq!(gpu.used_bytes(), 0);
    assert_eq!(gpu.stats().errors, 1);
}

#[tokio::test]
async fn misses_fill_from_the_store_and_hits_go_device_to_device() {
    let (dev, transfers) = setup(16 << 20);
    let gpu = GpuTier::new(transfers, 8 << 20);
    let k = CacheKey::file("s", "v", 0);
    let data = Bytes::from(pattern(123_456, 9));
    let fetched = data.clone();
    let block = gpu
        .fill_from(&k, async move { Ok(fetched) })
        .await
        .expect("fill");
    assert_eq!(block.data(), &data);
    let dst = dev.alloc(200_000).expect("client buffer");
    assert!(gpu.get_into_device(&k, &dst, 1000).await.expect("hit"));
    assert_eq!(&dev.read_raw(&dst).expect("raw")[1000..124_456], &data[..]);
    assert!(!gpu
        .get_into_device(&CacheKey::file("s", "v", 1), &dst, 0)
        .await
        .expect("miss"));
    // A store failure is passed through and stores nothing.
    let err = gpu
        .fill_from(&CacheKey::file("s", "v", 2), async {
            Err(CacheError::StoreTimeout { attempts: 3 })
        })
        .await
        .expect_err("store failed");
    assert!(matches!(err, CacheError::StoreTimeout { .. }));
    assert_eq!(gpu.resident().len(), 1);
}

/// A client device that received `dev`'s memory, as the KV service's side socket
/// hands it (here a duplicated descriptor in the same process).
fn client_of(dev: &EmulatedDevice) -> EmulatedDevice {
    let client = EmulatedDevice::new(1 << 20);
    let (fd, size) = dev.memory_fd();
    let fd = fd.try_clone_to_owned().expect("dup");
    client
        .attach_peer(fd, size, dev.memory_id())
        .expect("attach");
    client
}

#[tokio::test]
async fn ipc_export_reaches_a_client_device_and_is_revoked_on_drop() {
    let (dev, transfers) = setup(16 << 20);
    let gpu = GpuTier::new(transfers, 8 << 20);
    let k = CacheKey::kv("llama", vec![3; 32]);
    let data = pattern(100_000, 12);
    gpu.put(&k, Block::new(Bytes::from(data.clone())))
        .await
        .expect("put");

    let export = gpu.export_ipc(&k).expect("export").expect("resident");
    let wire = export.handle().to_bytes();
    let handle = IpcHandle::from_bytes(&wire).expect("parse");
    assert_eq!(handle.len, data.len() as u64);
    assert_eq!(
        handle.token,
        dev.memory_id().to_vec(),
        "names the device memory"
    );
    // Without the device's memory the handle does not open (as CUDA IPC without the
    // driver's mapping): a client must receive the memfd first.
    let stranger = EmulatedDevice::new(1 << 20);
    let mine = stranger.alloc(data.len()).expect("alloc");
    assert!(matches!(
        stranger.ipc().expect("ipc").import_into(&handle, &mine, 0),
        Err(GdsError::Ipc(_))
    ));
    // The client: its own device, its own buffer, the handle bytes and the memfd.
    let client = client_of(&dev);
    assert_eq!(&client.open_view(&handle).expect("view")[..], &data[..]);
    let mine = client.alloc(data.len() + 8).expect("client alloc");
    client
        .ipc()
        .expect("ipc")
        .import_into(&handle, &mine, 8)
        .expect("import");
    assert_eq!(&client.read_raw(&mine).expect("raw")[8..], &data[..]);

    // A handle whose crc does not match the bytes is refused.
    let mut forged = handle.clone();
    forged.crc ^= 1;
    assert!(matches!(
        client.ipc().expect("ipc").import_into(&forged, &mine, 0),
        Err(GdsError::Corrupt(_))
    ));
    // A handle pointing past the device's memory is refused.
    let mut wild = handle.clone();
    wild.offset = u64::MAX - 10;
    assert!(client.open_view(&wild).is_err());
    // Too small a destination is refused before anything is copied.
    let small = client.alloc(10).expect("alloc");
    assert!(matches!(
        client.ipc().expect("ipc").import_into(&handle, &small, 0),
        Err(GdsError::InvalidRange(_))
    ));
    // Evicted and the export dropped: the range goes back to the device and is
    // reused; the stale handle is refused, never copied.
    assert!(gpu.remove(&k).await.expect("remove"));
    drop(export);
    gpu.put(&k, Block::new(Bytes::from(pattern(100_000, 99))))
        .await
        .expect("put again");
    let err = client
        .ipc()
        .expect("ipc")
        .import_into(&handle, &mine, 0)
        .expect_err("revoked");
    assert!(err.to_string().contains("revoked"), "{err}");
    assert!(gpu
        .export_ipc(&CacheKey::kv("llama", vec![4; 32]))
        .expect("ok")
        .is_none());
    assert!(IpcHandle::from_bytes(&wire[..wire.len() - 1]).is_err());
}

#[tokio::test]
async fn an_exported_block_outlives_its_eviction_until_the_lease_ends() {
    let (dev, transfers) = setup(16 << 20);
    let gpu = GpuTier::new(transfers, 8 << 20);
    let client = client_of(&dev);
    let k = CacheKey::kv("llama", vec![6; 32]);
    let data = pattern(300_000, 5);
    gpu.put(&k, Block::new(Bytes::from(data.clone())))
        .await
        .expect("put");
    let export = gpu.export_ipc(&k).expect("export").expect("resident");
    let view = client.open_view(export.handle()).expect("view");
    let held = dev.allocated_bytes();
    // Evicted while leased: gone from the tier, not from the device.
    assert!(gpu.remove(&k).await.expect("remove"));
    assert_eq!(gpu.used_bytes(), 0);
    assert_eq!(dev.allocated_bytes(), held, "the lease keeps the memory");
    // New blocks never land on the leased range: the reader still sees its bytes.
    for i in 0..8u8 {
        gpu.put(
            &CacheKey::kv("llama", vec![i; 8]),
            Block::new(Bytes::from(pattern(300_000, 100 + u32::from(i)))),
        )
        .await
        .expect("put");
    }
    assert_eq!(&view[..], &data[..], "byte-exact while leased");
    drop(view);
    drop(export);
    assert_eq!(
        dev.allocated_bytes(),
        held - data.len() as u64 + 8 * 300_000,
        "freed when the lease ends"
    );
}

#[test]
fn device_choice_falls_back_without_cuda() {
    let limit = 1 << 20;
    let dev = open_device(&DeviceChoice::CudaOrEmulated {
        ordinal: 0,
        memory_limit: limit,
    })
    .expect("some device");
    // Without the cuda feature or a GPU this is the emulated device; with both it is a
    // real GPU. Either way it allocates within its limit.
    assert!(dev.info().memory_limit <= limit);
    if cfg!(not(feature = "cuda")) {
        assert_eq!(dev.info().kind, DeviceKind::Emulated);
        assert!(matches!(
            open_device(&DeviceChoice::Cuda {
                ordinal: 0,
                memory_limit: limit
            }),
            Err(GdsError::Unavailable(_))
        ));
    }
    let transfers = Transfers::new(dev, TransferConfig::default()).expect("transfers");
    let json = serde_json::to_value(transfers.stats()).expect("json");
    assert!(json["path"].is_string());
    assert!(transfers.describe().contains("transfer path"));
}

#[test]
fn staged_bench_verifies_its_bytes_and_reports_both_ceilings() {
    let r = strata_gds::bench::staged_copy_bench(&strata_gds::bench::StagedBenchConfig {
        dir: std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        size_bytes: (8 << 20) + 4096,
        chunk_bytes: 1 << 20,
        depth: 2,
        runs: 1,
    })
    .expect("bench");
    assert!(r.verified);
    assert!(r.staged_gbps > 0.0 && r.memcpy_gbps > 0.0 && r.disk_gbps > 0.0);
    let json = serde_json::to_value(&r).expect("json");
    for k in ["staged_gbps", "memcpy_gbps", "disk_gbps"] {
        assert!(json[k].is_f64(), "{k}");
    }
}

#[tokio::test]
async fn ipc_export_is_received_by_a_separate_client_process() {
    let (dev, transfers) = setup(16 << 20);
    let gpu = GpuTier::new(transfers, 8 << 20);
    let k = CacheKey::kv("llama", vec![5; 32]);
    let data = pattern(250_000, 21);
    gpu.put(&k, Block::new(Bytes::from(data.clone())))
        .await
        .expect("put");
    let export = gpu.export_ipc(&k).expect("export").expect("resident");
    let hex = export.handle().to_hex();
    // The device memory travels as an inherited descriptor (the KV service sends it
    // over its Unix socket); the child maps it read-only.
    let (fd, size) = dev.memory_fd();
    let inherited = nix::unistd::dup(fd).expect("dup without close-on-exec");
    let run = |hex: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gds-ipc-client"))
            .args([
                hex,
                "--device-fd",
                &inherited.as_raw_fd().to_string(),
                "--device-size",
                &size.to_string(),
            ])
            .output()
            .expect("spawn client")
    };
    let out = run(&hex);
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expect = format!("{} {:08x}\n", data.len(), crc32c::crc32c(&data));
    assert_eq!(String::from_utf8_lossy(&out.stdout), expect);
    // Revoked: evicted, the export dropped and the range reused, the same handle no
    // longer opens (its bytes fail the handle's crc).
    assert!(gpu.remove(&k).await.expect("remove"));
    drop(export);
    gpu.put(&k, Block::new(Bytes::from(pattern(250_000, 22))))
        .await
        .expect("put again");
    let out = run(&hex);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("revoked"));
}

#[test]
fn bad_chunk_sizes_are_refused() {
    let dev = Arc::new(EmulatedDevice::new(1 << 20));
    for chunk in [0usize, 1000, 4097] {
        let cfg = TransferConfig {
            chunk_bytes: chunk,
            ..TransferConfig::default()
        };
        assert!(matches!(
            Transfers::new(dev.clone(), cfg),
            Err(GdsError::InvalidRange(_))
        ));
    }
}

/// Black-box finding (round 14b): views of the emulated device's blocks that a client
/// held read all zeros once the daemon stopped gracefully: the tier's blocks, dropped at
/// shutdown, were cleared for reuse in the memory the client maps. A retiring device
/// leaves freed memory as it is.
#[tokio::test]
async fn a_clients_view_keeps_its_bytes_when_the_tier_shuts_down() {
    let (dev, transfers) = setup(16 << 20);
    let gpu = GpuTier::new(transfers, 8 << 20);
    let k = CacheKey::kv("llama", vec![5; 32]);
    let data = pattern(100_000, 5);
    gpu.put(&k, Block::new(Bytes::from(data.clone())))
        .await
        .expect("put");
    let export = gpu.export_ipc(&k).expect("export").expect("resident");
    let handle = IpcHandle::from_bytes(&export.handle().to_bytes()).expect("parse");
    let client = client_of(&dev);
    drop(export);
    drop(gpu); // the daemon's shutdown
    assert_eq!(
        &client.open_view(&handle).expect("view")[..],
        &data[..],
        "the bytes stay"
    );
}
