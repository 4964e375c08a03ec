//! Routing policy: for one request, a model's backends in the order
//! admission tries them, each with the [`Route`] it would be served under.
//! Plain code: the proxy glue and admission never decide a route.
//!
//! The proxy calls one entry point (`model.rs`): it builds a request's
//! [`Routable`] once (its affinity: a cache key, a key derived from the body or
//! none; whether it is a warmup; the stored response it continues; its
//! prompt's chain of blocks; the backends it failed on), asks
//! [`ModelRouting::route`] for the candidates among the model's current members,
//! and reports back through the [`Plan`] which candidate admitted it. Each
//! candidate is seen through its [`Facts`] for this request: the member's
//! state from the pool (excluded after a failure, requests in flight or
//! queued here, its slots) and what routing knows of it for this request
//! (the prompt tokens it holds, from the prefix index). [`RoutingTable::rank_at`]
//! orders the members (rendezvous or round-robin) and its [`Choice`] picks
//! among the usable ones by their facts alone. The first candidate is the
//! choice; the others are where `overflow: spill` goes when the choice has
//! neither a slot nor a queue place.
//!
//! The policies:
//! - a stored response continued, retrieved or cancelled: its owner alone
//!   (`owners.rs`), route `owner`, decided in [`ModelRouting::route`];
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
//! 2. what it reads of a request: a field of [`Routable`], set in
//!    [`ModelRouting::input`] (or passed there by the proxy, if it comes from a
//!    header);
//! 3. what it reads of a candidate for this request: a field of [`Facts`],
//!    filled in [`ModelRouting::route`] (as `cached_tokens` from the index) or,
//!    for a member's own state, in `pool::Members::route`;
//! 4. its rule: a [`Choice`] variant, made from the [`Policy`] in
//!    [`RoutingTable::new`] and decided in [`RoutingTable::rank_at`] over the facts
//!    of the members it reads, with its code in a file beside this one (as
//!    `cost.rs`); state it keeps across requests lives in [`ModelRouting`] (one
//!    per model; or shared by every model, as `owners.rs`, created in
//!    `Gateway::new`), read in [`ModelRouting::route`] and written in
//!    [`Plan::admitted`] or in a method the proxy calls with what it saw
//!    (as [`ModelRouting::owner_found`], [`ModelRouting::observed`]);
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
mod lru;
mod model;
pub mod owners;
pub mod prefix;
pub mod rendezvous;
mod round_robin;

use std::net::SocketAddr;

use smallvec::SmallVec;

use crate::api::Api;
use crate::body::Prompt;
use round_robin::RoundRobin;

pub use model::{ModelRouting, Observed, Plan, Routable, Unroutable};
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
    /// Not the order's first: the backend holding the most of its prompt,
    /// or that served its conversation's previous turn
    /// (`routing.prefix_index`).
    Cache,
}

// Each backend keeps its request counter per route by number
// (`metrics::BackendSeries`); a route past its count is looked up instead.
const _: () = assert!(Route::Cache as usize + 1 == crate::metrics::ROUTES);

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
    /// The members expected to hold some of its prompt (`index.rs`), by
    /// position in [`RoutingTable::addrs`]: the cost rule weighs them beside
    /// the first of the order.
    pub holders: &'a [usize],
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
            holders: &[],
            rates: cost::Snapshot::default(),
        }
    }
}

/// What routing knows of one member for one request: the member's state
/// (from the pool) and what it holds of this request's prompt (from the
/// prefix index). A policy reads a candidate through these alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct Facts {
    /// Left out after a failure: the request passes over it as a fallback.
    pub excluded: bool,
    /// It does not serve the name asked for (a learned model or adapter
    /// that only some of the pool lists): not a member for this request, so
    /// passing over it is no fallback.
    pub absent: bool,
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
    /// It served the conversation's previous turn (`index.rs`, tips): the
    /// cost rule's home for it, whatever the index has forgotten since.
    pub recent: bool,
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
    /// Route by cost over a prefix index (`cost.rs`, `index.rs`) of this
    /// size (in text blocks: the prompts' estimate); `None`: no index
    /// (rendezvous or round-robin alone).
    pub prefix_index: Option<IndexSize>,
    /// How requests without a key are routed.
    pub keyless: Keyless,
    /// How much of a completion's `prompt` a derived key covers.
    pub keyless_prefix_bytes: usize,
    /// The index kept exact by the backends' KV-cache events, the prompts
    /// tokenized as vLLM does (`crate::kv_events`, `crate::render`).
    pub exact: Option<Exact>,
}

/// A model's KV-cache events and its tokenizer.
#[derive(Debug, Clone, PartialEq)]
pub struct Exact {
    pub endpoints: crate::kv_events::Endpoints,
    pub renderer: std::sync::Arc<crate::render::Renderer>,
    /// The bounds of the index the events keep, in the backends' blocks
    /// (`Policy::prefix_index` bounds the estimate of the prompts not
    /// rendered, as without events).
    pub index: IndexSize,
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
    pub fn derived_key(&self, api: Api, prompt: &Prompt) -> Option<prefix::DerivedKey> {
        match self.keyless {
            Keyless::Derived(head) => prefix::derive(api, prompt, head, self.keyless_prefix_bytes),
            Keyless::RoundRobin => None,
        }
    }

    /// Whether the chain of a request's prompt is of its token ids (the
    /// model's events keep the index): its body is then rendered first.
    pub fn renders(&self) -> Option<&std::sync::Arc<crate::render::Renderer>> {
        self.prefix_index?;
        self.exact.as_ref().map(|e| &e.renderer)
    }

    /// The chain of a request's prompt, when an index is kept: of its
    /// token ids, `rendered`, when the model's events keep the index (if
    /// the prompt was not rendered: of its text), else of its text.
    pub fn chain(
        &self,
        api: Api,
        prompt: &Prompt,
        rendered: Option<Result<crate::render::Rendered, crate::render::Unrendered>>,
    ) -> Chain {
        if self.prefix_index.is_none() {
            return Chain::default();
        }
        let (Some(exact), Some(rendered)) = (&self.exact, rendered) else {
            return Chain::of_text(chain::of_prompt(api, prompt));
        };
        match rendered {
            Ok(r) => Chain {
                links: r.links,
                block_tokens: exact.endpoints.block_size as u64,
                rendered: Some(Ok(r.tokens)),
            },
            Err(why) => Chain {
                rendered: Some(Err(why)),
                ..Chain::of_text(chain::of_prompt(api, prompt))
            },
        }
    }

    /// The prompt tokens a block of this model's index stands for.
    pub fn block_tokens(&self) -> u64 {
        self.exact
            .as_ref()
            .map_or(chain::BLOCK_TOKENS, |e| e.endpoints.block_size as u64)
    }
}

/// A request's prompt as blocks of the prefix index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chain {
    pub links: Vec<u64>,
    /// The prompt tokens a link stands for.
    pub block_tokens: u64,
    /// With KV-cache events: the prompt's tokens, if it was rendered as
    /// tokens, else why not.
    pub rendered: Option<Result<u64, crate::render::Unrendered>>,
}

impl Chain {
    /// Of token ids matched against the backends' KV-cache events, not of
    /// the prompt's text.
    pub fn exact(&self) -> bool {
        matches!(self.rendered, Some(Ok(_)))
    }

    /// Of its leading links, how many a backend holding them can serve
    /// from its cache: vLLM computes a prompt's last token whatever it
    /// holds, so a prompt of exactly k blocks finds at most k - 1 cached.
    /// Every link of a text chain (its tokens are not known).
    pub fn servable(&self) -> usize {
        match self.rendered {
            Some(Ok(tokens)) => {
                let cached = tokens.saturating_sub(1) / self.block_tokens.max(1);
                (cached as usize).min(self.links.len())
            }
            _ => self.links.len(),
        }
    }

    fn of_text(links: Vec<u64>) -> Self {
        Chain {
            links,
            block_tokens: chain::BLOCK_TOKENS,
            rendered: None,
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

/// How many usable members of a request's order the cost rule weighs,
/// beside those holding some of its prompt. As with the power of d
/// choices, a few candidates balance load nearly as well as the whole
/// pool, and routing then costs a request about the same over 4 backends
/// as over 256.
pub const WEIGHED: usize = rendezvous::ORDERED;

/// The order a request tries a model's members in, made as it is read: a
/// request reads only the members it needs.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// Rendezvous: the key's best scores, then the rest by address.
    Scored(rendezvous::Best),
    /// Round-robin: the turn's member, then the others from it.
    Turn(round_robin::Turn),
}

impl Order {
    /// Every member, by position in [`RoutingTable::addrs`], in order.
    fn members(self) -> impl Iterator<Item = usize> {
        let (scored, turn) = match self {
            Order::Scored(best) => (Some(best.order()), None),
            Order::Turn(turn) => (None, Some(turn.order())),
        };
        scored
            .into_iter()
            .flatten()
            .chain(turn.into_iter().flatten())
    }

    /// Where member `m` comes in [`Order::members`].
    fn place(&self, m: usize) -> usize {
        match self {
            Order::Scored(best) => best.place(m),
            Order::Turn(turn) => turn.place(m),
        }
    }
}

/// One request's ranking: where it goes first, and the order the other
/// candidates follow in.
#[derive(Debug, Clone, Copy)]
pub struct Ranking {
    pub first: Candidate,
    /// The member `first` is, by position in [`RoutingTable::addrs`].
    chosen: usize,
    /// The others' order; `None`: there is no other (a stored response's
    /// owner).
    order: Option<Order>,
}

impl Ranking {
    /// Member `m` of the router, and no other.
    pub fn only(first: Candidate, m: usize) -> Self {
        Ranking {
            first,
            chosen: m,
            order: None,
        }
    }
}

/// One model's routing table, built once per backend set.
pub struct RoutingTable {
    choice: Choice,
    addrs: Vec<SocketAddr>,
    /// (address as hashed, weight), in `addrs` order.
    keyed: Vec<(String, u32)>,
    /// Every weight the same: rendezvous ranks by the hash alone.
    equal_weights: bool,
    round_robin: RoundRobin,
}

impl RoutingTable {
    /// A router over `members` (address, weight), kept in address order so
    /// that ties and fallbacks do not depend on how the set was listed.
    pub fn new(policy: &Policy, members: impl IntoIterator<Item = (SocketAddr, u32)>) -> Self {
        let mut members: Vec<(SocketAddr, u32)> = members.into_iter().collect();
        members.sort();
        let choice = match policy.prefix_index {
            Some(_) => Choice::Cost,
            None => Choice::First,
        };
        RoutingTable {
            choice,
            addrs: members.iter().map(|(a, _)| *a).collect(),
            keyed: members.iter().map(|(a, w)| (a.to_string(), *w)).collect(),
            equal_weights: members.windows(2).all(|w| w[0].1 == w[1].1),
            round_robin: RoundRobin::new(members.iter().map(|(_, w)| *w)),
        }
    }

    /// The members, in address order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The position of a member in [`RoutingTable::addrs`].
    pub fn position(&self, addr: &SocketAddr) -> Option<usize> {
        self.addrs.binary_search(addr).ok()
    }

    /// Every candidate of [`RoutingTable::rank_at`], best first, each member
    /// found in `facts` by its address.
    pub fn rank(
        &self,
        req: Request,
        facts: impl Fn(&SocketAddr) -> Facts,
    ) -> Option<Vec<Candidate>> {
        let at = |i: usize| facts(&self.addrs[i]);
        let ranking = self.rank_at(req, at)?;
        Some(self.candidates(&ranking, req.tried, at).collect())
    }

    /// A request's ranking, each member in the `facts` it has for this
    /// request (by its position in [`RoutingTable::addrs`], so that no member is
    /// looked up by address); `None` when no member is usable (all
    /// excluded or tried). Reads the first usable member of the order, or
    /// for the cost rule the first [`WEIGHED`] and the holders of the
    /// prompt: never the whole pool.
    pub fn rank_at(&self, req: Request, facts: impl Fn(usize) -> Facts) -> Option<Ranking> {
        let (order, preferred) = match req.affinity {
            Affinity::Key(key) => (self.scored(key), Route::Hash),
            Affinity::Derived(key) => (self.scored(key), Route::Prefix),
            Affinity::None => (
                Order::Turn(self.round_robin.turn(self.addrs.len())),
                Route::RoundRobin,
            ),
        };
        let weighed = match self.choice {
            Choice::First => 1,
            Choice::Cost => WEIGHED,
        };
        // (place in the order, member, facts) of the usable members weighed.
        let mut seen: SmallVec<[(usize, usize, Facts); WEIGHED + 4]> = SmallVec::new();
        // A member that serves the request was passed over before the first
        // usable one: excluded after a failure, or already tried.
        let mut passed_over = !req.tried.is_empty();
        for (place, m) in order.members().enumerate() {
            let f = facts(m);
            if self.usable(m, &f, req.tried) {
                seen.push((place, m, f));
                if seen.len() == weighed {
                    break;
                }
            } else if seen.is_empty() && !f.absent {
                passed_over = true;
            }
        }
        if seen.is_empty() {
            return None;
        }
        let first = match passed_over {
            false => preferred,
            true => Route::Fallback,
        };
        let (chosen, route) = match self.choice {
            Choice::First => (0, first),
            Choice::Cost => {
                // Holders past the last member read: the others were read.
                let last = seen[seen.len() - 1].0;
                for &m in req.holders {
                    let place = order.place(m);
                    if place <= last {
                        continue;
                    }
                    let f = facts(m);
                    if self.usable(m, &f, req.tried) {
                        seen.push((place, m, f));
                    }
                }
                seen.sort_unstable_by_key(|(place, ..)| *place);
                let (rates, prompt) = (req.rates, req.prompt_tokens);
                // Equally cheap busy backends: the round-robin turn's, as
                // a request without a key finds them (its order is the
                // turn), so that a key never crowds new conversations onto
                // its hash's choice; idle ones stay the order's first.
                let split = |tied: &[usize]| match &order {
                    Order::Turn(_) => tied[0],
                    _ => {
                        let turn = self.round_robin.turn(self.addrs.len());
                        let by_turn = tied.iter().min_by_key(|p| turn.place(seen[**p].1));
                        *by_turn.expect("ties are several")
                    }
                };
                match cost::choose(rates, prompt, &seen, |s| &s.2, req.movable, split)? {
                    cost::Pick::Home(0) => (0, first),
                    cost::Pick::Home(p) => (p, Route::Cache),
                    cost::Pick::Moved { to, .. } => (to, Route::Balance),
                }
            }
        };
        let chosen = seen[chosen].1;
        Some(Ranking {
            first: Candidate {
                addr: self.addrs[chosen],
                route,
            },
            chosen,
            order: Some(order),
        })
    }

    /// The candidates of `ranking`, best first: its first, then every
    /// other usable member in its order (route `spill`), read as they are
    /// reached.
    pub fn candidates<'s>(
        &'s self,
        ranking: &Ranking,
        tried: &'s [SocketAddr],
        facts: impl Fn(usize) -> Facts + 's,
    ) -> impl Iterator<Item = Candidate> + 's {
        let chosen = ranking.chosen;
        let rest = ranking
            .order
            .into_iter()
            .flat_map(Order::members)
            .filter(move |m| *m != chosen && self.usable(*m, &facts(*m), tried))
            .map(|m| Candidate {
                addr: self.addrs[m],
                route: Route::Spill,
            });
        std::iter::once(ranking.first).chain(rest)
    }

    fn scored(&self, key: &[u8]) -> Order {
        Order::Scored(rendezvous::best(key, &self.keyed, self.equal_weights))
    }

    /// Whether member `m`, in `facts`, may take a request that failed on
    /// `tried`.
    fn usable(&self, m: usize, facts: &Facts, tried: &[SocketAddr]) -> bool {
        !facts.excluded && !facts.absent && !tried.contains(&self.addrs[m])
    }
}

#[cfg(test)]
mod tests;
