//! Gateway configuration: the `gateway:` section of the Pingora YAML file,
//! parsed strictly and validated into the internal form the proxy uses.
//!
//! Pingora's own `ServerConf` keys (threads, pid_file, upgrade_sock, ...) stay
//! at the top level of the same file and are read by Pingora; only the
//! `gateway:` key is ours. Every error names the field path, the value and the
//! rule it broke, e.g. `gateway.models[1].addresses[0] = "x": not host:port`.
//!
//! A file per section holds its file format (serde structs with
//! `deny_unknown_fields`, every default next to its field), its validated
//! form, the ranges of its numbers and its checks: `listen`, `auth` (whose
//! `jwt` is `crate::auth::jwt::config`'s), `upstream_tls`, `scheduler`,
//! `routing`, `warmup`, `discovery`, `stored_responses`, `health_check`,
//! `tenants`, `tracing` and `models` (each
//! backend entry in `address`). This file holds the top level: its own
//! fields, the environment overrides and loading.

mod address;
mod auth;
mod discovery;
mod entries;
mod health_check;
mod listen;
mod models;
mod render;
mod routing;
mod scheduler;
mod stored_responses;
mod tenants;
mod tracing;
mod upstream_tls;
mod warmup;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::auth::ApiKeys;
use crate::field::{invalid, Bound, Invalid};
// The types of GatewayConfig's fields, wherever each section lives.
pub use crate::auth::jwt::config::{JwksSource, JwtConfig};
pub use address::{BackendConfig, Target};
pub use discovery::DiscoveryConfig;
pub use health_check::HealthCheckConfig;
pub use listen::ListenerConfig;
pub use models::{is_model_name, ModelConfig};
pub use render::RenderConfig;
pub use scheduler::Overflow;
pub use stored_responses::StoredResponsesConfig;
pub use tenants::TenantsConfig;
pub use tracing::TracingConfig;
pub use warmup::WarmupConfig;

/// The validated gateway configuration.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub listen: Vec<ListenerConfig>,
    pub metrics_listen: SocketAddr,
    pub failure_exclusion: Duration,
    pub max_request_body_bytes: usize,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub health_check: Option<HealthCheckConfig>,
    /// Keys clients may present; with `jwt` none: no authentication.
    pub api_keys: Option<ApiKeys>,
    /// JWT bearer tokens clients may present.
    pub jwt: Option<JwtConfig>,
    pub upstream_api_key: Option<String>,
    /// The CA file backends with TLS are verified against; none: the
    /// system's trust store.
    pub upstream_ca_file: Option<String>,
    pub stream_usage: bool,
    pub queue_timeout: Duration,
    pub overflow: Overflow,
    /// `scheduler.load_feedback`: ask backends for their load reports.
    pub load_feedback: bool,
    pub warmup: WarmupConfig,
    pub render: RenderConfig,
    pub discovery: DiscoveryConfig,
    pub stored_responses: StoredResponsesConfig,
    pub tenants: TenantsConfig,
    /// `scheduler.replicas`: each replica enforces its share of tenant
    /// budgets.
    pub replicas: usize,
    /// Request traces, exported over OTLP/HTTP; none: off.
    pub tracing: Option<TracingConfig>,
    pub models: Vec<ModelConfig>,
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
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// The whole file: Pingora's keys are read by Pingora, we only take `gateway`.
#[derive(Deserialize)]
struct Document {
    gateway: Option<GatewayFile>,
}

/// The `gateway:` section as written by the operator.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct GatewayFile {
    /// Client-facing listeners: one or a list, each `"ip:port"` (plain
    /// HTTP) or `{address, tls: {cert_file, key_file}}`. Default
    /// `0.0.0.0:8080`.
    #[serde(default = "default_listen")]
    listen: entries::OneOrMany<listen::ListenerFile>,
    /// Prometheus listener (Pingora's Prometheus service). Default `127.0.0.1:9091`.
    #[serde(default = "default_metrics_listen")]
    metrics_listen: String,
    /// How long a failed backend is left out of routing. Default 30.
    #[serde(default = "default_failure_exclusion_secs")]
    failure_exclusion_secs: u64,
    /// Largest request body read before routing. Default 32 MiB.
    #[serde(default = "default_max_request_body_bytes")]
    max_request_body_bytes: u64,
    /// TCP connect timeout to a backend. Default 2000.
    #[serde(default = "default_connect_timeout_ms")]
    connect_timeout_ms: u64,
    /// Ask vLLM for usage on streams whose client did not, so every stream
    /// is accounted; the added usage chunk is removed before the client.
    /// Default true.
    #[serde(default = "default_stream_usage")]
    stream_usage: bool,
    /// Longest wait for the backend: its response header, or the next
    /// chunk of its body. Past it: 504 (or the stream is cut). Default
    /// 300000; a non-streamed completion sends nothing until it is done.
    #[serde(default = "default_read_timeout_ms")]
    read_timeout_ms: u64,
    /// Optional active health checks (see `failover/health.rs`).
    health_check: Option<health_check::HealthCheckFile>,
    /// Optional API keys and JWT bearer tokens.
    #[serde(default)]
    auth: auth::AuthFile,
    /// Trust for backends with `tls: true`.
    #[serde(default)]
    upstream_tls: upstream_tls::UpstreamTlsFile,
    #[serde(default)]
    scheduler: scheduler::SchedulerFile,
    /// How requests pick their backend.
    #[serde(default)]
    routing: routing::RoutingFile,
    #[serde(default)]
    warmup: warmup::WarmupFile,
    /// The threads that render and tokenize prompts (models with
    /// `kv_events`).
    #[serde(default)]
    render: render::RenderFile,
    /// How backends given by DNS name are resolved.
    #[serde(default)]
    discovery: discovery::DiscoveryFile,
    /// Which backend stored each Responses API response.
    #[serde(default)]
    stored_responses: stored_responses::StoredResponsesFile,
    /// Who shares the GPUs: weights and budgets per tenant.
    #[serde(default)]
    tenants: tenants::TenantsFile,
    /// Optional OpenTelemetry traces of requests.
    tracing: Option<tracing::TracingFile>,
    models: Vec<models::ModelFile>,
}

fn default_listen() -> entries::OneOrMany<listen::ListenerFile> {
    entries::OneOrMany(vec![listen::ListenerFile::from("0.0.0.0:8080".to_string())])
}
fn default_metrics_listen() -> String {
    "127.0.0.1:9091".into()
}
fn default_failure_exclusion_secs() -> u64 {
    30
}
fn default_max_request_body_bytes() -> u64 {
    32 * 1024 * 1024
}
fn default_connect_timeout_ms() -> u64 {
    2000
}
fn default_stream_usage() -> bool {
    true
}
fn default_read_timeout_ms() -> u64 {
    300_000
}

const EXCLUSION_SECS: Bound<u64> = Bound::new(&["gateway.failure_exclusion_secs"], 1, 3600);
const BODY_BYTES: Bound<u64> = Bound::new(&["gateway.max_request_body_bytes"], 1024, 1 << 30);
const CONNECT_TIMEOUT_MS: Bound<u64> = Bound::new(&["gateway.connect_timeout_ms"], 1, 60_000);
const READ_TIMEOUT_MS: Bound<u64> = Bound::new(&["gateway.read_timeout_ms"], 1, 3_600_000);

type Field = fn(&mut GatewayFile) -> &mut u64;

/// Environment variables that override the file (the names the gateway this
/// one replaces read), with the field
/// each replaces and its range.
const ENV_OVERRIDES: [(&str, Field, Bound<u64>); 3] = [
    (
        "VLLM_MAX_NUM_SEQS",
        |g| &mut g.scheduler.max_num_seqs,
        scheduler::NUM_SEQS,
    ),
    (
        "VLLM_MAX_QUEUE_DEPTH",
        |g| &mut g.scheduler.max_queue_depth,
        scheduler::QUEUE_DEPTH,
    ),
    (
        "WARMUP_DELAY_MS",
        |g| &mut g.warmup.delay_ms,
        warmup::DELAY_MS,
    ),
];

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
        for (var, field, bound) in ENV_OVERRIDES {
            let Some(text) = env(var) else { continue };
            let value = text
                .trim()
                .parse::<u64>()
                .map_err(|_| invalid(var, &text, "not a whole number"))?;
            *field(&mut gateway) = bound.check(var, value)?;
        }
        Ok(validate(gateway)?)
    }
}

/// Check every section; the first mistake found is reported.
fn validate(file: GatewayFile) -> Result<GatewayConfig, Invalid> {
    let (listen, metrics_listen) = listen::validate(file.listen.0, &file.metrics_listen)?;
    let auth = auth::validate(file.auth)?;
    let upstream_ca_file = upstream_tls::validate(file.upstream_tls)?;
    let (default_limits, replicas) = scheduler::limits(&file.scheduler)?;
    let routing = routing::validate("gateway.routing", &file.routing)?;
    let authenticated = auth.api_keys.is_some() || auth.jwt.is_some();
    let tenants = tenants::validate(file.tenants, authenticated)?;
    Ok(GatewayConfig {
        listen,
        metrics_listen,
        failure_exclusion: secs(EXCLUSION_SECS.check(
            "gateway.failure_exclusion_secs",
            file.failure_exclusion_secs,
        )?),
        max_request_body_bytes: BODY_BYTES.check(
            "gateway.max_request_body_bytes",
            file.max_request_body_bytes,
        )? as usize,
        connect_timeout: ms(
            CONNECT_TIMEOUT_MS.check("gateway.connect_timeout_ms", file.connect_timeout_ms)?
        ),
        read_timeout: ms(READ_TIMEOUT_MS.check("gateway.read_timeout_ms", file.read_timeout_ms)?),
        health_check: file.health_check.map(health_check::validate).transpose()?,
        api_keys: auth.api_keys,
        jwt: auth.jwt,
        upstream_api_key: auth.upstream_api_key,
        upstream_ca_file,
        stream_usage: file.stream_usage,
        queue_timeout: scheduler::queue_timeout(&file.scheduler)?,
        overflow: file.scheduler.overflow,
        load_feedback: file.scheduler.load_feedback,
        warmup: warmup::validate(file.warmup)?,
        render: render::validate(file.render)?,
        discovery: discovery::validate(file.discovery)?,
        stored_responses: stored_responses::validate(file.stored_responses)?,
        tenants,
        replicas,
        tracing: file.tracing.map(tracing::validate).transpose()?,
        models: models::validate(
            file.models,
            default_limits,
            replicas,
            file.scheduler.load_feedback,
            &routing,
        )?,
    })
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn socket_addr(path: &str, value: &str) -> Result<SocketAddr, Invalid> {
    value
        .parse()
        .map_err(|_| invalid(path, value, "not host:port (an IP address and a port)"))
}

#[cfg(test)]
mod tests;
