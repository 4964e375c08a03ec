//! Keyed requests go to their rendezvous backend; the rest round-robin.

use std::collections::HashMap;
use std::net::SocketAddr;

use poimen_gateway::routing::rendezvous::rank;

use crate::support::gateway::one_model;
use crate::support::{chat, header, FakeBackend, Gateway};

async fn backends(n: usize) -> Vec<FakeBackend> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(FakeBackend::start().await);
    }
    v
}

fn addrs(backends: &[FakeBackend]) -> Vec<SocketAddr> {
    backends.iter().map(|b| b.addr).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_always_reaches_its_backend_and_is_forwarded_unchanged() {
    let bs = backends(4).await;
    let gw = Gateway::start(&one_model("m", &addrs(&bs))).await;
    for k in 0..40 {
        let key = format!("session-{k}");
        let mut first = None;
        for _ in 0..3 {
            let resp = chat(&gw, "m", Some(&key)).await;
            assert_eq!(resp.status(), 200);
            assert_eq!(header(&resp, "x-poimen-route"), "hash");
            let backend = header(&resp, "x-poimen-backend");
            let body: serde_json::Value = resp.json().await.unwrap();
            assert_eq!(
                body["backend"],
                backend.as_str(),
                "header names the backend that answered"
            );
            assert_eq!(
                *first.get_or_insert(backend.clone()),
                backend,
                "key {key} moved"
            );
        }
    }
    for b in &bs {
        for seen in b.seen() {
            let key = seen.headers["x-poimen-cache-key"].to_str().unwrap();
            assert!(
                key.starts_with("session-"),
                "key reached the backend unchanged"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_gateway_processes_map_1000_keys_identically_and_as_documented() {
    let bs = backends(4).await;
    let config = one_model("m", &addrs(&bs));
    let (a, b) = tokio::join!(Gateway::start(&config), Gateway::start(&config));
    // The documented function, over the addresses in sorted order.
    let mut sorted = addrs(&bs);
    sorted.sort();
    let documented: Vec<(String, u32)> = sorted.iter().map(|a| (a.to_string(), 1)).collect();
    for k in 0..1000 {
        let key = format!("k{k}");
        let (ra, rb) = tokio::join!(chat(&a, "m", Some(&key)), chat(&b, "m", Some(&key)));
        let (ba, bb) = (
            header(&ra, "x-poimen-backend"),
            header(&rb, "x-poimen-backend"),
        );
        assert_eq!(ba, bb, "key {key}");
        assert_eq!(
            ba,
            documented[rank(key.as_bytes(), &documented)[0]].0,
            "key {key}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_without_a_key_round_robin() {
    let bs = backends(3).await;
    let gw = Gateway::start(&one_model("m", &addrs(&bs))).await;
    let mut counts: HashMap<String, usize> = HashMap::new();
    for _ in 0..300 {
        let resp = chat(&gw, "m", None).await;
        assert_eq!(header(&resp, "x-poimen-route"), "round_robin");
        *counts.entry(header(&resp, "x-poimen-backend")).or_default() += 1;
    }
    assert_eq!(counts.len(), 3);
    assert!(counts.values().all(|c| *c == 100), "{counts:?}");
    // An empty key counts as no key.
    let resp = crate::support::client()
        .post(gw.url("/v1/chat/completions"))
        .header("X-Poimen-Cache-Key", "")
        .body(crate::support::chat_body("m", "x"))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&resp, "x-poimen-route"), "round_robin");
}

#[tokio::test(flavor = "multi_thread")]
async fn models_route_to_their_own_pools_and_are_listed() {
    let (a, b) = (FakeBackend::start().await, FakeBackend::start().await);
    let gw = Gateway::start(&format!(
        "  models:\n    - name: alpha\n      address: \"{}\"\n    - name: beta\n      addresses: [{{address: \"{}\", weight: 2}}]\n",
        a.addr, b.addr
    ))
    .await;
    let ra = chat(&gw, "alpha", Some("x")).await;
    let rb = chat(&gw, "beta", Some("x")).await;
    assert_eq!(header(&ra, "x-poimen-backend"), a.addr.to_string());
    assert_eq!(header(&rb, "x-poimen-backend"), b.addr.to_string());

    let list: serde_json::Value = reqwest::get(gw.url("/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "beta"]);
    assert_eq!(list["data"][0]["object"], "model");
}
