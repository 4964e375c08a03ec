#!/usr/bin/env python3
"""Fair admission between tenants against first-come-first-served, side by
side: two poimen-gateways in front of the same 2 slow vllm-sim instances
(--decode-us-per-token 50000: a 10-token answer takes ~0.5 s), each with
`scheduler: {max_num_seqs: 4, max_queue_depth: 20}` (8 slots, 40 queue
places in all), overflow reject, keyless round-robin:

  fcfs  no tenant naming: every request is tenant `default`
  fair  `tenants.header: X-Tenant`, weights: a 3, every other tenant 1

The client names its tenant in X-Tenant in both modes (same bytes). Modes
alternate within each round (--rounds, order flipped every round); the
report gives per-round values and their medians.

  1 noisy vs quiet: tenant `noisy` keeps 60 requests in flight (5-15
    tokens, 0.25-0.75 s; after a refusal it waits the Retry-After, 1 s),
    tenant `quiet` sends one 10-token request every 0.5 s. Quiet's refusals, its
    p50 / p99 against its own alone (same gateway, same round), noisy's
    503s, completed req/s.
  2 two saturating tenants, weights a 3 : b 1, 40 requests in flight each:
    completions per tenant over the window where both saturate.
  3 an agent swarm (tenant `swarm`, 40 streamed sessions back to back) beside 3
    interactive users (user-1..3, one streamed request at a time, 0.8-1.2 s
    think time): each user's TTFT (first body byte) p50/p99, Jain's index
    over normalized throughput, total throughput fair against FCFS.
  4 CPU per request of the gateway, tenants configured or not, on 2 sims
    with --time-scale 0: a fixed count of requests, 4 tenants in turn,
    --cpu-rounds measurements per mode, alternating.

Writes bench/results/tenants.md and tenants.png. Loopback only; every load
is bounded in count and time; stops all it started.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import common as C  # noqa: E402
import load as L  # noqa: E402

MODES = ("fcfs", "fair")
LABEL = {"fcfs": "FCFS", "fair": "fair"}
SLOTS, DEPTH, BACKENDS = 4, 20, 2
WEIGHTS = {"noisy": 1, "quiet": 1, "a": 3, "b": 1, "swarm": 1, "user-1": 1, "user-2": 1, "user-3": 1}
USERS = ["user-1", "user-2", "user-3"]
ANSWER_TOKENS = 10  # quiet, a, b and the users: ~0.5 s each
DISPLACED_SECS = 0.05  # a refusal at the door takes a few ms; one later had waited in line


# --------------------------------------------------------------------------
# gateways


class Gw:
    def __init__(self, mode: str, port: int, metrics: int, proc):
        self.mode, self.port, self.metrics, self.proc = mode, port, metrics, proc

    def scrape(self) -> str:
        return C.http_get(f"http://127.0.0.1:{self.metrics}/metrics")


def tenants_block() -> dict:
    return {"header": "X-Tenant", "list": [{"name": n, "weight": w} for n, w in WEIGHTS.items()]}


def start_gateways(procs, bins, wd, prefix: str, sim_ports: list[int]) -> dict[str, Gw]:
    gws = {}
    for mode in MODES:
        port, metrics = C.free_port(), C.free_port()
        extra = {"tenants": tenants_block()} if mode == "fair" else {}
        cfg = C.gateway_yaml(wd, f"{prefix}-{mode}", port, metrics,
                             [{"name": L.MODEL, "addresses": [f"127.0.0.1:{p}" for p in sim_ports]}],
                             threads=2, scheduler={"max_num_seqs": SLOTS, "max_queue_depth": DEPTH}, extra=extra)
        gws[mode] = Gw(mode, port, metrics, C.start_gateway(procs, bins, f"{prefix}-{mode}", cfg, port))
    return gws


def start_sims(procs, bins, prefix: str, *flags: str) -> list[int]:
    ports = [C.free_port() for _ in range(BACKENDS)]
    for i, p in enumerate(ports):
        C.start_sim(procs, bins, f"{prefix}-{i}", p, "--max-num-seqs", "64", "--step-us-per-running-seq", "0",
                    *flags, model=L.MODEL)
    return ports


def prom_samples(text: str, name: str) -> dict[tuple, float]:
    """Every sample of `name`: sorted (label, value) pairs -> value."""
    out: dict[tuple, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            head, _, val = line.rpartition(" ")
            out[tuple(sorted(re.findall(r'(\w+)="([^"]*)"', head)))] = float(val)
    return out


def delta(before: str, after: str, name: str, keep: tuple[str, ...]) -> dict[str, int]:
    """Increase of counter `name` over a run, by the labels `keep`."""
    b, out = prom_samples(before, name), Counter()
    for labels, v in prom_samples(after, name).items():
        d = dict(labels)
        out["/".join(d.get(k, "") for k in keep)] += int(v - b.get(labels, 0))
    return {k: v for k, v in sorted(out.items()) if v}


def wait_idle(gw: Gw, timeout: float = 60.0) -> None:
    """Until the gateway holds no request (every slot and place free)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = gw.scrape()
        if C.prom_values(m, "poimen_gateway_in_flight") == 0 and C.prom_values(m, "poimen_gateway_queue_depth") == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"gateway {gw.mode} still busy {timeout}s after the load")


def run(gw: Gw, actors: list, secs: float, seed: int) -> dict:
    before = gw.scrape()
    load = asyncio.run(L.drive(gw.port, actors, secs, seed))
    wait_idle(gw)
    after = gw.scrape()
    return {"records": load.records, "secs": load.secs,
            "gw_codes": delta(before, after, "poimen_gateway_tenant_requests_total", ("tenant", "code")),
            "gw_rejected": delta(before, after, "poimen_gateway_tenant_rejected_total", ("tenant", "reason"))}


def order(r: int) -> tuple[str, ...]:
    return MODES if r % 2 == 0 else MODES[::-1]


# --------------------------------------------------------------------------
# record helpers


def good(r: dict) -> bool:
    return r["status"] == 200 and r["ok"]


def of(recs: list[dict], tenant: str) -> list[dict]:
    return sorted((r for r in recs if r["tenant"] == tenant), key=lambda r: r["start"])


def ended_in(recs: list[dict], lo: float, hi: float) -> list[dict]:
    return [r for r in recs if good(r) and lo <= r["end"] < hi]


def odd(recs: list[dict]) -> list[dict]:
    """Answers neither a whole 200 nor a 503 queue_full."""
    return [r for r in recs if not (good(r) or (r["status"] == 503 and r["code"] == "queue_full"))]


def backoff(a) -> float | None:
    return None if a.backoff_ms is None else a.backoff_ms / 1000


def varied(a):
    return lambda rng: rng.randint(a.tokens_min, a.tokens_max)


def fixed(_rng) -> int:
    return ANSWER_TOKENS


# --------------------------------------------------------------------------
# 1: noisy vs quiet


def noisy_quiet(gws: dict[str, Gw], a) -> dict[str, list[dict]]:
    res: dict[str, list[dict]] = {m: [] for m in MODES}
    n_quiet = round(a.s1_secs / a.quiet_every)
    for r in range(a.rounds):
        for mode in order(r):
            alone = run(gws[mode], [L.Paced("quiet", a.quiet_every, a.s1_alone, ANSWER_TOKENS)], 0, r)
            actors = [L.Closed("noisy", a.noisy, varied(a), backoff=backoff(a)),
                      L.Paced("quiet", a.quiet_every, n_quiet, ANSWER_TOKENS, start=a.warm)]
            loaded = run(gws[mode], actors, a.warm + a.s1_secs, r)
            res[mode].append(sum_noisy_quiet(alone, loaded, a))
            x = res[mode][-1]
            print(f"  1 round {r + 1} {LABEL[mode]:4}: quiet refused {x['refused']}/{x['n_quiet']}, "
                  f"p50 {x['p50']:.3f} s ({x['p50_ratio']:.2f}x alone), p99 {x['p99']:.3f} s "
                  f"({x['p99_ratio']:.2f}x), noisy 503s {x['noisy_503']}, {x['rps']:.1f} req/s", flush=True)
    return res


def sum_noisy_quiet(alone: dict, loaded: dict, a) -> dict:
    solo = [r["secs"] for r in alone["records"] if good(r)]
    quiet, noisy = of(loaded["records"], "quiet"), of(loaded["records"], "noisy")
    lat = [r["secs"] for r in quiet if good(r)]
    first12 = quiet[:12]
    done = ended_in(loaded["records"], a.warm, a.warm + a.s1_secs)
    x = {
        "alone_n": len(solo), "alone_bad": len(alone["records"]) - len(solo),
        "alone_p50": C.pct(solo, 50), "alone_p99": C.pct(solo, 99),
        "n_quiet": len(quiet), "refused": sum(1 for r in quiet if r["status"] == 503),
        "quiet_bad": len(quiet) - len(lat),
        "p50": C.pct(lat, 50), "p99": C.pct(lat, 99), "max": max(lat, default=float("nan")),
        "noisy_n": len(noisy), "noisy_ok": sum(1 for r in noisy if good(r)),
        "noisy_503": sum(1 for r in noisy if r["status"] == 503),
        # a 503 after waiting in line: the place was taken by a tenant under its share
        "noisy_displaced": [r["secs"] for r in noisy if r["status"] == 503 and r["secs"] > DISPLACED_SECS],
        "retry_after": dict(Counter(str(r["retry_after"]) for r in loaded["records"] if r["status"] == 503)),
        "rps": len(done) / a.s1_secs, "tok_s": sum(r["tokens"] for r in done) / a.s1_secs,
        "first12_refused": sum(1 for r in first12 if r["status"] == 503),
        "first12_lat": C.median([r["secs"] for r in first12 if good(r)]),
        "odd": odd(loaded["records"]) + odd(alone["records"]),
        "gw_codes": loaded["gw_codes"], "gw_rejected": loaded["gw_rejected"],
        "scatter": [(r["start"] - a.warm, r["secs"] if good(r) else None) for r in quiet],
    }
    x["p50_ratio"] = x["p50"] / x["alone_p50"]
    x["p99_ratio"] = x["p99"] / x["alone_p99"]
    return x


# --------------------------------------------------------------------------
# 2: weights 3:1


def weighted(gws: dict[str, Gw], a) -> dict[str, list[dict]]:
    res: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(a.rounds):
        for mode in order(r):
            actors = [L.Closed(t, a.s2_workers, fixed, backoff=backoff(a)) for t in ("a", "b")]
            out = run(gws[mode], actors, a.s2_secs, 100 + r)
            recs = out["records"]
            lo, hi = a.s2_warm, a.s2_secs
            x = {t: len(ended_in(of(recs, t), lo, hi)) for t in ("a", "b")}
            x["ratio"] = x["a"] / x["b"] if x["b"] else float("inf")
            x["rps"] = (x["a"] + x["b"]) / (hi - lo)
            x["503"] = {t: sum(1 for q in of(recs, t) if q["status"] == 503) for t in ("a", "b")}
            x["odd"] = odd(recs)
            x["gw_codes"], x["gw_rejected"] = out["gw_codes"], out["gw_rejected"]
            x["curves"] = {t: sorted(q["end"] for q in of(recs, t) if good(q)) for t in ("a", "b")}
            res[mode].append(x)
            print(f"  2 round {r + 1} {LABEL[mode]:4}: a {x['a']} b {x['b']} completions in "
                  f"[{lo:g}, {hi:g}) s: {x['ratio']:.2f}:1, {x['rps']:.1f} req/s", flush=True)
    return res


# --------------------------------------------------------------------------
# 3: a swarm beside interactive users


def think(a):
    return lambda rng: rng.uniform(a.think_min, a.think_max)


def users(a) -> list:
    return [L.Closed(u, 1, fixed, stream=True, think=think(a), backoff=1.0) for u in USERS]


def swarm_users(gws: dict[str, Gw], a) -> dict[str, list[dict]]:
    res: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(a.rounds):
        for mode in order(r):
            alone = run(gws[mode], users(a), a.s3_alone, 200 + r)
            actors = [L.Closed("swarm", a.swarm, varied(a), stream=True, backoff=backoff(a))] + users(a)
            loaded = run(gws[mode], actors, a.s3_secs, 200 + r)
            res[mode].append(sum_swarm(alone, loaded, a))
            x = res[mode][-1]
            print(f"  3 round {r + 1} {LABEL[mode]:4}: users' TTFT p99 "
                  f"{', '.join(format(x[u]['ttft_p99'], '.3f') for u in USERS)} s, Jain {x['jain']:.3f}, "
                  f"{x['rps']:.2f} req/s, {x['tok_s']:.1f} tok/s", flush=True)
    return res


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(v * v for v in xs))


def streamed_tokens(recs: list[dict], lo: float, hi: float) -> float:
    """Output tokens produced in [lo, hi): each whole streamed answer's
    tokens spread evenly from its first byte (vllm-sim sends it when the
    request starts running) to its end, the part inside the window counted.
    Counting whole answers by end time instead would move by up to the
    8 answers running at each edge (about 2% of a 27 s window)."""
    total = 0.0
    for r in recs:
        if good(r) and r["end"] > r["first"]:
            inside = min(r["end"], hi) - max(r["first"], lo)
            total += r["tokens"] * max(0.0, inside) / (r["end"] - r["first"])
    return total


def sum_swarm(alone: dict, loaded: dict, a) -> dict:
    """Jain's index over normalized throughput (Jain, Chiu and Hawe 1984):
    x_i = what party i got / its max-min fair share. A user's fair share is
    its demand, 1 / (mean think + its mean latency alone); the swarm's is
    what is left of the run's total completions a second."""
    lo, hi = a.warm, a.s3_secs
    recs = loaded["records"]
    done = ended_in(recs, lo, hi)
    x = {"rps": len(done) / (hi - lo), "tok_s": streamed_tokens(recs, lo, hi) / (hi - lo),
         "refused": dict(Counter(r["tenant"] for r in recs if r["status"] == 503)),
         "odd": odd(recs) + odd(alone["records"]), "gw_codes": loaded["gw_codes"],
         "gw_rejected": loaded["gw_rejected"]}
    think_mean = (a.think_min + a.think_max) / 2
    got, share = [], []
    for u in USERS:
        solo = [r for r in of(alone["records"], u) if good(r)]
        mine = [r for r in of(recs, u) if lo <= r["start"] < hi]
        ttft = [r["first"] - r["start"] for r in mine if good(r)]
        demand = 1 / (think_mean + C.median([r["secs"] for r in solo]))
        x[u] = {"n": len(mine), "bad": sum(1 for r in mine if not good(r)),
                "ttft_p50": C.pct(ttft, 50), "ttft_p99": C.pct(ttft, 99),
                "alone_p50": C.pct([r["first"] - r["start"] for r in solo], 50),
                "alone_p99": C.pct([r["first"] - r["start"] for r in solo], 99),
                "rps": len(ended_in(of(recs, u), lo, hi)) / (hi - lo), "demand": demand}
        got.append(x[u]["rps"])
        share.append(demand)
    swarm_rps = len(ended_in(of(recs, "swarm"), lo, hi)) / (hi - lo)
    x["swarm_rps"], x["swarm_share"] = swarm_rps, x["rps"] - sum(share)
    x["norm"] = [g / s for g, s in zip(got + [swarm_rps], share + [x["swarm_share"]])]
    x["jain"] = jain(x["norm"])
    return x


# --------------------------------------------------------------------------
# 4: CPU per request


def task_cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` (schedstat: nanoseconds)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def cpu_per_request(procs, bins, wd, a) -> dict[str, list[dict]]:
    sims = start_sims(procs, bins, "cpu-sim", "--time-scale", "0")
    gws = start_gateways(procs, bins, wd, "cpu-gw", sims)
    tenants = ["a", "b", "swarm", "user-1"]
    for mode in MODES:  # warm-up: connections, allocator, tenant entries
        asyncio.run(L.fixed_count(gws[mode].port, a.cpu_requests // 10, a.cpu_concurrency, tenants, ANSWER_TOKENS))
        wait_idle(gws[mode])
    res: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(a.cpu_rounds):
        for mode in order(r):
            pid = gws[mode].proc.pid
            ns0, ticks0, t0 = task_cpu_ns(pid), C.cpu_ticks(pid), time.perf_counter()
            recs = asyncio.run(L.fixed_count(gws[mode].port, a.cpu_requests, a.cpu_concurrency, tenants,
                                             ANSWER_TOKENS))
            wait_idle(gws[mode])
            ns1, ticks1, t1 = task_cpu_ns(pid), C.cpu_ticks(pid), time.perf_counter()
            n = len(recs)
            x = {"n": n, "bad": sum(1 for q in recs if not good(q)), "us": (ns1 - ns0) / n / 1000,
                 "us_ticks": (ticks1 - ticks0) * 1e6 / C.CLK_TCK / n, "rps": n / (t1 - t0)}
            res[mode].append(x)
            print(f"  4 round {r + 1} {LABEL[mode]:4}: {x['us']:.1f} us CPU/request (schedstat), "
                  f"{x['us_ticks']:.1f} (utime+stime), {x['rps']:.0f} req/s", flush=True)
    for g in gws.values():
        procs.stop(g.proc)
    return res


# --------------------------------------------------------------------------
# main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scenarios", default="1,2,3,4", help="which of 1,2,3,4 to run")
    ap.add_argument("--decode-us", type=int, default=50000, help="vllm-sim --decode-us-per-token")
    ap.add_argument("--tokens-min", type=int, default=5, help="noisy/swarm answers: 5..15 tokens (0.25..0.75 s)")
    ap.add_argument("--tokens-max", type=int, default=15)
    ap.add_argument("--backoff-ms", type=float, default=None,
                    help="a closed-loop worker's pause after a refusal (default: the answer's Retry-After, 1 s)")
    ap.add_argument("--warm", type=float, default=3.0, help="seconds of load before a measuring window")
    ap.add_argument("--noisy", type=int, default=60, help="1: noisy's requests in flight")
    ap.add_argument("--quiet-every", type=float, default=0.5, help="1: seconds between quiet's requests")
    ap.add_argument("--s1-secs", type=float, default=24.0, help="1: quiet's sending window")
    ap.add_argument("--s1-alone", type=int, default=16, help="1: quiet's requests alone, per round and mode")
    ap.add_argument("--s2-workers", type=int, default=40, help="2: requests in flight of each of a and b")
    ap.add_argument("--s2-secs", type=float, default=20.0)
    ap.add_argument("--s2-warm", type=float, default=4.0, help="2: completions are counted from here")
    ap.add_argument("--swarm", type=int, default=40, help="3: the swarm's sessions")
    ap.add_argument("--think-min", type=float, default=0.8)
    ap.add_argument("--think-max", type=float, default=1.2)
    ap.add_argument("--s3-secs", type=float, default=30.0)
    ap.add_argument("--s3-alone", type=float, default=10.0, help="3: the users alone, seconds")
    ap.add_argument("--cpu-requests", type=int, default=10000, help="4: requests per measurement")
    ap.add_argument("--cpu-rounds", type=int, default=5, help="4: measurements per mode, interleaved")
    ap.add_argument("--cpu-concurrency", type=int, default=16)
    ap.add_argument("--out", default=str(C.RESULTS / "tenants.md"))
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    a.argv = " ".join(sys.argv[1:])
    want = {s.strip() for s in a.scenarios.split(",")}

    import report  # noqa: E402  (after argparse: --help needs no matplotlib)
    C.signals_raise()
    C.raise_nofile()
    bins = C.bin_dir()
    t_start = time.monotonic()
    res: dict[str, dict] = {}
    with C.bench_run("tenants", a.keep_logs) as (wd, procs):
        if want & {"1", "2", "3"}:
            sims = start_sims(procs, bins, "sim", "--decode-us-per-token", str(a.decode_us))
            gws = start_gateways(procs, bins, wd, "gw", sims)
            if "1" in want:
                print("1: noisy vs quiet", flush=True)
                res["1"] = noisy_quiet(gws, a)
            if "2" in want:
                print("2: weights 3:1", flush=True)
                res["2"] = weighted(gws, a)
            if "3" in want:
                print("3: swarm and users", flush=True)
                res["3"] = swarm_users(gws, a)
            procs.stop_all()
        if "4" in want:
            print("4: CPU per request", flush=True)
            res["4"] = cpu_per_request(procs, bins, wd, a)
        out = Path(a.out)
        png = out.with_suffix(".png")
        out.parent.mkdir(parents=True, exist_ok=True)
        report.chart(png, res, a)
        text = report.render(a, res, bins, png, time.monotonic() - t_start)
        C.write_report(str(out), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
