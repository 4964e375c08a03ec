//! Every agent API as well as Chat Completions: Anthropic Messages and the
//! Responses API, streamed and not, are counted exactly as the backends
//! count them (vllm-sim's `vllm:prompt_tokens_total` and
//! `vllm:prefix_cache_hits_total`, as vLLM's), and a keyless conversation
//! stays on one backend whichever API it speaks.

use serde_json::{json, Value};

use crate::support::metrics::sample;
use crate::support::sim::Sim;
use crate::support::{client, header, Gateway};

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
