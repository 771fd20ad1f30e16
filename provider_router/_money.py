"""Exact money: Decimal at the API, integer units where a store needs integers.

One unit is 10^-12 USD (a picodollar). OpenRouter lists per-token prices with at
most about ten decimals, so price × tokens is exact in these units, and an int64
still holds over nine million dollars.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Final

UNITS_PER_USD: Final = 10**12
LEDGER_MAX_USD: Final = Decimal(4_000_000)
"""The largest limit (and single cost) a ledger accepts: every backend holds it exactly.

SQLite stores picodollars in signed 64-bit integers (up to about $9.2 million);
this cap leaves room above a full budget for costs that overran their holds.
"""
LEDGER_MAX_UNITS: Final = int(LEDGER_MAX_USD) * UNITS_PER_USD
TERA: Final = Decimal("1E+12")
"""UNITS_PER_USD as a Decimal of one digit: ``amount * TERA`` is the amount in units."""
_PICO: Final = Decimal("1E-12")  # one unit in USD


_NUMBER_TEXT: Final = re.compile(r"\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
_NUMBER_BYTES: Final = re.compile(rb"\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
# The same number right after the colon (no whitespace: how OpenRouter writes it):
# no ``\s*`` to try and no group to copy, a third less time. When it does not
# match, the patterns above decide, so the result is theirs on any text.
_BARE_TEXT: Final = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_BARE_BYTES: Final = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_NEEDLES: dict[str, bytes] = {}  # '"key":' as bytes, by key (a handful of keys)


def exact_json_number(raw: bytes | str, key: str) -> Decimal | None:
    """The last ``"key": <number>`` in raw JSON text, digit for digit; ``None`` if absent.

    A quote inside a JSON string is always escaped, so ``"key":`` in the raw text
    is a key, never string content. Scanning the text once costs far less than
    decoding every float of a body into an exact type.
    """
    if isinstance(raw, str):
        at = raw.rfind(f'"{key}":')
        if at < 0:
            return None
        start = at + len(key) + 3
        bare = _BARE_TEXT.match(raw, start)
        if bare is not None:
            return Decimal(bare[0])
        found = _NUMBER_TEXT.match(raw, start)
        return Decimal(found[1]) if found else None
    needle = _NEEDLES.get(key)
    if needle is None:
        needle = _NEEDLES[key] = b'"' + key.encode() + b'":'
    at = raw.rfind(needle)
    if at < 0:
        return None
    start = at + len(needle)
    match = _BARE_BYTES.match(raw, start)
    if match is not None:
        return Decimal(match[0].decode())
    match = _NUMBER_BYTES.match(raw, start)
    return Decimal(match[1].decode()) if match else None


def pin_exact_cost(parsed: object, raw: bytes | str) -> None:
    """Replace the float ``usage.cost`` (or ``data.total_cost``) of a decoded body by
    the exact Decimal written in ``raw``, so money never goes through a binary float.

    Only when the number found in the text is the one decoded (a guard against an
    unusual layout); otherwise the float stays and :func:`to_decimal` reads its repr.
    """
    if not isinstance(parsed, dict):
        return
    for outer, key in (("usage", "cost"), ("data", "total_cost")):
        holder = parsed.get(outer)
        if isinstance(holder, dict):
            value = holder.get(key)
            if isinstance(value, float):
                exact = exact_json_number(raw, key)
                if exact is not None and float(exact) == value:
                    holder[key] = exact


def to_decimal(value: object, *, what: str = "amount") -> Decimal:
    """Parse a JSON number or numeric string into an exact, finite Decimal.

    Floats go through ``repr`` so ``0.1`` becomes ``Decimal("0.1")``, not its
    binary expansion (bodies from OpenRouter have their cost pinned exactly first:
    :func:`pin_exact_cost`).
    Raises ``ValueError`` naming ``what`` for anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number, got a boolean")
    if isinstance(value, Decimal):
        result = value
    elif isinstance(value, int):
        result = Decimal(value)
    elif isinstance(value, float):
        result = Decimal(repr(value))
    elif isinstance(value, str):
        try:
            result = Decimal(value.strip())
        except InvalidOperation:
            raise ValueError(f"{what} must be a decimal number, got {value!r}") from None
    else:
        raise ValueError(f"{what} must be a number, got {type(value).__name__}")
    if not result.is_finite():
        raise ValueError(f"{what} must be finite, got {value!r}")
    return result


def reported_cost(value: object) -> Decimal | None:
    """A cost as OpenRouter reports it (``usage.cost``, ``total_cost``), or ``None``.

    Only a JSON number is a cost: an ``int``, a finite ``float`` or a finite
    ``Decimal`` (pinned from the wire's digits by :func:`pin_exact_cost`). A string
    (``"0.001"``), a boolean, ``NaN`` or an infinity is not a number OpenRouter
    writes: it is *missing*, and the caller asks ``/generation`` or holds the worst
    case (docs/ledger.md, "What proves a payment"). A negative number is returned
    as it is: the caller disputes it (a charge cannot be negative).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, Decimal):
        return value if value.is_finite() else None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else None
    return None


def to_units(amount: Decimal, *, round_up: bool = False) -> int:
    """USD → integer picodollars; exact for any amount with ≤ 12 decimals.

    Amounts finer than a picodollar round half-even, or up with ``round_up``
    (reservations round up so a hold is never smaller than its worst case).
    """
    # ``amount * 1E+12`` is amount / 10^-12: the same digits with the exponent
    # moved, rounded to the context's precision the same way (like scaleb(12),
    # without scaleb's argument parsing). ``__ceil__`` and ``__round__`` round to
    # an int in one step (ROUND_CEILING, ROUND_HALF_EVEN, whatever the context's
    # rounding). Three conversions per request; tests/test_money.py holds this
    # equal to the division it replaces, under any precision.
    scaled = amount * TERA
    return scaled.__ceil__() if round_up else scaled.__round__()


def from_units(units: int) -> Decimal:
    """Integer picodollars → USD, exact."""
    # Decimal(units).scaleb(-12), in one operation (tests/test_money.py).
    return units * _PICO
