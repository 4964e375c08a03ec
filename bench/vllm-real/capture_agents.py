#!/usr/bin/env python3
"""Real agents' requests, captured on loopback and scrubbed: what Claude Code
(Anthropic Messages API) and Codex CLI (OpenAI Responses API) send while they
run short tool-using tasks. The output is a list of {name, api, body, sent}
that render_corpus.py renders through a real vLLM into
tests/data/render/agents.json:

    bench/vllm-real/capture_agents.py --out /tmp/agents-cases.json \\
        --claude DIR/node_modules/.bin/claude --codex DIR/node_modules/.bin/codex
    bench/vllm-real/.venv/bin/python bench/vllm-real/render_corpus.py \\
        --cases-from /tmp/agents-cases.json --out tests/data/render/agents.json \\
        --chat-template tests/data/render/qwen3.jinja --max-model-len 131072 --port 18403

The clients come from npm (`npm i @anthropic-ai/claude-code @openai/codex` in
a temp dir; both are native binaries). Nothing leaves loopback:

1. A scratch project (README.md with a typo, notes.txt, calc.py; rewritten
   before every task) and a fresh HOME / CLAUDE_CONFIG_DIR / CODEX_HOME are
   made in a temp dir.
2. A scripted server on 127.0.0.1 (stdlib http.server, one thread per
   request) speaks enough of both APIs, streamed (SSE) or not:
   POST /v1/messages[?beta=true] and /v1/messages/count_tokens, POST
   /v1/responses, GET /v1/models. A request that offers the task's tools is
   answered with the task's next step: the n-th tool call, where n is the
   number of tool results the request carries from this turn, then the
   final text (tool names and argument shapes follow the tools the client
   offers: Codex's exec_command {"cmd"} or shell {"command": [...]},
   apply_patch as a custom tool when offered, else through the shell). Any
   other request gets a short text.
3. Claude Code runs `claude -p TASK --allowedTools Bash,Read,Edit` (the
   first task with its default tool set, the others with `--tools
   Bash,Read,Edit`; a follow-up turn with `--continue`), with
   ANTHROPIC_BASE_URL at the server, ANTHROPIC_API_KEY=dummy and telemetry,
   error reporting, auto-update and non-essential traffic disabled. Codex
   runs `codex exec` (a follow-up turn: `codex exec resume --last`) with a
   custom model provider (`wire_api = "responses"`, base_url at the server,
   model "qwen3-coder", i.e. a model Codex does not know) in
   CODEX_HOME/config.toml; its last task runs with `-m gpt-5.5`, a model it
   knows, whose tool set differs (apply_patch as a grammar custom tool).
4. Every captured body is scrubbed (see scrub()): the temp paths become
   /home/user/project (the project) and /home/user (everything else under the
   temp dir); then every string longer than 40 characters is replaced by
   "lorem ipsum ..." filler of the same length in UTF-8 bytes, unless it is
   what the conversation itself carries: the task's prompts, the server's
   answers (texts, tool-call inputs and arguments), tool results (whose
   <system-reminder> parts are filled too) and Codex's <environment_context>.
   So the vendors' text (system prompts, tool and schema descriptions,
   instructions, developer messages, reminders) is gone, <system-reminder>
   tags stay in place; keys, structure, schema shapes ($schema, $ref kept),
   short strings, ids and the conversation stay. Claude Code's billing-header
   system block is kept (vLLM drops it by its prefix); request metadata
   (metadata, client_metadata) is kept with its UUIDs and hex ids zeroed.
5. Each body is then made renderable by the tiny model: `model` becomes
   "tiny", `max_tokens` (Messages) / `max_output_tokens` (Responses) 1,
   `stream` (and `stream_options`) is dropped, and a Messages `thinking`
   of type "enabled" is dropped (budget_tokens must be below max_tokens;
   it does not change the prompt). The values sent are kept in `sent`.
6. Unless --all, only the last request of each task is kept (it holds the
   task's every turn), so that agents.json stays small (~1.5 MB).

Run with any python3 (stdlib only); takes a minute or two.
"""

from __future__ import annotations

import argparse
import copy
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

FILLER = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore "
          "et dolore magna aliqua ")
KEEP_LEN = 40  # strings up to this many characters are kept
README = "# Teh calculator\n\nA tiny calculator. Run `python calc.py`.\n"
NOTES = "Meeting notes, 3 May:\n- ship version 0.2 on Friday\n- Ana reviews the parser\n- open: naming of the CLI\n"
CALC = "def add(a, b):\n    return a + b\n\n\nif __name__ == \"__main__\":\n    print(add(2, 3))\n"
HOME_PLACEHOLDER, PROJECT_PLACEHOLDER = "/home/user", "/home/user/project"


# ------------------------------------------------------------------ tasks --
#
# A task: the prompts (first run, then follow-ups continuing the session) and
# per prompt the steps the server answers with: ("call", tool-kind, args-fn)
# or ("text", text). Tool kinds are mapped to each client's own tool names.

def claude_tasks(project: str) -> list[dict]:
    return [
        {"name": "ls", "turns": [
            ("List the files in this directory and tell me how many there are.",
             [("call", "Bash", {"command": "ls -la", "description": "List files in the directory"}),
              ("text", "There are 3 files: README.md, calc.py and notes.txt.")])]},
        {"name": "notes", "args": ["--tools", "Bash,Read,Edit"], "turns": [
            ("Read notes.txt and summarize it in one sentence.",
             [("call", "Read", {"file_path": f"{project}/notes.txt"}),
              ("text", "Version 0.2 ships on Friday; Ana reviews the parser; the CLI's name is open.")]),
            ("Who reviews the parser?", [("text", "Ana reviews the parser.")])]},
        {"name": "typo", "args": ["--tools", "Bash,Read,Edit"], "turns": [
            ("Fix the typo in the title of README.md.",
             [("call", "Read", {"file_path": f"{project}/README.md"}),
              ("call", "Edit", {"file_path": f"{project}/README.md", "old_string": "# Teh calculator",
                                "new_string": "# The calculator"}),
              ("text", "Fixed: the title now reads \"The calculator\".")]),
            ("Now check that calc.py still runs.",
             [("call", "Bash", {"command": "python3 calc.py", "description": "Run calc.py"}),
              ("text", "It prints 5, so calc.py runs.")])]},
    ]


def codex_tasks(project: str) -> list[dict]:
    return [
        {"name": "ls", "turns": [
            ("List the files in this directory and tell me how many there are.",
             [("call", "shell", "ls -la"), ("text", "There are 3 files: README.md, calc.py and notes.txt.")])]},
        {"name": "notes", "turns": [
            ("Summarize notes.txt in one sentence.",
             [("call", "shell", "cat notes.txt"),
              ("text", "Version 0.2 ships on Friday; Ana reviews the parser; the CLI's name is open.")]),
            ("Who reviews the parser?", [("text", "Ana reviews the parser.")])]},
        {"name": "typo", "turns": [
            ("Fix the typo in the title of README.md.",
             [("call", "shell", "head -1 README.md"),
              ("call", "patch", "*** Begin Patch\n*** Update File: README.md\n@@\n-# Teh calculator\n"
                                "+# The calculator\n*** End Patch\n"),
              ("text", "Fixed: the title now reads \"The calculator\".")]),
            ("Now check that calc.py still runs.",
             [("call", "shell", "python3 calc.py"), ("text", "It prints 5, so calc.py runs.")])]},
        # An OpenAI model's name: Codex then offers its own tool set (apply_patch as a custom tool).
        {"name": "patch-openai-model", "args": ["-m", "gpt-5.5"], "turns": [
            ("Fix the typo in the title of README.md.",
             [("call", "patch", "*** Begin Patch\n*** Update File: README.md\n@@\n-# Teh calculator\n"
                                "+# The calculator\n*** End Patch\n"),
              ("text", "Fixed: the title now reads \"The calculator\".")])]},
    ]


# ----------------------------------------------------------------- server --

class Script:
    """What the server answers: the current turn's steps, and a log of every
    request (in order)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.steps: list = []
        self.base_results = 0  # tool results already in the conversation before this turn
        self.label = ""
        self.captured: list[dict] = []
        self.generated: set[str] = set()  # strings the server produced (kept by the scrub)

    def set_turn(self, label: str, steps: list, base_results: int) -> None:
        with self.lock:
            self.label, self.steps, self.base_results = label, steps, base_results


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: Script = None  # set by serve()

    def log_message(self, fmt, *args):  # quiet
        pass

    def _json(self, code: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events: list[tuple[str | None, dict]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for name, data in events:
            chunk = (f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n"
            self.wfile.write(chunk.encode())
            self.wfile.flush()
        self.close_connection = True

    def do_GET(self):  # noqa: N802
        path = self.path.split("?")[0]
        if path.endswith("/models"):
            return self._json(200, {"object": "list", "data": [], "models": []})
        self._json(404, {"error": {"type": "not_found", "message": f"no {path}"}})

    def do_HEAD(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):  # noqa: N802
        path = self.path.split("?")[0]
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"_unparsed": raw.decode(errors="replace")}
        s = self.script
        if path.endswith("/count_tokens"):
            with s.lock:
                s.captured.append({"label": s.label, "path": path, "body": body})
            return self._json(200, {"input_tokens": max(1, len(raw) // 4)})
        if path.endswith("/messages"):
            return self._messages(path, body)
        if path.endswith("/responses"):
            return self._responses(path, body)
        with s.lock:
            s.captured.append({"label": s.label, "path": path, "body": body})
        self._json(404, {"error": {"type": "not_found", "message": f"no {path}"}})

    # -- choosing the answer

    def _step(self, api: str, body: dict):
        """(kind, payload) for this request, and records it."""
        s = self.script
        with s.lock:
            tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
            main = bool(s.steps) and any(n in tools for n in TOOL_NAMES[api])
            if main:
                n = count_results(api, body) - s.base_results
                step = s.steps[min(max(n, 0), len(s.steps) - 1)]
            else:
                step = ("text", "OK.")
            s.captured.append({"label": s.label, "path": self.path.split("?")[0], "main": main, "body": body})
            if step[0] == "call":
                step = ("call",) + resolve_call(api, step[1], step[2], body)
                s.generated.add(step[2] if isinstance(step[2], str) else json.dumps(step[2]))
            else:
                s.generated.add(step[1])
            return step

    # -- Anthropic Messages

    def _messages(self, path: str, body: dict) -> None:
        step = self._step("messages", body)
        mid = "msg_" + uuid.uuid4().hex[:24]
        model = body.get("model", "claude")
        if step[0] == "call":
            _, name, args = step
            block = {"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": name, "input": args}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": step[1]}
            stop = "end_turn"
        usage = {"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        if not body.get("stream"):
            return self._json(200, {"id": mid, "type": "message", "role": "assistant", "model": model,
                                    "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage})
        start = dict(block, input={}) if block["type"] == "tool_use" else dict(block, text="")
        delta = ({"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                 if block["type"] == "tool_use" else {"type": "text_delta", "text": block["text"]})
        self._sse([
            ("message_start", {"type": "message_start", "message": {
                "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": dict(usage, output_tokens=1)}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 10}}),
            ("message_stop", {"type": "message_stop"})])

    # -- OpenAI Responses

    def _responses(self, path: str, body: dict) -> None:
        step = self._step("responses", body)
        rid = "resp_" + uuid.uuid4().hex[:24]
        if step[0] == "call":
            _, name, args, kind = step
            cid = "call_" + uuid.uuid4().hex[:24]
            if kind == "custom":
                item = {"type": "custom_tool_call", "id": "ctc_" + uuid.uuid4().hex[:24], "call_id": cid,
                        "name": name, "input": args, "status": "completed"}
            else:
                item = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:24], "call_id": cid,
                        "name": name, "arguments": args, "status": "completed"}
        else:
            item = {"type": "message", "id": "msg_" + uuid.uuid4().hex[:24], "role": "assistant",
                    "status": "completed", "content": [{"type": "output_text", "text": step[1], "annotations": []}]}
        usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 110}
        resp = {"id": rid, "object": "response", "created_at": int(time.time()), "status": "completed",
                "model": body.get("model"), "output": [item], "usage": usage}
        if not body.get("stream"):
            return self._json(200, resp)
        events = [("response.created", {"type": "response.created", "sequence_number": 0,
                                         "response": dict(resp, status="in_progress", output=[], usage=None)}),
                  ("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1,
                                                  "output_index": 0, "item": dict(item, status="in_progress")})]
        if item["type"] == "message":
            events.append(("response.output_text.delta", {
                "type": "response.output_text.delta", "sequence_number": 2, "item_id": item["id"],
                "output_index": 0, "content_index": 0, "delta": step[1]}))
        events += [("response.output_item.done", {"type": "response.output_item.done", "sequence_number": 3,
                                                  "output_index": 0, "item": item}),
                   ("response.completed", {"type": "response.completed", "sequence_number": 4, "response": resp})]
        self._sse(events)


# What marks a request as the agent's main loop (it offers these tools).
TOOL_NAMES = {"messages": ("Bash", "Read", "Edit"),
              "responses": ("shell", "shell_command", "exec_command", "local_shell", "apply_patch")}


def count_results(api: str, body: dict) -> int:
    n = 0
    if api == "messages":
        for m in body.get("messages") or []:
            if isinstance(m.get("content"), list):
                n += sum(1 for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result")
    else:
        inp = body.get("input")
        if isinstance(inp, list):
            n = sum(1 for it in inp if isinstance(it, dict)
                    and it.get("type") in ("function_call_output", "custom_tool_call_output",
                                           "local_shell_call_output"))
    return n


def resolve_call(api: str, kind: str, args, body: dict) -> tuple:
    """The client's own tool name and input for a scripted step."""
    if api == "messages":
        return kind, args
    tools = {t.get("name"): t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("name")}
    if kind == "patch":
        t = tools.get("apply_patch")
        if t is not None and t.get("type") == "custom":
            return "apply_patch", args, "custom"
        if t is not None:
            return "apply_patch", json.dumps({"input": args}), "function"
        kind, args = "shell", f"apply_patch <<'EOF'\n{args}EOF"  # no patch tool: through the shell
    for name in ("shell_command", "exec_command", "shell"):
        t = tools.get(name)
        if t is None:
            continue
        props = ((t.get("parameters") or {}).get("properties") or {})
        if "cmd" in props:
            return name, json.dumps({"cmd": args}), "function"
        if (props.get("command") or {}).get("type") == "array":
            return name, json.dumps({"command": ["bash", "-lc", args]}), "function"
        return name, json.dumps({"command": args}), "function"
    raise RuntimeError(f"no shell tool among {sorted(tools)}")


def serve(port: int, script: Script) -> http.server.ThreadingHTTPServer:
    Handler.script = script
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


# ----------------------------------------------------------------- agents --

def client_env(root: Path, port: int) -> dict:
    home = root / "home"
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "LANG", "LC_ALL", "TERM", "TZ", "SSL_CERT_FILE")}
    env.update({
        "HOME": str(home), "USER": "user", "LOGNAME": "user", "SHELL": "/bin/bash", "TMPDIR": str(root / "tmp"),
        "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        # Claude Code
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_API_KEY": "dummy",
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
        "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1", "DISABLE_COST_WARNINGS": "1",
        # Codex
        "CODEX_HOME": str(home / ".codex"), "LOCAL_API_KEY": "dummy", "RUST_LOG": "error",
    })
    return env


def make_project(root: Path) -> Path:
    """The scratch project, (re)written before every task."""
    project = root / "project"
    project.mkdir(exist_ok=True)
    (project / "README.md").write_text(README)
    (project / "notes.txt").write_text(NOTES)
    (project / "calc.py").write_text(CALC)
    return project


def write_codex_config(root: Path, port: int, model: str) -> None:
    codex_home = root / "home" / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(f'''model = "{model}"
model_provider = "local"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.local]
name = "local"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "LOCAL_API_KEY"

[analytics]
enabled = false

[feedback]
enabled = false
''')


def run_client(client: str, exe: str, task: dict, root: Path, project: Path, port: int, script: Script,
               timeout: float, logs: Path) -> list[str]:
    """Runs one task (its turns in one session); returns problems seen."""
    problems = []
    env = client_env(root, port)
    for i, (prompt, steps) in enumerate(task["turns"]):
        label = f"{client}/{task['name']}/turn{i + 1}"
        before = len(script.captured)
        # Tool results of earlier turns of the same session are in the history.
        base = sum(1 for st in (s for _, ss in task["turns"][:i] for s in ss) if st[0] == "call")
        script.set_turn(label, steps, base)
        if client == "claude":
            argv = [exe, "-p", prompt, "--allowedTools", "Bash,Read,Edit", "--output-format", "text"]
            argv += task.get("args", []) + (["--continue"] if i else [])
        else:
            argv = [exe, "exec", "--skip-git-repo-check", "--color", "never"] + task.get("args", [])
            argv += ["resume", "--last", prompt] if i else [prompt]
        t0 = time.monotonic()
        with open(logs / f"{label.replace('/', '-')}.log", "w") as log:
            try:
                p = subprocess.run(argv, cwd=project, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, timeout=timeout)
                rc = p.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        n = len(script.captured) - before
        print(f"{label:28s} rc={rc} {n} requests {time.monotonic() - t0:.0f}s", flush=True)
        if rc != 0:
            problems.append(f"{label}: exit {rc} (log {logs / (label.replace('/', '-') + '.log')})")
    return problems


# ------------------------------------------------------------------ scrub --

def filler(nbytes: int) -> str:
    return (FILLER * (nbytes // len(FILLER) + 1))[:nbytes]


def fill_same_bytes(s: str) -> str:
    return filler(len(s.encode()))


REMINDER = re.compile(r"(<system-reminder>)(.*?)(</system-reminder>)", re.S)


def scrub_reminders(s: str) -> str:
    return REMINDER.sub(lambda m: m.group(1) + fill_same_bytes(m.group(2)) + m.group(3), s)


def fill_keeping_tags(s: str) -> str:
    """Vendor text filled; <system-reminder> tags stay where they are."""
    parts = REMINDER.split(s)  # outside, open, inner, close, outside, ...
    out = []
    for i, part in enumerate(parts):
        if i % 4 in (1, 3):
            out.append(part)
        else:
            out.append(fill_same_bytes(part) if (i % 4 == 2 or len(part) > KEEP_LEN) else part)
    return "".join(out)


def replace_paths(obj, paths: list[tuple[str, str]]):
    if isinstance(obj, str):
        for old, new in paths:
            obj = obj.replace(old, new)
        return obj
    if isinstance(obj, list):
        return [replace_paths(x, paths) for x in obj]
    if isinstance(obj, dict):
        return {replace_paths(k, paths): replace_paths(v, paths) for k, v in obj.items()}
    return obj


def scrub(body: dict, keep: set[str]) -> dict:
    """Vendor text out, the conversation in (see the module doc)."""

    def in_keep(s: str) -> bool:
        return s in keep or any(k and k in s for k in keep if len(k) > KEEP_LEN)

    def walk(obj, conv: bool):
        # conv: inside a tool result / tool output (client-generated text: kept, reminders filled)
        if isinstance(obj, str):
            if obj.startswith(("x-anthropic-billing-header", "<environment_context>")):
                return obj  # client-generated: the billing header (vLLM drops it), the environment
            if len(obj) <= KEEP_LEN:
                return obj
            if conv or in_keep(obj):
                return scrub_reminders(obj)
            return fill_keeping_tags(obj)
        if isinstance(obj, list):
            return [walk(x, conv) for x in obj]
        if isinstance(obj, dict):
            t = obj.get("type")
            out = {}
            for k, v in obj.items():
                if k in ("$schema", "$ref", "$id") and isinstance(v, str):
                    out[k] = v  # schema identifiers, not prose
                    continue
                inner = conv or (t == "tool_result" and k == "content") \
                    or (t in ("function_call_output", "custom_tool_call_output") and k == "output") \
                    or (t == "tool_use" and k == "input") \
                    or (t in ("function_call",) and k == "arguments") or (t == "custom_tool_call" and k == "input")
                out[k] = walk(v, inner)
            return out
        return obj

    # Request metadata is the client's, not the vendor's text: kept, its ids zeroed.
    return {k: zero_ids(v) if k in ("metadata", "client_metadata") else walk(v, False) for k, v in body.items()}


IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32,}")


def zero_ids(obj):
    """UUIDs and long hex ids (device, session, installation) made zeros."""
    if isinstance(obj, str):
        return IDS.sub(lambda m: re.sub(r"[0-9a-f]", "0", m.group(0)), obj)
    if isinstance(obj, list):
        return [zero_ids(x) for x in obj]
    if isinstance(obj, dict):
        return {k: zero_ids(v) for k, v in obj.items()}
    return obj


def renderable(api: str, body: dict) -> tuple[dict, dict]:
    """The body as render_corpus.py sends it, and the original values changed."""
    body = copy.deepcopy(body)
    sent = {}
    for k in ("model", "max_tokens", "max_output_tokens", "stream", "stream_options"):
        if k in body:
            sent[k] = body[k]
    body["model"] = "tiny"
    body.pop("stream", None)
    body.pop("stream_options", None)
    if api == "messages":
        body["max_tokens"] = 1
        th = body.get("thinking")
        if isinstance(th, dict) and th.get("type") == "enabled":
            sent["thinking"] = body.pop("thinking")
    else:
        body["max_output_tokens"] = 1
    return body, sent


# ------------------------------------------------------------------- main --

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--claude", help="the claude executable (node_modules/.bin/claude)")
    ap.add_argument("--codex", help="the codex executable (node_modules/.bin/codex)")
    ap.add_argument("--codex-model", default="qwen3-coder",
                    help="the model name Codex is configured with (a local model's name, as a vLLM user sets it)")
    ap.add_argument("--out", type=Path, required=True, help="the cases file (a JSON list) for render_corpus.py")
    ap.add_argument("--raw-dir", type=Path, help="also write the unscrubbed bodies here (never commit them)")
    ap.add_argument("--port", type=int, default=18499)
    ap.add_argument("--timeout", type=float, default=300, help="per client run")
    ap.add_argument("--all", action="store_true",
                    help="keep every request (default: per task, the last one, which holds all its turns)")
    ap.add_argument("--keep-temp", action="store_true")
    a = ap.parse_args()
    if not (a.claude or a.codex):
        ap.error("give --claude and/or --codex")

    root = Path(tempfile.mkdtemp(prefix="capture-agents-"))
    problems: list[str] = []
    script = Script()
    srv = serve(a.port, script)
    try:
        for d in ("home", "tmp", "logs"):
            (root / d).mkdir(exist_ok=True)
        project = make_project(root)
        write_codex_config(root, a.port, a.codex_model)
        for client, exe, tasks in (("claude", a.claude, claude_tasks), ("codex", a.codex, codex_tasks)):
            if not exe:
                continue
            exe = str(Path(exe).resolve())
            for task in tasks(str(project)):
                make_project(root)
                problems += run_client(client, exe, task, root, project, a.port, script, a.timeout, root / "logs")
    finally:
        srv.shutdown()
        srv.server_close()

    # the conversation's own strings (kept by the scrub)
    keep = set(script.generated)
    for tasks in (claude_tasks, codex_tasks):
        for task in tasks(str(project)):
            for prompt, steps in task["turns"]:
                keep.add(prompt)
                for st in steps:
                    keep.add(st[-1] if isinstance(st[-1], str) else json.dumps(st[-1]))
    paths = [(str(project), PROJECT_PLACEHOLDER), (str(root / "home"), HOME_PLACEHOLDER),
             (str(root / "tmp"), "/tmp"), (str(root), HOME_PLACEHOLDER)]
    keep = {replace_paths(k, paths) for k in keep}
    if a.raw_dir:
        a.raw_dir.mkdir(parents=True, exist_ok=True)
        (a.raw_dir / "captured.json").write_text(json.dumps(script.captured, indent=1, ensure_ascii=False))

    cases, counters = [], {}
    for c in script.captured:
        path = c["path"]
        api = "messages" if path.endswith("/messages") else "responses" if path.endswith("/responses") else None
        if api is None:
            continue  # count_tokens and anything else: not a prompt
        n = counters[c["label"]] = counters.get(c["label"], 0) + 1
        body = scrub(replace_paths(c["body"], paths), keep)
        body, sent = renderable(api, body)
        role = "" if c.get("main") else "-side"
        cases.append({"name": f"{c['label']}/req{n}{role}", "api": api, "body": body, "sent": sent})
    if not a.all:  # per task (client/task), its last request
        last = {}
        for i, c in enumerate(cases):
            last["/".join(c["name"].split("/")[:2])] = i
        cases = [c for i, c in enumerate(cases) if i in set(last.values())]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} requests in {a.out} ({len(script.captured)} captured)", flush=True)
    for p in problems:
        print("problem:", p, file=sys.stderr)
    if a.keep_temp or problems:
        print(f"temp dir kept: {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
