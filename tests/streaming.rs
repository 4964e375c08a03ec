//! Server-sent events pass through as they are produced.

use std::time::{Duration, Instant};

use crate::support::gateway::one_model;
use crate::support::{client, FakeBackend, Gateway, Reply};

#[tokio::test(flavor = "multi_thread")]
async fn sse_events_reach_the_client_one_by_one() {
    let b = FakeBackend::start().await;
    let events: Vec<String> = (0..4)
        .map(|i| format!(r#"{{"choices":[{{"delta":{{"content":"t{i}"}}}}]}}"#))
        .collect();
    b.set_reply(Reply::sse(events.clone(), Duration::from_millis(200)));
    let gw = Gateway::start(&one_model("m", &[b.addr])).await;
    let mut resp = client()
        .post(gw.url("/v1/chat/completions"))
        .body(crate::support::chat_body("m", "stream please"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut text = String::new();
    let mut first_arrival = None;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        first_arrival.get_or_insert(Instant::now());
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let sent = b.sent_at();
    // The first event was in the client's hands before the backend wrote the
    // last one: nothing held the stream back.
    assert!(first_arrival.unwrap() < sent[sent.len() - 1]);
    let expected: String = events
        .iter()
        .map(|e| format!("data: {e}\n\n"))
        .collect::<String>()
        + "data: [DONE]\n\n";
    assert_eq!(text, expected);
}
