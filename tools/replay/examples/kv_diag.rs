//! Miss timeline of policies on one trace (issue 13, KV traces): demand misses and hits
//! per slice of simulated time, side by side, with the pattern-aware policy's split
//! (window share, window / main bytes, ghost hits) at the end of each slice, and the
//! retention pattern the tracker gave its demand accesses. On KV request traces the
//! link is overloaded in bursts, so *when* a policy misses decides the total JCT more
//! than its overall hit ratio.
//!
//! `cargo run --release -p strata-replay --example kv_diag -- TRACE CAP% POLICIES [SLICES]`

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use strata_cache_core::policy::EvictionPolicy;
use strata_cache_core::{AccessContext, CacheKey};
use strata_replay::replay::{diag_policy_set, replay, DiagTarget, Prepared, ReplayConfig};

#[derive(Default)]
struct Slice {
    misses: u64,
    hits: u64,
    state: String,
}

#[derive(Default)]
struct Diag {
    slices: BTreeMap<u64, Slice>,
    patterns: BTreeMap<String, u64>,
}

struct Wrap {
    target: DiagTarget,
    diag: Arc<Mutex<Diag>>,
    slice_ns: u64,
}

impl Wrap {
    fn note(&self, ctx: &AccessContext, hit: bool) {
        let mut d = self.diag.lock().expect("not poisoned");
        let o = ctx.obs;
        *d.patterns
            .entry(format!(
                "{} ret={:?} b={:?}{}",
                if hit { "hit " } else { "miss" },
                o.retention(),
                o.blocks,
                if o.shared { " shared" } else { "" }
            ))
            .or_default() += 1;
        let state = self.target.strata().map(|s| {
            let st = s.lock().expect("not poisoned").stats();
            format!(
                "wshare {:.2} win {} main {} cons {} stable {} wg {} mg {} cg {} ctarget {}",
                st.window_share,
                st.window_bytes >> 20,
                (st.freq_bytes - st.window_bytes) >> 20,
                st.consumed_bytes >> 20,
                st.stable_bytes >> 20,
                st.window_ghost_hits,
                st.main_ghost_hits,
                st.consumed_ghost_hits,
                st.consumed_target >> 20
            )
        });
        let s = d.slices.entry(ctx.now_ns / self.slice_ns).or_default();
        if hit {
            s.hits += 1;
        } else {
            s.misses += 1;
        }
        if let Some(st) = state {
            s.state = st;
        }
    }
}

impl EvictionPolicy for Wrap {
    fn name(&self) -> &'static str {
        "diag"
    }
    fn admit(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) -> bool {
        if ctx.is_demand() {
            self.note(ctx, false);
        }
        self.target.with(|p| p.admit(key, size, ctx))
    }
    fn on_insert(&mut self, key: &CacheKey, size: u64, ctx: &AccessContext) {
        self.target.with(|p| p.on_insert(key, size, ctx))
    }
    fn on_hit(&mut self, key: &CacheKey, ctx: &AccessContext) {
        if ctx.is_demand() {
            self.note(ctx, true);
        }
        self.target.with(|p| p.on_hit(key, ctx))
    }
    fn on_remove(&mut self, key: &CacheKey) {
        self.target.with(|p| p.on_remove(key))
    }
    fn victim(&mut self) -> Option<CacheKey> {
        self.target.with(|p| p.victim())
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 4 || args.len() == 5,
        "usage: kv_diag TRACE CAP% POLICIES [SLICES]"
    );
    let t = strata_replay::trace::read_file(std::path::Path::new(&args[1]))?;
    // Slice length: the trace's span of arrivals over SLICES (simulated time runs longer
    // under overload; later slices extend past it).
    let span = t.records.iter().map(|r| r.ts_ns).max().unwrap_or(0).max(1);
    let p = Prepared::new(t, strata_cache_core::DEFAULT_BLOCK_SIZE);
    let cap = strata_replay::replay::parse_capacity(&args[2], p.unique_bytes())?;
    let slices: u64 = args.get(4).map_or(Ok(20), |s| s.parse())?;
    let cfg = ReplayConfig::new(cap);
    let slice_ns = span.div_ceil(slices.max(1));
    let runs: Vec<String> = args[3].split(',').map(String::from).collect();
    let mut table: Vec<(String, BTreeMap<u64, Slice>, f64, f64)> = Vec::new();
    for name in runs {
        let diag = Arc::new(Mutex::new(Diag::default()));
        // Retention alone: no prefetch (it never fires on KV traces; see the module doc).
        let (mut set, strata) = diag_policy_set(&name, cap, |target| {
            Box::new(Wrap {
                target,
                diag: diag.clone(),
                slice_ns,
            }) as Box<dyn EvictionPolicy>
        })?;
        set.controller = None;
        let r = replay(&p, set, &cfg);
        let d = std::mem::take(&mut *diag.lock().expect("not poisoned"));
        println!(
            "== {name}: total JCT {:.1} s, hr {:.4}",
            r.total_jct_s, r.hit_ratio
        );
        let mut v: Vec<_> = d.patterns.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        for (k, n) in v.iter().take(8) {
            println!("   {n:>8} {k}");
        }
        if let Some(s) = &strata {
            println!("   end state {:?}", s.lock().expect("not poisoned").stats());
        }
        table.push((name, d.slices, r.total_jct_s, r.hit_ratio));
    }
    let keys: std::collections::BTreeSet<u64> =
        table.iter().flat_map(|t| t.1.keys().copied()).collect();
    print!("slice(s)");
    for t in &table {
        print!(" | {} miss/acc", t.0);
    }
    println!(" | strata state");
    for k in keys {
        print!("{:>7.0}", (k * slice_ns) as f64 / 1e9);
        let mut st = String::new();
        for t in &table {
            let s = t.1.get(&k);
            let (m, h) = s.map_or((0, 0), |s| (s.misses, s.hits));
            print!(" | {m:>6}/{:<6}", m + h);
            if let Some(s) = s {
                if !s.state.is_empty() {
                    st = s.state.clone();
                }
            }
        }
        println!(" | {st}");
    }
    Ok(())
}
