//! The `strata` binary: parses arguments and calls into the `strata_tools` library.

use clap::Parser;
use strata_tools::cli::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let daemon = is_daemon(&cli.command);
    if !daemon {
        // Rust ignores SIGPIPE, so `strata stats --watch 1 | head -1` made `println!`
        // panic ("failed printing to stdout: Broken pipe", exit 101) once `head` left.
        // A short-lived command whose reader went away has nothing left to do: die of
        // SIGPIPE quietly, as `cat` does. Daemons (serve, mount, demo) keep ignoring it:
        // a client closing a socket must not kill them.
        // SAFETY: called before any thread is started; SIG_DFL is a valid disposition.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    } else {
        // A file-size limit (`ulimit -f`, which batch schedulers pass on to job scripts)
        // sends SIGXFSZ to a process writing past it, and its default kills: a file
        // written through the mount past the limit took the whole mount down (ENOTCONN
        // for every user), and `strata serve` died sizing its arena (black-box finding).
        // Ignored, the write fails with EFBIG, which that one writer gets.
        // SAFETY: called before any thread is started; SIG_IGN is a valid disposition.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        }
    }
    let r = strata_tools::cli::run(cli);
    // A signal's exit, once begun, is the process's end (it releases the command's own
    // FUSE mounts first): an error this run met meanwhile must not exit before it.
    strata_tools::signals::settle();
    let code = strata_tools::cli::exit_status(&r);
    if let Err(e) = &r {
        // As `fn main() -> anyhow::Result` prints it: the message and its causes.
        let said = format!("Error: {e:?}\n");
        match daemon {
            true => write_bounded(said),
            false => eprint!("{said}"),
        }
    }
    if daemon {
        // A daemon's last words and buffered output go to a terminal or pipe nobody may
        // be reading: written from a thread, given two seconds, then the process ends
        // anyway (black-box finding: stopped by SIGTERM with its stderr a terminal that
        // was not read, the daemon unmounted and then never exited).
        write_bounded(String::new());
        // SAFETY: _exit ends the process at once; everything the daemon owed (its
        // mounts, its files) was settled before `run` returned.
        unsafe { libc::_exit(i32::from(code)) };
    }
    std::process::ExitCode::from(code)
}

/// Writes `text` to stderr and flushes stdout from a thread, waiting at most two
/// seconds for them.
fn write_bounded(text: String) {
    use std::io::Write as _;
    let (done, wait) = std::sync::mpsc::channel();
    let _ = std::thread::Builder::new().spawn(move || {
        let _ = std::io::stderr().write_all(text.as_bytes());
        let _ = std::io::stdout().flush();
        let _ = done.send(());
    });
    let _ = wait.recv_timeout(std::time::Duration::from_secs(2));
}

/// Commands that run until stopped and serve others (they must outlive a closed pipe).
fn is_daemon(c: &Command) -> bool {
    matches!(c, Command::Serve(_) | Command::Mount(_) | Command::Demo(_))
}
