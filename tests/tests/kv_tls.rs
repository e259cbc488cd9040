//! KV service end to end over TLS (rustls) with a bearer token: the configuration a
//! non-loopback address requires. Certificates: `kv_tls/` (test-only CA and leaf).

mod kv_common;

use std::path::PathBuf;

use kv_common::{block, memory_engine, TestServer};
use strata_kvcache::client::ClientOptions;
use strata_kvcache::server::{ServerConfig, TlsFiles};
use strata_kvcache::KvClient;

fn tls_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kv_tls")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_token_round_trip() {
    let cfg = ServerConfig {
        token: Some("tok".into()),
        tls: Some(TlsFiles {
            cert: tls_dir().join("server.pem"),
            key: tls_dir().join("server.key"),
        }),
        ..Default::default()
    };
    let server = TestServer::start(memory_engine(32 << 20), cfg).await;
    let port = server.addr.rsplit(':').next().expect("port");
    let url = format!("https://127.0.0.1:{port}");
    let opts = ClientOptions {
        token: Some("tok".into()),
        ca_cert: Some(tls_dir().join("ca.pem")),
        tls_domain: Some("localhost".into()),
        ..Default::default()
    };
    let mut c = KvClient::connect_with(&url, opts.clone())
        .await
        .expect("TLS connect");
    let data = block(3 << 20, 11);
    c.put("m/t", b"k", data.clone())
        .await
        .expect("put over TLS");
    assert!(c.get("m/t", b"k").await.expect("get").expect("hit") == data);

    // Without the token: refused, even over TLS.
    let no_token = ClientOptions {
        token: None,
        ..opts
    };
    let mut anon = KvClient::connect_with(&url, no_token)
        .await
        .expect("TLS connect");
    assert_eq!(
        anon.exists("m/t", b"k").await.expect_err("no token").code(),
        tonic::Code::Unauthenticated
    );

    // A plaintext client cannot talk to the TLS port.
    let plain = KvClient::connect(&server.addr).await;
    let refused = match plain {
        Err(_) => true,
        Ok(mut p) => p.ping().await.is_err(),
    };
    assert!(refused, "plaintext must not reach a TLS server");
    server.stop().await;
}
