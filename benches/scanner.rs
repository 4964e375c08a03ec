//! Cost of the usage scanners per KB of response, against a plain copy of
//! the same bytes (what any proxy does with a chunk anyway).
//!
//! `cargo bench --bench scanner`

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use poimen_gateway::accounting::scanner::{JsonScanner, SseScanner};
use poimen_gateway::accounting::Dialect;

/// A vLLM-like stream: `n` token chunks, the usage chunk, [DONE]; as the
/// chunks a backend would send (one event each).
fn sse_chunks(n: usize) -> Vec<Bytes> {
    let mut chunks: Vec<Bytes> = (0..n)
        .map(|i| {
            Bytes::from(format!(
                "data: {{\"id\":\"chatcmpl-b8f1\",\"object\":\"chat.completion.chunk\",\"created\":1764512345,\"model\":\"qwen2.5-7b-instruct\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" token{i}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
            ))
        })
        .collect();
    chunks.push(Bytes::from_static(b"data: {\"id\":\"chatcmpl-b8f1\",\"object\":\"chat.completion.chunk\",\"created\":1764512345,\"model\":\"qwen2.5-7b-instruct\",\"choices\":[],\"usage\":{\"prompt_tokens\":650,\"total_tokens\":666,\"completion_tokens\":16,\"prompt_tokens_details\":{\"cached_tokens\":512}}}\n\n"));
    chunks.push(Bytes::from_static(b"data: [DONE]\n\n"));
    chunks
}

fn json_chunks(size: usize, chunk: usize) -> Vec<Bytes> {
    let content = "x".repeat(size);
    let body = format!("{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{content}\"}}}}],\"usage\":{{\"prompt_tokens\":651,\"total_tokens\":667,\"completion_tokens\":16,\"prompt_tokens_details\":{{\"cached_tokens\":512}}}}}}");
    body.as_bytes()
        .chunks(chunk)
        .map(Bytes::copy_from_slice)
        .collect()
}

fn bench(c: &mut Criterion) {
    let sse = sse_chunks(500);
    let json = json_chunks(256 * 1024, 16 * 1024);
    let bytes = |chunks: &[Bytes]| chunks.iter().map(|c| c.len() as u64).sum::<u64>();
    let mut g = c.benchmark_group("scanner");
    for (name, chunks) in [("sse", &sse), ("json", &json)] {
        g.throughput(Throughput::Bytes(bytes(chunks)));
        g.bench_with_input(
            BenchmarkId::new("copy-baseline", name),
            chunks,
            |b, chunks| {
                b.iter(|| {
                    let mut out = Vec::with_capacity(bytes(chunks) as usize);
                    for c in chunks {
                        out.extend_from_slice(c);
                    }
                    out
                })
            },
        );
    }
    g.throughput(Throughput::Bytes(bytes(&sse)));
    for (name, strip) in [("sse-scan", false), ("sse-strip", true)] {
        g.bench_with_input(BenchmarkId::new(name, "sse"), &sse, |b, chunks| {
            b.iter(|| {
                let mut s = SseScanner::new(Dialect::Completions, strip);
                for c in chunks {
                    criterion::black_box(s.feed(c.clone()));
                }
                s.usage()
            })
        });
    }
    g.throughput(Throughput::Bytes(bytes(&json)));
    g.bench_with_input(BenchmarkId::new("json-tail", "json"), &json, |b, chunks| {
        b.iter(|| {
            let mut s = JsonScanner::new(Dialect::Completions);
            for c in chunks {
                s.feed(c);
            }
            s.finish()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
