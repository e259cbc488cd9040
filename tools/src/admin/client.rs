//! The admin API's client side (`strata stats`, the cluster tools): a bounded HTTP/1.1
//! GET that names what answered when it is not a Strata admin API.

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{DaemonStats, TOKEN_ENV};

/// Fetches `GET /stats` from an admin endpoint (`host:port` or `http://host:port`).
pub async fn fetch_stats(endpoint: &str) -> anyhow::Result<DaemonStats> {
    let body = http_get(endpoint, "/stats").await?;
    serde_json::from_str(&body).with_context(|| format!("parsing /stats from {endpoint}"))
}

/// A minimal HTTP/1.1 GET (one request per connection): the admin API is local and
/// tiny, not worth an HTTP client dependency. Sends `$STRATA_ADMIN_TOKEN` when set.
pub async fn http_get(endpoint: &str, path: &str) -> anyhow::Result<String> {
    let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
    let (status, body) = http_request(endpoint, "GET", path, token.as_deref()).await?;
    if status != 200 {
        let hostport = endpoint.trim_start_matches("http://").trim_end_matches('/');
        bail!(
            "admin API at {hostport} answered {status}: {}{}",
            body.trim(),
            if status == 401 {
                format!(" (set {TOKEN_ENV})")
            } else {
                String::new()
            }
        );
    }
    Ok(body)
}

/// How long `strata stats` waits to connect to the admin API, and then for the whole
/// answer: 10 s. A live daemon answers in milliseconds (the handlers only snapshot
/// counters), loaded or not; an endpoint silent that long is not a working admin API,
/// and the CLI must say so rather than hang.
pub const ADMIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Largest admin answer read: 64 MiB. `/stats` and `/metrics` of a daemon with many
/// namespaces, tenants and streams are hundreds of KiB; an endpoint that sends more is
/// not the admin API, and reading it whole would grow the CLI without bound.
pub const MAX_ADMIN_ANSWER: u64 = 64 << 20;

/// One HTTP/1.1 request with an optional bearer token; the status code and body.
pub async fn http_request(
    endpoint: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    http_request_within(
        endpoint,
        method,
        path,
        token,
        ADMIN_TIMEOUT,
        MAX_ADMIN_ANSWER,
    )
    .await
}

/// As [`http_request`], connecting and then reading within `timeout` each, and reading
/// at most `max_answer` bytes.
pub async fn http_request_within(
    endpoint: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    timeout: std::time::Duration,
    max_answer: u64,
) -> anyhow::Result<(u16, String)> {
    let hostport = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let connect = tokio::net::TcpStream::connect(hostport);
    let mut s = match tokio::time::timeout(timeout, connect).await {
        Ok(r) => r.with_context(|| {
            format!("connecting to the admin API at {hostport} (is `strata serve` running?)")
        })?,
        Err(_) => bail!(
            "connecting to the admin API at {hostport}: no connection within {timeout:?} \
             (is `strata serve` running, and is this its admin address?)"
        ),
    };
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\n{auth}Content-Length: 0\r\n\
         Connection: close\r\n\r\n"
    );
    let exchange = async {
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        (&mut s).take(max_answer + 1).read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(buf)) => buf,
        Ok(Err(e)) => bail!("no Strata admin API at {hostport}: {e}"),
        Err(_) => bail!("no Strata admin API at {hostport}: no complete answer within {timeout:?}"),
    };
    if buf.len() as u64 > max_answer {
        bail!(
            "no Strata admin API at {hostport}: its answer exceeds {} bytes (the admin \
             API's are far smaller)",
            max_answer
        );
    }
    if !buf.starts_with(b"HTTP/1.") {
        bail!(
            "no Strata admin API at {hostport}: the answer ({} bytes) is not HTTP/1 (a \
             gRPC port, or another service?)",
            buf.len()
        );
    }
    let text = String::from_utf8(buf)
        .with_context(|| format!("admin API at {hostport} answered non-UTF-8"))?;
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("malformed HTTP answer from {hostport}")
    };
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .with_context(|| format!("malformed HTTP status line from {hostport}"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").context("bad chunk header")?;
        let n = usize::from_str_radix(size.trim(), 16).context("bad chunk size")?;
        if n == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..n).context("short chunk")?);
        body = rest.get(n + 2..).context("short chunk trailer")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    /// A local endpoint that accepts and then behaves as `serve` does with each
    /// connection.
    async fn bad_endpoint<F, Fut>(serve: F) -> String
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(serve(s));
            }
        });
        addr
    }

    async fn ask(addr: &str) -> String {
        let t = std::time::Instant::now();
        let r = http_request_within(
            addr,
            "GET",
            "/stats",
            None,
            std::time::Duration::from_millis(300),
            1 << 20,
        )
        .await;
        assert!(t.elapsed() < std::time::Duration::from_secs(3), "bounded");
        format!("{:#}", r.expect_err("not an admin API"))
    }

    #[tokio::test]
    async fn stats_gives_up_on_an_endpoint_that_never_answers() {
        let addr = bad_endpoint(|s| async move {
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            drop(s);
        })
        .await;
        let e = ask(&addr).await;
        assert!(
            e.contains(&format!("no Strata admin API at {addr}")) && e.contains("within"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn stats_caps_the_answer_of_an_endpoint_that_streams_forever() {
        let addr = bad_endpoint(|mut s| async move {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await;
            let chunk = vec![b'x'; 64 << 10];
            while s.write_all(&chunk).await.is_ok() {}
        })
        .await;
        let e = ask(&addr).await;
        assert!(
            e.contains(&format!("no Strata admin API at {addr}")) && e.contains("exceeds"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn stats_names_an_endpoint_that_is_not_http() {
        // An HTTP/2-only server (the gRPC port): its SETTINGS, then it closes once it
        // has read a request that is not its preface.
        let addr = bad_endpoint(|mut s| async move {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
        })
        .await;
        let e = ask(&addr).await;
        assert!(
            e.contains(&format!("no Strata admin API at {addr}")) && e.contains("not HTTP"),
            "{e}"
        );
    }
    #[test]
    fn chunked_bodies_are_reassembled() {
        assert_eq!(
            dechunk("4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n").unwrap(),
            "Wikipedia"
        );
        assert!(dechunk("zz\r\n").is_err());
    }
}
