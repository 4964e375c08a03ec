//! HTTP routing and the small endpoints (health, models, metrics, sim
//! controls), plus the response helpers and the fault gate they share.
//! The generation endpoints live in `completions` (chat, completions),
//! `responses` and `messages`; `/tokenize` in `tokenizer_routes`.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde::Serialize;

use crate::app::App;
use crate::completions::{self, Kind};
use crate::config::FaultMode;
use crate::faults::FaultRequest;
use crate::shapes::{ErrorBody, ErrorInfo, ModelCard, ModelList};
use crate::{messages, responses, tokenizer_routes};

pub type Body = BoxBody<Bytes, Infallible>;

/// Entry point for every request; never fails at the HTTP level.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let wants_load = req
        .headers()
        .get("endpoint-load-metrics-format")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"json"));
    let path = req.uri().path().to_owned();
    let mut resp = match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => match fault_gate(&app).await {
            Err(e) => e.into_response(),
            Ok(()) => empty(StatusCode::OK),
        },
        (&Method::GET, "/v1/models") => match fault_gate(&app).await {
            Err(e) => e.into_response(),
            Ok(()) => models(&app),
        },
        (&Method::POST, "/v1/chat/completions") => completions::handle(&app, Kind::Chat, req).await,
        (&Method::POST, "/v1/completions") => completions::handle(&app, Kind::Text, req).await,
        (&Method::POST, "/v1/responses") => responses::create(&app, req).await,
        (&Method::POST, "/v1/messages") => messages::create(&app, req).await,
        (&Method::POST, "/v1/messages/count_tokens") => messages::count_tokens(&app, req).await,
        (&Method::POST, "/tokenize") => tokenizer_routes::tokenize(&app, req).await,
        (&Method::POST, "/detokenize") => tokenizer_routes::detokenize(&app, req).await,
        (m, p) if p.starts_with(RESPONSES) => response_by_id(&app, m, &p[RESPONSES.len()..]).await,
        (&Method::GET, "/metrics") => text(app.metrics.prometheus(&app.model, app.gauges())),
        (&Method::GET, "/sim/stats") => {
            let fault = app.faults.current().mode.as_str();
            json(StatusCode::OK, &app.metrics.stats(app.gauges(), fault))
        }
        (&Method::POST, "/sim/fault") => set_fault(&app, req).await,
        (_, "/health" | "/v1/models" | "/v1/chat/completions" | "/v1/completions" | "/metrics")
        | (_, "/v1/responses" | "/v1/messages" | "/v1/messages/count_tokens")
        | (_, "/tokenize" | "/detokenize")
        | (_, "/sim/stats" | "/sim/fault") => method_not_allowed(),
        _ => not_found(),
    };
    if wants_load && !path.starts_with("/sim/") && path != "/metrics" {
        add_load_header(&app, &mut resp);
    }
    Ok(resp)
}

const RESPONSES: &str = "/v1/responses/";

/// `/v1/responses/{id}` (GET) and `/v1/responses/{id}/cancel` (POST); what
/// else FastAPI would answer for paths under `/v1/responses/`.
async fn response_by_id(app: &App, method: &Method, rest: &str) -> Response<Body> {
    match (method, rest.split_once('/')) {
        (&Method::GET, None) => responses::retrieve(app, rest).await,
        (&Method::POST, Some((id, "cancel"))) => responses::cancel(app, id).await,
        (_, None) | (_, Some((_, "cancel"))) => method_not_allowed(),
        _ => not_found(),
    }
}

fn method_not_allowed() -> Response<Body> {
    json(
        StatusCode::METHOD_NOT_ALLOWED,
        &serde_json::json!({"detail": "Method Not Allowed"}),
    )
}

fn not_found() -> Response<Body> {
    json(
        StatusCode::NOT_FOUND,
        &serde_json::json!({"detail": "Not Found"}),
    )
}

/// Applies `hang` and `error` to API endpoints: the error to answer with
/// (each API gives it its own shape), never returns under hang, `Ok` to go
/// on normally.
pub async fn fault_gate(app: &App) -> Result<(), ApiError> {
    match app.faults.current().mode {
        FaultMode::Error => Err(ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "InternalServerError",
            param: None,
            message: "Simulated engine failure (fault mode 'error').".into(),
        }),
        FaultMode::Hang => {
            // hyper drops this future when the client disconnects, which
            // drops the guard and ends the task.
            let _hanging = HangGuard::new(app);
            std::future::pending::<()>().await;
            unreachable!("pending never resolves")
        }
        FaultMode::None | FaultMode::Slow | FaultMode::Refuse => Ok(()),
    }
}

/// Counts a request held by the `hang` fault (visible in /sim/stats).
struct HangGuard<'a>(&'a App);

impl<'a> HangGuard<'a> {
    fn new(app: &'a App) -> Self {
        app.metrics.hanging.fetch_add(1, Ordering::Relaxed);
        HangGuard(app)
    }
}

impl Drop for HangGuard<'_> {
    fn drop(&mut self) {
        self.0.metrics.hanging.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `endpoint-load-metrics: JSON {...}` (ORCA-style load report).
fn add_load_header(app: &App, resp: &mut Response<Body>) {
    let v = format!(
        "JSON {{\"named_metrics\": {{\"num_requests_waiting\": {}, \"kv_cache_usage_perc\": {}}}}}",
        app.sched.waiting(),
        app.kv_cache_usage()
    );
    if let Ok(v) = HeaderValue::from_str(&v) {
        resp.headers_mut().insert("endpoint-load-metrics", v);
    }
}

fn models(app: &App) -> Response<Body> {
    json(
        StatusCode::OK,
        &ModelList {
            object: "list",
            data: [ModelCard {
                id: &app.model,
                object: "model",
                created: app.started,
                owned_by: "vllm",
                root: &app.model,
                parent: None,
                max_model_len: app.max_model_len,
            }],
        },
    )
}

async fn set_fault(app: &App, req: Request<Incoming>) -> Response<Body> {
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let fr: FaultRequest = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => {
            return ApiError::bad_request(format!("Invalid fault request: {e}")).into_response()
        }
    };
    if fr.slow_factor.is_some_and(|s| !(s.is_finite() && s >= 0.0)) {
        return ApiError::bad_request("slow_factor must be >= 0".into()).into_response();
    }
    let now = app.faults.set(
        fr.mode,
        fr.slow_factor,
        fr.duration_ms.map(Duration::from_millis),
    );
    json(
        StatusCode::OK,
        &serde_json::json!({"mode": now.mode.as_str(), "slow_factor": now.slow_factor}),
    )
}

/// An OpenAI-style error not yet turned into a response (small to pass
/// around in `Result`s).
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    /// The request field at fault, where vLLM names one.
    pub param: Option<&'static str>,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: String) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "BadRequestError",
            param: None,
            message,
        }
    }

    /// vLLM's `invalid_request_error` (Responses API checks), 400 unless
    /// `status` is changed.
    pub fn invalid_request(param: &'static str, message: String) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            param: Some(param),
            message,
        }
    }

    /// OpenAI-shaped: `{"error":{"message","type","param","code"}}`.
    pub fn into_response(self) -> Response<Body> {
        json(
            self.status,
            &ErrorBody {
                error: ErrorInfo {
                    message: self.message,
                    kind: self.kind,
                    param: self.param,
                    code: self.status.as_u16(),
                },
            },
        )
    }
}

/// Reads the whole request body; a transport error becomes a 400.
pub async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    match req.into_body().collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => Err(ApiError::bad_request(format!("Could not read body: {e}"))),
    }
}

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

pub fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = status;
    r
}

pub fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    json_bytes(
        status,
        serde_json::to_vec(value)
            .expect("response serializes")
            .into(),
    )
}

/// A JSON body already serialized (e.g. a stored response, sent again).
pub fn json_bytes(status: StatusCode, bytes: Bytes) -> Response<Body> {
    let mut r = Response::new(full(bytes));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn text(s: String) -> Response<Body> {
    let mut r = Response::new(full(s));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
