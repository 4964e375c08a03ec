//! Server-sent events: a response body fed by a channel, so each event is
//! handed to hyper (and flushed) as soon as the producer sends it, and the
//! producer learns of a client disconnect when hyper drops the body.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::Response;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use serde::Serialize;
use tokio::sync::mpsc;

/// The receiving half, used as the HTTP response body.
#[derive(Debug)]
pub struct SseBody {
    rx: mpsc::Receiver<Bytes>,
}

/// The sending half, owned by the generation task.
#[derive(Debug, Clone)]
pub struct SseSender {
    tx: mpsc::Sender<Bytes>,
}

/// The client is gone; stop generating.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed;

/// A small buffer: a real server does not run far ahead of the socket.
pub fn channel() -> (SseSender, SseBody) {
    let (tx, rx) = mpsc::channel(16);
    (SseSender { tx }, SseBody { rx })
}

/// The streamed answer's head: the SSE content type as vLLM's server
/// (Starlette) sends it, with the charset it adds to text/* types.
pub fn response(body: SseBody) -> Response<crate::common::Body> {
    let mut r = Response::new(body.boxed());
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// Runs `produce` until it ends or the client goes away, whichever is
/// first; true if it ran to its end.
pub async fn until_closed(
    tx: &SseSender,
    produce: impl Future<Output = Result<(), Closed>>,
) -> bool {
    tokio::select! {
        r = produce => r.is_ok(),
        _ = tx.closed() => false,
    }
}

impl SseSender {
    /// Sends `data: <json>\n\n` (OpenAI chat and completions streams).
    pub async fn event<T: Serialize>(&self, value: &T) -> Result<(), Closed> {
        let mut buf = b"data: ".to_vec();
        serde_json::to_writer(&mut buf, value).expect("chunk serializes");
        buf.extend_from_slice(b"\n\n");
        self.send(Bytes::from(buf)).await
    }

    /// Sends `event: <name>\ndata: <json>\n\n` (Responses and Messages
    /// streams name each event; they end without `[DONE]`).
    pub async fn named<T: Serialize>(&self, name: &str, value: &T) -> Result<(), Closed> {
        let mut buf = format!("event: {name}\ndata: ").into_bytes();
        serde_json::to_writer(&mut buf, value).expect("event serializes");
        buf.extend_from_slice(b"\n\n");
        self.send(Bytes::from(buf)).await
    }

    /// Sends the terminating `data: [DONE]\n\n`.
    pub async fn done(&self) -> Result<(), Closed> {
        self.send(Bytes::from_static(b"data: [DONE]\n\n")).await
    }

    /// Resolves when the body (and so the client connection) is dropped.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    async fn send(&self, b: Bytes) -> Result<(), Closed> {
        self.tx.send(b).await.map_err(|_| Closed)
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_are_framed_and_end_with_done() {
        let (tx, body) = channel();
        tokio::spawn(async move {
            tx.event(&serde_json::json!({"a": 1})).await.unwrap();
            tx.done().await.unwrap();
        });
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"data: {\"a\":1}\n\ndata: [DONE]\n\n");
    }

    #[tokio::test]
    async fn named_events_carry_their_name() {
        let (tx, body) = channel();
        tokio::spawn(async move {
            tx.named("message_stop", &serde_json::json!({"type": "message_stop"}))
                .await
                .unwrap();
        });
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(
            &all[..],
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
    }

    #[tokio::test]
    async fn dropping_the_body_is_seen_by_the_sender() {
        let (tx, body) = channel();
        drop(body);
        tx.closed().await;
        assert_eq!(tx.done().await, Err(Closed));
    }
}
