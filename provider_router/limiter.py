"""An adaptive concurrency limiter: additive increase, multiplicative decrease."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import Literal, TypeAlias

from provider_router._exceptions import ConfigurationError
from provider_router._types import Clock

__all__ = ["AdaptiveLimiter", "Outcome"]

Outcome: TypeAlias = Literal["success", "rate_limited", "neutral"]
"""How a request that held a slot ended, as far as the limiter cares."""


class AdaptiveLimiter:
    """Caps requests in flight at a window that adapts to rate limits (AIMD).

    The window starts at ``initial`` (default: ``max_concurrency``) and moves
    like TCP's congestion window:

    * **multiplicative decrease**: a request that ends ``"rate_limited"`` (a 429)
      multiplies the window by ``decrease_factor``, never below
      ``min_concurrency``. One overshoot makes many requests fail together, so
      only the first of them counts: a decrease happens only for a request that
      *started after* the previous decrease (its ticket is current), and at most
      once per ``cooldown`` seconds of ``clock``.
    * **additive increase**: each ``"success"`` adds ``increase / window``, i.e.
      about ``increase`` slots per window's worth of successes, never above
      ``max_concurrency``.
    * ``"neutral"`` outcomes (other failures) only free the slot.

    Usage::

        ticket = await limiter.acquire()
        try:
            ...  # send the request
        finally:
            limiter.release(ticket, "success")   # or "rate_limited" / "neutral"

    Waiters are served first-in, first-out. When the window shrinks below the
    number in flight, no one is admitted until enough requests finish. A waiter
    cancelled after its slot was granted hands the slot on. The limiter belongs
    to one event loop and is not thread-safe (like ``asyncio.Semaphore``).

    Args:
        max_concurrency: the largest window (and the default start).
        initial: the starting window.
        min_concurrency: the smallest window.
        decrease_factor: multiplier on a counted 429, in (0, 1).
        increase: slots added per window's worth of successes, > 0.
        cooldown: minimum seconds between two decreases.
        clock: monotonic seconds (injected in tests).
    """

    __slots__ = (
        "_clock",
        "_cooldown",
        "_decrease_factor",
        "_epoch",
        "_in_flight",
        "_increase",
        "_last_decrease",
        "_limit",
        "_max",
        "_min",
        "_waiters",
        "_window",
    )

    def __init__(
        self,
        max_concurrency: int,
        *,
        initial: int | None = None,
        min_concurrency: int = 1,
        decrease_factor: float = 0.9,
        increase: float = 1.0,
        cooldown: float = 0.1,
        clock: Clock = time.monotonic,
    ) -> None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
            raise ConfigurationError(f"max_concurrency must be an int, got {max_concurrency!r}")
        if max_concurrency < 1:
            raise ConfigurationError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if not 1 <= min_concurrency <= max_concurrency:
            raise ConfigurationError(
                f"min_concurrency must be in [1, max_concurrency={max_concurrency}], "
                f"got {min_concurrency}"
            )
        start = max_concurrency if initial is None else initial
        if not min_concurrency <= start <= max_concurrency:
            raise ConfigurationError(
                f"initial must be in [min_concurrency={min_concurrency}, "
                f"max_concurrency={max_concurrency}], got {initial}"
            )
        if not 0 < decrease_factor < 1:
            raise ConfigurationError(f"decrease_factor must be in (0, 1), got {decrease_factor}")
        if not increase > 0:
            raise ConfigurationError(f"increase must be > 0, got {increase}")
        if not cooldown >= 0:
            raise ConfigurationError(f"cooldown must be >= 0 seconds, got {cooldown}")
        self._max = max_concurrency
        self._min = min_concurrency
        self._window = float(start)
        self._limit = start
        self._decrease_factor = decrease_factor
        self._increase = increase
        self._cooldown = cooldown
        self._clock = clock
        self._last_decrease = -math.inf
        self._epoch = 0
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        return (
            f"AdaptiveLimiter(limit={self._limit}, max={self._max}, "
            f"in_flight={self._in_flight}, waiting={len(self._waiters)})"
        )

    @property
    def limit(self) -> int:
        """Requests allowed in flight now (the window, rounded down)."""
        return self._limit

    @property
    def window(self) -> float:
        """The exact window, fractional slots included."""
        return self._window

    @property
    def max_concurrency(self) -> int:
        """The largest window."""
        return self._max

    @property
    def in_flight(self) -> int:
        """Slots currently held."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Callers queued in :meth:`acquire`."""
        return len(self._waiters)

    def has_capacity(self) -> bool:
        """Whether :meth:`acquire` would return without waiting."""
        return self._in_flight < self._limit and not self._waiters

    async def acquire(self) -> int:
        """Wait for a slot; return the ticket to hand back to :meth:`release`."""
        if self._in_flight < self._limit and not self._waiters:
            self._in_flight += 1
            return self._epoch
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # The slot was granted just before the cancel: pass it on.
                self._in_flight -= 1
                self._wake()
            else:
                self._waiters.remove(future)
            raise
        return self._epoch

    def release(self, ticket: int, outcome: Outcome = "success") -> None:
        """Free a slot and adapt the window to how its request ended.

        Args:
            ticket: what :meth:`acquire` returned.
            outcome: ``"success"``, ``"rate_limited"`` (a 429) or ``"neutral"``.
        """
        if self._in_flight <= 0:
            raise RuntimeError("AdaptiveLimiter.release() called more times than acquire()")
        self._in_flight -= 1
        if outcome == "success":
            if self._window < self._max:
                self._set_window(min(self._max, self._window + self._increase / self._window))
        elif outcome == "rate_limited":
            now = self._clock()
            if ticket >= self._epoch and now - self._last_decrease >= self._cooldown:
                self._epoch += 1
                self._last_decrease = now
                self._set_window(max(float(self._min), self._window * self._decrease_factor))
        elif outcome != "neutral":
            raise ValueError(f"unknown outcome {outcome!r}")
        self._wake()

    def _set_window(self, window: float) -> None:
        self._window = window
        self._limit = max(self._min, int(window))

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self._in_flight < self._limit:
            future = waiters.popleft()
            if not future.done():
                self._in_flight += 1
                future.set_result(None)
