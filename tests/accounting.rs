//! Prefix-cache accounting: header, body usage, SSE usage, a usage chunk the
//! gateway asked for and hid, and none at all; exact counters and log lines.

use std::time::Duration;

use crate::support::gateway::one_model;
use crate::support::{client, sdk, FakeBackend, Gateway, Reply};

const USAGE: &str = r#"{"prompt_tokens":651,"total_tokens":667,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":512}}"#;

fn json_reply(usage: Option<&str>, header: Option<&str>) -> Reply {
    let usage = usage.map_or(String::new(), |u| format!(r#","usage":{u}"#));
    Reply::Json {
        body: format!(
            r#"{{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"length"}}]{usage}}}"#
        ),
        headers: header
            .map(|h| vec![("vllm-num-cached-tokens", h.to_string())])
            .unwrap_or_default(),
    }
}

fn token_events() -> Vec<String> {
    (0..3)
        .map(|i| format!(r#"{{"id":"chatcmpl-2","object":"chat.completion.chunk","model":"m","choices":[{{"index":0,"delta":{{"content":"t{i}"}},"finish_reason":null}}]}}"#))
        .collect()
}

fn usage_chunk() -> String {
    format!(
        r#"{{"id":"chatcmpl-2","object":"chat.completion.chunk","model":"m","choices":[],"usage":{USAGE}}}"#
    )
}

fn expected_stream(with_usage: bool) -> String {
    let mut s: String = token_events()
        .iter()
        .map(|e| format!("data: {e}\n\n"))
        .collect();
    if with_usage {
        s += &format!("data: {}\n\n", usage_chunk());
    }
    s + "data: [DONE]\n\n"
}

/// A backend streaming three tokens, with usage when asked for it.
async fn streaming_backend() -> FakeBackend {
    let b = FakeBackend::start().await;
    b.set_reply(Reply::Sse {
        events: token_events(),
        gap: Duration::from_millis(5),
        usage: Some(usage_chunk()),
    });
    b
}

async fn post(gw: &Gateway, body: String, key: Option<&str>) -> reqwest::Response {
    let mut req = client().post(gw.url("/v1/chat/completions")).body(body);
    if let Some(k) = key {
        req = req.header("X-Poimen-Cache-Key", k);
    }
    req.send().await.unwrap()
}

fn chat(stream: Option<&str>) -> String {
    let extra = stream.unwrap_or("");
    format!(r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra},"model":"m"}}"#)
}

/// The `prefix_cache` log lines of the gateway so far.
async fn cache_lines(gw: &Gateway, n: usize) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let lines = gw.cache_lines();
        if lines.len() >= n || std::time::Instant::now() > deadline {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until (hits, prompt tokens, usage missing) reach `want`: they are
/// counted in Pingora's logging phase, just after the client has its answer.
async fn assert_counters(gw: &Gateway, b: &FakeBackend, want: (f64, f64, f64)) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = counters(gw, b).await;
        if got == want || std::time::Instant::now() > deadline {
            assert_eq!(got, want, "(hit tokens, prompt tokens, usage missing)");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn counters(gw: &Gateway, b: &FakeBackend) -> (f64, f64, f64) {
    let l = [("model", "m"), ("backend", &*b.addr.to_string())];
    (
        gw.metric("vllm_prefix_cache_hit_tokens_total", &l).await,
        gw.metric("poimen_gateway_prompt_tokens_total", &l).await,
        gw.metric("poimen_gateway_usage_missing_total", &l).await,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn header_body_and_both_with_exact_counters_and_log_lines() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;

    // Header only (patched vLLM), twice.
    b.set_reply(json_reply(None, Some("64")));
    for _ in 0..2 {
        assert_eq!(post(&gw, chat(None), Some("sess-1")).await.status(), 200);
    }
    assert_counters(&gw, &b, (128.0, 0.0, 0.0)).await;

    // Body usage only (stock vLLM), three times; the client gets it unchanged.
    b.set_reply(json_reply(Some(USAGE), None));
    for _ in 0..3 {
        let body: serde_json::Value = post(&gw, chat(None), None).await.json().await.unwrap();
        assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 512);
    }
    assert_counters(&gw, &b, (128.0 + 3.0 * 512.0, 3.0 * 651.0, 0.0)).await;

    // Both: the header wins.
    b.set_reply(json_reply(Some(USAGE), Some("600")));
    post(&gw, chat(None), None).await;
    assert_counters(&gw, &b, (128.0 + 1536.0 + 600.0, 4.0 * 651.0, 0.0)).await;

    let lines = cache_lines(&gw, 6).await;
    assert_eq!(lines.len(), 6);
    let first = &lines[0];
    assert_eq!(first["level"], "INFO");
    assert!(first["ts"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert_eq!(first["event"], "prefix_cache");
    assert_eq!(first["cache_key"], "sess-1");
    assert_eq!(first["cached_tokens"], 64);
    assert!(first["total_tokens"].is_null() && first["hit_rate"].is_null());
    assert_eq!(first["route"], "hash");
    assert_eq!(first["backend"], b.addr.to_string());
    assert_eq!(first["model"], "m");
    assert_eq!(first["status"], 200);
    assert!(first["duration_ms"].is_u64());
    let body_only = &lines[2];
    assert!(body_only["cache_key"].is_null());
    assert_eq!(body_only["cached_tokens"], 512);
    assert_eq!(body_only["total_tokens"], 651);
    assert_eq!(body_only["route"], "round_robin");
    assert!((body_only["hit_rate"].as_f64().unwrap() - 512.0 / 651.0).abs() < 1e-9);
    assert_eq!(lines[5]["cached_tokens"], 600);
    // Pingora's own lines are JSON objects too, their text in `msg`.
    assert!(gw.log_lines().iter().any(|v| {
        v["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("pingora"))
            && v["msg"].is_string()
    }));
    let requests = gw
        .metric(
            "poimen_gateway_requests_total",
            &[("model", "m"), ("route", "round_robin"), ("code", "200")],
        )
        .await;
    assert_eq!(requests, 4.0);
    assert_eq!(
        gw.metric(
            "poimen_gateway_time_to_first_byte_seconds_count",
            &[("model", "m")]
        )
        .await,
        6.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_with_usage_asked_by_the_client_is_passed_and_accounted() {
    let b = streaming_backend().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let body = chat(Some(
        r#","stream":true,"stream_options":{"include_usage":true}"#,
    ));
    let text = post(&gw, body.clone(), None).await.text().await.unwrap();
    assert_eq!(text, expected_stream(true));
    assert!(
        b.seen()[0].body == body.as_bytes(),
        "the client's own body is forwarded as is"
    );
    assert_counters(&gw, &b, (512.0, 651.0, 0.0)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_asks_for_stream_usage_and_hides_it_from_the_client() {
    let b = streaming_backend().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let body = chat(Some(r#","stream":true"#));
    let resp = post(&gw, body, Some("k")).await;
    assert!(resp.headers().get("content-length").is_none());
    let text = resp.text().await.unwrap();
    // Exactly the events the client would get from vLLM without the gateway.
    assert_eq!(text, expected_stream(false));
    let upstream: serde_json::Value = serde_json::from_slice(&b.seen()[0].body).unwrap();
    assert_eq!(upstream["stream_options"]["include_usage"], true);
    assert_counters(&gw, &b, (512.0, 651.0, 0.0)).await;
    let line = &cache_lines(&gw, 1).await[0];
    assert_eq!(line["cached_tokens"], 512);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_usage_the_cached_count_is_unknown_not_zero() {
    let b = streaming_backend().await;
    let gw = Gateway::start(&format!(
        "  stream_usage: false\n{}",
        one_model("m", &[b.addr])
    ))
    .await;
    for _ in 0..2 {
        let text = post(&gw, chat(Some(r#","stream":true"#)), None)
            .await
            .text()
            .await
            .unwrap();
        assert_eq!(text, expected_stream(false));
    }
    b.set_reply(json_reply(None, None));
    post(&gw, chat(None), None).await;
    assert_counters(&gw, &b, (0.0, 0.0, 3.0)).await;
    let lines = cache_lines(&gw, 3).await;
    assert!(lines
        .iter()
        .all(|l| l["cached_tokens"].is_null() && l["hit_rate"].is_null()));
    // Embeddings are proxied but are not completions: no line, no count.
    let resp = client()
        .post(gw.url("/v1/embeddings"))
        .body(chat(None))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    post(&gw, chat(None), None).await;
    assert_eq!(cache_lines(&gw, 4).await.len(), 4);
    assert_counters(&gw, &b, (0.0, 0.0, 4.0)).await;
}

/// The official OpenAI Python SDK (installed by scripts/setup.sh) reads the
/// stream the gateway passes on, with and without usage asked for.
#[tokio::test(flavor = "multi_thread")]
async fn the_openai_python_sdk_reads_both_kinds_of_stream() {
    if !sdk::sdk_available("openai").await {
        return;
    }
    let b = streaming_backend().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let base = format!("http://{}", gw.addr);
    for (mode, chunks) in [("plain", 3), ("usage", 4)] {
        let v = sdk::run("openai_stream.py", &[&base, "m", mode]).await;
        assert_eq!(v["content"], "t0t1t2", "{mode}");
        assert_eq!(v["chunks"], chunks, "{mode}");
        let usages = v["usage"].as_array().unwrap();
        if mode == "plain" {
            assert!(usages.iter().all(|u| u.is_null()), "{v}");
        } else {
            assert_eq!(usages[3]["prompt_tokens_details"]["cached_tokens"], 512);
        }
    }
    // Both streams were accounted.
    assert_counters(&gw, &b, (1024.0, 1302.0, 0.0)).await;
}
