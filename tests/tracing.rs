//! OpenTelemetry traces, as a collector receives them (a loopback OTLP/HTTP
//! receiver decoding the protobuf): one span per request with exact
//! fields, W3C trace context in and out, and a collector that is down or
//! stalled costing no request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::gateway::{check_config, one_model};
use crate::support::otlp::{hex, Collector, Received};
use crate::support::{chat_body, client, eventually, key_owned_by, FakeBackend, Gateway, Reply};

const USAGE: &str = r#"{"prompt_tokens":651,"total_tokens":667,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":512}}"#;
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn tracing(endpoint: &str, extra: &str) -> String {
    format!("  tracing:\n    otlp_endpoint: {endpoint}\n{extra}")
}

/// A gateway tracing to `endpoint` (`extra` lines under `tracing:`, then
/// `rest`), model `m` on `backends`.
async fn start(endpoint: &str, extra: &str, rest: &str, backends: &[SocketAddr]) -> Gateway {
    let config = format!(
        "{}{rest}{}",
        tracing(endpoint, extra),
        one_model("m", backends)
    );
    Gateway::start(&config).await
}

fn usage_reply() -> Reply {
    Reply::Json {
        body: format!(
            r#"{{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[],"usage":{USAGE}}}"#
        ),
        headers: vec![],
    }
}

/// POST a chat completion with these headers; its status.
async fn post(gw: &Gateway, headers: &[(&str, &str)]) -> u16 {
    let mut req = client()
        .post(gw.url("/v1/chat/completions"))
        .body(chat_body("m", "hello"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap().status().as_u16()
}

/// The attributes of a chat completion's span for model `m` answered
/// `status`, with `more`.
fn chat_span(status: u16, more: Value) -> Value {
    let mut span = json!({
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": status,
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "m",
    });
    let fields = span.as_object_mut().unwrap();
    fields.extend(more.as_object().unwrap().clone());
    span
}

fn only(spans: &[Received]) -> &Received {
    assert_eq!(spans.len(), 1, "{spans:#?}");
    &spans[0]
}

/// The attributes that vary by run (times), checked and removed.
fn timed(attributes: &mut BTreeMap<String, Value>, keys: &[&str]) {
    for key in keys {
        let v = attributes
            .remove(*key)
            .unwrap_or_else(|| panic!("{key} missing"));
        assert!(
            v.as_f64().is_some_and(|s| (0.0..10.0).contains(&s)),
            "{key} = {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keyed_request_is_one_span_continuing_the_clients_trace() {
    let otlp = Collector::start().await;
    let b = FakeBackend::start().await;
    b.set_reply(usage_reply());
    let extra = "    service_name: gw-test\n  tenants: {header: X-Tenant}\n";
    let gw = start(&otlp.endpoint(), extra, "", &[b.addr]).await;
    let parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let headers = [
        ("traceparent", parent.as_str()),
        ("tracestate", "vendor=1"),
        ("X-Poimen-Cache-Key", "session-42"),
        ("X-Tenant", "alice"),
    ];
    assert_eq!(post(&gw, &headers).await, 200);

    let spans = otlp.wait_for(1).await;
    let got = only(&spans);
    let span = &got.span;
    assert_eq!(span.name, "chat m");
    assert_eq!(span.kind, 2, "SPAN_KIND_SERVER");
    assert_eq!(hex(&span.trace_id), CLIENT_TRACE);
    assert_eq!(hex(&span.parent_span_id), CLIENT_SPAN);
    assert_eq!(span.trace_state, "vendor=1");
    assert!(span.start_time_unix_nano > 0 && span.end_time_unix_nano >= span.start_time_unix_nano);
    assert_eq!(span.status.as_ref().map_or(0, |s| s.code), 0, "unset");
    assert!(span.events.is_empty(), "{:?}", got.events());
    let mut attributes = got.attributes();
    timed(
        &mut attributes,
        &["poimen.queue.duration", "poimen.time_to_first_byte"],
    );
    let key_hash = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(b"session-42"));
    let expected = chat_span(
        200,
        json!({
            "gen_ai.usage.input_tokens": 651,
            "gen_ai.usage.output_tokens": 16,
            "gen_ai.usage.cache_read.input_tokens": 512,
            "poimen.tenant": "alice",
            "poimen.backend": b.addr.to_string(),
            "poimen.route": "hash",
            "poimen.attempts": 1,
            "poimen.cache_key.hash": key_hash,
            "poimen.cache_key.source": "header",
        }),
    );
    assert_eq!(serde_json::to_value(&attributes).unwrap(), expected);
    assert_eq!(got.resource["service.name"], "gw-test");
    assert_eq!(got.resource["service.version"], env!("CARGO_PKG_VERSION"));
    // Posted as OTLP/HTTP protobuf to the base URL's /v1/traces.
    assert!(otlp
        .posts()
        .iter()
        .all(|(path, ct)| path == "/v1/traces" && ct == "application/x-protobuf"));

    // vLLM gets the gateway's span as its parent: same trace, flags kept,
    // the client's trace state passed on.
    let seen = &b.seen()[0];
    let expected = format!("00-{CLIENT_TRACE}-{}-01", hex(&span.span_id));
    assert_eq!(seen.headers["traceparent"], expected.as_str());
    assert_eq!(seen.headers["tracestate"], "vendor=1");
    assert!(seen.headers.get("x-tenant").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_request_has_its_retry_and_the_exclusion_as_events() {
    let otlp = Collector::start().await;
    let mut a = FakeBackend::start().await;
    let b = FakeBackend::start().await;
    let gw = start(
        &otlp.endpoint(),
        "",
        "  failure_exclusion_secs: 7\n",
        &[a.addr, b.addr],
    )
    .await;
    let key = key_owned_by(a.addr, &[a.addr, b.addr]);
    a.stop();
    assert_eq!(post(&gw, &[("X-Poimen-Cache-Key", &key)]).await, 200);

    let spans = otlp.wait_for(1).await;
    let got = only(&spans);
    let mut attributes = got.attributes();
    timed(
        &mut attributes,
        &["poimen.queue.duration", "poimen.time_to_first_byte"],
    );
    // The backends answer without usage: no gen_ai.usage.*; no error.
    let expected = chat_span(
        200,
        json!({
            "poimen.tenant": "default",
            "poimen.backend": b.addr.to_string(),
            "poimen.route": "fallback",
            "poimen.attempts": 2,
            "poimen.cache_key.hash": format!("{:016x}", xxhash_rust::xxh3::xxh3_64(key.as_bytes())),
            "poimen.cache_key.source": "header",
        }),
    );
    assert_eq!(serde_json::to_value(&attributes).unwrap(), expected);
    // No trace context arrived: the gateway began the trace.
    assert!(got.span.parent_span_id.is_empty());
    let backend = a.addr.to_string();
    let expected = vec![
        (
            "retry".to_string(),
            BTreeMap::from([
                ("poimen.backend".to_string(), json!(backend)),
                ("error.type".to_string(), json!("ConnectRefused")),
                ("poimen.reconnect".to_string(), json!(false)),
            ]),
        ),
        (
            "backend_excluded".to_string(),
            BTreeMap::from([
                ("poimen.backend".to_string(), json!(backend)),
                ("poimen.excluded_for".to_string(), json!(7.0)),
            ]),
        ),
    ];
    assert_eq!(got.events(), expected);
    // A traceparent went upstream all the same.
    let seen = &b.seen()[0];
    let expected = format!(
        "00-{}-{}-01",
        hex(&got.span.trace_id),
        hex(&got.span.span_id)
    );
    assert_eq!(seen.headers["traceparent"], expected.as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_request_says_why() {
    let otlp = Collector::start().await;
    let b = FakeBackend::start().await;
    b.set_delay(Duration::from_millis(1500));
    let extra = "  scheduler: {max_num_seqs: 1, max_queue_depth: 0}\n  tenants:\n    header: X-Tenant\n    list:\n      - {name: r, requests_per_minute: 1}\n";
    let gw = start(&otlp.endpoint(), "", extra, &[b.addr]).await;
    let gw = std::sync::Arc::new(gw);
    let busy = {
        let gw = gw.clone();
        tokio::spawn(async move { post(&gw, &[("X-Tenant", "a")]).await })
    };
    eventually("the slot is taken", || async { b.inflight() == 1 }).await;
    assert_eq!(post(&gw, &[("X-Tenant", "q")]).await, 503);
    assert_eq!(busy.await.unwrap(), 200);
    // A budget: the second request of the minute is refused.
    assert_eq!(post(&gw, &[("X-Tenant", "r")]).await, 200);
    assert_eq!(post(&gw, &[("X-Tenant", "r")]).await, 429);

    let spans = otlp.wait_for(4).await;
    let refused: Vec<&Received> = spans
        .iter()
        .filter(|s| s.attributes()["http.response.status_code"] != 200)
        .collect();
    assert_eq!(refused.len(), 2);
    for got in refused {
        let attributes = got.attributes();
        let (status, reason, event) = match attributes["poimen.tenant"].as_str() {
            Some("q") => (503, "queue_full", "queue_refused"),
            Some("r") => (429, "requests_per_minute", "budget_refused"),
            other => panic!("tenant {other:?}"),
        };
        assert_eq!(got.span.name, "chat m");
        // Never sent anywhere: no backend, attempt, queue time or usage.
        let expected = chat_span(
            status,
            json!({
                "poimen.tenant": attributes["poimen.tenant"],
                "error.type": reason,
            }),
        );
        assert_eq!(serde_json::to_value(&attributes).unwrap(), expected);
        let reason_only = BTreeMap::from([("poimen.reason".to_string(), json!(reason))]);
        assert_eq!(got.events(), vec![(event.to_string(), reason_only)]);
        // A server error is the span's error; a refusal of the client's
        // budget is not.
        let code = got.span.status.as_ref().map_or(0, |s| s.code);
        assert_eq!(code, if status >= 500 { 2 } else { 0 });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collector_down_or_stalled_costs_no_request() {
    let b = FakeBackend::start().await;
    // Down: nothing listens on its port.
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", down.local_addr().unwrap());
    drop(down);
    let extra = "    export_timeout_ms: 300\n";
    let gw = start(&endpoint, extra, "", &[b.addr]).await;
    for _ in 0..20 {
        assert_eq!(post(&gw, &[]).await, 200);
    }
    let failed = [("reason", "export_failed")];
    let name = "poimen_gateway_trace_spans_dropped_total";
    eventually("every span counted as dropped", || async {
        gw.metric(name, &failed).await == 20.0
    })
    .await;
    assert_eq!(gw.metric(name, &[("reason", "queue_full")]).await, 0.0);

    // Stalled: it takes the first export and never answers; the queue
    // holds 4 more, and the rest are dropped at once.
    let stalled = Collector::start_stalled().await;
    let extra = "    max_queued_spans: 4\n    export_timeout_ms: 60000\n";
    let gw = start(&stalled.endpoint(), extra, "", &[b.addr]).await;
    for _ in 0..30 {
        assert_eq!(post(&gw, &[]).await, 200);
    }
    eventually("the first export arrived", || async {
        stalled.posts().len() == 1
    })
    .await;
    // A span ends after its response is sent: the last ones may still be
    // ending when the client has its answer.
    let full = [("reason", "queue_full")];
    eventually("the spans beyond the queue dropped", || async {
        gw.metric(name, &full).await >= 22.0
    })
    .await;
    let dropped = gw.metric(name, &full).await;
    assert!((22.0..=26.0).contains(&dropped), "{dropped} dropped");
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_keeps_the_context_and_drops_the_span() {
    let otlp = Collector::start().await;
    let b = FakeBackend::start().await;
    let mut gw = start(&otlp.endpoint(), "    sample_ratio: 0.0\n", "", &[b.addr]).await;
    assert_eq!(post(&gw, &[]).await, 200);
    // A sampled parent is followed whatever the ratio.
    let parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(post(&gw, &[("traceparent", &parent)]).await, 200);
    let spans = otlp.wait_for(1).await;
    assert_eq!(hex(&only(&spans).span.trace_id), CLIENT_TRACE);

    let seen = b.seen();
    // Not sampled: a context of its own all the same, flags 00.
    let unsampled = seen[0].headers["traceparent"].to_str().unwrap();
    let parts: Vec<&str> = unsampled.split('-').collect();
    assert_eq!(
        (parts.len(), parts[0], parts[3]),
        (4, "00", "00"),
        "{unsampled}"
    );
    assert_ne!(parts[1], "0".repeat(32));
    let sampled = seen[1].headers["traceparent"].to_str().unwrap();
    assert!(sampled.starts_with(&format!("00-{CLIENT_TRACE}-")) && sampled.ends_with("-01"));
    // Whatever is queued is exported at shutdown.
    assert!(gw.terminate().success());
    assert_eq!(otlp.spans().len(), 1, "the unsampled span was exported");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_tracing_the_clients_context_goes_upstream_untouched() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let headers = [("traceparent", parent.as_str()), ("tracestate", "v=1")];
    assert_eq!(post(&gw, &headers).await, 200);
    let seen = &b.seen()[0];
    assert_eq!(seen.headers["traceparent"], parent.as_str());
    assert_eq!(seen.headers["tracestate"], "v=1");
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_still_queued_at_shutdown_are_exported() {
    let otlp = Collector::start().await;
    let b = FakeBackend::start().await;
    let mut gw = start(&otlp.endpoint(), "", "", &[b.addr]).await;
    for _ in 0..3 {
        assert_eq!(post(&gw, &[]).await, 200);
    }
    // Within the export interval (5 s): nothing was exported yet.
    assert!(otlp.spans().is_empty());
    assert!(gw.terminate().success());
    assert_eq!(otlp.spans().len(), 3);
}

#[test]
fn the_check_refuses_a_collector_it_cannot_reach() {
    let base = one_model("m", &["127.0.0.1:9".parse().unwrap()]);
    let cases = [
        ("https://otel:4318", "https is not supported"),
        ("127.0.0.1:4318", "not a URL"),
    ];
    for (endpoint, why) in cases {
        let out = check_config(&format!("gateway:\n{}{base}", tracing(endpoint, "")));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{endpoint}");
        assert!(
            stderr.contains("gateway.tracing.otlp_endpoint") && stderr.contains(why),
            "{stderr}"
        );
    }
    let ratio = tracing("http://127.0.0.1:4318", "    sample_ratio: 1.5\n");
    let out = check_config(&format!("gateway:\n{ratio}{base}"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gateway.tracing.sample_ratio"));
}
