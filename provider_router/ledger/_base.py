"""The ledger contract: reserve before a request, settle or release after it.

A :class:`Ledger` holds a budget (``limit``) and two running totals: ``spent``
(settled, authoritative costs) and ``reserved`` (worst cases held by requests in
flight). A reservation is admitted only if ``spent + reserved + amount <= limit``;
so spending can pass the limit only when a request's authoritative cost is larger
than the worst case it reserved (``overrun``), never by admission.

Money is ``Decimal`` at the API and integer picodollars (:mod:`provider_router._money`)
inside, so ``spent`` equals the sum of the settled costs to the last digit.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from types import TracebackType
from typing import Any, Final, Protocol, Self, TypeAlias, cast, runtime_checkable

from provider_router._exceptions import BudgetExhausted, ConfigurationError
from provider_router._format import readable_repr
from provider_router._money import (
    LEDGER_MAX_UNITS,
    LEDGER_MAX_USD,
    TERA,
    from_units,
    to_decimal,
    to_units,
)

__all__ = [
    "CostResolver",
    "Ledger",
    "LedgerState",
    "RecoveryReport",
    "Reservation",
]


@dataclass(frozen=True, slots=True)
class Reservation:
    """A hold on part of the budget, returned by :meth:`Ledger.reserve`.

    Attributes:
        id: unique within the ledger (across processes and runs).
        units: the held amount in integer picodollars (rounded up from the request).
        key: the caller's label for what the money is for (a prompt id, a request key).
        generation_id: OpenRouter's generation id, when known (filled in on
            reservations listed by :meth:`Ledger.open_reservations`).
        owner: the ledger instance (process) that holds it.
    """

    id: str
    units: int
    key: str
    generation_id: str | None = None
    owner: str | None = None

    @property
    def amount(self) -> Decimal:
        """The held amount in USD."""
        return from_units(self.units)


RESERVATION_FIELDS: Final = ("id", "units", "key", "generation_id", "owner")
"""Reservation's fields, in order (a test holds them equal to the dataclass's)."""


class _Building:
    """A Reservation's slots, writable: filled with plain attribute stores, then
    made a :class:`Reservation` by ``__class__`` assignment.

    The frozen dataclass's ``__init__`` goes through ``object.__setattr__`` for each
    field, and calling the slots' ``__set__`` from Python builds an argument tuple
    per field: both cost more than this way, once per request (docs/performance.md).
    Python allows the assignment only between identical layouts (same slots, in
    the same order) and raises otherwise, so a field added to Reservation fails
    every reserve loudly (tests/client/test_lean_path.py holds the fields
    and the result equal to a Reservation built the usual way).
    """

    __slots__ = RESERVATION_FIELDS


def new_reservation(res_id: str, units: int, key: str, owner: str) -> Reservation:
    """``Reservation(res_id, units, key, None, owner)``, built at a quarter of the cost
    (every ledger's reserve: ``MemoryLedger`` and the durable ones' batches)."""
    res: Any = _Building()
    res.id = res_id
    res.units = units
    res.key = key
    res.generation_id = None
    res.owner = owner
    res.__class__ = Reservation
    return cast(Reservation, res)


@dataclass(frozen=True, slots=True)
class LedgerState:
    """A consistent snapshot of a ledger's totals (USD, exact).

    Attributes:
        limit: the budget.
        spent: the sum of every settled cost (and of worst cases counted by recovery).
        reserved: held by reservations still open.
        open: how many reservations are open.
        settled: how many were settled (including those reconciled by recovery).
        released: how many were released without a charge.
        recovered: how many were closed by recovery (reconciled or counted at worst case).
        estimated: the sum of local estimates given to ``settle``.
        drift: the sum of ``cost - estimate`` over settles that gave an estimate.
        overrun: the sum of ``cost - reservation`` over settles that cost more than
            they reserved: the only way ``spent + reserved`` can pass ``limit``.
        waiting: reservations of this process queued for room (``wait=``) that
            have not fitted yet: requests waiting for budget, not yet sent.
    """

    limit: Decimal
    spent: Decimal
    reserved: Decimal
    open: int
    settled: int
    released: int
    recovered: int
    estimated: Decimal
    drift: Decimal
    overrun: Decimal
    waiting: int = 0

    __repr__ = readable_repr

    @property
    def available(self) -> Decimal:
        """What a new reservation can still take (never negative)."""
        return max(self.limit - self.spent - self.reserved, Decimal(0))


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :meth:`Ledger.recover` did with the reservations of dead owners.

    Attributes:
        reconciled: reservations settled at the cost the resolver returned.
        worst_case: reservations counted at their full reserved amount.
        reconciled_cost: the sum charged for the reconciled ones (USD).
        worst_case_cost: the sum charged for the worst-case ones (USD).
        kept: reservations the caller closes itself (``keep``): taken over (this
            instance holds them now, their leases renewed) and left open.
    """

    reconciled: tuple[Reservation, ...] = ()
    worst_case: tuple[Reservation, ...] = ()
    reconciled_cost: Decimal = Decimal(0)
    worst_case_cost: Decimal = Decimal(0)
    kept: tuple[Reservation, ...] = ()

    __repr__ = readable_repr


CostResolver: TypeAlias = Callable[[Reservation], Awaitable[Decimal | None]]
"""Asked for the authoritative cost of an orphaned reservation during recovery
(the client asks OpenRouter's ``/generation?id=``); ``None`` means unknown, and the
reservation is then counted at its worst case."""


@runtime_checkable
class Ledger(Protocol):
    """A budget that concurrent requests (and processes) can never overspend.

    Every backend (memory, SQLite, Redis) passes one contract test suite.
    Use it as an async context manager, or call :meth:`close`.
    """

    async def reserve(
        self, amount: Decimal, *, key: str, wait: bool | float = False
    ) -> Reservation:
        """Hold ``amount`` (USD, rounded up to a picodollar) before sending a request.

        Args:
            amount: the request's worst-case cost; must be ``>= 0``.
            key: what the money is for (recorded with the reservation).
            wait: ``False`` raises at once when it does not fit; ``True`` waits for
                requests in flight to settle; a number waits at most that many seconds.
                Waiting stops early when even settling everything in flight could not
                make room (``spent + amount > limit``).

        Raises:
            BudgetExhausted: the reservation does not fit (after waiting, if asked).
            ConfigurationError: ``amount`` is negative or not finite.
        """
        ...

    async def attach(self, reservation: Reservation, generation_id: str) -> None:
        """Record OpenRouter's generation id durably, as soon as it is known."""
        ...

    async def settle(
        self,
        reservation: Reservation,
        cost: Decimal,
        *,
        estimate: Decimal | None = None,
        provider: str | None = None,
        generation_id: str | None = None,
    ) -> None:
        """Close a reservation at its authoritative cost (may exceed the reservation).

        Raises:
            ConfigurationError: the reservation is not open in this ledger (unknown,
                or already settled or released), or ``cost`` is negative.
        """
        ...

    async def release(self, reservation: Reservation) -> None:
        """Close a reservation that cost nothing (the request was never charged)."""
        ...

    async def snapshot(self) -> LedgerState:
        """The current totals."""
        ...

    async def open_reservations(self) -> list[Reservation]:
        """Every open reservation, of every owner, with its generation id if known."""
        ...

    async def recover(
        self,
        resolve: CostResolver | None = None,
        *,
        keep: Callable[[Reservation], bool] | None = None,
    ) -> RecoveryReport:
        """Close the open reservations of owners that died (crashed runs).

        Each is settled at the cost ``resolve`` returns, or, when it returns ``None``
        (or fails, or is not given), counted at its full reserved amount. A late
        settle by an owner that was only slow corrects a worst-case charge to the
        true cost; nothing is ever counted twice. One that ``keep`` answers True for
        is the caller's to close (a batch it will collect): it is taken over, its
        lease renewed from now on, and left open (:attr:`RecoveryReport.kept`).
        """
        ...

    async def set_limit(self, limit: Decimal) -> None:
        """Change the budget (a top-up); wakes reservations waiting for room."""
        ...

    async def close(self) -> None:
        """Wait for pending writes, then free the backend's resources."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


# --- helpers shared by the backends ---------------------------------------------


def _checked_amount(amount: object, what: str) -> Decimal:
    """``amount`` as a Decimal, or the error that names what is wrong with it."""
    if not isinstance(amount, Decimal | int) or isinstance(amount, bool):
        raise ConfigurationError(f"{what} must be a Decimal, got {type(amount).__name__}")
    if isinstance(amount, Decimal) and not amount.is_finite():
        raise ConfigurationError(f"{what} must be finite, got {amount}")
    if amount < 0:
        raise ConfigurationError(f"{what} must not be negative, got {amount}")
    return Decimal(amount)


def estimate_units(estimate: Decimal | None, cost: Decimal, cost_units: int) -> int | None:
    """A settle's ``estimate`` in picodollars (``None`` stays ``None``), given its cost's.

    Our price usually is OpenRouter's to the digit: an amount equal to the cost has
    the cost's units, found by a comparison instead of a conversion (every ledger's
    settle; tests/ledger/test_ledger_units.py and test_ledger_sqlite_path.py hold it
    equal to converting).
    """
    if estimate is None:
        return None
    if type(estimate) is Decimal and estimate == cost:
        return cost_units
    return amount_units(estimate, what="estimate", round_up=False)


def limit_units(limit: object) -> int:
    """A ledger's limit (the budget) in picodollars, by the one rule every budget follows.

    The same as a plan's ``budget``: a Decimal, an int, a decimal string (``"0.1"``,
    as a file or a flag gives it) or a float read as it prints (``0.3`` is $0.3,
    never its binary expansion); a bool, a non-number or a negative amount is refused.
    """
    try:
        amount = to_decimal(limit, what="limit")
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    return amount_units(amount, what="limit", round_up=False)


def amount_units(amount: Decimal, *, what: str, round_up: bool, capped: bool = True) -> int:
    """Validate a USD amount from a caller and convert it to picodollars.

    A limit or cost above :data:`~provider_router._money.LEDGER_MAX_USD` is refused
    (``capped``): no backend could store it exactly. A reservation amount is not
    capped; it can never fit under a limit anyway (``BudgetExhausted``).
    """
    units = -1
    if type(amount) is Decimal:
        # The per-request case (every reserve and settle): convert first and check
        # the int, not the Decimal. A finite amount >= 0 gives units >= 0; one below
        # zero gives units < 0, or 0 when it rounds to zero (then compared once);
        # infinities and NaNs raise here. Every other case takes the checked path,
        # which names what is wrong (tests/test_money.py holds both paths equal
        # to the checks-first version).
        try:
            # to_units' two lines, inlined: a call with a keyword less, three times
            # per request (tests/test_money.py holds this function equal to one that
            # calls to_units).
            scaled = amount * TERA
            units = scaled.__ceil__() if round_up else scaled.__round__()
        except (ArithmeticError, ValueError):
            units = -1
        if units == 0 and amount < 0:
            units = -1
    if units < 0:
        units = to_units(_checked_amount(amount, what), round_up=round_up)
    if capped and units > LEDGER_MAX_UNITS:
        raise ConfigurationError(
            f"{what} ${amount} is above the largest amount a ledger holds exactly "
            f"(${LEDGER_MAX_USD:,})"
        )
    return units


def exhausted(requested: int, limit: int, spent: int, reserved: int) -> BudgetExhausted:
    """A :class:`BudgetExhausted` from integer totals."""
    return BudgetExhausted(
        requested=from_units(requested),
        spent=from_units(spent),
        reserved=from_units(reserved),
        limit=from_units(limit),
    )


def new_owner() -> str:
    """A unique id for one ledger instance: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


def owner_is_dead(owner: str) -> bool:
    """True only when ``owner`` ran on this host and its process no longer exists.

    False means "alive or unknown" (another host, or a live pid, which may have
    been reused): then only lease expiry frees its reservations.
    """
    host, _, rest = owner.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
