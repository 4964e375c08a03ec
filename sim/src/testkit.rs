//! Test helpers: a simulator on a loopback port and a bare HTTP/1.1 client,
//! so tests assert on the bytes a client would read.

use std::net::SocketAddr;

use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::app::App;
use crate::config::Args;
use crate::kv_events::{self, Bound};

/// A running simulator; it stops when dropped.
pub struct Sim {
    pub addr: SocketAddr,
    /// Its KV events sockets, if the flags asked for them.
    pub kv: Option<Bound>,
    _stop: watch::Sender<bool>,
}

/// Starts a simulator on 127.0.0.1 with no delays and the given flags.
pub async fn start(flags: &[&str]) -> Sim {
    let mut argv = vec!["vllm-sim", "--listen", "127.0.0.1:0", "--time-scale", "0"];
    argv.extend_from_slice(flags);
    let args = Args::parse_from(argv);
    let (publisher, kv) = kv_events::start(&args).await.unwrap().unzip();
    let app = App::with_kv_events(&args, publisher);
    let listener = crate::server::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(crate::server::run(app, listener, stop_rx));
    Sim {
        addr,
        kv,
        _stop: stop,
    }
}

/// What came back: status, lowercased header lines, the body (de-chunked).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// `(event name, data as JSON)` of each SSE event, in order.
    pub fn events(&self) -> Vec<(String, serde_json::Value)> {
        self.body
            .split_terminator("\n\n")
            .map(|e| {
                let (head, data) = e.split_once("data: ").expect("event has data");
                let name = head
                    .strip_prefix("event: ")
                    .map_or("", |n| n.trim_end_matches('\n'));
                (name.to_owned(), serde_json::from_str(data).unwrap())
            })
            .collect()
    }
}

impl Sim {
    /// One request on a new connection (`Connection: close`).
    pub async fn send(&self, method: &str, path: &str, body: Option<&str>) -> Reply {
        self.send_with(method, path, body.unwrap_or(""), "").await
    }

    /// `send` with one more header line (`name: value`, or "" for none).
    pub async fn send_with(&self, method: &str, path: &str, body: &str, header: &str) -> Reply {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        let extra = if header.is_empty() {
            String::new()
        } else {
            format!("{header}\r\n")
        };
        let req = format!(
            "{method} {path} HTTP/1.1\r\nhost: sim\r\nconnection: close\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
        let status = head[9..12].parse().unwrap();
        let headers = head.to_ascii_lowercase();
        let body = if headers.contains("transfer-encoding: chunked") {
            dechunk(rest)
        } else {
            rest.to_owned()
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn post(&self, path: &str, body: &str) -> Reply {
        self.send("POST", path, Some(body)).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send("GET", path, None).await
    }

    /// The value of one sample line of `/metrics`, e.g.
    /// `vllm:prefix_cache_hits_total`.
    pub async fn metric(&self, name: &str) -> u64 {
        let text = self.get("/metrics").await.body;
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(size, 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}
