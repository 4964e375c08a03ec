//! Starts the real `poimen-gateway` binary on loopback with a temporary
//! config, waits until it answers, kills it on drop and prints its stderr when
//! the test failed.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_poimen-gateway");

/// A fresh directory for one test's files.
pub fn temp_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "poimen-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A port that was free a moment ago. The gateway binds it itself, so there
/// is a small race; `Gateway::start` retries on a bind failure.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `models:` YAML for one model over the given backends.
pub fn one_model(name: &str, backends: &[SocketAddr]) -> String {
    let list: Vec<String> = backends.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "  models:\n    - name: {name}\n      addresses: [{}]\n",
        list.join(", ")
    )
}

/// Run `poimen-gateway -t -c <file with yaml>`.
pub fn check_config(yaml: &str) -> Output {
    check_config_env(yaml, &[])
}

/// Run `poimen-gateway -t -c <file with yaml>` with extra environment.
pub fn check_config_env(yaml: &str, env: &[(&str, &str)]) -> Output {
    let dir = temp_dir();
    let path = dir.join("gateway.yaml");
    std::fs::write(&path, yaml).unwrap();
    Command::new(BIN)
        .args(["-t", "-c"])
        .arg(&path)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

pub struct Gateway {
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    pub dir: PathBuf,
    child: Child,
}

impl Gateway {
    /// Start with `gateway_keys` (YAML lines indented under `gateway:`, which
    /// must include `models:`); listen and metrics ports are added here.
    pub async fn start(gateway_keys: &str) -> Gateway {
        let mut last_err = String::new();
        for _ in 0..3 {
            match Self::try_start(gateway_keys).await {
                Ok(gw) => return gw,
                Err(e) => last_err = e,
            }
        }
        panic!("gateway did not start:\n{last_err}");
    }

    async fn try_start(gateway_keys: &str) -> Result<Gateway, String> {
        let dir = temp_dir();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let yaml = format!(
            "version: 1\nthreads: 2\nwork_stealing: false\npid_file: {dir}/gw.pid\nupgrade_sock: {dir}/upgrade.sock\ngrace_period_seconds: 1\ngraceful_shutdown_timeout_seconds: 1\ngateway:\n  listen: \"{addr}\"\n  metrics_listen: \"{metrics}\"\n{gateway_keys}",
            dir = dir.display()
        );
        let conf = dir.join("gateway.yaml");
        std::fs::write(&conf, yaml).unwrap();
        let stderr = std::fs::File::create(dir.join("stderr.log")).unwrap();
        let child = Command::new(BIN)
            .arg("-c")
            .arg(&conf)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut gw = Gateway {
            addr,
            metrics,
            dir,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = gw.child.try_wait() {
                return Err(format!("exited with {status}:\n{}", gw.stderr()));
            }
            let health = reqwest::get(gw.url("/health")).await;
            let metrics = reqwest::get(format!("http://{}/", gw.metrics)).await;
            if health.is_ok() && metrics.is_ok() {
                return Ok(gw);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(format!("not ready in 20 s:\n{}", gw.stderr()))
    }

    /// The gateway process's resident memory, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("gateway.yaml")
    }

    /// The Prometheus text from the metrics listener.
    pub async fn metrics_text(&self) -> String {
        crate::support::client()
            .get(format!("http://{}/metrics", self.metrics))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// One sample's value (0 when the series does not exist yet).
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        crate::support::metrics::sample(&self.metrics_text().await, name, labels).unwrap_or(0.0)
    }

    pub fn stderr(&self) -> String {
        read(&self.dir.join("stderr.log"))
    }

    /// Every line logged so far, each parsed as one JSON object.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        self.stderr()
            .lines()
            .map(|l| {
                let v: serde_json::Value =
                    serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
                assert!(v.is_object(), "not an object: {l}");
                v
            })
            .collect()
    }

    /// The `prefix_cache` lines logged so far.
    pub fn cache_lines(&self) -> Vec<serde_json::Value> {
        self.log_lines()
            .into_iter()
            .filter(|v| v["event"] == "prefix_cache")
            .collect()
    }

    /// The `cache_key` of every `prefix_cache` line logged so far.
    pub fn logged_cache_keys(&self) -> Vec<serde_json::Value> {
        self.cache_lines()
            .into_iter()
            .map(|v| v["cache_key"].clone())
            .collect()
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- gateway {} -c {} stderr ---\n{}",
                BIN,
                self.config_path().display(),
                self.stderr()
            );
        }
    }
}
