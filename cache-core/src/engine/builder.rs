//! [`EngineBuilder`]: the levels, their policies and the engine's switches.

use super::*;

/// Builds a [`CacheEngine`].
pub struct EngineBuilder {
    levels: Vec<(Arc<dyn Tier>, Box<dyn EvictionPolicy>)>,
    write_through: bool,
    tree: TreeConfig,
    degraded_backoff: Duration,
    /// Bound on bytes written behind readers (None: [`WriteBehind::default_cap`]).
    write_behind: Option<u64>,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        // Write-through to persistent tiers by default: a restart is then warm.
        EngineBuilder {
            levels: Vec::new(),
            write_through: true,
            tree: TreeConfig::default(),
            degraded_backoff: DEFAULT_DEGRADED_BACKOFF,
            write_behind: None,
        }
    }
}

impl EngineBuilder {
    /// Adds a level below the ones added so far, evicting with LRU.
    pub fn tier(self, tier: Arc<dyn Tier>) -> Self {
        self.tier_with_policy(tier, Box::new(LruPolicy::new()))
    }

    /// Adds a level below the ones added so far, with its own eviction policy.
    pub fn tier_with_policy(
        mut self,
        tier: Arc<dyn Tier>,
        policy: Box<dyn EvictionPolicy>,
    ) -> Self {
        self.levels.push((tier, policy));
        self
    }

    /// Whether fills also go to persistent (disk) levels at once, not only on demotion.
    pub fn write_through(mut self, on: bool) -> Self {
        self.write_through = on;
        self
    }

    /// The longest writes skip a persistent level after a device error on it (the
    /// first skip lasts [`FIRST_DEGRADED_BACKOFF`] or this, the shorter).
    pub fn degraded_backoff(mut self, backoff: Duration) -> Self {
        self.degraded_backoff = backoff;
        self
    }

    /// Bound on the bytes of file-block copies written to persistent levels behind
    /// their readers: its ceiling ([`crate::write_behind`]; the bound follows the disk
    /// below it). Default: a quarter of the fastest level, within 16..256 MiB.
    pub fn write_behind_bytes(mut self, bytes: u64) -> Self {
        self.write_behind = Some(bytes);
        self
    }

    /// Tunables of the access tracker's stream tree.
    pub fn tracker(mut self, tree: TreeConfig) -> Self {
        self.tree = tree;
        self
    }

    /// Builds the engine; the accounting of each level starts from what the tier already
    /// holds (a disk tier reopened after a restart). Residents the budget cannot hold
    /// (the budget shrank since the last run) are removed from the tier, so the budget
    /// stays the one account of its bytes.
    pub fn build(self) -> Result<CacheEngine> {
        if self.levels.is_empty() {
            return Err(CacheError::InvalidArgument(
                "an engine needs at least one tier".into(),
            ));
        }
        let ctx = AccessContext::default().moved(AccessKind::Promotion);
        let mut levels = Vec::with_capacity(self.levels.len());
        let mut spaces = Vec::with_capacity(self.levels.len());
        let mut excess = Vec::new();
        for (tier, policy) in self.levels {
            let max_entries = tier
                .max_entries()
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
            let mut space =
                TierSpace::new(tier.capacity_bytes(), policy).with_max_entries(max_entries);
            // Placed oldest first, so the first placed are the first victims. File
            // copies go before KV blocks whatever their order on the tier: the store
            // holds the file blocks, nothing else holds the KV blocks, and a tier
            // rebuilt in write order lost its hottest KV blocks (written first, read
            // since from memory, which the tier does not see) to the first new fills.
            let mut residents = tier.resident();
            residents.sort_by_key(|(key, _)| !key.refetchable());
            for (key, size) in residents {
                let size = tier.footprint(&key, size);
                // Older residents the budget evicts for newer ones leave the tier too
                // (they were left on the device, uncounted, before).
                match space.place(&key, size, &ctx) {
                    Ok(Placement::Admitted { evicted }) => {
                        excess.extend(evicted.into_iter().map(|(k, _)| (tier.clone(), k)));
                    }
                    Ok(Placement::Refused { evicted }) => {
                        excess.extend(evicted.into_iter().map(|(k, _)| (tier.clone(), k)));
                        excess.push((tier.clone(), key));
                    }
                    _ => excess.push((tier.clone(), key)),
                }
            }
            spaces.push(space);
            levels.push(Level {
                tier,
                evictions: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                quiet_hits: AtomicU64::new(0),
                in_place_hits: AtomicU64::new(0),
                degraded_until: AtomicU64::new(0),
                degraded: AtomicBool::new(false),
                degraded_backoff_ns: AtomicU64::new(0),
                degraded_cause: Mutex::new(String::new()),
                budget_lowered: AtomicBool::new(false),
                budget_checked_at: AtomicU64::new(0),
            });
        }
        let fastest = levels.first().map_or(0, |l| l.tier.capacity_bytes());
        let has_volatile_level = levels.iter().any(|l| l.tier.kind() != TierKind::Disk);
        if !excess.is_empty() {
            tracing::info!(
                blocks = excess.len(),
                "removing cached blocks beyond the configured budget"
            );
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move {
                        for (tier, key) in excess {
                            if let Err(e) = tier.remove(&key).await {
                                tracing::warn!(tier = %tier.name(), %key, error = %e, "removing an excess block failed");
                            }
                        }
                    });
                }
                Err(_) => tracing::warn!(
                    "no async runtime: blocks beyond the budget stay on the device until the next start"
                ),
            }
        }
        Ok(CacheEngine {
            inner: Arc::new(Inner {
                levels,
                state: Mutex::new(Hierarchy::with_tracker(spaces, self.tree)),
                write_through: self.write_through,
                inflight: Mutex::new(HashMap::new()),
                counters: EngineCounters::default(),
                epoch: Instant::now(),
                degraded_backoff: self.degraded_backoff,
                kept_elsewhere: parking_lot::RwLock::new(Vec::new()),
                write_behind: WriteBehind::new(
                    self.write_behind
                        .unwrap_or_else(|| WriteBehind::default_cap(fastest)),
                ),
                has_volatile_level,
            }),
        })
    }
}
