//! Errors a client sees, each with its HTTP status and a body in the shape
//! its API's SDKs read: OpenAI's `{"error": {"message", "type", "code"}}`,
//! or on Anthropic's Messages API `{"type": "error", "error": {"type",
//! "message"}}`, with the statuses Anthropic's SDKs map to their typed
//! errors (a full queue is 529, `overloaded_error`).

use std::time::Duration;

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::{ErrorSource, ErrorType};

use crate::auth::Reason;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error(
        "a valid API key or token is required: Authorization: Bearer <credential>, or x-api-key: <credential> ({0})"
    )]
    Unauthorized(Reason),
    #[error("request body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the model `{0}` does not exist")]
    UnknownModel(String),
    #[error("no route for {method} {path}")]
    NotFound { method: String, path: String },
    #[error("no backend of model `{model}` is available")]
    NoBackend {
        model: String,
        retry_after: Duration,
    },
    #[error("every slot and queue place for model `{model}` is taken")]
    QueueFull { model: String },
    #[error("no slot for model `{model}` came free within the queue timeout")]
    QueueTimeout { model: String },
    #[error("the stored response `{id}` is unavailable: {detail}")]
    StoredUnavailable {
        id: String,
        detail: String,
        retry_after: Option<Duration>,
    },
    /// No backend has the stored response: its backends' own 404, as sent.
    #[error("stored response not found")]
    StoredNotFound(Bytes),
    #[error("tenant `{tenant}` is over its {limit} budget")]
    OverBudget {
        tenant: String,
        /// `max_in_flight`, `requests_per_minute` or `tokens_per_minute`.
        limit: &'static str,
        retry_after: Duration,
    },
    #[error("the backend could not be reached: {0}")]
    BadGateway(String),
    /// A LoRA adapter could not be loaded on demand: the backend's answer,
    /// which stands for every request for it until `retry_after` ends.
    #[error("{message}")]
    AdapterLoadFailed {
        message: String,
        retry_after: Duration,
    },
    #[error("the backend did not answer in time")]
    GatewayTimeout,
}

pub use crate::api::Shape;

impl ApiError {
    /// The status in `shape`: Anthropic's SDKs know an overloaded server
    /// by 529.
    pub fn status(&self, shape: Shape) -> u16 {
        match (self, shape) {
            (ApiError::QueueFull { .. } | ApiError::QueueTimeout { .. }, Shape::Anthropic) => 529,
            _ => self.openai_status(),
        }
    }

    fn openai_status(&self) -> u16 {
        match self {
            ApiError::BadRequest(_) => 400,
            ApiError::Unauthorized(_) => 401,
            ApiError::TooLarge { .. } => 413,
            ApiError::UnknownModel(_) | ApiError::NotFound { .. } | ApiError::StoredNotFound(_) => {
                404
            }
            ApiError::NoBackend { .. }
            | ApiError::QueueFull { .. }
            | ApiError::QueueTimeout { .. }
            | ApiError::StoredUnavailable { .. } => 503,
            ApiError::OverBudget { .. } => 429,
            ApiError::BadGateway(_) | ApiError::AdapterLoadFailed { .. } => 502,
            ApiError::GatewayTimeout => 504,
        }
    }

    /// Anthropic's error `type`.
    fn anthropic_type(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "invalid_request_error",
            ApiError::Unauthorized(_) => "authentication_error",
            ApiError::TooLarge { .. } => "request_too_large",
            ApiError::UnknownModel(_) | ApiError::NotFound { .. } | ApiError::StoredNotFound(_) => {
                "not_found_error"
            }
            ApiError::QueueFull { .. } | ApiError::QueueTimeout { .. } => "overloaded_error",
            ApiError::OverBudget { .. } => "rate_limit_error",
            ApiError::GatewayTimeout => "timeout_error",
            ApiError::NoBackend { .. }
            | ApiError::StoredUnavailable { .. }
            | ApiError::BadGateway(_)
            | ApiError::AdapterLoadFailed { .. } => "api_error",
        }
    }

    /// The gateway's machine-readable `code` (OpenAI's shape), e.g.
    /// `queue_full`: the `error.type` of a trace.
    pub fn code(&self) -> &'static str {
        self.kind().1
    }

    /// OpenAI's `type` and the gateway's machine-readable `code`.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::BadRequest(_) => ("invalid_request_error", "invalid_body"),
            ApiError::Unauthorized(_) => ("invalid_request_error", "invalid_api_key"),
            ApiError::TooLarge { .. } => ("invalid_request_error", "body_too_large"),
            ApiError::UnknownModel(_) => ("invalid_request_error", "model_not_found"),
            ApiError::NotFound { .. } => ("invalid_request_error", "not_found"),
            ApiError::StoredNotFound(_) => ("invalid_request_error", "response_not_found"),
            ApiError::StoredUnavailable { .. } => ("server_error", "stored_response_unavailable"),
            ApiError::NoBackend { .. } => ("server_error", "no_backend"),
            ApiError::QueueFull { .. } => ("server_error", "queue_full"),
            ApiError::QueueTimeout { .. } => ("server_error", "queue_timeout"),
            ApiError::OverBudget { limit, .. } => ("rate_limit_error", limit),
            ApiError::BadGateway(_) => ("server_error", "bad_gateway"),
            ApiError::AdapterLoadFailed { .. } => ("server_error", "adapter_load_failed"),
            ApiError::GatewayTimeout => ("server_error", "gateway_timeout"),
        }
    }

    /// Whole seconds a client should wait before retrying, if any.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            // Round up: retrying before the backend returns is wasted.
            ApiError::NoBackend { retry_after, .. }
            | ApiError::OverBudget { retry_after, .. }
            | ApiError::AdapterLoadFailed { retry_after, .. }
            | ApiError::StoredUnavailable {
                retry_after: Some(retry_after),
                ..
            } => Some(retry_after.as_millis().div_ceil(1000).max(1) as u64),
            // A slot usually frees within a generation's time.
            ApiError::QueueFull { .. } | ApiError::QueueTimeout { .. } => Some(1),
            _ => None,
        }
    }

    /// The JSON body of this error, in `shape`.
    pub fn body(&self, shape: Shape) -> Bytes {
        if let ApiError::StoredNotFound(body) = self {
            return body.clone();
        }
        let message = self.to_string();
        let v = match shape {
            Shape::OpenAi => {
                let (kind, code) = self.kind();
                serde_json::json!({"error": {"message": message, "type": kind, "code": code}})
            }
            Shape::Anthropic => serde_json::json!({
                "type": "error",
                "error": {"type": self.anthropic_type(), "message": message}
            }),
        };
        Bytes::from(v.to_string())
    }

    /// The full response in `shape`: status, headers and body.
    pub fn response(&self, shape: Shape) -> (ResponseHeader, Bytes) {
        let body = self.body(shape);
        let mut header = json_header(self.status(shape), body.len());
        if let Some(secs) = self.retry_after() {
            let _ = header.insert_header("Retry-After", secs.to_string());
        }
        if let ApiError::Unauthorized(reason) = self {
            // RFC 6750 3.1: no error code when no credential was sent.
            let challenge = match reason {
                Reason::Missing => "Bearer",
                _ => "Bearer error=\"invalid_token\"",
            };
            let _ = header.insert_header("WWW-Authenticate", challenge);
        }
        (header, body)
    }
}

/// What the client is told when proxying failed with a Pingora error of
/// `etype` from `source`: nothing when the client itself is gone.
pub fn from_proxy_error(source: &ErrorSource, etype: &ErrorType) -> Option<ApiError> {
    if *source == ErrorSource::Downstream {
        return None;
    }
    Some(match etype {
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
            ApiError::GatewayTimeout
        }
        other => ApiError::BadGateway(other.as_str().to_string()),
    })
}

/// A response header for a JSON body of `len` bytes.
pub fn json_header(status: u16, len: usize) -> ResponseHeader {
    let mut header = ResponseHeader::build(status, Some(4)).expect("valid status code");
    // Static names and values: these inserts cannot fail.
    let _ = header.insert_header("Content-Type", "application/json");
    let _ = header.insert_header("Content-Length", len.to_string());
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_openai_shaped() {
        let e = ApiError::UnknownModel("x".into());
        let v: serde_json::Value = serde_json::from_slice(&e.body(Shape::OpenAi)).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["message"], "the model `x` does not exist");
        assert_eq!(e.status(Shape::OpenAi), 404);
    }

    #[test]
    fn on_the_messages_api_errors_are_anthropic_shaped() {
        let shape = Shape::of_path("/v1/messages/count_tokens");
        assert_eq!(shape, Shape::Anthropic);
        let full = ApiError::QueueFull { model: "m".into() };
        let (h, body) = full.response(shape);
        assert_eq!(h.status.as_u16(), 529);
        assert_eq!(h.headers["retry-after"], "1");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "error", "error": {
                "type": "overloaded_error",
                "message": "every slot and queue place for model `m` is taken"
            }})
        );
        let typed = |e: ApiError| (e.status(shape), e.anthropic_type());
        let missing = ApiError::Unauthorized(Reason::Missing);
        assert_eq!(typed(missing), (401, "authentication_error"));
        assert_eq!(
            typed(ApiError::TooLarge { limit: 1 }),
            (413, "request_too_large")
        );
        assert_eq!(
            typed(ApiError::UnknownModel("x".into())),
            (404, "not_found_error")
        );
        assert_eq!(typed(ApiError::GatewayTimeout), (504, "timeout_error"));
        let over = || ApiError::OverBudget {
            tenant: "t".into(),
            limit: "tokens_per_minute",
            retry_after: Duration::from_millis(1500),
        };
        assert_eq!(typed(over()), (429, "rate_limit_error"));
        let (h, body) = over().response(Shape::OpenAi);
        assert_eq!(
            (h.status.as_u16(), &h.headers["retry-after"]),
            (429, &"2".parse::<http::HeaderValue>().unwrap())
        );
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["code"], "tokens_per_minute");
        assert_eq!(full.status(Shape::OpenAi), 503);
    }

    #[test]
    fn proxy_errors_map_to_gateway_errors() {
        let status =
            |source, etype| from_proxy_error(&source, &etype).map(|e| e.status(Shape::OpenAi));
        use ErrorSource::*;
        assert_eq!(status(Upstream, ErrorType::ReadTimedout), Some(504));
        assert_eq!(status(Upstream, ErrorType::ConnectTimedout), Some(504));
        assert_eq!(status(Internal, ErrorType::WriteTimedout), Some(504));
        assert_eq!(status(Upstream, ErrorType::ConnectRefused), Some(502));
        assert_eq!(status(Upstream, ErrorType::InvalidHTTPHeader), Some(502));
        // A backend whose certificate did not verify, when none is left.
        assert_eq!(status(Upstream, ErrorType::TLSHandshakeFailure), Some(502));
        assert_eq!(status(Downstream, ErrorType::ReadTimedout), None);
        assert_eq!(status(Downstream, ErrorType::ConnectionClosed), None);
        let e = from_proxy_error(&Upstream, &ErrorType::ConnectRefused).unwrap();
        assert_eq!(e.kind().1, "bad_gateway");
        assert!(e.to_string().contains("ConnectRefused"), "{e}");
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let e = |ms| ApiError::NoBackend {
            model: "m".into(),
            retry_after: Duration::from_millis(ms),
        };
        assert_eq!(e(1).retry_after(), Some(1));
        assert_eq!(e(1000).retry_after(), Some(1));
        assert_eq!(e(29_001).retry_after(), Some(30));
        let (h, _) = e(2500).response(Shape::OpenAi);
        assert_eq!(h.headers["retry-after"], "3");
        assert_eq!(h.status, 503);
    }
}
