//! What an `O_DIRECT` read costs when the CPU has just read the memory it lands in.
//!
//! `strata bench tiers` compares a disk-tier hit with raw `pread`s into one buffer that
//! nothing ever reads. A hit must read its bytes (the crc32c check) and so must whoever
//! consumes them; on some machines (the 2-vCPU VMs of docs/BENCHMARKS.md) the next
//! device transfer into memory the CPU has cached is much slower. This separates that
//! effect from the tier: the same 1 MiB reads of one file, six ways, in rounds:
//!
//! - `untouched`: one buffer, never read by the CPU (the bench's ceiling);
//! - `crc_same`: one buffer, its crc32c computed before each read (a verified hit);
//! - `crc_other`: one buffer untouched, the crc32c of *another* buffer computed before
//!   each read (the same CPU work, other memory);
//! - `rot8_untouched` / `rot8_crc`: eight buffers in turn, untouched / checksummed;
//! - `spin_crc_same`: as `crc_same`, the read through io_uring with the thread spinning
//!   on the completion queue instead of sleeping in the kernel.
//!
//! `cargo run --release -p strata-cache-core --example read_after_touch -- [DIR] [ROUNDS]`
//!
//! DIR (default: a temporary directory) should be on the device to measure; it gets a
//! 256 MiB file, removed at the end. Prints the median read latency of each way.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::{Duration, Instant};

use strata_cache_core::checksum::crc32c;
use strata_cache_core::io::AlignedBuf;

const MIB: usize = 1 << 20;
/// Distinct 1 MiB ranges read, in a fixed stride order (not sequential on the device).
const RANGES: usize = 256;
const WAYS: [&str; 6] = [
    "untouched",
    "crc_same",
    "crc_other",
    "rot8_untouched",
    "rot8_crc",
    "spin_crc_same",
];

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let tmp;
    let dir = match args.next() {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let rounds: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(3);
    let path = dir.join("read_after_touch.bin");
    {
        let mut f = std::fs::File::create(&path)?;
        let chunk: Vec<u8> = (0..MIB).map(|j| (j * 7 % 251) as u8).collect();
        for _ in 0..RANGES {
            f.write_all(&chunk)?;
        }
        f.sync_all()?;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)?;
    let mut one = AlignedBuf::zeroed(MIB);
    let other = AlignedBuf::zeroed(MIB);
    let mut eight: Vec<AlignedBuf> = (0..8).map(|_| AlignedBuf::zeroed(MIB)).collect();
    let mut ring = io_uring::IoUring::new(8)?;
    let mut lat: Vec<Vec<Duration>> = vec![Vec::new(); WAYS.len()];
    for _ in 0..rounds {
        for (way, into) in lat.iter_mut().enumerate() {
            for i in 0..RANGES {
                let offset = ((i * 97 % RANGES) * MIB) as u64;
                let buf = match way {
                    3 | 4 => &mut eight[i % 8],
                    _ => &mut one,
                };
                match way {
                    1 | 4 | 5 => {
                        std::hint::black_box(crc32c(buf.full()));
                    }
                    2 => {
                        std::hint::black_box(crc32c(other.full()));
                    }
                    _ => {}
                }
                let start = Instant::now();
                if way == 5 {
                    spin_read(&mut ring, &file, buf, offset)?;
                } else {
                    file.read_exact_at(buf.full_mut(), offset)?;
                }
                into.push(start.elapsed());
            }
        }
    }
    for (name, v) in WAYS.iter().zip(lat.iter_mut()) {
        v.sort();
        println!(
            "{name:16} read p50 {:>8.1} us",
            v[v.len() / 2].as_secs_f64() * 1e6
        );
    }
    std::fs::remove_file(&path)
}

/// One read through io_uring, spinning on the completion queue until it is done.
fn spin_read(
    ring: &mut io_uring::IoUring,
    file: &std::fs::File,
    buf: &mut AlignedBuf,
    offset: u64,
) -> std::io::Result<()> {
    let dst = buf.full_mut();
    let entry = io_uring::opcode::Read::new(
        io_uring::types::Fd(file.as_raw_fd()),
        dst.as_mut_ptr(),
        dst.len() as u32,
    )
    .offset(offset)
    .build();
    // SAFETY: `dst` and `file` outlive the request: this function does not return
    // before its completion has been reaped below.
    unsafe { ring.submission().push(&entry) }.map_err(std::io::Error::other)?;
    ring.submit()?;
    loop {
        if let Some(c) = ring.completion().next() {
            return match c.result() {
                n if n as usize == MIB => Ok(()),
                n if n < 0 => Err(std::io::Error::from_raw_os_error(-n)),
                n => Err(std::io::Error::other(format!("short read: {n}"))),
            };
        }
        std::hint::spin_loop();
    }
}
