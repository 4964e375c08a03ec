//! Request bodies, with `Content-Length` or chunked: read whole to find the
//! model, forwarded byte-identical (also to a fallback); every client error
//! OpenAI-shaped with the right status.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::backend::Seen;
use crate::support::gateway::one_model;
use crate::support::{client, get, header, key_owned_by, FakeBackend, Gateway};

/// A chat body of about `size` bytes with `model` as the last key.
fn big_body(model: &str, size: usize) -> Vec<u8> {
    let filler: String = (0..size).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    format!(r#"{{"messages":[{{"role":"user","content":"{filler}"}}],"stream":false,"model":"{model}"}}"#).into_bytes()
}

async fn assert_error(resp: reqwest::Response, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(resp.status(), status);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(v["error"]["type"].is_string());
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn an_8_mib_body_with_model_last_arrives_byte_identical() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("big-model", &[b.addr])).await;
    for size in [10, 64 * 1024 - 90, 64 * 1024 + 1, 8 << 20] {
        let body = big_body("big-model", size);
        let resp = client()
            .post(gw.url("/v1/chat/completions"))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "size {size}");
        assert_forwarded_intact(&b.seen().pop().unwrap(), &body);
    }
}

/// A sized body that arrives in pieces (the first with the header, the last
/// with the next request on the same connection, pipelined) reaches the
/// backend whole, and so does the next request.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_in_pieces_then_a_pipelined_request_arrive_intact() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let (first, second) = (big_body("m", 200_000), big_body("m", 1_000));
    let request = |body: &[u8]| {
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        [head.as_bytes(), body].concat()
    };
    let first_request = request(&first);
    let cut = first_request.len() - first.len() + 1_000;
    let mut last = first_request[cut + 100_000..].to_vec();
    last.extend_from_slice(&request(&second));
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    for piece in [
        &first_request[..cut],
        &first_request[cut..cut + 100_000],
        &last,
    ] {
        tcp.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both answered, in order, on the one connection.
    let mut answers = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&answers)
        .matches("HTTP/1.1 200")
        .count()
        < 2
    {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
            .await
            .expect("both answered")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&answers));
        answers.extend_from_slice(&buf[..n]);
    }
    let seen = b.seen();
    assert_eq!(seen.len(), 2);
    assert_forwarded_intact(&seen[0], &first);
    assert_forwarded_intact(&seen[1], &second);
}

/// `body` as a stream of 1000-byte pieces: with no length known, reqwest
/// sends it chunked.
fn chunked(body: &[u8]) -> reqwest::Body {
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(1000).map(|c| Ok(c.to_vec())).collect();
    reqwest::Body::wrap_stream(futures::stream::iter(pieces))
}

/// What reached the backend is the client's body, framed by its length.
fn assert_forwarded_intact(seen: &Seen, body: &[u8]) {
    assert_eq!(seen.body.len(), body.len());
    assert!(seen.body == body, "body changed on the way");
    assert_eq!(seen.headers["content-length"], body.len().to_string());
    assert!(seen.headers.get("transfer-encoding").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn chunked_bodies_of_any_size_are_routed_by_model_and_arrive_intact() {
    let a = FakeBackend::start().await;
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&format!(
        "  models:\n    - name: model-a\n      address: \"{}\"\n    - name: model-b\n      address: \"{}\"\n",
        a.addr, b.addr
    ))
    .await;
    for size in [10, 64 * 1024 + 1, 8 << 20] {
        let body = big_body("model-b", size);
        let resp = client()
            .post(gw.url("/v1/chat/completions"))
            .body(chunked(&body))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "size {size}");
        assert_forwarded_intact(&b.seen().pop().unwrap(), &body);
    }
    assert_eq!(a.count(), 0, "routed by the model at the end of the body");
}

/// A backend that takes a request of at least `bytes` bytes and hangs up
/// without answering.
async fn hang_up_after(bytes: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = vec![0; 64 * 1024];
            let mut read = 0;
            while read < bytes {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread")]
async fn an_8_mib_chunked_body_is_resent_intact_to_the_fallback() {
    let body = big_body("m", 8 << 20);
    // The first choice refuses the connection, or takes the whole body and
    // hangs up: either way the next backend gets the body intact.
    let mut refused = FakeBackend::start().await;
    refused.stop();
    for first in [refused.addr, hang_up_after(body.len()).await] {
        let b = FakeBackend::start().await;
        let gw = Gateway::start(&one_model("m", &[first, b.addr])).await;
        let resp = client()
            .post(gw.url("/v1/chat/completions"))
            .header("X-Poimen-Cache-Key", key_owned_by(first, &[first, b.addr]))
            .body(chunked(&body))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "x-poimen-route"), "fallback");
        assert_forwarded_intact(&b.seen()[0], &body);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chunked_body_over_the_limit_is_refused_without_being_held() {
    const LIMIT: usize = 4 << 20;
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&format!(
        "  max_request_body_bytes: {LIMIT}\n{}",
        one_model("m", &[b.addr])
    ))
    .await;
    let before = gw.rss_kib();
    // 64 MiB, made as it is sent.
    let piece = bytes::Bytes::from(vec![b' '; 64 * 1024]);
    let pieces =
        futures::stream::iter((0..1024).map(move |_| Ok::<_, std::io::Error>(piece.clone())));
    let send = client()
        .post(gw.url("/v1/chat/completions"))
        .body(reqwest::Body::wrap_stream(pieces))
        .send();
    tokio::pin!(send);
    // The gateway's memory while it reads, until it answers.
    let mut peak = before;
    let resp = loop {
        tokio::select! {
            resp = &mut send => break resp.unwrap(),
            _ = tokio::time::sleep(Duration::from_millis(5)) => peak = peak.max(gw.rss_kib()),
        }
    };
    assert_error(resp, 413, "body_too_large").await;
    assert!(
        peak < before + 16 * 1024,
        "RSS grew from {before} KiB to {peak} KiB reading a body over a {LIMIT}-byte limit"
    );
    assert_eq!(b.count(), 0);
    eprintln!("64 MiB chunked over a {LIMIT}-byte limit: gateway RSS {before} KiB before, at most {peak} KiB");
}

#[tokio::test(flavor = "multi_thread")]
async fn client_errors_are_openai_shaped() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&format!(
        "  max_request_body_bytes: 100000\n{}",
        one_model("m", &[b.addr])
    ))
    .await;
    let post = |path: &str, body: Vec<u8>| client().post(gw.url(path)).body(body).send();

    assert_error(
        post("/v1/chat/completions", big_body("m", 200_000))
            .await
            .unwrap(),
        413,
        "body_too_large",
    )
    .await;
    assert_error(
        post("/v1/chat/completions", b"not json".to_vec())
            .await
            .unwrap(),
        400,
        "invalid_body",
    )
    .await;
    assert_error(
        post("/v1/chat/completions", br#"{"messages":[]}"#.to_vec())
            .await
            .unwrap(),
        400,
        "invalid_body",
    )
    .await;
    assert_error(
        post("/v1/chat/completions", br#"{"model":7}"#.to_vec())
            .await
            .unwrap(),
        400,
        "invalid_body",
    )
    .await;
    let v = assert_error(
        post("/v1/chat/completions", big_body("nope", 10))
            .await
            .unwrap(),
        404,
        "model_not_found",
    )
    .await;
    assert!(v["error"]["message"].as_str().unwrap().contains("nope"));
    assert_error(
        post("/v2/anything", b"{}".to_vec()).await.unwrap(),
        404,
        "not_found",
    )
    .await;
    assert_error(get(&gw, "/v1/chat/completions").await, 404, "not_found").await;
    let two_keys = client()
        .post(gw.url("/v1/chat/completions"))
        .header("X-Poimen-Cache-Key", "a")
        .header("X-Poimen-Cache-Key", "b")
        .body(big_body("m", 10))
        .send()
        .await
        .unwrap();
    assert_error(two_keys, 400, "invalid_body").await;
    assert_eq!(b.count(), 0, "no bad request reached the backend");

    // The gateway still serves after all of that.
    let ok = post("/v1/completions", big_body("m", 10)).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(b.seen()[0].path, "/v1/completions");
}

/// How sending a body ended.
#[derive(Debug, PartialEq)]
enum Sent {
    /// Every byte written.
    All,
    /// A write failed: the gateway closed the connection.
    Cut,
    /// Still sending at the deadline.
    Deadline,
}

/// Sends `head` (a request with a chunked body), then 64 KiB chunks:
/// `chunks` of them and the last chunk, or without end when `None`, for at
/// most `deadline`, reading the answer meanwhile. Returns the answer's
/// status line and how sending ended.
async fn send_body(
    addr: SocketAddr,
    head: String,
    chunks: Option<usize>,
    deadline: Duration,
) -> (String, Sent) {
    use tokio::io::AsyncWriteExt;
    let (mut rx, mut tx) = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap()
        .into_split();
    let reader = tokio::spawn(async move {
        let mut answer = Vec::new();
        let _ = rx.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        answer.lines().next().unwrap_or_default().to_string()
    });
    let chunk = [b"10000\r\n".as_slice(), &[b'x'; 0x10000], b"\r\n"].concat();
    let writes = async {
        tx.write_all(head.as_bytes()).await?;
        for _ in 0..chunks.unwrap_or(usize::MAX) {
            tx.write_all(&chunk).await?;
        }
        tx.write_all(b"0\r\n\r\n").await
    };
    let sent = match tokio::time::timeout(deadline, writes).await {
        Ok(Ok(())) => Sent::All,
        Ok(Err(_)) => Sent::Cut,
        Err(_) => Sent::Deadline,
    };
    // The answer is complete once the gateway closes or, on a kept
    // connection, once this side stops reading: end both.
    let _ = tx.shutdown().await;
    drop(tx);
    let line = tokio::time::timeout(Duration::from_secs(10), reader).await;
    (line.map(|l| l.unwrap()).unwrap_or_default(), sent)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_body_is_read_to_its_end_or_for_at_most_5_s() {
    let b = FakeBackend::start().await;
    let dir = crate::support::gateway::temp_dir();
    let keys = dir.join("keys");
    std::fs::write(&keys, "client-key-1\n").unwrap();
    let gw = Gateway::start(&format!(
        "  max_request_body_bytes: 1048576\n  auth: {{api_keys_file: \"{}\"}}\n{}",
        keys.display(),
        one_model("m", &[b.addr])
    ))
    .await;
    let head = |auth: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n{auth}\
             Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
    };
    let deadline = Duration::from_secs(60);
    // Without a valid key (401: the body is never looked at) and with one,
    // over the body limit (413).
    for (auth, status) in [
        ("", "401"),
        ("Authorization: Bearer client-key-1\r\n", "413"),
    ] {
        // 32 MiB, sent whole before the client would read (as curl -T
        // does): every byte is taken, and the answer is there to read.
        let (line, sent) = send_body(gw.addr, head(auth), Some(512), deadline).await;
        assert_eq!(sent, Sent::All, "{status}: {line:?}");
        assert!(line.contains(status), "{status}: {line:?}");
        // A body without end: answered, then cut off after 5 s, long before
        // the deadline.
        let (line, sent) = send_body(gw.addr, head(auth), None, deadline).await;
        assert_eq!(sent, Sent::Cut, "{status}: {line:?}");
        assert!(line.contains(status), "{status}: {line:?}");
    }
    assert_eq!(b.count(), 0);
}
