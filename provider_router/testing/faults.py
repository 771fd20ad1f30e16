"""Scheduled and random failures: what can go wrong, where, and when.

A fault file (JSON or YAML, format in docs/simulator.md) lists faults. Each has a
``kind``, an optional scope (``provider`` tag or slug, ``key`` or its label, ``model``,
``stream``) and a trigger: a ``rate`` drawn from the request's seeded stream (a run
with the same seed and prompts fails the same way), ``after`` / ``times`` ("429 twice,
then succeed" is ``times: 2``), a ``window`` of simulated seconds, or for rate limits
``max_in_flight`` and a ``per_second`` token bucket on the simulator's clock. Kinds
that fail an attempt before any byte is sent let OpenRouter fall back unless
``no_fallback`` is set; delivery kinds hit the attempt that serves. ``usage_cost``
answers with a ``reported`` figure while billing the truth (or, with ``confirm``,
bills it): a server whose answer lies, for testing the client's checks.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router._exceptions import ConfigurationError
from provider_router._money import UNITS_PER_USD
from provider_router.testing._datafile import Fields, load_data_file
from provider_router.testing.billing import key_label

__all__ = ["FAULT_KINDS", "Fault", "FaultBook", "load_faults"]

ATTEMPT_KINDS = frozenset(["rate_limit", "provider_error", "down"])
DELIVERY_KINDS = frozenset(
    [
        "hang",
        "reset",
        "truncate",
        "error_200",
        "stream_error",
        "drop_done",
        "no_usage_cost",
        "usage_cost",
    ]
)
FAULT_KINDS = ATTEMPT_KINDS | DELIVERY_KINDS
_ERROR_FINISHES = frozenset(["error_200", "stream_error"])
PROVIDER_ERROR_STATUSES = frozenset([500, 502, 503, 524, 529])

_FIELDS = (
    "kind",
    "provider",
    "key",
    "model",
    "stream",
    "scope",
    "rate",
    "after",
    "times",
    "window",
    "max_in_flight",
    "per_second",
    "burst",
    "status",
    "retry_after",
    "after_tokens",
    "hang_seconds",
    "no_fallback",
    "message",
    "reported",
    "confirm",
)


@dataclass(slots=True)
class Fault:
    """One fault rule. ``fired`` and ``seen`` count its matches as the run goes."""

    kind: str
    provider: str | None = None
    key: str | None = field(default=None, repr=False)
    model: str | None = None
    stream: bool | None = None
    scope: str = "provider"
    rate: float | None = None
    after: int = 0
    times: int | None = None
    window: tuple[float, float] | None = None
    max_in_flight: int | None = None
    per_second: float | None = None
    burst: float | None = None
    status: int | None = None
    retry_after: float = 1.0
    after_tokens: int | None = None
    hang_seconds: float | None = None
    no_fallback: bool = False
    message: str | None = None
    reported: Any = None
    """``usage_cost``: what the answer writes as ``usage.cost`` (any JSON value)."""
    confirm: bool = False
    """``usage_cost``: bill and record ``reported`` itself (the answer tells the truth)."""
    seen: int = 0
    fired: int = 0
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ConfigurationError(
                f"unknown fault kind {self.kind!r} (one of {sorted(FAULT_KINDS)})"
            )
        if self.scope not in ("provider", "platform"):
            raise ConfigurationError(
                f"fault scope must be 'provider' or 'platform', got {self.scope!r}"
            )
        if self.scope == "platform" and self.kind != "rate_limit":
            raise ConfigurationError("only rate_limit faults can have scope 'platform'")
        if self.per_second is not None:
            if self.kind != "rate_limit" or self.max_in_flight is not None:
                raise ConfigurationError(
                    "per_second is a rate_limit trigger (not with max_in_flight)"
                )
            if not self.per_second > 0:
                raise ConfigurationError(f"per_second must be > 0, got {self.per_second}")
            if self.burst is None:
                self.burst = max(1.0, self.per_second)
        if self.burst is not None and not self.burst >= 1:
            raise ConfigurationError(f"burst must be >= 1, got {self.burst}")
        if self.rate is not None and not 0 <= self.rate <= 1:
            raise ConfigurationError(f"fault rate must be within [0, 1], got {self.rate}")
        if self.provider is not None:
            self.provider = self.provider.lower()
        if self.key is not None and not self.key.startswith("key-"):
            # Rules match on the key's non-secret label, so a raw key never stays in memory here.
            self.key = key_label(self.key)
        if self.kind == "usage_cost" or (self.kind in _ERROR_FINISHES and self.confirm):
            self._check_reported()
        elif self.reported is not None or self.confirm:
            raise ConfigurationError(
                "reported and confirm are for usage_cost faults (and error finishes with confirm)"
            )
        if self.status is None:
            self.status = {"rate_limit": 429, "down": 503}.get(self.kind, 502)
        elif self.kind == "provider_error" and self.status not in PROVIDER_ERROR_STATUSES:
            raise ConfigurationError(
                f"provider_error status must be one of {sorted(PROVIDER_ERROR_STATUSES)}, "
                f"got {self.status}"
            )

    def _check_reported(self) -> None:
        if self.reported is None:
            raise ConfigurationError("a usage_cost fault needs reported (the usage.cost to send)")
        if self.confirm and not self.confirmed_units() >= 0:
            raise ConfigurationError(
                f"confirm needs reported to be a number >= 0, got {self.reported!r}"
            )

    def confirmed_units(self) -> int:
        """``reported`` in picodollars (``confirm``: what is billed); -1 when not a number >= 0."""
        value = self.reported
        if isinstance(value, bool) or not isinstance(value, int | float):
            return -1
        if not math.isfinite(value) or value < 0:
            return -1
        return round(Decimal(repr(value)) * UNITS_PER_USD)

    def applies(
        self, tag: str | None, slug: str | None, key: str, model: str, stream: bool, now: float
    ) -> bool:
        """Whether this rule is in scope for an attempt (before counting or drawing)."""
        if self.provider is not None and self.provider not in (tag, slug):
            return False
        if self.key is not None and self.key != key:
            return False
        if self.model is not None and self.model != model:
            return False
        if self.stream is not None and self.stream != stream:
            return False
        return self.window is None or self.window[0] <= now < self.window[1]

    def fires(self, rng: random.Random, in_flight: int, now: float = 0.0, bucket: str = "") -> bool:
        """Count one matching attempt and decide whether the fault fires on it.

        ``now`` (simulated seconds) and ``bucket`` (a tag or key label) feed the
        ``per_second`` token bucket.
        """
        if self.max_in_flight is not None:
            hit = in_flight >= self.max_in_flight
        elif self.per_second is not None:
            hit = not self._take_token(bucket, now)
        else:
            self.seen += 1
            if self.seen <= self.after:
                return False
            if self.times is not None and self.fired >= self.times:
                return False
            rate = self.rate if self.rate is not None else 1.0
            hit = rate >= 1.0 or rng.random() < rate
        if hit:
            self.fired += 1
        return hit

    def _take_token(self, bucket: str, now: float) -> bool:
        assert self.per_second is not None
        assert self.burst is not None
        tokens, last = self._buckets.get(bucket, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.per_second)
        admitted = tokens >= 1.0
        self._buckets[bucket] = (tokens - 1.0 if admitted else tokens, now)
        return admitted


class FaultBook:
    """The faults of one simulator run and the state they keep."""

    def __init__(self, faults: Iterable[Fault] = ()) -> None:
        self.faults: list[Fault] = list(faults)
        self.platform = [f for f in self.faults if f.scope == "platform"]
        self.attempt = [f for f in self.faults if f.scope == "provider"]

    def __bool__(self) -> bool:
        return bool(self.faults)

    def add(self, fault: Fault) -> Fault:
        """Add a rule while the simulator runs; returns it so a test can read its counters."""
        self.faults.append(fault)
        (self.platform if fault.scope == "platform" else self.attempt).append(fault)
        return fault

    def clear(self) -> None:
        self.faults.clear()
        self.platform.clear()
        self.attempt.clear()

    def check_platform(
        self, key: str, model: str, stream: bool, now: float, rng: random.Random, in_flight: int
    ) -> Fault | None:
        """A platform rate limit for this key, checked before routing."""
        for fault in self.platform:
            if fault.applies(None, None, key, model, stream, now) and fault.fires(
                rng, in_flight, now, key
            ):
                return fault
        return None

    def check_attempt(
        self,
        tag: str,
        slug: str,
        key: str,
        model: str,
        stream: bool,
        now: float,
        rng: random.Random,
        in_flight: int,
    ) -> Fault | None:
        """The first fault that fires for this attempt at this endpoint, if any."""
        for fault in self.attempt:
            if fault.applies(tag, slug, key, model, stream, now) and fault.fires(
                rng, in_flight, now, tag
            ):
                return fault
        return None


def fault_from_mapping(
    data: object, *, path: Path | None = None, where: str = "fault", line: int | None = None
) -> Fault:
    """Build a Fault from a mapping (as in a fault file); errors name file and line."""
    f = Fields(path or Path("<faults>"), data, where, line=line)
    f.reject_unknown(_FIELDS)
    kind = f.text("kind")
    window = None
    if f.has("window"):
        w = Fields(f.path, f.raw("window"), f"{where}.window", line=f.line_of("window"))
        w.reject_unknown(("start", "end"))
        window = (w.number("start", 0.0, minimum=0), w.number("end", float("inf"), minimum=0))
        if window[1] <= window[0]:
            raise w.error("end", "must be after start")
    stream = f.raw("stream")
    if stream is not None and not isinstance(stream, bool):
        raise f.error("stream", f"must be true or false, got {stream!r}")
    try:
        return Fault(
            kind=kind,
            provider=f.opt_text("provider"),
            key=f.opt_text("key"),
            model=f.opt_text("model"),
            stream=stream,
            scope=f.text("scope", "provider"),
            rate=f.opt_number("rate", minimum=0, maximum=1),
            after=f.integer("after", 0, minimum=0),
            times=f.opt_integer("times", minimum=0),
            window=window,
            max_in_flight=f.opt_integer("max_in_flight", minimum=0),
            per_second=f.opt_number("per_second", minimum=0),
            burst=f.opt_number("burst", minimum=1),
            status=f.opt_integer("status"),
            retry_after=f.number("retry_after", 1.0, minimum=0),
            after_tokens=f.opt_integer("after_tokens", minimum=0),
            hang_seconds=f.opt_number("hang_seconds", minimum=0),
            no_fallback=f.flag("no_fallback", False),
            message=f.opt_text("message"),
            reported=f.raw("reported"),
            confirm=f.flag("confirm", False),
        )
    except ConfigurationError as exc:
        raise f.error("kind" if "kind" in str(exc) else None, str(exc)) from None


def load_faults(path: str | Path) -> list[Fault]:
    """Read a fault file: a mapping with a ``faults`` list, or the list itself."""
    path = Path(path)
    data = load_data_file(path)
    items: Any = data
    if isinstance(data, dict):
        top = Fields(path, data, "faults file", line=1)
        top.reject_unknown(("faults",))
        items = top.items("faults", required=True)
        lines: Sequence[int | None] = [top.item_line("faults", i) for i in range(len(items))]
    elif isinstance(data, list):
        lines = list(getattr(data, "item_lines", [None] * len(data)))
    else:
        top = Fields(path, data, "faults file", line=1)  # raises: not a mapping
        items, lines = [], []
    return [
        fault_from_mapping(item, path=path, where=f"faults[{i}]", line=lines[i])
        for i, item in enumerate(items)
    ]
