//! The `gateway.auth.jwt` section: its file format, its validated form
//! ([`JwtConfig`]: the [`TokenRules`](super::TokenRules) and where the provider's
//! keys come from) and its checks. It lives beside the policy, not in
//! `config`, so `auth` depends on no configuration module: `config` takes
//! this section whole.

use std::time::Duration;

use serde::Deserialize;

use crate::auth::jwks::KeySet;
use crate::auth::jwks_url::JwksUrl;
use crate::auth::jwt;
use crate::field::{invalid, Bound, Invalid};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct JwtFile {
    /// The `iss` a token must carry. Required.
    issuer: String,
    /// One of these must be in the token's `aud`: a string or a list.
    /// Required.
    audience: OneOrMany,
    /// The provider's keys, read at start (and so on reload). Either this
    /// or `jwks_url`.
    jwks_file: Option<String>,
    /// The provider's keys, fetched at start, every `jwks_refresh_secs`,
    /// and when a token names an unknown key. `https://`, or `http://` to a
    /// loopback host only.
    jwks_url: Option<String>,
    /// CA certificates (PEM) that `jwks_url` is verified against instead of
    /// the system's store. Default: the system's store.
    ca_file: Option<String>,
    /// Accepted `alg`s: RS256/384/512, PS256/384/512, ES256, ES384, EdDSA
    /// (never HMAC or `none`). Default [RS256].
    #[serde(default = "default_algorithms")]
    algorithms: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`. Default 30.
    #[serde(default = "default_leeway_secs")]
    leeway_secs: u64,
    /// How often `jwks_url` is fetched. Default 300.
    #[serde(default = "default_jwks_refresh_secs")]
    jwks_refresh_secs: u64,
    /// The claim whose string value names the token's tenant (e.g.
    /// `preferred_username`, which Authentik sets). A token without it is
    /// refused. Default sub.
    #[serde(default = "default_tenant_claim")]
    tenant_claim: String,
}

fn default_tenant_claim() -> String {
    "sub".into()
}

fn default_algorithms() -> Vec<String> {
    vec!["RS256".into()]
}
fn default_leeway_secs() -> u64 {
    30
}
fn default_jwks_refresh_secs() -> u64 {
    300
}

/// A string or a list of strings (`audience`).
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub policy: jwt::TokenRules,
    pub jwks: JwksSource,
}

/// Where the JWT keys come from.
#[derive(Debug, Clone)]
pub enum JwksSource {
    /// Read from `jwks_file` at start.
    File(KeySet),
    /// Fetched from `jwks_url` (at start by `main`, then in the background).
    Url {
        url: JwksUrl,
        ca_file: Option<String>,
        refresh: Duration,
    },
}

pub const LEEWAY_SECS: Bound<u64> = Bound::new(&["gateway.auth.jwt.leeway_secs"], 0, 600);
pub const JWKS_REFRESH_SECS: Bound<u64> =
    Bound::new(&["gateway.auth.jwt.jwks_refresh_secs"], 1, 86_400);

/// Reads `jwks_file` (a `jwks_url` is fetched later, by `main`).
pub fn validate(j: JwtFile) -> Result<JwtConfig, Invalid> {
    let at = "gateway.auth.jwt";
    if j.issuer.is_empty() {
        return Err(invalid(
            format!("{at}.issuer"),
            &j.issuer,
            "must not be empty",
        ));
    }
    let audience = match j.audience {
        OneOrMany::One(a) => vec![a],
        OneOrMany::Many(list) => list,
    };
    if audience.is_empty() || audience.iter().any(String::is_empty) {
        return Err(invalid(
            format!("{at}.audience"),
            &audience,
            "needs at least one non-empty audience",
        ));
    }
    if j.algorithms.is_empty() {
        return Err(invalid(
            format!("{at}.algorithms"),
            "[]",
            "needs at least one algorithm",
        ));
    }
    let mut algorithms = Vec::new();
    for (i, name) in j.algorithms.iter().enumerate() {
        let alg = jwt::algorithm(name).ok_or_else(|| {
            invalid(
                format!("{at}.algorithms[{i}]"),
                name,
                "not one of RS256 RS384 RS512 PS256 PS384 PS512 ES256 ES384 EdDSA \
                 (HMAC and none are refused: a shared secret is not a public key)",
            )
        })?;
        algorithms.push(alg);
    }
    let jwks = match (j.jwks_file, j.jwks_url) {
        (Some(_), None) if j.ca_file.is_some() => {
            return Err(invalid(
                format!("{at}.ca_file"),
                &j.ca_file,
                "applies only to `jwks_url`",
            ))
        }
        (Some(path), None) => {
            let at = format!("{at}.jwks_file");
            let text = std::fs::read_to_string(&path)
                .map_err(|e| invalid(&at, &path, &format!("cannot read: {e}")))?;
            JwksSource::File(KeySet::parse(&text).map_err(|e| invalid(&at, &path, &e.to_string()))?)
        }
        (None, Some(url)) => {
            let ca_file = j
                .ca_file
                .map(|path| validate_ca_file(&format!("{at}.ca_file"), path))
                .transpose()?;
            JwksSource::Url {
                url: JwksUrl::parse(&url)
                    .map_err(|e| invalid(format!("{at}.jwks_url"), &url, &e))?,
                ca_file,
                refresh: Duration::from_secs(
                    JWKS_REFRESH_SECS
                        .check(&format!("{at}.jwks_refresh_secs"), j.jwks_refresh_secs)?,
                ),
            }
        }
        (Some(_), Some(url)) => {
            return Err(invalid(
                format!("{at}.jwks_url"),
                &url,
                "set either `jwks_file` or `jwks_url`, not both",
            ))
        }
        (None, None) => return Err(invalid(at, "(no keys)", "needs `jwks_file` or `jwks_url`")),
    };
    Ok(JwtConfig {
        policy: jwt::TokenRules {
            issuer: j.issuer,
            audience,
            algorithms,
            leeway_secs: LEEWAY_SECS.check(&format!("{at}.leeway_secs"), j.leeway_secs)?,
            tenant_claim: match j.tenant_claim.is_empty() {
                false => j.tenant_claim,
                true => {
                    return Err(invalid(
                        format!("{at}.tenant_claim"),
                        "",
                        "must name a claim",
                    ))
                }
            },
        },
        jwks,
    })
}

/// A PEM file with at least one CA certificate, loaded as Pingora's
/// connector will load it (which panics on a bad file).
fn validate_ca_file(at: &str, path: String) -> Result<String, Invalid> {
    let mut store = pingora::tls::RootCertStore::empty();
    match pingora::tls::load_ca_file_into_store(&path, &mut store) {
        Err(e) => Err(invalid(
            at,
            &path,
            &format!("not a PEM file of CA certificates: {e}"),
        )),
        Ok(()) if store.is_empty() => Err(invalid(at, &path, "holds no certificate")),
        Ok(()) => Ok(path),
    }
}
