#!/usr/bin/env python3
"""Long prompts against short ones: two tenants keep one vllm-sim busy
(--max-num-seqs 4, --prefill-us-per-token 30, --decode-us-per-token 2000,
--step-us-per-running-seq 0), `long` with unique 8,000-token prompts,
`short` with unique 500-token ones, 16 output tokens each, 12 requests in
flight each (over the gateway's 4 slots and 20 places: both always wait).

Three gateways in front of the same sim, run one at a time and alternated
within each round (order flipped every round):

  tokens    tenants.fairness: tokens (the default; output cost learnt)
  requests  tenants.fairness: requests
  fcfs      no tenants block: one tenant, first come first served

at weights long 1 : short 1 and long 3 : short 1. GPU time of a response:
uncached prompt tokens x 30 us + completion tokens x 2 ms (the sim's
flags), counted as the span that ended with it, clipped to the window
(from --skip s to the end less 2 s, while both saturate). Prints a
markdown section for bench/results/tenants.md. Loopback only; stops all
it started.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import common as C  # noqa: E402

MODEL = "m"
PREFILL_S, DECODE_S = 30e-6, 2e-3
PROMPT_BYTES = {"long": 32_000, "short": 2_000}  # the sim counts 4 bytes a token
WORKERS, SLOTS, DEPTH, OUTPUT = 12, 4, 20, 16
MODES = ("tokens", "requests", "fcfs")


def drive(port: int, secs: float) -> list[tuple[str, float, float, int]]:
    """(tenant, end, GPU seconds, status) of every response of a run."""
    out: list[tuple[str, float, float, int]] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def worker(tenant: str, w: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        i = 0
        while time.perf_counter() - t0 < secs:
            head = f"{tenant} {w} {i} {t0} "
            body = json.dumps({"model": MODEL, "max_tokens": OUTPUT, "messages": [
                {"role": "user", "content": head + "x" * (PROMPT_BYTES[tenant] - len(head))}]})
            conn.request("POST", "/v1/chat/completions", body,
                         {"Content-Type": "application/json", "X-Tenant": tenant})
            r = conn.getresponse()
            raw = r.read()
            gpu = 0.0
            if r.status == 200:
                u = json.loads(raw)["usage"]
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                gpu = (u["prompt_tokens"] - cached) * PREFILL_S + u["completion_tokens"] * DECODE_S
            else:
                time.sleep(0.2)
            with lock:
                out.append((tenant, time.perf_counter() - t0, gpu, r.status))
            i += 1

    threads = [threading.Thread(target=worker, args=(t, w)) for t in PROMPT_BYTES for w in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def measure(recs, start: float, end: float) -> dict:
    gpu = {t: 0.0 for t in PROMPT_BYTES}
    done = {t: 0 for t in PROMPT_BYTES}
    for tenant, e, g, status in recs:
        overlap = max(0.0, min(e, end) - max(e - g, start))
        gpu[tenant] += overlap
        done[tenant] += status == 200 and start <= e < end
    busy = sum(gpu.values()) / (end - start)
    return {"gpu": gpu, "done": done, "ratio": gpu["long"] / max(gpu["short"], 1e-9), "busy": busy,
            "refused": sum(s != 200 for *_, s in recs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--secs", type=float, default=20.0)
    ap.add_argument("--skip", type=float, default=4.0, help="seconds left out at the start (learning)")
    a = ap.parse_args()
    bins = C.bin_dir()
    rows = []
    with C.bench_run("tenants-long-short", False) as (wd, procs):
        sim = C.free_port()
        C.start_sim(procs, bins, "sim", sim, "--max-num-seqs", "4", "--prefill-us-per-token", "30",
                    "--decode-us-per-token", "2000", "--step-us-per-running-seq", "0", model=MODEL)
        for weights in ((1, 1), (3, 1)):
            gws = {}
            for mode in MODES:
                port, metrics = C.free_port(), C.free_port()
                tenants = {"header": "X-Tenant", "fairness": mode,
                           "list": [{"name": "long", "weight": weights[0]}, {"name": "short", "weight": weights[1]}]}
                extra = {} if mode == "fcfs" else {"tenants": tenants}
                cfg = C.gateway_yaml(wd, f"gw-{mode}-{weights[0]}", port, metrics,
                                     [{"name": MODEL, "address": f"127.0.0.1:{sim}"}],
                                     scheduler={"max_num_seqs": SLOTS, "max_queue_depth": DEPTH}, extra=extra)
                C.start_gateway(procs, bins, f"gw-{mode}-{weights[0]}", cfg, port)
                gws[mode] = port
            for r in range(a.rounds):
                order = MODES if r % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    recs = drive(gws[mode], a.secs)
                    m = measure(recs, a.skip, a.secs - 2.0)
                    rows.append({"weights": weights, "round": r + 1, "mode": mode, **m})
                    print(f"{weights[0]}:{weights[1]} round {r + 1} {mode}: long:short GPU {m['ratio']:.2f}, "
                          f"busy {m['busy']:.2f} of 4 slots", file=sys.stderr, flush=True)
    print(render(rows, a, bins))
    return 0


def render(rows, a, bins) -> str:
    out = ["## 5. Long prompts against short ones, fair in tokens", "",
           f"- date: {C.now_utc()}; {C.build_info(bins)}",
           f"- command: `python3 bench/tenants/long_short.py --rounds {a.rounds} --secs {a.secs:g}`", "",
           "One vllm-sim (`--max-num-seqs 4 --prefill-us-per-token 30 --decode-us-per-token 2000 "
           "--step-us-per-running-seq 0`) behind one gateway at a time (`max_num_seqs: 4, max_queue_depth: 20`): "
           f"`long` sends unique 8,000-token prompts, `short` unique 500-token ones, 16 output tokens each, "
           f"{WORKERS} in flight each. GPU time of a response: uncached prompt tokens × 30 µs + completion tokens "
           f"× 2 ms, the span that ended with it, counted inside the window {a.skip:g} s .. {a.secs - 2:g} s. "
           "`tokens`: `tenants.fairness: tokens` (output cost learnt); `requests`: `fairness: requests`; "
           "FCFS: no tenants. Modes alternate within each round, medians over the rounds.", "",
           "| weights long : short | mode | GPU time long : short (rounds) | median | goal | "
           "GPU busy, slots of 4 (median) | / FCFS | completions long / short (last round) |",
           "|---|---|---|---:|---|---:|---:|---|"]
    for w in ((1, 1), (3, 1)):
        fcfs_busy = statistics.median(x["busy"] for x in rows if x["weights"] == w and x["mode"] == "fcfs")
        for mode in MODES:
            rs = [x for x in rows if x["weights"] == w and x["mode"] == mode]
            med = statistics.median(x["ratio"] for x in rs)
            busy = statistics.median(x["busy"] for x in rs)
            goal = ""
            if mode == "tokens":
                want = w[0] / w[1]
                goal = f"{want:.1f} ±10%: **{'met' if abs(med / want - 1) <= 0.10 else 'not met'}**"
            per_round = " / ".join(f"{x['ratio']:.2f}" for x in rs)
            out.append(f"| {w[0]} : {w[1]} | {mode} | {per_round} | "
                       f"{med:.2f} | {goal} | {busy:.2f} | {busy / fcfs_busy:.3f} | "
                       f"{rs[-1]['done']['long']} / {rs[-1]['done']['short']} |")
    refused = sum(x["refused"] for x in rows)
    out += ["", f"Answers other than 200, all runs: {refused}."]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
