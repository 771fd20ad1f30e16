"""The runner's batch route: datasets through OpenRouter's Batch API, within the budget,
each prompt's result written exactly once, across kills and resumes.

:class:`BatchRouteRun` splits each dataset's remaining prompts into batches and, for
each, reserves its worst case in the job's ledger (what does not fit is not sent),
journals the intent and fsyncs it *before* submitting, journals the batch id after
the 202, polls until the batch ends, and collects its results; a 402 on results stops
the run saying how much to add. An intent without a batch id (a kill, an answer lost
on the wire) keeps its worst case held and its prompts unsent until its batch is found
or ``lost_grace`` has passed: sooner could pay twice. Failed and expired batches'
prompts run again (docs/batch.md). This module runs the rounds, polls and resolves
lost 202s; the steps live beside it: :mod:`.submit`, :mod:`.collect`, :mod:`.money`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from provider_router._exceptions import (
    APIConnectionError,
    DataFileError,
    InvalidResponseError,
    NotFoundError,
    PaymentRequiredError,
    ProviderUnavailableError,
    RateLimitError,
)
from provider_router._log import get_logger
from provider_router._money import from_units
from provider_router.jobs.batch_api._parts import RouteParts
from provider_router.jobs.batch_api.api import BatchApi
from provider_router.jobs.batch_api.body import MAX_BATCH_REQUESTS, BatchBody
from provider_router.jobs.batch_api.collect import BatchCollector, Quarantine
from provider_router.jobs.batch_api.journal import BatchIntent, BatchJournal
from provider_router.jobs.batch_api.lost import (
    CLOCK_SKEW_SECONDS,
    LIST_LAG_SECONDS,
    LOST_GRACE_SECONDS,
    find_lost,
)
from provider_router.jobs.batch_api.money import BatchMoney
from provider_router.jobs.batch_api.quarantine import QuarantinedAnswers
from provider_router.jobs.batch_api.result import BatchRouteResult
from provider_router.jobs.batch_api.results import failed_batch_cost
from provider_router.jobs.batch_api.reuse import reuse_kept
from provider_router.jobs.batch_api.submit import BatchSubmitter
from provider_router.jobs.batch_api.unmatched import UnmatchedAnswers
from provider_router.jobs.store.journal import FileJournal
from provider_router.ledger import Ledger
from provider_router.planning.prompts import Prompt
from provider_router.routing.batch_endpoints import BatchRoute

__all__ = [
    "FRESH_404_SECONDS",
    "MISSING_PROBES",
    "BatchRouteResult",
    "BatchRouteRun",
    "listed_statuses",
]


async def listed_statuses(
    api: BatchApi, intents: Iterable[BatchIntent]
) -> dict[str, dict[str, Any]]:
    """The list's item (status, counts, usage; no results) of each intent's batch that
    the list shows, by batch id; walks no further than the oldest one asked for."""
    wanted = {i.batch_id: i for i in intents if i.batch_id is not None}
    found: dict[str, dict[str, Any]] = {}
    if not wanted:
        return found
    since = max(0, min(i.created_after for i in wanted.values()) - CLOCK_SKEW_SECONDS)
    after: str | None = None
    asked: set[str] = set()
    while True:
        page = await api.list_page(since, after)
        for item in page.get("data") or []:
            batch_id = item.get("id") if isinstance(item, dict) else None
            if batch_id in wanted:
                found[str(batch_id)] = item
        if len(found) == len(wanted) or not page.get("has_more") or not page.get("last_id"):
            return found
        after = str(page["last_id"])
        if after in asked:
            raise InvalidResponseError(
                f"GET /batches: the list's pages repeat (last_id {after!r} again); the "
                "batches stay held and are polled on the next run"
            )
        asked.add(after)


log = get_logger(__name__)

FRESH_404_SECONDS: Final = 900
"""How long after its submit a new batch's 404 means "not visible yet": a GET right
after the 202 may answer ``404 Batch job <id> not found.`` while OpenRouter publishes
it (its engineering notes; "a few seconds"), and no source bounds that lag."""
MISSING_PROBES: Final = 3
"""404s in a row, with no sighting between, before a batch seen before is vanished."""

_TRANSIENT = (APIConnectionError, ProviderUnavailableError, RateLimitError)
"""Errors a poll or collect waits out (tried again next round)."""


class BatchRouteRun:
    """Run datasets through the Batch API (see the module docstring).

    Args:
        api: the Batch API calls (on the run's HTTP client).
        ledger: the job's ledger (its limit is the budget).
        journal: the output journal of the job directory (exactly-once outputs).
        directory: where ``batches.jsonl`` lives.
        route: the pinned batch endpoint (:func:`~provider_router.planning.batch_route`).
        params: the request body's generation fields (``max_tokens`` required).
        clock / sleep: wall clock (Unix seconds) and sleep, injectable.
        poll_initial / poll_max: seconds between polls, doubling up to the max.
        lost_grace: seconds after an intent whose submit may have reached OpenRouter
            before "no such batch listed" means it was never created (default: the
            24 h window and the list's lag; sooner may pay twice).
        missing_grace: seconds a batch seen before may answer 404 (at least
            :data:`MISSING_PROBES` times, no sighting between) before the run stops.
        fresh_grace: seconds after its submit a batch not yet seen answers 404 as
            "not visible yet", never as vanished.
        max_attempts: batches a prompt may be sent in (a failed or expired batch's
            prompts go again, never beyond the budget).
        max_batch_requests: requests per batch (at most 5,000).
        dataset_params: a dataset's own generation fields, over ``params``.
        limits: per dataset, (output-token target, request cap): lines are sent in
            waves so that what is done plus what is in batches (at the observed
            tokens per line, ``max_tokens`` before any) stays within them.
        progress: called with the result so far after each round of polls (display
            only: an exception from it is logged once and the run goes on).
        accept_disputed: the operator checked the disputed bills on record (the
            dashboard) and their booked worst cases stand: batches are sent again.
        sync_after: datasets whose prompts left undone go on to the sync route
            (``route: auto``), as the sentences say.
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
        fresh_grace: float = FRESH_404_SECONDS,
        max_attempts: int = 2,
        max_batch_requests: int = MAX_BATCH_REQUESTS,
        dataset_params: Mapping[str, Mapping[str, Any]] | None = None,
        limits: Mapping[str, tuple[int | None, int | None]] | None = None,
        progress: Callable[[BatchRouteResult], None] | None = None,
        accept_disputed: bool = False,
        sync_after: Iterable[str] = (),
    ) -> None:
        self.body = BatchBody(route, params, dataset_params or {}, max_batch_requests)
        self.progress = progress
        self.accept_disputed = accept_disputed
        self.sync_after = frozenset(sync_after)
        self.api = api
        self.ledger = ledger
        self.journal = journal
        self.batches = BatchJournal.open(directory)
        self.route = route
        self.clock = clock
        self.sleep = sleep
        self.poll_initial = poll_initial
        self.poll_max = poll_max
        self.lost_grace = lost_grace
        self.missing_grace = missing_grace
        self.fresh_grace = fresh_grace
        self.max_attempts = max_attempts
        self.result = BatchRouteResult()
        self.money = BatchMoney(api, ledger, self.batches, self.result, journal)
        parts = RouteParts(api, self.body, journal, self.batches, self.money, self.result, clock)
        self.submitter = BatchSubmitter(
            parts,
            route=route,
            limits=dict(limits or {}),
            max_attempts=max_attempts,
        )
        self.kept = UnmatchedAnswers(directory)
        self.collector = BatchCollector(
            parts,
            unmatched=self.kept,
            model=route.model_id,
            quarantine=Quarantine(route, QuarantinedAnswers(directory)),
        )
        self._halt = False
        """A batch vanished (404 past the grace) this round: the run stops."""
        self._missing: dict[str, tuple[float, int]] = {}
        """Each batch's current 404 streak in this run: (its first 404, how many)."""
        self._seen: set[str] = set()
        """Intents whose batch this run has seen (listed, or answered by id)."""
        self._held: set[str] = set()
        """Lost 202s this run has said it holds."""
        self._progress_failed = False
        """The progress callback raised once this run (logged once; the run goes on)."""
        self.on_round: Callable[[], Awaitable[None]] | None = None
        """Awaited after each round of polls (the timeline's sample of the ledger)."""

    def close(self) -> None:
        self.batches.close()

    # --- the run ------------------------------------------------------------------

    async def run(self, datasets: Mapping[str, Sequence[Prompt]]) -> BatchRouteResult:
        """Submit, poll and collect until every prompt is done, or a stop."""
        prompts = {name: {p.id: p for p in items} for name, items in datasets.items()}
        self.journal.prepare(list(prompts))
        await self._check_journal()
        self._reuse_kept(prompts)
        # The holds of this job's live batches (a dead run's, in the job's ledger) are
        # taken back first: this run collects and settles each once, at what it cost.
        # A kill between a reserve and its intent left a hold nobody knows: the
        # recovery counts only such a hold, at its worst case (never below what may
        # have been spent).
        held = {str(i.reservation["id"]) for i in self.batches if i.live and not i.settled}
        await self.ledger.recover(keep=lambda res: res.id in held)
        self._check_disputes()
        delay = self.poll_initial
        while True:
            self._halt = self.money.withheld = False
            await self._resolve_lost()
            progressed = await self._poll_all(prompts)
            if self._halt or self.money.withheld:
                break  # a results 402 (a resume collects after the top-up), or a vanished batch
            if self.result.stop is None:
                progressed |= await self.submitter.submit_all(prompts)
            await self._report()
            retry = self.submitter.unsent and self.result.stop is None
            if not retry and not any(i.live for i in self.batches):
                break  # (a submit that never left goes again after the wait)
            delay = self.poll_initial if progressed else min(delay * 2, self.poll_max)
            await self.sleep(delay)
        await self._report()
        for name, items in prompts.items():
            attempts = self.submitter.attempts(name)
            left = sum(
                1
                for pid in items
                if attempts.get(pid, 0) >= self.max_attempts and not self.journal.is_done(name, pid)
            )
            if left:
                self.result.gave_up[name] = left
        self._say_refused()
        return self.result

    def _say_refused(self) -> None:
        """One sentence per dataset with lines never put in a batch, naming the first."""
        for name, refused in self.submitter.refused.items():
            left = [pid for pid in refused if not self.journal.is_done(name, pid)]
            if not left:
                continue
            self.result.refused[name] = len(left)
            then = (
                "they go to the sync route"
                if name in self.sync_after
                else "they are not sent (fix or remove them, then run again)"
            )
            self.result.events.append(
                f"{len(left)} prompts of {name} would fail a whole batch, so none was put in "
                f"one (the first: {refused[left[0]]}); {then}"
            )

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

    def _check_disputes(self) -> None:
        """A bill disputed before: the ledger may be below what was charged, so no batch
        is sent (live ones are still collected) until the operator says it was checked."""
        if self.batches.disputed is None:
            return
        if not self.accept_disputed:
            self.money.stop_disputed(self.batches.disputed)
            return
        for intent in self.batches:
            if intent.disputed is not None:
                self.batches.record_dispute_checked(intent.intent)
                self.result.events.append(
                    f"disputed bill accepted as checked (its booked worst case stands): "
                    f"{intent.disputed}"
                )

    def _reuse_kept(self, prompts: Mapping[str, Mapping[str, Prompt]]) -> None:
        """Prompts back in the inputs whose paid answers were kept aside are written from
        them, before any is sent (:mod:`.reuse`)."""
        for name, items in prompts.items():
            reused = reuse_kept(
                self.journal,
                self.kept,
                name,
                items.values(),
                model=self.route.model_id,
                clock=self.clock,
                params=self.body.params(name),
            )
            self.result.reused += reused.written
            self.result.events.extend(reused.sentences())

    async def _report(self) -> None:
        live = [i for i in self.batches if i.live]
        self.result.pending = len(live)
        self.result.in_progress = sum(1 for i in live if i.batch_id is not None)
        if self.progress is not None:
            try:
                self.progress(self.result)
            except Exception as exc:  # display only: a view that cannot be drawn ends no run
                if not self._progress_failed:
                    self._progress_failed = True
                    log.warning("batch.progress_failed", error=f"{type(exc).__name__}: {exc}")
        if self.on_round is not None:
            await self.on_round()

    # --- lost 202s ------------------------------------------------------------------

    async def _resolve_lost(self) -> None:
        for intent in [i for i in self.batches if i.live and i.batch_id is None]:
            try:
                search = await find_lost(self.api, self.batches, intent)
            except _TRANSIENT:
                continue  # look again next round
            if search.owed is not None:
                await self.money.owed(search.owed)
            if search.batch_id is not None:
                self.batches.record_submitted(intent.intent, search.batch_id)
                self.result.found_after_lost_202 += 1
            elif not self._grace_over(intent):
                self._held_note(intent)
            elif search.unreadable is not None:
                self._unreadable_stop(intent, search.unreadable)
            elif not search.undecided:
                # Listed nowhere once every batch the submit could have made has ended:
                # it made none. If a candidate that shows no custom_ids might be it and
                # may have been billed (expired, or failed after running lines), its
                # worst case stays counted.
                cost = from_units(intent.worst_units) if search.maybe_billed else Decimal(0)
                await self.money.close(intent, cost)
                self.batches.record_ended(intent.intent, "not_created")
                self.result.resubmitted_lines += len(intent.prompt_ids)

    def _held_note(self, intent: BatchIntent) -> None:
        """Say once a run why a lost 202's prompts wait, and until when at most."""
        if intent.intent in self._held:
            return
        self._held.add(intent.intent)
        until = datetime.fromtimestamp(intent.created_after + self.lost_grace, UTC)
        self.result.events.append(
            f"intent {intent.intent} ({len(intent.prompt_ids)} prompts of {intent.dataset}): "
            "its submit may have reached OpenRouter and no listed batch is known to be its "
            "yet; "
            f"its worst case stays held and its prompts wait (until {until:%Y-%m-%d %H:%M} "
            "UTC at most, unless its batch is listed)"
        )

    def _unreadable_stop(self, intent: BatchIntent, why: str) -> None:
        """Past the grace, a candidate that can never be checked: stop, saying which (its
        prompts are never sent again on a guess, and the run does not poll for ever)."""
        self.result.stopped_by = "error"
        self.result.stop = (
            f"intent {intent.intent} ({len(intent.prompt_ids)} prompts of {intent.dataset}): "
            f"its submit may have made batch {why}, so it cannot be told whether that batch "
            "is its own; its worst case stays held and its prompts are not sent again "
            "(check the batch at https://openrouter.ai/activity)"
        )
        self._halt = True

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
                batch = listed.get(intent.batch_id)
                if batch is not None:
                    self._seen_batch(intent)
                else:
                    batch = await self._get(intent)
                if batch is None:
                    continue
                status = batch.get("status")
                if status == "completed":
                    progressed |= await self.collector.collect(
                        intent, prompts.get(intent.dataset, {}), batch
                    )
            except PaymentRequiredError as exc:
                await self.money.owed(exc)
                continue
            except _TRANSIENT as exc:
                self.result.events.append(f"batch {intent.batch_id}: {exc}; polled again later")
                continue
            if status == "failed":
                await self.money.close(intent, self._failed_cost(intent, batch))
                self.batches.record_ended(intent.intent, "failed")
                progressed = True
            elif status in ("expired", "cancelled"):
                # Nothing says what it cost (a cancelled batch still ran and was billed):
                # count its worst case.
                await self.money.close(intent, from_units(intent.worst_units))
                self.batches.record_ended(intent.intent, str(status))
                progressed = True
        return progressed

    async def _get(self, intent: BatchIntent) -> dict[str, Any] | None:
        """A batch the list does not show (yet), by id (None: a 404 to wait out)."""
        assert intent.batch_id is not None
        try:
            batch = await self.api.get(intent.batch_id, max_bytes=self.body.batch_bytes(intent))
        except NotFoundError:
            self._not_found(intent)
            return None
        self._seen_batch(intent)
        return batch

    def _seen_batch(self, intent: BatchIntent) -> None:
        """The batch answered: a 404 streak of it is over."""
        self._seen.add(intent.intent)
        self._missing.pop(intent.intent, None)

    def _not_found(self, intent: BatchIntent) -> None:
        """A 404 of a batch id OpenRouter gave us: not visible yet, a blip, or gone.

        A batch not seen since its 202 is *not yet visible* for ``fresh_grace`` seconds
        (OpenRouter publishes a new batch to what GET reads a moment after it answers
        the 202): it is polled again with the run's backoff, never taken as vanished.
        Otherwise only a streak of :data:`MISSING_PROBES` 404s over ``missing_grace``
        seconds with no sighting between is; one sighting ends the streak."""
        now = self.clock()
        first, probes = self._missing.get(intent.intent, (now, 0))
        self._missing[intent.intent] = (first, probes + 1)
        fresh = intent.intent not in self._seen and now - intent.created_after < self.fresh_grace
        if fresh or probes + 1 < MISSING_PROBES or now - first < self.missing_grace:
            return
        # Deleted, or not this key's: it may still run and bill, so its worst
        # case stays held and its prompts are not sent again; the run stops.
        assert intent.batch_id is not None
        self.result.stopped_by = "error"
        self.result.stop = (
            f"batch {intent.batch_id} answers 404 {probes + 1} times over {now - first:g} s "
            f"({now - intent.created_after:g} s after its submit: deleted, or submitted "
            "with another key?): its worst case stays held and its prompts are not sent "
            "again"
        )
        self._halt = True

    def _failed_cost(self, intent: BatchIntent, batch: Mapping[str, Any]) -> Decimal:
        worst = from_units(intent.worst_units)
        cost, done = failed_batch_cost(batch, worst)
        if done:
            self.result.events.append(
                f"batch {intent.batch_id} failed after {done} lines, with no cost: its "
                "worst case is booked"
            )
        return self.money.checked(intent, "failed, its usage.cost", cost, worst)
