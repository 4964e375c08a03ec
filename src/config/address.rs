//! A model's backend entry (`address`, or an item of `addresses`): where
//! the backend is (an IP address or a DNS name, and a port), its weight and
//! whether it is reached over TLS.

use std::net::SocketAddr;

use serde::Deserialize;

use crate::field::{invalid, Bound, Invalid};
use crate::tls::BackendTls;

/// A backend in its map form.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AddressFile {
    pub address: String,
    /// Relative share of keys (weighted rendezvous). Default 1.
    #[serde(default = "default_weight")]
    weight: u64,
    /// Connect with TLS, verified against `upstream_tls`. Default false.
    #[serde(default)]
    tls: bool,
    /// With `tls`: the name sent as SNI and verified in the backend's
    /// certificate. Default: the address's IP, verified against the
    /// certificate's IP SANs.
    sni: Option<String>,
    /// This backend's own KV-cache event ports (an `IP:port` entry of a
    /// model with `kv_events`): several vLLM servers on one host each
    /// publish on ports of their own.
    kv_events: Option<EventPortsFile>,
}

/// `addresses[].kv_events`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct EventPortsFile {
    /// Its PUB port.
    pub port: u64,
    /// Its replay port. Default none.
    pub replay_port: Option<u64>,
}

impl AddressFile {
    pub fn kv_events(&self) -> Option<EventPortsFile> {
        self.kv_events
    }
}

impl From<String> for AddressFile {
    fn from(address: String) -> Self {
        AddressFile {
            address,
            weight: default_weight(),
            tls: false,
            sni: None,
            kv_events: None,
        }
    }
}

fn default_weight() -> u64 {
    1
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

pub const WEIGHT: Bound<u64> = Bound::new(&["gateway.models[].addresses[].weight"], 1, 1000);

/// `IP:port`, or `name:port` with a DNS name (letters, digits, `-` and
/// `_` in dot-separated labels of at most 63, 253 in all, at least one
/// letter: `300.1.1.1:80` is a mistyped address, not a name).
pub fn target(path: &str, value: &str) -> Result<Target, Invalid> {
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

/// The entry at `at` (whose `target` its model already checked against its
/// other entries): its weight and TLS.
pub fn backend(at: String, entry: &AddressFile, target: Target) -> Result<BackendConfig, Invalid> {
    let weight = WEIGHT.check(&format!("{at}.weight"), entry.weight)? as u32;
    let tls = backend_tls(&at, entry, &target)?;
    Ok(BackendConfig {
        target,
        weight,
        tls,
        field: at,
    })
}

/// TLS to the backends of `target`, if asked for. Without `sni`, a name's
/// backends are verified against the name, an address's against its IP.
/// The SNI must be a name rustls can verify: an empty one would make
/// Pingora skip verification.
fn backend_tls(
    at: &str,
    entry: &AddressFile,
    target: &Target,
) -> Result<Option<BackendTls>, Invalid> {
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
