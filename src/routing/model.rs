//! One model's routing, the entry point the proxy calls: [`ModelRouting`] holds
//! the model's [`Policy`] and the state routing keeps (the prefix index and
//! the cost rule's rates; the owners of stored responses, `owners.rs`, shared
//! by every model); [`Routable`] is what routing reads of one request, kept for its
//! whole life; [`ModelRouting::route`] ranks the candidates and hands back a
//! [`Plan`], which the proxy tells which candidate admitted the request, or
//! says why there is none ([`Unroutable`]). The proxy decides nothing about
//! routing: it reports what it saw (an admission, a failure, a response
//! stored, the owner the backends named).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;
use smallvec::SmallVec;

use super::cost::{Rates, MIN_SHARE};
use super::index::{Held, Holders, PrefixIndex};
use super::owners::{Owner, Owners};
use super::prefix::DerivedKey;
use super::{Affinity, Candidate, Chain, Facts, Policy, Ranking, Request, Route, RoutingTable};
use crate::api::Api;
use crate::body::Prompt;

/// How long a prompt routed to a backend of a model with KV-cache events
/// counts as held there before its events confirm it: the backend's queue
/// and the prefill, with room to spare.
pub const UNCONFIRMED: Duration = Duration::from_secs(10);

/// One model's routing policy and the state it keeps across requests and
/// backend sets.
pub struct ModelRouting {
    model: Arc<str>,
    policy: Policy,
    /// What each backend is expected to hold (`routing.prefix_index`): by
    /// the backends' KV-cache events when the model has them.
    index: Option<Arc<PrefixIndex>>,
    /// With KV-cache events, the estimate of the prompts that could not be
    /// rendered, by their text, as without events: bounded by
    /// `cache_tokens` a backend, and apart from what the events say (a
    /// reset they publish late must not wipe a prompt routed after it).
    estimate: Option<PrefixIndex>,
    /// The rates the cost rule weighs by, learnt from responses.
    rates: Rates,
    owners: Arc<Owners>,
}

/// Why a request has no candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unroutable {
    /// Every backend is excluded or already failed this request.
    NoBackend,
    /// The stored response it continues or names has no known owner here:
    /// ask the backends, then [`ModelRouting::owner_found`].
    OwnerUnknown(String),
    /// The owner is known but excluded, already failed this request, or no
    /// longer a backend of the model. Never sent elsewhere: no other
    /// backend has the response.
    OwnerUnavailable { id: String, owner: SocketAddr },
}

/// What routing reads of one request: its affinity, whether it is a
/// warmup, its prompt's chain and the backends it failed on.
pub struct Routable {
    /// `X-Poimen-Cache-Key`.
    cache_key: Option<HeaderValue>,
    /// No header: the key derived from the body (`routing.keyless`).
    derived_key: Option<DerivedKey>,
    warmup: bool,
    api: Api,
    tried: Vec<SocketAddr>,
    /// The stored response this request continues (`previous_response_id`)
    /// or names (a retrieve or cancel): only its owner can serve it.
    stored: Option<String>,
    /// Its prompt's chain (`chain.rs`), when an index is kept.
    chain: Chain,
    /// The only backends that serve the name it asked for (a learned model
    /// or adapter), sorted; None: every backend of the pool.
    only: Option<Arc<[SocketAddr]>>,
}

impl Routable {
    /// The request's affinity: its header key, else its derived key.
    pub fn affinity(&self) -> Affinity<'_> {
        match (&self.cache_key, &self.derived_key) {
            (Some(k), _) => Affinity::Key(k.as_bytes()),
            (None, Some(d)) => Affinity::Derived(d.as_bytes()),
            (None, None) => Affinity::None,
        }
    }

    pub fn cache_key(&self) -> Option<&HeaderValue> {
        self.cache_key.as_ref()
    }

    pub fn derived_key(&self) -> Option<&DerivedKey> {
        self.derived_key.as_ref()
    }

    pub fn warmup(&self) -> bool {
        self.warmup
    }

    /// Its prompt's chain of blocks; empty without an index.
    pub fn chain(&self) -> &Chain {
        &self.chain
    }

    /// Its prompt's chain of blocks (`Policy::chain`).
    pub fn with_chain(mut self, chain: Chain) -> Self {
        self.chain = chain;
        self
    }

    /// Only `backends` (sorted) serve it.
    pub fn with_only(mut self, backends: Arc<[SocketAddr]>) -> Self {
        self.only = Some(backends);
        self
    }

    /// Whether `addr` serves it.
    pub fn served_by(&self, addr: &SocketAddr) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.binary_search(addr).is_ok())
    }

    /// It continues or names stored response `id`.
    pub fn with_stored(mut self, id: Option<String>) -> Self {
        self.stored = id;
        self
    }

    pub fn api(&self) -> Api {
        self.api
    }

    pub fn stored(&self) -> Option<&str> {
        self.stored.as_deref()
    }

    /// The request failed on `addr`: it is not routed there again.
    pub fn failed_on(&mut self, addr: SocketAddr) {
        self.tried.push(addr);
    }
}

/// One routing decision: the candidates, best first, and the handle that
/// records which one admitted the request. `S` is each member's state now
/// (by position), read again for the later candidates when they are reached.
pub struct Plan<'a, S> {
    ranking: Ranking,
    router: &'a RoutingTable,
    status: S,
    /// What the index expects each backend to hold of the prompt.
    held: Holders,
    /// The prompt tokens a block of it stands for.
    block_tokens: u64,
    index: Option<&'a PrefixIndex>,
    input: &'a Routable,
}

impl<S: Fn(usize) -> Facts> Plan<'_, S> {
    /// Where the request goes first.
    pub fn first(&self) -> Candidate {
        self.ranking.first
    }

    /// The candidates, best first: [`Plan::first`], then the other usable
    /// members in order (where `overflow: spill` goes).
    pub fn candidates(&self) -> impl Iterator<Item = Candidate> + '_ {
        self.router
            .candidates(&self.ranking, &self.input.tried, &self.status)
    }

    /// The prompt tokens `addr` is expected to hold; `None` without an
    /// index.
    pub fn expected_tokens(&self, addr: SocketAddr) -> Option<u64> {
        self.index?;
        Some(cached_tokens(&self.held, addr, self.block_tokens))
    }

    /// `candidate` gave the request a slot or a queue place: it will
    /// prefill the prompt, so the index takes it to hold it from now on;
    /// a prompt in tokens, until the backend's events say it stored it
    /// (or for [`UNCONFIRMED`] if they never do: the request failed first,
    /// or its blocks went before anyone asked).
    pub fn admitted(self, candidate: Candidate) {
        let Some(index) = self.index else {
            return;
        };
        let chain = &self.input.chain;
        if chain.exact() {
            index.routed_unconfirmed(candidate.addr, &chain.links, UNCONFIRMED);
        } else {
            index.routed(candidate.addr, &chain.links);
        }
    }
}

impl ModelRouting {
    /// The routing of `model`, sharing the gateway's stored-response
    /// `owners`.
    pub fn new(model: Arc<str>, policy: Policy, owners: Arc<Owners>) -> Self {
        ModelRouting {
            model,
            index: (policy.exact.as_ref().map(|e| e.index))
                .or(policy.prefix_index)
                .map(|size| Arc::new(PrefixIndex::new(size.backend_blocks, size.max_blocks))),
            estimate: (policy.prefix_index)
                .filter(|_| policy.exact.is_some())
                .map(|size| PrefixIndex::new(size.backend_blocks, size.max_blocks)),
            rates: Rates::default(),
            owners,
            policy,
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether routing weighs load against slots (the cost rule): then it
    /// needs each backend's slot limit.
    pub fn weighs_slots(&self) -> bool {
        self.index.is_some()
    }

    /// The prefix index, when kept (for the metric).
    pub fn index(&self) -> Option<&Arc<PrefixIndex>> {
        self.index.as_ref()
    }

    /// A response came: it held its slot for `held`, its first token came
    /// `ttft` after, and vLLM reports `cached` of its `prompt` tokens
    /// cached. Teaches the cost rule its rates. The index is not corrected
    /// by it, even when it reports far fewer cached tokens than expected:
    /// the backend has just prefilled the whole prompt, so it holds it now.
    pub fn observed(&self, input: &Routable, seen: Observed) {
        if self.index.is_none() {
            return;
        }
        let (Some(prompt), Some(cached)) = (seen.prompt_tokens, seen.cached_tokens) else {
            return;
        };
        self.rates
            .observe(seen.held, seen.ttft, prompt.saturating_sub(cached));
        if !input.chain.exact() {
            self.rates
                .observe_text(prompt, input.chain.links.len() as u64);
        }
    }

    /// `addr` failed or left: whatever it held is unknown from now on.
    pub fn forget(&self, addr: &SocketAddr) {
        for index in self.index.as_deref().into_iter().chain(&self.estimate) {
            index.forget(addr);
        }
    }

    /// The prompt tokens `bytes` of a prompt's text make, as the model's
    /// responses have shown (four bytes a token until they have).
    pub fn text_tokens(&self, bytes: u64) -> u64 {
        bytes * self.rates.text_block_tokens() / super::chain::BLOCK_BYTES as u64
    }

    /// The index a request's chain is matched against: the events' for a
    /// prompt in tokens, else the estimate's (if the model has events).
    fn index_for(&self, chain: &Chain) -> Option<&PrefixIndex> {
        match (&self.estimate, chain.exact()) {
            (Some(estimate), false) => Some(estimate),
            _ => self.index.as_deref(),
        }
    }

    /// What routing reads of a request of `api` with this `prompt` (its
    /// body's fields): the header key, else a key derived from the prompt
    /// when the policy says so.
    pub fn input(
        &self,
        cache_key: Option<HeaderValue>,
        warmup: bool,
        api: Api,
        prompt: &Prompt,
    ) -> Routable {
        let derived_key = match cache_key {
            Some(_) => None,
            None => self.policy.derived_key(api, prompt),
        };
        Routable {
            cache_key,
            derived_key,
            warmup,
            api,
            tried: Vec::new(),
            stored: None,
            chain: Chain::default(),
            only: None,
        }
    }

    /// The candidates for `input` among `router`'s members, each in the
    /// `status` it has now (by its position in [`RoutingTable::addrs`]).
    pub fn route<'a, S: Fn(usize) -> Facts>(
        &'a self,
        router: &'a RoutingTable,
        input: &'a Routable,
        status: S,
        now: Instant,
    ) -> Result<Plan<'a, S>, Unroutable> {
        if let Some(id) = &input.stored {
            let (owner, position) = self.owner(router, id, now)?;
            let at = status(position);
            if at.excluded || at.absent || input.tried.contains(&owner) {
                let id = id.clone();
                return Err(Unroutable::OwnerUnavailable { id, owner });
            }
            let only = Candidate {
                addr: owner,
                route: Route::Owner,
            };
            let ranking = Ranking::only(only, position);
            return Ok(Plan {
                ranking,
                router,
                status,
                held: Holders::new(),
                block_tokens: 0,
                index: self.index_for(&input.chain),
                input,
            });
        }
        let block_tokens = match input.chain.exact() {
            true => input.chain.block_tokens,
            false => self.rates.text_block_tokens(),
        };
        let index = self.index_for(&input.chain);
        let mut held = match index {
            Some(index) if !input.chain.links.is_empty() => index.lookup(&input.chain.links),
            _ => Holders::new(),
        };
        // A previous turn is most of the next one's prompt; a shorter
        // prompt it continues (one every conversation shares, a fixed system
        // prompt alone) is no previous turn, as it is no home.
        let links = input.chain.links.len() as f64;
        for h in &mut held {
            h.recent = h.recent.filter(|d| *d as f64 >= MIN_SHARE * links);
        }
        // Without events the index's evictions are a guess: the backend that
        // served the previous turn is taken to hold that turn's prompt.
        // With them, a prompt's last block counts only if it is not its
        // last token's.
        match input.chain.exact() {
            false => held
                .iter_mut()
                .for_each(|h| h.blocks = h.blocks.max(h.recent.unwrap_or(0))),
            true => {
                let servable = input.chain.servable();
                held.iter_mut()
                    .for_each(|h| h.blocks = h.blocks.min(servable));
            }
        }
        // Each holder's position and tokens, so that a member's facts need
        // no address compared.
        let (holders, tokens): (SmallVec<[usize; 4]>, SmallVec<[u64; 4]>) = held
            .iter()
            .filter_map(|h| Some((router.position(&h.addr)?, h.blocks as u64 * block_tokens)))
            .unzip();
        let recent =
            (held.iter().find(|h| h.recent.is_some())).and_then(|h| router.position(&h.addr));
        let request = Request {
            affinity: input.affinity(),
            tried: &input.tried,
            // A warmup exists to fill its key's first choice's cache: load
            // never moves it.
            movable: !input.warmup,
            prompt_tokens: input.chain.links.len() as u64 * block_tokens,
            holders: &holders,
            rates: self.rates.snapshot(),
        };
        let facts = |i: usize| Facts {
            cached_tokens: holders
                .iter()
                .position(|h| *h == i)
                .map_or(0, |k| tokens[k]),
            recent: recent == Some(i),
            ..status(i)
        };
        let ranking = router
            .rank_at(request, facts)
            .ok_or(Unroutable::NoBackend)?;
        Ok(Plan {
            ranking,
            router,
            status,
            held,
            block_tokens,
            index,
            input,
        })
    }

    /// The backend of `router` that stored response `id`, and its position.
    fn owner(
        &self,
        router: &RoutingTable,
        id: &str,
        now: Instant,
    ) -> Result<(SocketAddr, usize), Unroutable> {
        let owner = self
            .owners
            .get(id, now)
            .ok_or_else(|| Unroutable::OwnerUnknown(id.to_string()))?;
        match router.position(&owner.addr) {
            Some(position) => Ok((owner.addr, position)),
            None => Err(Unroutable::OwnerUnavailable {
                id: id.to_string(),
                owner: owner.addr,
            }),
        }
    }

    /// Backend `addr` stored response `id` (it answered it, or said it has
    /// it when asked).
    pub fn owner_found(&self, id: &str, addr: SocketAddr, now: Instant) {
        let owner = Owner {
            model: self.model.clone(),
            addr,
        };
        self.owners.record(id, &owner, now);
    }
}

/// What a response showed of its request (`ModelRouting::observed`).
#[derive(Debug, Clone, Copy)]
pub struct Observed {
    /// Time it held its slot.
    pub held: std::time::Duration,
    /// Time from its slot to its first token.
    pub ttft: Option<std::time::Duration>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

/// The tokens `addr` holds by `held`.
fn cached_tokens(held: &[Held], addr: SocketAddr, block_tokens: u64) -> u64 {
    held.iter()
        .find(|h| h.addr == addr)
        .map_or(0, |h| h.blocks as u64 * block_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> Vec<SocketAddr> {
        (0..3)
            .map(|i| SocketAddr::from(([127, 0, 0, 1], 9000 + i)))
            .collect()
    }

    fn indexed() -> (ModelRouting, RoutingTable) {
        indexed_with(1000)
    }

    /// Routing over an index taking each backend to hold `blocks`.
    fn indexed_with(blocks: usize) -> (ModelRouting, RoutingTable) {
        let policy = Policy {
            prefix_index: Some(super::super::IndexSize {
                backend_blocks: blocks,
                max_blocks: 10_000,
            }),
            ..Policy::default()
        };
        let router = RoutingTable::new(&policy, addrs().into_iter().map(|a| (a, 1)));
        let owners = Arc::new(Owners::new(16, std::time::Duration::from_secs(60)));
        (ModelRouting::new("m".into(), policy, owners), router)
    }

    /// A turn of a long conversation (about 160 blocks, 10,000 tokens: a
    /// second of cold prefill at the default rate).
    fn long_turn(routing: &ModelRouting, first: &str, turns: usize, key: &'static str) -> Routable {
        let mut messages =
            vec![serde_json::json!({"role": "user", "content": first.repeat(40_000)})];
        for i in 1..turns {
            messages.push(serde_json::json!({"role": "assistant", "content": i.to_string()}));
            messages.push(serde_json::json!({"role": "user", "content": "more"}));
        }
        let body = serde_json::json!({"model": "m", "messages": messages}).to_string();
        let key = (!key.is_empty()).then(|| HeaderValue::from_static(key));
        let api = Api::ChatCompletions;
        let rendered = routing
            .policy
            .renders()
            .map(|r| r.chain(api, body.as_bytes(), routing.policy.block_tokens() as usize));
        let chain = (routing.policy).chain(api, &crate::body::prompt_of(body.as_bytes()), rendered);
        routing
            .input(key, false, api, &crate::body::prompt_of(body.as_bytes()))
            .with_chain(chain)
    }

    /// Route `input` with backend `busy` holding `load` (4 slots each);
    /// admitted at its first candidate, which is returned.
    fn admit_loaded(
        routing: &ModelRouting,
        router: &RoutingTable,
        input: &Routable,
        busy: Option<(SocketAddr, usize)>,
    ) -> (Candidate, Option<u64>) {
        let status = |i: usize| Facts {
            load: busy
                .filter(|(b, _)| *b == router.addrs()[i])
                .map_or(0, |(_, l)| l),
            slots: 4,
            ..Facts::default()
        };
        let plan = routing
            .route(router, input, status, Instant::now())
            .unwrap();
        let chosen = plan.first();
        let expected = plan.expected_tokens(chosen.addr);
        plan.admitted(chosen);
        (chosen, expected)
    }

    /// Admit `input` at `addr`, whatever routing would choose.
    fn admit_at(routing: &ModelRouting, router: &RoutingTable, input: &Routable, addr: SocketAddr) {
        let plan = routing
            .route(router, input, |_| Facts::default(), Instant::now())
            .unwrap();
        plan.admitted(Candidate {
            addr,
            route: Route::Cache,
        });
    }

    /// A chat of `messages` (role, content).
    fn chat(routing: &ModelRouting, messages: &[(&str, String)]) -> Routable {
        let messages: Vec<_> = (messages.iter())
            .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
            .collect();
        let body = serde_json::json!({"model": "m", "messages": messages}).to_string();
        let prompt = crate::body::prompt_of(body.as_bytes());
        let api = Api::ChatCompletions;
        let rendered = routing
            .policy
            .renders()
            .map(|r| r.chain(api, body.as_bytes(), routing.policy.block_tokens() as usize));
        let chain = (routing.policy).chain(api, &prompt, rendered);
        let input = routing.input(None, false, Api::ChatCompletions, &prompt);
        input.with_chain(chain)
    }

    #[test]
    fn a_rendered_prompt_of_whole_blocks_is_expected_cached_but_its_last_block() {
        let (routing, router) = indexed();
        let x = addrs()[0];
        // The prompt's token ids in 3 blocks of 16; 48 or 49 tokens.
        let rendered = |tokens: u64| {
            let chain = Chain {
                links: vec![7, 8, 9],
                block_tokens: 16,
                rendered: Some(Ok(tokens)),
            };
            let prompt = crate::body::prompt_of(br#"{"model":"m","prompt":"p"}"#);
            (routing.input(None, false, Api::Completions, &prompt)).with_chain(chain)
        };
        admit_at(&routing, &router, &rendered(48), x);
        let expected = |input: &Routable| {
            let plan =
                (routing.route(&router, input, |_| Facts::default(), Instant::now())).unwrap();
            plan.expected_tokens(x)
        };
        // vLLM computes the last token: the third block is computed again.
        assert_eq!(expected(&rendered(48)), Some(32));
        assert_eq!(expected(&rendered(49)), Some(48));
        assert_eq!(rendered(48).chain().servable(), 2);
        assert_eq!(rendered(1).chain().servable(), 0);
    }

    #[test]
    fn under_pressure_a_conversation_follows_its_previous_turn_not_a_shared_prompt() {
        // Room for about one long conversation a backend.
        let (routing, router) = indexed_with(200);
        let [x, y, _] = addrs()[..] else {
            unreachable!()
        };
        admit_at(&routing, &router, &long_turn(&routing, "a", 1, ""), x);
        // Two other conversations there since: the index forgot "a".
        for other in ["b", "c"] {
            admit_at(&routing, &router, &long_turn(&routing, other, 1, ""), x);
        }
        // Its next turn stays, busy as x is (2 running, the others idle),
        // counted as holding its previous turn.
        let (next, expected) = admit_loaded(
            &routing,
            &router,
            &long_turn(&routing, "a", 2, ""),
            Some((x, 2)),
        );
        assert_eq!(next.addr, x);
        assert!(expected > Some(9000), "{expected:?}");

        // A system prompt every conversation shares, sent alone to y: a new
        // conversation on it has no previous turn there.
        let system = ("system", "s".repeat(8000));
        admit_at(
            &routing,
            &router,
            &chat(&routing, std::slice::from_ref(&system)),
            y,
        );
        let first = chat(&routing, &[system, ("user", "u".repeat(20_000))]);
        let plan = (routing.route(&router, &first, |_| Facts::default(), Instant::now())).unwrap();
        assert_eq!(plan.held.iter().find(|h| h.recent.is_some()), None);
    }

    #[test]
    fn a_prompts_text_counts_the_tokens_its_responses_reported() {
        let (routing, _) = indexed();
        let input = long_turn(&routing, "t", 1, "");
        let blocks = input.chain.links.len() as u64;
        assert_eq!(routing.text_tokens(256 * blocks), 64 * blocks);
        // JSON that makes 40 tokens a 256-byte block, not 64.
        for _ in 0..300 {
            routing.observed(
                &input,
                Observed {
                    held: std::time::Duration::from_millis(100),
                    ttft: None,
                    prompt_tokens: Some(40 * blocks),
                    cached_tokens: Some(0),
                },
            );
        }
        assert_eq!(routing.text_tokens(256 * blocks), 40 * blocks);
    }

    #[test]
    fn with_an_index_a_conversation_stays_where_its_prompt_is() {
        let (routing, router) = indexed();
        // Keyless, round-robin: the first turn takes the turn.
        let (first, expected) =
            admit_loaded(&routing, &router, &long_turn(&routing, "a", 1, ""), None);
        assert_eq!((first.route, expected), (Route::RoundRobin, Some(0)));
        // Its next turns find it, however the turns go on.
        for turns in 2..5 {
            let (next, expected) = admit_loaded(
                &routing,
                &router,
                &long_turn(&routing, "a", turns, ""),
                None,
            );
            assert_eq!(next.addr, first.addr, "turn {turns}");
            assert!(expected.unwrap() >= 2000, "{expected:?}");
        }
        // Full, one ahead (half a second), it still waits there.
        let input = long_turn(&routing, "a", 5, "");
        let (next, _) = admit_loaded(&routing, &router, &input, Some((first.addr, 4)));
        assert_eq!(next.addr, first.addr);
        // A long queue costs more than a cold prefill: it moves, and the
        // next turn has two homes, the idle one chosen.
        let (moved, expected) = admit_loaded(&routing, &router, &input, Some((first.addr, 400)));
        assert_eq!((moved.route, expected), (Route::Balance, Some(0)));
        let (next, _) = admit_loaded(
            &routing,
            &router,
            &long_turn(&routing, "a", 5, ""),
            Some((first.addr, 4)),
        );
        assert_eq!(next.addr, moved.addr);
        // A backend that failed is forgotten.
        routing.forget(&moved.addr);
        routing.forget(&first.addr);
        let (_, expected) = admit_loaded(&routing, &router, &long_turn(&routing, "a", 5, ""), None);
        assert_eq!(expected, Some(0));
    }

    #[test]
    fn with_an_index_a_key_still_picks_a_new_conversations_backend() {
        let (routing, router) = indexed();
        let (keyed, _) = admit_loaded(&routing, &router, &long_turn(&routing, "b", 1, "k"), None);
        assert_eq!(keyed.route, Route::Hash);
        // Another conversation of the key: its first choice too, and a
        // conversation moved off it stays where it went ("cache").
        let (other, _) = admit_loaded(
            &routing,
            &router,
            &long_turn(&routing, "c", 1, "k"),
            Some((keyed.addr, 400)),
        );
        assert_eq!(other.route, Route::Balance);
        let (back, _) = admit_loaded(&routing, &router, &long_turn(&routing, "c", 2, "k"), None);
        assert_eq!((back.addr, back.route), (other.addr, Route::Cache));
    }

    #[test]
    fn a_response_that_held_far_less_than_expected_does_not_forget_its_prompt() {
        let (routing, router) = indexed();
        let input = long_turn(&routing, "d", 1, "");
        let (first, _) = admit_loaded(&routing, &router, &input, None);
        let (_, expected) = admit_loaded(&routing, &router, &input, None);
        let expected = expected.unwrap();
        assert!(expected > 1000);
        // Far short (a restart nothing failed): the backend prefilled the
        // whole prompt for it, so it holds it now.
        routing.observed(
            &input,
            Observed {
                held: std::time::Duration::from_millis(100),
                ttft: None,
                prompt_tokens: Some(expected + 10),
                cached_tokens: Some(128),
            },
        );
        let plan = routing
            .route(&router, &input, |_| Facts::default(), Instant::now())
            .unwrap();
        assert_eq!(plan.expected_tokens(first.addr), Some(expected));
    }

    #[test]
    fn a_stored_response_is_served_by_its_owner_alone() {
        let (routing, router) = indexed();
        let t = Instant::now();
        let stored = |id: &str| {
            routing
                .input(None, false, Api::Responses, &Prompt::default())
                .with_stored(Some(id.into()))
        };
        let idle = |_: usize| Facts::default();
        let input = stored("resp_1");
        let unknown = routing.route(&router, &input, idle, t).err();
        assert_eq!(unknown, Some(Unroutable::OwnerUnknown("resp_1".into())));
        let owner = addrs()[2];
        routing.owner_found("resp_1", owner, t);
        let plan = routing.route(&router, &input, idle, t).ok().unwrap();
        let only = [Candidate {
            addr: owner,
            route: Route::Owner,
        }];
        assert_eq!(plan.candidates().collect::<Vec<_>>(), only);
        // Excluded, or failed this request: never another backend.
        let excluded = |i: usize| Facts {
            excluded: router.addrs()[i] == owner,
            ..Facts::default()
        };
        let unavailable = Some(Unroutable::OwnerUnavailable {
            id: "resp_1".into(),
            owner,
        });
        assert_eq!(
            routing.route(&router, &input, excluded, t).err(),
            unavailable
        );
        let mut tried = stored("resp_1");
        tried.failed_on(owner);
        assert_eq!(routing.route(&router, &tried, idle, t).err(), unavailable);
        // An owner that is not a backend of this model any more.
        let gone = SocketAddr::from(([127, 0, 0, 2], 9000));
        routing.owner_found("resp_2", gone, t);
        let input = stored("resp_2");
        let left = Some(Unroutable::OwnerUnavailable {
            id: "resp_2".into(),
            owner: gone,
        });
        assert_eq!(routing.route(&router, &input, idle, t).err(), left);
    }
}
