"""One contract, every backend: memory, SQLite (thread and in-loop) and Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal

import pytest

from provider_router import (
    BudgetExhausted,
    ChatResult,
    ConfigurationError,
    Ledger,
    ProviderPolicy,
    Reservation,
    Router,
)
from provider_router._money import from_units
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer
from tests.ledger.conftest import PERSISTENT, Backend

D = Decimal


async def test_backends_satisfy_the_protocol(backend: Backend) -> None:
    assert isinstance(backend.make(D(1)), Ledger)


async def test_reserve_then_settle_moves_the_hold_into_spent(backend: Backend) -> None:
    ledger = backend.make(D("10"))
    res = await ledger.reserve(D("2.5"), key="p1")
    assert res.amount == D("2.5")
    assert res.key == "p1"
    state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.available, state.open) == (0, D("2.5"), D("7.5"), 1)
    await ledger.settle(res, D("1.25"), provider="chutes")
    state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.available) == (D("1.25"), 0, D("8.75"))
    assert (state.open, state.settled, state.released) == (0, 1, 0)


async def test_a_settle_or_release_moves_what_the_ledger_holds_not_what_the_caller_says(
    backend: Backend,
) -> None:
    # The caller's Reservation is a receipt, not the record: a copy whose units were
    # changed (by a bug, or a hand-made one) must neither free nor keep a wrong amount.
    ledger = backend.make(D("10"))
    first = await ledger.reserve(D("2"), key="a")
    second = await ledger.reserve(D("3"), key="b")
    await ledger.settle(dataclasses.replace(first, units=first.units - 7), D("1"))
    await ledger.release(dataclasses.replace(second, units=second.units + 11))
    state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.open) == (D("1"), 0, 0)
    assert (state.settled, state.released, state.overrun) == (1, 1, 0)
    with pytest.raises(ConfigurationError, match="not open"):
        await ledger.settle(first, D("1"))


async def test_release_charges_nothing(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    res = await ledger.reserve(D("1"), key="p")
    await ledger.release(res)
    state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.released, state.open) == (0, 0, 1, 0)


async def test_reservations_round_up_to_a_picodollar(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    res = await ledger.reserve(D("0.0000000000001"), key="tiny")
    assert res.units == 1
    assert res.amount == D("1E-12")


async def test_exhaustion_raises_with_the_numbers_and_changes_nothing(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    await ledger.reserve(D("0.6"), key="a")
    with pytest.raises(BudgetExhausted) as info:
        await ledger.reserve(D("0.5"), key="b")
    err = info.value
    assert (err.requested, err.limit, err.spent, err.reserved) == (D("0.5"), 1, 0, D("0.6"))
    state = await ledger.snapshot()
    assert (state.reserved, state.open) == (D("0.6"), 1)


async def test_an_exact_fit_is_admitted(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    await ledger.reserve(D("0.4"), key="a")
    await ledger.reserve(D("0.6"), key="b")
    assert (await ledger.snapshot()).available == 0


async def test_waiting_reservation_is_admitted_when_a_settle_frees_room(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    first = await ledger.reserve(D("0.6"), key="a")
    waiting = asyncio.create_task(ledger.reserve(D("0.6"), key="b", wait=True))
    await asyncio.sleep(0)
    assert not waiting.done()
    await ledger.settle(first, D("0.3"))
    second = await waiting
    assert second.key == "b"
    state = await ledger.snapshot()
    assert (state.spent, state.reserved) == (D("0.3"), D("0.6"))


async def test_waiting_stops_when_settling_everything_could_not_make_room(
    backend: Backend,
) -> None:
    ledger = backend.make(D("1"))
    res = await ledger.reserve(D("0.7"), key="a")
    waiting = asyncio.create_task(ledger.reserve(D("0.4"), key="b", wait=True))
    await asyncio.sleep(0)
    assert not waiting.done()
    await ledger.settle(res, D("0.7"))  # only 0.3 can ever be free now
    with pytest.raises(BudgetExhausted):
        await waiting
    with pytest.raises(BudgetExhausted):
        await ledger.reserve(D("0.4"), key="c", wait=True)


async def test_waiting_with_a_timeout_gives_up(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    await ledger.reserve(D("0.9"), key="held")
    with pytest.raises(BudgetExhausted):
        await ledger.reserve(D("0.2"), key="b", wait=0.02)
    state = await ledger.snapshot()
    assert (state.reserved, state.open) == (D("0.9"), 1)


async def test_top_up_admits_a_waiting_reservation(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    await ledger.reserve(D("0.9"), key="held")
    waiting = asyncio.create_task(ledger.reserve(D("0.5"), key="b", wait=True))
    await asyncio.sleep(0)
    await ledger.set_limit(D("2"))
    assert (await waiting).amount == D("0.5")
    state = await ledger.snapshot()
    assert (state.limit, state.reserved) == (2, D("1.4"))


async def test_a_cancelled_waiter_leaves_nothing_held(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    held = await ledger.reserve(D("0.9"), key="held")
    waiting = asyncio.create_task(ledger.reserve(D("0.5"), key="b", wait=True))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await ledger.release(held)
    state = await ledger.snapshot()
    assert (state.reserved, state.open) == (0, 0)


async def test_closing_twice_is_refused(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    res = await ledger.reserve(D("0.1"), key="a")
    await ledger.settle(res, D("0.1"))
    with pytest.raises(ConfigurationError, match="not open"):
        await ledger.settle(res, D("0.1"))
    with pytest.raises(ConfigurationError, match="not open"):
        await ledger.release(res)
    other = await ledger.reserve(D("0.1"), key="b")
    await ledger.release(other)
    with pytest.raises(ConfigurationError, match="not open"):
        await ledger.settle(other, D("0"))
    assert (await ledger.snapshot()).spent == D("0.1")


async def test_unknown_reservations_are_refused(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    ghost = Reservation("nope", 5, "k")
    with pytest.raises(ConfigurationError, match="'nope'"):
        await ledger.settle(ghost, D("0"))
    with pytest.raises(ConfigurationError, match="'nope'"):
        await ledger.attach(ghost, "gen-1")


@pytest.mark.parametrize(
    ("amount", "message"),
    [(D("-1"), "negative"), (D("NaN"), "finite"), (D("Infinity"), "finite"), (0.5, "Decimal")],
)
async def test_bad_amounts_are_refused(backend: Backend, amount: object, message: str) -> None:
    ledger = backend.make(D("1"))
    with pytest.raises(ConfigurationError, match=message):
        await ledger.reserve(amount, key="k")  # type: ignore[arg-type]
    res = await ledger.reserve(D("0.1"), key="k")
    with pytest.raises(ConfigurationError, match=message):
        await ledger.settle(res, amount)  # type: ignore[arg-type]
    if isinstance(amount, float):
        # A limit is a budget, read by the one rule budgets follow: 0.5 is $0.5.
        await ledger.set_limit(amount)  # type: ignore[arg-type]
        assert (await ledger.snapshot()).limit == D("0.5")
    else:
        with pytest.raises(ConfigurationError, match=message):
            await ledger.set_limit(amount)  # type: ignore[arg-type]


async def test_a_settle_above_its_reservation_is_recorded_truthfully(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    res = await ledger.reserve(D("0.9"), key="a")
    await ledger.settle(res, D("1.05"), estimate=D("0.8"))
    state = await ledger.snapshot()
    assert (state.spent, state.overrun, state.available) == (D("1.05"), D("0.15"), 0)
    assert (state.estimated, state.drift) == (D("0.8"), D("0.25"))
    with pytest.raises(BudgetExhausted):
        await ledger.reserve(D("0"), key="nothing fits past the limit")


async def test_an_overrun_stops_admission_until_the_limit_covers_it(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    held = await ledger.reserve(D("0.2"), key="in flight")
    res = await ledger.reserve(D("0.5"), key="a")
    await ledger.settle(res, D("1.1"))  # the server charged past the whole budget
    await ledger.release(held)  # freeing a hold does not make room past an overrun
    for wait in (False, True, 0.01):
        with pytest.raises(BudgetExhausted, match=r"\$0\.10* above the limit") as caught:
            await ledger.reserve(D("0.000001"), key="refused", wait=wait)
        assert caught.value.spent == D("1.1")
    state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.overrun) == (D("1.1"), 0, D("0.6"))
    await ledger.set_limit(D("1.2"))  # covered: admission resumes
    await ledger.release(await ledger.reserve(D("0.1"), key="fits again"))


async def test_drift_is_the_sum_of_cost_minus_estimate(backend: Backend) -> None:
    ledger = backend.make(D("10"))
    for cost, estimate in [(D("1.2"), D("1")), (D("0.5"), D("0.75")), (D("0.3"), None)]:
        res = await ledger.reserve(D("2"), key="k")
        await ledger.settle(res, cost, estimate=estimate)
    state = await ledger.snapshot()
    assert (state.estimated, state.drift, state.spent) == (D("1.75"), D("-0.05"), D("2.0"))


async def test_spent_is_the_exact_sum_of_many_odd_costs(backend: Backend) -> None:
    ledger = backend.make(D("100"))
    costs = [D("0.000001234567") * (i + 1) + D("0.000000000007") for i in range(200)]
    reservations = await asyncio.gather(
        *(ledger.reserve(D("0.01"), key=str(i)) for i in range(len(costs)))
    )
    await asyncio.gather(*(ledger.settle(r, c) for r, c in zip(reservations, costs, strict=True)))
    state = await ledger.snapshot()
    assert state.spent == sum(costs)
    assert (state.reserved, state.settled) == (0, 200)


async def test_costs_finer_than_a_picodollar_are_recorded_rounded(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    for cost in (D("0.0000000000015"), D("0.0000000000025"), D("1.2345678901234e-5")):
        await ledger.settle(await ledger.reserve(D("0.1"), key="k"), cost)
    # Half-even to the picodollar: 2 + 2 + 12,345,679 units.
    assert (await ledger.snapshot()).spent == D("0.000012345683")


async def test_concurrent_reservations_never_pass_the_limit(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    results = await asyncio.gather(
        *(ledger.reserve(D("0.03"), key=str(i)) for i in range(100)), return_exceptions=True
    )
    admitted = [r for r in results if isinstance(r, Reservation)]
    assert len(admitted) == 33
    assert all(isinstance(r, BudgetExhausted) for r in results if r not in admitted)


async def test_attach_records_the_generation_id(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    res = await ledger.reserve(D("0.1"), key="k")
    await ledger.attach(res, "gen-abc")
    [listed] = await ledger.open_reservations()
    assert (listed.id, listed.units, listed.key, listed.generation_id) == (
        res.id,
        res.units,
        "k",
        "gen-abc",
    )
    await ledger.settle(res, D("0.05"))
    assert await ledger.open_reservations() == []


async def test_a_live_owner_has_nothing_to_recover(backend: Backend) -> None:
    ledger = backend.make(D("1"))
    await ledger.reserve(D("0.1"), key="k")
    report = await ledger.recover()
    assert report.reconciled == ()
    assert report.worst_case == ()
    assert (await ledger.snapshot()).open == 1


async def test_the_ledger_is_an_async_context_manager(backend: Backend) -> None:
    async with backend.make(D("1")) as ledger:
        await ledger.reserve(D("0.1"), key="k")
    with pytest.raises(ConfigurationError, match="closed"):
        await ledger.reserve(D("0.1"), key="k")


# --- persistent backends: state survives the process --------------------------------


persistent_only = pytest.mark.parametrize("backend_name", PERSISTENT, indirect=True)


@pytest.fixture
def persistent(backend: Backend) -> Backend:
    assert backend.persistent
    return backend


def _later(seconds: float) -> float:
    return time.time() + seconds


@persistent_only
async def test_open_reservations_survive_a_reopen(persistent: Backend) -> None:
    first = persistent.make(D("5"))
    res = await first.reserve(D("1"), key="k")
    await first.attach(res, "gen-1")
    await first.close()
    second = persistent.make(None)
    [listed] = await second.open_reservations()
    assert (listed.id, listed.generation_id) == (res.id, "gen-1")
    state = await second.snapshot()
    assert (state.limit, state.reserved, state.open) == (5, 1, 1)


@persistent_only
async def test_a_new_ledger_needs_a_limit_and_a_reopen_keeps_it(persistent: Backend) -> None:
    with pytest.raises(ConfigurationError, match="limit"):
        await persistent.make(None).snapshot()
    ledger = persistent.make(D("5"))
    await ledger.snapshot()
    with pytest.raises(ConfigurationError, match="set_limit"):
        await persistent.make(D("6")).snapshot()
    await ledger.set_limit(D("6"))
    assert (await persistent.make(D("6")).snapshot()).limit == 6


@persistent_only
async def test_recovery_reconciles_or_counts_at_worst_case(persistent: Backend) -> None:
    crashed = persistent.make(D("10"), lease=30)
    known = await crashed.reserve(D("2"), key="known")
    await crashed.attach(known, "gen-known")
    await crashed.reserve(D("3"), key="unknown")
    failing = await crashed.reserve(D("1"), key="failing")
    await crashed.attach(failing, "gen-failing")
    await crashed.close()  # stops renewing, as a crash would

    asked: list[str | None] = []

    async def resolve(res: Reservation) -> Decimal | None:
        asked.append(res.generation_id)
        if res.generation_id == "gen-failing":
            raise ConnectionError("OpenRouter unreachable")
        return D("0.75") if res.generation_id == "gen-known" else None

    early = persistent.make(None, lease=30)
    assert (await early.recover(resolve)).worst_case == ()  # the lease has not run out
    survivor = persistent.make(None, lease=30, clock=lambda: _later(31))
    report = await survivor.recover(resolve)
    assert sorted(asked, key=str) == sorted(["gen-known", None, "gen-failing"], key=str)
    assert [r.key for r in report.reconciled] == ["known"]
    assert sorted(r.key for r in report.worst_case) == ["failing", "unknown"]
    assert (report.reconciled_cost, report.worst_case_cost) == (D("0.75"), D("4"))
    state = await survivor.snapshot()
    assert (state.spent, state.reserved, state.open, state.recovered) == (D("4.75"), 0, 0, 3)
    assert (await survivor.recover(resolve)).worst_case == ()  # never counted twice
    assert (await survivor.snapshot()).spent == D("4.75")


@persistent_only
async def test_a_recovery_leaves_open_what_the_caller_closes_itself(persistent: Backend) -> None:
    """``keep``: a dead run's hold the caller knows (a live batch it will collect) is taken
    over and left open, settled once by the caller at its cost; the rest is recovered."""
    crashed = persistent.make(D("10"), lease=30)
    batch = await crashed.reserve(D("2"), key="batch:live")
    await crashed.reserve(D("3"), key="batch:unknown")
    await crashed.close()  # stops renewing, as a crash would
    survivor = persistent.make(None, lease=30, clock=lambda: _later(31))
    report = await survivor.recover(keep=lambda res: res.id == batch.id)
    assert [r.key for r in report.worst_case] == ["batch:unknown"]
    assert [r.id for r in report.kept] == [batch.id]
    assert [r.id for r in await survivor.open_reservations()] == [batch.id]
    later = persistent.make(None, lease=30, clock=lambda: _later(40))
    assert (await later.recover()).worst_case == ()  # the survivor holds it now
    await survivor.settle(batch, D("0.5"))
    state = await survivor.snapshot()
    assert (state.spent, state.reserved, state.open, state.recovered) == (D("3.5"), 0, 0, 1)


@persistent_only
async def test_a_late_settle_corrects_a_worst_case_charge(persistent: Backend) -> None:
    slow = persistent.make(D("10"), lease=30)
    res = await slow.reserve(D("2"), key="slow")
    gone = await slow.reserve(D("1"), key="never charged")
    survivor = persistent.make(None, lease=30, clock=lambda: _later(31))
    report = await survivor.recover()
    assert report.worst_case_cost == D("3")
    assert (await survivor.snapshot()).spent == D("3")
    await slow.settle(res, D("0.5"))  # the owner was only slow: the truth wins
    await slow.release(gone)
    state = await survivor.snapshot()
    assert (state.spent, state.reserved) == (D("0.5"), 0)
    with pytest.raises(ConfigurationError, match="not open"):
        await slow.settle(res, D("0.5"))


@persistent_only
async def test_a_late_settle_after_reconciliation_is_not_counted_twice(
    persistent: Backend,
) -> None:
    slow = persistent.make(D("10"), lease=30)
    res = await slow.reserve(D("2"), key="slow")

    async def resolve(r: Reservation) -> Decimal:
        return D("0.4")

    survivor = persistent.make(None, lease=30, clock=lambda: _later(31))
    assert (await survivor.recover(resolve)).reconciled_cost == D("0.4")
    await slow.settle(res, D("0.4"))
    assert (await survivor.snapshot()).spent == D("0.4")


@persistent_only
async def test_leases_are_renewed_by_a_live_owner(persistent: Backend) -> None:
    now = [time.time()]
    owner = persistent.make(D("10"), lease=30, clock=lambda: now[0])
    await owner.reserve(D("1"), key="k")
    now[0] += 25
    owner._renew()  # type: ignore[attr-defined]  # what its timer does every lease / 3
    await owner.snapshot()  # the renewal is written with this batch at the latest
    at_40s = now[0] + 15
    survivor = persistent.make(None, lease=30, clock=lambda: at_40s)
    assert (await survivor.recover()).worst_case == ()
    at_60s = now[0] + 35
    later = persistent.make(None, lease=30, clock=lambda: at_60s)
    assert [r.key for r in (await later.recover()).worst_case] == ["k"]


async def test_every_waiter_is_refused_by_the_settle_that_makes_the_budget_final(
    backend: Backend,
) -> None:
    # Woken by settles, not by a poll: judged by event order, not by wall time.
    ledger = backend.make(D("1"))
    first = await ledger.reserve(D("0.4"), key="a")
    second = await ledger.reserve(D("0.4"), key="b")
    events: list[str] = []

    async def wait(i: int) -> None:
        try:
            await ledger.reserve(D("0.3"), key=f"w{i}", wait=True)
        except BudgetExhausted:
            events.append(f"refused w{i}")
        else:
            events.append(f"admitted w{i}")

    waiters = [asyncio.create_task(wait(i)) for i in range(5)]
    await asyncio.sleep(0)  # every waiter asked
    await ledger.snapshot()  # ... and a store's batch has queued them
    await ledger.snapshot()
    assert events == []
    await ledger.settle(first, D("0.4"))  # 0.6 could still come free: keep waiting
    events.append("settle a")
    await ledger.settle(second, D("0.4"))  # 0.2 left, nothing in flight: final
    events.append("settle b")
    for _ in range(3):  # a few loop turns, no clock
        await asyncio.sleep(0)
    events.append("later")
    assert events == ["settle a", "settle b", *(f"refused w{i}" for i in range(5)), "later"]
    assert all(task.done() for task in waiters)


# --- against the local OpenRouter: the ledger holds every real charge ------------------------


async def test_spent_covers_every_charge_the_simulator_made_and_never_passes_the_limit(
    backend: Backend, openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]]
) -> None:
    # Requests through the Router (several routers sharing one store, where the backend
    # can be shared) on a budget that runs out; the simulator's charge record is the truth.
    sim = await openrouter_sim_factory(seed=21)
    limit = D("0.02")
    ledgers = [backend.make(limit)]
    await ledgers[0].snapshot()  # created (Redis creates a ledger on its first call)
    if backend.persistent:
        ledgers.append(backend.make(None))  # a second view of the same store
    routers = [
        Router(
            "moonshotai/kimi-k2.5",
            policy=ProviderPolicy(exclude_below="int4"),
            ledger=ledger,
            base_url=sim.url,
            api_key=DEFAULT_TEST_KEY,
            budget_wait=True,
        )
        for ledger in ledgers
    ]
    for router in routers:
        await router.open()
    try:
        outcomes = await asyncio.gather(
            *(
                routers[i % len(routers)].chat(
                    [{"role": "user", "content": f"question {i}"}], max_tokens=400, key=f"q{i}"
                )
                for i in range(60)
            ),
            return_exceptions=True,
        )
    finally:
        for router in routers:
            await router.close()
    answered = [o for o in outcomes if isinstance(o, ChatResult)]
    refused = [o for o in outcomes if isinstance(o, BudgetExhausted)]
    assert len(answered) + len(refused) == len(outcomes), [
        o for o in outcomes if not isinstance(o, ChatResult | BudgetExhausted)
    ]
    assert answered
    assert refused  # the budget really ran out
    charged = sim.simulator.usage
    record = sum((from_units(g.cost_units) for g in sim.simulator.generations.values()), D(0))
    assert record == charged > 0
    state = await ledgers[0].snapshot()
    assert state.spent >= charged  # every charge the simulator made is in the ledger
    assert state.spent <= state.limit  # and admission never let spending pass the limit
    assert (state.open, state.reserved) == (0, 0)
    assert sum((r.cost for r in answered if r.cost is not None), D(0)) == state.spent


async def test_a_waiter_that_can_never_fit_is_refused_behind_one_that_still_may(
    backend: Backend,
) -> None:
    ledger = backend.make(D("1"))
    held = [await ledger.reserve(D("0.3"), key=f"r{i}") for i in range(3)]
    events: list[str] = []

    async def wait(name: str, amount: str) -> None:
        try:
            await ledger.reserve(D(amount), key=name, wait=True)
        except BudgetExhausted:
            events.append(f"refused {name}")
        else:
            events.append(f"admitted {name}")

    small = asyncio.create_task(wait("small", "0.2"))  # first in line
    large = asyncio.create_task(wait("large", "0.5"))
    await asyncio.sleep(0)  # both asked
    await ledger.snapshot()  # ... and a store's batch has queued them
    await ledger.snapshot()
    assert events == []
    await ledger.settle(held[0], D("0.3"))
    await ledger.settle(held[1], D("0.3"))  # spent 0.6: 0.5 can never fit, 0.2 still may
    for _ in range(3):
        await asyncio.sleep(0)
    events.append("settled two")
    await ledger.release(held[2])
    await asyncio.gather(small, large)
    assert events == ["refused large", "settled two", "admitted small"]
