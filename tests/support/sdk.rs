//! The official Python SDKs (OpenAI's, Anthropic's; scripts/setup.sh
//! installs both) driving the gateway: whether one can be imported, and
//! running a script of tests/sdk/ that prints one JSON object.

use std::io::Write;
use std::time::Duration;

use serde_json::Value;

/// A bound on one script run, beyond the SDK's own per-request timeouts.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(90);

/// Whether `python3` can import `module`. Without it the calling test is
/// skipped, so that `cargo test` runs everywhere, except under CI (`CI`
/// set), where scripts/setup.sh installs the SDKs and a skip would hide a
/// failure.
pub async fn sdk_available(module: &str) -> bool {
    let import = tokio::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .await;
    let why = match import {
        Ok(out) if out.status.success() => return true,
        Ok(out) => String::from_utf8_lossy(&out.stderr).into_owned(),
        Err(e) => format!("python3: {e}"),
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set and the Python module {module} cannot be imported (bash scripts/setup.sh installs it):\n{why}"
    );
    // The test's body runs on the harness thread named after the test.
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    // Written past the test harness's capture, so that a plain `cargo test`
    // shows the skip.
    let _ = writeln!(
        std::io::stderr(),
        "skipped {test}: the Python module {module} cannot be imported (bash scripts/setup.sh installs it):\n{why}"
    );
    false
}

/// Run `python3 tests/sdk/<script> ARGS` and parse the one JSON object it
/// prints; its stderr is shown when it fails.
pub async fn run(script: &str, args: &[&str]) -> Value {
    let path = format!("{}/tests/sdk/{script}", env!("CARGO_MANIFEST_DIR"));
    let command = format!("python3 {path} {}", args.join(" "));
    let run = tokio::process::Command::new("python3")
        .arg(&path)
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(SCRIPT_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| panic!("{command}: still running after {SCRIPT_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{command}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{command}: {}\n{stderr}", out.status);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        let stdout = String::from_utf8_lossy(&out.stdout);
        panic!("{command}: not one JSON object ({e}):\n{stdout}\n{stderr}")
    })
}
