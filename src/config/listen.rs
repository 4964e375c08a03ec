//! `listen` and `metrics_listen`: the client listeners, plain HTTP or HTTPS
//! with their certificate, and the Prometheus listener.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::socket_addr;
use crate::field::{invalid, Invalid};
use crate::tls::material;
use crate::tls::ListenerTls;

/// A client listener: plain HTTP, or HTTPS with its certificate.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    pub addr: SocketAddr,
    pub tls: Option<ListenerTls>,
}

/// A listener in its map form.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ListenerFile {
    address: String,
    /// Serve HTTPS on this address. Default: plain HTTP.
    tls: Option<ListenerTlsFile>,
}

impl From<String> for ListenerFile {
    fn from(address: String) -> Self {
        ListenerFile { address, tls: None }
    }
}

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct ListenerTlsFile {
    /// PEM: the server certificate first, then any intermediates.
    cert_file: String,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    key_file: String,
}

/// The client listeners and the metrics listener, all different.
pub fn validate(
    entries: Vec<ListenerFile>,
    metrics: &str,
) -> Result<(Vec<ListenerConfig>, SocketAddr), Invalid> {
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
            .map(|t| validate_tls(&format!("{at}.tls"), t))
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
fn validate_tls(at: &str, t: ListenerTlsFile) -> Result<ListenerTls, Invalid> {
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
