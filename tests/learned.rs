//! Models learned from the backends: a pool without a name serves what its
//! backends list in GET /v1/models, each name only where it is listed.

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::support::gateway::check_config;
use crate::support::sim::Sim;
use crate::support::{client, eventually, get, header, FakeBackend, Gateway};

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
    let adapters = |name: &str| {
        let dir = crate::support::gateway::temp_dir();
        std::fs::create_dir_all(dir.join(name)).unwrap();
        std::fs::write(dir.join(name).join("adapter_config.json"), "{}").unwrap();
        dir
    };
    let (dir, refused_dir) = (adapters("hot"), adapters("broken"));
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
    let loads =
        sims[0].metric("sim_lora_loads_total").await + sims[1].metric("sim_lora_loads_total").await;
    assert_eq!(loads, 1.0, "loaded once");
    let loaded = [("result", "loaded")];
    assert_eq!(
        gw.metric("poimen_gateway_adapter_loads_total", &loaded)
            .await,
        1.0
    );
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
    let failed = [("result", "failed")];
    assert_eq!(
        gw.metric("poimen_gateway_adapter_loads_total", &failed)
            .await,
        1.0
    );
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
