//! The official Python SDKs on the agent APIs, over vllm-sim backends:
//! OpenAI's Responses API (streamed and not; chains continued with
//! `previous_response_id` stay on the backend that stored them, also
//! across a graceful upgrade; retrieve; cancel's typed error) and
//! Anthropic's Messages API (streamed and not, count_tokens, counted as the
//! backends count; the typed 401 and 529; the SDK's retry after a 529).
//! Each test checks what the SDK saw (tests/sdk/*.py print it) against what
//! the gateway and the backends saw.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::daemons::{upgrade, Daemons};
use crate::support::gateway::{alive, one_model, temp_dir, Conf};
use crate::support::metrics::{sample, scrape};
use crate::support::sdk::{run, sdk_available};
use crate::support::sim::Sim;
use crate::support::{client, key_owned_by, Gateway};

const OPENAI: &str = "openai_responses.py";
const ANTHROPIC: &str = "anthropic_messages.py";

fn base(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

fn addrs(sims: &[Sim]) -> Vec<SocketAddr> {
    sims.iter().map(|s| s.addr).collect()
}

/// Wait until the gateway's `name{labels}` is `want`: counters move in
/// Pingora's logging phase, just after the client has its answer.
async fn settles(gw: &Gateway, name: &str, labels: &[(&str, &str)], want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = gw.metric(name, labels).await;
        if got == want || Instant::now() > deadline {
            assert_eq!(got, want, "{name}{labels:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The typed error a script reported: its class and status.
fn assert_error(got: &Value, class: &str, status: u16) {
    assert_eq!(got["type"], class, "{got}");
    assert_eq!(got["status"], status, "{got}");
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_creates_and_streams_a_response() {
    if !sdk_available("openai").await {
        return;
    }
    let sim = Sim::start("m", &[]);
    let gw = Gateway::start(&one_model("m", &[sim.addr])).await;
    let v = run(OPENAI, &[&base(gw.addr), "m", "create"]).await;

    let plain = &v["plain"];
    assert_eq!(plain["backend"], sim.addr.to_string());
    assert!(plain["text"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    assert_eq!(plain["usage"]["output_tokens"], 4);
    let streamed = &v["streamed"];
    let types = streamed["types"].as_array().unwrap();
    assert_eq!(types.first().unwrap(), "response.created", "{v}");
    assert_eq!(types.last().unwrap(), "response.completed", "{v}");
    assert_eq!(
        streamed["text"], streamed["final_text"],
        "the deltas add up"
    );
    assert_eq!(streamed["usage"]["output_tokens"], 4);

    // The gateway and the backend counted the prompts the SDK was told of.
    let input = plain["usage"]["input_tokens"].as_f64().unwrap()
        + streamed["usage"]["input_tokens"].as_f64().unwrap();
    assert_eq!(sim.metric("vllm:prompt_tokens_total").await, input);
    let backend = sim.addr.to_string();
    let labels = [("backend", backend.as_str())];
    settles(&gw, "poimen_gateway_prompt_tokens_total", &labels, input).await;
    let codes = [("backend", backend.as_str()), ("code", "200")];
    settles(&gw, "poimen_gateway_requests_total", &codes, 2.0).await;
    assert_eq!(
        gw.metric("poimen_gateway_usage_missing_total", &labels)
            .await,
        0.0
    );
}

/// The backend of every turn of a chain, asserting that each continuing
/// turn was routed to the owner of the previous one.
fn chain_backends(chain: &Value) -> Vec<String> {
    let turns = chain.as_array().unwrap();
    for (t, turn) in turns.iter().enumerate().skip(1) {
        assert_eq!(turn["route"], "owner", "turn {t}: {chain}");
    }
    turns
        .iter()
        .map(|t| t["backend"].as_str().unwrap().to_string())
        .collect()
}

fn assert_one_backend(backends: &[String], what: &str) {
    assert!(
        backends.iter().all(|b| *b == backends[0]),
        "{what} moved: {backends:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_chains_stay_on_the_backend_that_stored_them() {
    if !sdk_available("openai").await {
        return;
    }
    let sims = Sim::start_n(3, "m");
    let addrs = addrs(&sims);
    let gw = Gateway::start(&one_model("m", &addrs)).await;
    let key = key_owned_by(addrs[2], &addrs);
    // Three keyless chains (round-robin would move each turn), one keyed.
    let args = [&base(gw.addr), "m", "chains", "5", "-", "-", "-", &key];
    let v = run(OPENAI, &args).await;
    assert_eq!(v["failed"], json!([]), "failed turns");
    let chains = v["chains"].as_array().unwrap();
    let mut served = vec![0; sims.len()];
    let mut first = Vec::new();
    for (c, chain) in chains.iter().enumerate() {
        let backends = chain_backends(chain);
        assert_eq!(backends.len(), 5, "chain {c}");
        assert_one_backend(&backends, &format!("chain {c}"));
        first.push(backends[0].clone());
        let at = addrs.iter().position(|a| a.to_string() == backends[0]);
        served[at.unwrap()] += backends.len();
    }
    assert_eq!(chains[3][0]["route"], "hash");
    assert_eq!(first[3], addrs[2].to_string(), "the key's backend");
    let spread = first[..3].iter().any(|b| *b != first[0]);
    assert!(spread, "round-robin started the chains apart: {first:?}");
    // Each backend got exactly the turns the gateway said it sent there.
    for (sim, n) in sims.iter().zip(&served) {
        assert_eq!(sim.stats().await["requests"], *n, "{}", sim.addr);
    }

    const LOOKUPS: &str = "poimen_gateway_response_owner_lookups_total";
    let known = [("result", "known")];
    // 4 chains of 4 continuing turns, each owner remembered from its body.
    settles(&gw, LOOKUPS, &known, 16.0).await;

    // The last response, retrieved from its owner as stored; cancelling it
    // gets vLLM's answer for a response that was not created in background.
    let last = &chains[3][4];
    let id = last["id"].as_str().unwrap();
    let r = run(OPENAI, &[&base(gw.addr), "m", "retrieve", id]).await;
    assert_eq!(r["backend"], first[3]);
    assert_eq!(r["route"], "owner");
    assert_eq!(r["response"], last["response"]);
    assert_error(&r["cancel"], "BadRequestError", 400);
    assert_eq!(
        r["cancel"]["body"]["message"],
        "Cannot cancel a synchronous response."
    );
    // One lookup each for the retrieve and the cancel.
    settles(&gw, LOOKUPS, &known, 18.0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_chain_reaches_its_owner_across_a_graceful_upgrade() {
    if !sdk_available("openai").await {
        return;
    }
    let sims = Sim::start_n(3, "m");
    let mut d = Daemons {
        conf: Conf::new(1),
        pids: Vec::new(),
    };
    d.conf.write(&one_model("m", &addrs(&sims)));
    assert!(d.start(false).wait().await.unwrap().success());
    let listening = d.conf.listening(d.next_pid(0).await).await;
    let base = base(listening.0);
    let before = run(OPENAI, &[&base, "m", "chains", "2", "-"]).await;
    assert_eq!(before["failed"], json!([]));
    let id = before["chains"][0][1]["id"].as_str().unwrap().to_string();

    // The new process has never seen the conversation: it asks the backends.
    let old = upgrade(&mut d, listening).await;
    // Until it exits (Pingora's 5 s before the shutdown, then the 1 s
    // grace period), the old process still accepts on the shared sockets,
    // and it knows the owner.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while alive(old) {
        assert!(
            std::time::Instant::now() < deadline,
            "the old process did not exit"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let after = run(OPENAI, &[&base, "m", "chains", "3", "-", "--after", &id]).await;
    assert_eq!(after["failed"], json!([]));
    assert_eq!(after["chains"][0][0]["route"], "owner");
    let mut backends = chain_backends(&before["chains"][0]);
    backends.extend(chain_backends(&after["chains"][0]));
    assert_one_backend(&backends, "the chain");

    let lookups = |text: &str, result| {
        sample(
            text,
            "poimen_gateway_response_owner_lookups_total",
            &[("result", result)],
        )
    };
    let text = scrape(listening.1).await;
    assert_eq!(
        lookups(&text, "found"),
        Some(1.0),
        "asked once, then remembered"
    );
    assert_eq!(lookups(&text, "known"), Some(2.0));
}

/// What a Messages turn's prompt counted: Anthropic's usage splits it in
/// three.
fn prompt_tokens(usage: &Value) -> f64 {
    [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .iter()
    .map(|k| usage[k].as_f64().unwrap())
    .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_messages_are_counted_as_the_backends_count_them() {
    if !sdk_available("anthropic").await {
        return;
    }
    let sims = Sim::start_n(2, "m");
    let gw = Gateway::start(&one_model("m", &addrs(&sims))).await;
    let v = run(ANTHROPIC, &[&base(gw.addr), "m", "session"]).await;
    let turns = v["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 6);
    for (t, turn) in turns.iter().enumerate() {
        assert!(turn["text"].as_str().is_some_and(|s| !s.is_empty()), "{t}");
        assert_eq!(turn["stop_reason"], "max_tokens", "{t}");
        assert_eq!(turn["usage"]["output_tokens"], 4, "turn {t}: {turn}");
    }
    assert_eq!(
        v["count_tokens"].as_f64().unwrap(),
        prompt_tokens(&turns[5]["usage"]),
        "count_tokens counts what the turn used"
    );

    // Per backend: the SDK's usage = the sim's counters = the gateway's.
    let mut all_hits = 0.0;
    for sim in &sims {
        let backend = sim.addr.to_string();
        let mine = turns.iter().filter(|t| t["backend"] == backend.as_str());
        let (prompt, hits) = mine.fold((0.0, 0.0), |(p, h), t| {
            let u = &t["usage"];
            (
                p + prompt_tokens(u),
                h + u["cache_read_input_tokens"].as_f64().unwrap(),
            )
        });
        assert_eq!(sim.metric("vllm:prompt_tokens_total").await, prompt);
        assert_eq!(sim.metric("vllm:prefix_cache_hits_total").await, hits);
        let labels = [("backend", backend.as_str())];
        settles(&gw, "poimen_gateway_prompt_tokens_total", &labels, prompt).await;
        settles(&gw, "vllm_prefix_cache_hit_tokens_total", &labels, hits).await;
        all_hits += hits;
        // The backend got the SDK's request, without its key.
        let seen = &sim.stats().await["last_headers"];
        assert!(seen["anthropic-version"].is_string(), "{seen}");
        assert!(seen.get("x-api-key").is_none(), "{seen}");
    }
    assert!(all_hits > 0.0, "later turns hit the cache");
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_gets_its_typed_authentication_and_rate_limit_errors() {
    if !sdk_available("anthropic").await {
        return;
    }
    let sim = Sim::start("m", &[]);
    let dir = temp_dir();
    let keys = dir.join("api-keys");
    std::fs::write(&keys, "sdk:sdk-key-1\n").unwrap();
    let gw = Gateway::start(&format!(
        "  auth: {{api_keys_file: \"{}\"}}\n  tenants: {{list: [{{name: sdk, requests_per_minute: 1}}]}}\n{}",
        keys.display(),
        one_model("m", &[sim.addr])
    ))
    .await;
    // The SDK sends its key as `x-api-key`.
    let v = run(ANTHROPIC, &[&base(gw.addr), "m", "auth", "sdk-key-1"]).await;
    let wrong = &v["wrong"];
    assert_error(wrong, "AuthenticationError", 401);
    assert_eq!(wrong["body"]["type"], "error");
    assert_eq!(wrong["body"]["error"]["type"], "authentication_error");
    assert!(v["right"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    // The key's tenant has one request a minute: the next is refused.
    let limited = &v["limited"];
    assert_error(limited, "RateLimitError", 429);
    assert_eq!(limited["retry_after"], "60");
    assert_eq!(limited["body"]["error"]["type"], "rate_limit_error");

    let reason = [("reason", "unknown_key")];
    settles(&gw, "poimen_gateway_auth_failures_total", &reason, 1.0).await;
    let stats = sim.stats().await;
    assert_eq!(stats["requests"], 1, "only the right key got through");
    let seen = &stats["last_headers"];
    assert!(
        seen.get("x-api-key").is_none(),
        "the key went upstream: {seen}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_is_told_overloaded_and_its_retry_waits_for_the_slot() {
    if !sdk_available("anthropic").await {
        return;
    }
    // 50 ms per token: the holder's stream (up to 200 s) lasts until the
    // test drops it, however long Python takes to import the SDK.
    let sim = Sim::start_scaled("m", "1", &["--decode-us-per-token", "50000"]);
    let gw = Gateway::start(&format!(
        "  scheduler: {{max_num_seqs: 1, max_queue_depth: 0}}\n{}",
        one_model("m", &[sim.addr])
    ))
    .await;
    let holder = client()
        .post(gw.url("/v1/messages"))
        .json(&json!({"model": "m", "max_tokens": 4096, "stream": true,
            "messages": [{"role": "user", "content": "hold the slot"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(holder.status(), 200);

    let rejected = [("code", "529")];
    let base = base(gw.addr);
    let args = [base.as_str(), "m", "overloaded"];
    let script = run(ANTHROPIC, &args);
    // The second 529 is the retrying call's first attempt: free the slot
    // then, so that its retry (after Retry-After) finds it free.
    let release = async {
        let two = async {
            while gw.metric("poimen_gateway_requests_total", &rejected).await < 2.0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), two)
            .await
            .expect("two 529s within 60 s");
        drop(holder);
    };
    let (v, ()) = tokio::join!(script, release);

    let refused = &v["refused"];
    assert_error(refused, "OverloadedError", 529);
    assert_eq!(refused["retry_after"], "1");
    assert_eq!(refused["body"]["error"]["type"], "overloaded_error");
    let retried = &v["retried"];
    assert!(
        retried["text"].as_str().is_some_and(|t| !t.is_empty()),
        "{v}"
    );
    // Normally one retry; a second when the slot was freed late.
    let retries = retried["retries_taken"].as_u64().unwrap();
    assert!((1..=2).contains(&retries), "{v}");
    // Retry-After (1 s) honoured: the SDK's own first backoff is < 0.5 s.
    assert!(
        retried["seconds"].as_f64().unwrap() >= retries as f64,
        "{v}"
    );

    let n = 1.0 + retries as f64;
    settles(&gw, "poimen_gateway_requests_total", &rejected, n).await;
    let full = [("reason", "queue_full")];
    settles(&gw, "poimen_gateway_queue_rejected_total", &full, n).await;
    // The backend got the holder and the retry that succeeded, as a retry.
    let stats = sim.stats().await;
    assert_eq!(stats["requests"], 2, "{stats}");
    let retry_count = &stats["last_headers"]["x-stainless-retry-count"];
    assert_eq!(*retry_count, retries.to_string(), "{stats}");
}
