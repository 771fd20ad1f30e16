"""The batch route watched while it runs: what OpenRouter says of each batch, kept for the
views, and the live lines and metrics of a run (:func:`provider_router.jobs.run_plan`).

:class:`BatchWatch` taps the route's Batch API calls (:meth:`BatchWatch.api` makes the
:class:`~provider_router.jobs.batch_api.api.BatchApi` the route is given): each batch object
a submit, a get or a page of the batch list returns (this job's only), and the
metadata of a results 402, is a
:class:`~provider_router.jobs.observe.batch_view.Sighting`. After each round of polls
:meth:`BatchWatch.update` reads what the route appended to its journal, writes
``DIR/batch_status.json`` (atomically; display only: a failed write costs the views
their detail, never the run its work) and returns the
:class:`~provider_router.jobs.observe.batch_view.BatchView` every view shows.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from provider_router._exceptions import PaymentRequiredError
from provider_router._http.session import HttpClient
from provider_router._log import get_logger
from provider_router.client.metrics import Metrics
from provider_router.jobs.batch_api.api import BatchApi
from provider_router.jobs.observe.batch_view import (
    BatchView,
    DatasetBatches,
    JournalReader,
    Sighting,
    build_view,
    read_sightings,
)
from provider_router.jobs.observe.batch_words import batch_sentences
from provider_router.jobs.store._layout import JobLayout

__all__ = ["BatchWatch", "WatchedBatchApi"]

log = get_logger(__name__)


class BatchWatch:
    """What the batch route of one job directory has seen (see the module docstring).

    Args:
        directory: the job directory (``batches.jsonl`` is read there, and
            ``batch_status.json`` written).
        pinned: the provider the route pins (named for batches OpenRouter has not named).
        clock: wall clock, Unix seconds.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        pinned: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self.clock = clock
        # What an earlier run saw stays: a resumed run's batches may not be polled again
        # (collected ones), and a killed one's last states are the best there is.
        self.sightings, earlier = read_sightings(self.directory)
        self.pinned = pinned or earlier
        self._journal = JournalReader(self.directory)
        self._dirty = True
        self._broken = False

    def api(self, http: HttpClient) -> BatchApi:
        """The route's Batch API calls, watched."""
        return WatchedBatchApi(http, self)

    def seen(self, batch: Mapping[str, Any], batch_id: str | None = None) -> None:
        """Note a batch object OpenRouter returned, as the batch ``batch_id`` asked for
        (default: the id it carries; ignored without one). Keyed by what was asked, the
        sightings stay as many as the job's batches whatever an answer says."""
        key = batch_id if batch_id is not None else batch.get("id")
        if isinstance(key, str) and key:
            self.sightings[key] = Sighting.of(batch, self.clock())
            self._dirty = True

    def listed(self, page: Mapping[str, Any]) -> None:
        """Note the items of a page of the batch list that are this job's batches (the
        list also shows the key's other batches: those are not kept)."""
        items = page.get("data")
        if not isinstance(items, list):
            return
        ours = {i.batch_id for i in self._journal.read().values()} | set(self.sightings)
        for item in items:
            if isinstance(item, Mapping) and item.get("id") in ours:
                self.seen(item)

    def view(self) -> BatchView:
        """The view now (reads only what the journal gained since the last call)."""
        intents = self._journal.read()
        problems = () if self._journal.problem is None else (self._journal.problem,)
        return build_view(intents.values(), self.sightings, pinned=self.pinned, problems=problems)

    def update(self) -> BatchView:
        """The view now, with ``batch_status.json`` written if something new was seen."""
        if self._dirty and not self._broken:
            self._save()
        return self.view()

    def _save(self) -> None:
        path = JobLayout(self.directory).batch_status
        tmp = path.with_name(path.name + ".tmp")
        document = {
            "written": round(self.clock(), 3),
            "pinned": self.pinned,
            "batches": {k: s.to_json() for k, s in self.sightings.items()},
        }
        try:
            tmp.write_text(json.dumps(document, separators=(",", ":")) + "\n", encoding="utf-8")
            tmp.replace(path)
            self._dirty = False
        except OSError as exc:
            self._broken = True
            with contextlib.suppress(OSError):
                tmp.unlink()
            log.warning("batch.status_write_failed", path=str(path), error=str(exc))

    def reporter(
        self, say: Callable[[str], None] | None, metrics: Metrics | None
    ) -> Callable[[object], None]:
        """A ``progress`` callback for the route: after each round, the sentences (each
        given to ``say``, when they changed) and the metrics (``metrics``), from one view."""
        shown: dict[str, DatasetBatches] = {}
        problems: list[str] = []

        def report(_result: object) -> None:
            view = self.update()
            now = self.clock()
            if metrics is not None:
                metrics.batch_view(view, now)
            if say is None:
                return
            # A dataset's line when its figures change (not the window's minutes left).
            changed = [d for d in view.datasets if shown.get(d.name) != d]
            shown.update((d.name, d) for d in changed)
            lines = batch_sentences(BatchView(tuple(changed)), now)
            if list(view.problems) != problems:
                problems[:] = view.problems
                lines += problems
            for line in lines:
                say(line)

        return report


class WatchedBatchApi(BatchApi):
    """A :class:`BatchApi` whose submits, gets, list pages (polls read the list) and
    results 402s a :class:`BatchWatch` sees."""

    def __init__(self, http: HttpClient, watch: BatchWatch) -> None:
        super().__init__(http)
        self.watch = watch

    async def submit(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        batch = await super().submit(*args, **kwargs)
        self.watch.seen(batch)
        return batch

    async def get(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        asked = _asked(args, kwargs)
        try:
            batch = await super().get(*args, **kwargs)
        except PaymentRequiredError as exc:
            self._withheld(exc, asked)
            raise
        if asked is not None:
            self.watch.seen(batch, asked)
        return batch

    async def list_page(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        page = await super().list_page(*args, **kwargs)
        self.watch.listed(page)
        return page

    async def results_page(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return await super().results_page(*args, **kwargs)
        except PaymentRequiredError as exc:
            self._withheld(exc, _asked(args, kwargs))
            raise

    def _withheld(self, exc: PaymentRequiredError, asked: str | None) -> None:
        # A results 402 carries the batch's metadata: completed, results withheld.
        if asked is not None and isinstance(exc.body, Mapping):
            self.watch.seen(exc.body, asked)


def _asked(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """The batch id a get or a results page asked for (its first argument)."""
    batch_id = args[0] if args else kwargs.get("batch_id")
    return batch_id if isinstance(batch_id, str) else None
