//! Model aliases: a name a client insists on reaches the model it means,
//! its body renamed and nothing else changed; counted under both names.

use crate::support::{client, eventually, FakeBackend, Gateway};

#[tokio::test(flavor = "multi_thread")]
async fn an_alias_reaches_its_model_renamed_byte_for_byte_and_is_counted() {
    let (small, big) = (FakeBackend::start().await, FakeBackend::start().await);
    let gw = Gateway::start(&format!(
        "  models:\n    \
         - {{name: small, address: \"{}\", aliases: [\"claude-haiku-*\"]}}\n    \
         - {{name: big, address: \"{}\", aliases: [\"claude-*\", gpt-5]}}\n",
        small.addr, big.addr
    ))
    .await;
    let post = |path: &'static str, body: String| {
        let gw = &gw;
        async move {
            let resp = client().post(gw.url(path)).body(body).send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    // Odd spacing, an escape and a nested "model": only the top-level name changes.
    let sent = |model: &str| {
        format!(
            "{{ \"messages\":[{{\"role\":\"user\",\"content\":\"caf\\u00e9\",\"model\":\"x\"}}],\n  \"model\" : \"{model}\" ,\"max_tokens\":8}}"
        )
    };
    let (status, answer) = post("/v1/messages", sent("claude-sonnet-4-5")).await;
    assert_eq!((status, &answer["model"]), (200, &"big".into()), "{answer}");
    let seen = String::from_utf8(big.seen()[0].body.to_vec()).unwrap();
    assert_eq!(seen, sent("big"));
    assert_eq!(
        big.seen()[0].headers["content-length"],
        sent("big").len().to_string()
    );

    // The first glob that matches, in the order of the file; exact names.
    let (status, answer) = post("/v1/chat/completions", sent("claude-haiku-4-5")).await;
    assert_eq!((status, &answer["model"]), (200, &"small".into()));
    let (status, answer) = post("/v1/chat/completions", sent("gpt-5")).await;
    assert_eq!((status, &answer["model"]), (200, &"big".into()));
    // A model's own name is untouched; an unmatched name stays 404.
    let (status, _) = post("/v1/chat/completions", sent("small")).await;
    assert_eq!(status, 200);
    assert_eq!(small.seen()[1].body, sent("small").as_bytes());
    let (status, answer) = post("/v1/chat/completions", sent("gpt-4")).await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!((small.count(), big.count()), (2, 2));

    let alias = |pattern, model| {
        let gw = &gw;
        async move {
            let labels = [("alias", pattern), ("model", model)];
            gw.metric("poimen_gateway_alias_requests_total", &labels)
                .await
        }
    };
    assert_eq!(alias("claude-*", "big").await, 1.0);
    assert_eq!(alias("claude-haiku-*", "small").await, 1.0);
    assert_eq!(alias("gpt-5", "big").await, 1.0);
    let served = [("model", "big"), ("code", "200")];
    assert_eq!(
        gw.metric("poimen_gateway_tenant_requests_total", &served)
            .await,
        2.0
    );
    eventually("four prefix_cache lines", || async {
        gw.cache_lines().len() >= 4
    })
    .await;
    let asked: Vec<_> = gw
        .cache_lines()
        .iter()
        .map(|l| (l["model"].clone(), l["asked_model"].clone()))
        .collect();
    assert!(
        asked.contains(&("big".into(), "claude-sonnet-4-5".into())),
        "{asked:?}"
    );
    assert!(
        asked.contains(&("small".into(), serde_json::Value::Null)),
        "{asked:?}"
    );
}
