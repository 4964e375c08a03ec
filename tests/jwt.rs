//! JWT bearer tokens against the real binary: keys made at test time, the
//! JWKS served by a fake provider on loopback (a `FakeBackend` answering
//! with the JWKS, which counts every fetch).

use serde_json::json;

use crate::support::gateway::{check_config, one_model, temp_dir};
use crate::support::test_keys::{
    self, claims, claims_with, forge, hs256_with_public_key, jwks, now, tamper, TestKey,
};
use crate::support::{client, eventually, get, header, FakeBackend, Gateway, Reply};

const REASONS: [&str; 9] = [
    "missing",
    "malformed",
    "bad_signature",
    "expired",
    "not_yet_valid",
    "issuer",
    "audience",
    "unknown_key",
    "algorithm",
];

/// A fake OIDC provider serving `keys` as its JWKS.
async fn provider(keys: &[&TestKey]) -> FakeBackend {
    let idp = FakeBackend::start().await;
    serve(&idp, keys);
    idp
}

fn serve(idp: &FakeBackend, keys: &[&TestKey]) {
    idp.set_reply(Reply::Json {
        body: jwks(keys),
        headers: Vec::new(),
    });
}

/// `auth.jwt` with the JWKS at `idp`, refreshed every `refresh_secs`.
fn jwt_url(idp: &FakeBackend, refresh_secs: u64) -> String {
    format!(
        "  auth:\n    jwt:\n      issuer: \"{}\"\n      audience: {}\n      \
         jwks_url: \"http://{}/application/o/poimen/jwks/\"\n      \
         algorithms: [RS256, ES256, EdDSA]\n      leeway_secs: 30\n      \
         jwks_refresh_secs: {refresh_secs}\n",
        test_keys::ISSUER,
        test_keys::AUDIENCE,
        idp.addr
    )
}

async fn post(gw: &Gateway, authorization: Option<&str>) -> reqwest::Response {
    let mut req = client()
        .post(gw.url("/v1/chat/completions"))
        .body(crate::support::chat_body("m", "hi"));
    if let Some(a) = authorization {
        req = req.header("Authorization", a);
    }
    req.send().await.unwrap()
}

async fn bearer(gw: &Gateway, token: &str) -> u16 {
    post(gw, Some(&format!("Bearer {token}")))
        .await
        .status()
        .as_u16()
}

async fn failures(gw: &Gateway) -> Vec<(&'static str, f64)> {
    let text = gw.metrics_text().await;
    REASONS
        .iter()
        .map(|r| {
            let v = crate::support::metrics::sample(
                &text,
                "poimen_gateway_auth_failures_total",
                &[("reason", r)],
            );
            (*r, v.unwrap_or_else(|| panic!("series for {r} missing")))
        })
        .collect()
}

fn expect(counts: &[(&'static str, f64)]) -> Vec<(&'static str, f64)> {
    REASONS
        .iter()
        .map(|r| (*r, counts.iter().find(|(n, _)| n == r).map_or(0.0, |c| c.1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_refusal_is_a_401_with_its_reason_counted_and_no_token_logged() {
    let (rsa, ec, ed) = (
        TestKey::rsa("rsa-1"),
        TestKey::ec("ec-1"),
        TestKey::ed("ed-1"),
    );
    let idp = provider(&[&rsa, &ec, &ed]).await;
    let b = FakeBackend::start().await;
    let gw = Gateway::start_logging(
        &format!("{}{}", jwt_url(&idp, 3600), one_model("m", &[b.addr])),
        "debug",
    )
    .await;
    assert_eq!(
        failures(&gw).await,
        expect(&[]),
        "all at zero before any request"
    );

    let good: Vec<String> = [&rsa, &ec, &ed].iter().map(|k| k.sign(&claims())).collect();
    for token in &good {
        assert_eq!(bearer(&gw, token).await, 200);
    }
    let t = now();
    let other = TestKey::ec("not-in-the-jwks");
    let refused: Vec<(String, &str)> = vec![
        ("not-a-jwt".into(), "malformed"),
        (rsa.sign(&claims_with(json!({"exp": null}))), "malformed"),
        (
            tamper(&good[0], &claims_with(json!({"sub": "admin"}))),
            "bad_signature",
        ),
        (rsa.sign(&claims_with(json!({"exp": t - 120}))), "expired"),
        (
            ec.sign(&claims_with(json!({"nbf": t + 120}))),
            "not_yet_valid",
        ),
        (
            ed.sign(&claims_with(json!({"iss": "https://evil.test/"}))),
            "issuer",
        ),
        (
            rsa.sign(&claims_with(json!({"aud": "another-app"}))),
            "audience",
        ),
        (other.sign(&claims()), "unknown_key"),
        (
            forge(&json!({"alg": "none", "kid": "rsa-1"}), &claims(), b""),
            "algorithm",
        ),
        (hs256_with_public_key(&rsa, &claims()), "algorithm"),
        (ec.sign_with(Some("rsa-1"), &claims()), "algorithm"),
    ];
    for (token, reason) in &refused {
        let resp = post(&gw, Some(&format!("Bearer {token}"))).await;
        assert_eq!(resp.status(), 401, "{reason}");
        assert_eq!(
            header(&resp, "www-authenticate"),
            "Bearer error=\"invalid_token\""
        );
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(reason),
            "{v}"
        );
    }
    for missing in [None, Some("Basic dXNlcjpwdw==")] {
        let resp = post(&gw, missing).await;
        assert_eq!(resp.status(), 401);
        assert_eq!(header(&resp, "www-authenticate"), "Bearer");
    }
    assert_eq!(get(&gw, "/v1/models").await.status(), 401);
    assert_eq!(
        get(&gw, "/health").await.status(),
        200,
        "/health stays open"
    );

    assert_eq!(b.count(), 3, "only the good tokens reached the backend");
    assert_eq!(
        failures(&gw).await,
        expect(&[
            ("missing", 3.0),
            ("malformed", 2.0),
            ("bad_signature", 1.0),
            ("expired", 1.0),
            ("not_yet_valid", 1.0),
            ("issuer", 1.0),
            ("audience", 1.0),
            ("unknown_key", 1.0),
            ("algorithm", 3.0),
        ])
    );
    // Start-up, and the unknown key's refetch.
    assert_eq!(idp.count(), 2);
    // Lines reach stderr through the log writer: wait for them all.
    let auth_lines = || {
        gw.log_lines()
            .into_iter()
            .filter(|l| l["event"] == "auth_failed")
            .count()
    };
    let expected = refused.len() + 3;
    eventually("every refusal logged", || async {
        auth_lines() >= expected
    })
    .await;
    assert_eq!(auth_lines(), expected);
    let logged = gw.stderr();
    for token in good.iter().chain(refused.iter().map(|(t, _)| t)) {
        // Even its signature alone.
        let signature = token.rsplit('.').next().unwrap();
        assert!(!logged.contains(token.as_str()), "a token was logged");
        assert!(
            signature.len() < 8 || !logged.contains(signature),
            "a signature was logged"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_key_is_fetched_when_first_seen_and_refetches_are_rate_limited() {
    let old = TestKey::rsa("2024");
    let idp = provider(&[&old]).await;
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&format!(
        "{}{}",
        jwt_url(&idp, 3600),
        one_model("m", &[b.addr])
    ))
    .await;
    assert_eq!(bearer(&gw, &old.sign(&claims())).await, 200);
    assert_eq!(idp.count(), 1);

    // The provider rotates: the new key is accepted without a restart.
    let new = TestKey::ec("2025");
    serve(&idp, &[&new]);
    let token = new.sign(&claims());
    let started = std::time::Instant::now();
    assert_eq!(bearer(&gw, &token).await, 200);
    let with_refetch = started.elapsed();
    assert_eq!(idp.count(), 2);
    let started = std::time::Instant::now();
    assert_eq!(bearer(&gw, &token).await, 200);
    eprintln!(
        "rotation: first request with the new key (waits for the refetch) {:.1} ms, the next {:.1} ms",
        with_refetch.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64() * 1e3
    );
    // Within 30 s, made-up kids cause no fetch; the rotated-out key is gone.
    for _ in 0..5 {
        assert_eq!(
            bearer(&gw, &TestKey::ec("made-up").sign(&claims())).await,
            401
        );
    }
    assert_eq!(bearer(&gw, &old.sign(&claims())).await, 401);
    assert_eq!(idp.count(), 2, "refetches at most every 30 s");
    assert_eq!(failures(&gw).await, expect(&[("unknown_key", 6.0)]));
    assert_eq!(b.count(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_refresh_keeps_the_last_good_keys() {
    let key = TestKey::ed("ed-1");
    let mut idp = provider(&[&key]).await;
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&format!(
        "{}{}",
        jwt_url(&idp, 1),
        one_model("m", &[b.addr])
    ))
    .await;
    let token = key.sign(&claims());
    assert_eq!(bearer(&gw, &token).await, 200);
    assert_eq!(
        gw.metric("poimen_gateway_jwks_refresh_failures_total", &[])
            .await,
        0.0
    );

    idp.stop();
    eventually("two failed refreshes", || async {
        gw.metric("poimen_gateway_jwks_refresh_failures_total", &[])
            .await
            >= 2.0
    })
    .await;
    assert_eq!(bearer(&gw, &token).await, 200, "the last good keys stay");
    let warned = |gw: &Gateway, event: &str| {
        gw.log_lines()
            .iter()
            .filter(|l| l["event"] == event)
            .count()
    };
    assert_eq!(warned(&gw, "jwks_refresh_failed"), 1, "once per streak");
    let line = gw
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "jwks_refresh_failed")
        .unwrap();
    assert_eq!(line["level"], "WARN");
    assert!(line["url"]
        .as_str()
        .unwrap()
        .contains(&idp.addr.to_string()));

    // A garbage answer is a failure too; then the provider recovers with a
    // second key, which the periodic refresh brings in.
    idp.restart().await;
    idp.set_reply(Reply::Json {
        body: "<html>oops</html>".into(),
        headers: Vec::new(),
    });
    let before = gw
        .metric("poimen_gateway_jwks_refresh_failures_total", &[])
        .await;
    eventually("a failed refresh on garbage", || async {
        gw.metric("poimen_gateway_jwks_refresh_failures_total", &[])
            .await
            > before
    })
    .await;
    let second = TestKey::rsa("rsa-2");
    serve(&idp, &[&key, &second]);
    eventually("the refresh recovered", || async {
        warned(&gw, "jwks_refreshed") == 1
    })
    .await;
    let fetches = idp.count();
    assert_eq!(bearer(&gw, &second.sign(&claims())).await, 200);
    assert_eq!(bearer(&gw, &token).await, 200);
    assert!(
        idp.count() <= fetches + 1,
        "no refetch needed for a known key"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn api_keys_and_jwts_side_by_side() {
    let dir = temp_dir();
    let (keys, jwks_file) = (dir.join("keys"), dir.join("jwks.json"));
    std::fs::write(&keys, "client-key-1\n").unwrap();
    let ed = TestKey::ed("ed-1");
    std::fs::write(&jwks_file, jwks(&[&ed])).unwrap();
    let b = FakeBackend::start().await;
    let gw = Gateway::start(&format!(
        "  auth:\n    api_keys_file: \"{}\"\n    jwt: {{issuer: \"{}\", audience: {}, \
         jwks_file: \"{}\", algorithms: [EdDSA]}}\n{}",
        keys.display(),
        test_keys::ISSUER,
        test_keys::AUDIENCE,
        jwks_file.display(),
        one_model("m", &[b.addr])
    ))
    .await;
    assert_eq!(bearer(&gw, "client-key-1").await, 200);
    assert_eq!(bearer(&gw, &ed.sign(&claims())).await, 200);
    // Neither a known key nor a JWT: malformed.
    assert_eq!(bearer(&gw, "client-key-2").await, 401);
    assert_eq!(
        bearer(&gw, &ed.sign(&claims_with(json!({"aud": "x"})))).await,
        401
    );
    // EdDSA only: an RSA token is refused before any key is looked up.
    let rsa = TestKey::rsa("rsa-1");
    assert_eq!(bearer(&gw, &rsa.sign(&claims())).await, 401);
    assert_eq!(post(&gw, None).await.status(), 401);
    assert_eq!(
        failures(&gw).await,
        expect(&[
            ("malformed", 1.0),
            ("audience", 1.0),
            ("algorithm", 1.0),
            ("missing", 1.0)
        ])
    );
    assert_eq!(b.count(), 2);
    assert!(b
        .seen()
        .iter()
        .all(|s| s.headers.get("authorization").is_none()));
    // A file's keys are never fetched: no refresh metric.
    assert!(!gw.metrics_text().await.contains("jwks_refresh_failures"));
}

#[tokio::test(flavor = "multi_thread")]
async fn without_its_keys_the_gateway_does_not_start() {
    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yaml = |url: &str, algs: &str| {
        format!(
            "gateway:\n  auth:\n    jwt: {{issuer: \"{}\", audience: [a], jwks_url: \"{url}\", algorithms: {algs}}}\n{}",
            test_keys::ISSUER,
            one_model("m", &[closed])
        )
    };
    let url = format!("http://{closed}/jwks/");
    let out = check_config(&yaml(&url, "[RS256]"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("gateway.auth.jwt: {url}: ")),
        "{stderr}"
    );

    // Started for real, it exits too (waited for with a deadline: a
    // regression must fail the test, not hang it).
    let dir = temp_dir();
    let path = dir.join("gateway.yaml");
    std::fs::write(&path, yaml(&url, "[RS256]")).unwrap();
    let mut child = std::process::Command::new(crate::support::gateway::BIN)
        .arg("-c")
        .arg(&path)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the gateway started without its keys");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(2));
    assert!(
        stderr.contains(&format!("gateway.auth.jwt: {url}: ")),
        "{stderr}"
    );

    let idp = provider(&[&TestKey::ec("ec-1")]).await;
    let out = check_config(&yaml(&format!("http://{}/jwks/", idp.addr), "[ES256]"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("JWKS: 1 keys"), "{stdout}");

    // https to a server that speaks plain HTTP: the handshake fails, there
    // is no falling back to http.
    let https = format!("https://{}/jwks/", idp.addr);
    let out = check_config(&yaml(&https, "[ES256]"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("gateway.auth.jwt: {https}: ")),
        "{stderr}"
    );
    assert!(stderr.contains("TLS"), "{stderr}");

    for (url, algs, want) in [
        (
            "http://auth.example.org/jwks/",
            "[RS256]",
            "gateway.auth.jwt.jwks_url",
        ),
        (
            url.as_str(),
            "[HS256]",
            "gateway.auth.jwt.algorithms[0] = \"HS256\"",
        ),
        (
            url.as_str(),
            "[none]",
            "gateway.auth.jwt.algorithms[0] = \"none\"",
        ),
    ] {
        let out = check_config(&yaml(url, algs));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url} {algs}");
        assert!(stderr.contains(want), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_provider_is_verified_against_the_ca_file() {
    let ca = crate::support::certs::TestCa::new("provider CA");
    let key = TestKey::ec("ec-tls");
    let idp = FakeBackend::start_tls(ca.leaf(&["127.0.0.1"]).server_config()).await;
    serve(&idp, &[&key]);
    let dir = temp_dir();
    let ca_file = ca.write(&dir, "provider-ca.pem");
    let b = FakeBackend::start().await;
    let jwt = |ca_file: &str| {
        format!(
            "  auth:\n    jwt:\n      issuer: \"{}\"\n      audience: {}\n      \
             jwks_url: \"https://127.0.0.1:{}/application/o/poimen/jwks/\"\n      \
             algorithms: [ES256]\n{ca_file}",
            test_keys::ISSUER,
            test_keys::AUDIENCE,
            idp.addr.port()
        )
    };

    // The system's store does not know the test CA: no keys, no start.
    let untrusted = check_config(&format!(
        "gateway:\n{}{}",
        jwt(""),
        one_model("m", &[b.addr])
    ));
    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    assert!(!untrusted.status.success());
    assert!(
        stderr.contains("gateway.auth.jwt: https://127.0.0.1:"),
        "{stderr}"
    );
    assert!(stderr.contains("TLS"), "{stderr}");
    assert_eq!(idp.count(), 0, "the handshake failed before any request");

    let trusted = format!("      ca_file: \"{}\"\n", ca_file.display());
    let gw = Gateway::start(&format!("{}{}", jwt(&trusted), one_model("m", &[b.addr]))).await;
    assert_eq!(bearer(&gw, &key.sign(&claims())).await, 200);
    assert_eq!(b.count(), 1);
    assert_eq!(idp.count(), 1, "fetched once, at start, over TLS");
}
