//! The demo behind `./demo.sh`: three vllm-sim instances, the gateway with
//! `conf/demo.yaml`, and an agent workload run four times: with
//! `X-Poimen-Cache-Key` under pure rendezvous and by cost over the prefix
//! index (the shipped setting), and without a key by cost (shipped), by
//! cost over the simulators' KV-cache events, and under round-robin. Every process it starts is stopped when it ends.
//!
//! Everything listens on a free port the process picks itself (port 0) and
//! the demo reads back, so that two runs on one machine do not collide.

use std::collections::{BTreeMap, BTreeSet};

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The gateway's listeners as the tests read them back.
#[path = "../tests/support/ports.rs"]
mod ports;

const MODEL: &str = "demo-model";
const SESSIONS: usize = 10;
const TURNS: usize = 4;
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// The metrics listener must differ from the client one; Linux serves all
/// of 127.0.0.0/8 on loopback.
const METRICS_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Children killed and the run's files removed when the demo ends, however
/// it ends.
struct Procs {
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Deterministic filler text: `words` pseudo-random words from `seed`.
fn text(seed: u64, words: usize) -> String {
    const VOCAB: [&str; 12] = [
        "memory", "agent", "tool", "result", "plan", "cache", "token", "step", "note", "user",
        "context", "answer",
    ];
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..words)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            VOCAB[(x >> 33) as usize % VOCAB.len()]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[path = "../sim/launch.rs"]
mod launch;

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// The simulators' KV-cache events: the same ports on each one's own
/// loopback address (`127.0.0.1x`), as vLLM on hosts of their own.
struct Events {
    port: u16,
    replay_port: u16,
}

/// A port free on each of `ips`.
fn free_port(ips: &[Ipv4Addr]) -> u16 {
    loop {
        let port = std::net::TcpListener::bind((ips[0], 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        if ips
            .iter()
            .all(|ip| std::net::TcpListener::bind((*ip, port)).is_ok())
        {
            return port;
        }
    }
}

/// A vllm-sim on a free port of `ip`, publishing its KV-cache events, and
/// the address it reports.
fn start_sim(bin: &Path, ip: Ipv4Addr, events: &Events) -> (Child, SocketAddr) {
    let listen = format!("{ip}:0");
    let (port, replay) = (events.port.to_string(), events.replay_port.to_string());
    launch::start(
        bin,
        &["--listen", &listen, "--model", MODEL, "--time-scale", "0.2"]
            .into_iter()
            .chain(["--kv-cache-tokens", "16384", "--max-num-seqs", "4"])
            .chain(["--kv-events-port", &port, "--kv-replay-port", &replay])
            .collect::<Vec<_>>(),
    )
}

/// conf/demo.yaml with this run's addresses: the listeners on port 0, the
/// model on the simulators, the pid file and upgrade socket in `dir`; and
/// `routing` set as `mode` says, the simulators' `events` followed if it
/// says so.
fn write_config(dir: &Path, sims: &[SocketAddr], events: &Events, mode: &Mode) -> PathBuf {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/demo.yaml");
    let text = std::fs::read_to_string(demo).expect("conf/demo.yaml");
    let mut conf: serde_yaml::Value = serde_yaml::from_str(&text).expect("conf/demo.yaml is YAML");
    conf["pid_file"] = dir.join("demo.pid").display().to_string().into();
    conf["upgrade_sock"] = dir.join("upgrade.sock").display().to_string().into();
    let gateway = &mut conf["gateway"];
    gateway["listen"] = format!("{CLIENT_IP}:0").into();
    gateway["metrics_listen"] = format!("{METRICS_IP}:0").into();
    let model = gateway["models"]
        .as_sequence_mut()
        .and_then(|models| models.iter_mut().find(|m| m["name"] == MODEL))
        .expect("conf/demo.yaml serves the demo's model");
    model["addresses"] = sims.iter().map(|a| a.to_string()).collect();
    if mode.events {
        // The sims' events number each byte of a prompt as a token (the
        // byte-level model of conf/byte-model), 4 to the sims' own token:
        // their 16-token blocks are 64 there.
        let tokenizer = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/byte-model");
        let kv = format!(
            "{{port: {}, replay_port: {}, block_size: 64, tokenizer: \"{tokenizer}\"}}",
            events.port, events.replay_port
        );
        model["kv_events"] = serde_yaml::from_str(&kv).unwrap();
    }
    let routing = gateway["routing"]
        .as_mapping_mut()
        .expect("conf/demo.yaml has a routing section");
    for (key, value) in mode.routing {
        match value {
            Some(v) => routing.insert((*key).into(), serde_yaml::from_str(v).unwrap()),
            None => routing.remove(*key),
        };
    }
    let path = dir.join(format!("{}.yaml", mode.name));
    std::fs::write(&path, serde_yaml::to_string(&conf).unwrap()).unwrap();
    path
}

/// The gateway's client and metrics addresses, once it listens on both
/// (Pingora binds them after the process started).
async fn listening(gateway: &mut Child) -> (SocketAddr, SocketAddr) {
    let ips = [IpAddr::V4(CLIENT_IP), IpAddr::V4(METRICS_IP)];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = gateway.try_wait().unwrap() {
            panic!("the gateway exited: {status}");
        }
        let found = ports::listening_on(gateway.id(), &ips).expect("the gateway's /proc entries");
        if let Some(addrs) = found {
            return (addrs[0], addrs[1]);
        }
        assert!(Instant::now() < deadline, "the gateway did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One run of the workload: per session, the backends used; requests per
/// backend; the usage.
struct Run {
    backends: BTreeMap<String, BTreeSet<String>>,
    requests: BTreeMap<String, usize>,
    prompt: u64,
    cached: u64,
}

/// A run of the demo: the gateway's routing section as shipped, with these
/// keys replaced (`None`: removed), and whether clients send a key.
struct Mode {
    name: &'static str,
    title: &'static str,
    keyed: bool,
    routing: &'static [(&'static str, Option<&'static str>)],
    /// The model follows the simulators' KV-cache events.
    events: bool,
}

const MODES: [Mode; 5] = [
    Mode {
        name: "keyed",
        title: "with X-Poimen-Cache-Key, pure rendezvous (each session stays on one GPU)",
        keyed: true,
        routing: &[("prefix_index", None)],
        events: false,
    },
    Mode {
        name: "cost",
        title: "with X-Poimen-Cache-Key, by cost (shipped: a session stays where its context is cached unless waiting costs more)",
        keyed: true,
        routing: &[],
        events: false,
    },
    Mode {
        name: "keyless",
        title: "without a key, by cost (shipped: the prefix index finds each session's GPU)",
        keyed: false,
        routing: &[],
        events: false,
    },
    Mode {
        name: "events",
        title: "without a key, by cost over the simulators' KV-cache events (models[].kv_events: the index knows what each GPU holds)",
        keyed: false,
        routing: &[],
        events: true,
    },
    Mode {
        name: "round-robin",
        title: "without a key, round-robin (sessions wander)",
        keyed: false,
        routing: &[("keyless", Some("round_robin")), ("prefix_index", None)],
        events: false,
    },
];

async fn chat(
    http: &reqwest::Client,
    url: &str,
    messages: &Value,
    key: Option<&str>,
    warmup: bool,
) -> (String, u64, u64) {
    let max_tokens = if warmup { 1 } else { 16 };
    let body =
        json!({"messages": messages, "max_tokens": max_tokens, "model": MODEL, "tools": tools()});
    let mut req = http.post(url).json(&body);
    if let Some(k) = key {
        req = req.header("X-Poimen-Cache-Key", k);
    }
    if warmup {
        req = req.header("X-Poimen-Warmup", "true");
    }
    let resp = req.send().await.expect("gateway answers");
    let backend = resp.headers()["x-poimen-backend"]
        .to_str()
        .unwrap()
        .to_string();
    let v: Value = resp.json().await.expect("JSON answer");
    let usage = &v["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (backend, prompt, cached)
}

/// An agent's tools, the same in every session (as a coding agent's are).
fn tools() -> Value {
    let tool = |name: &str, seed: u64| {
        json!({"type": "function", "function": {"name": name, "description": text(seed, 300),
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}})
    };
    json!([tool("read_file", 7), tool("run", 8)])
}

async fn workload(http: &reqwest::Client, url: &str, keyed: bool, seed: u64) -> Run {
    let system = text(1, 900);
    let mut run = Run {
        backends: BTreeMap::new(),
        requests: BTreeMap::new(),
        prompt: 0,
        cached: 0,
    };
    let mut convs: Vec<Vec<Value>> = (0..SESSIONS)
        .map(|s| {
            let memory = text(seed + s as u64, 1200);
            vec![json!({"role": "system", "content": format!("{system}\n{memory}")})]
        })
        .collect();
    let name = |s: usize| format!("session-{s}");
    // A memory service pre-fills each session's cache with a warmup.
    let warmups = (0..SESSIONS).map(|s| {
        let key = keyed.then(|| name(s));
        let msgs = Value::Array(convs[s].clone());
        async move { chat(http, url, &msgs, key.as_deref(), true).await }
    });
    for (backend, _, _) in futures::future::join_all(warmups).await {
        *run.requests.entry(backend).or_default() += 1;
    }
    for turn in 0..TURNS {
        for (s, conv) in convs.iter_mut().enumerate() {
            conv.push(json!({"role": "user", "content": text(seed * 100 + (s * TURNS + turn) as u64, 40)}));
        }
        let turns = convs.iter().enumerate().map(|(s, conv)| {
            let key = keyed.then(|| name(s));
            let msgs = Value::Array(conv.clone());
            async move { (s, chat(http, url, &msgs, key.as_deref(), false).await) }
        });
        for (s, (backend, prompt, cached)) in futures::future::join_all(turns).await {
            *run.requests.entry(backend.clone()).or_default() += 1;
            run.backends.entry(name(s)).or_default().insert(backend);
            run.prompt += prompt;
            run.cached += cached;
            // The model called a tool; its result comes with the next turn.
            let id = format!("call-{s}-{turn}");
            let arguments = json!({"path": format!("src/session{s}/turn{turn}.rs")}).to_string();
            convs[s].push(json!({"role": "assistant", "content": text(s as u64, 16), "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}]}));
            convs[s].push(json!({"role": "tool", "tool_call_id": id, "content": text(seed * 1000 + (s * TURNS + turn) as u64, 60)}));
        }
    }
    run
}

fn report(title: &str, run: &Run) {
    println!("\n{title}");
    for (session, backends) in &run.backends {
        let list: Vec<&str> = backends.iter().map(String::as_str).collect();
        println!("  {session}  ->  {}", list.join(", "));
    }
    let mut per_backend: BTreeMap<&str, usize> = BTreeMap::new();
    for backends in run.backends.values() {
        for b in backends {
            *per_backend.entry(b).or_default() += 1;
        }
    }
    println!("  sessions per backend: {per_backend:?}");
    println!("  requests per backend: {:?}", run.requests);
    let rate = run.cached as f64 / run.prompt.max(1) as f64;
    println!(
        "  prompt tokens {}, cached {}: hit rate {:.1}%",
        run.prompt,
        run.cached,
        rate * 100.0
    );
}

/// The lines of the gateway's /metrics a newcomer looks at first.
async fn metrics_excerpt(http: &reqwest::Client, metrics: SocketAddr) -> String {
    let text = http
        .get(format!("http://{metrics}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            (l.starts_with("vllm_prefix_cache_hit_tokens_total")
                || l.starts_with("poimen_gateway_prompt_tokens_total")
                || l.starts_with("warmup_requests_delayed_total")
                || l.starts_with("poimen_gateway_requests_total")
                || l.starts_with("poimen_gateway_prefix_index_"))
                && !l.ends_with(" 0")
        })
        .map(|l| format!("  {l}\n"))
        .collect()
}

#[tokio::main]
async fn main() {
    let bin = bin_dir();
    let mut procs = Procs {
        children: Vec::new(),
        dir: std::env::temp_dir().join(format!("poimen-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&procs.dir).unwrap();
    let mut sims = Vec::new();
    let ips: Vec<Ipv4Addr> = (11..14).map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    let events = Events {
        port: free_port(&ips),
        replay_port: free_port(&ips),
    };
    for ip in &ips {
        let (child, addr) = start_sim(&bin.join("vllm-sim"), *ip, &events);
        procs.children.push(child);
        sims.push(addr);
    }
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let sim_list: Vec<String> = sims.iter().map(SocketAddr::to_string).collect();
    println!(
        "3 simulated vLLM instances ({}) behind poimen-gateway",
        sim_list.join(", ")
    );
    println!(
        "workload: {SESSIONS} agent sessions x {TURNS} turns, a shared system prompt and tools,"
    );
    println!("a per-session memory context, a warmup before each session's first turn, and a");
    println!("tool call and its result after each turn");
    let mut excerpt = String::new();
    for (i, mode) in MODES.iter().enumerate() {
        // A fresh gateway per mode; new memory contexts, so no run reuses
        // another's cache beyond the shared system prompt.
        let conf = write_config(&procs.dir, &sims, &events, mode);
        let gateway = Command::new(bin.join("poimen-gateway"))
            .arg("-c")
            .arg(&conf)
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("gateway starts");
        procs.children.push(gateway);
        let (addr, metrics) = listening(procs.children.last_mut().unwrap()).await;
        let url = format!("http://{addr}/v1/chat/completions");
        let run = workload(&http, &url, mode.keyed, 1000 * (i as u64 + 1)).await;
        report(mode.title, &run);
        if mode.routing.is_empty() && mode.keyed {
            excerpt = metrics_excerpt(&http, metrics).await;
        }
        if let Some(mut g) = procs.children.pop() {
            let _ = g.kill();
            let _ = g.wait();
        }
    }
    println!("\n/metrics excerpt (keyed run by cost):");
    print!("{excerpt}");
    println!("\nstopping the gateway and the simulators");
}
