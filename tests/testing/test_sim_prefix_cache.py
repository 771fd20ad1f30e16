"""Prefix caching: the longest previously served prefix is read, per provider, with
a minimum length, a TTL and bounded memory; reads and writes are billed at their prices."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _sim_client import MODEL, SimClient, StartSim

from provider_router.testing import COMPLETION_TOKENS_HEADER
from provider_router.testing.chat.synth import count_prompt_tokens, count_request_prompt
from provider_router.testing.market.prefix_cache import PrefixCache, prefix_chain

CHAT = "/chat/completions"
FIXED = {COMPLETION_TOKENS_HEADER: "20"}
M = Decimal(1_000_000)
SYSTEM = {"role": "system", "content": "You write careful training data. " * 30}
Q1 = {"role": "user", "content": "Explain prefix caching in two sentences."}
A1 = {"role": "assistant", "content": "It reuses the computed prompt state. It saves money."}
Q2 = {"role": "user", "content": "And what expires it?"}
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "description": "Look a term up. " * 20, "parameters": {}},
}


def tokens(messages: list[dict[str, Any]]) -> int:
    """Prompt tokens of the messages themselves (no reply priming): a prefix's worth."""
    return count_prompt_tokens(messages) - count_prompt_tokens([])


def usage_of(reply_text: str) -> dict[str, Any]:
    return json.loads(reply_text, parse_float=Decimal)["usage"]  # type: ignore[no-any-return]


async def send(
    client: SimClient, messages: list[dict[str, Any]], provider: str = "chutes", **extra: Any
) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "provider": {"only": [provider]}, **extra}
    reply = await client.post(CHAT, body, FIXED)
    assert reply.status == 200, reply.text
    return usage_of(reply.text)


def cached(usage: dict[str, Any]) -> int:
    return int(usage["prompt_tokens_details"]["cached_tokens"])


async def test_a_later_turn_reads_the_earlier_conversation_from_cache(client: SimClient) -> None:
    first = await send(client, [SYSTEM, Q1])
    assert cached(first) == 0
    second = await send(client, [SYSTEM, Q1, A1, Q2])
    assert cached(second) == tokens([SYSTEM, Q1])
    # The cached part is billed at Chutes' cache-read price, the rest at the prompt price.
    uncached = second["prompt_tokens"] - cached(second)
    assert second["cost"] == (
        uncached * Decimal("0.45") / M
        + cached(second) * Decimal("0.15") / M
        + 20 * Decimal("2.20") / M
    )
    # The third turn reads the whole second conversation.
    third = await send(client, [SYSTEM, Q1, A1, Q2, A1, Q1])
    assert cached(third) == tokens([SYSTEM, Q1, A1, Q2])


async def test_what_is_not_a_shared_prefix_misses(client: SimClient) -> None:
    await send(client, [SYSTEM, Q1])
    other_system = {"role": "system", "content": "You are terse. " * 60}
    assert cached(await send(client, [other_system, Q1, A1, Q2])) == 0
    # The same messages in another order share nothing either.
    assert cached(await send(client, [Q1, SYSTEM])) == 0
    # Caches are per provider: DeepInfra never served this prompt.
    assert cached(await send(client, [SYSTEM, Q1, A1, Q2], provider="deepinfra")) == 0
    # Different tool definitions make a different prefix.
    assert cached(await send(client, [SYSTEM, Q1, A1, Q2], tools=[TOOL])) == 0


async def test_tool_definitions_are_part_of_the_cached_prefix(client: SimClient) -> None:
    first = await send(client, [SYSTEM, Q1], tools=[TOOL])
    second = await send(client, [SYSTEM, Q1, A1, Q2], tools=[TOOL])
    fields = count_request_prompt({"messages": [], "tools": [TOOL]})[0] - count_prompt_tokens([])
    assert cached(second) == fields + tokens([SYSTEM, Q1])
    # An identical repeat reads every prompt token but the reply priming.
    again = await send(client, [SYSTEM, Q1], tools=[TOOL])
    assert cached(again) == first["prompt_tokens"] - count_prompt_tokens([])


async def test_a_provider_without_implicit_caching_never_reads(client: SimClient) -> None:
    await send(client, [SYSTEM, Q1], provider="siliconflow")
    assert cached(await send(client, [SYSTEM, Q1, A1, Q2], provider="siliconflow")) == 0


def _market(tmp_path: Path, **endpoint: Any) -> Path:
    fields = "\n".join(f"        {key}: {value}" for key, value in endpoint.items())
    path = tmp_path / "market.yaml"
    path.write_text(
        f"""
models:
  - id: acme/tiny
    endpoints:
      - provider: Chutes
        supports_implicit_caching: true
{fields}
"""
    )
    return path


async def test_prefixes_below_the_minimum_are_not_cached(
    start_sim: StartSim, tmp_path: Path
) -> None:
    market = _market(tmp_path, pricing='{prompt: "1", completion: "2"}', cache_min_tokens=100)
    _, client = await start_sim(market=market)

    async def turns(system: dict[str, Any]) -> tuple[int, int]:
        body = {"model": "acme/tiny", "messages": [system, Q1]}
        await client.post(CHAT, body, FIXED)
        body["messages"] = [system, Q1, A1, Q2]
        usage = usage_of((await client.post(CHAT, body, FIXED)).text)
        return cached(usage), tokens([system, Q1])

    short = {"role": "system", "content": "s" * 200}
    read, prefix = await turns(short)
    assert prefix < 100
    assert read == 0, "a prefix below the minimum is neither stored nor read"
    longer = {"role": "system", "content": "t" * 400}
    read, prefix = await turns(longer)
    assert prefix >= 100
    assert read == prefix


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_cached_prefix_expires_after_its_ttl(start_sim: StartSim, tmp_path: Path) -> None:
    clock = FakeClock()
    market = _market(tmp_path, pricing='{prompt: "1", completion: "2"}', cache_ttl_seconds=60)
    _, client = await start_sim(market=market, clock=clock)

    async def turn(messages: list[dict[str, Any]]) -> int:
        reply = await client.post(CHAT, {"model": "acme/tiny", "messages": messages}, FIXED)
        return cached(usage_of(reply.text))

    assert await turn([SYSTEM, Q1]) == 0
    clock.now += 59
    assert await turn([SYSTEM, Q1, A1, Q2]) == tokens([SYSTEM, Q1])  # a hit refreshes it
    clock.now += 59
    assert await turn([SYSTEM, Q1, A1, Q1]) == tokens([SYSTEM, Q1, A1])
    clock.now += 61
    assert await turn([SYSTEM, Q1, A1, Q2]) == 0, "expired"


async def test_cache_writes_are_billed_where_the_endpoint_prices_them(
    start_sim: StartSim, tmp_path: Path
) -> None:
    pricing = '{prompt: "1", completion: "2", input_cache_read: "0.1", input_cache_write: "1.25"}'
    _, client = await start_sim(market=_market(tmp_path, pricing=pricing))
    body: dict[str, Any] = {"model": "acme/tiny", "messages": [SYSTEM, Q1]}
    first = usage_of((await client.post(CHAT, body, FIXED)).text)
    written = first["prompt_tokens_details"]["cache_write_tokens"]
    assert written == tokens([SYSTEM, Q1])
    assert cached(first) == 0
    plain = first["prompt_tokens"] - written
    assert first["cost"] == (plain + written * Decimal("1.25") + 20 * 2) / M
    body["messages"] = [SYSTEM, Q1, A1, Q2]
    second = usage_of((await client.post(CHAT, body, FIXED)).text)
    read = cached(second)
    written = second["prompt_tokens_details"]["cache_write_tokens"]
    assert read == tokens([SYSTEM, Q1])
    assert written == tokens([A1, Q2])
    plain = second["prompt_tokens"] - read - written
    assert (
        second["cost"] == (plain + read * Decimal("0.1") + written * Decimal("1.25") + 20 * 2) / M
    )
    assert (
        second["cost_details"]["upstream_inference_prompt_cost"]
        == (plain + read * Decimal("0.1") + written * Decimal("1.25")) / M
    )


async def test_the_generation_record_reports_the_cached_tokens(
    openrouter_sim: Any, client: SimClient
) -> None:
    await send(client, [SYSTEM, Q1])
    reply = await client.post(
        CHAT,
        {"model": MODEL, "messages": [SYSTEM, Q1, A1, Q2], "provider": {"only": ["chutes"]}},
        FIXED,
    )
    record = openrouter_sim.requests[-1]
    assert record.cached_tokens == tokens([SYSTEM, Q1])
    await client.get("/generation", id=reply.json["id"])
    generation = await client.get("/generation", id=reply.json["id"])
    assert generation.json["data"]["native_tokens_cached"] == tokens([SYSTEM, Q1])
    # cache_discount reports the saving: the cached tokens at Chutes' prompt price less
    # its cache-read price (prompt-caching guide); a miss saved nothing (null).
    saved = Decimal(tokens([SYSTEM, Q1])) * (Decimal("0.45") - Decimal("0.15")) / M
    discount = json.loads(generation.text, parse_float=Decimal)["data"]["cache_discount"]
    assert discount == saved
    first = openrouter_sim.requests[-2]
    assert first.cached_tokens == 0


def test_memory_is_bounded_least_recently_used_first() -> None:
    cache = PrefixCache(capacity=4)
    a = prefix_chain({"messages": [SYSTEM, Q1]})
    b = prefix_chain({"messages": [Q1, Q2]})
    c = prefix_chain({"messages": [Q2, A1]})
    assert cache.serve("x", a, 0, min_tokens=0, ttl=100).cached_tokens == 0
    assert cache.serve("x", b, 1, min_tokens=0, ttl=100).cached_tokens == 0
    assert len(cache) == 4
    assert cache.serve("x", a, 2, min_tokens=0, ttl=100).cached_tokens == a[-1][1]  # a is fresh
    cache.serve("x", c, 3, min_tokens=0, ttl=100)  # evicts b, the least recently used
    assert len(cache) == 4
    assert cache.serve("x", b, 4, min_tokens=0, ttl=100).cached_tokens == 0
    assert cache.serve("y", a, 5, min_tokens=0, ttl=100).cached_tokens == 0, "per endpoint"
    with pytest.raises(ValueError, match="capacity"):
        PrefixCache(capacity=0)


def test_a_prefix_chain_is_cumulative_and_counts_what_is_billed() -> None:
    chain = prefix_chain({"messages": [SYSTEM, Q1, A1]})
    assert [t for _, t in chain] == [
        tokens([SYSTEM]),
        tokens([SYSTEM, Q1]),
        tokens([SYSTEM, Q1, A1]),
    ]
    assert prefix_chain({"messages": [SYSTEM, Q1]})[1] == chain[1]
    # Rendered fields come first, as their own boundary, and change every key after them.
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {
        "messages": [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "x"}, image]}],
        "tools": [TOOL],
        "response_format": {"type": "json_object"},
    }
    with_fields = prefix_chain(body)
    assert len(with_fields) == 3
    assert with_fields[1][0] != chain[0][0]
    assert (
        with_fields[-1][1]
        == count_request_prompt(body)[0] - count_request_prompt({"messages": []})[0]
    ), "the whole prompt but the reply priming, images and fields included"
