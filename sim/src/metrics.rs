//! Counters for `/metrics` (Prometheus text, written by hand) and
//! `/sim/stats` (JSON for tests).
//!
//! The prefix-cache counters count tokens, as vLLM's do: queries add each
//! admitted request's prompt tokens, hits add its cached tokens.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use http::HeaderMap;
use serde::Serialize;

#[derive(Debug, Default)]
pub struct Metrics {
    /// Generation requests received (chat, completions, responses,
    /// messages), any outcome.
    pub requests: AtomicU64,
    /// Generation requests that produced their whole answer.
    pub successes: AtomicU64,
    /// Prompt tokens of admitted requests (= prefix cache queries).
    pub prompt_tokens: AtomicU64,
    /// Cached prompt tokens of admitted requests (= prefix cache hits).
    pub cached_tokens: AtomicU64,
    /// Prompt tokens of requests whose prefill finished
    /// (`vllm:prompt_tokens_total`), and their cached part
    /// (`vllm:prompt_tokens_cached_total`).
    pub prefilled_tokens: AtomicU64,
    pub prefilled_cached_tokens: AtomicU64,
    /// Adapters loaded by `POST /v1/load_lora_adapter` (start-up ones not
    /// counted), and adapters unloaded.
    pub lora_loads: AtomicU64,
    pub lora_unloads: AtomicU64,
    /// Adapter loads that failed in the engine (`--lora-load-fails`).
    pub lora_load_failures: AtomicU64,
    /// Requests currently held by the `hang` fault.
    pub hanging: AtomicU64,
    last_headers: Mutex<BTreeMap<String, String>>,
}

/// Point-in-time values that live outside `Metrics` (scheduler, cache).
#[derive(Debug, Clone, Copy)]
pub struct Gauges {
    pub running: usize,
    pub waiting: usize,
    pub max_running_seen: usize,
    /// Requests that waited for a slot, and their total wait in µs.
    pub queued: (u64, u64),
    pub kv_cache_usage_perc: f64,
    pub cached_blocks: usize,
    /// KV event batches dropped, when the events are published.
    pub kv_events_dropped: Option<u64>,
}

/// Body of `GET /sim/stats`.
#[derive(Debug, Serialize)]
pub struct StatsBody {
    pub requests: u64,
    pub running: usize,
    pub waiting: usize,
    pub max_running_seen: usize,
    /// Requests that found every slot taken and waited (since start).
    pub queued_total: u64,
    /// Their total wait, in seconds.
    pub queue_wait_seconds_total: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub successes: u64,
    pub hanging: u64,
    pub cached_blocks: usize,
    pub kv_cache_usage_perc: f64,
    pub fault: &'static str,
    pub last_headers: BTreeMap<String, String>,
}

impl Metrics {
    /// Counts a generation request and remembers its headers for tests.
    /// `http` already lowercases names; repeated headers are joined by ", ".
    pub fn record_request(&self, headers: &HeaderMap) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut map = BTreeMap::new();
        for (name, value) in headers {
            let v = String::from_utf8_lossy(value.as_bytes()).into_owned();
            map.entry(name.as_str().to_owned())
                .and_modify(|old: &mut String| {
                    old.push_str(", ");
                    old.push_str(&v);
                })
                .or_insert(v);
        }
        *self.last_headers.lock().expect("headers lock") = map;
    }

    pub fn add_prefix_query(&self, prompt_tokens: usize, cached_tokens: usize) {
        self.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(cached_tokens as u64, Ordering::Relaxed);
    }

    pub fn add_prefilled(&self, prompt_tokens: usize, cached_tokens: usize) {
        self.prefilled_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.prefilled_cached_tokens
            .fetch_add(cached_tokens as u64, Ordering::Relaxed);
    }

    pub fn stats(&self, g: Gauges, fault: &'static str) -> StatsBody {
        StatsBody {
            requests: self.requests.load(Ordering::Relaxed),
            running: g.running,
            waiting: g.waiting,
            max_running_seen: g.max_running_seen,
            queued_total: g.queued.0,
            queue_wait_seconds_total: g.queued.1 as f64 / 1e6,
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            cached_tokens: self.cached_tokens.load(Ordering::Relaxed),
            successes: self.successes.load(Ordering::Relaxed),
            hanging: self.hanging.load(Ordering::Relaxed),
            cached_blocks: g.cached_blocks,
            kv_cache_usage_perc: g.kv_cache_usage_perc,
            fault,
            last_headers: self.last_headers.lock().expect("headers lock").clone(),
        }
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn prometheus(&self, model: &str, g: Gauges) -> String {
        let label = format!("{{model_name=\"{}\"}}", escape_label(model));
        let mut out = String::new();
        let mut put = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name}{label} {value}");
        };
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed).to_string();
        put(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            g.running.to_string(),
        );
        put(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            g.waiting.to_string(),
        );
        put(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            g.kv_cache_usage_perc.to_string(),
        );
        put(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            load(&self.prompt_tokens),
        );
        put(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            load(&self.cached_tokens),
        );
        put(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            load(&self.prefilled_tokens),
        );
        put(
            "vllm:prompt_tokens_cached_total",
            "counter",
            "Number of cached prompt tokens (local + external).",
            load(&self.prefilled_cached_tokens),
        );
        put(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            load(&self.successes),
        );
        put(
            "sim_requests_total",
            "counter",
            "Generation requests received by the simulator (any outcome).",
            load(&self.requests),
        );
        put(
            "sim_lora_loads_total",
            "counter",
            "LoRA adapters loaded by POST /v1/load_lora_adapter.",
            load(&self.lora_loads),
        );
        put(
            "sim_lora_load_failures_total",
            "counter",
            "LoRA adapter loads that failed in the engine (--lora-load-fails).",
            load(&self.lora_load_failures),
        );
        put(
            "sim_lora_unloads_total",
            "counter",
            "LoRA adapters unloaded by POST /v1/unload_lora_adapter.",
            load(&self.lora_unloads),
        );
        put(
            "sim_max_running_seen",
            "gauge",
            "Largest number of requests seen running at once.",
            g.max_running_seen.to_string(),
        );
        if let Some(n) = g.kv_events_dropped {
            put(
                "sim_kv_events_dropped_total",
                "counter",
                "KV event batches dropped because the publisher fell behind.",
                n.to_string(),
            );
        }
        out
    }
}

/// Escapes a Prometheus label value (backslash, quote, newline).
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauges() -> Gauges {
        Gauges {
            running: 2,
            waiting: 3,
            max_running_seen: 4,
            queued: (5, 6_000_000),
            kv_cache_usage_perc: 0.25,
            cached_blocks: 7,
            kv_events_dropped: None,
        }
    }

    #[test]
    fn prometheus_text_has_the_vllm_series() {
        let m = Metrics::default();
        m.add_prefix_query(100, 32);
        m.add_prefilled(100, 32);
        m.successes.fetch_add(1, Ordering::Relaxed);
        let text = m.prometheus("m\"x", gauges());
        let l = r#"{model_name="m\"x"}"#;
        for line in [
            format!("vllm:prefix_cache_queries_total{l} 100"),
            format!("vllm:prefix_cache_hits_total{l} 32"),
            format!("vllm:prompt_tokens_total{l} 100"),
            format!("vllm:prompt_tokens_cached_total{l} 32"),
            format!("vllm:num_requests_running{l} 2"),
            format!("vllm:num_requests_waiting{l} 3"),
            format!("vllm:request_success_total{l} 1"),
            "# TYPE vllm:prefix_cache_hits_total counter".to_string(),
        ] {
            assert!(text.lines().any(|x| x == line), "missing {line}\n{text}");
        }
    }

    #[test]
    fn last_headers_are_lowercase_and_joined() {
        let m = Metrics::default();
        let mut h = HeaderMap::new();
        h.append("X-Route", "a".parse().unwrap());
        h.append("x-route", "b".parse().unwrap());
        m.record_request(&h);
        let s = m.stats(gauges(), "none");
        assert_eq!(s.requests, 1);
        assert_eq!((s.queued_total, s.queue_wait_seconds_total), (5, 6.0));
        assert_eq!(
            s.last_headers.get("x-route").map(String::as_str),
            Some("a, b")
        );
    }
}
