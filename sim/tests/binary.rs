//! The built binary, as the gateway's tests and the demo start it: it says
//! where it listens on its first line and serves there. (This test also makes
//! `cargo test` build `target/<profile>/vllm-sim`, which the gateway's
//! integration tests start.)

use std::io::{Read, Write};
use std::net::TcpStream;

#[path = "../launch.rs"]
mod launch;

#[test]
fn the_binary_announces_its_address_and_serves_health() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_vllm-sim"));
    let (mut child, addr) = launch::start(bin, &["--listen", "127.0.0.1:0", "--model", "m"]);
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
