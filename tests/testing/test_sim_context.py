"""Context length: a request longer than every endpoint's context is a 400
``context_length_exceeded`` (nothing billed); one that fits only endpoints the
preferences excluded is a 404 ``constraint_filtered``; too-small endpoints are routed around."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _sim_client import SimClient, StartSim
from _sim_contract import contract

from provider_router.testing import COMPLETION_TOKENS_HEADER
from provider_router.testing.chat.synth import count_prompt_tokens

FIXED = {COMPLETION_TOKENS_HEADER: "10"}
MODEL = "acme/ctx"
MARKET = Path(__file__).parents[1] / "data" / "markets" / "context.yaml"


def prompt(tokens: int) -> list[dict[str, str]]:
    # 4 characters per token, as the simulator counts.
    return [{"role": "user", "content": "abcd" * tokens}]


@pytest.fixture
async def ctx(start_sim: StartSim) -> tuple[Any, SimClient]:
    return await start_sim(market=MARKET)


async def post(client: SimClient, **body: Any) -> Any:
    return await client.post("/chat/completions", {"model": MODEL, **body}, FIXED)


async def test_a_prompt_beyond_every_context_is_a_400_and_costs_nothing(
    ctx: tuple[Any, SimClient],
) -> None:
    sim, client = ctx
    messages = prompt(5000)
    sent = count_prompt_tokens(messages)
    reply = await post(client, messages=messages)
    assert reply.status == 400
    error = reply.json["error"]
    assert error["metadata"]["error_type"] == "context_length_exceeded"
    assert "maximum context length is 4096 tokens" in error["message"]
    assert (
        f"requested about {sent} tokens ({sent} of text input, 0 in the output)"
        in (error["message"])
    )
    contract().validate("/chat/completions", "post", 400, reply.json)
    # max_tokens counts: a prompt that fits plus a completion that does not.
    reply = await post(client, messages=prompt(3000), max_tokens=2000)
    assert reply.status == 400
    assert "2000 in the output" in reply.json["error"]["message"]
    assert sim.simulator.usage == 0
    assert sim.requests[-1].outcome == "context_length"


async def test_endpoints_too_small_are_routed_around_or_filtered(
    ctx: tuple[Any, SimClient],
) -> None:
    sim, client = ctx
    # Venice (cheaper, first by price) holds 1,024 tokens: a 2,000-token prompt goes to Chutes.
    reply = await post(client, messages=prompt(2000), provider={"sort": "price"})
    assert reply.status == 200, reply.text
    assert reply.json["provider"] == "Chutes"
    # Only Venice allowed: Chutes would fit, so the preferences filtered it out.
    reply = await post(client, messages=prompt(2000), provider={"only": ["venice"]})
    assert reply.status == 404
    availability = reply.json["error"]["availability"]
    assert availability["code"] == "constraint_filtered"
    assert availability["excluded_by"] == ["context_length"]
    contract().validate("/chat/completions", "post", 404, reply.json)
    # A small prompt goes to Venice as asked.
    reply = await post(client, messages=prompt(100), provider={"only": ["venice"]})
    assert reply.status == 200
    assert reply.json["provider"] == "Venice"
    assert sim.simulator.usage > 0
