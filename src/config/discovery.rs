//! `discovery`: how backends given by DNS name are resolved (the resolving
//! itself is `crate::discovery`'s).

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::socket_addr;
use crate::field::{Bound, Invalid};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DiscoveryFile {
    /// Names are resolved again this often, in seconds (fractions allowed,
    /// 0.1..3600). Default 10.
    #[serde(default = "default_refresh_secs")]
    refresh_secs: f64,
    /// DNS servers (`IP:port`) asked instead of /etc/resolv.conf's, e.g.
    /// Consul's `127.0.0.1:8600`. /etc/hosts is read either way. Default:
    /// none (the system's).
    #[serde(default)]
    nameservers: Vec<String>,
    /// Start even when a name does not resolve (its backends join when it
    /// does). Default false: refused at start.
    #[serde(default)]
    allow_unresolved: bool,
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

fn default_refresh_secs() -> f64 {
    10.0
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

/// At least 0.1 (tests change DNS quickly), at most an hour.
pub const REFRESH_SECS: Bound<f64> = Bound::new(&["gateway.discovery.refresh_secs"], 0.1, 3600.0);

pub fn validate(d: DiscoveryFile) -> Result<DiscoveryConfig, Invalid> {
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
