//! A cache group on one machine, for the group's tests and `strata bench cluster`
//! (issue 16): a real etcd on loopback ports ([`strata_cluster::testing::Etcd`]) and N
//! real `strata serve` daemons as child processes, each with its own cache dir, admin,
//! KV and peer ports on loopback, optionally a FUSE mount, all over one shared store
//! (a local directory, or any store URL). Nodes can be killed with SIGKILL and
//! restarted on the same ports and cache dir (a warm disk tier); every wait is bounded.
//!
//! ```ignore
//! let mut g = Group::start(GroupSpec { binary, nodes: 3, ..GroupSpec::default() })?;
//! g.nodes[1].kill9();
//! g.nodes[1].restart()?;
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use strata_cluster::testing::Etcd;

use super::chaos::daemon::detach_mount;

/// What to start.
#[derive(Clone, Debug)]
pub struct GroupSpec {
    /// The `strata` binary (`env!("CARGO_BIN_EXE_strata")` in tests, the running
    /// binary in the bench).
    pub binary: PathBuf,
    pub nodes: usize,
    /// The shared store; None: a fresh directory ([`Group::store_dir`]), `file://`.
    pub store_url: Option<String>,
    /// A FUSE mount per node (of the whole store) at `<node dir>/mnt`.
    pub mounts: bool,
    /// Per-node tier budgets.
    pub memory: String,
    pub disk: String,
    pub block_size: String,
    /// A short TTL, so tests see a crashed node leave within seconds.
    pub lease_ttl_secs: u64,
    /// The group token (written to a 0600 file every node reads); None: no token.
    pub token: Option<String>,
    /// `[cluster] hedge_min_ms`: tests raise it so each block is read from the store
    /// exactly once even on a loaded machine.
    pub hedge_min_ms: u64,
    /// More lines of every node's `[store]` (`inject_latency_ms = 20`).
    pub store_toml: String,
    /// Each node in a group of its own (named after it): N independent nodes with
    /// the same config, the baseline the group is measured against.
    pub independent: bool,
    /// More TOML appended to every node's config (sections the caller adds: another
    /// helper's `[kv]` settings, a mount option).
    pub extra_toml: String,
    /// Environment of the daemons (store credentials, `RUST_LOG`).
    pub env: Vec<(String, String)>,
    pub ready_timeout: Duration,
}

impl Default for GroupSpec {
    fn default() -> Self {
        GroupSpec {
            binary: PathBuf::from("strata"),
            nodes: 3,
            store_url: None,
            mounts: true,
            memory: "64MiB".into(),
            disk: "256MiB".into(),
            block_size: "1MiB".into(),
            lease_ttl_secs: 2,
            token: Some("group-secret-for-tests".into()),
            hedge_min_ms: 2,
            store_toml: String::new(),
            independent: false,
            extra_toml: String::new(),
            env: Vec::new(),
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// A running group. Dropping it kills every daemon (SIGKILL), detaches their mounts and
/// stops etcd.
pub struct Group {
    pub etcd: Etcd,
    pub nodes: Vec<Node>,
    pub spec: GroupSpec,
    dir: tempfile::TempDir,
}

/// One daemon of the group: same ports, config and cache dir across restarts.
pub struct Node {
    pub id: String,
    pub index: usize,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    pub mountpoint: Option<PathBuf>,
    pub admin: String,
    pub peer: String,
    pub kv: String,
    binary: PathBuf,
    env: Vec<(String, String)>,
    ready_timeout: Duration,
    child: Option<Child>,
}

/// A free loopback port (bound then released: the daemon binds it right after).
pub fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding a free loopback port")?;
    Ok(l.local_addr()?.port())
}

impl Group {
    /// Starts etcd and the nodes (one after the other, each waited for) and waits
    /// until every node sees the whole group.
    pub fn start(spec: GroupSpec) -> anyhow::Result<Group> {
        let etcd = Etcd::start();
        let dir = tempfile::Builder::new().prefix("strata-group-").tempdir()?;
        let store_url = match &spec.store_url {
            Some(u) => u.clone(),
            None => {
                let d = dir.path().join("store");
                std::fs::create_dir_all(&d)?;
                format!("file://{}", d.display())
            }
        };
        let token_file = match &spec.token {
            Some(t) => {
                use std::os::unix::fs::OpenOptionsExt;
                let p = dir.path().join("group.token");
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .mode(0o600)
                    .open(&p)?;
                writeln!(f, "{t}")?;
                Some(p)
            }
            None => None,
        };
        let mut nodes = Vec::new();
        for i in 0..spec.nodes {
            let id = format!("node-{}", (b'a' + i as u8) as char);
            let ndir = dir.path().join(&id);
            std::fs::create_dir_all(&ndir)?;
            // A port `free_port` released can be taken before the daemon binds it (an
            // outgoing connection of a test running beside this one gets it as its
            // ephemeral port): a daemon that failed for that is started again on new
            // ports, twice at most.
            let mut attempt = 0;
            let node = loop {
                let (admin, peer, kv) = (free_port()?, free_port()?, free_port()?);
                let mountpoint = spec.mounts.then(|| ndir.join("mnt"));
                let mut toml = format!(
                "[store]\nurl = {store_url:?}\n{store_extra}\n\
                 [cache]\ndir = {cache:?}\nmemory = {mem:?}\ndisk = {disk:?}\nblock_size = {bs:?}\n\n\
                 [kv]\nlisten = \"127.0.0.1:{kv}\"\n\n\
                 [admin]\nlisten = \"127.0.0.1:{admin}\"\n\n\
                 [cluster]\netcd_endpoints = [{etcd:?}]\ngroup = {group:?}\nnode_id = {id:?}\n\
                 advertise = \"127.0.0.1:{peer}\"\nlisten = \"127.0.0.1:{peer}\"\n\
                 lease_ttl_secs = {ttl}\nhedge_min_ms = {hedge}\n",
                cache = ndir.join("cache").display().to_string(),
                mem = spec.memory,
                disk = spec.disk,
                bs = spec.block_size,
                etcd = etcd.endpoint(),
                ttl = spec.lease_ttl_secs,
                hedge = spec.hedge_min_ms,
                store_extra = spec.store_toml,
                group = if spec.independent { id.as_str() } else { "test" },
            );
                if let Some(t) = &token_file {
                    toml.push_str(&format!("token_file = {:?}\n", t.display().to_string()));
                }
                if let Some(m) = &mountpoint {
                    toml.push_str(&format!(
                        "\n[[mounts]]\nmountpoint = {:?}\n",
                        m.display().to_string()
                    ));
                }
                toml.push_str(&spec.extra_toml);
                let config = ndir.join("strata.toml");
                std::fs::write(&config, toml)?;
                let mut node = Node {
                    id: id.clone(),
                    index: i,
                    log: ndir.join("daemon.log"),
                    dir: ndir.clone(),
                    config,
                    mountpoint,
                    admin: format!("127.0.0.1:{admin}"),
                    peer: format!("127.0.0.1:{peer}"),
                    kv: format!("127.0.0.1:{kv}"),
                    binary: spec.binary.clone(),
                    env: spec.env.clone(),
                    ready_timeout: spec.ready_timeout,
                    child: None,
                };
                match node.restart() {
                    Ok(()) => break node,
                    Err(e) if attempt < 2 && node.log_says_address_in_use() => {
                        attempt += 1;
                        eprintln!(
                            "{}: a port was taken before the daemon bound it ({e:#}); new ports",
                            node.id
                        );
                    }
                    Err(e) => return Err(e),
                }
            };
            nodes.push(node);
        }
        let g = Group {
            etcd,
            nodes,
            spec,
            dir,
        };
        if !g.spec.independent {
            g.wait_members(g.nodes.len(), Duration::from_secs(20))?;
        }
        Ok(g)
    }

    /// The shared store's directory (when the group made it).
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// The group's etcd view as the membership code reads it.
    pub fn group_config(&self) -> strata_cluster::GroupConfig {
        let mut g = strata_cluster::GroupConfig::new(vec![self.etcd.endpoint()], "test");
        g.lease_ttl = Duration::from_secs(self.spec.lease_ttl_secs);
        g
    }

    /// Waits until etcd lists exactly `n` members (bounded).
    pub fn wait_members(&self, n: usize, within: Duration) -> anyhow::Result<()> {
        let cfg = self.group_config();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let deadline = Instant::now() + within;
        loop {
            let got = rt
                .block_on(async {
                    tokio::time::timeout(Duration::from_secs(3), strata_cluster::read_group(&cfg))
                        .await
                })
                .ok()
                .and_then(|r| r.ok())
                .map(|m| m.nodes.len());
            if got == Some(n) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("etcd lists {got:?} members, not {n}, after {within:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every running node's own view of the group (its `/stats`
    /// `cluster.members`, learnt from its etcd watch) lists exactly `n` members
    /// (bounded). etcd listing them is not enough for a test that needs the nodes to
    /// route by the new membership: under load a node's watch can lag by seconds.
    pub fn wait_views(&self, n: usize, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let lagging: Vec<&str> = self
                .nodes
                .iter()
                .filter(|node| node.is_running())
                .filter(|node| {
                    let members = node
                        .stats()
                        .ok()
                        .and_then(|s| s["cluster"]["members"].as_array().map(Vec::len));
                    members != Some(n)
                })
                .map(|node| node.id.as_str())
                .collect();
            if lagging.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{lagging:?} do not see {n} members after {within:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill9();
        }
    }
}

impl Node {
    /// Whether the daemon process is running (started and not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the daemon (again) on the same config, ports and cache dir, and waits
    /// for its `ready` line (bounded); a node still running is killed first.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill9();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut child = Command::new(&self.binary)
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} serve", self.binary.display()))?;
        let stdout = child.stdout.take().context("daemon stdout")?;
        self.child = Some(child);
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Keep draining after `ready`, so the daemon never blocks on stdout.
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + self.ready_timeout;
        // What the daemon printed before `ready` (its listen addresses), for the error.
        let mut printed = Vec::new();
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.trim() == "ready" => return Ok(()),
                Ok(line) => printed.push(line),
                Err(e) => {
                    // A daemon that closed its stdout early has usually exited: its status
                    // (a signal leaves no line in the log) says why.
                    let status = match self.child.as_mut().map(Child::try_wait) {
                        Some(Ok(Some(status))) => status.to_string(),
                        Some(Ok(None)) => "still running".to_string(),
                        Some(Err(err)) => format!("unknown: {err}"),
                        None => "not started".to_string(),
                    };
                    self.kill9();
                    bail!(
                        "{} not ready within {:?} ({e}; daemon {status}); stdout: {:?}; log:\n{}",
                        self.id,
                        self.ready_timeout,
                        printed,
                        self.log_lines_without_backtrace(30)
                    );
                }
            }
        }
    }

    /// `kill -9` (a crash: no lease revoked, no unmount), reaped; its dead mount
    /// detached. Nothing when not running.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(m) = &self.mountpoint {
            detach_mount(m);
        }
    }

    /// SIGTERM and a bounded wait for a clean exit (the node leaves the group at once).
    pub fn stop(&mut self, within: Duration) -> anyhow::Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = c.try_wait()? {
                if !status.success() {
                    bail!("{} exited with {status} on SIGTERM", self.id);
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        bail!("{} did not exit within {within:?} of SIGTERM", self.id)
    }

    /// `GET /stats` of the admin API as JSON (bounded by a 5 s socket timeout).
    pub fn stats(&self) -> anyhow::Result<serde_json::Value> {
        let body = http_get(&self.admin, "/stats")?;
        serde_json::from_str(&body).context("parsing /stats")
    }

    /// `GET /metrics` (Prometheus text).
    pub fn metrics(&self) -> anyhow::Result<String> {
        http_get(&self.admin, "/metrics")
    }

    /// Ranged GETs this node sent to the store and their bytes (`/stats` `peer`).
    pub fn store_reads(&self) -> anyhow::Result<(u64, u64)> {
        let s = self.stats()?;
        let p = &s["peer"];
        Ok((
            p["store_gets"].as_u64().context("peer.store_gets")?,
            p["store_bytes"].as_u64().context("peer.store_bytes")?,
        ))
    }

    /// Whether the daemon's log says it could not bind an address already in use.
    fn log_says_address_in_use(&self) -> bool {
        std::fs::read_to_string(&self.log)
            .is_ok_and(|t| t.to_ascii_lowercase().contains("address already in use"))
    }

    /// The last `lines` lines of the daemon's log that are not backtrace frames (with
    /// `RUST_BACKTRACE` set, the frames of an error would push its message out of a
    /// plain tail).
    fn log_lines_without_backtrace(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| {
                let t = l.trim_start();
                let frame = t
                    .split_once(':')
                    .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
                !frame && !t.starts_with("at ")
            })
            .collect();
        kept[kept.len().saturating_sub(lines)..].join("\n")
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Path of `rel` through this node's mount.
    pub fn mounted(&self, rel: &str) -> anyhow::Result<PathBuf> {
        Ok(self
            .mountpoint
            .as_ref()
            .context("the group was started without mounts")?
            .join(rel))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A plain HTTP/1.1 GET on loopback (the admin API), body returned on 200.
fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("connecting {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP header end")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    // Chunked bodies (axum streams none for these handlers, but be safe).
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(dechunk(body));
    }
    Ok(body.to_string())
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Waits until `f` holds, polling every 50 ms; fails naming `what` after `within`.
pub fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !f() {
        if Instant::now() >= deadline {
            bail!("{what}: not within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Writes `n` files of `size` bytes each under `dir`, contents from `seed` (the chaos
/// bench's generator: any byte can be checked on its own). Returns their names.
pub fn write_dataset(dir: &Path, seed: u64, n: usize, size: usize) -> anyhow::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("f{i:04}.bin");
        let mut buf = vec![0u8; size];
        super::chaos::content::fill(seed ^ i as u64, 0, &mut buf);
        std::fs::write(dir.join(&name), &buf)?;
        names.push(name);
    }
    Ok(names)
}

/// Bytes of file `i` of [`write_dataset`] wrong in `got` read at `offset`.
pub fn count_wrong(seed: u64, i: usize, offset: u64, got: &[u8]) -> u64 {
    super::chaos::content::count_wrong(seed ^ i as u64, offset, got)
}
