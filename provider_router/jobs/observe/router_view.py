"""What OpenRouter's routing trace said of a run, for ``status`` and ``report.html``.

A job asks every answer for its trace (:mod:`provider_router.jobs.router_options`):
the attempts that failed inside OpenRouter before one answered, and the pipeline
stages that changed the request. The one that damages training data is context
compression (the middle of a prompt dropped): its rows are flagged in the outputs
and named here, beside what the run asked of OpenRouter (``summary.json``'s
``openrouter``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any, Final, Protocol

__all__ = ["TracedRow", "router_section", "router_status_lines", "settings_words"]

_NAMED: Final = 10
"""Compressed rows named on the page at most (the outputs flag every one)."""


class TracedRow(Protocol):
    """What the page needs of one output record's trace."""

    @property
    def dataset(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def compressed(self) -> bool: ...


def settings_words(asked: Mapping[str, Any]) -> str:
    """What the run asked of OpenRouter, in words."""
    compression = asked.get("context_compression")
    return "; ".join(
        [
            "routing trace on" if asked.get("router_metadata") else "routing trace off",
            "context compression off" if compression == "off" else "context compression allowed",
            "distillable models only"
            if asked.get("enforce_distillable_text")
            else "any model (distillable text not enforced)",
        ]
    )


def _counts(summary: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(OpenRouter fallbacks, compressed rows) per dataset in the summary's last run."""
    out = {}
    datasets = summary.get("datasets")
    for name, d in (datasets if isinstance(datasets, dict) else {}).items():
        run = d.get("this_run") or {}
        out[name] = (
            int(run.get("openrouter_fallbacks") or 0),
            int(run.get("context_compressed") or 0),
        )
    return out


def router_status_lines(
    summary: Mapping[str, Any] | None, row: Mapping[str, Any] | None
) -> list[str]:
    """``status``'s lines: compressed rows so far, and what the run asked."""
    lines = []
    compressed = 0
    if row is not None:
        compressed = int(row.get("context_compressed") or 0)
    elif summary is not None:
        compressed = sum(c for _, c in _counts(summary).values())
    if compressed:
        lines.append(
            f"context compression cut {compressed:,} prompt{'s' if compressed != 1 else ''}: "
            "those rows are flagged context_compressed in the outputs"
        )
    asked = (summary or {}).get("openrouter")
    if row is None and isinstance(asked, Mapping):
        lines.append(f"asked of OpenRouter: {settings_words(asked)}")
    return lines


def router_section(summary: Mapping[str, Any] | None, rows: Iterable[TracedRow]) -> str:
    """The report's "OpenRouter's routing trace" section (empty when the run had none)."""
    asked = (summary or {}).get("openrouter")
    if not isinstance(asked, Mapping):
        return ""
    counts = _counts(summary or {})
    table = "".join(
        f"<tr><td>{escape(name)}</td><td>{fallbacks:,}</td><td>{compressed:,}</td></tr>"
        for name, (fallbacks, compressed) in counts.items()
    )
    flagged = [r for r in rows if r.compressed]
    named = ", ".join(escape(f"{r.dataset}/{r.id}") for r in flagged[:_NAMED])
    more = f" and {len(flagged) - _NAMED:,} more" if len(flagged) > _NAMED else ""
    rows_line = (
        f'<p class="problem">Compressed rows (the middle of their prompt was dropped before '
        f"the model saw it; flagged context_compressed): {named}{more}</p>"
        if flagged
        else ""
    )
    return (
        "<h2>OpenRouter's routing trace</h2>"
        f'<p class="meta">Asked of OpenRouter: {escape(settings_words(asked))}.</p>'
        "<table><tr><th>dataset</th><th>attempts failed inside OpenRouter</th>"
        f"<th>context-compressed rows</th></tr>{table}</table>{rows_line}"
    )
