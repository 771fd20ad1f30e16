"""Option types and option groups that several sub-commands share.

Counts are read as people write them (``"10M"``, ``"250k"``, ``"2,000"``) and
amounts in USD with or without a dollar sign (``"5"``, ``"$5"``); a bad value
is an ``argparse.ArgumentTypeError``, so argparse names the flag and exits 2.
The market flags (``--base-url``, ``--snapshot``) and :func:`load_listing` serve
every command that looks at a model's endpoints.
"""

from __future__ import annotations

import argparse
import re
from decimal import Decimal, InvalidOperation
from typing import Final, Literal

from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import ModelEndpoints, Quantization

__all__ = [
    "PRECISIONS",
    "add_market_arguments",
    "budget_usd",
    "max_premium",
    "load_listing",
    "non_negative_usd",
    "parse_count",
    "positive_count",
    "usd",
]

PRECISIONS: Final = [
    q.value for q in Quantization if q not in (Quantization.UNKNOWN, Quantization.UNRECOGNIZED)
]
"""What ``--exclude-below`` accepts: every known precision (anything else is a usage error)."""
_SUFFIXES: Final = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
_COUNT: Final = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*([kKmMgGbB]?)\s*$")


def parse_count(text: str) -> int:
    """``"10M"`` → 10,000,000; ``"7.5m"``, ``"250k"``, ``"1_000"`` and ``"2,000"`` work too.

    Raises:
        argparse.ArgumentTypeError: not a whole, non-negative count.
    """
    match = _COUNT.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r} (e.g. 2000, 250k, 10M)")
    number = Decimal(match.group(1).replace("_", "").replace(",", ""))
    value = number * _SUFFIXES[match.group(2).lower()]
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens")
    return int(value)


def positive_count(text: str) -> int:
    """A :func:`parse_count` count of at least 1."""
    value = parse_count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def usd(text: str) -> Decimal:
    """Any finite amount in USD, exact (``"5"``, ``"$5"``, ``"0.25"``)."""
    try:
        value = Decimal(text.strip().lstrip("$"))
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not an amount in USD: {text!r}") from None
    if not value.is_finite():
        raise argparse.ArgumentTypeError(f"not an amount in USD: {text!r}")
    return value


def non_negative_usd(text: str) -> Decimal:
    """A :func:`usd` amount ``>= 0`` (a limit, a top-up)."""
    value = usd(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a non-negative amount in USD: {text!r}")
    return value


def budget_usd(text: str) -> Decimal:
    """A :func:`usd` amount ``> 0`` (a budget)."""
    value = usd(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a budget must be more than $0, got {text!r}")
    return value


def max_premium(text: str) -> Decimal | Literal["none"]:
    """``--max-premium``: a share of the floor ``>= 0`` (``0.02`` is 2 %), or ``none``."""
    if text.strip().lower() == "none":
        return "none"
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError(
            f"a share of the floor >= 0 (0.02 is 2 %) or none, got {text!r}"
        )
    return value


def add_market_arguments(group: argparse._ActionsContainer) -> None:
    """``--base-url`` and ``--snapshot``, into ``group`` (plain or mutually exclusive).

    Read them back with :func:`load_listing`.
    """
    group.add_argument(
        "--base-url", metavar="URL", help="API root (default: $OPENROUTER_BASE_URL or OpenRouter)"
    )
    group.add_argument("--snapshot", metavar="FILE", help="read the market from a snapshot file")


async def load_listing(
    model_id: str,
    *,
    base_url: str | None = None,
    snapshot: str | None = None,
    save_snapshot: str | None = None,
) -> ModelEndpoints:
    """The endpoints of ``model_id`` from a snapshot file, or fetched.

    With ``save_snapshot``, what was read is also written there as a snapshot file
    that ``--snapshot`` reads back (offline, reproducible).
    """
    if snapshot is not None:
        # An offline catalog never opens a session: nothing to close.
        offline = Catalog.load_snapshot(snapshot)
        listing = await offline.endpoints(model_id)
        if save_snapshot is not None:
            offline.save_snapshot(save_snapshot)
        return listing
    async with Catalog(base_url=base_url) as catalog:
        listing = await catalog.endpoints(model_id)
        if save_snapshot is not None:
            catalog.save_snapshot(save_snapshot)
        return listing
