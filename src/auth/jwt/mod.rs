//! JWT bearer tokens from an OIDC provider: which key verifies a token, and
//! whether its claims are acceptable. The signature and claim checks are
//! `jsonwebtoken`'s; this module chooses the key and the algorithm, and maps
//! every failure to its `Reason`.
//!
//! A token is refused before any cryptography when its `alg` is not one of
//! the configured asymmetric algorithms (so never `none` or HMAC, whatever
//! the JWKS holds) or does not suit the key it names.

pub mod config;

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};

use super::jwks::{Jwks, KeySet};
use super::Reason;

/// What a valid token must be: the validated `gateway.auth.jwt`.
#[derive(Debug, Clone)]
pub struct TokenRules {
    pub issuer: String,
    /// A token is accepted when one of its `aud` values is one of these.
    pub audience: Vec<String>,
    /// Asymmetric algorithms only (the configuration refuses others).
    pub algorithms: Vec<Algorithm>,
    /// Seconds of clock skew allowed on `exp` and `nbf`.
    pub leeway_secs: u64,
    /// The claim that names the token's tenant.
    pub tenant_claim: String,
}

/// The longest tenant name a claim may give (a metric label and a log
/// field).
const MAX_TENANT_BYTES: usize = 256;

/// Longest token considered: larger is refused as malformed before decoding
/// (Authentik's are under 2 KiB).
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// An algorithm the gateway can verify with a public key, by its JOSE name:
/// none for HMAC (the "key" would be a shared secret), `none` or unknown.
pub fn algorithm(name: &str) -> Option<Algorithm> {
    use Algorithm::*;
    name.parse()
        .ok()
        .filter(|a| !matches!(a, HS256 | HS384 | HS512))
}

/// Verify `token` with `keys` under `policy`; the tenant its claim names.
pub fn check(token: &str, keys: &KeySet, policy: &TokenRules) -> Result<Arc<str>, Reason> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Reason::Malformed);
    }
    let header = Header::parse(token)?;
    // `none`, HMAC and unknown names are not in the list by construction.
    let alg = algorithm(&header.alg)
        .filter(|a| policy.algorithms.contains(a))
        .ok_or(Reason::Algorithm)?;
    let key = keys.find(header.kid.as_deref(), alg)?;
    let mut validation = Validation::new(alg);
    validation.leeway = policy.leeway_secs;
    validation.validate_nbf = true;
    validation.set_issuer(&[&policy.issuer]);
    validation.set_audience(&policy.audience);
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    let claims =
        jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, key, &validation)
            .map_err(|e| reason(e.kind()))?
            .claims;
    match claims.get(&policy.tenant_claim).and_then(|v| v.as_str()) {
        Some(t) if !t.is_empty() && t.len() <= MAX_TENANT_BYTES => Ok(t.into()),
        _ => Err(Reason::TenantClaim),
    }
}

fn reason(kind: &ErrorKind) -> Reason {
    match kind {
        ErrorKind::ExpiredSignature => Reason::Expired,
        ErrorKind::ImmatureSignature => Reason::NotYetValid,
        ErrorKind::InvalidIssuer => Reason::Issuer,
        ErrorKind::InvalidAudience => Reason::Audience,
        ErrorKind::MissingRequiredClaim(claim) => match claim.as_str() {
            "iss" => Reason::Issuer,
            "aud" => Reason::Audience,
            // `exp`: a token that never expires is not one we accept.
            _ => Reason::Malformed,
        },
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => Reason::Algorithm,
        // A signature that does not verify, or cannot be parsed as one.
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::Crypto(_) => Reason::BadSignature,
        _ => Reason::Malformed,
    }
}

/// The two header fields that choose the key, read before any verification
/// so that an `alg` jsonwebtoken has no name for (`none`) is an algorithm
/// failure rather than a parse error.
#[derive(serde::Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
}

impl Header {
    fn parse(token: &str) -> Result<Header, Reason> {
        let mut parts = token.split('.');
        let (Some(header), Some(_), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Reason::Malformed);
        };
        let json = URL_SAFE_NO_PAD
            .decode(header)
            .map_err(|_| Reason::Malformed)?;
        serde_json::from_slice(&json).map_err(|_| Reason::Malformed)
    }
}

/// The policy with its keys: what the proxy asks about each token.
pub struct Verifier {
    policy: TokenRules,
    jwks: Arc<Jwks>,
}

impl Verifier {
    pub fn new(policy: TokenRules, jwks: Arc<Jwks>) -> Self {
        Verifier { policy, jwks }
    }

    /// How many keys are in force.
    pub fn keys(&self) -> usize {
        self.jwks.current().count()
    }

    /// Verify `token`; a key not (yet) in the set triggers a refetch of the
    /// JWKS (rate-limited, see `Jwks::refetch`) and one more try with what
    /// it brought, so a key rotated in at the provider is accepted at once.
    pub async fn verify(&self, token: &str) -> Result<Arc<str>, Reason> {
        let keys = self.jwks.current();
        match check(token, &keys, &self.policy) {
            Err(Reason::UnknownKey) => {
                let fresh = self.jwks.refetch(&keys).await;
                if Arc::ptr_eq(&fresh, &keys) {
                    Err(Reason::UnknownKey)
                } else {
                    check(token, &fresh, &self.policy)
                }
            }
            result => result,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
