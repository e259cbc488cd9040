//! What the write tests share: an in-memory store that takes parts by index (as S3
//! does), behind the fault-injecting wrapper, and a look at what it holds.

use std::sync::Arc;
use std::time::Duration;

use object_store::{ObjectStore, ObjectStoreExt};
use strata_cache_core::store::faulty::{FaultConfig, FaultyStore};
use strata_cache_core::{BackingStore, RetryPolicy};

pub struct PartStore {
    /// The objects as they are (no faults), to check what an upload left.
    pub mem: Arc<dyn ObjectStore>,
    pub faulty: Arc<FaultyStore>,
    /// The handle the core uses: uploads go part by part through the faulty store.
    pub store: BackingStore,
}

pub fn part_store() -> PartStore {
    let memory = Arc::new(object_store::memory::InMemory::new());
    let mem: Arc<dyn ObjectStore> = memory.clone();
    let faulty = Arc::new(FaultyStore::new(mem.clone(), FaultConfig::default()).with_parts(memory));
    let retry = RetryPolicy {
        attempts: 2,
        base_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_secs(1),
        attempt_timeout: Duration::from_secs(2),
        ..RetryPolicy::default()
    };
    let store = BackingStore::new(faulty.clone() as Arc<dyn ObjectStore>, "mem", retry)
        .with_part_store(faulty.clone(), "");
    PartStore { mem, faulty, store }
}

/// Object `path` as the store holds it, None if there is none.
pub async fn stored(mem: &Arc<dyn ObjectStore>, path: &str) -> Option<Vec<u8>> {
    match mem.get(&object_store::path::Path::from(path)).await {
        Ok(r) => Some(r.bytes().await.expect("body").to_vec()),
        Err(object_store::Error::NotFound { .. }) => None,
        Err(e) => panic!("store: {e}"),
    }
}
