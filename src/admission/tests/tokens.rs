//! Fairness in tokens (`tenants.fairness: tokens`), in exact sequences: one
//! slot, each request finishing with what it reports before the next is
//! granted, and who the slot is handed to.

use super::{counting, ready};
use crate::admission::*;

/// An output token weighs 10 prefill tokens.
const TOKENS: Fairness = Fairness::Tokens {
    output_cost: Some(10),
};

/// A kind of request: its tenant, what admission knows of it, what its
/// response reports.
#[derive(Clone)]
struct Kind {
    name: &'static str,
    share: Share,
    demand: Demand,
    reported: Reported,
}

/// `prefill` uncached prompt tokens and 4 output tokens (`max_tokens` 4),
/// reported as estimated.
fn kind(name: &'static str, weight: u32, prefill: u64) -> Kind {
    Kind {
        name,
        share: Share::new(name, weight),
        demand: Demand {
            prefill,
            max_output: Some(4),
        },
        reported: Reported {
            prefill: Some(prefill),
            output: Some(4),
        },
    }
}

/// 3,000 weighted tokens a request, and 1,000.
fn long() -> Kind {
    kind("L", 1, 2960)
}

fn short() -> Kind {
    kind("S", 1, 960)
}

type Waiting = Vec<(Kind, Place)>;

fn join(a: &Arc<Admission>, waiting: &mut Waiting, k: &Kind) {
    match a.try_enter(Class::Agent, &k.share, k.demand).unwrap() {
        Ticket::Queued(place) => waiting.push((k.clone(), place)),
        Ticket::Ready(_) => panic!("expected a queue place"),
    }
}

/// The slot, held by a request of a kind.
type Held = (Kind, Permit);

/// Finish the held request `n` times, each time holding the slot for the
/// waiter it was handed to: their names in order, and the service each
/// name was counted.
fn serve(mut held: Held, waiting: &mut Waiting, n: usize) -> (String, Held) {
    let mut order = String::new();
    for _ in 0..n {
        let (k, permit) = held;
        permit.finish(k.reported);
        held = handed(waiting);
        order.push_str(held.0.name);
    }
    (order, held)
}

/// The waiter the slot was just handed to, out of the line.
fn handed(waiting: &mut Waiting) -> Held {
    let (i, permit) = waiting
        .iter_mut()
        .enumerate()
        .find_map(|(i, (_, place))| Some((i, place.rx.try_recv().ok()?)))
        .expect("the slot went to a waiter");
    (waiting.remove(i).0, permit)
}

/// A first request of `k`, holding the one slot.
fn first(a: &Arc<Admission>, k: &Kind) -> Held {
    (
        k.clone(),
        ready(a.try_enter(Class::Agent, &k.share, k.demand).unwrap()),
    )
}

#[test]
fn long_prompts_get_the_slot_in_proportion_to_their_tokens_not_their_requests() {
    for (fairness, want) in [
        (TOKENS, "LSSS".repeat(6)),
        (Fairness::Requests, "LS".repeat(12)),
    ] {
        let a = counting(1, 100, None, fairness);
        let (l, s) = (long(), short());
        let held = first(&a, &s);
        let mut waiting = Vec::new();
        for _ in 0..30 {
            join(&a, &mut waiting, &l);
            join(&a, &mut waiting, &s);
        }
        let (order, _held) = serve(held, &mut waiting, 24);
        assert_eq!(order, want, "{fairness:?}");
    }
}

#[test]
fn weights_divide_the_tokens_3_to_1() {
    let a = counting(1, 100, None, TOKENS);
    // 3,000 tokens at weight 3 against 1,000 at weight 1: one each in turn,
    // three times the tokens to A.
    let (heavy, light) = (kind("A", 3, 2960), kind("B", 1, 960));
    let held = first(&a, &light);
    let mut waiting = Vec::new();
    for _ in 0..20 {
        join(&a, &mut waiting, &heavy);
        join(&a, &mut waiting, &light);
    }
    let (order, _held) = serve(held, &mut waiting, 20);
    assert_eq!(order, "AB".repeat(10));
    // Both short: 3 to 1 in requests as in tokens.
    let a = counting(1, 100, None, TOKENS);
    let heavy = kind("A", 3, 960);
    let held = first(&a, &light);
    let mut waiting = Vec::new();
    for _ in 0..20 {
        join(&a, &mut waiting, &heavy);
        join(&a, &mut waiting, &light);
    }
    let (order, _held) = serve(held, &mut waiting, 16);
    assert_eq!(order, format!("AB{}AA", "AAAB".repeat(3)));
}

#[test]
fn a_tenant_back_from_idle_starts_level_and_banks_nothing() {
    let a = counting(1, 100, None, TOKENS);
    let (l, s) = (long(), short());
    let held = first(&a, &l);
    let mut waiting = Vec::new();
    for _ in 0..2 {
        join(&a, &mut waiting, &s);
    }
    for _ in 0..12 {
        join(&a, &mut waiting, &l);
    }
    // S's two in turn, then L alone: 8 grants of 3,000 tokens S took no
    // part in.
    let (order, held) = serve(held, &mut waiting, 12);
    assert_eq!(order, format!("SLSL{}", "L".repeat(8)));
    for _ in 0..8 {
        join(&a, &mut waiting, &s);
    }
    // Back level with L's last start: S first, then its share, no burst of
    // the 30,000 tokens it did not use (that would be SSSSSSSS).
    let (order, _held) = serve(held, &mut waiting, 8);
    assert_eq!(order, "SSSLSSSL");
}

#[test]
fn a_response_that_reports_fewer_tokens_gives_the_rest_back() {
    // L asks no max_tokens: 256 output tokens expected, 5,520 tokens in
    // all; it reports 4, 3,000.
    let mut l = long();
    l.demand.max_output = None;
    let s = short();
    let run = |l: &Kind| {
        let a = counting(1, 100, None, TOKENS);
        let held = first(&a, &s);
        let mut waiting = Vec::new();
        for _ in 0..20 {
            join(&a, &mut waiting, l);
            join(&a, &mut waiting, &s);
        }
        serve(held, &mut waiting, 16).0
    };
    // Corrected: as if it had been estimated right.
    assert_eq!(run(&l), "LSSS".repeat(4));
    // Reported nothing (cut short): the estimate stands.
    l.reported = Reported::default();
    assert_eq!(run(&l), "LSSSSSSLSSSSSSLS");
}

#[test]
fn an_attempt_that_fails_is_refunded_and_service_is_counted_as_reported() {
    let a = counting(1, 100, None, TOKENS);
    let (l, s) = (long(), short());
    let held = first(&a, &s);
    let mut waiting = Vec::new();
    join(&a, &mut waiting, &l);
    join(&a, &mut waiting, &l);
    for _ in 0..4 {
        join(&a, &mut waiting, &s);
    }
    let (order, (_, permit)) = serve(held, &mut waiting, 1);
    assert_eq!(order, "L");
    // Its backend failed before serving it: refunded, so L is level with
    // S again and its next goes first (charged, S's turn would have come).
    permit.refund();
    let (k, permit) = handed(&mut waiting);
    assert_eq!(k.name, "L");
    // 2,960 + 4 * 10, counted in weighted tokens.
    assert_eq!(permit.finish(l.reported), 3000.0);
    let (k, permit) = handed(&mut waiting);
    assert_eq!(k.name, "S");
    assert_eq!(permit.finish(s.reported), 1000.0);
    let requests = counting(1, 100, None, Fairness::Requests);
    let (_, permit) = first(&requests, &l);
    assert_eq!(permit.finish(l.reported), 1.0);
}
