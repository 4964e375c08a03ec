//! Fairness between tenants (see `fair`), in exact sequences: one slot,
//! freed again and again, and who it is handed to.

use super::{admission, ready, with_feedback, LONG};
use crate::admission::*;
use tokio::sync::oneshot::error::TryRecvError;

fn queued(t: Ticket) -> Place {
    match t {
        Ticket::Queued(p) => p,
        Ticket::Ready(_) => panic!("expected a queue place"),
    }
}

/// Waiting requests, each with the name the order shows it by.
type Waiting = Vec<(&'static str, Place)>;

fn join(a: &Arc<Admission>, waiting: &mut Waiting, tenant: &Share, name: &'static str) {
    waiting.push((
        name,
        queued(
            a.try_enter(Class::Agent, tenant, Demand::default())
                .unwrap(),
        ),
    ));
}

/// The waiter a slot was just handed to, out of the line.
fn handed(waiting: &mut Waiting) -> (&'static str, Permit) {
    let (k, permit) = waiting
        .iter_mut()
        .enumerate()
        .find_map(|(k, (_, place))| Some((k, place.rx.try_recv().ok()?)))
        .expect("the slot went to a waiter");
    (waiting.remove(k).0, permit)
}

/// Free the held slot `n` times, each time holding it for the waiter it was
/// handed to: their names in order.
fn serve(mut held: Permit, waiting: &mut Waiting, n: usize) -> (String, Permit) {
    let mut order = String::new();
    for _ in 0..n {
        drop(held);
        let (name, permit) = handed(waiting);
        order.push_str(name);
        held = permit;
    }
    (order, held)
}

/// The waiter's place was taken: its sender was dropped unsent.
fn displaced(place: &mut Place) -> bool {
    matches!(place.rx.try_recv(), Err(TryRecvError::Closed))
}

#[test]
fn weights_3_to_1_both_waiting_are_served_30_to_10_interleaved() {
    let a = admission(1, 100);
    let (ta, tb) = (Share::new("A", 3), Share::new("B", 1));
    let held = ready(a.try_enter(Class::Agent, &tb, Demand::default()).unwrap());
    let mut waiting = Vec::new();
    for _ in 0..40 {
        join(&a, &mut waiting, &ta, "A");
        join(&a, &mut waiting, &tb, "B");
    }
    let (order, _held) = serve(held, &mut waiting, 40);
    assert_eq!(order, format!("AB{}AA", "AAAB".repeat(9)));
    assert_eq!(order.matches('A').count(), 30);
}

#[test]
fn a_tenant_alone_gets_every_slot_whatever_its_weight() {
    let a = admission(2, 10);
    let (light, heavy) = (Share::new("L", 1), Share::new("H", 1000));
    let held = ready(
        a.try_enter(Class::Agent, &light, Demand::default())
            .unwrap(),
    );
    let _other = ready(
        a.try_enter(Class::Agent, &light, Demand::default())
            .unwrap(),
    );
    let mut waiting = Vec::new();
    for _ in 0..3 {
        join(&a, &mut waiting, &light, "L");
    }
    for _ in 0..2 {
        join(&a, &mut waiting, &heavy, "H");
    }
    // H is served by its weight, then L alone takes every slot.
    let (order, _held) = serve(held, &mut waiting, 5);
    assert_eq!(order, "LHHLL");
    assert_eq!(a.counts(), (2, 0));
}

#[test]
fn a_tenant_back_from_idle_gets_its_share_not_a_burst() {
    let a = admission(1, 100);
    let (ta, tb) = (Share::new("A", 1), Share::new("B", 1));
    let held = ready(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let mut waiting = Vec::new();
    for _ in 0..20 {
        join(&a, &mut waiting, &ta, "A");
    }
    let (order, held) = serve(held, &mut waiting, 10);
    assert_eq!(order, "A".repeat(10));
    for _ in 0..10 {
        join(&a, &mut waiting, &tb, "B");
    }
    let (order, _held) = serve(held, &mut waiting, 10);
    assert_eq!(order, "BA".repeat(5));
}

#[test]
fn a_tenant_that_rejoins_at_once_still_waits_its_turn() {
    let a = admission(1, 100);
    let (ta, tb) = (Share::new("A", 1), Share::new("B", 1));
    let mut held = ready(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let mut waiting = Vec::new();
    for _ in 0..5 {
        join(&a, &mut waiting, &tb, "B");
    }
    join(&a, &mut waiting, &ta, "A");
    // A keeps one request waiting: the slot it was just granted counts.
    let mut order = String::new();
    for _ in 0..8 {
        let (name, permit) = serve(held, &mut waiting, 1);
        if name == "A" {
            join(&a, &mut waiting, &ta, "A");
        }
        order += &name;
        held = permit;
    }
    assert_eq!(order, "BA".repeat(4));
}

#[tokio::test(start_paused = true)]
async fn a_tenant_under_its_share_takes_the_newest_place_of_the_one_over_it() {
    let a = admission(1, 6);
    let (ta, tb) = (Share::new("A", 1), Share::new("B", 2));
    let held = ready(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let mut a_places: Vec<Place> = (0..6)
        .map(|_| queued(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap()))
        .collect();
    assert_eq!(
        a.try_enter(Class::Agent, &ta, Demand::default()).err(),
        Some(AdmitError::QueueFull),
        "alone, A holds its share"
    );
    // B's share is 6 * 2 / 3 = 4: it takes A's four newest places, each
    // refused at once.
    let started = tokio::time::Instant::now();
    let mut b_places = Vec::new();
    for _ in 0..4 {
        b_places.push(queued(
            a.try_enter(Class::Agent, &tb, Demand::default()).unwrap(),
        ));
        let newest = Ticket::Queued(a_places.pop().unwrap());
        assert_eq!(newest.wait(LONG).await.err(), Some(AdmitError::QueueFull));
        assert_eq!(a.counts(), (1, 6));
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
    for t in [&tb, &ta] {
        assert_eq!(
            a.try_enter(Class::Agent, t, Demand::default()).err(),
            Some(AdmitError::QueueFull),
            "each holds its share"
        );
    }
    let mut waiting: Waiting = (a_places.into_iter().map(|p| ("A", p)))
        .chain(b_places.into_iter().map(|p| ("B", p)))
        .collect();
    let (order, _held) = serve(held, &mut waiting, 6);
    assert_eq!(order, "ABBABB");
}

#[test]
fn between_tenants_as_far_over_their_share_the_newest_request_loses_its_place() {
    let a = admission(1, 4);
    let [ta, tb, tc] = ["A", "B", "C"].map(|n| Share::new(n, 1));
    let _held = ready(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let mut places: Vec<Place> = [&ta, &ta, &tc, &tc]
        .map(|t| queued(a.try_enter(Class::Agent, t, Demand::default()).unwrap()))
        .into();
    // A and C hold 2 places each, 2/3 over a share of 4/3: C's came last.
    let _b1 = queued(a.try_enter(Class::Agent, &tb, Demand::default()).unwrap());
    assert_eq!(
        places.iter_mut().map(displaced).collect::<Vec<_>>(),
        [false, false, false, true]
    );
    // Now A alone is over its share.
    let _b2 = queued(a.try_enter(Class::Agent, &tb, Demand::default()).unwrap());
    assert_eq!(
        places.iter_mut().map(displaced).collect::<Vec<_>>(),
        [false, true, false, true]
    );
    assert_eq!(
        a.try_enter(Class::Agent, &tb, Demand::default()).err(),
        Some(AdmitError::QueueFull)
    );
}

#[test]
fn a_warmup_never_takes_an_agents_place_an_agent_takes_a_warmups_first() {
    let a = admission(1, 3);
    let [ta, tb, tc] = ["A", "B", "C"].map(|n| Share::new(n, 1));
    let held = ready(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let mut a1 = queued(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let mut a2 = queued(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let mut bw = queued(a.try_enter(Class::Warmup, &tb, Demand::default()).unwrap());
    // C's share is 1: A is over its share, but only with agents.
    assert_eq!(
        a.try_enter(Class::Warmup, &tc, Demand::default()).err(),
        Some(AdmitError::QueueFull)
    );
    // An agent takes the warmup's place, though B is within its share.
    let c1 = queued(a.try_enter(Class::Agent, &tc, Demand::default()).unwrap());
    assert!(displaced(&mut bw));
    assert!(!displaced(&mut a1) && !displaced(&mut a2));
    let mut waiting = vec![("A", a1), ("A", a2), ("C", c1)];
    let (order, _held) = serve(held, &mut waiting, 3);
    assert_eq!(order, "ACA");
}

#[tokio::test(start_paused = true)]
async fn displaced_timed_out_and_dropped_waiters_leave_nothing_behind() {
    let a = admission(1, 3);
    let (ta, tb) = (Share::new("A", 1), Share::new("B", 1));
    let held = ready(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let [a1, a2, a3] = [(); 3].map(|()| a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let b1 = a.try_enter(Class::Agent, &tb, Demand::default()).unwrap();
    drop(a3); // displaced, never waited on
    let b2 = a.try_enter(Class::Agent, &tb, Demand::default()).unwrap();
    assert_eq!(a2.wait(LONG).await.err(), Some(AdmitError::QueueFull));
    assert_eq!(a.counts(), (1, 3));
    let started = tokio::time::Instant::now();
    assert_eq!(
        a1.wait(Duration::from_secs(5)).await.err(),
        Some(AdmitError::QueueTimeout)
    );
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    drop(b1); // its client left
    assert_eq!(a.counts(), (1, 1));
    drop(held);
    let p2 = b2.wait(Duration::ZERO).await.unwrap();
    assert_eq!(a.counts(), (1, 0));
    drop(p2);
    assert_eq!(a.counts(), (0, 0));
    assert_eq!(a.load(), 0);
    assert_eq!(a.gauges.inflight.get(), 0);
    assert_eq!(a.gauges.queued.get(), 0);
}

#[test]
fn load_feedback_grants_in_the_fair_order() {
    let fleet = Fleet {
        ceiling: 4,
        replicas: 2,
    };
    let a = with_feedback(2, 10, Some(fleet));
    let (ta, tb) = (Share::new("A", 1), Share::new("B", 1));
    let held = ready(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let _other = ready(a.try_enter(Class::Agent, &ta, Demand::default()).unwrap());
    let mut waiting = Vec::new();
    join(&a, &mut waiting, &ta, "A");
    join(&a, &mut waiting, &ta, "A");
    join(&a, &mut waiting, &tb, "B");
    // A raised limit: one slot more, to A's oldest; B is next.
    a.report(0);
    assert_eq!(a.counts(), (3, 2));
    let (first, _granted) = handed(&mut waiting);
    let (then, _held) = serve(held, &mut waiting, 1);
    assert_eq!(first.to_owned() + &then, "AB");
}
