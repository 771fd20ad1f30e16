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
