"""Shared output helpers for the command line: consoles, money and JSON formatting.

Tables go to stdout through :func:`make_console`: on a terminal at its width, in
colour; piped, plain and :data:`PIPE_WIDTH` wide (or ``$COLUMNS``), so a table
(:class:`~provider_router._table.FitTable`) is one greppable line per row. Money
is shown through :mod:`provider_router._format` (re-exported here); JSON carries
Decimals as exact, exponent-free strings so nothing is rounded through a float.
"""

from __future__ import annotations

import json
import os
import sys
from decimal import Decimal
from enum import Enum
from typing import IO, Any, Final

from rich.console import Console

from provider_router._format import decimal_str, format_percent, format_price, format_usd
from provider_router._table import wrap_words

__all__ = [
    "format_per_million",
    "format_percent",
    "format_usd",
    "make_console",
    "pipe_width",
    "print_json",
    "print_wrapped",
    "to_jsonable",
]

PIPE_WIDTH: Final = 100
"""Columns used when stdout is not a terminal and ``$COLUMNS`` does not say: wide
enough for every table's row on one line, narrow enough for a log or an editor."""


def pipe_width() -> int:
    """The width of output that is not a terminal: ``$COLUMNS`` if set, else
    :data:`PIPE_WIDTH`."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return PIPE_WIDTH
    return columns if columns >= 40 else PIPE_WIDTH


class _Console(Console):
    """A console whose reader may leave (``| head``): that is not our error, and
    :func:`provider_router.cli.main` ends quietly with 0 (rich's own would exit 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def make_console(file: IO[str] | None = None) -> Console:
    """A rich console on ``file`` (default: the current ``sys.stdout``)."""
    out = file if file is not None else sys.stdout
    interactive = out.isatty()
    return _Console(
        file=out,
        width=None if interactive else pipe_width(),
        highlight=False,
        soft_wrap=False,
        no_color=not interactive,
    )


def print_wrapped(console: Console, line: str, *, hang: int | None = None) -> None:
    """``line`` broken at spaces to a terminal's width, its continuation lines indented
    ``hang`` columns (default: two more than the line itself); piped, one line whole (a
    log line ``grep`` finds). Plain text: no markup, nothing cut."""
    if not console.is_terminal:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    indent = len(line) - len(line.lstrip(" "))
    margin = " " * (indent + 2 if hang is None else hang)
    for index, part in enumerate(wrap_words(line.strip(), max(console.width - len(margin), 20))):
        text = (" " * indent if index == 0 else margin) + part
        console.print(text, markup=False, highlight=False, soft_wrap=True)


def format_per_million(price_per_token: Decimal | None) -> str:
    """A per-token price as dollars per million tokens: ``$2.20``; ``-`` when unknown."""
    return format_price(price_per_token, per="")


def to_jsonable(value: Any) -> Any:
    """Decimals → strings, enums → values, tuples/sets → lists, recursively."""
    if isinstance(value, Decimal):
        return decimal_str(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [to_jsonable(v) for v in value]
        return sorted(items) if isinstance(value, set | frozenset) else items
    return value


def print_json(value: Any, *, file: IO[str] | None = None) -> None:
    """Write ``value`` as indented JSON (exact Decimals as strings) and a newline."""
    out = file if file is not None else sys.stdout
    out.write(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False) + "\n")
