//! Shared test support: fake backends, the gateway process, its listeners,
//! a client.

pub mod backend;
pub mod certs;
pub mod daemons;
pub mod dns;
pub mod gateway;
pub mod metrics;
pub mod otlp;
pub mod ports;
pub mod sdk;
pub mod sim;
/// The unit tests' key maker, shared.
#[path = "../../src/auth/test_keys.rs"]
pub mod test_keys;

pub use backend::{FakeBackend, Reply};
pub use gateway::Gateway;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use poimen_gateway::routing::rendezvous::rank;
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

/// GET a path of the gateway.
pub async fn get(gw: &Gateway, path: &str) -> reqwest::Response {
    client().get(gw.url(path)).send().await.unwrap()
}

/// A chat completion in the background; resolves to its status.
pub fn spawn_chat(gw: &Arc<Gateway>, key: &'static str) -> tokio::task::JoinHandle<u16> {
    let gw = gw.clone();
    tokio::spawn(async move { chat(&gw, "m", Some(key)).await.status().as_u16() })
}

/// A key whose rendezvous owner among `addrs` (each of weight 1) is `owner`.
pub fn key_owned_by(owner: SocketAddr, addrs: &[SocketAddr]) -> String {
    let mut sorted = addrs.to_vec();
    sorted.sort();
    let list: Vec<(String, u32)> = sorted.iter().map(|a| (a.to_string(), 1)).collect();
    (0..)
        .map(|i| format!("key-{i}"))
        .find(|k| list[rank(k.as_bytes(), &list)[0]].0 == owner.to_string())
        .unwrap()
}

/// Poll `cond` until it holds or 10 s pass.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
