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
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::admission::{Fleet, Limits};
use crate::auth::fetch::JwksUrl;
use crate::auth::jwks::KeySet;
use crate::auth::{jwt, ApiKeys};
use crate::routing::prefix::Head;
use crate::routing::{Keyless, Policy};
use crate::tls::material;
use crate::tls::{BackendTls, ListenerTls};
pub use file::Overflow;
use file::{
    AddressFile, AuthFile, DiscoveryFile, GatewayFile, HealthCheckFile, JwtFile, KeylessFile,
    ListenerFile, ListenerTlsFile, ModelFile, OneOrMany, RoutingFile, UpstreamTlsFile,
};

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
    pub discovery: DiscoveryConfig,
    pub models: Vec<ModelConfig>,
}

/// A client listener: plain HTTP, or HTTPS with its certificate.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    pub addr: SocketAddr,
    pub tls: Option<ListenerTls>,
}

#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub policy: jwt::Policy,
    pub jwks: JwksSource,
}

/// Where the JWT keys come from.
#[derive(Debug, Clone)]
pub enum JwksSource {
    /// Read from `jwks_file` at start.
    File(KeySet),
    /// Fetched from `jwks_url` (at start by `main`, then in the background).
    Url {
        url: JwksUrl,
        ca_file: Option<String>,
        refresh: Duration,
    },
}

/// How backends given by DNS name are resolved (see `discovery`).
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveryConfig {
    pub refresh: Duration,
    /// Asked instead of the system's servers; empty: /etc/resolv.conf's.
    pub nameservers: Vec<SocketAddr>,
    /// Start although a name does not resolve yet.
    pub allow_unresolved: bool,
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
    /// How this model's requests are routed.
    pub policy: Policy,
    /// With `scheduler.load_feedback`: the backend's whole `max_num_seqs`
    /// (before the split between replicas, the most slots its load reports
    /// may lend this replica) and the replicas. None: off.
    pub load_feedback: Option<Fleet>,
}

/// One `address`/`addresses` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    pub target: Target,
    pub weight: u32,
    /// TLS to this backend; none: plain HTTP.
    pub tls: Option<BackendTls>,
    /// Where it is configured, for messages: `gateway.models[0].addresses[1]`.
    pub field: String,
}

/// Where an entry's backends are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A literal `IP:port`: one backend, never resolved.
    Addr(SocketAddr),
    /// `name:port`: a backend per address the name resolves to.
    Name { host: String, port: u16 },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Addr(a) => a.fmt(f),
            Target::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl ModelConfig {
    /// Whether any entry is a DNS name.
    pub fn uses_names(&self) -> bool {
        self.backends
            .iter()
            .any(|b| matches!(b.target, Target::Name { .. }))
    }
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

/// The accepted range of a numeric field, stated once per field. Upper
/// bounds catch unit mistakes (ms written as s, bytes as MiB).
#[derive(Debug, Clone, Copy)]
struct Bound<T> {
    lo: T,
    hi: T,
    /// `lo` itself is refused.
    above: bool,
}

impl<T: Copy + PartialOrd + std::fmt::Display + std::fmt::Debug> Bound<T> {
    /// `lo..=hi`.
    const fn new(lo: T, hi: T) -> Self {
        Bound {
            lo,
            hi,
            above: false,
        }
    }

    /// Above `lo`, at most `hi`.
    const fn above(lo: T, hi: T) -> Self {
        Bound {
            lo,
            hi,
            above: true,
        }
    }

    /// `value` if in range, else an error naming `path`. NaN is never in
    /// range.
    fn check(self, path: &str, value: T) -> Result<T, ConfigError> {
        let (lo, hi) = (self.lo, self.hi);
        let low_ok = if self.above { value > lo } else { value >= lo };
        if low_ok && value <= hi {
            Ok(value)
        } else if self.above {
            Err(invalid(
                path,
                value,
                &format!("must be above {lo:?} and at most {hi:?}"),
            ))
        } else {
            Err(invalid(
                path,
                value,
                &format!("must be between {lo} and {hi}"),
            ))
        }
    }
}

const EXCLUSION_SECS: Bound<u64> = Bound::new(1, 3600);
const BODY_BYTES: Bound<u64> = Bound::new(1024, 1 << 30);
const CONNECT_TIMEOUT_MS: Bound<u64> = Bound::new(1, 60_000);
const READ_TIMEOUT_MS: Bound<u64> = Bound::new(1, 3_600_000);
const WEIGHT: Bound<u64> = Bound::new(1, 1000);
const MAX_BACKENDS_PER_MODEL: usize = 256;
const NUM_SEQS: Bound<u64> = Bound::new(1, 4096);
const QUEUE_DEPTH: Bound<u64> = Bound::new(0, 100_000);
const REPLICAS: Bound<u64> = Bound::new(1, 64);
const QUEUE_TIMEOUT_MS: Bound<u64> = Bound::new(1, 3_600_000);
const WARMUP_DELAY_MS: Bound<u64> = Bound::new(0, 60_000);
const HEALTH_INTERVAL_MS: Bound<u64> = Bound::new(100, 600_000);
const HEALTH_TIMEOUT_MS: Bound<u64> = Bound::new(1, 60_000);
const HEALTH_CONSECUTIVE_OK: Bound<u64> = Bound::new(1, 100);
const KEYLESS_PREFIX_BYTES: Bound<u64> = Bound::new(1, 1 << 20);
const LEEWAY_SECS: Bound<u64> = Bound::new(0, 600);
const JWKS_REFRESH_SECS: Bound<u64> = Bound::new(1, 86_400);
/// `discovery.refresh_secs`: at least 0.1 (tests change DNS quickly), at
/// most an hour.
const REFRESH_SECS: Bound<f64> = Bound::new(0.1, 3600.0);
/// `balance_factor`: above 1 (1 would forbid any imbalance), at most 10.
const BALANCE_FACTOR: Bound<f64> = Bound::above(1.0, 10.0);

type Field = fn(&mut GatewayFile) -> &mut u64;

/// Environment variables that override the file (CAG-2), with the field
/// each replaces and its range.
const ENV_OVERRIDES: [(&str, Field, Bound<u64>); 3] = [
    (
        "VLLM_MAX_NUM_SEQS",
        |g| &mut g.scheduler.max_num_seqs,
        NUM_SEQS,
    ),
    (
        "VLLM_MAX_QUEUE_DEPTH",
        |g| &mut g.scheduler.max_queue_depth,
        QUEUE_DEPTH,
    ),
    (
        "WARMUP_DELAY_MS",
        |g| &mut g.warmup.delay_ms,
        WARMUP_DELAY_MS,
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
        for (var, field, bound) in ENV_OVERRIDES {
            let Some(text) = env(var) else { continue };
            let value = text
                .trim()
                .parse::<u64>()
                .map_err(|_| invalid(var, &text, "not a whole number"))?;
            *field(&mut gateway) = bound.check(var, value)?;
        }
        validate(gateway)
    }
}

fn invalid(path: impl Into<String>, value: impl std::fmt::Debug, rule: &str) -> ConfigError {
    ConfigError::Invalid {
        path: path.into(),
        value: format!("{value:?}"),
        rule: rule.into(),
    }
}

fn socket_addr(path: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value
        .parse()
        .map_err(|_| invalid(path, value, "not host:port (an IP address and a port)"))
}

/// `IP:port`, or `name:port` with a DNS name (letters, digits, `-` and
/// `_` in dot-separated labels of at most 63, 253 in all, at least one
/// letter: `300.1.1.1:80` is a mistyped address, not a name).
fn target(path: &str, value: &str) -> Result<Target, ConfigError> {
    if let Ok(addr) = value.parse() {
        return Ok(Target::Addr(addr));
    }
    let rule = "not host:port (an IP address or a DNS name, and a port)";
    let (host, port) = value
        .rsplit_once(':')
        .ok_or_else(|| invalid(path, value, rule))?;
    let port: u16 = port.parse().map_err(|_| invalid(path, value, rule))?;
    let labels = host.strip_suffix('.').unwrap_or(host);
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let named = labels.len() <= 253
        && labels.split('.').all(label_ok)
        && labels.bytes().any(|b| b.is_ascii_alphabetic());
    if !named || port == 0 {
        return Err(invalid(path, value, rule));
    }
    Ok(Target::Name {
        host: host.to_string(),
        port,
    })
}

fn validate_discovery(d: DiscoveryFile) -> Result<DiscoveryConfig, ConfigError> {
    let at = "gateway.discovery";
    let nameservers = d
        .nameservers
        .iter()
        .enumerate()
        .map(|(i, s)| socket_addr(&format!("{at}.nameservers[{i}]"), s))
        .collect::<Result<_, _>>()?;
    let refresh_secs = REFRESH_SECS.check(&format!("{at}.refresh_secs"), d.refresh_secs)?;
    Ok(DiscoveryConfig {
        refresh: Duration::from_secs_f64(refresh_secs),
        nameservers,
        allow_unresolved: d.allow_unresolved,
    })
}

fn validate(file: GatewayFile) -> Result<GatewayConfig, ConfigError> {
    let (listen, metrics_listen) = validate_listeners(file.listen.0, &file.metrics_listen)?;
    let (api_keys, jwt, upstream_api_key) = validate_auth(file.auth)?;
    let upstream_ca_file = validate_upstream_tls(file.upstream_tls)?;
    let sched = &file.scheduler;
    let default_limits = Limits {
        max_num_seqs: NUM_SEQS.check("gateway.scheduler.max_num_seqs", sched.max_num_seqs)?
            as usize,
        max_queue_depth: QUEUE_DEPTH
            .check("gateway.scheduler.max_queue_depth", sched.max_queue_depth)?
            as usize,
    };
    let replicas = REPLICAS.check("gateway.scheduler.replicas", sched.replicas)? as usize;
    let routing = validate_routing("gateway.routing", &file.routing)?;
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
        health_check: file.health_check.map(validate_health_check).transpose()?,
        api_keys,
        jwt,
        upstream_api_key,
        upstream_ca_file,
        stream_usage: file.stream_usage,
        queue_timeout: ms(
            QUEUE_TIMEOUT_MS.check("gateway.scheduler.queue_timeout_ms", sched.queue_timeout_ms)?
        ),
        overflow: sched.overflow,
        load_feedback: sched.load_feedback,
        warmup: WarmupConfig {
            delay: ms(WARMUP_DELAY_MS.check("gateway.warmup.delay_ms", file.warmup.delay_ms)?),
            vllm_priority: file.warmup.vllm_priority,
        },
        discovery: validate_discovery(file.discovery)?,
        models: validate_models(
            file.models,
            default_limits,
            replicas,
            sched.load_feedback,
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

fn validate_listeners(
    entries: Vec<ListenerFile>,
    metrics: &str,
) -> Result<(Vec<ListenerConfig>, SocketAddr), ConfigError> {
    if entries.is_empty() {
        return Err(invalid(
            "gateway.listen",
            "[]",
            "needs at least one address",
        ));
    }
    let mut listen: Vec<ListenerConfig> = Vec::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let at = format!("gateway.listen[{i}]");
        let addr = socket_addr(&at, &entry.address)?;
        if listen.iter().any(|l| l.addr == addr) {
            return Err(invalid(at, &entry.address, "listed twice"));
        }
        let tls = entry
            .tls
            .map(|t| validate_listener_tls(&format!("{at}.tls"), t))
            .transpose()?;
        listen.push(ListenerConfig { addr, tls });
    }
    let metrics_listen = socket_addr("gateway.metrics_listen", metrics)?;
    if listen.iter().any(|l| l.addr == metrics_listen) {
        return Err(invalid(
            "gateway.metrics_listen",
            metrics,
            "must differ from every gateway.listen address",
        ));
    }
    Ok((listen, metrics_listen))
}

/// The certificate and key must exist, parse, and belong together.
fn validate_listener_tls(at: &str, t: ListenerTlsFile) -> Result<ListenerTls, ConfigError> {
    let (cert_at, key_at) = (format!("{at}.cert_file"), format!("{at}.key_file"));
    let cert_error = |e: material::TlsError| invalid(&cert_at, &t.cert_file, &e.to_string());
    let key_error = |e: material::TlsError| invalid(&key_at, &t.key_file, &e.to_string());
    let chain = material::read_certificates(Path::new(&t.cert_file)).map_err(cert_error)?;
    let key = material::read_key(Path::new(&t.key_file)).map_err(key_error)?;
    let certified = material::certified_key(chain, key).map_err(key_error)?;
    Ok(ListenerTls {
        cert_file: t.cert_file,
        key_file: t.key_file,
        certified: Arc::new(certified),
    })
}

fn validate_upstream_tls(u: UpstreamTlsFile) -> Result<Option<String>, ConfigError> {
    if let Some(path) = &u.ca_file {
        material::check_ca_file(Path::new(path))
            .map_err(|e| invalid("gateway.upstream_tls.ca_file", path, &e.to_string()))?;
    }
    Ok(u.ca_file)
}

/// TLS to the backends of `target`, if asked for. Without `sni`, a name's
/// backends are verified against the name, an address's against its IP.
/// The SNI must be a name rustls can verify: an empty one would make
/// Pingora skip verification.
fn validate_backend_tls(
    at: &str,
    entry: &AddressFile,
    target: &Target,
) -> Result<Option<BackendTls>, ConfigError> {
    let sni = match (entry.tls, &entry.sni, target) {
        (false, None, _) => return Ok(None),
        (false, Some(sni), _) => {
            return Err(invalid(format!("{at}.sni"), sni, "needs `tls: true`"));
        }
        (true, Some(sni), _) => sni.clone(),
        (true, None, Target::Addr(addr)) => addr.ip().to_string(),
        (true, None, Target::Name { host, .. }) => host.trim_end_matches('.').to_string(),
    };
    if rustls::pki_types::ServerName::try_from(sni.as_str()).is_err() {
        return Err(invalid(
            format!("{at}.sni"),
            &sni,
            "not a DNS name or an IP address",
        ));
    }
    Ok(Some(BackendTls { sni }))
}

type Auth = (Option<ApiKeys>, Option<JwtConfig>, Option<String>);

fn validate_auth(auth: AuthFile) -> Result<Auth, ConfigError> {
    let at = "gateway.auth.api_keys_file";
    let api_keys = match &auth.api_keys_file {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| invalid(at, path, &format!("cannot read: {e}")))?;
            Some(ApiKeys::parse(&text).map_err(|e| invalid(at, path, &e.to_string()))?)
        }
    };
    if let Some(key) = &auth.upstream_api_key {
        if key.is_empty() || http::HeaderValue::from_str(&format!("Bearer {key}")).is_err() {
            // The key itself is a secret: never echo it.
            return Err(invalid(
                "gateway.auth.upstream_api_key",
                "(hidden)",
                "must be non-empty printable ASCII",
            ));
        }
    }
    let jwt = auth.jwt.map(validate_jwt).transpose()?;
    Ok((api_keys, jwt, auth.upstream_api_key))
}

fn validate_jwt(j: JwtFile) -> Result<JwtConfig, ConfigError> {
    let at = "gateway.auth.jwt";
    if j.issuer.is_empty() {
        return Err(invalid(
            format!("{at}.issuer"),
            &j.issuer,
            "must not be empty",
        ));
    }
    let audience = match j.audience {
        OneOrMany::One(a) => vec![a],
        OneOrMany::Many(list) => list,
    };
    if audience.is_empty() || audience.iter().any(String::is_empty) {
        return Err(invalid(
            format!("{at}.audience"),
            &audience,
            "needs at least one non-empty audience",
        ));
    }
    if j.algorithms.is_empty() {
        return Err(invalid(
            format!("{at}.algorithms"),
            "[]",
            "needs at least one algorithm",
        ));
    }
    let mut algorithms = Vec::new();
    for (i, name) in j.algorithms.iter().enumerate() {
        let alg = jwt::algorithm(name).ok_or_else(|| {
            invalid(
                format!("{at}.algorithms[{i}]"),
                name,
                "not one of RS256 RS384 RS512 PS256 PS384 PS512 ES256 ES384 EdDSA \
                 (HMAC and none are refused: a shared secret is not a public key)",
            )
        })?;
        algorithms.push(alg);
    }
    let jwks = match (j.jwks_file, j.jwks_url) {
        (Some(_), None) if j.ca_file.is_some() => {
            return Err(invalid(
                format!("{at}.ca_file"),
                &j.ca_file,
                "applies only to `jwks_url`",
            ))
        }
        (Some(path), None) => {
            let at = format!("{at}.jwks_file");
            let text = std::fs::read_to_string(&path)
                .map_err(|e| invalid(&at, &path, &format!("cannot read: {e}")))?;
            JwksSource::File(KeySet::parse(&text).map_err(|e| invalid(&at, &path, &e.to_string()))?)
        }
        (None, Some(url)) => {
            let ca_file = j
                .ca_file
                .map(|path| validate_ca_file(&format!("{at}.ca_file"), path))
                .transpose()?;
            JwksSource::Url {
                url: JwksUrl::parse(&url)
                    .map_err(|e| invalid(format!("{at}.jwks_url"), &url, &e))?,
                ca_file,
                refresh: secs(
                    JWKS_REFRESH_SECS
                        .check(&format!("{at}.jwks_refresh_secs"), j.jwks_refresh_secs)?,
                ),
            }
        }
        (Some(_), Some(url)) => {
            return Err(invalid(
                format!("{at}.jwks_url"),
                &url,
                "set either `jwks_file` or `jwks_url`, not both",
            ))
        }
        (None, None) => return Err(invalid(at, "(no keys)", "needs `jwks_file` or `jwks_url`")),
    };
    Ok(JwtConfig {
        policy: jwt::Policy {
            issuer: j.issuer,
            audience,
            algorithms,
            leeway_secs: LEEWAY_SECS.check(&format!("{at}.leeway_secs"), j.leeway_secs)?,
        },
        jwks,
    })
}

/// A PEM file with at least one CA certificate, loaded as Pingora's
/// connector will load it (which panics on a bad file).
fn validate_ca_file(at: &str, path: String) -> Result<String, ConfigError> {
    let mut store = pingora::tls::RootCertStore::empty();
    match pingora::tls::load_ca_file_into_store(&path, &mut store) {
        Err(e) => Err(invalid(
            at,
            &path,
            &format!("not a PEM file of CA certificates: {e}"),
        )),
        Ok(()) if store.is_empty() => Err(invalid(at, &path, "holds no certificate")),
        Ok(()) => Ok(path),
    }
}

fn validate_routing(at: &str, r: &RoutingFile) -> Result<Policy, ConfigError> {
    Ok(Policy {
        balance_factor: r
            .balance_factor
            .map(|f| BALANCE_FACTOR.check(&format!("{at}.balance_factor"), f))
            .transpose()?,
        keyless: match r.keyless {
            KeylessFile::RoundRobin => Keyless::RoundRobin,
            KeylessFile::Prefix => Keyless::Derived(Head::FirstUser),
            KeylessFile::System => Keyless::Derived(Head::System),
        },
        keyless_prefix_bytes: KEYLESS_PREFIX_BYTES.check(
            &format!("{at}.keyless_prefix_bytes"),
            r.keyless_prefix_bytes,
        )? as usize,
    })
}

fn validate_models(
    models: Vec<ModelFile>,
    limits: Limits,
    replicas: usize,
    load_feedback: bool,
    routing: &Policy,
) -> Result<Vec<ModelConfig>, ConfigError> {
    if models.is_empty() {
        return Err(invalid("gateway.models", "[]", "needs at least one model"));
    }
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, m) in models.into_iter().enumerate() {
        let path = format!("gateway.models[{i}]");
        let model = validate_model(&path, m, limits, replicas, load_feedback, routing)?;
        if !names.insert(model.name.clone()) {
            return Err(invalid(
                format!("{path}.name"),
                &model.name,
                "duplicate model name",
            ));
        }
        out.push(model);
    }
    Ok(out)
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
        interval: ms(HEALTH_INTERVAL_MS.check(&format!("{at}.interval_ms"), h.interval_ms)?),
        timeout: ms(HEALTH_TIMEOUT_MS.check(&format!("{at}.timeout_ms"), h.timeout_ms)?),
        consecutive_ok: HEALTH_CONSECUTIVE_OK
            .check(&format!("{at}.consecutive_ok"), h.consecutive_ok)?
            as usize,
        path: h.path,
    })
}

fn validate_model(
    path: &str,
    m: ModelFile,
    defaults: Limits,
    replicas: usize,
    load_feedback: bool,
    routing: &Policy,
) -> Result<ModelConfig, ConfigError> {
    if m.name.trim().is_empty() || m.name.chars().any(char::is_control) {
        return Err(invalid(
            format!("{path}.name"),
            &m.name,
            "must be a non-empty name without control characters",
        ));
    }
    let entries: Vec<AddressFile> = match (m.address, m.addresses) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                path,
                &m.name,
                "set either `address` or `addresses`, not both",
            ))
        }
        (None, None) => return Err(invalid(path, &m.name, "needs `address` or `addresses`")),
        (Some(a), None) => vec![AddressFile::from(a)],
        (None, Some(list)) => list.into_iter().map(|e| e.0).collect(),
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
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("{list_path}[{i}]");
        let target = target(&at, &entry.address)?;
        if backends.iter().any(|b| b.target == target) {
            return Err(invalid(
                at,
                &entry.address,
                "duplicate address in this model",
            ));
        }
        let weight = WEIGHT.check(&format!("{at}.weight"), entry.weight)? as u32;
        let tls = validate_backend_tls(&at, entry, &target)?;
        backends.push(BackendConfig {
            target,
            weight,
            tls,
            field: at,
        });
    }
    let configured = Limits {
        max_num_seqs: match m.max_num_seqs {
            Some(n) => NUM_SEQS.check(&format!("{path}.max_num_seqs"), n)? as usize,
            None => defaults.max_num_seqs,
        },
        max_queue_depth: match m.max_queue_depth {
            Some(n) => QUEUE_DEPTH.check(&format!("{path}.max_queue_depth"), n)? as usize,
            None => defaults.max_queue_depth,
        },
    };
    // Divided here, once, after a model's own limits replaced the defaults,
    // so both are shared alike.
    let limits = configured.shared_by(replicas);
    let mut policy = routing.clone();
    if let Some(f) = m.balance_factor {
        policy.balance_factor = Some(BALANCE_FACTOR.check(&format!("{path}.balance_factor"), f)?);
    }
    Ok(ModelConfig {
        name: m.name,
        backends,
        limits,
        policy,
        load_feedback: load_feedback.then_some(Fleet {
            ceiling: configured.max_num_seqs,
            replicas,
        }),
    })
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
