//! Starts the real `poimen-gateway` binary on loopback with a temporary
//! config, waits until it listens, kills it on drop and prints its stderr
//! when the test failed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::ports;

pub const BIN: &str = env!("CARGO_BIN_EXE_poimen-gateway");

/// The client listener's IP. Its port is 0: the gateway binds a free one.
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// The metrics listener's IP: the config requires it to differ from every
/// client listener, and Linux serves all of 127.0.0.0/8 on loopback.
const METRICS_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// The TLS client listener's IP, when there is one (`Conf::serve_tls`):
/// its certificates are issued for it.
pub const TLS_IP: &str = "127.0.0.3";

/// A fresh directory for one test's files, removed when dropped unless the
/// test is failing (then its files are left to look at).
pub fn temp_dir() -> TempDir {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "poimen-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
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

/// Whether process `pid` runs (exists and is not a zombie).
pub fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// A gateway's files in a fresh directory: `gateway.yaml`, the pid file, the
/// upgrade socket and `stderr.log`. The config listens on port 0 and
/// `listening` reads back the ports the process bound, so there is no port
/// picked beforehand that someone else could take. A graceful upgrade (`-u`)
/// still inherits the sockets: Pingora matches them by the address strings,
/// which stay the same.
pub struct Conf {
    dir: TempDir,
    grace_period_seconds: u32,
    /// A TLS listener's certificate and key files, when it has one.
    tls: Option<(PathBuf, PathBuf)>,
}

impl Conf {
    /// With `grace_period_seconds`, how long an old process drains after
    /// handing its sockets over in a graceful upgrade.
    pub fn new(grace_period_seconds: u32) -> Conf {
        Conf {
            dir: temp_dir(),
            grace_period_seconds,
            tls: None,
        }
    }

    /// Also listen with TLS on `TLS_IP`, port 0, serving these files.
    pub fn serve_tls(mut self, cert_file: PathBuf, key_file: PathBuf) -> Conf {
        self.tls = Some((cert_file, key_file));
        self
    }

    /// This config's directory, for the test's own files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// (Re)write `gateway.yaml` with `gateway_keys`: YAML lines indented
    /// under `gateway:`, which must include `models:`.
    pub fn write(&self, gateway_keys: &str) {
        let tls = match &self.tls {
            Some((cert, key)) => format!(
                ", {{address: \"{TLS_IP}:0\", tls: {{cert_file: \"{}\", key_file: \"{}\"}}}}",
                cert.display(),
                key.display()
            ),
            None => String::new(),
        };
        let yaml = format!(
            "version: 1\nthreads: 2\nwork_stealing: false\npid_file: {pid}\nupgrade_sock: {sock}\n\
             grace_period_seconds: {grace}\ngraceful_shutdown_timeout_seconds: 1\n\
             gateway:\n  listen: [\"{CLIENT_IP}:0\"{tls}]\n  metrics_listen: \"{METRICS_IP}:0\"\n{gateway_keys}",
            pid = self.pid_file().display(),
            sock = self.upgrade_sock().display(),
            grace = self.grace_period_seconds,
        );
        std::fs::write(self.path(), yaml).unwrap();
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join("gateway.yaml")
    }

    /// `poimen-gateway ARGS -c gateway.yaml`, logging at info level to
    /// `stderr.log` (appended to: a daemon keeps the file as its stderr).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .arg("-c")
            .arg(self.path())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(self.log_file());
        cmd
    }

    /// The log, to append to: a daemon keeps the stderr it was started
    /// with, so it must be a file, never a pipe someone waits to close.
    pub fn log_file(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stderr.log"))
            .unwrap()
    }

    /// Where a new process (`-u`) waits for the listening sockets.
    pub fn upgrade_sock(&self) -> PathBuf {
        self.dir.join("upgrade.sock")
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("gw.pid")
    }

    /// The pid in the pid file, which a daemon (`-d`) writes.
    pub fn pid(&self) -> Option<u32> {
        read(&self.pid_file()).trim().parse().ok()
    }

    /// What every process started on this config logged.
    pub fn log(&self) -> String {
        read(&self.dir.join("stderr.log"))
    }

    /// The client and metrics addresses process `pid` listens on, once it
    /// listens on both, and on the TLS listener if any (Pingora binds them
    /// after the process started; `tls_listening` reads that one).
    pub async fn listening(&self, pid: u32) -> (SocketAddr, SocketAddr) {
        let mut ips = vec![IpAddr::V4(CLIENT_IP), IpAddr::V4(METRICS_IP)];
        ips.extend(self.tls.as_ref().map(|_| TLS_IP.parse::<IpAddr>().unwrap()));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match ports::listening_on(pid, &ips) {
                Ok(Some(addrs)) => return (addrs[0], addrs[1]),
                _ if !alive(pid) => panic!("gateway {pid} exited before it listened"),
                Ok(None) => {}
                Err(e) => panic!("reading the listeners of {pid}: {e}"),
            }
            assert!(
                Instant::now() < deadline,
                "gateway {pid} not listening on all of {ips:?} after 20 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The TLS listener of process `pid`, once `listening` returned.
    pub fn tls_listening(&self, pid: u32) -> SocketAddr {
        let ip: IpAddr = TLS_IP.parse().unwrap();
        ports::listening_on(pid, &[ip]).unwrap().unwrap()[0]
    }
}

pub struct Gateway {
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    /// The TLS listener, when started with `start_tls`.
    pub tls_addr: Option<SocketAddr>,
    conf: Conf,
    child: Child,
    /// Directories of files the gateway reads (certificates), removed with it.
    kept: Vec<TempDir>,
}

impl Gateway {
    /// Start with `gateway_keys` (YAML lines indented under `gateway:`, which
    /// must include `models:`); the listeners are added here.
    pub async fn start(gateway_keys: &str) -> Gateway {
        Gateway::spawn(Conf::new(1), gateway_keys, None, "info").await
    }

    /// Like `start`, logging at `RUST_LOG=level`.
    pub async fn start_logging(gateway_keys: &str, level: &str) -> Gateway {
        Gateway::spawn(Conf::new(1), gateway_keys, None, level).await
    }

    /// Like `start`, with a TLS listener too, serving these files.
    pub async fn start_tls(gateway_keys: &str, cert_file: PathBuf, key_file: PathBuf) -> Gateway {
        let conf = Conf::new(1).serve_tls(cert_file, key_file);
        Gateway::spawn(conf, gateway_keys, None, "info").await
    }

    /// Like `start`, but stderr is a pipe for the test to take
    /// (`take_stderr`) and read, or leave unread like a stalled journald.
    /// `stderr()` is then empty, and so is the log shown on failure.
    pub async fn start_with_stderr_pipe(gateway_keys: &str) -> Gateway {
        Gateway::spawn(Conf::new(1), gateway_keys, Some(Stdio::piped()), "info").await
    }

    async fn spawn(
        conf: Conf,
        gateway_keys: &str,
        stderr: Option<Stdio>,
        log_level: &str,
    ) -> Gateway {
        conf.write(gateway_keys);
        let mut command = conf.command(&[]);
        command.env("RUST_LOG", log_level);
        if let Some(stderr) = stderr {
            command.stderr(stderr);
        }
        let child = command.spawn().unwrap();
        // Held by a `Gateway` from here on, so that it is killed (and its
        // log shown) also when it never listens.
        let unknown = SocketAddr::from((CLIENT_IP, 0));
        let mut gw = Gateway {
            addr: unknown,
            metrics: unknown,
            tls_addr: None,
            conf,
            child,
            kept: Vec::new(),
        };
        (gw.addr, gw.metrics) = gw.conf.listening(gw.child.id()).await;
        if gw.conf.tls.is_some() {
            gw.tls_addr = Some(gw.conf.tls_listening(gw.child.id()));
        }
        gw
    }

    /// Keep `dir` (files this gateway reads) until the gateway is dropped.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn keep(mut self, dir: TempDir) -> Gateway {
        self.kept.push(dir);
        self
    }

    /// The read end of the stderr pipe (`start_with_stderr_pipe`).
    pub fn take_stderr(&mut self) -> ChildStderr {
        self.child
            .stderr
            .take()
            .expect("started with a stderr pipe")
    }

    /// SIGTERM, Pingora's graceful shutdown; blocks until the process has
    /// exited.
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let kill = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(kill.success(), "kill -TERM {pid}");
        self.child.wait().unwrap()
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

    /// The Prometheus text from the metrics listener.
    pub async fn metrics_text(&self) -> String {
        crate::support::metrics::scrape(self.metrics).await
    }

    /// One sample's value (0 when the series does not exist yet).
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        crate::support::metrics::sample(&self.metrics_text().await, name, labels).unwrap_or(0.0)
    }

    pub fn stderr(&self) -> String {
        self.conf.log()
    }

    /// Every line logged so far, each parsed as one JSON object. A last
    /// line without its newline is still being written and is left out.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        let log = self.stderr();
        let complete = log.rfind('\n').map_or("", |end| &log[..end]);
        complete
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
                self.conf.path().display(),
                self.stderr()
            );
        }
    }
}
