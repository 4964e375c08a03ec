//! Shared test support: fake backends, the gateway process, a client.

pub mod backend;
pub mod gateway;
pub mod metrics;

pub use backend::{FakeBackend, Reply};
pub use gateway::Gateway;

use serde_json::json;

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A chat completion body with `model` last, as the OpenAI SDKs write it.
pub fn chat_body(model: &str, content: &str) -> String {
    let messages = json!([{"role": "user", "content": content}]);
    format!(r#"{{"messages":{messages},"max_tokens":4,"model":"{model}"}}"#)
}

/// POST a chat completion, with a cache key when given.
pub async fn chat(gw: &Gateway, model: &str, key: Option<&str>) -> reqwest::Response {
    let mut req = client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_body(model, "hello"));
    if let Some(key) = key {
        req = req.header("X-Poimen-Cache-Key", key);
    }
    req.send().await.unwrap()
}

pub fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}
