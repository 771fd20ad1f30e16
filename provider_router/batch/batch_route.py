"""The runner's batch route: datasets through OpenRouter's Batch API, within the budget,
each prompt's result written exactly once, across kills and resumes.

:class:`BatchRouteRun` splits each dataset's remaining prompts into batches (at most
5,000 requests and 200 MB, one model), and for each:

1. reserves the batch's worst case in the job's ledger (every line's prompt bound
   plus ``max_tokens`` at the pinned ``:batch`` endpoint's price); what does not fit
   is not sent;
2. journals the intent (the prompts, their ``custom_id``s, the reservation, the time)
   and fsyncs it, *then* submits; journals the batch id after the 202;
3. polls with backoff until the batch ends; collects its results page by page,
   writing each successful line through the output journal (a prompt already done is
   skipped: exactly once), checks the batch's ``usage.cost`` against the sum of its
   lines and settles the reservation at the larger (failed lines cost nothing);
4. a 402 on results (credits short at finalize) stops the run, saying how much to
   add; the batch is not re-run, and a resume after the top-up collects it.

A submit whose request provably never left (``request_sent=False``) is released at
once and its prompts may go again. Any other unanswered submit (a kill between the
intent and the 202, an answer lost on the wire) is an intent without a batch id: each
round looks for its batch with ``GET /batches?created_after=`` and checks the results'
``custom_id``s, which carry the intent's id. Its worst case stays held and its prompts
are never sent again until the batch is found, or until ``lost_grace`` (by default the
whole 24 h window and the list's lag) has passed with no listed batch carrying its
``custom_id``s: the list may show a new batch late, and sooner could pay twice. Failed and
expired batches' prompts run again in new batches (up to ``max_attempts`` each). An
expired batch's reservation is settled at its worst case: nothing says what it cost
(docs/batch.md).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from provider_router._exceptions import (
    APIConnectionError,
    APIStatusError,
    BudgetExhausted,
    ConfigurationError,
    DataFileError,
    InvalidResponseError,
    NotFoundError,
    PaymentRequiredError,
    ProviderUnavailableError,
    RateLimitError,
)
from provider_router._log import get_logger
from provider_router._money import from_units, to_units
from provider_router.batch.batch_api import RESULTS_PAGE_LINES, BatchApi
from provider_router.batch.batch_body import MAX_BATCH_REQUESTS, RESULTS_PAGE_BYTES, BatchBody
from provider_router.batch.batch_journal import BatchIntent, BatchJournal
from provider_router.batch.batch_lost import LIST_LAG_SECONDS, LOST_GRACE_SECONDS, find_lost
from provider_router.batch.batch_poll import listed_statuses
from provider_router.batch.batch_results import (
    ResultLine,
    failed_batch_cost,
    read_cost,
    read_result,
    result_record,
)
from provider_router.batch.batch_route_result import BatchRouteResult
from provider_router.batch.batch_unmatched import UnmatchedAnswers
from provider_router.batch.batch_waves import wave_room
from provider_router.batch.journal import FileJournal
from provider_router.ledger import Ledger
from provider_router.ledger._base import Reservation
from provider_router.prompts import Prompt
from provider_router.route_batch import BatchRoute

__all__ = ["BatchRouteResult", "BatchRouteRun"]

log = get_logger(__name__)

_TRANSIENT = (APIConnectionError, ProviderUnavailableError, RateLimitError)
"""Errors a poll or collect waits out (tried again next round)."""


MAX_UNSENT_SUBMITS: Final = 5
"""Submits in a row that never left (each after a longer wait) before the run stops."""


@dataclass(slots=True)
class _Collecting:
    """How far this run has read one completed batch's results."""

    cursor: str | None = None
    seen: set[str] = field(default_factory=set)
    lines_cost: Decimal = Decimal(0)
    failed: list[str] = field(default_factory=list)
    done: bool = False


class _NoRoom(Exception):
    """Not even one line's worst case fits what the budget has left."""


class BatchRouteRun:
    """Run datasets through the Batch API (see the module docstring).

    Args:
        api: the Batch API calls (on the run's HTTP client).
        ledger: the job's ledger (its limit is the budget).
        journal: the output journal of the job directory (exactly-once outputs).
        directory: where ``batches.jsonl`` lives.
        route: the pinned batch endpoint (:func:`~provider_router.batch_route`).
        params: the request body's generation fields (``max_tokens`` required).
        clock / sleep: wall clock (Unix seconds) and sleep, injectable.
        poll_initial / poll_max: seconds between polls, doubling up to the max.
        lost_grace: seconds after an intent whose submit may have reached OpenRouter
            before "no such batch listed" means it was never created (default: the
            24 h window and the list's lag; sooner may pay twice).
        missing_grace: seconds a submitted batch may answer 404 before the run stops.
        max_attempts: batches a prompt may be sent in (a failed or expired batch's
            prompts go again, never beyond the budget).
        max_batch_requests: requests per batch (at most 5,000).
        dataset_params: a dataset's own generation fields, over ``params``.
        limits: per dataset, (output-token target, request cap): lines are sent in
            waves so that what is done plus what is in batches (at the observed
            tokens per line, ``max_tokens`` before any) stays within them.
        progress: called with the result so far after each round of polls.
    """

    def __init__(
        self,
        *,
        api: BatchApi,
        ledger: Ledger,
        journal: FileJournal,
        directory: str | Path,
        route: BatchRoute,
        params: Mapping[str, Any],
        clock: Any = time.time,
        sleep: Any = asyncio.sleep,
        poll_initial: float = 5.0,
        poll_max: float = 300.0,
        lost_grace: float = LOST_GRACE_SECONDS,
        missing_grace: float = LIST_LAG_SECONDS,
        max_attempts: int = 2,
        max_batch_requests: int = MAX_BATCH_REQUESTS,
        dataset_params: Mapping[str, Mapping[str, Any]] | None = None,
        limits: Mapping[str, tuple[int | None, int | None]] | None = None,
        progress: Callable[[BatchRouteResult], None] | None = None,
    ) -> None:
        self.body = BatchBody(route, params, dataset_params or {}, max_batch_requests)
        self.limits = dict(limits or {})
        self.progress = progress
        self.api = api
        self.ledger = ledger
        self.journal = journal
        self.batches = BatchJournal.open(directory)
        self.unmatched = UnmatchedAnswers(directory)
        self.route = route
        self.clock = clock
        self.sleep = sleep
        self.poll_initial = poll_initial
        self.poll_max = poll_max
        self.lost_grace = lost_grace
        self.missing_grace = missing_grace
        self.max_attempts = max_attempts
        self.result = BatchRouteResult()
        self._reservations: dict[str, Reservation] = {}
        self._halt = False
        self._missing: dict[str, float] = {}
        """When each batch first answered 404 in this run."""
        self._owed_costs: dict[str, Decimal] = {}
        self._unsent = 0
        self._collecting: dict[str, _Collecting] = {}
        """Submits in a row that never left (a connection that could not be made)."""

    def close(self) -> None:
        self.batches.close()

    # --- the run ------------------------------------------------------------------

    async def run(self, datasets: Mapping[str, Sequence[Prompt]]) -> BatchRouteResult:
        """Submit, poll and collect until every prompt is done, or a stop."""
        prompts = {name: {p.id: p for p in items} for name, items in datasets.items()}
        self.journal.prepare(list(prompts))
        await self._check_journal()
        # A kill between a reserve and its intent left a hold nobody knows: a recovery
        # counts it at its worst case (never below what may have been spent); a batch
        # this run then collects corrects its own to the true cost.
        await self.ledger.recover()
        delay = self.poll_initial
        while True:
            self._halt = False
            await self._resolve_lost()
            progressed = await self._poll_all(prompts)
            if self._halt:
                break  # a results 402 (a resume collects after the top-up), or a vanished batch
            if self.result.stop is None:
                progressed |= await self._submit_all(prompts)
            self._report()
            if not any(i.live for i in self.batches) and not self._unsent:
                break
            delay = self.poll_initial if progressed else min(delay * 2, self.poll_max)
            await self.sleep(delay)
        self._report()
        for name, items in prompts.items():
            attempts = self._attempts(name)
            left = sum(
                1
                for pid in items
                if attempts.get(pid, 0) >= self.max_attempts and not self.journal.is_done(name, pid)
            )
            if left:
                self.result.gave_up[name] = left
        return self.result

    async def _check_journal(self) -> None:
        """A batch journal made new while the ledger holds batches was lost: refuse."""
        if self.batches.existed:
            return
        held = [r for r in await self.ledger.open_reservations() if r.key.startswith("batch:")]
        if held:
            # Not left behind empty: the next run must refuse as well.
            if self.batches.path.stat().st_size == 0:
                self.batches.path.unlink()
            raise DataFileError(
                self.batches.path,
                f"missing, but the job's ledger holds {len(held)} batch reservation(s): "
                "those batches may still run and bill, and their prompts would be sent "
                "again; restore the file (or finish the job in a new directory)",
            )

    def _report(self) -> None:
        live = [i for i in self.batches if i.live]
        self.result.pending = len(live)
        self.result.in_progress = sum(1 for i in live if i.batch_id is not None)
        if self.progress is not None:
            self.progress(self.result)

    # --- submit ---------------------------------------------------------------------

    def _eligible(self, dataset: str, items: Mapping[str, Prompt]) -> list[Prompt]:
        live = self.batches.live_ids(dataset)
        attempts = self._attempts(dataset)
        eligible = [
            p
            for pid, p in items.items()
            if pid not in live
            and not self.journal.is_done(dataset, pid)
            and attempts.get(pid, 0) < self.max_attempts
        ]
        return eligible[: self._room(dataset, len(live))]

    def _attempts(self, dataset: str) -> dict[str, int]:
        """How many batches each prompt of ``dataset`` went out in."""
        attempts: dict[str, int] = {}
        for intent in self.batches:
            # Only batches OpenRouter took count (not refused or never created).
            if intent.dataset == dataset and intent.batch_id is not None:
                for pid in intent.prompt_ids:
                    attempts[pid] = attempts.get(pid, 0) + 1
        return attempts

    def _room(self, dataset: str, live: int) -> int:
        """How many more lines the dataset's target and request cap allow now."""
        target, cap = self.limits.get(dataset, (None, None))
        tally = self.journal.tally(dataset)
        max_tokens = int(self.body.params(dataset)["max_tokens"])
        return wave_room(target, cap, tally.completed, tally.output_tokens, max_tokens, live)

    async def _submit_all(self, prompts: Mapping[str, Mapping[str, Prompt]]) -> bool:
        sent = False
        for dataset, items in prompts.items():
            todo = self._eligible(dataset, items)
            while todo and self.result.stop is None:
                chunk = self.body.chunk(dataset, todo)
                todo = todo[len(chunk) :]
                sent |= await self._submit(dataset, chunk)
        return sent

    async def _reserve(self, dataset: str, chunk: list[Prompt]) -> tuple[list[Prompt], Reservation]:
        worst = [self.body.worst(dataset, p) for p in chunk]
        state = await self.ledger.snapshot()
        room = state.available
        total = sum(worst, Decimal(0))
        wanted = len(chunk)
        while chunk and total > room:
            # Take what fits: the budget is never exceeded, and the rest waits.
            total -= worst.pop()
            chunk = chunk[: len(worst)]
        if not chunk:
            raise _NoRoom(f"the ${room} left cannot hold even one batch line's worst case")
        reservation = await self.ledger.reserve(total, key=f"batch:{dataset}")
        if len(chunk) < wanted:
            self.result.stopped_by = "budget"
            self.result.stop = (
                f"the budget is spent: it held the worst case of {len(chunk)} of the "
                f"{wanted} lines of the last batch"
            )
        return chunk, reservation

    async def _submit(self, dataset: str, chunk: list[Prompt]) -> bool:
        try:
            chunk, reservation = await self._reserve(dataset, chunk)
        except (BudgetExhausted, _NoRoom) as exc:
            self.result.stopped_by = "budget"
            self.result.stop = f"the budget is spent: {exc}"
            return False
        intent_id = "b" + uuid.uuid4().hex[:12]
        created_after = int(self.clock()) - 1
        held = {
            "id": reservation.id,
            "units": reservation.units,
            "key": reservation.key,
            "owner": reservation.owner,
        }
        intent = self.batches.record_intent(
            intent_id, dataset, [p.id for p in chunk], created_after, held, reservation.units
        )
        self._reservations[intent_id] = reservation
        lines = [self.body.line(dataset, intent_id, n, p) for n, p in enumerate(chunk)]
        try:
            batch = await self.api.submit(self.route.model_id, lines, self.route.provider_object())
        except APIConnectionError as exc:
            if not exc.request_sent:
                # Provably never reached OpenRouter: nothing can have been created or billed.
                await self._close_money(intent, Decimal(0))
                self.batches.record_ended(intent.intent, "not_sent")
                self._unsent += 1
                if self._unsent >= MAX_UNSENT_SUBMITS:
                    self.result.stopped_by = "error"
                    self.result.stop = (
                        f"OpenRouter could not be reached: {self._unsent} submits in a row "
                        f"never left ({exc}); nothing of them was sent or billed"
                    )
                return False
            return await self._submit_failed(intent, exc)
        except APIStatusError as exc:
            return await self._submit_failed(intent, exc)
        self.batches.record_submitted(intent_id, str(batch["id"]))
        self.result.submitted += 1
        self._unsent = 0
        log.info("batch.submitted", dataset=dataset, batch=batch["id"], lines=len(chunk))
        return True

    async def _submit_failed(self, intent: BatchIntent, exc: Exception) -> bool:
        definite = isinstance(exc, APIStatusError) and exc.status in (
            400,
            401,
            402,
            403,
            404,
            413,
            422,
        )
        if not definite:
            # Unknown: it may have been created. Its prompts wait for _resolve_lost.
            self.result.events.append(
                f"submit of {intent.intent} got no answer ({exc}): its "
                f"{len(intent.prompt_ids)} prompts wait for its batch to be listed, or "
                f"{self.lost_grace:g} s with none listed, before they go again"
            )
            return False
        await self._close_money(intent, Decimal(0))
        self.batches.record_ended(intent.intent, "refused")
        if isinstance(exc, PaymentRequiredError):
            self.result.stopped_by = "credits"
            self.result.stop = f"OpenRouter refused the batch for credits: {exc}"
            return False
        assert isinstance(exc, APIStatusError)
        raise ConfigurationError(f"OpenRouter refused the batch ({exc.status}): {exc}") from exc

    # --- lost 202s ------------------------------------------------------------------

    async def _resolve_lost(self) -> None:
        for intent in [i for i in self.batches if i.live and i.batch_id is None]:
            try:
                search = await find_lost(
                    self.api, self.batches, intent, self.body.line_bytes(intent.dataset)
                )
            except _TRANSIENT:
                continue  # look again next round
            if search.owed is not None:
                await self._owed(search.owed)
            if search.batch_id is not None:
                self.batches.record_submitted(intent.intent, search.batch_id)
                self.result.found_after_lost_202 += 1
            elif not search.undecided and self._grace_over(intent):
                # Listed nowhere once every batch the submit could have made has ended:
                # it made none. If an expired batch that shows no custom_ids might be
                # it, its worst case stays counted (an expired batch's bill is unknown).
                cost = from_units(intent.worst_units) if search.expired else Decimal(0)
                await self._close_money(intent, cost)
                self.batches.record_ended(intent.intent, "not_created")
                self.result.resubmitted_lines += len(intent.prompt_ids)

    def _grace_over(self, intent: BatchIntent) -> bool:
        """Whether ``lost_grace`` has passed since the intent (taken before its submit):
        from then on, any batch the submit made has ended and is listed."""
        return bool(self.clock() - intent.created_after >= self.lost_grace)

    # --- poll and collect -----------------------------------------------------------

    async def _poll_all(self, prompts: Mapping[str, Mapping[str, Prompt]]) -> bool:
        live = [i for i in self.batches if i.live and i.batch_id is not None]
        try:
            listed = await listed_statuses(self.api, live)
        except _TRANSIENT as exc:
            self.result.events.append(f"the batch list: {exc}; polled again later")
            return False
        progressed = False
        for intent in live:
            assert intent.batch_id is not None
            try:
                batch = listed.get(intent.batch_id) or await self._get(intent)
                if batch is None:
                    continue
                status = batch.get("status")
                if status == "completed":
                    progressed |= await self._collect(
                        intent, prompts.get(intent.dataset, {}), batch
                    )
            except PaymentRequiredError as exc:
                await self._owed(exc)
                continue
            except _TRANSIENT as exc:
                self.result.events.append(f"batch {intent.batch_id}: {exc}; polled again later")
                continue
            if status == "failed":
                await self._close_money(intent, self._failed_cost(intent, batch))
                self.batches.record_ended(intent.intent, "failed")
                progressed = True
            elif status in ("expired", "cancelled"):
                # Nothing says what it cost (a cancelled batch still ran and was billed):
                # count its worst case.
                await self._close_money(intent, from_units(intent.worst_units))
                self.batches.record_ended(intent.intent, str(status))
                progressed = True
        return progressed

    async def _get(self, intent: BatchIntent) -> dict[str, Any] | None:
        """A batch the list does not show (yet), by id (None: a 404 to wait out)."""
        assert intent.batch_id is not None
        try:
            return await self.api.get(intent.batch_id, max_bytes=self.body.batch_bytes(intent))
        except NotFoundError:
            now = self.clock()
            first = self._missing.setdefault(intent.intent, now)
            if min(now - intent.created_after, now - first) < self.missing_grace:
                return None  # a fresh batch may answer 404 a moment (or a blip)
            # Deleted, or not this key's: it may still run and bill, so its worst
            # case stays held and its prompts are not sent again; the run stops.
            self.result.stopped_by = "error"
            self.result.stop = (
                f"batch {intent.batch_id} answers 404 {self.missing_grace:g} s after its "
                "submit (deleted, or submitted with another key?): its worst case "
                "stays held and its prompts are not sent again"
            )
            self._halt = True
            return None

    def _failed_cost(self, intent: BatchIntent, batch: Mapping[str, Any]) -> Decimal:
        cost, done = failed_batch_cost(batch, from_units(intent.worst_units))
        if done:
            self.result.events.append(
                f"batch {intent.batch_id} failed after {done} lines, with no cost: its "
                "worst case is booked"
            )
        return cost

    async def _owed(self, exc: PaymentRequiredError) -> None:
        self._halt = True
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

    async def _collect(
        self, intent: BatchIntent, prompts: Mapping[str, Prompt], batch: Mapping[str, Any]
    ) -> bool:
        """Read a completed batch's results page by page (each line once), then settle it
        from ``batch`` (its list item: the status, counts and ``usage`` without results).
        A collect cut short (a blip, a 402) goes on from its cursor on the next poll."""
        assert intent.batch_id is not None
        state = self._collecting.setdefault(intent.intent, _Collecting())
        line_bytes = self.body.line_bytes(intent.dataset)
        page_lines = max(1, min(RESULTS_PAGE_LINES, RESULTS_PAGE_BYTES // line_bytes))
        while not state.done:
            try:
                page = await self.api.results_page(
                    intent.batch_id,
                    state.cursor,
                    limit=page_lines,
                    max_bytes=page_lines * line_bytes,
                )
            except PaymentRequiredError as exc:
                await self._owed(exc)
                return False
            except APIStatusError as exc:
                if exc.status != 409:
                    raise
                return False  # completed, its results not written yet: the next poll
            fresh = 0
            for result in page.get("data") or []:
                line = read_result(intent, result)
                if line is None or line.prompt_id in state.seen:
                    continue  # not this batch's line, or listed again: counted once
                state.seen.add(line.prompt_id)
                fresh += 1
                state.lines_cost += self._write_line(intent, line, prompts, state.failed)
            self.journal.flush()  # a page's outputs committed before the next is asked for
            cursor = page.get("next_cursor")
            if (
                not page.get("has_more")
                or cursor is None
                or len(state.seen) == len(intent.prompt_ids)
            ):
                state.done = True  # the last page, or every line is in (a batch has no more)
            elif not fresh:
                # Each page must bring a line not seen before: else it is read forever.
                raise InvalidResponseError(
                    f"GET /batches/{intent.batch_id}/results: a page of no new line and "
                    f"has_more ({len(state.seen)} of {len(intent.prompt_ids)} lines read); "
                    "the batch stays held and is collected again on the next run"
                )
            else:
                state.cursor = str(cursor)
        del self._collecting[intent.intent]
        lines_cost, failed = state.lines_cost, state.failed
        usage = batch.get("usage")
        reported = read_cost(usage.get("cost") if isinstance(usage, Mapping) else None)
        if reported is None:
            reported = Decimal(0)  # the lines' sum stands (each unknown one at its worst)
        if reported > 2 * from_units(intent.worst_units):
            self._dispute(
                f"batch {intent.batch_id}: usage.cost ${reported} is more than twice its "
                f"worst case ${from_units(intent.worst_units)}; its lines' ${lines_cost} "
                "are booked"
            )
            reported = lines_cost
        if abs(reported - lines_cost) > Decimal("1e-9") * max(1, len(intent.prompt_ids)):
            self.result.events.append(
                f"batch {intent.batch_id}: usage.cost ${reported} differs from its lines' "
                f"${lines_cost}; the larger is booked"
            )
        cost = max(reported, lines_cost)
        await self._close_money(intent, cost)
        self.batches.record_collected(intent.intent, to_units(cost), failed)
        self.result.collected += 1
        self.result.cost += cost
        self.result.lines_failed += len(failed)
        return True

    def _dispute(self, note: str) -> None:
        self.result.events.append(note)
        self.result.stopped_by = "error"
        self.result.stop = (
            f"disputed cost: {note}; no more batches are sent: check it at "
            "https://openrouter.ai/activity"
        )

    def _write_line(
        self,
        intent: BatchIntent,
        line: ResultLine,
        prompts: Mapping[str, Prompt],
        failed: list[str],
    ) -> Decimal:
        if line.body is None:
            failed.append(line.prompt_id)
            return Decimal(0)
        prompt = prompts.get(line.prompt_id)
        n = len(intent.prompt_ids)
        worst = (
            self.body.worst(intent.dataset, prompt)
            if prompt is not None
            else from_units(-(-intent.worst_units // n))
        )
        cost = line.cost
        if cost is None or cost > 2 * worst:
            # Unknown is not free, and an absurd bill is not taken on one answer's word:
            # the line's worst case is booked (a disputed one stops the run).
            said = "has no readable cost" if cost is None else f"says it cost ${cost}"
            note = (
                f"batch {intent.batch_id}: line {line.prompt_id} {said}; booked at its "
                f"worst case ${worst}"
            )
            if cost is None:
                self.result.events.append(note)
            else:
                self._dispute(note)
            cost = worst
        if prompt is None:
            # Paid, and never thrown away: kept beside the outputs, once, and counted.
            if not self.journal.is_done(intent.dataset, line.prompt_id) and self.unmatched.keep(
                intent, line, cost
            ):
                self.result.not_in_inputs += 1
            return cost
        if not self.journal.claim(intent.dataset, line.prompt_id):
            return cost  # already written (a collect cut short)
        tools = {**prompt.request_fields, **self.body.params(intent.dataset)}.get("tools")
        record = result_record(
            line, intent, prompt, self.route.model_id, float(self.clock()), cost, tools
        )
        self.journal.complete(
            intent.dataset,
            line.prompt_id,
            record,
            output_tokens=line.completion_tokens,
            prompt_tokens=line.prompt_tokens,
            cost_units=to_units(cost),
            location=prompt.location,
        )
        self.result.lines_done += 1
        return cost

    # --- money ----------------------------------------------------------------------

    async def _close_money(self, intent: BatchIntent, cost: Decimal) -> None:
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
