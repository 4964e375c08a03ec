//! Per-backend slots, a bounded queue, 503 at once when full, warmups that
//! yield, observed from the client, the backend and /metrics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::gateway::{check_config_env, one_model};
use crate::support::{chat, client, eventually, header, spawn_chat, FakeBackend, Gateway, Reply};

async fn backend_metric(gw: &Gateway, name: &str, b: &FakeBackend) -> f64 {
    gw.metric(name, &[("model", "m"), ("backend", &b.addr.to_string())])
        .await
}

/// A backend that answers after `delay`, behind a gateway with one slot per
/// backend and the `yaml` keys; its one slot already taken by "holder".
async fn one_busy_slot(
    delay: Duration,
    yaml: &str,
) -> (FakeBackend, Arc<Gateway>, tokio::task::JoinHandle<u16>) {
    let b = FakeBackend::start().await;
    b.set_delay(delay);
    let gw = Arc::new(Gateway::start(&format!("{yaml}{}", one_model("m", &[b.addr]))).await);
    let holder = spawn_chat(&gw, "holder");
    eventually("slot taken", || async { b.count() == 1 }).await;
    (b, gw, holder)
}

fn warmup_request(gw: &Gateway, key: &str) -> reqwest::RequestBuilder {
    client()
        .post(gw.url("/v1/chat/completions"))
        .header("X-Poimen-Warmup", "True")
        .header("X-Poimen-Cache-Key", key)
        .body(crate::support::chat_body("m", "warm me"))
}

#[tokio::test(flavor = "multi_thread")]
async fn thirty_requests_on_four_slots_and_twenty_places() {
    let b = FakeBackend::start().await;
    b.set_delay(Duration::from_secs(2));
    let gw = Arc::new(Gateway::start(&one_model("m", &[b.addr])).await);
    let started = Instant::now();
    let tasks: Vec<_> = (0..30)
        .map(|i| {
            let gw = gw.clone();
            tokio::spawn(async move {
                let resp = chat(&gw, "m", Some(&format!("k{i}"))).await;
                let status = resp.status().as_u16();
                let retry_after = header(&resp, "retry-after");
                let body: serde_json::Value = resp.json().await.unwrap_or_default();
                (status, started.elapsed(), retry_after, body)
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let rejected: Vec<_> = results.iter().filter(|r| r.0 == 503).collect();
    let completed = results.iter().filter(|r| r.0 == 200).count();
    assert_eq!(rejected.len(), 6, "{results:?}");
    assert_eq!(completed, 24);
    for (_, after, retry_after, body) in rejected {
        // Refused at once, not after waiting for a slot.
        assert!(*after < Duration::from_secs(1), "503 after {after:?}");
        assert_eq!(retry_after, "1");
        assert_eq!(body["error"]["code"], "queue_full");
    }
    assert_eq!(b.max_inflight(), 4, "the backend never saw more than 4");
    assert_eq!(b.count(), 24);
    let rejected = gw
        .metric(
            "poimen_gateway_queue_rejected_total",
            &[("model", "m"), ("reason", "queue_full")],
        )
        .await;
    assert_eq!(rejected, 6.0);
    assert_eq!(
        backend_metric(&gw, "poimen_gateway_in_flight", &b).await,
        0.0
    );
    assert_eq!(
        backend_metric(&gw, "poimen_gateway_queue_depth", &b).await,
        0.0
    );
    assert_eq!(
        gw.metric("poimen_gateway_queue_wait_seconds_count", &[])
            .await,
        24.0
    );
    assert!(gw.stderr().contains("\"event\":\"queue_full\""));
}

#[tokio::test(flavor = "multi_thread")]
async fn slots_and_places_come_back_when_clients_leave() {
    let b = FakeBackend::start().await;
    b.set_reply(Reply::sse(
        (0..50).map(|i| format!("{{\"n\":{i}}}")).collect(),
        Duration::from_millis(200),
    ));
    let gw = Arc::new(
        Gateway::start(&format!(
            "  scheduler: {{max_num_seqs: 1, max_queue_depth: 5}}\n{}",
            one_model("m", &[b.addr])
        ))
        .await,
    );
    // One stream holds the only slot; two more wait in the queue.
    let mut stream = chat(&gw, "m", Some("s")).await;
    assert_eq!(stream.status(), 200);
    stream.chunk().await.unwrap();
    let queued: Vec<_> = (0..2)
        .map(|_| {
            let gw = gw.clone();
            tokio::spawn(async move { chat(&gw, "m", None).await })
        })
        .collect();
    eventually("two queued", || async {
        backend_metric(&gw, "poimen_gateway_queue_depth", &b).await == 2.0
    })
    .await;
    assert_eq!(
        backend_metric(&gw, "poimen_gateway_in_flight", &b).await,
        1.0
    );

    // Clients gone while queued leave the queue at once.
    for q in queued {
        q.abort();
    }
    eventually("queue empty", || async {
        backend_metric(&gw, "poimen_gateway_queue_depth", &b).await == 0.0
    })
    .await;
    assert_eq!(
        b.count(),
        1,
        "the abandoned requests never reached the backend"
    );

    // A client gone mid-stream frees its slot and cancels the upstream request.
    drop(stream);
    eventually("slot free", || async {
        backend_metric(&gw, "poimen_gateway_in_flight", &b).await == 0.0
    })
    .await;
    eventually("upstream cancelled", || async { b.inflight() == 0 }).await;

    // And the slot is really usable again.
    b.set_reply(Reply::Echo);
    assert_eq!(chat(&gw, "m", None).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warmup_yields_to_agent_requests_and_is_marked_low_priority() {
    let b = FakeBackend::start().await;
    let gw = Arc::new(
        Gateway::start(&format!(
            "  scheduler: {{max_num_seqs: 1}}\n  warmup: {{delay_ms: 500, vllm_priority: 5}}\n{}",
            one_model("m", &[b.addr])
        ))
        .await,
    );
    // A warmup sent just before agent requests reaches the backend after them.
    let warm = tokio::spawn(warmup_request(&gw, "w").send());
    eventually("the warmup delayed", || async {
        gw.metric("warmup_requests_delayed_total", &[]).await == 1.0
    })
    .await;
    for i in 0..3 {
        assert_eq!(chat(&gw, "m", Some(&format!("a{i}"))).await.status(), 200);
    }
    assert_eq!(warm.await.unwrap().unwrap().status(), 200);
    let seen = b.seen();
    let keys: Vec<&str> = seen
        .iter()
        .map(|s| s.headers["x-poimen-cache-key"].to_str().unwrap())
        .collect();
    assert_eq!(keys, ["a0", "a1", "a2", "w"]);
    // The marker stripped, priority added; agents untouched.
    let w = &seen[3];
    assert!(w.headers.get("x-poimen-warmup").is_none());
    assert_eq!(w.headers["x-priority"], "low");
    assert_eq!(w.headers["x-vllm-priority"], "5");
    assert!(seen[0].headers.get("x-priority").is_none());
    assert_eq!(gw.metric("warmup_requests_delayed_total", &[]).await, 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_agents_go_before_queued_warmups() {
    let (b, gw, holder) = one_busy_slot(
        Duration::from_millis(800),
        "  scheduler: {max_num_seqs: 1}\n  warmup: {delay_ms: 50}\n",
    )
    .await;
    let warm = tokio::spawn(warmup_request(&gw, "w").send());
    eventually("warmup queued", || async {
        backend_metric(&gw, "poimen_gateway_queue_depth", &b).await == 1.0
    })
    .await;
    let agent = spawn_chat(&gw, "agent");
    eventually("agent queued", || async {
        backend_metric(&gw, "poimen_gateway_queue_depth", &b).await == 2.0
    })
    .await;
    assert_eq!(holder.await.unwrap(), 200);
    assert_eq!(agent.await.unwrap(), 200);
    assert_eq!(warm.await.unwrap().unwrap().status(), 200);
    let keys: Vec<String> = b
        .seen()
        .iter()
        .map(|s| {
            s.headers["x-poimen-cache-key"]
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(keys, ["holder", "agent", "w"]);
}

/// Two slow backends of one slot each, no queue, `overflow: spill`.
async fn two_slow_backends_with_spill() -> (FakeBackend, FakeBackend, Arc<Gateway>) {
    let (a, b) = (FakeBackend::start().await, FakeBackend::start().await);
    a.set_delay(Duration::from_millis(1500));
    b.set_delay(Duration::from_millis(1500));
    let gw = Gateway::start(&format!(
        "  scheduler: {{max_num_seqs: 1, max_queue_depth: 0, overflow: spill}}\n{}",
        one_model("m", &[a.addr, b.addr])
    ))
    .await;
    (a, b, Arc::new(gw))
}

#[tokio::test(flavor = "multi_thread")]
async fn spill_sends_the_overflow_to_the_second_ranked_backend() {
    let (a, b, gw) = two_slow_backends_with_spill().await;
    let owner = tokio::spawn({
        let gw = gw.clone();
        async move {
            let r = chat(&gw, "m", Some("hot")).await;
            (
                r.status().as_u16(),
                header(&r, "x-poimen-route"),
                header(&r, "x-poimen-backend"),
            )
        }
    });
    eventually("owner busy", || async { a.count() + b.count() == 1 }).await;
    let spilled = chat(&gw, "m", Some("hot")).await;
    assert_eq!(spilled.status(), 200);
    assert_eq!(header(&spilled, "x-poimen-route"), "spill");
    let (status, route, owner_addr) = owner.await.unwrap();
    assert_eq!((status, route.as_str()), (200, "hash"));
    assert_ne!(header(&spilled, "x-poimen-backend"), owner_addr);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_every_queue_full_spill_still_answers_503() {
    let (a, b, gw) = two_slow_backends_with_spill().await;
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let gw = gw.clone();
            tokio::spawn(async move { chat(&gw, "m", Some("hot")).await.status() })
        })
        .collect();
    eventually("both busy", || async { a.count() + b.count() == 2 }).await;
    let resp = chat(&gw, "m", Some("hot")).await;
    assert_eq!(resp.status(), 503);
    for t in busy {
        assert_eq!(t.await.unwrap(), 200);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_waiting_past_the_queue_timeout_gets_503() {
    let (_b, gw, holder) = one_busy_slot(
        Duration::from_secs(3),
        "  scheduler: {max_num_seqs: 1, queue_timeout_ms: 300}\n",
    )
    .await;
    let resp = chat(&gw, "m", None).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(header(&resp, "retry-after"), "1");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "queue_timeout");
    assert_eq!(
        gw.metric(
            "poimen_gateway_queue_rejected_total",
            &[("reason", "queue_timeout")]
        )
        .await,
        1.0
    );
    assert_eq!(holder.await.unwrap(), 200);
}

#[test]
fn environment_overrides_are_checked_by_the_binary() {
    let yaml = "gateway:\n  models: [{name: m, address: \"127.0.0.1:1\"}]\n";
    let out = check_config_env(yaml, &[("VLLM_MAX_NUM_SEQS", "0")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("VLLM_MAX_NUM_SEQS = 0"));
    let out = check_config_env(yaml, &[("WARMUP_DELAY_MS", "soon")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("WARMUP_DELAY_MS = \"soon\""));
    assert!(check_config_env(yaml, &[("VLLM_MAX_QUEUE_DEPTH", "50")])
        .status
        .success());
}
