"""run_plan(): everything ``provider-router run`` does for a plan and a job directory.

The plan's Batch API datasets go first (:mod:`~provider_router.jobs.batch_api_runner`;
their ``summary.json`` and ``report.html`` written), then the others through one
:class:`~provider_router.jobs.runner.JobRunner`, on the plan's shared Redis ledger
when it names one; each part watched by the standard observers (timeline, report).
Both parts end in one :class:`RunOutcome`. The library prints
nothing: a caller shows progress, handles Ctrl-C and serves metrics through
:class:`RunHooks`. The same plan on a Ray cluster is
:func:`provider_router.ray.plan_run.run_plan_on_ray`, a stage above this one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from provider_router._exceptions import JobRefused
from provider_router.client.metrics import Metrics
from provider_router.jobs.batch_api.body import MAX_BATCH_REQUESTS
from provider_router.jobs.batch_api.lost import LOST_GRACE_SECONDS
from provider_router.jobs.batch_api.result import BatchRouteResult
from provider_router.jobs.batch_api_runner import (
    batch_datasets,
    describe,
    run_plan_batches,
    without_datasets,
)
from provider_router.jobs.finish import Resume, resume_budget
from provider_router.jobs.inputs import check_run
from provider_router.jobs.job_key import JobKey, JobKeyLease
from provider_router.jobs.observe.batch_summary import write_batch_summary
from provider_router.jobs.observe.batch_watch import BatchWatch
from provider_router.jobs.observe.standard import standard_observers
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.summary import RunSummary, StopReason
from provider_router.ledger import Ledger, RedisLedger, SQLiteLedger
from provider_router.ledger._outage import DEFAULT_OUTAGE_WINDOW
from provider_router.ledger.redis import DEFAULT_LEASE
from provider_router.planning.plan import Plan

__all__ = [
    "BatchOptions",
    "BatchPart",
    "RunHooks",
    "RunOutcome",
    "added_budget",
    "budget_left",
    "combined_reason",
    "open_shared_ledger",
    "run_plan",
    "run_plan_sync",
]

P = ParamSpec("P")
T = TypeVar("T")

_FINISHED = (StopReason.COMPLETE, StopReason.TARGET_NOT_REACHED)


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """How the Batch API route paces itself (``run --batch-*``; docs/batch.md).

    Attributes:
        poll: seconds before the first poll of a batch (doubling up to 300 while
            nothing changes).
        size: requests per batch (at most 5,000, the Batch API's limit).
        lost_grace: seconds after a submit whose answer was lost (and that may have
            reached OpenRouter) before its prompts go again if no listed batch carries
            them (default: the 24 h window and the list's lag; less may pay twice).
        accept_disputed: the disputed batch bills on record were checked on the
            dashboard and their booked worst cases stand: send batches again.
    """

    poll: float = 5.0
    size: int = MAX_BATCH_REQUESTS
    lost_grace: float = float(LOST_GRACE_SECONDS)
    accept_disputed: bool = False


@dataclass(frozen=True, slots=True)
class RunHooks:
    """What a caller of :func:`run_plan` sees while it runs (each hook optional).

    Attributes:
        on_start: the run was accepted (every check passed, the job directory
            exists) and nothing is sent yet: e.g. serve the metrics.
        on_batch_line: a sentence of the Batch API route's progress, when a
            dataset's figures change.
        on_batch_done: the Batch API route ended, before the sync datasets start.
        on_route_note: a sentence, before anything is sent, for each dataset that
            asked for the Batch API and goes sync instead (or keeps batch against a
            cheaper sync price); default: ``on_batch_line``.
        around_sync: entered with the sync route's runner just before it runs, and
            left when it ends: show its progress, and stop (the first Ctrl-C) or
            abandon (the second) it from in there.
    """

    on_start: Callable[[], None] | None = None
    on_batch_line: Callable[[str], None] | None = None
    on_batch_done: Callable[[BatchPart], None] | None = None
    on_route_note: Callable[[str], None] | None = None
    around_sync: Callable[[JobRunner], AbstractAsyncContextManager[object]] | None = None


@dataclass(frozen=True, slots=True)
class BatchPart:
    """What the Batch API route did in a run.

    Attributes:
        result: its figures and why it stopped (also ``DIR/batches.json``).
        reason: how it ended, as a run's stop reason: complete, incomplete (batches
            pending, or prompts of ``route: batch`` datasets that failed in every
            batch they went in), budget, credits or error.
        summary: the ``summary.json`` it wrote (None: writing it failed); a sync
            part that follows writes its own.
        ends_run: nothing is left for the sync route, or the route stopped.
        stuck: prompts of ``route: batch`` datasets that failed in every batch they
            went in, or that would fail a whole batch and were never put in one (not
            written; ``route: auto`` sends its own sync).
    """

    result: BatchRouteResult
    reason: StopReason
    summary: RunSummary | None
    ends_run: bool
    stuck: int = 0

    @property
    def lines(self) -> list[str]:
        """What the route did, then each dataset's sentence: the end of its part."""
        sentences = [] if self.summary is None else self.summary.batch_sentences
        return [*describe(self.result), *sentences]

    @property
    def needs_credits(self) -> bool:
        """A results 402: add credits on OpenRouter, then run again to collect."""
        return self.result.top_up is not None


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """How a :func:`run_plan` ended: its Batch API part, its sync part, and one reason.

    Attributes:
        out: the job directory.
        batch: the Batch API route's part (None: no dataset took it).
        summary: the sync route's summary (None: the batch part ended the run).
    """

    out: Path
    batch: BatchPart | None = None
    summary: RunSummary | None = None

    @property
    def reason(self) -> StopReason:
        """Why the run ended, both parts together (:func:`combined_reason`)."""
        if self.summary is None:
            if self.batch is None:
                raise ValueError("a run outcome holds a batch part, a summary or both")
            return self.batch.reason
        if self.batch is None:
            return self.summary.reason
        return combined_reason(self.batch.reason, self.summary.reason)

    @property
    def budget_to_resume(self) -> Decimal | None:
        """The budget a run again needs to finish the plan, when the budget stopped this
        one short of it (None: the same budget will do)."""
        return None if self.summary is None else self.summary.budget_to_resume

    @property
    def resume(self) -> Resume | None:
        """What running the job again takes (the ``To resume:`` line; None: it finished,
        or the Batch API route ended it without a summary)."""
        if self.reason in _FINISHED:
            return None
        last = self.summary or (self.batch.summary if self.batch is not None else None)
        return None if last is None else resume_budget(last)


def combined_reason(batch: StopReason, sync: StopReason) -> StopReason:
    """Why a run ended whose batch part ended with ``batch`` and then its sync part with
    ``sync``: a stop or error of the sync part (budget, credits, Ctrl-C) is what ended
    the run; else prompts the batch part could not do (incomplete) are not hidden by
    a sync part that finished."""
    if batch is not StopReason.COMPLETE and sync in _FINISHED:
        return batch
    return sync


async def run_plan(
    plan: Plan,
    out: str | Path,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    add_budget: Decimal | None = None,
    raise_budget: bool = False,
    strict: bool = False,
    preflight: bool = True,
    verify: bool = False,
    verify_every: int | None = None,
    account_horizon: float | None = None,
    lease: float = DEFAULT_LEASE,
    outage_window: float = DEFAULT_OUTAGE_WINDOW,
    batch: BatchOptions | None = None,
    metrics: Metrics | None = None,
    hooks: RunHooks | None = None,
    add_inputs: bool = False,
    redo_truncated: bool = False,
    job_key: bool | None = None,
    job_key_hours: float | None = None,
) -> RunOutcome:
    """Run ``plan`` into the job directory ``out``, as ``provider-router run`` does.

    Running it again resumes; a higher budget continues after a top-up.

    Args:
        plan: what to generate; it needs a budget (or ``add_budget``).
        out: the job directory (outputs, journal, ledger, ``summary.json``).
        api_key, base_url: OpenRouter's (defaults from the environment).
        add_budget: raise the job's budget by this much: its own ledger's current
            limit plus it (to resume after a budget stop; an explicit raise).
        raise_budget: the plan's budget may raise a limit set outside the job's runs
            (by ``ledger topup``); without it such a raise is refused
            (:mod:`provider_router.jobs.budget`: the rules of a job's budget).
        strict: the first bad input line is fatal before anything is spent.
        preflight: check the key, credits, model and policy first, with one 1-token
            request paid from the job's budget (:mod:`provider_router.checks.preflight`).
        verify, verify_every: measure the providers against the model's reference
            before the run and every ``verify_every`` rows (:class:`JobRunner`).
        account_horizon: the key is the job's own (:class:`JobRunner`).
        lease, outage_window: the shared Redis ledger's (the plan's ``ledger:``).
        batch: how the Batch API route paces itself.
        metrics: Prometheus metrics to keep current (served by the caller).
        hooks: what the caller sees while it runs.
        add_inputs: give a job that has outputs prompt files it does not have yet (a
            new dataset, or other files for one); without it that is refused, as a
            wrong ``out`` most likely (:mod:`provider_router.jobs.identity`).
        redo_truncated: before anything is sent, move the answers cut at a
            ``max_tokens`` below the plan's out of the outputs (kept in
            ``DIR/set_aside/truncated/``), so this run sends them again with the plan's
            cap (:mod:`provider_router.jobs.redo`; docs/batch.md, "Answers cut at
            max_tokens"); the job's ``max_tokens`` may then grow.
        job_key, job_key_hours: make a key for this run with what the budget has left
            as its limit, send with it, disable it at the end (default: the plan's
            ``job_key``; :mod:`provider_router.jobs.job_key`). The management key comes
            from ``OPENROUTER_MANAGEMENT_KEY`` only.

    Raises:
        JobRefused: something it was given cannot be used (nothing was sent or written),
            such as a ``route: batch`` dataset without a batch endpoint the policy
            allows, a budget below what the job spent, a raise of a limit set by
            ``ledger topup`` without ``raise_budget``, on a shared ledger a budget above
            its limit; or the run would change what the job's outputs answer (its model,
            policy, a dataset's route or generation parameters).
        PreflightFailed: the preflight found what the run relies on missing.
        ConfigurationError: the plan cannot run as it is.
        ProviderRouterError: the run could not start (e.g. a rejected key).
    """
    hooks = hooks or RunHooks()
    out = Path(out)
    if add_budget is not None:
        plan = plan.with_overrides(budget=await added_budget(plan, out, add_budget))
        raise_budget = True  # the amount is added to the limit, whoever set it
    own_job_key = plan.job_key if job_key is None else job_key
    check_run(
        plan,
        out,
        api_key=api_key,
        verify=verify,
        verify_every=verify_every,
        add_inputs=add_inputs,
        redo_truncated=redo_truncated,
        job_key=own_job_key,
        own_key=account_horizon is not None,
    )
    if hooks.on_start is not None:
        hooks.on_start()
    left, part = await _batch_part(
        plan,
        out,
        api_key,
        base_url,
        batch or BatchOptions(),
        metrics,
        hooks,
        redo_truncated=redo_truncated,
        raise_budget=raise_budget,
    )
    if part is not None and hooks.on_batch_done is not None:
        hooks.on_batch_done(part)
    if left is None:
        return RunOutcome(out, batch=part)

    def runner_with(key: JobKey | None) -> Callable[[Ledger | None], JobRunner]:
        def runner(ledger: Ledger | None) -> JobRunner:
            return JobRunner(
                left,
                out,
                strict=strict,
                base_url=base_url,
                api_key=api_key,
                ledger=ledger,
                router_options=None if metrics is None else {"metrics": metrics},
                account_horizon=account_horizon,
                preflight=preflight,
                verify=verify,
                verify_every=verify_every,
                observers=standard_observers(),
                redo_truncated=redo_truncated,
                raise_budget=raise_budget,
                job_key=key,
            )

        return runner

    shared = {"lease": lease, "outage_window": outage_window}
    if not own_job_key:
        summary = await _sync_part(left, runner_with(None), hooks, **shared)
        return RunOutcome(out, batch=part, summary=summary)
    hours = plan.job_key_hours if job_key_hours is None else job_key_hours
    room = await budget_left(left, out, lease=lease, outage_window=outage_window)
    async with JobKeyLease(out, budget_left=room, base_url=base_url, hours=hours) as key:
        summary = await _sync_part(left, runner_with(key), hooks, **shared)
    return RunOutcome(out, batch=part, summary=summary)


def _on_own_loop(main: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """``main`` as a blocking call: each call runs to its end on a new event loop
    (uvloop's when installed), for a program that has none running."""

    def blocking(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            import uvloop

            factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
        except ImportError:  # pragma: no cover
            factory = None
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main(*args, **kwargs))

    return blocking


run_plan_sync = _on_own_loop(run_plan)
"""``run_plan_sync(plan, out, ...)``: :func:`run_plan`, the same arguments, as a blocking
call on an event loop of its own (uvloop's when installed), for a program without one."""


async def added_budget(plan: Plan, out: str | Path, amount: Decimal) -> Decimal:
    """The job's budget raised by ``amount``: its own ledger's current limit plus
    ``amount`` (0 plus it when the job has no ledger yet).

    Raises:
        JobRefused: the plan keeps its budget in a shared ledger (top that up instead).
    """
    if plan.ledger is not None:
        raise JobRefused(
            "--add-budget reads the job's own ledger; for a shared Redis ledger use "
            "`provider-router ledger topup URL --name NAME --add USD`"
        )
    path = JobLayout(Path(out)).ledger
    if not path.is_file():
        return Decimal(amount)
    async with SQLiteLedger(path) as ledger:
        return (await ledger.snapshot()).limit + Decimal(amount)


async def budget_left(
    plan: Plan,
    out: str | Path,
    *,
    lease: float = DEFAULT_LEASE,
    outage_window: float = DEFAULT_OUTAGE_WINDOW,
) -> Decimal:
    """What the plan's budget has left for this run: its budget less what the job's
    ledger (or the plan's shared one) has spent and still holds (the limit of a key made
    for the run, :mod:`provider_router.jobs.job_key`)."""
    budget = plan.budget
    if budget is None:
        raise JobRefused("a run needs a budget (--budget USD or `budget:` in the plan)")
    ledger: Ledger
    if plan.ledger is not None:
        name = plan.shared_ledger_name
        assert name is not None  # the plan checks it
        ledger = await open_shared_ledger(
            plan.ledger, name, budget, lease=lease, outage_window=outage_window
        )
    else:
        path = JobLayout(Path(out)).ledger
        if not path.is_file():
            return budget
        ledger = SQLiteLedger(path)
    async with ledger:
        state = await ledger.snapshot()
    return budget - state.spent - state.reserved


async def open_shared_ledger(
    url: str,
    name: str,
    budget: Decimal,
    *,
    lease: float = DEFAULT_LEASE,
    outage_window: float = DEFAULT_OUTAGE_WINDOW,
) -> RedisLedger:
    """The Redis ledger ``name``: created with ``budget`` as its limit if it is new.

    An existing ledger keeps its limit: it is what every run on it may spend together,
    changed only by ``provider-router ledger topup``. Each run's budget is its own cap
    inside it (:class:`~provider_router.jobs.ledger_share.LedgerShare`), never above it.
    """
    ledger = RedisLedger(url, name, lease=lease, outage_window=outage_window)
    try:
        if await ledger.exists():
            return ledger
    except BaseException:
        await ledger.close()
        raise
    # A new ledger: the first process sets its limit (processes starting together
    # with the same budget all may; a different budget is refused by Redis).
    await ledger.close()
    return RedisLedger(url, name, budget, lease=lease, outage_window=outage_window)


async def _sync_part(
    plan: Plan,
    runner: Callable[[Ledger | None], JobRunner],
    hooks: RunHooks,
    *,
    lease: float,
    outage_window: float,
) -> RunSummary:
    """The plan's sync datasets through one :class:`JobRunner` (made by ``runner``), on
    the plan's shared Redis ledger when it names one (else the job's ``ledger.sqlite``)."""
    budget = plan.budget
    assert budget is not None  # checked before
    ledger = None
    if plan.ledger is not None:
        name = plan.shared_ledger_name
        assert name is not None  # the plan checks it
        ledger = await open_shared_ledger(
            plan.ledger, name, budget, lease=lease, outage_window=outage_window
        )
    try:
        job = runner(ledger)
        if hooks.around_sync is None:
            return await job.run()
        async with hooks.around_sync(job):
            return await job.run()
    finally:
        if ledger is not None:
            await ledger.close()


_STOPPED_BY = {"credits": StopReason.CREDITS, "error": StopReason.ERROR}


async def _batch_part(
    plan: Plan,
    out: Path,
    api_key: str | None,
    base_url: str | None,
    options: BatchOptions,
    metrics: Metrics | None,
    hooks: RunHooks,
    *,
    redo_truncated: bool,
    raise_budget: bool,
) -> tuple[Plan | None, BatchPart | None]:
    """The plan's Batch API datasets (docs/batch.md, "The Batch API route"): the plan
    left for the sync route (None: nothing), and what the route did (None: no dataset
    takes it). A stop of the route (a results 402, the budget) ends the run there."""
    if all(d.route == "sync" for d in plan.datasets):
        return plan, None
    batches = await batch_datasets(plan, base_url=base_url, api_key=api_key)
    say = hooks.on_route_note or hooks.on_batch_line
    if say is not None:
        for note in batches.notes:  # auto datasets sent sync instead, and why
            say(note + ".")
    if not batches.names:
        return plan, None
    endpoint = batches.route.endpoint if batches.route is not None else None
    watch = BatchWatch(out, pinned=None if endpoint is None else endpoint.provider_name)
    started = time.monotonic()
    result = await run_plan_batches(
        plan,
        out,
        batches,
        base_url=base_url,
        api_key=api_key,
        poll_initial=options.poll,
        lost_grace=options.lost_grace,
        accept_disputed=options.accept_disputed,
        max_batch_requests=options.size,
        api_factory=watch.api,
        metrics=metrics,
        observers=standard_observers(),
        progress=watch.reporter(hooks.on_batch_line, metrics),
        redo_truncated=redo_truncated,
        raise_budget=raise_budget,
    )
    # summary.json and report.html of the batch route (a sync part replaces them)
    summary = await write_batch_summary(
        plan, out, batches.names, result, wall_time=time.monotonic() - started
    )
    if result.top_up is not None:
        return None, BatchPart(result, StopReason.CREDITS, summary, ends_run=True)
    if result.stop is not None:
        # A disputed bill or a vanished batch is an error, as on the sync route.
        reason = _STOPPED_BY.get(result.stopped_by or "", StopReason.BUDGET)
        return None, BatchPart(result, reason, summary, ends_run=True)
    if result.pending:
        return None, BatchPart(result, StopReason.INCOMPLETE, summary, ends_run=True)
    # route: auto datasets go on to the sync route (the tail, and lines that failed in
    # every batch they went in: the journal skips what is done); route: batch ones end.
    auto = {d.name for d in plan.datasets if d.route == "auto"}
    stuck = sum(n for name, n in result.gave_up.items() if name not in auto)
    stuck += sum(n for name, n in result.refused.items() if name not in auto)
    left = without_datasets(plan, tuple(n for n in batches.names if n not in auto))
    # Prompts that failed in every batch keep the run incomplete, whatever the sync part does.
    reason = StopReason.INCOMPLETE if stuck else StopReason.COMPLETE
    return left, BatchPart(result, reason, summary, ends_run=left is None, stuck=stuck)
