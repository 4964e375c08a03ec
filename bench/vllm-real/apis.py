"""The Responses API and Anthropic Messages through the gateway, driven by the
official `openai` and `anthropic` SDKs (both come with vLLM 0.32), and raw
probes of what vLLM sends on them. Used by run.py (phase `apis`).

The sessions are the chat workload's (the same system message and questions);
every turn is one request, no warmups:
  responses  a chain: turn 1 `instructions` = the system message, `input` = the
             first question; each next turn the same `instructions` (vLLM does
             not carry them over), the next question as `input` and
             `previous_response_id` = the turn before's id; `store: true`
             (servers with VLLM_ENABLE_RESPONSES_API_STORE=1). vLLM rebuilds
             the history from its store: the earlier questions and the model's
             own answers.
  messages   `system` = the system message, `messages` growing by a fixed
             assistant answer and the next question per turn: the same prompt
             bytes as the chat workload's turns.
Each streamed or not, with X-Poimen-Cache-Key (`keyed`) or without
(`keyless`, the gateway set to `routing.keyless: system`). SDK retries off:
a failed turn is counted, not retried; a chain stops at its first failure
(its later turns count as failed).
"""

from __future__ import annotations

import asyncio
import http.client
import inspect
import json
import random
import time

import common as C

MODEL = "tiny"
ANSWER = "ok, done."  # the chat workload's fixed assistant answer
APIS = ("responses", "messages")


# --------------------------------------------------------------------------
# the workload through the SDKs


def _key_headers(se: dict, keyed: bool) -> dict:
    return {"X-Poimen-Cache-Key": f"session-{se['session']:03d}"} if keyed else {}


async def _parsed(raw):
    """`with_raw_response`'s parse(): plain in `openai`, a coroutine in the
    async client of `anthropic`."""
    out = raw.parse()
    return await out if inspect.isawaitable(out) else out


def _rec(se: dict, t: int) -> dict:
    return {"session": se["session"], "kind": f"turn{t + 1}", "backend": None, "route": None, "id": None,
            "prompt_tokens": None, "cached_tokens": None, "error": None, "t0": time.perf_counter()}


async def _responses_session(client, se: dict, stream: bool, keyed: bool, a, recs: list) -> None:
    prev = None
    for t, q in enumerate(se["questions"]):
        rec = _rec(se, t)
        recs.append(rec)
        if t > 0 and prev is None:
            rec["error"] = "skipped: the chain broke at an earlier turn"
            continue
        kw = {"model": MODEL, "instructions": se["system"], "input": q, "store": True,
              "max_output_tokens": a.max_tokens, "temperature": 0, "extra_headers": _key_headers(se, keyed)}
        if prev:
            kw["previous_response_id"] = prev
        prev = None
        usage = None
        try:
            if stream:
                async with client.responses.with_streaming_response.create(stream=True, **kw) as raw:
                    rec["backend"] = raw.headers.get("x-poimen-backend")
                    rec["route"] = raw.headers.get("x-poimen-route")
                    async for ev in await raw.parse():
                        if ev.type in ("response.created", "response.completed"):
                            rec["id"] = ev.response.id
                        if ev.type == "response.completed":
                            usage = ev.response.usage
                        elif ev.type in ("error", "response.failed"):
                            rec["error"] = f"{ev.type}: {ev}"[:300]
            else:
                raw = await client.responses.with_raw_response.create(**kw)
                rec["backend"] = raw.headers.get("x-poimen-backend")
                rec["route"] = raw.headers.get("x-poimen-route")
                resp = await _parsed(raw)
                rec["id"], usage = resp.id, resp.usage
        except Exception as e:  # noqa: BLE001 - every failure is a failed turn
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        if usage is not None:
            rec["prompt_tokens"] = usage.input_tokens
            rec["cached_tokens"] = usage.input_tokens_details.cached_tokens if usage.input_tokens_details else None
        elif not rec["error"]:
            rec["error"] = "no usage"
        if not rec["error"]:
            prev = rec["id"]
        rec["secs"] = time.perf_counter() - rec["t0"]


def _messages_prompt(u) -> tuple[int | None, int | None]:
    """(prompt, hits) of an Anthropic usage: input + cache read + cache
    creation, cache read."""
    if u is None or u.input_tokens is None:
        return None, None
    read = u.cache_read_input_tokens
    return u.input_tokens + (read or 0) + (u.cache_creation_input_tokens or 0), read


async def _messages_session(client, se: dict, stream: bool, keyed: bool, a, recs: list) -> None:
    msgs: list[dict] = []
    for t, q in enumerate(se["questions"]):
        if t > 0:
            msgs.append({"role": "assistant", "content": ANSWER})
        msgs.append({"role": "user", "content": q})
        rec = _rec(se, t)
        recs.append(rec)
        # temperature in extra_body: this SDK's `create` has no such argument
        kw = {"model": MODEL, "system": se["system"], "messages": list(msgs), "max_tokens": a.max_tokens,
              "extra_body": {"temperature": 0}, "extra_headers": _key_headers(se, keyed)}
        try:
            if stream:
                start = delta = None
                async with client.messages.with_streaming_response.create(stream=True, **kw) as raw:
                    rec["backend"] = raw.headers.get("x-poimen-backend")
                    rec["route"] = raw.headers.get("x-poimen-route")
                    async for ev in await raw.parse():
                        if ev.type == "message_start":
                            start = ev.message.usage
                            rec["id"] = ev.message.id
                        elif ev.type == "message_delta":
                            delta = ev.usage
                        elif ev.type == "error":
                            rec["error"] = f"error event: {ev}"[:300]
                p, h = _messages_prompt(delta)
                rec["prompt_tokens"] = p if p is not None else _messages_prompt(start)[0]
                rec["cached_tokens"] = h
                rec["start_input_tokens"] = start.input_tokens if start else None
            else:
                raw = await client.messages.with_raw_response.create(**kw)
                rec["backend"] = raw.headers.get("x-poimen-backend")
                rec["route"] = raw.headers.get("x-poimen-route")
                m = await _parsed(raw)
                rec["id"] = m.id
                rec["prompt_tokens"], rec["cached_tokens"] = _messages_prompt(m.usage)
        except Exception as e:  # noqa: BLE001 - every failure is a failed turn
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        if rec["prompt_tokens"] is None and not rec["error"]:
            rec["error"] = "no usage"
        rec["secs"] = time.perf_counter() - rec["t0"]


async def run_api_workload(port: int, sessions: list[dict], api: str, stream: bool, keyed: bool, a) -> dict:
    """Every session's turns through the gateway on `port`, at most
    a.concurrency sessions at a time, in the workload's order."""
    import anthropic
    import openai
    if api == "responses":
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                                    timeout=a.request_timeout)
        one = _responses_session
    else:
        client = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{port}", api_key="none", max_retries=0,
                                          timeout=a.request_timeout)
        one = _messages_session
    sem = asyncio.Semaphore(a.concurrency)
    recs: list[dict] = []

    async def session(se):
        async with sem:
            await one(client, se, stream, keyed, a, recs)

    t0 = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(session(se) for se in sessions)), timeout=a.workload_timeout)
    finally:
        await client.close()
    return {"records": recs, "wall": time.perf_counter() - t0}


# --------------------------------------------------------------------------
# raw probes: what vLLM sends, straight to the servers (no gateway, no SDK)


def _post(port: int, path: str, body: dict, stream: bool = False) -> tuple[int, str]:
    """POST a JSON body; the status and the raw response text (a stream: its
    whole text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def sse_events(text: str) -> list[tuple[str, str]]:
    """(event, data) of every SSE event of a stream's text."""
    out = []
    for block in text.split("\n\n"):
        ev, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if ev or data:
            out.append((ev or "", "\n".join(data)))
    return out


def _trim_response(obj: dict) -> dict:
    """A Responses object without its long, uninteresting fields."""
    keep = ("id", "object", "status", "incomplete_details", "previous_response_id", "usage")
    return {k: obj[k] for k in keep if k in obj}


def probe_apis(ports: list[int], a) -> list[dict]:
    """Raw requests to the servers. Each probe: a title, the request in
    short, the status and raw excerpts of what came back. Prompts are fresh
    text (seeded), so the first send of each is a cold miss and the second a
    hit (of whole blocks, the last token excluded)."""
    rng = random.Random(a.seed * 31 + 5)
    out: list[dict] = []

    def add(title, req, status, excerpts):
        out.append({"title": title, "request": req, "status": status, "excerpts": excerpts})

    p = ports[0]
    # Messages, non-streamed: cold, then the same again.
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, "system": C.text(rng, 300),
            "messages": [{"role": "user", "content": C.text(rng, 400)}]}
    for n in ("cold", "same prompt again"):
        st, txt = _post(p, "/v1/messages", body)
        add(f"Messages, not streamed, {n}", "POST /v1/messages (system 300 B, one user message 400 B, "
            "max_tokens 4)", st, [txt])
    # Messages, streamed: cold, then again.
    body = dict(body, system=C.text(rng, 300), stream=True)
    for n in ("cold", "same prompt again"):
        st, txt = _post(p, "/v1/messages", body)
        evs = sse_events(txt)
        keep = [f"event: {e}\ndata: {d}" for e, d in evs if e in ("message_start", "message_delta", "message_stop")]
        add(f"Messages, streamed, {n}", "the same with a new system text, `stream: true`", st,
            keep + [f"(events in order: {', '.join(e for e, _ in evs)})"])
    st, txt = _post(p, "/v1/messages/count_tokens", {k: v for k, v in body.items()
                                                     if k in ("model", "system", "messages")})
    add("Messages count_tokens", "POST /v1/messages/count_tokens, the same prompt", st, [txt])
    # Responses, non-streamed: cold, then again; then a stored turn continued on
    # the other server; an unknown id; GET of an unknown id.
    body = {"model": MODEL, "instructions": C.text(rng, 300), "input": C.text(rng, 400), "store": True,
            "max_output_tokens": 4, "temperature": 0}
    first_id = None
    for n in ("cold", "same prompt again"):
        st, txt = _post(p, "/v1/responses", body)
        try:
            obj = json.loads(txt)
            first_id = first_id or obj.get("id")
            ex = [json.dumps(_trim_response(obj), separators=(",", ":")), f"(keys in order: {', '.join(obj)})"]
        except ValueError:
            ex = [txt[:2000]]
        add(f"Responses, not streamed, {n}", "POST /v1/responses (instructions 300 B, input 400 B, store, "
            "max_output_tokens 4)", st, ex)
    body_s = dict(body, instructions=C.text(rng, 300), stream=True)
    for n in ("cold", "same prompt again"):
        st, txt = _post(p, "/v1/responses", body_s)
        evs = sse_events(txt)
        ex = []
        for e, d in evs:
            if e in ("response.created", "response.completed"):
                try:
                    obj = json.loads(d)
                    obj["response"] = _trim_response(obj["response"])
                    d = json.dumps(obj, separators=(",", ":"))
                except (ValueError, KeyError):
                    pass
                ex.append(f"event: {e}\ndata: {d}")
        add(f"Responses, streamed, {n}", "the same with new instructions, `stream: true` "
            "(response objects cut to id, object, status, incomplete_details, previous_response_id, usage)",
            st, ex + [f"(events in order: {', '.join(e for e, _ in evs)})"])
    if first_id and len(ports) > 1:
        st, txt = _post(ports[1], "/v1/responses", dict(body, input="next", previous_response_id=first_id))
        add("Responses, a stored id continued on the other server",
            f"POST /v1/responses to server 2 with previous_response_id = server 1's `{first_id}`", st, [txt])
        st, txt = _post(p, "/v1/responses", dict(body, input="next", previous_response_id=first_id))
        try:
            obj = json.loads(txt)
            ex = [json.dumps(_trim_response(obj), separators=(",", ":"))]
        except ValueError:
            ex = [txt[:2000]]
        add("Responses, the same id continued on its own server", "the same to server 1", st, ex)
        st, txt = _post(p, "/v1/responses", {k: v for k, v in body.items() if k != "instructions"}
                        | {"input": "next", "previous_response_id": first_id})
        try:
            ex = [json.dumps(_trim_response(json.loads(txt)), separators=(",", ":"))]
        except ValueError:
            ex = [txt[:2000]]
        add("Responses, continued without `instructions`", "the same to server 1, `instructions` left out "
            "(do the first turn's carry over?)", st, ex)
    st, txt = _post(p, "/v1/responses", dict(body, previous_response_id="resp_0123456789abcdef"))
    add("Responses, an unknown previous_response_id", "POST /v1/responses, previous_response_id "
        "`resp_0123456789abcdef`", st, [txt])
    st, txt = _get(p, "/v1/responses/resp_0123456789abcdef")
    add("Responses, GET of an unknown id", "GET /v1/responses/resp_0123456789abcdef", st, [txt])
    return out


def probe_lines(pr: list[dict]) -> list[str]:
    L = []
    for x in pr:
        L += [f"**{x['title']}**: {x['request']} -> {x['status']}", "", "```text"]
        for e in x["excerpts"]:
            L.append(e.rstrip("\n"))
        L += ["```", ""]
    return L
