"""The Router's grouped options, their defaults, and the checks of its arguments.

Settings that are one idea travel as one frozen value (as httpx's ``Timeout`` and
``Limits`` do): :class:`Timeouts` (how long each part of a request may take),
:class:`AffinityOptions` (how cache-aware pinning chooses and falls back) and
:class:`Safeguards` (when the router waits out, doubts or halts on the money
side). Each checks itself when built, so a mistake is said where it was written;
the Router's other arguments are checked here too, before anything is opened.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, TypeVar, cast

from provider_router._constants import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_COST_SANITY_FACTOR,
    DEFAULT_CREDITS_HOLD_TIMEOUT,
    DEFAULT_MAX_VIOLATIONS_IN_A_ROW,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_STREAM_IDLE_TIMEOUT,
    STREAM_DEADLINE_BASE,
    STREAM_DEADLINE_TOKENS_PER_SECOND,
)
from provider_router._exceptions import ConfigurationError
from provider_router._money import to_decimal
from provider_router.client.affinity import DEFAULT_CACHE_HIT_RATE
from provider_router.routing.ranking import Workload

__all__ = [
    "DEFAULT_SLOW_START",
    "DEFAULT_WORKLOAD",
    "AffinityOptions",
    "Safeguards",
    "Timeouts",
]

_Option = TypeVar("_Option", "Timeouts", "Safeguards")

DEFAULT_SLOW_START: Final = 0.05
"""Seconds in which the default limiter's window doubles until the first 429."""

DEFAULT_WORKLOAD: Final = Workload(prompt_tokens=500, completion_tokens=2000)
"""The request shape endpoints are ranked for when none is given."""

RESERVED_PARAMS: Final = ("model", "provider", "messages", "stream")
"""Request fields the Router sets itself: refused per call, and in ``params`` but for
the ``provider`` fields the policy does not decide (:data:`OPEN_PROVIDER_FIELDS`)."""
OPEN_PROVIDER_FIELDS: Final = frozenset({"enforce_distillable_text", "zdr", "data_collection"})
"""``provider`` fields a caller may set in ``Router(params=...)``: restrictions OpenRouter
applies on top of the route the policy builds (it owns ``order``, ``only``, ``ignore``,
``allow_fallbacks``, ``quantizations``, ``max_price``, ``sort``...)."""

_LEDGER_METHODS: Final = ("reserve", "settle", "release", "snapshot")
"""What a ledger is used for: an object without them is a mistake said at once."""


def check_seconds(name: str, value: object) -> float:
    """``value`` as a number of seconds > 0, or a :class:`ConfigurationError` naming ``name``."""
    try:
        positive = not isinstance(value, bool) and value > 0  # type: ignore[operator]
    except TypeError:
        positive = False
    if not positive:
        raise ConfigurationError(f"{name} must be > 0 seconds, got {value!r}")
    return value  # type: ignore[return-value]


def check_factor(name: str, value: object) -> Decimal:
    """``value`` as a Decimal >= 1 (a multiple of a reservation)."""
    try:
        factor = None if isinstance(value, bool) else Decimal(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, ArithmeticError):
        factor = None
    if factor is None or not factor >= 1:
        raise ConfigurationError(f"{name} must be a number >= 1, got {value!r}")
    return factor


def check_count(name: str, value: object) -> int:
    """``value`` as an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be an int >= 1, got {value!r}")
    return value


def check_share(name: str, value: object) -> Decimal:
    """``value`` as a Decimal share from 0 to 1."""
    try:
        share = to_decimal(value, what=name)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    if not 0 <= share <= 1:
        raise ConfigurationError(f"{name} must be between 0 and 1, got {value!r}")
    return share


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long each part of a request may take, in seconds.

    ``Router(timeouts=Timeouts(request=120))``: the fields not given keep their
    defaults. Every value must be > 0.

    Attributes:
        request: a whole non-streaming request (default 600 s: long reasoning
            answers take minutes).
        connect: opening a connection (default 10 s).
        stream_idle: between two events of a stream (keep-alive comments do not
            count as events; default 120 s).
        stream_deadline: a whole stream; ``None`` (the default): 120 s plus
            ``max_tokens`` at 10 tokens per second, so a long answer is not cut for
            being long. A stream still delivering tokens at its deadline is not
            retried: it ends as it stands (``finish_reason="deadline"``), settled at
            what ``/generation`` says it cost.
    """

    request: float = DEFAULT_REQUEST_TIMEOUT
    connect: float = DEFAULT_CONNECT_TIMEOUT
    stream_idle: float = DEFAULT_STREAM_IDLE_TIMEOUT
    stream_deadline: float | None = None

    def __post_init__(self) -> None:
        check_seconds("Timeouts.request", self.request)
        check_seconds("Timeouts.connect", self.connect)
        check_seconds("Timeouts.stream_idle", self.stream_idle)
        if self.stream_deadline is not None:
            check_seconds("Timeouts.stream_deadline", self.stream_deadline)

    def stream_deadline_for(self, completion_cap: int | None) -> float:
        """The deadline of a stream whose completion is capped at ``completion_cap``."""
        if self.stream_deadline is not None:
            return self.stream_deadline
        return STREAM_DEADLINE_BASE + (completion_cap or 0) / STREAM_DEADLINE_TOKENS_PER_SECOND


@dataclass(frozen=True, slots=True)
class AffinityOptions:
    """How cache-aware pinning chooses a session's endpoint and falls back.

    ``Router(cache_affinity=True)`` pins with these defaults;
    ``Router(cache_affinity=AffinityOptions(pin_fallbacks=True))`` pins with others
    (docs/client.md, "Cache-aware pinning").

    Attributes:
        pin_fallbacks: send a pinned request as ``order: [pin]`` with every allowed
            tag in ``only`` instead of a one-tag ``only``: a 429 at the pin falls
            back inside OpenRouter (one cache miss) instead of reaching the limiter
            and a retry.
        hit_rate: the prompt share (0..1) expected from cache when choosing a
            session's endpoint; ``None`` (the default): the workload's
            ``cached_prompt_share``, else
            :data:`~provider_router.client.affinity.DEFAULT_CACHE_HIT_RATE`. A
            number or a decimal string; kept as a ``Decimal``.
    """

    pin_fallbacks: bool = False
    hit_rate: Decimal | float | str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.pin_fallbacks, bool):
            raise ConfigurationError(
                f"AffinityOptions.pin_fallbacks must be True or False, got {self.pin_fallbacks!r}"
            )
        if self.hit_rate is not None:
            share = check_share("AffinityOptions.hit_rate", self.hit_rate)
            object.__setattr__(self, "hit_rate", share)


@dataclass(frozen=True, slots=True)
class Safeguards:
    """When the router waits out, doubts or halts on the money side.

    Attributes:
        credits_hold_timeout: seconds one request may spend waiting out temporary
            (in-flight hold) 402s (default 300; 0 never waits).
        cost_sanity_factor: an answer's ``usage.cost`` above this many times its
            reservation (default 2), or a negative one, is not booked on its word:
            OpenRouter's ``/generation`` record is asked first. Confirmed, it is
            booked; otherwise the worst case is booked and the figure is disputed
            (``Router.disputes``, ``ChatResult.disputed_cost``). Either way
            ``Router.halted`` names the generation id (a batch stops). A number
            >= 1; kept as a ``Decimal``.
        max_violations_in_a_row: policy violations in a row (answers served by a
            provider the policy does not allow) that set ``Router.halted`` (a batch
            stops); default 3.
    """

    credits_hold_timeout: float = DEFAULT_CREDITS_HOLD_TIMEOUT
    cost_sanity_factor: Decimal | int = DEFAULT_COST_SANITY_FACTOR
    max_violations_in_a_row: int = DEFAULT_MAX_VIOLATIONS_IN_A_ROW

    def __post_init__(self) -> None:
        hold = self.credits_hold_timeout
        try:
            waits = not isinstance(hold, bool) and hold >= 0
        except TypeError:
            waits = False
        if not waits:
            raise ConfigurationError(
                f"Safeguards.credits_hold_timeout must be >= 0 seconds, got {hold!r}"
            )
        factor = check_factor("Safeguards.cost_sanity_factor", self.cost_sanity_factor)
        object.__setattr__(self, "cost_sanity_factor", factor)
        check_count("Safeguards.max_violations_in_a_row", self.max_violations_in_a_row)


def option(name: str, value: _Option | None, kind: type[_Option]) -> _Option:
    """The option object given as ``name``, or its defaults when ``None``."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise ConfigurationError(
            f"{name} must be a {kind.__name__}(...), got {type(value).__name__}"
        )
    return value


def pinning(cache_affinity: object) -> AffinityOptions | None:
    """The pinning options ``cache_affinity`` asks for, or ``None``: nothing is pinned."""
    if isinstance(cache_affinity, AffinityOptions):
        return cache_affinity
    if isinstance(cache_affinity, bool):
        return AffinityOptions() if cache_affinity else None
    raise ConfigurationError(
        "cache_affinity must be True, False or an AffinityOptions(...), got "
        f"{type(cache_affinity).__name__}"
    )


def cache_workload(workload: Workload, affinity: AffinityOptions) -> Workload:
    """The workload at its expected cache hit rate: what pinned sessions are ranked for."""
    rate = cast(Decimal | None, affinity.hit_rate)  # made a Decimal when built
    share = rate if rate is not None else workload.cached_prompt_share or DEFAULT_CACHE_HIT_RATE
    try:  # Workload checks the share against its cache_write_share
        return dataclasses.replace(workload, cached_prompt_share=share)
    except ConfigurationError as exc:
        raise ConfigurationError(f"AffinityOptions.hit_rate={rate!r}: {exc}") from None


def check_model(model: object) -> str:
    """An ``author/slug`` model id the reservation can bound."""
    if not isinstance(model, str) or "/" not in model:
        raise ConfigurationError(f"model must be an 'author/slug' id, got {model!r}")
    if model.endswith(":online"):
        raise ConfigurationError(
            f"model {model!r}: refused, the ':online' variant adds web search fees the "
            "reservation cannot bound (docs/client.md, 'What is reserved')"
        )
    return model


def check_params(params: Mapping[str, Any] | None) -> None:
    """Default request fields may not set what the Router sets."""
    for reserved_name in RESERVED_PARAMS:
        if params and reserved_name in params:
            if reserved_name == "provider":
                _check_provider_fields(params["provider"])
                continue
            raise ConfigurationError(f"params: {reserved_name!r} is set by the Router")


def _check_provider_fields(provider: object) -> None:
    if not isinstance(provider, Mapping):
        raise ConfigurationError(f"params: 'provider' must be a mapping, got {provider!r}")
    for name in provider:
        if name not in OPEN_PROVIDER_FIELDS:
            raise ConfigurationError(
                f"params: 'provider.{name}' is set by the Router from its policy; only "
                f"{sorted(OPEN_PROVIDER_FIELDS)} may be given"
            )


def check_ledger(ledger: object) -> None:
    """A ledger, or a mistake said at once (a budget amount given as the ledger)."""
    if ledger is not None and not all(
        callable(getattr(ledger, name, None)) for name in _LEDGER_METHODS
    ):
        raise ConfigurationError(
            f"ledger must be a Ledger (MemoryLedger, SQLiteLedger or RedisLedger), got "
            f"{type(ledger).__name__}"
            + (
                f": to cap spending at ${ledger}, pass ledger=MemoryLedger(Decimal('{ledger}'))"
                if isinstance(ledger, Decimal | int | str) and not isinstance(ledger, bool)
                else ""
            )
        )
