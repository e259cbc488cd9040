//! The real daemon as a child process: `strata serve --config <file>`, its endpoints read
//! from the lines it prints (`kv tcp ADDR`, `kv unix PATH`, `mount PATH`, `admin ADDR`,
//! then `ready`), killed with SIGKILL, its dead FUSE mount detached.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// How to start the daemon.
#[derive(Clone, Debug)]
pub struct DaemonSpec {
    /// The `strata` binary.
    pub binary: PathBuf,
    pub config: PathBuf,
    /// stderr of every run is appended here.
    pub log: PathBuf,
    pub mountpoint: PathBuf,
    /// Extra environment (the store's credentials: never on the command line).
    pub env: Vec<(String, String)>,
    pub ready_timeout: Duration,
}

/// One running daemon; killed on drop if still running (an error path of the bench),
/// so no daemon outlives the run.
pub struct DaemonProc {
    child: KillOnDrop,
    pub kv_tcp: String,
    pub started_in: Duration,
}

impl DaemonProc {
    /// Starts the daemon and waits for `ready` (the ports are new on every start).
    pub fn start(spec: &DaemonSpec) -> anyhow::Result<DaemonProc> {
        let t0 = Instant::now();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .with_context(|| format!("opening {}", spec.log.display()))?;
        let mut child = Command::new(&spec.binary)
            .arg("serve")
            .arg("--config")
            .arg(&spec.config)
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} serve", spec.binary.display()))?;
        let stdout = child.stdout.take().context("daemon stdout")?;
        // A thread reads the lines (and keeps draining after `ready`), so the wait for
        // `ready` can time out.
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    // Nobody listens any more: keep draining so the daemon never blocks.
                    continue;
                }
            }
        });
        let deadline = t0 + spec.ready_timeout;
        let mut kv_tcp = None;
        let mut proc_guard = KillOnDrop(Some(child));
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.trim() == "ready" => break,
                Ok(line) => {
                    if let Some(a) = line.strip_prefix("kv tcp ") {
                        kv_tcp = Some(a.trim().to_string());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "daemon not ready within {:?} (log: {})",
                    spec.ready_timeout,
                    spec.log.display()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = proc_guard.0.as_mut().map(|c| c.wait());
                    bail!(
                        "daemon exited before ready ({status:?}; log: {})",
                        spec.log.display()
                    )
                }
            }
        }
        Ok(DaemonProc {
            child: proc_guard,
            kv_tcp: kv_tcp.context("the daemon printed no `kv tcp` address")?,
            started_in: t0.elapsed(),
        })
    }

    /// `kill -9`, then reaps the process.
    pub fn kill9(mut self) -> anyhow::Result<()> {
        let mut child = self.child.0.take().context("daemon already gone")?;
        child.kill().context("SIGKILL the daemon")?;
        child.wait().context("reaping the daemon")?;
        Ok(())
    }

    /// SIGTERM and a wait for a clean exit (bounded); SIGKILL if it does not come.
    pub fn terminate(mut self, within: Duration) -> anyhow::Result<()> {
        let mut child = self.child.0.take().context("daemon already gone")?;
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("the daemon exited with {status} on SIGTERM");
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        bail!("the daemon did not exit within {within:?} of SIGTERM")
    }
}

/// Kills the child on drop unless it was taken (a daemon that never became ready, or
/// one the bench stopped on an error path).
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Lazily detaches the FUSE mount at `mnt` (a killed daemon leaves it dead: every access
/// fails with ENOTCONN until it is unmounted). Quiet when nothing is mounted there.
pub fn detach_mount(mnt: &Path) {
    for (tool, flags) in [("fusermount3", "-uz"), ("fusermount", "-uz")] {
        let ok = Command::new(tool)
            .arg(flags)
            .arg(mnt)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return;
        }
    }
    // Neither tool (or nothing mounted): as root, detach directly.
    if let Ok(c) = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()) {
        // SAFETY: a valid NUL-terminated path; MNT_DETACH only detaches it.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}
