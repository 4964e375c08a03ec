//! Routing by cost over the prefix index (`routing.prefix_index`), on
//! vllm-sim: what the sims cached, and what the gateway expected.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use poimen_gateway::routing::rendezvous::rank;

use crate::support::metrics::{sample, scrape};
use crate::support::sim::Sim;
use crate::support::{client, header, Gateway};

fn config(sims: &[Sim], slots: usize) -> String {
    let list: Vec<String> = sims.iter().map(|s| format!("\"{}\"", s.addr)).collect();
    format!(
        "  routing: {{prefix_index: {{cache_tokens: 100000}}}}\n  scheduler: {{max_num_seqs: {slots}, max_queue_depth: 64}}\n  models:\n    - name: m\n      addresses: [{}]\n",
        list.join(", ")
    )
}

/// The messages of turn `turn` (from 1) of conversation `name`: a long
/// context of its own, then the turns so far.
fn messages(name: &str, turn: usize) -> Value {
    let mut m = vec![json!({"role": "system", "content": format!("{name} ").repeat(2000)})];
    for t in 1..turn {
        m.push(json!({"role": "user", "content": format!("question {t}")}));
        m.push(json!({"role": "assistant", "content": format!("answer {t}")}));
    }
    m.push(json!({"role": "user", "content": format!("question {turn}")}));
    json!(m)
}

struct Answer {
    backend: String,
    route: String,
    cached: u64,
    /// `X-Poimen-Expected-Cached-Tokens`.
    expected: u64,
}

/// One keyless turn through `gw`.
async fn turn(gw: &Gateway, name: &str, turn_no: usize) -> Answer {
    send(gw, name, turn_no, None).await
}

/// One turn through `gw`, under `X-Poimen-Cache-Key: key` if given.
async fn send(gw: &Gateway, name: &str, turn_no: usize, key: Option<&str>) -> Answer {
    let body = json!({"model": "m", "messages": messages(name, turn_no), "max_tokens": 4});
    let mut req = client().post(gw.url("/v1/chat/completions")).json(&body);
    if let Some(key) = key {
        req = req.header("X-Poimen-Cache-Key", key);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200, "{name} turn {turn_no}");
    let (backend, route) = (
        header(&resp, "x-poimen-backend"),
        header(&resp, "x-poimen-route"),
    );
    let expected = header(&resp, "x-poimen-expected-cached-tokens")
        .parse()
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    Answer {
        backend,
        route,
        cached,
        expected,
    }
}

async fn gauge(gw: &Gateway, backend: SocketAddr) -> f64 {
    let text = scrape(gw.metrics).await;
    let labels = [("model", "m"), ("backend", &backend.to_string()[..])];
    sample(&text, "poimen_gateway_prefix_index_tokens", &labels).unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn keyless_conversations_stay_where_their_prefix_is_cached() {
    let sims: Vec<Sim> = (0..3).map(|_| Sim::start("m", &[])).collect();
    let gw = Gateway::start(&config(&sims, 4)).await;
    for name in ["alpha", "beta", "gamma", "delta"] {
        let first = turn(&gw, name, 1).await;
        assert_eq!(first.route, "round_robin", "{name}: a new conversation");
        assert_eq!(first.expected, 0, "{name}: nothing known yet");
        for t in 2..=4 {
            let next = turn(&gw, name, t).await;
            assert_eq!(next.backend, first.backend, "{name} turn {t} moved");
            // Its context (2,000 words) came from the sim's cache.
            assert!(next.cached >= 2000, "{name} turn {t}: {}", next.cached);
            // The index expected about as much (four bytes of JSON a token
            // against the sim's four bytes of text).
            let (e, c) = (next.expected as f64, next.cached as f64);
            assert!((e - c).abs() < c / 3.0, "{name} turn {t}: {e} vs {c}");
            assert!(["round_robin", "cache"].contains(&next.route.as_str()));
        }
    }
    // Round-robin alone would have scattered the turns: some went where
    // the turn was not.
    let text = scrape(gw.metrics).await;
    let cache_routed: f64 = sims
        .iter()
        .filter_map(|s| {
            let b = s.addr.to_string();
            let labels = [("backend", &b[..]), ("route", "cache")];
            sample(&text, "poimen_gateway_requests_total", &labels)
        })
        .sum();
    assert!(cache_routed >= 4.0, "{cache_routed}");
    // What the index expected is counted beside what vLLM reported, and
    // the index's size per backend is shown.
    let expected: f64 = sims
        .iter()
        .filter_map(|s| {
            let b = s.addr.to_string();
            let labels = [("model", "m"), ("backend", &b[..])];
            sample(
                &text,
                "poimen_gateway_prefix_index_expected_tokens_total",
                &labels,
            )
        })
        .sum();
    let hits: f64 = sims
        .iter()
        .filter_map(|s| {
            let b = s.addr.to_string();
            let labels = [("model", "m"), ("backend", &b[..])];
            sample(&text, "vllm_prefix_cache_hit_tokens_total", &labels)
        })
        .sum();
    assert!(expected > 0.0 && hits > 0.0, "{expected} {hits}");
    // The estimate (four bytes of JSON a token) is within a third of the
    // sims' count (four bytes of text a token).
    assert!((expected - hits).abs() < hits / 3.0, "{expected} vs {hits}");
    for s in &sims {
        assert!(gauge(&gw, s.addr).await > 0.0, "{}", s.addr);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_that_fails_is_forgotten() {
    let mut sims: Vec<Sim> = (0..2).map(|_| Sim::start("m", &[])).collect();
    let gw = Gateway::start(&config(&sims, 4)).await;
    let home = turn(&gw, "epsilon", 1).await.backend;
    let home_addr: SocketAddr = home.parse().unwrap();
    assert!(gauge(&gw, home_addr).await > 0.0);
    // The home goes away (a crash, a restart): the next turn fails there,
    // is retried on the other, and the index forgets the home.
    let i = sims.iter().position(|s| s.addr == home_addr).unwrap();
    drop(sims.remove(i));
    let next = turn(&gw, "epsilon", 2).await;
    assert_ne!(next.backend, home);
    assert_eq!(next.cached, 0, "the other sim never saw it");
    assert_eq!(gauge(&gw, home_addr).await, 0.0);
    // From now on its prefix is on the survivor.
    let after = turn(&gw, "epsilon", 3).await;
    assert_eq!(after.backend, next.backend);
    assert!(after.cached >= 2000, "{}", after.cached);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hot_conversation_spreads_when_waiting_costs_more_than_a_prefill() {
    // One slot each, every request about 100 ms: a queue of 12 behind one
    // slot costs over a second, a cold prefill of the context far less.
    let args = [
        "--decode-us-per-token",
        "25000",
        "--default-max-tokens",
        "4",
    ];
    let sims: Vec<Sim> = (0..3).map(|_| Sim::start_scaled("m", "1", &args)).collect();
    let gw = Gateway::start(&config(&sims, 1)).await;
    let home = turn(&gw, "hot", 1).await.backend;
    let burst: Vec<_> = (0..12)
        .map(|_| {
            let url = gw.url("/v1/chat/completions");
            let body = json!({"model": "m", "messages": messages("hot", 2)});
            tokio::spawn(async move {
                let resp = client().post(url).json(&body).send().await.unwrap();
                assert_eq!(resp.status(), 200);
                (
                    header(&resp, "x-poimen-backend"),
                    header(&resp, "x-poimen-route"),
                )
            })
        })
        .collect();
    let mut served = Vec::new();
    for r in burst {
        served.push(
            tokio::time::timeout(Duration::from_secs(30), r)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let moved = served.iter().filter(|(b, _)| *b != home).count();
    assert!(moved > 0, "all waited at home: {served:?}");
    assert!(served.iter().any(|(_, r)| r == "balance"), "{served:?}");
    // Most stayed where the prefix was, or followed it where it moved.
    let at_home = served.len() - moved;
    assert!(at_home > 0, "{served:?}");
}

/// Two gateways with the same configuration, sharing the sims and nothing
/// else, route every conversation alike: a new one on idle backends to its
/// key's rendezvous choice, its next turns where its prefix is.
#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_sharing_no_state_agree_on_every_conversation() {
    let sims = Sim::start_n(4, "m");
    let conf = config(&sims, 4);
    let (a, b) = tokio::join!(Gateway::start(&conf), Gateway::start(&conf));
    let mut members: Vec<SocketAddr> = sims.iter().map(|s| s.addr).collect();
    members.sort();
    let members: Vec<(String, u32)> = members.iter().map(|a| (a.to_string(), 1)).collect();
    let mut used = std::collections::HashSet::new();
    for c in 0..12 {
        let (name, key) = (format!("agent{c}"), format!("session-{c}"));
        let first = &members[rank(key.as_bytes(), &members)[0]].0;
        for turn_no in 1..=2 {
            let on_a = send(&a, &name, turn_no, Some(&key)).await;
            let on_b = send(&b, &name, turn_no, Some(&key)).await;
            let what = format!("{name} turn {turn_no}");
            assert_eq!(
                (&on_a.backend, on_a.route.as_str()),
                (first, "hash"),
                "{what}"
            );
            assert_eq!(
                (&on_b.backend, on_b.route.as_str()),
                (first, "hash"),
                "{what}"
            );
            if turn_no == 2 {
                assert!(on_a.expected >= 2000 && on_b.expected >= 2000, "{what}");
            }
        }
        used.insert(first.clone());
    }
    assert!(used.len() > 1, "the keys spread: {used:?}");
}
