//! Cost of one `SemanticPredictor::on_access` (it runs on the read path of every file
//! open): a confirmed stride stream, a listed name-ordered stream, four interleaved
//! tenants, and random hashed names (nothing predicted: the floor is tokenizing).
//!
//! `cargo bench -p strata-prefetch --bench semantic`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use strata_prefetch::semantic::workloads as w;
use strata_prefetch::semantic::SemanticPredictor;
use strata_prefetch::Predictor;

fn bench(c: &mut Criterion) {
    let workloads = [
        ("stride (shards)", w::shards(2_000)),
        (
            "lexical (listed ImageNet-style)",
            w::name_ordered(1, 20, 200),
        ),
        ("four tenants interleaved", w::four_tenants(1, false)),
        ("random hashed names", w::random_hashes(1, 4_000)),
    ];
    let mut g = c.benchmark_group("semantic_on_access");
    for (name, wl) in &workloads {
        g.throughput(Throughput::Elements(wl.events.len() as u64));
        g.bench_function(*name, |b| {
            b.iter_batched(
                || {
                    let mut p = SemanticPredictor::default();
                    for (dir, entries) in &wl.listings {
                        p.observe_listing_sized(dir, entries);
                    }
                    p
                },
                |mut p| {
                    let mut out = Vec::new();
                    for e in &wl.events {
                        out.clear();
                        p.on_access(e, &mut out);
                    }
                    out.len()
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
