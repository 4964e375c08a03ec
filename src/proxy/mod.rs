//! The Pingora glue: `Gateway` implements `ProxyHttp` and reads as a table of
//! contents. Decisions are made by the plain modules (`body`, `pool`,
//! `selection`); this file only wires them into Pingora's phases:
//!
//! - `request_filter`: answer local endpoints; read the body, find the model,
//!   choose the backend; keep the decision in the CTX;
//! - `upstream_peer`: return the chosen backend (on a retry: the next one);
//! - `request_body_filter`: emit the body read in `request_filter`;
//! - `fail_to_connect` / `error_while_proxy`: exclude a failed backend, retry;
//! - `response_filter`: tell the client where the request went and why;
//! - `fail_to_proxy`: answer errors in OpenAI's shape.

mod body_reader;
mod endpoints;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use http::HeaderValue;
use log::warn;
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::ErrorType;

use crate::body::model_of;
use crate::config::GatewayConfig;
use crate::errors::{json_header, ApiError};
use crate::pool::{ModelPool, Pick};
use body_reader::ReadError;
use endpoints::Endpoint;

pub const CACHE_KEY_HEADER: &str = "x-poimen-cache-key";

pub struct Gateway {
    config: Arc<GatewayConfig>,
    pools: HashMap<String, Arc<ModelPool>>,
    /// Unix time of start, the `created` of `/v1/models` entries.
    started: u64,
}

/// What one request decided, carried across Pingora's phases.
#[derive(Default)]
pub struct RequestCtx {
    pool: Option<Arc<ModelPool>>,
    cache_key: Option<HeaderValue>,
    /// The body read in `request_filter`, re-emitted on every attempt.
    body: Option<Bytes>,
    /// The backend chosen for the next attempt; taken by `upstream_peer`.
    next: Option<Pick>,
    /// The backend of the current attempt.
    current: Option<Pick>,
    /// Backends this request already failed on.
    tried: Vec<SocketAddr>,
    /// An error decided by the gateway, rendered by `fail_to_proxy`.
    error: Option<ApiError>,
    response_started: bool,
}

impl RequestCtx {
    fn key(&self) -> &[u8] {
        self.cache_key.as_ref().map_or(b"", |v| v.as_bytes())
    }
}

impl Gateway {
    pub fn new(config: GatewayConfig) -> Self {
        let pools = config
            .models
            .iter()
            .map(|m| {
                let pool = ModelPool::new(m, config.failure_exclusion);
                (m.name.clone(), Arc::new(pool))
            })
            .collect();
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Gateway {
            config: Arc::new(config),
            pools,
            started,
        }
    }

    /// Pools in configuration order.
    fn pools_in_order(&self) -> impl Iterator<Item = &ModelPool> {
        self.config.models.iter().map(|m| &*self.pools[&m.name])
    }

    /// Read the body, resolve the model and choose the first backend.
    async fn route(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<(), ReadError> {
        let api = ReadError::Api;
        ctx.cache_key = cache_key(session.req_header()).map_err(api)?;
        let body = body_reader::read_whole(session, self.config.max_request_body_bytes).await?;
        let model = model_of(&body).map_err(|e| api(ApiError::BadRequest(e.to_string())))?;
        let pool = self
            .pools
            .get(model.as_ref())
            .ok_or_else(|| api(ApiError::UnknownModel(model.to_string())))?
            .clone();
        let pick = pool
            .pick(ctx.key(), &[], Instant::now())
            .map_err(|retry_after| {
                api(ApiError::NoBackend {
                    model: pool.name.clone(),
                    retry_after,
                })
            })?;
        ctx.next = Some(pick);
        ctx.pool = Some(pool);
        ctx.body = Some(body);
        Ok(())
    }

    /// A backend failed before answering: leave it out for the window.
    fn exclude(&self, ctx: &RequestCtx, why: &Error) {
        let (Some(pool), Some(pick)) = (&ctx.pool, &ctx.current) else {
            return;
        };
        if pool.exclude(pick.addr, Instant::now()) {
            warn!(
                "{}",
                serde_json::json!({
                    "event": "backend_excluded",
                    "model": pool.name,
                    "backend": pick.addr.to_string(),
                    "for_secs": self.config.failure_exclusion.as_secs(),
                    "error": why.etype().as_str(),
                })
            );
        }
    }
}

/// The `X-Poimen-Cache-Key`, if present and non-empty. Two different values
/// cannot both be honoured, so they are refused.
fn cache_key(req: &RequestHeader) -> Result<Option<HeaderValue>, ApiError> {
    let mut values = req.headers.get_all(CACHE_KEY_HEADER).iter();
    let first = values.next().filter(|v| !v.is_empty()).cloned();
    if values.any(|v| Some(v) != first.as_ref()) {
        return Err(ApiError::BadRequest(
            "X-Poimen-Cache-Key was given more than once with different values".into(),
        ));
    }
    Ok(first)
}

/// Connection-level failures before a response: the backend is down or
/// unreachable, not merely slow.
fn backend_unreachable(e: &Error) -> bool {
    use ErrorType::*;
    matches!(
        e.etype(),
        ConnectTimedout
            | ConnectRefused
            | ConnectNoRoute
            | ConnectError
            | BindError
            | SocketError
            | ConnectionClosed
            | ReadError
            | WriteError
    )
}

async fn respond(session: &mut Session, (header, body): (ResponseHeader, Bytes)) {
    // A client that is gone cannot be answered; nothing else to do.
    if session
        .write_response_header(Box::new(header), false)
        .await
        .is_ok()
    {
        let _ = session.write_response_body(Some(body), true).await;
    }
}

async fn respond_json(session: &mut Session, status: u16, value: serde_json::Value) {
    let body = Bytes::from(value.to_string());
    respond(session, (json_header(status, body.len()), body)).await;
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let req = session.req_header();
        match endpoints::classify(&req.method, req.uri.path()) {
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
        match self.route(session, ctx).await {
            Ok(()) => Ok(false),
            Err(ReadError::Api(e)) => {
                respond(session, e.response()).await;
                Ok(true)
            }
            Err(ReadError::Downstream(e)) => Err(e),
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let pool = ctx
            .pool
            .clone()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no model chosen"))?;
        let pick = match ctx.next.take() {
            Some(pick) => pick,
            None => match pool.pick(ctx.key(), &ctx.tried, Instant::now()) {
                Ok(pick) => pick,
                Err(retry_after) => {
                    ctx.error = Some(ApiError::NoBackend {
                        model: pool.name.clone(),
                        retry_after,
                    });
                    return Err(Error::explain(
                        ErrorType::HTTPStatus(503),
                        "every backend of the model failed or is excluded",
                    ));
                }
            },
        };
        ctx.tried.push(pick.addr);
        let mut peer = HttpPeer::new(pick.addr, false, String::new());
        peer.options.connection_timeout = Some(self.config.connect_timeout);
        ctx.current = Some(pick);
        Ok(Box::new(peer))
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // Pingora replays its (tail-only) retry buffer here once per attempt;
        // send the whole body instead.
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
        self.exclude(ctx, &e);
        e.set_retry(true);
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
        if ctx.response_started || !backend_unreachable(&e) {
            // Part of the answer may have reached the client, or the backend
            // answered badly: a retry could duplicate or hide it.
            e.set_retry(false);
        } else if client_reused {
            // A pooled connection the backend had closed: not a failure of
            // the backend; try it again on a fresh connection.
            ctx.next = ctx.current.clone();
            ctx.tried.pop();
            e.set_retry(true);
        } else {
            self.exclude(ctx, &e);
            e.set_retry(true);
        }
        e
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        _upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.response_started = true;
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(pick) = &ctx.current {
            response.insert_header("X-Poimen-Backend", pick.addr.to_string())?;
            response.insert_header("X-Poimen-Route", pick.route.as_str())?;
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let api = ctx.error.take().or_else(|| match e.esource() {
            ErrorSource::Downstream => None,
            _ => Some(match e.etype() {
                ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
                    ApiError::GatewayTimeout
                }
                _ => ApiError::BadGateway(e.etype().as_str().to_string()),
            }),
        });
        let code = match api {
            // Nothing can be sent once the response has begun.
            Some(api) if !ctx.response_started => {
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
}
