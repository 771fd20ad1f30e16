"""Retry policy: which failures are worth another attempt, and how long to wait.

A :class:`RetryPolicy` is a frozen value made of composable parts, in the manner of
tenacity's ``stop``/``wait``/``retry``: ``retryable`` (a predicate over the exception,
default :func:`is_retryable`), ``backoff`` (a :class:`Backoff`, exponential with full
jitter, which spreads simultaneous retries instead of synchronising them),
``max_attempts`` and ``deadline``; a server's ``Retry-After`` is a floor on the wait.
The decision is pure (:meth:`RetryPolicy.next_delay`); :meth:`RetryPolicy.run` drives
an attempt function with an injected ``sleep``, ``clock`` and ``rng``, so tests assert
the schedule instead of waiting.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from provider_router._constants import (
    DEFAULT_RETRY_ATTEMPTS,
    DEFAULT_RETRY_BASE_DELAY,
    DEFAULT_RETRY_DEADLINE,
    DEFAULT_RETRY_MAX_DELAY,
    DEFAULT_RETRY_MAX_RETRY_AFTER,
)
from provider_router._exceptions import (
    AllAttemptsFailed,
    APIConnectionError,
    APIStatusError,
    ConfigurationError,
    InvalidResponseError,
    ProviderUnavailableError,
    RateLimitError,
    RouterStopping,
)
from provider_router._types import Clock, Sleep

__all__ = ["Backoff", "RetryPolicy", "is_retryable"]

T = TypeVar("T")

_NEVER_RETRIED = frozenset({400, 401, 402, 403, 404, 413, 422})
"""Statuses that describe the request or the account, not a passing condition.

402 is handled by the client (a temporary hold is waited out there), not here.
"""


class _Random(Protocol):
    def uniform(self, a: float, b: float, /) -> float: ...


def is_retryable(error: BaseException) -> bool:
    """Whether another attempt could succeed where this one failed.

    Retried: connection errors and timeouts, 408, 429, every 5xx (including 502
    provider errors), a 200 whose body or stream carried an error
    (``ResponseCarriedError``), a body that was not what the route returns
    (typically truncated), and any error whose OpenRouter ``availability`` block
    says ``retryable: true``. Never retried: 400, 401, 402, 403, 404, 413, 422 and
    anything that is not an API error (budget, policy, programming errors).
    """
    if isinstance(error, APIConnectionError | InvalidResponseError):
        return True
    if isinstance(error, RateLimitError | ProviderUnavailableError):
        return True
    if isinstance(error, APIStatusError):
        if error.status in _NEVER_RETRIED:
            return False
        if error.status == 408 or error.status >= 500:
            return True
        return _availability_retryable(error.body)
    return False


def _availability_retryable(body: Mapping[str, Any] | None) -> bool:
    error = body.get("error") if body else None
    availability = error.get("availability") if isinstance(error, Mapping) else None
    return isinstance(availability, Mapping) and availability.get("retryable") is True


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter.

    The n-th retry (``n`` from 1) waits ``uniform(0, min(max_delay, base ×
    multiplier^(n-1)))`` seconds.

    Attributes:
        base: the ceiling of the first wait, in seconds.
        multiplier: how much the ceiling grows per retry.
        max_delay: the largest ceiling, in seconds.
        jitter: ``False`` waits the ceiling itself (deterministic; for tests and
            single clients, never for thousands of concurrent ones).
    """

    base: float = DEFAULT_RETRY_BASE_DELAY
    multiplier: float = 2.0
    max_delay: float = DEFAULT_RETRY_MAX_DELAY
    jitter: bool = True

    def __post_init__(self) -> None:
        if not self.base > 0:
            raise ConfigurationError(f"Backoff.base must be > 0 seconds, got {self.base!r}")
        if not self.multiplier >= 1:
            raise ConfigurationError(f"Backoff.multiplier must be >= 1, got {self.multiplier!r}")
        if not self.max_delay >= self.base:
            raise ConfigurationError(
                f"Backoff.max_delay ({self.max_delay!r}) must be >= base ({self.base!r})"
            )

    def ceiling(self, retry: int) -> float:
        """The largest wait before retry number ``retry`` (1-based)."""
        # Bound the exponent so a huge retry count cannot overflow a float.
        exponent = min(retry - 1, 64)
        return min(self.max_delay, self.base * self.multiplier**exponent)

    def delay(self, retry: int, rng: _Random) -> float:
        """The wait before retry number ``retry`` (1-based)."""
        ceiling = self.ceiling(retry)
        return rng.uniform(0.0, ceiling) if self.jitter else ceiling


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Which failures to retry, how long to wait, and when to give up.

    Attributes:
        max_attempts: attempts in total, the first included (1 = never retry).
        deadline: seconds from the first attempt after which no retry starts, or
            ``None`` for no deadline. A wait that would end past it is not taken.
        backoff: the wait schedule.
        retryable: the predicate deciding whether an error is worth another try.
        honour_retry_after: treat an error's ``retry_after`` as a floor on the wait.
        max_retry_after: a ``Retry-After`` longer than this gives up instead of
            waiting (a server asking for an hour is not a passing hiccup).
        rng: the source of the backoff's jitter (a ``random.Random(seed)`` makes the
            schedule reproducible); ``None``: a fresh ``random.Random()`` per run, or
            per Router. Not part of the policy's value: two policies that differ
            only in it are equal.
    """

    max_attempts: int = DEFAULT_RETRY_ATTEMPTS
    deadline: float | None = DEFAULT_RETRY_DEADLINE
    backoff: Backoff = field(default_factory=Backoff)
    retryable: Callable[[BaseException], bool] = is_retryable
    honour_retry_after: bool = True
    max_retry_after: float = DEFAULT_RETRY_MAX_RETRY_AFTER
    rng: _Random | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(
                f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts!r}"
            )
        if self.deadline is not None and not self.deadline > 0:
            raise ConfigurationError(
                f"RetryPolicy.deadline must be > 0 seconds or None, got {self.deadline!r}"
            )
        if not self.max_retry_after >= 0:
            raise ConfigurationError(
                f"RetryPolicy.max_retry_after must be >= 0, got {self.max_retry_after!r}"
            )

    @classmethod
    def never(cls) -> RetryPolicy:
        """A policy that makes exactly one attempt."""
        return cls(max_attempts=1)

    def next_delay(
        self, attempt: int, error: BaseException, elapsed: float, rng: _Random
    ) -> float | None:
        """Seconds to wait before the next attempt, or ``None`` to give up.

        Args:
            attempt: how many attempts were made so far (1 after the first).
            error: what the last attempt raised.
            elapsed: seconds since the first attempt started.
            rng: the source of jitter.
        """
        if attempt >= self.max_attempts or not self.retryable(error):
            return None
        delay = self.backoff.delay(attempt, rng)
        retry_after = getattr(error, "retry_after", None) if self.honour_retry_after else None
        if isinstance(retry_after, int | float) and retry_after > 0:
            if retry_after > self.max_retry_after:
                return None
            delay = max(delay, float(retry_after))
        if self.deadline is not None and elapsed + delay > self.deadline:
            return None
        return delay

    async def run(
        self,
        attempt_fn: Callable[[int], Awaitable[T]],
        *,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
        rng: _Random | None = None,
        on_retry: Callable[[int, BaseException, float], None] | None = None,
    ) -> T:
        """Call ``attempt_fn(attempt)`` (attempt from 1) until it returns or we give up.

        A non-retryable error is raised as it is. When retryable errors exhaust the
        attempts or the deadline, :class:`AllAttemptsFailed` is raised holding every
        attempt's error, oldest first.

        Args:
            attempt_fn: makes one attempt; receives the 1-based attempt number.
            sleep: awaited between attempts.
            clock: monotonic seconds, for the deadline.
            rng: jitter source (default: :attr:`rng`, else a fresh ``random.Random()``).
            on_retry: called with ``(attempt, error, delay)`` before each wait.
        """
        start = clock()
        try:
            return await attempt_fn(1)
        except Exception as exc:
            failed = exc
        return await self.resume(
            failed, attempt_fn, started=start, sleep=sleep, clock=clock, rng=rng, on_retry=on_retry
        )

    async def resume(
        self,
        error: Exception,
        attempt_fn: Callable[[int], Awaitable[T]],
        *,
        started: float,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
        rng: _Random | None = None,
        on_retry: Callable[[int, BaseException, float], None] | None = None,
        stopping: asyncio.Event | None = None,
    ) -> T:
        """Go on as :meth:`run` does after the first attempt raised ``error``.

        For a caller that makes the first attempt itself (the router does: one
        coroutine layer less on the path that does not fail). ``started`` is the
        ``clock`` reading taken just before that attempt; the rest is as :meth:`run`:
        ``error`` itself is raised when it is not retried.

        ``stopping``: once set, no further attempt starts: a back-off under way is
        cut short and :class:`~provider_router.RouterStopping` is raised, holding
        the attempts' errors (the router's stop: the first Ctrl-C, a budget stop).
        """
        if rng is None:
            rng = self.rng if self.rng is not None else random.Random()
        errors: list[Exception] = [error]
        attempt = 1
        delay = self.next_delay(attempt, error, clock() - started, rng)
        if delay is None:
            raise error
        if on_retry is not None:
            on_retry(attempt, error, delay)
        while True:
            if stopping is None:
                await sleep(delay)
            else:
                await sleep_unless_stopping(sleep, delay, stopping)
                if stopping.is_set():
                    raise RouterStopping(
                        f"not retried: the router is stopping ({len(errors)} attempt(s) "
                        f"made; the last failed: {errors[-1]})",
                        errors,
                    ) from errors[-1]
            attempt += 1
            try:
                return await attempt_fn(attempt)
            except Exception as exc:
                errors.append(exc)
                next_delay = self.next_delay(attempt, exc, clock() - started, rng)
                if next_delay is None:
                    if not self.retryable(exc):
                        raise
                    raise AllAttemptsFailed(
                        f"all {len(errors)} attempts failed; last: {exc}", errors
                    ) from None
                delay = next_delay
                if on_retry is not None:
                    on_retry(attempt, exc, delay)


async def sleep_unless_stopping(sleep: Sleep, delay: float, stopping: asyncio.Event) -> None:
    """``sleep(delay)``, cut short when ``stopping`` is set (before or during it)."""
    if stopping.is_set():
        return
    nap = asyncio.ensure_future(sleep(delay))
    woken = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((nap, woken), return_when=asyncio.FIRST_COMPLETED)
    finally:
        nap.cancel()
        woken.cancel()
        await asyncio.gather(nap, woken, return_exceptions=True)
