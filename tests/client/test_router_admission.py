"""Cost-first admission through the Router, against the local OpenRouter over real sockets.

The capacity-limited market: the three cheapest allowed endpoints (Chutes, Novita,
DeepInfra) answer 429 beyond a few requests in flight (``max_in_flight`` faults).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _markets import edited_market
from _router_helpers import KIMI, MESSAGES, MakeRouter

from provider_router import AffinityOptions, Catalog, MemoryLedger, ProviderPolicy, RouterStopping
from provider_router.routing.ranking import Workload
from provider_router.testing import SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]

CAPPED = ("chutes", "novita", "deepinfra")


def limited(capacity: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"kind": "rate_limit", "provider": tag, "max_in_flight": capacity, **extra}
        for tag in CAPPED
    ]


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Say hello, number {i}."}] for i in range(n)]


def only_admitted_endpoints(sim: SimulatorServer, allowed: set[str]) -> None:
    """Every request went to one endpoint alone, and every attempt OpenRouter made was
    at that endpoint: nothing spilled where the router did not send it."""
    for record in sim.requests:
        if record.route != "chat":
            continue
        routing = record.routing
        assert routing is not None
        (tag,) = routing["only"]
        assert routing["allow_fallbacks"] is False
        assert "order" not in routing
        assert tag in allowed
        assert {attempt for attempt, _ in record.attempts} == {tag}


@pytest.mark.parametrize("stream", [False, True])
async def test_with_no_premium_the_floor_serves_everything_and_refusals_come_back_to_us(
    openrouter_sim_factory: Factory, make_router: MakeRouter, stream: bool
) -> None:
    sim = await openrouter_sim_factory(speed=200.0, completion_tokens=20, faults=limited(3))
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, max_premium=0, ledger=ledger)
    results = await asyncio.gather(
        *(router.chat(m, max_tokens=50, stream=stream) for m in prompts(30))
    )
    assert {r.provider for r in results} == {"Chutes"}
    assert {r.endpoint for r in results} == {"chutes"}
    assert sum(r.cost or 0 for r in results) == sum(r.floor_cost or 0 for r in results)
    assert all(r.price_vs_floor == 1 for r in results)
    only_admitted_endpoints(sim, set(router.plan.order))
    chutes = router.admission.snapshot()["chutes"]
    assert chutes.refused > 0, "the full endpoint's 429s reached the router"
    assert chutes.capacity is not None
    # About the three it takes: what was still in flight on our side when a 429 came,
    # which can count answers the simulator has finished and we are still reading.
    assert 1 <= chutes.capacity <= 6
    assert sum(r.refusals for r in results) == chutes.refused
    assert all(r.attempts == 1 for r in results), "a refusal is no retry"
    assert any(r.waited > 0 for r in results)
    assert router.health.stats("Chutes").demotions == 0  # type: ignore[union-attr]
    state = await ledger.snapshot()
    assert state.spent == sum(r.cost or 0 for r in results)
    assert state.reserved == 0
    # Each reservation was Chutes' own worst case, not the dearest allowed endpoint's.
    chutes_route = router.plan.route("chutes")
    for messages, result in zip(prompts(30), results, strict=True):
        request = router._build_request(messages, 50, stream, None, None, {})
        assert result.reserved == chutes_route.worst_case(request.prompt_tokens, 50)
        assert result.reserved < router.plan.worst_case(request.prompt_tokens, 50)


async def test_the_default_router_pays_the_floor_within_two_percent_on_a_full_market(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    """The issue's finding: with every allowed endpoint in one request and fallbacks on,
    a full Chutes spilled inside OpenRouter to whichever dearer endpoint had room. Now
    each request goes where the Router admitted it, and the default pays within 2 % of
    the floor (plus what the dearer attempts still in flight at the end may add)."""
    sim = await openrouter_sim_factory(speed=200.0, completion_tokens=20, faults=limited(3))
    router = await make_router(sim)
    floor_endpoint = router.plan.ranked[0].endpoint
    assert floor_endpoint.slug == "chutes"
    results = await asyncio.gather(*(router.chat(m, max_tokens=50) for m in prompts(60)))
    only_admitted_endpoints(sim, set(router.plan.order))
    floors = []
    for result in results:
        assert result.usage is not None
        assert result.cost is not None
        floors.append(
            floor_endpoint.pricing.cost(result.usage.prompt_tokens, result.usage.completion_tokens)
        )
    paid, floor = sum(r.cost or 0 for r in results), sum(floors)
    extra = max((r.cost or 0) - f for r, f in zip(results, floors, strict=True))
    assert floor <= paid <= floor * Decimal("1.02") + 6 * extra
    assert sum(r.provider == "Chutes" for r in results) > len(results) // 2


async def test_latency_first_spills_only_to_endpoints_the_router_chose(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(speed=200.0, completion_tokens=20, faults=limited(3))
    router = await make_router(sim, max_premium=None)
    results = await asyncio.gather(*(router.chat(m, max_tokens=50) for m in prompts(30)))
    served = {r.provider for r in results}
    assert "Chutes" in served
    assert len(served) > 1, "with no cap, the next endpoint with room serves"
    assert served <= router.plan.allowed_providers
    assert not any(r.waited for r in results), "no waiting while an endpoint has room"
    only_admitted_endpoints(sim, set(router.plan.order))
    assert {r.endpoint for r in results} <= set(router.plan.order) - {"fireworks", "baseten"}


async def test_a_premium_lets_dearer_endpoints_serve_within_it(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(speed=200.0, completion_tokens=20, faults=limited(2))
    router = await make_router(sim, max_premium="0.06")
    results = await asyncio.gather(*(router.chat(m, max_tokens=50) for m in prompts(40)))
    paid = sum(r.cost or 0 for r in results)
    floor = sum(r.floor_cost or 0 for r in results)
    # At most the cap, plus what the dearest attempts in flight at the end could add.
    worst_extra = max(route.cost_per_request for route in router.plan.routes)
    assert paid / floor <= Decimal("1.06") + 2 * worst_extra / floor
    assert len({r.provider for r in results}) > 1
    only_admitted_endpoints(sim, set(router.plan.order))


async def test_stop_fails_requests_waiting_for_an_endpoint_before_anything_is_sent(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=10)
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, max_premium=0, max_concurrency=2, ledger=ledger)
    admission = router.admission
    held = [admission.try_admit(admission.queue(), admission.next_seq()) for _ in range(2)]
    assert all(held), "the floor, full"
    waiting = [asyncio.ensure_future(router.chat(m, max_tokens=50)) for m in prompts(20)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert admission.waiting == 2  # the limiter's two slots; the rest wait for those
    router.stop()
    outcomes = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(o, RouterStopping) for o in outcomes)
    assert all("not sent" in str(o) for o in outcomes)
    assert sim.requests == []
    state = await ledger.snapshot()
    assert (state.reserved, state.spent, state.open) == (0, 0, 0)
    for ticket in held:
        assert ticket is not None
        admission.release(ticket, "neutral")


async def test_a_cancelled_waiter_gives_its_place_back(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=10)
    router = await make_router(sim, max_premium=0, max_concurrency=4)
    admission = router.admission
    held = admission.try_admit(admission.queue(), admission.next_seq())
    assert held is not None
    admission._lanes["chutes"].limit = 1  # one place, held
    task = asyncio.ensure_future(router.chat(MESSAGES, max_tokens=20))
    for _ in range(20):
        await asyncio.sleep(0)
    assert admission.waiting == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    admission.release(held, "neutral")
    assert admission.snapshot()["chutes"].in_flight == 0
    assert admission.waiting == 0
    result = await router.chat(MESSAGES, max_tokens=20)
    assert result.endpoint == "chutes"


async def test_an_endpoint_repriced_above_its_ceiling_is_left_for_the_next(
    tmp_path: Path, openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    """The listing said Chutes $2.00/M; it now asks $2.20: its own max_price filters
    it (404, free), the router admits the request elsewhere and nothing is billed twice."""

    def cheaper_chutes(endpoint: dict[str, Any]) -> None:
        if endpoint["slug"] == "chutes":
            endpoint["pricing"] = {**endpoint["pricing"], "completion": "2.00"}

    listing_sim = await openrouter_sim_factory(market=edited_market(tmp_path, cheaper_chutes))
    async with Catalog(listing_sim.url) as catalog:
        stale = await catalog.endpoints(KIMI)
    sim = await openrouter_sim_factory(completion_tokens=10)
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, endpoints=stale, ledger=ledger)
    result = await router.chat(MESSAGES, max_tokens=20)
    assert result.endpoint != "chutes"
    assert result.attempts == 1
    gone = [r for r in sim.requests if r.status == 404]
    assert len(gone) == 1
    assert gone[0].routing["only"] == ["chutes"]  # type: ignore[index]
    assert router.admission.snapshot()["chutes"].retired
    state = await ledger.snapshot()
    assert state.spent == result.cost
    assert state.reserved == 0


async def test_a_platform_429_is_the_keys_and_an_endpoint_429_its_lanes(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(speed=200.0, completion_tokens=10, faults=limited(2))
    router = await make_router(sim, max_premium=None, max_concurrency=100)
    await asyncio.gather(*(router.chat(m, max_tokens=20) for m in prompts(12)))
    assert router.admission.snapshot()["chutes"].refused > 0
    limiter = router.limiter
    assert not limiter.slow_start or limiter.limit <= 100
    assert limiter.window >= 32, "an endpoint's 429s never cut the key's window"
    assert limiter._epoch == 0, "no decrease"


async def test_an_excluded_endpoint_is_never_sent_to_even_when_every_allowed_one_is_full(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    """Latency first, every capped endpoint full and Novita (cheap, room to spare once
    uncapped) excluded by the policy: the spill goes only where the policy allows, and
    OpenRouter never tried an excluded endpoint inside any request either."""
    faults = [
        {"kind": "rate_limit", "provider": tag, "max_in_flight": 2}
        for tag in ("chutes", "deepinfra")
    ]
    sim = await openrouter_sim_factory(speed=50.0, completion_tokens=20, faults=faults)
    router = await make_router(
        sim,
        max_premium=None,
        policy=ProviderPolicy(exclude_below="int4", exclude_providers=["Novita"]),
    )
    excluded = {"novita", "fireworks", "baseten"}
    assert excluded <= set(router.plan.ignore)
    assert not excluded & set(router.plan.order)
    results = await asyncio.gather(*(router.chat(m, max_tokens=50) for m in prompts(40)))
    assert router.admission.snapshot()["chutes"].refused > 0, "the cheap ones were full"
    assert len({r.endpoint for r in results}) > 2, "it spilled"
    assert not {r.endpoint for r in results} & excluded
    assert {r.provider for r in results} <= router.plan.allowed_providers
    only_admitted_endpoints(sim, set(router.plan.order))
    tried = {tag for record in sim.requests for tag, _ in record.attempts}
    assert not tried & excluded, "OpenRouter was never let near an excluded endpoint"
    assert all(set(r.routing["ignore"]) >= excluded for r in sim.requests if r.routing)


async def test_pinned_sessions_wait_for_their_full_pin_and_refusals_never_move_them(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    """Cache affinity under capacity limits: eight conversations pinned to DeepInfra (its
    cache reads) while it takes two at a time. Its 429s come back to the Router, the
    pinned requests wait for their own endpoint instead of spilling, and no session
    moves: a refusal is the endpoint being full, not failing the session."""
    sim = await openrouter_sim_factory(speed=50.0, completion_tokens=20, faults=limited(2))
    router = await make_router(
        sim,
        max_premium=None,  # latency first: only the pin holds these requests back
        workload=LONG,
        cache_affinity=AffinityOptions(hit_rate="0.9"),
    )
    assert router.plan.cache_ranked[0].endpoint.slug == "deepinfra"

    async def conversation(n: int) -> list[str | None]:
        return [
            (await router.chat(messages, max_tokens=50)).endpoint
            for messages in conversation_turns(3, n)
        ]

    served = await asyncio.gather(*(conversation(n) for n in range(8)))
    assert {tag for turns in served for tag in turns} == {"deepinfra"}
    deepinfra = router.admission.snapshot()["deepinfra"]
    assert deepinfra.refused > 0, "the pin was full"
    assert deepinfra.waited_requests > 0, "pinned requests waited for it"
    assert router.affinity.pinned == 8
    assert router.affinity.moves == 0
    only_admitted_endpoints(sim, {"deepinfra"})


def conversation_turns(n: int, conversation: int) -> list[list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": LONG_SYSTEM}]
    out = []
    for turn in range(n):
        messages = [*messages, {"role": "user", "content": f"Chat {conversation}, turn {turn}?"}]
        out.append(messages)
        messages = [*messages, {"role": "assistant", "content": f"Reply {turn}. " * 30}]
    return out


LONG_SYSTEM = "You write careful multi-turn training data. " * 60
LONG = Workload(prompt_tokens=20_000, completion_tokens=400)
