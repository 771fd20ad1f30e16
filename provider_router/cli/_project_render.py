"""Projections as JSON-ready dicts (and, for the CLI, as text).

Money and fractional token counts become decimal strings, so a reader can
parse them back exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import TextIO

from rich.console import Console

from provider_router._exceptions import NotFoundError
from provider_router._format import format_percent, format_price, format_usd
from provider_router._table import Column, FitTable
from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import ModelEndpoints
from provider_router.cli._render import make_console, print_wrapped
from provider_router.planning.compare import RouteChoice, RouteComparison, RouteOption
from provider_router.planning.projection_result import (
    BudgetFit,
    CostRange,
    Projection,
    projection_to_dict,
)

__all__ = [
    "format_duration",
    "format_tokens",
    "format_usd",
    "load_batch_listing",
    "projection_to_dict",
    "render_projection",
    "render_routes",
]


# --- text -----------------------------------------------------------------------------


def format_tokens(count: int | None) -> str:
    """``7_422_000`` → ``"7.42M"``; ``None`` → ``"-"``."""
    if count is None:
        return "-"
    for size, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if abs(count) >= size:
            return f"{Decimal(count) / size:.2f}{suffix}"
    return str(count)


def _range(cost: CostRange) -> str:
    if cost.low == cost.high:
        return format_usd(cost.expected)
    return f"{format_usd(cost.expected)} ({format_usd(cost.low)}–{format_usd(cost.high)})"


def _market_table(projection: Projection) -> FitTable:
    rejected = len(projection.decisions.rejected)
    table = FitTable(
        Column("rank", "right", key=True),
        Column("provider", key=True),
        Column("$/M in", "right", drop=1),
        Column("$/M out", "right"),
        Column("uptime", "right", drop=0),
        Column("share", "right"),
        title=f"Routing for {projection.model_id}",
        caption=f"{rejected} endpoint(s) rejected by the policy" if rejected else None,
    )
    shares = {s.endpoint.slug: s.share for s in projection.mix}
    for entry in projection.ranked:
        endpoint = entry.endpoint
        pricing = endpoint.pricing
        share = shares.get(endpoint.slug, Decimal(0))
        cheapest = " (cheapest)" if endpoint == projection.cheapest else ""
        table.add_row(
            str(entry.rank),
            f"{endpoint.provider_name}{cheapest}",
            format_price(pricing.prompt, per=""),
            format_price(pricing.completion, per=""),
            format_percent(endpoint.uptime),
            f"{share:.2%}",
        )
    return table


def _dataset_table(projection: Projection) -> FitTable:
    workload = projection.workload
    table = FitTable(
        Column("dataset", key=True),
        Column("target", "right"),
        Column("requests", "right"),
        Column("prompt", "right", drop=2),
        Column("cached", "right", drop=0),
        Column("output", "right", drop=3),
        Column("reasoning", "right", drop=1),
        Column("cost, cheapest", "right"),
        Column("cost, routing mix", "right"),
        title=(
            f"Projection: {workload.prompt_tokens:.0f} prompt tokens, "
            f"{workload.completion_tokens:.0f} output tokens per response "
            f"({workload.low:.0f}–{workload.high:.0f}; {workload.source})"
        ),
    )
    for row in (*projection.datasets, projection.total):
        tokens = row.expected.tokens
        target = format_tokens(row.target_output_tokens)
        if not row.target_reached and row.name != "total":
            target += f" (stops at {row.limited_by})"
        table.add_row(
            row.name,
            target,
            f"{tokens.requests:,}",
            format_tokens(tokens.prompt_tokens),
            format_tokens(tokens.cached_tokens),
            format_tokens(tokens.completion_tokens),
            format_tokens(tokens.reasoning_tokens),
            _range(row.cost("cheapest")),
            _range(row.cost("mix")),
            end_section=row is projection.datasets[-1],
        )
    return table


def _fit_lines(fit: BudgetFit) -> list[str]:
    basis = "cheapest allowed endpoint" if fit.basis == "cheapest" else "expected routing mix"
    verdict = "fits" if fit.fits else "EXCEEDS"
    lines = [
        f"{basis}: the full plan needs {_range(fit.needed)} — {verdict} "
        f"the {format_usd(fit.budget)} budget"
    ]
    if fit.uniform_target is not None:
        conservative = fit.uniform_target_conservative
        lines.append(
            f"  largest uniform target per dataset that fits: "
            f"{format_tokens(fit.uniform_target)} output tokens"
            + (
                f" ({format_tokens(conservative)} at the high estimate)"
                if conservative != fit.uniform_target
                else ""
            )
        )
    elif not fit.fits_high:
        lines.append(
            f"  at the high estimate cap each dataset at "
            f"{format_tokens(fit.uniform_target_conservative)} output tokens"
        )
    if not fit.fits:
        whole = ", ".join(fit.whole_datasets) or "none"
        lines.append(f"  whole datasets in priority order: {whole}")
        if fit.partial is not None:
            lines.append(
                f"  then {format_tokens(fit.partial.output_tokens)} output tokens of "
                f"{fit.partial.name} ({format_usd(fit.partial.cost)})"
            )
    return lines


def render_projection(
    projection: Projection, *, file: TextIO, console: Console | None = None
) -> None:
    """Print ``projection`` as tables (and the budget fit as sentences) to ``file``
    (through ``console`` when given: its width, a terminal's or a pipe's)."""
    console = console if console is not None else make_console(file)
    console.print(_market_table(projection))
    console.print(_dataset_table(projection))
    for fit in projection.budget_fits:
        for line in _fit_lines(fit):
            console.print(line, highlight=False, markup=False)
    capacity = projection.capacity_limited
    if capacity is not None:
        premium = projection.max_premium
        how = (
            "no cap on the premium: every token at the dearest allowed endpoint's price"
            if premium is None
            else f"max_premium {premium}: the cheapest endpoint's cost × {1 + premium}"
        )
        console.print(
            f"when the cheapest endpoints are full: at most {_range(capacity)} ({how}; "
            "the routing mix assumes room everywhere)",
            highlight=False,
            markup=False,
        )


async def load_batch_listing(
    model_id: str, *, base_url: str | None = None, snapshot: str | None = None
) -> ModelEndpoints | None:
    """The model's ``:batch`` listing; None when a snapshot holds none (it was not read)."""
    if snapshot is not None:
        try:
            return await Catalog.load_snapshot(snapshot).batch_endpoints(model_id)
        except NotFoundError:
            return None
    async with Catalog(base_url=base_url) as catalog:
        return await catalog.batch_endpoints(model_id)


def format_duration(seconds: float | None) -> str:
    """``42 s``, ``17 min``, ``3 h 05 min``; ``unknown`` for None."""
    if seconds is None:
        return "unknown"
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest:02d} min"


def _money(value: Decimal | None) -> str:
    return "—" if value is None else f"${value:,.2f}"


def _fit(option: RouteOption) -> str:
    fits = option.fits()
    if fits is None:
        return "—" if option.projection is None else "no budget given"
    if fits:
        return "yes"
    assert option.projection is not None
    fit = option.projection.budget_fit("cheapest")
    cap = None if fit is None else fit.uniform_target
    return "no" if cap is None else f"no: {cap:,} output tokens per dataset fit"


def _row(option: RouteOption) -> list[str]:
    high = None if option.projection is None else option.projection.total.high.cost("cheapest")
    when = format_duration(option.expected_seconds)
    if option.batches:
        when += f" ({option.batches} batches)"
    worst = format_duration(option.worst_seconds)
    if option.route == "batch" and option.projection is not None:
        worst += " (the window)"
    return [option.route, _money(option.expected_cost), _money(high), when, worst, _fit(option)]


def _routes_line(choices: Sequence[RouteChoice]) -> str:
    parts = [f"{c.dataset} {c.route}" for c in choices]
    reasons = sorted({c.reason for c in choices})
    return "Routes: " + ", ".join(parts) + " (" + "; ".join(reasons) + ")."


def render_routes(
    comparison: RouteComparison, *, file: TextIO, console: Console | None = None
) -> None:
    """Print sync and batch side by side, the saving, and each dataset's route (through
    ``console`` when given; its sentences broken at spaces on a terminal, whole in a pipe)."""
    console = console if console is not None else make_console(file)
    console.print()
    batch = comparison.batch
    if not batch.available:
        print_wrapped(console, f"Batch route: {batch.reason}.")
        print_wrapped(console, _routes_line(comparison.choices))
        return
    pin = ", ".join(comparison.batch_route.only)
    print_wrapped(
        console,
        f"Sync or batch (sync at {comparison.concurrency:,} in flight; the batch pinned to "
        f"{pin}: {batch.reason}):",
    )
    table = FitTable(
        Column("route", key=True),
        Column("expected cost", "right"),
        Column("high cost", "right", drop=1),
        Column("expected time", "right"),
        Column("worst time", "right", drop=0),
        Column("fits budget", below=True, labelled=True),
    )
    table.add_row(*_row(comparison.sync))
    table.add_row(*_row(batch))
    console.print(table)
    saving = comparison.saving
    sync_cost = comparison.sync.expected_cost
    if saving is not None and sync_cost:
        share = saving / sync_cost * 100
        verb = "saves" if saving >= 0 else "costs"
        print_wrapped(
            console,
            f"Batch {verb} {_money(abs(saving))} ({abs(share):.0f} %) and may take up to its "
            "24 h window; one provider serves each batch, and the pin is the only "
            "quantization filter (docs/batch.md).",
        )
    print_wrapped(console, _routes_line(comparison.choices))
