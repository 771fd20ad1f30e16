"""A job's own budget inside a ledger other runs share: its ``--budget`` as its own cap.

Runs given one Redis ledger (``run --ledger redis://... --ledger-name NAME``) spend one
limit together, which only ``provider-router ledger topup`` changes
(:mod:`provider_router.jobs.budget`). Each job also keeps to its own ``--budget``, over
every run of its directory, whatever the shared limit allows: :class:`LedgerShare` is
the ledger such a run spends through. A reservation is admitted by the job's own cap
first (a :class:`~provider_router.MemoryLedger` holding what the job's journal records
it paid, and this run's reservations), then by the shared ledger; a settle or release
closes both. Its :meth:`~LedgerShare.snapshot` is the job's own view (its cap, its
spend), which every view of the run shows; the shared ledger's last state is
:attr:`LedgerShare.shared_state`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from provider_router._resource import AsyncResource
from provider_router.ledger import (
    CostResolver,
    Ledger,
    LedgerState,
    MemoryLedger,
    RecoveryReport,
    Reservation,
)

__all__ = ["LedgerShare"]


class LedgerShare(AsyncResource):
    """The ledger a run on a shared ledger spends through (see the module docstring).

    Args:
        shared: the ledger the runs share (the caller closes it).
        cap: the job's own budget (``--budget``): never below ``spent``.
        spent: what the job already paid from the shared ledger (its journal's answers,
            preflights and checks).
    """

    def __init__(self, shared: Ledger, *, cap: Decimal, spent: Decimal) -> None:
        self.shared = shared
        self.shared_state: LedgerState | None = None
        """The shared ledger as :meth:`snapshot` last read it."""
        self.cap = cap
        """The job's own budget."""
        self._own = MemoryLedger(cap)
        self._before = spent
        self._holds: dict[str, Reservation] = {}

    async def _on_enter(self) -> None:
        await self._book_before()

    async def _book_before(self) -> None:
        """Book what the job spent before this run against its own cap, once."""
        if self._before:
            spent, self._before = self._before, Decimal(0)
            held = await self._own.reserve(spent, key="spent before this run")
            await self._own.settle(held, spent)

    def __repr__(self) -> str:
        return f"LedgerShare({self.shared!r}, cap={self.cap})"

    def __getattr__(self, name: str) -> Any:
        # The shared ledger's identity, write failures... (what the runner reads).
        if name == "shared":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.shared, name)

    async def reserve(
        self, amount: Decimal, *, key: str, wait: bool | float = False
    ) -> Reservation:
        await self._book_before()
        own = await self._own.reserve(amount, key=key, wait=wait)
        try:
            held = await self.shared.reserve(amount, key=key, wait=wait)
        except BaseException:
            await self._own.release(own)
            raise
        self._holds[held.id] = own
        return held

    async def attach(self, reservation: Reservation, generation_id: str) -> None:
        await self.shared.attach(reservation, generation_id)

    async def settle(
        self,
        reservation: Reservation,
        cost: Decimal,
        *,
        estimate: Decimal | None = None,
        provider: str | None = None,
        generation_id: str | None = None,
    ) -> None:
        # The shared ledger first: if its write fails, the job keeps holding the worst case.
        await self.shared.settle(
            reservation, cost, estimate=estimate, provider=provider, generation_id=generation_id
        )
        own = self._holds.pop(reservation.id, None)
        if own is not None:
            await self._own.settle(own, cost, estimate=estimate, provider=provider)

    async def release(self, reservation: Reservation) -> None:
        await self.shared.release(reservation)
        own = self._holds.pop(reservation.id, None)
        if own is not None:
            await self._own.release(own)

    async def snapshot(self) -> LedgerState:
        """The job's own view: its cap, its spend, what this run holds; the waiting count
        of both."""
        await self._book_before()
        shared = self.shared_state = await self.shared.snapshot()
        own = await self._own.snapshot()
        return dataclasses.replace(own, waiting=own.waiting + shared.waiting)

    async def open_reservations(self) -> list[Reservation]:
        return await self.shared.open_reservations()

    async def recover(
        self,
        resolve: CostResolver | None = None,
        *,
        keep: Callable[[Reservation], bool] | None = None,
    ) -> RecoveryReport:
        return await self.shared.recover(resolve, keep=keep)

    async def set_limit(self, limit: Decimal) -> None:
        """Change the job's own cap (the shared limit is ``ledger topup``'s)."""
        await self._own.set_limit(limit)
        self.cap = limit

    async def close(self) -> None:
        """Close the job's own book (the shared ledger is its opener's to close)."""
        await self._own.close()

    async def _on_exit(self) -> None:
        await self.close()
