"""Drive the gateway's Responses API with the official OpenAI Python SDK and
print what the SDK saw, as one JSON object (tests/sdk_agents.rs asserts on it).

usage: openai_responses.py BASE_URL MODEL create
       openai_responses.py BASE_URL MODEL chains TURNS KEY... [--after ID]
       openai_responses.py BASE_URL MODEL retrieve ID
KEY "-" is a keyless chain. Retries are off: a failed turn must show.
"""
import argparse
import json

import openai
from openai import OpenAI


def error(e):
    """The typed error the SDK raised, as the test compares it."""
    return {
        "type": type(e).__name__,
        "status": getattr(e, "status_code", None),
        "body": getattr(e, "body", None),
    }


def routed(raw):
    """The gateway's routing headers of a raw response."""
    return {
        "backend": raw.headers.get("x-poimen-backend"),
        "route": raw.headers.get("x-poimen-route"),
    }


def create(client, model, args):
    raw = client.responses.with_raw_response.create(
        model=model, input="hello", max_output_tokens=4
    )
    plain = raw.parse()
    types, text, completed = [], "", None
    for event in client.responses.create(
        model=model, input="hello again", max_output_tokens=4, stream=True
    ):
        types.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            completed = event.response
    return {
        "plain": {**routed(raw), "text": plain.output_text, "usage": plain.usage.model_dump()},
        "streamed": {
            "types": types,
            "text": text,
            "final_text": completed.output_text,
            "usage": completed.usage.model_dump(),
        },
    }


def chains(client, model, args):
    """One chain per key; a failed turn ends its chain and is reported."""
    out, failed = [], []
    for c, key in enumerate(args.keys):
        headers = {} if key == "-" else {"X-Poimen-Cache-Key": key}
        previous, turns = args.after, []
        for t in range(args.turns):
            extra = {"previous_response_id": previous} if previous else {}
            try:
                raw = client.responses.with_raw_response.create(
                    model=model,
                    input=f"chain {c} turn {t}",
                    max_output_tokens=4,
                    extra_headers=headers,
                    **extra,
                )
            except openai.APIError as e:
                failed.append({"chain": c, "turn": t, **error(e)})
                break
            response = raw.parse()
            previous = response.id
            turns.append({**routed(raw), "id": response.id, "response": response.model_dump()})
        out.append(turns)
    return {"chains": out, "failed": failed}


def retrieve(client, model, args):
    raw = client.responses.with_raw_response.retrieve(args.id)
    try:
        client.responses.cancel(args.id)
        cancel = None
    except openai.APIError as e:
        cancel = error(e)
    return {**routed(raw), "response": raw.parse().model_dump(), "cancel": cancel}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("model")
    modes = p.add_subparsers(dest="mode", required=True)
    modes.add_parser("create").set_defaults(run=create)
    c = modes.add_parser("chains")
    c.add_argument("turns", type=int)
    c.add_argument("keys", nargs="+")
    c.add_argument("--after", help="the response the chains continue")
    c.set_defaults(run=chains)
    r = modes.add_parser("retrieve")
    r.add_argument("id")
    r.set_defaults(run=retrieve)
    args = p.parse_args()
    client = OpenAI(base_url=args.base + "/v1", api_key="unused", max_retries=0, timeout=20)
    print(json.dumps(args.run(client, args.model, args)))


main()
