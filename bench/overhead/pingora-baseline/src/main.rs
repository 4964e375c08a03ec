//! pingora-baseline LISTEN THREADS BACKEND...
//!
//! The least a Pingora proxy does: one `ProxyHttp` whose `upstream_peer`
//! hashes `X-Poimen-Cache-Key` (FNV-1a, modulo the backend count) to pick a
//! backend, with Pingora's upstream connection pool. The request body
//! streams through; nothing is parsed, counted or logged. Runs Pingora's
//! no-steal runtime, as the gateway's shipped configuration does.

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

struct Baseline {
    backends: Vec<String>,
}

#[async_trait]
impl ProxyHttp for Baseline {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
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
        let addr = &self.backends[(h % self.backends.len() as u64) as usize];
        Ok(Box::new(HttpPeer::new(addr.as_str(), false, String::new())))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: pingora-baseline LISTEN THREADS BACKEND...");
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
        },
    );
    svc.add_tcp(&args[1]);
    server.add_service(svc);
    server.run_forever();
}
