"""An answer's cost checked before it is booked: never take an absurd bill on its word.

A ``usage.cost`` from a tenth of what its tokens cost at the serving endpoint's listed
prices (:data:`LOW_COST_SHARE`) to ``cost_sanity_factor`` times its reservation is
booked as the answer says. Above that, or negative (:func:`check_cost`), ``GET
/generation?id=`` is asked first: the same ``total_cost`` **confirms** it (booked, and
the batch halts); otherwise it is **disputed**: the worst case (or the larger record)
is booked, the figure kept beside it, and the batch halts naming the generation id.
Below it (``0`` for thousands of paid tokens, :func:`check_low_cost`): confirmed, it is
booked; else the record (or, without one, the worst case) is booked and disputed, and
nothing halts: what is booked is never below what was charged (docs/ledger.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from provider_router._constants import COST_TOLERANCE
from provider_router._format import decimal_str

__all__ = [
    "ACTIVITY_URL",
    "LOW_COST_SHARE",
    "CostVerdict",
    "check_cost",
    "check_low_cost",
    "is_sane",
    "too_low",
]

ACTIVITY_URL: Final = "https://openrouter.ai/activity"
"""Where an account's generations (and what each cost) are listed."""
LOW_COST_SHARE: Final = Decimal("0.1")
"""An answer's ``usage.cost`` below this share of what its tokens cost at the serving
endpoint's listed prices (prompt-cache reads included) is checked before it is booked:
no discount we know of goes that deep, while a ``0`` or ``1e-30`` for a paid answer
would let a budget be spent many times over."""


@dataclass(frozen=True, slots=True)
class CostVerdict:
    """What to book for an answer whose cost was not sane, and why.

    Attributes:
        booked: USD the ledger is charged.
        disputed: the answer's own figure when it was not booked (``None`` when
            OpenRouter's record confirmed it).
        record: ``/generation``'s ``total_cost``, when it could be read.
        reason: one line for the halt: what was found and what to do.
        generation_id: the answer's generation id, when it had one.
    """

    booked: Decimal
    disputed: Decimal | None
    record: Decimal | None
    reason: str
    generation_id: str | None = None


def is_sane(cost: Decimal, held: Decimal, factor: Decimal) -> bool:
    """Whether ``cost`` may be booked on the answer's word (``0 <= cost <= factor * held``)."""
    return Decimal(0) <= cost <= held * factor


def too_low(cost: Decimal, estimate: Decimal | None) -> bool:
    """Whether ``cost`` is below :data:`LOW_COST_SHARE` of ``estimate`` (what the answer's
    tokens cost at the serving endpoint's listed prices; None: unknown, never too low)."""
    return estimate is not None and cost < estimate * LOW_COST_SHARE


async def check_cost(
    reported: Decimal,
    held: Decimal,
    factor: Decimal,
    *,
    key: str,
    generation_id: str | None,
    generation_cost: Callable[[str], Awaitable[Decimal | None]],
    key_usage: Callable[[], Awaitable[Decimal | None]],
    what: str = "the server's usage.cost",
) -> CostVerdict:
    """Ask OpenRouter's records about a cost :func:`is_sane` refused; what to book.

    ``held`` is the attempt's worst case (its reservation); ``generation_cost``
    reads ``/generation`` (``None`` when it has no record or cannot be read) and
    ``key_usage`` reads ``/key``'s ``usage``.
    """
    gid = generation_id or "(no id)"
    record = await generation_cost(generation_id) if generation_id else None
    if reported >= 0 and record is not None and abs(record - reported) <= COST_TOLERANCE:
        return CostVerdict(
            reported,
            None,
            record,
            f"cost anomaly: generation {gid} of {key!r} cost ${decimal_str(reported)} "
            f"(confirmed by OpenRouter's /generation record), more than {factor}x its "
            f"reservation of ${decimal_str(held)}; it is booked: check the prices "
            "OpenRouter reports before going on",
            generation_id,
        )
    if reported < 0:
        found = f"{what} for generation {gid} of {key!r} is negative (${decimal_str(reported)})"
    else:
        found = (
            f"{what} for generation {gid} of {key!r} is ${decimal_str(reported)}, more "
            f"than {factor}x its reservation of ${decimal_str(held)}"
        )
    if record is not None:
        found += f", and OpenRouter's /generation record says ${decimal_str(record)}"
    elif generation_id:
        found += ", and OpenRouter's /generation has no record of it"
        usage = await key_usage()
        if usage is not None and usage < reported:
            found += f" (the key's whole usage is ${decimal_str(usage)})"
    else:
        found += ", and the answer has no generation id to check it by"
    booked = held if record is None or record < held else record
    where = f"check generation {gid}" if generation_id else "check the key's recent generations"
    return CostVerdict(
        booked,
        reported,
        record,
        f"disputed cost: {found}; booked ${decimal_str(booked)} (its worst case) instead "
        f"and stopped: {where} at {ACTIVITY_URL}",
        generation_id,
    )


async def check_low_cost(
    reported: Decimal,
    estimate: Decimal,
    held: Decimal,
    *,
    key: str,
    generation_id: str | None,
    generation_cost: Callable[[str], Awaitable[Decimal | None]],
    what: str = "the server's usage.cost",
) -> CostVerdict:
    """Ask OpenRouter's records about a cost :func:`too_low` flagged; what to book.

    ``estimate`` is what the answer's tokens cost at the serving endpoint's listed
    prices and ``held`` its worst case (its reservation). Confirmed by ``/generation``,
    the figure is booked; otherwise the record's figure is booked, or the worst case
    when there is no record: never below what was charged, so nothing halts.
    """
    gid = generation_id or "(no id)"
    record = await generation_cost(generation_id) if generation_id else None
    below = (
        f"{what} for generation {gid} of {key!r} is ${decimal_str(reported)}, less than "
        f"{LOW_COST_SHARE:%} of the ${decimal_str(estimate)} its tokens cost at the serving "
        "endpoint's listed prices"
    )
    if record is not None and abs(record - reported) <= COST_TOLERANCE:
        return CostVerdict(
            reported,
            None,
            record,
            f"cost anomaly: {below}, confirmed by OpenRouter's /generation record; it is booked",
            generation_id,
        )
    if record is not None:
        booked = record
        found = f"{below}, and OpenRouter's /generation record says ${decimal_str(record)}"
        instead = "the record's figure"
    else:
        booked = held
        instead = "its worst case"
        found = below + (
            ", and OpenRouter's /generation has no record of it"
            if generation_id
            else ", and the answer has no generation id to check it by"
        )
    where = f"check generation {gid}" if generation_id else "check the key's recent generations"
    return CostVerdict(
        booked,
        reported,
        record,
        f"disputed cost: {found}; booked ${decimal_str(booked)} ({instead}) instead: "
        f"{where} at {ACTIVITY_URL}",
        generation_id,
    )
