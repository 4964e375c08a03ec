//! Hostile or odd requests on a raw socket: a clear 4xx or correct routing,
//! never a panic or a hang.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::gateway::one_model;
use crate::support::{chat_body, eventually, get, FakeBackend, Gateway};

/// Send raw bytes, read the answer until the server closes or 5 s pass.
async fn raw(gw: &Gateway, request: &[u8]) -> String {
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn post(headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n{body}"
    )
    .into_bytes()
}

fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn odd_headers_and_framing_get_clear_answers() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let body = chat_body("m", "hi");
    let len = format!("Content-Length: {}\r\n", body.len());

    // A long key routes like any other; so does one that is not UTF-8.
    let long_key = format!("X-Poimen-Cache-Key: {}\r\n{len}", "k".repeat(16 * 1024));
    assert_eq!(status(&raw(&gw, &post(&long_key, &body)).await), 200);
    let mut binary_key = post(&format!("X-Poimen-Cache-Key: \u{1}\r\n{len}"), &body);
    let at = binary_key.windows(1).position(|w| w == [1]).unwrap();
    binary_key.splice(at..at + 1, [0xff, 0xfe, 0x80]);
    let answer = raw(&gw, &binary_key).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.contains("X-Poimen-Route: hash") || answer.contains("x-poimen-route: hash"));
    // Same key twice is one key.
    let twice = format!("X-Poimen-Cache-Key: a\r\nX-Poimen-Cache-Key: a\r\n{len}");
    assert_eq!(status(&raw(&gw, &post(&twice, &body)).await), 200);
    // A UTF-8 key is logged as it is; invalid bytes as U+FFFD.
    let utf8_key = format!("X-Poimen-Cache-Key: sesión-ü\r\n{len}");
    assert_eq!(status(&raw(&gw, &post(&utf8_key, &body)).await), 200);
    eventually("the cache lines of all four keyed requests", || async {
        gw.logged_cache_keys().len() == 4
    })
    .await;
    let keys = gw.logged_cache_keys();
    assert_eq!(keys[1], "\u{fffd}".repeat(3));
    assert_eq!(keys[3], "sesión-ü");

    // A huge header block is refused, not a crash.
    let huge = format!("X-Poimen-Cache-Key: {}\r\n{len}", "h".repeat(1024 * 1024));
    let s = status(&raw(&gw, &post(&huge, &body)).await);
    assert!(s == 0 || (400..500).contains(&s), "huge header: {s}");

    // No body at all, and a bogus length.
    assert_eq!(status(&raw(&gw, &post("", "")).await), 400);
    let s = status(&raw(&gw, &post("Content-Length: abc\r\n", &body)).await);
    assert!((400..500).contains(&s) || s == 0, "bogus length: {s}");
    // A body shorter than announced, then the client goes away.
    let mut short = TcpStream::connect(gw.addr).await.unwrap();
    short
        .write_all(&post("Content-Length: 100000\r\n", &body))
        .await
        .unwrap();
    drop(short);

    // HTTP/1.0 clients are served.
    let http10 = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = raw(&gw, http10.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1."), "{answer}");
    assert_eq!(status(&answer), 200, "{answer}");

    // Garbage is a 400 (or a closed connection), not a panic.
    let s = status(&raw(&gw, b"\x16\x03\x01\x02\x00garbage\r\n\r\n").await);
    assert!(s == 0 || s == 400, "garbage: {s}");

    // Still healthy, never panicked.
    assert_eq!(get(&gw, "/health").await.status(), 200);
    assert!(!gw.stderr().contains("panicked"), "{}", gw.stderr());
    // Long, binary, repeated and UTF-8 keys, HTTP/1.0: nothing else got through.
    assert_eq!(b.count(), 5);
}

/// A request on `path` with a chat body, as raw bytes.
fn post_to(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The JSON body of a raw answer.
fn json_of(answer: &str) -> serde_json::Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn only_plain_paths_reach_a_backend() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let body = chat_body("m", "hi");
    for path in [
        "/v1/../admin",
        "/v1/../v1/chat/completions",
        "/v1/./chat/completions",
        "/v1/chat/completions/..",
        "/v1/%2e%2e/collective_rpc",
        "/v1/chat%2Fcompletions",
        "/v1/%2E/chat/completions",
    ] {
        let answer = raw(&gw, &post_to(path, &body)).await;
        assert_eq!(status(&answer), 400, "{path}: {answer}");
        assert_eq!(json_of(&answer)["error"]["code"], "invalid_body", "{path}");
    }
    // On Anthropic's API, in its shape.
    let answer = raw(&gw, &post_to("/v1/messages/../count_tokens", &body)).await;
    assert_eq!(status(&answer), 400);
    assert_eq!(json_of(&answer)["error"]["type"], "invalid_request_error");
    assert_eq!(json_of(&answer)["type"], "error");
    // An absolute-form target never reaches a backend either.
    let absolute = post_to("http://10.0.0.1/v1/chat/completions", &body);
    assert_eq!(status(&raw(&gw, &absolute).await), 400);
    // A path that is not vLLM's is not forwarded at all.
    assert_eq!(
        status(&raw(&gw, &post_to("/scale_elastic_ep", &body)).await),
        404
    );
    assert_eq!(b.count(), 0, "the backend saw none of them");
    let answer = raw(&gw, &post_to("/v1/chat/completions", &body)).await;
    assert_eq!(status(&answer), 200);
    assert_eq!(b.seen()[0].path, "/v1/chat/completions");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_chunked_body_is_the_clients_error() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    for (path, shape) in [
        ("/v1/chat/completions", "openai"),
        ("/v1/messages", "anthropic"),
    ] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nabc\r\n0\r\n\r\n"
        );
        let answer = raw(&gw, request.as_bytes()).await;
        assert_eq!(status(&answer), 400, "{answer}");
        let error = json_of(&answer);
        match shape {
            "openai" => assert_eq!(error["error"]["code"], "invalid_body"),
            _ => assert_eq!(error["error"]["type"], "invalid_request_error"),
        }
    }
    // Neither sent on, nor blamed: the backend is up and counted no failure.
    assert_eq!(b.count(), 0);
    assert_eq!(
        gw.metric("poimen_gateway_backend_failures_total", &[])
            .await,
        0.0
    );
    let health: serde_json::Value = get(&gw, "/health").await.json().await.unwrap();
    assert_eq!(health["models"][0]["backends"][0]["state"], "up");
    // The client's mistake is no ERROR of the gateway's.
    assert!(
        !gw.log_lines().iter().any(|l| l["level"] == "ERROR"),
        "{}",
        gw.stderr()
    );
}
