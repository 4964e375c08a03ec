//! pingora-baseline LISTEN THREADS [--read] [--timeouts] [--headers] [--body] BACKEND...
//!
//! The least a Pingora proxy does: one `ProxyHttp` whose `upstream_peer`
//! hashes `X-Poimen-Cache-Key` (FNV-1a, modulo the backend count) to pick a
//! backend, with Pingora's upstream connection pool. The request body
//! streams through; nothing is parsed, counted or logged. Runs Pingora's
//! no-steal runtime, as the gateway's shipped configuration does.
//!
//! The flags add, one by one, what any model-routing proxy on Pingora must
//! do, the way the gateway does it, and nothing of the gateway's own policy:
//! - `--read`: read the body whole before choosing (the model may come
//!   last), find `model` in it, forward the body read (the patched
//!   pingora-proxy, as the gateway's);
//! - `--timeouts`: connect and read timeouts on the peer;
//! - `--headers`: two response headers (`X-Poimen-Backend`, `X-Poimen-Route`);
//! - `--body`: all three. The gateway minus this = the cost of its routing,
//!   admission, accounting and metrics.

use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

struct Baseline {
    backends: Vec<String>,
    read: bool,
    timeouts: bool,
    headers: bool,
}

#[derive(Default)]
struct Ctx {
    body: Option<Bytes>,
    backend: usize,
}

#[derive(serde::Deserialize)]
struct Probe<'a> {
    #[serde(borrow)]
    model: Option<&'a str>,
}

async fn read_whole(session: &mut Session) -> Result<Bytes> {
    let mut first: Option<Bytes> = None;
    let mut buf: Option<BytesMut> = None;
    while let Some(chunk) = session.read_request_body().await? {
        if let Some(buf) = &mut buf {
            buf.extend_from_slice(&chunk);
        } else if let Some(one) = first.take() {
            let mut b = BytesMut::with_capacity(one.len() + chunk.len());
            b.extend_from_slice(&one);
            b.extend_from_slice(&chunk);
            buf = Some(b);
        } else {
            first = Some(chunk);
        }
    }
    Ok(buf.map_or_else(|| first.unwrap_or_default(), BytesMut::freeze))
}

#[async_trait]
impl ProxyHttp for Baseline {
    type CTX = Ctx;

    fn new_ctx(&self) -> Self::CTX {
        Ctx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        if self.read {
            let body = read_whole(session).await?;
            let probe: Probe = serde_json::from_slice(&body)
                .map_err(|e| Error::because(ErrorType::HTTPStatus(400), "body", e))?;
            if probe.model.is_none() {
                return Error::e_explain(ErrorType::HTTPStatus(400), "no model");
            }
            ctx.body = Some(body);
        }
        Ok(false)
    }

    async fn upstream_peer(&self, session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let key = session
            .req_header()
            .headers
            .get("x-poimen-cache-key")
            .map(|v| v.as_bytes())
            .unwrap_or(b"");
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        ctx.backend = (h % self.backends.len() as u64) as usize;
        let mut peer = HttpPeer::new(self.backends[ctx.backend].as_str(), false, String::new());
        if self.timeouts {
            peer.options.connection_timeout = Some(Duration::from_secs(2));
            peer.options.read_timeout = Some(Duration::from_secs(600));
        }
        Ok(Box::new(peer))
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(full) = &ctx.body {
            *body = Some(if end_of_stream {
                full.clone()
            } else {
                Bytes::new()
            });
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if self.headers {
            resp.insert_header("X-Poimen-Backend", self.backends[ctx.backend].as_str())?;
            resp.insert_header("X-Poimen-Route", "hash")?;
        }
        Ok(())
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let flags: Vec<String> = args
        .iter()
        .skip(3)
        .take_while(|a| a.starts_with("--"))
        .cloned()
        .collect();
    args.drain(3..3 + flags.len());
    let has = |f: &str| flags.iter().any(|a| a == f || a == "--body");
    if args.len() < 4
        || flags
            .iter()
            .any(|f| !["--read", "--timeouts", "--headers", "--body"].contains(&f.as_str()))
    {
        eprintln!("usage: pingora-baseline LISTEN THREADS [--read] [--timeouts] [--headers] [--body] BACKEND...");
        std::process::exit(2);
    }
    let conf = ServerConf {
        threads: args[2].parse().expect("THREADS is a number"),
        work_stealing: false,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut svc = http_proxy_service(
        &server.configuration,
        Baseline {
            backends: args[3..].to_vec(),
            read: has("--read"),
            timeouts: has("--timeouts"),
            headers: has("--headers"),
        },
    );
    svc.add_tcp(&args[1]);
    server.add_service(svc);
    server.run_forever();
}
