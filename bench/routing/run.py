#!/usr/bin/env python3
"""Routing quality: prefix-cache reuse and time to first token through
poimen-gateway in front of 4 vllm-sim instances with tight KV caches.

Workload (seeded, identical in every mode): S agent sessions; each has a long
system prompt shared by all sessions (6,000 bytes = 1,500 sim tokens) and a
per-session memory context (3,000-4,000 tokens), sent as one system message;
a warmup (`X-Poimen-Warmup: true`, `max_tokens: 1`, the system message alone)
then T turns, each appending a user message and the previous answer, streamed.
Variants:
  uniform  every session is one agent (one branch of turns)
  hot      Zipf-hot: sessions get branches (sub-agents sharing the session's
           key and context) in proportion to 1/rank^2.5, the top one 30, so
           about half of all requests carry one key
Branches run concurrently, at most --concurrency at a time, in a seeded order.

Modes (sims and gateway restarted before each: cold caches); gateway
max_num_seqs 4 (= the sims' --max-num-seqs) in all:
  no-key    no X-Poimen-Cache-Key: round-robin; max_queue_depth 20 (default)
  key       X-Poimen-Cache-Key = session id: rendezvous; max_queue_depth 20
  key-q2    the same keys, a small max_queue_depth (2), overflow reject
  spill-q2  the same keys, max_queue_depth 2, scheduler.overflow: spill
key-q2 and spill-q2 differ only in `overflow`: a hot backend's overflow gets
503 in one and goes to the next backend in the key's ranking in the other.

Reported per mode: hit rate from the sims' own counters (sum over sims of
vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total), TTFT p50/p99
(send -> first content chunk), requests/s and prompt tokens/s, 503s, spills,
requests per sim; and the oracle bound (share of prompt tokens in leading
full 16-token blocks shared with some earlier prompt, infinite cache).
Writes bench/results/routing.md and routing.png.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common as C  # noqa: E402

MODEL = "sim-model"
BLOCK = 16
BYTES_PER_TOKEN = 4
WORDS = ("agent tool result plan memory cache token step note user repo test build patch diff "
         "error trace file module function branch commit review deploy config metric query index "
         "schema table vector prompt context window batch queue worker thread socket stream").split()


# --------------------------------------------------------------------------
# workload


def text(rng: random.Random, nbytes: int) -> str:
    out, n = [], 0
    while n < nbytes:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:nbytes]


def build_workload(seed: int, sessions: int, turns: int, variant: str, answer_tokens: int) -> list[dict]:
    """A list of branches; each is {session, branch, system, questions}."""
    rng = random.Random(seed)
    system = text(random.Random(seed * 1000 + 1), 6000)
    mems = []
    for s in range(sessions):
        r = random.Random(seed * 1000 + 100 + s)
        mems.append(text(r, r.randint(3000, 4000) * BYTES_PER_TOKEN))
    if variant == "uniform":
        nbranch = [1] * sessions
    else:
        nbranch = [max(1, round(30 / (s + 1) ** 2.5)) for s in range(sessions)]
    branches = []
    for s in range(sessions):
        for b in range(nbranch[s]):
            r = random.Random(seed * 1000000 + s * 1000 + b)
            qs = [text(r, r.randint(300, 800)) for _ in range(turns)]
            branches.append({"session": s, "branch": b,
                             "system": f"{system}\n{mems[s]}", "questions": qs})
    rng.shuffle(branches)
    return branches


def answer(answer_tokens: int) -> str:
    return " tok" * answer_tokens  # vllm-sim's deterministic output


def branch_requests(br: dict, answer_tokens: int) -> list[tuple[str, list[dict]]]:
    """(kind, messages) in order: the warmup, then each turn."""
    msgs = [{"role": "system", "content": br["system"]}]
    out = [("warmup", list(msgs))]
    for t, q in enumerate(br["questions"]):
        if t > 0:
            msgs.append({"role": "assistant", "content": answer(answer_tokens)})
        msgs.append({"role": "user", "content": q})
        out.append((f"turn{t + 1}", list(msgs)))
    return out


def prompt_text(messages: list[dict]) -> bytes:
    return "".join(f"{m['role']}\n{m['content']}\n" for m in messages).encode()


def block_keys(prompt: bytes) -> list[bytes]:
    """The sim's block chain: ceil(bytes/4) tokens, tokens // 16 full blocks,
    block i = bytes [64i, min(64(i+1), len)), each keyed by the chain so far."""
    tokens = -(-len(prompt) // BYTES_PER_TOKEN)
    full = tokens // BLOCK
    bb = BLOCK * BYTES_PER_TOKEN
    prev, out = b"", []
    for i in range(full):
        prev = hashlib.blake2b(prev + prompt[i * bb:min((i + 1) * bb, len(prompt))], digest_size=16).digest()
        out.append(prev)
    return out


def oracle(branches: list[dict], answer_tokens: int) -> dict:
    """Reusable share with an infinite cache. The seen set is prefix-closed
    (chained keys), so the result does not depend on the order of requests."""
    seen: set[bytes] = set()
    total = reusable = 0
    for br in branches:
        for _kind, msgs in branch_requests(br, answer_tokens):
            p = prompt_text(msgs)
            total += -(-len(p) // BYTES_PER_TOKEN)
            keys = block_keys(p)
            hit = 0
            for k in keys:
                if k in seen:
                    hit += 1
                else:
                    break
            reusable += hit * BLOCK
            seen.update(keys)
    return {"prompt_tokens": total, "reusable_tokens": reusable, "hit_rate": reusable / total,
            "distinct_block_tokens": len(seen) * BLOCK}


# --------------------------------------------------------------------------
# client


async def run_workload(port: int, branches: list[dict], mode: str, concurrency: int,
                       answer_tokens: int) -> dict:
    import aiohttp
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    sem = asyncio.Semaphore(concurrency)
    recs: list[dict] = []

    async def send(s, br, kind, msgs):
        warm = kind == "warmup"
        body = {"messages": msgs, "max_tokens": 1 if warm else answer_tokens, "stream": not warm,
                "model": MODEL}
        headers = {"Content-Type": "application/json"}
        if mode != "no-key":
            headers["X-Poimen-Cache-Key"] = f"session-{br['session']:03d}"
        if warm:
            headers["X-Poimen-Warmup"] = "true"
        rec = {"session": br["session"], "branch": br["branch"], "kind": kind, "status": None,
               "ttft": None, "backend": None, "route": None, "error": None}
        t0 = time.perf_counter()
        try:
            async with s.post(url, data=json.dumps(body).encode(), headers=headers) as r:
                rec["status"] = r.status
                rec["backend"] = r.headers.get("X-Poimen-Backend")
                rec["route"] = r.headers.get("X-Poimen-Route")
                if r.status != 200:
                    rec["error"] = (await r.text())[:200]
                elif warm:
                    await r.read()
                else:
                    content = []
                    async for line in r.content:
                        if not line.startswith(b"data: {"):
                            continue
                        ev = json.loads(line[6:])
                        for ch in ev.get("choices", []):
                            c = (ch.get("delta") or {}).get("content")
                            if c:
                                if rec["ttft"] is None:
                                    rec["ttft"] = time.perf_counter() - t0
                                content.append(c)
                    if "".join(content) != answer(answer_tokens):
                        rec["error"] = "unexpected answer"
        except Exception as e:  # noqa: BLE001
            rec["error"] = repr(e)
        rec["secs"] = time.perf_counter() - t0
        recs.append(rec)

    async def one_branch(s, br):
        async with sem:
            for kind, msgs in branch_requests(br, answer_tokens):
                await send(s, br, kind, msgs)

    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=180)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        await asyncio.gather(*(one_branch(s, br) for br in branches))
    return {"records": recs, "wall": time.perf_counter() - t0}


# --------------------------------------------------------------------------


def run_mode(bins, wd, procs, mode: str, variant: str, branches, a, kv_tokens: int, sim_ports: list[int]) -> dict:
    sims = []
    for i, p in enumerate(sim_ports):
        sims.append(C.start_sim(procs, bins, f"sim-{variant}-{mode}-{i}", p,
                                "--max-num-seqs", "4", "--kv-cache-tokens", str(kv_tokens),
                                "--time-scale", str(a.time_scale), "--max-model-len", "65536",
                                model=MODEL))
    gw_port, gw_metrics = C.free_port(), C.free_port()
    small = mode.endswith("-q2")
    sched = {"max_num_seqs": 4, "max_queue_depth": a.small_queue_depth if small else a.queue_depth,
             "queue_timeout_ms": 120000, "overflow": "spill" if mode.startswith("spill") else "reject"}
    cfg = C.gateway_yaml(wd, f"gw-{variant}-{mode}", gw_port, gw_metrics,
                         [{"name": MODEL, "addresses": [f"127.0.0.1:{p}" for p in sim_ports]}],
                         threads=2, scheduler=sched, extra={"warmup": {"delay_ms": a.warmup_delay_ms}})
    gw = C.start_gateway(procs, bins, f"gw-{variant}-{mode}", cfg, gw_port)
    try:
        res = asyncio.run(run_workload(gw_port, branches, mode, a.concurrency, a.answer_tokens))
        hits = queries = 0.0
        per_sim = []
        for p in sim_ports:
            m = C.http_get(f"http://127.0.0.1:{p}/metrics")
            h = C.prom_values(m, "vllm:prefix_cache_hits_total")
            q = C.prom_values(m, "vllm:prefix_cache_queries_total")
            st = json.loads(C.http_get(f"http://127.0.0.1:{p}/sim/stats"))
            hits += h
            queries += q
            per_sim.append({"port": p, "requests": st["requests"], "hits": h, "queries": q})
    finally:
        procs.stop(gw)
        for s in sims:
            procs.stop(s)
    recs = res["records"]
    turns = [r for r in recs if r["kind"] != "warmup"]
    ok_turns = [r for r in turns if r["status"] == 200 and r["error"] is None]
    ttft = [r["ttft"] * 1000 for r in ok_turns if r["ttft"] is not None]
    hot_ttft = [r["ttft"] * 1000 for r in ok_turns if r["ttft"] is not None and r["session"] == 0]
    n503 = sum(1 for r in recs if r["status"] == 503)
    other_err = [r for r in recs if r["status"] not in (200, 503) or (r["status"] == 200 and r["error"])]
    ok_all = sum(1 for r in recs if r["status"] == 200 and r["error"] is None)
    return {
        "mode": mode, "variant": variant, "wall": res["wall"],
        "hit_rate": hits / queries if queries else float("nan"),
        "prompt_tokens": queries, "cached_tokens": hits,
        "ttft_p50": C.pct(ttft, 50), "ttft_p99": C.pct(ttft, 99),
        "ttft_hot_p50": C.pct(hot_ttft, 50) if hot_ttft else float("nan"),
        "ttft_hot_p99": C.pct(hot_ttft, 99) if hot_ttft else float("nan"),
        "rps": ok_all / res["wall"], "ptps": queries / res["wall"],
        "requests": len(recs), "ok": ok_all, "n503": n503,
        "n503_warmup": sum(1 for r in recs if r["status"] == 503 and r["kind"] == "warmup"),
        "spills": sum(1 for r in recs if r["route"] == "spill"),
        "other_errors": len(other_err), "other_error_examples": [r["error"] or r["status"] for r in other_err[:3]],
        "per_sim_requests": [s["requests"] for s in per_sim],
        "per_sim_hit": [s["hits"] / s["queries"] if s["queries"] else 0 for s in per_sim],
        "hot_share": sum(1 for r in recs if r["session"] == 0) / len(recs),
    }


def chart(path: Path, results: dict, oracles: dict, modes: list[str], variants: list[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.8))
    xs = range(len(modes))
    width = 0.38
    colors = {"uniform": "#4C72B0", "hot": "#DD8452"}
    for vi, v in enumerate(variants):
        off = (vi - 0.5) * width
        hr = [results[(v, m)]["hit_rate"] * 100 for m in modes]
        bars = axes[0].bar([x + off for x in xs], hr, width, label=f"{v}", color=colors[v])
        axes[0].bar_label(bars, fmt="%.0f%%", fontsize=8)
        axes[0].axhline(oracles[v]["hit_rate"] * 100, color=colors[v], ls="--", lw=1,
                        label=f"oracle ({v}) {oracles[v]['hit_rate'] * 100:.0f}%")
        for ai, k in ((1, "ttft_p50"), (2, "ttft_p99"), (3, "rps")):
            vals = [results[(v, m)][k] for m in modes]
            bars = axes[ai].bar([x + off for x in xs], vals, width, label=v, color=colors[v])
            axes[ai].bar_label(bars, fmt="%.1f" if k == "rps" else "%.0f", fontsize=8)
        n503 = [results[(v, m)]["n503"] for m in modes]
        for x, n in zip(xs, n503):
            if n:
                axes[3].annotate(f"{n:.0f} x 503", (x + off, 0.5), ha="center", fontsize=7, rotation=90,
                                 color="white", va="bottom")
    axes[0].set_title("prefix-cache hit rate (sims' counters)")
    axes[0].set_ylabel("% of prompt tokens")
    axes[0].set_ylim(0, 105)
    axes[1].set_title("TTFT p50 (ms)")
    axes[2].set_title("TTFT p99 (ms)")
    axes[3].set_title("throughput (completed req/s)")
    for ax in axes:
        ax.set_xticks(list(xs))
        ax.set_xticklabels(modes)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("poimen-gateway routing, 4 x vllm-sim with tight KV caches (medians over repetitions)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16, help="branches in flight at once")
    ap.add_argument("--time-scale", type=float, default=4.0, help="vllm-sim --time-scale")
    ap.add_argument("--queue-depth", type=int, default=20, help="gateway max_queue_depth of no-key and key")
    ap.add_argument("--small-queue-depth", type=int, default=2, help="gateway max_queue_depth of key-q2, spill-q2")
    ap.add_argument("--warmup-delay-ms", type=int, default=100)
    ap.add_argument("--kv-tokens", type=int, default=0,
                    help="vllm-sim --kv-cache-tokens; 0 = a quarter of the uniform workload's distinct tokens")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every (variant, mode); medians")
    ap.add_argument("--variants", default="uniform,hot")
    ap.add_argument("--modes", default="no-key,key,key-q2,spill-q2")
    ap.add_argument("--out", default=str(C.RESULTS / "routing.md"))
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()

    C.signals_raise()
    bins = C.bin_dir()
    variants = a.variants.split(",")
    modes = a.modes.split(",")
    workloads = {v: build_workload(a.seed, a.sessions, a.turns, v, a.answer_tokens) for v in variants}
    oracles = {v: oracle(workloads[v], a.answer_tokens) for v in variants}
    base = oracle(build_workload(a.seed, a.sessions, a.turns, "uniform", a.answer_tokens), a.answer_tokens)
    kv = a.kv_tokens or int(math.ceil(base["distinct_block_tokens"] / 4 / 1024) * 1024)
    for v in variants:
        o = oracles[v]
        nreq = sum(a.turns + 1 for _ in workloads[v])
        print(f"workload {v}: {len(workloads[v])} branches, {nreq} requests, {o['prompt_tokens']:,} prompt tokens, "
              f"oracle hit rate {o['hit_rate'] * 100:.1f}%, distinct block tokens {o['distinct_block_tokens']:,}")
    print(f"vllm-sim --kv-cache-tokens {kv} per sim (x4 = {4 * kv / base['distinct_block_tokens']:.2f} of the "
          f"uniform workload's distinct tokens)", flush=True)

    t_start = time.time()
    runs: dict[tuple, list[dict]] = {}
    with C.bench_run("routing", a.keep_logs) as (wd, procs):
        for rep in range(a.reps):
            # The rendezvous hash ranks backends by their address text, so the
            # ports decide which sessions share a sim: the same 4 ports for every
            # mode of a repetition, new ones for the next repetition.
            sim_ports = [C.free_port() for _ in range(4)]
            for v in variants:
                order = modes if rep % 2 == 0 else list(reversed(modes))
                for m in order:
                    r = run_mode(bins, wd, procs, m, v, workloads[v], a, kv, sim_ports)
                    runs.setdefault((v, m), []).append(r)
                    print(f"  rep {rep + 1} {v:7s} {m:6s} hit {r['hit_rate'] * 100:5.1f}%  TTFT p50 "
                          f"{r['ttft_p50']:7.1f} ms p99 {r['ttft_p99']:7.1f} ms  {r['rps']:5.1f} req/s  "
                          f"{r['ptps']:8.0f} prompt tok/s  503s {r['n503']:3d}  spills {r['spills']:3d}  "
                          f"per sim {r['per_sim_requests']}  wall {r['wall']:.1f}s  other errors {r['other_errors']}",
                          flush=True)
                    if r["other_errors"]:
                        print(f"    examples: {r['other_error_examples']}", flush=True)
        keys = ("hit_rate", "ttft_p50", "ttft_p99", "ttft_hot_p50", "ttft_hot_p99", "rps", "ptps", "n503", "spills", "wall",
                "other_errors", "n503_warmup")
        med = {k: {f: C.median([r[f] for r in rs]) for f in keys} for k, rs in runs.items()}
        for k, rs in runs.items():
            med[k]["per_sim_requests"] = rs[-1]["per_sim_requests"]
            med[k]["per_sim_all"] = [r["per_sim_requests"] for r in rs]
            med[k]["hot_share"] = rs[0]["hot_share"]
            med[k]["requests"] = rs[0]["requests"]
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        png = out.with_suffix(".png")
        chart(png, med, oracles, modes, variants)
        report = render(a, kv, workloads, oracles, med, runs, modes, variants, png, time.time() - t_start)
        out.write_text(report)
        print()
        print(report)
        print(f"written to {out} and {png}")
        return 0


def render(a, kv, workloads, oracles, med, runs, modes, variants, png, elapsed) -> str:
    L = C.report_head("poimen-gateway routing quality (vllm-sim)", C.bin_dir())
    w = L.append
    w(f"- command: `python3 bench/routing/run.py` (defaults: `--seed {a.seed} --sessions {a.sessions} "
      f"--turns {a.turns} --concurrency {a.concurrency} --time-scale {a.time_scale:g} --queue-depth "
      f"{a.queue_depth} --small-queue-depth {a.small_queue_depth} --reps {a.reps}`); total run time "
      f"{elapsed / 60:.1f} min")
    w("")
    w("## Set-up")
    w("")
    w(f"- 4 × `vllm-sim --max-num-seqs 4 --kv-cache-tokens {kv} --time-scale {a.time_scale:g}` (default costs: "
      "prefill 20 µs per uncached token, decode 2 ms per token + 0.2 ms per running sequence, all × time-scale), "
      "restarted before every run (cold caches). "
      f"{kv:,} tokens per sim = a quarter of the uniform workload's {oracles.get('uniform', next(iter(oracles.values())))['distinct_block_tokens']:,} "
      "distinct prompt tokens, i.e. one sim holds about a quarter of the sessions' contexts.")
    w(f"- gateway (`threads: 2`, restarted before every run): one model over the 4 sims, `scheduler: "
      f"{{max_num_seqs: 4, max_queue_depth: {a.queue_depth} (no-key, key) or {a.small_queue_depth} (key-q2, "
      f"spill-q2), overflow: reject (spill in spill-q2)}}`, "
      f"`warmup.delay_ms: {a.warmup_delay_ms}`, `stream_usage: true` (default).")
    w(f"- workload (seed {a.seed}): {a.sessions} sessions; system message = a 6,000-byte (1,500-token) system "
      "prompt shared by all sessions + a per-session memory context of 3,000–4,000 tokens; a warmup "
      f"(`X-Poimen-Warmup: true`, `max_tokens: 1`, the system message alone) then {a.turns} streamed turns, "
      f"each appending a 75–200-token user message and the previous {a.answer_tokens}-token answer. "
      f"At most {a.concurrency} branches in flight; a 503 is counted and not retried (the conversation goes on).")
    for v in variants:
        n = len(workloads[v])
        w(f"- `{v}`: {n} branches, {n * (a.turns + 1)} requests, {oracles[v]['prompt_tokens']:,} prompt tokens"
          + (f"; the hot session has {sum(1 for b in workloads[v] if b['session'] == 0)} branches "
             f"(sub-agents sharing its key and context; branches ∝ 1/rank^2.5) = "
             f"{med[(v, modes[0])]['hot_share'] * 100:.0f}% of requests" if v == "hot" else ""))
    w(f"- modes: `no-key` = no `X-Poimen-Cache-Key` (round-robin); `key` = key per session (rendezvous); "
      f"`key-q2` = the same with `max_queue_depth: {a.small_queue_depth}` (overflow reject); `spill-q2` = the "
      f"same with `overflow: spill` (differs from key-q2 only there).")
    w("- hit rate = Σ over the 4 sims of `vllm:prefix_cache_hits_total` / Σ `vllm:prefix_cache_queries_total` "
      "(the sims' own /metrics; warmups included). TTFT = request sent → first chunk with content, turns only. "
      "req/s = completed requests (warmups included) / wall time; prompt tok/s = Σ queries / wall time.")
    w("- oracle = the share of prompt tokens (warmups included) in leading full 16-token blocks that some "
      "earlier request's prompt also had (the sim's tokenization: 4 bytes per token, `<role>\\n<content>\\n` "
      "per message, chained blocks), i.e. one infinite cache; computed offline from the prompts.")
    w("- the rendezvous hash ranks backends by their address text (`127.0.0.1:PORT`), so which sessions share a "
      "sim depends on the ports: every repetition picks 4 new free ports and uses them for all its modes; with "
      f"{a.sessions} keys on 4 sims the split is uneven and differs per repetition (see the per-sim counts).")
    w("")
    w(f"## Results (medians over {a.reps} repetitions; modes interleaved)")
    w("")
    w("| variant | mode | hit rate | oracle | TTFT p50 ms | TTFT p99 ms | session-0 TTFT p50 / p99 ms | req/s | prompt tok/s "
      "| 503s (warmups) | spills | requests per sim (last rep) |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for v in variants:
        for m in modes:
            r = med[(v, m)]
            w(f"| {v} | {m} | {r['hit_rate'] * 100:.1f}% | {oracles[v]['hit_rate'] * 100:.1f}% | "
              f"{r['ttft_p50']:.0f} | {r['ttft_p99']:.0f} | {r['ttft_hot_p50']:.0f} / {r['ttft_hot_p99']:.0f} | {r['rps']:.1f} | "
              f"{r['ptps']:,.0f} | {r['n503']:.0f} ({r['n503_warmup']:.0f}) | {r['spills']:.0f} | "
              f"{' / '.join(str(x) for x in r['per_sim_requests'])} |")
    w("")
    w("session-0 is the hot session in `hot` (an ordinary one in `uniform`). 503s are 503 `queue_full` "
      "answers (counted, not retried); spills are answers with `X-Poimen-Route: spill`. TTFT and req/s count "
      "answered requests only, so a mode that refuses work (key-q2) looks faster than one that queues it (key): "
      "read TTFT together with the 503 column.")
    w("")
    errs = sum(r["other_errors"] for rs in runs.values() for r in rs)
    w(f"Errors other than 503 over all runs: {errs}.")
    w("")
    w("Every run:")
    w("")
    w("| variant | mode | rep | hit rate | TTFT p50 ms | TTFT p99 ms | req/s | 503s | spills | wall s | requests per sim |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for v in variants:
        for m in modes:
            for i, r in enumerate(runs[(v, m)]):
                w(f"| {v} | {m} | {i + 1} | {r['hit_rate'] * 100:.1f}% | {r['ttft_p50']:.0f} | {r['ttft_p99']:.0f} | "
                  f"{r['rps']:.1f} | {r['n503']} | {r['spills']} | {r['wall']:.1f} | "
                  f"{' / '.join(str(x) for x in r['per_sim_requests'])} |")
    w("")
    w(f"![routing chart]({png.name})")
    w("")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
