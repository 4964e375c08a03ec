"""Drive the gateway's Messages API with the official Anthropic Python SDK and
print what the SDK saw, as one JSON object (tests/sdk_agents.rs asserts on it).

usage: anthropic_messages.py BASE_URL MODEL session
       anthropic_messages.py BASE_URL MODEL auth KEY
       anthropic_messages.py BASE_URL MODEL overloaded
"""
import argparse
import json
import time

import anthropic

# Long enough to fill several KV blocks, so that later turns hit the cache.
SYSTEM = "You are the agent. You remember this. " * 20


def client(base, key="unused", max_retries=0):
    """A client with a bound on every request; retries off unless asked."""
    return anthropic.Anthropic(base_url=base, api_key=key, timeout=20, max_retries=max_retries)


def error(e):
    """The typed error the SDK raised, as the test compares it."""
    return {
        "type": type(e).__name__,
        "status": e.status_code,
        "retry_after": e.response.headers.get("retry-after"),
        "body": e.body,
    }


def ask(c, model):
    return c.messages.create(
        model=model, max_tokens=4, messages=[{"role": "user", "content": "hello"}]
    )


def session(base, model, args):
    """One conversation: three turns plain, three streamed, then the last
    prompt counted."""
    c, messages, turns = client(base), [], []
    for t in range(6):
        messages.append({"role": "user", "content": f"question {t}"})
        request = dict(model=model, max_tokens=4, system=SYSTEM, messages=messages)
        if t < 3:
            raw = c.messages.with_raw_response.create(**request)
            message, headers = raw.parse(), raw.headers
        else:
            with c.messages.stream(**request) as stream:
                events = [event.type for event in stream]
                message, headers = stream.get_final_message(), stream.response.headers
            assert events[0] == "message_start" and events[-1] == "message_stop", events
        turns.append(
            {
                "streamed": t >= 3,
                "backend": headers.get("x-poimen-backend"),
                "text": message.content[0].text,
                "stop_reason": message.stop_reason,
                "usage": message.usage.model_dump(),
            }
        )
        messages.append({"role": "assistant", "content": message.content[0].text})
    # The last turn's prompt, counted: as many tokens as that turn used.
    counted = c.messages.count_tokens(model=model, system=SYSTEM, messages=messages[:-1])
    return {"turns": turns, "count_tokens": counted.input_tokens}


def refusal(c, model):
    """The typed error a request gets, or None when it is served."""
    try:
        ask(c, model)
        return None
    except anthropic.APIStatusError as e:
        return error(e)


def auth(base, model, args):
    """A wrong key, the right one, then the right one again: over its
    tenant's budget of one request a minute."""
    wrong = refusal(client(base, key=args.key + "-wrong"), model)
    right = ask(client(base, key=args.key), model).content[0].text
    return {"wrong": wrong, "right": right, "limited": refusal(client(base, key=args.key), model)}


def overloaded(base, model, args):
    """While the gateway's only slot is taken: refused at once without
    retries; with the SDK's default retries, served once the slot frees."""
    refused = refusal(client(base), model)
    started = time.monotonic()
    retrying = client(base, max_retries=anthropic.DEFAULT_MAX_RETRIES)
    raw = retrying.messages.with_raw_response.create(
        model=model, max_tokens=4, messages=[{"role": "user", "content": "again"}]
    )
    return {
        "refused": refused,
        "retried": {
            "text": raw.parse().content[0].text,
            "retries_taken": raw.retries_taken,
            "seconds": time.monotonic() - started,
        },
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("model")
    modes = p.add_subparsers(dest="mode", required=True)
    modes.add_parser("session").set_defaults(run=session)
    a = modes.add_parser("auth")
    a.add_argument("key")
    a.set_defaults(run=auth)
    modes.add_parser("overloaded").set_defaults(run=overloaded)
    args = p.parse_args()
    print(json.dumps(args.run(args.base, args.model, args)))


main()
