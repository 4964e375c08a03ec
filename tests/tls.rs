//! TLS: the client listener (beside a plain one; TLS 1.2 and 1.3 only;
//! HTTP/2 or HTTP/1.1 by ALPN), `-t` on bad TLS files, backends over TLS verified
//! against `upstream_tls.ca_file` (and excluded, with the reason logged, when
//! they fail verification), and a certificate swapped by a graceful upgrade
//! under load. Every certificate is made by the test (`support::certs`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ProtocolVersion};
use tokio_rustls::TlsConnector;

use crate::support::certs::{Leaf, TestCa};
use crate::support::daemons::{upgrade, Daemons};
use crate::support::gateway::{
    alive, check_config, one_model, temp_dir, Conf, Gateway, TempDir, TLS_IP,
};
use crate::support::{chat, chat_body, eventually, header, key_owned_by, FakeBackend, Reply};

/// A gateway with `gateway_keys` and a TLS listener whose certificate `ca`
/// issued for `TLS_IP`.
async fn tls_gateway(ca: &TestCa, gateway_keys: &str) -> Gateway {
    let dir = temp_dir();
    let (cert, key) = ca.leaf(&[TLS_IP]).write(&dir, "gw");
    Gateway::start_tls(gateway_keys, cert, key).await.keep(dir)
}

fn https(addr: SocketAddr, path: &str) -> String {
    format!("https://{addr}{path}")
}

/// The certificate a TLS response came over.
fn peer_certificate(resp: &reqwest::Response) -> Option<Vec<u8>> {
    let info = resp.extensions().get::<reqwest::tls::TlsInfo>()?;
    info.peer_certificate().map(<[u8]>::to_vec)
}

#[tokio::test]
async fn tls_listener_serves_a_completion_beside_the_plain_one() {
    let ca = TestCa::new("test CA");
    let backend = FakeBackend::start().await;
    let gw = tls_gateway(&ca, &one_model("m", &[backend.addr])).await;
    let resp = ca
        .client_builder()
        .http1_only()
        .build()
        .unwrap()
        .post(https(gw.tls_addr.unwrap(), "/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_body("m", "over tls"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_11);
    assert_eq!(header(&resp, "x-poimen-backend"), backend.addr.to_string());
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["model"], "m");
    // The plain listener still serves, from the same process.
    assert_eq!(chat(&gw, "m", None).await.status(), 200);
    let seen = backend.seen();
    assert_eq!(seen.len(), 2);
    assert!(String::from_utf8_lossy(&seen[0].body).contains("over tls"));
}

#[tokio::test]
async fn http2_by_alpn_carries_large_bodies_and_streams() {
    let ca = TestCa::new("test CA");
    let (backend, streamer) = (FakeBackend::start().await, FakeBackend::start().await);
    let events: Vec<String> = (0..5).map(|i| format!("{{\"n\":{i}}}")).collect();
    streamer.set_reply(Reply::sse(events, Duration::from_millis(20)));
    let keys = format!(
        "{}    - name: s\n      address: \"{}\"\n",
        one_model("m", &[backend.addr]),
        streamer.addr
    );
    let gw = tls_gateway(&ca, &keys).await;
    let client = ca.client_builder().build().unwrap();
    let url = https(gw.tls_addr.unwrap(), "/v1/chat/completions");
    // 1 MiB, far beyond Pingora's 64 KiB retry buffer: the gateway reads it
    // whole in request_filter and forwards its own copy.
    let big = chat_body("m", &"x".repeat(1 << 20));
    let resp = client.post(&url).body(big.clone()).send().await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.version()),
        (200, http::Version::HTTP_2)
    );
    // The same body in 64 KiB DATA frames with no content-length.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .as_bytes()
        .chunks(64 << 10)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let resp = client.post(&url).body(body).send().await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.version()),
        (200, http::Version::HTTP_2)
    );
    let seen = backend.seen();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter().all(|s| s.body == big.as_bytes()),
        "a body arrived altered"
    );
    // A stream passes through to its end.
    let resp = client
        .post(&url)
        .body(chat_body("s", "stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.version()),
        (200, http::Version::HTTP_2)
    );
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("data: {\"n\":4}") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
}

/// A TLS 1.0 ClientHello, written out by hand: rustls cannot send one.
/// Protocol framing only (RFC 2246 / 5246), no cryptography. Apart from its
/// version it is a hello the gateway could accept: suites, groups and
/// signature schemes rustls supports with TLS 1.2.
#[rustfmt::skip]
const CLIENT_HELLO_TLS10: [u8; 92] = [
    // Record: handshake (22), record version 3.1, 87 bytes follow.
    0x16, 0x03, 0x01, 0x00, 0x57,
    // Handshake: ClientHello (1), 83 bytes follow.
    0x01, 0x00, 0x00, 0x53,
    // client_version 3.1 = TLS 1.0 (bytes 9 and 10: see `with_version`).
    0x03, 0x01,
    // random: 32 bytes (any value will do for a hello).
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10,
    0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20,
    // session_id: empty.
    0x00,
    // cipher_suites, 12 bytes: ECDHE_ECDSA_AES128_GCM_SHA256,
    // ECDHE_RSA_AES128_GCM_SHA256, ECDHE_ECDSA_AES256_GCM_SHA384,
    // ECDHE_RSA_AES256_GCM_SHA384, ECDHE_ECDSA_CHACHA20_POLY1305,
    // ECDHE_RSA_CHACHA20_POLY1305.
    0x00, 0x0c, 0xc0, 0x2b, 0xc0, 0x2f, 0xc0, 0x2c, 0xc0, 0x30, 0xcc, 0xa9, 0xcc, 0xa8,
    // compression_methods: null only.
    0x01, 0x00,
    // extensions, 30 bytes:
    0x00, 0x1e,
    // supported_groups (10): x25519, secp256r1.
    0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17,
    // ec_point_formats (11): uncompressed.
    0x00, 0x0b, 0x00, 0x02, 0x01, 0x00,
    // signature_algorithms (13): ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256,
    // rsa_pkcs1_sha256, ed25519.
    0x00, 0x0d, 0x00, 0x0a, 0x00, 0x08, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01, 0x08, 0x07,
];

/// The same hello with `client_version` 3.`minor` (1: TLS 1.0, 2: 1.1, 3: 1.2).
fn with_version(minor: u8) -> [u8; 92] {
    let mut hello = CLIENT_HELLO_TLS10;
    hello[10] = minor;
    hello
}

/// What the server answers a raw hello with, up to the first record.
async fn answer_to(addr: SocketAddr, hello: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(hello).await.unwrap();
    let mut buf = vec![0; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .expect("the server neither answered nor closed")
        .unwrap_or(0);
    buf.truncate(n);
    buf
}

/// A TLS connection to the gateway's listener at `addr`, trusting `ca`, in
/// TLS `version`, offering the protocols `alpn`.
async fn tls_connect(
    ca: &TestCa,
    addr: SocketAddr,
    version: &'static rustls::SupportedProtocolVersion,
    alpn: &[&[u8]],
) -> TlsStream<TcpStream> {
    let mut config = ca.client_config(&[version]);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(TLS_IP).unwrap(), tcp)
        .await
        .unwrap()
}

#[tokio::test]
async fn only_tls_1_2_and_1_3_are_spoken_with_h2_or_http_1_1() {
    let ca = TestCa::new("test CA");
    let backend = FakeBackend::start().await;
    let gw = tls_gateway(&ca, &one_model("m", &[backend.addr])).await;
    let addr = gw.tls_addr.unwrap();
    let connect = |version, alpn| tls_connect(&ca, addr, version, alpn);
    // A client offering both gets HTTP/2.
    let h2 = connect(&rustls::version::TLS13, &[b"h2", b"http/1.1"]).await;
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    for (version, want) in [
        (&rustls::version::TLS13, ProtocolVersion::TLSv1_3),
        (&rustls::version::TLS12, ProtocolVersion::TLSv1_2),
    ] {
        let mut tls = connect(version, &[b"http/1.1"]).await;
        let (_, session) = tls.get_ref();
        assert_eq!(session.protocol_version(), Some(want));
        assert_eq!(session.alpn_protocol(), Some(&b"http/1.1"[..]), "{want:?}");
        tls.write_all(b"GET /health HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        tls.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{want:?}: {response}");
    }
    // The hand-made hello is acceptable as TLS 1.2: a ServerHello (a
    // handshake record whose first message is type 2)...
    let answer = answer_to(addr, &with_version(3)).await;
    assert!(
        answer.len() > 5 && answer[0] == 0x16 && answer[5] == 0x02,
        "{answer:02x?}"
    );
    // ...and refused as TLS 1.0 or 1.1: a fatal protocol_version alert
    // (record type 21, level 2, description 70), or a close. Never a
    // ServerHello.
    for minor in [1, 2] {
        let answer = answer_to(addr, &with_version(minor)).await;
        let alert = answer.len() == 7 && answer[0] == 0x15 && answer[5..] == [2, 70];
        assert!(
            alert || answer.is_empty(),
            "TLS 1.{}: {answer:02x?}",
            minor - 1
        );
    }
}

#[test]
fn check_names_the_bad_tls_file() {
    let ca = TestCa::new("test CA");
    let dir = temp_dir();
    let (cert, key) = ca.leaf(&["gw.test"]).write(&dir, "gw");
    let (_, other_key) = ca.leaf(&["gw.test"]).write(&dir, "other");
    let garbage = dir.join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\nnot base64 %%%\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let missing = dir.join("missing.pem");
    let yaml = |cert: &Path, key: &Path, ca: &Path| {
        format!(
            "gateway:\n  listen: [\"127.0.0.1:8080\", {{address: \"127.0.0.1:8443\", tls: {{cert_file: \"{}\", key_file: \"{}\"}}}}]\n  upstream_tls: {{ca_file: \"{}\"}}\n  models: [{{name: m, address: \"127.0.0.1:1\"}}]\n",
            cert.display(),
            key.display(),
            ca.display()
        )
    };
    let ca_file = ca.write(&dir, "ca.pem");
    let ok = check_config(&yaml(&cert, &key, &ca_file));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let field = "gateway.listen[1].tls";
    let cases = [
        (
            yaml(&missing, &key, &ca_file),
            format!("{field}.cert_file = {missing:?}: cannot read"),
        ),
        (
            yaml(&garbage, &key, &ca_file),
            format!("{field}.cert_file = {garbage:?}: not valid PEM"),
        ),
        (
            yaml(&cert, &missing, &ca_file),
            format!("{field}.key_file = {missing:?}: cannot read"),
        ),
        (
            yaml(&cert, &garbage, &ca_file),
            format!("{field}.key_file = {garbage:?}: not valid PEM"),
        ),
        (
            yaml(&cert, &other_key, &ca_file),
            format!("{field}.key_file = {other_key:?}: the key does not match"),
        ),
        (
            yaml(&cert, &key, &garbage),
            format!("gateway.upstream_tls.ca_file = {garbage:?}: not valid PEM"),
        ),
    ];
    for (yaml, want) in cases {
        let out = check_config(&yaml);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "accepted: {yaml}");
        assert!(stderr.contains(&want), "stderr: {stderr}\nwant: {want}");
    }
}

/// `upstream_tls` trusting `ca`, whose file is written to a fresh directory
/// (removed when the directory is dropped).
fn trusting(ca: &TestCa) -> (String, TempDir) {
    let dir = temp_dir();
    let ca_file = ca.write(&dir, "backends-ca.pem");
    let yaml = format!("  upstream_tls: {{ca_file: \"{}\"}}\n", ca_file.display());
    (yaml, dir)
}

/// A TLS backend entry of `models:`.
fn tls_entry(addr: SocketAddr, sni: Option<&str>) -> String {
    match sni {
        Some(sni) => format!("{{address: \"{addr}\", tls: true, sni: {sni}}}"),
        None => format!("{{address: \"{addr}\", tls: true}}"),
    }
}

#[tokio::test]
async fn tls_backends_are_verified_against_the_ca_file() {
    let ca = TestCa::new("backend CA");
    // One verified by its IP (no `sni`), one by the name given as `sni`.
    let by_ip = FakeBackend::start_tls(ca.leaf(&["127.0.0.1"]).server_config()).await;
    let by_name = FakeBackend::start_tls(ca.leaf(&["gpu.test"]).server_config()).await;
    let (upstream_tls, _ca_dir) = trusting(&ca);
    let keys = format!(
        "{}  health_check: {{interval_ms: 100}}\n  models:\n    - name: ip\n      addresses: [{}]\n    - name: name\n      addresses: [{}]\n",
        upstream_tls,
        tls_entry(by_ip.addr, None),
        tls_entry(by_name.addr, Some("gpu.test")),
    );
    let gw = Gateway::start(&keys).await;
    for (model, backend) in [("ip", &by_ip), ("name", &by_name)] {
        let resp = chat(&gw, model, None).await;
        assert_eq!(resp.status(), 200, "{model}");
        assert_eq!(header(&resp, "x-poimen-backend"), backend.addr.to_string());
        let seen = backend.seen();
        assert!(
            seen.iter().any(|s| s.path == "/v1/chat/completions"),
            "{model}: {seen:?}"
        );
    }
    // The health probes reach them over TLS too (they speak nothing else).
    for backend in [&by_ip, &by_name] {
        eventually("a health probe over TLS", || async {
            backend.seen().iter().any(|s| s.path == "/health")
        })
        .await;
    }
}

#[tokio::test]
async fn a_backend_failing_verification_is_excluded_and_the_next_serves() {
    let (ca, rogue) = (TestCa::new("trusted CA"), TestCa::new("another CA"));
    let untrusted = FakeBackend::start_tls(rogue.leaf(&["127.0.0.1"]).server_config()).await;
    let wrong_name = FakeBackend::start_tls(ca.leaf(&["gpu.test"]).server_config()).await;
    let good = FakeBackend::start_tls(ca.leaf(&["127.0.0.1"]).server_config()).await;
    let (upstream_tls, _ca_dir) = trusting(&ca);
    let keys = format!(
        "{}  models:\n    - name: m\n      addresses: [{}, {}, {}]\n",
        upstream_tls,
        tls_entry(untrusted.addr, None),
        tls_entry(wrong_name.addr, Some("other.test")),
        tls_entry(good.addr, None),
    );
    let gw = Gateway::start(&keys).await;
    let addrs = [untrusted.addr, wrong_name.addr, good.addr];
    for (bad, why) in [
        (untrusted.addr, "UnknownIssuer"),
        (wrong_name.addr, "not valid for name"),
    ] {
        // A key whose first choice is the bad backend.
        let key = key_owned_by(bad, &addrs);
        let resp = chat(&gw, "m", Some(&key)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "x-poimen-backend"), good.addr.to_string());
        let backend = bad.to_string();
        let excluded = gw
            .metric("poimen_gateway_backend_excluded", &[("backend", &backend)])
            .await;
        assert_eq!(excluded, 1.0, "{backend} not excluded");
        eventually("the exclusion logged with its reason", || async {
            gw.log_lines().iter().any(|v| {
                v["event"] == "backend_excluded"
                    && v["backend"] == backend.as_str()
                    && v["level"] == "WARN"
                    && v["reason"].as_str().is_some_and(|r| r.contains(why))
            })
        })
        .await;
    }
    // Neither bad backend got a request: the handshake failed first.
    assert_eq!(untrusted.count() + wrong_name.count(), 0);
    assert_eq!(good.count(), 2);
}

/// Outcomes of the requests sent during the certificate swap.
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    /// Failed requests, each with what went wrong.
    failed: Mutex<Vec<String>>,
    /// The certificates the responses came over, and how many each.
    certificates: Mutex<Vec<(Vec<u8>, usize)>>,
    /// Responses over HTTP/2.
    h2: AtomicUsize,
}

impl Tally {
    fn record(&self, result: Result<reqwest::Response, reqwest::Error>, who: &str) {
        match result {
            Ok(resp) if resp.status() == 200 => {
                if resp.version() == http::Version::HTTP_2 {
                    self.h2.fetch_add(1, Ordering::Relaxed);
                }
                let cert = peer_certificate(&resp).unwrap_or_default();
                let mut certs = self.certificates.lock().unwrap();
                match certs.iter_mut().find(|(c, _)| *c == cert) {
                    Some((_, n)) => *n += 1,
                    None => certs.push((cert, 1)),
                }
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            Ok(resp) => self
                .failed
                .lock()
                .unwrap()
                .push(format!("{who}: status {}", resp.status())),
            Err(e) => self.failed.lock().unwrap().push(format!("{who}: {e:?}")),
        }
    }

    fn count_of(&self, cert: &CertificateDer) -> usize {
        let certs = self.certificates.lock().unwrap();
        certs
            .iter()
            .find(|(c, _)| c[..] == cert[..])
            .map_or(0, |(_, n)| *n)
    }
}

/// A daemon started as systemd starts it (`-d`, upgradable in place),
/// serving `leaf` on its TLS listener and model `m` on `backend`: it, and
/// its pid.
async fn tls_daemon(leaf: &Leaf, backend: SocketAddr) -> (Daemons, u32) {
    let conf = Conf::new(3);
    let (cert, key) = leaf.write(conf.dir(), "gw");
    let d = Daemons {
        conf: conf.serve_tls(cert, key),
        pids: Vec::new(),
    };
    d.conf.write(&one_model("m", &[backend]));
    assert!(d.start(false).wait().await.unwrap().success());
    let pid = d.next_pid(0).await;
    (d, pid)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_upgrade_under_load_swaps_the_certificate() {
    let ca = TestCa::new("test CA");
    let backend = FakeBackend::start().await;
    let (old_leaf, new_leaf) = (ca.leaf(&[TLS_IP]), ca.leaf(&[TLS_IP]));
    let (mut d, pid) = tls_daemon(&old_leaf, backend.addr).await;
    let listening = d.conf.listening(pid).await;
    let url = https(d.conf.tls_listening(pid), "/v1/chat/completions");

    // Steady load over TLS: workers on a fresh connection (and TLS
    // handshake) per request and on keep-alive connections, over HTTP/2 and
    // over HTTP/1.1.
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let fresh = w % 2 == 0;
            let mut client = ca.client_builder();
            if fresh {
                client = client.pool_max_idle_per_host(0);
            }
            if w >= 2 {
                client = client.http1_only();
            }
            let client = client.build().unwrap();
            let (tally, stop, url) = (tally.clone(), stop.clone(), url.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let result = client.post(&url).body(chat_body("m", "load")).send().await;
                    tally.record(result, &format!("worker {w}"));
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    eventually("load under way", || async {
        tally.ok.load(Ordering::Relaxed) > 20
    })
    .await;

    // The operator replaces the files, then reloads.
    new_leaf.write(d.conf.dir(), "gw");
    let old = upgrade(&mut d, listening).await;
    let quit_at = Instant::now();
    // The old process keeps accepting for a moment after the handover, so
    // new connections see the new certificate once it has stopped.
    while alive(old) {
        assert!(
            quit_at.elapsed() < Duration::from_secs(15),
            "old process still alive"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fresh = ca
        .client_builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for _ in 0..5 {
        let resp = fresh
            .post(&url)
            .body(chat_body("m", "after"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(peer_certificate(&resp).unwrap(), new_leaf.der.to_vec());
    }
    // Keep the load a moment longer on the new process.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let (ok, h2) = (
        tally.ok.load(Ordering::Relaxed),
        tally.h2.load(Ordering::Relaxed),
    );
    let failed = tally.failed.lock().unwrap().clone();
    let (on_old, on_new) = (tally.count_of(&old_leaf.der), tally.count_of(&new_leaf.der));
    eprintln!(
        "tls reload: {ok} ok ({h2} over HTTP/2; {on_old} over the old certificate, {on_new} over the new), {} failed; old process gone {:?} after SIGQUIT",
        failed.len(),
        quit_at.elapsed()
    );
    // Not one: the old process answers what it accepted, an idle
    // keep-alive connection at its next request (`Connection: close`).
    assert!(failed.is_empty(), "failed requests: {failed:#?}");
    assert!(on_old > 0 && on_new > 0, "old {on_old}, new {on_new}");
    assert_eq!(
        on_old + on_new,
        ok,
        "a response over an unknown certificate"
    );
    assert!(
        h2 > 0 && h2 < ok,
        "{h2} of {ok} over HTTP/2: both versions under load"
    );
}

/// An HTTP/2 connection the old process accepted just before it stopped
/// listening, on which the client has sent nothing yet, has its first
/// request served after the old process's shutdown has begun, not a GOAWAY
/// that fails it unsent (a client does not retry a request on a connection
/// that was new).
#[tokio::test(flavor = "multi_thread")]
async fn a_new_http2_connection_at_a_reload_has_its_first_request_served() {
    let ca = TestCa::new("test CA");
    let backend = FakeBackend::start().await;
    let (mut d, pid) = tls_daemon(&ca.leaf(&[TLS_IP]), backend.addr).await;
    let listening = d.conf.listening(pid).await;
    let addr = d.conf.tls_listening(pid);

    // Connected to the only process listening: the one about to be replaced.
    let tls = tls_connect(&ca, addr, &rustls::version::TLS13, &[b"h2"]).await;
    let (send, connection) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(connection);

    let old = upgrade(&mut d, listening).await;
    eventually("the old process's shutdown begun", || async {
        d.conf.log().contains("Graceful shutdown started")
    })
    .await;
    assert!(alive(old));
    let mut send = send.ready().await.expect("the connection takes a request");
    let request = http::Request::post(format!("https://{TLS_IP}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (response, mut body) = send.send_request(request, false).unwrap();
    body.send_data(chat_body("m", "first").into(), true)
        .unwrap();
    let response = response.await.expect("answered");
    assert_eq!(response.status(), 200);
    let mut data = response.into_body();
    let mut answer = Vec::new();
    while let Some(chunk) = data.data().await {
        let chunk = chunk.unwrap();
        let _ = data.flow_control().release_capacity(chunk.len());
        answer.extend_from_slice(&chunk);
    }
    // The backend's answer, whole.
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["model"], "m");
    assert_eq!(backend.count(), 1);
}
