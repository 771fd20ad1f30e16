"""Stop means stop: once stopping, no request starts another attempt (#21, item 4).

After the first Ctrl-C on a run whose upstream failed slowly, attempts 4-6 still
started minutes later, each with a new reservation. The back-off here is an
injected sleep that never ends by itself: only the stop can end it.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest
from _polling import until
from _router_helpers import MESSAGES, MakeRouter

from provider_router import MemoryLedger, PaymentRequiredError, RouterStopping
from provider_router.testing import SimulatorServer

Factory = Any
FAILING = [{"kind": "provider_error", "status": 503, "no_fallback": True}]


class EndlessBackoff:
    """A sleep that records its waits and returns only when cancelled."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.waiting = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.waiting.set()
        await asyncio.Event().wait()


def chats(sim: SimulatorServer) -> list[Any]:
    return [r for r in sim.requests if r.route == "chat"]


async def test_a_stop_cuts_a_retrys_backoff_and_starts_no_attempt(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(faults=FAILING)
    sleep = EndlessBackoff()
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, ledger=ledger, sleep=sleep)
    request = asyncio.ensure_future(router.chat(MESSAGES, max_tokens=50, key="q1"))
    await asyncio.wait_for(sleep.waiting.wait(), 10)
    assert len(chats(sim)) == 1  # the first attempt failed; its retry waits
    router.stop()
    with pytest.raises(RouterStopping, match="not retried: the router is stopping") as caught:
        await asyncio.wait_for(request, 10)
    assert len(caught.value.errors) == 1
    assert len(chats(sim)) == 1  # no new attempt
    state = await ledger.snapshot()
    assert (state.open, state.reserved, state.spent) == (0, 0, 0)
    assert router.stopping


async def test_a_stopped_router_sends_and_reserves_nothing(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory()
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, ledger=ledger)
    router.stop()
    with pytest.raises(RouterStopping, match="q1: not sent: the router is stopping"):
        await router.chat(MESSAGES, max_tokens=50, key="q1")
    assert chats(sim) == []
    assert (await ledger.snapshot()).settled == 0


async def test_a_request_waiting_for_room_when_stopped_is_not_sent(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=50)
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, ledger=ledger, budget_wait=True)
    blocker = await ledger.reserve(Decimal("0.9999"), key="other")  # no room left
    waiting = asyncio.ensure_future(router.chat(MESSAGES, max_tokens=50, key="q1"))
    await asyncio.sleep(0)
    router.stop()
    await ledger.release(blocker)  # room again: it would be sent now
    with pytest.raises(RouterStopping):
        await asyncio.wait_for(waiting, 10)
    assert chats(sim) == []
    state = await ledger.snapshot()
    assert (state.open, state.spent) == (0, 0)


async def test_a_stop_cuts_the_wait_of_a_temporary_402(
    openrouter_sim_factory: Factory, make_router: MakeRouter
) -> None:
    # The balance covers one worst case at a time; the first request hangs in
    # flight, so the second meets the in-flight hold (a transient 402) and waits.
    sim = await openrouter_sim_factory(
        credits="0.004", completion_tokens=20, faults=[{"kind": "hang", "times": 1}]
    )
    sleep = EndlessBackoff()
    router = await make_router(sim, sleep=sleep, ledger=MemoryLedger(Decimal(1)))
    first = asyncio.ensure_future(router.chat(MESSAGES, max_tokens=1000, key="q1"))
    await until(lambda: len(chats(sim)) == 1)
    second = asyncio.ensure_future(router.chat(MESSAGES, max_tokens=1000, key="q2"))
    await asyncio.wait_for(sleep.waiting.wait(), 10)
    sent = len(chats(sim))
    router.stop()
    with pytest.raises(PaymentRequiredError):
        await asyncio.wait_for(second, 10)
    assert len(chats(sim)) == sent  # not asked again
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
