//! A request's span: what goes on it, by the OpenTelemetry semantic
//! conventions (HTTP server, GenAI) where they name it, `poimen.*` for what
//! only the gateway knows.

use std::time::Duration;

use opentelemetry::propagation::{Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue, StringValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::Span;

use crate::accounting::Usage;
use crate::api::Api;
use crate::errors::ApiError;

/// The semantic conventions' names: HTTP's (stable), error's (stable),
/// GenAI's (in development; kept by the semantic-conventions-genai
/// project, whose Rust constants are not published).
mod semconv {
    pub const HTTP_REQUEST_METHOD: &str = "http.request.method";
    pub const HTTP_ROUTE: &str = "http.route";
    pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
    pub const ERROR_TYPE: &str = "error.type";
    pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
    pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
    pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
    pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
    pub const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
    /// Every prompt token, those read from the cache included.
    pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    pub const GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
}

/// The backend a request went to (the metrics' `backend` label).
pub const BACKEND: &str = "poimen.backend";
/// How it was routed (`X-Poimen-Route`).
pub const ROUTE: &str = "poimen.route";
/// Upstream attempts: connections tried, retries and reconnects included.
pub const ATTEMPTS: &str = "poimen.attempts";
pub const TENANT: &str = "poimen.tenant";
/// The routing key, hashed: never the key itself.
pub const CACHE_KEY_HASH: &str = "poimen.cache_key.hash";
/// `header` (`X-Poimen-Cache-Key`) or `derived` (from the prompt's head).
pub const CACHE_KEY_SOURCE: &str = "poimen.cache_key.source";
/// Seconds in the admission queue, over every attempt.
pub const QUEUE_DURATION: &str = "poimen.queue.duration";
/// Seconds to the first response body byte.
pub const TIME_TO_FIRST_BYTE: &str = "poimen.time_to_first_byte";
pub const RECONNECT: &str = "poimen.reconnect";
pub const EXCLUDED_FOR: &str = "poimen.excluded_for";
pub const REASON: &str = "poimen.reason";

/// One request's span, from its header to its end.
pub struct RequestSpan {
    span: Span,
    /// `GET` or `POST`, the only methods of a traced route.
    method: &'static str,
    attempts: i64,
    /// Why the gateway refused or failed it, if it did.
    error: Option<&'static str>,
}

/// What a request came to, read when it ends.
pub struct Outcome<'a> {
    /// The route it matched: its path, with a stored response's id as
    /// `{id}`.
    pub route: &'a str,
    /// 0: no response was sent (the client left).
    pub status: u16,
    pub api: Option<Api>,
    pub model: Option<&'a str>,
    /// The name the client asked for, when an alias of `model`.
    pub asked_model: Option<&'a str>,
    pub tenant: Option<StringValue>,
    /// Where it went: the backend's label and the route's name.
    pub backend: Option<&'a str>,
    pub routed_by: Option<&'static str>,
    /// The key it was routed by: the header's value, or a derived key
    /// (already a hash).
    pub header_key: Option<&'a [u8]>,
    pub derived_key: Option<&'a str>,
    pub usage: Usage,
    pub response_id: Option<&'a str>,
    pub queued: Option<Duration>,
    pub first_byte: Option<Duration>,
    /// The proxy's error, when it failed without a refusal of the gateway
    /// (e.g. `ConnectRefused`).
    pub proxy_error: Option<&'static str>,
}

impl RequestSpan {
    pub(super) fn new(span: Span, method: &'static str) -> Self {
        RequestSpan {
            span,
            method,
            attempts: 0,
            error: None,
        }
    }

    /// Whether it is sampled: only then is anything but its context kept.
    pub fn is_recording(&self) -> bool {
        self.span.is_recording()
    }

    /// Write its context as W3C trace context headers (`traceparent`, and
    /// `tracestate` if any) into `headers`: the request upstream.
    pub fn inject(&self, headers: &mut dyn Injector) {
        let context = Context::new().with_remote_span_context(self.span.span_context().clone());
        TraceContextPropagator::new().inject_context(&context, headers);
    }

    /// A connection to a backend is being tried.
    pub fn attempt(&mut self) {
        self.attempts += 1;
    }

    /// An attempt on `backend` failed with `error` and the request goes
    /// on: to another backend, or (`reconnect`) to the same one on a new
    /// connection.
    pub fn retry(&mut self, backend: std::net::SocketAddr, error: &str, reconnect: bool) {
        if self.is_recording() {
            let attributes = vec![
                KeyValue::new(BACKEND, backend.to_string()),
                KeyValue::new(semconv::ERROR_TYPE, error.to_string()),
                KeyValue::new(RECONNECT, reconnect),
            ];
            self.span.add_event("retry", attributes);
        }
    }

    /// `backend` failed this request and is left out of routing for
    /// `window`.
    pub fn excluded(&mut self, backend: std::net::SocketAddr, window: Duration) {
        if self.is_recording() {
            let attributes = vec![
                KeyValue::new(BACKEND, backend.to_string()),
                KeyValue::new(EXCLUDED_FOR, window.as_secs_f64()),
            ];
            self.span.add_event("backend_excluded", attributes);
        }
    }

    /// The gateway answered `error` itself: a refusal by admission or a
    /// budget is an event too.
    pub fn refused(&mut self, error: &ApiError) {
        let code = error.code();
        self.error = Some(code);
        let event = match error {
            ApiError::QueueFull { .. } | ApiError::QueueTimeout { .. } => "queue_refused",
            ApiError::OverBudget { .. } => "budget_refused",
            _ => return,
        };
        if self.is_recording() {
            let attributes = vec![KeyValue::new(REASON, code)];
            self.span.add_event(event, attributes);
        }
    }

    /// Name it, set what the request came to, and end it.
    pub fn finish(mut self, o: Outcome<'_>) {
        if !self.is_recording() {
            return;
        }
        let described = o.api.map(Api::describe);
        let operation = described.and_then(|d| d.operation);
        let name = match (operation, o.asked_model.or(o.model)) {
            (Some(op), Some(model)) => format!("{op} {model}"),
            _ => format!("{} {}", self.method, o.route),
        };
        self.span.update_name(name);
        let mut a = Vec::with_capacity(20);
        a.push(KeyValue::new(semconv::HTTP_REQUEST_METHOD, self.method));
        a.push(KeyValue::new(semconv::HTTP_ROUTE, o.route.to_string()));
        if o.status != 0 {
            a.push(KeyValue::new(
                semconv::HTTP_RESPONSE_STATUS_CODE,
                i64::from(o.status),
            ));
        }
        if let (Some(op), Some(d)) = (operation, described) {
            a.push(KeyValue::new(semconv::GEN_AI_OPERATION_NAME, op));
            a.push(KeyValue::new(semconv::GEN_AI_PROVIDER_NAME, d.provider));
        }
        // Values are moved to the exporting thread: static or shared where
        // they can be, copied where they cannot.
        let text = |key: &'static str, value: Option<&str>| {
            value.map(|v| KeyValue::new(key, v.to_string()))
        };
        let word =
            |key: &'static str, value: Option<&'static str>| value.map(|v| KeyValue::new(key, v));
        let seconds =
            |key: &'static str, d: Option<Duration>| d.map(|d| KeyValue::new(key, d.as_secs_f64()));
        let tokens = |key: &'static str, n: Option<u64>| {
            n.map(|n| KeyValue::new(key, i64::try_from(n).unwrap_or(i64::MAX)))
        };
        let key = match (o.header_key, o.derived_key) {
            (Some(k), _) => Some((hash(k), "header")),
            (None, Some(k)) => Some((k.to_string(), "derived")),
            (None, None) => None,
        };
        if let Some((hash, source)) = key {
            a.push(KeyValue::new(CACHE_KEY_HASH, hash));
            a.push(KeyValue::new(CACHE_KEY_SOURCE, source));
        }
        let u = o.usage;
        a.extend(
            [
                // An alias is what was asked for; the served model answered.
                text(semconv::GEN_AI_REQUEST_MODEL, o.asked_model.or(o.model)),
                text(semconv::GEN_AI_RESPONSE_MODEL, o.asked_model.and(o.model)),
                text(semconv::GEN_AI_RESPONSE_ID, o.response_id),
                o.tenant.map(|t| KeyValue::new(TENANT, t)),
                text(BACKEND, o.backend),
                word(ROUTE, o.routed_by),
                tokens(semconv::GEN_AI_USAGE_INPUT_TOKENS, u.prompt_tokens),
                tokens(semconv::GEN_AI_USAGE_OUTPUT_TOKENS, u.completion_tokens),
                tokens(
                    semconv::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                    u.cached_tokens,
                ),
                seconds(QUEUE_DURATION, o.queued),
                seconds(TIME_TO_FIRST_BYTE, o.first_byte),
            ]
            .into_iter()
            .flatten(),
        );
        if self.attempts > 0 {
            a.push(KeyValue::new(ATTEMPTS, self.attempts));
        }
        // The gateway's own word first; else the proxy's; else the status
        // of a server error.
        let error: Option<StringValue> = match self.error.or(o.proxy_error) {
            Some(word) => Some(word.into()),
            None => (o.status >= 500).then(|| o.status.to_string().into()),
        };
        if o.status >= 500 {
            let why = error.as_ref().map_or("", StringValue::as_str);
            self.span.set_status(Status::error(why.to_string()));
        }
        if let Some(error) = error {
            a.push(KeyValue::new(semconv::ERROR_TYPE, error));
        }
        self.span.set_attributes(a);
        self.span.end();
    }
}

/// A header key as 16 hex digits of its 64-bit XXH3 (seed 0): enough to
/// tell keys apart in traces, never the key.
fn hash(key: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(key))
}
