//! Byte accounting and eviction for one tier: the synchronous core that both the async
//! engine and the replay simulator drive, so a policy is measured by the same code that
//! serves reads.

use std::collections::HashMap;

use crate::access::AccessContext;
use crate::error::CacheError;
use crate::key::CacheKey;
use crate::policy::{EvictionPolicy, KeyBuild};

/// The residents of one tier under a byte budget.
pub struct TierSpace {
    budget: u64,
    used: u64,
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
    /// The policy's admission hook refused it.
    Refused,
}

impl TierSpace {
    pub fn new(budget: u64, policy: Box<dyn EvictionPolicy>) -> Self {
        TierSpace {
            budget,
            used: 0,
            entries: HashMap::default(),
            policy,
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }
    pub fn used(&self) -> u64 {
        self.used
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
    pub fn contains(&self, key: &CacheKey) -> bool {
        self.entries.contains_key(key)
    }
    pub fn size_of(&self, key: &CacheKey) -> Option<u64> {
        self.entries.get(key).copied()
    }
    pub fn keys(&self) -> impl Iterator<Item = (&CacheKey, &u64)> {
        self.entries.iter()
    }

    /// The pattern the policy has classified `key`'s stream as.
    pub fn pattern_of(&self, key: &CacheKey, ctx: &AccessContext) -> crate::pattern::Pattern {
        self.policy.pattern_of(key, ctx)
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

    /// Makes room for `key` of `size` bytes and records it as resident.
    ///
    /// The budget holds afterwards whatever the policy does: if the policy runs out of
    /// victims before enough room is made, the item is refused.
    pub fn place(
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
            return Ok(Placement::Refused);
        }
        let mut evicted = Vec::new();
        while self.used + size > self.budget {
            let Some(victim) = self.policy.victim() else {
                return Ok(Placement::Refused);
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
        self.entries.insert(key.clone(), size);
        self.used += size;
        self.policy.on_insert(key, size, ctx);
        Ok(Placement::Admitted { evicted })
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
                prop_assert!(s.used() <= s.budget());
                prop_assert_eq!(s.used(), s.keys().map(|(_, v)| *v).sum::<u64>());
            }
        }
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
