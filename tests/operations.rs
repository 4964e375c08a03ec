//! What an operator relies on: timeouts that free slots, health checks that
//! bring a backend back early without taking a busy one out, API keys.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::gateway::{one_model, temp_dir};
use crate::support::{chat, client, eventually, get, header, FakeBackend, Gateway, Reply};

async fn inflight(gw: &Gateway, b: &FakeBackend) -> f64 {
    gw.metric(
        "poimen_gateway_in_flight",
        &[("model", "m"), ("backend", &b.addr.to_string())],
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_backend_gives_504_and_frees_the_slot() {
    let b = FakeBackend::start().await;
    b.set_delay(Duration::from_secs(30));
    let gw = Gateway::start(&format!(
        "  read_timeout_ms: 500\n  scheduler: {{max_num_seqs: 1}}\n{}",
        one_model("m", &[b.addr])
    ))
    .await;
    let started = Instant::now();
    let resp = chat(&gw, "m", None).await;
    assert_eq!(resp.status(), 504);
    assert!(started.elapsed() < Duration::from_secs(10));
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "gateway_timeout");
    assert_eq!(inflight(&gw, &b).await, 0.0);
    // Slow is not dead: the backend is not excluded.
    let health: serde_json::Value = get(&gw, "/health").await.json().await.unwrap();
    assert_eq!(health["models"][0]["backends"][0]["state"], "up");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_stalls_is_cut_and_frees_the_slot() {
    let b = FakeBackend::start().await;
    b.set_reply(Reply::sse(
        vec!["{\"n\":1}".into(), "{\"n\":2}".into()],
        Duration::from_secs(20),
    ));
    let gw = Gateway::start(&format!(
        "  read_timeout_ms: 500\n{}",
        one_model("m", &[b.addr])
    ))
    .await;
    let mut resp = chat(&gw, "m", None).await;
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert_eq!(&first[..], b"data: {\"n\":1}\n\n");
    // The idle timeout ends the response early (an error, or a short body).
    let mut rest = Vec::new();
    while let Ok(Some(c)) = resp.chunk().await {
        rest.extend_from_slice(&c);
    }
    assert!(!String::from_utf8_lossy(&rest).contains("[DONE]"));
    assert_eq!(inflight(&gw, &b).await, 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_health_check_brings_an_excluded_backend_back_early() {
    let mut a = FakeBackend::start().await;
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&format!(
        "  failure_exclusion_secs: 60\n  health_check: {{path: /health, interval_ms: 200, timeout_ms: 300, consecutive_ok: 2}}\n{}",
        one_model("m", &[a.addr, b.addr])
    ))
    .await;
    a.stop();
    // Every keyed request of a's keys falls back until a is back.
    let mut keys_of_a = Vec::new();
    for i in 0..20 {
        let key = format!("k{i}");
        if header(&chat(&gw, "m", Some(&key)).await, "x-poimen-route") == "fallback" {
            keys_of_a.push(key);
        }
    }
    assert!(!keys_of_a.is_empty());
    a.restart().await;
    let back = Instant::now();
    let deadline = back + Duration::from_secs(10);
    loop {
        let resp = chat(&gw, "m", Some(&keys_of_a[0])).await;
        if header(&resp, "x-poimen-backend") == a.addr.to_string() {
            assert_eq!(header(&resp, "x-poimen-route"), "hash");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not restored by the health check"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Well before the 60 s window ends.
    assert!(back.elapsed() < Duration::from_secs(10));
    assert!(gw.stderr().contains("\"event\":\"backend_restored\""));
    assert_eq!(
        gw.metric(
            "poimen_gateway_backend_excluded",
            &[("backend", &a.addr.to_string())]
        )
        .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_health_endpoint_does_not_exclude_a_busy_backend() {
    let b = FakeBackend::start().await;
    // Every answer, /health included, takes longer than the probe waits.
    b.set_delay(Duration::from_millis(800));
    let gw = Arc::new(
        Gateway::start(&format!(
            "  health_check: {{interval_ms: 100, timeout_ms: 100}}\n{}",
            one_model("m", &[b.addr])
        ))
        .await,
    );
    eventually("the health check probing", || async {
        b.seen().iter().filter(|s| s.path == "/health").count() >= 2
    })
    .await;
    for _ in 0..3 {
        assert_eq!(chat(&gw, "m", None).await.status(), 200);
    }
    assert_eq!(gw.metric("poimen_gateway_backend_excluded", &[]).await, 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn api_keys_are_required_and_never_forwarded() {
    let b = FakeBackend::start().await;
    let dir = temp_dir();
    let keys = dir.join("keys");
    // One plain key and one given as its SHA-256 ("hashed-key").
    std::fs::write(&keys, "client-key-1\n# a comment\na4ae87b73fa5645e6aee415a6f72be4dcbd99d057a7b40cb1b867c181d179260\n").unwrap();
    let gw = Gateway::start(&format!(
        "  auth: {{api_keys_file: \"{}\", upstream_api_key: upstream-secret}}\n{}",
        keys.display(),
        one_model("m", &[b.addr])
    ))
    .await;
    let post = |auth: Option<&'static str>| {
        let mut req = client()
            .post(gw.url("/v1/chat/completions"))
            .body(crate::support::chat_body("m", "hi"));
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        req.send()
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("client-key-1"),
        Some("Basic Y2xpZW50LWtleS0x"),
    ] {
        let resp = post(auth).await.unwrap();
        assert_eq!(resp.status(), 401, "{auth:?}");
        // RFC 6750: an error code only when a bearer credential was sent.
        let challenge = match auth {
            Some("Bearer wrong") => "Bearer error=\"invalid_token\"",
            _ => "Bearer",
        };
        assert_eq!(header(&resp, "www-authenticate"), challenge);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
    assert_eq!(b.count(), 0, "nothing reached the backend");
    assert_eq!(get(&gw, "/v1/models").await.status(), 401);
    assert_eq!(get(&gw, "/health").await.status(), 200);

    assert_eq!(
        post(Some("Bearer client-key-1")).await.unwrap().status(),
        200
    );
    assert_eq!(post(Some("Bearer hashed-key")).await.unwrap().status(), 200);
    let seen = b.seen().pop().unwrap();
    assert_eq!(seen.headers["authorization"], "Bearer upstream-secret");
    assert!(!gw.stderr().contains("client-key-1"), "a key was logged");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_upstream_key_the_clients_authorization_is_removed() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .header("Authorization", "Bearer anything")
        .body(crate::support::chat_body("m", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(b.seen()[0].headers.get("authorization").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_client_is_backpressured_and_its_slot_freed_when_it_leaves() {
    let b = FakeBackend::start().await;
    // 64 MiB of answer, far more than any buffer on the way.
    b.set_reply(Reply::Json {
        body: format!("{{\"data\":\"{}\"}}", "x".repeat(64 << 20)),
        headers: Vec::new(),
    });
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let before = gw.rss_kib();
    let mut resp = chat(&gw, "m", None).await;
    assert_eq!(resp.status(), 200);
    let mut read = 0;
    while read < 1 << 20 {
        read += resp.chunk().await.unwrap().unwrap().len();
    }
    // The client stops reading: the gateway must not pull the rest in, so
    // the backend's writes stall with most of the answer unsent.
    let written = b.written_when_stalled().await;
    assert!(
        written < 32 << 20,
        "the backend wrote {written} bytes of 64 MiB"
    );
    let during = gw.rss_kib();
    assert!(
        during < before + 16 * 1024,
        "RSS grew from {before} KiB to {during} KiB"
    );
    assert_eq!(inflight(&gw, &b).await, 1.0);
    drop(resp);
    eventually("slot freed", || async { inflight(&gw, &b).await == 0.0 }).await;
    eprintln!(
        "slow client: gateway RSS {before} KiB before, {during} KiB while the backend stalled after {written} bytes"
    );
}

/// On a host whose memory has fragmented, a transparent huge page's fault
/// stalls the thread that takes it for tens of ms: the daemon runs without.
#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_runs_without_transparent_huge_pages() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", gw.pid())).unwrap();
    let thp = status.lines().find(|l| l.starts_with("THP_enabled:"));
    assert_eq!(
        thp.map(|l| l.split_whitespace().nth(1)),
        Some(Some("0")),
        "{status}"
    );
}
