//! HTTP routing and the small endpoints (health, models, metrics, sim
//! controls). The generation endpoints live in `completions` (chat,
//! completions), `responses` and `messages`; `/tokenize` in
//! `tokenizer_routes`; the LoRA adapter routes in `lora_routes`; what they
//! all share in `common`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::app::{unix_now, App};
use crate::common::{empty, fault_gate, full, json, read_body, ApiError, Body};
use crate::completions::{self, Kind};
use crate::faults::FaultRequest;
use crate::shapes::{ModelCard, ModelList};
use crate::{lora_routes, messages, responses, tokenizer_routes};

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
            Ok(()) => {
                // The list as it is when asked, sent late.
                let list = models(&app);
                tokio::time::sleep(app.timing.models(app.faults.delay_factor())).await;
                list
            }
        },
        (&Method::POST, "/v1/chat/completions") => completions::handle(&app, Kind::Chat, req).await,
        (&Method::POST, "/v1/completions") => completions::handle(&app, Kind::Text, req).await,
        (&Method::POST, "/v1/responses") => responses::create(&app, req).await,
        (&Method::POST, "/v1/messages") => messages::create(&app, req).await,
        (&Method::POST, "/v1/messages/count_tokens") => messages::count_tokens(&app, req).await,
        (&Method::POST, "/tokenize") => tokenizer_routes::tokenize(&app, req).await,
        (&Method::POST, "/detokenize") => tokenizer_routes::detokenize(&app, req).await,
        // Without runtime updating vLLM registers no such route: 404 below.
        (&Method::POST, LOAD_LORA) if app.adapters.runtime_updating() => {
            lora_routes::load(&app, req).await
        }
        (&Method::POST, UNLOAD_LORA) if app.adapters.runtime_updating() => {
            lora_routes::unload(&app, req).await
        }
        (m, p) if p.starts_with(RESPONSES) => response_by_id(&app, m, &p[RESPONSES.len()..]).await,
        (&Method::GET, "/metrics") => text(app.metrics.prometheus(&app.model, app.gauges())),
        (&Method::GET, "/sim/stats") => {
            let fault = app.faults.current().mode.as_str();
            json(StatusCode::OK, &app.metrics.stats(app.gauges(), fault))
        }
        (&Method::POST, "/sim/fault") => set_fault(&app, req).await,
        // vLLM serves it with VLLM_SERVER_DEV_MODE=1; the sim always does.
        (&Method::POST, "/reset_prefix_cache") => {
            app.reset_prefix_cache();
            json(StatusCode::OK, &serde_json::json!({"success": true}))
        }
        (_, "/health" | "/v1/models" | "/v1/chat/completions" | "/v1/completions" | "/metrics")
        | (_, "/v1/responses" | "/v1/messages" | "/v1/messages/count_tokens")
        | (_, "/tokenize" | "/detokenize")
        | (_, "/sim/stats" | "/sim/fault" | "/reset_prefix_cache") => method_not_allowed(),
        (_, LOAD_LORA | UNLOAD_LORA) if app.adapters.runtime_updating() => method_not_allowed(),
        _ => not_found(),
    };
    if wants_load && !path.starts_with("/sim/") && path != "/metrics" {
        add_load_header(&app, &mut resp);
    }
    Ok(resp)
}

const RESPONSES: &str = "/v1/responses/";
const LOAD_LORA: &str = "/v1/load_lora_adapter";
const UNLOAD_LORA: &str = "/v1/unload_lora_adapter";

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

/// The base model, then each loaded adapter (vLLM's
/// `show_available_models`).
fn models(app: &App) -> Response<Body> {
    let now = unix_now();
    let adapters = app.adapters.list();
    let base = ModelCard::new(
        &app.model,
        &app.model,
        None,
        Some(app.max_model_len),
        now,
        app.random_hex(),
    );
    let cards = adapters.iter().map(|a| {
        ModelCard::new(
            &a.name,
            &a.path,
            Some(&app.model),
            None,
            now,
            app.random_hex(),
        )
    });
    json(
        StatusCode::OK,
        &ModelList {
            object: "list",
            data: std::iter::once(base).chain(cards).collect(),
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

fn text(s: String) -> Response<Body> {
    let mut r = Response::new(full(s));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
