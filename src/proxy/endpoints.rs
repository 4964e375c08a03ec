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

/// Whether a request target is one the gateway forwards: an HTTP/1 request
/// line in origin form (a path, no scheme or host; HTTP/2 always carries
/// both, as pseudo-headers), a path without dot segments and without
/// encoded dots or slashes, so that nothing behind the gateway that
/// normalises paths could read it as another route than the one matched.
pub fn plain_target(uri: &http::Uri, version: http::Version) -> bool {
    let path = uri.path();
    let encoded = |p: &str| {
        let p = p.as_bytes();
        p.windows(3).any(|w| {
            w[0] == b'%'
                && matches!(
                    (w[1], w[2].to_ascii_lowercase()),
                    (b'2', b'e' | b'f') | (b'5', b'c')
                )
        })
    };
    let origin_form =
        version >= http::Version::HTTP_2 || (uri.scheme().is_none() && uri.authority().is_none());
    origin_form
        && path.starts_with('/')
        && !encoded(path)
        && !path
            .split('/')
            .any(|segment| segment == "." || segment == "..")
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
pub fn models<'a>(names: impl Iterator<Item = (&'a str, Option<&'a str>)>, created: u64) -> Value {
    let data: Vec<Value> = names
        .map(|(name, parent)| {
            let mut card = json!({"id": name, "object": "model", "created": created, "owned_by": "poimen-gateway"});
            if let Some(parent) = parent {
                card["parent"] = parent.into();
            }
            card
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
            Endpoint::Proxy(Api::Embeddings)
        );
        assert_eq!(
            classify(&Method::GET, "/v1/responses/resp_1"),
            Endpoint::Stored("resp_1".into())
        );
        assert_eq!(classify(&Method::POST, "/v1/x"), Endpoint::NotFound);
        assert_eq!(
            classify(&Method::POST, "/v1/../v1/chat/completions"),
            Endpoint::NotFound
        );
        assert_eq!(classify(&Method::GET, "/v1/models"), Endpoint::Models);
        assert_eq!(classify(&Method::GET, "/health"), Endpoint::Health);
        assert_eq!(
            classify(&Method::GET, "/v1/chat/completions"),
            Endpoint::NotFound
        );
        assert_eq!(classify(&Method::POST, "/v2/x"), Endpoint::NotFound);
        assert_eq!(classify(&Method::POST, "/v1"), Endpoint::NotFound);
    }

    #[test]
    fn only_plain_targets() {
        let plain = |t: &str| plain_target(&t.parse().unwrap(), http::Version::HTTP_11);
        assert!(plain("/v1/chat/completions") && plain("/v1/responses/resp_1?stream=true"));
        for bad in [
            "/v1/../admin",
            "/v1/./chat/completions",
            "/v1/chat/completions/..",
            "/v1/%2e%2e/admin",
            "/v1/%2E/x",
            "/v1/chat%2Fcompletions",
            "/v1%5cadmin",
            "http://evil/v1/chat/completions",
            "*",
        ] {
            assert!(!plain(bad), "{bad}");
        }
        // Dots inside a segment are a name, not a segment.
        assert!(plain("/v1/models/qwen2.5-7b"));
        // HTTP/2 names the scheme and host in pseudo-headers: its path counts.
        let h2 = |t: &str| plain_target(&t.parse().unwrap(), http::Version::HTTP_2);
        assert!(h2("https://gw.test/v1/chat/completions"));
        assert!(!h2("https://gw.test/v1/../admin"));
    }
}
