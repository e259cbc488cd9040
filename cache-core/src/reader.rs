//! Reading byte ranges of store objects through the cache, block by block.
//!
//! An object version is cut into fixed-size blocks (default 1 MiB); each block is one
//! cache item, fetched from the store as one ranged GET on a miss, shared by every
//! concurrent reader (the engine's single-flight). A read spanning several blocks
//! fetches them concurrently and stitches them; a read inside one block is a zero-copy
//! slice of it.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::access::AccessContext;
use crate::engine::CacheEngine;
use crate::error::{CacheError, Result};
use crate::key::CacheKey;
use crate::store::{BackingStore, ObjectInfo};

#[derive(Clone)]
pub struct ObjectReader {
    engine: CacheEngine,
    store: BackingStore,
    block_size: u64,
}

impl ObjectReader {
    pub fn new(engine: CacheEngine, store: BackingStore, block_size: u64) -> Result<Self> {
        if block_size == 0 {
            return Err(CacheError::InvalidArgument("block size must be > 0".into()));
        }
        Ok(ObjectReader {
            engine,
            store: store.with_block_size(block_size),
            block_size,
        })
    }

    pub fn engine(&self) -> &CacheEngine {
        &self.engine
    }

    pub fn store(&self) -> &BackingStore {
        &self.store
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Number of blocks of an object (0 for an empty one).
    pub fn block_count(&self, obj: &ObjectInfo) -> u64 {
        obj.size.div_ceil(self.block_size)
    }

    /// The key of block `block` of `obj` in this reader's layout (its block size is
    /// part of the key, so blocks cut at another size are never served).
    pub fn key(&self, obj: &ObjectInfo, block: u64) -> CacheKey {
        CacheKey::file_block(
            obj.path.clone(),
            obj.version.clone(),
            self.block_size,
            block,
        )
    }

    /// The key of block `block` of `obj` in the layout of the handle that listed it
    /// ([`ObjectInfo::block_size`]): a reader's own when `obj` came from
    /// [`ObjectReader::store`]. Prefer [`ObjectReader::key`], which cannot disagree with
    /// the bytes the reader fetches.
    pub fn block_key(obj: &ObjectInfo, block: u64) -> CacheKey {
        CacheKey::file_block(obj.path.clone(), obj.version.clone(), obj.block_size, block)
    }

    /// Whole block `block` of `obj`, from the cache or the store.
    pub async fn read_block(
        &self,
        obj: &ObjectInfo,
        block: u64,
        ctx: &AccessContext,
    ) -> Result<Bytes> {
        let start = block.saturating_mul(self.block_size);
        if start >= obj.size {
            return Ok(Bytes::new());
        }
        let end = (start + self.block_size).min(obj.size);
        let key = self.key(obj, block);
        let store = self.store.clone();
        let obj2 = obj.clone();
        self.engine
            .get_or_fetch(&key, ctx, move || async move {
                store.get_range(&obj2, start..end).await
            })
            .await
    }

    /// Bytes `offset..offset+len` of `obj`, clamped to its size.
    pub async fn read(
        &self,
        obj: &ObjectInfo,
        offset: u64,
        len: u64,
        ctx: &AccessContext,
    ) -> Result<Bytes> {
        let end = offset.saturating_add(len).min(obj.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        let first = offset / self.block_size;
        let last = (end - 1) / self.block_size;
        if first == last {
            let block = self.read_block(obj, first, ctx).await?;
            let base = first * self.block_size;
            return slice(&block, offset - base, end - base);
        }
        let blocks =
            futures::future::try_join_all((first..=last).map(|b| self.read_block(obj, b, ctx)))
                .await?;
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        for (i, block) in blocks.iter().enumerate() {
            let base = (first + i as u64) * self.block_size;
            let from = offset.saturating_sub(base);
            let to = (end - base).min(block.len() as u64);
            out.extend_from_slice(&slice(block, from, to)?);
        }
        Ok(out.freeze())
    }

    /// Starts fetching blocks `first..first+count` of `obj` in the background (a
    /// prefetch: counted as such, never blocking the caller).
    pub fn prefetch(&self, obj: &ObjectInfo, first: u64, count: u64, ctx: &AccessContext) {
        let total = self.block_count(obj);
        let ctx = AccessContext::prefetch(ctx.job, ctx.now_ns);
        for b in first..(first + count).min(total) {
            if self.engine.contains(&self.key(obj, b)) {
                continue;
            }
            let reader = self.clone();
            let obj = obj.clone();
            tokio::spawn(async move {
                if let Err(e) = reader.read_block(&obj, b, &ctx).await {
                    tracing::debug!(path = %obj.path, block = b, error = %e, "prefetch failed");
                }
            });
        }
    }
}

fn slice(block: &Bytes, from: u64, to: u64) -> Result<Bytes> {
    if to as usize > block.len() || from > to {
        return Err(CacheError::Corrupt(format!(
            "block of {} bytes, wanted {from}..{to}",
            block.len()
        )));
    }
    Ok(block.slice(from as usize..to as usize))
}

/// Shared handle type used by front doors.
pub type SharedReader = Arc<ObjectReader>;
