//! Adapters loaded on demand (`models[].load_adapters_from`): a request for
//! an adapter the directory holds and no backend of the pool has loaded
//! loads it on the backend routing picks for that request (vLLM's `POST
//! /v1/load_lora_adapter`, which needs `VLLM_ALLOW_RUNTIME_LORA_UPDATING`),
//! once: the requests for it meanwhile wait for that load.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderValue;
use pingora::connectors::http::Connector;
use pingora::prelude::HttpPeer;

use super::{Card, Catalog};
use crate::upstream;

/// The most of a failed load's answer kept for the client.
const ERROR_BYTES: usize = 4096;

pub struct Loader {
    connector: Connector,
    authorization: Option<HeaderValue>,
    /// The longest a load may take.
    timeout: Duration,
    /// A lock per adapter being loaded.
    loading: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Adapter `name`'s directory in `dir`, if it holds one: a plain name (no
/// path separators, not `.` or `..`) with an `adapter_config.json`, as PEFT
/// writes it.
pub fn adapter_path(dir: &Path, name: &str) -> Option<PathBuf> {
    let plain =
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
    let path = dir.join(name);
    (plain && path.join("adapter_config.json").is_file()).then_some(path)
}

impl Loader {
    pub fn new(
        connector: Connector,
        authorization: Option<HeaderValue>,
        timeout: Duration,
    ) -> Self {
        Loader {
            connector,
            authorization,
            timeout,
            loading: Mutex::default(),
        }
    }

    /// Load adapter `name` from `path` on `addr` (`peer`) of learned pool
    /// `pool`, unless it is served by the time this request's turn comes:
    /// whether this call loaded it.
    pub async fn load<P>(
        &self,
        catalog: &Catalog<P>,
        pool: usize,
        (addr, peer): (SocketAddr, HttpPeer),
        name: &str,
        path: &Path,
    ) -> Result<bool, String> {
        let lock = {
            let mut loading = self.loading.lock().unwrap_or_else(|e| e.into_inner());
            loading.entry(name.to_string()).or_default().clone()
        };
        let held = lock.lock().await;
        if catalog.served(name).is_some() {
            return Ok(false); // loaded while this request waited
        }
        let body = serde_json::json!({"lora_name": name, "lora_path": path}).to_string();
        let request =
            upstream::post_json("/v1/load_lora_adapter", addr, self.authorization.as_ref());
        let ask = async {
            let mut session = upstream::send(&self.connector, &peer, request?, Some(body)).await?;
            let status = session.response_header()?.status.as_u16();
            Some((status, upstream::body(&mut session, ERROR_BYTES).await))
        };
        let answer = tokio::time::timeout(self.timeout, ask).await;
        if let Ok(Some((200, _))) = answer {
            // Served before the next request can take the lock.
            let id = name.to_string();
            catalog.loaded(pool, addr, Card { id, parent: None });
        }
        drop(held);
        self.loading
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        match answer {
            Ok(Some((200, _))) => Ok(true),
            Ok(Some((status, body))) => Err(format!(
                "loading adapter `{name}` on {addr} failed ({status}): {}",
                String::from_utf8_lossy(&body)
            )),
            Ok(None) => Err(format!(
                "loading adapter `{name}` on {addr} failed: no answer"
            )),
            Err(_) => Err(format!(
                "loading adapter `{name}` on {addr} took over {:?}",
                self.timeout
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_name_with_an_adapter_config_is_an_adapter() {
        let dir = std::env::temp_dir().join(format!("poimen-adapters-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sql")).unwrap();
        std::fs::write(dir.join("sql/adapter_config.json"), "{}").unwrap();
        std::fs::create_dir_all(dir.join("empty")).unwrap();
        assert_eq!(adapter_path(&dir, "sql"), Some(dir.join("sql")));
        for name in ["empty", "missing", "", ".", "..", "sql/", "../sql", "a\\b"] {
            assert_eq!(adapter_path(&dir, name), None, "{name:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
