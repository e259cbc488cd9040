//! The `strata` binary: parses arguments and calls into the `strata_tools` library.

use clap::Parser;
use strata_tools::cli::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if !is_daemon(&cli.command) {
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
    if let Err(e) = &r {
        // As `fn main() -> anyhow::Result` prints it: the message and its causes.
        eprintln!("Error: {e:?}");
    }
    std::process::ExitCode::from(strata_tools::cli::exit_status(&r))
}

/// Commands that run until stopped and serve others (they must outlive a closed pipe).
fn is_daemon(c: &Command) -> bool {
    matches!(c, Command::Serve(_) | Command::Mount(_) | Command::Demo(_))
}
