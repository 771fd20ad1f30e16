"""``usage.cost`` is read from the wire's digits, never through a binary float.

A tiny server on loopback answers with a cost whose last picodollars a float
cannot hold (17 significant digits), as JSON and as a stream.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
from _metadata_server import BUNDLED, Canned, serve
from _router_helpers import KIMI, MESSAGES
from hypothesis import given
from hypothesis import strategies as st

from provider_router import ProviderPolicy, Router, Safeguards
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
            # A $98,765 answer on a hold of cents: not checked.
            safeguards=Safeguards(cost_sanity_factor=10**12),
        ) as router:
            result = await router.chat(MESSAGES, max_tokens=10, stream=stream)
    assert result.text == "hi"
    assert result.cost == Decimal(COST)
    assert router.spent == Decimal(COST)


# --- the bare-number shortcut (wave 4) against the pattern it stands in front of ----

_OLD_TEXT = re.compile(r"\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
_OLD_BYTES = re.compile(rb"\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def _old_exact_json_number(raw: bytes | str, key: str) -> Decimal | None:
    """``exact_json_number`` before wave 4: one pattern with ``\\s*`` and a group."""
    if isinstance(raw, str):
        at = raw.rfind(f'"{key}":')
        found = _OLD_TEXT.match(raw, at + len(key) + 3) if at >= 0 else None
        return Decimal(found.group(1)) if found else None
    at = raw.rfind(b'"' + key.encode() + b'":')
    match = _OLD_BYTES.match(raw, at + len(key) + 3) if at >= 0 else None
    return Decimal(match.group(1).decode()) if match else None


ADVERSARIAL = [
    BODY,
    '{"usage":{"cost":3.38e-05,"is_byok":false}}',
    '{"usage":{"cost": 3.38E+05}}',
    '{"usage":{"cost":\n\t -0.0}}',
    '{"usage":{"cost":-0}}',
    '{"usage":{"cost":1E400}}',
    '{"usage":{"cost":0.1},"x":{"cost":0.2}}',  # two keys: the last one is read
    '{"usage":{"cost":0.1},"usage2":{"cost":"0.1"}}',  # the last is a string
    '{"usage":{"cost":0.1},"x":{"cost":{"a":1}}}',
    '{"usage":{"cost":0.1},"x":{"cost":[1,2]}}',
    '{"usage":{"cost":0.1},"x":{"cost":NaN}}',
    '{"usage":{"cost":0.1},"x":{"cost":-Infinity}}',
    '{"usage":{"cost":0.1},"x":{"cost":true}}',
    '{"choices":[{"message":{"content":"\\"cost\\":9 and \\"cost\\": 7"}}],"usage":{"cost":5e-7}}',
    '{"choices":[{"message":{"content":"cost: 9"}}]}',  # no usage at all
    '{"usage":{"prompt_tokens":3}}',
    '{"usage":{"cost":12.}}',  # not JSON: both read the leading digits
    '{"usage":{"cost":.5}}',
    '{"usage":{"cost":+5}}',
    '{"usage":{"cost":1_000}}',
    '{"usage":{"cost":1.5e}}',
    '{"usage":{"cost":1.e5}}',
    '{"usage":{"cost":-}}',
    '{"usage":{"cost":\u0661\u0662}}',  # Arabic-Indic digits: str patterns' \\d
    '"cost":',
    "",
]


@pytest.mark.parametrize("raw", ADVERSARIAL)
def test_the_bare_number_shortcut_reads_what_the_old_pattern_read(raw: str) -> None:
    for text in (raw, raw.encode()):
        assert repr(exact_json_number(text, "cost")) == repr(_old_exact_json_number(text, "cost"))


@given(
    st.text(alphabet=' \t\n\r-+.eE0123456789_,}]"x', max_size=12),
    st.sampled_from(["cost", "total_cost"]),
)
def test_the_shortcut_agrees_on_any_text_after_the_key(tail: str, key: str) -> None:
    for raw in (f'{{"a":1,"{key}":{tail}', f'{{"{key}":1,"b":{{"{key}":{tail}}}}}'):
        for text in (raw, raw.encode()):
            assert repr(exact_json_number(text, key)) == repr(_old_exact_json_number(text, key))


@pytest.mark.parametrize("raw", [r for r in ADVERSARIAL if r.startswith("{")])
def test_pinning_a_decoded_body_is_unchanged_by_the_shortcut(raw: str) -> None:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return  # not JSON: never pinned (the decoder refused it first)
    expected = json.loads(raw)
    usage = expected.get("usage") if isinstance(expected, dict) else None
    if isinstance(usage, dict) and isinstance(usage.get("cost"), float):
        exact = _old_exact_json_number(raw, "cost")
        if exact is not None and float(exact) == usage["cost"]:
            usage["cost"] = exact
    pin_exact_cost(parsed, raw.encode())
    assert repr(parsed) == repr(expected)
