//! The KV service across a group of in-process nodes (issue 16), with a fixed
//! membership: routing by key, replicas, the peer face's checks. The same code with the
//! etcd membership and `strata serve` daemons is tested in tests/tests/kv_group.rs.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::{CacheEngine, CacheKey};
use strata_kvcache::client::ClientOptions;
use strata_kvcache::group::{GroupOptions, GroupView, PeerNode, Routes};
use strata_kvcache::server::{self, KvService, ServerConfig};
use strata_kvcache::{KvClient, TenantConfig};
use tokio::sync::oneshot;

/// A fixed group: every node knows every other's peer address; candidates of a key are
/// the nodes ordered by a hash of (node, key), R owners then one more.
struct FixedView {
    me: usize,
    addrs: Vec<String>,
    replication: usize,
    /// Nodes out of the membership (a lease that ran out), shared by the group.
    gone: Membership,
}

/// Which nodes of a test group have left the membership.
type Membership = Arc<std::sync::Mutex<std::collections::HashSet<usize>>>;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

/// The nodes (indexes of the live ones) in a key's placement order: its owners first.
fn placement_order(key: &[u8], nodes: usize) -> Vec<usize> {
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut order: Vec<usize> = (0..nodes).collect();
    order.sort_by_key(|n| std::cmp::Reverse(mix(h ^ ((*n as u64 + 1) * 0x9e37))));
    order
}

impl GroupView for FixedView {
    fn local_id(&self) -> Arc<str> {
        Arc::from(format!("node-{}", self.me))
    }

    fn routes(&self, keys: &[Vec<u8>]) -> Option<Routes> {
        let gone = self.gone.lock().expect("membership").clone();
        let nodes: Vec<PeerNode> = self
            .addrs
            .iter()
            .enumerate()
            .filter(|(i, _)| !gone.contains(i))
            .map(|(i, a)| PeerNode {
                id: Arc::from(format!("node-{i}")),
                addr: Arc::from(a.as_str()),
                local: i == self.me,
            })
            .collect();
        if nodes.iter().all(|n| n.local) {
            return None;
        }
        let candidates = keys
            .iter()
            .map(|k| {
                let mut order = placement_order(k, nodes.len());
                order.truncate(self.replication + 1);
                order
            })
            .collect();
        Some(Routes {
            nodes,
            candidates,
            replication: self.replication,
        })
    }
}

struct Node {
    gone: Membership,
    client_addr: String,
    peer_addr: String,
    service: KvService,
    stops: Vec<oneshot::Sender<()>>,
}

impl Node {
    fn stop(&mut self) {
        for s in self.stops.drain(..) {
            let _ = s.send(());
        }
    }
}

fn engine() -> CacheEngine {
    CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(64 << 20)))
        .build()
        .expect("engine")
}

/// `n` nodes, each with a client listener and a peer listener on loopback.
async fn group(n: usize, replication: usize, config: ServerConfig, token: &str) -> Vec<Node> {
    group_with(n, replication, config, token, None).await
}

/// [`group`], node 0 keeping the Removes its peers missed in `missed_file`.
async fn group_with(
    n: usize,
    replication: usize,
    config: ServerConfig,
    token: &str,
    missed_file: Option<&std::path::Path>,
) -> Vec<Node> {
    let mut peers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..n {
        peers.push(
            tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind"),
        );
        clients.push(
            tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind"),
        );
    }
    let addrs: Vec<String> = peers
        .iter()
        .map(|l| l.local_addr().expect("addr").to_string())
        .collect();
    let gone: Membership = Default::default();
    let mut nodes = Vec::new();
    for (i, (peer, client)) in peers.into_iter().zip(clients).enumerate() {
        let service = KvService::new(engine(), config.clone());
        service
            .join_group(
                Arc::new(FixedView {
                    me: i,
                    addrs: addrs.clone(),
                    replication,
                    gone: gone.clone(),
                }),
                GroupOptions {
                    token: Some(token.to_string()),
                    missed_removes_file: missed_file.filter(|_| i == 0).map(|f| f.to_path_buf()),
                    ..Default::default()
                },
            )
            .expect("join");
        let client_addr = client.local_addr().expect("addr").to_string();
        let (tx1, rx1) = oneshot::channel::<()>();
        let (tx2, rx2) = oneshot::channel::<()>();
        let svc = service.clone();
        tokio::spawn(async move {
            server::serve(client, svc, async {
                let _ = rx1.await;
            })
            .await
        });
        let peer_face = service.peer_grpc();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(peer_face)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(peer),
                    async {
                        let _ = rx2.await;
                    },
                )
                .await
        });
        nodes.push(Node {
            gone: gone.clone(),
            client_addr,
            peer_addr: addrs[i].clone(),
            service,
            stops: vec![tx1, tx2],
        });
    }
    nodes
}

/// A client's options sending model identity `[id; 32]`.
fn as_model(id: u8) -> ClientOptions {
    ClientOptions {
        identity: Some([id; 32]),
        ..Default::default()
    }
}

/// Stops `node`'s peer face (its client service stays): calls to it fail from now on.
async fn stop_peer_face(node: &mut Node) {
    let face = node.stops.remove(1);
    let _ = face.send(());
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Serves `service`'s peer face again on `addr` (a node back on its address with its
/// cache, after its face was stopped).
async fn serve_peer_face(service: &KvService, addr: &str) {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("rebind");
    let face = service.peer_grpc();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(face)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
}

/// Waits, at most `within`, until `service` holds none of `removed` (`what` names the
/// failure), then checks it still holds every one of `kept`: only what was removed.
async fn until_removed(
    service: &KvService,
    removed: &[CacheKey],
    kept: &[CacheKey],
    within: Duration,
    what: &str,
) {
    let deadline = std::time::Instant::now() + within;
    while removed.iter().any(|k| service.engine().contains(k)) {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for k in kept {
        assert!(service.engine().contains(k), "only what was removed");
    }
}

fn block(i: u32, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|j| (j as u32).wrapping_mul(31).wrapping_add(i * 7) as u8)
            .collect::<Vec<u8>>(),
    )
}

fn hash(i: u32) -> Vec<u8> {
    format!("h-{i:04}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_put_through_one_node_are_found_through_every_node() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let nodes = group(3, 2, ServerConfig::default(), "group-secret").await;
        let mut a = KvClient::connect(&nodes[0].client_addr).await.expect("a");
        let ns = "llama/t";
        let hashes: Vec<Vec<u8>> = (0..24).map(hash).collect();
        for (i, h) in hashes.iter().enumerate() {
            // 3 MiB blocks: forwarded puts and gets stream several chunks.
            let len = if i == 0 { 3 << 20 } else { 4096 + i };
            assert!(!a.put(ns, h, block(i as u32, len)).await.expect("put"));
        }
        // Each block sits on exactly R = 2 nodes.
        let held: Vec<u64> = nodes.iter().map(|n| n.service.stats().puts).collect();
        assert_eq!(held.iter().sum::<u64>(), 48, "{held:?}");
        for n in &nodes {
            let mut c = KvClient::connect(&n.client_addr).await.expect("c");
            for (i, h) in hashes.iter().enumerate() {
                let len = if i == 0 { 3 << 20 } else { 4096 + i };
                let got = c.get(ns, h).await.expect("get").expect("found");
                assert_eq!(
                    got,
                    block(i as u32, len),
                    "block {i} through {}",
                    n.client_addr
                );
            }
            assert_eq!(c.match_prefix(ns, &hashes).await.expect("mp"), 24);
            let mut chain = hashes.clone();
            chain.insert(10, b"absent".to_vec());
            assert_eq!(c.match_prefix(ns, &chain).await.expect("mp"), 10);
            let ex = c.batch_exists(ns, &chain).await.expect("be");
            assert_eq!(ex.iter().filter(|e| !**e).count(), 1);
            assert!(!ex[10]);
            let est = c.estimate_load(ns, &chain, 1 << 20).await.expect("el");
            assert_eq!(est.matched, 10);
            assert!(est.blocks.iter().enumerate().all(|(i, (t, us))| {
                (i == 10) == (*t == strata_kvcache::client::BlockTier::None)
                    && (i == 10 || *us > 0.0)
            }));
            let got = c.batch_get(ns, &chain).await.expect("batch get");
            assert_eq!(got.iter().filter(|b| b.is_some()).count(), 24);
        }
        // EstimateLoad includes the hop: a block asked through a node that does not
        // hold it costs its primary's own estimate plus the hop to it.
        let addrs: Vec<String> = nodes.iter().map(|n| n.peer_addr.clone()).collect();
        let view = FixedView {
            me: 0,
            addrs,
            replication: 2,
            gone: Default::default(),
        };
        for (i, h) in hashes.iter().enumerate().skip(1) {
            let r = view
                .routes(&[strata_kvcache::group::placement_key(ns, h)])
                .expect("routes");
            let (primary, outsider) = (r.candidates[0][0], r.candidates[0][2]);
            let est = |node: usize| {
                let addr = nodes[node].client_addr.clone();
                let h = h.clone();
                async move {
                    let mut c = KvClient::connect(&addr).await.expect("c");
                    c.estimate_load(ns, &[h], 1 << 20)
                        .await
                        .expect("est")
                        .total_us
                }
            };
            let (direct, routed) = (est(primary).await, est(outsider).await);
            assert!(
                routed > direct && direct > 0.0,
                "block {i}: through its owner {direct} us, through another node {routed} us"
            );
        }
        let g = nodes[1].service.group_stats().expect("in a group");
        assert!(
            g.remote_hits > 0 && g.peers.iter().any(|p| p.bytes_in > 0),
            "{g:?}"
        );
        for mut n in nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_owner_costs_no_block_with_two_replicas() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(3, 2, ServerConfig::default(), "s").await;
        let mut a = KvClient::connect(&nodes[0].client_addr).await.expect("a");
        let ns = "m/t";
        for i in 0..30 {
            a.put(ns, &hash(i), block(i, 2048)).await.expect("put");
        }
        nodes[2].stop();
        tokio::time::sleep(Duration::from_millis(100)).await;
        for via in [0, 1] {
            let mut c = KvClient::connect(&nodes[via].client_addr).await.expect("c");
            for i in 0..30 {
                let got = c.get(ns, &hash(i)).await.expect("get").expect("found");
                assert_eq!(got, block(i, 2048));
            }
            let chain: Vec<Vec<u8>> = (0..30).map(hash).collect();
            assert_eq!(c.match_prefix(ns, &chain).await.expect("mp"), 30);
        }
        // Puts while node 2 is down land on the two live nodes (its substitute).
        for i in 100..120 {
            a.put(ns, &hash(i), block(i, 2048)).await.expect("put");
        }
        let g = nodes[0].service.group_stats().expect("group");
        assert_eq!(g.puts_under_replicated, 0, "{g:?}");
        let mut b = KvClient::connect(&nodes[1].client_addr).await.expect("b");
        for i in 100..120 {
            assert_eq!(
                b.get(ns, &hash(i)).await.expect("get"),
                Some(block(i, 2048))
            );
        }
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_stay_apart_across_the_group_and_peers_need_the_token() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let tenant = |name: &str, token: &str| TenantConfig {
            name: name.into(),
            token: token.into(),
            namespaces: vec!["m-*".into()],
            quota_bytes: 64 << 20,
        };
        let config = ServerConfig {
            tenants: vec![tenant("a", "tok-a"), tenant("b", "tok-b")],
            ..Default::default()
        };
        let nodes = group(3, 1, config, "group-secret").await;
        let as_tenant = |addr: &str, token: &str| {
            let addr = addr.to_string();
            let token = token.to_string();
            async move {
                KvClient::connect_with(
                    &addr,
                    ClientOptions {
                        token: Some(token),
                        ..Default::default()
                    },
                )
                .await
                .expect("connect")
            }
        };
        let mut a0 = as_tenant(&nodes[0].client_addr, "tok-a").await;
        for i in 0..12 {
            a0.put("m-1", &hash(i), block(i, 2048)).await.expect("put");
        }
        let mut a2 = as_tenant(&nodes[2].client_addr, "tok-a").await;
        let mut b2 = as_tenant(&nodes[2].client_addr, "tok-b").await;
        let chain: Vec<Vec<u8>> = (0..12).map(hash).collect();
        assert_eq!(a2.match_prefix("m-1", &chain).await.expect("mp"), 12);
        assert_eq!(b2.match_prefix("m-1", &chain).await.expect("mp"), 0);
        for i in 0..12 {
            let got = a2.get("m-1", &hash(i)).await.expect("get");
            assert!(
                got.is_some(),
                "block {i}: {:?}",
                nodes[2].service.group_stats()
            );
            assert!(b2.get("m-1", &hash(i)).await.expect("get").is_none());
        }
        // A tenant's patterns hold at every node: "x-1" is refused wherever it lands.
        let e = a2.put("x-1", &hash(0), block(0, 2048)).await.unwrap_err();
        assert!(
            format!("{e}").contains("PermissionDenied")
                || format!("{e:?}").contains("PermissionDenied"),
            "{e:?}"
        );
        // The peer face: no group token, no answer; a wrong one, none either; the
        // right one without a tenant, refused; a tenant token is no group token.
        let ask = |token: Option<&'static str>, tenant: Option<&'static str>| {
            let addr = nodes[0].peer_addr.clone();
            async move {
                let mut c = KvClient::connect(&addr).await.expect("peer connect");
                let mut req = tonic::Request::new(strata_kvcache::pb::MatchPrefixRequest {
                    namespace: "m-1".into(),
                    hashes: (0..12).map(|i| Bytes::from(hash(i))).collect(),
                });
                if let Some(t) = token {
                    req.metadata_mut().insert(
                        strata_kvcache::group::GROUP_TOKEN_METADATA,
                        format!("Bearer {t}").parse().expect("ascii"),
                    );
                }
                if let Some(t) = tenant {
                    req.metadata_mut().insert(
                        strata_kvcache::group::PEER_TENANT_METADATA,
                        t.parse().expect("ascii"),
                    );
                }
                c.raw()
                    .match_prefix(req)
                    .await
                    .map(|r| r.into_inner().matched)
            }
        };
        assert_eq!(
            ask(None, Some("a")).await.unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            ask(Some("tok-a"), Some("a")).await.unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            ask(Some("group-secret"), None).await.unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(
            ask(Some("group-secret"), Some("nobody"))
                .await
                .unwrap_err()
                .code(),
            tonic::Code::PermissionDenied
        );
        // With the token and tenant a: node 0's own blocks of a's key space, never
        // forwarded further (the peer face serves locally).
        let local = ask(Some("group-secret"), Some("a"))
            .await
            .expect("peer answer");
        assert!(
            local < 12,
            "the peer face answered for the whole group: {local}"
        );
        assert_eq!(
            ask(Some("group-secret"), Some("b"))
                .await
                .expect("peer answer"),
            0
        );
        for mut n in nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// A view with fixed candidates for every key (the test picks who is "owner").
struct Scripted {
    me: usize,
    nodes: Vec<(String, String)>,
    candidates: Vec<usize>,
    replication: usize,
}

impl GroupView for Scripted {
    fn local_id(&self) -> Arc<str> {
        Arc::from(self.nodes[self.me].0.as_str())
    }

    fn routes(&self, keys: &[Vec<u8>]) -> Option<Routes> {
        Some(Routes {
            nodes: self
                .nodes
                .iter()
                .enumerate()
                .map(|(i, (id, addr))| PeerNode {
                    id: Arc::from(id.as_str()),
                    addr: Arc::from(addr.as_str()),
                    local: i == self.me,
                })
                .collect(),
            candidates: vec![self.candidates.clone(); keys.len()],
            replication: self.replication,
        })
    }
}

/// An owner that accepts connections and never answers (a wedged host): a Get through
/// another node is hedged to the next candidate after the owner's hedge delay and
/// answers from there, long before the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_owner_is_hedged_with_the_next_candidate() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let hole = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let hole_addr = hole.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = hole.accept().await {
                held.push(s);
            }
        });
        let peer_b = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let peer_b_addr = peer_b.local_addr().expect("addr").to_string();
        let nodes = vec![
            ("a".to_string(), "127.0.0.1:1".to_string()),
            ("hole".to_string(), hole_addr),
            ("b".to_string(), peer_b_addr),
        ];
        // b holds the block (its own view: it is the only candidate, stored locally).
        let b = KvService::new(engine(), ServerConfig::default());
        b.join_group(
            Arc::new(Scripted {
                me: 2,
                nodes: nodes.clone(),
                candidates: vec![2],
                replication: 1,
            }),
            GroupOptions {
                token: Some("t".into()),
                ..Default::default()
            },
        )
        .expect("join");
        let face = b.peer_grpc();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(face)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(peer_b))
                .await
        });
        let b_client = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let b_client_addr = b_client.local_addr().expect("addr").to_string();
        let svc = b.clone();
        tokio::spawn(async move { server::serve(b_client, svc, std::future::pending()).await });
        let mut cb = KvClient::connect(&b_client_addr).await.expect("b");
        cb.put("m/t", b"k", block(1, 4096)).await.expect("put");
        // a: the wedged node is the owner (R = 1), b the next candidate.
        let a = KvService::new(engine(), ServerConfig::default());
        a.join_group(
            Arc::new(Scripted {
                me: 0,
                nodes,
                candidates: vec![1, 2],
                replication: 1,
            }),
            GroupOptions {
                token: Some("t".into()),
                request_timeout: Duration::from_secs(20),
                ..Default::default()
            },
        )
        .expect("join");
        let a_client = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let a_addr = a_client.local_addr().expect("addr").to_string();
        let svc = a.clone();
        tokio::spawn(async move { server::serve(a_client, svc, std::future::pending()).await });
        let mut ca = KvClient::connect(&a_addr).await.expect("a");
        let started = std::time::Instant::now();
        let got = ca.get("m/t", b"k").await.expect("get");
        let took = started.elapsed();
        assert_eq!(got, Some(block(1, 4096)));
        assert!(took < Duration::from_secs(2), "took {took:?}: not hedged");
        let g = a.group_stats().expect("group");
        let hole = g.peers.iter().find(|p| p.node == "hole").expect("hole");
        assert!(hole.hedges >= 1, "{g:?}");
        // A key nobody has: b says no at once, and the miss does not wait out the
        // wedged owner's request timeout (black-box finding: 5 s per miss while a
        // frozen owner's lease lived), only a short straggler wait.
        let started = std::time::Instant::now();
        assert_eq!(ca.get("m/t", b"absent").await.expect("get"), None);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "a miss took {took:?}");
    })
    .await
    .expect("within 30 s");
}

/// Black-box finding: a member that accepts connections and never answers cost every
/// Put, Remove and missed Get the whole request timeout (5 s each, for as long as its
/// lease lived). After one failure it is paused: the next calls go on without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_owner_costs_one_timeout_then_is_passed_over() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let hole = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let hole_addr = hole.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = hole.accept().await {
                held.push(s);
            }
        });
        // a: the silent node owns every key (R = 1); a itself is the next candidate.
        let a = KvService::new(engine(), ServerConfig::default());
        a.join_group(
            Arc::new(Scripted {
                me: 0,
                nodes: vec![
                    ("a".to_string(), "127.0.0.1:1".to_string()),
                    ("hole".to_string(), hole_addr),
                ],
                candidates: vec![1, 0],
                replication: 1,
            }),
            GroupOptions {
                token: Some("t".into()),
                request_timeout: Duration::from_secs(1),
                ..Default::default()
            },
        )
        .expect("join");
        let a_client = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let a_addr = a_client.local_addr().expect("addr").to_string();
        let svc = a.clone();
        tokio::spawn(async move { server::serve(a_client, svc, std::future::pending()).await });
        let mut ca = KvClient::connect(&a_addr).await.expect("a");
        // A miss while the owner is silent (not yet known to be): a itself, the next
        // candidate, said no, and that answers the hedge (black-box finding: a frozen
        // owner with R = 1 held every miss for the whole request timeout).
        let started = std::time::Instant::now();
        assert_eq!(ca.get("m/t", b"absent").await.expect("get"), None);
        let miss = started.elapsed();
        assert!(miss < Duration::from_millis(800), "a miss waited {miss:?}");
        let started = std::time::Instant::now();
        ca.put("m/t", b"k0", block(0, 4096)).await.expect("put");
        let first = started.elapsed();
        assert!(
            first >= Duration::from_millis(900),
            "the first put waited: {first:?}"
        );
        let started = std::time::Instant::now();
        for i in 1..6u32 {
            ca.put("m/t", format!("k{i}").as_bytes(), block(i, 4096))
                .await
                .expect("put");
            assert_eq!(ca.get("m/t", b"absent").await.expect("get"), None);
        }
        ca.remove("m/t", &[b"k1".to_vec()]).await.expect("remove");
        let rest = started.elapsed();
        assert!(
            rest < Duration::from_millis(800),
            "paused owner still waited on: {rest:?}"
        );
        assert_eq!(
            ca.get("m/t", b"k3").await.expect("get"),
            Some(block(3, 4096)),
            "kept by the next candidate"
        );
        let g = a.group_stats().expect("group");
        let hole = g.peers.iter().find(|p| p.node == "hole").expect("hole");
        assert!(hole.suspect, "{g:?}");
    })
    .await
    .expect("within 30 s");
}

/// Black-box finding: a Remove made while one replica was down was undone when that
/// replica came back on its warm cache (and after a Remove and a Put of new bytes it
/// served the old ones). The Remove it missed is replayed to it once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remove_a_replica_missed_is_replayed_when_it_is_back() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(2, 2, ServerConfig::default(), "s").await;
        let mut a = KvClient::connect(&nodes[0].client_addr).await.expect("a");
        let ns = "m/t";
        for i in 0..5 {
            a.put(ns, &hash(i), block(i, 2048)).await.expect("put");
        }
        let key = |i: u32| CacheKey::kv(ns, hash(i));
        assert!(
            nodes[1].service.engine().contains(&key(0)),
            "both replicas hold it"
        );
        // Node 1 goes down (its peer face stops; its cache stays, as on a warm disk).
        let peer_addr = nodes[1].peer_addr.clone();
        let _ = nodes[1].stops.pop().map(|s| s.send(()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let removed = a
            .remove(ns, &[hash(0), hash(1)])
            .await
            .expect("remove while a replica is down");
        assert_eq!(removed, 2);
        assert!(
            nodes[1].service.engine().contains(&key(0)),
            "missed by the down node"
        );
        // Back on the same address with the same cache.
        serve_peer_face(&nodes[1].service, &peer_addr).await;
        until_removed(
            &nodes[1].service,
            &[key(0)],
            &[key(2)],
            Duration::from_secs(10),
            "the missed remove was not replayed",
        )
        .await;
        assert!(!nodes[1].service.engine().contains(&key(1)));
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// Black-box finding: a Remove made after a replica had left the membership (its lease
/// ran out) was undone when it rejoined on its warm cache: it was no key's candidate,
/// so nothing was kept for it. Members that left are remembered, and the Remove is
/// replayed to them once they answer. Here the group shrinks to the entry node alone,
/// the case where no routing happens at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remove_made_while_a_replica_was_out_of_the_group_reaches_it_when_it_rejoins() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(2, 2, ServerConfig::default(), "s").await;
        let mut a = KvClient::connect(&nodes[0].client_addr).await.expect("a");
        let ns = "m/t";
        for i in 0..5 {
            a.put(ns, &hash(i), block(i, 2048)).await.expect("put");
        }
        let key = |i: u32| CacheKey::kv(ns, hash(i));
        assert!(nodes[1].service.engine().contains(&key(0)), "replicated");
        // Node 1 stops answering and its lease runs out: node 0 is alone.
        let peer_addr = nodes[1].peer_addr.clone();
        let _ = nodes[1].stops.pop().map(|s| s.send(()));
        nodes[0].gone.lock().expect("membership").insert(1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let removed = a
            .remove(ns, &[hash(0), hash(1)])
            .await
            .expect("remove while alone");
        assert_eq!(removed, 2);
        assert!(nodes[1].service.engine().contains(&key(0)), "missed");
        // Node 1 is back, on the same address with the same cache, and rejoins.
        serve_peer_face(&nodes[1].service, &peer_addr).await;
        nodes[0].gone.lock().expect("membership").clear();
        until_removed(
            &nodes[1].service,
            &[key(0), key(1)],
            &[key(2)],
            Duration::from_secs(10),
            "the remove made while it was away was not replayed",
        )
        .await;
        assert!(a.get(ns, &hash(0)).await.expect("get").is_none());
        assert_eq!(
            a.get(ns, &hash(2)).await.expect("get"),
            Some(block(2, 2048))
        );
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// Black-box findings: a Remove went to the key's candidates only, and a member was
/// known to have left only if this node had routed something while it was there. So
/// (1) after members joined, the old owners kept their copies and a Get through them
/// served removed blocks, and (2) a member cut off from the membership (its lease ran
/// out, its peers still reachable) was not kept a Remove made through a node that had
/// routed nothing before, and served the removed blocks when it rejoined. Removes now
/// reach every member, and members are watched from the join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remove_reaches_every_copy_and_members_that_left_unseen() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(3, 1, ServerConfig::default(), "s").await;
        let ns = "m/t";
        let key = |i: u32| CacheKey::kv(ns, hash(i));
        let ctx = strata_cache_core::AccessContext::default();
        // (1) Copies on every member, as placements before a membership change leave
        // them: with R = 1 a key has two candidates of three.
        for n in &nodes {
            n.service
                .engine()
                .put(&key(0), block(0, 2048), &ctx)
                .await
                .expect("copy");
        }
        let mut c = KvClient::connect(&nodes[0].client_addr).await.expect("c");
        assert_eq!(c.remove(ns, &[hash(0)]).await.expect("remove"), 1);
        for (i, n) in nodes.iter().enumerate() {
            assert!(!n.service.engine().contains(&key(0)), "node {i} kept it");
        }
        // (2) Node 2 routes nothing; node 1 leaves the membership while reachable.
        for i in 1..4 {
            c.put(ns, &hash(i), block(i, 2048)).await.expect("put");
        }
        for n in &nodes {
            for i in 1..4 {
                n.service
                    .engine()
                    .put(&key(i), block(i, 2048), &ctx)
                    .await
                    .expect("copy");
            }
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        nodes[1].gone.lock().expect("membership").insert(1);
        let mut c2 = KvClient::connect(&nodes[2].client_addr).await.expect("c2");
        c2.remove(ns, &[hash(1), hash(2)]).await.expect("remove");
        until_removed(
            &nodes[1].service,
            &[key(1), key(2)],
            &[key(3)],
            Duration::from_secs(10),
            "the member that left was not kept the remove",
        )
        .await;
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// Black-box finding: a Remove a down replica missed was kept only in the entry
/// node's memory; a restart of the entry node forgot it, and the replica served 13-16
/// of 24 removed blocks when it came back. The entry node keeps them in a file and
/// replays them after its restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remove_a_replica_missed_outlives_a_restart_of_the_entry_node() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("kv-missed-removes.json");
        let mut nodes = group_with(2, 2, ServerConfig::default(), "s", Some(&file)).await;
        let mut a = KvClient::connect(&nodes[0].client_addr).await.expect("a");
        let ns = "m/t";
        for i in 0..3 {
            a.put(ns, &hash(i), block(i, 2048)).await.expect("put");
        }
        let key = |i: u32| CacheKey::kv(ns, hash(i));
        // Node 1 goes down; a Remove through node 0 misses it.
        let peer_addr = nodes[1].peer_addr.clone();
        let _ = nodes[1].stops.pop().map(|s| s.send(()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        a.remove(ns, &[hash(0)]).await.expect("remove");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !file.exists() {
            assert!(std::time::Instant::now() < deadline, "nothing saved");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Node 0 stops (its service and router go) and starts again: a new service on
        // the same file.
        drop(a);
        let mut old = nodes.remove(0);
        let (old_addr, gone) = (old.peer_addr.clone(), old.gone.clone());
        old.stop();
        drop(old);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let restarted = KvService::new(engine(), ServerConfig::default());
        restarted
            .join_group(
                Arc::new(FixedView {
                    me: 0,
                    addrs: vec![old_addr, peer_addr.clone()],
                    replication: 2,
                    gone,
                }),
                GroupOptions {
                    token: Some("s".into()),
                    missed_removes_file: Some(file.clone()),
                    ..Default::default()
                },
            )
            .expect("join");
        // Node 1 comes back on its address with its cache.
        serve_peer_face(&nodes[0].service, &peer_addr).await;
        until_removed(
            &nodes[0].service,
            &[key(0)],
            &[key(1)],
            Duration::from_secs(15),
            "the restarted entry node did not replay the missed remove",
        )
        .await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while file.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the file is emptied once replayed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(restarted);
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// Black-box finding: a Put went to every owner at once, so two concurrent Puts of
/// different bytes under one key, entering at different nodes, could each win on a
/// different owner: both were acknowledged as new and members then answered with
/// different values (79 of 300 racing keys). The first owner now decides: one of the
/// two is `already_present`, and every copy holds the winner's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_puts_of_one_key_through_different_nodes_keep_one_value() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(3, 2, ServerConfig::default(), "s").await;
        let ns = "m/t";
        const KEYS: u32 = 150;
        let racer = |entry: usize, seed: u32| {
            let addr = nodes[entry].client_addr.clone();
            tokio::spawn(async move {
                let mut c = KvClient::connect(&addr).await.expect("connect");
                let mut answers = Vec::new();
                for i in 0..KEYS {
                    let present = c
                        .put(ns, &hash(i), block(i * 2 + seed, 4096))
                        .await
                        .expect("put");
                    answers.push(present);
                }
                answers
            })
        };
        let (a, b) = (racer(0, 0), racer(1, 1));
        let (a, b) = (a.await.expect("a"), b.await.expect("b"));
        for i in 0..KEYS {
            assert!(
                a[i as usize] || b[i as usize],
                "key {i}: both puts were acknowledged as new"
            );
            let key = CacheKey::kv(ns, hash(i));
            let ctx = strata_cache_core::AccessContext::default();
            let mut copies = Vec::new();
            for n in &nodes {
                if let Some(v) = n.service.engine().get(&key, &ctx).await.expect("get") {
                    copies.push(v);
                }
            }
            assert!(!copies.is_empty(), "key {i} stored");
            assert!(
                copies.iter().all(|c| *c == copies[0]),
                "key {i}: members hold different values"
            );
        }
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// Black-box finding: puts made while a key's owner was unreachable landed on the next
/// candidate, and once the owner was back, Gets through it missed them for good (the
/// owner said no, and a miss was final once R owners had). A miss now asks every
/// candidate, so an acknowledged block is read through every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_put_while_its_owner_was_away_is_found_through_the_owner() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(3, 1, ServerConfig::default(), "s").await;
        // Node 2's peer face goes away (its client service stays).
        stop_peer_face(&mut nodes[2]).await;
        let mut a = KvClient::connect(&nodes[0].client_addr).await.expect("a");
        let ns = "m/t";
        for i in 0..40 {
            a.put(ns, &hash(i), block(i, 2048)).await.expect("put");
        }
        let g = nodes[0].service.group_stats().expect("group");
        assert!(g.puts_under_replicated == 0, "{g:?}");
        serve_peer_face(&nodes[2].service, &nodes[2].peer_addr).await;
        let mut c = KvClient::connect(&nodes[2].client_addr).await.expect("c");
        for i in 0..40 {
            assert_eq!(
                c.get(ns, &hash(i)).await.expect("get"),
                Some(block(i, 2048)),
                "block {i} through node 2"
            );
        }
        let chain: Vec<Vec<u8>> = (0..40).map(hash).collect();
        assert_eq!(c.match_prefix(ns, &chain).await.expect("mp"), 40);
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// A node the group keeps out (another live daemon holds its node id).
struct RefusedView;

impl GroupView for RefusedView {
    fn local_id(&self) -> Arc<str> {
        Arc::from("n0")
    }

    fn routes(&self, _keys: &[Vec<u8>]) -> Option<Routes> {
        None
    }

    fn refused(&self) -> Option<String> {
        Some("node id n0 is registered by another live daemon (at 10.0.0.1:7073)".into())
    }
}

/// Black-box finding: a daemon started with the node id of a live member was kept out
/// of the group, yet acknowledged 30 of 30 puts that no member could read. Its KV calls
/// are refused with the reason while it is kept out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_kept_out_of_its_group_refuses_kv_calls_with_the_reason() {
    let service = KvService::new(engine(), ServerConfig::default());
    service
        .join_group(Arc::new(RefusedView), GroupOptions::default())
        .expect("join");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    let svc = service.clone();
    tokio::spawn(async move {
        server::serve(listener, svc, async {
            let _ = stopped.await;
        })
        .await
    });
    let mut c = KvClient::connect(&addr).await.expect("client");
    let put = c.put("ns", b"h1", Bytes::from(vec![7u8; 4096])).await;
    let e = put.expect_err("refused");
    let text = e.to_string();
    assert!(text.contains("not a member of its group"), "{text}");
    assert!(text.contains("registered by another live daemon"), "{text}");
    assert!(c.get("ns", b"h1").await.is_err(), "gets are refused too");
    let _ = stop.send(());
}

/// Black-box finding: for ~3 s after two holders of a block came back (their leases had
/// run out), Gets through another member answered "miss" for it: both were still
/// paused for the failures of the nodes that had left. A member back in the group is
/// asked at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_back_in_the_group_are_asked_at_once() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(3, 2, ServerConfig::default(), "s").await;
        let mut a = KvClient::connect(&nodes[0].client_addr).await.expect("a");
        let ns = "m/t";
        for i in 0..20 {
            a.put(ns, &hash(i), block(i, 2048)).await.expect("put");
        }
        let key = |i: u32| CacheKey::kv(ns, hash(i));
        let held_by_others = (0..20)
            .find(|&i| {
                !nodes[0].service.engine().contains(&key(i))
                    && nodes[1].service.engine().contains(&key(i))
                    && nodes[2].service.engine().contains(&key(i))
            })
            .expect("a block on nodes 1 and 2 only");
        // Both holders stop answering: Gets fail over them (each failure pauses them
        // longer), then their leases run out.
        let addrs = [nodes[1].peer_addr.clone(), nodes[2].peer_addr.clone()];
        for n in &mut nodes[1..] {
            let _ = n.stops.pop().map(|s| s.send(()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 0..3 {
            let _ = a.get(ns, &hash(held_by_others)).await;
        }
        nodes[0].gone.lock().expect("membership").extend([1, 2]);
        let _ = a.get(ns, &hash(held_by_others)).await;
        // Back, on their addresses with their caches, and in the group again.
        serve_peer_face(&nodes[1].service, &addrs[0]).await;
        serve_peer_face(&nodes[2].service, &addrs[1]).await;
        nodes[0].gone.lock().expect("membership").clear();
        assert_eq!(
            a.get(ns, &hash(held_by_others)).await.expect("get"),
            Some(block(held_by_others, 2048)),
            "a holder back in the group is asked"
        );
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// The owner of `hash` in namespace `ns` among `n` nodes with R = 1, as [`FixedView`]
/// places it when every node is a member.
fn owner(ns: &str, hash: &[u8], n: usize) -> usize {
    let k = strata_kvcache::group::placement_key(ns, hash);
    let h = k.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    (0..n)
        .max_by_key(|m| mix(h ^ ((*m as u64 + 1) * 0x9e37)))
        .expect("nodes")
}

/// Black-box finding: a member that missed a namespace's binding (it rejoined, or
/// joined later) bound it to a wrong model whose puts through it every owner refused,
/// and then refused the namespace's real model for good. The entry node only checks;
/// the nodes that store a block bind its namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_the_owners_refuse_binds_nothing_on_the_entry_node() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(3, 1, ServerConfig::default(), "s").await;
        let ns = "shared";
        // Keys nodes 0 and 1 own: node 2 stores none, so binds nothing.
        let elsewhere: Vec<u32> = (0..200)
            .filter(|&i| owner(ns, &hash(i), 3) != 2)
            .take(20)
            .collect();
        let mut a0 = KvClient::connect_with(&nodes[0].client_addr, as_model(1))
            .await
            .expect("a0");
        for &i in &elsewhere[..10] {
            a0.put(ns, &hash(i), block(i, 2048)).await.expect("put a");
        }
        assert!(
            nodes[1]
                .service
                .engine()
                .contains(&CacheKey::kv(ns, hash(elsewhere[0])))
                || nodes[0]
                    .service
                    .engine()
                    .contains(&CacheKey::kv(ns, hash(elsewhere[0])))
        );
        // Model B through node 2: every owner refuses it.
        let mut b2 = KvClient::connect_with(&nodes[2].client_addr, as_model(2))
            .await
            .expect("b2");
        for &i in &elsewhere[10..] {
            let e = b2
                .put(ns, &hash(i), block(i, 2048))
                .await
                .map(|_| ())
                .expect_err("the owners refuse model B");
            assert!(e.to_string().contains("model identity"), "{e}");
        }
        // Model A still puts through node 2.
        let mut a2 = KvClient::connect_with(&nodes[2].client_addr, as_model(1))
            .await
            .expect("a2");
        for &i in &elsewhere[10..] {
            a2.put(ns, &hash(i), block(i, 2048))
                .await
                .expect("model A through node 2");
        }
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// The same with R = 2 and a member that was out of the group while the namespace was
/// bound: as one of a key's owners it takes the wrong model's block and binding, and
/// the other owner refuses them; the refused Put leaves neither behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_put_leaves_no_copy_nor_binding_on_an_owner_that_missed_the_binding() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(3, 2, ServerConfig::default(), "s").await;
        let ns = "shared";
        // Node 2 is out of the group while model A binds the namespace.
        nodes[0].gone.lock().expect("membership").insert(2);
        let mut a0 = KvClient::connect_with(&nodes[0].client_addr, as_model(1))
            .await
            .expect("a0");
        for i in 0..10 {
            a0.put(ns, &hash(i), block(i, 2048)).await.expect("put a");
        }
        nodes[0].gone.lock().expect("membership").clear();
        // Back: model B through node 2, on keys some of which node 2 owns first.
        let mut b2 = KvClient::connect_with(&nodes[2].client_addr, as_model(2))
            .await
            .expect("b2");
        for i in 100..130 {
            assert!(
                b2.put(ns, &hash(i), block(i, 2048)).await.is_err(),
                "an owner holding the namespace for model A refuses model B"
            );
        }
        for i in 100..130 {
            for n in &nodes {
                assert!(
                    !n.service.engine().contains(&CacheKey::kv(ns, hash(i))),
                    "a refused put left a copy"
                );
            }
        }
        let mut a2 = KvClient::connect_with(&nodes[2].client_addr, as_model(1))
            .await
            .expect("a2");
        for i in 100..130 {
            a2.put(ns, &hash(i), block(i, 2048))
                .await
                .expect("model A through node 2");
        }
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// Black-box finding (round 10): a Remove that raced the copy of a Put could leave the
/// value on the second owner only; a later Put of new bytes was stored by the first
/// owner and answered `already_present` by the second, which kept the old value, and
/// Gets through that node (local tiers first) answered it for good, the others the new
/// one. The put now replaces a copy an owner holds when the deciding owner held none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_replaces_an_old_value_left_on_a_second_owner() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(3, 2, ServerConfig::default(), "s").await;
        let ns = "m/t";
        let mut a = KvClient::connect(&nodes[0].client_addr).await.expect("a");
        for i in 0..20 {
            assert!(!a.put(ns, &hash(i), block(i, 4096)).await.expect("put"));
        }
        // Each key's first owner loses it (as to a Remove that beat the copy to the
        // second owner): only the second holds the old value.
        for i in 0..20 {
            let first = placement_order(&strata_kvcache::group::placement_key(ns, &hash(i)), 3)[0];
            let key = CacheKey::kv(ns, hash(i));
            assert!(nodes[first]
                .service
                .engine()
                .remove(&key)
                .await
                .expect("remove"));
        }
        let mut c = KvClient::connect(&nodes[2].client_addr).await.expect("c");
        for i in 0..20 {
            let present = c
                .put(ns, &hash(i), block(i + 100, 4096))
                .await
                .expect("put");
            assert!(!present, "key {i}: the new value is stored");
        }
        for (n, node) in nodes.iter().enumerate() {
            let mut c = KvClient::connect(&node.client_addr).await.expect("connect");
            for i in 0..20 {
                assert!(
                    c.get(ns, &hash(i)).await.expect("get") == Some(block(i + 100, 4096)),
                    "key {i} through node {n}: not the last acknowledged value"
                );
            }
        }
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// Black-box finding (round 10): an owner restarted within its lease stayed paused in
/// its peers' routers (its calls had failed while it was down), and a paused node was
/// not asked at all; once the key's other owner died, Gets of its blocks answered
/// "miss" for ~3 s, though it was up and held them. A paused candidate is now asked
/// last, past its pause, when fewer than R candidates said no.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_that_holds_the_block_is_asked_last_not_skipped() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(3, 2, ServerConfig::default(), "s").await;
        let ns = "m/t";
        // Keys node 0 does not own: nodes 1 and 2 hold them.
        let keys: Vec<u32> = (0..200)
            .filter(|i| {
                let order =
                    placement_order(&strata_kvcache::group::placement_key(ns, &hash(*i)), 3);
                !order[..2].contains(&0)
            })
            .take(10)
            .collect();
        assert_eq!(keys.len(), 10);
        let mut a = KvClient::connect(&nodes[0].client_addr).await.expect("a");
        for &i in &keys {
            a.put(ns, &hash(i), block(i, 4096)).await.expect("put");
        }
        // Node 1 goes away: node 0's calls to it fail and pause it; node 2 serves.
        stop_peer_face(&mut nodes[1]).await;
        for &i in &keys {
            assert_eq!(
                a.get(ns, &hash(i)).await.expect("get"),
                Some(block(i, 4096))
            );
        }
        // Node 1 is back (its pause at node 0 still runs), then node 2 goes.
        serve_peer_face(&nodes[1].service, &nodes[1].peer_addr).await;
        stop_peer_face(&mut nodes[2]).await;
        let hashes: Vec<Vec<u8>> = keys.iter().map(|&i| hash(i)).collect();
        assert_eq!(
            a.batch_exists(ns, &hashes).await.expect("exists"),
            vec![true; keys.len()],
            "Exists through the paused holder"
        );
        for &i in &keys {
            assert_eq!(
                a.get(ns, &hash(i)).await.expect("get"),
                Some(block(i, 4096)),
                "block {i}: its holder is up, only paused"
            );
        }
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// Black-box finding (round 10): what a node kept to talk to a member (its channel,
/// latency window, counters) stayed after the member left, for the daemon's life:
/// /stats and /metrics grew by every departed node id (autoscaled pods get new ones).
/// It goes when the member leaves the membership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departed_members_figures_and_channel_go_with_it() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(3, 2, ServerConfig::default(), "s").await;
        let mut a = KvClient::connect(&nodes[0].client_addr).await.expect("a");
        for i in 0..20 {
            a.put("m/t", &hash(i), block(i, 4096)).await.expect("put");
        }
        let peers = |n: &Node| -> Vec<String> {
            let g = n.service.group_stats().expect("group");
            g.peers.into_iter().map(|p| p.node).collect()
        };
        assert!(peers(&nodes[0]).contains(&"node-2".to_string()));
        nodes[0].gone.lock().expect("membership").insert(2);
        // The next routed call (a local miss) sees the membership without node 2.
        a.get("m/t", &hash(999)).await.expect("get");
        assert!(
            !peers(&nodes[0]).contains(&"node-2".to_string()),
            "{:?}",
            peers(&nodes[0])
        );
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}

/// Black-box finding (round 11): a member bound a namespace to another model while it
/// could not ask the group, and the Gets (and Exists) of the namespace's real model
/// through the other members answered that member's refusal for the keys it owned,
/// although the next candidate held the block. A candidate refusing the caller's
/// identity is passed over like one that misses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_refusing_the_callers_identity_does_not_end_a_get() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut nodes = group(4, 2, ServerConfig::default(), "s").await;
        let ns = "shared";
        let keys: Vec<u32> = (0..40).collect();
        // Node 3 is out of the group while model A puts: its blocks are on nodes 0-2.
        nodes[0].gone.lock().expect("membership").insert(3);
        let mut a0 = KvClient::connect_with(&nodes[0].client_addr, as_model(1))
            .await
            .expect("a0");
        for &i in &keys {
            a0.put(ns, &hash(i), block(i, 2048)).await.expect("put a");
        }
        // Node 3, seeing none of the others, binds the namespace to model B.
        nodes[0].gone.lock().expect("membership").extend([0, 1, 2]);
        let mut b3 = KvClient::connect_with(&nodes[3].client_addr, as_model(2))
            .await
            .expect("b3");
        b3.put(ns, &hash(1000), block(1000, 2048))
            .await
            .expect("node 3's own binding decides");
        nodes[0].gone.lock().expect("membership").clear();
        // Entry nodes that ask node 3 before a holder of the key: the case at stake.
        let asked_first = |i: u32, entry: usize| {
            let k = strata_kvcache::group::placement_key(ns, &hash(i));
            let holders = &placement_order(&k, 3)[..2];
            !holders.contains(&entry)
                && placement_order(&k, 4)
                    .into_iter()
                    .take(3)
                    .filter(|&n| n != entry)
                    .find(|&n| n == 3 || holders.contains(&n))
                    == Some(3)
        };
        let cases = (0..3)
            .flat_map(|e| keys.iter().map(move |&i| (i, e)))
            .filter(|&(i, e)| asked_first(i, e))
            .count();
        assert!(cases > 0, "no key has node 3 asked before its holders");
        for (entry, node) in nodes.iter().enumerate().take(3) {
            let mut a = KvClient::connect_with(&node.client_addr, as_model(1))
                .await
                .expect("a");
            for &i in &keys {
                let got = a
                    .get(ns, &hash(i))
                    .await
                    .unwrap_or_else(|e| panic!("get {i} through node {entry}: {e}"));
                assert_eq!(got, Some(block(i, 2048)), "block {i} through node {entry}");
                assert!(
                    a.exists(ns, &hash(i))
                        .await
                        .unwrap_or_else(|e| panic!("exists {i} through node {entry}: {e}")),
                    "block {i} through node {entry}"
                );
            }
        }
        for n in &mut nodes {
            n.stop();
        }
    })
    .await
    .expect("within 60 s");
}
