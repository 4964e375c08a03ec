#!/usr/bin/env bash
# Installs what the benchmarks under bench/ need on a fresh Debian machine,
# idempotently (only what is missing):
#   Debian: nginx (proxy under comparison and the near-free fake backends),
#           haproxy (2.6 on bookworm, the other proxy under comparison),
#           wrk (saturated HTTP load), procps (ps, for ad-hoc checks)
#   PyPI:   aiohttp (paced / SSE / routing / overload clients), matplotlib (chart)
#   PyPI, in a venv of their own (bench/.venv, git-ignored; POIMEN_BENCH_VENV
#           puts it elsewhere), pinned: vllm-router 0.1.17 and sglang-router
#           0.3.2, the LLM routers bench/overhead and bench/routing (its peer
#           modes) compare the gateway with; and in a venv of its own
#           (bench/.venv-smg, or that path + "-smg"), pinned: smg 1.13.0 (the
#           SGLang Model Gateway, bench/routing's smg-* peers), apart because
#           sglang-router 0.3.2 installs a console script named smg too
#           (Debian: python3-venv when Python's venv module lacks ensurepip)
# With --profile also: linux-perf, strace, curl, heaptrack (for
# bench/overhead/profile.py and allocs.py only).
# The gateway itself needs what scripts/setup.sh installs (cmake, a C toolchain).
# Installing nginx does not start the distribution's nginx service when
# policy-rc.d forbids it (containers); if it did start one, nothing here uses
# port 80 anyway: every bench starts its own nginx with its own config.
# haproxy likewise; where its service did start (systemd, no policy-rc.d), it
# is stopped and disabled when installed here: the overhead bench starts its
# own haproxy, and an idle one would only sit on the cores being measured.
set -euo pipefail

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v wrk >/dev/null || need+=(wrk)
command -v ps >/dev/null || need+=(procps)
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
if [ "${1:-}" = "--profile" ]; then
  command -v perf >/dev/null || need+=(linux-perf)
  command -v strace >/dev/null || need+=(strace)
  command -v curl >/dev/null || need+=(curl)
  command -v heaptrack >/dev/null || need+=(heaptrack)
fi
if [ ${#need[@]} -gt 0 ]; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
  if [[ " ${need[*]} " == *" haproxy "* ]] && command -v systemctl >/dev/null &&
     systemctl is-active --quiet haproxy 2>/dev/null; then
    $sudo systemctl disable --now haproxy
  fi
fi

pyneed=()
python3 -c 'import aiohttp' 2>/dev/null || pyneed+=(aiohttp)
python3 -c 'import matplotlib' 2>/dev/null || pyneed+=(matplotlib)
if [ ${#pyneed[@]} -gt 0 ]; then
  python3 -m pip install -q --disable-pip-version-check "${pyneed[@]}" ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages "${pyneed[@]}"
fi

# the routers: exact versions, each venv with its pins; pip runs only when one
# differs. smg (the `smg` dist) has a venv of its own: sglang-router 0.3.2
# already puts a `smg` script in bin/, and the two would overwrite each other.
here="$(cd "$(dirname "$0")" && pwd)"
venv="${POIMEN_BENCH_VENV:-$here/.venv}"
smg_venv="${venv%/}-smg"  # C.router_venv("smg") in bench/common.py
routers=(vllm-router==0.1.17 sglang-router==0.3.2)
smg_routers=(smg==1.13.0)
installed() {  # venv pin...: name==version (or "name missing") of each pin, one a line
  "$1/bin/python" -c '
import importlib.metadata as m, sys
for spec in sys.argv[1:]:
    name = spec.split("==")[0]
    try:
        print(f"{name}=={m.version(name)}")
    except m.PackageNotFoundError:
        print(f"{name} missing")
' "${@:2}"
}
pin() {  # venv pin...: makes the venv if needed, installs the pins if one differs
  "$1/bin/python" -m pip --version >/dev/null 2>&1 || python3 -m venv --clear "$1"
  if [ "$(installed "$@")" != "$(printf '%s\n' "${@:2}")" ]; then
    "$1/bin/python" -m pip install -q --disable-pip-version-check "${@:2}"
  fi
}
pin "$venv" "${routers[@]}"
pin "$smg_venv" "${smg_routers[@]}"

nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
haproxy_bin=$(command -v haproxy || echo /usr/sbin/haproxy)
echo "bench setup: ok ($($nginx_bin -v 2>&1), $($haproxy_bin -v | head -1 | awk '{print $1, $3}'), $(wrk -v 2>&1 | head -1 | awk '{print $1, $2}'), aiohttp $(python3 -c 'import aiohttp; print(aiohttp.__version__)'), matplotlib $(python3 -c 'import matplotlib; print(matplotlib.__version__)'); $venv: $(installed "$venv" "${routers[@]}" | paste -sd ' '); $smg_venv: $(installed "$smg_venv" "${smg_routers[@]}" | paste -sd ' '))"
