//! A stand-in inference client for the IPC path: given a hex-encoded [`IpcHandle`] on
//! the command line (and, for an emulated handle, the exporting device's memory as an
//! inherited descriptor: `--device-fd N --device-size BYTES`), it opens a device of its own (CUDA when built with `cuda` and a
//! GPU is present, else the emulated one), imports the exported block into its own
//! device buffer, copies it back to host memory and prints `len crc32c` of what it
//! received. The integration tests run it as a separate process.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use strata_gds::{
    open_device, DeviceChoice, DeviceKind, EmulatedDevice, IpcHandle, TransferConfig, Transfers,
};

fn main() {
    if let Err(e) = run() {
        eprintln!("gds-ipc-client: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: gds-ipc-client <hex handle> [--device-fd N --device-size BYTES]";
    let hex = args.get(1).ok_or(usage)?;
    let handle = IpcHandle::from_hex(hex)?;
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse::<u64>())
            .transpose()
    };
    let (device_fd, device_size) = (flag("--device-fd")?, flag("--device-size")?);
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
    if let (Some(fd), Some(size)) = (device_fd, device_size) {
        let emulated = device
            .as_any()
            .downcast_ref::<EmulatedDevice>()
            .ok_or("--device-fd is for emulated handles")?;
        let fd = i32::try_from(fd)?;
        // SAFETY: the parent passed this descriptor to us to own (inherited, open).
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let id: [u8; 16] = handle
            .token
            .as_slice()
            .try_into()
            .map_err(|_| "an emulated handle names a 16-byte memory id")?;
        emulated.attach_peer(fd, size, id)?;
    }
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
