"""The finish step's tally: the job's Redis store and ledger as a :class:`RunSummary`.

The tally reads Redis, not the dataset: a Ray Dataset is lazy, and counting its
rows would execute it again. The store holds every paid answer (with its cost,
tokens, provider and start time), every prompt not sent and every failure, so the
summary has the same figures and words as ``provider-router run``'s. Everything is
read with ``HSCAN`` and counted as it streams by: the driver's memory does not grow
with the job (a budget stop of a million prompts is a million notes).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from provider_router.jobs.counter import Counter
from provider_router.jobs.finish import (
    budget_to_finish,
    finish_hint,
    plan_to_finish,
    resume_budget,
)
from provider_router.jobs.store.outputs import TRUNCATED_FINISH
from provider_router.jobs.summary import DatasetReport, RunSummary, StopReason
from provider_router.ledger import LedgerState
from provider_router.ray._store import AnswerStore

__all__ = ["tally"]


def _dataset_of(key: str) -> str:
    return key.partition("/")[0]


def _counter(counters: dict[str, Counter], name: str) -> Counter:
    counter = counters.get(name)
    if counter is None:
        counter = counters[name] = Counter()
    return counter


@dataclass
class _Unsent:
    """What the ``unsent`` notes say, read once (a million notes are a million lines)."""

    count: int = 0
    kinds: set[str] = field(default_factory=set)
    """``budget``, ``credits``, ``error``, ``halted``: the first word of each reason."""
    first: str = ""
    requested: Decimal = Decimal(0)
    """The largest reservation the budget refused (room the next run needs)."""

    def add(self, note: Mapping[str, Any]) -> None:
        reason = str(note.get("reason", ""))
        if not self.count:
            self.first = reason.partition(": ")[2]
        self.count += 1
        self.kinds.add(reason.partition(":")[0])
        if note.get("requested"):
            self.requested = max(self.requested, Decimal(note["requested"]))


def _reason(unsent: _Unsent, failed: int) -> tuple[StopReason, str]:
    if unsent.count:
        said = f"{unsent.count} prompt(s) not sent: {unsent.first}"
        if "budget" in unsent.kinds:
            return StopReason.BUDGET, said
        if "credits" in unsent.kinds:
            return StopReason.CREDITS, said
        return StopReason.ERROR, said
    if failed:
        return StopReason.INCOMPLETE, f"{failed} prompt(s) failed"
    return StopReason.COMPLETE, ""


async def tally(
    store: AnswerStore,
    state: LedgerState,
    *,
    datasets: Mapping[str, int | None],
    since: float,
    started: float,
    recovered: list[str],
    targets: Mapping[str, tuple[int | None, int | None]] | None = None,
    last_budget: Decimal | None = None,
) -> RunSummary:
    """The summary of a job.

    Args:
        store: the job's answers.
        state: the ledger's totals after the final recovery.
        datasets: each dataset's number of prompts (None: only those seen are known).
        since: wall-clock start of this run: answers started after it are "this run".
        started: the run's monotonic start (its wall time).
        recovered: notes on what the final recovery settled.
        targets: per dataset, ``(target_output_tokens, max_requests)``.
        last_budget: the budget the job's runs last gave its ledger (a limit that
            differs was set outside them, by ``ledger topup``).
    """
    completed: dict[str, int] = {}
    output: dict[str, int] = {}
    cost: dict[str, Decimal] = {}
    cut: dict[str, tuple[int, Decimal]] = {}
    runs: dict[str, Counter] = {}
    providers: dict[str, Counter] = {}
    # Prompts by dataset: the answers and the two notes never hold the same key.
    seen: dict[str, int] = {}
    async for key, fields in store.answers():
        name = _dataset_of(key)
        seen[name] = seen.get(name, 0) + 1
        tokens, price = int(fields["completion_tokens"]), Decimal(fields["cost"])
        completed[name] = completed.get(name, 0) + 1
        output[name] = output.get(name, 0) + tokens
        cost[name] = cost.get(name, Decimal(0)) + price
        truncated = fields.get("finish_reason") == TRUNCATED_FINISH
        if truncated:
            n, spent = cut.get(name, (0, Decimal(0)))
            cut[name] = (n + 1, spent + price)
        if float(fields.get("started_at") or 0) < since:
            continue
        provider = _counter(providers, fields.get("provider") or "unknown")
        for counter in (_counter(runs, name), provider):
            counter.started(float(fields["started_at"]))
            counter.ended(float(fields["finished_at"]))
            counter.requests += 1
            counter.prompt_tokens += int(fields["prompt_tokens"])
            counter.output_tokens += tokens
            counter.reasoning_tokens += int(fields["reasoning_tokens"])
            counter.cost += price
            counter.retries += max(int(fields.get("attempts") or 1) - 1, 0)
            if truncated:
                counter.truncated += 1
                counter.truncated_cost += price
    unsent, failed = _Unsent(), 0
    async for key, note in store.notes("unsent"):
        unsent.add(note)
        seen[_dataset_of(key)] = seen.get(_dataset_of(key), 0) + 1
    async for key, note in store.notes("failed"):
        failed += 1
        name = _dataset_of(key)
        seen[name] = seen.get(name, 0) + 1
        _counter(runs, name).failed(str(note.get("kind") or "unknown"))
    refused = await store.duplicates()  # rows whose id was another row's: bad lines
    bad: dict[str, int] = {}
    for refused_key in refused:
        name = _dataset_of(refused_key)
        bad[name] = bad.get(name, 0) + 1
    names = list(datasets) or sorted(seen)
    reports = []
    for name in names:
        target, cap = (targets or {}).get(name, (None, None))
        known = datasets.get(name)
        reports.append(
            DatasetReport(
                name=name,
                prompts=known if known is not None else seen.get(name, 0),
                completed=completed.get(name, 0),
                output_tokens=output.get(name, 0),
                cost=cost.get(name, Decimal(0)),
                target_output_tokens=target,
                max_requests=cap,
                bad_lines=bad.get(name, 0),
                lost=0,
                run=runs.get(name, Counter()),
                truncated=cut.get(name, (0, Decimal(0)))[0],
                truncated_cost=cut.get(name, (0, Decimal(0)))[1],
            )
        )
    each, to_finish = plan_to_finish(reports)
    for report, money in zip(reports, each, strict=True):
        report.to_finish = money
    requested = unsent.requested
    reason, message = _reason(unsent, failed)
    needed = budget_to_finish(state.spent, to_finish, requested)
    summary = RunSummary(
        reason=reason,
        datasets=reports,
        providers=providers,
        provider_health={},
        budget=state.limit,
        spent=state.spent,
        reserved=state.reserved,
        to_finish=to_finish,
        budget_to_finish=needed,
        wall_time=time.monotonic() - started,
        bad_lines=[f"{_dataset_of(k)}: {why}" for k, why in sorted(refused.items())],
        recovered=recovered,
        refused=requested,
        limit_outside=last_budget is not None and state.limit != last_budget,
    )
    if reason in (StopReason.BUDGET, StopReason.CREDITS):
        resume = resume_budget(summary)
        message += finish_hint(
            reason, state.limit, state.spent, to_finish, needed, requested, resume=resume
        )
    elif reason is not StopReason.COMPLETE:
        message += "; run the job again to resume"
    summary.message = message
    return summary
