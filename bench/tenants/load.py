"""The tenants bench's clients: one aiohttp session driving closed-loop
workers (a tenant keeping N requests in flight, or a user with think time)
and paced senders (one request every T seconds, whatever happened to the
earlier ones) against one gateway, for a bounded time.

Every request names its tenant in `X-Tenant`, in both modes: the FCFS
gateway has no `tenants.header` (the header goes upstream untouched and
every request is tenant `default`), the fair one reads it. So both gateways
get the same bytes.

A record per request: tenant, start / first body byte / end (seconds from
the load's start), status, error code, completion tokens asked and whether
the whole answer came (`ok`).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Callable

MODEL = "sim-model"
REQUEST_TIMEOUT_SECS = 60.0


@dataclass
class Closed:
    """`workers` requests of `tenant` in flight at once, each worker
    sending its next request when the last ended: after `think(rng)`
    seconds on a 200; on anything else after `backoff` seconds, or when
    that is None after the answer's `Retry-After` (else 1 s)."""
    tenant: str
    workers: int
    tokens: Callable[[random.Random], int]
    stream: bool = False
    think: Callable[[random.Random], float] | None = None
    backoff: float | None = None
    start: float = 0.0


@dataclass
class Paced:
    """`count` requests of `tenant`, the i-th sent at `start + i * every`."""
    tenant: str
    every: float
    count: int
    tokens: int
    stream: bool = False
    start: float = 0.0


@dataclass
class Load:
    records: list[dict] = field(default_factory=list)
    secs: float = 0.0


def body(tenant: str, i: int, max_tokens: int, stream: bool) -> bytes:
    msg = f"{tenant} request {i}: summarise the incident notes and propose the next step"
    b = {"messages": [{"role": "user", "content": msg}], "max_tokens": max_tokens, "model": MODEL}
    if stream:
        b["stream"] = True
    return json.dumps(b).encode()


def streamed_content(raw: bytes) -> tuple[str, bool]:
    """The content of an SSE chat stream, and whether it ended with [DONE]."""
    parts, done = [], False
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            done = True
            continue
        for c in json.loads(data).get("choices", []):
            parts.append((c.get("delta") or {}).get("content") or "")
    return "".join(parts), done


async def request(http, url: str, tenant: str, i: int, max_tokens: int, stream: bool, t0: float) -> dict:
    rec = {"tenant": tenant, "tokens": max_tokens, "stream": stream, "status": None, "code": None,
           "ok": False, "err": None, "start": time.perf_counter() - t0}
    headers = {"Content-Type": "application/json", "X-Tenant": tenant}
    start = time.perf_counter()
    try:
        async with http.post(url, data=body(tenant, i, max_tokens, stream), headers=headers) as r:
            rec["status"] = r.status
            rec["retry_after"] = r.headers.get("Retry-After")
            chunks = []
            async for chunk in r.content.iter_any():
                if not chunks:
                    rec["first"] = time.perf_counter() - t0
                chunks.append(chunk)
            raw = b"".join(chunks)
        rec["end"] = time.perf_counter() - t0
        if r.status == 200 and stream:
            content, done = streamed_content(raw)
            rec["ok"] = done and content == " tok" * max_tokens
        elif r.status == 200:
            j = json.loads(raw)
            rec["ok"] = (j["usage"]["completion_tokens"] == max_tokens
                         and j["choices"][0]["message"]["content"] == " tok" * max_tokens)
        else:
            rec["code"] = (json.loads(raw).get("error") or {}).get("code")
    except Exception as e:  # noqa: BLE001  (recorded, counted as a failure)
        rec["end"] = time.perf_counter() - t0
        rec["err"] = repr(e)
    rec.setdefault("first", rec["end"])
    rec["secs"] = time.perf_counter() - start
    return rec


async def closed(http, url: str, c: Closed, w: int, seed: int, t0: float, stop_at: float, out: list) -> None:
    rng = random.Random(f"{seed}/{c.tenant}/{w}")
    await asyncio.sleep(max(0.0, t0 + c.start - time.perf_counter()))
    i = 0
    while time.perf_counter() < stop_at:
        rec = await request(http, url, c.tenant, w * 100_000 + i, c.tokens(rng), c.stream, t0)
        out.append(rec)
        i += 1
        if rec["status"] == 200:
            pause = c.think(rng) if c.think else 0.0
        else:
            pause = c.backoff if c.backoff is not None else retry_after(rec)
        if pause:
            await asyncio.sleep(min(pause, max(0.0, stop_at - time.perf_counter())))


def retry_after(rec: dict) -> float:
    try:
        return float(rec.get("retry_after") or 1.0)
    except ValueError:
        return 1.0


async def paced(http, url: str, p: Paced, t0: float, out: list) -> None:
    async def one(i):
        out.append(await request(http, url, p.tenant, i, p.tokens, p.stream, t0))

    tasks = []
    for i in range(p.count):
        await asyncio.sleep(max(0.0, t0 + p.start + i * p.every - time.perf_counter()))
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)


async def drive(port: int, actors: list, secs: float, seed: int) -> Load:
    """Run `actors` against the gateway on `port`: closed-loop workers start
    requests until `secs`, paced senders send their count; then wait for
    every request to end (each bounded by REQUEST_TIMEOUT_SECS)."""
    import aiohttp
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    load = Load()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECS)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        t0 = time.perf_counter()
        stop_at = t0 + secs
        tasks = []
        for a in actors:
            if isinstance(a, Closed):
                tasks += [closed(http, url, a, w, seed, t0, stop_at, load.records) for w in range(a.workers)]
            else:
                tasks.append(paced(http, url, a, t0, load.records))
        await asyncio.gather(*tasks)
        load.secs = time.perf_counter() - t0
    return load


async def fixed_count(port: int, n: int, concurrency: int, tenants: list[str], max_tokens: int) -> list[dict]:
    """`n` requests, `concurrency` at a time, tenants in turn (the CPU
    measurement: a fixed amount of work)."""
    import aiohttp
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    recs: list[dict] = []
    next_i = iter(range(n))
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECS)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        t0 = time.perf_counter()

        async def worker():
            for i in next_i:
                recs.append(await request(http, url, tenants[i % len(tenants)], i, max_tokens, False, t0))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return recs
