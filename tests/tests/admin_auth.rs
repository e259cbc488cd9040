//! The admin API's access rule (issue 12, finding 3): with an admin token every
//! endpoint but /healthz needs it; without one the API is read-only and loopback-only;
//! tenants require an admin token; the daemon's KV socket is private to its user.

mod admin_common;

use std::time::{Duration, Instant};

use strata_tools::admin::{self, http_request};
use strata_tools::config::{AdminConfig, CacheConfig, KvConfig, KvTenantConfig, StrataConfig};
use tokio_util::sync::CancellationToken;

async fn start(token: Option<&str>) -> (String, CancellationToken) {
    serve(admin_common::bare_state(token)).await
}

/// The admin API of `state` on a loopback port: its address and its stop.
async fn serve(state: admin::AdminState) -> (String, CancellationToken) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move { admin::serve(l, state, s.cancelled_owned()).await });
    (addr, stop)
}

async fn status(addr: &str, method: &str, path: &str, token: Option<&str>) -> u16 {
    tokio::time::timeout(
        Duration::from_secs(5),
        http_request(addr, method, path, token),
    )
    .await
    .expect("answers within 5 s")
    .expect("request")
    .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_every_endpoint_but_healthz_needs_it() {
    let (addr, stop) = start(Some("adm")).await;
    assert_eq!(status(&addr, "GET", "/healthz", None).await, 200);
    for path in ["/stats", "/metrics"] {
        assert_eq!(status(&addr, "GET", path, None).await, 401, "{path}");
        assert_eq!(
            status(&addr, "GET", path, Some("nope")).await,
            401,
            "{path}"
        );
        assert_eq!(status(&addr, "GET", path, Some("adm")).await, 200, "{path}");
    }
    // A state-changing method without the token never reaches routing.
    assert_eq!(status(&addr, "POST", "/stats", None).await, 401);
    assert_eq!(status(&addr, "DELETE", "/anything", None).await, 401);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_api_is_read_only() {
    let (addr, stop) = start(None).await;
    assert_eq!(status(&addr, "GET", "/stats", None).await, 200);
    assert_eq!(status(&addr, "GET", "/metrics", None).await, 200);
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        assert_eq!(status(&addr, method, "/stats", None).await, 403, "{method}");
    }
    stop.cancel();
}

#[test]
fn off_loopback_or_with_tenants_the_admin_api_needs_a_token() {
    let cfg = |listen: &str, token: Option<&str>| AdminConfig {
        listen: Some(listen.into()),
        token: token.map(String::from),
        token_file: None,
    };
    let tenants: &[&str] = &["tok-a", "tok-b"];
    let e = admin::plan(&cfg("0.0.0.0:0", None), &[]).expect_err("refused");
    assert!(format!("{e:#}").contains("admin token"), "{e:#}");
    assert!(admin::plan(&cfg("0.0.0.0:0", Some("adm")), &[]).is_ok());
    assert!(admin::plan(&cfg("127.0.0.1:0", None), &[]).is_ok());
    let e = admin::plan(&cfg("127.0.0.1:0", None), tenants).expect_err("tenants");
    assert!(format!("{e:#}").contains("tenants"), "{e:#}");
    assert!(admin::plan(&cfg("127.0.0.1:0", Some("adm")), tenants).is_ok());
    assert!(admin::plan(&cfg("", None), tenants).expect("off").is_none());
    // Black-box finding: a tenant holding the admin token read every tenant's
    // namespaces from /stats and /metrics.
    let e = admin::plan(&cfg("127.0.0.1:0", Some("tok-b")), tenants).expect_err("shared");
    assert!(
        format!("{e:#}").contains("also a [[kv.tenants]] token"),
        "{e:#}"
    );
}

#[test]
fn the_daemon_with_tenants_serves_a_private_socket_and_a_guarded_admin_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let admin_addr = format!("127.0.0.1:{port}");
    let socket = dir.path().join("kv.sock");
    let cfg = StrataConfig {
        cache: CacheConfig {
            dir: Some(dir.path().to_path_buf()),
            memory: "16MiB".into(),
            disk: "0".into(),
            ..Default::default()
        },
        kv: KvConfig {
            listen: None,
            unix_socket: Some(socket.clone()),
            tenants: vec![KvTenantConfig {
                name: "a".into(),
                token: Some("tok-a".into()),
                namespaces: vec!["m-*".into()],
                quota: "1MiB".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
        admin: AdminConfig {
            listen: Some(admin_addr.clone()),
            token: Some("adm".into()),
            token_file: None,
        },
        ..Default::default()
    };
    let stop = CancellationToken::new();
    let task = rt.spawn(strata_tools::daemon::run(cfg, stop.clone()));
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        while http_request(&admin_addr, "GET", "/healthz", None)
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "daemon did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&socket)
            .expect("socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
        let (code, _) = http_request(&admin_addr, "GET", "/stats", None)
            .await
            .expect("request");
        assert_eq!(code, 401);
        let (code, body) = http_request(&admin_addr, "GET", "/stats", Some("adm"))
            .await
            .expect("request");
        assert_eq!(code, 200, "{body}");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("daemon stops")
            .expect("joins")
            .expect("daemon ran without error");
    });
}

/// Black-box finding: with one of its mounts unmounted from outside (`umount -l`), a
/// daemon ran on without it and /healthz, the DaemonSet's liveness and readiness
/// probe, still said ok. It says 503 now, naming the mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_fails_while_a_mount_is_unmounted_from_outside() {
    let mut state = admin_common::bare_state(None);
    state.mounts = vec![admin::MountInfo {
        mountpoint: "/mnt/data".into(),
        prefix: String::new(),
        stats: None,
    }];
    let unmounted: std::sync::Arc<[std::sync::atomic::AtomicBool]> =
        std::sync::Arc::new([std::sync::atomic::AtomicBool::new(false)]);
    state.unmounted = unmounted.clone();
    let (addr, stop) = serve(state).await;
    assert_eq!(status(&addr, "GET", "/healthz", None).await, 200);
    unmounted[0].store(true, std::sync::atomic::Ordering::Relaxed);
    let (code, body) = http_request(&addr, "GET", "/healthz", None)
        .await
        .expect("request");
    assert_eq!(code, 503);
    assert!(body.contains("/mnt/data"), "{body}");
    stop.cancel();
}
