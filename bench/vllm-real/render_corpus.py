#!/usr/bin/env python3
"""Ground truth for the gateway's renderer: the token ids a real vLLM 0.32
(CPU build) computes for chat, completions, Anthropic Messages and OpenAI
Responses requests, written as tests/data/render/corpus.json.

Run with the vLLM venv's python (bench/vllm-real/run.sh --install-only makes it):

    bench/vllm-real/.venv/bin/python bench/vllm-real/render_corpus.py

Other sets (tests/data/render/README.md has the command lines):
  --set tools      tool-using requests (tool_cases()), written as
                   tests/data/render/tools.json, served with
                   tests/data/render/qwen3.jinja (Qwen3's template) and
                   `--enable-auto-tool-choice --tool-call-parser hermes`;
  --cases-from F   the requests of a file (capture_agents.py's output, or a
                   corpus file to re-render), same server flags as tools.

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
   `tokenize_error`; /tokenize takes no prompt of ids; only for --set
   corpus unless --tokenize);
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


# ------------------------------------------------------------- tool cases --
#
# Tool-using requests, rendered with a template that prints tools, tool calls
# and tool results (tests/data/render/qwen3.jinja, Qwen3's own) and a server
# started with --enable-auto-tool-choice --tool-call-parser hermes.

# A tool as an SDK user writes it: nested JSON schema with $schema, enum,
# arrays, additionalProperties, integer and float defaults (1, 1.0, 0.5, 1e-05,
# ints beyond 2^53 and beyond i64), booleans, null, and descriptions with
# characters JSON and HTML escape differently (< > & ' " \n \t, U+0007,
# U+007F, U+2028), non-ASCII and astral-plane characters.
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Get the current weather for a city. Returns <json> & a summary; it's \"best effort\" "
                   "(±0.5 °C), e.g. for Zürich, 東京 or São Paulo 🌦️.\nSecond line:\tafter a tab.",
    "parameters": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name, e.g. 'Paris' or \"New York\""},
            "units": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "days": {"type": "integer", "minimum": 1, "maximum": 16, "default": 1},
            "threshold": {"type": "number", "default": 1.0},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1.0, "default": 0.5},
            "epsilon": {"type": "number", "default": 1e-05},
            "seed": {"type": "integer", "default": 9007199254740993},
            "max_id": {"type": "integer", "default": 18446744073709551615},
            "hourly": {"type": "boolean", "default": False},
            "note": {"type": ["string", "null"], "default": None},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["rain", "wind", "snow"]},
                     "uniqueItems": True, "maxItems": 3},
            "location": {"type": "object", "description": "Coordinates <lat, lon>",
                         "properties": {"lat": {"type": "number", "minimum": -90.0, "maximum": 90.0},
                                        "lon": {"type": "number", "minimum": -180, "maximum": 180}},
                         "required": ["lat", "lon"], "additionalProperties": False},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["city"],
        "additionalProperties": False,
    }}}
# What pydantic (the OpenAI Agents SDK, `openai.pydantic_function_tool`) emits:
# titles, $defs/$ref, anyOf with null, strict.
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search_docs",
    "description": "Search the documentation.",
    "parameters": {
        "$defs": {"Filter": {"properties": {"field": {"title": "Field", "type": "string"},
                                            "value": {"title": "Value", "type": "string"}},
                             "required": ["field", "value"], "title": "Filter", "type": "object",
                             "additionalProperties": False}},
        "properties": {"query": {"title": "Query", "type": "string"},
                       "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "Limit"},
                       "filters": {"items": {"$ref": "#/$defs/Filter"}, "title": "Filters", "type": "array"}},
        "required": ["query", "limit", "filters"],
        "title": "SearchDocs", "type": "object", "additionalProperties": False},
    "strict": True}}
READ_TOOL = {"type": "function", "function": {
    "name": "read_file", "description": "Read a UTF-8 text file and return its content.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
# The same tool, small (most cases use it, to keep tools.json small).
W_SMALL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "units": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
RUN_TOOL = {"type": "function", "function": {
    "name": "run_command", "description": "Run a shell command and return stdout and stderr.",
    "parameters": {"type": "object",
                   "properties": {"command": {"type": "string"},
                                  "timeout": {"type": "number", "description": "seconds", "default": 30.0}},
                   "required": ["command"]}}}

# Arguments strings as models and clients write them: their own key order, no
# spaces, nested objects, non-ASCII both raw and \u-escaped (with a surrogate
# pair), \/ , escaped quotes, backslashes, control characters, < > &.
ARGS_ESCAPES = ('{"z_last":1,"a_first":{"nested":[1,2.50,{"deep":null}],"flag":true},'
                '"text":"naïve 東京 🦀 \\u00e9 \\ud83e\\udd80 <b> & \\"quoted\\" back\\\\slash '
                'line\\nbreak\\ttab \\u0001 \\u007f \\u2028 \\/ slash"}')
ARGS_NUMBERS = ('{"int":1,"float":1.0,"half":0.5,"small":1E-5,"tiny":0.0001,"big":1e20,"e16":1e16,'
                '"e15":1e15,"trailing":1.50,"neg_zero":-0.0,"sum":0.30000000000000004,"huge":1.5e300,'
                '"denormal":5e-324,"i53":9007199254740993,"u64":18446744073709551615,'
                '"bigger":123456789012345678901234567890,"neg":-42}')


def tool_cases() -> list[dict]:
    """The tool-using requests (chat, Messages, Responses)."""
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

    def call(cid: str, name: str, arguments, **extra) -> dict:
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}, **extra}

    def calls(*tool_calls, content=None, **extra) -> dict:
        return {"role": "assistant", "content": content, "tool_calls": list(tool_calls), **extra}

    def tool(cid: str, content) -> dict:
        return {"role": "tool", "tool_call_id": cid, "content": content}

    sys_msg = {"role": "system", "content": "You are a helpful assistant with tools."}
    u_weather = {"role": "user", "content": "What's the weather in Paris and in 東京?"}
    w_args = '{"city": "Paris", "units": "celsius"}'
    w_result = '{"temperature": 18.5, "conditions": "cloudy"}'
    weather_turn = [sys_msg, u_weather, calls(call("call_1", "get_weather", w_args)), tool("call_1", w_result)]
    W = W_SMALL

    # -- Chat Completions: tool definitions
    chat("chat-tools-schema", [sys_msg, u_weather], tools=[WEATHER_TOOL, SEARCH_TOOL])
    chat("chat-tools-no-system", [u_weather], tools=[WEATHER_TOOL])
    chat("chat-tools-no-description", [u_weather], tools=[{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    chat("chat-tools-no-parameters", [u_weather], tools=[{"type": "function", "function": {
        "name": "get_time", "description": "Current UTC time."}}, {"type": "function", "function": {
            "name": "ping"}}])
    chat("chat-tools-strict", [u_weather], tools=[{"type": "function", "function": {
        "name": "get_weather", "description": "Weather.", "strict": True, "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
            "additionalProperties": False}}}])
    chat("chat-tools-strict-false", [u_weather], tools=[{"type": "function", "function": {
        "name": "get_weather", "description": "Weather.", "strict": False, "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}])
    chat("chat-tools-extra-keys", [u_weather], tools=[{"type": "function", "strict": True, "x-vendor": 1,
                                                       "function": {"name": "get_weather", "description": "Weather.",
                                                                    "parameters": {"type": "object"},
                                                                    "x-extra": {"a": 1}, "examples": ["Paris"]}}])
    chat("chat-tools-defer-loading", [u_weather], tools=[
        READ_TOOL,
        {"type": "function", "defer_loading": True, "function": {"name": "get_weather", "description": "Weather.",
                                                                 "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time", "description": "Time.", "defer_loading": True}},
        {"type": "function", "defer_loading": False, "function": {"name": "ping", "defer_loading": True}}])
    unusual_order = {"required": ["b", "a"], "properties": {"b": {"type": "string"}, "a": {"type": "integer"}},
                     "type": "object"}
    chat("chat-tools-key-order", [u_weather], tools=[{"function": {
        "parameters": unusual_order, "description": "Keys in unusual order.", "name": "ordered"}, "type": "function"}])
    chat("chat-tools-empty-list", [u_weather], tools=[])
    chat("chat-tools-custom-type", [u_weather], tools=[{"type": "custom", "custom": {
        "name": "apply_patch", "description": "Apply a patch.", "format": {"type": "text"}}}])
    chat("chat-tools-no-tool-turns", [sys_msg, {"role": "user", "content": "Hi!"},
                                      {"role": "assistant", "content": "Hello! How can I help?"},
                                      {"role": "user", "content": "Tell me a joke."}], tools=[W, READ_TOOL])
    # -- tool_choice
    for choice, label in (("none", "none"), ("auto", "auto"), ("required", "required"),
                          ({"type": "function", "function": {"name": "get_weather"}}, "named"),
                          ({"type": "function", "function": {"name": "no_such_tool"}}, "named-unknown")):
        chat(f"chat-tool-choice-{label}", [u_weather], tools=[W, READ_TOOL], tool_choice=choice)
    chat("chat-tool-choice-required-no-tools", [u_weather], tool_choice="required")
    chat("chat-tool-choice-named-no-tools", [u_weather],
         tool_choice={"type": "function", "function": {"name": "get_weather"}})
    chat("chat-tool-choice-none-no-tools", [u_weather], tool_choice="none")
    chat("chat-parallel-tool-calls-false", [u_weather], tools=[W], parallel_tool_calls=False)

    # -- Chat Completions: assistant tool calls and tool messages
    chat("chat-tool-call", weather_turn, tools=[WEATHER_TOOL])
    chat("chat-tool-call-no-tools", weather_turn)
    chat("chat-tool-call-final-answer", weather_turn + [
        {"role": "assistant", "content": "It is 18.5 °C and cloudy in Paris."},
        {"role": "user", "content": "Thanks! And tomorrow?"}], tools=[W])
    chat("chat-tool-call-args-escapes", [u_weather, calls(call("call_1", "get_weather", ARGS_ESCAPES)),
                                         tool("call_1", "ok")], tools=[W])
    chat("chat-tool-call-args-numbers", [u_weather, calls(call("call_1", "get_weather", ARGS_NUMBERS)),
                                         tool("call_1", "ok")], tools=[W])
    nonfinite = '{"nan":NaN,"inf":Infinity,"ninf":-Infinity,"overflow":1e400}'
    chat("chat-tool-call-args-nonfinite", [u_weather, calls(call("call_1", "get_weather", nonfinite)),
                                           tool("call_1", "ok")], tools=[W])
    chat("chat-tool-call-args-duplicate-keys-whitespace", [u_weather, calls(call(
        "call_1", "get_weather", '  {\n  "city" : "Paris" ,\n  "city" : "Lyon",\t"units":"celsius"\n}  ')),
        tool("call_1", "ok")], tools=[W])
    chat("chat-tool-call-args-empty-string", [u_weather, calls(call("call_1", "get_time", "")),
                                              tool("call_1", "12:00")], tools=[W])
    chat("chat-tool-call-args-empty-object", [u_weather, calls(call("call_1", "get_time", "{}")),
                                              tool("call_1", "12:00")], tools=[W])
    chat("chat-tool-call-args-invalid-json", [u_weather, calls(call("call_1", "get_weather", '{"city": "Par')),
                                              tool("call_1", "error: bad arguments")], tools=[W])
    chat("chat-tool-call-args-array", [u_weather, calls(call("call_1", "get_weather", '["Paris", "Tokyo"]')),
                                       tool("call_1", "ok")], tools=[W])
    chat("chat-tool-call-args-scalars", [u_weather, calls(call("call_1", "f", "42"), call("call_2", "g", "null"),
                                                          call("call_3", "h", '"text"'), call("call_4", "i", "true")),
                                         tool("call_1", "a"), tool("call_2", "b"), tool("call_3", "c"),
                                         tool("call_4", "d")], tools=[W])
    chat("chat-tool-call-args-object", [u_weather, calls(call("call_1", "get_weather", {"city": "Paris"})),
                                        tool("call_1", "ok")], tools=[W])
    chat("chat-tool-call-args-null", [u_weather, calls(call("call_1", "get_time", None)),
                                      tool("call_1", "ok")], tools=[W])
    chat("chat-tool-call-args-missing", [u_weather, calls({"id": "call_1", "type": "function",
                                                           "function": {"name": "get_time"}}),
                                         tool("call_1", "ok")], tools=[W])
    chat("chat-tool-call-no-type", [u_weather, calls({"id": "call_1", "function": {"name": "get_weather",
                                                                                   "arguments": w_args}}),
                                    tool("call_1", w_result)], tools=[W])
    chat("chat-tool-call-custom-type", [u_weather, calls({"id": "call_1", "type": "custom", "custom": {
        "name": "apply_patch", "input": "*** Begin Patch"}}), tool("call_1", "ok")])
    chat("chat-tool-calls-empty-list", [u_weather, {"role": "assistant", "content": "No tools needed.",
                                                    "tool_calls": []}, {"role": "user", "content": "OK."}],
         tools=[W])
    chat("chat-parallel-tool-calls", [sys_msg, u_weather, calls(
        call("call_a", "get_weather", '{"city": "Paris"}'), call("call_b", "get_weather", '{"city": "東京"}'),
        call("call_c", "get_time", "{}")),
        tool("call_a", '{"temperature": 18.5}'), tool("call_b", '{"temperature": 22.0}'), tool("call_c", "12:00Z")],
        tools=[W])
    chat("chat-tool-content-parts", [u_weather, calls(call("call_1", "get_weather", w_args)),
                                     tool("call_1", [{"type": "text", "text": "line one"},
                                                     {"type": "text", "text": "line two"}])], tools=[W])
    chat("chat-tool-content-empty", [u_weather, calls(call("call_1", "get_weather", w_args)), tool("call_1", ""),
                                     calls(call("call_2", "get_weather", w_args)), tool("call_2", [])],
         tools=[W])
    chat("chat-tool-message-name", [u_weather, calls(call("call_1", "get_weather", w_args)),
                                    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                                     "content": w_result}], tools=[W])
    chat("chat-assistant-content-and-tool-calls", [u_weather, calls(
        call("call_1", "get_weather", w_args), call("call_2", "get_weather", '{"city": "東京"}'),
        content="Let me check both cities."), tool("call_1", w_result), tool("call_2", w_result)],
        tools=[W])
    chat("chat-assistant-empty-content-and-tool-calls", [u_weather, calls(
        call("call_1", "get_weather", w_args), content=""), tool("call_1", w_result)], tools=[W])
    chat("chat-reasoning-then-tool-calls", [u_weather, calls(
        call("call_1", "get_weather", w_args), reasoning="The user wants the weather; call the tool first."),
        tool("call_1", w_result)], tools=[W])
    chat("chat-reasoning-then-tool-calls-final-user", [u_weather, calls(
        call("call_1", "get_weather", w_args), reasoning="Call the tool first."), tool("call_1", w_result),
        {"role": "assistant", "content": "18.5 °C.", "reasoning": "Answer briefly."},
        {"role": "user", "content": "Thanks."}], tools=[W])
    chat("chat-reasoning-content-field", [u_weather, calls(
        call("call_1", "get_weather", w_args), reasoning_content="Given as reasoning_content."),
        tool("call_1", w_result)], tools=[W])
    chat("chat-reasoning-both-fields", [u_weather, calls(
        call("call_1", "get_weather", w_args), reasoning="Given as reasoning.",
        reasoning_content="Given as reasoning_content."), tool("call_1", w_result)], tools=[W])
    chat("chat-think-tags-in-content", [u_weather, calls(
        call("call_1", "get_weather", w_args), content="<think>\nInline reasoning.\n</think>\n\nChecking."),
        tool("call_1", w_result)], tools=[W])
    loop = [
        {"role": "system", "content": "You are a coding agent. Use the tools to inspect and change the repository."},
        {"role": "user", "content": "The tests fail. Find out why and fix it."},
        calls(call("call_1", "run_command", '{"command": "cargo test 2>&1 | tail -20"}'),
              reasoning="Run the tests first to see the failure."),
        tool("call_1", "test parse::tests::empty ... FAILED\nthread 'parse::tests::empty' panicked at src/parse.rs:42:9"),
        calls(call("call_2", "read_file", '{"path": "src/parse.rs"}'), content="The parser panics on empty input."),
        tool("call_2", "pub fn parse(s: &str) -> Vec<&str> {\n    let first = s.split(',').next().unwrap();\n"
                       "    vec![first]\n}\n"),
        calls(call("call_3", "run_command", '{"command": "grep -rn \\"parse(\\" src/ | head", "timeout": 10}'),
              call("call_4", "read_file", '{"path": "src/lib.rs"}')),
        tool("call_3", "src/lib.rs:7:    parse(&input)"),
        tool("call_4", [{"type": "text", "text": "mod parse;"}, {"type": "text", "text": "pub use parse::parse;"}]),
        calls(call("call_5", "run_command", '{"command": "sed -i \'s/unwrap()/unwrap_or(\\"\\")/\' src/parse.rs && cargo test"}')),
        tool("call_5", "test result: ok. 12 passed; 0 failed"),
        {"role": "assistant", "content": "Fixed: `parse` no longer unwraps on empty input; all 12 tests pass."},
        {"role": "user", "content": "Great, now add a test for it."}]
    chat("chat-agent-loop", loop, tools=[RUN_TOOL, READ_TOOL])
    chat("chat-agent-loop-mid", loop[:9], tools=[RUN_TOOL, READ_TOOL])
    chat("chat-developer-with-tools", [{"role": "developer", "content": "Prefer metric units."}, u_weather,
                                       calls(call("call_1", "get_weather", w_args)), tool("call_1", w_result)],
         tools=[W])
    chat("chat-system-mid-with-tools", [sys_msg, u_weather, calls(call("call_1", "get_weather", w_args)),
                                        tool("call_1", w_result),
                                        {"role": "system", "content": "Reminder: answer in French."}],
         tools=[W])
    chat("chat-user-looks-like-tool-response", [
        u_weather, calls(call("call_1", "get_weather", w_args), reasoning="Call the tool."),
        {"role": "user", "content": "<tool_response>\n18 °C\n</tool_response>"}], tools=[W])

    # -- Anthropic Messages
    a_bash = {"name": "Bash", "description": "Executes a given bash command and returns its output. "
                                             "Quote paths with spaces: cd \"/path with spaces\" && ls <dir>.",
              "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                               "properties": {"command": {"type": "string", "description": "The command to execute"},
                                              "timeout": {"type": "number", "description": "Optional timeout in ms (max 600000)"},
                                              "description": {"type": "string"},
                                              "run_in_background": {"type": "boolean"}},
                               "required": ["command"], "additionalProperties": False}}
    a_read = {"name": "Read", "description": "Reads a file from the local filesystem.",
              "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                               "properties": {"file_path": {"type": "string"},
                                              "offset": {"type": "integer", "exclusiveMinimum": 0},
                                              "limit": {"type": "integer", "exclusiveMinimum": 0}},
                               "required": ["file_path"], "additionalProperties": False}}
    a_edit = {"name": "Edit", "description": "Performs exact string replacements in files.",
              "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                               "properties": {"file_path": {"type": "string"}, "old_string": {"type": "string"},
                                              "new_string": {"type": "string"},
                                              "replace_all": {"type": "boolean", "default": False}},
                               "required": ["file_path", "old_string", "new_string"], "additionalProperties": False},
              "cache_control": {"type": "ephemeral"}}
    a_weather = {"name": "get_weather", "description": "Get the weather <city> & more; ±0.5 °C, 東京 🌦️.",
                 "input_schema": {"type": "object", "properties": {
                     "city": {"type": "string"}, "days": {"type": "integer", "default": 1},
                     "ratio": {"type": "number", "default": 0.5}, "scale": {"type": "number", "default": 1.0},
                     "eps": {"type": "number", "default": 1e-05}}, "required": ["city"]}}
    a_sys = [{"type": "text", "text": "You are a helpful assistant with tools."},
             {"type": "text", "text": "Be concise.", "cache_control": {"type": "ephemeral"}}]
    au = {"role": "user", "content": "What's the weather in Paris?"}

    def tool_use(tid: str, name: str, input_: dict) -> dict:
        return {"type": "tool_use", "id": tid, "name": name, "input": input_}

    def result(tid: str, content=None, **extra) -> dict:
        b = {"type": "tool_result", "tool_use_id": tid, **extra}
        if content is not None:
            b["content"] = content
        return b

    a_call = {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                               tool_use("toolu_01", "get_weather", {"city": "Paris"})]}
    msgs("msg-tools-schema", [au], system=a_sys, tools=[a_weather, a_bash, a_read, a_edit])
    msgs("msg-tools-schema-no-type", [au], tools=[{"name": "get_weather", "description": "Weather.",
                                                   "input_schema": {"properties": {"city": {"type": "string"}},
                                                                    "required": ["city"]}},
                                                  {"name": "noop", "input_schema": {}}])
    msgs("msg-tools-no-description", [au], tools=[{"name": "get_weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}}}])
    msgs("msg-tools-strict", [au], tools=[dict(a_weather, strict=True)])
    msgs("msg-tools-custom-type", [au], tools=[dict(a_weather, type="custom")])
    msgs("msg-tools-defer-loading", [au], tools=[a_read, dict(a_weather, defer_loading=True)])
    msgs("msg-tools-server-web-search", [au], tools=[a_weather, {"type": "web_search_20250305", "name": "web_search",
                                                                 "max_uses": 3}])
    msgs("msg-tools-server-bash", [au], tools=[{"type": "bash_20250124", "name": "bash"}])
    for choice, label in (({"type": "auto"}, "auto"), ({"type": "any"}, "any"),
                          ({"type": "tool", "name": "get_weather"}, "tool"), ({"type": "none"}, "none"),
                          ({"type": "auto", "disable_parallel_tool_use": True}, "auto-no-parallel"),
                          ({"type": "tool", "name": "no_such_tool"}, "tool-unknown")):
        msgs(f"msg-tool-choice-{label}", [au], tools=[a_weather, a_read], tool_choice=choice)
    msgs("msg-tool-choice-any-no-tools", [au], tool_choice={"type": "any"})
    msgs("msg-tool-use", [au, a_call, {"role": "user", "content": [
        result("toolu_01", '{"temperature": 18.5, "conditions": "cloudy"}')]}], system=a_sys, tools=[a_weather])
    msgs("msg-tool-use-no-text", [au, {"role": "assistant", "content": [
        tool_use("toolu_01", "get_weather", {"city": "Paris"})]},
        {"role": "user", "content": [result("toolu_01", "18.5 °C")]}], tools=[a_weather])
    msgs("msg-tool-use-several", [
        {"role": "user", "content": "Weather in Paris, 東京 and Zürich?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "I'll check all three."},
            tool_use("toolu_01", "get_weather", {"city": "Paris"}),
            tool_use("toolu_02", "get_weather", {"city": "東京", "days": 2}),
            tool_use("toolu_03", "get_weather", {"city": "Zürich", "ratio": 0.25, "scale": 1.0})]},
        {"role": "user", "content": [
            result("toolu_01", "18.5 °C"),
            result("toolu_02", [{"type": "text", "text": "22 °C"}, {"type": "text", "text": "humid"}]),
            result("toolu_03", "Error: upstream timeout <504>", is_error=True)]}], tools=[a_weather])
    msgs("msg-tool-result-empty", [au, {"role": "assistant", "content": [
        tool_use("toolu_01", "get_weather", {"city": "Paris"}), tool_use("toolu_02", "get_weather", {"city": "Lyon"}),
        tool_use("toolu_03", "get_weather", {"city": "Nice"})]},
        {"role": "user", "content": [result("toolu_01", ""), result("toolu_02", []), result("toolu_03")]}],
        tools=[a_weather])
    msgs("msg-tool-result-then-text", [au, a_call, {"role": "user", "content": [
        result("toolu_01", "18.5 °C"), {"type": "text", "text": "Also, is that warm for May?"}]}], tools=[a_weather])
    msgs("msg-text-then-tool-result", [au, a_call, {"role": "user", "content": [
        {"type": "text", "text": "Here is the result:"}, result("toolu_01", "18.5 °C"),
        {"type": "text", "text": "Is that warm?"}]}], tools=[a_weather])
    msgs("msg-tool-use-input-values", [au, {"role": "assistant", "content": [tool_use("toolu_01", "get_weather", {
        "city": "São Paulo <SP> & \"Brazil\"", "days": 3, "ratio": 0.5, "scale": 1.0, "eps": 1e-05, "big": 1e20,
        "i53": 9007199254740993, "nested": {"z": [1, 2.5, None, True], "a": "東京 🦀\n\t\u0001"}})]},
        {"role": "user", "content": [result("toolu_01", "ok")]}], tools=[a_weather])
    msgs("msg-tool-use-empty-input", [au, {"role": "assistant", "content": [
        tool_use("toolu_01", "get_time", {}), {"type": "tool_use", "id": "toolu_02", "name": "get_time"}]},
        {"role": "user", "content": [result("toolu_01", "12:00"), result("toolu_02", "12:00")]}], tools=[a_weather])
    msgs("msg-thinking-then-tool-use", [au, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The user wants the weather; call get_weather.", "signature": "c2ln"},
        {"type": "text", "text": "Let me check."}, tool_use("toolu_01", "get_weather", {"city": "Paris"})]},
        {"role": "user", "content": [result("toolu_01", "18.5 °C")]}], tools=[a_weather])
    msgs("msg-thinking-then-tool-use-final-user", [au, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Call get_weather.", "signature": "c2ln"},
        tool_use("toolu_01", "get_weather", {"city": "Paris"})]},
        {"role": "user", "content": [result("toolu_01", "18.5 °C")]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Answer.", "signature": "c2ln"},
                                          {"type": "text", "text": "18.5 °C in Paris."}]},
        {"role": "user", "content": "Thanks!"}], tools=[a_weather])
    msgs("msg-redacted-thinking-then-tool-use", [au, {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}, tool_use("toolu_01", "get_weather", {"city": "Paris"})]},
        {"role": "user", "content": [result("toolu_01", "18.5 °C")]}], tools=[a_weather])
    msgs("msg-tool-result-in-assistant", [au, {"role": "assistant", "content": [
        {"type": "text", "text": "Checked."}, result("toolu_01", "18.5 °C"),
        result("toolu_02", [{"type": "text", "text": "humid"}])]}, {"role": "user", "content": "And?"}],
        tools=[a_weather])
    msgs("msg-tool-reference", [
        {"role": "user", "content": "Find a tool to read files."},
        {"role": "assistant", "content": [tool_use("toolu_01", "ToolSearch", {"query": "read files"})]},
        {"role": "user", "content": [result("toolu_01", [{"type": "tool_reference", "tool_name": "Read"}]),
                                     {"type": "text", "text": "Use it."}]}], tools=[a_read])
    msgs("msg-tool-reference-with-text", [au, {"role": "assistant", "content": [
        tool_use("toolu_01", "ToolSearch", {"query": "weather"})]},
        {"role": "user", "content": [result("toolu_01", [{"type": "text", "text": "Found 1 tool."},
                                                         {"type": "tool_reference", "tool_name": "get_weather"}])]}],
        tools=[dict(a_weather, defer_loading=True)])
    msgs("msg-tool-addition", [{"role": "system", "content": [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "get_weather"}}]}, au],
        tools=[a_read, dict(a_weather, defer_loading=True)])
    msgs("msg-tool-result-image", [au, a_call, {"role": "user", "content": [result("toolu_01", [
        {"type": "text", "text": "chart:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}])]}],
        tools=[a_weather])
    cc_sys = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cc_entrypoint=sdk-cli; cch=00000;"},
              {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
               "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks.",
               "cache_control": {"type": "ephemeral"}}]
    cc = [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nAs you answer the user's questions, you can use the following "
                                     "context:\n# important-instruction-reminders\nDo what has been asked; nothing more."
                                     "\n</system-reminder>\n"},
            {"type": "text", "text": "Fix the typo in README.md", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Look at the files first.", "signature": "c2ln"},
            tool_use("toolu_01A", "Bash", {"command": "ls -la", "description": "List files"})]},
        {"role": "user", "content": [result("toolu_01A", "total 16\n-rw-r--r-- 1 u u 120 README.md\n"
                                                         "-rw-r--r-- 1 u u 300 main.py")]},
        {"role": "assistant", "content": [tool_use("toolu_02B", "Read", {"file_path": "/repo/README.md"})]},
        {"role": "user", "content": [result("toolu_02B", [{"type": "text", "text": "     1\t# Teh project\n     2\t"
                                                                                   "\n     3\tRun `python main.py`.\n"}]),
                                     {"type": "text", "text": "<system-reminder>\nThe file is short.\n</system-reminder>"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Line 1 says \"Teh\"; fixing it."},
            tool_use("toolu_03C", "Edit", {"file_path": "/repo/README.md", "old_string": "# Teh project",
                                            "new_string": "# The project", "replace_all": False})]},
        {"role": "user", "content": [result("toolu_03C", "The file /repo/README.md has been updated. Here's the result "
                                                         "of running `cat -n`:\n     1\t# The project")]},
        {"role": "assistant", "content": [
            tool_use("toolu_04D", "Bash", {"command": "git diff --stat", "description": "Show diff"}),
            tool_use("toolu_05E", "Read", {"file_path": "/repo/main.py", "offset": 1, "limit": 20})]},
        {"role": "user", "content": [result("toolu_04D", " README.md | 2 +-\n 1 file changed"),
                                     result("toolu_05E", "     1\tprint('hi')\n", is_error=False)]},
        {"role": "assistant", "content": [{"type": "text", "text": "Fixed the typo: \"Teh\" → \"The\" in README.md."}]},
        {"role": "user", "content": [{"type": "text", "text": "Now commit it."}]}]
    msgs("msg-claude-code-loop", cc, system=cc_sys, tools=[a_bash, a_read, a_edit])
    msgs("msg-claude-code-loop-mid", cc[:7], system=cc_sys, tools=[a_bash, a_read, a_edit])

    # -- OpenAI Responses
    r_weather = {"type": "function", "name": "get_weather", "description": WEATHER_TOOL["function"]["description"],
                 "parameters": WEATHER_TOOL["function"]["parameters"], "strict": False}
    r_shell = {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
               "strict": False, "parameters": {"type": "object", "properties": {
                   "command": {"type": "array", "items": {"type": "string"}, "description": "The command to execute"},
                   "workdir": {"type": "string"}, "timeout_ms": {"type": "number"}},
                   "required": ["command"], "additionalProperties": False}}
    r_small = dict(W_SMALL["function"], type="function", strict=False)
    ru = {"role": "user", "content": "What's the weather in Paris?"}

    def fcall(cid: str, name: str, arguments: str, **extra) -> dict:
        return {"type": "function_call", "call_id": cid, "name": name, "arguments": arguments, **extra}

    def fout(cid: str, output) -> dict:
        return {"type": "function_call_output", "call_id": cid, "output": output}

    resp("resp-tools-function", [ru], tools=[r_weather, dict(SEARCH_TOOL["function"], type="function")],
         instructions="You are a helpful assistant with tools.")
    resp("resp-tools-no-description", "Weather in Paris?", tools=[{"type": "function", "name": "get_weather",
                                                                   "parameters": {"type": "object"}}])
    resp("resp-tools-null-parameters", "What time is it?", tools=[{"type": "function", "name": "get_time",
                                                                   "description": "Time.", "parameters": None,
                                                                   "strict": None}])
    resp("resp-tools-strict", "Weather in Paris?", tools=[{"type": "function", "name": "get_weather",
                                                           "description": "Weather.", "strict": True, "parameters": {
                                                               "type": "object", "properties": {"city": {"type": "string"}},
                                                               "required": ["city"], "additionalProperties": False}}])
    resp("resp-tools-defer-loading", "Weather in Paris?", tools=[dict(r_small, defer_loading=True)])
    resp("resp-function-call", [ru, fcall("call_1", "get_weather", '{"city":"Paris"}'),
                                fout("call_1", '{"temperature": 18.5}')], tools=[r_small])
    resp("resp-function-call-sdk-echo", [ru, fcall("call_1", "get_weather", '{"city":"Paris"}', id="fc_abc123",
                                                   status="completed"),
                                         {"type": "function_call_output", "call_id": "call_1", "id": "fco_1",
                                          "status": "completed", "output": "18.5 °C"}], tools=[r_small])
    resp("resp-function-call-output-list", [ru, fcall("call_1", "get_weather", '{"city":"Paris"}'),
                                            fout("call_1", [{"type": "input_text", "text": "18.5 °C"},
                                                            {"type": "input_text", "text": "cloudy"}])],
         tools=[r_small])
    resp("resp-function-call-args-escapes", [ru, fcall("call_1", "get_weather", ARGS_ESCAPES), fout("call_1", "ok")],
         tools=[r_small])
    resp("resp-function-call-args-invalid", [ru, fcall("call_1", "get_weather", '{"city": '),
                                             fout("call_1", "bad"), fcall("call_2", "get_weather", ""),
                                             fout("call_2", "empty")], tools=[r_small])
    resp("resp-parallel-function-calls", [ru, fcall("call_1", "get_weather", '{"city":"Paris"}'),
                                          fcall("call_2", "get_weather", '{"city":"東京"}'),
                                          fout("call_1", "18.5 °C"), fout("call_2", "22 °C")], tools=[r_small])
    resp("resp-message-then-function-call", [ru, {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "Let me check.", "annotations": []}]},
        fcall("call_1", "get_weather", '{"city":"Paris"}'), fout("call_1", "18.5 °C")], tools=[r_small])
    resp("resp-reasoning-function-call", [ru, {"type": "reasoning", "id": "rs_1", "summary": [], "content": [
        {"type": "reasoning_text", "text": "Call get_weather for Paris."}]},
        fcall("call_1", "get_weather", '{"city":"Paris"}'), fout("call_1", "18.5 °C")], tools=[r_small])
    resp("resp-reasoning-summary-function-call", [ru, {"type": "reasoning", "id": "rs_1", "summary": [
        {"type": "summary_text", "text": "**Checking weather**"}]},
        fcall("call_1", "get_weather", '{"city":"Paris"}'), fout("call_1", "18.5 °C")], tools=[r_small])
    resp("resp-function-call-then-reasoning", [ru, fcall("call_1", "get_weather", '{"city":"Paris"}'),
                                               {"type": "reasoning", "id": "rs_1", "summary": [], "content": [
                                                   {"type": "reasoning_text", "text": "After the call."}]},
                                               fout("call_1", "18.5 °C")], tools=[r_small])
    resp("resp-reasoning-encrypted", [ru, {"type": "reasoning", "id": "rs_1", "summary": [],
                                           "encrypted_content": "gAAAAB..."},
                                      fcall("call_1", "get_weather", '{"city":"Paris"}'), fout("call_1", "18.5 °C")],
         tools=[r_small])
    for choice, label in (("none", "none"), ("auto", "auto"), ("required", "required"),
                          ({"type": "function", "name": "get_weather"}, "named"),
                          ({"type": "function", "name": "no_such_tool"}, "named-unknown")):
        resp(f"resp-tool-choice-{label}", [ru], tools=[r_small, r_shell], tool_choice=choice)
    resp("resp-tools-namespace", [ru, fcall("call_1", "read", '{"path":"notes.md"}', namespace="mcp__files"),
                                  fout("call_1", "# Notes")], tools=[r_small, {
                                      "type": "namespace", "name": "mcp__files", "description": "Files on the MCP server.",
                                      "tools": [{"type": "function", "name": "read", "description": "Read a file.",
                                                 "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                                "required": ["path"]}, "strict": False},
                                                {"type": "function", "name": "list", "description": None,
                                                 "parameters": None}]}])
    resp("resp-tools-custom", [{"role": "user", "content": "Rename foo to bar in a.py."},
                               {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch",
                                "input": "*** Begin Patch\n*** Update File: a.py\n-foo()\n+bar()\n*** End Patch\n"},
                               {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done!"}],
         tools=[r_shell, {"type": "custom", "name": "apply_patch", "description": "Use the `apply_patch` tool to edit files.",
                          "format": {"type": "grammar", "syntax": "lark",
                                     "definition": "start: begin_patch hunk+ end_patch\nbegin_patch: \"*** Begin Patch\" LF"}}])
    resp("resp-custom-tool-call", [{"role": "user", "content": "Rename foo to bar in a.py."},
                                   {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch",
                                    "input": "*** Begin Patch\n*** Update File: a.py\n-foo()\n+bar()\n*** End Patch\n"},
                                   {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done!"}],
         tools=[r_shell, {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
                          "format": {"type": "text"}}])
    resp("resp-tools-custom-text-format", "Write a note.", tools=[{"type": "custom", "name": "note",
                                                                  "format": {"type": "text"}}])
    for label, t in (("web-search", {"type": "web_search"}),
                     ("web-search-preview", {"type": "web_search_preview", "search_context_size": "medium"}),
                     ("local-shell", {"type": "local_shell"}),
                     ("image-generation", {"type": "image_generation"}),
                     ("file-search", {"type": "file_search", "vector_store_ids": ["vs_1"]}),
                     ("mcp", {"type": "mcp", "server_label": "docs", "server_url": "http://127.0.0.1:9/mcp",
                              "require_approval": "never"})):
        resp(f"resp-tools-{label}", [ru], tools=[r_small, t])
    resp("resp-tools-web-search-only", [ru], tools=[{"type": "web_search"}])
    codex_instr = ("You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI on a user's "
                   "computer.\n\n## General\n\n- Prefer `rg` over `grep`.")
    codex = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text":
            "<permissions instructions>\nFilesystem sandboxing: workspace-write. Network access is restricted."
            "\n</permissions instructions>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text":
            "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\nRun `make test` before finishing.\n</INSTRUCTIONS>"},
            {"type": "input_text", "text": "<environment_context>\n  <cwd>/repo</cwd>\n  <shell>bash</shell>\n"
                                           "</environment_context>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Why does `make test` fail?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "**Running the tests**"}],
         "content": [{"type": "reasoning_text", "text": "Run make test to see the failure."}]},
        fcall("call_A", "shell", '{"command":["bash","-lc","make test"],"workdir":"/repo","timeout_ms":120000}'),
        fout("call_A", '{"output":"FAIL: test_add (expected 3, got 4)\\n","metadata":{"exit_code":2,"duration_seconds":0.4}}'),
        fcall("call_B", "shell", '{"command":["bash","-lc","rg -n \\"def add\\" src"],"workdir":"/repo"}'),
        fout("call_B", "src/calc.py:1:def add(a, b): return a + b + 1"),
        {"type": "custom_tool_call", "call_id": "call_C", "name": "apply_patch",
         "input": "*** Begin Patch\n*** Update File: src/calc.py\n-def add(a, b): return a + b + 1\n"
                  "+def add(a, b): return a + b\n*** End Patch\n"},
        {"type": "custom_tool_call_output", "call_id": "call_C", "output": "Success. Updated the following files:\nM src/calc.py\n"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text":
            "`add` added 1 to the sum; fixed in src/calc.py.", "annotations": []}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run the tests again."}]}]
    codex_tools = [r_shell, {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
                             "format": {"type": "text"}},
                   {"type": "function", "name": "update_plan", "description": "Updates the task plan.", "strict": False,
                    "parameters": {"type": "object", "properties": {
                        "explanation": {"type": "string"},
                        "plan": {"type": "array", "items": {"type": "object", "properties": {
                            "step": {"type": "string"}, "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}},
                            "required": ["step", "status"], "additionalProperties": False}}},
                        "required": ["plan"], "additionalProperties": False}},
                   {"type": "web_search"}]
    resp("resp-codex-loop", codex, instructions=codex_instr, tools=codex_tools, tool_choice="auto",
         parallel_tool_calls=False, store=False, include=[], prompt_cache_key="0199aaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
         reasoning={"effort": "medium", "summary": "auto"})
    resp("resp-codex-loop-mid", codex[:6], instructions=codex_instr, tools=codex_tools, tool_choice="auto",
         parallel_tool_calls=False, store=False, include=[])
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
                     "chat_template_kwargs", "reasoning_effort", "tools"),
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

SETS = {"corpus": {"cases": cases, "out": ROOT / "tests" / "data" / "render" / "corpus.json", "template": None},
        "tools": {"cases": tool_cases, "out": ROOT / "tests" / "data" / "render" / "tools.json",
                  "template": ROOT / "tests" / "data" / "render" / "qwen3.jinja"}}


def load_cases(path: Path) -> list[dict]:
    """Requests from a file: a list of {name, api, body, ...} or a corpus
    document. Keys other than vLLM's answers (token_ids, prompt, error,
    served_*, tokenize_*) are kept, after name, api and body."""
    doc = json.loads(path.read_text())
    entries = doc["entries"] if isinstance(doc, dict) else doc
    answers = ("token_ids", "prompt", "error", "served_", "tokenize_")
    return [{"name": e["name"], "api": e["api"], "body": e["body"],
             **{k: v for k, v in e.items() if k not in ("name", "api", "body") and not k.startswith(answers)}}
            for e in entries]


def rel(p: Path) -> str:
    p = p.resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name


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
    ap.add_argument("--set", choices=sorted(SETS), default="corpus",
                    help="which requests: corpus (no tools, the byte model's template) or tools (tool-using "
                         "requests, by default with tests/data/render/qwen3.jinja and the hermes tool parser)")
    ap.add_argument("--cases-from", type=Path,
                    help="render these requests instead of a --set: a JSON list of {name, api, body}, or a corpus "
                         "file (its entries' name, api and body), e.g. capture_agents.py's output; "
                         "served with the hermes tool parser unless --tool-call-parser none")
    ap.add_argument("--out", type=Path, help="default: tests/data/render/corpus.json or tools.json (by --set)")
    ap.add_argument("--port", type=int, default=18401)
    ap.add_argument("--block-size", type=int, default=32, help="the CPU build takes multiples of 32 only")
    ap.add_argument("--max-model-len", type=int, default=4096,
                    help="also make_model.py's --max-len: 4096 gives conf/byte-model's tokenizer_config.json "
                         "(agents' requests need more, e.g. 131072)")
    ap.add_argument("--kv-space-gib", type=float, default=1, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--chat-template", type=Path,
                    help="serve this template instead of conf/byte-model's (e.g. tests/data/render/fields.jinja, "
                         "which prints every field a message and the request hand the template); "
                         "--set tools defaults to tests/data/render/qwen3.jinja")
    ap.add_argument("--tool-call-parser",
                    help="serve with --enable-auto-tool-choice --tool-call-parser NAME (default: hermes for "
                         "--set tools and --cases-from, none for --set corpus)")
    ap.add_argument("--tokenize", action=argparse.BooleanOptionalAction,
                    help="also compare POST /tokenize's ids (default: only for --set corpus; /tokenize drops the "
                         "tool_calls of an assistant message with content null and skips tool_choice checks, see "
                         "tests/data/render/README.md)")
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args()
    if a.cases_from:
        corpus = load_cases(a.cases_from)
        if a.out is None:
            ap.error("--cases-from needs --out")
    else:
        corpus = SETS[a.set]["cases"]()
        a.out = a.out or SETS[a.set]["out"]
        a.chat_template = a.chat_template or SETS[a.set]["template"]
    if a.tokenize is None:
        a.tokenize = not a.cases_from and a.set == "corpus"
    if a.tool_call_parser is None:
        a.tool_call_parser = "hermes" if a.cases_from or a.set != "corpus" else "none"
    server_flags = ["--enable-scale-out", "--enable-log-requests"]
    if a.tool_call_parser != "none":
        server_flags += ["--enable-auto-tool-choice", "--tool-call-parser", a.tool_call_parser]

    import vllm
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(ROOT / "conf" / "byte-model" / "tokenizer.json"))
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
        argv = vllm_argv(a, model_dir, a.port) + server_flags
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
            if a.tokenize and (api == "chat" or isinstance(case["body"].get("prompt"), str)):
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
                     + (f"; chat template: {rel(a.chat_template)}" if a.chat_template else ""),
        "how": f"token_ids: the render endpoints of `vllm.entrypoints.openai.api_server {' '.join(server_flags)}` "
               "(/v1/chat/completions/render, /v1/completions/render, /v1/messages/render, /v1/responses/render); "
               "each checked against the prompt_token_ids the real endpoint logged "
               "(--enable-log-requests, VLLM_LOGGING_LEVEL=DEBUG)"
               + (" and, for chat and string-prompt completions, POST /tokenize" if a.tokenize else "")
               + ". Made by bench/vllm-real/render_corpus.py "
               + (f"--cases-from {rel(a.cases_from)}" if a.cases_from else f"--set {a.set}")
               + f" --max-model-len {a.max_model_len}.",
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
