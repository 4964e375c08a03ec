//! The TLS keys of the config: listeners, backends, `upstream_tls`.

use std::path::{Path, PathBuf};

use super::err;
use crate::config::*;

/// A fresh directory with a self-signed certificate and its key
/// (`cert.pem`, `key.pem`), another pair's key (`other-key.pem`) and some
/// text that is no PEM (`garbage.pem`).
fn tls_files(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("poimen-config-tls-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pair = rcgen::generate_simple_self_signed(vec!["gw.test".to_string()]).unwrap();
    let other = rcgen::generate_simple_self_signed(vec!["other.test".to_string()]).unwrap();
    std::fs::write(dir.join("cert.pem"), pair.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), pair.signing_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("other-key.pem"), other.signing_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("garbage.pem"), "not a certificate\n").unwrap();
    dir
}

fn with_listener(dir: &Path, cert: &str, key: &str) -> String {
    format!(
        "gateway:\n  listen: [\"127.0.0.1:1\", {{address: \"127.0.0.1:2\", tls: {{cert_file: {}, key_file: {}}}}}]\n  models: [{{name: m, address: \"127.0.0.1:3\"}}]\n",
        dir.join(cert).display(),
        dir.join(key).display()
    )
}

#[test]
fn a_tls_listener_beside_a_plain_one() {
    let dir = tls_files("ok");
    let c = GatewayConfig::from_yaml(&with_listener(&dir, "cert.pem", "key.pem")).unwrap();
    assert!(c.listen[0].tls.is_none());
    let tls = c.listen[1].tls.as_ref().unwrap();
    assert_eq!(c.listen[1].addr, "127.0.0.1:2".parse().unwrap());
    assert!(tls.cert_file.ends_with("cert.pem"));
    // One map alone is a list of one listener, too.
    let one = format!(
        "gateway:\n  listen: {{address: \"127.0.0.1:2\", tls: {{cert_file: {0}/cert.pem, key_file: {0}/key.pem}}}}\n  models: [{{name: m, address: \"127.0.0.1:3\"}}]\n",
        dir.display()
    );
    assert!(GatewayConfig::from_yaml(&one).unwrap().listen[0]
        .tls
        .is_some());
}

#[test]
fn bad_listener_tls_files_name_the_field() {
    let dir = tls_files("bad");
    let cases = [
        (
            ("nope.pem", "key.pem"),
            "gateway.listen[1].tls.cert_file",
            "cannot read",
        ),
        (
            ("garbage.pem", "key.pem"),
            "gateway.listen[1].tls.cert_file",
            "no PEM certificate",
        ),
        (
            ("cert.pem", "garbage.pem"),
            "gateway.listen[1].tls.key_file",
            "no PEM private key",
        ),
        (
            ("cert.pem", "other-key.pem"),
            "gateway.listen[1].tls.key_file",
            "does not match",
        ),
    ];
    for ((cert, key), field, rule) in cases {
        let e = err(&with_listener(&dir, cert, key));
        assert!(
            e.starts_with(field) && e.contains(rule),
            "{cert}/{key}: {e}"
        );
    }
    // Inside a map, a missing or misspelt key is reported as such.
    let e = err("gateway:\n  listen: [{address: \"127.0.0.1:2\", tls: {cert_file: a}}]\n  models: [{name: m, address: \"127.0.0.1:3\"}]\n");
    assert!(
        e.contains("gateway.listen[0].tls: missing field `key_file`"),
        "{e}"
    );
    let e = err("gateway:\n  listen: [{address: \"127.0.0.1:2\", tsl: {}}]\n  models: [{name: m, address: \"127.0.0.1:3\"}]\n");
    assert!(e.contains("unknown field `tsl`"), "{e}");
}

#[test]
fn backend_tls_and_its_sni() {
    let c = GatewayConfig::from_yaml(
        "gateway:\n  models:\n    - name: m\n      addresses:\n        - {address: \"10.0.0.5:8000\", tls: true, sni: gpu5.internal}\n        - {address: \"10.0.0.6:8000\", tls: true}\n        - \"10.0.0.7:8000\"\n",
    )
    .unwrap();
    let tls: Vec<Option<&str>> = c.models[0]
        .backends
        .iter()
        .map(|b| b.tls.as_ref().map(|t| t.sni.as_str()))
        .collect();
    // Without `sni`, the address's IP: verified against the IP SANs.
    assert_eq!(tls, [Some("gpu5.internal"), Some("10.0.0.6"), None]);
}

#[test]
fn bad_backend_tls_and_ca_file_name_the_field() {
    let backend =
        |entry: &str| format!("gateway:\n  models: [{{name: m, addresses: [{entry}]}}]\n");
    let dir = tls_files("ca");
    let cases = [
        (
            backend("{address: \"10.0.0.5:8000\", sni: a.test}"),
            "gateway.models[0].addresses[0].sni = \"a.test\": needs `tls: true`",
        ),
        (
            backend("{address: \"10.0.0.5:8000\", tls: true, sni: \"\"}"),
            "gateway.models[0].addresses[0].sni = \"\": not a DNS name",
        ),
        (
            backend("{address: \"10.0.0.5:8000\", tls: yes}"),
            "gateway.models[0].addresses[0].tls: invalid type",
        ),
        (
            format!(
                "gateway:\n  upstream_tls: {{ca_file: {}}}\n  models: [{{name: m, address: \"127.0.0.1:3\"}}]\n",
                dir.join("garbage.pem").display()
            ),
            "gateway.upstream_tls.ca_file = ",
        ),
        (
            "gateway:\n  upstream_tls: {ca_file: /nonexistent/ca.pem}\n  models: [{name: m, address: \"127.0.0.1:3\"}]\n".to_string(),
            "gateway.upstream_tls.ca_file = \"/nonexistent/ca.pem\": cannot read",
        ),
    ];
    for (yaml, want) in cases {
        let e = err(&yaml);
        assert!(e.contains(want), "{yaml}\n{e}\nwant: {want}");
    }
    let ok = format!(
        "gateway:\n  upstream_tls: {{ca_file: {}}}\n  models: [{{name: m, address: \"127.0.0.1:3\"}}]\n",
        dir.join("cert.pem").display()
    );
    let c = GatewayConfig::from_yaml(&ok).unwrap();
    assert!(c.upstream_ca_file.unwrap().ends_with("cert.pem"));
}
