//! A local S3-compatible server (`moto_server`, from PyPI's `moto[server]`) started per
//! test on a free loopback port, with a bucket created, and killed on drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Credentials moto accepts (any work; these are conventional).
pub const ACCESS_KEY: &str = "testing";
pub const SECRET_KEY: &str = "testing";
pub const REGION: &str = "us-east-1";

pub struct MotoServer {
    child: Child,
    pub port: u16,
}

impl MotoServer {
    /// Starts `moto_server` on 127.0.0.1 and waits until it answers (at most 30 s).
    ///
    /// Panics with the install command if `moto_server` is not on PATH: CI installs it
    /// (`.ci/run`), and an S3 test must fail, not skip, when it is missing.
    pub fn start() -> MotoServer {
        let port = free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start moto_server ({e}); install it with: pip install 'moto[server]'"
                )
            });
        let server = MotoServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if http(port, "GET", "/", "").is_some() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("moto_server did not answer on port {port} within 30 s");
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Store options that reach this server with the test credentials, over plain HTTP.
    pub fn store_options(&self) -> strata_cache_core::StoreOptions {
        strata_cache_core::StoreOptions {
            endpoint: Some(self.endpoint()),
            region: Some(REGION.into()),
            access_key_id: Some(ACCESS_KEY.into()),
            secret_access_key: Some(SECRET_KEY.into()),
            allow_http: true,
            ..Default::default()
        }
    }

    /// Creates a bucket (moto accepts unsigned requests).
    pub fn create_bucket(&self, bucket: &str) {
        let status = http(self.port, "PUT", &format!("/{bucket}"), "").unwrap_or_default();
        assert!(
            status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.0 200"),
            "create bucket: {status}"
        );
    }
}

impl MotoServer {
    /// Puts object `key` (raw, as S3 takes it: a key ending in `/` is a console's
    /// "folder") with a small text body, past object_store's key checks.
    pub fn put_raw(&self, bucket: &str, key: &str, body: &str) {
        let status = http(self.port, "PUT", &format!("/{bucket}/{key}"), body).unwrap_or_default();
        assert!(status.contains(" 200"), "put {key}: {status}");
    }
}

impl MotoServer {
    /// Puts object `key` with `body` and extra request headers given as raw bytes (a
    /// store that keeps them as given echoes them so: non-ASCII UTF-8 included).
    pub fn put_with_headers(
        &self,
        bucket: &str,
        key: &str,
        body: &[u8],
        headers: &[(&str, &[u8])],
    ) {
        let response = http_raw(self.port, "PUT", &format!("/{bucket}/{key}"), headers, body)
            .unwrap_or_default();
        let status = String::from_utf8_lossy(&response);
        assert!(
            status.lines().next().is_some_and(|l| l.contains(" 200")),
            "put {key}: {status}"
        );
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free port")
}

/// Minimal HTTP/1.1 request; returns the status line.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let buf = http_raw(port, method, path, &[], body.as_bytes())?;
    let text = String::from_utf8_lossy(&buf);
    text.lines().next().map(str::to_string)
}

/// Minimal HTTP/1.1 request with extra headers; returns the whole response.
fn http_raw(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    )
    .into_bytes();
    for (name, value) in headers {
        req.extend_from_slice(name.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    s.write_all(&req).ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    Some(buf)
}
