"""Drift: the providers verified again during a run; one that changed is excluded, its rows flagged.

``run --verify`` measures every allowed endpoint before the first prompt, but a provider
may still swap its weights mid-run: :class:`DriftWatch` verifies again every
``verify_every`` completed rows (and at the end of a run that finished its work) the
endpoints that served rows since their last passing check, its canaries paid from the
job's ledger. Each row records the last check started before it (``drift_check``); an
endpoint that fails is excluded from then on, and the rows its provider served since
its last passing check are flagged in place (``drift_flagged``, rewritten at the same
length so no offset the journal committed moves). A resumed run keeps the exclusions
and judges what the last one left unchecked; the history is
:mod:`~provider_router.jobs.drift_history` (docs/policy.md, "Drift").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from pydantic import SecretStr

from provider_router._exceptions import ConfigurationError, ProviderRouterError
from provider_router._log import get_logger
from provider_router.checks.verify import verify
from provider_router.client.router import Router
from provider_router.jobs.drift_history import (
    DriftCheck,
    DriftHistory,
    excluded_by_provider,
    flag_rows_by_provider,
    flagged_by_provider,
    verification_summary,
)
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.journal import FileJournal
from provider_router.ledger import Ledger
from provider_router.routing.policy import ProviderPolicy

__all__ = ["DEFAULT_VERIFY_EVERY", "DriftWatch", "redo_flagging"]

log = get_logger(__name__)

DEFAULT_VERIFY_EVERY: Final = 1000
"""Rows between two checks: a check (about $0.005 for one provider and the reference at
Kimi K2.5's list prices) costs well under 1 % of a thousand rows, and at most that many
rows wait on it."""
CHECK_CONCURRENCY: Final = 64
"""Canaries in flight in one check: all of them for a provider and the reference (8 + 8 +
12 + 8 + 12), so a check takes one canary's time rather than three."""


class DriftWatch:
    """Verifies a run's providers before it and every ``every`` rows (docs/policy.md, "Drift").

    Args:
        out: the job directory (``verify.json`` and the outputs).
        history: what ``out/verify.json`` holds (:meth:`DriftHistory.load`).
        model, policy: the plan's model and policy.
        canaries: the job's canary prompts (message lists).
        every: rows between two checks (None: only before the run).
        ledger: the job's ledger: every canary is reserved and booked there.
        base_url, api_key: OpenRouter's.
        stop: stops the run with a message (a failed exclusion cannot be left routing).
        clock: Unix seconds (the same clock as the rows' start times).
    """

    def __init__(
        self,
        out: Path,
        history: DriftHistory,
        *,
        model: str,
        policy: ProviderPolicy,
        canaries: Sequence[Any],
        every: int | None,
        ledger: Ledger,
        base_url: str | None,
        api_key: str | SecretStr | None,
        stop: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        if every is not None and every < 1:
            raise ConfigurationError(f"verify_every must be ≥ 1 row, got {every}")
        self.path = JobLayout(out).verify
        self.out = out
        self.history = history
        self.every = every
        self._model = model
        self._policy = policy
        self._canaries = list(canaries)
        self._ledger = ledger
        self._base_url = base_url
        self._api_key = api_key
        self._stop = stop
        self._clock = clock
        self.seq = self.history.seq
        """The newest check started: what a row written now records in ``drift_check``."""
        self.rows = 0
        """Rows this run wrote."""
        self.checks = 0
        """Checks this run made."""
        self.redone: list[str] = []
        """Flaggings an earlier run was stopped in, done again by :meth:`start` (said)."""
        self._since = 0  # rows since the newest check started
        self._newest: dict[str, int] = {}  # per provider: the newest check number of its rows
        self._excluded_at: dict[str, tuple[float, DriftCheck]] = {}
        self._late: dict[int, dict[str, int]] = {}  # per check and provider: rows written
        # flagged while its rows on disk were being flagged
        self._task: asyncio.Task[None] | None = None
        self.router: Router | None = None
        self.journal: FileJournal | None = None
        self.datasets: list[str] = []
        self.stopping: Callable[[], bool] = lambda: False
        """Whether the run has stopped taking work (no check is started then)."""

    @property
    def policy(self) -> ProviderPolicy:
        """The plan's policy with the job's verdicts: what failed serves nothing."""
        if self.history.report is None:
            return self._policy
        return dataclasses.replace(self._policy, verified=self.history.report)

    # --- the rows -----------------------------------------------------------------------

    def stamp(self, provider: str | None, started: float) -> tuple[int, bool]:
        """A row's ``drift_check`` and ``drift_flagged`` as it is written; counts the row
        and starts the next check when ``every`` rows have been written since the last."""
        self.rows += 1
        self._since += 1
        name = provider or ""
        self._newest[name] = self.seq
        flagged = False
        excluded = self._excluded_at.get(name)
        if excluded is not None and started < excluded[0]:
            flagged = True  # in flight to a provider that failed: it served it since the pass
            check = excluded[1]
            if check.flagged is None:  # its rows on disk are being flagged: counted after
                late = self._late.setdefault(check.seq, {})
                late[name] = late.get(name, 0) + 1
            else:
                check.flagged += 1
                check.flagged_by[name] = check.flagged_by.get(name, 0) + 1
        if (
            self.every is not None
            and self._since >= self.every
            and (self._task is None or self._task.done())
            and not self.stopping()
        ):
            self._since = 0
            self._task = asyncio.ensure_future(self._check_mid_run())
        return self.seq, flagged

    def due(self) -> list[str]:
        """Tags whose provider wrote rows since the endpoint's last passing check."""
        report = self.history.report
        if report is None:
            return []
        tags = []
        for verdict in report.endpoints:
            newest = self._newest.get(verdict.provider_name)
            if newest is None or verdict.tag in self.history.failed:
                continue
            if newest >= self.history.last_pass.get(verdict.tag, -1):
                tags.append(verdict.tag)
        return tags

    # --- the checks ---------------------------------------------------------------------

    async def start(self) -> ProviderPolicy:
        """The check before the run's first prompt (every allowed endpoint; errors raise);
        flags any rows an earlier run left unflagged. Returns the run's policy."""
        await self._redo_flagging()
        await self.check("start", self.policy)
        return self.policy

    async def finish(self, *, complete: bool) -> None:
        """The end of dispatch: the running check awaited; with ``complete`` (the run
        finished its work) and re-checks on, a last check of what was served since the
        last pass."""
        task = self._task
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        tags = self.due() if self.every is not None else []
        if complete and tags:
            await self._guarded("end", tags)
        await asyncio.to_thread(self.history.save, self.path)
        self.publish()

    def abandon(self) -> None:
        """Cancel a check under way (the second Ctrl-C)."""
        if self._task is not None:
            self._task.cancel()

    async def _check_mid_run(self) -> None:
        tags = self.due()
        if tags:
            await self._guarded("every", tags)

    async def _guarded(self, trigger: str, tags: Iterable[str]) -> None:
        """A check during a run: what cannot be verified is said, and the run goes on."""
        try:
            only = frozenset(tag.lower() for tag in tags)
            await self.check(trigger, dataclasses.replace(self.policy, only=only))
        except ProviderRouterError as exc:
            log.warning("batch.verify_check_failed", trigger=trigger, error=str(exc))

    async def check(self, trigger: str, policy: ProviderPolicy) -> DriftCheck:
        """Verify the endpoints ``policy`` allows; exclude and flag what failed."""
        self.seq += 1  # rows written from now on wait for the next check
        seq = self.seq
        rows = self.rows
        started = self._clock()
        history = self.history
        try:
            report = await verify(
                self._model,
                policy=policy,
                prompts=self._canaries,
                ledger=self._ledger,
                base_url=self._base_url,
                api_key=self._api_key,
                # Every canary at once: the job's rows keep landing while a check runs.
                concurrency=CHECK_CONCURRENCY,
            )
        except ProviderRouterError as exc:  # its number is taken: rows since wait for the next
            failed_check = DriftCheck(seq, trigger, rows, (), (), (), Decimal(0), started)
            failed_check.error = str(exc)
            history.checks.append(failed_check)
            await asyncio.to_thread(history.save, self.path)
            self.publish()
            raise
        self.checks += 1
        if report.cost and self.journal is not None:  # booked: an older ledger is refused
            self.journal.note_verify(report.cost, seq)
        failed = tuple(t for t in report.failed if t not in history.failed)
        passed = tuple(t for t in report.passed if t not in history.failed)
        for tag in failed:
            verdict = report.verdict(tag)
            assert verdict is not None
            history.failed[tag] = seq
            log.warning(
                "batch.verify_failed", tag=tag, check=seq, trigger=trigger, reason=verdict.reason
            )
        for tag in passed:
            history.last_pass[tag] = seq
        history.merge(report)
        since = history.flag_floors(failed)  # a failed tag's last pass stays its last
        entry = DriftCheck(
            seq=seq,
            trigger=trigger,
            rows=rows,
            endpoints=tuple(v.tag for v in report.endpoints),
            passed=passed,
            failed=failed,
            cost=report.cost,
            started=started,
            flagged=None if failed else 0,
        )
        history.checks.append(entry)
        await asyncio.to_thread(history.save, self.path)
        self.publish()
        if failed and self.journal is not None:  # after verify.json: never ahead of it
            self.journal.note_excluded(frozenset(failed), seq)
        if failed:
            await self._exclude(entry, since)
        return entry

    async def _exclude(self, entry: DriftCheck, since: dict[str, int]) -> None:
        for name in since:  # answers landing from now on are flagged as they are written
            self._excluded_at[name] = (math.inf, entry)
        applied = True
        if self.router is not None:
            try:
                await self.router.set_policy(self.policy)
            except ProviderRouterError as exc:
                applied = False  # every later answer of theirs stays flagged
                self._stop(
                    f"stopped: {', '.join(entry.failed)} failed verification and could not be "
                    f"excluded from the routing ({exc}); run the same command again"
                )
        if applied:
            excluded = self._clock()
            for name in since:  # requests sent from now on are routed under the new policy
                self._excluded_at[name] = (excluded, entry)
        patched = await self._flag(since, entry.seq)
        late = self._late.pop(entry.seq, {})
        entry.flagged_by = {n: patched.get(n, 0) + late.get(n, 0) for n in {*patched, *late}}
        entry.flagged = sum(entry.flagged_by.values())
        await asyncio.to_thread(self.history.save, self.path)
        self.publish()

    async def _flag(self, since: Mapping[str, int], seq: int | None = None) -> dict[str, int]:
        """Flag the rows on disk (the journal flushed first: every row built so far); how
        many are flagged there per provider. Rows check ``seq`` flags as they are written
        from now on are counted apart (:attr:`_late`): those written before are on disk,
        counted here."""
        if seq is not None and self.journal is not None:
            self._late[seq] = {}
        return await _flag_outputs(self.out, self.datasets, self.journal, since)

    async def _redo_flagging(self) -> None:
        self.redone = await redo_flagging(self.out, self.datasets, self.history, self.journal)
        await asyncio.to_thread(self.history.save, self.path)

    # --- the summary --------------------------------------------------------------------

    def publish(self) -> None:
        """The job's figures to the router's Prometheus metrics, if it has them."""
        metrics = self.router.metrics if self.router is not None else None
        if metrics is None:
            return
        history = self.history
        figures = verification_summary(history)
        metrics.verification(
            made=figures["checks"],
            not_made=figures["checks_not_made"],
            cost=history.cost,
            excluded=excluded_by_provider(history),
            flagged=flagged_by_provider(history),
        )

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s ``verification``: checks, exclusions, flagged rows, cost."""
        figures = verification_summary(self.history)
        return {"every": self.every, **figures, "checks_this_run": self.checks}


async def redo_flagging(
    out: Path, datasets: Sequence[str], history: DriftHistory, journal: FileJournal | None
) -> list[str]:
    """Every flagging of ``history`` an earlier run was stopped in, done again (flagging is
    idempotent): what was done, in the words of a run's ``resumed:`` lines (``history`` is
    to be saved when there is any). Run on every resume, with ``--verify`` or without:
    the rows need no network, only the history."""
    notes = []
    for entry in history.checks:
        if entry.flagged is not None:
            continue
        since = history.flag_floors(entry.failed)
        entry.flagged_by = await _flag_outputs(out, datasets, journal, since)
        entry.flagged = sum(entry.flagged_by.values())
        notes.append(
            f"flagged the rows of check {entry.seq} again: {entry.flagged} row(s) of "
            f"{', '.join(sorted(since))} (an earlier run was stopped while flagging them)"
        )
    return notes


async def _flag_outputs(
    out: Path, datasets: Sequence[str], journal: FileJournal | None, since: Mapping[str, int]
) -> dict[str, int]:
    """Flag the rows on disk (the journal flushed first: every row built so far); how many
    are flagged there, per provider."""
    if journal is None:
        return {}
    journal.flush()
    layout = JobLayout(out)
    files = [layout.output(name) for name in datasets]
    sizes = [p.stat().st_size if p.exists() else 0 for p in files]
    counts = await asyncio.gather(
        *(
            asyncio.to_thread(flag_rows_by_provider, p, n, since)
            for p, n in zip(files, sizes, strict=True)
        )
    )
    total: dict[str, int] = {}
    for count in counts:
        for name, n in count.items():
            total[name] = total.get(name, 0) + n
    return total
