//! Request bodies: read whole to find the model, forwarded byte-identical;
//! every client error OpenAI-shaped with the right status.

use crate::support::gateway::one_model;
use crate::support::{client, get, FakeBackend, Gateway};

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
        let seen = b.seen().pop().unwrap();
        assert_eq!(seen.body.len(), body.len(), "size {size}");
        assert!(seen.body == body, "body changed on the way, size {size}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn chunked_bodies_are_forwarded_up_to_the_retry_buffer() {
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let send = |body: Vec<u8>| {
        // A stream body has no length: reqwest sends it chunked.
        let stream = futures::stream::iter(
            body.chunks(1000)
                .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
                .collect::<Vec<_>>(),
        );
        client()
            .post(gw.url("/v1/chat/completions"))
            .body(reqwest::Body::wrap_stream(stream))
            .send()
    };
    let small = big_body("m", 5000);
    let resp = send(small.clone()).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(b.seen().pop().unwrap().body == small);
    let resp = send(big_body("m", 100_000)).await.unwrap();
    let v = assert_error(resp, 413, "body_too_large").await;
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Content-Length"));
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
