//! The built binary, as the gateway's tests and the demo start it: it says
//! where it listens on its first line and serves there. (This test also makes
//! `cargo test` build `target/<profile>/vllm-sim`, which the gateway's
//! integration tests start.)

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};

#[test]
fn the_binary_announces_its_address_and_serves_health() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vllm-sim"))
        .args(["--listen", "127.0.0.1:0", "--model", "m"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("vllm-sim starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("vllm-sim listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("first line: {line:?}"));
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
