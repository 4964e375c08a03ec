#!/usr/bin/env python3
"""Many gateways, one fleet: 3 poimen-gateway replicas in front of the same
2 vllm-sim backends (--max-num-seqs 6 each: 12 slots in all), overloaded by
closed-loop agent sessions (--sessions 36, 3x the slots, no think time),
each with its own X-Poimen-Cache-Key and a growing conversation (a shared
system prompt, a per-session memory, then turn after turn), streamed.

Modes (the gateway config of all 3 replicas; max_num_seqs 6, max_queue_depth
60, queue_timeout_ms 60000, overflow reject):
  replicas-1   no split: each replica admits 6 per backend (18 in all)
  replicas-3   static split: each admits ceil(6 / 3) = 2 and queues 20
  feedback     replicas-3 + load_feedback: each starts at 2 and moves
               between 1 and 6 with the backend's endpoint-load-metrics

Scenarios (how an L4 balancer spreads the sessions over the replicas):
  even     12 / 12 / 12
  skewed   30 / 3 / 3 (weights 10:1:1): one replica takes most clients

Per run (fresh sims and gateways, --duration seconds): requests the backends
had to queue (vllm-sim's queued_total) and their mean wait there, the mean
backend queue (num_requests_waiting sampled every 100 ms), prefix-cache hit
rate (vllm-sim's cached / prompt tokens), TTFT p50/p99 (client, first
content chunk), completed req/s, 503s. Runs are interleaved (rep by rep,
every scenario and mode each rep); the report gives medians over --reps.
Writes bench/results/multi.md. Loopback only; stops all it started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common as C  # noqa: E402

MODEL = "sim-model"
GATEWAYS = 3
SIMS = 2
MODES = {
    "replicas-1": {"replicas": 1, "load_feedback": False},
    "replicas-3": {"replicas": 3, "load_feedback": False},
    "feedback": {"replicas": 3, "load_feedback": True},
}
SCENARIOS = {"even": (1, 1, 1), "skewed": (10, 1, 1)}



def spread(sessions: int, weights: tuple[int, ...]) -> list[int]:
    """The gateway of each session: weighted, largest remainders, stable."""
    total = sum(weights)
    counts = [sessions * w // total for w in weights]
    for i in sorted(range(len(weights)), key=lambda i: -(sessions * weights[i] % total)):
        if sum(counts) == sessions:
            break
        counts[i] += 1
    return [g for g, n in enumerate(counts) for _ in range(n)]


async def drive(ports: list[int], sims: list[int], owner: list[int], a, seed: int) -> dict:
    import aiohttp
    rng = random.Random(seed)
    shared = C.text(rng, a.shared_bytes)
    memories = [C.text(rng, a.memory_bytes) for _ in owner]
    answer = " tok" * a.max_tokens
    recs: list[dict] = []
    waiting: list[int] = []
    t0 = time.perf_counter()
    deadline = t0 + a.duration

    async def session(s: int, http):
        url = f"http://127.0.0.1:{ports[owner[s]]}/v1/chat/completions"
        msgs = [{"role": "system", "content": f"{shared}\n\n{memories[s]}"}]
        turn = 0
        srng = random.Random(seed * 1000 + s)
        while time.perf_counter() < deadline:
            msgs.append({"role": "user", "content": f"turn {turn}: {C.text(srng, a.turn_bytes)}"})
            body = json.dumps({"messages": msgs, "max_tokens": a.max_tokens, "stream": True,
                               "model": MODEL}).encode()
            headers = {"Content-Type": "application/json", "X-Poimen-Cache-Key": f"session-{s:03d}"}
            rec = {"gw": owner[s], "status": None, "ttft": None, "error": None,
                   "start": time.perf_counter() - t0}
            try:
                async with http.post(url, data=body, headers=headers) as r:
                    rec["status"] = r.status
                    rec["leaked"] = "endpoint-load-metrics" in r.headers
                    if r.status != 200:
                        await r.read()
                    else:
                        got = []
                        async for line in r.content:
                            if not line.startswith(b"data: {"):
                                continue
                            for ch in json.loads(line[6:]).get("choices", []):
                                c = (ch.get("delta") or {}).get("content")
                                if c:
                                    if rec["ttft"] is None:
                                        rec["ttft"] = time.perf_counter() - t0 - rec["start"]
                                    got.append(c)
                        if "".join(got) != answer:
                            rec["error"] = "unexpected answer"
            except Exception as e:  # noqa: BLE001
                rec["error"] = repr(e)
            rec["end"] = time.perf_counter() - t0
            recs.append(rec)
            if rec["status"] == 200 and not rec["error"]:
                msgs.append({"role": "assistant", "content": answer})
                turn += 1
            else:
                msgs.pop()
                await asyncio.sleep(0.2)  # a refused agent backs off a little

    async def sample(http):
        while time.perf_counter() < deadline:
            for p in sims:
                try:
                    async with http.get(f"http://127.0.0.1:{p}/sim/stats") as r:
                        waiting.append((await r.json())["waiting"])
                except Exception:  # noqa: BLE001
                    pass
            await asyncio.sleep(0.1)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as http:
        await asyncio.gather(sample(http), *(session(s, http) for s in range(len(owner))))
    return {"records": recs, "waiting": waiting}


def one_run(bins: Path, mode: str, scenario: str, a, seed: int, keep_logs: bool) -> dict:
    with C.bench_run("multi", keep_logs) as (wd, procs):
        sim_ports = [C.free_port() for _ in range(SIMS)]
        for i, p in enumerate(sim_ports):
            C.start_sim(procs, bins, f"sim-{i}", p, "--max-num-seqs", str(a.seqs),
                        "--decode-us-per-token", str(a.decode_us), model=MODEL)
        sched = {"max_num_seqs": a.seqs, "max_queue_depth": a.queue_depth, "queue_timeout_ms": 60000,
                 "overflow": "reject", "replicas": MODES[mode]["replicas"]}
        if MODES[mode]["load_feedback"]:
            sched["load_feedback"] = True
        models = [{"name": MODEL, "addresses": [f"127.0.0.1:{p}" for p in sim_ports]}]
        ports = []
        for g in range(GATEWAYS):
            port, metrics = C.free_port(), C.free_port()
            cfg = C.gateway_yaml(wd, f"gw-{g}", port, metrics, models, threads=1, scheduler=sched,
                                 extra={"warmup": {"delay_ms": 0}})
            C.start_gateway(procs, bins, f"gw-{g}", cfg, port, rust_log="warn")
            ports.append(port)
        owner = spread(a.sessions, SCENARIOS[scenario])
        res = asyncio.run(drive(ports, sim_ports, owner, a, seed))
        sims = [json.loads(C.http_get(f"http://127.0.0.1:{p}/sim/stats")) for p in sim_ports]
    return summarize(res, sims, a)


def summarize(res: dict, sims: list[dict], a) -> dict:
    recs = res["records"]
    ok = [r for r in recs if r["status"] == 200 and not r["error"]]
    done = [r for r in ok if r["end"] <= a.duration]
    ttft = [r["ttft"] * 1000 for r in ok if r["ttft"] is not None]
    queued = sum(s["queued_total"] for s in sims)
    wait = sum(s["queue_wait_seconds_total"] for s in sims)
    prompt = sum(s["prompt_tokens"] for s in sims)
    cached = sum(s["cached_tokens"] for s in sims)
    by_gw = {g: len([r for r in done if r["gw"] == g]) / a.duration for g in range(GATEWAYS)}
    return {
        "rps": len(done) / a.duration,
        "rps_gw": by_gw,
        "ttft_p50": C.pct(ttft, 50),
        "ttft_p99": C.pct(ttft, 99),
        "e503": len([r for r in recs if r["status"] == 503]),
        "errors": len([r for r in recs if r["error"] and r["status"] != 503]),
        "leaked": len([r for r in recs if r.get("leaked")]),
        "requests": sum(s["requests"] for s in sims),
        "queued": queued,
        "queued_share": queued / max(1, sum(s["requests"] for s in sims)),
        "queue_wait_ms": wait / queued * 1000 if queued else 0.0,
        "mean_waiting": statistics.fmean(res["waiting"]) if res["waiting"] else 0.0,
        "hit": cached / prompt if prompt else float("nan"),
        "max_running": max(s["max_running_seen"] for s in sims),
    }


COLUMNS = [
    ("req/s", "rps", "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50", "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99", "{:.0f}"),
    ("503s", "e503", "{:.0f}"),
    ("backend-queued requests", "queued", "{:.0f}"),
    ("share queued at backend", "queued_share", "{:.0%}"),
    ("mean wait there ms", "queue_wait_ms", "{:.0f}"),
    ("mean backend queue", "mean_waiting", "{:.1f}"),
    ("prefix hit rate", "hit", "{:.1%}"),
]


def render(a, results: dict, bins: Path, scenarios: list[str], modes: list[str]) -> str:
    L = C.report_head("Many gateways, one fleet: load feedback against the static split", bins)
    w = L.append
    w(f"- command: `python3 bench/multi/run.py --duration {a.duration:g} --reps {a.reps} "
      f"--sessions {a.sessions} --seqs {a.seqs} --max-tokens {a.max_tokens} --decode-us {a.decode_us}`")
    w("")
    w("## Set-up")
    w("")
    w(f"- {SIMS} × `vllm-sim --max-num-seqs {a.seqs} --decode-us-per-token {a.decode_us}` (other flags default: "
      f"prefill 20 µs per uncached token, +200 µs per decode step per running sequence); {SIMS * a.seqs} slots")
    w(f"- {GATEWAYS} gateways (`threads: 1`, `max_num_seqs: {a.seqs}`, `max_queue_depth: {a.queue_depth}`, "
      "overflow reject), all with the same mode:")
    w("  `replicas-1` (no split: each admits 6 per backend), `replicas-3` (static split: 2 each), "
      "`feedback` (`replicas: 3` + `load_feedback: true`: 2 each to start, then between 1 and 6 as the "
      "backends' `endpoint-load-metrics` say)")
    w(f"- {a.sessions} closed-loop agent sessions ({a.sessions / (SIMS * a.seqs):g}x the slots), no think time, "
      f"each with its own `X-Poimen-Cache-Key`: a shared system prompt ({a.shared_bytes} bytes) + a session "
      f"memory ({a.memory_bytes} bytes), then one turn after another ({a.turn_bytes}-byte question, "
      f"{a.max_tokens}-token streamed answer appended to the history); a 503 backs off 200 ms")
    w("- scenarios (sessions per gateway): `even` "
      f"{'/'.join(str(spread(a.sessions, SCENARIOS['even']).count(g)) for g in range(GATEWAYS))}, `skewed` "
      f"{'/'.join(str(spread(a.sessions, SCENARIOS['skewed']).count(g)) for g in range(GATEWAYS))}")
    w(f"- {a.duration:g} s per run, fresh sims and gateways each run; {a.reps} repetitions, interleaved "
      "(every scenario and mode once per repetition); medians below, each run listed after")
    w("- backend-queued: requests that found all of a sim's slots taken (vllm-sim `queued_total`); mean "
      "backend queue: `num_requests_waiting` sampled every 100 ms, both sims; req/s: answers completed "
      "within the run; TTFT: client-side, first content chunk")
    w("")
    for scenario in scenarios:
        w(f"## {scenario}")
        w("")
        w("| mode | " + " | ".join(c[0] for c in COLUMNS) + " | req/s per gateway |")
        w("|---|" + "---:|" * (len(COLUMNS) + 1))
        for mode in modes:
            runs = results[(scenario, mode)]
            cells = [fmt.format(C.median([r[k] for r in runs])) for _, k, fmt in COLUMNS]
            per_gw = " / ".join(f"{C.median([r['rps_gw'][g] for r in runs]):.1f}" for g in range(GATEWAYS))
            w(f"| {mode} | " + " | ".join(cells) + f" | {per_gw} |")
        w("")
    w("## Every run")
    w("")
    w("| scenario | mode | rep | " + " | ".join(c[0] for c in COLUMNS) + " | errors | report seen by client | most running on a sim |")
    w("|---|---|---:|" + "---:|" * (len(COLUMNS) + 3))
    for scenario in scenarios:
        for mode in modes:
            for i, r in enumerate(results[(scenario, mode)]):
                cells = [fmt.format(r[k]) for _, k, fmt in COLUMNS]
                w(f"| {scenario} | {mode} | {i + 1} | " + " | ".join(cells)
                  + f" | {r['errors']} | {r['leaked']} | {r['max_running']} |")
    w("")
    return "\n".join(L) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=36)
    ap.add_argument("--seqs", type=int, default=6, help="each sim's --max-num-seqs (and the gateways' max_num_seqs)")
    ap.add_argument("--queue-depth", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--decode-us", type=int, default=20000)
    ap.add_argument("--shared-bytes", type=int, default=4000)
    ap.add_argument("--memory-bytes", type=int, default=4000)
    ap.add_argument("--turn-bytes", type=int, default=400)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=str(C.RESULTS / "multi.md"))
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    scenarios = a.scenarios.split(",")
    modes = a.modes.split(",")
    for s in scenarios:
        if s not in SCENARIOS:
            sys.exit(f"unknown scenario {s}")
    for m in modes:
        if m not in MODES:
            sys.exit(f"unknown mode {m}")
    C.signals_raise()
    C.raise_nofile()
    bins = C.bin_dir()
    results: dict = {(s, m): [] for s in scenarios for m in modes}
    for rep in range(a.reps):
        for s in scenarios:
            for m in modes:
                r = one_run(bins, m, s, a, seed=rep, keep_logs=a.keep_logs)
                results[(s, m)].append(r)
                print(f"rep {rep + 1} {s:7} {m:11} " + " ".join(
                    f"{k}={fmt.format(r[k])}" for _, k, fmt in COLUMNS) + f" per-gw={r['rps_gw']}", flush=True)
    report = render(a, results, bins, scenarios, modes)
    C.write_report(a.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
