//! KV service end to end against hostile or broken clients (issue 12, finding 4): one
//! stalled client must not block everyone. Stalled Put streams hold only what they
//! sent, are aborted after the idle timeout and release it; one connection cannot take
//! the whole put budget; a Get the client never reads is dropped after the idle timeout,
//! and the connection of one whose HTTP/2 window stays shut is closed. Connections that
//! send nothing are closed after the preface deadline, on the KV and the admin
//! listeners, and each listener keeps at most its cap of connections; connections that
//! never pass authentication make room for clients that do. `strata stats` pointed at
//! the gRPC port says it is no admin API.

mod admin_common;
mod kv_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use kv_common::{block, memory_engine, TestServer};
use strata_kvcache::pb;
use strata_kvcache::pb::kv_cache_client::KvCacheClient;
use strata_kvcache::server::ServerConfig;
use strata_kvcache::{KvClient, KvService};
use tonic::Code;

const NS: &str = "m/t";

/// A Put stream that declares `declared` bytes, sends `sent` of them, then stalls
/// (keeps the stream open and sends nothing more).
fn stalled_put(
    hash: Vec<u8>,
    declared: u64,
    sent: usize,
) -> impl futures::Stream<Item = pb::PutRequest> + Send + 'static {
    let chunks: Vec<Bytes> = {
        let data = block(sent, 99);
        let mut v = Vec::new();
        let mut off = 0;
        while off < sent {
            let end = (off + (1 << 20)).min(sent);
            v.push(data.slice(off..end));
            off = end;
        }
        v
    };
    let msgs: Vec<pb::PutRequest> = chunks
        .into_iter()
        .enumerate()
        .map(|(i, d)| pb::PutRequest {
            namespace: if i == 0 { NS.into() } else { String::new() },
            hash: if i == 0 {
                Bytes::from(hash.clone())
            } else {
                Bytes::new()
            },
            size: if i == 0 { declared } else { 0 },
            data: d,
        })
        .collect();
    futures::stream::iter(msgs).chain(futures::stream::pending())
}

/// A stalled put's task: its outcome once the server ends the stream.
type Stalled = tokio::task::JoinHandle<Result<pb::PutResponse, tonic::Status>>;

/// Starts `n` stalled puts on `client`'s connection; their outcomes come back through
/// the handles.
fn start_stalled(
    client: &KvClient,
    tag: &str,
    n: usize,
    declared: u64,
    sent: usize,
) -> Vec<Stalled> {
    (0..n)
        .map(|i| {
            let mut c = client.clone();
            let hash = format!("stalled-{tag}-{i}").into_bytes();
            tokio::spawn(async move {
                c.raw()
                    .put(stalled_put(hash, declared, sent))
                    .await
                    .map(|r| r.into_inner())
            })
        })
        .collect()
}

/// A client of `addr` sending bearer token `token`.
async fn connect(addr: &str, token: &str) -> KvClient {
    KvClient::connect_with(
        addr,
        strata_kvcache::client::ClientOptions {
            token: Some(token.into()),
            ..Default::default()
        },
    )
    .await
    .expect("connect")
}

/// Tenant `name` (token `tok-<name>`) allowed namespace [`NS`], with room to spare.
fn tenant(name: &str) -> strata_kvcache::TenantConfig {
    strata_kvcache::TenantConfig {
        name: name.into(),
        token: format!("tok-{name}"),
        namespaces: vec![NS.into()],
        quota_bytes: 1 << 30,
    }
}

/// A test server on a 256 MiB memory cache.
async fn start(cfg: ServerConfig) -> TestServer {
    TestServer::start(memory_engine(256 << 20), cfg).await
}

/// A server whose idle timeout (300 ms) a test can wait out.
async fn start_short_idle() -> TestServer {
    start(ServerConfig {
        idle_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await
}

/// Aborts the stalled puts still waiting, then stops the server.
async fn stop(server: TestServer, stalled: Vec<Stalled>) {
    for h in stalled {
        h.abort();
    }
    server.stop().await;
}

/// Puts a block that must get budget despite the stalled puts (`what`): within 5 s.
async fn put_within_5s(c: &mut KvClient, hash: &[u8], data: Bytes, what: &str) {
    tokio::time::timeout(Duration::from_secs(5), c.put(NS, hash, data))
        .await
        .expect(what)
        .expect("put");
}

/// Waits (at most 10 s) until `cond` holds for the service's stats.
async fn wait_for(
    service: &KvService,
    what: &str,
    cond: impl Fn(&strata_kvcache::KvStatsSnapshot) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = service.stats();
        if cond(&s) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the puts in flight hold most of `share` (a stream past its first MiB
/// reserves its whole size, so the share may stop short of full), gives the others
/// time to try for more, and checks they got no more: `who` holds at most its share.
async fn assert_holds_at_most(service: &KvService, share: u64, who: &str) {
    wait_for(service, "the share taken", |s| {
        s.put_reserved_bytes > share / 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held = service.stats().put_reserved_bytes;
    assert!(held <= share, "{who} holds at most its share: {held}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_stalled_puts_do_not_block_a_normal_put() {
    // Defaults (1 GiB budget, 10 s idle timeout): the reproduction of finding 4.
    let server = start(ServerConfig::default()).await;
    // 20 streams over 4 connections, each declaring 64 MiB and sending one byte.
    let mut stalled = Vec::new();
    for conn in 0..4 {
        let c = KvClient::connect(&server.addr).await.expect("connect");
        stalled.extend(start_stalled(&c, &conn.to_string(), 5, 64 << 20, 1));
    }
    // All 20 have reached the server (each reserved the one KiB it sent).
    wait_for(&server.service, "20 stalled puts", |s| {
        s.put_reserved_bytes >= 20 * 1024
    })
    .await;
    let mut good = KvClient::connect(&server.addr).await.expect("connect");
    let data = block(1 << 20, 7);
    let t = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), good.put(NS, b"good", data.clone())).await;
    let took = t.elapsed();
    eprintln!("1 MiB put with 20 stalled streams: {took:?}");
    r.expect("the normal put is not blocked by the stalled ones")
        .expect("the normal put succeeds");
    assert!(took < Duration::from_secs(2), "put took {took:?}");
    assert!(good.get(NS, b"good").await.expect("get").expect("hit") == data);
    for h in &stalled {
        assert!(!h.is_finished(), "stalled puts wait for their idle timeout");
    }
    stop(server, stalled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_put_is_aborted_after_the_idle_timeout_and_releases_its_budget() {
    let server = start_short_idle().await;
    let c = KvClient::connect(&server.addr).await.expect("connect");
    let t = Instant::now();
    let handles = start_stalled(&c, "idle", 3, 64 << 20, 256 << 10);
    for h in handles {
        let e = tokio::time::timeout(Duration::from_secs(5), h)
            .await
            .expect("the stalled put ends within 5 s")
            .expect("task joins")
            .expect_err("a stalled put fails");
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
        assert!(e.message().contains("idle"), "{e:?}");
    }
    assert!(t.elapsed() >= Duration::from_millis(300));
    let s = server.service.stats();
    assert_eq!(s.put_reserved_bytes, 0, "the reservations are released");
    assert_eq!(s.idle_aborted, 3);
    let mut c2 = c.clone();
    assert!(
        !c2.exists(NS, b"stalled-idle-0").await.expect("exists"),
        "nothing of an aborted put is stored"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_cannot_take_the_whole_put_budget() {
    let cfg = ServerConfig {
        max_block: 4 << 20,
        max_inflight_put_bytes: 16 << 20,
        per_connection_put_bytes: 8 << 20,
        ..Default::default()
    };
    let server = start(cfg).await;
    // Ten streams on one connection, each 2 of 4 declared MiB sent: 20 MiB if nothing
    // capped the connection, more than the whole 16 MiB budget.
    let hostile = KvClient::connect(&server.addr).await.expect("connect");
    let stalled = start_stalled(&hostile, "hog", 10, 4 << 20, 2 << 20);
    assert_holds_at_most(&server.service, 8 << 20, "one connection").await;
    let mut good = KvClient::connect(&server.addr).await.expect("connect");
    let data = block(4 << 20, 3);
    put_within_5s(
        &mut good,
        b"fair",
        data,
        "another connection still gets budget",
    )
    .await;
    stop(server, stalled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_take_the_whole_put_budget_over_many_connections() {
    let cfg = ServerConfig {
        max_block: 4 << 20,
        max_inflight_put_bytes: 16 << 20,
        per_connection_put_bytes: 4 << 20,
        per_tenant_put_bytes: 8 << 20,
        tenants: vec![tenant("a"), tenant("b")],
        ..Default::default()
    };
    let server = start(cfg).await;
    // Tenant a: four connections, each with a stream holding 2 of 4 declared MiB and
    // one more waiting: 16 MiB, the whole budget, without a tenant share.
    let mut stalled = Vec::new();
    for conn in 0..4 {
        let c = connect(&server.addr, "tok-a").await;
        for i in 0..2 {
            let mut c = c.clone();
            let hash = format!("hog-{conn}-{i}").into_bytes();
            stalled.push(tokio::spawn(async move {
                let mut req = tonic::Request::new(stalled_put(hash, 4 << 20, 2 << 20));
                req.metadata_mut()
                    .insert("authorization", "Bearer tok-a".parse().expect("header"));
                c.raw().put(req).await.map(|r| r.into_inner())
            }));
        }
    }
    assert_holds_at_most(&server.service, 8 << 20, "one tenant").await;
    let mut b = connect(&server.addr, "tok-b").await;
    let data = block(4 << 20, 4);
    put_within_5s(&mut b, b"b-block", data, "tenant b still gets budget").await;
    stop(server, stalled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_the_client_never_reads_is_dropped_after_the_idle_timeout() {
    let server = start_short_idle().await;
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    let size = 16usize << 20;
    c.put(NS, b"big", block(size, 1)).await.expect("put");
    // A plain channel with HTTP/2's 64 KiB default windows: the server can send little
    // before the client reads.
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut raw = KvCacheClient::new(ch).max_decoding_message_size(8 << 20);
    let mut stream = raw
        .get(pb::GetRequest {
            namespace: NS.into(),
            hash: Bytes::from_static(b"big"),
        })
        .await
        .expect("get starts")
        .into_inner();
    let first = stream.message().await.expect("first").expect("a message");
    assert_eq!(first.size, size as u64);
    // The block is removed; only the unread stream still refers to it.
    assert_eq!(c.remove(NS, &[b"big"]).await.expect("remove"), 1);
    wait_for(&server.service, "the unread get dropped", |s| {
        s.idle_aborted == 1
    })
    .await;
    let mut got = first.data.len();
    let err = loop {
        match stream.message().await {
            Ok(Some(m)) => got += m.data.len(),
            Ok(None) => panic!("the stream ended normally after {got} bytes"),
            Err(e) => break e,
        }
    };
    assert!(
        got < size,
        "the rest of the block was dropped ({got} bytes came)"
    );
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    // The service keeps serving.
    c.put(NS, b"after", block(1 << 20, 2)).await.expect("put");
    server.stop().await;
}

/// Reads `s` until the server closes it (EOF or a reset), for at most `within`;
/// returns how long that took. Whatever the server sent first (its HTTP/2 SETTINGS) is
/// skipped.
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> Duration {
    use tokio::io::AsyncReadExt;
    let t = Instant::now();
    let mut buf = vec![0u8; 64 << 10];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the server closes the connection in time");
    t.elapsed()
}

/// A listener full of connections that never send a byte keeps no client out: the
/// newcomer takes the oldest silent one's slot (that one is closed at once), and the
/// other silent ones are closed at their deadline. (Before, the newcomer was refused
/// until the silent ones timed out, so a flood renewed every 10 s locked clients out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_and_make_room_for_clients() {
    let cap = 8;
    let deadline = Duration::from_secs(2);
    let server = start(ServerConfig {
        max_connections: cap,
        preface_timeout: deadline,
        ..Default::default()
    })
    .await;
    // A normal client holds one slot.
    let mut good = KvClient::connect(&server.addr).await.expect("connect");
    good.put(NS, b"k", block(64 << 10, 5)).await.expect("put");
    // The others are taken by connections that never send a byte.
    let filled = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..cap - 1 {
        silent.push(
            tokio::net::TcpStream::connect(&server.addr)
                .await
                .expect("connect"),
        );
    }
    // A new client is served at once, well before any silent one's deadline...
    let mut late = tokio::time::timeout(deadline / 2, async {
        let mut c = KvClient::connect(&server.addr).await.expect("connect");
        assert!(c.get(NS, b"k").await.expect("get").is_some());
        c
    })
    .await
    .expect("a client gets in while the listener is full of silent connections");
    // ...in the slot of the oldest silent connection, closed at once.
    let took = closed_within(&mut silent[0], deadline).await;
    assert!(took < deadline / 2, "evicted at once: {took:?}");
    // The client already connected is still served.
    assert!(good.get(NS, b"k").await.expect("get").is_some());
    // The other silent ones are closed at the deadline (not before).
    for s in &mut silent[1..] {
        closed_within(s, Duration::from_secs(10)).await;
    }
    let took = filled.elapsed();
    assert!(
        took >= deadline - Duration::from_millis(200),
        "closed only at the deadline: {took:?}"
    );
    assert!(late.get(NS, b"k").await.expect("get").is_some());
    assert!(good.get(NS, b"k").await.expect("get").is_some());
    server.stop().await;
}

/// Black-box finding: 1,100 connections that sent the HTTP/2 preface and SETTINGS (no
/// token needed for that) and then no request, renewed as the daemon closed them, held
/// the KV listener's slots, and clients with the token were refused most of the time.
/// Now a connection keeps its slot under pressure only once a request on it passed
/// authentication: the flood, and a client whose token is wrong, make room for clients
/// whose token is right, and a client served before the flood stays served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_authenticate_make_room_for_clients_that_do() {
    use tokio::io::AsyncWriteExt;
    let cap = 8;
    let server = start(ServerConfig {
        token: Some("tok".into()),
        max_connections: cap,
        ..Default::default()
    })
    .await;
    let mut before = connect(&server.addr, "tok").await;
    before.put(NS, b"k", block(64 << 10, 5)).await.expect("put");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(h2_frame(4, 0, 0, &[])); // SETTINGS
    hello.extend(h2_frame(4, 1, 0, &[])); // SETTINGS ACK
    let mut flood = Vec::new();
    for round in 0..3 {
        // The listener is filled again with connections that started HTTP/2 and stop.
        for _ in 0..cap {
            let mut s = tokio::net::TcpStream::connect(&server.addr)
                .await
                .expect("connect");
            s.write_all(&hello).await.expect("write");
            flood.push(s);
        }
        let mut wrong = connect(&server.addr, "wrong").await;
        let e = wrong.get(NS, b"k").await.expect_err("a wrong token");
        assert_eq!(e.code(), Code::Unauthenticated, "{e}");
        let mut c = tokio::time::timeout(Duration::from_secs(5), connect(&server.addr, "tok"))
            .await
            .expect("connected in time");
        let got = tokio::time::timeout(Duration::from_secs(5), c.get(NS, b"k"))
            .await
            .expect("served in time");
        assert!(got
            .unwrap_or_else(|e| panic!("round {round}: refused while full: {e}"))
            .is_some());
    }
    // The oldest flood connection was closed at once to make room, not at the preface
    // deadline (10 s).
    closed_within(&mut flood[0], Duration::from_secs(3)).await;
    assert!(before.get(NS, b"k").await.expect("get").is_some());
    drop(flood);
    server.stop().await;
}

/// One HTTP/2 frame.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The HEADERS and DATA frames of a Get of `hash` on `stream` (HPACK literals without
/// indexing, no Huffman coding).
fn raw_get(stream: u32, hash: &[u8]) -> Vec<u8> {
    let mut hdrs = Vec::new();
    for (n, v) in [
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", strata_kvcache::wire::GET_PATH.as_bytes()),
        (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ] {
        hdrs.push(0);
        hdrs.push(n.len() as u8);
        hdrs.extend_from_slice(n);
        hdrs.push(v.len() as u8);
        hdrs.extend_from_slice(v);
    }
    let mut msg = vec![0x0a, NS.len() as u8];
    msg.extend_from_slice(NS.as_bytes());
    msg.extend_from_slice(&[0x12, hash.len() as u8]);
    msg.extend_from_slice(hash);
    let mut body = vec![0];
    body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    body.extend_from_slice(&msg);
    let mut out = h2_frame(1, 4, stream, &hdrs); // HEADERS, END_HEADERS
    out.extend(h2_frame(0, 1, stream, &body)); // DATA, END_STREAM
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_opens_its_window_to_a_get_is_closed() {
    use tokio::io::AsyncWriteExt;
    let server = start_short_idle().await;
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    c.put(NS, b"big", block(4 << 20, 1)).await.expect("put");
    c.put(NS, b"small", block(64 << 10, 2)).await.expect("put");
    // A raw HTTP/2 client whose streams get a zero window: the server can send them
    // nothing, so their responses are never polled past the first message and the
    // idle guard cannot even tell the client; only closing the connection frees what
    // HTTP/2 holds for them.
    let mut s = tokio::net::TcpStream::connect(&server.addr)
        .await
        .expect("connect");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(h2_frame(4, 0, 0, &[0, 4, 0, 0, 0, 0])); // INITIAL_WINDOW_SIZE = 0
    hello.extend(raw_get(1, b"big"));
    hello.extend(raw_get(3, b"small"));
    s.write_all(&hello).await.expect("write");
    let took = closed_within(&mut s, Duration::from_secs(10)).await;
    eprintln!("connection with unread gets closed after {took:?}");
    assert!(
        took >= Duration::from_millis(600),
        "not before twice the idle timeout: {took:?}"
    );
    let st = server.service.stats();
    assert_eq!(st.idle_aborted, 2, "{st:?}");
    assert_eq!(st.idle_connections_closed, 1, "{st:?}");
    // Everyone else is still served.
    assert!(c.get(NS, b"big").await.expect("get").is_some());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_closes_silent_connections_and_caps_them() {
    use strata_tools::admin;
    let state = admin_common::bare_state(None);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    let cap = 4;
    let deadline = Duration::from_secs(2);
    tokio::spawn(
        async move { admin::serve_gated(l, state, s.cancelled_owned(), cap, deadline).await },
    );
    let filled = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..cap {
        silent.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
    }
    // Full of silent connections, the API still answers at once, in the oldest one's
    // slot (that one is closed at once).
    let (code, _) = tokio::time::timeout(
        deadline / 2,
        admin::http_request(&addr, "GET", "/healthz", None),
    )
    .await
    .expect("served while full")
    .expect("served");
    assert_eq!(code, 200);
    let took = closed_within(&mut silent[0], deadline).await;
    assert!(took < deadline / 2, "evicted at once: {took:?}");
    for s in &mut silent[1..] {
        closed_within(s, Duration::from_secs(10)).await;
    }
    assert!(
        filled.elapsed() >= deadline - Duration::from_millis(200),
        "closed only at the deadline: {:?}",
        filled.elapsed()
    );
    let (code, _) = admin::http_request(&addr, "GET", "/healthz", None)
        .await
        .expect("served again");
    assert_eq!(code, 200);
    stop.cancel();
}

/// As on the KV listener: admin connections whose requests lack the token (answered
/// 401, kept alive by HTTP/1.1) make room for a client with the token, which is served
/// while the listener is full of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_makes_room_for_clients_with_the_token() {
    use strata_tools::admin;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let state = admin_common::bare_state(Some("adm"));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    let cap = 4;
    tokio::spawn(async move {
        admin::serve_gated(l, state, s.cancelled_owned(), cap, Duration::from_secs(10)).await
    });
    let mut flood = Vec::new();
    for round in 0..3 {
        for _ in 0..cap {
            let mut s = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            s.write_all(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .expect("write");
            let mut buf = [0u8; 12];
            s.read_exact(&mut buf).await.expect("an answer");
            assert_eq!(&buf, b"HTTP/1.1 401", "round {round}");
            flood.push(s);
        }
        let (code, _) = admin::http_request_within(
            &addr,
            "GET",
            "/stats",
            Some("adm"),
            Duration::from_secs(5),
            admin::MAX_ADMIN_ANSWER,
        )
        .await
        .unwrap_or_else(|e| panic!("round {round}: refused while full: {e:#}"));
        assert_eq!(code, 200);
    }
    closed_within(&mut flood[0], Duration::from_secs(3)).await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strata_stats_against_the_grpc_port_names_the_mistake() {
    let server = start(ServerConfig::default()).await;
    let e = tokio::time::timeout(
        Duration::from_secs(15),
        strata_tools::admin::http_request(&server.addr, "GET", "/stats", None),
    )
    .await
    .expect("bounded")
    .expect_err("not an admin API");
    let e = format!("{e:#}");
    assert!(
        e.contains(&format!("no Strata admin API at {}", server.addr)),
        "{e}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_gets_hold_at_most_their_connections_share_of_the_get_budget() {
    use tokio::io::AsyncWriteExt;
    let server = start(ServerConfig {
        max_block: 4 << 20,
        max_inflight_get_bytes: 8 << 20,
        per_connection_get_bytes: 4 << 20,
        idle_timeout: Duration::from_secs(1),
        ..Default::default()
    })
    .await;
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    for k in [&b"a"[..], b"b", b"c"] {
        c.put(NS, k, block(4 << 20, k[0] as u64))
            .await
            .expect("put");
    }
    // Three Gets no one reads (zero window) on one connection: one block's worth is
    // all the connection may hold; the others wait for budget.
    let mut s = tokio::net::TcpStream::connect(&server.addr)
        .await
        .expect("connect");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(h2_frame(4, 0, 0, &[0, 4, 0, 0, 0, 0]));
    hello.extend(raw_get(1, b"a"));
    hello.extend(raw_get(3, b"b"));
    hello.extend(raw_get(5, b"c"));
    s.write_all(&hello).await.expect("write");
    wait_for(&server.service, "the first get's reservation", |st| {
        st.get_reserved_bytes >= 4 << 20
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        server.service.stats().get_reserved_bytes,
        4 << 20,
        "one connection holds at most its share"
    );
    // Another connection still gets its block at once.
    let t = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(5), c.get(NS, b"b"))
        .await
        .expect("not blocked by the unread gets")
        .expect("get")
        .expect("hit");
    assert_eq!(got.len(), 4 << 20);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    // The unread connection is closed, and what it held released.
    closed_within(&mut s, Duration::from_secs(10)).await;
    wait_for(&server.service, "the budget released", |st| {
        st.get_reserved_bytes == 0
    })
    .await;
    server.stop().await;
}

/// The server's first frames on a new connection: its SETTINGS (id, value) and the
/// increment of its connection-level WINDOW_UPDATE.
async fn server_settings(addr: &str) -> (Vec<(u16, u32)>, u32) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(h2_frame(4, 0, 0, &[]));
    s.write_all(&hello).await.expect("write");
    let (mut settings, mut window) = (None, None);
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), async {
        while settings.is_none() || window.is_none() {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.expect("read");
            assert!(n > 0, "closed before its settings");
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= 9 {
                let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
                if buf.len() < 9 + len {
                    break;
                }
                let (kind, flags) = (buf[3], buf[4]);
                let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]);
                let p = buf[9..9 + len].to_vec();
                buf.drain(..9 + len);
                if kind == 4 && flags & 1 == 0 {
                    settings = Some(
                        p.chunks(6)
                            .map(|c| {
                                (
                                    u16::from_be_bytes([c[0], c[1]]),
                                    u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                                )
                            })
                            .collect::<Vec<_>>(),
                    );
                }
                if kind == 8 && stream == 0 {
                    window = Some(u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff);
                }
            }
        }
    })
    .await
    .expect("the server's settings within 5 s");
    (settings.unwrap_or_default(), window.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_http2_limits_are_what_the_server_announces() {
    for cfg in [
        ServerConfig::default(),
        ServerConfig {
            stream_window: 1 << 20,
            connection_window: 2 << 20,
            max_concurrent_streams: 16,
            ..Default::default()
        },
    ] {
        let server = start(cfg.clone()).await;
        let (settings, window) = server_settings(&server.addr).await;
        let get = |id: u16| settings.iter().find(|(i, _)| *i == id).map(|(_, v)| *v);
        assert_eq!(get(3), Some(cfg.max_concurrent_streams), "{settings:?}");
        assert_eq!(get(4), Some(cfg.stream_window), "{settings:?}");
        // The connection window starts at the protocol's 65,535 and is raised to the
        // configured one (what one connection may make the server buffer).
        assert_eq!(window, cfg.connection_window - 65_535);
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_stop_within_the_http2_preface_are_closed() {
    use tokio::io::AsyncWriteExt;
    let server = start(ServerConfig {
        preface_timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    // Half the preface; the whole preface but no SETTINGS: both stuck where the server
    // waits for more.
    let mut stuck = Vec::new();
    for start in [
        &b"PRI * HTTP/2.0\r\n"[..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ] {
        let mut s = tokio::net::TcpStream::connect(&server.addr)
            .await
            .expect("connect");
        s.write_all(start).await.expect("write");
        stuck.push(s);
    }
    let t = Instant::now();
    for s in &mut stuck {
        closed_within(s, Duration::from_secs(5)).await;
    }
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    // A client that starts properly is not closed at the deadline.
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    c.put(NS, b"k", block(64 << 10, 1)).await.expect("put");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(c.get(NS, b"k").await.expect("get").is_some());
    server.stop().await;
}

/// Black-box finding (round 11): puts that are sending reserved only what had arrived,
/// so 8 concurrent 64 MiB puts through a 256 MiB budget each held part of their size
/// and waited for more: none completed until the idle timeout refused half. A stream
/// past its first MiB reserves its whole size: every put completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_larger_than_the_budget_together_all_complete() {
    const SIZE: usize = 16 << 20;
    let cfg = ServerConfig {
        max_block: SIZE as u64,
        max_inflight_put_bytes: 2 * SIZE as u64,
        per_connection_put_bytes: 2 * SIZE as u64,
        idle_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let server = start(cfg).await;
    let start_together = Arc::new(tokio::sync::Barrier::new(8));
    let mut puts = Vec::new();
    for i in 0..8u64 {
        let mut c = KvClient::connect(&server.addr).await.expect("connect");
        let start_together = start_together.clone();
        let data = block(SIZE, i);
        puts.push(tokio::spawn(async move {
            let hash = format!("big-{i}").into_bytes();
            start_together.wait().await;
            c.put(NS, &hash, data).await.map(|_| ())
        }));
    }
    for (i, p) in puts.into_iter().enumerate() {
        tokio::time::timeout(Duration::from_secs(20), p)
            .await
            .expect("bounded")
            .expect("joins")
            .unwrap_or_else(|e| panic!("put {i} refused: {e}"));
    }
    let mut c = KvClient::connect(&server.addr).await.expect("connect");
    for i in 0..8u64 {
        let got = c
            .get(NS, format!("big-{i}").as_bytes())
            .await
            .expect("get")
            .expect("stored");
        assert!(got == block(SIZE, i), "put {i}'s bytes");
    }
    assert_eq!(server.service.stats().put_reserved_bytes, 0);
    server.stop().await;
}

/// Black-box finding (round 11): one tenant's Gets that its client never read, over
/// many connections (each within its connection's share), held the whole get budget,
/// and another tenant's Gets waited until they timed out. A tenant holds at most its
/// share: the other tenant's Get is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_unread_gets_leave_the_other_tenants_gets_served() {
    let server = start(ServerConfig {
        max_block: 4 << 20,
        max_inflight_get_bytes: 16 << 20,
        per_connection_get_bytes: 4 << 20,
        per_tenant_get_bytes: 8 << 20,
        idle_timeout: Duration::from_secs(3),
        tenants: vec![tenant("a"), tenant("b")],
        ..Default::default()
    })
    .await;
    let (mut a, mut b) = (
        connect(&server.addr, "tok-a").await,
        connect(&server.addr, "tok-b").await,
    );
    a.put(NS, b"a-block", block(4 << 20, 1)).await.expect("put");
    b.put(NS, b"b-block", block(4 << 20, 2)).await.expect("put");
    // Tenant b: four connections (HTTP/2's 64 KiB default windows), each with a Get of
    // its 4 MiB block never read: 16 MiB, the whole budget, without a tenant share.
    let mut unread = Vec::new();
    for _ in 0..4 {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut raw = KvCacheClient::new(ch).max_decoding_message_size(8 << 20);
        unread.push(tokio::spawn(async move {
            let mut req = tonic::Request::new(pb::GetRequest {
                namespace: NS.into(),
                hash: Bytes::from_static(b"b-block"),
            });
            req.metadata_mut()
                .insert("authorization", "Bearer tok-b".parse().expect("header"));
            let stream = raw.get(req).await.map(|r| r.into_inner());
            // Held, never read, until the test ends.
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(stream);
        }));
    }
    wait_for(&server.service, "tenant b's unread gets", |s| {
        s.get_reserved_bytes >= 8 << 20
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        server.service.stats().get_reserved_bytes <= 8 << 20,
        "tenant b holds at most its share"
    );
    let t = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(2), a.get(NS, b"a-block"))
        .await
        .expect("tenant a's get is not held up by tenant b's")
        .expect("get")
        .expect("hit");
    assert_eq!(got.len(), 4 << 20);
    eprintln!("tenant a's get beside b's unread gets: {:?}", t.elapsed());
    for h in unread {
        h.abort();
    }
    server.stop().await;
}

/// Black-box finding (round 14): a batch of Gets given up at its deadline resets all its
/// streams at once, before the server took them; past h2's default of 20 such streams
/// the server closed the connection (GOAWAY "too_many_resets") and the client's other
/// calls on it failed UNAVAILABLE. As many may be reset as may be open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_given_up_gets_does_not_close_the_connection() {
    let server = start(ServerConfig::default()).await;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let raw = KvCacheClient::new(ch).max_decoding_message_size(8 << 20);
    let mut put = raw.clone();
    put.ping(pb::PingRequest {}).await.expect("ping");
    for round in 0..20 {
        // 200 Gets sent and dropped at once: each resets its stream.
        let mut started = Vec::new();
        for i in 0..200u32 {
            let mut c = raw.clone();
            started.push(tokio::spawn(async move {
                let get = c.get(pb::GetRequest {
                    namespace: NS.into(),
                    hash: Bytes::from(i.to_be_bytes().to_vec()),
                });
                let _ = tokio::time::timeout(Duration::from_micros(1), get).await;
            }));
        }
        for h in started {
            h.await.expect("task");
        }
        put.ping(pb::PingRequest {})
            .await
            .unwrap_or_else(|e| panic!("round {round}: the connection is still served: {e}"));
    }
    server.stop().await;
}
