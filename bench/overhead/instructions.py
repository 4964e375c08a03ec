#!/usr/bin/env python3
"""Instructions per request, for the chat path's features: the CPU figures
of run.py spread over +-20% on a shared machine; valgrind's instruction
counts do not. Starts the fake backends of run.py (one nginx, 4 ports) and
each gateway row under `valgrind --tool=callgrind --instr-atstart=no`
(1 worker thread), warms it up, turns collection on for a wrk run
(chat.lua, 4 connections), and divides the instructions counted by the
requests completed meanwhile (all the process's threads). Rows:
gateway-quiet (`RUST_LOG=warn`), gateway-index-quiet (the same plus
routing.prefix_index); with --logged also gateway (`RUST_LOG=info`: the
per-request log line, its writer thread included); with --bare also run.py's
pingora-bare and pingora-body (bench/overhead/pingora-baseline, built
into the same target dir), the floors issue 30 measures the gateway
against. Needs valgrind.

  python3 bench/overhead/instructions.py [--seconds 20] [--connections 4] [--logged] [--bare] [--keep]   # --keep: the callgrind files stay

With 4 connections on 4 backends a policy that spreads them evenly keeps one
connection a backend, and Pingora's pool drops and re-creates a backend's
node at every request (about 3,500 instructions); more connections keep
idle ones in each backend's node, as a loaded gateway does.
"""

from __future__ import annotations

import os
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

ROWS = {
    "gateway-quiet": None,
    "gateway-index-quiet": {"routing": {"prefix_index": {"cache_tokens": 1 << 20}}},
}


def gateway_cmd(bins: Path, wd: Path, name: str, extra: dict | None, port: int,
                backends: list[int]) -> list[str]:
    cfg = C.gateway_yaml(wd, name, port, C.free_port(),
                         [{"name": R.FAKE_MODEL, "addresses": [f"127.0.0.1:{x}" for x in backends]}],
                         threads=1, scheduler={"max_num_seqs": 4096, "max_queue_depth": 0}, extra=extra)
    return [str(bins / "poimen-gateway"), "-c", str(cfg)]


def bare_cmd(bare: Path, name: str, port: int, backends: list[int]) -> list[str]:
    return [str(bare), f"127.0.0.1:{port}", "1", *R.BAREBONES[name]] + [f"127.0.0.1:{b}" for b in backends]


def callgrind(procs: C.Procs, wd: Path, name: str, cmd: list[str], port: int,
              seconds: float, conns: int, log: str = "warn") -> tuple[int, int]:
    """(instructions, requests) of `cmd`, listening on `port`, over one wrk
    run of `seconds`."""
    out = wd / f"callgrind.{name}"
    p = procs.start(name, ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                           f"--callgrind-out-file={out}", *cmd],
                    env={**os.environ, "RUST_LOG": log})
    C.wait_port(port, proc=p, timeout=120)
    R.run_wrk(port, "chat.lua", conns, 5)  # warm-up: connections, pools, the index
    subprocess.run(["callgrind_control", "--instr=on", str(p.pid)], check=True, capture_output=True)
    d = R.run_wrk(port, "chat.lua", conns, seconds)
    subprocess.run(["callgrind_control", "--instr=off", str(p.pid)], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "--dump", str(p.pid)], check=True, capture_output=True)
    time.sleep(2)
    procs.stop(p)
    total = 0
    for f in wd.glob(f"callgrind.{name}*"):
        m = re.search(r"^totals: (\d+)", f.read_text(errors="replace"), re.M)
        total = max(total, int(m.group(1))) if m else total
    if d["errors"] or total == 0:
        files = {f.name: f.stat().st_size for f in wd.glob("callgrind*")}
        raise RuntimeError(f"{name}: {d['errors']} errors, {total} instructions; files {files}")
    return total, d["requests"]


def main() -> int:
    seconds = 20.0
    if "--seconds" in sys.argv:
        seconds = float(sys.argv[sys.argv.index("--seconds") + 1])
    conns = 4
    if "--connections" in sys.argv:
        conns = int(sys.argv[sys.argv.index("--connections") + 1])
    C.signals_raise()
    C.raise_nofile()
    bins = C.bin_dir()
    with C.bench_run("instructions", "--keep" in sys.argv) as (wd, procs):
        fp = [C.free_port() for _ in range(4)]
        R.start_nginx(procs, "backends", R.backends_conf(wd, fp), fp[-1])
        rows = [(name, "warn", lambda port, name=name, extra=extra: gateway_cmd(bins, wd, name, extra, port, fp))
                for name, extra in ROWS.items()]
        if "--logged" in sys.argv:
            rows.insert(0, ("gateway", "info", lambda port: gateway_cmd(bins, wd, "gateway", None, port, fp)))
        if "--bare" in sys.argv:
            bare = R.baseline_bin(bins)
            if bare is None:
                raise RuntimeError("bench/overhead/pingora-baseline did not build")
            rows += [(name, "warn", lambda port, name=name: bare_cmd(bare, name, port, fp))
                     for name in ("pingora-bare", "pingora-body")]
        for name, log, cmd in rows:
            port = C.free_port()
            ir, n = callgrind(procs, wd, name, cmd(port), port, seconds, conns, log)
            print(f"{name}: {ir / n:,.0f} instructions per request ({ir:,} over {n:,} requests)", flush=True)
        if "--keep" in sys.argv:
            print(f"callgrind files in {wd} (callgrind_annotate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
