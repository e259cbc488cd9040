//! Synthetic, seeded traces for tests and `examples/semantic_eval.rs`: the naming
//! schemes of the issue (ImageNet-style class directories, tar shards, dated partitions,
//! `-of-N` checkpoints), interleaved tenants, per-epoch shuffles and purely random reads.
//! Deterministic: the splitmix64 generator of `strata-types`, no external randomness.

use strata_types::{JobId, SplitMix64};

use super::eval::{evaluate, EvalConfig, EvalReport};
use super::tokenize::civil_from_days;
use super::tokenize::days_from_civil;
use super::{SemanticConfig, SemanticPredictor};
use crate::AccessEvent;

/// SplitMix64 ([`SplitMix64`]): tiny, seeded, good enough for trace generation.
#[derive(Clone, Debug)]
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// A trace, the listings a mount would have, and the cache window to evaluate it with.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: &'static str,
    pub events: Vec<AccessEvent>,
    /// `(dir, [(name, size)])`.
    pub listings: Vec<(String, Vec<(String, u64)>)>,
    pub window: usize,
    /// Evaluate with one cache shared by all jobs ([`EvalConfig::shared`]).
    pub shared: bool,
}

impl Workload {
    /// One job's reads of names no listing shows, in a 64-block window.
    fn unlisted(name: &'static str, events: Vec<AccessEvent>) -> Self {
        Self {
            name,
            events,
            listings: Vec::new(),
            window: 64,
            shared: false,
        }
    }

    /// Reads of the listed `files` (or some of them).
    fn listed(
        name: &'static str,
        files: &[(String, u64)],
        events: Vec<AccessEvent>,
        window: usize,
        shared: bool,
    ) -> Self {
        Self {
            name,
            events,
            listings: listings_of(files),
            window,
            shared,
        }
    }

    /// Evaluates a fresh [`SemanticPredictor`] with `cfg`, given this workload's listings.
    pub fn eval_semantic(&self, cfg: SemanticConfig) -> EvalReport {
        let mut p = SemanticPredictor::new(cfg);
        for (dir, entries) in &self.listings {
            p.observe_listing_sized(dir, entries);
        }
        evaluate(
            &self.events,
            &mut p,
            EvalConfig {
                window: self.window,
                shared: self.shared,
            },
        )
    }

    pub fn demand_bytes(&self) -> u64 {
        self.events.iter().map(|e| e.len).sum()
    }
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn event(job: u64, path: String, offset: u64, len: u64, size: u64) -> AccessEvent {
    AccessEvent::read(job, &path, offset, len, size)
}

/// `n` files named by `name`, of 64 to 128 KiB each.
fn varied_files(rng: &mut Rng, n: usize, name: impl Fn(usize) -> String) -> Vec<(String, u64)> {
    (0..n)
        .map(|i| (name(i), 64 * KIB + rng.below(64 * KIB)))
        .collect()
}

/// `epochs` passes over `files`, each in a fresh random order that `read` turns into
/// the epoch's events.
fn per_epoch(
    rng: &mut Rng,
    files: &[(String, u64)],
    epochs: usize,
    mut read: impl FnMut(&mut Rng, &[(String, u64)]) -> Vec<AccessEvent>,
) -> Vec<AccessEvent> {
    let mut events = Vec::new();
    for _ in 0..epochs {
        let mut order = files.to_vec();
        rng.shuffle(&mut order);
        events.extend(read(rng, &order));
    }
    events
}

/// Whole-file reads of `(path, size)` by `job`.
fn whole(job: u64, files: &[(String, u64)]) -> Vec<AccessEvent> {
    files
        .iter()
        .map(|(p, s)| event(job, p.clone(), 0, *s, *s))
        .collect()
}

/// Reads of `(path, size)` in `chunk`-byte pieces.
fn chunked(job: u64, files: &[(String, u64)], chunk: u64) -> Vec<AccessEvent> {
    let mut out = Vec::new();
    for (p, s) in files {
        let mut off = 0;
        while off < *s {
            let len = chunk.min(s - off);
            out.push(event(job, p.clone(), off, len, *s));
            off += len;
        }
    }
    out
}

fn listings_of(files: &[(String, u64)]) -> Vec<(String, Vec<(String, u64)>)> {
    let mut dirs: Vec<(String, Vec<(String, u64)>)> = Vec::new();
    for (p, s) in files {
        let (d, n) = p.rsplit_once('/').unwrap_or(("", p));
        match dirs.iter_mut().find(|(x, _)| x == d) {
            Some((_, v)) => v.push((n.to_owned(), *s)),
            None => dirs.push((d.to_owned(), vec![(n.to_owned(), *s)])),
        }
    }
    dirs
}

fn set_job(events: &mut [AccessEvent], job: u64) {
    for e in events {
        e.job = JobId(job);
    }
}

/// Merges per-tenant traces, picking the next tenant at random (order within each
/// tenant kept): requests of all tenants alternate unpredictably.
pub fn interleave(seed: u64, tenants: Vec<Vec<AccessEvent>>) -> Vec<AccessEvent> {
    let mut rng = Rng::new(seed);
    let mut iters: Vec<std::vec::IntoIter<AccessEvent>> =
        tenants.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::new();
    let mut live: Vec<usize> = (0..iters.len()).collect();
    while !live.is_empty() {
        let pick = rng.below(live.len() as u64) as usize;
        match iters[live[pick]].next() {
            Some(e) => out.push(e),
            None => {
                live.remove(pick);
            }
        }
    }
    out
}

/// ImageNet-style `train/nXXXXXXXX/nXXXXXXXX_N.JPEG`, sample numbers with gaps, read
/// in listing order (directories, then names), listings given.
pub fn name_ordered(seed: u64, classes: usize, per_class: usize) -> Workload {
    let mut rng = Rng::new(seed);
    let mut ids: Vec<u64> = (0..classes)
        .map(|_| 1_000_000 + rng.below(9_000_000))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut files = Vec::new();
    for id in ids {
        let mut n = rng.below(20_000);
        let mut names = Vec::new();
        for _ in 0..per_class {
            n += 1 + rng.below(30);
            names.push((
                format!("train/n{id:08}/n{id:08}_{n}.JPEG"),
                80 * KIB + rng.below(80 * KIB),
            ));
        }
        // Listing order is by name: `_10026` sorts before `_9`.
        names.sort();
        files.extend(names);
    }
    Workload::listed(
        "name-ordered small files (listed)",
        &files,
        whole(1, &files),
        64,
        false,
    )
}

/// `data/img_N.jpg`, N = 1.., unpadded, in numeric order, no listing.
pub fn numbered(n: usize) -> Workload {
    let files: Vec<(String, u64)> = (1..=n)
        .map(|i| (format!("data/img_{i}.jpg"), 100 * KIB))
        .collect();
    Workload::unlisted("numbered small files (unlisted)", whole(1, &files))
}

/// `shards/train-NNNNNN.tar` (64 MiB), read in 16 MiB pieces, no listing.
pub fn shards(n: usize) -> Workload {
    let files: Vec<(String, u64)> = (0..n)
        .map(|i| (format!("shards/train-{i:06}.tar"), 64 * MIB))
        .collect();
    Workload::unlisted("tar shards (unlisted)", chunked(1, &files, 16 * MIB))
}

/// `lake/events/date=YYYY-MM-DD/part-NNNN.parquet`, `parts` per day from 2025-01-20
/// (crossing a month end), 2 MiB parts, no listing.
pub fn dated(days: i64, parts: usize) -> Workload {
    let start = days_from_civil(2025, 1, 20);
    let mut files = Vec::new();
    for d in 0..days {
        let (y, m, dd) = civil_from_days(start + d);
        for p in 0..parts {
            files.push((
                format!("lake/events/date={y:04}-{m:02}-{dd:02}/part-{p:04}.parquet"),
                2 * MIB,
            ));
        }
    }
    Workload::unlisted("dated partitions (unlisted)", whole(1, &files))
}

/// Dated partitions with a varying number of parts per day, listings given.
pub fn dated_listed(seed: u64, days: i64) -> Workload {
    let mut rng = Rng::new(seed);
    let start = days_from_civil(2025, 2, 20);
    let mut files = Vec::new();
    for d in 0..days {
        let (y, m, dd) = civil_from_days(start + d);
        let parts = 3 + rng.below(10);
        for p in 0..parts {
            files.push((
                format!("lake/events/date={y:04}-{m:02}-{dd:02}/part-{p:04}.parquet"),
                2 * MIB,
            ));
        }
    }
    Workload::listed(
        "dated partitions, varying parts (listed)",
        &files,
        whole(1, &files),
        64,
        false,
    )
}

/// `ckpt/step-K/model-0000i-of-0000N.safetensors` loads (1 GiB shards read as 256 MiB
/// pieces), `loads` checkpoints of `shards` shards each, no listing.
pub fn checkpoints(loads: usize, shards: usize) -> Workload {
    let mut files = Vec::new();
    for l in 1..=loads {
        for s in 1..=shards {
            files.push((
                format!(
                    "ckpt/step-{}/model-{s:05}-of-{shards:05}.safetensors",
                    l * 1000
                ),
                1 << 30,
            ));
        }
    }
    Workload::unlisted(
        "checkpoint shards -of-N (unlisted)",
        chunked(1, &files, 256 * MIB),
    )
}

/// Four tenants (shards, dated partitions, ImageNet-style, numbered files) whose requests
/// alternate at random; `one_job` gives them all the same job id (one mount handle).
pub fn four_tenants(seed: u64, one_job: bool) -> Workload {
    let parts = [
        shards(300),
        dated(40, 8),
        name_ordered(seed, 10, 60),
        numbered(1200),
    ];
    let mut listings = Vec::new();
    let mut traces = Vec::new();
    for (i, mut w) in parts.into_iter().enumerate() {
        set_job(&mut w.events, if one_job { 1 } else { i as u64 + 1 });
        listings.extend(w.listings);
        traces.push(w.events);
    }
    Workload {
        name: if one_job {
            "four tenants interleaved, one job id"
        } else {
            "four tenants interleaved"
        },
        events: interleave(seed ^ 0x5eed, traces),
        listings,
        window: 64,
        shared: false,
    }
}

/// Four workers of one job reading disjoint shard ranges of one template, interleaved.
pub fn four_workers_one_template(seed: u64, per_worker: usize) -> Workload {
    let traces = (0..4)
        .map(|w| {
            let files: Vec<(String, u64)> = (0..per_worker)
                .map(|i| (format!("shards/train-{:06}.tar", w * 10_000 + i), 64 * MIB))
                .collect();
            whole(1, &files)
        })
        .collect();
    Workload::unlisted(
        "four workers, one job, one template",
        interleave(seed, traces),
    )
}

/// A listed set of `n` files read in a fresh random order each epoch. The window is the
/// set size: prefetching "some unread member" pays off only if the cache keeps
/// prefetched members until the epoch reads them.
pub fn shuffled_epochs(seed: u64, n: usize, epochs: usize) -> Workload {
    let mut rng = Rng::new(seed);
    let files = varied_files(&mut rng, n, |i| format!("train/sample-{i:06}.jpg"));
    let events = per_epoch(&mut rng, &files, epochs, |_, order| whole(1, order));
    Workload::listed(
        "per-epoch shuffle over a listed set",
        &files,
        events,
        n,
        false,
    )
}

/// PyTorch-style data loading: each epoch is a fresh permutation of the `n` listed
/// files, dealt round-robin to `workers` loader processes (job ids 1..=workers), whose
/// reads interleave at random. No worker alone reads the whole set; together they do.
/// Evaluated with one shared cache, window = set size.
pub fn loader_workers(seed: u64, n: usize, workers: usize, epochs: usize) -> Workload {
    let mut rng = Rng::new(seed);
    let files = varied_files(&mut rng, n, |i| {
        format!("train/c{:03}/img-{i:06}.jpg", i % 100)
    });
    let events = per_epoch(&mut rng, &files, epochs, |rng, order| {
        let traces = (0..workers)
            .map(|w| {
                let mine: Vec<(String, u64)> =
                    order.iter().skip(w).step_by(workers).cloned().collect();
                whole(w as u64 + 1, &mine)
            })
            .collect();
        interleave(rng.next_u64(), traces)
    });
    Workload::listed(
        "loader workers splitting per-epoch shuffles",
        &files,
        events,
        n,
        true,
    )
}

/// A listed set of `n` files of which each epoch reads a random `fraction`, without
/// replacement: looks like a shuffle until the first repeat.
pub fn sampled_epochs(seed: u64, n: usize, fraction: f64, epochs: usize) -> Workload {
    let mut rng = Rng::new(seed);
    let files: Vec<(String, u64)> = (0..n)
        .map(|i| (format!("train/sample-{i:06}.jpg"), 96 * KIB))
        .collect();
    let take = ((n as f64 * fraction) as usize).min(n);
    let events = per_epoch(&mut rng, &files, epochs, |_, order| {
        whole(1, &order[..take])
    });
    Workload::listed(
        "per-epoch random subset of a listed set",
        &files,
        events,
        n,
        false,
    )
}

/// Uniform random reads with replacement from a listed set of `n` files.
pub fn random_listed(seed: u64, n: usize, reads: usize) -> Workload {
    let mut rng = Rng::new(seed);
    let files: Vec<(String, u64)> = (0..n)
        .map(|i| (format!("pool/obj-{i:06}.bin"), 128 * KIB))
        .collect();
    let picks: Vec<(String, u64)> = (0..reads)
        .map(|_| files[rng.below(n as u64) as usize].clone())
        .collect();
    Workload::listed(
        "random reads of a listed set",
        &files,
        whole(1, &picks),
        64,
        false,
    )
}

/// Random numbered names in `0..range`, unlisted (a small range makes chance strides
/// likelier).
pub fn random_numbers(seed: u64, range: u64, reads: usize) -> Workload {
    let mut rng = Rng::new(seed);
    let picks: Vec<(String, u64)> = (0..reads)
        .map(|_| (format!("blobs/obj-{:08}.dat", rng.below(range)), 128 * KIB))
        .collect();
    Workload::unlisted("random numbered names (unlisted)", whole(1, &picks))
}

/// Content-addressed names (`kv/ns/<16 hex>`), random.
pub fn random_hashes(seed: u64, reads: usize) -> Workload {
    let mut rng = Rng::new(seed);
    let picks: Vec<(String, u64)> = (0..reads)
        .map(|_| (format!("kv/ns/{:016x}", rng.next_u64()), 256 * KIB))
        .collect();
    Workload::unlisted("random hashed names", whole(1, &picks))
}
