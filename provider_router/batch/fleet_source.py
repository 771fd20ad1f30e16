"""A worker's side of a fleet: where its prompts come from and where results go.

:class:`FleetSource` is what a batch runner plugs in instead of reading the
input files itself: an async iterator of claimed :class:`~provider_router.batch.fleet.WorkItem`
plus a :class:`FleetJournal`, a :class:`~provider_router.batch.journal.Journal`
that writes to this worker's own :class:`~provider_router.batch.journal.FileJournal`
and acknowledges each result to the fleet only after the local journal has
committed it (``flush``). In the background it sends heartbeats, takes over the
prompts of dead workers, and keeps the fleet-wide progress fresh.

    queue = FleetQueue("redis://host:6379/0", "b3-run")
    async with FleetSource(queue, plan, journal=FileJournal.open(out_dir)) as source:
        async for item in source:          # WorkItem(dataset, prompt, ...)
            ...  # send; then source.journal.claim/complete/release as usual

Talking to Redis is bounded: one writer task sends every acknowledgement and
give-back (batched: whatever piled up while the last call ran goes in the
next), one heartbeat task, and the iterator's own claims, so a worker never
holds more than a few connections whatever its concurrency. A transient Redis
failure (a dropped connection, a timeout) is retried with exponential backoff
for up to ``retry_for`` seconds; past that, or on any other failure, the source
stops and the error is raised from the iteration (or from :meth:`FleetSource.close`),
never dropped: a worker fails loudly rather than hang. What it could not
acknowledge stays pending in Redis and goes to the other workers after their
idle timeout (merge keeps one copy of anything done twice).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from provider_router._log import get_logger
from provider_router._resource import AsyncResource
from provider_router._types import Sleep
from provider_router.batch.fleet import FleetQueue, describe_error, is_transient
from provider_router.batch.fleet_records import ClaimLimit, FleetProgress, FleetTally, WorkItem
from provider_router.batch.journal import DatasetTally, FileJournal
from provider_router.ledger import CostResolver, Ledger
from provider_router.plan import Plan, reached

__all__ = ["FleetJournal", "FleetSource"]

log = get_logger(__name__)

T = TypeVar("T")
_POLL_SECONDS = 0.5
_CAPPED_POLL_SECONDS = 0.02
"""How often a worker at a fleet-wide cap looks again (others' results make room)."""
_MAX_ATTEMPTS = 3
_BACKOFF_FIRST = 0.05
_BACKOFF_MAX = 2.0
_Counts = tuple[WorkItem, int, int, int]
"""A journaled result to acknowledge: (item, output tokens, prompt tokens, cost units)."""


class FleetJournal:
    """A :class:`~provider_router.batch.journal.Journal` for one worker of a fleet.

    Everything is written to the worker's own :class:`FileJournal` (its outputs
    are merged later by ``provider-router merge``); completions are acknowledged
    to the fleet after each :meth:`flush`, never before. :meth:`tally` is the
    fleet's, so dataset targets hold for the whole fleet.
    """

    def __init__(self, local: FileJournal, source: FleetSource) -> None:
        self.local = local
        self._source = source

    def is_done(self, dataset: str, prompt_id: str) -> bool:
        return self.local.is_done(dataset, prompt_id)

    def claim(self, dataset: str, prompt_id: str) -> bool:
        """Claim in the local journal; False if done or in flight here already.

        A prompt this worker completed in an earlier run (it died before
        acknowledging, and got the prompt back) is acknowledged to the fleet now.
        """
        if self.local.claim(dataset, prompt_id):
            return True
        if self.local.is_done(dataset, prompt_id):
            self._source._done_before(dataset, prompt_id)
        return False

    def attach(self, dataset: str, prompt_id: str, generation_id: str) -> None:
        self.local.attach(dataset, prompt_id, generation_id)

    def complete(
        self,
        dataset: str,
        prompt_id: str,
        record: bytes,
        *,
        output_tokens: int,
        prompt_tokens: int,
        cost_units: int,
        location: int | None = None,
    ) -> None:
        """Commit to the local journal; acknowledged to the fleet after the next flush."""
        self.local.complete(
            dataset,
            prompt_id,
            record,
            output_tokens=output_tokens,
            prompt_tokens=prompt_tokens,
            cost_units=cost_units,
            location=location,
        )
        self._source._completed(dataset, prompt_id, (output_tokens, prompt_tokens, cost_units))

    def release(self, dataset: str, prompt_id: str, *, reason: str) -> None:
        self.local.release(dataset, prompt_id, reason=reason)
        self._source._failed(dataset, prompt_id)

    def tally(self, dataset: str) -> DatasetTally:
        return self._source.tally(dataset)

    def flush(self) -> None:
        self.local.flush()
        self._source._committed()

    def close(self, reason: str = "closed") -> None:
        self.local.close(reason)

    def __getattr__(self, name: str) -> Any:
        # Everything else (done_ids, note, sync, lost, repairs...) is the local journal's.
        return getattr(self.local, name)


class FleetSource(AsyncResource):
    """Claims prompts from a :class:`FleetQueue` for one worker (see the module docstring).

    Args:
        queue: the fleet's queue (not yet joined).
        plan: the plan every worker of the fleet runs.
        journal: this worker's own journal (its own output directory).
        prefetch: prompts claimed ahead of sending (about the concurrency).
        strict: refuse to start if an input line is bad.
        ledger: the fleet's shared ledger; with it, every heartbeat also recovers
            the reservations of dead workers (once their lease ran out), so the
            money they held is counted and the rest of the fleet can spend on.
        resolve: asked for the real cost of a dead worker's request (the
            router's :meth:`~provider_router.Router.resolve`); unknown costs are
            counted at worst case.
        retry_for: seconds a transient Redis failure is retried (with backoff)
            before the source gives up (default: the queue's idle timeout, after
            which the other workers take this one's prompts anyway).
        sleep: the backoff's sleep (injected in tests).
    """

    def __init__(
        self,
        queue: FleetQueue,
        plan: Plan,
        *,
        journal: FileJournal,
        prefetch: int = 256,
        strict: bool = False,
        ledger: Ledger | None = None,
        resolve: CostResolver | None = None,
        retry_for: float | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.queue = queue
        self.plan = plan
        self.journal = FleetJournal(journal, self)
        self.prefetch = max(1, prefetch)
        self.strict = strict
        self.ledger = ledger
        self.resolve = resolve
        self.retry_for = queue.idle_timeout if retry_for is None else max(0.0, retry_for)
        self._sleep = sleep
        self.progress = FleetProgress()
        """The fleet's progress as of the last refresh (every heartbeat)."""
        self._buffer: collections.deque[WorkItem] = collections.deque()
        self._held: dict[tuple[str, str], WorkItem] = {}
        self._unflushed: list[_Counts] = []
        # This worker's completions (count, out, in, cost) per dataset: journaled, and
        # acknowledged; and how much of the latter each fleet view already included.
        self._journaled: dict[str, list[int]] = {}
        self._acked: dict[str, list[int]] = {}
        self._progress_base: dict[str, list[int]] = {}
        self._ack_base: dict[str, list[int]] = {}
        self._excluded: set[str] = set()
        self.limits: dict[str, ClaimLimit] = {}
        """Fleet-wide caps per dataset, checked by Redis at each claim (see :meth:`price`)."""
        for spec in plan.datasets:
            if spec.max_requests is not None or spec.target_output_tokens is not None:
                cap = int(plan.params_for(spec).request_params()["max_tokens"])
                self.limits[spec.name] = ClaimLimit(
                    spec.max_requests, spec.target_output_tokens, cap=cap
                )
        # The writer's outbox: acknowledgements, and give-backs as (item, park, failed).
        self._acks: list[_Counts] = []
        self._backs: list[tuple[WorkItem, bool, bool]] = []
        self._sending: list[WorkItem] = []
        self._outbox = asyncio.Event()
        self._drain = False
        self._stopping = asyncio.Event()
        self._closing = asyncio.Event()
        self._maintenance: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._raised = False
        self.reclaimed = 0
        """Prompts of dead workers this worker took over."""
        self.duplicates = 0
        """Results of this worker that another worker had already completed."""

    # --- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Join the fleet and start the heartbeat and the acknowledgement writer."""
        await self.queue.join(self.plan, strict=self.strict)
        await self._redis("progress", self.refresh)
        self._writer = asyncio.create_task(self._write_forever())
        self._maintenance = asyncio.create_task(self._maintain_forever())

    def stop(self) -> None:
        """Take no more prompts: iteration ends; unsent ones are given back on close."""
        self._stopping.set()

    def exclude(self, dataset: str) -> None:
        """Claim no more prompts of ``dataset`` (its target is reached)."""
        self._excluded.add(dataset)

    def price(self, dataset: str, terms: tuple[float, float] | None) -> None:
        """Price the fleet's claimed, unfinished prompts of ``dataset`` for its target.

        ``terms`` are the worker's in-flight pricer's
        (:meth:`~provider_router.batch.targets.InFlightPricer.terms`); ``None``
        prices each at its ``max_tokens``.
        """
        limit = self.limits.get(dataset)
        if limit is not None and limit.target_output_tokens is not None:
            mean, spread = terms if terms is not None else (None, 0.0)
            self.limits[dataset] = dataclasses.replace(limit, mean=mean, spread=spread)

    def put_back(self, item: WorkItem) -> None:
        """Return a yielded prompt unsent (no attempt counted); it goes back to the fleet."""
        self._held.pop((item.dataset, item.prompt.id), None)
        self._post_back(item, park=False, failed=False)

    @property
    def error(self) -> BaseException | None:
        """What made the source give up (a Redis failure), if anything did."""
        return self._error

    async def close(self) -> None:
        """Give back unsent prompts, send the last acknowledgements, stop the background.

        Raises:
            Exception: the failure that made the source give up, unless the
                iteration already raised it.
        """
        self._stopping.set()
        self._closing.set()
        if self._maintenance is not None:
            await self._maintenance  # never raises: failures are kept in `_error`
        self.journal.flush()
        unsent = list(self._buffer)
        self._buffer.clear()
        for item in unsent:
            self._post_back(item, park=False, failed=False)
        if unsent:
            log.info("fleet.gave_back", worker=self.queue.worker, prompts=len(unsent))
        self._drain = True
        self._outbox.set()
        if self._writer is not None:
            await self._writer  # drains the outbox, then ends (or has failed)
        if self._error is not None and not self._raised:
            self._raised = True
            raise self._error

    async def _on_enter(self) -> None:
        await self.start()

    async def _on_exit(self) -> None:
        await self.close()

    # --- Redis, carefully ------------------------------------------------------------------

    async def _redis(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run ``call``, retrying a transient failure with backoff for up to ``retry_for``."""
        delay = _BACKOFF_FIRST
        waited = 0.0
        while True:
            try:
                return await call()
            except Exception as exc:
                if not is_transient(exc) or waited >= self.retry_for:
                    raise
                log.warning(
                    "fleet.retry",
                    op=what,
                    worker=self.queue.worker,
                    error=describe_error(exc),
                    delay=delay,
                )
            await self._sleep(delay)
            waited += delay
            delay = min(delay * 2, _BACKOFF_MAX)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
            log.error("fleet.failed", worker=self.queue.worker, error=describe_error(exc))
        self._stopping.set()

    def _raise_if_failed(self) -> None:
        if self._error is not None and not self._raised:
            self._raised = True
            raise self._error

    # --- the work ------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[WorkItem]:
        return self._items()

    async def _items(self) -> AsyncIterator[WorkItem]:
        while True:
            self._raise_if_failed()
            if self._stopping.is_set():
                return
            if not self._buffer:
                try:
                    await self._fill()
                except Exception as exc:
                    self._fail(exc)
                    continue
                if not self._buffer:
                    if self._finished():
                        return
                    continue
            item = self._buffer.popleft()
            if item.dataset in self._excluded:
                self._post_back(item, park=False, failed=False)
                continue
            self._held[(item.dataset, item.prompt.id)] = item
            yield item

    async def _fill(self) -> None:
        wanted = [d for d in self.queue.datasets if d not in self._excluded]
        if not wanted:
            return
        limits = self.limits
        items = await self._redis(
            "claim",
            lambda: self.queue.claim(
                self.prefetch, datasets=wanted, block=_POLL_SECONDS, limits=limits
            ),
        )
        self._buffer.extend(items)
        if not items:
            await self._redis("progress", self.refresh)
            specs = {spec.name: spec for spec in self.plan.datasets}
            for dataset in wanted:
                tally = self.tally(dataset)
                if reached(specs[dataset], tally.completed, tally.output_tokens):
                    self.exclude(dataset)  # the fleet reached it: nothing more to claim
            if all(d in limits for d in wanted):
                await self._sleep(_CAPPED_POLL_SECONDS)  # no blocking read waited

    def _finished(self) -> bool:
        wanted = [d for d in self.queue.datasets if d not in self._excluded]
        if not wanted:
            return True
        tallies = self.progress.datasets
        return self.progress.loaded and all(
            tallies[d].queued + tallies[d].in_flight == 0 for d in wanted if d in tallies
        )

    def _holding(self) -> dict[str, list[str]]:
        """Every entry this worker must keep alive: buffered, sending, unacknowledged."""
        held: dict[str, list[str]] = {}
        items: list[WorkItem] = [*self._buffer, *self._held.values(), *self._sending]
        items += [entry[0] for entry in (*self._unflushed, *self._acks)]
        items += [entry[0] for entry in self._backs]
        for item in items:
            held.setdefault(item.dataset, []).append(item.entry_id)
        return held

    async def _maintain_forever(self) -> None:
        interval = self.queue.idle_timeout / 3
        try:
            while not self._closing.is_set():
                # An event, not task.cancel(): a cancellation landing inside the
                # ledger's recovery or the router's cost lookup could be swallowed there.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), interval)
                    return
                found = await self._redis(
                    "maintain", lambda: self.queue.maintain(holding=self._holding())
                )
                if found:
                    self.reclaimed += len(found)
                    self._buffer.extendleft(reversed(found))
                if self.ledger is not None:
                    await self._redis("ledger.recover", self._recover_money)
                await self._redis("progress", self.refresh)
        except Exception as exc:
            self._fail(exc)

    async def _recover_money(self) -> None:
        if self.ledger is not None:
            await self.ledger.recover(self.resolve)

    async def refresh(self) -> FleetProgress:
        """Read the fleet's progress now."""
        # What was acknowledged before the read is surely in it (later ones may be
        # too: counting them twice for a moment errs on the side of the targets).
        base = {dataset: list(counts) for dataset, counts in self._acked.items()}
        self.progress = await self.queue.progress()
        self._progress_base = base
        return self.progress

    def tally(self, dataset: str) -> DatasetTally:
        """The fleet's tally of ``dataset``: its freshest view plus what this worker added since.

        The view is the last progress read or the tally returned by this worker's
        last acknowledgement, whichever is newer.
        """
        zero = [0, 0, 0, 0]
        fleet = self.progress.datasets.get(dataset, FleetTally())
        view = (fleet.completed, fleet.output_tokens, fleet.prompt_tokens, fleet.cost_units)
        base = self._progress_base.get(dataset, zero)
        acked_view = self.queue.totals.get(dataset)
        if acked_view is not None and acked_view[0] > view[0]:
            view, base = acked_view, self._ack_base.get(dataset, zero)
        mine = self._journaled.get(dataset, zero)
        counts = [v + m - b for v, m, b in zip(view, mine, base, strict=True)]
        return DatasetTally(
            completed=counts[0],
            output_tokens=counts[1],
            prompt_tokens=counts[2],
            cost_units=counts[3],
            failed=fleet.parked,
        )

    @staticmethod
    def _add(totals: dict[str, list[int]], dataset: str, counts: tuple[int, ...]) -> None:
        mine = totals.setdefault(dataset, [0, 0, 0, 0])
        for index, value in enumerate(counts):
            mine[index] += value

    # --- the writer: acknowledgements and give-backs, one call at a time --------------------

    def _post_back(self, item: WorkItem, *, park: bool, failed: bool) -> None:
        self._backs.append((item, park, failed))
        self._outbox.set()

    async def _write_forever(self) -> None:
        try:
            while True:
                if not self._acks and not self._backs:
                    if self._drain:
                        return
                    self._outbox.clear()
                    await self._outbox.wait()
                    continue
                acks, self._acks = self._acks, []
                backs, self._backs = self._backs, []
                self._sending = [entry[0] for entry in acks] + [entry[0] for entry in backs]
                if acks:
                    await self._send_acks(acks)
                for park in (False, True):
                    for failed in (False, True):
                        group = [i for i, p, f in backs if p is park and f is failed]
                        if group:
                            await self._give_back(group, park=park, failed=failed)
                self._sending = []
        except Exception as exc:
            self._fail(exc)

    async def _give_back(self, items: list[WorkItem], *, park: bool, failed: bool) -> None:
        await self._redis(
            "give_back", lambda: self.queue.give_back(items, park=park, failed=failed)
        )

    async def _send_acks(self, acks: list[_Counts]) -> None:
        flags = await self._redis("complete", lambda: self.queue.complete(acks))
        self.duplicates += flags.count(False)
        for item, out, prompt_tokens, cost in acks:
            self._add(self._acked, item.dataset, (1, out, prompt_tokens, cost))
        for dataset in {item.dataset for item, *_ in acks}:
            # The script's tallies include exactly what this worker acknowledged so far.
            self._ack_base[dataset] = list(self._acked[dataset])

    # --- callbacks from the journal ---------------------------------------------------------

    def _completed(self, dataset: str, prompt_id: str, counts: tuple[int, int, int]) -> None:
        item = self._held.pop((dataset, prompt_id), None)
        if item is None:
            return  # not a fleet prompt (nothing to acknowledge)
        self._unflushed.append((item, *counts))
        self._add(self._journaled, dataset, (1, *counts))

    def _done_before(self, dataset: str, prompt_id: str) -> None:
        item = self._held.pop((dataset, prompt_id), None)
        if item is not None:
            # Its tokens and cost are in this worker's journal, not known here: the
            # fleet's tally misses them (merge still finds the record).
            self._acks.append((item, 0, 0, 0))
            self._add(self._journaled, dataset, (1, 0, 0, 0))
            self._outbox.set()

    def _failed(self, dataset: str, prompt_id: str) -> None:
        item = self._held.pop((dataset, prompt_id), None)
        if item is not None:
            # A prompt that fails because this worker is stopping is not its fault.
            stopping = self._stopping.is_set()
            park = item.attempts + 1 >= _MAX_ATTEMPTS and not stopping
            self._post_back(item, park=park, failed=not stopping)

    def _committed(self) -> None:
        if self._unflushed:
            self._acks += self._unflushed
            self._unflushed = []
            self._outbox.set()
