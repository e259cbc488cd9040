//! `strata bench kv-group`: what a routed KV Get costs next to a local one (issue 16).
//!
//! Two KV services in this process form a group (rendezvous placement, R = 1), each with
//! a client listener and a peer listener on loopback TCP. Blocks are put through node A
//! and land on their owners. One client then Gets each block, alternately through its
//! owner (a local hit) and through the other node (one forwarded hop: client -> entry
//! node -> owner's peer face -> back), side by side in one run, so the two figures share
//! the machine's state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use serde::Serialize;
use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::CacheEngine;
use strata_cluster::{NodeId, Placement};
use strata_kvcache::group::{placement_key, GroupOptions, GroupView, PeerNode, Routes};
use strata_kvcache::server::{self, KvService, ServerConfig};
use strata_kvcache::KvClient;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct KvGroupArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Block sizes in KiB.
    #[arg(long, value_delimiter = ',', default_values_t = [64u64, 1024, 4096],
          value_parser = super::at_least_one::<u64>)]
    pub block_kib: Vec<u64>,
    /// Seconds of Gets per block size (half local, half routed, interleaved).
    #[arg(long, default_value_t = 2.0)]
    pub secs: f64,
    /// Distinct blocks per size (each Get picks the next one round-robin).
    #[arg(long, default_value_t = 64, value_parser = super::at_least_one::<usize>)]
    pub blocks: usize,
}

#[derive(Debug, Serialize)]
pub struct KvGroupRow {
    pub block_kib: u64,
    pub local_p50_us: f64,
    pub local_p99_us: f64,
    pub routed_p50_us: f64,
    pub routed_p99_us: f64,
    pub local_gbps: f64,
    pub routed_gbps: f64,
    /// routed p50 / local p50.
    pub p50_ratio: f64,
}

/// A fixed two-node group over rendezvous placement.
struct Fixed {
    me: usize,
    nodes: Vec<PeerNode>,
    placement: Placement,
}

impl GroupView for Fixed {
    fn local_id(&self) -> Arc<str> {
        self.nodes[self.me].id.clone()
    }

    fn routes(&self, keys: &[Vec<u8>]) -> Option<Routes> {
        let candidates = keys
            .iter()
            .map(|k| {
                self.placement
                    .owners(k, 2)
                    .iter()
                    .filter_map(|id| self.nodes.iter().position(|n| *n.id == *id.as_str()))
                    .collect()
            })
            .collect();
        Some(Routes {
            nodes: self.nodes.clone(),
            candidates,
            replication: 1,
        })
    }
}

pub fn run(args: KvGroupArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    let rows = rt.block_on(bench(&args))?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        outln!(
            "{:>9} {:>10} {:>10} {:>11} {:>11} {:>9} {:>10} {:>8}",
            "block",
            "local p50",
            "local p99",
            "routed p50",
            "routed p99",
            "local GB/s",
            "routed GB/s",
            "p50 x"
        );
        for r in &rows {
            outln!(
                "{:>6} KiB {:>8.0}us {:>8.0}us {:>9.0}us {:>9.0}us {:>9.2} {:>10.2} {:>8.2}",
                r.block_kib,
                r.local_p50_us,
                r.local_p99_us,
                r.routed_p50_us,
                r.routed_p99_us,
                r.local_gbps,
                r.routed_gbps,
                r.p50_ratio
            );
        }
    }
    Ok(())
}

async fn bench(args: &KvGroupArgs) -> anyhow::Result<Vec<KvGroupRow>> {
    crate::daemon::allocator::tune(None);
    let stop = CancellationToken::new();
    let mut peers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..2 {
        peers.push(tokio::net::TcpListener::bind("127.0.0.1:0").await?);
        clients.push(tokio::net::TcpListener::bind("127.0.0.1:0").await?);
    }
    let nodes: Vec<PeerNode> = peers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            Ok(PeerNode {
                id: Arc::from(format!("node-{i}")),
                addr: Arc::from(l.local_addr()?.to_string()),
                local: false,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let placement = Placement::new(nodes.iter().map(|n| (NodeId::new(n.id.to_string()), 1.0)));
    let mut addrs = Vec::new();
    for (i, (peer, client)) in peers.into_iter().zip(clients).enumerate() {
        let engine = CacheEngine::builder()
            .tier(Arc::new(MemoryTier::new(2 << 30)))
            .build()
            .context("engine")?;
        let service = KvService::new(engine, ServerConfig::default());
        let mut table = nodes.clone();
        table[i].local = true;
        service.join_group(
            Arc::new(Fixed {
                me: i,
                nodes: table,
                placement: placement.clone(),
            }),
            GroupOptions {
                token: Some("bench".into()),
                ..Default::default()
            },
        )?;
        addrs.push(client.local_addr()?.to_string());
        let (svc, s) = (service.clone(), stop.clone());
        tokio::spawn(async move { server::serve(client, svc, s.cancelled_owned()).await });
        let face = service.peer_grpc();
        let s = stop.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .initial_stream_window_size(8 << 20)
                .initial_connection_window_size(32 << 20)
                .add_service(face)
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(peer).with_nodelay(Some(true)),
                    s.cancelled_owned(),
                )
                .await
        });
    }
    let mut c = [
        KvClient::connect(&addrs[0]).await?,
        KvClient::connect(&addrs[1]).await?,
    ];
    let mut rows = Vec::new();
    for &kib in &args.block_kib {
        let ns = format!("bench/{kib}");
        let data = Bytes::from(vec![0x5au8; (kib << 10) as usize]);
        let mut owner = Vec::new();
        for b in 0..args.blocks {
            let h = format!("b-{b}").into_bytes();
            c[0].put(&ns, &h, data.clone()).await?;
            let o = placement.owner(&placement_key(&ns, &h)).context("owner")?;
            owner.push((h, usize::from(o.as_str() != "node-0")));
        }
        let (mut local, mut routed) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs_f64(args.secs);
        let mut i = 0;
        while Instant::now() < deadline {
            let (h, o) = &owner[i % owner.len()];
            for (via, out) in [(*o, &mut local), (1 - *o, &mut routed)] {
                let t = Instant::now();
                let got = c[via].get(&ns, h).await?.context("block missing")?;
                out.push(t.elapsed());
                anyhow::ensure!(got.len() == data.len(), "short block");
            }
            i += 1;
        }
        let q = |v: &mut Vec<Duration>, p: f64| {
            v.sort();
            v[((v.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6
        };
        let gbps = |v: &Vec<Duration>| {
            let t: f64 = v.iter().map(Duration::as_secs_f64).sum();
            (v.len() as f64 * data.len() as f64) / t / 1e9
        };
        let (lg, rg) = (gbps(&local), gbps(&routed));
        let (l50, l99, r50, r99) = (
            q(&mut local, 0.5),
            q(&mut local, 0.99),
            q(&mut routed, 0.5),
            q(&mut routed, 0.99),
        );
        rows.push(KvGroupRow {
            block_kib: kib,
            local_p50_us: l50,
            local_p99_us: l99,
            routed_p50_us: r50,
            routed_p99_us: r99,
            local_gbps: lg,
            routed_gbps: rg,
            p50_ratio: r50 / l50,
        });
    }
    stop.cancel();
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny run: both paths answer every block, the routed one no faster in the
    /// median than a local hit plus nothing (it does strictly more work).
    #[test]
    fn tiny_run_reports_local_and_routed_gets() {
        let rows = tokio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(bench(&KvGroupArgs {
                json: true,
                block_kib: vec![64],
                secs: 0.2,
                blocks: 4,
            }))
            .expect("bench");
        assert_eq!(rows.len(), 1);
        assert!(rows[0].local_p50_us > 0.0 && rows[0].routed_p50_us > 0.0);
        assert!(rows[0].local_gbps > 0.0 && rows[0].routed_gbps > 0.0);
    }
}
