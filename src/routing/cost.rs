//! Choosing by cost (`routing.prefix_index`): each candidate backend is
//! scored by the time this request would cost there, and the cheapest wins,
//! but a request leaves the backend that holds most of its prompt only when
//! moving is clearly cheaper.
//!
//! ```text
//! b          = a weighed backend: one of the first WEIGHED (8) usable ones of
//!              the order, or a usable one holding some of the prompt
//! cost(b) = prefill(b) * (1 + running(b)) + wait(b) + load(b) * CONTENTION * service
//! prefill(b) = (prompt tokens - tokens b holds) * seconds per uncached token
//! running(b) = requests holding a slot there: min(load(b), slots(b))
//! wait(b)    = ahead(b) * service / slots(b)
//! ahead(b)   = requests before this one when b has no free slot: load(b) + 1 - slots(b), else 0
//! service    = seconds a request holds a slot
//! held(b)    = tokens b holds, if at least MIN_SHARE of the prompt; else 0
//! home       = the usable backend that served the conversation's previous
//!              turn (`index.rs`, its tip; a prompt of at least MIN_SHARE
//!              of this one), if any; else
//!              the usable backend of the largest held(b) (ties: the order's first)
//! no home (no previous turn, held(home) = 0: a new conversation):
//!              the cheapest backend (ties: the order's first if idle, else
//!              the round-robin turn's)
//! otherwise  = the cheapest backend b, if cost(b) < (1 - MOVE_MARGIN) * cost(home)
//!              and the request may move (not a warmup); else home
//! ```
//!
//! Partial holdings count for what they save, in `prefill(b)`. A
//! conversation's previous backend is its home even when the index has
//! forgotten most of it: under cache pressure (the conversations' contexts
//! together larger than the KV caches) the index's estimate of a backend's
//! cache has evicted most of a conversation between two of its turns,
//! while the backend that just prefilled the last turn still holds its
//! newest blocks; sent elsewhere, the turn would prefill cold there too and
//! take a second copy of the conversation's cache from others. It leaves
//! only when waiting there costs clearly more than a cold prefill.
//!
//! A prompt every conversation shares (a fixed system prompt) is under
//! [`MIN_SHARE`] of a conversation's prompt: it makes no backend a home, or
//! every new conversation would crowd onto the first that served it.
//!
//! A prefill stalls the batch it joins: every request running there waits
//! for it too, so a cold prefill costs most where most run. Each running
//! request also slows every decode step a little ([`CONTENTION`]). So a new
//! conversation (nothing of it cached anywhere, or only a prompt every
//! backend shares) goes where the fewest run; with none running anywhere,
//! every cost is the same and the order's first (the key's rendezvous
//! choice, or the round-robin turn) wins: replicas that share no state
//! agree on a new conversation on idle backends. Of equally cheap busy
//! backends the round-robin turn's wins, with a key as without: the turn
//! spreads new conversations evenly, where keys' hashes put several on one
//! backend by chance, whose cache must then hold more of them.
//! The two rates are learnt from the model's own responses ([`Rates`]): a
//! request's slot time, and its time to first token over its uncached
//! prompt tokens, as reported by vLLM.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use smallvec::SmallVec;

use super::Facts;

/// How much cheaper than staying a move must be: a little noise in the
/// estimates never scatters a conversation.
pub const MOVE_MARGIN: f64 = 0.2;

/// The share of a prompt a backend must hold to be its home.
pub const MIN_SHARE: f64 = 0.5;

/// The share of a request's service time one more running request adds
/// to it (each decode step serves one more sequence).
pub const CONTENTION: f64 = 0.05;

/// Seconds a request holds a slot, until measured.
const DEFAULT_SERVICE_SECS: f64 = 2.0;

/// Seconds of prefill per uncached prompt token, until measured (a GPU
/// prefilling 10,000 tokens a second).
const DEFAULT_PREFILL_SECS: f64 = 1e-4;

/// The weight of a new observation in the moving averages.
const ALPHA: f64 = 0.05;

/// A time to first token tells the prefill rate only when the prefill is
/// most of it.
const MIN_UNCACHED_TOKENS: u64 = 256;

/// A prompt's text tells its tokens per block only when it has a few.
const MIN_TEXT_BLOCKS: u64 = 8;

/// One model's measured rates, moving averages of its responses.
pub struct Rates {
    service: AtomicU64,
    prefill: AtomicU64,
    /// The prompt tokens a block of a prompt's text stands for (its JSON
    /// as sent: four bytes a token until measured).
    text_block_tokens: AtomicU64,
}

impl Default for Rates {
    fn default() -> Self {
        Rates {
            service: AtomicU64::new(DEFAULT_SERVICE_SECS.to_bits()),
            prefill: AtomicU64::new(DEFAULT_PREFILL_SECS.to_bits()),
            text_block_tokens: AtomicU64::new((super::chain::BLOCK_TOKENS as f64).to_bits()),
        }
    }
}

/// The rates one choice is made with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    /// Seconds a request holds a slot.
    pub service: f64,
    /// Seconds of prefill per uncached prompt token.
    pub prefill: f64,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            service: DEFAULT_SERVICE_SECS,
            prefill: DEFAULT_PREFILL_SECS,
        }
    }
}

impl Rates {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            service: f64::from_bits(self.service.load(Ordering::Relaxed)),
            prefill: f64::from_bits(self.prefill.load(Ordering::Relaxed)),
        }
    }

    /// A request held its slot for `held`; its first token came `ttft`
    /// after it had its slot, with `uncached` prompt tokens to prefill.
    pub fn observe(&self, held: Duration, ttft: Option<Duration>, uncached: u64) {
        update(&self.service, held.as_secs_f64());
        if let Some(ttft) = ttft.filter(|_| uncached >= MIN_UNCACHED_TOKENS) {
            update(&self.prefill, ttft.as_secs_f64() / uncached as f64);
        }
    }

    /// A prompt whose text made `blocks` blocks of the chain was `tokens`
    /// prompt tokens (as vLLM counted them, its template's included).
    pub fn observe_text(&self, tokens: u64, blocks: u64) {
        if blocks >= MIN_TEXT_BLOCKS {
            update(&self.text_block_tokens, tokens as f64 / blocks as f64);
        }
    }

    /// The prompt tokens a block of a prompt's text stands for, so that a
    /// text chain never expects more tokens cached than the prompt has.
    pub fn text_block_tokens(&self) -> u64 {
        let tokens = f64::from_bits(self.text_block_tokens.load(Ordering::Relaxed));
        (tokens.round() as u64).max(1)
    }
}

/// Move `avg` a step toward `sample`. Racing updates may lose a sample: an
/// average does not need every one.
fn update(avg: &AtomicU64, sample: f64) {
    if !sample.is_finite() || sample <= 0.0 {
        return;
    }
    let old = f64::from_bits(avg.load(Ordering::Relaxed));
    avg.store((old + ALPHA * (sample - old)).to_bits(), Ordering::Relaxed);
}

/// The cost of a request of `prompt` tokens on a backend in `facts`.
pub fn cost(rates: Snapshot, prompt: u64, facts: &Facts) -> f64 {
    let uncached = prompt.saturating_sub(facts.cached_tokens);
    let slots = facts.slots.max(1);
    let running = facts.load.min(slots) as f64;
    let ahead = (facts.load + 1).saturating_sub(slots);
    let prefill = uncached as f64 * rates.prefill * (1.0 + running);
    let contention = facts.load as f64 * CONTENTION * rates.service;
    prefill + ahead as f64 * rates.service / slots as f64 + contention
}

/// Why the cost rule chose what it chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The backend holding the most of the prompt (`home`).
    Home(usize),
    /// Another one, waiting at home costing more than prefilling there.
    Moved { to: usize, from: usize },
}

/// Of the `weighed` backends (usable, in the order's order, each seen
/// through its `facts`), the one to choose; `movable`: whether load may
/// move the request (a warmup only fills its home); `split`: of the
/// positions of several equally cheap busy backends, the one to take.
/// None when there is none.
pub fn choose<T>(
    rates: Snapshot,
    prompt: u64,
    weighed: &[T],
    facts: impl Fn(&T) -> &Facts,
    movable: bool,
    split: impl FnOnce(&[usize]) -> usize,
) -> Option<Pick> {
    let positions = || 0..weighed.len();
    let facts = |p: usize| facts(&weighed[p]);
    let held = |p: &usize| {
        let tokens = facts(*p).cached_tokens;
        match tokens as f64 >= MIN_SHARE * prompt as f64 && tokens > 0 {
            true => tokens,
            false => 0,
        }
    };
    // The previous turn's backend, else the first of the most held
    // (`max_by_key` keeps the last of equals).
    let recent = positions().find(|p| facts(*p).recent);
    let home = recent.or_else(|| positions().rev().max_by_key(held))?;
    let costs: SmallVec<[f64; 8]> = positions().map(|p| cost(rates, prompt, facts(p))).collect();
    // The first of the cheapest; of several busy ones, the split's.
    let mut cheapest = positions()
        .map(|p| (p, costs[p]))
        .reduce(|a, b| if b.1 < a.1 { b } else { a })?;
    if facts(cheapest.0).load > 0 {
        let tied: SmallVec<[usize; 8]> = positions().filter(|p| costs[*p] == cheapest.1).collect();
        if tied.len() > 1 {
            cheapest.0 = split(&tied);
        }
    }
    let stay = if recent.is_none() && held(&home) == 0 {
        cheapest.0 == home
    } else {
        !movable || cheapest.1 >= (1.0 - MOVE_MARGIN) * costs[home]
    };
    Some(match stay {
        true => Pick::Home(home),
        false => Pick::Moved {
            to: cheapest.0,
            from: home,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATES: Snapshot = Snapshot {
        service: 1.0,
        prefill: 1e-3,
    };

    fn facts(load: usize, cached_tokens: u64) -> Facts {
        Facts {
            load,
            slots: 4,
            cached_tokens,
            ..Facts::default()
        }
    }

    fn same(f: &Facts) -> &Facts {
        f
    }

    fn first(tied: &[usize]) -> usize {
        tied[0]
    }

    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-9, "{got} != {want}");
    }

    #[test]
    fn the_cost_is_the_prefill_stalling_the_batch_plus_the_wait_and_the_contention() {
        // 1,000 tokens, 400 held: 0.6 s of prefill, stalling the 3 running
        // too (2.4 s); a free slot, no wait; 3 running, 0.15 s.
        close(cost(RATES, 1000, &facts(3, 400)), 2.55);
        // Full (4 of 4): one request ahead, a quarter of a service time.
        close(cost(RATES, 1000, &facts(4, 1000)), 0.45);
        close(cost(RATES, 1000, &facts(7, 1000)), 1.35);
        // No slot limit known: one slot.
        let unknown = Facts {
            load: 1,
            ..Facts::default()
        };
        close(cost(RATES, 0, &unknown), 1.05);
        // More held than the prompt (a block's rounding): no negative prefill.
        close(cost(RATES, 10, &facts(0, 64)), 0.0);
    }

    #[test]
    fn a_new_conversation_goes_to_the_orders_first_unless_another_is_less_busy() {
        let idle = [facts(0, 0), facts(0, 0), facts(0, 0)];
        assert_eq!(
            choose(RATES, 5000, &idle, same, true, first),
            Some(Pick::Home(0))
        );
        // Every backend holds the shared system prompt: no home for that.
        let shared = [facts(0, 1500), facts(0, 1500), facts(0, 1500)];
        assert_eq!(
            choose(RATES, 5000, &shared, same, true, first),
            Some(Pick::Home(0))
        );
        // Loaded unevenly: the least busy, a warmup too.
        let busy = [facts(1, 1500), facts(0, 1500), facts(2, 1500)];
        let moved = Some(Pick::Moved { to: 1, from: 0 });
        assert_eq!(choose(RATES, 5000, &busy, same, true, first), moved);
        assert_eq!(choose(RATES, 5000, &busy, same, false, first), moved);
        assert_eq!(choose(RATES, 5000, &[], same, true, first), None);
    }

    #[test]
    fn equally_cheap_busy_backends_are_split_and_idle_ones_are_not() {
        let last = |tied: &[usize]| *tied.last().unwrap();
        // Three equally busy: the split's choice, a move off the order's first.
        let busy = [facts(1, 0), facts(2, 0), facts(1, 0), facts(1, 0)];
        let moved = Some(Pick::Moved { to: 3, from: 0 });
        assert_eq!(choose(RATES, 5000, &busy, same, true, last), moved);
        // One cheapest: the split is not asked.
        let one = [facts(2, 0), facts(1, 0), facts(2, 0)];
        let never = |_: &[usize]| -> usize { unreachable!() };
        let moved = Some(Pick::Moved { to: 1, from: 0 });
        assert_eq!(choose(RATES, 5000, &one, same, true, never), moved);
        // Idle ones: the order's first, as every replica would choose.
        let idle = [facts(0, 0), facts(0, 0)];
        assert_eq!(
            choose(RATES, 5000, &idle, same, true, never),
            Some(Pick::Home(0))
        );
    }

    #[test]
    fn a_conversation_stays_where_its_prefix_is_until_waiting_costs_more() {
        // Its prefix (4,800 of 5,000 tokens) on the third backend.
        let mut f = [facts(0, 1500), facts(0, 1500), facts(0, 4800)];
        assert_eq!(
            choose(RATES, 5000, &f, same, true, first),
            Some(Pick::Home(2))
        );
        // Full with a queue: home costs 1.0 + 4 * 0.25 + 0.35 = 2.35 s; a
        // cold prefill elsewhere 3.5 s: it stays.
        f[2].load = 7;
        assert_eq!(
            choose(RATES, 5000, &f, same, true, first),
            Some(Pick::Home(2))
        );
        // 11 ahead: 1.0 + 2.75 + 0.7 = 4.45 s, moving is clearly cheaper.
        f[2].load = 14;
        let moved = Some(Pick::Moved { to: 0, from: 2 });
        assert_eq!(choose(RATES, 5000, &f, same, true, first), moved);
        // Within the margin, it stays: 3.5 against 4.15 * 0.8 = 3.32.
        f[2].load = 13;
        close(cost(RATES, 5000, &f[2]), 4.15);
        assert_eq!(
            choose(RATES, 5000, &f, same, true, first),
            Some(Pick::Home(2))
        );
        // A warmup never leaves its home.
        f[2].load = 100;
        assert_eq!(
            choose(RATES, 5000, &f, same, false, first),
            Some(Pick::Home(2))
        );
    }

    /// The backend that served the conversation's previous turn.
    fn recent(load: usize, cached_tokens: u64) -> Facts {
        Facts {
            recent: true,
            ..facts(load, cached_tokens)
        }
    }

    #[test]
    fn a_conversation_stays_where_its_previous_turn_was_until_waiting_costs_more() {
        // Under pressure the index forgot all but the shared head of the
        // conversation on its backend (the third), which served its
        // previous turn (4,800 tokens): the first is idle, it stays.
        let f = [facts(0, 1500), facts(1, 1500), recent(2, 4800)];
        assert_eq!(
            choose(RATES, 5000, &f, same, true, first),
            Some(Pick::Home(2))
        );
        // A home at the order's first: served as the order's first.
        let f = [recent(2, 4800), facts(0, 1500)];
        assert_eq!(
            choose(RATES, 5000, &f, same, true, first),
            Some(Pick::Home(0))
        );
        // Hot: a queue of 14 there costs more than a cold prefill elsewhere.
        let f = [facts(0, 1500), facts(1, 1500), recent(14, 4800)];
        let moved = Some(Pick::Moved { to: 0, from: 2 });
        assert_eq!(choose(RATES, 5000, &f, same, true, first), moved);
        // Nothing of it held any more (its events said so): it leaves an
        // idle backend's cold prefill only for a clearly cheaper one (1.55 s
        // at home, stalling the one running there, against 0.75 s), and
        // stays where the costs are even.
        let f = [facts(0, 0), recent(1, 0)];
        let moved = Some(Pick::Moved { to: 0, from: 1 });
        assert_eq!(choose(RATES, 750, &f, same, true, first), moved);
        let f = [facts(1, 0), recent(1, 0)];
        assert_eq!(
            choose(RATES, 750, &f, same, true, first),
            Some(Pick::Home(1))
        );
    }

    #[test]
    fn a_move_goes_to_the_cheapest_and_a_busy_first_choice_to_a_free_one() {
        // Two copies of a hot prefix: the less busy one.
        let f = [facts(20, 4800), facts(5, 4800), facts(0, 0)];
        let moved = Some(Pick::Moved { to: 1, from: 0 });
        assert_eq!(choose(RATES, 5000, &f, same, true, first), moved);
        // A new conversation whose first choice has a long queue: to the
        // least busy.
        let f = [facts(40, 0), facts(4, 0), facts(2, 0)];
        let moved = Some(Pick::Moved { to: 2, from: 0 });
        assert_eq!(choose(RATES, 500, &f, same, true, first), moved);
    }

    #[test]
    fn the_rates_are_learnt_and_bad_samples_ignored() {
        let rates = Rates::default();
        let start = rates.snapshot();
        assert_eq!(start.service, DEFAULT_SERVICE_SECS);
        for _ in 0..500 {
            rates.observe(
                Duration::from_millis(500),
                Some(Duration::from_millis(200)),
                1000,
            );
            // Too few uncached tokens to say anything of the prefill.
            rates.observe(Duration::from_millis(500), Some(Duration::from_secs(9)), 10);
        }
        let learnt = rates.snapshot();
        assert!((learnt.service - 0.5).abs() < 1e-3, "{learnt:?}");
        assert!((learnt.prefill - 2e-4).abs() < 1e-7, "{learnt:?}");
        rates.observe(Duration::ZERO, Some(Duration::ZERO), 1000);
        assert_eq!(rates.snapshot(), learnt);
        // JSON of tools and messages: 51 tokens a 256-byte block, not 64.
        assert_eq!(rates.text_block_tokens(), 64);
        for _ in 0..500 {
            rates.observe_text(5100, 100);
            rates.observe_text(900, 2); // too short to tell
        }
        assert_eq!(rates.text_block_tokens(), 51);
    }
}
