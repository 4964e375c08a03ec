//! The Responses API with stored responses, against vllm-sim backends that
//! keep them in their own memory as vLLM does: a turn that continues one
//! (`previous_response_id`), a retrieve and a cancel reach the backend that
//! stored it, also once the gateway has forgotten (a restart), and a clear
//! error when that backend is gone.

use serde_json::{json, Value};

use crate::support::gateway::one_model;
use crate::support::metrics::sample;
use crate::support::sim::Sim;
use crate::support::{client, header, Gateway};

/// One turn: `input` after `previous`, with a cache key when given.
async fn turn(
    gw: &Gateway,
    input: &str,
    previous: Option<&str>,
    key: Option<&str>,
) -> (u16, String, String, Value) {
    let mut body = json!({"model": "m", "input": input, "max_output_tokens": 4});
    if let Some(p) = previous {
        body["previous_response_id"] = json!(p);
    }
    let mut req = client().post(gw.url("/v1/responses")).json(&body);
    if let Some(k) = key {
        req = req.header("X-Poimen-Cache-Key", k);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let (backend, route) = (
        header(&resp, "x-poimen-backend"),
        header(&resp, "x-poimen-route"),
    );
    (status, backend, route, resp.json().await.unwrap())
}

/// A chain of `turns` turns; the backend of each and the last response.
async fn chain(gw: &Gateway, turns: usize, key: Option<&str>) -> (Vec<String>, Value) {
    let (mut backends, mut last) = (Vec::new(), Value::Null);
    for i in 0..turns {
        let previous = last["id"].as_str().map(str::to_string);
        let (status, backend, route, body) =
            turn(gw, &format!("turn {i}"), previous.as_deref(), key).await;
        assert_eq!(status, 200, "turn {i}: {body}");
        if i > 0 {
            assert_eq!(route, "owner", "turn {i}");
        }
        backends.push(backend);
        last = body;
    }
    (backends, last)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stored_conversation_stays_on_the_backend_that_stored_it() {
    let sims = Sim::start_n(3, "m");
    let addrs: Vec<_> = sims.iter().map(|s| s.addr).collect();
    let gw = Gateway::start(&one_model("m", &addrs)).await;
    // Round-robin would send each turn elsewhere; every chain stays whole.
    for c in 0..3 {
        let (backends, last) = chain(&gw, 5, None).await;
        assert!(
            backends.iter().all(|b| *b == backends[0]),
            "chain {c}: {backends:?}"
        );
        assert!(last["usage"]["input_tokens_details"]["cached_tokens"].as_u64() > Some(0));
    }
    // Keyed: the key's backend for the first turn, the owner after.
    let (backends, _) = chain(&gw, 5, Some("session-1")).await;
    assert!(backends.iter().all(|b| *b == backends[0]), "{backends:?}");
    let known = gw
        .metric(
            "poimen_gateway_response_owner_lookups_total",
            &[("result", "known")],
        )
        .await;
    assert_eq!(
        known, 16.0,
        "4 chains of 4 continuing turns, all remembered"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn retrieve_and_cancel_reach_the_owner() {
    let sims = Sim::start_n(3, "m");
    let addrs: Vec<_> = sims.iter().map(|s| s.addr).collect();
    let gw = Gateway::start(&one_model("m", &addrs)).await;
    let (backends, last) = chain(&gw, 2, None).await;
    let id = last["id"].as_str().unwrap();
    for _ in 0..3 {
        let resp = client()
            .get(gw.url(&format!("/v1/responses/{id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "x-poimen-backend"), backends[1]);
        assert_eq!(header(&resp, "x-poimen-route"), "owner");
        let got: Value = resp.json().await.unwrap();
        assert_eq!(got, last, "the stored response, as the owner keeps it");
    }
    // vLLM cancels only background responses: the owner's own answer.
    let resp = client()
        .post(gw.url(&format!("/v1/responses/{id}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&resp, "x-poimen-backend"), backends[1]);
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "Cannot cancel a synchronous response."
    );
    // Not served by vLLM 0.32, so not by the gateway either.
    let resp = client()
        .delete(gw.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_that_forgot_asks_the_backends_once() {
    let sims = Sim::start_n(3, "m");
    let addrs: Vec<_> = sims.iter().map(|s| s.addr).collect();
    let config = one_model("m", &addrs);
    let gw = Gateway::start(&config).await;
    let (backends, last) = chain(&gw, 2, None).await;
    drop(gw);
    // A new gateway (a restart) has never seen the conversation.
    let gw = Gateway::start(&config).await;
    let id = last["id"].as_str().unwrap().to_string();
    let mut previous = id;
    for i in 0..3 {
        let (status, backend, route, body) =
            turn(&gw, &format!("after {i}"), Some(&previous), None).await;
        assert_eq!((status, route.as_str()), (200, "owner"), "{body}");
        assert_eq!(backend, backends[0]);
        previous = body["id"].as_str().unwrap().to_string();
    }
    let lookups = gw.metrics_text().await;
    let lookups = |result| {
        sample(
            &lookups,
            "poimen_gateway_response_owner_lookups_total",
            &[("result", result)],
        )
    };
    assert_eq!(lookups("found"), Some(1.0), "asked once, then remembered");
    assert_eq!(lookups("known"), Some(2.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_response_gets_vllms_404_and_a_lost_one_a_clear_error() {
    let mut sims = Sim::start_n(2, "m");
    let addrs: Vec<_> = sims.iter().map(|s| s.addr).collect();
    let gw = Gateway::start(&one_model("m", &addrs)).await;
    // No backend has it: the 404 vLLM gives, as it gives it.
    let (status, _, _, body) = turn(&gw, "hi", Some("resp_0000000000000000"), None).await;
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"error": {"message": "Response with id 'resp_0000000000000000' not found.",
            "type": "invalid_request_error", "param": "response_id", "code": 404}})
    );
    let resp = client()
        .get(gw.url("/v1/responses/resp_0000000000000000"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // Its owner gone: never sent to the other backend.
    let (backends, last) = chain(&gw, 1, None).await;
    let owner = sims
        .iter()
        .position(|s| s.addr.to_string() == backends[0])
        .unwrap();
    drop(sims.remove(owner));
    let served = sims[0].stats().await["requests"].clone();
    let id = last["id"].as_str().unwrap();
    let (status, _, _, body) = turn(&gw, "again", Some(id), None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "stored_response_unavailable");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(id) && message.contains(&backends[0]),
        "{message}"
    );
    // While it is excluded, at once, with the time it is left out for.
    let resp = client()
        .post(gw.url("/v1/responses"))
        .json(&json!({"model": "m", "input": "x", "previous_response_id": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert!(header(&resp, "retry-after").parse::<u64>().unwrap() > 1);
    assert_eq!(
        sims[0].stats().await["requests"],
        served,
        "the other backend saw none"
    );
}
