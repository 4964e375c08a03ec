#!/usr/bin/env bash
# Installs what building and testing poimen-gateway needs on a fresh Debian
# machine with a Rust toolchain: cmake (Pingora builds zlib-ng with it), a C
# toolchain, the CA certificates (default trust for TLS backends and JWKS
# URLs), and the OpenAI and Anthropic Python SDKs (tests drive the gateway
# with them). Idempotent: it installs only what is missing.
set -euo pipefail

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(build-essential)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v python3 >/dev/null || need+=(python3 python3-pip)
# The system trust store: the default trust of TLS backends and jwks_url.
[ -e /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
# The official SDKs the integration tests drive the gateway with.
for sdk in openai anthropic; do
  python3 -c "import $sdk" 2>/dev/null ||
    python3 -m pip install -q --disable-pip-version-check "$sdk" ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages "$sdk"
done
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
echo "setup: ok (cmake $(cmake --version | head -1 | awk '{print $3}'), $(cargo --version))"
