//! The Pingora glue: [`Discovery`] is a model's `ServiceDiscovery` (what
//! its `Backends` runs in `update`; `pool::Refresh` runs those updates every
//! `discovery.refresh_secs`).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use log::{info, warn};
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::Backend;

use super::{lookup_round, Change, Entries};
use crate::config::DiscoveryConfig;
use crate::metrics;

/// One model's discovery: its entries, looked up again on every
/// `discover` but the first.
pub struct Discovery {
    model: String,
    config: DiscoveryConfig,
    entries: Mutex<Entries>,
    /// The first `discover` hands over the set resolved at start, so the
    /// pool is built before serving, without a second lookup and without
    /// waiting (`ModelPool::first_update` relies on it).
    started: AtomicBool,
}

impl Discovery {
    pub fn new(model: &str, config: &DiscoveryConfig, resolved: Entries) -> Self {
        Discovery {
            model: model.to_string(),
            config: config.clone(),
            entries: Mutex::new(resolved),
            started: AtomicBool::new(false),
        }
    }

    fn entries(&self) -> MutexGuard<'_, Entries> {
        // Entries stay consistent if a holder panicked: each record is one
        // assignment.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Look every name up and record the answers: count each failure, log
    /// each change of state.
    async fn lookup(&self) {
        let names = self.entries().names();
        if names.is_empty() {
            return;
        }
        let results = lookup_round(&self.config, names).await;
        let mut entries = self.entries();
        for (i, result) in results {
            if result.is_err() {
                metrics::DISCOVERY_ERRORS
                    .with_label_values(&[&self.model])
                    .inc();
            }
            match entries.record(i, result) {
                Some(Change::Failing(failing)) => warn!(
                    event = "discovery_failing",
                    model = self.model.as_str(),
                    field = failing.field.as_str(),
                    name = failing.name.as_str(),
                    error = failing.error.as_str();
                    "keeping its last good addresses"
                ),
                Some(Change::Recovered { field, name }) => info!(
                    event = "discovery_recovered",
                    model = self.model.as_str(),
                    field = field.as_str(),
                    name = name.as_str();
                    ""
                ),
                None => {}
            }
        }
    }
}

#[async_trait]
impl ServiceDiscovery for Discovery {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        if self.started.swap(true, Ordering::Relaxed) {
            self.lookup().await;
        }
        let entries = self.entries();
        let set = entries
            .members()
            .into_iter()
            .map(|(addr, weight)| {
                // Routing and health checks read how to connect from here.
                let mut ext = http::Extensions::new();
                if let Some(tls) = entries.tls_of(&addr) {
                    ext.insert(tls.clone());
                }
                Backend {
                    addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
                    weight: weight as usize,
                    ext,
                }
            })
            .collect();
        // No enablement of our own: every member is enabled.
        Ok((set, HashMap::new()))
    }
}
