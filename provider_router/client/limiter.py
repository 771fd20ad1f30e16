"""An adaptive concurrency limiter: slow start, additive increase, multiplicative decrease."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import Literal, TypeAlias

from provider_router._exceptions import ConfigurationError
from provider_router._types import Clock

__all__ = ["SLOW_START_WINDOW", "AdaptiveLimiter", "Outcome"]

SLOW_START_WINDOW = 32
"""Where a slow start begins unless ``initial`` says otherwise."""

_LN2 = math.log(2)

Outcome: TypeAlias = Literal["success", "rate_limited", "neutral"]
"""How a request that held a slot ended, as far as the limiter cares."""


class AdaptiveLimiter:
    """Caps requests in flight at a window that adapts to rate limits (AIMD).

    The window starts at ``initial`` (default: ``max_concurrency``, or
    :data:`SLOW_START_WINDOW` with a slow start) and moves like TCP's congestion
    window:

    * **slow start** (with ``slow_start`` seconds): from the first
      :meth:`acquire`, the window doubles every ``slow_start`` seconds of
      ``clock``, paced by time rather than by answers (an answer can take
      minutes, a 429 comes back in milliseconds), until ``max_concurrency`` or
      the first counted 429, which ends it. A timer admits waiters as the window
      grows.
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
    * with ``accelerate``, below the window of the last decrease (the last
      known limit; none before the first decrease after slow start) the additive
      step doubles with every window's worth of successes since that decrease
      (at most half the window per window of successes): after a deep cut the
      window climbs back in a few round trips rather than one slot per round
      trip; past the last known limit it probes one slot per window again, so a
      deep token bucket that hides the limit for seconds is not overrun.
    * with ``shrink_to_in_flight``, every 429 (counted or not) also caps the
      window at the requests still in flight: the refused request's slot is not
      handed to a waiter, who would only draw the next 429. New requests then go
      out as answers come back, so a rate-limited run cannot turn into a storm
      of instant 429s while the multiplicative decrease is cooling down.

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
        slow_start: seconds for the window to double during slow start;
            ``None`` starts at ``initial`` with no slow start.
        shrink_to_in_flight: cap the window at the requests in flight on every 429.
        accelerate: let the additive step grow between decreases (see above).
        clock: monotonic seconds (injected in tests; with a slow start, call
            :meth:`tick` after moving a fake clock).
    """

    __slots__ = (
        "_accelerate",
        "_ceiling",
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
        "_probe",
        "_ramp",
        "_ramp_base",
        "_ramp_from",
        "_ramping",
        "_shrink",
        "_timer",
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
        slow_start: float | None = None,
        shrink_to_in_flight: bool = False,
        accelerate: bool = False,
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
        if slow_start is not None and not slow_start > 0:
            raise ConfigurationError(f"slow_start must be > 0 seconds or None, got {slow_start}")
        default = max_concurrency if slow_start is None else min(max_concurrency, SLOW_START_WINDOW)
        start = max(min_concurrency, default) if initial is None else initial
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
        self._ramp = slow_start if slow_start is not None else 1.0
        self._ramping = slow_start is not None and start < max_concurrency
        self._ramp_base = float(start)
        self._ramp_from: float | None = None
        self._shrink = shrink_to_in_flight
        self._accelerate = accelerate
        self._probe = 1.0
        self._ceiling = math.inf
        self._timer: asyncio.TimerHandle | None = None

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
    def slow_start(self) -> bool:
        """Whether the window is still in its time-paced slow start."""
        return self._ramping

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

    def try_acquire(self) -> int | None:
        """A slot without waiting: the ticket, or ``None`` when :meth:`acquire` would wait.

        The router's per-request path: no coroutine when a slot is free.
        """
        if self._ramping:
            self._ramp_up()
        if self._in_flight < self._limit and not self._waiters:
            self._in_flight += 1
            return self._epoch
        return None

    async def acquire(self) -> int:
        """Wait for a slot; return the ticket to hand back to :meth:`release`."""
        ticket = self.try_acquire()
        if ticket is not None:
            return ticket
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.append(future)
        if self._ramping and self._timer is None:
            self._timer = loop.call_later(self._ramp / 4, self.tick)
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
            if self._ramping:
                self._ramp_up()
            window = self._window
            if window < self._max:
                step = self._increase / window
                if self._accelerate and window < self._ceiling:
                    step *= self._probe
                    self._probe = min(self._probe * (1.0 + _LN2 / window), max(1.0, window / 2))
                self._set_window(min(self._max, window + step))
        elif outcome == "rate_limited":
            if self._shrink and self._window > self._in_flight:
                self._set_window(float(max(self._min, self._in_flight)))
            now = self._clock()
            if ticket >= self._epoch and now - self._last_decrease >= self._cooldown:
                if self._ramping:
                    self._end_slow_start()  # a time-paced overshoot is no ceiling
                else:
                    self._ceiling = self._window
                self._probe = 1.0
                self._epoch += 1
                self._last_decrease = now
                self._set_window(max(float(self._min), self._window * self._decrease_factor))
        elif outcome != "neutral":
            raise ValueError(f"unknown outcome {outcome!r}")
        self._wake()

    def tick(self) -> None:
        """Grow a slow-starting window to what the clock allows and admit waiters.

        The limiter's own timer calls this while requests wait in slow start.
        """
        self._timer = None
        if not self._ramping:
            return
        self._ramp_up()
        self._wake()
        if self._ramping and self._waiters:
            self._timer = asyncio.get_running_loop().call_later(self._ramp / 4, self.tick)

    def _ramp_up(self) -> None:
        now = self._clock()
        if self._ramp_from is None:
            self._ramp_from = now
            return
        doublings = min(64.0, (now - self._ramp_from) / self._ramp)
        window = self._ramp_base * 2.0**doublings
        if window >= self._max:
            window = float(self._max)
            self._end_slow_start()
        if window > self._window:
            self._set_window(window)

    def _end_slow_start(self) -> None:
        self._ramping = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

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
