"""Progress of a running batch: a live rich table on a terminal, plain lines elsewhere.

The display polls :meth:`JobRunner.progress` a few times a second; nothing
here runs on the per-request path. Per dataset it shows requests done / total,
output tokens toward the target, spend, effective $ per million output tokens,
requests/s and tokens/s (this run), answers cut at ``max_tokens`` and what they cost,
and an ETA in time and money; the header shows the ledger's spend and what is left
of the budget, requests in flight, and errors and retries by kind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from decimal import Decimal
from typing import Literal

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from provider_router._format import format_usd
from provider_router._table import Column, FitTable
from provider_router.jobs.counter import per_million
from provider_router.jobs.finish import finish_words, money_to_finish, plan_to_finish
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.snapshots import DatasetProgress, RunProgress

__all__ = ["ProgressMode", "dataset_eta", "progress_lines", "progress_table", "show_progress"]

ProgressMode = Literal["auto", "rich", "plain", "off"]

_RICH_INTERVAL = 0.5
_PLAIN_INTERVAL = 10.0


def dataset_eta(
    d: DatasetProgress, elapsed: float, money: Decimal | None = None
) -> tuple[float | None, Decimal | None]:
    """Seconds (at this run's token rate) and USD to finish a dataset (None when unknown).

    ``money`` is its share of the plan's to-finish (:func:`plan_to_finish`, the one
    definition every view shows); without it, the dataset's own.
    """
    if d.finished:
        return 0.0, Decimal(0)
    if money is None:
        money = money_to_finish(d, None)
    run = d.run
    if elapsed <= 0 or run.requests == 0 or run.output_tokens == 0:
        return None, money
    remaining: list[float] = []
    tokens_per_request = run.output_tokens / run.requests
    if d.target_output_tokens is not None:
        remaining.append(max(d.target_output_tokens - d.output_tokens, 0))
    if d.total is not None:
        remaining.append(max(d.total - d.completed, 0) * tokens_per_request)
    if not remaining:
        return None, money
    return min(remaining) / (run.output_tokens / elapsed), money


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def _header(p: RunProgress) -> str:
    parts = []
    if p.ledger is not None:
        parts.append(
            f"spent {format_usd(p.ledger.spent)} of {format_usd(p.ledger.limit)} "
            f"(reserved {format_usd(p.ledger.reserved)}, left {format_usd(p.ledger.available)})"
        )
    parts.append(f"in flight {p.in_flight}")
    if p.waiting_for_budget:
        parts.append(f"waiting for budget {p.waiting_for_budget}")
    if p.waiting_for_endpoint:
        parts.append(f"waiting for an endpoint {p.waiting_for_endpoint}")
    if p.price_vs_floor is not None:
        parts.append(f"{p.price_vs_floor}× the floor")
    parts.append(f"to finish {finish_words(p.to_finish, None)}")
    parts.append(f"retries {p.retries}, errors {p.errors}, 429s {p.rate_limited}")
    if p.failures_by_kind:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(p.failures_by_kind.items()))
        parts.append(f"failed: {kinds}")
    if p.stopping is not None:
        parts.append(f"STOPPING ({p.stopping.value}): letting requests in flight finish")
    return " | ".join(parts)


def _row(d: DatasetProgress, elapsed: float, money: Decimal | None) -> list[str]:
    total = f"/{d.total:,}" if d.total is not None else ""
    target = f"/{d.target_output_tokens:,}" if d.target_output_tokens else ""
    rate = per_million(d.cost, d.output_tokens)
    seconds, money = dataset_eta(d, elapsed, money)
    req_s = d.run.requests / elapsed if elapsed > 0 else 0.0
    tok_s = d.run.output_tokens / elapsed if elapsed > 0 else 0.0
    return [
        d.name,
        f"{d.completed:,}{total}",
        f"{d.output_tokens:,}{target}",
        format_usd(d.cost),
        format_usd(rate),
        f"{req_s:.1f}",
        f"{tok_s:,.0f}",
        str(d.in_flight),
        str(d.run.failures),
        _cut(d),
        "done"
        if d.finished
        else f"{_duration(seconds)} / " + ("?" if money is None else format_usd(money)),
    ]


_COLUMNS = (
    Column("dataset", key=True),
    Column("done", "right"),
    Column("output tokens", "right"),
    Column("spent", "right"),
    Column("$/M out", "right", drop=3),
    Column("req/s", "right", drop=1),
    Column("tok/s", "right", drop=2),
    # Sent or waiting for budget: the ledger does not say which dataset a waiting
    # request is of, so the header's "in flight" and "waiting for budget" stay apart
    # there, and this column does not claim to be either.
    Column("started", "right", drop=0),
    Column("failed", "right"),
    Column("cut", "right", drop=1),
    Column("ETA time / money", "right"),
)


def _cut(d: DatasetProgress) -> str:
    """Answers cut at ``max_tokens`` over every run, with what they cost."""
    if not d.truncated:
        return "0"
    return f"{d.truncated:,} ({format_usd(d.truncated_cost)})"


def progress_table(p: RunProgress) -> Group:
    """The live display for one snapshot."""
    table = FitTable(*_COLUMNS)
    each, _ = plan_to_finish(p.datasets)
    for d, money in zip(p.datasets, each, strict=True):
        table.add_row(*_row(d, p.elapsed, money))
    return Group(Text(_header(p)), table)


def progress_lines(p: RunProgress) -> Sequence[str]:
    """The plain-log form of one snapshot: a header line and one line per dataset."""
    lines = [f"[{_duration(p.elapsed)}] {_header(p)}"]
    each, _ = plan_to_finish(p.datasets)
    for d, money in zip(p.datasets, each, strict=True):
        cells = _row(d, p.elapsed, money)
        pairs = zip((c.header for c in _COLUMNS), cells, strict=True)
        lines.append("  " + ", ".join(f"{k}={v}" for k, v in pairs))
    return lines


async def _refresh_ledger(runner: JobRunner) -> None:
    if runner.ledger is not None:
        with contextlib.suppress(Exception):
            runner.ledger_state = await runner.ledger.snapshot()


async def show_progress(
    runner: JobRunner,
    console: Console,
    mode: ProgressMode = "auto",
    *,
    interval: float | None = None,
) -> None:
    """Show the runner's progress until cancelled (run it as a task beside ``runner.run()``)."""
    if mode == "off":
        return
    if mode == "auto":
        mode = "rich" if console.is_terminal else "plain"
    if mode == "rich":
        with Live(console=console, refresh_per_second=4, transient=True) as live:
            while True:
                await _refresh_ledger(runner)
                live.update(progress_table(runner.progress()))
                await asyncio.sleep(interval or _RICH_INTERVAL)
    while True:
        await asyncio.sleep(interval or _PLAIN_INTERVAL)
        await _refresh_ledger(runner)
        for line in progress_lines(runner.progress()):
            console.print(line, markup=False, highlight=False, soft_wrap=True)  # a log line whole
