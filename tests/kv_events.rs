//! Routing by the backends' KV-cache events (`models[].kv_events`), on
//! vllm-sims that publish them as vLLM 0.32 does, each on a loopback
//! address of its own (the events port is the same on every backend's
//! host). The model's tokenizer is the byte-level one of `conf/byte-model`
//! (one token per byte), which is how vllm-sim's events number the bytes of
//! its prompts.

use std::net::TcpListener;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::metrics::{sample, scrape};
use crate::support::sim::Sim;
use crate::support::{client, header, Gateway};

/// The sims' block: 16 tokens of 4 bytes, 64 byte-tokens in their events.
const SIM_BLOCK: &str = "16";
const EVENT_BLOCK: u64 = 64;

/// A port free on every one of `ips`.
fn free_port(ips: &[&str]) -> u16 {
    loop {
        let port = TcpListener::bind(format!("{}:0", ips[0]))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if ips
            .iter()
            .all(|ip| TcpListener::bind(format!("{ip}:{port}")).is_ok())
        {
            return port;
        }
    }
}

struct Fleet {
    sims: Vec<Sim>,
    events: u16,
    replay: u16,
}

fn fleet(ips: &[&str], kv_tokens: &str) -> Fleet {
    let (events, replay) = (free_port(ips), free_port(ips));
    let (events_s, replay_s) = (events.to_string(), replay.to_string());
    let sims = ips
        .iter()
        .map(|ip| {
            let args = [
                "--block-size",
                SIM_BLOCK,
                "--kv-cache-tokens",
                kv_tokens,
                "--kv-events-port",
                &events_s,
                "--kv-replay-port",
                &replay_s,
            ];
            Sim::start_on(&format!("{ip}:0"), "m", "0", &args)
        })
        .collect();
    Fleet {
        sims,
        events,
        replay,
    }
}

fn config(f: &Fleet) -> String {
    let list: Vec<String> = f.sims.iter().map(|s| format!("\"{}\"", s.addr)).collect();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/byte-model");
    format!(
        "  routing: {{prefix_index: {{cache_tokens: 100000}}}}\n  models:\n    - name: m\n      addresses: [{}]\n      kv_events: {{port: {}, replay_port: {}, block_size: {EVENT_BLOCK}, tokenizer: \"{dir}\"}}\n",
        list.join(", "),
        f.events,
        f.replay,
    )
}

fn body(name: &str) -> Value {
    json!({"model": "m", "max_tokens": 4, "messages": [
        {"role": "system", "content": format!("{name} ").repeat(400)},
        {"role": "user", "content": "go on"},
    ]})
}

/// Send `name`'s conversation straight to `sim`: it caches it, and only
/// its events can tell a gateway.
async fn warm(sim: &Sim, name: &str) {
    let url = format!("http://{}/v1/chat/completions", sim.addr);
    let resp = client().post(url).json(&body(name)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

/// `name`'s conversation through `gw`: its backend, route and the tokens
/// the gateway expected cached there, and the tokens the sim reported.
async fn ask(gw: &Gateway, name: &str) -> (String, String, u64, u64) {
    let (backend, route, expected, v) = post(gw, "/v1/chat/completions", &body(name)).await;
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (backend, route, expected, cached)
}

/// `body` to `path` through `gw`: its backend, route, the tokens the
/// gateway expected cached there, and the answer.
async fn post(gw: &Gateway, path: &str, body: &Value) -> (String, String, u64, Value) {
    let resp = client().post(gw.url(path)).json(body).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{path} {body}");
    let backend = header(&resp, "x-poimen-backend");
    let route = header(&resp, "x-poimen-route");
    let expected = header(&resp, "x-poimen-expected-cached-tokens")
        .parse()
        .unwrap();
    (backend, route, expected, resp.json().await.unwrap())
}

async fn metric(gw: &Gateway, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(&scrape(gw.metrics).await, name, labels).unwrap_or(0.0)
}

/// Wait until every backend's events are subscribed to.
async fn subscribed(gw: &Gateway, sims: &[Sim]) {
    for s in sims {
        let b = s.addr.to_string();
        let labels = [("model", "m"), ("backend", &b[..])];
        let mut waited = Duration::ZERO;
        while metric(gw, "poimen_gateway_kv_events_connected", &labels).await < 1.0 {
            assert!(waited < Duration::from_secs(10), "{b} not subscribed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            waited += Duration::from_millis(50);
        }
    }
}

/// Wait until `gw` has applied `n` event messages of `sim` in all.
async fn applied(gw: &Gateway, sim: &Sim, n: f64) {
    let b = sim.addr.to_string();
    let labels = [("backend", &b[..]), ("result", "applied")];
    let mut waited = Duration::ZERO;
    while metric(gw, "poimen_gateway_kv_event_messages_total", &labels).await < n {
        assert!(
            waited < Duration::from_secs(10),
            "{b}: {n} messages not applied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn keyless_requests_go_where_the_events_say_their_prompt_is_cached() {
    let f = fleet(&["127.0.0.2", "127.0.0.3"], "65536");
    let conf = config(&f);
    // Two replicas: each subscribes to both backends.
    let (gw1, gw2) = (Gateway::start(&conf).await, Gateway::start(&conf).await);
    subscribed(&gw1, &f.sims).await;
    subscribed(&gw2, &f.sims).await;
    let names = ["alpha", "beta", "gamma", "delta"];
    for (i, name) in names.iter().enumerate() {
        let sim = &f.sims[i % 2];
        warm(sim, name).await;
        applied(&gw1, sim, (i / 2 + 1) as f64).await;
        applied(&gw2, sim, (i / 2 + 1) as f64).await;
    }
    for (i, name) in names.iter().enumerate() {
        let home = f.sims[i % 2].addr.to_string();
        let gw = [&gw1, &gw2][i % 2];
        let (backend, route, expected, cached) = ask(gw, name).await;
        // Neither gateway routed it before: only the events knew.
        assert_eq!(backend, home, "{name}");
        // Named `cache` where the home is not the round-robin turn's.
        assert!(
            ["round_robin", "cache"].contains(&&route[..]),
            "{name}: {route}"
        );
        // The template's `system\n{system}\nuser\ngo on\n`, one token a
        // byte: every whole block of it was cached, and expected so; the
        // sim counts 4 bytes a token.
        let prompt = format!("{name} ").len() * 400 + 19;
        let whole = prompt as u64 / EVENT_BLOCK * EVENT_BLOCK;
        assert_eq!((expected, cached * 4), (whole, whole), "{name}");
    }
    // Round-robin alone would have sent some elsewhere.
    let cache_routed = metric(&gw1, "poimen_gateway_requests_total", &[("route", "cache")]).await
        + metric(&gw2, "poimen_gateway_requests_total", &[("route", "cache")]).await;
    assert!(cache_routed >= 1.0, "{cache_routed}");
    let rendered = [("model", "m"), ("result", "rendered")];
    assert_eq!(
        metric(&gw1, "poimen_gateway_prompts_rendered_total", &rendered).await,
        2.0
    );
}

async fn index_tokens(gw: &Gateway, sim: &Sim) -> Option<f64> {
    let b = sim.addr.to_string();
    let labels = [("model", "m"), ("backend", &b[..])];
    sample(
        &scrape(gw.metrics).await,
        "poimen_gateway_prefix_index_tokens",
        &labels,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cleared_or_stopped_backend_is_forgotten() {
    let mut f = fleet(&["127.0.0.4", "127.0.0.5"], "65536");
    let gw = Gateway::start(&config(&f)).await;
    subscribed(&gw, &f.sims).await;
    warm(&f.sims[0], "alpha").await;
    warm(&f.sims[1], "beta").await;
    applied(&gw, &f.sims[0], 1.0).await;
    applied(&gw, &f.sims[1], 1.0).await;
    assert!(index_tokens(&gw, &f.sims[0]).await > Some(0.0));
    // A reset is published with the sim's next step, as vLLM does.
    let reset = format!("http://{}/reset_prefix_cache", f.sims[0].addr);
    assert!(client()
        .post(reset)
        .send()
        .await
        .unwrap()
        .status()
        .is_success());
    warm(&f.sims[0], "gamma").await;
    applied(&gw, &f.sims[0], 2.0).await;
    let (_, _, expected, _) = ask(&gw, "alpha").await;
    assert_eq!(expected, 0, "alpha was cleared");
    // A backend that stops: what its events said is forgotten at once.
    let stopped = f.sims.remove(1);
    let b = stopped.addr.to_string();
    drop(stopped);
    let labels = [("model", "m"), ("backend", &b[..])];
    let mut waited = Duration::ZERO;
    while metric(&gw, "poimen_gateway_kv_events_connected", &labels).await > 0.0 {
        assert!(waited < Duration::from_secs(10), "{b} still subscribed");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    let text = scrape(gw.metrics).await;
    let held = sample(&text, "poimen_gateway_prefix_index_tokens", &labels);
    assert!(held.is_none_or(|t| t == 0.0), "{b} still holds {held:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn backends_on_one_host_publish_on_ports_of_their_own_and_a_later_gateway_learns_them() {
    // Two sims on 127.0.0.1, as two vLLM servers on one host.
    let ports: Vec<(u16, u16)> = (0..2)
        .map(|_| (free_port(&["127.0.0.1"]), free_port(&["127.0.0.1"])))
        .collect();
    let sims: Vec<Sim> = ports
        .iter()
        .map(|(p, r)| {
            let (p, r) = (p.to_string(), r.to_string());
            let args = [
                "--block-size",
                SIM_BLOCK,
                "--kv-events-port",
                &p,
                "--kv-replay-port",
                &r,
            ];
            Sim::start("m", &args)
        })
        .collect();
    warm(&sims[1], "alpha").await;
    let entries: Vec<String> = sims
        .iter()
        .zip(&ports)
        .map(|(s, (p, r))| {
            format!(
                "{{address: \"{}\", kv_events: {{port: {p}, replay_port: {r}}}}}",
                s.addr
            )
        })
        .collect();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/byte-model");
    let conf = format!(
        "  routing: {{prefix_index: {{cache_tokens: 100000}}}}\n  models:\n    - name: m\n      addresses: [{}]\n      kv_events: {{port: 1, block_size: {EVENT_BLOCK}, tokenizer: \"{dir}\"}}\n",
        entries.join(", ")
    );
    // Started after the sim published: only the replay socket can tell.
    let gw = Gateway::start(&conf).await;
    subscribed(&gw, &sims).await;
    applied(&gw, &sims[1], 1.0).await;
    let (backend, _, expected, cached) = ask(&gw, "alpha").await;
    assert_eq!(backend, sims[1].addr.to_string());
    assert!(
        expected > 0 && expected == cached * 4,
        "{expected} {cached}"
    );
}

/// A conversation cached from a chat request is found again when the same
/// prompt comes as Anthropic Messages or as Responses: the gateway renders
/// each to the chat vLLM converts it to, so to the same tokens.
#[tokio::test(flavor = "multi_thread")]
async fn messages_and_responses_requests_match_the_blocks_their_chat_cached() {
    let f = fleet(&["127.0.0.8", "127.0.0.9"], "65536");
    let gw = Gateway::start(&config(&f)).await;
    subscribed(&gw, &f.sims).await;
    let names = ["epsilon", "zeta"];
    for (sim, name) in f.sims.iter().zip(names) {
        warm(sim, name).await;
        applied(&gw, sim, 1.0).await;
    }
    for (sim, name) in f.sims.iter().zip(names) {
        let system = format!("{name} ").repeat(400);
        let whole = (system.len() as u64 + 19) / EVENT_BLOCK * EVENT_BLOCK;
        let messages = json!({"model": "m", "max_tokens": 4, "system": system,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "go on"}]}]});
        let responses = json!({"model": "m", "max_output_tokens": 4, "instructions": system,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]}]});
        for (path, body) in [("/v1/messages", messages), ("/v1/responses", responses)] {
            let (backend, _, expected, _) = post(&gw, path, &body).await;
            assert_eq!(backend, sim.addr.to_string(), "{name} {path}");
            assert_eq!(expected, whole, "{name} {path}");
        }
    }
    let rendered = [("model", "m"), ("result", "rendered")];
    assert_eq!(
        metric(&gw, "poimen_gateway_prompts_rendered_total", &rendered).await,
        4.0
    );
}

/// `name`'s agent conversation in each API's form: its tools (long
/// descriptions, as agents' are), a call of one and its result, and the
/// next question.
fn agent(name: &str) -> [(&'static str, Value); 3] {
    let description = format!("{name} tool: ").repeat(150);
    let arguments = json!({"path": format!("{name}.rs"), "limit": 40});
    let chat = json!({"model": "m", "max_tokens": 4,
        "tools": [{"type": "function", "function": {"name": "read", "description": description, "parameters": {"type": "object"}}}],
        "messages": [
            {"role": "system", "content": "you code"},
            {"role": "user", "content": "look"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "read", "arguments": arguments.to_string()}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "fn main() {}"},
            {"role": "user", "content": "and now?"}]});
    let messages = json!({"model": "m", "max_tokens": 4, "system": "you code",
        "tools": [{"name": "read", "description": description, "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "look"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "read", "input": arguments}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "fn main() {}"},
                {"type": "text", "text": "and now?"}]}]});
    let responses = json!({"model": "m", "max_output_tokens": 4, "instructions": "you code",
        "tools": [{"type": "function", "name": "read", "description": description, "parameters": {"type": "object"}}],
        "input": [
            {"role": "user", "content": "look"},
            {"type": "function_call", "call_id": "c1", "name": "read", "arguments": arguments.to_string()},
            {"type": "function_call_output", "call_id": "c1", "output": "fn main() {}"},
            {"role": "user", "content": "and now?"}]});
    [
        ("/v1/chat/completions", chat),
        ("/v1/messages", messages),
        ("/v1/responses", responses),
    ]
}

/// The cached tokens a sim reported in an answer of any API.
fn cached(answer: &Value) -> u64 {
    let usage = &answer["usage"];
    [
        &usage["prompt_tokens_details"]["cached_tokens"],
        &usage["cache_read_input_tokens"],
        &usage["input_tokens_details"]["cached_tokens"],
    ]
    .iter()
    .find_map(|v| v.as_u64())
    .unwrap_or(0)
}

/// An agent's requests (tools, tool calls, tool results) are rendered as
/// vLLM renders them, so routed by the events exactly, in every API's
/// form: each goes to the backend that cached its conversation, expecting
/// what the backend then reports.
#[tokio::test(flavor = "multi_thread")]
async fn an_agents_requests_with_tools_are_routed_by_the_events() {
    let f = fleet(&["127.0.0.10", "127.0.0.11"], "65536");
    let gw = Gateway::start(&config(&f)).await;
    subscribed(&gw, &f.sims).await;
    let names = ["eta", "theta"];
    for (sim, name) in f.sims.iter().zip(names) {
        let [(path, chat), _, _] = agent(name);
        let url = format!("http://{}{path}", sim.addr);
        let resp = client().post(url).json(&chat).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        applied(&gw, sim, 1.0).await;
    }
    for (sim, name) in f.sims.iter().zip(names) {
        for (path, body) in agent(name) {
            let (backend, _, expected, answer) = post(&gw, path, &body).await;
            assert_eq!(backend, sim.addr.to_string(), "{name} {path}");
            assert!(expected > 1000, "{name} {path}: expected {expected}");
            assert_eq!(expected, cached(&answer) * 4, "{name} {path}: {answer}");
        }
    }
    let rendered = [("model", "m"), ("result", "rendered")];
    assert_eq!(
        metric(&gw, "poimen_gateway_prompts_rendered_total", &rendered).await,
        6.0
    );
}

/// A body over `render.max_prompt_bytes` is routed by the estimate of its
/// text at once, and answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_over_the_render_limit_is_estimated_and_served() {
    let f = fleet(&["127.0.0.12"], "65536");
    let config = format!("  render: {{max_prompt_bytes: 2048}}\n{}", config(&f));
    let gw = Gateway::start(&config).await;
    subscribed(&gw, &f.sims).await;
    for name in ["short", "long"] {
        let mut body = body(name);
        if name == "short" {
            body["messages"][0]["content"] = json!("be brief");
        }
        let (backend, _, _, answer) = post(&gw, "/v1/chat/completions", &body).await;
        assert_eq!(backend, f.sims[0].addr.to_string(), "{answer}");
    }
    for (result, n) in [("rendered", 1.0), ("too_long", 1.0)] {
        let labels = [("model", "m"), ("result", result)];
        let counted = metric(&gw, "poimen_gateway_prompts_rendered_total", &labels).await;
        assert_eq!(counted, n, "{result}");
    }
}

/// `name`'s conversation with an image: not rendered (not text), so
/// routed by the estimate of its text.
fn with_image(name: &str) -> Value {
    let mut body = body(name);
    let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}});
    body["messages"][1]["content"] = json!([{"type": "text", "text": "go on"}, image]);
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_not_rendered_keeps_its_estimate_through_a_reset_published_after_it() {
    let f = fleet(&["127.0.0.6", "127.0.0.7"], "65536");
    let gw = Gateway::start(&config(&f)).await;
    subscribed(&gw, &f.sims).await;
    // Both caches reset: vLLM publishes that with its next step, in the
    // message of the request that runs next, after the gateway routed it.
    for sim in &f.sims {
        let reset = format!("http://{}/reset_prefix_cache", sim.addr);
        let resp = client().post(reset).send().await.unwrap();
        assert!(resp.status().is_success());
    }
    let (first, _, _, _) = post(&gw, "/v1/chat/completions", &with_image("delta")).await;
    let sim = f.sims.iter().find(|s| s.addr.to_string() == first).unwrap();
    applied(&gw, sim, 1.0).await;
    let (again, _, expected, answer) =
        post(&gw, "/v1/chat/completions", &with_image("delta")).await;
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert_eq!(
        again, first,
        "the second went elsewhere (expected {expected})"
    );
    assert!(expected > 500, "expected {expected}, cached {cached:?}");
    assert!(cached > Some(500), "{answer}");
    let not_text = [("model", "m"), ("result", "not_text")];
    assert_eq!(
        metric(&gw, "poimen_gateway_prompts_rendered_total", &not_text).await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_estimate_of_prompts_not_rendered_is_bounded_by_cache_tokens() {
    let f = fleet(&["127.0.0.8"], "65536");
    // Room for about two of these conversations in the estimate.
    let config = config(&f).replace("cache_tokens: 100000", "cache_tokens: 2048");
    let gw = Gateway::start(&config).await;
    subscribed(&gw, &f.sims).await;
    // System prompts that begin as alpha's and go on otherwise: each shares
    // alpha's head (its first 7 blocks of 256 bytes), and is no later turn
    // of a prompt routed before.
    let other = |then: &str| {
        let mut body = with_image("alpha");
        let system = format!("{}{}", "alpha ".repeat(300), then.repeat(100));
        body["messages"][0]["content"] = json!(system);
        body
    };
    post(&gw, "/v1/chat/completions", &with_image("alpha")).await;
    let (_, _, expected, _) = post(&gw, "/v1/chat/completions", &other("why ")).await;
    assert!(expected > 400, "alpha's head expected {expected}");
    for name in ["beta", "gamma", "epsilon", "zeta"] {
        post(&gw, "/v1/chat/completions", &with_image(name)).await;
    }
    let (_, _, expected, _) = post(&gw, "/v1/chat/completions", &other("how ")).await;
    assert_eq!(expected, 0, "alpha's estimate outlived cache_tokens");
}
