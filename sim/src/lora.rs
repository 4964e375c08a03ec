//! LoRA adapters as vLLM 0.32 keeps them (`OpenAIServingModels`): a list of
//! loaded adapters (name and path) served beside the base model, filled at
//! start from `--lora-modules` and, when runtime updating is allowed, by
//! `POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter`
//! (`lora_routes`). What vLLM answers is in docs/vllm-apis.md.
//!
//! Loads and unloads of one name are serialized by a lock per name, held
//! across the (simulated) engine load, as vLLM does: a second load of a
//! name waits for the first and then finds it loaded. The simulator has no
//! weights: every path loads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use serde::de::IgnoredAny;
use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

use crate::common::ApiError;
use crate::timing::pause;

/// One `--lora-modules` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    pub name: String,
    pub path: String,
}

/// The JSON form of `--lora-modules` (vLLM's `LoRAModulePath` fields).
/// With one served base model `base_model_name` changes nothing: vLLM
/// takes it as the parent only when it names a served model, else the
/// first one, which is the same model here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModuleJson {
    name: String,
    path: String,
    #[serde(default, rename = "base_model_name")]
    _base_model_name: Option<IgnoredAny>,
    #[serde(default, rename = "is_3d_lora_weight")]
    _is_3d_lora_weight: Option<IgnoredAny>,
}

/// Parses a `--lora-modules` value as vLLM's `LoRAParserAction` does:
/// `name=path` when it has a `=` and no `,`, else a JSON object.
pub fn parse_module(item: &str) -> Result<LoraModule, String> {
    if let (Some((name, path)), false) = (item.split_once('='), item.contains(',')) {
        return Ok(LoraModule {
            name: name.to_owned(),
            path: path.to_owned(),
        });
    }
    let value: serde_json::Value = serde_json::from_str(item)
        .map_err(|_| format!("Invalid JSON format for --lora-modules: {item}"))?;
    let m: ModuleJson = serde_json::from_value(value)
        .map_err(|e| format!("Invalid fields for --lora-modules: {item} - {e}"))?;
    Ok(LoraModule {
        name: m.name,
        path: m.path,
    })
}

/// The model a generation request runs on: the base model or an adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// Its name, the `model` of the answer.
    pub name: String,
    /// Seed of its prefix-cache block chain (`tokenize::block_hashes`).
    pub kv_namespace: u64,
}

impl Served {
    /// The base model; its chains start from 0.
    pub fn base(name: &str) -> Self {
        Served {
            name: name.to_owned(),
            kv_namespace: 0,
        }
    }

    /// An adapter: vLLM adds `("lora", name, path)` to every block's hash
    /// (`kv_cache_utils._gen_lora_extra_hash_keys`), so blocks never hit
    /// across adapters, nor for a name loaded again from another path.
    /// Hashes are chained, so seeding the first block is enough.
    fn adapter(a: &LoraModule) -> Self {
        let key = format!("lora\0{}\0{}", a.name, a.path);
        Served {
            name: a.name.clone(),
            kv_namespace: xxh3_64(key.as_bytes()),
        }
    }
}

#[derive(Debug)]
pub struct Adapters {
    base: String,
    runtime_updating: bool,
    /// Loaded adapters, in the order /v1/models lists them (vLLM's dict:
    /// first load order; a reload in place keeps its place).
    loaded: Mutex<Vec<LoraModule>>,
    /// vLLM's `lora_resolver_lock`: one lock per name ever loaded or
    /// unloaded, never removed.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Adapters {
    /// The start-up adapters, checked as vLLM's `init_static_loras` loads
    /// them (each one like a load request; the first error stops the
    /// server).
    pub fn new(base: &str, modules: &[LoraModule], runtime_updating: bool) -> Result<Self, String> {
        let a = Adapters {
            base: base.to_owned(),
            runtime_updating,
            loaded: Mutex::new(Vec::new()),
            locks: Mutex::new(HashMap::new()),
        };
        for m in modules {
            a.check_load(&m.name, &m.path, false)
                .map_err(|e| e.message)?;
            a.loaded().push(m.clone());
        }
        Ok(a)
    }

    /// Whether the load/unload routes exist (VLLM_ALLOW_RUNTIME_LORA_UPDATING).
    pub fn runtime_updating(&self) -> bool {
        self.runtime_updating
    }

    /// A snapshot of the loaded adapters, in listing order.
    pub fn list(&self) -> Vec<LoraModule> {
        self.loaded().clone()
    }

    /// The loaded adapter called `name`. With runtime updating on, vLLM's
    /// model check goes through `resolve_lora`, which takes the name's
    /// lock: a request naming an adapter being loaded waits for the load
    /// and is then served. A name never loaded has no lock and no load to
    /// wait for.
    pub async fn find(&self, name: &str) -> Option<Served> {
        if let Some(s) = self.get(name) {
            return Some(s);
        }
        if !self.runtime_updating {
            return None;
        }
        let lock = self.locks.lock().expect("lora locks").get(name).cloned()?;
        drop(lock.lock().await);
        self.get(name)
    }

    /// `load_lora_adapter`: the checks, then the engine load (`delay`; it
    /// `fails`, or not), all under the name's lock. The answer is vLLM's
    /// success text.
    pub async fn load(
        &self,
        name: &str,
        path: &str,
        load_inplace: bool,
        delay: Duration,
        fails: bool,
    ) -> Result<String, ApiError> {
        let lock = self.lock_for(name);
        let _held = lock.lock().await;
        self.check_load(name, path, load_inplace)?;
        pause(delay).await;
        if fails {
            return Err(ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                kind: "InternalServerError",
                param: None,
                message: format!("Loading lora {name} failed: simulated engine failure"),
            });
        }
        let adapter = LoraModule {
            name: name.to_owned(),
            path: path.to_owned(),
        };
        let mut loaded = self.loaded();
        match loaded.iter_mut().find(|a| a.name == name) {
            Some(old) => *old = adapter,
            None => loaded.push(adapter),
        }
        log::info!("loaded LoRA adapter '{name}' from '{path}'");
        Ok(format!(
            "Success: LoRA adapter '{name}' added successfully."
        ))
    }

    /// `unload_lora_adapter` (vLLM only forgets the name; nothing runs).
    pub async fn unload(&self, name: &str) -> Result<String, ApiError> {
        if name.is_empty() {
            return Err(invalid_input(
                "'lora_name' needs to be provided to unload a LoRA adapter.".into(),
            ));
        }
        let lock = self.lock_for(name);
        let _held = lock.lock().await;
        let mut loaded = self.loaded();
        let Some(i) = loaded.iter().position(|a| a.name == name) else {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                kind: "NotFoundError",
                param: None,
                message: format!("The lora adapter '{name}' cannot be found."),
            });
        };
        loaded.remove(i);
        log::info!("unloaded LoRA adapter '{name}'");
        Ok(format!(
            "Success: LoRA adapter '{name}' removed successfully."
        ))
    }

    /// vLLM's `_check_load_lora_adapter_request`, in its order.
    fn check_load(&self, name: &str, path: &str, load_inplace: bool) -> Result<(), ApiError> {
        if name.is_empty() || path.is_empty() {
            return Err(invalid_input(
                "Both 'lora_name' and 'lora_path' must be provided.".into(),
            ));
        }
        if name == self.base {
            return Err(invalid_input(format!(
                "The lora adapter '{name}' conflicts with a served base model."
            )));
        }
        if !load_inplace && self.get(name).is_some() {
            return Err(invalid_input(format!(
                "The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."
            )));
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Option<Served> {
        self.loaded()
            .iter()
            .find(|a| a.name == name)
            .map(Served::adapter)
    }

    fn lock_for(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().expect("lora locks");
        Arc::clone(locks.entry(name.to_owned()).or_default())
    }

    fn loaded(&self) -> std::sync::MutexGuard<'_, Vec<LoraModule>> {
        self.loaded.lock().expect("lora list")
    }
}

/// vLLM's 400 for a load or unload request it refuses.
fn invalid_input(message: String) -> ApiError {
    ApiError {
        kind: "InvalidUserInput",
        ..ApiError::bad_request(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(name: &str, path: &str) -> LoraModule {
        LoraModule {
            name: name.into(),
            path: path.into(),
        }
    }

    #[test]
    fn module_specs_parse_as_vllm_does() {
        assert_eq!(parse_module("a=/p/a").unwrap(), module("a", "/p/a"));
        assert_eq!(parse_module("a=/p=x").unwrap(), module("a", "/p=x"));
        let json = r#"{"name":"b","path":"/p/b","base_model_name":"sim-model"}"#;
        assert_eq!(parse_module(json).unwrap(), module("b", "/p/b"));
        // A comma means JSON, even with a '='.
        assert_eq!(
            parse_module("a=/p,q").unwrap_err(),
            "Invalid JSON format for --lora-modules: a=/p,q"
        );
        assert!(parse_module(r#"{"name":"b","path":"/p","rank":8}"#)
            .unwrap_err()
            .starts_with("Invalid fields for --lora-modules:"));
        assert!(parse_module(r#"{"name":"b"}"#).is_err());
    }

    #[test]
    fn start_up_adapters_are_checked_like_loads() {
        let ok = Adapters::new("base", &[module("a", "/a"), module("b", "/b")], false).unwrap();
        assert_eq!(ok.list(), vec![module("a", "/a"), module("b", "/b")]);
        let twice = Adapters::new("base", &[module("a", "/a"), module("a", "/b")], false);
        assert_eq!(
            twice.unwrap_err(),
            "The lora adapter 'a' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."
        );
        let base = Adapters::new("base", &[module("base", "/a")], false);
        assert_eq!(
            base.unwrap_err(),
            "The lora adapter 'base' conflicts with a served base model."
        );
    }

    #[test]
    fn adapters_have_their_own_cache_namespace() {
        let a = Served::adapter(&module("a", "/a"));
        assert_ne!(a.kv_namespace, Served::base("base").kv_namespace);
        assert_ne!(
            a.kv_namespace,
            Served::adapter(&module("b", "/a")).kv_namespace
        );
        // The same name from another path is another adapter to the cache.
        assert_ne!(
            a.kv_namespace,
            Served::adapter(&module("a", "/b")).kv_namespace
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_load_of_a_name_waits_for_the_first_and_is_refused() {
        let a = Adapters::new("base", &[], true).unwrap();
        let delay = Duration::from_millis(50);
        let start = tokio::time::Instant::now();
        let (first, second, other) = tokio::join!(
            a.load("x", "/x", false, delay, false),
            a.load("x", "/x", false, delay, false),
            a.load("y", "/y", false, delay, false),
        );
        assert_eq!(
            first.unwrap(),
            "Success: LoRA adapter 'x' added successfully."
        );
        let e = second.unwrap_err();
        assert_eq!(
            (e.status, e.kind),
            (StatusCode::BAD_REQUEST, "InvalidUserInput")
        );
        assert!(other.is_ok());
        // The second waited for the first; `y` loaded alongside.
        assert_eq!(start.elapsed(), delay);
        // In place: the same place in the list, the new path.
        let names = |l: Vec<LoraModule>| l.into_iter().map(|m| m.name).collect::<Vec<_>>();
        let before = names(a.list());
        a.load("x", "/x2", true, delay, false).await.unwrap();
        assert_eq!(names(a.list()), before);
        assert!(a.list().contains(&module("x", "/x2")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_for_an_adapter_being_loaded_waits_for_it() {
        let a = Adapters::new("base", &[], true).unwrap();
        let load = a.load("x", "/x", false, Duration::from_millis(50), false);
        let (loaded, found) = tokio::join!(load, async {
            tokio::task::yield_now().await;
            a.find("x").await
        });
        assert!(loaded.is_ok());
        assert_eq!(found.map(|s| s.name).as_deref(), Some("x"));
        assert_eq!(a.find("never").await, None);
    }

    #[tokio::test]
    async fn unload_forgets_the_name_and_refuses_unknown_ones() {
        let a = Adapters::new("base", &[module("a", "/a")], true).unwrap();
        assert_eq!(
            a.unload("a").await.unwrap(),
            "Success: LoRA adapter 'a' removed successfully."
        );
        assert!(a.list().is_empty());
        let e = a.unload("a").await.unwrap_err();
        assert_eq!(
            (e.status, e.kind, e.param, e.message.as_str()),
            (
                StatusCode::NOT_FOUND,
                "NotFoundError",
                None,
                "The lora adapter 'a' cannot be found."
            )
        );
        assert_eq!(a.unload("").await.unwrap_err().kind, "InvalidUserInput");
    }
}
