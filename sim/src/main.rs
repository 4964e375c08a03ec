//! vllm-sim: a simulated vLLM 0.32 OpenAI-compatible server for routing and
//! prefix-caching tests. This file only parses flags, binds, announces the
//! address on stdout and runs the server until SIGTERM / SIGINT.

mod api;
mod app;
mod batch;
mod cache;
mod common;
mod completions;
mod config;
mod conversation;
mod engine;
mod faults;
mod kv_events;
mod lora;
mod lora_routes;
mod messages;
mod messages_shapes;
mod metrics;
mod responses;
mod responses_shapes;
mod responses_store;
mod server;
mod shapes;
mod sse;
#[cfg(test)]
mod testkit;
mod timing;
mod tokenize;
mod tokenizer_routes;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio::sync::watch;

use crate::config::{Args, FaultMode};

#[tokio::main]
async fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Stderr)
        .init();
    let args = Args::parse().with_env();
    if let Err(e) = args.validate() {
        eprintln!("vllm-sim: {e}");
        return ExitCode::from(2);
    }
    let kv_events = match kv_events::start(&args).await {
        Ok(Some((publisher, bound))) => {
            let replay = bound.replay.map_or("off".into(), |a| format!("tcp://{a}"));
            log::info!("KV events: PUB on tcp://{}, replay {replay}", bound.events);
            Some(publisher)
        }
        Ok(None) => None,
        Err(e) => {
            eprintln!("vllm-sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    let app = app::App::with_kv_events(&args, kv_events);
    let listener = match server::bind(args.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("vllm-sim: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener
        .local_addr()
        .expect("bound listener has an address");
    // The one stdout line a parent process waits for (port 0 support).
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "vllm-sim listening on {addr}");
    let _ = out.flush();
    drop(out);
    if let (Some(ms), true) = (args.fault_duration_ms, args.fault != FaultMode::None) {
        app.faults
            .set(args.fault, None, Some(Duration::from_millis(ms)));
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        log::info!("signal received, shutting down");
        let _ = stop_tx.send(true);
    });
    server::run(app, listener, stop_rx).await;
    ExitCode::SUCCESS
}

/// SIGINT or SIGTERM.
async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler installs");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
