//! The `gateway:` section of the YAML file as written by the operator.
//!
//! These structs only describe the file format (with `deny_unknown_fields`,
//! so a typo is an error rather than a silently ignored key). Every default
//! lives here, next to its field; `super::validate` turns this into the
//! checked internal form.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayFile {
    /// Client-facing listeners. Default `0.0.0.0:8080`.
    #[serde(default = "default_listen")]
    pub listen: OneOrMany,
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
    pub models: Vec<ModelFile>,
}

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
    /// A single backend (CAG-3 AC1 keeps this form working).
    pub address: Option<String>,
    /// Several backends, each a string or `{address, weight}`.
    pub addresses: Option<Vec<AddressFile>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum AddressFile {
    Plain(String),
    Weighted(WeightedAddressFile),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedAddressFile {
    pub address: String,
    /// Relative share of keys (weighted rendezvous). Default 1.
    #[serde(default = "default_weight")]
    pub weight: u64,
}

fn default_listen() -> OneOrMany {
    OneOrMany::One("0.0.0.0:8080".into())
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
