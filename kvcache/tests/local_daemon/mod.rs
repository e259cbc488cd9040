//! A KV service serving on a Unix socket with its shared-memory side socket, in a temp
//! dir, stopped when dropped: the same-host tests' daemon.

use strata_kvcache::server::{serve, KvService};

pub struct LocalDaemon {
    pub addr: String,
    pub side: std::path::PathBuf,
    pub service: KvService,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for LocalDaemon {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Serves `service` (built with an arena, `ServerConfig::shm_bytes`) on `kv.sock` and
/// `kv-shm.sock` of a temp dir.
pub fn serve_locally(service: KvService) -> LocalDaemon {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("kv.sock");
    let side = dir.path().join("kv-shm.sock");
    let listener = tokio::net::UnixListener::bind(&sock).expect("bind");
    let side_listener = tokio::net::UnixListener::bind(&side).expect("bind side");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (tx2, rx2) = tokio::sync::oneshot::channel::<()>();
    let arena = service.shm_arena().expect("arena");
    tokio::spawn(strata_kvcache::shm::serve_side_socket(
        side_listener,
        arena,
        async move {
            let _ = rx2.await;
        },
    ));
    let svc = service.clone();
    tokio::spawn(async move {
        let _ = serve(listener, svc, async move {
            let _ = rx.await;
            let _ = tx2.send(());
        })
        .await;
    });
    LocalDaemon {
        addr: format!("unix://{}", sock.display()),
        side,
        service,
        _dir: dir,
        stop: Some(tx),
    }
}
