"""Counting while a run goes: one dataset's or one provider's requests, tokens, money,
failures and timing.

A :class:`Counter` is updated on the per-request path (plain integer and Decimal
additions), read by the live views, and kept in the run's summary
(:class:`~provider_router.jobs.summary.DatasetReport`'s ``run``, and per provider).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from provider_router._constants import PER_MILLION
from provider_router._format import decimal_str

__all__ = ["Counter", "per_million"]


@dataclass(slots=True)
class Counter:
    """Requests, tokens, money, failures and timing of one dataset or provider in one run."""

    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cost: Decimal = Decimal(0)
    failures: int = 0
    retries: int = 0
    failures_by_kind: dict[str, int] = field(default_factory=dict)
    first_start: float | None = None
    last_end: float | None = None
    truncated: int = 0
    """Answers cut at ``max_tokens`` (``finish_reason: length``): in ``requests``."""
    truncated_cost: Decimal = Decimal(0)
    """What they cost (in ``cost``)."""
    floor_cost: Decimal = Decimal(0)
    """What the answers whose floor is known would have cost at the floor's prices."""
    floored_cost: Decimal = Decimal(0)
    """What those same answers cost (``floored_cost / floor_cost``: price vs the floor)."""
    compressed: int = 0
    """Answers whose prompt OpenRouter's context compression cut (their trace said so)."""
    fallbacks: int = 0
    """Attempts that failed inside OpenRouter before an answer came (their trace said so)."""

    def started(self, now: float) -> None:
        """Note a request start at wall-clock ``now``."""
        if self.first_start is None:
            self.first_start = now

    def ended(self, now: float) -> None:
        """Note a request end at wall-clock ``now``."""
        self.last_end = now

    def failed(self, kind: str, retries: int = 0) -> None:
        """Count a request that ended without a result."""
        self.failures += 1
        self.retries += retries
        self.failures_by_kind[kind] = self.failures_by_kind.get(kind, 0) + 1

    @property
    def wall_time(self) -> float:
        """Seconds from its first request's start to its last request's end."""
        if self.first_start is None or self.last_end is None:
            return 0.0
        return max(self.last_end - self.first_start, 0.0)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (money as exact decimal strings)."""
        rate = per_million(self.cost, self.output_tokens)
        vs_floor = self.price_vs_floor
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cost": decimal_str(self.cost),
            "usd_per_million_output": None if rate is None else decimal_str(rate),
            "truncated": self.truncated,
            "truncated_cost": decimal_str(self.truncated_cost),
            "failures": self.failures,
            "failures_by_kind": dict(sorted(self.failures_by_kind.items())),
            "retries": self.retries,
            "openrouter_fallbacks": self.fallbacks,
            "context_compressed": self.compressed,
            "wall_time_s": round(self.wall_time, 3),
            "floor_usd": decimal_str(self.floor_cost),
            "price_vs_floor": None if vs_floor is None else decimal_str(vs_floor),
        }

    @property
    def price_vs_floor(self) -> Decimal | None:
        """What the answers cost ÷ the same tokens at the floor's prices (``None``: no
        answer with a known floor)."""
        if not self.floor_cost:
            return None
        return (self.floored_cost / self.floor_cost).quantize(Decimal("0.0001"))


def per_million(cost: Decimal, tokens: int) -> Decimal | None:
    """USD per million tokens, or None without tokens."""
    if tokens <= 0:
        return None
    return (cost * PER_MILLION / tokens).quantize(Decimal("0.0001"))
