//! What every endpoint shares: the body type, the OpenAI-style error, the
//! fault gate (`hang`, `error`) and the response helpers. A leaf: the
//! endpoints (`api` dispatches to them) import it, it imports none of them.

use std::convert::Infallible;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde::Serialize;

use crate::app::App;
use crate::config::FaultMode;
use crate::shapes::{ErrorBody, ErrorInfo};

pub type Body = BoxBody<Bytes, Infallible>;

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

    /// A pydantic validation error as vLLM answers it (before any handler
    /// runs): 400, type "Bad Request", `param` the field's location. The
    /// message is pydantic's, simplified to the location and the reason.
    pub fn validation(param: &'static str, what: &str) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "Bad Request",
            param: Some(param),
            message: format!("1 validation error:\n  {param}: {what}"),
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
