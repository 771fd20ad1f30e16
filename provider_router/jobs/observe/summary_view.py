"""A run's summary as the terminal shows it at the end: the tables and the sentences.

Per dataset and per provider (requests, tokens, cost, $/M, answers cut at
``max_tokens``, failures by kind, errors and 429s, retries, wall time), then why it
stopped, the money, what finishing takes
(:func:`~provider_router.jobs.finish.finish_words`), the answers cut at ``max_tokens``
and the run's notes. The same figures are ``summary.json``
(:class:`~provider_router.jobs.summary.RunSummary`).
"""

from __future__ import annotations

from decimal import Decimal

from rich.console import Console

from provider_router._format import format_usd
from provider_router._table import Column, FitTable
from provider_router.jobs.counter import Counter, per_million
from provider_router.jobs.finish import finish_words
from provider_router.jobs.summary import RunSummary, truncation_line

__all__ = ["render_summary"]


def render_summary(summary: RunSummary, console: Console) -> None:
    """Print the summary's tables and sentences on ``console``."""
    datasets = FitTable(
        Column("dataset", key=True),
        Column("done", "right"),
        Column("output tokens", "right"),
        Column("target", "right", drop=4),
        Column("cost", "right"),
        Column("$/M out", "right", drop=3),
        Column("run req", "right", drop=2),
        Column("cut", "right", drop=2),
        Column("failures", "right"),
        Column("retries", "right", drop=1),
        Column("wall", "right", drop=0),
        Column("to finish", "right"),
        title="Datasets",
    )
    for d in summary.datasets:
        done = f"{d.completed:,}" + (f"/{d.prompts:,}" if d.prompts is not None else "")
        datasets.add_row(
            d.name,
            done,
            f"{d.output_tokens:,}",
            f"{d.target_output_tokens:,}" if d.target_output_tokens else "-",
            format_usd(d.cost),
            format_usd(per_million(d.cost, d.output_tokens)),
            f"{d.run.requests:,}",
            _cut(d.truncated, d.truncated_cost),
            _failures(d.run),
            f"{d.run.retries:,}",
            f"{d.run.wall_time:.1f}s",
            format_usd(d.to_finish),
        )
    console.print(datasets)
    providers = FitTable(
        Column("provider", key=True),
        Column("requests", "right"),
        Column("output tokens", "right"),
        Column("cost", "right"),
        Column("$/M out", "right", drop=3),
        Column("cut", "right", drop=2),
        Column("failures", "right"),
        Column("errors", "right", drop=2),
        Column("429s", "right", drop=2),
        Column("retries", "right", drop=1),
        Column("wall", "right", drop=0),
        title="Providers (this run)",
    )
    for name, c in sorted(summary.providers.items()):
        health = summary.provider_health.get(name, {})
        providers.add_row(
            name,
            f"{c.requests:,}",
            f"{c.output_tokens:,}",
            format_usd(c.cost),
            format_usd(per_million(c.cost, c.output_tokens)),
            _cut(c.truncated, c.truncated_cost),
            _failures(c),
            str(health.get("errors", 0)),
            str(health.get("rate_limited", 0)),
            f"{c.retries:,}",
            f"{c.wall_time:.1f}s",
        )
    console.print(providers)
    to_finish = finish_words(summary.to_finish, summary.budget_to_finish)
    console.print(
        f"[bold]{summary.reason.value}[/bold]: spent {format_usd(summary.spent)} of "
        f"{format_usd(summary.budget)} (reserved {format_usd(summary.reserved)}); "
        f"to finish the plan: {to_finish}; wall time {summary.wall_time:.1f}s"
    )
    cut = truncation_line(
        sum(d.completed for d in summary.datasets),
        summary.truncated,
        sum((d.cost for d in summary.datasets), Decimal(0)),
        summary.truncated_cost,
    )
    if cut:
        console.print(f"{cut}.", markup=False, highlight=False)
    aside = sum(d.set_aside for d in summary.datasets)
    if aside:
        spent = sum((d.set_aside_cost for d in summary.datasets), Decimal(0))
        console.print(
            f"{aside:,} answers were set aside over the job and their prompts sent again "
            f"(cut at a smaller max_tokens, or their prompt edited; {format_usd(spent)} spent "
            "on them; kept in set_aside/).",
            markup=False,
            highlight=False,
        )
    floor = summary.floor_sentence()
    if floor is not None:
        console.print(floor, markup=False, highlight=False)
    if summary.cache_saved > 0:
        console.print(f"Prompt caching saved {format_usd(summary.cache_saved)} in this run.")
    if summary.message:
        console.print(summary.message, markup=False, highlight=False)
    for line in summary.batch_sentences:
        console.print(line, markup=False, highlight=False)
    for line in summary.disputed:
        console.print(f"disputed: {line}", markup=False, highlight=False)
    if summary.bad_lines:
        console.print(f"{len(summary.bad_lines)} bad input line(s) skipped:")
        for line in summary.bad_lines[:20]:
            console.print(f"  {line}", markup=False, highlight=False)
        if len(summary.bad_lines) > 20:
            console.print(f"  … and {len(summary.bad_lines) - 20} more (see summary.json)")


def _cut(truncated: int, cost: Decimal) -> str:
    return f"{truncated:,} ({format_usd(cost)})" if truncated else "0"


def _failures(counter: Counter) -> str:
    if not counter.failures:
        return "0"
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(counter.failures_by_kind.items()))
    return f"{counter.failures} ({kinds})"
