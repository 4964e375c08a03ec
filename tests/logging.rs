//! Logging: a stderr nobody reads stalls no request, and what it costs is
//! counted and told; a healthy run logs no ERROR or WARN.

use std::io::{BufRead, BufReader};
use std::process::ChildStderr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::Value;

use crate::support::gateway::one_model;
use crate::support::{chat_body, client, eventually, FakeBackend, Gateway, Reply};

/// POST a chat completion for model `m` on `http`'s connections.
async fn post(http: &reqwest::Client, gw: &Gateway, key: Option<&str>) -> reqwest::Response {
    let mut req = http
        .post(gw.url("/v1/chat/completions"))
        .body(chat_body("m", "hello"));
    if let Some(key) = key {
        req = req.header("X-Poimen-Cache-Key", key);
    }
    req.send().await.unwrap()
}

/// Every line of `stderr`, read from now on by a thread of its own.
fn read_lines(stderr: ChildStderr) -> Arc<Mutex<Vec<Value>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap();
            let v =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            out.lock().unwrap().push(v);
        }
    });
    lines
}

const REQUESTS: usize = 5_000;
/// Within the default slots and queue places of one backend (4 + 20).
const CONCURRENCY: usize = 20;

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_stderr_stalls_no_request_and_its_losses_are_counted() {
    let b = FakeBackend::start().await;
    let mut gw = Gateway::start_with_stderr_pipe(&one_model("m", &[b.addr])).await;
    let stderr = gw.take_stderr();
    let stalled_since = Instant::now();
    let gw = Arc::new(gw);

    // Each request logs one `prefix_cache` line with its key in full: keys
    // this long make the lines overflow the pipe and the log queue's
    // byte bound (4 MiB) many times over.
    let padding: Arc<str> = "k".repeat(2_000).into();
    let tasks = (0..CONCURRENCY).map(|t| {
        let (gw, padding) = (gw.clone(), padding.clone());
        tokio::spawn(async move {
            let http = client();
            for i in 0..REQUESTS / CONCURRENCY {
                let key = format!("{t}-{i}-{padding}");
                let resp = post(&http, &gw, Some(&key)).await;
                assert_eq!(resp.status(), 200);
                resp.bytes().await.unwrap();
            }
        })
    });
    let done = tokio::time::timeout(Duration::from_secs(300), join_all(tasks))
        .await
        .expect("requests stuck behind the stalled stderr");
    for task in done {
        task.unwrap();
    }
    // The pipe stays unread for 10 s in all.
    tokio::time::sleep_until((stalled_since + Duration::from_secs(10)).into()).await;

    let lines = read_lines(stderr);
    // Logging resumes: a later request's line is written.
    let resp = post(&client(), &gw, Some("after-the-stall")).await;
    assert_eq!(resp.status(), 200);
    eventually("the later request's line", || {
        let found = lines
            .lock()
            .unwrap()
            .iter()
            .any(|v| v["cache_key"] == "after-the-stall");
        async move { found }
    })
    .await;

    let dropped = gw
        .metric("poimen_gateway_log_lines_dropped_total", &[])
        .await as usize;
    assert!(
        dropped > 0,
        "nothing dropped: the test did not fill the queue"
    );
    let lines = lines.lock().unwrap();
    let written = lines
        .iter()
        .filter(|v| v["event"] == "prefix_cache" && v["cache_key"] != "after-the-stall")
        .count();
    assert_eq!(
        written + dropped,
        REQUESTS,
        "{written} lines written, {dropped} counted as dropped"
    );
    // Told in the log too, at WARN, by the time the later line is out.
    let reports: Vec<&Value> = lines
        .iter()
        .filter(|v| v["event"] == "log_lines_dropped")
        .collect();
    assert!(reports.iter().all(|v| v["level"] == "WARN"), "{reports:?}");
    let reported: u64 = reports.iter().map(|v| v["dropped"].as_u64().unwrap()).sum();
    assert_eq!(reported as usize, dropped);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_healthy_run_logs_no_error_or_warning() {
    let (a, b) = (FakeBackend::start().await, FakeBackend::start().await);
    let stream = FakeBackend::start().await;
    stream.set_reply(Reply::sse(
        (0..5).map(|i| format!("{{\"n\":{i}}}")).collect(),
        Duration::from_millis(2),
    ));
    let mut gw = Gateway::start(&format!(
        "{}    - name: s\n      address: \"{}\"\n",
        one_model("m", &[a.addr, b.addr]),
        stream.addr
    ))
    .await;

    let keep_alive = client();
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    // Keyed, unkeyed and streamed requests, on kept-alive and on fresh
    // connections, 20 at a time (so pooled upstream connections are busy,
    // within a backend's 4 slots and 20 queue places).
    let shared = &gw;
    let requests = [&keep_alive, &fresh].into_iter().flat_map(|http| {
        (0..10).map(move |i| async move {
            let key = format!("key-{i}");
            let keyed = post(http, shared, Some(&key)).await;
            assert_eq!(keyed.status(), 200);
            keyed.bytes().await.unwrap();
            let unkeyed = post(http, shared, None).await;
            assert_eq!(unkeyed.status(), 200);
            unkeyed.bytes().await.unwrap();
            let streamed = http
                .post(shared.url("/v1/chat/completions"))
                .body(r#"{"model":"s","stream":true,"messages":[]}"#)
                .send()
                .await
                .unwrap();
            assert_eq!(streamed.status(), 200);
            assert!(streamed.text().await.unwrap().ends_with("data: [DONE]\n\n"));
        })
    });
    join_all(requests).await;
    for path in ["/health", "/v1/models"] {
        let resp = keep_alive.get(gw.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    assert!(gw
        .metrics_text()
        .await
        .contains("poimen_gateway_requests_total"));

    assert!(gw.terminate().success());
    let lines = gw.log_lines();
    let loud: Vec<&Value> = lines
        .iter()
        .filter(|v| v["level"] == "ERROR" || v["level"] == "WARN")
        .collect();
    assert!(loud.is_empty(), "a healthy run logged {loud:#?}");
    // Pingora's last words are written: the log is flushed at exit.
    assert!(
        lines
            .iter()
            .any(|v| v["msg"] == "All runtimes exited, exiting now"),
        "the end of the shutdown is missing"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_leaves_mid_stream_is_no_error() {
    let stream = FakeBackend::start().await;
    stream.set_reply(Reply::sse(
        (0..20).map(|i| format!("{{\"n\":{i}}}")).collect(),
        Duration::from_millis(100),
    ));
    let mut gw = Gateway::start(&one_model("s", &[stream.addr])).await;
    for _ in 0..3 {
        let mut resp = client()
            .post(gw.url("/v1/chat/completions"))
            .body(r#"{"model":"s","stream":true,"messages":[]}"#)
            .send()
            .await
            .unwrap();
        assert!(resp.chunk().await.unwrap().is_some());
        // Gone after the first event.
    }
    let backend = stream.addr.to_string();
    let labels = [("model", "s"), ("backend", backend.as_str())];
    crate::support::eventually("the three streams end", || async {
        gw.metric("poimen_gateway_requests_total", &labels).await == 3.0
    })
    .await;
    assert!(gw.terminate().success());
    let loud: Vec<Value> = gw
        .log_lines()
        .into_iter()
        .filter(|v| v["level"] == "ERROR" || v["level"] == "WARN")
        .collect();
    assert!(loud.is_empty(), "clients leaving logged {loud:#?}");
}
