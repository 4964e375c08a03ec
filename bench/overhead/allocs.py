#!/usr/bin/env python3
"""Heap allocations per request, for bench/results/overhead-analysis.md:
starts the same fake backends as run.py (one nginx, 4 ports) and one proxy
at a time (pingora-bare, pingora-read, pingora-timeouts, pingora-body,
gateway-quiet, gateway, gateway-index-quiet; 1 worker thread), warms it up, attaches heaptrack
for a wrk run (chat.lua, 32 connections), and divides the allocation calls
heaptrack saw by the requests completed meanwhile. heaptrack slows the
proxy down a lot; the count per request, not the rate, is the point. Needs
heaptrack (bash bench/setup.sh --profile).

  python3 bench/overhead/allocs.py [TARGET...]   (default: all of them)
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import run as R  # noqa: E402

TARGETS = ["pingora-bare", "pingora-read", "pingora-timeouts", "pingora-body", "gateway-quiet", "gateway",
           "gateway-index-quiet"]


def start(which: str, procs: C.Procs, bins: Path, wd: Path, port: int, backends: list[int]):
    if which in R.BAREBONES:
        return R.start_bare(procs, which, R.baseline_bin(bins), which, port, 1, backends)
    # gateway-index-quiet: gateway-quiet routing by cost over a prefix index
    extra = {"routing": {"prefix_index": {"cache_tokens": 1 << 20}}} if "index" in which else None
    cfg = C.gateway_yaml(wd, which, port, C.free_port(),
                         [{"name": R.FAKE_MODEL, "addresses": [f"127.0.0.1:{x}" for x in backends]}],
                         threads=1, scheduler={"max_num_seqs": 4096, "max_queue_depth": 0}, extra=extra)
    return C.start_gateway(procs, bins, which, cfg, port, rust_log="info" if which == "gateway" else "warn")


def allocations(procs: C.Procs, p, port: int, out: Path) -> tuple[int, int]:
    """(allocation calls, requests) over one traced wrk run; stops p."""
    h = subprocess.Popen(["heaptrack", "-o", str(out), "-p", str(p.pid)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)  # heaptrack injects itself; requests before that are not seen
    d = R.run_wrk(port, "chat.lua", 32, 4)
    # heaptrack writes its data out when the traced process ends.
    procs.stop(p)
    h.wait(timeout=120)
    data = next(out.parent.glob(out.name + ".*"))
    text = subprocess.run(["heaptrack_print", str(data)], capture_output=True, text=True).stdout
    m = re.search(r"calls to allocation functions: (\d+)", text)
    if not m:
        raise RuntimeError(f"heaptrack_print gave no total for {data}")
    return int(m.group(1)), d["requests"]


def main() -> int:
    which = sys.argv[1:] or TARGETS
    C.need_tools("heaptrack", "heaptrack_print", "wrk")
    C.signals_raise()
    C.raise_nofile()
    bins = C.bin_dir()
    with C.bench_run("allocs", False) as (wd, procs):
        fp = [C.free_port() for _ in range(4)]
        R.start_nginx(procs, "backends", R.backends_conf(wd, fp), fp[-1])
        for name in which:
            port = C.free_port()
            p = start(name, procs, bins, wd, port, fp)
            R.run_wrk(port, "chat.lua", 32, 1)
            calls, requests = allocations(procs, p, port, wd / f"heaptrack-{name}")
            print(f"{name}: {calls / requests:.1f} allocations per request "
                  f"({calls} calls, {requests} requests)", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
