#!/usr/bin/env python3
"""Routing quality: prefix-cache reuse and time to first token through
poimen-gateway in front of 4 (or 3) vllm-sim instances with tight KV caches,
side by side (optionally) with the cache-aware and session-key policies of
vllm-router, sglang-router and smg in the gateway's place (PEERS).

Workload (seeded, identical in every mode): agent sessions; each has a long
system prompt shared by all sessions (6,000 bytes = 1,500 sim tokens) and a
per-session memory context (3,000-4,000 tokens), sent as one system message.
A session runs as one or more branches (sub-agents sharing the session's key
and context); a branch is a warmup (`X-Poimen-Warmup: true`, `max_tokens: 1`,
the system message alone) then its turns, each appending the previous answer
and a new user message, streamed (--no-warmups: no warmup, a branch starts
with its first turn; --warm-second, an experiment: in keyed modes every
warmup is also sent straight to the sim the key ranks second, from
`poimen-gateway route`, so a turn moved there finds its context; those copies
count in the sims' hit rate and per-sim requests, so read the turns' hit
rate, printed beside it). Variants (--variants):
  uniform  --sessions (24) sessions on 4 sims, one branch of --turns turns each
  hot      --sessions sessions on 4 sims; Zipf-hot: sessions get branches in
           proportion to 1/rank^2.5, the top one 30, each of --turns turns, so
           about half of all requests carry one key
  zipf     64 sessions on 4 sims, popularity ~ 1/rank^1.1: the session of rank
           r gets max(1, round(c / r^1.1)) turns, c the smallest multiple of
           0.25 for which the total reaches uniform's turn count (--sessions x
           --turns). A session's k turns run as ceil(k / --turns) concurrent
           branches (sub-agents) of near-equal length, each with its own
           warmup. With the defaults (target 120): c = 24.75, 122 turns, the
           top session 25 (20%) in 5 branches, ranks 13 to 64 one turn each
           (the tail is clamped at 1 so that all 64 sessions appear); 71
           branches, 193 requests (uniform: 144). Session 0 is rank 1.
  few      10 sessions on 3 sims, one branch each (the one-command demo's
           shape: 10 agent sessions, 3 GPUs)
  skewed   zipf's law on more sessions: the fewest sessions whose distinct
           prompt tokens reach 2.6 x the fleet's cache (sims x
           --kv-cache-tokens; zipf is 2.28 x): 74 with the defaults
  pressure uniform's shape (one branch of --turns turns per session) on the
           fewest sessions whose distinct prompt tokens reach 2 x the
           fleet's cache: 50 with the defaults (300 requests). At most
           --concurrency branches (16) in flight, whose contexts are ~0.8 x
           the fleet's cache: the LRU drops finished sessions, so a keyed
           mode barely feels the pressure; --pressure-concurrency 40 puts
           ~2 x in flight at once
Default variants: uniform,hot,zipf,few (those of bench/results/routing.md).
Branches run concurrently, at most --concurrency at a time, in a seeded order.
The sims' --kv-cache-tokens is the same in every variant: a quarter of the
uniform workload's distinct prompt tokens.

What `routing.keyless: prefix` sees (the gateway derives a chat request's key
from its messages up to and including the first user message): a turn's
messages are [system, user 1, assistant, user 2, ...], so the head (system =
shared prompt + session memory, then the branch's first user message) is the
same in every turn of a branch (checked when the workload is built). In
uniform and few a session is one branch, so there is one derived key per
session, as in `key` (another key, so another split over backends). In hot and
zipf a session's branches (sub-agents) have different first user messages:
one derived key per branch, so the prefix modes spread a session's branches
over backends where `key` keeps them on one. A warmup has no user message at
all: its derived key covers the system message alone, not the turns' key,
so it is generally not placed with the turns that follow it (the "warmup ->
turn 1 on the same backend" share shows it).
`routing.keyless: system` keys on the messages before the first user message
(here the system message = shared prompt + session memory): one key per
session, the same for its warmup, its turns and all its branches, as `key`.

Modes (--modes; the default: all of these gateway modes; sims and gateway
restarted before each: cold caches; gateway max_num_seqs 4 (= the sims'
--max-num-seqs) in all; see MODES):
  no-key          no X-Poimen-Cache-Key: round-robin; max_queue_depth 20
  key             X-Poimen-Cache-Key = session id: rendezvous; max_queue_depth 20
  key-q2          the same keys, max_queue_depth 2, overflow reject
  spill-q2        the same keys, max_queue_depth 2, scheduler.overflow: spill
  prefix          no header, routing.keyless: prefix; max_queue_depth 20
  system          no header, routing.keyless: system (the key covers the
                  messages before the first user one: the system message)
  cost            the same keys, routing.prefix_index (cache_tokens = the
                  sims' --kv-cache-tokens, times --index-cache-ratio): by
                  cost over the prefix index
  cost-no-key     no header, round-robin order, routing.prefix_index
  cost-system     no header, routing.keyless: system, routing.prefix_index
Peers (not run by default; PEERS): the LLM router from bench/.venv (smg:
bench/.venv-smg; bash bench/setup.sh) in the gateway's place, in front of
the same sims, started as bench/overhead does (C.start_router: loopback, log
level warn, RUST_LOG=warn, NO_COLOR=1, TOKIO_WORKER_THREADS=--router-threads;
smg with sglang-router's flags), at its defaults but for the policy; no
gateway scheduler in front of them:
  sglang-cache-aware           sglang-router launch --policy cache_aware; no key
  sglang-manual                sglang-router launch --policy manual; session id
                               in X-SMG-Routing-Key
  vllm-router-cache-aware      vllm-router --policy cache_aware; no key
  vllm-router-consistent-hash  vllm-router --policy consistent_hash; session
                               id in X-Session-Id
  smg-cache-aware              smg launch --policy cache_aware (smg 1.13, the
                               SGLang Model Gateway sglang-router became); no
                               key
  smg-consistent-hash          smg launch --policy consistent_hashing; session
                               id in X-SMG-Routing-Key
They send no X-Poimen-Backend or X-Poimen-Route (same-backend columns: —).
A router is ready once a 4-token chat request through it is answered; the
sims' counters are read after that and after the workload, and the
difference reported (for the gateway modes too).
--prefill-us N sets the sims' --prefill-us-per-token (default 20, the sim's
default); at 30 (x --time-scale 4) a cold 5,000-token context costs 600 ms
of prefill against 11 ms for a decode step of a full batch.
key-q2 and spill-q2 differ only in `overflow`: a hot backend's overflow gets
503 in one and goes to the next backend in the key's ranking in the other.
Before any run every mode's gateway config is checked (`poimen-gateway -t`);
a binary that refuses one (e.g. `routing:` before that feature exists), or a
peer whose router is not installed, stops the bench, or, with
--skip-unsupported, drops that mode.

Repetitions are interleaved (repetition 1 of every variant and mode, then
repetition 2, ...; mode order reversed in every other one) and the report
shows medians. Reported per variant and mode: hit rate from the sims' own
counters (sum over sims of vllm:prefix_cache_hits_total /
vllm:prefix_cache_queries_total) against the oracle bound (share of prompt
tokens in leading full 16-token blocks shared with some earlier prompt,
infinite cache), TTFT p50/p99 (send -> first content chunk), requests/s and
prompt tokens/s, 503s, requests per sim (max/min, max/mean), how often a
branch's next request went to the same backend, and the count of responses
per X-Poimen-Route value. Writes bench/results/routing.md and routing.png
(or --out and the .png next to it).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import random
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common as C  # noqa: E402

MODEL = "sim-model"
BLOCK = 16
BYTES_PER_TOKEN = 4


# --------------------------------------------------------------------------
# workload



# Variants: sessions (None = --sessions; "fit" = the fewest sessions whose
# distinct prompt tokens reach `cache_ratio` x the fleet's cache, i.e. x sims
# x --kv-cache-tokens), sims, and how sessions become branches.
VARIANTS = {
    "uniform": {"sessions": None, "sims": 4, "law": "one"},
    "hot": {"sessions": None, "sims": 4, "law": "hot"},
    "zipf": {"sessions": 64, "sims": 4, "law": "zipf", "exponent": 1.1},
    "skewed": {"sessions": "fit", "sims": 4, "law": "zipf", "exponent": 1.1, "cache_ratio": 2.6},
    "pressure": {"sessions": "fit", "sims": 4, "law": "one", "cache_ratio": 2.0},
    "few": {"sessions": 10, "sims": 3, "law": "one"},
}
MAX_SIMS = max(v["sims"] for v in VARIANTS.values())
DEFAULT_VARIANTS = ["uniform", "hot", "zipf", "few"]  # what bench/results/routing.md was made with


def variant_sessions(variant: str, a, kv: int, target_turns: int) -> int:
    n = VARIANTS[variant]["sessions"]
    if n == "fit":
        return fit_sessions(variant, a, kv, target_turns)
    return n or a.sessions


def fit_sessions(variant: str, a, kv: int, target_turns: int) -> int:
    """The fewest sessions for which the variant's distinct prompt tokens
    (warmups included, as the oracle counts them) reach cache_ratio x the
    fleet's cache (sims x kv)."""
    v = VARIANTS[variant]
    want = v["cache_ratio"] * v["sims"] * kv
    seen: dict[int, int] = {}

    def distinct(n: int) -> int:
        if n not in seen:
            wl = build_workload(a.seed, n, a.turns, variant, a.answer_tokens, target_turns, not a.no_warmups)
            seen[n] = oracle(wl, a.answer_tokens)["distinct_block_tokens"]
        return seen[n]

    n = max(1, a.sessions)
    for _ in range(4):  # distinct tokens grow about linearly with sessions
        n = max(1, round(n * want / distinct(n)))
    while distinct(n) < want:
        n += 1
    while n > 1 and distinct(n - 1) >= want:
        n -= 1
    return n


def zipf_turns(sessions: int, exponent: float, target: int) -> tuple[float, list[int]]:
    """Turns per session, session s at rank s + 1: max(1, round(c / rank^e)),
    c the smallest multiple of 0.25 for which the total reaches `target`."""
    c = 1.0
    while True:
        t = [max(1, round(c / (s + 1) ** exponent)) for s in range(sessions)]
        if sum(t) >= target or c > 1e6:
            return c, t
        c += 0.25


def build_workload(seed: int, sessions: int, turns: int, variant: str, answer_tokens: int,
                   target_turns: int = 0, warmups: bool = True) -> list[dict]:
    """A list of branches; each is {session, branch, system, questions, warmup}.
    `target_turns` (zipf only): the total number of turns to reach."""
    law = VARIANTS[variant]["law"]
    rng = random.Random(seed)
    system = C.text(random.Random(seed * 1000 + 1), 6000)
    mems = []
    for s in range(sessions):
        r = random.Random(seed * 1000 + 100 + s)
        mems.append(C.text(r, r.randint(3000, 4000) * BYTES_PER_TOKEN))
    # turns of each branch of each session
    if law == "one":
        plan = [[turns] for _ in range(sessions)]
    elif law == "hot":
        plan = [[turns] * max(1, round(30 / (s + 1) ** 2.5)) for s in range(sessions)]
    elif law == "zipf":
        _c, per_session = zipf_turns(sessions, VARIANTS[variant]["exponent"], target_turns or sessions * turns)
        plan = []
        for k in per_session:
            nb = -(-k // turns)
            plan.append([k // nb + (1 if i < k % nb else 0) for i in range(nb)])
    else:
        raise ValueError(variant)
    branches = []
    for s in range(sessions):
        for b, nturns in enumerate(plan[s]):
            r = random.Random(seed * 1000000 + s * 1000 + b)
            qs = [C.text(r, r.randint(300, 800)) for _ in range(nturns)]
            branches.append({"session": s, "branch": b,
                             "system": f"{system}\n{mems[s]}", "questions": qs, "warmup": warmups})
    rng.shuffle(branches)
    return branches


def keyless_head(messages: list[dict]) -> str | None:
    """What `routing.keyless: prefix` hashes for a chat body: the messages up
    to and including the first user message; None when there is no user
    message (a warmup here; the gateway's choice then is its own)."""
    for i, m in enumerate(messages):
        if m["role"] == "user":
            return hashlib.blake2b(prompt_text(messages[:i + 1]), digest_size=16).hexdigest()
    return None


def check_heads(branches: list[dict], answer_tokens: int) -> dict:
    """Asserts that every turn of a branch has the same head (system messages
    + first user message), and counts the distinct heads."""
    heads = set()
    sessions = set()
    for br in branches:
        sessions.add(br["session"])
        hs = {keyless_head(msgs) for kind, msgs in branch_requests(br, answer_tokens) if kind != "warmup"}
        assert len(hs) == 1 and None not in hs, f"branch {br['session']}/{br['branch']}: heads {hs}"
        heads |= hs
    return {"sessions": len(sessions), "branches": len(branches), "turn_heads": len(heads)}


def n_requests(branches: list[dict]) -> int:
    return sum(len(br["questions"]) + br["warmup"] for br in branches)


def answer(answer_tokens: int) -> str:
    return " tok" * answer_tokens  # vllm-sim's deterministic output


def branch_requests(br: dict, answer_tokens: int) -> list[tuple[str, list[dict]]]:
    """(kind, messages) in order: the warmup (unless --no-warmups), then each turn."""
    msgs = [{"role": "system", "content": br["system"]}]
    out = [("warmup", list(msgs))] if br["warmup"] else []
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


async def run_workload(port: int, branches: list[dict], key_header: str | None, concurrency: int,
                       answer_tokens: int, second: dict[int, int] | None = None) -> dict:
    """`key_header`: the header the session id goes in (X-Poimen-Cache-Key,
    or a router's key header), None for none. `second` (--warm-second):
    session -> the port of the sim its key ranks second; each warmup is also
    sent there, straight to the sim, at once."""
    import aiohttp
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    sem = asyncio.Semaphore(concurrency)
    recs: list[dict] = []

    async def warm_second(s, br, body):
        sim = f"http://127.0.0.1:{second[br['session']]}/v1/chat/completions"
        async with s.post(sim, data=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json"}) as r:
            await r.read()

    async def send(s, br, kind, msgs):
        warm = kind == "warmup"
        body = {"messages": msgs, "max_tokens": 1 if warm else answer_tokens, "stream": not warm,
                "model": MODEL}
        if not warm:
            # The usage event (prompt and cached tokens) is passed on only
            # to a client that asks for it.
            body["stream_options"] = {"include_usage": True}
        headers = {"Content-Type": "application/json"}
        if key_header:
            headers[key_header] = f"session-{br['session']:03d}"
        if warm:
            headers["X-Poimen-Warmup"] = "true"
        rec = {"session": br["session"], "branch": br["branch"], "kind": kind, "status": None,
               "ttft": None, "backend": None, "route": None, "error": None, "prompt": None, "cached": None}
        t0 = time.perf_counter()
        copy = (asyncio.ensure_future(warm_second(s, br, body)) if warm and second else None)
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
                        usage = ev.get("usage") or {}
                        if "prompt_tokens" in usage:
                            rec["prompt"] = usage["prompt_tokens"]
                            rec["cached"] = C.cached_tokens(usage)
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
        if copy:
            await asyncio.gather(copy, return_exceptions=True)
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
# modes

# One entry per mode: does the client send X-Poimen-Cache-Key (the session id),
# the gateway's max_queue_depth ("large" = --queue-depth, "small" =
# --small-queue-depth), scheduler.overflow, and the `gateway.routing` section
# (None: no `routing:` in the config at all, so binaries without that feature
# accept the mode). max_num_seqs is 4 and queue_timeout_ms 120000 in all.
MODES = {
    "no-key": {"key": False, "queue": "large", "overflow": "reject", "routing": None},
    "key": {"key": True, "queue": "large", "overflow": "reject", "routing": None},
    "key-q2": {"key": True, "queue": "small", "overflow": "reject", "routing": None},
    "spill-q2": {"key": True, "queue": "small", "overflow": "spill", "routing": None},
    "prefix": {"key": False, "queue": "large", "overflow": "reject", "routing": {"keyless": "prefix"}},
    "system": {"key": False, "queue": "large", "overflow": "reject", "routing": {"keyless": "system"}},
    # routing.prefix_index: cache_tokens is filled in with the sims' own
    # --kv-cache-tokens (gateway_config).
    "cost": {"key": True, "queue": "large", "overflow": "reject", "routing": {"prefix_index": {}}},
    "cost-no-key": {"key": False, "queue": "large", "overflow": "reject", "routing": {"prefix_index": {}}},
    "cost-system": {"key": False, "queue": "large", "overflow": "reject",
                    "routing": {"keyless": "system", "prefix_index": {}}},
}
# The peers: an LLM router from bench/.venv (bench/setup.sh pins them; smg
# from bench/.venv-smg, C.router_venv) in the gateway's place, in front of the
# same sims, at its defaults but for its policy (C.router_argv: loopback, log
# level warn, sglang-router's and smg's shutdown grace 1 s;
# TOKIO_WORKER_THREADS = --router-threads, RUST_LOG=warn, NO_COLOR=1). "key":
# the client sends the session id in the router's key header
# (C.ROUTER_KEY_HEADERS). No gateway, so no gateway scheduler: the requests go
# straight to the sims, which queue them (FIFO, unbounded).
PEERS = {
    "sglang-cache-aware": {"router": "sglang-router", "policy": "cache_aware", "key": False},
    "sglang-manual": {"router": "sglang-router", "policy": "manual", "key": True},
    "vllm-router-cache-aware": {"router": "vllm-router", "policy": "cache_aware", "key": False},
    "vllm-router-consistent-hash": {"router": "vllm-router", "policy": "consistent_hash", "key": True},
    "smg-cache-aware": {"router": "smg", "policy": "cache_aware", "key": False},
    "smg-consistent-hash": {"router": "smg", "policy": "consistent_hashing", "key": True},
}
for _name, _peer in PEERS.items():
    MODES[_name] = {"key": _peer["key"], "peer": _peer, "queue": None, "overflow": None, "routing": None}
GATEWAY_MODES = [m for m in MODES if m not in PEERS]


def key_header(mode: str) -> str | None:
    """The header the client puts the session id in, None for none."""
    m = MODES[mode]
    if not m["key"]:
        return None
    return C.ROUTER_KEY_HEADERS[m["peer"]["router"]] if mode in PEERS else "X-Poimen-Cache-Key"


def seeded_ports(rng: random.Random) -> list[int]:
    """MAX_SIMS ports drawn from `rng` in 20000-29999, skipping any that is
    taken now: the same ports for the same seed on a quiet machine."""
    ports: list[int] = []
    while len(ports) < MAX_SIMS:
        p = rng.randrange(20000, 30000)
        if p in ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
        ports.append(p)
    return ports


def queue_depth(mode: str, a) -> int:
    return a.queue_depth if MODES[mode]["queue"] == "large" else a.small_queue_depth


def gateway_config(wd: Path, name: str, mode: str, sim_ports: list[int], a, port: int, metrics: int,
                   kv_tokens: int = 26624) -> Path:
    m = MODES[mode]
    sched = {"max_num_seqs": 4, "max_queue_depth": queue_depth(mode, a),
             "queue_timeout_ms": 120000, "overflow": m["overflow"]}
    extra = {"warmup": {"delay_ms": a.warmup_delay_ms}}
    if m["routing"]:
        extra["routing"] = dict(m["routing"])
        if "prefix_index" in extra["routing"]:
            extra["routing"]["prefix_index"] = {"cache_tokens": int(kv_tokens * a.index_cache_ratio)}
    return C.gateway_yaml(wd, name, port, metrics,
                          [{"name": MODEL, "addresses": [f"127.0.0.1:{p}" for p in sim_ports]}],
                          threads=2, scheduler=sched, extra=extra)


def preflight(bins: Path, wd: Path, modes: list[str], a) -> dict[str, str]:
    """`poimen-gateway -t` on every mode's config (nothing is started): the
    modes whose config the binary refuses, with its message."""
    ports = [C.free_port() for _ in range(MAX_SIMS)]
    refused = {}
    for m in modes:
        if m in PEERS:
            exe = C.router_venv(PEERS[m]["router"]) / "bin" / PEERS[m]["router"]
            if not exe.exists():
                refused[m] = f"{exe} missing (run bash bench/setup.sh)"
            continue
        cfg = gateway_config(wd, f"check-{m}", m, ports, a, C.free_port(), C.free_port())
        chk = subprocess.run([str(bins / "poimen-gateway"), "-t", "-c", str(cfg)], capture_output=True, text=True)
        if chk.returncode != 0:
            refused[m] = " ".join((chk.stdout + chk.stderr).split())[:300]
    return refused


def peer_command(mode: str) -> str:
    """A peer's command line as the report shows it (P, M: its free ports)."""
    pr = PEERS[mode]
    argv = C.router_argv(pr["router"], Path("venv"), 0, 0, [], pr["policy"])
    argv[0] = Path(argv[0]).name
    return (" ".join(argv).replace("--prometheus-port 0", "--prometheus-port M").replace("--port 0", "--port P")
            .replace("--worker-urls ", "--worker-urls <the sims> "))


def mode_config_text(mode: str, a) -> str:
    m = MODES[mode]
    if mode in PEERS:
        pr = m["peer"]
        return (f"| `{mode}` | {'session id in `' + key_header(mode) + '`' if m['key'] else 'none'} | — (no "
                f"gateway) | — | {pr['router']} {C.router_version(C.router_venv(pr['router']), pr['router'])} "
                f"`--policy {pr['policy']}` |")
    routing = ", ".join(f"{k}: {v}" for k, v in (m["routing"] or {}).items()) or "—"
    return (f"| `{mode}` | {'session id' if m['key'] else 'none'} | {queue_depth(mode, a)} | {m['overflow']} | "
            f"{routing} |")


# --------------------------------------------------------------------------
# one run


def run_mode(bins, wd, procs, mode: str, variant: str, branches, a, kv_tokens: int, sim_ports: list[int]) -> dict:
    sim_ports = sim_ports[:VARIANTS[variant]["sims"]]
    sims = []
    for i, p in enumerate(sim_ports):
        sims.append(C.start_sim(procs, bins, f"sim-{variant}-{mode}-{i}", p,
                                "--max-num-seqs", "4", "--kv-cache-tokens", str(kv_tokens),
                                "--time-scale", str(a.time_scale), "--max-model-len", "65536",
                                "--prefill-us-per-token", str(a.prefill_us),
                                model=MODEL))
    front_port = C.free_port()
    cfg = None
    if mode in PEERS:
        pr = PEERS[mode]
        front = C.start_router(procs, f"router-{variant}-{mode}", pr["router"], C.router_venv(pr["router"]),
                               a.router_threads, front_port, sim_ports, pr["policy"], router_ready)
    else:
        cfg = gateway_config(wd, f"gw-{variant}-{mode}", mode, sim_ports, a, front_port, C.free_port(),
                             kv_tokens)
        front = C.start_gateway(procs, bins, f"gw-{variant}-{mode}", cfg, front_port)
    try:
        # What the sims counted before the workload (a router's readiness
        # probe: a few tokens, no full block): subtracted below.
        before = [sim_counters(p) for p in sim_ports]
        second = (second_choices(bins, cfg, branches)
                  if a.warm_second and MODES[mode]["key"] and mode not in PEERS else None)
        res = asyncio.run(run_workload(front_port, branches, key_header(mode), concurrency(variant, a), a.answer_tokens,
                                       second))
        hits = queries = 0.0
        per_sim = []
        for p, b in zip(sim_ports, before):
            c = sim_counters(p)
            h, q, n = (c[k] - b[k] for k in ("hits", "queries", "requests"))
            hits += h
            queries += q
            per_sim.append({"port": p, "requests": n, "hits": h, "queries": q})
    finally:
        procs.stop(front)
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
    per = [s["requests"] for s in per_sim]
    mean = sum(per) / len(per)
    same_warm, same_turn = stickiness(recs)
    return {
        "mode": mode, "variant": variant, "wall": res["wall"],
        "hit_rate": hits / queries if queries else float("nan"),
        "prompt_tokens": queries, "cached_tokens": hits,
        "ttft_p50": C.pct(ttft, 50), "ttft_p99": C.pct(ttft, 99),
        "ttft_hot_p50": C.pct(hot_ttft, 50) if hot_ttft else float("nan"),
        "ttft_hot_p99": C.pct(hot_ttft, 99) if hot_ttft else float("nan"),
        "rps": ok_all / res["wall"], "ptps": queries / res["wall"],
        "turn_hit": (sum(r["cached"] or 0 for r in ok_turns) / max(1, sum(r["prompt"] or 0 for r in ok_turns))),
        "requests": len(recs), "ok": ok_all, "n503": n503,
        "n503_warmup": sum(1 for r in recs if r["status"] == 503 and r["kind"] == "warmup"),
        "spills": sum(1 for r in recs if r["route"] == "spill"),
        "routes": dict(Counter(r["route"] for r in recs if r["route"])),
        "other_errors": len(other_err), "other_error_examples": [r["error"] or r["status"] for r in other_err[:3]],
        "per_sim_requests": per,
        # a peer sends no X-Poimen-Route: its turns under "(router)"
        "turn_samples": [(r["route"] or ("(router)" if mode in PEERS else None), r["ttft"] * 1000,
                          r["prompt"] or 0, r["cached"] or 0)
                         for r in ok_turns if (r["route"] or mode in PEERS) and r["ttft"] is not None],
        "load_max_min": max(per) / min(per) if min(per) else math.inf,
        "load_max_mean": max(per) / mean if mean else float("nan"),
        "same_warm": same_warm, "same_turn": same_turn,
        "per_sim_hit": [s["hits"] / s["queries"] if s["queries"] else 0 for s in per_sim],
        "hot_share": sum(1 for r in recs if r["session"] == 0) / len(recs),
    }


def concurrency(variant: str, a) -> int:
    """Branches in flight at once: --concurrency, or --pressure-concurrency in `pressure`."""
    return (a.pressure_concurrency or a.concurrency) if variant == "pressure" else a.concurrency


def sim_counters(port: int) -> dict:
    """A sim's prefix-cache counters (its /metrics) and request count (/sim/stats)."""
    m = C.http_get(f"http://127.0.0.1:{port}/metrics")
    st = json.loads(C.http_get(f"http://127.0.0.1:{port}/sim/stats"))
    return {"hits": C.prom_values(m, "vllm:prefix_cache_hits_total"),
            "queries": C.prom_values(m, "vllm:prefix_cache_queries_total"), "requests": st["requests"]}


def router_ready(port: int) -> None:
    """A router routes once it has registered its workers: one tiny chat
    request (4 prompt tokens, no full KV block, so no cache entry) answered
    200 by a sim through it."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    C.http_post(port, "/v1/chat/completions", json.dumps(body).encode())


def second_choices(bins: Path, cfg: Path, branches: list[dict]) -> dict[int, int]:
    """Session -> the port of the backend its key ranks second, as
    `poimen-gateway route` prints the ranking."""
    out = {}
    for sess in {br["session"] for br in branches}:
        text = subprocess.run([str(bins / "poimen-gateway"), "route", "-c", str(cfg), "--model", MODEL,
                               "--key", f"session-{sess:03d}"], capture_output=True, text=True, check=True).stdout
        ranked = [ln.split() for ln in text.splitlines() if ln.strip()[:1].isdigit()]
        second = next(f for f in ranked if f[0] == "2")
        out[sess] = int(second[1].rsplit(":", 1)[1])
    return out


def by_route(samples: list[tuple]) -> dict[str, dict]:
    """Per X-Poimen-Route value, over `samples` (route, TTFT ms, prompt
    tokens, cached tokens) of answered turns: count, TTFT p50 / p99 / max and
    hit rate (the usage each response reported), i.e. whether the turns a
    policy moved paid a cold prefill where they landed."""
    out = {}
    for route in sorted({x[0] for x in samples}):
        rs = [x for x in samples if x[0] == route]
        ttft = [x[1] for x in rs]
        prompt = sum(x[2] for x in rs)
        out[route] = {"n": len(rs), "ttft_p50": C.pct(ttft, 50), "ttft_p99": C.pct(ttft, 99),
                      "ttft_max": max(ttft), "hit": sum(x[3] for x in rs) / prompt if prompt else float("nan")}
    return out


def stickiness(recs: list[dict]) -> tuple[float, float]:
    """Within each branch, the share of answered requests that went to the
    same backend as the branch's request just before them (also answered):
    (warmup -> turn 1, turn n -> turn n+1)."""
    by_branch: dict[tuple, dict[int, str]] = defaultdict(dict)
    for r in recs:
        if r["status"] == 200 and r["backend"]:
            i = 0 if r["kind"] == "warmup" else int(r["kind"][4:])
            by_branch[(r["session"], r["branch"])][i] = r["backend"]
    n = {1: [0, 0], 2: [0, 0]}
    for seq in by_branch.values():
        for i, be in seq.items():
            prev = seq.get(i - 1)
            if prev is not None:
                c = n[min(i, 2)]
                c[0] += prev == be
                c[1] += 1
    return tuple(s / t if t else float("nan") for s, t in (n[1], n[2]))  # type: ignore[return-value]


# --------------------------------------------------------------------------
# report


MED_KEYS = ("hit_rate", "turn_hit", "ttft_p50", "ttft_p99", "ttft_hot_p50", "ttft_hot_p99", "rps", "ptps", "n503", "spills",
            "wall", "other_errors", "n503_warmup", "load_max_min", "load_max_mean", "same_warm", "same_turn",
            "cell_secs")


def medians(runs: dict[tuple, list[dict]]) -> dict[tuple, dict]:
    med = {k: {f: C.median([r[f] for r in rs]) for f in MED_KEYS} for k, rs in runs.items()}
    for k, rs in runs.items():
        names = sorted({n for r in rs for n in r["routes"]})
        med[k]["routes"] = {n: C.median([r["routes"].get(n, 0) for r in rs]) for n in names}
        med[k]["per_sim_requests"] = rs[-1]["per_sim_requests"]
        med[k]["per_sim_all"] = [r["per_sim_requests"] for r in rs]
        med[k]["hot_share"] = rs[0]["hot_share"]
        med[k]["requests"] = rs[0]["requests"]
    return med


def fmt_routes(routes: dict) -> str:
    items = sorted(routes.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{n} {c:g}" for n, c in items) or "—"


def fmt_by_route(by: dict) -> str:
    return "; ".join(f"{k} {v['n']}: TTFT p50 {v['ttft_p50']:.0f} max {v['ttft_max']:.0f} ms, hit {v['hit'] * 100:.0f}%"
                     for k, v in by.items())


def fmt_ratio(x: float) -> str:
    return "∞" if x == math.inf else ("—" if x != x else f"{x:.2f}")


def fmt_pct(x: float) -> str:
    return "—" if x != x else f"{x * 100:.0f}%"


def run_line(r: dict) -> str:
    return (f"hit {r['hit_rate'] * 100:5.1f}% (turns {r['turn_hit'] * 100:5.1f}%)  TTFT p50 {r['ttft_p50']:6.0f} p99 {r['ttft_p99']:6.0f} ms  "
            f"{r['rps']:5.1f} req/s  503s {r['n503']:3.0f}  per sim max/min {fmt_ratio(r['load_max_min'])} "
            f"max/mean {fmt_ratio(r['load_max_mean'])}  same backend {fmt_pct(r['same_warm'])}/"
            f"{fmt_pct(r['same_turn'])}  routes {fmt_routes(r['routes'])}")


def chart(path: Path, med: dict, oracles: dict, modes: list[str], variants: list[str]) -> None:
    """One column per variant: hit rate (with the oracle) on top, completed
    req/s below, one bar per mode (503s written on the req/s bar)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    nv = len(variants)
    fig, axes = plt.subplots(2, nv, figsize=(max(7.0, 0.55 * len(modes) * nv + 1.5), 8.4), squeeze=False)
    cmap = plt.get_cmap("tab10")
    colors = [cmap(i % 10) for i in range(len(modes))]
    xs = list(range(len(modes)))
    for vi, v in enumerate(variants):
        ax = axes[0][vi]
        bars = ax.bar(xs, [med[(v, m)]["hit_rate"] * 100 for m in modes], 0.75, color=colors)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.axhline(oracles[v]["hit_rate"] * 100, color="black", ls="--", lw=1)
        ax.set_ylim(0, 105)
        ax.set_title(f"{v} ({VARIANTS[v]['sims']} sims): hit rate %\n(dashed: oracle "
                     f"{oracles[v]['hit_rate'] * 100:.0f}%)", fontsize=10)
        ax = axes[1][vi]
        rps = [med[(v, m)]["rps"] for m in modes]
        bars = ax.bar(xs, rps, 0.75, color=colors)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
        for x, m, y in zip(xs, modes, rps):
            n = med[(v, m)]["n503"]
            if n:
                ax.annotate(f"{n:.0f} x 503", (x, y * 0.05), ha="center", va="bottom", fontsize=7, rotation=90,
                            color="white")
        ax.set_title(f"{v}: completed req/s", fontsize=10)
    for ax in axes.flat:
        ax.set_xticks(xs)
        ax.set_xticklabels(modes, rotation=40, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("% of prompt tokens (sims' counters)")
    axes[1][0].set_ylabel("requests/s")
    fig.suptitle("poimen-gateway routing, vllm-sim with tight KV caches\n(medians over repetitions)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------


def names(arg: str, known: list[str], what: str) -> list[str]:
    out = [x.strip() for x in arg.split(",") if x.strip()]
    bad = [x for x in out if x not in known]
    if bad or not out:
        sys.exit(f"--{what}: unknown {', '.join(bad) or '(none given)'}; known: {','.join(known)}")
    return list(dict.fromkeys(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sessions", type=int, default=24,
                    help="sessions of uniform and hot (zipf: 64, few: 10; skewed and pressure: fitted to "
                         "2.6x and 2x the fleet's cache)")
    ap.add_argument("--turns", type=int, default=5, help="turns per branch (zipf: at most)")
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16, help="branches in flight at once")
    ap.add_argument("--pressure-concurrency", type=int, default=0,
                    help="branches in flight at once in `pressure` (0: --concurrency). With --concurrency 16 the "
                         "contexts in flight are ~0.8 x the fleet's cache; e.g. 40 puts ~2 x in flight")
    ap.add_argument("--time-scale", type=float, default=4.0, help="vllm-sim --time-scale")
    ap.add_argument("--prefill-us", type=int, default=20,
                    help="vllm-sim --prefill-us-per-token: prefill cost per uncached prompt token in µs, "
                         "before --time-scale (default: the sim's own default)")
    ap.add_argument("--router-threads", type=int, default=2,
                    help="the peers' TOKIO_WORKER_THREADS (the gateway runs threads: 2)")
    ap.add_argument("--queue-depth", type=int, default=20, help="gateway max_queue_depth of every mode but *-q2")
    ap.add_argument("--small-queue-depth", type=int, default=2, help="gateway max_queue_depth of key-q2, spill-q2")
    ap.add_argument("--warmup-delay-ms", type=int, default=100)
    ap.add_argument("--warm-second", action="store_true",
                    help="experiment: keyed modes also send every warmup straight to the sim its key ranks second "
                         "(a warm second choice, as a gateway fanning warmups out to two GPUs would make)")
    ap.add_argument("--no-warmups", action="store_true",
                    help="branches start with their first turn, no warmup (to see what warmups cost a mode)")
    ap.add_argument("--kv-tokens", type=int, default=0,
                    help="vllm-sim --kv-cache-tokens; 0 = a quarter of the uniform workload's distinct tokens")
    ap.add_argument("--index-cache-ratio", type=float, default=1.0,
                    help="the gateway's prefix_index.cache_tokens as a share of the sims' cache: under 1 the index "
                         "forgets a conversation before the sims do (as when other traffic shares them)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every (variant, mode), interleaved; medians")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"comma-separated, default %(default)s; known: {','.join(VARIANTS)}")
    ap.add_argument("--modes", default=",".join(GATEWAY_MODES),
                    help=f"comma-separated, default the gateway's modes (%(default)s); the peers: {','.join(PEERS)}")
    ap.add_argument("--skip-unsupported", action="store_true",
                    help="drop the modes whose gateway config the binary refuses instead of stopping")
    ap.add_argument("--out", default=str(C.RESULTS / "routing.md"))
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--port-seed", type=int, default=None,
                    help="pick the sims' ports from this seed (the same splits of sessions over sims in every "
                         "run with the same seed, e.g. to compare two binaries); default: any free ports")
    a = ap.parse_args()

    variants = names(a.variants, list(VARIANTS), "variants")
    modes = names(a.modes, list(MODES), "modes")
    C.signals_raise()
    bins = C.bin_dir()
    target = a.sessions * a.turns  # zipf, skewed: as many turns as uniform
    base = oracle(build_workload(a.seed, a.sessions, a.turns, "uniform", a.answer_tokens), a.answer_tokens)
    kv = a.kv_tokens or int(math.ceil(base["distinct_block_tokens"] / 4 / 1024) * 1024)
    workloads = {v: build_workload(a.seed, variant_sessions(v, a, kv, target), a.turns, v, a.answer_tokens, target,
                                   not a.no_warmups)
                 for v in variants}
    oracles = {v: oracle(workloads[v], a.answer_tokens) for v in variants}
    heads = {v: check_heads(workloads[v], a.answer_tokens) for v in variants}
    for v in variants:
        o, h = oracles[v], heads[v]
        print(f"workload {v}: {h['sessions']} sessions, {h['branches']} branches, {n_requests(workloads[v])} "
              f"requests on {VARIANTS[v]['sims']} sims, {o['prompt_tokens']:,} prompt tokens, oracle hit rate "
              f"{o['hit_rate'] * 100:.1f}%, distinct block tokens {o['distinct_block_tokens']:,} "
              f"({o['distinct_block_tokens'] / (VARIANTS[v]['sims'] * kv):.2f} x the sims' caches), "
              f"{h['turn_heads']} keyless-prefix heads", flush=True)
    print(f"vllm-sim --kv-cache-tokens {kv} per sim (x4 = {4 * kv / base['distinct_block_tokens']:.2f} of the "
          f"uniform workload's distinct tokens)", flush=True)

    t_start = time.time()
    runs: dict[tuple, list[dict]] = {}
    with C.bench_run("routing", a.keep_logs) as (wd, procs):
        refused = preflight(bins, wd, modes, a)
        if refused:
            for m, msg in refused.items():
                print(f"mode {m}: {'not available' if m in PEERS else bins / 'poimen-gateway'}"
                      f"{'' if m in PEERS else ' refuses its config'}: {msg}", file=sys.stderr)
            if not a.skip_unsupported:
                sys.exit(f"{len(refused)} mode(s) not supported by this binary: {','.join(refused)} "
                         "(leave them out with --modes, or pass --skip-unsupported)")
            modes = [m for m in modes if m not in refused]
            if not modes:
                sys.exit("no mode left to run")
        total = a.reps * len(variants) * len(modes)
        done = 0
        port_rng = random.Random(a.port_seed) if a.port_seed is not None else None
        for rep in range(a.reps):
            # The rendezvous hash ranks backends by their address text, so the
            # ports decide which sessions share a sim: the same ports for every
            # variant and mode of a repetition (few: the first 3), new ones for
            # the next repetition.
            sim_ports = (seeded_ports(port_rng) if port_rng else
                         [C.free_port() for _ in range(MAX_SIMS)])
            for v in variants:
                order = modes if rep % 2 == 0 else list(reversed(modes))
                for m in order:
                    t_cell = time.time()
                    r = run_mode(bins, wd, procs, m, v, workloads[v], a, kv, sim_ports)
                    r["cell_secs"] = time.time() - t_cell
                    runs.setdefault((v, m), []).append(r)
                    done += 1
                    el = time.time() - t_start
                    print(f"  [{done}/{total}, {el / 60:.1f} min, ~{el / done * (total - done) / 60:.1f} min left] "
                          f"rep {rep + 1} {v:8s} {m:27s} {run_line(r)}  per sim {r['per_sim_requests']}  "
                          f"wall {r['wall']:.1f}s (run {r['cell_secs']:.1f}s)  other errors {r['other_errors']}\n"
                          f"    turns by route: {fmt_by_route(by_route(r['turn_samples']))}",
                          flush=True)
                    if r["other_errors"]:
                        print(f"    examples: {r['other_error_examples']}", flush=True)
        med = medians(runs)
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        png = out.with_suffix(".png")
        chart(png, med, oracles, modes, variants)
        report = render(a, kv, base, workloads, heads, oracles, med, runs, modes, variants, refused, png,
                        time.time() - t_start)
        out.write_text(report)
        print()
        print("summary (medians):")
        for v in variants:
            for m in modes:
                print(f"  {v:8s} {m:27s} {run_line(med[(v, m)])}  (oracle {oracles[v]['hit_rate'] * 100:.1f}%)")
        print()
        print(report)
        print(f"written to {out} and {png}")
        return 0


def render(a, kv, base, workloads, heads, oracles, med, runs, modes, variants, refused, png, elapsed) -> str:
    L = C.report_head("poimen-gateway routing quality (vllm-sim)", C.bin_dir())
    w = L.append
    cell = [r["cell_secs"] for rs in runs.values() for r in rs]
    args = " ".join(sys.argv[1:])
    w(f"- command: `python3 bench/routing/run.py{' ' + args if args else ''}` (parameters: `--seed {a.seed} "
      f"--sessions {a.sessions} --turns {a.turns} --concurrency {a.concurrency} "
      f"{f'--pressure-concurrency {a.pressure_concurrency} ' if a.pressure_concurrency else ''}"
      f"--time-scale {a.time_scale:g} "
      f"--prefill-us {a.prefill_us} --queue-depth {a.queue_depth} --small-queue-depth {a.small_queue_depth} --reps {a.reps} --variants "
      f"{','.join(variants)} --modes {','.join(modes)}`); total run time {elapsed / 60:.1f} min, {len(cell)} runs, "
      f"median {C.median(cell):.1f} s per run (start sims and gateway, workload, stop)")
    w("")
    w("## Set-up")
    w("")
    ctx = 1500 + 3500  # a session's system message: shared prompt + a mean memory context, in tokens
    miss_ms = ctx * a.prefill_us * a.time_scale / 1000
    step_ms = (2000 + 4 * 200) * a.time_scale / 1000
    w(f"- `vllm-sim --max-num-seqs 4 --kv-cache-tokens {kv} --time-scale {a.time_scale:g} --prefill-us-per-token "
      f"{a.prefill_us}` × 4 (× 3 in `few`) (costs: prefill {a.prefill_us} µs per uncached token"
      f"{' (the sim default)' if a.prefill_us == 20 else ' (`--prefill-us`; the sim default is 20)'}, decode 2 ms "
      f"per token + 0.2 ms per running sequence (the defaults), all × time-scale), restarted before every run (cold "
      f"caches). {kv:,} tokens per sim = a quarter of the uniform workload's {base['distinct_block_tokens']:,} "
      f"distinct prompt tokens, in every variant. At these costs a cold session context (~{ctx:,} tokens) takes "
      f"{miss_ms:.0f} ms of prefill, against {step_ms:.1f} ms for one decode step of a full batch (4 running) and "
      f"{step_ms * a.answer_tokens:.0f} ms for a whole {a.answer_tokens}-token answer of a full batch (the sim "
      "prefills each request in its own slot: a miss delays that request, not the others in the batch).")
    peers = [m for m in modes if m in PEERS]
    if peers:
        w("- peers (" + ", ".join(f"`{m}`" for m in peers) + "): an LLM router in the gateway's place, in front of "
          "the same sims, restarted before every run, as a new user would start it: `"
          + "`; `".join(peer_command(m) for m in peers)
          + f"` with `RUST_LOG=warn NO_COLOR=1 TOKIO_WORKER_THREADS={a.router_threads}`, everything else at its "
          "defaults (cache_aware: cache threshold 0.3, balance thresholds 64 abs / 1.5 rel; retries, circuit "
          "breaker, health checks"
          + ("; smg's defaults also have worker overload protection (a sim with ≥ 8 waiting requests or ≥ 0.8 KV "
             "usage left out while another is under), a 60 s warm-up slice (one cache miss in 4 offered to a new or "
             "thin worker) and 3 s wedge detection" if any(PEERS[m]["router"] == "smg" for m in peers) else "")
          + "). Versions: "
          + ", ".join(f"{r} {C.router_version(C.router_venv(r), r)}" for r in sorted({PEERS[m]['router'] for m in peers}))
          + ". Keyed peers get the session id in their own key header (vllm-router `X-Session-Id`, sglang-router "
          "and smg `X-SMG-Routing-Key`). **No gateway scheduler in front of the peers**: no admission, no queue "
          "depth, no 503s from the front; every request goes to a sim at once and waits in its FIFO. They send no "
          "`X-Poimen-Backend`, so the same-backend columns are — for them, and no `X-Poimen-Route` (their turns are "
          "listed under `(router)` below); `X-Poimen-Warmup` means nothing to them: a warmup is an ordinary "
          "`max_tokens: 1` request. The sims' counters are read before (after one 4-token readiness probe through "
          "the router, no full block) and after the workload, the difference reported, as for the gateway.")
    w(f"- gateway (`threads: 2`, restarted before every run): one model over the sims, `scheduler: "
      f"{{max_num_seqs: 4, max_queue_depth, queue_timeout_ms: 120000, overflow}}` and `gateway.routing` per mode "
      f"(below), `warmup.delay_ms: {a.warmup_delay_ms}`, `stream_usage: true` (default).")
    w(f"- workload (seed {a.seed}): a session's system message = a 6,000-byte (1,500-token) system prompt shared "
      "by all sessions + a per-session memory context of 3,000–4,000 tokens; each branch of a session (a "
      "sub-agent sharing its key and context) sends "
      + ("no warmup (`--no-warmups`), only " if a.no_warmups else
         "a warmup (`X-Poimen-Warmup: true`, `max_tokens: 1`, the system message alone) then ")
      + "streamed turns, each appending the previous "
      f"{a.answer_tokens}-token answer and a 75–200-token user message. At most {a.concurrency} branches in "
      "flight; a 503 is counted and not retried (the conversation goes on)."
      + (" `--warm-second` (experiment): in keyed modes every warmup is also sent straight to the sim its key "
         "ranks second (a warm second choice); the copies count in the sims' hit rate and per-sim requests."
         if a.warm_second else ""))
    for v in variants:
        o, h, wl = oracles[v], heads[v], workloads[v]
        top = sum(1 for b in wl if b["session"] == 0)
        desc = {
            "uniform": "one branch per session",
            "hot": f"branches ∝ 1/rank^2.5, the hot session {top} branches = "
                   f"{med[(v, modes[0])]['hot_share'] * 100:.0f}% of requests",
            "zipf": f"turns per session ∝ 1/rank^1.1 (max(1, round(c/rank^1.1)), total ≥ {a.sessions * a.turns}, "
                    f"the uniform workload's turns), split into branches of ≤ {a.turns} turns; the top session "
                    f"{sum(len(b['questions']) for b in wl if b['session'] == 0)} turns in {top} branches = "
                    f"{med[(v, modes[0])]['hot_share'] * 100:.0f}% of requests",
            "few": "one branch per session (the demo's shape)",
            "pressure": f"one branch per session, as uniform; sessions fitted so that the distinct tokens reach "
                        f"{VARIANTS['pressure']['cache_ratio']:g} × the fleet's cache; at most "
                        f"{concurrency(v, a)} branches in flight"
                        f"{' (`--pressure-concurrency`)' if a.pressure_concurrency else ''}, whose contexts (about "
                        f"{o['distinct_block_tokens'] / h['sessions']:,.0f} distinct tokens a session) are ≈ "
                        f"{min(concurrency(v, a), h['sessions']) * o['distinct_block_tokens'] / h['sessions'] / (VARIANTS[v]['sims'] * kv):.2f} "
                        "× the fleet's cache at once",
            "skewed": f"as zipf (turns ∝ 1/rank^1.1, total ≥ {a.sessions * a.turns}, branches of ≤ {a.turns} turns), "
                      f"sessions fitted so that the distinct tokens reach {VARIANTS['skewed']['cache_ratio']:g} × the "
                      f"fleet's cache; the top session {sum(len(b['questions']) for b in wl if b['session'] == 0)} "
                      f"turns in {top} branches = {med[(v, modes[0])]['hot_share'] * 100:.0f}% of requests",
        }[v]
        w(f"- `{v}`: {h['sessions']} sessions on {VARIANTS[v]['sims']} sims, {h['branches']} branches, "
          f"{n_requests(wl)} requests, {o['prompt_tokens']:,} prompt tokens, {o['distinct_block_tokens']:,} "
          f"distinct (= {o['distinct_block_tokens'] / (VARIANTS[v]['sims'] * kv):.2f} × the sims' caches); "
          f"{desc}; {h['turn_heads']} distinct keyless-prefix heads (system + first user message) over its turns")
    w("- keyless prefix affinity (`prefix*` modes): a turn's head (system message + the branch's first user "
      "message) is the same in all turns of a branch, so the derived key is per branch: per session in uniform "
      "and few, per sub-agent in hot and zipf (where `key` pins all of a session's branches to one backend). A "
      "warmup has no user message: its key covers the system message alone, so it lands elsewhere than its turns "
      "(see the warmup → turn 1 column). `system*` modes key on the system message alone: one key per session, "
      "shared by its warmup, turns and branches, like `key`.")
    w("- modes (the client sends `X-Poimen-Cache-Key: session-NNN` or nothing):")
    w("")
    w("| mode | X-Poimen-Cache-Key (peers: key header) | max_queue_depth | overflow | gateway.routing "
      "(peers: router and policy) |")
    w("|---|---|---:|---|---|")
    for m in modes:
        w(mode_config_text(m, a))
    w("")
    if refused:
        w("Not run (the binary refused the config, or the router is not installed): " + "; ".join(f"`{m}`: {msg}" for m, msg in refused.items()))
        w("")
    w("- hit rate = Σ over the sims of `vllm:prefix_cache_hits_total` / Σ `vllm:prefix_cache_queries_total` "
      "(the sims' own /metrics; warmups included). TTFT = request sent → first chunk with content, turns only. "
      "req/s = completed requests (warmups included) / wall time; prompt tok/s = Σ queries / wall time.")
    w("- oracle = the share of prompt tokens (warmups included) in leading full 16-token blocks that some "
      "earlier request's prompt also had (the sim's tokenization: 4 bytes per token, `<role>\\n<content>\\n` "
      "per message, chained blocks), i.e. one infinite cache; computed offline from the prompts.")
    w("- per sim: requests each sim received (its `/sim/stats`); max/min and max/mean of those counts per run, "
      "then the median over repetitions. same backend = within a branch, the share of answered requests served "
      "by the same backend as the branch's previous answered request: warmup → turn 1 / turn n → turn n+1. "
      "routes = responses per `X-Poimen-Route` value (503 `queue_full` answers carry none), medians.")
    w("- the rendezvous hash ranks backends by their address text (`127.0.0.1:PORT`), so which sessions share a "
      "sim depends on the ports: every repetition picks new free ports and uses them for all its variants and "
      "modes (`few`: the first 3); the split is uneven and differs per repetition (see the per-sim counts).")
    w("")
    w(f"## Results (medians over {a.reps} repetitions; repetitions interleaved)")
    w("")
    w("| variant | mode | hit rate | oracle | TTFT p50 ms | TTFT p99 ms | session-0 TTFT p50 / p99 ms | req/s "
      "| prompt tok/s | 503s (warmups) | per sim max/min | max/mean | same backend warmup→t1 / t→t+1 "
      "| X-Poimen-Route |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for v in variants:
        for m in modes:
            r = med[(v, m)]
            w(f"| {v} | {m} | {r['hit_rate'] * 100:.1f}% | {oracles[v]['hit_rate'] * 100:.1f}% | "
              f"{r['ttft_p50']:.0f} | {r['ttft_p99']:.0f} | {r['ttft_hot_p50']:.0f} / {r['ttft_hot_p99']:.0f} | "
              f"{r['rps']:.1f} | {r['ptps']:,.0f} | {r['n503']:.0f} ({r['n503_warmup']:.0f}) | "
              f"{fmt_ratio(r['load_max_min'])} | {fmt_ratio(r['load_max_mean'])} | "
              f"{fmt_pct(r['same_warm'])} / {fmt_pct(r['same_turn'])} | {fmt_routes(r['routes'])} |")
    w("")
    w("session-0 is the hot session in `hot`, the rank-1 session in `zipf`, an ordinary one in `uniform` and "
      "`few`. 503s are 503 `queue_full` answers (counted, not retried). Routes: `hash` = a key's first "
      "rendezvous choice, `round_robin` = no key, `spill` = past a full backend (overflow: spill), `balance` = "
      "moved off the backend holding the prompt by the cost rule, `cache` = the backend holding the prompt, not the "
      "order's first, `prefix` = a key derived from the body, `fallback` = past an "
      "excluded backend; a peer sends none (—; its turns are `(router)` below). TTFT and req/s count answered requests only, so a mode that refuses work (key-q2) "
      "looks faster than one that queues it (key): read TTFT together with the 503 column.")
    w("")
    w("### Where the TTFT tail comes from")
    w("")
    w("The answered turns of all repetitions together, by the route each was served under: how many, their "
      "hit rate (from the `usage` each streamed response reported: `stream_options.include_usage`), and their "
      "TTFT. A turn moved off its first choice (`balance`, `spill`) lands where its session's context is cold "
      "unless an earlier turn of the session was moved there too.")
    w("")
    w("| variant | mode | route | turns | hit rate | TTFT p50 ms | TTFT p99 ms | TTFT max ms |")
    w("|---|---|---|---:|---:|---:|---:|---:|")
    for v in variants:
        for m in modes:
            pooled = by_route([x for r in runs[(v, m)] for x in r["turn_samples"]])
            for route, b in pooled.items():
                w(f"| {v} | {m} | {route} | {b['n']} | {b['hit'] * 100:.0f}% | {b['ttft_p50']:.0f} | "
                  f"{b['ttft_p99']:.0f} | {b['ttft_max']:.0f} |")
    w("")
    errs = sum(r["other_errors"] for rs in runs.values() for r in rs)
    w(f"Errors other than 503 over all runs: {errs}.")
    w("")
    w("Every run:")
    w("")
    w("| variant | mode | rep | hit rate | TTFT p50 ms | TTFT p99 ms | req/s | 503s | max/min | wall s | "
      "requests per sim | X-Poimen-Route |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for v in variants:
        for m in modes:
            for i, r in enumerate(runs[(v, m)]):
                w(f"| {v} | {m} | {i + 1} | {r['hit_rate'] * 100:.1f}% | {r['ttft_p50']:.0f} | {r['ttft_p99']:.0f} | "
                  f"{r['rps']:.1f} | {r['n503']} | {fmt_ratio(r['load_max_min'])} | {r['wall']:.1f} | "
                  f"{' / '.join(str(x) for x in r['per_sim_requests'])} | {fmt_routes(r['routes'])} |")
    w("")
    w(f"![routing chart]({png.name})")
    w("")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
