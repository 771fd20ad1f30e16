"""The batch route's money: each batch's worst case held, settled once, bills withheld.

:class:`BatchMoney` reserves a batch's worst case in the job's ledger before its
intent is journaled (what does not fit the budget is not sent), settles or releases
that reservation exactly once (``settled`` in ``batches.jsonl``, so a resume never
closes it twice), and turns a results 402 (credits short at finalize) into the stop
that says how much to add, counting each withheld batch's bill once against one
balance. A disputed bill (more than twice its worst case) books the worst case, is
journaled in ``batches.jsonl`` (and the output journal's ``disputed`` entries), and
stops the run as on the sync route: a resume sends no batch while a dispute is on
record, since the ledger may be below what was charged.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from provider_router._exceptions import ConfigurationError, PaymentRequiredError
from provider_router._money import from_units
from provider_router.jobs.batch_api.api import BatchApi
from provider_router.jobs.batch_api.journal import BatchIntent, BatchJournal
from provider_router.jobs.batch_api.result import BatchRouteResult
from provider_router.jobs.batch_api.results import read_cost
from provider_router.jobs.store.journal import FileJournal
from provider_router.ledger import Ledger
from provider_router.ledger._base import Reservation

__all__ = ["BatchMoney", "NoRoom"]


class NoRoom(Exception):
    """Not even one line's worst case fits what the budget has left."""


class BatchMoney:
    """Reserve, settle and stop for money, for one run of the batch route."""

    def __init__(
        self,
        api: BatchApi,
        ledger: Ledger,
        batches: BatchJournal,
        result: BatchRouteResult,
        journal: FileJournal | None = None,
    ) -> None:
        self.api = api
        self.ledger = ledger
        self.batches = batches
        self.result = result
        self.journal = journal
        """The output journal: its ``disputed`` entries feed the summary and ``ledger show``."""
        self.withheld = False
        """A results 402 this round: the run stops (a resume collects after a top-up)."""
        self._reservations: dict[str, Reservation] = {}
        self._owed_costs: dict[str, Decimal] = {}

    async def reserve(self, key: str, worst: list[Decimal]) -> tuple[int, Reservation]:
        """Hold the first lines' worst cases that fit what is left: (how many, the hold).

        Raises:
            NoRoom: not even the first line fits.
        """
        room = (await self.ledger.snapshot()).available
        total = sum(worst, Decimal(0))
        count = len(worst)
        while count and total > room:
            # Take what fits: the budget is never exceeded, and the rest waits.
            count -= 1
            total -= worst[count]
        if not count:
            raise NoRoom(f"the ${room} left cannot hold even one batch line's worst case")
        return count, await self.ledger.reserve(total, key=key)

    def remember(self, intent: str, reservation: Reservation) -> None:
        """This run's own handle of an intent's reservation (with its lease owner)."""
        self._reservations[intent] = reservation

    async def close(self, intent: BatchIntent, cost: Decimal) -> None:
        """Settle the intent's reservation at ``cost`` (zero: release), once."""
        if intent.settled:
            return
        held = intent.reservation
        reservation = self._reservations.pop(intent.intent, None) or Reservation(
            str(held["id"]), int(held["units"]), str(held["key"]), None, held.get("owner")
        )
        try:
            if cost > 0:
                await self.ledger.settle(reservation, cost)
            else:
                await self.ledger.release(reservation)
        except ConfigurationError:
            # Closed already (a recovery counted its worst case): that stays booked.
            self.result.events.append(f"batch {intent.intent}: its reservation was closed before")
        self.batches.record_settled(intent.intent)

    async def owed(self, exc: PaymentRequiredError) -> None:
        """A batch's results withheld for credits: stop, saying how much to add."""
        self.withheld = True
        body = exc.body or {}
        usage = body.get("usage")
        cost = read_cost(usage.get("cost") if isinstance(usage, Mapping) else None) or Decimal(0)
        # Keyed by batch: two lost intents may find the same withheld batch, and one
        # balance covers every withheld bill at once (not each bill on its own).
        self._owed_costs[str(body.get("id", id(exc)))] = cost
        owed = sum(self._owed_costs.values(), Decimal(0))
        balance = await self.api.balance()
        self.result.top_up = owed if balance is None else max(owed - balance, Decimal(0))
        self.result.stopped_by = "credits"
        self.result.stop = (
            f"OpenRouter withholds finished batches' results until credits cover their "
            f"${owed}: add at least ${self.result.top_up} and run again to collect them "
            "(they are not re-run)"
        )

    def checked(
        self, intent: BatchIntent, what: str, reported: Decimal, instead: Decimal
    ) -> Decimal:
        """``reported`` when within twice the intent's worst case; else it is disputed and
        ``instead`` is what to book (never one answer's word for an absurd bill)."""
        worst = from_units(intent.worst_units)
        if reported <= 2 * worst:
            return reported
        self.dispute(
            intent,
            None,
            f"batch {intent.batch_id}: {what} ${reported} is more than twice its worst case "
            f"${worst}; ${instead} is booked",
            reported,
            instead,
        )
        return instead

    def dispute(
        self,
        intent: BatchIntent,
        key: str | None,
        note: str,
        reported: Decimal,
        booked: Decimal,
        generation_id: str | None = None,
    ) -> None:
        """A bill not taken on its word: ``booked`` (the worst case) stands, the dispute is
        journaled before it is booked, and no more is sent (this run or a resume)."""
        self.batches.record_disputed(intent.intent, note)
        if self.journal is not None:
            key = key or f"batch:{intent.intent}"
            self.journal.note_disputed(key, generation_id, reported, booked)
        self.result.events.append(note)
        self.stop_disputed(note)

    def stop_disputed(self, note: str) -> None:
        """The stop a dispute on record makes (``note`` says which bill)."""
        self.result.stopped_by = "error"
        self.result.stop = (
            f"disputed cost: {note}; no more batches are sent while it is on record in "
            f"{self.batches.path.name}: check it at https://openrouter.ai/activity, then run "
            "again with --batch-accept-disputed if its booked worst case may stand"
        )
