//! Backends by DNS name: an `address` entry may be `name:port`, and every
//! address the name resolves to (A and AAAA) is a backend of its own with
//! the entry's weight. Names are resolved at start (`resolve_at_start`, also
//! used by `-t` and `route`) and then every `discovery.refresh_secs` through
//! Pingora's `ServiceDiscovery` (`service.rs`).
//!
//! The policy is [`Entries`], plain code: each entry keeps its last good
//! answer, so a failed or empty lookup leaves its backends as they were;
//! a change between failing and resolving is reported once.

mod resolver;
mod service;

use std::net::SocketAddr;
use std::sync::Arc;

use resolver::Resolver;
pub use service::Discovery;

use crate::config::{BackendConfig, DiscoveryConfig, GatewayConfig, Target};
use crate::tls::BackendTls;

/// One model's entries and what each resolved to last.
#[derive(Debug, Clone)]
pub struct Entries {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    config: BackendConfig,
    /// The last good answer; a literal address is its own. `None`: a name
    /// that has not resolved yet.
    last: Option<Vec<SocketAddr>>,
    /// The last lookup failed.
    failing: bool,
}

/// A name's lookup changed between failing and resolving: log it once.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Failing(Unresolved),
    Recovered { field: String, name: String },
}

/// A name that did not resolve: where it is configured and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Unresolved {
    pub field: String,
    pub name: String,
    pub error: String,
}

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Unresolved { field, name, error } = self;
        write!(f, "{field} = {name:?}: does not resolve: {error}")
    }
}

impl Entries {
    pub fn new(backends: &[BackendConfig]) -> Self {
        let entries = backends
            .iter()
            .map(|b| Entry {
                config: b.clone(),
                last: match b.target {
                    Target::Addr(a) => Some(vec![a]),
                    Target::Name { .. } => None,
                },
                failing: false,
            })
            .collect();
        Entries { entries }
    }

    /// The names to look up: (entry index, host, port).
    pub fn names(&self) -> Vec<(usize, String, u16)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match &e.config.target {
                Target::Name { host, port } => Some((i, host.clone(), *port)),
                Target::Addr(_) => None,
            })
            .collect()
    }

    /// Take entry `i`'s lookup result: a good answer replaces the last one,
    /// an error keeps it. Returns the change of state, if any.
    pub fn record(&mut self, i: usize, result: Result<Vec<SocketAddr>, String>) -> Option<Change> {
        let entry = self.entries.get_mut(i)?;
        let (field, name) = (entry.config.field.clone(), entry.config.target.to_string());
        match result {
            Ok(addrs) => {
                entry.last = Some(addrs);
                std::mem::replace(&mut entry.failing, false)
                    .then_some(Change::Recovered { field, name })
            }
            Err(error) => (!std::mem::replace(&mut entry.failing, true))
                .then_some(Change::Failing(Unresolved { field, name, error })),
        }
    }

    /// The backend set, sorted: every address of every entry's last good
    /// answer with the entry's weight. An address two entries share is
    /// one backend, with the first entry's weight.
    pub fn members(&self) -> Vec<(SocketAddr, u32)> {
        let mut out: Vec<(SocketAddr, u32)> = Vec::new();
        for e in &self.entries {
            for addr in e.last.iter().flatten() {
                if !out.iter().any(|(a, _)| a == addr) {
                    out.push((*addr, e.config.weight));
                }
            }
        }
        out.sort();
        out
    }

    /// How to connect to a member: the TLS of the first entry it comes
    /// from (as its weight).
    pub fn tls_of(&self, addr: &SocketAddr) -> Option<&BackendTls> {
        self.entries
            .iter()
            .find(|e| e.last.iter().flatten().any(|a| a == addr))?
            .config
            .tls
            .as_ref()
    }

    /// Each DNS name as written, with its addresses now (none when it
    /// has not resolved).
    pub fn resolved_names(&self) -> Vec<(String, Vec<SocketAddr>)> {
        self.entries
            .iter()
            .filter(|e| matches!(e.config.target, Target::Name { .. }))
            .map(|e| {
                (
                    e.config.target.to_string(),
                    e.last.clone().unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// Look `names` ((entry index, host, port)) up once, concurrently, with a
/// resolver built for this round. A resolver that cannot be built fails
/// every lookup of the round.
pub async fn lookup_round(
    config: &DiscoveryConfig,
    names: Vec<(usize, String, u16)>,
) -> Vec<(usize, Result<Vec<SocketAddr>, String>)> {
    match Resolver::new(config) {
        Ok(resolver) => lookup_all(&Arc::new(resolver), names).await,
        Err(e) => names
            .into_iter()
            .map(|(i, ..)| (i, Err(e.clone())))
            .collect(),
    }
}

/// Resolve `names` ((index, host, port)) concurrently.
async fn lookup_all(
    resolver: &Arc<Resolver>,
    names: Vec<(usize, String, u16)>,
) -> Vec<(usize, Result<Vec<SocketAddr>, String>)> {
    let mut set = tokio::task::JoinSet::new();
    for (i, host, port) in names {
        let resolver = resolver.clone();
        set.spawn(async move { (i, resolver.resolve(&host, port).await) });
    }
    let mut out = Vec::new();
    while let Some(done) = set.join_next().await {
        // A lookup task cannot panic short of a bug in the resolver: its
        // entry then keeps its last answer, as on any failed lookup.
        if let Ok(result) = done {
            out.push(result);
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out
}

/// Every model's entries, resolved once as the daemon does at start.
pub struct AtStart {
    /// In configuration order.
    pub models: Vec<(String, Entries)>,
    /// The names that did not resolve, in configuration order.
    pub unresolved: Vec<Unresolved>,
}

/// [`resolve_at_start`], judged as `-t` judges it: `Err` with the message
/// for the first name that does not resolve, unless
/// `discovery.allow_unresolved`; then those names are only to warn about.
pub fn resolve_checked(config: &GatewayConfig) -> Result<AtStart, String> {
    let resolved = resolve_at_start(config)?;
    match resolved.unresolved.first() {
        Some(first) if !config.discovery.allow_unresolved => Err(first.to_string()),
        _ => Ok(resolved),
    }
}

impl Unresolved {
    /// The warning of a name allowed not to resolve, for `-t` and `route`.
    pub fn warning(&self) -> String {
        format!("warning: {self} (allowed by discovery.allow_unresolved)")
    }

    /// The daemon's log line for it: the name's first `discovery_failing`.
    pub fn log_allowed(&self) {
        log::warn!(
            event = "discovery_failing",
            field = self.field.as_str(),
            name = self.name.as_str(),
            error = self.error.as_str();
            "starting without its backends (discovery.allow_unresolved)"
        );
    }
}

/// Resolve every model's names once, on a runtime of its own (before
/// Pingora starts, or in `route`). `Err` when no lookup can be made (the
/// resolver cannot be built, e.g. without /etc/resolv.conf).
pub fn resolve_at_start(config: &GatewayConfig) -> Result<AtStart, String> {
    let mut models: Vec<(String, Entries)> = config
        .models
        .iter()
        .map(|m| (m.name.clone(), Entries::new(&m.backends)))
        .collect();
    let mut unresolved = Vec::new();
    if config.models.iter().any(|m| m.uses_names()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("DNS lookups: {e}"))?;
        runtime.block_on(async {
            for (_, entries) in &mut models {
                for (i, result) in lookup_round(&config.discovery, entries.names()).await {
                    if let Some(Change::Failing(name)) = entries.record(i, result) {
                        unresolved.push(name);
                    }
                }
            }
        });
    }
    Ok(AtStart { models, unresolved })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn entry(i: usize, target: Target, weight: u32) -> BackendConfig {
        BackendConfig {
            target,
            weight,
            tls: None,
            field: format!("gateway.models[0].addresses[{i}]"),
        }
    }

    fn name(host: &str) -> Target {
        Target::Name {
            host: host.into(),
            port: 8000,
        }
    }

    /// `a.test:8000` (weight 2), the literal 10.0.0.9:8000, `b.test:8000`.
    fn entries() -> Entries {
        Entries::new(&[
            entry(0, name("a.test"), 2),
            entry(1, Target::Addr(sa("10.0.0.9:8000")), 1),
            entry(2, name("b.test"), 1),
        ])
    }

    #[test]
    fn literals_are_members_at_once_and_names_once_resolved() {
        let mut e = entries();
        assert_eq!(
            e.names(),
            [(0, "a.test".into(), 8000), (2, "b.test".into(), 8000)]
        );
        assert_eq!(e.members(), [(sa("10.0.0.9:8000"), 1)]);
        assert_eq!(
            e.record(0, Ok(vec![sa("10.0.0.2:8000"), sa("10.0.0.1:8000")])),
            None
        );
        assert_eq!(
            e.members(),
            [
                (sa("10.0.0.1:8000"), 2),
                (sa("10.0.0.2:8000"), 2),
                (sa("10.0.0.9:8000"), 1)
            ]
        );
        assert_eq!(
            e.resolved_names(),
            [
                (
                    "a.test:8000".into(),
                    vec![sa("10.0.0.2:8000"), sa("10.0.0.1:8000")]
                ),
                ("b.test:8000".into(), vec![])
            ]
        );
    }

    #[test]
    fn a_failed_lookup_keeps_the_last_answer_and_changes_are_reported_once() {
        let mut e = entries();
        let first = vec![sa("10.0.0.1:8000")];
        e.record(0, Ok(first.clone()));
        let failing = e.record(0, Err("SERVFAIL".into()));
        assert_eq!(
            failing,
            Some(Change::Failing(Unresolved {
                field: "gateway.models[0].addresses[0]".into(),
                name: "a.test:8000".into(),
                error: "SERVFAIL".into()
            }))
        );
        assert_eq!(e.record(0, Err("timeout".into())), None, "still failing");
        assert!(e.members().contains(&(first[0], 2)), "last answer kept");
        let grown = vec![sa("10.0.0.1:8000"), sa("10.0.0.5:8000")];
        assert_eq!(
            e.record(0, Ok(grown)),
            Some(Change::Recovered {
                field: "gateway.models[0].addresses[0]".into(),
                name: "a.test:8000".into()
            })
        );
        assert_eq!(e.members().len(), 3);
        assert_eq!(e.record(0, Ok(vec![sa("10.0.0.5:8000")])), None);
        assert_eq!(
            e.members(),
            [(sa("10.0.0.5:8000"), 2), (sa("10.0.0.9:8000"), 1)]
        );
        assert_eq!(e.record(9, Ok(vec![])), None, "no such entry");
    }

    #[test]
    fn an_address_two_entries_share_is_one_backend_with_the_first_weight() {
        let mut e = entries();
        e.record(2, Ok(vec![sa("10.0.0.9:8000"), sa("10.0.0.3:8000")]));
        assert_eq!(
            e.members(),
            [(sa("10.0.0.3:8000"), 1), (sa("10.0.0.9:8000"), 1)]
        );
        e.record(0, Ok(vec![sa("10.0.0.3:8000")]));
        assert_eq!(
            e.members(),
            [(sa("10.0.0.3:8000"), 2), (sa("10.0.0.9:8000"), 1)]
        );
    }

    #[test]
    fn every_address_of_a_tls_name_is_reached_over_tls() {
        let tls = BackendTls {
            sni: "a.test".into(),
        };
        let mut a = entry(0, name("a.test"), 1);
        a.tls = Some(tls.clone());
        let mut e = Entries::new(&[a, entry(1, Target::Addr(sa("10.0.0.9:8000")), 1)]);
        e.record(0, Ok(vec![sa("10.0.0.1:8000"), sa("10.0.0.2:8000")]));
        assert_eq!(e.tls_of(&sa("10.0.0.1:8000")), Some(&tls));
        assert_eq!(e.tls_of(&sa("10.0.0.2:8000")), Some(&tls));
        assert_eq!(e.tls_of(&sa("10.0.0.9:8000")), None, "plain literal");
        assert_eq!(e.tls_of(&sa("10.0.0.3:8000")), None, "not a member");
    }

    #[test]
    fn a_name_that_gains_a_fifth_ip_moves_a_fifth_of_its_keys_all_to_it() {
        use crate::routing::{Affinity, Facts, Policy, Request, RoutingTable};
        let ip = |i: u8| SocketAddr::from(([10, 0, 0, i], 8000));
        let mut e = Entries::new(&[entry(0, name("vllm.test"), 1)]);
        let first = |e: &Entries, key: &str| {
            let router = RoutingTable::new(&Policy::default(), e.members());
            let req = Request::new(Affinity::Key(key.as_bytes()), &[]);
            router.rank(req, |_| Facts::default()).unwrap()[0].addr
        };
        e.record(0, Ok((1..=4).map(ip).collect()));
        let keys: Vec<String> = (0..2000).map(|i| format!("session-{i}")).collect();
        let before: Vec<SocketAddr> = keys.iter().map(|k| first(&e, k)).collect();
        e.record(0, Ok((1..=5).map(ip).collect()));
        let mut moved = 0;
        for (k, was) in keys.iter().zip(&before) {
            let now = first(&e, k);
            if now != *was {
                assert_eq!(now, ip(5), "{k} moved between the old addresses");
                moved += 1;
            }
        }
        // A fifth of 2000 is 400; the bounds are about 4 standard deviations.
        assert!((330..=470).contains(&moved), "{moved} of 2000 moved");
    }

    #[test]
    fn a_name_that_never_resolved_is_reported_at_start() {
        let config = GatewayConfig::from_yaml(
            "gateway:\n  discovery: {nameservers: [\"127.0.0.1:9\"], refresh_secs: 0.3}\n  models:\n    - name: m\n      addresses: [\"127.0.0.1:1\", \"nowhere.test:80\"]\n",
        )
        .unwrap();
        // Port 9 (discard) on loopback: no DNS answer, within the deadline.
        let at_start = resolve_at_start(&config).unwrap();
        assert_eq!(at_start.unresolved.len(), 1);
        let u = &at_start.unresolved[0];
        assert_eq!(u.field, "gateway.models[0].addresses[1]");
        assert!(
            u.to_string().starts_with(
                "gateway.models[0].addresses[1] = \"nowhere.test:80\": does not resolve: "
            ),
            "{u}"
        );
        assert_eq!(resolve_checked(&config).err(), Some(u.to_string()));
        assert_eq!(at_start.models[0].1.members(), [(sa("127.0.0.1:1"), 1)]);
    }

    #[test]
    fn localhost_resolves_to_both_loopbacks_without_a_server() {
        let config = DiscoveryConfig {
            refresh: std::time::Duration::from_secs(2),
            // A server that never answers: localhost must not need one.
            nameservers: vec![sa("127.0.0.1:9")],
            allow_unresolved: false,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let got = runtime.block_on(lookup_round(&config, vec![(0, "localhost".into(), 80)]));
        assert_eq!(got, [(0, Ok(vec![sa("127.0.0.1:80"), sa("[::1]:80")]))]);
    }
}
