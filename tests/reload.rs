//! Zero-downtime reload: the gateway daemonised (`-d`), under steady keyed
//! load on fresh and keep-alive connections plus open SSE streams, upgraded
//! with Pingora's graceful upgrade (new process with `-u`, then SIGQUIT to
//! the old one) to a config with one more backend; and reloaded twenty
//! times in a row by the unit's reload script, half of them package
//! upgrades, with not one request lost.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::daemons::{reload, upgrade, Daemons};
use crate::support::gateway::{alive, one_model, temp_dir, Conf, BIN};
use crate::support::{chat_body, eventually, FakeBackend, Reply};

/// Model `m` over `backends`, and model `s` for the streams.
fn models(backends: &[SocketAddr], stream: SocketAddr) -> String {
    format!(
        "{}    - name: s\n      address: \"{stream}\"\n",
        one_model("m", backends)
    )
}

/// The backend each key is routed to now.
async fn mapping(http: &reqwest::Client, url: &str, keys: &[String]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for k in keys {
        let resp = http
            .post(url)
            .header("X-Poimen-Cache-Key", k)
            .body(chat_body("m", "map"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let backend = resp.headers()["x-poimen-backend"]
            .to_str()
            .unwrap()
            .to_string();
        out.insert(k.clone(), backend);
    }
    out
}

/// What the clients saw.
#[derive(Default)]
struct Seen {
    ok: AtomicUsize,
    streams_ok: AtomicUsize,
    failed: AtomicUsize,
    /// The first failures, for the report (clients that fail at once would
    /// otherwise pile up millions).
    failures: std::sync::Mutex<Vec<String>>,
}

impl Seen {
    fn failed(&self, what: String) {
        if self.failed.fetch_add(1, Ordering::Relaxed) < 50 {
            self.failures.lock().unwrap().push(what);
        }
    }

    /// How many failed, and the first of them.
    fn failures(&self) -> (usize, Vec<String>) {
        let first = self.failures.lock().unwrap().clone();
        (self.failed.load(Ordering::Relaxed), first)
    }
}

/// One request keyed `key`; any answer but 200 with the backend's body is
/// a failure.
async fn send(client: &reqwest::Client, url: &str, key: &str, seen: &Seen) {
    let request = client.post(url).header("X-Poimen-Cache-Key", key);
    match request.body(chat_body("m", key)).send().await {
        Ok(r) if r.status() == 200 => match r.text().await {
            Ok(t) if t.contains(r#""model":"m""#) => {
                seen.ok.fetch_add(1, Ordering::Relaxed);
            }
            other => seen.failed(format!("{key}: body {other:?}")),
        },
        Ok(r) => seen.failed(format!("{key}: status {}", r.status())),
        Err(e) => seen.failed(format!("{key}: {e:?}")),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn graceful_upgrade_under_load_loses_nothing() {
    let (a, b, c) = (
        FakeBackend::start().await,
        FakeBackend::start().await,
        FakeBackend::start().await,
    );
    let s = FakeBackend::start().await;
    s.set_reply(Reply::sse(
        (0..25).map(|i| format!("{{\"n\":{i}}}")).collect(),
        Duration::from_millis(100),
    ));
    let mut d = Daemons {
        conf: Conf::new(3),
        pids: Vec::new(),
    };
    d.conf.write(&models(&[a.addr, b.addr], s.addr));
    assert!(d.start(false).wait().await.unwrap().success());
    let listening = d.conf.listening(d.next_pid(0).await).await;
    let url = format!("http://{}/v1/chat/completions", listening.0);
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let reused = reqwest::Client::builder().no_proxy().build().unwrap();
    let keys: Vec<String> = (0..200).map(|i| format!("key-{i}")).collect();
    let seen = Arc::new(Seen::default());
    let before = mapping(&fresh, &url, &keys).await;

    // Steady load: fresh connections and keep-alive connections.
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (stop, seen, url) = (stop.clone(), seen.clone(), url.clone());
        let client = if w % 2 == 0 {
            fresh.clone()
        } else {
            reused.clone()
        };
        workers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                send(&client, &url, &format!("w{w}-{i}"), &seen).await;
                // Pacing: a steady load, not as many requests as possible.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    // Streams open across the upgrade (2.5 s each).
    let streams: Vec<_> = (0..3)
        .map(|_| {
            let (client, url) = (fresh.clone(), url.clone());
            tokio::spawn(async move { stream(&client, &url).await })
        })
        .collect();
    eventually("the streams open", || async { s.count() == 3 }).await;

    // Upgrade 1: add backend c.
    d.conf.write(&models(&[a.addr, b.addr, c.addr], s.addr));
    let old = upgrade(&mut d, listening).await;
    let quit_at = Instant::now();
    eventually("the new config in effect", || async { c.count() > 0 }).await;
    for st in streams {
        st.await
            .unwrap()
            .expect("a stream broke during the upgrade");
    }
    // Pingora keeps the old process 5 s (its CLOSE_TIMEOUT) after handing
    // the sockets over, then drains for grace_period_seconds (3 here).
    while alive(old) {
        assert!(
            quit_at.elapsed() < Duration::from_secs(15),
            "old process still alive"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let old_gone_after = quit_at.elapsed();
    // The handover is routine, not an error (the new process waits for the
    // sockets until SIGQUIT reaches the old one), and the old process wrote
    // out its queued log lines before it ended.
    let log = d.conf.log();
    let loud: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(r#""target":"pingora_core::server"#))
        .filter(|l| l.contains(r#""level":"ERROR""#) || l.contains(r#""level":"WARN""#))
        .collect();
    assert!(loud.is_empty(), "the upgrade logged {loud:#?}");
    assert!(
        log.contains("All runtimes exited, exiting now"),
        "the old process's last lines are missing"
    );

    // Keys move only to the new backend.
    let after = mapping(&fresh, &url, &keys).await;
    let moved: Vec<&String> = keys.iter().filter(|k| before[*k] != after[*k]).collect();
    assert!(
        moved.iter().all(|k| after[*k] == c.addr.to_string()),
        "a key moved between old backends"
    );
    assert!(
        !moved.is_empty() && moved.len() < keys.len() / 2,
        "{} of {} moved",
        moved.len(),
        keys.len()
    );

    // Upgrade 2: the same config: every key maps as before.
    upgrade(&mut d, listening).await;
    assert_eq!(mapping(&fresh, &url, &keys).await, after);

    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let (ok, (failed, first)) = (seen.ok.load(Ordering::Relaxed), seen.failures());
    eprintln!(
        "reload: 2 upgrades; {ok} requests ok, {failed} failed; old process gone {old_gone_after:?} after SIGQUIT"
    );
    assert_eq!(failed, 0, "{first:#?}");
    assert!(ok > 100);

    // An upgrade to an invalid config: refused, the old process keeps serving.
    std::fs::write(d.conf.path(), "gateway:\n  models: []\n").unwrap();
    assert!(!d.conf.command(&["-t"]).status().unwrap().success());
    assert!(
        !d.start(true).wait().await.unwrap().success(),
        "an invalid config was accepted"
    );
    let serving = d.pid();
    assert!(alive(serving));
    let resp = fresh
        .post(&url)
        .body(chat_body("m", "still there"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// A stream of model `s`, whole to its `[DONE]`.
async fn stream(client: &reqwest::Client, url: &str) -> Result<(), String> {
    let body = chat_body("s", "stream");
    let text = match client.post(url).body(body).send().await {
        Ok(r) => r.text().await.map_err(|e| format!("{e:?}"))?,
        Err(e) => return Err(format!("{e:?}")),
    };
    match text.ends_with("data: [DONE]\n\n") {
        true => Ok(()),
        false => Err(format!("cut: {text:?}")),
    }
}

/// `systemctl reload` twenty times in a row (the unit's reload script: `-t`,
/// `-u`, then SIGQUIT to the old process; a package upgrade runs it too), under 64 keep-alive clients sending back to back, a
/// new connection every 10 ms and streams open throughout: not one request
/// fails, not one stream breaks. The old processes drain while the next
/// reloads come (each keeps accepting for Pingora's 5 s, then drains).
#[tokio::test(flavor = "multi_thread")]
async fn twenty_reloads_lose_no_request() {
    let backends = [FakeBackend::start().await, FakeBackend::start().await];
    let s = FakeBackend::start().await;
    s.set_reply(Reply::sse(
        (0..10).map(|i| format!("{{\"n\":{i}}}")).collect(),
        Duration::from_millis(100),
    ));
    let mut d = Daemons {
        conf: Conf::new(3),
        pids: Vec::new(),
    };
    // Room for every client: a 503 would count as a loss.
    let conf = format!(
        "  scheduler: {{max_num_seqs: 64, max_queue_depth: 64}}\n{}",
        models(&[backends[0].addr, backends[1].addr], s.addr)
    );
    d.conf.write(&conf);
    assert!(d.start(false).wait().await.unwrap().success());
    let listening = d.conf.listening(d.next_pid(0).await).await;
    let url = format!("http://{}/v1/chat/completions", listening.0);
    let keep_alive = reqwest::Client::builder().no_proxy().build().unwrap();
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    let spawn = |clients: &mut Vec<_>, who: String, client: reqwest::Client, pause: u64| {
        let (stop, seen, url) = (stop.clone(), seen.clone(), url.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                send(&client, &url, &who, &seen).await;
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }));
    };
    for c in 0..64 {
        spawn(
            &mut clients,
            format!("keep-alive-{c}"),
            keep_alive.clone(),
            0,
        );
    }
    spawn(&mut clients, "fresh".into(), fresh.clone(), 10);
    for n in 0..3 {
        let (stop, seen, url, client) = (stop.clone(), seen.clone(), url.clone(), fresh.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match stream(&client, &url).await {
                    Ok(()) => _ = seen.streams_ok.fetch_add(1, Ordering::Relaxed),
                    Err(e) => seen.failed(format!("stream {n}: {e}")),
                }
            }
        }));
    }
    eventually("traffic flowing", || async {
        seen.ok.load(Ordering::Relaxed) > 500
    })
    .await;
    // Every other reload is a package upgrade: the binary's file replaced
    // under the running process as dpkg does it (a new file renamed over the
    // old one), then the reload its postinst asks systemd for.
    let dir = temp_dir();
    let bin = dir.join("poimen-gateway");
    let builds = [dir.join("build-a"), dir.join("build-b")];
    for b in &builds {
        std::fs::copy(BIN, b).unwrap();
    }
    std::fs::hard_link(&builds[0], &bin).unwrap();
    for n in 0..20 {
        if n % 2 == 1 {
            let new = dir.join("poimen-gateway.dpkg-new");
            std::fs::hard_link(&builds[(n / 2 + 1) % 2], &new).unwrap();
            std::fs::rename(&new, &bin).unwrap();
        }
        reload(&mut d, listening, &bin).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The last old process drains and exits with clients still sending.
    let last_old = *d.pids.last().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(last_old) {
        assert!(Instant::now() < deadline, "old process still alive");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let (failed, first) = seen.failures();
    let (ok, streams) = (
        seen.ok.load(Ordering::Relaxed),
        seen.streams_ok.load(Ordering::Relaxed),
    );
    eprintln!("20 reloads: {ok} requests ok, {streams} streams whole, {failed} failed");
    assert_eq!(failed, 0, "the first failures: {first:#?}");
    assert!(
        ok > 5_000 && streams > 30,
        "too little traffic: {ok}, {streams}"
    );
}
