//! Gateway configuration: the `gateway:` section of the Pingora YAML file,
//! parsed strictly and validated into the internal form the proxy uses.
//!
//! Pingora's own `ServerConf` keys (threads, pid_file, upgrade_sock, ...) stay
//! at the top level of the same file and are read by Pingora; only the
//! `gateway:` key is ours. Every error names the field path, the value and the
//! rule it broke, e.g. `gateway.models[1].addresses[0] = "x": not host:port`.

mod file;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::admission::Limits;
use crate::auth::ApiKeys;
pub use file::Overflow;
use file::{AddressFile, GatewayFile, HealthCheckFile, ModelFile, OneOrMany};

/// The validated gateway configuration.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub listen: Vec<SocketAddr>,
    pub metrics_listen: SocketAddr,
    pub failure_exclusion: Duration,
    pub max_request_body_bytes: usize,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub health_check: Option<HealthCheckConfig>,
    /// Keys clients must present; none: no authentication.
    pub api_keys: Option<ApiKeys>,
    pub upstream_api_key: Option<String>,
    pub stream_usage: bool,
    pub queue_timeout: Duration,
    pub overflow: Overflow,
    pub warmup: WarmupConfig,
    pub models: Vec<ModelConfig>,
}

#[derive(Debug, Clone)]
pub struct HealthCheckConfig {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub consecutive_ok: usize,
}

#[derive(Debug, Clone)]
pub struct WarmupConfig {
    pub delay: Duration,
    pub vllm_priority: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub name: String,
    pub backends: Vec<BackendConfig>,
    /// Admission limits of each of this model's backends.
    pub limits: Limits,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    pub addr: SocketAddr,
    pub weight: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid YAML: {0}")]
    Yaml(String),
    #[error("{path} = {value}: {rule}")]
    Invalid {
        path: String,
        value: String,
        rule: String,
    },
}

/// Upper bounds that catch unit mistakes (ms written as s, bytes as MiB).
const MAX_EXCLUSION_SECS: u64 = 3600;
const MAX_BODY_BYTES: u64 = 1 << 30;
const MAX_CONNECT_TIMEOUT_MS: u64 = 60_000;
const MAX_WEIGHT: u64 = 1000;
const MAX_BACKENDS_PER_MODEL: usize = 256;
const MAX_NUM_SEQS: u64 = 4096;
const MAX_QUEUE_DEPTH: u64 = 100_000;
const MAX_QUEUE_TIMEOUT_MS: u64 = 3_600_000;
const MAX_WARMUP_DELAY_MS: u64 = 60_000;
const MAX_READ_TIMEOUT_MS: u64 = 3_600_000;

type Field = fn(&mut GatewayFile) -> &mut u64;

/// Environment variables that override the file (CAG-2), with the field
/// each replaces and its range.
const ENV_OVERRIDES: [(&str, Field, u64, u64); 3] = [
    (
        "VLLM_MAX_NUM_SEQS",
        |g| &mut g.scheduler.max_num_seqs,
        1,
        MAX_NUM_SEQS,
    ),
    (
        "VLLM_MAX_QUEUE_DEPTH",
        |g| &mut g.scheduler.max_queue_depth,
        0,
        MAX_QUEUE_DEPTH,
    ),
    (
        "WARMUP_DELAY_MS",
        |g| &mut g.warmup.delay_ms,
        0,
        MAX_WARMUP_DELAY_MS,
    ),
];

/// The whole file: Pingora's keys are read by Pingora, we only take `gateway`.
#[derive(Deserialize)]
struct Document {
    gateway: Option<GatewayFile>,
}

impl GatewayConfig {
    /// Load a file, with the process environment's overrides.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml_with_env(&text, |var| std::env::var(var).ok())
    }

    /// Parse without environment overrides.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        Self::from_yaml_with_env(text, |_| None)
    }

    /// Parse, letting `env` (a variable lookup) override the file.
    pub fn from_yaml_with_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let doc: Document = serde_yaml::from_str(text).map_err(|e| {
            // serde_yaml names the path below the root; prefix ours.
            let msg = e.to_string();
            ConfigError::Yaml(if msg.starts_with("gateway") {
                msg
            } else {
                format!("gateway: {msg}")
            })
        })?;
        let mut gateway = doc
            .gateway
            .ok_or_else(|| invalid("gateway", "(missing)", "the gateway section is required"))?;
        for (var, field, lo, hi) in ENV_OVERRIDES {
            let Some(text) = env(var) else { continue };
            let value = text
                .trim()
                .parse::<u64>()
                .map_err(|_| invalid(var, &text, "not a whole number"))?;
            let value = in_range(var, value, lo, hi)?;
            *field(&mut gateway) = value;
        }
        validate(gateway)
    }

    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == name)
    }
}

fn invalid(path: impl Into<String>, value: impl std::fmt::Debug, rule: &str) -> ConfigError {
    ConfigError::Invalid {
        path: path.into(),
        value: format!("{value:?}"),
        rule: rule.into(),
    }
}

fn in_range(path: &str, value: u64, lo: u64, hi: u64) -> Result<u64, ConfigError> {
    if (lo..=hi).contains(&value) {
        Ok(value)
    } else {
        Err(invalid(
            path,
            value,
            &format!("must be between {lo} and {hi}"),
        ))
    }
}

fn socket_addr(path: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value
        .parse()
        .map_err(|_| invalid(path, value, "not host:port (an IP address and a port)"))
}

fn validate(file: GatewayFile) -> Result<GatewayConfig, ConfigError> {
    let listen_strings = match file.listen {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    };
    if listen_strings.is_empty() {
        return Err(invalid(
            "gateway.listen",
            "[]",
            "needs at least one address",
        ));
    }
    let mut listen = Vec::new();
    for (i, s) in listen_strings.iter().enumerate() {
        let addr = socket_addr(&format!("gateway.listen[{i}]"), s)?;
        if listen.contains(&addr) {
            return Err(invalid(format!("gateway.listen[{i}]"), s, "listed twice"));
        }
        listen.push(addr);
    }
    let metrics_listen = socket_addr("gateway.metrics_listen", &file.metrics_listen)?;
    if listen.contains(&metrics_listen) {
        return Err(invalid(
            "gateway.metrics_listen",
            &file.metrics_listen,
            "must differ from every gateway.listen address",
        ));
    }
    let exclusion = in_range(
        "gateway.failure_exclusion_secs",
        file.failure_exclusion_secs,
        1,
        MAX_EXCLUSION_SECS,
    )?;
    let body = in_range(
        "gateway.max_request_body_bytes",
        file.max_request_body_bytes,
        1024,
        MAX_BODY_BYTES,
    )?;
    let connect = in_range(
        "gateway.connect_timeout_ms",
        file.connect_timeout_ms,
        1,
        MAX_CONNECT_TIMEOUT_MS,
    )?;

    let read_timeout = in_range(
        "gateway.read_timeout_ms",
        file.read_timeout_ms,
        1,
        MAX_READ_TIMEOUT_MS,
    )?;
    let health_check = file.health_check.map(validate_health_check).transpose()?;
    let api_keys = match &file.auth.api_keys_file {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                invalid(
                    "gateway.auth.api_keys_file",
                    path,
                    &format!("cannot read: {e}"),
                )
            })?;
            Some(
                ApiKeys::parse(&text)
                    .map_err(|e: String| invalid("gateway.auth.api_keys_file", path, &e))?,
            )
        }
    };
    let upstream_api_key = file.auth.upstream_api_key;
    if let Some(key) = &upstream_api_key {
        if key.is_empty() || http::HeaderValue::from_str(&format!("Bearer {key}")).is_err() {
            // The key itself is a secret: never echo it.
            return Err(invalid(
                "gateway.auth.upstream_api_key",
                "(hidden)",
                "must be non-empty printable ASCII",
            ));
        }
    }
    let sched = &file.scheduler;
    let default_limits = Limits {
        max_num_seqs: in_range(
            "gateway.scheduler.max_num_seqs",
            sched.max_num_seqs,
            1,
            MAX_NUM_SEQS,
        )? as usize,
        max_queue_depth: in_range(
            "gateway.scheduler.max_queue_depth",
            sched.max_queue_depth,
            0,
            MAX_QUEUE_DEPTH,
        )? as usize,
    };
    let queue_timeout = in_range(
        "gateway.scheduler.queue_timeout_ms",
        sched.queue_timeout_ms,
        1,
        MAX_QUEUE_TIMEOUT_MS,
    )?;
    let warmup_delay = in_range(
        "gateway.warmup.delay_ms",
        file.warmup.delay_ms,
        0,
        MAX_WARMUP_DELAY_MS,
    )?;

    if file.models.is_empty() {
        return Err(invalid("gateway.models", "[]", "needs at least one model"));
    }
    let mut names = HashSet::new();
    let mut models = Vec::new();
    for (i, m) in file.models.into_iter().enumerate() {
        let path = format!("gateway.models[{i}]");
        let model = validate_model(&path, m, default_limits)?;
        if !names.insert(model.name.clone()) {
            return Err(invalid(
                format!("{path}.name"),
                &model.name,
                "duplicate model name",
            ));
        }
        models.push(model);
    }

    Ok(GatewayConfig {
        listen,
        metrics_listen,
        failure_exclusion: Duration::from_secs(exclusion),
        max_request_body_bytes: body as usize,
        connect_timeout: Duration::from_millis(connect),
        read_timeout: Duration::from_millis(read_timeout),
        health_check,
        api_keys,
        upstream_api_key,
        stream_usage: file.stream_usage,
        queue_timeout: Duration::from_millis(queue_timeout),
        overflow: sched.overflow,
        warmup: WarmupConfig {
            delay: Duration::from_millis(warmup_delay),
            vllm_priority: file.warmup.vllm_priority,
        },
        models,
    })
}

fn validate_health_check(h: HealthCheckFile) -> Result<HealthCheckConfig, ConfigError> {
    let at = "gateway.health_check";
    if !h.path.starts_with('/') || http::uri::PathAndQuery::try_from(h.path.as_str()).is_err() {
        return Err(invalid(
            format!("{at}.path"),
            &h.path,
            "must be a path starting with /",
        ));
    }
    Ok(HealthCheckConfig {
        interval: Duration::from_millis(in_range(
            &format!("{at}.interval_ms"),
            h.interval_ms,
            100,
            600_000,
        )?),
        timeout: Duration::from_millis(in_range(
            &format!("{at}.timeout_ms"),
            h.timeout_ms,
            1,
            60_000,
        )?),
        consecutive_ok: in_range(&format!("{at}.consecutive_ok"), h.consecutive_ok, 1, 100)?
            as usize,
        path: h.path,
    })
}

fn validate_model(path: &str, m: ModelFile, defaults: Limits) -> Result<ModelConfig, ConfigError> {
    if m.name.trim().is_empty() || m.name.chars().any(char::is_control) {
        return Err(invalid(
            format!("{path}.name"),
            &m.name,
            "must be a non-empty name without control characters",
        ));
    }
    let entries: Vec<(String, u64)> = match (m.address, m.addresses) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                path,
                &m.name,
                "set either `address` or `addresses`, not both",
            ))
        }
        (None, None) => return Err(invalid(path, &m.name, "needs `address` or `addresses`")),
        (Some(a), None) => vec![(a, 1)],
        (None, Some(list)) => list
            .into_iter()
            .map(|a| match a {
                AddressFile::Plain(s) => (s, 1),
                AddressFile::Weighted(w) => (w.address, w.weight),
            })
            .collect(),
    };
    let list_path = format!("{path}.addresses");
    if entries.is_empty() {
        return Err(invalid(list_path, "[]", "needs at least one address"));
    }
    if entries.len() > MAX_BACKENDS_PER_MODEL {
        return Err(invalid(
            list_path,
            entries.len(),
            &format!("at most {MAX_BACKENDS_PER_MODEL} backends per model"),
        ));
    }
    let mut backends: Vec<BackendConfig> = Vec::new();
    for (i, (address, weight)) in entries.iter().enumerate() {
        let at = format!("{list_path}[{i}]");
        let addr = socket_addr(&at, address)?;
        if backends.iter().any(|b| b.addr == addr) {
            return Err(invalid(at, address, "duplicate address in this model"));
        }
        let weight = in_range(&format!("{at}.weight"), *weight, 1, MAX_WEIGHT)? as u32;
        backends.push(BackendConfig { addr, weight });
    }
    let limits = Limits {
        max_num_seqs: match m.max_num_seqs {
            Some(n) => in_range(&format!("{path}.max_num_seqs"), n, 1, MAX_NUM_SEQS)? as usize,
            None => defaults.max_num_seqs,
        },
        max_queue_depth: match m.max_queue_depth {
            Some(n) => {
                in_range(&format!("{path}.max_queue_depth"), n, 0, MAX_QUEUE_DEPTH)? as usize
            }
            None => defaults.max_queue_depth,
        },
    };
    Ok(ModelConfig {
        name: m.name,
        backends,
        limits,
    })
}

#[cfg(test)]
mod tests;
