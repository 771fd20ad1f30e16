"""An in-process ledger: the fastest backend, for one process and tests.

Everything happens synchronously on the event loop thread (no locks are needed
because nothing awaits between a check and its update). Not thread-safe: use it
from one event loop. Nothing survives the process, so there is nothing to recover.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import deque
from collections.abc import Callable
from decimal import Decimal

from provider_router._exceptions import ConfigurationError
from provider_router._log import DEBUG, get_logger
from provider_router._resource import AsyncResource
from provider_router.ledger._base import (
    CostResolver,
    LedgerState,
    RecoveryReport,
    Reservation,
    amount_units,
    estimate_units,
    exhausted,
    limit_units,
    new_owner,
    new_reservation,
)
from provider_router.ledger._totals import Totals

__all__ = ["MemoryLedger"]

log = get_logger(__name__)


class _Waiter:
    __slots__ = ("future", "key", "timer", "units")

    def __init__(self, units: int, key: str, future: asyncio.Future[Reservation]) -> None:
        self.units = units
        self.key = key
        self.future = future
        self.timer: asyncio.TimerHandle | None = None


class MemoryLedger(AsyncResource):
    """A :class:`~provider_router.Ledger` held in memory.

    Args:
        limit: the budget in USD.

    Waiting reservations are admitted first come, first served as room frees up.
    """

    def __init__(self, limit: Decimal) -> None:
        self._totals = Totals(limit_units(limit))
        self._open: dict[str, Reservation] = {}
        self._generation: dict[str, str] = {}
        self._waiters: deque[_Waiter] = deque()
        self._owner = new_owner()
        self._ids = itertools.count(1)
        self._closed = False

    def __repr__(self) -> str:
        t = self._totals
        return f"MemoryLedger(limit={t.limit_units}, spent={t.spent}, reserved={t.reserved} units)"

    # --- reserve ------------------------------------------------------------

    async def reserve(
        self, amount: Decimal, *, key: str, wait: bool | float = False
    ) -> Reservation:
        units = amount_units(amount, what="reservation amount", round_up=True, capped=False)
        if self._closed:  # _check_open, inlined on the path of every request
            raise ConfigurationError("the ledger is closed")
        totals = self._totals
        # A waiting caller queues behind earlier waiters; a non-waiting one may
        # take room that fits now (it would rather fail than wait).
        if totals.fits(units) and (wait is False or not self._waiters):
            # _admit, inlined on the path of every request.
            res_id = f"m{next(self._ids)}"
            res = new_reservation(res_id, units, key, self._owner)
            totals.admit(units)
            self._open[res_id] = res
            return res
        if wait is False or not totals.can_ever_fit(units):
            raise exhausted(units, totals.limit_units, totals.spent, totals.reserved)
        return await self._wait(units, key, wait)

    def _admit(self, units: int, key: str) -> Reservation:
        res = new_reservation(f"m{next(self._ids)}", units, key, self._owner)
        self._totals.admit(units)
        self._open[res.id] = res
        return res

    async def _wait(self, units: int, key: str, wait: bool | float) -> Reservation:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(units, key, loop.create_future())
        if wait is not True:
            waiter.timer = loop.call_later(float(wait), self._expire, waiter)
        self._waiters.append(waiter)
        if log.isEnabledFor(DEBUG):
            log.debug("ledger.wait", key=key, units=units)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            # Admitted just before the cancellation landed: give the money back.
            fut = waiter.future
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                res = fut.result()
                self._open.pop(res.id, None)
                self._totals.release(res.units)
                self._pump()
            raise
        finally:
            if waiter.timer is not None:
                waiter.timer.cancel()

    def _expire(self, waiter: _Waiter) -> None:
        if not waiter.future.done():
            t = self._totals
            waiter.future.set_exception(exhausted(waiter.units, t.limit_units, t.spent, t.reserved))
        self._pump()

    def _pump(self) -> None:
        """Admit waiting reservations, in order, while they fit."""
        waiters, totals = self._waiters, self._totals
        while waiters:
            head = waiters[0]
            if head.future.done():  # timed out or cancelled
                waiters.popleft()
                continue
            if totals.fits(head.units):
                waiters.popleft()
                head.future.set_result(self._admit(head.units, head.key))
            elif not totals.can_ever_fit(head.units):
                waiters.popleft()
                head.future.set_exception(
                    exhausted(head.units, totals.limit_units, totals.spent, totals.reserved)
                )
            else:
                break
        # Behind a head that may still fit, a larger waiter may never fit any more:
        # refuse it now, not once it reaches the head (woken by this settle, not later).
        if waiters and any(not totals.can_ever_fit(w.units) for w in waiters):
            keep: list[_Waiter] = []
            for waiter in waiters:
                if waiter.future.done():
                    continue
                if totals.can_ever_fit(waiter.units):
                    keep.append(waiter)
                else:
                    waiter.future.set_exception(
                        exhausted(waiter.units, totals.limit_units, totals.spent, totals.reserved)
                    )
            waiters.clear()
            waiters.extend(keep)

    # --- close a reservation --------------------------------------------------

    def _take(self, reservation: Reservation, action: str) -> Reservation:
        res = self._open.pop(reservation.id, None)
        if res is None:
            raise ConfigurationError(
                f"cannot {action} reservation {reservation.id!r}: it is not open in this "
                "ledger (unknown, or already settled or released)"
            )
        if self._generation:  # ids are attached only to answers that arrive in parts
            self._generation.pop(res.id, None)
        return res

    async def attach(self, reservation: Reservation, generation_id: str) -> None:
        if reservation.id not in self._open:
            raise ConfigurationError(f"cannot attach to reservation {reservation.id!r}: not open")
        self._generation[reservation.id] = generation_id

    async def settle(
        self,
        reservation: Reservation,
        cost: Decimal,
        *,
        estimate: Decimal | None = None,
        provider: str | None = None,
        generation_id: str | None = None,
    ) -> None:
        cost_units = amount_units(cost, what="cost", round_up=False)
        est = estimate_units(estimate, cost, cost_units)
        # _take, inlined on the path of every request (its error when not open).
        res = self._open.pop(reservation.id, None)
        if res is None:
            res = self._take(reservation, "settle")  # raises: not open
        elif self._generation:
            self._generation.pop(res.id, None)
        self._totals.settle(res.units, cost_units, est)
        if self._waiters:
            self._pump()

    async def release(self, reservation: Reservation) -> None:
        res = self._take(reservation, "release")
        self._totals.release(res.units)
        if self._waiters:
            self._pump()

    # --- the rest of the contract -----------------------------------------------

    async def snapshot(self) -> LedgerState:
        waiting = sum(1 for w in self._waiters if not w.future.done())
        return dataclasses.replace(self._totals.state(), waiting=waiting)

    async def open_reservations(self) -> list[Reservation]:
        return [
            Reservation(r.id, r.units, r.key, self._generation.get(r.id), r.owner)
            for r in self._open.values()
        ]

    async def recover(
        self,
        resolve: CostResolver | None = None,
        *,
        keep: Callable[[Reservation], bool] | None = None,
    ) -> RecoveryReport:
        # Every open reservation belongs to this live instance: none is orphaned.
        return RecoveryReport()

    async def set_limit(self, limit: Decimal) -> None:
        self._totals.limit_units = limit_units(limit)
        log.info("ledger.set_limit", limit=str(limit))
        self._pump()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(ConfigurationError("the ledger was closed"))
        self._waiters.clear()

    async def _on_exit(self) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("the ledger is closed")
