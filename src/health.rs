//! Optional active health checks: pingora-load-balancing's `HttpHealthCheck`
//! probes each backend (vLLM serves `GET /health`). A backend excluded after
//! a failure comes back as soon as it answers healthy `consecutive_ok` times
//! in a row, instead of waiting out the window. A failing or slow probe
//! excludes nothing: a busy vLLM may answer `/health` late, and only real
//! request failures take a backend out.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;

use async_trait::async_trait;
use log::info;
use pingora::http::RequestHeader;
use pingora::lb::health_check::{HealthCheck, HttpHealthCheck};
use pingora::lb::Backend;

use crate::config::HealthCheckConfig;
use crate::exclusion::CurrentExclusions;

pub struct RestoreOnHealthy {
    probe: HttpHealthCheck,
    model: String,
    consecutive_ok: usize,
    /// The current set's exclusions: the set may change between checks.
    exclusions: CurrentExclusions,
    /// Consecutive healthy answers per backend.
    streaks: Mutex<HashMap<SocketAddr, usize>>,
}

impl RestoreOnHealthy {
    pub fn new(config: &HealthCheckConfig, model: &str, exclusions: CurrentExclusions) -> Self {
        let mut probe = HttpHealthCheck::new("localhost", false);
        let mut req = RequestHeader::build("GET", config.path.as_bytes(), None)
            .expect("the path was validated");
        req.insert_header("Host", "localhost")
            .expect("static header");
        probe.req = req;
        probe.peer_template.options.connection_timeout = Some(config.timeout);
        probe.peer_template.options.read_timeout = Some(config.timeout);
        probe.consecutive_success = config.consecutive_ok;
        RestoreOnHealthy {
            probe,
            model: model.to_string(),
            consecutive_ok: config.consecutive_ok,
            exclusions,
            streaks: Mutex::default(),
        }
    }
}

#[async_trait]
impl HealthCheck for RestoreOnHealthy {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let result = self.probe.check(target).await;
        let Some(addr) = target.as_inet() else {
            return result;
        };
        let exclusions = (self.exclusions)();
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

    fn health_threshold(&self, success: bool) -> usize {
        self.probe.health_threshold(success)
    }
}
