"""``provider-router project``'s sync-or-batch table, and the batch listing it reads.

:func:`load_batch_listing` reads the ``:batch`` listing the way the CLI reads the sync
one (a snapshot, else the catalog); :func:`render_routes` prints a
:class:`~provider_router.route_choice.RouteComparison` in plain sentences and a small
table, beside the sync projection.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import TextIO

from provider_router._exceptions import NotFoundError
from provider_router.catalog import Catalog
from provider_router.records import ModelEndpoints
from provider_router.route_choice import RouteChoice, RouteComparison, RouteOption

__all__ = ["format_duration", "load_batch_listing", "render_routes"]


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


def _table(rows: Sequence[Sequence[str]], file: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(),
            file=file,
        )


def _routes_line(choices: Sequence[RouteChoice]) -> str:
    parts = [f"{c.dataset} {c.route}" for c in choices]
    reasons = sorted({c.reason for c in choices})
    return "Routes: " + ", ".join(parts) + " (" + "; ".join(reasons) + ")."


def render_routes(comparison: RouteComparison, *, file: TextIO) -> None:
    """Print sync and batch side by side, the saving, and each dataset's route."""
    print("", file=file)
    batch = comparison.batch
    if not batch.available:
        print(f"Batch route: {batch.reason}.", file=file)
        print(_routes_line(comparison.choices), file=file)
        return
    pin = ", ".join(comparison.batch_route.only)
    print(
        f"Sync or batch (sync at {comparison.concurrency:,} in flight; the batch pinned to "
        f"{pin}: {batch.reason}):",
        file=file,
    )
    header = ["route", "expected cost", "high cost", "expected time", "worst time", "fits budget"]
    _table([header, _row(comparison.sync), _row(batch)], file)
    saving = comparison.saving
    sync_cost = comparison.sync.expected_cost
    if saving is not None and sync_cost:
        share = saving / sync_cost * 100
        verb = "saves" if saving >= 0 else "costs"
        print(
            f"Batch {verb} {_money(abs(saving))} ({abs(share):.0f} %) and may take up to its "
            "24 h window; one provider serves each batch, and the pin is the only "
            "quantization filter (docs/batch.md).",
            file=file,
        )
    print(_routes_line(comparison.choices), file=file)
