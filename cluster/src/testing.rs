//! Test support (feature `testing`): a real etcd for the tests of this crate and of the
//! daemon: Debian's `etcd-server` (`/usr/bin/etcd`, installed by
//! scripts/install-deps.sh), started on free loopback ports with its own data dir and
//! killed when dropped. `STRATA_ETCD` names another binary. A missing binary fails the
//! test (never a skip). A port found free can be taken by another test's listener
//! before etcd binds it: a start that fails that way is tried again on other ports.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    bin: PathBuf,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding a free loopback port");
    l.local_addr().expect("local addr").port()
}

/// Starts on fresh ports after etcd found a port taken: up to 5 tries.
const START_TRIES: u32 = 5;

impl Etcd {
    /// Starts etcd and waits (at most 20 s) until it answers.
    pub fn start() -> Etcd {
        let bin = std::env::var_os("STRATA_ETCD")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"));
        assert!(
            bin.exists(),
            "etcd not found at {} (install Debian's etcd-server: scripts/install-deps.sh, \
             or set STRATA_ETCD to an etcd binary)",
            bin.display()
        );
        let mut tries = 0;
        loop {
            tries += 1;
            let mut e = Etcd {
                bin: bin.clone(),
                dir: tempfile::tempdir().expect("tempdir"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            };
            match e.try_restart() {
                Ok(()) => return e,
                Err(why) if tries < START_TRIES && why.contains("address already in use") => {}
                Err(why) => panic!("{why}"),
            }
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Writes `value` at `key` directly, as an operator's `etcdctl put` would (on a
    /// runtime of its own: callable from a test's thread).
    pub fn put_raw(&self, key: &str, value: &str) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut c = etcd_client::Client::connect([self.endpoint()], None)
                .await
                .expect("connect to etcd");
            c.put(key, value, None).await.expect("put");
        });
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Kills etcd (SIGKILL: a crash, not a clean stop) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills etcd, removes its data (a volume lost, a restore to an empty cluster) and
    /// starts it again on the same ports, empty, waiting until it answers.
    pub fn restart_empty(&mut self) {
        self.kill();
        if let Err(e) = std::fs::remove_dir_all(self.data_dir()) {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::NotFound,
                "removing etcd's data: {e}"
            );
        }
        self.restart();
    }

    /// Starts etcd again on the same ports and data dir and waits until it answers.
    pub fn restart(&mut self) {
        if let Err(why) = self.try_restart() {
            panic!("{why}");
        }
    }

    fn try_restart(&mut self) -> Result<(), String> {
        self.kill();
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("etcd log");
        let child = Command::new(&self.bin)
            .arg("--name=strata-test")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=strata-test={peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits until etcd answers; Err with its log's tail if it exits or takes over 20 s.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = format!("127.0.0.1:{}", self.client_port);
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return Err(format!("etcd exited ({status}):\n{}", self.log_tail()));
                }
            }
            // The health endpoint answers once the member has a leader and serves.
            if health(&url) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("etcd not ready in 20 s:\n{}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// `GET /health` over a plain TCP connection (no HTTP client in the dev-deps).
fn health(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("\"health\":\"true\"")
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client port another listener holds makes etcd exit, which `start` retries on
    /// other ports: the error must name the cause, not panic.
    #[test]
    fn a_taken_port_is_reported_for_a_retry() {
        let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut e = Etcd {
            bin: PathBuf::from("/usr/bin/etcd"),
            dir: tempfile::tempdir().expect("tempdir"),
            client_port: taken.local_addr().expect("addr").port(),
            peer_port: free_port(),
            child: None,
        };
        let why = e.try_restart().expect_err("the port is taken");
        assert!(why.contains("address already in use"), "{why}");
        // And `start` still comes up, on ports of its own.
        let etcd = Etcd::start();
        assert!(health(&etcd.endpoint()["http://".len()..]));
    }
}
