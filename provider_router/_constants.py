"""Defaults, in one place, as named constants."""

from __future__ import annotations

from decimal import Decimal
from typing import Final

DISTRIBUTION: Final = "provider-router-openrouter"
"""The name to ``pip install``: ``provider-router`` on the package index is another
project's. The import name stays ``provider_router``, the command ``provider-router``."""

DEFAULT_BASE_URL: Final = "https://openrouter.ai/api/v1"
ENV_BASE_URL: Final = "OPENROUTER_BASE_URL"
ENV_API_KEY: Final = "OPENROUTER_API_KEY"
ENV_MANAGEMENT_KEY: Final = "OPENROUTER_MANAGEMENT_KEY"
"""A management key: lets ``run --job-key`` make (and disable) a key for each run."""
DEFAULT_JOB_KEY_HOURS: Final = 168.0
"""Hours a key made for a run (``run --job-key``) is accepted: a week, then it expires."""

DEFAULT_CONNECT_TIMEOUT: Final = 10.0
"""Seconds to open a connection."""
DEFAULT_METADATA_TIMEOUT: Final = 30.0
"""Seconds for a whole metadata request (models, endpoints, key, generation)."""
DEFAULT_REQUEST_TIMEOUT: Final = 600.0
"""Seconds for a whole non-streaming completion (long reasoning outputs take minutes)."""
DEFAULT_STREAM_IDLE_TIMEOUT: Final = 120.0
"""Seconds allowed between two chunks of a stream."""
STREAM_DEADLINE_BASE: Final = 120.0
"""Seconds a stream's total deadline allows before its tokens (queueing, first token)."""
STREAM_DEADLINE_TOKENS_PER_SECOND: Final = 10
"""The slowest delivery a default stream deadline allows: ``max_tokens`` at this rate
comes on top of :data:`STREAM_DEADLINE_BASE` (8,192 tokens: about 15 minutes)."""
DEFAULT_BUDGET_WAIT: Final = DEFAULT_REQUEST_TIMEOUT
"""Seconds a reservation that does not fit waits for requests in flight to settle.

Refusing at once wastes the budget (room that requests in flight would free); a
caller that can never fit, even once everything in flight settled at no cost, is
refused at once regardless. Bounded, because room held by a crashed process's
reservations only comes back through ``Ledger.recover``.
"""

DEFAULT_MAX_CONCURRENCY: Final = 2000
"""The most requests a Router keeps in flight (its limiter's ceiling)."""
DEFAULT_CREDITS_HOLD_TIMEOUT: Final = 300.0
"""Seconds one request may spend waiting out OpenRouter's temporary (in-flight hold) 402s."""

DEFAULT_CATALOG_TTL: Final = 300.0
"""Seconds a fetched endpoint listing stays fresh: OpenRouter's own max-age."""

PER_MILLION: Final = Decimal(1_000_000)
"""Prices are listed per token; people read them per million tokens."""

USER_AGENT: Final = "provider-router/0.1"

REDIS_URL_SCHEMES: Final = ("redis://", "rediss://", "unix://")
"""URL prefixes that name a Redis server (a shared ledger, the Ray answer store)."""

DEFAULT_RETRY_ATTEMPTS: Final = 6
"""Attempts per request, the first included."""
DEFAULT_RETRY_DEADLINE: Final = 900.0
"""Seconds from a request's first attempt after which no retry starts."""
DEFAULT_RETRY_BASE_DELAY: Final = 0.5
"""Ceiling of the first jittered backoff, in seconds."""
DEFAULT_RETRY_MAX_DELAY: Final = 30.0
"""Largest backoff ceiling, in seconds."""
DEFAULT_RETRY_MAX_RETRY_AFTER: Final = 300.0
"""A ``Retry-After`` longer than this gives up rather than waits."""

DEFAULT_COST_SANITY_FACTOR: Final = Decimal(2)
"""An answer's ``usage.cost`` above this many times its reservation is not booked on
its word: OpenRouter's ``/generation`` record is asked first, and the batch halts
(confirmed: booked; otherwise disputed: the worst case is booked). docs/ledger.md."""
COST_TOLERANCE: Final = Decimal("1e-10")
"""USD: two reports of one cost (``usage.cost``, ``/generation``, the listing's price)
that differ by less than this are the same figure, rounded."""
DEFAULT_MAX_VIOLATIONS_IN_A_ROW: Final = 3
"""Policy violations in a row (unallowed providers serving) that halt a batch."""

DEFAULT_MAX_PREMIUM: Final = Decimal("0.02")
"""The most a Router pays above the floor (every token at the cheapest allowed
endpoint's price), averaged over its requests: 2 %. Cost first, for budgeted jobs."""
REFUSAL_LIMIT: Final = 50
"""Refusals (an endpoint's 429) one attempt takes back to admission before its 429 goes
to the retry policy like any other failure."""
