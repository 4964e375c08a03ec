//! Starting a built `vllm-sim` as its users do (the demo, the gateway's
//! integration tests, the sim's own binary test): on the address `--listen`
//! gives (port 0: a free one), reading back the address it bound from the
//! first line it prints. Included by `#[path]`: the sim is a binary crate.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The running sim and the address it listens on. `args` must include
/// `--listen`.
pub fn start(bin: &Path, args: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(bin)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} starts: {e}", bin.display()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("vllm-sim prints its address");
    let addr = line
        .trim()
        .strip_prefix("vllm-sim listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("vllm-sim's first line: {line:?}"));
    (child, addr)
}
