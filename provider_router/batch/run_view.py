"""A run seen from outside: progress snapshots while it runs, its summary at the end.

Both read the state the dispatcher and the outcomes keep (datasets, counters, the
stop switch) and never change it:

* :func:`progress_snapshot` is polled by the live display and the timeline a few
  times a second, so it only reads counters already kept.
* :func:`summarize` is built once, after the last request finished: the money still
  needed to finish each dataset at the observed rates, what budget would cover it,
  and the hint the summary gives when money stopped the run.

In a fleet, a dataset's figures are the whole fleet's (its shared tally), its rates
count the fleet's work since this worker started (``fleet_start``), and the summary
has a ``fleet`` part: who did what, what is left.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from provider_router._money import from_units
from provider_router.batch.batch_view import BatchView
from provider_router.batch.batch_words import batch_sentences
from provider_router.batch.dataset_run import DatasetRun
from provider_router.batch.dispatch import Dispatcher
from provider_router.batch.finish import budget_to_finish, finish_hint, plan_to_finish
from provider_router.batch.fleet import FleetQueue
from provider_router.batch.fleet_records import FleetTally
from provider_router.batch.journal import DatasetTally
from provider_router.batch.outcomes import Outcomes
from provider_router.batch.run_progress import DatasetProgress, RunProgress
from provider_router.batch.summary import (
    Counter,
    DatasetReport,
    RunSummary,
    StopReason,
    disputed_line,
)
from provider_router.client import Router
from provider_router.ledger import LedgerState

__all__ = ["progress_snapshot", "summarize"]


def progress_snapshot(
    dispatcher: Dispatcher,
    *,
    fleet_start: dict[str, FleetTally],
    router: Router | None,
    ledger_state: LedgerState | None,
    started: float,
) -> RunProgress:
    """A snapshot for the progress display (``started``: the run's monotonic start)."""
    failures: dict[str, int] = {}
    retries = 0
    datasets = []
    source = dispatcher.source
    for ds in dispatcher.datasets:
        for kind, n in ds.counter.failures_by_kind.items():
            failures[kind] = failures.get(kind, 0) + n
        retries += ds.counter.retries
        tally, run, in_flight = ds.tally, ds.counter, ds.inflight
        fleet = dispatcher.fleet_tally(ds)
        if source is not None and fleet is not None:
            tally = source.tally(ds.spec.name)
            run = _fleet_rates(ds, tally, fleet_start)
            in_flight = fleet.in_flight
        datasets.append(
            DatasetProgress(
                name=ds.spec.name,
                completed=tally.completed,
                total=ds.total(dispatcher.fleet_tally(ds)),
                output_tokens=tally.output_tokens,
                target_output_tokens=ds.spec.target_output_tokens,
                in_flight=in_flight,
                cost=from_units(tally.cost_units),
                run=run,
                finished=ds.done(dispatcher.fleet_tally(ds)) or (ds.exhausted and ds.inflight == 0),
            )
        )
    errors = rate_limited = 0
    if router is not None:
        for stats in router.health.snapshot().values():
            errors += stats.errors
            rate_limited += stats.rate_limited
    # The Router's count (what Prometheus reads too), from its reservation on; the
    # ledger's count of those waiting for room is sampled: never more than started.
    started_requests = router.in_flight if router is not None else len(dispatcher.tasks)
    waiting = min(ledger_state.waiting if ledger_state is not None else 0, started_requests)
    return RunProgress(
        datasets=tuple(datasets),
        elapsed=time.monotonic() - started,
        ledger=ledger_state,
        in_flight=started_requests - waiting,
        waiting_for_budget=waiting,
        to_finish=plan_to_finish(datasets)[1],
        stopping=dispatcher.reason,
        failures_by_kind=failures,
        retries=retries,
        rate_limited=rate_limited,
        errors=errors,
        workers=None if source is None else source.progress.workers,
    )


def _fleet_rates(
    ds: DatasetRun, tally: DatasetTally, fleet_start: dict[str, FleetTally]
) -> Counter:
    """The fleet's work since this worker started, for rates and ETAs (with our failures)."""
    start = fleet_start.get(ds.spec.name, FleetTally())
    own = ds.counter
    return Counter(
        requests=tally.completed - start.completed,
        output_tokens=tally.output_tokens - start.output_tokens,
        cost=from_units(tally.cost_units - start.cost_units),
        failures=own.failures,
        retries=own.retries,
        failures_by_kind=own.failures_by_kind,
        first_start=own.first_start,
        last_end=own.last_end,
    )


def summarize(
    dispatcher: Dispatcher,
    outcomes: Outcomes,
    *,
    budget: Decimal,
    router: Router | None,
    ledger_state: LedgerState | None,
    fleet: FleetQueue | None,
    started: float,
    recovered: list[str],
    preflight: Decimal,
    disputes: list[dict[str, Any]] | None = None,
    batches: BatchView | None = None,
) -> RunSummary:
    """The run's summary (``started``: its monotonic start; ``preflight``: USD it cost;
    ``batches``: the job's Batch API route, if it has one)."""
    now = time.time()
    reports = []
    for ds in dispatcher.datasets:
        reports.append(
            DatasetReport(
                name=ds.spec.name,
                prompts=ds.total(dispatcher.fleet_tally(ds)),
                completed=ds.tally.completed,
                output_tokens=ds.tally.output_tokens,
                cost=from_units(ds.tally.cost_units),
                target_output_tokens=ds.spec.target_output_tokens,
                max_requests=ds.spec.max_requests,
                bad_lines=_bad_lines(dispatcher, ds),
                lost=ds.tally.lost,
                run=ds.counter,
            )
        )
    each, to_finish = plan_to_finish(reports)
    for report, money in zip(reports, each, strict=True):
        report.to_finish = money
    health: dict[str, dict[str, Any]] = {}
    if router is not None:
        for name, stats in router.health.snapshot().items():
            health[name] = {"errors": stats.errors, "rate_limited": stats.rate_limited}
    state = ledger_state
    waiting = min(state.waiting if state is not None else 0, len(dispatcher.tasks))
    reason = dispatcher.reason or StopReason.COMPLETE
    message = dispatcher.message
    spent = state.spent if state else Decimal(0)
    needed = budget_to_finish(spent, to_finish, outcomes.refused)
    if reason in (StopReason.BUDGET, StopReason.CREDITS):
        message += finish_hint(reason, budget, spent, to_finish, needed, outcomes.refused)
    elif reason not in (StopReason.COMPLETE, StopReason.TARGET_NOT_REACHED):
        message += "; run the same command again to resume"
    if fleet is not None:
        bad = [str(p) for p in fleet.load_problems]
    else:
        bad = [str(p) for ds in dispatcher.datasets if ds.reader for p in ds.reader.problems]
    return RunSummary(
        reason=reason,
        datasets=reports,
        providers=dict(outcomes.providers),
        provider_health=health,
        budget=budget,
        spent=spent,
        reserved=state.reserved if state else Decimal(0),
        to_finish=to_finish,
        budget_to_finish=needed,
        wall_time=time.monotonic() - started,
        bad_lines=bad,
        recovered=list(recovered),
        message=message.lstrip("; "),
        fleet=_fleet_report(dispatcher),
        preflight=preflight,
        disputed=[disputed_line(entry) for entry in disputes or ()],
        in_flight=len(dispatcher.tasks) - waiting,
        waiting_for_budget=waiting,
        cache_saved=router.cache_saved if router is not None else Decimal(0),
        batches=None if batches is None else batches.to_json(now),
        batch_sentences=[] if batches is None else batch_sentences(batches, now),
    )


def _bad_lines(dispatcher: Dispatcher, ds: DatasetRun) -> int:
    fleet = dispatcher.fleet_tally(ds)
    if fleet is not None:
        return fleet.bad_lines
    return ds.reader.bad_lines if ds.reader is not None else 0


def _fleet_report(dispatcher: Dispatcher) -> dict[str, Any] | None:
    """The fleet's side of the summary: who did what, what is left (None outside a fleet)."""
    source = dispatcher.source
    if source is None:
        return None
    progress = source.progress
    return {
        "name": source.queue.name,
        "worker": source.queue.worker,
        "workers": progress.workers,
        "this_worker": {
            "completed": sum(ds.counter.requests for ds in dispatcher.datasets),
            "reclaimed_from_dead_workers": source.reclaimed,
            "duplicates": source.duplicates,
        },
        "datasets": {
            name: {
                "total": t.total,
                "completed": t.completed,
                "queued": t.queued,
                "in_flight": t.in_flight,
                "parked": t.parked,
                "duplicates": t.duplicates,
            }
            for name, t in progress.datasets.items()
        },
    }
