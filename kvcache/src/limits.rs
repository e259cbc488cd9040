//! What bounds one client's cost to everyone else (issue 12, finding 4).
//!
//! - [`PutBudget`]: the bytes all Put streams buffer. A Put reserves the bytes it has
//!   *received*, not the size it declares, so a stream that declares 64 MiB and sends
//!   one byte holds one KiB of budget, not 64 MiB; once it has sent more than
//!   [`PUT_RESERVE_WHOLE_AFTER`] it reserves the rest of its declared size at once
//!   ([`put_reservation_for`]), so streams that are sending never hold part of their
//!   size each while waiting for more (black-box finding: 8 concurrent 64 MiB puts
//!   split a 256 MiB budget between them and none completed). Each connection also has its own
//!   cap ([`ConnInfo`]), a fraction of the global budget, so one connection (however
//!   many streams it opens) cannot take the whole budget from the others. Waiting for
//!   budget is bounded by the idle timeout: past it the Put fails with
//!   RESOURCE_EXHAUSTED and releases what it held, so Puts that fill the budget between
//!   them cannot wait on each other forever. With tenants, each tenant has a share too
//!   (`per_tenant_put_bytes`), so one tenant's many connections cannot take it all.
//! - The get budget (an [`InflightBudget`] too): the bytes of the blocks Get responses
//!   hold until their body is done (handed to HTTP/2, or dropped), reserved once the
//!   block is fetched, globally and per connection (`get_reservation`). A client that
//!   reads slowly or not at all, over any number of streams and connections, makes the
//!   server hold at most that much; past it Gets wait (at most the idle timeout, then
//!   RESOURCE_EXHAUSTED), and an unread response is ended by its [`IdleGuard`].
//! - [`ConnIo`]: wraps every accepted connection so its requests carry a [`ConnInfo`]
//!   (the connection's budget, and its admission to vouch for) in their extensions.
//! - [`IdleGuard`]: a response stream the client stops reading is dropped (and with it
//!   the block it pins) after the idle timeout; the client then gets DEADLINE_EXCEEDED.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TlsConnectInfo};
use tonic::Status;

use strata_cache_core::stall::{stalled, STALL_GRACE};

use crate::accept::{Admission, Gated};
use crate::error::{KvError, Result};

/// A Put stream past this many bytes received reserves its whole declared size: 1 MiB,
/// so a stream that stalls early holds at most that, while the hundreds of streams it
/// would take for partial holds to fill the budget are far past one connection's or
/// one tenant's share.
pub const PUT_RESERVE_WHOLE_AFTER: u64 = 1 << 20;

/// What a Put stream of declared `size` holds once `received` bytes arrived.
pub fn put_reservation_for(received: u64, size: u64) -> u64 {
    if received > PUT_RESERVE_WHOLE_AFTER {
        size.max(received)
    } else {
        received
    }
}

/// Budget unit: permits count KiB so that 1 GiB fits a semaphore comfortably.
pub const PERMIT_BYTES: u64 = 1024;

fn permits_for(bytes: u64) -> u64 {
    bytes.div_ceil(PERMIT_BYTES)
}

/// A budget of `bytes`, in permits of [`PERMIT_BYTES`].
pub(crate) fn semaphore(bytes: u64) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(
        permits_for(bytes).min(Semaphore::MAX_PERMITS as u64) as usize,
    ))
}

/// The per-connection part of the put budget, carried in each request's extensions,
/// and the switch that closes the connection.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    budget: Arc<Semaphore>,
    /// The connection's share of the get budget.
    get_budget: Arc<Semaphore>,
    abort: Arc<Abort>,
    /// Its place in its listener's gate (`accept.rs`): vouched for by the token check.
    admission: Option<Admission>,
}

/// Set to close a connection: its next read or write fails, so the server drops it with
/// every stream on it (and whatever those streams buffer).
#[derive(Debug, Default)]
struct Abort {
    set: AtomicBool,
    reader: futures::task::AtomicWaker,
}

impl ConnInfo {
    /// A connection's shares: `bytes` of the put budget, `get_bytes` of the get budget.
    pub fn new(bytes: u64, get_bytes: u64) -> Self {
        ConnInfo {
            budget: semaphore(bytes),
            get_budget: semaphore(get_bytes),
            abort: Arc::default(),
            admission: None,
        }
    }

    /// A request on this connection passed authentication: under pressure its listener
    /// no longer closes it to make room (`accept.rs`).
    pub fn vouch(&self) {
        if let Some(a) = &self.admission {
            a.vouch();
        }
    }

    /// Closes the connection (see [`Abort`]); true the first time.
    pub fn abort(&self) -> bool {
        let first = !self.abort.set.swap(true, Ordering::AcqRel);
        self.abort.reader.wake();
        first
    }

    fn aborted(&self) -> bool {
        self.abort.set.load(Ordering::Acquire)
    }

    /// The connection of a request (plain or TLS); None when the request did not come
    /// through [`ConnIo`] (then only the global budget applies).
    pub fn of<T>(req: &tonic::Request<T>) -> Option<ConnInfo> {
        let ext = req.extensions();
        ext.get::<ConnInfo>()
            .or_else(|| ext.get::<TlsConnectInfo<ConnInfo>>().map(|t| t.get_ref()))
            .cloned()
    }
}

/// An accepted connection tagged with its [`ConnInfo`].
pub struct ConnIo<T> {
    io: T,
    info: ConnInfo,
}

impl<T> ConnIo<T> {
    /// `io` with its shares of the put and get budgets.
    pub fn new(io: T, per_connection_bytes: u64, per_connection_get_bytes: u64) -> Self {
        ConnIo {
            io,
            info: ConnInfo::new(per_connection_bytes, per_connection_get_bytes),
        }
    }
}

impl<T> ConnIo<Gated<T>> {
    /// A gated connection, with its shares, whose requests can vouch for it.
    pub fn gated(io: Gated<T>, per_connection_bytes: u64, per_connection_get_bytes: u64) -> Self {
        let admission = io.admission();
        let mut c = ConnIo::new(io, per_connection_bytes, per_connection_get_bytes);
        c.info.admission = Some(admission);
        c
    }
}

impl<T> Connected for ConnIo<T> {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ConnIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // The server always keeps a read pending on a connection: registering here is
        // what lets `abort` wake it.
        this.info.abort.reader.register(cx.waker());
        if this.info.aborted() {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

fn aborted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "connection closed by the server: a response stream went unread past the idle timeout",
    )
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ConnIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.info.aborted() {
            return Poll::Ready(Err(aborted()));
        }
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
        if self.info.aborted() {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The global budget of bytes buffered by Put streams.
pub type PutBudget = InflightBudget;

/// A global budget of bytes in flight: the bytes Put streams buffer ([`PutBudget`]),
/// or the blocks Get responses hold until they are handed to HTTP/2.
pub struct InflightBudget {
    global: Arc<Semaphore>,
    total_permits: u64,
}

impl InflightBudget {
    pub fn new(bytes: u64) -> Self {
        let global = semaphore(bytes);
        let total_permits = global.available_permits() as u64;
        InflightBudget {
            global,
            total_permits,
        }
    }

    /// An empty reservation for one Get response on `conn` by the tenant whose share
    /// of the get budget is `tenant` (the connection's and the tenant's shares apply).
    pub fn get_reservation(
        &self,
        conn: Option<ConnInfo>,
        tenant: Option<Arc<Semaphore>>,
        wait: Duration,
    ) -> Reservation {
        Reservation {
            global: self.global.clone(),
            shares: conn
                .map(|c| c.get_budget)
                .into_iter()
                .chain(tenant)
                .collect(),
            wait,
            what: "get",
            held: Vec::new(),
            permits: 0,
        }
    }

    /// Bytes reserved by the streams in flight now.
    pub fn reserved_bytes(&self) -> u64 {
        (self.total_permits - self.global.available_permits() as u64) * PERMIT_BYTES
    }

    /// An empty reservation for one Put stream on `conn`, by the tenant whose
    /// in-flight share is `tenant`.
    pub fn reservation(
        &self,
        conn: Option<ConnInfo>,
        tenant: Option<Arc<Semaphore>>,
        wait: Duration,
    ) -> Reservation {
        Reservation {
            global: self.global.clone(),
            shares: conn.map(|c| c.budget).into_iter().chain(tenant).collect(),
            wait,
            what: "put",
            held: Vec::new(),
            permits: 0,
        }
    }
}

/// What one Put stream (or Get response) holds; released when dropped (the stream
/// ended, failed, or was aborted as idle).
pub struct Reservation {
    global: Arc<Semaphore>,
    /// The connection's share, then the tenant's.
    shares: Vec<Arc<Semaphore>>,
    wait: Duration,
    /// "put" or "get", for the error.
    what: &'static str,
    held: Vec<OwnedSemaphorePermit>,
    permits: u64,
}

impl Reservation {
    /// Makes the reservation cover `bytes` in all, waiting at most the idle timeout.
    pub async fn cover(&mut self, bytes: u64) -> Result<()> {
        let need = permits_for(bytes).saturating_sub(self.permits);
        if need == 0 {
            return Ok(());
        }
        let n = u32::try_from(need).map_err(|_| KvError::Invalid("block too large".into()))?;
        let wait = self.wait;
        let acquire = async {
            // The connection's and the tenant's shares first: a connection or tenant
            // over its share waits on its own streams and takes nothing from the
            // others' global budget meanwhile.
            let mut got = Vec::with_capacity(self.shares.len() + 1);
            for s in self.shares.iter().chain(std::iter::once(&self.global)) {
                let p = s.clone().acquire_many_owned(n).await;
                got.push(p.map_err(|_| KvError::ShuttingDown)?);
            }
            Ok::<_, KvError>(got)
        };
        match tokio::time::timeout(wait, acquire).await {
            Ok(Ok(got)) => {
                if self.held.is_empty() {
                    self.held = got;
                } else {
                    // One permit per semaphore, in the same order: merged, so that
                    // `shrink_to` can give some back.
                    for (h, g) in self.held.iter_mut().zip(got) {
                        h.merge(g);
                    }
                }
                self.permits += need;
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(KvError::Busy(format!(
                "the server's in-flight {} budget stayed full for {wait:?}; retry later",
                self.what
            ))),
        }
    }
}

impl Reservation {
    /// Gives back what the reservation holds beyond `bytes` (a Get that reserved an
    /// estimate of its block before fetching it).
    pub fn shrink_to(&mut self, bytes: u64) {
        let keep = permits_for(bytes);
        if keep >= self.permits {
            return;
        }
        let give = (self.permits - keep) as usize;
        for h in &mut self.held {
            drop(h.split(give));
        }
        self.permits = keep;
    }
}

/// State shared by an [`IdleGuard`] and its watchdog (times in milliseconds since the
/// guard was made).
struct Shared<S> {
    inner: Mutex<Option<S>>,
    last_poll_ms: AtomicU64,
    /// The last poll found the inner stream itself not ready (the server fetching a
    /// block): the client is not idle then.
    waiting_on_server: AtomicBool,
    expired: AtomicBool,
    /// Polled after it expired: the client was (or is being) told.
    told: AtomicBool,
    start: tokio::time::Instant,
}

/// A response stream that is dropped when the client stops reading it for `idle`.
///
/// `on_expire` runs when it is dropped so; `on_stuck` when, another `idle` later, the
/// server has still not polled the stream to tell the client (its HTTP/2 window stayed
/// shut): the caller closes the connection then ([`ConnInfo::abort`]).
///
/// A watchdog task holds only a weak reference: it wakes every `idle`, and when the
/// stream has not been polled since, drops the inner stream (the block it pins is
/// freed), so the next poll yields DEADLINE_EXCEEDED. The lock is only taken inside
/// `poll_next` and by the watchdog, never across an await.
pub struct IdleGuard<S> {
    shared: Arc<Shared<S>>,
    /// Told when the guard goes (the stream ended or the client left), so the watchdog
    /// ends at once instead of sleeping out its timeout: a client making many short
    /// gets must not leave a timeout's worth of sleeping tasks behind.
    closed: Arc<tokio::sync::Notify>,
    idle: Duration,
    what: &'static str,
    errored: bool,
}

impl<S: Send + 'static> IdleGuard<S> {
    pub fn new(
        inner: S,
        idle: Duration,
        what: &'static str,
        on_expire: impl FnOnce() + Send + 'static,
        on_stuck: impl FnOnce() + Send + 'static,
    ) -> Self {
        let shared = Arc::new(Shared {
            inner: Mutex::new(Some(inner)),
            last_poll_ms: AtomicU64::new(0),
            waiting_on_server: AtomicBool::new(false),
            expired: AtomicBool::new(false),
            told: AtomicBool::new(false),
            start: tokio::time::Instant::now(),
        });
        let weak: Weak<Shared<S>> = Arc::downgrade(&shared);
        let closed = Arc::new(tokio::sync::Notify::new());
        let watch_closed = closed.clone();
        tokio::spawn(async move {
            let mut deadline = tokio::time::Instant::now() + idle;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = watch_closed.notified() => return,
                }
                let Some(s) = weak.upgrade() else { return };
                let last = s.start + Duration::from_millis(s.last_poll_ms.load(Ordering::Relaxed));
                let now = tokio::time::Instant::now();
                if s.waiting_on_server.load(Ordering::Relaxed) {
                    deadline = now + idle;
                    continue;
                }
                if stalled(deadline, now) {
                    // The daemon was stopped: the client gets a moment to read on.
                    deadline = now + STALL_GRACE;
                    continue;
                }
                if last + idle <= now {
                    let dropped = s.inner.lock().take();
                    if dropped.is_none() {
                        return;
                    }
                    s.expired.store(true, Ordering::Relaxed);
                    drop(dropped);
                    break;
                }
                deadline = last + idle;
            }
            on_expire();
            // The client is told (DEADLINE_EXCEEDED) the next time the server polls the
            // stream; HTTP/2 does that only when the client's window has room. One that
            // keeps its window shut pins what the server already handed to HTTP/2 (a
            // chunk: a slice of the whole block) for as long as the connection lives,
            // and answers keepalive PINGs: its connection is closed if the stream is
            // still not polled another idle timeout on.
            tokio::select! {
                _ = tokio::time::sleep(idle) => {}
                _ = watch_closed.notified() => return,
            }
            if let Some(s) = weak.upgrade() {
                if !s.told.load(Ordering::Relaxed) {
                    on_stuck();
                }
            }
        });
        IdleGuard {
            shared,
            closed,
            idle,
            what,
            errored: false,
        }
    }
}

impl<T, S> Stream for IdleGuard<S>
where
    S: Stream<Item = std::result::Result<T, Status>> + Unpin,
{
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let now = self.shared.start.elapsed().as_millis() as u64;
        self.shared.last_poll_ms.store(now, Ordering::Relaxed);
        let r = {
            let mut inner = self.shared.inner.lock();
            match inner.as_mut() {
                Some(s) => {
                    let r = s.poll_next_unpin(cx);
                    self.shared
                        .waiting_on_server
                        .store(r.is_pending(), Ordering::Relaxed);
                    if let Poll::Ready(None) = r {
                        // Done: free the inner stream now, not when the body drops.
                        *inner = None;
                    }
                    Some(r)
                }
                None => None,
            }
        };
        if r.is_none() {
            self.shared.told.store(true, Ordering::Relaxed);
        }
        match r {
            Some(r) => r,
            None if self.shared.expired.load(Ordering::Relaxed) && !self.errored => {
                self.errored = true;
                Poll::Ready(Some(Err(Status::from(KvError::Idle {
                    what: self.what,
                    idle: self.idle,
                }))))
            }
            None => Poll::Ready(None),
        }
    }
}

impl<S> Drop for IdleGuard<S> {
    fn drop(&mut self) {
        // A permit is stored if the watchdog is not waiting yet: it still sees it.
        self.closed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The watchdog of a dropped guard ends at once, not after its idle timeout.
    #[tokio::test]
    async fn a_dropped_guard_ends_its_watchdog_at_once() {
        let inner = futures::stream::iter(vec![Ok::<_, Status>(1u8)]);
        let g = IdleGuard::new(
            Box::pin(inner),
            Duration::from_secs(3600),
            "get",
            || {},
            || {},
        );
        let closed = g.closed.clone();
        assert_eq!(
            Arc::strong_count(&closed),
            3,
            "guard, watchdog and this test"
        );
        drop(g);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(&closed) > 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "watchdog still alive"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn an_unread_stream_releases_what_it_pins_after_the_idle_timeout() {
        let pinned = Arc::new(vec![0u8; 1 << 20]);
        let held = pinned.clone();
        let inner = futures::stream::iter(vec![Ok::<_, Status>(1u8), Ok(2)]).map(move |x| {
            let _ = &held;
            x
        });
        let mut g = IdleGuard::new(
            Box::pin(inner),
            Duration::from_millis(200),
            "get",
            || {},
            || {},
        );
        assert_eq!(g.next().await.map(|r| r.is_ok()), Some(true));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(Arc::strong_count(&pinned), 2, "read recently: kept");
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(
            Arc::strong_count(&pinned),
            1,
            "unread past the timeout: dropped"
        );
        let e = g.next().await.expect("an error item").expect_err("idle");
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded);
        assert!(g.next().await.is_none());
    }

    /// Black-box finding (round 16): a stream mid-transfer across a 15 s SIGSTOP of the
    /// daemon was ended at the resume as idle. A watchdog that wakes past a stall (here
    /// the runtime's only thread blocked) gives the client a grace, not an error.
    #[tokio::test(flavor = "current_thread")]
    async fn a_daemon_stall_is_not_a_client_idle() {
        let inner = futures::stream::iter(vec![Ok::<_, Status>(1u8), Ok(2)]);
        let mut g = IdleGuard::new(
            Box::pin(inner),
            Duration::from_millis(200),
            "get",
            || {},
            || {},
        );
        assert_eq!(g.next().await.map(|r| r.is_ok()), Some(true));
        // The watchdog starts its wait.
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Every task stopped, as by SIGSTOP, past the idle timeout and the stall bound.
        std::thread::sleep(strata_cache_core::stall::STALL + Duration::from_millis(400));
        // The watchdog runs first.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            g.next().await.map(|r| r.ok()),
            Some(Some(2)),
            "read on after the stall"
        );
    }

    #[tokio::test]
    async fn a_reservation_covers_what_arrives_and_releases_on_drop() {
        let b = PutBudget::new(4 << 10);
        let conn = ConnInfo::new(2 << 10, 0);
        let mut r = b.reservation(Some(conn.clone()), None, Duration::from_millis(50));
        r.cover(1).await.expect("1 byte");
        assert_eq!(b.reserved_bytes(), 1 << 10);
        r.cover(2 << 10).await.expect("2 KiB");
        assert_eq!(b.reserved_bytes(), 2 << 10);
        let e = r
            .cover(3 << 10)
            .await
            .expect_err("over the connection's share");
        assert!(matches!(e, KvError::Busy(_)), "{e}");
        let mut other = b.reservation(None, None, Duration::from_millis(50));
        other
            .cover(2 << 10)
            .await
            .expect("other connections still get budget");
        drop(r);
        drop(other);
        assert_eq!(b.reserved_bytes(), 0);
        // A tenant's share caps it across connections.
        let tenant = semaphore(2 << 10);
        let mut t1 = b.reservation(None, Some(tenant.clone()), Duration::from_millis(50));
        let mut t2 = b.reservation(None, Some(tenant), Duration::from_millis(50));
        t1.cover(2 << 10).await.expect("the tenant's share");
        assert!(matches!(t2.cover(1).await, Err(KvError::Busy(_))));
        drop(t1);
        t2.cover(1).await.expect("freed");
    }

    #[tokio::test]
    async fn a_get_reservation_shrinks_to_its_block() {
        let b = InflightBudget::new(8 << 10);
        let conn = ConnInfo::new(0, 4 << 10);
        let mut r = b.get_reservation(Some(conn.clone()), None, Duration::from_millis(50));
        r.cover(4 << 10).await.expect("the estimate");
        let mut other = b.get_reservation(Some(conn.clone()), None, Duration::from_millis(50));
        assert!(
            other.cover(1 << 10).await.is_err(),
            "the connection's share"
        );
        r.shrink_to(1 << 10);
        assert_eq!(b.reserved_bytes(), 1 << 10);
        other.cover(3 << 10).await.expect("given back");
        r.cover(2 << 10).await.expect_err("full again");
        drop(other);
        r.cover(2 << 10).await.expect("grows again");
        assert_eq!(b.reserved_bytes(), 2 << 10);
        drop(r);
        assert_eq!(b.reserved_bytes(), 0);
    }
}
