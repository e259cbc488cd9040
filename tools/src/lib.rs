//! Library behind the `strata` binary: each subcommand's logic, so tests can call it
//! without spawning the binary. The replay simulator and trace tooling are the
//! `strata-replay` crate (`tools/replay/`); `bench replay` and `trace` here are its CLI.

/// `println!` for a command's output, failing the command (`?` in a function returning
/// `anyhow::Result`) when stdout cannot be written instead of panicking: `strata stats >
/// /dev/full` ended "panicked at ... failed printing to stdout", exit 101 (black-box
/// finding). A closed pipe is SIGPIPE's (main.rs) for short commands.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
            .map_err(|e| anyhow::anyhow!("writing to stdout: {e}"))?
    }};
}

/// `print!` as [`outln!`] does `println!`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut o = std::io::stdout().lock();
        write!(o, $($arg)*)
            .and_then(|()| o.flush())
            .map_err(|e| anyhow::anyhow!("writing to stdout: {e}"))?
    }};
}

pub mod admin;
pub mod bench;
pub mod cli;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod signals;

/// Logs to stderr at `RUST_LOG`'s filter, or `default` (e.g. `"info"`) when unset; a
/// second call (tests, a bench inside a process that already logs) is a no-op. Lines
/// that cannot be written (a full disk) are lost, never fatal.
///
/// Lines go to stderr from a thread of their own, through a queue of
/// [`LOG_QUEUE_LINES`] that drops lines when full: written from the threads serving
/// requests, a stderr pipe nobody read (a supervisor's, `Popen(stderr=PIPE)`) blocked
/// the FUSE thread logging once it filled, and every request behind it hung (black-box
/// finding). Keep the guard for the process's life: dropped, it writes out what is
/// queued (waiting at most a second) and logging stops.
/// A regular file (the cache dir's `mount.log`) is written directly: a write to it
/// never waits on a reader, and its lines are in the file when the line after them is
/// acted on (a test reading the log once the mount is up).
#[must_use = "logging stops when the guard is dropped"]
pub fn init_logging(default: &str) -> LogGuard {
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    let (writer, guard) = if stderr_is_a_file() {
        (BoxMakeWriter::new(CappedLines(std::io::stderr)), None)
    } else {
        let (w, g) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .buffered_lines_limit(LOG_QUEUE_LINES)
            .lossy(true)
            .thread_name("strata-log")
            .finish(std::io::stderr());
        (BoxMakeWriter::new(CappedLines(w)), Some(g))
    };
    let set = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(writer)
        // Colours only on a terminal: a log file (`mount.log`, journald) got escape
        // codes in every line (black-box observation).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A failed write of a log line is dropped: reported, it would go through
        // eprintln!, which panics when stderr is a log file on a full disk (the cache
        // dir's `mount.log`), and the daemon must not die of its log.
        .log_internal_errors(false)
        .try_init();
    LogGuard {
        _worker: guard.filter(|_| set.is_ok()),
    }
}

/// Whether fd 2 is a regular file.
fn stderr_is_a_file() -> bool {
    use std::os::fd::AsFd;
    std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata())
        .is_ok_and(|m| m.file_type().is_file())
}

/// Lines the log queue holds before it drops (about 2 MB of typical lines, 20 MiB at
/// most with [`LOG_LINE_MAX`]): a burst of errors is kept whole, a stalled reader costs
/// bounded memory.
pub const LOG_QUEUE_LINES: usize = 10_000;

/// Longest log line written: 2 KiB (typical lines are 100-300 bytes). A line holding a
/// store's 200 KB error page made the queue's 10,000 lines 2 GB: with a stalled stderr
/// pipe the daemon grew 4 MB/s until the OOM killer took it, and with a file the log
/// grew ~50 MB a minute (black-box finding, round 25c). Longer lines are cut, saying so.
pub const LOG_LINE_MAX: usize = 2048;

/// A log writer whose every line is at most [`LOG_LINE_MAX`] bytes.
struct CappedLines<M>(M);

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for CappedLines<M>
{
    type Writer = CappedLine<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        CappedLine(self.0.make_writer())
    }
}

/// One event's writer of [`CappedLines`]: the formatter writes an event (one line) in
/// one `write_all`, so each `write` here is cut on its own.
struct CappedLine<W>(W);

impl<W: std::io::Write> std::io::Write for CappedLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() <= LOG_LINE_MAX {
            return self.0.write(buf);
        }
        // Room for the note; cut at a character's start.
        let mut cut = LOG_LINE_MAX - 48;
        while cut > 0 && buf[cut] & 0xC0 == 0x80 {
            cut -= 1;
        }
        let mut line = buf[..cut].to_vec();
        line.extend_from_slice(format!(" ... [{} bytes cut]\n", buf.len() - cut).as_bytes());
        self.0.write_all(&line)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Keeps the log writer thread of [`init_logging`] running; dropping it flushes, for
/// three seconds at most.
pub struct LogGuard {
    _worker: Option<tracing_appender::non_blocking::WorkerGuard>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        // tracing-appender's guard waits a second for its writer, then prints that it
        // gave up with println!, which blocks on a terminal nobody reads (black-box
        // finding: stopped by SIGTERM, the daemon never exited). Dropped on a thread of
        // its own; the process goes on after three seconds whatever it does.
        let Some(worker) = self._worker.take() else {
            return;
        };
        let (done, wait) = std::sync::mpsc::channel();
        let dropped = std::thread::Builder::new()
            .name("strata-log-flush".into())
            .spawn(move || {
                drop(worker);
                let _ = done.send(());
            });
        if dropped.is_ok() {
            let _ = wait.recv_timeout(std::time::Duration::from_secs(3));
        }
    }
}

#[cfg(test)]
mod log_tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn log_lines_past_the_bound_are_cut_and_say_so() {
        let mut out = CappedLine(Vec::new());
        out.write_all(b"short line\n").expect("write");
        let long = format!("ERROR {}\n", "é".repeat(100_000));
        out.write_all(long.as_bytes()).expect("write");
        let text = String::from_utf8(out.0).expect("still UTF-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "short line");
        assert!(lines[1].len() < LOG_LINE_MAX, "{}", lines[1].len());
        assert!(lines[1].starts_with("ERROR é"));
        assert!(
            lines[1].ends_with("bytes cut]"),
            "{}",
            &lines[1][lines[1].len() - 40..]
        );
        assert_eq!(lines.len(), 2);
    }
}
