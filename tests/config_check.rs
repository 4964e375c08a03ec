//! `poimen-gateway -t -c FILE` checks the whole file and names the bad field.

use crate::support::gateway::check_config;

#[test]
fn shipped_configs_pass() {
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/conf")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") && !path.ends_with("prometheus.yml") {
            let out = check_config(&std::fs::read_to_string(&path).unwrap());
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains("configuration OK"));
        }
    }
}

#[test]
fn bad_configs_are_refused_naming_the_field() {
    let cases = [
        ("gateway:\n  models: [{name: m, address: \"localhost\"}]\n", "gateway.models[0].addresses[0] = \"localhost\": not host:port"),
        ("gateway:\n  modles: []\n", "unknown field `modles`"),
        ("gateway:\n  models: [{name: m, address: \"127.0.0.1:1\", addresses: [\"127.0.0.1:2\"]}]\n", "not both"),
        ("gateway:\n  failure_exclusion_secs: 0\n  models: [{name: m, address: \"127.0.0.1:1\"}]\n", "gateway.failure_exclusion_secs = 0"),
        ("threads: 2\n", "gateway = \"(missing)\""),
        ("threads: many\ngateway:\n  models: [{name: m, address: \"127.0.0.1:1\"}]\n", "threads"),
        ("gateway:\n  models: [{name: m, address: \"127.0.0.1:1\", kv_events: {port: 5557, block_size: 16, tokenizer: /nowhere}}]\n", "needs `routing.prefix_index`"),
        ("gateway:\n  routing: {prefix_index: {cache_tokens: 1000}}\n  models: [{name: m, address: \"127.0.0.1:1\", kv_events: {port: 5557, block_size: 16, tokenizer: /nowhere}}]\n", "gateway.models[0].kv_events.tokenizer = \"/nowhere\": /nowhere/tokenizer.json"),
        ("gateway:\n  routing: {prefix_index: {cache_tokens: 1000}}\n  models: [{name: m, address: \"127.0.0.1:1\", kv_events: {port: 0, block_size: 16, tokenizer: conf/byte-model}}]\n", "gateway.models[0].kv_events.port = 0"),
        ("gateway:\n  routing: {prefix_index: {cache_tokens: 1000}}\n  models: [{name: m, addresses: [{address: \"127.0.0.1:1\", kv_events: {port: 5}}]}]\n", "gateway.models[0].addresses[0].kv_events = \"127.0.0.1:1\": needs the model's `kv_events`"),
        ("gateway:\n  routing: {prefix_index: {cache_tokens: 1000}}\n  models: [{name: m, addresses: [\"127.0.0.1:8000\", \"127.0.0.1:8001\"], kv_events: {port: 5557, block_size: 16, tokenizer: conf/byte-model}}]\n", "127.0.0.1:8001\": publishes KV-cache events on 127.0.0.1:5557, a port 127.0.0.1:8000 takes too"),
        ("gateway:\n  routing: {prefix_index: {cache_tokens: 1000}}\n  models: [{name: m, addresses: [\"127.0.0.2:8000\", {address: \"127.0.0.3:8000\", kv_events: {port: 8000}}], kv_events: {port: 5557, block_size: 16, tokenizer: conf/byte-model}}]\n", "publishes KV-cache events on 127.0.0.3:8000, a port 127.0.0.3:8000 takes too"),
    ];
    for (yaml, want) in cases {
        let out = check_config(yaml);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "accepted: {yaml}");
        assert!(
            stderr.contains(want),
            "for {yaml:?}\nstderr: {stderr}\nwant: {want}"
        );
    }
}
