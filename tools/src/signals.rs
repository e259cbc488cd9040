//! Stop signals (SIGINT, SIGTERM, SIGHUP) for the commands that must clean up before
//! they exit: `strata demo` and the fs benchmarks, which serve a FUSE mount from their
//! own process, and `strata mount` while it waits for its daemon.
//!
//! A process that serves its own mount cannot simply die: at exit the kernel closes
//! its files on that mount, and each close waits on a FUSE request that only the
//! (exiting) process could answer, so it is left a zombie with a thread in D state,
//! SIGKILL included, its mount hanging every access (black-box finding). So the signals
//! are caught ([`catch`]), the command stops in order where it can (`strata demo`), and
//! [`exit_on_signal`] is the backstop: it detaches the process's own mounts, closes its
//! files on them while their server still answers, aborts their connections, and exits
//! with 128 + the signal.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The signals that ask a command to stop.
pub const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

static LAST: AtomicI32 = AtomicI32::new(0);
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Set once [`exit_on_signal`]'s thread has begun releasing the mounts: that thread
/// ends the process (see [`settle`]).
static RELEASING: AtomicBool = AtomicBool::new(false);
/// Mountpoints this process serves itself, and temp dirs to remove at a signal's exit.
static OWN_MOUNTS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static TEMP_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn record(sig: libc::c_int) {
    // Atomics only: nothing else is async-signal-safe.
    LAST.store(sig, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
}

/// From now on the stop signals are recorded ([`received`]) instead of ending the
/// process. Also when they were inherited ignored (a script's background job ignores
/// SIGINT): the command was asked to stop all the same (black-box finding: `strata
/// demo` ran its whole workload after Ctrl-C).
pub fn catch() -> std::io::Result<()> {
    for sig in STOP_SIGNALS {
        // SAFETY: a zeroed sigaction is valid; `record` only touches atomics, so it is
        // async-signal-safe; SA_RESTART keeps the interrupted calls going.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = record as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The last stop signal caught, if any.
pub fn received() -> Option<libc::c_int> {
    match LAST.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Waits (polling) for a stop signal; returns it.
pub async fn recv() -> libc::c_int {
    loop {
        if let Some(s) = received() {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The error a command stopped by `sig` ends with: exit status 128 + `sig`, as the
/// signal's default action would report it.
pub fn interrupted(sig: libc::c_int, what: &str) -> anyhow::Error {
    anyhow::Error::new(crate::cli::ExitWith {
        code: u8::try_from(128 + sig).unwrap_or(1),
        msg: format!("stopped by {}: {what}", signal_name(sig)),
    })
}

fn signal_name(sig: libc::c_int) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        s => format!("signal {s}"),
    }
}

/// Records that this process serves the FUSE mount at `mountpoint` (from before it is
/// mounted: a signal during the mount must find it).
pub fn own_mount(mountpoint: &Path) {
    let p = std::path::absolute(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let p = std::fs::canonicalize(&p).unwrap_or(p);
    if let Ok(mut m) = OWN_MOUNTS.lock() {
        if !m.contains(&p) {
            m.push(p);
        }
    }
}

/// Records a temp dir the command would remove at its end, for a signal's exit to
/// remove (after the mounts in it are detached).
pub fn remove_on_signal(dir: &Path) {
    if let Ok(mut d) = TEMP_DIRS.lock() {
        d.push(dir.to_path_buf());
    }
}

/// Starts the backstop thread: at the first stop signal, after `grace` (for the
/// command's own orderly stop) or at once on a second signal, it releases the
/// process's own mounts and exits with 128 + the signal.
pub fn exit_on_signal(grace: Duration) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("stop-signal".into())
        .spawn(move || {
            let sig = loop {
                if let Some(s) = received() {
                    break s;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let (at, seen) = (Instant::now(), COUNT.load(Ordering::SeqCst));
            while at.elapsed() < grace && COUNT.load(Ordering::SeqCst) == seen {
                std::thread::sleep(Duration::from_millis(20));
            }
            RELEASING.store(true, Ordering::SeqCst);
            release_own_mounts();
            std::process::exit(128 + sig);
        })
        .map(|_| ())
}

/// Called by `main` before it exits: when the backstop thread is releasing the mounts,
/// the process ends there (an exit from here would race it, and could come before
/// the mounts were released).
pub fn settle() {
    if RELEASING.load(Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
}

/// The FUSE mounts in this namespace's mount table at one of `paths`: (device, path).
fn mounted(paths: &[PathBuf]) -> Vec<(libc::dev_t, PathBuf)> {
    strata_fs::mount::mount_table()
        .into_iter()
        .filter(|m| m.is_fuse() && paths.contains(&m.at))
        .map(|m| (libc::makedev(m.major, m.minor), m.at))
        .collect()
}

/// Detaches the process's own mounts, closes its files on them (their server still
/// answers the closes), aborts their connections (whatever is left then fails at once
/// rather than waiting on this exiting process) and removes the registered temp dirs.
/// Bounded: should a close not be answered, the connections are aborted after 5 s and
/// the process exits.
fn release_own_mounts() {
    let paths = OWN_MOUNTS.lock().map(|m| m.clone()).unwrap_or_default();
    let mounts = mounted(&paths);
    let devs: Vec<libc::dev_t> = mounts.iter().map(|(d, _)| *d).collect();
    let code = 128 + received().unwrap_or(libc::SIGTERM);
    let watchdog_devs = devs.clone();
    let _ = std::thread::Builder::new()
        .name("stop-watchdog".into())
        .spawn(move || {
            std::thread::sleep(Duration::from_secs(5));
            abort(&watchdog_devs);
            std::process::exit(code);
        });
    let mut all_detached = true;
    for (_, at) in &mounts {
        all_detached &= detach(at);
    }
    close_files_on(&devs);
    abort(&devs);
    if all_detached {
        for d in TEMP_DIRS.lock().map(|d| d.clone()).unwrap_or_default() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Lazily unmounts `at`: new lookups no longer reach the mount, open files keep it.
fn detach(at: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if let Ok(c) = std::ffi::CString::new(at.as_os_str().as_bytes()) {
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return true;
        }
    }
    // Not root: the setuid helper unmounts the user's own FUSE mounts.
    std::process::Command::new("fusermount3")
        .arg("-uz")
        .arg(at)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Points every descriptor of this process on one of `devs` at /dev/null: the file is
/// closed now, while its server answers, not by the exit. dup2, not close: a thread
/// still using the number reads /dev/null, never a file opened after.
fn close_files_on(devs: &[libc::dev_t]) {
    use std::os::fd::AsRawFd;
    if devs.is_empty() {
        return;
    }
    let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    else {
        return;
    };
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        if fd == null.as_raw_fd() {
            continue;
        }
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat writes into `st`; a closed or foreign fd just fails.
        if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
            continue;
        }
        // SAFETY: fstat succeeded, so `st` is initialised.
        let dev = unsafe { st.assume_init() }.st_dev;
        if devs.contains(&dev) {
            // SAFETY: replaces descriptor `fd` (one of ours, on our mount) atomically.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// Aborts the FUSE connections of `devs` through fusectl (root only; best effort).
fn abort(devs: &[libc::dev_t]) {
    for dev in devs {
        let _ = std::fs::write(
            format!("/sys/fs/fuse/connections/{}/abort", libc::minor(*dev)),
            "1",
        );
    }
}
