"""Money, prices and percentages as people read them, and as exact JSON strings.

One module for every table, message and file we write, so the same amount never
reads two ways: :func:`decimal_str` (exact canonical text for files and JSON, never
an exponent, never rounded), :func:`format_usd` (cents; a non-zero amount below a
cent keeps two significant digits, so it never reads as ``$0.00``),
:func:`format_price` (per million tokens, with significant digits) and
:func:`format_percent` (more decimals when one would read as a different number).

Display rounding is half-even and happens only here; the values themselves stay
exact.
"""

from __future__ import annotations

import dataclasses
from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal, localcontext
from typing import Final

__all__ = [
    "decimal_str",
    "readable_repr",
    "tidy",
    "format_percent",
    "format_price",
    "format_usd",
    "round_up_to_cent",
]

CENT: Final = Decimal("0.01")
PER_MILLION: Final = Decimal(1_000_000)
_SIGNIFICANT: Final = 2
_MAX_PERCENT_PLACES: Final = 6


def decimal_str(value: Decimal) -> str:
    """Exact, canonical, exponent-free text of ``value`` (trailing zeros dropped).

    Unlike ``Decimal.normalize`` this never rounds to the context precision.
    """
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def tidy(value: Decimal) -> Decimal:
    """The same amount with its digits as people write them: ``0E-12`` → ``0``,
    ``0.050000000000`` → ``0.05`` (exact: only the exponent changes)."""
    return Decimal(decimal_str(value))


def readable_repr(obj: object) -> str:
    """A dataclass's repr with its money tidied: ``spent=Decimal('0.05')``, never
    ``Decimal('0.050000000000')`` or ``Decimal('0E-12')``. Set ``__repr__ = readable_repr``."""
    parts = []
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        if not f.repr:
            continue
        value = getattr(obj, f.name)
        if isinstance(value, Decimal) and value.is_finite():
            value = tidy(value)
        parts.append(f"{f.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"


def _significant(amount: Decimal, digits: int = _SIGNIFICANT) -> Decimal:
    """``amount`` rounded to ``digits`` significant digits (half-even), never to zero."""
    places = digits - amount.adjusted() - 1
    return amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)


def format_usd(amount: Decimal | int | None, *, places: int = 2) -> str:
    """``$1,234.57`` to ``places`` decimals; sub-cent amounts with significant digits.

    ``None`` (unknown) is ``-``; zero is ``$0.00``; a non-zero amount that would
    round to zero at ``places`` keeps two significant digits instead (``$0.0042``).
    """
    if amount is None:
        return "-"
    amount = Decimal(amount)
    if not amount.is_finite():
        return f"${amount}"
    quantum = Decimal(1).scaleb(-places)
    with localcontext() as exact:
        # Enough digits for any amount: the default 28 cannot quantize $1E+26 to cents.
        exact.prec = max(exact.prec, amount.adjusted() + places + 2)
        shown = amount.quantize(quantum, rounding=ROUND_HALF_EVEN)
        if amount != 0 and abs(amount) < quantum:
            shown = _significant(amount)
        sign = "-" if shown < 0 else ""
        return f"{sign}${abs(shown):,f}"


def format_price(price_per_token: Decimal | None, *, per: str = "/M") -> str:
    """A per-token price per million tokens: ``$2.20``, ``$0.0000001``; ``-`` when unknown.

    At least cents; smaller prices keep their significant digits (exact when
    they have few, otherwise three significant digits).
    """
    if price_per_token is None:
        return "-"
    per_million = price_per_token * PER_MILLION
    if per_million == 0 or abs(per_million) >= CENT:
        text = format_usd(per_million, places=_price_places(per_million))
    else:
        short = _significant(per_million, 3)
        text = f"${decimal_str(short if short != per_million else per_million)}"
    return text + per if per else text


def _price_places(per_million: Decimal) -> int:
    # $2.20 stays $2.20; $0.0375 keeps its four decimals (prices are listed that way).
    if per_million == per_million.quantize(CENT):
        return 2
    return 4


def format_percent(value: float | Decimal | None, *, places: int = 1) -> str:
    """``99.8%``, with more decimals when ``places`` would show a different number.

    A value that rounds to 100 (or 0) but is not exactly that gets as many
    decimals as it takes to tell them apart: 99.971 → ``99.97%``. ``-`` when unknown.
    """
    if value is None:
        return "-"
    number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    for digits in range(places, _MAX_PERCENT_PLACES + 1):
        shown = number.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_EVEN)
        if shown not in (100, 0) or shown == number:
            break
    return f"{shown:f}%"


def round_up_to_cent(amount: Decimal) -> Decimal:
    """``amount`` rounded up to a whole cent (a budget that must cover it)."""
    return amount.quantize(CENT, rounding=ROUND_CEILING)
