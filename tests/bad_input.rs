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
