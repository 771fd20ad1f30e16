from __future__ import annotations

from collections.abc import Callable
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


# --- the conversions the ledger runs three times per request, against the code they
# replaced (the slower, plainer way: every check on the Decimal first) -------------


def _amounts() -> list[Decimal]:
    import random

    rng = random.Random(13)
    amounts = [
        Decimal(0),
        Decimal("-0"),
        Decimal("0E-30"),
        Decimal("-0E+5"),
        Decimal("5E-13"),
        Decimal("-5E-13"),
        Decimal("1.5E-12"),
        Decimal("2.5E-12"),
        Decimal("-2.5E-12"),
        Decimal("1E-20"),
        Decimal("-1E-20"),
        Decimal("0.016045000"),
        Decimal("3.38e-05"),
        Decimal("98765.432109876543"),
        Decimal("4000000"),
        Decimal("9" * 40),
        Decimal("-" + "9" * 40),
        Decimal("1E+30"),
    ]
    for _ in range(3000):
        amount = Decimal(rng.randint(0, 10 ** rng.randint(1, 40))).scaleb(rng.randint(-40, 8))
        amounts.append(-amount if rng.random() < 0.2 else amount)
    return amounts


def _old_to_units(amount: Decimal, round_up: bool) -> int:
    from decimal import ROUND_CEILING, ROUND_HALF_EVEN

    rounding = ROUND_CEILING if round_up else ROUND_HALF_EVEN
    return int(amount.scaleb(12).to_integral_value(rounding))


def _outcome(convert: Callable[[Decimal, bool], int], amount: Decimal, up: bool) -> object:
    """A conversion's result, or its exception's type (what a caller could observe)."""
    try:
        return convert(amount, up)
    except Exception as exc:
        return type(exc)


def _new_to_units(amount: Decimal, round_up: bool) -> int:
    return to_units(amount, round_up=round_up)


def test_units_and_back_equal_the_scaleb_code_they_replace_in_any_context() -> None:
    """``amount * 1E+12`` rounded by ``__ceil__``/``__round__`` is the old
    ``scaleb(12).to_integral_value(rounding)``: same ints, same errors (non-finite,
    signalling NaN), under any precision and any context rounding; ``units * 1E-12``
    is ``Decimal(units).scaleb(-12)`` digit for digit (same exponent, same repr)."""
    from decimal import ROUND_DOWN, ROUND_HALF_UP, ROUND_UP, localcontext

    specials = [Decimal("NaN"), Decimal("-NaN"), Decimal("sNaN"), Decimal("Infinity")]
    specials.append(Decimal("-Infinity"))
    amounts = _amounts() + specials
    units = [0, 1, -1, 7, 10**12, 16_045_000_000, -(10**19) - 3, 10**40 + 1, 4 * 10**18]
    units += [int(a.scaleb(12)) for a in amounts[:2000] if a.is_finite()]
    for precision, rounding in ((28, None), (12, ROUND_DOWN), (60, ROUND_UP), (5, ROUND_HALF_UP)):
        with localcontext() as context:
            context.prec = precision
            if rounding is not None:
                context.rounding = rounding
            for amount in amounts:
                for up in (False, True):
                    old = _outcome(_old_to_units, amount, up)
                    new = _outcome(_new_to_units, amount, up)
                    assert new == old, (amount, up, precision, rounding)
            for unit in units:
                old_amount = Decimal(unit).scaleb(-12)
                new_amount = from_units(unit)
                assert repr(new_amount) == repr(old_amount), (unit, precision)
                assert new_amount.as_tuple() == old_amount.as_tuple()


def _old_amount_units(amount: object, what: str, round_up: bool, capped: bool) -> int:
    """``ledger._base.amount_units`` as it was: every check on the Decimal first."""
    from provider_router._money import LEDGER_MAX_UNITS
    from provider_router.ledger._base import ConfigurationError, _checked_amount

    if type(amount) is Decimal and amount.is_finite() and amount >= 0:
        units = to_units(amount, round_up=round_up)
    else:
        units = to_units(_checked_amount(amount, what), round_up=round_up)
    if capped and units > LEDGER_MAX_UNITS:
        raise ConfigurationError(f"{what} ${amount} is above the largest amount")
    return units


class _MyDecimal(Decimal):
    pass


def test_amount_units_converts_first_and_refuses_exactly_what_the_checks_first_code_did() -> None:
    from provider_router._exceptions import ConfigurationError
    from provider_router.ledger._base import amount_units

    amounts: list[object] = list(_amounts())
    amounts += [Decimal("NaN"), Decimal("sNaN"), Decimal("Infinity"), Decimal("-Infinity")]
    amounts += [3, 0, -2, True, 0.5, "1", None, _MyDecimal("0.5"), _MyDecimal("-1E-20")]
    amounts += [Decimal("4000000"), Decimal("4000000.000000000001"), Decimal("1E+7")]
    for amount in amounts:
        for up in (False, True):
            for capped in (False, True):
                try:
                    old: object = _old_amount_units(amount, "cost", up, capped)
                except ConfigurationError as exc:
                    old = str(exc).split(" $")[0].split(",")[0]
                try:
                    new: object = amount_units(amount, what="cost", round_up=up, capped=capped)
                except ConfigurationError as exc:
                    new = str(exc).split(" $")[0].split(",")[0]
                assert new == old, (amount, up, capped)
    # The errors name what is wrong, as before.
    for amount, message in (
        (Decimal("-1E-20"), "must not be negative"),
        (Decimal("-0.5"), "must not be negative"),
        (Decimal("NaN"), "must be finite"),
        (Decimal("sNaN"), "must be finite"),
        (Decimal("-Infinity"), "must be finite"),
    ):
        with pytest.raises(ConfigurationError, match=message):
            amount_units(amount, what="cost", round_up=False)
    assert amount_units(Decimal("-0"), what="cost", round_up=True) == 0  # -0 is zero
