//! One model's backends: the set (Pingora's `Backends`, fed by
//! [`Discovery`], with its health registry when health checks are on), and
//! the [`Members`] built from it: the [`RoutingTable`], the failure exclusion
//! window, each backend's admission and how to connect to it
//! (plain or TLS).
//!
//! When discovery changes the set, new `Members` replace the old whole (a
//! request reads them once). A backend that stays keeps its admission and
//! exclusion; a new one starts empty; one that left is retired: requests
//! already on it finish with its admission, and once none holds it its
//! metric series are removed. [`Refresh`] runs the pools' discovery again
//! every `discovery.refresh_secs`.

mod refresh;
mod subscribe;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use log::{error, info};
use pingora::lb::{Backend, Backends, HealthCheckService, HealthRegistry};
use pingora::prelude::HttpPeer;

use crate::admission::{Admission, Capacity, Fairness, Fleet, Gauges};
use crate::config::{HealthCheckConfig, ModelConfig};
use crate::discovery::Discovery;
use crate::failover::exclusion::{CurrentExclusions, Exclusions};
use crate::failover::health::RestoreOnHealthy;
use crate::metrics;
use crate::routing::{Facts, ModelRouting, Owners, Plan, Routable, RoutingTable, Unroutable};
use crate::tls::{self, BackendTls};
pub use refresh::Refresh;
pub use subscribe::Subscribe;

pub struct ModelPool {
    pub name: String,
    /// Its names are learned from its backends (`crate::catalog`): no
    /// request names `name`.
    pub learned: bool,
    /// The model's routing policy and the state it keeps.
    pub routing: ModelRouting,
    limits: Capacity,
    /// `scheduler.load_feedback`: the most slots a backend's reports may lend.
    load_feedback: Option<Fleet>,
    /// `tenants.fairness`: the unit its backends share their slots in.
    fairness: Fairness,
    /// Pingora's view of the set: `update` runs discovery, and the health
    /// registry checks its members.
    backends: Backends,
    members: Arc<ArcSwap<Members>>,
    /// Backends that left the set, until no request holds their admission.
    retired: Mutex<Vec<(SocketAddr, Arc<Admission>)>>,
    pub series: metrics::ModelSeries,
}

/// One backend set and the state routing reads: replaced whole when the
/// set changes.
pub struct Members {
    router: RoutingTable,
    exclusions: Arc<Exclusions>,
    backends: HashMap<SocketAddr, Member>,
    /// What routing reads of each member, in the router's order: a request
    /// reads every member, so none is looked up by address.
    ranked: Vec<Ranked>,
}

struct Ranked {
    admission: Arc<Admission>,
    /// Its exclusion deadline in `exclusions`.
    deadline: Arc<AtomicU64>,
}

/// One backend's state in a set.
struct Member {
    admission: Arc<Admission>,
    series: Arc<metrics::BackendSeries>,
    /// Reached over TLS.
    tls: Option<BackendTls>,
}

impl Members {
    /// Route `input` among these backends as `routing` decides: the
    /// candidates, best first, leaving out the backends it already failed
    /// on.
    pub fn route<'a>(
        &'a self,
        routing: &'a ModelRouting,
        input: &'a Routable,
        now: Instant,
    ) -> Result<Plan<'a, impl Fn(usize) -> Facts + 'a>, Unroutable> {
        // The health check's verdict is not used to exclude: a slow /health
        // on a busy backend must not take it out. Only real failures do.
        // The slot limit only matters to the cost rule (and takes a lock
        // when load feedback moves it).
        let bounded = routing.weighs_slots();
        let clock = self.exclusions.clock(now);
        let status = move |i: usize| {
            let Ranked {
                admission,
                deadline,
            } = &self.ranked[i];
            Facts {
                excluded: Exclusions::excludes(deadline, clock),
                absent: !input.served_by(&self.router.addrs()[i]),
                load: admission.load(),
                slots: if bounded { admission.slot_limit() } else { 0 },
                cached_tokens: 0,
                recent: false,
            }
        };
        routing.route(&self.router, input, status, now)
    }

    /// The admission of one of these backends.
    pub fn admission(&self, addr: &SocketAddr) -> Option<&Arc<Admission>> {
        self.backends.get(addr).map(|b| &b.admission)
    }

    /// The series and labels of one of these backends.
    pub fn series(&self, addr: &SocketAddr) -> Option<&metrics::BackendSeries> {
        self.backends.get(addr).map(|b| &*b.series)
    }

    /// The exclusion state of these backends.
    pub fn exclusions(&self) -> &Arc<Exclusions> {
        &self.exclusions
    }

    /// How to connect to one of these backends.
    pub fn peer(&self, addr: SocketAddr) -> HttpPeer {
        tls::backend_peer(addr, self.backends.get(&addr).and_then(|b| b.tls.as_ref()))
    }

    /// The backends, in address order.
    pub fn addrs(&self) -> &[SocketAddr] {
        self.router.addrs()
    }
}

/// Each of `router`'s members as routing reads it, in the router's order.
fn ranked(
    router: &RoutingTable,
    backends: &HashMap<SocketAddr, Member>,
    exclusions: &Exclusions,
) -> Vec<Ranked> {
    // The router, the members and the exclusions are built from the same
    // listed addresses: each has every one.
    let ranked = |a: &SocketAddr| Ranked {
        admission: backends[a].admission.clone(),
        deadline: exclusions
            .deadline(a)
            .expect("every listed backend has a deadline"),
    };
    router.addrs().iter().map(ranked).collect()
}

/// What a new set changes: the addresses it adds and those it removes.
#[derive(Debug, PartialEq, Eq)]
pub struct Diff {
    pub added: Vec<SocketAddr>,
    pub removed: Vec<SocketAddr>,
}

/// `old` to `new`, both in any order; the result sorted.
pub fn diff(old: &[SocketAddr], new: &[SocketAddr]) -> Diff {
    let mut added: Vec<SocketAddr> = new.iter().filter(|a| !old.contains(a)).copied().collect();
    let mut removed: Vec<SocketAddr> = old.iter().filter(|a| !new.contains(a)).copied().collect();
    added.sort();
    removed.sort();
    Diff { added, removed }
}

impl ModelPool {
    /// The pool over what `discovery` found at start, and the service that
    /// runs its health checks if configured (probing TLS backends over TLS,
    /// trusting `upstream_ca_file`).
    pub fn new(
        model: &ModelConfig,
        discovery: Discovery,
        window: Duration,
        health: Option<&HealthCheckConfig>,
        upstream_ca_file: Option<&str>,
        owners: Arc<Owners>,
        fairness: Fairness,
    ) -> (Self, Option<HealthCheckService>) {
        let members = Arc::new(ArcSwap::from_pointee(Members {
            router: RoutingTable::new(&model.policy, []),
            exclusions: Arc::new(Exclusions::new(&[], window)),
            backends: HashMap::new(),
            ranked: Vec::new(),
        }));
        let registry = Arc::new(HealthRegistry::new());
        let service = health.map(|hc| {
            let check =
                RestoreOnHealthy::new(hc, model, upstream_ca_file, current_exclusions(&members));
            registry.set_health_check(Box::new(check));
            let mut service = HealthCheckService::new(registry.clone());
            service.health_check_frequency = Some(hc.interval);
            service
        });
        if model.uses_names() {
            metrics::init_discovery(&model.name);
        }
        let pool = ModelPool {
            name: model.name.clone(),
            learned: model.learned,
            routing: ModelRouting::new(model.name.as_str().into(), model.policy.clone(), owners),
            limits: model.limits,
            load_feedback: model.load_feedback,
            fairness,
            backends: Backends::new_with_health_registry(Box::new(discovery), registry),
            members,
            retired: Mutex::default(),
            series: metrics::ModelSeries::new(&model.name),
        };
        pool.first_update();
        (pool, service)
    }

    /// The first discovery hands over the set resolved at start: run it
    /// now, so the pool serves at once.
    ///
    /// `new` is not async, so the update is polled once, never awaited. It
    /// completes in that one poll because nothing in it waits:
    /// `Discovery::discover` answers its first call from the set it was
    /// given, without a lookup, and Pingora's `Backends::update` awaits
    /// nothing but discovery. The test
    /// `the_first_update_completes_without_waiting` holds both to it.
    fn first_update(&self) {
        let update = std::pin::pin!(self.backends.update(|set| {
            self.rebuild(&set);
        }));
        match Future::poll(update, &mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => error!("{}: first discovery failed: {e}", self.name),
            Poll::Pending => error!("{}: first discovery did not complete", self.name),
        }
    }

    /// The current set, for one request.
    pub fn members(&self) -> Arc<Members> {
        self.members.load_full()
    }

    /// Each current backend: 1 while excluded, else 0 (for the metric).
    pub fn exclusion_reading(&self) -> metrics::Reading {
        let members = self.members.clone();
        Arc::new(move |now| {
            let m = members.load();
            let excluded = |a: &SocketAddr| i64::from(m.exclusions.is_excluded(a, now));
            m.addrs().iter().map(|a| (*a, excluded(a))).collect()
        })
    }

    /// Each current backend's slot limit now (for the metric).
    pub fn slot_limit_reading(&self) -> metrics::Reading {
        let members = self.members.clone();
        Arc::new(move |_| {
            let m = members.load();
            let limit = |a: &SocketAddr| Some(m.admission(a)?.slot_limit() as i64);
            m.addrs()
                .iter()
                .filter_map(|a| Some((*a, limit(a)?)))
                .collect()
        })
    }

    /// The prompt tokens the prefix index takes each current backend to
    /// hold (for the metric); `None` without an index.
    pub fn prefix_index_reading(&self) -> Option<metrics::Reading> {
        let (members, index) = (self.members.clone(), self.routing.index()?.clone());
        let block_tokens = self.routing.policy().block_tokens();
        Some(Arc::new(move |_| {
            let blocks = index.blocks_of(members.load().addrs());
            let tokens = |n: usize| (n as u64 * block_tokens) as i64;
            blocks.into_iter().map(|(a, n)| (a, tokens(n))).collect()
        }))
    }

    /// Run discovery; rebuild the members if the set changed; let go of
    /// retired backends no request holds any more.
    pub async fn refresh(&self) {
        let mut change = None;
        if let Err(e) = self
            .backends
            .update(|set| change = Some(self.rebuild(&set)))
            .await
        {
            error!("{}: discovery failed: {e}", self.name);
        }
        if let Some(change) = change.filter(|c| !(c.added.is_empty() && c.removed.is_empty())) {
            let list = |v: &[SocketAddr]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
            info!(
                event = "backends_changed",
                model = self.name.as_str(),
                added:serde = list(&change.added),
                removed:serde = list(&change.removed),
                backends = self.members.load().addrs().len();
                ""
            );
        }
        self.sweep();
    }

    /// New members for `set`: kept backends keep their state, returning
    /// ones (still busy since they left) take theirs back, new ones start
    /// empty; those that left are retired. Returns what changed.
    fn rebuild(&self, set: &BTreeSet<Backend>) -> Diff {
        let listed: Vec<(SocketAddr, u32)> = set
            .iter()
            .filter_map(|b| Some((*b.as_inet()?, u32::try_from(b.weight).ok()?)))
            .collect();
        let addrs: Vec<SocketAddr> = listed.iter().map(|(a, _)| *a).collect();
        let old = self.members.load_full();
        let change = diff(old.addrs(), &addrs);
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        let indexed = self.routing.index().is_some();
        let backends = set
            .iter()
            .filter_map(|b| {
                let a = b.as_inet()?;
                let admission = old.admission(a).cloned().or_else(|| {
                    let i = retired.iter().position(|(r, _)| r == a)?;
                    Some(retired.swap_remove(i).1)
                });
                // Those that stay keep their series; a backend back before
                // its old series were removed finds them again.
                let series = old.backends.get(a).map(|o| o.series.clone());
                let member = Member {
                    admission: admission.unwrap_or_else(|| self.admission(a)),
                    series: series.unwrap_or_else(|| {
                        Arc::new(metrics::BackendSeries::new(&self.name, a, indexed))
                    }),
                    tls: b.ext.get::<BackendTls>().cloned(),
                };
                Some((*a, member))
            })
            .collect();
        retired.extend(
            change
                .removed
                .iter()
                .filter_map(|a| Some((*a, old.admission(a)?.clone()))),
        );
        drop(retired);
        for addr in &change.removed {
            self.routing.forget(addr);
        }
        let router = RoutingTable::new(self.routing.policy(), listed);
        let exclusions = Arc::new(old.exclusions.carried_to(&addrs));
        let ranked = ranked(&router, &backends, &exclusions);
        self.members.store(Arc::new(Members {
            router,
            exclusions,
            backends,
            ranked,
        }));
        change
    }

    /// A new backend's admission, with its metric series created at zero.
    fn admission(&self, addr: &SocketAddr) -> Arc<Admission> {
        let backend = addr.to_string();
        metrics::init_backend(&self.name, &backend);
        let labels = [self.name.as_str(), backend.as_str()];
        let gauges = Gauges {
            inflight: metrics::IN_FLIGHT.with_label_values(&labels),
            queued: metrics::QUEUE_DEPTH.with_label_values(&labels),
        };
        Admission::new(self.limits, self.load_feedback, self.fairness, gauges)
    }

    /// Forget the retired backends nobody holds: no request (its members,
    /// its permit or queue place) refers to them any more.
    fn sweep(&self) {
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.retain(|(addr, admission)| {
            let busy = Arc::strong_count(admission) > 1;
            if !busy {
                metrics::remove_backend(&self.name, &addr.to_string());
            }
            busy
        });
    }

    /// Backends retired and still busy.
    #[cfg(test)]
    fn retired(&self) -> usize {
        self.retired.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

fn current_exclusions(members: &Arc<ArcSwap<Members>>) -> CurrentExclusions {
    let members = members.clone();
    Arc::new(move || members.load().exclusions.clone())
}

#[cfg(test)]
mod tests;
