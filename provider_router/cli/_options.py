"""Option types and option groups that several sub-commands share.

Counts are read as people write them (``"10M"``, ``"250k"``, ``"2,000"``) and
amounts in USD by one strict reader for every USD flag (``"5"``, ``"$5"``,
``"1,000.50"``: ASCII digits, one dollar sign, no exponent, no finer than the
ledger's picodollar, no more than a ledger holds); a bad value is an
``argparse.ArgumentTypeError``, so argparse names the flag and exits 2.
The market flags (``--base-url``, ``--snapshot``) and :func:`load_listing` serve
every command that looks at a model's endpoints.
"""

from __future__ import annotations

import argparse
import re
from decimal import Decimal, InvalidOperation
from typing import Final, Literal

from provider_router._money import LEDGER_MAX_USD, UNITS_PER_USD
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
    "positive_usd",
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


_AMOUNT: Final = re.compile(
    r"^(?P<sign>-?)(?P<dollar>\$?)(?P<inner>-?)(?P<whole>[0-9][0-9,_]*|)(?:\.(?P<frac>[0-9]+))?$",
    re.ASCII,
)
_DECIMALS: Final = len(str(UNITS_PER_USD)) - 1
"""Decimals of a picodollar, the ledger's unit (an amount finer than it is refused)."""


def usd(text: str) -> Decimal:
    """An amount in USD, exact, as people write it (``"5"``, ``"$5"``, ``"0.25"``,
    ``"1,000.50"``): ASCII digits, at most one dollar sign, no exponent, at most
    12 decimals (the ledger's unit is a picodollar) and at most what a ledger holds
    exactly (:data:`~provider_router._money.LEDGER_MAX_USD`).
    """
    read = _amount(text.strip())
    if read is None:
        raise argparse.ArgumentTypeError(f"not an amount in USD: {text!r} ({_why(text)})")
    value, decimals = read
    if abs(value) > LEDGER_MAX_USD:
        raise argparse.ArgumentTypeError(
            f"{text!r} is above the largest amount a ledger holds exactly (${LEDGER_MAX_USD:,})"
        )
    if decimals > _DECIMALS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is finer than a picodollar ($0.000000000001), the ledger's unit"
        )
    return value


def _amount(text: str) -> tuple[Decimal, int] | None:
    """``text`` as an amount and its significant decimals, or None."""
    match = _AMOUNT.match(text)
    if match is None or (match["sign"] and match["inner"]):
        return None
    whole, frac = match["whole"], match["frac"]
    if not whole and frac is None:
        return None
    if whole.endswith((",", "_")) or ",," in whole or "__" in whole:
        return None
    digits = (whole.replace(",", "").replace("_", "") or "0") + (f".{frac}" if frac else "")
    value = Decimal(digits)
    decimals = len((frac or "").rstrip("0"))
    return (-value if match["sign"] or match["inner"] else value), decimals


def _why(text: str) -> str:
    """What makes ``text`` unreadable as an amount, in a few words."""
    body = text.strip()
    if body.count("$") > 1:
        return "one dollar sign at most"
    if any(c.isdigit() and not c.isascii() for c in body):
        return "ASCII digits 0-9 only"
    if re.search(r"[0-9.][eE][+-]?[0-9]", body):
        return "no exponent: write the digits, e.g. 0.25"
    return "write digits, e.g. 5, $5 or 0.25"


def non_negative_usd(text: str) -> Decimal:
    """A :func:`usd` amount ``>= 0`` (a limit, a top-up)."""
    value = usd(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a non-negative amount in USD: {text!r}")
    return value


def positive_usd(text: str) -> Decimal:
    """A :func:`usd` amount ``> 0`` (an amount added to a limit: zero adds nothing)."""
    value = usd(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than $0, got {text!r}")
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
    group.add_argument(
        "--snapshot",
        metavar="FILE",
        help="read the market from a snapshot file, offline (default: fetch it)",
    )


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
