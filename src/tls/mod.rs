//! TLS on the client listeners and to backends. `material` reads and checks
//! the files; this file hands the result to Pingora: a listener's settings,
//! a backend's peer, the trust of the connectors.

pub mod material;

use std::net::SocketAddr;
use std::sync::Arc;

use pingora::connectors::ConnectorOptions;
use pingora::listeners::tls::TlsSettings;
use pingora::prelude::HttpPeer;
use rustls::sign::{CertifiedKey, SingleCertAndKey};

/// A client listener's TLS: the certificate and key checked at start-up.
#[derive(Debug, Clone)]
pub struct ListenerTls {
    pub cert_file: String,
    pub key_file: String,
    pub certified: Arc<CertifiedKey>,
}

/// TLS to one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendTls {
    /// The name sent as SNI and verified in the backend's certificate: a DNS
    /// name, or an IP address checked against the certificate's IP SANs.
    pub sni: String,
}

/// Pingora's settings for a TLS listener. Pingora's rustls acceptor speaks
/// TLS 1.2 and 1.3 only. It serves the certificate that was checked (not the
/// files read again, which could have changed since). ALPN offers `h2`, then
/// `http/1.1`: Pingora serves both through the same `ProxyHttp` phases, and
/// ends HTTP/2 connections with GOAWAY on a graceful upgrade.
pub fn listener_settings(tls: &ListenerTls) -> TlsSettings {
    // `intermediate` only stores the paths; the resolver set below takes
    // their place, so nothing can fail (or panic) when Pingora builds it.
    let mut settings = TlsSettings::intermediate(&tls.cert_file, &tls.key_file)
        .expect("storing two paths cannot fail");
    settings.set_cert_resolver(Arc::new(SingleCertAndKey::from(tls.certified.clone())));
    settings.enable_h2();
    settings
}

/// The peer for a backend: plain, or TLS verified against the connector's
/// trust (`upstream_tls.ca_file` or the system store) for the name `sni`.
pub fn backend_peer(addr: SocketAddr, tls: Option<&BackendTls>) -> HttpPeer {
    match tls {
        // Pingora verifies the chain and the name by default
        // (`verify_cert`, `verify_hostname`); an empty SNI would turn both
        // off, which the config never allows.
        Some(tls) => HttpPeer::new(addr, true, tls.sni.clone()),
        None => HttpPeer::new(addr, false, String::new()),
    }
}

/// Connector options that trust `ca_file`, or the system store when none.
/// Pingora's own top-level `ca_file` key is replaced, so the gateway's key
/// is the one place backends' trust is set.
pub fn trusting(mut options: ConnectorOptions, ca_file: Option<&str>) -> ConnectorOptions {
    options.ca_file = ca_file.map(str::to_string);
    options
}
