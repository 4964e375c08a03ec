#!/usr/bin/env python3
"""Data-plane overhead of poimen-gateway, side by side with nginx, haproxy,
a bare Pingora proxy, the LLM routers a user would otherwise pick (vllm-router,
sglang-router) and no proxy at all, in one run with interleaved rounds.
Entry point: run.sh.

Parts (all on 127.0.0.1, every process started here is stopped at the end):
  1. saturated: wrk (2 threads, 32 connections, chat.lua: ~2 KB chat bodies,
     "model" last, 64 keys in each target's key header: X-Poimen-Cache-Key,
     or X-Session-Id for vllm-router, X-SMG-Routing-Key for sglang-router)
     for DURATION s per round, ROUNDS rounds x {direct, nginx, haproxy,
     gateway, gateway-quiet, gateway-steal, pingora-bare, pingora-read,
     pingora-timeouts, pingora-body, vllm-router, sglang-router}
     (--targets picks some; direct and nginx are always measured, as the
     references); backends: one nginx (1 worker) answering a fixed
     chat-completion JSON on 4 ports.
     Reports req/s, p50/p99 latency and the proxy's CPU us per request
     (utime+stime from /proc/<pid>/stat over the run / requests completed).
  2. paced: wrk + paced.lua (delay()) at ~RATE req/s, latency vs direct.
  3. SSE: vllm-sim x4 with --time-scale 0 streaming; time to first byte
     (first SSE event) direct vs nginx (vs haproxy) vs gateway, sequential
     requests.
  4. RSS: a fresh gateway idle, then with STREAMS open SSE streams through it
     to 4 slow vllm-sim instances.
Parts 3 and 4 run when `gateway` is among the targets (and --sse-rounds /
--streams are not 0).

Two options add gateway rows to the saturated and paced parts, to compare
builds or configs in one run with interleaved rounds (e.g.
bench/results/overhead-features.md):
  --gateway-bin NAME=DIR (repeatable): a row NAME, configured and logging as
     `gateway`, running DIR/poimen-gateway (another build, e.g. an older
     commit's target/release).
  --tenants: a row `gateway-tenants`, `gateway` plus `gateway.tenants`
     (header X-Tenant; a: weight 2, requests_per_minute 100000000; b), and
     wrk sends X-Tenant a and b alternating (chat.lua's 5th argument).
  --prefix-index: a row `gateway-index`, `gateway` plus
     `routing.prefix_index: {cache_tokens: 1048576}` (routing by cost).
  --tracing: rows `gateway-trace-1` and `gateway-trace-0.01`, `gateway` plus
     `gateway.tracing` at sample_ratio 1.0 and 0.01, exporting to an OTLP/HTTP
     sink in this process (it answers every export with an empty success and
     counts posts and bytes). The routers come from the venv bench/setup.sh makes
(bench/.venv, or POIMEN_BENCH_VENV).
Writes bench/results/overhead.md (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common as C  # noqa: E402

HERE = Path(__file__).resolve().parent
FAKE_MODEL = "bench-model"
FAST_MODEL = "sim-fast"
SLOW_MODEL = "sim-slow"
KEY_HEADER = "X-Poimen-Cache-Key"  # the session key header of nginx, the gateway and pingora-bare
TENANT_HEADER = "X-Tenant"  # --tenants: the header gateway-tenants reads the tenant from
TRACE_ROWS = {"gateway-trace-1": 1.0, "gateway-trace-0.01": 0.01}  # --tracing: row -> sample_ratio

GATEWAYS = ("gateway", "gateway-quiet", "gateway-steal")
# The LLM routers under comparison, from PyPI (pinned in bench/setup.sh): the
# console script in the venv, the policy that routes by a session key, and
# the header that policy reads the key from.
ROUTERS = {
    "vllm-router": {"dist": "vllm-router", "policy": "consistent_hash",
                    "header": C.ROUTER_KEY_HEADERS["vllm-router"]},
    "sglang-router": {"dist": "sglang-router", "policy": "manual",
                      "header": C.ROUTER_KEY_HEADERS["sglang-router"]},
}
# pingora-bare plus, one by one, the body read, the peer's timeouts and two
# response headers: what any model router on Pingora needs, without the
# gateway's policy (pingora-baseline/src/main.rs).
BAREBONES = {"pingora-bare": [], "pingora-read": ["--read"], "pingora-timeouts": ["--read", "--timeouts"],
             "pingora-body": ["--body"]}
ALL_TARGETS = ("direct", "nginx", "haproxy") + GATEWAYS + tuple(BAREBONES) + tuple(ROUTERS)

FAKE_BODY = ('{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,'
             '"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant",'
             '"content":" tok tok tok tok tok tok tok tok tok tok tok tok tok tok tok tok"},'
             '"logprobs":null,"finish_reason":"length","stop_reason":null}],'
             '"usage":{"prompt_tokens":512,"total_tokens":528,"completion_tokens":16,'
             '"prompt_tokens_details":{"cached_tokens":496}}}')


# --------------------------------------------------------------------------
# nginx configs


def nginx_common(wd: Path, name: str, workers: int) -> str:
    user = "user root;\n" if os.geteuid() == 0 else ""
    tmp = wd / f"{name}-tmp"
    tmp.mkdir(exist_ok=True)
    return f"""{user}worker_processes {workers};
daemon off;
pid {wd}/{name}.pid;
error_log {wd}/{name}-error.log warn;
worker_rlimit_nofile 65536;
events {{ worker_connections 16384; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
"""


def backends_conf(wd: Path, ports: list[int]) -> Path:
    """Every path answers the fixed chat completion, except what vLLM answers
    otherwise to the routers' start-up probes: GET /health (200, empty),
    GET /v1/models, and 404 for SGLang's /server_info, /model_info and their
    /get_ forms (sglang-router asks for them; vLLM has none). POST
    /v1/completions answers a completion whose text is the backend's port:
    the key-affinity check before the runs reads which backend served a key."""
    models = ('{"object":"list","data":[{"id":"' + FAKE_MODEL + '","object":"model","created":1700000000,'
              '"owned_by":"vllm","max_model_len":32768}]}')
    which = ('{"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"' + FAKE_MODEL + '",'
             '"choices":[{"index":0,"text":"$server_port","logprobs":null,"finish_reason":"length"}],'
             '"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1}}')
    # exact locations only: a regex location would be tried on every chat request
    info404 = "".join(f"    location = /{p} {{ return 404; }}\n"
                      for p in ("server_info", "model_info", "get_server_info", "get_model_info"))
    servers = "".join(f"""  server {{
    listen 127.0.0.1:{p} backlog=4096;
    location / {{
      default_type application/json;
      return 200 '{FAKE_BODY}';
    }}
    location = /health {{
      return 200;
    }}
    location = /v1/models {{
      default_type application/json;
      return 200 '{models}';
    }}
{info404}    location = /v1/completions {{
      default_type application/json;
      return 200 '{which}';
    }}
  }}
""" for p in ports)
    path = wd / "backends.conf"
    path.write_text(nginx_common(wd, "backends", 1) + servers + "}\n")
    return path


def proxy_conf(wd: Path, workers: int, port: int, backend_ports: list[int],
               sse_port: int, sim_ports: list[int]) -> Path:
    ups = "".join(f"    server 127.0.0.1:{p};\n" for p in backend_ports)
    sims = "".join(f"    server 127.0.0.1:{p};\n" for p in sim_ports)
    body = f"""  upstream fakes {{
    hash $http_x_poimen_cache_key consistent;
{ups}    keepalive 64;
    keepalive_requests 1000000;
  }}
  upstream sims {{
    hash $http_x_poimen_cache_key consistent;
{sims}    keepalive 64;
    keepalive_requests 1000000;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    client_max_body_size 32m;
    client_body_buffer_size 64k;
    location / {{
      proxy_pass http://fakes;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
  server {{
    listen 127.0.0.1:{sse_port} backlog=4096;
    client_max_body_size 32m;
    client_body_buffer_size 64k;
    location / {{
      proxy_pass http://sims;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""
    path = wd / "proxy.conf"
    path.write_text(nginx_common(wd, "proxy", workers) + body)
    return path


def haproxy_conf(wd: Path, threads: int, port: int, backend_ports: list[int],
                 sse_port: int, sim_ports: list[int]) -> Path:
    """haproxy set up as the nginx row: the key header hashed consistently
    over the same backends, keep-alive on both sides (idle server
    connections shared between clients), no logging (no `log` line), and a
    second frontend over the sims for the SSE part. Bodies stream through
    (no http-buffer-request) in buffers of 64 KB, nginx's
    client_body_buffer_size here; the timeouts are nginx's keepalive_timeout.
    maxconn 4096, not nginx's 16384 connections: haproxy wants two
    descriptors per connection and refuses to start when it cannot raise its
    limit that far (20,000 here)."""
    def backend(name: str, ports: list[int]) -> str:
        servers = "".join(f"  server {name}{i} 127.0.0.1:{p}\n" for i, p in enumerate(ports))
        return f"""backend {name}
  balance hdr({KEY_HEADER})
  hash-type consistent
  http-reuse always
{servers}"""
    conf = f"""global
  nbthread {threads}
  maxconn 4096
  tune.bufsize 65536
defaults
  mode http
  option http-keep-alive
  maxconn 4096
  timeout connect 5s
  timeout client 120s
  timeout server 120s
  timeout http-request 120s
  timeout http-keep-alive 120s
frontend chat
  bind 127.0.0.1:{port} backlog 4096
  default_backend fakes
frontend sse
  bind 127.0.0.1:{sse_port} backlog 4096
  default_backend sims
""" + backend("fakes", backend_ports) + backend("sims", sim_ports)
    path = wd / "haproxy.cfg"
    path.write_text(conf)
    return path


def baseline_bin(bins: Path) -> Path | None:
    """bench/overhead/pingora-baseline, built into the same target dir as the
    gateway (cargo build --release --manifest-path ...; a no-op when it is
    up to date, so a binary older than its source is never measured)."""
    b = bins / "pingora-baseline"
    env = dict(os.environ)
    if bins.name == "release":
        env["CARGO_TARGET_DIR"] = str(bins.parent)
    print("building bench/overhead/pingora-baseline (cargo build --release) ...", flush=True)
    r = subprocess.run(["cargo", "build", "--release", "--manifest-path", str(HERE / "pingora-baseline" / "Cargo.toml")],
                       env=env)
    return b if r.returncode == 0 and b.exists() else None


def start_bare(procs: C.Procs, name: str, bare: Path, target: str, port: int, threads: int,
               backends: list[int]):
    """pingora-baseline (`bare`, from baseline_bin) as row `target` of
    BAREBONES on `port`, in front of `backends`."""
    p = procs.start(name, [str(bare), f"127.0.0.1:{port}", str(threads), *BAREBONES[target]]
                    + [f"127.0.0.1:{b}" for b in backends])
    C.wait_port(port, proc=p)
    return p


def start_nginx(procs: C.Procs, name: str, conf: Path, port: int):
    chk = subprocess.run([C.nginx_bin(), "-t", "-c", str(conf)], capture_output=True, text=True)
    if chk.returncode != 0:
        raise RuntimeError(f"nginx -t {conf}: {chk.stderr}")
    p = procs.start(name, [C.nginx_bin(), "-c", str(conf)])
    C.wait_port(port, proc=p)
    return p


def start_haproxy(procs: C.Procs, conf: Path, port: int):
    """One haproxy process in the foreground (-db: no daemon, no master), so
    the bench's pid is the process that does the work and its CPU column is
    that process's."""
    chk = subprocess.run([C.haproxy_bin(), "-c", "-f", str(conf)], capture_output=True, text=True)
    if chk.returncode != 0:
        raise RuntimeError(f"haproxy -c -f {conf}: {chk.stdout}{chk.stderr}")
    p = procs.start("haproxy", [C.haproxy_bin(), "-db", "-f", str(conf)])
    C.wait_port(port, proc=p)
    return p


def start_router(procs: C.Procs, name: str, venv: Path, threads: int, port: int,
                 backend_ports: list[int]):
    """Starts a router row with its session-key policy (C.start_router:
    TOKIO_WORKER_THREADS=threads, RUST_LOG=warn, NO_COLOR=1) and waits for its
    first 200 on a chat request."""
    def ready(p: int) -> None:
        post(p, "/v1/chat/completions", chat_body(FAKE_MODEL, "bench-session-001", False, 16),
             ROUTERS[name]["header"], "bench-session-001")
    return C.start_router(procs, name, name, venv, threads, port, backend_ports, ROUTERS[name]["policy"], ready)


def post(port: int, path: str, body: bytes, header: str, key: str) -> bytes:
    """One POST; the body of a 200 answer (anything else raises)."""
    return C.http_post(port, path, body, {header: key})


def check_target(t: dict, n_backends: int) -> str:
    """Before any load: a chat request gets 200 and exactly the backends' body;
    and the target routes by its key header: 16 keys, each sent 3 times to
    POST /v1/completions (the backends answer it with their port), must each
    stay on one backend, and together reach more than one."""
    body = post(t["port"], "/v1/chat/completions", chat_body(FAKE_MODEL, "bench-session-001", False, 16),
                t["header"], "bench-session-001")
    if body.decode() != FAKE_BODY:
        raise RuntimeError(f"{t['name']}: the chat answer is not the backends' body: {body[:300]!r}")
    if t["name"] == "direct":
        return "one backend"
    seen: dict[str, set[str]] = {}
    prompt = json.dumps({"model": FAKE_MODEL, "prompt": "Which backend?", "max_tokens": 1}).encode()
    for _ in range(3):
        for k in range(16):
            key = f"bench-session-{k + 1:03d}"
            ans = json.loads(post(t["port"], "/v1/completions", prompt, t["header"], key))
            seen.setdefault(key, set()).add(ans["choices"][0]["text"])
    split = {k: v for k, v in seen.items() if len(v) > 1}
    used = set().union(*seen.values())
    if split or len(used) < 2:
        raise RuntimeError(f"{t['name']}: no key affinity on {t['header']}: keys split {split}, "
                           f"backends used {sorted(used)}")
    return f"every key on one backend, {len(used)} of {n_backends} backends used"


def thread_ticks(pid: int) -> dict[str, tuple[str, int]]:
    """Thread id -> (name, utime+stime in clock ticks) of every thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2:].split()
        out[tid] = (name, int(f[11]) + int(f[12]))
    return out


def thread_use(before: dict, after: dict) -> str:
    """The threads by name, each with its share of the process's CPU between
    the two samples, e.g. '1 `tokio-rt-worker` (100%), 1 `vllm::router` (0%)'."""
    count: dict[str, int] = {}
    used: dict[str, int] = {}
    for tid, (name, ticks) in after.items():
        count[name] = count.get(name, 0) + 1
        used[name] = used.get(name, 0) + ticks - before.get(tid, (name, 0))[1]
    total = max(1, sum(used.values()))
    return ", ".join(f"{count[n]} `{n}` ({100 * used[n] / total:.0f}%)" for n in sorted(count))


# --------------------------------------------------------------------------
# wrk


# chat.lua's body size (--body-kb): the repetitions of its 73-byte filler.
WRK_ENV = dict(os.environ)


def run_wrk(port: int, script: str, conns: int, duration: float, delay_ms: int = 0,
            header: str = KEY_HEADER, tenant_header: str | None = None) -> dict:
    argv = ["wrk", "-t2", f"-c{conns}", f"-d{duration:g}s", "--timeout", "5s", "-s", str(HERE / script),
            f"http://127.0.0.1:{port}", "--", FAKE_MODEL, "64", str(delay_ms), header]
    if tenant_header:
        argv.append(tenant_header)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60, env=WRK_ENV)
    m = re.search(r"^POIMEN_JSON (\{.*\})$", r.stdout, re.M)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed ({r.returncode}): {r.stdout}\n{r.stderr}")
    d = json.loads(m.group(1))
    d["rps"] = d["requests"] / (d["duration_us"] / 1e6)
    d["errors"] = sum(d[k] for k in ("err_connect", "err_read", "err_write", "err_status", "err_timeout"))
    d["argv"] = argv
    return d


def measure(target: dict, backends_pid: int, script: str, conns: int, duration: float,
            delay_ms: int = 0) -> dict:
    """One wrk run against target, with the CPU time the proxy (and the
    backends, and wrk) used over it."""
    proxy_pid = target["pid"]
    p0 = C.tree_cpu_us(proxy_pid)
    b0 = C.tree_cpu_us(backends_pid)
    w0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    s0 = C.system_busy_us()
    d = run_wrk(target["port"], script, conns, duration, delay_ms, target["header"], target.get("tenant_header"))
    w1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    s1 = C.system_busy_us()
    p1 = C.tree_cpu_us(proxy_pid)
    b1 = C.tree_cpu_us(backends_pid)
    time.sleep(1.0)  # a pause between runs: connections closed, sockets settled
    n = max(1, d["requests"])
    d["proxy_cpu_us_per_req"] = (p1 - p0) / n
    d["proxy_cpu_cores"] = (p1 - p0) / d["duration_us"]
    d["backend_cpu_us_per_req"] = (b1 - b0) / n
    wrk_us = ((w1.ru_utime + w1.ru_stime) - (w0.ru_utime + w0.ru_stime)) * 1e6
    d["wrk_cpu_us_per_req"] = wrk_us / n
    ours = wrk_us + (b1 - b0) + (0 if proxy_pid == backends_pid else p1 - p0)
    # CPU used by processes this bench did not start (other work on the machine), in cores
    d["foreign_cores"] = max(0.0, (s1 - s0) - ours) / d["duration_us"]
    return d


# --------------------------------------------------------------------------
# SSE time to first byte, and the 1,000-stream RSS test (aiohttp)


def chat_body(model: str, key: str, stream: bool, max_tokens: int) -> bytes:
    filler = "The agent keeps notes on the repository, the failing test and the plan. " * 24
    return json.dumps({
        "messages": [{"role": "system", "content": "You are a coding agent. " + filler},
                     {"role": "user", "content": f"Summarise what {key} did last."}],
        "max_tokens": max_tokens, "stream": stream, "model": model,
    }).encode()


async def sse_round(port: int, n: int) -> dict:
    import aiohttp
    bodies = [(f"bench-session-{k:03d}", chat_body(FAST_MODEL, f"bench-session-{k:03d}", True, 16))
              for k in range(64)]
    ttfb, first_tok, total, bad = [], [], [], 0
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    conn = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=conn) as s:
        for i in range(n + 20):  # 20 unmeasured to warm the connection
            key, body = bodies[i % 64]
            t0 = time.perf_counter()
            t_first = t_tok = None
            async with s.post(url, data=body, headers={"Content-Type": "application/json",
                                                       "X-Poimen-Cache-Key": key}) as r:
                async for line in r.content:
                    if not line.startswith(b"data:"):
                        continue
                    now = time.perf_counter()
                    if t_first is None:
                        t_first = now
                    if t_tok is None and b'"content":" tok"' in line:
                        t_tok = now
                t_end = time.perf_counter()
                ok = r.status == 200 and t_tok is not None
            if i < 20:
                continue
            if not ok:
                bad += 1
                continue
            ttfb.append((t_first - t0) * 1e6)
            first_tok.append((t_tok - t0) * 1e6)
            total.append((t_end - t0) * 1e6)
    return {"n": len(ttfb), "bad": bad,
            "ttfb_p50": C.pct(ttfb, 50), "ttfb_p99": C.pct(ttfb, 99),
            "tok_p50": C.pct(first_tok, 50), "tok_p99": C.pct(first_tok, 99),
            "total_p50": C.pct(total, 50), "total_p99": C.pct(total, 99)}


async def hold_streams(port: int, gw_pid: int, n: int, max_tokens: int) -> dict:
    """Opens n SSE streams through the gateway, waits until every one has its
    first event, samples the gateway's RSS, then closes them all."""
    import aiohttp
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    started = 0
    all_started = asyncio.Event()
    release = asyncio.Event()
    statuses: dict[int, int] = {}
    errors: list[str] = []
    events = [0]

    async def one(s, i):
        nonlocal started
        key = f"stream-{i:04d}"
        body = chat_body(SLOW_MODEL, key, True, max_tokens)
        try:
            async with s.post(url, data=body, headers={"Content-Type": "application/json",
                                                       "X-Poimen-Cache-Key": key}) as r:
                statuses[r.status] = statuses.get(r.status, 0) + 1
                got_first = False
                async for line in r.content:
                    if line.startswith(b"data:"):
                        events[0] += 1
                        if not got_first:
                            got_first = True
                            started += 1
                            if started == n:
                                all_started.set()
                        if release.is_set():
                            break
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one(s, i)) for i in range(n)]
        try:
            await asyncio.wait_for(all_started.wait(), timeout=60)
        except asyncio.TimeoutError:
            pass
        t_open = time.perf_counter() - t0
        samples = await C.rss_samples(gw_pid, 5, 0.5)
        threads = C.threads_of(gw_pid)
        open_streams = started
        release.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"open": open_streams, "open_secs": t_open, "rss_kib": samples, "statuses": statuses,
            "errors": errors[:5], "n_errors": len(errors), "threads": threads,
            "events_seen": events[0]}


# --------------------------------------------------------------------------


def extra_rows(a) -> dict[str, str]:
    """--gateway-bin rows: name -> the bin dir as given."""
    return dict(spec.partition("=")[::2] for spec in a.gateway_bin)


def fmt_ms(us: float) -> str:
    return f"{us / 1000:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per saturated round")
    ap.add_argument("--threads", type=int, default=1,
                    help="nginx worker_processes = haproxy nbthread = gateway threads = routers' TOKIO_WORKER_THREADS")
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--paced-rounds", type=int, default=3)
    ap.add_argument("--paced-duration", type=float, default=10.0)
    ap.add_argument("--paced-conns", type=int, default=10)
    ap.add_argument("--paced-delay-ms", type=int, default=20,
                    help="per-connection pause; 10 conns x 1000/20 ms = ~500 req/s")
    ap.add_argument("--sse-rounds", type=int, default=3)
    ap.add_argument("--sse-requests", type=int, default=1000, help="per target per round")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--out", default=str(C.RESULTS / "overhead.md"))
    ap.add_argument("--targets", default=",".join(ALL_TARGETS),
                    help="comma-separated rows to measure, of: " + ", ".join(ALL_TARGETS) +
                    " (direct and nginx are always measured: the other rows are compared with them)")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the bare Pingora proxies (" + ", ".join(BAREBONES) + ")")
    ap.add_argument("--gateway-bin", action="append", default=[], metavar="NAME=DIR",
                    help="also a row NAME: `gateway` run from DIR/poimen-gateway (repeatable)")
    ap.add_argument("--tenants", action="store_true",
                    help="also a row gateway-tenants: `gateway` with tenants a and b named by X-Tenant")
    ap.add_argument("--prefix-index", action="store_true",
                    help="also a row gateway-index: `gateway` routing by cost over a prefix index")
    ap.add_argument("--tracing", action="store_true",
                    help="also rows " + ", ".join(TRACE_ROWS) + ": `gateway` with tracing at those sample ratios")
    ap.add_argument("--body-kb", type=float, default=0,
                    help="chat bodies of about this many KB instead of ~2 KB (saturated and paced parts)")
    ap.add_argument("--backends", type=int, default=4,
                    help="adds rows gateway-N (and gateway-index-N) routing over N fake backends, beside the "
                         "usual 4: what routing costs per backend")
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    if a.body_kb:
        WRK_ENV["POIMEN_FILLER_REPS"] = str(max(1, round(a.body_kb * 1024 / 73)))
        # The backends' usage as a vLLM would report it for such a prompt
        # (four bytes a token, all but the last 16 cached), so that the
        # gateway's prefix index is not told its estimate is wrong.
        global FAKE_BODY
        tokens = round(a.body_kb * 1024 / 4)
        FAKE_BODY = (FAKE_BODY.replace('"prompt_tokens":512,"total_tokens":528',
                                       f'"prompt_tokens":{tokens},"total_tokens":{tokens + 16}')
                     .replace('"cached_tokens":496', f'"cached_tokens":{tokens - 16}'))
    extra_bins = {}  # row name -> bin dir
    for spec in a.gateway_bin:
        name, sep, d = spec.partition("=")
        if not sep or not name or name in ALL_TARGETS or name in ("gateway-tenants", "gateway-index") \
                or name in TRACE_ROWS:
            ap.error(f"--gateway-bin {spec}: want NAME=DIR, NAME not one of the known rows")
        if not (Path(d) / "poimen-gateway").exists():
            ap.error(f"--gateway-bin {spec}: no {Path(d) / 'poimen-gateway'}")
        extra_bins[name] = Path(d).resolve()
    chosen = {n.strip() for n in a.targets.split(",") if n.strip()}
    if chosen - set(ALL_TARGETS):
        ap.error(f"unknown targets {', '.join(sorted(chosen - set(ALL_TARGETS)))}; known: {', '.join(ALL_TARGETS)}")
    if a.no_baseline:
        chosen -= set(BAREBONES)
    chosen |= {"direct", "nginx"}
    a.targets = [n for n in ALL_TARGETS if n in chosen]

    C.signals_raise()
    C.raise_nofile()
    C.need_tools("wrk", "nginx", *(["haproxy"] if "haproxy" in chosen else []))
    venv = C.bench_venv()
    for name in ROUTERS:
        if name in chosen and not (venv / "bin" / name).exists():
            sys.exit(f"{venv / 'bin' / name} missing: run bash bench/setup.sh (or leave {name} out of --targets)")
    # the Rust binaries only for the gateway rows (and vllm-sim for SSE/RSS) and the bare proxies
    with_gateway = "gateway" in chosen
    bins = C.bin_dir() if chosen & {*GATEWAYS, *BAREBONES} or a.tenants or a.prefix_index or a.tracing else None
    sse_on = with_gateway and a.sse_rounds > 0
    rss_on = with_gateway and a.streams > 0
    t_start = time.time()
    with C.bench_run("overhead", a.keep_logs) as (wd, procs):
        T = a.threads
        # --backends N: the one nginx listens on N ports; the usual rows use
        # the first 4, rows named `-N` all N, in the same interleaved rounds.
        all_ports = [C.free_port() for _ in range(max(4, a.backends))]
        fake_ports = all_ports[:4]
        sim_ports = [C.free_port() for _ in range(4)]
        proxy_port, proxy_sse_port = C.free_port(), C.free_port()
        hap_port, hap_sse_port = C.free_port(), C.free_port()

        backends = start_nginx(procs, "backends", backends_conf(wd, all_ports), all_ports[-1])
        if sse_on:
            for i, p in enumerate(sim_ports):
                C.start_sim(procs, bins, f"sim-fast-{i}", p, "--time-scale", "0", "--max-num-seqs", "256",
                            "--kv-cache-tokens", "1048576", model=FAST_MODEL)
        proxy = start_nginx(procs, "proxy", proxy_conf(wd, T, proxy_port, fake_ports, proxy_sse_port, sim_ports),
                            proxy_sse_port)
        hap = start_haproxy(procs, haproxy_conf(wd, T, hap_port, fake_ports, hap_sse_port, sim_ports),
                            hap_port) if "haproxy" in chosen else None
        def models_on(ports: list[int]) -> list[dict]:
            return [{"name": FAKE_MODEL, "addresses": [f"127.0.0.1:{p}" for p in ports]},
                    {"name": FAST_MODEL, "addresses": [f"127.0.0.1:{p}" for p in sim_ports]}]
        sched = {"max_num_seqs": 4096, "max_queue_depth": 0}  # 4096 is the largest allowed; 32 connections never reach it
        # Default failure_exclusion_secs (30). Before commit 2950572 the end of every
        # wrk run (wrk closes connections with requests in flight) excluded all 4
        # backends for 30 s; the integration test failover::a_client_leaving_before_the_answer_is_not_a_backend_failure guards it, and the
        # report shows the gateways' failure counters.
        gateways = {}  # name -> (process, port, metrics port)
        tenants = {"header": TENANT_HEADER,
                   "list": [{"name": "a", "weight": 2, "requests_per_minute": 100_000_000}, {"name": "b"}]}
        index = {"routing": {"prefix_index": {"cache_tokens": 1 << 20}}}
        rows = [("gateway", "info", False, bins, {}), ("gateway-quiet", "warn", False, bins, {}),
                ("gateway-steal", "info", True, bins, {})]
        rows = [r for r in rows if r[0] in chosen] + [(n, "info", False, d, {}) for n, d in extra_bins.items()]
        if a.tenants:
            rows.append(("gateway-tenants", "info", False, bins, {"tenants": tenants}))
        if a.prefix_index:
            rows.append(("gateway-index", "info", False, bins, index))
        if a.backends != 4:
            rows.append((f"gateway-{a.backends}", "info", False, bins, {}))
            if a.prefix_index:
                rows.append((f"gateway-index-{a.backends}", "info", False, bins, index))
        sink = OtlpSink() if a.tracing else None
        for name, ratio in TRACE_ROWS.items() if sink else ():
            tracing = {"otlp_endpoint": sink.endpoint, "sample_ratio": ratio}
            rows.append((name, "info", False, bins, {"tracing": tracing}))
        for name, rust_log, work_stealing, gw_bins, extra in rows:
            port, mport = C.free_port(), C.free_port()
            ports = all_ports if name.endswith(f"-{a.backends}") and a.backends != 4 else fake_ports
            cfg = C.gateway_yaml(wd, name, port, mport, models_on(ports), threads=T, scheduler=sched,
                                 extra={"stream_usage": True, **extra}, work_stealing=work_stealing)
            gateways[name] = (C.start_gateway(procs, gw_bins, name, cfg, port, rust_log=rust_log), port, mport)

        targets = [
            {"name": "direct", "port": fake_ports[0], "pid": backends.pid},
            {"name": "nginx", "port": proxy_port, "pid": proxy.pid},
        ] + ([{"name": "haproxy", "port": hap_port, "pid": hap.pid}] if hap else []) \
          + [{"name": name, "port": port, "pid": p.pid} for name, (p, port, _) in gateways.items()]
        for t in targets:
            if t["name"] == "gateway-tenants":
                t["tenant_header"] = TENANT_HEADER
        bb = baseline_bin(bins) if chosen & set(BAREBONES) else None
        for name in BAREBONES:
            if name in chosen:
                bare_port = C.free_port()
                bare = start_bare(procs, name, bb, name, bare_port, T, fake_ports)
                targets.append({"name": name, "port": bare_port, "pid": bare.pid})
        for name in ROUTERS:
            if name in chosen:
                port = C.free_port()
                p = start_router(procs, name, venv, T, port, fake_ports)
                targets.append({"name": name, "port": port, "pid": p.pid, "header": ROUTERS[name]["header"],
                                "version": C.router_version(venv, ROUTERS[name]["dist"])})
        for t in targets:
            t.setdefault("header", KEY_HEADER)
        # sanity: every target answers 200 with the backends' body and keeps a key
        # on one backend; then a short wrk run without errors
        for t in targets:
            t["check"] = check_target(t, len(all_ports) if t["name"].endswith(f"-{a.backends}") else 4)
            print(f"  {t['name']}: {t['check']}", flush=True)
            d = run_wrk(t["port"], "chat.lua", 2, 1, 0, t["header"], t.get("tenant_header"))
            if d["errors"] or d["requests"] == 0:
                raise RuntimeError(f"{t['name']}: sanity run had errors: {d}")
            time.sleep(1.0)

        # ---- 1. saturated, interleaved rounds
        print(f"saturated: {a.rounds} rounds x {len(targets)} targets x {a.duration:g}s, "
              f"wrk -t2 -c{a.conns}; proxies with {T} worker/thread", flush=True)
        for t in targets:  # warm-up, not counted; which threads do the work
            before = thread_ticks(t["pid"])
            run_wrk(t["port"], "chat.lua", a.conns, 3, 0, t["header"], t.get("tenant_header"))
            t["threads"] = thread_use(before, thread_ticks(t["pid"]))
            if t["name"] not in ("direct", "nginx"):  # nginx: the master's threads only, idle
                print(f"  warm-up {t['name']}: threads (share of its CPU) {t['threads']}", flush=True)
            time.sleep(1.0)
        sat: dict[str, list[dict]] = {t["name"]: [] for t in targets}
        for r in range(a.rounds):
            order = targets if r % 2 == 0 else list(reversed(targets))
            for t in order:
                d = measure(t, backends.pid, "chat.lua", a.conns, a.duration)
                sat[t["name"]].append(d)
                print(f"  round {r + 1} {t['name']:14s} {d['rps']:9.0f} req/s  p50 {fmt_ms(d['p50_us'])} ms  "
                      f"p99 {fmt_ms(d['p99_us'])} ms  proxy {d['proxy_cpu_us_per_req']:.1f} us/req  "
                      f"errors {d['errors']}  other load {d['foreign_cores']:.2f} cores", flush=True)

        # ---- 2. paced
        paced_targets = [t for t in targets if t["name"] not in ("gateway-quiet", "gateway-steal")]
        width = max(len(t["name"]) for t in paced_targets)
        rate = a.paced_conns * 1000 / a.paced_delay_ms
        print(f"paced: ~{rate:.0f} req/s ({a.paced_conns} conns, delay {a.paced_delay_ms} ms), "
              f"{a.paced_rounds} rounds x {a.paced_duration:g}s", flush=True)
        paced: dict[str, list[dict]] = {t["name"]: [] for t in paced_targets}
        for r in range(a.paced_rounds):
            order = paced_targets if r % 2 == 0 else list(reversed(paced_targets))
            for t in order:
                d = measure(t, backends.pid, "paced.lua", a.paced_conns, a.paced_duration, a.paced_delay_ms)
                paced[t["name"]].append(d)
                print(f"  round {r + 1} {t['name']:{width}s} {d['rps']:6.0f} req/s  p50 {fmt_ms(d['p50_us'])} ms  "
                      f"p99 {fmt_ms(d['p99_us'])} ms  proxy {d['proxy_cpu_us_per_req']:.1f} us/req", flush=True)

        # ---- 3. SSE time to first byte (with the gateway only: it is the gateway's)
        sse_targets = [("direct", sim_ports[0]), ("nginx", proxy_sse_port)]
        if hap:
            sse_targets.append(("haproxy", hap_sse_port))
        if sse_on:
            sse_targets.append(("gateway", gateways["gateway"][1]))
            print(f"SSE: {a.sse_rounds} rounds x {a.sse_requests} sequential streams per target "
                  f"(vllm-sim --time-scale 0)", flush=True)
        sse: dict[str, list[dict]] = {n: [] for n, _ in sse_targets} if sse_on else {}
        for r in range(a.sse_rounds if sse_on else 0):
            order = sse_targets if r % 2 == 0 else list(reversed(sse_targets))
            for name, port in order:
                d = asyncio.run(sse_round(port, a.sse_requests))
                if d["bad"]:
                    raise RuntimeError(f"SSE {name}: {d['bad']} bad responses")
                sse[name].append(d)
                print(f"  round {r + 1} {name:8s} TTFB p50 {fmt_ms(d['ttfb_p50'])} ms  p99 {fmt_ms(d['ttfb_p99'])} ms"
                      f"  first token p50 {fmt_ms(d['tok_p50'])} ms", flush=True)

        failures = {}
        for name, (_, _, mport) in gateways.items():
            m = C.http_get(f"http://127.0.0.1:{mport}/metrics")
            failures[name] = (C.prom_values(m, "poimen_gateway_backend_failures_total"),
                              sum(v for k, v in prom_codes(m).items() if k == "503"))
            if name in TRACE_ROWS:
                a.trace_drops = getattr(a, "trace_drops", {})
                a.trace_drops[name] = C.prom_values(m, "poimen_gateway_trace_spans_dropped_total")
            if name == "gateway-tenants":  # the header named the tenants: requests by tenant label
                a.tenant_counts = {t: sum(float(line.rsplit(" ", 1)[1]) for line in m.splitlines()
                                          if line.startswith("poimen_gateway_tenant_requests_total{")
                                          and f'tenant="{t}"' in line) for t in ("a", "b", "default")}

        # ---- 4. RSS: a fresh gateway, idle, then with STREAMS open streams
        for p, _, _ in gateways.values():
            procs.stop(p)
        if sink:
            a.trace_sink = sink.stop()
        rss = rss_part(a, T, wd, procs, bins) if rss_on else None

        report = render(a, T, targets, sat, paced, sse, rss, bins, time.time() - t_start, failures)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(report)
        print()
        print(report)
        print(f"written to {a.out}")
        return 0


class OtlpSink:
    """An OTLP/HTTP collector that keeps nothing: every POST is read whole and
    answered 200 with an empty ExportTraceServiceResponse (an empty protobuf
    message), on a thread of this process; posts and bytes are counted."""

    def __init__(self) -> None:
        import http.server
        import threading

        counts = self.counts = {"posts": 0, "bytes": 0}

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                n = int(self.headers.get("content-length", 0))
                self.rfile.read(n)
                counts["posts"] += 1
                counts["bytes"] += n
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> tuple[int, int]:
        self.server.shutdown()
        return self.counts["posts"], self.counts["bytes"]


def rss_part(a, T: int, wd: Path, procs: C.Procs, bins: Path) -> dict:
    """A fresh gateway, idle, then with a.streams open streams to 4 slow sims."""
    slow_ports = [C.free_port() for _ in range(4)]
    for i, p in enumerate(slow_ports):
        C.start_sim(procs, bins, f"sim-slow-{i}", p, "--max-num-seqs", "2000",
                    "--decode-us-per-token", "100000", "--step-us-per-running-seq", "0",
                    "--kv-cache-tokens", "1048576", model=SLOW_MODEL)
    rss_port, rss_metrics = C.free_port(), C.free_port()
    cfg_rss = C.gateway_yaml(wd, "gateway-rss", rss_port, rss_metrics,
                             [{"name": SLOW_MODEL, "addresses": [f"127.0.0.1:{p}" for p in slow_ports],
                               "max_num_seqs": 2000}],
                             threads=T, scheduler={"max_num_seqs": 2000, "max_queue_depth": 0},
                             extra={"stream_usage": True})
    gw_rss = C.start_gateway(procs, bins, "gateway-rss", cfg_rss, rss_port)
    time.sleep(1.0)
    rss_idle = C.rss_kib(gw_rss.pid)
    print(f"RSS: fresh gateway idle {rss_idle / 1024:.1f} MiB; opening {a.streams} streams ...", flush=True)
    hold = asyncio.run(hold_streams(rss_port, gw_rss.pid, a.streams, 300))
    time.sleep(2.0)
    rss_after = C.rss_kib(gw_rss.pid)
    m_rss = C.http_get(f"http://127.0.0.1:{rss_metrics}/metrics")
    inflight_after = C.prom_values(m_rss, "poimen_gateway_in_flight")
    hold["failures"] = C.prom_values(m_rss, "poimen_gateway_backend_failures_total")
    print(f"  {hold['open']} streams open after {hold['open_secs']:.1f}s: RSS "
          f"{C.median(hold['rss_kib']) / 1024:.1f} MiB (samples {hold['rss_kib']}); after closing "
          f"{rss_after / 1024:.1f} MiB, inflight {inflight_after:g}; statuses {hold['statuses']}, "
          f"errors {hold['n_errors']}", flush=True)
    return {"idle": rss_idle, "hold": hold, "after": rss_after, "inflight_after": inflight_after}


def haproxy_version() -> str:
    """e.g. 2.6.12, from `HAProxy version 2.6.12-1+deb12u4 2026/10/17 - ...`."""
    out = subprocess.run([C.haproxy_bin(), "-v"], capture_output=True, text=True).stdout
    return out.split()[2].split("-")[0]


def prom_codes(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("poimen_gateway_requests_total{"):
            code = re.search(r'code="([^"]*)"', line).group(1)
            out[code] = out.get(code, 0) + float(line.rsplit(" ", 1)[1])
    return out


def render(a, T, targets, sat, paced, sse, rss, bins, elapsed, failures) -> str:
    med = lambda rows, k: C.median([r[k] for r in rows])  # noqa: E731
    S = {n: {k: med(rows, k) for k in ("rps", "p50_us", "p99_us", "proxy_cpu_us_per_req",
                                          "backend_cpu_us_per_req", "wrk_cpu_us_per_req", "proxy_cpu_cores",
                                          "foreign_cores")}
         for n, rows in sat.items()}
    errs = {n: sum(r["errors"] for r in rows) for n, rows in sat.items()}
    reqs = {n: sum(r["requests"] for r in rows) for n, rows in sat.items()}
    d, ng = S["direct"], S["nginx"]
    L = C.report_head("poimen-gateway data-plane overhead", bins,
                      "; wrk, proxy and backends all share the 2 cores")
    w = L.append
    by_name = {t["name"]: t for t in targets}
    routers = [n for n in ROUTERS if n in by_name]
    versions = "".join(f", {n} {by_name[n]['version']}" for n in routers)
    w(f"- nginx {subprocess.run([C.nginx_bin(), '-v'], capture_output=True, text=True).stderr.strip().split('/')[-1]}"
      f" (Debian), {f'haproxy {haproxy_version()} (Debian), ' if 'haproxy' in by_name else ''}"
      f"wrk {subprocess.run(['wrk', '-v'], capture_output=True, text=True).stdout.split()[1]} (Debian)"
      f"{versions}{' (PyPI, in the venv `bench/setup.sh` makes)' if routers else ''}")
    w(f"- proxies: **{T} worker/thread each** (nginx `worker_processes {T}`"
      f"{f', haproxy `nbthread {T}`' if 'haproxy' in by_name else ''}, gateway `threads: {T}`"
      f"{f', routers `TOKIO_WORKER_THREADS={T}`' if routers else ''})")
    args = " ".join(sys.argv[1:])
    w(f"- command: `bash bench/overhead/run.sh{(' ' + args) if args else ''}` (in effect: `--rounds {a.rounds} "
      f"--duration {a.duration:g} --threads {T} --targets {','.join(a.targets)}"
      f"{''.join(f' --gateway-bin {spec}' for spec in a.gateway_bin)}{' --tenants' if a.tenants else ''}{' --prefix-index' if a.prefix_index else ''}{f' --body-kb {a.body_kb:g}' if a.body_kb else ''}{' --tracing' if a.tracing else ''}{f' --backends {a.backends}' if a.backends != 4 else ''}`...); "
      f"total run time {elapsed / 60:.1f} min")
    w("")
    w("## Saturated throughput")
    w("")
    w(f"wrk `-t2 -c{a.conns} -d{a.duration:g}s -s bench/overhead/chat.lua` (POST /v1/chat/completions, "
      "~2 KB body with `\"model\"` last, 64 keys cycled in `X-Poimen-Cache-Key`"
      f"{', or in the header the router routes by' if routers else ''}); backends: 4 ports of one "
      "nginx (1 worker) returning a fixed 450-byte chat-completion JSON. "
      f"{a.rounds} rounds, targets interleaved (order reversed every other round); **medians over rounds**.")
    w("")
    w("| target | req/s | p50 ms | p99 ms | proxy CPU µs/req | req/s vs direct | req/s vs nginx | CPU/req vs nginx | errors |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sat:
        s = S[n]
        cpu_ratio = "—" if n == "direct" else f"{s['proxy_cpu_us_per_req'] / ng['proxy_cpu_us_per_req']:.2f}x"
        w(f"| {n} | {s['rps']:,.0f} | {fmt_ms(s['p50_us'])} | {fmt_ms(s['p99_us'])} | "
          f"{s['proxy_cpu_us_per_req']:.1f}{' (backend)' if n == 'direct' else ''} | "
          f"{s['rps'] / d['rps']:.2f} | {s['rps'] / ng['rps']:.2f} | {cpu_ratio} | {errs[n]} of {reqs[n]:,} |")
    w("")
    w("- `direct`: wrk to one backend port, no proxy (the limit); its CPU column is the backend nginx's.")
    w("- `nginx`: `upstream { hash $http_x_poimen_cache_key consistent; server ...x4; keepalive 64; }`, "
      "`proxy_http_version 1.1; proxy_set_header Connection \"\";`, `access_log off`, "
      "`keepalive_requests 1000000` (client side and upstream, so neither side reconnects every 1,000 requests).")
    if "haproxy" in sat:
        w(f"- `haproxy`: one process (`-db`), `nbthread {T}`, `mode http`, `balance hdr(X-Poimen-Cache-Key)`, "
          "`hash-type consistent` over the same 4 backends, `option http-keep-alive`, "
          "`http-reuse always` (idle server connections shared between clients), no logging, `tune.bufsize 65536`: "
          "bodies stream through in 64 KB buffers (no `http-buffer-request`; nginx here buffers a request body "
          "whole before sending it on), timeouts 120 s (nginx's `keepalive_timeout`), `maxconn 4096`. "
          "Also in the paced part, and in the SSE part (a second frontend over the sims) when that runs.")
    if "gateway" in sat:
        w("- `gateway`: poimen-gateway, the 4 backends under one model, `scheduler: {max_num_seqs: 4096 (the largest the config allows; 32 connections never reach it), "
          "max_queue_depth: 0}`, `stream_usage: true`, default logging (`RUST_LOG=info`: one JSON "
          "`prefix_cache` line per request to stderr, redirected to a file).")
    for n in sat:
        if n in extra_rows(a):
            w(f"- `{n}`: `gateway` (same config and logging) run from `{extra_rows(a)[n]}/poimen-gateway`.")
    if "gateway-index" in sat:
        w("- `gateway-index`: `gateway` plus `routing.prefix_index: {cache_tokens: 1048576}`: every keyed request's "
          "prompt cut into chained blocks, looked up in the index and recorded at its backend (routing by cost).")
    for n in (f"gateway-{a.backends}", f"gateway-index-{a.backends}"):
        if n in sat and a.backends != 4:
            w(f"- `{n}`: `{n.rsplit('-', 1)[0]}` with {a.backends} backends (ports of the same nginx) under the "
              "model instead of 4: what routing costs per backend. The 64 keys reach at most 64 of them.")
    if "gateway-tenants" in sat:
        w(f"- `gateway-tenants`: `gateway` plus `gateway.tenants: {{header: {TENANT_HEADER}, list: [{{name: a, weight: 2, "
          f"requests_per_minute: 100000000}}, {{name: b}}]}}`; wrk sends `{TENANT_HEADER}: a` and `b` alternating "
          "(the other rows get no tenant header: every request is tenant `default`). Its "
          "`poimen_gateway_tenant_requests_total` over the run: "
          + ", ".join(f"{t} {v:,.0f}" for t, v in getattr(a, "tenant_counts", {}).items()) + ".")
    if any(n in sat for n in TRACE_ROWS):
        posts, size = getattr(a, "trace_sink", (0, 0))
        drops = getattr(a, "trace_drops", {})
        w("- " + ", ".join(f"`{n}`" for n in TRACE_ROWS) + ": `gateway` plus `gateway.tracing: {otlp_endpoint, "
          "sample_ratio}` at 1.0 and 0.01: one span per request, exported over OTLP/HTTP (protobuf, batches of up "
          "to 512) to a sink in the bench process that answers each export with an empty success. The sink took "
          f"{posts:,} exports, {size / 1e6:,.1f} MB; spans dropped (`poimen_gateway_trace_spans_dropped_total`): "
          + ", ".join(f"{n} {v:,.0f}" for n, v in drops.items()) + ".")
    if "gateway-quiet" in sat:
        w("- `gateway-quiet`: the same with `RUST_LOG=warn` (no per-request log line), to show what the log line costs.")
    if "gateway-steal" in sat:
        w("- `gateway-steal`: `gateway` on tokio's work-stealing runtime (`work_stealing: true`, Pingora's default) "
          "instead of the no-steal runtime the shipped configuration selects, to show what that choice saves.")
    if "pingora-bare" in sat:
        w(f"- `pingora-bare`: `bench/overhead/pingora-baseline`, the least a Pingora proxy does (same Pingora 0.9.1 "
          f"and features, `threads: {T}`): `upstream_peer` hashes `X-Poimen-Cache-Key` over the 4 backends, the "
          "body streams through, no body read before routing, no admission, accounting, metrics or logging. "
          "The floor under the gateway: gateway − pingora-bare = what the gateway's own work costs.")
    if "pingora-read" in sat:
        w("- `pingora-read`: the same binary with `--read`: the body read whole, `model` found in it and the body "
          "forwarded, as in `pingora-body` below, without its timeouts and headers.")
    if "pingora-timeouts" in sat:
        w("- `pingora-timeouts`: `--read --timeouts`: also the peer's connect and read timeouts.")
    if "pingora-body" in sat:
        w("- `pingora-body`: the same binary with `--body`: what any model router on Pingora does before its "
          "policy, done as the gateway does it: the body read whole in `request_filter` and `model` found in it "
          "(serde_json), the body forwarded from `request_body_filter` (the gateway's patched pingora-proxy), "
          "connect and read timeouts on the peer, `X-Poimen-Backend` and `X-Poimen-Route` added to the response. "
          "gateway-quiet − pingora-body = the gateway's routing, admission, accounting and metrics.")
    if "vllm-router" in sat:
        t = by_name["vllm-router"]
        w(f"- `vllm-router`: vllm-router {t['version']} from PyPI (the vLLM project's router: Rust, axum and hyper "
          "on tokio, started by a Python launcher): `--worker-urls` the 4 backends, `--policy consistent_hash`, "
          "the key in `X-Session-Id`; everything else at its defaults (retries, circuit breaker, `/health` checks "
          "every 60 s, `--max-concurrent-requests 32768` with its queue, Prometheus metrics, here on a loopback "
          "port). Logging: `--log-level warning` and `RUST_LOG=warn`: 0.1.17 does not apply `warning` (it still "
          "writes 3 INFO lines per request from `consistent_hash`), `RUST_LOG=warn` silences them. No flag sets "
          f"its worker threads; it builds tokio's multi-thread runtime without a count, so `TOKIO_WORKER_THREADS={T}` "
          f"does. Its threads (share of its CPU during the warm-up): {t['threads']}; the launcher's "
          "thread only starts the router.")
    if "sglang-router" in sat:
        t = by_name["sglang-router"]
        w(f"- `sglang-router`: sglang-router {t['version']} from PyPI (`sglang-router launch`, the SGLang Model "
          "Gateway: Rust, axum and hyper on tokio, started by a Python launcher): `--worker-urls` the 4 backends, "
          "`--policy manual`, the key in `X-SMG-Routing-Key` (a new key goes to a random backend, the default "
          "`--assignment-mode random`, and stays there); everything else at its defaults (retries, circuit "
          "breaker, health checks, no concurrency limit, Prometheus metrics, here on a loopback port); "
          "`--log-level warn` and `RUST_LOG=warn`; `--shutdown-grace-period-secs 1` (stopping it takes 1 s, "
          "not 180). At start it probes each backend (`/health`, an HTTP/2 preface, `/server_info`, "
          "`/model_info` and their `/get_` forms: the fake backends answer 404 to those, as vLLM does). "
          f"Worker threads as for vllm-router: `TOKIO_WORKER_THREADS={T}`. Its threads (share of its CPU during "
          f"the warm-up): {t['threads']}.")
    if failures:
        fails = ", ".join(f"{n}: {f:g} backend failures, {c:g} 503s" for n, (f, c) in failures.items())
        w("- client disconnects: wrk closes its connections with requests in flight when a run ends. Before commit "
          "2950572 the gateway counted each such disconnect as a backend failure, excluded the backend for 30 s and "
          "retried the abandoned request on the next one, so after the first run all 4 backends were excluded and "
          "every request got 503 `no_backend` (the integration test `failover::a_client_leaving_before_the_answer_is_not_a_backend_failure` guards it). "
          f"Gateway counters over this whole run: {fails}.")
    w("- checked before the runs: every target answers a chat request with 200 and exactly the backends' body; "
      "key affinity (16 keys, each sent 3 times in the target's key header to `POST /v1/completions`, which the "
      "backends answer with their port): " + "; ".join(f"{t['name']}: {t['check']}" for t in targets[1:]) + ".")
    w("- errors: wrk's count (connect, read, write, timeout, and answers with status ≥ 400) over all rounds.")
    w("- CPU µs/req = (utime+stime of the proxy's processes from /proc/<pid>/stat after the run − before) / "
      "requests completed; nginx = master + worker; haproxy = its one process (all threads); "
      "a router = its one process (launcher and router, all threads).")
    w("")
    gws = [n for n in sat if n.startswith("gateway") or n in extra_rows(a)]
    if "pingora-bare" in sat and "gateway" in sat and len(gws) > 1:
        pb = S["pingora-bare"]
        w("Gateway rows against `pingora-bare` (ratios of the medians) and against `gateway` (median over rounds "
          "of the ratio within a round, the rows of a round run back to back):")
        w("")
        w("| target | CPU µs/req | CPU/req vs pingora-bare | req/s | req/s vs pingora-bare | "
          "CPU/req vs gateway, per round | req/s vs gateway, per round |")
        w("|---|---:|---:|---:|---:|---:|---:|")
        for n in gws:
            s = S[n]
            pair = lambda k: C.median([x[k] / g[k] for x, g in zip(sat[n], sat["gateway"])])  # noqa: E731
            w(f"| {n} | {s['proxy_cpu_us_per_req']:.1f} | {s['proxy_cpu_us_per_req'] / pb['proxy_cpu_us_per_req']:.2f}x | "
              f"{s['rps']:,.0f} | {s['rps'] / pb['rps']:.2f} | {pair('proxy_cpu_us_per_req'):.3f}x | "
              f"{pair('rps'):.3f} |")
        w("")
    w("Why the gateway costs what it costs (perf and strace, `bench/overhead/profile.py`): "
      "[overhead-analysis.md](overhead-analysis.md).")
    w("")
    w("Where the CPU goes (medians, µs per request):")
    w("")
    w("| target | proxy | backends | wrk | proxy cores busy | other processes on the machine (cores) |")
    w("|---|---:|---:|---:|---:|---:|")
    for n in sat:
        s = S[n]
        pc = "—" if n == "direct" else f"{s['proxy_cpu_us_per_req']:.1f}"
        cores = "—" if n == "direct" else f"{s['proxy_cpu_cores']:.2f}"
        w(f"| {n} | {pc} | {s['backend_cpu_us_per_req']:.1f} | {s['wrk_cpu_us_per_req']:.1f} | {cores} | "
          f"{s['foreign_cores']:.2f} |")
    w("")
    w("Per round (req/s; proxy CPU µs/req; CPU used meanwhile by processes this bench did not start, in cores "
      "— other work on the shared machine):")
    w("")
    w("| target | " + " | ".join(f"round {i + 1}" for i in range(a.rounds)) + " |")
    w("|---|" + "---:|" * a.rounds)
    for n, rows in sat.items():
        w(f"| {n} | " + " | ".join(f"{r['rps']:,.0f}; {r['proxy_cpu_us_per_req']:.1f}; {r['foreign_cores']:.2f}"
                                   for r in rows) + " |")
    w("")

    P = {n: {k: med(rows, k) for k in ("rps", "p50_us", "p99_us", "proxy_cpu_us_per_req")}
         for n, rows in paced.items()} if a.paced_rounds else {}
    if P:
        w("## Paced latency (added latency at a fixed rate)")
        w("")
        w(f"wrk `-t2 -c{a.paced_conns} -d{a.paced_duration:g}s -s bench/overhead/paced.lua -- bench-model 64 "
          f"{a.paced_delay_ms}`: each connection waits {a.paced_delay_ms} ms after a response before its next "
          f"request (wrk's Lua `delay()`; wrk2 is not in Debian), i.e. ~{a.paced_conns * 1000 / a.paced_delay_ms:.0f} "
          f"req/s offered{'; the routers get their key header as a 4th script argument' if routers else ''}. "
          f"{a.paced_rounds} rounds interleaved; medians.")
        w("")
        w("| target | achieved req/s | p50 ms | p99 ms | added p50 vs direct | added p99 vs direct | proxy CPU µs/req |")
        w("|---|---:|---:|---:|---:|---:|---:|")
        for n in paced:
            s = P[n]
            add50 = "—" if n == "direct" else f"+{(s['p50_us'] - P['direct']['p50_us']):.0f} µs"
            add99 = "—" if n == "direct" else f"+{(s['p99_us'] - P['direct']['p99_us']):.0f} µs"
            w(f"| {n} | {s['rps']:.0f} | {fmt_ms(s['p50_us'])} | {fmt_ms(s['p99_us'])} | {add50} | {add99} | "
              f"{s['proxy_cpu_us_per_req']:.1f}{' (backend)' if n == 'direct' else ''} |")
        w("")

    if sse:
        Q = {n: {k: med(rows, k) for k in ("ttfb_p50", "ttfb_p99", "tok_p50", "tok_p99", "total_p50")}
             for n, rows in sse.items()}
        w("## SSE time to first byte")
        w("")
        w(f"4 × `vllm-sim --time-scale 0 --max-num-seqs 256` (no simulated delay: what is measured is transport); "
          f"a Python aiohttp client sends {a.sse_requests} streamed chat requests (`stream: true`, 16 tokens, "
          "~2 KB body, 64 keys) one after another on one keep-alive connection per target and round; "
          "TTFB = request sent → first `data:` event; first token = → first chunk with content. "
          f"{a.sse_rounds} rounds interleaved; medians. nginx here: the same upstream block over the sims, "
          "`proxy_buffering off`"
          f"{'; haproxy: a second frontend, the same backend section over the sims (it forwards response data as it arrives)' if 'haproxy' in sse else ''}. "
          "The gateway adds `stream_options.include_usage` and strips the usage chunk.")
        w("")
        w("| target | TTFB p50 ms | TTFB p99 ms | first token p50 ms | first token p99 ms | whole stream p50 ms | TTFB p50 vs direct |")
        w("|---|---:|---:|---:|---:|---:|---:|")
        for n in sse:
            s = Q[n]
            add = "—" if n == "direct" else f"+{(s['ttfb_p50'] - Q['direct']['ttfb_p50']):.0f} µs"
            w(f"| {n} | {fmt_ms(s['ttfb_p50'])} | {fmt_ms(s['ttfb_p99'])} | {fmt_ms(s['tok_p50'])} | "
              f"{fmt_ms(s['tok_p99'])} | {fmt_ms(s['total_p50'])} | {add} |")
        w("")
        w("The client is Python: its own per-request cost (~0.3–1 ms) is in every row; the differences are the proxies'.")
        w("")

    if rss:
        w("## Gateway memory (RSS)")
        w("")
        hold, rss_idle, rss_after, inflight_after = rss["hold"], rss["idle"], rss["after"], rss["inflight_after"]
        rss_open = C.median(hold["rss_kib"])
        w(f"A fresh gateway (`threads: {T}`, `max_num_seqs: 2000` per backend, `max_queue_depth: 0`) in front of 4 × "
          "`vllm-sim --max-num-seqs 2000 --decode-us-per-token 100000 --step-us-per-running-seq 0` "
          f"(10 tokens/s per stream, 300 tokens: 30 s streams). {a.streams} SSE streams opened at once from one "
          "aiohttp client (one connection each), read as they come; RSS (`VmRSS` of /proc/<pid>/status) "
          "sampled 5 times over 2.5 s once every stream had its first event; then every stream closed by the client.")
        w("")
        w("| state | gateway RSS |")
        w("|---|---:|")
        w(f"| idle, fresh (1 s after start) | {rss_idle / 1024:.1f} MiB |")
        w(f"| {hold['open']} streams open (median of samples; min–max) | {rss_open / 1024:.1f} MiB "
          f"({min(hold['rss_kib']) / 1024:.1f}–{max(hold['rss_kib']) / 1024:.1f}) |")
        w(f"| 2 s after the client closed them all | {rss_after / 1024:.1f} MiB |")
        w("")
        w(f"- per open stream: {(rss_open - rss_idle) / max(1, hold['open']):.1f} KiB "
          f"(client + upstream connection, buffers, task); opening all took {hold['open_secs']:.1f} s; "
          f"gateway threads: {hold['threads']}")
        w(f"- responses: {hold['statuses']}, client errors {hold['n_errors']}; "
          f"`poimen_gateway_in_flight` after closing: {inflight_after:g} (slots freed on client disconnect); "
          f"backend failures counted: {hold['failures']:g} (closing a stream after its headers is not one)")
        w("")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
