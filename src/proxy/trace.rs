//! The glue of a request's span (`crate::trace`): what the proxy knows at
//! the end of a request, handed to the span as an `Outcome`.

use opentelemetry::propagation::Injector;
use pingora::http::RequestHeader;
use pingora::proxy::Session;
use pingora::Error;

use super::{Phase, RequestCtx};
use crate::api::{self, Api};
use crate::errors::ApiError;
use crate::trace::Outcome;

/// The W3C trace context headers: the client's are replaced by the
/// gateway's span's.
const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// The request's span, as the parent of the backend's spans: its context
/// in the request upstream, in place of the client's.
pub(super) fn inject(ctx: &RequestCtx, upstream: &mut RequestHeader) {
    if let Some(span) = &ctx.trace {
        upstream.remove_header(TRACESTATE);
        span.inject(&mut Upstream(upstream));
    }
}

/// The propagator's writer into the request upstream.
struct Upstream<'a>(&'a mut RequestHeader);

impl Injector for Upstream<'_> {
    fn set(&mut self, key: &str, value: String) {
        let name = match key {
            TRACEPARENT => TRACEPARENT,
            TRACESTATE => TRACESTATE,
            _ => return,
        };
        // The propagator writes only well-formed values; one that is not
        // is not sent.
        let _ = self.0.insert_header(name, value);
    }
}

impl RequestCtx {
    /// The gateway answered `error` itself.
    pub(super) fn refused(&mut self, error: &ApiError) {
        if let Some(span) = &mut self.trace {
            span.refused(error);
        }
    }
}

/// End the request's span, if it has one, with what it came to.
pub(super) fn finish(session: &Session, ctx: &mut RequestCtx, e: Option<&Error>) {
    let Some(span) = ctx.trace.take() else {
        return;
    };
    if !span.is_recording() {
        return;
    }
    let req = session.req_header();
    let path = req.uri.path();
    let route = api::route(&req.method, path);
    let (model, routed) = match &ctx.phase {
        Phase::Local => (None, None),
        Phase::Unserved(pool) => (Some(ctx.model(pool)), None),
        Phase::Routed(r) => (Some(ctx.model(&r.pool)), Some(&**r)),
    };
    let attempt = routed.map(|r| &r.attempt);
    let series = attempt.and_then(|a| a.members.series(&a.candidate.addr));
    let tracker = routed.and_then(|r| r.tracker.as_ref());
    let input = routed.map(|r| &r.input);
    let outcome = Outcome {
        route,
        status: session.response_written().map_or(0, |r| r.status.as_u16()),
        api: Api::of_post(path).filter(|_| req.method == http::Method::POST),
        model,
        asked_model: ctx.asked_model.as_deref(),
        tenant: ctx.tenant.as_ref().map(|t| t.shared_label().into()),
        backend: series.map(|s| s.label.as_str()),
        routed_by: attempt.map(|a| a.candidate.route.as_str()),
        header_key: input.and_then(|i| i.cache_key()).map(|k| k.as_bytes()),
        derived_key: input.and_then(|i| i.derived_key()).map(|k| k.as_str()),
        usage: routed.map(|r| r.usage()).unwrap_or_default(),
        response_id: tracker.and_then(|t| t.response_id()),
        queued: attempt.map(|a| a.queued),
        first_byte: ctx.first_byte,
        proxy_error: e.map(|e| e.etype().as_str()),
    };
    span.finish(outcome);
}
