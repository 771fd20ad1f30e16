from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provider_router._money import from_units, to_decimal, to_units


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0.0000022", Decimal("0.0000022")),
        (0.1, Decimal("0.1")),
        (3, Decimal(3)),
        (" 1.5 ", Decimal("1.5")),
    ],
)
def test_to_decimal_parses_exactly(raw: object, expected: Decimal) -> None:
    assert to_decimal(raw) == expected


@pytest.mark.parametrize("raw", ["abc", "NaN", "inf", True, None, [1]])
def test_to_decimal_rejects_with_a_named_error(raw: object) -> None:
    with pytest.raises(ValueError, match="price"):
        to_decimal(raw, what="price")


@given(st.decimals(min_value=0, max_value=10**6, places=12, allow_nan=False, allow_infinity=False))
def test_units_round_trip_exactly(amount: Decimal) -> None:
    assert from_units(to_units(amount)) == amount


def test_reservations_round_up() -> None:
    tiny = Decimal("1e-13")
    assert to_units(tiny) == 0
    assert to_units(tiny, round_up=True) == 1


def test_units_equal_the_division_by_a_picodollar_under_any_precision() -> None:
    """``to_units`` scales by 10^12 (scaleb) instead of dividing by 10^-12: the same
    digits, rounded the same way, including amounts with more digits than the
    context's precision."""
    import random
    from decimal import ROUND_CEILING, ROUND_HALF_EVEN, localcontext

    unit = Decimal("1e-12")
    rng = random.Random(7)
    amounts = [
        Decimal(0),
        Decimal("0E-30"),
        Decimal("5E-13"),
        Decimal("1.5E-12"),
        Decimal("9" * 40),
    ]
    amounts += [
        Decimal(rng.randint(0, 10 ** rng.randint(1, 40))).scaleb(rng.randint(-40, 8))
        for _ in range(5000)
    ]
    for precision in (28, 12, 60):
        with localcontext() as context:
            context.prec = precision
            for amount in amounts:
                for up in (False, True):
                    rounding = ROUND_CEILING if up else ROUND_HALF_EVEN
                    divided = int((amount / unit).to_integral_value(rounding=rounding))
                    assert to_units(amount, round_up=up) == divided, (amount, up, precision)
