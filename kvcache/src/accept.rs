//! What bounds the connections a listener holds (hostile-client finding: 20,000 TCP
//! connections that never sent a byte exhausted the daemon's file descriptors, and it
//! stopped answering anyone).
//!
//! - [`Gate`]: at most `max_connections` accepted connections live at once on one
//!   listener; a connection beyond is closed as soon as it is accepted (logged at most
//!   once per [`WARN_EVERY`], with a count), so the descriptors the process spends on one
//!   listener's clients stay bounded whoever connects.
//! - [`Gated`]: an admitted connection, holding its slot until it is dropped; it must
//!   deliver its first `first_bytes` bytes (the HTTP/2 preface and SETTINGS header, a
//!   TLS ClientHello, an HTTP/1 request line) within `first_bytes_timeout` from its accept, or its next read
//!   fails with `TimedOut` and the server closes it. A connection that completed its
//!   start and then sends nothing is the HTTP/2 keepalive's business (a peer that does
//!   not answer PINGs is closed) or, when it answers them, holds one slot of the cap.
//!
//! Nothing here spawns a task: the deadline is a timer polled with the connection's
//! reads, which the server keeps pending while it waits for the first bytes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What an HTTP/2 client sends before anything else: the 24-byte connection preface
/// (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`) and the 9-byte header of the SETTINGS frame that
/// must follow it. A connection that sends only the preface is as stuck as a silent
/// one (the server waits for its SETTINGS). A TLS ClientHello is longer.
pub const H2_START_BYTES: usize = 24 + 9;

/// Warnings about refused or timed-out connections are logged at most this often: a
/// flood of them must not become a flood of log lines.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// One listener's bound on its live connections and on how long a new one may stay
/// silent. Cheap to share (`Arc`).
pub struct Gate {
    what: &'static str,
    slots: Arc<Semaphore>,
    max: usize,
    first_bytes: usize,
    first_bytes_timeout: Duration,
    refused: AtomicU64,
    timed_out: AtomicU64,
    /// When a warning was last logged, and the counts then.
    warned: Mutex<Option<(Instant, u64, u64)>>,
}

impl Gate {
    /// A gate for the listener `what` (named in logs): at most `max_connections` live
    /// connections, each to send `first_bytes` bytes within `first_bytes_timeout`.
    pub fn new(
        what: &'static str,
        max_connections: usize,
        first_bytes: usize,
        first_bytes_timeout: Duration,
    ) -> Arc<Gate> {
        let max = max_connections.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Gate {
            what,
            slots: Arc::new(Semaphore::new(max)),
            max,
            first_bytes,
            first_bytes_timeout,
            refused: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            warned: Mutex::new(None),
        })
    }

    /// `io` with its slot, or None when the listener holds `max_connections` already:
    /// the caller then drops `io`, which closes it.
    pub fn admit<T>(self: &Arc<Self>, io: T) -> Option<Gated<T>> {
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => Some(Gated {
                io,
                _slot: slot,
                gate: self.clone(),
                first: (self.first_bytes > 0).then(|| FirstBytes {
                    missing: self.first_bytes,
                    deadline: Box::pin(tokio::time::sleep(self.first_bytes_timeout)),
                }),
            }),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.maybe_warn();
                None
            }
        }
    }

    /// Connections live now.
    pub fn live(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    /// Connections closed at accept because the listener was full, since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed for not sending their first bytes in time, since start.
    pub fn timed_out(&self) -> u64 {
        self.timed_out.load(Ordering::Relaxed)
    }

    fn maybe_warn(&self) {
        let now = Instant::now();
        let (refused, timed_out) = (self.refused(), self.timed_out());
        let mut w = self.warned.lock();
        let (since, r0, t0) = match *w {
            Some((at, _, _)) if now.duration_since(at) < WARN_EVERY => return,
            Some(prev) => prev,
            None => (now, 0, 0),
        };
        *w = Some((now, refused, timed_out));
        drop(w);
        tracing::warn!(
            listener = self.what,
            max_connections = self.max,
            refused = refused - r0,
            silent_closed = timed_out - t0,
            over_secs = now.duration_since(since).as_secs(),
            "closing connections: the listener is full or they sent nothing in {:?}",
            self.first_bytes_timeout
        );
    }
}

struct FirstBytes {
    missing: usize,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

/// An admitted connection (see [`Gate::admit`]).
pub struct Gated<T> {
    io: T,
    _slot: OwnedSemaphorePermit,
    gate: Arc<Gate>,
    first: Option<FirstBytes>,
}

impl<T> Gated<T> {
    pub fn get_ref(&self) -> &T {
        &self.io
    }
}

/// The connection's own info (its peer address for TCP), as if it were not gated.
impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Gated<T> {
    type ConnectInfo = T::ConnectInfo;
    fn connect_info(&self) -> T::ConnectInfo {
        self.io.connect_info()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Gated<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        let Some(first) = this.first.as_mut() else {
            return r;
        };
        match r {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                first.missing = first.missing.saturating_sub(n);
                if first.missing == 0 || n == 0 {
                    // Started (or closed by the peer): the deadline has done its job.
                    this.first = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if first.deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.first = None;
                this.gate.timed_out.fetch_add(1, Ordering::Relaxed);
                this.gate.maybe_warn();
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{}: the connection sent less than {} bytes in {:?}",
                        this.gate.what, this.gate.first_bytes, this.gate.first_bytes_timeout
                    ),
                )))
            }
            r => r,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Gated<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Admits each connection of `incoming` through `gate`: refused ones are closed at
/// once; an accept error (EMFILE when the process is out of descriptors) is logged
/// (rate-limited) and followed by a short pause, since the connection waiting in the
/// backlog would make the next accept fail at once again and spin a core.
pub fn gated<S, T>(
    incoming: S,
    gate: Arc<Gate>,
) -> impl futures::Stream<Item = io::Result<Gated<T>>> + Send
where
    S: futures::Stream<Item = io::Result<T>> + Send,
    T: Send + 'static,
{
    use futures::StreamExt;
    incoming.filter_map(move |c| {
        let gate = gate.clone();
        async move {
            match c {
                Ok(io) => gate.admit(io).map(Ok),
                Err(e) => {
                    accept_error(gate.what, &e).await;
                    None
                }
            }
        }
    })
}

/// Logs an accept error (at most once per [`WARN_EVERY`] per process) and pauses 100 ms.
pub async fn accept_error(what: &str, e: &io::Error) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let now = Instant::now();
    let log = {
        let mut last = LAST.lock();
        let due = last.is_none_or(|t| now.duration_since(t) >= WARN_EVERY);
        if due {
            *last = Some(now);
        }
        due
    };
    if log {
        tracing::warn!(listener = what, "accepting a connection failed: {e}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_silent_connection_fails_its_read_after_the_deadline() {
        let gate = Gate::new("test", 2, 4, Duration::from_millis(100));
        let (a, mut b) = tokio::io::duplex(64);
        let mut g = gate.admit(a).expect("a slot");
        assert_eq!(gate.live(), 1);
        let mut buf = [0u8; 8];
        let e = g.read(&mut buf).await.expect_err("timed out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(gate.timed_out(), 1);
        // One that sends its first bytes in time is not timed out later.
        let (a, mut b2) = tokio::io::duplex(64);
        let mut g2 = gate.admit(a).expect("a slot");
        b2.write_all(b"abcd").await.expect("write");
        assert_eq!(g2.read(&mut buf).await.expect("read"), 4);
        let r = tokio::time::timeout(Duration::from_millis(300), g2.read(&mut buf)).await;
        assert!(r.is_err(), "still waiting for data, not timed out");
        // The cap: both slots are taken.
        assert!(gate.admit(()).is_none());
        assert_eq!(gate.refused(), 1);
        drop(g);
        assert!(gate.admit(()).is_some(), "a slot is freed by the drop");
        b.shutdown().await.expect("shutdown");
    }
}
