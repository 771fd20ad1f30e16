"""The public ledger methods for stores that outlive a process (SQLite, Redis).

A subclass provides one coroutine, ``_execute(batch)``, that applies a batch of
:class:`~provider_router.ledger._group_commit.Op` atomically and durably; this class
turns calls into ops, renews the leases of its open reservations, and runs
recovery.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from provider_router._exceptions import ConfigurationError
from provider_router._log import get_logger
from provider_router._money import from_units
from provider_router._resource import AsyncResource
from provider_router._types import Clock
from provider_router.ledger import _group_commit as b
from provider_router.ledger._base import (
    CostResolver,
    LedgerState,
    RecoveryReport,
    Reservation,
    amount_units,
    estimate_units,
    limit_units,
    new_owner,
)
from provider_router.ledger._write_failures import WriteFailures

log = get_logger(__name__)

_RESOLVE_CONCURRENCY = 32


class DurableLedger(AsyncResource):
    """Shared implementation of the :class:`~provider_router.Ledger` protocol.

    Args:
        lease: seconds an open reservation stays owned without renewal; the
            owner renews every third of it. After a crash, recovery may close
            the reservations of an owner whose lease has run out.
        poll_interval: seconds between retries of waiting reservations when
            only other processes can free room.
        commit_interval: seconds between the starts of two batches under load
            (group commit sized by time, stretched by long holds, ``_batch.py``);
            ``0`` commits whatever is waiting as soon as the previous batch is done.
        clock: wall-clock seconds (``time.time``), for leases; injected in tests.
    """

    def __init__(
        self,
        *,
        lease: float,
        poll_interval: float,
        clock: Clock,
        commit_interval: float = b.DEFAULT_COMMIT_INTERVAL,
    ) -> None:
        if not lease > 0:
            raise ConfigurationError(f"lease must be positive seconds, got {lease!r}")
        if not poll_interval > 0:
            raise ConfigurationError(f"poll_interval must be positive, got {poll_interval!r}")
        if not commit_interval >= 0:
            raise ConfigurationError(
                f"commit_interval must be ≥ 0 seconds, got {commit_interval!r}"
            )
        self.owner = new_owner()
        self.lease = float(lease)
        self._clock = clock
        self._prefix = os.urandom(8).hex()
        self._ids = itertools.count(1)
        self._batcher = b.Batcher(
            self._execute,
            owner=self.owner,
            poll_interval=poll_interval,
            commit_interval=float(commit_interval),
            on_failure=self._write_failed,
        )
        self.write_failures = WriteFailures()
        """The ledger writes that failed (money that may not be what was recorded)."""
        self._renew_timer: asyncio.TimerHandle | None = None
        self._closed = False

    async def _execute(self, batch: list[b.Op]) -> tuple[int, int, int]:
        raise NotImplementedError

    def _write_failed(self, batch: list[b.Op], exc: Exception) -> None:
        """Name a failed batch's cause and what it means for money (reads: nothing).

        A misuse (a ledger that does not exist, a limit refused) is its caller's error,
        not a failed write.
        """
        if isinstance(exc, ConfigurationError):
            return
        sentence = self.write_failures.add({op.kind for op in batch}, exc)
        if sentence is not None:
            log.error(
                "ledger.write_failed",
                ledger=repr(self),
                ops=len(batch),
                error_type=type(exc).__name__,
                error=sentence,
            )

    async def _close_store(self) -> None:
        raise NotImplementedError

    def _lease_until(self) -> float:
        return self._clock() + self.lease

    async def _call(self, op: b.Op) -> Any:
        return await self._batcher.submit(op)

    # --- reserve ------------------------------------------------------------------

    async def reserve(
        self, amount: Decimal, *, key: str, wait: bool | float = False
    ) -> Reservation:
        units = amount_units(amount, what="reservation amount", round_up=True, capped=False)
        if self._closed:
            raise ConfigurationError("the ledger is closed")
        op = b.Op(b.RESERVE, f"{self._prefix}.{next(self._ids)}", units, key)
        if wait is not False:
            op.waiting = True
            if wait is not True:
                op.deadline = asyncio.get_running_loop().time() + float(wait)
        fut = self._batcher.submit(op)
        if self._renew_timer is None:
            self._arm_renewal()
        try:
            res: Reservation = await fut
        except asyncio.CancelledError:
            # The row may have been written just before the cancellation landed.
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._batcher.submit_quietly(b.Op(b.RELEASE, op.id, units))
            raise
        return res

    # --- close a reservation ----------------------------------------------------------

    async def attach(self, reservation: Reservation, generation_id: str) -> None:
        op = b.Op(b.ATTACH, reservation.id)
        op.generation_id = generation_id
        await self._batcher.submit(op)

    async def settle(
        self,
        reservation: Reservation,
        cost: Decimal,
        *,
        estimate: Decimal | None = None,
        provider: str | None = None,
        generation_id: str | None = None,
    ) -> None:
        op = b.Op(b.SETTLE, reservation.id, reservation.units)
        op.cost = cost_units = amount_units(cost, what="cost", round_up=False)
        op.estimate = estimate_units(estimate, cost, cost_units)
        op.provider = provider
        op.generation_id = generation_id
        await self._batcher.submit(op)

    async def release(self, reservation: Reservation) -> None:
        await self._batcher.submit(b.Op(b.RELEASE, reservation.id, reservation.units))

    # --- the rest of the contract ---------------------------------------------------------

    async def snapshot(self) -> LedgerState:
        state: LedgerState = await self._call(b.Op(b.SNAPSHOT))
        return dataclasses.replace(state, waiting=self._batcher.queued_for_room())

    async def open_reservations(self) -> list[Reservation]:
        found: list[Reservation] = await self._call(b.Op(b.LIST_OPEN))
        return found

    async def set_limit(self, limit: Decimal) -> None:
        units = limit_units(limit)
        await self._call(b.Op(b.SET_LIMIT, units=units))
        log.info("ledger.set_limit", limit=str(limit))

    async def recover(
        self,
        resolve: CostResolver | None = None,
        *,
        keep: Callable[[Reservation], bool] | None = None,
    ) -> RecoveryReport:
        claim = b.Op(b.CLAIM)
        claim.value = self._clock()
        claimed: list[Reservation] = await self._call(claim)
        if not claimed:
            return RecoveryReport()
        for res in claimed:
            self._batcher.mine[res.id] = None  # not ours from the start: no hold time
        if self._renew_timer is None:
            self._arm_renewal()
        kept = tuple(res for res in claimed if keep is not None and keep(res))
        orphans = [res for res in claimed if res not in kept]
        if not orphans:
            return RecoveryReport(kept=kept)
        log.warning("ledger.recover", orphans=len(orphans))
        gate = asyncio.Semaphore(_RESOLVE_CONCURRENCY)

        async def close_one(res: Reservation) -> tuple[Reservation, int | None, bool]:
            cost = None
            if resolve is not None:
                async with gate:
                    try:
                        cost = await resolve(res)
                    except Exception as exc:  # unknown is safe: counted at worst case
                        log.warning("ledger.resolve_failed", reservation=res.id, error=repr(exc))
            units = None if cost is None else amount_units(cost, what="cost", round_up=False)
            op = b.Op(b.CHARGE_WORST if units is None else b.RECONCILE, res.id, res.units)
            op.cost = 0 if units is None else units
            try:
                await self._batcher.submit(op)
            except ConfigurationError:
                # Its owner was only slow and closed it meanwhile: nothing to do.
                return res, units, False
            return res, units, op.outcome == b.OK

        results = await asyncio.gather(*(close_one(res) for res in orphans))
        reconciled = [(r, u) for r, u, done in results if done and u is not None]
        worst = [r for r, u, done in results if done and u is None]
        report = RecoveryReport(
            reconciled=tuple(r for r, _ in reconciled),
            worst_case=tuple(worst),
            reconciled_cost=from_units(sum(u for _, u in reconciled if u is not None)),
            worst_case_cost=from_units(sum(r.units for r in worst)),
            kept=kept,
        )
        log.warning(
            "ledger.recovered",
            reconciled=len(report.reconciled),
            worst_case=len(report.worst_case),
            reconciled_cost=str(report.reconciled_cost),
            worst_case_cost=str(report.worst_case_cost),
        )
        return report

    # --- leases -----------------------------------------------------------------------------

    def _arm_renewal(self) -> None:
        if not self._closed:
            loop = asyncio.get_running_loop()
            self._renew_timer = loop.call_later(self.lease / 3, self._renew)

    def _renew(self) -> None:
        if self._batcher.mine:
            op = b.Op(b.RENEW)
            op.value = (self._lease_until(), tuple(self._batcher.mine))
            self._batcher.submit_quietly(op)
        self._arm_renewal()

    # --- lifecycle ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Finish pending writes and close the store.

        Reservations still open stay in the store (their lease runs out, then
        :meth:`recover` closes them): closing never forgets money.
        """
        if self._closed:
            return
        self._closed = True
        if self._renew_timer is not None:
            self._renew_timer.cancel()
        self._batcher.fail_waiters(ConfigurationError("the ledger was closed"))
        await self._batcher.drain()
        if self._batcher.mine:
            log.warning("ledger.closed_with_open", open=len(self._batcher.mine))
        await self._close_store()

    async def _on_exit(self) -> None:
        await self.close()
