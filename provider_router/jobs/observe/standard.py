"""The standard observers of a run: what it leaves for its operator.

* the timeline (:class:`~provider_router.jobs.observe.timeline.TimelineObserver`):
  ``timeline.ndjson``, a line a second, and the Prometheus gauges it keeps fresh;
* the Batch API route's datasets in ``summary.json``
  (:class:`~provider_router.jobs.observe.batch_summary.BatchesInSummary`);
* the report (:class:`~provider_router.jobs.observe.report.ReportObserver`):
  ``report.html``, once ``summary.json`` is written.

A run has only the observers it is given: :func:`~provider_router.jobs.run.run_plan`
passes these; a bare :class:`~provider_router.jobs.runner.JobRunner` writes its outputs
and ``summary.json`` only unless it is given ``observers=standard_observers()``.
"""

from __future__ import annotations

from provider_router.jobs.events import RunObserver
from provider_router.jobs.observe.batch_summary import BatchesInSummary
from provider_router.jobs.observe.report import ReportObserver
from provider_router.jobs.observe.timeline import TimelineObserver

__all__ = ["standard_observers"]


def standard_observers(*, timeline_interval: float | None = None) -> list[RunObserver]:
    """New standard observers for one run (each run needs its own).

    Args:
        timeline_interval: seconds between two lines of ``timeline.ndjson`` (None: its
            default, 1).
    """
    return [TimelineObserver(timeline_interval), BatchesInSummary(), ReportObserver()]
