"""Stream one chat completion through the gateway with the official OpenAI
Python SDK and print what the SDK made of it, as one JSON object.

usage: openai_stream.py BASE_URL MODEL (plain|usage)
"""
import json
import sys

from openai import OpenAI

base, model, mode = sys.argv[1:4]
client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=20)
extra = {"stream_options": {"include_usage": True}} if mode == "usage" else {}
chunks = list(
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        max_tokens=4,
        **extra,
    )
)
print(
    json.dumps(
        {
            "content": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
            "chunks": len(chunks),
            "usage": [c.usage.model_dump() if c.usage else None for c in chunks],
        }
    )
)
