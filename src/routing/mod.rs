//! Routing policy: for one request, a model's backends in the order
//! admission tries them, each with the [`Route`] it would be served under.
//! Plain code: the proxy glue and admission never decide a route.
//!
//! The proxy calls one entry point (`model.rs`): it builds a request's
//! [`Input`] once (its affinity: a cache key, a key derived from the body or
//! none; whether it is a warmup; the stored response it continues; the
//! backends it failed on), asks [`Routing::route`] for the candidates among
//! the model's current members, each in its [`Status`] now (excluded after
//! a failure, requests in flight or queued here), and reports back through
//! the [`Plan`] which candidate admitted it. The first candidate is the
//! choice; the others are where `overflow: spill` goes when the choice has
//! neither a slot nor a queue place.
//!
//! The policies:
//! - a stored response continued, retrieved or cancelled: its owner alone
//!   (`owners.rs`), route `owner`, decided in [`Routing::route`];
//! - a key: rendezvous ranking (`rendezvous.rs`), route `hash`;
//! - no key, `keyless: prefix | system`: a key derived from the body
//!   (`prefix.rs`), ranked the same way, route `prefix`;
//! - no key otherwise: weighted round-robin (`round_robin.rs`), route
//!   `round_robin`;
//! - `balance_factor` set: a keyed request (not a warmup) passes over a
//!   backend whose load is at its cap and that has no free slot
//!   (`bounded.rs`), route `balance`; a conversation so moved stays where
//!   it was moved while that backend is under its cap (`moves.rs`);
//! - the preferred backend excluded or already tried: the next usable one in
//!   the same order, route `fallback`;
//! - the later candidates: route `spill`.
//!
//! To add a policy:
//! 1. its configuration: the field in `config/routing.rs` (`RoutingFile`,
//!    documented, with its default, its `Bound` if a number) and its row in
//!    `conf/gateway.yaml` and `docs/configuration.md` (the key test fails
//!    without them), its field in [`Policy`];
//! 2. what it reads of a request: a field of [`Input`], set in
//!    [`Routing::input`] (or passed there by the proxy, if it comes from a
//!    header);
//! 3. a stateless policy: its case in [`Router::rank`] (through
//!    [`Request`]), with its code in a file beside this one when it is more
//!    than a few lines; a stateful one: its state in [`Routing`] (one per
//!    model; or shared by every model, as `owners.rs`, created in
//!    `Gateway::new`), read in [`Routing::route`] and written in
//!    [`Plan::admitted`] or in a method the proxy calls with what it saw
//!    (as [`Routing::owner_found`]);
//! 4. a [`Route`] variant if requests it diverts are served under a name of
//!    their own (`X-Poimen-Route`, the `route` label of the request metrics
//!    and the log line all follow from [`Route::as_str`]); an
//!    [`Unroutable`] variant if it can refuse, turned into the client's
//!    error in `proxy/admit.rs`;
//! 5. unit tests beside it, an integration test in `tests/routing.rs` (or
//!    a file of its own), its section in `docs/routing-and-admission.md`.

mod bounded;
mod model;
mod moves;
pub mod owners;
pub mod prefix;
pub mod rendezvous;
mod round_robin;

use std::net::SocketAddr;

use crate::api::Api;
use round_robin::RoundRobin;

pub use model::{Input, Plan, Routing, Unroutable};
pub use owners::{Owner, Owners};

/// Why a backend was chosen: shown to clients as `X-Poimen-Route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The key's highest-scoring backend.
    Hash,
    /// No key: the round-robin turn.
    RoundRobin,
    /// The preferred backend was excluded or failed: the next in order.
    Fallback,
    /// The choice had no room (`overflow: spill`): the next in order.
    Spill,
    /// The key's better-ranked backends were at their load cap.
    Balance,
    /// No key: the first choice of the key derived from the body.
    Prefix,
    /// The backend that stored the response this request continues or
    /// names (`owners.rs`).
    Owner,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Hash => "hash",
            Route::RoundRobin => "round_robin",
            Route::Fallback => "fallback",
            Route::Spill => "spill",
            Route::Balance => "balance",
            Route::Prefix => "prefix",
            Route::Owner => "owner",
        }
    }
}

/// What a request brings to routing.
#[derive(Debug, Clone, Copy)]
pub enum Affinity<'a> {
    /// No key: round-robin.
    None,
    /// `X-Poimen-Cache-Key`.
    Key(&'a [u8]),
    /// No header; a key derived from the body (`keyless: prefix`).
    Derived(&'a [u8]),
}

impl<'a> Affinity<'a> {
    /// The key the request is ranked by, if any.
    pub fn key(self) -> Option<&'a [u8]> {
        match self {
            Affinity::Key(k) | Affinity::Derived(k) => Some(k),
            Affinity::None => None,
        }
    }
}

/// One ranking's input: the request's affinity, the backends it already
/// failed on, and whether bounded load may move it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub affinity: Affinity<'a>,
    /// Backends this request already failed on.
    pub tried: &'a [SocketAddr],
    pub balance: Balance,
}

/// Whether bounded load may move a request (`balance_factor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    /// It stays on its key's first usable backend, whatever the load.
    Fixed,
    /// It may pass over a backend at its cap; `moved_to`: where its
    /// conversation was last moved (`moves.rs`), tried first.
    Movable { moved_to: Option<SocketAddr> },
}

impl<'a> Request<'a> {
    pub fn new(affinity: Affinity<'a>, tried: &'a [SocketAddr]) -> Self {
        Request {
            affinity,
            tried,
            balance: Balance::Movable { moved_to: None },
        }
    }
}

/// A member's state when a request is routed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Status {
    /// Left out after a failure.
    pub excluded: bool,
    /// Requests holding a slot or queued for one, at this gateway.
    pub load: usize,
    /// The slots this gateway may use on it now. Bounded load never passes
    /// over a backend with a free slot: the request would start at once on
    /// the GPU that holds its prefix, and a move would only buy a cold
    /// prefill elsewhere.
    pub slots: usize,
}

/// One backend a request may go to, and the route it is served under there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub addr: SocketAddr,
    pub route: Route,
}

/// Per-model routing settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    /// Bounded-load rendezvous for keyed requests; `None`: pure rendezvous.
    pub balance_factor: Option<f64>,
    /// How requests without a key are routed.
    pub keyless: Keyless,
    /// How much of a completion's `prompt` a derived key covers.
    pub keyless_prefix_bytes: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Keyless {
    #[default]
    RoundRobin,
    /// A key derived from a head of the body (`prefix.rs`).
    Derived(prefix::Head),
}

impl Keyless {
    /// As written in `routing.keyless`.
    pub fn as_str(self) -> &'static str {
        match self {
            Keyless::RoundRobin => "round_robin",
            Keyless::Derived(prefix::Head::FirstUser) => "prefix",
            Keyless::Derived(prefix::Head::System) => "system",
        }
    }
}

impl Policy {
    /// The key a request without `X-Poimen-Cache-Key` is ranked by: derived
    /// from its body, when the policy says so and the body has a head.
    pub fn derived_key(&self, api: Api, body: &[u8]) -> Option<prefix::DerivedKey> {
        match self.keyless {
            Keyless::Derived(head) => prefix::derive(api, body, head, self.keyless_prefix_bytes),
            Keyless::RoundRobin => None,
        }
    }

    /// The conversation (`moves.rs`) of a request with affinity `key` and
    /// `body`, when bounded load may move it.
    pub fn conversation(&self, key: &[u8], api: Api, body: &[u8]) -> Option<u64> {
        self.balance_factor?;
        let head = prefix::derive(
            api,
            body,
            prefix::Head::FirstUser,
            self.keyless_prefix_bytes,
        );
        Some(moves::conversation(
            key,
            head.as_ref().map(|h| h.as_bytes()),
        ))
    }
}

/// One model's routing table, built once per backend set.
pub struct Router {
    balance_factor: Option<f64>,
    addrs: Vec<SocketAddr>,
    /// (address as hashed, weight), in `addrs` order.
    keyed: Vec<(String, u32)>,
    round_robin: RoundRobin,
}

impl Router {
    /// A router over `members` (address, weight), kept in address order so
    /// that ties and fallbacks do not depend on how the set was listed.
    pub fn new(policy: &Policy, members: impl IntoIterator<Item = (SocketAddr, u32)>) -> Self {
        let mut members: Vec<(SocketAddr, u32)> = members.into_iter().collect();
        members.sort();
        Router {
            balance_factor: policy.balance_factor,
            addrs: members.iter().map(|(a, _)| *a).collect(),
            keyed: members.iter().map(|(a, w)| (a.to_string(), *w)).collect(),
            round_robin: RoundRobin::new(members.iter().map(|(_, w)| *w)),
        }
    }

    /// Whether keyed requests are bounded by load (`balance_factor`).
    pub fn bounded(&self) -> bool {
        self.balance_factor.is_some()
    }

    /// The members, in address order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The candidates for a request, best first; `None` when no member is
    /// usable (all excluded or tried).
    pub fn rank(
        &self,
        req: Request,
        status: impl Fn(&SocketAddr) -> Status,
    ) -> Option<Vec<Candidate>> {
        let Request {
            affinity,
            tried,
            balance,
        } = req;
        let (order, preferred): (Vec<usize>, Route) = match affinity {
            Affinity::Key(key) => (rendezvous::rank(key, &self.keyed), Route::Hash),
            Affinity::Derived(key) => (rendezvous::rank(key, &self.keyed), Route::Prefix),
            Affinity::None => (
                self.round_robin.order(self.addrs.len()).collect(),
                Route::RoundRobin,
            ),
        };
        let states: Vec<Status> = order.iter().map(|i| status(&self.addrs[*i])).collect();
        let usable = |pos: usize| !states[pos].excluded && !tried.contains(&self.addrs[order[pos]]);
        let first_usable = (0..order.len()).find(|p| usable(*p))?;
        let bounded = match (affinity, self.balance_factor, balance) {
            (Affinity::None, _, _) | (_, None, _) | (_, _, Balance::Fixed) => None,
            (_, Some(factor), Balance::Movable { moved_to }) => {
                let moved_to =
                    moved_to.and_then(|a| order.iter().position(|i| self.addrs[*i] == a));
                self.first_under_cap(factor, &order, &states, usable, moved_to)
            }
        };
        let (chosen, route) = match bounded {
            Some(p) if p != first_usable => (p, Route::Balance),
            _ if first_usable == 0 && tried.is_empty() => (first_usable, preferred),
            _ => (first_usable, Route::Fallback),
        };
        let mut out = Vec::with_capacity(order.len());
        out.push(Candidate {
            addr: self.addrs[order[chosen]],
            route,
        });
        out.extend(
            (0..order.len())
                .filter(|p| *p != chosen && usable(*p))
                .map(|p| Candidate {
                    addr: self.addrs[order[p]],
                    route: Route::Spill,
                }),
        );
        Some(out)
    }

    /// The position in `order` of the first usable member below its load
    /// cap (see `bounded.rs`) or with a free slot; `moved_to` first, if it
    /// is one.
    fn first_under_cap(
        &self,
        factor: f64,
        order: &[usize],
        states: &[Status],
        usable: impl Fn(usize) -> bool,
        moved_to: Option<usize>,
    ) -> Option<usize> {
        let total_load: usize = states.iter().map(|s| s.load).sum();
        let total_weight: u64 = order
            .iter()
            .zip(states)
            .filter(|(_, s)| !s.excluded)
            .map(|(i, _)| u64::from(self.keyed[*i].1))
            .sum();
        let eligible = |p: &usize| {
            let weight = self.keyed[order[*p]].1;
            let cap = bounded::cap(factor, total_load, weight, total_weight);
            usable(*p) && states[*p].load < cap.max(states[*p].slots)
        };
        moved_to
            .filter(eligible)
            .or_else(|| (0..order.len()).find(eligible))
    }
}

#[cfg(test)]
mod tests;
