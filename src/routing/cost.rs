//! Choosing by cost (`routing.prefix_index`): each candidate backend is
//! scored by the time this request would cost there, and the cheapest wins,
//! but a request leaves the backend that holds most of its prompt only when
//! moving is clearly cheaper.
//!
//! ```text
//! cost(b) = prefill(b) + wait(b)
//! prefill(b) = (prompt tokens - tokens b holds) * seconds per uncached token
//! wait(b)    = ahead(b) * seconds a request holds a slot / slots(b)
//! ahead(b)   = requests before this one when b has no free slot: load(b) + 1 - slots(b), else 0
//! home       = the usable backend holding the most of the prompt (ties: the order's first)
//! choice     = the cheapest backend b (ties: the order's first),
//!              if cost(b) < (1 - MOVE_MARGIN) * cost(home); else home
//! ```
//!
//! With nothing cached and free slots, every cost is the same and the
//! order's first (the key's rendezvous choice, or the round-robin turn)
//! wins: replicas that share no state still agree on a new conversation.
//! The two rates are learnt from the model's own responses ([`Rates`]): a
//! request's slot time, and its time to first token over its uncached
//! prompt tokens, as reported by vLLM.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::Facts;

/// How much cheaper than staying a move must be: a little noise in the
/// estimates never scatters a conversation.
pub const MOVE_MARGIN: f64 = 0.2;

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

/// One model's measured rates, moving averages of its responses.
pub struct Rates {
    service: AtomicU64,
    prefill: AtomicU64,
}

impl Default for Rates {
    fn default() -> Self {
        Rates {
            service: AtomicU64::new(DEFAULT_SERVICE_SECS.to_bits()),
            prefill: AtomicU64::new(DEFAULT_PREFILL_SECS.to_bits()),
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
    let ahead = (facts.load + 1).saturating_sub(slots);
    uncached as f64 * rates.prefill + ahead as f64 * rates.service / slots as f64
}

/// Why the cost rule chose what it chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The backend holding the most of the prompt (`home`).
    Home(usize),
    /// Another one, waiting at home costing more than prefilling there.
    Moved { to: usize, from: usize },
}

/// Of `facts` (in the order's order), the one to choose among the
/// `usable` positions; `movable`: whether load may move the request (a
/// warmup only fills its home). None when none is usable.
pub fn choose(
    rates: Snapshot,
    prompt: u64,
    facts: &[Facts],
    usable: impl Fn(usize) -> bool,
    movable: bool,
) -> Option<Pick> {
    let positions = || (0..facts.len()).filter(|p| usable(*p));
    // The first of the most cached: `max_by_key` keeps the last of equals.
    let home = positions().rev().max_by_key(|p| facts[*p].cached_tokens)?;
    if !movable {
        return Some(Pick::Home(home));
    }
    let costs: Vec<(usize, f64)> = positions()
        .map(|p| (p, cost(rates, prompt, &facts[p])))
        .collect();
    let at_home = costs.iter().find(|(p, _)| *p == home).map_or(0.0, |c| c.1);
    let (best, cheapest) = costs
        .iter()
        .copied()
        .reduce(|a, b| if b.1 < a.1 { b } else { a })?;
    Some(if cheapest < (1.0 - MOVE_MARGIN) * at_home {
        Pick::Moved {
            to: best,
            from: home,
        }
    } else {
        Pick::Home(home)
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

    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-9, "{got} != {want}");
    }

    fn all(_: usize) -> bool {
        true
    }

    #[test]
    fn the_cost_is_the_uncached_prefill_plus_the_wait_for_a_slot() {
        // 1,000 tokens, 400 held: 0.6 s; a free slot: no wait.
        close(cost(RATES, 1000, &facts(3, 400)), 0.6);
        // Full (4 of 4): one request ahead, a quarter of a service time.
        close(cost(RATES, 1000, &facts(4, 1000)), 0.25);
        close(cost(RATES, 1000, &facts(7, 1000)), 1.0);
        // No slot limit known: one slot.
        let unknown = Facts {
            load: 1,
            ..Facts::default()
        };
        close(cost(RATES, 0, &unknown), 1.0);
        // More held than the prompt (a block's rounding): no negative prefill.
        close(cost(RATES, 10, &facts(0, 64)), 0.0);
    }

    #[test]
    fn nothing_known_the_orders_first_wins() {
        let idle = [facts(0, 0), facts(0, 0), facts(0, 0)];
        assert_eq!(choose(RATES, 5000, &idle, all, true), Some(Pick::Home(0)));
        // Everyone holds the shared system prompt: still the first.
        let shared = [facts(1, 1500), facts(0, 1500), facts(2, 1500)];
        assert_eq!(choose(RATES, 5000, &shared, all, true), Some(Pick::Home(0)));
        // Not usable: the next.
        let usable = |p: usize| p != 0;
        assert_eq!(
            choose(RATES, 5000, &idle, usable, true),
            Some(Pick::Home(1))
        );
        assert_eq!(choose(RATES, 5000, &idle, |_| false, true), None);
    }

    #[test]
    fn a_conversation_stays_where_its_prefix_is_until_waiting_costs_more() {
        // Its prefix (4,800 of 5,000 tokens) on the third backend.
        let mut f = [facts(0, 1500), facts(0, 1500), facts(0, 4800)];
        assert_eq!(choose(RATES, 5000, &f, all, true), Some(Pick::Home(2)));
        // Full with a queue: home costs 0.2 + 4 * 0.25 = 1.2 s; a cold
        // prefill of 3,500 tokens elsewhere costs 3.5 s: it stays.
        f[2].load = 7;
        assert_eq!(choose(RATES, 5000, &f, all, true), Some(Pick::Home(2)));
        // 17 ahead cost 4.45 s: moving is clearly cheaper.
        f[2].load = 20;
        let moved = Some(Pick::Moved { to: 0, from: 2 });
        assert_eq!(choose(RATES, 5000, &f, all, true), moved);
        // Within the margin, it stays: 3.5 against 4.2 * 0.8 = 3.36.
        f[2].load = 19;
        close(cost(RATES, 5000, &f[2]), 4.2);
        assert_eq!(choose(RATES, 5000, &f, all, true), Some(Pick::Home(2)));
        // A warmup is never moved.
        f[2].load = 100;
        assert_eq!(choose(RATES, 5000, &f, all, false), Some(Pick::Home(2)));
    }

    #[test]
    fn a_move_goes_to_the_cheapest_and_a_busy_first_choice_to_a_free_one() {
        // Two copies of a hot prefix: the less busy one.
        let f = [facts(20, 4800), facts(5, 4800), facts(0, 0)];
        let moved = Some(Pick::Moved { to: 1, from: 0 });
        assert_eq!(choose(RATES, 5000, &f, all, true), moved);
        // A new conversation whose first choice has a long queue: to the
        // first with a free slot.
        let f = [facts(40, 0), facts(4, 0), facts(2, 0)];
        let moved = Some(Pick::Moved { to: 2, from: 0 });
        assert_eq!(choose(RATES, 500, &f, all, true), moved);
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
    }
}
