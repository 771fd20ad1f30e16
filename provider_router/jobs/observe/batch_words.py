"""The batch route's figures in words: the sentence every view says of each dataset
(:func:`batch_sentences`), the window in words, and ``report.html``'s Batches section.

``batches of a: 3 submitted (1 in progress, 2 completed); 40 lines done, 2 failed, 20 in
batches; $0.012 held, $0.034 booked; at Together; the oldest live batch's 24 h window
ends in 23 h 52 min.``
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from provider_router._format import format_usd
from provider_router.jobs.observe.batch_view import STATES, BatchRow, BatchView, DatasetBatches

__all__ = ["batch_sentences", "batch_table", "window_words"]


def _duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    if seconds >= 60:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def window_words(d: DatasetBatches, now: float) -> str | None:
    """The oldest live batch's window, in words (None: no live batch)."""
    left = d.window_left(now)
    if left is None:
        return None
    if left <= 0:
        return (
            f"the oldest live batch is {_duration(-left)} past its 24 h window "
            "(OpenRouter may still finish it, or expire it)"
        )
    return f"the oldest live batch's 24 h window ends in {_duration(left)}"


def _state_words(d: DatasetBatches) -> str:
    parts = [f"{n:,} {state.replace('_', ' ')}" for state, n in d.states.items() if n]
    return ", ".join(parts) if parts else "none yet"


def batch_sentences(view: BatchView, now: float) -> list[str]:
    """One plain sentence per dataset, then the problems: what every view says.

    ``batches of a: 3 submitted (1 in progress, 2 completed); 40 lines done, 2 failed,
    20 in batches; $0.012 held, $0.034 booked; at Together; the oldest live batch's 24 h
    window ends in 23 h 52 min.``
    """
    lines = []
    for d in view.datasets:
        providers = ", ".join(
            f"{name}" + ("" if len(d.providers) == 1 else f" ({n:,})")
            for name, n in sorted(d.providers.items())
        )
        window = window_words(d, now)
        lines.append(
            f"batches of {d.name}: {d.submitted:,} submitted ({_state_words(d)}); "
            f"{d.lines_done:,} lines done, {d.lines_failed:,} failed, "
            f"{d.lines_in_batches:,} in batches; {format_usd(d.held)} held, "
            f"{format_usd(d.booked)} booked"
            + (f"; at {providers}" if providers else "")
            + (f"; {window}" if window else "")
            + "."
        )
    lines.extend(view.problems)
    return lines


def _table(name: str, head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    cells = "".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    heads = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f'<table data-table="{name}"><tr>{heads}</tr>{cells}</table>'


def _dataset_row(d: DatasetBatches, states: Sequence[str], now: float) -> list[str]:
    left = window_words(d, now)
    return [
        d.name,
        f"{d.submitted:,}",
        *(f"{d.states[s]:,}" for s in states),
        f"{d.lines_done:,}",
        f"{d.lines_failed:,}",
        f"{d.lines_in_batches:,}",
        format_usd(d.held),
        format_usd(d.booked),
        ", ".join(f"{p} ({n:,})" for p, n in sorted(d.providers.items())) or "-",
        "-" if left is None else left,
    ]


def _batch_row(b: BatchRow) -> list[str]:
    return [
        b.dataset,
        b.batch_id or f"({b.intent}: no batch id)",
        b.state.replace("_", " "),
        b.provider or "-",
        f"{b.lines:,}",
        f"{b.failed:,}",
        format_usd(b.held),
        format_usd(b.booked),
    ]


def batch_table(view: BatchView, now: float) -> str:
    """``report.html``'s Batches section: a table per dataset, the sentences, then each
    batch (folded: a job may have hundreds)."""
    if not view.datasets and not view.problems:
        return ""
    # The states some dataset has a batch in: a table a screen wide, not ten zero columns.
    states = [s for s in STATES if any(d.states[s] for d in view.datasets)]
    head = ["dataset", "submitted", *(s.replace("_", " ") for s in states)]
    head += ["lines done", "lines failed", "in batches", "held", "booked", "providers", "window"]
    sentences = "".join(f'<p class="batch">{escape(s)}</p>' for s in batch_sentences(view, now))
    each = ["dataset", "batch", "state", "provider", "lines", "failed", "held", "booked"]
    return (
        "<h2>Batches</h2>"
        + _table("batches", head, (_dataset_row(d, states, now) for d in view.datasets))
        + sentences
        + f"<details><summary>Each batch ({len(view.batches):,})</summary>"
        + _table("each-batch", each, (_batch_row(b) for b in view.batches))
        + "</details>"
    )
