//! Models learned from the backends: a pool without a name serves what its
//! backends list in GET /v1/models, each name only where it is listed.

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::support::gateway::{check_config, TempDir};
use crate::support::sim::Sim;
use crate::support::{client, eventually, get, header, FakeBackend, Gateway, Reply};

/// The ids (and parents) the gateway lists.
async fn listed(gw: &Gateway) -> Vec<(String, Option<String>)> {
    let list: Value = get(gw, "/v1/models").await.json().await.unwrap();
    let cards = list["data"].as_array().unwrap();
    let parent = |c: &Value| c["parent"].as_str().map(String::from);
    cards
        .iter()
        .map(|c| (c["id"].as_str().unwrap().to_string(), parent(c)))
        .collect()
}

async fn has(gw: &Gateway, name: &str) -> bool {
    listed(gw).await.iter().any(|(id, _)| id == name)
}

/// A chat for `model`: its status, the backend that answered, and the
/// answer's model.
async fn chat(gw: &Gateway, model: &str) -> (u16, String, Value) {
    let body =
        json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let (status, backend) = (resp.status().as_u16(), header(&resp, "x-poimen-backend"));
    let answer: Value = resp.json().await.unwrap_or_default();
    (status, backend, answer["model"].clone())
}

async fn adapter(sim: &Sim, route: &str, body: Value) -> u16 {
    let url = format!("http://{}/v1/{route}", sim.addr);
    let resp = client().post(url).json(&body).send().await.unwrap();
    resp.status().as_u16()
}

#[tokio::test(flavor = "multi_thread")]
async fn names_are_learned_routed_where_listed_kept_through_silence_and_forgotten() {
    let loads = ["--allow-runtime-lora-updating", "--lora-load-us", "0"];
    let s0 = Sim::start("qwen", &loads);
    let mut s1 = Some(Sim::start("qwen", &["--lora-modules", "only1=/a/only1"]));
    let s2 = Sim::start("qwen", &["--lora-modules", "sql=/a/sql"]);
    let configured = FakeBackend::start().await;
    let s1_addr = s1.as_ref().unwrap().addr;
    let gw = Gateway::start(&format!(
        "  discovery: {{refresh_secs: 0.2}}\n  models:\n    \
         - {{name: configured, address: \"{}\"}}\n    \
         - addresses: [\"{}\", \"{}\", \"{}\"]\n",
        configured.addr, s0.addr, s1_addr, s2.addr
    ))
    .await;
    eventually("the sims' models learned", || async {
        has(&gw, "sql").await && has(&gw, "only1").await
    })
    .await;
    let names: HashSet<_> = listed(&gw).await.into_iter().collect();
    let expected = [
        ("configured", None),
        ("qwen", None),
        ("sql", Some("qwen")),
        ("only1", Some("qwen")),
    ];
    let expected = expected.map(|(n, p)| (n.to_string(), p.map(String::from)));
    assert_eq!(names, HashSet::from(expected));

    // An adapter reaches only the backend that has it; the base model all.
    let mut bases = HashSet::new();
    for _ in 0..9 {
        let (status, backend, model) = chat(&gw, "sql").await;
        assert_eq!(
            (status, backend.as_str(), model),
            (200, &*s2.addr.to_string(), json!("sql"))
        );
        let (status, backend, model) = chat(&gw, "qwen").await;
        assert_eq!((status, model), (200, json!("qwen")));
        bases.insert(backend);
    }
    assert_eq!(
        bases.len(),
        3,
        "the base model goes to every backend: {bases:?}"
    );
    assert_eq!(
        chat(&gw, "configured").await.0,
        200,
        "configured models beside learned ones"
    );
    let requests = [("model", "sql"), ("code", "200")];
    assert_eq!(
        gw.metric("poimen_gateway_tenant_requests_total", &requests)
            .await,
        9.0
    );
    let pool = "models[1]";
    let s2_label = s2.addr.to_string();
    let listed_by_s2 = [("model", pool), ("backend", s2_label.as_str())];
    assert_eq!(
        gw.metric("poimen_gateway_learned_models", &listed_by_s2)
            .await,
        2.0
    );

    // An adapter loaded at run time is routable after a refresh, there only.
    assert_eq!(chat(&gw, "fresh").await.0, 404);
    let load = json!({"lora_name": "fresh", "lora_path": "/a/fresh"});
    assert_eq!(adapter(&s0, "load_lora_adapter", load).await, 200);
    eventually("the loaded adapter learned", || has(&gw, "fresh")).await;
    for _ in 0..3 {
        let (status, backend, _) = chat(&gw, "fresh").await;
        assert_eq!((status, backend), (200, s0.addr.to_string()));
    }

    // A backend that stops answering keeps its models.
    drop(s1.take());
    let s1_label = s1_addr.to_string();
    let failing = [("model", pool), ("backend", s1_label.as_str())];
    eventually("s1's lists failing", || async {
        gw.metric("poimen_gateway_learn_failures_total", &failing)
            .await
            >= 2.0
    })
    .await;
    assert!(
        has(&gw, "only1").await,
        "a silent backend keeps its last answer"
    );

    // A name no backend lists any more is 404 again after a refresh.
    let unload = json!({"lora_name": "fresh"});
    assert_eq!(adapter(&s0, "unload_lora_adapter", unload).await, 200);
    eventually("the unloaded adapter forgotten", || async {
        !has(&gw, "fresh").await
    })
    .await;
    assert_eq!(chat(&gw, "fresh").await.0, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adapter_in_the_directory_is_loaded_once_where_routing_picks() {
    let (dir, refused_dir) = (adapter_dir(&["hot"]), adapter_dir(&["broken"]));
    // A load takes 0.3 s: the requests below all arrive while it runs.
    let loads = ["--allow-runtime-lora-updating", "--lora-load-us", "300000"];
    let sims = [
        Sim::start_scaled("qwen", "1", &loads),
        Sim::start_scaled("qwen", "1", &loads),
    ];
    let refusing = Sim::start("qwen", &[]);
    let gw = Gateway::start(&format!(
        "  discovery: {{refresh_secs: 0.2}}\n  models:\n    \
         - {{addresses: [\"{}\", \"{}\"], load_adapters_from: \"{}\"}}\n    \
         - {{addresses: [\"{}\"], load_adapters_from: \"{}\"}}\n",
        sims[0].addr,
        sims[1].addr,
        dir.display(),
        refusing.addr,
        refused_dir.display()
    ))
    .await;
    eventually("the base model learned", || has(&gw, "qwen")).await;
    let gw = std::sync::Arc::new(gw);
    let mut asks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let gw = gw.clone();
        asks.spawn(async move { chat(&gw, "hot").await });
    }
    let mut backends = HashSet::new();
    while let Some(answer) = asks.join_next().await {
        let (status, backend, model) = answer.unwrap();
        assert_eq!((status, model), (200, json!("hot")));
        backends.insert(backend);
    }
    assert_eq!(
        backends.len(),
        1,
        "served where it was loaded: {backends:?}"
    );
    let loads = summed(&sims, "sim_lora_loads_total").await;
    assert_eq!(loads, 1.0, "loaded once");
    assert_eq!(gateway_loads(&gw, "loaded").await, 1.0);
    eventually("the loaded adapter listed by its backend", || {
        has(&gw, "hot")
    })
    .await;

    // Not in the directory: 404. A load the backend refuses: 502, in the
    // shape of the client's API.
    assert_eq!(chat(&gw, "cold").await.0, 404);
    let resp = client()
        .post(gw.url("/v1/messages"))
        .json(&json!({"model": "broken", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["type"], "error", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("loading adapter `broken`"), "{message}");
    assert_eq!(gateway_loads(&gw, "failed").await, 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn check_refuses_a_name_both_configured_and_learned() {
    let sim = Sim::start("qwen", &["--lora-modules", "sql=/a/sql"]);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = |name: &str| {
        format!(
            "gateway:\n  models:\n    - {{name: {name}, address: \"127.0.0.1:1\"}}\n    \
             - addresses: [\"{}\", \"{}\"]\n",
            sim.addr,
            silent.local_addr().unwrap()
        )
    };
    let run = |name: &str| {
        let out = check_config(&config(name));
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let (ok, _, stderr) = run("sql");
    assert!(!ok, "a configured name a backend also lists passed");
    let clash = format!("models[1]: backend {} serves \"sql\"", sim.addr);
    assert!(stderr.contains(&clash), "{stderr}");

    // A backend that does not answer is named, and does not fail the check.
    let (ok, stdout, stderr) = run("other");
    assert!(ok && stdout.contains("configuration OK"), "{stderr}");
    let silent = format!(
        "backend {} did not list its models",
        silent.local_addr().unwrap()
    );
    assert!(stderr.contains(&silent), "{stderr}");
}

/// A chat for `model` with an optional cache key: its status, backend and
/// route.
async fn keyed_chat(gw: &Gateway, model: &str, key: Option<&str>) -> (u16, String, String) {
    let body =
        json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let mut request = client().post(gw.url("/v1/chat/completions")).json(&body);
    if let Some(key) = key {
        request = request.header("X-Poimen-Cache-Key", key);
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    let (backend, route) = (
        header(&resp, "x-poimen-backend"),
        header(&resp, "x-poimen-route"),
    );
    (status, backend, route)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adapter_on_part_of_the_pool_is_routed_without_a_fallback() {
    let a = Sim::start("base-m", &["--lora-modules", "lora-a=/a/lora-a"]);
    let b = Sim::start("base-m", &["--lora-modules", "lora-b=/a/lora-b"]);
    let c = Sim::start("base-m", &[]);
    let gw = Gateway::start(&format!(
        "  discovery: {{refresh_secs: 0.2}}\n  models:\n    \
         - addresses: [\"{}\", \"{}\", \"{}\"]\n",
        a.addr, b.addr, c.addr
    ))
    .await;
    eventually("the adapters learned", || async {
        has(&gw, "lora-a").await && has(&gw, "lora-b").await
    })
    .await;
    for i in 0..12 {
        let key = format!("session-{i}");
        for (key, route) in [(None, "round_robin"), (Some(key.as_str()), "hash")] {
            let (status, backend, got) = keyed_chat(&gw, "lora-a", key).await;
            assert_eq!(
                (status, backend.as_str(), got.as_str()),
                (200, &*a.addr.to_string(), route),
                "{key:?}"
            );
        }
    }
    let fallbacks = [("route", "fallback")];
    let text = gw.metrics_text().await;
    let sum: f64 = text
        .lines()
        .filter(|l| l.starts_with("poimen_gateway_requests_total{"))
        .filter(|l| l.contains(r#"route="fallback""#))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(sum, 0.0, "{fallbacks:?} with no failure: {text}");
}

/// `name`, summed over `sims`' own metrics.
async fn summed(sims: &[Sim], name: &str) -> f64 {
    let mut sum = 0.0;
    for sim in sims {
        sum += sim.metric(name).await;
    }
    sum
}

/// The adapter loads the gateway made with this `result`.
async fn gateway_loads(gw: &Gateway, result: &str) -> f64 {
    let labels = [("result", result)];
    gw.metric("poimen_gateway_adapter_loads_total", &labels)
        .await
}

/// A directory holding adapters `names` (each an `adapter_config.json`).
fn adapter_dir(names: &[&str]) -> TempDir {
    let dir = crate::support::gateway::temp_dir();
    for name in names {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        std::fs::write(dir.join(name).join("adapter_config.json"), "{}").unwrap();
    }
    dir
}

/// Three sims serving `base-m` with `args` (delays as given), one learned
/// pool over them loading adapters from `dir`, its lists asked every
/// `refresh` seconds; once the base model is learned.
async fn loading_pool(args: &[&str], refresh: &str, dir: &TempDir) -> ([Sim; 3], Gateway) {
    let sims = [(); 3].map(|()| Sim::start_scaled("base-m", "1", args));
    let gw = Gateway::start(&format!(
        "  discovery: {{refresh_secs: {refresh}}}\n  models:\n    \
         - {{addresses: [\"{}\", \"{}\", \"{}\"], load_adapters_from: \"{}\"}}\n",
        sims[0].addr,
        sims[1].addr,
        sims[2].addr,
        dir.display()
    ))
    .await;
    eventually("the base model learned", || has(&gw, "base-m")).await;
    (sims, gw)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_load_is_shared_and_not_retried_at_once() {
    let dir = adapter_dir(&["lora-oom"]);
    // Every load fails after 0.7 s, as an engine out of memory answers.
    let fails = [
        "--allow-runtime-lora-updating",
        "--lora-load-us",
        "700000",
        "--lora-load-fails",
    ];
    let (sims, gw) = loading_pool(&fails, "0.2", &dir).await;
    let gw = std::sync::Arc::new(gw);
    let mut asks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let gw = gw.clone();
        asks.spawn(async move {
            let body =
                json!({"model": "lora-oom", "messages": [{"role": "user", "content": "hi"}]});
            let resp = client()
                .post(gw.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            let retry_after = header(&resp, "retry-after");
            let status = resp.status().as_u16();
            let answer: Value = resp.json().await.unwrap();
            (status, retry_after, answer)
        });
    }
    while let Some(answer) = asks.join_next().await {
        let (status, retry_after, answer) = answer.unwrap();
        assert_eq!(status, 502, "{answer}");
        assert!(!retry_after.is_empty(), "no Retry-After");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("loading adapter `lora-oom` on ") && message.contains("(500)"),
            "{message}"
        );
        assert_eq!(answer["error"]["code"], "adapter_load_failed");
    }
    // One more at once: the failure stands, no backend is asked again.
    assert_eq!(chat(&gw, "lora-oom").await.0, 502);
    let failures = summed(&sims, "sim_lora_load_failures_total").await;
    assert_eq!(failures, 1.0, "one load for seven requests");
    assert_eq!(gateway_loads(&gw, "failed").await, 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_list_in_flight_does_not_erase_a_load_just_made() {
    let names = ["lora-r0", "lora-r1", "lora-r2", "lora-r3"];
    let dir = adapter_dir(&names);
    // A list takes 0.8 s and one is asked every 1.8 s; a load takes 0.3 s.
    let slow = [
        "--allow-runtime-lora-updating",
        "--lora-load-us",
        "300000",
        "--models-delay-us",
        "800000",
    ];
    let (sims, gw) = loading_pool(&slow, "1", &dir).await;
    // The adapters loaded 0.4 s apart: whatever the phase of the rounds,
    // at least one load ends while a list asked before it is in flight.
    let gw = std::sync::Arc::new(gw);
    let mut users = tokio::task::JoinSet::new();
    for (i, name) in names.into_iter().enumerate() {
        let gw = gw.clone();
        users.spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(400 * i as u64)).await;
            let (status, first, _) = chat(&gw, name).await;
            // Listed from the load on, through the two rounds after it.
            let mut gone = 0;
            for _ in 0..40 {
                gone += usize::from(!has(&gw, name).await);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            let (again, backend, _) = chat(&gw, name).await;
            (name, (status, first), gone, (again, backend))
        });
    }
    while let Some(done) = users.join_next().await {
        let (name, (status, first), gone, again) = done.unwrap();
        assert_eq!(status, 200, "{name}");
        assert_eq!(gone, 0, "{name} forgotten after its load");
        assert_eq!(again, (200, first), "{name}");
    }
    let loads = summed(&sims, "sim_lora_loads_total").await;
    assert_eq!(loads, 4.0, "each adapter loaded once");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adapter_already_loaded_behind_the_gateways_back_is_served() {
    let dir = adapter_dir(&["sql"]);
    let sim = Sim::start("base-m", &["--allow-runtime-lora-updating"]);
    // No second round of lists in this test.
    let gw = Gateway::start(&format!(
        "  discovery: {{refresh_secs: 60}}\n  models:\n    \
         - {{addresses: [\"{}\"], load_adapters_from: \"{}\"}}\n",
        sim.addr,
        dir.display()
    ))
    .await;
    eventually("the base model learned", || has(&gw, "base-m")).await;
    let load = json!({"lora_name": "sql", "lora_path": dir.join("sql")});
    assert_eq!(adapter(&sim, "load_lora_adapter", load).await, 200);
    // vLLM answers the gateway's load "already loaded": it is served.
    let (status, backend, model) = chat(&gw, "sql").await;
    assert_eq!(
        (status, backend, model),
        (200, sim.addr.to_string(), json!("sql"))
    );
    assert!(has(&gw, "sql").await);
}

#[tokio::test(flavor = "multi_thread")]
async fn names_that_are_no_model_names_are_refused_and_rounds_logged_once() {
    let list = |ids: &[&str]| {
        let cards: Vec<Value> = ids.iter().map(|id| json!({"id": id})).collect();
        Reply::Json {
            body: json!({"object": "list", "data": cards}).to_string(),
            headers: Vec::new(),
        }
    };
    let backend = FakeBackend::start().await;
    let names = ["good", "quote\"d", "ctrl\u{1}", "new\nline", " "];
    backend.set_reply(list(&names));
    let gw = Gateway::start(&format!(
        "  discovery: {{refresh_secs: 0.2}}\n  models:\n    - addresses: [\"{}\"]\n",
        backend.addr
    ))
    .await;
    eventually("the model names learned", || has(&gw, "good")).await;
    let learned: HashSet<String> = listed(&gw).await.into_iter().map(|(n, _)| n).collect();
    assert_eq!(learned, HashSet::from(["good".into(), "quote\"d".into()]));
    assert_eq!(chat(&gw, "ctrl\u{1}").await.0, 404);
    let label = backend.addr.to_string();
    let labels = [("model", "models[0]"), ("backend", label.as_str())];
    let refused = "poimen_gateway_learned_names_refused_total";
    assert!(gw.metric(refused, &labels).await >= 3.0);

    // Every name goes: one line for the round, not one per name.
    backend.set_reply(list(&[]));
    eventually("the names gone", || async { !has(&gw, "good").await }).await;
    let events = |event: &str| -> Vec<Value> {
        let lines = gw.log_lines().into_iter();
        lines.filter(|l| l["event"] == event).collect()
    };
    eventually("the round logged", || async {
        !events("model_gone").is_empty()
    })
    .await;
    for (event, count) in [("model_learned", 2), ("model_gone", 2)] {
        let lines = events(event);
        assert_eq!(lines.len(), 1, "{event}: {lines:?}");
        assert_eq!(lines[0]["count"], count, "{event}: {lines:?}");
        let shown: HashSet<&str> = (lines[0]["models"].as_array().unwrap().iter())
            .map(|m| m.as_str().unwrap())
            .collect();
        assert_eq!(shown, HashSet::from(["good", "quote\"d"]), "{event}");
    }
}
