#!/usr/bin/env python3
"""The gateway's memory per request in flight, against the body it holds.

A backend on loopback (asyncio, in this process) reads each request whole
and holds it unanswered until all N have arrived; meanwhile the gateway's
resident memory (/proc/PID/status VmRSS) is sampled, then every request is
answered and read by its client. Per proxy and body size, one process and
--rounds rounds; a request's cost = (RSS with N in flight - RSS of the
fresh process) / N, the median over the rounds. The gateway keeps a request's body until the backend's answer begins (a
failed backend's request is sent again), so the floor is the body itself.

  python3 bench/overhead/inflight.py [--n 200] [--sizes-kb 2,64,256] [--rounds 3]
      [--targets gateway,pingora-bare,pingora-body]

The Pingora rows are bench/overhead/pingora-baseline (run.py's): bare
streams the body through, --body reads it whole first as the gateway does.

Binaries: $POIMEN_BIN_DIR (default target/release). Loopback only; every
process started here is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import run as R  # noqa: E402

MODEL = "bench-model"
ANSWER = json.dumps({
    "id": "chatcmpl-held", "object": "chat.completion", "created": 1700000000, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}).encode()


class HoldingBackend:
    """HTTP/1.1 on one port: each request read whole (Content-Length), then
    held until release(); keep-alive."""

    def __init__(self) -> None:
        self.arrived = 0
        self.bytes = 0
        self.gate = asyncio.Event()
        self.everyone = asyncio.Event()
        self.expect = 0
        self.tasks: set[asyncio.Task] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0, backlog=4096)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def arm(self, n: int) -> None:
        self.arrived, self.bytes, self.expect = 0, 0, n
        self.gate, self.everyone = asyncio.Event(), asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                self.arrived += 1
                self.bytes += length
                if self.arrived >= self.expect:
                    self.everyone.set()
                await self.gate.wait()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)


def chat_body(i: int, size: int) -> bytes:
    """A chat request of about `size` bytes, `model` last (as agents send it)."""
    head = '{"messages":[{"role":"user","content":"'
    tail = f'"}}],"max_tokens":1,"model":"{MODEL}"}}'
    filler = (f"request {i:04d} " + "lorem ipsum dolor sit amet " * (size // 27 + 1))
    return (head + filler[:max(1, size - len(head) - len(tail))] + tail).encode()


async def one_round(port: int, backend: HoldingBackend, gw_pid: int, n: int, size: int) -> dict:
    import aiohttp
    backend.arm(n)
    bodies = [chat_body(i, size) for i in range(n)]
    idle = C.rss_kib(gw_pid)
    statuses: dict[int, int] = {}

    async def send(s, body: bytes):
        async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                          headers={"Content-Type": "application/json"}) as r:
            await r.read()
            statuses[r.status] = statuses.get(r.status, 0) + 1

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as s:
        tasks = [asyncio.create_task(send(s, b)) for b in bodies]
        t0 = time.monotonic()
        await asyncio.wait_for(backend.everyone.wait(), timeout=60)
        arrived_secs = time.monotonic() - t0
        held = C.median(await C.rss_samples(gw_pid, 5, 0.2))
        backend.gate.set()
        await asyncio.gather(*tasks)
    await asyncio.sleep(0.5)
    return {"idle_kib": idle, "held_kib": held, "after_kib": C.rss_kib(gw_pid), "statuses": statuses,
            "arrived": backend.arrived, "body_bytes": len(bodies[0]), "arrived_secs": arrived_secs,
            }


def start_target(target: str, procs: C.Procs, bins: Path, wd: Path, a, bport: int, kb: float):
    """One proxy in front of the holding backend: (process, port)."""
    port, name = C.free_port(), f"{target}-{kb:g}k"
    if target in R.BAREBONES:
        return R.start_bare(procs, name, R.baseline_bin(bins), target, port, a.threads, [bport]), port
    cfg = C.gateway_yaml(wd, name, port, C.free_port(),
                         [{"name": MODEL, "addresses": [f"127.0.0.1:{bport}"], "max_num_seqs": 4096}],
                         threads=a.threads, scheduler={"max_num_seqs": 4096, "max_queue_depth": 0})
    return C.start_gateway(procs, bins, name, cfg, port, "warn"), port


async def measure(bins: Path, wd: Path, procs: C.Procs, a) -> dict:
    backend = HoldingBackend()
    bport = await backend.start()
    out = {}
    for kb in a.sizes_kb:
        for target in a.targets:
            # Started off the event loop's thread: the backend must keep serving.
            p, port = await asyncio.to_thread(start_target, target, procs, bins, wd, a, bport, kb)
            await asyncio.sleep(0.5)
            fresh = C.rss_kib(p.pid)
            rounds = []
            for r in range(a.rounds):
                res = await one_round(port, backend, p.pid, a.n, int(kb * 1024))
                print(f"  {target} {kb:g} KB round {r}: idle {res['idle_kib'] / 1024:.1f} MiB, "
                      f"{res['arrived']} held {res['held_kib'] / 1024:.1f} MiB; statuses {res['statuses']}",
                      flush=True)
                rounds.append(res)
            procs.stop(p)
            out[(target, kb)] = {"fresh_kib": fresh, "rounds": rounds}
    await backend.stop()
    return out


def report(a, argv: list[str], bins: Path, res: dict, secs: float) -> str:
    lines = C.report_head("Memory per request in flight", bins)
    lines += [
        f"- command: `python3 bench/overhead/inflight.py {' '.join(argv)}` ({secs / 60:.1f} min)",
        f"- proxies: {a.threads} threads each; gateway: `RUST_LOG=warn`, one model of one backend, "
        "`scheduler: {max_num_seqs: 4096, max_queue_depth: 0}`, the other settings at their defaults; "
        "pingora-bare and pingora-body: bench/overhead/pingora-baseline (bare streams the body through, "
        "--body reads it whole before choosing, as any model router on Pingora does)",
        "- backend: this script's asyncio server on loopback: reads each request whole, answers none "
        f"until all {a.n} arrived, then all (a 250-byte chat answer)",
        f"- load: {a.n} concurrent aiohttp connections, one chat POST each (`model` last), "
        f"{a.rounds} rounds on one proxy process; RSS = VmRSS, the median of 5 samples 0.2 s apart once "
        "all had arrived",
        "- per request = (RSS held - RSS of the fresh process) / requests, the median over the rounds "
        "(the allocator keeps what a round freed, so a later round grows little)",
        "",
        "| proxy | body | fresh RSS | held RSS (median) | per request | per request - body | statuses |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for (target, kb), r in res.items():
        held = C.median([x["held_kib"] for x in r["rounds"]])
        per = (held - r["fresh_kib"]) * 1024 / a.n
        body = r["rounds"][0]["body_bytes"]
        statuses: dict[int, int] = {}
        for x in r["rounds"]:
            for k, v in x["statuses"].items():
                statuses[k] = statuses.get(k, 0) + v
        lines.append(f"| {target} | {body / 1024:.1f} KiB | {r['fresh_kib'] / 1024:.1f} MiB | {held / 1024:.1f} MiB "
                     f"| **{per / 1024:.1f} KiB** | {(per - body) / 1024:+.1f} KiB | {statuses} |")
    lines += ["", "Held RSS per round (MiB):", ""]
    for (target, kb), r in res.items():
        lines.append(f"- {target}, {kb:g} KB: " + ", ".join(f"{x['held_kib'] / 1024:.1f}" for x in r["rounds"]))
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="requests in flight at once")
    ap.add_argument("--sizes-kb", type=lambda s: [float(x) for x in s.split(",")], default=[2, 64, 256])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--targets", type=lambda s: s.split(","), default=["gateway", "pingora-bare", "pingora-body"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="/tmp/inflight.md")
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    C.raise_nofile()
    bins = C.bin_dir()
    t0 = time.time()
    with C.bench_run("inflight", a.keep_logs) as (wd, procs):
        res = asyncio.run(measure(bins, wd, procs, a))
    text = report(a, sys.argv[1:], bins, res, time.time() - t0)
    C.write_report(a.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
