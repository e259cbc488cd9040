//! Byte accounting and eviction for one tier: the synchronous core that both the async
//! engine and the replay simulator drive, so a policy is measured by the same code that
//! serves reads.
//!
//! This is the only authority on a tier's bytes: tiers store what they are told and
//! report device errors, without a budget of their own. An engine that writes bytes
//! asynchronously uses [`TierSpace::reserve`] then [`TierSpace::commit`] (or
//! [`TierSpace::release`]): the bytes are charged from the reservation on, but the key
//! becomes a resident, and so a possible victim, only once its bytes have landed. A
//! block can therefore never be evicted while its write is in flight, and no write can
//! leave bytes in a tier that the budget does not count. (A victim is uncharged when
//! chosen; charging it until its removal completes was measured to cascade under
//! concurrent writes: every reservation then evicted more, and puts were refused with
//! residents to spare.)
//!
//! A tier may also bound how many residents it keeps ([`TierSpace::with_max_entries`]):
//! each resident costs the daemon bookkeeping in memory whatever its size (see
//! [`crate::tier::ENTRY_BOOKKEEPING`]), so a disk level of tiny blocks is bounded in
//! entries as well as in bytes. Reservations count as entries from the start.

use std::collections::HashMap;

use crate::access::AccessContext;
use crate::error::CacheError;
use crate::key::CacheKey;
use crate::policy::{EvictionPolicy, KeyBuild};

/// The residents of one tier under a byte budget.
pub struct TierSpace {
    budget: u64,
    used: u64,
    /// Bytes of writes in flight (reserved, not yet residents).
    reserved: u64,
    /// Writes in flight (each becomes one resident).
    reserved_entries: usize,
    /// Most residents plus writes in flight; `usize::MAX`: bounded by bytes alone.
    max_entries: usize,
    entries: HashMap<CacheKey, u64, KeyBuild>,
    policy: Box<dyn EvictionPolicy>,
}

/// What making room for a new item decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Placement {
    /// Admitted; these residents were evicted to make room (in eviction order).
    Admitted { evicted: Vec<(CacheKey, u64)> },
    /// Already resident; nothing changed but recency.
    AlreadyResident,
    /// Not admitted: the policy's admission hook refused it, or the policy ran out of
    /// victims (only writes in flight left) after evicting these, which have left the
    /// tier all the same.
    Refused { evicted: Vec<(CacheKey, u64)> },
}

impl TierSpace {
    pub fn new(budget: u64, policy: Box<dyn EvictionPolicy>) -> Self {
        TierSpace {
            budget,
            used: 0,
            reserved: 0,
            reserved_entries: 0,
            max_entries: usize::MAX,
            entries: HashMap::default(),
            policy,
        }
    }

    /// Bounds the residents (and writes in flight) to `max` entries as well as the
    /// budget's bytes; None: bytes alone. Placements evict to stay within it.
    pub fn with_max_entries(mut self, max: Option<usize>) -> Self {
        self.max_entries = max.unwrap_or(usize::MAX).max(1);
        self
    }

    /// See [`Self::with_max_entries`] (`usize::MAX`: no bound).
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Whether one more entry of `size` bytes does not fit now.
    fn over(&self, size: u64) -> bool {
        self.used + self.reserved + size > self.budget
            || self.entries.len() + self.reserved_entries >= self.max_entries
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Sets the budget (the device filled before the configured budget did, or has
    /// room again): placements evict to stay within it from now on.
    pub fn set_budget(&mut self, to: u64) {
        self.budget = to;
    }
    /// Bytes of residents.
    pub fn used(&self) -> u64 {
        self.used
    }
    /// Bytes reserved for writes in flight.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }
    /// See [`EvictionPolicy::recency_periods`].
    pub fn policy_recency_periods(&self) -> u64 {
        self.policy.recency_periods()
    }
    /// See [`EvictionPolicy::frequency_periods`].
    pub fn policy_frequency_periods(&self) -> u64 {
        self.policy.frequency_periods()
    }
    pub fn contains(&self, key: &CacheKey) -> bool {
        self.entries.contains_key(key)
    }
    pub fn size_of(&self, key: &CacheKey) -> Option<u64> {
        self.entries.get(key).copied()
    }
    pub fn keys(&self) -> impl Iterator<Item = (&CacheKey, &u64)> {
        self.entries.iter()
    }

    /// A demand read of `key` missed and fills nothing (see
    /// [`crate::policy::EvictionPolicy::on_unfilled_miss`]).
    pub fn note_unfilled_miss(&mut self, key: &CacheKey, ctx: &AccessContext) {
        if !self.entries.contains_key(key) {
            self.policy.on_unfilled_miss(key, ctx);
        }
    }

    /// Records a read of `key`; returns whether it was resident.
    pub fn touch(&mut self, key: &CacheKey, ctx: &AccessContext) -> bool {
        if self.entries.contains_key(key) {
            self.policy.on_hit(key, ctx);
            true
        } else {
            false
        }
    }

    /// Makes room for `key` of `size` bytes and records it as resident at once (the
    /// replay's synchronous path: its bytes "land" in simulated time).
    ///
    /// The budget holds afterwards whatever the policy does: if the policy runs out of
    /// victims before enough room is made, the item is refused.
    pub fn place(
        &mut self,
        key: &CacheKey,
        size: u64,
        ctx: &AccessContext,
    ) -> Result<Placement, CacheError> {
        let placement = self.reserve(key, size, ctx)?;
        if let Placement::Admitted { .. } = &placement {
            self.commit(key, size, ctx);
        }
        Ok(placement)
    }

    /// Makes room for `key` of `size` bytes and charges them as a write in flight; the
    /// key is not a resident (nor a possible victim) until [`Self::commit`]. On
    /// `Admitted` the caller must end the reservation with `commit` or `release`, and
    /// remove the victims' bytes from the device before the write.
    pub fn reserve(
        &mut self,
        key: &CacheKey,
        size: u64,
        ctx: &AccessContext,
    ) -> Result<Placement, CacheError> {
        if size > self.budget {
            return Err(CacheError::TooLarge {
                size,
                limit: self.budget,
            });
        }
        if self.entries.contains_key(key) {
            self.policy.on_hit(key, ctx);
            return Ok(Placement::AlreadyResident);
        }
        if !self.policy.admit(key, size, ctx) {
            return Ok(Placement::Refused {
                evicted: Vec::new(),
            });
        }
        let mut evicted = Vec::new();
        while self.over(size) {
            let Some(victim) = self.policy.victim() else {
                // Only writes in flight are left to free: refuse rather than overrun.
                return Ok(Placement::Refused { evicted });
            };
            match self.entries.remove(&victim) {
                Some(vsize) => {
                    self.used -= vsize;
                    self.policy.on_remove(&victim);
                    evicted.push((victim, vsize));
                }
                // A policy naming a non-resident is a policy bug; drop it from the
                // policy so the loop makes progress.
                None => self.policy.on_remove(&victim),
            }
        }
        self.reserved += size;
        self.reserved_entries += 1;
        Ok(Placement::Admitted { evicted })
    }

    /// The reserved write of `key` landed: it becomes a resident. Returns false (and
    /// frees the reservation) if it already was one (a concurrent write of the same
    /// immutable value landed first).
    pub fn commit(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) -> bool {
        self.reserved = self.reserved.saturating_sub(size);
        self.reserved_entries = self.reserved_entries.saturating_sub(1);
        if self.entries.contains_key(key) {
            return false;
        }
        self.entries.insert(key.clone(), size);
        self.used += size;
        self.policy.on_insert(key, size, ctx);
        true
    }

    /// The reserved write failed: its bytes are no longer charged.
    pub fn release(&mut self, size: u64) {
        self.reserved = self.reserved.saturating_sub(size);
        self.reserved_entries = self.reserved_entries.saturating_sub(1);
    }

    /// Evicts the residents the policy names until `bytes` are freed or none is left
    /// (writes in flight stay): the device is needed for something that cannot be
    /// made again. The caller removes the victims' bytes.
    pub fn shed(&mut self, bytes: u64) -> Vec<(CacheKey, u64)> {
        let (mut freed, mut evicted) = (0, Vec::new());
        while freed < bytes {
            let Some(victim) = self.policy.victim() else {
                break;
            };
            if let Some(size) = self.entries.remove(&victim) {
                self.used -= size;
                freed += size;
                evicted.push((victim.clone(), size));
            }
            self.policy.on_remove(&victim);
        }
        evicted
    }

    /// Forgets `key` (removed by a caller, or found corrupt); returns its size.
    pub fn remove(&mut self, key: &CacheKey) -> Option<u64> {
        let size = self.entries.remove(key)?;
        self.used -= size;
        self.policy.on_remove(key);
        Some(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::LruPolicy;
    use proptest::prelude::*;

    proptest! {
        /// Whatever sequence of places and removes, `used` equals the sum of resident
        /// sizes and never exceeds the budget.
        #[test]
        fn budget_always_holds(ops in proptest::collection::vec((0u64..50, 1u64..40, any::<bool>()), 1..300)) {
            let mut s = TierSpace::new(100, Box::new(LruPolicy::new()));
            let ctx = AccessContext::default();
            for (id, size, remove) in ops {
                let k = CacheKey::file("f", "v", id);
                if remove {
                    s.remove(&k);
                } else {
                    let _ = s.place(&k, size, &ctx);
                }
                prop_assert!(s.used() + s.reserved() <= s.budget());
                prop_assert_eq!(s.used(), s.keys().map(|(_, v)| *v).sum::<u64>());
            }
        }
    }

    proptest! {
        /// Reservations in flight are charged but never chosen as victims: whatever
        /// interleaving of reserve / commit / release / remove, the budget covers
        /// residents plus writes in flight, and no victim is a key still in flight.
        #[test]
        fn writes_in_flight_are_charged_and_never_evicted(
            ops in proptest::collection::vec((0u8..4, 0u64..30, 1u64..30), 1..300),
            max_entries in proptest::option::of(1usize..8),
        ) {
            let mut s = TierSpace::new(100, Box::new(LruPolicy::new()))
                .with_max_entries(max_entries);
            let ctx = AccessContext::default();
            let mut flight: Vec<(CacheKey, u64)> = Vec::new();
            for (op, id, size) in ops {
                let k = CacheKey::file("f", "v", id);
                match op {
                    // (The engine's single-flight keeps one fill of a key per level.)
                    0 if !flight.iter().any(|(f, _)| *f == k) => {
                        let (admitted, evicted) = match s.reserve(&k, size, &ctx) {
                            Ok(Placement::Admitted { evicted }) => (true, evicted),
                            Ok(Placement::Refused { evicted }) => (false, evicted),
                            _ => (false, Vec::new()),
                        };
                        for (v, _) in &evicted {
                            prop_assert!(!flight.iter().any(|(f, _)| f == v));
                        }
                        if admitted {
                            flight.push((k, size));
                        }
                    }
                    1 if !flight.is_empty() => {
                        let (k, size) = flight.remove(id as usize % flight.len());
                        s.commit(&k, size, &ctx);
                    }
                    2 if !flight.is_empty() => {
                        let (_, size) = flight.remove(id as usize % flight.len());
                        s.release(size);
                    }
                    _ => {
                        s.remove(&k);
                    }
                }
                let in_flight: u64 = flight.iter().map(|(_, n)| n).sum();
                prop_assert_eq!(s.reserved(), in_flight);
                // Residents and writes in flight together within the entry bound.
                prop_assert!(s.len() + flight.len() <= max_entries.unwrap_or(usize::MAX));
                prop_assert!(s.used() + s.reserved() <= s.budget());
                prop_assert_eq!(s.used(), s.keys().map(|(_, v)| *v).sum::<u64>());
            }
        }
    }

    /// An entry bound evicts as a byte budget does: the least recently used first,
    /// however few bytes the residents hold.
    #[test]
    fn entry_bound_evicts_the_oldest_residents() {
        let mut s = TierSpace::new(1 << 30, Box::new(LruPolicy::new())).with_max_entries(Some(3));
        let ctx = AccessContext::default();
        let k = |i| CacheKey::file("f", "v", i);
        for i in 0..3 {
            s.place(&k(i), 10, &ctx).expect("place");
        }
        assert_eq!(
            s.place(&k(3), 10, &ctx).expect("place"),
            Placement::Admitted {
                evicted: vec![(k(0), 10)]
            }
        );
        assert_eq!((s.len(), s.used()), (3, 30));
    }

    /// Shedding frees at least what was asked, least recently used first, and never
    /// a write in flight.
    #[test]
    fn shed_frees_the_oldest_residents_and_keeps_writes_in_flight() {
        let mut s = TierSpace::new(100, Box::new(LruPolicy::new()));
        let ctx = AccessContext::default();
        let k = |i| CacheKey::file("f", "v", i);
        for i in 0..4 {
            s.place(&k(i), 20, &ctx).expect("place");
        }
        assert!(matches!(
            s.reserve(&k(9), 10, &ctx),
            Ok(Placement::Admitted { .. })
        ));
        let shed = s.shed(30);
        assert_eq!(shed, vec![(k(0), 20), (k(1), 20)]);
        assert_eq!((s.used(), s.reserved()), (40, 10));
        let rest = s.shed(1_000);
        assert_eq!(rest.len(), 2, "every resident, then it stops");
        assert_eq!(
            (s.used(), s.reserved()),
            (0, 10),
            "the write in flight stays"
        );
    }

    #[test]
    fn too_large_is_an_error() {
        let mut s = TierSpace::new(10, Box::new(LruPolicy::new()));
        assert!(matches!(
            s.place(&CacheKey::file("f", "v", 0), 11, &AccessContext::default()),
            Err(CacheError::TooLarge { .. })
        ));
    }
}
