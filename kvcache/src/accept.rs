//! What bounds the connections a listener holds (hostile-client finding: 20,000 TCP
//! connections that never sent a byte exhausted the daemon's file descriptors, and it
//! stopped answering anyone).
//!
//! - [`Gate`]: at most `max_connections` accepted connections live at once on one
//!   listener, so the descriptors the process spends on one listener's clients stay
//!   bounded whoever connects.
//! - [`Gated`]: an admitted connection, holding its slot until it is dropped; it must
//!   deliver its first `first_bytes` bytes (the HTTP/2 preface and SETTINGS header, a
//!   TLS ClientHello, an HTTP/1 request line) within `first_bytes_timeout` from its
//!   accept, or its next read fails with `TimedOut` and the server closes it.
//! - A full listener makes room by closing its oldest connection that has not proved
//!   itself yet (its next read fails), and gives its slot to the new one; only when
//!   every slot holds a proven connection is a new one refused (closed at accept; logged
//!   at most once per [`WARN_EVERY`], with counts). A connection proves itself by
//!   sending its first bytes, or, on a gate built [`Gate::until_vouched`], only once
//!   its server vouches for it ([`Admission::vouch`]): the KV and admin servers do when
//!   a request passed their authentication. Black-box finding: 1,100 connections that
//!   sent the HTTP/2 preface and SETTINGS, then never a request (no token needed for
//!   that), held every KV and admin slot, and authenticated clients were refused most
//!   of the time. A flood of silent or unauthenticated connections therefore keeps
//!   nobody out: a live client sends its first request within a round trip, long
//!   before the flood's turnover reaches it. A proven connection that then sends
//!   nothing is the HTTP/2 keepalive's business (a peer that does not answer PINGs is
//!   closed) or, when it answers them, holds one slot of the cap.
//!
//! - Every gate of the process draws its slots from one pool too: a quarter of the
//!   descriptor soft limit ([`process_connection_cap`]); the disk tier's open files take
//!   at most another quarter, and the rest is for RocksDB, the store's sockets and the
//!   connections closed to make room whose descriptors are not released yet (under a
//!   flood of reconnections, at half the limit the accepts still met EMFILE). A full pool is met as a full gate is: the gate admitting
//!   closes its own oldest unproven connection, else refuses. Black-box finding: with
//!   the limit at 2,048, 1,200 silent connections on each of the KV TCP and Unix
//!   listeners (1,024 slots each) ran the daemon out of descriptors; a tenant's puts
//!   failed "Too many open files" and the disk tier went degraded.
//!
//! - On a gate built [`Gate::evict_idle_after`], a full listener with no unproven
//!   connection left closes its proven connection idle longest, if idle that long,
//!   rather than refuse the newcomer. Idle: no request vouched for and no read or
//!   write of [`ACTIVE_BYTES`] or more (an HTTP/2 PING and its answer, 17 bytes each,
//!   or a WINDOW_UPDATE do not count). Black-box finding: 300 clients that each made
//!   one `GET /stats` and kept the connection open locked every later scrape out of
//!   the admin listener for as long as they stayed; 1,100 connections of one tenant,
//!   each with one call and then only keepalive PINGs, locked every other tenant out
//!   of the KV listener.
//!
//! Nothing here spawns a task: the deadline is a timer polled with the connection's
//! reads, which the server keeps pending while it waits for the first bytes, and a
//! closing is a flag its read sees when woken.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What an HTTP/2 client sends before anything else: the 24-byte connection preface
/// (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`) and the 9-byte header of the SETTINGS frame that
/// must follow it. A connection that sends only the preface is as stuck as a silent
/// one (the server waits for its SETTINGS). A TLS ClientHello is longer.
pub const H2_START_BYTES: usize = 24 + 9;

/// A read or write of at least this many bytes is activity (see the module doc): more
/// than an HTTP/2 PING frame (17 bytes) or a PING and a WINDOW_UPDATE read together
/// (30); an HTTP/1 request line or a gRPC call's HEADERS frame is longer.
pub const ACTIVE_BYTES: usize = 32;

/// An unproven connection younger than this goes after an idle proven one (see
/// [`Gate::admit`]): 1 s, many round trips for a live client to send its first call.
pub const UNPROVEN_GRACE: Duration = Duration::from_secs(1);

/// Milliseconds since the first call (a monotonic clock for activity stamps).
fn now_ms() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Warnings about refused or timed-out connections are logged at most this often: a
/// flood of them must not become a flood of log lines.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// One listener's bound on its live connections and on how long a new one may stay
/// silent. Cheap to share (`Arc`).
pub struct Gate {
    what: &'static str,
    max: usize,
    first_bytes: usize,
    first_bytes_timeout: Duration,
    /// Where a connection's start ends besides its first bytes (an HTTP/1 request
    /// head's blank line): it must arrive within the deadline too ([`Gate::http1`]).
    start_ends_with: Option<&'static [u8]>,
    /// Whether a started connection may still be closed to make room until its server
    /// vouches for it ([`Gate::until_vouched`]).
    until_vouched: bool,
    /// A full gate closes a proven connection idle this long ([`Gate::evict_idle_after`]).
    idle_evict: Option<Duration>,
    slots: Mutex<Slots>,
    refused: AtomicU64,
    timed_out: AtomicU64,
    evicted: AtomicU64,
    /// When a warning was last logged, and the counts then.
    warned: Mutex<Option<(Instant, u64, u64, u64)>>,
}

/// The slots in use, and the connections holding one that have not proved themselves
/// yet, oldest first (with entries of connections that since proved themselves or left,
/// dropped as met and when they outnumber the slots).
#[derive(Default)]
struct Slots {
    live: usize,
    unproven: VecDeque<Arc<Start>>,
    /// Every admitted connection, on a gate that evicts idle ones (entries of those
    /// gone are swept once they outnumber the slots twice).
    admitted: Vec<Arc<Start>>,
}

/// Where an admitted connection stands; one of the `START_*` states.
#[derive(Default)]
struct Start {
    state: AtomicU8,
    /// The connection's pending read, woken to see it was closed.
    reader: AtomicWaker,
    /// When it was last active ([`now_ms`]; see the module doc).
    active_ms: AtomicU64,
}

/// Admitted, first bytes not all here yet: a full gate may close it.
const START_SILENT: u8 = 0;
/// Sent its first bytes, not vouched for yet by its server (gates built
/// [`Gate::until_vouched`] only): a full gate may close it.
const START_UNVOUCHED: u8 = 1;
/// Proved itself (see the module doc): it keeps its slot until dropped.
const START_KEPT: u8 = 2;
/// Closed by a full gate, its slot given to a newer connection.
const START_EVICTED: u8 = 3;
/// Dropped.
const START_GONE: u8 = 4;

impl Start {
    fn is(&self, state: u8) -> bool {
        self.state.load(Ordering::Acquire) == state
    }
    fn unproven(&self) -> bool {
        matches!(
            self.state.load(Ordering::Acquire),
            START_SILENT | START_UNVOUCHED
        )
    }
    fn active(&self) {
        self.active_ms.store(now_ms(), Ordering::Relaxed);
    }
    /// Closes it to make room, if it has not proved itself.
    fn evict(&self) -> bool {
        self.change(START_SILENT, START_EVICTED) || self.change(START_UNVOUCHED, START_EVICTED)
    }
    fn change(&self, from: u8, to: u8) -> bool {
        self.state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Connections all gates of the process hold at most: a quarter of the descriptor soft
/// limit when the first connection is admitted (the daemon raises it at start; at
/// least 64), or no bound past the gates' own when the limit is unlimited.
pub fn process_connection_cap() -> usize {
    *PROCESS_CAP.get_or_init(|| {
        strata_cache_core::tiers::disk::fd_soft_limit()
            .map(|l| ((l / 4) as usize).max(64))
            .unwrap_or(usize::MAX)
    })
}

static PROCESS_CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
/// Connections all gates hold now.
static PROCESS_LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Takes a slot of the process pool, if one is free.
fn take_process_slot() -> bool {
    let cap = process_connection_cap();
    PROCESS_LIVE
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < cap).then_some(n + 1)
        })
        .is_ok()
}

impl Gate {
    /// A gate for the listener `what` (named in logs): at most `max_connections` live
    /// connections, each to send `first_bytes` bytes within `first_bytes_timeout`.
    /// Shared as `Arc<Gate>`.
    pub fn new(
        what: &'static str,
        max_connections: usize,
        first_bytes: usize,
        first_bytes_timeout: Duration,
    ) -> Gate {
        Gate {
            what,
            max: max_connections.max(1),
            first_bytes,
            first_bytes_timeout,
            start_ends_with: None,
            until_vouched: false,
            idle_evict: None,
            slots: Mutex::default(),
            refused: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            warned: Mutex::new(None),
        }
    }

    /// For an HTTP/1 listener: a connection has started only once its whole first
    /// request head is in (up to its blank line), within the deadline. Black-box
    /// finding: 300 connections that each sent half a request head
    /// (`GET /metrics HTTP/1.1\r\nHost: x\r\n`) and stopped held 256 admin slots for
    /// as long as they liked, and `strata stats` and Prometheus were shut out.
    pub fn http1(mut self) -> Gate {
        self.start_ends_with = Some(b"\r\n\r\n");
        self
    }

    /// A started connection keeps its slot under pressure only once its server vouched
    /// for it ([`Admission::vouch`], after a request that passed authentication); until
    /// then a full gate may close it to make room (see the module doc).
    pub fn until_vouched(mut self) -> Gate {
        self.until_vouched = true;
        self
    }

    /// A full gate with no unproven connection closes the proven one idle longest, if
    /// idle at least `idle` (see the module doc), to admit a newcomer.
    pub fn evict_idle_after(mut self, idle: Duration) -> Gate {
        self.idle_evict = Some(idle);
        self
    }

    /// On a full gate, the proven connection idle longest if idle long enough, closed.
    fn evict_idle(&self, slots: &mut Slots) -> Option<Arc<Start>> {
        let idle = self.idle_evict?.as_millis() as u64;
        let now = now_ms();
        let oldest = slots
            .admitted
            .iter()
            .filter(|s| s.is(START_KEPT))
            .filter(|s| now.saturating_sub(s.active_ms.load(Ordering::Relaxed)) >= idle)
            .min_by_key(|s| s.active_ms.load(Ordering::Relaxed))?
            .clone();
        oldest.change(START_KEPT, START_EVICTED).then_some(oldest)
    }

    /// What a connection that delivered its first bytes becomes.
    fn started(&self) -> u8 {
        if self.until_vouched {
            START_UNVOUCHED
        } else {
            START_KEPT
        }
    }

    /// `io` with its slot, or None when every slot holds a connection that proved
    /// itself: the caller then drops `io`, which closes it. A full gate closes its
    /// oldest unproven connection to make room (see the module doc).
    pub fn admit<T>(self: &Arc<Self>, io: T) -> Option<Gated<T>> {
        let start = Arc::new(Start::default());
        start.active();
        let silent = self.first_bytes > 0;
        if !silent {
            start.state.store(self.started(), Ordering::Release);
        }
        let unproven = start.unproven();
        let evicted = {
            let mut slots = self.slots.lock();
            let evicted = if slots.live < self.max && take_process_slot() {
                slots.live += 1;
                None
            } else {
                // The oldest connection still unproven gives up its slot; on a gate that
                // evicts idle ones, an unproven one younger than `UNPROVEN_GRACE` only
                // after an idle proven one (black-box finding: of newcomers arriving
                // together, each closed the one before it, mid-call, while connections
                // idle for 12 s were kept).
                let now = now_ms();
                let grace = UNPROVEN_GRACE.as_millis() as u64;
                let young = |s: &Start| {
                    self.idle_evict.is_some()
                        && now.saturating_sub(s.active_ms.load(Ordering::Relaxed)) < grace
                };
                let mut found = None;
                while let Some(old) = slots.unproven.front().cloned() {
                    if old.unproven() && young(&old) {
                        break;
                    }
                    slots.unproven.pop_front();
                    if old.evict() {
                        found = Some(old);
                        break;
                    }
                }
                let found = found.or_else(|| self.evict_idle(&mut slots)).or_else(|| {
                    while let Some(old) = slots.unproven.pop_front() {
                        if old.evict() {
                            return Some(old);
                        }
                    }
                    None
                });
                match found {
                    Some(old) => Some(old),
                    None => {
                        drop(slots);
                        self.refused.fetch_add(1, Ordering::Relaxed);
                        self.maybe_warn();
                        return None;
                    }
                }
            };
            // Entries at the front of those that proved themselves or left are dropped
            // here; behind a long-lived unproven one they pile up, so they are swept
            // once they outnumber the slots twice (at most `max` entries stay: each is
            // a live connection), which keeps the queue bounded at amortised O(1).
            while slots.unproven.front().is_some_and(|s| !s.unproven()) {
                slots.unproven.pop_front();
            }
            if slots.unproven.len() >= 2 * self.max {
                slots.unproven.retain(|s| s.unproven());
            }
            if unproven {
                slots.unproven.push_back(start.clone());
            }
            if self.idle_evict.is_some() {
                if slots.admitted.len() >= 2 * self.max {
                    slots
                        .admitted
                        .retain(|s| !s.is(START_GONE) && !s.is(START_EVICTED));
                }
                slots.admitted.push(start.clone());
            }
            evicted
        };
        if let Some(old) = evicted {
            old.reader.wake();
            self.evicted.fetch_add(1, Ordering::Relaxed);
            self.maybe_warn();
        }
        Some(Gated {
            io,
            watching: unproven || self.idle_evict.is_some(),
            start,
            gate: self.clone(),
            first: silent.then(|| FirstBytes {
                missing: self.first_bytes,
                end: self.start_ends_with.map(|e| (e, 0)),
                deadline: Box::pin(tokio::time::sleep(self.first_bytes_timeout)),
            }),
        })
    }

    /// Connections holding a slot now.
    pub fn live(&self) -> usize {
        self.slots.lock().live
    }

    /// Connections closed at accept because every slot held a proven one, since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed for not sending their first bytes in time, since start.
    pub fn timed_out(&self) -> u64 {
        self.timed_out.load(Ordering::Relaxed)
    }

    /// Unproven connections closed to make room for newer ones, since start.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    fn release(&self, start: &Start) {
        let was = start.state.swap(START_GONE, Ordering::AcqRel);
        // An evicted connection's slot was given away when it was evicted.
        if was != START_EVICTED {
            let mut slots = self.slots.lock();
            slots.live = slots.live.saturating_sub(1);
            PROCESS_LIVE.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn maybe_warn(&self) {
        let now = Instant::now();
        let (refused, timed_out, evicted) = (self.refused(), self.timed_out(), self.evicted());
        let mut w = self.warned.lock();
        let (since, r0, t0, e0) = match *w {
            Some((at, ..)) if now.duration_since(at) < WARN_EVERY => return,
            Some(prev) => prev,
            None => (now, 0, 0, 0),
        };
        *w = Some((now, refused, timed_out, evicted));
        drop(w);
        // Both caps: the process's (a quarter of the descriptor limit) is often the one
        // that bites (black-box finding: the line named only max_connections=1024 while
        // 64 connections, a quarter of a 256 limit, were all there was).
        tracing::warn!(
            listener = self.what,
            max_connections = self.max,
            process_connections = process_connection_cap(),
            descriptor_limit = ?strata_cache_core::tiers::disk::fd_soft_limit(),
            refused = refused - r0,
            silent_closed = timed_out - t0,
            unproven_evicted = evicted - e0,
            over_secs = now.duration_since(since).as_secs(),
            "closing connections: the listener (or the process: a quarter of the descriptor limit, `ulimit -n`) is full, or they sent nothing in {:?}",
            self.first_bytes_timeout
        );
    }
}

struct FirstBytes {
    missing: usize,
    /// The sequence that ends the start, and how much of it the bytes so far end with.
    end: Option<(&'static [u8], usize)>,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl FirstBytes {
    /// Takes `bytes` just read; whether the start is complete.
    fn take(&mut self, bytes: &[u8]) -> bool {
        self.missing = self.missing.saturating_sub(bytes.len());
        if let Some((end, matched)) = self.end.as_mut() {
            for &b in bytes {
                if *matched < end.len() {
                    *matched = if b == end[*matched] {
                        *matched + 1
                    } else {
                        usize::from(b == end[0])
                    };
                }
            }
        }
        self.missing == 0 && self.end.is_none_or(|(end, m)| m == end.len())
    }
}

/// An admitted connection (see [`Gate::admit`]).
pub struct Gated<T> {
    io: T,
    start: Arc<Start>,
    gate: Arc<Gate>,
    first: Option<FirstBytes>,
    /// Not kept yet: each read checks whether a full gate closed it meanwhile.
    watching: bool,
}

impl<T> Gated<T> {
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// The handle its server vouches for it with.
    pub fn admission(&self) -> Admission {
        Admission(self.start.clone())
    }
}

impl<T> Gated<T> {
    /// A write of [`ACTIVE_BYTES`] or more is activity, on a gate that evicts idle
    /// connections.
    fn wrote(&self, r: &Poll<io::Result<usize>>) {
        if self.gate.idle_evict.is_some() && matches!(r, Poll::Ready(Ok(n)) if *n >= ACTIVE_BYTES) {
            self.start.active();
        }
    }
}

impl<T> Drop for Gated<T> {
    fn drop(&mut self) {
        self.gate.release(&self.start);
    }
}

/// A handle on an admitted connection's place in its gate, reaching the server's
/// request handlers through the connection's info ([`Admitted`]).
#[derive(Clone, Debug)]
pub struct Admission(Arc<Start>);

impl std::fmt::Debug for Start {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Start")
            .field("state", &self.state.load(Ordering::Relaxed))
            .finish()
    }
}

impl Admission {
    /// The connection made a request its server accepted (it passed authentication):
    /// it keeps its slot from now on, however full the gate (see the module doc).
    /// Cheap: one atomic load once kept.
    pub fn vouch(&self) {
        self.0.active();
        if !self.0.is(START_KEPT) {
            let _ = self.0.change(START_UNVOUCHED, START_KEPT)
                || self.0.change(START_SILENT, START_KEPT);
        }
    }

    /// Whether the connection keeps its slot (tests).
    pub fn kept(&self) -> bool {
        self.0.is(START_KEPT)
    }

    /// The admission of a tonic request's connection, when it came through a gate
    /// directly (`Gated<TcpStream>` or `Gated<UnixStream>`).
    pub fn of<B>(req: &tonic::Request<B>) -> Option<&Admission> {
        use tonic::transport::server::{TcpConnectInfo, UdsConnectInfo};
        let ext = req.extensions();
        ext.get::<Admitted<TcpConnectInfo>>()
            .map(|a| &a.admission)
            .or_else(|| ext.get::<Admitted<UdsConnectInfo>>().map(|a| &a.admission))
    }
}

/// A gated connection's info: its own (its peer address for TCP) and its admission.
#[derive(Clone, Debug)]
pub struct Admitted<I> {
    pub info: I,
    pub admission: Admission,
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Gated<T> {
    type ConnectInfo = Admitted<T::ConnectInfo>;
    fn connect_info(&self) -> Self::ConnectInfo {
        Admitted {
            info: self.io.connect_info(),
            admission: self.admission(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Gated<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.watching {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        this.start.reader.register(cx.waker());
        match this.start.state.load(Ordering::Acquire) {
            START_EVICTED => {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!(
                        "{}: closed to make room while the listener was full, not having \
                         proved itself (sent its first bytes, or a request its server \
                         accepted), or idle longest",
                        this.gate.what
                    ),
                )));
            }
            START_KEPT => {
                this.first = None;
                this.watching = this.gate.idle_evict.is_some();
                let before = buf.filled().len();
                let r = Pin::new(&mut this.io).poll_read(cx, buf);
                if buf.filled().len() - before >= ACTIVE_BYTES {
                    this.start.active();
                }
                return r;
            }
            _ => {}
        }
        let Some(first) = this.first.as_mut() else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                let started = first.take(&buf.filled()[before..]);
                if started || n == 0 {
                    // Started (or closed by the peer): the deadline has done its job.
                    // Evicted meanwhile, it has no slot: it fails its next read.
                    let next = this.gate.started();
                    if this.start.change(START_SILENT, next) {
                        this.first = None;
                        this.watching = next != START_KEPT;
                    }
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
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(&r);
        r
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
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(&r);
        r
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
        let gate = Arc::new(Gate::new("test", 2, 4, Duration::from_millis(100)));
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
        // The cap: both slots are taken (the silent one timed out but is not dropped
        // yet: a full gate closes it to make room).
        drop(g);
        let (a3, _b3) = tokio::io::duplex(64);
        let mut g3 = gate.admit(a3).expect("the dropped one's slot");
        b.shutdown().await.expect("shutdown");
        let (a4, _b4) = tokio::io::duplex(64);
        let g4 = gate.admit(a4).expect("room made by closing the silent one");
        assert_eq!(gate.evicted(), 1);
        assert_eq!(gate.live(), 2);
        let e = g3.read(&mut buf).await.expect_err("closed to make room");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        drop(g3);
        assert_eq!(gate.live(), 2, "an evicted connection's slot went to g4");
        // g4's slot to a connection that starts: now every slot holds a started
        // connection, and a newcomer is refused.
        drop(g4);
        let (a5, mut b5) = tokio::io::duplex(64);
        let mut g5 = gate.admit(a5).expect("g4's slot");
        b5.write_all(b"wxyz").await.expect("write");
        assert_eq!(g5.read(&mut buf).await.expect("read"), 4);
        assert!(
            gate.admit(()).is_none(),
            "every slot holds a started connection"
        );
        assert_eq!(gate.refused(), 1);
        drop(g2);
        assert!(gate.admit(()).is_some(), "a slot is freed by the drop");
    }

    /// Black-box finding: half a request head, then nothing, held an admin slot for
    /// good. An HTTP/1 gate's connection starts only with its whole head (the blank
    /// line may arrive split across reads); half a head times out like silence, and a
    /// full gate closes such a connection to make room.
    #[tokio::test]
    async fn an_http1_connection_starts_only_with_its_whole_request_head() {
        let gate = Arc::new(Gate::new("test", 1, 4, Duration::from_millis(150)).http1());
        let mut buf = [0u8; 64];
        let (a, mut b) = tokio::io::duplex(256);
        let mut g = gate.admit(a).expect("a slot");
        b.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("write");
        assert!(g.read(&mut buf).await.expect("read") > 0);
        let e = g.read(&mut buf).await.expect_err("half a head times out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // Until then it was silent: a newcomer takes its slot.
        let (a2, mut b2) = tokio::io::duplex(256);
        let mut g2 = gate.admit(a2).expect("room made");
        b2.write_all(b"GET / HTTP/1.1\r\nHost: x\r")
            .await
            .expect("write");
        assert!(g2.read(&mut buf).await.expect("read") > 0);
        b2.write_all(b"\n\r\n").await.expect("write");
        assert!(g2.read(&mut buf).await.expect("read") > 0);
        let r = tokio::time::timeout(Duration::from_millis(400), g2.read(&mut buf)).await;
        assert!(r.is_err(), "a whole head started it: no deadline any more");
        assert!(gate.admit(()).is_none(), "its slot is kept");
        drop(b);
    }

    /// A flood of silent connections keeps no live client out: each new connection
    /// closes the oldest silent one, and a client that sends its first bytes keeps its
    /// slot however many follow.
    #[tokio::test]
    async fn silent_floods_make_room_for_clients_that_speak() {
        let gate = Arc::new(Gate::new("test", 8, 4, Duration::from_secs(60)));
        let mut flood = Vec::new();
        for _ in 0..8 {
            let (a, b) = tokio::io::duplex(64);
            flood.push((gate.admit(a).expect("a slot"), b));
        }
        let (a, mut client) = tokio::io::duplex(64);
        let mut speaking = gate.admit(a).expect("a client gets in through a full gate");
        client.write_all(b"helo").await.expect("write");
        let mut buf = [0u8; 8];
        assert_eq!(speaking.read(&mut buf).await.expect("read"), 4);
        for _ in 0..100 {
            let (a, b) = tokio::io::duplex(64);
            flood.push((gate.admit(a).expect("the flood evicts itself"), b));
        }
        assert_eq!(gate.live(), 8);
        assert_eq!(gate.refused(), 0);
        assert_eq!(gate.evicted(), 101);
        client.write_all(b"more").await.expect("write");
        assert_eq!(speaking.read(&mut buf).await.expect("still served"), 4);
        // The first eight of the flood were closed to make room.
        let (first, _) = &mut flood[0];
        let e = first.read(&mut buf).await.expect_err("evicted");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        drop(flood);
        assert_eq!(gate.live(), 1, "only the client holds a slot");
    }

    /// On a gate built `until_vouched`, a connection that started but was not vouched
    /// for (it made no request that passed authentication) still gives up its slot to
    /// a newcomer; once vouched for, it keeps it, and only a gate full of vouched
    /// connections refuses.
    #[tokio::test]
    async fn started_connections_make_room_until_vouched_for() {
        let gate = Arc::new(Gate::new("test", 2, 4, Duration::from_secs(60)).until_vouched());
        let mut buf = [0u8; 8];
        let started = || {
            let (a, mut b) = tokio::io::duplex(64);
            let g = gate.admit(a).expect("a slot");
            async move {
                let mut g = g;
                b.write_all(b"helo").await.expect("write");
                assert_eq!(g.read(&mut [0u8; 8]).await.expect("read"), 4);
                (g, b)
            }
        };
        let (mut g1, _b1) = started().await;
        let (g2, _b2) = started().await;
        assert!(!g1.admission().kept() && !g2.admission().kept());
        g2.admission().vouch();
        assert!(g2.admission().kept());
        let (mut g3, _b3) = started().await;
        assert_eq!(gate.evicted(), 1);
        let e = g1.read(&mut buf).await.expect_err("closed to make room");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        let e = g1.read(&mut buf).await.expect_err("and stays closed");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        drop(g1);
        let (g4, _b4) = started().await;
        assert_eq!(gate.evicted(), 2, "g3, not the vouched g2");
        let e = g3.read(&mut buf).await.expect_err("closed to make room");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        g4.admission().vouch();
        assert!(gate.admit(()).is_none(), "every slot vouched for");
        assert_eq!(gate.refused(), 1);
        // A vouched connection's reads go on as before.
        drop(g4);
        let (a, mut b) = tokio::io::duplex(64);
        let mut g5 = gate.admit(a).expect("g4's slot");
        b.write_all(b"abcd").await.expect("write");
        assert_eq!(g5.read(&mut buf).await.expect("read"), 4);
        g5.admission().vouch();
        b.write_all(b"efgh").await.expect("write");
        assert_eq!(g5.read(&mut buf).await.expect("read"), 4);
        assert_eq!(gate.live(), 2);
    }

    /// Black-box finding (round 16): proven connections that made one request and then
    /// only kept alive (HTTP/2 PINGs) held every slot, and newcomers were refused for as
    /// long as they lived. A full gate built `evict_idle_after` closes the proven
    /// connection idle longest, once idle that long; PING-sized traffic is not activity.
    #[tokio::test]
    async fn a_full_gate_closes_its_longest_idle_proven_connection() {
        let idle = Duration::from_millis(200);
        let gate = Arc::new(
            Gate::new("test", 2, 4, Duration::from_secs(60))
                .until_vouched()
                .evict_idle_after(idle),
        );
        let proven = || {
            let (a, mut b) = tokio::io::duplex(4096);
            let g = gate.admit(a).expect("a slot");
            async move {
                let mut g = g;
                b.write_all(b"helo").await.expect("write");
                assert_eq!(g.read(&mut [0u8; 8]).await.expect("read"), 4);
                g.admission().vouch();
                (g, b)
            }
        };
        let (mut pinging, mut pinging_peer) = proven().await;
        let (mut busy, mut busy_peer) = proven().await;
        assert!(gate.admit(()).is_none(), "both active: refused");
        let mut buf = [0u8; 256];
        let deadline = Instant::now() + 2 * idle;
        while Instant::now() < deadline {
            // A PING (17 bytes) on one, calls (64 bytes) on the other.
            pinging_peer.write_all(&[0u8; 17]).await.expect("ping");
            assert_eq!(pinging.read(&mut buf).await.expect("read"), 17);
            busy_peer.write_all(&[1u8; 64]).await.expect("call");
            assert_eq!(busy.read(&mut buf).await.expect("read"), 64);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let newcomer = gate.admit(()).expect("the idle one makes room");
        assert_eq!(gate.evicted(), 1);
        let e = pinging.read(&mut buf).await.expect_err("closed");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        busy_peer.write_all(&[2u8; 64]).await.expect("call");
        assert_eq!(busy.read(&mut buf).await.expect("the busy one stays"), 64);
        drop(pinging);
        assert_eq!(gate.live(), 2);
        // An unproven newcomer goes before any proven connection.
        let _next = gate.admit(()).expect("the unproven newcomer makes room");
        assert_eq!(gate.evicted(), 2);
        drop(newcomer);
        busy_peer.write_all(&[3u8; 64]).await.expect("call");
        assert_eq!(busy.read(&mut buf).await.expect("the busy one stays"), 64);
    }

    /// Black-box finding (round 16b): newcomers arriving together while the gate was
    /// full of idle proven connections closed each other, mid-call: each took the slot
    /// of the one before it (unproven), not of an idle one. A young unproven connection
    /// goes only after the idle proven ones.
    #[tokio::test]
    async fn newcomers_arriving_together_take_idle_slots_not_each_others() {
        let gate = Arc::new(
            Gate::new("test", 2, 4, Duration::from_secs(60))
                .until_vouched()
                .evict_idle_after(Duration::from_millis(50)),
        );
        let mut idle = Vec::new();
        for _ in 0..2 {
            let (a, mut b) = tokio::io::duplex(64);
            let mut g = gate.admit(a).expect("a slot");
            b.write_all(b"helo").await.expect("write");
            assert_eq!(g.read(&mut [0u8; 8]).await.expect("read"), 4);
            g.admission().vouch();
            idle.push((g, b));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (a1, _b1) = tokio::io::duplex(64);
        let (a2, _b2) = tokio::io::duplex(64);
        let mut first = gate.admit(a1).expect("an idle one makes room");
        let _second = gate.admit(a2).expect("the other idle one makes room");
        assert_eq!(gate.evicted(), 2);
        // The first newcomer was not closed for the second: its read waits.
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_millis(100), first.read(&mut buf));
        assert!(read.await.is_err(), "still open");
        for (mut g, _peer) in idle {
            let e = g.read(&mut [0u8; 8]).await.expect_err("closed");
            assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        }
    }

    /// The queue of unproven connections stays bounded when one of them lives long
    /// while many others come, prove themselves and go.
    #[tokio::test]
    async fn the_unproven_queue_stays_bounded_behind_a_long_lived_connection() {
        let gate = Arc::new(Gate::new("test", 4, 0, Duration::from_secs(60)).until_vouched());
        let _old = gate.admit(()).expect("a slot");
        for _ in 0..1000 {
            let g = gate.admit(()).expect("a slot");
            g.admission().vouch();
        }
        let queued = gate.slots.lock().unproven.len();
        assert!(
            queued <= 2 * 4,
            "{queued} entries for 1 unproven connection"
        );
        assert_eq!(gate.live(), 1);
    }
}
