//! GPU check for the GPU tier (run by `gds/scripts/device-check.sh` on a machine with
//! an NVIDIA GPU; needs the `cuda` feature).
//!
//! Correctness of every direction against the host's bytes (host->GPU, GPU->host,
//! GPU->GPU, file->GPU on the active path and on the compat path, GPU-tier put/get/hit/
//! demotion, IPC into another process), then throughput next to its ceiling measured in
//! the same run: disk->GPU vs raw O_DIRECT reads, host->GPU vs one cuMemcpyHtoD from
//! pinned memory, GPU-tier hits vs one device-to-device copy. Prints one JSON object per
//! measurement and a summary; exits 1 if any check fails, 2 if there is no usable GPU.
//!
//! Usage: device_check [--size-mib N] [--dir DIR] [--ordinal N]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use strata_cache_core::tiers::memory::MemoryTier;
use strata_cache_core::{Block, CacheKey, Tier, TierGet};
use strata_gds::cuda::CudaDevice;
use strata_gds::file::{DirectFile, ReadAt};
use strata_gds::{Device, GpuTier, IpcHandle, TransferConfig, Transfers};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

use strata_cache_core::testdata::xorshift_bytes as pattern;

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

struct Checks {
    failed: Vec<String>,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool) {
        println!("{{\"check\":\"{name}\",\"ok\":{ok}}}");
        if !ok {
            self.failed.push(name.to_string());
        }
    }
}

fn arg(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--ipc-child") {
        std::process::exit(match ipc_child(&args) {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(e) => {
                eprintln!("ipc child: {e}");
                1
            }
        });
    }
    let ordinal: usize = arg(&args, "--ordinal")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let size_mib: u64 = arg(&args, "--size-mib")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let dir = arg(&args, "--dir")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let device = match CudaDevice::open(ordinal, 32 << 30) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("device_check: no usable GPU: {e}");
            std::process::exit(2);
        }
    };
    match run(device, size_mib << 20, &dir) {
        Ok(failed) if failed.is_empty() => println!("device_check: all checks passed"),
        Ok(failed) => {
            eprintln!("device_check: FAILED: {}", failed.join(", "));
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("device_check: error: {e}");
            std::process::exit(1);
        }
    }
}

fn ipc_child(args: &[String]) -> Res<bool> {
    let handle = IpcHandle::from_hex(&args[2])?;
    let dev: Arc<dyn Device> = Arc::new(CudaDevice::open(0, 8 << 30)?);
    let transfers = Transfers::new(dev.clone(), TransferConfig::default())?;
    let mine = dev.alloc(handle.len as usize)?;
    dev.ipc().ok_or("no ipc")?.import_into(&handle, &mine, 0)?;
    let back = transfers.device_to_vec_blocking(&mine)?;
    Ok(crc32c::crc32c(&back) == handle.crc)
}

fn write_file(dir: &Path, size: u64) -> Res<(tempfile::NamedTempFile, Vec<u8>)> {
    let data = pattern(size as usize, 42);
    let mut f = tempfile::NamedTempFile::new_in(dir)?;
    f.write_all(&data)?;
    f.as_file().sync_all()?;
    Ok((f, data))
}

fn run(device: Arc<CudaDevice>, size: u64, dir: &Path) -> Res<Vec<String>> {
    let dev: Arc<dyn Device> = device.clone();
    let mut c = Checks { failed: Vec::new() };
    let transfers = Transfers::new(dev.clone(), TransferConfig::default())?;
    let compat = Transfers::new(
        dev.clone(),
        TransferConfig {
            force_compat: true,
            ..TransferConfig::default()
        },
    )?;
    println!("{}", serde_json::json!({"describe": transfers.describe()}));
    println!("{}", serde_json::to_string(&transfers.stats())?);

    // --- correctness: host <-> device <-> device
    let host = pattern((64 << 20) + 12_345, 7);
    let a = transfers.bytes_to_device_blocking(&host)?;
    c.check(
        "host_to_device_to_host",
        transfers.device_to_vec_blocking(&a)? == host,
    );
    let b = dev.alloc(host.len())?;
    transfers.device_to_device_blocking(&a, 0, &b, 0, host.len())?;
    c.check(
        "device_to_device",
        transfers.device_to_vec_blocking(&b)? == host,
    );
    let mut part = vec![0u8; 1_000_001];
    transfers.device_to_host_blocking(&b, 4097, &mut part)?;
    c.check(
        "device_to_host_range",
        part[..] == host[4097..4097 + 1_000_001],
    );
    drop((a, b));

    // --- correctness: file -> device, active path and compat path
    let (file, data) = write_file(dir, size)?;
    let ranges = [(0u64, size), (4097, 10_000_019), (size - 77, 77), (123, 1)];
    for (name, eng) in [("active", &transfers), ("compat", &compat)] {
        for (off, len) in ranges {
            let dst = dev.alloc(len as usize)?;
            eng.read_into_device_blocking(file.path(), off, len, &dst, 0)?;
            let ok =
                transfers.device_to_vec_blocking(&dst)? == data[off as usize..(off + len) as usize];
            c.check(&format!("file_to_device_{name}_{off}+{len}"), ok);
        }
    }

    // --- correctness: GPU tier
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let tier = Arc::new(GpuTier::new(transfers.clone(), 1 << 30));
    let lower = MemoryTier::new(1 << 30);
    let block_len = 2 << 20;
    let blocks = 64usize;
    let keys: Vec<CacheKey> = (0..blocks)
        .map(|i| CacheKey::kv("check", (i as u64).to_be_bytes().to_vec()))
        .collect();
    let values: Vec<Bytes> = (0..blocks)
        .map(|i| Bytes::from(pattern(block_len, i as u64)))
        .collect();
    let tier_ok = rt.block_on(async {
        let mut ok = true;
        for (k, v) in keys.iter().zip(&values) {
            tier.put(k, Block::new(v.clone())).await?;
        }
        for (k, v) in keys.iter().zip(&values) {
            ok &= matches!(tier.get(k).await?, TierGet::Hit(b) if b.data() == v);
        }
        let dst = dev.alloc(block_len)?;
        ok &= tier.get_into_device(&keys[0], &dst, 0).await?;
        ok &= transfers.device_to_vec_blocking(&dst)? == values[0];
        ok &= tier.demote(&keys[1], &lower).await?;
        ok &= matches!(lower.get(&keys[1]).await?, TierGet::Hit(b) if b.data() == &values[1]);
        ok &= !tier.contains(&keys[1]).await;
        Ok::<bool, Box<dyn std::error::Error>>(ok)
    })?;
    c.check("gpu_tier_put_get_hit_demote", tier_ok);

    // --- correctness: IPC into another process
    let export = tier.export_ipc(&keys[2])?.ok_or("key 2 not resident")?;
    let hex = export.handle().to_hex();
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["--ipc-child", &hex])
        .status()?;
    c.check("ipc_export_import_other_process", status.success());
    drop(export);

    // --- throughput, each next to its ceiling
    let measure = |name: &str, bytes: u64, f: &mut dyn FnMut() -> Res<()>| -> Res<f64> {
        f()?; // warm-up
        let mut best = 0f64;
        for _ in 0..3 {
            let t = Instant::now();
            f()?;
            best = best.max(gbps(bytes, t.elapsed().as_secs_f64()));
        }
        println!(
            "{}",
            serde_json::json!({"measure": name, "gbps": best, "bytes": bytes})
        );
        Ok(best)
    };
    // disk -> GPU vs raw O_DIRECT reads of the same file.
    let dst = dev.alloc(size as usize)?;
    let direct = DirectFile::open(file.path())?;
    let chunk = transfers.config().chunk_bytes;
    let mut rbuf = dev.alloc_pinned(chunk)?;
    let disk = measure("disk_raw_odirect", size, &mut || {
        let mut off = 0;
        while off < size {
            let n = direct.read_at(rbuf.as_mut_slice(), off)?;
            if n == 0 {
                return Err("short".into());
            }
            off += n as u64;
        }
        Ok(())
    })?;
    let d2g = measure("disk_to_gpu_active", size, &mut || {
        transfers.read_into_device_blocking(file.path(), 0, size, &dst, 0)?;
        Ok(())
    })?;
    let d2g_compat = measure("disk_to_gpu_compat", size, &mut || {
        compat.read_into_device_blocking(file.path(), 0, size, &dst, 0)?;
        Ok(())
    })?;
    // host -> GPU (pageable bytes through pinned staging) vs one pinned cuMemcpyHtoD.
    let hbytes = 256u64 << 20;
    let src = pattern(hbytes as usize, 3);
    let hdst = dev.alloc(hbytes as usize)?;
    let h2g = measure("host_to_gpu_staged", hbytes, &mut || {
        transfers.host_to_device_blocking(&src, &hdst, 0)?;
        Ok(())
    })?;
    let stream = dev.new_stream()?;
    let mut pinned = Some(dev.alloc_pinned(hbytes as usize)?);
    let h2g_ceiling = measure("host_to_gpu_pinned_memcpy", hbytes, &mut || {
        let p = pinned.take().ok_or("pinned buffer lost")?;
        let done = stream.htod(p, 0..hbytes as usize, &hdst, 0).wait();
        pinned = done.value;
        done.result?;
        Ok(())
    })?;
    // GPU-tier hits into a caller's device buffer vs one device-to-device copy.
    let total = (blocks - 1) as u64 * block_len as u64;
    let hit_dst = dev.alloc(total as usize)?;
    let resident: Vec<CacheKey> = keys.iter().filter(|k| **k != keys[1]).cloned().collect();
    let hits = measure("gpu_tier_hits_d2d", total, &mut || {
        rt.block_on(async {
            for (i, k) in resident.iter().enumerate() {
                tier.get_into_device(k, &hit_dst, i * block_len).await?;
            }
            Ok::<(), Box<dyn std::error::Error>>(())
        })
    })?;
    let big = dev.alloc(total as usize)?;
    let d2d = measure("device_to_device_ceiling", total, &mut || {
        transfers.device_to_device_blocking(&big, 0, &hit_dst, 0, total as usize)?;
        Ok(())
    })?;
    let host_hits = measure("gpu_tier_hits_to_host", total, &mut || {
        rt.block_on(async {
            for k in &resident {
                tier.get(k).await?;
            }
            Ok::<(), Box<dyn std::error::Error>>(())
        })
    })?;
    println!(
        "{}",
        serde_json::json!({
            "summary": {
                "path": transfers.path().as_str(),
                "disk_to_gpu_gbps": d2g, "disk_to_gpu_compat_gbps": d2g_compat, "disk_raw_gbps": disk,
                "host_to_gpu_gbps": h2g, "pinned_memcpy_gbps": h2g_ceiling,
                "tier_hits_d2d_gbps": hits, "d2d_ceiling_gbps": d2d, "tier_hits_to_host_gbps": host_hits,
                "stats": transfers.stats(),
            }
        })
    );
    println!(
        "path {}: disk->GPU {:.2} GB/s (compat {:.2}) vs raw disk {:.2}; host->GPU {:.2} vs pinned memcpy {:.2}; tier hits {:.2} vs d2d {:.2} (to host {:.2})",
        transfers.path().as_str(), d2g, d2g_compat, disk, h2g, h2g_ceiling, hits, d2d, host_hits
    );
    Ok(c.failed)
}
