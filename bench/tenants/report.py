"""The tenants bench's report (Markdown, goals first) and chart (PNG)."""

from __future__ import annotations

import json
from pathlib import Path

import common as C
from run import ANSWER_TOKENS, BACKENDS, DEPTH, DISPLACED_SECS, LABEL, MODES, SLOTS, USERS, WEIGHTS


def med(rounds: list[dict], key) -> float:
    return C.median([key(x) if callable(key) else x[key] for x in rounds])


def per_round(rounds: list[dict], key, fmt: str) -> str:
    return " / ".join(format(key(x) if callable(key) else x[key], fmt) for x in rounds)


def pause(a) -> str:
    if a.backoff_ms is None:
        return "as the answer's `Retry-After` asks (1 s)"
    return f"{a.backoff_ms:g} ms"


def merge(counts: list[dict]) -> dict:
    out: dict = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


# --------------------------------------------------------------------------
# goals


def goal_rows(res: dict, a) -> list[str]:
    rows = []

    def row(scen, what, goal, fcfs, fair, status=""):
        rows.append(f"| {scen} | {what} | {goal} | {fcfs} | {fair} | {status} |")

    if "1" in res:
        f, q = res["1"]["fcfs"], res["1"]["fair"]
        refused = sum(x["refused"] for x in q)
        row("1", "quiet's refusals (503), all rounds", "0",
            f"{sum(x['refused'] for x in f)} of {sum(x['n_quiet'] for x in f)}",
            f"{refused} of {sum(x['n_quiet'] for x in q)}", verdict(refused == 0))
        for p, lim in (("p50", 1.3), ("p99", 2.0)):
            fm, qm = med(f, f"{p}_ratio"), med(q, f"{p}_ratio")
            row("1", f"quiet's {p} / its {p} alone (median of rounds)", f"<= {lim}x",
                f"{fm:.2f}x ({med(f, p):.2f} s)", f"{qm:.2f}x ({med(q, p):.3f} s; rounds "
                f"{per_round(q, f'{p}_ratio', '.2f')})", verdict(qm <= lim))
        row("1", "noisy's 503s per run (median)", "-", f"{med(f, 'noisy_503'):.0f}", f"{med(q, 'noisy_503'):.0f}")
        row("1", "completed req/s (median)", "-", f"{med(f, 'rps'):.2f}", f"{med(q, 'rps'):.2f}")
    if "2" in res:
        f, q = res["2"]["fcfs"], res["2"]["fair"]
        m = med(q, "ratio")
        ok = all(2.7 <= x["ratio"] <= 3.3 for x in q)
        row("2", "a : b completions while both saturate (weights 3 : 1)", "3 : 1 within 10% (2.7..3.3), every round",
            f"{med(f, 'ratio'):.2f} : 1", f"{m:.2f} : 1 (rounds {per_round(q, 'ratio', '.2f')})", verdict(ok))
    if "3" in res:
        f, q = res["3"]["fcfs"], res["3"]["fair"]
        for u in USERS:
            row("3", f"{u}'s TTFT p99 (median of rounds)", "-",
                f"{med(f, lambda x: x[u]['ttft_p99']):.3f} s",
                f"{med(q, lambda x: x[u]['ttft_p99']):.3f} s (alone {med(q, lambda x: x[u]['alone_p99']):.3f} s)")
        row("3", "Jain's index, normalized throughput (median)", "-", f"{med(f, 'jain'):.3f}", f"{med(q, 'jain'):.3f}")
        ratios = [qq["tok_s"] / ff["tok_s"] for ff, qq in zip(f, q)]
        rm = C.median(ratios)
        row("3", "total throughput, fair / FCFS (output tokens/s, median of rounds)", "within 2%",
            f"{med(f, 'tok_s'):.1f} tok/s", f"{med(q, 'tok_s'):.1f} tok/s: {rm:.3f}x (rounds "
            f"{' / '.join(f'{r:.3f}' for r in ratios)})", verdict(abs(rm - 1) <= 0.02))
    if "4" in res:
        f, q = res["4"]["fcfs"], res["4"]["fair"]
        ratios = [qq["us"] / ff["us"] for ff, qq in zip(f, q)]
        if min(ratios) < 1 < max(ratios):
            spread = "no difference beyond the noise: the rounds' ratios lie on both sides of 1"
        else:
            spread = f"fair {'more' if min(ratios) >= 1 else 'less'} in every round"
        row("4", "gateway CPU per request (median)", "-", f"{med(f, 'us'):.1f} µs",
            f"{med(q, 'us'):.1f} µs ({C.median(ratios):.3f}x; rounds {' / '.join(f'{r:.3f}' for r in ratios)}: "
            f"{spread})")
    return rows


# --------------------------------------------------------------------------
# details


def sec_noisy_quiet(w, res, a) -> None:
    f, q = res["fcfs"], res["fair"]
    w("## 1. Noisy vs quiet")
    w("")
    w(f"`noisy` keeps {a.noisy} requests in flight ({a.tokens_min}..{a.tokens_max} tokens each, "
      f"{a.tokens_min * a.decode_us / 1e6:.2f}..{a.tokens_max * a.decode_us / 1e6:.2f} s; after a refusal a "
      f"worker waits {pause(a)} and sends again); after {a.warm:g} s, `quiet` sends one "
      f"{ANSWER_TOKENS}-token request every {a.quiet_every:g} s for {a.s1_secs:g} s "
      f"({round(a.s1_secs / a.quiet_every)} requests). The gateway holds {BACKENDS * (SLOTS + DEPTH)} at most "
      f"({BACKENDS} × ({SLOTS} slots + {DEPTH} places)). Alone: {a.s1_alone} quiet requests with nothing else, "
      f"same gateway, same round. Percentiles by nearest rank (p99 of {round(a.s1_secs / a.quiet_every)} is "
      "the largest).")
    w("")
    w("| round | mode | quiet alone p50 / p99 | quiet refused | quiet p50 / p99 / max | ratio p50 / p99 | "
      "noisy sent / 200 / 503 | req/s | tok/s |")
    w("|---|---|---|---:|---|---|---|---:|---:|")
    for r in range(len(f)):
        for m in MODES:
            x = res[m][r]
            w(f"| {r + 1} | {LABEL[m]} | {x['alone_p50']:.3f} / {x['alone_p99']:.3f} s | {x['refused']} of "
              f"{x['n_quiet']} | {x['p50']:.3f} / {x['p99']:.3f} / {x['max']:.3f} s | {x['p50_ratio']:.2f}x / "
              f"{x['p99_ratio']:.2f}x | {x['noisy_n']} / {x['noisy_ok']} / {x['noisy_503']} | {x['rps']:.2f} | "
              f"{x['tok_s']:.1f} |")
    w("")
    w("**The issue's case, reproduced (FCFS, the first 12 quiet requests of each round):** "
      + "; ".join(f"round {r + 1}: {x['first12_refused']} of 12 refused, median latency of the admitted "
                  f"{x['first12_lat']:.2f} s" for r, x in enumerate(f))
      + ". (The issue: 6 of 12 refused, 3.0 s.) Fair, the same 12: "
      + "; ".join(f"{x['first12_refused']} refused, {x['first12_lat']:.2f} s" for x in q) + ".")
    w("")
    disp = [x["noisy_displaced"] for x in q]
    w(f"Fair, noisy's 503s that came after waiting in line (> {DISPLACED_SECS * 1000:.0f} ms: its newest place "
      f"taken by quiet): {' / '.join(str(len(d)) for d in disp)} per round (quiet admitted: "
      f"{' / '.join(str(x['n_quiet'] - x['refused']) for x in q)}), after "
      f"{C.median([v for d in disp for v in d]):.2f} s in line (median); FCFS: "
      f"{' / '.join(str(len(x['noisy_displaced'])) for x in f)}. `Retry-After` on the 503s: "
      f"{json.dumps(merge([x['retry_after'] for m in MODES for x in res[m]]))}.")
    w("")
    counters(w, res)


def sec_weighted(w, res, a) -> None:
    f, q = res["fcfs"], res["fair"]
    w("## 2. Two saturating tenants, weights 3 : 1")
    w("")
    w(f"`a` (weight {WEIGHTS['a']}) and `b` (weight {WEIGHTS['b']}) each keep {a.s2_workers} requests of "
      f"{ANSWER_TOKENS} tokens in flight for {a.s2_secs:g} s ({2 * a.s2_workers} against "
      f"{BACKENDS * (SLOTS + DEPTH)} places: both always wait); completions are counted from "
      f"{a.s2_warm:g} s to {a.s2_secs:g} s. With one request one unit of service and equal lengths, "
      "completions are slots granted.")
    w("")
    w("| round | mode | a | b | a : b | req/s | 503 a / b |")
    w("|---|---|---:|---:|---:|---:|---|")
    for r in range(len(f)):
        for m in MODES:
            x = res[m][r]
            w(f"| {r + 1} | {LABEL[m]} | {x['a']} | {x['b']} | {x['ratio']:.2f} | {x['rps']:.2f} | "
              f"{x['503']['a']} / {x['503']['b']} |")
    w("")
    counters(w, res)


def sec_swarm(w, res, a) -> None:
    f, q = res["fcfs"], res["fair"]
    w("## 3. An agent swarm beside three interactive users")
    w("")
    w(f"`swarm`: {a.swarm} sessions, each sending its next request when the last ends ({a.tokens_min}.."
      f"{a.tokens_max} tokens, streamed). `user-1..3`: one streamed {ANSWER_TOKENS}-token request at a "
      f"time, {a.think_min:g}..{a.think_max:g} s think time between. {a.s3_secs:g} s a run, measured from "
      f"{a.warm:g} s; alone: the 3 users for {a.s3_alone:g} s. TTFT = time to the first body byte (the SSE "
      "role chunk, which vllm-sim sends when the request starts running: what a user waits for the gateway). "
      "Throughput: output tokens produced inside the window, each streamed answer's tokens spread evenly from "
      "its first byte to its end (so the answers running at the window's edges count for their part, not all "
      "or nothing); req/s: whole answers ending inside it.")
    w("")
    w("Jain's index, over **normalized throughput** (Jain, Chiu and Hawe, 1984: x_i = what party i got / "
      "its max-min fair share; 1 = every party got its share). A user's share is its demand, "
      "1 / (mean think time + its median latency alone); the swarm's is what remains of the run's total "
      "completions a second. Parties: the 3 users and the swarm. (Not normalized *latency*: under FCFS everyone "
      "waits the same queue, so slowdowns are equal and that index would call FCFS perfectly fair.)")
    w("")
    w("| round | mode | " + " | ".join(f"{u} TTFT p50 / p99 (alone p99), req/s (share)" for u in USERS)
      + " | swarm req/s (share) | x (u1, u2, u3, swarm) | Jain | req/s | tok/s |")
    w("|---|---|" + "---|" * len(USERS) + "---|---|---:|---:|---:|")
    for r in range(len(f)):
        for m in MODES:
            x = res[m][r]
            cells = [f"{x[u]['ttft_p50']:.3f} / {x[u]['ttft_p99']:.3f} s ({x[u]['alone_p99']:.3f}), "
                     f"{x[u]['rps']:.2f} ({x[u]['demand']:.2f})" for u in USERS]
            w(f"| {r + 1} | {LABEL[m]} | " + " | ".join(cells)
              + f" | {x['swarm_rps']:.2f} ({x['swarm_share']:.2f}) | {', '.join(f'{v:.2f}' for v in x['norm'])} | "
              f"{x['jain']:.3f} | {x['rps']:.2f} | {x['tok_s']:.1f} |")
    w("")
    refused = {m: merge([x["refused"] for x in res[m]]) for m in MODES}
    if any(refused.values()):
        most = a.swarm + len(USERS)
        w(f"503s in this scenario, all rounds: FCFS {json.dumps(refused['fcfs'])}, fair "
          f"{json.dumps(refused['fair'])}. At most {most} requests are in the gateway at once, against "
          f"{BACKENDS * (SLOTS + DEPTH)} places: each one means one backend's {SLOTS + DEPTH} were full while the "
          "other had room. Keyless round-robin sends every other request to each backend whatever its load, and "
          "`overflow: reject` does not try the other (`spill` would).")
        w("")
    counters(w, res)


def sec_cpu(w, res, a) -> None:
    f = res["fcfs"]
    w("## 4. Gateway CPU per request, tenants configured or not")
    w("")
    w(f"2 more vllm-sim with `--time-scale 0` (no delays) behind 2 more gateways, same configs; "
      f"{a.cpu_requests:,} non-streamed requests per measurement, {a.cpu_concurrency} at a time (over "
      f"{BACKENDS * SLOTS} slots: the line is used), X-Tenant `a`, `b`, `swarm`, `user-1` in turn in both "
      f"modes; after a warm-up of {a.cpu_requests // 10:,} each, {a.cpu_rounds} measurements per mode, the "
      "modes alternating (ABBA...). CPU = the gateway process's threads' time "
      "(`/proc/<pid>/task/*/schedstat`, ns; utime+stime from `/proc/<pid>/stat` beside it, 10 ms ticks), "
      "over the measurement, divided by the requests. The client shares the 2 cores.")
    w("")
    w("| round | mode | requests (not whole 200) | µs CPU/request (schedstat) | (utime+stime) | req/s |")
    w("|---|---|---|---:|---:|---:|")
    for r in range(len(f)):
        for m in MODES:
            x = res[m][r]
            w(f"| {r + 1} | {LABEL[m]} | {x['n']:,} ({x['bad']}) | {x['us']:.1f} | {x['us_ticks']:.1f} | "
              f"{x['rps']:.0f} |")
    w("")


def counters(w, res) -> None:
    """The gateway's own per-tenant counters over each run, and any answer
    that was neither a whole 200 nor a 503 queue_full."""
    for m in MODES:
        codes = [x["gw_codes"] for x in res[m]]
        rej = [x["gw_rejected"] for x in res[m]]
        w(f"- {LABEL[m]} gateway counters per round, `tenant_requests_total` by tenant/code: "
          + "; ".join(json.dumps(c) for c in codes) + "; `tenant_rejected_total` by tenant/reason: "
          + "; ".join(json.dumps(c) for c in rej))
    odd = [r for m in MODES for x in res[m] for r in x["odd"]]
    w(f"- answers neither a whole 200 nor a 503 `queue_full`: {len(odd)}"
      + (f", e.g. {[(r['tenant'], r['status'], r['code'], r['err']) for r in odd[:5]]}" if odd else ""))
    w("")


# --------------------------------------------------------------------------
# the whole report


def render(a, res: dict, bins: Path, png: Path, elapsed: float) -> str:
    L = C.report_head("Tenants: fair admission against first-come-first-served", bins)
    w = L.append
    w(f"- command: `{' '.join(['python3 bench/tenants/run.py'] + ([a.argv] if a.argv else []))}`; "
      f"whole run {elapsed / 60:.1f} min")
    w("")
    w("## Set-up")
    w("")
    w(f"- {BACKENDS} × `vllm-sim --max-num-seqs 64 --step-us-per-running-seq 0 --decode-us-per-token "
      f"{a.decode_us}`: a request of n output tokens takes about n × {a.decode_us / 1000:g} ms")
    w(f"- 2 gateways in front of the same sims, `threads: 2`, `scheduler: {{max_num_seqs: {SLOTS}, "
      f"max_queue_depth: {DEPTH}}}` (overflow `reject`, `queue_timeout_ms` 60000), keyless round-robin; "
      f"capacity ≈ {BACKENDS * SLOTS} slots / 0.5 s = {BACKENDS * SLOTS * 2} req/s")
    w("  - **FCFS**: no `tenants` block: every request is tenant `default`, admission first-come-first-served")
    w("  - **fair**: `tenants: " + json.dumps({"header": "X-Tenant", "list": [{"name": n, "weight": v}
                                                                                for n, v in WEIGHTS.items()]})
      + "`")
    w("- the client (one Python aiohttp process, same machine) sets `X-Tenant` in both modes; rounds "
      "alternate the modes (FCFS first in odd rounds, fair first in even ones); medians over the rounds")
    w("")
    w("## Against the goals")
    w("")
    w("| scenario | measure | goal | FCFS | fair | |")
    w("|---|---|---|---|---|---|")
    L += goal_rows(res, a)
    w("")
    w(f"![fair against FCFS]({png.name})")
    w("")
    for key, sec in (("1", sec_noisy_quiet), ("2", sec_weighted), ("3", sec_swarm), ("4", sec_cpu)):
        if key in res:
            sec(w, res[key], a)
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------
# chart


def chart(path: Path, res: dict, a) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    color = {"fcfs": "tab:red", "fair": "tab:blue"}
    fig, ax = plt.subplots(2, 2, figsize=(13, 9))
    if "1" in res:
        p = ax[0][0]
        for m in MODES:
            x = res["1"][m][0]
            ok = [(t, s) for t, s in x["scatter"] if s is not None]
            bad = [t for t, s in x["scatter"] if s is None]
            p.plot([t for t, _ in ok], [s for _, s in ok], "o-", ms=3, lw=0.8, color=color[m],
                   label=f"{LABEL[m]}: admitted ({len(ok)})")
            p.plot(bad, [0] * len(bad), "x", ms=7, color=color[m], label=f"{LABEL[m]}: refused 503 ({len(bad)})")
        p.axhline(res["1"]["fair"][0]["alone_p50"], color="gray", ls=":", label="quiet alone, p50")
        p.set(title="1. quiet tenant's latency beside a noisy one (round 1)", xlabel="quiet request sent at (s)",
              ylabel="latency (s)")
        p.legend(fontsize=8)
    if "2" in res:
        p = ax[0][1]
        for m in MODES:
            for t, ls in (("a", "-"), ("b", "--")):
                ends = res["2"][m][0]["curves"][t]
                p.plot(ends, range(1, len(ends) + 1), ls, color=color[m],
                       label=f"{LABEL[m]}: {t} (weight {WEIGHTS[t]})")
        p.axvline(a.s2_warm, color="gray", ls=":")
        p.set(title="2. completions, weights a 3 : b 1, both saturating (round 1)", xlabel="time (s)",
              ylabel="completed requests")
        p.legend(fontsize=8)
    if "3" in res:
        p = ax[1][0]
        xs = range(len(USERS))
        for k, (m, key, lab) in enumerate((("fcfs", "ttft_p99", "FCFS p99"), ("fair", "ttft_p99", "fair p99"),
                                          ("fair", "alone_p99", "alone p99"))):
            vals = [med(res["3"][m], lambda x, u=u: x[u][key]) for u in USERS]
            p.bar([i + (k - 1) * 0.27 for i in xs], vals, 0.27, label=lab,
                  color=color.get(m) if key != "alone_p99" else "gray")
        p.set_xticks(list(xs), USERS)
        p.set_yscale("log")
        p.set(title=f"3. users' TTFT p99 beside a {a.swarm}-session swarm (median of rounds)", ylabel="seconds")
        p.legend(fontsize=8)
    p = ax[1][1]
    groups = [(k, lab, "rps") for k, lab in (("1", "1 noisy+quiet"), ("2", "2 a+b"), ("3", "3 swarm+users"))
              if k in res]
    for j, m in enumerate(MODES):
        p.bar([i + (j - 0.5) * 0.4 for i in range(len(groups))], [med(res[k][m], key) for k, _, key in groups], 0.4,
              color=color[m], label=LABEL[m])
    p.set_xticks(range(len(groups)), [lab for _, lab, _ in groups])
    title = "completed req/s (median of rounds)"
    if "4" in res:
        title += (f"\n4. gateway CPU/request: FCFS {med(res['4']['fcfs'], 'us'):.0f} µs, "
                  f"fair {med(res['4']['fair'], 'us'):.0f} µs")
    p.set(title=title, ylabel="req/s")
    p.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
