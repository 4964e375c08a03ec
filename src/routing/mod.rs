//! Routing policy: for one request, a model's backends in the order
//! admission tries them, each with the [`Route`] it would be served under.
//! Plain code: the proxy glue and admission never decide a route.
//!
//! The proxy calls one entry point (`model.rs`): it builds a request's
//! [`Input`] once (its affinity: a cache key, a key derived from the body or
//! none; whether it is a warmup; the stored response it continues; its
//! prompt's chain of blocks; the backends it failed on), asks
//! [`Routing::route`] for the candidates among the model's current members,
//! and reports back through the [`Plan`] which candidate admitted it. Each
//! candidate is seen through its [`Facts`] for this request: the member's
//! state from the pool (excluded after a failure, requests in flight or
//! queued here, its slots) and what routing knows of it for this request
//! (the prompt tokens it holds, from the prefix index). [`Router::rank`]
//! orders the members (rendezvous or round-robin) and its [`Choice`] picks
//! among the usable ones by their facts alone. The first candidate is the
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
//! - `prefix_index` set: the backend holding most of the prompt
//!   (`index.rs`, `chain.rs`), route `cache`, unless another costs clearly
//!   less (`cost.rs`: a cold prefill against the wait for a slot), route
//!   `balance`;
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
//! 3. what it reads of a candidate for this request: a field of [`Facts`],
//!    filled in [`Routing::route`] (as `cached_tokens` from the index) or,
//!    for a member's own state, in `pool::Members::route`;
//! 4. its rule: a [`Choice`] variant, made from the [`Policy`] in
//!    [`Router::new`] and decided in `Router::choose` over the ordered
//!    candidates' facts, with its code in a file beside this one (as
//!    `cost.rs`); state it keeps across requests lives in [`Routing`] (one
//!    per model; or shared by every model, as `owners.rs`, created in
//!    `Gateway::new`), read in [`Routing::route`] and written in
//!    [`Plan::admitted`] or in a method the proxy calls with what it saw
//!    (as [`Routing::owner_found`], [`Routing::observed`]);
//! 5. a [`Route`] variant if requests it diverts are served under a name of
//!    their own (`X-Poimen-Route`, the `route` label of the request metrics
//!    and the log line all follow from [`Route::as_str`]); an
//!    [`Unroutable`] variant if it can refuse, turned into the client's
//!    error in `proxy/admit.rs`;
//! 6. unit tests beside it, an integration test in `tests/routing.rs` (or
//!    a file of its own), its section in `docs/routing-and-admission.md`.

pub mod chain;
pub mod cost;
pub mod index;
mod model;
pub mod owners;
pub mod prefix;
pub mod rendezvous;
mod round_robin;

use std::net::SocketAddr;

use crate::api::Api;
use round_robin::RoundRobin;

pub use model::{Input, Observed, Plan, Routing, Unroutable};
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
    /// Not the order's first: the backend holding the most of its prompt
    /// (`routing.prefix_index`).
    Cache,
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
            Route::Cache => "cache",
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
/// failed on, whether load may move it, and what the cost rule weighs it
/// by.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub affinity: Affinity<'a>,
    /// Backends this request already failed on.
    pub tried: &'a [SocketAddr],
    /// Whether load may move it off the backend that holds its prompt (a
    /// warmup may not).
    pub movable: bool,
    /// Its prompt's tokens, as its chain counts them (`chain.rs`).
    pub prompt_tokens: u64,
    /// The model's rates now (`cost.rs`).
    pub rates: cost::Snapshot,
}

impl<'a> Request<'a> {
    pub fn new(affinity: Affinity<'a>, tried: &'a [SocketAddr]) -> Self {
        Request {
            affinity,
            tried,
            movable: true,
            prompt_tokens: 0,
            rates: cost::Snapshot::default(),
        }
    }
}

/// What routing knows of one member for one request: the member's state
/// (from the pool) and what it holds of this request's prompt (from the
/// prefix index). A policy reads a candidate through these alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct Facts {
    /// Left out after a failure.
    pub excluded: bool,
    /// Requests holding a slot or queued for one, at this gateway.
    pub load: usize,
    /// The slots this gateway may use on it now. Load never moves a request
    /// off a backend with a free slot: it would start at once on the GPU
    /// that holds its prefix, and a move would only buy a cold prefill
    /// elsewhere.
    pub slots: usize,
    /// The leading tokens of this request's prompt it is expected to hold
    /// (`index.rs`); 0 when none, or no index is kept.
    pub cached_tokens: u64,
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
    /// Route by cost over a prefix index (`cost.rs`, `index.rs`); `None`:
    /// no index (rendezvous or round-robin alone).
    pub prefix_index: Option<IndexSize>,
    /// How requests without a key are routed.
    pub keyless: Keyless,
    /// How much of a completion's `prompt` a derived key covers.
    pub keyless_prefix_bytes: usize,
}

/// How much the prefix index keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexSize {
    /// Blocks one backend is taken to hold at most: its KV cache.
    pub backend_blocks: usize,
    /// Blocks held over all the model's backends at most.
    pub max_blocks: usize,
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

    /// The chain of a request's prompt, when an index is kept.
    pub fn chain(&self, api: Api, prompt: &crate::body::Prompt) -> Vec<u64> {
        match self.prefix_index {
            Some(_) => chain::of_prompt(api, prompt),
            None => Vec::new(),
        }
    }
}

/// How a ranking's choice is made among the usable members, in order.
#[derive(Debug, Clone, Copy)]
pub enum Choice {
    /// The first.
    First,
    /// The cost rule (`cost.rs`).
    Cost,
}

/// One model's routing table, built once per backend set.
pub struct Router {
    choice: Choice,
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
        let choice = match policy.prefix_index {
            Some(_) => Choice::Cost,
            None => Choice::First,
        };
        Router {
            choice,
            addrs: members.iter().map(|(a, _)| *a).collect(),
            keyed: members.iter().map(|(a, w)| (a.to_string(), *w)).collect(),
            round_robin: RoundRobin::new(members.iter().map(|(_, w)| *w)),
        }
    }

    /// The members, in address order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The position of a member in [`Router::addrs`].
    pub fn position(&self, addr: &SocketAddr) -> Option<usize> {
        self.addrs.binary_search(addr).ok()
    }

    /// [`Router::rank_at`] with each member's facts found by its address.
    pub fn rank(
        &self,
        req: Request,
        facts: impl Fn(&SocketAddr) -> Facts,
    ) -> Option<Vec<Candidate>> {
        self.rank_at(req, |i| facts(&self.addrs[i]))
    }

    /// The candidates for a request, best first, each member in the `facts`
    /// it has for this request (by its position in [`Router::addrs`], so
    /// that no member is looked up by address); `None` when no member is
    /// usable (all excluded or tried).
    pub fn rank_at(&self, req: Request, facts: impl Fn(usize) -> Facts) -> Option<Vec<Candidate>> {
        let Request {
            affinity, tried, ..
        } = req;
        let (order, preferred): (Vec<usize>, Route) = match affinity {
            Affinity::Key(key) => (rendezvous::rank(key, &self.keyed), Route::Hash),
            Affinity::Derived(key) => (rendezvous::rank(key, &self.keyed), Route::Prefix),
            Affinity::None => (
                self.round_robin.order(self.addrs.len()).collect(),
                Route::RoundRobin,
            ),
        };
        let facts: Vec<Facts> = order.iter().map(|i| facts(*i)).collect();
        let usable = |pos: usize| !facts[pos].excluded && !tried.contains(&self.addrs[order[pos]]);
        let first_usable = (0..order.len()).find(|p| usable(*p))?;
        let first = match first_usable == 0 && tried.is_empty() {
            true => preferred,
            false => Route::Fallback,
        };
        let (chosen, route) = self
            .choose(&req, &facts, usable, first_usable)
            .unwrap_or((first_usable, first));
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

    /// The position in `order` the policy chooses instead of the first
    /// usable one, and the route it is served under; `None`: the first.
    fn choose(
        &self,
        req: &Request,
        facts: &[Facts],
        usable: impl Fn(usize) -> bool,
        first_usable: usize,
    ) -> Option<(usize, Route)> {
        match self.choice {
            Choice::First => None,
            Choice::Cost => {
                match cost::choose(req.rates, req.prompt_tokens, facts, usable, req.movable)? {
                    cost::Pick::Home(p) if p == first_usable => None,
                    cost::Pick::Home(p) => Some((p, Route::Cache)),
                    cost::Pick::Moved { to, .. } => Some((to, Route::Balance)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
