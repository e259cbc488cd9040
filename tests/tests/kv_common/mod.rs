//! Shared by the `kv_*` end-to-end tests: a KV server on 127.0.0.1:0 (or a Unix
//! socket) over a given engine, stopped through its shutdown future.

#![allow(dead_code)]

use std::sync::Arc;

use bytes::Bytes;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::CacheEngine;
use strata_kvcache::server::{self, KvService, ServerConfig};
use strata_kvcache::KvClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    /// `127.0.0.1:port` or `unix:///path`.
    pub addr: String,
    pub service: KvService,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), strata_kvcache::KvError>>>,
}

impl TestServer {
    pub async fn start(engine: CacheEngine, config: ServerConfig) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr").to_string();
        Self::spawn(listener.into(), addr, engine, config)
    }

    pub async fn start_unix(
        engine: CacheEngine,
        config: ServerConfig,
        path: &std::path::Path,
    ) -> TestServer {
        let listener = tokio::net::UnixListener::bind(path).expect("bind unix socket");
        Self::spawn(
            listener.into(),
            format!("unix://{}", path.display()),
            engine,
            config,
        )
    }

    fn spawn(
        listener: server::Listener,
        addr: String,
        engine: CacheEngine,
        config: ServerConfig,
    ) -> TestServer {
        let service = KvService::new(engine, config);
        let (tx, rx) = oneshot::channel::<()>();
        let svc = service.clone();
        let handle = tokio::spawn(async move {
            server::serve(listener, svc, async {
                let _ = rx.await;
            })
            .await
        });
        TestServer {
            addr,
            service,
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }

    /// Graceful shutdown; panics if the server ended with an error.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(std::time::Duration::from_secs(10), h)
                .await
                .expect("server stops within 10 s")
                .expect("server task joins")
                .expect("server ran without error");
        }
    }
}

pub fn memory_engine(bytes: u64) -> CacheEngine {
    CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(bytes)))
        .build()
        .expect("engine builds")
}

/// Deterministic, seed-dependent content (so a mixed-up block is detected).
pub fn block(size: usize, seed: u64) -> Bytes {
    Bytes::from(strata_cache_core::testdata::xorshift_bytes(size, seed))
}

/// Reads `hash` in `ns`, which must be a hit (`what` says why it should be).
pub async fn get_hit(c: &mut KvClient, ns: &str, hash: &[u8], what: &str) -> Bytes {
    c.get(ns, hash).await.expect("get").expect(what)
}

pub fn hash(i: u64) -> Vec<u8> {
    let mut h = b"test-key-".to_vec();
    h.extend_from_slice(&i.to_be_bytes());
    h
}
