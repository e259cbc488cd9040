//! The fault-injecting HTTP proxy in front of the S3 server. It lives in the bench
//! process, so it keeps its faults (and its record of them) across the daemon's kills.
//!
//! Per request, [`FaultPlan::decide`] (pure: a draw from the bench's seeded generator)
//! answers 500/503 at `error_rate`, delays `spike_rate` of the requests by a latency
//! spike, or forwards the request untouched. A background task alternates "up" and
//! "down" windows: while down, new connections are closed at once (the client's request
//! dies with its connection, as against a store that went away) and requests on connections already open are
//! answered 503. Every down window is recorded with its start and end, so the bench can
//! tell a read that failed while the store was down from one that should not have.

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderName, Request, Response, StatusCode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// What the proxy does to requests; see the bench's arguments for the defaults' reasons.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Fraction of requests answered with a 5xx instead of being forwarded.
    pub error_rate: f64,
    /// Fraction of (forwarded) requests delayed by a spike drawn from `spike_ms`.
    pub spike_rate: f64,
    pub spike_ms: Range<u64>,
    /// How long the store stays up between down windows, and how long each lasts
    /// (milliseconds; an empty `down_ms` disables down windows).
    pub up_ms: Range<u64>,
    pub down_ms: Range<u64>,
}

/// What happens to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answered with this 5xx status, not forwarded.
    Error(u16),
    /// Forwarded after this delay (0: at once).
    Forward(Duration),
}

impl FaultPlan {
    /// The fate of one request while the store is up. Pure: the randomness comes in.
    pub fn decide(&self, rng: &mut impl Rng) -> Fault {
        if rng.random_bool(self.error_rate.clamp(0.0, 1.0)) {
            // Both statuses S3 uses for "try again" (InternalError, SlowDown).
            return Fault::Error(if rng.random_bool(0.5) { 500 } else { 503 });
        }
        if !self.spike_ms.is_empty() && rng.random_bool(self.spike_rate.clamp(0.0, 1.0)) {
            return Fault::Forward(Duration::from_millis(
                rng.random_range(self.spike_ms.clone()),
            ));
        }
        Fault::Forward(Duration::ZERO)
    }
}

/// Counters of what the proxy did, for the report.
#[derive(Debug, Default)]
pub struct ProxyCounters {
    pub requests: AtomicU64,
    pub errors_injected: AtomicU64,
    pub spikes_injected: AtomicU64,
    pub answered_503_while_down: AtomicU64,
    pub connections_refused_while_down: AtomicU64,
    pub upstream_failures: AtomicU64,
}

/// A window during which the store was down (end None: still down).
#[derive(Clone, Copy, Debug)]
pub struct DownWindow {
    pub start: Instant,
    pub end: Option<Instant>,
}

/// The proxy's shared state: the plan, whether the store is down now, the windows so
/// far, the counters.
pub struct Faults {
    plan: FaultPlan,
    rng: Mutex<StdRng>,
    down: AtomicBool,
    windows: Mutex<Vec<DownWindow>>,
    pub counters: ProxyCounters,
}

impl Faults {
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// Whether the store was down at any moment of `[from, to]`.
    pub fn down_during(&self, from: Instant, to: Instant) -> bool {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        windows
            .iter()
            .any(|w| w.start <= to && w.end.is_none_or(|e| e >= from))
    }

    pub fn windows(&self) -> Vec<DownWindow> {
        self.windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_down(&self, down: bool) {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if down {
            windows.push(DownWindow {
                start: now,
                end: None,
            });
        } else if let Some(w) = windows.last_mut() {
            w.end.get_or_insert(now);
        }
        self.down.store(down, Ordering::Release);
    }

    fn decide(&self) -> Fault {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        self.plan.decide(&mut *rng)
    }
}

/// A running proxy; stops with its token.
pub struct FaultProxy {
    pub addr: SocketAddr,
    pub faults: Arc<Faults>,
    stop: CancellationToken,
}

impl FaultProxy {
    /// Starts the proxy on a free loopback port in front of `upstream`
    /// (`http://host:port`), with its down-window task.
    pub async fn start(upstream: &str, plan: FaultPlan, seed: u64) -> anyhow::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fault proxy")?;
        let addr = listener.local_addr()?;
        let faults = Arc::new(Faults {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            down: AtomicBool::new(false),
            windows: Mutex::new(Vec::new()),
            counters: ProxyCounters::default(),
            plan,
        });
        let stop = CancellationToken::new();
        let state = Arc::new(ProxyState {
            upstream: upstream.trim_end_matches('/').to_string(),
            client: reqwest::Client::builder()
                .no_proxy()
                .build()
                .context("building the proxy's HTTP client")?,
            faults: faults.clone(),
        });
        let app = axum::Router::new().fallback(forward).with_state(state);
        let refusing = RefusingListener {
            inner: listener,
            faults: faults.clone(),
        };
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(refusing, app)
                .with_graceful_shutdown(s.cancelled_owned())
                .await;
        });
        tokio::spawn(down_windows(faults.clone(), stop.clone(), seed ^ 0xD0_D0));
        Ok(FaultProxy { addr, faults, stop })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Alternates up and down windows until stopped; the store is up when it ends.
async fn down_windows(faults: Arc<Faults>, stop: CancellationToken, seed: u64) {
    let plan = faults.plan.clone();
    if plan.down_ms.is_empty() || plan.up_ms.is_empty() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(seed);
    loop {
        let up = Duration::from_millis(rng.random_range(plan.up_ms.clone()));
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(up) => {}
        }
        faults.set_down(true);
        let down = Duration::from_millis(rng.random_range(plan.down_ms.clone()));
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(down) => {}
        }
        faults.set_down(false);
        if stop.is_cancelled() {
            break;
        }
    }
}

/// Accepts connections, except while the store is down: then they are closed at once.
struct RefusingListener {
    inner: TcpListener,
    faults: Arc<Faults>,
}

impl axum::serve::Listener for RefusingListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.inner.accept().await {
                Ok((s, a)) => {
                    if self.faults.is_down() {
                        self.faults
                            .counters
                            .connections_refused_while_down
                            .fetch_add(1, Ordering::Relaxed);
                        // Closed before a byte is read: the client's request dies
                        // with the connection, as against a server that went away.
                        drop(s);
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    return (s, a);
                }
                // EMFILE and the like: back off briefly instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

struct ProxyState {
    upstream: String,
    client: reqwest::Client,
    faults: Arc<Faults>,
}

/// Headers that belong to one hop, not to the request or response.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "transfer-encoding" | "te" | "trailer" | "upgrade" | "host"
    )
}

fn status(code: u16) -> Response<Body> {
    let mut r = Response::new(Body::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InternalError</Code>\
         <Message>injected by the chaos proxy</Message></Error>",
    ));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r
}

async fn forward(State(p): State<Arc<ProxyState>>, req: Request<Body>) -> Response<Body> {
    let c = &p.faults.counters;
    c.requests.fetch_add(1, Ordering::Relaxed);
    if p.faults.is_down() {
        c.answered_503_while_down.fetch_add(1, Ordering::Relaxed);
        return status(503);
    }
    match p.faults.decide() {
        Fault::Error(code) => {
            c.errors_injected.fetch_add(1, Ordering::Relaxed);
            return status(code);
        }
        Fault::Forward(delay) if !delay.is_zero() => {
            c.spikes_injected.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
        }
        Fault::Forward(_) => {}
    }
    match relay(&p, req).await {
        Ok(r) => r,
        Err(_) => {
            c.upstream_failures.fetch_add(1, Ordering::Relaxed);
            status(502)
        }
    }
}

/// Sends `req` to the upstream server and returns its answer, bodies buffered (S3
/// requests and the bench's ranges are at most a few MiB).
async fn relay(p: &ProxyState, req: Request<Body>) -> anyhow::Result<Response<Body>> {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await?;
    let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let mut out = p
        .client
        .request(parts.method, format!("{}{path}", p.upstream))
        .body(body);
    for (name, value) in parts.headers.iter() {
        if !hop_by_hop(name) && name != "content-length" {
            out = out.header(name, value);
        }
    }
    let resp = out.send().await?;
    let mut r = Response::builder().status(resp.status());
    for (name, value) in resp.headers() {
        if !hop_by_hop(name) {
            r = r.header(name, value);
        }
    }
    let bytes = resp.bytes().await?;
    Ok(r.body(Body::from(bytes))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_injects_errors_and_spikes_at_about_their_rates() {
        let plan = FaultPlan {
            error_rate: 0.3,
            spike_rate: 0.1,
            spike_ms: 300..1500,
            up_ms: 0..0,
            down_ms: 0..0,
        };
        let mut rng = StdRng::seed_from_u64(7);
        let (mut errors, mut spikes, n) = (0, 0, 20_000);
        for _ in 0..n {
            match plan.decide(&mut rng) {
                Fault::Error(code) => {
                    assert!(code == 500 || code == 503);
                    errors += 1;
                }
                Fault::Forward(d) if !d.is_zero() => {
                    assert!((300..1500).contains(&(d.as_millis() as u64)));
                    spikes += 1;
                }
                Fault::Forward(_) => {}
            }
        }
        let err_rate = errors as f64 / n as f64;
        // Spikes are drawn among the requests not answered with an error.
        let spike_rate = spikes as f64 / (n - errors) as f64;
        assert!((0.28..0.32).contains(&err_rate), "{err_rate}");
        assert!((0.085..0.115).contains(&spike_rate), "{spike_rate}");
    }

    #[test]
    fn no_faults_forwards_everything_at_once() {
        let plan = FaultPlan {
            error_rate: 0.0,
            spike_rate: 0.0,
            spike_ms: 300..1500,
            up_ms: 0..0,
            down_ms: 0..0,
        };
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..1000 {
            assert_eq!(plan.decide(&mut rng), Fault::Forward(Duration::ZERO));
        }
    }
}
