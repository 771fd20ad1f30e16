"""Riding out a store outage: retry with backoff within a window, then fail fast and clearly.

A networked ledger (Redis) can be unreachable for a moment: a restart, a failover, a
dropped connection. :class:`OutageWindow` retries a call that failed that way with
exponential backoff, so ledger calls (and admission) pause and resume with nothing
lost. Only once the store has been gone longer than the window does a call raise
:class:`LedgerUnavailableError`; from then on, until a call succeeds, each call tries
once, so a run that is stopping does not wait a whole window per call. Retrying is
safe only because the store applies each batch at most once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from provider_router._exceptions import LedgerUnavailableError
from provider_router._log import get_logger
from provider_router._types import Clock, Sleep

__all__ = ["DEFAULT_OUTAGE_WINDOW", "OutageWindow"]

log = get_logger(__name__)

DEFAULT_OUTAGE_WINDOW: Final = 60.0
"""Seconds a ledger waits out an unreachable store before the call fails."""
FIRST_DELAY: Final = 0.05
MAX_DELAY: Final = 2.0

T = TypeVar("T")


class OutageWindow:
    """Retries calls that fail with ``transient`` errors for up to ``window`` seconds.

    Args:
        what: names the store in messages (never a URL: it may hold a password).
        window: seconds of unreachability waited out; must be positive.
        transient: the exception types that mean "unreachable for now".
        sleep: awaited between attempts; injected in tests.
        clock: monotonic seconds; injected in tests.
    """

    def __init__(
        self,
        what: str,
        window: float,
        transient: tuple[type[BaseException], ...],
        *,
        sleep: Sleep,
        clock: Clock,
    ) -> None:
        self.what = what
        self.window = float(window)
        self._transient = transient
        self._sleep = sleep
        self._clock = clock
        self.since: float | None = None
        """When the current outage began (``None``: the store answers)."""

    async def call(self, attempt: Callable[[], Awaitable[T]]) -> T:
        delay = FIRST_DELAY
        while True:
            try:
                result = await attempt()
            except self._transient as exc:
                now = self._clock()
                if self.since is None:
                    self.since = now
                    log.warning("ledger.store_unreachable", store=self.what, error=repr(exc))
                gone = now - self.since
                if gone >= self.window:
                    raise LedgerUnavailableError(
                        f"the ledger's {self.what} has been unreachable for {gone:.0f} s, longer "
                        f"than its outage window ({self.window:g} s): {exc}. Nothing is lost: "
                        "open reservations stay in it, settled or recovered once it is back"
                    ) from exc
                await self._sleep(min(delay, self.window - gone))
                delay = min(delay * 2, MAX_DELAY)
                continue
            if self.since is not None:
                log.warning(
                    "ledger.store_back", store=self.what, after=round(self._clock() - self.since, 3)
                )
                self.since = None
            return result
