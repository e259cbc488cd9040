//! Strata's KV-cache service: inference engines put and fetch KV-cache blocks over gRPC
//! (`strata.kv.v1`, see `proto/strata/kv/v1/kv.proto`) on the same tiered cache core as
//! the FUSE mount.
//!
//! - [`server`]: the tonic service and `server::run(listener, engine, config, shutdown)`.
//! - [`client`]: [`client::KvClient`], over TCP (optionally TLS + token) or a Unix socket.
//! - [`keys`]: the stable, versioned key derivation clients use (docs/KV_KEYS.md).
//! - [`error`]: [`KvError`], mapped to a `tonic::Status` once, at the edge.
//! - [`accept`]: what bounds a listener's connections (how many, how long a new one may
//!   stay silent).
//! - [`limits`]: the put budgets, per-connection tagging and idle guards that keep one
//!   client from blocking the others.
//! - [`identity`]: namespaces bound to a model identity (keys v2).
//! - [`shm`], [`shm_client`]: the same-host zero-copy path (a shared-memory arena
//!   handed over the Unix socket; Gets answered with leased offsets).
//! - [`tenants`]: tenants' tokens, namespace patterns, key spaces and quotas.
//! - [`group`]: the KV service across the cache group: routing by key to the owners,
//!   the peer face, per-peer figures.
//! - [`routing`]: the cache group's KV routing planner (pure): whom to ask about which
//!   key, batched per owner, and what the answers mean.
//! - [`wire`]: `Get` encoded and decoded without copying blocks (tonic copies each
//!   message once on each end).
//! - [`stats`]: per-namespace counters and the load-time model behind `EstimateLoad`.

pub mod accept;
mod blocks;
pub mod client;
pub mod error;
pub mod group;
pub mod identity;
pub mod keys;
pub mod limits;
pub mod routing;
pub mod server;
pub mod shm;
pub mod shm_client;
pub mod staging;
pub mod stats;
pub mod tenants;
pub mod wire;

/// Generated protobuf messages and service of `strata.kv.v1`.
pub mod pb {
    #![allow(clippy::all, missing_docs, rust_2018_idioms)]
    tonic::include_proto!("strata.kv.v1");
}

pub use client::KvClient;
pub use error::KvError;
pub use server::{KvService, Listener, ServerConfig};
pub use stats::KvStatsSnapshot;
pub use tenants::TenantConfig;

/// Makes rustls use `ring` for TLS. The workspace links both of rustls's providers
/// (object_store brings aws-lc-rs), and rustls then refuses to pick one on its own.
/// Idempotent; a provider another part of the process installed first is kept.
pub fn ensure_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// API version served by this crate.
pub const API_VERSION: &str = "v1";
