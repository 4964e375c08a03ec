use std::sync::LazyLock;

use serde_json::{json, Value};

use super::*;
use crate::auth::test_keys::{self, claims, claims_with, forge, now, tamper, TestKey};

/// Made once: RSA generation takes a moment.
static RSA: LazyLock<TestKey> = LazyLock::new(|| TestKey::rsa("rsa-1"));
static RSA_2: LazyLock<TestKey> = LazyLock::new(|| TestKey::rsa("rsa-2"));
static EC: LazyLock<TestKey> = LazyLock::new(|| TestKey::ec("ec-1"));
static ED: LazyLock<TestKey> = LazyLock::new(|| TestKey::ed("ed-1"));

pub(crate) fn policy() -> TokenRules {
    TokenRules {
        issuer: test_keys::ISSUER.into(),
        audience: vec!["other".into(), test_keys::AUDIENCE.into()],
        algorithms: vec![Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA],
        leeway_secs: 30,
        tenant_claim: "sub".into(),
    }
}

fn all_keys() -> KeySet {
    KeySet::parse(&test_keys::jwks(&[&RSA, &EC, &ED])).unwrap()
}

fn verdict(token: &str) -> Result<(), Reason> {
    check(token, &all_keys(), &policy()).map(|_| ())
}

#[test]
fn each_key_type_verifies_its_tokens() {
    for key in [&*RSA, &*EC, &*ED] {
        assert_eq!(verdict(&key.sign(&claims())), Ok(()), "{}", key.kid);
    }
}

#[test]
fn claims_are_checked_with_leeway() {
    let t = now();
    let cases: [(Value, Result<(), Reason>); 13] = [
        (json!({"exp": t - 60}), Err(Reason::Expired)),
        (json!({"exp": t - 10}), Ok(())),
        (json!({"nbf": t + 120}), Err(Reason::NotYetValid)),
        (json!({"nbf": t + 10}), Ok(())),
        (json!({"iss": "https://evil.test/"}), Err(Reason::Issuer)),
        (json!({"iss": null}), Err(Reason::Issuer)),
        (json!({"aud": "someone-else"}), Err(Reason::Audience)),
        (json!({"aud": ["x", test_keys::AUDIENCE]}), Ok(())),
        (json!({"aud": null}), Err(Reason::Audience)),
        // A token that never expires is not accepted.
        (json!({"exp": null}), Err(Reason::Malformed)),
        (json!({"exp": "tomorrow"}), Err(Reason::Malformed)),
        (json!({"extra": {"any": "thing"}}), Ok(())),
        // The tenant claim must be a string.
        (json!({"sub": 42}), Err(Reason::TenantClaim)),
    ];
    for (changes, expected) in cases {
        let token = RSA.sign(&claims_with(changes.clone()));
        assert_eq!(verdict(&token), expected, "{changes}");
    }
}

#[test]
fn signatures_must_verify() {
    let token = RSA.sign(&claims());
    let tampered = tamper(&token, &claims_with(json!({"sub": "admin"})));
    assert_eq!(verdict(&tampered), Err(Reason::BadSignature));
    // Another RSA key's signature under rsa-1's kid.
    let impostor = RSA_2.sign_with(Some("rsa-1"), &claims());
    assert_eq!(verdict(&impostor), Err(Reason::BadSignature));
    let (head, _) = token.rsplit_once('.').unwrap();
    assert_eq!(verdict(&format!("{head}.")), Err(Reason::BadSignature));
    assert_eq!(verdict(&format!("{head}.!!")), Err(Reason::Malformed));
}

#[test]
fn algorithms_are_never_chosen_by_the_token() {
    let none = forge(&json!({"alg": "none", "kid": "rsa-1"}), &claims(), b"");
    assert_eq!(verdict(&none), Err(Reason::Algorithm));
    let hs = test_keys::hs256_with_public_key(&RSA, &claims());
    assert_eq!(verdict(&hs), Err(Reason::Algorithm));
    // An allowed algorithm, but not the named key's type: ES256 with the
    // RSA key's kid.
    let mixed = EC.sign_with(Some("rsa-1"), &claims());
    assert_eq!(verdict(&mixed), Err(Reason::Algorithm));
    // Not in `algorithms`.
    let mut only_rsa = policy();
    only_rsa.algorithms = vec![Algorithm::RS256];
    assert_eq!(
        check(&EC.sign(&claims()), &all_keys(), &only_rsa),
        Err(Reason::Algorithm)
    );
    for alg in ["ES512", "RS1", "", "HS512"] {
        let t = forge(&json!({"alg": alg, "kid": "rsa-1"}), &claims(), b"sig");
        assert_eq!(verdict(&t), Err(Reason::Algorithm), "{alg}");
    }
    assert_eq!(algorithm("HS256"), None);
    assert_eq!(algorithm("none"), None);
    assert_eq!(algorithm("EdDSA"), Some(Algorithm::EdDSA));
}

#[test]
fn keys_are_found_by_kid_or_by_type() {
    let unknown = RSA.sign_with(Some("rotated-away"), &claims());
    assert_eq!(verdict(&unknown), Err(Reason::UnknownKey));
    // No kid: the only key of the type.
    assert_eq!(verdict(&EC.sign_with(None, &claims())), Ok(()));
    assert_eq!(verdict(&RSA.sign_with(None, &claims())), Ok(()));
    // No kid and two RSA keys: ambiguous.
    let two = KeySet::parse(&test_keys::jwks(&[&RSA, &RSA_2])).unwrap();
    assert_eq!(
        check(&RSA.sign_with(None, &claims()), &two, &policy()),
        Err(Reason::UnknownKey)
    );
    assert_eq!(
        check(&RSA_2.sign(&claims()), &two, &policy()),
        Ok("user-1".into())
    );
}

#[test]
fn garbage_is_malformed_never_a_panic() {
    let big = "a".repeat(MAX_TOKEN_BYTES + 1);
    for token in [
        "",
        "abc",
        "a.b",
        "a.b.c.d",
        "!!.b.c",
        &big,
        // Header JSON without alg, and one that is not an object.
        &forge(&json!({"kid": "rsa-1"}), &claims(), b"x"),
        &forge(&json!(["RS256"]), &claims(), b"x"),
        &forge(&json!({"alg": "RS256", "kid": 7}), &claims(), b"x"),
    ] {
        assert_eq!(verdict(token), Err(Reason::Malformed), "{token:.40}");
    }
    // A payload that is not JSON, signed properly.
    let (head, _) = RSA
        .sign(&claims())
        .split_once('.')
        .map(|(h, p)| (h.to_string(), p.to_string()))
        .unwrap();
    let not_json = format!("{head}.bm90IGpzb24.c2ln");
    assert!(verdict(&not_json).is_err());
}

#[test]
fn the_tenant_is_the_configured_claim() {
    let token = RSA.sign(&claims_with(json!({"preferred_username": "alice"})));
    assert_eq!(check(&token, &all_keys(), &policy()), Ok("user-1".into()));
    let by_name = TokenRules {
        tenant_claim: "preferred_username".into(),
        ..policy()
    };
    assert_eq!(check(&token, &all_keys(), &by_name), Ok("alice".into()));
    let without = RSA.sign(&claims());
    assert_eq!(
        check(&without, &all_keys(), &by_name),
        Err(Reason::TenantClaim)
    );
    let long = RSA.sign(&claims_with(json!({"sub": "x".repeat(257)})));
    assert_eq!(
        check(&long, &all_keys(), &policy()),
        Err(Reason::TenantClaim)
    );
}
