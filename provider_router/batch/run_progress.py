"""Snapshots of a running batch: what the live display and the timeline show.

Plain frozen records that :meth:`BatchRunner.progress` builds; kept apart from the
runner so what reads them (display, timeline, report) needs nothing of the runner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from provider_router.batch.summary import Counter, StopReason
from provider_router.ledger import LedgerState

__all__ = ["DatasetProgress", "RunProgress"]


@dataclass(frozen=True, slots=True)
class DatasetProgress:
    """One dataset's progress, for the live display.

    Attributes:
        name: the dataset.
        completed: prompts completed over every run.
        total: prompts it will complete at most (lines, capped by ``max_requests``), if known.
        output_tokens: completed output tokens over every run.
        target_output_tokens: the target, if any.
        in_flight: requests in flight now.
        cost: USD of its completions over every run.
        run: this run's counter.
        finished: nothing more will be sent for it.
    """

    name: str
    completed: int
    total: int | None
    output_tokens: int
    target_output_tokens: int | None
    in_flight: int
    cost: Decimal
    run: Counter
    finished: bool

    @property
    def request_cap(self) -> int | None:
        """The most prompts it will complete (``total``)."""
        return self.total


@dataclass(frozen=True, slots=True)
class RunProgress:
    """A snapshot of the whole run for the progress display.

    ``in_flight`` counts requests sent (or being sent); ``waiting_for_budget`` those
    whose reservation waits for room in the budget, not sent yet. Together they
    are the requests this run has started and not finished.
    """

    datasets: tuple[DatasetProgress, ...]
    elapsed: float
    ledger: LedgerState | None
    in_flight: int
    stopping: StopReason | None
    failures_by_kind: Mapping[str, int] = field(default_factory=dict)
    retries: int = 0
    rate_limited: int = 0
    errors: int = 0
    waiting_for_budget: int = 0
    to_finish: Decimal | None = None
    """USD still to spend to finish the plan (:mod:`provider_router.batch.finish`)."""
