//! Every agent API as well as Chat Completions: Anthropic Messages and the
//! Responses API, streamed and not, are counted exactly as the backends
//! count them (vllm-sim's `vllm:prompt_tokens_total` and
//! `vllm:prefix_cache_hits_total`, as vLLM's), and a keyless conversation
//! stays on one backend whichever API it speaks.

use serde_json::{json, Value};

use crate::support::metrics::sample;
use crate::support::sim::Sim;
use crate::support::{client, header, FakeBackend, Gateway};

/// Two sims behind a gateway deriving keys from the system messages.
async fn setup() -> (Vec<Sim>, Gateway) {
    let sims = Sim::start_n(2, "m");
    let addrs: Vec<String> = sims.iter().map(|s| format!("\"{}\"", s.addr)).collect();
    let config = format!(
        "  routing: {{keyless: system}}\n  models:\n    - name: m\n      addresses: [{}]\n",
        addrs.join(", ")
    );
    (sims, Gateway::start(&config).await)
}

/// The memory of session `s`: long enough to fill several KV blocks.
fn memory(s: usize) -> String {
    format!("session {s} memory: ") + &"the agent remembers this. ".repeat(40)
}

/// Turn `t` of session `s` in `api`'s body shape.
fn body(api: &str, s: usize, t: usize, stream: bool) -> Value {
    let mut turns = Vec::new();
    for i in 0..=t {
        turns.push(json!({"role": "user", "content": format!("question {i}")}));
        if i < t {
            turns.push(json!({"role": "assistant", "content": format!("answer {i}")}));
        }
    }
    match api {
        "chat" => {
            let mut messages = vec![json!({"role": "system", "content": memory(s)})];
            messages.extend(turns);
            json!({"model": "m", "messages": messages, "max_tokens": 4, "stream": stream})
        }
        "messages" => json!({"model": "m", "system": memory(s), "messages": turns,
            "max_tokens": 4, "stream": stream}),
        _ => json!({"model": "m", "instructions": memory(s), "input": turns,
            "max_output_tokens": 4, "stream": stream}),
    }
}

fn path(api: &str) -> &'static str {
    match api {
        "chat" => "/v1/chat/completions",
        "messages" => "/v1/messages",
        _ => "/v1/responses",
    }
}

/// Sum of a gateway series over every backend.
fn total(text: &str, name: &str, backends: &[String]) -> f64 {
    backends
        .iter()
        .filter_map(|b| sample(text, name, &[("backend", b.as_str())]))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_api_is_counted_as_the_backends_count_it_and_keeps_its_backend() {
    for api in ["chat", "messages", "responses"] {
        let (sims, gw) = setup().await;
        for stream in [false, true] {
            for s in 0..3 {
                let mut backends = Vec::new();
                for t in 0..3 {
                    let resp = client()
                        .post(gw.url(path(api)))
                        .header("x-api-key", "unused")
                        .json(&body(api, s, t, stream))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(resp.status(), 200, "{api} {s} {t}");
                    assert_eq!(header(&resp, "x-poimen-route"), "prefix");
                    backends.push(header(&resp, "x-poimen-backend"));
                    let text = resp.text().await.unwrap();
                    assert!(!text.is_empty());
                }
                let stays = backends.iter().all(|b| *b == backends[0]);
                assert!(stays, "{api} session {s}: {backends:?}");
            }
        }
        let text = gw.metrics_text().await;
        let addrs: Vec<String> = sims.iter().map(|s| s.addr.to_string()).collect();
        let (mut prompt, mut hits) = (0.0, 0.0);
        for sim in &sims {
            prompt += sim.metric("vllm:prompt_tokens_total").await;
            hits += sim.metric("vllm:prefix_cache_hits_total").await;
        }
        assert!(prompt > 0.0 && hits > 0.0, "{api}: the sims served");
        let counted = total(&text, "poimen_gateway_prompt_tokens_total", &addrs);
        assert_eq!(counted, prompt, "{api}: prompt tokens");
        let counted_hits = total(&text, "vllm_prefix_cache_hit_tokens_total", &addrs);
        assert_eq!(counted_hits, hits, "{api}: cached tokens");
        let missing = total(&text, "poimen_gateway_usage_missing_total", &addrs);
        assert_eq!(missing, 0.0, "{api}: every response's usage was read");
    }
}

/// A multipart form as an OpenAI SDK sends a transcription: the file first.
fn transcription_form(model: &str) -> Vec<u8> {
    let mut form = b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\x00\x01\xff".to_vec();
    form.extend_from_slice(
        b"\r\n--b0undary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n",
    );
    form.extend_from_slice(model.as_bytes());
    form.extend_from_slice(b"\r\n--b0undary--\r\n");
    form
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rest_of_vllms_surface_is_routed_by_model() {
    let (a, b) = (FakeBackend::start().await, FakeBackend::start().await);
    let config = format!(
        "  scheduler: {{max_num_seqs: 1, max_queue_depth: 0}}\n  models:\n    - {{name: a, address: \"{}\"}}\n    - {{name: b, address: \"{}\"}}\n",
        a.addr, b.addr
    );
    let gw = Gateway::start(&config).await;
    let post = |path: &str, content_type: &str, body: Vec<u8>| {
        client()
            .post(gw.url(path))
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let form = transcription_form("b");
    let resp = post(
        "/v1/audio/transcriptions",
        "multipart/form-data; boundary=b0undary",
        form.clone(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-poimen-backend"), b.addr.to_string());
    let seen = b.seen().pop().unwrap();
    assert_eq!(
        (seen.path.as_str(), &seen.body[..]),
        ("/v1/audio/transcriptions", &form[..])
    );
    let resp = post(
        "/v1/audio/translations",
        "multipart/form-data; boundary=other",
        form,
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 400, "the boundary is not the body's");
    for path in [
        "/tokenize",
        "/v1/messages/count_tokens",
        "/v1/embeddings",
        "/rerank",
    ] {
        let resp = post(
            path,
            "application/json",
            br#"{"model":"a","prompt":"x"}"#.to_vec(),
        )
        .await
        .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(a.seen().last().unwrap().path, path);
    }
    // Not vLLM's, or not a POST: the gateway's 404.
    for path in ["/v1/unknown", "/invocations", "/v1/load_lora_adapter"] {
        let resp = post(path, "application/json", br#"{"model":"a"}"#.to_vec())
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "{path}");
    }
    // The tokenizer routes take no slot: with a's one slot held, a
    // tokenize still passes while a completion is refused.
    a.set_delay(std::time::Duration::from_millis(800));
    let held = tokio::spawn(post(
        "/v1/completions",
        "application/json",
        br#"{"model":"a","prompt":"x"}"#.to_vec(),
    ));
    crate::support::eventually("a's slot is taken", || async { a.inflight() == 1 }).await;
    let full = post(
        "/v1/completions",
        "application/json",
        br#"{"model":"a","prompt":"y"}"#.to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(full.status(), 503);
    let tokenize = post(
        "/tokenize",
        "application/json",
        br#"{"model":"a","prompt":"z"}"#.to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(tokenize.status(), 200);
    assert_eq!(held.await.unwrap().unwrap().status(), 200);
}
