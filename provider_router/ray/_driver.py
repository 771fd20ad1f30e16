"""The driver's own loop for ``run --ray``: Redis, the preflight, progress and metrics.

While Ray executes a dataset the driver's main thread is blocked in Ray's calls, so
everything else the driver does runs on one thread of its own with its own event loop:
before anything is sent, the preflight (paid from the job's Redis ledger), the
``--own-key`` baseline and the run's :class:`~provider_router.ray._control.JobControl`;
while it runs, the live progress (read as
:func:`~provider_router.jobs.observe.live.show_progress` reads a
:class:`~provider_router.jobs.runner.JobRunner`), the Prometheus metrics and the stop
word of a first Ctrl-C; at the end, the account correction and the preflight's cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Coroutine, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import SecretStr
from rich.console import Console

from provider_router._exceptions import PreflightFailed
from provider_router._log import get_logger
from provider_router.checks.preflight import PreflightReport, preflight
from provider_router.client.metrics import Metrics
from provider_router.client.router import Router
from provider_router.jobs.counter import Counter
from provider_router.jobs.finish import plan_to_finish
from provider_router.jobs.observe.live import show_progress
from provider_router.jobs.snapshots import DatasetProgress, RunProgress
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.account import AccountCheck
from provider_router.jobs.store.recovery import account_check, correct_account
from provider_router.jobs.summary import RunSummary, StopReason
from provider_router.ledger import LedgerState, RedisLedger
from provider_router.planning.plan import Plan
from provider_router.ray._control import DatasetCounts, JobControl
from provider_router.ray.job import RayJob
from provider_router.routing.policy import ProviderPolicy


class _Run(Protocol):
    """What the driver's loop reads of its run (``plan_run.RayPlanRun``)."""

    @property
    def job(self) -> RayJob: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def out(self) -> Path: ...

    @property
    def datasets(self) -> Sequence[Any]:
        """Each with ``spec``, ``written`` (ids, output tokens, cost), ``cap``, ``finished``."""

    @property
    def elapsed(self) -> float: ...


__all__ = ["DriverLoop"]

log = get_logger(__name__)

T = TypeVar("T")


class DriverLoop:
    """The driver's Redis, preflight, progress and metrics (see the module docstring).

    Every method but the coroutines is called from the main thread.
    """

    def __init__(
        self,
        run: _Run,
        *,
        api_key: str | SecretStr | None,
        base_url: str | None,
        preflight: bool,
        account_horizon: float | None,
        metrics: Metrics | None,
        console: Console | None,
        progress: str,
    ) -> None:
        self.run = run
        self._api_key = api_key
        self._base_url = base_url
        self.preflight = preflight
        self.preflight_report: PreflightReport | None = None
        self.account_horizon = account_horizon
        self.metrics = metrics
        self.console = console
        self.mode = progress
        self.ledger_state: LedgerState | None = None
        self._counts: dict[str, DatasetCounts] = {}
        self._before: dict[str, tuple[int, int, Decimal]] = {}
        """Each dataset's answers, output tokens and cost written before this run."""
        self._in_flight: dict[str, int] = {}
        self._providers: dict[str, dict[str, int]] = {}
        self._metered: dict[str, dict[str, int]] = {}
        self._failures: dict[str, int] = {}
        self._stopping: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._done: asyncio.Event | None = None
        self._control: JobControl | None = None
        self._redis_ledger: RedisLedger | None = None
        self._router: Router | None = None
        self._account: AccountCheck | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def __repr__(self) -> str:
        return f"DriverLoop({self.run.job.name!r})"

    # --- the thread --------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread and its loop."""
        self._thread = threading.Thread(target=self._main, name="ray-driver", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._done = asyncio.Event()
        self._ready.set()
        try:
            loop.run_until_complete(self._done.wait())
            loop.run_until_complete(self._aclose())
        finally:
            loop.close()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the driver's loop and wait for it."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        """Stop the display and metrics, close every client, end the thread."""
        if self._loop is None or self._thread is None:
            return
        done = self._done
        assert done is not None
        self._loop.call_soon_threadsafe(done.set)
        self._thread.join(30)

    async def _aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._control is not None:
            with contextlib.suppress(Exception):  # else it expires on its own
                await self._control.end()
        for closing in (self._router, self._redis_ledger, self._control):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing.close()

    # --- the run's steps -----------------------------------------------------------------

    def begin(self) -> None:
        """Preflight, account baseline, counts and targets; then progress and metrics.

        Raises:
            PreflightFailed: the preflight failed (nothing was sent).
        """
        self.call(self._begin())

    async def _begin(self) -> None:
        job, plan = self.run.job, self.run.plan
        ledger = RedisLedger(job.redis_url, job.name, lease=job.lease)
        if not await ledger.exists():
            await ledger.close()
            ledger = RedisLedger(job.redis_url, job.name, job.budget, lease=job.lease)
        self._redis_ledger = ledger
        await job.settle_budget(ledger)
        if self.preflight:
            report = self.preflight_report = await preflight(
                plan.model,
                ProviderPolicy(**plan.policy),
                base_url=self._base_url,
                api_key=self._api_key,
                ledger=ledger,
            )
            if not report.ok:
                raise PreflightFailed(report)
        if self.account_horizon is not None:
            router = self._router = Router(
                plan.model, ledger=ledger, api_key=self._api_key, base_url=self._base_url
            )
            await router.open()
            self._account = account_check(
                plan, self.run.out, router, ledger, horizon=self.account_horizon
            )
            if self._account is not None:
                await self._account.start([])
        control = self._control = JobControl(job.redis_url, job.name, prefix=job.store_prefix)
        written = {
            ds.spec.name: (len(ds.written.ids), ds.written.output_tokens, ds.written.cost)
            for ds in self.run.datasets
        }
        targets = {
            ds.spec.name: (target, int(plan.params_for(ds.spec).request_params()["max_tokens"]))
            for ds in self.run.datasets
            if (target := ds.spec.target_output_tokens) is not None
        }
        self._before = written
        await control.begin(written, targets)
        if self._stopping is not None:
            await control.stop(self._stopping)
        await self._refresh()
        self._tasks.append(asyncio.ensure_future(self._keep_alive(control)))
        if self.console is not None and self.mode != "off":
            self._tasks.append(asyncio.ensure_future(self._show()))
        if self.metrics is not None:
            self._tasks.append(asyncio.ensure_future(self._meter(self.metrics)))

    def stop(self, reason: str) -> None:
        """Tell every actor to send nothing more (from a signal handler: does not wait)."""
        self._stopping = reason
        if self._loop is not None and self._control is not None:
            asyncio.run_coroutine_threadsafe(self._control.stop(reason), self._loop)

    def failed(self, kind: str) -> None:
        """A row came back failed (for the progress header and the metrics)."""
        self._failures[kind] = self._failures.get(kind, 0) + 1

    def end(self, summary: RunSummary) -> None:
        """The account correction and the preflight's cost, into ``summary``."""
        self.call(self._end(summary))

    async def _end(self, summary: RunSummary) -> None:
        if self._account is not None:
            await self._account.start(list(self.run.job.worst_case))
            summary.recovered += await correct_account(self._account)
        summary.preflight = _earlier_preflight(self.run) + (
            self.preflight_report.cost if self.preflight_report is not None else Decimal(0)
        )
        await self._refresh()
        if self.metrics is not None:
            self._update_metrics(self.metrics)

    # --- what the display reads (as a JobRunner's) ----------------------------------------

    @property
    def ledger(self) -> DriverLoop:
        """``show_progress`` refreshes ``runner.ledger.snapshot()`` before each frame."""
        return self

    async def snapshot(self) -> LedgerState:
        await self._refresh()
        assert self.ledger_state is not None
        return self.ledger_state

    async def _refresh(self) -> None:
        assert self._redis_ledger is not None
        assert self._control is not None
        self.ledger_state = await self._redis_ledger.snapshot()
        self._counts = await self._control.counts()
        self._providers = await self._control.providers()
        flights: dict[str, int] = {}
        for reservation in await self._redis_ledger.open_reservations():
            name = reservation.key.partition("/")[0]
            flights[name] = flights.get(name, 0) + 1
        self._in_flight = flights

    def progress(self) -> RunProgress:
        """This moment of the run, as ``run``'s display shows it."""
        datasets = []
        for ds in self.run.datasets:
            counts = self._counts.get(ds.spec.name) or DatasetCounts(0, 0, Decimal(0), 0)
            done, tokens, cost = self._before.get(ds.spec.name, (0, 0, Decimal(0)))
            run = Counter(  # this run's: what the counts grew by since it began
                requests=max(counts.done - done, 0),
                output_tokens=max(counts.output_tokens - tokens, 0),
                cost=counts.cost - cost,
            )
            datasets.append(
                DatasetProgress(
                    name=ds.spec.name,
                    completed=counts.done,
                    total=ds.cap,
                    output_tokens=counts.output_tokens,
                    target_output_tokens=ds.spec.target_output_tokens,
                    in_flight=self._in_flight.get(ds.spec.name, 0),
                    cost=counts.cost,
                    run=run,
                    finished=ds.finished,
                )
            )
        stopping = StopReason.INTERRUPTED if self._stopping is not None else None
        return RunProgress(
            datasets=tuple(datasets),
            elapsed=self.run.elapsed,
            ledger=self.ledger_state,
            in_flight=sum(self._in_flight.values()),
            stopping=stopping,
            failures_by_kind=dict(self._failures),
            errors=sum(self._failures.values()),
            retries=sum(p.get("retries", 0) for p in self._providers.values()),
            to_finish=plan_to_finish(datasets)[1],
        )

    async def _show(self) -> None:
        assert self.console is not None
        try:
            await show_progress(self, self.console, self.mode)  # type: ignore[arg-type]
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the display never fails the run
            log.warning("ray.progress_failed", error=repr(exc))

    @staticmethod
    async def _keep_alive(control: JobControl) -> None:
        while True:
            await asyncio.sleep(1.0)
            with contextlib.suppress(Exception):  # an outage: the actors keep the last word
                await control.keep_alive()

    async def _meter(self, metrics: Metrics) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self._refresh()
                self._update_metrics(metrics)
            await asyncio.sleep(metrics.interval)

    def _update_metrics(self, metrics: Metrics) -> None:
        """The driver's view as ``run``'s metrics: ledger, in flight, answers by provider."""
        if self.ledger_state is not None:
            metrics.ledger_state(self.ledger_state)
        metrics.in_flight.set(sum(self._in_flight.values()))
        finish = self.progress().to_finish
        metrics.plan_to_finish(finish)
        for provider, now in self._providers.items():
            seen = self._metered.setdefault(provider, {})
            for what, counter in (
                ("done", metrics.requests.labels(provider, "success")),
                ("out", metrics.output_tokens.labels(provider)),
                ("prompt", metrics.prompt_tokens.labels(provider)),
                ("retries", metrics.retries),
            ):
                delta = now.get(what, 0) - seen.get(what, 0)
                if delta > 0:
                    counter.inc(delta)
            cost = now.get("cost", 0) - seen.get("cost", 0)
            if cost > 0:
                metrics.cost.labels(provider).inc(cost / 1e12)
            self._metered[provider] = dict(now)
        for kind, count in self._failures.items():
            seen_failed = self._metered.setdefault("\0failed", {})
            delta = count - seen_failed.get(kind, 0)
            if delta > 0:
                metrics.requests.labels("unknown", kind).inc(delta)
                seen_failed[kind] = count


def _earlier_preflight(run: _Run) -> Decimal:
    """What earlier runs' preflights in this directory cost (their ``summary.json``)."""
    try:
        earlier = json.loads(JobLayout(run.out).summary.read_text())
        value = Decimal(str(earlier.get("preflight_usd", "0")))
    except (OSError, ValueError, ArithmeticError, AttributeError):
        return Decimal(0)
    return value if value.is_finite() and value >= 0 else Decimal(0)
