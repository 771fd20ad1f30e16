"""The job runner: a plan's datasets through the routed, budgeted client, exactly once.

:class:`JobRunner` keeps up to ``plan.concurrency`` of the datasets' prompts in flight
on one :class:`~provider_router.Router`, each reserving its worst case from the job's
ledger (the budget is its limit) and committed to the journal and its output file once
answered, so a run stopped in any way resumes with nothing paid for lost or sent twice.

This module is the order of a run: open the journal and the ledger, recover, start the
router, dispatch, end. Each step is a module of its own (``datasets``, ``dispatch``,
``outcomes``, ``snapshots``, ``store/``). What watches the run is the observers it is
given (:mod:`~provider_router.jobs.events`), told when it starts and ends, never per
request: the runner imports none of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Collection, Mapping, Sequence
from decimal import Decimal
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from provider_router._deprecated import resolve_old_name
from provider_router._exceptions import ConfigurationError, LedgerUnavailableError, PreflightFailed
from provider_router._money import from_units
from provider_router.catalog.verdicts import VerificationReport
from provider_router.checks.preflight import PreflightReport, preflight
from provider_router.checks.verify import DEFAULT_SAMPLES
from provider_router.client._response_cache import cache_headers
from provider_router.client.metrics import Metrics
from provider_router.client.router import Router
from provider_router.jobs.batch_api.reuse import reuse_kept_for_plan
from provider_router.jobs.budget import apply_choice, choose_limit, choose_share, public_url
from provider_router.jobs.datasets import DatasetRun, open_file_datasets, validate_inputs
from provider_router.jobs.dispatch import Dispatcher
from provider_router.jobs.drift import DEFAULT_VERIFY_EVERY, DriftWatch, redo_flagging
from provider_router.jobs.drift_history import DriftHistory
from provider_router.jobs.events import RunObserver
from provider_router.jobs.identity import IdentityCheck, check_identity
from provider_router.jobs.job_key import JobKey
from provider_router.jobs.ledger_share import LedgerShare
from provider_router.jobs.outcomes import Outcomes
from provider_router.jobs.redo import redo_truncated
from provider_router.jobs.revisions import revise_plan
from provider_router.jobs.router_options import openrouter_summary, router_options
from provider_router.jobs.snapshots import (
    DatasetProgress,
    RunProgress,
    progress_snapshot,
    summarize,
)
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.job_ledger import check_not_behind, open_job_ledger
from provider_router.jobs.store.journal import FileJournal, Journal
from provider_router.jobs.store.recovery import (
    account_check,
    correct_account,
    journal_repairs,
    reconcile_crashed,
)
from provider_router.jobs.summary import RunSummary, SharedLedger, StopReason
from provider_router.ledger import Ledger, LedgerState
from provider_router.planning.plan import Plan
from provider_router.planning.prompts import PromptReader
from provider_router.routing.policy import ProviderPolicy

__all__ = ["JobRunner", "DatasetProgress", "RunProgress"]


class JobRunner:
    """Run a :class:`~provider_router.planning.plan.Plan` into a job directory.

    Args:
        plan: what to generate (must have a budget).
        out: the job directory: outputs, journal, ledger and summary go there.
        strict: read every input line before spending anything and fail on the
            first bad one (default: skip bad lines and report them).
        base_url, api_key: OpenRouter's (defaults from the environment).
        router_options: further :class:`~provider_router.Router` keyword arguments.
        ledger: a ledger to use instead of ``<out>/ledger.sqlite`` (given the plan's
            budget by the rules of :mod:`provider_router.jobs.budget`), e.g. a shared
            :class:`~provider_router.RedisLedger`: when the plan names it (``ledger:``)
            its limit is left as it is and the run keeps to its own budget inside it
            (:class:`~provider_router.jobs.ledger_share.LedgerShare`). The caller
            closes it.
        stream: send streaming requests (default). Each answer's generation id is
            then durable on its reservation within one ledger commit of its first
            byte, so recovery after a crash settles it at its real cost; ``False``
            sends plain JSON requests (a crash then counts those in flight at their
            worst case).
        account_horizon: the API key is the run's own: worst-case charges (requests
            cut before their generation id was known) are bounded by the key's usage
            (``GET /key``) this many seconds after each was given up on
            (:mod:`provider_router.jobs.store.account`); negative: the stream deadline.
        observers: what watches the run (:class:`~provider_router.jobs.events.RunObserver`),
            told of its start and end in this order; none by default, so the run writes
            its outputs and ``summary.json`` only.
            :func:`~provider_router.jobs.observe.standard.standard_observers` are what
            ``provider-router run`` leaves besides: ``timeline.ndjson`` (the time series
            ``report.html`` and ``provider-router status`` read) and ``report.html``.
        verify: measure every allowed endpoint against the model's reference before
            any prompt is sent (:func:`provider_router.verify`, canaries from the first
            dataset, paid from the job's ledger), save ``<out>/verify.json``, and send
            nothing to an endpoint that failed it; then again every ``verify_every``
            rows (:mod:`provider_router.jobs.drift`): an endpoint that fails a later
            check is excluded from then on and the rows its provider served since its
            last passing check are flagged (``drift_flagged`` in the output).
        verify_every: rows between two checks with ``verify`` (default: the plan's
            ``verify_every``, else 1,000; 0: only before the run).
        only: send just these prompt ids of each dataset (a pilot:
            :func:`provider_router.jobs.pilot.pilot_into_job`): their spend is the
            job's, their answers its first results; a later run sends the rest.
        redo_truncated: before anything is sent, move the answers cut at a
            ``max_tokens`` below the plan's out of the outputs (kept in
            ``set_aside/truncated/``), so this run sends them again with the plan's cap
            (:mod:`provider_router.jobs.redo`; ``run --redo-truncated``).
        raise_budget: the plan's budget may raise a limit set outside the job's runs
            (``ledger topup``); without it such a raise is refused
            (:mod:`provider_router.jobs.budget`, ``run --raise-budget``).
        job_key: the key made for this run (``run --job-key``,
            :class:`~provider_router.jobs.job_key.JobKeyLease`): requests go with it
            instead of ``api_key``, and its limit, what the budget had left, used up
            is the budget's stop.

    Besides the outputs, a run writes ``summary.json``; its observers write the rest
    (:func:`~provider_router.jobs.run.run_plan` gives it the standard ones, and runs the
    plan's Batch API datasets too).

    Example::

        from provider_router.jobs import JobRunner, standard_observers

        runner = JobRunner(load_plan("plan.yaml"), "runs/b3", observers=standard_observers())
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
        stream: bool = True,
        observers: Sequence[RunObserver] = (),
        account_horizon: float | None = None,
        preflight: bool = False,
        only: Mapping[str, Collection[str]] | None = None,
        verify: bool = False,
        verify_every: int | None = None,
        redo_truncated: bool = False,
        raise_budget: bool = False,
        job_key: JobKey | None = None,
    ) -> None:
        if plan.budget is None:
            raise ConfigurationError("a run needs a budget (--budget USD or `budget:` in the plan)")
        self._only = only
        self.redo_truncated = redo_truncated
        self.plan = plan
        self.budget: Decimal = plan.budget
        """What the run spends within: the plan's budget, or the limit that stands
        (:mod:`provider_router.jobs.budget`) once the ledger is open."""
        self.raise_budget = raise_budget
        self.out = Path(out)
        self.layout = JobLayout(self.out)
        """Where each file of the job directory is."""
        self.strict = strict
        self.stream = stream
        """Stream answers (the default): the generation id arrives with the first
        byte and is on the reservation before the answer is done, so a crash costs
        what it really cost (recovery asks ``/generation``)."""
        self.account_horizon = account_horizon
        """Seconds after which a request given up on can no longer be billed, when the
        key is the run's own (see :mod:`provider_router.jobs.store.account`); ``None``: off;
        negative: the stream deadline of the plan's ``max_tokens``."""
        self.preflight = preflight
        """Run :func:`~provider_router.checks.preflight.preflight` first, its 1-token request
        reserved and settled in the job's ledger; a failed check raises
        :class:`~provider_router.checks.preflight.PreflightFailed` before any prompt is sent."""
        self.preflight_report: PreflightReport | None = None
        self.verify = verify
        """Measure every allowed endpoint against the model's reference first
        (:func:`~provider_router.verify`, canaries from the first dataset, paid from the
        job's ledger), save the report as ``<out>/verify.json``, and exclude the
        endpoints that failed it from this run (docs/policy.md, "Measured fidelity")."""
        self.verification: VerificationReport | None = None
        if verify_every is None:
            verify_every = plan.verify_every
        if verify_every is None:
            verify_every = DEFAULT_VERIFY_EVERY
        if verify_every < 0:
            raise ConfigurationError(f"verify_every must be ≥ 0 rows, got {verify_every}")
        self.verify_every = verify_every or None
        """Rows between two checks during a run with :attr:`verify` (None: only before it)."""
        self.drift: DriftWatch | None = None
        self._history = DriftHistory()
        self._base_url = base_url
        self._api_key: str | SecretStr | None = api_key if job_key is None else job_key.secret
        self._router_options = dict(router_options or {})
        self._given_ledger = ledger
        self.observers: tuple[RunObserver, ...] = tuple(observers)
        """What watches the run, told of its start and end in this order."""
        self.ledger: Ledger | None = None
        self.router: Router | None = None
        self.journal: FileJournal | None = None
        self._outcomes = Outcomes(self, model=plan.model, budget=self.budget, out=self.out)
        self._outcomes.job_key = job_key is not None
        self._dispatcher = Dispatcher(self._outcomes)
        # The dispatcher's own list, under the name tests and bench/ read it by.
        self._datasets: list[DatasetRun] = self._dispatcher.datasets
        self._started = time.monotonic()
        self._recovered: list[str] = []
        self._identity: IdentityCheck | None = None
        self.ledger_state: LedgerState | None = None

    # --- control ----------------------------------------------------------------------

    def stop(self, reason: StopReason = StopReason.INTERRUPTED, message: str = "") -> None:
        """Stop taking new work; requests in flight finish (the first Ctrl-C)."""
        self._dispatcher.stop(reason, message)

    def abandon(self) -> None:
        """Cancel requests in flight (the second Ctrl-C); they are counted at worst case."""
        self._dispatcher.abandon()
        if self.drift is not None:
            self.drift.abandon()

    @property
    def stopping(self) -> StopReason | None:
        """Why the runner stopped taking work, or None while it runs."""
        return self._dispatcher.reason

    # --- the run -------------------------------------------------------------------------

    async def run(self) -> RunSummary:
        """Run the plan until it is done, the money runs out, or :meth:`stop` is called.

        Raises:
            DataFileError: with ``strict``, the first bad input line (nothing is spent).
            ConfigurationError: the directory is in use or holds foreign outputs.
            OSError: the job's files or its ledger's file could not be written (a full
                disk), once the rest is written: nothing paid for is lost (the answers
                are journaled, the ledger's reservations held); free some space and run
                again to resume.
            ProviderRouterError: the router could not start (e.g. a rejected key).
        """
        self._started = time.monotonic()
        names = [d.name for d in self.plan.datasets]
        ProviderPolicy(**self.plan.policy)  # a bad policy is refused before any file is made
        # Everything that can refuse the start is checked before the first byte is
        # written: the journal is read (not repaired), the outputs and inputs checked,
        # the ledger opened and matched to the journal; only then does the journal begin.
        journal = self.journal = FileJournal.read(self.out)
        reason = "error"
        try:
            # What the job is, refused if this run would change what its outputs answer
            # (written once the journal begins).
            self._identity = check_identity(
                self.plan, self.out, add_inputs=True, redo_truncated=self.redo_truncated
            )
            # A damaged verify.json is refused before the journal begins (it keeps exclusions).
            self._history = await asyncio.to_thread(DriftHistory.load, self.layout.verify)
            gone = journal.excluded - set(self._history.failed)
            if gone:  # an exclusion never lapses because a file went missing
                raise ConfigurationError(
                    f"{self.layout.verify} does not list {', '.join(sorted(gone))}, which "
                    "failed verification in an earlier run of this job (its journal says so): "
                    "restore the job's verify.json; nothing was sent"
                )
            journal.check_outputs(names)
            if self.strict:
                await asyncio.to_thread(validate_inputs, self.plan)
            try:
                summary = await self._run_with_ledger(journal, names)
            except Exception as exc:  # the ledger's disk full outside dispatch (recovery...)
                if not self._outcomes.ledger_full(exc):
                    raise
                assert self._outcomes.disk_error is not None
                raise self._outcomes.disk_error from exc
            reason = summary.reason.value
            if self._outcomes.disk_error is not None:
                # Stopped on it with everything else written: the CLI says it in one line.
                raise self._outcomes.disk_error
            return summary
        finally:
            try:
                journal.close(reason)
            except OSError as exc:  # name the directory: the CLI says it in one line
                raise OSError(exc.errno, exc.strerror, str(self.out)) from exc

    async def _open_ledger(self, journal: FileJournal, names: list[str]) -> Ledger:
        """The job's ledger, matched to its journal, its budget chosen (a refusal leaves
        every file as it was); then the journal begins. On a ledger other runs share,
        the run spends through its job's own cap (:class:`LedgerShare`)."""
        ledger = await open_job_ledger(
            self.layout.ledger, self.budget, self.journal, self._given_ledger
        )
        try:
            where = str(getattr(ledger, "path", None) or ledger)
            state = await ledger.snapshot()
            shared = self._shared_ledger()
            if shared is None:
                choice = choose_limit(
                    self.budget, state, journal.budget, raise_limit=self.raise_budget, where=where
                )
            else:
                spent = journal.committed_cost
                choice = choose_share(self.budget, state, spent, journal.budget, shared=shared)
            journal.begin()
            if self._identity is not None:
                self._recovered += self._identity.write(self.out)
            self._recovered += journal_repairs(journal)
            journal.prepare(names)
            if self.redo_truncated:
                self._recovered += redo_truncated(journal, self.plan, self.out)
            self._outcomes.ledger_name = where
            self._recovered += await apply_choice(ledger, choice, journal)
            self.budget = self._outcomes.budget = choice.budget
            if shared is not None:
                self._outcomes.shared = shared.name
                share = LedgerShare(ledger, cap=choice.budget, spent=journal.committed_cost)
                return await share.__aenter__()
        except BaseException:
            if self._given_ledger is None:
                await ledger.close()
            raise
        return ledger

    def _shared_ledger(self) -> SharedLedger | None:
        """The ledger other runs share, when the plan names one and the run was given it."""
        name = self.plan.shared_ledger_name
        if self.plan.ledger is None or self._given_ledger is None or name is None:
            return None
        return SharedLedger(name, public_url(self.plan.ledger))

    async def _run_with_ledger(self, journal: FileJournal, names: list[str]) -> RunSummary:
        ledger = self.ledger = await self._open_ledger(journal, names)
        try:
            if self.preflight:
                await self._preflight(ledger, journal)
            policy = ProviderPolicy(**self.plan.policy)
            if self.verify:
                policy = await self._verify(ledger, policy, journal, names)
            else:
                policy = await self._kept_exclusions(policy, journal, names)
            options: dict[str, Any] = {
                "budget_wait": True,
                "cache_affinity": self.plan.cache_affinity,
                **router_options(self.plan),
                **self._router_options,
            }
            if self.plan.response_cache is not None:
                options["headers"] = {
                    **options.get("headers", {}),
                    **cache_headers(self.plan.response_cache),
                }
            router = Router(
                self.plan.model,
                policy=policy,
                ledger=ledger,
                max_concurrency=self.plan.concurrency,
                base_url=self._base_url,
                api_key=self._api_key,
                max_premium=self.plan.max_premium,
                **options,
            )
            async with router:
                self.router = router
                if self.drift is not None:
                    self.drift.router = router
                    self.drift.publish()  # the check before the run, on Prometheus
                report, notes = await reconcile_crashed(ledger, router, self.journal)
                self._recovered += notes
                book = ledger.shared if isinstance(ledger, LedgerShare) else ledger
                check_not_behind(book, journal, await book.snapshot())
                account = account_check(
                    self.plan, self.out, router, ledger, horizon=self.account_horizon
                )
                if account is not None:
                    await account.start(report.worst_case)
                # Done prompts whose content changed under their id: moved aside, sent again.
                self._recovered += revise_plan(self.plan, journal, self.out)
                # Paid answers kept aside whose prompts are back: written, not sent again.
                self._recovered += reuse_kept_for_plan(
                    self.plan, journal, self.out, clock=time.time
                )
                try:
                    for observer in self.observers:
                        await observer.on_start(self)
                    self._datasets.extend(open_file_datasets(self.plan, journal, only=self._only))
                    await self._dispatch(journal, router)
                    self._dispatcher.check_targets()
                finally:
                    for observer in self.observers:
                        await observer.on_dispatch_end(self)
                if account is not None:
                    self._recovered += await correct_account(account)
            self._money_certain(ledger)
            for dataset in self._datasets:  # every prompt counts in what is left to do
                await dataset.counted()
            try:
                self.ledger_state = await ledger.snapshot()
            except LedgerUnavailableError as exc:  # the run stops on it; say so once
                self.stop(StopReason.ERROR, f"stopped: {exc}")
            except Exception as exc:
                if not self._outcomes.ledger_full(exc):  # a full disk: stopped on it already
                    raise
            summary = self._summary()
            for observer in self.observers:
                observer.on_summary(self, summary)
            summary.write(self.layout.summary)
            for observer in self.observers:
                await observer.on_end(self, summary)
            return summary
        finally:
            if self._given_ledger is None or isinstance(ledger, LedgerShare):
                await ledger.close()  # a share closes its own book, not the shared ledger

    def _money_certain(self, ledger: Ledger) -> None:
        """A run whose ledger failed to record money does not end as a clean one."""
        failures = getattr(ledger, "write_failures", None)
        if failures is None or not failures.uncertain:
            return
        self._dispatcher.fail(
            f"the ledger {self._outcomes.ledger_name} failed {failures.count} write(s) "
            f"(the first: {failures.first}), so what it recorded may differ from what "
            "was spent: run the same command again to reconcile it"
        )

    async def _verify(
        self, ledger: Ledger, policy: ProviderPolicy, journal: FileJournal, names: list[str]
    ) -> ProviderPolicy:
        """The verification, paid from the job's ledger: the policy that excludes what failed
        (in this run and every earlier one of the job, ``<out>/verify.json``)."""
        first = self.plan.datasets[0]

        def canaries() -> list[Any]:
            prompts = islice(PromptReader(list(first.inputs)), DEFAULT_SAMPLES)
            return [prompt.messages for prompt in prompts]

        drift = self.drift = DriftWatch(
            self.out,
            self._history,
            model=self.plan.model,
            policy=policy,
            canaries=await asyncio.to_thread(canaries),
            every=self.verify_every,
            ledger=ledger,
            base_url=self._base_url,
            api_key=self._api_key,
            stop=lambda message: self.stop(StopReason.ERROR, message),
        )
        drift.journal = journal
        drift.stopping = lambda: self.stopping is not None
        drift.datasets = names
        self._outcomes.drift = drift
        policy = await drift.start()
        self._recovered += drift.redone
        self.verification = drift.history.report
        return policy

    async def _kept_exclusions(
        self, policy: ProviderPolicy, journal: FileJournal, names: list[str]
    ) -> ProviderPolicy:
        """Without ``verify``: what an earlier ``--verify`` run of the job excluded stays
        excluded (a resume never lets a provider that failed serve again unasked), and a
        flagging a kill cut short is done again (its rows need no check, only the history)."""
        history = self._history
        redone = await redo_flagging(self.out, names, history, journal)
        if redone:
            await asyncio.to_thread(history.save, self.layout.verify)
            self._recovered += redone
        if history.report is None or not history.failed:
            return policy
        self.verification = history.report
        self._recovered.append(
            f"kept excluded: {', '.join(sorted(history.failed))} (failed verification in an "
            f"earlier run; {self.layout.verify})"
        )
        return dataclasses.replace(policy, verified=history.report)

    async def _end_checks(self, drift: DriftWatch) -> None:
        """The check under way awaited; a run that did its work checks what it served last."""
        if self._dispatcher.reason is StopReason.ABANDONED:
            drift.abandon()
        done = (StopReason.COMPLETE, StopReason.INCOMPLETE)
        await drift.finish(complete=self._dispatcher.reason in done)
        self.verification = drift.history.report

    async def _preflight(self, ledger: Ledger, journal: FileJournal) -> None:
        """The preflight, paid from the job's ledger (on every run: it costs < $0.001)."""
        report = self.preflight_report = await preflight(
            self.plan.model,
            ProviderPolicy(**self.plan.policy),
            base_url=self._base_url,
            api_key=self._api_key,
            ledger=ledger,
            sleep=self._router_options.get("sleep", asyncio.sleep),
        )
        if report.cost:
            journal.note_preflight(report.cost)
        verdict = report.verdict
        if verdict is not None and verdict.disputed is not None:
            journal.note_disputed(
                "preflight", verdict.generation_id, verdict.disputed, verdict.booked
            )
        if not report.ok:
            raise PreflightFailed(report)

    async def _dispatch(self, journal: Journal, router: Router) -> None:
        try:
            await self._dispatcher.run(
                journal, router, concurrency=self.plan.concurrency, stream=self.stream
            )
        except BaseException:
            if self.drift is not None:  # no check outlives the run
                self.drift.abandon()
            raise
        if self.drift is not None:
            await self._end_checks(self.drift)

    # --- reporting ----------------------------------------------------------------------------

    @property
    def metrics(self) -> Metrics | None:
        """The Router's Prometheus metrics, if it has them (the timeline keeps them fresh)."""
        return None if self.router is None else self.router.metrics

    def progress(self) -> RunProgress:
        """A snapshot for the progress display (cheap; call it a few times a second)."""
        return progress_snapshot(
            self._dispatcher,
            router=self.router,
            ledger_state=self.ledger_state,
            started=self._started,
        )

    def _summary(self) -> RunSummary:
        summary = summarize(
            self._dispatcher,
            self._outcomes,
            budget=self.budget,
            router=self.router,
            ledger_state=self.ledger_state,
            started=self._started,
            recovered=self._recovered,
            preflight=from_units(self.journal.preflight_units) if self.journal else Decimal(0),
            disputes=self.journal.disputes if self.journal else [],
            limit_outside=self._limit_outside(),
            shared=self._shared_at_end(),
        )
        if self.drift is not None:
            summary.verification = self.drift.summary()
        summary.openrouter = openrouter_summary(self.plan)
        return summary

    def _limit_outside(self) -> bool:
        """The job's own ledger ends with a limit its runs did not give it."""
        state, journal = self.ledger_state, self.journal
        if state is None or journal is None or isinstance(self.ledger, LedgerShare):
            return False
        return journal.budget is not None and state.limit != journal.budget

    def _shared_at_end(self) -> SharedLedger | None:
        shared = self._shared_ledger()
        ledger = self.ledger
        if shared is None or not isinstance(ledger, LedgerShare):
            return None
        state = ledger.shared_state
        if state is None:
            return shared
        return dataclasses.replace(
            shared, limit=state.limit, spent=state.spent, reserved=state.reserved
        )


if not TYPE_CHECKING:  # a type checker sees no old name, and says so

    def __getattr__(name: str) -> Any:
        # The runner's old name resolves for one more release, with a warning.
        if name == "BatchRunner":
            return resolve_old_name(f"{__name__}.{name}", "provider_router.jobs.JobRunner")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
