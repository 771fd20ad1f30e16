"""A run seen from outside: progress snapshots while it runs, its summary at the end.

The run's own records (the runner, the Ray driver and every view read them), built
from the state the dispatcher and the outcomes keep, never changing it.
:func:`progress_snapshot` is polled a few times a second, so it only reads counters;
:func:`summarize` is built once after the last request (what finishing would cost, what
budget covers it); observers add their views before it is written.
:class:`BatchSampled` is the Batch API route seen the same way.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router._exceptions import ConfigurationError
from provider_router._format import decimal_str
from provider_router._money import from_units
from provider_router.client.metrics import Metrics
from provider_router.client.router import Router
from provider_router.jobs.batch_api.journal import BatchJournal
from provider_router.jobs.counter import Counter
from provider_router.jobs.dispatch import Dispatcher
from provider_router.jobs.finish import (
    budget_to_finish,
    finish_hint,
    plan_to_finish,
    resume_budget,
)
from provider_router.jobs.outcomes import Outcomes
from provider_router.jobs.store.journal import FileJournal
from provider_router.jobs.summary import (
    DatasetReport,
    RunSummary,
    SharedLedger,
    StopReason,
    disputed_line,
)
from provider_router.ledger import Ledger, LedgerState

__all__ = ["BatchSampled", "DatasetProgress", "RunProgress", "progress_snapshot", "summarize"]


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
        truncated: completions cut at ``max_tokens`` over every run (in ``completed``).
        truncated_cost: what they cost (USD, in ``cost``).
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
    truncated: int = 0
    truncated_cost: Decimal = Decimal(0)

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
    """USD still to spend to finish the plan (:mod:`provider_router.jobs.finish`)."""
    waiting_for_endpoint: int = 0
    """Requests waiting for an endpoint with room (cost-first admission; not sent)."""
    price_vs_floor: Decimal | None = None
    """This run's answers' cost ÷ the same tokens at the floor's prices, so far."""


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
                finished=ds.done(),
                truncated=tally.truncated,
                truncated_cost=from_units(tally.truncated_units),
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
    for_endpoint = 0
    floor = paid = Decimal(0)
    for ds in dispatcher.datasets:
        floor += ds.counter.floor_cost
        paid += ds.counter.floored_cost
    if router is not None:
        with contextlib.suppress(ConfigurationError):  # not open yet
            for_endpoint = min(router.admission.waiting, started_requests - waiting)
    return RunProgress(
        datasets=tuple(datasets),
        elapsed=time.monotonic() - started,
        ledger=ledger_state,
        in_flight=started_requests - waiting - for_endpoint,
        waiting_for_budget=waiting,
        waiting_for_endpoint=for_endpoint,
        price_vs_floor=(paid / floor).quantize(Decimal("0.0001")) if floor else None,
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
    limit_outside: bool = False,
    shared: SharedLedger | None = None,
) -> RunSummary:
    """The run's summary (``started``: its monotonic start; ``preflight``: USD it cost;
    ``limit_outside``: the ledger's limit at the end was set outside the job's runs;
    ``shared``: the ledger other runs share, as it stands at the end)."""
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
                truncated=ds.tally.truncated,
                truncated_cost=from_units(ds.tally.truncated_units),
                set_aside=ds.tally.set_aside,
                set_aside_cost=from_units(ds.tally.set_aside_units),
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
    limit = state.limit if state else budget  # changed during the run by `ledger topup`?
    # Room for the last request's worst case: the one the budget refused, else the
    # largest one reserved (after a credits stop the budget refused none).
    room = outcomes.refused or outcomes.largest_reserved
    needed = budget_to_finish(spent, to_finish, room)
    money_stop = reason in (StopReason.BUDGET, StopReason.CREDITS)
    spend_limit = outcomes.spend_limit if money_stop else None
    bad = [str(p) for ds in dispatcher.datasets for p in ds.reader.problems]
    summary = RunSummary(
        reason=reason,
        datasets=reports,
        providers=dict(outcomes.providers),
        provider_health=health,
        budget=limit,
        spent=spent,
        reserved=state.reserved if state else Decimal(0),
        to_finish=to_finish,
        budget_to_finish=needed,
        wall_time=time.monotonic() - started,
        bad_lines=bad,
        recovered=list(recovered),
        preflight=preflight,
        disputed=[disputed_line(entry) for entry in disputes or ()],
        in_flight=len(dispatcher.tasks) - waiting,
        waiting_for_budget=waiting,
        cache_saved=router.cache_saved if router is not None else Decimal(0),
        refused=outcomes.refused,
        limit_outside=limit_outside,
        shared=shared,
        spend_limit=spend_limit,
        **_vs_floor(router, outcomes),
    )
    if reason in (StopReason.BUDGET, StopReason.CREDITS):
        resume = resume_budget(summary)
        message += finish_hint(
            reason,
            limit,
            spent,
            to_finish,
            needed,
            outcomes.refused,
            resume=resume,
            limit=spend_limit,
        )
    elif reason not in (StopReason.COMPLETE, StopReason.TARGET_NOT_REACHED):
        message += "; run the same command again to resume"
    summary.message = message.lstrip("; ")
    return summary


def _vs_floor(router: Router | None, outcomes: Outcomes) -> dict[str, Any]:
    """``price_vs_floor`` and ``admission`` of a run's summary (empty without a router
    that opened)."""
    if router is None:
        return {}
    try:
        plan, admission = router.plan, router.admission
    except ConfigurationError:  # never opened
        return {}
    lanes = {tag: lane.to_json() for tag, lane in admission.snapshot().items() if lane.admitted}
    floor = sum((c.floor_cost for c in outcomes.providers.values()), Decimal(0))
    paid = sum((c.floored_cost for c in outcomes.providers.values()), Decimal(0))
    figures: dict[str, Any] | None = None
    if floor > 0 and plan.floor is not None:
        premium = router.max_premium
        figures = {
            "paid_usd": decimal_str(paid),
            "floor_usd": decimal_str(floor),
            "ratio": decimal_str((paid / floor).quantize(Decimal("0.0001"))),
            "floor_endpoint": plan.floor.tag,
            "floor_provider": plan.floor.provider_name,
            "max_premium": None if premium is None else decimal_str(premium),
        }
    return {"price_vs_floor": figures, "admission": lanes or None}


class BatchSampled:
    """The Batch API route as its observers see it (an
    :class:`~provider_router.jobs.events.ObservedRun`).

    A batch-only run has no sync runner to sample: this is what the timeline reads
    instead. Its figures are the job's ledger (refreshed by whoever reads it), each
    batch-route dataset's completions, tokens and cost over every run (the output
    journal's tallies) and, as in flight, the lines of its live batches.

    Args:
        directory: the job directory.
        budget: the plan's budget (the limit shown before the ledger is read).
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
                    truncated=tally.truncated,
                    truncated_cost=from_units(tally.truncated_units),
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
