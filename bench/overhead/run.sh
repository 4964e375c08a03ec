#!/usr/bin/env bash
# Data-plane overhead: direct vs nginx vs poimen-gateway (vs a bare Pingora
# proxy, vllm-router, sglang-router), one run with interleaved rounds; writes
# bench/results/overhead.md. Loopback only.
#   bash bench/setup.sh                 # once: nginx, wrk, aiohttp, matplotlib, the routers' venv
#   bash bench/overhead/run.sh [--rounds 5 --duration 10 --threads 1 --targets ... ...]
# POIMEN_BIN_DIR picks the binaries (default <repo>/target/release, built
# with `cargo build --release --bins` when missing). Every process the run
# starts is stopped at its end, also on failure or Ctrl-C.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec python3 "$here/run.py" "$@"
