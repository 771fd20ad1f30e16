"""Hypothesis: no interleaving of concurrent calls breaks the ledger's invariants.

For every backend: ``spent + reserved`` never passes ``limit`` except by the
recorded ``overrun`` (settles above their reservation), and at the end ``spent``
is exactly the sum of the settled costs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provider_router import BudgetExhausted, Ledger, LedgerState
from tests.ledger.conftest import Backend

D = Decimal

calls = st.lists(
    st.tuples(
        st.integers(0, 400),  # reservation, in millidollars
        st.integers(0, 120),  # cost as % of the reservation (above 100: an overrun)
        st.booleans(),  # release instead of settle
        st.booleans(),  # wait for room
        st.integers(0, 3),  # yields before reserving
        st.integers(0, 3),  # yields between reserve and settle
    ),
    min_size=1,
    max_size=24,
)


def _check(state: LedgerState) -> None:
    assert state.spent + state.reserved - state.overrun <= state.limit
    assert state.reserved >= 0
    assert state.open >= 0


async def _scenario(ledger: Ledger, plan: list[tuple[int, int, bool, bool, int, int]]) -> None:
    settled: list[Decimal] = []

    async def call(
        i: int, milli: int, pct: int, release: bool, wait: bool, y1: int, y2: int
    ) -> None:
        for _ in range(y1):
            await asyncio.sleep(0)
        amount = D(milli) / 1000
        try:
            res = await ledger.reserve(amount, key=str(i), wait=wait)
        except BudgetExhausted:
            _check(await ledger.snapshot())
            return
        _check(await ledger.snapshot())
        for _ in range(y2):
            await asyncio.sleep(0)
        if release:
            await ledger.release(res)
        else:
            cost = amount * pct / 100
            await ledger.settle(res, cost, estimate=amount / 2)
            settled.append(cost)
        _check(await ledger.snapshot())

    async with ledger:
        await asyncio.wait_for(
            asyncio.gather(*(call(i, *args) for i, args in enumerate(plan))), timeout=30
        )
        state = await ledger.snapshot()
    assert state.spent == sum(settled, D(0))
    assert (state.reserved, state.open) == (0, 0)
    assert state.settled == len(settled)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=calls, limit_milli=st.integers(0, 2000))
def test_random_interleavings_keep_the_invariants(
    backend_factory: Callable[[], Backend],
    plan: list[tuple[int, int, bool, bool, int, int]],
    limit_milli: int,
) -> None:
    ledger = backend_factory().make(D(limit_milli) / 1000)
    asyncio.run(_scenario(ledger, plan))
