"""OpenRouter's response cache through the Router: a prompt re-sent with the same key
is a free HIT booked at $0, two samples of one prompt never share an answer, and a
hit is booked free only on the answer's word."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal

import pytest
from _router_helpers import MakeRouter

from provider_router import ConfigurationError, MemoryLedger, Router
from provider_router.client._response_cache import cache_headers
from provider_router.testing import SimulatorServer

HELLO = [{"role": "user", "content": "Say hello."}]
Factory = Callable[..., Awaitable[SimulatorServer]]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_prompt_sent_again_with_its_key_is_a_hit_booked_at_zero(
    openrouter_sim_factory: Factory, make_router: MakeRouter, stream: bool
) -> None:
    sim = await openrouter_sim_factory(generation_404s=0)
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, ledger=ledger, headers=cache_headers(3600))
    first = await router.chat(HELLO, max_tokens=40, key="data/p1", stream=stream)
    assert first.cache_status == "MISS"
    assert first.cost is not None
    assert first.cost > 0
    charged = sim.simulator.usage
    again = await router.chat(HELLO, max_tokens=40, key="data/p1", stream=stream)
    assert again.cache_status == "HIT"
    assert again.cost == 0
    assert again.text == first.text
    assert again.generation_id != first.generation_id
    assert sim.simulator.usage == charged  # the account did not move
    assert (await ledger.snapshot()).spent == charged  # nor did the ledger
    # The request asked for the cache; the headers and the sample id went with it.
    chats = [r for r in sim.requests if r.route == "chat"]
    assert [r.outcome for r in chats] == ["ok", "cache_hit"]


async def test_two_samples_of_one_prompt_never_share_an_answer(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory()
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, ledger=ledger, headers=cache_headers())
    samples = [await router.chat(HELLO, max_tokens=40, key=f"data/p1-{n}") for n in (1, 2)]
    unlabelled = [await router.chat(HELLO, max_tokens=40) for _ in range(2)]
    assert [r.cache_status for r in samples + unlabelled] == ["MISS"] * 4
    assert all(r.cost is not None and r.cost > 0 for r in samples + unlabelled)
    assert (await ledger.snapshot()).spent == sim.simulator.usage


async def test_a_hit_without_a_cost_is_free_on_its_word_and_a_miss_without_one_is_not(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(
        generation_404s=0, faults=[{"kind": "no_usage_cost", "times": 1}]
    )
    sim.simulator.response_cache.hit_cost = False  # hit bodies with no usage.cost
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(
        sim, ledger=ledger, headers={"x-openrouter-cache": "TRUE", "X-OpenRouter-Cache-TTL": "60"}
    )
    miss = await router.chat(HELLO, max_tokens=40, key="k")
    assert miss.cache_status == "MISS"
    assert miss.usage is not None
    assert miss.usage.cost is None  # no cost in the answer: /generation's is booked
    assert miss.cost == sim.simulator.usage > 0
    hit = await router.chat(HELLO, max_tokens=40, key="k")
    assert hit.cache_status == "HIT"
    assert hit.usage is not None
    assert hit.usage.cost is None
    assert hit.cost == 0
    assert (await ledger.snapshot()).spent == sim.simulator.usage
    lookups = [r for r in sim.simulator.log.records if r.route == "generation"]
    assert len(lookups) == 1  # only the miss asked /generation


async def test_without_response_cache_nothing_is_asked_or_added(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory()
    router = await make_router(sim, ledger=MemoryLedger(Decimal(1)))
    results = [await router.chat(HELLO, max_tokens=40, key="k") for _ in range(2)]
    assert [r.cache_status for r in results] == [None, None]
    assert all(r.outcome == "ok" for r in sim.requests if r.route == "chat")


def test_the_cache_headers_are_checked_and_read_as_openrouter_reads_them() -> None:
    for bad in (0, 86_401, 1.5, "300", True):
        with pytest.raises(ConfigurationError, match="TTL must be whole seconds"):
            cache_headers(bad)  # type: ignore[arg-type]
    assert cache_headers(60) == {"X-OpenRouter-Cache": "true", "X-OpenRouter-Cache-TTL": "60"}
    model = "moonshotai/kimi-k2.5"
    assert Router(model, headers=cache_headers(90)).response_cache == 90
    assert Router(model, headers={"x-openrouter-cache": "true"}).response_cache == 300
    assert Router(model, headers={"X-OpenRouter-Cache": "false"}).response_cache is None
    ttl = {"X-OpenRouter-Cache": "true", "X-OpenRouter-Cache-TTL": "999999"}
    assert Router(model, headers=ttl).response_cache == 86_400
    assert Router(model).response_cache is None
