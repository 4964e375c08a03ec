//! The `gateway:` section of the YAML file as written by the operator.
//!
//! These structs only describe the file format (with `deny_unknown_fields`,
//! so a typo is an error rather than a silently ignored key). Every default
//! lives here, next to its field; `super::validate` turns this into the
//! checked internal form.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayFile {
    /// Client-facing listeners: one or a list, each `"ip:port"` (plain
    /// HTTP) or `{address, tls: {cert_file, key_file}}`. Default
    /// `0.0.0.0:8080`.
    #[serde(default = "default_listen")]
    pub listen: Entries<ListenerFile>,
    /// Prometheus listener (Pingora's Prometheus service). Default `127.0.0.1:9091`.
    #[serde(default = "default_metrics_listen")]
    pub metrics_listen: String,
    /// How long a failed backend is left out of routing. Default 30.
    #[serde(default = "default_failure_exclusion_secs")]
    pub failure_exclusion_secs: u64,
    /// Largest request body read before routing. Default 32 MiB.
    #[serde(default = "default_max_request_body_bytes")]
    pub max_request_body_bytes: u64,
    /// TCP connect timeout to a backend. Default 2000.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Ask vLLM for usage on streams whose client did not, so every stream
    /// is accounted; the added usage chunk is removed before the client.
    /// Default true.
    #[serde(default = "default_stream_usage")]
    pub stream_usage: bool,
    /// Longest wait for the backend: its response header, or the next
    /// chunk of its body. Past it: 504 (or the stream is cut). Default
    /// 300000; a non-streamed completion sends nothing until it is done.
    #[serde(default = "default_read_timeout_ms")]
    pub read_timeout_ms: u64,
    /// Optional active health checks (see `health.rs`).
    pub health_check: Option<HealthCheckFile>,
    /// Optional API keys and JWT bearer tokens.
    #[serde(default)]
    pub auth: AuthFile,
    /// Trust for backends with `tls: true`.
    #[serde(default)]
    pub upstream_tls: UpstreamTlsFile,
    #[serde(default)]
    pub scheduler: SchedulerFile,
    /// How requests pick their backend.
    #[serde(default)]
    pub routing: RoutingFile,
    #[serde(default)]
    pub warmup: WarmupFile,
    /// How backends given by DNS name are resolved.
    #[serde(default)]
    pub discovery: DiscoveryFile,
    pub models: Vec<ModelFile>,
}

/// A listener in its map form.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerFile {
    pub address: String,
    /// Serve HTTPS on this address. Default: plain HTTP.
    pub tls: Option<ListenerTlsFile>,
}

impl From<String> for ListenerFile {
    fn from(address: String) -> Self {
        ListenerFile { address, tls: None }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsFile {
    /// PEM: the server certificate first, then any intermediates.
    pub cert_file: String,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsFile {
    /// PEM CA certificates that backends' certificates must chain to.
    /// Default: the system's trust store.
    pub ca_file: Option<String>,
}

/// Backends by DNS name (see `discovery`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryFile {
    /// Names are resolved again this often, in seconds (fractions allowed,
    /// 0.1..3600). Default 10.
    #[serde(default = "default_refresh_secs")]
    pub refresh_secs: f64,
    /// DNS servers (`IP:port`) asked instead of /etc/resolv.conf's, e.g.
    /// Consul's `127.0.0.1:8600`. /etc/hosts is read either way. Default:
    /// none (the system's).
    #[serde(default)]
    pub nameservers: Vec<String>,
    /// Start even when a name does not resolve (its backends join when it
    /// does). Default false: refused at start.
    #[serde(default)]
    pub allow_unresolved: bool,
}

impl Default for DiscoveryFile {
    fn default() -> Self {
        DiscoveryFile {
            refresh_secs: default_refresh_secs(),
            nameservers: Vec::new(),
            allow_unresolved: false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckFile {
    /// Probed with GET. Default `/health` (vLLM's).
    #[serde(default = "default_health_path")]
    pub path: String,
    /// Default 1000.
    #[serde(default = "default_health_interval_ms")]
    pub interval_ms: u64,
    /// Connect and read timeout of a probe. Default 1000.
    #[serde(default = "default_health_timeout_ms")]
    pub timeout_ms: u64,
    /// Healthy answers in a row that end an exclusion. Default 1.
    #[serde(default = "default_consecutive_ok")]
    pub consecutive_ok: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthFile {
    /// One API key, or its SHA-256 in hex, per line. When set, requests need
    /// `Authorization: Bearer <key>`. Default: no authentication.
    pub api_keys_file: Option<String>,
    /// Sent upstream as `Authorization: Bearer <key>` (vLLM's `--api-key`).
    /// Default: the client's Authorization is removed.
    pub upstream_api_key: Option<String>,
    /// JWT bearer tokens from an OIDC provider. When set (with or without
    /// `api_keys_file`), requests need a valid token or key. Default: none.
    pub jwt: Option<JwtFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtFile {
    /// The `iss` a token must carry. Required.
    pub issuer: String,
    /// One of these must be in the token's `aud`: a string or a list.
    /// Required.
    pub audience: OneOrMany,
    /// The provider's keys, read at start (and so on reload). Either this
    /// or `jwks_url`.
    pub jwks_file: Option<String>,
    /// The provider's keys, fetched at start, every `jwks_refresh_secs`,
    /// and when a token names an unknown key. `https://`, or `http://` to a
    /// loopback host only.
    pub jwks_url: Option<String>,
    /// CA certificates (PEM) that `jwks_url` is verified against instead of
    /// the system's store. Default: the system's store.
    pub ca_file: Option<String>,
    /// Accepted `alg`s: RS256/384/512, PS256/384/512, ES256, ES384, EdDSA
    /// (never HMAC or `none`). Default [RS256].
    #[serde(default = "default_jwt_algorithms")]
    pub algorithms: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`. Default 30.
    #[serde(default = "default_leeway_secs")]
    pub leeway_secs: u64,
    /// How often `jwks_url` is fetched. Default 300.
    #[serde(default = "default_jwks_refresh_secs")]
    pub jwks_refresh_secs: u64,
}

/// Per-backend admission (CAG-2). The environment overrides these.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerFile {
    /// Requests in flight per backend: vLLM's `--max-num-seqs`. Default 4.
    #[serde(default = "default_max_num_seqs")]
    pub max_num_seqs: u64,
    /// Requests waiting per backend; one more gets 503. Default 20.
    #[serde(default = "default_max_queue_depth")]
    pub max_queue_depth: u64,
    /// Longest wait for a slot before 503. Default 60000.
    #[serde(default = "default_queue_timeout_ms")]
    pub queue_timeout_ms: u64,
    /// `reject` (503 when the backend's queue is full) or `spill` (try the
    /// next backend in the key's ranking). Default reject.
    #[serde(default)]
    pub overflow: Overflow,
    /// Gateway replicas sharing the same backends: each admits
    /// `ceil(max_num_seqs / replicas)` and queues
    /// `ceil(max_queue_depth / replicas)` per backend. Default 1.
    #[serde(default = "default_replicas")]
    pub replicas: u64,
    /// Ask each backend for its load (`endpoint-load-metrics`, vLLM's ORCA
    /// report) and let it move this replica's slots between 1 and the
    /// backend's whole `max_num_seqs`: fewer while requests wait there, more
    /// while none do and this replica is short. Default false.
    #[serde(default)]
    pub load_feedback: bool,
}

impl Default for SchedulerFile {
    fn default() -> Self {
        SchedulerFile {
            max_num_seqs: default_max_num_seqs(),
            max_queue_depth: default_max_queue_depth(),
            queue_timeout_ms: default_queue_timeout_ms(),
            overflow: Overflow::default(),
            replicas: default_replicas(),
            load_feedback: false,
        }
    }
}

/// Routing policy settings (see `routing`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingFile {
    /// Bounded-load rendezvous: a keyed request skips a backend whose load
    /// (in flight + queued here) is at `ceil(f * (L + 1) * w / W)`.
    /// 1 < f <= 10. Default: off (pure rendezvous).
    pub balance_factor: Option<f64>,
    /// Requests without `X-Poimen-Cache-Key`: `round_robin` (CAG-3 AC3),
    /// `prefix` (a key derived from the messages through the first user
    /// message) or `system` (from the messages before it). Default
    /// round_robin.
    #[serde(default)]
    pub keyless: KeylessFile,
    /// Bytes of a completion's `prompt` a derived key covers. Default 2048.
    #[serde(default = "default_keyless_prefix_bytes")]
    pub keyless_prefix_bytes: u64,
}

impl Default for RoutingFile {
    fn default() -> Self {
        RoutingFile {
            balance_factor: None,
            keyless: KeylessFile::default(),
            keyless_prefix_bytes: default_keyless_prefix_bytes(),
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeylessFile {
    #[default]
    RoundRobin,
    Prefix,
    System,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    #[default]
    Reject,
    Spill,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupFile {
    /// Sleep before a warmup competes for a slot. Default 500.
    #[serde(default = "default_warmup_delay_ms")]
    pub delay_ms: u64,
    /// Also send `X-Vllm-Priority: N` on warmups (vLLM's priority
    /// scheduler: lower runs first). Default none.
    #[serde(default)]
    pub vllm_priority: Option<i64>,
}

impl Default for WarmupFile {
    fn default() -> Self {
        WarmupFile {
            delay_ms: default_warmup_delay_ms(),
            vllm_priority: None,
        }
    }
}

/// A string or a list of strings (`audience`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    pub name: String,
    /// A single backend (CAG-3 AC1 keeps this form working): `IP:port`, or
    /// `name:port` for every address the name resolves to.
    pub address: Option<String>,
    /// Several backends, each a string or `{address, weight, tls, sni}`.
    pub addresses: Option<Vec<Entry<AddressFile>>>,
    /// Overrides `scheduler.max_num_seqs` for this model's backends.
    pub max_num_seqs: Option<u64>,
    /// Overrides `scheduler.max_queue_depth` for this model's backends.
    pub max_queue_depth: Option<u64>,
    /// Overrides `routing.balance_factor` for this model.
    pub balance_factor: Option<f64>,
}

/// A backend in its map form.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressFile {
    pub address: String,
    /// Relative share of keys (weighted rendezvous). Default 1.
    #[serde(default = "default_weight")]
    pub weight: u64,
    /// Connect with TLS, verified against `upstream_tls`. Default false.
    #[serde(default)]
    pub tls: bool,
    /// With `tls`: the name sent as SNI and verified in the backend's
    /// certificate. Default: the address's IP, verified against the
    /// certificate's IP SANs.
    pub sni: Option<String>,
}

fn default_jwt_algorithms() -> Vec<String> {
    vec!["RS256".into()]
}
fn default_leeway_secs() -> u64 {
    30
}
fn default_jwks_refresh_secs() -> u64 {
    300
}
impl From<String> for AddressFile {
    fn from(address: String) -> Self {
        AddressFile {
            address,
            weight: default_weight(),
            tls: false,
            sni: None,
        }
    }
}

/// One entry written as a string or as a map: `"ip:port"` or
/// `{address: "ip:port", ...}`. Unlike `#[serde(untagged)]`, an error inside
/// the map (a typo, a missing field) is reported as itself, with its path.
#[derive(Debug)]
pub struct Entry<M>(pub M);

/// One entry or a list of entries (see `Entry`).
#[derive(Debug)]
pub struct Entries<M>(pub Vec<M>);

struct EntryVisitor<M>(PhantomData<M>);

impl<'de, M: Deserialize<'de> + From<String>> Visitor<'de> for EntryVisitor<M> {
    type Value = M;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an address \"ip:port\" or a map with `address`")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<M, E> {
        Ok(M::from(s.to_string()))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<M, A::Error> {
        M::deserialize(MapAccessDeserializer::new(map))
    }
}

impl<'de, M: Deserialize<'de> + From<String>> Deserialize<'de> for Entry<M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EntryVisitor(PhantomData)).map(Entry)
    }
}

struct EntriesVisitor<M>(PhantomData<M>);

impl<'de, M: Deserialize<'de> + From<String>> Visitor<'de> for EntriesVisitor<M> {
    type Value = Vec<M>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an address \"ip:port\", a map with `address`, or a list of them")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Vec<M>, E> {
        EntryVisitor(PhantomData).visit_str(s).map(|m| vec![m])
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<M>, A::Error> {
        EntryVisitor(PhantomData).visit_map(map).map(|m| vec![m])
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<M>, A::Error> {
        let mut out = Vec::new();
        while let Some(Entry(m)) = seq.next_element::<Entry<M>>()? {
            out.push(m);
        }
        Ok(out)
    }
}

impl<'de, M: Deserialize<'de> + From<String>> Deserialize<'de> for Entries<M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EntriesVisitor(PhantomData)).map(Entries)
    }
}

fn default_refresh_secs() -> f64 {
    10.0
}
fn default_listen() -> Entries<ListenerFile> {
    Entries(vec![ListenerFile::from("0.0.0.0:8080".to_string())])
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
fn default_weight() -> u64 {
    1
}
fn default_max_num_seqs() -> u64 {
    4
}
fn default_max_queue_depth() -> u64 {
    20
}
fn default_queue_timeout_ms() -> u64 {
    60_000
}
fn default_replicas() -> u64 {
    1
}
fn default_warmup_delay_ms() -> u64 {
    500
}
fn default_stream_usage() -> bool {
    true
}
fn default_read_timeout_ms() -> u64 {
    300_000
}
fn default_keyless_prefix_bytes() -> u64 {
    2048
}
fn default_health_path() -> String {
    "/health".into()
}
fn default_health_interval_ms() -> u64 {
    1000
}
fn default_health_timeout_ms() -> u64 {
    1000
}
fn default_consecutive_ok() -> u64 {
    1
}
