//! One store per key at a time. Values are immutable, so of two Puts of one key that
//! race to the engine (both found it absent when they began) the first stores it and
//! the second, once the first is done, finds the key and answers `already_present`.
//! Both used to store: the memory tier kept one value, the disk tier the other, and a
//! Get answered either depending on where the block was read from.
//!
//! A slot is owned (`'static`): the store it guards runs in a task of its own and holds
//! it to the end, even when the Put that began it was cancelled, and a Remove of the
//! key claims it too, so it waits for a store in progress instead of being overtaken by
//! it (crash finding: a Put whose client gave up kept storing and landed after an
//! acknowledged Remove, or over a newer Put answered "stored").

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use strata_cache_core::CacheKey;
use tokio::sync::Semaphore;

/// The keys being stored now, each with a semaphore closed when its store ends.
#[derive(Default)]
pub(super) struct Storing {
    slots: Mutex<HashMap<CacheKey, Arc<Semaphore>>>,
}

/// The right to store (or remove) one key; dropping it (stored, failed or removed)
/// lets the next Put or Remove of the key look again.
pub(super) struct StoringSlot {
    owner: Arc<Storing>,
    key: CacheKey,
    done: Arc<Semaphore>,
}

impl Storing {
    /// Claims `key` for storing, after any store of it in progress ends; None when
    /// `present` then says the key is held (the caller answers `already_present`).
    /// `present` is asked after the claim, so a store that ended just before cannot be
    /// missed.
    pub(super) async fn claim(
        self: &Arc<Self>,
        key: &CacheKey,
        present: impl Fn() -> bool,
    ) -> Option<StoringSlot> {
        loop {
            let claimed = match self.slots.lock().entry(key.clone()) {
                Entry::Occupied(o) => Err(o.get().clone()),
                Entry::Vacant(v) => Ok(v.insert(Arc::new(Semaphore::new(0))).clone()),
            };
            match claimed {
                // (The map's lock is released: a slot dropped here takes it again.)
                Ok(done) => {
                    let slot = StoringSlot {
                        owner: self.clone(),
                        key: key.clone(),
                        done,
                    };
                    return (!present()).then_some(slot);
                }
                // Never granted: it fails (is closed) when that store ends.
                Err(busy) => {
                    let _ = busy.acquire().await;
                }
            }
        }
    }
}

impl Drop for StoringSlot {
    fn drop(&mut self) {
        self.owner.slots.lock().remove(&self.key);
        self.done.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    fn key(n: u8) -> CacheKey {
        CacheKey::kv("ns", vec![n; 16])
    }

    #[tokio::test]
    async fn a_second_claim_waits_and_then_sees_the_first_store() {
        let storing = Arc::new(Storing::default());
        let stored = Arc::new(AtomicBool::new(false));
        let first = storing
            .claim(&key(1), || false)
            .await
            .expect("first claims");
        let (s2, st2) = (storing.clone(), stored.clone());
        let second = tokio::spawn(async move {
            s2.claim(&key(1), || st2.load(Ordering::SeqCst))
                .await
                .is_some()
        });
        // Another key is not held up.
        assert!(storing.claim(&key(2), || false).await.is_some());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "waits for the first store");
        stored.store(true, Ordering::SeqCst);
        drop(first);
        assert!(!second.await.expect("join"), "then finds the key present");
    }

    #[tokio::test]
    async fn a_failed_store_lets_the_next_claim_store() {
        let storing = Arc::new(Storing::default());
        drop(storing.claim(&key(3), || false).await.expect("first"));
        assert!(storing.claim(&key(3), || false).await.is_some());
        assert!(storing.slots.lock().is_empty(), "slots are freed");
    }
}
