use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

fn tenant(limits: Budget) -> Arc<Tenant> {
    tenants(limits, 1).get("t").tenant
}

/// One listed tenant `t`, unlisted names unlimited.
fn tenants(limits: Budget, replicas: usize) -> Tenants {
    let listed = HashMap::from([("t".to_owned(), spec(limits))]);
    Tenants::new(listed, Spec::default(), DEFAULT_MAX_TRACKED, replicas).unwrap()
}

fn spec(limits: Budget) -> Spec {
    Spec { weight: 1, limits }
}

fn rpm(n: u32) -> Budget {
    Budget {
        requests_per_minute: Some(n),
        ..Budget::default()
    }
}

fn refusal(t: &Arc<Tenant>, now: Instant) -> (Limit, Duration) {
    let r = t.admit(|| now).expect_err("expected a refusal");
    (r.limit, r.retry_after)
}

/// Admit `n` requests at `now`, each ended at once.
fn admit_n(t: &Arc<Tenant>, n: usize, now: Instant) {
    for i in 0..n {
        let guard = t.admit(|| now);
        assert!(guard.is_ok(), "request {i} of {n} refused: {guard:?}");
    }
}

#[test]
fn rpm_burst_then_one_a_second() {
    let t = tenant(rpm(60));
    let t0 = Instant::now();
    admit_n(&t, 60, t0);
    assert_eq!(refusal(&t, t0), (Limit::RequestsPerMinute, SEC));
    assert_eq!(refusal(&t, t0 + 999 * MS), (Limit::RequestsPerMinute, MS));
    admit_n(&t, 1, t0 + SEC);
    assert_eq!(refusal(&t, t0 + SEC), (Limit::RequestsPerMinute, SEC));
    // Sustained: one a second, never two.
    for s in 2..10 {
        admit_n(&t, 1, t0 + s * SEC);
        assert!(t.admit(|| t0 + s * SEC).is_err());
    }
}

#[test]
fn no_double_burst_at_a_minute_edge() {
    // A fixed-window counter would allow 60 in the last half second of a
    // minute and 60 more in the first instant of the next.
    let t = tenant(rpm(60));
    let edge = Instant::now() + Duration::from_secs(60);
    admit_n(&t, 60, edge - 500 * MS);
    assert_eq!(refusal(&t, edge), (Limit::RequestsPerMinute, 500 * MS));
    admit_n(&t, 1, edge + 500 * MS);
    assert!(t.admit(|| edge + 500 * MS).is_err());
}

#[test]
fn tokens_charged_afterwards_overdraw_and_are_paid_back_exactly() {
    let t = tenant(Budget {
        tokens_per_minute: Some(600),
        ..Budget::default()
    });
    let t0 = Instant::now();
    // A balance of 600 admits however many start together.
    let a = t.admit(|| t0).unwrap();
    let b = t.admit(|| t0).unwrap();
    // Charged 30 s later: the bucket stayed full meanwhile (600, not 900),
    // so 1000 leaves a debt of 400, paid back at 10 a second.
    let t1 = t0 + Duration::from_secs(30);
    a.charge(1000, || t1);
    let wait = Duration::from_secs(40);
    assert_eq!(refusal(&t, t1), (Limit::TokensPerMinute, wait));
    assert_eq!(
        refusal(&t, t1 + wait - Duration::from_nanos(1)),
        (Limit::TokensPerMinute, Duration::from_nanos(1))
    );
    // The second request was still running and ends now, charging 5 more.
    b.charge(5, || t1 + wait);
    assert_eq!(refusal(&t, t1 + wait), (Limit::TokensPerMinute, 500 * MS));
    admit_n(&t, 1, t1 + wait + 500 * MS);
}

#[test]
fn max_in_flight_frees_when_a_guard_drops() {
    let t = tenant(Budget {
        max_in_flight: Some(2),
        ..Budget::default()
    });
    let t0 = Instant::now();
    let a = t.admit(|| t0).unwrap();
    let _b = t.admit(|| t0).unwrap();
    assert_eq!(refusal(&t, t0), (Limit::MaxInFlight, IN_FLIGHT_RETRY));
    drop(a);
    let _c = t.admit(|| t0).unwrap();
    assert_eq!(refusal(&t, t0), (Limit::MaxInFlight, IN_FLIGHT_RETRY));
}

#[test]
fn a_refused_request_takes_nothing() {
    let t = tenant(Budget {
        max_in_flight: Some(1),
        requests_per_minute: Some(2),
        tokens_per_minute: None,
    });
    let t0 = Instant::now();
    let a = t.admit(|| t0).unwrap();
    for _ in 0..5 {
        assert_eq!(refusal(&t, t0).0, Limit::MaxInFlight);
    }
    drop(a);
    // The five refusals took none of the two requests a minute.
    let b = t.admit(|| t0).unwrap();
    drop(b);
    assert_eq!(
        refusal(&t, t0),
        (Limit::RequestsPerMinute, Duration::from_secs(30))
    );
    // Nor a place in flight.
    let _c = t.admit(|| t0 + Duration::from_secs(30)).unwrap();
}

#[test]
fn limits_are_checked_in_order() {
    let t = tenant(Budget {
        max_in_flight: Some(1),
        requests_per_minute: Some(1),
        tokens_per_minute: Some(60),
    });
    let t0 = Instant::now();
    // The one request a minute, charged 180 tokens of 60: 120 in debt, paid
    // back at one a second.
    t.admit(|| t0).unwrap().charge(180, || t0);
    let min = Duration::from_secs(60);
    assert_eq!(refusal(&t, t0), (Limit::RequestsPerMinute, min));
    assert_eq!(refusal(&t, t0 + min), (Limit::TokensPerMinute, min));
    let _held = t.admit(|| t0 + 2 * min).unwrap();
    // All three are over now; the place in flight is named.
    assert_eq!(refusal(&t, t0 + 2 * min).0, Limit::MaxInFlight);
}

#[test]
fn replicas_share_each_limit_rounding_up() {
    let whole = Budget {
        max_in_flight: Some(2),
        requests_per_minute: Some(600),
        tokens_per_minute: Some(1000),
    };
    let share = Budget {
        max_in_flight: Some(1),
        requests_per_minute: Some(200),
        tokens_per_minute: Some(334),
    };
    assert_eq!(whole.shared_by(3), share);
    assert_eq!(whole.shared_by(1), whole);
    assert_eq!(rpm(1).shared_by(64), rpm(1));

    let t = tenants(rpm(600), 3).get("t").tenant;
    let t0 = Instant::now();
    admit_n(&t, 200, t0);
    assert_eq!(refusal(&t, t0), (Limit::RequestsPerMinute, 300 * MS));
}

#[test]
fn unlisted_names_are_bounded_and_overflow_to_other_once() {
    let listed = HashMap::from([(
        "alice".to_owned(),
        Spec {
            weight: 3,
            limits: rpm(10),
        },
    )]);
    let reg = Tenants::new(listed, spec(rpm(5)), DEFAULT_MAX_TRACKED, 1).unwrap();
    for i in 0..DEFAULT_MAX_TRACKED {
        let name = format!("user{i}");
        let l = reg.get(&name);
        assert_eq!((l.tenant.label(), l.first_overflow), (name.as_str(), false));
    }
    let first = reg.get("user100");
    assert_eq!((first.tenant.label(), first.first_overflow), (OTHER, true));
    let second = reg.get("user101");
    assert_eq!(
        (second.tenant.label(), second.first_overflow),
        (OTHER, false)
    );
    // One shared budget: the unlisted limits, for all overflow names together.
    assert!(Arc::ptr_eq(&first.tenant, &second.tenant));
    assert!(Arc::ptr_eq(&first.tenant, &reg.get("other").tenant));
    // Tracked names keep their own entry; a listed one is never `other`.
    assert!(Arc::ptr_eq(
        &reg.get("user7").tenant,
        &reg.get("user7").tenant
    ));
    assert_eq!(reg.get("user7").tenant.label(), "user7");
    let alice = reg.get("alice");
    assert_eq!(
        (alice.tenant.label(), alice.first_overflow),
        ("alice", false)
    );
    assert!(!reg.get("user102").first_overflow);
}

#[test]
fn other_is_reserved() {
    let listed = HashMap::from([(OTHER.to_owned(), Spec::default())]);
    let err = Tenants::new(listed, Spec::default(), DEFAULT_MAX_TRACKED, 1).unwrap_err();
    assert_eq!(err, ReservedName);
}

#[test]
fn a_tenant_without_limits_is_always_admitted_without_a_lock() {
    let t = tenant(Budget::default());
    let now = Instant::now();
    let guards: Vec<InFlight> = (0..10_000).map(|_| t.admit(|| now).unwrap()).collect();
    // The guards hold no reference to the tenant: admitting, charging and
    // dropping them touch no lock.
    assert_eq!(Arc::strong_count(&t), 1);
    for g in guards {
        g.charge(u64::MAX, || now);
    }
    admit_n(&t, 1, now);
}

#[test]
fn a_clock_read_before_another_requests_update_adds_nothing() {
    let t = tenant(rpm(60));
    let t0 = Instant::now();
    admit_n(&t, 60, t0 + SEC);
    // An earlier `now` neither refills nor moves the bucket's time back.
    assert_eq!(refusal(&t, t0), (Limit::RequestsPerMinute, 2 * SEC));
    admit_n(&t, 1, t0 + 2 * SEC);
}

#[test]
fn concurrent_admissions_never_exceed_the_limit() {
    let t = tenant(rpm(1000));
    let now = Instant::now();
    let admitted: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| (0..500).filter(|_| t.admit(|| now).is_ok()).count()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 1000);
}

#[test]
fn limit_names_and_message() {
    let names = [
        Limit::MaxInFlight,
        Limit::RequestsPerMinute,
        Limit::TokensPerMinute,
    ]
    .map(Limit::as_str);
    assert_eq!(
        names,
        ["max_in_flight", "requests_per_minute", "tokens_per_minute"]
    );
    let r = Refusal {
        limit: Limit::TokensPerMinute,
        retry_after: 1500 * MS,
    };
    assert_eq!(
        r.to_string(),
        "the tenant is over its tokens_per_minute: retry after 1.5s"
    );
}
