"""Shared helpers for the benchmarks under bench/: locating (or building) the
binaries, free loopback ports, starting and always stopping the processes a
bench starts, reading /proc, and small statistics.

Every process started through `Procs` runs in its own session (process
group); `Procs.stop_all()` signals exactly those groups, by id, first with
SIGTERM and then SIGKILL. Benches call it from `finally`, and SIGINT/SIGTERM
are turned into exceptions so that `finally` runs on Ctrl-C or a kill too.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------
# binaries


def bin_dir() -> Path:
    """POIMEN_BIN_DIR (default <repo>/target/release); builds the release
    binaries there with `cargo build --release --bins` when one is missing."""
    d = Path(os.environ.get("POIMEN_BIN_DIR", REPO / "target" / "release")).resolve()
    need = [d / "poimen-gateway", d / "vllm-sim"]
    if all(p.exists() for p in need):
        return d
    env = dict(os.environ)
    if d.name == "release":
        env["CARGO_TARGET_DIR"] = str(d.parent)
    else:
        sys.exit(f"{d}: no poimen-gateway/vllm-sim there, and it is not a cargo "
                 "target/release dir to build into")
    print(f"building release binaries into {d} (cargo build --release --bins) ...", flush=True)
    subprocess.run(["cargo", "build", "--release", "--bins"], cwd=REPO, env=env, check=True)
    return d


def need_tools(*names: str) -> None:
    missing = [n for n in names if not (shutil.which(n) or Path("/usr/sbin", n).exists())]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: run bash bench/setup.sh")


def nginx_bin() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


def haproxy_bin() -> str:
    return shutil.which("haproxy") or "/usr/sbin/haproxy"


def bench_venv() -> Path:
    """The venv bench/setup.sh installs the LLM routers into (vllm-router,
    sglang-router, pinned there): POIMEN_BENCH_VENV, default bench/.venv."""
    return Path(os.environ.get("POIMEN_BENCH_VENV", BENCH / ".venv")).absolute()


def router_venv(router: str) -> Path:
    """The venv bench/setup.sh installs `router` into: smg's is its own,
    bench_venv() + "-smg" (sglang-router 0.3.2 installs a `smg` script too)."""
    venv = bench_venv()
    return venv.with_name(venv.name + "-smg") if router == "smg" else venv


# --------------------------------------------------------------------------
# ports


_taken: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on `host` a moment ago (bind to 0, read, close)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            p = s.getsockname()[1]
        if p not in _taken:
            _taken.add(p)
            return p
    raise RuntimeError("no free port")


def wait_port(port: int, host: str = "127.0.0.1", timeout: float = 15.0, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[0]} exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {host}:{port} after {timeout}s")


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


# --------------------------------------------------------------------------
# processes


class Procs:
    """The processes one bench started; stop_all() ends them (only them)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env)
        log.close()
        p.bench_name = name  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen, timeout: float = 5.0) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)  # the group we created, by its id
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
        # reap stray members of the group (e.g. nginx workers) if any survived
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self) -> None:
        for p in list(reversed(self.procs)):
            try:
                self.stop(p)
            except Exception as e:  # keep stopping the others
                print(f"warning: stopping {getattr(p, 'bench_name', p.pid)}: {e}", file=sys.stderr)


def signals_raise() -> None:
    """SIGTERM/SIGINT/SIGHUP -> SystemExit, so `finally` blocks clean up."""
    def handler(signum, _frame):
        raise SystemExit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, handler)


def raise_nofile() -> None:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"poimen-bench-{prefix}-"))


@contextlib.contextmanager
def bench_run(prefix: str, keep_logs: bool):
    """A work directory and the processes of one bench run. Every process is
    stopped at the end, however the run ends; the directory is removed after
    a successful run unless the logs are to be kept."""
    wd = workdir(prefix)
    procs = Procs(wd)
    ok = False
    try:
        yield wd, procs
        ok = True
    finally:
        procs.stop_all()
        if ok and not keep_logs:
            shutil.rmtree(wd, ignore_errors=True)
        else:
            print(f"logs kept in {wd}", file=sys.stderr)


# --------------------------------------------------------------------------
# /proc


def strace_counts(path: Path) -> dict[str, int]:
    """Calls per syscall from an `strace -c -o path` summary."""
    calls = {}
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            calls[f[-1]] = int(f[3])
    return calls


def cpu_ticks(pid: int) -> int:
    """utime + stime of one process (all its threads), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)


def children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        fields = s[s.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            out.append(int(d))
    return out


def tree_cpu_us(pid: int) -> float:
    """CPU time (µs) of a process and its direct children (nginx master + workers)."""
    total = 0
    for p in [pid] + children(pid):
        try:
            total += cpu_ticks(p)
        except OSError:
            pass
    return total * 1e6 / CLK_TCK


def system_busy_us() -> float:
    """CPU time (µs) all cores spent not idle since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) * 1e6 / CLK_TCK


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def rss_samples(pid: int, n: int, every: float) -> list[int]:
    """n samples of rss_kib(pid), `every` seconds apart (the first after one wait)."""
    import asyncio
    samples = []
    for _ in range(n):
        await asyncio.sleep(every)
        samples.append(rss_kib(pid))
    return samples


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


# --------------------------------------------------------------------------
# the two binaries


def start_sim(procs: Procs, bins: Path, name: str, port: int, *flags: str,
              model: str = "sim-model") -> subprocess.Popen:
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "warn")
    p = procs.start(name, [str(bins / "vllm-sim"), "--listen", f"127.0.0.1:{port}",
                           "--model", model, *flags], env=env)
    wait_port(port, proc=p)
    return p


def gateway_yaml(wd: Path, name: str, listen: int, metrics: int, models: list[dict],
                 threads: int = 2, scheduler: dict | None = None, extra: dict | None = None,
                 work_stealing: bool = False) -> Path:
    """Writes a gateway config (YAML is a superset of JSON: written as JSON)."""
    import json
    gw = {"listen": f"127.0.0.1:{listen}", "metrics_listen": f"127.0.0.1:{metrics}"}
    if scheduler:
        gw["scheduler"] = scheduler
    gw.update(extra or {})
    gw["models"] = models
    cfg = {
        "version": 1,
        "threads": threads,
        "work_stealing": work_stealing,  # False: as conf/gateway.yaml ships
        "pid_file": str(wd / f"{name}.pid"),
        "upgrade_sock": str(wd / f"{name}-upgrade.sock"),
        "grace_period_seconds": 1,
        "graceful_shutdown_timeout_seconds": 1,
        "gateway": gw,
    }
    path = wd / f"{name}.yaml"
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def start_gateway(procs: Procs, bins: Path, name: str, cfg: Path, port: int,
                  rust_log: str = "info") -> subprocess.Popen:
    chk = subprocess.run([str(bins / "poimen-gateway"), "-t", "-c", str(cfg)],
                         capture_output=True, text=True)
    if chk.returncode != 0:
        raise RuntimeError(f"gateway config {cfg} refused: {chk.stdout}{chk.stderr}")
    env = dict(os.environ)
    env["RUST_LOG"] = rust_log
    p = procs.start(name, [str(bins / "poimen-gateway"), "-c", str(cfg)], env=env)
    wait_port(port, proc=p)
    return p


# --------------------------------------------------------------------------
# the LLM routers (vllm-router, sglang-router), from the venv bench/setup.sh makes


# The header each router's session-key policy reads the key from:
# vllm-router's consistent_hash and sglang-router's manual policy.
# smg's consistent_hashing and manual policies read X-SMG-Routing-Key (its
# --routing-key-headers default), as sglang-router's manual one does.
ROUTER_KEY_HEADERS = {"vllm-router": "X-Session-Id", "sglang-router": "X-SMG-Routing-Key",
                      "smg": "X-SMG-Routing-Key"}


def router_version(venv: Path, dist: str) -> str:
    r = subprocess.run([str(venv / "bin" / "python"), "-c",
                        f"import importlib.metadata as m; print(m.version({dist!r}))"],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "?"


def router_argv(router: str, venv: Path, port: int, metrics_port: int, backend_ports: list[int],
                policy: str) -> list[str]:
    """`router` ("vllm-router", "sglang-router" or "smg") as a user would start it in
    front of these backends, with `policy`; the rest at its defaults (retries,
    circuit breaker, health checks, metrics), bound to loopback, logging at
    warn."""
    workers = [f"http://127.0.0.1:{p}" for p in backend_ports]
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
              "--policy", policy,
              "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
    if router == "vllm-router":
        # "--log-level warning" alone still logs 3 INFO lines per request in
        # 0.1.17 (consistent_hash debug lines); RUST_LOG=warn (start_router) quiets them
        return [str(venv / "bin" / "vllm-router"), *common, "--log-level", "warning"]
    if router in ("sglang-router", "smg"):
        # smg 1.13 (PyPI `smg`, what sglang-router's router became) takes
        # sglang-router's flags; the default 180 s shutdown grace would
        # outlast Procs.stop's 5 s SIGTERM wait
        return [str(venv / "bin" / router), "launch", *common, "--log-level", "warn",
                "--shutdown-grace-period-secs", "1"]
    raise ValueError(router)


def start_router(procs: Procs, name: str, router: str, venv: Path, threads: int, port: int,
                 backend_ports: list[int], policy: str, ready, timeout: float = 60.0) -> subprocess.Popen:
    """Starts `router` (process name `name`, its log `<name>.log`) with
    `threads` tokio worker threads (TOKIO_WORKER_THREADS: none has a flag
    for it; each builds tokio's multi-thread runtime without setting a count,
    so tokio reads the variable), RUST_LOG=warn and NO_COLOR=1, and waits
    until it proxies: until `ready(port)` returns without raising (listening
    is not yet routing: the routers register their workers after they bind)."""
    env = dict(os.environ)
    env["TOKIO_WORKER_THREADS"] = str(threads)
    env["RUST_LOG"] = "warn"
    env["NO_COLOR"] = "1"
    p = procs.start(name, router_argv(router, venv, port, free_port(), backend_ports, policy), env=env)
    wait_port(port, timeout=timeout, proc=p)
    deadline = time.monotonic() + timeout
    while True:
        try:
            ready(port)
            return p
        except Exception as e:  # noqa: BLE001
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} does not route ({e!r}; log: {procs.workdir / name}.log)") from e
            time.sleep(0.2)


def http_post(port: int, path: str, body: bytes, headers: dict | None = None, timeout: float = 5.0) -> bytes:
    """One POST to 127.0.0.1:port; the body of a 200 answer (anything else raises)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        if r.status != 200:
            raise RuntimeError(f"{path}: status {r.status}")
        return r.read()


def prom_values(text: str, name: str) -> float:
    """Sum of every sample of metric `name` in a Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, val = line.rpartition(" ")
        metric = head.split("{", 1)[0]
        if metric == name:
            total += float(val)
    return total


def cached_tokens(usage: dict) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` of an OpenAI-style
    response's usage (None when it is not there)."""
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


# --------------------------------------------------------------------------
# workload text


WORDS = ("agent tool result plan memory cache token step note user repo test build patch diff "
         "error trace file module function branch commit review deploy config metric query index "
         "schema table vector prompt context window batch queue worker thread socket stream").split()


def text(rng: random.Random, nbytes: int) -> str:
    """`nbytes` of seeded word salad: the benches' prompts."""
    out, n = [], 0
    while n < nbytes:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:nbytes]


# --------------------------------------------------------------------------
# stats and report helpers


def write_report(path: str, report: str) -> None:
    """Write a bench's report to `path` and show it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print()
    print(report)
    print(f"written to {out}")


def pct(xs: list[float], q: float) -> float:
    """Percentile by nearest rank (q in 0..100)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def median(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def report_head(title: str, bins: Path, machine_note: str = "") -> list[str]:
    """The first lines of every bench report: title, date and build, machine."""
    return [f"# {title}", "", f"- date: {now_utc()}; {build_info(bins)}", f"- machine: {machine_line()}{machine_note}"]


def machine_line() -> str:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def build_info(bins: Path | None = None) -> str:
    """'repo HEAD <rev> at run time; poimen-gateway built <time>' for reports."""
    out = f"repo HEAD {git_rev()} at run time"
    if bins is not None and (bins / "poimen-gateway").exists():
        t = datetime.datetime.fromtimestamp((bins / "poimen-gateway").stat().st_mtime, datetime.timezone.utc)
        out += f"; binaries `{bins}`, poimen-gateway built {t.strftime('%Y-%m-%d %H:%M UTC')}"
    return out


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"],
                               cwd=REPO, capture_output=True, text=True).stdout.strip()
        return rev + (" (+ uncommitted changes to src/ or Cargo.*)" if dirty else "")
    except OSError:
        return "?"
