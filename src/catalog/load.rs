//! Adapters loaded on demand (`models[].load_adapters_from`): a request for
//! an adapter the directory holds and no backend of the pool has loaded
//! loads it on the backend routing picks for that request (vLLM's `POST
//! /v1/load_lora_adapter`, which needs `VLLM_ALLOW_RUNTIME_LORA_UPDATING`),
//! once: the requests for it meanwhile wait for that load and share its
//! outcome. A failed load is the answer for [`FAILED_LOAD_KEPT`] after it,
//! so that an adapter a backend cannot load is not asked again and again.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderValue;
use pingora::connectors::http::Connector;
use pingora::prelude::HttpPeer;

use super::{Card, Catalog};
use crate::upstream;

/// The most of a failed load's answer kept for the client.
const ERROR_BYTES: usize = 4096;

/// How long a failed load stands for every request for that adapter.
pub const FAILED_LOAD_KEPT: Duration = Duration::from_secs(5);

/// What vLLM answers (400) to a load of an adapter it has loaded.
const ALREADY_LOADED: &str = "has already been loaded";

pub struct Loader {
    connector: Connector,
    authorization: Option<HeaderValue>,
    /// The longest a load may take.
    timeout: Duration,
    /// Per adapter being loaded or that failed to: its lock, holding its
    /// last failure.
    loading: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Failed>>>>>,
}

/// How a request's load of an adapter went.
#[derive(Debug, PartialEq, Eq)]
pub enum Loaded {
    /// This request loaded it.
    Now,
    /// It was served by the time the request's turn came.
    Already,
}

/// A failed load, shared by every request that waited for it and those
/// that come within [`FAILED_LOAD_KEPT`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    /// For the client: what the backend answered.
    pub message: String,
    /// When it failed.
    at: Instant,
    /// Whether this request made the load (false: it shares another's).
    pub made: bool,
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

impl Failed {
    /// How long it still stands.
    pub fn stands_for(&self) -> Duration {
        FAILED_LOAD_KEPT.saturating_sub(self.at.elapsed())
    }
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
    /// `pool`, unless it is served, or failed to load within
    /// [`FAILED_LOAD_KEPT`], by the time this request's turn comes.
    pub async fn load<P>(
        &self,
        catalog: &Catalog<P>,
        pool: usize,
        (addr, peer): (SocketAddr, HttpPeer),
        name: &str,
        path: &Path,
    ) -> Result<Loaded, Failed> {
        let lock = {
            let mut loading = self.loading.lock().unwrap_or_else(|e| e.into_inner());
            loading.entry(name.to_string()).or_default().clone()
        };
        let mut last = lock.lock().await;
        if catalog.served(name).is_some() {
            return Ok(Loaded::Already); // loaded while this request waited
        }
        if let Some(failed) = last.as_ref().filter(|f| !f.stands_for().is_zero()) {
            return Err(Failed {
                made: false,
                ..failed.clone()
            });
        }
        let outcome = (self.ask(addr, &peer, name, path).await).map_err(|message| Failed {
            message,
            at: Instant::now(),
            made: true,
        });
        match &outcome {
            // Served before the next request can take the lock.
            Ok(()) => _ = catalog.loaded(pool, addr, Card::named(name)),
            Err(failed) => *last = Some(failed.clone()),
        }
        drop(last);
        if outcome.is_ok() {
            let mut loading = self.loading.lock().unwrap_or_else(|e| e.into_inner());
            loading.remove(name);
        }
        outcome.map(|()| Loaded::Now)
    }

    /// One `POST /v1/load_lora_adapter`: vLLM's answer that it has the
    /// adapter loaded already is a success.
    async fn ask(
        &self,
        addr: SocketAddr,
        peer: &HttpPeer,
        name: &str,
        path: &Path,
    ) -> Result<(), String> {
        let body = serde_json::json!({"lora_name": name, "lora_path": path}).to_string();
        let request =
            upstream::post_json("/v1/load_lora_adapter", addr, self.authorization.as_ref());
        let ask = async {
            let mut session = upstream::send(&self.connector, peer, request?, Some(body)).await?;
            let status = session.response_header()?.status.as_u16();
            Some((status, upstream::body(&mut session, ERROR_BYTES).await))
        };
        match tokio::time::timeout(self.timeout, ask).await {
            Ok(Some((200, _))) => Ok(()),
            Ok(Some((400, body))) if String::from_utf8_lossy(&body).contains(ALREADY_LOADED) => {
                Ok(())
            }
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
