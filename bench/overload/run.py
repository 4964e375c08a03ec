#!/usr/bin/env python3
"""Admission under 10x overload: poimen-gateway (max_num_seqs 4,
max_queue_depth 20 per backend) in front of 2 slow vllm-sim instances
(--max-num-seqs 64; each request ~500 ms: 10 output tokens x 50 ms). Gateway
capacity = 2 backends x 4 slots / 0.5 s = 16 req/s; an open-loop aiohttp
client offers 10x that (160 req/s: request i is sent at t0 + i/160 whatever
happened to the earlier ones) for 60 s.

Reports: time to a 503 (p50/p99), 503s vs completed, a check that every
admitted request completed (every answer is a whole 200 or a 503 queue_full;
the sims' success count and the gateway's own counters agree), the latency of
the completed requests, and the gateway's RSS sampled every second.
Writes bench/results/overload.md. Loopback only; stops all it started.
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
import common as C  # noqa: E402

MODEL = "sim-model"


async def offer(port: int, gw_pid: int, rate: float, duration: float, max_tokens: int) -> dict:
    import aiohttp
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    n = int(rate * duration)
    recs: list[dict] = []
    rss: list[tuple[float, int]] = []
    lags: list[float] = []

    async def one(s, i, t_sched):
        body = json.dumps({"messages": [{"role": "user", "content": f"request {i}: summarise the incident notes"}],
                           "max_tokens": max_tokens, "model": MODEL}).encode()
        rec = {"i": i, "status": None, "code": None, "ok": False, "err": None}
        t0 = time.perf_counter()
        try:
            async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                rec["status"] = r.status
                raw = await r.read()
                rec["retry_after"] = r.headers.get("Retry-After")
            rec["secs"] = time.perf_counter() - t0
            j = json.loads(raw)
            if r.status == 200:
                rec["ok"] = (j["usage"]["completion_tokens"] == max_tokens
                             and j["choices"][0]["message"]["content"] == " tok" * max_tokens)
            else:
                rec["code"] = j.get("error", {}).get("code")
        except Exception as e:  # noqa: BLE001
            rec["secs"] = time.perf_counter() - t0
            rec["err"] = repr(e)
        recs.append(rec)

    async def sample_rss(stop: asyncio.Event, t0: float):
        while not stop.is_set():
            rss.append((time.perf_counter() - t0, C.rss_kib(gw_pid)))
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        stop = asyncio.Event()
        t0 = time.perf_counter()
        sampler = asyncio.create_task(sample_rss(stop, t0))
        tasks = []
        for i in range(n):
            t_sched = t0 + i / rate
            d = t_sched - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            lags.append(time.perf_counter() - t_sched)
            tasks.append(asyncio.create_task(one(s, i, t_sched)))
        t_offered = time.perf_counter() - t0
        await asyncio.gather(*tasks)
        t_done = time.perf_counter() - t0
        stop.set()
        await sampler
    return {"records": recs, "rss": rss, "lags": lags, "offered_secs": t_offered, "done_secs": t_done, "n": n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=160.0, help="offered requests per second (open loop)")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--max-tokens", type=int, default=10)
    ap.add_argument("--decode-us", type=int, default=50000, help="vllm-sim --decode-us-per-token")
    ap.add_argument("--out", default=str(C.RESULTS / "overload.md"))
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()

    C.signals_raise()
    C.raise_nofile()
    bins = C.bin_dir()
    with C.bench_run("overload", a.keep_logs) as (wd, procs):
        sim_ports = [C.free_port() for _ in range(2)]
        sim_flags = ["--max-num-seqs", "64", "--decode-us-per-token", str(a.decode_us),
                     "--step-us-per-running-seq", "0"]
        for i, p in enumerate(sim_ports):
            C.start_sim(procs, bins, f"sim-{i}", p, *sim_flags, model=MODEL)
        gw_port, gw_metrics = C.free_port(), C.free_port()
        sched = {"max_num_seqs": 4, "max_queue_depth": 20}
        cfg = C.gateway_yaml(wd, "gateway", gw_port, gw_metrics,
                             [{"name": MODEL, "addresses": [f"127.0.0.1:{p}" for p in sim_ports]}],
                             threads=2, scheduler=sched)
        gw = C.start_gateway(procs, bins, "gateway", cfg, gw_port)
        # one request alone: how long is a request?
        solo = asyncio.run(offer(gw_port, gw.pid, 2.0, 1.0, a.max_tokens))
        solo_secs = C.median([r["secs"] for r in solo["records"] if r["status"] == 200])
        capacity = 2 * 4 / solo_secs
        time.sleep(1.0)
        rss_idle = C.rss_kib(gw.pid)
        print(f"one request alone: {solo_secs * 1000:.0f} ms -> capacity {capacity:.1f} req/s; offering "
              f"{a.rate:g} req/s open-loop for {a.duration:g} s ({int(a.rate * a.duration)} requests)", flush=True)
        res = asyncio.run(offer(gw_port, gw.pid, a.rate, a.duration, a.max_tokens))
        time.sleep(0.5)
        metrics = C.http_get(f"http://127.0.0.1:{gw_metrics}/metrics")
        sims = [json.loads(C.http_get(f"http://127.0.0.1:{p}/sim/stats")) for p in sim_ports]
        rss_after = C.rss_kib(gw.pid)
        report = render(a, res, solo_secs, capacity, rss_idle, rss_after, metrics, sims, solo)
        C.write_report(a.out, report)
        return 0


def prom_by_label(text: str, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, _, val = line.rpartition(" ")
        for part in head[len(name) + 1:-1].split(","):
            k, _, v = part.partition("=")
            if k == label:
                out[v.strip('"')] = out.get(v.strip('"'), 0) + float(val)
    return out


def render(a, res, solo_secs, capacity, rss_idle, rss_after, metrics, sims, solo) -> str:
    recs = res["records"]
    ok200 = [r for r in recs if r["status"] == 200]
    whole = [r for r in ok200 if r["ok"]]
    full = [r for r in recs if r["status"] == 503 and r["code"] == "queue_full"]
    other = [r for r in recs if not ((r["status"] == 200 and r["ok"]) or (r["status"] == 503 and r["code"] == "queue_full"))]
    t503 = [r["secs"] * 1000 for r in full]
    t200 = [r["secs"] * 1000 for r in whole]
    rss = [kib for _, kib in res["rss"]]
    lags = [x * 1000 for x in res["lags"]]
    codes = prom_by_label(metrics, "poimen_gateway_requests_total", "code")
    rejected = prom_by_label(metrics, "poimen_gateway_queue_rejected_total", "reason")
    inflight = C.prom_values(metrics, "poimen_gateway_in_flight")
    depth = C.prom_values(metrics, "poimen_gateway_queue_depth")
    sim_ok = sum(s["successes"] for s in sims) - len([r for r in solo["records"] if r["status"] == 200])
    sim_req = sum(s["requests"] for s in sims) - len(solo["records"])
    max_run = max(s["max_running_seen"] for s in sims)
    retry_after = sorted({r.get("retry_after") for r in full})
    every_ok = (not other and len(whole) == len(ok200) and sim_ok == len(whole) == sim_req)
    L = C.report_head("poimen-gateway admission under 10x overload", C.bin_dir())
    w = L.append
    w(f"- command: `python3 bench/overload/run.py` (`--rate {a.rate:g} --duration {a.duration:g} "
      f"--max-tokens {a.max_tokens} --decode-us {a.decode_us}`)")
    w("")
    w("## Set-up")
    w("")
    w(f"- 2 × `vllm-sim --max-num-seqs 64 --decode-us-per-token {a.decode_us} --step-us-per-running-seq 0` "
      f"(a request of {a.max_tokens} output tokens takes {solo_secs * 1000:.0f} ms through the gateway, measured alone)")
    w("- gateway: `threads: 2`, `scheduler: {max_num_seqs: 4, max_queue_depth: 20}` (overflow reject, "
      "queue_timeout_ms 60000), no cache keys (round-robin)")
    w(f"- capacity = 2 backends × 4 slots / {solo_secs:.3f} s = **{capacity:.1f} req/s**; offered: "
      f"**{a.rate:g} req/s open loop** (request i sent at t0 + i/{a.rate:g} s, whatever happened to the earlier "
      f"ones) for {a.duration:g} s = {res['n']:,} requests, from one Python aiohttp client "
      f"(non-streamed chat completions, {a.max_tokens} tokens)")
    w(f"- the client kept the schedule: send lag p50 {C.pct(lags, 50):.2f} ms, p99 {C.pct(lags, 99):.2f} ms, "
      f"max {max(lags):.1f} ms; all {res['n']:,} sent in {res['offered_secs']:.1f} s "
      f"({res['n'] / res['offered_secs']:.1f} req/s); last answer at {res['done_secs']:.1f} s")
    w("")
    w("## Results")
    w("")
    w("| | value |")
    w("|---|---:|")
    w(f"| requests offered | {len(recs):,} |")
    w(f"| completed (200, whole answer) | {len(whole):,} ({len(whole) / res['done_secs']:.1f} req/s from the first "
      f"request to the last answer, {res['done_secs']:.1f} s) |")
    w(f"| 503 `queue_full` | {len(full):,} ({len(full) / len(recs) * 100:.1f}%) |")
    w(f"| anything else (errors, timeouts, other codes, cut answers) | {len(other)} |")
    w(f"| time to a 503: p50 / p99 / max | {C.pct(t503, 50):.2f} / {C.pct(t503, 99):.2f} / {max(t503, default=0):.1f} ms |")
    w(f"| completed request latency: p50 / p99 / max | {C.pct(t200, 50):.0f} / {C.pct(t200, 99):.0f} / {max(t200):.0f} ms |")
    w(f"| `Retry-After` on the 503s | {', '.join(str(x) for x in retry_after)} |")
    w(f"| gateway RSS idle before / after the run | {rss_idle / 1024:.1f} / {rss_after / 1024:.1f} MiB |")
    w(f"| gateway RSS every 1 s during the run ({len(rss)} samples): min / median / max | "
      f"{min(rss) / 1024:.1f} / {C.median(rss) / 1024:.1f} / {max(rss) / 1024:.1f} MiB |")
    w("")
    w("**Every admitted request completed: " + ("yes" if every_ok else "NO") + ".** Cross-checks:")
    w("")
    w(f"- client: {len(ok200):,} answers 200, all whole ({len(whole):,} with {a.max_tokens} tokens); "
      f"{len(other)} answers other than 200 / 503 queue_full, no client-side errors or timeouts "
      f"({sum(1 for r in other if r['err'])})")
    w(f"- sims: {sim_req:,} requests received, {sim_ok:,} completed (= the client's 200s); "
      f"most running at once on one sim: {max_run} (the gateway's 4 slots held)")
    w(f"- gateway counters: requests_total by code {json.dumps({k: int(v) for k, v in sorted(codes.items())})}; "
      f"queue_rejected_total by reason {json.dumps({k: int(v) for k, v in sorted(rejected.items())})}; "
      f"after the run inflight {inflight:g}, queue depth {depth:g}")
    if other:
        w(f"- examples of other answers: {[(r['status'], r['code'], r['err']) for r in other[:5]]}")
    w("")
    w("RSS over time (MiB, one sample a second):")
    w("")
    w("```")
    w(" ".join(f"{kib / 1024:.1f}" for kib in rss))
    w("```")
    w("")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
