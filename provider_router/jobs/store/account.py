"""Account reconciliation: worst-case charges bounded by what the key was really charged.

A request cut before OpenRouter named its generation can only be counted at its worst
case: no ``/generation`` lookup can say what it cost. When the API key is the run's
own, its total usage (``GET /key``) bounds all of them together: :class:`AccountCheck`
records a baseline (``account.json``) at a job's first run, and at the end of each run
``over = (spent + held − spent₀) − (usage − usage₀)`` is money counted that the key was
never charged; it is taken back from the worst cases it can only belong to, each
ending between nothing and its worst case. A generation may still bill after its client
is gone, so a worst case is corrected only ``horizon`` seconds after it was given up on.
Never use it with a key anything else spends through (docs/ledger.md).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

from provider_router._exceptions import ConfigurationError
from provider_router._log import get_logger
from provider_router._money import to_decimal
from provider_router._types import Clock
from provider_router.client.router import Router
from provider_router.jobs.store._layout import JobLayout
from provider_router.ledger import Ledger, Reservation

__all__ = ["AccountCheck"]

log = get_logger(__name__)


class AccountCheck:
    """Corrects worst-case charges against the key's usage (see the module docstring).

    Args:
        directory: the job directory (the baseline lives in ``account.json``).
        router: the run's open router (its key, its held reservations).
        ledger: the run's ledger.
        horizon: seconds after which a request given up on can no longer be billed.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        directory: Path,
        router: Router,
        ledger: Ledger,
        *,
        horizon: float,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
    ) -> None:
        self.path = JobLayout(directory).account
        self.router = router
        self.ledger = ledger
        self.horizon = horizon
        self._clock = clock
        self._wall = wall
        self._baseline: tuple[Decimal, Decimal] | None = None
        self._pending: list[tuple[Reservation, float]] = []
        self.corrected = Decimal(0)
        """USD taken back from worst-case charges by this run."""

    async def start(self, orphans: Sequence[Reservation]) -> None:
        """Load (or record, on a job's first run) the baseline; add recovery's orphans.

        Orphans of a dead run are due ``horizon`` seconds from now (their generations
        started before this run did); they wait in ``account.json`` until then, across
        runs if need be.
        """
        loaded = self._load()
        if loaded is None:
            usage = await self.router.key_usage()
            if usage is None:
                return
            spent = (await self.ledger.snapshot()).spent
            self._baseline = (usage, spent)
            self._save()
            return  # orphans recovered before a baseline existed stay at worst case
        due = self._wall() + self.horizon
        known = {r.id for r, _ in self._pending}
        self._pending += [(orphan, due) for orphan in orphans if orphan.id not in known]
        self._save()

    async def finish(self) -> Decimal:
        """Take back what the key was provably not charged; the USD corrected."""
        if self._baseline is None:
            return Decimal(0)
        usage = await self.router.key_usage()
        if usage is None:
            return Decimal(0)
        base_usage, base_spent = self._baseline
        now, wall = self._clock(), self._wall()
        billing = self.router._billing
        held = [r for r in self.router.unresolved if not r.generation_id]
        due_held = [r for r in held if now - billing.held_since.get(r.id, now) >= self.horizon]
        due_orphans = [r for r, due in self._pending if due <= wall]
        # Worst cases still inside the horizon may yet be billed in full: never take
        # back money they may need.
        not_due = sum((r.amount for r in held if r not in due_held), Decimal(0))
        not_due += sum((r.amount for r, due in self._pending if due > wall), Decimal(0))
        spent = (await self.ledger.snapshot()).spent
        counted = spent + sum((r.amount for r in held), Decimal(0))
        over = counted - base_spent - (usage - base_usage) - not_due
        corrected = Decimal(0)
        for reservation in [*due_orphans, *due_held]:
            if over <= 0:
                break
            back = min(over, reservation.amount)
            cost = reservation.amount - back
            try:
                if reservation in due_held:
                    await billing.settle_held(reservation, cost)
                else:
                    # A late settle corrects a worst case counted by recovery.
                    await self.ledger.settle(reservation, cost)
            except ConfigurationError:
                continue  # closed otherwise meanwhile: nothing to take back here
            over -= back
            corrected += back
        self._pending = [(r, due) for r, due in self._pending if due > wall]
        # Held ones not yet due stay open for the next run's recovery, and wait here.
        for reservation in held:
            if reservation not in due_held:
                since = billing.held_since.get(reservation.id, now)
                billing.hand_over(reservation)
                self._pending.append((reservation, wall + self.horizon - (now - since)))
        self._save()
        self.corrected += corrected
        if corrected:
            log.warning(
                "batch.account_reconciled",
                corrected=str(corrected),
                usage=str(usage - base_usage),
                counted=str(counted - base_spent),
            )
        return corrected

    def _load(self) -> tuple[Decimal, Decimal] | None:
        try:
            data = json.loads(self.path.read_text())
            self._baseline = (
                to_decimal(data["usage"], what="account.json usage"),
                to_decimal(data["spent"], what="account.json spent"),
            )
            self._pending = [
                (Reservation(p["id"], int(p["units"]), p["key"]), float(p["due"]))
                for p in data.get("pending", [])
            ]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return self._baseline

    def _save(self) -> None:
        assert self._baseline is not None
        usage, spent = self._baseline
        pending = [
            {"id": r.id, "units": r.units, "key": r.key, "due": due} for r, due in self._pending
        ]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"usage": str(usage), "spent": str(spent), "pending": pending}))
        os.replace(tmp, self.path)
