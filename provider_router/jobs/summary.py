"""The end of a run: why it stopped, where each dataset stands, and the money.

:class:`RunSummary` is built once at the end from the run's counters
(:class:`~provider_router.jobs.counter.Counter`) and written as ``summary.json``;
the terminal's tables are :mod:`provider_router.jobs.observe.summary_view`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Any

from provider_router._format import decimal_str
from provider_router._money import from_units
from provider_router.client._cost_check import ACTIVITY_URL
from provider_router.jobs.counter import Counter

__all__ = ["DatasetReport", "RunSummary", "StopReason", "disputed_line"]


class StopReason(StrEnum):
    """Why a run ended."""

    COMPLETE = "complete"
    """Every dataset reached its target, its cap or the end of its prompts."""
    INCOMPLETE = "incomplete"
    """Nothing left to try in this run, but some prompts failed (re-run to retry them)."""
    TARGET_NOT_REACHED = "target_not_reached"
    """Every prompt was done, and a dataset's output-token target is still not reached."""
    BUDGET = "budget_exhausted"
    """Our ledger's budget cannot cover another request."""
    CREDITS = "credits_exhausted"
    """OpenRouter's balance or the key's limit ran out (402)."""
    INTERRUPTED = "interrupted"
    """Ctrl-C: in-flight requests were let finish."""
    ABANDONED = "abandoned"
    """A second Ctrl-C: in-flight requests were cancelled (counted at worst case)."""
    ERROR = "error"
    """A failure that every request would hit (for example a rejected API key)."""


def _str(value: Decimal | None) -> str | None:
    return None if value is None else decimal_str(value)


@dataclass
class DatasetReport:
    """Where a dataset stands at the end of a run (all runs so far, plus this run's counter).

    Attributes:
        name: the dataset.
        prompts: good prompts known in its files (None until counted).
        completed: prompts completed over every run.
        output_tokens: completion tokens over every run.
        cost: their cost over every run (USD).
        target_output_tokens: its target, if any.
        max_requests: its request cap, if any.
        bad_lines: lines skipped as bad in this run.
        lost: requests found lost after a crash (all runs).
        run: what this run did.
        to_finish: USD needed to finish it at observed rates (None: unknown).
    """

    name: str
    prompts: int | None
    completed: int
    output_tokens: int
    cost: Decimal
    target_output_tokens: int | None
    max_requests: int | None
    bad_lines: int
    lost: int
    run: Counter
    to_finish: Decimal | None = None

    @property
    def finished(self) -> bool:
        """Reached its target or cap, or completed every prompt."""
        if (
            self.target_output_tokens is not None
            and self.output_tokens >= self.target_output_tokens
        ):
            return True
        if self.max_requests is not None and self.completed >= self.max_requests:
            return True
        return self.prompts is not None and self.completed >= self.prompts

    @property
    def request_cap(self) -> int | None:
        """The most prompts it will complete: its prompts, capped by ``max_requests``."""
        caps = [c for c in (self.prompts, self.max_requests) if c is not None]
        return min(caps) if caps else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "prompts": self.prompts,
            "completed": self.completed,
            "output_tokens": self.output_tokens,
            "cost": decimal_str(self.cost),
            "target_output_tokens": self.target_output_tokens,
            "max_requests": self.max_requests,
            "finished": self.finished,
            "bad_lines": self.bad_lines,
            "lost_in_crashes": self.lost,
            "to_finish_usd": _str(self.to_finish),
            "this_run": self.run.to_json(),
        }


@dataclass
class RunSummary:
    """The end of a run: why it stopped, every dataset and provider, and the money.

    Attributes:
        reason: why it stopped.
        datasets: per-dataset reports, in plan order.
        providers: this run's counters per serving provider.
        provider_health: errors and 429s per provider as the client observed them.
        budget: the ledger's limit (USD).
        spent: the ledger's spent total over every run (USD).
        reserved: still reserved at the end (USD; 0 after a clean stop).
        to_finish: USD still to spend to finish the plan at observed rates (None:
            unknown; see :mod:`provider_router.jobs.finish`).
        budget_to_finish: the budget that allows it, with a margin and room for the
            largest reservation (None: unknown).
        wall_time: seconds this run took.
        bad_lines: ``file:line: problem`` for each line skipped in this run.
        recovered: notes on what resuming repaired (journal, ledger).
        message: one line on why it stopped.
        preflight: USD the preflights of this job directory cost, over every run
            (part of ``spent``, in no dataset's cost: ``run``'s 1-token pinned request).
        disputed: one line per answer whose ``usage.cost`` was disputed, over every
            run: what it said and what was booked instead (docs/ledger.md).
        in_flight: requests still in flight when it was written (sent, not answered).
        waiting_for_budget: requests still waiting for room in the budget (not sent).
        cache_saved: USD prompt caching saved in this run (cached tokens at the serving
            provider's prompt price less its cache-read price: ``Router.cache_saved``).
        batches: the Batch API route's datasets (``BatchView.to_json``,
            :mod:`provider_router.jobs.observe.batch_view`), None when the job sent no batch.
        batch_sentences: the same, one plain sentence per dataset (what every view says).
        verification: with ``run --verify``, the job's checks, what they excluded, the
            rows flagged and what the checks cost (:meth:`provider_router.jobs.drift.
            DriftWatch.summary`; None without it).
        openrouter: what the run asked of OpenRouter besides the route (its trace,
            context compression, distillable text:
            :func:`provider_router.jobs.router_options.openrouter_summary`).
    """

    reason: StopReason
    datasets: list[DatasetReport]
    providers: dict[str, Counter]
    provider_health: dict[str, dict[str, Any]]
    budget: Decimal
    spent: Decimal
    reserved: Decimal
    to_finish: Decimal | None
    wall_time: float
    bad_lines: list[str]
    recovered: list[str]
    message: str = ""
    budget_to_finish: Decimal | None = None
    preflight: Decimal = Decimal(0)
    disputed: list[str] = field(default_factory=list)
    in_flight: int = 0
    waiting_for_budget: int = 0
    cache_saved: Decimal = Decimal(0)
    batches: dict[str, Any] | None = None
    batch_sentences: list[str] = field(default_factory=list)
    verification: dict[str, Any] | None = None
    openrouter: dict[str, Any] | None = None

    @property
    def budget_to_resume(self) -> Decimal | None:
        """After a budget stop, the budget that finishes the plan when it is above this
        run's (None: running again with the same budget will do)."""
        needed = self.budget_to_finish
        if self.reason is StopReason.BUDGET and needed is not None and needed > self.budget:
            return needed
        return None

    def to_json(self) -> dict[str, Any]:
        """The ``summary.json`` document."""
        return {
            "reason": self.reason.value,
            "message": self.message,
            "budget_usd": decimal_str(self.budget),
            "spent_usd": decimal_str(self.spent),
            "reserved_usd": decimal_str(self.reserved),
            "preflight_usd": decimal_str(self.preflight),
            "cache_saved_usd": decimal_str(self.cache_saved),
            "to_finish_usd": _str(self.to_finish),
            "budget_to_finish_usd": _str(self.budget_to_finish),
            "in_flight": self.in_flight,
            "waiting_for_budget": self.waiting_for_budget,
            "wall_time_s": round(self.wall_time, 3),
            "datasets": {d.name: d.to_json() for d in self.datasets},
            "providers": {
                name: {**counter.to_json(), **self.provider_health.get(name, {})}
                for name, counter in sorted(self.providers.items())
            },
            **({"verification": self.verification} if self.verification is not None else {}),
            **({"openrouter": self.openrouter} if self.openrouter is not None else {}),
            "bad_lines": self.bad_lines,
            "recovered": self.recovered,
            "disputed": self.disputed,
            **({"batches": self.batches} if self.batches is not None else {}),
        }

    def write(self, path: Path) -> None:
        """Write ``summary.json`` (atomically: a crash never leaves half a file)."""
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)


def disputed_line(entry: Mapping[str, Any]) -> str:
    """One line for a journal's ``disputed`` entry (:meth:`FileJournal.note_disputed`)."""
    booked = from_units(int(entry.get("booked") or 0))
    gen = entry.get("gen") or "(no id)"
    return (
        f"{entry.get('key')} (generation {gen}): the answer's usage.cost "
        f"${entry.get('reported')} was not booked; ${decimal_str(booked)} (its worst "
        f"case) was: check generation {gen} at {ACTIVITY_URL}"
    )
