//! vllm-sim instances for tests that need a backend with vLLM's state (the
//! Responses store, the prefix cache): the binary `cargo test` builds beside
//! the gateway's, on a free port, killed on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Child;

#[path = "../../sim/launch.rs"]
mod launch;

use super::gateway::BIN;

pub struct Sim {
    pub addr: SocketAddr,
    child: Child,
}

fn sim_bin() -> PathBuf {
    let bin = std::path::Path::new(BIN).with_file_name("vllm-sim");
    assert!(bin.exists(), "{} is built by `cargo test`", bin.display());
    bin
}

impl Sim {
    /// A sim serving `model`, its delays scaled to nothing, with `args`.
    pub fn start(model: &str, args: &[&str]) -> Sim {
        Sim::start_scaled(model, "0", args)
    }

    /// A sim whose delays (`--decode-us-per-token`...) are multiplied by
    /// `time_scale`: "1" takes them as given.
    pub fn start_scaled(model: &str, time_scale: &str, args: &[&str]) -> Sim {
        Sim::start_on("127.0.0.1:0", model, time_scale, args)
    }

    /// A sim listening on `listen` (a loopback address, port 0: a free one).
    pub fn start_on(listen: &str, model: &str, time_scale: &str, args: &[&str]) -> Sim {
        let base = [
            "--listen",
            listen,
            "--model",
            model,
            "--time-scale",
            time_scale,
        ];
        let all: Vec<&str> = base.iter().chain(args).copied().collect();
        let (child, addr) = launch::start(&sim_bin(), &all);
        Sim { addr, child }
    }

    /// `n` sims serving `model`.
    pub fn start_n(n: usize, model: &str) -> Vec<Sim> {
        (0..n).map(|_| Sim::start(model, &[])).collect()
    }

    /// The sim's own counts (`/sim/stats`).
    pub async fn stats(&self) -> serde_json::Value {
        let url = format!("http://{}/sim/stats", self.addr);
        super::client()
            .get(url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The value of `name` (all series summed) on the sim's /metrics.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = super::metrics::scrape(self.addr).await;
        text.lines()
            .filter(|l| l.split([' ', '{']).next() == Some(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
