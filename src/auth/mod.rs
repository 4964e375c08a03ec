//! Client authentication, before any queueing: `Authorization: Bearer
//! <credential>`, where the credential is an API key from a file (here) or a
//! JWT from an OIDC provider (`jwt`, with its keys from `jwks`). When both
//! are configured either is accepted.
//!
//! API keys are kept only as SHA-256 digests and compared in constant time: a
//! request's key is hashed and checked against every digest without an early
//! exit, so timing reveals neither a key nor how much of one matched.

pub mod fetch;
pub mod jwks;
pub mod jwks_url;
pub mod jwt;
#[cfg(test)]
pub mod test_keys;

use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

use crate::tenants;

use jwt::Verifier;

/// Why a request was refused: the label of
/// `poimen_gateway_auth_failures_total{reason}`, a fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No `Authorization: Bearer <credential>`, nor `x-api-key`.
    Missing,
    /// Not a JWT (nor, when API keys are configured too, a known key), or a
    /// JWT without a required claim.
    Malformed,
    BadSignature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
    /// No key of the JWKS fits the token's `kid` (or, API keys only: not a
    /// known API key).
    UnknownKey,
    /// `alg` not allowed (`none`, HMAC, not in `algorithms`) or not the
    /// key's type.
    Algorithm,
    /// A valid token without the string claim `auth.jwt.tenant_claim`.
    TenantClaim,
}

impl Reason {
    pub const ALL: [Reason; 10] = [
        Reason::Missing,
        Reason::Malformed,
        Reason::BadSignature,
        Reason::Expired,
        Reason::NotYetValid,
        Reason::Issuer,
        Reason::Audience,
        Reason::UnknownKey,
        Reason::Algorithm,
        Reason::TenantClaim,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Missing => "missing",
            Reason::Malformed => "malformed",
            Reason::BadSignature => "bad_signature",
            Reason::Expired => "expired",
            Reason::NotYetValid => "not_yet_valid",
            Reason::Issuer => "issuer",
            Reason::Audience => "audience",
            Reason::UnknownKey => "unknown_key",
            Reason::Algorithm => "algorithm",
            Reason::TenantClaim => "tenant_claim",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The header Anthropic's clients send their credential in.
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The credential a request carries: `Authorization: Bearer <credential>`,
/// else `x-api-key: <credential>` (what Anthropic's SDKs send).
pub fn credential(headers: &HeaderMap) -> Option<&[u8]> {
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()));
    bearer.or_else(|| {
        let key = headers.get(X_API_KEY)?.as_bytes().trim_ascii();
        (!key.is_empty()).then_some(key)
    })
}

/// Check a request's credential against the API keys and the JWT verifier,
/// whichever are configured (at least one). Returns the tenant it names:
/// the key's name in the keys file, or the token's tenant claim.
pub async fn authenticate(
    api_keys: Option<&ApiKeys>,
    jwt: Option<&Verifier>,
    credential: Option<&[u8]>,
) -> Result<Arc<str>, Reason> {
    let token = credential.ok_or(Reason::Missing)?;
    if let Some(tenant) = api_keys.and_then(|keys| keys.tenant_of(token)) {
        return Ok(tenant);
    }
    match jwt {
        Some(verifier) => {
            let token = std::str::from_utf8(token).map_err(|_| Reason::Malformed)?;
            verifier.verify(token).await
        }
        None => Err(Reason::UnknownKey),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    #[error("no keys in the file")]
    Empty,
    // The line number only: never the line, which holds a key.
    #[error("line {0}: `name:key` needs a tenant name of 1 to 64 of A-Z a-z 0-9 _ . - before the first `:`")]
    BadName(usize),
}

#[derive(Clone)]
pub struct ApiKeys {
    /// Each key's SHA-256 and the tenant it names.
    digests: Vec<([u8; 32], Arc<str>)>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print keys, not even their digests.
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

impl ApiKeys {
    /// Parse a keys file: one key per line, or its SHA-256 as 64 hex digits,
    /// either one after `name:` to name its tenant (else tenant `default`);
    /// blank lines and lines starting with `#` are ignored. A key that holds
    /// a `:` itself needs a name before it.
    pub fn parse(text: &str) -> Result<Self, KeysError> {
        let default: Arc<str> = tenants::DEFAULT.into();
        let mut digests = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (tenant, key) = match line.split_once(':') {
                Some((name, key)) if tenants::valid_name(name) => (name.into(), key),
                Some(_) => return Err(KeysError::BadName(i + 1)),
                None => (default.clone(), line),
            };
            let digest = hex_digest(key).unwrap_or_else(|| Sha256::digest(key.as_bytes()).into());
            digests.push((digest, tenant));
        }
        if digests.is_empty() {
            return Err(KeysError::Empty);
        }
        Ok(ApiKeys { digests })
    }

    /// The tenant of `key`, if it is one of the keys. Every key is compared,
    /// each in constant time.
    pub fn tenant_of(&self, key: &[u8]) -> Option<Arc<str>> {
        let digest: [u8; 32] = Sha256::digest(key).into();
        self.digests.iter().fold(None, |found, (d, tenant)| {
            match constant_time_eq(d, &digest) {
                true => Some(tenant.clone()),
                false => found,
            }
        })
    }
}

/// The token of `Bearer <token>` (scheme case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ") && !token.is_empty()).then_some(token.trim_ascii())
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex_digest(line: &str) -> Option<[u8; 32]> {
    if line.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(line.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdict on `authorization` with API keys alone (nothing to
    /// await then).
    pub(crate) fn verdict(keys: &ApiKeys, authorization: Option<&[u8]>) -> Result<(), Reason> {
        let credential = authorization.and_then(bearer);
        futures::executor::block_on(authenticate(Some(keys), None, credential)).map(|_| ())
    }

    #[test]
    fn plain_and_hashed_keys() {
        let hashed = format!("{:x}", Sha256::digest(b"second-key"));
        let keys = ApiKeys::parse(&format!("# comment\n\nfirst-key\n  {hashed}  \n")).unwrap();
        let verdict = |auth: Option<&[u8]>| verdict(&keys, auth);
        assert_eq!(verdict(Some(b"Bearer first-key")), Ok(()));
        assert_eq!(verdict(Some(b"bearer second-key")), Ok(()));
        assert_eq!(verdict(Some(b"Bearer first-ke")), Err(Reason::UnknownKey));
        assert_eq!(
            verdict(Some(&[b"Bearer ".as_slice(), &[0xff, 0xfe]].concat())),
            Err(Reason::UnknownKey)
        );
        for missing in [
            &b"Bearer "[..],
            b"Basic first-key",
            b"first-key",
            &[0xff, 0xfe],
        ] {
            assert_eq!(verdict(Some(missing)), Err(Reason::Missing));
        }
        assert_eq!(verdict(None), Err(Reason::Missing));
        assert_eq!(format!("{keys:?}"), "ApiKeys(2 keys)");
    }

    #[test]
    fn a_bearer_first_else_an_x_api_key() {
        let headers = |pairs: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            h
        };
        let cred = |pairs: &[(&str, &str)]| credential(&headers(pairs)).map(<[u8]>::to_vec);
        assert_eq!(cred(&[("x-api-key", " k1 ")]), Some(b"k1".to_vec()));
        let both = [("authorization", "Bearer b1"), ("x-api-key", "k1")];
        assert_eq!(cred(&both), Some(b"b1".to_vec()));
        let basic = [("authorization", "Basic b1"), ("x-api-key", "k1")];
        assert_eq!(cred(&basic), Some(b"k1".to_vec()));
        assert_eq!(cred(&[("x-api-key", "  ")]), None);
        assert_eq!(cred(&[]), None);
    }

    #[test]
    fn a_line_may_name_its_tenant() {
        let hashed = format!("{:x}", Sha256::digest(b"bob-key"));
        let keys = ApiKeys::parse(&format!(
            "alice:a-key\nbob:{hashed}\nplain\nc.d-e_f:with:colons\n"
        ))
        .unwrap();
        let tenant = |k: &[u8]| keys.tenant_of(k).map(|t| t.to_string());
        assert_eq!(tenant(b"a-key").as_deref(), Some("alice"));
        assert_eq!(tenant(b"bob-key").as_deref(), Some("bob"));
        assert_eq!(tenant(b"plain").as_deref(), Some("default"));
        assert_eq!(tenant(b"with:colons").as_deref(), Some("c.d-e_f"));
        assert_eq!(tenant(b"alice:a-key"), None);
        // The line number, never the line.
        let err = ApiKeys::parse("ok\nbad name:secret\n").unwrap_err();
        assert_eq!(err, KeysError::BadName(2));
        assert!(!err.to_string().contains("secret"));
    }

    #[test]
    fn an_empty_file_is_refused() {
        assert_eq!(
            ApiKeys::parse("# nothing\n\n").unwrap_err(),
            KeysError::Empty
        );
    }
}
