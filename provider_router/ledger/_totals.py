"""The ledger's arithmetic in integer picodollars, shared by memory and SQLite.

The Redis backend does the same arithmetic in Lua (``_redis_lua.py``); the
contract suite checks that all three agree.
"""

from __future__ import annotations

from provider_router._money import from_units
from provider_router.ledger._base import LedgerState

# Column order of the SQLite ``totals`` row and of :meth:`Totals.row`.
FIELDS = (
    "limit_units",
    "spent",
    "reserved",
    "n_open",
    "n_settled",
    "n_released",
    "n_recovered",
    "estimated",
    "drift",
    "overrun",
)


class Totals:
    """Mutable running totals; every method keeps ``spent`` the exact sum of charges."""

    __slots__ = FIELDS

    def __init__(self, limit_units: int, *counters: int) -> None:
        self.limit_units = limit_units
        (
            self.spent,
            self.reserved,
            self.n_open,
            self.n_settled,
            self.n_released,
            self.n_recovered,
            self.estimated,
            self.drift,
            self.overrun,
        ) = counters or (0,) * 9

    def row(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in FIELDS)

    def fits(self, units: int) -> bool:
        return self.spent + self.reserved + units <= self.limit_units

    def can_ever_fit(self, units: int) -> bool:
        """Would it fit once everything in flight settled at no cost?"""
        return self.spent + units <= self.limit_units

    def admit(self, units: int) -> None:
        self.reserved += units
        self.n_open += 1

    def settle(self, held: int, cost: int, estimate: int | None) -> None:
        self.reserved -= held
        self.n_open -= 1
        self.charge(held, cost, estimate)

    def charge(self, held: int, cost: int, estimate: int | None) -> None:
        """Book an authoritative cost against a hold of ``held`` units."""
        self.spent += cost
        self.n_settled += 1
        if estimate is not None:
            self.estimated += estimate
            self.drift += cost - estimate
        if cost > held:
            self.overrun += cost - held

    def release(self, held: int) -> None:
        self.reserved -= held
        self.n_open -= 1
        self.n_released += 1

    def charge_worst_case(self, held: int) -> None:
        """Recovery without a known cost: the whole hold becomes spent."""
        self.reserved -= held
        self.n_open -= 1
        self.spent += held
        self.n_recovered += 1

    def state(self) -> LedgerState:
        return LedgerState(
            limit=from_units(self.limit_units),
            spent=from_units(self.spent),
            reserved=from_units(self.reserved),
            open=self.n_open,
            settled=self.n_settled,
            released=self.n_released,
            recovered=self.n_recovered,
            estimated=from_units(self.estimated),
            drift=from_units(self.drift),
            overrun=from_units(self.overrun),
        )
