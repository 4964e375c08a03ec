//! Zero-downtime reload: the gateway daemonised (`-d`), under steady keyed
//! load on fresh and keep-alive connections plus open SSE streams, upgraded
//! with Pingora's graceful upgrade (new process with `-u`, then SIGQUIT to
//! the old one) to a config with one more backend.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::daemons::{upgrade, Daemons};
use crate::support::gateway::{alive, one_model, Conf};
use crate::support::{chat_body, eventually, FakeBackend, Reply};

/// Model `m` over `backends`, and model `s` for the streams.
fn models(backends: &[SocketAddr], stream: SocketAddr) -> String {
    format!(
        "{}    - name: s\n      address: \"{stream}\"\n",
        one_model("m", backends)
    )
}

/// The backend each key is routed to now. A fresh connection the old
/// process closes unread (see the end of the test) is retried and counted.
async fn mapping(
    http: &reqwest::Client,
    url: &str,
    keys: &[String],
    load: &Load,
) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for k in keys {
        let resp = loop {
            match http
                .post(url)
                .header("X-Poimen-Cache-Key", k)
                .body(chat_body("m", "map"))
                .send()
                .await
            {
                Ok(resp) => break resp,
                Err(e) if e.is_request() => {
                    load.errors.lock().unwrap().push(format!("mapping: {e:?}"));
                    load.fresh_dropped.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => panic!("{e:?}"),
            }
        };
        assert_eq!(resp.status(), 200);
        let backend = resp.headers()["x-poimen-backend"]
            .to_str()
            .unwrap()
            .to_string();
        out.insert(k.clone(), backend);
    }
    out
}

#[derive(Default)]
struct Load {
    fresh_ok: AtomicUsize,
    fresh_failed: AtomicUsize,
    /// Fresh connections closed before the request was read (see below).
    fresh_dropped: AtomicUsize,
    reused_ok: AtomicUsize,
    reused_failed: AtomicUsize,
    /// What the failures were, for the report.
    errors: std::sync::Mutex<Vec<String>>,
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
    let load = Arc::new(Load::default());
    let before = mapping(&fresh, &url, &keys, &load).await;

    // Steady load: fresh connections and keep-alive connections.
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (stop, load, url) = (stop.clone(), load.clone(), url.clone());
        let client = if w % 2 == 0 {
            fresh.clone()
        } else {
            reused.clone()
        };
        workers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let result = client
                    .post(&url)
                    .header("X-Poimen-Cache-Key", format!("w{w}-{i}"))
                    .body(chat_body("m", "load"))
                    .send()
                    .await;
                let fresh = w % 2 == 0;
                let (ok, failed) = if fresh {
                    (&load.fresh_ok, &load.fresh_failed)
                } else {
                    (&load.reused_ok, &load.reused_failed)
                };
                match result {
                    Ok(r) if r.status() == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    Ok(r) => {
                        load.errors
                            .lock()
                            .unwrap()
                            .push(format!("worker {w}: status {}", r.status()));
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                    // Closed with no answer at all: the request was never read.
                    Err(e) if fresh && e.is_request() => {
                        load.errors
                            .lock()
                            .unwrap()
                            .push(format!("worker {w}: {e:?}"));
                        load.fresh_dropped.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(e) => {
                        load.errors
                            .lock()
                            .unwrap()
                            .push(format!("worker {w}: {e:?}"));
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                // Pacing: a steady load, not as many requests as possible.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    // Streams open across the upgrade (2.5 s each).
    let streams: Vec<_> = (0..3)
        .map(|_| {
            let (client, url) = (fresh.clone(), url.clone());
            tokio::spawn(async move {
                let resp = client
                    .post(&url)
                    .body(chat_body("s", "stream"))
                    .send()
                    .await
                    .unwrap();
                resp.text()
                    .await
                    .map(|t| t.ends_with("data: [DONE]\n\n"))
                    .unwrap_or(false)
            })
        })
        .collect();
    eventually("the streams open", || async { s.count() == 3 }).await;

    // Upgrade 1: add backend c.
    d.conf.write(&models(&[a.addr, b.addr, c.addr], s.addr));
    let old = upgrade(&mut d, listening).await;
    let quit_at = Instant::now();
    eventually("the new config in effect", || async { c.count() > 0 }).await;
    for st in streams {
        assert!(st.await.unwrap(), "a stream broke during the upgrade");
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
    let after = mapping(&fresh, &url, &keys, &load).await;
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
    assert_eq!(mapping(&fresh, &url, &keys, &load).await, after);

    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let l = &*load;
    let (fo, ff, fd, ro, rf) = (
        l.fresh_ok.load(Ordering::Relaxed),
        l.fresh_failed.load(Ordering::Relaxed),
        l.fresh_dropped.load(Ordering::Relaxed),
        l.reused_ok.load(Ordering::Relaxed),
        l.reused_failed.load(Ordering::Relaxed),
    );
    eprintln!(
        "reload: 2 upgrades; fresh connections {fo} ok / {ff} failed / {fd} closed unread; keep-alive {ro} ok / {rf} failed; old process gone {old_gone_after:?} after SIGQUIT"
    );
    let errors = l.errors.lock().unwrap().clone();
    assert_eq!(ff, 0, "requests on new connections failed: {errors:?}");
    // Pingora 0.9 drops a connection still waiting for its first request
    // when the old process's shutdown fires (5 s after SIGQUIT): one it
    // accepted in the last instant before it stopped accepting can close
    // unanswered (and unread, so a retry is safe). A few per upgrade at most.
    assert!(fd <= 4, "{fd} fresh connections closed unread: {errors:?}");
    assert!(fo > 50 && ro > 50);
    // Reused idle connections: the old process answers `Connection: close`
    // once it is shutting down, but a request already on the wire of a
    // connection it is closing can fail; reported above, bounded here.
    assert!(rf <= 2, "{rf} keep-alive failures: {errors:?}");

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
