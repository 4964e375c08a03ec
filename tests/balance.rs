//! Bounded-load rendezvous and keyless prefix affinity (`gateway.routing`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use poimen_gateway::api::Api;
use poimen_gateway::routing::prefix::{self, Head};
use poimen_gateway::routing::rendezvous::rank;
use serde_json::json;

use crate::support::metrics::sample;
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

fn inflight(backends: &[FakeBackend]) -> usize {
    backends.iter().map(|b| b.inflight()).sum()
}

/// Requests waiting for a slot at the gateway, over all `backends`.
async fn queued(gw: &Gateway, backends: &[FakeBackend]) -> usize {
    let mut n = 0.0;
    for b in backends {
        let addr = b.addr.to_string();
        let labels = [("model", "m"), ("backend", addr.as_str())];
        n += gw.metric("poimen_gateway_queue_depth", &labels).await;
    }
    n as usize
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hot_keys_excess_goes_to_its_runner_up_while_other_keys_stay_put() {
    let bs = Arc::new(backends(3, Duration::from_millis(1500)).await);
    let gw = Arc::new(Gateway::start(&config_with_slots("{balance_factor: 1.25}", 2, &bs)).await);
    let hot = ranking("hot", &bs);
    // Owners of three cold keys, one per backend.
    let cold: Vec<String> = bs
        .iter()
        .map(|b| {
            (0..)
                .map(|k| format!("cold-{k}"))
                .find(|k| ranking(k, &bs)[0] == b.addr.to_string())
                .unwrap()
        })
        .collect();
    // One request at a time, each in flight before the next is sent, so
    // every decision sees the load the ones before it left.
    let mut sent = Vec::new();
    for key in ["hot", "hot", "hot", "hot"]
        .into_iter()
        .chain(cold.iter().map(String::as_str))
    {
        let (to, key) = (gw.clone(), key.to_string());
        sent.push(tokio::spawn(async move {
            let resp = chat(&to, "m", Some(&key)).await;
            assert_eq!(resp.status(), 200);
            (
                header(&resp, "x-poimen-backend"),
                header(&resp, "x-poimen-route"),
            )
        }));
        let n = sent.len();
        let (bs, gw) = (bs.clone(), gw.clone());
        eventually("the request in flight or queued", || {
            let (bs, gw) = (bs.clone(), gw.clone());
            async move { inflight(&bs) + queued(&gw, &bs).await == n }
        })
        .await;
    }
    let mut got = Vec::new();
    for s in sent {
        got.push(s.await.unwrap());
    }
    // 3 backends of 2 slots, factor 1.25: the cap is 1 for the first two
    // requests, 2 for the next two, then 3 (see routing/bounded.rs). The
    // second stays over its cap of 1 (a slot is free), the third and fourth
    // find both of the owner's slots taken and its cap reached. The cold
    // keys find their owners under the cap of 3 (the hot key's two
    // backends full: those two wait there for a slot).
    let want_hot = [
        (&hot[0], "hash"),
        (&hot[0], "hash"),
        (&hot[1], "balance"),
        (&hot[1], "balance"),
    ];
    for (i, (backend, route)) in want_hot.iter().enumerate() {
        assert_eq!(
            (&got[i].0, got[i].1.as_str()),
            (*backend, *route),
            "hot #{i}"
        );
    }
    for (i, key) in cold.iter().enumerate() {
        assert_eq!(
            (&got[4 + i].0, got[4 + i].1.as_str()),
            (&ranking(key, &bs)[0], "hash"),
            "{key} stays on its own backend"
        );
    }
    let balance = [("model", "m"), ("route", "balance"), ("code", "200")];
    let hot_runner_up = [("backend", hot[1].as_str())];
    let labels: Vec<(&str, &str)> = balance.iter().chain(&hot_runner_up).copied().collect();
    assert_eq!(
        gw.metric("poimen_gateway_requests_total", &labels).await,
        2.0
    );
    // Each line is written once its response is done.
    eventually("7 lines", || async { gw.cache_lines().len() == 7 }).await;
    let lines = gw.cache_lines();
    let diverted: Vec<_> = lines.iter().filter(|l| l["route"] == "balance").collect();
    assert_eq!(diverted.len(), 2, "{lines:?}");
    assert!(diverted
        .iter()
        .all(|l| l["cache_key"] == "hot" && l["backend"] == hot[1].as_str()));
}

#[tokio::test(flavor = "multi_thread")]
async fn with_no_load_two_bounded_gateways_agree_on_every_key() {
    let bs = backends(4, Duration::ZERO).await;
    let conf = config("{balance_factor: 1.25}", &bs);
    let (a, b) = tokio::join!(Gateway::start(&conf), Gateway::start(&conf));
    for k in 0..300 {
        let key = format!("k{k}");
        let (ra, rb) = tokio::join!(chat(&a, "m", Some(&key)), chat(&b, "m", Some(&key)));
        let want = ranking(&key, &bs)[0].clone();
        assert_eq!(header(&ra, "x-poimen-backend"), want, "{key}");
        assert_eq!(header(&rb, "x-poimen-backend"), want, "{key}");
        assert_eq!(header(&ra, "x-poimen-route"), "hash");
    }
}

/// Turn `n` of conversation `c` (see `turn`) under `X-Poimen-Cache-Key: key`.
async fn keyed_turn(gw: &Gateway, key: &str, c: usize, n: usize) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .header("X-Poimen-Cache-Key", key)
        .body(turn(c, n).to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_moved_conversation_stays_where_it_was_moved_other_ones_do_not() {
    let bs = Arc::new(backends(3, Duration::from_millis(1000)).await);
    let gw = Arc::new(Gateway::start(&config_with_slots("{balance_factor: 1.25}", 1, &bs)).await);
    let hot = ranking("agent", &bs);
    // Two conversations of one key at once: the second finds the owner's
    // one slot taken and its cap (1) reached, and moves to the runner-up.
    let first = {
        let gw = gw.clone();
        tokio::spawn(async move { keyed_turn(&gw, "agent", 0, 0).await })
    };
    eventually("the first in flight", || async { inflight(&bs) == 1 }).await;
    let second = keyed_turn(&gw, "agent", 1, 0).await;
    served(&second, "balance", &hot[1], "conversation 1, turn 0");
    served(
        &first.await.unwrap(),
        "hash",
        &hot[0],
        "conversation 0, turn 0",
    );
    // No load now. Conversation 1 goes on where its context is, the other
    // conversations of the key (old or new) on the key's first choice.
    for b in bs.iter() {
        b.set_delay(Duration::ZERO);
    }
    for n in 1..4 {
        for (c, route, backend) in [(1, "balance", &hot[1]), (0, "hash", &hot[0])] {
            let what = format!("conversation {c}, turn {n}");
            served(&keyed_turn(&gw, "agent", c, n).await, route, backend, &what);
        }
    }
    served(
        &keyed_turn(&gw, "agent", 2, 0).await,
        "hash",
        &hot[0],
        "conversation 2",
    );
    assert_eq!(bs.iter().map(|b| b.count()).sum::<usize>(), 9);
    let labels = [
        ("model", "m"),
        ("route", "balance"),
        ("code", "200"),
        ("backend", hot[1].as_str()),
    ];
    assert_eq!(
        gw.metric("poimen_gateway_requests_total", &labels).await,
        4.0
    );
    // Every backend has the series; the moved conversation counts at its
    // new backend.
    let text = gw.metrics_text().await;
    for (backend, moved) in [(&hot[0], 0.0), (&hot[1], 1.0), (&hot[2], 0.0)] {
        let labels = [("model", "m"), ("backend", backend.as_str())];
        let got = sample(&text, "poimen_gateway_moved_conversations", &labels);
        assert_eq!(got, Some(moved), "{backend}");
    }
    eventually("9 lines", || async { gw.cache_lines().len() == 9 }).await;
    let moved: Vec<_> = gw
        .cache_lines()
        .into_iter()
        .filter(|l| l["route"] == "balance")
        .collect();
    assert_eq!(moved.len(), 4);
    assert!(moved.iter().all(|l| l["backend"] == hot[1].as_str()));
    // Another gateway with the same configuration and no load sends it to
    // the key's first choice: the move is this gateway's own.
    let other = Gateway::start(&config_with_slots("{balance_factor: 1.25}", 1, &bs)).await;
    served(
        &keyed_turn(&other, "agent", 1, 4).await,
        "hash",
        &hot[0],
        "elsewhere",
    );
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
            prefix::derive(Api::ChatCompletions, body.as_bytes(), Head::FirstUser, 2048).unwrap();
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
    let first = prefix::derive(
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
        let derived = prefix::derive(
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
