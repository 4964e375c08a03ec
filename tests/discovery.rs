//! Backends by DNS name: the gateway asks a DNS server the test runs on
//! loopback (`support::dns`) and follows its answers while serving. The
//! backends of one name share a port on different loopback IPs.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::dns::DnsServer;
use crate::support::gateway::{check_config, Conf};
use crate::support::{chat, eventually, get, header, FakeBackend, Gateway};
use hickory_proto::rr::RecordType;
use poimen_gateway::routing::rendezvous::rank;

const NAME: &str = "vllm.poimen.test";

fn loopback(a: u8, b: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, a, b))
}

/// Fake backends on `ips`, all on the port the first one got.
async fn backends_on(ips: &[IpAddr]) -> Vec<FakeBackend> {
    let first = FakeBackend::start_on(SocketAddr::new(ips[0], 0)).await;
    let port = first.addr.port();
    let mut all = vec![first];
    for ip in &ips[1..] {
        all.push(FakeBackend::start_on(SocketAddr::new(*ip, port)).await);
    }
    all
}

/// Gateway keys for model `m` at `NAME:port`, resolved by `dns` every
/// `refresh_secs`, with `extra` discovery keys.
fn config(dns: &DnsServer, port: u16, refresh_secs: f64, extra: &str) -> String {
    format!(
        "  discovery: {{refresh_secs: {refresh_secs}, nameservers: [\"{}\"]{extra}}}\n  models:\n    - name: m\n      addresses: [\"{NAME}:{port}\"]\n",
        dns.addr
    )
}

/// The backends `/health` lists for model `m`.
async fn members(gw: &Gateway) -> BTreeSet<SocketAddr> {
    let health: serde_json::Value = get(gw, "/health").await.json().await.unwrap();
    health["models"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["address"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// Wait until the gateway routes over exactly `want`.
async fn until_members(gw: &Gateway, want: &[SocketAddr]) {
    let want: BTreeSet<SocketAddr> = want.iter().copied().collect();
    eventually(&format!("backends {want:?}"), || async {
        members(gw).await == want
    })
    .await;
}

/// The rendezvous owner of `key` among `addrs` (weight 1 each).
fn owner(key: &str, addrs: &[SocketAddr]) -> SocketAddr {
    let mut sorted = addrs.to_vec();
    sorted.sort();
    let list: Vec<(String, u32)> = sorted.iter().map(|a| (a.to_string(), 1)).collect();
    sorted[rank(key.as_bytes(), &list)[0]]
}

/// Where the gateway sends each key now.
async fn placement(gw: &Gateway, keys: &[String]) -> HashMap<String, SocketAddr> {
    let mut out = HashMap::new();
    for k in keys {
        let resp = chat(gw, "m", Some(k)).await;
        assert_eq!(resp.status(), 200, "key {k}");
        out.insert(
            k.clone(),
            header(&resp, "X-Poimen-Backend").parse().unwrap(),
        );
    }
    out
}

/// Keyed requests from 4 clients until `stop` (at most 20,000): the count
/// sent and the count that failed.
fn load(gw: &Arc<Gateway>, stop: &Arc<AtomicBool>) -> tokio::task::JoinHandle<(usize, usize)> {
    let (gw, stop) = (gw.clone(), stop.clone());
    tokio::spawn(async move {
        let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let clients: Vec<_> = (0..4)
            .map(|c| {
                let (gw, stop, sent, failed) =
                    (gw.clone(), stop.clone(), sent.clone(), failed.clone());
                tokio::spawn(async move {
                    for i in 0..5000 {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let key = format!("load-{c}-{}", i % 50);
                        if chat(&gw, "m", Some(&key)).await.status() != 200 {
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                        sent.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
        (sent.load(Ordering::SeqCst), failed.load(Ordering::SeqCst))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn ips_added_and_removed_under_load_move_keys_as_the_hash_says() {
    let ips: Vec<IpAddr> = (11..=15).map(|i| loopback(0, i)).collect();
    let backends = backends_on(&ips).await;
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    let dns = DnsServer::start().await;
    dns.set(NAME, &ips[..4]);
    let gw = Arc::new(Gateway::start(&config(&dns, addrs[0].port(), 0.2, "")).await);
    let keys: Vec<String> = (0..200).map(|i| format!("session-{i}")).collect();

    let four = placement(&gw, &keys).await;
    for (k, at) in &four {
        assert_eq!(*at, owner(k, &addrs[..4]), "{k}");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let loader = load(&gw, &stop);

    // A fifth IP: about a fifth of the keys move, all to it.
    dns.set(NAME, &ips);
    until_members(&gw, &addrs).await;
    let five = placement(&gw, &keys).await;
    let moved: Vec<&String> = keys.iter().filter(|k| five[*k] != four[*k]).collect();
    for k in &moved {
        assert_eq!(five[*k], addrs[4], "{k} moved, to the new backend only");
    }
    for (k, at) in &five {
        assert_eq!(*at, owner(k, &addrs), "{k}");
    }
    assert!(
        (20..=60).contains(&moved.len()),
        "{} of 200 keys moved (about 40 expected)",
        moved.len()
    );

    // One of the first four goes: its keys go to their next choice, the
    // others stay.
    let gone = addrs[1];
    let left: Vec<SocketAddr> = addrs.iter().copied().filter(|a| *a != gone).collect();
    let left_ips: Vec<IpAddr> = left.iter().map(|a| a.ip()).collect();
    dns.set(NAME, &left_ips);
    until_members(&gw, &left).await;
    let four_again = placement(&gw, &keys).await;
    for k in &keys {
        if five[k] == gone {
            assert_eq!(four_again[k], owner(k, &left), "{k}: its next choice");
        } else {
            assert_eq!(four_again[k], five[k], "{k} stays");
        }
    }

    stop.store(true, Ordering::SeqCst);
    let (sent, failed) = loader.await.unwrap();
    assert_eq!(failed, 0, "{failed} of {sent} requests failed");
    assert!(sent >= 20, "only {sent} requests under load");
    assert!(backends[4].count() > 0 && backends[1].count() > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_lookup_keeps_the_last_set_counts_and_logs_once_per_change() {
    let ips = [loopback(0, 21), loopback(0, 22)];
    let backends = backends_on(&ips).await;
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    let mut dns = DnsServer::start().await;
    dns.set(NAME, &ips);
    // Refreshes 0.5 s apart (and lookups that may take as long), so that a
    // loaded machine does not fail a lookup the test did not mean to fail.
    let gw = Gateway::start(&config(&dns, addrs[0].port(), 0.5, "")).await;
    let errors = || gw.metric("poimen_gateway_discovery_errors_total", &[("model", "m")]);
    let events = |name: &str| gw.log_lines().iter().filter(|l| l["event"] == name).count();
    // Initialised to 0: present before the first failure.
    let text = gw.metrics_text().await;
    assert!(
        text.contains("poimen_gateway_discovery_errors_total{model=\"m\"} 0"),
        "{text}"
    );

    // SERVFAIL, then NXDOMAIN (an empty answer): the set stays, every
    // failed lookup counts, one warning in all.
    dns.servfail(true);
    eventually("3 failed lookups", || async { errors().await >= 3.0 }).await;
    dns.servfail(false);
    dns.set(NAME, &[]);
    let before = errors().await;
    eventually("3 more", || async { errors().await >= before + 3.0 }).await;
    assert_eq!(members(&gw).await, addrs.iter().copied().collect());
    for a in &addrs {
        let key = crate::support::key_owned_by(*a, &addrs);
        assert_eq!(
            header(&chat(&gw, "m", Some(&key)).await, "X-Poimen-Backend"),
            a.to_string()
        );
    }
    assert_eq!(events("discovery_failing"), 1);
    assert_eq!(events("discovery_recovered"), 0);

    // It answers again: one info line.
    dns.set(NAME, &ips);
    eventually("recovered", || async { events("discovery_recovered") == 1 }).await;

    // The server stops: the same again.
    dns.stop();
    let before = errors().await;
    eventually("failures counted", || async {
        errors().await >= before + 2.0
    })
    .await;
    assert_eq!(members(&gw).await, addrs.iter().copied().collect());
    assert_eq!(chat(&gw, "m", Some("k")).await.status(), 200);
    assert_eq!(events("discovery_failing"), 2);
    assert_eq!(events("discovery_recovered"), 1);
    let failing = gw
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "discovery_failing")
        .unwrap();
    assert_eq!(failing["level"], "WARN", "{failing}");
    assert_eq!(
        failing["field"], "gateway.models[0].addresses[0]",
        "{failing}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_query_for_one_family_keeps_that_familys_backends() {
    let ips = [loopback(0, 31), IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)];
    let backends = backends_on(&ips).await;
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    let dns = DnsServer::start().await;
    dns.set(NAME, &ips);
    let gw = Gateway::start(&config(&dns, addrs[0].port(), 0.5, "")).await;
    until_members(&gw, &addrs).await;
    let errors = || gw.metric("poimen_gateway_discovery_errors_total", &[("model", "m")]);
    // The AAAA query fails while the A query answers, then the reverse:
    // each round is a failed lookup, and neither family's backend leaves.
    for (failing, other) in [(RecordType::AAAA, addrs[0]), (RecordType::A, addrs[1])] {
        dns.servfail_to(&[failing]);
        let before = errors().await;
        eventually("2 failed lookups", || async {
            errors().await >= before + 2.0
        })
        .await;
        assert_eq!(members(&gw).await, addrs.iter().copied().collect());
        let key = crate::support::key_owned_by(other, &addrs);
        assert_eq!(
            header(&chat(&gw, "m", Some(&key)).await, "X-Poimen-Backend"),
            other.to_string()
        );
    }
    // A name with no AAAA record at all is not a failure: NODATA is an
    // empty family, and the IPv6 backend leaves.
    dns.servfail_to(&[]);
    dns.set(NAME, &ips[..1]);
    until_members(&gw, &addrs[..1]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_that_does_not_resolve_at_start_is_an_error_unless_allowed() {
    let dns = DnsServer::start().await;
    let backend = FakeBackend::start_on(SocketAddr::new(loopback(0, 25), 0)).await;
    let port = backend.addr.port();
    let field = format!("gateway.models[0].addresses[0] = \"{NAME}:{port}\": does not resolve");

    let refused = check_config(&format!("gateway:\n{}", config(&dns, port, 0.2, "")));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&field), "{stderr}");

    let allowed = config(&dns, port, 0.2, ", allow_unresolved: true");
    let checked = check_config(&format!("gateway:\n{allowed}"));
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(checked.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: ") && stderr.contains(&field),
        "{stderr}"
    );

    // The daemon refuses to start, naming the field.
    let conf = Conf::new(1);
    conf.write(&config(&dns, port, 0.2, ""));
    let status = conf.command(&[]).status().unwrap();
    assert_eq!(status.code(), Some(2));

    // Allowed: it starts with no backend, and serves once the name resolves.
    let gw = Gateway::start(&allowed).await;
    assert_eq!(chat(&gw, "m", Some("k")).await.status(), 503);
    dns.set(NAME, &[backend.addr.ip()]);
    until_members(&gw, &[backend.addr]).await;
    assert_eq!(chat(&gw, "m", Some("k")).await.status(), 200);
}

/// Series in the Prometheus text (lines that are not comments).
async fn series(gw: &Gateway) -> usize {
    gw.metrics_text()
        .await
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_changes_do_not_grow_the_metrics() {
    let stable = FakeBackend::start_on(SocketAddr::new(loopback(0, 31), 0)).await;
    let port = stable.addr.port();
    let dns = DnsServer::start().await;
    // The second backend changes each time (never connected to: no request
    // has its key), so each change adds a backend and removes one.
    let second = |i: u8| loopback(1, i);
    dns.set(NAME, &[stable.addr.ip(), second(0)]);
    let gw = Gateway::start(&config(&dns, port, 0.1, "")).await;
    let key = crate::support::key_owned_by(
        stable.addr,
        &[stable.addr, SocketAddr::new(second(0), port)],
    );
    assert_eq!(chat(&gw, "m", Some(&key)).await.status(), 200);
    // The request's series are written after its response: wait for them.
    let served = || async {
        let backend = stable.addr.to_string();
        let labels = [("backend", backend.as_str()), ("code", "200")];
        gw.metric("poimen_gateway_requests_total", &labels).await == 1.0
    };
    eventually("the request counted", served).await;
    let at_start = series(&gw).await;
    for i in 1..=100u8 {
        dns.set(NAME, &[stable.addr.ip(), second(i)]);
        until_members(&gw, &[stable.addr, SocketAddr::new(second(i), port)]).await;
    }
    // The last one removed goes at the next refresh if a request (here the
    // /health poll) still held the set it was in.
    eventually("as many series as at the start", || async {
        series(&gw).await == at_start
    })
    .await;
    let text = gw.metrics_text().await;
    assert!(
        !text.contains(&SocketAddr::new(second(99), port).to_string()),
        "{text}"
    );
    assert!(text.contains(&SocketAddr::new(second(100), port).to_string()));
    assert!(served().await, "the staying backend keeps its series");
}

#[tokio::test(flavor = "multi_thread")]
async fn localhost_and_a_port_resolves_from_the_system_configuration() {
    let v4 = FakeBackend::start_on("127.0.0.1:0".parse().unwrap()).await;
    let port = v4.addr.port();
    let v6 = FakeBackend::start_on(SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], port))).await;
    // No nameservers: /etc/hosts and the resolver's own answer for
    // localhost (RFC 6761), no DNS server asked.
    let gw = Gateway::start(&format!(
        "  models:\n    - name: m\n      address: \"localhost:{port}\"\n"
    ))
    .await;
    let both = [v4.addr, v6.addr];
    assert_eq!(members(&gw).await, both.iter().copied().collect());
    for a in both {
        let key = crate::support::key_owned_by(a, &both);
        let resp = chat(&gw, "m", Some(&key)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "X-Poimen-Backend"), a.to_string());
    }
    assert_eq!((v4.count(), v6.count()), (1, 1));
}

/// Requests holding a slot on `backend`, as the gateway reports them.
async fn inflight(gw: &Gateway, backend: SocketAddr) -> f64 {
    let backend = backend.to_string();
    gw.metric("poimen_gateway_in_flight", &[("backend", &backend)])
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_removed_backend_finishes_its_requests_then_its_series_go() {
    let ips = [loopback(0, 51), loopback(0, 52)];
    let backends = backends_on(&ips).await;
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    let dns = DnsServer::start().await;
    dns.set(NAME, &ips[..1]);
    let health = "  health_check: {interval_ms: 100}\n";
    let gw = Arc::new(
        Gateway::start(&format!(
            "{health}{}",
            config(&dns, addrs[0].port(), 0.1, "")
        ))
        .await,
    );

    // Added: routed to, and health-checked.
    dns.set(NAME, &ips);
    until_members(&gw, &addrs).await;
    eventually("a health check of the new backend", || async {
        backends[1].seen().iter().any(|s| s.path == "/health")
    })
    .await;

    // Removed with a request in flight: that request finishes there, new
    // ones go elsewhere, and its series stay until it is done.
    let key = crate::support::key_owned_by(addrs[1], &addrs);
    backends[1].set_delay(Duration::from_millis(1500));
    let slow = {
        let (gw, key) = (gw.clone(), key.clone());
        tokio::spawn(async move {
            let resp = chat(&gw, "m", Some(&key)).await;
            (resp.status().as_u16(), header(&resp, "X-Poimen-Backend"))
        })
    };
    eventually("the request in flight", || async {
        inflight(&gw, addrs[1]).await == 1.0
    })
    .await;
    dns.set(NAME, &ips[..1]);
    until_members(&gw, &addrs[..1]).await;
    assert_eq!(inflight(&gw, addrs[1]).await, 1.0, "still in flight");
    let resp = chat(&gw, "m", Some(&key)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "X-Poimen-Backend"), addrs[0].to_string());
    assert_eq!(slow.await.unwrap(), (200, addrs[1].to_string()));
    let gone = addrs[1].to_string();
    eventually("the removed backend's series gone", || async {
        !gw.metrics_text().await.contains(&gone)
    })
    .await;
}
