use super::*;

fn err(yaml: &str) -> String {
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
    assert_eq!(c.listen, vec!["0.0.0.0:8080".parse().unwrap()]);
    assert_eq!(c.metrics_listen, "127.0.0.1:9091".parse().unwrap());
    assert_eq!(c.failure_exclusion, Duration::from_secs(30));
    assert_eq!(c.max_request_body_bytes, 32 << 20);
    assert_eq!(c.connect_timeout, Duration::from_millis(2000));
    assert_eq!(c.models[0].backends.len(), 1);
    assert_eq!(
        c.models[1].backends,
        vec![
            BackendConfig {
                addr: "127.0.0.1:8001".parse().unwrap(),
                weight: 1
            },
            BackendConfig {
                addr: "127.0.0.1:8002".parse().unwrap(),
                weight: 3
            },
        ]
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
