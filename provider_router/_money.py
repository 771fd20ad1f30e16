"""Exact money: Decimal at the API, integer units where a store needs integers.

One unit is 10^-12 USD (a picodollar). OpenRouter lists per-token prices with at
most about ten decimals, so price × tokens is exact in these units, and an int64
still holds over nine million dollars.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Final

UNITS_PER_USD: Final = 10**12
LEDGER_MAX_USD: Final = Decimal(4_000_000)
"""The largest limit (and single cost) a ledger accepts: every backend holds it exactly.

SQLite stores picodollars in signed 64-bit integers (up to about $9.2 million);
this cap leaves room above a full budget for costs that overran their holds.
"""
LEDGER_MAX_UNITS: Final = int(LEDGER_MAX_USD) * UNITS_PER_USD
_UNIT: Final = Decimal(1) / UNITS_PER_USD


class WireFloat(float):
    """A JSON number as a float that remembers the digits it was written with.

    Pass as ``json.loads(..., parse_float=WireFloat)``: everything reads it as the
    float it is (and ``json.dumps`` writes it back), while :func:`to_decimal` takes
    the exact text, so ``usage.cost`` never goes through binary floating point.
    Only the few non-integer numbers of a body pay for it.
    """

    __slots__ = ("text",)

    text: str

    def __new__(cls, text: str) -> WireFloat:
        number = super().__new__(cls, text)
        number.text = text
        return number


def to_decimal(value: object, *, what: str = "amount") -> Decimal:
    """Parse a JSON number or numeric string into an exact, finite Decimal.

    A :class:`WireFloat` gives its exact wire text; other floats go through
    ``repr`` so ``0.1`` becomes ``Decimal("0.1")``, not its binary expansion.
    Raises ``ValueError`` naming ``what`` for anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number, got a boolean")
    if isinstance(value, Decimal):
        result = value
    elif isinstance(value, WireFloat):
        result = Decimal(value.text)
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


def to_units(amount: Decimal, *, round_up: bool = False) -> int:
    """USD → integer picodollars; exact for any amount with ≤ 12 decimals.

    Amounts finer than a picodollar round half-even, or up with ``round_up``
    (reservations round up so a hold is never smaller than its worst case).
    """
    rounding = ROUND_CEILING if round_up else ROUND_HALF_EVEN
    return int((amount / _UNIT).to_integral_value(rounding=rounding))


def from_units(units: int) -> Decimal:
    """Integer picodollars → USD, exact."""
    return Decimal(units).scaleb(-12)
