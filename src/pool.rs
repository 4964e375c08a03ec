//! One model's backends: the set (Pingora's `Backends`, with its health
//! registry when health checks are on), the [`Router`] built from it, the
//! failure exclusion window (CAG-3 AC4), each backend's admission and how
//! to connect to it (plain or TLS).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use pingora::lb::discovery::Static;
use pingora::lb::{Backend, Backends, HealthCheckService, HealthRegistry};
use pingora::prelude::HttpPeer;

use crate::admission::Admission;
use crate::config::{HealthCheckConfig, ModelConfig};
use crate::exclusion::Exclusions;
use crate::health::RestoreOnHealthy;
use crate::metrics;
use crate::routing::{Candidate, Policy, Request, Router, Status};
use crate::tls::{self, BackendTls};

pub struct ModelPool {
    pub name: String,
    pub policy: Policy,
    /// Kept alive: the health registry checks this view's backends.
    _backends: Backends,
    router: Router,
    exclusions: Arc<Exclusions>,
    admissions: HashMap<SocketAddr, Arc<Admission>>,
    /// The backends reached over TLS.
    tls: HashMap<SocketAddr, BackendTls>,
}

impl ModelPool {
    /// The pool, and the service that runs its health checks if configured
    /// (probing TLS backends over TLS, trusting `upstream_ca_file`).
    pub fn new(
        model: &ModelConfig,
        window: Duration,
        health: Option<&HealthCheckConfig>,
        upstream_ca_file: Option<&str>,
    ) -> (Self, Option<HealthCheckService>) {
        let addrs: Vec<SocketAddr> = model.backends.iter().map(|b| b.addr).collect();
        let exclusions = Arc::new(Exclusions::new(&addrs, window));
        let registry = Arc::new(HealthRegistry::new());
        let service = health.map(|hc| {
            let check = RestoreOnHealthy::new(hc, model, upstream_ca_file, exclusions.clone());
            registry.set_health_check(Box::new(check));
            let mut service = HealthCheckService::new(registry.clone());
            service.health_check_frequency = Some(hc.interval);
            service
        });
        let set = model
            .backends
            .iter()
            .map(|b| Backend {
                addr: pingora::protocols::l4::socket::SocketAddr::Inet(b.addr),
                weight: b.weight as usize,
                ext: http::Extensions::new(),
            })
            .collect();
        let backends = Backends::new_with_health_registry(Static::new(set), registry);
        let mut router = None;
        discover_now(&backends, |set| {
            router = Some(Router::new(
                &model.policy,
                set.iter()
                    .filter_map(|b| Some((*b.as_inet()?, b.weight as u32))),
            ))
        });
        let admissions = addrs
            .iter()
            .map(|a| {
                let (name, backend) = (&model.name, a.to_string());
                metrics::init_backend(name, &backend);
                let gauges = metrics::admission_gauges(name, &backend);
                (*a, Admission::new(model.limits, gauges))
            })
            .collect();
        let pool = ModelPool {
            name: model.name.clone(),
            policy: model.policy.clone(),
            _backends: backends,
            router: router.unwrap_or_else(|| Router::new(&model.policy, [])),
            exclusions,
            admissions,
            tls: model
                .backends
                .iter()
                .filter_map(|b| Some((b.addr, b.tls.clone()?)))
                .collect(),
        };
        (pool, service)
    }

    /// The candidates for a request, best first, leaving out the backends
    /// it already failed on. `Err` carries the time until the earliest
    /// excluded backend returns.
    pub fn candidates(&self, req: Request, now: Instant) -> Result<Vec<Candidate>, Duration> {
        // The health check's verdict is not used to exclude: a slow /health
        // on a busy backend must not take it out. Only real failures do.
        let status = |addr: &SocketAddr| Status {
            excluded: self.exclusions.is_excluded(addr, now),
            load: self.admissions.get(addr).map_or(0, |a| a.load()),
        };
        self.router
            .rank(req, status)
            .ok_or_else(|| self.exclusions.retry_after(now))
    }

    /// The admission of one of this pool's backends.
    pub fn admission(&self, addr: &SocketAddr) -> Option<&Arc<Admission>> {
        self.admissions.get(addr)
    }

    /// The exclusion state of this pool's backends.
    pub fn exclusions(&self) -> &Arc<Exclusions> {
        &self.exclusions
    }

    /// How to connect to one of this pool's backends.
    pub fn peer(&self, addr: SocketAddr) -> HttpPeer {
        tls::backend_peer(addr, self.tls.get(&addr))
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        self.router.addrs()
    }
}

/// Run static discovery, which never waits, and hand the set to `built`.
fn discover_now(backends: &Backends, built: impl FnOnce(Arc<std::collections::BTreeSet<Backend>>)) {
    let fut = std::pin::pin!(backends.update(built));
    let mut cx = Context::from_waker(Waker::noop());
    match Future::poll(fut, &mut cx) {
        Poll::Ready(Ok(())) => {}
        // Static discovery completes on the first poll and cannot fail.
        Poll::Ready(Err(e)) => log::error!("static discovery failed: {e}"),
        Poll::Pending => log::error!("static discovery did not complete at once"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BackendConfig;
    use crate::routing::{Affinity, Route};

    fn pool(n: u16) -> ModelPool {
        let model = ModelConfig {
            name: "m".into(),
            backends: (0..n)
                .map(|i| BackendConfig {
                    addr: SocketAddr::from(([127, 0, 0, 1], 9000 + i)),
                    weight: 1,
                    tls: None,
                })
                .collect(),
            limits: crate::admission::Limits {
                max_num_seqs: 4,
                max_queue_depth: 20,
            },
            policy: Policy::default(),
        };
        ModelPool::new(&model, Duration::from_secs(30), None, None).0
    }

    #[test]
    fn every_backend_is_routed_and_admitted() {
        let p = pool(3);
        assert_eq!(p.addrs().len(), 3);
        for a in p.addrs() {
            assert!(p.admission(a).is_some());
        }
    }

    #[test]
    fn an_excluded_backend_falls_back_then_returns_after_the_window() {
        let p = pool(4);
        let now = Instant::now();
        let best = |t| {
            p.candidates(Request::new(Affinity::Key(b"k1"), &[]), t)
                .unwrap()[0]
        };
        let first = best(now);
        assert_eq!(first.route, Route::Hash);
        assert!(p.exclusions().exclude(first.addr, now));
        let fb = best(now);
        assert_ne!(fb.addr, first.addr);
        assert_eq!(fb.route, Route::Fallback);
        assert_eq!(best(now + Duration::from_secs(31)), first);
    }

    #[test]
    fn all_excluded_reports_the_earliest_return() {
        let p = pool(2);
        let now = Instant::now();
        p.exclusions().exclude(p.addrs()[0], now);
        p.exclusions()
            .exclude(p.addrs()[1], now + Duration::from_secs(10));
        let wait = p
            .candidates(
                Request::new(Affinity::None, &[]),
                now + Duration::from_secs(10),
            )
            .unwrap_err();
        assert!(wait <= Duration::from_secs(20) && wait > Duration::from_secs(19));
    }
}
