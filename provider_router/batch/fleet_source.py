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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Self

import structlog

from provider_router.batch.fleet import FleetProgress, FleetQueue, FleetTally, WorkItem
from provider_router.batch.journal import DatasetTally, FileJournal
from provider_router.batch.plan import Plan
from provider_router.ledger import CostResolver, Ledger

__all__ = ["FleetJournal", "FleetSource"]

log = structlog.get_logger(__name__)

_POLL_SECONDS = 0.5
_MAX_ATTEMPTS = 3


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
        return self.local.claim(dataset, prompt_id)

    def attach(self, dataset: str, prompt_id: str, generation_id: str) -> None:
        self.local.attach(dataset, prompt_id, generation_id)

    def complete(self, dataset: str, prompt_id: str, record: bytes, **details: Any) -> None:
        """Commit to the local journal (``details`` as :meth:`FileJournal.complete` takes)."""
        self.local.complete(dataset, prompt_id, record, **details)
        self._source._completed(
            dataset,
            prompt_id,
            (
                1,
                int(details.get("output_tokens", 0)),
                int(details.get("prompt_tokens", 0)),
                int(details.get("cost_units", 0)),
            ),
        )

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


class FleetSource:
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
    ) -> None:
        self.queue = queue
        self.plan = plan
        self.journal = FleetJournal(journal, self)
        self.prefetch = max(1, prefetch)
        self.strict = strict
        self.ledger = ledger
        self.resolve = resolve
        self.progress = FleetProgress()
        """The fleet's progress as of the last refresh (every heartbeat)."""
        self._buffer: collections.deque[WorkItem] = collections.deque()
        self._held: dict[tuple[str, str], WorkItem] = {}
        self._unflushed: list[tuple[WorkItem, int, int, int]] = []
        self._local: dict[str, list[int]] = {}
        self._excluded: set[str] = set()
        self._acks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._closing = asyncio.Event()
        self._maintenance: asyncio.Task[None] | None = None
        self.reclaimed = 0
        """Prompts of dead workers this worker took over."""
        self.duplicates = 0
        """Results of this worker that another worker had already completed."""

    # --- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Join the fleet and start the heartbeat."""
        await self.queue.join(self.plan, strict=self.strict)
        await self.refresh()
        self._maintenance = asyncio.create_task(self._maintain_forever())

    def stop(self) -> None:
        """Take no more prompts: iteration ends; unsent ones are given back on close."""
        self._stopping.set()

    def exclude(self, dataset: str) -> None:
        """Claim no more prompts of ``dataset`` (its target is reached)."""
        self._excluded.add(dataset)

    async def close(self) -> None:
        """Give back unsent prompts, send the last acknowledgements, stop the heartbeat."""
        self._stopping.set()
        self._closing.set()
        if self._maintenance is not None:
            await self._maintenance
        self.journal.flush()
        if self._acks:
            await asyncio.gather(*self._acks)
        unsent = list(self._buffer)
        self._buffer.clear()
        if unsent:
            await self.queue.give_back(unsent)
            for item in unsent:
                self._held.pop((item.dataset, item.prompt.id), None)
            log.info("fleet.gave_back", worker=self.queue.worker, prompts=len(unsent))

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- the work ------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[WorkItem]:
        return self._items()

    async def _items(self) -> AsyncIterator[WorkItem]:
        while not self._stopping.is_set():
            if not self._buffer:
                await self._fill()
                if not self._buffer:
                    if self._finished():
                        return
                    continue
            item = self._buffer.popleft()
            if item.dataset in self._excluded:
                await self.queue.give_back([item])
                continue
            self._held[(item.dataset, item.prompt.id)] = item
            yield item

    async def _fill(self) -> None:
        wanted = [d for d in self.queue.datasets if d not in self._excluded]
        if not wanted:
            return
        items = await self.queue.claim(self.prefetch, datasets=wanted, block=_POLL_SECONDS)
        self._buffer.extend(items)
        if not items:
            await self.refresh()

    def _finished(self) -> bool:
        wanted = [d for d in self.queue.datasets if d not in self._excluded]
        if not wanted:
            return True
        tallies = self.progress.datasets
        return self.progress.loaded and all(
            tallies[d].queued + tallies[d].in_flight == 0 for d in wanted if d in tallies
        )

    async def _maintain_forever(self) -> None:
        interval = self.queue.idle_timeout / 3
        while not self._closing.is_set():
            # An event, not task.cancel(): a cancellation landing inside the
            # ledger's recovery or the router's cost lookup could be swallowed there.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), interval)
                return
            try:
                found = await self.queue.maintain()
                if self.ledger is not None:
                    await self.ledger.recover(self.resolve)
                await self.refresh()
            except Exception as exc:  # a Redis hiccup: try again at the next beat
                log.warning("fleet.maintain_failed", error=repr(exc))
                continue
            if found:
                self.reclaimed += len(found)
                self._buffer.extendleft(reversed(found))

    async def refresh(self) -> FleetProgress:
        """Read the fleet's progress now."""
        self.progress = await self.queue.progress()
        self._local = {}
        return self.progress

    def tally(self, dataset: str) -> DatasetTally:
        """The fleet's tally of ``dataset``, with this worker's latest completions added."""
        fleet = self.progress.datasets.get(dataset, FleetTally())
        mine = self._local.get(dataset, [0, 0, 0, 0])
        return DatasetTally(
            completed=fleet.completed + mine[0],
            output_tokens=fleet.output_tokens + mine[1],
            prompt_tokens=fleet.prompt_tokens + mine[2],
            cost_units=fleet.cost_units + mine[3],
            failed=fleet.parked,
        )

    # --- callbacks from the journal ---------------------------------------------------------

    def _completed(self, dataset: str, prompt_id: str, counts: tuple[int, int, int, int]) -> None:
        item = self._held.pop((dataset, prompt_id), None)
        if item is None:
            return  # not a fleet prompt (nothing to acknowledge)
        self._unflushed.append((item, *counts[1:]))
        mine = self._local.setdefault(dataset, [0, 0, 0, 0])
        for index, value in enumerate(counts):
            mine[index] += value

    def _failed(self, dataset: str, prompt_id: str) -> None:
        item = self._held.pop((dataset, prompt_id), None)
        if item is not None:
            # A prompt that fails because this worker is stopping is not its fault.
            park = item.attempts + 1 >= _MAX_ATTEMPTS and not self._stopping.is_set()
            self._spawn(self._give_back(item, park))

    async def _give_back(self, item: WorkItem, park: bool) -> None:
        await self.queue.give_back([item], park=park)

    def _committed(self) -> None:
        if self._unflushed:
            batch, self._unflushed = self._unflushed, []
            self._spawn(self._ack(batch))

    async def _ack(self, batch: list[tuple[WorkItem, int, int, int]]) -> None:
        flags = await self.queue.complete(batch)
        self.duplicates += flags.count(False)

    def _spawn(self, coro: collections.abc.Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)
