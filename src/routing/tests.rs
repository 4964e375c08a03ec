use std::collections::HashMap;

use super::*;

fn router(n: u16) -> Router {
    let members = (0..n).map(|i| (SocketAddr::from(([127, 0, 0, 1], 9000 + i)), 1));
    Router::new(&Policy::default(), members)
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
    let b = Router::new(&Policy::default(), reversed);
    assert_same_ranking(&a, &b, 100);
}

/// Without load, `a` and `b` rank `n` keys alike.
fn assert_same_ranking(a: &Router, b: &Router, n: usize) {
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
    let r = Router::new(&Policy::default(), members);
    let heavy = (0..400)
        .filter(|_| {
            r.rank(Request::new(Affinity::None, &[]), idle).unwrap()[0].addr == members[1].0
        })
        .count();
    assert_eq!(heavy, 300);
}

fn bounded(n: u16, factor: f64) -> Router {
    let policy = Policy {
        balance_factor: Some(factor),
        ..Policy::default()
    };
    let members = (0..n).map(|i| (SocketAddr::from(([127, 0, 0, 1], 9000 + i)), 1));
    Router::new(&policy, members)
}

/// The backends in `key`'s order without load.
fn ranking(r: &Router, key: &[u8]) -> Vec<SocketAddr> {
    let c = r.rank(Request::new(Affinity::Key(key), &[]), idle).unwrap();
    c.iter().map(|c| c.addr).collect()
}

/// Route `n` requests of `key` in a row, each adding to the load of the
/// backend it lands on, every backend having `slots` slots; returns
/// (backend position in the key's ranking, route) per request.
fn pile(r: &Router, key: &[u8], n: usize, slots: usize) -> Vec<(usize, Route)> {
    let ranking = ranking(r, key);
    let mut load: HashMap<SocketAddr, usize> = HashMap::new();
    (0..n)
        .map(|_| {
            let c = r
                .rank(Request::new(Affinity::Key(key), &[]), |a| Facts {
                    excluded: false,
                    load: load.get(a).copied().unwrap_or(0),
                    slots,
                    cached_tokens: 0,
                })
                .unwrap()[0];
            *load.entry(c.addr).or_default() += 1;
            (ranking.iter().position(|a| *a == c.addr).unwrap(), c.route)
        })
        .collect()
}

#[test]
fn a_hot_keys_excess_moves_down_its_ranking() {
    use Route::{Balance, Hash};
    let r = bounded(3, 1.25);
    // Caps with 3 backends at factor 1.25: L=0 -> 1, L=1 -> 1, L=2 -> 2,
    // L=3 -> 2, L=4 -> 3, L=5 -> 3, L=6 -> 3.
    assert_eq!(
        pile(&r, b"hot", 7, 0),
        [
            (0, Hash),
            (1, Balance),
            (0, Hash),
            (1, Balance),
            (0, Hash),
            (1, Balance),
            (2, Balance)
        ]
    );
}

#[test]
fn a_backend_with_a_free_slot_is_never_passed_over() {
    use Route::{Balance, Hash};
    let r = bounded(3, 1.25);
    // Same caps as above, but a backend below its 2 slots keeps the key:
    // the second request stays (cap 1, a slot free), the third moves (cap
    // 2, slots full), the fifth stays (cap 3).
    assert_eq!(
        pile(&r, b"hot", 7, 2),
        [
            (0, Hash),
            (0, Hash),
            (1, Balance),
            (1, Balance),
            (0, Hash),
            (1, Balance),
            (2, Balance)
        ]
    );
    // 4 slots: the owner takes 4 before anything moves.
    let piled = pile(&r, b"hot", 6, 4);
    assert_eq!(piled[..4], [(0, Hash); 4]);
    assert_eq!(piled[4..], [(1, Balance); 2]);
}

#[test]
fn without_load_bounded_is_pure_rendezvous() {
    assert_same_ranking(&router(5), &bounded(5, 1.25), 500);
}

#[test]
fn other_keys_stay_put_while_a_hot_key_spreads() {
    let r = bounded(3, 1.25);
    let first = |k: &str| {
        r.rank(Request::new(Affinity::Key(k.as_bytes()), &[]), idle)
            .unwrap()[0]
            .addr
    };
    let hot = first("hot");
    // Two on the hot key's owner and two on its runner-up: L = 4, cap 3.
    let runner_up = r
        .rank(Request::new(Affinity::Key(b"hot"), &[]), idle)
        .unwrap()[1]
        .addr;
    let loaded = |a: &SocketAddr| Facts {
        excluded: false,
        load: if *a == hot || *a == runner_up { 2 } else { 0 },
        ..Facts::default()
    };
    for k in 0..200 {
        let key = format!("cold-{k}");
        let c = r
            .rank(Request::new(Affinity::Key(key.as_bytes()), &[]), loaded)
            .unwrap()[0];
        assert_eq!((c.addr, c.route), (first(&key), Route::Hash), "{key}");
    }
}

#[test]
fn an_excluded_backend_leaves_the_weight_sum_and_counts_as_fallback() {
    let r = bounded(3, 1.25);
    let order = ranking(&r, b"k");
    // The owner excluded, two requests on the runner-up: L = 2, W = 2, the
    // runner-up's cap is ceil(1.25 * 3 / 2) = 2: full, so the third.
    let status = |a: &SocketAddr| Facts {
        excluded: *a == order[0],
        load: if *a == order[1] { 2 } else { 0 },
        ..Facts::default()
    };
    let c = r
        .rank(Request::new(Affinity::Key(b"k"), &[]), status)
        .unwrap();
    assert_eq!((c[0].addr, c[0].route), (order[2], Route::Balance));
    // One request there: under its cap of 2, a plain fallback.
    let status = |a: &SocketAddr| Facts {
        excluded: *a == order[0],
        load: usize::from(*a == order[1]),
        ..Facts::default()
    };
    let c = r
        .rank(Request::new(Affinity::Key(b"k"), &[]), status)
        .unwrap();
    assert_eq!((c[0].addr, c[0].route), (order[1], Route::Fallback));
}

#[test]
fn keyless_requests_are_not_bounded_and_derived_keys_route_as_prefix() {
    let r = bounded(3, 1.25);
    let busy = |_: &SocketAddr| Facts {
        excluded: false,
        load: 100,
        ..Facts::default()
    };
    assert_eq!(
        r.rank(Request::new(Affinity::None, &[]), busy).unwrap()[0].route,
        Route::RoundRobin
    );
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

#[test]
fn a_fixed_request_is_never_diverted_for_balance() {
    let r = bounded(3, 1.25);
    let owner = r
        .rank(Request::new(Affinity::Key(b"k"), &[]), idle)
        .unwrap()[0]
        .addr;
    let busy = |a: &SocketAddr| Facts {
        excluded: false,
        load: if *a == owner { 5 } else { 0 },
        ..Facts::default()
    };
    let agent = r
        .rank(Request::new(Affinity::Key(b"k"), &[]), busy)
        .unwrap();
    assert_eq!(agent[0].route, Route::Balance);
    let fixed = Request {
        balance: Balance::Fixed,
        ..Request::new(Affinity::Key(b"k"), &[])
    };
    let c = r.rank(fixed, busy).unwrap();
    assert_eq!((c[0].addr, c[0].route), (owner, Route::Hash));
}

#[test]
fn a_moved_conversation_stays_while_its_new_backend_is_under_its_cap() {
    let r = bounded(3, 1.25);
    let order = ranking(&r, b"k");
    let moved = |to: SocketAddr| Request {
        balance: Balance::Movable { moved_to: Some(to) },
        ..Request::new(Affinity::Key(b"k"), &[])
    };
    let first = |req: Request, status: &dyn Fn(&SocketAddr) -> Facts| {
        let c = r.rank(req, status).unwrap()[0];
        (c.addr, c.route)
    };
    // Moved to the third: it stays there, its first choice idle or not.
    assert_eq!(first(moved(order[2]), &idle), (order[2], Route::Balance));
    // Loads 1, 1, 2 (L = 4, caps 3): still under its cap.
    let order = &order;
    let loads = |l: [usize; 3]| {
        move |a: &SocketAddr| Facts {
            load: l[order.iter().position(|o| o == a).unwrap()],
            ..Facts::default()
        }
    };
    assert_eq!(
        first(moved(order[2]), &loads([1, 1, 2])),
        (order[2], Route::Balance)
    );
    // At its cap (1, 0, 3: L = 4, caps 3): the walk from the top.
    assert_eq!(
        first(moved(order[2]), &loads([1, 0, 3])),
        (order[0], Route::Hash)
    );
    // Moved to its first choice: just the first choice.
    assert_eq!(first(moved(order[0]), &idle), (order[0], Route::Hash));
    // Excluded or tried: passed over as any other.
    let excluded = |a: &SocketAddr| Facts {
        excluded: *a == order[2],
        ..Facts::default()
    };
    assert_eq!(first(moved(order[2]), &excluded), (order[0], Route::Hash));
    let tried = [order[2]];
    let retry = Request {
        tried: &tried,
        ..moved(order[2])
    };
    assert_eq!(first(retry, &idle), (order[0], Route::Fallback));
    // Not bounded, or fixed: a move is not followed.
    let pure = router(3);
    let c = pure.rank(moved(order[2]), idle).unwrap()[0];
    assert_eq!((c.addr, c.route), (order[0], Route::Hash));
    let fixed = Request {
        balance: Balance::Fixed,
        ..moved(order[2])
    };
    assert_eq!(first(fixed, &idle), (order[0], Route::Hash));
}

#[test]
fn a_conversation_is_known_only_under_bounded_load_and_lasts_across_turns() {
    const CHAT: Api = Api::ChatCompletions;
    let body = |turns: &[&str]| {
        let mut messages = vec![serde_json::json!({"role": "system", "content": "memory"})];
        for (i, t) in turns.iter().enumerate() {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            messages.push(serde_json::json!({"role": role, "content": t}));
        }
        serde_json::json!({"model": "m", "messages": messages}).to_string()
    };
    let policy = Policy {
        balance_factor: Some(1.25),
        ..Policy::default()
    };
    let of = |key: &[u8], turns: &[&str]| policy.conversation(key, CHAT, body(turns).as_bytes());
    assert_eq!(
        Policy::default().conversation(b"k", CHAT, body(&["q"]).as_bytes()),
        None
    );
    let first = of(b"k", &["q"]);
    assert!(first.is_some());
    assert_eq!(of(b"k", &["q", "a", "q2"]), first);
    assert_ne!(of(b"k", &["other"]), first);
    assert_ne!(of(b"j", &["q"]), first);
    // No head (another endpoint): the key alone.
    assert_eq!(
        policy.conversation(b"k", Api::Engine, b"{}"),
        Some(moves::conversation(b"k", None))
    );
}
