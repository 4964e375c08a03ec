//! A failed backend is excluded for the window; requests fall back to the
//! next-highest score, with their body intact.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::gateway::one_model;
use crate::support::{chat, client, eventually, get, header, key_owned_by, FakeBackend, Gateway};

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_backend_is_excluded_then_returns_after_the_window() {
    let mut a = FakeBackend::start().await;
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&format!(
        "  failure_exclusion_secs: 2\n{}",
        one_model("m", &[a.addr, b.addr])
    ))
    .await;
    let key = key_owned_by(a.addr, &[a.addr, b.addr]);
    assert_eq!(
        header(&chat(&gw, "m", Some(&key)).await, "x-poimen-backend"),
        a.addr.to_string()
    );

    a.stop();
    let excluded_at = Instant::now();
    // The failed attempt is retried on the runner-up: the client sees no error.
    let resp = chat(&gw, "m", Some(&key)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-poimen-backend"), b.addr.to_string());
    assert_eq!(header(&resp, "x-poimen-route"), "fallback");

    let health: serde_json::Value = get(&gw, "/health").await.json().await.unwrap();
    let states: Vec<&str> = health["models"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["state"].as_str().unwrap())
        .collect();
    assert!(
        states.contains(&"excluded") && states.contains(&"up"),
        "{health}"
    );
    assert_eq!(health["status"], "ok");

    // Back on its port: still excluded inside the window...
    a.restart().await;
    let resp = chat(&gw, "m", Some(&key)).await;
    if excluded_at.elapsed() < Duration::from_millis(1900) {
        assert_eq!(header(&resp, "x-poimen-backend"), b.addr.to_string());
        assert_eq!(a.count(), 1, "an excluded backend gets no traffic");
    }
    // ...and the owner again after it: waiting the window out is the point.
    tokio::time::sleep(
        Duration::from_secs(2).saturating_sub(excluded_at.elapsed()) + Duration::from_millis(100),
    )
    .await;
    let resp = chat(&gw, "m", Some(&key)).await;
    assert_eq!(header(&resp, "x-poimen-backend"), a.addr.to_string());
    assert_eq!(header(&resp, "x-poimen-route"), "hash");
    assert!(gw.stderr().contains("\"event\":\"backend_excluded\""));
}

#[tokio::test(flavor = "multi_thread")]
async fn all_backends_down_gives_503_with_retry_after() {
    let mut a = FakeBackend::start().await;
    let gw = Gateway::start(&format!(
        "  failure_exclusion_secs: 30\n{}",
        one_model("m", &[a.addr])
    ))
    .await;
    a.stop();
    let resp = chat(&gw, "m", Some("k")).await;
    assert_eq!(resp.status(), 503);
    let retry_after: u64 = header(&resp, "retry-after").parse().unwrap();
    assert!((29..=30).contains(&retry_after), "{retry_after}");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_backend");

    // Now excluded: refused before any connect attempt, with the time left.
    let resp = chat(&gw, "m", None).await;
    assert_eq!(resp.status(), 503);
    assert!(header(&resp, "retry-after").parse::<u64>().unwrap() <= 30);
    let health = get(&gw, "/health").await;
    assert_eq!(health.status(), 503);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_body_is_resent_intact_to_the_fallback() {
    let mut a = FakeBackend::start().await;
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("m", &[a.addr, b.addr])).await;
    let key = key_owned_by(a.addr, &[a.addr, b.addr]);
    a.stop();
    let body = crate::support::chat_body("m", &"z".repeat(1 << 20));
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .header("X-Poimen-Cache-Key", &key)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-poimen-backend"), b.addr.to_string());
    assert!(b.seen()[0].body == body.as_bytes());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_killed_under_load_fails_only_what_it_had() {
    let mut a = FakeBackend::start().await;
    let b = FakeBackend::start().await;
    a.set_delay(Duration::from_millis(30));
    b.set_delay(Duration::from_millis(30));
    let gw = Arc::new(Gateway::start(&one_model("m", &[a.addr, b.addr])).await);
    let failed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (gw, failed) = (gw.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                let resp = chat(&gw, "m", Some(&format!("w{w}-{i}"))).await;
                if resp.status() != 200 {
                    failed.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    eventually("a quarter of the load served, some of it on a", || async {
        a.count() + b.count() >= 80 && a.inflight() > 0
    })
    .await;
    let in_flight_on_a = a.inflight();
    a.stop();
    for t in tasks {
        t.await.unwrap();
    }
    let failed = failed.load(Ordering::SeqCst);
    eprintln!(
        "backend killed under load: 320 requests, {failed} failed, {in_flight_on_a} were in flight on it, {} served by the survivor",
        b.count()
    );
    assert!(
        failed <= in_flight_on_a,
        "{failed} failed, {in_flight_on_a} were in flight on the killed backend"
    );
    assert!(b.count() > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_leaving_before_the_answer_is_not_a_backend_failure() {
    let a = FakeBackend::start().await;
    let b = FakeBackend::start().await;
    a.set_delay(Duration::from_millis(800));
    b.set_delay(Duration::from_millis(800));
    let gw = Gateway::start(&one_model("m", &[a.addr, b.addr])).await;
    for i in 0..4 {
        let key = format!("gone-{i}");
        let request = chat(&gw, "m", Some(&key));
        // The client gives up while the backend is still working.
        assert!(tokio::time::timeout(Duration::from_millis(200), request)
            .await
            .is_err());
    }
    // Until no request is left anywhere: at the backends (their 800 ms
    // answers) and at the gateway (a retry would hold a slot there).
    let slots = |b: &FakeBackend| {
        let backend = b.addr.to_string();
        let gw = &gw;
        async move {
            gw.metric("poimen_gateway_in_flight", &[("backend", &backend)])
                .await
        }
    };
    eventually("every abandoned request over", || async {
        a.inflight() + b.inflight() == 0 && slots(&a).await + slots(&b).await == 0.0
    })
    .await;
    // Each abandoned request reached one backend once: no retry elsewhere.
    assert_eq!(a.count() + b.count(), 4);
    let health: serde_json::Value = get(&gw, "/health").await.json().await.unwrap();
    for backend in health["models"][0]["backends"].as_array().unwrap() {
        assert_eq!(backend["state"], "up", "{health}");
    }
    assert_eq!(
        gw.metric("poimen_gateway_backend_failures_total", &[])
            .await,
        0.0
    );
}
