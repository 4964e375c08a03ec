//! Prefix-cache accounting: for each proxied request to an API that reports
//! usage, how many prompt tokens vLLM processed, how many of them it served
//! from its prefix cache, and how many it generated; and, for the Responses
//! API, the response's id (the next turn names it in `previous_response_id`,
//! so it is routed to the backend that stored it).
//!
//! Sources, per response: the `vllm-num-cached-tokens` header (a patched vLLM
//! or a sidecar) wins for cached tokens; otherwise the usage in the JSON body
//! or in the SSE stream, read as [`Dialect`] says. With no usage at all a count
//! is unknown, not zero.

mod dialect;
pub mod scanner;

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;

use crate::logging;

pub use dialect::{Dialect, Usage};
use scanner::{JsonScanner, SseScanner};

pub const CACHED_TOKENS_HEADER: &str = "vllm-num-cached-tokens";

/// How the response body is read.
enum BodyScan {
    /// Not a 2xx JSON or SSE response: nothing to read.
    None,
    Json(JsonScanner),
    Sse(SseScanner),
}

/// One response's accounting, fed by the proxy as the response passes.
pub struct Tracker {
    api: Dialect,
    /// The gateway added `include_usage`: remove the usage-only chunk.
    strip: bool,
    header_cached: Option<u64>,
    body: BodyScan,
    /// The usage, read once the body ended: the proxy asks for it more
    /// than once (the slot's charge, the metrics, the trace).
    ended: Option<Usage>,
}

impl Tracker {
    /// `strip`: the gateway asked for the stream's usage itself (completions
    /// only), so the usage-only chunk is not the client's.
    pub fn new(api: Dialect, strip: bool) -> Self {
        Tracker {
            api,
            strip,
            header_cached: None,
            body: BodyScan::None,
            ended: None,
        }
    }

    /// The response header arrived. Returns true when the body may change
    /// length (the caller must then drop `Content-Length`).
    pub fn on_header(&mut self, status: u16, headers: &HeaderMap) -> bool {
        self.header_cached = headers
            .get(CACHED_TOKENS_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        if !(200..300).contains(&status) {
            return false;
        }
        let content_type = headers
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if content_type.starts_with(b"text/event-stream") {
            let scan = SseScanner::new(self.api, self.strip);
            let strips = scan.strips();
            self.body = BodyScan::Sse(scan);
            strips
        } else if content_type.starts_with(b"application/json") {
            self.body = BodyScan::Json(JsonScanner::new(self.api));
            false
        } else {
            false
        }
    }

    /// A body chunk from the backend, replaced by what the client should get.
    pub fn on_body(&mut self, body: &mut Option<Bytes>, end_of_stream: bool) {
        match &mut self.body {
            BodyScan::None => {}
            BodyScan::Json(scan) => {
                if let Some(b) = body {
                    scan.feed(b);
                }
            }
            BodyScan::Sse(scan) => {
                let mut out = body.take().map(|b| scan.feed(b)).unwrap_or_default();
                if end_of_stream {
                    let rest = scan.finish();
                    if !rest.is_empty() {
                        out = [out, rest].concat().into();
                    }
                }
                *body = Some(out);
            }
        }
        if end_of_stream {
            self.ended = Some(self.read_usage());
        }
    }

    /// What is known once the response is over; the header wins for cached.
    pub fn usage(&self) -> Usage {
        self.ended.unwrap_or_else(|| self.read_usage())
    }

    fn read_usage(&self) -> Usage {
        let body = match &self.body {
            BodyScan::None => None,
            BodyScan::Json(scan) => scan.finish(),
            BodyScan::Sse(scan) => scan.usage(),
        }
        .unwrap_or_default();
        Usage {
            cached_tokens: self.header_cached.or(body.cached_tokens),
            ..body
        }
    }

    /// The Responses API's response id, from the moment the body gave it
    /// (the first bytes of a JSON body, the first event of a stream); ids
    /// over [`scanner::MAX_RESPONSE_ID_BYTES`] are ignored.
    pub fn response_id(&self) -> Option<&str> {
        match &self.body {
            BodyScan::None => None,
            BodyScan::Json(scan) => scan.response_id(),
            BodyScan::Sse(scan) => scan.response_id(),
        }
    }
}

/// cached / prompt (0 when the prompt is empty), when both are known.
pub fn hit_rate(usage: Usage) -> Option<f64> {
    let (cached, prompt) = (usage.cached_tokens?, usage.prompt_tokens?);
    Some(if prompt == 0 {
        0.0
    } else {
        cached as f64 / prompt as f64
    })
}

/// Everything the `prefix_cache` log line says about one completion.
pub struct Record<'a> {
    pub cache_key: Option<&'a str>,
    /// The key derived from the body (`keyless: prefix`), if any.
    pub derived_key: Option<&'a str>,
    pub usage: Usage,
    /// The prompt tokens the prefix index expected the backend to hold.
    pub expected_cached_tokens: Option<u64>,
    /// Who it was for (the tenant's metric label).
    pub tenant: &'a str,
    pub model: &'a str,
    /// The name the client asked for, when an alias of `model`.
    pub asked_model: Option<&'a str>,
    pub backend: &'a str,
    pub route: &'a str,
    pub status: u16,
    pub duration: Duration,
}

impl Record<'_> {
    /// The `prefix_cache` log line: one event, fields in a fixed order.
    pub fn log(&self) {
        logging::event(log::Level::Info, "poimen_gateway::cache", |e| {
            e.field("event", "prefix_cache")
                .field("cache_key", self.cache_key)
                .field("derived_key", self.derived_key)
                .field("cached_tokens", self.usage.cached_tokens)
                .field("expected_cached_tokens", self.expected_cached_tokens)
                .field("total_tokens", self.usage.prompt_tokens)
                .field("hit_rate", hit_rate(self.usage))
                .field("completion_tokens", self.usage.completion_tokens)
                .field("tenant", self.tenant)
                .field("model", self.model)
                .field("asked_model", self.asked_model)
                .field("backend", self.backend)
                .field("route", self.route)
                .field("status", self.status)
                .field("duration_ms", self.duration.as_millis() as u64);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    const JSON: &str = "application/json";
    const SSE: &str = "text/event-stream";
    const USAGE_JSON: &str = r#"{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":64}}}"#;

    /// A tracker that saw a 200 of `content_type` and then `body` whole.
    fn tracked(api: Dialect, strip: bool, content_type: &str, body: &str) -> (Tracker, Bytes) {
        let mut t = Tracker::new(api, strip);
        t.on_header(200, &headers(&[("content-type", content_type)]));
        let mut chunk = Some(Bytes::from(body.to_owned()));
        t.on_body(&mut chunk, true);
        (t, chunk.unwrap())
    }

    #[test]
    fn the_header_wins_over_the_body() {
        let mut t = Tracker::new(Dialect::Completions, false);
        t.on_header(
            200,
            &headers(&[("content-type", JSON), (CACHED_TOKENS_HEADER, "80")]),
        );
        let mut body = Some(Bytes::from(USAGE_JSON));
        t.on_body(&mut body, true);
        assert_eq!(
            t.usage(),
            Usage {
                prompt_tokens: Some(100),
                cached_tokens: Some(80),
                completion_tokens: Some(7),
            }
        );
    }

    #[test]
    fn usage_is_read_from_what_came_until_the_body_ends() {
        let mut t = Tracker::new(Dialect::Completions, false);
        t.on_header(200, &headers(&[("content-type", JSON)]));
        let (head, tail) = USAGE_JSON.split_at(USAGE_JSON.len() - 10);
        t.on_body(&mut Some(Bytes::from(head)), false);
        // The backend stopped mid-body: no usage yet, nothing kept.
        assert_eq!(t.usage(), Usage::default());
        t.on_body(&mut Some(Bytes::from(tail)), false);
        t.on_body(&mut None, true);
        let whole = Usage {
            prompt_tokens: Some(100),
            cached_tokens: Some(64),
            completion_tokens: Some(7),
        };
        assert_eq!(t.usage(), whole);
        assert_eq!(t.ended, Some(whole));
    }

    #[test]
    fn errors_and_unknown_types_are_not_scanned() {
        let mut t = Tracker::new(Dialect::Completions, true);
        assert!(!t.on_header(500, &headers(&[("content-type", JSON)])));
        let mut body = Some(Bytes::from(USAGE_JSON));
        t.on_body(&mut body, true);
        assert_eq!(t.usage(), Usage::default());
        assert_eq!(body.unwrap(), USAGE_JSON, "untouched");
    }

    #[test]
    fn only_a_completions_stream_may_change_length() {
        for (api, strips) in [
            (Dialect::Completions, true),
            (Dialect::Responses, false),
            (Dialect::Messages, false),
        ] {
            let mut t = Tracker::new(api, true);
            assert_eq!(t.on_header(200, &headers(&[("content-type", SSE)])), strips);
            let mut t = Tracker::new(api, false);
            assert!(!t.on_header(200, &headers(&[("content-type", SSE)])));
        }
        let (t, out) = tracked(
            Dialect::Completions,
            true,
            SSE,
            &format!("data: {USAGE_JSON}\n\n"),
        );
        assert!(out.is_empty(), "the usage-only chunk is stripped");
        assert_eq!(t.usage().prompt_tokens, Some(100));
    }

    #[test]
    fn the_response_id_comes_from_a_responses_body_or_stream() {
        let body = r#"{"id":"resp_1","object":"response","output":[{"id":"msg_2"}],"usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":0},"output_tokens":1}}"#;
        let (t, _) = tracked(Dialect::Responses, false, JSON, body);
        assert_eq!(t.response_id(), Some("resp_1"));
        assert_eq!(
            t.usage(),
            Usage {
                prompt_tokens: Some(5),
                cached_tokens: Some(0),
                completion_tokens: Some(1),
            }
        );
        let stream = "event: response.created\ndata: {\"response\":{\"id\":\"resp_3\",\"usage\":null},\"type\":\"response.created\"}\n\n";
        let (t, _) = tracked(Dialect::Responses, true, SSE, stream);
        assert_eq!(t.response_id(), Some("resp_3"));
        // Other APIs' ids are not response ids.
        let (t, _) = tracked(Dialect::Completions, false, JSON, r#"{"id":"chatcmpl-4"}"#);
        assert_eq!(t.response_id(), None);
    }

    #[test]
    fn hit_rate_rules() {
        let u = |p, c| Usage {
            prompt_tokens: p,
            cached_tokens: c,
            completion_tokens: None,
        };
        assert_eq!(hit_rate(u(Some(200), Some(50))), Some(0.25));
        assert_eq!(hit_rate(u(Some(0), Some(0))), Some(0.0));
        assert_eq!(hit_rate(u(None, Some(5))), None);
        assert_eq!(hit_rate(u(Some(5), None)), None);
    }
}
