"""The observers a run gets unless it is given its own: what it leaves for its operator.

* the timeline (:class:`~provider_router.jobs.observe.timeline.TimelineObserver`):
  ``timeline.ndjson``, a line a second, and the Prometheus gauges it keeps fresh;
* the Batch API route's datasets in ``summary.json``
  (:class:`~provider_router.jobs.observe.batch_summary.BatchesInSummary`);
* the report (:class:`~provider_router.jobs.observe.report.ReportObserver`):
  ``report.html``, once ``summary.json`` is written.

A run finds this module by name (:func:`provider_router.jobs.events.default_observers`):
the runner sits below what watches it and never imports it.
"""

from __future__ import annotations

from provider_router.jobs.events import RunObserver
from provider_router.jobs.observe.batch_summary import BatchesInSummary
from provider_router.jobs.observe.report import ReportObserver
from provider_router.jobs.observe.timeline import TimelineObserver

__all__ = ["standard_observers"]


def standard_observers(*, timeline_interval: float | None = None) -> list[RunObserver]:
    """New standard observers for one run (``timeline_interval``: seconds between two
    lines of the timeline; None: its default)."""
    return [TimelineObserver(timeline_interval), BatchesInSummary(), ReportObserver()]
