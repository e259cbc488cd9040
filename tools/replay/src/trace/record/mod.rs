//! `strata trace record`: runs a command under `strace` and turns the reads it made of
//! regular files under a root into a trace. [`parse`] is the pure part (fd, offset,
//! process and job tracking, unit-tested on hand-written strace lines); this module
//! runs strace and reads its log.

pub mod parse;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};

pub use parse::{parse_strace, parse_strace_inheriting, FsLookup, InheritedFd, Lookup, ParseStats};

use super::Trace;

/// The system calls strace is asked to report: everything the parser follows.
pub const SYSCALLS: &str = "open,openat,openat2,creat,close,close_range,dup,dup2,dup3,fcntl,\
read,readv,write,writev,pwritev2,pread64,preadv,preadv2,lseek,sendfile,sendfile64,copy_file_range,\
splice,mmap,io_uring_setup,io_setup,clone,clone3,fork,vfork,execve,execveat,unshare,chdir,fchdir,\
setpgid,setsid,pipe,pipe2,socket,socketpair,accept,accept4,sendmsg,recvmsg,recvmmsg,eventfd2,\
epoll_create1,memfd_create,timerfd_create,signalfd4,inotify_init1,pidfd_open";

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(
        "`strace` is not installed (or not on PATH): install it (`apt-get install strace`, \
         or scripts/install-deps.sh) to record traces"
    )]
    StraceMissing,
    #[error("no command to record (usage: strata trace record --out T.csv -- CMD ARGS...)")]
    NoCommand,
    #[error("root {root}: {err}")]
    Root { root: PathBuf, err: std::io::Error },
    /// The I/O error is in the message only (as a `source` too, a chain printed it twice).
    #[error("running strace: {0}")]
    Io(std::io::Error),
    #[error(
        "strace exited with {status} before tracing anything (it cannot run the command, \
         or ptrace is not permitted here: see its message above)"
    )]
    StraceFailed { status: String },
}

impl From<std::io::Error> for RecordError {
    fn from(e: std::io::Error) -> Self {
        RecordError::Io(e)
    }
}

/// What a recording produced.
pub struct Recorded {
    pub trace: Trace,
    pub stats: ParseStats,
    /// The command's exit code (`None`: killed by a signal, see `signal`).
    pub exit_code: Option<i32>,
    /// The signal that killed the command, if one did.
    pub signal: Option<i32>,
    /// The command's exit status in words.
    pub status: String,
    /// The root the paths are relative to (its real path).
    pub root: PathBuf,
}

impl Recorded {
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0)
    }

    /// The exit status a shell would give for the command: its exit code, or 128 + N
    /// when signal N killed it.
    pub fn shell_status(&self) -> u8 {
        match (self.exit_code, self.signal) {
            (Some(c), _) => (c & 0xff) as u8,
            (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
            (None, None) => 1,
        }
    }
}

/// SIGINT noted and SIGQUIT ignored by this process while it lives, SIGTERM and SIGHUP caught
/// (noted in [`STOP_SIGNALS`] for [`wait_forwarding`]); the previous handling restored
/// when dropped.
struct RecorderSignals {
    /// SIGINT's and SIGQUIT's previous handling, once [`Self::ignore_interrupts`] ran.
    interrupts: Option<(libc::sighandler_t, libc::sighandler_t)>,
    term: libc::sigaction,
    hup: libc::sigaction,
}

/// Bit N set: signal N (SIGTERM or SIGHUP, passed on to the command; SIGINT, noted)
/// reached the recorder.
static STOP_SIGNALS: AtomicU64 = AtomicU64::new(0);

extern "C" fn note_stop_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP_SIGNALS.fetch_or(1 << sig, Ordering::SeqCst);
}

impl RecorderSignals {
    /// Catches SIGTERM and SIGHUP. Safe before spawning strace: exec resets a caught
    /// signal to its default, and one that arrives before the spawn is passed on after.
    fn new() -> Self {
        STOP_SIGNALS.store(0, Ordering::SeqCst);
        // SAFETY: plain libc calls setting signal dispositions; the handler installed
        // only stores to an atomic.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = note_stop_signal as extern "C" fn(libc::c_int) as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            let mut term: libc::sigaction = std::mem::zeroed();
            let mut hup: libc::sigaction = std::mem::zeroed();
            for (sig, old) in [(libc::SIGTERM, &mut term), (libc::SIGHUP, &mut hup)] {
                libc::sigaction(sig, &act, old);
                // Ignored by whoever started us (`nohup`): it stays ignored, for the
                // command too.
                if old.sa_sigaction == libc::SIG_IGN {
                    libc::sigaction(sig, old, std::ptr::null_mut());
                }
            }
            RecorderSignals {
                interrupts: None,
                term,
                hup,
            }
        }
    }

    /// Ignores SIGQUIT and notes SIGINT (for [`wait_forwarding`]) instead of dying of
    /// it: only after the spawn, as an ignored signal stays ignored across exec and the
    /// command must keep the default.
    fn ignore_interrupts(&mut self) {
        // SAFETY: plain libc calls setting signal dispositions; the handler only
        // stores to an atomic.
        unsafe {
            self.interrupts = Some((
                libc::signal(
                    libc::SIGINT,
                    note_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
                ),
                libc::signal(libc::SIGQUIT, libc::SIG_IGN),
            ));
        }
    }
}

impl Drop for RecorderSignals {
    fn drop(&mut self) {
        // SAFETY: restores the dispositions `signal`/`sigaction` returned for these
        // signals.
        unsafe {
            if let Some((int, quit)) = self.interrupts {
                libc::signal(libc::SIGINT, int);
                libc::signal(libc::SIGQUIT, quit);
            }
            libc::sigaction(libc::SIGTERM, &self.term, std::ptr::null_mut());
            libc::sigaction(libc::SIGHUP, &self.hup, std::ptr::null_mut());
        }
    }
}

/// How long the recorder keeps tracing what the command left running in the
/// background once the command itself has exited: 2 s, for children that are about
/// to end (a pipeline's last stage, a flush); a daemon it started is not waited for,
/// and Ctrl-C ends the wait at once.
const BACKGROUND_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Longest wait for strace to write out its log and exit once nothing it traced is
/// left: 30 s, far past what a loaded machine takes.
const STRACE_FINISH_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// How strace's wait ended.
enum Waited {
    /// strace exited (after the command and every process it traced).
    Exited(ExitStatus),
    /// The command exited but processes it started in the background were still
    /// running after [`BACKGROUND_GRACE`]: strace was stopped (they go on, untraced).
    LeftBackground,
}

/// Waits for strace to end, passing each SIGTERM/SIGHUP the recorder gets on to the
/// command's processes. strace started with `-o FILE CMD` blocks those signals itself
/// (and killed, it would detach and leave the command running): the command must end
/// so that strace ends with it and the trace of what was read is kept.
///
/// strace ends only when every process it traces has, so a command that leaves a
/// background process behind (`sh -c 'server & ...'`) held the recorder for as long
/// as that ran, and Ctrl-C could not end it (black-box finding). Once the command
/// itself is gone, the rest get [`BACKGROUND_GRACE`], then strace is stopped.
fn wait_forwarding(child: &mut Child) -> std::io::Result<Waited> {
    let strace = child.id();
    let mut command: Option<i32> = None;
    let mut gone_since: Option<std::time::Instant> = None;
    // Ctrl-C reaches the command from the terminal; the recorder only notes it, to end
    // its wait for background processes once the command is gone.
    let mut interrupted = false;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Waited::Exited(status));
        }
        if command.is_none() {
            command = children_of(strace).into_iter().min();
        }
        let pending = STOP_SIGNALS.swap(0, Ordering::SeqCst);
        interrupted |= pending & (1 << libc::SIGINT) != 0;
        if let Some(cmd) = command {
            if !std::path::Path::new(&format!("/proc/{cmd}")).exists() {
                let since = *gone_since.get_or_insert_with(std::time::Instant::now);
                // Past the grace only while something strace traces is still there: a
                // strace that is only finishing its log (a loaded machine) is waited
                // for, its own bound aside (a CI run's recording came back "unknown
                // (strace was stopped)" after 2 s with no process left to trace).
                let waited = since.elapsed();
                let background = waited >= BACKGROUND_GRACE
                    && (waited >= STRACE_FINISH_MAX || !traced_by(strace).is_empty());
                if interrupted || background {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Ok(Waited::LeftBackground);
                }
            }
        }
        for sig in [libc::SIGTERM, libc::SIGHUP] {
            if pending & (1 << sig) != 0 {
                for pid in traced_by(strace) {
                    // SAFETY: kill(2) on a process strace traces (or its direct child).
                    unsafe { libc::kill(pid, sig) };
                }
            }
        }
        // Until the command is seen, look often: a command that starts a background
        // process and exits within one look would never be seen gone.
        let pause = if command.is_none() { 1 } else { 20 };
        std::thread::sleep(std::time::Duration::from_millis(pause));
    }
}

/// The direct children of `parent` (from /proc).
fn children_of(parent: u32) -> Vec<i32> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")) else {
        return Vec::new();
    };
    text.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The processes `tracer` traces or started: the command and everything it forked
/// (with `-f`, including those that outlived their parent), found in /proc.
fn traced_by(tracer: u32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let tracer = tracer.to_string();
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        if field("TracerPid:") == Some(tracer.as_str()) || field("PPid:") == Some(tracer.as_str()) {
            out.push(pid);
        }
    }
    out
}

/// Runs `cmd` under strace in the current directory and parses what it read under
/// `root`. `keep_log`: where to leave strace's own output (else a temporary file that is
/// removed). A failing command still yields its trace (see [`Recorded::exit_code`]).
pub fn record(
    root: &Path,
    cmd: &[OsString],
    keep_log: Option<&Path>,
) -> Result<Recorded, RecordError> {
    if cmd.is_empty() {
        return Err(RecordError::NoCommand);
    }
    let root = std::fs::canonicalize(root).map_err(|err| RecordError::Root {
        root: root.to_path_buf(),
        err,
    })?;
    let cwd = std::env::current_dir()?;
    let temp;
    let log: &Path = match keep_log {
        Some(p) => p,
        None => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            temp = std::env::temp_dir().join(format!(
                "strata-record-{}-{nanos}.strace",
                std::process::id()
            ));
            &temp
        }
    };
    remove_stale_logs();
    let inherited = inherited_files();
    let mut signals = RecorderSignals::new();
    // `-q`, not `-qq`: the exit of each process is printed (`+++ exited with 0 +++`),
    // so a pid the kernel hands out again is known to be another process. `-s 8`, not
    // `-s 0`: strings are cut at 8 bytes, and arrays at 8 elements rather than printed
    // `[...]`, which hid the descriptors of `pipe2`, `socketpair` and `SCM_RIGHTS`.
    let mut strace = Command::new("strace");
    strace
        .args(["-f", "-q", "-ttt", "-r", "-s", "8", "--seccomp-bpf", "-e"])
        .arg(format!("trace={SYSCALLS}"))
        .arg("-o")
        .arg(log)
        .arg("--")
        .args(cmd);
    // strace stops when the recorder dies, even by SIGKILL (an OOM kill, a CI timeout):
    // else it went on tracing the command and growing its log for good (black-box
    // finding). Its tracees are then detached and run on.
    // SAFETY: prctl in the child between fork and exec, async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        strace.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = strace.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => RecordError::StraceMissing,
        _ => RecordError::Io(e),
    })?;
    // Ctrl-C is for the command (as `system()` and `time` do): the recorder waits for it
    // to end and keeps the trace of what it read until then. SIGTERM and SIGHUP (from
    // `timeout`, a scheduler, a closed session) are passed on to stop it the same way.
    signals.ignore_interrupts();
    let waited = wait_forwarding(&mut child);
    let text = std::fs::read(log);
    if keep_log.is_none() {
        let _ = std::fs::remove_file(log);
    }
    // Restored only once the temporary log is gone, so that no stop signal leaves it.
    drop(signals);
    let (status, left_background) = match waited? {
        Waited::Exited(status) => (Some(status), false),
        Waited::LeftBackground => (None, true),
    };
    let text = match text {
        Ok(t) if !t.is_empty() => t,
        _ if !status.is_some_and(|s| s.success()) => {
            return Err(RecordError::StraceFailed {
                status: status.map_or("a signal".into(), |s| s.to_string()),
            })
        }
        Ok(t) => t,
        Err(e) => return Err(RecordError::Io(e)),
    };
    let text = String::from_utf8_lossy(&text);
    let (trace, mut stats) = parse_strace_inheriting(&text, &root, &cwd, &inherited, &mut FsLookup);
    stats.left_background = left_background;
    let (exit_code, signal, status) = match status {
        Some(s) => (
            s.code(),
            std::os::unix::process::ExitStatusExt::signal(&s),
            s.to_string(),
        ),
        // strace was stopped: the command's own end, as it logged it.
        None => top_exit(&text),
    };
    Ok(Recorded {
        trace,
        stats,
        exit_code,
        signal,
        status,
        root,
    })
}

/// The first traced process's exit as strace logged it (`+++ exited with 3 +++`,
/// `+++ killed by SIGKILL +++`): (code, signal, in words).
fn top_exit(log: &str) -> (Option<i32>, Option<i32>, String) {
    let top = log.split_whitespace().next().unwrap_or("");
    for line in log.lines() {
        let mut parts = line.split_whitespace();
        if parts.next() != Some(top) {
            continue;
        }
        let Some(i) = line.find("+++ ") else { continue };
        let note = line[i + 4..].trim_end_matches(" +++").trim();
        if let Some(code) = note
            .strip_prefix("exited with ")
            .and_then(|c| c.parse().ok())
        {
            return (Some(code), None, format!("exit status: {code}"));
        }
        if let Some(sig) = note.strip_prefix("killed by ") {
            let name = sig.split_whitespace().next().unwrap_or(sig);
            let num = signal_number(name);
            return (None, num, format!("killed by {name}"));
        }
    }
    (None, None, "unknown (strace was stopped)".into())
}

fn signal_number(name: &str) -> Option<i32> {
    Some(match name {
        "SIGHUP" => libc::SIGHUP,
        "SIGINT" => libc::SIGINT,
        "SIGQUIT" => libc::SIGQUIT,
        "SIGABRT" => libc::SIGABRT,
        "SIGKILL" => libc::SIGKILL,
        "SIGSEGV" => libc::SIGSEGV,
        "SIGPIPE" => libc::SIGPIPE,
        "SIGTERM" => libc::SIGTERM,
        "SIGBUS" => libc::SIGBUS,
        _ => return None,
    })
}

/// Removes temporary strace logs left by recorders that were killed (SIGKILL leaves
/// no chance to clean up): `strata-record-<pid>-*.strace` of a pid no longer running.
fn remove_stale_logs() {
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix("strata-record-"))
            .filter(|n| n.ends_with(".strace"))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next() else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The regular files this process holds open without close-on-exec (what the command
/// inherits: stdin redirected from a file, an fd a parent shell passed), with their
/// offsets now.
fn inherited_files() -> Vec<InheritedFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: F_GETFD and lseek(SEEK_CUR) on a descriptor number only read its state.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 || flags & libc::FD_CLOEXEC != 0 {
            continue;
        }
        let Ok(path) = std::fs::read_link(e.path()) else {
            continue;
        };
        if !path.is_absolute() || !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        // SAFETY: as above.
        let offset = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
        if let Ok(offset) = u64::try_from(offset) {
            out.push((fd, path, offset));
        }
    }
    out
}
