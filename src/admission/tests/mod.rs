//! Admission's tests: slots and the queue (here), fairness between tenants
//! in requests (`fair.rs`) and in tokens (`tokens.rs`).

mod fair;
mod tokens;

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;

/// The one tenant of the tests written before tenants.
static ONE: LazyLock<Share> = LazyLock::new(|| Share::new("one", 1));

pub(super) fn admission(max_num_seqs: usize, max_queue_depth: usize) -> Arc<Admission> {
    with_feedback(max_num_seqs, max_queue_depth, None)
}

pub(super) fn with_feedback(
    max_num_seqs: usize,
    max_queue_depth: usize,
    fleet: Option<Fleet>,
) -> Arc<Admission> {
    counting(max_num_seqs, max_queue_depth, fleet, Fairness::Requests)
}

pub(super) fn counting(
    max_num_seqs: usize,
    max_queue_depth: usize,
    fleet: Option<Fleet>,
    fairness: Fairness,
) -> Arc<Admission> {
    Admission::new(
        Capacity {
            max_num_seqs,
            max_queue_depth,
        },
        fleet,
        fairness,
        Gauges {
            inflight: IntGauge::new("inflight", "test").unwrap(),
            queued: IntGauge::new("queued", "test").unwrap(),
        },
    )
}

pub(super) fn ready(t: Ticket) -> Permit {
    match t {
        Ticket::Ready(p) => p,
        Ticket::Queued(_) => panic!("expected a free slot"),
    }
}

pub(super) const LONG: Duration = Duration::from_secs(3600);

#[tokio::test(start_paused = true)]
async fn slots_then_queue_then_refusal() {
    let a = admission(2, 3);
    let p1 = ready(a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap());
    let _p2 = ready(a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap());
    let queued: Vec<Ticket> = (0..3)
        .map(|_| a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap())
        .collect();
    assert!(queued.iter().all(|t| matches!(t, Ticket::Queued(_))));
    assert_eq!(a.counts(), (2, 3));
    assert_eq!(a.load(), 2 + 3);
    assert_eq!(a.gauges.inflight.get(), 2);
    assert_eq!(a.gauges.queued.get(), 3);
    assert_eq!(
        a.try_enter(Class::Agent, &ONE, Demand::default()).err(),
        Some(AdmitError::QueueFull)
    );
    assert_eq!(
        a.try_enter(Class::Warmup, &ONE, Demand::default()).err(),
        Some(AdmitError::QueueFull)
    );

    // A freed slot goes straight to the head of the queue.
    drop(p1);
    assert_eq!(a.counts(), (2, 2));
    assert_eq!(a.load(), 2 + 2);
    let mut it = queued.into_iter();
    let p3 = it.next().unwrap().wait(LONG).await.unwrap();
    drop(p3);
    drop(it);
    assert_eq!(a.counts(), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn agents_are_served_before_warmups_fifo_within_each() {
    let a = admission(1, 10);
    let holder = ready(a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap());
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (name, class) in [
        ("w1", Class::Warmup),
        ("a1", Class::Agent),
        ("w2", Class::Warmup),
        ("a2", Class::Agent),
    ] {
        let ticket = a.try_enter(class, &ONE, Demand::default()).unwrap();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let permit = ticket.wait(LONG).await.unwrap();
            order.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(permit);
        }));
    }
    drop(holder);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["a1", "a2", "w1", "w2"]);
    assert_eq!(a.counts(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_times_out_and_leaves_its_place() {
    let a = admission(1, 1);
    let _holder = ready(a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap());
    let ticket = a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap();
    let started = tokio::time::Instant::now();
    let err = ticket.wait(Duration::from_secs(5)).await.err();
    assert_eq!(err, Some(AdmitError::QueueTimeout));
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(a.counts(), (1, 0));
    // The place is free again.
    assert!(a.try_enter(Class::Agent, &ONE, Demand::default()).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaves_at_once_and_slots_are_not_lost() {
    let a = admission(1, 5);
    let holder = ready(a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap());
    // A client that disconnects: its wait future is dropped mid-way.
    let ticket = a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap();
    let task = tokio::spawn(ticket.wait(LONG));
    tokio::time::sleep(Duration::from_millis(1)).await;
    task.abort();
    let _ = task.await;
    assert_eq!(a.counts(), (1, 0));
    // A place dropped after being granted (the race with release) passes
    // the slot on instead of losing it.
    let t2 = a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap();
    let t3 = a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap();
    drop(holder); // granted to t2, which is never awaited
    drop(t2);
    let p3 = t3.wait(LONG).await.unwrap();
    assert_eq!(a.counts(), (1, 0));
    drop(p3);
    assert_eq!(a.counts(), (0, 0));
    assert_eq!(a.gauges.inflight.get(), 0);
    assert_eq!(a.gauges.queued.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn never_more_than_max_num_seqs_in_flight_under_churn() {
    let a = admission(4, 100);
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..100u64 {
        let (a, running, peak) = (a.clone(), running.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            let class = if i % 3 == 0 {
                Class::Warmup
            } else {
                Class::Agent
            };
            let permit = a
                .try_enter(class, &ONE, Demand::default())
                .unwrap()
                .wait(LONG)
                .await
                .unwrap();
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1 + i % 7)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            drop(permit);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(peak.load(Ordering::SeqCst), 4);
    assert_eq!(a.counts(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn zero_queue_depth_refuses_when_slots_are_busy() {
    let a = admission(1, 0);
    let _p = ready(a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap());
    assert_eq!(
        a.try_enter(Class::Agent, &ONE, Demand::default()).err(),
        Some(AdmitError::QueueFull)
    );
}

#[tokio::test(start_paused = true)]
async fn a_report_of_waiting_requests_lowers_the_limit_as_slots_free() {
    // Share 3 of a backend of 6.
    let fleet = Fleet {
        ceiling: 6,
        replicas: 2,
    };
    let a = with_feedback(3, 10, Some(fleet));
    let permits: Vec<Permit> = (0..3)
        .map(|_| ready(a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap()))
        .collect();
    let waiting: Vec<Ticket> = (0..2)
        .map(|_| a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap())
        .collect();
    // 3 * 6 / (6 + 30) = 0 -> 1 slot.
    a.report(30);
    assert_eq!(a.slot_limit(), 1);
    assert_eq!(a.counts(), (3, 2), "nothing is taken back");
    let mut permits = permits.into_iter();
    drop(permits.next());
    drop(permits.next());
    assert_eq!(
        a.counts(),
        (1, 2),
        "freed slots are not handed on over the limit"
    );
    drop(permits);
    assert_eq!(
        a.counts(),
        (1, 1),
        "at the limit the next waiter gets the slot"
    );
    drop(waiting);
}

#[tokio::test(start_paused = true)]
async fn a_report_of_nothing_waiting_lends_a_slot_to_a_waiter_at_once() {
    let fleet = Fleet {
        ceiling: 4,
        replicas: 2,
    };
    let a = with_feedback(2, 10, Some(fleet));
    let _held: Vec<Permit> = (0..2)
        .map(|_| ready(a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap()))
        .collect();
    let t1 = a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap();
    let _t2 = a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap();
    a.report(0);
    assert_eq!(a.slot_limit(), 3);
    assert_eq!(a.counts(), (3, 1));
    let _p = t1.wait(Duration::ZERO).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn without_feedback_reports_change_nothing() {
    let a = admission(2, 10);
    let _p = ready(a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap());
    a.report(100);
    assert_eq!(a.slot_limit(), 2);
    assert!(matches!(
        a.try_enter(Class::Agent, &ONE, Demand::default()).unwrap(),
        Ticket::Ready(_)
    ));
}
