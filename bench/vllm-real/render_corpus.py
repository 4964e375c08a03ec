#!/usr/bin/env python3
"""Ground truth for the gateway's renderer: the token ids a real vLLM 0.32
(CPU build) computes for chat, completions, Anthropic Messages and OpenAI
Responses requests, written as tests/data/render/corpus.json.

Run with the vLLM venv's python (bench/vllm-real/run.sh --install-only makes it):

    bench/vllm-real/.venv/bin/python bench/vllm-real/render_corpus.py

What it does (one vLLM server, loopback only; every process it starts is
stopped before it returns, however it ends):

1. builds the tiny byte-level model (make_model.py) in a temp dir, compares
   its tokenizer.json, tokenizer_config.json and chat_template.jinja with
   conf/byte-model byte for byte and, where they differ, copies
   conf/byte-model's file over (the corpus is always made with
   conf/byte-model's tokenizer and template, the ones the Rust tests load);
2. starts `vllm.entrypoints.openai.api_server` (run.py's vllm_env/vllm_argv)
   with `--enable-scale-out`, which mounts the render endpoints
   (/v1/chat/completions/render, /v1/completions/render, /v1/messages/render,
   /v1/responses/render: vLLM's own conversion and tokenization, no
   inference), and `--enable-log-requests` with VLLM_LOGGING_LEVEL=DEBUG, so
   that the serving path logs the prompt_token_ids it hands to the engine;
3. for each request of the corpus: POST to the render endpoint (its
   `token_ids` are the corpus' ids, or its refusal the entry's `error`), then
   the same body to the real endpoint (/v1/chat/completions, /v1/completions,
   /v1/messages, /v1/responses), whose logged prompt_token_ids must equal the
   render's (any difference is kept in the entry as `served_token_ids` /
   `served_error` and counted in "checks"), and for chat and string-prompt
   completions also to POST /tokenize (likewise `tokenize_token_ids` /
   `tokenize_error`; /tokenize takes no prompt of ids);
4. writes the corpus: {"vllm_version", "model", "tokenizer", "how",
   "checks", "entries": [{"name", "api", "body", "token_ids" | "error",
   "prompt" (the ids decoded), ...}]}.

About 3 minutes on the 2-core machine, most of it vLLM's start-up.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from run import MODEL, vllm_argv, vllm_env, wait_health  # noqa: E402  (bench/vllm-real/run.py)
import common as C  # noqa: E402  (bench/common.py; run.py put bench/ on sys.path)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
RENDER = {"chat": "/v1/chat/completions/render", "completions": "/v1/completions/render",
          "messages": "/v1/messages/render", "responses": "/v1/responses/render"}
SERVE = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
         "messages": "/v1/messages", "responses": "/v1/responses"}


# ------------------------------------------------------------------ corpus --

def cases() -> list[dict]:
    """The requests: (name, api, body). Every body names the served model and
    asks for one output token (the real endpoint generates it)."""
    out: list[dict] = []

    def add(name: str, api: str, **body) -> None:
        limit = {"responses": "max_output_tokens"}.get(api, "max_tokens")
        out.append({"name": name, "api": api, "body": {"model": MODEL, limit: 1, **body}})

    def chat(name: str, messages: list[dict], **extra) -> None:
        add(name, "chat", messages=messages, **extra)

    def msgs(name: str, messages: list[dict], **extra) -> None:
        add(name, "messages", messages=messages, **extra)

    def resp(name: str, input, **extra) -> None:  # noqa: A002
        add(name, "responses", input=input, **extra)

    u = {"role": "user", "content": "What is the capital of France?"}
    a = {"role": "assistant", "content": "Paris."}
    u2 = {"role": "user", "content": "And of Italy?"}

    # -- chat completions
    chat("chat-plain", [u])
    chat("chat-multi-turn", [{"role": "system", "content": "You are terse."}, u, a, u2])
    chat("chat-text-parts", [{"role": "user", "content": [
        {"type": "text", "text": "first part"}, {"type": "text", "text": "second part"},
        {"type": "text", "text": "third part"}]}])
    chat("chat-name", [{"role": "user", "name": "alice", "content": "hi, I am Alice"}])
    chat("chat-no-generation-prompt", [u, a], add_generation_prompt=False)
    chat("chat-continue-final", [u, {"role": "assistant", "content": "The capital is"}],
         add_generation_prompt=False, continue_final_message=True)
    chat("chat-continue-final-trailing-space", [u, {"role": "assistant", "content": "The capital is "}],
         add_generation_prompt=False, continue_final_message=True)
    chat("chat-continue-final-parts", [u, {"role": "assistant", "content": [
        {"type": "text", "text": "Let me think."}, {"type": "text", "text": "The capital is"}]}],
         add_generation_prompt=False, continue_final_message=True)
    chat("chat-continue-final-with-generation-prompt",
         [u, {"role": "assistant", "content": "The capital is"}], continue_final_message=True)
    chat("chat-template-kwargs", [u], chat_template_kwargs={"extra_var": "extra value"})
    chat("chat-reasoning-low", [u], reasoning_effort="low")
    chat("chat-reasoning-none", [u], reasoning_effort="none")
    chat("chat-inline-system", [{"role": "system", "content": "You are terse."}, u, a,
                                {"role": "system", "content": "Reminder: be brief."}, u2])
    chat("chat-developer", [{"role": "developer", "content": "Answer in one word."}, u])
    chat("chat-developer-mid", [{"role": "system", "content": "You are terse."}, u, a,
                                {"role": "developer", "content": "Answer in one word."}, u2])
    chat("chat-empty-content", [{"role": "system", "content": ""}, {"role": "user", "content": ""}])
    chat("chat-assistant-null-content", [u, {"role": "assistant", "content": None}, u2])
    chat("chat-unicode", [{"role": "user", "content": "Crème brûlée, naïve café; 東京は日本の首都です; emoji 🦀🚀👍🏽"}])

    # -- completions
    add("cmpl-string", "completions", prompt="The capital of France is")
    add("cmpl-ids", "completions", prompt=[84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108])
    add("cmpl-unicode", "completions", prompt="naïve 東京 🦀")

    # -- Anthropic Messages
    msgs("msg-system-string", [u], system="You are terse.")
    msgs("msg-system-blocks", [u], system=[{"type": "text", "text": "You are terse."},
                                           {"type": "text", "text": "Answer in English."}])
    msgs("msg-system-billing-header", [u], system=[
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=0a1b2;"},
        {"type": "text", "text": "You are Claude Code."}])
    msgs("msg-content-string", [u])
    msgs("msg-content-one-block", [{"role": "user", "content": [
        {"type": "text", "text": "What is the capital of France?"}]}])
    msgs("msg-content-two-blocks", [{"role": "user", "content": [
        {"type": "text", "text": "first block"}, {"type": "text", "text": "second block"}]}])
    msgs("msg-content-empty-block", [{"role": "user", "content": [{"type": "text", "text": ""}]}, u])
    msgs("msg-multi-turn", [u, {"role": "assistant", "content": [{"type": "text", "text": "Paris."}]}, u2],
         system="You are terse.")
    msgs("msg-inline-system", [u, a, {"role": "system", "content": "Reminder: be brief."}, u2],
         system="You are terse.")
    msgs("msg-inline-system-blocks", [u, {"role": "system", "content": [
        {"type": "text", "text": "x-anthropic-billing-header: cch=1;"},
        {"type": "text", "text": "Reminder one."}, {"type": "text", "text": "Reminder two."}]}])
    msgs("msg-assistant-prefill", [u, {"role": "assistant", "content": "The capital is"}])
    msgs("msg-thinking-block", [u, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "France's capital is Paris.", "signature": "c2lnbmF0dXJl"},
        {"type": "text", "text": "Paris."}]}, u2])
    msgs("msg-thinking-disabled", [u], thinking={"type": "disabled"})
    msgs("msg-thinking-enabled-64", [u], thinking={"type": "enabled", "budget_tokens": 64})
    out[-1]["body"]["max_tokens"] = 128  # budget_tokens must also be below max_tokens
    msgs("msg-thinking-enabled-1024", [u], thinking={"type": "enabled", "budget_tokens": 1024})
    out[-1]["body"]["max_tokens"] = 1025
    msgs("msg-template-kwargs", [u], chat_template_kwargs={"extra_var": "extra value"})
    msgs("msg-unicode", [{"role": "user", "content": "Crème brûlée; 東京; 🦀🚀"}], system="Réponds en français.")

    # -- OpenAI Responses
    resp("resp-input-string", "What is the capital of France?")
    resp("resp-instructions", "What is the capital of France?", instructions="You are terse.")
    resp("resp-easy-messages", [u, a, u2])
    resp("resp-message-items", [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "first part"}, {"type": "input_text", "text": "second part"}]}])
    resp("resp-message-item-one-part", [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What is the capital of France?"}]}])
    resp("resp-assistant-output-text", [
        u, {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
            "content": [{"type": "output_text", "text": "Paris.", "annotations": []}]}, u2])
    resp("resp-assistant-output-text-minimal", [
        u, {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "Paris."}]}, u2])
    resp("resp-system-developer", [{"role": "system", "content": "You are terse."},
                                   {"role": "developer", "content": "Answer in one word."}, u, a, u2],
         instructions="Be helpful.")
    resp("resp-developer-mid", [u, a, {"role": "developer", "content": "Answer in one word."}, u2])
    resp("resp-system-mid", [u, a, {"role": "system", "content": "Reminder: be brief."}, u2])
    resp("resp-assistant-two-output-texts", [
        u, {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
            "content": [{"type": "output_text", "text": "Paris.", "annotations": []},
                        {"type": "output_text", "text": " It is in France.", "annotations": []}]}, u2])
    resp("resp-reasoning-item", [
        u, {"type": "reasoning", "id": "rs_1", "summary": [],
            "content": [{"type": "reasoning_text", "text": "France's capital is Paris."}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Paris.", "annotations": []}]}, u2])
    resp("resp-reasoning-low", "What is the capital of France?", reasoning={"effort": "low"})
    resp("resp-in-progress", [
        u, {"type": "message", "role": "assistant", "id": "msg_1", "status": "in_progress",
            "content": [{"type": "output_text", "text": "The capital is", "annotations": []}]}])
    resp("resp-unicode", "Crème brûlée; 東京; 🦀🚀")
    return out


# ------------------------------------------------------------------ client --

def post(port: int, path: str, body: dict, timeout: float = 600) -> tuple[int, object]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


def error_text(status: int, resp) -> str:
    """vLLM's refusal as one line: `status: message`."""
    msg = resp
    if isinstance(resp, dict):
        err = resp.get("error", resp.get("detail", resp))
        msg = err.get("message", err) if isinstance(err, dict) else err
    if not isinstance(msg, str):
        msg = json.dumps(msg, ensure_ascii=False)
    return f"{status}: {msg}"


def render_ids(api: str, resp) -> list[int]:
    if api == "completions":  # one GenerateRequest per prompt
        assert len(resp) == 1, resp
        resp = resp[0]
    return resp["token_ids"]


DETAILS = re.compile(r"Request (\S+) details: prompt: .*, prompt_token_ids: (\[[\d, ]*\]|None), "
                     r"prompt_embeds shape")


class Log:
    """The server's log, read on from where the last call stopped."""

    def __init__(self, path: Path):
        self.path, self.pos = path, 0

    def new_details(self) -> list[tuple[str, list[int] | None]]:
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            chunk = f.read()
        self.pos += len(chunk)
        out = []
        for line in chunk.decode(errors="replace").splitlines():
            m = DETAILS.search(line)
            if m:
                out.append((m.group(1), None if m.group(2) == "None" else json.loads(m.group(2))))
        return out


def served_ids(port: int, log: Log, case: dict) -> tuple[list[int] | None, str | None]:
    """The prompt ids the real endpoint handed to the engine (from its log)."""
    log.new_details()  # skip anything earlier
    status, resp = post(port, SERVE[case["api"]], case["body"])
    details = log.new_details()
    if status != 200:
        return None, error_text(status, resp)
    if len(details) != 1:
        raise RuntimeError(f"{case['name']}: expected one logged request, got {details!r}")
    return details[0][1], None


def tokenize_ids(port: int, case: dict) -> tuple[list[int] | None, str | None]:
    b = case["body"]
    keys = {"chat": ("model", "messages", "add_generation_prompt", "continue_final_message",
                     "chat_template_kwargs", "reasoning_effort"),
            "completions": ("model", "prompt")}[case["api"]]
    body = {k: b[k] for k in keys if k in b}
    status, resp = post(port, "/tokenize", body)
    if status != 200:
        return None, error_text(status, resp)
    return resp["tokens"], None


def compare(case: dict, what: str, ids, err, render, mismatches: list, refusals: list) -> None:
    """Keeps in `case` what `what` ("served", "tokenize") gave where it is
    not the render's answer."""
    if err is not None and render is None:
        if err != case["error"]:
            case[f"{what}_error"] = err
        return
    if err is not None or render is None:
        case[f"{what}_error" if err is not None else f"{what}_token_ids"] = err if err is not None else ids
        refusals.append(f"{case['name']}: {what} {'refused' if err is not None else 'accepted'}")
    elif ids != render:
        case[f"{what}_token_ids"] = ids
        mismatches.append(f"{case['name']}: {what}")


# -------------------------------------------------------------------- main --

def prepare_model(model_dir: Path, max_len: int) -> dict[str, str]:
    """Builds the tiny model; conf/byte-model's tokenizer files win. Returns
    per file 'identical' or 'differed (conf/byte-model copied in)'."""
    subprocess.run([sys.executable, str(HERE / "make_model.py"), str(model_dir), "--max-len", str(max_len)],
                   check=True, timeout=900)
    conf = ROOT / "conf" / "byte-model"
    out = {}
    for f in TOKENIZER_FILES:
        same = (model_dir / f).read_bytes() == (conf / f).read_bytes()
        if not same:
            shutil.copyfile(conf / f, model_dir / f)
        out[f] = "identical" if same else "differed (conf/byte-model copied in)"
    return out


def dump(doc: dict) -> str:
    """JSON with one entry per line (token id lists stay on one line)."""
    head = {k: v for k, v in doc.items() if k != "entries"}
    lines = json.dumps(head, indent=1, ensure_ascii=False)[:-2] + ',\n "entries": [\n'
    lines += ",\n".join("  " + json.dumps(e, ensure_ascii=False) for e in doc["entries"])
    return lines + "\n ]\n}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "render" / "corpus.json")
    ap.add_argument("--port", type=int, default=18401)
    ap.add_argument("--block-size", type=int, default=32, help="the CPU build takes multiples of 32 only")
    ap.add_argument("--max-model-len", type=int, default=4096,
                    help="also make_model.py's --max-len: 4096 gives conf/byte-model's tokenizer_config.json")
    ap.add_argument("--kv-space-gib", type=float, default=1, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--chat-template", type=Path,
                    help="serve this template instead of conf/byte-model's (e.g. tests/data/render/fields.jinja, "
                         "which prints every field a message and the request hand the template)")
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()

    import vllm
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(ROOT / "conf" / "byte-model" / "tokenizer.json"))
    corpus = cases()
    mismatches: list[str] = []  # both gave ids, not the same ones
    refusals: list[str] = []  # one refused, the other did not
    with C.bench_run("render-corpus", a.keep_logs) as (wd, procs):
        model_dir = wd / "tiny-llama"
        print("building the tiny model ...", flush=True)
        tokenizer_check = prepare_model(model_dir, a.max_model_len)
        print(f"conf/byte-model against make_model.py: {tokenizer_check}", flush=True)
        if a.chat_template:
            shutil.copyfile(a.chat_template, model_dir / "chat_template.jinja")
        env = vllm_env(a)
        env["VLLM_LOGGING_LEVEL"] = "DEBUG"  # the request logger's prompt_token_ids line
        argv = vllm_argv(a, model_dir, a.port) + ["--enable-scale-out", "--enable-log-requests"]
        srv = procs.start("vllm", argv, env=env)
        print(f"waiting for vLLM on :{a.port} (log {wd / 'vllm.log'}) ...", flush=True)
        print(f"vLLM up after {wait_health(a.port, srv, a.startup_timeout, 'vllm'):.0f} s", flush=True)
        log = Log(wd / "vllm.log")
        for case in corpus:
            api = case["api"]
            status, resp = post(a.port, RENDER[api], case["body"])
            ids = render_ids(api, resp) if status == 200 else None
            if ids is not None:
                case["token_ids"] = ids
                case["prompt"] = tok.decode(ids, skip_special_tokens=False)
            else:
                case["error"] = error_text(status, resp)
            s_ids, s_err = served_ids(a.port, log, case)
            compare(case, "served", s_ids, s_err, ids, mismatches, refusals)
            if api == "chat" or isinstance(case["body"].get("prompt"), str):
                t_ids, t_err = tokenize_ids(a.port, case)
                compare(case, "tokenize", t_ids, t_err, ids, mismatches, refusals)
            shown = f"{len(ids)} ids" if ids is not None else case["error"][:100]
            print(f"{case['name']:45s} {shown}", flush=True)
        procs.stop(srv, timeout=60)

    doc = {
        "vllm_version": vllm.__version__,
        "model": MODEL,
        "tokenizer": "conf/byte-model (tokenizer.json, tokenizer_config.json, chat_template.jinja); "
                     "make_model.py's output: " + json.dumps(tokenizer_check)
                     + (f"; chat template: {a.chat_template.resolve().relative_to(ROOT)}" if a.chat_template else ""),
        "how": "token_ids: the render endpoints of `vllm.entrypoints.openai.api_server --enable-scale-out` "
               "(/v1/chat/completions/render, /v1/completions/render, /v1/messages/render, /v1/responses/render); "
               "each checked against the prompt_token_ids the real endpoint logged "
               "(--enable-log-requests, VLLM_LOGGING_LEVEL=DEBUG) and, for chat and string-prompt completions, "
               "POST /tokenize. Made by bench/vllm-real/render_corpus.py.",
        "checks": {"entries": len(corpus), "refused_by_render": [c["name"] for c in corpus if "error" in c],
                   "id_mismatches": mismatches, "refused_by_one_only": refusals},
        "entries": corpus,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(dump(doc))
    print(f"{len(corpus)} entries in {a.out}: {json.dumps(doc['checks'])}", flush=True)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
