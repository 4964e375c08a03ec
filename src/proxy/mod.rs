//! The Pingora glue: `Gateway` implements `ProxyHttp` and reads as a table of
//! contents. Decisions are made by the plain modules (`body`, `pool`,
//! `selection`, `admission`); this file wires them into Pingora's phases:
//!
//! - `request_filter`: answer local endpoints; read the body and find the
//!   model; delay a warmup; choose the backend and take a slot on it;
//! - `upstream_peer`: return the chosen backend (on a retry: the next one,
//!   and the slot moves with it);
//! - `upstream_request_filter`: strip and add the gateway's headers (with
//!   load feedback: ask for the backend's load report); frame the body by
//!   its length;
//! - `request_body_filter`: emit the body read in `request_filter`;
//! - `fail_to_connect` / `error_while_proxy`: exclude a failed backend, retry;
//! - `response_filter`: tell the client where the request went and why;
//! - `upstream_response_filter` / `upstream_response_body_filter`: read the
//!   cache accounting (and the load report) as the response passes; free
//!   the slot when it ends;
//! - `fail_to_proxy`: answer errors in OpenAI's shape;
//! - `logging`: the `prefix_cache` log line and the request metrics.

mod admit;
mod body_reader;
mod endpoints;
mod headers;
mod record;
mod respond;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use http::HeaderValue;
use log::{debug, warn};
use pingora::lb::HealthCheckService;
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::ErrorType;

use crate::accounting::Tracker;
use crate::admission::Permit;
use crate::auth::{self, jwt::Verifier, Reason};
use crate::body;
use crate::config::{GatewayConfig, JwksSource};
use crate::discovery::{AtStart, Discovery};
use crate::errors::{self, ApiError};
use crate::load_report;
use crate::metrics;
use crate::pool::{Members, ModelPool, Refresh};
use crate::retry::{self, Decision, Failure};
use crate::routing::prefix::DerivedKey;
use crate::routing::{Affinity, Candidate, Request};
use endpoints::Endpoint;
use respond::{respond, respond_json, Stop};

/// How long the rest of a refused body is read and discarded after the
/// answer; a client that is still sending then is cut off.
const REFUSED_BODY_DRAIN: Duration = Duration::from_secs(5);

pub struct Gateway {
    config: Arc<GatewayConfig>,
    pools: HashMap<String, Arc<ModelPool>>,
    /// JWT verification, when `auth.jwt` is configured.
    jwt: Option<Verifier>,
    /// Unix time of start, the `created` of `/v1/models` entries.
    started: u64,
}

/// What one request decided, carried across Pingora's phases. Dropped by
/// Pingora at the end of every request, which frees whatever it still holds.
#[derive(Default)]
pub struct RequestCtx {
    started: Option<Instant>,
    pool: Option<Arc<ModelPool>>,
    /// The pool's backend set this request was last routed in: it keeps
    /// the chosen backend's state alive until the request ends, also when
    /// discovery removes the backend meanwhile.
    members: Option<Arc<Members>>,
    cache_key: Option<HeaderValue>,
    /// No header, `keyless: prefix`: the key derived from the body.
    derived_key: Option<DerivedKey>,
    /// Under bounded load, the conversation this request continues, once
    /// looked for.
    conversation: Option<u64>,
    warmup: bool,
    /// The body read in `request_filter` (rewritten if the gateway added
    /// `stream_options`), emitted on every attempt.
    body: Option<Bytes>,
    /// Prefix-cache accounting, for completions.
    tracker: Option<Tracker>,
    /// Time to the first response body byte.
    first_byte: Option<Duration>,
    /// Backends this request already failed on.
    failed: Vec<SocketAddr>,
    /// The current attempt, or the next one once admitted.
    attempt: Option<Attempt>,
    /// An error decided by the gateway, rendered by `fail_to_proxy`.
    error: Option<ApiError>,
}

/// One try at one backend: where, why, and the slot it holds there.
pub struct Attempt {
    candidate: Candidate,
    permit: Option<Permit>,
    state: AttemptState,
    response_started: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttemptState {
    /// Admitted, not yet handed to Pingora.
    Admitted,
    /// Handed to Pingora: connecting or under way.
    Sent,
    /// Its pooled connection was closed: connect again, same slot.
    Reconnect,
    /// Its backend failed: the next attempt goes elsewhere.
    Failed,
}

impl RequestCtx {
    fn affinity(&self) -> Affinity<'_> {
        match (&self.cache_key, &self.derived_key) {
            (Some(k), _) => Affinity::Key(k.as_bytes()),
            (None, Some(d)) => Affinity::Derived(d.as_bytes()),
            (None, None) => Affinity::None,
        }
    }

    fn routing_request(&self, moved_to: Option<SocketAddr>) -> Request<'_> {
        Request {
            affinity: self.affinity(),
            warmup: self.warmup,
            tried: &self.failed,
            moved_to,
        }
    }

    /// The conversation this request continues (bounded load), found the
    /// first time it is needed: it scans the body, so only once some
    /// conversation has moved or this one moves.
    fn conversation(&mut self, pool: &ModelPool, path: &str) -> Option<u64> {
        if self.conversation.is_none() && !self.warmup {
            let found = self
                .affinity()
                .key()
                .zip(self.body.as_deref())
                .and_then(|(key, body)| pool.policy.conversation(key, path, body));
            self.conversation = found;
        }
        self.conversation
    }

    fn response_started(&self) -> bool {
        self.attempt.as_ref().is_some_and(|a| a.response_started)
    }

    /// The backend is done with this request: free its slot.
    fn release_slot(&mut self) {
        if let Some(a) = &mut self.attempt {
            a.permit = None;
        }
    }
}

impl Gateway {
    /// The gateway over the backends resolved at start, and the
    /// health-check services to run beside it. `jwt` verifies tokens when
    /// `config.jwt` is set (its keys already loaded).
    pub fn new(
        config: GatewayConfig,
        jwt: Option<Verifier>,
        resolved: AtStart,
    ) -> (Self, Vec<(String, HealthCheckService)>) {
        let mut services = Vec::new();
        let mut pools = HashMap::new();
        for (m, (_, entries)) in config.models.iter().zip(resolved.models) {
            let discovery = Discovery::new(&m.name, &config.discovery, entries);
            let (pool, health) = ModelPool::new(
                m,
                discovery,
                config.failure_exclusion,
                config.health_check.as_ref(),
                config.upstream_ca_file.as_deref(),
            );
            services.extend(health.map(|h| (format!("health check {}", m.name), h)));
            pools.insert(m.name.clone(), Arc::new(pool));
        }
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let readings = |read: fn(&ModelPool) -> metrics::Reading, bounded_only: bool| {
            pools
                .values()
                .filter(|p| !bounded_only || p.policy.balance_factor.is_some())
                .map(|p| (p.name.clone(), read(p)))
                .collect()
        };
        metrics::register_exclusions(readings(ModelPool::exclusion_reading, false));
        metrics::register_slot_limits(readings(ModelPool::slot_limit_reading, false));
        metrics::register_moves(readings(ModelPool::moved_reading, true));
        if config.api_keys.is_some() || jwt.is_some() {
            let fetched = config
                .jwt
                .as_ref()
                .is_some_and(|j| matches!(j.jwks, JwksSource::Url { .. }));
            metrics::init_auth(fetched);
        }
        let gateway = Gateway {
            config: Arc::new(config),
            pools,
            jwt,
            started,
        };
        (gateway, services)
    }

    /// Whether the request's credential is good (or none is required).
    async fn authenticate(&self, req: &RequestHeader) -> Result<(), Reason> {
        let api_keys = self.config.api_keys.as_ref();
        if api_keys.is_none() && self.jwt.is_none() {
            return Ok(());
        }
        let authorization = req.headers.get(http::header::AUTHORIZATION);
        auth::authenticate(
            api_keys,
            self.jwt.as_ref(),
            authorization.map(|v| v.as_bytes()),
        )
        .await
    }

    /// The service that re-resolves the models' DNS names, if any has one.
    pub fn refresh_service(&self) -> Option<Refresh> {
        let pools: Vec<Arc<ModelPool>> = self
            .config
            .models
            .iter()
            .filter(|m| m.uses_names())
            .map(|m| self.pools[&m.name].clone())
            .collect();
        (!pools.is_empty()).then(|| Refresh {
            pools,
            every: self.config.discovery.refresh,
        })
    }

    /// Pools in configuration order.
    fn pools_in_order(&self) -> impl Iterator<Item = &ModelPool> {
        self.config.models.iter().map(|m| &*self.pools[&m.name])
    }

    /// Read the body, resolve the model, delay a warmup, take a slot.
    async fn prepare(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<(), Stop> {
        ctx.cache_key = headers::cache_key(session.req_header())?;
        ctx.warmup = headers::is_warmup(session.req_header());
        let raw = body_reader::read_whole(session, self.config.max_request_body_bytes).await?;
        let facts = body::inspect(&raw).map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let pool = self
            .pools
            .get(facts.model.as_ref())
            .ok_or_else(|| ApiError::UnknownModel(facts.model.to_string()))?;
        ctx.pool = Some(pool.clone());
        if ctx.cache_key.is_none() {
            let path = session.req_header().uri.path();
            ctx.derived_key = pool.policy.derived_key(path, &raw);
        }
        let completion = headers::is_completion(session.req_header());
        // A stream whose client did not ask for usage: ask for it, and hide
        // the extra chunk from the client.
        let add_usage =
            completion && self.config.stream_usage && facts.stream && !facts.stream_options;
        if completion {
            ctx.tracker = Some(Tracker::new(add_usage));
        }
        ctx.body = Some(if add_usage {
            body::with_stream_usage(&raw).into()
        } else {
            raw
        });
        if ctx.warmup {
            self.warmup_delay(session).await?;
        }
        self.admit(session, ctx).await
    }

    /// Act on a failed attempt as the retry policy decides; true to retry.
    fn on_failure(&self, ctx: &mut RequestCtx, failure: Failure, e: &Error) -> bool {
        let decision = retry::decide(&failure);
        let Some(attempt) = &mut ctx.attempt else {
            return false;
        };
        match decision {
            Decision::GiveUp => false,
            Decision::Reconnect => {
                attempt.state = AttemptState::Reconnect;
                true
            }
            Decision::ExcludeAndRetry => {
                attempt.state = AttemptState::Failed;
                let addr = attempt.candidate.addr;
                ctx.failed.push(addr);
                self.exclude(ctx, addr, e);
                true
            }
        }
    }

    /// A backend failed before answering: count it, leave it out for the
    /// window, and say why (a refused connection, a certificate that did not
    /// verify, ...).
    fn exclude(&self, ctx: &RequestCtx, addr: SocketAddr, why: &Error) {
        let (Some(pool), Some(members)) = (&ctx.pool, &ctx.members) else {
            return;
        };
        if let Some(series) = members.series(&addr) {
            series.failures.inc();
        }
        if members.exclusions().exclude(addr, Instant::now()) {
            warn!(
                event = "backend_excluded",
                model = pool.name.as_str(),
                backend:display = addr,
                for_secs = self.config.failure_exclusion.as_secs(),
                error = why.etype().as_str(),
                reason:display = why;
                ""
            );
        }
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        ctx.started = Some(Instant::now());
        // An answer given before the body was read whole (401, 413, ...):
        // Pingora would close the connection with the rest of the body
        // unread, which resets it, and a client still sending (curl -T, any
        // client that writes its whole body before reading) gets a reset
        // instead of the answer. Keep the connection: the rest is read and
        // discarded before the next request, within a bound.
        let downstream = &mut session.downstream_session;
        downstream.set_close_on_response_before_downstream_finish(false);
        downstream.set_total_drain_timeout(Some(REFUSED_BODY_DRAIN));
        let req = session.req_header();
        let endpoint = endpoints::classify(&req.method, req.uri.path());
        if endpoint != Endpoint::Health {
            // Before anything is read or queued.
            if let Err(reason) = self.authenticate(req).await {
                metrics::AUTH_FAILURES
                    .with_label_values(&[reason.as_str()])
                    .inc();
                // The reason only: never the credential.
                debug!(event = "auth_failed", reason = reason.as_str(); "");
                respond(session, ApiError::Unauthorized(reason).response()).await;
                return Ok(true);
            }
        }
        let req = session.req_header();
        match endpoint {
            Endpoint::Proxy => {}
            Endpoint::Health => {
                let (ok, body) = endpoints::health(self.pools_in_order(), Instant::now());
                respond_json(session, if ok { 200 } else { 503 }, body).await;
                return Ok(true);
            }
            Endpoint::Models => {
                let names = self.config.models.iter().map(|m| m.name.as_str());
                respond_json(session, 200, endpoints::models(names, self.started)).await;
                return Ok(true);
            }
            Endpoint::NotFound => {
                let e = ApiError::NotFound {
                    method: req.method.to_string(),
                    path: req.uri.path().to_string(),
                };
                respond(session, e.response()).await;
                return Ok(true);
            }
        }
        match self.prepare(session, ctx).await {
            Ok(()) => Ok(false),
            Err(Stop::Answer(e)) => {
                respond(session, e.response()).await;
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
        if ctx
            .attempt
            .as_ref()
            .is_some_and(|a| a.state == AttemptState::Failed)
        {
            // Free the failed backend's slot, then take one on the next
            // backend in the ranking.
            ctx.attempt = None;
            match self.admit(session, ctx).await {
                Ok(()) => {}
                Err(Stop::ClientGone(e)) => return Err(e),
                Err(Stop::Answer(e)) => {
                    let status = e.status();
                    ctx.error = Some(e);
                    return Err(Error::explain(
                        ErrorType::HTTPStatus(status),
                        "no backend left to retry on",
                    ));
                }
            }
        }
        let attempt = ctx
            .attempt
            .as_mut()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no backend chosen"))?;
        attempt.state = AttemptState::Sent;
        // The set the backend was chosen in, which knows how to reach it.
        let members = ctx
            .members
            .as_ref()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no model chosen"))?;
        let mut peer = members.peer(attempt.candidate.addr);
        peer.options.connection_timeout = Some(self.config.connect_timeout);
        // Both the wait for the response header and for each body chunk.
        peer.options.read_timeout = Some(self.config.read_timeout);
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(body) = &ctx.body {
            // The gateway's copy goes upstream in one piece, whatever the
            // client's framing (chunked) or length (before a rewrite).
            upstream.remove_header(&http::header::TRANSFER_ENCODING);
            upstream.insert_header(http::header::CONTENT_LENGTH, HeaderValue::from(body.len()))?;
        }
        headers::rewrite_upstream(upstream, ctx.warmup, self.config.warmup.vllm_priority)?;
        // The client's credentials are for the gateway, not for vLLM.
        upstream.remove_header(&http::header::AUTHORIZATION);
        if let Some(key) = &self.config.upstream_api_key {
            upstream.insert_header(http::header::AUTHORIZATION, format!("Bearer {key}"))?;
        }
        if self.config.load_feedback {
            // The gateway's own question, in the one format it reads,
            // whatever the client asked.
            upstream.insert_header(load_report::FORMAT_HEADER, "json")?;
        }
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
        if let Some(full) = &ctx.body {
            *body = Some(if end_of_stream {
                full.clone()
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
            unreachable: retry::unreachable(e.etype()),
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
        if let Some(a) = &mut ctx.attempt {
            a.response_started = true;
        }
        if self.config.load_feedback {
            take_load_report(response, ctx);
        }
        if let Some(tracker) = &mut ctx.tracker {
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
        if let Some(a) = &ctx.attempt {
            // The candidate came from these members (`admit`).
            let members = ctx.members.as_ref();
            if let Some(s) = members.and_then(|m| m.series(&a.candidate.addr)) {
                response.insert_header("X-Poimen-Backend", s.header.clone())?;
            }
            let route = HeaderValue::from_static(a.candidate.route.as_str());
            response.insert_header("X-Poimen-Route", route)?;
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
            ctx.first_byte = ctx.started.map(|t| t.elapsed());
        }
        if let Some(tracker) = &mut ctx.tracker {
            tracker.on_body(body, end_of_stream);
        }
        if end_of_stream {
            // The backend is done with this sequence: its slot is free now,
            // not after the client has read the last bytes.
            ctx.release_slot();
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
        ctx.release_slot();
        let api = ctx
            .error
            .take()
            .or_else(|| errors::from_proxy_error(e.esource(), e.etype()));
        let code = match api {
            // Nothing can be sent once the response has begun.
            Some(api) if !ctx.response_started() => {
                respond(session, api.response()).await;
                api.status()
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

    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        // Free the slot even if the response never ended cleanly.
        ctx.release_slot();
        self.record(session, ctx);
    }
}

/// Load feedback: hand the backend's report to its admission, and keep it
/// from the client (the gateway asked for it; a fleet's load is not the
/// client's business). A missing or malformed report changes nothing.
fn take_load_report(response: &mut ResponseHeader, ctx: &RequestCtx) {
    let waiting = response
        .headers
        .get(load_report::HEADER)
        .and_then(|v| load_report::waiting(v.as_bytes()));
    response.remove_header(load_report::HEADER);
    // The candidate came from these members (`admit`).
    let admission = ctx
        .attempt
        .as_ref()
        .zip(ctx.members.as_ref())
        .and_then(|(a, members)| members.admission(&a.candidate.addr));
    if let (Some(waiting), Some(admission)) = (waiting, admission) {
        admission.report(waiting);
    }
}
