use std::collections::HashMap;

use super::*;

fn router(n: u16) -> RoutingTable {
    let members = (0..n).map(|i| (SocketAddr::from(([127, 0, 0, 1], 9000 + i)), 1));
    RoutingTable::new(&Policy::default(), members)
}

fn idle(_: &SocketAddr) -> Facts {
    Facts::default()
}

fn routes(c: &[Candidate]) -> Vec<Route> {
    c.iter().map(|c| c.route).collect()
}

#[test]
fn a_key_is_stable_and_hash_routed_with_the_rest_as_spill() {
    let r = router(4);
    let first = r
        .rank(Request::new(Affinity::Key(b"k1"), &[]), idle)
        .unwrap();
    assert_eq!(
        routes(&first),
        [Route::Hash, Route::Spill, Route::Spill, Route::Spill]
    );
    for _ in 0..10 {
        assert_eq!(
            r.rank(Request::new(Affinity::Key(b"k1"), &[]), idle)
                .unwrap(),
            first
        );
    }
    // The order is the documented rendezvous ranking.
    let expect: Vec<SocketAddr> = rendezvous::rank(b"k1", &r.keyed)
        .into_iter()
        .map(|i| r.addrs()[i])
        .collect();
    let got: Vec<SocketAddr> = first.iter().map(|c| c.addr).collect();
    assert_eq!(got, expect);
}

#[test]
fn the_member_order_does_not_matter() {
    let a = router(4);
    let reversed: Vec<(SocketAddr, u32)> = a.addrs().iter().rev().map(|a| (*a, 1)).collect();
    let b = RoutingTable::new(&Policy::default(), reversed);
    assert_same_ranking(&a, &b, 100);
}

/// Without load, `a` and `b` rank `n` keys alike.
fn assert_same_ranking(a: &RoutingTable, b: &RoutingTable, n: usize) {
    for k in 0..n {
        let key = format!("key-{k}");
        let req = Request::new(Affinity::Key(key.as_bytes()), &[]);
        assert_eq!(a.rank(req, idle), b.rank(req, idle), "{key}");
    }
}

#[test]
fn an_excluded_or_tried_backend_is_passed_over_as_fallback() {
    let r = router(3);
    let order = r
        .rank(Request::new(Affinity::Key(b"k"), &[]), idle)
        .unwrap();
    let (first, second, third) = (order[0].addr, order[1].addr, order[2].addr);
    let excluded = |a: &SocketAddr| Facts {
        excluded: *a == first,
        load: 0,
        ..Facts::default()
    };
    let fb = r
        .rank(Request::new(Affinity::Key(b"k"), &[]), excluded)
        .unwrap();
    assert_eq!(
        fb,
        [
            Candidate {
                addr: second,
                route: Route::Fallback
            },
            Candidate {
                addr: third,
                route: Route::Spill
            }
        ]
    );
    // A retry after a failure on the first: the same, without exclusion.
    assert_eq!(
        r.rank(Request::new(Affinity::Key(b"k"), &[first]), idle)
            .unwrap(),
        fb
    );
    let last = r
        .rank(Request::new(Affinity::Key(b"k"), &[first, second]), idle)
        .unwrap();
    assert_eq!(
        last,
        [Candidate {
            addr: third,
            route: Route::Fallback
        }]
    );
    assert_eq!(
        r.rank(
            Request::new(Affinity::Key(b"k"), &[first, second, third]),
            idle
        ),
        None
    );
    assert_eq!(
        r.rank(Request::new(Affinity::Key(b"k"), &[]), |_| Facts {
            excluded: true,
            ..Facts::default()
        }),
        None
    );
}

#[test]
fn a_backend_that_does_not_serve_the_name_is_passed_over_without_a_fallback() {
    let r = router(3);
    for k in 0..30 {
        let key = format!("k{k}");
        for affinity in [Affinity::Key(key.as_bytes()), Affinity::None] {
            let order = r.rank(Request::new(affinity, &[]), idle).unwrap();
            let only = order[2].addr;
            let served = |a: &SocketAddr| Facts {
                absent: *a != only,
                ..Facts::default()
            };
            let c = r.rank(Request::new(affinity, &[]), served).unwrap();
            let preferred = match affinity {
                Affinity::None => Route::RoundRobin,
                _ => Route::Hash,
            };
            assert_eq!(
                c,
                [Candidate {
                    addr: only,
                    route: preferred
                }],
                "{key}"
            );
            // The one member that serves it excluded: none is left.
            let failed = |a: &SocketAddr| Facts {
                excluded: *a == only,
                ..served(a)
            };
            assert_eq!(r.rank(Request::new(affinity, &[]), failed), None);
        }
    }
}

#[test]
fn round_robin_spreads_evenly_and_falls_back_in_turn() {
    let r = router(3);
    let mut counts: HashMap<SocketAddr, usize> = HashMap::new();
    for _ in 0..300 {
        let c = r.rank(Request::new(Affinity::None, &[]), idle).unwrap();
        assert_eq!(routes(&c), [Route::RoundRobin, Route::Spill, Route::Spill]);
        *counts.entry(c[0].addr).or_default() += 1;
    }
    assert!(counts.values().all(|c| *c == 100), "{counts:?}");
    // Its turn's backend excluded: the next one, as a fallback.
    let turn = r.addrs()[0];
    let c = r
        .rank(Request::new(Affinity::None, &[]), |a| Facts {
            excluded: *a == turn,
            load: 0,
            ..Facts::default()
        })
        .unwrap();
    assert_eq!(c[0].route, Route::Fallback);
    assert_ne!(c[0].addr, turn);
}

#[test]
fn weights_shift_the_round_robin_share() {
    let members = [
        (SocketAddr::from(([127, 0, 0, 1], 1)), 1),
        (SocketAddr::from(([127, 0, 0, 1], 2)), 3),
    ];
    let r = RoutingTable::new(&Policy::default(), members);
    let heavy = (0..400)
        .filter(|_| {
            r.rank(Request::new(Affinity::None, &[]), idle).unwrap()[0].addr == members[1].0
        })
        .count();
    assert_eq!(heavy, 300);
}

#[test]
fn derived_keys_rank_as_the_same_key_would_and_route_as_prefix() {
    let r = router(3);
    let derived = r
        .rank(
            Request::new(Affinity::Derived(b"0123456789abcdef"), &[]),
            idle,
        )
        .unwrap();
    let keyed = r
        .rank(Request::new(Affinity::Key(b"0123456789abcdef"), &[]), idle)
        .unwrap();
    assert_eq!(derived[0].route, Route::Prefix);
    assert_eq!(derived[0].addr, keyed[0].addr);
}

fn cost_router(n: u16) -> RoutingTable {
    let policy = Policy {
        prefix_index: Some(IndexSize {
            backend_blocks: 1000,
            max_blocks: 10_000,
        }),
        ..Policy::default()
    };
    let members = (0..n).map(|i| (SocketAddr::from(([127, 0, 0, 1], 9000 + i)), 1));
    RoutingTable::new(&policy, members)
}

#[test]
fn the_cost_rule_reads_the_first_of_the_order_and_the_holders_only() {
    let r = cost_router(64);
    let mut req = Request::new(Affinity::Key(b"k"), &[]);
    req.prompt_tokens = 4096;
    let order: Vec<usize> = rendezvous::rank(b"k", &r.keyed);
    // The conversation's prefix is on the 40th of the order, busy beside
    // idle others: it stays there.
    let holder = order[40];
    let holders = [holder];
    req.holders = &holders;
    let read = std::cell::RefCell::new(Vec::new());
    let facts = |m: usize| {
        read.borrow_mut().push(m);
        Facts {
            load: usize::from(m == holder),
            slots: 4,
            cached_tokens: if m == holder { 4096 } else { 0 },
            ..Facts::default()
        }
    };
    let ranking = r.rank_at(req, facts).unwrap();
    assert_eq!(ranking.first.addr, r.addrs()[holder]);
    assert_eq!(ranking.first.route, Route::Cache);
    let mut weighed = order[..WEIGHED].to_vec();
    weighed.push(holder);
    assert_eq!(*read.borrow(), weighed);
    // Every usable member is still a candidate, read as it is reached.
    let all: Vec<Candidate> = r.candidates(&ranking, &[], facts).collect();
    assert_eq!(all.len(), 64);
    assert_eq!(all[1].addr, r.addrs()[order[0]]);
    assert!(all[1..].iter().all(|c| c.route == Route::Spill));
}

#[test]
fn the_cost_rule_passes_over_excluded_members_to_the_next_usable() {
    let r = cost_router(20);
    let order: Vec<usize> = rendezvous::rank(b"k", &r.keyed);
    // The first 10 of the order excluded, the next ones loaded but one.
    let idle = order[14];
    let facts = |m: usize| {
        let place = order.iter().position(|o| *o == m).unwrap();
        Facts {
            excluded: place < 10,
            load: if m == idle { 0 } else { 3 },
            slots: 4,
            ..Facts::default()
        }
    };
    let mut req = Request::new(Affinity::Key(b"k"), &[]);
    req.prompt_tokens = 4096;
    let ranking = r.rank_at(req, facts).unwrap();
    assert_eq!(ranking.first.addr, r.addrs()[idle]);
    let all: Vec<Candidate> = r.candidates(&ranking, &[], facts).collect();
    assert_eq!(all.len(), 10);
}

#[test]
fn keys_take_equally_busy_backends_in_turn_and_idle_ones_by_hash() {
    let r = cost_router(4);
    let rank = |key: &[u8], load: usize| {
        let mut req = Request::new(Affinity::Key(key), &[]);
        req.prompt_tokens = 4096;
        let facts = |_: usize| Facts {
            load,
            slots: 4,
            ..Facts::default()
        };
        r.rank_at(req, facts).unwrap().chosen
    };
    // Idle: each key's rendezvous first, whatever the turn.
    for key in [&b"a"[..], b"b", b"c"] {
        let first = rendezvous::rank(key, &r.keyed)[0];
        assert_eq!((rank(key, 0), rank(key, 0)), (first, first));
    }
    // Equally busy: one key's new conversations go round the backends.
    let mut chosen: Vec<usize> = (0..8).map(|_| rank(b"a", 1)).collect();
    assert_ne!(chosen[0], chosen[1]);
    chosen.sort_unstable();
    assert_eq!(chosen, [0, 0, 1, 1, 2, 2, 3, 3]);
}
