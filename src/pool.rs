//! One model's backends: a Pingora `LoadBalancer` over [`CacheAffinity`]
//! (with its optional health check), the failure exclusion window (CAG-3
//! AC4) and each backend's admission.
//!
//! A backend that failed is left out of routing for the window; requests go
//! to the next backend in their ranking meanwhile.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use pingora::lb::discovery::Static;
use pingora::lb::{Backend, Backends, LoadBalancer};
use pingora::services::background::{background_service, GenBackgroundService};

use crate::admission::Admission;
use crate::config::{HealthCheckConfig, ModelConfig};
use crate::exclusion::Exclusions;
use crate::health::RestoreOnHealthy;
use crate::metrics;
use crate::selection::CacheAffinity;

/// Why a backend was chosen: shown to clients as `X-Poimen-Route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The key's highest-scoring backend.
    Hash,
    /// No key: the round-robin turn.
    RoundRobin,
    /// The preferred backend was excluded or failed: the next in rank.
    Fallback,
    /// The preferred backend's queue was full (`overflow: spill`).
    Spill,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Hash => "hash",
            Route::RoundRobin => "round_robin",
            Route::Fallback => "fallback",
            Route::Spill => "spill",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Pick {
    pub addr: SocketAddr,
    pub route: Route,
}

/// The background service that runs a pool's health checks.
pub type HealthService = GenBackgroundService<LoadBalancer<CacheAffinity>>;

pub struct ModelPool {
    pub name: String,
    lb: Arc<LoadBalancer<CacheAffinity>>,
    /// The configured order, for reporting.
    addrs: Vec<SocketAddr>,
    exclusions: Arc<Exclusions>,
    admissions: HashMap<SocketAddr, Arc<Admission>>,
}

impl ModelPool {
    /// The pool, and the service to run for its health checks if configured.
    pub fn new(
        model: &ModelConfig,
        window: Duration,
        health: Option<&HealthCheckConfig>,
    ) -> (Self, Option<HealthService>) {
        let set: BTreeSet<Backend> = model
            .backends
            .iter()
            .map(|b| Backend::new_with_weight(&b.addr.to_string(), b.weight as usize))
            .collect::<Result<_, _>>()
            .expect("addresses were validated as socket addresses");
        let mut lb = LoadBalancer::from_backends(Backends::new(Static::new(set)));
        // Static discovery never awaits: this completes on the first poll.
        lb.update()
            .now_or_never()
            .expect("static discovery is immediate")
            .expect("static discovery cannot fail");
        let addrs: Vec<SocketAddr> = model.backends.iter().map(|b| b.addr).collect();
        let exclusions = Arc::new(Exclusions::new(&addrs, window));
        let (lb, service) = match health {
            None => (Arc::new(lb), None),
            Some(hc) => {
                let check = RestoreOnHealthy::new(hc, &model.name, exclusions.clone());
                lb.set_health_check(Box::new(check));
                lb.health_check_frequency = Some(hc.interval);
                let service = background_service(&format!("health check {}", model.name), lb);
                (service.task(), Some(service))
            }
        };
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
            lb,
            exclusions,
            admissions,
            addrs,
        };
        (pool, service)
    }

    /// The usable backends for a request with cache key `key` (empty: none),
    /// best first: not excluded, not in `skip` (backends this request already
    /// failed on). `Err` carries the time until the earliest excluded backend
    /// returns.
    pub fn ranked(
        &self,
        key: &[u8],
        skip: &[SocketAddr],
        now: Instant,
    ) -> Result<Vec<Pick>, Duration> {
        // `select_with` takes an `Fn` and stops at the first accepted backend:
        // collect every usable one in a RefCell and accept none.
        let usable = std::cell::RefCell::new(Vec::with_capacity(self.addrs.len()));
        let passed_over = std::cell::Cell::new(0usize);
        // The health check's verdict is not used to exclude: a slow /health
        // on a busy backend must not take it out. Only real failures do.
        self.lb.select_with(key, self.addrs.len(), |b, _healthy| {
            match b.as_inet() {
                Some(a) if !skip.contains(a) && !self.exclusions.is_excluded(a, now) => {
                    usable.borrow_mut().push((*a, passed_over.get()));
                }
                _ => passed_over.set(passed_over.get() + 1),
            }
            false
        });
        let usable = usable.into_inner();
        if usable.is_empty() {
            return Err(self.exclusions.retry_after(now));
        }
        Ok(usable
            .into_iter()
            .enumerate()
            .map(|(i, (addr, passed))| {
                let preferred = i == 0 && passed == 0 && skip.is_empty();
                let route = match (preferred, key.is_empty()) {
                    (false, _) => Route::Fallback,
                    (true, true) => Route::RoundRobin,
                    (true, false) => Route::Hash,
                };
                Pick { addr, route }
            })
            .collect())
    }

    /// The admission of one of this pool's backends.
    pub fn admission(&self, addr: &SocketAddr) -> &Arc<Admission> {
        &self.admissions[addr]
    }

    /// The exclusion state of this pool's backends.
    pub fn exclusions(&self) -> &Exclusions {
        &self.exclusions
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BackendConfig;

    fn best(
        p: &ModelPool,
        key: &[u8],
        skip: &[SocketAddr],
        now: Instant,
    ) -> Result<Pick, Duration> {
        p.ranked(key, skip, now).map(|r| r[0].clone())
    }

    fn pool(n: u16) -> ModelPool {
        let model = ModelConfig {
            name: "m".into(),
            backends: (0..n)
                .map(|i| BackendConfig {
                    addr: SocketAddr::from(([127, 0, 0, 1], 9000 + i)),
                    weight: 1,
                })
                .collect(),
            limits: crate::admission::Limits {
                max_num_seqs: 4,
                max_queue_depth: 20,
            },
        };
        ModelPool::new(&model, Duration::from_secs(30), None).0
    }

    #[test]
    fn keyed_picks_are_stable_and_hash_routed() {
        let p = pool(4);
        let now = Instant::now();
        let a = best(&p, b"k1", &[], now).unwrap();
        assert_eq!(a.route, Route::Hash);
        for _ in 0..10 {
            assert_eq!(best(&p, b"k1", &[], now).unwrap().addr, a.addr);
        }
    }

    #[test]
    fn excluded_backend_falls_back_then_returns_after_the_window() {
        let p = pool(4);
        let now = Instant::now();
        let first = best(&p, b"k1", &[], now).unwrap().addr;
        assert!(p.exclusions().exclude(first, now));
        assert!(!p.exclusions().exclude(first, now), "already excluded");
        let fb = best(&p, b"k1", &[], now).unwrap();
        assert_ne!(fb.addr, first);
        assert_eq!(fb.route, Route::Fallback);
        // Still out just before the window ends, back right after.
        assert!(p
            .exclusions()
            .is_excluded(&first, now + Duration::from_millis(29_900)));
        let later = now + Duration::from_secs(31);
        assert_eq!(best(&p, b"k1", &[], later).unwrap().addr, first);
    }

    #[test]
    fn all_excluded_reports_the_earliest_return() {
        let p = pool(2);
        let now = Instant::now();
        p.exclusions().exclude(p.addrs()[0], now);
        p.exclusions()
            .exclude(p.addrs()[1], now + Duration::from_secs(10));
        let wait = best(&p, b"", &[], now + Duration::from_secs(10)).unwrap_err();
        assert!(wait <= Duration::from_secs(20) && wait > Duration::from_secs(19));
    }

    #[test]
    fn skip_list_moves_a_retry_to_the_next_rank() {
        let p = pool(3);
        let now = Instant::now();
        let first = best(&p, b"k", &[], now).unwrap().addr;
        let second = best(&p, b"k", &[first], now).unwrap();
        assert_ne!(second.addr, first);
        assert_eq!(second.route, Route::Fallback);
        let third = best(&p, b"k", &[first, second.addr], now).unwrap().addr;
        assert!(best(&p, b"k", &[first, second.addr, third], now).is_err());
        // The full ranking lists the runner-ups as fallbacks.
        let all = p.ranked(b"k", &[], now).unwrap();
        let order: Vec<_> = all.iter().map(|p| (p.addr, p.route)).collect();
        assert_eq!(
            order,
            [
                (first, Route::Hash),
                (second.addr, Route::Fallback),
                (third, Route::Fallback)
            ]
        );
    }

    #[test]
    fn round_robin_spreads_evenly() {
        let p = pool(3);
        let now = Instant::now();
        let mut counts: HashMap<SocketAddr, usize> = HashMap::new();
        for _ in 0..300 {
            let pick = best(&p, b"", &[], now).unwrap();
            assert_eq!(pick.route, Route::RoundRobin);
            *counts.entry(pick.addr).or_default() += 1;
        }
        assert!(counts.values().all(|c| *c == 100), "{counts:?}");
    }
}
