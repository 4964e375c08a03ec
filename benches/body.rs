//! Cost of cutting a request's prompt into the prefix index's chain of
//! blocks (`routing::chain`, with `routing.prefix_index`), against what
//! every request already pays: `body::inspect` (finding `model`) and a
//! plain copy of the body.
//!
//! `cargo bench --bench body`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use poimen_gateway::api::Api;
use poimen_gateway::body;
use poimen_gateway::routing::chain;
use serde_json::json;

const CHAT: Api = Api::ChatCompletions;

/// An agent's turn: a system message of `system` bytes, then `turns`
/// question/answer pairs of about 600 bytes, `model` last (as the SDKs
/// write it).
fn agent_turn(system: usize, turns: usize) -> Vec<u8> {
    let mut messages = vec![json!({"role": "system", "content": "s".repeat(system)})];
    for i in 0..turns {
        messages
            .push(json!({"role": "user", "content": format!("question {i} {}", "q".repeat(300))}));
        messages.push(
            json!({"role": "assistant", "content": format!("answer {i} {}", "a".repeat(300))}),
        );
    }
    json!({"messages": messages, "max_tokens": 256, "stream": true, "model": "m"})
        .to_string()
        .into_bytes()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("body");
    for (name, body) in [
        ("1k", agent_turn(200, 1)),
        ("26k", agent_turn(20_000, 10)),
        ("200k", agent_turn(20_000, 150)),
    ] {
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(BenchmarkId::new("copy-baseline", name), &body, |b, body| {
            b.iter(|| body.clone())
        });
        g.bench_with_input(BenchmarkId::new("inspect", name), &body, |b, body| {
            b.iter(|| body::inspect(body).map(|i| i.stream).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("chain", name), &body, |b, body| {
            b.iter(|| chain::of(CHAT, body))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
