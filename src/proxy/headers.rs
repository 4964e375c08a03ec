//! The gateway's request headers: the cache key and the warmup marker it
//! reads, and the headers it sends upstream in their place.

use http::{HeaderName, HeaderValue};
use pingora::http::RequestHeader;

use crate::admission::load_report;
use crate::api::Api;
use crate::auth;
use crate::errors::ApiError;

// Names parsed once: a lookup by a name given as text parses it first.
pub const CACHE_KEY: HeaderName = HeaderName::from_static("x-poimen-cache-key");
pub const WARMUP: HeaderName = HeaderName::from_static("x-poimen-warmup");

/// The `X-Poimen-Cache-Key`, if present and non-empty. Two different values
/// cannot both be honoured, so they are refused.
pub fn cache_key(req: &RequestHeader) -> Result<Option<HeaderValue>, ApiError> {
    let mut values = req.headers.get_all(CACHE_KEY).iter();
    let first = values.next().filter(|v| !v.is_empty()).cloned();
    if values.any(|v| Some(v) != first.as_ref()) {
        return Err(ApiError::BadRequest(
            "X-Poimen-Cache-Key was given more than once with different values".into(),
        ));
    }
    Ok(first)
}

/// `X-Poimen-Warmup: true` (or `1`, any case) on a completion.
pub fn is_warmup(req: &RequestHeader, api: Api) -> bool {
    api.describe().completion
        && req.headers.get_all(WARMUP).iter().any(|v| {
            let v = v.as_bytes();
            v.eq_ignore_ascii_case(b"true") || v == b"1"
        })
}

/// What the gateway sends upstream in place of the client's headers: one
/// request's part of it, and the configuration's.
pub struct Upstream<'a> {
    /// The length of the body the gateway sends (read whole before routing).
    pub body_len: usize,
    pub warmup: bool,
    /// `warmup.vllm_priority`.
    pub vllm_priority: Option<i64>,
    /// `tenants.header`: the tenant a proxy in front named.
    pub tenant_header: Option<&'a http::HeaderName>,
    /// `upstream_api_key`.
    pub api_key: Option<&'a str>,
    /// `scheduler.load_feedback`: ask for the backend's load report.
    pub load_report: bool,
}

/// The upstream request's headers, from the client's:
/// - the body in one piece, whatever the client's framing (chunked) or
///   length (before a rewrite);
/// - the warmup marker stripped and, for a warmup, vLLM asked to rank it
///   low: `X-Priority: low`, and `X-Vllm-Priority` when configured (what
///   vLLM's `--scheduling-policy priority` reads; lower runs first);
/// - the client's credentials (for the gateway, not for vLLM) and the
///   tenant header (the gateway's business) removed; the upstream key
///   added when configured;
/// - with load feedback, the gateway's own question for a load report, in
///   the one format it reads, whatever the client asked.
pub fn rewrite_upstream(upstream: &mut RequestHeader, to: &Upstream) -> pingora::Result<()> {
    let chunked = upstream
        .remove_header(&http::header::TRANSFER_ENCODING)
        .is_some();
    // The client's own length, when it is the body's, stays as it came
    // (Pingora's header insert is the costly step here).
    let mut lengths = upstream
        .headers
        .get_all(http::header::CONTENT_LENGTH)
        .iter();
    let kept = match (lengths.next(), lengths.next()) {
        // Digits only: Rust's parse also takes a sign, HTTP does not.
        (Some(v), None) => {
            v.as_bytes().iter().all(u8::is_ascii_digit)
                && v.to_str().ok().and_then(|s| s.parse().ok()) == Some(to.body_len)
        }
        _ => false,
    };
    if chunked || !kept {
        upstream.insert_header(http::header::CONTENT_LENGTH, HeaderValue::from(to.body_len))?;
    }
    upstream.remove_header(&WARMUP);
    if to.warmup {
        upstream.insert_header("X-Priority", "low")?;
        if let Some(p) = to.vllm_priority {
            upstream.insert_header("X-Vllm-Priority", p.to_string())?;
        }
    }
    upstream.remove_header(&http::header::AUTHORIZATION);
    upstream.remove_header(&auth::X_API_KEY);
    if let Some(header) = to.tenant_header {
        upstream.remove_header(header);
    }
    if let Some(key) = to.api_key {
        upstream.insert_header(http::header::AUTHORIZATION, format!("Bearer {key}"))?;
    }
    if to.load_report {
        upstream.insert_header(load_report::FORMAT_HEADER, "json")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("POST", path.as_bytes(), None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    fn warm(path: &str, headers: &[(&str, &str)]) -> bool {
        is_warmup(&req(path, headers), Api::of_path(path))
    }

    #[test]
    fn warmup_marker_values_and_endpoints() {
        for v in ["true", "TRUE", "True", "1"] {
            assert!(
                warm("/v1/chat/completions", &[("x-poimen-warmup", v)]),
                "{v}"
            );
            assert!(warm("/v1/completions", &[("x-poimen-warmup", v)]), "{v}");
        }
        for v in ["false", "0", "yes", ""] {
            assert!(
                !warm("/v1/chat/completions", &[("x-poimen-warmup", v)]),
                "{v}"
            );
        }
        assert!(!warm("/v1/embeddings", &[("x-poimen-warmup", "true")]));
        assert!(!warm("/v1/chat/completions", &[]));
    }

    #[test]
    fn upstream_sees_no_marker_and_a_low_priority() {
        let tenant = http::HeaderName::from_static("x-tenant");
        let to = |warmup| Upstream {
            body_len: 12,
            warmup,
            vllm_priority: Some(7),
            tenant_header: Some(&tenant),
            api_key: Some("k"),
            load_report: true,
        };
        let client = [
            ("x-poimen-warmup", "true"),
            ("transfer-encoding", "chunked"),
            ("authorization", "Bearer client"),
            ("x-api-key", "client"),
            ("x-tenant", "a"),
        ];
        let mut r = req("/v1/chat/completions", &client);
        rewrite_upstream(&mut r, &to(true)).unwrap();
        assert!(r.headers.get(WARMUP).is_none());
        assert_eq!(r.headers["x-priority"], "low");
        assert_eq!(r.headers["x-vllm-priority"], "7");
        assert_eq!(r.headers["content-length"], "12");
        assert_eq!(r.headers["authorization"], "Bearer k");
        assert_eq!(r.headers[load_report::FORMAT_HEADER], "json");
        for gone in ["transfer-encoding", "x-api-key", "x-tenant"] {
            assert!(r.headers.get(gone).is_none(), "{gone}");
        }
        let mut r = req("/v1/embeddings", &[("x-poimen-warmup", "true")]);
        rewrite_upstream(&mut r, &to(false)).unwrap();
        assert!(r.headers.get(WARMUP).is_none());
        assert!(r.headers.get("x-priority").is_none());
    }

    #[test]
    fn the_upstream_length_is_the_bodys() {
        let to = Upstream {
            body_len: 12,
            warmup: false,
            vllm_priority: None,
            tenant_header: None,
            api_key: None,
            load_report: false,
        };
        let cases: [&[(&str, &str)]; 6] = [
            &[("content-length", "12")],
            &[("content-length", "40")],
            &[("content-length", "12"), ("content-length", "12")],
            &[("content-length", "+12")],
            &[("content-length", "12"), ("transfer-encoding", "chunked")],
            &[],
        ];
        for client in cases {
            let mut r = req("/v1/chat/completions", client);
            rewrite_upstream(&mut r, &to).unwrap();
            let lengths: Vec<_> = r.headers.get_all("content-length").iter().collect();
            assert_eq!(lengths, ["12"], "{client:?}");
            assert!(r.headers.get("transfer-encoding").is_none());
        }
    }

    #[test]
    fn conflicting_cache_keys_are_refused() {
        let k = |vals: &[&str]| {
            let headers: Vec<(&str, &str)> =
                vals.iter().map(|v| ("x-poimen-cache-key", *v)).collect();
            cache_key(&req("/v1/completions", &headers))
        };
        assert!(k(&[]).unwrap().is_none());
        assert!(k(&[""]).unwrap().is_none());
        assert_eq!(k(&["a"]).unwrap().unwrap(), "a");
        assert_eq!(k(&["a", "a"]).unwrap().unwrap(), "a");
        assert!(k(&["a", "b"]).is_err());
    }
}
