//! Optional active health checks: pingora-load-balancing's `HttpHealthCheck`
//! probes each backend (vLLM serves `GET /health`). A backend excluded after
//! a failure comes back as soon as it answers healthy `consecutive_ok` times
//! in a row, instead of waiting out the window. A failing or slow probe
//! excludes nothing: a busy vLLM may answer `/health` late, and only real
//! request failures take a backend out. A TLS backend is probed over TLS,
//! verified as requests are.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;

use async_trait::async_trait;
use log::info;
use pingora::connectors::http::Connector;
use pingora::connectors::ConnectorOptions;
use pingora::http::RequestHeader;
use pingora::lb::health_check::{HealthCheck, HttpHealthCheck};
use pingora::lb::Backend;
use pingora::prelude::HttpPeer;

use super::exclusion::CurrentExclusions;
use crate::config::{HealthCheckConfig, ModelConfig};
use crate::tls::{self, BackendTls};

pub struct RestoreOnHealthy {
    /// Probes the plain backends.
    probe: HttpHealthCheck,
    /// The TLS backends' probes, one per SNI (a name's addresses share
    /// one); a backend's `BackendTls` rides in its `ext` (see `discovery`).
    tls_probes: HashMap<String, HttpHealthCheck>,
    model: String,
    consecutive_ok: usize,
    /// The current set's exclusions: the set may change between checks.
    exclusions: CurrentExclusions,
    /// Consecutive healthy answers per backend.
    streaks: Mutex<HashMap<SocketAddr, usize>>,
}

impl RestoreOnHealthy {
    pub fn new(
        config: &HealthCheckConfig,
        model: &ModelConfig,
        upstream_ca_file: Option<&str>,
        exclusions: CurrentExclusions,
    ) -> Self {
        // A probe's address is replaced by each backend's at each check.
        let anywhere = SocketAddr::from(([0, 0, 0, 0], 1));
        let tls_probes = model
            .backends
            .iter()
            .filter_map(|b| {
                let t = b.tls.as_ref()?;
                let mut probe = probe(config, tls::backend_peer(anywhere, Some(t)));
                // Connections are not reused (`reuse_connection` is off), so
                // the probe's connector needs no pool.
                let options = tls::trusting(ConnectorOptions::new(0), upstream_ca_file);
                probe.set_connector(Connector::new(Some(options)));
                Some((t.sni.clone(), probe))
            })
            .collect();
        let plain = tls::backend_peer(anywhere, None);
        RestoreOnHealthy {
            probe: probe(config, plain),
            tls_probes,
            model: model.name.clone(),
            consecutive_ok: config.consecutive_ok,
            exclusions,
            streaks: Mutex::default(),
        }
    }
}

#[async_trait]
impl HealthCheck for RestoreOnHealthy {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let Some(addr) = target.as_inet() else {
            return self.probe.check(target).await;
        };
        let exclusions = (self.exclusions)();
        let probe = match target.ext.get::<BackendTls>() {
            Some(t) => self.tls_probes.get(&t.sni).unwrap_or(&self.probe),
            None => &self.probe,
        };
        let result = probe.check(target).await;
        let streak = {
            let mut streaks = self.streaks.lock().unwrap_or_else(|e| e.into_inner());
            // Backends discovery removed leave with their streaks.
            streaks.retain(|a, _| exclusions.covers(a));
            let streak = streaks.entry(*addr).or_default();
            *streak = if result.is_ok() { *streak + 1 } else { 0 };
            *streak
        };
        if streak >= self.consecutive_ok && exclusions.clear(addr, Instant::now()) {
            info!(
                event = "backend_restored",
                model = self.model.as_str(),
                backend:display = addr,
                healthy_checks = streak;
                ""
            );
        }
        result
    }

    /// The same for every probe: `consecutive_ok` to be healthy, one
    /// failure to be unhealthy.
    fn health_threshold(&self, success: bool) -> usize {
        self.probe.health_threshold(success)
    }
}

/// A probe of `config.path` through `peer` (plain or TLS), with the
/// configured timeouts.
fn probe(config: &HealthCheckConfig, peer: HttpPeer) -> HttpHealthCheck {
    let mut probe = HttpHealthCheck::new("localhost", false);
    probe.peer_template = peer;
    let mut req =
        RequestHeader::build("GET", config.path.as_bytes(), None).expect("the path was validated");
    req.insert_header("Host", "localhost")
        .expect("static header");
    probe.req = req;
    probe.peer_template.options.connection_timeout = Some(config.timeout);
    probe.peer_template.options.read_timeout = Some(config.timeout);
    probe.consecutive_success = config.consecutive_ok;
    probe
}
