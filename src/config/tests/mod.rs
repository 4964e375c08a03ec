//! The config's tests: loading and checks (here), every key held to the
//! shipped example and the docs (`keys/`), TLS settings (`tls.rs`).

mod keys;
mod tls;

use std::net::SocketAddr;
use std::time::Duration;

use super::*;
use crate::admission::{Capacity, Fleet};
use crate::routing::{Keyless, Policy};

pub(super) fn err(yaml: &str) -> String {
    GatewayConfig::from_yaml(yaml).unwrap_err().to_string()
}

#[test]
fn defaults_and_both_address_forms() {
    let c = GatewayConfig::from_yaml(
        r#"
threads: 2
gateway:
  models:
    - name: a
      address: "127.0.0.1:8000"
    - name: b
      addresses: ["127.0.0.1:8001", {address: "127.0.0.1:8002", weight: 3}]
"#,
    )
    .unwrap();
    let listen: Vec<SocketAddr> = c.listen.iter().map(|l| l.addr).collect();
    assert_eq!(listen, vec!["0.0.0.0:8080".parse().unwrap()]);
    assert!(c.listen[0].tls.is_none());
    assert_eq!(c.upstream_ca_file, None);
    assert_eq!(c.metrics_listen, "127.0.0.1:9091".parse().unwrap());
    assert_eq!(c.failure_exclusion, Duration::from_secs(30));
    assert_eq!(c.max_request_body_bytes, 32 << 20);
    assert_eq!(c.connect_timeout, Duration::from_millis(2000));
    assert_eq!(c.models[0].backends.len(), 1);
    assert_eq!(
        c.models[1].backends,
        vec![
            BackendConfig {
                target: Target::Addr("127.0.0.1:8001".parse().unwrap()),
                weight: 1,
                tls: None,
                field: "gateway.models[1].addresses[0]".into(),
            },
            BackendConfig {
                target: Target::Addr("127.0.0.1:8002".parse().unwrap()),
                weight: 3,
                tls: None,
                field: "gateway.models[1].addresses[1]".into(),
            },
        ]
    );
    assert_eq!(
        c.discovery,
        DiscoveryConfig {
            refresh: Duration::from_secs(10),
            nameservers: vec![],
            allow_unresolved: false,
        }
    );
}

#[test]
fn an_address_may_be_a_dns_name_and_port() {
    let c = GatewayConfig::from_yaml(
        r#"
gateway:
  discovery: {refresh_secs: 0.5, nameservers: ["127.0.0.1:5353", "[::1]:53"], allow_unresolved: true}
  models:
    - name: a
      addresses: ["localhost:8000", {address: "vllm-0.vllm.default.svc.cluster.local.:8000", weight: 2}, "[::1]:8000", "gpu_1:9"]
"#,
    )
    .unwrap();
    let targets: Vec<(String, u32)> = c.models[0]
        .backends
        .iter()
        .map(|b| (format!("{:?}", b.target), b.weight))
        .collect();
    assert_eq!(
        targets,
        [
            (r#"Name { host: "localhost", port: 8000 }"#.into(), 1),
            (
                r#"Name { host: "vllm-0.vllm.default.svc.cluster.local.", port: 8000 }"#.into(),
                2
            ),
            ("Addr([::1]:8000)".into(), 1),
            (r#"Name { host: "gpu_1", port: 9 }"#.into(), 1),
        ]
    );
    assert!(c.models[0].uses_names());
    assert_eq!(c.discovery.refresh, Duration::from_millis(500));
    assert_eq!(c.discovery.nameservers.len(), 2);
    assert!(c.discovery.allow_unresolved);
    let literal = GatewayConfig::from_yaml(MINIMAL).unwrap();
    assert!(!literal.models[0].uses_names());
}

#[test]
fn what_is_not_a_name_and_port_is_refused_naming_the_field() {
    let long = format!("{}:80", vec!["a".repeat(63); 5].join("."));
    for bad in [
        "localhost",
        "localhost:",
        "localhost:0",
        "localhost:65536",
        ":80",
        "300.1.1.1:80",
        "a..b:80",
        "-:80",
        "bad host:80",
        "::1:80",
        &long,
        &format!("{}:80", "a".repeat(64)),
    ] {
        let yaml =
            format!("gateway:\n  models: [{{name: m, addresses: [\"127.0.0.1:1\", \"{bad}\"]}}]\n");
        let got = err(&yaml);
        let want = format!(
            "gateway.models[0].addresses[1] = {bad:?}: not host:port (an IP address or a DNS name, and a port)"
        );
        assert_eq!(got, want, "{bad}");
    }
    for (yaml, want) in [
        (
            "  discovery: {refresh_secs: 0}\n",
            "gateway.discovery.refresh_secs = 0.0: must be between 0.1 and 3600",
        ),
        (
            "  discovery: {nameservers: [\"dns.local:53\"]}\n",
            "gateway.discovery.nameservers[0] = \"dns.local:53\": not host:port",
        ),
        ("  discovery: {ttl: 3}\n", "unknown field `ttl`"),
    ] {
        let got = err(&format!(
            "gateway:\n{yaml}  models: [{{name: m, address: \"h:1\"}}]\n"
        ));
        assert!(got.contains(want), "got: {got}\nwant: {want}");
    }
    assert!(
        err("gateway:\n  models: [{name: m, addresses: [\"h:1\", \"h:1\"]}]\n")
            .contains("duplicate address")
    );
}

#[test]
fn listen_accepts_a_list() {
    let c = GatewayConfig::from_yaml(
        "gateway:\n  listen: [\"127.0.0.1:1\", \"[::1]:2\"]\n  models: [{name: m, address: \"127.0.0.1:3\"}]\n",
    )
    .unwrap();
    assert_eq!(c.listen.len(), 2);
}

#[test]
fn errors_name_the_field_and_value() {
    let cases = [
        (
            "gateway:\n  models: [{name: m, address: \"x\"}]\n",
            "gateway.models[0].addresses[0] = \"x\": not host:port",
        ),
        (
            "gateway:\n  models: [{name: m, adress: \"127.0.0.1:1\"}]\n",
            "unknown field `adress`",
        ),
        (
            "gateway:\n  models: [{name: m, address: \"127.0.0.1:1\", addresses: [\"127.0.0.1:2\"]}]\n",
            "gateway.models[0] = \"m\": set either `address` or `addresses`, not both",
        ),
        (
            "gateway:\n  models: [{name: m, addresses: []}]\n",
            "gateway.models[0].addresses = \"[]\": needs at least one address",
        ),
        (
            "gateway:\n  models: [{name: m}]\n",
            "gateway.models[0] = \"m\": needs `address` or `addresses`",
        ),
        (
            "gateway:\n  models: [{name: m, address: \"127.0.0.1:1\"}, {name: m, address: \"127.0.0.1:2\"}]\n",
            "gateway.models[1].name = \"m\": duplicate model name",
        ),
        (
            "gateway:\n  models: [{name: m, address: \"127.0.0.1:1\"}, {name: n, address: \"127.0.0.1:2\", aliases: [\"claude-*\", m]}]\n",
            "gateway.models[1].aliases[1] = \"m\": is the name of a model",
        ),
        (
            "gateway:\n  models: [{name: m, address: \"127.0.0.1:1\", load_adapters_from: /}]\n",
            "gateway.models[0].load_adapters_from = \"/\": only for a model without a name (whose adapters are learned)",
        ),
        (
            "gateway:\n  models: [{address: \"127.0.0.1:1\", load_adapters_from: /nonexistent/lora}]\n",
            "gateway.models[0].load_adapters_from = \"/nonexistent/lora\": not a directory",
        ),
        (
            "gateway:\n  models: [{address: \"127.0.0.1:1\", aliases: [x]}]\n",
            "gateway.models[0].aliases = \"models[0]\": a model whose names are learned has no name to alias",
        ),
        (
            "gateway:\n  models: [{name: m, address: \"127.0.0.1:1\", aliases: [gpt-5]}, {name: n, address: \"127.0.0.1:2\", aliases: [gpt-5]}]\n",
            "gateway.models[1].aliases[0] = \"gpt-5\": duplicate alias",
        ),
        (
            "gateway:\n  models: [{name: m, address: \"127.0.0.1:1\", aliases: [\"a b\"]}]\n",
            "gateway.models[0].aliases[0] = \"a b\": must be a name (at most 256 bytes, no spaces or control characters)",
        ),
        (
            "gateway:\n  models: [{name: m, addresses: [\"127.0.0.1:1\", \"127.0.0.1:1\"]}]\n",
            "gateway.models[0].addresses[1] = \"127.0.0.1:1\": duplicate address in this model",
        ),
        (
            "gateway:\n  failure_exclusion_secs: 0\n  models: [{name: m, address: \"127.0.0.1:1\"}]\n",
            "gateway.failure_exclusion_secs = 0: must be between 1 and 3600",
        ),
        (
            "gateway:\n  connect_timeout_ms: 99999999\n  models: [{name: m, address: \"127.0.0.1:1\"}]\n",
            "gateway.connect_timeout_ms = 99999999: must be between 1 and 60000",
        ),
        (
            "gateway:\n  models: [{name: m, addresses: [{address: \"127.0.0.1:1\", weight: 0}]}]\n",
            "gateway.models[0].addresses[0].weight = 0: must be between 1 and 1000",
        ),
        (
            "gateway:\n  models: []\n",
            "gateway.models = \"[]\": needs at least one model",
        ),
        ("threads: 1\n", "gateway = \"(missing)\""),
        (
            "gateway:\n  listen: \"127.0.0.1:9091\"\n  models: [{name: m, address: \"127.0.0.1:1\"}]\n",
            "gateway.metrics_listen = \"127.0.0.1:9091\": must differ",
        ),
        (
            "gateway:\n  models: [{name: \"\", address: \"127.0.0.1:1\"}]\n",
            "gateway.models[0].name = \"\": must be a non-empty name",
        ),
        ("gateway: [1, 2\n", "invalid YAML"),
    ];
    for (yaml, want) in cases {
        let got = err(yaml);
        assert!(
            got.contains(want),
            "for {yaml:?}\n got: {got}\nwant: {want}"
        );
    }
}

const MINIMAL: &str = "gateway:\n  models: [{name: m, address: \"127.0.0.1:1\"}, {name: n, address: \"127.0.0.1:2\", max_num_seqs: 8, max_queue_depth: 0}]\n";

#[test]
fn scheduler_and_warmup_defaults_and_per_model_limits() {
    let c = GatewayConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(c.models[0].limits.max_num_seqs, 4);
    assert_eq!(c.models[0].limits.max_queue_depth, 20);
    assert_eq!(c.models[1].limits.max_num_seqs, 8);
    assert_eq!(c.models[1].limits.max_queue_depth, 0);
    assert_eq!(c.queue_timeout, Duration::from_secs(60));
    assert_eq!(c.overflow, Overflow::Reject);
    assert_eq!(c.warmup.delay, Duration::from_millis(500));
    assert_eq!(c.warmup.vllm_priority, None);
}

#[test]
fn environment_overrides_the_file_defaults() {
    let env = |var: &str| match var {
        "VLLM_MAX_NUM_SEQS" => Some("2".to_string()),
        "VLLM_MAX_QUEUE_DEPTH" => Some("7".to_string()),
        "WARMUP_DELAY_MS" => Some("0".to_string()),
        _ => None,
    };
    let yaml = format!("{MINIMAL}  scheduler: {{max_num_seqs: 16, overflow: spill}}\n  warmup: {{delay_ms: 900, vllm_priority: 10}}\n");
    let c = GatewayConfig::from_yaml_with_env(&yaml, env).unwrap();
    assert_eq!(c.models[0].limits.max_num_seqs, 2);
    assert_eq!(c.models[0].limits.max_queue_depth, 7);
    // A model's own setting still applies to that model.
    assert_eq!(c.models[1].limits.max_num_seqs, 8);
    assert_eq!(c.warmup.delay, Duration::ZERO);
    assert_eq!(c.warmup.vllm_priority, Some(10));
    assert_eq!(c.overflow, Overflow::Spill);
}

#[test]
fn bad_environment_values_name_the_variable() {
    let check = |var: &'static str, value: &'static str, want: &str| {
        let env = move |v: &str| (v == var).then(|| value.to_string());
        let got = GatewayConfig::from_yaml_with_env(MINIMAL, env)
            .unwrap_err()
            .to_string();
        assert!(got.contains(want), "got {got}, want {want}");
    };
    check(
        "VLLM_MAX_NUM_SEQS",
        "four",
        "VLLM_MAX_NUM_SEQS = \"four\": not a whole number",
    );
    check(
        "VLLM_MAX_NUM_SEQS",
        "0",
        "VLLM_MAX_NUM_SEQS = 0: must be between 1 and 4096",
    );
    check(
        "VLLM_MAX_QUEUE_DEPTH",
        "-1",
        "VLLM_MAX_QUEUE_DEPTH = \"-1\": not a whole number",
    );
    check(
        "WARMUP_DELAY_MS",
        "1e3",
        "WARMUP_DELAY_MS = \"1e3\": not a whole number",
    );
}

#[test]
fn bad_scheduler_fields_are_named() {
    for (extra, want) in [
        (
            "  scheduler: {max_num_seqs: 0}\n",
            "gateway.scheduler.max_num_seqs = 0",
        ),
        ("  scheduler: {overflow: drop}\n", "unknown variant `drop`"),
        (
            "  scheduler: {queue_timeout_ms: 0}\n",
            "gateway.scheduler.queue_timeout_ms = 0",
        ),
        (
            "  warmup: {delay_ms: 600000}\n",
            "gateway.warmup.delay_ms = 600000",
        ),
        ("  warmup: {priority: 1}\n", "unknown field `priority`"),
    ] {
        let got = err(&format!("{MINIMAL}{extra}"));
        assert!(got.contains(want), "got {got}, want {want}");
    }
    let got = err("gateway:\n  models: [{name: m, address: \"127.0.0.1:1\", max_num_seqs: 0}]\n");
    assert!(got.contains("gateway.models[0].max_num_seqs = 0"), "{got}");
}

#[test]
fn replicas_share_each_backends_limits_rounding_up() {
    let limits = |seqs, depth| Capacity {
        max_num_seqs: seqs,
        max_queue_depth: depth,
    };
    // MINIMAL: model m takes the defaults (4, 20), model n its own (8, 0).
    let c = GatewayConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(c.models[0].limits, limits(4, 20));
    let c = GatewayConfig::from_yaml(&format!("{MINIMAL}  scheduler: {{replicas: 1}}\n")).unwrap();
    assert_eq!(c.models[0].limits, limits(4, 20));
    assert_eq!(c.models[1].limits, limits(8, 0));
    let c = GatewayConfig::from_yaml(&format!("{MINIMAL}  scheduler: {{replicas: 3}}\n")).unwrap();
    assert_eq!(c.models[0].limits, limits(2, 7));
    assert_eq!(c.models[1].limits, limits(3, 0));
    // More replicas than slots: each still admits one.
    let c = GatewayConfig::from_yaml(&format!("{MINIMAL}  scheduler: {{replicas: 64}}\n")).unwrap();
    assert_eq!(c.models[0].limits, limits(1, 1));
    // An environment override is the configured value, divided alike.
    let env = |var: &str| (var == "VLLM_MAX_NUM_SEQS").then(|| "10".to_string());
    let yaml = format!("{MINIMAL}  scheduler: {{replicas: 4}}\n");
    let c = GatewayConfig::from_yaml_with_env(&yaml, env).unwrap();
    assert_eq!(c.models[0].limits, limits(3, 5));
    for (replicas, want) in [
        (
            0,
            "gateway.scheduler.replicas = 0: must be between 1 and 64",
        ),
        (
            65,
            "gateway.scheduler.replicas = 65: must be between 1 and 64",
        ),
    ] {
        let got = err(&format!("{MINIMAL}  scheduler: {{replicas: {replicas}}}\n"));
        assert!(got.contains(want), "got {got}, want {want}");
    }
}

#[test]
fn load_feedback_is_off_by_default_and_lends_up_to_the_whole_backend() {
    let c = GatewayConfig::from_yaml(MINIMAL).unwrap();
    assert!(!c.load_feedback);
    assert_eq!(c.models[0].load_feedback, None);
    let yaml = format!("{MINIMAL}  scheduler: {{replicas: 3, load_feedback: true}}\n");
    let c = GatewayConfig::from_yaml(&yaml).unwrap();
    assert!(c.load_feedback);
    // The share is divided; the ceiling is the backend's own limit.
    assert_eq!(c.models[0].limits.max_num_seqs, 2);
    let fleet = |ceiling| {
        Some(Fleet {
            ceiling,
            replicas: 3,
        })
    };
    assert_eq!(c.models[0].load_feedback, fleet(4));
    assert_eq!(c.models[1].load_feedback, fleet(8));
    let got = err(&format!("{MINIMAL}  scheduler: {{load_feedback: 1}}\n"));
    assert!(got.contains("load_feedback"), "{got}");
}

#[test]
fn health_check_auth_and_read_timeout() {
    let c = GatewayConfig::from_yaml(MINIMAL).unwrap();
    assert!(c.health_check.is_none() && c.api_keys.is_none() && c.upstream_api_key.is_none());
    assert_eq!(c.read_timeout, Duration::from_secs(300));
    let c = GatewayConfig::from_yaml(&format!(
        "{MINIMAL}  health_check: {{}}\n  read_timeout_ms: 5000\n"
    ))
    .unwrap();
    let h = c.health_check.unwrap();
    assert_eq!(
        (h.path.as_str(), h.interval, h.timeout, h.consecutive_ok),
        ("/health", Duration::from_secs(1), Duration::from_secs(1), 1)
    );
    assert_eq!(c.read_timeout, Duration::from_secs(5));

    let dir = std::env::temp_dir().join(format!("poimen-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, "k1\n").unwrap();
    let c = GatewayConfig::from_yaml(&format!(
        "{MINIMAL}  auth: {{api_keys_file: \"{}\"}}\n",
        keys.display()
    ))
    .unwrap();
    assert_eq!(
        c.api_keys.unwrap().tenant_of(b"k1").as_deref(),
        Some("default")
    );
    std::fs::write(&keys, "# none\n").unwrap();
    for (extra, want) in [
        (
            format!("  auth: {{api_keys_file: \"{}\"}}\n", keys.display()),
            "gateway.auth.api_keys_file".to_string(),
        ),
        (
            "  auth: {api_keys_file: /nonexistent/keys}\n".into(),
            "gateway.auth.api_keys_file = \"/nonexistent/keys\": cannot read".into(),
        ),
        (
            "  auth: {upstream_api_key: \"\"}\n".into(),
            "gateway.auth.upstream_api_key = \"(hidden)\"".into(),
        ),
        (
            "  health_check: {path: health}\n".into(),
            "gateway.health_check.path = \"health\"".into(),
        ),
        (
            "  health_check: {interval_ms: 1}\n".into(),
            "gateway.health_check.interval_ms = 1".into(),
        ),
        (
            "  health_check: {consecutive_ok: 0}\n".into(),
            "gateway.health_check.consecutive_ok = 0".into(),
        ),
        (
            "  read_timeout_ms: 0\n".into(),
            "gateway.read_timeout_ms = 0".into(),
        ),
    ] {
        let got = err(&format!("{MINIMAL}{extra}"));
        assert!(got.contains(&want), "got {got}, want {want}");
    }
}

#[test]
fn routing_defaults_overrides_and_bounds() {
    let c = GatewayConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(
        c.models[0].policy,
        Policy {
            prefix_index: None,
            keyless: Keyless::RoundRobin,
            keyless_prefix_bytes: 2048,
            exact: None,
        }
    );
    let c = GatewayConfig::from_yaml(
        r#"
gateway:
  routing: {keyless: prefix, keyless_prefix_bytes: 512}
  models:
    - {name: a, address: "127.0.0.1:1"}
    - {name: b, address: "127.0.0.1:2"}
"#,
    )
    .unwrap();
    let (a, b) = (&c.models[0].policy, &c.models[1].policy);
    let prefix = Keyless::Derived(crate::routing::prefix::Head::FirstUser);
    assert_eq!((a.keyless, b.keyless), (prefix, prefix));
    assert_eq!(a.keyless_prefix_bytes, 512);
    for (extra, want) in [
        ("  routing: {keyless: random}\n", "unknown variant `random`"),
        (
            "  routing: {keyless_prefix_bytes: 0}\n",
            "gateway.routing.keyless_prefix_bytes = 0: must be between 1 and 1048576",
        ),
        ("  routing: {balance: 2}\n", "unknown field `balance`"),
        // Routing by cost replaced bounded load.
        (
            "  routing: {balance_factor: 1.25}\n",
            "unknown field `balance_factor`",
        ),
    ] {
        let got = err(&format!("{MINIMAL}{extra}"));
        assert!(got.contains(want), "got {got}, want {want}");
    }
}

#[test]
fn jwt_settings_are_checked() {
    let dir = std::env::temp_dir().join(format!("poimen-jwt-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let jwks = dir.join("jwks.json");
    let key = crate::auth::test_keys::TestKey::ec("ec-1");
    std::fs::write(&jwks, crate::auth::test_keys::jwks(&[&key])).unwrap();
    let jwt =
        |keys: &str| format!("{MINIMAL}  auth:\n    jwt: {{issuer: \"https://i/\", {keys}}}\n");

    let c = GatewayConfig::from_yaml(&jwt(&format!(
        "audience: a, jwks_file: \"{}\"",
        jwks.display()
    )))
    .unwrap();
    let j = c.jwt.unwrap();
    assert_eq!(j.policy.audience, ["a"]);
    assert_eq!(j.policy.algorithms, [jsonwebtoken::Algorithm::RS256]);
    assert_eq!(j.policy.leeway_secs, 30);
    assert!(matches!(j.jwks, JwksSource::File(k) if k.count() == 1));
    let c = GatewayConfig::from_yaml(&jwt(
        "audience: [a, b], jwks_url: \"https://idp.test/application/o/p/jwks/\", algorithms: [ES256, EdDSA], leeway_secs: 0",
    ))
    .unwrap();
    let j = c.jwt.unwrap();
    assert_eq!(j.policy.audience, ["a", "b"]);
    assert!(
        matches!(j.jwks, JwksSource::Url { refresh, ca_file: None, .. } if refresh == Duration::from_secs(300))
    );

    let url = "jwks_url: \"https://idp.test/jwks/\"";
    for (keys, want) in [
        (url.to_string(), "missing field `audience`".to_string()),
        (
            format!("audience: [], {url}"),
            "gateway.auth.jwt.audience = []".into(),
        ),
        (
            format!("audience: a, {url}, algorithms: [RS256, HS256]"),
            "gateway.auth.jwt.algorithms[1] = \"HS256\"".into(),
        ),
        (
            format!("audience: a, {url}, algorithms: []"),
            "gateway.auth.jwt.algorithms".into(),
        ),
        (
            format!("audience: a, {url}, leeway_secs: 3600"),
            "gateway.auth.jwt.leeway_secs = 3600".into(),
        ),
        (
            format!("audience: a, {url}, jwks_refresh_secs: 0"),
            "gateway.auth.jwt.jwks_refresh_secs = 0".into(),
        ),
        (
            format!("audience: a, {url}, ca_file: /nonexistent.pem"),
            "gateway.auth.jwt.ca_file = \"/nonexistent.pem\"".into(),
        ),
        (
            format!("audience: a, {url}, jwks_file: x"),
            "not both".into(),
        ),
        (
            "audience: a".into(),
            "needs `jwks_file` or `jwks_url`".into(),
        ),
        (
            "audience: a, jwks_url: \"http://idp.test/jwks/\"".into(),
            "plain http:// is allowed only to a loopback host".into(),
        ),
        (
            "audience: a, jwks_file: /nonexistent.json".into(),
            "gateway.auth.jwt.jwks_file = \"/nonexistent.json\": cannot read".into(),
        ),
        (
            format!(
                "audience: a, jwks_file: \"{}\", ca_file: x.pem",
                jwks.display()
            ),
            "gateway.auth.jwt.ca_file".into(),
        ),
        (
            format!("audience: a, {url}, tenant: x"),
            "unknown field `tenant`".into(),
        ),
    ] {
        let e = err(&jwt(&keys));
        assert!(e.contains(&want), "{keys}: {e}");
    }
    std::fs::write(&jwks, r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).unwrap();
    let e = err(&jwt(&format!(
        "audience: a, jwks_file: \"{}\"",
        jwks.display()
    )));
    assert!(e.contains("no usable signing key"), "{e}");
}
