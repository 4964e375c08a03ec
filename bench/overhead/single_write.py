#!/usr/bin/env python3
"""What one upstream write per request would save in Pingora: the bare proxy
(pingora-baseline) stock, against the same proxy built on pingora-core 0.9.1
with pingora-single-write.patch (the request header and a Content-Length body
leave in one send instead of two). Interleaved saturated rounds (wrk, chat.lua,
32 connections) against the 4 nginx fake backends of run.py; prints the
medians of req/s, the proxy's and the backends' CPU per request, and the sends
per request (strace -c, when strace is there). Measurement only: the gateway
ships stock Pingora. The patched build goes to <target>/single-write (the
first one compiles Pingora: minutes).

  python3 bench/overhead/single_write.py [--rounds 6 --duration 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import run as R  # noqa: E402

HERE = Path(__file__).resolve().parent


def pingora_core_src() -> Path:
    """pingora-core's source as cargo fetched it for pingora-baseline."""
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--manifest-path",
                           str(HERE / "pingora-baseline" / "Cargo.toml")],
                          capture_output=True, text=True, check=True).stdout
    pkg = next(p for p in json.loads(meta)["packages"] if p["name"] == "pingora-core")
    return Path(pkg["manifest_path"]).parent


def build_patched(bins: Path) -> Path:
    """pingora-baseline on a patched copy of pingora-core, both copied under
    <target>/single-write (the repo's Cargo.lock stays as it is; the patched
    copy is made once, so later runs rebuild only what changed)."""
    target = bins.parent / "single-write"
    core = target / "pingora-core-patched"
    if not core.exists():
        tmp = target / "pingora-core-patching"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(pingora_core_src(), tmp)
        subprocess.run(["git", "apply", "-p1", str(HERE / "pingora-single-write.patch")], cwd=tmp, check=True)
        tmp.rename(core)
    base = target / "baseline"
    shutil.rmtree(base, ignore_errors=True)
    shutil.copytree(HERE / "pingora-baseline", base)
    with open(base / "Cargo.toml", "a") as f:
        f.write(f'\n[patch.crates-io]\npingora-core = {{ path = "{core}" }}\n')
    print(f"building pingora-baseline on the patched pingora-core into {target} ...", flush=True)
    subprocess.run(["cargo", "build", "--release", "--manifest-path", str(base / "Cargo.toml")],
                   env={**os.environ, "CARGO_TARGET_DIR": str(target)}, check=True)
    return target / "release" / "pingora-baseline"


def sends_per_request(wd: Path, pid: int, port: int) -> float | None:
    if not shutil.which("strace"):
        return None
    out = wd / f"strace-{pid}.txt"
    st = subprocess.Popen(["strace", "-c", "-f", "-e", "trace=sendto,sendmsg,write,writev", "-p", str(pid),
                           "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    d = R.run_wrk(port, "chat.lua", 32, 3)
    st.send_signal(2)
    st.wait()
    return sum(C.strace_counts(out).values()) / max(1, d["requests"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--duration", type=float, default=8.0)
    a = ap.parse_args()
    C.signals_raise()
    C.raise_nofile()
    C.need_tools("wrk", "nginx")
    bins = C.bin_dir()
    with C.bench_run("single-write", False) as (wd, procs):
        stock_bin = R.baseline_bin(bins)
        if stock_bin is None:
            sys.exit("pingora-baseline did not build")
        patched_bin = build_patched(bins)
        fp = [C.free_port() for _ in range(4)]
        be = R.start_nginx(procs, "backends", R.backends_conf(wd, fp), fp[-1])
        targets = []
        for name, b in (("stock", stock_bin), ("single-write", patched_bin)):
            port = C.free_port()
            p = procs.start(name, [str(b), f"127.0.0.1:{port}", "1"] + [f"127.0.0.1:{x}" for x in fp])
            C.wait_port(port, proc=p)
            targets.append({"name": name, "port": port, "pid": p.pid, "header": R.KEY_HEADER})
        for t in targets:  # warm-up, not counted
            R.run_wrk(t["port"], "chat.lua", 32, 2)
        rows: dict[str, list[dict]] = {t["name"]: [] for t in targets}
        for r in range(a.rounds):
            for t in (targets if r % 2 == 0 else list(reversed(targets))):
                d = R.measure(t, be.pid, "chat.lua", 32, a.duration)
                rows[t["name"]].append(d)
                print(f"  round {r + 1} {t['name']:12s} {d['rps']:8.0f} req/s  proxy "
                      f"{d['proxy_cpu_us_per_req']:.1f} us/req  backends {d['backend_cpu_us_per_req']:.1f} us/req  "
                      f"errors {d['errors']}", flush=True)
        print(f"\nmedians of {a.rounds} rounds (pingora-baseline, 1 thread, no-steal runtime):")
        print("| build | req/s | proxy CPU µs/req | backends CPU µs/req | proxy sends per request | errors |")
        print("|---|---:|---:|---:|---:|---:|")
        for t in targets:
            rs = rows[t["name"]]
            sends = sends_per_request(wd, t["pid"], t["port"])
            print(f"| {t['name']} | {C.median([d['rps'] for d in rs]):,.0f} | "
                  f"{C.median([d['proxy_cpu_us_per_req'] for d in rs]):.1f} | "
                  f"{C.median([d['backend_cpu_us_per_req'] for d in rs]):.1f} | "
                  f"{'—' if sends is None else f'{sends:.2f}'} | {sum(d['errors'] for d in rs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
