#!/usr/bin/env bash
# One-command demo: builds the gateway and the vLLM simulator, starts three
# simulated vLLM instances and the gateway (conf/demo.yaml, on free loopback
# ports), runs a short keyed agent workload and the same workload without
# keys, prints where each session went, the prefix-cache hit rates and a
# /metrics excerpt, then stops everything it started.
set -euo pipefail
cd "$(dirname "$0")"
cargo build --release --quiet --bins --example demo
exec ./target/release/examples/demo
