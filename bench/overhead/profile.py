#!/usr/bin/env python3
"""Where a proxy's CPU goes, for bench/results/overhead-analysis.md: starts the
same fake backends as run.py (one nginx, 4 ports) and ONE proxy (nginx,
gateway, gateway-quiet or pingora-bare; 1 worker/thread), then under wrk load
(chat.lua, 32 connections):
  1. CPU µs per request (utime+stime from /proc, 8 s run)
  2. `strace -c -f` on the proxy for a 5 s run: syscalls per request
     (strace slows the proxy down; the counts, not the times, are the point)
  3. `perf record -e cpu-clock --call-graph dwarf` for 6 s of an 8 s run, and the
     samples grouped by where they land: kernel, malloc/free, memcpy, and the
     Rust crate of the symbol (for nginx: nginx itself)
  4. `strace` of two single requests (curl): the syscalls one request makes
Needs perf (Debian: linux-perf) and strace; skips what is missing.

  python3 bench/overhead/profile.py gateway-quiet [--backends N]   # N fake backends (default 4)
"""

from __future__ import annotations

import collections
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import allocs as A  # noqa: E402
import run as R  # noqa: E402


def crate_of(dso: str, kind: str, sym: str) -> str:
    if kind == "k":
        return "kernel"
    if dso == "nginx":
        return "nginx"
    if "libc" in dso:
        if re.search(r"malloc|free|_int_|unlink_chunk|consolidate|tcache", sym):
            return "libc malloc/free"
        return "libc memcpy/memmove" if "mem" in sym else "libc other (syscall wrappers ...)"
    s = sym.lstrip("<")
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)", s)
    key = m.group(1) if m else sym[:30]
    return "rust core/alloc/std" if key in ("core", "alloc", "std") else key


def main() -> int:
    args = sys.argv[1:]
    n_backends = 4
    if "--backends" in args:
        i = args.index("--backends")
        n_backends = int(args[i + 1])
        del args[i:i + 2]
    which = args[0] if args else "gateway-quiet"
    C.signals_raise()
    C.raise_nofile()
    bins = C.bin_dir()
    out = {"proxy": which, "backends": n_backends}
    with C.bench_run("profile", False) as (wd, procs):
        fp = [C.free_port() for _ in range(n_backends)]
        be = R.start_nginx(procs, "backends", R.backends_conf(wd, fp), fp[-1])
        port = C.free_port()
        if which == "nginx":
            p = R.start_nginx(procs, "proxy", R.proxy_conf(wd, 1, port, fp, C.free_port(), fp), port)
            pid = C.children(p.pid)[0]  # the worker
        else:
            p = A.start(which, procs, bins, wd, port, fp)
            pid = p.pid
        target = {"name": which, "port": port, "pid": p.pid, "header": R.KEY_HEADER}
        R.run_wrk(port, "chat.lua", 32, 2)
        time.sleep(1)
        d = R.measure(target, be.pid, "chat.lua", 32, 8)
        out["rps"], out["cpu_us_per_req"] = round(d["rps"]), round(d["proxy_cpu_us_per_req"], 1)
        print(f"{which}: {d['rps']:.0f} req/s, {d['proxy_cpu_us_per_req']:.1f} µs CPU per request", flush=True)

        if shutil.which("strace"):
            trace = wd / "strace-c.txt"
            st = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(trace)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
            d = R.run_wrk(port, "chat.lua", 32, 5)
            st.send_signal(2)
            st.wait()
            n = d["requests"]
            calls = C.strace_counts(trace)
            per = {k: round(v / n, 2) for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v / n >= 0.05}
            out["syscalls_per_request"] = per
            out["syscalls_total_per_request"] = round(sum(calls.values()) / n, 2)
            print(f"  syscalls per request (strace -c, {n} requests): {per}", flush=True)
            time.sleep(1)

        if shutil.which("perf"):
            data = wd / "perf.data"
            pr = subprocess.Popen(["perf", "record", "-F", "1999", "-e", "cpu-clock", "--call-graph", "dwarf,16384",
                                   "-p", str(pid), "-o", str(data), "--", "sleep", "6"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            R.run_wrk(port, "chat.lua", 32, 8)
            pr.wait()
            rep = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,symbol",
                                  "-g", "none", "--percent-limit", "0"], capture_output=True, text=True).stdout
            agg: collections.Counter = collections.Counter()
            top = []
            for line in rep.splitlines():
                m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
                if not m:
                    continue
                pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()
                agg[crate_of(dso, kind, sym)] += pct
                if len(top) < 15:
                    top.append(f"{pct:5.2f}% {sym[:110]}")
            out["perf_by_crate"] = {k: round(v, 1) for k, v in agg.most_common(16)}
            out["perf_top_symbols"] = top
            print("  perf samples by crate:", out["perf_by_crate"], flush=True)
            # Inclusive shares (callees counted) of the gateway's own steps.
            rep = subprocess.run(["perf", "report", "-i", str(data), "--children", "--sort", "symbol",
                                  "-g", "none", "--percent-limit", "0.1"], capture_output=True, text=True).stdout
            steps = {}
            for line in rep.splitlines():
                m = re.match(r"\s*([\d.]+)%\s+[\d.]+%\s+\[.\]\s+(.*)", line)
                if m and m.group(2).startswith("poimen_gateway::") and m.group(2) not in steps:
                    steps[m.group(2).strip()[:120]] = float(m.group(1))
            out["perf_gateway_inclusive"] = dict(list(steps.items())[:20])
            if steps:
                print("  the gateway's own steps, inclusive % of samples:", flush=True)
                for sym, pct in out["perf_gateway_inclusive"].items():
                    print(f"    {pct:5.2f}%  {sym}", flush=True)
            time.sleep(1)

        if shutil.which("strace") and shutil.which("curl"):
            one = wd / "strace-one.txt"
            st = subprocess.Popen(["strace", "-f", "-e", "trace=sendto,recvfrom,writev,readv,read,write,getpeername,"
                                   "getsockopt,ioctl,setsockopt", "-p", str(pid), "-o", str(one)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
            body = R.chat_body(R.FAKE_MODEL, "k1", False, 16).decode()
            for _ in range(2):
                subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/v1/chat/completions",
                                "-H", "Content-Type: application/json", "-H", "X-Poimen-Cache-Key: k1",
                                "--data-binary", body])
            time.sleep(0.3)
            st.send_signal(2)
            st.wait()
            lines = [re.sub(r'"(?:[^"\\]|\\.)*"(\.\.\.)?', '"…"', ln.split(" ", 1)[1]).strip()
                     for ln in one.read_text().splitlines() if "resumed" not in ln and "+++" not in ln]
            out["one_request_syscalls"] = [ln[:110] for ln in lines[-14:]]
            print("  the syscalls of the last request:", *out["one_request_syscalls"], sep="\n    ", flush=True)
        print("JSON " + json.dumps(out))
        return 0


if __name__ == "__main__":
    sys.exit(main())
