"""Router against the real local OpenRouter: routing, results, money, streaming."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import pytest
from _router_helpers import KIMI, MESSAGES, MakeRouter, RecordingSleep, route_first

from provider_router import (
    BudgetExhausted,
    Catalog,
    ConfigurationError,
    Ledger,
    MemoryLedger,
    ProviderPolicy,
    Reservation,
    Router,
    SQLiteLedger,
    Timeouts,
)
from provider_router._constants import PER_MILLION
from provider_router.testing import SimulatorServer
from provider_router.testing.chat.synth import count_prompt_tokens

pytestmark = pytest.mark.openrouter_sim(completion_tokens=50)


async def test_chat_returns_a_result_and_settles_the_ledger(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    ledger = MemoryLedger(Decimal(10))
    before = openrouter_sim.balance
    router = await make_router(openrouter_sim, ledger=ledger)
    result = await router.chat(MESSAGES, max_tokens=100)
    record = openrouter_sim.requests[-1]
    assert result.text
    assert result.provider == record.provider == "Chutes"  # cheapest allowed
    assert result.generation_id == record.generation_id
    assert result.finish_reason == "stop"
    assert result.usage is not None
    assert result.usage.completion_tokens == 50
    assert result.cost == record.cost
    assert result.estimate == result.cost
    assert result.drift == 0
    assert not result.quarantined
    assert result.attempts == 1
    state = await ledger.snapshot()
    assert state.spent == result.cost == before - openrouter_sim.balance
    assert state.reserved == 0
    assert router.spent == result.cost
    assert result.reserved is not None
    assert result.reserved >= result.cost


async def test_routing_object_follows_policy_and_ranking(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    await router.chat(MESSAGES, max_tokens=64)
    routing = openrouter_sim.requests[-1].routing
    plan = router.plan
    # The plan's whole routing object (what the Batch API route sends)...
    whole = plan.provider_object()
    allowed = {r.endpoint.slug for r in plan.ranked}
    assert set(whole["only"]) == allowed
    assert whole["order"] == [r.endpoint.slug for r in plan.ranked]
    assert {"fireworks", "baseten"} <= set(whole["ignore"])
    assert not {"fireworks", "baseten"} & set(whole["only"])
    assert whole["allow_fallbacks"] is True
    prices = [r.endpoint.pricing for r in plan.ranked]
    assert Decimal(whole["max_price"]["completion"]) == max(p.completion for p in prices) * (
        PER_MILLION
    )
    assert Decimal(whole["max_price"]["prompt"]) == max(p.prompt for p in prices) * PER_MILLION
    # ... and what a chat attempt sends: the admitted endpoint alone, at its own prices,
    # with no fallback (and no order: sticky routing stays on).
    best = plan.ranked[0].endpoint
    assert routing == plan.route(best.slug).object
    assert routing["only"] == [best.slug]
    assert routing["allow_fallbacks"] is False
    assert "order" not in routing
    assert routing["ignore"] == whole["ignore"]
    assert Decimal(routing["max_price"]["completion"]) == best.pricing.completion * PER_MILLION
    assert Decimal(routing["max_price"]["prompt"]) == best.pricing.prompt * PER_MILLION
    # ranked by cost: the first is the cheapest per request of the workload
    costs = [r.expected_cost_per_success for r in plan.ranked]
    assert costs[0] == min(costs)


async def test_request_body_validates_against_the_openapi_schema(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, openapi_validator
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    for stream in (False, True):
        request = router._build_request(
            MESSAGES, 256, stream, None, None, {"temperature": 0.2, "reasoning": {"effort": "low"}}
        )
        route_first(router, request)
        body = json.loads(request.payload)
        openapi_validator("ChatRequest", body)
        assert body["provider"]["max_price"]["completion"]
        assert ("stream" in body) is stream


async def test_worst_case_reservation_covers_the_real_cost(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    long = [{"role": "user", "content": "héllo wörld " * 200}]
    request = router._build_request(long, 50, False, None, None, {})
    assert request.prompt_estimate >= count_prompt_tokens(long)
    route_first(router, request)  # the worst case is the admitted endpoint's
    result = await router.chat(long, max_tokens=50)
    assert result.reserved is not None
    assert result.cost is not None
    assert result.cost <= result.reserved
    assert result.reserved == request.worst_case
    assert request.worst_case < request.plan.worst_case(request.prompt_tokens, 50)


async def test_streaming_collects_text_usage_and_deltas(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    ledger = MemoryLedger(Decimal(10))
    router = await make_router(openrouter_sim, ledger=ledger)
    async with router.stream(MESSAGES, max_tokens=100) as stream:
        deltas = [delta async for delta in stream]
    result = stream.result
    assert result is not None
    assert deltas
    assert "".join(d.text for d in deltas) == result.text
    assert all(d.attempt == 1 for d in deltas)
    assert result.usage is not None
    assert result.usage.completion_tokens == 50
    assert result.cost == openrouter_sim.requests[-1].cost
    assert openrouter_sim.requests[-1].stream
    assert (await ledger.snapshot()).spent == result.cost


@pytest.mark.openrouter_sim(completion_tokens=40, speed=1000.0, keepalive_seconds=0.2)
async def test_streaming_with_reasoning_and_keep_alives(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    result = await router.chat(MESSAGES, max_tokens=100, stream=True, reasoning={"effort": "high"})
    assert result.usage is not None
    assert result.usage.completion_tokens == 40
    assert result.reasoning
    assert result.usage.reasoning_tokens > 0
    assert result.finish_reason in ("stop", "length")


async def test_max_tokens_required_with_a_ledger(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    with pytest.raises(ConfigurationError, match="max_tokens is required"):
        await router.chat(MESSAGES)
    with pytest.raises(ConfigurationError, match="max_tokens must be a positive int"):
        await router.chat(MESSAGES, max_tokens=0)
    with pytest.raises(ConfigurationError, match="'provider' is set by the Router"):
        await router.chat(MESSAGES, max_tokens=5, provider={"only": ["fireworks"]})
    assert openrouter_sim.requests == []


async def test_router_must_be_open() -> None:
    router = Router(KIMI, base_url="http://127.0.0.1:9/api/v1", api_key="k")
    with pytest.raises(ConfigurationError, match="not open"):
        await router.chat(MESSAGES, max_tokens=5)
    with pytest.raises(ConfigurationError, match="author/slug"):
        Router("kimi")
    with pytest.raises(ConfigurationError, match=r"Timeouts\.request"):
        Router(KIMI, timeouts=Timeouts(request=0))


async def test_budget_exhausted_before_anything_is_sent(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal("0.001")))
    with pytest.raises(BudgetExhausted):
        await router.chat(MESSAGES, max_tokens=8192)
    assert openrouter_sim.requests == []
    assert router.limiter.in_flight == 0


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_budget_never_exceeded_under_concurrency(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, backend: str, tmp_path
) -> None:
    limit = Decimal("0.01")
    ledger: Ledger
    if backend == "memory":
        ledger = MemoryLedger(limit)
    else:
        ledger = SQLiteLedger(tmp_path / "b.ledger", limit=limit)
    async with ledger:
        # budget_wait: requests wait for settlements and give up only when even
        # settling everything in flight could not make room.
        router = await make_router(
            openrouter_sim, ledger=ledger, max_concurrency=64, budget_wait=True
        )
        first = router._build_request(MESSAGES, 60, False, None, None, {})
        route_first(router, first)  # the worst case of the endpoint it is admitted to
        worst = first.worst_case

        async def one(i: int) -> str:
            try:
                await router.chat(MESSAGES, max_tokens=60, key=f"p{i}")
            except BudgetExhausted:
                return "budget"
            return "ok"

        outcomes = await asyncio.gather(*(one(i) for i in range(300)))
        state = await ledger.snapshot()
    assert outcomes.count("ok") > 0
    assert outcomes.count("budget") > 0
    assert state.spent + state.reserved <= limit
    assert state.reserved == 0
    charged = sum((r.cost for r in openrouter_sim.requests), Decimal(0))
    assert state.spent == charged == router.spent
    # everything that could fit did: less than one worst case is left over
    assert limit - state.spent < worst


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_default_settings_use_the_whole_budget(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, backend: str, tmp_path
) -> None:
    # Gathered at once, as most users write it: refusing while requests in flight
    # would still free room left 5-15 % of the budget unused (#13, P2).
    limit = Decimal("0.01")
    ledger: Ledger = (
        MemoryLedger(limit)
        if backend == "memory"
        else SQLiteLedger(tmp_path / "b.ledger", limit=limit)
    )
    async with ledger:
        router = await make_router(openrouter_sim, ledger=ledger, max_concurrency=64)
        first = router._build_request(MESSAGES, 60, False, None, None, {})
        route_first(router, first)  # the worst case of the endpoint it is admitted to
        worst = first.worst_case
        outcomes = await asyncio.gather(
            *(router.chat(MESSAGES, max_tokens=60) for _ in range(300)), return_exceptions=True
        )
        state = await ledger.snapshot()
    refused = [o for o in outcomes if isinstance(o, BudgetExhausted)]
    assert refused
    assert len(refused) + router.requests == 300
    assert state.reserved == 0
    assert limit - state.spent < worst  # every request that could still fit was sent


async def test_budget_wait_lets_a_request_wait_for_settlement(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    worst = router.plan.worst_case(
        router._build_request(MESSAGES, 60, False, None, None, {}).prompt_estimate, 60
    )
    ledger = MemoryLedger(worst * Decimal("2.2"))
    router.ledger = ledger
    router.budget_wait = True
    results = await asyncio.gather(*(router.chat(MESSAGES, max_tokens=60) for _ in range(3)))
    assert len(results) == 3
    assert (await ledger.snapshot()).settled == 3


async def test_generation_cost_retries_the_short_lived_404(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, recording_sleep: RecordingSleep
) -> None:
    router = await make_router(openrouter_sim)
    result = await router.chat(MESSAGES, max_tokens=30)
    assert result.generation_id is not None
    cost = await router.generation_cost(result.generation_id)
    assert cost == result.cost
    assert recording_sleep.calls == [0.5]  # one 404, then the record
    assert await router.generation_cost("gen-unknown", attempts=2) is None


async def test_resolve_hook_for_ledger_recovery(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    result = await router.chat(MESSAGES, max_tokens=30)
    orphan = Reservation(id="r1", units=10**9, key="p1", generation_id=result.generation_id)
    assert await router.resolve(orphan) == result.cost
    assert await router.resolve(Reservation(id="r2", units=1, key="p2")) is None


async def test_catalog_is_refreshed_after_its_ttl(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    now = [0.0]
    async with Catalog(openrouter_sim.url, ttl=60) as catalog:
        router = await make_router(openrouter_sim, clock=lambda: now[0], endpoints=catalog)
        assert router.catalog_ttl == 60
        fetches = openrouter_sim.log.counters["route.endpoints"]
        await router.chat(MESSAGES, max_tokens=5)
        assert openrouter_sim.log.counters["route.endpoints"] == fetches
        now[0] = 61.0
        await router.chat(MESSAGES, max_tokens=5)
        await asyncio.sleep(0.05)
        assert router._plans._refresh is not None
        await router._plans._refresh
        assert openrouter_sim.log.counters["route.endpoints"] == fetches + 1


async def test_fixed_endpoints_listing_needs_no_catalog(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    first = await make_router(openrouter_sim)
    listing = first._plans.catalog.endpoints  # type: ignore[union-attr]
    endpoints = await listing(KIMI)
    fetches = openrouter_sim.log.counters["route.endpoints"]
    router = await make_router(openrouter_sim, endpoints=endpoints)
    assert router.plan.order == first.plan.order
    assert openrouter_sim.log.counters["route.endpoints"] == fetches


async def test_policy_excluding_everything_is_a_configuration_error(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    with pytest.raises(ConfigurationError, match="allows no endpoint"):
        await make_router(openrouter_sim, policy=ProviderPolicy(exclude_below="fp32"))


async def test_logs_one_canonical_line_per_request(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, log_events: list[dict[str, Any]]
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    result = await router.chat(MESSAGES, max_tokens=20, key="prompt-7")
    done = [e for e in log_events if e["event"] == "route.done"]
    assert len(done) == 1
    line = done[0]
    assert line["log_level"] == "debug"
    assert line["key"] == "prompt-7"
    assert line["provider"] == "Chutes"
    assert line["generation_id"] == result.generation_id
    assert line["cost"] == str(result.cost)
    assert line["attempts"] == 1
