//! What the gateway answers itself: which requests are proxied, and the
//! bodies of `GET /health` and `GET /v1/models`.

use std::time::Instant;

use http::Method;
use serde_json::{json, Value};

use crate::pool::ModelPool;

#[derive(Debug, PartialEq, Eq)]
pub enum Endpoint {
    Health,
    Models,
    /// A `/v1/*` POST: routed by the body's `model`.
    Proxy,
    NotFound,
}

pub fn classify(method: &Method, path: &str) -> Endpoint {
    match (method, path) {
        (&Method::GET, "/health") => Endpoint::Health,
        (&Method::GET, "/v1/models") => Endpoint::Models,
        (&Method::POST, p) if p.starts_with("/v1/") => Endpoint::Proxy,
        _ => Endpoint::NotFound,
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
    fn routes_only_v1_posts_to_backends() {
        assert_eq!(
            classify(&Method::POST, "/v1/chat/completions"),
            Endpoint::Proxy
        );
        assert_eq!(classify(&Method::POST, "/v1/embeddings"), Endpoint::Proxy);
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
