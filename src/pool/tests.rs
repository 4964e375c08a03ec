use super::*;
use prometheus::core::Collector;

use crate::admission::{Class, Demand, Fairness, Share};
use crate::config::{BackendConfig, DiscoveryConfig, Target};
use crate::discovery::Entries;
use http::HeaderValue;

use crate::api::Api;
use crate::routing::{Owners, Policy, Route};

fn addr(i: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9000 + i))
}

/// Model `name` over `addr(0..n)`, each of weight 1.
fn model(name: &str, n: u16) -> ModelConfig {
    ModelConfig {
        name: name.into(),
        aliases: Vec::new(),
        learned: false,
        load_adapters_from: None,
        backends: (0..n)
            .map(|i| BackendConfig {
                target: Target::Addr(addr(i)),
                weight: 1,
                tls: None,
                field: format!("gateway.models[0].addresses[{i}]"),
            })
            .collect(),
        limits: Capacity {
            max_num_seqs: 1,
            max_queue_depth: 20,
        },
        policy: Policy::default(),
        load_feedback: None,
    }
}

fn pool_of(model: &ModelConfig) -> ModelPool {
    pool_resolved(model, Entries::new(&model.backends))
}

/// The pool of `model` whose entries resolved at start to `resolved`.
fn pool_resolved(model: &ModelConfig, resolved: Entries) -> ModelPool {
    let config = DiscoveryConfig {
        refresh: Duration::from_secs(10),
        // Were a name looked up, only a loopback port would be asked.
        nameservers: vec![SocketAddr::from(([127, 0, 0, 1], 9))],
        allow_unresolved: false,
    };
    let discovery = Discovery::new(&model.name, &config, resolved);
    let owners = routing_owners();
    ModelPool::new(
        model,
        discovery,
        Duration::from_secs(30),
        None,
        None,
        owners,
        Fairness::Requests,
    )
    .0
}

fn routing_owners() -> Arc<Owners> {
    Arc::new(Owners::new(16, Duration::from_secs(60)))
}

fn routing() -> ModelRouting {
    ModelRouting::new("m".into(), Policy::default(), routing_owners())
}

fn pool(n: u16) -> Arc<Members> {
    pool_of(&model("m", n)).members()
}

/// What discovery would hand over: `addrs`, weight 1.
fn set(addrs: &[SocketAddr]) -> BTreeSet<Backend> {
    addrs
        .iter()
        .map(|a| Backend::new(&a.to_string()).unwrap())
        .collect()
}

#[test]
fn every_backend_is_routed_and_admitted() {
    let p = pool(3);
    assert_eq!(p.addrs().len(), 3);
    for a in p.addrs() {
        assert!(p.admission(a).is_some());
    }
}

/// `first_update` polls Pingora's update once, outside any runtime. A
/// name resolved at start is a backend at once: discovery's first call
/// does not look it up (a lookup would wait), and the update waits for
/// nothing else.
#[test]
fn the_first_update_completes_without_waiting() {
    let mut m = model("pool-first", 0);
    m.backends.push(BackendConfig {
        target: Target::Name {
            host: "gpu.invalid".into(),
            port: 8000,
        },
        weight: 1,
        tls: None,
        field: "gateway.models[0].addresses[0]".into(),
    });
    let mut resolved = Entries::new(&m.backends);
    resolved.record(0, Ok(vec![addr(7)]));
    assert_eq!(pool_resolved(&m, resolved).members().addrs(), [addr(7)]);
}

#[test]
fn diff_lists_what_is_added_and_removed() {
    let (a, b, c, d) = (addr(1), addr(2), addr(3), addr(4));
    assert_eq!(
        diff(&[c, a, b], &[d, b, a]),
        Diff {
            added: vec![d],
            removed: vec![c]
        }
    );
    let same = diff(&[a, b], &[b, a]);
    assert!(same.added.is_empty() && same.removed.is_empty());
}

#[test]
fn a_new_set_keeps_the_state_of_those_that_stay_and_starts_new_ones_empty() {
    let p = pool_of(&model("pool-keeps", 2));
    let before = p.members();
    let (a, b, c) = (addr(0), addr(1), addr(2));
    let permit = before.admission(&a).unwrap().try_enter(
        Class::Agent,
        &Share::new("t", 1),
        Demand::default(),
    );
    assert!(before.exclusions().exclude(b, Instant::now()));
    p.rebuild(&set(&[a, b, c]));
    let after = p.members();
    assert_eq!(after.addrs(), [a, b, c]);
    assert!(Arc::ptr_eq(
        before.admission(&a).unwrap(),
        after.admission(&a).unwrap()
    ));
    assert_eq!(after.admission(&a).unwrap().load(), 1, "its slot is held");
    assert!(after.exclusions().is_excluded(&b, Instant::now()));
    assert_eq!(after.admission(&c).unwrap().load(), 0);
    assert!(!after.exclusions().is_excluded(&c, Instant::now()));
    drop(permit);
}

#[test]
fn a_removed_backend_is_retired_until_idle_then_its_series_go() {
    let p = pool_of(&model("pool-retires", 2));
    let (a, b) = (addr(0), addr(1));
    // Whether the inflight gauge has a series for (this model, backend).
    let series = |backend: SocketAddr| {
        let backend = backend.to_string();
        metrics::IN_FLIGHT
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .any(|m| {
                let values: Vec<&str> = m.get_label().iter().map(|l| l.value()).collect();
                values.contains(&p.name.as_str()) && values.contains(&backend.as_str())
            })
    };
    let routed_in = p.members();
    let ticket = routed_in
        .admission(&b)
        .unwrap()
        .try_enter(Class::Agent, &Share::new("t", 1), Demand::default())
        .unwrap();
    drop(routed_in);
    p.rebuild(&set(&[a]));
    assert_eq!(p.members().addrs(), [a], "no new request goes to b");
    p.sweep();
    assert_eq!(p.retired(), 1, "b is busy: kept");
    assert!(series(b));
    drop(ticket);
    p.sweep();
    assert_eq!(p.retired(), 0);
    assert!(!series(b), "b's series are gone");
    assert!(series(a));
}

#[test]
fn a_backend_back_while_busy_takes_its_admission_back() {
    let p = pool_of(&model("pool-returns", 2));
    let b = addr(1);
    let first = p.members().admission(&b).unwrap().clone();
    let permit = first.try_enter(Class::Agent, &Share::new("t", 1), Demand::default());
    p.rebuild(&set(&[addr(0)]));
    p.rebuild(&set(&[addr(0), b]));
    assert!(Arc::ptr_eq(&first, p.members().admission(&b).unwrap()));
    assert_eq!(p.retired(), 0);
    drop(permit);
}

#[test]
fn an_excluded_backend_falls_back_then_returns_after_the_window() {
    let p = pool(4);
    let now = Instant::now();
    let routing = routing();
    let best = |t| {
        let key = Some(HeaderValue::from_static("k1"));
        let input = routing.input(key, false, Api::ChatCompletions, &Default::default());
        let first = p.route(&routing, &input, t).unwrap().first();
        first
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
    let routing = routing();
    let input = routing.input(None, false, Api::ChatCompletions, &Default::default());
    let later = now + Duration::from_secs(10);
    let Err(Unroutable::NoBackend) = p.route(&routing, &input, later) else {
        panic!("every backend is excluded");
    };
    let wait = p.exclusions().retry_after(later);
    assert!(wait <= Duration::from_secs(20) && wait > Duration::from_secs(19));
}
