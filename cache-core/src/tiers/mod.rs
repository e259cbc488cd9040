//! Tier implementations: CPU memory here, the local disk tier in [`disk`]; the GPU tier
//! lives in the `gds` crate.

pub mod disk;
pub mod memory;

pub use disk::DiskTier;
pub use memory::MemoryTier;
