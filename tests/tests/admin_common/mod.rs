//! The admin API's state over a bare 1 MiB memory engine (no KV service, no mounts):
//! what the tests of its access rules and of its listener serve.

use std::sync::Arc;
use std::time::Instant;

use strata_cache_core::tiers::MemoryTier;
use strata_cache_core::CacheEngine;
use strata_tools::admin::AdminState;

/// The state, with admin `token` if any.
pub fn bare_state(token: Option<&str>) -> AdminState {
    let engine = CacheEngine::builder()
        .tier(Arc::new(MemoryTier::new(1 << 20)))
        .build()
        .expect("engine");
    AdminState {
        engine,
        kv: None,
        mounts: vec![],
        mount_cores: vec![],
        unmounted: Arc::new([]),
        not_mounted: Arc::new([]),
        started: Instant::now(),
        token: token.map(Arc::from),
        cluster: None,
        peer: None,
        local_files: None,
    }
}
