//! A stand-in inference client for the IPC path: given a hex-encoded [`IpcHandle`] on
//! the command line, it opens a device of its own (CUDA when built with `cuda` and a
//! GPU is present, else the emulated one), imports the exported block into its own
//! device buffer, copies it back to host memory and prints `len crc32c` of what it
//! received. The integration tests run it as a separate process.

use std::sync::Arc;

use strata_gds::{open_device, DeviceChoice, DeviceKind, IpcHandle, TransferConfig, Transfers};

fn main() {
    if let Err(e) = run() {
        eprintln!("gds-ipc-client: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let hex = std::env::args()
        .nth(1)
        .ok_or("usage: gds-ipc-client <hex handle>")?;
    let handle = IpcHandle::from_hex(&hex)?;
    let limit = handle.len + (1 << 20);
    let device = match handle.kind {
        DeviceKind::Emulated => open_device(&DeviceChoice::Emulated {
            memory_limit: limit,
        })?,
        DeviceKind::Cuda => open_device(&DeviceChoice::Cuda {
            ordinal: 0,
            memory_limit: limit,
        })?,
    };
    let transfers = Transfers::new(Arc::clone(&device), TransferConfig::default())?;
    let mine = device.alloc(usize::try_from(handle.len)?)?;
    device
        .ipc()
        .ok_or("this device cannot import IPC handles")?
        .import_into(&handle, &mine, 0)?;
    let back = transfers.device_to_vec_blocking(&mine)?;
    println!("{} {:08x}", back.len(), crc32c::crc32c(&back));
    Ok(())
}
