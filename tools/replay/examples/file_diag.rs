//! Per-access log of one policy on a small recorded trace (issue 13, file-format
//! traces): every demand hit/miss with the block, the retention pattern and the pool,
//! every insert (demand or prefetch) and every eviction with the pool it left.
//!
//! `cargo run --release -p strata-replay --example file_diag -- TRACE CAP% POLICY`

use strata_cache_core::policy::EvictionPolicy;
use strata_cache_core::{AccessContext, CacheKey};
use strata_replay::replay::{diag_policy_set, replay, DiagTarget, Prepared, ReplayConfig};

struct Wrap {
    target: DiagTarget,
}

fn k(key: &CacheKey) -> String {
    format!("{key:?}")
}

impl Wrap {
    /// Reload ghost hits so far (0 for a baseline).
    fn reloads(&self) -> u64 {
        self.target.strata().map_or(0, |s| {
            s.lock().expect("not poisoned").stats().reload_ghost_hits
        })
    }

    /// " reload" when the access just counted as a reload ghost hit.
    fn reload_mark(&self, before: u64) -> &'static str {
        if self.reloads() > before {
            " reload"
        } else {
            ""
        }
    }

    fn pool(&self, key: &CacheKey) -> &'static str {
        self.target
            .strata()
            .and_then(|s| s.lock().expect("not poisoned").pool_of(key))
            .unwrap_or("-")
    }
}

fn obs(ctx: &AccessContext) -> String {
    let o = ctx.obs;
    format!(
        "t={:.3} {} ret={:?} b={:?} f={:?} d={:?}{}{}",
        ctx.now_ns as f64 / 1e9,
        if ctx.is_prefetch() { "PF" } else { "D " },
        o.retention(),
        o.blocks,
        o.files,
        o.dirs,
        if o.files_reread { " reread" } else { "" },
        if o.shared { " shared" } else { "" }
    )
}

impl EvictionPolicy for Wrap {
    fn name(&self) -> &'static str {
        "diag"
    }
    fn admit(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) -> bool {
        let before = self.reloads();
        let r = self.target.with(|p| p.admit(key, size, ctx));
        println!(
            "MISS  {} {} size={size} admit={r}{}",
            k(key),
            obs(ctx),
            self.reload_mark(before)
        );
        r
    }
    fn on_insert(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) {
        self.target.with(|p| p.on_insert(key, size, ctx));
        println!("  INS {} -> {}", k(key), self.pool(key));
    }
    fn on_hit(&mut self, key: &CacheKey, ctx: &AccessContext) {
        let before = self.pool(key);
        let reloads = self.reloads();
        self.target.with(|p| p.on_hit(key, ctx));
        if ctx.is_demand() {
            println!(
                "HIT   {} {} in {before} -> {}{}",
                k(key),
                obs(ctx),
                self.pool(key),
                self.reload_mark(reloads)
            );
        }
    }
    fn on_remove(&mut self, key: &CacheKey) {
        println!("  EVICT {} from {}", k(key), self.pool(key));
        self.target.with(|p| p.on_remove(key));
    }
    fn victim(&mut self) -> Option<CacheKey> {
        self.target.with(|p| p.victim())
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 4, "usage: file_diag TRACE CAP% POLICY");
    let t = strata_replay::trace::read_file(std::path::Path::new(&args[1]))?;
    let p = Prepared::new(t, strata_cache_core::DEFAULT_BLOCK_SIZE);
    let cap = strata_replay::replay::parse_capacity(&args[2], p.unique_bytes())?;
    let cfg = ReplayConfig::new(cap);
    let name = args[3].as_str();
    let (set, strata) = diag_policy_set(name, cap, |target| {
        Box::new(Wrap { target }) as Box<dyn EvictionPolicy>
    })?;
    let r = replay(&p, set, &cfg);
    println!(
        "== {name} cap {} MiB: total JCT {:.3} s, hr {:.3}",
        cap >> 20,
        r.total_jct_s,
        r.hit_ratio
    );
    if let Some(s) = &strata {
        println!("   state {:?}", s.lock().expect("not poisoned").stats());
    }
    Ok(())
}
