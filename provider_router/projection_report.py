"""Projections as JSON-ready dicts (and, for the CLI, as text).

Money and fractional token counts become decimal strings, so a reader can
parse them back exactly.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TextIO

from rich.console import Console
from rich.table import Table

from provider_router._format import format_percent, format_price, format_usd
from provider_router.projection_result import (
    BudgetFit,
    CostRange,
    Projection,
    projection_to_dict,
)

__all__ = ["format_tokens", "format_usd", "projection_to_dict", "render_projection"]


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


def _market_table(projection: Projection) -> Table:
    table = Table(title=f"Routing for {projection.model_id}", title_justify="left")
    for column in ("rank", "provider", "$/M in", "$/M out", "uptime", "share"):
        table.add_column(column, justify="left" if column == "provider" else "right")
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
    rejected = len(projection.decisions.rejected)
    if rejected:
        table.caption = f"{rejected} endpoint(s) rejected by the policy"
    return table


def _dataset_table(projection: Projection) -> Table:
    workload = projection.workload
    table = Table(
        title=(
            f"Projection: {workload.prompt_tokens:.0f} prompt tokens, "
            f"{workload.completion_tokens:.0f} output tokens per response "
            f"({workload.low:.0f}–{workload.high:.0f}; {workload.source})"
        ),
        title_justify="left",
    )
    for column in (
        "dataset",
        "target",
        "requests",
        "prompt",
        "cached",
        "output",
        "reasoning",
        "cost, cheapest",
        "cost, routing mix",
    ):
        table.add_column(column, justify="left" if column == "dataset" else "right")
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


def render_projection(projection: Projection, *, file: TextIO) -> None:
    """Print ``projection`` as tables (and the budget fit as sentences) to ``file``."""
    console = Console(file=file, width=None if file.isatty() else 140, soft_wrap=False)
    console.print(_market_table(projection))
    console.print(_dataset_table(projection))
    for fit in projection.budget_fits:
        for line in _fit_lines(fit):
            console.print(line, highlight=False, markup=False)
