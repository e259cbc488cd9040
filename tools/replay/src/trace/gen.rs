//! Synthetic workload generators: `strata trace gen --workload W --seed N`.
//!
//! Each generator writes the reads a job of one kind makes, with its compute ("think")
//! time between reads as the gap between timestamps. Output is a pure function of
//! `(workload, seed, scale)`: every random choice comes from one seeded `StdRng`.
//!
//! Default sizes (at `--scale 1`) are chosen so that a replay of `mixed` through all
//! seven policies takes seconds, while each working set is still thousands of blocks:
//!
//! | workload | default shape | unique bytes | reads |
//! |---|---|---|---|
//! | `train-small-files` | 10,000 JPEG-like files (log-normal, median 100 KiB) in 100 class dirs, 3 epochs, each shuffled, read by 8 loader workers (jobs `train-img-w0..7`, each every 8th file of the permutation); 1 ms compute per sample overall | ~1.2 GB | 30,000 |
//! | `shards` | 64 tar shards of 24..40 MiB read in 1 MiB reads by 4 workers (every 4th shard of the epoch's shuffled order each); 3 epochs; 2 ms per MiB overall | ~2.1 GB | ~6,100 |
//! | `checkpoint` | 8 safetensors files of 128 MiB read in 4 MiB reads by `load-0` at t=0, re-read by `load-1` at t=20 s | 1 GiB | 512 |
//! | `preprocess` | 32 parquet-like files (8 days x 4 parts), 4 row groups x 8 column chunks of 0.5..4 MiB + 64 KiB footer; 4 ETL jobs x 2 queries, each query reads the footer and 3..4 columns (columns 0 and 1 always) of every row group; 3 ms per chunk | ~2.3 GB | ~3,300 |
//! | `inference-skew` | 2,000 embedding shards of 512 KiB, 4 servers x 10,000 reads, Zipf(s=0.9) popularity over a random permutation; 5 ms per read (200 reads/s per server) | ~1 GiB | 40,000 |
//! | `kv-prefix` | 1 MiB KV blocks; 16 system prompts (4..16 blocks, Zipf(1.0)), 400 sessions of 1..6 turns on 4 engines; each turn reads its whole chained prefix; exp(50 ms) between requests | ~0.8 GB | ~20,000 |
//! | `mixed` | all six concurrently (checkpoint and KV jobs prefixed `ckpt-`, `kv-`): training (`train-`, `shards-`) at full size, `ckpt-` and `etl-` at 1/2, `infer-` and `kv-` at 1/4 of their counts, so streaming training data is most of the bytes | ~5.5 GB | ~45,000 |
//!
//! `--scale F` multiplies the counts (files, shards, sessions, reads), not the sizes.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal, Zipf};

use super::{Trace, TraceBuilder};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const MS: u64 = 1_000_000;
/// Data-loader workers of the small-files trainer (a common `num_workers`).
const LOADERS: usize = 8;
/// Reader workers of the shard trainer.
const SHARD_WORKERS: usize = 4;

/// The workloads `strata trace gen` can write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    TrainSmallFiles,
    Shards,
    Checkpoint,
    Preprocess,
    InferenceSkew,
    KvPrefix,
    Mixed,
}

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::TrainSmallFiles,
        Workload::Shards,
        Workload::Checkpoint,
        Workload::Preprocess,
        Workload::InferenceSkew,
        Workload::KvPrefix,
        Workload::Mixed,
    ];
}

/// The largest `--scale`: ~45,000 reads at scale 1 (`mixed`) become ~4.5 M, a trace of a
/// few hundred MB in memory that a replay still holds (well under
/// [`super::MAX_BLOCK_ACCESSES`] at 1 MiB blocks). `--scale 10^6` grew to 5 GB before
/// writing anything; `inf` or `1e30` overflowed the counts ("capacity overflow").
pub const MAX_SCALE: f64 = 100.0;

/// Checks a `--scale`: a finite number above 0 and at most [`MAX_SCALE`].
pub fn check_scale(scale: f64) -> Result<(), String> {
    if scale.is_finite() && scale > 0.0 && scale <= MAX_SCALE {
        Ok(())
    } else {
        Err(format!(
            "--scale {scale}: must be a number above 0 and at most {MAX_SCALE}"
        ))
    }
}

/// Generates the trace of `workload` for `seed` with counts multiplied by `scale`
/// (checked by [`check_scale`] first).
pub fn generate(workload: Workload, seed: u64, scale: f64) -> Trace {
    let mut b = TraceBuilder::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let g = &mut Gen {
        b: &mut b,
        scale,
        prefix: "",
    };
    match workload {
        Workload::TrainSmallFiles => g.train_small_files(&mut rng, 0),
        Workload::Shards => g.shards(&mut rng, 0),
        Workload::Checkpoint => g.checkpoint(&mut rng, 0),
        Workload::Preprocess => g.preprocess(&mut rng, 0),
        Workload::InferenceSkew => g.inference_skew(&mut rng, 0),
        Workload::KvPrefix => g.kv_prefix(&mut rng, 0),
        Workload::Mixed => {
            // A shared training cluster: the two training jobs at full size (streaming
            // training data is most of the bytes), preprocessing and the checkpoint
            // load/re-load at half size, inference (embeddings, KV) at a quarter of
            // their standalone counts. Each component gets its own stream of randomness
            // so adding one does not change the others; jobs start 0.5 s apart.
            // Component job names are already distinct except the checkpoint loaders and
            // KV engines, which get a prefix.
            let parts = [
                ("", 1.0),
                ("", 1.0),
                ("ckpt-", 0.5),
                ("", 0.5),
                ("", 0.25),
                ("kv-", 0.25),
            ];
            for (i, (prefix, share)) in parts.into_iter().enumerate() {
                let mut r = StdRng::seed_from_u64(
                    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64 + 1),
                );
                g.prefix = prefix;
                g.scale = scale * share;
                let start = i as u64 * 500 * MS;
                match i {
                    0 => g.train_small_files(&mut r, start),
                    1 => g.shards(&mut r, start),
                    2 => g.checkpoint(&mut r, start),
                    3 => g.preprocess(&mut r, start),
                    4 => g.inference_skew(&mut r, start),
                    _ => g.kv_prefix(&mut r, start),
                }
            }
        }
    }
    let mut t = b.finish();
    t.sort_by_time();
    t
}

struct Gen<'a> {
    b: &'a mut TraceBuilder,
    scale: f64,
    /// Prepended to job names (for `mixed`).
    prefix: &'static str,
}

/// One job's clock while generating.
struct Job {
    id: u32,
    t: u64,
}

impl Gen<'_> {
    fn n(&self, base: usize) -> usize {
        ((base as f64 * self.scale).round() as usize).max(1)
    }

    fn job(&mut self, name: &str, start: u64) -> Job {
        let id = self.b.job(&format!("{}{name}", self.prefix));
        Job { id, t: start }
    }

    /// `n` worker jobs `{name}-w0..`, all starting at `start`.
    fn workers(&mut self, name: &str, n: usize, start: u64) -> Vec<Job> {
        (0..n)
            .map(|w| self.job(&format!("{name}-w{w}"), start))
            .collect()
    }

    fn path(&mut self, name: &str, size: u64) -> u32 {
        // Generators name each path with one size, so a clash is a generator bug.
        self.b
            .path(name, size)
            .unwrap_or_else(|e| panic!("generator bug: {e}"))
    }

    /// Records a read at the job's clock, then advances the clock by `think`.
    fn read(&mut self, j: &mut Job, path: u32, offset: u64, len: u64, think: u64) {
        self.b
            .push(j.t, j.id, path, offset, len)
            .unwrap_or_else(|e| panic!("generator bug: {e}"));
        j.t += think;
    }

    /// ImageNet-like `train/n01440764/n01440764_10026.JPEG`, whole-file reads, shuffled
    /// every epoch.
    fn train_small_files(&mut self, rng: &mut StdRng, start: u64) {
        let classes = self.n(100).min(1000);
        let per_class = self.n(10_000).div_ceil(classes);
        let sizes = LogNormal::new((100.0 * KIB as f64).ln(), 0.5).expect("valid log-normal");
        let mut files = Vec::with_capacity(classes * per_class);
        for c in 0..classes {
            let wnid = format!("n{:08}", 1_440_764 + c as u64 * 7_919);
            for i in 0..per_class {
                let size = (sizes.sample(rng) as u64).clamp(8 * KIB, MIB - 1);
                let name = format!("train/{wnid}/{wnid}_{}.JPEG", 10_000 + i * 3);
                files.push((self.path(&name, size), size));
            }
        }
        // Data-loader workers (PyTorch `num_workers`): worker w reads every
        // LOADERS-th file of the epoch's permutation; together 1 ms of compute per
        // sample.
        let mut jobs = self.workers("train-img", LOADERS, start);
        for _epoch in 0..3 {
            files.shuffle(rng);
            for (k, &(p, size)) in files.iter().enumerate() {
                let j = &mut jobs[k % LOADERS];
                self.read(j, p, 0, size, LOADERS as u64 * MS);
            }
        }
    }

    /// WebDataset-like `shards/train-000123.tar`, read sequentially in 1 MiB reads.
    fn shards(&mut self, rng: &mut StdRng, start: u64) {
        let n = self.n(64);
        let mut shards: Vec<(u32, u64)> = (0..n)
            .map(|i| {
                let size = rng.random_range(24 * MIB..40 * MIB);
                (self.path(&format!("shards/train-{i:06}.tar"), size), size)
            })
            .collect();
        // WebDataset workers: worker w streams every SHARD_WORKERS-th shard of the
        // epoch's order; together 2 ms of compute per MiB.
        let mut jobs = self.workers("train-shards", SHARD_WORKERS, start);
        for _epoch in 0..3 {
            shards.shuffle(rng);
            for (k, &(p, size)) in shards.iter().enumerate() {
                let j = &mut jobs[k % SHARD_WORKERS];
                let mut off = 0;
                while off < size {
                    let len = MIB.min(size - off);
                    self.read(j, p, off, len, SHARD_WORKERS as u64 * 2 * MS);
                    off += len;
                }
            }
        }
    }

    /// `model-00003-of-00008.safetensors`, loaded by one job then re-loaded by another.
    fn checkpoint(&mut self, _rng: &mut StdRng, start: u64) {
        let n = 8;
        let size = ((128.0 * self.scale).round() as u64).max(4) * MIB;
        let files: Vec<u32> = (1..=n)
            .map(|i| {
                self.path(
                    &format!("ckpt/llama-8b/model-{i:05}-of-{n:05}.safetensors"),
                    size,
                )
            })
            .collect();
        for (k, name) in ["load-0", "load-1"].into_iter().enumerate() {
            let mut j = self.job(name, start + k as u64 * 20_000 * MS);
            for &p in &files {
                let mut off = 0;
                while off < size {
                    let len = (4 * MIB).min(size - off);
                    self.read(&mut j, p, off, len, 0);
                    off += len;
                }
            }
        }
    }

    /// Parquet-like `lake/events/date=2025-01-07/part-0003.parquet`: column-chunk reads.
    fn preprocess(&mut self, rng: &mut StdRng, start: u64) {
        const ROW_GROUPS: usize = 4;
        const COLUMNS: usize = 8;
        const FOOTER: u64 = 64 * KIB;
        let days = self.n(8);
        struct File {
            path: u32,
            size: u64,
            /// (offset, len) of column chunk [row group][column].
            chunks: Vec<[(u64, u64); COLUMNS]>,
        }
        let mut files = Vec::new();
        for d in 0..days {
            for part in 0..4 {
                let mut off = 4; // "PAR1" magic
                let mut chunks = Vec::with_capacity(ROW_GROUPS);
                for _ in 0..ROW_GROUPS {
                    let mut rg = [(0, 0); COLUMNS];
                    for c in &mut rg {
                        let len = rng.random_range(MIB / 2..4 * MIB);
                        *c = (off, len);
                        off += len;
                    }
                    chunks.push(rg);
                }
                let size = off + FOOTER;
                let date = format!("2025-{:02}-{:02}", 1 + d / 28, 1 + d % 28);
                let path = self.path(
                    &format!("lake/events/date={date}/part-{part:04}.parquet"),
                    size,
                );
                files.push(File { path, size, chunks });
            }
        }
        for q in 0..4 {
            let mut j = self.job(&format!("etl-{q}"), start + q as u64 * 200 * MS);
            for _query in 0..2 {
                // Columns 0 and 1 (timestamp, user id) are in every query; one or two
                // others vary.
                let mut cols = vec![0, 1];
                let extra: usize = rng.random_range(1..=2);
                while cols.len() < 2 + extra {
                    let c = rng.random_range(2..COLUMNS);
                    if !cols.contains(&c) {
                        cols.push(c);
                    }
                }
                for f in &files {
                    self.read(&mut j, f.path, f.size - FOOTER, FOOTER, MS);
                    for rg in &f.chunks {
                        for &c in &cols {
                            let (off, len) = rg[c];
                            self.read(&mut j, f.path, off, len, 3 * MS);
                        }
                    }
                }
            }
        }
    }

    /// Zipf-popular embedding shards `models/emb/table-03/shard-00042.bin`.
    fn inference_skew(&mut self, rng: &mut StdRng, start: u64) {
        let n = self.n(2_000);
        let objs: Vec<u32> = (0..n)
            .map(|i| {
                self.path(
                    &format!("models/emb/table-{:02}/shard-{i:05}.bin", i % 16),
                    512 * KIB,
                )
            })
            .collect();
        // Rank -> object: popularity is not aligned with names.
        let mut rank: Vec<usize> = (0..n).collect();
        rank.shuffle(rng);
        let zipf = Zipf::new(n as f64, 0.9).expect("valid zipf");
        let reads = self.n(10_000);
        for s in 0..4 {
            let mut j = self.job(&format!("infer-{s}"), start + s as u64 * 10 * MS);
            for _ in 0..reads {
                let r = zipf.sample(rng) as usize - 1;
                self.read(&mut j, objs[rank[r.min(n - 1)]], 0, 512 * KIB, 5 * MS);
            }
        }
    }

    /// Chained-prefix KV blocks `kv/llama3-8b/<hash>`: shared system prompts, multi-turn
    /// sessions whose every turn re-reads the whole conversation prefix.
    fn kv_prefix(&mut self, rng: &mut StdRng, start: u64) {
        const BLOCK: u64 = MIB;
        fn chain(parent: u64, content: u64) -> u64 {
            // FNV-1a over (parent, content): a stand-in for a chained prefix hash.
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in parent
                .to_le_bytes()
                .into_iter()
                .chain(content.to_le_bytes())
            {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            h
        }
        let prompts: Vec<Vec<u64>> = (0..16u64)
            .map(|p| {
                let len = rng.random_range(4..=16);
                let mut h = 0;
                (0..len)
                    .map(|i| {
                        h = chain(h, p << 32 | i);
                        h
                    })
                    .collect()
            })
            .collect();
        let prompt_pop = Zipf::new(prompts.len() as f64, 1.0).expect("valid zipf");
        let sessions = self.n(400);
        // Requests: (session, turn). Sessions arrive over time; turns of one session are
        // in order but interleave with other sessions'.
        let mut state: Vec<(Vec<u64>, usize)> = (0..sessions)
            .map(|_| {
                let p = prompt_pop.sample(rng) as usize - 1;
                (
                    prompts[p.min(prompts.len() - 1)].clone(),
                    rng.random_range(1..=6),
                )
            })
            .collect();
        let mut pending: Vec<usize> = Vec::new();
        let mut next_new = 0usize;
        let gap = Exp::new(1.0 / (50.0 * MS as f64)).expect("valid exp");
        let engines: Vec<u32> = (0..4)
            .map(|e| self.b.job(&format!("{}engine-{e}", self.prefix)))
            .collect();
        let mut t = start;
        let mut req = 0u64;
        while next_new < sessions || !pending.is_empty() {
            // Half the time a new session starts (while any remain), else a pending one
            // continues.
            let s = if next_new < sessions && (pending.is_empty() || rng.random_bool(0.5)) {
                next_new += 1;
                next_new - 1
            } else {
                pending.swap_remove(rng.random_range(0..pending.len()))
            };
            let mut j = Job {
                id: engines[s % engines.len()],
                t,
            };
            let (blocks, turns_left) = &mut state[s];
            for h in blocks.clone() {
                let p = self.path(&format!("kv/llama3-8b/{h:016x}"), BLOCK);
                self.read(&mut j, p, 0, BLOCK, 0);
            }
            // The turn's own tokens and the reply become 1..3 more blocks of prefix.
            let mut h = blocks.last().copied().unwrap_or(0);
            for _ in 0..rng.random_range(1..=3) {
                req += 1;
                h = chain(h, req);
                blocks.push(h);
            }
            *turns_left -= 1;
            if *turns_left > 0 {
                pending.push(s);
            }
            t += gap.sample(rng) as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{blocks_of, write_csv};
    use std::collections::{HashMap, HashSet};

    fn csv(t: &Trace) -> Vec<u8> {
        let mut v = Vec::new();
        write_csv(t, &mut v).expect("write");
        v
    }

    #[test]
    fn deterministic_per_seed_and_seed_matters() {
        for w in Workload::ALL {
            let a = generate(w, 7, 0.1);
            let b = generate(w, 7, 0.1);
            assert_eq!(csv(&a), csv(&b), "{w:?} not deterministic");
            assert!(!a.records.is_empty(), "{w:?} empty");
            if w != Workload::Checkpoint {
                assert_ne!(csv(&a), csv(&generate(w, 8, 0.1)), "{w:?} ignores the seed");
            }
        }
    }

    #[test]
    fn records_are_time_ordered_and_valid() {
        for w in Workload::ALL {
            let t = generate(w, 1, 0.1);
            assert!(
                t.records.windows(2).all(|p| p[0].ts_ns <= p[1].ts_ns),
                "{w:?}"
            );
            assert!(
                t.records
                    .iter()
                    .all(|r| r.len > 0 && r.offset + r.len <= r.size),
                "{w:?}"
            );
        }
    }

    #[test]
    fn train_small_files_is_per_epoch_shuffle_of_whole_files() {
        let t = generate(Workload::TrainSmallFiles, 3, 0.1);
        let n = t.paths.len();
        assert_eq!(t.records.len(), 3 * n, "three epochs over every file");
        assert_eq!(t.jobs.len(), LOADERS);
        assert!(t
            .paths
            .iter()
            .all(|p| p.starts_with("train/n") && p.ends_with(".JPEG")));
        assert!(t.records.iter().all(|r| r.offset == 0 && r.len == r.size));
        // Each worker reads a share of every epoch: its reads split into three equal
        // epochs whose union over workers covers every file once.
        let mut epochs = vec![Vec::new(); 3];
        for j in 0..t.jobs.len() as u32 {
            let mine: Vec<u32> = t
                .records
                .iter()
                .filter(|r| r.job == j)
                .map(|r| r.path)
                .collect();
            assert_eq!(mine.len() % 3, 0);
            for (e, c) in mine.chunks(mine.len() / 3).enumerate() {
                epochs[e].extend_from_slice(c);
            }
        }
        for e in &epochs {
            assert_eq!(
                e.iter().collect::<HashSet<_>>().len(),
                n,
                "each file once per epoch"
            );
        }
        assert_ne!(epochs[0], epochs[1], "epochs are shuffled differently");
    }

    #[test]
    fn shards_are_sequential_within_a_shard() {
        let t = generate(Workload::Shards, 3, 0.25);
        let mut switches = 0;
        for j in 0..t.jobs.len() as u32 {
            let mine: Vec<_> = t.records.iter().filter(|r| r.job == j).collect();
            assert_eq!(mine[0].offset, 0);
            for w in mine.windows(2) {
                if w[1].offset != 0 {
                    assert_eq!(w[1].path, w[0].path);
                    assert_eq!(w[1].offset, w[0].offset + w[0].len, "sequential");
                } else {
                    switches += 1;
                    assert_eq!(
                        w[0].offset + w[0].len,
                        w[0].size,
                        "a shard is read to its end"
                    );
                    assert_eq!(w[1].offset, 0);
                }
            }
            switches += 1;
        }
        assert_eq!(
            switches,
            3 * t.paths.len(),
            "every shard read once per epoch"
        );
        assert!(t
            .paths
            .iter()
            .all(|p| p.starts_with("shards/train-") && p.ends_with(".tar")));
    }

    #[test]
    fn checkpoint_is_read_twice_sequentially() {
        let t = generate(Workload::Checkpoint, 0, 0.1);
        let per_job: Vec<usize> = (0..2)
            .map(|j| t.records.iter().filter(|r| r.job == j).count())
            .collect();
        assert_eq!(per_job[0], per_job[1]);
        let uniq = t.unique_bytes(MIB);
        let read: u64 = t.records.iter().map(|r| r.len).sum();
        assert_eq!(read, 2 * uniq, "everything read exactly twice");
        assert!(t.paths[0].ends_with("model-00001-of-00008.safetensors"));
    }

    #[test]
    fn preprocess_reads_footers_and_column_chunks() {
        let t = generate(Workload::Preprocess, 5, 0.25);
        assert!(t
            .paths
            .iter()
            .all(|p| p.starts_with("lake/events/date=2025-") && p.ends_with(".parquet")));
        let footers = t
            .records
            .iter()
            .filter(|r| r.offset + r.len == r.size)
            .count();
        assert_eq!(
            footers,
            4 * 2 * t.paths.len(),
            "4 jobs x 2 queries read every footer"
        );
        assert!(t
            .records
            .iter()
            .filter(|r| r.offset + r.len != r.size)
            .all(|r| r.len >= MIB / 2));
    }

    #[test]
    fn inference_skew_is_skewed() {
        let t = generate(Workload::InferenceSkew, 9, 0.5);
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for r in &t.records {
            *counts.entry(r.path).or_default() += 1;
        }
        let mut c: Vec<usize> = counts.values().copied().collect();
        c.sort_unstable_by(|a, b| b.cmp(a));
        let top1pct: usize = c.iter().take(t.paths.len() / 100).sum();
        assert!(
            top1pct * 5 > t.records.len(),
            "top 1% of objects get > 20% of reads: {top1pct}"
        );
    }

    #[test]
    fn kv_prefix_shares_prompts_and_chains() {
        let t = generate(Workload::KvPrefix, 2, 0.25);
        assert!(t
            .paths
            .iter()
            .all(|p| p.starts_with("kv/llama3-8b/") && p.len() == 13 + 16));
        let uniq_blocks: usize = t.paths.len();
        assert!(
            t.records.len() > 2 * uniq_blocks,
            "prefix reuse: {} reads of {uniq_blocks}",
            t.records.len()
        );
        assert!(t.records.iter().all(|r| blocks_of(
            &t.paths[r.path as usize],
            r.offset,
            r.len,
            r.size,
            MIB
        )
        .count()
            == 1));
    }

    #[test]
    fn mixed_has_every_component() {
        let t = generate(Workload::Mixed, 4, 0.2);
        for prefix in ["train/", "shards/", "ckpt/", "lake/", "models/", "kv/"] {
            assert!(t.paths.iter().any(|p| p.starts_with(prefix)), "{prefix}");
        }
        assert!(t.jobs.len() >= 14, "concurrent jobs: {:?}", t.jobs);
    }
}
