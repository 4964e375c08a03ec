//! What routing costs a request, by the number of backends: the ranking
//! (rendezvous order, then the choice among the usable members: the first,
//! or the cost rule), the prefix index's lookup and insert, and what
//! forgetting a backend of a million blocks holds the index's lock for.
//!
//! `cargo bench --bench routing`

use std::net::SocketAddr;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use poimen_gateway::routing::index::PrefixIndex;
use poimen_gateway::routing::{Affinity, Facts, IndexSize, Policy, Request, RoutingTable};
use xxhash_rust::xxh3::xxh3_64;

fn members(n: usize) -> Vec<(SocketAddr, u32)> {
    (0..n)
        .map(|i| {
            (
                SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 8000)),
                1,
            )
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let cost = Policy {
        prefix_index: Some(IndexSize {
            backend_blocks: 1 << 16,
            max_blocks: 1 << 20,
        }),
        ..Policy::default()
    };
    let mut g = c.benchmark_group("rank");
    for n in [4, 64, 256] {
        for (name, policy) in [("first", Policy::default()), ("cost", cost.clone())] {
            let router = RoutingTable::new(&policy, members(n));
            let facts = |i: usize| Facts {
                load: i % 3,
                slots: 4,
                cached_tokens: if i == 1 { 1024 } else { 0 },
                ..Facts::default()
            };
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    let mut req = Request::new(Affinity::Key(b"session-0042"), &[]);
                    req.prompt_tokens = 2048;
                    req.holders = &[1];
                    router.rank_at(req, facts)
                })
            });
        }
    }
    g.finish();

    // A 2 KB prompt (8 blocks) and a 64 KB one, looked up and recorded as
    // every admitted request is, among 4 backends that hold 64 others.
    let mut g = c.benchmark_group("index");
    for blocks in [8u64, 256] {
        let index = PrefixIndex::new(1 << 16, 1 << 20);
        let addrs: Vec<SocketAddr> = members(4).into_iter().map(|(a, _)| a).collect();
        // Block hashes are xxh3 outputs (`chain.rs`): spread over all bits.
        let chain = |c: u64| -> Vec<u64> {
            (0..blocks)
                .map(|b| xxh3_64(&(c << 32 | b).to_le_bytes()))
                .collect()
        };
        for conversation in 0..64u64 {
            index.insert(addrs[conversation as usize % 4], &chain(conversation));
        }
        let chain = chain(7);
        g.bench_with_input(
            BenchmarkId::new("lookup+insert", blocks),
            &blocks,
            |b, _| {
                b.iter(|| {
                    let held = index.lookup(&chain);
                    index.insert(addrs[3], &chain);
                    held
                })
            },
        );
    }
    g.finish();

    // A backend failed (or its cache was reset) while holding a million
    // blocks: every request of the model waits for the lock meanwhile.
    let mut g = c.benchmark_group("forget");
    g.sample_size(10);
    let blocks: Vec<u64> = (0..1u64 << 20).map(|b| xxh3_64(&b.to_le_bytes())).collect();
    let addrs: Vec<SocketAddr> = members(2).into_iter().map(|(a, _)| a).collect();
    g.bench_function("1M blocks", |b| {
        b.iter_batched(
            || {
                let index = PrefixIndex::new(1 << 20, 1 << 22);
                for chain in blocks.chunks(256) {
                    index.insert(addrs[0], chain);
                }
                index.insert(addrs[1], &blocks[..256]);
                index
            },
            |index| {
                index.forget(&addrs[0]);
                index
            },
            criterion::BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
