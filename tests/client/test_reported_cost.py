"""An answer's ``usage.cost`` is not taken on its word (#21, item 1).

The local OpenRouter plays a server whose answer lies about its cost while its
``/generation`` record tells the truth (``usage_cost`` fault), or one that really
charged an absurd figure (``confirm``). A cost that is not a JSON number is
missing; one far above its reservation, or negative, is checked with
``/generation`` before it is booked: confirmed, it is booked and the router
halts; otherwise the worst case is booked, the figure is disputed, and the
router halts naming the generation id.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from _router_helpers import MESSAGES, MakeRouter

from provider_router import MemoryLedger
from provider_router._format import decimal_str
from provider_router.client._cost_check import CostVerdict, check_cost, check_low_cost
from provider_router.testing import SimulatorServer

Factory = Any

STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])


async def _one(
    factory: Factory, make_router: MakeRouter, reported: object, stream: bool, **fault: Any
) -> tuple[SimulatorServer, Any, MemoryLedger, Any]:
    sim = await factory(
        completion_tokens=50, faults=[{"kind": "usage_cost", "reported": reported, **fault}]
    )
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, ledger=ledger)
    result = await router.chat(MESSAGES, max_tokens=50, stream=stream)
    return sim, router, ledger, result


@STREAMS
async def test_an_absurd_cost_the_record_contradicts_is_disputed_and_the_worst_case_booked(
    openrouter_sim_factory: Factory,
    make_router: MakeRouter,
    stream: bool,
    log_events: list[dict[str, Any]],
) -> None:
    sim, router, ledger, result = await _one(openrouter_sim_factory, make_router, 1000000, stream)
    truth = sim.requests[-1].cost
    state = await ledger.snapshot()
    assert result.text  # the paid answer is kept
    assert result.disputed_cost == Decimal(1000000)
    assert result.cost == result.reserved  # its worst case, not the answer's figure
    assert state.spent == result.reserved
    assert truth <= state.spent < Decimal(1)  # never below the charge, never the lie
    assert state.open == 0
    assert router.halted is not None
    assert router.halted.startswith("disputed cost: the server's usage.cost")
    assert f"check generation {result.generation_id}" in router.halted
    assert f"/generation record says ${decimal_str(truth)}" in router.halted
    assert "\n" not in router.halted
    [dispute] = router.disputes
    assert (dispute.disputed, dispute.record, dispute.booked) == (1000000, truth, result.cost)
    events = [e for e in log_events if e["event"] == "route.cost_disputed"]
    assert [e["generation_id"] for e in events] == [result.generation_id]


@STREAMS
async def test_a_negative_cost_is_disputed_and_closes_its_reservation(
    openrouter_sim_factory: Factory, make_router: MakeRouter, stream: bool
) -> None:
    sim, router, ledger, result = await _one(openrouter_sim_factory, make_router, -5, stream)
    state = await ledger.snapshot()
    assert (state.open, state.spent) == (0, result.reserved)
    assert result.disputed_cost == Decimal(-5)
    assert router.halted is not None
    assert "the server's usage.cost" in router.halted
    assert "is negative ($-5)" in router.halted
    assert state.spent >= sim.requests[-1].cost


@STREAMS
@pytest.mark.parametrize("reported", ["0.001", "1000000", True, float("nan"), float("inf"), [1]])
async def test_a_cost_that_is_not_a_json_number_is_missing(
    openrouter_sim_factory: Factory, make_router: MakeRouter, stream: bool, reported: object
) -> None:
    # "0.001" was booked as $0.001, 8.5x its hold; now /generation says what it cost.
    sim, router, ledger, result = await _one(openrouter_sim_factory, make_router, reported, stream)
    truth = sim.requests[-1].cost
    assert result.cost == truth
    assert result.disputed_cost is None
    assert (await ledger.snapshot()).spent == truth
    assert router.halted is None


@STREAMS
async def test_an_absurd_cost_the_record_confirms_is_booked_and_halts(
    openrouter_sim_factory: Factory, make_router: MakeRouter, stream: bool
) -> None:
    sim, router, ledger, result = await _one(
        openrouter_sim_factory, make_router, 0.5, stream, confirm=True
    )
    assert sim.requests[-1].cost == Decimal("0.5")  # it really billed it
    assert result.cost == Decimal("0.5")
    assert result.disputed_cost is None
    assert (await ledger.snapshot()).spent == Decimal("0.5")
    assert router.halted is not None
    assert "confirmed by OpenRouter's /generation record" in router.halted
    assert result.generation_id is not None
    assert result.generation_id in router.halted
    assert router.disputes == []


@STREAMS
async def test_a_sane_cost_is_booked_on_the_answers_word(
    openrouter_sim_factory: Factory, make_router: MakeRouter, stream: bool
) -> None:
    # A lie within bounds (here half the price, above a tenth of what the tokens cost
    # and below twice the hold) is taken: no /generation round trip per answer.
    honest = await openrouter_sim_factory(completion_tokens=50)
    plain = await make_router(honest, ledger=MemoryLedger(Decimal(1)))
    await plain.chat(MESSAGES, max_tokens=50, stream=stream)
    half = honest.requests[-1].cost / 2
    sim, router, ledger, result = await _one(
        openrouter_sim_factory, make_router, float(half), stream
    )
    assert result.cost == half < sim.requests[-1].cost
    assert (await ledger.snapshot()).spent == half
    assert router.halted is None
    assert router.disputes == []


@STREAMS
@pytest.mark.parametrize("reported", [0, 1e-30])
async def test_an_absurdly_low_cost_is_checked_and_the_record_booked(
    openrouter_sim_factory: Factory,
    make_router: MakeRouter,
    stream: bool,
    reported: float,
    log_events: list[dict[str, Any]],
) -> None:
    """``usage.cost`` 0 (or 1e-30) for paid tokens: OpenRouter's /generation record says
    what it cost, and that is booked: the ledger is never below what was charged. The
    run goes on (what is booked is the charge), the answer's figure disputed beside it."""
    sim, router, ledger, result = await _one(openrouter_sim_factory, make_router, reported, stream)
    truth = sim.requests[-1].cost
    assert truth > 0
    assert result.text  # the paid answer is kept
    assert result.cost == truth
    assert result.disputed_cost == Decimal(str(reported))
    state = await ledger.snapshot()
    assert (state.spent, state.open) == (truth, 0)
    assert router.halted is None
    [dispute] = router.disputes
    assert (dispute.record, dispute.booked) == (truth, truth)
    assert "less than 10% of the $" in dispute.reason
    assert f"/generation record says ${decimal_str(truth)}" in dispute.reason
    events = [e for e in log_events if e["event"] == "route.cost_disputed"]
    assert [e["generation_id"] for e in events] == [result.generation_id]


@STREAMS
async def test_a_low_cost_the_record_confirms_is_booked_and_the_run_goes_on(
    openrouter_sim_factory: Factory,
    make_router: MakeRouter,
    stream: bool,
    log_events: list[dict[str, Any]],
) -> None:
    sim, router, ledger, result = await _one(
        openrouter_sim_factory, make_router, 0, stream, confirm=True
    )
    assert sim.requests[-1].cost == 0  # it really billed nothing
    assert result.cost == 0
    assert result.disputed_cost is None
    assert (await ledger.snapshot()).spent == 0
    assert router.halted is None
    assert router.disputes == []
    [event] = [e for e in log_events if e["event"] == "route.cost_anomaly"]
    assert event["confirmed"] is True


async def test_a_low_cost_without_a_record_books_the_worst_case() -> None:
    async def no_record(_: str) -> Decimal | None:
        return None

    verdict = await check_low_cost(
        Decimal(0),
        Decimal("0.004"),
        Decimal("0.01"),
        key="d/q1",
        generation_id="gen-1",
        generation_cost=no_record,
    )
    assert (verdict.booked, verdict.disputed, verdict.record) == (Decimal("0.01"), 0, None)
    assert "has no record of it" in verdict.reason
    assert "booked $0.01 (its worst case)" in verdict.reason
    assert "check generation gen-1" in verdict.reason


async def verdict_of(record: Decimal | None, usage: Decimal | None) -> CostVerdict:
    """An absurd $1,000,000 on a $0.01 hold, with what /generation and /key say."""

    async def generation_cost(_: str) -> Decimal | None:
        return record

    async def key_usage() -> Decimal | None:
        return usage

    return await check_cost(
        Decimal(1000000),
        Decimal("0.01"),
        Decimal(2),
        key="d/q1",
        generation_id="gen-1",
        generation_cost=generation_cost,
        key_usage=key_usage,
    )


async def test_without_a_record_the_key_usage_is_quoted() -> None:
    verdict = await verdict_of(None, Decimal("3.5"))
    assert (verdict.booked, verdict.disputed, verdict.record) == (
        Decimal("0.01"),
        Decimal(1000000),
        None,
    )
    assert "/generation has no record of it (the key's whole usage is $3.5)" in verdict.reason
    assert "check generation gen-1 at https://openrouter.ai/activity" in verdict.reason


async def test_a_record_above_the_reservation_is_booked_not_the_reservation() -> None:
    verdict = await verdict_of(Decimal("0.05"), None)
    assert verdict.booked == Decimal("0.05")  # never below what OpenRouter says it charged
    assert verdict.disputed == Decimal(1000000)
    assert "/generation record says $0.05" in verdict.reason
