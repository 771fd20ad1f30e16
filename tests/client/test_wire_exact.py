"""``usage.cost`` is read from the wire's digits, never through a binary float.

A tiny server on loopback answers with a cost whose last picodollars a float
cannot hold (17 significant digits), as JSON and as a stream.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from _metadata_server import BUNDLED, Canned, serve
from _router_helpers import KIMI, MESSAGES

from provider_router import ProviderPolicy, Router
from provider_router._money import exact_json_number, pin_exact_cost, to_decimal

COST = "98765.432109876543"  # float() keeps 98765.43210987654: 3 picodollars lost
USAGE = (
    '{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"cost":' + COST + ","
    '"cost_details":{"upstream_inference_cost":' + COST + "}}"
)
BODY = (
    '{"id":"gen-exact","provider":"Chutes","model":"moonshotai/kimi-k2.5","object":'
    '"chat.completion","created":1,"choices":[{"index":0,"finish_reason":"stop",'
    '"message":{"role":"assistant","content":"hi"}}],"usage":' + USAGE + "}"
)
CHUNK = (
    '{"id":"gen-exact","provider":"Chutes","model":"moonshotai/kimi-k2.5","object":'
    '"chat.completion.chunk","created":1,"choices":[{"index":0,"delta":{"content":"hi"},'
    '"finish_reason":"stop"}]'
)
LAST = CHUNK.replace('"content":"hi"', '"content":""')
SSE = f'data: {CHUNK}}}\n\ndata: {LAST},"usage":{USAGE}}}\n\ndata: [DONE]\n\n'


def test_the_cost_digits_survive_where_a_float_loses_them() -> None:
    assert Decimal(repr(float(COST))) != Decimal(COST)  # the premise
    for raw in (BODY, BODY.encode()):
        parsed = json.loads(raw)
        pin_exact_cost(parsed, raw)
        assert parsed["usage"]["cost"] == Decimal(COST)
        assert to_decimal(parsed["usage"]["cost"]) == Decimal(COST)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"cost":1.5}', Decimal("1.5")),
        ('{"cost": 2e-7}', Decimal("2e-7")),
        ('{"a":{"cost":1},"usage":{"cost":0.25}}', Decimal("0.25")),  # the last one
        ('{"text":"\\"cost\\":9","usage":{"cost":0.5}}', Decimal("0.5")),
        ('{"upstream_inference_cost":3}', None),
        ('{"cost":"0.1"}', None),  # a string is not a number token
        ("{}", None),
    ],
)
def test_exact_json_number_reads_the_last_key_token(raw: str, expected: Decimal | None) -> None:
    assert exact_json_number(raw, "cost") == expected
    assert exact_json_number(raw.encode(), "cost") == expected


def test_a_cost_the_text_does_not_match_is_left_to_the_float() -> None:
    parsed = {"usage": {"cost": 0.5}}
    pin_exact_cost(parsed, '{"usage":{"cost":0.75}}')  # not the number decoded
    assert parsed["usage"]["cost"] == 0.5
    generation = json.loads('{"data":{"total_cost":' + COST + "}}")
    pin_exact_cost(generation, '{"data":{"total_cost":' + COST + "}}")
    assert generation["data"]["total_cost"] == Decimal(COST)


@pytest.mark.parametrize("stream", [False, True])
async def test_usage_cost_is_parsed_exactly_from_the_wire(stream: bool) -> None:
    answer = (
        Canned(body=SSE.encode(), headers={"Content-Type": "text/event-stream"})
        if stream
        else Canned(body=BODY.encode())
    )
    routes = {
        "/models/moonshotai/kimi-k2.5/endpoints": Canned(body=BUNDLED.read_bytes()),
        "/chat/completions": answer,
    }
    with serve(routes) as server:
        async with Router(
            KIMI,
            base_url=server.base_url,
            api_key="sk-or-v1-test",
            policy=ProviderPolicy(exclude_below="int4"),
            cost_sanity_factor=10**9,
        ) as router:
            result = await router.chat(MESSAGES, max_tokens=10, stream=stream)
    assert result.text == "hi"
    assert result.cost == Decimal(COST)
    assert router.spent == Decimal(COST)
