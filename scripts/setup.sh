#!/usr/bin/env bash
# Installs what building and testing poimen-gateway needs on a fresh Debian
# machine with a Rust toolchain: cmake (Pingora builds zlib-ng with it) and a
# C toolchain. Idempotent: it installs only what is missing.
set -euo pipefail

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(build-essential)
command -v pkg-config >/dev/null || need+=(pkg-config)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
echo "setup: ok (cmake $(cmake --version | head -1 | awk '{print $3}'), $(cargo --version))"
