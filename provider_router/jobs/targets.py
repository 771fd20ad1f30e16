"""Pricing the requests in flight, so a dataset's output-token target lands.

A target counts completed output tokens, but a request's length is known only when its
answer returns. The dispatcher sends another request while ``completed + price(in
flight) < target``, and whatever ``price`` under-estimates is overshoot nothing can take
back; so the price is an upper estimate. Before any length is observed, each request in
flight is priced at its cap (``max_tokens``). Then ``N`` requests are priced at
``N·m⁺ + z·s·sqrt(N)`` (never above ``N·cap``), ``m⁺`` being the empirical Bernstein
bound of the mean (Maurer & Pontil 2009), which holds for heavy-tailed lengths. Only an
unbiased sample counts: short answers land first, so the sample is the completed
prefix in dispatch order. :class:`InFlightPricer` is per dataset of one run.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["DEFAULT_MARGIN_Z", "MIN_SAMPLES", "InFlightPricer"]

DEFAULT_MARGIN_Z: Final = 3.0
"""Standard deviations of safety margin on the sum of what is in flight."""
MIN_SAMPLES: Final = 8
"""Unbiased samples needed before the observed distribution replaces the cap."""
_CONFIDENCE_LOG: Final = math.log(3 / 1e-3)
"""``ln(3/δ)`` of the mean's upper bound, δ = 0.1 %."""


class InFlightPricer:
    """Prices the output tokens of one dataset's requests in flight (see the module docstring).

    Args:
        cap: the most output tokens one request can produce (its ``max_tokens``).
        z: the safety margin in standard deviations.
        min_samples: unbiased samples needed before the cap is no longer used.

    Use :meth:`sent` when a request goes out (it returns a ticket), then
    :meth:`landed` with that ticket and the output tokens, or ``None`` when the
    request produced nothing (failed, given back).
    """

    __slots__ = ("_ahead", "_n", "_next", "_sent", "_sum", "_sumsq", "cap", "min_samples", "z")

    def __init__(
        self, cap: int, *, z: float = DEFAULT_MARGIN_Z, min_samples: int = MIN_SAMPLES
    ) -> None:
        if cap < 1:
            raise ValueError(f"cap must be at least 1 token, got {cap}")
        self.cap = cap
        self.z = z
        self.min_samples = max(2, min_samples)
        self._sent = 0  # tickets issued
        self._next = 0  # the oldest ticket not yet landed
        self._ahead: dict[int, int | None] = {}  # landed beyond `_next`, not yet counted
        self._n = 0
        self._sum = 0
        self._sumsq = 0

    @property
    def samples(self) -> int:
        """Lengths in the unbiased sample."""
        return self._n

    def sent(self) -> int:
        """Note a request sent; returns the ticket to give :meth:`landed`."""
        ticket = self._sent
        self._sent += 1
        return ticket

    def landed(self, ticket: int, output_tokens: int | None) -> None:
        """Note a request finished with ``output_tokens`` (``None``: it produced none)."""
        if ticket != self._next:
            self._ahead[ticket] = output_tokens
            return
        self._count(output_tokens)
        self._next += 1
        ahead = self._ahead
        while self._next in ahead:
            self._count(ahead.pop(self._next))
            self._next += 1

    def _count(self, tokens: int | None) -> None:
        if tokens is None:
            return
        self._n += 1
        self._sum += tokens
        self._sumsq += tokens * tokens

    def terms(self) -> tuple[float, float] | None:
        """``(m⁺, z·s)``: ``N`` in flight cost ``min(N·cap, N·m⁺ + z·s·sqrt(N))``.

        ``None`` until the sample is large enough: each is then priced at the cap.
        """
        n = self._n
        if n < self.min_samples:
            return None
        mean = self._sum / n
        variance = max(0.0, (self._sumsq - self._sum * mean) / (n - 1))
        upper = (
            mean
            + math.sqrt(2 * variance * _CONFIDENCE_LOG / n)
            + 3 * self.cap * _CONFIDENCE_LOG / n
        )
        return upper, self.z * math.sqrt(variance)

    def price(self, in_flight: int) -> float:
        """An upper estimate of the output tokens ``in_flight`` requests will produce."""
        if in_flight <= 0:
            return 0.0
        worst = float(in_flight * self.cap)
        terms = self.terms()
        if terms is None:
            return worst
        upper, spread = terms
        return min(worst, in_flight * upper + spread * math.sqrt(in_flight))
