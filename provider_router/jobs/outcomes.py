"""What one finished request does to a run: its answer kept and counted, or its failure.

:class:`Outcomes` takes each request's end from the dispatcher. An answer is written
as an output record into the journal (flushed once per event-loop turn) and counted per
dataset and provider; an answer the router quarantined is never accepted as data, and
its prompt runs again. A failure is counted by kind; what no later request can escape
stops the run instead: the budget, the credits or another spend limit OpenRouter keeps
(a key's limit, a workspace or guardrail budget) used up, a rejected key, an unreachable
ledger, or a journal or ledger file that cannot be written (:attr:`Outcomes.disk_error`:
exit 74 on the command line). It stops the run through :class:`Control`, the runner's
own :meth:`stop`, so a stop decided here is the same stop as a Ctrl-C.
"""

from __future__ import annotations

import asyncio
import errno
import time
from decimal import Decimal
from pathlib import Path
from typing import Protocol

from provider_router._constants import ENV_API_KEY
from provider_router._exceptions import (
    AllAttemptsFailed,
    AuthenticationError,
    BudgetExhausted,
    ConfigurationError,
    CreditsExhausted,
    LedgerUnavailableError,
    ProviderRouterError,
    RouterStopping,
)
from provider_router._format import format_usd
from provider_router._log import get_logger
from provider_router._money import to_units
from provider_router._spend_limits import SpendLimit, SpendLimitKind
from provider_router._types import JSONObject
from provider_router.client.results import ChatResult
from provider_router.jobs.counter import Counter
from provider_router.jobs.datasets import DatasetRun
from provider_router.jobs.drift import DriftWatch
from provider_router.jobs.finish import credits_words
from provider_router.jobs.router_options import trace_fields
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.journal import Journal
from provider_router.jobs.store.outputs import TRUNCATED_FINISH, encode_record, make_record
from provider_router.jobs.summary import StopReason
from provider_router.planning.prompts import Prompt

__all__ = ["Control", "Outcomes"]

log = get_logger(__name__)

_FATAL = (AuthenticationError, ConfigurationError, LedgerUnavailableError)
"""Failures every other request would hit too: stop the run instead of counting them."""

_SQLITE_IOERR, _SQLITE_FULL = 10, 13  # primary result codes (an extended code's low byte)
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


def disk_failure(exc: BaseException) -> BaseException | None:
    """The full (or failing) disk under a ledger write in ``exc`` or its causes, or None.

    SQLite says ``database or disk is full`` (``SQLITE_FULL``) when a write finds no
    space, and ``disk I/O error`` (``SQLITE_IOERR_WRITE``) when the file may not grow
    (a file-size limit: ``EFBIG``); a :class:`~provider_router.LedgerWriteError` carries
    it as its cause. Recognised by its result code, without importing :mod:`sqlite3`.
    """
    seen: BaseException | None = exc
    for _ in range(4):  # the error, the LedgerWriteError's cause, ...: a short chain
        if seen is None:
            return None
        code = getattr(seen, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in (_SQLITE_IOERR, _SQLITE_FULL):
            return seen
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL_ERRNOS:
            return seen
        seen = seen.__cause__
    return None


def describe_disk_failure(cause: BaseException) -> str:
    """What went wrong under a ledger write, for a one-line message."""
    if isinstance(cause, OSError):
        return cause.strerror or str(cause)
    name = getattr(cause, "sqlite_errorname", "")
    said = f"SQLite: {cause}{f', {name}' if name else ''}"
    if getattr(cause, "sqlite_errorcode", 0) & 0xFF == _SQLITE_FULL:
        return f"the disk is full ({said})"
    return f"the disk is full or failing ({said})"


class Control(Protocol):
    """What an outcome may do to the run: stop it (the runner's :meth:`stop`)."""

    @property
    def stopping(self) -> StopReason | None: ...

    def stop(self, reason: StopReason = ..., message: str = "") -> None: ...


class Outcomes:
    """Keeps and counts what each request ended with (see the module docstring).

    Args:
        control: stops the run when an outcome calls for it.
        model: the plan's model (each output record names it).
        budget: the run's budget (named when it is used up).
        out: the job directory (named when its files cannot be written).
    """

    def __init__(self, control: Control, *, model: str, budget: Decimal, out: Path) -> None:
        self._control = control
        self._model = model
        self.budget = budget
        """The run's budget (named when it is used up; the runner sets the one in force)."""
        self.shared: str | None = None
        """The name of the ledger the run shares with others, if it does."""
        self._out = out
        self.providers: dict[str, Counter] = {}
        """This run's counter of each provider that answered or failed."""
        self.refused = Decimal(0)
        """The largest reservation the budget refused: a resume needs room for it."""
        self.largest_reserved = Decimal(0)
        """The largest worst case reserved for an answer of this run: a resume after a
        stop the budget did not make (OpenRouter's credits) needs room for one too."""
        self.ledger_name = str(JobLayout(out).ledger)
        """The ledger's file (the runner sets it once the ledger is open)."""
        self.disk_error: OSError | None = None
        """Set when the ledger's file could not be written (a full disk): the run stopped
        on it, and :meth:`JobRunner.run <provider_router.jobs.runner.JobRunner.run>`
        raises it once everything else is written (the CLI: one line, exit 74)."""
        self._flush_pending = False
        self.drift: DriftWatch | None = None
        """With ``run --verify``: stamps each row with its check and flag."""
        self.spend_limit: SpendLimit | None = None
        """The first limit OpenRouter keeps that stopped the run (what lifts it is said
        in the summary), or ``None``."""
        self.job_key = False
        """The run sends with a key made for it (``run --job-key``): its limit is what the
        budget had left, so that limit used up is the budget's stop."""

    def ledger_full(self, exc: BaseException) -> bool:
        """Stop the run if ``exc`` is the ledger's file failing to grow (a full disk).

        Every later request would fail the same way, before it is sent or, worse,
        after it is paid: stop sending. Paid answers are journaled by the caller
        (a :class:`~provider_router.LedgerWriteError` carries them); their
        reservations stay open in the ledger, settled by the next run's recovery.
        """
        cause = disk_failure(exc)
        if cause is None:
            return False
        if self.disk_error is None:
            what = f"{describe_disk_failure(cause)}; cannot write the ledger"
            code = cause.errno if isinstance(cause, OSError) and cause.errno else errno.ENOSPC
            self.disk_error = OSError(code, what, self.ledger_name)
            log.error("batch.ledger_disk_full", ledger=self.ledger_name, error=repr(cause))
            self._control.stop(
                StopReason.ERROR,
                f"{what} {self.ledger_name}: free some space, then run the same command "
                "again (paid answers are kept; their reservations are held for recovery)",
            )
        return True

    def failed(self, ds: DatasetRun, exc: BaseException) -> None:
        """Count a request that ended in ``exc``, or stop the run if it calls for that."""
        # Out of money is not a failure of the prompt: it was never sent.
        if isinstance(exc, BudgetExhausted):
            self.refused = max(self.refused, exc.requested)
            self._control.stop(StopReason.BUDGET, f"{self._used_up(exc.limit)}: {exc}")
            return
        if isinstance(exc, CreditsExhausted):
            self._spend_limit(exc)
            return
        if self.ledger_full(exc):  # nothing was sent, or its reservation stays held
            return
        if isinstance(exc, RouterStopping):
            # The run is stopping: the prompt is left for the next run, not failed.
            return
        kind = type(exc).__name__
        retries = 0
        if isinstance(exc, AllAttemptsFailed):
            retries = len(exc.exceptions) - 1
            kind = type(exc.exceptions[-1]).__name__
        ds.counter.failed(kind, retries)
        provider = getattr(exc, "provider_name", None)
        if provider:
            self.provider(provider).failed(kind, retries)
        if isinstance(exc, AuthenticationError):
            self._control.stop(
                StopReason.ERROR,
                f"stopped: {exc}: OpenRouter rejected the API key; set {ENV_API_KEY} "
                "to a valid key (https://openrouter.ai/keys)",
            )
        elif isinstance(exc, _FATAL):
            self._control.stop(StopReason.ERROR, f"stopped: {exc}")
        elif not isinstance(exc, ProviderRouterError):
            log.error("batch.unexpected_error", dataset=ds.spec.name, error=repr(exc))

    def _used_up(self, limit: Decimal) -> str:
        """Which budget ran out: the run's, a shared ledger's, or a limit set meanwhile."""
        if limit == self.budget:
            return f"the budget of {format_usd(self.budget)} is used up"
        if self.shared is not None:
            return (
                f"the shared ledger {self.shared!r} is used up (its limit of "
                f"{format_usd(limit)} is what every run on it may spend together)"
            )
        return (
            f"the ledger's limit is {format_usd(limit)}, not this run's budget of "
            f"{format_usd(self.budget)}: it was changed during the run (by "
            "`provider-router ledger topup`), and it is used up"
        )

    def _spend_limit(self, exc: CreditsExhausted) -> None:
        """Stop on a limit OpenRouter keeps: a budget someone set (the key's limit, a
        workspace or guardrail budget) as our own budget's stop, the account's money
        as the credits' stop. The prompt was not sent: nothing is counted failed."""
        limit = exc.limit
        if self.job_key and limit is not None and limit.kind is SpendLimitKind.KEY_LIMIT:
            # The run's own key, made with the budget's room as its limit: the budget.
            used_up = f"the budget of {format_usd(self.budget)} is used up"
            self._control.stop(StopReason.BUDGET, f"{used_up} (the job key's limit): {exc}")
            return
        if self.spend_limit is None:
            self.spend_limit = limit
        if limit is None or not limit.is_budget:
            self._control.stop(StopReason.CREDITS, credits_words(exc))
            return
        self._control.stop(StopReason.BUDGET, f"a spend limit OpenRouter keeps ran out: {exc}")

    def completed(
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
        if result.reserved is not None:
            self.largest_reserved = max(self.largest_reserved, result.reserved)
        usage = result.usage
        prompt_tokens = usage.prompt_tokens if usage else 0
        output_tokens = usage.completion_tokens if usage else 0
        reasoning_tokens = usage.reasoning_tokens if usage else 0
        cost = result.cost if result.cost is not None else Decimal(0)
        provider = self.provider(result.provider or "unknown")
        provider.started(started)
        provider.ended(finished)
        if result.quarantined:
            # Never accepted as data: the prompt runs again (a later run may route it well).
            journal.release(ds.spec.name, prompt.id, reason="policy_violation")
            ds.counter.failed("PolicyViolation", result.attempts - 1)
            provider.failed("PolicyViolation", result.attempts - 1)
            provider.cost += cost
            return None
        truncated = result.finish_reason == TRUNCATED_FINISH
        record = make_record(
            prompt_id=prompt.id,
            dataset=ds.spec.name,
            messages=prompt.messages,
            text=result.text,
            reasoning=result.reasoning,
            finish_reason=result.finish_reason,
            provider=result.provider,
            model=self._model,
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
            request_digest=ds.digest.of(prompt),
            max_tokens=ds.max_tokens,
            floor_cost=result.floor_cost,
            waited_s=result.waited,
            refusals=result.refusals,
            endpoint=result.endpoint,
            trace=trace_fields(result) if result.router_metadata is not None else None,
        )
        if self.drift is not None:  # last: a flag is patched in place (jobs/drift.py)
            check, flagged = self.drift.stamp(result.provider, started)
            record["drift_check"] = check
            record["drift_flagged"] = flagged
        journal.complete(
            ds.spec.name,
            prompt.id,
            encode_record(record),
            output_tokens=output_tokens,
            prompt_tokens=prompt_tokens,
            cost_units=to_units(cost),
            location=prompt.location,
            truncated=truncated,
        )
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush, journal)
        retries = result.attempts - 1
        floor = result.floor_cost
        trace = result.router_metadata
        for counter in (ds.counter, provider):
            if floor is not None:
                counter.floor_cost += floor
                counter.floored_cost += cost
            counter.requests += 1
            counter.prompt_tokens += prompt_tokens
            counter.output_tokens += output_tokens
            counter.reasoning_tokens += reasoning_tokens
            counter.cost += cost
            counter.retries += retries
            if truncated:
                counter.truncated += 1
                counter.truncated_cost += cost
            if trace is not None:
                counter.fallbacks += trace.fallbacks
                counter.compressed += trace.compressed
        if trace is not None and trace.compressed:
            log.warning(
                "batch.context_compressed",
                dataset=ds.spec.name,
                id=prompt.id,
                provider=result.provider,
                generation_id=result.generation_id,
            )
        return output_tokens

    def _flush(self, journal: Journal) -> None:
        self._flush_pending = False
        try:
            journal.flush()
        except OSError as exc:
            # A full disk: stop sending (every answer now would be paid for and not
            # kept); the ledger holds the money, the next run resends what was lost.
            if self._control.stopping is not StopReason.ERROR:
                self._control.stop(
                    StopReason.ERROR,
                    f"cannot write the job's files in {self._out} ({exc.strerror or exc}); "
                    "free some space",
                )

    def provider(self, name: str) -> Counter:
        """This run's counter of provider ``name`` (made on first use)."""
        counter = self.providers.get(name)
        if counter is None:
            counter = self.providers[name] = Counter()
        return counter
