"""A run seen from outside: progress snapshots while it runs, its summary at the end.

Both read the state the dispatcher and the outcomes keep (datasets, counters, the
stop switch) and never change it:

* :func:`progress_snapshot` is polled by the live display and the timeline a few
  times a second, so it only reads counters already kept.
* :func:`summarize` is built once, after the last request finished: the money still
  needed to finish each dataset at the observed rates, what budget would cover it,
  and the hint the summary gives when money stopped the run.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from provider_router._money import from_units
from provider_router.batch.batch_view import BatchView
from provider_router.batch.batch_words import batch_sentences
from provider_router.batch.dispatch import Dispatcher
from provider_router.batch.finish import budget_to_finish, finish_hint, plan_to_finish
from provider_router.batch.outcomes import Outcomes
from provider_router.batch.run_progress import DatasetProgress, RunProgress
from provider_router.batch.summary import DatasetReport, RunSummary, StopReason, disputed_line
from provider_router.client import Router
from provider_router.ledger import LedgerState

__all__ = ["progress_snapshot", "summarize"]


def progress_snapshot(
    dispatcher: Dispatcher,
    *,
    router: Router | None,
    ledger_state: LedgerState | None,
    started: float,
) -> RunProgress:
    """A snapshot for the progress display (``started``: the run's monotonic start)."""
    failures: dict[str, int] = {}
    retries = 0
    datasets = []
    for ds in dispatcher.datasets:
        for kind, n in ds.counter.failures_by_kind.items():
            failures[kind] = failures.get(kind, 0) + n
        retries += ds.counter.retries
        tally = ds.tally
        datasets.append(
            DatasetProgress(
                name=ds.spec.name,
                completed=tally.completed,
                total=ds.total(),
                output_tokens=tally.output_tokens,
                target_output_tokens=ds.spec.target_output_tokens,
                in_flight=ds.inflight,
                cost=from_units(tally.cost_units),
                run=ds.counter,
                finished=ds.done() or (ds.exhausted and ds.inflight == 0),
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
    )


def summarize(
    dispatcher: Dispatcher,
    outcomes: Outcomes,
    *,
    budget: Decimal,
    router: Router | None,
    ledger_state: LedgerState | None,
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
                prompts=ds.total(),
                completed=ds.tally.completed,
                output_tokens=ds.tally.output_tokens,
                cost=from_units(ds.tally.cost_units),
                target_output_tokens=ds.spec.target_output_tokens,
                max_requests=ds.spec.max_requests,
                bad_lines=ds.reader.bad_lines,
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
    bad = [str(p) for ds in dispatcher.datasets for p in ds.reader.problems]
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
        preflight=preflight,
        disputed=[disputed_line(entry) for entry in disputes or ()],
        in_flight=len(dispatcher.tasks) - waiting,
        waiting_for_budget=waiting,
        cache_saved=router.cache_saved if router is not None else Decimal(0),
        batches=None if batches is None else batches.to_json(now),
        batch_sentences=[] if batches is None else batch_sentences(batches, now),
    )
