"""Belt and braces: absurd costs, unknown providers and repeated violations are loud.

The local OpenRouter plays a misbehaving server: one that bills above its listed
prices (``overcharge``), answers without naming the provider (``anonymous``), or
serves as a provider the router's listing, read earlier, never named.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _router_helpers import KIMI, MESSAGES, MakeRouter, served_as

from provider_router import Catalog, ConfigurationError, MemoryLedger, Router, Safeguards
from provider_router.catalog.records import ModelEndpoints
from provider_router.cli._exit_codes import EXIT_CODES
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, Market, SimulatorServer

Factory = Any


async def stale_listing(factory: Factory) -> ModelEndpoints:
    listing_sim = await factory()
    async with Catalog(listing_sim.url) as catalog:
        return await catalog.endpoints(KIMI)


async def test_a_cost_far_above_its_reservation_is_an_anomaly(
    openrouter_sim_factory: Factory, make_router: MakeRouter, log_events: list[dict[str, Any]]
) -> None:
    sim = await openrouter_sim_factory(overcharge=20, completion_tokens=50)
    ledger = MemoryLedger(Decimal(10))
    router = await make_router(sim, ledger=ledger)
    result = await router.chat(MESSAGES, max_tokens=50)
    logs = log_events
    # The paid answer is kept, at its real cost.
    assert result.text
    assert result.cost == sim.requests[-1].cost
    assert result.reserved is not None
    assert result.cost > 2 * result.reserved
    assert (await ledger.snapshot()).spent == result.cost
    overrun = [e for e in logs if e["event"] == "route.overrun"]
    anomaly = [e for e in logs if e["event"] == "route.cost_anomaly"]
    assert [e["log_level"] for e in overrun + anomaly] == ["error", "error"]
    assert anomaly[0]["generation_id"] == result.generation_id
    assert Decimal(anomaly[0]["cost"]) == result.cost
    assert router.halted is not None
    assert result.generation_id is not None
    assert result.generation_id in router.halted


async def test_an_overrun_below_the_factor_is_logged_but_does_not_halt(
    openrouter_sim_factory: Factory, make_router: MakeRouter, log_events: list[dict[str, Any]]
) -> None:
    sim = await openrouter_sim_factory(overcharge=20, completion_tokens=50)
    router = await make_router(
        sim, ledger=MemoryLedger(Decimal(10)), safeguards=Safeguards(cost_sanity_factor=1000)
    )
    await router.chat(MESSAGES, max_tokens=50)
    logs = log_events
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["route.overrun"]
    assert router.halted is None


async def test_costs_within_the_reservation_are_quiet(
    openrouter_sim_factory: Factory, make_router: MakeRouter, log_events: list[dict[str, Any]]
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=50)
    router = await make_router(sim, ledger=MemoryLedger(Decimal(10)))
    for _ in range(5):
        await router.chat(MESSAGES, max_tokens=50)
    logs = log_events
    assert not [e for e in logs if e["log_level"] == "error"]
    assert router.halted is None


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("cost_sanity_factor", Decimal("0.5")),
        ("cost_sanity_factor", True),
        ("max_violations_in_a_row", 0),
        ("max_violations_in_a_row", 2.5),
    ],
)
def test_bad_sanity_options_are_refused(option: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=option):
        Router(KIMI, api_key=DEFAULT_TEST_KEY, safeguards=Safeguards(**{option: value}))


def plan_of(tmp_path: Path, count: int) -> Plan:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(f'{{"id": "q{i}", "prompt": "question {i}"}}\n' for i in range(count))
    )
    return Plan.model_validate(
        {
            "model": KIMI,
            "budget": "10",
            "concurrency": 1,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 50},
            "datasets": [{"name": "d", "input": str(prompts)}],
        }
    )


async def test_a_cost_anomaly_stops_a_batch_with_a_clear_reason(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    sim: SimulatorServer = await openrouter_sim_factory(overcharge=20, completion_tokens=50)
    runner = JobRunner(
        plan_of(tmp_path, 20), tmp_path / "out", base_url=sim.url, api_key=DEFAULT_TEST_KEY
    )
    summary = await runner.run()
    assert summary.reason is StopReason.ERROR
    assert EXIT_CODES[summary.reason] != 0
    assert "cost anomaly" in summary.message
    assert len(sim.requests) < 20  # stopped, not run to the end
    kept = (tmp_path / "out" / "d.jsonl").read_text().splitlines()
    assert len(kept) >= 1  # the paid answer that tripped it is kept


async def test_a_response_without_a_provider_is_unknown_not_a_violation(
    openrouter_sim_factory: Factory, make_router: MakeRouter, log_events: list[dict[str, Any]]
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=30, anonymous=True)
    router = await make_router(sim, ledger=MemoryLedger(Decimal(1)))
    result = await router.chat(MESSAGES, max_tokens=50)
    logs = log_events
    assert result.provider is None
    assert not result.quarantined
    assert result.text
    assert result.cost == sim.requests[-1].cost
    assert (router.quarantined, router.unknown_provider) == (0, 1)
    events = [e["event"] for e in logs]
    assert "route.unknown_provider" in events
    assert "route.policy_violation" not in events


async def test_violations_in_a_row_halt_and_an_allowed_answer_resets_the_count(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    # The router's listing is honest; the live market serves tag "chutes" (ranked
    # first) as "Impostor AI". While chutes is down (demoted after its failures),
    # Novita serves: an allowed answer.
    stale = await stale_listing(openrouter_sim_factory)
    live = served_as("Impostor AI", {"chutes"})
    sim = await openrouter_sim_factory(market=live, completion_tokens=30)
    now = [0.0]
    router = await make_router(
        sim, endpoints=stale, ledger=MemoryLedger(Decimal(1)), clock=lambda: now[0]
    )
    for _ in range(2):
        assert (await router.chat(MESSAGES, max_tokens=50)).quarantined
    assert router.halted is None
    sim.set_down("chutes")
    assert not (await router.chat(MESSAGES, max_tokens=50)).quarantined
    sim.set_down("chutes", False)
    now[0] += 61  # the demotion's cool-down ends: chutes is first again
    for _ in range(2):
        assert (await router.chat(MESSAGES, max_tokens=50)).quarantined
    assert router.halted is None
    await router.chat(MESSAGES, max_tokens=50)
    assert router.halted is not None
    assert "3 policy violations in a row" in router.halted
    assert router.quarantined == 5


async def test_violations_in_a_row_stop_a_batch(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    stale = await stale_listing(openrouter_sim_factory)
    live = served_as("Impostor AI")
    sim: SimulatorServer = await openrouter_sim_factory(market=live, completion_tokens=30)
    runner = JobRunner(
        plan_of(tmp_path, 20),
        tmp_path / "out",
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        router_options={"endpoints": stale},
    )
    summary = await runner.run()
    assert summary.reason is StopReason.ERROR
    assert "3 policy violations in a row" in summary.message
    assert len(sim.requests) == 3  # concurrency 1: stopped at the third


async def test_a_tag_requantized_since_the_listing_is_filtered_by_openrouter(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    # The listing said chutes is int4; the live market serves it at fp4 now. The
    # request's provider.quantizations makes OpenRouter itself route around it.
    stale = await stale_listing(openrouter_sim_factory)
    market = Market.default()
    model = market.models[KIMI]
    endpoints = tuple(
        dataclasses.replace(e, quantization="fp4") if e.tag == "chutes" else e
        for e in model.endpoints
    )
    live = Market([dataclasses.replace(model, endpoints=endpoints)], market.providers)
    sim = await openrouter_sim_factory(market=live, completion_tokens=30)
    router = await make_router(sim, endpoints=stale, ledger=MemoryLedger(Decimal(1)))
    assert router.plan.order[0] == "chutes"
    for _ in range(3):
        result = await router.chat(MESSAGES, max_tokens=50)
        assert result.provider != "Chutes"
        assert not result.quarantined
    routing = sim.requests[-1].routing
    assert routing is not None
    assert "fp4" not in routing["quantizations"]
    assert "int4" in routing["quantizations"]
    assert all(tag != "chutes" for tag, _ in sim.requests[-1].attempts)
