"""The local OpenRouter bills every field OpenRouter bills, so the client's tests can fail.

``max_completion_tokens`` wins over the deprecated ``max_tokens``; tool definitions,
response schemas and image parts are prompt tokens; each image pays the per-image
fee; ``n`` choices are each billed. The charge record stays exact.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _sim_client import SimClient, StartSim

from provider_router.testing import COMPLETION_TOKENS_HEADER
from provider_router.testing.chat.synth import IMAGE_PROMPT_TOKENS, count_prompt_tokens

M = Decimal(1_000_000)
LONG = {COMPLETION_TOKENS_HEADER: "5000"}
MESSAGES = [{"role": "user", "content": "Say hello."}]

MARKET = """
models:
  - id: acme/vision
    endpoints:
      - provider: Chutes
        pricing: {prompt: "1", completion: "2", request: "0.001", image: "0.0025"}
      - provider: Novita
        pricing: {prompt: "1", completion: "2", image: "0.5"}
"""


def exact(reply_text: str) -> Any:
    return json.loads(reply_text[reply_text.index("{") :], parse_float=Decimal)


@pytest.mark.parametrize(
    ("fields", "honoured"),
    [
        ({"max_tokens": 10, "max_completion_tokens": 4000}, 4000),
        ({"max_tokens": 4000, "max_completion_tokens": 10}, 10),
        ({"max_completion_tokens": 30}, 30),
        ({"max_tokens": 20}, 20),
    ],
)
async def test_max_completion_tokens_wins_over_max_tokens(
    client: SimClient, openrouter_sim: Any, fields: dict[str, int], honoured: int
) -> None:
    reply = await client.chat(headers=LONG, **fields)
    usage = exact(reply.text)["usage"]
    assert usage["completion_tokens"] == honoured
    assert openrouter_sim.requests[-1].completion_tokens == honoured


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n"])
@pytest.mark.parametrize("value", [0, -1, "8", True, 1.5])
async def test_bad_caps_and_n_are_400s(client: SimClient, field: str, value: object) -> None:
    reply = await client.chat(**{field: value})
    assert reply.status == 400
    assert field in reply.text


async def test_tools_and_response_format_are_billed_as_prompt(
    client: SimClient, openrouter_sim: Any
) -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "lookup", "description": "d" * 4000, "parameters": {}},
        }
    ]
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"title": "t" * 800}}}
    plain = exact((await client.chat(headers=LONG, max_tokens=5)).text)["usage"]
    reply = await client.chat(headers=LONG, max_tokens=5, tools=tools, response_format=schema)
    usage = exact(reply.text)["usage"]
    rendered = len(json.dumps(tools, separators=(",", ":"))) + len(
        json.dumps(schema, separators=(",", ":"))
    )
    assert usage["prompt_tokens"] - plain["prompt_tokens"] >= rendered // 4
    record = openrouter_sim.requests[-1]
    assert record.prompt_tokens == usage["prompt_tokens"]
    assert record.cost == usage["cost"]


async def test_images_cost_prompt_tokens_and_the_per_image_fee(
    start_sim: StartSim, tmp_path: Path
) -> None:
    path = tmp_path / "market.yaml"
    path.write_text(MARKET)
    sim, client = await start_sim(market=path)
    listing = exact((await client.get("/models/acme/vision/endpoints")).text)
    fees = {e["provider_name"]: e["pricing"].get("image") for e in listing["data"]["endpoints"]}
    assert fees == {"Chutes": "0.0025", "Novita": "0.5"}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 4000}}
    content = [{"type": "text", "text": "What is this?"}, image, image]
    messages = [{"role": "user", "content": content}]
    reply = await client.post(
        "/chat/completions",
        {
            "model": "acme/vision",
            "messages": messages,
            "max_tokens": 10,
            "provider": {"only": ["chutes"]},
        },
        {COMPLETION_TOKENS_HEADER: "10"},
    )
    usage = exact(reply.text)["usage"]
    prompt = count_prompt_tokens(messages) + 2 * IMAGE_PROMPT_TOKENS
    assert usage["prompt_tokens"] == prompt
    expected = (
        prompt * Decimal(1) / M + 10 * Decimal(2) / M + Decimal("0.001") + 2 * Decimal("0.0025")
    )
    assert usage["cost"] == expected
    assert sim.requests[-1].cost == expected
    assert sim.balance == Decimal(100) - expected


async def test_max_price_image_filters_dearer_image_fees(
    start_sim: StartSim, tmp_path: Path
) -> None:
    path = tmp_path / "market.yaml"
    path.write_text(MARKET)
    _, client = await start_sim(market=path)
    body = {"model": "acme/vision", "messages": MESSAGES, "max_tokens": 5}
    for _ in range(3):
        reply = await client.post(
            "/chat/completions", {**body, "provider": {"max_price": {"image": "0.01"}}}
        )
        assert exact(reply.text)["provider"] == "Chutes"
    reply = await client.post(
        "/chat/completions", {**body, "provider": {"max_price": {"image": "0.001"}}}
    )
    assert reply.status == 404
    assert "max_price" in reply.text


def dec(value: Any) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(repr(value))


@pytest.mark.parametrize("stream", [False, True])
async def test_n_choices_are_each_billed(
    client: SimClient, openrouter_sim: Any, stream: bool
) -> None:
    fixed = {COMPLETION_TOKENS_HEADER: "40"}
    only = {"only": ["chutes"]}
    one = exact((await client.chat(headers=fixed, max_tokens=100, provider=only)).text)["usage"]
    reply = await client.chat(headers=fixed, max_tokens=100, n=3, stream=stream, provider=only)
    usage = reply.events[-1]["usage"] if stream else exact(reply.text)["usage"]
    assert usage["completion_tokens"] == 3 * 40
    if not stream:
        assert [c["index"] for c in exact(reply.text)["choices"]] == [0, 1, 2]
    record = openrouter_sim.requests[-1]
    assert record.completion_tokens == 120
    completion_cost = dec(one["cost_details"]["upstream_inference_completions_cost"])
    assert dec(usage["cost"]) == dec(one["cost"]) + 2 * completion_cost
    assert record.cost == dec(usage["cost"])
