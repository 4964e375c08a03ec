//! `auth`: the API keys clients may present (read from their file here),
//! the JWT settings (`crate::auth::jwt::config`) and the key sent upstream.

use serde::Deserialize;

use crate::auth::jwt::config::{self as jwt, JwtConfig, JwtFile};
use crate::auth::ApiKeys;
use crate::field::{invalid, Invalid};

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AuthFile {
    /// One API key, or its SHA-256 in hex, per line. When set, requests need
    /// `Authorization: Bearer <key>`. Default: no authentication.
    api_keys_file: Option<String>,
    /// Sent upstream as `Authorization: Bearer <key>` (vLLM's `--api-key`).
    /// Default: the client's Authorization is removed.
    upstream_api_key: Option<String>,
    /// JWT bearer tokens from an OIDC provider. When set (with or without
    /// `api_keys_file`), requests need a valid token or key. Default: none.
    jwt: Option<JwtFile>,
}

/// The validated `auth` section.
pub struct Auth {
    pub api_keys: Option<ApiKeys>,
    pub jwt: Option<JwtConfig>,
    pub upstream_api_key: Option<String>,
}

/// Reads the keys file; the upstream key is never echoed in an error.
pub fn validate(auth: AuthFile) -> Result<Auth, Invalid> {
    let at = "gateway.auth.api_keys_file";
    let api_keys = match &auth.api_keys_file {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| invalid(at, path, &format!("cannot read: {e}")))?;
            Some(ApiKeys::parse(&text).map_err(|e| invalid(at, path, &e.to_string()))?)
        }
    };
    if let Some(key) = &auth.upstream_api_key {
        if key.is_empty() || http::HeaderValue::from_str(&format!("Bearer {key}")).is_err() {
            // The key itself is a secret: never echo it.
            return Err(invalid(
                "gateway.auth.upstream_api_key",
                "(hidden)",
                "must be non-empty printable ASCII",
            ));
        }
    }
    let jwt = auth.jwt.map(jwt::validate).transpose()?;
    Ok(Auth {
        api_keys,
        jwt,
        upstream_api_key: auth.upstream_api_key,
    })
}
