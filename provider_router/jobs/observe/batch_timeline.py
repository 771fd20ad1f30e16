"""The batch route sampled while it runs: ``DIR/timeline.ndjson`` and the ledger's
Prometheus gauges (spent, reserved, the limit, to finish), as the sync runner's are.

A batch-only run has no sync runner for the
:class:`~provider_router.jobs.observe.timeline.TimelineWriter` to sample: :class:`BatchSampled`
is what it reads instead. Its figures are the job's ledger (refreshed before each
line), each batch-route dataset's completions, tokens and cost over every run (the
output journal's tallies) and, as in flight, the lines of its live batches. The writer
samples every ``interval`` seconds in the background, and the route asks for a line
after each round of polls (``on_round``), so a collect's spend shows at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path

from provider_router._money import from_units
from provider_router.client.metrics import Metrics
from provider_router.jobs.batch_api.journal import BatchJournal
from provider_router.jobs.counter import Counter
from provider_router.jobs.observe.finish import plan_to_finish
from provider_router.jobs.observe.snapshots import DatasetProgress, RunProgress
from provider_router.jobs.store.journal import FileJournal
from provider_router.ledger import Ledger, LedgerState

__all__ = ["BatchSampled"]


class BatchSampled:
    """The batch route as the timeline samples it (the timeline's ``Sampled``).

    Args:
        directory: the job directory (the timeline is written there).
        budget: the plan's budget (the limit a line shows before the ledger is read).
        ledger: the job's ledger.
        journal: the output journal the route writes through.
        batches: the route's batch journal (its live batches' lines are in flight).
        datasets: per batch-route dataset, (prompts it will complete at most, its
            output-token target).
        metrics: the run's Prometheus metrics, if served.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        budget: Decimal,
        ledger: Ledger,
        journal: FileJournal,
        batches: BatchJournal,
        datasets: Mapping[str, tuple[int | None, int | None]],
        metrics: Metrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = Path(directory)
        self.budget = budget
        self.ledger: Ledger | None = ledger
        self.ledger_state: LedgerState | None = None
        self._journal = journal
        self._batches = batches
        self._datasets = dict(datasets)
        self._metrics = metrics
        self._monotonic = monotonic
        self._started = monotonic()

    @property
    def metrics(self) -> Metrics | None:
        return self._metrics

    def progress(self) -> RunProgress:
        """A snapshot of the batch route now (cheap: counters already kept)."""
        live: dict[str, int] = {}
        for intent in self._batches:
            if intent.live:
                live[intent.dataset] = live.get(intent.dataset, 0) + len(intent.prompt_ids)
        datasets = []
        for name, (total, target) in self._datasets.items():
            tally = self._journal.tally(name)
            in_flight = live.get(name, 0)
            datasets.append(
                DatasetProgress(
                    name=name,
                    completed=tally.completed,
                    total=total,
                    output_tokens=tally.output_tokens,
                    target_output_tokens=target,
                    in_flight=in_flight,
                    cost=from_units(tally.cost_units),
                    run=Counter(),
                    finished=not in_flight and total is not None and tally.completed >= total,
                )
            )
        return RunProgress(
            datasets=tuple(datasets),
            elapsed=self._monotonic() - self._started,
            ledger=self.ledger_state,
            in_flight=sum(live.values()),
            stopping=None,
            to_finish=plan_to_finish(datasets)[1],
        )
