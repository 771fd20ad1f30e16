"""The batch runner: a plan's datasets through the routed, budgeted client, exactly once.

:class:`BatchRunner` streams each dataset's prompts, skips what the journal has
already completed, and keeps up to ``plan.concurrency`` requests in flight on one
:class:`~provider_router.Router` (datasets interleaved round-robin). Each result
is committed to the journal and its dataset's output file; the journal is
flushed once per event-loop turn, so a burst of completions costs two writes.

* **Targets.** A dataset's output-token target counts completed tokens. A new
  request is sent only while ``completed + in_flight × mean tokens per request``
  is below the target, so dispatch slows as the target nears and the overshoot
  is at most the tokens of the requests still in flight when it is reached.
* **Money.** Every request reserves its worst case in a SQLite ledger beside the
  outputs (``ledger.sqlite``; the budget is its limit). When the ledger cannot
  cover another request (:class:`~provider_router.BudgetExhausted`) or OpenRouter
  says the credits are gone (:class:`~provider_router.CreditsExhausted`), the
  runner stops taking work, lets requests in flight finish, and reports what is
  left and what finishing would cost at the observed rates.
* **Stopping.** :meth:`BatchRunner.stop` (the first Ctrl-C) stops taking work and
  lets requests in flight finish; :meth:`BatchRunner.abandon` (the second) cancels
  them, and the client reconciles or counts each at its worst case.
* **Resuming.** Running the same plan into the same directory again continues:
  crashed requests are reconciled through the ledger (by generation id where one
  was known), and done prompts are skipped unparsed while the input files are
  unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router._constants import (
    ENV_API_KEY,
    STREAM_DEADLINE_BASE,
    STREAM_DEADLINE_TOKENS_PER_SECOND,
)
from provider_router._exceptions import (
    AllAttemptsFailed,
    AuthenticationError,
    BudgetExhausted,
    ConfigurationError,
    CreditsExhausted,
    LedgerUnavailableError,
    LedgerWriteError,
    ProviderRouterError,
)
from provider_router._format import format_usd
from provider_router._log import get_logger
from provider_router._money import from_units, to_units
from provider_router._types import JSONObject
from provider_router.batch.account import AccountCheck
from provider_router.batch.dataset_run import DatasetRun
from provider_router.batch.fleet import FleetQueue, FleetTally, WorkItem, describe_error
from provider_router.batch.fleet_source import FleetSource
from provider_router.batch.job_ledger import open_job_ledger
from provider_router.batch.journal import DatasetTally, FileJournal, Journal
from provider_router.batch.output import encode_record, make_record
from provider_router.batch.report import write_report
from provider_router.batch.run_progress import DatasetProgress, RunProgress
from provider_router.batch.summary import (
    Counter,
    DatasetReport,
    RunSummary,
    StopReason,
    budget_to_finish,
    finish_hint,
    money_to_finish,
)
from provider_router.batch.targets import InFlightPricer
from provider_router.batch.timeline import DEFAULT_INTERVAL, TimelineWriter
from provider_router.client import Router
from provider_router.ledger import Ledger, LedgerState
from provider_router.plan import Plan, reached
from provider_router.policy import ProviderPolicy
from provider_router.preflight import PreflightFailed, PreflightReport, preflight
from provider_router.prompts import Prompt, PromptReader, count_lines, first_problem_error
from provider_router.results import ChatResult

__all__ = ["LEDGER_FILE", "SUMMARY_FILE", "BatchRunner", "DatasetProgress", "RunProgress"]

log = get_logger(__name__)

LEDGER_FILE = "ledger.sqlite"
SUMMARY_FILE = "summary.json"
_FATAL = (AuthenticationError, ConfigurationError, LedgerUnavailableError)
"""Failures every other request would hit too: stop the run instead of counting them."""


class BatchRunner:
    """Run a :class:`~provider_router.plan.Plan` into a job directory.

    Args:
        plan: what to generate (must have a budget).
        out: the job directory: outputs, journal, ledger and summary go there.
        strict: read every input line before spending anything and fail on the
            first bad one (default: skip bad lines and report them).
        base_url, api_key: OpenRouter's (defaults from the environment).
        router_options: further :class:`~provider_router.Router` keyword arguments.
        ledger: a ledger to use instead of ``<out>/ledger.sqlite`` (its limit is
            set to the plan's budget); for a fleet, the shared
            :class:`~provider_router.RedisLedger`. The caller closes it.
        fleet: share the plan with other workers through this
            :class:`~provider_router.FleetQueue` (see docs/workers.md): prompts are
            claimed from the fleet instead of read from the files, results go to
            ``out`` (this worker's own directory) and are acknowledged to the fleet,
            and progress and summary show the whole fleet. Give it the fleet's
            shared ``ledger`` too. The runner closes the queue.
        stream: send streaming requests (default). Each answer's generation id is
            then durable on its reservation within one ledger commit of its first
            byte, so recovery after a crash settles it at its real cost; ``False``
            sends plain JSON requests (a crash then counts those in flight at their
            worst case).
        account_horizon: the API key is the run's own: worst-case charges (requests
            cut before their generation id was known) are bounded by the key's usage
            (``GET /key``) this many seconds after each was given up on
            (:mod:`provider_router.batch.account`); negative: the stream deadline.
        timeline_interval: seconds between two lines of ``<out>/timeline.ndjson``
            (the time series ``report.html`` and ``provider-router status`` read).

    Besides the outputs, a run writes ``summary.json`` and ``report.html`` (see
    :mod:`provider_router.batch.report`).

    Example::

        runner = BatchRunner(load_plan("plan.yaml"), "runs/b3")
        summary = await runner.run()
        print(summary.reason, summary.spent)
    """

    def __init__(
        self,
        plan: Plan,
        out: str | Path,
        *,
        strict: bool = False,
        base_url: str | None = None,
        api_key: str | None = None,
        router_options: Mapping[str, Any] | None = None,
        ledger: Ledger | None = None,
        fleet: FleetQueue | None = None,
        stream: bool = True,
        timeline_interval: float = DEFAULT_INTERVAL,
        account_horizon: float | None = None,
        preflight: bool = False,
    ) -> None:
        if plan.budget is None:
            raise ConfigurationError("a run needs a budget (--budget USD or `budget:` in the plan)")
        if fleet is not None and ledger is None:
            raise ConfigurationError(
                "workers sharing a plan must share one budget: give the fleet's ledger "
                "(--ledger redis://...)"
            )
        self.plan = plan
        self.budget: Decimal = plan.budget
        self.out = Path(out)
        self.strict = strict
        self.stream = stream
        """Stream answers (the default): the generation id arrives with the first
        byte and is on the reservation before the answer is done, so a crash costs
        what it really cost (recovery asks ``/generation``)."""
        self.account_horizon = account_horizon
        """Seconds after which a request given up on can no longer be billed, when the
        key is the run's own (see :mod:`provider_router.batch.account`); ``None``: off;
        negative: the stream deadline of the plan's ``max_tokens``."""
        self.preflight = preflight
        """Run :func:`~provider_router.preflight.preflight` first, its 1-token request
        reserved and settled in the job's ledger; a failed check raises
        :class:`~provider_router.preflight.PreflightFailed` before any prompt is sent."""
        self.preflight_report: PreflightReport | None = None
        self._base_url = base_url
        self._api_key = api_key
        self._router_options = dict(router_options or {})
        self._given_ledger = ledger
        self._fleet = fleet
        self.timeline_interval = timeline_interval
        self.source: FleetSource | None = None
        """The fleet source while a fleet run is going on."""
        self._fleet_start: dict[str, FleetTally] = {}
        self.ledger: Ledger | None = None
        self.router: Router | None = None
        self.journal: FileJournal | None = None
        self._datasets: list[DatasetRun] = []
        self._providers: dict[str, Counter] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = 0  # requests dispatched and not yet finished (exact, unlike _tasks)
        self._reason: StopReason | None = None
        self._message = ""
        self._wake = asyncio.Event()
        self._flush_pending = False
        self._started = time.monotonic()
        self._recovered: list[str] = []
        # The largest reservation the budget refused: a resume needs room for it.
        self._refused = Decimal(0)
        self.ledger_state: LedgerState | None = None

    # --- control ----------------------------------------------------------------------

    def stop(self, reason: StopReason = StopReason.INTERRUPTED, message: str = "") -> None:
        """Stop taking new work; requests in flight finish (the first Ctrl-C)."""
        if self._reason is None:
            self._reason = reason
            self._message = message
            log.info("batch.stopping", reason=reason.value, in_flight=len(self._tasks))
        if self.source is not None:
            self.source.stop()
        self._wake.set()

    def abandon(self) -> None:
        """Cancel requests in flight (the second Ctrl-C); they are counted at worst case."""
        self._reason = StopReason.ABANDONED
        self._message = "requests in flight were abandoned and counted at their worst case"
        if self.source is not None:
            self.source.stop()
        for task in list(self._tasks):
            task.cancel()
        self._wake.set()

    @property
    def stopping(self) -> StopReason | None:
        """Why the runner stopped taking work, or None while it runs."""
        return self._reason

    # --- the run -------------------------------------------------------------------------

    async def run(self) -> RunSummary:
        """Run the plan until it is done, the money runs out, or :meth:`stop` is called.

        Raises:
            DataFileError: with ``strict``, the first bad input line (nothing is spent).
            ConfigurationError: the directory is in use or holds foreign outputs.
            ProviderRouterError: the router could not start (e.g. a rejected key).
        """
        self._started = time.monotonic()
        journal = self.journal = FileJournal.open(self.out)
        reason = "error"
        try:
            self._recovered += journal.repairs
            if journal.lost:
                self._recovered.append(
                    f"{len(journal.lost)} request(s) were in flight when the last run died; "
                    "their prompts run again and their cost is reconciled by the ledger"
                )
            journal.prepare([d.name for d in self.plan.datasets])
            if self.strict and self._fleet is None:  # a fleet checks when joining
                await asyncio.to_thread(self._validate_inputs)
            summary = await self._run_with_ledger(journal)
            reason = summary.reason.value
            return summary
        finally:
            try:
                if self._fleet is not None:
                    await self._fleet.close()
            finally:
                try:
                    journal.close(reason)
                except OSError as exc:  # name the directory: the CLI says it in one line
                    raise OSError(exc.errno, exc.strerror, str(self.out)) from exc

    def _validate_inputs(self) -> None:
        for spec in self.plan.datasets:
            reader = PromptReader(list(spec.inputs))
            for _ in reader:
                pass
            if reader.problems:
                raise first_problem_error(reader.problems)

    async def _open_ledger(self) -> Ledger:
        ledger = await open_job_ledger(
            self.out / LEDGER_FILE, self.budget, self.journal, self._given_ledger
        )
        state = await ledger.snapshot()
        if state.limit != self.budget:
            await ledger.set_limit(self.budget)
            old, new = format_usd(state.limit), format_usd(self.budget)
            self._recovered.append(f"budget changed from {old} to {new}")
            if self.journal is not None:
                self.journal.note("budget", old=str(state.limit), new=str(self.budget))
        return ledger

    async def _run_with_ledger(self, journal: FileJournal) -> RunSummary:
        ledger = self.ledger = await self._open_ledger()
        try:
            if self.preflight:
                await self._preflight(ledger, journal)
            router = Router(
                self.plan.model,
                policy=ProviderPolicy(**self.plan.policy),
                ledger=ledger,
                max_concurrency=self.plan.concurrency,
                base_url=self._base_url,
                api_key=self._api_key,
                **{"budget_wait": True, **self._router_options},
            )
            async with router:
                self.router = router
                report = await ledger.recover(router.resolve)
                if report.reconciled or report.worst_case:
                    self._recovered.append(
                        f"ledger: {len(report.reconciled)} crashed request(s) reconciled "
                        f"({format_usd(report.reconciled_cost)}), {len(report.worst_case)} "
                        f"counted at worst case ({format_usd(report.worst_case_cost)})"
                    )
                account = self._account_check(router, ledger)
                if account is not None:
                    await account.start(report.worst_case)
                # For the report only: writing it never fails the run.
                timeline = TimelineWriter(self, interval=self.timeline_interval)
                timeline.start()
                try:
                    if self._fleet is not None:
                        await self._run_fleet(self._fleet, journal, ledger, router)
                    else:
                        await self._prepare_datasets(journal)
                        await self._dispatch(journal, router)
                    self._check_targets()
                finally:
                    await timeline.stop()
                if account is not None:
                    corrected = await account.finish()
                    if corrected:
                        self._recovered.append(
                            f"account: {format_usd(corrected)} of worst-case charges taken "
                            "back (the key's usage shows it was never charged)"
                        )
            try:
                self.ledger_state = await ledger.snapshot()
            except LedgerUnavailableError as exc:  # the run stops on it; say so once
                self.stop(StopReason.ERROR, f"stopped: {exc}")
            summary = self._summary()
            self._write_report()
            return summary
        finally:
            if self._given_ledger is None:
                await ledger.close()

    async def _preflight(self, ledger: Ledger, journal: FileJournal) -> None:
        """The preflight, paid from the job's ledger (on every run: it costs < $0.001)."""
        report = self.preflight_report = await preflight(
            self.plan.model,
            ProviderPolicy(**self.plan.policy),
            base_url=self._base_url,
            api_key=self._api_key,
            ledger=ledger,
        )
        if report.cost:
            journal.note_preflight(report.cost)
        if not report.ok:
            raise PreflightFailed(report)

    def _account_check(self, router: Router, ledger: Ledger) -> AccountCheck | None:
        horizon = self.account_horizon
        if horizon is None or self._fleet is not None:
            return None  # a fleet's key is shared by its workers: not one run's own
        if horizon < 0:
            tokens = max(
                int(self.plan.params_for(spec).request_params()["max_tokens"])
                for spec in self.plan.datasets
            )
            horizon = STREAM_DEADLINE_BASE + tokens / STREAM_DEADLINE_TOKENS_PER_SECOND
        return AccountCheck(self.out, router, ledger, horizon=horizon)

    async def _prepare_datasets(self, journal: FileJournal) -> None:
        for spec in self.plan.datasets:
            params = self.plan.params_for(spec).request_params()
            max_tokens = int(params.pop("max_tokens"))
            fingerprint = _fingerprint(spec.inputs)
            fast = journal.fast_resume_ok(spec.name, fingerprint)
            if fast:
                reader = PromptReader(
                    list(spec.inputs),
                    skip=journal.done_locations(spec.name),
                    taken=journal.done_ids(spec.name),
                )
            else:
                reader = PromptReader(list(spec.inputs))
                journal.record_inputs(spec.name, fingerprint)
            self._datasets.append(
                DatasetRun(
                    spec=spec,
                    params=params,
                    max_tokens=max_tokens,
                    reader=reader,
                    prompts=iter(reader),
                    tally=journal.tally(spec.name),
                    counter=Counter(),
                    relocate=not fast,
                    pricer=InFlightPricer(max_tokens),
                )
            )
        for dataset in self._datasets:
            task = asyncio.ensure_future(self._count_lines(dataset))
            self._background(task)

    async def _run_fleet(
        self, fleet: FleetQueue, journal: FileJournal, ledger: Ledger, router: Router
    ) -> None:
        source = FleetSource(
            fleet,
            self.plan,
            journal=journal,
            prefetch=self.plan.concurrency,
            strict=self.strict,
            ledger=ledger,
            resolve=router.resolve,
        )
        await source.start()
        self.source = source
        failed: BaseException | None = None
        try:
            self._fleet_start = dict(source.progress.datasets)
            for spec in self.plan.datasets:
                params = self.plan.params_for(spec).request_params()
                max_tokens = int(params.pop("max_tokens"))
                self._datasets.append(
                    DatasetRun(
                        spec=spec,
                        params=params,
                        max_tokens=max_tokens,
                        reader=None,
                        prompts=iter(()),
                        tally=source.tally(spec.name),
                        counter=Counter(),
                        relocate=False,
                        pricer=InFlightPricer(max_tokens),
                    )
                )
            await self._dispatch(source.journal, router)
        finally:
            # Given back, acknowledged, heartbeat stopped: before the journal closes.
            try:
                await source.close()
            except Exception as exc:
                failed = exc
        if failed is not None:
            log.error("batch.fleet_failed", error=describe_error(failed))
            if self._reason in (None, StopReason.COMPLETE, StopReason.INCOMPLETE):
                self._reason = StopReason.ERROR
                self._message = f"the fleet's Redis failed: {describe_error(failed)}"
        else:
            with contextlib.suppress(Exception):  # a last look for the summary only
                await source.refresh()
        for ds in self._datasets:
            ds.tally = source.tally(ds.spec.name)

    async def _count_lines(self, dataset: DatasetRun) -> None:
        try:
            counts = [await asyncio.to_thread(count_lines, p) for p in dataset.spec.inputs]
        except OSError:
            return
        dataset.lines = sum(counts)

    def _background(self, task: asyncio.Future[None]) -> None:
        # Progress counting only: never awaited, never allowed to fail the run.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    # --- dispatching -----------------------------------------------------------------------

    def _next(self, journal: FileJournal, start: int) -> tuple[DatasetRun, Prompt] | None:
        count = len(self._datasets)
        for step in range(count):
            ds = self._datasets[(start + step) % count]
            name = ds.spec.name
            while ds.can_send():
                prompt = next(ds.prompts, None)
                if prompt is None:
                    ds.exhausted = True
                    break
                if journal.claim(name, prompt.id):
                    return ds, prompt
                if ds.relocate and journal.is_done(name, prompt.id):
                    journal.relocate(name, prompt.id, prompt.location)
        return None

    async def _next_claimed(
        self, journal: Journal, items: AsyncIterator[WorkItem]
    ) -> tuple[DatasetRun, Prompt] | None:
        """The next prompt the fleet gives this worker, or None when it has no more."""
        source = self.source
        assert source is not None
        by_name = {ds.spec.name: ds for ds in self._datasets}
        while self._reason is None:
            for ds in self._datasets:
                ds.tally = journal.tally(ds.spec.name)
                if reached(ds.spec, ds.tally.completed, ds.tally.output_tokens):
                    source.exclude(ds.spec.name)  # for the whole fleet: its tally is shared
                elif ds.spec.target_output_tokens is not None:
                    # Redis prices every worker's claimed prompts at this worker's figure.
                    source.price(ds.spec.name, ds.pricer.terms())
            try:
                item = await anext(items, None)
            except Exception as exc:  # the fleet's Redis failed for good: stop, loudly
                log.error("batch.fleet_failed", error=describe_error(exc))
                self.stop(StopReason.ERROR, f"the fleet's Redis failed: {describe_error(exc)}")
                return None
            if item is None:
                if self._reason is None:
                    for ds in self._datasets:
                        ds.exhausted = True
                return None
            ds = by_name[item.dataset]
            # Near a target, wait for requests in flight to land (each wake is one
            # landing) rather than overshoot; once reached, the prompt goes back.
            while not ds.can_send() and self._reason is None:
                ds.tally = journal.tally(ds.spec.name)
                if reached(ds.spec, ds.tally.completed, ds.tally.output_tokens):
                    source.exclude(ds.spec.name)
                    break
                self._wake.clear()
                await self._wake.wait()
            if self._reason is not None or not ds.can_send():
                source.put_back(item)
                continue
            if journal.claim(ds.spec.name, item.prompt.id):
                return ds, item.prompt
        return None

    async def _dispatch(self, journal: Journal, router: Router) -> None:
        # A plain count of requests running, not an asyncio.Semaphore: each finished
        # request sets `_wake`, and one wake-up refills every slot freed since (the
        # semaphore's per-slot wake-ups and scans cost more than its bookkeeping).
        concurrency = self.plan.concurrency
        turn = itertools.count()
        items = aiter(self.source) if self.source is not None else None
        while self._reason is None:
            if self._running >= concurrency:
                self._wake.clear()
                await self._wake.wait()
                continue
            if items is not None:
                picked = await self._next_claimed(journal, items)
                if picked is None:
                    break
            else:
                assert isinstance(journal, FileJournal)
                picked = self._next(journal, next(turn))
            if picked is None:
                # (A finished task leaves `_tasks` a loop turn later; `inflight` is exact.)
                if not any(ds.inflight for ds in self._datasets):
                    break
                self._wake.clear()
                await self._wake.wait()
                continue
            ds, prompt = picked
            ds.inflight += 1
            self._running += 1
            ticket = ds.pricer.sent()
            task = asyncio.ensure_future(self._one(journal, router, ds, prompt, ticket))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        journal.flush()
        if self._reason is None:
            unfinished = [
                d
                for d in self._datasets
                if (d.counter.failures or self.source is not None)
                and not d.done(self._fleet_tally(d))
            ]
            self._reason = StopReason.INCOMPLETE if unfinished else StopReason.COMPLETE
            if unfinished:
                self._message = "some prompts failed; run the same command again to retry them"

    def _check_targets(self) -> None:
        """A run that did every prompt and still missed a target says so (on final tallies)."""
        short = [d for d in self._datasets if d.short_of_target()]
        if self._reason is StopReason.COMPLETE and short:
            self._reason = StopReason.TARGET_NOT_REACHED
            self._message = (
                "; ".join(
                    f"{d.spec.name}: its prompts ran out at {d.tally.output_tokens:,} of "
                    f"{d.spec.target_output_tokens:,} target output tokens"
                    for d in short
                )
                + " (add prompts, or lower target_output_tokens)"
            )

    async def _one(
        self,
        journal: Journal,
        router: Router,
        ds: DatasetRun,
        prompt: Prompt,
        ticket: int,
    ) -> None:
        name = ds.spec.name
        landed: int | None = None
        counter = ds.counter
        started = time.time()
        counter.started(started)
        params = {**ds.params, **prompt.request_fields} if prompt.request_fields else ds.params
        try:
            result = await router.chat(
                prompt.messages,
                max_tokens=ds.max_tokens,
                key=f"{name}/{prompt.id}",
                stream=self.stream,
                **params,
            )
        except LedgerWriteError as exc:
            # Paid for and whole: keep and journal it (never sent again), then stop.
            self._completed(journal, ds, prompt, exc.result, started)
            self.stop(
                StopReason.ERROR,
                f"the ledger could not record a paid answer ({exc.__cause__!r}); the answer "
                "is kept and its reservation held for recovery",
            )
        except asyncio.CancelledError:
            journal.release(name, prompt.id, reason="abandoned")
            counter.failed("Abandoned")
            raise
        except BaseException as exc:
            # Counted (and a stop for money decided) first: a fleet gives the prompt
            # back as unsent, not as failed, once its worker is stopping.
            self._failed(ds, exc)
            journal.release(name, prompt.id, reason=type(exc).__name__)
            if not isinstance(exc, Exception):
                raise
        else:
            landed = self._completed(journal, ds, prompt, result, started, params.get("tools"))
            if router.halted is not None:  # a cost anomaly, violations in a row
                self.stop(StopReason.ERROR, f"stopped: {router.halted}")
        finally:
            ds.pricer.landed(ticket, landed)
            ds.inflight -= 1
            self._running -= 1
            counter.ended(time.time())
            self._wake.set()

    def _failed(self, ds: DatasetRun, exc: BaseException) -> None:
        # Out of money is not a failure of the prompt: it was never sent.
        if isinstance(exc, BudgetExhausted):
            self._refused = max(self._refused, exc.requested)
            used_up = f"the budget of {format_usd(self.budget)} is used up"
            self.stop(StopReason.BUDGET, f"{used_up}: {exc}")
            return
        if isinstance(exc, CreditsExhausted):
            self.stop(StopReason.CREDITS, f"OpenRouter's credits ran out: {exc}")
            return
        kind = type(exc).__name__
        retries = 0
        if isinstance(exc, AllAttemptsFailed):
            retries = len(exc.exceptions) - 1
            kind = type(exc.exceptions[-1]).__name__
        ds.counter.failed(kind, retries)
        provider = getattr(exc, "provider_name", None)
        if provider:
            self._provider(provider).failed(kind, retries)
        if isinstance(exc, AuthenticationError):
            self.stop(
                StopReason.ERROR,
                f"stopped: {exc}: OpenRouter rejected the API key; set {ENV_API_KEY} "
                "to a valid key (https://openrouter.ai/keys)",
            )
        elif isinstance(exc, _FATAL):
            self.stop(StopReason.ERROR, f"stopped: {exc}")
        elif not isinstance(exc, ProviderRouterError):
            log.error("batch.unexpected_error", dataset=ds.spec.name, error=repr(exc))

    def _completed(
        self,
        journal: Journal,
        ds: DatasetRun,
        prompt: Prompt,
        result: ChatResult,
        started: float,
        tools: list[JSONObject] | None = None,
    ) -> int | None:
        """Journal and count an answer; its output tokens, or None if it was not accepted."""
        finished = time.time()
        usage = result.usage
        prompt_tokens = usage.prompt_tokens if usage else 0
        output_tokens = usage.completion_tokens if usage else 0
        reasoning_tokens = usage.reasoning_tokens if usage else 0
        cost = result.cost if result.cost is not None else Decimal(0)
        provider = self._provider(result.provider or "unknown")
        provider.started(started)
        provider.ended(finished)
        if result.quarantined:
            # Never accepted as data: the prompt runs again (a later run may route it well).
            journal.release(ds.spec.name, prompt.id, reason="policy_violation")
            ds.counter.failed("PolicyViolation", result.attempts - 1)
            provider.failed("PolicyViolation", result.attempts - 1)
            provider.cost += cost
            return None
        record = make_record(
            prompt_id=prompt.id,
            dataset=ds.spec.name,
            messages=prompt.messages,
            text=result.text,
            reasoning=result.reasoning,
            finish_reason=result.finish_reason,
            provider=result.provider,
            model=self.plan.model,
            served_model=result.model,
            generation_id=result.generation_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=output_tokens,
            reasoning_tokens=reasoning_tokens,
            cached_tokens=usage.cached_tokens if usage else 0,
            cost=cost,
            metadata=prompt.metadata,
            started_at=started,
            finished_at=finished,
            tool_calls=[call.message() for call in result.tool_calls],
            tools=tools,
        )
        journal.complete(
            ds.spec.name,
            prompt.id,
            encode_record(record),
            output_tokens=output_tokens,
            prompt_tokens=prompt_tokens,
            cost_units=to_units(cost),
            location=prompt.location,
        )
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush, journal)
        retries = result.attempts - 1
        for counter in (ds.counter, provider):
            counter.requests += 1
            counter.prompt_tokens += prompt_tokens
            counter.output_tokens += output_tokens
            counter.reasoning_tokens += reasoning_tokens
            counter.cost += cost
            counter.retries += retries
        return output_tokens

    def _flush(self, journal: Journal) -> None:
        self._flush_pending = False
        try:
            journal.flush()
        except OSError as exc:
            # A full disk: stop sending (every answer now would be paid for and not
            # kept); the ledger holds the money, the next run resends what was lost.
            if self._reason is not StopReason.ERROR:
                self.stop(
                    StopReason.ERROR,
                    f"cannot write the job's files in {self.out} ({exc.strerror or exc}); "
                    "free some space",
                )

    def _provider(self, name: str) -> Counter:
        counter = self._providers.get(name)
        if counter is None:
            counter = self._providers[name] = Counter()
        return counter

    # --- reporting ----------------------------------------------------------------------------

    def _fleet_tally(self, ds: DatasetRun) -> FleetTally | None:
        if self.source is None:
            return None
        return self.source.progress.datasets.get(ds.spec.name, FleetTally())

    def _fleet_rates(self, ds: DatasetRun, tally: DatasetTally) -> Counter:
        """The fleet's work since this worker started, for rates and ETAs (with our failures)."""
        start = self._fleet_start.get(ds.spec.name, FleetTally())
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

    def progress(self) -> RunProgress:
        """A snapshot for the progress display (cheap; call it a few times a second)."""
        failures: dict[str, int] = {}
        retries = 0
        datasets = []
        source = self.source
        for ds in self._datasets:
            for kind, n in ds.counter.failures_by_kind.items():
                failures[kind] = failures.get(kind, 0) + n
            retries += ds.counter.retries
            tally, run, in_flight = ds.tally, ds.counter, ds.inflight
            fleet = self._fleet_tally(ds)
            if source is not None and fleet is not None:
                tally = source.tally(ds.spec.name)
                run = self._fleet_rates(ds, tally)
                in_flight = fleet.in_flight
            datasets.append(
                DatasetProgress(
                    name=ds.spec.name,
                    completed=tally.completed,
                    total=ds.total(self._fleet_tally(ds)),
                    output_tokens=tally.output_tokens,
                    target_output_tokens=ds.spec.target_output_tokens,
                    in_flight=in_flight,
                    cost=from_units(tally.cost_units),
                    run=run,
                    finished=ds.done(self._fleet_tally(ds)) or (ds.exhausted and ds.inflight == 0),
                )
            )
        errors = rate_limited = 0
        if self.router is not None:
            for stats in self.router.health.snapshot().values():
                errors += stats.errors
                rate_limited += stats.rate_limited
        return RunProgress(
            datasets=tuple(datasets),
            elapsed=time.monotonic() - self._started,
            ledger=self.ledger_state,
            in_flight=len(self._tasks),
            stopping=self._reason,
            failures_by_kind=failures,
            retries=retries,
            rate_limited=rate_limited,
            errors=errors,
            workers=None if source is None else source.progress.workers,
        )

    def _summary(self) -> RunSummary:
        reports = []
        for ds in self._datasets:
            reports.append(
                DatasetReport(
                    name=ds.spec.name,
                    prompts=ds.total(self._fleet_tally(ds)),
                    completed=ds.tally.completed,
                    output_tokens=ds.tally.output_tokens,
                    cost=from_units(ds.tally.cost_units),
                    target_output_tokens=ds.spec.target_output_tokens,
                    max_requests=ds.spec.max_requests,
                    bad_lines=self._bad_lines(ds),
                    lost=ds.tally.lost,
                    run=ds.counter,
                )
            )
        cost = sum((r.cost for r in reports), Decimal(0))
        tokens = sum(r.output_tokens for r in reports)
        fallback = cost / tokens if tokens else None
        for report in reports:
            report.to_finish = money_to_finish(report, fallback)
        unknown = any(r.to_finish is None for r in reports)
        to_finish = (
            None if unknown else sum((r.to_finish or Decimal(0) for r in reports), Decimal(0))
        )
        health: dict[str, dict[str, Any]] = {}
        if self.router is not None:
            for name, stats in self.router.health.snapshot().items():
                health[name] = {"errors": stats.errors, "rate_limited": stats.rate_limited}
        state = self.ledger_state
        reason = self._reason or StopReason.COMPLETE
        message = self._message
        spent = state.spent if state else Decimal(0)
        needed = budget_to_finish(spent, to_finish, self._refused)
        if reason in (StopReason.BUDGET, StopReason.CREDITS):
            message += finish_hint(reason, self.budget, spent, needed, self._refused)
        elif reason not in (StopReason.COMPLETE, StopReason.TARGET_NOT_REACHED):
            message += "; run the same command again to resume"
        if self._fleet is not None:
            bad = [str(p) for p in self._fleet.load_problems]
        else:
            bad = [str(p) for ds in self._datasets if ds.reader for p in ds.reader.problems]
        summary = RunSummary(
            reason=reason,
            datasets=reports,
            providers=dict(self._providers),
            provider_health=health,
            budget=self.budget,
            spent=spent,
            reserved=state.reserved if state else Decimal(0),
            to_finish=to_finish,
            budget_to_finish=needed,
            wall_time=time.monotonic() - self._started,
            bad_lines=bad,
            recovered=list(self._recovered),
            message=message.lstrip("; "),
            fleet=self._fleet_report(),
            preflight=from_units(self.journal.preflight_units) if self.journal else Decimal(0),
        )
        summary.write(self.out / SUMMARY_FILE)
        return summary

    def _write_report(self) -> None:
        """``report.html`` beside ``summary.json``; a failure costs the page, not the run."""
        try:
            write_report(self.out)
        except Exception as exc:
            log.warning("batch.report_failed", error=repr(exc))

    def _bad_lines(self, ds: DatasetRun) -> int:
        fleet = self._fleet_tally(ds)
        if fleet is not None:
            return fleet.bad_lines
        return ds.reader.bad_lines if ds.reader is not None else 0

    def _fleet_report(self) -> dict[str, Any] | None:
        """The fleet's side of the summary: who did what, what is left (None outside a fleet)."""
        source = self.source
        if source is None:
            return None
        progress = source.progress
        return {
            "name": source.queue.name,
            "worker": source.queue.worker,
            "workers": progress.workers,
            "this_worker": {
                "completed": sum(ds.counter.requests for ds in self._datasets),
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


def _fingerprint(paths: tuple[Path, ...]) -> list[Any]:
    fingerprint: list[Any] = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            fingerprint.append([str(path), None, None])
            continue
        fingerprint.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
    return fingerprint
