"""Shared output helpers for the command line: consoles, money and JSON formatting.

Tables go to stdout through :func:`make_console`, which widens the page when
stdout is not a terminal so piped output is not wrapped at 80 columns. Money
is shown through :mod:`provider_router._format` (re-exported here); JSON carries
Decimals as exact, exponent-free strings so nothing is rounded through a float.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from enum import Enum
from typing import IO, Any, Final

from rich.console import Console

from provider_router._format import decimal_str, format_percent, format_price, format_usd

__all__ = [
    "format_per_million",
    "format_percent",
    "format_usd",
    "make_console",
    "print_json",
    "to_jsonable",
]

PIPE_WIDTH: Final = 200
"""Columns used when stdout is not a terminal (tables must not wrap in logs and pipes)."""


def make_console(file: IO[str] | None = None) -> Console:
    """A rich console on ``file`` (default: the current ``sys.stdout``)."""
    out = file if file is not None else sys.stdout
    interactive = out.isatty()
    return Console(
        file=out,
        width=None if interactive else PIPE_WIDTH,
        highlight=False,
        soft_wrap=False,
        no_color=not interactive,
    )


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
