"""The simulator's state: :class:`Simulator`, and the JSON answers every route shares.

:class:`Simulator` owns everything that changes while the simulator runs: the
account, the faults, the request log, the generations, and the per-provider
in-flight counts. The routes (``app.py``, ``chat.py``, ``delivery.py``) read and
change it through :data:`SIM_KEY`; this module imports none of them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from aiohttp import web

from provider_router._money import from_units
from provider_router._types import Clock, Sleep
from provider_router.testing.batch_api.state import BatchBook
from provider_router.testing.billing import Account, KeyState
from provider_router.testing.chat import bodies
from provider_router.testing.chat.cache import ResponseCache
from provider_router.testing.chat.synth import Lengths
from provider_router.testing.draws import Draws
from provider_router.testing.faults import Fault, FaultBook
from provider_router.testing.introspection import RequestLog, RequestRecord
from provider_router.testing.market.cancellation import (
    CANCELLATION_MODES,
    CancellationMode,
    provider_cancels,
)
from provider_router.testing.market.context import smallest_context
from provider_router.testing.market.degradation import Onsets
from provider_router.testing.market.listing import EndpointSpec, Market, ModelSpec
from provider_router.testing.market.prefix_cache import PrefixCache
from provider_router.testing.market.sticky import StickyRoutes, caches_cheaper

__all__ = ["SIM_KEY", "Simulator", "json_error", "json_response"]

JSON = "application/json"
FREE_MODEL_DAILY_REQUESTS = (50, 1000)
"""OpenRouter's ``:free`` quota per UTC day: below $10 of credits purchased, and from $10."""
FREE_MODEL_CREDIT_THRESHOLD = Decimal(10)
_NONE: frozenset[str] = frozenset()
_HEADER_CACHE = 1024
"""Authorization headers remembered with their key (a key is never removed, only added)."""
RECENT_FAILURE_WINDOW = 30.0
"""Simulated seconds a failed provider counts as unstable for default routing."""


class Simulator:
    """The simulated OpenRouter: market, account, faults, clock and what it saw.

    Args:
        market: the market (default: the bundled Kimi K2.5 one).
        faults: fault rules (see :mod:`provider_router.testing.faults`).
        seed: makes every random draw (routing, lengths, faults, ids) reproducible.
        credits: the account's total credits in USD.
        api_keys: accepted keys (optionally mapped to a per-key USD limit);
            None accepts any non-empty key.
        speed: time compression; 1000 makes a 2-minute generation take 120 ms;
            ``math.inf`` never waits.
        completion_tokens: fixed completion length, or None for the seeded
            log-normal around ``median_completion_tokens``.
        stream_chunk_tokens: tokens per SSE chunk.
        generation_404s: how many lookups of a fresh generation id answer 404
            before the record appears (the real one lags a little).
        log_limit: how many of the latest requests are remembered (the request
            log, the ``/generation`` records, the per-request random streams), so
            memory stays flat however long the simulator runs.
        cancellation: what happens when a client goes away (a timeout, a kill)
            after its request was admitted. ``"docs"`` (the default): as
            OpenRouter documents it per provider (``market/cancellation.py``): a
            stream on a provider that cancels is billed the tokens sent so far;
            on any other provider, and for every non-streaming request, the
            generation finishes and is billed in full when it would have ended,
            with its ``/generation`` record. ``"none"``: no provider cancels.
            ``"all"``: every provider stops at once (a stream pays the tokens
            sent, a JSON request nothing).
        bill_abandoned: the former switch: True is ``cancellation="none"``,
            False ``cancellation="all"``.
        account_zdr: the account enforces zero data retention, which turns
            response caching off (``X-OpenRouter-Cache`` is ignored).
        anonymous: answer without the ``provider`` field (clients must treat the
            serving provider as unknown, not as a policy violation).
        overcharge: bill and report this many times the listed prices (a server
            whose costs are absurd; the charge record stays exact).
        management_keys: keys that may call the management API (``/keys``: make,
            read, disable and delete keys) and ``/key``, never a completion.
        key_limit_status: how a key past its limit is refused: 402 with
            ``limit_source: "openrouter_key_limit"`` as the docs say, or 403 with the
            field's bare ``Key limit exceeded (total limit)`` (docs/simulator.md).
        clock / sleep: injected monotonic clock and sleep.
        wall_clock: injected wall-clock seconds (when a made key expires).
    """

    def __init__(
        self,
        market: Market | None = None,
        faults: Iterable[Fault] = (),
        *,
        seed: int = 0,
        credits: Decimal | int | str = 100,
        api_keys: Iterable[str] | Mapping[str, Decimal | int | str | None] | None = None,
        speed: float = 1.0,
        completion_tokens: int | None = None,
        median_completion_tokens: float = 400.0,
        stream_chunk_tokens: int = 16,
        generation_404s: int = 1,
        keepalive_seconds: float = 5.0,
        log_limit: int = 100_000,
        cancellation: CancellationMode = "docs",
        bill_abandoned: bool | None = None,
        account_zdr: bool = False,
        anonymous: bool = False,
        overcharge: int = 1,
        management_keys: Iterable[str] = (),
        key_limit_status: int = 402,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        wall_clock: Clock = time.time,
    ) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be positive, got {speed}")
        if completion_tokens is not None and completion_tokens < 1:
            raise ValueError(f"completion_tokens must be at least 1, got {completion_tokens}")
        if stream_chunk_tokens < 1:
            raise ValueError("stream_chunk_tokens must be at least 1")
        self.market = market or Market.default()
        self.faults = FaultBook(faults)
        self.seed = seed
        if key_limit_status not in (402, 403):
            raise ValueError(f"key_limit_status must be 402 or 403, got {key_limit_status!r}")
        self.account = Account(credits, api_keys, management_keys)
        self.account.key_limit_status = key_limit_status
        self.account.wall_clock = wall_clock
        self.wall_clock = wall_clock
        self.speed = speed
        self.instant = math.isinf(speed)
        self.lengths = Lengths(median=median_completion_tokens, fixed=completion_tokens)
        self.stream_chunk_tokens = stream_chunk_tokens
        self.generation_404s = generation_404s
        self.keepalive_seconds = keepalive_seconds
        self.log_limit = log_limit
        self.anonymous = anonymous
        """Answer without the ``provider`` field (a response that names no provider)."""
        if isinstance(overcharge, bool) or not isinstance(overcharge, int) or overcharge < 1:
            raise ValueError(f"overcharge must be an int >= 1, got {overcharge!r}")
        self.overcharge = overcharge
        """Bill (and report) this many times the listed prices: a misbehaving server."""
        self.log = RequestLog(log_limit)
        self.clock = clock
        self.sleep = sleep
        self._t0 = clock()
        self.generations = bodies.Generations(self.market.models)
        self.generation_misses: dict[str, int] = {}
        self.in_flight: dict[str, int] = {}
        self.key_in_flight: dict[str, int] = {}
        self.failed_at: dict[str, float] = {}
        self.down: dict[str, bool] = {}
        self.caches = PrefixCache()
        self.sticky = StickyRoutes()
        self.onsets = Onsets()
        """Prompt-cache sticky routing: which endpoint each session is kept on."""
        self._sticky_models: dict[str, bool] = {}
        self._context_floors: dict[str, int] = {}
        self._by_header: dict[str, KeyState] = {}
        self._occurrences: dict[int, int] = {}
        self._occurrence_order: deque[int] = deque()
        """The fingerprints of ``_occurrences``, oldest first (see :meth:`rng_for`)."""
        self.stopping = asyncio.Event()
        if bill_abandoned is not None:
            cancellation = "none" if bill_abandoned else "all"
        if cancellation not in CANCELLATION_MODES:
            raise ValueError(
                f"cancellation must be one of {', '.join(CANCELLATION_MODES)}, got {cancellation!r}"
            )
        self.cancellation: CancellationMode = cancellation
        self._cancels: dict[str, bool] = {}
        self.response_cache = ResponseCache(log_limit, enabled=not account_zdr)
        """Response caching (``X-OpenRouter-Cache``), off under account-level ZDR."""
        self._abandoned: set[asyncio.Task[None]] = set()
        self.batches = BatchBook(self)
        """The Batch API's batches and their faults (``testing/batch_api/state.py``)."""

    # --- time and randomness ------------------------------------------------

    def now(self) -> float:
        """Simulated seconds since start (real seconds when speed is infinite)."""
        elapsed = self.clock() - self._t0
        return elapsed if self.instant else elapsed * self.speed

    async def wait(self, simulated_seconds: float) -> None:
        """Sleep for a simulated duration (not at all when speed is infinite)."""
        if not self.instant and simulated_seconds > 0:
            await self.sleep(simulated_seconds / self.speed)

    def real_seconds(self, simulated_seconds: float) -> float:
        return 0.0 if self.instant else simulated_seconds / self.speed

    def rng_for(self, fingerprint: int) -> Draws:
        """A random stream for one request: same seed + same request => same draws,
        whatever order concurrent requests arrive in; a repeat gets the next stream."""
        occurrences = self._occurrences
        occurrence = occurrences.get(fingerprint, 0) + 1
        if occurrence == 1:
            order = self._occurrence_order
            if len(occurrences) >= self.log_limit:
                # Bounded like the request log (one entry per distinct request would grow
                # forever): the oldest fingerprint goes first; a repeat of a request that
                # old starts its streams again. Taken from a queue: next(iter(dict)) walks
                # the slots earlier deletions emptied, O(log_limit) per request.
                del occurrences[order.popleft()]
            order.append(fingerprint)
        occurrences[fingerprint] = occurrence
        return Draws(b"%d:%d:%d" % (self.seed, fingerprint, occurrence))

    def sticky_model(self, model: ModelSpec) -> bool:
        """Whether sticky routing can apply to ``model``: an endpoint caches more cheaply."""
        known = self._sticky_models.get(model.id)
        if known is None:
            known = self._sticky_models[model.id] = any(map(caches_cheaper, model.endpoints))
        return known

    def context_floor(self, model: ModelSpec) -> int:
        """The request size (prompt + completion) every endpoint of ``model`` takes."""
        floor = self._context_floors.get(model.id)
        if floor is None:
            floor = self._context_floors[model.id] = smallest_context(model)
        return floor

    def unstable_tags(self) -> frozenset[str] | set[str]:
        if not self.failed_at:
            return _NONE
        now = self.now()
        for tag, when in list(self.failed_at.items()):
            if now - when >= RECENT_FAILURE_WINDOW:
                del self.failed_at[tag]
        return set(self.failed_at)

    # --- generations whose client went away ---------------------------------

    def cancels(self, endpoint: EndpointSpec) -> bool:
        """Whether ``endpoint``'s provider stops a stream (and its bill) when the client leaves."""
        mode = self.cancellation
        if mode != "docs":
            return mode == "all"
        known = self._cancels.get(endpoint.tag)
        if known is None:
            known = self._cancels[endpoint.tag] = provider_cancels(
                endpoint.provider_name, endpoint.slug, endpoint.tag
            )
        return known

    @property
    def bills_abandoned_json(self) -> bool:
        """Whether a non-streaming request whose client left is still billed in full."""
        return self.cancellation != "all"

    def finish_abandoned(self, finish: Awaitable[None]) -> None:
        """Run ``finish`` (a generation billed after its client left) in the background."""
        task = asyncio.ensure_future(finish)
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)

    @property
    def abandoned_pending(self) -> int:
        """Generations still running after their client left (billed when they end)."""
        return len(self._abandoned)

    async def settle_abandoned(self, *, now: bool = False) -> None:
        """Wait until every generation whose client left is billed (``now``: bill them at once)."""
        tasks = list(self._abandoned)
        if now:
            for task in tasks:
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- runtime controls for tests and the demo ----------------------------

    def top_up(self, amount: Decimal | int | str) -> None:
        """Add credits to the account (negative removes)."""
        self.account.top_up(amount)

    def set_balance(self, amount: Decimal | int | str) -> None:
        """Make the account balance exactly ``amount`` USD."""
        self.account.set_credits(amount)

    @property
    def balance(self) -> Decimal:
        """The account balance in USD (credits − usage), exact."""
        return from_units(self.account.balance)

    @property
    def usage(self) -> Decimal:
        return from_units(self.account.usage)

    def set_down(self, provider: str, down: bool = True) -> None:
        """Take a provider (tag or slug) down or bring it back."""
        self.down[provider.lower()] = down

    def is_down(self, tag: str, slug: str, market_down: bool) -> bool:
        if self.down:
            for name in (tag, slug):
                if name in self.down:
                    return self.down[name]
        return market_down

    def forget_key(self, key: KeyState) -> None:
        """Delete ``key`` for good: refused from its next request on."""
        self.account.delete_key(key)
        for header, known in list(self._by_header.items()):
            if known is key:
                del self._by_header[header]

    def add_fault(self, fault: Fault) -> Fault:
        return self.faults.add(fault)

    # --- auth -----------------------------------------------------------------

    def authenticate(
        self, request: web.Request, *, completions: bool = False
    ) -> KeyState | web.Response:
        """The calling key, or the 401 (403: a management key asking for a completion)."""
        header = request.headers.get("Authorization", "")
        known = self._by_header.get(header)
        if known is None:
            scheme, _, token = header.partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                return json_error(401, "No auth credentials found")
            known = self.account.key(token)
            if known is None:
                return json_error(401, "User not found.")
            if len(self._by_header) >= _HEADER_CACHE:
                self._by_header.clear()
            self._by_header[header] = known
        usable = not known.disabled and known.expires_at is None
        if not usable and known.refusal(self.wall_clock()) is not None:
            # A disabled key answers 401 in the field; an expired one likewise (assumed).
            return json_error(401, "User not found.")
        if completions and known.management:
            return json_error(403, "Management keys cannot be used for completions")
        return known


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(body=bodies.dumps(body), status=status, content_type=JSON, headers=headers)


def json_error(
    status: int,
    message: str,
    metadata: dict[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return json_response(bodies.error_body(status, message, metadata), status, headers)


def _finish(
    sim: Simulator, record: RequestRecord, response: web.StreamResponse
) -> web.StreamResponse:
    record.status = response.status
    sim.log.finish(record)
    return response


SIM_KEY: web.AppKey[Simulator] = web.AppKey("simulator", Simulator)
