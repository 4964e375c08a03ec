//! `poimen-gateway route -c FILE --model M (--key K | --body FILE)`: the real
//! binary prints the order a request would try the model's backends, or
//! fails as `-t` does.

use std::net::SocketAddr;
use std::process::{Command, Output};

use poimen_gateway::api::Api;
use poimen_gateway::routing::prefix::{self, Head};
use poimen_gateway::routing::rendezvous::rank;

use crate::support::gateway::{temp_dir, BIN};

/// Model `m`'s backends as configured: unsorted, one weighted.
const BACKENDS: [(&str, u32); 4] = [
    ("10.0.0.3:8000", 1),
    ("10.0.0.1:8000", 1),
    ("10.0.0.2:8000", 2),
    ("10.0.0.4:8000", 1),
];

/// A config with model `m` (`BACKENDS`) and model `other`, under `routing`
/// (lines indented under `gateway:`).
fn yaml(routing: &str) -> String {
    let list: Vec<String> = BACKENDS
        .iter()
        .map(|(a, w)| format!("{{address: \"{a}\", weight: {w}}}"))
        .collect();
    format!(
        "threads: 1\ngateway:\n{routing}  models:\n    - name: m\n      addresses: [{}]\n    - name: other\n      address: \"127.0.0.1:9\"\n",
        list.join(", ")
    )
}

/// Run `poimen-gateway route -c <yaml in a file> ARGS [--body <body in a file>]`.
fn route(yaml: &str, body: Option<&str>, args: &[&str]) -> Output {
    let dir = temp_dir();
    let config = dir.join("gateway.yaml");
    std::fs::write(&config, yaml).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("route").arg("-c").arg(&config).args(args);
    if let Some(body) = body {
        let path = dir.join("body.json");
        std::fs::write(&path, body).unwrap();
        cmd.arg("--body").arg(path);
    }
    cmd.output().unwrap()
}

/// Its stdout, after checking that it succeeded.
fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Its stderr, after checking that it failed with exit code 2.
fn refused(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// The ranked lines (`rank address weight score note`) as (address, weight).
fn ranked(stdout: &str) -> Vec<(SocketAddr, u32)> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut t = l.split_whitespace();
            t.next()?.parse::<usize>().ok()?;
            Some((t.next()?.parse().ok()?, t.next()?.parse().ok()?))
        })
        .collect()
}

/// The documented ranking for `key`: rendezvous over the sorted addresses.
fn documented(key: &[u8]) -> Vec<(SocketAddr, u32)> {
    let mut sorted: Vec<(SocketAddr, u32)> = BACKENDS
        .iter()
        .map(|(a, w)| (a.parse().unwrap(), *w))
        .collect();
    sorted.sort();
    let hashed: Vec<(String, u32)> = sorted.iter().map(|(a, w)| (a.to_string(), *w)).collect();
    rank(key, &hashed).into_iter().map(|i| sorted[i]).collect()
}

#[test]
fn a_key_lists_the_backends_in_the_documented_order() {
    let orders: Vec<_> = ["session-1", "session-2", "session-42"]
        .into_iter()
        .map(|key| {
            let out = stdout(&route(&yaml(""), None, &["--model", "m", "--key", key]));
            assert!(out.contains(&format!("key {key:?}")), "{out}");
            assert_eq!(ranked(&out), documented(key.as_bytes()), "{out}");
            assert_eq!(out.matches("chosen").count(), 1, "{out}");
            assert_eq!(out.matches("next if the ones above fail").count(), 3);
            ranked(&out)
        })
        .collect();
    // Different keys, different orders: a listing would not pass.
    assert!(orders.iter().any(|o| *o != orders[0]), "{orders:?}");
}

#[test]
fn a_body_is_ranked_by_its_derived_key() {
    let prefix_routing = yaml("  routing: {keyless: prefix}\n");
    let chat = r#"{"messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"hi"}],"model":"m"}"#;
    let key =
        prefix::of_body(Api::ChatCompletions, chat.as_bytes(), Head::FirstUser, 2048).unwrap();
    let out = stdout(&route(&prefix_routing, Some(chat), &["--model", "m"]));
    assert!(out.contains(key.as_str()), "{out}");
    assert_eq!(ranked(&out), documented(key.as_bytes()), "{out}");

    let completion = r#"{"prompt":"Once upon a time","model":"m"}"#;
    let key = prefix::of_body(
        Api::Completions,
        completion.as_bytes(),
        Head::FirstUser,
        2048,
    )
    .unwrap();
    let args = ["--model", "m", "--path", "/v1/completions"];
    let out = stdout(&route(&prefix_routing, Some(completion), &args));
    assert_eq!(ranked(&out), documented(key.as_bytes()), "{out}");

    // The daemon derives no key under the default keyless: round_robin.
    let out = stdout(&route(&yaml(""), Some(chat), &["--model", "m"]));
    assert!(out.contains("round-robin"), "{out}");
    assert!(ranked(&out).is_empty(), "{out}");
}

#[test]
fn an_alias_is_explained_as_the_model_it_names() {
    let aliased = yaml("").replace(
        "    - name: other\n",
        "    - name: other\n      aliases: [\"claude-*\"]\n",
    );
    let out = stdout(&route(
        &aliased,
        None,
        &["--model", "claude-x", "--key", "k"],
    ));
    assert!(out.starts_with("model other, key \"k\""), "{out}");
    assert!(out.contains("127.0.0.1:9"), "{out}");
}

#[test]
fn an_unknown_model_is_refused_naming_the_configured_ones() {
    let err = refused(&route(&yaml(""), None, &["--model", "nope", "--key", "k"]));
    assert!(err.starts_with("poimen-gateway: "), "{err}");
    assert!(
        err.contains(r#"model "nope" is not configured; models: ["m", "other"]"#),
        "{err}"
    );
}

#[test]
fn a_bad_config_is_refused_naming_the_field() {
    let bad = yaml("").replace("weight: 2", "weight: 0");
    let err = refused(&route(&bad, None, &["--model", "m", "--key", "k"]));
    assert!(err.starts_with("poimen-gateway: /"), "{err}");
    assert!(
        err.contains(
            "gateway.yaml: gateway.models[0].addresses[2].weight = 0: must be between 1 and 1000"
        ),
        "{err}"
    );
    // Pingora's keys are checked as by -t.
    let bad = yaml("").replace("threads: 1", "threads: many");
    let err = refused(&route(&bad, None, &["--model", "m", "--key", "k"]));
    assert!(err.contains("threads"), "{err}");
}

#[test]
fn without_a_key_or_a_body_it_prints_the_usage() {
    for args in [
        &["--model", "m"][..],
        &["--model", "m", "--key", "k", "--body", "b.json"],
        &["--model", "m", "--key"],
    ] {
        let err = refused(&route(&yaml(""), None, args));
        assert!(err.starts_with("poimen-gateway route: "), "{err}");
        assert!(err.contains("usage: poimen-gateway route -c FILE"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dns_name_is_resolved_as_the_daemon_resolves_it() {
    let dns = crate::support::dns::DnsServer::start().await;
    let ips = ["127.0.0.43", "127.0.0.41", "127.0.0.42"].map(|ip| ip.parse().unwrap());
    dns.set("vllm.poimen.test", &ips);
    let yaml = format!(
        "threads: 1\ngateway:\n  discovery: {{nameservers: [\"{}\"]}}\n  models:\n    - name: m\n      addresses: [\"vllm.poimen.test:8000\", {{address: \"10.0.0.9:8000\", weight: 2}}]\n",
        dns.addr
    );
    // `route` blocks this thread; the DNS server answers on another.
    let out = stdout(&route(
        &yaml,
        None,
        &["--model", "m", "--key", "session-42"],
    ));
    assert!(
        out.contains(
            "vllm.poimen.test:8000 resolves to 127.0.0.41:8000, 127.0.0.42:8000, 127.0.0.43:8000"
        ),
        "{out}"
    );
    let mut members: Vec<(SocketAddr, u32)> =
        ["127.0.0.41:8000", "127.0.0.42:8000", "127.0.0.43:8000"]
            .iter()
            .map(|a| (a.parse().unwrap(), 1))
            .chain([("10.0.0.9:8000".parse().unwrap(), 2)])
            .collect();
    members.sort();
    let hashed: Vec<(String, u32)> = members.iter().map(|(a, w)| (a.to_string(), *w)).collect();
    let want: Vec<(SocketAddr, u32)> = rank(b"session-42", &hashed)
        .into_iter()
        .map(|i| members[i])
        .collect();
    assert_eq!(ranked(&out), want, "{out}");

    // A name that does not resolve: refused as by -t, or a warning.
    let unknown = yaml.replace("vllm.poimen.test:8000", "nowhere.poimen.test:8000");
    let err = refused(&route(&unknown, None, &["--model", "m", "--key", "k"]));
    assert!(
        err.contains(
            r#"gateway.models[0].addresses[0] = "nowhere.poimen.test:8000": does not resolve"#
        ),
        "{err}"
    );
    let allowed = unknown.replace("{nameservers", "{allow_unresolved: true, nameservers");
    let out = route(&allowed, None, &["--model", "m", "--key", "k"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning: "));
    let out = stdout(&out);
    assert!(
        out.contains("nowhere.poimen.test:8000 resolves to nothing yet"),
        "{out}"
    );
    assert_eq!(
        ranked(&out),
        [("10.0.0.9:8000".parse().unwrap(), 2)],
        "{out}"
    );
}
