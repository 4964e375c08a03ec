//! Shared server state: configuration, cache, scheduler, faults, metrics,
//! LoRA adapters.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::batch::Scheduler;
use crate::cache::PrefixCache;
use crate::config::Args;
use crate::faults::Faults;
use crate::kv_events::Publisher;
use crate::lora::{Adapters, Served};
use crate::metrics::{Gauges, Metrics};
use crate::responses_store::ResponseStore;
use crate::timing::TimingModel;

#[derive(Debug)]
pub struct App {
    pub model: String,
    pub max_model_len: usize,
    pub block_size: usize,
    pub kv_cache_tokens: usize,
    pub default_max_tokens: usize,
    pub max_output_tokens: usize,
    pub cached_tokens_header: bool,
    pub timing: TimingModel,
    pub cache: Mutex<PrefixCache>,
    pub sched: Arc<Scheduler>,
    pub faults: Arc<Faults>,
    pub metrics: Metrics,
    pub adapters: Adapters,
    /// Every adapter load fails (`--lora-load-fails`).
    pub lora_load_fails: bool,
    /// KV tokens reserved by running requests, for `kv_cache_usage_perc`.
    pub kv_tokens_in_use: AtomicUsize,
    /// Whether `/v1/responses` stores responses (vLLM's
    /// VLLM_ENABLE_RESPONSES_API_STORE).
    pub responses_store_enabled: bool,
    pub responses: Mutex<ResponseStore>,
    /// Publishes the cache's changes (`--kv-events-port`); call it with
    /// `cache` locked.
    pub kv_events: Option<Publisher>,
    next_id: AtomicU64,
    /// Seed of `random_hex`, different in every process.
    id_seed: u64,
}

impl App {
    /// Without KV events (the tests' shorthand).
    #[cfg(test)]
    pub fn new(a: &Args) -> Arc<Self> {
        Self::with_kv_events(a, None)
    }

    /// `new`, publishing the cache's changes with `kv_events`.
    pub fn with_kv_events(a: &Args, kv_events: Option<Publisher>) -> Arc<Self> {
        let block_size = a.block_size as usize;
        Arc::new(App {
            model: a.model.clone(),
            max_model_len: a.max_model_len,
            block_size,
            kv_cache_tokens: a.kv_cache_tokens,
            default_max_tokens: a.default_max_tokens as usize,
            max_output_tokens: a.max_output_tokens as usize,
            cached_tokens_header: a.cached_tokens_header,
            timing: TimingModel {
                prefill_us_per_token: a.prefill_us_per_token,
                decode_us_per_token: a.decode_us_per_token,
                step_us_per_running_seq: a.step_us_per_running_seq,
                lora_load_us: a.lora_load_us,
                models_delay_us: a.models_delay_us,
                time_scale: a.time_scale,
            },
            cache: Mutex::new(PrefixCache::new(a.kv_cache_tokens / block_size)),
            sched: Scheduler::new(a.max_num_seqs as usize),
            faults: Faults::new(a.fault, a.slow_factor),
            metrics: Metrics::default(),
            adapters: Adapters::new(&a.model, &a.lora_modules, a.allow_runtime_lora_updating)
                .expect("start-up adapters checked by Args::validate"),
            lora_load_fails: a.lora_load_fails,
            kv_tokens_in_use: AtomicUsize::new(0),
            responses_store_enabled: !a.disable_responses_store,
            responses: Mutex::new(ResponseStore::new(a.responses_store_bytes)),
            kv_events,
            next_id: AtomicU64::new(1),
            id_seed: process_seed(),
        })
    }

    /// The base model, what a request without a `model` runs on.
    pub fn base(&self) -> Served {
        Served::base(&self.model)
    }

    /// Next request number, for ids like `chatcmpl-<n>`.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// 16 hex digits unique to this process and call, as vLLM's
    /// `random_uuid()` gives: ids like `resp_...` must not repeat on
    /// another simulator, or a response id would be "known" to a server
    /// that never answered it.
    pub fn random_hex(&self) -> String {
        let n = self.next_id().to_le_bytes();
        format!("{:016x}", xxh3_64_with_seed(&n, self.id_seed))
    }

    /// Empties the prefix cache (vLLM's `/reset_prefix_cache`).
    pub fn reset_prefix_cache(&self) {
        let mut cache = self.cache.lock().expect("cache lock");
        match &self.kv_events {
            Some(p) => p.clear(&mut cache),
            None => cache.clear(),
        }
    }

    /// Fraction (0..=1) of the KV cache reserved by running requests.
    pub fn kv_cache_usage(&self) -> f64 {
        let used = self.kv_tokens_in_use.load(Ordering::Relaxed) as f64;
        (used / self.kv_cache_tokens as f64).min(1.0)
    }

    pub fn gauges(&self) -> Gauges {
        Gauges {
            running: self.sched.running(),
            waiting: self.sched.waiting(),
            max_running_seen: self.sched.max_running_seen(),
            queued: self.sched.queued(),
            kv_cache_usage_perc: self.kv_cache_usage(),
            cached_blocks: self.cache.lock().expect("cache lock").len(),
            kv_events_dropped: self
                .kv_events
                .as_ref()
                .map(|p| p.dropped.load(Ordering::Relaxed)),
        }
    }
}

/// Start time (ns) and pid, hashed.
fn process_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut b = nanos.to_le_bytes().to_vec();
    b.extend_from_slice(&std::process::id().to_le_bytes());
    xxh3_64(&b)
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
