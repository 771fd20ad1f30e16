"""Token logprobs from the local OpenRouter: where listed, shaped as the spec says,
deterministic under a seed, and measurably different from a secretly degraded endpoint."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from _markets import degraded_market
from _sim_client import SimClient, StartSim
from _sim_contract import contract

from provider_router.testing.chat.logprobs import MAX_TOP_LOGPROBS

CHAT = "/chat/completions"
GREEDY: dict[str, Any] = {"max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 5}


def pinned(tag: str) -> dict[str, Any]:
    return {"only": [tag], "allow_fallbacks": False}


async def ask(client: SimClient, tag: str, **extra: Any) -> dict[str, Any]:
    reply = await client.chat(provider=pinned(tag), **{**GREEDY, **extra})
    assert reply.status == 200, reply.text
    body: dict[str, Any] = reply.json
    return body


def content_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs is not None
    entries: list[dict[str, Any]] = logprobs["content"]
    return entries


async def test_an_endpoint_listing_logprobs_answers_with_them_as_the_spec_says(
    start_sim: StartSim,
) -> None:
    _, client = await start_sim(seed=5)
    body = await ask(client, "moonshotai")
    contract().validate(CHAT, "post", 200, body)
    entries = content_of(body)
    text = body["choices"][0]["message"]["content"]
    assert "".join(e["token"] for e in entries) == text
    assert len(entries) == body["usage"]["completion_tokens"] == 24
    for entry in entries:
        assert entry["bytes"] == list(entry["token"].encode())
        top = entry["top_logprobs"]
        assert len(top) == 5
        # Greedy: the token written is the most likely one, and the list is sorted.
        assert top[0]["token"] == entry["token"]
        assert top[0]["logprob"] == entry["logprob"]
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert math.fsum(math.exp(t["logprob"]) for t in top) < 1.0
        assert all(t["bytes"] == list(t["token"].encode()) for t in top)


async def test_an_endpoint_not_listing_logprobs_answers_null(start_sim: StartSim) -> None:
    _, client = await start_sim(seed=5)
    body = await ask(client, "chutes")
    assert body["choices"][0]["logprobs"] is None


async def test_logprobs_are_the_same_for_the_same_seed_and_honest_endpoints_agree(
    start_sim: StartSim,
) -> None:
    _, first = await start_sim(seed=5)
    _, again = await start_sim(seed=5)
    _, other = await start_sim(seed=6)
    ours = content_of(await ask(first, "moonshotai"))
    assert ours == content_of(await ask(again, "moonshotai"))
    # Honest endpoints serve the same weights: the same distributions.
    assert ours == content_of(await ask(first, "deepinfra"))
    assert ours != content_of(await ask(other, "moonshotai"))


async def test_top_logprobs_zero_gives_the_tokens_alone(start_sim: StartSim) -> None:
    _, client = await start_sim(seed=5)
    entries = content_of(await ask(client, "together", top_logprobs=0))
    assert entries
    assert all(e["top_logprobs"] == [] for e in entries)
    plain = content_of(await ask(client, "together", top_logprobs=None))
    assert [e["top_logprobs"] for e in plain] == [[] for _ in plain]


async def test_a_degraded_endpoint_serves_another_distribution(
    tmp_path: Path, start_sim: StartSim
) -> None:
    market = degraded_market(tmp_path, {"novita": {"agreement": 0.7}})
    _, client = await start_sim(seed=5, market=market)
    honest = content_of(await ask(client, "moonshotai", max_tokens=64))
    degraded_body = await ask(client, "novita", max_tokens=64)
    degraded = content_of(degraded_body)
    contract().validate(CHAT, "post", 200, degraded_body)
    written = degraded_body["choices"][0]["message"]["content"]
    assert "".join(e["token"] for e in degraded) == written
    swapped = [i for i, (a, b) in enumerate(zip(honest, degraded, strict=True)) if a != b]
    assert len(swapped) == 64, "every position's distribution is perturbed"
    for entry in degraded:  # still greedy: the token written comes first
        assert entry["top_logprobs"][0]["token"] == entry["token"]
    moved = [
        abs(math.exp(a["logprob"]) - math.exp(b["logprob"]))
        for a, b in zip(honest, degraded, strict=True)
        if a["token"] == b["token"]
    ]
    assert sum(moved) / len(moved) > 0.02
    # Deterministic too: the same request, the same perturbation.
    assert degraded == content_of(await ask(client, "novita", max_tokens=64))


async def test_a_stream_carries_each_chunks_own_logprobs(start_sim: StartSim) -> None:
    _, client = await start_sim(seed=5)
    whole = content_of(await ask(client, "moonshotai"))
    reply = await client.chat(provider=pinned("moonshotai"), stream=True, **GREEDY)
    assert reply.status == 200
    streamed: list[dict[str, Any]] = []
    for event in reply.events:
        contract().validate_chunk(event)
        choice = event["choices"][0]
        if choice["delta"].get("content"):
            assert choice["logprobs"] is not None
            assert (
                "".join(e["token"] for e in choice["logprobs"]["content"])
                == (choice["delta"]["content"])
            )
            streamed.extend(choice["logprobs"]["content"])
    assert streamed == whole


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"top_logprobs": MAX_TOP_LOGPROBS + 1}, "top_logprobs"),
        ({"top_logprobs": -1}, "top_logprobs"),
        ({"top_logprobs": "5"}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"logprobs": False, "top_logprobs": 3}, "requires logprobs"),
    ],
)
async def test_bad_logprobs_fields_are_a_400_naming_them(
    start_sim: StartSim, extra: dict[str, Any], where: str
) -> None:
    _, client = await start_sim(seed=5)
    reply = await client.chat(provider=pinned("moonshotai"), **{**GREEDY, **extra})
    assert reply.status == 400
    contract().validate(CHAT, "post", 400, reply.json)
    assert where in reply.json["error"]["message"]
