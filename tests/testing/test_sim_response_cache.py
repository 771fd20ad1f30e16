"""Response caching (``X-OpenRouter-Cache``), as OpenRouter's guide describes it:
a hit is free, has a new generation id and replays the answer; the key is the body's
bytes as sent (key order matters) per API key and stream mode."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from _sim_client import chat_body

from provider_router.testing.chat.cache import parse_ttl

ON = {"X-OpenRouter-Cache": "true"}


async def test_the_same_body_twice_is_a_free_hit_and_the_usage_does_not_move(
    start_sim: Any,
) -> None:
    sim, client = await start_sim(generation_404s=0)
    body = chat_body(max_tokens=50)
    first = await client.post("/chat/completions", body, headers=ON)
    assert first.status == 200
    assert first.headers["x-openrouter-cache-status"] == "MISS"
    assert first.headers["x-openrouter-cache-ttl"] == "300"
    assert first.json["usage"]["cost"] > 0
    usage_after_first = sim.simulator.usage
    credits = await client.get("/credits")

    second = await client.post("/chat/completions", body, headers=ON)
    assert second.status == 200
    assert second.headers["x-openrouter-cache-status"] == "HIT"
    assert second.headers["x-openrouter-cache-age"] == "0"
    assert int(second.headers["x-openrouter-cache-ttl"]) <= 300
    # A new generation id (header and body), the same answer, nothing billed.
    assert second.json["id"] == second.headers["x-generation-id"] != first.json["id"]
    assert second.headers["x-openrouter-cache-source-id"] == first.json["id"]
    assert second.json["choices"] == first.json["choices"]
    usage = second.json["usage"]
    assert usage["cost"] == 0
    assert usage["prompt_tokens"] == usage["completion_tokens"] == usage["total_tokens"] == 0
    assert sim.simulator.usage == usage_after_first
    assert (await client.get("/credits")).json == credits.json
    key = await client.get("/key")
    assert Decimal(str(key.json["data"]["usage"])) == usage_after_first
    # /generation: the hit at $0, naming the generation it replayed.
    record = (await client.get("/generation", id=second.json["id"])).json["data"]
    assert record["total_cost"] == 0
    assert record["response_cache_source_id"] == first.json["id"]
    original = (await client.get("/generation", id=first.json["id"])).json["data"]
    assert original["response_cache_source_id"] is None
    assert [r.outcome for r in sim.requests if r.route == "chat"] == ["ok", "cache_hit"]


async def test_without_the_header_or_with_false_nothing_is_cached(start_sim: Any) -> None:
    sim, client = await start_sim()
    body = chat_body(max_tokens=30)
    for headers in (None, {"X-OpenRouter-Cache": "false"}, None):
        reply = await client.post("/chat/completions", body, headers=headers)
        assert "x-openrouter-cache-status" not in reply.headers
    costs = [r.cost for r in sim.requests]
    assert all(cost > 0 for cost in costs)
    assert len(costs) == 3


async def test_the_key_is_the_body_as_sent_key_order_stream_mode_and_api_key(
    start_sim: Any,
) -> None:
    _sim, client = await start_sim(api_keys=["sk-a", "sk-b"], key="sk-a")
    _, other_key = await start_sim(key="sk-b")
    other_key.url = client.url  # the same simulator, the other key
    body = chat_body(max_tokens=30)
    reordered = {k: body[k] for k in reversed(list(body))}
    await client.post("/chat/completions", body, headers=ON)
    assert (await client.post("/chat/completions", reordered, headers=ON)).headers[
        "x-openrouter-cache-status"
    ] == "MISS"
    assert (await other_key.post("/chat/completions", body, headers=ON)).headers[
        "x-openrouter-cache-status"
    ] == "MISS"
    streamed = await client.post("/chat/completions", {**body, "stream": True}, headers=ON)
    assert streamed.headers["x-openrouter-cache-status"] == "MISS"
    # An explicit default is another body.
    explicit = await client.post("/chat/completions", {**body, "n": 1}, headers=ON)
    assert explicit.headers["x-openrouter-cache-status"] == "MISS"
    assert (await client.post("/chat/completions", body, headers=ON)).headers[
        "x-openrouter-cache-status"
    ] == "HIT"


async def test_a_stream_hit_is_replayed_as_sse_with_a_new_id_and_zero_usage(
    start_sim: Any,
) -> None:
    sim, client = await start_sim(generation_404s=0)
    body = chat_body(max_tokens=60, stream=True)
    first = await client.post("/chat/completions", body, headers=ON)
    second = await client.post("/chat/completions", body, headers=ON)
    assert second.headers["x-openrouter-cache-status"] == "HIT"
    assert second.headers["content-type"].startswith("text/event-stream")
    assert second.done
    assert len(second.events) == len(first.events)
    new_id = second.headers["x-generation-id"]
    assert {e["id"] for e in second.events} == {new_id}
    assert [e["choices"] for e in second.events] == [e["choices"] for e in first.events]
    assert second.events[-1]["usage"]["cost"] == 0
    assert second.events[-1]["usage"]["completion_tokens"] == 0
    assert sum(r.cost for r in sim.requests) == sim.simulator.usage == first_cost(first)


def first_cost(reply: Any) -> Decimal:
    return Decimal(str(reply.events[-1]["usage"]["cost"]))


async def test_identical_requests_in_flight_both_miss_and_are_both_billed(
    start_sim: Any,
) -> None:
    import asyncio

    sim, client = await start_sim(speed=1000, completion_tokens=40)
    body = chat_body(max_tokens=60)
    replies = await asyncio.gather(
        *(client.post("/chat/completions", body, headers=ON) for _ in range(2))
    )
    assert [r.headers["x-openrouter-cache-status"] for r in replies] == ["MISS", "MISS"]
    assert all(r.cost > 0 for r in sim.requests)


async def test_only_whole_200_answers_are_cached(start_sim: Any) -> None:
    _sim, client = await start_sim(faults=[{"kind": "error_200", "times": 1}])
    body = chat_body(max_tokens=30)
    failed = await client.post("/chat/completions", body, headers=ON)
    assert failed.headers["x-openrouter-cache-status"] == "MISS"
    again = await client.post("/chat/completions", body, headers=ON)
    assert again.headers["x-openrouter-cache-status"] == "MISS"  # the error was not kept
    assert (await client.post("/chat/completions", body, headers=ON)).headers[
        "x-openrouter-cache-status"
    ] == "HIT"


async def test_the_ttl_expires_and_clear_refreshes_the_entry(start_sim: Any) -> None:
    now = [0.0]
    _sim, client = await start_sim(speed=float("inf"), clock=lambda: now[0])
    body = chat_body(max_tokens=30)
    ttl = {**ON, "X-OpenRouter-Cache-TTL": "60"}
    first = await client.post("/chat/completions", body, headers=ttl)
    assert first.headers["x-openrouter-cache-ttl"] == "60"
    now[0] = 59.0
    hit = await client.post("/chat/completions", body, headers=ttl)
    assert hit.headers["x-openrouter-cache-status"] == "HIT"
    assert hit.headers["x-openrouter-cache-age"] == "59"
    assert hit.headers["x-openrouter-cache-ttl"] == "1"
    now[0] = 60.0
    expired = await client.post("/chat/completions", body, headers=ttl)
    assert expired.headers["x-openrouter-cache-status"] == "MISS"
    cleared = await client.post(
        "/chat/completions", body, headers={**ttl, "X-OpenRouter-Cache-Clear": "true"}
    )
    assert cleared.headers["x-openrouter-cache-status"] == "MISS"
    refreshed = await client.post("/chat/completions", body, headers=ttl)
    assert refreshed.headers["x-openrouter-cache-source-id"] == cleared.json["id"]


async def test_account_level_zdr_turns_caching_off(start_sim: Any) -> None:
    sim, client = await start_sim(account_zdr=True)
    body = chat_body(max_tokens=30)
    for _ in range(2):
        reply = await client.post("/chat/completions", body, headers=ON)
        assert "x-openrouter-cache-status" not in reply.headers
    assert all(r.cost > 0 for r in sim.requests)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, 300),
        ("60", 60),
        ("60abc", 60),
        ("1.5", 1),
        ("abc", 300),
        ("", 300),
        ("0", 1),
        ("-5", 1),
        ("86401", 86_400),
        ("999999999", 86_400),
        (" 120 ", 120),
    ],
)
def test_the_ttl_header_is_parsed_and_clamped_as_documented(
    header: str | None, seconds: int
) -> None:
    assert parse_ttl(header) == seconds
