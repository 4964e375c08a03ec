//! Keyless prefix affinity (`gateway.routing.keyless`).

use std::net::SocketAddr;
use std::time::Duration;

use poimen_gateway::api::Api;
use poimen_gateway::routing::prefix::{self, Head};
use poimen_gateway::routing::rendezvous::rank;
use serde_json::json;

use crate::support::{chat, client, eventually, header, FakeBackend, Gateway};

async fn backends(n: usize, delay: Duration) -> Vec<FakeBackend> {
    let mut v = Vec::new();
    for _ in 0..n {
        let b = FakeBackend::start().await;
        b.set_delay(delay);
        v.push(b);
    }
    v
}

fn config(routing: &str, backends: &[FakeBackend]) -> String {
    config_with_slots(routing, 8, backends)
}

fn config_with_slots(routing: &str, slots: usize, backends: &[FakeBackend]) -> String {
    let list: Vec<String> = backends.iter().map(|b| format!("\"{}\"", b.addr)).collect();
    format!(
        "  routing: {routing}\n  scheduler: {{max_num_seqs: {slots}}}\n  models:\n    - name: m\n      addresses: [{}]\n",
        list.join(", ")
    )
}

/// The documented rendezvous order of `key` over `backends`.
fn ranking(key: &str, backends: &[FakeBackend]) -> Vec<String> {
    let mut sorted: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    sorted.sort();
    let members: Vec<(String, u32)> = sorted.iter().map(|a| (a.to_string(), 1)).collect();
    rank(key.as_bytes(), &members)
        .into_iter()
        .map(|i| members[i].0.clone())
        .collect()
}

/// `resp` answered 200 from `backend`, under `route`.
fn served(resp: &reqwest::Response, route: &str, backend: &str, what: &str) {
    assert_eq!(resp.status(), 200, "{what}");
    assert_eq!(header(resp, "x-poimen-route"), route, "{what}");
    assert_eq!(header(resp, "x-poimen-backend"), backend, "{what}");
}

/// Turn `n` of conversation `c`: a shared system prompt, the conversation's
/// first question, then `n` answers and follow-ups.
fn turn(c: usize, n: usize) -> serde_json::Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent. Tools: read, write."}),
        json!({"role": "user", "content": format!("conversation {c}: fix the build")}),
    ];
    for i in 0..n {
        messages.push(json!({"role": "assistant", "content": format!("step {i} done")}));
        messages.push(json!({"role": "user", "content": format!("next {i}")}));
    }
    json!({"messages": messages, "max_tokens": 4, "model": "m"})
}

#[tokio::test(flavor = "multi_thread")]
async fn keyless_turns_of_a_conversation_stay_on_one_backend() {
    let bs = backends(3, Duration::ZERO).await;
    let gw = Gateway::start(&config("{keyless: prefix}", &bs)).await;
    let mut used = std::collections::BTreeSet::new();
    for c in 0..10 {
        let body = turn(c, 0).to_string();
        let derived =
            prefix::of_body(Api::ChatCompletions, body.as_bytes(), Head::FirstUser, 2048).unwrap();
        let want = ranking(derived.as_str(), &bs)[0].clone();
        for n in 0..4 {
            let resp = client()
                .post(gw.url("/v1/chat/completions"))
                .body(turn(c, n).to_string())
                .send()
                .await
                .unwrap();
            let what = format!("conversation {c} turn {n}");
            served(&resp, "prefix", &want, &what);
        }
        used.insert(want);
    }
    assert!(used.len() >= 2, "10 conversations on one backend: {used:?}");
    // The derived key is the gateway's own: never sent upstream.
    for b in &bs {
        assert!(b
            .seen()
            .iter()
            .all(|s| s.headers.get("x-poimen-cache-key").is_none()));
    }
    let labels = [("model", "m"), ("route", "prefix"), ("code", "200")];
    let mut total = 0.0;
    for b in &bs {
        let backend = b.addr.to_string();
        let mut l = labels.to_vec();
        l.push(("backend", &backend));
        total += gw.metric("poimen_gateway_requests_total", &l).await;
    }
    assert_eq!(total, 40.0);
    eventually("40 lines", || async { gw.cache_lines().len() == 40 }).await;
    let lines = gw.cache_lines();
    let first = prefix::of_body(
        Api::ChatCompletions,
        turn(0, 0).to_string().as_bytes(),
        Head::FirstUser,
        2048,
    )
    .unwrap();
    assert!(lines
        .iter()
        .all(|l| l["cache_key"].is_null() && l["route"] == "prefix"));
    assert_eq!(lines[0]["derived_key"], first.as_str());
    // A keyed request still routes by its key, and logs no derived key.
    let resp = chat(&gw, "m", Some("session-1")).await;
    assert_eq!(header(&resp, "x-poimen-route"), "hash");
    eventually("the keyed line", || async { gw.cache_lines().len() == 41 }).await;
    let last = gw.cache_lines().pop().unwrap();
    assert!(last["derived_key"].is_null());
    assert_eq!(last["cache_key"], "session-1");
}

#[tokio::test(flavor = "multi_thread")]
async fn keyless_system_keeps_a_sessions_warmup_and_sub_agents_together() {
    let bs = backends(4, Duration::ZERO).await;
    let gw = Gateway::start(&config("{keyless: system}", &bs)).await;
    let post = |body: serde_json::Value, warmup: bool| {
        let mut req = client().post(gw.url("/v1/chat/completions"));
        if warmup {
            req = req.header("X-Poimen-Warmup", "true");
        }
        req.body(body.to_string()).send()
    };
    let mut used = std::collections::BTreeSet::new();
    for s in 0..12 {
        let system = json!({"role": "system", "content": format!("agent memory of session {s}")});
        let derived = prefix::of_body(
            Api::ChatCompletions,
            json!({"messages": [system.clone()], "model": "m"})
                .to_string()
                .as_bytes(),
            Head::System,
            2048,
        )
        .unwrap();
        let want = ranking(derived.as_str(), &bs)[0].clone();
        let warmup = post(
            json!({"messages": [system.clone()], "max_tokens": 1, "model": "m"}),
            true,
        )
        .await
        .unwrap();
        assert_eq!(
            header(&warmup, "x-poimen-backend"),
            want,
            "session {s} warmup"
        );
        for agent in 0..3 {
            let user = json!({"role": "user", "content": format!("sub-agent {agent} task")});
            let resp = post(
                json!({"messages": [system.clone(), user], "model": "m"}),
                false,
            )
            .await
            .unwrap();
            let what = format!("session {s} agent {agent}");
            served(&resp, "prefix", &want, &what);
        }
        used.insert(want);
    }
    assert!(used.len() >= 2, "12 sessions on one backend: {used:?}");
}
