"""What a run tells those who watch it: the engine emits, observers subscribe.

A run (:class:`~provider_router.jobs.runner.JobRunner`, or the Batch API route of
:func:`~provider_router.jobs.batch_api_runner.run_plan_batches`) calls each of its
:class:`RunObserver` objects at a few moments of its life (start, progress, the end of
dispatch, the summary built, ``summary.json`` written), never per request. An observer
reads the run through :class:`ObservedRun`. A run has only the observers it is given:
what an operator sees (timeline, report, the Batch API route's datasets in the summary)
is :func:`~provider_router.jobs.observe.standard.standard_observers`, from above the
runner, which :func:`~provider_router.jobs.run.run_plan` passes. Watching must not fail
the run: each observer catches what it can.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Protocol

from provider_router.client.metrics import Metrics
from provider_router.jobs.snapshots import RunProgress
from provider_router.jobs.summary import RunSummary
from provider_router.ledger import Ledger, LedgerState

__all__ = ["ObservedRun", "RunObserver"]


class ObservedRun(Protocol):
    """A run as its observers see it (the runner, or the Batch API route)."""

    out: Path
    budget: Decimal
    ledger: Ledger | None
    ledger_state: LedgerState | None
    """The ledger's figures as last read (an observer that reads the ledger refreshes it)."""

    def progress(self) -> RunProgress:
        """A snapshot of the run now (cheap: counters already kept)."""
        ...

    @property
    def metrics(self) -> Metrics | None:
        """The run's Prometheus metrics, if it has them."""
        ...


class RunObserver:
    """Watches one run at a time; override the moments you watch (the rest do nothing).

    Example::

        class Bell(RunObserver):
            async def on_end(self, run, summary):
                print("\\a", summary.reason)

        observers = [*standard_observers(), Bell()]
        await JobRunner(plan, "runs/b3", observers=observers).run()
    """

    async def on_start(self, run: ObservedRun) -> None:
        """The ledger and the router are up; no prompt is sent yet."""

    async def on_progress(self, run: ObservedRun) -> None:
        """A moment worth a look now (the Batch API route: a round of polls ended)."""

    async def on_dispatch_end(self, run: ObservedRun) -> None:
        """The last request ended (or was abandoned): called even when the run fails."""

    def on_summary(self, run: ObservedRun, summary: RunSummary) -> None:
        """The summary is built, not yet written: add to it what this observer knows."""

    async def on_end(self, run: ObservedRun, summary: RunSummary) -> None:
        """``summary.json`` is written."""
