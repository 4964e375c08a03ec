//! The provider's public keys (a JWKS): parsed into verification keys, kept
//! current, and looked up by `kid`.
//!
//! `Jwks` holds the last good key set. A refresh (on a timer, or at once
//! when a token names a key not in the set) replaces it only with a set that
//! parsed and has a usable key; a failed one keeps the old set, is counted,
//! and is logged once per streak of failures. Refetches for unknown keys are
//! single-flight (one fetch, the other requests wait for it) and at most one
//! per `REFETCH_INTERVAL`, so a flood of made-up `kid`s costs the provider
//! one request per interval.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use log::{debug, info, warn};
use tokio::time::Instant;

use super::Reason;
use crate::metrics;

/// Least time between two refetches for unknown keys.
pub const REFETCH_INTERVAL: Duration = Duration::from_secs(30);
/// Longest a fetch may take, whole: a request waiting for a refetch waits
/// at most this long.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwksError {
    #[error("not a JWKS (a JSON object with `keys`): {0}")]
    NotJwks(String),
    #[error("no usable signing key (RSA, EC P-256 or P-384, Ed25519) among {0} keys")]
    NoUsableKey(usize),
}

/// The kind of a public key, which decides the algorithms it verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rsa,
    P256,
    P384,
    Ed25519,
}

impl Kind {
    fn suits(self, alg: Algorithm) -> bool {
        use Algorithm::*;
        match self {
            Kind::Rsa => matches!(alg, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
            Kind::P256 => alg == ES256,
            Kind::P384 => alg == ES384,
            Kind::Ed25519 => alg == EdDSA,
        }
    }
}

#[derive(Clone)]
struct Key {
    kid: Option<String>,
    kind: Kind,
    /// The key's own `alg`, when the JWKS pins one.
    alg: Option<Algorithm>,
    decoding: DecodingKey,
}

impl Key {
    fn suits(&self, alg: Algorithm) -> bool {
        self.kind.suits(alg) && self.alg.is_none_or(|a| a == alg)
    }
}

/// The verification keys of one JWKS.
#[derive(Clone)]
pub struct KeySet {
    keys: Vec<Key>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<&str> = self
            .keys
            .iter()
            .map(|k| k.kid.as_deref().unwrap_or("-"))
            .collect();
        write!(f, "KeySet({})", kids.join(", "))
    }
}

impl KeySet {
    /// Parse a JWKS. Keys the gateway cannot or must not verify with are
    /// skipped: encryption keys (`use: enc`), symmetric keys (`kty: oct`:
    /// never HMAC), P-521 and anything unparsable; at least one must remain.
    pub fn parse(text: &str) -> Result<KeySet, JwksError> {
        #[derive(serde::Deserialize)]
        struct Raw {
            keys: Vec<serde_json::Value>,
        }
        let raw: Raw = serde_json::from_str(text).map_err(|e| JwksError::NotJwks(e.to_string()))?;
        let total = raw.keys.len();
        let keys: Vec<Key> = raw.keys.into_iter().filter_map(usable).collect();
        if keys.is_empty() {
            return Err(JwksError::NoUsableKey(total));
        }
        Ok(KeySet { keys })
    }

    /// How many verification keys the set holds.
    pub fn count(&self) -> usize {
        self.keys.len()
    }

    /// The key that verifies a token of `alg` with this `kid`; without a
    /// `kid`, the only key that suits `alg`.
    pub fn find(&self, kid: Option<&str>, alg: Algorithm) -> Result<&DecodingKey, Reason> {
        let key = match kid {
            Some(kid) => {
                let key = self
                    .keys
                    .iter()
                    .find(|k| k.kid.as_deref() == Some(kid))
                    .ok_or(Reason::UnknownKey)?;
                // An RSA key offered for an ES256 token, say: never try it.
                if !key.suits(alg) {
                    return Err(Reason::Algorithm);
                }
                key
            }
            None => {
                let mut suitable = self.keys.iter().filter(|k| k.suits(alg));
                match (suitable.next(), suitable.next()) {
                    (Some(key), None) => key,
                    // None, or several: which one is ambiguous.
                    _ => return Err(Reason::UnknownKey),
                }
            }
        };
        Ok(&key.decoding)
    }
}

fn usable(value: serde_json::Value) -> Option<Key> {
    let jwk: Jwk = match serde_json::from_value(value) {
        Ok(jwk) => jwk,
        Err(e) => {
            debug!("JWKS: key skipped: {e}");
            return None;
        }
    };
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let kind = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Kind::Rsa,
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => Kind::P256,
            EllipticCurve::P384 => Kind::P384,
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => Kind::Ed25519,
        _ => return None,
    };
    // A pinned `alg` that is not a signature algorithm (RSA-OAEP, HS256):
    // not a key to verify tokens with.
    let alg = match jwk.common.key_algorithm {
        Some(a) => Some(a.to_string().parse::<Algorithm>().ok()?),
        None => None,
    };
    let decoding = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id,
        kind,
        alg,
        decoding,
    })
}

/// Where a JWKS comes from when it is fetched: the URL, over the network.
#[async_trait]
pub trait Fetch: Send + Sync {
    /// The JWKS document's text.
    async fn fetch(&self) -> Result<String, String>;
    /// What is fetched, for messages: the URL.
    fn source(&self) -> &str;
}

/// The current keys, and how to get newer ones.
pub struct Jwks {
    keys: RwLock<Arc<KeySet>>,
    /// None: the keys came from a file, read at start.
    fetcher: Option<Box<dyn Fetch>>,
    /// When the last refetch for an unknown key started; its lock makes
    /// such refetches single-flight.
    last_refetch: tokio::sync::Mutex<Option<Instant>>,
    /// Whether the last refresh failed: a streak is logged once.
    failing: AtomicBool,
}

impl Jwks {
    /// Keys read from a file: never refreshed.
    pub fn fixed(keys: KeySet) -> Jwks {
        Jwks::with(keys, None)
    }

    /// Keys fetched now; an error names the source.
    pub async fn fetched(fetcher: Box<dyn Fetch>) -> Result<Jwks, String> {
        let keys = load(&*fetcher)
            .await
            .map_err(|e| format!("{}: {e}", fetcher.source()))?;
        Ok(Jwks::with(keys, Some(fetcher)))
    }

    fn with(keys: KeySet, fetcher: Option<Box<dyn Fetch>>) -> Jwks {
        Jwks {
            keys: RwLock::new(Arc::new(keys)),
            fetcher,
            last_refetch: tokio::sync::Mutex::new(None),
            failing: AtomicBool::new(false),
        }
    }

    pub fn current(&self) -> Arc<KeySet> {
        // A poisoned lock still holds a whole Arc: keep serving it.
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Fetch the JWKS and keep it if it is good; the keys in force after.
    pub async fn refresh(&self) -> Arc<KeySet> {
        let Some(fetcher) = &self.fetcher else {
            return self.current();
        };
        match load(&**fetcher).await {
            Ok(keys) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    info!(event = "jwks_refreshed", url = fetcher.source(), keys = keys.count(); "JWKS fetched again");
                }
                let keys = Arc::new(keys);
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys.clone();
                keys
            }
            Err(error) => {
                metrics::JWKS_REFRESH_FAILURES.inc();
                if !self.failing.swap(true, Ordering::Relaxed) {
                    warn!(
                        event = "jwks_refresh_failed",
                        url = fetcher.source(),
                        error = error.as_str();
                        "keeping the last good keys"
                    );
                }
                self.current()
            }
        }
    }

    /// A token named a key not in `seen`: fetch the JWKS now, unless
    /// another request already did (the keys changed since `seen`) or the
    /// last such fetch was under `REFETCH_INTERVAL` ago. The keys in force
    /// after.
    pub async fn refetch(self: &Arc<Self>, seen: &Arc<KeySet>) -> Arc<KeySet> {
        if self.fetcher.is_none() {
            return self.current();
        }
        // A task of its own: a client that leaves mid-fetch must not cancel
        // the fetch (nor free the lock) the requests behind it wait for.
        let (jwks, seen) = (self.clone(), seen.clone());
        match tokio::spawn(async move { jwks.refetch_unless_done(&seen).await }).await {
            Ok(keys) => keys,
            Err(_) => self.current(),
        }
    }

    async fn refetch_unless_done(&self, seen: &Arc<KeySet>) -> Arc<KeySet> {
        let mut last = self.last_refetch.lock().await;
        let now = self.current();
        if !Arc::ptr_eq(&now, seen) || last.is_some_and(|t| t.elapsed() < REFETCH_INTERVAL) {
            return now;
        }
        *last = Some(Instant::now());
        self.refresh().await
    }
}

async fn load(fetcher: &dyn Fetch) -> Result<KeySet, String> {
    let text = tokio::time::timeout(FETCH_TIMEOUT, fetcher.fetch())
        .await
        .map_err(|_| format!("no JWKS within {} s", FETCH_TIMEOUT.as_secs()))??;
    KeySet::parse(&text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
