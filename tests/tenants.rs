//! Tenants against the real binary: who a request is for (a named API key, a
//! JWT claim, a trusted header), a fair share of a backend's slots and queue
//! places while another tenant floods, budgets answered 429 with
//! `Retry-After`, and bounded label values.

use std::time::Duration;

use serde_json::json;

use crate::support::gateway::temp_dir;
use crate::support::test_keys::{self, claims_with, jwks, TestKey};
use crate::support::{chat_body, client, eventually, FakeBackend, Gateway, Reply};

/// One model `m` on `b`, with `extra` gateway keys.
fn config(b: &FakeBackend, extra: &str) -> String {
    format!(
        "{extra}  models:\n    - name: m\n      address: \"{}\"\n",
        b.addr
    )
}

/// A chat request with `headers`; its status and `Retry-After`.
async fn send(
    gw: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String, serde_json::Value) {
    let mut req = client().post(gw.url(path)).body(chat_body("m", "hi"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let retry = crate::support::header(&resp, "retry-after");
    (status, retry, resp.json().await.unwrap_or_default())
}

fn tenant_metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    crate::support::metrics::sample(text, name, labels).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn named_keys_and_a_jwt_claim_name_the_tenant() {
    let b = FakeBackend::start().await;
    let key = TestKey::ec("ec-1");
    let dir = temp_dir();
    std::fs::write(dir.join("keys"), "alice:alice-key\nplain-key\n").unwrap();
    std::fs::write(dir.join("jwks.json"), jwks(&[&key])).unwrap();
    let auth = format!(
        "  auth:\n    api_keys_file: \"{}\"\n    jwt:\n      issuer: \"{}\"\n      audience: {}\n      jwks_file: \"{}\"\n      algorithms: [ES256]\n      tenant_claim: preferred_username\n",
        dir.join("keys").display(),
        test_keys::ISSUER,
        test_keys::AUDIENCE,
        dir.join("jwks.json").display(),
    );
    let gw = Gateway::start(&config(&b, &auth)).await;
    let token = key.sign(&claims_with(json!({"preferred_username": "carol"})));
    let bearer = format!("Bearer {token}");
    let unnamed = key.sign(&claims_with(json!({})));
    for (auth, want) in [
        (("x-api-key", "alice-key"), 200),
        (("authorization", "Bearer alice-key"), 200),
        (("authorization", "Bearer plain-key"), 200),
        (("authorization", bearer.as_str()), 200),
        // A valid token without the tenant claim.
        (("authorization", &*format!("Bearer {unnamed}")), 401),
    ] {
        let (status, _, _) = send(&gw, "/v1/chat/completions", &[auth]).await;
        assert_eq!(status, want, "{auth:?}");
    }
    let text = gw.metrics_text().await;
    let requests = |t| {
        tenant_metric(
            &text,
            "poimen_gateway_tenant_requests_total",
            &[("tenant", t), ("model", "m"), ("code", "200")],
        )
    };
    assert_eq!(
        (requests("alice"), requests("default"), requests("carol")),
        (2.0, 1.0, 1.0)
    );
    let refused = tenant_metric(
        &text,
        "poimen_gateway_auth_failures_total",
        &[("reason", "tenant_claim")],
    );
    assert_eq!(refused, 1.0);
    // The log is written by a thread of its own: wait for the 4th line.
    eventually("4 prefix_cache lines", || async {
        gw.cache_lines().len() == 4
    })
    .await;
    let tenants: Vec<_> = gw
        .cache_lines()
        .iter()
        .map(|l| l["tenant"].clone())
        .collect();
    assert_eq!(tenants, ["alice", "alice", "default", "carol"]);
    // The credential stays with the gateway.
    assert!(b
        .seen()
        .iter()
        .all(|s| s.headers.get("x-api-key").is_none()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_does_not_refuse_a_tenant_within_its_share() {
    let b = FakeBackend::start().await;
    b.set_delay(Duration::from_millis(600));
    let extra =
        "  scheduler: {max_num_seqs: 2, max_queue_depth: 4}\n  tenants: {header: X-Tenant}\n";
    let gw = std::sync::Arc::new(Gateway::start(&config(&b, extra)).await);
    let spawn = |tenant: &'static str| {
        let gw = gw.clone();
        tokio::spawn(async move {
            send(&gw, "/v1/chat/completions", &[("x-tenant", tenant)])
                .await
                .0
        })
    };
    let queued = || async {
        let text = gw.metrics_text().await;
        tenant_metric(&text, "poimen_gateway_queue_depth", &[("model", "m")])
    };
    // The flood takes both slots and every queue place...
    let noisy: Vec<_> = (0..6).map(|_| spawn("noisy")).collect();
    eventually("2 running, 4 queued", || async {
        b.inflight() == 2 && queued().await == 4.0
    })
    .await;
    // ...and more of it is refused at once.
    for _ in 0..4 {
        assert_eq!(spawn("noisy").await.unwrap(), 503);
    }
    // The quiet tenant is within its share (2 of the 4 places): it takes
    // the flood's newest places, one request at a time.
    let quiet: Vec<_> = (0..2).map(|_| spawn("quiet")).collect();
    for q in quiet {
        assert_eq!(q.await.unwrap(), 200);
    }
    let mut codes = Vec::new();
    for n in noisy {
        codes.push(n.await.unwrap());
    }
    let text = gw.metrics_text().await;
    let rejected = |t| {
        tenant_metric(
            &text,
            "poimen_gateway_tenant_rejected_total",
            &[("tenant", t), ("reason", "queue_full")],
        )
    };
    // Its two newest places went to the quiet tenant; its other 4 served.
    codes.sort();
    assert_eq!(codes, [200, 200, 200, 200, 503, 503]);
    assert_eq!(
        rejected("noisy"),
        6.0,
        "4 refused at once, 2 places given up"
    );
    assert_eq!(rejected("quiet"), 0.0);
    // The header named the tenant for the gateway alone.
    assert!(b.seen().iter().all(|s| s.headers.get("x-tenant").is_none()));
}

#[tokio::test(flavor = "multi_thread")]
async fn each_budget_answers_429_with_retry_after() {
    let b = FakeBackend::start().await;
    // 20 prompt + 5 completion tokens per response.
    b.set_reply(Reply::Json {
        body: r#"{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}"#.into(),
        headers: Vec::new(),
    });
    let extra = "  tenants:\n    header: X-Tenant\n    list:\n      - {name: a, max_in_flight: 1}\n      - {name: r, requests_per_minute: 2}\n      - {name: t, tokens_per_minute: 10}\n";
    let gw = std::sync::Arc::new(Gateway::start(&config(&b, extra)).await);
    let as_tenant = |t: &'static str| [("x-tenant", t)];

    // max_in_flight: a second request while the first is in flight.
    b.set_delay(Duration::from_millis(500));
    let first = {
        let gw = gw.clone();
        tokio::spawn(async move { send(&gw, "/v1/chat/completions", &as_tenant("a")).await.0 })
    };
    eventually("a's first request in flight", || async {
        b.inflight() == 1
    })
    .await;
    let (status, retry, body) = send(&gw, "/v1/chat/completions", &as_tenant("a")).await;
    assert_eq!((status, retry.as_str()), (429, "1"));
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(body["error"]["code"], "max_in_flight");
    assert_eq!(first.await.unwrap(), 200);
    b.set_delay(Duration::ZERO);
    assert_eq!(
        send(&gw, "/v1/chat/completions", &as_tenant("a")).await.0,
        200,
        "its place is free again"
    );

    // requests_per_minute: 2 at once, then one every 30 s.
    for _ in 0..2 {
        assert_eq!(
            send(&gw, "/v1/chat/completions", &as_tenant("r")).await.0,
            200
        );
    }
    let (status, retry, body) = send(&gw, "/v1/chat/completions", &as_tenant("r")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("requests_per_minute"))
    );
    let retry: u64 = retry.parse().unwrap();
    assert!((29..=30).contains(&retry), "{retry}");

    // tokens_per_minute: 25 charged at the response's end against 10 a
    // minute: 15 in debt, 90 s to pay back.
    assert_eq!(
        send(&gw, "/v1/chat/completions", &as_tenant("t")).await.0,
        200
    );
    let (status, retry, body) = send(&gw, "/v1/chat/completions", &as_tenant("t")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("tokens_per_minute"))
    );
    let retry: u64 = retry.parse().unwrap();
    assert!((89..=90).contains(&retry), "{retry}");
    // On Anthropic's API, in its shape.
    let (status, _, body) = send(&gw, "/v1/messages", &as_tenant("t")).await;
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (429, Some("rate_limit_error"))
    );
    assert_eq!(body["type"], "error");

    let text = gw.metrics_text().await;
    let rejected = |t, reason| {
        tenant_metric(
            &text,
            "poimen_gateway_tenant_rejected_total",
            &[("tenant", t), ("reason", reason)],
        )
    };
    assert_eq!(rejected("a", "max_in_flight"), 1.0);
    assert_eq!(rejected("r", "requests_per_minute"), 1.0);
    assert_eq!(rejected("t", "tokens_per_minute"), 2.0);
    let tokens = |kind| {
        tenant_metric(
            &text,
            "poimen_gateway_tenant_tokens_total",
            &[("tenant", "t"), ("model", "m"), ("kind", kind)],
        )
    };
    assert_eq!(
        (tokens("prompt"), tokens("completion"), tokens("cached")),
        (20.0, 5.0, 0.0)
    );
    // Refused requests never reached the backend: 2 + 2 + 1 served.
    assert_eq!(b.count(), 5);
    assert_eq!(
        tenant_metric(&text, "poimen_gateway_tenant_in_flight", &[("tenant", "a")]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unlisted_names_are_bounded_label_values() {
    let b = FakeBackend::start().await;
    let extra = "  tenants: {header: X-Tenant, max_tracked: 2}\n";
    let gw = Gateway::start(&config(&b, extra)).await;
    for name in ["u1", "u2", "u3", "u4", "u1"] {
        assert_eq!(
            send(&gw, "/v1/chat/completions", &[("x-tenant", name)])
                .await
                .0,
            200
        );
    }
    let text = gw.metrics_text().await;
    let requests = |t| {
        tenant_metric(
            &text,
            "poimen_gateway_tenant_requests_total",
            &[("tenant", t), ("code", "200")],
        )
    };
    assert_eq!(
        (requests("u1"), requests("u2"), requests("other")),
        (2.0, 1.0, 2.0)
    );
    assert_eq!(requests("u3") + requests("u4"), 0.0);
    let overflows = || {
        let lines = gw.log_lines();
        lines
            .iter()
            .filter(|l| l["event"] == "tenants_overflow")
            .count()
    };
    // The log is written by a thread of its own.
    eventually("the overflow logged", || async { overflows() > 0 }).await;
    assert_eq!(overflows(), 1, "logged once");
}

/// The GPU time, by the sim's own timing, that each of two tenants was
/// served while both kept a backend busy: one with 8,000-token uncached
/// prompts, the other with 500-token ones, 16 output tokens each. Each
/// response's GPU time is taken as the span that ended when it did, and
/// counted where it falls between the `skip`th response (the gateway
/// learns its prices from the first) and the `skip + count`th.
async fn gpu_seconds_long_and_short(gw: &Gateway, skip: usize, count: usize) -> (f64, f64) {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    // (tenant, end, GPU seconds) of each response, in the order they ended.
    let ended = Arc::new(Mutex::new(Vec::<(usize, Instant, f64)>::new()));
    let url = gw.url("/v1/chat/completions");
    let worker = |who: usize, w: usize| {
        let (ended, url) = (ended.clone(), url.clone());
        tokio::spawn(async move {
            let (tenant, bytes) = [("long", 32_000), ("short", 2_000)][who];
            for i in 0.. {
                if ended.lock().unwrap().len() >= skip + count {
                    return;
                }
                // Unique from its first block: nothing of it is cached.
                let head = format!("{tenant} {w} {i} ");
                let content = format!("{head}{}", "x".repeat(bytes - head.len()));
                let body = json!({"model": "m", "max_tokens": 16,
                    "messages": [{"role": "user", "content": content}]});
                let resp = client()
                    .post(&url)
                    .header("x-tenant", tenant)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200);
                let usage = resp.json::<serde_json::Value>().await.unwrap()["usage"].clone();
                let n = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
                let uncached = n(&usage["prompt_tokens"])
                    - n(&usage["prompt_tokens_details"]["cached_tokens"]);
                // The sim's --prefill-us-per-token and --decode-us-per-token.
                let gpu = uncached * 30e-6 + n(&usage["completion_tokens"]) * 2e-3;
                ended.lock().unwrap().push((who, Instant::now(), gpu));
            }
        })
    };
    // More than the slots and the queue take: both always wait.
    let workers: Vec<_> = (0..2)
        .flat_map(|who| (0..6).map(move |w| (who, w)))
        .map(|(who, w)| worker(who, w))
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let ended = ended.lock().unwrap();
    let (from, to) = (ended[skip].1, ended[skip + count - 1].1);
    let mut served = [0.0; 2];
    for &(who, end, gpu) in ended.iter() {
        let start = end - Duration::from_secs_f64(gpu);
        let overlap = end.min(to).saturating_duration_since(start.max(from));
        served[who] += overlap.as_secs_f64();
    }
    (served[0], served[1])
}

#[tokio::test(flavor = "multi_thread")]
async fn long_prompts_get_the_gpu_time_of_short_ones_not_their_request_count() {
    let sim = crate::support::sim::Sim::start_scaled(
        "m",
        "1",
        &[
            "--max-num-seqs",
            "4",
            "--prefill-us-per-token",
            "30",
            "--decode-us-per-token",
            "2000",
            "--step-us-per-running-seq",
            "0",
        ],
    );
    let run = |fairness: &'static str| {
        let sim = sim.addr;
        async move {
            let extra = format!(
                "  scheduler: {{max_num_seqs: 2, max_queue_depth: 20}}\n  tenants: {{header: X-Tenant, fairness: {fairness}}}\n"
            );
            let yaml = format!("{extra}  models:\n    - name: m\n      address: \"{sim}\"\n");
            let gw = Gateway::start(&yaml).await;
            let (long, short) = gpu_seconds_long_and_short(&gw, 10, 50).await;
            let text = gw.metrics_text().await;
            let service = |t| {
                tenant_metric(
                    &text,
                    "poimen_gateway_tenant_service_total",
                    &[("tenant", t)],
                )
            };
            (long / short, service("long"), service("short"))
        }
    };
    // By tokens: about 1:1 (the bound is wide for a loaded machine).
    let (ratio, long, short) = run("tokens").await;
    assert!(
        (0.6..1.7).contains(&ratio),
        "GPU time long : short = {ratio:.2}"
    );
    // Counted in weighted tokens: far more than the ~100 requests each.
    assert!(long > 100_000.0 && short > 10_000.0, "{long} {short}");
    // By requests, as before: one request each in turn, about 5.8:1.
    let (ratio, long, short) = run("requests").await;
    assert!(ratio > 3.0, "GPU time long : short = {ratio:.2}");
    assert!(long < 200.0 && short < 200.0, "{long} {short}");
}
