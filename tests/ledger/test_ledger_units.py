"""The memory ledger's per-request shortcuts book what the plain conversions book.

``MemoryLedger.settle`` reuses the cost's units for an estimate equal to the cost
(a comparison instead of a conversion); everything it books must be
what converting each amount on its own gives, and a bad estimate must still be
refused with the same error.
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from typing import Any

import pytest

from provider_router import ConfigurationError, MemoryLedger
from provider_router.ledger._base import amount_units

D = Decimal

PAIRS = [
    (D("0.0000338"), D("0.0000338")),  # equal, same digits: the usual case
    (D("0.10"), D("0.1")),  # equal values, different exponents
    (D("0.1"), D("0.100000000000000")),
    (D("5E-13"), D("5E-13")),  # finer than a picodollar: rounds half-even to 0
    (D("1.5E-12"), D("1.5E-12")),  # rounds to 2
    (D("2.5E-12"), D("25E-13")),  # rounds to 2
    (D("0"), D("-0")),  # equal zeros
    (D("0.3"), D("0.29")),  # different: converted on its own
    (D("0.3"), D("0.300000000000001")),  # different below a picodollar: same units
    (D(1), 1),  # an int estimate equal to the cost
    (D("4000000"), D("4000000")),
]


@pytest.mark.parametrize(("cost", "estimate"), PAIRS)
async def test_an_estimate_books_what_its_own_conversion_gives(
    cost: Decimal, estimate: Decimal
) -> None:
    ledger = MemoryLedger(D(4_000_000))
    held = await ledger.reserve(D("0.5"), key="k")
    await ledger.settle(held, cost, estimate=estimate)
    assert_booked_as_own_conversion(await ledger.snapshot(), cost, estimate)


def assert_booked_as_own_conversion(state: Any, cost: Decimal, estimate: Decimal) -> None:
    """What a settle booked is what converting the cost and the estimate each gives."""
    est_units = amount_units(estimate, what="estimate", round_up=False)
    cost_units = amount_units(cost, what="cost", round_up=False)
    assert state.estimated == D(est_units).scaleb(-12)
    assert state.drift == D(cost_units - est_units).scaleb(-12)
    assert state.spent == D(cost_units).scaleb(-12)


async def test_an_equal_estimate_under_a_short_precision_books_its_own_conversion() -> None:
    # Under 5 digits of precision the conversion itself rounds: equal amounts still
    # give equal units, whichever of the two is converted.
    with localcontext() as context:
        context.prec = 5
        ledger = MemoryLedger(D(10))
        held = await ledger.reserve(D("0.5"), key="k")
        cost = D("0.123456789")
        await ledger.settle(held, cost, estimate=D("0.1234567890"))
        units = amount_units(cost, what="cost", round_up=False)
        state = await ledger.snapshot()
    assert (state.spent, state.estimated, state.drift) == (
        D(units).scaleb(-12),
        D(units).scaleb(-12),
        0,
    )


@pytest.mark.parametrize(
    ("estimate", "message"),
    [(D("-0.1"), "negative"), (D("NaN"), "finite"), (True, "Decimal"), (0.5, "Decimal")],
)
async def test_a_bad_estimate_is_still_refused_and_the_hold_stays(
    estimate: object, message: str
) -> None:
    ledger = MemoryLedger(D(1))
    held = await ledger.reserve(D("0.5"), key="k")
    with pytest.raises(ConfigurationError, match=message):
        await ledger.settle(held, D(1), estimate=estimate)  # type: ignore[arg-type]
    state = await ledger.snapshot()
    assert (state.open, state.reserved, state.spent) == (1, D("0.5"), 0)
