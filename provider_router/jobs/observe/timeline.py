"""The run's time series: one compact line per second in ``DIR/timeline.ndjson``.

The report and ``provider-router status`` read it; the run never does: a missing,
torn or unwritable timeline costs the charts their detail, never the run its work.
Each line is a snapshot of :meth:`JobRunner.progress` (fields in
docs/observability.md), with ``pid`` and ``host`` so ``status`` can tell a killed run
from a quiet one, ``to_finish`` as every view says it
(:mod:`provider_router.jobs.finish`) and ``projected`` (spent plus
``to_finish``). Money is exact decimal strings. A run writes a first line at its
start, one per ``interval`` seconds and a ``final`` one at its end; a resumed run
appends. :class:`TimelineObserver` writes it for a run that subscribes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, Final

import structlog

from provider_router.jobs.events import ObservedRun, RunObserver
from provider_router.jobs.snapshots import RunProgress
from provider_router.jobs.store._layout import JobLayout

__all__ = [
    "DEFAULT_INTERVAL",
    "TimelineObserver",
    "TimelineWriter",
    "read_timeline",
    "timeline_row",
]

log = structlog.get_logger(__name__)

DEFAULT_INTERVAL: Final = 1.0
"""Seconds between two lines (a day-long run writes ~86,400 short lines)."""


def _money(value: Decimal | None) -> str | None:
    return None if value is None else format(value, "f")


def timeline_row(
    progress: RunProgress, budget: Decimal, *, now: float, final: bool = False
) -> dict[str, Any]:
    """One timeline line from a progress snapshot."""
    state = progress.ledger
    datasets: dict[str, Any] = {}
    to_finish = progress.to_finish
    projected = None if state is None or to_finish is None else state.spent + to_finish
    completed = output_tokens = failures = truncated = 0
    truncated_cost = Decimal(0)
    for d in progress.datasets:
        completed += d.completed
        output_tokens += d.output_tokens
        failures += d.run.failures
        truncated += d.truncated
        truncated_cost += d.truncated_cost
        datasets[d.name] = {
            "completed": d.completed,
            "total": d.total,
            "output_tokens": d.output_tokens,
            "target": d.target_output_tokens,
            "in_flight": d.in_flight,
            "cost": _money(d.cost),
            "truncated": d.truncated,
            "truncated_cost": _money(d.truncated_cost),
            "finished": d.finished,
        }
    return {
        "t": round(now, 3),
        "elapsed": round(progress.elapsed, 3),
        "limit": _money(state.limit if state is not None else budget),
        "spent": _money(state.spent if state is not None else None),
        "reserved": _money(state.reserved if state is not None else None),
        "completed": completed,
        "output_tokens": output_tokens,
        "failures": failures,
        "truncated": truncated,
        "truncated_cost": _money(truncated_cost),
        "retries": progress.retries,
        "rate_limited": progress.rate_limited,
        "context_compressed": sum(d.run.compressed for d in progress.datasets),
        "errors": progress.errors,
        "in_flight": progress.in_flight,
        "waiting_for_budget": progress.waiting_for_budget,
        "projected": _money(projected),
        "to_finish": _money(to_finish),
        "datasets": datasets,
        "final": final,
    }


class TimelineWriter:
    """Appends the runner's progress to ``DIR/timeline.ndjson`` while it runs.

    Args:
        runner: the run (its :meth:`~provider_router.jobs.events.ObservedRun.progress`
            is sampled).
        path: the file (default ``<runner.out>/timeline.ndjson``).
        interval: seconds between lines.
        clock: wall-clock seconds (injected in tests).

    Writing never fails the run: the first error is logged and the timeline stops.
    """

    def __init__(
        self,
        runner: ObservedRun,
        path: Path | None = None,
        *,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.runner = runner
        self.path = path or JobLayout(runner.out).timeline
        self.interval = interval
        self._clock = clock
        self._file: IO[str] | None = None
        self._broken = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Write the first line and sample every ``interval`` seconds in the background."""
        self.write()
        self._task = asyncio.ensure_future(self._forever())

    async def stop(self) -> None:
        """Stop sampling and write the ``final`` line."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._refresh_ledger()
        self.write(final=True)
        self.close()

    def close(self) -> None:
        """Close the file (a later :meth:`write` opens it again)."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    async def sample(self) -> None:
        """Read the ledger and append a line now (between two ``interval`` lines)."""
        await self._refresh_ledger()
        self.write()

    async def _forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.sample()

    async def _refresh_ledger(self) -> None:
        ledger = self.runner.ledger
        if ledger is not None:
            with contextlib.suppress(Exception):  # a display figure, never worth failing for
                self.runner.ledger_state = await ledger.snapshot()

    def write(self, *, final: bool = False) -> None:
        """Append one line now (a no-op once writing has failed)."""
        if self._broken:
            return
        try:
            progress = self.runner.progress()
            row = timeline_row(progress, self.runner.budget, now=self._clock(), final=final)
            metrics = self.runner.metrics
            if metrics is not None:  # Prometheus shows what this line says
                if progress.ledger is not None:
                    metrics.ledger_state(progress.ledger)
                metrics.plan_to_finish(progress.to_finish)
            row["pid"] = os.getpid()
            row["host"] = socket.gethostname()
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
            self._file.flush()
        except OSError as exc:
            self._broken = True
            log.warning("timeline.write_failed", path=str(self.path), error=str(exc))


class TimelineObserver(RunObserver):
    """Writes a run's timeline: its first line at the start, one every ``interval``
    seconds and after each moment the run points out (a round of polls), the ``final``
    one when its last request has ended."""

    def __init__(self, interval: float | None = None) -> None:
        self.interval = DEFAULT_INTERVAL if interval is None else interval
        self._writer: TimelineWriter | None = None

    async def on_start(self, run: ObservedRun) -> None:
        self._writer = TimelineWriter(run, interval=self.interval)
        self._writer.start()

    async def on_progress(self, run: ObservedRun) -> None:
        if self._writer is not None:
            await self._writer.sample()

    async def on_dispatch_end(self, run: ObservedRun) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.stop()


def read_timeline(path: Path) -> Iterator[dict[str, Any]]:
    """The timeline's lines, skipping a torn or foreign one (the file may be being written)."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError:
        return
    with handle:
        for line in handle:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "t" in row:
                yield row
