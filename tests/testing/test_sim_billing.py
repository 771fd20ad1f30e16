"""Billing is exact, the balance goes down by it, and 402s say which limit refused."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _sim_client import SimClient, StartSim, chat_body

from provider_router.testing import COMPLETION_TOKENS_HEADER, DEFAULT_TEST_KEY
from provider_router.testing.chat.synth import count_prompt_tokens

M = Decimal(1_000_000)
FIXED = {COMPLETION_TOKENS_HEADER: "100"}


def exact(reply_text: str) -> Any:
    """The JSON body with numbers as Decimals: what OpenRouter wrote, digit for digit."""
    return json.loads(reply_text[reply_text.index("{") :], parse_float=Decimal)


def prompt_tokens(*contents: str) -> int:
    return 3 + sum(4 + (len(c) + 3) // 4 for c in contents)


async def test_cost_is_prompt_plus_completion_at_the_serving_price(client: SimClient) -> None:
    reply = await client.chat(content="x" * 400, provider={"only": ["chutes"]}, headers=FIXED)
    body = exact(reply.text)
    usage = body["usage"]
    assert body["provider"] == "Chutes"
    assert usage["prompt_tokens"] == prompt_tokens("x" * 400) == 107
    assert usage["completion_tokens"] == 100
    expected = 107 * Decimal("0.45") / M + 100 * Decimal("2.20") / M
    assert usage["cost"] == expected == Decimal("0.00026815")
    details = usage["cost_details"]
    assert (
        details["upstream_inference_prompt_cost"] + details["upstream_inference_completions_cost"]
        == expected
    )


async def test_reasoning_tokens_are_billed_as_completion(client: SimClient) -> None:
    reply = await client.chat(
        provider={"only": ["deepinfra"]}, reasoning={"effort": "high"}, headers=FIXED
    )
    usage = exact(reply.text)["usage"]
    reasoning = usage["completion_tokens_details"]["reasoning_tokens"]
    assert 0 < reasoning < 100
    assert reply.json["choices"][0]["message"]["reasoning"]
    prompt = usage["prompt_tokens"] * Decimal("0.50") / M
    assert usage["cost"] == prompt + 100 * Decimal("2.40") / M


async def test_excluded_reasoning_is_billed_but_not_shown(client: SimClient) -> None:
    reply = await client.chat(
        provider={"only": ["deepinfra"]}, reasoning={"exclude": True}, headers=FIXED
    )
    assert reply.json["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    assert reply.json["choices"][0]["message"]["reasoning"] is None


async def test_a_repeated_prefix_is_read_from_cache_at_the_cache_price(client: SimClient) -> None:
    system = "You write training data. " * 40
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Go."}]
    body = {**chat_body(), "messages": messages, "provider": {"only": ["chutes"]}}
    first = exact((await client.post("/chat/completions", body, FIXED)).text)["usage"]
    second = exact((await client.post("/chat/completions", body, FIXED)).text)["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    # The whole prompt was served before: every message is read from cache (not the
    # reply-priming tokens, which no prefix includes).
    assert cached == count_prompt_tokens(messages) - count_prompt_tokens([])
    uncached = second["prompt_tokens"] - cached
    assert second["cost"] == (
        uncached * Decimal("0.45") / M + cached * Decimal("0.15") / M + 100 * Decimal("2.20") / M
    )


MARKET = """
models:
  - id: acme/tiny
    endpoints:
      - provider: Chutes
        pricing: {prompt: "1", completion: "2", request: "0.001"}
        supports_implicit_caching: true
"""


async def test_per_request_fee_and_cache_hits_without_a_cache_price(
    start_sim: StartSim, tmp_path: Path
) -> None:
    path = tmp_path / "market.yaml"
    path.write_text(MARKET)
    sim, client = await start_sim(market=path)
    messages = [{"role": "system", "content": "s" * 100}, {"role": "user", "content": "u"}]
    body = {"model": "acme/tiny", "messages": messages}
    await client.post("/chat/completions", body, FIXED)
    usage = exact((await client.post("/chat/completions", body, FIXED)).text)["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    # No input_cache_read price: cached tokens are billed at the prompt price, plus the fee.
    assert usage["cost"] == usage["prompt_tokens"] * Decimal(1) / M + 100 * Decimal(
        2
    ) / M + Decimal("0.001")
    assert sim.balance == Decimal(100) - 2 * usage["cost"]


async def test_balance_key_and_credits_agree_with_the_sum_of_costs(
    client: SimClient, openrouter_sim: Any
) -> None:
    costs = []
    for i in range(5):
        reply = await client.chat(content=f"prompt {i}", max_tokens=300, stream=i % 2 == 1)
        usage = reply.json["usage"] if reply.json else reply.events[-1]["usage"]
        costs.append(Decimal(repr(usage["cost"])))
    total = sum(costs, Decimal(0))
    assert openrouter_sim.balance == Decimal(100) - total
    assert sum((r.cost for r in openrouter_sim.requests), Decimal(0)) == total
    key = exact((await client.get("/key")).text)["data"]
    assert key["usage"] == total
    assert key["limit"] is None
    assert key["limit_remaining"] is None
    credits = exact((await client.get("/credits")).text)["data"]
    assert credits == {"total_credits": Decimal(100), "total_usage": total}


async def test_key_limit_shows_remaining_and_refuses_beyond_it(start_sim: StartSim) -> None:
    sim, client = await start_sim(api_keys={DEFAULT_TEST_KEY: "0.01"})
    reply = await client.chat(max_tokens=1000, provider={"only": ["chutes"]}, headers=FIXED)
    assert reply.status == 200
    cost = exact(reply.text)["usage"]["cost"]
    key = exact((await client.get("/key")).text)["data"]
    assert key["limit"] == Decimal("0.01")
    assert key["limit_remaining"] == Decimal("0.01") - cost
    refused = await client.chat(max_tokens=10_000, provider={"only": ["chutes"]})
    assert refused.status == 402
    error = refused.json["error"]
    assert error["metadata"]["limit_source"] == "openrouter_key_limit"
    # Remaining ≈ $0.0097 affords about 4,400 tokens at $2.20/M after the prompt.
    assert "You requested up to 10000 tokens, but can only afford 44" in error["message"]
    assert "settings/keys" in error["message"]
    assert sim.requests[-1].limit_source == "openrouter_key_limit"


async def test_out_of_credits_then_top_up(start_sim: StartSim) -> None:
    sim, client = await start_sim(credits=0)
    reply = await client.chat(max_tokens=10)
    assert reply.status == 402
    assert reply.json["error"]["message"].startswith("Insufficient credits")
    assert reply.json["error"]["metadata"]["limit_source"] == "openrouter_credits"
    sim.top_up("0.50")
    assert (await client.chat(max_tokens=10)).status == 200
    assert sim.balance < Decimal("0.50")


async def test_worst_case_without_max_tokens_uses_the_endpoint_maximum(start_sim: StartSim) -> None:
    # 65,536 tokens × $2.20/M = $0.144 > $0.10, although the answer would cost far less.
    _, client = await start_sim(credits="0.10")
    reply = await client.chat(provider={"only": ["chutes"]})
    assert reply.status == 402
    assert "You requested up to 65536 tokens" in reply.json["error"]["message"]
    assert "settings/credits" in reply.json["error"]["message"]
    assert (await client.chat(provider={"only": ["chutes"]}, max_tokens=1000)).status == 200


async def test_in_flight_holds_can_refuse_a_request_the_balance_alone_would_cover(
    start_sim: StartSim,
) -> None:
    fault = {"kind": "hang", "provider": "chutes"}
    sim, client = await start_sim(credits="0.004", faults=[fault], speed=1000)
    body = chat_body(max_tokens=1000, provider={"only": ["chutes"]})
    timeout = aiohttp.ClientTimeout(total=5)
    hung = asyncio.create_task(
        client.session.post(sim.url + "/chat/completions", json=body, timeout=timeout)
    )
    for _ in range(1000):
        if sim.simulator.account.holds:
            break
        await asyncio.sleep(0.001)
    other = await client.chat(max_tokens=1000, provider={"only": ["deepinfra"]})
    assert other.status == 402
    assert other.json["error"]["metadata"]["limit_source"] == "openrouter_in_flight_budget"
    assert float(other.headers["retry-after"]) > 0
    hung.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hung
    for _ in range(1000):
        if not sim.simulator.account.holds:
            break
        await asyncio.sleep(0.001)
    assert (await client.chat(max_tokens=1000, provider={"only": ["deepinfra"]})).status == 200


async def test_failed_attempts_cost_nothing(start_sim: StartSim) -> None:
    sim, client = await start_sim(faults=[{"kind": "provider_error", "provider": "chutes"}])
    reply = await client.chat(max_tokens=10, provider={"only": ["chutes"]})
    assert reply.status == 502
    assert sim.balance == Decimal(100)
    assert sim.requests[-1].cost_units == 0
