//! Keys bound to the model (issue 15, derivation v2) end to end: a namespace is bound
//! to the model identity of the first client that puts into it; a client of another
//! identity (revision, RoPE scaling, LoRA...) is refused on every call, never served
//! the first model's blocks; v1 clients (no identity) keep working; the binding
//! survives a restart; with tenants it lives in the tenant's own key space.

mod kv_common;

use kv_common::{block, memory_engine, TestServer};
use strata_kvcache::client::ClientOptions;
use strata_kvcache::keys::{chain_hashes_v2, ModelIdentity};
use strata_kvcache::server::ServerConfig;
use strata_kvcache::{KvClient, TenantConfig};
use tonic::Code;

const NS: &str = "llama3-8b/chat";

fn identity(revision: &str, lora: &str) -> ModelIdentity {
    ModelIdentity {
        model: "meta-llama/Llama-3-8B".into(),
        revision: revision.into(),
        kv_dtype: "bfloat16".into(),
        kv_layout: "NHD".into(),
        block_tokens: 16,
        tp_size: 1,
        pp_size: 1,
        lora: lora.into(),
        ..Default::default()
    }
}

async fn client(addr: &str, id: Option<&ModelIdentity>, token: Option<&str>) -> KvClient {
    KvClient::connect_with(
        addr,
        ClientOptions {
            identity: id.map(ModelIdentity::digest),
            token: token.map(String::from),
            ..Default::default()
        },
    )
    .await
    .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_model_identity_is_refused_and_the_binding_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ServerConfig {
        identity_file: Some(dir.path().join("kv-identities.json")),
        ..Default::default()
    };
    let engine = memory_engine(64 << 20);
    let server = TestServer::start(engine.clone(), config.clone()).await;
    let (r1, r2) = (identity("rev-1", ""), identity("rev-2", ""));
    let tokens: Vec<u32> = (0..64).collect();
    let keys = chain_hashes_v2(&r1.digest(), &tokens, 16, b"", false);
    let mut a = client(&server.addr, Some(&r1), None).await;
    let data = block(64 << 10, 7);
    for k in &keys {
        a.put(NS, k, data.clone()).await.expect("first put binds");
    }
    assert_eq!(a.match_prefix(NS, &keys).await.expect("prefix"), 4);

    // Same namespace, another revision (or a LoRA adapter): refused on every call,
    // even with the first model's exact keys.
    for other in [identity("rev-2", ""), identity("rev-1", "sql-adapter")] {
        let mut b = client(&server.addr, Some(&other), None).await;
        let e = b.get(NS, &keys[0]).await.expect_err("get");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
        assert!(e.to_string().contains(NS), "{e}");
        for e in [
            b.exists(NS, &keys[0]).await.expect_err("exists"),
            b.match_prefix(NS, &keys).await.expect_err("prefix"),
            b.put(NS, b"other-model-block", data.clone())
                .await
                .expect_err("put"),
            b.remove(NS, &keys[..1]).await.expect_err("remove"),
            b.batch_get(NS, &keys[..1]).await.expect_err("batch get"),
        ] {
            assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
        }
    }
    // rev-2 in its own namespace is fine; its v2 keys differ from rev-1's anyway.
    let mut b = client(&server.addr, Some(&r2), None).await;
    let keys2 = chain_hashes_v2(&r2.digest(), &tokens, 16, b"", false);
    assert!(keys2.iter().all(|k| !keys.contains(k)));
    b.put("llama3-8b-rev2/chat", &keys2[0], data.clone())
        .await
        .expect("own namespace");
    // A v1 client (no identity) is not checked.
    let mut v1 = client(&server.addr, None, None).await;
    assert_eq!(
        v1.get(NS, &keys[0]).await.expect("v1 get"),
        Some(data.clone())
    );
    server.stop().await;

    // Restarted on the same cache dir: the binding holds.
    let server = TestServer::start(engine, config).await;
    let mut b = client(&server.addr, Some(&r2), None).await;
    assert_eq!(
        b.get(NS, &keys[0]).await.expect_err("still bound").code(),
        Code::FailedPrecondition
    );
    let mut a = client(&server.addr, Some(&r1), None).await;
    assert_eq!(a.get(NS, &keys[0]).await.expect("a reads"), Some(data));
    server.stop().await;
}

/// Crash finding: a namespace bound less than a second after another lost its binding
/// to a kill -9 (the file was written at most once a second, and only on a later call),
/// while its acknowledged block survived, so another model then read it. Each put is
/// now acknowledged with its binding in the file: read here as a crash would leave it,
/// with the server still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_put_has_its_namespace_binding_on_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("kv-identities.json");
    let config = ServerConfig {
        identity_file: Some(file.clone()),
        ..Default::default()
    };
    let server = TestServer::start(memory_engine(64 << 20), config).await;
    let model = identity("rev-1", "");
    let mut a = client(&server.addr, Some(&model), None).await;
    for ns in ["m/one", "m/two", "m/three"] {
        a.put(ns, b"block-key", block(4 << 10, 1))
            .await
            .expect("put binds");
        let text = std::fs::read_to_string(&file).expect("bindings file");
        assert!(
            text.contains(ns),
            "{ns} acknowledged but not on disk: {text}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_identity_is_a_clear_error_and_tenants_bind_their_own_key_space() {
    let config = ServerConfig {
        tenants: vec![
            TenantConfig {
                name: "a".into(),
                token: "tok-a".into(),
                namespaces: vec!["llama3-*".into()],
                quota_bytes: 64 << 20,
            },
            TenantConfig {
                name: "b".into(),
                token: "tok-b".into(),
                namespaces: vec!["llama3-*".into()],
                quota_bytes: 64 << 20,
            },
        ],
        ..Default::default()
    };
    let server = TestServer::start(memory_engine(64 << 20), config).await;
    let data = block(64 << 10, 1);
    let (r1, r2) = (identity("rev-1", ""), identity("rev-2", ""));
    let mut a = client(&server.addr, Some(&r1), Some("tok-a")).await;
    a.put(NS, b"k", data.clone()).await.expect("a binds its ns");
    // b's key space is its own: b binds the same namespace name to another model.
    let mut b = client(&server.addr, Some(&r2), Some("tok-b")).await;
    b.put(NS, b"k", data.clone())
        .await
        .expect("b binds its own");
    let mut a2 = client(&server.addr, Some(&r2), Some("tok-a")).await;
    assert_eq!(
        a2.get(NS, b"k").await.expect_err("a's ns is rev-1").code(),
        Code::FailedPrecondition
    );

    // Metadata that is not a 64-digit hex digest: INVALID_ARGUMENT, before anything.
    let mut raw = strata_kvcache::pb::kv_cache_client::KvCacheClient::connect(format!(
        "http://{}",
        server.addr
    ))
    .await
    .expect("connect");
    let mut req = tonic::Request::new(strata_kvcache::pb::ExistsRequest {
        namespace: NS.into(),
        hash: b"k".to_vec().into(),
    });
    req.metadata_mut()
        .insert("authorization", "Bearer tok-a".parse().expect("ascii"));
    req.metadata_mut().insert(
        "strata-model-identity",
        "zz-not-hex".parse().expect("ascii"),
    );
    let e = raw.exists(req).await.expect_err("malformed identity");
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    server.stop().await;
}
