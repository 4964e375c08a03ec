//! The Pingora glue: `Gateway` implements `ProxyHttp` and reads as a table of
//! contents. Decisions are made by the plain modules (`api`, `body`,
//! `routing`, `admission`, `tenants`, `accounting`, `failover`); this file
//! wires them into Pingora's phases:
//!
//! - `request_filter`: answer local endpoints; authenticate and name the
//!   tenant; read the body and find the model (`prepare.rs`, or, for a
//!   stored response, its owner: `stored.rs`); check the tenant's budgets
//!   (`tenant.rs`); delay a warmup; route and take a slot (`admit.rs`);
//! - `upstream_peer`: return the chosen backend (on a retry: the next one,
//!   and the slot moves with it);
//! - `upstream_request_filter`: strip and add the gateway's headers (with
//!   load feedback: ask for the backend's load report); frame the body by
//!   its length;
//! - `request_body_filter`: emit the body read in `request_filter`;
//! - `fail_to_connect` / `error_while_proxy`: exclude a failed backend, retry
//!   (`failure.rs`);
//! - `response_filter`: tell the client where the request went and why;
//! - `upstream_response_filter` / `upstream_response_body_filter`: read the
//!   usage (and the load report, and a stored response's id) as the response
//!   passes; when it ends, free the slot and the tenant's place and charge
//!   its tokens;
//! - `fail_to_proxy`: answer errors in the shape of the client's API;
//! - `logging`: the `prefix_cache` log line and the request metrics
//!   (`record.rs`), and the end of the request's span (`trace.rs`: a span
//!   begins in `request_filter`, its context goes upstream in
//!   `upstream_request_filter`, retries and refusals are its events).
//!
//! `build.rs` makes a `Gateway` from a config (and registers its metrics);
//! `headers.rs` holds the whole upstream header policy.

mod admit;
mod body_reader;
mod build;
mod ctx;
mod endpoints;
mod failure;
mod headers;
mod prepare;
mod record;
mod respond;
mod stored;
mod tenant;
mod trace;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use http::HeaderValue;
use log::debug;
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::ErrorType;

use crate::admission::load_report;
use crate::aliases::Aliases;
use crate::auth::{self, jwt::Verifier, Reason};
use crate::catalog::{Catalog, Loader};
use crate::config::GatewayConfig;
use crate::errors::{self, ApiError, Shape};
use crate::failover::{self, Failure};
use crate::metrics;
use crate::pool::ModelPool;
use crate::routing::Owners;
use crate::tenants::Tenants;
use crate::trace::Traces;
pub use build::learn_check;
pub use ctx::RequestCtx;
use ctx::{Attempt, Phase, Routed};
use endpoints::Endpoint;
use respond::{respond, respond_json, Stop};

/// How long the rest of a refused body is read and discarded after the
/// answer; a client that is still sending then is cut off.
const REFUSED_BODY_DRAIN: Duration = Duration::from_secs(5);

pub struct Gateway {
    config: Arc<GatewayConfig>,
    pools: HashMap<String, Arc<ModelPool>>,
    /// Other names clients ask for the models by.
    aliases: Aliases,
    /// The models the learned pools' backends list.
    catalog: Arc<Catalog>,
    /// Loads adapters on demand.
    loader: Loader,
    /// JWT verification, when `auth.jwt` is configured.
    jwt: Option<Verifier>,
    /// Which backend stored each Responses API response, for every model.
    owners: Arc<Owners>,
    /// How backends are asked about a stored response the gateway does not
    /// know.
    lookup: stored::Lookup,
    /// Every tenant's budgets and weight.
    tenants: Tenants,
    /// Request traces, when `tracing` is configured.
    traces: Option<Traces>,
    /// Unix time of start, the `created` of `/v1/models` entries.
    started: u64,
    /// Renders and tokenizes prompts for the models with KV-cache events.
    renders: crate::render::Workers,
}

impl Gateway {
    /// Whether the request's credential is good (or none is required),
    /// and the tenant it names.
    async fn authenticate(&self, req: &RequestHeader) -> Result<Option<Arc<str>>, Reason> {
        let api_keys = self.config.api_keys.as_ref();
        if api_keys.is_none() && self.jwt.is_none() {
            return Ok(None);
        }
        let credential = auth::credential(&req.headers);
        auth::authenticate(api_keys, self.jwt.as_ref(), credential)
            .await
            .map(Some)
    }

    /// Pools in configuration order.
    fn pools_in_order(&self) -> impl Iterator<Item = &Arc<ModelPool>> {
        self.config.models.iter().map(|m| &self.pools[&m.name])
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        // Pingora makes the context once the request header is read.
        RequestCtx {
            started: Instant::now(),
            tenant: None,
            phase: Phase::Local,
            first_byte: None,
            error: None,
            trace: None,
            asked_model: None,
            learned_model: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        // An answer given before the body was read whole (401, 413, ...):
        // Pingora would close the connection with the rest of the body
        // unread, which resets it, and a client still sending (curl -T, any
        // client that writes its whole body before reading) gets a reset
        // instead of the answer. Keep the connection: the rest is read and
        // discarded before the next request, within a bound.
        let downstream = &mut session.downstream_session;
        downstream.set_close_on_response_before_downstream_finish(false);
        downstream.set_total_drain_timeout(Some(REFUSED_BODY_DRAIN));
        // A client may send its next request before it has read this one's
        // answer (HTTP/1.1 pipelining): served in turn. Pingora's default
        // takes those bytes, read while this answer is proxied, for a
        // broken body and fails this request with a 502.
        downstream.set_pipelining_enabled(true);
        let req = session.req_header();
        if !endpoints::plain_target(&req.uri, req.version) {
            let why = "the request target must be a plain path: no scheme or host, no dot segments, no encoded dots or slashes";
            respond(
                session,
                ApiError::BadRequest(why.into()).response(shape(session)),
            )
            .await;
            return Ok(true);
        }
        let endpoint = endpoints::classify(&req.method, req.uri.path());
        if let (Some(traces), Endpoint::Proxy(_) | Endpoint::Stored(_)) = (&self.traces, &endpoint)
        {
            let now = SystemTime::now();
            let started = now.checked_sub(ctx.started.elapsed()).unwrap_or(now);
            ctx.trace = traces
                .begin(started, &req.method, &req.headers)
                .map(Box::new);
        }
        // Before anything is read or queued; `/health` needs no credential.
        let authenticated = match endpoint {
            Endpoint::Health => Ok(None),
            _ => self.authenticate(req).await,
        };
        let tenant = match authenticated {
            Ok(name) => self.tenant_of(req, name),
            Err(reason) => {
                metrics::AUTH_FAILURES
                    .with_label_values(&[reason.as_str()])
                    .inc();
                // The reason only: never the credential.
                debug!(event = "auth_failed", reason = reason.as_str(); "");
                let e = ApiError::Unauthorized(reason);
                ctx.refused(&e);
                respond(session, e.response(shape(session))).await;
                return Ok(true);
            }
        };
        let req = session.req_header();
        let prepared = match endpoint {
            Endpoint::Proxy(api) => self.prepare(session, ctx, api, &tenant).await,
            Endpoint::Stored(id) => self.prepare_stored(session, ctx, id, &tenant).await,
            Endpoint::Health => {
                let pools = self.pools_in_order().map(|p| &**p);
                let (ok, body) = endpoints::health(pools, Instant::now());
                respond_json(session, if ok { 200 } else { 503 }, body).await;
                return Ok(true);
            }
            Endpoint::Models => {
                let configured = self.config.models.iter().filter(|m| !m.learned);
                let learned = self.catalog.list();
                let names = (configured.map(|m| (m.name.as_str(), None)))
                    .chain(learned.iter().map(|(n, p)| (n.as_str(), p.as_deref())));
                respond_json(session, 200, endpoints::models(names, self.started)).await;
                return Ok(true);
            }
            Endpoint::NotFound => {
                let e = ApiError::NotFound {
                    method: req.method.to_string(),
                    path: req.uri.path().to_string(),
                };
                respond(session, e.response(shape(session))).await;
                return Ok(true);
            }
        };
        match prepared {
            Ok(()) => Ok(false),
            Err(Stop::Answer(e)) => {
                ctx.refused(&e);
                respond(session, e.response(shape(session))).await;
                Ok(true)
            }
            Err(Stop::ClientGone(e)) => Err(e),
        }
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        if ctx.routed().is_some_and(|r| r.attempt.failed) {
            self.retry(session, ctx).await?;
        }
        if let Some(span) = &mut ctx.trace {
            span.attempt();
        }
        // `request_filter` proxies a request only once a backend admitted it.
        let attempt = &ctx
            .routed()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "request not routed"))?
            .attempt;
        // The set the backend was chosen in, which knows how to reach it.
        let mut peer = attempt.members.peer(attempt.candidate.addr);
        peer.options.connection_timeout = Some(self.config.connect_timeout);
        // Both the wait for the response header and for each body chunk.
        peer.options.read_timeout = Some(self.config.read_timeout);
        // Response header names go out as Pingora writes them (names are
        // case-insensitive), not as vLLM wrote them: keeping their case
        // costs a second map and copies per header (vendor/pingora-core).
        peer.options.preserve_h1_response_header_case = false;
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let Some(routed) = ctx.routed() else {
            return Ok(());
        };
        let config = &self.config;
        let to = headers::Upstream {
            body_len: routed.body.len(),
            warmup: routed.input.warmup(),
            vllm_priority: config.warmup.vllm_priority,
            tenant_header: config.tenants.header.as_ref(),
            api_key: config.upstream_api_key.as_deref(),
            load_report: config.load_feedback,
        };
        headers::rewrite_upstream(upstream, &to)?;
        trace::inject(ctx, upstream);
        Ok(())
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // The body was read whole before routing: the patched Pingora calls
        // this once per attempt, at the end of the body (see body_reader).
        if let Some(routed) = ctx.routed() {
            *body = Some(if end_of_stream {
                routed.body.clone()
            } else {
                Bytes::new()
            });
        }
        Ok(())
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        let failure = Failure {
            connecting: true,
            upstream: true,
            response_started: false,
            unreachable: true,
            reused_connection: false,
        };
        let retry = self.on_failure(ctx, failure, &e);
        e.set_retry(retry);
        e
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        _session: &mut Session,
        e: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        let failure = Failure {
            connecting: false,
            upstream: e.esource() == &ErrorSource::Upstream,
            response_started: ctx.response_started(),
            unreachable: failover::unreachable(e.etype()),
            reused_connection: client_reused,
        };
        let retry = self.on_failure(ctx, failure, &e);
        e.set_retry(retry);
        e
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let Some(routed) = ctx.routed_mut() else {
            return Ok(());
        };
        routed.attempt.response_started = true;
        if self.config.load_feedback {
            take_load_report(response, &routed.attempt);
        }
        if let Some(tracker) = &mut routed.tracker {
            if tracker.on_header(response.status.as_u16(), &response.headers) {
                // The stream loses a chunk: its length is no longer known.
                response.remove_header(&http::header::CONTENT_LENGTH);
            }
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if session.is_process_shutting_down() {
            // A graceful upgrade is under way: send keep-alive clients to the
            // new process for their next request.
            session.set_keepalive(None);
        }
        if let Some(Routed { attempt: a, .. }) = ctx.routed() {
            if let Some(s) = a.members.series(&a.candidate.addr) {
                response.insert_header("X-Poimen-Backend", s.header.clone())?;
            }
            let route = HeaderValue::from_static(a.candidate.route.as_str());
            response.insert_header("X-Poimen-Route", route)?;
            // With a prefix index: what it expected the backend to hold, to
            // read beside the usage's cached tokens.
            if let Some(n) = a.expected_tokens {
                response.insert_header("X-Poimen-Expected-Cached-Tokens", HeaderValue::from(n))?;
            }
        }
        Ok(())
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<Duration>> {
        if ctx.first_byte.is_none() && body.as_ref().is_some_and(|b| !b.is_empty()) {
            ctx.first_byte = Some(ctx.started.elapsed());
        }
        if let Some(routed) = ctx.routed_mut() {
            routed.on_body(body, end_of_stream);
        }
        if end_of_stream {
            // The backend is done with this sequence: its slot (and its
            // tenant's place) is free now, not after the client has read the
            // last bytes, which may bring its next request.
            ctx.end();
        }
        Ok(None)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        // The backend is done with this request: free its slot before the
        // client hears about it.
        ctx.end();
        let api = ctx
            .error
            .take()
            .or_else(|| errors::from_proxy_error(e.esource(), e.etype()));
        if let Some(api) = &api {
            ctx.refused(api);
        }
        let code = match api {
            // Nothing can be sent once the response has begun.
            Some(api) if !ctx.response_started() => {
                let shape = shape(session);
                respond(session, api.response(shape)).await;
                api.status(shape)
            }
            _ => 0,
        };
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, e: &Error) -> bool {
        // A client that left (or sent garbage) is not a failure of the
        // gateway or a backend: the request metrics count it (499), and an
        // ERROR line would page an operator for it.
        let client = e.esource() == &ErrorSource::Downstream;
        if client {
            debug!("client error: {e}");
        }
        client
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        // Free the slot even if the response never ended cleanly.
        ctx.end();
        record::record(session, ctx);
        trace::finish(session, ctx, e);
    }
}

/// The error shape the client's API expects.
fn shape(session: &Session) -> Shape {
    Shape::of_path(session.req_header().uri.path())
}

/// Load feedback: hand the backend's report to its admission, and keep it
/// from the client (the gateway asked for it; a fleet's load is not the
/// client's business). A missing or malformed report changes nothing.
fn take_load_report(response: &mut ResponseHeader, attempt: &Attempt) {
    let waiting = response
        .headers
        .get(load_report::HEADER)
        .and_then(|v| load_report::waiting(v.as_bytes()));
    response.remove_header(load_report::HEADER);
    let admission = attempt.members.admission(&attempt.candidate.addr);
    if let (Some(waiting), Some(admission)) = (waiting, admission) {
        admission.report(waiting);
    }
}
