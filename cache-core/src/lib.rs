//! Strata's cache core: typed keys, checksummed blocks, tiers under byte budgets, the
//! composing engine (read-through, promotion, demotion, single-flight), eviction
//! policies, and the object-store backing. Knows nothing of FUSE or gRPC.

pub mod access;
pub mod block;
pub mod checksum;
pub mod classify;
pub mod conformance;
pub mod engine;
pub mod error;
pub mod fetch_plan;
pub mod granularity;
pub mod hierarchy;
pub mod io;
pub mod key;
pub mod link_share;
pub mod pattern;
pub mod policy;
pub mod reader;
pub mod scheduler;
pub mod space;
pub mod stall;
pub mod state_file;
pub mod stats;
pub mod store;
pub mod stream;
pub mod testdata;
pub mod tier;
pub mod tiers;
pub mod tracker;
pub mod wire;
pub(crate) mod write_behind;

pub use access::{AccessContext, AccessKind, JobId};
pub use block::Block;
pub use engine::{CacheEngine, EngineBuilder, EngineStatsSnapshot, RunSink, Stored};
pub use error::{CacheError, Result};
pub use key::{CacheKey, FileBlockKey, KvBlockKey, DEFAULT_BLOCK_SIZE};
pub use pattern::Pattern;
pub use reader::{ObjectReader, PeerFetch, PeerSource, StoreFetch};
pub use store::{BackingStore, DirListing, ObjectInfo, RetryPolicy, StoreOptions, StreamingUpload};
pub use tier::{Tier, TierGet, TierKind, ENTRY_BOOKKEEPING};
pub use tracker::AccessTracker;
