//! Test keys made at test time (nothing secret is committed): RSA, EC P-256
//! and Ed25519 signing keys, their JWKS entries, and tokens signed with
//! them. Used by the unit tests and, through `#[path]`, by the integration
//! tests.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::traits::PublicKeyParts;
use serde_json::{json, Value};

pub const ISSUER: &str = "https://auth.test/application/o/poimen/";
pub const AUDIENCE: &str = "poimen-gateway";

/// A signing key with its `kid`, `alg` and public JWK.
pub struct TestKey {
    pub kid: String,
    pub alg: Algorithm,
    encoding: EncodingKey,
    /// The public key as a JWK.
    pub jwk: Value,
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

impl TestKey {
    /// A fresh RSA 2048 key (RS256).
    pub fn rsa(kid: &str) -> TestKey {
        let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).expect("RSA key");
        let der = key.to_pkcs1_der().expect("PKCS#1 DER");
        TestKey {
            kid: kid.into(),
            alg: Algorithm::RS256,
            encoding: EncodingKey::from_rsa_der(der.as_bytes()),
            jwk: json!({
                "kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
                "n": b64(&key.n().to_bytes_be()), "e": b64(&key.e().to_bytes_be()),
            }),
        }
    }

    /// A fresh EC P-256 key (ES256).
    pub fn ec(kid: &str) -> TestKey {
        let rng = SystemRandom::new();
        let alg = &ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("EC key");
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("EC key");
        // Uncompressed point: 0x04, x, y.
        let point = pair.public_key().as_ref();
        TestKey {
            kid: kid.into(),
            alg: Algorithm::ES256,
            encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({
                "kty": "EC", "kid": kid, "crv": "P-256",
                "x": b64(&point[1..33]), "y": b64(&point[33..65]),
            }),
        }
    }

    /// A fresh Ed25519 key (EdDSA).
    pub fn ed(kid: &str) -> TestKey {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("Ed25519 key");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("Ed25519 key");
        TestKey {
            kid: kid.into(),
            alg: Algorithm::EdDSA,
            encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwk: json!({
                "kty": "OKP", "kid": kid, "crv": "Ed25519",
                "x": b64(pair.public_key().as_ref()),
            }),
        }
    }

    /// `claims` signed with this key, its `kid` in the header.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with(Some(&self.kid), claims)
    }

    /// `claims` signed with this key, with `kid` (or none) in the header.
    pub fn sign_with(&self, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = kid.map(str::to_string);
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("signing")
    }
}

/// A JWKS of these keys' public halves.
pub fn jwks(keys: &[&TestKey]) -> String {
    let keys: Vec<&Value> = keys.iter().map(|k| &k.jwk).collect();
    json!({ "keys": keys }).to_string()
}

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64
}

/// Good claims: the test issuer and audience, expiring in an hour.
pub fn claims() -> Value {
    json!({ "iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "exp": now() + 3600 })
}

/// `claims()` with `changes` merged in (a null removes a claim).
pub fn claims_with(changes: Value) -> Value {
    let mut c = claims();
    for (k, v) in changes.as_object().expect("an object") {
        if v.is_null() {
            c.as_object_mut().expect("an object").remove(k);
        } else {
            c[k] = v.clone();
        }
    }
    c
}

/// A token with any header, `claims`, and `signature` as given (unsigned
/// forgeries: `alg: none`, HMAC, tampering).
pub fn forge(header: &Value, claims: &Value, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes()),
        b64(signature)
    )
}

/// `token` with its payload replaced by `claims`, signature kept.
pub fn tamper(token: &str, claims: &Value) -> String {
    let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
    parts[1] = b64(claims.to_string().as_bytes());
    parts.join(".")
}

/// An HS256 token whose HMAC key is the public key's JWK text: the classic
/// algorithm confusion attack on verifiers that take `alg` from the token.
pub fn hs256_with_public_key(key: &TestKey, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(key.kid.clone());
    let secret = key.jwk.to_string();
    jsonwebtoken::encode(
        &header,
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("signing")
}
