"""A job's own cap inside a shared ledger: a reservation fits both, or neither holds it."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from provider_router import BudgetExhausted, MemoryLedger
from provider_router.jobs.ledger_share import LedgerShare

D = Decimal


async def test_a_reservation_must_fit_the_jobs_own_cap_and_the_shared_limit() -> None:
    async with MemoryLedger(D(10)) as shared, LedgerShare(shared, cap=D(1), spent=D("0.5")) as job:
        with pytest.raises(BudgetExhausted) as own:
            await job.reserve(D("0.6"), key="p/a")
        assert own.value.limit == D(1)  # the job's own budget refused it
        assert (await shared.snapshot()).reserved == 0, "the shared ledger held nothing"
        held = await job.reserve(D("0.4"), key="p/b")
        await job.settle(held, D("0.3"))
        mine, everyone = await job.snapshot(), await shared.snapshot()
        assert (mine.limit, mine.spent, mine.reserved) == (D(1), D("0.8"), 0)
        assert (everyone.limit, everyone.spent) == (D(10), D("0.3"))
        assert job.shared_state == everyone
        released = await job.reserve(D("0.2"), key="p/c")
        await job.release(released)
        assert (await job.snapshot()).reserved == 0


async def test_a_refusal_of_the_shared_ledger_gives_the_jobs_hold_back() -> None:
    async with MemoryLedger(D("0.2")) as shared, LedgerShare(shared, cap=D(5), spent=D(0)) as job:
        with pytest.raises(BudgetExhausted) as refused:
            await job.reserve(D("0.3"), key="p/a")
        assert refused.value.limit == D("0.2")  # the shared limit refused it
        assert (await job.snapshot()).reserved == 0
        # Raising the shared limit lets it through; the job's own cap never moved.
        await shared.set_limit(D(1))
        held = await job.reserve(D("0.3"), key="p/a")
        await job.settle(held, D("0.25"))
        assert (await job.snapshot()).limit == D(5)


async def test_a_waiting_reservation_waits_for_the_jobs_own_requests_to_settle() -> None:
    async with MemoryLedger(D(10)) as shared, LedgerShare(shared, cap=D(1), spent=D("0.5")) as job:
        first = await job.reserve(D("0.4"), key="p/a")
        second = asyncio.ensure_future(job.reserve(D("0.4"), key="p/b", wait=True))
        await asyncio.sleep(0)
        assert not second.done()
        assert (await job.snapshot()).waiting == 1
        await job.settle(first, D("0.05"))
        held = await second
        assert held.amount == D("0.4")
        # Even settling everything for nothing could not make room: refused at once.
        with pytest.raises(BudgetExhausted):
            await job.reserve(D("0.5"), key="p/c", wait=True)
