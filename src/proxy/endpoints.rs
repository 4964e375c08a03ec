//! What the gateway answers itself: which requests are proxied, and the
//! bodies of `GET /health` and `GET /v1/models`.

use std::time::Instant;

use http::Method;
use serde_json::{json, Value};

use crate::api::{self, Api};
use crate::pool::ModelPool;

#[derive(Debug, PartialEq, Eq)]
pub enum Endpoint {
    Health,
    Models,
    /// A POST of a proxied API: routed by the body's `model`.
    Proxy(Api),
    /// A retrieve or cancel of a stored response: routed to its owner.
    Stored(String),
    NotFound,
}

pub fn classify(method: &Method, path: &str) -> Endpoint {
    match (method, path) {
        (&Method::GET, "/health") => Endpoint::Health,
        (&Method::GET, "/v1/models") => Endpoint::Models,
        (m, p) => match Api::of_post(p).filter(|_| m == Method::POST) {
            Some(api) => Endpoint::Proxy(api),
            None => api::stored_response(m, p).map_or(Endpoint::NotFound, Endpoint::Stored),
        },
    }
}

/// `GET /health`: healthy while every model has a backend that is not
/// excluded. Returns (healthy, body).
pub fn health<'a>(pools: impl Iterator<Item = &'a ModelPool>, now: Instant) -> (bool, Value) {
    let mut healthy = true;
    let models: Vec<Value> = pools
        .map(|pool| {
            let members = pool.members();
            let backends: Vec<Value> = members
                .addrs()
                .iter()
                .map(|addr| match members.exclusions().remaining(addr, now) {
                    Some(left) => json!({
                        "address": addr.to_string(),
                        "state": "excluded",
                        "excluded_for_ms": left.as_millis() as u64,
                    }),
                    None => json!({"address": addr.to_string(), "state": "up"}),
                })
                .collect();
            let up = backends.iter().any(|b| b["state"] == "up");
            healthy &= up;
            json!({"name": pool.name, "available": up, "backends": backends})
        })
        .collect();
    let status = if healthy { "ok" } else { "unavailable" };
    (healthy, json!({"status": status, "models": models}))
}

/// `GET /v1/models` in OpenAI's list shape, from the configuration.
pub fn models<'a>(names: impl Iterator<Item = &'a str>, created: u64) -> Value {
    let data: Vec<Value> = names
        .map(|name| {
            json!({"id": name, "object": "model", "created": created, "owned_by": "poimen-gateway"})
        })
        .collect();
    json!({"object": "list", "data": data})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_only_the_listed_posts_to_backends() {
        assert_eq!(
            classify(&Method::POST, "/v1/chat/completions"),
            Endpoint::Proxy(Api::ChatCompletions)
        );
        assert_eq!(
            classify(&Method::POST, "/v1/embeddings"),
            Endpoint::Proxy(Api::Engine)
        );
        assert_eq!(
            classify(&Method::GET, "/v1/responses/resp_1"),
            Endpoint::Stored("resp_1".into())
        );
        assert_eq!(classify(&Method::POST, "/v1/x"), Endpoint::NotFound);
        assert_eq!(classify(&Method::GET, "/v1/models"), Endpoint::Models);
        assert_eq!(classify(&Method::GET, "/health"), Endpoint::Health);
        assert_eq!(
            classify(&Method::GET, "/v1/chat/completions"),
            Endpoint::NotFound
        );
        assert_eq!(classify(&Method::POST, "/v2/x"), Endpoint::NotFound);
        assert_eq!(classify(&Method::POST, "/v1"), Endpoint::NotFound);
    }
}
