use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

use serde_json::json;

use super::*;
use crate::auth::jwt::{self, Verifier};
use crate::auth::test_keys::{self, claims, TestKey};

#[test]
fn only_signature_keys_are_kept() {
    let ec = TestKey::ec("ec");
    let mut enc = ec.jwk.clone();
    enc["kid"] = json!("enc");
    enc["use"] = json!("enc");
    let text = json!({"keys": [
        ec.jwk,
        enc,
        {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
        {"kty": "EC", "kid": "p521", "crv": "P-521", "x": "AA", "y": "AA"},
        {"kty": "RSA", "kid": "oaep", "alg": "RSA-OAEP", "n": "AQAB", "e": "AQAB"},
        {"kty": "whatever"},
        "not a key",
    ]})
    .to_string();
    let set = KeySet::parse(&text).unwrap();
    assert_eq!(format!("{set:?}"), "KeySet(ec)");
    assert!(set.find(Some("ec"), Algorithm::ES256).is_ok());
    assert_eq!(
        set.find(Some("hmac"), Algorithm::ES256).err(),
        Some(Reason::UnknownKey)
    );
    assert_eq!(
        set.find(Some("ec"), Algorithm::ES384).err(),
        Some(Reason::Algorithm)
    );

    assert_eq!(
        KeySet::parse(r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).unwrap_err(),
        JwksError::NoUsableKey(1)
    );
    assert!(matches!(
        KeySet::parse("<html>"),
        Err(JwksError::NotJwks(_))
    ));
    assert!(matches!(
        KeySet::parse(r#"{"kids": []}"#),
        Err(JwksError::NotJwks(_))
    ));
}

#[test]
fn a_pinned_alg_is_the_only_one_its_key_verifies() {
    let mut key = TestKey::ec("ec").jwk;
    key["alg"] = json!("ES256");
    let set = KeySet::parse(&json!({"keys": [key]}).to_string()).unwrap();
    assert!(set.find(Some("ec"), Algorithm::ES256).is_ok());
    assert_eq!(
        set.find(None, Algorithm::ES384).err(),
        Some(Reason::UnknownKey)
    );
}

/// A provider whose JWKS the test sets; counts fetches; fails when told.
struct FakeProvider {
    jwks: Mutex<Result<String, String>>,
    fetches: AtomicUsize,
    delay: Duration,
}

#[async_trait]
impl Fetch for Arc<FakeProvider> {
    async fn fetch(&self) -> Result<String, String> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.jwks.lock().unwrap().clone()
    }

    fn source(&self) -> &str {
        "fake://jwks"
    }
}

fn provider(keys: &[&TestKey], delay: Duration) -> Arc<FakeProvider> {
    Arc::new(FakeProvider {
        jwks: Mutex::new(Ok(test_keys::jwks(keys))),
        fetches: AtomicUsize::new(0),
        delay,
    })
}

impl FakeProvider {
    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

#[tokio::test(start_paused = true)]
async fn unknown_keys_refetch_once_per_interval_and_single_flight() {
    let old = TestKey::ec("old");
    let new = TestKey::ec("new");
    let p = provider(&[&old], Duration::from_millis(100));
    let jwks = Arc::new(Jwks::fetched(Box::new(p.clone())).await.unwrap());
    let verifier = Arc::new(Verifier::new(jwt::tests::policy(), jwks.clone()));
    assert_eq!(p.fetches(), 1);

    // The provider rotates; ten requests with the new key at once: one
    // fetch, and every one of them accepted.
    *p.jwks.lock().unwrap() = Ok(test_keys::jwks(&[&new]));
    let token = new.sign(&claims());
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (v, t) = (verifier.clone(), token.clone());
            tokio::spawn(async move { v.verify(&t).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok("user-1".into()));
    }
    assert_eq!(p.fetches(), 2);

    // Made-up kids within the interval: no fetch.
    let stranger = TestKey::ec("stranger").sign(&claims());
    assert_eq!(verifier.verify(&stranger).await, Err(Reason::UnknownKey));
    tokio::time::advance(REFETCH_INTERVAL - Duration::from_secs(1)).await;
    assert_eq!(verifier.verify(&stranger).await, Err(Reason::UnknownKey));
    assert_eq!(p.fetches(), 2);
    // After it: one more.
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(verifier.verify(&stranger).await, Err(Reason::UnknownKey));
    assert_eq!(p.fetches(), 3);
    // The old key is gone with the rotation.
    assert_eq!(
        verifier.verify(&old.sign(&claims())).await,
        Err(Reason::UnknownKey)
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_leaving_mid_refetch_does_not_cancel_it() {
    let (old, new) = (TestKey::ed("old"), TestKey::ed("new"));
    let p = provider(&[&old], Duration::from_millis(100));
    let jwks = Arc::new(Jwks::fetched(Box::new(p.clone())).await.unwrap());
    let verifier = Arc::new(Verifier::new(jwt::tests::policy(), jwks.clone()));
    *p.jwks.lock().unwrap() = Ok(test_keys::jwks(&[&new]));
    let token = new.sign(&claims());
    let (v, t) = (verifier.clone(), token.clone());
    let leaving = tokio::spawn(async move { v.verify(&t).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    leaving.abort();
    // The next request waits for the same fetch and is accepted.
    assert_eq!(verifier.verify(&token).await, Ok("user-1".into()));
    assert_eq!(p.fetches(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failed_refresh_keeps_the_last_good_keys() {
    let key = TestKey::ed("ed");
    let p = provider(&[&key], Duration::ZERO);
    let jwks = Jwks::fetched(Box::new(p.clone())).await.unwrap();
    let before = jwks.current();
    for bad in [
        Err("connection refused".to_string()),
        Ok("{}".into()),
        Ok(r#"{"keys": []}"#.into()),
    ] {
        *p.jwks.lock().unwrap() = bad;
        assert!(Arc::ptr_eq(&jwks.refresh().await, &before));
        assert!(jwks.failing.load(Ordering::Relaxed));
    }
    // A provider that hangs: the refresh gives up after FETCH_TIMEOUT.
    let slow = provider(&[&key], FETCH_TIMEOUT * 2);
    let started = Instant::now();
    let err = Jwks::fetched(Box::new(slow)).await.err().unwrap();
    assert_eq!(started.elapsed(), FETCH_TIMEOUT);
    assert_eq!(err, "fake://jwks: no JWKS within 5 s");

    *p.jwks.lock().unwrap() = Ok(test_keys::jwks(&[&key]));
    assert!(!Arc::ptr_eq(&jwks.refresh().await, &before));
    assert!(!jwks.failing.load(Ordering::Relaxed));
}

#[tokio::test]
async fn a_start_up_failure_names_the_source() {
    let p = provider(&[], Duration::ZERO);
    *p.jwks.lock().unwrap() = Err("HTTP status 404".into());
    let err = Jwks::fetched(Box::new(p)).await.err().unwrap();
    assert_eq!(err, "fake://jwks: HTTP status 404");
}

#[tokio::test]
async fn keys_from_a_file_are_never_refetched() {
    let key = TestKey::ec("k");
    let jwks = Arc::new(Jwks::fixed(
        KeySet::parse(&test_keys::jwks(&[&key])).unwrap(),
    ));
    let seen = jwks.current();
    assert!(Arc::ptr_eq(&jwks.refetch(&seen).await, &seen));
    assert!(Arc::ptr_eq(&jwks.refresh().await, &seen));
}
