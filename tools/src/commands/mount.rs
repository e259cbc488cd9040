//! `strata mount SOURCE MOUNTPOINT`: mount a bucket/prefix (or a local directory) as a
//! directory through the cache (read-only unless `--allow-writes`).
//!
//! Without `--foreground` the command re-executes itself in the foreground as a
//! detached child (new session, output to `<cache dir>/mount.log`, or without a cache
//! dir to this command until the mount appears and /dev/null after), waits until the
//! mount shows up in the mount table (or prints the child's error), and exits: a fork
//! after the tokio
//! runtime exists would be unsafe, a re-exec is not. The foreground process is the
//! daemon (`crate::daemon::run`, as `strata serve` runs it) with this one mount, built
//! from the same `MountConfig` as a `[[mounts]]` entry, and no KV service: it unmounts
//! cleanly on SIGINT/SIGTERM, and exits when the mount is removed from outside
//! (`fusermount3 -u`/`umount`). After a crash its mount fails with ENOTCONN until the
//! next `strata mount` there replaces it (`--auto-unmount` unmounts instead).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

use crate::config::{AdminConfig, CacheConfig, KvConfig, MountConfig, StoreConfig, StrataConfig};

#[derive(Debug, Args)]
pub struct MountArgs {
    /// Store URL: file:///data, s3://bucket/prefix, gs://..., az://...
    pub source: String,
    /// The mount: MOUNTPOINT and the options `[[mounts]]` in strata.toml takes, with
    /// the same defaults.
    #[command(flatten)]
    pub mount: MountConfig,
    /// Cache directory (disk tier, passthrough copies); default: a temp dir.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Memory tier budget (`[cache] memory`).
    #[arg(long, default_value_t = CacheConfig::default().memory)]
    pub memory_cache: String,
    /// Disk tier budget ("0" disables it; `[cache] disk`).
    #[arg(long, default_value_t = CacheConfig::default().disk)]
    pub disk_cache: String,
    /// Admin API address for `strata stats` (e.g. 127.0.0.1:7072); default: none, so
    /// several mounts and a `strata serve` can run side by side.
    #[arg(long)]
    pub admin: Option<String>,
    /// Stay in the foreground (logs to stderr).
    #[arg(long)]
    pub foreground: bool,
    /// Set by the starting command on the detached daemon: stderr is its pipe until
    /// the daemon is ready (see `daemonize`).
    #[arg(long, hide = true)]
    pub stderr_until_mounted: bool,
    /// Set by the starting command on the detached daemon: stdout is its pipe until
    /// the daemon is ready, and the daemon stops with the starting command until then
    /// (see `daemonize`).
    #[arg(long, hide = true)]
    pub stdout_until_ready: bool,
    /// S3-compatible endpoint (e.g. http://127.0.0.1:9000).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Allow a plain-HTTP endpoint.
    #[arg(long)]
    pub allow_http: bool,
    /// file:// stores: follow symlinks that lead out of the store's root
    /// (`[store] follow_symlinks`; off: such entries are invisible and nothing is
    /// written, renamed or deleted through them).
    #[arg(long)]
    pub follow_symlinks: bool,
    #[arg(long)]
    pub region: Option<String>,
    /// Access key (default: AWS_ACCESS_KEY_ID from the environment).
    #[arg(long)]
    pub access_key_id: Option<String>,
    /// Deprecated: a secret on the command line is visible to every local user in
    /// `ps`. Use AWS_SECRET_ACCESS_KEY in the environment or --secret-access-key-file.
    #[arg(long)]
    pub secret_access_key: Option<String>,
    /// File holding the secret key (default: AWS_SECRET_ACCESS_KEY from the
    /// environment).
    #[arg(long)]
    pub secret_access_key_file: Option<PathBuf>,
}

/// Printed when the secret is given on the command line.
const SECRET_FLAG_WARNING: &str = "warning: --secret-access-key is deprecated: the secret \
     is visible to every local user in `ps`; set AWS_SECRET_ACCESS_KEY in the environment \
     or use --secret-access-key-file";

/// `argv` without `--secret-access-key` and its value, and the secret it held: the
/// re-executed daemon gets it through its environment, not its command line.
fn scrub_secret(
    argv: Vec<std::ffi::OsString>,
) -> (Vec<std::ffi::OsString>, Option<std::ffi::OsString>) {
    const FLAG: &str = "--secret-access-key";
    let mut out = Vec::with_capacity(argv.len());
    let mut secret = None;
    let mut args = argv.into_iter();
    while let Some(a) = args.next() {
        match a.to_str() {
            Some(FLAG) => secret = args.next(),
            Some(s) if s.starts_with("--secret-access-key=") => {
                secret = Some(s[FLAG.len() + 1..].into());
            }
            _ => out.push(a),
        }
    }
    (out, secret)
}

impl MountArgs {
    /// The daemon configuration these flags describe: the store, the cache, this one
    /// mount, no KV service.
    pub fn to_config(&self) -> StrataConfig {
        StrataConfig {
            store: StoreConfig {
                url: Some(self.source.clone()),
                endpoint: self.endpoint.clone(),
                region: self.region.clone(),
                access_key_id: self.access_key_id.clone(),
                secret_access_key: self.secret_access_key.clone(),
                secret_access_key_file: self.secret_access_key_file.clone(),
                allow_http: self.allow_http,
                follow_symlinks: self.follow_symlinks,
                ..StoreConfig::default()
            },
            cache: CacheConfig {
                dir: self.cache_dir.clone(),
                memory: self.memory_cache.clone(),
                disk: self.disk_cache.clone(),
                ..Default::default()
            },
            kv: KvConfig {
                enabled: false,
                ..Default::default()
            },
            admin: AdminConfig {
                listen: self.admin.clone(),
                ..Default::default()
            },
            mounts: vec![self.mount.clone()],
            // `strata mount` is a single node; a group member runs `strata serve`.
            cluster: None,
        }
    }
}

pub fn run(args: MountArgs) -> anyhow::Result<()> {
    // A dead daemon's mount (ENOTCONN) is replaced by the new one (strata_fs::mount).
    // Asked first: a stat of it fails once the kernel's cached attributes expired, and
    // it was then refused as "not a directory" (test: an upload a kill cut off).
    let dead = strata_fs::mount::dead_mount_or_refuse_stuck(&args.mount.mountpoint)?;
    if !dead && std::fs::symlink_metadata(&args.mount.mountpoint).is_err() {
        bail!(
            "mountpoint {} does not exist (create it first: mkdir -p {0})",
            args.mount.mountpoint.display()
        );
    }
    if !dead && !args.mount.mountpoint.is_dir() {
        bail!(
            "mountpoint {} is not a directory",
            args.mount.mountpoint.display()
        );
    }
    if args.secret_access_key.is_some() {
        eprintln!("{SECRET_FLAG_WARNING}");
    }
    if is_mounted(&args.mount.mountpoint) && !dead {
        bail!(
            "{} is already a FUSE mount point (unmount it first: fusermount3 -u {0})",
            args.mount.mountpoint.display()
        );
    }
    // Before the cache dir and its log are made (black-box finding: a refused cache
    // dir inside the store or the mountpoint was created first, and stayed there).
    crate::daemon::mount::refuse_self_references(&args.to_config())?;
    crate::daemon::mount::refuse_cache_dir_on_a_strata_mount(args.cache_dir.as_deref())?;
    if !args.foreground {
        // The daemon logs it too, where the detached one's log is not seen.
        let hidden = strata_fs::mount::hidden_entries(&args.mount.mountpoint);
        if hidden > 0 {
            eprintln!(
                "warning: {} is not empty: its {hidden} entries are hidden while it is mounted",
                args.mount.mountpoint.display()
            );
        }
        return daemonize(&args);
    }
    if args.stderr_until_mounted {
        crate::daemon::release_stderr_when_ready();
    }
    if args.stdout_until_ready {
        crate::daemon::release_stdout_when_ready();
    }
    crate::daemon::run_until_signal(args.to_config())
}

/// What `path` holds from byte `start` on (nothing if it cannot be read).
fn read_from(path: &Path, start: u64) -> Vec<u8> {
    use std::io::{Read as _, Seek as _};
    let mut out = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(std::io::SeekFrom::Start(start)).is_ok() {
            let _ = f.read_to_end(&mut out);
        }
    }
    out
}

/// The lines of a daemon's start log that warn or report an error (tracing's level
/// field, written without colours to a pipe).
fn start_warnings(log: &str) -> impl Iterator<Item = &str> {
    log.lines().filter(|line| {
        line.split_whitespace()
            .take(3)
            .any(|word| word == "WARN" || word == "ERROR")
    })
}

/// Re-executes this command with `--foreground` in a new session and waits until the
/// mount appears (or the child fails, then its error is this command's).
///
/// The child's stderr: `<cache dir>/mount.log` with a cache dir, whose tail is shown
/// when the child fails; otherwise a pipe this command reads until the child is ready,
/// when it (told by `--stderr-until-mounted`) points its stderr at /dev/null and so
/// closes the pipe; the start's warnings are then printed. The handover is ordered: this command leaves only after the
/// child let go of the pipe, so the daemon never writes into a pipe nobody reads.
fn daemonize(args: &MountArgs) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    // Ctrl-C (or SIGTERM, SIGHUP) while the daemon starts cancels the start: the daemon
    // is in a session of its own, which the terminal's SIGINT never reaches (black-box
    // finding: it mounted 10 s after a Ctrl-C, and the command said "mounted").
    // Ignored when this command started (`nohup`, a script's background job): ignored
    // in the daemon too, which keeps them so (catching them here reset them to their
    // default for it; black-box finding: `nohup strata mount ...`'s daemon stopped on
    // SIGHUP).
    let keep_ignored: Vec<libc::c_int> = [libc::SIGHUP, libc::SIGINT]
        .into_iter()
        .filter(|&s| crate::daemon::ignored(s))
        .collect();
    crate::signals::catch().context("catching stop signals")?;
    let exe = std::env::current_exe().context("locating the strata binary")?;
    let (mut argv, secret) = scrub_secret(std::env::args_os().skip(1).collect());
    argv.push("--foreground".into());
    let mut log_file = None;
    let mut log_start = 0u64;
    let mut pipe = None;
    let log: std::process::Stdio = match &args.cache_dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .with_context(|| format!("creating the cache dir {}", d.display()))?;
            let path = d.join("mount.log");
            // Appended to, and emptied only when no daemon holds the dir: a start that
            // will be refused must not wipe the running daemon's log (black-box
            // finding: its whole log went, and its next line landed after a run of
            // NULs at its old offset). O_APPEND keeps both writers' lines whole.
            // Never through a link, and only a file of this user's with no other name:
            // the dir may be another user's, who could point `mount.log` at any file
            // root can write (black-box finding: root's refused start truncated and
            // wrote its error into the link's target).
            use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
            // The last run's log is kept beside it (`mount.log.1`): emptied, the log of
            // a daemon that crashed, the reason among its last lines, went with the
            // restart that follows (black-box finding).
            if crate::daemon::cache::cache_dir_free(d) {
                rotate_log(&path);
            }
            let opened = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .and_then(|f| {
                    let m = f.metadata()?;
                    // SAFETY: geteuid has no preconditions.
                    let me = unsafe { libc::geteuid() };
                    if !m.file_type().is_file() || m.uid() != me || m.nlink() != 1 {
                        return Err(std::io::Error::other(format!(
                            "it is not a plain file of uid {me} with one name (uid {}, {} names); \
                             remove it, or use a cache dir of your own",
                            m.uid(),
                            m.nlink()
                        )));
                    }
                    Ok(f)
                });
            let f = opened.with_context(|| {
                format!(
                    "cache dir {}: creating the mount's log {}",
                    d.display(),
                    path.display()
                )
            })?;
            // Where this start's lines begin (the file is appended to).
            log_start = f.metadata().map_or(0, |m| m.len());
            log_file = Some(path);
            f.into()
        }
        None => {
            let (reader, writer) = std::io::pipe().context("creating the mount's log pipe")?;
            argv.push("--stderr-until-mounted".into());
            pipe = Some(read_all_in_background(reader));
            writer.into()
        }
    };
    // The daemon says "ready" on its stdout once its mount is up, then lets go of it:
    // the mount at the mountpoint is then this daemon's (black-box finding: of two
    // starts racing at one mountpoint, both said "mounted" when either's mount
    // appeared, and the one whose daemon failed had the other's mount).
    let (ready_reader, ready_writer) =
        std::io::pipe().context("creating the mount's ready pipe")?;
    argv.push("--stdout-until-ready".into());
    let ready = read_lines_in_background(ready_reader);
    let mut cmd = std::process::Command::new(exe);
    if let Some(secret) = secret {
        cmd.env("AWS_SECRET_ACCESS_KEY", secret);
    }
    cmd.args(argv)
        .stdin(std::process::Stdio::null())
        .stdout(ready_writer)
        .stderr(log);
    // SAFETY: signal, setsid, prctl and close_range are async-signal-safe and touch no
    // parent state; they run after the child's stdio is in place.
    unsafe {
        cmd.pre_exec(move || {
            for &sig in &keep_ignored {
                libc::signal(sig, libc::SIG_IGN);
            }
            libc::setsid();
            // Until it is ready the daemon stops with this command: killed (SIGKILL
            // leaves nothing to cancel with), its daemon went on to mount 7 s later
            // (black-box finding). The daemon clears it once ready.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // Descriptors this command inherited without close-on-exec (a pipe its
            // caller waits on for EOF) are not the daemon's to keep (black-box
            // finding). Linux 5.11+; older kernels keep them, as before.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the mount daemon")?;
    // `cmd` holds the pipes' write ends: dropped, the child holds the only ones.
    drop(cmd);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(sig) = crate::signals::received() {
            cancel_start(&mut child, &args.mount.mountpoint);
            return Err(crate::signals::interrupted(
                sig,
                "the mount was cancelled (its daemon stopped, nothing is mounted)",
            ));
        }
        if std::iter::from_fn(|| ready.try_recv().ok()).any(|line| line == "ready") {
            // The start's warnings are the user's to see (black-box findings, round 21:
            // the warning naming a crashed daemon's temp dir, which held fsync'd files
            // never uploaded, reached no one; round 21b: with a cache dir, neither did
            // "the store did not answer" nor "files fsync'd before a crash are still
            // being uploaded"). From the pipe, which the child lets go of at ready; or
            // from this start's lines of mount.log.
            let said = match (pipe, &log_file) {
                (Some(p), _) => p.recv_timeout(Duration::from_secs(5)).unwrap_or_default(),
                (None, Some(path)) => read_from(path, log_start),
                (None, None) => Vec::new(),
            };
            let said = String::from_utf8_lossy(&said);
            let mut err = std::io::stderr().lock();
            for line in start_warnings(&said) {
                use std::io::Write as _;
                let _ = writeln!(err, "{line}");
            }
            drop(err);
            // Best effort: the mount is up whether or not anyone reads this (black-box
            // finding: with its stdout's reader gone the command failed "Broken pipe",
            // its mount and daemon left running).
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stdout().lock(),
                "mounted {} at {} (pid {})",
                args.source,
                args.mount.mountpoint.display(),
                child.id()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let said = match (&pipe, &log_file) {
                (Some(p), _) => p
                    .recv_timeout(Duration::from_secs(5))
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default(),
                (None, Some(path)) => std::fs::read_to_string(path).unwrap_or_default(),
                (None, None) => String::new(),
            };
            bail!(
                "the mount daemon failed ({status}){}",
                last_lines(&said, 20)
                    .map(|l| format!(":\n{l}"))
                    .unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    bail!("mount did not appear within 60 s")
}

/// Stops the daemon `child` of a cancelled start and waits for it: SIGTERM (it stops
/// as `strata mount --foreground` does, unmounting whatever it mounted meanwhile),
/// then, after 30 s, SIGKILL and a detach of the mount it leaves.
fn cancel_start(child: &mut std::process::Child, mountpoint: &Path) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: signalling our own child, not yet reaped (so the pid is still its).
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => break,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                if is_mounted(mountpoint) {
                    // The killed daemon's mount fails every call: take it away.
                    let _ = std::process::Command::new("fusermount3")
                        .arg("-uz")
                        .arg(mountpoint)
                        .status();
                }
                break;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The lines `reader` yields, from a thread, on the returned channel (closed at its end).
fn read_lines_in_background(
    reader: impl std::io::Read + Send + 'static,
) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Keeps the log at `path` (a plain file of one name, not a link) as `path.1`,
/// replacing an older one.
fn rotate_log(path: &Path) {
    let plain = std::fs::symlink_metadata(path).is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.file_type().is_file() && m.nlink() == 1
    });
    if plain {
        let mut kept = path.as_os_str().to_owned();
        kept.push(".1");
        let _ = std::fs::rename(path, kept);
    }
}

/// Everything `reader` yields until its end, from a thread, on the returned channel.
fn read_all_in_background(
    mut reader: impl std::io::Read + Send + 'static,
) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = reader.read_to_end(&mut all);
        let _ = tx.send(all);
    });
    rx
}

/// What a failed daemon said: its error (from the last `Error:` to its backtrace, if
/// RUST_BACKTRACE added one), else its last `n` non-empty lines; None when it said
/// nothing.
fn last_lines(text: &str, n: usize) -> Option<String> {
    let text = match text.rfind("Error: ") {
        Some(at) => text[at..].split("\nStack backtrace:").next().unwrap_or(""),
        None => text,
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    (!lines.is_empty()).then(|| lines[lines.len().saturating_sub(n)..].join("\n"))
}

/// In the detached daemon: once `mountpoint` is mounted, stderr goes to /dev/null, which
/// closes the pipe the starting command reads (see [`daemonize`]).
/// Whether a FUSE file system is mounted at `path` in this namespace (mount-table paths
/// decoded, so a mountpoint with a space in its name is found).
pub fn is_mounted(path: &Path) -> bool {
    strata_fs::mount::fuse_mounted_at(path).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The detached daemon never carries the secret in its command line (`ps`): it
    /// travels in the child's environment.
    #[test]
    fn the_secret_is_scrubbed_from_the_daemon_command_line() {
        let argv = |v: &[&str]| -> Vec<std::ffi::OsString> { v.iter().map(|s| s.into()).collect() };
        let (out, secret) = scrub_secret(argv(&[
            "mount",
            "s3://b/p",
            "/mnt",
            "--secret-access-key",
            "hunter2",
            "--region",
            "us-east-1",
        ]));
        assert_eq!(
            out,
            argv(&["mount", "s3://b/p", "/mnt", "--region", "us-east-1"])
        );
        assert_eq!(secret, Some("hunter2".into()));
        let (out, secret) = scrub_secret(argv(&["mount", "--secret-access-key=a=b", "/mnt"]));
        assert_eq!(out, argv(&["mount", "/mnt"]));
        assert_eq!(secret, Some("a=b".into()));
        let (out, secret) = scrub_secret(argv(&["mount", "--secret-access-key-file", "/s"]));
        assert_eq!(out, argv(&["mount", "--secret-access-key-file", "/s"]));
        assert_eq!(secret, None);
    }

    #[test]
    fn the_secret_file_flag_reaches_the_store_config() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "strata",
            "mount",
            "s3://b/p",
            "/mnt/x",
            "--secret-access-key-file",
            "/run/secrets/s3",
        ])
        .expect("parse");
        let crate::cli::Command::Mount(args) = cli.command else {
            panic!("not a mount");
        };
        let cfg = args.to_config();
        assert_eq!(
            cfg.store.secret_access_key_file.as_deref(),
            Some(Path::new("/run/secrets/s3"))
        );
        assert_eq!(cfg.store.secret_access_key, None);
    }

    /// A failed daemon's error is shown whole, without the backtrace RUST_BACKTRACE
    /// appends (CI sets it), however long that is.
    #[test]
    fn a_failed_daemons_error_is_its_message() {
        let backtrace: String = (0..50).map(|i| format!("  {i}: frame\n")).collect();
        let said = format!(
            "INFO starting\nError: the store refused\n\nCaused by:\n    NoSuchBucket\n\n\
             Stack backtrace:\n{backtrace}"
        );
        assert_eq!(
            last_lines(&said, 20).as_deref(),
            Some("Error: the store refused\nCaused by:\n    NoSuchBucket")
        );
        assert_eq!(last_lines("a\n\nb\nc\n", 2).as_deref(), Some("b\nc"));
        assert_eq!(last_lines("\n \n", 2), None);
    }
}
