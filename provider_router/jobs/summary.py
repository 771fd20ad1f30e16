"""Counting a run: per-dataset and per-provider statistics, the final summary.

:class:`Counter` objects are updated on the per-request path (plain integer and
Decimal additions). :class:`RunSummary` is built once at the end, written as
``summary.json`` and rendered as a terminal table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from provider_router._constants import PER_MILLION
from provider_router._format import CENT, decimal_str, format_usd
from provider_router._money import from_units
from provider_router.client._cost_check import ACTIVITY_URL

__all__ = [
    "EXIT_CODES",
    "Counter",
    "DatasetReport",
    "RunSummary",
    "StopReason",
    "finish_words",
]


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


EXIT_CODES: Mapping[StopReason, int] = {
    StopReason.COMPLETE: 0,
    StopReason.ERROR: 1,
    StopReason.BUDGET: 3,
    StopReason.CREDITS: 4,
    StopReason.INCOMPLETE: 5,
    StopReason.TARGET_NOT_REACHED: 6,
    StopReason.INTERRUPTED: 130,
    StopReason.ABANDONED: 130,
}
"""The ``provider-router run`` exit code for each way a run can end."""


@dataclass(slots=True)
class Counter:
    """Requests, tokens, money, failures and timing of one dataset or provider in one run."""

    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cost: Decimal = Decimal(0)
    failures: int = 0
    retries: int = 0
    failures_by_kind: dict[str, int] = field(default_factory=dict)
    first_start: float | None = None
    last_end: float | None = None

    def started(self, now: float) -> None:
        """Note a request start at wall-clock ``now``."""
        if self.first_start is None:
            self.first_start = now

    def ended(self, now: float) -> None:
        """Note a request end at wall-clock ``now``."""
        self.last_end = now

    def failed(self, kind: str, retries: int = 0) -> None:
        """Count a request that ended without a result."""
        self.failures += 1
        self.retries += retries
        self.failures_by_kind[kind] = self.failures_by_kind.get(kind, 0) + 1

    @property
    def wall_time(self) -> float:
        """Seconds from its first request's start to its last request's end."""
        if self.first_start is None or self.last_end is None:
            return 0.0
        return max(self.last_end - self.first_start, 0.0)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (money as exact decimal strings)."""
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cost": decimal_str(self.cost),
            "usd_per_million_output": _str(per_million(self.cost, self.output_tokens)),
            "failures": self.failures,
            "failures_by_kind": dict(sorted(self.failures_by_kind.items())),
            "retries": self.retries,
            "wall_time_s": round(self.wall_time, 3),
        }


def finish_words(to_finish: Decimal | None, needed: Decimal | None) -> str:
    """``about $0.67 more (a budget of $1.34)``: the two numbers, as every view says them."""
    if to_finish is None:
        return "unknown"
    if to_finish == 0:
        return "nothing more"
    words = f"about {format_usd(max(to_finish, CENT))} more"
    return words if needed is None else f"{words} (a budget of {format_usd(needed)})"


def per_million(cost: Decimal, tokens: int) -> Decimal | None:
    """USD per million tokens, or None without tokens."""
    if tokens <= 0:
        return None
    return (cost * PER_MILLION / tokens).quantize(Decimal("0.0001"))


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

    @property
    def exit_code(self) -> int:
        """The command's exit code for this outcome."""
        return EXIT_CODES[self.reason]

    def to_json(self) -> dict[str, Any]:
        """The ``summary.json`` document."""
        return {
            "reason": self.reason.value,
            "exit_code": self.exit_code,
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

    def render(self, console: Console) -> None:
        """Print the summary tables."""
        datasets = Table(title="Datasets", title_justify="left")
        for column in (
            "dataset",
            "done",
            "output tokens",
            "target",
            "cost",
            "$/M out",
            "run req",
            "failures",
            "retries",
            "wall",
            "to finish",
        ):
            datasets.add_column(column, justify="left" if column == "dataset" else "right")
        for d in self.datasets:
            done = f"{d.completed:,}" + (f"/{d.prompts:,}" if d.prompts is not None else "")
            datasets.add_row(
                d.name,
                done,
                f"{d.output_tokens:,}",
                f"{d.target_output_tokens:,}" if d.target_output_tokens else "-",
                format_usd(d.cost),
                _fmt(per_million(d.cost, d.output_tokens)),
                f"{d.run.requests:,}",
                _failures(d.run),
                f"{d.run.retries:,}",
                f"{d.run.wall_time:.1f}s",
                format_usd(d.to_finish),
            )
        console.print(datasets)
        providers = Table(title="Providers (this run)", title_justify="left")
        for column in (
            "provider",
            "requests",
            "output tokens",
            "cost",
            "$/M out",
            "failures",
            "errors",
            "429s",
            "retries",
            "wall",
        ):
            providers.add_column(column, justify="left" if column == "provider" else "right")
        for name, c in sorted(self.providers.items()):
            health = self.provider_health.get(name, {})
            providers.add_row(
                name,
                f"{c.requests:,}",
                f"{c.output_tokens:,}",
                format_usd(c.cost),
                _fmt(per_million(c.cost, c.output_tokens)),
                _failures(c),
                str(health.get("errors", 0)),
                str(health.get("rate_limited", 0)),
                f"{c.retries:,}",
                f"{c.wall_time:.1f}s",
            )
        console.print(providers)
        to_finish = finish_words(self.to_finish, self.budget_to_finish)
        console.print(
            f"[bold]{self.reason.value}[/bold]: spent {format_usd(self.spent)} of "
            f"{format_usd(self.budget)} (reserved {format_usd(self.reserved)}); "
            f"to finish the plan: {to_finish}; wall time {self.wall_time:.1f}s"
        )
        if self.cache_saved > 0:
            console.print(f"Prompt caching saved {format_usd(self.cache_saved)} in this run.")
        if self.message:
            console.print(self.message, markup=False, highlight=False)
        for line in self.batch_sentences:
            console.print(line, markup=False, highlight=False)
        for line in self.disputed:
            console.print(f"disputed: {line}", markup=False, highlight=False)
        if self.bad_lines:
            console.print(f"{len(self.bad_lines)} bad input line(s) skipped:")
            for line in self.bad_lines[:20]:
                console.print(f"  {line}", markup=False, highlight=False)
            if len(self.bad_lines) > 20:
                console.print(f"  … and {len(self.bad_lines) - 20} more (see summary.json)")


def disputed_line(entry: Mapping[str, Any]) -> str:
    """One line for a journal's ``disputed`` entry (:meth:`FileJournal.note_disputed`)."""
    booked = from_units(int(entry.get("booked") or 0))
    gen = entry.get("gen") or "(no id)"
    return (
        f"{entry.get('key')} (generation {gen}): the answer's usage.cost "
        f"${entry.get('reported')} was not booked; ${decimal_str(booked)} (its worst "
        f"case) was: check generation {gen} at {ACTIVITY_URL}"
    )


def _fmt(value: Decimal | None) -> str:
    return format_usd(value)


def _failures(counter: Counter) -> str:
    if not counter.failures:
        return "0"
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(counter.failures_by_kind.items()))
    return f"{counter.failures} ({kinds})"
