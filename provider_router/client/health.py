"""What this client observes per provider, and demotion of the ones that keep failing.

OpenRouter's uptime figures cover 30 minutes to a day and reach the catalog only when
it is refreshed; a provider that starts failing *now* should lose its place *now*.
:class:`ProviderHealth` counts each provider's outcomes as this client sees them and
demotes a provider for a cool-down when it failed ``failure_threshold`` times in a row
or its exponentially weighted error rate passes ``error_rate_threshold``. A demoted
provider stays allowed (still in ``only``): it moves to the end of ``order``, and gets
a fresh start when the cool-down ends. Providers are keyed by OpenRouter's display
name.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from provider_router._exceptions import ConfigurationError
from provider_router._types import Clock

__all__ = ["ProviderHealth", "ProviderStats"]


@dataclass(slots=True)
class ProviderStats:
    """Running counts for one provider, as this client observed them.

    Attributes:
        requests: outcomes recorded.
        successes: completed requests.
        errors: failures other than rate limits.
        rate_limited: 429s.
        consecutive_failures: failures since the last success.
        error_rate: exponentially weighted share of failures (0..1).
        latency: weighted mean seconds per successful request, when seen.
        throughput: weighted mean completion tokens per second, when seen.
        demoted_until: clock time the current demotion ends, or ``None``.
        demotions: how many times it was demoted.
    """

    requests: int = 0
    successes: int = 0
    errors: int = 0
    rate_limited: int = 0
    consecutive_failures: int = 0
    error_rate: float = 0.0
    latency: float | None = None
    throughput: float | None = None
    demoted_until: float | None = None
    demotions: int = 0


class ProviderHealth:
    """Per-provider observed health with time-boxed demotion.

    Args:
        failure_threshold: consecutive failures that demote a provider.
        error_rate_threshold: weighted error rate (0..1) that demotes it.
        min_samples: requests needed before the error rate counts.
        cooldown: seconds a demotion lasts.
        alpha: weight of the newest sample in the moving averages.
        clock: monotonic seconds (injected in tests).
    """

    __slots__ = (
        "_alpha",
        "_clock",
        "_cooldown",
        "_demoted",
        "_error_rate_threshold",
        "_failure_threshold",
        "_min_samples",
        "_next_expiry",
        "_stats",
        "version",
    )

    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        error_rate_threshold: float = 0.5,
        min_samples: int = 20,
        cooldown: float = 60.0,
        alpha: float = 0.1,
        clock: Clock = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise ConfigurationError(f"failure_threshold must be >= 1, got {failure_threshold}")
        if not 0 < error_rate_threshold <= 1:
            raise ConfigurationError(
                f"error_rate_threshold must be in (0, 1], got {error_rate_threshold}"
            )
        if min_samples < 1:
            raise ConfigurationError(f"min_samples must be >= 1, got {min_samples}")
        if not cooldown >= 0:
            raise ConfigurationError(f"cooldown must be >= 0 seconds, got {cooldown}")
        if not 0 < alpha <= 1:
            raise ConfigurationError(f"alpha must be in (0, 1], got {alpha}")
        self._failure_threshold = failure_threshold
        self._error_rate_threshold = error_rate_threshold
        self._min_samples = min_samples
        self._cooldown = cooldown
        self._alpha = alpha
        self._clock = clock
        self._stats: dict[str, ProviderStats] = {}
        self._demoted: frozenset[str] = frozenset()
        self._next_expiry = math.inf
        self.version = 0
        """Changes whenever the set of demoted providers changes (cheap cache key)."""

    def _get(self, provider: str) -> ProviderStats:
        stats = self._stats.get(provider)
        if stats is None:
            stats = self._stats[provider] = ProviderStats()
        return stats

    def record_success(
        self, provider: str, *, latency: float | None = None, completion_tokens: int = 0
    ) -> None:
        """Count a completed request served by ``provider``."""
        stats = self._get(provider)
        alpha = self._alpha
        stats.requests += 1
        stats.successes += 1
        stats.consecutive_failures = 0
        stats.error_rate -= alpha * stats.error_rate
        if latency is not None and latency > 0:
            stats.latency = (
                latency
                if stats.latency is None
                else stats.latency + alpha * (latency - stats.latency)
            )
            if completion_tokens > 0:
                rate = completion_tokens / latency
                stats.throughput = (
                    rate
                    if stats.throughput is None
                    else stats.throughput + alpha * (rate - stats.throughput)
                )

    def record_refused(self, provider: str) -> None:
        """Count a 429 from ``provider`` while other requests of ours were in flight
        there: it is full, not failing, so it never counts toward a demotion
        (OpenRouter's uptime leaves rate-limited requests out too)."""
        stats = self._get(provider)
        stats.requests += 1
        stats.rate_limited += 1

    def record_failure(self, provider: str, *, rate_limited: bool = False) -> None:
        """Count a failed attempt attributed to ``provider``; may demote it."""
        stats = self._get(provider)
        stats.requests += 1
        if rate_limited:
            stats.rate_limited += 1
        else:
            stats.errors += 1
        stats.consecutive_failures += 1
        stats.error_rate += self._alpha * (1.0 - stats.error_rate)
        if stats.demoted_until is not None:
            return
        if stats.consecutive_failures >= self._failure_threshold or (
            stats.requests >= self._min_samples and stats.error_rate >= self._error_rate_threshold
        ):
            until = self._clock() + self._cooldown
            stats.demoted_until = until
            stats.demotions += 1
            self._next_expiry = min(self._next_expiry, until)
            self._demoted = self._demoted | {provider}
            self.version += 1

    def demoted(self) -> frozenset[str]:
        """Providers demoted right now (expired demotions end here)."""
        if self._clock() >= self._next_expiry:
            self._expire()
        return self._demoted

    def is_demoted(self, provider: str) -> bool:
        """Whether ``provider`` is demoted right now."""
        return provider in self.demoted()

    def stats(self, provider: str) -> ProviderStats | None:
        """The counts for ``provider``, or ``None`` if it was never seen."""
        return self._stats.get(provider)

    def snapshot(self) -> dict[str, ProviderStats]:
        """A copy of every provider's counts, by display name."""
        return {name: replace(s) for name, s in self._stats.items()}

    def _expire(self) -> None:
        now = self._clock()
        still: set[str] = set()
        next_expiry = math.inf
        for name in self._demoted:
            stats = self._stats[name]
            until = stats.demoted_until
            if until is not None and until > now:
                still.add(name)
                next_expiry = min(next_expiry, until)
            else:
                # A fresh start: the failures that demoted it are history now.
                stats.demoted_until = None
                stats.consecutive_failures = 0
                stats.error_rate = 0.0
        self._demoted = frozenset(still)
        self._next_expiry = next_expiry
        self.version += 1
