//! The gateway's request headers: the cache key, the warmup marker, and what
//! a warmup looks like upstream.

use http::HeaderValue;
use pingora::http::RequestHeader;

use crate::api::Api;
use crate::errors::ApiError;

pub const CACHE_KEY: &str = "x-poimen-cache-key";
pub const WARMUP: &str = "x-poimen-warmup";

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
    api.is_completion()
        && req.headers.get_all(WARMUP).iter().any(|v| {
            let v = v.as_bytes();
            v.eq_ignore_ascii_case(b"true") || v == b"1"
        })
}

/// Strip the warmup marker (always) and, for a warmup, ask vLLM to rank it
/// low: `X-Priority: low`, and `X-Vllm-Priority` when configured (what
/// vLLM's `--scheduling-policy priority` reads; lower runs first).
pub fn rewrite_upstream(
    upstream: &mut RequestHeader,
    warmup: bool,
    vllm_priority: Option<i64>,
) -> pingora::Result<()> {
    upstream.remove_header(WARMUP);
    if warmup {
        upstream.insert_header("X-Priority", "low")?;
        if let Some(p) = vllm_priority {
            upstream.insert_header("X-Vllm-Priority", p.to_string())?;
        }
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
            assert!(warm("/v1/chat/completions", &[(WARMUP, v)]), "{v}");
            assert!(warm("/v1/completions", &[(WARMUP, v)]), "{v}");
        }
        for v in ["false", "0", "yes", ""] {
            assert!(!warm("/v1/chat/completions", &[(WARMUP, v)]), "{v}");
        }
        assert!(!warm("/v1/embeddings", &[(WARMUP, "true")]));
        assert!(!warm("/v1/chat/completions", &[]));
    }

    #[test]
    fn upstream_sees_no_marker_and_a_low_priority() {
        let mut r = req("/v1/chat/completions", &[(WARMUP, "true")]);
        rewrite_upstream(&mut r, true, Some(7)).unwrap();
        assert!(r.headers.get(WARMUP).is_none());
        assert_eq!(r.headers["x-priority"], "low");
        assert_eq!(r.headers["x-vllm-priority"], "7");
        let mut r = req("/v1/embeddings", &[(WARMUP, "true")]);
        rewrite_upstream(&mut r, false, Some(7)).unwrap();
        assert!(r.headers.get(WARMUP).is_none());
        assert!(r.headers.get("x-priority").is_none());
    }

    #[test]
    fn conflicting_cache_keys_are_refused() {
        let k = |vals: &[&str]| {
            let headers: Vec<(&str, &str)> = vals.iter().map(|v| (CACHE_KEY, *v)).collect();
            cache_key(&req("/v1/completions", &headers))
        };
        assert!(k(&[]).unwrap().is_none());
        assert!(k(&[""]).unwrap().is_none());
        assert_eq!(k(&["a"]).unwrap().unwrap(), "a");
        assert_eq!(k(&["a", "a"]).unwrap().unwrap(), "a");
        assert!(k(&["a", "b"]).is_err());
    }
}
