"""The summary of a run whose datasets went through the Batch API route.

``provider-router run`` sends a plan's batch-route datasets first
(:mod:`~provider_router.jobs.batch_api_runner`). When that ends the command (nothing is
left for the sync runner, or the batch route stopped), :func:`write_batch_summary`
writes the job's ``summary.json`` and ``report.html`` as a sync run does: why it
stopped, each dataset's completions, tokens and cost over every run (the output
journal's tallies), the ledger's money, and ``batches``
(:mod:`~provider_router.jobs.observe.batch_view`). When the sync runner goes on, its own
summary replaces this one, with the same ``batches``: :class:`BatchesInSummary`, one of
its standard observers, adds them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

from provider_router._log import get_logger
from provider_router._money import from_units
from provider_router.jobs.batch_api.result import BatchRouteResult
from provider_router.jobs.counter import Counter
from provider_router.jobs.events import ObservedRun, RunObserver
from provider_router.jobs.finish import budget_to_finish, plan_to_finish
from provider_router.jobs.observe.batch_view import read_batch_view
from provider_router.jobs.observe.batch_words import batch_sentences
from provider_router.jobs.observe.report import write_report
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.journal import FileJournal
from provider_router.jobs.summary import DatasetReport, RunSummary, StopReason
from provider_router.ledger import SQLiteLedger
from provider_router.planning.plan import Plan
from provider_router.planning.prompts import PromptReader

__all__ = ["BatchesInSummary", "add_batches", "batch_stop_reason", "write_batch_summary"]

log = get_logger(__name__)

_STOPPED_BY = {
    "budget": StopReason.BUDGET,
    "credits": StopReason.CREDITS,
    "error": StopReason.ERROR,
}


class BatchesInSummary(RunObserver):
    """Adds the job's Batch API route (if it has one) to a run's summary: ``batches``
    and one sentence per dataset (:func:`add_batches`)."""

    def on_summary(self, run: ObservedRun, summary: RunSummary) -> None:
        add_batches(summary, run.out, time.time())


def add_batches(summary: RunSummary, directory: Path, now: float) -> None:
    """``summary.batches`` and ``summary.batch_sentences`` from ``directory``'s batch view
    (left empty when the job sent no batch)."""
    view = read_batch_view(directory)
    if view is not None:
        summary.batches = view.to_json(now)
        summary.batch_sentences = batch_sentences(view, now)


def batch_stop_reason(result: BatchRouteResult, finished: Sequence[str] = ()) -> StopReason:
    """Why the batch route ended, as a run's :class:`StopReason`.

    ``finished``: datasets whose prompts that failed in every batch are no loss (a
    ``route: auto`` dataset sends them sync).
    """
    if result.stop is not None:
        return _STOPPED_BY.get(result.stopped_by or "", StopReason.BUDGET)
    if result.pending or any(n for name, n in result.gave_up.items() if name not in finished):
        return StopReason.INCOMPLETE
    return StopReason.COMPLETE


async def write_batch_summary(
    plan: Plan,
    directory: str | Path,
    names: Sequence[str],
    result: BatchRouteResult,
    *,
    wall_time: float,
    now: float | None = None,
) -> RunSummary | None:
    """Write ``summary.json`` and ``report.html`` for the batch datasets ``names``.

    A failure costs the files, never the run (its outputs and money are in the
    journals and the ledger): it is logged, and None returned.
    """
    try:
        return await _write(plan, Path(directory), names, result, wall_time, now)
    except Exception as exc:
        log.warning("batch.summary_failed", error=repr(exc))
        return None


async def _write(
    plan: Plan,
    directory: Path,
    names: Sequence[str],
    result: BatchRouteResult,
    wall_time: float,
    now: float | None,
) -> RunSummary:
    now = time.time() if now is None else now
    journal = FileJournal.read(directory)  # reads and locks; writes nothing
    try:
        tallies = {name: journal.tally(name) for name in names}
        given = journal.budget  # the budget the job's runs last gave its ledger
    finally:
        journal.close("batch summary")
    reports = []
    bad: list[str] = []
    for dataset in plan.datasets:
        if dataset.name not in tallies:
            continue
        reader = PromptReader(list(dataset.inputs))
        prompts = sum(1 for _ in reader)
        bad += [str(p) for p in reader.problems]
        tally = tallies[dataset.name]
        reports.append(
            DatasetReport(
                name=dataset.name,
                prompts=prompts,
                completed=tally.completed,
                output_tokens=tally.output_tokens,
                cost=from_units(tally.cost_units),
                target_output_tokens=dataset.target_output_tokens,
                max_requests=dataset.max_requests,
                bad_lines=reader.bad_lines,
                lost=tally.lost,
                run=Counter(),
                truncated=tally.truncated,
                truncated_cost=from_units(tally.truncated_units),
                set_aside=tally.set_aside,
                set_aside_cost=from_units(tally.set_aside_units),
            )
        )
    each, to_finish = plan_to_finish(reports)
    for report, money in zip(reports, each, strict=True):
        report.to_finish = money
    layout = JobLayout(directory)
    async with SQLiteLedger(layout.ledger) as ledger:
        state = await ledger.snapshot()
    auto = [d.name for d in plan.datasets if d.route == "auto"]
    summary = RunSummary(
        reason=batch_stop_reason(result, auto),
        datasets=reports,
        providers={},
        provider_health={},
        budget=state.limit,
        spent=state.spent,
        reserved=state.reserved,
        to_finish=to_finish,
        budget_to_finish=budget_to_finish(state.spent, to_finish, Decimal(0)),
        wall_time=wall_time,
        bad_lines=bad,
        recovered=[],
        message="" if result.stop is None else f"batch route stopped: {result.stop}",
        limit_outside=given is not None and state.limit != given,
    )
    add_batches(summary, directory, now)
    summary.write(layout.summary)
    try:
        write_report(directory)
    except Exception as exc:  # a failure costs the page, not the run
        log.warning("batch.report_failed", error=repr(exc))
    return summary
