//! Command-line flags (clap derive) and the fault-mode enum they share with
//! the runtime `/sim/fault` switch.

use std::net::SocketAddr;

use clap::{Parser, ValueEnum};
use serde::Deserialize;

use crate::lora::{self, LoraModule};

/// vLLM's switch for the adapter load/unload routes, also read by the
/// simulator (`--allow-runtime-lora-updating` is the same switch).
pub const RUNTIME_LORA_ENV: &str = "VLLM_ALLOW_RUNTIME_LORA_UPDATING";

/// A simulated vLLM 0.32 OpenAI-compatible server for routing and caching
/// tests. Delays are in microseconds and all multiplied by `--time-scale`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "vllm-sim",
    version,
    about = "A simulated vLLM server: prefix KV cache, continuous batching, vLLM-shaped responses"
)]
pub struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,

    /// Served model name; requests naming another model get 404.
    #[arg(long, default_value = "sim-model")]
    pub model: String,

    /// Maximum prompt + output tokens per request (also shown in /v1/models).
    #[arg(long, default_value_t = 32768)]
    pub max_model_len: usize,

    /// Tokens per KV-cache block; only full blocks are cached.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub block_size: u32,

    /// KV-cache capacity in tokens; the prefix cache holds at most
    /// kv_cache_tokens / block_size blocks (LRU eviction beyond that).
    #[arg(long, default_value_t = 65536)]
    pub kv_cache_tokens: usize,

    /// Maximum number of requests running at once; the rest wait in FIFO.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_num_seqs: u32,

    /// Prefill cost per uncached prompt token, in microseconds.
    #[arg(long, default_value_t = 20)]
    pub prefill_us_per_token: u64,

    /// Base decode time per output token (one decode step), in microseconds.
    #[arg(long, default_value_t = 2000)]
    pub decode_us_per_token: u64,

    /// Extra cost of each decode step per running request, in microseconds.
    #[arg(long, default_value_t = 200)]
    pub step_us_per_running_seq: u64,

    /// Output tokens when the request sets no max_tokens.
    #[arg(long, default_value_t = 16)]
    pub default_max_tokens: u32,

    /// Cap on output tokens per request.
    #[arg(long, default_value_t = 256)]
    pub max_output_tokens: u32,

    /// Multiplies every delay; 0 disables all delays.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,

    /// Add `vllm-num-cached-tokens: K` to completion responses.
    #[arg(long)]
    pub cached_tokens_header: bool,

    /// Byte budget of the Responses API store (stored responses and their
    /// conversations); the oldest are dropped beyond it.
    #[arg(long, default_value_t = 256 << 20)]
    pub responses_store_bytes: usize,

    /// Store no Responses API response, as vLLM does unless
    /// VLLM_ENABLE_RESPONSES_API_STORE=1: `store` is ignored and every
    /// `previous_response_id` is unknown (404).
    #[arg(long)]
    pub disable_responses_store: bool,

    /// LoRA adapters served from the start, as vLLM's flag takes them:
    /// `name=path`, or JSON `{"name": .., "path": .., "base_model_name": ..}`;
    /// several values. A request naming one is served like the base model,
    /// answering with the adapter's name.
    #[arg(long, num_args = 1.., value_name = "SPEC", value_parser = lora::parse_module)]
    pub lora_modules: Vec<LoraModule>,

    /// Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (else
    /// 404), as vLLM does with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 or true,
    /// which turns this on too.
    #[arg(long)]
    pub allow_runtime_lora_updating: bool,

    /// How long an adapter load takes, in microseconds.
    #[arg(long, default_value_t = 50_000)]
    pub lora_load_us: u64,

    /// Every adapter load fails in the engine after its load time: 500
    /// `InternalServerError`, as vLLM answers an engine failure (out of
    /// memory, a bad adapter).
    #[arg(long)]
    pub lora_load_fails: bool,

    /// How long `GET /v1/models` takes to answer, in microseconds (a busy
    /// API server's event loop).
    #[arg(long, default_value_t = 0)]
    pub models_delay_us: u64,

    /// Fault mode at start (also switchable with POST /sim/fault).
    #[arg(long, value_enum, default_value_t = FaultMode::None)]
    pub fault: FaultMode,

    /// Delay multiplier used by the `slow` fault.
    #[arg(long, default_value_t = 10.0)]
    pub slow_factor: f64,

    /// If set, the start-up fault reverts to `none` after this many ms.
    #[arg(long)]
    pub fault_duration_ms: Option<u64>,

    /// Publish KV-cache events as vLLM does: a ZeroMQ PUB socket bound on
    /// the --listen host at this port (0: a free one, logged). Off if unset.
    #[arg(long, value_name = "PORT")]
    pub kv_events_port: Option<u16>,

    /// Also serve the replay of recent events on a ZeroMQ ROUTER socket
    /// bound on the --listen host at this port (needs --kv-events-port).
    #[arg(long, value_name = "PORT", requires = "kv_events_port")]
    pub kv_replay_port: Option<u16>,

    /// Topic frame of every event message (vLLM's default: empty).
    #[arg(long, default_value = "", value_name = "TOPIC")]
    pub kv_events_topic: String,
}

/// What the server does wrong on purpose.
#[derive(ValueEnum, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FaultMode {
    /// Behave normally.
    None,
    /// Close the listening socket so new connections are refused.
    Refuse,
    /// Accept requests and never answer them.
    Hang,
    /// Answer 500 with an OpenAI-shaped error.
    Error,
    /// Multiply all delays by the slow factor.
    Slow,
}

impl FaultMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FaultMode::None => "none",
            FaultMode::Refuse => "refuse",
            FaultMode::Hang => "hang",
            FaultMode::Error => "error",
            FaultMode::Slow => "slow",
        }
    }
}

impl Args {
    /// Rejects flag combinations that clap cannot check on its own.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.time_scale.is_finite() && self.time_scale >= 0.0) {
            return Err("--time-scale must be a finite number >= 0".into());
        }
        if !(self.slow_factor.is_finite() && self.slow_factor >= 0.0) {
            return Err("--slow-factor must be a finite number >= 0".into());
        }
        if self.kv_cache_tokens < self.block_size as usize {
            return Err("--kv-cache-tokens must hold at least one block".into());
        }
        // vLLM refuses to start when a start-up adapter would not load.
        lora::Adapters::new(&self.model, &self.lora_modules, false).map(drop)
    }

    /// Turns runtime adapter updating on when the environment asks for it.
    pub fn with_env(mut self) -> Self {
        let var = std::env::var(RUNTIME_LORA_ENV).ok();
        self.allow_runtime_lora_updating |= env_is_true(var.as_deref());
        self
    }
}

/// vLLM's reading of VLLM_ALLOW_RUNTIME_LORA_UPDATING (`envs.py`): "1" or
/// "true", any case, surrounding spaces ignored.
fn env_is_true(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_ones() {
        let a = Args::parse_from(["vllm-sim"]);
        assert_eq!(a.listen.to_string(), "127.0.0.1:8000");
        assert_eq!(a.model, "sim-model");
        assert_eq!(a.block_size, 16);
        assert_eq!(a.kv_cache_tokens, 65536);
        assert_eq!(a.max_num_seqs, 4);
        assert_eq!(a.prefill_us_per_token, 20);
        assert_eq!(a.decode_us_per_token, 2000);
        assert_eq!(a.step_us_per_running_seq, 200);
        assert_eq!(a.max_output_tokens, 256);
        assert_eq!(a.time_scale, 1.0);
        assert_eq!(a.fault, FaultMode::None);
        assert!(!a.cached_tokens_header);
        assert_eq!(a.responses_store_bytes, 256 << 20);
        assert!(!a.disable_responses_store);
        assert!(a.lora_modules.is_empty());
        assert!(!a.allow_runtime_lora_updating);
        assert_eq!(a.lora_load_us, 50_000);
        assert_eq!((a.kv_events_port, a.kv_replay_port), (None, None));
        assert_eq!(a.kv_events_topic, "");
        assert!(a.validate().is_ok());
    }

    #[test]
    fn fault_flag_and_json_use_the_same_names() {
        let a = Args::parse_from(["vllm-sim", "--fault", "hang", "--listen", "127.0.0.1:0"]);
        assert_eq!(a.fault, FaultMode::Hang);
        let m: FaultMode = serde_json::from_str("\"refuse\"").unwrap();
        assert_eq!(m, FaultMode::Refuse);
        assert_eq!(FaultMode::Slow.as_str(), "slow");
    }

    #[test]
    fn kv_replay_needs_kv_events() {
        assert!(Args::try_parse_from(["vllm-sim", "--kv-replay-port", "1"]).is_err());
        let a = Args::parse_from(["vllm-sim", "--kv-events-port", "1", "--kv-replay-port", "2"]);
        assert_eq!((a.kv_events_port, a.kv_replay_port), (Some(1), Some(2)));
    }

    #[test]
    fn negative_time_scale_is_rejected() {
        let a = Args::parse_from(["vllm-sim", "--time-scale=-1"]);
        assert!(a.validate().is_err());
    }

    #[test]
    fn lora_modules_take_several_values_in_both_forms() {
        let a = Args::parse_from([
            "vllm-sim",
            "--lora-modules",
            "a=/p/a",
            r#"{"name":"b","path":"/p/b"}"#,
            "--lora-modules",
            "c=/p/c",
        ]);
        let names: Vec<&str> = a.lora_modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(a.validate().is_ok());
        let clash = Args::parse_from(["vllm-sim", "--lora-modules", "sim-model=/p"]);
        assert!(clash.validate().is_err());
        assert!(Args::try_parse_from(["vllm-sim", "--lora-modules", "{bad"]).is_err());
    }

    #[test]
    fn runtime_lora_env_is_read_as_vllm_reads_it() {
        for on in ["1", "true", " TRUE "] {
            assert!(env_is_true(Some(on)), "{on}");
        }
        for off in ["0", "yes", "false", ""] {
            assert!(!env_is_true(Some(off)), "{off}");
        }
        assert!(!env_is_true(None));
    }
}
