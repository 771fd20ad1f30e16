"""Per-request CPU of pricing a request whole and reading its cost exactly.

``python -m bench billable [--repeat N]``: microseconds per request, each measured
against its baseline in the same run (best of ``--repeat`` timings of 20,000 calls):

* **prepare**: what ``Router._build_request`` adds to price every billable field
  (``measure_messages`` + ``completion_cap`` + the worst case) against the previous
  text-only estimate (``estimate`` below, the old code verbatim), for a plain
  two-message chat and for one with tool definitions (``check_fields``; their size is
  the length the body's encoder already produced, not encoded again);
* **decode**: ``json.loads`` + ``pin_exact_cost`` (the cost's digits read from the
  text) against plain ``json.loads`` (the cost through a float's repr), for a whole
  completion body and for a stream's usage chunk, then ``to_decimal`` of ``usage.cost``.
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from provider_router._money import pin_exact_cost, to_decimal
from provider_router.catalog._billable import (
    check_fields,
    completion_cap,
    measure_messages,
)

CALLS = 20_000
MESSAGES = [
    {"role": "system", "content": "You are a careful assistant. " * 8},
    {"role": "user", "content": "Write a short answer about prices and routing. " * 6},
]
TOOLS = {
    "tools": [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "Looks a thing up. " * 10,
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
        for i in range(3)
    ]
}
USAGE = (
    '{"prompt_tokens":120,"completion_tokens":64,"total_tokens":184,"cost":0.0001958,'
    '"is_byok":false,"prompt_tokens_details":{"cached_tokens":0,"cache_write_tokens":0},'
    '"cost_details":{"upstream_inference_cost":0.0001958,"upstream_inference_prompt_cost":'
    '0.000054,"upstream_inference_completions_cost":0.0001418},'
    '"completion_tokens_details":{"reasoning_tokens":0}}'
)
BODY = (
    '{"id":"gen-1796060417-BsxhNFJuK1ooxP4OPOFF","provider":"Chutes","model":'
    '"moonshotai/kimi-k2.5-0127","object":"chat.completion","created":1796060417,'
    '"choices":[{"logprobs":null,"finish_reason":"stop","native_finish_reason":"stop",'
    '"index":0,"message":{"role":"assistant","content":"' + "word " * 60 + '",'
    '"refusal":null,"reasoning":null}}],"system_fingerprint":null,"usage":' + USAGE + "}"
)
CHUNK = (
    '{"id":"gen-1796060417-BsxhNFJuK1ooxP4OPOFF","provider":"Chutes","model":'
    '"moonshotai/kimi-k2.5-0127","object":"chat.completion.chunk","created":1796060417,'
    '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop",'
    '"native_finish_reason":"stop","logprobs":null}],"usage":' + USAGE + "}"
)
FIELDS_BYTES = len(json.dumps(TOOLS, separators=(",", ":")))
PROMPT_PRICE = Decimal("0.0000007")
COMPLETION_PRICE = Decimal("0.00000285")


def estimate(messages: Iterable[Mapping[str, Any]]) -> int:
    """The text-only estimate before this change (routing/route_plan.py), verbatim."""
    total = 16
    for message in messages:
        total += 8
        content = message.get("content")
        if isinstance(content, str):
            total += len(content.encode())
        elif content is not None:
            total += len(repr(content).encode())
        for key in ("tool_calls", "name", "tool_call_id", "reasoning"):
            extra = message.get(key)
            if extra:
                total += len(repr(extra).encode())
    return total


def _old_prepare(params: Mapping[str, Any]) -> Decimal:
    prompt = estimate(MESSAGES)
    return prompt * PROMPT_PRICE + 64 * COMPLETION_PRICE


def _new_prepare(params: Mapping[str, Any]) -> Decimal:
    extra = 0
    if params:
        check_fields(params)
        extra = FIELDS_BYTES  # the body's encoder already measured the fields' JSON
    cap = completion_cap(64, params) or 0
    billable = measure_messages(MESSAGES)
    worst = (billable.prompt_tokens + extra) * PROMPT_PRICE + cap * COMPLETION_PRICE
    return worst


def _per_call_us(fn: Callable[[], object], repeat: int) -> float:
    best = min(timeit.repeat(fn, number=CALLS, repeat=repeat))
    return best / CALLS * 1e6


def _row(name: str, base: Callable[[], object], ours: Callable[[], object], repeat: int) -> None:
    before = _per_call_us(base, repeat)
    after = _per_call_us(ours, repeat)
    print(
        f"| {name} | {before:.2f} | {after:.2f} | {after - before:+.2f} | {after / before:.2f}x |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench billable", description=__doc__)
    parser.add_argument("--repeat", type=int, default=5, help="timings per row (best kept)")
    args = parser.parse_args(argv)
    print("| step | baseline µs | ours µs | added µs | ratio |")
    print("|---|---:|---:|---:|---:|")
    _row("prepare, plain chat", lambda: _old_prepare({}), lambda: _new_prepare({}), args.repeat)
    _row(
        "prepare, 3 tool definitions",
        lambda: _old_prepare(TOOLS),
        lambda: _new_prepare(TOOLS),
        args.repeat,
    )

    def plain(text: str) -> Callable[[], object]:
        return lambda: to_decimal(json.loads(text)["usage"]["cost"])

    def exact(text: str) -> Callable[[], object]:
        def run() -> object:
            parsed = json.loads(text)
            pin_exact_cost(parsed, text)
            return to_decimal(parsed["usage"]["cost"])

        return run

    _row("decode completion body + cost", plain(BODY), exact(BODY), args.repeat)
    _row("decode usage chunk + cost", plain(CHUNK), exact(CHUNK), args.repeat)
    return 0
